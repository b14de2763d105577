//! The attention-template cases, shared by `tests/attention/main.rs` (CPU) and `tests/gpu.rs`
//! (CUDA): each case runs compiled on a device, where attention must be one extern call
//! (`extern attention` in the loop program), and on the reference interpreter (the full
//! decomposition), on the same random inputs, and the two must agree within the dtype's
//! tolerance (relative RMS error: 1e-5 for f32; 1e-2 for f16 / bf16, whose unfused graph rounds
//! the scores and probabilities to the dtype where the template keeps them in f32).

use coil::{Backend, DType, Device, Result, Tensor};
use half::{bf16, f16};

#[path = "grad.rs"]
pub mod grad;

#[path = "masked.rs"]
pub mod masked;

#[path = "dropout.rs"]
pub mod dropout;
#[path = "masked_grad.rs"]
pub mod masked_grad;

/// How a case writes its attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Form {
    /// `scaled_dot_product_attention(q, k, v)` on separate q `[.., L, D]`, k and v `[.., S, D]`.
    Sdpa,
    /// GPT-2's written-out attention (`examples/bench.rs`): q, k, v are head views of one
    /// `[B, T, 3C]` tensor, `softmax(where(tril, q @ k^T * scale, -inf))` (in f32 for f16 /
    /// bf16) `@ v`, heads merged back to `[B, T, C]`.
    Gpt2,
    /// `scaled_dot_product_attention` on GPT-2's head views, result merged back to `[B, T, C]`.
    SdpaHeads,
}

/// One attention case.
#[derive(Clone, Debug)]
pub struct Case {
    pub form: Form,
    pub dtype: DType,
    /// Batch dims (`[B, H]` for the GPT-2 forms).
    pub batch: Vec<usize>,
    pub l: usize,
    pub s: usize,
    pub d: usize,
    pub causal: bool,
}

impl Case {
    pub fn name(&self) -> String {
        let causal = if self.causal { " causal" } else { "" };
        format!("{:?} {} {:?} L={} S={} D={}{causal}", self.form, self.dtype, self.batch, self.l, self.s, self.d)
    }
}

/// The cases every device runs: causal and not, L != S, f32 / bf16 / f16, rank 3 and 4, head
/// dims 32 to 128 (64 rows per kernel block: sizes that are not multiples of it), the GPT-2
/// head-view layout written out and through `scaled_dot_product_attention`.
pub fn cases() -> Vec<Case> {
    let c =
        |form, dtype, batch: &[usize], l, s, d, causal| Case { form, dtype, batch: batch.to_vec(), l, s, d, causal };
    vec![
        c(Form::Gpt2, DType::BF16, &[2, 3], 200, 200, 64, true),
        c(Form::Gpt2, DType::F32, &[2, 2], 37, 37, 16, true),
        c(Form::Gpt2, DType::F16, &[1, 2], 70, 70, 32, false),
        c(Form::SdpaHeads, DType::BF16, &[2, 3], 200, 200, 64, true),
        c(Form::Sdpa, DType::BF16, &[2, 2], 50, 130, 64, false),
        c(Form::Sdpa, DType::F16, &[3], 129, 129, 128, true),
        c(Form::Sdpa, DType::F32, &[2, 3], 65, 20, 32, true),
        c(Form::Sdpa, DType::F32, &[2], 17, 90, 8, false),
        c(Form::Sdpa, DType::BF16, &[1, 2], 33, 33, 40, true),
        c(Form::Sdpa, DType::BF16, &[2], 3, 5, 96, false),
    ]
}

/// splitmix64 normals: the same inputs on every backend.
pub fn normals(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u1, u2) = (next().max(1e-300), next());
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        })
        .collect()
}

/// A realized input tensor of `dtype` holding `values` (rounded to the dtype), on `device`.
pub fn tensor(values: &[f32], shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
    let t = match dtype {
        DType::BF16 => Tensor::from_vec(values.iter().map(|&x| bf16::from_f32(x)).collect(), shape)?,
        DType::F16 => Tensor::from_vec(values.iter().map(|&x| f16::from_f32(x)).collect(), shape)?,
        _ => Tensor::from_slice(values, shape)?,
    };
    t.to_device(device)
}

/// The case's inputs: `[qkv]` (`[B, T, 3C]`) for the GPT-2 forms, else `[q, k, v]`.
pub fn inputs(case: &Case, device: Device) -> Result<Vec<Tensor>> {
    let batch: usize = case.batch.iter().product();
    let with = |rows: usize| -> Vec<usize> { case.batch.iter().copied().chain([rows, case.d]).collect() };
    match case.form {
        Form::Sdpa => Ok(vec![
            tensor(&normals(1, batch * case.l * case.d), &with(case.l), case.dtype, device)?,
            tensor(&normals(2, batch * case.s * case.d), &with(case.s), case.dtype, device)?,
            tensor(&normals(3, batch * case.s * case.d), &with(case.s), case.dtype, device)?,
        ]),
        Form::Gpt2 | Form::SdpaHeads => {
            let (b, h) = (case.batch[0], case.batch[1]);
            let shape = [b, case.l, 3 * h * case.d];
            Ok(vec![tensor(&normals(4, shape.iter().product()), &shape, case.dtype, device)?])
        }
    }
}

/// The case's program on its inputs.
pub fn program(case: &Case, a: &[Tensor]) -> Result<Tensor> {
    if case.form == Form::Sdpa {
        return coil::scaled_dot_product_attention(&a[0], &a[1], &a[2], None, case.causal, None);
    }
    let (b, t, h, d) = (case.batch[0] as i64, case.l, case.batch[1] as i64, case.d);
    let c = h as usize * d;
    let qkv = a[0].split(c, 2)?;
    let heads = |p: &Tensor| p.view(&[b, t as i64, h, d as i64])?.transpose(1, 2);
    let (q, k, v) = (heads(&qkv[0])?, heads(&qkv[1])?, heads(&qkv[2])?);
    let y = if case.form == Form::SdpaHeads {
        coil::scaled_dot_product_attention(&q, &k, &v, None, case.causal, None)?
    } else {
        let mut att = q.matmul(&k.transpose(-2, -1)?)?.mul(1.0 / (d as f64).sqrt())?;
        if case.causal {
            let mask = Tensor::ones(&[t, t], DType::Bool).to_device(att.device())?.tril(0)?;
            att = coil::where_(&mask, &att, f64::NEG_INFINITY)?;
        }
        let att = att.to_dtype(DType::F32)?.softmax(-1)?.to_dtype(case.dtype)?;
        att.matmul(&v)?
    };
    y.transpose(1, 2)?.contiguous().view(&[b, t as i64, c as i64])
}

/// Relative RMS error of `got` against `want` (infinite when only one side is not finite).
pub fn rel_error(got: &[f64], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in got.iter().zip(want) {
        if !x.is_finite() || !y.is_finite() {
            return f64::INFINITY;
        }
        num += (x - y) * (x - y);
        den += y * y;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Runs one case compiled on `device` and on the interpreter; the error says what differs.
pub fn check(case: &Case, device: Device) -> std::result::Result<(), String> {
    let fail = |what: String| format!("{}: {what}", case.name());
    coil::set_backend(Backend::Interpreter);
    coil::set_default_device(Device::Cpu);
    let reference = program(case, &inputs(case, Device::Cpu).map_err(|e| fail(e.to_string()))?)
        .and_then(|y| y.to_vec::<f64>())
        .map_err(|e| fail(format!("interpreter: {e}")))?;
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    coil::set_default_device(device);
    let y = program(case, &inputs(case, device).map_err(|e| fail(e.to_string()))?).map_err(|e| fail(e.to_string()))?;
    let compiled = coil::inspect(&[&y]).map_err(|e| fail(format!("compile: {e}")))?;
    let calls = compiled.pre_fusion.matches("extern attention").count();
    if calls != 1 {
        return Err(fail(format!("{calls} attention calls in\n{}", compiled.pre_fusion)));
    }
    let got = y.to_vec::<f64>().map_err(|e| fail(format!("compiled run: {e}")))?;
    agrees(&got, &reference, case.dtype).map_err(fail)
}

/// The compiled result against the interpreter's: relative RMS error at most 1e-5 for f32,
/// 1e-2 for the half types.
pub fn agrees(got: &[f64], reference: &[f64], dtype: DType) -> std::result::Result<(), String> {
    let tolerance = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
    let err = rel_error(got, reference);
    if got.len() != reference.len() || err > tolerance {
        return Err(format!("relative error {err:.2e} (tolerance {tolerance:.0e})"));
    }
    Ok(())
}

/// Puts the backend and device back, then fails with every failure at once.
pub fn report(failures: Vec<String>) {
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    coil::set_default_device(Device::Cpu);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Every case on `device`; all failures reported at once.
pub fn check_all(device: Device) {
    report(cases().iter().filter_map(|c| check(c, device).err()).collect());
}
