//! The attention templates on the GPU ([`ExternCall::Attention`] and
//! [`ExternCall::AttentionBackward`](coil_ir::loops::ExternCall)): launches the kernels of
//! `coil_codegen::templates` (their CUDA C, variants, parameter layouts and launch rules live
//! there), so neither the `[*batch, L, S]` scores nor the probabilities ever exist in memory.
//!
//! Per call: every view is bounds-checked against its buffer; the kernel is chosen by the
//! template's launch rule ([`ForwardLaunch::choose`]: dtype, head dim and architecture, tensor
//! cores for f16 / bf16 on sm_80+; split-KV kernels for few query rows, their splits from the
//! device's SM count); operands the tensor-core kernels cannot read in place (rows not 16-byte
//! aligned, or a column stride other than 1) are gathered into contiguous temporaries first
//! ([`super::gather`]), and outputs the row-block tensor-core kernel cannot write as pairs fall
//! back to the simple kernel. The split kernels' partial results live in a temporary workspace
//! between the split kernel and the combine. The backward's `delta = rowsum(dO * O)` is computed
//! by a kernel of its own into a temporary before the backward kernel (cuDNN's backward graph
//! computes it itself); a backward that stores dS (the template's `stores_ds` rule) keeps it
//! in a temporary between its two launches. A masked backward (the forward's explicit mask, read in place through
//! its strides, broadcast dims stride 0) runs on coil's kernels, as a masked forward does. Each variant is compiled by NVRTC (through the disk cache) the first
//! time a graph needs it.
//!
//! [`ExternCall::Attention`]: coil_ir::loops::ExternCall::Attention

use super::compiler::{allow_dynamic_shared, compile, LoadedModule};
use super::device::{driver_error, CudaDevice};
use super::gather::gather;
use super::memory::DeviceMemory;
use crate::cpu::attention::AttentionSpec;
use crate::cpu::attention_backward::AttentionBackwardSpec;
use crate::cpu::attention_dropout::DropoutDraw;
use crate::cuda::blas::DevOperand;
use coil_codegen::templates::attention::{
    mma_reads, mma_writes, AttnDropout, AttnOperand, AttnParams, ForwardLaunch, MaskKind,
};
use coil_codegen::templates::attention_backward::{
    backward_grid, AttentionBackwardKernel, AttentionDeltaKernel, AttnBwdParams, AttnDeltaParams,
};
use coil_ir::loops::StridedOperand;
use coil_ir::{DType, Error, Result};
use cudarc::driver::{result as drv, sys};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// A loaded variant.
struct Kernel {
    _module: LoadedModule,
    func: sys::CUfunction,
}

// SAFETY: function handles are immutable and usable from any thread with the context bound.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

/// The variants built so far, by device ordinal and name (a failed build is remembered too).
type Kernels = HashMap<(usize, String), std::result::Result<Arc<Kernel>, String>>;

/// The variant `name` of `source` on `dev`, built on first use, allowed `shared` bytes of
/// dynamic shared memory.
fn kernel(dev: &Arc<CudaDevice>, name: String, source: impl FnOnce() -> String, shared: u32) -> Result<Arc<Kernel>> {
    static KERNELS: Mutex<Option<Kernels>> = Mutex::new(None);
    let mut table = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
    let table = table.get_or_insert_with(HashMap::new);
    let entry = table.entry((dev.ordinal(), name.clone())).or_insert_with(|| {
        let build = || -> Result<Arc<Kernel>> {
            let (cubin, _) = compile(&source(), &dev.arch(), &crate::cpu::default_cache_dir())?;
            let module = LoadedModule::load(dev, &cubin)?;
            let func = module.function(&name)?;
            allow_dynamic_shared(dev, func, shared)?;
            Ok(Arc::new(Kernel { _module: module, func }))
        };
        build().map_err(|e| e.message)
    });
    entry.clone().map_err(Error::runtime)
}

/// A view's kernel argument (at most 2 batch dims: checked by [`check_sizes`]).
fn operand(op: &StridedOperand<usize>) -> AttnOperand {
    AttnOperand::new(op.offset, &op.batch_strides, op.row_stride, op.col_stride).expect("at most 2 batch dims")
}

/// The sizes the kernels index with 32-bit integers and grid dims, checked.
fn check_sizes(what: &str, batch: &[usize], l: usize, s: usize, grid_y: usize) -> Result<()> {
    let too_big = |of: &str, n: usize, max: usize| {
        Err(Error::unsupported(format!("{what} on CUDA with {of} {n} (at most {max})")))
    };
    if batch.len() > 2 {
        return too_big("batch dims", batch.len(), 2);
    }
    if l.max(s) > i32::MAX as usize / 2 {
        return too_big("sequence length", l.max(s), i32::MAX as usize / 2);
    }
    if grid_y > 65535 {
        return too_big("row blocks", grid_y, 65535);
    }
    let count: usize = batch.iter().product();
    if count > i32::MAX as usize {
        return too_big("batch indices", count, i32::MAX as usize);
    }
    Ok(())
}

/// Row-major strides of `sizes`.
fn row_major(sizes: &[usize]) -> Vec<usize> {
    let mut out = vec![1; sizes.len()];
    for i in (0..sizes.len().saturating_sub(1)).rev() {
        out[i] = out[i + 1] * sizes[i + 1];
    }
    out
}

/// Operands as the kernel reads them: `(view, base pointer)` of each, the views as they are
/// (`gather == false`, or readable in place by the tensor-core kernels), else gathered into
/// contiguous temporaries, which `temps` keeps until the launch is enqueued.
fn prepare(
    dev: &Arc<CudaDevice>,
    (batch, d, size): (&[usize], usize, usize),
    views: &[(&StridedOperand<usize>, DevOperand, usize)],
    gather_unreadable: bool,
    temps: &mut Vec<DeviceMemory>,
) -> Result<Vec<(StridedOperand<usize>, u64)>> {
    let mut prepared = Vec::with_capacity(views.len());
    for &(op, buf, rows) in views {
        if !gather_unreadable || mma_reads(buf.ptr, op.offset, &op.batch_strides, op.row_stride, op.col_stride, d) {
            prepared.push((op.clone(), buf.ptr));
            continue;
        }
        let sizes: Vec<usize> = batch.iter().copied().chain([rows, d]).collect();
        let strides: Vec<usize> = op.batch_strides.iter().copied().chain([op.row_stride, op.col_stride]).collect();
        let tmp = DeviceMemory::alloc(dev, sizes.iter().product::<usize>() * size)?;
        // SAFETY: the caller bounds-checked the view inside its buffer; `tmp` holds the
        // gathered elements and overlaps nothing.
        unsafe { gather(dev, buf.ptr + (op.offset * size) as u64, tmp.ptr(), size, &sizes, &strides)? };
        let contiguous = StridedOperand {
            buffer: op.buffer,
            offset: 0,
            batch_strides: row_major(&sizes)[..batch.len()].to_vec(),
            row_stride: d,
            col_stride: 1,
        };
        prepared.push((contiguous, tmp.ptr()));
        temps.push(tmp);
    }
    Ok(prepared)
}

/// Whether the tensor-core kernels write an output view in place.
fn writable(op: &StridedOperand<usize>, buf: u64, d: usize) -> bool {
    mma_writes(buf, op.offset, &op.batch_strides, op.row_stride, op.col_stride, d)
}

/// The forward kernels' parameters for `spec` run by `launch`, reading q, k, v through `qkv`
/// (the spec's views, or contiguous copies of them), with a mask of `mask` kind if any.
pub(crate) fn launch_params(
    spec: &AttentionSpec,
    qkv: [&StridedOperand<usize>; 3],
    mask: Option<MaskKind>,
    launch: &ForwardLaunch,
) -> AttnParams {
    AttnParams {
        q: operand(qkv[0]),
        k: operand(qkv[1]),
        v: operand(qkv[2]),
        o: operand(&spec.out),
        mask: spec.mask.as_ref().map(operand).unwrap_or_default(),
        heads: spec.batch.last().copied().unwrap_or(1) as i32,
        l: spec.l as i32,
        s: spec.s as i32,
        d: spec.d as i32,
        scale_log2: (spec.scale * std::f64::consts::LOG2_E) as f32,
        diagonal: (spec.causal || spec.mask_rule.is_some()) as i32,
        mask_kind: MaskKind::code(mask),
        chunk: launch.chunk as i32,
        splits: launch.splits as i32,
        // A period of at least the rows is no period (every row is its own term).
        period: match spec.mask_rule.as_ref().and_then(|r| r.period) {
            Some(p) if p < spec.l => p as i32,
            _ => 0,
        },
        diag_const: spec.mask_rule.as_ref().map_or(0, |r| r.constant),
        drop: dropout_param(spec.dropout),
    }
}

/// The kernels' dropout argument: the run's draw, or none (threshold 0).
fn dropout_param(draw: Option<DropoutDraw>) -> AttnDropout {
    draw.map_or_else(AttnDropout::default, |d| AttnDropout::new(d.seed, d.start, d.threshold, d.scale))
}

/// The device buffers of one forward call: the operands (q, k, v and the mask may share
/// buffers; the mask with what it holds), and the output and logsumexp, which overlap no
/// operand.
pub struct DevForward {
    /// The queries.
    pub q: DevOperand,
    /// The keys.
    pub k: DevOperand,
    /// The values.
    pub v: DevOperand,
    /// The explicit mask and what it holds, if any.
    pub mask: Option<(DevOperand, MaskKind)>,
    /// The output.
    pub out: DevOperand,
    /// The row logsumexp (f32), when a backward needs it.
    pub lse: Option<DevOperand>,
    /// The structured mask's offset (a 0-d i64), when its rule has one: the kernels read it.
    pub offset: Option<DevOperand>,
}

/// Enqueues the attention call `spec` (operands and output of `dtype`), and with a logsumexp
/// buffer the row logsumexp (`[*batch, l]` f32).
pub fn attention(dev: &Arc<CudaDevice>, spec: &AttentionSpec, dtype: DType, bufs: DevForward) -> Result<()> {
    let size = dtype.size_bytes();
    let mask_len = bufs.mask.map(|(m, kind)| m.bytes / if kind == MaskKind::Bool { 1 } else { size });
    spec.check(bufs.q.bytes / size, bufs.k.bytes / size, bufs.v.bytes / size, bufs.out.bytes / size, mask_len)?;
    let wants_offset = spec.mask_rule.as_ref().is_some_and(|r| r.offset.is_some());
    if wants_offset != bufs.offset.is_some_and(|o| o.bytes >= 8) {
        return Err(Error::runtime("attention: the mask rule's offset is not a device i64 of the call"));
    }
    let count = spec.batch_count();
    if let Some(lse) = bufs.lse {
        if lse.bytes < count * spec.l * 4 {
            return Err(Error::runtime(format!(
                "attention: a logsumexp of {} bytes for {count} x {} rows",
                lse.bytes, spec.l
            )));
        }
    }
    if count * spec.l * spec.d == 0 {
        return Ok(());
    }
    let (lse_ptr, ptrs) = (bufs.lse.map(|l| l.ptr), [bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, bufs.out.ptr]);
    if super::cudnn_sdpa::forward(dev, spec, dtype, ptrs, lse_ptr)? {
        return Ok(());
    }
    let mut launch = ForwardLaunch::choose(dtype, spec.d, dev.target(), count, spec.l, spec.s, spec.causal)?;
    check_sizes("attention", &spec.batch, spec.l, spec.s, launch.grid.1 as usize)?;
    if !writable(&spec.out, bufs.out.ptr, spec.d) {
        launch.kernel = launch.kernel.simple(dtype);
    }
    let mut temps: Vec<DeviceMemory> = Vec::new();
    let views = [(&spec.q, bufs.q, spec.l), (&spec.k, bufs.k, spec.s), (&spec.v, bufs.v, spec.s)];
    let prepared = prepare(dev, (&spec.batch, spec.d, size), &views, launch.kernel.copies_rows(), &mut temps)?;
    let mask_kind = bufs.mask.map(|(_, kind)| kind);
    let mut params = launch_params(spec, [&prepared[0].0, &prepared[1].0, &prepared[2].0], mask_kind, &launch);
    let workspace = DeviceMemory::alloc(dev, launch.workspace_bytes(count, spec.l, spec.d))?;
    let entry = launch.kernel.entry(mask_kind.is_some());
    let f = kernel(dev, entry.clone(), || launch.kernel.source(), 0)?.func;
    let mut ptrs: [u64; 8] = [
        prepared[0].1,
        prepared[1].1,
        prepared[2].1,
        bufs.out.ptr,
        bufs.lse.map_or(0, |l| l.ptr),
        bufs.mask.map_or(0, |(m, _)| m.ptr),
        workspace.ptr(),
        bufs.offset.map_or(0, |o| o.ptr),
    ];
    let mut args: Vec<*mut c_void> = ptrs.iter_mut().map(|p| (p as *mut u64).cast()).collect();
    args.push((&mut params as *mut AttnParams).cast());
    dev.bind()?;
    let block = (launch.kernel.block(), 1, 1);
    // SAFETY: the arguments match the kernel's signature (eight device pointers, the
    // logsumexp's, the mask's, the workspace's and the offset's possibly null, and the parameter
    // struct, laid out as in C; the offset holds an i64, checked above) and live until the call returns (the driver copies them); every element the
    // kernel touches was bounds-checked above, the workspace holds the partial results of
    // every split; the temporaries go back to the stream-ordered cache after the launches are
    // enqueued, so no later work reuses them before they ran.
    unsafe { drv::launch_kernel(f, launch.grid, block, 0, dev.cu_stream(), &mut args) }
        .map_err(|e| driver_error(&format!("cuLaunchKernel({entry})"), e))?;
    if let Some(combine) = launch.combine {
        let f = kernel(dev, combine.name(), || combine.source(), 0)?.func;
        let mut ptrs = [bufs.out.ptr, bufs.lse.map_or(0, |l| l.ptr), workspace.ptr()];
        let mut args: Vec<*mut c_void> = ptrs.iter_mut().map(|p| (p as *mut u64).cast()).collect();
        args.push((&mut params as *mut AttnParams).cast());
        // SAFETY: as above: three device pointers (the logsumexp's possibly null) and the
        // parameters; the split kernel before it on the stream wrote the workspace.
        unsafe { drv::launch_kernel(f, (count as u32, 1, 1), (combine.block(), 1, 1), 0, dev.cu_stream(), &mut args) }
            .map_err(|e| driver_error(&format!("cuLaunchKernel({})", combine.name()), e))?;
    }
    drop(temps);
    drop(workspace);
    Ok(())
}

/// The device buffers of one backward call (see [`crate::cpu::attention_backward`]): the
/// operands (q, k, v, the output gradient and the output may share buffers), the f32
/// logsumexp, and the wanted gradients, which overlap no operand and no other gradient's
/// elements (they may share a buffer: disjoint views of the tensor that concatenates them).
pub struct DevBackward {
    /// The queries.
    pub q: DevOperand,
    /// The keys.
    pub k: DevOperand,
    /// The values.
    pub v: DevOperand,
    /// The gradient of the attention's output.
    pub grad_out: DevOperand,
    /// The forward's row logsumexp.
    pub lse: DevOperand,
    /// The attention's output (the backward's `delta_i = g_i . o_i` is computed from it).
    pub out: DevOperand,
    /// The queries' gradient, when wanted.
    pub dq: Option<DevOperand>,
    /// The keys' gradient, when wanted.
    pub dk: Option<DevOperand>,
    /// The values' gradient, when wanted.
    pub dv: Option<DevOperand>,
    /// The forward's explicit mask and what it holds, if any.
    pub mask: Option<(DevOperand, MaskKind)>,
}

/// The backward kernel's parameters for `spec`, reading q, k, v and the output gradient
/// through `views` (the spec's views, or contiguous copies of them), with a mask of `mask`
/// kind if any; unwanted gradients get zero operands.
pub(crate) fn backward_params(
    spec: &AttentionBackwardSpec,
    views: [&StridedOperand<usize>; 4],
    key_blocks: u32,
    mask: Option<MaskKind>,
) -> AttnBwdParams {
    let grad = |g: &Option<StridedOperand<usize>>| g.as_ref().map(operand).unwrap_or_default();
    AttnBwdParams {
        q: operand(views[0]),
        k: operand(views[1]),
        v: operand(views[2]),
        dout: operand(views[3]),
        dq: grad(&spec.dq),
        dk: grad(&spec.dk),
        dv: grad(&spec.dv),
        heads: spec.batch.last().copied().unwrap_or(1) as i32,
        l: spec.l as i32,
        s: spec.s as i32,
        d: spec.d as i32,
        scale: spec.scale as f32,
        scale_log2: (spec.scale * std::f64::consts::LOG2_E) as f32,
        causal: spec.causal as i32,
        key_blocks: key_blocks as i32,
        mask: spec.mask.as_ref().map(operand).unwrap_or_default(),
        mask_kind: MaskKind::code(mask),
        drop: dropout_param(spec.dropout),
    }
}

/// The delta kernel's parameters for `spec`: its output and output gradient views.
pub(crate) fn delta_params(spec: &AttentionBackwardSpec) -> AttnDeltaParams {
    AttnDeltaParams {
        o: operand(&spec.out),
        dout: operand(&spec.grad_out),
        rows: (spec.batch_count() * spec.l) as i64,
        heads: spec.batch.last().copied().unwrap_or(1) as i32,
        l: spec.l as i32,
        d: spec.d as i32,
    }
}

/// Enqueues `delta_i = g_i . o_i` (f32) of every query row of `spec` into `delta`
/// (`[*batch, l]` row-major), read through the spec's views of the output and its gradient
/// (bounds-checked by the caller, sizes by [`check_sizes`]).
fn attention_delta(
    dev: &Arc<CudaDevice>,
    spec: &AttentionBackwardSpec,
    dtype: DType,
    (out, grad_out): (DevOperand, DevOperand),
    delta: &DeviceMemory,
) -> Result<()> {
    let variant = AttentionDeltaKernel::choose(dtype)?;
    let rows = spec.batch_count() * spec.l;
    if rows.div_ceil(AttentionDeltaKernel::ROWS_PER_BLOCK) > i32::MAX as usize {
        return Err(Error::unsupported(format!("attention backward on CUDA with {rows} query rows")));
    }
    let grid = AttentionDeltaKernel::grid(rows);
    let f = kernel(dev, variant.name(), || variant.source(), 0)?.func;
    let mut params = delta_params(spec);
    let mut ptrs = [out.ptr, grad_out.ptr, delta.ptr()];
    let mut args: Vec<*mut c_void> = ptrs.iter_mut().map(|p| (p as *mut u64).cast()).collect();
    args.push((&mut params as *mut AttnDeltaParams).cast());
    dev.bind()?;
    // SAFETY: the arguments match the kernel's signature (three device pointers and the
    // parameter struct, laid out as in C) and live until the call returns; the views it reads
    // were bounds-checked, and `delta` holds a float per query row.
    unsafe { drv::launch_kernel(f, grid, (variant.block(), 1, 1), 0, dev.cu_stream(), &mut args) }
        .map_err(|e| driver_error(&format!("cuLaunchKernel({})", variant.name()), e))
}

/// Enqueues the attention backward call `spec` (operands and gradients of `dtype`): through
/// cuDNN where it serves the call (its graph computes delta itself), else the delta kernel,
/// then the backward template.
pub fn attention_backward(
    dev: &Arc<CudaDevice>,
    spec: &AttentionBackwardSpec,
    dtype: DType,
    bufs: DevBackward,
) -> Result<()> {
    let size = dtype.size_bytes();
    let len = |b: &Option<DevOperand>| b.map(|b| b.bytes / size);
    spec.check(
        [bufs.q, bufs.k, bufs.v, bufs.grad_out, bufs.out].map(|b| b.bytes / size),
        [len(&bufs.dq), len(&bufs.dk), len(&bufs.dv)],
        bufs.lse.bytes / 4,
    )?;
    spec.check_mask(bufs.mask.map(|(m, kind)| m.bytes / if kind == MaskKind::Bool { 1 } else { size }))?;
    let count = spec.batch_count();
    if count * spec.l * spec.s * spec.d == 0 {
        return Ok(());
    }
    let operands = [bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, bufs.grad_out.ptr, bufs.out.ptr];
    if super::cudnn_sdpa::backward(dev, spec, dtype, operands, bufs.lse.ptr, [bufs.dq, bufs.dk, bufs.dv])? {
        return Ok(());
    }
    let dkv = spec.dk.is_some() || spec.dv.is_some();
    let mut variant = AttentionBackwardKernel::choose(dtype, spec.d, dev.target())?;
    let grads = [(&spec.dq, bufs.dq), (&spec.dk, bufs.dk), (&spec.dv, bufs.dv)];
    if grads.iter().any(|(view, buf)| matches!((view, buf), (Some(v), Some(b)) if !writable(v, b.ptr, spec.d))) {
        variant = variant.simple(dtype);
    }
    // With dS stored, the first launch has the dK, dV blocks only and a second computes dQ.
    let stores_ds = variant.stores_ds(count, spec.l, spec.s, spec.dq.is_some(), dkv, bufs.mask.is_some());
    let (grid, key_blocks) = backward_grid(count, spec.l, spec.s, spec.dq.is_some() && !stores_ds, dkv);
    check_sizes("attention backward", &spec.batch, spec.l, spec.s, grid.1.max(spec.l.div_ceil(64) as u32) as usize)?;
    let mma = matches!(variant, AttentionBackwardKernel::Mma { .. });
    let delta = DeviceMemory::alloc(dev, count * spec.l * 4)?;
    attention_delta(dev, spec, dtype, (bufs.out, bufs.grad_out), &delta)?;
    let mut temps: Vec<DeviceMemory> = Vec::new();
    let views = [
        (&spec.q, bufs.q, spec.l),
        (&spec.k, bufs.k, spec.s),
        (&spec.v, bufs.v, spec.s),
        (&spec.grad_out, bufs.grad_out, spec.l),
    ];
    let prepared = prepare(dev, (&spec.batch, spec.d, size), &views, mma, &mut temps)?;
    let views = [&prepared[0].0, &prepared[1].0, &prepared[2].0, &prepared[3].0];
    let mut params = backward_params(spec, views, key_blocks, bufs.mask.map(|(_, kind)| kind));
    let shared = variant.shared_bytes();
    let entry = variant.entry(bufs.mask.is_some());
    let f = kernel(dev, entry.clone(), || variant.source(), shared)?.func;
    let ds = match stores_ds {
        true => Some(DeviceMemory::alloc(dev, AttentionBackwardKernel::ds_bytes(count, spec.l, spec.s))?),
        false => None,
    };
    let mut ptrs: [u64; 11] = [
        prepared[0].1,
        prepared[1].1,
        prepared[2].1,
        prepared[3].1,
        bufs.lse.ptr,
        delta.ptr(),
        bufs.dq.map_or(0, |b| b.ptr),
        bufs.dk.map_or(0, |b| b.ptr),
        bufs.dv.map_or(0, |b| b.ptr),
        bufs.mask.map_or(0, |(m, _)| m.ptr),
        ds.as_ref().map_or(0, |ds| ds.ptr()),
    ];
    let mut args: Vec<*mut c_void> = ptrs.iter_mut().map(|p| (p as *mut u64).cast()).collect();
    args.push((&mut params as *mut AttnBwdParams).cast());
    dev.bind()?;
    // SAFETY: the arguments match the kernel's signature (eleven device pointers, the unwanted
    // gradients', an absent mask's and an unstored dS's null, and the parameter struct, laid
    // out as in C) and live until the call returns; every element the kernel touches was
    // bounds-checked above (delta: the temporary the delta kernel wrote before it on the
    // stream; ds: `[count, s, l]` half elements); the kernel was allowed `shared` bytes of
    // dynamic shared memory; the temporaries go back to the stream-ordered cache after the
    // launches are enqueued.
    unsafe { drv::launch_kernel(f, grid, (variant.block(), 1, 1), shared, dev.cu_stream(), &mut args) }
        .map_err(|e| driver_error(&format!("cuLaunchKernel({entry})"), e))?;
    if let (Some(ds), Some(dq)) = (&ds, bufs.dq) {
        let entry = variant.dq_stored_entry();
        let shared = variant.dq_stored_shared_bytes();
        let f = kernel(dev, entry.clone(), || variant.source(), shared)?.func;
        let grid = (count as u32, spec.l.div_ceil(64) as u32, 1);
        let mut ptrs: [u64; 3] = [prepared[1].1, ds.ptr(), dq.ptr];
        let mut args: Vec<*mut c_void> = ptrs.iter_mut().map(|p| (p as *mut u64).cast()).collect();
        args.push((&mut params as *mut AttnBwdParams).cast());
        // SAFETY: as above: three device pointers (k as the first launch read it, the dS it
        // wrote before this launch on the stream, dq) and the same parameter struct.
        unsafe { drv::launch_kernel(f, grid, (variant.block(), 1, 1), shared, dev.cu_stream(), &mut args) }
            .map_err(|e| driver_error(&format!("cuLaunchKernel({entry})"), e))?;
    }
    drop(temps);
    drop(delta);
    drop(ds);
    Ok(())
}

#[cfg(test)]
#[path = "attention_emulation.rs"]
mod emulation;
