//! The workload suite of `../shared/bench/WORKLOADS.md`, run through coil's compiled pipeline.
//!
//! ```sh
//! cargo run --release --example bench -- --compare-interpreter          # CPU, default scale
//! cargo run --release --example bench -- --scale 0.2 --only softmax_f32_8192x4096,full_sum_f32_256M --json out.json
//! ```
//!
//! Each workload is a function that builds its (random normal) inputs at a scale and names a
//! program `fn(&[Tensor]) -> Result<Vec<Tensor>>`; one mechanism ([`run`]) compiles the program
//! once with `coil::inspect` (cold: the first compile of that graph in this process; the `cc`
//! column says whether the C or NVRTC compiler ran or the disk cache answered), then times only
//! the compiled runs with `Compiled::time_runs`: `--warmup` runs, then `--reps` timed runs,
//! median; CUDA events around each run on the GPU (`--device cuda`, full size by default), the
//! wall clock on the CPU, where the minor page faults of the timed runs are counted too
//! (`flt/run`: nonzero when a run writes fresh memory instead of reusing the host cache's). Outputs are checked against the reference interpreter run on float64 copies of the same
//! inputs: the programs write their casts relative to the input dtype (`wide(bf16) = f32`,
//! `wide(f64) = f64`, and "cast back to the input dtype"), so on f64 inputs every cast is a no-op
//! and the reference is the same formula evaluated in float64 throughout.
//! `relerr = ||coil - ref|| / ||ref||` (the largest over a workload's outputs).
//!
//! Scale (`--scale F`, default 0.05 on the CPU and 1 on the GPU): the leading dim (rows, batch; the length of a
//! 1-D workload) is `max(1, round(n * F))`; other dims stay as WORKLOADS.md defines them, so rows
//! keep their length (col_sum's summed dim is its leading dim and shrinks). The two matmul
//! workloads (and the training step) also shrink their inner dims when F < 1: mlp's D and H become
//! `max(64, round(n * sqrt(F) / 64) * 64)`; the GPT-2 block's T becomes the same with 16 instead of
//! 64, and its heads `max(1, round(12 * sqrt(F)))` of 64 channels each (C = 64 * heads).
//! GB/s and TFLOP/s use WORKLOADS.md's min bytes / flops at the scaled sizes.
//!
//! Inputs: `coil::manual_seed(0)` + `Tensor::randn` (weights times 0.02 as in torch_suite.py;
//! the GPT-2 block's layer-norm weights are `1 + 0.1 * randn` and its biases `0.02 * randn`
//! instead of torch_suite's ones and zeros, so no input is constant); class targets are i64 in
//! range. `mlp_train_step_f32` returns the gradients of its loss (`coil::grad`): forward and
//! backward compile as one graph, as torch.compile's AOTAutograd does. `--json` writes
//! WORKLOADS.md's schema (failed workloads are left out of its rows); the exit status
//! is 1 when a workload failed. Run with `--help` for the flags. On the 2-core build machine the
//! whole suite with `--compare-interpreter` takes about a minute at the default scale.

use coil::{Backend, Buffer, CrossEntropyOptions, DType, Result, Tensor};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

#[path = "bench/process.rs"]
mod process;
use process::{children_cpu_seconds, minor_faults};

const HELP: &str = "\
usage: bench [--device cpu|cuda] [--only NAME,NAME] [--scale F] [--json PATH]
             [--warmup N] [--reps N] [--compare-interpreter] [--dynamic] [--emit-cuda DIR] [--help]

  --device D              cpu or cuda (default: cpu; cuda exits with status 2 when no GPU is usable)
  --only NAMES            run only these workloads (comma-separated WORKLOADS.md names)
  --scale F               size factor (default 0.05 on the CPU): leading (row/batch) dim, or the
                          length of a 1-D workload, becomes max(1, round(n*F)); inner dims stay,
                          except in the matmul workloads when F < 1: mlp's D, H become
                          max(64, round(n*sqrt(F)/64)*64), the GPT-2 block's T the same with 16,
                          its heads max(1, round(12*sqrt(F))) with C = 64*heads
  --json PATH             write {\"device\", \"rows\": [{name, us, kernels, compile_s, warm_compile_s, relerr,
                          peak_bytes, minor_faults_per_run, compile_cpu_s (CPU; null elsewhere)}]}
  --warmup N              untimed runs before timing (default 3)
  --reps N                timed runs; the median is reported (default 20)
  --compare-interpreter   also time the reference interpreter (one run, no warm-up: capture,
                          decompose, interpret) and print the speedup of the compiled graph
  --dynamic               also compile each workload with its leading dim symbolic (dynamic
                          shapes: sizes passed to the kernels) and print its time next to the
                          static graph's (dyn_us, dyn/static; `static` when it fell back)
  --emit-cuda DIR          run nothing: write the CUDA kernels each workload compiles to (at --scale,
                          default 1) to DIR/<workload>/<kernel>.cu, and their PTX for sm_90 where
                          the PTX emitter covers them (<kernel>.ptx); needs no GPU
  --help                  this text

With COIL_PROFILE=1 each workload also prints the device time of each of its launches
(median over --reps runs, CUDA events between launches).
";

type Program = fn(&[Tensor]) -> Result<Vec<Tensor>>;

/// One workload at one scale: its inputs (lazy until `run` realizes them) and its program.
struct Case {
    shape: String,
    inputs: Vec<Tensor>,
    program: Program,
    /// WORKLOADS.md's min bytes (bandwidth workloads) or flops (matmul workloads); the other is 0.
    bytes: f64,
    flops: f64,
    /// The inputs whose dim 0 is the batch (`--dynamic` marks it); `None`: input 0 and the
    /// inputs of rank >= 2 with the same leading size.
    batched: Option<Vec<usize>>,
}

/// Builds a workload's case at a scale.
type MakeCase = fn(f64) -> Result<Case>;

/// The suite, in WORKLOADS.md's order.
const WORKLOADS: &[(&str, MakeCase)] = &[
    ("pointwise_chain_f32", pointwise_chain),
    ("bias_gelu_bf16", bias_gelu),
    ("softmax_f32_8192x4096", |s| softmax(s, 8192, 4096)),
    ("softmax_f32_1024x65536", |s| softmax(s, 1024, 65536)),
    ("layernorm_bf16_8192x4096", layernorm),
    ("rmsnorm_bf16_8192x4096", rmsnorm),
    ("add_layernorm_bf16_8192x4096", add_layernorm),
    ("col_sum_f32_8192x8192", col_sum),
    ("full_sum_f32_256M", full_sum),
    ("cross_entropy_bf16_8192x50304", cross_entropy),
    ("mlp_bf16_8192x4096x16384", mlp),
    ("gpt2_block_fwd_bf16_b8_t1024", gpt2_block),
    ("mlp_train_step_f32", mlp_train_step),
];
// ---- scaling and inputs ----

/// The scaled leading dim: `max(1, round(n * f))`.
fn rows(n: usize, f: f64) -> usize {
    ((n as f64 * f).round() as usize).max(1)
}

/// A matmul workload's scaled inner dim: unchanged for `f >= 1`, else `n * sqrt(f)` rounded to a
/// multiple of `m` (at least `m`).
fn inner(n: usize, f: f64, m: usize) -> usize {
    if f >= 1.0 {
        return n;
    }
    (((n as f64 * f.sqrt() / m as f64).round() as usize) * m).max(m)
}

/// Random normal values times `k`.
fn randn(shape: &[usize], dtype: DType, k: f64) -> Result<Tensor> {
    let t = Tensor::randn(shape, dtype)?;
    Ok(if k == 1.0 { t } else { t.mul(k)? })
}

/// The dtype a program widens to: f32 for the 16-bit floats (as the PyTorch formulas do), f64
/// stays f64 (so the reference run on f64 inputs never rounds).
fn wide(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Bytes of `numel` elements of `d`.
fn nbytes(numel: usize, d: DType) -> f64 {
    numel as f64 * if d == DType::BF16 { 2.0 } else { 4.0 }
}

fn case(shape: String, inputs: Vec<Tensor>, program: Program, bytes: f64, flops: f64) -> Case {
    Case { shape, inputs, program, bytes, flops, batched: None }
}

// ---- the workloads (torch_suite.py holds the PyTorch definitions) ----

fn pointwise_chain(s: f64) -> Result<Case> {
    let n = rows(64 << 20, s);
    let p: Program = |a| Ok(vec![a[0].exp()?.add(1.0)?.log()?.mul(0.5)?]);
    Ok(case(format!("x[{n}] f32"), vec![randn(&[n], DType::F32, 1.0)?], p, 2.0 * nbytes(n, DType::F32), 0.0))
}

fn bias_gelu(s: f64) -> Result<Case> {
    let (r, c) = (rows(8192, s), 8192);
    let inputs = vec![randn(&[r, c], DType::BF16, 1.0)?, randn(&[c], DType::BF16, 1.0)?];
    let p: Program = |a| Ok(vec![a[0].add(&a[1])?.gelu(true)?]);
    let bytes = 2.0 * nbytes(r * c, DType::BF16) + nbytes(c, DType::BF16);
    Ok(case(format!("x[{r},{c}] bf16"), inputs, p, bytes, 0.0))
}

fn softmax(s: f64, r: usize, c: usize) -> Result<Case> {
    let r = rows(r, s);
    let p: Program = |a| Ok(vec![a[0].softmax(-1)?]);
    Ok(case(format!("x[{r},{c}] f32"), vec![randn(&[r, c], DType::F32, 1.0)?], p, 2.0 * nbytes(r * c, DType::F32), 0.0))
}

/// x:[8192*s, 4096] bf16 and `k` vectors of 4096 bf16.
fn norm_inputs(s: f64, xs: usize, k: usize) -> Result<(String, Vec<Tensor>, f64)> {
    let (r, c) = (rows(8192, s), 4096);
    let mut inputs = Vec::new();
    for _ in 0..xs {
        inputs.push(randn(&[r, c], DType::BF16, 1.0)?);
    }
    for _ in 0..k {
        inputs.push(randn(&[c], DType::BF16, 1.0)?);
    }
    Ok((format!("x[{r},{c}] bf16"), inputs, nbytes(r * c, DType::BF16)))
}

fn layernorm(s: f64) -> Result<Case> {
    let (shape, inputs, x) = norm_inputs(s, 1, 2)?;
    let p: Program = |a| Ok(vec![a[0].layer_norm(&[a[0].shape()[1]], Some(&a[1]), Some(&a[2]), 1e-5)?]);
    Ok(case(shape, inputs, p, 2.0 * x, 0.0))
}

fn rmsnorm(s: f64) -> Result<Case> {
    let (shape, inputs, x) = norm_inputs(s, 1, 1)?;
    let p: Program = |a| {
        let (x, w) = (&a[0], &a[1]);
        let xf = x.to_dtype(wide(x.dtype()))?;
        let r = xf.pow(2.0)?.mean(&[-1], true)?.add(1e-6)?.rsqrt()?;
        Ok(vec![xf.mul(&r)?.to_dtype(x.dtype())?.mul(w)?])
    };
    Ok(case(shape, inputs, p, 2.0 * x, 0.0))
}

fn add_layernorm(s: f64) -> Result<Case> {
    let (shape, inputs, x) = norm_inputs(s, 2, 2)?;
    let p: Program = |a| {
        let h = a[0].add(&a[1])?;
        let y = h.layer_norm(&[h.shape()[1]], Some(&a[2]), Some(&a[3]), 1e-5)?;
        Ok(vec![h, y])
    };
    Ok(case(shape, inputs, p, 4.0 * x, 0.0))
}

fn col_sum(s: f64) -> Result<Case> {
    let (r, c) = (rows(8192, s), 8192);
    let p: Program = |a| Ok(vec![a[0].sum(&[0], false)?]);
    Ok(case(format!("x[{r},{c}] f32"), vec![randn(&[r, c], DType::F32, 1.0)?], p, nbytes(r * c, DType::F32), 0.0))
}

fn full_sum(s: f64) -> Result<Case> {
    let n = rows(256 << 20, s);
    let p: Program = |a| Ok(vec![a[0].sum_all()?]);
    Ok(case(format!("x[{n}] f32"), vec![randn(&[n], DType::F32, 1.0)?], p, nbytes(n, DType::F32), 0.0))
}

fn cross_entropy(s: f64) -> Result<Case> {
    let (r, v) = (rows(8192, s), 50304);
    let inputs = vec![randn(&[r, v], DType::BF16, 1.0)?, class_targets(r, v)?];
    let p: Program =
        |a| Ok(vec![a[0].to_dtype(wide(a[0].dtype()))?.cross_entropy(&a[1], CrossEntropyOptions::default())?]);
    let c = case(format!("logits[{r},{v}] bf16"), inputs, p, nbytes(r * v, DType::BF16), 0.0);
    Ok(Case { batched: Some(vec![0, 1]), ..c })
}

/// `n` class targets in [0, classes), from a splitmix64 stream (deterministic, exactly in range).
fn class_targets(n: usize, classes: usize) -> Result<Tensor> {
    let mut z = 0x9E37_79B9_7F4A_7C15u64;
    let targets: Vec<i64> = (0..n)
        .map(|_| {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((x ^ (x >> 31)) % classes as u64) as i64
        })
        .collect();
    Tensor::from_vec(targets, &[n])
}

/// Gradients of a 3-layer MLP's cross-entropy loss with respect to its weights (one training
/// step's forward and backward, as torch_suite.py's `torch.autograd.grad`).
fn mlp_train_step(s: f64) -> Result<Case> {
    let (n, d, h, k) = (rows(4096, s), inner(1024, s, 64), inner(4096, s, 64), inner(1000, s, 8));
    let f = DType::F32;
    let inputs = vec![
        randn(&[n, d], f, 1.0)?,
        class_targets(n, k)?,
        randn(&[h, d], f, 0.02)?,
        randn(&[h, h], f, 0.02)?,
        randn(&[k, h], f, 0.02)?,
    ];
    let p: Program = |a| {
        let x = a[0].linear(&a[2], None)?.gelu(false)?;
        let x = x.linear(&a[3], None)?.gelu(false)?;
        let loss = x.linear(&a[4], None)?.cross_entropy(&a[1], CrossEntropyOptions::default())?;
        coil::grad(&loss, &[&a[2], &a[3], &a[4]])
    };
    let flops = 3.0 * 2.0 * (n * (d * h + h * h + h * k)) as f64;
    let c = case(format!("N{n} D{d} H{h} K{k} f32"), inputs, p, 0.0, flops);
    Ok(Case { batched: Some(vec![0, 1]), ..c })
}

fn mlp(s: f64) -> Result<Case> {
    let (m, d, h) = (rows(8192, s), inner(4096, s, 64), inner(16384, s, 64));
    let bf = DType::BF16;
    let inputs = vec![
        randn(&[m, d], bf, 1.0)?,
        randn(&[h, d], bf, 0.02)?,
        randn(&[h], bf, 1.0)?,
        randn(&[d, h], bf, 0.02)?,
        randn(&[d], bf, 1.0)?,
    ];
    let p: Program = |a| Ok(vec![a[0].linear(&a[1], Some(&a[2]))?.gelu(true)?.linear(&a[3], Some(&a[4]))?]);
    let flops = 2.0 * 2.0 * (m * d * h) as f64;
    Ok(case(format!("M{m} D{d} H{h} bf16"), inputs, p, 0.0, flops))
}

const HEAD_DIM: usize = 64;

fn gpt2_block(s: f64) -> Result<Case> {
    let (b, t) = (rows(8, s), inner(1024, s, 16));
    let heads = if s >= 1.0 { 12 } else { ((12.0 * s.sqrt()).round() as usize).max(1) };
    let c = heads * HEAD_DIM;
    let bf = DType::BF16;
    let ln_w = || randn(&[c], bf, 0.1)?.add(1.0);
    let inputs = vec![
        randn(&[b, t, c], bf, 1.0)?,
        ln_w()?,                       // ln1_w
        randn(&[c], bf, 0.02)?,        // ln1_b
        randn(&[3 * c, c], bf, 0.02)?, // attn_w
        randn(&[3 * c], bf, 0.02)?,    // attn_b
        randn(&[c, c], bf, 0.02)?,     // proj_w
        randn(&[c], bf, 0.02)?,        // proj_b
        ln_w()?,                       // ln2_w
        randn(&[c], bf, 0.02)?,        // ln2_b
        randn(&[4 * c, c], bf, 0.02)?, // fc_w
        randn(&[4 * c], bf, 0.02)?,    // fc_b
        randn(&[c, 4 * c], bf, 0.02)?, // fc2_w
        randn(&[c], bf, 0.02)?,        // fc2_b
    ];
    let (bt, cc) = ((b * t) as f64, c as f64);
    let flops = 2.0 * bt * (cc * 3.0 * cc + cc * cc + 8.0 * cc * cc) + 2.0 * 2.0 * bt * t as f64 * cc;
    Ok(case(format!("B{b} T{t} C{c} H{heads} bf16"), inputs, gpt2_block_program, 0.0, flops))
}

/// torch_suite.py's `gpt2_block`: causal attention written out, softmax in f32 (`wide`).
fn gpt2_block_program(a: &[Tensor]) -> Result<Vec<Tensor>> {
    let x = &a[0];
    let (dt, b, t, c) = (x.dtype(), x.shape()[0] as i64, x.shape()[1], x.shape()[2]);
    let (nh, hd) = ((c / HEAD_DIM) as i64, HEAD_DIM as i64);
    let h = x.layer_norm(&[c], Some(&a[1]), Some(&a[2]), 1e-5)?;
    let qkv = h.linear(&a[3], Some(&a[4]))?.split(c, 2)?;
    let heads = |p: &Tensor| p.view(&[b, t as i64, nh, hd])?.transpose(1, 2);
    let (q, k, v) = (heads(&qkv[0])?, heads(&qkv[1])?, heads(&qkv[2])?);
    let att = q.matmul(&k.transpose(-2, -1)?)?.mul(1.0 / (hd as f64).sqrt())?;
    let mask = Tensor::ones(&[t, t], DType::Bool).tril(0)?;
    let att = coil::where_(&mask, &att, f64::NEG_INFINITY)?;
    let att = att.to_dtype(wide(dt))?.softmax(-1)?.to_dtype(dt)?;
    let y = att.matmul(&v)?.transpose(1, 2)?.contiguous().view(&[b, t as i64, c as i64])?;
    let x = x.add(&y.linear(&a[5], Some(&a[6]))?)?;
    let h = x.layer_norm(&[c], Some(&a[7]), Some(&a[8]), 1e-5)?;
    let m = h.linear(&a[9], Some(&a[10]))?.gelu(true)?.linear(&a[11], Some(&a[12]))?;
    Ok(vec![x.add(&m)?])
}

// ---- the mechanism ----

struct Opts {
    scale: f64,
    warmup: usize,
    reps: usize,
    interp: bool,
    /// Also compile with the leading (row) dim symbolic and time that graph.
    dynamic: bool,
    device: coil::Device,
    /// `--emit-cuda DIR`: write the workloads' CUDA kernels there instead of running them.
    emit_cuda: Option<String>,
}

/// The same workload compiled with its leading dim symbolic (`--dynamic`).
struct DynamicRow {
    us: f64,
    /// Whether the graph really compiled for symbolic sizes (else it fell back to static).
    symbolic: bool,
    /// Largest relative difference from the static graph's outputs.
    relerr: f64,
}

struct Row {
    /// The warm compile's stages (printed with `COIL_PROFILE=1`).
    warm_stages: coil_frontend::compile::StageTimes,
    dynamic: Option<DynamicRow>,
    /// Time per launch (`COIL_PROFILE=1`), with the launch shape of generated kernels.
    profile: Vec<(String, f64, String)>,
    us: f64,
    kernels: u64,
    compile_s: f64,
    cc_s: f64,
    /// CPU seconds (user + system) of the C compiler processes the cold compile ran: `cc_s`
    /// less the time they waited for a core on a busy machine (Linux; `None` elsewhere).
    cc_cpu_s: Option<f64>,
    /// The same graph compiled again, the disk cache now warm (a second process's compile).
    warm_s: f64,
    relerr: f64,
    peak_bytes: u64,
    interp_us: Option<f64>,
    /// Minor page faults per timed run (the CPU on Linux).
    faults_per_run: Option<f64>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs `f` with `backend` set on this thread, then restores `prev`.
fn with_backend<T>(backend: Backend, prev: Backend, f: impl FnOnce() -> T) -> T {
    coil::set_backend(backend);
    let r = f();
    coil::set_backend(prev);
    r
}

fn refs(ts: &[Tensor]) -> Vec<&Tensor> {
    ts.iter().collect()
}

/// Compiles a case once, times the compiled graph, checks it against the f64 reference.
fn run(c: &Case, o: &Opts, home: Backend) -> Result<Row> {
    // Inputs: generated by the compiled path when it can, else by the interpreter.
    if coil::realize(&refs(&c.inputs)).is_err() {
        with_backend(Backend::Interpreter, home, || coil::realize(&refs(&c.inputs)))?;
    }
    let on_device: Vec<Tensor> = c.inputs.iter().map(|t| t.to_device(o.device)).collect::<Result<_>>()?;
    // Constants a program creates (masks, scalars) belong on the same device as its inputs.
    coil::set_default_device(o.device);
    let outs = (c.program)(&on_device);
    coil::set_default_device(coil::Device::Cpu);
    let outs = outs?;
    let children_before = children_cpu_seconds();
    let compiled = coil::inspect(&refs(&outs))?;
    let cc_cpu_s = children_before.zip(children_cpu_seconds()).map(|(a, b)| b - a);
    // The graph inputs, in the compiled graph's order, as host buffers (copied to the device
    // once by the timer).
    let captured = coil::capture(&refs(&outs));
    let hosts = captured.inputs.iter().map(|s| s.to_host()).collect::<Result<Vec<_>>>()?;
    let bufs: Vec<&Buffer> = hosts.iter().map(|b| b.as_ref()).collect();
    // Device time per run: CUDA events around each run on the GPU, the wall clock on the CPU.
    // On the CPU the warm-up runs apart, so that the timed runs' minor page faults are counted
    // alone: a run that reuses cached memory makes none, one given fresh memory one per 4 KiB it
    // writes (about 1 us each on the build machine: 32768 of them took softmax's 8 ms to 40).
    let (times, faults_per_run) = if o.device == coil::Device::Cpu {
        compiled.time_runs(&bufs, o.warmup, 0)?;
        let before = minor_faults();
        let times = compiled.time_runs(&bufs, 0, o.reps.max(1))?;
        let faults = before.zip(minor_faults()).map(|(a, b)| b.saturating_sub(a) as f64 / times.len() as f64);
        (times, faults)
    } else {
        (compiled.time_runs(&bufs, o.warmup, o.reps.max(1))?, None)
    };
    let result = compiled.run_host(&bufs)?;

    // Reference: the same program on f64 copies of the inputs. On the CPU the reference
    // interpreter runs it; on the GPU the interpreter would take hours at full size (the MLP is
    // 10^12 multiply-adds), so the f64 program runs compiled on the same GPU (the compiled path is
    // itself checked against the interpreter by the golden and differential tests).
    let wide_inputs: Vec<Tensor> = c
        .inputs
        .iter()
        .map(|t| {
            let b = t.buffer()?;
            Ok(if b.dtype().is_float() {
                Tensor::from_buffer(Buffer::from_vec(b.to_vec::<f64>(), b.shape.clone()))
            } else {
                t.clone()
            })
        })
        .collect::<Result<_>>()?;
    let reference = if o.device == coil::Device::Cpu {
        let reference = (c.program)(&wide_inputs)?;
        with_backend(Backend::Interpreter, home, || coil::realize(&refs(&reference)))?;
        reference
    } else {
        let on_device: Vec<Tensor> = wide_inputs.iter().map(|t| t.to_device(o.device)).collect::<Result<_>>()?;
        coil::set_default_device(o.device);
        let reference = (c.program)(&on_device);
        coil::set_default_device(coil::Device::Cpu);
        let reference = reference?;
        with_backend(Backend::Compiled, home, || coil::realize(&refs(&reference)))?;
        reference
    };
    let mut relerr: f64 = 0.0;
    for (got, want) in result.iter().zip(&reference) {
        let (got, want) = (got.to_vec::<f64>(), want.to_vec::<f64>()?);
        if got.len() != want.len() {
            return Err(coil::Error::shape(format!("output has {} elements, reference {}", got.len(), want.len())));
        }
        let diff: f64 = got.iter().zip(&want).map(|(g, w)| (g - w) * (g - w)).sum();
        let norm: f64 = want.iter().map(|w| w * w).sum();
        relerr = relerr.max(diff.sqrt() / (norm.sqrt() + 1e-30));
    }

    // The interpreter on the original inputs, one run (it is slow): the program is recorded anew
    // (a realized tensor does not run again), then capture + decompose + interpret are timed.
    let interp_us = if o.interp {
        let outs = (c.program)(&c.inputs)?;
        let start = Instant::now();
        with_backend(Backend::Interpreter, home, || coil::realize(&refs(&outs)))?;
        Some(start.elapsed().as_secs_f64() * 1e6)
    } else {
        None
    };

    let dynamic = if o.dynamic { Some(run_dynamic(c, o, &on_device, &bufs, &result)?) } else { None };
    // A second process's compile: the same graph again, outside this process's graph cache,
    // its kernels now in the disk cache.
    let warm = coil_frontend::compile::compile_fresh(&captured.graph, o.device)?.times;
    let warm_s = warm.total;
    let summary: serde_json::Value = serde_json::from_str(&compiled.summary).unwrap_or_default();
    let profile = if coil::config().profile { compiled.profile(&bufs, o.warmup, o.reps.max(1))? } else { vec![] };
    // Each generated kernel's launch as it ran: grid x block, registers per thread, and the
    // autotuner's plan where it chose one.
    let launches = compiled.launches();
    let launch_of = |name: &str| match launches.iter().find(|l| l.name == name) {
        Some(l) => {
            let tuned = l.tuning.as_ref().map_or(String::new(), |t| format!(", tuned: {t}"));
            // the cold compile's own compiler (NVRTC, or ptxas for PTX) and module-load time of the kernel's unit
            let ms = |us: u64| us as f64 / 1e3;
            let nvrtc = format!(", {} {:.1} ms, load {:.1} ms", l.compiler, ms(l.compile_us), ms(l.load_us));
            format!("  (grid {} x {}, {} registers{tuned}{nvrtc})", l.grid, l.block, l.registers)
        }
        None => String::new(),
    };
    let profile = profile
        .into_iter()
        .map(|(k, us)| {
            let l = launch_of(&k);
            (k, us, l)
        })
        .collect();
    let count = |k: &str| summary[k].as_u64().unwrap_or(0);
    Ok(Row {
        dynamic,
        profile,
        us: median(times),
        kernels: count("generated_kernels") + count("extern_calls"),
        compile_s: compiled.times.total,
        cc_s: compiled.times.cc,
        cc_cpu_s,
        warm_s,
        warm_stages: warm,
        relerr,
        peak_bytes: count("peak_bytes"),
        interp_us,
        faults_per_run,
    })
}

/// `--dynamic`: the program compiled again with dim 0 of its batched inputs marked dynamic
/// (one symbol), timed on the same inputs, and compared with the static graph's outputs.
fn run_dynamic(
    c: &Case,
    o: &Opts,
    on_device: &[Tensor],
    bufs: &[&Buffer],
    static_out: &[Buffer],
) -> Result<DynamicRow> {
    let lead = on_device[0].shape().first().copied();
    let batched = c.batched.clone().unwrap_or_else(|| {
        let same = |t: &Tensor| t.rank() >= 2 && t.shape().first().copied() == lead;
        (0..on_device.len()).filter(|&i| i == 0 || same(&on_device[i])).collect()
    });
    for &i in &batched {
        on_device[i].mark_dynamic(0)?;
    }
    coil::set_default_device(o.device);
    let outs = (c.program)(on_device);
    coil::set_default_device(coil::Device::Cpu);
    let compiled = coil::inspect(&refs(&outs?))?;
    // Symbolic when the program has size symbols (extern-only graphs have no kernel to ask).
    let summary: serde_json::Value = serde_json::from_str(&compiled.summary).unwrap_or_default();
    let symbolic = summary["size_symbols"].as_array().is_some_and(|s| !s.is_empty());
    let times = compiled.time_runs(bufs, o.warmup, o.reps.max(1))?;
    let result = compiled.run_host(bufs)?;
    let mut relerr: f64 = 0.0;
    for (got, want) in result.iter().zip(static_out) {
        let (got, want) = (got.to_vec::<f64>(), want.to_vec::<f64>());
        let diff: f64 = got.iter().zip(&want).map(|(g, w)| (g - w) * (g - w)).sum();
        let norm: f64 = want.iter().map(|w| w * w).sum();
        relerr = relerr.max(diff.sqrt() / (norm.sqrt() + 1e-30));
    }
    Ok(DynamicRow { us: median(times), symbolic, relerr })
}

/// `--emit-cuda DIR`: each workload's CUDA kernels, generated on this machine (no GPU needed);
/// returns the exit status.
fn emit_cuda(o: &Opts, only: &[String], dir: &str, home: Backend) -> i32 {
    let mut status = 0;
    for &(name, make) in WORKLOADS.iter().filter(|(n, _)| only.is_empty() || only.iter().any(|o| o == n)) {
        coil::manual_seed(0);
        let sources = make(o.scale).and_then(|c| {
            if coil::realize(&refs(&c.inputs)).is_err() {
                with_backend(Backend::Interpreter, home, || coil::realize(&refs(&c.inputs)))?;
            }
            let outs = (c.program)(&c.inputs)?;
            let graph = coil::capture(&refs(&outs)).graph;
            Ok((
                coil_frontend::compile::cuda_sources(&graph)?,
                coil_frontend::compile::ptx_sources(&graph, &coil_codegen::cuda::GpuTarget::h100())?,
            ))
        });
        let written = sources.map_err(|e| e.to_string()).and_then(|(sources, ptx)| {
            let folder = std::path::Path::new(dir).join(name);
            std::fs::create_dir_all(&folder).map_err(|e| e.to_string())?;
            for (kernel, source) in &sources {
                std::fs::write(folder.join(format!("{kernel}.cu")), source).map_err(|e| e.to_string())?;
            }
            for (kernel, source) in &ptx {
                match source {
                    Ok(text) => {
                        std::fs::write(folder.join(format!("{kernel}.ptx")), text).map_err(|e| e.to_string())?
                    }
                    Err(why) => println!("  {kernel}: no PTX form ({why})"),
                }
            }
            Ok(sources.len())
        });
        match written {
            Ok(n) => println!("{name}: {n} kernels in {dir}/{name}"),
            Err(e) => {
                println!("{name}: FAILED: {e}");
                status = 1;
            }
        }
    }
    status
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
    format!("panic: {}", msg.unwrap_or_else(|| "(no message)".into()))
}

fn parse_args() -> std::result::Result<(Opts, Vec<String>, Option<String>), String> {
    let mut o = Opts {
        scale: f64::NAN,
        warmup: 3,
        reps: 20,
        interp: false,
        dynamic: false,
        device: coil::Device::Cpu,
        emit_cuda: None,
    };
    let (mut only, mut json) = (Vec::new(), None);
    let mut args = std::env::args().skip(1);
    let mut device = coil::Device::default().to_string();
    while let Some(a) = args.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| args.next()).ok_or(format!("{flag} needs a value"));
        let num = |v: String| v.parse::<f64>().map_err(|_| format!("{flag}: not a number: {v}"));
        match flag.as_str() {
            "--help" | "-h" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            "--device" => device = value()?,
            "--only" => only = value()?.split(',').filter(|s| !s.is_empty()).map(String::from).collect(),
            "--scale" => o.scale = num(value()?)?,
            "--json" => json = Some(value()?),
            "--warmup" => o.warmup = num(value()?)? as usize,
            "--reps" => o.reps = (num(value()?)? as usize).max(1),
            "--compare-interpreter" => o.interp = true,
            "--dynamic" => o.dynamic = true,
            "--emit-cuda" => o.emit_cuda = Some(value()?),
            _ => return Err(format!("unknown argument {a:?}\n\n{HELP}")),
        }
    }
    o.device = match device.as_str() {
        "cpu" => coil::Device::Cpu,
        "cuda" | "cuda:0" => {
            if let Err(e) = coil_runtime::cuda::CudaDevice::get(0) {
                eprintln!("bench: no CUDA device: {e}");
                std::process::exit(2);
            }
            coil::Device::Cuda(0)
        }
        d => return Err(format!("unknown device {d:?} (cpu or cuda)")),
    };
    if o.scale.is_nan() {
        // Full size on the GPU; on a small CPU, a scale that runs the suite in about a minute.
        o.scale = if o.device == coil::Device::Cpu && o.emit_cuda.is_none() { 0.05 } else { 1.0 };
    }
    if o.scale <= 0.0 {
        return Err(format!("--scale must be > 0, got {}", o.scale));
    }
    for n in &only {
        if !WORKLOADS.iter().any(|(w, _)| w == n) {
            return Err(format!(
                "unknown workload {n:?}; known: {}",
                WORKLOADS.iter().map(|w| w.0).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    Ok((o, only, json))
}

fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info.lines().find_map(|l| l.strip_prefix("model name")).map(|l| l.trim_start_matches([' ', '\t', ':']));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("cpu ({}, {threads} threads)", model.unwrap_or("unknown model"))
}

fn main() {
    let (o, only, json) = parse_args().unwrap_or_else(|e| {
        eprintln!("bench: {e}");
        std::process::exit(2);
    });
    let device = match o.device {
        coil::Device::Cpu => cpu_name(),
        coil::Device::Cuda(n) => coil_runtime::cuda::CudaDevice::get(n).map_or("cuda".into(), |d| d.name().to_string()),
    };
    let home = coil::backend();
    if let Some(dir) = &o.emit_cuda {
        std::process::exit(emit_cuda(&o, &only, dir, home));
    }
    // Cold compiles need an empty kernel cache: a fresh one per run (removed at the end) unless
    // the configuration names one other than the standard place (COIL_CACHE_DIR).
    let configured = coil::config();
    let fresh_cache = (configured.cache_dir == coil::Config::default().cache_dir).then(|| {
        let dir = std::env::temp_dir().join(format!("coil-bench-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        coil::set_config(coil::Config { cache_dir: dir.clone(), ..(*configured).clone() });
        dir
    });
    println!("coil bench on {device}, scale {}, warmup {}, reps {} (median)", o.scale, o.warmup, o.reps);
    let mut header = format!(
        "{:30} {:24} {:>10} {:>14} {:>4} {:>9} {:>8} {:>8} {:>8}",
        "workload", "shape", "us", "rate", "kern", "compile_s", "cc", "warm_ms", "relerr"
    );
    if o.device == coil::Device::Cpu {
        header += &format!(" {:>6} {:>8}", "cc_cpu", "flt/run");
    }
    if o.interp {
        header += &format!(" {:>12} {:>8}", "interp_us", "speedup");
    }
    if o.dynamic {
        header += &format!(" {:>10} {:>11} {:>8}", "dyn_us", "dyn/static", "dyn_err");
    }
    println!("{header}\n{}", "-".repeat(header.len()));
    let (mut json_rows, mut failures) = (Vec::new(), Vec::new());
    for &(name, make) in WORKLOADS.iter().filter(|(n, _)| only.is_empty() || only.iter().any(|o| o == n)) {
        coil::set_backend(home);
        coil::manual_seed(0);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let c = make(o.scale)?;
            run(&c, &o, home).map(|row| (c, row))
        }));
        coil::set_backend(home);
        let (c, r) = match outcome.map_err(panic_text).and_then(|r| r.map_err(|e| e.to_string())) {
            Ok(done) => done,
            Err(e) => {
                println!("{name:30} FAILED: {}", e.lines().next().unwrap_or(""));
                failures.push((name, e));
                continue;
            }
        };
        let rate = if c.flops > 0.0 {
            format!("{:.4} TFLOP/s", c.flops / (r.us * 1e-6) / 1e12)
        } else {
            format!("{:.2} GB/s", c.bytes / (r.us * 1e-6) / 1e9)
        };
        let cc = if r.cc_s == 0.0 { "cached".to_string() } else { format!("{:.2}s", r.cc_s) };
        let mut line = format!(
            "{name:30} {:24} {:>10.1} {:>14} {:>4} {:>9.3} {:>8} {:>8.1} {:>8.1e}",
            c.shape,
            r.us,
            rate,
            r.kernels,
            r.compile_s,
            cc,
            r.warm_s * 1e3,
            r.relerr
        );
        if o.device == coil::Device::Cpu {
            line += &r.cc_cpu_s.filter(|_| r.cc_s > 0.0).map_or(format!(" {:>6}", "-"), |s| format!(" {s:>6.3}"));
            line += &r.faults_per_run.map_or(format!(" {:>8}", "-"), |f| format!(" {f:>8.0}"));
        }
        if let Some(i) = r.interp_us {
            line += &format!(" {:>12.0} {:>7.1}x", i, i / r.us);
        }
        if let Some(d) = &r.dynamic {
            let ratio = if d.symbolic { format!("{:.3}", d.us / r.us) } else { "static".to_string() };
            line += &format!(" {:>10.1} {:>11} {:>8.1e}", d.us, ratio, d.relerr);
        }
        println!("{line}");
        if !r.profile.is_empty() {
            // where a second process's compile goes (the rest: capture, module loads, set-up)
            let t = &r.warm_stages;
            let ms = |s: f64| s * 1e3;
            println!(
                "         warm compile {:.1} ms: decompose {:.1}, rewrite {:.1}, lower {:.1}, schedule {:.1}, codegen {:.1}, other {:.1}",
                ms(t.total),
                ms(t.decompose),
                ms(t.rewrite),
                ms(t.lower),
                ms(t.schedule),
                ms(t.codegen),
                ms(t.total - t.decompose - t.rewrite - t.lower - t.schedule - t.codegen)
            );
        }
        for (kernel, us, launch) in &r.profile {
            println!("    {us:>10.1} us  {kernel}{launch}");
        }
        json_rows.push(serde_json::json!({
            "name": name, "us": r.us, "kernels": r.kernels, "compile_s": r.compile_s,
            "warm_compile_s": r.warm_s, "relerr": r.relerr, "peak_bytes": r.peak_bytes,
            "minor_faults_per_run": r.faults_per_run, "compile_cpu_s": r.cc_cpu_s,
        }));
    }
    println!("(us: median device time of one compiled run; rate: WORKLOADS.md min bytes or flops at this scale / us;");
    println!(" kern: generated kernels + extern calls; compile_s: cold compile (a fresh kernel cache); cc: C compiler");
    println!(
        " seconds, or `cached` on a disk-cache hit; warm_ms: the same graph compiled again with the disk cache warm"
    );
    println!(" (what a second process pays); relerr: against the same program in f64 (interpreter on the CPU, compiled on the GPU))");
    if o.device == coil::Device::Cpu {
        println!(
            " cc_cpu: CPU seconds of the cold compile's C compiler runs (its wall time `cc` less waits for a core)"
        );
        println!(" flt/run: minor page faults per timed run (0 when a run reuses cached memory; one per 4 KiB of fresh memory)");
    }
    if o.dynamic {
        println!(" dyn_us: compiled with the leading dim symbolic (one kernel set for every size); dyn/static: its time over");
        println!(" the static graph's (`static`: it could not be generalized); dyn_err: its difference from the static outputs)");
    }
    for (name, e) in &failures {
        println!("\n{name} failed:\n{e}");
    }
    if let Some(path) = json {
        let doc = serde_json::json!({ "device": device, "scale": o.scale, "rows": json_rows });
        if let Err(e) = std::fs::write(&path, serde_json::to_string_pretty(&doc).expect("json") + "\n") {
            eprintln!("bench: cannot write {path}: {e}");
            std::process::exit(1);
        }
        println!("wrote {path}");
    }
    if let Some(dir) = fresh_cache {
        let _ = std::fs::remove_dir_all(dir);
    }
    std::process::exit(if failures.is_empty() { 0 } else { 1 });
}
