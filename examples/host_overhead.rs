//! Baseline host-time probe (temporary).
use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
use coil::nn::{clip_grad_norm, AdamW, AdamWConfig, Optimizer, ParamStore, Precision};
use coil::{DType, Device, Tensor};
use std::time::Instant;

fn us(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

fn main() -> coil::Result<()> {
    let layers: usize = std::env::args().nth(1).map_or(2, |s| s.parse().unwrap());
    let device = Device::Cpu;
    let config = Gpt2Config {
        vocab_size: 256,
        block_size: 64,
        n_layer: layers,
        n_head: if layers == 12 { 12 } else { 2 },
        n_embd: if layers == 12 { 96 } else { 64 },
        dropout: 0.0,
        layer_norm_eps: 1e-5,
    };
    let (batch, seq) = (2, 64);
    coil::manual_seed(0);
    let store = ParamStore::new();
    store.set_precision(Precision::autocast(DType::BF16));
    let model = Gpt2::new(&store.root(device, DType::F32), config)?;
    store.realize_pending()?;
    let v: Vec<i64> = (0..batch * seq).map(|i| (i * 7 % 256) as i64).collect();
    let x = Tensor::from_vec(v.clone(), &[batch, seq])?;
    let y = Tensor::from_vec(v.iter().map(|a| (a + 1) % 256).collect(), &[batch, seq])?;
    let params = store.trainable();
    let (decay, no_decay): (Vec<_>, Vec<_>) = params.iter().cloned().partition(|p| p.shape().len() >= 2);
    let adamw = AdamWConfig { lr: 6e-4, betas: (0.9, 0.95), eps: 1e-8, weight_decay: 0.1, amsgrad: false };
    let mut opt = AdamW::with_groups(vec![(decay, 0.1), (no_decay, 0.0)], adamw)?;
    let order = opt.params().to_vec();

    // Phases outside a compiled function.
    for _ in 0..3 {
        let t = Instant::now();
        let loss = model.loss(&x, &y)?;
        let record = us(t);
        let t = Instant::now();
        let (loss, grads) = coil::nn::value_and_grad(&loss, &order)?;
        let vg = us(t);
        let outs: Vec<&Tensor> = std::iter::once(&loss).chain(&grads).collect();
        let t = Instant::now();
        let c = coil::capture(&outs);
        let cap = us(t);
        let t = Instant::now();
        let h = coil_frontend::dynamo::structural_hash(&c.graph, device);
        let hash = us(t);
        let c2 = coil::capture(&outs);
        let t = Instant::now();
        let same = coil_frontend::dynamo::same_structure(&c.graph, &c2.graph);
        let confirm = us(t);
        eprintln!(
            "nodes {} record {record:.0} us, value_and_grad {vg:.0} us, capture {cap:.0} us, hash {hash:.0} us, confirm {confirm:.0} us ({h:x} {same})",
            c.graph.nodes.len()
        );
    }

    let grads_fn = coil::compile(|a: &[Tensor]| {
        let (loss, grads) = coil::nn::value_and_grad(&model.loss(&a[0], &a[1])?, &order)?;
        Ok(std::iter::once(loss).chain(grads).collect())
    });
    for i in 0..6 {
        let before = grads_fn.stats();
        let t = Instant::now();
        let out = grads_fn.call(&[&x, &y])?;
        let call = us(t);
        let s = grads_fn.stats();
        let h = s.host.since(&before.host);
        let h0 = coil_frontend::profile::host_times();
        let t = Instant::now();
        let (clipped, _norm) = clip_grad_norm(&out[1..], 1.0)?;
        opt.step(&clipped)?;
        let step = us(t);
        let o = coil_frontend::profile::host_times().since(&h0);
        let d = |d: std::time::Duration| d.as_secs_f64() * 1e6;
        eprintln!(
            "call {i}: {call:.0} us: hit_check {:.0}, capture {:.0}, hash {:.0}, confirm {:.0}, guards {:.0}, run {:.0}, differentiate {:.0} ({} new, {} hits); optimizer {step:.0} us: capture {:.0} hash {:.0} confirm {:.0} run {:.0}",
            (s.hit_check - before.hit_check).as_secs_f64() * 1e6,
            d(h.capture), d(h.hash), d(h.confirm), d(h.guards), d(h.run), d(h.differentiate), h.differentiations, h.differentiation_hits,
            d(o.capture), d(o.hash), d(o.confirm), d(o.run)
        );
    }
    Ok(())
}
