//! Work a graph's first run would wait for, started when the graph is built: the cuDNN plans
//! of its attention calls and the template units its fallback calls launch (NVRTC). On the
//! H100 machine a cold GPT-2 training step spent about 2 s of its first run making the two
//! attention plans and 1 s compiling the scatter and argsort units, one after another on the
//! run's thread; made on two threads of their own while the graph's kernels compile and its
//! first run starts, they are ready or nearly so when the run reaches them.
//!
//! Both meet the run's own requests in the same tables (`cudnn_sdpa`'s plans, the device's
//! template modules), whose locks are held while an entry is made: a run that gets there
//! first, or finds the work under way, waits for the one result. Failures are left for the run
//! to make and report. Plans and units are those of buffers aligned as the allocator aligns
//! them; a run on other addresses makes its own.

use super::device::CudaDevice;
use super::{cudnn_sdpa, fallback, sort};
use crate::cpu::attention::AttentionSpec;
use crate::cpu::attention_backward::AttentionBackwardSpec;
use coil_ir::loops::{ExternCall, LoopKind, LoopProgram};
use coil_ir::{DType, Op};
use std::sync::Arc;

/// A cuDNN attention plan a run will ask for.
enum PlanAhead {
    Forward(AttentionSpec, DType, bool),
    Backward(AttentionBackwardSpec, DType),
}

/// Starts making, on background threads, the attention plans and template units `program`'s
/// extern calls will need on `device`. Returns at once.
pub(super) fn start(device: &Arc<CudaDevice>, program: &LoopProgram) {
    let (plans, units) = needs(program);
    // The threads work under the caller's configuration (whether cuDNN serves attention, the
    // cache directory), as the run will.
    let config = coil_ir::config::current();
    if !plans.is_empty() {
        let (dev, config) = (device.clone(), config.clone());
        std::thread::spawn(move || {
            coil_ir::config::with_config(config, || {
                if dev.bind().is_ok() {
                    for p in plans {
                        match p {
                            PlanAhead::Forward(spec, dtype, lse) => cudnn_sdpa::plan_forward(&dev, &spec, dtype, lse),
                            PlanAhead::Backward(spec, dtype) => cudnn_sdpa::plan_backward(&dev, &spec, dtype),
                        };
                    }
                }
            })
        });
    }
    if !units.is_empty() {
        let dev = device.clone();
        std::thread::spawn(move || {
            coil_ir::config::with_config(config, || {
                for (source, kernel) in units {
                    let _ = super::compiler::template_module(&dev, source, &[&kernel]);
                }
            })
        });
    }
}

/// The attention plans and template units of `program`'s extern calls, in program order, each
/// once.
fn needs(p: &LoopProgram) -> (Vec<PlanAhead>, Vec<fallback::Unit>) {
    let (mut plans, mut units) = (Vec::new(), Vec::<fallback::Unit>::new());
    for node in &p.nodes {
        let LoopKind::Extern { call, inputs: operands } = &node.kind else { continue };
        let meta = |k: usize| operands.get(k).map(|&b| &p.buffer(b).meta);
        let out = Some(p.buffer(node.output).meta.dtype);
        let found: Vec<fallback::Unit> = match call {
            // Dropout never runs on cuDNN: no plan for it.
            ExternCall::Attention(a) if a.mask.is_none() && a.mask_rule.is_none() && a.dropout.is_none() => {
                if let (Some(spec), Some(dtype)) = (AttentionSpec::from_call(call), out) {
                    plans.push(PlanAhead::Forward(spec, dtype, a.lse.is_some()));
                }
                vec![]
            }
            ExternCall::AttentionBackward(b) if b.dropout.is_none() => {
                if let Some(spec) = AttentionBackwardSpec::from_call(call) {
                    plans.push(PlanAhead::Backward(spec, p.buffer(b.q.buffer).meta.dtype));
                }
                vec![]
            }
            ExternCall::Fallback { op: Op::Scatter { dim, reduce } } => match (meta(0), meta(1), meta(2)) {
                (Some(x), Some(i), Some(s)) => {
                    let repeats = coil_passes::lower::repeats_along(p, operands[1], dim + 1);
                    fallback::scatter_units(x, i, s, *dim, *reduce, repeats)
                }
                _ => vec![],
            },
            ExternCall::Fallback { op: Op::Cumsum { .. } } => meta(0).map(fallback::cumsum_units).unwrap_or_default(),
            ExternCall::Fallback { op: Op::Argsort { dim, .. } } => match meta(0) {
                Some(x) if sort::supports_argsort(x, *dim) => vec![sort::argsort_unit(x.dtype)],
                _ => vec![],
            },
            _ => vec![],
        };
        for u in found {
            if !units.contains(&u) {
                units.push(u);
            }
        }
    }
    (plans, units)
}
