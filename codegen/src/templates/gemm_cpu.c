/* coil's CPU matrix product: packed operands, cache blocking, AVX-512 or AVX2 micro-kernels.
 *
 * Compiled after the C prelude (its half-type conversions and GELU), with the tile sizes
 * defined before it: COIL_GEMM_MR_F32 and COIL_GEMM_NR_F32 (AVX-512 f32), COIL_GEMM_MR_BF16 and
 * COIL_GEMM_NR_BF16 (AVX-512 bf16 pairs), COIL_GEMM_MR_AMX and COIL_GEMM_NR_AMX (AMX bf16 tiles),
 * COIL_GEMM_MR_F32_AVX2 and COIL_GEMM_NR_F32_AVX2. Every
 * entry point has the generated kernels' signature; args[0] points to its argument struct. No
 * threads of its own: the runtime runs packing and tiles on its pool.
 *
 * One instruction set per build: AVX-512 (F, BW, VL; BF16 for the pairs; the AMX layout where
 * the compiler targets AMX-TILE and AMX-BF16, served where the CPU and kernel allow)
 * where the compiler targets it and COIL_GEMM_CAP_AVX2 is not defined, else AVX2 with FMA and
 * F16C. The code is
 * written once over vectors of COIL_GEMM_VW floats (16 or 8) and the few operations the
 * instruction set's section below defines.
 *
 * A matrix to pack is `rows x k` (A: m rows; B: n "rows", its columns), read through element
 * strides `rs` (between rows) and `ks` (along k). It is packed in panels of P rows (P = MR for A,
 * NR for B), zero-padded to whole panels and whole k groups:
 *   layouts F32, F32_AVX2: panel[k][P]          floats (f16 and bf16 widened exactly)
 *   layout BF16_PAIRS:     panel[k / 2][P][2]   bf16 bits, the pairs `vdpbf16ps` multiplies
 *   layout BF16_AMX:       B as BF16_PAIRS (a panel's 16 pairs of k by 16 columns are a B tile);
 *                          A as panel[P][kp] bf16, kp = k rounded up to even (an A tile's rows)
 * so the micro-kernel reads both operands with unit stride, whatever their strides were. An A
 * whose rows hold k contiguous words of the layout already is read in place instead, MR rows
 * at a time (a last part panel is packed).
 *
 * A tile (MR rows x NR columns) accumulates in registers over a block of k in f32 and, after
 * the last block, gets the bias and the activation and is rounded once to the output type
 * (PyTorch's bf16 product: f32 accumulation, one rounding), from the registers (the activation
 * passes through the tile in memory: it is the prelude's scalar function, vectorized). When k
 * has several blocks the partial sums wait in an f32 scratch of whole tiles. An output may be
 * the product's transpose (the runtime multiplies b^T a^T when that packs less): each VW
 * columns of a tile are then transposed in registers and stored as rows. */
#include <immintrin.h>

#define COIL_GEMM_LAYOUT_F32 0
#define COIL_GEMM_LAYOUT_BF16_PAIRS 1
#define COIL_GEMM_LAYOUT_F32_AVX2 2
#define COIL_GEMM_LAYOUT_BF16_AMX 3
#define COIL_GEMM_DT_F32 0
#define COIL_GEMM_DT_F16 1
#define COIL_GEMM_DT_BF16 2
#define COIL_GEMM_ACT_NONE 0
#define COIL_GEMM_ACT_GELU_TANH 1
#ifndef COIL_GEMM_PREFETCH_WORDS
#define COIL_GEMM_PREFETCH_WORDS 64
#endif
#ifndef COIL_GEMM_PREFETCH_ROWS
#define COIL_GEMM_PREFETCH_ROWS 8
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(COIL_GEMM_CAP_AVX2)
#define COIL_GEMM_AVX512 1
#define COIL_GEMM_VW 16
#define COIL_GEMM_LAYOUT_WORDS COIL_GEMM_LAYOUT_F32
#define COIL_GEMM_MR_WORDS COIL_GEMM_MR_F32
#define COIL_GEMM_NR_WORDS COIL_GEMM_NR_F32
#if defined(__AVX512BF16__)
#define COIL_GEMM_HAVE_BF16 1
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define COIL_GEMM_AVX2 1
#define COIL_GEMM_VW 8
#define COIL_GEMM_LAYOUT_WORDS COIL_GEMM_LAYOUT_F32_AVX2
#define COIL_GEMM_MR_WORDS COIL_GEMM_MR_F32_AVX2
#define COIL_GEMM_NR_WORDS COIL_GEMM_NR_F32_AVX2
#endif
#if defined(COIL_GEMM_VW)
/* the layout of floats this build multiplies: F32 (AVX-512) or F32_AVX2 */
#define COIL_GEMM_HAVE_WORDS 1
#endif

/* AMX bf16 tiles (Sapphire Rapids and later): the BF16_AMX layout, where the compiler targets
   them (beside AVX512-BF16, which packs its B panels) and the CPU and kernel grant the tile
   data to the process. */
#if defined(COIL_GEMM_HAVE_BF16) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define COIL_GEMM_HAVE_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#if COIL_GEMM_NR_AMX != 32 || COIL_GEMM_MR_AMX != 16 || COIL_GEMM_NR_BF16 != COIL_GEMM_NR_AMX
#error "the AMX kernel takes tiles of 16 rows and 32 columns (two B tiles), B packed as the pairs"
#endif

/* 0: not asked yet; 1: tiles usable; 2: not */
static int coil_gemm_amx_state;

/* Whether this process may use AMX bf16 tiles (asked once: CPUID, then the kernel's grant). */
static int coil_gemm_amx_usable(void)
{
    int state = __atomic_load_n(&coil_gemm_amx_state, __ATOMIC_ACQUIRE);
    if (state == 0) {
        unsigned a, b, c, d;
        /* CPUID 7.0 EDX: bit 22 AMX-BF16, bit 24 AMX-TILE */
        int ok = __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1) && ((d >> 24) & 1);
        /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): Linux 5.16 and later */
        ok = ok && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
        state = ok ? 1 : 2;
        __atomic_store_n(&coil_gemm_amx_state, state, __ATOMIC_RELEASE);
    }
    return state == 1;
}
#endif

/* Whether `layout` packs bf16 pairs along k: both operands of the pairs, B of the AMX layout. */
static inline int coil_gemm_is_pairs(int64_t layout)
{
    return layout == COIL_GEMM_LAYOUT_BF16_PAIRS || layout == COIL_GEMM_LAYOUT_BF16_AMX;
}

/* Which layouts this build serves: bit 0 F32, bit 1 BF16_PAIRS, bit 2 F32_AVX2, bit 3 BF16_AMX
   (compiled in and supported by the CPU running it: a cached library may have been built for
   another; AMX also granted by the kernel). */
void coil_gemm_features(char *const *args, int64_t *status)
{
    int64_t f = 0;
    (void)status;
#if defined(COIL_GEMM_AVX512)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        f |= 1;
#if defined(COIL_GEMM_HAVE_BF16)
    if ((f & 1) && __builtin_cpu_supports("avx512bf16")) f |= 2;
#endif
#if defined(COIL_GEMM_HAVE_AMX)
    if ((f & 2) && coil_gemm_amx_usable()) f |= 8;
#endif
#elif defined(COIL_GEMM_AVX2)
    /* F16C comes with every CPU that has AVX2 and FMA (and older compilers cannot ask for it) */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) f |= 4;
#endif
    *(int64_t *)args[0] = f;
}

/* Whether this build has the micro-kernel of `layout` (the runtime asks only for those
   coil_gemm_features reports; anything else is left untouched). */
static inline int coil_gemm_serves(int64_t layout)
{
#if defined(COIL_GEMM_HAVE_BF16)
    if (layout == COIL_GEMM_LAYOUT_BF16_PAIRS) return 1;
#endif
#if defined(COIL_GEMM_HAVE_AMX)
    if (layout == COIL_GEMM_LAYOUT_BF16_AMX) return coil_gemm_amx_usable();
#endif
#if defined(COIL_GEMM_HAVE_WORDS)
    if (layout == COIL_GEMM_LAYOUT_WORDS) return 1;
#endif
    (void)layout;
    return 0;
}

typedef struct {
    const void *src;
    int64_t rs, ks;   /* element strides between rows and along k */
    int64_t rows, k;
    int64_t dtype;    /* of src */
    int64_t layout;
    int64_t panel;    /* P: rows per panel */
    int64_t lo, hi;   /* the panels to pack */
    void *dst;        /* panel lo: panel p starts at word (p - lo) * P * groups */
    int64_t operand;  /* 0: A, 1: B (the AMX layout packs them differently) */
} coil_gemm_pack_args;

typedef struct {
    int64_t layout;
    const void *pa;           /* this batch's packed A (all of k), from panel pa_first on */
    int64_t pa_first;
    const void *a;            /* or this batch's A read in place (the layout's element type, k
                                 contiguous, rows a_rs elements apart; even k for pairs), all but
                                 a last part panel (packed in pa); NULL: every panel is packed */
    int64_t a_rs;
    const void *b;            /* this batch's B, read through the strides below */
    int64_t b_ns, b_ks, b_dtype;
    const void *pb;           /* this batch's B packed whole (all of k), or NULL: the tiles pack
                                 the B panels they read, a block at a time, into bws */
    void *bws;                /* room for nc packed B panels of kc */
    int64_t m, n, k;
    int64_t kc;               /* k per block, a multiple of the layout's group */
    int64_t nc;               /* B panels packed at once (kept in L2 while the A panels pass) */
    int64_t mc;               /* A panels that pass one B block in a row (they stay in L2 too) */
    int64_t i0, i1, j0, j1;   /* the tiles: A panels [i0, i1) x B panels [j0, j1) */
    const float *bias;        /* n values (m when transposed), or NULL */
    int64_t act;
    void *out;                /* m x n, row stride ldo, of out_dtype */
    int64_t ldo, out_dtype;
    float *acc;               /* partial sums of whole tiles, row stride ldacc (several k blocks) */
    int64_t ldacc;
    int64_t transposed;       /* out holds the n x m transpose (row stride ldo); the bias runs
                                 along m */
} coil_gemm_compute_args;

/* ---- The instruction set's vectors: VW floats (coil_gemm_vf) or 32-bit words (coil_gemm_vi).
   Each section defines the same operations; `n` counts the lanes that are read or written (the
   rest read as zeros, or are left alone). ---- */

#if defined(COIL_GEMM_AVX512)
typedef __m512 coil_gemm_vf;
typedef __m512i coil_gemm_vi;
#define coil_gemm_vzero() _mm512_setzero_ps()
#define coil_gemm_vi_zero() _mm512_setzero_si512()
#define coil_gemm_vload(p) _mm512_loadu_ps(p)
#define coil_gemm_vstore(p, x) _mm512_storeu_ps((p), (x))
#define coil_gemm_vset1(x) _mm512_set1_ps(x)
#define coil_gemm_vadd(x, y) _mm512_add_ps((x), (y))
#define coil_gemm_vfmadd(x, y, z) _mm512_fmadd_ps((x), (y), (z))
#define coil_gemm_vi_of(x) _mm512_castps_si512(x)
#define coil_gemm_vf_of(x) _mm512_castsi512_ps(x)

static inline __mmask16 coil_gemm_mask16(int64_t n)
{
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

static inline __m512 coil_gemm_vload_n(const float *p, int64_t n)
{
    return _mm512_maskz_loadu_ps(coil_gemm_mask16(n), p);
}

static inline void coil_gemm_store_words(uint32_t *dst, __m512i w, int64_t n)
{
    _mm512_mask_storeu_epi32(dst, coil_gemm_mask16(n), w);
}

/* `n` (<= 16) consecutive elements of a row as 32-bit words (zeros past n): floats, widened
   halves, or (pairs) 2n bf16 as n words. */
static inline __m512i coil_gemm_load_words(const void *src, int64_t dtype, int pairs, int64_t at, int64_t n)
{
    const __mmask16 m = coil_gemm_mask16(n);
    if (pairs) return _mm512_maskz_loadu_epi32(m, (const uint16_t *)src + at);
    if (dtype == COIL_GEMM_DT_F32) return _mm512_maskz_loadu_epi32(m, (const float *)src + at);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)src + at);
    if (dtype == COIL_GEMM_DT_F16) return _mm512_castps_si512(_mm512_cvtph_ps(h));
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}

/* Transposes 16 x 16 32-bit words in place: r[i] element j becomes r[j] element i. */
static inline void coil_gemm_transpose(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

/* 16 floats rounded to bf16 as coil_f32_to_bf16 rounds one (to nearest even, NaN made quiet). */
static inline __m256i coil_gemm_bf16x16(__m512 x)
{
    const __m512i b = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, quiet));
}

/* `n` output elements from `at` in the output type. f16: F16C's rounding to nearest even, the
   prelude's coil_f32_to_f16 (subnormals, overflow to inf, quiet NaN). */
static inline void coil_gemm_store_out(const coil_gemm_compute_args *c, __m512 x, int64_t at, int64_t n)
{
    const __mmask16 keep = coil_gemm_mask16(n);
    if (c->out_dtype == COIL_GEMM_DT_F32)
        _mm512_mask_storeu_ps((float *)c->out + at, keep, x);
    else if (c->out_dtype == COIL_GEMM_DT_BF16)
        _mm256_mask_storeu_epi16((uint16_t *)c->out + at, keep, coil_gemm_bf16x16(x));
    else
        _mm256_mask_storeu_epi16((uint16_t *)c->out + at, keep, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

#elif defined(COIL_GEMM_AVX2)
typedef __m256 coil_gemm_vf;
typedef __m256i coil_gemm_vi;
#define coil_gemm_vzero() _mm256_setzero_ps()
#define coil_gemm_vi_zero() _mm256_setzero_si256()
#define coil_gemm_vload(p) _mm256_loadu_ps(p)
#define coil_gemm_vstore(p, x) _mm256_storeu_ps((p), (x))
#define coil_gemm_vset1(x) _mm256_set1_ps(x)
#define coil_gemm_vadd(x, y) _mm256_add_ps((x), (y))
#define coil_gemm_vfmadd(x, y, z) _mm256_fmadd_ps((x), (y), (z))
#define coil_gemm_vi_of(x) _mm256_castps_si256(x)
#define coil_gemm_vf_of(x) _mm256_castsi256_ps(x)

/* lanes [0, n) set */
static inline __m256i coil_gemm_mask8(int64_t n)
{
    const int c = n >= 8 ? 8 : n <= 0 ? 0 : (int)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline __m256 coil_gemm_vload_n(const float *p, int64_t n)
{
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, coil_gemm_mask8(n));
}

/* The first n (< 8) 32-bit words of w, in pieces of 4, 2 and 1: the tails of A's panels (6
   rows) and of transposed tiles are every store there, and masked stores are slow on some
   CPUs. */
static inline void coil_gemm_store_words_part(void *dst, __m256i w, int64_t n)
{
    char *d = (char *)dst;
    __m128i x = _mm256_castsi256_si128(w);
    if (n >= 4) {
        _mm_storeu_si128((__m128i *)d, x);
        x = _mm256_extracti128_si256(w, 1);
        d += 16;
        n -= 4;
    }
    if (n >= 2) {
        _mm_storel_epi64((__m128i *)d, x);
        x = _mm_srli_si128(x, 8);
        d += 8;
        n -= 2;
    }
    if (n >= 1) _mm_storeu_si32(d, x);
}

/* The first n (< 8) 16-bit halves of h, likewise. */
static inline void coil_gemm_store_halves_part(uint16_t *dst, __m128i h, int64_t n)
{
    char *d = (char *)dst;
    if (n >= 4) {
        _mm_storel_epi64((__m128i *)d, h);
        h = _mm_srli_si128(h, 8);
        d += 8;
        n -= 4;
    }
    if (n >= 2) {
        _mm_storeu_si32(d, h);
        h = _mm_srli_si128(h, 4);
        d += 4;
        n -= 2;
    }
    if (n >= 1) _mm_storeu_si16(d, h);
}

static inline void coil_gemm_store_words(uint32_t *dst, __m256i w, int64_t n)
{
    if (n >= 8)
        _mm256_storeu_si256((__m256i *)dst, w);
    else if (n > 0)
        coil_gemm_store_words_part(dst, w, n);
}

/* `n` (<= 8) consecutive elements of a row as 32-bit words (zeros past n): floats, widened
   halves, or (pairs) 2n bf16 as n words. */
static inline __m256i coil_gemm_load_words(const void *src, int64_t dtype, int pairs, int64_t at, int64_t n)
{
    if (pairs || dtype == COIL_GEMM_DT_F32) {
        const int *w = pairs ? (const int *)((const uint16_t *)src + at) : (const int *)((const float *)src + at);
        return n >= 8 ? _mm256_loadu_si256((const __m256i *)w) : _mm256_maskload_epi32(w, coil_gemm_mask8(n));
    }
    __m128i h;
    if (n >= 8) {
        h = _mm_loadu_si128((const __m128i *)((const uint16_t *)src + at));
    } else {
        /* a row's tail: no masked 16-bit loads before AVX-512 */
        uint16_t t[8] = {0};
        memcpy(t, (const uint16_t *)src + at, (size_t)(n > 0 ? n : 0) * 2);
        h = _mm_loadu_si128((const __m128i *)t);
    }
    if (dtype == COIL_GEMM_DT_F16) return _mm256_castps_si256(_mm256_cvtph_ps(h));
    return _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
}

/* Transposes 8 x 8 32-bit words in place: r[i] element j becomes r[j] element i. */
static inline void coil_gemm_transpose(__m256i r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(_mm256_castsi256_ps(r[i]), _mm256_castsi256_ps(r[i + 1]));
        t[i + 1] = _mm256_unpackhi_ps(_mm256_castsi256_ps(r[i]), _mm256_castsi256_ps(r[i + 1]));
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_castps_si256(_mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        r[i + 4] = _mm256_castps_si256(_mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
}

/* 8 floats rounded to bf16 as coil_f32_to_bf16 rounds one (to nearest even, NaN made quiet). */
static inline __m128i coil_gemm_bf16x8(__m256 x)
{
    const __m256i b = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    /* |x| and infinity are non-negative as signed words: a signed compare finds the NaNs */
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
    const __m256i h = _mm256_blendv_epi8(r, quiet, nan);
    /* every word is below 0x10000: the unsigned saturation keeps it */
    return _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* `n` output elements from `at` in the output type. f16: F16C's rounding to nearest even, the
   prelude's coil_f32_to_f16 (subnormals, overflow to inf, quiet NaN). */
static inline void coil_gemm_store_out(const coil_gemm_compute_args *c, __m256 x, int64_t at, int64_t n)
{
    if (n <= 0) return;
    if (c->out_dtype == COIL_GEMM_DT_F32) {
        coil_gemm_store_words((uint32_t *)((float *)c->out + at), _mm256_castps_si256(x), n);
        return;
    }
    const __m128i h = c->out_dtype == COIL_GEMM_DT_BF16
                          ? coil_gemm_bf16x8(x)
                          : _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    uint16_t *o = (uint16_t *)c->out + at;
    if (n >= 8)
        _mm_storeu_si128((__m128i *)o, h);
    else
        coil_gemm_store_halves_part(o, h, n);
}
#endif

/* ---- Packing ---- */

#if defined(COIL_GEMM_HAVE_WORDS)
static inline float coil_gemm_load_f32(const void *src, int64_t dtype, int64_t at)
{
    if (dtype == COIL_GEMM_DT_F32) return ((const float *)src)[at];
    if (dtype == COIL_GEMM_DT_F16) return coil_f16_to_f32(((const uint16_t *)src)[at]);
    return coil_bf16_to_f32(((const uint16_t *)src)[at]);
}

/* Panels [lo, hi) of a matrix whose rows are contiguous at each k (B row-major, A
   column-major), all but the odd k of pairs: k outermost, so that each k's row of the source is
   read once across the panels (one page per k, not one per panel and k). */
static void coil_gemm_pack_by_k(const coil_gemm_pack_args *p)
{
    const int pairs = coil_gemm_is_pairs(p->layout);
    const int64_t P = p->panel, K = p->k, ks = p->ks, groups = pairs ? (K + 1) / 2 : K;
    const int64_t whole = pairs ? K / 2 : K;
    const int64_t esize = p->dtype == COIL_GEMM_DT_F32 ? 4 : 2;
#if defined(COIL_GEMM_AVX512)
    const uint16_t *h = (const uint16_t *)p->src;
    /* interleaving the bf16 of k = 2g (x) and 2g + 1 (y) */
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                        39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
#endif
    for (int64_t g = 0; g < whole; g++)
        for (int64_t panel = p->lo; panel < p->hi; panel++) {
            const int64_t r0 = panel * P, rows = p->rows - r0 < P ? p->rows - r0 : P;
            uint32_t *dst = (uint32_t *)p->dst + (panel - p->lo) * P * groups + g * P;
            if (!pairs) {
                for (int64_t rb = 0; rb < P; rb += COIL_GEMM_VW) {
                    _mm_prefetch((const char *)p->src + (r0 + rb + (g + COIL_GEMM_PREFETCH_ROWS) * ks) * esize, _MM_HINT_T0);
                    coil_gemm_store_words(dst + rb, coil_gemm_load_words(p->src, p->dtype, 0, r0 + rb + g * ks, rows - rb), P - rb);
                }
                continue;
            }
#if defined(COIL_GEMM_AVX512)
            for (int64_t rb = 0; rb < P; rb += 32) {
                const uint16_t *x = h + r0 + rb + 2 * g * ks, *y = x + ks;
                _mm_prefetch((const char *)(x + 2 * COIL_GEMM_PREFETCH_ROWS * ks), _MM_HINT_T0);
                _mm_prefetch((const char *)(y + 2 * COIL_GEMM_PREFETCH_ROWS * ks), _MM_HINT_T0);
                const __mmask32 m = rows - rb >= 32 ? 0xffffffffu : rows - rb <= 0 ? 0 : (1u << (rows - rb)) - 1;
                const __m512i vx = _mm512_maskz_loadu_epi16(m, x), vy = _mm512_maskz_loadu_epi16(m, y);
                _mm512_mask_storeu_epi32(dst + rb, coil_gemm_mask16(P - rb), _mm512_permutex2var_epi16(vx, lo, vy));
                _mm512_mask_storeu_epi32(dst + rb + 16, coil_gemm_mask16(P - rb - 16), _mm512_permutex2var_epi16(vx, hi, vy));
            }
#endif
        }
}

/* One panel of P rows from row r0, as 32-bit words: dst[g * P + r] is row r's k group g (a
   float, or a pair of bf16); with rows contiguous at each k, only what coil_gemm_pack_by_k
   left (the odd k of pairs). */
static inline void coil_gemm_pack_panel(const coil_gemm_pack_args *p, int64_t r0, uint32_t *dst)
{
    enum { VW = COIL_GEMM_VW };
    const int pairs = coil_gemm_is_pairs(p->layout);
    const int64_t P = p->panel, K = p->k, rows = p->rows - r0 < P ? p->rows - r0 : P;
    const int64_t rs = p->rs, ks = p->ks, groups = pairs ? (K + 1) / 2 : K;
    /* groups read as whole words: all of them, but with pairs and an odd k the last (half
       outside the row) is done element by element */
    const int64_t whole = pairs ? K / 2 : K;
    const uint16_t *h = (const uint16_t *)p->src;
    const int64_t esize = p->dtype == COIL_GEMM_DT_F32 ? 4 : 2;
    int64_t g0 = 0;
    if (ks == 1) {
        /* k contiguous in each row (A row-major, B a transposed weight): VW x VW transposes */
        for (; g0 < whole; g0 += VW) {
            const int64_t ng = whole - g0 < VW ? whole - g0 : VW;
            for (int64_t rb = 0; rb < P; rb += VW) {
                coil_gemm_vi w[VW];
                for (int64_t i = 0; i < VW; i++) {
                    const int64_t r = rb + i;
                    if (r >= rows) {
                        w[i] = coil_gemm_vi_zero();
                        continue;
                    }
                    const int64_t at = (r0 + r) * rs + g0 * (pairs + 1);
                    /* many rows are read at once, more streams than the prefetchers follow */
                    _mm_prefetch((const char *)p->src + (at + COIL_GEMM_PREFETCH_WORDS * (pairs + 1)) * esize, _MM_HINT_T0);
                    w[i] = coil_gemm_load_words(p->src, p->dtype, pairs, at, ng);
                }
                coil_gemm_transpose(w);
                for (int64_t g = 0; g < ng; g++) coil_gemm_store_words(dst + (g0 + g) * P + rb, w[g], P - rb);
            }
        }
        g0 = whole;
    } else if (rs == 1) {
        g0 = whole; /* coil_gemm_pack_by_k packed them */
    }
    /* what is left (other strides, the odd k of pairs), element by element */
    for (int64_t g = g0; g < groups; g++)
        for (int64_t r = 0; r < P; r++) {
            if (!pairs) {
                const float v = r < rows ? coil_gemm_load_f32(p->src, p->dtype, (r0 + r) * rs + g * ks) : 0.0f;
                memcpy(dst + g * P + r, &v, 4);
                continue;
            }
            uint16_t e[2];
            for (int64_t i = 0; i < 2; i++)
                e[i] = (r < rows && 2 * g + i < K) ? h[(r0 + r) * rs + (2 * g + i) * ks] : 0;
            memcpy(dst + g * P + r, e, 4);
        }
}
#endif

#if defined(COIL_GEMM_HAVE_AMX)
/* Panels [lo, hi) of A as the AMX kernel reads A's tiles: each panel P (16) rows of kp = k
   rounded up to even bf16, row r at element r * kp, zeros past k and past the last row (so
   that a packed panel is read as an A in place with rows kp apart). */
static void coil_gemm_pack_amx_a(const coil_gemm_pack_args *p)
{
    enum { P = COIL_GEMM_MR_AMX };
    const int64_t K = p->k, kp = (K + 1) / 2 * 2, rs = p->rs, ks = p->ks;
    const uint16_t *h = (const uint16_t *)p->src;
    for (int64_t panel = p->lo; panel < p->hi; panel++) {
        const int64_t r0 = panel * P, rows = p->rows - r0 < P ? p->rows - r0 : P;
        uint16_t *dst = (uint16_t *)p->dst + (panel - p->lo) * P * kp;
        if (ks == 1) {
            /* rows of k contiguous: copied 32 elements at a time */
            for (int64_t r = 0; r < P; r++) {
                const uint16_t *src = h + (r0 + r) * rs;
                for (int64_t k0 = 0; k0 < kp; k0 += 32) {
                    const int64_t in = r < rows ? K - k0 : 0, out = kp - k0;
                    const __mmask32 mi = in >= 32 ? 0xffffffffu : in <= 0 ? 0 : (1u << in) - 1;
                    const __mmask32 mo = out >= 32 ? 0xffffffffu : (1u << out) - 1;
                    _mm512_mask_storeu_epi16(dst + r * kp + k0, mo, _mm512_maskz_loadu_epi16(mi, src + k0));
                }
            }
        } else if (rs == 1) {
            /* rows contiguous at each k: each k's 16 rows read at once, pairs of k interleaved
               into words (a word per row), 16 x 16 words transposed into 16 rows of 32 k */
            const __mmask16 mr = (__mmask16)(rows >= 16 ? 0xffff : (1u << rows) - 1);
            for (int64_t g0 = 0; g0 < kp / 2; g0 += 16) {
                __m512i w[16];
                for (int64_t g = 0; g < 16; g++) {
                    const int64_t k0 = 2 * (g0 + g);
                    const __m256i x = k0 < K ? _mm256_maskz_loadu_epi16(mr, h + r0 + k0 * ks) : _mm256_setzero_si256();
                    const __m256i y =
                        k0 + 1 < K ? _mm256_maskz_loadu_epi16(mr, h + r0 + (k0 + 1) * ks) : _mm256_setzero_si256();
                    w[g] = _mm512_or_si512(_mm512_cvtepu16_epi32(x), _mm512_slli_epi32(_mm512_cvtepu16_epi32(y), 16));
                }
                coil_gemm_transpose(w);
                for (int64_t r = 0; r < P; r++) coil_gemm_store_words((uint32_t *)(dst + r * kp) + g0, w[r], kp / 2 - g0);
            }
        } else {
            for (int64_t r = 0; r < P; r++)
                for (int64_t q = 0; q < kp; q++)
                    dst[r * kp + q] = r < rows && q < K ? h[(r0 + r) * rs + q * ks] : 0;
        }
    }
}
#endif

void coil_gemm_pack(char *const *args, int64_t *status)
{
    const coil_gemm_pack_args *p = (const coil_gemm_pack_args *)args[0];
    (void)status;
    if (!coil_gemm_serves(p->layout)) return;
#if defined(COIL_GEMM_HAVE_AMX)
    if (p->layout == COIL_GEMM_LAYOUT_BF16_AMX && p->operand == 0) {
        coil_gemm_pack_amx_a(p);
        return;
    }
#endif
#if defined(COIL_GEMM_HAVE_WORDS)
    const int64_t groups = coil_gemm_is_pairs(p->layout) ? (p->k + 1) / 2 : p->k;
    if (p->rs == 1 && p->ks != 1) coil_gemm_pack_by_k(p);
    for (int64_t panel = p->lo; panel < p->hi; panel++)
        coil_gemm_pack_panel(p, panel * p->panel, (uint32_t *)p->dst + (panel - p->lo) * p->panel * groups);
#endif
}

/* ---- Micro-kernels ---- */

/* The activation over a tile of n floats (a whole tile: one vector loop without a remainder). */
static __attribute__((noinline)) void coil_gemm_gelu_tile(float *t, int64_t n)
{
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) t[i] = coil_gelu_tanh_f32(t[i]);
}

/* The end of a micro-kernel, from its tile `t` (MR x NV vectors): an earlier block of k stores it
   to acc; the last adds the bias, applies the activation and stores the output (rounded once,
   transposed when the output is). Needs c, acc, row, col, last in scope. */
#define COIL_GEMM_FINISH(MR, NR)                                                                   \
    do {                                                                                           \
        enum { VW_ = COIL_GEMM_VW, NV_ = (NR) / COIL_GEMM_VW };                                    \
        if (!last) {                                                                               \
            _Pragma("GCC unroll 32") for (int r = 0; r < (MR); r++)                                \
                _Pragma("GCC unroll 8") for (int v = 0; v < NV_; v++)                              \
                    coil_gemm_vstore(acc + r * c->ldacc + VW_ * v, t[r][v]);                       \
            return;                                                                                \
        }                                                                                          \
        const int64_t mv = c->m - row < (MR) ? c->m - row : (MR);                                  \
        const int64_t nv = c->n - col < (NR) ? c->n - col : (NR);                                  \
        if (c->bias && c->transposed) {                                                            \
            _Pragma("GCC unroll 32") for (int r = 0; r < (MR); r++) {                              \
                const coil_gemm_vf bias = coil_gemm_vset1(row + r < c->m ? c->bias[row + r] : 0.0f); \
                _Pragma("GCC unroll 8") for (int v = 0; v < NV_; v++) t[r][v] = coil_gemm_vadd(t[r][v], bias); \
            }                                                                                      \
        } else if (c->bias) {                                                                      \
            _Pragma("GCC unroll 8") for (int v = 0; v < NV_; v++) {                                \
                const coil_gemm_vf bias = coil_gemm_vload_n(c->bias + col + VW_ * v, nv - VW_ * v); \
                _Pragma("GCC unroll 32") for (int r = 0; r < (MR); r++) t[r][v] = coil_gemm_vadd(t[r][v], bias); \
            }                                                                                      \
        }                                                                                          \
        if (c->act == COIL_GEMM_ACT_GELU_TANH) {                                                   \
            float tile[(MR) * (NR)] __attribute__((aligned(64)));                                  \
            _Pragma("GCC unroll 32") for (int r = 0; r < (MR); r++)                                \
                _Pragma("GCC unroll 8") for (int v = 0; v < NV_; v++)                              \
                    coil_gemm_vstore(tile + r * (NR) + VW_ * v, t[r][v]);                          \
            coil_gemm_gelu_tile(tile, (MR) * (NR));                                                \
            _Pragma("GCC unroll 32") for (int r = 0; r < (MR); r++)                                \
                _Pragma("GCC unroll 8") for (int v = 0; v < NV_; v++)                              \
                    t[r][v] = coil_gemm_vload(tile + r * (NR) + VW_ * v);                          \
        }                                                                                          \
        /* rounded and stored from the registers */                                                \
        if (c->transposed) {                                                                       \
            /* each VW columns of the tile transposed: VW rows of out, mv elements each */         \
            _Pragma("GCC unroll 8") for (int v = 0; v < NV_; v++) {                                \
                coil_gemm_vi w[VW_];                                                               \
                _Pragma("GCC unroll 16") for (int r = 0; r < VW_; r++)                             \
                    w[r] = r < (MR) ? coil_gemm_vi_of(t[r < (MR) ? r : 0][v]) : coil_gemm_vi_zero(); \
                coil_gemm_transpose(w);                                                            \
                for (int64_t q = 0; q < VW_ && VW_ * v + q < nv; q++)                              \
                    coil_gemm_store_out(c, coil_gemm_vf_of(w[q]), (col + VW_ * v + q) * c->ldo + row, mv); \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        _Pragma("GCC unroll 32") for (int r = 0; r < (MR); r++) {                                  \
            if (r >= mv) break;                                                                    \
            _Pragma("GCC unroll 8") for (int v = 0; v < NV_; v++)                                  \
                coil_gemm_store_out(c, t[r][v], (row + r) * c->ldo + col + VW_ * v, nv - VW_ * v); \
        }                                                                                          \
    } while (0)

/* The micro-kernel of one layout: an MR x NR tile in NV vectors per row, over `steps` k groups
   of GROUP elements; a first block starts from zero, a later one from acc; a last block ends in
   the output, an earlier one in acc. A is a packed panel of PR rows (PR >= MR: an edge kernel
   reads the first MR rows of a full-width panel), or with DIRECT MR rows read in place (`lda`
   elements apart, k contiguous). LOAD_B(p) and FMA(acc, a_ptr, b) are the layout's. */
#define COIL_GEMM_MICRO(NAME, MR, PR, NR, ELEM, GROUP, DIRECT, BVEC, LOAD_B, FMA)                   \
    static void NAME(const coil_gemm_compute_args *c, const ELEM *a, int64_t lda, const ELEM *b,   \
                     int64_t steps, int64_t row, int64_t col, int first, int last)                 \
    {                                                                                              \
        enum { VW = COIL_GEMM_VW, NV = (NR) / COIL_GEMM_VW };                                      \
        float *acc = c->acc ? c->acc + row * c->ldacc + col : 0;                                   \
        coil_gemm_vf t[MR][NV];                                                                    \
        _Pragma("GCC unroll 32") for (int r = 0; r < (MR); r++)                                    \
            _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++)                                   \
                t[r][v] = first ? coil_gemm_vzero() : coil_gemm_vload(acc + r * c->ldacc + VW * v); \
        for (int64_t s = 0; s < steps; s++) {                                                      \
            BVEC bv[NV];                                                                           \
            _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++)                                   \
                bv[v] = LOAD_B(b + (s * (NR) + VW * v) * (GROUP));                                 \
            _Pragma("GCC unroll 32") for (int r = 0; r < (MR); r++) {                              \
                const ELEM *ap = (DIRECT) ? a + r * lda + s * (GROUP) : a + (s * (PR) + r) * (GROUP); \
                _Pragma("GCC unroll 8") for (int v = 0; v < NV; v++) t[r][v] = FMA(t[r][v], ap, bv[v]); \
            }                                                                                      \
        }                                                                                          \
        COIL_GEMM_FINISH(MR, NR);                                                                  \
    }

#if defined(COIL_GEMM_HAVE_WORDS)
#if COIL_GEMM_MR_WORDS > COIL_GEMM_VW || (defined(COIL_GEMM_HAVE_BF16) && COIL_GEMM_MR_BF16 > COIL_GEMM_VW)
#error "a transposed tile store transposes one vector's rows at most"
#endif
#if COIL_GEMM_NR_WORDS % COIL_GEMM_VW != 0
#error "NR is whole vectors"
#endif
#define COIL_GEMM_FMA_F32(acc, ap, b) coil_gemm_vfmadd(coil_gemm_vset1(*(ap)), (b), (acc))
COIL_GEMM_MICRO(coil_gemm_micro_f32, COIL_GEMM_MR_WORDS, COIL_GEMM_MR_WORDS, COIL_GEMM_NR_WORDS, float, 1, 0,
                coil_gemm_vf, coil_gemm_vload, COIL_GEMM_FMA_F32)
COIL_GEMM_MICRO(coil_gemm_micro_f32_direct, COIL_GEMM_MR_WORDS, COIL_GEMM_MR_WORDS, COIL_GEMM_NR_WORDS, float, 1, 1,
                coil_gemm_vf, coil_gemm_vload, COIL_GEMM_FMA_F32)
/* Edge kernels: a last A panel of at most 4 (8) rows in a 4 (8)-row tile of the packed panel,
   not a whole one: 205 rows are 17 panels of 12 and one row, and that row's panel cost a full
   panel's time. With 2 NR / VW accumulators per row and FMA's latency of 4 cycles, 4 rows keep
   both FMA ports busy, so the edge costs MR' / MR of a panel. */
#if COIL_GEMM_MR_WORDS > 4
COIL_GEMM_MICRO(coil_gemm_micro_f32_r4, 4, COIL_GEMM_MR_WORDS, COIL_GEMM_NR_WORDS, float, 1, 0, coil_gemm_vf,
                coil_gemm_vload, COIL_GEMM_FMA_F32)
#endif
#if COIL_GEMM_MR_WORDS > 8
COIL_GEMM_MICRO(coil_gemm_micro_f32_r8, 8, COIL_GEMM_MR_WORDS, COIL_GEMM_NR_WORDS, float, 1, 0, coil_gemm_vf,
                coil_gemm_vload, COIL_GEMM_FMA_F32)
#endif

/* The packed micro-kernel for panel rows [row, row + rows) of a panel of MR_WORDS: an edge
   kernel where fewer rows are left. */
static inline void coil_gemm_micro_f32_rows(const coil_gemm_compute_args *c, const float *a, const float *b,
                                            int64_t steps, int64_t row, int64_t rows, int64_t col, int first,
                                            int last)
{
#if COIL_GEMM_MR_WORDS > 4
    if (rows <= 4) {
        coil_gemm_micro_f32_r4(c, a, 0, b, steps, row, col, first, last);
        return;
    }
#endif
#if COIL_GEMM_MR_WORDS > 8
    if (rows <= 8) {
        coil_gemm_micro_f32_r8(c, a, 0, b, steps, row, col, first, last);
        return;
    }
#endif
    (void)rows;
    coil_gemm_micro_f32(c, a, 0, b, steps, row, col, first, last);
}
#endif

#if defined(COIL_GEMM_HAVE_BF16)
#define COIL_GEMM_LOAD_PAIRS(p) ((__m512bh)_mm512_loadu_si512((const void *)(p)))
/* a pair of bf16 as one word (in place in A, at any even or odd element) */
typedef int32_t coil_gemm_pair __attribute__((may_alias, aligned(2)));
#define COIL_GEMM_FMA_PAIRS(acc, ap, b) \
    _mm512_dpbf16_ps((acc), (__m512bh)_mm512_set1_epi32(*(const coil_gemm_pair *)(ap)), (b))
COIL_GEMM_MICRO(coil_gemm_micro_pairs, COIL_GEMM_MR_BF16, COIL_GEMM_MR_BF16, COIL_GEMM_NR_BF16, uint16_t, 2, 0,
                __m512bh, COIL_GEMM_LOAD_PAIRS, COIL_GEMM_FMA_PAIRS)
COIL_GEMM_MICRO(coil_gemm_micro_pairs_direct, COIL_GEMM_MR_BF16, COIL_GEMM_MR_BF16, COIL_GEMM_NR_BF16, uint16_t, 2, 1,
                __m512bh, COIL_GEMM_LOAD_PAIRS, COIL_GEMM_FMA_PAIRS)
/* the f32 edge kernels' counterparts */
#if COIL_GEMM_MR_BF16 > 4
COIL_GEMM_MICRO(coil_gemm_micro_pairs_r4, 4, COIL_GEMM_MR_BF16, COIL_GEMM_NR_BF16, uint16_t, 2, 0, __m512bh,
                COIL_GEMM_LOAD_PAIRS, COIL_GEMM_FMA_PAIRS)
#endif
#if COIL_GEMM_MR_BF16 > 8
COIL_GEMM_MICRO(coil_gemm_micro_pairs_r8, 8, COIL_GEMM_MR_BF16, COIL_GEMM_NR_BF16, uint16_t, 2, 0, __m512bh,
                COIL_GEMM_LOAD_PAIRS, COIL_GEMM_FMA_PAIRS)
#endif

/* coil_gemm_micro_f32_rows for bf16 pairs. */
static inline void coil_gemm_micro_pairs_rows(const coil_gemm_compute_args *c, const uint16_t *a, const uint16_t *b,
                                              int64_t steps, int64_t row, int64_t rows, int64_t col, int first,
                                              int last)
{
#if COIL_GEMM_MR_BF16 > 4
    if (rows <= 4) {
        coil_gemm_micro_pairs_r4(c, a, 0, b, steps, row, col, first, last);
        return;
    }
#endif
#if COIL_GEMM_MR_BF16 > 8
    if (rows <= 8) {
        coil_gemm_micro_pairs_r8(c, a, 0, b, steps, row, col, first, last);
        return;
    }
#endif
    (void)rows;
    coil_gemm_micro_pairs(c, a, 0, b, steps, row, col, first, last);
}
#endif

/* ---- AMX (Sapphire Rapids and later): the BF16_AMX layout's tiles ----

   A panel's 16 rows of 32 contiguous bf16 (an A read in place, or packed so by
   coil_gemm_pack_amx_a) are an A tile as they lie, and a packed B panel's 16 pairs of k by 16
   columns (two side by side, rows NR words apart) a B tile, so `tdpbf16ps` multiplies them
   without repacking. A 16 x 32 output tile accumulates in two f32 tiles: the same f32 sums of
   bf16 products as vdpbf16ps (denormal inputs read as zeros alike; only the order of the
   additions differs), stored to acc between blocks of k, else through coil_gemm_amx_finish.
   Two A panels pass each B panel together where the block's k is whole steps of 32 (2 x 2
   tiles: each B tile loaded once for both). The tile data are the calling thread's from its
   first configuration to the _tile_release at the end of coil_gemm_compute_amx. */
#if defined(COIL_GEMM_HAVE_AMX)
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) coil_gemm_tilecfg;

/* Loads the tile configuration for blocks of k whose last step has `rem` pairs of k. rem = 0:
   sums 0-3, A 4-5, B 6-7 (coil_gemm_micro_amx2's 2 x 2 tiles; coil_gemm_micro_amx uses 0, 1,
   4, 6, 7). Else coil_gemm_micro_amx's: those, and the last step's A in 2 and B in 3 and 5.
   (Loading a configuration zeroes the tiles: it happens between micro-kernels only.) */
static void coil_gemm_amx_config(int64_t rem)
{
    coil_gemm_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    if (rem > 0) {
        cfg.colsb[2] = (uint16_t)(4 * rem);
        cfg.rows[3] = cfg.rows[5] = (uint8_t)rem;
    }
    /* not _tile_loadconfig: GCC 12's tells the compiler that it reads only the first 8 bytes,
       and the stores of the rows and columns were dropped as dead (the tiles then fault) */
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
}

/* The end of a 16 x 32 output tile after the last block of k, from its sums (rows NR floats
   apart, changed in place): the bias, the activation, one rounding to the output type, stored
   (transposed when the output is). */
static void coil_gemm_amx_finish(const coil_gemm_compute_args *c, float *sums, int64_t row, int64_t col)
{
    enum { MR = COIL_GEMM_MR_AMX, NR = COIL_GEMM_NR_AMX };
    const int64_t mv = c->m - row < MR ? c->m - row : MR, nv = c->n - col < NR ? c->n - col : NR;
    if (!c->transposed && c->act == COIL_GEMM_ACT_NONE) {
        /* the common end (a linear layer's): bias added as the rows are stored */
        const __m512 b0 = c->bias ? coil_gemm_vload_n(c->bias + col, nv) : _mm512_setzero_ps();
        const __m512 b1 = c->bias ? coil_gemm_vload_n(c->bias + col + 16, nv - 16) : _mm512_setzero_ps();
        for (int64_t r = 0; r < mv; r++) {
            coil_gemm_store_out(c, _mm512_add_ps(_mm512_load_ps(sums + r * NR), b0), (row + r) * c->ldo + col, nv);
            coil_gemm_store_out(c, _mm512_add_ps(_mm512_load_ps(sums + r * NR + 16), b1), (row + r) * c->ldo + col + 16,
                                nv - 16);
        }
        return;
    }
    if (c->bias && c->transposed) {
        for (int r = 0; r < MR; r++) {
            const __m512 bias = _mm512_set1_ps(row + r < c->m ? c->bias[row + r] : 0.0f);
            for (int v = 0; v < NR / 16; v++)
                _mm512_store_ps(sums + r * NR + 16 * v, _mm512_add_ps(_mm512_load_ps(sums + r * NR + 16 * v), bias));
        }
    } else if (c->bias) {
        const __m512 b0 = coil_gemm_vload_n(c->bias + col, nv), b1 = coil_gemm_vload_n(c->bias + col + 16, nv - 16);
        for (int r = 0; r < MR; r++) {
            _mm512_store_ps(sums + r * NR, _mm512_add_ps(_mm512_load_ps(sums + r * NR), b0));
            _mm512_store_ps(sums + r * NR + 16, _mm512_add_ps(_mm512_load_ps(sums + r * NR + 16), b1));
        }
    }
    if (c->act == COIL_GEMM_ACT_GELU_TANH) coil_gemm_gelu_tile(sums, MR * NR);
    if (c->transposed) {
        /* each 16 columns transposed: 16 rows of out, mv elements each */
        for (int v = 0; v < NR / 16; v++) {
            __m512i w[16];
            for (int r = 0; r < 16; r++) w[r] = _mm512_castps_si512(_mm512_load_ps(sums + r * NR + 16 * v));
            coil_gemm_transpose(w);
            for (int64_t q = 0; q < 16 && 16 * v + q < nv; q++)
                coil_gemm_store_out(c, _mm512_castsi512_ps(w[q]), (col + 16 * v + q) * c->ldo + row, mv);
        }
        return;
    }
    for (int64_t r = 0; r < mv; r++)
        for (int v = 0; v < NR / 16; v++)
            coil_gemm_store_out(c, _mm512_load_ps(sums + r * NR + 16 * v), (row + r) * c->ldo + col + 16 * v, nv - 16 * v);
}

/* A 16 x 32 output tile: A's 16 rows at `a` (`lda` elements apart, k contiguous) by a packed
   B panel, over `steps` pairs of k; the configuration loaded is coil_gemm_amx_config(steps %
   16). A first block of k starts from zero, a later one from acc; a last block ends in the
   output, an earlier one in acc. */
static void coil_gemm_micro_amx(const coil_gemm_compute_args *c, const uint16_t *a, int64_t lda, const uint16_t *b,
                                int64_t steps, int64_t row, int64_t col, int first, int last)
{
    enum { MR = COIL_GEMM_MR_AMX, NR = COIL_GEMM_NR_AMX };
    float *acc = c->acc ? c->acc + row * c->ldacc + col : 0;
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
    } else {
        _tile_loadd(0, acc, c->ldacc * 4);
        _tile_loadd(1, acc + 16, c->ldacc * 4);
    }
    const int64_t full = steps / 16, rem = steps % 16;
    for (int64_t s = 0; s < full; s++) {
        const uint16_t *bs = b + s * 16 * NR * 2;
        _tile_loadd(4, a + s * 32, lda * 2);
        _tile_loadd(6, bs, NR * 4);
        _tile_loadd(7, bs + 32, NR * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
    }
    if (rem) {
        const uint16_t *bs = b + full * 16 * NR * 2;
        _tile_loadd(2, a + full * 32, lda * 2);
        _tile_loadd(3, bs, NR * 4);
        _tile_loadd(5, bs + 32, NR * 4);
        _tile_dpbf16ps(0, 2, 3);
        _tile_dpbf16ps(1, 2, 5);
    }
    if (!last) {
        _tile_stored(0, acc, c->ldacc * 4);
        _tile_stored(1, acc + 16, c->ldacc * 4);
        return;
    }
    float sums[MR * NR] __attribute__((aligned(64)));
    _tile_stored(0, sums, NR * 4);
    _tile_stored(1, sums + 16, NR * 4);
    coil_gemm_amx_finish(c, sums, row, col);
}

/* The source of the next B block the tiles pack, brought into L2 while the current one's tiles
   run (the packing then reads L2, not L3 or memory): `count` runs of `bytes` contiguous bytes,
   `stride` bytes apart from `base`; `at` and `off` the next line's run and offset, `per_step`
   lines asked for per step of k. */
#define COIL_GEMM_AMX_AHEAD_BYTES (1 << 20)
typedef struct {
    const char *base;
    int64_t stride, count, bytes;
    int64_t at, off, per_step;
} coil_gemm_amx_ahead;

static inline void coil_gemm_amx_prefetch(coil_gemm_amx_ahead *p)
{
    for (int64_t q = 0; q < p->per_step && p->at < p->count; q++) {
        _mm_prefetch(p->base + p->at * p->stride + p->off, _MM_HINT_T1);
        p->off += 64;
        if (p->off >= p->bytes) {
            p->off = 0;
            p->at++;
        }
    }
}

/* Two 16 x 32 output tiles, A's rows at `a0` and `a1` (`lda0`, `lda1` elements apart; output
   rows `row` and `row` + 16), by one B panel (each B tile read once for both), over `steps`
   pairs of k, a multiple of 16 (configuration rem = 0). */
static void coil_gemm_micro_amx2(const coil_gemm_compute_args *c, const uint16_t *a0, int64_t lda0,
                                 const uint16_t *a1, int64_t lda1, const uint16_t *b, int64_t steps, int64_t row,
                                 int64_t col, int first, int last, coil_gemm_amx_ahead *ahead)
{
    enum { MR = COIL_GEMM_MR_AMX, NR = COIL_GEMM_NR_AMX };
    float *acc0 = c->acc ? c->acc + row * c->ldacc + col : 0, *acc1 = c->acc ? acc0 + MR * c->ldacc : 0;
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, acc0, c->ldacc * 4);
        _tile_loadd(1, acc0 + 16, c->ldacc * 4);
        _tile_loadd(2, acc1, c->ldacc * 4);
        _tile_loadd(3, acc1 + 16, c->ldacc * 4);
    }
    for (int64_t s = 0; s < steps / 16; s++) {
        const uint16_t *bs = b + s * 16 * NR * 2;
        coil_gemm_amx_prefetch(ahead);
        _tile_loadd(4, a0 + s * 32, lda0 * 2);
        _tile_loadd(6, bs, NR * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, bs + 32, NR * 4);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + s * 32, lda1 * 2);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    if (!last) {
        _tile_stored(0, acc0, c->ldacc * 4);
        _tile_stored(1, acc0 + 16, c->ldacc * 4);
        _tile_stored(2, acc1, c->ldacc * 4);
        _tile_stored(3, acc1 + 16, c->ldacc * 4);
        return;
    }
    float sums[2][MR * NR] __attribute__((aligned(64)));
    _tile_stored(0, sums[0], NR * 4);
    _tile_stored(1, sums[0] + 16, NR * 4);
    _tile_stored(2, sums[1], NR * 4);
    _tile_stored(3, sums[1] + 16, NR * 4);
    coil_gemm_amx_finish(c, sums[0], row, col);
    coil_gemm_amx_finish(c, sums[1], row + MR, col);
}

/* coil_gemm_compute in the BF16_AMX layout: the same blocks and order as the other layouts,
   A panels as rows (in place, or packed from pa), two at a time where the block's k is whole
   steps of 32. */
static void coil_gemm_compute_amx(const coil_gemm_compute_args *c, int64_t *status)
{
    enum { MR = COIL_GEMM_MR_AMX, NR = COIL_GEMM_NR_AMX };
    const int64_t kp = (c->k + 1) / 2 * 2;
    /* the configuration loaded (its rem), -1 none */
    int64_t loaded = -1;
    for (int64_t jb = c->j0; jb < c->j1; jb += c->nc) {
        const int64_t je = jb + c->nc < c->j1 ? jb + c->nc : c->j1;
        /* one block when k is 0: the tiles are the bias */
        for (int64_t k0 = 0; k0 < kp || k0 == 0; k0 += c->kc) {
            const int64_t kb = kp - k0 < c->kc ? kp - k0 : c->kc;
            const int first = k0 == 0, last = k0 + c->kc >= kp;
            const int64_t k_in = c->k - k0 < kb ? c->k - k0 : kb, rem = (kb / 2) % 16;
            coil_gemm_pack_args pack = {(const char *)c->b + k0 * c->b_ks * 2, c->b_ns, c->b_ks, c->n, k_in,
                                        COIL_GEMM_DT_BF16, c->layout, NR, jb, je, c->bws, 1};
            if (kb > 0 && !c->pb) {
                char *pack_args[1] = {(char *)&pack};
                coil_gemm_pack(pack_args, status);
                /* GCC's tile loads name no memory: the panels are stored before them */
                __asm__ volatile("" ::: "memory");
            }
            if (loaded != rem) {
                loaded = rem;
                coil_gemm_amx_config(rem);
            }
            /* the next block of this task (k on, else the next B panels), prefetched into L2 as
               the 2 x 2 tiles run (their steps spread its lines evenly) where it and this block
               take half the L2 at most: at 410 x 896 x 3648 (344 KB blocks) one core ran 4%
               faster, at 410 x 3648 x 896 (933 KB blocks, A from L3) 5% slower */
            coil_gemm_amx_ahead ahead = {0, 0, 0, 0, 0, 0, 0};
            const int64_t nk0 = k0 + c->kc < kp ? k0 + c->kc : 0, njb = nk0 ? jb : je;
            if (!c->pb && kp > 0 && njb < c->j1 && rem == 0) {
                const int64_t nje = njb + c->nc < c->j1 ? njb + c->nc : c->j1;
                const int64_t cols = (nje * NR < c->n ? nje * NR : c->n) - njb * NR;
                const int64_t nkb = kp - nk0 < c->kc ? kp - nk0 : c->kc, nk_in = c->k - nk0 < nkb ? c->k - nk0 : nkb;
                ahead.base = (const char *)c->b + (njb * NR * c->b_ns + nk0 * c->b_ks) * 2;
                if (c->b_ks == 1) {
                    ahead.count = cols;
                    ahead.bytes = nk_in * 2;
                    ahead.stride = c->b_ns * 2;
                } else if (c->b_ns == 1) {
                    ahead.count = nk_in;
                    ahead.bytes = cols * 2;
                    ahead.stride = c->b_ks * 2;
                }
                const int64_t lines = ahead.count * ((ahead.bytes + 63) / 64);
                if (lines * 64 + (je - jb) * NR * kb * 2 > COIL_GEMM_AMX_AHEAD_BYTES) ahead.count = 0;
                const int64_t steps = (c->i1 - c->i0) / 2 * (je - jb) * (kb / 32);
                ahead.per_step = steps > 0 ? (lines + steps - 1) / steps : 0;
            }
            for (int64_t ib = c->i0; ib < c->i1; ib += c->mc) {
                const int64_t ie = ib + c->mc < c->i1 ? ib + c->mc : c->i1;
                for (int64_t j = jb; j < je; j++) {
                    const uint16_t *b = c->pb ? (const uint16_t *)c->pb + j * NR * kp + k0 * NR
                                              : (const uint16_t *)c->bws + (j - jb) * NR * kb;
                    for (int64_t i = ib; i < ie; i++) {
                        /* whole panels of an A read in place; others packed, rows kp apart */
                        const int direct = c->a && (i + 1) * MR <= c->m;
                        const uint16_t *a = direct ? (const uint16_t *)c->a + i * MR * c->a_rs + k0
                                                   : (const uint16_t *)c->pa + (i - c->pa_first) * MR * kp + k0;
                        const int64_t lda = direct ? c->a_rs : kp;
                        if (rem == 0 && i + 1 < ie) {
                            const int direct1 = c->a && (i + 2) * MR <= c->m;
                            const uint16_t *a1 = direct1
                                                     ? (const uint16_t *)c->a + (i + 1) * MR * c->a_rs + k0
                                                     : (const uint16_t *)c->pa + (i + 1 - c->pa_first) * MR * kp + k0;
                            coil_gemm_micro_amx2(c, a, lda, a1, direct1 ? c->a_rs : kp, b, kb / 2, i * MR, j * NR,
                                                 first, last, &ahead);
                            i++;
                            continue;
                        }
                        coil_gemm_micro_amx(c, a, lda, b, kb / 2, i * MR, j * NR, first, last);
                    }
                }
            }
        }
    }
    /* the thread's tiles back to their initial state (no tile data for the OS to save) */
    if (loaded >= 0) _tile_release();
}
#endif

/* The tiles [i0, i1) x [j0, j1): for each block of nc B panels and each block of kc, the B
   block is packed into bws (or taken from pb, packed before); blocks of mc A panels then pass
   it, each A panel meeting every B panel of the block while both stay in L2. */
void coil_gemm_compute(char *const *args, int64_t *status)
{
    const coil_gemm_compute_args *c = (const coil_gemm_compute_args *)args[0];
    (void)status;
    if (!coil_gemm_serves(c->layout)) return;
#if defined(COIL_GEMM_HAVE_AMX)
    if (c->layout == COIL_GEMM_LAYOUT_BF16_AMX) {
        coil_gemm_compute_amx(c, status);
        return;
    }
#endif
#if defined(COIL_GEMM_HAVE_WORDS)
    const int pairs = c->layout == COIL_GEMM_LAYOUT_BF16_PAIRS;
    const int64_t group = pairs ? 2 : 1, kp = (c->k + group - 1) / group * group;
#if defined(COIL_GEMM_HAVE_BF16)
    const int64_t mr = pairs ? COIL_GEMM_MR_BF16 : COIL_GEMM_MR_WORDS;
    const int64_t nr = pairs ? COIL_GEMM_NR_BF16 : COIL_GEMM_NR_WORDS;
#else
    const int64_t mr = COIL_GEMM_MR_WORDS, nr = COIL_GEMM_NR_WORDS;
#endif
    const int64_t b_size = c->b_dtype == COIL_GEMM_DT_F32 ? 4 : 2;
    for (int64_t jb = c->j0; jb < c->j1; jb += c->nc) {
        const int64_t je = jb + c->nc < c->j1 ? jb + c->nc : c->j1;
        /* one block when k is 0: the tiles are the bias */
        for (int64_t k0 = 0; k0 < kp || k0 == 0; k0 += c->kc) {
            const int64_t kb = kp - k0 < c->kc ? kp - k0 : c->kc;
            const int first = k0 == 0, last = k0 + c->kc >= kp;
            const int64_t k_in = c->k - k0 < kb ? c->k - k0 : kb;
            coil_gemm_pack_args pack = {(const char *)c->b + k0 * c->b_ks * b_size, c->b_ns, c->b_ks, c->n, k_in,
                                        pairs ? COIL_GEMM_DT_BF16 : c->b_dtype, c->layout, nr, jb, je, c->bws, 1};
            if (kb > 0 && !c->pb) {
                char *pack_args[1] = {(char *)&pack};
                coil_gemm_pack(pack_args, status);
            }
            for (int64_t ib = c->i0; ib < c->i1; ib += c->mc)
            for (int64_t j = jb; j < je; j++) {
                for (int64_t i = ib; i < ib + c->mc && i < c->i1; i++) {
                    /* whole panels of an A read in place; a last part panel was packed */
                    const int direct = c->a && (i + 1) * mr <= c->m;
#if defined(COIL_GEMM_HAVE_BF16)
                    if (pairs) {
                        if (direct) {
                            const uint16_t *a = (const uint16_t *)c->a + i * mr * c->a_rs + k0;
                            const uint16_t *b = c->pb ? (const uint16_t *)c->pb + j * nr * kp + k0 * nr
                                                      : (const uint16_t *)c->bws + (j - jb) * nr * kb;
                            coil_gemm_micro_pairs_direct(c, a, c->a_rs, b, kb / 2, i * mr, j * nr, first, last);
                            continue;
                        }
                        const uint16_t *a = (const uint16_t *)c->pa + (i - c->pa_first) * mr * kp + k0 * mr;
                        const uint16_t *b = c->pb ? (const uint16_t *)c->pb + j * nr * kp + k0 * nr
                                                  : (const uint16_t *)c->bws + (j - jb) * nr * kb;
                        coil_gemm_micro_pairs_rows(c, a, b, kb / 2, i * mr, c->m - i * mr, j * nr, first, last);
                        continue;
                    }
#endif
                    const float *b = c->pb ? (const float *)c->pb + j * nr * kp + k0 * nr
                                           : (const float *)c->bws + (j - jb) * nr * kb;
                    if (direct) {
                        const float *a = (const float *)c->a + i * mr * c->a_rs + k0;
                        coil_gemm_micro_f32_direct(c, a, c->a_rs, b, kb, i * mr, j * nr, first, last);
                        continue;
                    }
                    const float *a = (const float *)c->pa + (i - c->pa_first) * mr * kp + k0 * mr;
                    coil_gemm_micro_f32_rows(c, a, b, kb, i * mr, c->m - i * mr, j * nr, first, last);
                }
            }
        }
    }
#endif
}
