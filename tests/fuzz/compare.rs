//! One trial on every backend, and the verdict: do the backends agree?
//!
//! The reference is the interpreter on the CPU; each compiled backend (the CPU, and CUDA when
//! asked for) records the same seed again and must give the same error kind, or the same
//! shapes, dtypes and values within the tolerances below.
//!
//! Tolerances, per float dtype (relative L2 error over the finite elements, as the
//! differential tests measure it): f64 1e-7, f32 1e-4, f16 1e-2, bf16 4e-2, the loosest of the
//! dtypes the trial computes with (an f32 result cast to f64 is as precise as f32); integers
//! and bools exactly; NaN and infinities at exactly the same positions. Two documented classes are
//! counted apart, as *tolerated*, not as agreements (issue 24 fixes them elsewhere):
//! * **signed zero**: the values agree except for the sign of some zeros;
//! * **half precision**: an f16 / bf16 tensor took part, and the values differ by more than
//!   the output dtype allows, or an infinity / NaN appears on one side only: the compiled
//!   kernels keep f16 / bf16 intermediates in f32, the interpreter rounds after every op, and
//!   an op after a rounded one (a trunc, a comparison, a cos of a large value) can turn one ulp
//!   into any difference;
//! * **product overflow**: a matrix product of values near their dtype's largest, and an
//!   infinity or NaN on one side only: compiled f32 products accumulate in f32 (the gemm crate,
//!   as PyTorch's BLAS does), the interpreter in f64, so one overflows where the other does not;
//! * **rounding into integers**: an integer or bool value computed from floats (a cast, a
//!   comparison, an argmax, `floor`) differs in at most one element in eight: a float one ulp
//!   apart (the C library's `expf` against the interpreter's f64 `exp` rounded once) lands on
//!   the other side of an integer or of a tie.

use crate::gen::{self, Built, Trial};
use coil::{Backend, DType, Device, Error, ErrorKind, Tensor, TensorMeta};

/// What one backend made of a trial.
pub enum Outcome {
    Values(Vec<Output>),
    Failed(Error),
}

/// One realized output.
pub struct Output {
    pub meta: TensorMeta,
    pub values: Values,
}

/// Elements as the widest type of their kind.
#[derive(PartialEq)]
pub enum Values {
    Float(Vec<f64>),
    Int(Vec<i64>),
}

/// The verdict on one trial.
pub enum Verdict {
    /// coil refused a call while recording, with an error naming the op and the caller's line.
    Rejected { op: String },
    /// A recording error that does not name its op or the caller's line.
    BadError(String),
    /// Valid, but too large to run ([`gen::RUN_LIMIT`]).
    TooLarge,
    /// Every backend gave the same values.
    Agree,
    /// Every backend failed at realize with this kind of error (data errors: an index out of
    /// bounds, an integer division by zero).
    AgreeError(ErrorKind),
    /// The backends differ only as a documented tolerance class allows.
    Tolerated(&'static str),
    /// The interpreter failed at realize with an error that is not about the data: an
    /// invariant the recording should have checked.
    Internal(String),
    /// The backends disagree.
    Disagree(String),
    /// A panic, caught (its message and location).
    Panic(String),
}

impl Verdict {
    /// The class name the runner counts.
    pub fn class(&self) -> String {
        match self {
            Verdict::Rejected { .. } => "rejected".into(),
            Verdict::BadError(_) => "bad-error".into(),
            Verdict::TooLarge => "too-large".into(),
            Verdict::Agree => "agree".into(),
            Verdict::AgreeError(_) => "agree-error".into(),
            Verdict::Tolerated(why) => format!("tolerated:{why}"),
            Verdict::Internal(_) => "internal".into(),
            Verdict::Disagree(_) => "disagree".into(),
            Verdict::Panic(_) => "panic".into(),
        }
    }

    /// Details for the report (the op refused, the error, the difference).
    pub fn detail(&self) -> String {
        match self {
            Verdict::Rejected { op } => op.clone(),
            Verdict::AgreeError(kind) => kind.to_string(),
            Verdict::BadError(s) | Verdict::Internal(s) | Verdict::Disagree(s) | Verdict::Panic(s) => s.clone(),
            _ => String::new(),
        }
    }

    /// Whether this verdict fails the run.
    pub fn is_failure(class: &str) -> bool {
        matches!(class, "bad-error" | "internal" | "disagree" | "panic" | "crash" | "hang")
    }
}

/// Runs trial `seed` on the interpreter and on the compiled backend of each of `devices`.
/// With `verbose`, prints the script and each backend's outcome (as `#` lines).
pub fn judge(seed: u64, devices: &[Device], verbose: bool) -> Verdict {
    coil::set_backend(Backend::Interpreter);
    let trial = match gen::build(seed, Device::Cpu) {
        Built::Rejected { error, script } => {
            if verbose {
                print_script(&script);
                println!("# rejected: {error}");
            }
            return judge_rejection(&error);
        }
        Built::Ready(trial) => trial,
    };
    if verbose {
        print_script(&trial.script);
    }
    if trial.too_large {
        return Verdict::TooLarge;
    }
    let tolerance = Tolerance::of(&trial);
    let reference = realize(&trial.outputs);
    if verbose {
        println!("# interpreter: {}", reference.summary());
    }
    if let Outcome::Failed(e) = &reference {
        // `full` (`zeros`, `ones`) of a shape that cannot exist returns a tensor standing for
        // the error: realizing it is how that refusal shows.
        if e.op.as_deref() == Some("full") && e.kind == ErrorKind::Shape {
            return judge_rejection(e);
        }
        if e.kind != ErrorKind::Value {
            return Verdict::Internal(format!("the interpreter failed at realize: {e}"));
        }
    }
    let mut verdict = match &reference {
        Outcome::Failed(e) => Verdict::AgreeError(e.kind),
        Outcome::Values(_) => Verdict::Agree,
    };
    // Tier 0 first (a graph the process has not compiled runs there; afterwards it would not):
    // the eager executor every new CPU realization outside compiled functions starts on.
    if devices.contains(&Device::Cpu) {
        coil::set_backend(Backend::Compiled);
        coil::set_eager_tier(true);
        let before = coil::tiered::tier0_runs();
        let outcome = match gen::build(seed, Device::Cpu) {
            Built::Ready(t) => realize(&t.outputs),
            Built::Rejected { error, .. } => {
                return Verdict::Disagree(format!(
                    "recording for tier 0 failed where the interpreter's did not: {error}"
                ))
            }
        };
        coil::set_eager_tier(false);
        if verbose {
            let ran = coil::tiered::tier0_runs() > before;
            println!("# tier 0 ({}): {}", if ran { "ran there" } else { "compiled" }, outcome.summary());
        }
        match compare(&reference, &outcome, tolerance) {
            Ok(None) => {}
            Ok(Some(class)) => verdict = Verdict::Tolerated(class),
            Err(why) => return Verdict::Disagree(format!("tier 0 on the CPU: {why}")),
        }
    }
    for &device in devices {
        coil::set_backend(Backend::Compiled);
        coil::set_eager_tier(false);
        let outcome = match gen::build(seed, device) {
            Built::Ready(t) => realize(&t.outputs),
            Built::Rejected { error, .. } => {
                return Verdict::Disagree(format!("recording on {device} failed where the CPU's did not: {error}"))
            }
        };
        if verbose {
            println!("# compiled on {device}: {}", outcome.summary());
        }
        match compare(&reference, &outcome, tolerance) {
            Ok(None) => {}
            Ok(Some(class)) => verdict = Verdict::Tolerated(class),
            Err(why) => return Verdict::Disagree(format!("compiled on {device}: {why}")),
        }
    }
    verdict
}

fn print_script(script: &[String]) {
    for line in script {
        println!("# {line}");
    }
}

/// A recording error must name its op and point at the generator's line.
fn judge_rejection(e: &Error) -> Verdict {
    let here = file!();
    let dir = &here[..here.rfind('/').map_or(0, |i| i + 1)];
    match (&e.op, e.location) {
        (Some(op), Some(at)) if at.file().starts_with(dir) => Verdict::Rejected { op: op.clone() },
        _ => Verdict::BadError(format!("a recording error without its op or the caller's line: {e:?}")),
    }
}

/// Realizes `outputs` on the thread's backend and reads them back.
pub fn realize(outputs: &[Tensor]) -> Outcome {
    let refs: Vec<&Tensor> = outputs.iter().collect();
    if let Err(e) = coil::realize(&refs) {
        return Outcome::Failed(e);
    }
    let mut out = Vec::new();
    for t in outputs {
        match t.buffer() {
            Ok(b) => {
                let values = if b.dtype().is_float() {
                    Values::Float(b.data.to_f64_vec())
                } else {
                    Values::Int(b.data.to_i64_vec())
                };
                out.push(Output { meta: b.meta(), values });
            }
            Err(e) => return Outcome::Failed(e),
        }
    }
    Outcome::Values(out)
}

impl Outcome {
    /// One line: the error, or each output's meta and first values.
    pub fn summary(&self) -> String {
        match self {
            Outcome::Failed(e) => format!("error: {e}"),
            Outcome::Values(outs) => outs
                .iter()
                .map(|o| match &o.values {
                    Values::Float(v) => format!("{} {:?}", o.meta, &v[..v.len().min(8)]),
                    Values::Int(v) => format!("{} {:?}", o.meta, &v[..v.len().min(8)]),
                })
                .collect::<Vec<_>>()
                .join("; "),
        }
    }
}

/// What a trial's values may differ by, besides each dtype's tolerance.
#[derive(Clone, Copy)]
pub struct Tolerance {
    /// An f16 / bf16 tensor took part.
    pub half: bool,
    /// An integer or bool value is computed from floats.
    pub rounding: bool,
    /// A matrix product of values near their dtype's largest.
    pub overflow: bool,
    /// The tolerance of the least precise float dtype computed with (an f32 result cast to f64
    /// is as precise as f32).
    pub precision: f64,
}

impl Tolerance {
    /// The classes `trial` may fall in, from what it computes (its graph, decomposed, before it
    /// runs).
    fn of(trial: &Trial) -> Tolerance {
        let refs: Vec<&Tensor> = trial.outputs.iter().collect();
        let graph = coil::decompose(&coil::capture(&refs).graph);
        let any = |f: &dyn Fn(&coil::ir::Graph, &coil::ir::Node) -> bool| {
            graph.as_ref().map_or(true, |g| g.nodes.iter().any(|n| f(g, n)))
        };
        let rounding = any(&|g, n| !n.meta.dtype.is_float() && n.inputs.iter().any(|&i| g.meta(i).dtype.is_float()));
        let products = any(&|_, n| matches!(n.op, coil::ir::Op::Bmm | coil::ir::Op::Attention { .. }));
        let floats = graph.iter().flat_map(|g| g.nodes.iter()).map(|n| n.meta.dtype).filter(|d| d.is_float());
        let precision = floats.map(tolerance).fold(0.0, f64::max);
        Tolerance { half: trial.half, rounding, overflow: trial.huge && products, precision }
    }
}

/// Compares another backend's outcome with the reference's: `Ok(None)` when they agree,
/// `Ok(Some(class))` when they differ only as a tolerance class allows, `Err` otherwise.
pub fn compare(reference: &Outcome, other: &Outcome, tol: Tolerance) -> Result<Option<&'static str>, String> {
    let (refs, others) = match (reference, other) {
        (Outcome::Failed(a), Outcome::Failed(b)) if a.kind == b.kind => return Ok(None),
        (Outcome::Values(a), Outcome::Values(b)) => (a, b),
        _ => return Err(format!("the interpreter gives {}, compiled gives {}", reference.summary(), other.summary())),
    };
    let mut class = None;
    for (k, (r, o)) in refs.iter().zip(others).enumerate() {
        if r.meta != o.meta {
            return Err(format!("output {k}: {} from the interpreter, {} compiled", r.meta, o.meta));
        }
        let found = match (&r.values, &o.values) {
            (Values::Int(a), Values::Int(b)) => compare_ints(a, b, tol),
            (Values::Float(a), Values::Float(b)) => compare_floats(a, b, r.meta.dtype, tol),
            _ => Err("different kinds of values".into()),
        }
        .map_err(|why| format!("output {k} ({}): {why}", r.meta))?;
        class = class.or(found);
    }
    Ok(class)
}

/// Integer values `b` (compiled) against `a` (the interpreter).
fn compare_ints(a: &[i64], b: &[i64], tol: Tolerance) -> Result<Option<&'static str>, String> {
    let differ: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
    match differ.first() {
        None => Ok(None),
        Some(_) if tol.rounding && tol.half => Ok(Some("half precision")),
        Some(_) if tol.rounding && differ.len() <= 1 + a.len() / 8 => Ok(Some("rounding into integers")),
        Some(&i) => Err(format!(
            "{} elements differ, first {i}: {} from the interpreter, {} compiled",
            differ.len(),
            a[i],
            b[i]
        )),
    }
}

/// The tolerance of a float dtype (relative L2 error).
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-7,
        DType::F32 => 1e-4,
        DType::F16 => 1e-2,
        _ => 4e-2,
    }
}

/// Float values `b` (compiled) against `a` (the interpreter).
fn compare_floats(a: &[f64], b: &[f64], dtype: DType, tol: Tolerance) -> Result<Option<&'static str>, String> {
    // Scaled by the largest finite magnitude, so that squares of huge values do not overflow.
    let finite = |v: &[f64]| v.iter().filter(|x| x.is_finite()).fold(0.0f64, |m, x| m.max(x.abs()));
    let scale = finite(a).max(finite(b)).max(f64::MIN_POSITIVE);
    let (mut num, mut den, mut signed_zero, mut special) = (0.0, 0.0, false, None);
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        if x.is_finite() && y.is_finite() {
            num += ((x - y) / scale).powi(2);
            den += (x / scale).powi(2);
            signed_zero |= x == 0.0 && y == 0.0 && x.is_sign_negative() != y.is_sign_negative();
        } else if !(x.is_nan() && y.is_nan()) && x != y {
            special = special.or(Some(format!("element {i}: {x} from the interpreter, {y} compiled")));
        }
    }
    let err = if den == 0.0 { num.sqrt() * scale } else { (num / den).sqrt() };
    let allowed = tolerance(dtype).max(tol.precision);
    match special {
        // f16 / bf16 intermediates: rounded after every op by the interpreter, kept in f32 by the
        // compiled kernels. The difference is not bounded: a trunc, a comparison or a cos of a
        // large value after a rounded op turns one ulp into anything.
        _ if tol.half && (special.is_some() || err > allowed) => Ok(Some("half precision")),
        // f32 products accumulate in f32 compiled (the gemm crate, as PyTorch's BLAS), in f64
        // on the interpreter: with values near the largest, one overflows where the other
        // does not (inf against NaN, or against a finite value).
        Some(_) if tol.overflow => Ok(Some("product overflow")),
        Some(why) => Err(why),
        None if err <= allowed => Ok(signed_zero.then_some("signed zero")),
        None => Err(format!("relative error {err:.2e} (tolerance {allowed:.0e})")),
    }
}
