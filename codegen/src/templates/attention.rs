//! The attention forward template (`ExternCall::Attention` on CUDA): FlashAttention-2-style
//! kernels, so the `[*batch, L, S]` scores never exist in memory, and split-KV
//! (flash-decoding) variants for few query rows against many keys (a decode step over its KV
//! cache). An optional mask (bool: true keeps; or added to the scores, of the operands' dtype)
//! is read through its strides, broadcast dims with stride 0; key tiles it keeps nothing of
//! (for any row of a block) are skipped, their keys and values never read, so a decode step at
//! position `p` of a cache of `capacity` reads about `p` keys. A structured mask
//! (`coil_ir::loops::MaskRule`: row `r` keeps keys `j <= offset + (r mod period)`) is applied
//! by its rule, like causal attention (offset 0, no period): per element `key > diag(row)`, and
//! key tiles past the block's largest `diag` (rows that wrap a period reach `period - 1`) are
//! skipped; the offset is read from device memory (a 0-d i64) once per block, so a CUDA graph
//! replay at the next position needs no new launch parameters. A row that sees no key gives 0
//! (and logsumexp `-inf`), as PyTorch's SDPA does.
//!
//! * **f16 / bf16 on sm_80 and newer** ([`AttentionKernel::Mma`], `coil_attention_mma_*`): a
//!   block of 4 warps takes 64 query rows of one batch index (16 rows per warp, their Q
//!   fragments kept in registers) and walks the keys in tiles of 64 (with a diagonal rule only
//!   up to the block's last diagonal tile, masked inside it). K and V tiles are staged in shared memory by
//!   `cp.async` (16-byte copies, rows padded by 16 bytes so `ldmatrix` is conflict-free); V's
//!   copy overlaps `S = Q K^T` and the next K's copy overlaps the softmax and `P V`. Both
//!   products run on tensor cores (`mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`, f32
//!   accumulators); the online softmax works on the accumulator fragments in f32 (row max and
//!   sum across the 4 threads of a quad by shuffles, `exp2` with the scale folded into
//!   `log2(e)`); P is converted to A fragments in registers; at the end `O / l` is rounded once
//!   and stored through the output's strides, and, when a backward needs it, the row
//!   logsumexp `(max + log2(l)) ln 2` in f32. The head dim is a template parameter padded to a
//!   multiple of 16 (16..128; the padding reads as zeros). Operands must be 16-byte aligned
//!   rows with unit column stride ([`mma_reads`]), the output 4-byte aligned pairs
//!   ([`mma_writes`]).
//! * **f32, and any dtype before sm_80** ([`AttentionKernel::Simple`],
//!   `coil_attention_simple_*`): one thread per query row, keys and values staged in shared
//!   memory as f32, the same online softmax, any strides. Not tensor-core speed, but no `[L, S]`
//!   scores either.
//! * **Split-KV, at most [`SPLIT_ROWS`] query rows, not causal** ([`AttentionKernel::SplitMma`],
//!   [`AttentionKernel::SplitSimple`], `coil_attention_split_*`): the grid is (batch indices,
//!   splits of the keys); a block takes all the query rows of its batch index (grouped-query
//!   heads are rows: `rep * T` of them against one key/value head) against its split's keys.
//!   The tensor-core one has its 4 warps take 16 keys of each 64-key tile each (same fragments
//!   as above, rows padded to 16 with zeros) and combines the warps in shared memory at the
//!   end; the simple one stages 32-key tiles as f32. With one split a block writes the output
//!   itself; with more, each writes its partial result (unnormalized rows, row maximum and sum,
//!   f32, in a workspace of [`ForwardLaunch::workspace_bytes`]) and
//!   [`AttentionKernel::Combine`] (`coil_attention_combine_*`, one block per batch index)
//!   rescales them to their common maximum and normalizes. Stores go element by element
//!   through the output's strides (few rows), so any output layout.
//!
//! [`ForwardLaunch::choose`] is the launch rule: which kernel for which shape, and how many
//! splits for the device's SM count. One module per variant (kind, dtype, padded head dim).
//! Entry points:
//!
//! ```text
//! extern "C" __global__ void coil_attention_{mma,simple,split_mma,split_simple}_{bf16,f16,f32}_d{16,..,128}(
//!     const T *q, const T *k, const T *v, T *o, float *lse /* or null */,
//!     const void *mask /* or null */, float *workspace /* or null */,
//!     const long long *diag_offset /* or null */, CoilAttnParams p)
//! extern "C" __global__ void coil_attention_combine_{bf16,f16,f32}(
//!     T *o, float *lse /* or null */, float *workspace, CoilAttnParams p)
//! ```
//!
//! Grids: (batch indices, ceil(L / 64)) for the row-block kernels (query blocks run last-first,
//! so causal blocks with the most keys start first), (batch indices, splits) for the split ones,
//! (batch indices) for the combine; no dynamic shared memory.

use coil_ir::target::{GpuTarget, TensorCores};
use coil_ir::{DType, Error, Result};

/// What the forward and backward kernels share: the templates' 16-bit conversions
/// ([`HALF_SOURCE`](super::HALF_SOURCE)), then helpers, the operand struct, the PTX wrappers,
/// Philox (`philox.cuh`, the generated kernels' own, `coil_ir::philox`) and the dropout of the
/// weights (`attention_dropout.cuh`).
pub const COMMON_SOURCE: &str = concat!(
    include_str!("half.cuh"),
    "\n",
    include_str!("attention_common.cuh"),
    "\n",
    include_str!("philox.cuh"),
    "\n",
    include_str!("attention_dropout.cuh")
);

/// The forward kernels.
pub const FORWARD_SOURCE: &str = include_str!("attention_forward.cu");

/// Query rows (and keys) per block of the tensor-core kernels; query rows per block of the
/// simple ones.
pub const BLOCK_ROWS: usize = 64;

/// The largest head dim the kernels run (a query row block stays in registers).
pub const MAX_HEAD_DIM: usize = 128;

/// The kernel argument `CoilAttnOperand`, laid out as the C struct: element
/// `(b, h, row, col)` of an operand with batch dims `[B, H]` is at
/// `offset + b*outer + h*inner + row*row + col*col`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnOperand {
    /// Element offset of the first element.
    pub offset: i64,
    /// Stride of the outer batch dim (0 with one batch dim).
    pub outer: i64,
    /// Stride of the inner batch dim (the heads).
    pub inner: i64,
    /// Row stride.
    pub row: i64,
    /// Column stride (1 for the tensor-core kernels).
    pub col: i64,
}

impl AttnOperand {
    /// The operand of a view with at most 2 batch dims (`None` with more).
    pub fn new(offset: usize, batch_strides: &[usize], row: usize, col: usize) -> Option<AttnOperand> {
        let (outer, inner) = match *batch_strides {
            [] => (0, 0),
            [inner] => (0, inner),
            [outer, inner] => (outer, inner),
            _ => return None,
        };
        let i = |x: usize| x as i64;
        Some(AttnOperand { offset: i(offset), outer: i(outer), inner: i(inner), row: i(row), col: i(col) })
    }
}

/// The kernel argument `CoilAttnParams`, laid out as the C struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnParams {
    /// The queries, `[B, H, l, d]`.
    pub q: AttnOperand,
    /// The keys, `[B, H, s, d]`.
    pub k: AttnOperand,
    /// The values, `[B, H, s, d]`.
    pub v: AttnOperand,
    /// The output, `[B, H, l, d]`.
    pub o: AttnOperand,
    /// The mask: element `(b, h, row, key)` (its `col` stride is the key's); broadcast dims
    /// have stride 0. All zero without one.
    pub mask: AttnOperand,
    /// Inner batch dim's size: block `x` is batch index `(x / heads, x % heads)`.
    pub heads: i32,
    /// Query rows.
    pub l: i32,
    /// Keys.
    pub s: i32,
    /// Head dim.
    pub d: i32,
    /// `scale * log2(e)`.
    pub scale_log2: f32,
    /// 1 where row `r` sees keys `j <= diag_const + *diag_offset + (period ? r % period : r)`
    /// only: causal attention (constant 0, no offset, no period) or a structured mask
    /// (`coil_ir::loops::MaskRule`; the offset is the kernels' `diag_offset` argument, read
    /// from device memory when they run).
    pub diagonal: i32,
    /// The mask's kind ([`MaskKind::code`]): 0 none, 1 bool, 2 added.
    pub mask_kind: i32,
    /// Split kernels: keys per split (a multiple of 64).
    pub chunk: i32,
    /// Split kernels: splits per batch index.
    pub splits: i32,
    /// The diagonal's row term is `r % period` (0: `r`).
    pub period: i32,
    /// The diagonal's constant, added to the offset (when the call has one).
    pub diag_const: i64,
    /// Dropout on the weights (threshold 0: none).
    pub drop: AttnDropout,
}

/// The kernel argument `CoilAttnDropout` (in [`AttnParams`] and the backward's parameters),
/// laid out as the C struct: dropout on the attention weights as one run draws it (see
/// `attention_dropout.cuh`; the numbers are the run's, never compiled into the kernels).
///
/// ```
/// use coil_codegen::templates::attention::AttnDropout;
/// let d = AttnDropout::new(7, 110, coil_ir::philox::dropout_threshold(0.5), 2.0);
/// assert_eq!((d.threshold, d.scale), (1 << 23, 2.0));
/// assert_eq!(AttnDropout::default().threshold, 0); // no dropout
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnDropout {
    /// The stream's Philox key.
    pub seed: u64,
    /// The counter of weight 0: the stream's offset plus the op's.
    pub start: u64,
    /// Kept iff the top 24 bits of Philox word 0 reach it; 0: no dropout.
    pub threshold: u32,
    /// `1 / (1 - p)`, on kept weights.
    pub scale: f32,
}

impl AttnDropout {
    /// The argument for key `seed`, counter of weight 0 `start`, keep `threshold`
    /// ([`coil_ir::philox::dropout_threshold`]) and factor `scale` on kept weights.
    pub fn new(seed: u64, start: u64, threshold: u32, scale: f64) -> AttnDropout {
        AttnDropout { seed, start, threshold, scale: scale as f32 }
    }
}

/// What an attention mask holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskKind {
    /// One byte per element: nonzero keeps the key, zero drops it (`-inf` score).
    Bool,
    /// Added to the scaled scores, of the operands' dtype (`-inf` drops the key).
    Added,
}

impl MaskKind {
    /// The mask of elements of `dtype` for attention on `operands` (bool, or the operands'
    /// dtype); an error for anything else.
    pub fn of(dtype: DType, operands: DType) -> Result<MaskKind> {
        match dtype {
            DType::Bool => Ok(MaskKind::Bool),
            d if d == operands => Ok(MaskKind::Added),
            d => Err(Error::dtype(format!("attention mask of {d} for {operands} operands (bool or {operands})"))),
        }
    }

    /// `CoilAttnParams::mask_kind` of an optional mask.
    pub fn code(mask: Option<MaskKind>) -> i32 {
        match mask {
            None => 0,
            Some(MaskKind::Bool) => 1,
            Some(MaskKind::Added) => 2,
        }
    }
}

/// Which forward kernel runs a call (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// The tensor-core kernel (f16 / bf16 on sm_80+): `bf16` or f16, head dim padded to `dp`.
    Mma {
        /// bf16 operands (else f16).
        bf16: bool,
        /// The head dim padded to a multiple of 16.
        dp: usize,
    },
    /// The one-row-per-thread kernel: `dtype` f32, f16 or bf16, head dim padded to `dp`.
    Simple {
        /// The operands' dtype.
        dtype: DType,
        /// The head dim padded to a multiple of 16.
        dp: usize,
    },
    /// The split-KV tensor-core kernel (at most [`SPLIT_ROWS`] query rows).
    SplitMma {
        /// bf16 operands (else f16).
        bf16: bool,
        /// The head dim padded to a multiple of 16.
        dp: usize,
    },
    /// The split-KV simple kernel (at most [`SPLIT_ROWS`] query rows; f32, or before sm_80).
    SplitSimple {
        /// The operands' dtype.
        dtype: DType,
        /// The head dim padded to a multiple of 16.
        dp: usize,
    },
    /// The split kernels' second step, which combines the splits' partial results.
    Combine {
        /// The attention's dtype (of its operands and output).
        dtype: DType,
    },
}

/// The tensor-core kind for f16 / bf16 on a `target` of Ampere's tensor cores or later (sm_80+)
/// with whole 16-byte chunks per row (a multiple of 8 elements: the copies never pass a row's
/// end), else the simple kind; `(bf16?, padded head dim)` or `(dtype, padded head dim)`. An
/// error for what no kernel runs.
pub(crate) fn choose_kind(what: &str, dtype: DType, d: usize, target: &GpuTarget) -> Result<(Option<bool>, usize)> {
    if d == 0 || d > MAX_HEAD_DIM {
        return Err(Error::unsupported(format!("{what} with head dim {d} on CUDA (1 to {MAX_HEAD_DIM})")));
    }
    let dp = d.div_ceil(16) * 16;
    match dtype {
        DType::F16 | DType::BF16 if target.tensor_cores() >= TensorCores::Ampere && d.is_multiple_of(8) => {
            Ok((Some(dtype == DType::BF16), dp))
        }
        DType::F16 | DType::BF16 | DType::F32 => Ok((None, dp)),
        _ => Err(Error::unsupported(format!("{what} of {dtype} values on CUDA"))),
    }
}

/// The simple kernels' element kind: 0 f32, 1 f16, 2 bf16.
pub(crate) fn element_kind(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 1,
        DType::BF16 => 2,
        _ => 0,
    }
}

fn half_name(bf16: bool) -> &'static str {
    if bf16 {
        "bf16"
    } else {
        "f16"
    }
}

impl AttentionKernel {
    /// The row-block kernel for `dtype` and head dim `d` on `target`; an error for what no
    /// kernel runs.
    pub fn choose(dtype: DType, d: usize, target: &GpuTarget) -> Result<AttentionKernel> {
        Ok(match choose_kind("attention", dtype, d, target)? {
            (Some(bf16), dp) => AttentionKernel::Mma { bf16, dp },
            (None, dp) => AttentionKernel::Simple { dtype, dp },
        })
    }

    /// The entry point's name, e.g. `coil_attention_mma_bf16_d64`.
    pub fn name(self) -> String {
        match self {
            AttentionKernel::Mma { bf16, dp } => format!("coil_attention_mma_{}_d{dp}", half_name(bf16)),
            AttentionKernel::Simple { dtype, dp } => format!("coil_attention_simple_{dtype}_d{dp}"),
            AttentionKernel::SplitMma { bf16, dp } => format!("coil_attention_split_mma_{}_d{dp}", half_name(bf16)),
            AttentionKernel::SplitSimple { dtype, dp } => format!("coil_attention_split_simple_{dtype}_d{dp}"),
            AttentionKernel::Combine { dtype } => format!("coil_attention_combine_{dtype}"),
        }
    }

    /// The variant's whole translation unit: the shared helpers, the kernels, one line
    /// instantiating the entry point.
    pub fn source(self) -> String {
        let name = self.name();
        let entry = match self {
            AttentionKernel::Mma { bf16, dp } => format!(
                "COIL_ATTENTION_MMA({name}, {dp}, {bf16}, false, false)\nCOIL_ATTENTION_MMA({name}_masked, {dp}, {bf16}, false, true)"
            ),
            AttentionKernel::SplitMma { bf16, dp } => format!("COIL_ATTENTION_MMA({name}, {dp}, {bf16}, true, true)"),
            AttentionKernel::Simple { dtype, dp } => {
                format!("COIL_ATTENTION_SIMPLE({name}, {dp}, {})", element_kind(dtype))
            }
            AttentionKernel::SplitSimple { dtype, dp } => {
                format!("COIL_ATTENTION_SIMPLE_SPLIT({name}, {dp}, {})", element_kind(dtype))
            }
            AttentionKernel::Combine { dtype } => format!("COIL_ATTENTION_COMBINE({name}, {})", element_kind(dtype)),
        };
        format!("{COMMON_SOURCE}\n{FORWARD_SOURCE}\n{entry}\n")
    }

    /// The entry point for a call with (`masked`) or without an explicit mask: the row-block
    /// tensor-core kernel has one of each (`<name>_masked`), so that a maskless call runs code
    /// without the mask's (it ran 81 us against 112 us per GPT-2 layer on the H100); the others
    /// take either.
    pub fn entry(self, masked: bool) -> String {
        match self {
            AttentionKernel::Mma { .. } if masked => format!("{}_masked", self.name()),
            _ => self.name(),
        }
    }

    /// The simple variant of the same dtype and head dim (for outputs the tensor-core kernel
    /// cannot write); the split and combine kernels store element by element already.
    pub fn simple(self, dtype: DType) -> AttentionKernel {
        match self {
            AttentionKernel::Mma { dp, .. } => AttentionKernel::Simple { dtype, dp },
            other => other,
        }
    }

    /// Whether the kernel reads q, k and v by `cp.async` (16-byte aligned rows, unit column
    /// stride: [`mma_reads`]).
    pub fn copies_rows(self) -> bool {
        matches!(self, AttentionKernel::Mma { .. } | AttentionKernel::SplitMma { .. })
    }

    /// Threads per block.
    pub fn block(self) -> u32 {
        match self {
            AttentionKernel::Simple { .. } => 64,
            _ => 128,
        }
    }

    /// The row-block kernels' grid for `batch` batch indices and `l` query rows: one block per
    /// (batch index, block of 64 query rows).
    pub fn grid(batch: usize, l: usize) -> (u32, u32, u32) {
        (batch as u32, l.div_ceil(BLOCK_ROWS) as u32, 1)
    }
}

/// The most query rows (per batch index) the split kernels take: one 16-row tensor-core tile.
/// Decode steps have `rep * T` of them (grouped-query heads times new positions); more rows
/// fill the 64-row blocks of the row-block kernels.
pub const SPLIT_ROWS: usize = 16;

/// Keys per tile of the split kernels; a split covers whole tiles.
pub const SPLIT_TILE: usize = 64;

/// Split-kernel blocks the grid aims at per SM: what one SM keeps resident (4 warps, 18 to 35
/// KB of shared memory and about 100 registers a thread each), so that the SMs stay busy and
/// the memory system sees enough loads in flight.
pub const SPLIT_BLOCKS_PER_SM: usize = 4;

/// The most splits per batch index (the combine reads every split's statistics per element).
pub const MAX_SPLITS: usize = 64;

/// How one forward call runs: the kernel and its grid, and for the split kernels the keys per
/// split, the splits and the combine after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardLaunch {
    /// The kernel that computes the attention (a split kernel's partial results, when split).
    pub kernel: AttentionKernel,
    /// The kernel's grid, `(x, y, z)` blocks.
    pub grid: (u32, u32, u32),
    /// Keys per split (0 for the row-block kernels).
    pub chunk: usize,
    /// Splits per batch index (1 for the row-block kernels).
    pub splits: usize,
    /// The combine kernel, when there are several splits.
    pub combine: Option<AttentionKernel>,
}

/// `(splits, keys per split)` of a split-kernel call over `s` keys for `count` batch indices
/// on `sm_count` SMs: enough blocks for [`SPLIT_BLOCKS_PER_SM`] per SM, whole tiles per split,
/// at most [`MAX_SPLITS`], no empty split.
pub fn split_keys(count: usize, s: usize, sm_count: u32) -> (usize, usize) {
    let tiles = s.div_ceil(SPLIT_TILE).max(1);
    let want = (SPLIT_BLOCKS_PER_SM * sm_count as usize).div_ceil(count.max(1)).clamp(1, MAX_SPLITS).min(tiles);
    let per_split = tiles.div_ceil(want);
    (tiles.div_ceil(per_split), per_split * SPLIT_TILE)
}

impl ForwardLaunch {
    /// The launch rule of a forward call: `count` batch indices of `l` query rows against `s`
    /// keys, head dim `d`, operands of `dtype`, on `target` (its tensor cores and SM count).
    /// Few rows (at most [`SPLIT_ROWS`]), not causal: a split kernel, with [`split_keys`]
    /// splits over the target's SMs; else the row-block kernel. An error for what no kernel
    /// runs.
    ///
    /// ```
    /// use coil_codegen::templates::attention::{AttentionKernel, ForwardLaunch};
    /// use coil_ir::{target::GpuTarget, DType};
    /// // GPT-2's decode step at batch 16: 192 heads, 1 row each, a cache of 768, 132 SMs.
    /// let h100 = GpuTarget::h100();
    /// let launch = ForwardLaunch::choose(DType::BF16, 64, &h100, 192, 1, 768, false).unwrap();
    /// assert_eq!(launch.kernel, AttentionKernel::SplitMma { bf16: true, dp: 64 });
    /// assert_eq!((launch.grid, launch.splits, launch.chunk), ((192, 3, 1), 3, 256));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn choose(
        dtype: DType,
        d: usize,
        target: &GpuTarget,
        count: usize,
        l: usize,
        s: usize,
        causal: bool,
    ) -> Result<ForwardLaunch> {
        let (tensor_cores, dp) = choose_kind("attention", dtype, d, target)?;
        if causal || l > SPLIT_ROWS {
            let kernel = match tensor_cores {
                Some(bf16) => AttentionKernel::Mma { bf16, dp },
                None => AttentionKernel::Simple { dtype, dp },
            };
            return Ok(ForwardLaunch {
                kernel,
                grid: AttentionKernel::grid(count, l),
                chunk: 0,
                splits: 1,
                combine: None,
            });
        }
        let kernel = match tensor_cores {
            Some(bf16) => AttentionKernel::SplitMma { bf16, dp },
            None => AttentionKernel::SplitSimple { dtype, dp },
        };
        let (splits, chunk) = split_keys(count, s, target.sm_count);
        let combine = (splits > 1).then_some(AttentionKernel::Combine { dtype });
        Ok(ForwardLaunch { kernel, grid: (count as u32, splits as u32, 1), chunk, splits, combine })
    }

    /// Bytes of f32 workspace the split kernels' partial results take for `count` batch
    /// indices of `l` rows of head dim `d` (rows, then each row's maximum and sum); 0 with one
    /// split.
    pub fn workspace_bytes(&self, count: usize, l: usize, d: usize) -> usize {
        if self.combine.is_none() {
            return 0;
        }
        count * self.splits * l * (d + 2) * 4
    }
}

/// Whether a tensor-core kernel reads an operand in place: unit column stride (or one column)
/// and every row start 16-byte aligned (element offset and strides multiples of 8 elements of 2
/// bytes from a 16-byte aligned base address). Else it is gathered into a contiguous copy first.
pub fn mma_reads(base: u64, offset: usize, batch_strides: &[usize], row: usize, col: usize, d: usize) -> bool {
    (col == 1 || d == 1) && base.is_multiple_of(16) && [offset, row].iter().chain(batch_strides).all(|x| x % 8 == 0)
}

/// Whether a tensor-core kernel writes an output in place: it stores pairs of elements, so unit
/// column stride (or one column) and 4-byte aligned pairs. Else the simple kernel runs.
pub fn mma_writes(base: u64, offset: usize, batch_strides: &[usize], row: usize, col: usize, d: usize) -> bool {
    (col == 1 || d == 1) && base.is_multiple_of(4) && [offset, row].iter().chain(batch_strides).all(|x| x % 2 == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H100 with another compute capability major.
    fn sm(major: u32) -> GpuTarget {
        GpuTarget { compute_capability: (major, 0), ..GpuTarget::h100() }
    }

    #[test]
    fn kernels_by_dtype_head_dim_and_architecture() {
        assert_eq!(
            AttentionKernel::choose(DType::BF16, 64, &sm(9)).unwrap(),
            AttentionKernel::Mma { bf16: true, dp: 64 }
        );
        assert_eq!(
            AttentionKernel::choose(DType::F16, 40, &sm(8)).unwrap(),
            AttentionKernel::Mma { bf16: false, dp: 48 }
        );
        let simple = |dtype, dp| AttentionKernel::Simple { dtype, dp };
        assert_eq!(AttentionKernel::choose(DType::BF16, 64, &sm(7)).unwrap(), simple(DType::BF16, 64));
        assert_eq!(AttentionKernel::choose(DType::F32, 8, &sm(9)).unwrap(), simple(DType::F32, 16));
        assert!(AttentionKernel::choose(DType::F64, 64, &sm(9)).is_err());
        assert!(AttentionKernel::choose(DType::BF16, 136, &sm(9)).is_err());
        let v = AttentionKernel::Mma { bf16: true, dp: 64 };
        assert_eq!(v.name(), "coil_attention_mma_bf16_d64");
        assert!(v.source().ends_with(
            "COIL_ATTENTION_MMA(coil_attention_mma_bf16_d64, 64, true, false, false)\n\
             COIL_ATTENTION_MMA(coil_attention_mma_bf16_d64_masked, 64, true, false, true)\n"
        ));
        assert_eq!((v.entry(false), v.entry(true)), (v.name(), "coil_attention_mma_bf16_d64_masked".to_string()));
        assert_eq!(simple(DType::F32, 32).name(), "coil_attention_simple_f32_d32");
        assert_eq!(AttentionKernel::grid(6, 130), (6, 3, 1));
    }

    #[test]
    fn params_are_laid_out_as_the_c_struct() {
        // Five operands of five i64, then ten 4-byte fields, then an i64, then the dropout
        // (two u64, two 4-byte fields): 272 bytes.
        assert_eq!(std::mem::size_of::<AttnOperand>(), 40);
        assert_eq!(std::mem::size_of::<AttnParams>(), 272);
        assert_eq!(std::mem::size_of::<AttnDropout>(), 24);
        assert_eq!(std::mem::offset_of!(AttnParams, drop), 248);
        assert_eq!(std::mem::offset_of!(AttnParams, mask), 160);
        assert_eq!(std::mem::offset_of!(AttnParams, heads), 200);
        assert_eq!(std::mem::offset_of!(AttnParams, diagonal), 220);
        assert_eq!(std::mem::offset_of!(AttnParams, splits), 232);
        assert_eq!(std::mem::offset_of!(AttnParams, period), 236);
        assert_eq!(std::mem::offset_of!(AttnParams, diag_const), 240);
    }

    #[test]
    fn few_rows_split_the_keys_by_the_sm_count() {
        let choose = |dtype, sm_major, count, l, s, causal| {
            ForwardLaunch::choose(dtype, 64, &sm(sm_major), count, l, s, causal).unwrap()
        };
        // GPT-2 decode at batch 1: 12 heads, a cache of 768 (12 tiles): a split per tile.
        let gpt2_b1 = choose(DType::BF16, 9, 12, 1, 768, false);
        assert_eq!(gpt2_b1.kernel, AttentionKernel::SplitMma { bf16: true, dp: 64 });
        assert_eq!((gpt2_b1.grid, gpt2_b1.chunk), ((12, 12, 1), 64));
        assert_eq!(gpt2_b1.combine, Some(AttentionKernel::Combine { dtype: DType::BF16 }));
        assert_eq!(gpt2_b1.workspace_bytes(12, 1, 64), 12 * 12 * 66 * 4);
        // Llama 1B decode at batch 16: 128 key/value heads of 4 query rows: 5 splits wanted,
        // 3 tiles each, so 4.
        let llama_b16 = choose(DType::BF16, 9, 128, 4, 768, false);
        assert_eq!((llama_b16.grid, llama_b16.splits, llama_b16.chunk), ((128, 4, 1), 4, 192));
        // Enough batch indices to fill the device: one split, no combine, no workspace.
        let wide = choose(DType::BF16, 9, 1024, 16, 768, false);
        assert_eq!((wide.splits, wide.combine, wide.workspace_bytes(1024, 16, 64)), (1, None, 0));
        // Short key ranges: never an empty split.
        assert_eq!(split_keys(1, 100, 132), (2, 64));
        assert_eq!(split_keys(1, 5000, 132), (40, 128));
        assert_eq!(split_keys(3, 64 * 1000, 132), (63, 16 * 64));
        // f32, or before sm_80: the simple split kernel.
        let f32 = choose(DType::F32, 9, 12, 1, 768, false);
        assert_eq!(f32.kernel, AttentionKernel::SplitSimple { dtype: DType::F32, dp: 64 });
        assert_eq!(choose(DType::BF16, 7, 12, 1, 768, false).kernel.name(), "coil_attention_split_simple_bf16_d64");
        // Fewer SMs, fewer splits: GPT-2 decode at batch 4 (48 heads) over a cache of 4096
        // (64 tiles) aims at 4 blocks per SM, 11 splits on an H100's 132 SMs, 8 on an A100's 108.
        let on = |target: &GpuTarget| ForwardLaunch::choose(DType::BF16, 64, target, 48, 1, 4096, false).unwrap();
        assert_eq!((on(&GpuTarget::h100()).splits, on(&GpuTarget::h100()).chunk), (11, 6 * 64));
        assert_eq!((on(&GpuTarget::a100()).splits, on(&GpuTarget::a100()).chunk), (8, 8 * 64));
        // More rows, or causal: the row-block kernels.
        let prefill = choose(DType::BF16, 9, 8, 17, 768, false);
        assert_eq!(
            (prefill.kernel, prefill.grid, prefill.combine),
            (AttentionKernel::Mma { bf16: true, dp: 64 }, (8, 1, 1), None)
        );
        assert_eq!(
            choose(DType::F32, 9, 8, 4, 768, true).kernel,
            AttentionKernel::Simple { dtype: DType::F32, dp: 64 }
        );
        let split = AttentionKernel::SplitMma { bf16: false, dp: 128 };
        assert_eq!(split.name(), "coil_attention_split_mma_f16_d128");
        assert!(split
            .source()
            .ends_with("COIL_ATTENTION_MMA(coil_attention_split_mma_f16_d128, 128, false, true, true)\n"));
        assert_eq!(split.entry(true), split.name());
        assert!(split.copies_rows() && split.simple(DType::F16) == split);
        assert_eq!(AttentionKernel::Combine { dtype: DType::F32 }.name(), "coil_attention_combine_f32");
    }

    #[test]
    fn masks_are_bool_or_of_the_operands_dtype() {
        assert_eq!(MaskKind::of(DType::Bool, DType::BF16).unwrap(), MaskKind::Bool);
        assert_eq!(MaskKind::of(DType::BF16, DType::BF16).unwrap(), MaskKind::Added);
        assert!(MaskKind::of(DType::F32, DType::BF16).is_err());
        assert_eq!([None, Some(MaskKind::Bool), Some(MaskKind::Added)].map(MaskKind::code), [0, 1, 2]);
    }

    #[test]
    fn head_views_are_read_in_place() {
        // q of GPT-2's QKV output [B, T, 3C] viewed [B, H, T, D]: strides [T*3C, D, 3C, 1].
        let (t, c, d) = (1024, 768, 64);
        assert!(mma_reads(256, c, &[t * 3 * c, d], 3 * c, 1, d));
        assert!(!mma_reads(256, 4, &[t * 3 * c, d], 3 * c, 1, d));
        assert!(!mma_reads(256, c, &[t * 3 * c, d], 1, 3 * c, d));
        assert!(mma_writes(256, 2, &[t * c, d], c, 1, d) && !mma_writes(256, 1, &[t * c, d], c, 1, d));
        let op = AttnOperand::new(c, &[t * 3 * c, d], 3 * c, 1).unwrap();
        assert_eq!(op, AttnOperand { offset: 768, outer: 2359296, inner: 64, row: 2304, col: 1 });
        assert!(AttnOperand::new(0, &[1, 2, 3], 4, 1).is_none());
    }
}
