//! The activation template's kernels, for products whose epilogue cuBLASLt could not apply:
//! the activation (or its gradient) in place on the product's output.

use super::super::compiler::{compile, LoadedModule};
use super::super::device::CudaDevice;
use super::super::gather::launch_grid_stride;
use super::Blas;
use coil_codegen::templates::activation;
use coil_ir::loops::Activation;
use coil_ir::{DType, Error, Result};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Arc;

/// The activation template's kernels (`coil_codegen::templates::activation`) on one device:
/// one per float dtype, each in place over `n` elements.
pub(super) struct ActivationKernels {
    _module: LoadedModule,
    /// f32, f16, bf16, f64.
    gelu_tanh: [sys::CUfunction; 4],
    /// The gradients, in the same order.
    gelu_tanh_grad: [sys::CUfunction; 4],
}

// SAFETY: function handles are immutable and usable from any thread with the context bound.
unsafe impl Send for ActivationKernels {}
// SAFETY: as above.
unsafe impl Sync for ActivationKernels {}

impl ActivationKernels {
    /// The device's kernels, compiled and loaded at the first use.
    fn get(dev: &Arc<CudaDevice>) -> Result<&ActivationKernels> {
        let blas = Blas::get(dev)?;
        blas.activation
            .get_or_init(|| {
                let build = || -> Result<ActivationKernels> {
                    let (cubin, _) = compile(activation::SOURCE, &dev.arch(), &crate::cpu::default_cache_dir())?;
                    let module = LoadedModule::load(dev, &cubin)?;
                    let f = |name: Option<&str>| module.function(name.expect("a kernel for every float dtype"));
                    let each = |kernel: fn(DType) -> Option<&'static str>| -> Result<[sys::CUfunction; 4]> {
                        Ok([
                            f(kernel(DType::F32))?,
                            f(kernel(DType::F16))?,
                            f(kernel(DType::BF16))?,
                            f(kernel(DType::F64))?,
                        ])
                    };
                    let (gelu_tanh, gelu_tanh_grad) =
                        (each(activation::gelu_tanh_kernel)?, each(activation::gelu_tanh_grad_kernel)?);
                    Ok(ActivationKernels { _module: module, gelu_tanh, gelu_tanh_grad })
                };
                build().map_err(|e| e.message)
            })
            .as_ref()
            .map_err(|e| Error::runtime(e.clone()))
    }
}

/// The index of `dtype` in [`ActivationKernels`]' arrays.
fn kernel_index(dtype: DType) -> Result<usize> {
    Ok(match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::F64 => 3,
        _ => return Err(Error::unsupported(format!("a {dtype} activation"))),
    })
}

/// Enqueues `x[i] = act(x[i])` for the `n` elements of `dtype` at `ptr` (the fallback when
/// cuBLASLt could not apply the activation itself).
///
/// # Safety
/// `ptr` must address `n` elements of `dtype` on `dev`.
pub(crate) unsafe fn apply_activation(
    dev: &Arc<CudaDevice>,
    act: Activation,
    dtype: DType,
    ptr: sys::CUdeviceptr,
    n: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let Activation::GeluTanh = act;
    let f = ActivationKernels::get(dev)?.gelu_tanh[kernel_index(dtype)?];
    let (mut ptr, mut n64) = (ptr, n as i64);
    let mut params: [*mut c_void; 2] = [(&mut ptr as *mut u64).cast(), (&mut n64 as *mut i64).cast()];
    // SAFETY: the parameters match the kernel's signature; the memory contract is the caller's.
    unsafe { launch_grid_stride(dev, f, n, &mut params, "coil_gelu_tanh") }
}

/// Enqueues `g[i] *= act'(aux[i])` for the `n` elements of `dtype` at `g` and `aux` (the
/// fallback when cuBLASLt could not apply an activation's gradient itself).
///
/// # Safety
/// `g` and `aux` must each address `n` elements of `dtype` on `dev`.
pub(crate) unsafe fn apply_activation_grad(
    dev: &Arc<CudaDevice>,
    act: Activation,
    dtype: DType,
    g: sys::CUdeviceptr,
    aux: sys::CUdeviceptr,
    n: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let Activation::GeluTanh = act;
    let f = ActivationKernels::get(dev)?.gelu_tanh_grad[kernel_index(dtype)?];
    let (mut g, mut aux, mut n64) = (g, aux, n as i64);
    let mut params: [*mut c_void; 3] =
        [(&mut g as *mut u64).cast(), (&mut aux as *mut u64).cast(), (&mut n64 as *mut i64).cast()];
    // SAFETY: the parameters match the kernel's signature; the memory contract is the caller's.
    unsafe { launch_grid_stride(dev, f, n, &mut params, "coil_gelu_tanh_grad") }
}
