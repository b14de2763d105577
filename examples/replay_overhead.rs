//! The host's time per call of a compiled function, traced (the body runs: lazy ops recorded,
//! the graph walked and compared with the cached one, inputs bound) against replayed
//! (`CompiledFn::replay`: guards checked, inputs bound, the compiled graph run), for a tiny
//! graph and for decode steps with GPT-2 124M's and Llama 3.2 1B's graphs (every layer, head
//! and op), the key/value cache written in place, at each batch size of `--batch`. By default
//! the widths are small, so that the CPU runs them; `--full` takes the models' own sizes in
//! bf16 (for a GPU).
//!
//! ```sh
//! cargo run --release --example replay_overhead                     # CPU
//! cargo run --release --example replay_overhead -- --device cuda --cuda-graphs --full
//! ```
//!
//! Per workload and mode, medians over `--calls` calls (after 3 warm-up calls), in
//! microseconds:
//! - `call`: the whole call, the device idle before it (synchronized after each call);
//! - `run`: the graph's run inside it (binding and enqueueing; on the CPU also executing the
//!   kernels; with CUDA graphs: the copies of moved inputs and the graph's launch);
//! - `call-run`: the rest, what the replay removes of the traced call (the body, the walk);
//! - `queued`, replayed only: the call when `--calls` calls run back to back without waiting
//!   for the device (a decode loop, what the `models` example's `coil_host_ms` measures), as
//!   the median of the first and of the last quarter of those calls. A last quarter far above
//!   the first is the host waiting for room in the device's queue (the device is slower than
//!   the host), not host work.

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
    batches: Vec<usize>,
    full: bool,
}

fn parse() -> Opts {
    let mut o = Opts { device: Device::Cpu, calls: 200, cuda_graphs: false, batches: vec![1, 16], full: false };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--device" => o.device = v().parse().expect("--device cpu|cuda|cuda:N"),
            "--calls" => o.calls = v().parse().expect("--calls N"),
            "--cuda-graphs" => o.cuda_graphs = true,
            "--batch" => o.batches = v().split(',').map(|b| b.parse().expect("--batch 1,16")).collect(),
            "--full" => o.full = true,
            _ => panic!("unknown argument {a}: --device, --calls, --cuda-graphs, --batch, --full"),
        }
    }
    o
}

/// Medians in microseconds: the call, the graph's run, the call less the run; queued calls'
/// first and last quarters (replayed only).
struct Timing {
    call: f64,
    run: f64,
    rest: f64,
    queued: Option<(f64, f64)>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Times `calls` calls of `call` after 3 warm-up calls, waiting for the device after each;
/// then, with `queued`, `calls` more back to back.
fn time(calls: usize, queued: bool, call: &mut dyn FnMut() -> coil::Result<()>) -> coil::Result<Timing> {
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
        coil::synchronize()?; // the device keeps up: host time only (nothing to wait for on the CPU)
    }
    let queued = if queued {
        let mut each = Vec::with_capacity(calls);
        for _ in 0..calls {
            let t = Instant::now();
            call()?;
            each.push(t.elapsed().as_secs_f64() * 1e6);
        }
        coil::synchronize()?;
        let quarter = (calls / 4).max(1);
        Some((median(each[..quarter].to_vec()), median(each[calls - quarter..].to_vec())))
    } else {
        None
    };
    Ok(Timing { call: median(total), run: median(run), rest: median(rest), queued })
}

fn report(name: &str, batch: usize, mode: &str, t: &Timing) {
    let queued = t.queued.map_or(String::new(), |(first, last)| format!(" {first:10.1} {last:10.1}"));
    println!("{name:<20} {batch:>5} {mode:<9} {:10.1} {:10.1} {:10.1}{queued}", t.call, t.run, t.rest);
}

/// A graph of a few nodes: `x * 2 + 1` over 16 elements.
fn tiny(o: &Opts) -> coil::Result<()> {
    let x = Tensor::from_vec((0..16).map(|i| i as f32).collect(), &[16])?.to_device(o.device)?;
    for replay in [false, true] {
        let f = coil::compile(|a: &[Tensor]| Ok(vec![&(&a[0] * 2.0) + 1.0])).replay(replay).cuda_graphs(o.cuda_graphs);
        let t = time(o.calls, replay, &mut || f.call(&[&x]).map(drop))?;
        report("tiny (3 nodes)", 1, if replay { "replayed" } else { "traced" }, &t);
    }
    Ok(())
}

/// Decode steps of `model` at `batch`: traced, then replayed.
fn decode(name: &str, model: &dyn CausalLm, batch: usize, o: &Opts) -> coil::Result<()> {
    let capacity = 64;
    for replay in [false, true] {
        let cache: RefCell<KvCache> = RefCell::new(model.new_cache(batch, capacity)?);
        let step = coil::compile(|a: &[Tensor]| {
            let mut cache = cache.borrow_mut();
            let (logits, written) = model.forward_cached(&a[0], &a[1], &cache)?;
            cache.write(&written, &[])?;
            Ok(vec![logits.argmax(Some(-1), false)?.reshape(&[batch as i64, 1])?, &a[1] + 1i64])
        })
        .replay(replay)
        .replay_check(0)
        .cuda_graphs(o.cuda_graphs);
        let mut args = [
            Tensor::from_vec(vec![1i64; batch], &[batch, 1])?.to_device(o.device)?,
            Tensor::from_vec(vec![0i64], &[])?.to_device(o.device)?,
        ];
        // Positions wrap around the cache (attention reads what is before the position).
        let restart = Tensor::from_vec(vec![0i64], &[])?.to_device(o.device)?;
        let mut steps = 0;
        let t = time(o.calls, replay, &mut || {
            let [token, pos]: [Tensor; 2] = step.call(&[&args[0], &args[1]])?.try_into().expect("two outputs");
            steps += 1;
            // A traced call's outputs keep the lazy ops that made them: detached (they are
            // computed), so that the loop does not keep every step's graph alive.
            let pos = if steps % (capacity - 1) == 0 { restart.clone() } else { pos.detach()? };
            args = [token.detach()?, pos];
            Ok(())
        })?;
        report(name, batch, if replay { "replayed" } else { "traced" }, &t);
        if replay {
            let s = step.stats();
            assert_eq!(s.replays + 2, s.calls, "every call but the first two replayed: {:?}", step.replay_blocker());
        }
    }
    Ok(())
}

fn main() -> coil::Result<()> {
    let o = parse();
    let (dtype, widths) = if o.full { (DType::BF16, "full widths, bf16") } else { (DType::F32, "small widths, f32") };
    println!("host time per call, median of {} calls, us ({}; decode graphs at {widths})", o.calls, o.device);
    println!(
        "{:<20} {:>5} {:<9} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "workload", "batch", "mode", "call", "run", "call-run", "queued 1st", "queued 4th"
    );
    tiny(&o)?;
    let store = ParamStore::new();
    store.eval();
    let root = store.root(o.device, dtype);
    let gpt2 = if o.full {
        Gpt2Config { block_size: 64, ..Gpt2Config::gpt2_124m() }
    } else {
        Gpt2Config {
            vocab_size: 256,
            block_size: 64,
            n_layer: 12,
            n_head: 12,
            n_embd: 96,
            dropout: 0.0,
            layer_norm_eps: 1e-5,
        }
    };
    let gpt2 = Gpt2::new(&root.pp("gpt2"), gpt2)?;
    let llama = if o.full {
        LlamaConfig { max_positions: 64, ..LlamaConfig::llama_1b() }
    } else {
        LlamaConfig {
            vocab_size: 256,
            hidden_size: 128,
            intermediate_size: 256,
            n_layer: 16,
            n_head: 32,
            n_kv_head: 8,
            max_positions: 64,
            ..LlamaConfig::llama_1b()
        }
    };
    let llama = Llama::new(&root.pp("llama"), llama)?;
    store.realize_pending()?;
    for &batch in &o.batches {
        decode("gpt2 124m decode", &gpt2, batch, &o)?;
    }
    for &batch in &o.batches {
        decode("llama 1b decode", &llama, batch, &o)?;
    }
    Ok(())
}
