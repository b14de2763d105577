//! The attention kernels run on the host: [`ATTENTION_SOURCE`] compiled by `g++` with the
//! warp-level PTX instructions emulated in C++ from their PTX ISA definitions (`ldmatrix` and
//! `mma.m16n8k16` fragment layouts, `cp.async` groups, quad shuffles), one `std::thread` per
//! CUDA thread with real block and warp barriers. That checks the kernels' index math (fragment
//! layouts, masks, tails, strides, the online softmax, the pipeline's waits) against the CPU
//! implementation without a GPU. Copies run eagerly (at issue) and lazily (at the wait), so a
//! read before its wait or a write before the last read of a tile changes the result.
//! Skipped (passing) without a host `g++`.

use super::*;
use crate::cpu::attention::attention_bytes;
use coil_ir::loops::BufferId;
use std::path::Path;
use std::process::Command;

/// The warp-level helpers `ATTENTION_SOURCE` leaves to the includer, in C++.
const EMULATION_HEADER: &str = r#"
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
#define COIL_ATTENTION_EMULATED 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(n)
#define __restrict__
struct coil_dim3 { unsigned x, y, z; };
inline thread_local coil_dim3 threadIdx;
inline coil_dim3 blockIdx, gridDim, blockDim;
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned coil_emu_bits(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }

/* A reusable barrier of n threads (generation counting). */
struct CoilEmuBarrier {
    explicit CoilEmuBarrier(unsigned n) : n(n) {}
    void arrive_and_wait() {
        std::unique_lock<std::mutex> lock(m);
        const unsigned gen = generation;
        if (++arrived == n) {
            arrived = 0;
            ++generation;
            cv.notify_all();
        } else {
            cv.wait(lock, [&] { return generation != gen; });
        }
    }
    std::mutex m;
    std::condition_variable cv;
    unsigned n, arrived = 0, generation = 0;
};

/* Synchronization: the block's barrier and one per warp, with per-lane exchange slots. */
inline CoilEmuBarrier *coil_emu_block;
struct CoilEmuWarp { CoilEmuBarrier *bar; unsigned long long slot[32][8]; };
inline CoilEmuWarp coil_emu_warps[4];
inline void __syncthreads() { coil_emu_block->arrive_and_wait(); }
inline int coil_emu_lane() { return threadIdx.x & 31; }
inline CoilEmuWarp &coil_emu_warp() { return coil_emu_warps[threadIdx.x >> 5]; }
inline void coil_emu_warp_sync() { coil_emu_warp().bar->arrive_and_wait(); }

/* Shared addresses: 32-bit offsets from an anchor in the same image as the static tiles. */
inline char coil_emu_anchor;
inline unsigned coil_smem(const void *p) { return (unsigned)((std::uintptr_t)p - (std::uintptr_t)&coil_emu_anchor); }
inline unsigned short *coil_emu_at(unsigned a) {
    return (unsigned short *)((std::uintptr_t)&coil_emu_anchor + (std::intptr_t)(std::int32_t)a);
}

/* cp.async: groups of 16-byte copies, run at issue (eager) or at the wait that covers them. */
struct CoilEmuCopy { unsigned dst; const void *src; bool valid; };
inline bool coil_emu_lazy;
inline thread_local std::vector<CoilEmuCopy> coil_emu_open;
inline thread_local std::vector<std::vector<CoilEmuCopy>> coil_emu_groups;
inline void coil_emu_copy(const CoilEmuCopy &c) {
    if (c.valid) std::memcpy(coil_emu_at(c.dst), c.src, 16);
    else std::memset(coil_emu_at(c.dst), 0, 16);
}
inline void coil_cp_async16(unsigned dst, const void *src, bool valid) {
    if (coil_emu_lazy) coil_emu_open.push_back({dst, src, valid});
    else coil_emu_copy({dst, src, valid});
}
inline void coil_cp_async_commit() {
    coil_emu_groups.push_back(coil_emu_open);
    coil_emu_open.clear();
}
template <int N> inline void coil_cp_async_wait() {
    while ((int)coil_emu_groups.size() > N) {
        for (const CoilEmuCopy &c : coil_emu_groups.front()) coil_emu_copy(c);
        coil_emu_groups.erase(coil_emu_groups.begin());
    }
}

/* Half types (IEEE binary16, round to nearest even; no compiler extension needed). */
inline float coil_f16_to_f32(unsigned short h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const float mag = e == 0 ? std::ldexp((float)m, -24)
                      : e == 31 ? (m ? NAN : INFINITY)
                                : std::ldexp((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -mag : mag;
}
inline unsigned short coil_f32_to_f16(float f) {
    const unsigned u = coil_emu_bits(f), sign = (u >> 16) & 0x8000u;
    if (f != f) return (unsigned short)(sign | 0x7e00u);
    const float a = std::fabs(f);
    if (a == 0.f) return (unsigned short)sign;
    if (a >= 65520.f) return (unsigned short)(sign | 0x7c00u); /* rounds past the largest half */
    /* Scale to units of the result's last place, round to nearest even, rebuild. */
    int e;
    std::frexp(a, &e); /* a = x * 2^e, x in [0.5, 1) */
    const int exp = e - 1 < -14 ? -14 : e - 1;          /* the half exponent (subnormals: -14) */
    const double units = std::nearbyint((double)a * std::ldexp(1.0, 10 - exp)); /* mantissa units */
    unsigned bits = (unsigned)units;
    if (exp == -14 && bits < 1024) return (unsigned short)(sign | bits); /* subnormal (or zero) */
    int be = exp + 15;
    if (bits >= 2048) { bits >>= 1; ++be; } /* rounding carried into the next binade */
    return (unsigned short)(sign | (unsigned)be << 10 | (bits & 1023u));
}
inline unsigned short coil_f32_to_bf16(float f) {
    unsigned u = coil_emu_bits(f);
    if (f != f) return 0x7fc0;
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
template <bool BF16> inline float coil_emu_half(unsigned bits) {
    bits &= 0xffffu;
    return BF16 ? __uint_as_float(bits << 16) : coil_f16_to_f32((unsigned short)bits);
}
template <bool BF16> inline unsigned coil_pack(float lo, float hi) {
    unsigned a = BF16 ? coil_f32_to_bf16(lo) : coil_f32_to_f16(lo);
    unsigned b = BF16 ? coil_f32_to_bf16(hi) : coil_f32_to_f16(hi);
    return a | b << 16;
}
inline float coil_exp2(float x) { return std::exp2(x); }

/* ldmatrix .x4 (.trans): lane l addresses row l % 8 of matrix l / 8; r[m] gets row l / 4,
   columns 2 (l % 4) + {0, 1} of matrix m (transposed: rows 2 (l % 4) + {0, 1}, column l / 4). */
inline void coil_emu_ldmatrix(unsigned addr, unsigned *r, bool trans) {
    CoilEmuWarp &w = coil_emu_warp();
    const int lane = coil_emu_lane();
    w.slot[lane][0] = addr;
    coil_emu_warp_sync();
    for (int m = 0; m < 4; ++m) {
        unsigned lo, hi;
        if (!trans) {
            const unsigned short *row = coil_emu_at((unsigned)w.slot[8 * m + lane / 4][0]);
            lo = row[2 * (lane % 4)];
            hi = row[2 * (lane % 4) + 1];
        } else {
            lo = coil_emu_at((unsigned)w.slot[8 * m + 2 * (lane % 4)][0])[lane / 4];
            hi = coil_emu_at((unsigned)w.slot[8 * m + 2 * (lane % 4) + 1][0])[lane / 4];
        }
        r[m] = lo | hi << 16;
    }
    coil_emu_warp_sync();
}
inline void coil_ldmatrix_x4(unsigned addr, unsigned *r) { coil_emu_ldmatrix(addr, r, false); }
inline void coil_ldmatrix_x4_trans(unsigned addr, unsigned *r) { coil_emu_ldmatrix(addr, r, true); }

/* mma.m16n8k16.row.col, f32 accumulators. PTX ISA fragment layouts (g = lane / 4, t = lane % 4):
   A register j of lane (g, t): rows g + 8 (j % 2), columns 2t + 8 (j / 2) + {0, 1};
   B register j: rows (k) 2t + 8 j + {0, 1}, column (n) g; C element i: row g + 8 (i / 2),
   column 2t + i % 2. The low half of a register is the element of the smaller index. */
template <bool BF16> inline void coil_mma(float *c, const unsigned *a, unsigned b0, unsigned b1) {
    CoilEmuWarp &w = coil_emu_warp();
    const int lane = coil_emu_lane();
    for (int i = 0; i < 4; ++i) w.slot[lane][i] = a[i];
    w.slot[lane][4] = b0;
    w.slot[lane][5] = b1;
    coil_emu_warp_sync();
    const int g = lane >> 2, t = lane & 3;
    float d[4];
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float acc = c[i];
        for (int kk = 0; kk < 16; ++kk) {
            const unsigned ar = (unsigned)w.slot[4 * (row % 8) + (kk % 8) / 2][row / 8 + 2 * (kk / 8)];
            const unsigned br = (unsigned)w.slot[4 * col + (kk % 8) / 2][4 + kk / 8];
            acc += coil_emu_half<BF16>(ar >> (16 * (kk % 2))) * coil_emu_half<BF16>(br >> (16 * (kk % 2)));
        }
        d[i] = acc;
    }
    coil_emu_warp_sync();
    for (int i = 0; i < 4; ++i) c[i] = d[i];
}

inline float coil_emu_shfl_xor(float x, int mask) {
    CoilEmuWarp &w = coil_emu_warp();
    const int lane = coil_emu_lane();
    w.slot[lane][0] = coil_emu_bits(x);
    coil_emu_warp_sync();
    const float y = __uint_as_float((unsigned)w.slot[lane ^ mask][0]);
    coil_emu_warp_sync();
    return y;
}
inline float coil_quad_max(float x) {
    x = std::fmax(x, coil_emu_shfl_xor(x, 1));
    return std::fmax(x, coil_emu_shfl_xor(x, 2));
}
inline float coil_quad_sum(float x) {
    x += coil_emu_shfl_xor(x, 1);
    return x + coil_emu_shfl_xor(x, 2);
}
"#;

/// Runs the module: reads `params.bin`, `q.bin`, `k.bin`, `v.bin`, `o.bin` from the directory
/// in argv[1], launches the grid (argv[2], argv[3]) of argv[4] threads per block (argv[5]:
/// lazy copies), writes `out.bin`.
const RUNNER: &str = r#"
#include "module.cu"
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
static std::vector<char> coil_read(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
/* 64-byte aligned copies, as device allocations are (256). */
static char *coil_aligned(const std::vector<char> &bytes) {
    char *p = (char *)std::aligned_alloc(64, (bytes.size() + 63) / 64 * 64);
    std::memcpy(p, bytes.data(), bytes.size());
    return p;
}
int main(int argc, char **argv) {
    if (argc != 6) return 2;
    const std::string dir = argv[1];
    const unsigned gx = std::atoi(argv[2]), gy = std::atoi(argv[3]), block = std::atoi(argv[4]);
    coil_emu_lazy = std::atoi(argv[5]) != 0;
    std::vector<char> pb = coil_read(dir + "/params.bin");
    if (pb.size() != sizeof(CoilAttnParams)) { std::fprintf(stderr, "params: %zu bytes, want %zu\n", pb.size(), sizeof(CoilAttnParams)); return 3; }
    CoilAttnParams p;
    std::memcpy(&p, pb.data(), sizeof p);
    char *q = coil_aligned(coil_read(dir + "/q.bin")), *k = coil_aligned(coil_read(dir + "/k.bin"));
    char *v = coil_aligned(coil_read(dir + "/v.bin"));
    std::vector<char> ob = coil_read(dir + "/o.bin");
    char *o = coil_aligned(ob);
    gridDim = {gx, gy, 1};
    blockDim = {block, 1, 1};
    for (unsigned y = 0; y < gy; ++y) {
        for (unsigned x = 0; x < gx; ++x) {
            blockIdx = {x, y, 0};
            CoilEmuBarrier bar(block);
            coil_emu_block = &bar;
            std::vector<std::unique_ptr<CoilEmuBarrier>> warps;
            for (unsigned w = 0; w < block / 32; ++w) {
                warps.push_back(std::make_unique<CoilEmuBarrier>(32));
                coil_emu_warps[w].bar = warps.back().get();
            }
            std::vector<std::thread> threads;
            for (unsigned i = 0; i < block; ++i)
                threads.emplace_back([=] {
                    threadIdx = {i, 0, 0};
                    COIL_EMU_CALL;
                });
            for (std::thread &t : threads) t.join();
        }
    }
    std::ofstream(dir + "/out.bin", std::ios::binary).write(o, ob.size());
    return 0;
}
"#;

/// One emulated launch: the variant, the call, the operands' values (q, k, v in one buffer
/// when `shared_qkv`), and whether copies are lazy.
struct EmuCase {
    variant: Variant,
    dtype: DType,
    spec: AttentionSpec,
    /// q, k, v views of one buffer (GPT-2's head views), else three contiguous buffers.
    shared_qkv: bool,
}

fn strided(offset: usize, batch_strides: Vec<usize>, row_stride: usize) -> StridedOperand<usize> {
    StridedOperand { buffer: BufferId(0), offset, batch_strides, row_stride, col_stride: 1 }
}

/// `[B, H, L, D]` attention on GPT-2's head views of a `[B, T, 3HD]` buffer, written into a
/// `[B, L, H, D]` output (heads merged), or contiguous `[*batch, rows, D]` operands.
fn emu_case(variant: Variant, dtype: DType, batch: &[usize], l: usize, s: usize, d: usize, causal: bool) -> EmuCase {
    let heads = batch.len() == 2 && l == s;
    let spec = if heads {
        let (b, h) = (batch[0], batch[1]);
        let c = h * d;
        let head = |part: usize| strided(part * c, vec![l * 3 * c, d], 3 * c);
        AttentionSpec {
            q: head(0),
            k: head(1),
            v: head(2),
            out: strided(0, vec![l * c, d], c),
            batch: vec![b, h],
            l,
            s,
            d,
            causal,
            scale: 1.0 / (d as f64).sqrt(),
        }
    } else {
        let n = |rows: usize| -> Vec<usize> {
            (0..batch.len()).map(|i| batch[i + 1..].iter().product::<usize>() * rows * d).collect()
        };
        AttentionSpec {
            q: strided(0, n(l), d),
            k: strided(0, n(s), d),
            v: strided(0, n(s), d),
            out: strided(0, n(l), d),
            batch: batch.to_vec(),
            l,
            s,
            d,
            causal,
            scale: 0.3,
        }
    };
    EmuCase { variant, dtype, spec, shared_qkv: heads }
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

/// Compiles the variant's module with the emulation (once per variant and test run).
fn build(dir: &Path, variant: Variant) -> std::result::Result<std::path::PathBuf, String> {
    std::fs::write(dir.join("emu.h"), EMULATION_HEADER).unwrap();
    std::fs::write(dir.join("module.cu"), variant.source()).unwrap();
    std::fs::write(dir.join("main.cpp"), RUNNER).unwrap();
    let call = match variant {
        Variant::Mma { .. } => format!(
            "{}((const coil_u16 *)q, (const coil_u16 *)k, (const coil_u16 *)v, (coil_u16 *)o, p)",
            variant.name()
        ),
        Variant::Simple { .. } => format!("{}(q, k, v, o, p)", variant.name()),
    };
    let exe = dir.join("emu");
    let out = Command::new("g++")
        .args(["-std=c++17", "-O1", "-pthread", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused", "-include", "emu.h"])
        .arg(format!("-DCOIL_EMU_CALL={call}"))
        .args(["-x", "c++", "main.cpp", "-o"])
        .arg(&exe)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("no g++ ({e})"))?;
    assert!(out.status.success(), "g++ rejected the attention kernels:\n{}", String::from_utf8_lossy(&out.stderr));
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(!warnings.contains("warning"), "g++ warns about the attention kernels:\n{warnings}");
    Ok(exe)
}

/// Runs one case emulated (eager and lazy copies) and compares with the CPU implementation.
fn run(exe: &Path, dir: &Path, case: &EmuCase) {
    let spec = &case.spec;
    let size = case.dtype.size_bytes();
    let batch = spec.batch_count();
    let seeded = |seed: u32, n: usize| -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.7548 + seed as f32 * 1.37).sin() * 1.7 + (i % 7) as f32 * 0.05).collect()
    };
    let (q, k, v) = if case.shared_qkv {
        let all = encode(case.dtype, &seeded(1, batch * spec.l * 3 * spec.d));
        (all.clone(), all.clone(), all)
    } else {
        (
            encode(case.dtype, &seeded(1, batch * spec.l * spec.d)),
            encode(case.dtype, &seeded(2, batch * spec.s * spec.d)),
            encode(case.dtype, &seeded(3, batch * spec.s * spec.d)),
        )
    };
    let out_len = batch * spec.l * spec.d * size;
    let mut want = vec![0u8; out_len];
    attention_bytes(spec, case.dtype, &q, &k, &v, &mut want).unwrap();
    let want = decode(case.dtype, &want);
    let params = launch_params(spec, [&spec.q, &spec.k, &spec.v]);
    // SAFETY: `AttnParams` is plain `repr(C)` data (integers and a float).
    let bytes = unsafe {
        std::slice::from_raw_parts((&params as *const AttnParams).cast::<u8>(), std::mem::size_of::<AttnParams>())
    };
    std::fs::write(dir.join("params.bin"), bytes).unwrap();
    for (name, data) in [("q", &q), ("k", &k), ("v", &v)] {
        std::fs::write(dir.join(format!("{name}.bin")), data).unwrap();
    }
    std::fs::write(dir.join("o.bin"), vec![0xffu8; out_len]).unwrap();
    let (gx, gy, _) = grid(spec);
    for lazy in ["0", "1"] {
        let status = Command::new(exe)
            .arg(dir)
            .args([gx.to_string(), gy.to_string(), case.variant.block().to_string(), lazy.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "{:?}: the emulation failed ({status})", case.variant);
        let got = decode(case.dtype, &std::fs::read(dir.join("out.bin")).unwrap());
        let tolerance = if case.dtype == DType::F32 { 1e-5 } else { 1e-2 };
        let (mut num, mut den, mut worst) = (0.0, 0.0, (0usize, 0.0f64));
        for (i, (x, y)) in got.iter().zip(&want).enumerate() {
            assert!(x.is_finite(), "{:?} lazy={lazy}: element {i} is {x}", case.variant);
            num += (x - y) * (x - y);
            den += y * y;
            if (x - y).abs() > worst.1 {
                worst = (i, (x - y).abs());
            }
        }
        let err = (num / den).sqrt();
        assert!(
            err <= tolerance,
            "{:?} {:?} L={} S={} causal={} lazy={lazy}: relative error {err:.2e}, worst element {} ({} vs {})",
            case.variant,
            spec.batch,
            spec.l,
            spec.s,
            spec.causal,
            worst.0,
            got[worst.0],
            want[worst.0]
        );
    }
}

#[test]
fn kernels_emulated_on_the_host_match_the_cpu_implementation() {
    let root = std::env::temp_dir().join(format!("coil-attention-emu-{}", std::process::id()));
    let bf16 = Variant::Mma { bf16: true, dp: 64 };
    let cases = [
        // GPT-2 head views, heads merged on output, causal, a tail block (130 = 2 * 64 + 2).
        emu_case(bf16, DType::BF16, &[1, 2], 130, 130, 64, true),
        // Not causal, L != S, contiguous.
        emu_case(bf16, DType::BF16, &[2], 20, 100, 64, false),
        // f16, a head dim padded from 40 to 48.
        emu_case(Variant::Mma { bf16: false, dp: 48 }, DType::F16, &[2], 70, 70, 40, true),
        // The largest head dim, L > S causal (rows past S see every key).
        emu_case(Variant::Mma { bf16: true, dp: 128 }, DType::BF16, &[1], 80, 50, 128, true),
        // The simple kernel: f32 and bf16 (before sm_80).
        emu_case(Variant::Simple { dtype: DType::F32, dp: 16 }, DType::F32, &[1, 2], 33, 33, 16, true),
        emu_case(Variant::Simple { dtype: DType::BF16, dp: 32 }, DType::BF16, &[2], 20, 45, 24, false),
    ];
    let mut built: Vec<(Variant, std::path::PathBuf)> = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let dir = root.join(format!("{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = match built.iter().find(|(v, _)| *v == case.variant) {
            Some((_, exe)) => exe.clone(),
            None => match build(&dir, case.variant) {
                Ok(exe) => {
                    built.push((case.variant, exe.clone()));
                    exe
                }
                Err(why) => {
                    eprintln!("attention emulation skipped: {why}");
                    return;
                }
            },
        };
        run(&exe, &dir, case);
    }
    let _ = std::fs::remove_dir_all(&root);
}
