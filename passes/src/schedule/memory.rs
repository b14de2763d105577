//! The memory plan: storage slots for temporaries, shared when lives do not overlap.
//!
//! Time is the kernel launch index. A stored temporary (a buffer some kernel stores and a later
//! kernel reads, that is neither a graph input nor a graph output) lives from the kernel that
//! writes it to the last kernel that reads it. Temporaries are placed in order of their first
//! kernel; each takes a slot whose last occupant died in an *earlier* kernel, preferring a slot
//! of exactly its size, then the smallest slot it fits in, else a new slot. A kernel may read a
//! slot and overwrite it only *in place*: a pointwise kernel that stores one buffer may take the
//! slot of a temporary of its size that dies in it, when it reads that temporary only at the
//! element it writes (each thread then reads an element before it writes it, and no other
//! thread touches it; Inductor's in-place reuse). Outputs live from their kernel to the end;
//! inputs are the caller's. `peak_bytes` is the most, over kernels, of the live outputs plus the
//! slots in use.

use super::donate::reads_only_where_written;
use coil_ir::kernel::{FusedKernel, MemoryPlan};
use coil_ir::loops::{BufferId, LoopProgram};

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
    let mut temps: Vec<usize> = (0..nb).filter(|&b| temporary(b)).collect();
    temps.sort_by_key(|&b| (def[b], b));

    let mut slots: Vec<usize> = Vec::new();
    let mut free_after: Vec<usize> = Vec::new();
    // The temporary that last took each slot.
    let mut occupant: Vec<usize> = Vec::new();
    let mut slot_of = vec![None; nb];
    for &t in &temps {
        let (start, need) = (def[t].expect("stored"), bytes(t));
        let in_place = (0..slots.len()).find(|&s| {
            let u = occupant[s];
            free_after[s] == start
                && last_use[u] == start
                && slots[s] == need
                && bytes(u) == need
                && p.buffers[u].meta.dtype.size_bytes() == p.buffers[t].meta.dtype.size_bytes()
                && overwrites_in_place(p, &kernels[start], BufferId(u), BufferId(t))
        });
        let free = |s: &usize| free_after[*s] < start;
        let exact = in_place.or_else(|| (0..slots.len()).filter(free).find(|&s| slots[s] == need));
        let fit = (0..slots.len()).filter(free).filter(|&s| slots[s] >= need).min_by_key(|&s| (slots[s], s));
        let s = exact.or(fit).unwrap_or_else(|| {
            slots.push(need);
            free_after.push(0);
            occupant.push(t);
            slots.len() - 1
        });
        slot_of[t] = Some(s);
        occupant[s] = t;
        free_after[s] = last_use[t].max(start);
    }

    let mut outputs: Vec<usize> = p.outputs.iter().map(|b| b.0).filter(|&b| def[b].is_some()).collect();
    outputs.sort_unstable();
    outputs.dedup();
    let mut peak = 0;
    for k in 0..kernels.len() {
        let out: usize = outputs.iter().filter(|&&b| def[b] <= Some(k)).map(|&b| bytes(b)).sum();
        let mut live: Vec<usize> =
            temps.iter().filter(|&&t| def[t] <= Some(k) && k <= last_use[t]).map(|&t| slot_of[t].unwrap()).collect();
        live.sort_unstable();
        live.dedup();
        peak = peak.max(out + live.iter().map(|&s| slots[s]).sum::<usize>());
    }
    MemoryPlan { slots, slot_of, peak_bytes: peak, ..Default::default() }
}

/// Whether `kernel` may write `t` over `u`: a pointwise kernel storing only `t`, reading `u`
/// only through plain loads at the index it writes `t` at.
fn overwrites_in_place(p: &LoopProgram, kernel: &FusedKernel, u: BufferId, t: BufferId) -> bool {
    kernel.kind == coil_ir::kernel::KernelKind::Pointwise
        && kernel.stores == [t]
        && reads_only_where_written(p, kernel, u, t)
}
