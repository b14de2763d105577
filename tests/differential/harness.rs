//! The differential-test harness, shared by `tests/differential/main.rs` (CPU) and
//! `tests/gpu.rs` (CUDA).
//!
//! Differential tests: random programs run compiled and on the reference interpreter, on random
//! data (never zeros), must agree within the dtype's tolerance.
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

/// Builds one random program over the inputs; returns its outputs, and whether it rounds
/// through bf16 (then the backends may differ by bf16's precision: the compiled code computes
/// bf16 values in f32 and rounds at stores and casts, the interpreter after every op).
fn program(seed: u64, inputs: &[Tensor]) -> coil::Result<(Vec<Tensor>, bool)> {
    let mut rng = Rng(seed);
    let mut pool: Vec<Tensor> = inputs.to_vec();
    let mut bf16 = false;
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
                bf16 = true;
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
    Ok((outs, bf16))
}

/// A program over the inputs: its outputs, and whether it rounds through bf16.
type Program<'p> = &'p dyn Fn(&[Tensor]) -> coil::Result<(Vec<Tensor>, bool)>;

/// Runs random program `seed` on one backend; `None` when it is not a valid program (shape
/// errors).
fn run(
    seed: u64,
    inputs: &Inputs,
    backend: Backend,
    device: coil::Device,
) -> Option<(coil::Result<Vec<Vec<f64>>>, bool)> {
    run_program(&|a| program(seed, a), inputs, backend, device)
}

/// [`run`] for any program.
fn run_program(
    program: Program,
    inputs: &Inputs,
    backend: Backend,
    device: coil::Device,
) -> Option<(coil::Result<Vec<Vec<f64>>>, bool)> {
    coil::set_backend(backend);
    coil::set_default_device(device);
    let (outs, bf16) = program(&inputs.tensors(device)).ok()?;
    Some((outs.iter().map(|t| t.to_vec::<f64>()).collect(), bf16))
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
    let Some((reference, bf16)) = run_program(program, inputs, Backend::Interpreter, coil::Device::Cpu) else {
        return Ok(false);
    };
    let (compiled, _) =
        run_program(program, inputs, Backend::Compiled, device).expect("the program was valid on the interpreter");
    let tolerance = if bf16 { 2e-2 } else { 1e-4 };
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
                    return Err(format!("{seed}: output {k} differs (relative error {err:.2e})\n{}", describe()));
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

/// A program of fixed ops over the inputs: its outputs, and whether it rounds through bf16.
type Fixed = fn(&[Tensor]) -> coil::Result<(Vec<Tensor>, bool)>;

/// Rows long enough to be split over a cluster of blocks on sm_90 (8193 to 65536 elements):
/// the random programs on inputs of such shapes, and softmax, log_softmax, argmax, variance and
/// a bf16 layer norm along the long dim, against the interpreter.
pub fn check_long_rows(device: coil::Device) {
    let fixed: [(&str, Fixed); 5] = [
        ("softmax", |a| Ok((vec![a[0].softmax(-1)?], false))),
        ("log_softmax", |a| Ok((vec![a[0].add(&a[1])?.log_softmax(-1)?], false))),
        ("argmax", |a| Ok((vec![a[0].argmax(Some(-1), true)?.to_dtype(DType::F32)?], false))),
        ("var", |a| Ok((vec![a[0].var(&[-1], 1.0, true)?.mul(&a[1])?], false))),
        ("layer_norm_bf16", |a| {
            let n = *a[0].shape().last().unwrap();
            Ok((vec![a[0].to_dtype(DType::BF16)?.layer_norm(&[n], None, None, 1e-5)?.to_dtype(DType::F32)?], true))
        }),
    ];
    check_shapes("long rows", &[&[3, 20000], &[2, 65536], &[5, 12289]], &fixed, 8, 20, device);
}

/// Sums, means, maxima, argmax and variance over dim 0: the fixed programs of the column checks.
const COLUMN_PROGRAMS: [(&str, Fixed); 5] = [
    ("sum", |a| Ok((vec![a[0].sum(&[0], false)?], false))),
    ("mean_of_product", |a| Ok((vec![a[0].mul(&a[1])?.mean(&[0], true)?.add(&a[1])?], false))),
    ("amax", |a| Ok((vec![a[0].amax(&[0], false)?.exp()?], false))),
    ("argmax", |a| Ok((vec![a[0].argmax(Some(0), false)?.to_dtype(DType::F32)?], false))),
    ("var", |a| Ok((vec![a[0].var(&[0], 1.0, false)?], false))),
];

/// Reductions down the columns of wide inputs (8192 outputs or more: the GPU's column plan
/// with vectors of outputs per thread, where it is one pass): the random programs on such
/// shapes, [`COLUMN_PROGRAMS`] and a bf16 sum over dim 0.
pub fn check_wide_columns(device: coil::Device) {
    let mut fixed = COLUMN_PROGRAMS.to_vec();
    fixed.push(("sum_bf16", |a| Ok((vec![a[0].to_dtype(DType::BF16)?.sum(&[0], false)?.to_dtype(DType::F32)?], true))));
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
            let Some((Ok(reference), bf16)) = run(seed, &inputs, Backend::Compiled, device) else {
                ok = false;
                break;
            };
            coil::set_backend(Backend::Compiled);
            coil::set_default_device(device);
            let args = inputs.tensors(device);
            for t in &args {
                t.mark_dynamic(0).unwrap();
            }
            let got: coil::Result<Vec<Vec<f64>>> =
                f.call(&args.iter().collect::<Vec<_>>()).and_then(|o| o.iter().map(|t| t.to_vec::<f64>()).collect());
            let tolerance = if bf16 { 1e-2 } else { 1e-5 };
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
