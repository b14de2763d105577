//! The fallback template (`fallback.cu`): built-in kernels for the ops with no generated kernel
//! (`scatter`, `scatter_add`, `scatter_reduce`, the gradients of `embedding`, `index_select` and `gather`; and
//! `cumsum`), which the runtime (`coil_runtime::cuda::fallback`) runs on the device instead of
//! on the host, each launched grid-stride ([`super::grid_stride_launch`]).
//!
//! **Scatter** (`coil_scatter_<bytes>`, `coil_scatter_{add,prod,amax,amin}_<dtype>`; signature `(T *out, const
//! long long *index, const T *src, long long n, int ndim, int dim, long long dim_size,
//! CoilScatterDims d, long long *status)`, over the `n` index elements). The result starts as a
//! copy of `x` (the runtime's); each thread then takes elements of `index` (row-major), finds
//! the element of `x` it names (the index's own position, with the scattered dim replaced by
//! the index value) and stores `src` there or combines it atomically: adds (f32, f64, i32, i64
//! natively), integer max and min natively, float max and min and every product by a
//! compare-and-swap loop on the value's word (f16 and bf16 on the 32-bit word holding them,
//! each update rounded once, as PyTorch's CUDA kernels do; max and min propagate NaN). An index out of range is reported in the run's status
//! words, as generated kernels report theirs (code 1, the index, the dim's size).
//!
//! **Cumsum** (`coil_cumsum_<dtype>`; signature `(const T *x, T *y, long long lines, long long
//! len, long long inner)`, over the lines). One thread per line along the scanned dim
//! (consecutive threads take consecutive inner positions, so loads coalesce unless the dim is
//! the last), summing in f64 (i64 for integers, wrapping) and rounding each output to the
//! dtype: the reference interpreter's values, bit for bit. A long line is one thread's
//! sequential work, still no host round trip.
//!
//! Other dtypes stay on the host path.

use coil_ir::{DType, ReduceOp, TensorMeta};

/// The CUDA C of every kernel of the template, after the 16-bit conversions it uses.
pub const SOURCE: &str = concat!(include_str!("half.cuh"), "\n", include_str!("fallback.cu"));

/// Most dims a scatter handles.
pub const MAX_SCATTER_DIMS: usize = 8;

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
    /// (at most [`MAX_SCATTER_DIMS`] dims: [`supports_scatter`]).
    ///
    /// ```
    /// use coil_codegen::templates::fallback::ScatterDims;
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

/// The scatter kernel for `dtype` (combining by `reduce`, if any), if the template has one.
///
/// ```
/// use coil_codegen::templates::fallback::scatter_kernel;
/// use coil_ir::{DType, ReduceOp};
/// assert_eq!(scatter_kernel(DType::BF16, None).as_deref(), Some("coil_scatter_2"));
/// assert_eq!(scatter_kernel(DType::BF16, Some(ReduceOp::Sum)).as_deref(), Some("coil_scatter_add_bf16"));
/// assert_eq!(scatter_kernel(DType::F32, Some(ReduceOp::Max)).as_deref(), Some("coil_scatter_amax_f32"));
/// assert_eq!(scatter_kernel(DType::U8, Some(ReduceOp::Sum)), None);
/// ```
pub fn scatter_kernel(dtype: DType, reduce: Option<ReduceOp>) -> Option<String> {
    let Some(reduce) = reduce else {
        return Some(format!("coil_scatter_{}", dtype.size_bytes()));
    };
    let kind = match reduce {
        ReduceOp::Sum => "add",
        ReduceOp::Prod => "prod",
        ReduceOp::Max => "amax",
        ReduceOp::Min => "amin",
        ReduceOp::ArgMax | ReduceOp::ArgMin => return None,
    };
    let suffix = match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => return None,
    };
    Some(format!("coil_scatter_{kind}_{suffix}"))
}

/// Whether the template runs `scatter(x, dim, index, src)` of these operands (an i64 index, a
/// dtype it has a kernel for, at most [`MAX_SCATTER_DIMS`] dims).
pub fn supports_scatter(x: &TensorMeta, index: &TensorMeta, reduce: Option<ReduceOp>) -> bool {
    index.dtype == DType::I64 && x.rank() <= MAX_SCATTER_DIMS && scatter_kernel(x.dtype, reduce).is_some()
}

/// The cumsum kernel for `dtype`, if the template has one (integers arrive as i64: the
/// decomposition casts them).
pub fn cumsum_kernel(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "coil_cumsum_f32",
        DType::F64 => "coil_cumsum_f64",
        DType::I64 => "coil_cumsum_i64",
        DType::F16 => "coil_cumsum_f16",
        DType::BF16 => "coil_cumsum_bf16",
        _ => return None,
    })
}

/// Whether the template runs `cumsum(x, dim)` with this output (of x's dtype and shape).
pub fn supports_cumsum(x: &TensorMeta, out: &TensorMeta) -> bool {
    x.dtype == out.dtype && x.shape == out.shape && cumsum_kernel(x.dtype).is_some()
}

/// `(lines, len, inner)` of `cumsum(x, dim)` over a contiguous `x` of `numel > 0` elements: the
/// kernel's arguments (a 0-d tensor is one line of one element).
///
/// ```
/// use coil_codegen::templates::fallback::cumsum_lines;
/// use coil_ir::{DType, TensorMeta};
/// assert_eq!(cumsum_lines(&TensorMeta::new(vec![2, 5, 3], DType::F32), 1), (6, 5, 3));
/// ```
pub fn cumsum_lines(x: &TensorMeta, dim: usize) -> (usize, usize, usize) {
    let len = x.shape.get(dim).copied().unwrap_or(1);
    let inner: usize = x.shape.get(dim + 1..).map_or(1, |s| s.iter().product());
    (x.numel() / len, len, inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_in_the_source_and_the_dims_match_the_c_struct() {
        let dtypes = [DType::F16, DType::BF16, DType::F32, DType::F64, DType::I32, DType::I64, DType::U8];
        for dtype in dtypes {
            let reduces = [None, Some(ReduceOp::Sum), Some(ReduceOp::Prod), Some(ReduceOp::Max), Some(ReduceOp::Min)];
            for reduce in reduces {
                if let Some(name) = scatter_kernel(dtype, reduce) {
                    assert!(SOURCE.contains(&format!("COIL_SCATTER({name},")), "{name}");
                }
            }
            if let Some(name) = cumsum_kernel(dtype) {
                assert!(SOURCE.contains(&format!("COIL_CUMSUM({name},")), "{name}");
            }
        }
        let n = MAX_SCATTER_DIMS;
        let c = format!(
            "struct CoilScatterDims {{ long long size[{n}]; long long xstride[{n}]; long long sstride[{n}]; }};"
        );
        assert!(SOURCE.contains(&c));
        assert_eq!(std::mem::size_of::<ScatterDims>(), 3 * 8 * n);
    }
}
