//! The argsort template (`coil_codegen::templates::sort`) run on the host: its source compiled
//! by `g++` with the CUDA built-ins it uses emulated (`sort_emulation.cpp`: a thread per CUDA
//! thread, a real block barrier), launched as [`super::sort::argsort`] launches it, by the same
//! [`SortPlan`] (`sort_emulation_main.cpp`), and compared with the CPU backend's argsort, whose
//! keys come from another route (values widened to f64). Checks the keys of every dtype, the
//! bitonic network, tiles, padding, merge passes and strides without a GPU. Skipped (passing)
//! without a host `g++`.

use super::emulation_build::build_emulator;
use crate::cpu::sort::argsort_bytes;
use coil_codegen::templates::sort::{tile_kernel, SortPlan, SOURCE};
use coil_codegen::templates::BLOCK_EMULATION;
use coil_ir::{DType, TensorMeta};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The emulated module's executable, built once per test run; `None` without g++ (each caller
/// told the test is skipped).
fn emulator() -> Option<&'static PathBuf> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    let unit = || {
        [BLOCK_EMULATION, include_str!("sort_emulation.cpp"), SOURCE, include_str!("sort_emulation_main.cpp")]
            .join("\n")
    };
    EXE.get_or_init(|| build_emulator("sort", &unit(), &[])).as_ref()
}

/// Bytes of `n` elements of `dtype` with many ties (values from `levels` steps), and for floats
/// NaNs, infinities and both zeros.
fn data(dtype: DType, n: usize, seed: u64, levels: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(n * dtype.size_bytes());
    for _ in 0..n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let v = (s % levels) as f64 - (levels / 2) as f64;
        let f = match s % 53 {
            0 => f64::NAN,
            1 => -0.0,
            2 => f64::INFINITY,
            3 => f64::NEG_INFINITY,
            4 => -f64::NAN,
            _ => v * 0.75,
        };
        let i = v as i64 * 1_000_003;
        match dtype {
            DType::F16 => out.extend(half::f16::from_f64(f).to_le_bytes()),
            DType::BF16 => out.extend(half::bf16::from_f64(f).to_le_bytes()),
            DType::F32 => out.extend((f as f32).to_le_bytes()),
            DType::F64 => out.extend(f.to_le_bytes()),
            DType::I64 => out.extend(i.to_le_bytes()),
            DType::I32 => out.extend((i as i32).to_le_bytes()),
            DType::I16 => out.extend((v as i16).to_le_bytes()),
            DType::I8 => out.push(v as i8 as u8),
            DType::U8 => out.push(s as u8),
            DType::Bool => out.push((s & 1) as u8),
        }
    }
    out
}

/// Sorts `shape` along `dim` in the emulation and on the CPU backend; the positions must agree.
fn check(exe: &PathBuf, dtype: DType, shape: &[usize], dim: usize, descending: bool, levels: u64) {
    let meta = TensorMeta::new(shape.to_vec(), dtype);
    let x = data(dtype, meta.numel(), shape.iter().sum::<usize>() as u64, levels);
    let mut want = vec![0u8; meta.numel() * 8];
    argsort_bytes(&x, &meta, dim, descending, &mut want).unwrap();
    let len = shape[dim];
    let inner: usize = shape[dim + 1..].iter().product();
    let plan = SortPlan::new(meta.numel() / len, len, inner).unwrap();
    let dir = exe.parent().unwrap();
    let name = format!("{dtype}_{shape:?}_{dim}_{descending}").replace([' ', ',', '[', ']'], "");
    let (input, output) = (dir.join(format!("{name}.in")), dir.join(format!("{name}.out")));
    std::fs::write(&input, &x).unwrap();
    let status = Command::new(exe)
        .arg(tile_kernel(dtype))
        .args([plan.lines, plan.len, plan.inner, plan.tiles, plan.width, plan.threads].map(|v| v.to_string()))
        .arg((descending as u8).to_string())
        .args([&input, &output])
        .args(plan.merges.iter().map(|r| r.to_string()))
        .status()
        .unwrap();
    assert!(status.success(), "{name}: the emulation failed ({status})");
    let got = std::fs::read(&output).unwrap();
    let positions = |b: &[u8]| -> Vec<i64> { b.chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect() };
    let (got, want) = (positions(&got), positions(&want));
    if let Some(k) = (0..want.len()).find(|&k| got[k] != want[k]) {
        panic!("{name} ({plan:?}): position {k} is {} where the CPU has {}", got[k], want[k]);
    }
}

#[test]
fn the_sort_template_agrees_with_the_cpu_backend() {
    let Some(exe) = emulator() else { return };
    let dtypes = [
        DType::F32,
        DType::BF16,
        DType::F16,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U8,
        DType::Bool,
    ];
    for dtype in dtypes {
        for descending in [false, true] {
            check(exe, dtype, &[3, 37], 1, descending, 9);
            check(exe, dtype, &[5, 4, 3], 1, descending, 5);
        }
    }
    // One element, a full tile, a tile and one, several tiles and merges along a middle dim.
    for (shape, dim) in [(&[4, 1][..], 1), (&[2, 2048], 1), (&[2049], 0), (&[2, 4500, 3], 1), (&[6000, 1], 0)] {
        for descending in [false, true] {
            check(exe, DType::F32, shape, dim, descending, 301);
        }
    }
    check(exe, DType::BF16, &[3, 5000], 1, true, 40);
}

#[test]
fn a_vocabulary_row_sorts_in_the_template() {
    let Some(exe) = emulator() else { return };
    check(exe, DType::F32, &[1, 50257], 1, true, 20000);
}
