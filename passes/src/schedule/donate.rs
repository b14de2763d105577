//! Donated inputs: graph outputs written in place over the buffers of graph inputs.
//!
//! A caller that will never read an input again (an optimizer's old parameters and moments)
//! may *donate* its buffer to an output of the same shape and dtype (JAX's `donate_argnums`,
//! XLA's input/output aliasing). [`donate`] accepts a request only when writing the output over
//! the input cannot change what any kernel reads:
//!
//! * the output is stored by a generated kernel (not an input passed through), and is no
//!   other output; or by a scatter (an extern call) whose base is the input: a KV cache
//!   written at a few positions, where only the scattered elements are written;
//! * a generated scatter ([`coil_ir::loops::ScatterStore`]: a KV cache written at run-time
//!   positions) writes only its elements over the input: its kernel may not load the input
//!   at all (the runtime copies the base into the output first when they differ);
//! * no kernel after that one reads the input, nor does a later node of that kernel;
//! * that kernel reads the input only through plain loads at the index it writes the output
//!   (each thread reads an element before it writes it, and no other thread touches it).
//!
//! Refused requests keep a fresh output buffer and say why (`MemoryPlan::declined`), so a
//! donation is only ever an optimization.

use super::legal::{kernel_index_map, write_index};
use coil_ir::kernel::{Donation, FusedKernel, KernelKind, Schedule};
use coil_ir::loops::{BufferId, ExternCall, LoopKind, LoopProgram, ScalarOp};
use coil_ir::Op;

/// Decides which of the requested donations the schedule can honour and records them in its
/// memory plan ([`coil_ir::kernel::MemoryPlan`]: accepted in `donated`, refused with a reason in
/// `declined`); the peak bytes no
/// longer count donated outputs.
///
/// ```
/// use coil_ir::kernel::Donation;
/// use coil_ir::{BinaryOp, DType, Graph, Op, TensorMeta};
/// // y = x * 2, written over x.
/// let mut g = Graph::new();
/// let x = g.input(TensorMeta::new(vec![8], DType::F32));
/// let two = g.leaf(Op::Full(2.0.into()), TensorMeta::new(vec![8], DType::F32), None);
/// let y = g.push(Op::Binary(BinaryOp::Mul), &[x, two], None).unwrap();
/// g.outputs.push(y);
/// let program = coil_passes::lower(&g).unwrap();
/// let mut schedule = coil_passes::schedule(&program);
/// coil_passes::donate(&program, &mut schedule, &[Donation { output: 0, input: 0 }]);
/// assert_eq!(schedule.memory.donor_of(0), Some(0));
/// assert_eq!(schedule.memory.peak_bytes, 0);
/// ```
pub fn donate(p: &LoopProgram, schedule: &mut Schedule, requests: &[Donation]) {
    let mut donated: Vec<Donation> = Vec::new();
    let mut declined = Vec::new();
    for &d in requests {
        match check(p, &schedule.kernels, d, &donated) {
            Ok(()) => donated.push(d),
            Err(why) => declined.push((d, why)),
        }
    }
    let saved: usize = donated.iter().map(|d| p.buffer(p.outputs[d.output]).meta.nbytes()).sum();
    let memory = &mut schedule.memory;
    memory.peak_bytes = memory.peak_bytes.saturating_sub(saved);
    memory.donated = donated;
    memory.declined = declined;
}

/// Why donation `d` cannot be honoured, if it cannot (`accepted` are the ones already taken).
fn check(p: &LoopProgram, kernels: &[FusedKernel], d: Donation, accepted: &[Donation]) -> Result<(), String> {
    let (Some(&out), Some(&input)) = (p.outputs.get(d.output), p.inputs.get(d.input)) else {
        return Err(format!("the graph has no output {} or no input {}", d.output, d.input));
    };
    if accepted.iter().any(|a| a.output == d.output || a.input == d.input) {
        return Err("the output or the input is already part of another donation".into());
    }
    if p.outputs.iter().filter(|&&o| o == out).count() > 1 || p.outputs.contains(&input) {
        return Err("the output is returned twice, or the input is itself an output".into());
    }
    let (o, i) = (p.buffer(out), p.buffer(input));
    if o.shape != i.shape || o.meta.dtype != i.meta.dtype {
        return Err(format!("the output is {} and the input {}", o.meta, i.meta));
    }
    let Some(writer) = kernels.iter().position(|k| k.stores.contains(&out)) else {
        return Err("the output is not written by a kernel (an input or a view of one)".into());
    };
    let kernel = &kernels[writer];
    if kernel.kind == KernelKind::Extern && !scatters_over(p, kernel, input, out) {
        return Err(format!("the output is written by an extern call ({})", kernel.name));
    }
    let reads = |k: &FusedKernel| k.nodes.iter().any(|&n| p.nodes[n].reads().contains(&input));
    if let Some(later) = kernels[writer + 1..].iter().find(|k| reads(k)) {
        return Err(format!("{} reads the input after {} writes the output", later.name, kernel.name));
    }
    if kernel.kind != KernelKind::Extern && reads(kernel) && !reads_only_where_written(p, kernel, input, out) {
        return Err(format!("{} reads the input at elements other than the one it writes", kernel.name));
    }
    Ok(())
}

/// Whether extern `kernel` is `t = scatter(u, index, src)` with neither `index` nor `src`
/// being `u`: written over `u`, the scatter leaves the other elements as they are and writes
/// the scattered ones (every backend's scatter copies its base only when the output is
/// elsewhere).
pub(super) fn scatters_over(p: &LoopProgram, kernel: &FusedKernel, u: BufferId, t: BufferId) -> bool {
    let [node] = kernel.nodes[..] else { return false };
    let node = &p.nodes[node];
    match &node.kind {
        LoopKind::Extern { call: ExternCall::Fallback { op: Op::Scatter { .. } }, inputs } => {
            node.output == t && inputs.first() == Some(&u) && inputs[1..].iter().all(|&b| b != u)
        }
        _ => false,
    }
}

/// Whether `kernel` may write `t` over `u`: it reads `u` only through plain loads at the index
/// it writes `t` (mapped into the kernel's index space), and no node after `t`'s writer reads
/// `u`. Then each element of `u` is read, within one pass over it, by the thread that writes
/// that element of `t`, before it writes it; a reduction's earlier passes end at a barrier
/// before the next pass begins. A scatter ([`coil_ir::loops::ScatterStore`]) writes at
/// data-dependent places: the kernel may not load `u` at all (its base `u` is not loaded:
/// written over it, the scatter keeps the other elements and writes its own).
pub(super) fn reads_only_where_written(p: &LoopProgram, kernel: &FusedKernel, u: BufferId, t: BufferId) -> bool {
    if kernel.kind == KernelKind::Extern || !kernel.stores.contains(&t) {
        return false;
    }
    let Some(at) = kernel.nodes.iter().position(|&n| p.nodes[n].output == t) else { return false };
    let writer = kernel.nodes[at];
    if p.nodes[writer].scatter().is_some() {
        return kernel.nodes.iter().all(|&n| match &p.nodes[n].kind {
            LoopKind::Pointwise { body, .. } | LoopKind::Reduction { body, .. } => !body.reads().contains(&u),
            LoopKind::Extern { .. } => false,
        });
    }
    let written = write_index(&p.nodes[writer], &kernel_index_map(p, kernel, writer));
    if kernel.nodes[at + 1..].iter().any(|&n| p.nodes[n].reads().contains(&u)) {
        return false;
    }
    kernel.nodes[..=at].iter().all(|&n| {
        let body = match &p.nodes[n].kind {
            LoopKind::Pointwise { body, .. } | LoopKind::Reduction { body, .. } => body,
            LoopKind::Extern { .. } => return false,
        };
        let map = kernel_index_map(p, kernel, n);
        body.values.iter().all(|v| match &v.op {
            ScalarOp::Load { buffer, index } if *buffer == u => index.substitute(&map) == written,
            ScalarOp::MaskedLoad { buffer, .. } | ScalarOp::IndirectLoad { buffer, .. } => *buffer != u,
            _ => true,
        })
    })
}
