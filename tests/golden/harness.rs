//! The golden-test harness, shared by `tests/golden/main.rs` (CPU) and `tests/gpu.rs` (CUDA).
//!
//! Golden tests: every case in `golden.safetensors` (inputs and outputs made by PyTorch, see
//! `README.md` here) is computed by coil and compared with PyTorch.
//!
//! * Float outputs: the relative error `||coil - ref64|| / ||ref64||` against PyTorch's float64
//!   result must be within the dtype's tolerance (f64 1e-10, f32 1e-5, f16/bf16 1e-2), or within
//!   twice PyTorch's own error in that dtype, whichever is larger; NaN and infinity positions
//!   must agree exactly (with PyTorch's output, or with its float64 run where that is
//!   non-finite too).
//! * Integer and bool outputs must be equal.
//! * Dtype and shape must be PyTorch's.
//! * A case PyTorch rejects (`err_*`) must be an error in coil (never a panic).
//!
//! The test reports every failing case at once.

#[path = "cases_alias.rs"]
mod cases_alias;
#[path = "cases_creation.rs"]
mod cases_creation;
#[path = "cases_data.rs"]
mod cases_data;
#[path = "cases_grad.rs"]
mod cases_grad;
#[path = "cases_index.rs"]
mod cases_index;
#[path = "cases_loss.rs"]
mod cases_loss;
#[path = "cases_math.rs"]
mod cases_math;
#[path = "cases_nn.rs"]
mod cases_nn;
#[path = "cases_pointwise.rs"]
mod cases_pointwise;
#[path = "cases_reduce.rs"]
mod cases_reduce;
#[path = "cases_scatter.rs"]
mod cases_scatter;
#[path = "cases_shape.rs"]
mod cases_shape;
#[path = "cases_vision.rs"]
mod cases_vision;

use coil::{Buffer, DType, HostData, Tensor};
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A case's inputs by name.
pub struct Inputs(BTreeMap<String, Tensor>);

impl std::ops::Index<&str> for Inputs {
    type Output = Tensor;
    fn index(&self, name: &str) -> &Tensor {
        self.0.get(name).unwrap_or_else(|| panic!("the case has no input {name}"))
    }
}

/// What a case table returns: the outputs, in PyTorch's (flattened) order.
pub type Outputs = coil::Result<Vec<Tensor>>;

/// Cases coil does not reproduce, with the reason; the test prints them.
const NOT_APPLICABLE: &[(&str, &str)] = &[];

fn dtype_of(d: safetensors::Dtype) -> DType {
    use safetensors::Dtype as S;
    match d {
        S::BOOL => DType::Bool,
        S::U8 => DType::U8,
        S::I8 => DType::I8,
        S::I16 => DType::I16,
        S::I32 => DType::I32,
        S::I64 => DType::I64,
        S::F16 => DType::F16,
        S::BF16 => DType::BF16,
        S::F32 => DType::F32,
        S::F64 => DType::F64,
        other => panic!("unexpected dtype {other:?} in golden data"),
    }
}

fn load(st: &SafeTensors, name: &str) -> Option<Buffer> {
    let view = st.tensor(name).ok()?;
    let data = HostData::from_bytes(dtype_of(view.dtype()), view.data()).expect("golden tensor bytes");
    Some(Buffer::new(view.shape().to_vec(), data).expect("golden tensor shape"))
}

/// An input made from its spec (shape, dtype, and `values` or a distribution), for cases PyTorch
/// rejected and so stored no tensors for. Values are deterministic and never all zero.
fn input_from_spec(spec: &serde_json::Value) -> Buffer {
    let shape: Vec<usize> =
        spec["shape"].as_array().map_or(vec![], |s| s.iter().map(|d| d.as_u64().unwrap() as usize).collect());
    let dtype = DType::parse(spec["dtype"].as_str().unwrap_or("float32")).expect("dtype");
    let n: usize = shape.iter().product();
    let values: Vec<f64> = match spec.get("values") {
        Some(v) => flatten_json(v),
        None => {
            let dist = spec["dist"].as_str().unwrap_or("randn");
            let range = dist.strip_prefix("int:").map(|r| {
                let (lo, hi) = r.split_once(':').unwrap();
                (lo.parse::<i64>().unwrap(), hi.parse::<i64>().unwrap())
            });
            (0..n)
                .map(|i| match (dist, range) {
                    (_, Some((lo, hi))) => (lo + (i as i64 * 7) % (hi - lo)) as f64,
                    ("bool", _) => (i % 2) as f64,
                    _ => ((i * 37 % 17) as f64 - 8.0) / 4.0 + 0.1,
                })
                .collect()
        }
    };
    Buffer::new(shape, HostData::from_f64_slice(dtype, &values)).expect("input spec")
}

fn flatten_json(v: &serde_json::Value) -> Vec<f64> {
    match v {
        serde_json::Value::Array(items) => items.iter().flat_map(flatten_json).collect(),
        serde_json::Value::String(s) => vec![s.parse::<f64>().expect("nan, inf or -inf")],
        serde_json::Value::Bool(b) => vec![*b as i64 as f64],
        other => vec![other.as_f64().expect("a number")],
    }
}

/// Runs one case through the tables; `None` when no table knows the case.
pub fn run_case(name: &str, inputs: &Inputs) -> Option<Outputs> {
    run_forward(name, inputs).or_else(|| cases_grad::run(name, inputs)).or_else(|| generic_grad(name, inputs))
}

/// A forward case (not a gradient one).
fn run_forward(name: &str, inputs: &Inputs) -> Option<Outputs> {
    cases_creation::run(name, inputs)
        .or_else(|| cases_pointwise::run(name, inputs))
        .or_else(|| cases_reduce::run(name, inputs))
        .or_else(|| cases_shape::run(name, inputs))
        .or_else(|| cases_nn::run(name, inputs))
        .or_else(|| cases_math::run(name, inputs))
        .or_else(|| cases_loss::run(name, inputs))
        .or_else(|| cases_index::run(name, inputs))
        .or_else(|| cases_vision::run(name, inputs))
        .or_else(|| cases_data::run(name, inputs))
        .or_else(|| cases_scatter::run(name, inputs))
        .or_else(|| cases_alias::run(name, inputs))
}

/// `grad_<forward case>` (`gcase` in `make_cases.py`): the gradients of
/// `sum(out * linspace(-1, 2, numel))`, `out` the forward case's first output, with respect to
/// every floating input but the targets `t`, `y` and the undifferentiated weights `z`, in name
/// order.
fn generic_grad(name: &str, inputs: &Inputs) -> Option<Outputs> {
    let forward = run_forward(name.strip_prefix("grad_")?, inputs)?;
    Some(forward.and_then(|outs| {
        let out = &outs[0];
        let shape: Vec<i64> = out.shape().iter().map(|&s| s as i64).collect();
        let weights = Tensor::linspace(-1.0, 2.0, out.numel(), DType::F32)?
            .to_device(out.device())?
            .reshape(&shape)?
            .to_dtype(out.dtype())?;
        let loss = out.mul(&weights)?.sum_all()?;
        let params: Vec<&Tensor> = inputs
            .0
            .iter()
            .filter(|(k, t)| t.dtype().is_float() && !["t", "y", "z"].contains(&k.as_str()))
            .map(|(_, t)| t)
            .collect();
        coil::grad(&loss, &params)
    }))
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        DType::F32 => 1e-5,
        _ => 1e-2,
    }
}

/// `||a - b|| / ||b||` over the finite positions of `b` (or the absolute norm when `b` is all
/// zeros); the non-finite positions are compared exactly by [`nonfinite_mismatch`].
fn rel_error(a: &[f64], b: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        if y.is_finite() {
            num += (x - y) * (x - y);
            den += y * y;
        }
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// The first position where PyTorch's output `torch` is NaN or infinite and `got` is not the
/// same (NaN for NaN, the same infinity for an infinity). Where PyTorch's float64 run `ref64`
/// is non-finite too but differs (`F.gelu(inf)` is NaN in float32 and inf in float64), either
/// of PyTorch's answers is accepted.
fn nonfinite_mismatch(got: &[f64], torch: &[f64], ref64: Option<&[f64]>) -> Option<usize> {
    let same = |x: f64, y: f64| x.is_nan() && y.is_nan() || x == y;
    (0..got.len()).find(|&i| {
        let (g, t) = (got[i], torch[i]);
        let ref_agrees = ref64.is_some_and(|r| !r[i].is_finite() && same(g, r[i]));
        !t.is_finite() && !same(g, t) && !ref_agrees
    })
}

/// Compares one output; returns a description of the mismatch.
fn compare(got: &Buffer, torch: &Buffer, ref64: Option<&Buffer>) -> Result<(), String> {
    if got.dtype() != torch.dtype() {
        return Err(format!("dtype {} but PyTorch gives {}", got.dtype(), torch.dtype()));
    }
    if got.shape != torch.shape {
        return Err(format!("shape {:?} but PyTorch gives {:?}", got.shape, torch.shape));
    }
    if !got.dtype().is_float() {
        let (g, t) = (got.to_vec::<i64>(), torch.to_vec::<i64>());
        return match g.iter().zip(&t).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(i) => Err(format!("element {i}: {} but PyTorch gives {} (first mismatch)", g[i], t[i])),
        };
    }
    let (g, t) = (got.to_vec::<f64>(), torch.to_vec::<f64>());
    let r64 = ref64.map(|r| r.to_vec::<f64>()).filter(|r| r.len() == g.len());
    if let Some(i) = nonfinite_mismatch(&g, &t, r64.as_deref()) {
        return Err(format!("element {i}: {} but PyTorch gives {} (NaN and infinities must agree)", g[i], t[i]));
    }
    // Pass when coil is as close to PyTorch's float64 result as PyTorch itself is (or within the
    // dtype's tolerance), or within tolerance of PyTorch's output in the case's dtype. The second
    // test serves the cases about dtypes themselves (casts, promotion, dtype-dependent defaults),
    // where PyTorch's float64 run computes another function.
    let tol = tolerance(got.dtype());
    let vs_torch = rel_error(&g, &t);
    if vs_torch <= tol {
        return Ok(());
    }
    if let Some(r) = r64 {
        let allowed = tol.max(2.0 * rel_error(&t, &r));
        if rel_error(&g, &r) <= allowed {
            return Ok(());
        }
    }
    let worst =
        (0..g.len()).filter(|&i| t[i].is_finite()).max_by(|&i, &j| (g[i] - t[i]).abs().total_cmp(&(g[j] - t[j]).abs()));
    let at = worst.map_or(String::new(), |i| format!("; worst element {i}: {} vs {}", g[i], t[i]));
    Err(format!("relative error {vs_torch:.3e} > {tol:.0e} against PyTorch{at}"))
}

/// Runs every case on one backend and device and reports every failure at once.
/// Calls `f` with each case of `golden.safetensors` (sorted by name) that is not in
/// [`NOT_APPLICABLE`]: its name, its JSON, PyTorch's error where it rejects the case, its
/// inputs on `device`, and the file (for its outputs). Returns the number of cases skipped as
/// not applicable.
pub fn for_each_case(
    device: coil::Device,
    mut f: impl FnMut(&str, &serde_json::Value, Option<&str>, Inputs, &SafeTensors),
) -> usize {
    // Where it was built, or relative to the repository root (a test binary carried to the GPU
    // machine runs from a checkout elsewhere).
    let built = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/golden.safetensors");
    let bytes = std::fs::read(built)
        .or_else(|_| std::fs::read("tests/golden/golden.safetensors"))
        .expect("tests/golden/golden.safetensors (see tests/golden/README.md)");
    let (_, metadata) = SafeTensors::read_metadata(&bytes).expect("safetensors header");
    let st = SafeTensors::deserialize(&bytes).expect("safetensors file");
    let meta = metadata.metadata().clone().expect("case metadata");
    let mut names: Vec<&String> = meta.keys().filter(|k| !k.contains('.')).collect();
    names.sort();
    let mut skipped = 0;
    for name in names {
        if let Some((_, why)) = NOT_APPLICABLE.iter().find(|(n, _)| n == name) {
            println!("not applicable: {name}: {why}");
            skipped += 1;
            continue;
        }
        let case: serde_json::Value = serde_json::from_str(&meta[name]).expect("case JSON");
        let torch_error = meta.get(&format!("{name}.error")).map(String::as_str);
        let mut inputs = BTreeMap::new();
        for (input, spec) in case["inputs"].as_object().expect("inputs") {
            // PyTorch stores no tensors for a case it rejects: make the inputs from the spec.
            let buffer = load(&st, &format!("{name}.in.{input}")).unwrap_or_else(|| input_from_spec(spec));
            inputs.insert(input.clone(), Tensor::from_buffer(buffer).to_device(device).expect("input to the device"));
        }
        f(name, &case, torch_error, Inputs(inputs), &st);
    }
    skipped
}

pub fn check_all(backend: coil::Backend, device: coil::Device) {
    // (tier 0 follows the caller's configuration: `golden/main.rs` turns it off, and
    // `golden_tier0.rs` on)
    coil::set_backend(backend);
    coil::set_default_device(device);
    let (mut passed, mut failures) = (0, Vec::new());
    let skipped = for_each_case(device, |name, case, torch_error, inputs, st| {
        let expects_error = torch_error.is_some();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            run_case(name, &inputs).map(|r| {
                r.and_then(|outs| {
                    coil::realize(&outs.iter().collect::<Vec<_>>())?;
                    outs.iter().map(|t| t.buffer().map(|b| (*b).clone())).collect::<coil::Result<Vec<Buffer>>>()
                })
            })
        }));
        let expr = case["expr"].as_str().unwrap_or("");
        let verdict: Result<(), String> = match outcome {
            Err(_) => Err("panicked".into()),
            Ok(None) => Err("no coil expression for this case".into()),
            Ok(Some(Err(e))) if expects_error => {
                let _ = e;
                Ok(())
            }
            Ok(Some(Err(e))) => Err(format!("error: {e}")),
            Ok(Some(Ok(_))) if expects_error => {
                Err(format!("PyTorch raises ({}) but coil does not", torch_error.unwrap_or_default()))
            }
            Ok(Some(Ok(outs))) => {
                let mut result = Ok(());
                let n_torch = (0..).take_while(|k| st.tensor(&format!("{name}.out.{k}")).is_ok()).count();
                if n_torch != outs.len() {
                    result = Err(format!("{} outputs but PyTorch gives {n_torch}", outs.len()));
                }
                for (k, got) in outs.iter().enumerate().take(n_torch) {
                    let torch = load(st, &format!("{name}.out.{k}")).unwrap();
                    let ref64 = load(st, &format!("{name}.ref64.{k}"));
                    if let Err(e) = compare(got, &torch, ref64.as_ref()) {
                        result = Err(format!("output {k}: {e}"));
                        break;
                    }
                }
                result
            }
        };
        match verdict {
            Ok(()) => passed += 1,
            Err(e) => failures.push(format!("{name} [{expr}]: {e}")),
        }
    });
    println!("golden ({backend:?} on {device}): {passed} passed, {} failed, {skipped} not applicable", failures.len());
    assert!(passed >= 150, "only {passed} golden cases passed");
    assert!(
        failures.is_empty(),
        "{} golden cases fail on {backend:?} ({device}):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The check the harness once skipped: a finite value where PyTorch has NaN (or the other
/// infinity) is a failure, wherever the rest of the output is close.
#[test]
fn nonfinite_positions_must_agree_exactly() {
    let buf = |v: Vec<f32>| Buffer::from_vec(v, vec![3]);
    let torch = buf(vec![1.0, f32::NAN, f32::INFINITY]);
    assert!(compare(&buf(vec![1.0, f32::NAN, f32::INFINITY]), &torch, None).is_ok());
    assert!(compare(&buf(vec![1.0, 2.0, f32::INFINITY]), &torch, None).is_err());
    assert!(compare(&buf(vec![1.0, f32::NAN, f32::NEG_INFINITY]), &torch, None).is_err());
    assert!(compare(&buf(vec![1.0, f32::NAN, 3e38]), &torch, Some(&torch)).is_err());
}
