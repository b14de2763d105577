//! The fallback template (`fallback.cu`): built-in kernels for the ops with no generated kernel
//! (`scatter`, `scatter_add`, `scatter_reduce`, the gradients of `embedding`, `index_select` and `gather`; and
//! `cumsum`), which the runtime (`coil_runtime::cuda::fallback`) runs on the device instead of
//! on the host, each launched grid-stride ([`super::grid_stride_launch`]).
//!
//! **Scatter** (`coil_scatter_<bytes>`, `coil_scatter_{add,prod,amax,amin}_<i32|i64>`; signature `(T *out, const
//! long long *index, const T *src, long long n, int ndim, int dim, long long dim_size,
//! CoilScatterDims d, long long *status)`, over the `n` index elements): plain scatters and
//! integer reductions, whose bits do not depend on the order of the updates. The result
//! starts as a copy of `x` (the runtime's); each thread then takes elements of `index`
//! (row-major), finds the element of `x` it names (the index's own position, with the
//! scattered dim replaced by the index value) and stores `src` there or combines it
//! atomically: adds, max and min natively, products by a compare-and-swap loop on the value's
//! word. An index out of range is reported in the run's status words, as generated kernels
//! report theirs (code 1, the index, the dim's size). Float reductions are the sorted scatter's
//! ([`super::scatter`]), whose kernels are in this module too: a float combined by atomics
//! would depend on the threads' timing.
//!
//! **Cumsum** (`coil_cumsum_<dtype>`; signature `(const T *x, T *y, long long lines, long long
//! len, long long inner)`, over the lines). One thread per line along the scanned dim
//! (consecutive threads take consecutive inner positions, so loads coalesce unless the dim is
//! the last), summing in f64 (i64 for integers, wrapping) and rounding each output to the
//! dtype: the reference interpreter's values, bit for bit. A long line is one thread's
//! sequential work, still no host round trip.
//!
//! Other dtypes stay on the host path.

pub use super::scatter::{ScatterDims, MAX_SCATTER_DIMS};
use coil_ir::{DType, ReduceOp, TensorMeta};

/// The CUDA C of every kernel of the template and of the sorted scatter ([`super::scatter`]),
/// after the 16-bit conversions they use: one module.
pub const SOURCE: &str =
    concat!(include_str!("half.cuh"), "\n", include_str!("scatter.cu"), "\n", include_str!("fallback.cu"));

/// The atomic scatter kernel for `dtype` (combining by `reduce`, if any), if the template has
/// one: any dtype without `reduce`, i32 and i64 with it (floats reduce by
/// [`super::scatter::combine_kernel`]).
///
/// ```
/// use coil_codegen::templates::fallback::scatter_kernel;
/// use coil_ir::{DType, ReduceOp};
/// assert_eq!(scatter_kernel(DType::BF16, None).as_deref(), Some("coil_scatter_2"));
/// assert_eq!(scatter_kernel(DType::I64, Some(ReduceOp::Sum)).as_deref(), Some("coil_scatter_add_i64"));
/// assert_eq!(scatter_kernel(DType::I32, Some(ReduceOp::Max)).as_deref(), Some("coil_scatter_amax_i32"));
/// assert_eq!(scatter_kernel(DType::BF16, Some(ReduceOp::Sum)), None);
/// assert_eq!(scatter_kernel(DType::U8, Some(ReduceOp::Sum)), None);
/// ```
pub fn scatter_kernel(dtype: DType, reduce: Option<ReduceOp>) -> Option<String> {
    let Some(reduce) = reduce else {
        return Some(format!("coil_scatter_{}", dtype.size_bytes()));
    };
    let kind = reduce_kind(reduce)?;
    let suffix = match dtype {
        DType::I32 => "i32",
        DType::I64 => "i64",
        _ => return None,
    };
    Some(format!("coil_scatter_{kind}_{suffix}"))
}

/// A scatter reduction's name in the kernels' names (`add`, `prod`, `amax`, `amin`); `None`
/// for the arg reductions, which scatters do not take.
pub(super) fn reduce_kind(reduce: ReduceOp) -> Option<&'static str> {
    match reduce {
        ReduceOp::Sum => Some("add"),
        ReduceOp::Prod => Some("prod"),
        ReduceOp::Max => Some("amax"),
        ReduceOp::Min => Some("amin"),
        ReduceOp::ArgMax | ReduceOp::ArgMin => None,
    }
}

/// Whether the template or the sorted scatter runs `scatter(x, dim, index, src)` of these
/// operands (an i64 index, a dtype one has a kernel for, at most [`MAX_SCATTER_DIMS`] dims).
pub fn supports_scatter(x: &TensorMeta, index: &TensorMeta, reduce: Option<ReduceOp>) -> bool {
    index.dtype == DType::I64
        && x.rank() <= MAX_SCATTER_DIMS
        && (scatter_kernel(x.dtype, reduce).is_some() || super::scatter::combine_kernel(x.dtype, reduce).is_some())
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
    fn every_kernel_is_in_the_source() {
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
        // Every float reduction has a sorted kernel, every integer one an atomic kernel.
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64, DType::I32, DType::I64] {
            for reduce in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
                let sorted = super::super::scatter::combine_kernel(dtype, Some(reduce));
                assert_ne!(sorted.is_some(), scatter_kernel(dtype, Some(reduce)).is_some(), "{dtype} {reduce:?}");
                assert!(sorted.is_none_or(|name| SOURCE.contains(&format!("COIL_SORTED_SCATTER({name},"))));
            }
        }
    }
}
