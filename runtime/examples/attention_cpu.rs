//! Times the CPU attention templates alone (no graph around them): min and median of repeated
//! calls of `attention_bytes` on random operands, for a few shapes; then the backward
//! (`attention_backward_bytes`) of 8 batch indices of 256 rows and keys, head dim 64, f32,
//! causal and not and with a padding mask (keys past 200 dropped), with the products' rate.
//!
//! cargo run --release -p coil-runtime --example attention_cpu        # every shape
//! cargo run --release -p coil-runtime --example attention_cpu -- 1   # forward shape 1, 10x the reps
//! cargo run --release -p coil-runtime --example attention_cpu -- backward

use coil_codegen::templates::attention::MaskKind;
use coil_ir::loops::{BufferId, StridedOperand};
use coil_ir::DType;
use coil_runtime::cpu::attention::{attention_bytes, AttentionSpec, MaskBytes};
use coil_runtime::cpu::attention_backward::{
    attention_backward_bytes, AttentionBackwardSpec, BackwardBuffers, GradBuffers,
};
use half::bf16;
use std::time::Instant;

/// Min and median microseconds of `reps` calls of `f` after 10 untimed ones.
fn min_median(reps: usize, f: &mut dyn FnMut()) -> (f64, f64) {
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps + 10 {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut times = times.split_off(10);
    times.sort_by(f64::total_cmp);
    (times[0], times[reps / 2])
}

fn contiguous(batch: usize, rows: usize, d: usize) -> StridedOperand<usize> {
    let _ = batch;
    StridedOperand { buffer: BufferId(0), offset: 0, batch_strides: vec![rows * d], row_stride: d, col_stride: 1 }
}

fn main() {
    // (name, batch, l, s, d, causal, dtype)
    let shapes = [
        ("gpt2 scale 0.05 bf16 B*H=3 T=224 D=64 causal", 3, 224, 224, 64, true, DType::BF16),
        ("bf16 B*H=24 T=1024 D=64 causal", 24, 1024, 1024, 64, true, DType::BF16),
        ("f32 B*H=8 L=256 S=256 D=64", 8, 256, 256, 64, false, DType::F32),
        ("bf16 decode B*H=24 L=1 S=1024 D=64", 24, 1, 1024, 64, false, DType::BF16),
    ];
    // An argument picks one shape by index and times it 10x as long (for a profiler).
    let arg = std::env::args().nth(1);
    if arg.as_deref() == Some("backward") {
        backward();
        return;
    }
    let only: Option<usize> = arg.and_then(|a| a.parse().ok());
    for (index, (name, batch, l, s, d, causal, dtype)) in shapes.into_iter().enumerate() {
        if only.is_some_and(|o| o != index) {
            continue;
        }
        let spec = AttentionSpec {
            q: contiguous(batch, l, d),
            k: contiguous(batch, s, d),
            v: contiguous(batch, s, d),
            out: contiguous(batch, l, d),
            batch: vec![batch],
            l,
            s,
            d,
            causal,
            scale: 1.0 / (d as f64).sqrt(),
            mask: None,
            mask_rule: None,
            offset: 0,
            dropout: None,
        };
        let mut seed = 1u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) as f64 / (1u64 << 31) as f64) * 2.0 - 1.0
        };
        let bytes = |n: usize, next: &mut dyn FnMut() -> f64| -> Vec<u8> {
            match dtype {
                DType::BF16 => (0..n).flat_map(|_| bf16::from_f64(next()).to_le_bytes()).collect(),
                _ => (0..n).flat_map(|_| (next() as f32).to_le_bytes()).collect(),
            }
        };
        let q = bytes(batch * l * d, &mut next);
        let k = bytes(batch * s * d, &mut next);
        let v = bytes(batch * s * d, &mut next);
        let mut out = vec![0u8; batch * l * d * dtype.size_bytes()];
        let mut lse = vec![0u8; batch * l * 4];
        let reps = if only.is_some() { 2000 } else { 200 };
        let (min, median) = min_median(reps, &mut || {
            attention_bytes(&spec, dtype, &q, &k, &v, None, &mut out, Some(&mut lse)).unwrap();
        });
        let sum: f64 = out.iter().map(|&b| b as f64).sum();
        println!("{name:48} min {min:9.1} us  median {median:9.1} us  (checksum {sum})");
    }
    if only.is_none() {
        backward();
    }
}

/// The backward of 8 batch indices of 256 rows and keys, head dim 64, f32: causal and not,
/// and with a padding mask broadcast over the rows; the forward of the same beside it.
fn backward() {
    let (n, t, d) = (8, 256, 64);
    let view = || contiguous(n, t, d);
    let x = |seed: f64| -> Vec<u8> {
        (0..n * t * d).flat_map(|i| (((i as f64) * 0.37 + seed).sin() as f32).to_le_bytes()).collect()
    };
    let (q, k, v, g) = (x(0.1), x(1.3), x(2.9), x(4.2));
    let padding: Vec<u8> = (0..t).map(|j| (j < 200) as u8).collect();
    for (causal, masked) in [(false, false), (true, false), (false, true)] {
        let mask = masked.then_some(MaskBytes { bytes: &padding, kind: MaskKind::Bool });
        let mask_view = masked.then(|| StridedOperand { row_stride: 0, batch_strides: vec![0], ..view() });
        let fwd = AttentionSpec {
            q: view(),
            k: view(),
            v: view(),
            out: view(),
            batch: vec![n],
            l: t,
            s: t,
            d,
            causal,
            scale: 0.125,
            mask: mask_view.clone(),
            dropout: None,
            mask_rule: None,
            offset: 0,
        };
        let (mut o, mut lse) = (vec![0u8; q.len()], vec![0u8; n * t * 4]);
        let forward = min_median(20, &mut || {
            attention_bytes(&fwd, DType::F32, &q, &k, &v, mask, &mut o, Some(&mut lse)).unwrap();
        });
        let spec = AttentionBackwardSpec {
            q: view(),
            k: view(),
            v: view(),
            grad_out: view(),
            out: view(),
            dq: Some(view()),
            dk: Some(view()),
            dv: Some(view()),
            batch: vec![n],
            l: t,
            s: t,
            d,
            causal,
            scale: 0.125,
            mask: mask_view,
            dropout: None,
        };
        let (mut dq, mut dk, mut dv) = (vec![0u8; q.len()], vec![0u8; q.len()], vec![0u8; q.len()]);
        let backward = min_median(20, &mut || {
            let grads = GradBuffers::separate(Some(&mut dq), Some(&mut dk), Some(&mut dv));
            let bufs = BackwardBuffers { q: &q, k: &k, v: &v, grad_out: &g, lse: &lse, out: &o, grads, mask };
            attention_backward_bytes(&spec, DType::F32, bufs).unwrap();
        });
        // five products of [t, t, d] per batch index, half of them under the causal rule
        let flops = 2.0 * 5.0 * (n * t * t * d) as f64 / if causal { 2.0 } else { 1.0 };
        println!(
            "backward f32 B*H={n} T={t} D={d} causal={causal} masked={masked}: min {:.1} us median {:.1} us ({:.1} GFLOP/s at the min); forward min {:.1} us",
            backward.0,
            backward.1,
            flops / backward.0 * 1e-3,
            forward.0
        );
    }
}
