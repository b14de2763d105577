//! The memory plan: storage slots for temporaries, placed in one arena by their lives.
//!
//! Time is the kernel launch index. A stored temporary (a buffer some kernel stores and a later
//! kernel reads, that is neither a graph input nor a graph output) lives from the kernel that
//! writes it to the last kernel that reads it. Each temporary takes a slot of its own, except
//! that a kernel may overwrite a slot *in place*: a pointwise kernel that stores one buffer
//! takes the slot of a temporary of its size that dies in it, when it reads that temporary
//! only at the element it writes (each thread then reads an element before it writes it, and
//! no other thread touches it; Inductor's in-place reuse). A slot thus lives over one interval
//! of launches, and dead temporaries' memory is shared by address in the arena (below), not by
//! handing a dead slot to the next temporary that fits: a slot reused so would live from its
//! first occupant to its last with the bytes of its largest, and a network whose activations
//! shrink (ResNet) would strand its first stages' large slots in small later temporaries
//! (ResNet-50's forward at batch 64: 608 MiB of arena for 221 MiB of live temporaries).
//!
//! A scatter that runs as an extern call (`scatter_add` of an embedding's gradient) starts its
//! output as a copy of its base and writes its elements over it; when the base is a temporary
//! that dies there, the scatter runs on the base's memory instead and nothing is copied: a
//! temporary output takes the base's slot (the in-place rule), and a graph output's buffer
//! holds the base from the base's producer on (`MemoryPlan::in_outputs`; the base gets no
//! slot). A base that is a graph input, an output, or read by a later kernel is copied.
//!
//! The slots then share one allocation ([`MemoryPlan::arena`]): a slot in use only while
//! another is not takes the same addresses, so a run holds about `peak_bytes` of temporaries
//! rather than the sum of its slots.
//!
//! Outputs live from their kernel (or their base's, when it is kept in them) to the end;
//! inputs are the caller's. `peak_bytes` is the most, over kernels, of the live outputs plus
//! the slots in use.

use super::donate::{reads_only_where_written, scatters_over};
use coil_ir::kernel::{FusedKernel, InOutput, MemoryPlan};
use coil_ir::loops::{BufferId, ExternCall, LoopKind, LoopProgram};
use coil_ir::Op;

pub(super) fn plan(p: &LoopProgram, kernels: &[FusedKernel]) -> MemoryPlan {
    let nb = p.buffers.len();
    let mut def = vec![None; nb];
    let mut last_use = vec![0usize; nb];
    for (k, kernel) in kernels.iter().enumerate() {
        for &b in &kernel.stores {
            def[b.0] = Some(k);
        }
    }
    for (k, kernel) in kernels.iter().enumerate() {
        for &n in &kernel.nodes {
            for b in p.nodes[n].reads() {
                last_use[b.0] = last_use[b.0].max(k);
            }
        }
    }
    let bytes = |b: usize| p.buffers[b].meta.nbytes();
    let temporary = |b: usize| {
        let id = coil_ir::loops::BufferId(b);
        def[b].is_some() && !p.inputs.contains(&id) && !p.outputs.contains(&id)
    };
    let in_outputs = bases_in_outputs(p, kernels, &last_use, &temporary);
    let in_output = |b: usize| in_outputs.iter().any(|x| x.temporary.0 == b);
    let mut temps: Vec<usize> = (0..nb).filter(|&b| temporary(b) && !in_output(b)).collect();
    temps.sort_by_key(|&b| (def[b], b));

    let mut slots: Vec<usize> = Vec::new();
    let mut slot_lives: Vec<(usize, usize)> = Vec::new();
    let mut free_after: Vec<usize> = Vec::new();
    // The temporary that last took each slot.
    let mut occupant: Vec<usize> = Vec::new();
    let mut slot_of = vec![None; nb];
    for &t in &temps {
        let (start, need) = (def[t].expect("stored"), bytes(t));
        // The slots of the temporaries the kernel reads (the candidates to write over).
        let read: Vec<usize> = (kernels[start].nodes.iter())
            .flat_map(|&n| p.nodes[n].reads())
            .filter_map(|u| slot_of[u.0].filter(|&s| occupant[s] == u.0))
            .collect();
        let in_place = read.into_iter().find(|&s| {
            let u = occupant[s];
            free_after[s] == start
                && last_use[u] == start
                && slots[s] == need
                && bytes(u) == need
                && p.buffers[u].meta.dtype.size_bytes() == p.buffers[t].meta.dtype.size_bytes()
                && overwrites_in_place(p, &kernels[start], BufferId(u), BufferId(t))
        });
        // Otherwise a slot of its own (see the module doc: the arena shares addresses).
        let s = in_place.unwrap_or_else(|| {
            slots.push(need);
            slot_lives.push((start, start));
            free_after.push(0);
            occupant.push(t);
            slots.len() - 1
        });
        slot_of[t] = Some(s);
        occupant[s] = t;
        free_after[s] = last_use[t].max(start);
        slot_lives[s].1 = slot_lives[s].1.max(free_after[s]);
    }

    let mut outputs: Vec<usize> = p.outputs.iter().map(|b| b.0).filter(|&b| def[b].is_some()).collect();
    outputs.sort_unstable();
    outputs.dedup();
    // An output's memory is in use from its first write: its own, or its base's.
    let first_write = |b: usize| {
        let base = in_outputs.iter().find(|x| x.output.0 == b).and_then(|x| def[x.temporary.0]);
        base.into_iter().chain(def[b]).min()
    };
    let mut peak = 0;
    for k in 0..kernels.len() {
        let out: usize = outputs.iter().filter(|&&b| first_write(b) <= Some(k)).map(|&b| bytes(b)).sum();
        let mut live: Vec<usize> =
            temps.iter().filter(|&&t| def[t] <= Some(k) && k <= last_use[t]).map(|&t| slot_of[t].unwrap()).collect();
        live.sort_unstable();
        live.dedup();
        peak = peak.max(out + live.iter().map(|&s| slots[s]).sum::<usize>());
    }
    MemoryPlan { slots, slot_lives, slot_of, peak_bytes: peak, in_outputs, ..Default::default() }
}

/// Whether `kernel` may write `t` over `u`: a pointwise kernel storing only `t`, reading `u`
/// only through plain loads at the index it writes `t` at; or an extern scatter of base `u`
/// into `t` that reads `u` as nothing else.
fn overwrites_in_place(p: &LoopProgram, kernel: &FusedKernel, u: BufferId, t: BufferId) -> bool {
    let pointwise = kernel.kind == coil_ir::kernel::KernelKind::Pointwise
        && kernel.stores == [t]
        && reads_only_where_written(p, kernel, u, t);
    pointwise || scatters_over(p, kernel, u, t)
}

/// The extern scatters whose output is a graph output and whose base is a temporary
/// (`temporary`) no later kernel reads (`last_use`): the bases kept in those outputs.
fn bases_in_outputs(
    p: &LoopProgram,
    kernels: &[FusedKernel],
    last_use: &[usize],
    temporary: &dyn Fn(usize) -> bool,
) -> Vec<InOutput> {
    let mut found = Vec::new();
    for (k, kernel) in kernels.iter().enumerate() {
        let [n] = kernel.nodes[..] else { continue };
        let node = &p.nodes[n];
        let LoopKind::Extern { call: ExternCall::Fallback { op: Op::Scatter { .. } }, inputs } = &node.kind else {
            continue;
        };
        let (u, t) = (inputs[0], node.output);
        if temporary(u.0)
            && last_use[u.0] == k
            && p.outputs.contains(&t)
            && !p.inputs.contains(&t)
            && p.buffer(u).meta == p.buffer(t).meta
            && scatters_over(p, kernel, u, t)
        {
            found.push(InOutput { temporary: u, output: t });
        }
    }
    found
}
