//! The host's time per call of a compiled function, traced (the body runs: lazy ops recorded,
//! the graph walked and compared with the cached one, inputs bound) against replayed
//! (`CompiledFn::replay`: guards checked, inputs bound, the compiled graph run), for a tiny
//! graph and for decode steps with GPT-2 124M's and Llama 3.2 1B's graphs (every layer, head
//! and op; small widths, so that the CPU runs them), the key/value cache written in place.
//!
//! ```sh
//! cargo run --release --example replay_overhead                     # CPU
//! cargo run --release --example replay_overhead -- --device cuda --cuda-graphs
//! ```
//!
//! Per workload and mode: the median over `--calls` calls (after 3 warm-up calls) of the whole
//! call, of the graph's run inside it (binding and enqueueing; on the CPU also executing the
//! kernels), and of the rest (the call less the run: what the replay removes).

use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
use coil::nn::models::llama::{Llama, LlamaConfig};
use coil::nn::models::CausalLm;
use coil::nn::{KvCache, ParamStore};
use coil::profile::host_times;
use coil::{DType, Device, Tensor};
use std::cell::RefCell;
use std::time::Instant;

struct Opts {
    device: Device,
    calls: usize,
    cuda_graphs: bool,
}

fn parse() -> Opts {
    let mut o = Opts { device: Device::Cpu, calls: 200, cuda_graphs: false };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--device" => o.device = v().parse().expect("--device cpu|cuda|cuda:N"),
            "--calls" => o.calls = v().parse().expect("--calls N"),
            "--cuda-graphs" => o.cuda_graphs = true,
            _ => panic!("unknown argument {a}: --device, --calls, --cuda-graphs"),
        }
    }
    o
}

/// Medians in microseconds: the call, the graph's run, the call less the run.
struct Timing {
    call: f64,
    run: f64,
    rest: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Times `calls` calls of `call` after 3 warm-up calls; `call` returns what the next call takes.
fn time(calls: usize, device: Device, call: &mut dyn FnMut() -> coil::Result<()>) -> coil::Result<Timing> {
    for _ in 0..3 {
        call()?;
    }
    coil::synchronize()?;
    let (mut total, mut run, mut rest) = (vec![], vec![], vec![]);
    for _ in 0..calls {
        let (t, h) = (Instant::now(), host_times());
        call()?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        let r = host_times().since(&h).run.as_secs_f64() * 1e6;
        total.push(us);
        run.push(r);
        rest.push(us - r);
        if device != Device::Cpu {
            coil::synchronize()?; // the device keeps up: host time only
        }
    }
    Ok(Timing { call: median(total), run: median(run), rest: median(rest) })
}

fn report(name: &str, mode: &str, t: &Timing) {
    println!("{name:<24} {mode:<9} {:10.1} {:10.1} {:10.1}", t.call, t.run, t.rest);
}

/// A graph of a few nodes: `x * 2 + 1` over 16 elements.
fn tiny(o: &Opts) -> coil::Result<()> {
    let x = Tensor::from_vec((0..16).map(|i| i as f32).collect(), &[16])?.to_device(o.device)?;
    for replay in [false, true] {
        let f = coil::compile(|a: &[Tensor]| Ok(vec![&(&a[0] * 2.0) + 1.0])).replay(replay).cuda_graphs(o.cuda_graphs);
        let t = time(o.calls, o.device, &mut || f.call(&[&x]).map(drop))?;
        report("tiny (3 nodes)", if replay { "replayed" } else { "traced" }, &t);
    }
    Ok(())
}

/// Decode steps of `model` at batch 1: traced, then replayed.
fn decode(name: &str, model: &dyn CausalLm, o: &Opts) -> coil::Result<()> {
    let capacity = 64;
    for replay in [false, true] {
        let cache: RefCell<KvCache> = RefCell::new(model.new_cache(1, capacity)?);
        let step = coil::compile(|a: &[Tensor]| {
            let mut cache = cache.borrow_mut();
            let (logits, written) = model.forward_cached(&a[0], &a[1], &cache)?;
            cache.write(&written, &[])?;
            Ok(vec![logits.argmax(Some(-1), false)?.reshape(&[1, 1])?, &a[1] + 1i64])
        })
        .replay(replay)
        .replay_check(0)
        .cuda_graphs(o.cuda_graphs);
        let mut args = [
            Tensor::from_vec(vec![1i64], &[1, 1])?.to_device(o.device)?,
            Tensor::from_vec(vec![0i64], &[])?.to_device(o.device)?,
        ];
        // Positions wrap around the cache (attention reads what is before the position).
        let restart = Tensor::from_vec(vec![0i64], &[])?.to_device(o.device)?;
        let mut steps = 0;
        let t = time(o.calls, o.device, &mut || {
            let [token, pos]: [Tensor; 2] = step.call(&[&args[0], &args[1]])?.try_into().expect("two outputs");
            steps += 1;
            args = [token, if steps % (capacity - 1) == 0 { restart.clone() } else { pos }];
            Ok(())
        })?;
        report(name, if replay { "replayed" } else { "traced" }, &t);
        if replay {
            let s = step.stats();
            assert_eq!(s.replays + 2, s.calls, "every call but the first two replayed: {:?}", step.replay_blocker());
        }
    }
    Ok(())
}

fn main() -> coil::Result<()> {
    let o = parse();
    println!("host time per call, median of {} calls, us ({})", o.calls, o.device);
    println!("{:<24} {:<9} {:>10} {:>10} {:>10}", "workload", "mode", "call", "run", "call-run");
    tiny(&o)?;
    let store = ParamStore::new();
    store.eval();
    let root = store.root(o.device, DType::F32);
    let gpt2 = Gpt2Config {
        vocab_size: 256,
        block_size: 64,
        n_layer: 12,
        n_head: 12,
        n_embd: 96,
        dropout: 0.0,
        layer_norm_eps: 1e-5,
    };
    let gpt2 = Gpt2::new(&root.pp("gpt2"), gpt2)?;
    let llama = LlamaConfig {
        vocab_size: 256,
        hidden_size: 128,
        intermediate_size: 256,
        n_layer: 16,
        n_head: 32,
        n_kv_head: 8,
        max_positions: 64,
        ..LlamaConfig::llama_1b()
    };
    let llama = Llama::new(&root.pp("llama"), llama)?;
    store.realize_pending()?;
    decode("gpt2 124m graph decode", &gpt2, &o)?;
    decode("llama 1b graph decode", &llama, &o)?;
    Ok(())
}
