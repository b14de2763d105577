/* coil attention templates: what the forward and the backward kernels share (see
   codegen/src/templates/attention.rs). Follows half.cuh. No headers: NVRTC has none here. */
#define COIL_NEG_INF (-__int_as_float(0x7f800000))
#define COIL_LOG2E 1.4426950408889634f
#define COIL_LN2 0.6931471805599453f
#ifndef COIL_EMULATED
typedef unsigned int uint32_t; /* Philox's words (philox.cuh); the emulation has <cstdint> */
typedef unsigned long long uint64_t;
#endif

/* One operand: element (b, h, row, col) is at offset + b*outer + h*inner + row*row + col*col. */
struct CoilAttnOperand { long long offset, outer, inner, row, col; };

/* The warp-level PTX helpers. With COIL_EMULATED defined they are left to the includer: a
   host emulation of the instructions, for testing the kernels' index math off a GPU
   (runtime/src/cuda/attention_emulation.rs). */
#ifndef COIL_EMULATED
/* The shared-state-space address of a generic pointer into shared memory. Callers add byte
   offsets to the address of a tile's start, so that the conversion is done once per tile and the
   offsets stay 32-bit (a generic pointer per element costs a 64-bit multiply-add each). */
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
/* Subnormal inputs and results flush to zero (.ftz): one MUFU instruction, where the
   subnormal-preserving form takes four. The kernels' exponents are of differences from a
   running maximum, and a term below 2^-126 of the row's largest changes no rounded sum. */
COIL_D float coil_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
COIL_D float coil_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
COIL_D float coil_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
COIL_D float coil_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
/* Lane `lane`'s x (every lane of the warp calls it). */
COIL_D coil_u32 coil_shfl_u32(coil_u32 x, int lane) { return __shfl_sync(0xffffffffu, x, lane); }
#endif

COIL_D int coil_imin(int a, int b) { return a < b ? a : b; }

/* A shared tile of N half-type elements, 16-byte aligned (cp.async and ldmatrix rows). */
template <int N> struct alignas(16) coil_tile { coil_u16 e[N]; };

/* The first element of batch index blockIdx.x (= b * heads + h) in an operand. */
COIL_D long long coil_batch_base(const CoilAttnOperand &x, int heads) {
    const int bx = blockIdx.x, b = bx / heads, h = bx - b * heads;
    return x.offset + (long long)b * x.outer + (long long)h * x.inner;
}

/* Rows [first, first + 64) of an operand (unit column stride, 16-byte aligned rows) into a
   shared tile of PITCH-element rows by cp.async, 128 threads; rows >= nrows and columns >= d
   read as zeros. When the 16-byte chunks of a row divide 128, a thread copies the same chunk
   of every (128 / chunks)-th row: one address computed per call, then a constant step (the
   per-copy 64-bit index products would otherwise dominate a tile's integer work). */
template <int DP>
COIL_D void coil_tile_load(coil_u16 *tile, const coil_u16 *base, long long row_stride, int first, int nrows, int d) {
    constexpr int CHUNKS = DP / 8, PITCH = DP + 8, COPIES = 64 * CHUNKS / 128;
    const coil_u32 dst = coil_smem(tile);
    if constexpr (128 % CHUNKS == 0) {
        constexpr int STEP = 128 / CHUNKS; /* rows between one thread's copies */
        const int r0 = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
        const bool in_row = c * 8 < d;
        const coil_u16 *src = base + (long long)(first + r0) * row_stride + c * 8;
        const long long step = STEP * row_stride;
#pragma unroll
        for (int it = 0; it < COPIES; ++it) {
            const bool valid = in_row && first + r0 + it * STEP < nrows;
            coil_cp_async16(dst + 2 * ((r0 + it * STEP) * PITCH + c * 8), valid ? src + it * step : base, valid);
        }
    } else {
#pragma unroll
        for (int it = 0; it < COPIES; ++it) {
            const int i = threadIdx.x + it * 128;
            const int r = i / CHUNKS, c = i - r * CHUNKS;
            const bool valid = first + r < nrows && c * 8 < d;
            const coil_u16 *src = valid ? base + (long long)(first + r) * row_stride + c * 8 : base;
            coil_cp_async16(dst + 2 * (r * PITCH + c * 8), src, valid);
        }
    }
}

/* Element loads and stores of the simple kernels (any strides): KIND 0 f32, 1 f16, 2 bf16. */
template <int KIND> COIL_D float coil_att_load(const void *p, long long i) {
    if constexpr (KIND == 0) {
        return ((const float *)p)[i];
    } else if constexpr (KIND == 1) {
        return coil_f16_to_f32(((const coil_u16 *)p)[i]);
    } else {
        return coil_bf16_to_f32(((const coil_u16 *)p)[i]);
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

/* An explicit mask's term for (row, key) of the batch index at mask element `base`, in log2
   units, the one routine the forward and the backward kernels read masks with: 0 or -inf for a
   bool mask (mask_kind 1: a byte per element, nonzero keeps the key), the value times log2(e)
   for an added one (mask_kind 2, of element kind KIND: coil_att_load). */
template <int KIND>
COIL_D float coil_mask_at(const void *mask, const CoilAttnOperand &m, int mask_kind, long long base, int row, int key) {
    const long long i = base + (long long)row * m.row + (long long)key * m.col;
    if (mask_kind == 1) return ((const unsigned char *)mask)[i] ? 0.f : COIL_NEG_INF;
    return coil_att_load<KIND>(mask, i) * COIL_LOG2E;
}

/* The warp's A fragments of rows [r0, r0 + 16) of a shared tile of DP columns (PITCH-element
   rows), one per 16 columns. */
template <int DP> COIL_D void coil_a_frags(const coil_u16 *tile, int r0, coil_u32 (*a)[4]) {
    constexpr int PITCH = DP + 8;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kc = 0; kc < DP / 16; ++kc)
        coil_ldmatrix_x4(coil_smem(tile) + 2 * ((r0 + (lane & 15)) * PITCH + kc * 16 + (lane >> 4) * 8), a[kc]);
}

/* acc (16 x 8 JT: JT n-tiles of 8) += A (16 x DP, fragments) B^T, where B is the first 8 JT rows
   of a shared tile (the n dim) over its DP columns (the k dim): S = Q K^T. JT is even. */
template <int DP, bool BF16, int JT = 8>
COIL_D void coil_mma_abt(float (*acc)[4], coil_u32 (*a)[4], const coil_u16 *tile) {
    constexpr int PITCH = DP + 8;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kc = 0; kc < DP / 16; ++kc) {
#pragma unroll
        for (int j = 0; j < JT; j += 2) {
            /* Matrices: rows of n-tiles j, j+1 (lane / 16) x column halves of chunk kc ((lane / 8) % 2). */
            coil_u32 b[4];
            coil_ldmatrix_x4(coil_smem(tile) + 2 * (((j + (lane >> 4)) * 8 + (lane & 7)) * PITCH + kc * 16 + ((lane >> 3) & 1) * 8), b);
            coil_mma<BF16>(acc[j], a[kc], b[0], b[1]);
            coil_mma<BF16>(acc[j + 1], a[kc], b[2], b[3]);
        }
    }
}

/* acc (16 x DP: DP / 8 n-tiles of 8) += A B, where A (16 x 16) is the A fragments `pa` of k chunk
   kc and B rows [16 kc, 16 kc + 16) (the k dim) x DP columns of a shared tile. */
template <int DP, bool BF16> COIL_D void coil_mma_chunk_b(float (*acc)[4], const coil_u32 *pa, const coil_u16 *tile, int kc) {
    constexpr int PITCH = DP + 8;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int n = 0; n < DP / 8; n += 2) {
        /* Matrices: row halves of chunk kc ((lane / 8) % 2) x column tiles n, n+1 (lane / 16). */
        coil_u32 b[4];
        coil_ldmatrix_x4_trans(coil_smem(tile) + 2 * ((kc * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * PITCH + (n + (lane >> 4)) * 8), b);
        coil_mma<BF16>(acc[n], pa, b[0], b[1]);
        coil_mma<BF16>(acc[n + 1], pa, b[2], b[3]);
    }
}

/* acc (16 x DP: DP / 8 n-tiles of 8) += P B, where P (16 x 16 KCH) is the accumulator fragments
   of 2 KCH n-tiles, rounded to the half type (an accumulator's layout is an A fragment's), and B
   the first 16 KCH rows (the k dim) x DP columns of a shared tile: O = P V. */
template <int DP, bool BF16, int KCH = 4>
COIL_D void coil_mma_ab(float (*acc)[4], float (*p)[4], const coil_u16 *tile) {
#pragma unroll
    for (int kc = 0; kc < KCH; ++kc) {
        coil_u32 pa[4];
        pa[0] = coil_pack<BF16>(p[2 * kc][0], p[2 * kc][1]);
        pa[1] = coil_pack<BF16>(p[2 * kc][2], p[2 * kc][3]);
        pa[2] = coil_pack<BF16>(p[2 * kc + 1][0], p[2 * kc + 1][1]);
        pa[3] = coil_pack<BF16>(p[2 * kc + 1][2], p[2 * kc + 1][3]);
        coil_mma_chunk_b<DP, BF16>(acc, pa, tile, kc);
    }
}

/* Stores this thread's rows g and g + 8 of a warp's 16 x DP accumulator, row g + 8r times
   factor[r], rounded to the half type, two elements at a time (unit column stride, 4-byte
   aligned pairs), as rows r0 + g + 8r of `dst` (row stride `row_stride`): those below `nrows`,
   columns below `d`. */
template <int DP, bool BF16>
COIL_D void coil_store_rows(coil_u16 *dst, long long row_stride, int r0, int nrows, int d, float (*acc)[4],
                            const float *factor) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r0 + g + r * 8;
        if (row < nrows) {
            coil_u16 *out = dst + (long long)row * row_stride;
#pragma unroll
            for (int n = 0; n < DP / 8; ++n) {
                const int col = n * 8 + 2 * t;
                if (col < d) *(coil_u32 *)(out + col) = coil_pack<BF16>(acc[n][2 * r] * factor[r], acc[n][2 * r + 1] * factor[r]);
            }
        }
    }
}
