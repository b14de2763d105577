//! The prelude's float math: `exp`, `expm1`, `exp2`, `log`, `log2`, `log1p`, `tanh`, `sigmoid`,
//! `erf`, `erfinv`, `sin`, `cos`, `tan`, `atan`, `asin`, `acos`, `atan2`, `pow` and the tanh GELU
//! of f32 (and so of f16 and bf16, which compute in f32), as inline C functions of the
//! project's own; and `erfinv` of f64, which C lacks.
//!
//! **Why.** The C library's `expf`, `logf`, `tanhf`, ... are calls gcc and clang cannot vectorize
//! (without `-ffast-math`, whose vector variants are less accurate and whose other rewrites
//! change results the tests rely on), so a kernel using one ran one element at a time (8-30 ns
//! each). These are branch-free: range reduction, a polynomial, a scale by a power of two, and
//! the special values chosen with selects, so an `omp simd` loop calling them vectorizes on
//! AVX2, AVX-512 and NEON. They need `-fno-math-errno -fno-trapping-math` (the C compiler's
//! flags, `coil_runtime::cpu::compiler`), which change no value: `errno` is never read and no
//! code installs floating-point traps; without them gcc may not turn the selects into blends.
//!
//! **Accuracy** (in ulps of the exact result, every f32 input checked against the C library's
//! f64 function on the x86-64 build machine, with and without fused multiply-add; the test
//! `vecmath_tests` checks sweeps and the special values on every run):
//!
//! | function | max error | | function | max error |
//! |---|---|---|---|---|
//! | exp | 0.97 | | tanh | 2.42 |
//! | expm1 | 1.35 | | sigmoid | 2.18 |
//! | exp2 | 0.97 | | erf | 1.15 |
//! | log | 0.82 | | sin, cos, tan | 0.50 |
//! | log2 | 1.62 | | pow | 0.50 (sweeps) |
//! | log1p | 1.44 | | atan, asin, acos | 0.50 |
//! | erfinv | 0.50 | | atan2 | 0.50 (sweeps) |
//!
//! The reference interpreter computes these in f64 and rounds once (at most 0.5 ulp); the
//! golden and differential tests allow far more (1e-5 relative for f32). Special values follow
//! C99 Annex F: NaN in, NaN out; `exp(-inf) = 0`, `exp(inf) = inf` and overflow to `inf` at the
//! same threshold as `expf`; `log(0) = -inf`, `log(x < 0) = NaN`; `tanh(±inf) = ±1`;
//! `erf(±inf) = ±1`; `sin`, `cos`, `tan` of infinities are NaN; `pow` takes every case of C's
//! `pow` (`pow(x, ±0) = 1` even for NaN, `pow(-8, 1/3)` NaN, signed zeros and infinities by the
//! parity of an integer exponent, ...); `atan2` takes every case of C's (signed zeros,
//! infinities: `atan2(±0, -0) = ±pi`, `atan2(±inf, -inf) = ±3pi/4`, ...); `asin`, `acos` and
//! `erfinv` are NaN beyond `[-1, 1]`, `erfinv(±1) = ±inf`; signed zeros and subnormals pass
//! through where C keeps them (`expm1`, `log1p`, `tanh`, `erf`, `erfinv`, `sin`, `tan`, `atan`,
//! `asin` of `-0.0` are `-0.0`). `erfinv` has no C reference: the f32 one is checked against
//! the f64 one, which is checked against 50-digit values.
//!
//! **How.** `exp`: `x = n ln2 + r`, `|r| <= ln2/2`, in two steps (Cody and Waite: `ln2` split so
//! that `n ln2_hi` is exact); `e^r - 1` by a degree-7 polynomial (its own error 5.5e-10
//! relative); `2^n` applied as two exact factors so that results down to the subnormals round
//! once. `exp` of `x <= 0` (softmax terms, `erf`'s tail) has a cheaper form of the same values
//! (`coil_exp_nonpositive_f32`: 0 below -87, one factor `2^n` whose exponent bits are shifted out
//! of the rounded `k`, no float-to-integer conversion, NaN carried by the arithmetic). `expm1`
//! reuses the reduction as `2^n (q + 1 - 2^-n)`. `log`: `x = 2^e (1 + f)` with `1 + f` in
//! `[sqrt(1/2), sqrt(2))`, `log(1 + f) = f - f^2/2 + f^3 P(f)` (degree 10, 6e-9), `e ln2` added
//! in two parts. `log1p(x) = log(1 + x)` plus the rounding error of `1 + x` divided by it.
//! `tanh(x) = t / (t + 2)` with `t = expm1(2|x|)` (that expm1 specialised to
//! `2|x|` in `[0, 18.2]`: one scale factor, no selects; `|x|` clamped at 9.1, where f32's
//! tanh is 1). `sigmoid` divides `1` or `e^-|x|` by
//! `1 + e^-|x|` (so it reaches the subnormals on the left, as the f64 formula does). `erf`:
//! `x + x P(x^2)` below 1 (degree 13, 1.4e-9 relative), `1 - exp(S(|x|) - x^2)` from 1 to 4
//! (`S` of degree 7 in `|x| - 2.5`, 2.5e-11 absolute error of `erf`), `±1` beyond.
//! `sin`, `cos`, `tan`: the argument reduced modulo `pi/2` exactly in 64-bit integers (`|x| =
//! m 2^e` times 96 bits of `2/pi` from the table row of its exponent: Payne and Hanek, for
//! every input), then Taylor polynomials of `sin` and `cos` in f64 and one rounding. `pow`:
//! `2^(y log2|x|)` in f64 (both to about 1e-15), one rounding, and the sign and special cases
//! by selects. `atan`: in f64, Cephes' reduction to `|t| <= tan(pi/8)` by one division, then
//! Taylor's series to `t^25`, one rounding; `asin x = atan(x / sqrt((1 - x)(1 + x)))`, `acos x
//! = 2 atan(sqrt((1 - x) / (1 + x)))` (no cancellation near ±1), `atan2` by the octant of
//! `(x, y)` around `atan(min / max)`. `erfinv`: [`coil_ir::special`]'s polynomials in `w =
//! -log((1 - x)(1 + x))` evaluated in f64 (the logarithm by the `pow` helper's), one rounding;
//! the f64 one starts there and takes two Newton steps on the C library's `erf` (`erfc` for
//! `|x| > 0.5`), one call per element. The polynomial coefficients of `exp` to `erf` were
//! fitted (weighted least squares, Lawson's iteration to the minimax) with each coefficient
//! rounded to f32 before the next ones were refitted.
//!
//! **Speed** (ns per f32 element, one core of the AMD EPYC build machine, an `omp simd` loop over
//! 4M elements, best of 7, the runtime's flags; `bench/tools/vecmath_speed.c`): `atan` 0.69
//! (the C library's `atanf` 15.9), `asin` 0.99 (11.2), `acos` 1.97 (11.6), `atan2` 2.21 (32.8),
//! `erfinv` 3.51 (the f64 one, a call per element, 104); `tan` 2.18 for scale.
//!
//! f64 keeps the C library (`erfinv` aside, which it lacks): its results must agree with the interpreter to 1e-10, f64 math is
//! rare in the workloads coil serves, and `double` lanes would halve the gain.

/// Bits of `2/pi` after the binary point, most significant first (288 of them; the reduction
/// needs 95 bits past the `2^(e-1)` position for the largest exponent `e = 105`).
const TWO_OVER_PI: [u32; 9] =
    [0xA2F9836E, 0x4E441529, 0xFC2757D1, 0xF534DDC0, 0xDB629599, 0x3C439041, 0xFE5163AB, 0xDEBBC561, 0xB7246E3A];

/// Bit `i` of `2/pi` (weight `2^-i`; 0 for `i <= 0`).
fn two_over_pi_bit(i: i64) -> u32 {
    if i < 1 {
        return 0;
    }
    let k = (i - 1) as usize;
    (TWO_OVER_PI[k / 32] >> (31 - k % 32)) & 1
}

/// `coil_2opi_bits[E]` for every biased f32 exponent `E` (the row index is `bits >> 23`, so the
/// table needs no bounds check and gcc loads it unconditionally): the 96 bits of `2/pi` whose
/// weights, times `2^e` with `e = E - 150` (`|x| = m 2^e`, `m` the 24-bit significand), run
/// from `2^1` down to `2^-94`. Bits of weight `2^2` and up only add multiples of 4 quarter turns.
fn two_over_pi_table() -> String {
    let mut s = String::from("static const uint32_t coil_2opi_bits[256][3] = {\n");
    for biased in 0..256i64 {
        let e = biased - 150;
        let word = |j: i64| (0..32).fold(0u32, |w, k| (w << 1) | two_over_pi_bit(e - 1 + 32 * j + k));
        s += &format!("    {{0x{:08x}u, 0x{:08x}u, 0x{:08x}u}},\n", word(0), word(1), word(2));
    }
    s + "};\n"
}

const FUNCTIONS: &str = r#"
/* ---- f32 math that vectorizes (see coil_codegen::c::vecmath for the error bounds) ---------- */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define COIL_FMAF(a, b, c) fmaf(a, b, c)
#define COIL_FMA(a, b, c) fma(a, b, c)
#else
#define COIL_FMAF(a, b, c) ((a) * (b) + (c))
#define COIL_FMA(a, b, c) ((a) * (b) + (c))
#endif
static inline double coil_bits_f64(uint64_t u) { double f; memcpy(&f, &u, 8); return f; }
static inline uint64_t coil_f64_bits(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }
/* v 2^n for n in [-252, 254]: two exact power-of-two factors, so the result rounds once. */
static inline float coil_scale_f32(float v, int32_t n) {
    int32_t n1 = n >> 1, n2 = n - n1;
    return v * coil_bits_f32((uint32_t)(n1 + 127) << 23) * coil_bits_f32((uint32_t)(n2 + 127) << 23);
}
/* e^r - 1 for |r| <= 0.36 */
static inline float coil_expm1_poly_f32(float r) {
    float p = 0x1.9ec73p-13f;
    p = COIL_FMAF(p, r, 0x1.6d51f6p-10f);
    p = COIL_FMAF(p, r, 0x1.1112bcp-7f);
    p = COIL_FMAF(p, r, 0x1.5554e8p-5f);
    p = COIL_FMAF(p, r, 0x1.555554p-3f);
    p = COIL_FMAF(p, r, 0.5f);
    return COIL_FMAF(r * r, p, r);
}
/* Adding it to x / ln2 (|x / ln2| < 2^22) rounds the sum to an integer, which then lies in its
   low mantissa bits (1.5 2^23: ulp 1); the 127 puts n + 127 there, the exponent field of 2^n
   (coil_exp_nonpositive_f32 and coil_tanh_f32 shift those bits into place). */
#define COIL_EXP_SHIFT (0x1.8p23f + 127.0f)
/* r = x - n ln2 with *n the nearest integer to x / ln2 (x already clamped to [-152, 152]) */
static inline float coil_exp_reduce_f32(float x, int32_t *n) {
    float k = COIL_FMAF(x, 0x1.715476p+0f, COIL_EXP_SHIFT) - COIL_EXP_SHIFT;
    *n = (int32_t)k;
    float r = COIL_FMAF(k, -0x1.62e4p-1f, x); /* exact: ln2's high part has few bits */
    return COIL_FMAF(k, -0x1.7f7d1cp-20f, r);
}
static inline float coil_exp_f32(float x) {
    float c = x > -104.0f ? x : -104.0f; /* below: 0; above 89: inf (NaN restored below) */
    c = c < 89.0f ? c : 89.0f;
    int32_t n;
    float r = coil_exp_reduce_f32(c, &n);
    float y = coil_scale_f32(1.0f + coil_expm1_poly_f32(r), n);
    return x != x ? x : y;
}
/* e^x for x <= 0, the terms of a softmax's sum (exp(x - max x)), NaN included: coil_exp_f32's
   value bit for bit for x in [-87, 88] (results from 1.6e-38, f32's normal range; within 0.98
   ulp, every f32 of [-87, 0] checked), 0 below, where coil_exp_f32 gives subnormals. Cheaper
   than coil_exp_f32 in each step, for the logsumexp over bf16 rows, which is bound by this
   computation (twice as fast as session 15's form, one thread, 410 rows of 50304):
   - 2^n is one exact factor, its bits shifted out of the rounded k (COIL_EXP_SHIFT): no float
     to integer conversion, none of NaN either;
   - the clamp lets NaN through (the arithmetic carries it), so there is no NaN select.
   A sum that includes exp(0) = 1 cannot see the terms dropped, and a probability below 2^-126
   is 0 in any normal-range comparison. coil_erf_f32 takes it for its exp(S - x^2), whose
   argument lies in [-18, 1]: the same values, fewer instructions. */
static inline float coil_exp_nonpositive_f32(float x) {
    float c = x < -87.0f ? -87.0f : x; /* NaN passes */
    float kshift = COIL_FMAF(c, 0x1.715476p+0f, COIL_EXP_SHIFT);
    float k = kshift - COIL_EXP_SHIFT; /* the nearest integer n to c / ln2, as coil_exp_f32's */
    float r = COIL_FMAF(k, -0x1.62e4p-1f, c); /* exact */
    r = COIL_FMAF(k, -0x1.7f7d1cp-20f, r);
    float scale = coil_bits_f32(coil_f32_bits(kshift) << 23);
    float y = (1.0f + coil_expm1_poly_f32(r)) * scale;
    return x < -87.0f ? 0.0f : y;
}
static inline float coil_expm1_f32(float x) {
    float c = x > -25.0f ? x : -25.0f; /* below: -1 */
    c = c < 89.0f ? c : 89.0f;
    int32_t n;
    float q = coil_expm1_poly_f32(coil_exp_reduce_f32(c, &n));
    int32_t m = n < 30 ? n : 30; /* 1 - 2^-n is 1 from n = 25 on */
    float y = coil_scale_f32(q + (1.0f - coil_bits_f32((uint32_t)(127 - m) << 23)), n);
    y = fabsf(x) < 0x1p-25f ? x : y; /* x itself, -0.0 and subnormals included */
    return x != x ? x : y;
}
static inline float coil_exp2_f32(float x) {
    float c = x > -152.0f ? x : -152.0f;
    c = c < 129.0f ? c : 129.0f;
    float k = (c + 0x1.8p23f) - 0x1.8p23f;
    float y = coil_scale_f32(1.0f + coil_expm1_poly_f32((c - k) * 0x1.62e43p-1f), (int32_t)k);
    return x != x ? x : y;
}
/* log(1 + f) - f for f in [sqrt(1/2) - 1, sqrt(2) - 1] */
static inline float coil_log1p_poly_f32(float f) {
    float p = -0x1.392534p-4f;
    p = COIL_FMAF(p, f, 0x1.05b362p-3f);
    p = COIL_FMAF(p, f, -0x1.0d9a78p-3f);
    p = COIL_FMAF(p, f, 0x1.22d004p-3f);
    p = COIL_FMAF(p, f, -0x1.546f36p-3f);
    p = COIL_FMAF(p, f, 0x1.99a056p-3f);
    p = COIL_FMAF(p, f, -0x1.000232p-2f);
    p = COIL_FMAF(p, f, 0x1.555554p-2f);
    p = COIL_FMAF(p, f, -0.5f);
    return f * f * p;
}
/* x = 2^e (1 + f) with 1 + f in [sqrt(1/2), sqrt(2)), for finite x > 0 (subnormals scaled up) */
static inline float coil_log_reduce_f32(float x, float *e) {
    int32_t sub = x < 0x1p-126f;
    uint32_t u = coil_f32_bits(sub ? x * 0x1p23f : x) - 0x3f3504f3u;
    *e = (float)((int32_t)u >> 23) - (sub ? 23.0f : 0.0f);
    return coil_bits_f32((u & 0x7fffffu) + 0x3f3504f3u) - 1.0f; /* exact */
}
static inline float coil_log_special_f32(float x, float y) {
    y = x == 0.0f ? -INFINITY : y;
    y = x < 0.0f ? NAN : y;
    y = x == INFINITY ? x : y;
    return x != x ? x : y;
}
static inline float coil_log_f32(float x) {
    float e;
    float f = coil_log_reduce_f32(x, &e);
    float low = COIL_FMAF(e, 0x1.7f7d1cp-20f, coil_log1p_poly_f32(f));
    return coil_log_special_f32(x, COIL_FMAF(e, 0x1.62e4p-1f, f + low));
}
static inline float coil_log2_f32(float x) {
    float e;
    float f = coil_log_reduce_f32(x, &e);
    return coil_log_special_f32(x, COIL_FMAF(f + coil_log1p_poly_f32(f), 0x1.715476p+0f, e));
}
static inline float coil_log1p_f32(float x) {
    float u = 1.0f + x;
    float c = (u > 0.0f && u < INFINITY) ? (x - (u - 1.0f)) / u : 0.0f; /* what 1 + x lost */
    float y = coil_log_f32(u) + c;
    return fabsf(x) < 0x1p-25f ? x : y;
}
/* t / (t + 2) with t = expm1(2|x|), the expm1 written out for 2|x| in [0, 18.2]: n in [0, 26],
   so 2^n is one exact factor (its bits shifted out of the rounded k, as in
   coil_exp_nonpositive_f32), t = fma(2^n, q, 2^n - 1) rounds once (2^n - 1 is exact up to
   n = 24, its rounding beyond is below t's half ulp), and no clamp below, no small-x select
   (a subnormal or tiny 2|x| comes through as itself: t / (t + 2) = |x|) and no NaN select (NaN
   flows through the arithmetic) are needed. Half the instructions of the general coil_expm1_f32
   path, the same error (2.42 ulp): the tanh GELU's cost on the CPU is mostly this. */
static inline float coil_tanh_f32(float x) {
    float a = fabsf(x);
    a = a > 9.1f ? 9.1f : a; /* NaN passes; tanh rounds to 1 in f32 from 9.011 */
    float d = a + a;
    float kshift = COIL_FMAF(d, 0x1.715476p+0f, COIL_EXP_SHIFT);
    float k = kshift - COIL_EXP_SHIFT; /* the nearest integer n to d / ln2 */
    float r = COIL_FMAF(k, -0x1.62e4p-1f, d); /* exact */
    r = COIL_FMAF(k, -0x1.7f7d1cp-20f, r);
    float scale = coil_bits_f32(coil_f32_bits(kshift) << 23); /* 2^n */
    float t = COIL_FMAF(scale, coil_expm1_poly_f32(r), scale - 1.0f);
    return copysignf(t / (t + 2.0f), x);
}
static inline float coil_sigmoid_f32(float x) {
    float e = coil_exp_f32(-fabsf(x));
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}
static inline float coil_erf_f32(float x) {
    float a = fabsf(x), x2 = x * x;
    float p = 0x1.4771fcp-14f;
    p = COIL_FMAF(p, x2, -0x1.a3515ep-11f);
    p = COIL_FMAF(p, x2, 0x1.53f224p-8f);
    p = COIL_FMAF(p, x2, -0x1.b7f71ap-6f);
    p = COIL_FMAF(p, x2, 0x1.ce2ce6p-4f);
    p = COIL_FMAF(p, x2, -0x1.81273ep-2f);
    p = COIL_FMAF(p, x2, 0x1.06eba8p-3f);
    float small = COIL_FMAF(x, p, x);
    float b = a > 4.0f ? 4.0f : a; /* erf(4) is 1 in f32 */
    float t = b - 2.5f;
    float s = -0x1.6cb79cp-16f;
    s = COIL_FMAF(s, t, 0x1.01c0fcp-14f);
    s = COIL_FMAF(s, t, -0x1.c4e58ap-12f);
    s = COIL_FMAF(s, t, 0x1.1bcb28p-9f);
    s = COIL_FMAF(s, t, -0x1.63aceap-7f);
    s = COIL_FMAF(s, t, 0x1.cba316p-5f);
    s = COIL_FMAF(s, t, -0x1.692514p-2f);
    s = COIL_FMAF(s, t, -0x1.8e8b72p+0f);
    float large = copysignf(1.0f - coil_exp_nonpositive_f32(s - b * b), x);
    return a < 1.0f ? small : large;
}
/* r = |x| - q pi/2 (|r| <= pi/4) and *q, for finite a = |x|: m 2^e (2/pi) modulo 4 in 2.62 fixed
   point from three 24 x 32-bit products (Payne and Hanek). Small a are fine here (their row
   has leading zeros) except that r loses relative precision below about 2^-12, where the
   callers take x itself. */
static inline double coil_reduce_pio2_f32(float a, int32_t *q) {
    uint32_t u = coil_f32_bits(a);
    uint32_t row = (u >> 23) & 255u;
    uint64_t m = (u & 0x7fffffu) | 0x800000u;
    uint64_t p0 = m * coil_2opi_bits[row][0], p1 = m * coil_2opi_bits[row][1], p2 = m * coil_2opi_bits[row][2];
    uint64_t f = (p0 << 32) + p1 + (p2 >> 32);
    uint64_t k = (f + (1ull << 61)) >> 62; /* nearest quarter turn (4 wraps to 0 below) */
    *q = (int32_t)k;
    return (double)(int64_t)(f - (k << 62)) * 0x1.921fb54442d18p-62; /* times pi/2 2^-62 */
}
/* sin r and cos r for |r| <= pi/4, to r^11 and r^12 (the next terms below 1e-11) */
static inline double coil_sin_poly(double r) {
    double r2 = r * r;
    double p = -1.0 / 39916800.0;
    p = COIL_FMA(p, r2, 1.0 / 362880.0);
    p = COIL_FMA(p, r2, -1.0 / 5040.0);
    p = COIL_FMA(p, r2, 1.0 / 120.0);
    p = COIL_FMA(p, r2, -1.0 / 6.0);
    return COIL_FMA(r * r2, p, r);
}
static inline double coil_cos_poly(double r) {
    double r2 = r * r;
    double p = 1.0 / 479001600.0;
    p = COIL_FMA(p, r2, -1.0 / 3628800.0);
    p = COIL_FMA(p, r2, 1.0 / 40320.0);
    p = COIL_FMA(p, r2, -1.0 / 720.0);
    p = COIL_FMA(p, r2, 1.0 / 24.0);
    p = COIL_FMA(p, r2, -0.5);
    return COIL_FMA(r2, p, 1.0);
}
static inline float coil_sin_f32(float x) {
    int32_t q;
    double r = coil_reduce_pio2_f32(fabsf(x), &q);
    double s = coil_sin_poly(r), c = coil_cos_poly(r);
    double v = (q & 1) ? c : s;
    v = (q & 2) ? -v : v;
    float y = (float)(x < 0.0f ? -v : v);
    y = fabsf(x) < 0x1p-12f ? x : y; /* sin x rounds to x */
    return x - x != 0.0f ? x - x : y; /* NaN for infinities and NaN */
}
static inline float coil_cos_f32(float x) {
    int32_t q;
    double r = coil_reduce_pio2_f32(fabsf(x), &q);
    double s = coil_sin_poly(r), c = coil_cos_poly(r);
    double v = (q & 1) ? s : c;
    float y = (float)(((q + 1) & 2) ? -v : v);
    return x - x != 0.0f ? x - x : y;
}
static inline float coil_tan_f32(float x) {
    int32_t q;
    double r = coil_reduce_pio2_f32(fabsf(x), &q);
    double s = coil_sin_poly(r), c = coil_cos_poly(r);
    double v = (q & 1) ? -c / s : s / c;
    float y = (float)(x < 0.0f ? -v : v);
    y = fabsf(x) < 0x1p-12f ? x : y;
    return x - x != 0.0f ? x - x : y;
}
/* log2 x for a finite normal double x > 0: x = 2^e m, m in [sqrt(1/2), sqrt(2)),
   log m = 2 atanh s with s = (m - 1) / (m + 1), |s| <= 0.1716, to s^17 (1e-14 relative) */
static inline double coil_log2_f64_core(double x) {
    uint64_t u = coil_f64_bits(x) - 0x3fe6a09e667f3bcdull;
    double e = (double)((int64_t)u >> 52);
    double m = coil_bits_f64((u & 0xfffffffffffffull) + 0x3fe6a09e667f3bcdull);
    double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double p = 2.0 / 17.0;
    p = COIL_FMA(p, s2, 2.0 / 15.0);
    p = COIL_FMA(p, s2, 2.0 / 13.0);
    p = COIL_FMA(p, s2, 2.0 / 11.0);
    p = COIL_FMA(p, s2, 2.0 / 9.0);
    p = COIL_FMA(p, s2, 2.0 / 7.0);
    p = COIL_FMA(p, s2, 2.0 / 5.0);
    p = COIL_FMA(p, s2, 2.0 / 3.0);
    return COIL_FMA(COIL_FMA(s * s2, p, s + s), 0x1.71547652b82fep+0, e);
}
/* 2^t for t in [-200, 200]: 2^k e^(f ln2), |f| <= 1/2, Taylor to the 12th power (6e-15) */
static inline double coil_exp2_f64_core(double t) {
    double k = (t + 0x1.8p52) - 0x1.8p52;
    double r = (t - k) * 0x1.62e42fefa39efp-1;
    double p = 1.0 / 479001600.0;
    p = COIL_FMA(p, r, 1.0 / 39916800.0);
    p = COIL_FMA(p, r, 1.0 / 3628800.0);
    p = COIL_FMA(p, r, 1.0 / 362880.0);
    p = COIL_FMA(p, r, 1.0 / 40320.0);
    p = COIL_FMA(p, r, 1.0 / 5040.0);
    p = COIL_FMA(p, r, 1.0 / 720.0);
    p = COIL_FMA(p, r, 1.0 / 120.0);
    p = COIL_FMA(p, r, 1.0 / 24.0);
    p = COIL_FMA(p, r, 1.0 / 6.0);
    p = COIL_FMA(p, r, 0.5);
    p = COIL_FMA(p, r, 1.0);
    p = COIL_FMA(p, r, 1.0);
    return p * coil_bits_f64((uint64_t)((int64_t)k + 1023) << 52);
}
/* C's powf: |x|^y in f64 and one rounding (overflow and underflow included), then the sign
   and the special cases. Conditions compare floats only, so gcc keeps them as vector masks. */
static inline float coil_pow_f32(float x, float y) {
    float ax = fabsf(x);
    double t = (double)y * coil_log2_f64_core((double)((ax > 0.0f && ax < INFINITY) ? ax : 1.0f));
    t = t >= -200.0 ? t : -200.0; /* NaN (y infinite, |x| = 1) too: fixed below */
    t = t <= 200.0 ? t : 200.0;
    float v = (float)coil_exp2_f64_core(t);
    v = ax == 0.0f ? (y < 0.0f ? INFINITY : 0.0f) : v;
    v = ax == INFINITY ? (y < 0.0f ? 0.0f : INFINITY) : v;
    /* an odd integer (from 2^24 up floats are even integers) */
    int32_t odd = (int32_t)(fabsf(y) < 0x1p24f && y == truncf(y) ? y : 0.0f) & 1;
    v = ((int32_t)(coil_f32_bits(x) >> 31) & odd) ? -v : v;
    v = (x < 0.0f && x > -INFINITY && y != truncf(y) && fabsf(y) < INFINITY) ? NAN : v;
    v = (x == -1.0f && fabsf(y) == INFINITY) ? 1.0f : v;
    v = (x != x || y != y) ? x + y : v;
    return (y == 0.0f || x == 1.0f) ? 1.0f : v;
}
/* atan a for a >= 0 (inf and NaN included) in f64: Cephes' reduction to |t| <= tan(pi/8) (t = a;
   (a - 1)/(a + 1) plus pi/4 above tan(pi/8); -1/a plus pi/2 above tan(3pi/8)), one division,
   and Taylor's series to t^25 (the next term below 5e-12 relative) */
static inline double coil_atan_f64_core(double a) {
    int mid = a > 0.41421356237309503, far = a > 2.414213562373095;
    double num = far ? -1.0 : (mid ? a - 1.0 : a);
    double den = far ? a : (mid ? a + 1.0 : 1.0);
    double base = far ? 0x1.921fb54442d18p+0 : (mid ? 0x1.921fb54442d18p-1 : 0.0);
    double t = num / den, t2 = t * t;
    double p = 1.0 / 25.0;
    p = COIL_FMA(p, t2, -1.0 / 23.0);
    p = COIL_FMA(p, t2, 1.0 / 21.0);
    p = COIL_FMA(p, t2, -1.0 / 19.0);
    p = COIL_FMA(p, t2, 1.0 / 17.0);
    p = COIL_FMA(p, t2, -1.0 / 15.0);
    p = COIL_FMA(p, t2, 1.0 / 13.0);
    p = COIL_FMA(p, t2, -1.0 / 11.0);
    p = COIL_FMA(p, t2, 1.0 / 9.0);
    p = COIL_FMA(p, t2, -1.0 / 7.0);
    p = COIL_FMA(p, t2, 1.0 / 5.0);
    p = COIL_FMA(p, t2, -1.0 / 3.0);
    return base + COIL_FMA(t * t2, p, t);
}
static inline float coil_atan_f32(float x) {
    double d = (double)x;
    return (float)copysign(coil_atan_f64_core(fabs(d)), d);
}
/* asin x = atan(x / sqrt(1 - x^2)): |x| = 1 divides by zero (atan(inf) = pi/2), |x| > 1 takes
   the square root of a negative number (NaN) */
static inline float coil_asin_f32(float x) {
    double d = (double)x;
    double s = sqrt((1.0 - d) * (1.0 + d));
    return (float)copysign(coil_atan_f64_core(fabs(d) / s), d);
}
/* acos x = 2 atan(sqrt((1 - x) / (1 + x))): no cancellation near 1; x = -1 gives 2 atan(inf) */
static inline float coil_acos_f32(float x) {
    double d = (double)x;
    return (float)(2.0 * coil_atan_f64_core(sqrt((1.0 - d) / (1.0 + d))));
}
/* C's atan2f: atan of min(|y|, |x|) / max(|y|, |x|) (0 for two zeros, 1 for two infinities),
   then the octant: pi/2 - r where |y| > |x|, pi - r where x has its sign bit set (-0.0 too),
   the sign of y */
static inline float coil_atan2_f32(float y, float x) {
    double ay = fabs((double)y), ax = fabs((double)x);
    double hi = ay > ax ? ay : ax, lo = ay > ax ? ax : ay;
    double q = hi == lo ? (hi == 0.0 ? 0.0 : 1.0) : lo / hi;
    double r = coil_atan_f64_core(q);
    r = ay > ax ? 0x1.921fb54442d18p+0 - r : r;
    r = copysignf(1.0f, x) < 0.0f ? 0x1.921fb54442d18p+1 - r : r;
    float v = (float)copysign(r, (double)y);
    return (x != x || y != y) ? x + y : v;
}
/* GELU, tanh approximation, in the operation order of coil_ir::loops::Activation::apply_f32 */
static inline float coil_gelu_tanh_f32(float x) {
    float cubic = x * x * x * 0.044715f;
    float scaled = (x + cubic) * 0.7978846f;
    return (x * 0.5f) * (coil_tanh_f32(scaled) + 1.0f);
}
/* Its derivative, in the operation order of coil_ir::loops::Activation::grad_f32 */
static inline float coil_gelu_tanh_grad_f32(float x) {
    float t = coil_tanh_f32((x + x * x * x * 0.044715f) * 0.7978846f);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978846f * (1.0f + 3.0f * 0.044715f * x * x);
}
"#;

/// `static inline double NAME(double t)`: the polynomial `coeffs` (constant term first) in `t`
/// by Horner's rule, as [`coil_ir::special::horner`] evaluates it.
fn polynomial(name: &str, coeffs: &[f64]) -> String {
    let mut s = format!("static inline double {name}(double t) {{\n    double p = {:?};\n", coeffs[coeffs.len() - 1]);
    for c in coeffs[..coeffs.len() - 1].iter().rev() {
        s += &format!("    p = COIL_FMA(p, t, {c:?});\n");
    }
    s + "    return p;\n}\n"
}

/// `erfinv` of f32 (vectorizable: [`coil_ir::special`]'s polynomials in f64, one rounding) and
/// of f64 (a call per element: the same start and two Newton steps on the C library's `erf` and
/// `erfc`, as the interpreter's).
fn erfinv() -> String {
    use coil_ir::special::*;
    let mut s = polynomial("coil_erfinv_central", &ERFINV_CENTRAL);
    s += &polynomial("coil_erfinv_tail", &ERFINV_TAIL);
    s += &format!(
        "/* the shared approximation x P(w), w = -log((1 - x)(1 + x)), for finite |x| < 1 */
static inline double coil_erfinv_approx(double x, double w) {{
    double c = coil_erfinv_central(w - {ERFINV_CENTRAL_MID:?});
    double t = coil_erfinv_tail(sqrt(w) - {ERFINV_TAIL_MID:?});
    return x * (w < {ERFINV_SPLIT:?} ? c : t);
}}
static inline float coil_erfinv_f32(float x) {{
    double d = (double)x, m = (1.0 - d) * (1.0 + d);
    double w = -0x1.62e42fefa39efp-1 * coil_log2_f64_core(m > 0.0 ? m : 1.0); /* NaN: 1 */
    float y = (float)coil_erfinv_approx(d, w);
    y = fabsf(x) == 1.0f ? copysignf(INFINITY, x) : y;
    return fabsf(x) > 1.0f ? NAN : y;
}}
static inline double coil_erfinv_f64(double x) {{
    double a = fabs(x);
    if (!(a < 1.0)) return a == 1.0 ? copysign(INFINITY, x) : NAN;
    double y = coil_erfinv_approx(x, -log((1.0 - x) * (1.0 + x)));
    for (int i = 0; i < 2 && y != 0.0; i++) {{
        double slope = 0x1.20dd750429b6dp+0 * exp(-y * y); /* 2 / sqrt(pi) e^-y^2 */
        if (a <= 0.5) y -= (erf(y) - x) / slope;
        else y += (erfc(fabs(y)) - (1.0 - a)) * copysign(1.0, y) / slope;
    }}
    return y;
}}
"
    );
    s
}

/// The C text: the table of `2/pi` bits and the functions.
pub(super) fn vecmath() -> String {
    format!("{}{FUNCTIONS}{}", two_over_pi_table(), erfinv())
}
