//! Times the CPU attention template alone (no graph around it): min and median of repeated
//! calls of `attention_bytes` on random operands, for a few shapes.
//!
//! cargo run --release -p coil-runtime --example attention_cpu

use coil_ir::loops::{BufferId, StridedOperand};
use coil_ir::DType;
use coil_runtime::cpu::attention::{attention_bytes, AttentionSpec};
use half::bf16;
use std::time::Instant;

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
    let only: Option<usize> = std::env::args().nth(1).and_then(|a| a.parse().ok());
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
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps + 10 {
            let t = Instant::now();
            attention_bytes(&spec, dtype, &q, &k, &v, None, &mut out, Some(&mut lse)).unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let mut times = times.split_off(10);
        times.sort_by(f64::total_cmp);
        let sum: f64 = out.iter().map(|&b| b as f64).sum();
        println!("{name:48} min {:9.1} us  median {:9.1} us  (checksum {sum})", times[0], times[reps / 2]);
    }
}
