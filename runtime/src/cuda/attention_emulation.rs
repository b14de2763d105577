//! The attention templates run on the host: each variant's source (from
//! `coil_codegen::templates`) compiled by `g++` with the warp-level PTX instructions emulated
//! in C++ from their PTX ISA definitions (`attention_emulation.h`: `ldmatrix` and
//! `mma.m16n8k16` fragment layouts, `cp.async` groups, quad shuffles), one `std::thread` per
//! CUDA thread with real block and warp barriers (`attention_emulation_main.cpp`). That checks
//! the kernels' index math (fragment layouts, masks, tails, strides, the online softmax, the
//! backward's recomputed probabilities, the pipeline's waits) against the CPU implementations
//! without a GPU. Copies run eagerly (at issue) and lazily (at the wait), so a read before its
//! wait or a write before the last read of a tile changes the result; dynamic shared memory
//! starts as NaNs and outputs as NaNs, so a read of what was never written, or an element never
//! stored, shows. Skipped (passing) without a host `g++`.

use super::*;
use crate::cpu::attention::attention_bytes;
use crate::cpu::attention_backward::{attention_backward_bytes, BackwardBuffers};
use coil_ir::loops::BufferId;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The warp-level helpers the templates leave to the includer, in C++.
const EMULATION_HEADER: &str = concat!(include_str!("block_emulation.h"), include_str!("attention_emulation.h"));

/// The host program launching a grid.
const RUNNER: &str = include_str!("attention_emulation_main.cpp");

/// One kernel variant as the runner calls it.
struct Emulated {
    name: String,
    source: String,
    /// The call, on `buf[i]` (the buffers in argument order) and `p`.
    call: String,
    /// The parameter struct's C name.
    params: &'static str,
    block: u32,
}

fn forward_kernel(kernel: AttentionKernel) -> Emulated {
    let call = match kernel {
        AttentionKernel::Mma { .. } => {
            "(const coil_u16 *)buf[0], (const coil_u16 *)buf[1], (const coil_u16 *)buf[2], (coil_u16 *)buf[3], (float *)buf[4], p"
        }
        AttentionKernel::Simple { .. } => "buf[0], buf[1], buf[2], buf[3], (float *)buf[4], p",
    };
    Emulated {
        name: kernel.name(),
        source: kernel.source(),
        call: format!("{}({call})", kernel.name()),
        params: "CoilAttnParams",
        block: kernel.block(),
    }
}

fn backward_kernel(kernel: AttentionBackwardKernel) -> Emulated {
    let call = match kernel {
        AttentionBackwardKernel::Mma { .. } => {
            "(const coil_u16 *)buf[0], (const coil_u16 *)buf[1], (const coil_u16 *)buf[2], (const coil_u16 *)buf[3], \
             (const float *)buf[4], (const float *)buf[5], (coil_u16 *)buf[6], (coil_u16 *)buf[7], (coil_u16 *)buf[8], p"
        }
        AttentionBackwardKernel::Simple { .. } => {
            "buf[0], buf[1], buf[2], buf[3], (const float *)buf[4], (const float *)buf[5], buf[6], buf[7], buf[8], p"
        }
    };
    assert!(kernel.shared_bytes() as usize <= 96 * 1024, "the emulation's dynamic shared memory is 96 KiB");
    Emulated {
        name: kernel.name(),
        source: kernel.source(),
        call: format!("{}({call})", kernel.name()),
        params: "CoilAttnBwdParams",
        block: kernel.block(),
    }
}

/// Compiles a variant's module with the emulation (once per variant and test run).
fn build(dir: &Path, kernel: &Emulated) -> std::result::Result<PathBuf, String> {
    std::fs::write(dir.join("emu.h"), EMULATION_HEADER).unwrap();
    std::fs::write(dir.join("module.cu"), &kernel.source).unwrap();
    std::fs::write(dir.join("main.cpp"), RUNNER).unwrap();
    let exe = dir.join("emu");
    let out = Command::new("g++")
        .args(["-std=c++17", "-O1", "-pthread", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused", "-include", "emu.h"])
        .arg(format!("-DCOIL_EMU_CALL={}", kernel.call))
        .arg(format!("-DCOIL_EMU_PARAMS={}", kernel.params))
        .args(["-x", "c++", "main.cpp", "-o"])
        .arg(&exe)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("no g++ ({e})"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "g++ rejected {}:\n{log}", kernel.name);
    assert!(!log.contains("warning"), "g++ warns about {}:\n{log}", kernel.name);
    Ok(exe)
}

/// The bytes of a `repr(C)` parameter struct.
fn param_bytes<P: Copy>(params: &P) -> Vec<u8> {
    // SAFETY: the parameter structs are plain `repr(C)` data (integers and floats), read as
    // bytes within their size.
    unsafe { std::slice::from_raw_parts((params as *const P).cast::<u8>(), std::mem::size_of::<P>()).to_vec() }
}

/// Emulated launches of the grid over `buffers` (empty: a null pointer), with eager and with
/// lazy copies, run side by side (each in a directory of its own under `dir`); every buffer
/// after each, eager first.
fn launch(
    exe: &Path,
    dir: &Path,
    params: &[u8],
    grid: (u32, u32, u32),
    block: u32,
    buffers: &[Vec<u8>],
) -> [Vec<Vec<u8>>; 2] {
    let runs = [false, true].map(|lazy| {
        let dir = dir.join(if lazy { "lazy" } else { "eager" });
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("params.bin"), params).unwrap();
        for (i, b) in buffers.iter().enumerate() {
            std::fs::write(dir.join(format!("b{i}.bin")), b).unwrap();
        }
        let child = Command::new(exe)
            .arg(&dir)
            .args([grid.0, grid.1, block, lazy as u32].map(|x| x.to_string()))
            .arg(buffers.len().to_string())
            .spawn()
            .unwrap();
        (dir, child)
    });
    runs.map(|(dir, mut child)| {
        let status = child.wait().unwrap();
        assert!(status.success(), "the emulation failed ({status})");
        (0..buffers.len())
            .map(|i| if buffers[i].is_empty() { vec![] } else { std::fs::read(dir.join(format!("r{i}.bin"))).unwrap() })
            .collect()
    })
}

/// A built variant per name, compiled once per test run; `None` without g++.
struct Builds {
    root: PathBuf,
    built: Vec<(String, PathBuf)>,
}

impl Builds {
    fn new(what: &str) -> Builds {
        Builds { root: std::env::temp_dir().join(format!("coil-{what}-emu-{}", std::process::id())), built: vec![] }
    }

    fn get(&mut self, kernel: &Emulated) -> Option<PathBuf> {
        if let Some((_, exe)) = self.built.iter().find(|(n, _)| *n == kernel.name) {
            return Some(exe.clone());
        }
        let dir = self.root.join(&kernel.name);
        std::fs::create_dir_all(&dir).unwrap();
        match build(&dir, kernel) {
            Ok(exe) => {
                self.built.push((kernel.name.clone(), exe.clone()));
                Some(exe)
            }
            Err(why) => {
                eprintln!("attention emulation skipped: {why}");
                None
            }
        }
    }
}

impl Drop for Builds {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn strided(offset: usize, batch_strides: Vec<usize>, row_stride: usize) -> StridedOperand<usize> {
    StridedOperand { buffer: BufferId(0), offset, batch_strides, row_stride, col_stride: 1 }
}

/// Contiguous `[*batch, rows, d]`.
fn contiguous(batch: &[usize], rows: usize, d: usize) -> StridedOperand<usize> {
    let strides = (0..batch.len()).map(|i| batch[i + 1..].iter().product::<usize>() * rows * d).collect();
    strided(0, strides, d)
}

/// `[B, H, L, D]` attention on GPT-2's head views of a `[B, T, 3HD]` buffer, written into a
/// `[B, L, H, D]` output (heads merged) when `heads` (batch `[B, H]`, `l == s`), else contiguous
/// `[*batch, rows, D]` operands; scale `1/sqrt(d)` or 0.3.
fn forward_spec(batch: &[usize], l: usize, s: usize, d: usize, causal: bool, heads: bool) -> AttentionSpec {
    if heads {
        let (b, h) = (batch[0], batch[1]);
        let c = h * d;
        let head = |part: usize| strided(part * c, vec![l * 3 * c, d], 3 * c);
        let out = strided(0, vec![l * c, d], c);
        let scale = 1.0 / (d as f64).sqrt();
        AttentionSpec { q: head(0), k: head(1), v: head(2), out, batch: vec![b, h], l, s, d, causal, scale }
    } else {
        let (q, k) = (contiguous(batch, l, d), contiguous(batch, s, d));
        let (v, out) = (k.clone(), q.clone());
        AttentionSpec { q, k, v, out, batch: batch.to_vec(), l, s, d, causal, scale: 0.3 }
    }
}

fn encode(dtype: DType, values: &[f32]) -> Vec<u8> {
    match dtype {
        DType::BF16 => values.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
        DType::F16 => values.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
        _ => values.iter().flat_map(|&x| x.to_le_bytes()).collect(),
    }
}

fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    match dtype {
        DType::BF16 => bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        DType::F16 => bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        _ => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect(),
    }
}

/// Deterministic values of the dtype.
fn seeded(dtype: DType, seed: u32, n: usize) -> Vec<u8> {
    let x: Vec<f32> =
        (0..n).map(|i| (i as f32 * 0.7548 + seed as f32 * 1.37).sin() * 1.7 + (i % 7) as f32 * 0.05).collect();
    encode(dtype, &x)
}

/// Relative RMS error of `got` against `want`, and the worst element; panics on a non-finite
/// element (never written, or NaN read).
fn error(what: &str, got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}");
    let (mut num, mut den, mut worst) = (0.0, 0.0, (0usize, 0.0f64));
    for (i, (x, y)) in got.iter().zip(want).enumerate() {
        assert!(x.is_finite(), "{what}: element {i} is {x}");
        num += (x - y) * (x - y);
        den += y * y;
        if (x - y).abs() > worst.1 {
            worst = (i, (x - y).abs());
        }
    }
    let err = (num / den.max(f64::MIN_POSITIVE)).sqrt();
    eprintln!("{what}: relative error {err:.2e}, worst element {} ({} vs {})", worst.0, got[worst.0], want[worst.0]);
    err
}

/// The forward's operands: q, k, v bytes (the same buffer for head views).
fn operands(dtype: DType, spec: &AttentionSpec, heads: bool) -> [Vec<u8>; 3] {
    let batch = spec.batch_count();
    if heads {
        let all = seeded(dtype, 1, batch * spec.l * 3 * spec.d);
        [all.clone(), all.clone(), all]
    } else {
        [
            seeded(dtype, 1, batch * spec.l * spec.d),
            seeded(dtype, 2, batch * spec.s * spec.d),
            seeded(dtype, 3, batch * spec.s * spec.d),
        ]
    }
}

#[test]
fn forward_kernels_emulated_on_the_host_match_the_cpu_implementation() {
    let mut builds = Builds::new("attention");
    let bf16 = AttentionKernel::Mma { bf16: true, dp: 64 };
    let cases = [
        // GPT-2 head views, heads merged on output, causal, a tail block (130 = 2 * 64 + 2).
        (bf16, DType::BF16, vec![1, 2], 130, 130, 64, true, true),
        // Not causal, L != S, contiguous.
        (bf16, DType::BF16, vec![2], 20, 100, 64, false, false),
        // f16, a head dim padded from 40 to 48.
        (AttentionKernel::Mma { bf16: false, dp: 48 }, DType::F16, vec![2], 70, 70, 40, true, false),
        // The largest head dim, L > S causal (rows past S see every key).
        (AttentionKernel::Mma { bf16: true, dp: 128 }, DType::BF16, vec![1], 80, 50, 128, true, false),
        // The simple kernel: f32 and bf16 (before sm_80).
        (AttentionKernel::Simple { dtype: DType::F32, dp: 16 }, DType::F32, vec![1, 2], 33, 33, 16, true, true),
        (AttentionKernel::Simple { dtype: DType::BF16, dp: 32 }, DType::BF16, vec![2], 20, 45, 24, false, false),
    ];
    for (kernel, dtype, batch, l, s, d, causal, heads) in cases {
        let emulated = forward_kernel(kernel);
        let Some(exe) = builds.get(&emulated) else { return };
        let spec = forward_spec(&batch, l, s, d, causal, heads);
        let [q, k, v] = operands(dtype, &spec, heads);
        let rows = spec.batch_count() * l;
        let (mut want, mut want_lse) = (vec![0u8; rows * d * dtype.size_bytes()], vec![0u8; rows * 4]);
        attention_bytes(&spec, dtype, &q, &k, &v, &mut want, Some(&mut want_lse)).unwrap();
        let params = param_bytes(&launch_params(&spec, [&spec.q, &spec.k, &spec.v]));
        let grid = AttentionKernel::grid(spec.batch_count(), l);
        let buffers = [q.clone(), k.clone(), v.clone(), vec![0xff; want.len()], vec![0xff; want_lse.len()]];
        let runs = launch(&exe, &builds.root.join(&emulated.name), &params, grid, emulated.block, &buffers);
        for (got, lazy) in runs.iter().zip([false, true]) {
            let what = format!("{} {batch:?} L={l} S={s} causal={causal} lazy={lazy}", emulated.name);
            let tolerance = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
            let err = error(&what, &decode(dtype, &got[3]), &decode(dtype, &want));
            assert!(err <= tolerance, "{what}: output error {err:.2e}");
            let err = error(&what, &decode(DType::F32, &got[4]), &decode(DType::F32, &want_lse));
            assert!(err <= 1e-5, "{what}: logsumexp error {err:.2e}");
        }
    }
}

/// One backward case: the kernel, the dtype, the forward's layout, which gradients are wanted.
struct BackwardCase {
    kernel: AttentionBackwardKernel,
    dtype: DType,
    batch: Vec<usize>,
    l: usize,
    s: usize,
    d: usize,
    causal: bool,
    heads: bool,
    /// dq, dk, dv wanted.
    wanted: [bool; 3],
}

#[test]
fn backward_kernels_emulated_on_the_host_match_the_cpu_implementation() {
    let mut builds = Builds::new("attention-backward");
    let mma = |bf16, dp| AttentionBackwardKernel::Mma { bf16, dp };
    let case = |kernel, dtype, batch: &[usize], (l, s, d), causal, heads, wanted| BackwardCase {
        kernel,
        dtype,
        batch: batch.to_vec(),
        l,
        s,
        d,
        causal,
        heads,
        wanted,
    };
    let all = [true; 3];
    let cases = [
        // GPT-2 head views, causal, tail blocks of both kinds (100 = 64 + 36).
        case(mma(true, 64), DType::BF16, &[1, 1], (100, 100, 64), true, true, all),
        // Not causal, L != S; dK and dV only.
        case(mma(true, 64), DType::BF16, &[2], (20, 100, 64), false, false, [false, true, true]),
        // f16, head dim 40 padded to 48, causal; dQ only.
        case(mma(false, 48), DType::F16, &[2], (70, 70, 40), true, false, [true, false, false]),
        // The largest head dim, L > S causal.
        case(mma(true, 128), DType::BF16, &[1], (80, 50, 128), true, false, all),
        // Head dim 32, S > L causal (the last key blocks are seen by no row).
        case(mma(true, 32), DType::BF16, &[1, 1], (40, 150, 32), true, false, all),
        // The simple kernel: f32 and bf16.
        case(
            AttentionBackwardKernel::Simple { dtype: DType::F32, dp: 16 },
            DType::F32,
            &[1, 2],
            (33, 33, 16),
            true,
            true,
            all,
        ),
        case(
            AttentionBackwardKernel::Simple { dtype: DType::BF16, dp: 32 },
            DType::BF16,
            &[2],
            (20, 45, 24),
            false,
            false,
            all,
        ),
    ];
    for c in cases {
        let emulated = backward_kernel(c.kernel);
        let Some(exe) = builds.get(&emulated) else { return };
        let (dtype, size, d) = (c.dtype, c.dtype.size_bytes(), c.d);
        // The forward on the CPU: its output and logsumexp; then delta = rowsum(dO * O) of the
        // output rounded to the dtype, as the graph computes it.
        let fwd = forward_spec(&c.batch, c.l, c.s, d, c.causal, c.heads);
        let [q, k, v] = operands(dtype, &fwd, c.heads);
        let rows = fwd.batch_count() * c.l;
        let out_view = contiguous(&c.batch, c.l, d);
        let (mut dense, mut lse) = (vec![0u8; rows * d * size], vec![0u8; rows * 4]);
        let fwd_dense = AttentionSpec { out: out_view.clone(), ..fwd.clone() };
        attention_bytes(&fwd_dense, dtype, &q, &k, &v, &mut dense, Some(&mut lse)).unwrap();
        let grad_out = seeded(dtype, 5, rows * d);
        let (o, g) = (decode(dtype, &dense), decode(dtype, &grad_out));
        let delta: Vec<f32> =
            (0..rows).map(|r| (0..d).map(|c| o[r * d + c] * g[r * d + c]).sum::<f64>() as f32).collect();
        let delta = encode(DType::F32, &delta);
        let lens = [rows * d, fwd.batch_count() * c.s * d, fwd.batch_count() * c.s * d];
        let views = [contiguous(&c.batch, c.l, d), contiguous(&c.batch, c.s, d), contiguous(&c.batch, c.s, d)];
        let grad = |i: usize| c.wanted[i].then(|| views[i].clone());
        let spec = AttentionBackwardSpec {
            q: fwd.q.clone(),
            k: fwd.k.clone(),
            v: fwd.v.clone(),
            grad_out: out_view,
            dq: grad(0),
            dk: grad(1),
            dv: grad(2),
            batch: c.batch.clone(),
            l: c.l,
            s: c.s,
            d,
            causal: c.causal,
            scale: fwd.scale,
        };
        let mut want: Vec<Vec<u8>> =
            (0..3).map(|i| if c.wanted[i] { vec![0u8; lens[i] * size] } else { vec![] }).collect();
        {
            let [wq, wk, wv] = &mut want[..] else { unreachable!() };
            fn out(w: &mut [u8]) -> Option<&mut [u8]> {
                (!w.is_empty()).then_some(w)
            }
            let bufs = BackwardBuffers {
                q: &q,
                k: &k,
                v: &v,
                grad_out: &grad_out,
                lse: &lse,
                delta: &delta,
                dq: out(wq),
                dk: out(wk),
                dv: out(wv),
            };
            attention_backward_bytes(&spec, dtype, bufs).unwrap();
        }
        let count = spec.batch_count();
        let (grid, key_blocks) = backward_grid(count, c.l, c.s, c.wanted[0], c.wanted[1] || c.wanted[2]);
        let params = param_bytes(&backward_params(&spec, [&spec.q, &spec.k, &spec.v, &spec.grad_out], key_blocks));
        let outputs = (0..3).map(|i| vec![0xffu8; want[i].len()]);
        let buffers: Vec<Vec<u8>> = [q, k, v, grad_out, lse, delta].into_iter().chain(outputs).collect();
        let runs = launch(&exe, &builds.root.join(&emulated.name), &params, grid, emulated.block, &buffers);
        for (got, lazy) in runs.iter().zip([false, true]) {
            for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
                if !c.wanted[i] {
                    continue;
                }
                let what = format!(
                    "{} {:?} L={} S={} causal={} lazy={lazy} {name}",
                    emulated.name, c.batch, c.l, c.s, c.causal
                );
                let tolerance = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
                let err = error(&what, &decode(dtype, &got[6 + i]), &decode(dtype, &want[i]));
                assert!(err <= tolerance, "{what}: relative error {err:.2e} (tolerance {tolerance:.0e})");
            }
        }
    }
}
