/* The warp-level helpers the attention templates (codegen/src/templates/attention_common.cuh,
   half.cuh) leave to the includer when COIL_EMULATED is defined, in C++ for the host, from their
   PTX ISA definitions; included (after codegen/src/templates/block_emulation.h) before the module by the emulation
   test (runtime/src/cuda/attention_emulation.rs). */
#include <cmath>
#define COIL_EMULATED 1
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline unsigned coil_emu_bits(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }

/* Dynamic shared memory (`extern __shared__` in the kernels): one block's worth, 16-byte aligned. */
alignas(16) inline unsigned char coil_emu_dynamic_shared[96 * 1024];

/* Synchronization: the block's barrier and one per warp, with per-lane exchange slots. */
struct CoilEmuWarp { CoilEmuBarrier *bar; unsigned long long slot[32][8]; };
inline CoilEmuWarp coil_emu_warps[4];
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
/* half.cuh's (integer arithmetic off sm_80), defined with the module. */
inline unsigned short coil_f32_to_bf16(float f);
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
inline float coil_log2(float x) { return std::log2(x); }

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
inline unsigned coil_shfl_u32(unsigned x, int src) {
    CoilEmuWarp &w = coil_emu_warp();
    const int lane = coil_emu_lane();
    w.slot[lane][0] = x;
    coil_emu_warp_sync();
    const unsigned y = (unsigned)w.slot[src][0];
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
inline float coil_warp_sum(float x) {
    for (int m = 16; m > 0; m >>= 1) x += coil_emu_shfl_xor(x, m);
    return x;
}
