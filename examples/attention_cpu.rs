//! Attention training steps on the CPU: `value_and_grad` of `sum(y * y)` for `y` attention over
//! q, k, v `[B, H, T, D]` (f32), through the attention templates (`scaled_dot_product_attention
//! _dropout`: one forward and one backward call) against the same attention written out so that
//! the template matcher leaves it alone (the mask by `where`, or an added zero; the dropout by
//! `Tensor::dropout`: the decomposition, whose scores are written forward and backward). Four
//! cases: a padding mask (batch index 1 keeps its first T - 56 keys) or none, attention dropout
//! 0.1 or none; both forms draw the same numbers from one seed, and the program checks that they
//! agree before timing.
//!
//! ```sh
//! cargo run --release --example attention_cpu                    # B=2 H=4 T=256 D=64, 10 reps
//! cargo run --release --example attention_cpu -- --t 512 --reps 20
//! RAYON_NUM_THREADS=1 cargo run --release --example attention_cpu # one thread
//! ```
//!
//! The two forms run alternately rep by rep, so the machine's load moves both alike; each line
//! gives the best and the median wall-clock milliseconds of a step (recording, compiled-graph
//! lookup and the run; the graphs are compiled before timing).

use coil::{DType, Device, Tensor};
use std::time::Instant;

struct Opts {
    b: usize,
    h: usize,
    t: usize,
    d: usize,
    reps: usize,
}

fn parse() -> Opts {
    let mut o = Opts { b: 2, h: 4, t: 256, d: 64, reps: 10 };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut v = || it.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{a} needs a number"));
        match a.as_str() {
            "--b" => o.b = v(),
            "--h" => o.h = v(),
            "--t" => o.t = v(),
            "--d" => o.d = v(),
            "--reps" => o.reps = v(),
            _ => panic!("unknown argument {a}: --b, --h, --t, --d, --reps"),
        }
    }
    assert!(o.t > 56, "--t must exceed 56 (the padding mask drops 56 keys of batch index 1)");
    o
}

/// `sqrt(sum((x - y)^2) / sum(y^2))`.
fn rel_error(x: &[f64], y: &[f64]) -> f64 {
    let num: f64 = x.iter().zip(y).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = y.iter().map(|b| b * b).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

fn main() -> coil::Result<()> {
    let o = parse();
    coil::set_default_device(Device::Cpu);
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
    let (b, h, t, d) = (o.b, o.h, o.t, o.d);
    let make = |seed: usize, shape: &[usize]| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| ((i * 7 + seed * 13) as f32 * 0.37).sin()).collect();
        Tensor::from_vec(v, shape)
    };
    let (q, k, v) = (make(1, &[b, h, t, d])?, make(2, &[b, h, t, d])?, make(3, &[b, h, t, d])?);
    let keep: Vec<bool> = (0..b * t).map(|x| x % t < t - 56 * (x / t).min(1)).collect();
    let mask = Tensor::from_vec(keep, &[b, 1, 1, t])?;
    let zeros = Tensor::zeros(&[t, t], DType::F32);
    let step = |masked: bool, dropout: bool, templated: bool| -> coil::Result<Vec<Vec<f64>>> {
        let p = if dropout { 0.1 } else { 0.0 };
        coil::manual_seed(1);
        let y = if templated {
            coil::scaled_dot_product_attention_dropout(&q, &k, &v, masked.then_some(&mask), p, false, None)?
        } else {
            let s = q.matmul(&k.transpose(-2, -1)?)?.mul(1.0 / (d as f64).sqrt())?;
            let s = if masked { coil::where_(&mask, &s, f64::NEG_INFINITY)? } else { s.add(&zeros)? };
            let w = s.softmax(-1)?;
            let w = if dropout { w.dropout(p, true)? } else { w };
            w.matmul(&v)?
        };
        let loss = y.mul(&y)?.sum_all()?;
        let (loss, grads) = coil::value_and_grad(&loss, &[&q, &k, &v])?;
        std::iter::once(loss).chain(grads).map(|x| x.to_vec::<f64>()).collect()
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("attention training steps on the CPU ({threads} cores), B={b} H={h} T={t} D={d} f32, {} reps", o.reps);
    for (masked, dropout) in [(true, true), (true, false), (false, true), (false, false)] {
        let results = [step(masked, dropout, true)?, step(masked, dropout, false)?];
        let worst = results[0].iter().zip(&results[1]).map(|(x, y)| rel_error(x, y)).fold(0.0, f64::max);
        if worst > 1e-5 {
            return Err(coil::Error::runtime(format!(
                "masked={masked} dropout={dropout}: the templated and written-out steps differ by {worst:.2e}"
            )));
        }
        let mut ms = [Vec::new(), Vec::new()];
        for _ in 0..o.reps {
            for (i, templated) in [true, false].into_iter().enumerate() {
                let start = Instant::now();
                step(masked, dropout, templated)?;
                ms[i].push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        for m in &mut ms {
            m.sort_by(f64::total_cmp);
        }
        println!(
            "masked={masked:<5} dropout={dropout:<5} templates {:8.2} / {:8.2} ms   written out {:8.2} / {:8.2} ms   (best / median; agree to {worst:.1e})",
            ms[0][0],
            ms[0][ms[0].len() / 2],
            ms[1][0],
            ms[1][ms[1].len() / 2]
        );
    }
    Ok(())
}
