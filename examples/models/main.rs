//! The models benchmark, coil's side: GPT-2 124M (B=8, T=1024, vocabulary 50304, dropout 0,
//! f32 parameters with bf16 matrix products and attention) written with `coil::nn`, timed
//! forward (to the loss, no gradients) and for a whole training step (forward, backward,
//! gradient clipping, AdamW), and that step with dropout 0.1; the decode rows ([`decode`]); ResNet-50 at batch 64, forward and
//! an SGD training step ([`resnet`]). `--rows` picks rows by name (`resnet50_fwd_bf16`, ...). `bench/models_torch.py` times the same model in PyTorch (eager
//! and torch.compile) and `bench/models_table.py` sets them side by side.
//!
//! ```sh
//! cargo run --release --example models -- --json coil_models.json            # GPU, 124M
//! cargo run --release --example models -- --device cpu --config tiny         # a quick check
//! cargo run --release --example models -- --cuda-graphs                       # replayed from CUDA graphs
//! cargo run --release --example models -- --replay                            # bodies not rerun
//! cargo run --release --example models -- --cold                              # empty caches
//! cargo run --release --example models -- --no-cudnn-attention              # attention on coil's templates only
//! ```
//!
//! `--replay` compiles the forward and gradient functions with `CompiledFn::replay`: after two
//! traced calls that agree, a call binds the arguments and runs the compiled graph without
//! running the Rust body (no recording, differentiation, capture or guards per call), as
//! torch.compile's calls check guards and run the compiled graph. The optimizer steps stay
//! outside (recorded and realized per call, like PyTorch's eager optimizers). The decode rows
//! always replay.
//!
//! Timing follows `torch_suite.py`: warm-up calls, then each timed call after a 256 MiB memset
//! (a cold L2), CUDA events around the call on the device's stream (the wall clock on the CPU);
//! the median. The wall clock of a call is measured too (`coil_wall_ms`). The compile time is
//! the first call's wall time minus a steady call's (a cold compile with `--cold`, which starts
//! coil's cache and the CUDA driver's JIT cache empty); the peak is the allocator's most bytes in
//! use over one steady call (parameters, optimizer state and activations included; the flush
//! buffer not).

mod decode;
mod resnet;

use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
use coil::nn::{clip_grad_norm, AdamW, AdamWConfig, Optimizer, ParamStore, Precision};
use coil::{DType, Device, Tensor};
use coil_runtime::cuda::{CudaDevice, DeviceMemory, StreamTimer};
use std::time::Instant;

pub struct Opts {
    device: Device,
    tiny: bool,
    rows: Vec<String>,
    warmup: usize,
    reps: usize,
    json: Option<String>,
    /// Replay the compiled functions (`CompiledFn::cuda_graphs`) and the decode steps
    /// (`coil::set_cuda_graphs`) from CUDA graphs.
    cuda_graphs: bool,
    /// Compile the forward and gradient functions with `CompiledFn::replay`.
    replay: bool,
    /// Start with empty caches (`--cold`): coil's (kernels, graphs) and the CUDA driver's JIT
    /// cache, each a fresh folder, so that the compile column is a cold compile whatever ran
    /// on the machine before (as `models_torch.py` starts Inductor's and Triton's).
    cold: bool,
    /// Run attention on coil's own templates, never cuDNN (`--no-cudnn-attention`,
    /// `Config::cudnn_attention` off): to compare the templates with and without dropout.
    no_cudnn_attention: bool,
}

/// Says how many of a replaying function's calls replayed (`--replay`).
fn report_replays(name: &str, stats: &coil::CallStats, o: &Opts) {
    if o.replay {
        eprintln!("  {name}: {} of {} calls replayed", stats.replays, stats.calls);
    }
}

impl Opts {
    /// A row's notes with how its compiled functions ran (`--replay`, `--cuda-graphs`).
    fn with_modes(&self, notes: &str) -> String {
        let mut modes = Vec::new();
        if self.replay {
            modes.push("compiled functions replayed (no Rust body per call)");
        }
        if self.cuda_graphs {
            modes.push("replayed from CUDA graphs");
        }
        if modes.is_empty() {
            notes.to_string()
        } else {
            format!("{notes}; {}", modes.join(", "))
        }
    }
}

fn parse() -> Opts {
    let mut o = Opts {
        device: Device::default(),
        tiny: false,
        rows: vec![],
        warmup: 3,
        reps: 20,
        json: None,
        cuda_graphs: false,
        replay: false,
        cold: false,
        no_cudnn_attention: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--device" => o.device = v().parse().expect("--device cpu|cuda|cuda:N"),
            "--config" => o.tiny = v() == "tiny",
            "--rows" => o.rows = v().split(',').map(String::from).collect(),
            "--warmup" => o.warmup = v().parse().expect("--warmup N"),
            "--reps" => o.reps = v().parse().expect("--reps N"),
            "--json" => o.json = Some(v()),
            "--cuda-graphs" => o.cuda_graphs = true,
            "--replay" => o.replay = true,
            "--cold" => o.cold = true,
            "--no-cudnn-attention" => o.no_cudnn_attention = true,
            _ => panic!(
                "unknown argument {a}: --device, --config 124m|tiny, --rows, --warmup, --reps, --json, --cuda-graphs, --replay, --cold, --no-cudnn-attention"
            ),
        }
    }
    o
}

/// One timed call: device microseconds (events; the wall clock on the CPU) and wall microseconds.
pub struct Timer {
    cuda: Option<(std::sync::Arc<CudaDevice>, StreamTimer, DeviceMemory)>,
}

const FLUSH_BYTES: usize = 256 << 20;

impl Timer {
    fn new(device: Device) -> coil::Result<Timer> {
        Ok(Timer {
            cuda: match device {
                Device::Cuda(n) => {
                    let dev = CudaDevice::get(n)?;
                    let timer = StreamTimer::new(&dev)?;
                    let flush = DeviceMemory::alloc(&dev, FLUSH_BYTES)?;
                    Some((dev, timer, flush))
                }
                Device::Cpu => None,
            },
        })
    }

    pub fn time(&self, f: &mut dyn FnMut() -> coil::Result<()>) -> coil::Result<Times> {
        let Some((dev, timer, flush)) = &self.cuda else {
            let t = Instant::now();
            f()?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            return Ok(Times { device: us, wall: us, host: us });
        };
        flush.zero(FLUSH_BYTES)?;
        dev.synchronize()?;
        let wall = Instant::now();
        timer.start()?;
        f()?;
        let host = wall.elapsed().as_secs_f64() * 1e6;
        let device = timer.stop()?;
        Ok(Times { device, wall: wall.elapsed().as_secs_f64() * 1e6, host })
    }

    pub fn reset_peak(&self) {
        if let Some((dev, ..)) = &self.cuda {
            dev.reset_peak_memory();
        }
    }

    /// The allocator's peak since [`Timer::reset_peak`], less the L2 flush buffer (live all
    /// along; PyTorch's side measures with it not allocated).
    pub fn peak(&self) -> usize {
        self.cuda.as_ref().map_or(0, |(dev, _, flush)| {
            dev.memory_stats().peak_in_use_bytes - coil_runtime::cuda::memory::size_class(flush.bytes())
        })
    }
}

/// One timed call, in microseconds.
#[derive(Clone, Copy)]
pub struct Times {
    /// CUDA events around the call (the wall clock on the CPU).
    pub device: f64,
    /// Until the call's work finished.
    pub wall: f64,
    /// Until the call returned, its work enqueued and not waited for: the host's own time
    /// while the device keeps up (the wall clock on the CPU).
    pub host: f64,
}

pub struct Row {
    name: String,
    device_ms: f64,
    wall_ms: f64,
    /// The host's time per call or token ([`Times::host`]), where measured.
    host_ms: Option<f64>,
    peak: usize,
    compile_s: f64,
    notes: String,
    /// For per-token rows (decode, prefill): the batch; `None` for per-call rows.
    per_token_batch: Option<usize>,
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `step`: the first call (compiles), `warmup` more, then `reps` timed; the peak over one
/// more call.
fn bench(
    name: &str,
    o: &Opts,
    timer: &Timer,
    notes: &str,
    step: &mut dyn FnMut() -> coil::Result<()>,
) -> coil::Result<Row> {
    let first = Instant::now();
    step()?;
    let first_s = first.elapsed().as_secs_f64();
    for _ in 0..o.warmup {
        step()?;
    }
    let (mut device, mut wall) = (Vec::new(), Vec::new());
    for _ in 0..o.reps.max(1) {
        let t = timer.time(step)?;
        device.push(t.device / 1e3);
        wall.push(t.wall / 1e3);
    }
    timer.reset_peak();
    step()?;
    let (device_ms, wall_ms) = (median(device), median(wall));
    let row = Row {
        name: name.into(),
        device_ms,
        wall_ms,
        host_ms: None,
        peak: timer.peak(),
        compile_s: (first_s - wall_ms / 1e3).max(0.0),
        notes: notes.into(),
        per_token_batch: None,
    };
    eprintln!(
        "{:<28} {:9.3} ms device  {:9.3} ms wall  peak {:7.1} MB  compile {:6.2} s",
        row.name,
        row.device_ms,
        row.wall_ms,
        row.peak as f64 / 1e6,
        row.compile_s
    );
    Ok(row)
}

/// The dropout probability of the dropout training row (nanoGPT's for fine-tuning; PyTorch's
/// side is `TRAIN_DROPOUT` in `bench/models_torch.py`).
const TRAIN_DROPOUT: f64 = 0.1;

/// GPT-2 (124M, or the tiny one) with `dropout`, f32 parameters under bf16 autocast, from a
/// fixed seed, and its store.
fn gpt2(o: &Opts, dropout: f64) -> coil::Result<(Gpt2, ParamStore)> {
    let config = if o.tiny {
        Gpt2Config { vocab_size: 256, block_size: 64, n_layer: 2, n_head: 2, n_embd: 64, dropout, layer_norm_eps: 1e-5 }
    } else {
        Gpt2Config { dropout, ..Gpt2Config::gpt2_124m() }
    };
    coil::manual_seed(0);
    let store = ParamStore::new();
    store.set_precision(Precision::autocast(DType::BF16));
    let model = Gpt2::new(&store.root(o.device, DType::F32), config)?;
    store.realize_pending()?;
    eprintln!("GPT-2 with {} parameters on {}, dropout {dropout}", store.num_elements(), o.device);
    Ok((model, store))
}

/// The forward and training-step rows (GPT-2 124M, f32 parameters, bf16 autocast): the
/// forward, the training step, and the training step with dropout.
fn training_rows(o: &Opts, timer: &Timer) -> coil::Result<Vec<Row>> {
    let prefix = if o.tiny { "gpt2_tiny" } else { "gpt2_124m" };
    let wanted = |r: &str| o.rows.is_empty() || o.rows.iter().any(|w| w == r);
    let (fwd_name, train_name, dropout_name) = (
        format!("{prefix}_fwd_bf16"),
        format!("{prefix}_train_step_bf16"),
        format!("{prefix}_train_step_dropout_bf16"),
    );
    let mut rows = Vec::new();
    if wanted(&fwd_name) || wanted(&train_name) {
        let (model, store) = gpt2(o, 0.0)?;
        let (x, y) = batch(o, &model)?;
        if wanted(&fwd_name) {
            store.eval();
            let forward = coil::compile(|a: &[Tensor]| Ok(vec![model.loss(&a[0], &a[1])?]))
                .named("forward")
                .replay(o.replay)
                .cuda_graphs(o.cuda_graphs);
            let mut step = || forward.call(&[&x, &y]).map(|_| ());
            let notes = o.with_modes("forward to the mean cross-entropy loss, no gradients (as under torch.no_grad)");
            rows.push(bench(&fwd_name, o, timer, &notes, &mut step)?);
            report_replays(&fwd_name, &forward.stats(), o);
            store.train();
        }
        if wanted(&train_name) {
            let notes = "forward, backward, clip_grad_norm(1.0), AdamW (in place; weight decay on 2-D parameters)";
            rows.push(train_step_row(&train_name, notes, &model, &store, (&x, &y), o, timer)?);
        }
    }
    if wanted(&dropout_name) {
        let (model, store) = gpt2(o, TRAIN_DROPOUT)?;
        let (x, y) = batch(o, &model)?;
        let notes = "the training step with dropout 0.1 after the embeddings, on the attention weights and after \
                     each residual projection";
        rows.push(train_step_row(&dropout_name, notes, &model, &store, (&x, &y), o, timer)?);
    }
    Ok(rows)
}

/// Token ids and targets, uniform over the vocabulary from a fixed seed, `[batch, seq]` each.
fn batch(o: &Opts, model: &Gpt2) -> coil::Result<(Tensor, Tensor)> {
    let (batch, seq) = if o.tiny { (2, 64) } else { (8, 1024) };
    let vocab = model.config.vocab_size as u64;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut ids = |n: usize| -> coil::Result<Tensor> {
        let v: Vec<i64> = (0..n)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 33) % vocab) as i64
            })
            .collect();
        Tensor::from_vec(v, &[batch, seq])?.to_device(o.device)
    };
    Ok((ids(batch * seq)?, ids(batch * seq)?))
}

/// A training step row: the compiled gradients of the loss, then clipping and AdamW (nanoGPT's
/// groups: weight decay on 2-D parameters); then where a step's time goes.
fn train_step_row(
    name: &str,
    notes: &str,
    model: &Gpt2,
    store: &ParamStore,
    (x, y): (&Tensor, &Tensor),
    o: &Opts,
    timer: &Timer,
) -> coil::Result<Row> {
    let params = store.trainable();
    let (decay, no_decay): (Vec<_>, Vec<_>) = params.iter().cloned().partition(|p| p.shape().len() >= 2);
    let adamw = AdamWConfig { lr: 6e-4, betas: (0.9, 0.95), eps: 1e-8, weight_decay: 0.1, amsgrad: false };
    let mut opt = AdamW::with_groups(vec![(decay, 0.1), (no_decay, 0.0)], adamw)?;
    let order = opt.params().to_vec();
    let grads = coil::compile(|a: &[Tensor]| {
        let (loss, grads) = coil::nn::value_and_grad(&model.loss(&a[0], &a[1])?, &order)?;
        Ok(std::iter::once(loss).chain(grads).collect())
    })
    .named("train_step")
    .replay(o.replay)
    .cuda_graphs(o.cuda_graphs);
    let mut step = || -> coil::Result<()> {
        let out = grads.call(&[x, y])?;
        let (clipped, _norm) = clip_grad_norm(&out[1..], 1.0)?;
        opt.step(&clipped)
    };
    let row = bench(name, o, timer, &o.with_modes(notes), &mut step)?;
    report_replays(name, &grads.stats(), o);
    // Where a step's time goes: the gradients' graph, then the optimizer's.
    let (mut g, mut u) = (Vec::new(), Vec::new());
    for _ in 0..o.reps.clamp(1, 10) {
        let mut out = Vec::new();
        g.push(timer.time(&mut || {
            out = grads.call(&[x, y])?;
            Ok(())
        })?);
        u.push(timer.time(&mut || {
            let (clipped, _norm) = clip_grad_norm(&out[1..], 1.0)?;
            opt.step(&clipped)
        })?);
    }
    let med = |v: &[Times], f: fn(&Times) -> f64| median(v.iter().map(|t| f(t) / 1e3).collect());
    eprintln!(
        "  of which: gradients {:.3} ms device ({:.3} wall), clipping + AdamW {:.3} ms device ({:.3} wall)",
        med(&g, |t| t.device),
        med(&g, |t| t.wall),
        med(&u, |t| t.device),
        med(&u, |t| t.wall)
    );
    Ok(row)
}

/// Points coil's cache and the CUDA driver's JIT cache at fresh folders (`--cold`). Runs before
/// anything loads the driver, which reads `CUDA_CACHE_PATH` once.
fn start_cold() -> std::io::Result<std::path::PathBuf> {
    let root = std::env::temp_dir().join(format!("coil-models-cold-{}", std::process::id()));
    let (coil_dir, jit_dir) = (root.join("coil"), root.join("cuda-jit"));
    std::fs::create_dir_all(&coil_dir)?;
    std::fs::create_dir_all(&jit_dir)?;
    std::env::set_var("CUDA_CACHE_PATH", &jit_dir);
    coil::set_config(coil::Config { cache_dir: coil_dir, ..(*coil::config()).clone() });
    eprintln!("cold caches under {}", root.display());
    Ok(root)
}

fn main() -> coil::Result<()> {
    let o = parse();
    let cold_root = match o.cold {
        true => Some(start_cold().map_err(|e| coil::Error::runtime(format!("--cold: {e}")))?),
        false => None,
    };
    // The optimizer's step and the decode steps are realizations (update_in_place): they replay
    // too.
    coil::set_cuda_graphs(o.cuda_graphs);
    if o.no_cudnn_attention {
        coil::set_config(coil::Config { cudnn_attention: false, ..(*coil::config()).clone() });
    }
    let device = o.device;
    let timer = Timer::new(device)?;
    let mut rows = training_rows(&o, &timer)?;
    rows.extend(decode::rows(&o, &timer)?);
    rows.extend(resnet::rows(&o, &timer)?);
    let device_name = match device {
        Device::Cuda(n) => CudaDevice::get(n)?.name().to_string(),
        Device::Cpu => "cpu".to_string(),
    };
    let json_rows: Vec<String> = rows
        .iter()
        .map(|r| {
            let per_token = r.per_token_batch.map_or(String::new(), |b| format!(", \"per_token\": true, \"batch\": {b}"));
            let host = r.host_ms.map_or(String::new(), |h| format!(", \"coil_host_ms\": {h:.4}"));
            format!(
                "{{\"name\": \"{}\", \"coil_ms\": {:.4}, \"coil_wall_ms\": {:.4}{host}, \"coil_peak_bytes\": {}, \"coil_compile_s\": {:.3}, \"notes\": \"{}\"{per_token}}}",
                r.name, r.device_ms, r.wall_ms, r.peak, r.compile_s, r.notes
            )
        })
        .collect();
    let json = format!("{{\"device\": \"{device_name}\", \"rows\": [\n  {}\n]}}\n", json_rows.join(",\n  "));
    match &o.json {
        Some(path) => std::fs::write(path, &json).map_err(|e| coil::Error::runtime(format!("{path}: {e}")))?,
        None => print!("{json}"),
    }
    if let Some(root) = cold_root {
        let _ = std::fs::remove_dir_all(root); // scratch: the next --cold starts empty again
    }
    Ok(())
}
