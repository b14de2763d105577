//! The text of `ir_post_fusion.txt`.

use coil_ir::kernel::Schedule;
use coil_ir::loops::{ExternCall, LoopKind, LoopProgram};
use std::fmt::Write;

/// Prints a schedule: per kernel (in launch order) its name, kind, `xnumel` / `rnumel`, member
/// nodes (buffer, what it is, origins) and stores; then every refused fusion with its reason;
/// then the memory plan (slots and their buffers, outputs, scatter bases kept in outputs,
/// donated inputs) and the peak bytes.
/// Deterministic.
pub fn print_schedule(program: &LoopProgram, schedule: &Schedule) -> String {
    let mut s = String::new();
    let name = |b: coil_ir::loops::BufferId| program.buffer(b).name.clone();
    for (i, k) in schedule.kernels.iter().enumerate() {
        let mut dims = format!("xnumel={}", k.xnumel);
        if let Some(r) = &k.rnumel {
            let _ = write!(dims, " rnumel={r}");
        }
        let _ = writeln!(s, "kernel {i}: {} ({}) {dims}", k.name, k.kind.name());
        for &n in &k.nodes {
            let node = &program.nodes[n];
            let what = match &node.kind {
                LoopKind::Pointwise { .. } => "pointwise".to_string(),
                LoopKind::Reduction { op, .. } => format!("reduction {}", op.name()),
                LoopKind::Extern { call: ExternCall::Bmm { .. }, .. } => "extern bmm".to_string(),
                LoopKind::Extern { call: ExternCall::Attention(_), .. } => "extern attention".to_string(),
                LoopKind::Extern { call: ExternCall::AttentionBackward(_), .. } => {
                    "extern attention_backward".to_string()
                }
                LoopKind::Extern { call: ExternCall::Fallback { op }, .. } => format!("extern fallback {op}"),
                LoopKind::Extern { call: ExternCall::Conv(call), .. } => format!("extern {}", call.form.name()),
            };
            let written: Vec<String> =
                node.writes().iter().map(|&b| format!("{}: {}", name(b), program.buffer(b).meta)).collect();
            let _ = writeln!(s, "  {} = {what} origins=[{}]", written.join(", "), node.origins.join(", "));
        }
        let stores: Vec<String> = k.stores.iter().map(|&b| name(b)).collect();
        let _ = writeln!(s, "  stores: [{}]", stores.join(", "));
    }
    let _ = writeln!(s, "refused fusions:");
    if schedule.refusals.is_empty() {
        let _ = writeln!(s, "  (none)");
    }
    for r in &schedule.refusals {
        let _ = writeln!(s, "  {} -> {}: {}", r.producer, r.consumer, r.reason);
    }
    let plan = &schedule.memory;
    let _ = writeln!(s, "memory plan:");
    let arena = plan.arena(&plan.slots);
    for (slot, bytes) in plan.slots.iter().enumerate() {
        let users: Vec<String> = (0..program.buffers.len())
            .filter(|&b| plan.slot_of.get(b) == Some(&Some(slot)))
            .map(|b| program.buffers[b].name.clone())
            .collect();
        let _ = writeln!(s, "  slot {slot}: {bytes} bytes at {} [{}]", arena.offsets[slot], users.join(", "));
    }
    if !plan.slots.is_empty() {
        let _ = writeln!(s, "  arena: {} bytes", arena.bytes);
    }
    let mut outputs: Vec<String> = Vec::new();
    for &b in &program.outputs {
        let text = format!("{} ({} bytes)", name(b), program.buffer(b).meta.nbytes());
        if !program.inputs.contains(&b) && !outputs.contains(&text) {
            outputs.push(text);
        }
    }
    let _ = writeln!(s, "  outputs: [{}]", outputs.join(", "));
    for x in &plan.in_outputs {
        let (b, o) = (name(x.temporary), name(x.output));
        let _ = writeln!(s, "  in place: {b} kept in output {o} (the base of its scatter)");
    }
    for d in &plan.donated {
        let (o, i) = (name(program.outputs[d.output]), name(program.inputs[d.input]));
        let _ = writeln!(s, "  in place: output {} ({o}) written over input {} ({i})", d.output, d.input);
    }
    for (d, why) in &plan.declined {
        let _ = writeln!(s, "  not in place: output {} over input {}: {why}", d.output, d.input);
    }
    let _ = writeln!(s, "  peak bytes: {}", plan.peak_bytes);
    s
}
