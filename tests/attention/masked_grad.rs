//! Gradients through masked attention, shared by `tests/attention/main.rs` (CPU) and
//! `tests/gpu.rs` (CUDA): `value_and_grad` of `sum(attention(q, k, v, mask) * w)` keeps masked
//! attention a template both ways: the loop program holds one forward and one backward
//! attention call, each reading the mask in place (` mask=[..]`, broadcast dims stride 0), with
//! any number of query rows, and no buffer of the scores' size. Bool and added masks, masks
//! broadcast over the batch or the heads, rows that keep no key (whose gradients are 0, no
//! NaN). Where the gradient of an added mask is wanted too (a learned bias), the backward is
//! the decomposition's (no backward call). The loss and every gradient agree with the
//! interpreter (relative RMS error 1e-5 for f32, 2e-2 for f16 / bf16).

use super::masked::{masked_inputs, MaskForm, MaskedCase};
use super::{normals, rel_error, tensor};
use coil::{Backend, DType, Device, Tensor};
use std::sync::Arc;

/// One case: the masked case, and whether the mask's gradient is wanted too.
pub struct MaskedGradCase {
    pub case: MaskedCase,
    pub mask_grad: bool,
}

/// The cases every device runs: more rows than a forward-only graph keeps masked (40, 70),
/// tails of the kernels' 64-row blocks, f32 / bf16 / f16, a decode-like row.
pub fn masked_grad_cases() -> Vec<MaskedGradCase> {
    let c = |dtype, batch: &[usize], (l, s, d), mask, mask_grad| MaskedGradCase {
        case: MaskedCase { dtype, batch: batch.to_vec(), l, s, d, mask },
        mask_grad,
    };
    vec![
        // `[B, 1, L, S]` bool over the heads, row 1 keeps no key.
        c(DType::F32, &[2, 2], (40, 50, 16), MaskForm::PerBatch, false),
        c(DType::BF16, &[2, 2], (70, 90, 64), MaskForm::PerBatch, false),
        // `[L, S]` added over the batch, -inf in places, row 2 all -inf.
        c(DType::F32, &[3], (20, 33, 16), MaskForm::Added, false),
        c(DType::F16, &[2], (33, 70, 40), MaskForm::Added, false),
        // A learned bias: the mask's gradient too, through the decomposition.
        c(DType::F32, &[3], (20, 33, 16), MaskForm::Added, true),
        // One row against a prefix of the keys (`[1, S]` over batch and heads).
        c(DType::F32, &[2, 2], (1, 150, 64), MaskForm::Prefix(20), false),
    ]
}

/// The values of a run, and what the compile made of them (when compiled).
type Gradients = (Vec<Vec<f64>>, Option<Arc<coil::Compiled>>);

/// The loss and the gradients (q, k, v, and the mask's when wanted) of one case on `device`
/// (backend as set), and what the compile made of them where compiled.
fn gradients(g: &MaskedGradCase, device: Device) -> coil::Result<Gradients> {
    let case = &g.case;
    let a = masked_inputs(case, device)?;
    let batch: usize = case.batch.iter().product();
    let out: Vec<usize> = case.batch.iter().copied().chain([case.l, case.d]).collect();
    let w = tensor(&normals(14, batch * case.l * case.d), &out, DType::F32, device)?;
    let y = coil::scaled_dot_product_attention(&a[0], &a[1], &a[2], Some(&a[3]), false, None)?;
    let loss = y.to_dtype(DType::F32)?.mul(&w)?.sum_all()?;
    let wrt: Vec<&Tensor> = if g.mask_grad { a.iter().collect() } else { a[..3].iter().collect() };
    let (loss, grads) = coil::value_and_grad(&loss, &wrt)?;
    let outputs: Vec<Tensor> = std::iter::once(loss).chain(grads).collect();
    let outputs: Vec<&Tensor> = outputs.iter().collect();
    let compiled = match coil::backend() {
        Backend::Compiled => Some(coil::inspect(&outputs)?),
        Backend::Interpreter => None,
    };
    coil::realize(&outputs)?;
    let values = outputs.iter().map(|x| x.to_vec::<f64>()).collect::<coil::Result<_>>()?;
    Ok((values, compiled))
}

/// What is wrong with a compiled case's program, if anything.
fn program_problem(g: &MaskedGradCase, compiled: &coil::Compiled) -> Option<String> {
    let (case, ir) = (&g.case, &compiled.pre_fusion);
    let calls = |name: &str| ir.lines().filter(|l| l.contains(&format!("= extern {name} "))).collect::<Vec<_>>();
    let (forward, backward) = (calls("attention"), calls("attention_backward"));
    if g.mask_grad {
        // The learned bias's gradient needs the probabilities: the decomposition's backward.
        return (!backward.is_empty()).then(|| format!("a backward call where the mask's gradient is wanted:\n{ir}"));
    }
    if forward.len() != 1 || backward.len() != 1 {
        return Some(format!("{} forward and {} backward attention calls in\n{ir}", forward.len(), backward.len()));
    }
    if !forward[0].contains(" mask=[") || !backward[0].contains(" mask=[") {
        return Some(format!("a call without the mask in\n{ir}"));
    }
    let program = match &compiled.executable {
        coil::Executable::Cpu(g) => g.program(),
        coil::Executable::Cuda(g) => g.program(),
    };
    let scores = case.batch.iter().product::<usize>() * case.l * case.s;
    let full = program.buffers.iter().find(|b| b.meta.shape.ends_with(&[case.l, case.s]) && b.meta.numel() >= scores);
    full.map(|b| format!("buffer {} ({}) has the scores' size in\n{ir}", b.name, b.meta))
}

/// Runs one case compiled on `device` and on the interpreter; the error says what differs.
pub fn check_masked_grad(g: &MaskedGradCase, device: Device) -> std::result::Result<(), String> {
    let fail = |what: String| format!("grad {}{}: {what}", g.case.name(), if g.mask_grad { " (+mask)" } else { "" });
    coil::set_default_device(Device::Cpu);
    coil::set_backend(Backend::Interpreter);
    let (reference, _) = gradients(g, Device::Cpu).map_err(|e| fail(format!("interpreter: {e}")))?;
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    coil::set_default_device(device);
    let (got, compiled) = gradients(g, device).map_err(|e| fail(format!("compiled: {e}")))?;
    if let Some(problem) = program_problem(g, compiled.as_ref().expect("compiled")) {
        return Err(fail(problem));
    }
    let tolerance = if g.case.dtype == DType::F32 { 1e-5 } else { 2e-2 };
    for (i, (x, y)) in got.iter().zip(&reference).enumerate() {
        let err = rel_error(x, y);
        if x.len() != y.len() || err > tolerance {
            return Err(fail(format!(
                "output {i} (0: the loss, then the gradients) differs from the interpreter's by {err:.2e} (tolerance {tolerance:.0e})"
            )));
        }
    }
    Ok(())
}

/// Every masked gradient case on `device`; all failures reported at once.
pub fn check_masked_grad_all(device: Device) {
    let failures: Vec<String> = masked_grad_cases().iter().filter_map(|c| check_masked_grad(c, device).err()).collect();
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    coil::set_default_device(Device::Cpu);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
