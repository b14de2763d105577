//! Gradients through the attention templates, shared by `tests/attention/main.rs` (CPU) and
//! `tests/gpu.rs` (CUDA): `value_and_grad` of `sum(attention(..) * w)` keeps the attention a
//! template forward and differentiates it to the backward template. Each case runs three ways
//! on the same inputs:
//!
//! * compiled on the device, where the loop program must hold one forward and one backward
//!   attention call, no buffer of the `[.., L, S]` scores and no reduction for the backward's
//!   `delta` (the call computes it);
//! * on the interpreter (which decomposes the templates: the reference decomposition of
//!   `attention_logsumexp` and `attention_backward`);
//! * on the interpreter, written so that the matcher does not see attention (an additive mask):
//!   the decomposed path, differentiated primitive by primitive.
//!
//! All three must agree (relative RMS error per gradient: 1e-5 for f32; 2e-2 for f16 / bf16,
//! whose decomposed path rounds the products and probabilities to the dtype and whose CUDA
//! kernels round the probabilities and `dS` for the tensor cores).

use super::{inputs, normals, rel_error, tensor, Case, Form};
use coil::{Backend, DType, Device, Result, Tensor};

/// The gradient cases: causal and not, f32 / bf16 / f16, head dims 32 to 128, L and S not
/// multiples of 64 (the kernels' blocks), L > S and S > L, the GPT-2 forms.
pub fn grad_cases() -> Vec<Case> {
    let c =
        |form, dtype, batch: &[usize], l, s, d, causal| Case { form, dtype, batch: batch.to_vec(), l, s, d, causal };
    vec![
        c(Form::Gpt2, DType::BF16, &[2, 3], 130, 130, 64, true),
        c(Form::Gpt2, DType::F32, &[2, 2], 70, 70, 32, true),
        c(Form::SdpaHeads, DType::F16, &[1, 2], 70, 70, 32, false),
        c(Form::Sdpa, DType::BF16, &[2, 2], 50, 130, 64, false),
        c(Form::Sdpa, DType::F16, &[3], 129, 129, 128, true),
        c(Form::Sdpa, DType::F32, &[2, 3], 65, 20, 32, true),
        c(Form::Sdpa, DType::F32, &[2], 17, 90, 128, false),
        c(Form::Sdpa, DType::BF16, &[1, 2], 33, 33, 40, true),
    ]
}

/// `(q, k, v)` of the case's inputs: the three tensors, or the heads of the GPT-2 forms'
/// `[B, T, 3C]` projection.
fn heads(case: &Case, a: &[Tensor]) -> Result<(Tensor, Tensor, Tensor)> {
    if case.form == Form::Sdpa {
        return Ok((a[0].clone(), a[1].clone(), a[2].clone()));
    }
    let (b, t, h, d) = (case.batch[0] as i64, case.l as i64, case.batch[1] as i64, case.d as i64);
    let qkv = a[0].split(h as usize * case.d, 2)?;
    let heads = |p: &Tensor| p.view(&[b, t, h, d])?.transpose(1, 2);
    Ok((heads(&qkv[0])?, heads(&qkv[1])?, heads(&qkv[2])?))
}

/// The case's attention through the template: `program` of the forward cases.
fn templated(case: &Case, a: &[Tensor]) -> Result<Tensor> {
    super::program(case, a)
}

/// The same attention with its mask added (`scores + mask`, 0 or -inf): the matcher does not
/// recognise it, so it is decomposed, and so is its gradient.
fn decomposed(case: &Case, a: &[Tensor]) -> Result<Tensor> {
    let (q, k, v) = heads(case, a)?;
    let (l, s, d) = (case.l, case.s, case.d);
    let scores = q.matmul(&k.transpose(-2, -1)?)?.mul(1.0 / (d as f64).sqrt())?.to_dtype(DType::F32)?;
    let mask: Vec<f32> =
        (0..l * s).map(|i| if case.causal && i % s > i / s { f32::NEG_INFINITY } else { 0.0 }).collect();
    let mask = Tensor::from_vec(mask, &[l, s])?.to_device(q.device())?;
    let y = scores.add(&mask)?.softmax(-1)?.to_dtype(case.dtype)?.matmul(&v)?;
    if case.form == Form::Sdpa {
        return Ok(y);
    }
    let (b, t, c) = (case.batch[0] as i64, case.l as i64, (case.batch[1] * d) as i64);
    y.transpose(1, 2)?.contiguous().view(&[b, t, c])
}

/// The loss and the gradients as f64 vectors, and the compiled program when there is one.
type Gradients = (Vec<Vec<f64>>, Option<std::sync::Arc<coil::Compiled>>);

/// `sum(y * w)` in f32 for a fixed `w` of y's shape, and its gradients with respect to the
/// inputs, as f64 vectors (the loss first); the compiled program when it was compiled.
fn gradients(case: &Case, device: Device, program: fn(&Case, &[Tensor]) -> Result<Tensor>) -> Result<Gradients> {
    let a = inputs(case, device)?;
    let y = program(case, &a)?;
    let w = tensor(&normals(7, y.shape().iter().product()), y.shape(), DType::F32, device)?;
    let loss = y.to_dtype(DType::F32)?.mul(&w)?.sum_all()?;
    let (loss, grads) = coil::value_and_grad(&loss, &a.iter().collect::<Vec<_>>())?;
    let outputs: Vec<&Tensor> = std::iter::once(&loss).chain(&grads).collect();
    let compiled = match coil::backend() {
        Backend::Compiled => Some(coil::inspect(&outputs)?),
        Backend::Interpreter => None,
    };
    coil::realize(&outputs)?;
    let values = outputs.iter().map(|t| t.to_vec::<f64>()).collect::<Result<_>>()?;
    Ok((values, compiled))
}

/// What is wrong with the compiled program, if anything: it must make one attention call each
/// way, no buffer of the scores' shape and no reduction to the rows' `[*batch, L]` (the
/// backward call computes `delta = sum(grad_out * out, -1)` itself); with the GPT-2 forms' head
/// views, the backward call writes the gradients straight into the projection's (no kernel
/// pads and sums them).
fn program_problem(case: &Case, compiled: &coil::Compiled) -> Option<String> {
    let ir = &compiled.pre_fusion;
    let (forward, backward) =
        (ir.matches("extern attention ").count(), ir.matches("extern attention_backward").count());
    if forward != 1 || backward != 1 {
        return Some(format!("{forward} forward and {backward} backward attention calls in\n{ir}"));
    }
    if case.form != Form::Sdpa && ir.lines().any(|l| l.contains(" = pointwise ") && l.contains("pad")) {
        return Some(format!("the head views' gradients are padded by a kernel in\n{ir}"));
    }
    let program = match &compiled.executable {
        coil::Executable::Cpu(g) => g.program(),
        coil::Executable::Cuda(g) => g.program(),
    };
    let rows: Vec<usize> = case.batch.iter().copied().chain([case.l]).collect();
    let row_sums = program.nodes.iter().filter(|n| matches!(n.kind, coil::ir::loops::LoopKind::Reduction { .. }));
    if let Some(n) = row_sums.map(|n| program.buffer(n.output)).find(|b| b.meta.shape == rows) {
        return Some(format!("a reduction to the rows' shape ({}: {}) in\n{ir}", n.name, n.meta));
    }
    let scores = program.buffers.iter().find(|b| b.meta.shape.ends_with(&[case.l, case.s]));
    scores.map(|b| format!("buffer {} ({}) has the scores' shape in\n{ir}", b.name, b.meta))
}

/// Runs one gradient case; the error says what differs.
pub fn check_grad(case: &Case, device: Device) -> std::result::Result<(), String> {
    let fail = |what: String| format!("grad {}: {what}", case.name());
    coil::set_default_device(Device::Cpu);
    coil::set_backend(Backend::Interpreter);
    let (reference, _) = gradients(case, Device::Cpu, templated).map_err(|e| fail(format!("interpreter: {e}")))?;
    let (decomposed, _) = gradients(case, Device::Cpu, decomposed).map_err(|e| fail(format!("decomposed: {e}")))?;
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    coil::set_default_device(device);
    let (got, compiled) = gradients(case, device, templated).map_err(|e| fail(format!("compiled: {e}")))?;
    if let Some(problem) = program_problem(case, compiled.as_deref().expect("compiled")) {
        return Err(fail(problem));
    }
    let tolerance = if case.dtype == DType::F32 { 1e-5 } else { 2e-2 };
    for (what, other) in [("compiled", &got), ("the decomposed path", &decomposed)] {
        for (i, (x, y)) in other.iter().zip(&reference).enumerate() {
            let err = rel_error(x, y);
            if x.len() != y.len() || err > tolerance {
                return Err(fail(format!(
                    "{what}: output {i} (0: the loss, then the gradients) differs from the interpreter's by {err:.2e} (tolerance {tolerance:.0e})"
                )));
            }
        }
    }
    Ok(())
}

/// Every gradient case on `device`; all failures reported at once.
pub fn check_grad_all(device: Device) {
    let failures: Vec<String> = grad_cases().iter().filter_map(|c| check_grad(c, device).err()).collect();
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    coil::set_default_device(Device::Cpu);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Larger cases, compiled on `device` against compiled on the CPU (the interpreter would take
/// long): GPT-2's head views at a long sequence, and a wide head dim.
#[allow(dead_code)] // only `tests/gpu.rs` has another device to compare
pub fn check_grad_large(device: Device) {
    let c =
        |form, dtype, batch: &[usize], l, s, d, causal| Case { form, dtype, batch: batch.to_vec(), l, s, d, causal };
    let cases = [
        c(Form::Gpt2, DType::BF16, &[2, 4], 1000, 1000, 64, true),
        c(Form::Sdpa, DType::F16, &[2], 777, 777, 128, false),
    ];
    let mut failures = Vec::new();
    for case in &cases {
        coil::set_backend(Backend::Compiled);
        coil::set_eager_tier(false);
        coil::set_default_device(Device::Cpu);
        let run = |device| gradients(case, device, templated).map(|(values, _)| values);
        let (want, got) = match (run(Device::Cpu), run(device)) {
            (Ok(want), Ok(got)) => (want, got),
            (Err(e), _) | (_, Err(e)) => {
                failures.push(format!("{}: {e}", case.name()));
                continue;
            }
        };
        for (i, (x, y)) in got.iter().zip(&want).enumerate() {
            let err = rel_error(x, y);
            if err > 2e-2 {
                failures.push(format!("{}: output {i} differs from the CPU's by {err:.2e}", case.name()));
            }
        }
        // The same bits on a second run (no sums in an order that depends on timing).
        match run(device) {
            Ok(again) if again != got => failures.push(format!("{}: a second run gives other bits", case.name())),
            Ok(_) => {}
            Err(e) => failures.push(format!("{}: second run: {e}", case.name())),
        }
    }
    coil::set_default_device(Device::Cpu);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
