//! The attention template ([`ExternCall::Attention`](coil_ir::loops::ExternCall)) on the GPU:
//! a FlashAttention-2-style forward kernel, so the `[*batch, L, S]` scores never exist in
//! memory.
//!
//! * **f16 / bf16 on sm_80 and newer** (`coil_attention_mma_*`): a block of 4 warps takes 64
//!   query rows of one batch index (16 rows per warp, their Q fragments kept in registers) and
//!   walks the keys in blocks of 64 (for causal attention only up to the diagonal block, masked
//!   inside it). K and V tiles are staged in shared memory by `cp.async` (16-byte copies, rows
//!   padded by 16 bytes so `ldmatrix` is conflict-free); V's copy overlaps `S = Q K^T` and the
//!   next K's copy overlaps the softmax and `P V`. Both products run on tensor cores
//!   (`mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`, f32 accumulators); the online softmax
//!   works on the accumulator fragments in f32 (row max and sum across the 4 threads of a quad
//!   by shuffles, `exp2` with the scale folded into `log2(e)`); P is converted to A fragments in
//!   registers; at the end `O / l` is rounded once and stored through the output's strides.
//!   The head dim is a template parameter padded to a multiple of 16 (16..128; the padding
//!   reads as zeros). Operands must be 16-byte aligned rows with unit column stride; a view
//!   that is not is first gathered into a contiguous temporary ([`super::gather`]).
//! * **f32, and any dtype before sm_80** (`coil_attention_simple_*`): one thread per query row,
//!   keys and values staged in shared memory as f32, the same online softmax, any strides. Not
//!   tensor-core speed, but no `[L, S]` scores either.
//!
//! Kernels are built-in CUDA C (no headers: NVRTC has none here), one module per variant (dtype,
//! padded head dim), compiled by NVRTC through the disk cache the first time a graph needs it.
//! Kernel signature (all variants):
//!
//! ```text
//! extern "C" __global__ void coil_attention_{mma,simple}_{bf16,f16,f32}_d{16,32,..,128}(
//!     const T *q, const T *k, const T *v, T *o, CoilAttnParams p)
//! grid (batch indices, ceil(L / 64)), block 128 (mma) or 64 (simple) threads, no dynamic
//! shared memory; query blocks run last-first, so causal blocks with the most keys start first.
//! ```

use super::compiler::{compile, LoadedModule};
use super::device::{driver_error, CudaDevice};
use super::gather::gather;
use super::memory::DeviceMemory;
use crate::cpu::attention::AttentionSpec;
use crate::cuda::blas::DevOperand;
use coil_ir::loops::StridedOperand;
use coil_ir::{DType, Error, Result};
use cudarc::driver::{result as drv, sys};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Query rows per block (both kernels).
const QUERY_BLOCK: usize = 64;

/// The kernels' CUDA C. A variant is this source plus one line instantiating its entry point
/// (`COIL_ATTENTION_MMA(name, padded head dim, bf16?)` or `COIL_ATTENTION_SIMPLE(name, padded
/// head dim, kind)`). With `COIL_ATTENTION_EMULATED` defined, the PTX helpers are left to the
/// includer (a host emulation of the warp instructions, for testing the index math off a GPU).
pub const ATTENTION_SOURCE: &str = r#"
/* coil attention template: FlashAttention-2-style forward (see runtime/src/cuda/attention.rs). */
typedef unsigned short coil_u16;
typedef unsigned int coil_u32;
#define COIL_D __device__ __forceinline__
#define COIL_NEG_INF (-__int_as_float(0x7f800000))

/* One operand: element (b, h, row, col) is at offset + b*outer + h*inner + row*row + col*col. */
struct CoilAttnOperand { long long offset, outer, inner, row, col; };
struct CoilAttnParams {
    CoilAttnOperand q, k, v, o;
    int heads;        /* batch indices per outer index: blockIdx.x = b * heads + h */
    int l, s, d;      /* query rows, keys, head dim */
    float scale_log2; /* scale * log2(e): softmax in powers of two */
    int causal;       /* query row i sees keys j <= i (top-left aligned) */
};

#ifndef COIL_ATTENTION_EMULATED
/* The shared-state-space address of a generic pointer into shared memory. */
COIL_D coil_u32 coil_smem(const void *p) {
    coil_u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
/* 16 bytes global -> shared, asynchronously; zero-filled when !valid (src is then not read). */
COIL_D void coil_cp_async16(coil_u32 dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
COIL_D void coil_cp_async_commit() { asm volatile("cp.async.commit_group;"); }
/* Waits until at most N committed groups are in flight. */
template <int N> COIL_D void coil_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
/* Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8 and receives,
   in r[m], row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix m (transposed: rows
   2 (l % 4) and 2 (l % 4) + 1 of column l / 4). */
COIL_D void coil_ldmatrix_x4(coil_u32 addr, coil_u32 *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
COIL_D void coil_ldmatrix_x4_trans(coil_u32 addr, coil_u32 *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
/* c (16x8 f32) += a (16x16, row) * b (16x8, col) on tensor cores. */
template <bool BF16> COIL_D void coil_mma(float *c, const coil_u32 *a, coil_u32 b0, coil_u32 b1) {
    if constexpr (BF16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}
/* Two f32 rounded to nearest even, packed: lo in the low half (the first in memory). */
template <bool BF16> COIL_D coil_u32 coil_pack(float lo, float hi) {
    coil_u32 r;
    if constexpr (BF16) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}
COIL_D float coil_exp2(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
COIL_D float coil_f16_to_f32(coil_u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
COIL_D coil_u16 coil_f32_to_f16(float f) {
    coil_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
/* Round to nearest even in integer arithmetic (cvt to bf16 needs sm_80; this runs anywhere). */
COIL_D coil_u16 coil_f32_to_bf16(float f) {
    const coil_u32 u = __float_as_uint(f);
    return f != f ? (coil_u16)0x7fc0 : (coil_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
COIL_D float coil_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
COIL_D float coil_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
#endif

COIL_D int coil_imin(int a, int b) { return a < b ? a : b; }

/* A shared tile of N half-type elements, 16-byte aligned (cp.async and ldmatrix rows). */
template <int N> struct alignas(16) coil_tile { coil_u16 e[N]; };

/* The first element of batch index blockIdx.x in an operand. */
COIL_D long long coil_batch_base(const CoilAttnOperand &x, const CoilAttnParams &p) {
    const int bx = blockIdx.x, b = bx / p.heads, h = bx - b * p.heads;
    return x.offset + (long long)b * x.outer + (long long)h * x.inner;
}

/* Rows [first, first + 64) of an operand (unit column stride, 16-byte aligned rows) into a
   shared tile of PITCH-element rows by cp.async, 128 threads; rows >= nrows and columns >= d
   read as zeros. */
template <int DP>
COIL_D void coil_tile_load(coil_u16 *tile, const coil_u16 *base, long long row_stride, int first, int nrows, int d) {
    constexpr int CHUNKS = DP / 8, PITCH = DP + 8;
#pragma unroll
    for (int it = 0; it < 64 * CHUNKS / 128; ++it) {
        const int i = threadIdx.x + it * 128;
        const int r = i / CHUNKS, c = i - r * CHUNKS;
        const bool valid = first + r < nrows && c * 8 < d;
        const coil_u16 *src = valid ? base + (long long)(first + r) * row_stride + c * 8 : base;
        coil_cp_async16(coil_smem(tile + r * PITCH + c * 8), src, valid);
    }
}

/* The tensor-core kernel: 4 warps, 64 query rows of one batch index, keys in blocks of 64. */
template <int DP, bool BF16>
COIL_D void coil_attention_mma(const coil_u16 *__restrict__ q, const coil_u16 *__restrict__ k,
                               const coil_u16 *__restrict__ v, coil_u16 *__restrict__ o, const CoilAttnParams &p) {
    constexpr int BLOCK = 64, PITCH = DP + 8, KC = DP / 16, NT = DP / 8;
    /* K tile; V tile, which first stages the Q tile (16-byte aligned rows: PITCH * 2 bytes). */
    __shared__ coil_tile<BLOCK * PITCH> k_tile, v_tile;
    coil_u16 *sk = k_tile.e, *sv = v_tile.e;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int qblock = gridDim.y - 1 - blockIdx.y;
    const int row0 = qblock * BLOCK;
    const coil_u16 *qb = q + coil_batch_base(p.q, p);
    const coil_u16 *kb = k + coil_batch_base(p.k, p);
    const coil_u16 *vb = v + coil_batch_base(p.v, p);
    coil_u16 *ob = o + coil_batch_base(p.o, p);

    coil_tile_load<DP>(sv, qb, p.q.row, row0, p.l, p.d);
    coil_tile_load<DP>(sk, kb, p.k.row, 0, p.s, p.d);
    coil_cp_async_commit();
    coil_cp_async_wait<0>();
    __syncthreads();
    /* This warp's 16 query rows as A fragments, one per 16 columns of the head dim. */
    coil_u32 qf[KC][4];
#pragma unroll
    for (int kc = 0; kc < KC; ++kc)
        coil_ldmatrix_x4(coil_smem(sv + (warp * 16 + (lane & 15)) * PITCH + kc * 16 + (lane >> 4) * 8), qf[kc]);
    __syncthreads(); /* every warp holds its Q: the tile may take V */

    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    /* Per thread, rows g and g + 8 of the warp's 16: running max (log2 units) and partial sum. */
    float row_max[2] = {COIL_NEG_INF, COIL_NEG_INF}, row_sum[2] = {0.f, 0.f};
    int kblocks = (p.s + BLOCK - 1) / BLOCK;
    if (p.causal) kblocks = coil_imin(kblocks, qblock + 1);
    for (int kbi = 0; kbi < kblocks; ++kbi) {
        const int key0 = kbi * BLOCK;
        coil_tile_load<DP>(sv, vb, p.v.row, key0, p.s, p.d);
        coil_cp_async_commit();

        /* S = Q K^T for 16 rows x 64 keys: 8 n-tiles of 8 keys. */
        float s[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                /* Matrices: keys of tiles j, j+1 (lane / 16) x head-dim halves of chunk kc ((lane / 8) % 2). */
                coil_u32 b[4];
                coil_ldmatrix_x4(coil_smem(sk + ((j + (lane >> 4)) * 8 + (lane & 7)) * PITCH + kc * 16 + ((lane >> 3) & 1) * 8), b);
                coil_mma<BF16>(s[j], qf[kc], b[0], b[1]);
                coil_mma<BF16>(s[j + 1], qf[kc], b[2], b[3]);
            }
        }
        __syncthreads(); /* every warp is done with the K tile */
        if (kbi + 1 < kblocks) coil_tile_load<DP>(sk, kb, p.k.row, key0 + BLOCK, p.s, p.d);
        coil_cp_async_commit(); /* empty on the last block: the waits below count alike */

        /* Scores in log2 units; keys past the end, and after the row when causal, are -inf. */
        const bool masked = key0 + BLOCK > p.s || (p.causal && key0 + BLOCK - 1 > row0);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float x = s[j][e] * p.scale_log2;
                if (masked) {
                    const int key = key0 + j * 8 + 2 * t + (e & 1);
                    const int row = row0 + warp * 16 + g + (e >> 1) * 8;
                    if (key >= p.s || (p.causal && key > row)) x = COIL_NEG_INF;
                }
                s[j][e] = x;
            }
        }
        /* Online softmax: new maximum, rescale what was accumulated, probabilities in place. */
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = row_max[r];
#pragma unroll
            for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
            mx = coil_quad_max(mx);
            /* A row with no key yet: -inf - -inf would be NaN; every term is 0 anyway. */
            const float base = mx == COIL_NEG_INF ? 0.f : mx;
            const float alpha = coil_exp2(row_max[r] - base);
            row_max[r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                s[j][2 * r] = coil_exp2(s[j][2 * r] - base);
                s[j][2 * r + 1] = coil_exp2(s[j][2 * r + 1] - base);
                sum += s[j][2 * r] + s[j][2 * r + 1];
            }
            row_sum[r] = row_sum[r] * alpha + sum;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                acc[n][2 * r] *= alpha;
                acc[n][2 * r + 1] *= alpha;
            }
        }

        coil_cp_async_wait<1>(); /* this thread's V copies landed (the next K's may not have) */
        __syncthreads();         /* ... and every thread's */
        /* O += P V: P's accumulator fragments are A fragments of 16 keys each. */
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
            coil_u32 pa[4];
            pa[0] = coil_pack<BF16>(s[2 * kc][0], s[2 * kc][1]);
            pa[1] = coil_pack<BF16>(s[2 * kc][2], s[2 * kc][3]);
            pa[2] = coil_pack<BF16>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
            pa[3] = coil_pack<BF16>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
            for (int n = 0; n < NT; n += 2) {
                /* Matrices: key halves of chunk kc ((lane / 8) % 2) x head-dim tiles n, n+1 (lane / 16). */
                coil_u32 b[4];
                coil_ldmatrix_x4_trans(coil_smem(sv + (kc * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * PITCH + (n + (lane >> 4)) * 8), b);
                coil_mma<BF16>(acc[n], pa, b[0], b[1]);
                coil_mma<BF16>(acc[n + 1], pa, b[2], b[3]);
            }
        }
        coil_cp_async_wait<0>(); /* the next K tile landed */
        __syncthreads();         /* for every thread, and every warp is done with the V tile */
    }

    /* O / l, rounded once, stored two elements at a time through the output's strides. */
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float total = coil_quad_sum(row_sum[r]);
        const float inv = total > 0.f ? 1.f / total : 0.f;
        const int row = row0 + warp * 16 + g + r * 8;
        if (row < p.l) {
            coil_u16 *dst = ob + (long long)row * p.o.row;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const int col = n * 8 + 2 * t;
                if (col < p.d) *(coil_u32 *)(dst + col) = coil_pack<BF16>(acc[n][2 * r] * inv, acc[n][2 * r + 1] * inv);
            }
        }
    }
}

/* Element loads and stores of the simple kernel: KIND 0 f32, 1 f16, 2 bf16. */
template <int KIND> COIL_D float coil_att_load(const void *p, long long i) {
    if constexpr (KIND == 0) {
        return ((const float *)p)[i];
    } else if constexpr (KIND == 1) {
        return coil_f16_to_f32(((const coil_u16 *)p)[i]);
    } else {
        return __uint_as_float((coil_u32)((const coil_u16 *)p)[i] << 16);
    }
}
template <int KIND> COIL_D void coil_att_store(void *p, long long i, float x) {
    if constexpr (KIND == 0) {
        ((float *)p)[i] = x;
    } else if constexpr (KIND == 1) {
        ((coil_u16 *)p)[i] = coil_f32_to_f16(x);
    } else {
        ((coil_u16 *)p)[i] = coil_f32_to_bf16(x);
    }
}

/* The simple kernel: 64 threads, one query row each; keys and values in blocks of 16 in shared
   memory (f32); any strides. */
template <int DP, int KIND>
COIL_D void coil_attention_simple(const void *q, const void *k, const void *v, void *o, const CoilAttnParams &p) {
    constexpr int KEYS = 16;
    __shared__ float sk[KEYS][DP];
    __shared__ float sv[KEYS][DP];
    const int qblock = gridDim.y - 1 - blockIdx.y;
    const int row0 = qblock * 64, row = row0 + threadIdx.x;
    const long long qb = coil_batch_base(p.q, p), kb = coil_batch_base(p.k, p);
    const long long vb = coil_batch_base(p.v, p), ob = coil_batch_base(p.o, p);
    float qr[DP], acc[DP];
#pragma unroll
    for (int c = 0; c < DP; ++c) {
        qr[c] = row < p.l && c < p.d ? coil_att_load<KIND>(q, qb + row * p.q.row + c * p.q.col) * p.scale_log2 : 0.f;
        acc[c] = 0.f;
    }
    float row_max = COIL_NEG_INF, row_sum = 0.f;
    const int keys = p.causal ? coil_imin(p.s, row0 + 64) : p.s;
    for (int key0 = 0; key0 < keys; key0 += KEYS) {
        __syncthreads(); /* every thread is done with the previous block */
        for (int i = threadIdx.x; i < KEYS * DP; i += 64) {
            const int r = i / DP, c = i - r * DP, key = key0 + r;
            const bool in = key < p.s && c < p.d;
            sk[r][c] = in ? coil_att_load<KIND>(k, kb + key * p.k.row + c * p.k.col) : 0.f;
            sv[r][c] = in ? coil_att_load<KIND>(v, vb + key * p.v.row + c * p.v.col) : 0.f;
        }
        __syncthreads();
        float sc[KEYS];
        float mx = row_max;
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            float x = 0.f;
#pragma unroll
            for (int c = 0; c < DP; ++c) x += qr[c] * sk[j][c];
            const int key = key0 + j;
            sc[j] = key < p.s && !(p.causal && key > row) ? x : COIL_NEG_INF;
            mx = fmaxf(mx, sc[j]);
        }
        const float base = mx == COIL_NEG_INF ? 0.f : mx;
        const float alpha = coil_exp2(row_max - base);
        row_max = mx;
        row_sum *= alpha;
#pragma unroll
        for (int c = 0; c < DP; ++c) acc[c] *= alpha;
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            const float pj = coil_exp2(sc[j] - base);
            row_sum += pj;
#pragma unroll
            for (int c = 0; c < DP; ++c) acc[c] += pj * sv[j][c];
        }
    }
    if (row < p.l) {
        const float inv = row_sum > 0.f ? 1.f / row_sum : 0.f;
#pragma unroll
        for (int c = 0; c < DP; ++c)
            if (c < p.d) coil_att_store<KIND>(o, ob + row * p.o.row + c * p.o.col, acc[c] * inv);
    }
}

#define COIL_ATTENTION_MMA(NAME, DP, BF16)                                                                  \
    extern "C" __global__ void __launch_bounds__(128) NAME(const coil_u16 *q, const coil_u16 *k,             \
                                                           const coil_u16 *v, coil_u16 *o, CoilAttnParams p) { \
        coil_attention_mma<DP, BF16>(q, k, v, o, p);                                                         \
    }
#define COIL_ATTENTION_SIMPLE(NAME, DP, KIND)                                                              \
    extern "C" __global__ void __launch_bounds__(64) NAME(const void *q, const void *k, const void *v,      \
                                                          void *o, CoilAttnParams p) {                     \
        coil_attention_simple<DP, KIND>(q, k, v, o, p);                                                     \
    }
"#;

/// The kernel argument `CoilAttnOperand`, laid out as the C struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnOperand {
    /// Element offset of the first element.
    pub offset: i64,
    /// Stride of the outer batch dim (0 with one batch dim).
    pub outer: i64,
    /// Stride of the inner batch dim (the heads).
    pub inner: i64,
    /// Row stride.
    pub row: i64,
    /// Column stride (1 for the tensor-core kernel).
    pub col: i64,
}

/// The kernel argument `CoilAttnParams`, laid out as the C struct.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnParams {
    /// Queries, keys, values and the output.
    pub q: AttnOperand,
    pub k: AttnOperand,
    pub v: AttnOperand,
    pub o: AttnOperand,
    /// Inner batch dim's size: block `x` is batch index `(x / heads, x % heads)`.
    pub heads: i32,
    /// Query rows, keys, head dim.
    pub l: i32,
    pub s: i32,
    pub d: i32,
    /// `scale * log2(e)`.
    pub scale_log2: f32,
    /// 1 for causal attention.
    pub causal: i32,
}

/// Which kernel runs a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The tensor-core kernel (f16 / bf16 on sm_80+): `bf16` or f16, head dim padded to `dp`.
    Mma { bf16: bool, dp: usize },
    /// The one-row-per-thread kernel: `dtype` f32, f16 or bf16, head dim padded to `dp`.
    Simple { dtype: DType, dp: usize },
}

impl Variant {
    /// The kernel for `dtype` and head dim `d` on a device of compute capability major
    /// `sm_major`; an error for what no kernel runs.
    pub fn choose(dtype: DType, d: usize, sm_major: u32) -> Result<Variant> {
        if d == 0 || d > 128 {
            return Err(Error::unsupported(format!("attention with head dim {d} on CUDA (1 to 128)")));
        }
        let dp = d.div_ceil(16) * 16;
        match dtype {
            // Whole 16-byte chunks per row (d a multiple of 8): the copies never pass a row's end.
            DType::F16 | DType::BF16 if sm_major >= 8 && d.is_multiple_of(8) => {
                Ok(Variant::Mma { bf16: dtype == DType::BF16, dp })
            }
            DType::F16 | DType::BF16 | DType::F32 => Ok(Variant::Simple { dtype, dp }),
            _ => Err(Error::unsupported(format!("attention of {dtype} values on CUDA"))),
        }
    }

    /// The entry point's name, e.g. `coil_attention_mma_bf16_d64`.
    pub fn name(self) -> String {
        match self {
            Variant::Mma { bf16, dp } => format!("coil_attention_mma_{}_d{dp}", if bf16 { "bf16" } else { "f16" }),
            Variant::Simple { dtype, dp } => format!("coil_attention_simple_{dtype}_d{dp}"),
        }
    }

    /// The variant's whole translation unit.
    pub fn source(self) -> String {
        let entry = match self {
            Variant::Mma { bf16, dp } => format!("COIL_ATTENTION_MMA({}, {dp}, {bf16})\n", self.name()),
            Variant::Simple { dtype, dp } => {
                let kind = match dtype {
                    DType::F16 => 1,
                    DType::BF16 => 2,
                    _ => 0,
                };
                format!("COIL_ATTENTION_SIMPLE({}, {dp}, {kind})\n", self.name())
            }
        };
        format!("{ATTENTION_SOURCE}{entry}")
    }

    /// Threads per block.
    pub fn block(self) -> u32 {
        match self {
            Variant::Mma { .. } => 128,
            Variant::Simple { .. } => 64,
        }
    }
}

/// A loaded variant.
struct Kernel {
    _module: LoadedModule,
    func: sys::CUfunction,
}

// SAFETY: function handles are immutable and usable from any thread with the context bound.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

/// The variants built so far, by device ordinal and name (a failed build is remembered too).
type Kernels = HashMap<(usize, String), std::result::Result<Arc<Kernel>, String>>;

fn kernel(dev: &Arc<CudaDevice>, variant: Variant) -> Result<Arc<Kernel>> {
    static KERNELS: Mutex<Option<Kernels>> = Mutex::new(None);
    let mut table = KERNELS.lock().unwrap_or_else(|e| e.into_inner());
    let table = table.get_or_insert_with(HashMap::new);
    let name = variant.name();
    let entry = table.entry((dev.ordinal(), name.clone())).or_insert_with(|| {
        let build = || -> Result<Arc<Kernel>> {
            let (cubin, _) = compile(&variant.source(), &dev.arch(), &crate::cpu::default_cache_dir())?;
            let module = LoadedModule::load(dev, &cubin)?;
            let func = module.function(&name)?;
            Ok(Arc::new(Kernel { _module: module, func }))
        };
        build().map_err(|e| e.message)
    });
    entry.clone().map_err(Error::runtime)
}

/// An operand's kernel argument; `(outer, inner)` are the batch dims (1 batch dim: `outer` 1).
fn operand(op: &StridedOperand<usize>) -> AttnOperand {
    let (outer, inner) = match op.batch_strides[..] {
        [] => (0, 0),
        [inner] => (0, inner),
        [outer, inner] => (outer, inner),
        _ => unreachable!("checked: at most 2 batch dims"),
    };
    let i = |x: usize| x as i64;
    AttnOperand { offset: i(op.offset), outer: i(outer), inner: i(inner), row: i(op.row_stride), col: i(op.col_stride) }
}

/// The kernel's parameters for `spec`, reading q, k, v through `qkv` (the spec's views, or
/// contiguous copies of them).
fn launch_params(spec: &AttentionSpec, qkv: [&StridedOperand<usize>; 3]) -> AttnParams {
    AttnParams {
        q: operand(qkv[0]),
        k: operand(qkv[1]),
        v: operand(qkv[2]),
        o: operand(&spec.out),
        heads: spec.batch.last().copied().unwrap_or(1) as i32,
        l: spec.l as i32,
        s: spec.s as i32,
        d: spec.d as i32,
        scale_log2: (spec.scale * std::f64::consts::LOG2_E) as f32,
        causal: spec.causal as i32,
    }
}

/// The grid: one block per (batch index, block of 64 query rows).
fn grid(spec: &AttentionSpec) -> (u32, u32, u32) {
    (spec.batch_count() as u32, spec.l.div_ceil(QUERY_BLOCK) as u32, 1)
}

/// Row-major strides of `sizes`.
fn row_major(sizes: &[usize]) -> Vec<usize> {
    let mut out = vec![1; sizes.len()];
    for i in (0..sizes.len().saturating_sub(1)).rev() {
        out[i] = out[i + 1] * sizes[i + 1];
    }
    out
}

/// Whether the tensor-core kernel reads `op` as it is: unit column stride and every row start
/// 16-byte aligned (offset and strides multiples of 8 elements of 2 bytes, base aligned).
fn mma_readable(op: &StridedOperand<usize>, base: u64, d: usize) -> bool {
    (op.col_stride == 1 || d == 1)
        && base.is_multiple_of(16)
        && [op.offset, op.row_stride].iter().chain(&op.batch_strides).all(|x| x % 8 == 0)
}

/// Enqueues the attention call `spec` (operands and `out` of `dtype`; `out` overlaps no
/// operand). Every view is bounds-checked against its buffer first; operands the tensor-core
/// kernel cannot read as they are are gathered into contiguous temporaries.
pub fn attention(
    dev: &Arc<CudaDevice>,
    spec: &AttentionSpec,
    dtype: DType,
    q: DevOperand,
    k: DevOperand,
    v: DevOperand,
    out: DevOperand,
) -> Result<()> {
    let size = dtype.size_bytes();
    spec.check(q.bytes / size, k.bytes / size, v.bytes / size, out.bytes / size)?;
    let count = spec.batch_count();
    if count * spec.l * spec.d == 0 {
        return Ok(());
    }
    let too_big = |what: &str, n: usize, max: usize| {
        Err(Error::unsupported(format!("attention on CUDA with {what} {n} (at most {max})")))
    };
    if spec.batch.len() > 2 {
        return too_big("batch dims", spec.batch.len(), 2);
    }
    if spec.l.max(spec.s) > i32::MAX as usize / 2 {
        return too_big("sequence length", spec.l.max(spec.s), i32::MAX as usize / 2);
    }
    let query_blocks = spec.l.div_ceil(QUERY_BLOCK);
    if query_blocks > 65535 {
        return too_big("query blocks", query_blocks, 65535);
    }
    if count > i32::MAX as usize {
        return too_big("batch indices", count, i32::MAX as usize);
    }
    let mut variant = Variant::choose(dtype, spec.d, dev.compute_capability().0)?;
    // The tensor-core kernel stores pairs of elements: the output needs unit column stride and
    // 4-byte aligned pairs, else the simple kernel writes it.
    let pairs = (spec.out.col_stride == 1 || spec.d == 1)
        && out.ptr.is_multiple_of(4)
        && [spec.out.offset, spec.out.row_stride].iter().chain(&spec.out.batch_strides).all(|x| x % 2 == 0);
    if let (Variant::Mma { dp, .. }, false) = (variant, pairs) {
        variant = Variant::Simple { dtype, dp };
    }
    // Operands the tensor-core kernel cannot read in place: gathered, contiguous.
    let mut temps: Vec<DeviceMemory> = Vec::new();
    let mut prepared = Vec::with_capacity(3);
    for (op, buf, rows) in [(&spec.q, q, spec.l), (&spec.k, k, spec.s), (&spec.v, v, spec.s)] {
        if matches!(variant, Variant::Simple { .. }) || mma_readable(op, buf.ptr, spec.d) {
            prepared.push((op.clone(), buf.ptr));
            continue;
        }
        let sizes: Vec<usize> = spec.batch.iter().copied().chain([rows, spec.d]).collect();
        let strides: Vec<usize> = op.batch_strides.iter().copied().chain([op.row_stride, op.col_stride]).collect();
        let tmp = DeviceMemory::alloc(dev, sizes.iter().product::<usize>() * size)?;
        // SAFETY: `check` bounded the view inside its buffer; `tmp` holds the gathered
        // elements and overlaps nothing.
        unsafe { gather(dev, buf.ptr + (op.offset * size) as u64, tmp.ptr(), size, &sizes, &strides)? };
        let contiguous = StridedOperand {
            buffer: op.buffer,
            offset: 0,
            batch_strides: row_major(&sizes)[..spec.batch.len()].to_vec(),
            row_stride: spec.d,
            col_stride: 1,
        };
        prepared.push((contiguous, tmp.ptr()));
        temps.push(tmp);
    }
    let mut params = launch_params(spec, [&prepared[0].0, &prepared[1].0, &prepared[2].0]);
    let f = kernel(dev, variant)?.func;
    let (mut qp, mut kp, mut vp, mut op) = (prepared[0].1, prepared[1].1, prepared[2].1, out.ptr);
    let mut args: [*mut c_void; 5] = [
        (&mut qp as *mut u64).cast(),
        (&mut kp as *mut u64).cast(),
        (&mut vp as *mut u64).cast(),
        (&mut op as *mut u64).cast(),
        (&mut params as *mut AttnParams).cast(),
    ];
    dev.bind()?;
    // SAFETY: the arguments match the kernel's signature (four device pointers and the
    // parameter struct, laid out as in C) and live until the call returns (the driver copies
    // them); every element the kernel touches was bounds-checked above; the temporaries go back
    // to the stream-ordered cache after this launch is enqueued, so no later work reuses them
    // before it ran.
    unsafe { drv::launch_kernel(f, grid(spec), (variant.block(), 1, 1), 0, dev.cu_stream(), &mut args) }
        .map_err(|e| driver_error(&format!("cuLaunchKernel({})", variant.name()), e))?;
    drop(temps);
    Ok(())
}

#[cfg(test)]
#[path = "attention_emulation.rs"]
mod emulation;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_by_dtype_head_dim_and_architecture() {
        assert_eq!(Variant::choose(DType::BF16, 64, 9).unwrap(), Variant::Mma { bf16: true, dp: 64 });
        assert_eq!(Variant::choose(DType::F16, 40, 8).unwrap(), Variant::Mma { bf16: false, dp: 48 });
        assert_eq!(Variant::choose(DType::BF16, 64, 7).unwrap(), Variant::Simple { dtype: DType::BF16, dp: 64 });
        assert_eq!(Variant::choose(DType::F32, 8, 9).unwrap(), Variant::Simple { dtype: DType::F32, dp: 16 });
        assert!(Variant::choose(DType::F64, 64, 9).is_err());
        assert!(Variant::choose(DType::BF16, 136, 9).is_err());
        let v = Variant::Mma { bf16: true, dp: 64 };
        assert_eq!(v.name(), "coil_attention_mma_bf16_d64");
        assert!(v.source().ends_with("COIL_ATTENTION_MMA(coil_attention_mma_bf16_d64, 64, true)\n"));
        assert_eq!(Variant::Simple { dtype: DType::F32, dp: 32 }.name(), "coil_attention_simple_f32_d32");
    }

    #[test]
    fn params_are_laid_out_as_the_c_struct() {
        // Four operands of five i64, then six 4-byte fields: 184 bytes, 8-aligned.
        assert_eq!(std::mem::size_of::<AttnOperand>(), 40);
        assert_eq!(std::mem::size_of::<AttnParams>(), 184);
        assert_eq!(std::mem::offset_of!(AttnParams, heads), 160);
        assert_eq!(std::mem::offset_of!(AttnParams, causal), 180);
    }

    #[test]
    fn head_views_are_read_in_place() {
        // q of GPT-2's QKV output [B, T, 3C] viewed [B, H, T, D]: strides [T*3C, D, 3C, 1].
        let (t, c, d) = (1024, 768, 64);
        let q = StridedOperand {
            buffer: coil_ir::loops::BufferId(0),
            offset: c,
            batch_strides: vec![t * 3 * c, d],
            row_stride: 3 * c,
            col_stride: 1,
        };
        assert!(mma_readable(&q, 256, d));
        assert!(!mma_readable(&StridedOperand { offset: 4, ..q.clone() }, 256, d));
        assert!(!mma_readable(&StridedOperand { col_stride: 3 * c, row_stride: 1, ..q.clone() }, 256, d));
        assert_eq!(operand(&q), AttnOperand { offset: 768, outer: 2359296, inner: 64, row: 2304, col: 1 });
    }
}
