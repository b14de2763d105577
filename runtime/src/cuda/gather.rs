//! A strided gather on the device: copies any strided view into a contiguous buffer.
//!
//! cuBLASLt takes a matrix only as a leading dimension plus a transpose flag, and its bias
//! epilogue only a contiguous vector; the few views that are not expressible so are first
//! gathered by the gather template's kernels (`coil_codegen::templates::gather`), compiled
//! with NVRTC (through the disk cache) the first time a device needs them.

use super::compiler::{compile, LoadedModule};
use super::device::{driver_error, CudaDevice};
use super::memory::copy_device;
use coil_codegen::templates::gather::{
    kernel, CopyBatch, GatherDims, COPY_BATCH, COPY_BATCH_BLOCK, COPY_BATCH_KERNEL, COPY_BATCH_MAX_BYTES, MAX_DIMS,
    SOURCE,
};
use coil_codegen::templates::grid_stride_launch;
use coil_ir::{Error, Result};
use cudarc::driver::{result as drv, sys};
use std::ffi::c_void;
use std::sync::Arc;

/// The gather template's kernels on one device: the gathers by element size (1, 2, 4, 8
/// bytes) and the batched copy.
pub struct Helpers {
    _module: LoadedModule,
    gather: [sys::CUfunction; 4],
    copy_batch: sys::CUfunction,
}

// SAFETY: function handles are immutable and usable from any thread with the context bound.
unsafe impl Send for Helpers {}
// SAFETY: as above.
unsafe impl Sync for Helpers {}

impl Helpers {
    fn get(dev: &Arc<CudaDevice>) -> Result<&Helpers> {
        dev.helpers
            .get_or_init(|| {
                let build = || -> Result<Helpers> {
                    let (cubin, _) = compile(SOURCE, &dev.arch(), &crate::cpu::default_cache_dir())?;
                    let module = LoadedModule::load(dev, &cubin)?;
                    let f = |n: usize| module.function(kernel(n).expect("a gather kernel"));
                    let gather = [f(1)?, f(2)?, f(4)?, f(8)?];
                    let copy_batch = module.function(COPY_BATCH_KERNEL)?;
                    Ok(Helpers { _module: module, gather, copy_batch })
                };
                build().map_err(|e| e.message)
            })
            .as_ref()
            .map_err(|e| Error::runtime(e.clone()))
    }
}

/// Enqueues `dst[i] = src[sum_d idx_d(i) * strides[d]]` for the row-major index `i` over
/// `sizes`, elements of `elem` bytes. `src` already includes the view's offset.
///
/// # Safety
/// Every element the view reaches must lie inside `src`'s allocation, and `dst` must hold
/// `product(sizes)` elements, not overlapping `src`.
pub(crate) unsafe fn gather(
    dev: &Arc<CudaDevice>,
    src: sys::CUdeviceptr,
    dst: sys::CUdeviceptr,
    elem: usize,
    sizes: &[usize],
    strides: &[usize],
) -> Result<()> {
    let n: usize = sizes.iter().product();
    if n == 0 {
        return Ok(());
    }
    let dims: Vec<(usize, usize)> =
        sizes.iter().copied().zip(strides.iter().copied()).filter(|&(s, _)| s != 1).collect();
    if dims.len() > MAX_DIMS {
        return Err(Error::unsupported(format!("a strided copy of {} dims (at most {MAX_DIMS})", dims.len())));
    }
    let mut d = GatherDims { size: [1; MAX_DIMS], stride: [0; MAX_DIMS] };
    for (k, &(s, st)) in dims.iter().enumerate() {
        d.size[k] = s as i64;
        d.stride[k] = st as i64;
    }
    let f = Helpers::get(dev)?.gather[match elem {
        1 => 0,
        2 => 1,
        4 => 2,
        8 => 3,
        _ => return Err(Error::unsupported(format!("a strided copy of {elem}-byte elements"))),
    }];
    let (mut src, mut dst, mut n64, mut ndim) = (src, dst, n as i64, dims.len() as i32);
    let mut params: [*mut c_void; 5] = [
        (&mut src as *mut u64).cast(),
        (&mut dst as *mut u64).cast(),
        (&mut n64 as *mut i64).cast(),
        (&mut ndim as *mut i32).cast(),
        (&mut d as *mut GatherDims).cast(),
    ];
    // SAFETY: the parameters match coil_gather's signature; the memory contract is the caller's.
    unsafe { launch_grid_stride(dev, f, n, &mut params, "coil_gather") }
}

/// Enqueues the contiguous copies `(dst, src, bytes)`: the small ones batched, up to
/// [`COPY_BATCH`] per launch of the template's `coil_copy_batch`, the large ones (over
/// [`COPY_BATCH_MAX_BYTES`]) as `cuMemcpyDtoDAsync` each. A replayed CUDA graph's copied inputs
/// (a decode step's token and position) take one launch instead of a driver copy each.
///
/// # Safety
/// Each `src` must hold `bytes` bytes and each `dst` room for them, on `dev`; no destination
/// may overlap another copy's source or destination.
pub(crate) unsafe fn copy_batch(
    dev: &Arc<CudaDevice>,
    copies: &[(sys::CUdeviceptr, sys::CUdeviceptr, usize)],
) -> Result<()> {
    let mut batch = CopyBatch::default();
    let mut n = 0;
    let launch = |batch: &mut CopyBatch, n: usize| -> Result<()> {
        let f = Helpers::get(dev)?.copy_batch;
        let mut params: [*mut c_void; 1] = [(batch as *mut CopyBatch).cast()];
        dev.bind()?;
        // SAFETY: the parameter matches coil_copy_batch's; the memory contract is the caller's.
        unsafe { drv::launch_kernel(f, (n as u32, 1, 1), (COPY_BATCH_BLOCK, 1, 1), 0, dev.cu_stream(), &mut params) }
            .map_err(|e| driver_error("cuLaunchKernel(coil_copy_batch)", e))
    };
    for &(dst, src, bytes) in copies.iter().filter(|c| c.2 > 0) {
        if bytes > COPY_BATCH_MAX_BYTES {
            // SAFETY: the caller's contract.
            unsafe { copy_device(dev, dst, src, bytes)? };
            continue;
        }
        (batch.dst[n], batch.src[n], batch.bytes[n]) = (dst, src, bytes as i64);
        n += 1;
        if n == COPY_BATCH {
            launch(&mut batch, n)?;
            n = 0;
        }
    }
    if n > 0 {
        launch(&mut batch, n)?;
    }
    Ok(())
}

/// Launches a template's grid-stride kernel over `n` items, by the templates' rule
/// ([`grid_stride_launch`]).
///
/// # Safety
/// `params` must match `f`'s signature and point at values that live until the call returns (the
/// driver copies them); whatever memory the kernel touches is the caller's to guarantee.
pub(crate) unsafe fn launch_grid_stride(
    dev: &Arc<CudaDevice>,
    f: sys::CUfunction,
    n: usize,
    params: &mut [*mut c_void],
    name: &str,
) -> Result<()> {
    let (grid, block) = grid_stride_launch(n, dev.target());
    dev.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv::launch_kernel(f, (grid, 1, 1), (block, 1, 1), 0, dev.cu_stream(), params) }
        .map_err(|e| driver_error(&format!("cuLaunchKernel({name})"), e))
}
