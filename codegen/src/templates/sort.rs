//! The argsort template (`sort.cu`): the stable sorting positions of each line along a dim,
//! for `Op::Argsort` (the lowering's `ExternCall::Fallback`), which `sort`, `topk` and the
//! sampling ops are built on.
//!
//! Elements become distinct (key, position) pairs (keys ordered as PyTorch orders values), so
//! any correct sort of the pairs is the stable order. Lines of up to [`TILE`] elements are one
//! block's bitonic sort in shared memory and are written out directly; longer lines (a
//! vocabulary of 50257 or 128k) sort tiles of [`TILE`] that way into scratch memory, then merge
//! runs two by two, one thread per element placing itself by a binary search in the other run,
//! doubling the run until it covers the line (6 passes for 128k). The runtime
//! (`coil_runtime::cuda::sort`) compiles [`SOURCE`] once per device and launches by
//! [`SortPlan`].

use coil_ir::DType;

/// The CUDA C of every kernel of the template.
pub const SOURCE: &str = include_str!("sort.cu");

/// Most elements one block sorts in shared memory (`COIL_SORT_TILE` in the source): 24 KiB of
/// keys and positions.
pub const TILE: usize = 2048;

/// Most threads of a tile block.
pub const TILE_THREADS: usize = 512;

/// The merge kernel's name.
pub const MERGE_KERNEL: &str = "coil_sort_merge";

/// The tile kernel for elements of `dtype` (bool as bytes).
///
/// ```
/// use coil_codegen::templates::sort::tile_kernel;
/// use coil_ir::DType;
/// assert_eq!(tile_kernel(DType::BF16), "coil_sort_tile_bf16");
/// assert_eq!(tile_kernel(DType::Bool), tile_kernel(DType::U8));
/// ```
pub fn tile_kernel(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "coil_sort_tile_f16",
        DType::BF16 => "coil_sort_tile_bf16",
        DType::F32 => "coil_sort_tile_f32",
        DType::F64 => "coil_sort_tile_f64",
        DType::I64 => "coil_sort_tile_i64",
        DType::I32 => "coil_sort_tile_i32",
        DType::I16 => "coil_sort_tile_i16",
        DType::I8 => "coil_sort_tile_i8",
        DType::U8 | DType::Bool => "coil_sort_tile_u8",
    }
}

/// How one argsort of `lines` lines of `len` elements (`inner` apart) runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SortPlan {
    /// Lines sorted (independent sorts).
    pub lines: usize,
    /// Elements per line.
    pub len: usize,
    /// The element stride of a line: consecutive elements of a line are `inner` apart.
    pub inner: usize,
    /// Tiles per line: 1 when the tile kernel finishes the sort.
    pub tiles: usize,
    /// The bitonic network's size: the tile's length rounded up to a power of two.
    pub width: usize,
    /// Threads of a tile block.
    pub threads: usize,
    /// The run length each merge pass starts from, in order; the last pass writes the output.
    pub merges: Vec<usize>,
}

impl SortPlan {
    /// The plan for lines of `len > 0` elements; `None` when positions do not fit the kernels'
    /// 32-bit positions (a line of 2^32 - 1 elements or more).
    ///
    /// ```
    /// use coil_codegen::templates::sort::{SortPlan, TILE};
    /// let short = SortPlan::new(4, 40, 1).unwrap();
    /// assert_eq!((short.tiles, short.width, short.merges.len()), (1, 64, 0));
    /// let vocab = SortPlan::new(1, 50257, 1).unwrap();
    /// assert_eq!((vocab.tiles, vocab.width), (25, TILE));
    /// assert_eq!(vocab.merges, vec![2048, 4096, 8192, 16384, 32768]);
    /// ```
    pub fn new(lines: usize, len: usize, inner: usize) -> Option<SortPlan> {
        if len == 0 || len >= u32::MAX as usize {
            return None;
        }
        let tiles = len.div_ceil(TILE);
        let width = len.min(TILE).next_power_of_two();
        let threads = (width / 2).clamp(32, TILE_THREADS);
        let mut merges = Vec::new();
        let mut run = TILE;
        while tiles > 1 && run < len {
            merges.push(run);
            run *= 2;
        }
        Some(SortPlan { lines, len, inner, tiles, width, threads, merges })
    }

    /// Scratch elements (each a 64-bit key and a 32-bit position) per buffer; two buffers
    /// alternate between merge passes. 0 when the tile kernel finishes the sort.
    ///
    /// ```
    /// use coil_codegen::templates::sort::SortPlan;
    /// assert_eq!(SortPlan::new(8, 100, 1).unwrap().scratch_elements(), 0);
    /// assert_eq!(SortPlan::new(2, 50257, 1).unwrap().scratch_elements(), 2 * 50257);
    /// ```
    pub fn scratch_elements(&self) -> usize {
        if self.tiles == 1 {
            0
        } else {
            self.lines * self.len
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_every_length() {
        for len in [1, 2, 3, 2047, 2048, 2049, 4096, 4097, 50257, 131072] {
            let p = SortPlan::new(3, len, 2).unwrap();
            assert_eq!(p.tiles, len.div_ceil(TILE));
            assert!(p.width >= len.min(TILE) && p.width.is_power_of_two() && p.width <= TILE);
            // The last merge's runs, doubled, cover the line; each pass doubles the run.
            if p.tiles > 1 {
                assert!(*p.merges.last().unwrap() * 2 >= len, "{len}: {:?}", p.merges);
                assert!(p.merges.windows(2).all(|w| w[1] == 2 * w[0]));
            } else {
                assert!(p.merges.is_empty());
            }
        }
        assert!(SortPlan::new(1, 0, 1).is_none());
        assert!(SortPlan::new(1, u32::MAX as usize, 1).is_none());
    }

    #[test]
    fn every_dtype_has_a_tile_kernel_in_the_source() {
        for dtype in [DType::Bool, DType::U8, DType::I8, DType::I16, DType::I32, DType::I64] {
            assert!(SOURCE.contains(&format!("({},", tile_kernel(dtype))), "{dtype}");
        }
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            assert!(SOURCE.contains(&format!("({},", tile_kernel(dtype))), "{dtype}");
        }
        assert!(SOURCE.contains(&format!("#define COIL_SORT_TILE {TILE}\n")));
    }
}
