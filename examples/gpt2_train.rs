//! Trains a GPT-2-style byte-level language model from scratch on this repository's own docs and
//! Rust sources, with AdamW, a warm-up + cosine learning-rate schedule, gradient clipping and
//! dropout; reports a held-out loss, and saves (and resumes from) checkpoints.
//!
//! ```sh
//! cargo run --release --example gpt2_train                  # default device, its configuration
//! cargo run --release --example gpt2_train -- --steps 600 --out ckpt/gpt2-bytes
//! cargo run --release --example gpt2_train -- --resume      # continue from the checkpoint
//! cargo run --release --example generate -- --checkpoint ckpt/gpt2-bytes --prompt "fn main"
//! ```
//!
//! On the CPU the model is small (2 layers of 128 features, 64 bytes of context); on a CUDA GPU
//! it is larger (6 layers of 384, 256 bytes, bf16 matrix products). The training step (forward,
//! loss, gradients) is one compiled function, compiled once; the optimizer step (clipping and
//! AdamW over every parameter) is one more graph, also compiled once, that writes the new
//! parameters and moments over the old ones.

use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
use coil::nn::{clip_grad_norm, AdamW, AdamWConfig, LrSchedule, Optimizer, ParamStore, Precision, WarmupCosine};
use coil::{DType, Device, Tensor};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What one run does, from the command line.
struct Args {
    device: Device,
    steps: u64,
    out: PathBuf,
    resume: bool,
    log_every: u64,
    eval_every: u64,
}

impl Args {
    fn parse() -> Args {
        let mut args = Args {
            device: Device::default(),
            steps: 0,
            out: PathBuf::from("ckpt/gpt2-bytes"),
            resume: false,
            log_every: 10,
            eval_every: 100,
        };
        let mut it = std::env::args().skip(1);
        while let Some(a) = it.next() {
            let mut value = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
            match a.as_str() {
                "--device" => args.device = value().parse().expect("--device cpu|cuda|cuda:N"),
                "--steps" => args.steps = value().parse().expect("--steps N"),
                "--out" => args.out = PathBuf::from(value()),
                "--resume" => args.resume = true,
                "--log-every" => args.log_every = value().parse().expect("--log-every N"),
                "--eval-every" => args.eval_every = value().parse().expect("--eval-every N"),
                _ => panic!("unknown argument {a} (see the example's docs)"),
            }
        }
        args
    }
}

/// The model and the batch for a device: small on the CPU, larger on a GPU.
fn setup(device: Device) -> (Gpt2Config, usize, u64, Precision) {
    let config = |n_layer, n_head, n_embd, block_size| Gpt2Config {
        vocab_size: 256,
        block_size,
        n_layer,
        n_head,
        n_embd,
        dropout: 0.1,
        layer_norm_eps: 1e-5,
    };
    match device {
        Device::Cpu => (config(2, 4, 128, 64), 8, 300, Precision::default()),
        Device::Cuda(_) => (config(6, 6, 384, 256), 32, 2000, Precision::autocast(DType::BF16)),
    }
}

fn main() -> coil::Result<()> {
    let args = Args::parse();
    let device = args.device;
    coil::manual_seed(1337);
    let (config, batch, default_steps, precision) = setup(device);
    let steps = if args.steps > 0 { args.steps } else { default_steps };
    let (train, val) = corpus();
    if val.len() < 2 * config.block_size {
        return Err(coil::Error::runtime(
            "no corpus: run from the repository's root (its docs and sources are the text)",
        ));
    }
    println!(
        "corpus: {} bytes of this repository's docs and sources ({} for training, {} held out)",
        train.len() + val.len(),
        train.len(),
        val.len()
    );

    let store = ParamStore::new();
    store.set_precision(precision);
    let model = Gpt2::new(&store.root(device, DType::F32), config)?;
    let params = store.trainable();
    // nanoGPT's groups: weight decay on the matrices, none on biases and norms.
    let (decay, no_decay): (Vec<_>, Vec<_>) = params.iter().cloned().partition(|p| p.shape().len() >= 2);
    let adamw = AdamWConfig { lr: 1e-3, betas: (0.9, 0.95), eps: 1e-8, weight_decay: 0.1, amsgrad: false };
    let mut opt = AdamW::with_groups(vec![(decay, 0.1), (no_decay, 0.0)], adamw)?;
    let schedule = WarmupCosine { max_lr: 1e-3, min_lr: 1e-4, warmup: steps / 20, total: steps };
    let ordered: Vec<_> = opt.params().to_vec();

    let model_file = args.out.join("model.safetensors");
    let optim_file = args.out.join("optimizer.safetensors");
    if args.resume && model_file.exists() {
        store.load(&model_file)?;
        coil::nn::load_optimizer(&mut opt, &optim_file)?;
        println!("resumed from {} at step {}", args.out.display(), opt.steps());
    }
    println!(
        "model: GPT-2, {} layers, {} heads, {} features, {} bytes of context, {:.2}M parameters, on {device}{}",
        config.n_layer,
        config.n_head,
        config.n_embd,
        config.block_size,
        store.num_elements() as f64 / 1e6,
        precision.compute.map_or(String::new(), |d| format!(", {d} products"))
    );

    // The training step: loss and gradients, one compiled graph.
    let train_step = coil::compile(|a: &[Tensor]| {
        let loss = model.loss(&a[0], &a[1])?;
        let (loss, grads) = coil::nn::value_and_grad(&loss, &ordered)?;
        Ok(std::iter::once(loss).chain(grads).collect())
    })
    .named("train_step");
    let eval_loss = coil::compile(|a: &[Tensor]| Ok(vec![model.loss(&a[0], &a[1])?])).named("eval_loss");

    let mut rng = Rng(0x5eed ^ opt.steps());
    let tokens = (batch * config.block_size) as f64;
    let mut window = (Instant::now(), 0u64);
    while opt.steps() < steps {
        let step = opt.steps();
        let (x, y) = sample(&train, batch, config.block_size, &mut rng, device)?;
        let out = train_step.call(&[&x, &y])?;
        let (grads, norm) = clip_grad_norm(&out[1..], 1.0)?;
        opt.set_lr(schedule.lr(step));
        opt.step(&grads)?;
        window.1 += 1;
        if step % args.log_every == 0 || step + 1 == steps {
            let loss = out[0].item::<f32>()?;
            let ms = window.0.elapsed().as_secs_f64() * 1e3 / window.1 as f64;
            println!(
                "step {step:5} | loss {loss:.4} | grad norm {:.3} | lr {:.2e} | {ms:7.1} ms/step | {:8.0} tokens/s",
                norm.item::<f32>()?,
                schedule.lr(step),
                tokens / ms * 1e3
            );
            window = (Instant::now(), 0);
        }
        if (step + 1) % args.eval_every == 0 || step + 1 == steps {
            store.eval();
            let mut eval_rng = Rng(0xe7a1);
            let mut total = 0.0;
            for _ in 0..8 {
                let (x, y) = sample(&val, batch, config.block_size, &mut eval_rng, device)?;
                total += eval_loss.call(&[&x, &y])?[0].item::<f32>()? as f64;
            }
            store.train();
            println!("step {:5} | held-out loss {:.4}", step + 1, total / 8.0);
            save(&store, &opt, &config, &args.out)?;
            window = (Instant::now(), 0);
        }
    }
    println!(
        "compiled: training step {} time(s), held-out loss {} time(s); checkpoint in {}",
        train_step.compile_count(),
        eval_loss.compile_count(),
        args.out.display()
    );
    Ok(())
}

/// The model (with its sizes in the metadata) and the optimizer state, in `dir`.
fn save(store: &ParamStore, opt: &AdamW, config: &Gpt2Config, dir: &Path) -> coil::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| coil::Error::runtime(format!("cannot create {}: {e}", dir.display())))?;
    let metadata = config.metadata();
    let metadata: Vec<(&str, &str)> = metadata.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    store.save(dir.join("model.safetensors"), &metadata)?;
    coil::nn::save_optimizer(opt, dir.join("optimizer.safetensors"))
}

/// This repository's docs and Rust sources as bytes, in a fixed order: the first 90% for
/// training, the rest held out.
fn corpus() -> (Vec<u8>, Vec<u8>) {
    // The checkout this example was built from, else the current directory (a binary run
    // elsewhere, from a copy of the repository).
    let built = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = if built.join("README.md").exists() { built.to_path_buf() } else { PathBuf::from(".") };
    let root = root.as_path();
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "ir/src", "passes/src", "codegen/src", "runtime/src", "frontend/src", "nn/src", "examples"] {
        collect(&root.join(dir), &mut files);
    }
    files.sort();
    let mut bytes = Vec::new();
    for f in files {
        bytes.extend(std::fs::read(&f).unwrap_or_default());
    }
    let split = bytes.len() * 9 / 10;
    let val = bytes.split_off(split);
    (bytes, val)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if matches!(p.extension().and_then(|x| x.to_str()), Some("rs" | "md")) {
            out.push(p);
        }
    }
}

/// `batch` random windows of `block` bytes and the bytes that follow them, as i64 token ids.
fn sample(data: &[u8], batch: usize, block: usize, rng: &mut Rng, device: Device) -> coil::Result<(Tensor, Tensor)> {
    let (mut x, mut y) = (Vec::with_capacity(batch * block), Vec::with_capacity(batch * block));
    for _ in 0..batch {
        let start = (rng.next() % (data.len() - block - 1) as u64) as usize;
        x.extend(data[start..start + block].iter().map(|&b| b as i64));
        y.extend(data[start + 1..start + block + 1].iter().map(|&b| b as i64));
    }
    Ok((
        Tensor::from_vec(x, &[batch, block])?.to_device(device)?,
        Tensor::from_vec(y, &[batch, block])?.to_device(device)?,
    ))
}

/// xorshift64*: batch positions, reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}
