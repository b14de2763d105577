//! The attention templates run on the host: each variant's source (from
//! `coil_codegen::templates`) compiled by `g++` with the warp-level PTX instructions emulated
//! in C++ from their PTX ISA definitions (`attention_emulation.h`: `ldmatrix` and
//! `mma.m16n8k16` fragment layouts, `cp.async` groups, quad and warp shuffles), one
//! `std::thread` per CUDA thread with real block and warp barriers
//! (`attention_emulation_main.cpp`). That checks the kernels' index math (fragment layouts,
//! masks, tails, strides, the online softmax, the backward's delta and recomputed
//! probabilities, the pipeline's waits) against the CPU implementations without a GPU. Copies run eagerly (at issue) and lazily (at the wait), so a read before its
//! wait or a write before the last read of a tile changes the result; dynamic shared memory
//! starts as NaNs and outputs as NaNs, so a read of what was never written, or an element never
//! stored, shows. Skipped (passing) without a host `g++`.

use super::*;
use crate::cpu::attention::{attention_bytes, MaskBytes};
use crate::cpu::attention_backward::{attention_backward_bytes, BackwardBuffers, GradBuffers};
use coil_codegen::templates::attention::{AttentionKernel, ForwardLaunch};
use coil_codegen::templates::BLOCK_EMULATION;
use coil_ir::loops::BufferId;
use coil_ir::target::GpuTarget;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The warp-level helpers the templates leave to the includer, in C++, after the emulated
/// thread block.
fn emulation_header() -> String {
    format!("{BLOCK_EMULATION}{}", include_str!("attention_emulation.h"))
}

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

/// A forward kernel's entry point for a call with or without a mask.
fn forward_kernel(kernel: AttentionKernel, masked: bool) -> Emulated {
    let call = match kernel {
        AttentionKernel::Mma { .. } | AttentionKernel::SplitMma { .. } => {
            "(const coil_u16 *)buf[0], (const coil_u16 *)buf[1], (const coil_u16 *)buf[2], (coil_u16 *)buf[3], \
             (float *)buf[4], buf[5], (float *)buf[6], (const long long *)buf[7], p"
        }
        AttentionKernel::Simple { .. } | AttentionKernel::SplitSimple { .. } => {
            "buf[0], buf[1], buf[2], buf[3], (float *)buf[4], buf[5], (float *)buf[6], (const long long *)buf[7], p"
        }
        AttentionKernel::Combine { .. } => "buf[0], (float *)buf[1], (float *)buf[2], p",
    };
    let name = kernel.entry(masked);
    Emulated {
        call: format!("{name}({call})"),
        name,
        source: kernel.source(),
        params: "CoilAttnParams",
        block: kernel.block(),
    }
}

fn backward_kernel(kernel: AttentionBackwardKernel, masked: bool) -> Emulated {
    let call = match kernel {
        AttentionBackwardKernel::Mma { .. } => {
            "(const coil_u16 *)buf[0], (const coil_u16 *)buf[1], (const coil_u16 *)buf[2], (const coil_u16 *)buf[3], \
             (const float *)buf[4], (const float *)buf[5], (coil_u16 *)buf[6], (coil_u16 *)buf[7], (coil_u16 *)buf[8], \
             buf[9], (coil_u16 *)buf[10], p"
        }
        AttentionBackwardKernel::Simple { .. } => {
            "buf[0], buf[1], buf[2], buf[3], (const float *)buf[4], (const float *)buf[5], buf[6], buf[7], buf[8], \
             buf[9], buf[10], p"
        }
    };
    assert!(kernel.shared_bytes() as usize <= 96 * 1024, "the emulation's dynamic shared memory is 96 KiB");
    let name = kernel.entry(masked);
    Emulated {
        call: format!("{name}({call})"),
        name,
        source: kernel.source(),
        params: "CoilAttnBwdParams",
        block: kernel.block(),
    }
}

/// The tensor-core backward's dQ kernel on a stored dS: (k, ds, dq).
fn dq_stored_kernel(kernel: AttentionBackwardKernel) -> Emulated {
    assert!(kernel.dq_stored_shared_bytes() as usize <= 96 * 1024, "the emulation's dynamic shared memory is 96 KiB");
    let name = kernel.dq_stored_entry();
    Emulated {
        call: format!("{name}((const coil_u16 *)buf[0], (const coil_u16 *)buf[1], (coil_u16 *)buf[2], p)"),
        name,
        source: kernel.source(),
        params: "CoilAttnBwdParams",
        block: kernel.block(),
    }
}

fn delta_kernel(kernel: AttentionDeltaKernel) -> Emulated {
    Emulated {
        name: kernel.name(),
        source: kernel.source(),
        call: format!("{}(buf[0], buf[1], (float *)buf[2], p)", kernel.name()),
        params: "CoilAttnDeltaParams",
        block: kernel.block(),
    }
}

/// Compiles a variant's module with the emulation (once per variant and test run).
fn build(dir: &Path, kernel: &Emulated) -> std::result::Result<PathBuf, String> {
    std::fs::write(dir.join("emu.h"), emulation_header()).unwrap();
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
fn launch_runs(
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
                coil_ir::testing::skip(format!("the attention template's host emulation: {why}"));
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
        let (batch, mask, mask_rule) = (vec![b, h], None, None);
        AttentionSpec {
            q: head(0),
            k: head(1),
            v: head(2),
            out,
            batch,
            l,
            s,
            d,
            causal,
            scale,
            mask,
            mask_rule,
            offset: 0,
            dropout: None,
        }
    } else {
        let (q, k) = (contiguous(batch, l, d), contiguous(batch, s, d));
        let (v, out) = (k.clone(), q.clone());
        let (batch, mask, mask_rule) = (batch.to_vec(), None, None);
        AttentionSpec { q, k, v, out, batch, l, s, d, causal, scale: 0.3, mask, mask_rule, offset: 0, dropout: None }
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
/// element (never written, or NaN read) unless it is `want`'s (a logsumexp of -inf).
fn error(what: &str, got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}");
    let (mut num, mut den, mut worst) = (0.0, 0.0, (0usize, 0.0f64));
    for (i, (x, y)) in got.iter().zip(want).enumerate() {
        assert!(x.is_finite() || x == y, "{what}: element {i} is {x}, want {y}");
        assert!(y.is_finite() || x == y, "{what}: element {i} is {x}, want {y}");
        if !y.is_finite() {
            continue;
        }
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

/// The mask of a forward case: element (batch index, row, key) dropped (`None`) or kept with
/// the term added (`Some`, 0 for bool masks); `[l, s]` broadcast over the batch (stride 0) or
/// `[*batch, l, s]`.
#[derive(Clone, Copy)]
struct MaskCase {
    kind: MaskKind,
    term: fn(usize, usize, usize) -> Option<f32>,
    broadcast: bool,
}

/// One forward case: the kernel (the row-block kernels as given, the split kernels as the
/// launch rule picks them for `sm_count` SMs), the dtype, the layout, the mask.
struct ForwardCase {
    kernel: AttentionKernel,
    dtype: DType,
    batch: Vec<usize>,
    l: usize,
    s: usize,
    d: usize,
    causal: bool,
    heads: bool,
    mask: Option<MaskCase>,
    sm_count: u32,
    /// Keys from here on are NaN in k and v: no kernel may read them (the mask drops them
    /// for every row, so their tiles are skipped), else the output is NaN.
    poison: Option<usize>,
    /// Dropout on the weights with this probability ([`draw`]).
    dropout: Option<f64>,
}

/// A run's dropout of probability `p` (an arbitrary key and start, the counter past 2^32 so
/// both counter words take part).
fn draw(p: f64) -> crate::cpu::attention_dropout::DropoutDraw {
    let threshold = coil_ir::philox::dropout_threshold(p);
    crate::cpu::attention_dropout::DropoutDraw {
        seed: 0x1234_5678_9abc,
        start: (1 << 32) - 1000,
        threshold,
        scale: 1.0 / (1.0 - p),
    }
}

/// The mask's bytes and view for `spec`.
fn mask_of(case: &MaskCase, spec: &AttentionSpec, dtype: DType) -> (Vec<u8>, StridedOperand<usize>) {
    let (count, l, s) = (spec.batch_count(), spec.l, spec.s);
    let batches = if case.broadcast { 1 } else { count };
    let elements = (0..batches * l * s).map(|x| (case.term)(x / (l * s), x / s % l, x % s));
    let bytes = match case.kind {
        MaskKind::Bool => elements.map(|t| t.is_some() as u8).collect(),
        MaskKind::Added => encode(dtype, &elements.map(|t| t.unwrap_or(f32::NEG_INFINITY)).collect::<Vec<_>>()),
    };
    let view = if case.broadcast {
        strided(0, vec![0; spec.batch.len()], s)
    } else {
        let mut view = contiguous(&spec.batch, l, s);
        view.col_stride = 1;
        view
    };
    (bytes, view)
}

/// Decode-like: every row keeps the keys up to position 150, the cache beyond is dropped.
fn prefix(_: usize, _: usize, key: usize) -> Option<f32> {
    (key <= 150).then_some(0.0)
}

/// Grouped-query rows at positions 150 + row, a dropped tile [64, 128), row 3 sees nothing.
fn gqa_rows(_: usize, row: usize, key: usize) -> Option<f32> {
    (row != 3 && key <= 150 + row && !(64..128).contains(&key)).then_some(0.0)
}

/// Per batch index and row: keys below 20 + 30 b + 7 row, every third dropped, added terms.
fn added_ramp(b: usize, row: usize, key: usize) -> Option<f32> {
    (key < 20 + 30 * b + 7 * row && key % 3 != 1).then(|| ((row * 31 + key) as f32 * 0.37).sin())
}

/// Row blocks: rows below 10 see nothing, keys beyond row / 2 + 5 are dropped (every block's
/// tiles past the first are dead), holes.
fn banded(_: usize, row: usize, key: usize) -> Option<f32> {
    (row >= 10 && key <= row / 2 + 5 && key % 17 != 4).then_some(0.0)
}

/// The split kernels' results after the combine (when the launch has one), eager and lazy runs
/// (the forward's buffers: output 3, logsumexp 4, workspace 6); `None` without g++.
fn combined(
    builds: &mut Builds,
    launch: &ForwardLaunch,
    params: &[u8],
    count: usize,
    mut runs: [Vec<Vec<u8>>; 2],
) -> Option<[Vec<Vec<u8>>; 2]> {
    if let Some(combine) = launch.combine {
        let emulated = forward_kernel(combine, false);
        let exe = builds.get(&emulated)?;
        let dir = builds.root.join(&emulated.name);
        for got in &mut runs {
            let buffers = [got[3].clone(), got[4].clone(), got[6].clone()];
            let [eager, _] = launch_runs(&exe, &dir, params, (count as u32, 1, 1), emulated.block, &buffers);
            (got[3], got[4]) = (eager[0].clone(), eager[1].clone());
        }
    }
    Some(runs)
}

/// Checks a forward kernel's eager and lazy runs ([`combined`]) against the reference output
/// `want` (of `dtype`) and logsumexp `want_lse` (f32); `what` names a run by its laziness.
fn check_forward_runs(
    runs: &[Vec<Vec<u8>>; 2],
    dtype: DType,
    want: &[u8],
    want_lse: &[u8],
    what: impl Fn(bool) -> String,
) {
    for (got, lazy) in runs.iter().zip([false, true]) {
        let what = what(lazy);
        let tolerance = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
        let err = error(&what, &decode(dtype, &got[3]), &decode(dtype, want));
        assert!(err <= tolerance, "{what}: output error {err:.2e}");
        let err = error(&what, &decode(DType::F32, &got[4]), &decode(DType::F32, want_lse));
        assert!(err <= 1e-5, "{what}: logsumexp error {err:.2e}");
    }
}

#[test]
fn forward_kernels_emulated_on_the_host_match_the_cpu_implementation() {
    let mut builds = Builds::new("attention");
    let mma = |bf16, dp| AttentionKernel::Mma { bf16, dp };
    let split = |bf16, dp| AttentionKernel::SplitMma { bf16, dp };
    let simple = |dtype, dp| AttentionKernel::Simple { dtype, dp };
    let split_simple = |dtype, dp| AttentionKernel::SplitSimple { dtype, dp };
    let bool_mask = |term, broadcast| Some(MaskCase { kind: MaskKind::Bool, term, broadcast });
    let added = Some(MaskCase { kind: MaskKind::Added, term: added_ramp, broadcast: false });
    let case = |kernel, dtype, batch: &[usize], (l, s, d), causal, heads, mask, sm_count| ForwardCase {
        kernel,
        dtype,
        batch: batch.to_vec(),
        l,
        s,
        d,
        causal,
        heads,
        mask,
        sm_count,
        poison: None,
        dropout: None,
    };
    let poisoned = |c: ForwardCase| ForwardCase { poison: Some(192), ..c };
    let dropped = |p, c: ForwardCase| ForwardCase { dropout: Some(p), ..c };
    let cases = [
        // GPT-2 head views, heads merged on output, causal, a tail block (130 = 2 * 64 + 2).
        case(mma(true, 64), DType::BF16, &[1, 2], (130, 130, 64), true, true, None, 0),
        // Not causal, L != S, contiguous.
        case(mma(true, 64), DType::BF16, &[2], (20, 100, 64), false, false, None, 0),
        // f16, a head dim padded from 40 to 48.
        case(mma(false, 48), DType::F16, &[2], (70, 70, 40), true, false, None, 0),
        // The largest head dim, L > S causal (rows past S see every key).
        case(mma(true, 128), DType::BF16, &[1], (80, 50, 128), true, false, None, 0),
        // The simple kernel: f32 and bf16 (before sm_80).
        case(simple(DType::F32, 16), DType::F32, &[1, 2], (33, 33, 16), true, true, None, 0),
        case(simple(DType::BF16, 32), DType::BF16, &[2], (20, 45, 24), false, false, None, 0),
        // Row blocks with a mask: dead rows and a dead tile for the first block, tails.
        case(mma(true, 64), DType::BF16, &[2], (70, 150, 64), false, false, bool_mask(banded, true), 0),
        case(simple(DType::F32, 32), DType::F32, &[2], (20, 90, 32), false, false, added, 0),
        // Split-KV, decode: 1 row of 2 heads against 300 keys (a tail), the cache beyond 150
        // dropped (the last split sees nothing, the first key tile of none is never read): 3
        // splits of 2 tiles.
        poisoned(case(split(true, 64), DType::BF16, &[2], (1, 300, 64), false, false, bool_mask(prefix, true), 2)),
        // Grouped-query rows (4 per key/value head), D = 128, a dead tile and a dead row: 2 splits.
        case(split(true, 128), DType::BF16, &[1, 2], (4, 200, 128), false, false, bool_mask(gqa_rows, true), 1),
        // f16, an added mask per batch index, one split (the block writes the output itself).
        case(split(false, 64), DType::F16, &[4], (3, 130, 64), false, false, added, 1),
        // No mask: 4 splits of one tile; GPT-2's head views with merged heads, one split.
        case(split(true, 64), DType::BF16, &[1, 2], (1, 250, 64), false, false, None, 2),
        case(split(true, 64), DType::BF16, &[1, 2], (16, 16, 64), false, true, None, 2),
        // The simple split kernel: f32 (D = 64, 3 splits of a decode mask) and bf16 before sm_80.
        poisoned(case(
            split_simple(DType::F32, 64),
            DType::F32,
            &[2],
            (1, 300, 64),
            false,
            false,
            bool_mask(prefix, true),
            2,
        )),
        case(split_simple(DType::BF16, 32), DType::BF16, &[2], (5, 70, 24), false, false, None, 2),
        // Dropout on the weights: every kernel, causal and not, tails, bf16 and f32; keys in
        // blocks of four (S = 100, 252) and not.
        dropped(0.1, case(mma(true, 64), DType::BF16, &[1, 2], (130, 130, 64), true, true, None, 0)),
        dropped(0.5, case(mma(true, 64), DType::BF16, &[2], (20, 100, 64), false, false, None, 0)),
        dropped(0.5, case(simple(DType::F32, 16), DType::F32, &[1, 2], (33, 33, 16), true, true, None, 0)),
        dropped(0.3, case(split(true, 64), DType::BF16, &[1, 2], (1, 252, 64), false, false, None, 2)),
        dropped(0.5, case(split_simple(DType::F32, 64), DType::F32, &[2], (3, 150, 64), false, false, None, 2)),
        // A mask and dropout together, also against the decomposition: row blocks with dead rows
        // and dead tiles (bf16; f16 causal with an added mask; f32 simple), the split kernels
        // (grouped-query rows with a dead tile and row; a decode prefix with poisoned keys).
        dropped(0.1, case(mma(true, 64), DType::BF16, &[2], (70, 150, 64), false, false, bool_mask(banded, true), 0)),
        dropped(0.5, case(mma(false, 48), DType::F16, &[2], (70, 70, 40), true, false, added, 0)),
        dropped(0.5, case(simple(DType::F32, 32), DType::F32, &[2], (20, 90, 32), false, false, added, 0)),
        dropped(
            0.3,
            case(split(true, 128), DType::BF16, &[1, 2], (4, 200, 128), false, false, bool_mask(gqa_rows, true), 1),
        ),
        dropped(
            0.5,
            poisoned(case(
                split_simple(DType::F32, 64),
                DType::F32,
                &[2],
                (1, 300, 64),
                false,
                false,
                bool_mask(prefix, true),
                2,
            )),
        ),
    ];
    for c in cases {
        let (dtype, l, s, d) = (c.dtype, c.l, c.s, c.d);
        let mut spec = forward_spec(&c.batch, l, s, d, c.causal, c.heads);
        spec.dropout = c.dropout.map(draw);
        let count = spec.batch_count();
        let launch = match c.kernel {
            AttentionKernel::SplitMma { .. } | AttentionKernel::SplitSimple { .. } => {
                let sm_major =
                    if matches!(c.kernel, AttentionKernel::SplitSimple { dtype: DType::BF16, .. }) { 7 } else { 9 };
                let target = GpuTarget { compute_capability: (sm_major, 0), sm_count: c.sm_count, ..GpuTarget::h100() };
                let launch = ForwardLaunch::choose(dtype, d, &target, count, l, s, c.causal).unwrap();
                assert_eq!(launch.kernel, c.kernel, "the launch rule's kernel");
                launch
            }
            kernel => {
                ForwardLaunch { kernel, grid: AttentionKernel::grid(count, l), chunk: 0, splits: 1, combine: None }
            }
        };
        let emulated = forward_kernel(launch.kernel, c.mask.is_some());
        let Some(exe) = builds.get(&emulated) else { return };
        let [q, mut k, mut v] = operands(dtype, &spec, c.heads);
        if let Some(from) = c.poison {
            let row = d * dtype.size_bytes();
            for b in 0..count {
                for x in [&mut k, &mut v] {
                    x[(b * s + from) * row..(b + 1) * s * row].fill(0xff);
                }
            }
        }
        let (mask, mask_kind) = match &c.mask {
            Some(m) => {
                let (bytes, view) = mask_of(m, &spec, dtype);
                spec.mask = Some(view);
                (bytes, Some(m.kind))
            }
            None => (vec![], None),
        };
        let rows = count * l;
        let (mut want, mut want_lse) = (vec![0u8; rows * d * dtype.size_bytes()], vec![0u8; rows * 4]);
        let mask_bytes = mask_kind.map(|kind| MaskBytes { bytes: &mask, kind });
        attention_bytes(&spec, dtype, &q, &k, &v, mask_bytes, &mut want, Some(&mut want_lse)).unwrap();
        // With dropout, the decomposition's output too.
        let definition = c.dropout.map(|_| {
            let qkv = [decode(dtype, &q), decode(dtype, &k), decode(dtype, &v)];
            let def = definition::Definition { spec: &spec, dtype, qkv, mask: mask_kind.map(|kind| (&mask[..], kind)) };
            def.forward(want.len() / dtype.size_bytes())
        });
        let params = param_bytes(&launch_params(&spec, [&spec.q, &spec.k, &spec.v], mask_kind, &launch));
        let workspace = vec![0xff; launch.workspace_bytes(count, l, d)];
        let (out, lse) = (vec![0xff; want.len()], vec![0xff; want_lse.len()]);
        let buffers = [q.clone(), k.clone(), v.clone(), out, lse, mask.clone(), workspace, vec![]];
        let dir = builds.root.join(&emulated.name);
        let runs = launch_runs(&exe, &dir, &params, launch.grid, emulated.block, &buffers);
        let Some(runs) = combined(&mut builds, &launch, &params, count, runs) else { return };
        let what = |lazy| {
            format!(
                "{} {:?} L={l} S={s} causal={} splits={} mask={:?} dropout={:?} lazy={lazy}",
                emulated.name,
                c.batch,
                c.causal,
                launch.splits,
                c.mask.map(|m| m.kind),
                c.dropout
            )
        };
        check_forward_runs(&runs, dtype, &want, &want_lse, what);
        if let Some(def) = &definition {
            for (got, lazy) in runs.iter().zip([false, true]) {
                let what = format!("{} (the decomposition)", what(lazy));
                let tolerance = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
                let err = error(&what, &decode(dtype, &got[3]), def);
                assert!(err <= tolerance, "{what}: output error {err:.2e}");
            }
        }
    }
}

/// The delta kernel of `dtype` emulated on `spec`'s output `out` and its gradient `grad_out`:
/// `delta` (`[*batch, l]` f32 bytes), checked against `rowsum(dO * O)` in f64; `None` without
/// g++.
fn emulated_delta(
    builds: &mut Builds,
    spec: &AttentionBackwardSpec,
    dtype: DType,
    out: &[u8],
    grad_out: &[u8],
) -> Option<Vec<u8>> {
    let kernel = AttentionDeltaKernel::choose(dtype).unwrap();
    let emulated = delta_kernel(kernel);
    let exe = builds.get(&emulated)?;
    let (o, g) = (decode(dtype, out), decode(dtype, grad_out));
    let rows = spec.batch_count() * spec.l;
    let want: Vec<f64> = (0..rows)
        .map(|r| {
            let (b, i) = (r / spec.l, r % spec.l);
            let at = |view: &StridedOperand<usize>, c: usize| {
                let (mut at, mut rest) = (view.offset + i * view.row_stride + c * view.col_stride, b);
                for (n, stride) in spec.batch.iter().zip(&view.batch_strides).rev() {
                    at += rest % n * stride;
                    rest /= n;
                }
                at
            };
            (0..spec.d).map(|c| o[at(&spec.out, c)] * g[at(&spec.grad_out, c)]).sum()
        })
        .collect();
    let params = param_bytes(&delta_params(spec));
    let buffers = [out.to_vec(), grad_out.to_vec(), vec![0xffu8; rows * 4]];
    let dir = builds.root.join(&emulated.name);
    let grid = AttentionDeltaKernel::grid(rows);
    let [eager, lazy] = launch_runs(&exe, &dir, &params, grid, emulated.block, &buffers);
    assert_eq!(eager[2], lazy[2], "{}: no copies, one result", emulated.name);
    let what = format!("{} {:?} L={}", emulated.name, spec.batch, spec.l);
    let err = error(&what, &decode(DType::F32, &eager[2]), &want);
    assert!(err <= 1e-6, "{what}: delta error {err:.2e}");
    Some(eager[2].clone())
}

#[path = "attention_emulation_definition.rs"]
mod definition;

#[path = "attention_emulation_backward.rs"]
mod backward;

#[path = "attention_emulation_rules.rs"]
mod rules;

#[path = "attention_emulation_masked.rs"]
mod masked;
