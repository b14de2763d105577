//! The fallback template's kernels (`coil_codegen::templates::fallback`: `scatter`,
//! `scatter_add`, `scatter_reduce` and `cumsum` for ops with no generated kernel) on the device:
//! each kernel's unit compiled by NVRTC (through the disk cache) the first time a device needs it, launched
//! grid-stride. Float reductions run the sorted scatter (`coil_codegen::templates::scatter`:
//! the argsort template groups the index by destination, one thread combines each
//! destination's sources in order), so their bits repeat from run to run and are the
//! interpreter's; plain scatters and integer reductions combine atomically (their bits do not
//! depend on the order). A scatter's index out of range is reported in status words of the
//! run's, as generated kernels report theirs (`cuda::status`), checked at the next
//! synchronization point: the call does not wait for the kernel.

use super::compiler::template_module;
use super::device::{driver_error, CudaDevice};
use super::gather::launch_grid_stride;
use super::memory::{copy_device, DeviceMemory};
use coil_codegen::templates::fallback::{cumsum_kernel, cumsum_lines, scatter_kernel, SOURCE};
pub use coil_codegen::templates::fallback::{supports_cumsum, supports_scatter};
use coil_codegen::templates::scatter::{ScatterDims, SortedScatter, ROW_KEYS_KERNEL, SORTED_KEYS_KERNEL, VECTOR_BYTES};
use coil_ir::{DType, Error, ReduceOp, Result, TensorMeta};
use cudarc::driver::{result as drv, sys};
use std::ffi::c_void;
use std::sync::Arc;

/// The fallback template's kernel `name` on `dev` (its unit compiled on first use).
fn function(dev: &Arc<CudaDevice>, name: &str) -> Result<sys::CUfunction> {
    template_module(dev, SOURCE, &[name])?.function(name)
}

/// A template unit: the template's source and the variants it is compiled with
/// ([`template_module`]).
pub(crate) type Unit = (&'static str, String);

/// The units a scatter of these operands launches (see [`scatter`]): a float reduction's
/// combine (its unit has the key kernels) and the argsort of its keys, its rows taken to be
/// 16-byte aligned, as the allocator's blocks are; otherwise the atomic kernel's.
pub(crate) fn scatter_units(
    xm: &TensorMeta,
    im: &TensorMeta,
    sm: &TensorMeta,
    dim: usize,
    reduce: Option<ReduceOp>,
    index_repeats: bool,
) -> Vec<Unit> {
    if !supports_scatter(xm, im, reduce) {
        return vec![];
    }
    match SortedScatter::new(xm, im, sm, dim, reduce, index_repeats) {
        Some(plan) => vec![(SOURCE, plan.kernel()), super::sort::argsort_unit(DType::I64)],
        None => scatter_kernel(xm.dtype, reduce).map(|k| (SOURCE, k)).into_iter().collect(),
    }
}

/// The unit a cumsum of `x` launches ([`cumsum`]).
pub(crate) fn cumsum_units(x: &TensorMeta) -> Vec<Unit> {
    cumsum_kernel(x.dtype).map(|k| (SOURCE, k.to_string())).into_iter().collect()
}

/// Enqueues `out = scatter(x, dim, index, src)` (combined by `reduce`, if any) on contiguous device
/// buffers; an index out of range is reported in the 4 status words at `status` (zero before).
/// `index_repeats`: the index is known to repeat along its dims after `dim` (an expanded
/// index: `coil_passes::lower::repeats_along`), so that a float reduction sorts one column of
/// it instead of every element.
///
/// # Safety
/// Each pointer must address a contiguous buffer of its meta on `dev`; `out` (the shape of `x`)
/// must be `x` or not overlap it, and must not overlap `index` or `src`; `status` must address
/// 4 `i64` words on `dev`; `index_repeats` must be true only where the index repeats so.
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
    index_repeats: bool,
) -> Result<()> {
    if !supports_scatter(xm, im, reduce) {
        return Err(Error::unsupported(format!("a device scatter of {xm} with a {} index", im.dtype)));
    }
    if out != x {
        // SAFETY: both hold x's bytes (caller); distinct buffers of the program do not overlap.
        unsafe { copy_device(dev, out, x, xm.nbytes())? };
    }
    let n = im.numel();
    if n == 0 {
        return Ok(());
    }
    let mut d = ScatterDims::new(xm, im, sm);
    let (mut ndim, mut dim32) = (xm.rank().max(1) as i32, dim as i32);
    let mut dim_size = xm.shape.get(dim).copied().unwrap_or(1) as i64;
    if let Some(mut plan) = SortedScatter::new(xm, im, sm, dim, reduce, index_repeats) {
        if !(out | src).is_multiple_of(VECTOR_BYTES as u64) {
            plan.vector = 1; // the rows kernel's 16-byte loads need aligned rows
        }
        // SAFETY: the caller's contract.
        return unsafe { sorted_scatter(dev, &plan, (index, src, out, status), (ndim, dim32, &mut d)) };
    }
    let name = scatter_kernel(xm.dtype, reduce).expect("supported: an atomic kernel or a sorted one");
    let f = function(dev, &name)?;
    let (mut out_p, mut index_p, mut src_p, mut status_p) = (out, index, src, status);
    let mut n64 = n as i64;
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

/// The sorted scatter's launches (`coil_codegen::templates::scatter`): the row keys if any,
/// the argsort of the keys, the keys in sorted order, the combine. Its scratch buffers go
/// back to the caching allocator when the call returns (the stream orders their next use).
///
/// # Safety
/// As [`scatter`]'s, `out` holding x's values already; `d` the operands' dims.
unsafe fn sorted_scatter(
    dev: &Arc<CudaDevice>,
    plan: &SortedScatter,
    (index, src, out, status): (sys::CUdeviceptr, sys::CUdeviceptr, sys::CUdeviceptr, sys::CUdeviceptr),
    (mut ndim, mut dim, d): (i32, i32, &mut ScatterDims),
) -> Result<()> {
    if plan.sort_plan().is_none() {
        return Err(Error::unsupported(format!(
            "a device scatter along a dim of {} elements (at most 2^32 - 2)",
            plan.len
        )));
    }
    // The combine's unit has the key kernels too (defined outside the instantiation lists).
    let combine = plan.kernel();
    let module = template_module(dev, SOURCE, &[&combine])?;
    let keys = plan.keys();
    let i64s = |n: usize| DeviceMemory::alloc(dev, n * 8);
    let row_keys = if plan.copies_row_keys() { Some(i64s(keys)?) } else { None };
    let (pos, sorted) = (i64s(keys)?, i64s(keys)?);
    let (mut index_p, mut keys_p) = (index, row_keys.as_ref().map_or(index, |k| k.ptr()));
    let (mut len, mut inner, mut stride) = (plan.len as i64, plan.inner as i64, plan.stride() as i64);
    if row_keys.is_some() {
        let mut rows = (plan.outer * plan.len) as i64;
        let f = module.function(ROW_KEYS_KERNEL)?;
        let mut params: [*mut c_void; 4] = [
            (&mut index_p as *mut u64).cast(),
            (&mut keys_p as *mut u64).cast(),
            (&mut rows as *mut i64).cast(),
            (&mut inner as *mut i64).cast(),
        ];
        // SAFETY: the parameters match the kernel's signature; the index holds `rows * inner`
        // elements, the keys buffer `rows`.
        unsafe { launch_grid_stride(dev, f, rows as usize, &mut params, ROW_KEYS_KERNEL)? };
    }
    // SAFETY: the keys are `keys_meta`'s contiguous i64s, the positions as many.
    unsafe { super::sort::argsort(dev, 1, false, (keys_p, &plan.keys_meta()), pos.ptr())? };

    let (mut pos_p, mut sorted_p, mut status_p) = (pos.ptr(), sorted.ptr(), status);
    let (mut n, mut dim_size) = (keys as i64, plan.dim_size as i64);
    let f = module.function(SORTED_KEYS_KERNEL)?;
    let mut params: [*mut c_void; 8] = [
        (&mut keys_p as *mut u64).cast(),
        (&mut pos_p as *mut u64).cast(),
        (&mut sorted_p as *mut u64).cast(),
        (&mut n as *mut i64).cast(),
        (&mut len as *mut i64).cast(),
        (&mut stride as *mut i64).cast(),
        (&mut dim_size as *mut i64).cast(),
        (&mut status_p as *mut u64).cast(),
    ];
    // SAFETY: the parameters match the kernel's signature; keys, positions and sorted keys
    // hold `keys` elements each, the status words are the caller's.
    unsafe { launch_grid_stride(dev, f, keys, &mut params, SORTED_KEYS_KERNEL)? };

    let f = module.function(&combine)?;
    let (mut out_p, mut src_p, mut outer) = (out, src, plan.outer as i64);
    let mut params: Vec<*mut c_void> = vec![
        (&mut out_p as *mut u64).cast(),
        (&mut src_p as *mut u64).cast(),
        (&mut pos_p as *mut u64).cast(),
        (&mut sorted_p as *mut u64).cast(),
        (&mut ndim as *mut i32).cast(),
        (&mut dim as *mut i32).cast(),
        (&mut outer as *mut i64).cast(),
        (&mut len as *mut i64).cast(),
        (&mut inner as *mut i64).cast(),
    ];
    if plan.vector == 1 {
        params.push((&mut stride as *mut i64).cast()); // the rows kernel's is 1
    }
    params.push((&mut dim_size as *mut i64).cast());
    params.push((d as *mut ScatterDims).cast());
    let ([gx, gy], [bx, by]) = plan.combine_launch();
    dev.bind()?;
    // SAFETY: the parameters match the combine kernel's signature; `out` and `src` are the
    // caller's (x's and src's metas, described by `d`; 16-byte aligned for the rows kernel),
    // the positions and sorted keys this call's.
    unsafe { drv::launch_kernel(f, (gx, gy, 1), (bx, by, 1), 0, dev.cu_stream(), &mut params) }
        .map_err(|e| driver_error(&format!("cuLaunchKernel({combine})"), e))
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
    let f = function(dev, name)?;
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

#[cfg(test)]
#[path = "scatter_emulation.rs"]
mod emulation;
