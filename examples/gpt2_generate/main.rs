//! Samples text from a GPT-2: a checkpoint of `gpt2_train` (byte-level), or a Hugging Face GPT-2
//! `model.safetensors` with its tokenizer files (`vocab.json`, `merges.txt`) and `config.json`
//! beside it (as the Hub's `gpt2` repository has them).
//!
//! ```sh
//! cargo run --release --example gpt2_generate -- --checkpoint ckpt/gpt2-bytes --prompt "fn main"
//! cargo run --release --example gpt2_generate -- --hf path/to/gpt2/model.safetensors \
//!     --prompt "The meaning of life is" --tokens 40 --temperature 0.8 --top-p 0.95
//! ```
//!
//! Greedy decoding by default (`--temperature 0`), else sampling from the softmax at that
//! temperature, restricted by `--top-k K` and `--top-p P` (nucleus), seeded by `--seed`
//! ([`Tensor::sample_tokens`]: the token is drawn on the device, in the step's graph, so only
//! its id comes back to the host). The prompt fills a key/value cache (prefill), then each
//! token is one decode step that writes its keys and values into the cache in place; the
//! position is a tensor and the random numbers' seed and offset are run-time arguments, so
//! every decode step is the same graph, compiled once.

mod bpe;

use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
use coil::nn::{LoadOptions, ParamStore};
use coil::safetensors::WeightFile;
use coil::{DType, Device, Sampling, Tensor};
use std::path::PathBuf;
use std::time::Instant;

struct Args {
    checkpoint: Option<PathBuf>,
    hf: Option<PathBuf>,
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
    if a.checkpoint.is_none() && a.hf.is_none() {
        a.checkpoint = Some("ckpt/gpt2-bytes".into());
    }
    a
}

/// How text becomes token ids and back: bytes for `gpt2_train`'s models, BPE for GPT-2's.
enum Tokenizer {
    Bytes,
    Bpe(Box<bpe::Bpe>),
}

impl Tokenizer {
    fn encode(&self, text: &str) -> Vec<i64> {
        match self {
            Tokenizer::Bytes => text.bytes().map(i64::from).collect(),
            Tokenizer::Bpe(b) => b.encode(text),
        }
    }

    fn decode(&self, ids: &[i64]) -> String {
        match self {
            Tokenizer::Bytes => String::from_utf8_lossy(&ids.iter().map(|&i| i as u8).collect::<Vec<_>>()).into_owned(),
            Tokenizer::Bpe(b) => b.decode(ids),
        }
    }
}

fn main() -> coil::Result<()> {
    let args = parse();
    let device = args.device;
    let store = ParamStore::new();
    store.eval();
    let (model, tokenizer) = if let Some(path) = &args.hf {
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
        let model = Gpt2::new(&store.root(device, DType::F32), config)?;
        let rename = |n: &str| Gpt2Config::hf_name(n);
        store.load_with(path, &LoadOptions { rename: Some(&rename), cast: true, ..Default::default() })?;
        let bpe = bpe::Bpe::load(dir).map_err(|e| coil::Error::runtime(format!("GPT-2's tokenizer: {e}")))?;
        (model, Tokenizer::Bpe(Box::new(bpe)))
    } else {
        let dir = args.checkpoint.clone().expect("a checkpoint");
        let file = dir.join("model.safetensors");
        let config = Gpt2Config::from_metadata(WeightFile::open(&file)?.metadata())?;
        let model = Gpt2::new(&store.root(device, DType::F32), config)?;
        store.load(&file)?;
        (model, Tokenizer::Bytes)
    };
    let block = model.config.block_size;
    println!(
        "GPT-2: {} layers, {} features, {:.1}M parameters, on {device}",
        model.config.n_layer,
        model.config.n_embd,
        store.num_elements() as f64 / 1e6
    );

    // Prefill the prompt into a key/value cache, then decode one token at a time: every decode
    // step is the same graph (the position is a tensor), compiled once.
    let mut ids = tokenizer.encode(&args.prompt);
    if ids.is_empty() {
        ids.push(0);
    }
    ids.truncate(block);
    let prompt_len = ids.len();
    let tokens = args.tokens.min(block - prompt_len);
    let mut cache = model.new_cache(1, block)?;
    coil::manual_seed(args.seed);
    let compiles = coil::compile_count();
    let start = Instant::now();
    let prompt = Tensor::from_vec(ids.clone(), &[1, prompt_len])?.to_device(device)?;
    let (logits, written) = model.forward_cached(&prompt, &cache.position()?, &cache)?;
    let token = logits.sample_tokens(&args.sampling)?;
    cache.commit(&written, prompt_len, &[&token])?;
    let mut next = token.to_vec::<i64>()?[0];
    let prefill = start.elapsed().as_secs_f64();
    let start = Instant::now();
    for i in 0..tokens {
        ids.push(next);
        if i + 1 == tokens {
            break;
        }
        let x = Tensor::from_vec(vec![next], &[1, 1])?.to_device(device)?;
        let (logits, written) = model.forward_cached(&x, &cache.position()?, &cache)?;
        let token = logits.sample_tokens(&args.sampling)?;
        cache.commit(&written, 1, &[&token])?;
        next = token.to_vec::<i64>()?[0];
    }
    let decode = start.elapsed().as_secs_f64();
    println!("{}", tokenizer.decode(&ids));
    println!(
        "-- prompt of {prompt_len} tokens in {:.1} ms ({:.0} tokens/s, first compile included); {tokens} tokens in {decode:.2} s ({:.1} tokens/s); {} graph(s) compiled",
        prefill * 1e3,
        prompt_len as f64 / prefill,
        tokens.saturating_sub(1) as f64 / decode.max(1e-9),
        coil::compile_count() - compiles
    );
    Ok(())
}
