//! `argsort` on a GPU: compiles the template's unit for the dtype (`coil_codegen::templates::sort`) once
//! per device and launches it by its [`SortPlan`]: the tile kernel (a bitonic sort per tile in
//! shared memory), then, for lines longer than a tile, merge passes over two scratch buffers.
//! Everything is enqueued on the device's stream: no host round trip, and the scratch blocks
//! go back to the caching allocator when the call returns (the stream orders their next use).

use super::compiler::template_module;
use super::device::{driver_error, CudaDevice};
use super::gather::launch_grid_stride;
use super::memory::DeviceMemory;
use coil_codegen::templates::sort::{tile_kernel, SortPlan, MERGE_KERNEL, SOURCE};
use coil_ir::{DType, Error, Result, TensorMeta};
use cudarc::driver::{result as drv, sys};
use std::ffi::c_void;
use std::sync::Arc;

/// The unit [`argsort`] launches for elements of `dtype`: its tile kernel (and the merge,
/// which every unit has).
pub(crate) fn argsort_unit(dtype: DType) -> super::fallback::Unit {
    (SOURCE, tile_kernel(dtype).to_string())
}

/// Whether the device kernels sort `x` (lines short enough for their 32-bit positions).
///
/// ```
/// use coil_ir::{DType, TensorMeta};
/// use coil_runtime::cuda::sort::supports_argsort;
/// assert!(supports_argsort(&TensorMeta::new(vec![4, 50257], DType::BF16), 1));
/// ```
pub fn supports_argsort(x: &TensorMeta, dim: usize) -> bool {
    let len = x.shape.get(dim).copied().unwrap_or(1);
    x.numel() == 0 || SortPlan::new(1, len, 1).is_some()
}

/// Enqueues `out = argsort(x, dim, descending)` (stable) on contiguous device buffers: `x` of
/// `xm`, `out` i64 of its shape.
///
/// # Safety
/// `x` and `out` must address contiguous buffers of those metas on `dev`, not overlapping.
pub(crate) unsafe fn argsort(
    dev: &Arc<CudaDevice>,
    dim: usize,
    descending: bool,
    (x, xm): (sys::CUdeviceptr, &TensorMeta),
    out: sys::CUdeviceptr,
) -> Result<()> {
    let n = xm.numel();
    if n == 0 {
        return Ok(());
    }
    let len = xm.shape.get(dim).copied().unwrap_or(1);
    let inner: usize = xm.shape.get(dim + 1..).map_or(1, |s| s.iter().product());
    let Some(plan) = SortPlan::new(n / len, len, inner) else {
        return Err(Error::unsupported(format!("a device argsort of lines of {len} elements (at most 2^32 - 2)")));
    };
    // The unit of the dtype's tile kernel (the merge kernel is in every unit).
    let tile = tile_kernel(xm.dtype);
    let module = template_module(dev, SOURCE, &[tile])?;
    let scratch = plan.scratch_elements();
    let buffers = if scratch == 0 {
        None
    } else {
        Some([
            (DeviceMemory::alloc(dev, scratch * 8)?, DeviceMemory::alloc(dev, scratch * 4)?),
            (DeviceMemory::alloc(dev, scratch * 8)?, DeviceMemory::alloc(dev, scratch * 4)?),
        ])
    };
    let ptr = |k: usize| buffers.as_ref().map_or((0, 0), |b| (b[k].0.ptr(), b[k].1.ptr()));

    let f = module.function(tile)?;
    let (mut x_p, (mut keys_p, mut pos_p), mut out_p) = (x, ptr(0), out);
    let (mut lines, mut len64, mut inner64, mut tiles) =
        (plan.lines as i64, plan.len as i64, plan.inner as i64, plan.tiles as i64);
    let (mut width, mut desc) = (plan.width as i32, descending as i32);
    let mut params: [*mut c_void; 10] = [
        (&mut x_p as *mut u64).cast(),
        (&mut keys_p as *mut u64).cast(),
        (&mut pos_p as *mut u64).cast(),
        (&mut out_p as *mut u64).cast(),
        (&mut lines as *mut i64).cast(),
        (&mut len64 as *mut i64).cast(),
        (&mut inner64 as *mut i64).cast(),
        (&mut tiles as *mut i64).cast(),
        (&mut width as *mut i32).cast(),
        (&mut desc as *mut i32).cast(),
    ];
    let blocks = (plan.lines * plan.tiles).min(i32::MAX as usize) as u32;
    dev.bind()?;
    // SAFETY: the parameters match the tile kernels' signature; `x` and `out` are the caller's,
    // the scratch buffers hold `lines * len` keys and positions.
    unsafe { drv::launch_kernel(f, (blocks, 1, 1), (plan.threads as u32, 1, 1), 0, dev.cu_stream(), &mut params) }
        .map_err(|e| driver_error("cuLaunchKernel(coil_sort_tile)", e))?;

    let merge = module.function(MERGE_KERNEL)?;
    for (k, &run) in plan.merges.iter().enumerate() {
        let ((mut kin, mut pin), (mut kout, mut pout)) = (ptr(k % 2), ptr((k + 1) % 2));
        let (mut run64, mut last) = (run as i64, (k + 1 == plan.merges.len()) as i32);
        let mut params: [*mut c_void; 10] = [
            (&mut kin as *mut u64).cast(),
            (&mut pin as *mut u64).cast(),
            (&mut kout as *mut u64).cast(),
            (&mut pout as *mut u64).cast(),
            (&mut out_p as *mut u64).cast(),
            (&mut lines as *mut i64).cast(),
            (&mut len64 as *mut i64).cast(),
            (&mut inner64 as *mut i64).cast(),
            (&mut run64 as *mut i64).cast(),
            (&mut last as *mut i32).cast(),
        ];
        // SAFETY: the parameters match the merge kernel's signature; the scratch buffers hold
        // every line's pairs, `out` the caller's i64 positions.
        unsafe { launch_grid_stride(dev, merge, n, &mut params, MERGE_KERNEL)? };
    }
    Ok(())
}
