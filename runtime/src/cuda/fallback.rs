//! The fallback template's kernels (`coil_codegen::templates::fallback`: `scatter`,
//! `scatter_add`, `scatter_reduce` and `cumsum` for ops with no generated kernel) on the device:
//! compiled by NVRTC (through the disk cache) the first time a device needs them, launched
//! grid-stride. A scatter's index out of range is reported in status words of the run's, as
//! generated kernels report theirs (`cuda::status`), checked at the next synchronization
//! point: the call does not wait for the kernel.

use super::compiler::{compile, LoadedModule};
use super::device::CudaDevice;
use super::gather::launch_grid_stride;
use super::memory::copy_device;
use coil_codegen::templates::fallback::{cumsum_kernel, cumsum_lines, scatter_kernel, ScatterDims, SOURCE};
pub use coil_codegen::templates::fallback::{supports_cumsum, supports_scatter};
use coil_ir::{Error, ReduceOp, Result, TensorMeta};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Arc;

/// The built-in fallback kernels of one device.
pub struct FallbackKernels {
    module: LoadedModule,
}

// SAFETY: the module's function handles are immutable and usable from any thread with the
// context bound.
unsafe impl Send for FallbackKernels {}
// SAFETY: as above.
unsafe impl Sync for FallbackKernels {}

impl FallbackKernels {
    fn get(dev: &Arc<CudaDevice>) -> Result<&FallbackKernels> {
        dev.fallback
            .get_or_init(|| {
                let build = || -> Result<FallbackKernels> {
                    let (cubin, _) = compile(SOURCE, &dev.arch(), &crate::cpu::default_cache_dir())?;
                    Ok(FallbackKernels { module: LoadedModule::load(dev, &cubin)? })
                };
                build().map_err(|e| e.message)
            })
            .as_ref()
            .map_err(|e| Error::runtime(e.clone()))
    }
}

/// Enqueues `out = scatter(x, dim, index, src)` (combined by `reduce`, if any) on contiguous device
/// buffers; an index out of range is reported in the 4 status words at `status` (zero before).
///
/// # Safety
/// Each pointer must address a contiguous buffer of its meta on `dev`; `out` (the shape of `x`)
/// must not overlap `index` or `src`; `status` must address 4 `i64` words on `dev`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn scatter(
    dev: &Arc<CudaDevice>,
    dim: usize,
    reduce: Option<ReduceOp>,
    (x, xm): (sys::CUdeviceptr, &TensorMeta),
    (index, im): (sys::CUdeviceptr, &TensorMeta),
    (src, sm): (sys::CUdeviceptr, &TensorMeta),
    out: sys::CUdeviceptr,
    status: sys::CUdeviceptr,
) -> Result<()> {
    let name = scatter_kernel(xm.dtype, reduce).filter(|_| supports_scatter(xm, im, reduce));
    let Some(name) = name else {
        return Err(Error::unsupported(format!("a device scatter of {xm} with a {} index", im.dtype)));
    };
    if out != x {
        // SAFETY: both hold x's bytes (caller); distinct buffers of the program do not overlap.
        unsafe { copy_device(dev, out, x, xm.nbytes())? };
    }
    let n = im.numel();
    if n == 0 {
        return Ok(());
    }
    let kernels = FallbackKernels::get(dev)?;
    let f = kernels.module.function(&name)?;
    let mut d = ScatterDims::new(xm, im, sm);
    let (mut out_p, mut index_p, mut src_p, mut status_p) = (out, index, src, status);
    let (mut n64, mut ndim, mut dim32, mut dim_size) =
        (n as i64, xm.rank().max(1) as i32, dim as i32, xm.shape.get(dim).copied().unwrap_or(1) as i64);
    let mut params: [*mut c_void; 9] = [
        (&mut out_p as *mut u64).cast(),
        (&mut index_p as *mut u64).cast(),
        (&mut src_p as *mut u64).cast(),
        (&mut n64 as *mut i64).cast(),
        (&mut ndim as *mut i32).cast(),
        (&mut dim32 as *mut i32).cast(),
        (&mut dim_size as *mut i64).cast(),
        (&mut d as *mut ScatterDims).cast(),
        (&mut status_p as *mut u64).cast(),
    ];
    // SAFETY: the parameters match the scatter kernels' signature; the memory contract is the
    // caller's.
    unsafe { launch_grid_stride(dev, f, n, &mut params, "coil_scatter") }
}

/// `out = cumsum(x, dim)` on contiguous device buffers of x's meta.
///
/// # Safety
/// `x` and `out` must address contiguous buffers of `xm` on `dev`, not overlapping.
pub(crate) unsafe fn cumsum(
    dev: &Arc<CudaDevice>,
    dim: usize,
    (x, xm): (sys::CUdeviceptr, &TensorMeta),
    out: sys::CUdeviceptr,
) -> Result<()> {
    let Some(name) = cumsum_kernel(xm.dtype) else {
        return Err(Error::unsupported(format!("a device cumsum of {xm}")));
    };
    let n = xm.numel();
    if n == 0 {
        return Ok(());
    }
    let (lines, len, inner) = cumsum_lines(xm, dim);
    let f = FallbackKernels::get(dev)?.module.function(name)?;
    let (mut x_p, mut out_p) = (x, out);
    let (mut lines, mut len64, mut inner64) = (lines as i64, len as i64, inner as i64);
    let mut params: [*mut c_void; 5] = [
        (&mut x_p as *mut u64).cast(),
        (&mut out_p as *mut u64).cast(),
        (&mut lines as *mut i64).cast(),
        (&mut len64 as *mut i64).cast(),
        (&mut inner64 as *mut i64).cast(),
    ];
    // SAFETY: the parameters match the cumsum kernels' signature; the memory contract is the
    // caller's.
    unsafe { launch_grid_stride(dev, f, lines as usize, &mut params, "coil_cumsum") }
}
