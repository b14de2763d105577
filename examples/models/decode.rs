//! The decode rows, as `bench/models_torch.py` measures them: a prompt of 512 tokens (prefill,
//! untimed for the decode rows), then 256 decode steps (positions 512..767 of a cache of 768),
//! greedy, bf16 weights (random, from a fixed seed): GPT-2 124M and a Llama of Llama 3.2 1B's
//! sizes, at batch 1 and 16. The decode step is a compiled function that replays
//! (`CompiledFn::replay`: after its first two calls, a call runs the compiled graph without
//! running the step's Rust code) with the cache captured and written in place, the token and
//! the position its arguments: each step's next token is the argmax on the device and the next
//! position is computed there too, both fed to the next step without a host round trip. The
//! step and its cache are made once per batch size and serve every generation. The prefill is
//! a compiled function too (replayed the same way, as `torch.compile(prefill)` on the PyTorch
//! side), writing the cache in place. A row's time is per step: the device time of the 256-step loop (CUDA events around it,
//! after a 256 MiB L2 flush) over 256, median of the loops; the prefill row is the prefill's
//! time over 512. The peak memory of a decode row is over its last decode loop, of the prefill
//! row over its last prefill, each from the bytes in use as it began (as `models_torch.py`
//! measures its calls). A decode row also reports the host's time per step (`coil_host_ms`): the
//! median over 5 loops of [`HOST_WINDOW`] steps of each step's call until it returns, its work
//! enqueued and not waited for (nothing in the loop reads the device): the host's own cost per
//! token while the device keeps up. The first step after a prefill costs more (its arguments
//! are new tensors, and it binds the new cache contents): the row's notes give it apart, once
//! per generation. (Over the 256-step loop the host can fill the device's launch queue and
//! then waits for the device: Llama 1B at batch 1 showed 340 us per step that way, against 32 us
//! with the device idle.)

use super::{median, Opts, Row, Timer, Times};

/// Decode steps of a loop whose host time is measured: few enough that their launches fit in
/// the device's queue.
const HOST_WINDOW: usize = 16;
use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
use coil::nn::models::llama::{Llama, LlamaConfig};
use coil::nn::models::CausalLm;
use coil::nn::{KvCache, ParamStore};
use coil::{CompiledFn, DType, Device, Tensor};
use std::cell::RefCell;
use std::time::Instant;

/// One prefill (`prefill`: the prompt and its start position in, the first token out) then
/// `new_tokens` greedy decode steps (`step`), over `cache`; returns the times of the prefill and
/// of the decode loop, each step's host time (until its call returned) in microseconds, and the
/// peak bytes of the prefill and of the decode loop (each from the bytes in use as it began, as
/// `models_torch.py` measures its prefill and decode-loop calls).
fn generate<P, F>(
    cache: &RefCell<KvCache>,
    prefill: &CompiledFn<P>,
    step: &CompiledFn<F>,
    prompt: &Tensor,
    new_tokens: usize,
    timer: &Timer,
) -> coil::Result<(Times, Times, Vec<f64>, Peaks)>
where
    P: Fn(&[Tensor]) -> coil::Result<Vec<Tensor>>,
    F: Fn(&[Tensor]) -> coil::Result<Vec<Tensor>>,
{
    let len = prompt.shape()[1];
    if len + new_tokens > cache.borrow().capacity() {
        return Err(coil::Error::value(format!("{len} + {new_tokens} positions exceed the cache")));
    }
    cache.borrow_mut().clear();
    let start = cache.borrow().position()?;
    let mut next = None;
    timer.reset_peak();
    let prefill = timer.time(&mut || {
        next = prefill.call(&[prompt, &start])?.pop();
        cache.borrow_mut().advance(len)
    })?;
    let prefill_peak = timer.peak();
    let mut args = [next.expect("prefilled"), cache.borrow().position()?];
    let mut each = Vec::with_capacity(new_tokens);
    timer.reset_peak();
    let decode = timer.time(&mut || {
        for _ in 0..new_tokens {
            let start = Instant::now();
            let [token, pos]: [Tensor; 2] = step.call(&[&args[0], &args[1]])?.try_into().expect("two outputs");
            args = [token, pos];
            each.push(start.elapsed().as_secs_f64() * 1e6);
        }
        Ok(())
    })?;
    Ok((prefill, decode, each, Peaks { prefill: prefill_peak, decode: timer.peak() }))
}

/// Peak bytes in use during a generation's prefill and during its decode loop.
#[derive(Clone, Copy, Default)]
struct Peaks {
    prefill: usize,
    decode: usize,
}

/// Builds a model with random weights on a device (tiny or full size).
type Build = fn(&ParamStore, Device, bool) -> coil::Result<Box<dyn CausalLm>>;

/// The decode (and prefill) rows `o` asks for.
pub fn rows(o: &Opts, timer: &Timer) -> coil::Result<Vec<Row>> {
    let (prompt_len, new_tokens) = if o.tiny { (16, 8) } else { (512, 256) };
    let wanted = |r: &str| o.rows.is_empty() || o.rows.iter().any(|w| w == r);
    let mut out = Vec::new();
    let models: [(&str, Build); 2] = [("gpt2_124m", gpt2), ("llama_1b", llama)];
    for (prefix, build) in models {
        let prefix = if o.tiny { prefix.replace("124m", "tiny").replace("1b", "tiny") } else { prefix.to_string() };
        let names: Vec<String> = [1, 16]
            .iter()
            .map(|b| format!("{prefix}_decode_b{b}_bf16"))
            .chain(prefix.starts_with("llama").then(|| format!("{prefix}_prefill_bf16")))
            .collect();
        if !names.iter().any(|n| wanted(n)) {
            continue;
        }
        coil::manual_seed(0);
        let store = ParamStore::new();
        store.eval();
        let model = build(&store, o.device, o.tiny)?;
        store.realize_pending()?;
        eprintln!("{prefix}: {} parameters, bf16", store.num_elements());
        for batch in [1usize, 16] {
            let name = format!("{prefix}_decode_b{batch}_bf16");
            let prefill_name = format!("{prefix}_prefill_bf16");
            let want_prefill = batch == 1 && prefix.starts_with("llama") && wanted(&prefill_name);
            if !wanted(&name) && !want_prefill {
                continue;
            }
            let prompt = random_ids(batch, prompt_len, model.vocab_size())?.to_device(o.device)?;
            let first = Instant::now();
            let capacity = prompt_len + new_tokens;
            let compiles = coil::compile_count();
            let was = coil::set_cuda_graphs(o.cuda_graphs);
            let cache = RefCell::new(model.new_cache(batch, capacity)?);
            // The token `[B, 1]` and the position (0-d) in, the next of each out: the step
            // depends on nothing else of the host's (the contract of a replayed function).
            // The prefill as torch.compile(prefill) runs it: a compiled function (replayed:
            // its Rust code runs for the first calls only), the cache written in place, not
            // from a CUDA graph (torch's default mode): a captured prefill would hold its
            // temporaries (hundreds of MiB at batch 16) through every decode step.
            let prefill = coil::compile(|a: &[Tensor]| {
                let mut cache = cache.borrow_mut();
                let (logits, written) = model.forward_cached(&a[0], &a[1], &cache)?;
                cache.write(&written, &[])?;
                Ok(vec![logits.argmax(Some(-1), false)?.reshape(&[batch as i64, 1])?])
            })
            .named("prefill")
            .replay(true)
            .cuda_graphs(false);
            let step = coil::compile(|a: &[Tensor]| {
                let mut cache = cache.borrow_mut();
                let (logits, written) = model.forward_cached(&a[0], &a[1], &cache)?;
                cache.write(&written, &[])?;
                Ok(vec![logits.argmax(Some(-1), false)?.reshape(&[batch as i64, 1])?, &a[1] + 1i64])
            })
            .named("decode_step")
            .replay(true)
            .cuda_graphs(o.cuda_graphs);
            // Compiles the prefill and decode graphs; the decode step's first two calls arm its replay.
            generate(&cache, &prefill, &step, &prompt, 3, timer)?;
            let compile_s = first.elapsed().as_secs_f64();
            let (mut pre, mut dec, mut peaks) = (Vec::new(), Vec::new(), Peaks::default());
            for _ in 0..o.reps.clamp(1, 5) {
                let (p, d, _, last) = generate(&cache, &prefill, &step, &prompt, new_tokens, timer)?;
                pre.push(p);
                dec.push(d);
                peaks = last;
            }
            let window = HOST_WINDOW.min(new_tokens); // the tiny models' cache holds fewer
            let host = (0..5)
                .map(|_| generate(&cache, &prefill, &step, &prompt, window, timer).map(|(_, _, h, _)| h))
                .collect::<coil::Result<Vec<_>>>()?;
            let first_step_us = median(host.iter().map(|h| h[0]).collect());
            let step_us = median(host.concat());
            let graphs = coil::compile_count() - compiles;
            coil::set_cuda_graphs(was);
            let stats = step.stats();
            let replay = match (o.cuda_graphs, step.replay_blocker()) {
                (true, None) => "the step replayed (no Rust code per step) from CUDA graphs".to_string(),
                (false, None) => "the step replayed (no Rust code per step), no CUDA graphs".to_string(),
                (_, Some(why)) => format!("the step NOT replayed: {why}"),
            };
            let replay = format!("{replay}; {} of {} step calls replayed", stats.replays, stats.calls);
            let per =
                |v: &[Times], f: fn(&Times) -> f64, n: usize| median(v.iter().map(|t| f(t) / 1e3 / n as f64).collect());
            let steps = new_tokens;
            if wanted(&name) {
                let row = Row {
                    name: name.clone(),
                    device_ms: per(&dec, |t| t.device, steps),
                    wall_ms: per(&dec, |t| t.wall, steps),
                    host_ms: Some(step_us / 1e3),
                    peak: peaks.decode,
                    compile_s: (compile_s - per(&pre, |t| t.wall, 1) / 1e3).max(0.0),
                    notes: format!(
                        "per step (batch {batch} tokens): {steps} greedy decode steps after a {prompt_len}-token prefill, KV cache of {capacity} written in place, argmax on the device, {replay}; {graphs} graphs compiled (cache, prefill, decode); host per step {step_us:.1} us (median of {} steps), the first step after a prefill {first_step_us:.0} us",
                        5 * window
                    ),
                    per_token_batch: Some(batch),
                };
                eprintln!(
                    "{:<28} {:9.3} ms/token device  {:9.3} wall  {:7.1} us host",
                    row.name,
                    row.device_ms,
                    row.wall_ms,
                    row.host_ms.unwrap_or(0.0) * 1e3
                );
                out.push(row);
            }
            if want_prefill {
                let row = Row {
                    name: prefill_name,
                    device_ms: per(&pre, |t| t.device, prompt_len),
                    wall_ms: per(&pre, |t| t.wall, prompt_len),
                    host_ms: None,
                    peak: peaks.prefill,
                    compile_s: 0.0,
                    notes: format!(
                        "per token: a {prompt_len}-token prefill at batch 1 over {prompt_len}, a compiled function (replayed, not from a CUDA graph: {} of {} calls), the cache written in place",
                        prefill.stats().replays,
                        prefill.stats().calls
                    ),
                    per_token_batch: Some(1),
                };
                eprintln!("{:<28} {:9.4} ms/token device  {:9.4} wall", row.name, row.device_ms, row.wall_ms);
                out.push(row);
            }
        }
    }
    Ok(out)
}

fn gpt2(store: &ParamStore, device: Device, tiny: bool) -> coil::Result<Box<dyn CausalLm>> {
    let config = if tiny { Gpt2Config::tiny() } else { Gpt2Config::gpt2_124m() };
    Ok(Box::new(Gpt2::new(&store.root(device, DType::BF16), config)?))
}

fn llama(store: &ParamStore, device: Device, tiny: bool) -> coil::Result<Box<dyn CausalLm>> {
    let config = if tiny { LlamaConfig::tiny() } else { LlamaConfig::llama_1b() };
    Ok(Box::new(Llama::new(&store.root(device, DType::BF16), config)?))
}

/// Token ids uniform over the vocabulary, from a fixed seed.
fn random_ids(batch: usize, len: usize, vocab: usize) -> coil::Result<Tensor> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let v: Vec<i64> = (0..batch * len)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) % vocab as u64) as i64
        })
        .collect();
    Tensor::from_vec(v, &[batch, len])
}
