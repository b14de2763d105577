//! Generates text (or token ids) from a language model with a key/value cache: a prefill of the
//! prompt, then one decode step per token, each sampled on the device.
//!
//! Models:
//! - `--checkpoint DIR`: a byte-level GPT-2 of `gpt2_train` (the default, `ckpt/gpt2-bytes`);
//! - `--hf FILE`: a Hugging Face GPT-2 `model.safetensors` with `config.json` and its tokenizer
//!   (`tokenizer.json`, or `vocab.json` and `merges.txt`) beside it (text in, text out);
//! - `--llama FILE`: a Hugging Face Llama `model.safetensors` with its `config.json` beside it,
//!   and its `tokenizer.json` when it has a byte-level BPE one (Llama 3: text in, text out,
//!   the beginning-of-text token first); without one the prompt's bytes are the ids, and the
//!   ids are printed;
//! - `--random NAME`: random weights of a named size, `gpt2-124m`, `llama-1b`, `gpt2-tiny` or
//!   `llama-tiny` (bf16 on a GPU, f32 on the CPU; ids printed): for timing.
//!
//! ```sh
//! cargo run --release --example generate -- --checkpoint ckpt/gpt2-bytes --prompt "fn main"
//! cargo run --release --example generate -- --hf path/to/gpt2/model.safetensors \
//!     --prompt "The meaning of life is" --tokens 40 --temperature 0.8 --top-p 0.95
//! cargo run --release --example generate -- --random llama-1b --tokens 256 --cuda-graphs
//! ```
//!
//! Greedy decoding by default (`--temperature 0`), else sampling from the softmax at that
//! temperature, restricted by `--top-k K` and `--top-p P` (nucleus), seeded by `--seed`
//! ([`Tensor::sample_tokens`]: the token is drawn on the device, in the step's graph, so only
//! its id comes back to the host). Every decode step is the same graph, compiled once (the
//! position is a tensor, the random numbers' seed and offset are run-time arguments); the step
//! is a compiled function that replays (`CompiledFn::replay`: from its third call on, the
//! compiled graph runs without the step's Rust code), and `--cuda-graphs` replays its graph from
//! a CUDA graph on a GPU. Prints tokens/s for the prefill and
//! the decode: of the first generation (compiles included), or with `--warm` of a second one.

use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
use coil::nn::models::llama::{Llama, LlamaConfig};
use coil::nn::models::CausalLm;
use coil::nn::Tokenizer as Bpe;
use coil::nn::{LoadOptions, ParamStore};
use coil::safetensors::WeightFile;
use coil::{DType, Device, Sampling, Tensor};
use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Instant;

struct Args {
    checkpoint: Option<PathBuf>,
    hf: Option<PathBuf>,
    llama: Option<PathBuf>,
    random: Option<String>,
    cuda_graphs: bool,
    warm: bool,
    prompt: String,
    tokens: usize,
    sampling: Sampling,
    seed: u64,
    device: Device,
}

fn parse() -> Args {
    let mut a = Args {
        checkpoint: None,
        hf: None,
        llama: None,
        random: None,
        cuda_graphs: false,
        warm: false,
        prompt: "fn main".into(),
        tokens: 64,
        sampling: Sampling::greedy(),
        seed: 0,
        device: Device::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--checkpoint" => a.checkpoint = Some(v().into()),
            "--hf" => a.hf = Some(v().into()),
            "--llama" => a.llama = Some(v().into()),
            "--random" => a.random = Some(v()),
            "--cuda-graphs" => a.cuda_graphs = true,
            "--warm" => a.warm = true,
            "--prompt" => a.prompt = v(),
            "--tokens" => a.tokens = v().parse().expect("--tokens N"),
            "--temperature" => a.sampling.temperature = v().parse().expect("--temperature T"),
            "--top-k" => a.sampling.top_k = Some(v().parse().expect("--top-k K")),
            "--top-p" => a.sampling.top_p = Some(v().parse().expect("--top-p P")),
            "--seed" => a.seed = v().parse().expect("--seed N"),
            "--device" => a.device = v().parse().expect("--device cpu|cuda|cuda:N"),
            _ => panic!("unknown argument {k} (see the example's docs)"),
        }
    }
    if a.checkpoint.is_none() && a.hf.is_none() && a.llama.is_none() && a.random.is_none() {
        a.checkpoint = Some("ckpt/gpt2-bytes".into());
    }
    a
}

/// How text becomes token ids and back: bytes for `gpt2_train`'s models, byte-level BPE for
/// Hugging Face's GPT-2 and Llama 3 (with its template's special tokens), and for models
/// without a tokenizer here, the prompt's bytes as ids and the ids as numbers.
enum Tokenizer {
    Bytes,
    Bpe(Box<Bpe>),
    Ids,
}

impl Tokenizer {
    fn encode(&self, text: &str) -> coil::Result<Vec<i64>> {
        match self {
            Tokenizer::Bytes | Tokenizer::Ids => Ok(text.bytes().map(i64::from).collect()),
            Tokenizer::Bpe(b) => b.encode(text, true),
        }
    }

    fn decode(&self, ids: &[i64]) -> String {
        match self {
            Tokenizer::Bytes => String::from_utf8_lossy(&ids.iter().map(|&i| i as u8).collect::<Vec<_>>()).into_owned(),
            Tokenizer::Bpe(b) => b.decode(ids).unwrap_or_else(|e| format!("{ids:?} ({e})")),
            Tokenizer::Ids => format!("{ids:?}"),
        }
    }
}

/// The model the arguments name, its tokenizer, and a line describing it.
fn load(args: &Args, store: &ParamStore) -> coil::Result<(Box<dyn CausalLm>, Tokenizer, String)> {
    let device = args.device;
    let f32_root = store.root(device, DType::F32);
    let describe = |name: &str, layers: usize, width: usize| {
        format!(
            "{name}: {layers} layers, {width} features, {:.1}M parameters, on {device}",
            store.num_elements() as f64 / 1e6
        )
    };
    if let Some(name) = &args.random {
        // Random weights for timing: bf16 on a GPU (as the models bench), f32 on the CPU.
        let dtype = if matches!(device, Device::Cuda(_)) { DType::BF16 } else { DType::F32 };
        let root = store.root(device, dtype);
        let model: Box<dyn CausalLm> = match name.as_str() {
            "gpt2-124m" => Box::new(Gpt2::new(&root, Gpt2Config::gpt2_124m())?),
            "gpt2-tiny" => Box::new(Gpt2::new(&root, Gpt2Config::tiny())?),
            "llama-1b" => Box::new(Llama::new(&root, LlamaConfig::llama_1b())?),
            "llama-tiny" => Box::new(Llama::new(&root, LlamaConfig::tiny())?),
            _ => {
                return Err(coil::Error::value(format!(
                    "--random {name}: gpt2-124m, gpt2-tiny, llama-1b or llama-tiny"
                )))
            }
        };
        store.realize_pending()?;
        let line = format!(
            "{name} (random {dtype} weights): {:.1}M parameters, on {device}",
            store.num_elements() as f64 / 1e6
        );
        return Ok((model, Tokenizer::Ids, line));
    }
    if let Some(path) = &args.llama {
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        let json = std::fs::read_to_string(dir.join("config.json"))
            .map_err(|e| coil::Error::runtime(format!("Llama's config.json beside {}: {e}", path.display())))?;
        let config = LlamaConfig::from_hf_json(&json)?;
        let (layers, width) = (config.n_layer, config.hidden_size);
        let model = Llama::new(&f32_root, config)?;
        store.load_with(path, &LoadOptions { cast: true, ..Default::default() })?;
        let tokenizer = match dir.join("tokenizer.json") {
            file if file.exists() => Tokenizer::Bpe(Box::new(Bpe::from_file(file)?)),
            _ => Tokenizer::Ids,
        };
        return Ok((Box::new(model), tokenizer, describe("Llama", layers, width)));
    }
    if let Some(path) = &args.hf {
        let file = WeightFile::open(path)?;
        let mut config = Gpt2Config::from_hf(&file)?;
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        // The head count is not in the weights: Hugging Face's config.json says it.
        if let Ok(text) = std::fs::read_to_string(dir.join("config.json")) {
            let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            if let Some(n) = json["n_head"].as_u64() {
                config.n_head = n as usize;
            }
        }
        let (layers, width) = (config.n_layer, config.n_embd);
        let model = Gpt2::new(&f32_root, config)?;
        let rename = |n: &str| Gpt2Config::hf_name(n);
        store.load_with(path, &LoadOptions { rename: Some(&rename), cast: true, ..Default::default() })?;
        let bpe = match dir.join("tokenizer.json") {
            file if file.exists() => Bpe::from_file(file)?,
            _ => Bpe::from_gpt2_files(dir)?,
        };
        return Ok((Box::new(model), Tokenizer::Bpe(Box::new(bpe)), describe("GPT-2", layers, width)));
    }
    let dir = args.checkpoint.clone().expect("a checkpoint");
    let file = dir.join("model.safetensors");
    let config = Gpt2Config::from_metadata(WeightFile::open(&file)?.metadata())?;
    let (layers, width) = (config.n_layer, config.n_embd);
    let model = Gpt2::new(&f32_root, config)?;
    store.load(&file)?;
    Ok((Box::new(model), Tokenizer::Bytes, describe("GPT-2", layers, width)))
}

/// One generation: the prompt's and the new tokens' ids, and the time of each phase.
struct Generated {
    ids: Vec<i64>,
    prefill_s: f64,
    decode_s: f64,
    steps: usize,
}

/// Prefills `prompt` into a new key/value cache, then decodes `tokens` tokens one step at a
/// time: every decode step is the same graph (the position is a tensor), compiled once. Each
/// token's id comes back to the host (to print it), the only host read of a step.
fn generate(model: &dyn CausalLm, prompt: &[i64], tokens: usize, args: &Args) -> coil::Result<Generated> {
    let device = args.device;
    let mut ids = prompt.to_vec();
    let cache = RefCell::new(model.new_cache(1, model.max_positions())?);
    coil::manual_seed(args.seed);
    let start = Instant::now();
    let x = Tensor::from_vec(ids.clone(), &[1, ids.len()])?.to_device(device)?;
    let token = {
        let mut cache = cache.borrow_mut();
        let (logits, written) = model.forward_cached(&x, &cache.position()?, &cache)?;
        let token = logits.sample_tokens(&args.sampling)?.reshape(&[1, 1])?;
        cache.commit(&written, ids.len(), &[&token])?;
        token
    };
    let mut next = token.to_vec::<i64>()?[0];
    let prefill_s = start.elapsed().as_secs_f64();
    // The decode step: token `[1, 1]` and position (0-d) in, the next of each out (its
    // arguments and the captured cache are all it depends on, so it replays).
    let step = coil::compile(|a: &[Tensor]| {
        let mut cache = cache.borrow_mut();
        let (logits, written) = model.forward_cached(&a[0], &a[1], &cache)?;
        cache.write(&written, &[])?;
        Ok(vec![logits.sample_tokens(&args.sampling)?.reshape(&[1, 1])?, &a[1] + 1i64])
    })
    .named("decode_step")
    .replay(true)
    .cuda_graphs(args.cuda_graphs);
    let mut step_args = [token, cache.borrow().position()?];
    let start = Instant::now();
    let mut steps = 0;
    for i in 0..tokens {
        ids.push(next);
        if i + 1 == tokens {
            break;
        }
        let [token, pos]: [Tensor; 2] = step.call(&[&step_args[0], &step_args[1]])?.try_into().expect("two outputs");
        next = token.to_vec::<i64>()?[0];
        step_args = [token, pos];
        steps += 1;
    }
    Ok(Generated { ids, prefill_s, decode_s: start.elapsed().as_secs_f64(), steps })
}

fn main() -> coil::Result<()> {
    let args = parse();
    let store = ParamStore::new();
    store.eval();
    let (model, tokenizer, line) = load(&args, &store)?;
    println!("{line}");
    coil::set_cuda_graphs(args.cuda_graphs);
    let block = model.max_positions();
    let vocab = model.vocab_size() as i64;

    let mut ids: Vec<i64> = tokenizer.encode(&args.prompt)?.into_iter().map(|i| i % vocab).collect();
    if ids.is_empty() {
        ids.push(0);
    }
    ids.truncate(block - 1);
    let tokens = args.tokens.min(block - ids.len());
    let compiles = coil::compile_count();
    // With --warm, a first generation compiles (and, with --cuda-graphs, captures) untimed.
    if args.warm {
        generate(model.as_ref(), &ids, tokens, &args)?;
    }
    let run = generate(model.as_ref(), &ids, tokens, &args)?;
    println!("{}", tokenizer.decode(&run.ids));
    let when = if args.warm { "warm" } else { "first run: compiles included" };
    println!(
        "-- prefill of {} tokens in {:.1} ms ({:.0} tokens/s); {} decode steps in {:.3} s ({:.1} tokens/s); {when}; {} graph(s) compiled",
        ids.len(),
        run.prefill_s * 1e3,
        ids.len() as f64 / run.prefill_s,
        run.steps,
        run.decode_s,
        run.steps as f64 / run.decode_s.max(1e-9),
        coil::compile_count() - compiles
    );
    Ok(())
}
