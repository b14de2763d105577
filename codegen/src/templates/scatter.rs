//! The sorted scatter template (`scatter.cu`): `scatter_add` and `scatter_reduce` (`prod`,
//! `amax`, `amin`) of floats on the GPU, with the same bits on every run: the reference
//! interpreter's (`coil_runtime::interp`), which combines each destination's sources one after
//! another in the index's row-major order, rounding each step to the dtype.
//!
//! Atomic adds cannot give that: where an index repeats (an embedding's gradient: token ids
//! repeat) the order of the float additions follows the threads' timing. Here every
//! destination is computed by one thread from its sources in order, and written once.
//!
//! **Who collides.** `scatter(x, dim, index, src)` sends index element `(o, l, i)` (its
//! coordinates before `dim`, along it, after it) to `x[o, index[o, l, i], i]`, so only
//! elements of one *column* `(o, i)` can meet, and among them the interpreter's order is
//! ascending `l`. The index is seen as `[outer, len, inner]`.
//!
//! **Steps** (the runtime, `coil_runtime::cuda::fallback`, enqueues them; no host round trip):
//! 1. *Group by destination*: the argsort template ([`super::sort`]) sorts each column's keys
//!    (the index values) with their positions, stably, so each destination's sources become a
//!    run of consecutive ranks in ascending position order. A **rows** scatter, whose index
//!    repeats along the dims after `dim` (an embedding's or `index_add`'s gradient, where the
//!    index is an expanded `[N, 1]`; the caller proves it from the index's producer, or
//!    `inner` is 1), needs one sort per `o` for all its columns: `coil_scatter_row_keys`
//!    copies element 0 of each index row, and only `outer * len` keys are sorted (8192 for
//!    GPT-2's `wte`, not 8192 x 768). Otherwise every column is sorted in place in the index,
//!    its keys `inner` apart ([`SortedScatter::stride`]).
//! 2. `coil_scatter_sorted_keys` writes the keys in sorted order and reports an index out of
//!    range in the run's status words, as the generated kernels report theirs (code 1, the
//!    index, the dim's size).
//! 3. The combine: where a rank starts a run of equal keys, x's element there is combined with
//!    the run's sources in order and stored, once. No two threads write one element and none
//!    reads another's, so the output may be `x`'s own memory (the scatter in place over its
//!    dying base).
//!    - `coil_scatter_rows_<op>_<dtype>` (a rows scatter whose rows are whole 16-byte vectors
//!      in the index, `x` and `src`, 16-byte aligned: GPT-2's `wte`): a block per rank, a thread
//!      per 16 bytes of the row. A block whose rank starts a run stages the run's positions in
//!      shared memory, 32 at first, then the block's width at a time, and each thread combines
//!      its columns over them, [`BATCH`] rows' loads in flight at once. The row's sources are
//!      read once, in 16-byte loads, the run's positions once per block.
//!    - `coil_scatter_sorted_<op>_<dtype>` (any other): a thread per (rank, column), which
//!      loads the run's keys, positions and sources [`BATCH`] at a time. 2-D blocks: columns
//!      along x (coalesced loads of a row of `src`), ranks along y.
//!
//! A run's rows are combined one after another, so a destination with many sources (a
//! frequent token in real text) costs a chain of `run / BATCH` load round trips; with ids drawn
//! uniformly (the benchmark's) runs are short and the combine reads each source row and
//! writes each destination row once, at the memory's speed.
//!
//! Sums and products of f16 / bf16 are computed in f32 and rounded to the dtype at each step:
//! the f32 result of two 16-bit values, rounded, is the f64 result rounded through f32, as the
//! interpreter rounds. Integer reductions (wrapping, order-free) and plain `scatter` keep the
//! fallback template's atomic kernels ([`super::fallback`]).

use super::sort::SortPlan;
use coil_ir::{DType, ReduceOp, TensorMeta};

/// The CUDA C of the template's kernels, after the 16-bit conversions it uses (the argsort
/// it relies on is [`super::sort::SOURCE`], a module of its own).
pub const SOURCE: &str = concat!(include_str!("half.cuh"), "\n", include_str!("scatter.cu"));

/// Sources one combining thread loads before it combines them (`COIL_SCATTER_BATCH`).
pub const BATCH: usize = 8;

/// Bytes a rows combine thread loads and stores at once (`CoilVec16`).
pub const VECTOR_BYTES: usize = 16;

/// Most dims a scatter handles.
pub const MAX_SCATTER_DIMS: usize = 8;

/// Threads of a combine block (`COIL_SCATTER_ROWS_BLOCK`).
pub const COMBINE_THREADS: usize = 256;

/// The row-keys kernel's name.
pub const ROW_KEYS_KERNEL: &str = "coil_scatter_row_keys";

/// The sorted-keys kernel's name.
pub const SORTED_KEYS_KERNEL: &str = "coil_scatter_sorted_keys";

/// The scatter kernels' `CoilScatterDims` argument, laid out as the C struct: the index's
/// sizes, and the row-major strides of `x` and of `src` (in elements); unused dims size 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScatterDims {
    /// Sizes of the index.
    pub size: [i64; MAX_SCATTER_DIMS],
    /// Strides of `x` (and the output).
    pub xstride: [i64; MAX_SCATTER_DIMS],
    /// Strides of `src`.
    pub sstride: [i64; MAX_SCATTER_DIMS],
}

impl ScatterDims {
    /// The argument of `scatter(x, dim, index, src)` on contiguous operands of these metas
    /// (at most [`MAX_SCATTER_DIMS`] dims).
    ///
    /// ```
    /// use coil_codegen::templates::scatter::ScatterDims;
    /// use coil_ir::{DType, TensorMeta};
    /// let x = TensorMeta::new(vec![4, 3], DType::F32);
    /// let (index, src) = (TensorMeta::new(vec![2, 3], DType::I64), TensorMeta::new(vec![2, 5], DType::F32));
    /// let d = ScatterDims::new(&x, &index, &src);
    /// assert_eq!((&d.size[..3], &d.xstride[..2], &d.sstride[..2]), (&[2, 3, 1][..], &[3, 1][..], &[5, 1][..]));
    /// ```
    pub fn new(x: &TensorMeta, index: &TensorMeta, src: &TensorMeta) -> ScatterDims {
        let mut d =
            ScatterDims { size: [1; MAX_SCATTER_DIMS], xstride: [0; MAX_SCATTER_DIMS], sstride: [0; MAX_SCATTER_DIMS] };
        let (xs, ss) = (row_major_strides(&x.shape), row_major_strides(&src.shape));
        for k in 0..x.rank().min(MAX_SCATTER_DIMS) {
            d.size[k] = index.shape[k] as i64;
            d.xstride[k] = xs[k];
            d.sstride[k] = ss[k];
        }
        d
    }
}

/// Row-major strides of `shape`, in elements.
fn row_major_strides(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1] as i64;
    }
    s
}

/// The per-element combine kernel of a float scatter reducing by `reduce`, if the template
/// has one (the rows kernel is the same name with `rows` for `sorted`: [`SortedScatter::kernel`]).
///
/// ```
/// use coil_codegen::templates::scatter::combine_kernel;
/// use coil_ir::{DType, ReduceOp};
/// assert_eq!(combine_kernel(DType::BF16, Some(ReduceOp::Sum)).as_deref(), Some("coil_scatter_sorted_add_bf16"));
/// assert_eq!(combine_kernel(DType::F32, Some(ReduceOp::Prod)).as_deref(), Some("coil_scatter_sorted_prod_f32"));
/// assert_eq!(combine_kernel(DType::I64, Some(ReduceOp::Sum)), None); // atomics: any order, same bits
/// assert_eq!(combine_kernel(DType::F32, None), None);
/// ```
pub fn combine_kernel(dtype: DType, reduce: Option<ReduceOp>) -> Option<String> {
    let kind = super::fallback::reduce_kind(reduce?)?;
    let suffix = match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => return None,
    };
    Some(format!("coil_scatter_sorted_{kind}_{suffix}"))
}

/// How one sorted scatter runs: the index seen as `[outer, len, inner]` around the scattered
/// dim, whether one sort per `outer` line serves all its columns, and which combine kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SortedScatter {
    /// The per-element combine kernel ([`combine_kernel`]).
    pub combine: String,
    /// Product of the index's sizes before the dim.
    pub outer: usize,
    /// The index's size along the dim: the sources a destination may have.
    pub len: usize,
    /// Product of the index's sizes after the dim: the columns of a line.
    pub inner: usize,
    /// Whether the index repeats along its dims after the dim (a rows scatter: its column 0
    /// is sorted once per line).
    pub rows: bool,
    /// x's size along the dim: the keys' exclusive bound.
    pub dim_size: usize,
    /// Elements of a rows thread's 16-byte vector where the rows kernel serves (a rows scatter
    /// whose last dims hold whole vectors in the index, `x` and `src`), else 1. The runtime
    /// sets it to 1 where `x` or `src` is not 16-byte aligned.
    pub vector: usize,
}

impl SortedScatter {
    /// The plan of a float `scatter(x, dim, index, src)` reducing by `reduce` with an index of
    /// `numel > 0` elements, `None` for other dtypes and reductions; `index_repeats`: whether
    /// the index is known to repeat along its dims after `dim` (always so where there are
    /// none).
    ///
    /// ```
    /// use coil_codegen::templates::scatter::SortedScatter;
    /// use coil_ir::{DType, ReduceOp, TensorMeta};
    /// let (table, ids) = (TensorMeta::new(vec![50257, 768], DType::F32), TensorMeta::new(vec![8192, 768], DType::I64));
    /// let src = TensorMeta::new(vec![8192, 768], DType::F32);
    /// let wte = SortedScatter::new(&table, &ids, &src, 0, Some(ReduceOp::Sum), true).unwrap();
    /// assert_eq!((wte.outer, wte.len, wte.inner, wte.stride(), wte.vector), (1, 8192, 768, 1, 4));
    /// assert_eq!(wte.kernel(), "coil_scatter_rows_add_f32");
    /// assert_eq!(wte.sort_plan().unwrap().len, 8192); // one line of 8192 keys
    /// let unknown = SortedScatter::new(&table, &ids, &src, 0, Some(ReduceOp::Sum), false).unwrap();
    /// assert_eq!((unknown.stride(), unknown.kernel().as_str()), (768, "coil_scatter_sorted_add_f32")); // 768 lines
    /// ```
    pub fn new(
        x: &TensorMeta,
        index: &TensorMeta,
        src: &TensorMeta,
        dim: usize,
        reduce: Option<ReduceOp>,
        index_repeats: bool,
    ) -> Option<SortedScatter> {
        let combine = combine_kernel(x.dtype, reduce)?;
        let shape = if index.shape.is_empty() { &[1][..] } else { &index.shape[..] };
        let outer = shape[..dim].iter().product();
        let inner: usize = shape[dim + 1..].iter().product();
        let rows = index_repeats || inner == 1;
        let v = VECTOR_BYTES / x.dtype.size_bytes();
        let whole = |m: &TensorMeta| m.shape.last().is_some_and(|&n| n % v == 0);
        let vector = if rows && inner > 1 && whole(x) && whole(index) && whole(src) { v } else { 1 };
        let dim_size = x.shape.get(dim).copied().unwrap_or(1);
        Some(SortedScatter { combine, outer, len: shape[dim], inner, rows, dim_size, vector })
    }

    /// The combine kernel: the rows kernel where [`Self::vector`] allows, else the
    /// per-element one.
    pub fn kernel(&self) -> String {
        if self.vector > 1 {
            self.combine.replacen("_sorted_", "_rows_", 1)
        } else {
            self.combine.clone()
        }
    }

    /// Elements between consecutive keys of a sorted line: 1 for a rows scatter (its keys
    /// copied out of the index), `inner` otherwise (the index's own layout).
    pub fn stride(&self) -> usize {
        if self.rows {
            1
        } else {
            self.inner
        }
    }

    /// Whether the keys are copied out of the index first (`coil_scatter_row_keys`): a rows
    /// scatter with columns.
    pub fn copies_row_keys(&self) -> bool {
        self.rows && self.inner > 1
    }

    /// Keys sorted (and positions, and sorted keys, each an i64 scratch buffer of this many).
    pub fn keys(&self) -> usize {
        self.outer * self.len * self.stride()
    }

    /// The keys as the argsort sees them: `[outer, len, stride]`, sorted along dim 1.
    pub fn keys_meta(&self) -> TensorMeta {
        TensorMeta::new(vec![self.outer, self.len, self.stride()], DType::I64)
    }

    /// The argsort's plan; `None` when a line is too long for its 32-bit positions.
    pub fn sort_plan(&self) -> Option<SortPlan> {
        SortPlan::new(self.outer * self.stride(), self.len, self.stride())
    }

    /// The combine kernel's grid and block, x over columns (vectors of columns for the rows
    /// kernel, every one covered: the kernel keeps a thread's columns), y over ranks
    /// (grid-stride; one rank per block for the rows kernel).
    ///
    /// ```
    /// use coil_codegen::templates::scatter::SortedScatter;
    /// use coil_ir::{DType, ReduceOp, TensorMeta};
    /// let sum = Some(ReduceOp::Sum);
    /// let (table, ids) = (TensorMeta::new(vec![50257, 768], DType::F32), TensorMeta::new(vec![8192, 768], DType::I64));
    /// let wte = SortedScatter::new(&table, &ids, &table, 0, sum, true).unwrap();
    /// assert_eq!(wte.combine_launch(), ([1, 8192], [192, 1])); // 192 threads of 4 columns
    /// let (x, index) = (TensorMeta::new(vec![64, 1000], DType::F32), TensorMeta::new(vec![64, 50], DType::I64));
    /// let last = SortedScatter::new(&x, &index, &x, 1, sum, false).unwrap();
    /// assert_eq!(last.combine_launch(), ([1, 13], [1, 256]));
    /// ```
    pub fn combine_launch(&self) -> ([u32; 2], [u32; 2]) {
        let ranks = self.outer * self.len;
        if self.vector > 1 {
            let vectors = self.inner / self.vector;
            let bx = vectors.next_multiple_of(32).min(COMBINE_THREADS);
            return ([vectors.div_ceil(bx) as u32, ranks.clamp(1, 65535) as u32], [bx as u32, 1]);
        }
        let bx = self.inner.next_power_of_two().min(COMBINE_THREADS);
        let by = COMBINE_THREADS / bx;
        let gx = self.inner.div_ceil(bx).min(1 << 16);
        let gy = ranks.div_ceil(by).clamp(1, 65535);
        ([gx as u32, gy as u32], [bx as u32, by as u32])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_combine_kernel_is_in_the_source_and_the_dims_match_the_c_struct() {
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            for reduce in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                let name = combine_kernel(dtype, Some(reduce)).unwrap();
                assert!(SOURCE.contains(&format!("COIL_SORTED_SCATTER({name},")), "{name}");
                let v = VECTOR_BYTES / dtype.size_bytes();
                let rows = name.replacen("_sorted_", "_rows_", 1);
                assert!(SOURCE.contains(&format!("COIL_ROWS_SCATTER({rows}, ")), "{rows}");
                assert!(
                    SOURCE
                        .lines()
                        .any(|l| l.starts_with(&format!("COIL_ROWS_SCATTER({rows}, "))
                            && l.contains(&format!(", {v}, "))),
                    "{rows}: {v} a vector"
                );
            }
        }
        for name in [ROW_KEYS_KERNEL, SORTED_KEYS_KERNEL] {
            assert!(SOURCE.contains(&format!("void {name}(")), "{name}");
        }
        let n = MAX_SCATTER_DIMS;
        let c = format!(
            "struct CoilScatterDims {{ long long size[{n}]; long long xstride[{n}]; long long sstride[{n}]; }};"
        );
        assert!(SOURCE.contains(&c));
        assert_eq!(std::mem::size_of::<ScatterDims>(), 3 * 8 * n);
        assert!(SOURCE.contains(&format!("#define COIL_SCATTER_BATCH {BATCH}\n")));
        assert!(SOURCE.contains(&format!("#define COIL_SCATTER_ROWS_BLOCK {COMBINE_THREADS}\n")));
    }

    #[test]
    fn plans_cover_rows_columns_vectors_and_zero_dims() {
        let meta = |shape: &[usize], dtype| TensorMeta::new(shape.to_vec(), dtype);
        let sum = Some(ReduceOp::Sum);
        let plan = |x: &[usize], i: &[usize], s: &[usize], dim, dtype, repeats| {
            SortedScatter::new(&meta(x, dtype), &meta(i, DType::I64), &meta(s, dtype), dim, sum, repeats).unwrap()
        };
        // Along a middle dim: columns are (o, i) pairs; a sort per column unless rows.
        let p = plan(&[3, 9, 4, 8], &[3, 7, 4, 4], &[3, 7, 5, 8], 1, DType::F32, false);
        assert_eq!((p.outer, p.len, p.inner, p.stride(), p.keys(), p.dim_size, p.vector), (3, 7, 16, 16, 336, 9, 1));
        assert!(!p.copies_row_keys());
        assert_eq!(p.keys_meta().shape, vec![3, 7, 16]);
        let r = plan(&[3, 9, 4, 8], &[3, 7, 4, 4], &[3, 7, 5, 8], 1, DType::F32, true);
        assert_eq!((r.stride(), r.keys(), r.copies_row_keys(), r.vector), (1, 21, true, 4));
        assert_eq!(r.combine_launch(), ([1, 21], [32, 1]));
        // A last dim not of whole vectors (in x, the index or src), or not f32: narrower or none.
        assert_eq!(plan(&[3, 9, 4, 6], &[3, 7, 4, 4], &[3, 7, 5, 8], 1, DType::F32, true).vector, 1);
        assert_eq!(plan(&[3, 9, 4, 8], &[3, 7, 4, 2], &[3, 7, 5, 8], 1, DType::F32, true).vector, 1);
        assert_eq!(plan(&[9, 8], &[7, 8], &[7, 8], 0, DType::BF16, true).vector, 8);
        assert_eq!(plan(&[9, 8], &[7, 8], &[7, 8], 0, DType::F64, true).vector, 2);
        // The last dim: one column per line, rows whatever the caller knows, no vectors.
        let l = plan(&[4, 16], &[4, 8], &[4, 8], 1, DType::BF16, false);
        assert!(l.rows && !l.copies_row_keys() && l.vector == 1);
        // A 0-d scatter: one line of one key.
        let z = plan(&[], &[], &[], 0, DType::F32, false);
        assert_eq!((z.outer, z.len, z.inner, z.dim_size, z.vector), (1, 1, 1, 1, 1));
        let ([gx, gy], [bx, by]) = z.combine_launch();
        assert!(gx >= 1 && gy >= 1 && bx * by == COMBINE_THREADS as u32);
        // Integers and plain scatters are not sorted.
        assert!(SortedScatter::new(
            &meta(&[4], DType::I64),
            &meta(&[4], DType::I64),
            &meta(&[4], DType::I64),
            0,
            sum,
            false
        )
        .is_none());
    }
}
