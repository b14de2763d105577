//! Decode loops through a replayed compiled function (`CompiledFn::replay`) against plain ones
//! (each step realized with `KvCache::commit`), on any device: shared by `tests/replay.rs` (CPU)
//! and `tests/gpu.rs` (CUDA, with and without CUDA graphs).

use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
use coil::nn::models::llama::{Llama, LlamaConfig};
use coil::nn::models::CausalLm;
use coil::nn::ParamStore;
use coil::{DType, Device, Sampling, Tensor};
use std::cell::{Cell, RefCell};

/// The tiny models the loops run: GPT-2 (fused projections) and Llama (rotary, grouped-query).
pub const MODELS: [&str; 2] = ["gpt2", "llama"];

fn model(name: &str, store: &ParamStore, device: Device) -> Box<dyn CausalLm> {
    let root = store.root(device, DType::F32);
    match name {
        "gpt2" => {
            let config = Gpt2Config {
                vocab_size: 97,
                block_size: 32,
                n_layer: 2,
                n_head: 2,
                n_embd: 32,
                dropout: 0.0,
                layer_norm_eps: 1e-5,
            };
            Box::new(Gpt2::new(&root, config).unwrap())
        }
        _ => Box::new(
            Llama::new(&root, LlamaConfig { vocab_size: 97, max_positions: 32, ..LlamaConfig::tiny() }).unwrap(),
        ),
    }
}

/// What a decode loop produced: every step's tokens, the last step's logits, the cache.
pub struct Decoded {
    pub tokens: Vec<i64>,
    pub logits: Vec<f32>,
    pub cache: Vec<f32>,
    /// For the replayed loop: how many times the step's body ran, and how many calls replayed.
    pub bodies: usize,
    pub replays: usize,
}

const STEPS: usize = 12;

/// Prefills 8 tokens of 2 sequences, then decodes [`STEPS`] tokens (`sampling`: greedy, or
/// drawn on the device); `replay`: through a replayed compiled step (with CUDA graphs when
/// `cuda_graphs`), else each step realized with `KvCache::commit`.
pub fn decode(name: &str, device: Device, sampling: &Sampling, replay: bool, cuda_graphs: bool) -> Decoded {
    coil::manual_seed(5);
    let store = ParamStore::new();
    store.eval();
    let model = model(name, &store, device);
    store.realize_pending().unwrap();
    let cache = RefCell::new(model.new_cache(2, 24).unwrap());
    let sample = |logits: &Tensor| logits.sample_tokens(sampling).unwrap().reshape(&[2, 1]).unwrap();
    let prompt = Tensor::from_vec((0..16).map(|i| (i * 7 % 97) as i64).collect(), &[2, 8]).unwrap();
    let prompt = prompt.to_device(device).unwrap();
    let mut next = {
        let mut cache = cache.borrow_mut();
        let (logits, written) = model.forward_cached(&prompt, &cache.position().unwrap(), &cache).unwrap();
        let next = sample(&logits);
        cache.commit(&written, 8, &[&next]).unwrap();
        next
    };
    let (mut tokens, mut logits) = (Vec::new(), Vec::new());
    let bodies = Cell::new(0);
    let step = coil::compile(|a: &[Tensor]| {
        bodies.set(bodies.get() + 1);
        let mut cache = cache.borrow_mut();
        let (logits, written) = model.forward_cached(&a[0], &a[1], &cache)?;
        cache.write(&written, &[])?;
        Ok(vec![logits.sample_tokens(sampling)?.reshape(&[2, 1])?, &a[1] + 1i64, logits])
    })
    .replay(true)
    .replay_check(0)
    .cuda_graphs(cuda_graphs);
    let mut pos = cache.borrow().position().unwrap();
    for _ in 0..STEPS {
        if replay {
            let out = step.call(&[&next, &pos]).unwrap();
            (next, pos) = (out[0].clone(), out[1].clone());
            logits = out[2].to_vec::<f32>().unwrap();
        } else {
            let mut cache = cache.borrow_mut();
            let (l, written) = model.forward_cached(&next, &cache.position().unwrap(), &cache).unwrap();
            next = sample(&l);
            cache.commit(&written, 1, &[&next, &l]).unwrap();
            logits = l.to_vec::<f32>().unwrap();
        }
        tokens.extend(next.to_vec::<i64>().unwrap());
    }
    let cache = cache.borrow();
    let mut values = Vec::new();
    for t in cache.k.iter().chain(&cache.v) {
        values.extend(t.to_vec::<f32>().unwrap());
    }
    Decoded { tokens, logits, cache: values, bodies: bodies.get(), replays: step.stats().replays }
}

/// The replayed loop gives the plain loop's tokens, logits and cache; its body ran twice.
pub fn check_replayed_decode(name: &str, device: Device, sampling: &Sampling, cuda_graphs: bool) {
    let plain = decode(name, device, sampling, false, false);
    let replayed = decode(name, device, sampling, true, cuda_graphs);
    let what = format!("{name} on {device}, {sampling:?}, CUDA graphs {cuda_graphs}");
    assert_eq!((replayed.bodies, replayed.replays), (2, STEPS - 2), "{what}: the first two calls trace");
    assert_eq!(plain.tokens, replayed.tokens, "{what}: tokens");
    let close = |a: &[f32], b: &[f32], part: &str| {
        assert_eq!(a.len(), b.len());
        for (k, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-4 * (1.0 + x.abs()), "{what}: {part} {k}: plain {x}, replayed {y}");
        }
    };
    close(&plain.logits, &replayed.logits, "logit");
    close(&plain.cache, &replayed.cache, "cache element");
}
