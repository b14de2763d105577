//! Where each buffer of a compiled graph lives during a run, and the checks made before any
//! compile, shared by the CPU and CUDA backends: inputs are the caller's, outputs fresh,
//! temporaries in memory-plan slots; kernel status words become errors.

use coil_ir::kernel::Schedule;
use coil_ir::loops::{BufferId, ExternCall, LoopProgram};
use coil_ir::{Error, Result};

/// Where a buffer's bytes are during a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Storage {
    /// The caller's input `k` (read only).
    Input(usize),
    /// A fresh allocation, returned to the caller.
    Output,
    /// A temporary in slot `s`.
    Slot(usize),
    /// Never in memory (lives in registers inside a fused kernel).
    Unused,
}

/// Checks an extern node's operands against its call (ids in range, dtypes agreeing).
pub(crate) fn check_extern(
    p: &LoopProgram,
    call: &ExternCall,
    inputs: &[BufferId],
    out: BufferId,
) -> std::result::Result<(), String> {
    let n = p.buffers.len();
    if let Some(b) = inputs.iter().chain([&out]).find(|b| b.0 >= n) {
        return Err(format!("no buffer {}", b.0));
    }
    if let ExternCall::Bmm { a, b, bias, .. } = call {
        for buffer in [a.buffer, b.buffer].into_iter().chain(bias.as_ref().map(|b| b.buffer)) {
            // Only the node's inputs get memory: an operand outside them would be unbacked.
            if !inputs.contains(&buffer) || p.buffer(buffer).meta.dtype != p.buffer(out).meta.dtype {
                return Err(format!("bmm operand buffer {} is not a node input of the output's dtype", buffer.0));
            }
        }
    }
    Ok(())
}

/// Decides where each buffer lives: inputs are the caller's, outputs fresh, the other buffers
/// a launch touches in their memory-plan slot (or an extra slot of their own when the plan left
/// them out). Returns the storage per buffer and the byte size per slot.
pub(crate) fn plan_storage(
    p: &LoopProgram,
    schedule: &Schedule,
    used: &[bool],
) -> std::result::Result<(Vec<Storage>, Vec<usize>), String> {
    let plan = &schedule.memory;
    let mut slot_bytes = plan.slots.clone();
    let mut storage = vec![Storage::Unused; p.buffers.len()];
    for (k, &b) in p.inputs.iter().enumerate() {
        storage[b.0] = Storage::Input(k);
    }
    for &b in &p.outputs {
        if storage[b.0] == Storage::Unused {
            storage[b.0] = Storage::Output;
        }
    }
    for (i, buf) in p.buffers.iter().enumerate() {
        if storage[i] != Storage::Unused || !used[i] {
            continue;
        }
        let need = buf.meta.nbytes();
        storage[i] = Storage::Slot(match plan.slot_of.get(i).copied().flatten() {
            Some(s) if s < slot_bytes.len() && slot_bytes[s] >= need => s,
            Some(s) => return Err(format!("{} ({need} bytes) does not fit memory slot {s}", buf.name)),
            None => {
                slot_bytes.push(need);
                slot_bytes.len() - 1
            }
        });
    }
    Ok((storage, slot_bytes))
}

/// Turns a kernel's status words into an error (see `docs/compiler.md`), as the CPU backend.
pub(crate) fn check_status(kernel: &str, status: &[i64]) -> Result<()> {
    let e = match status[0] {
        0 => return Ok(()),
        1 => Error::value(format!("index {} is out of bounds for dim of size {}", status[1], status[2])),
        2 => Error::value("Integers to negative integer powers are not allowed."),
        3 => Error::value("ZeroDivisionError: integer division by zero"),
        s => Error::runtime(format!("unknown status {s} ({}, {}, {})", status[1], status[2], status[3])),
    };
    Err(e.in_op(kernel, vec![]))
}
