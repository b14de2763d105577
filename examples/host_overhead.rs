//! Where the host's time goes in a GPT-2 training step (forward, backward, clipping, AdamW),
//! per phase, median over the calls after the first: recording the lazy ops, differentiating,
//! capture and guards of the gradients' graph, running it (binding inputs, enqueueing; on the
//! CPU also executing), and the same for the optimizer's graph.
//!
//! ```sh
//! cargo run --release --example host_overhead                           # 12 layers, small sizes, CPU
//! cargo run --release --example host_overhead -- --config 124m --device cuda --batch 8 --seq 1024 [--cuda-graphs]
//! cargo run --release --example host_overhead -- --config 124m --no-run # 124M's graph on the CPU
//! ```
//!
//! `--config 12l` (the default) is GPT-2 124M's graph (12 layers, 12 heads, the same ops and
//! edges) at small sizes, so that the CPU runs it; `--no-run` builds the step's graphs, times
//! capturing them without running anything, and times a warm start of the gradients graph
//! (compiled as a new process would, with the disk caches warm).

use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
use coil::nn::{clip_grad_norm, AdamW, AdamWConfig, Optimizer, ParamStore, Precision};
use coil::profile::{host_times, HostTimes};
use coil::{DType, Device, Tensor};
use std::time::{Duration, Instant};

struct Opts {
    device: Device,
    config: String,
    batch: usize,
    seq: usize,
    calls: usize,
    run: bool,
    cuda_graphs: bool,
}

fn parse() -> Opts {
    let mut o =
        Opts { device: Device::Cpu, config: "12l".into(), batch: 2, seq: 64, calls: 20, run: true, cuda_graphs: false };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--device" => o.device = v().parse().expect("--device cpu|cuda|cuda:N"),
            "--config" => o.config = v(),
            "--batch" => o.batch = v().parse().expect("--batch N"),
            "--seq" => o.seq = v().parse().expect("--seq N"),
            "--calls" => o.calls = v().parse().expect("--calls N"),
            "--no-run" => o.run = false,
            "--cuda-graphs" => o.cuda_graphs = true,
            _ => panic!(
                "unknown argument {a}: --device, --config tiny|12l|124m, --batch, --seq, --calls, --no-run, --cuda-graphs"
            ),
        }
    }
    o
}

fn config(name: &str) -> Gpt2Config {
    let small = |n_layer, n_head, n_embd| Gpt2Config {
        vocab_size: 256,
        block_size: 64,
        n_layer,
        n_head,
        n_embd,
        dropout: 0.0,
        layer_norm_eps: 1e-5,
    };
    match name {
        "tiny" => small(2, 2, 64),
        "12l" => small(12, 12, 96),
        "124m" => Gpt2Config::gpt2_124m(),
        _ => panic!("--config tiny|12l|124m"),
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One call's times: the whole call, the body's own recording, and the host phases.
struct Sample {
    call: f64,
    record: f64,
    host: HostTimes,
}

fn report(what: &str, samples: &[Sample]) {
    let m = |f: &dyn Fn(&Sample) -> f64| median(samples.iter().map(f).collect());
    let h = |f: fn(&HostTimes) -> Duration| m(&|s: &Sample| us(f(&s.host)));
    println!(
        "{what}: {:.0} us per call (median of {}): record {:.0}, differentiate {:.0}, capture {:.0}, hash {:.0}, \
         confirm {:.0}, guards {:.0}, run {:.0} (differentiations {}, hits {})",
        m(&|s| s.call),
        samples.len(),
        m(&|s| s.record),
        h(|t| t.differentiate),
        h(|t| t.capture),
        h(|t| t.hash),
        h(|t| t.confirm),
        h(|t| t.guards),
        h(|t| t.run),
        samples.iter().map(|s| s.host.differentiations).sum::<u64>(),
        samples.iter().map(|s| s.host.differentiation_hits).sum::<u64>(),
    );
}

fn main() -> coil::Result<()> {
    let o = parse();
    let device = o.device;
    let config = config(&o.config);
    coil::manual_seed(0);
    let store = ParamStore::new();
    store.set_precision(Precision::autocast(DType::BF16));
    let model = Gpt2::new(&store.root(device, DType::F32), config)?;
    store.realize_pending()?;
    let ids = |shift: i64| -> coil::Result<Tensor> {
        let v: Vec<i64> = (0..o.batch * o.seq).map(|i| (i as i64 * 7 + shift) % config.vocab_size as i64).collect();
        Tensor::from_vec(v, &[o.batch, o.seq])?.to_device(device)
    };
    let (x, y) = (ids(0)?, ids(1)?);
    let params = store.trainable();

    if !o.run {
        // The step's gradients graph, captured and compared without running anything.
        let (mut record, mut differentiate, mut capture, mut hash, mut confirm) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut nodes = 0;
        for _ in 0..o.calls.max(2) {
            let t = Instant::now();
            let loss = model.loss(&x, &y)?;
            record.push(us(t.elapsed()));
            let t = Instant::now();
            let (loss, grads) = coil::nn::value_and_grad(&loss, &params)?;
            differentiate.push(us(t.elapsed()));
            let outs: Vec<&Tensor> = std::iter::once(&loss).chain(&grads).collect();
            let t = Instant::now();
            let captured = coil::capture(&outs);
            capture.push(us(t.elapsed()));
            let t = Instant::now();
            let _ = coil_frontend::dynamo::structural_hash(&captured.graph, device);
            hash.push(us(t.elapsed()));
            let again = coil::capture(&outs);
            let t = Instant::now();
            assert!(coil_frontend::dynamo::same_structure(&captured.graph, &again.graph));
            confirm.push(us(t.elapsed()));
            nodes = captured.graph.nodes.len();
        }
        println!(
            "gradients graph of {nodes} nodes, not run (medians, us): record {:.0}, value_and_grad {:.0} (outside a \
             compiled function: differentiated each time), capture with graph {:.0}, hash {:.0}, confirm {:.0}",
            median(record),
            median(differentiate),
            median(capture),
            median(hash),
            median(confirm)
        );
        // A warm start: compiled as another process would, with the disk caches warm.
        let (loss, grads) = coil::nn::value_and_grad(&model.loss(&x, &y)?, &params)?;
        let outs: Vec<&Tensor> = std::iter::once(&loss).chain(&grads).collect();
        let graph = coil::capture(&outs).graph;
        coil_frontend::compile::compile_fresh(&graph, device)?;
        let wall = Instant::now();
        let t = coil_frontend::compile::compile_fresh(&graph, device)?.times;
        let wall = wall.elapsed().as_secs_f64();
        println!(
            "warm start of the gradients graph (ms): {:.1} wall, of which stages {:.1} = decompose {:.1}, rewrite {:.1}, \
             lower {:.1}, schedule {:.1}, codegen {:.1}, compile and load {:.1}, graph cache read {:.1} (graph cache: {})",
            wall * 1e3,
            t.total * 1e3,
            t.decompose * 1e3,
            t.rewrite * 1e3,
            t.lower * 1e3,
            t.schedule * 1e3,
            t.codegen * 1e3,
            t.cc * 1e3,
            t.cache_read * 1e3,
            t.graph_cache.name()
        );
        return Ok(());
    }

    let (decay, no_decay): (Vec<_>, Vec<_>) = params.iter().cloned().partition(|p| p.shape().len() >= 2);
    let adamw = AdamWConfig { lr: 6e-4, betas: (0.9, 0.95), eps: 1e-8, weight_decay: 0.1, amsgrad: false };
    let mut opt = AdamW::with_groups(vec![(decay, 0.1), (no_decay, 0.0)], adamw)?;
    let order = opt.params().to_vec();
    let recorded = std::cell::Cell::new(Duration::ZERO);
    let grads_fn = coil::compile(|a: &[Tensor]| {
        let t = Instant::now();
        let loss = model.loss(&a[0], &a[1])?;
        recorded.set(t.elapsed());
        let (loss, grads) = coil::nn::value_and_grad(&loss, &order)?;
        Ok(std::iter::once(loss).chain(grads).collect())
    })
    .cuda_graphs(o.cuda_graphs);
    let (mut grads_samples, mut opt_samples) = (Vec::new(), Vec::new());
    for call in 0..=o.calls {
        let (t, before) = (Instant::now(), host_times());
        let out = grads_fn.call(&[&x, &y])?;
        let grads_call =
            Sample { call: us(t.elapsed()), record: us(recorded.get()), host: host_times().since(&before) };
        let (t, before) = (Instant::now(), host_times());
        let (clipped, _norm) = clip_grad_norm(&out[1..], 1.0)?;
        opt.step(&clipped)?;
        let step = us(t.elapsed());
        let host = host_times().since(&before);
        // Everything but the optimizer graph's capture, lookup and run is recording.
        let record = step - us(host.capture + host.hash + host.confirm + host.guards + host.compile + host.run);
        if call > 0 {
            grads_samples.push(grads_call);
            opt_samples.push(Sample { call: step, record, host });
        }
    }
    coil::synchronize()?;
    let nodes = grads_fn.guards()[0].iter().find_map(|g| match g {
        coil::Guard::GraphStructure { nodes, .. } => Some(*nodes),
        _ => None,
    });
    println!("GPT-2 {} on {device}, batch {} x {}; gradients graph of {nodes:?} nodes", o.config, o.batch, o.seq);
    report("gradients (compiled function)", &grads_samples);
    report("clip_grad_norm + AdamW (update_in_place)", &opt_samples);
    Ok(())
}
