//! The activation template (`activation.cu`): `gelu_tanh` in place over `n` elements, one
//! kernel per float dtype (f32 in f32, f64 in f64, f16 / bf16 read, computed in f32 and rounded
//! again), in the order of the decomposition's ops, and its gradient at a saved input
//! (`g[i] *= gelu_tanh'(aux[i])`), launched grid-stride ([`super::grid_stride_launch`]). The
//! runtime (`coil_runtime::cuda::blas`) runs them after a matrix product whose activation (or
//! activation gradient) cuBLASLt could not apply itself.
//!
//! Kernel signatures: `(T *x, long long n)` and `(T *g, const T *aux, long long n)`.

use coil_ir::DType;

/// The CUDA C of every kernel of the template, after the 16-bit conversions it uses.
pub const SOURCE: &str = concat!(include_str!("half.cuh"), "\n", include_str!("activation.cu"));

/// The `gelu_tanh` kernel for `dtype`, if there is one.
///
/// ```
/// use coil_codegen::templates::activation::gelu_tanh_kernel;
/// use coil_ir::DType;
/// assert_eq!(gelu_tanh_kernel(DType::BF16), Some("coil_gelu_tanh_bf16"));
/// assert_eq!(gelu_tanh_kernel(DType::I32), None);
/// ```
pub fn gelu_tanh_kernel(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "coil_gelu_tanh_f32",
        DType::F64 => "coil_gelu_tanh_f64",
        DType::F16 => "coil_gelu_tanh_f16",
        DType::BF16 => "coil_gelu_tanh_bf16",
        _ => return None,
    })
}

/// The kernel of `gelu_tanh`'s gradient for `dtype`, if there is one.
///
/// ```
/// use coil_codegen::templates::activation::gelu_tanh_grad_kernel;
/// use coil_ir::DType;
/// assert_eq!(gelu_tanh_grad_kernel(DType::F16), Some("coil_gelu_tanh_grad_f16"));
/// assert_eq!(gelu_tanh_grad_kernel(DType::I64), None);
/// ```
pub fn gelu_tanh_grad_kernel(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "coil_gelu_tanh_grad_f32",
        DType::F64 => "coil_gelu_tanh_grad_f64",
        DType::F16 => "coil_gelu_tanh_grad_f16",
        DType::BF16 => "coil_gelu_tanh_grad_bf16",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_in_the_source() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for name in [gelu_tanh_kernel(dtype).unwrap(), gelu_tanh_grad_kernel(dtype).unwrap()] {
                assert!(SOURCE.contains(&format!("extern \"C\" __global__ void {name}(")), "{dtype}");
            }
        }
    }
}
