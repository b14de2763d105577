//! The differential-test harness, shared by `tests/differential/main.rs` (CPU) and
//! `tests/gpu.rs` (CUDA).
//!
//! Differential tests: random programs run compiled and on the reference interpreter, on random
//! data (never zeros), must agree within [`tolerance`]: f32's, plus one rounding of a 16-bit
//! float per op the program computes in bf16 (the compiled kernels keep those values in f32,
//! the interpreter rounds after every op).
//!
//! A program is a seed: the generator below turns it into a sequence of ops (pointwise chains,
//! broadcasts, views, reductions over random dims, softmax, casts between f32, bf16 and i32), so
//! a failure prints the seed and the captured graph and can be replayed alone with
//! `COIL_DIFF_SEED=<seed> cargo test --test differential`.

use coil::{Backend, DType, Tensor};

/// splitmix64: small, deterministic, good enough to pick ops.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn normal(&mut self) -> f64 {
        let u1 = ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// The input data of a program: shapes and values, made once so both backends see the same.
struct Inputs(Vec<(Vec<usize>, Vec<f32>)>);

impl Inputs {
    fn new(rng: &mut Rng) -> Inputs {
        let rank = 1 + rng.below(3);
        let shape: Vec<usize> = (0..rank).map(|_| 1 + rng.below(7)).collect();
        let n: usize = shape.iter().product();
        let make = |rng: &mut Rng| (0..n).map(|_| rng.normal() as f32).collect::<Vec<f32>>();
        let a = make(rng);
        let b = make(rng);
        Inputs(vec![(shape.clone(), a), (shape, b)])
    }

    fn tensors(&self, device: coil::Device) -> Vec<Tensor> {
        self.0.iter().map(|(s, v)| Tensor::from_slice(v, s).unwrap().to_device(device).unwrap()).collect()
    }
}

/// The ops of a program whose results are of a 16-bit float dtype: where the backends round
/// differently ("Values in generated code", `docs/compiler.md`). The compiled kernels keep a
/// fused kernel's f16 / bf16 intermediates in f32 and round at stores and casts, as Inductor
/// does; the interpreter rounds every op's result, as eager PyTorch does. So each such op may
/// differ by one rounding to the dtype: skipped on one side, or (where both round) taken from
/// f32 values that already differ a little, which can land on neighbouring values.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HalfOps {
    /// The 16-bit dtype (bf16 if any op is bf16: its rounding bounds f16's).
    dtype: Option<DType>,
    /// How many ops produce values of it.
    ops: usize,
}

impl HalfOps {
    /// No op computes in a 16-bit float.
    pub const NONE: HalfOps = HalfOps { dtype: None, ops: 0 };

    /// `ops` ops producing values of `dtype` (f16 or bf16).
    pub fn of(dtype: DType, ops: usize) -> HalfOps {
        assert!(matches!(dtype, DType::F16 | DType::BF16), "{dtype} is not a 16-bit float");
        HalfOps { dtype: Some(dtype), ops }
    }

    /// Both programs' ops.
    fn and(self, other: HalfOps) -> HalfOps {
        let dtype = match (self.dtype, other.dtype) {
            (Some(DType::BF16), _) | (_, Some(DType::BF16)) => Some(DType::BF16),
            (a, b) => a.or(b),
        };
        HalfOps { dtype, ops: self.ops + other.ops }
    }
}

/// The relative error allowed between f32 results of the compiled backends and the
/// interpreter: their transcendental functions differ by a few ulp (the interpreter computes
/// in f64 and rounds), sums and reductions add in another order, and later ops (a softmax's
/// exp, a subtraction that cancels) amplify that; f32's epsilon is 1.2e-7.
pub const F32_TOLERANCE: f64 = 1e-4;

/// [`F32_TOLERANCE`] between two compiled runs of a program (static and dynamic shapes): the
/// same functions, only sums may add in another order.
pub const F32_TOLERANCE_BETWEEN_COMPILED: f64 = 1e-5;

/// How far later ops may amplify one rounding difference of a 16-bit value, in ulps: a
/// product, sum or exp of the value carries its relative error on, a cancellation in a sum
/// grows it (the relative error here is over a whole output, so one cancelling element counts
/// by its share). On the CPU, the worst of the 120 random programs with a bf16 step (2 ops)
/// differed by 1.1e-2, a third of their tolerance.
pub const HALF_ROUNDING_GROWTH: f64 = 2.0;

/// Machine epsilon (the distance from 1 to the next value) of a float dtype.
pub fn epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-7),
        DType::F16 => 2f64.powi(-10),
        DType::F32 => f32::EPSILON as f64,
        _ => f64::EPSILON,
    }
}

/// The relative (L2) error allowed between two runs of a program that computes `half` in a
/// 16-bit float: `f32_tolerance` (what its f32 ops may differ by: [`F32_TOLERANCE`] or
/// [`F32_TOLERANCE_BETWEEN_COMPILED`]), plus per such op one ulp of its dtype (a rounding taken
/// on one side only is at most half an ulp; one taken from f32 values that differ, one ulp),
/// times [`HALF_ROUNDING_GROWTH`]. For the random programs' bf16 step (a multiply and an add
/// in bf16) against the interpreter: 1e-4 + 2 * 2 * 2^-7 = 3.1e-2.
pub fn tolerance(half: HalfOps, f32_tolerance: f64) -> f64 {
    f32_tolerance + half.dtype.map_or(0.0, |d| HALF_ROUNDING_GROWTH * half.ops as f64 * epsilon(d))
}

/// Builds one random program over the inputs; returns its outputs, and its ops computed in bf16
/// (see [`HalfOps`]).
fn program(seed: u64, inputs: &[Tensor]) -> coil::Result<(Vec<Tensor>, HalfOps)> {
    let mut rng = Rng(seed);
    let mut pool: Vec<Tensor> = inputs.to_vec();
    let mut half = HalfOps::NONE;
    let steps = 3 + rng.below(8);
    for _ in 0..steps {
        let x = pool[rng.below(pool.len())].clone();
        let rank = x.rank() as i64;
        let dim = if rank > 0 { rng.below(rank as usize) as i64 - if rng.chance(30) { rank } else { 0 } } else { 0 };
        let y = match rng.below(16) {
            0 => x.exp()?.mul(0.5)?.tanh()?,
            1 => (x.sigmoid()? * x.sin()?) + 1.0,
            2 => x.abs()?.add(0.25)?.sqrt()?.log()?,
            3 => x.relu()?.sub(x.gelu(rng.chance(50))?)?,
            4 => {
                // broadcast against a keepdim reduction of itself
                let r = x.amax(&[dim], true)?;
                x.sub(&r)?
            }
            5 => x.sum(&[dim], rng.chance(50))?,
            6 => x.mean(&[dim], true)?.mul(&x)?,
            7 if rank >= 2 => x.transpose(0, rank - 1)?.mul(2.0)?.add(1.0)?,
            8 if rank > 0 && x.shape()[(dim + if dim < 0 { rank } else { 0 }) as usize] >= 2 => {
                x.slice(dim, Some(if rng.chance(50) { 1 } else { 0 }), None, 1 + rng.below(2) as i64)?.neg()?
            }
            9 => x.softmax(dim)?,
            10 => x.reshape(&[-1])?.unsqueeze(0)?.expand(&[2, -1])?.mul(0.5)?,
            11 => {
                // a multiply and an add in bf16 (the casts round alike on both sides)
                half = half.and(HalfOps::of(DType::BF16, 2));
                x.to_dtype(DType::BF16)?.mul(1.5)?.add(0.5)?.to_dtype(DType::F32)?
            }
            12 => {
                // an integer detour: floor, cast, integer arithmetic, back to float
                let i = x.mul(4.0)?.floor()?.to_dtype(DType::I32)?;
                i.remainder(3)?.sub(&i)?.to_dtype(DType::F32)?
            }
            13 => coil::where_(&x.gt(0.0)?, &x, x.mul(0.1)?)?,
            14 if rank >= 2 => x.permute(&(0..rank).rev().collect::<Vec<_>>())?.logsumexp(&[0], false)?,
            15 => x.maximum(x.pow(2.0)?.sub(1.0)?)?,
            _ => x.add(1.0)?,
        };
        pool.push(y);
    }
    // Outputs: the last value, and sometimes an intermediate one too (several outputs per graph).
    let mut outs = vec![pool.last().unwrap().clone()];
    if pool.len() > 3 && rng.chance(50) {
        outs.push(pool[2 + rng.below(pool.len() - 3)].clone());
    }
    Ok((outs, half))
}

/// A program over the inputs: its outputs, and its ops computed in a 16-bit float.
type Program<'p> = &'p dyn Fn(&[Tensor]) -> coil::Result<(Vec<Tensor>, HalfOps)>;

/// Runs random program `seed` on one backend; `None` when it is not a valid program (shape
/// errors).
fn run(
    seed: u64,
    inputs: &Inputs,
    backend: Backend,
    device: coil::Device,
) -> Option<(coil::Result<Vec<Vec<f64>>>, HalfOps)> {
    run_program(&|a| program(seed, a), inputs, backend, device)
}

/// [`run`] for any program.
fn run_program(
    program: Program,
    inputs: &Inputs,
    backend: Backend,
    device: coil::Device,
) -> Option<(coil::Result<Vec<Vec<f64>>>, HalfOps)> {
    coil::set_backend(backend);
    coil::set_eager_tier(false);
    coil::set_default_device(device);
    let (outs, half) = program(&inputs.tensors(device)).ok()?;
    Some((outs.iter().map(|t| t.to_vec::<f64>()).collect(), half))
}

fn rel_error(a: &[f64], b: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        if x.is_finite() && y.is_finite() {
            num += (x - y) * (x - y);
            den += y * y;
        } else if !(x.is_nan() && y.is_nan()) && x != y {
            return f64::INFINITY;
        }
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

fn check(seed: u64, device: coil::Device) -> Result<bool, String> {
    let mut rng = Rng(seed ^ 0xC011);
    let inputs = Inputs::new(&mut rng);
    check_program(&format!("seed {seed}"), &|a| program(seed, a), &inputs, device)
}

/// Whether `program` compiled on `device` agrees with the interpreter on `inputs`: `Ok(false)`
/// when it is not a valid program, `Err` (naming it `what`) when they disagree.
fn check_program(what: &str, program: Program, inputs: &Inputs, device: coil::Device) -> Result<bool, String> {
    let Some((reference, half)) = run_program(program, inputs, Backend::Interpreter, coil::Device::Cpu) else {
        return Ok(false);
    };
    let (compiled, _) =
        run_program(program, inputs, Backend::Compiled, device).expect("the program was valid on the interpreter");
    let tolerance = tolerance(half, F32_TOLERANCE);
    let seed = what;
    let describe = || {
        coil::set_backend(Backend::Interpreter);
        coil::set_default_device(coil::Device::Cpu);
        let (outs, _) = program(&inputs.tensors(coil::Device::Cpu)).unwrap();
        coil::capture(&outs.iter().collect::<Vec<_>>()).graph.to_string()
    };
    match (reference, compiled) {
        (Err(_), Err(_)) => Ok(true),
        (Ok(r), Ok(c)) => {
            for (k, (r, c)) in r.iter().zip(&c).enumerate() {
                let err = rel_error(c, r);
                if err > tolerance {
                    return Err(format!(
                        "{seed}: output {k} differs (relative error {err:.2e}, allowed {tolerance:.2e} for {half:?})\n{}",
                        describe()
                    ));
                }
            }
            Ok(true)
        }
        (r, c) => Err(format!(
            "{seed}: interpreter gives {:?}, compiled gives {:?}\n{}",
            r.map(|_| "values"),
            c.map(|_| "values"),
            describe()
        )),
    }
}

/// Runs the random programs compiled on `device` against the interpreter; reports every
/// disagreement at once.
pub fn check_all(device: coil::Device) {
    let seeds: Vec<u64> = match std::env::var("COIL_DIFF_SEED") {
        Ok(s) => vec![s.parse().expect("COIL_DIFF_SEED is a number")],
        Err(_) => (0..300).collect(),
    };
    let mut failures = Vec::new();
    let mut valid = 0;
    for seed in seeds {
        match check(seed, device) {
            Ok(true) => valid += 1,
            Ok(false) => {}
            Err(e) => failures.push(e),
        }
    }
    println!("differential on {device}: {valid} valid programs, {} disagree", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(valid >= 200, "only {valid} of the random programs were valid");
}

/// A program of fixed ops over the inputs: its outputs, and its ops computed in a 16-bit float.
type Fixed = fn(&[Tensor]) -> coil::Result<(Vec<Tensor>, HalfOps)>;

/// Rows long enough to be split over a cluster of blocks on sm_90 (8193 to 65536 elements):
/// the random programs on inputs of such shapes, and softmax, log_softmax, argmax, variance and
/// a bf16 layer norm along the long dim, against the interpreter.
pub fn check_long_rows(device: coil::Device) {
    let fixed: [(&str, Fixed); 5] = [
        ("softmax", |a| Ok((vec![a[0].softmax(-1)?], HalfOps::NONE))),
        ("log_softmax", |a| Ok((vec![a[0].add(&a[1])?.log_softmax(-1)?], HalfOps::NONE))),
        ("argmax", |a| Ok((vec![a[0].argmax(Some(-1), true)?.to_dtype(DType::F32)?], HalfOps::NONE))),
        ("var", |a| Ok((vec![a[0].var(&[-1], 1.0, true)?.mul(&a[1])?], HalfOps::NONE))),
        ("layer_norm_bf16", |a| {
            // computed in f32 inside (as PyTorch's), one rounding of the result to bf16
            let n = *a[0].shape().last().unwrap();
            let y = a[0].to_dtype(DType::BF16)?.layer_norm(&[n], None, None, 1e-5)?;
            Ok((vec![y.to_dtype(DType::F32)?], HalfOps::of(DType::BF16, 1)))
        }),
    ];
    check_shapes("long rows", &[&[3, 20000], &[2, 65536], &[5, 12289]], &fixed, 8, 20, device);
}

/// Sums, means, maxima, argmax and variance over dim 0: the fixed programs of the column checks.
const COLUMN_PROGRAMS: [(&str, Fixed); 5] = [
    ("sum", |a| Ok((vec![a[0].sum(&[0], false)?], HalfOps::NONE))),
    ("mean_of_product", |a| Ok((vec![a[0].mul(&a[1])?.mean(&[0], true)?.add(&a[1])?], HalfOps::NONE))),
    ("amax", |a| Ok((vec![a[0].amax(&[0], false)?.exp()?], HalfOps::NONE))),
    ("argmax", |a| Ok((vec![a[0].argmax(Some(0), false)?.to_dtype(DType::F32)?], HalfOps::NONE))),
    ("var", |a| Ok((vec![a[0].var(&[0], 1.0, false)?], HalfOps::NONE))),
];

/// Reductions down the columns of wide inputs (8192 outputs or more: the GPU's column plan
/// with vectors of outputs per thread, where it is one pass): the random programs on such
/// shapes, [`COLUMN_PROGRAMS`] and a bf16 sum over dim 0.
pub fn check_wide_columns(device: coil::Device) {
    let mut fixed = COLUMN_PROGRAMS.to_vec();
    // accumulated in f32 (f64 on the interpreter), one rounding of the sum to bf16
    fixed.push(("sum_bf16", |a| {
        Ok((vec![a[0].to_dtype(DType::BF16)?.sum(&[0], false)?.to_dtype(DType::F32)?], HalfOps::of(DType::BF16, 1)))
    }));
    check_shapes("wide columns", &[&[40, 8192], &[7, 16384], &[300, 8192]], &fixed, 6, 20, device);
}

/// Reductions down long columns (more rows than a persistent kernel holds, 65536 on sm_90;
/// a multiple of 32 columns: the GPU's looped column plan): the random programs on such a
/// shape, and [`COLUMN_PROGRAMS`].
pub fn check_long_columns(device: coil::Device) {
    check_shapes("long columns", &[&[66000, 64]], &COLUMN_PROGRAMS, 6, 7, device);
}

/// The `fixed` programs and random programs `0..seeds` on inputs of each of `shapes`, against
/// the interpreter; at least `min_valid` of them must be valid programs.
fn check_shapes(
    what: &str,
    shapes: &[&[usize]],
    fixed: &[(&str, Fixed)],
    seeds: u64,
    min_valid: usize,
    device: coil::Device,
) {
    let (mut failures, mut valid) = (Vec::new(), 0);
    for (n, shape) in shapes.iter().enumerate() {
        let mut rng = Rng(n as u64 ^ 0x10E6);
        let inputs = inputs_of(&mut rng, shape);
        let mut outcome = |what: String, r: Result<bool, String>| match r {
            Ok(ok) => valid += ok as usize,
            Err(e) => failures.push(format!("{what} at {shape:?}: {e}")),
        };
        for (name, f) in fixed {
            outcome(name.to_string(), check_program(name, f, &inputs, device));
        }
        for seed in 0..seeds {
            outcome(
                format!("seed {seed}"),
                check_program(&format!("seed {seed}"), &|a| program(seed, a), &inputs, device),
            );
        }
    }
    println!("{what} on {device}: {valid} valid programs, {} disagree", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(valid >= min_valid, "only {valid} of the {what} programs were valid");
}

/// Inputs of `shape` with random values.
fn inputs_of(rng: &mut Rng, shape: &[usize]) -> Inputs {
    let n: usize = shape.iter().product();
    let mut make = || (0..n).map(|_| rng.normal() as f32).collect::<Vec<f32>>();
    let (a, b) = (make(), make());
    Inputs(vec![(shape.to_vec(), a), (shape.to_vec(), b)])
}

/// Dynamic shapes: each random program as a compiled function whose inputs have dim 0 marked
/// dynamic, called at three sizes of that dim; every call must agree with the same program
/// compiled for static sizes. Most
/// programs compile once; a program whose sizes do not follow from the symbol (or that coil
/// guessed wrong at the first size) recompiles, which costs time but never a wrong value.
pub fn check_all_dynamic(device: coil::Device) {
    let (mut failures, mut valid, mut once) = (Vec::new(), 0, 0);
    let seeds: Vec<u64> = match std::env::var("COIL_DIFF_SEED") {
        Ok(s) => vec![s.parse().expect("COIL_DIFF_SEED is a number")],
        Err(_) => (0..60).collect(),
    };
    for seed in seeds {
        let mut rng = Rng(seed ^ 0xD1A);
        let mut shape = Inputs::new(&mut rng).0[0].0.clone();
        shape[0] = shape[0].max(2);
        let f = coil::compile(move |a: &[Tensor]| program(seed, a).map(|(outs, _)| outs));
        let mut ok = true;
        for n in [shape[0], shape[0] + 3, 2 * shape[0] + 5] {
            shape[0] = n;
            let inputs = inputs_of(&mut rng, &shape);
            // The reference: the same program compiled for these static sizes (itself checked
            // against the interpreter by `check_all`).
            let Some((Ok(reference), half)) = run(seed, &inputs, Backend::Compiled, device) else {
                ok = false;
                break;
            };
            coil::set_backend(Backend::Compiled);
            coil::set_eager_tier(false);
            coil::set_default_device(device);
            let args = inputs.tensors(device);
            for t in &args {
                t.mark_dynamic(0).unwrap();
            }
            let got: coil::Result<Vec<Vec<f64>>> =
                f.call(&args.iter().collect::<Vec<_>>()).and_then(|o| o.iter().map(|t| t.to_vec::<f64>()).collect());
            let tolerance = tolerance(half, F32_TOLERANCE_BETWEEN_COMPILED);
            match got {
                Ok(got) => {
                    for (k, (c, r)) in got.iter().zip(&reference).enumerate() {
                        let err = rel_error(c, r);
                        if err > tolerance {
                            failures.push(format!("seed {seed} at {shape:?}: output {k} differs ({err:.2e})"));
                        }
                    }
                }
                Err(e) => failures.push(format!("seed {seed} at {shape:?}: {e}")),
            }
        }
        if ok {
            valid += 1;
            once += (f.compile_count() == 1) as usize;
        }
    }
    println!(
        "dynamic differential on {device}: {valid} valid programs, {once} compiled once, {} disagree",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // (A single seed from COIL_DIFF_SEED is one program.)
    let enough = if std::env::var("COIL_DIFF_SEED").is_ok() { 1 } else { 40 };
    assert!(valid >= enough && once * 2 >= valid, "{valid} valid programs, only {once} served by one compile");
}
