//! The prelude's f32 math ([`super::vecmath`]) against the C library's f64 functions: sweeps
//! over all exponents, dense ranges where the algorithms switch, and the special values
//! (NaN, infinities, signed zeros, subnormals, the overflow and underflow thresholds), which
//! must come out exactly as C99 says. Compiled twice: `-O2` (plain x86-64 or the target's
//! baseline: no fused multiply-add) and `-O3 -march=native` (the runtime's flags: the vector
//! loops, with FMA where the machine has it).

use crate::testutil::{compile_with, CLib};

/// A function: its prelude name, the C expression of its f64 reference of `v`, the largest
/// error allowed in ulps (a little above the exhaustive maximum documented in `vecmath`).
const UNARY: &[(&str, &str, f64)] = &[
    ("exp", "exp(v)", 1.0),
    ("expm1", "expm1(v)", 1.5),
    ("exp2", "exp2(v)", 1.0),
    ("log", "log(v)", 1.0),
    ("log2", "log2(v)", 2.0),
    ("log1p", "log1p(v)", 1.5),
    ("tanh", "tanh(v)", 2.5),
    ("sigmoid", "1.0 / (1.0 + exp(-v))", 2.5),
    ("erf", "erf(v)", 1.25),
    ("sin", "sin(v)", 0.51),
    ("cos", "cos(v)", 0.51),
    ("tan", "tan(v)", 0.51),
    ("atan", "atan(v)", 0.51),
    ("asin", "asin(v)", 0.51),
    ("acos", "acos(v)", 0.51),
    // C has no erfinv: the prelude's f64 one (Newton-refined on the C library's erf and erfc,
    // checked against 50-digit values below)
    ("erfinv", "coil_erfinv_f64(v)", 0.51),
];

/// The prelude and, per function, `void test_NAME(const float *x, float *got, double *want,
/// int64_t n)`: the function over `x` in an `omp simd` loop, and the reference.
fn source() -> String {
    let mut s = super::prelude().to_string();
    for (name, reference, _) in UNARY {
        s += &format!(
            "void test_{name}(const float *x, float *got, double *want, int64_t n) {{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) got[i] = coil_{name}_f32(x[i]);
    for (int64_t i = 0; i < n; i++) {{ double v = x[i]; want[i] = {reference}; }}
}}
"
        );
    }
    s += "void test_pow(const float *x, const float *y, float *got, double *want, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) got[i] = coil_pow_f32(x[i], y[i]);
    for (int64_t i = 0; i < n; i++) want[i] = pow((double)x[i], (double)y[i]);
}
void test_atan2(const float *x, const float *y, float *got, double *want, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) got[i] = coil_atan2_f32(x[i], y[i]);
    for (int64_t i = 0; i < n; i++) want[i] = atan2((double)x[i], (double)y[i]);
}
void test_erfinv_f64(const double *x, double *got, int64_t n) {
    for (int64_t i = 0; i < n; i++) got[i] = coil_erfinv_f64(x[i]);
}
void test_gelu(const float *x, float *got, float *want, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) got[i] = coil_gelu_tanh_f32(x[i]);
    for (int64_t i = 0; i < n; i++) want[i] = (x[i] * 0.5f) * (coil_tanh_f32((x[i] + x[i] * x[i] * x[i] * 0.044715f) * 0.7978846f) + 1.0f);
}
/* the exact tanh GELU of each f32 input, in long double (the constants as decimals; the prelude
   declares no long double math) */
long double tanhl(long double);
void test_gelu_exact(const float *x, double *want, int64_t n) {
    const long double k = 0.797884560802865355879892119868763737L; /* sqrt(2 / pi) */
    for (int64_t i = 0; i < n; i++) {
        long double v = x[i];
        want[i] = (double)(0.5L * v * (1.0L + tanhl(k * (v + 0.044715L * v * v * v))));
    }
}
";
    s
}

/// The error of `got` in ulps of the exact result `want` (f32 ulps at `want`'s magnitude,
/// subnormal spacing below `f32::MIN_POSITIVE`); infinite when a special value differs: NaN
/// for non-NaN, an infinity where `want` rounds to a finite value or the other way round, or
/// a zero of the wrong sign.
fn ulp_error(got: f32, want: f64) -> f64 {
    if want.is_nan() || got.is_nan() {
        return if want.is_nan() && got.is_nan() { 0.0 } else { f64::INFINITY };
    }
    let rounded = want as f32;
    if rounded.is_infinite() || got.is_infinite() {
        return if got == rounded { 0.0 } else { f64::INFINITY };
    }
    if rounded == 0.0 && got == 0.0 {
        return if got.is_sign_negative() == rounded.is_sign_negative() { 0.0 } else { f64::INFINITY };
    }
    let exponent = if want == 0.0 { -149 } else { ((want.abs().to_bits() >> 52) & 0x7ff) as i32 - 1023 };
    let ulp = 2f64.powi((exponent - 23).max(-149));
    (got as f64 - want).abs() / ulp
}

/// Inputs: the special values, every 2^13-th f32 bit pattern, and dense ranges.
fn inputs() -> Vec<f32> {
    let mut x = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        -f32::from_bits(1),
        f32::from_bits(0x007f_ffff),
        f32::MAX,
        f32::MIN,
        1.0,
        -1.0,
        0.5,
        2.0,
        88.72283,   // exp: the largest argument with a finite result
        88.72284,   // the first that overflows
        -87.33654,  // exp: the smallest with a normal result
        -103.97208, // the subnormals' end
        -103.97209,
        -104.0,
        128.0,  // exp2 overflows
        -149.0, // exp2: the smallest subnormal
        -150.0,
        -0.99999994,  // log1p near -1
        2.9802322e-8, // 2^-25
        -2.9802322e-8,
        2.4414062e-4, // 2^-12
        3.9,          // erf rounds to 1 from about here
        9.01,         // tanh rounds to 1
        std::f32::consts::FRAC_PI_2,
        std::f32::consts::PI,
        16777216.0, // 2^24: trig arguments from here are even integers
        16777218.0,
        1e30,
        -1e38,
    ];
    x.extend((0..1u64 << 19).map(|i| f32::from_bits((i << 13) as u32 | 0x1357)));
    x.extend((0..200_000).map(|i| (i as f32 - 100_000.0) * 1e-4)); // [-10, 10]
    x.extend((0..20_000).map(|i| (i as f32 - 10_000.0) * 1e-2)); // [-100, 100]
    x
}

type Unary = unsafe extern "C" fn(*const f32, *mut f32, *mut f64, i64);
type Binary = unsafe extern "C" fn(*const f32, *const f32, *mut f32, *mut f64, i64);

fn check_unary(lib: &CLib, flags: &str) {
    let x = inputs();
    let (mut got, mut want) = (vec![0f32; x.len()], vec![0f64; x.len()]);
    let mut failures = Vec::new();
    for &(name, _, bound) in UNARY {
        let f: Unary = unsafe { lib.function(&format!("test_{name}")) };
        unsafe { f(x.as_ptr(), got.as_mut_ptr(), want.as_mut_ptr(), x.len() as i64) };
        let (mut worst, mut at) = (0.0, 0);
        for i in 0..x.len() {
            let e = ulp_error(got[i], want[i]);
            if e > worst || e.is_nan() {
                (worst, at) = (e, i);
            }
        }
        if worst > bound {
            failures.push(format!(
                "{name}({:e} = {:#x}) = {:e}, want {:e}: {worst:.3} ulp > {bound}",
                x[at],
                x[at].to_bits(),
                got[at],
                want[at]
            ));
        }
    }
    assert!(failures.is_empty(), "{flags}:\n{}", failures.join("\n"));
}

/// `pow` on every pair of special values, integer exponents of negative bases, and random
/// pairs whose results span the range (C's `pow` in f64 is the reference).
fn check_pow(lib: &CLib, flags: &str) {
    let special = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        2.0,
        -2.0,
        3.0,
        -3.0,
        -8.0,
        1.0 / 3.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(1),
        -f32::from_bits(1),
        f32::MAX,
        16777216.0,
        16777215.0,
        33554432.0,
        127.0,
        -149.0,
        1e10,
        -1e10,
        1.0000001,
        0.99999994,
    ];
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for &a in &special {
        for &b in &special {
            xs.push(a);
            ys.push(b);
        }
    }
    let mut z = 0x2545_F491_4F6C_DD1Du64; // xorshift64*
    let mut next = || {
        z ^= z >> 12;
        z ^= z << 25;
        z ^= z >> 27;
        z.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    for _ in 0..100_000 {
        let r = next();
        let base = 1.0 + ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5); // [0.5, 1.5)
        let exponent = ((r & 0xffff) as f32 / 65536.0 - 0.5) * 400.0; // [-200, 200)
        xs.push(if r & (1 << 20) != 0 { -base } else { base });
        ys.push(if r & (1 << 21) != 0 { exponent.round() } else { exponent });
        xs.push(f32::from_bits((r >> 32) as u32));
        ys.push(((r & 0xffff_ffff) as f32 / 4294967296.0 - 0.5) * 8.0);
    }
    let (mut got, mut want) = (vec![0f32; xs.len()], vec![0f64; xs.len()]);
    let f: Binary = unsafe { lib.function("test_pow") };
    unsafe { f(xs.as_ptr(), ys.as_ptr(), got.as_mut_ptr(), want.as_mut_ptr(), xs.len() as i64) };
    let bad: Vec<String> = (0..xs.len())
        .filter(|&i| ulp_error(got[i], want[i]) > 0.51)
        .take(10)
        .map(|i| format!("pow({:e}, {:e}) = {:e}, want {:e}", xs[i], ys[i], got[i], want[i]))
        .collect();
    assert!(bad.is_empty(), "{flags}:\n{}", bad.join("\n"));
}

/// `atan2(y, x)` on every pair of special values (C99's table: signed zeros, infinities, NaN)
/// and on pairs spread over the exponents, against C's `atan2` in f64.
fn check_atan2(lib: &CLib, flags: &str) {
    let mut special = vec![0.0f32, 1.0, 0.5, 2.0, 1e-30, 1e30, f32::MAX, f32::from_bits(1), f32::INFINITY, f32::NAN];
    special.extend(special.clone().iter().map(|v| -v));
    let (mut ys, mut xs) = (Vec::new(), Vec::new());
    for &a in &special {
        for &b in &special {
            ys.push(a);
            xs.push(b);
        }
    }
    let mut z = 0x2545_F491_4F6C_DD1Du64; // xorshift64*
    for _ in 0..200_000 {
        z ^= z >> 12;
        z ^= z << 25;
        z ^= z >> 27;
        let r = z.wrapping_mul(0x2545_F491_4F6C_DD1D);
        let y = (r >> 32) as u32;
        // half the x within a factor 2^8 of y (quotients near 1, where the octants meet)
        let e = (((y >> 23) & 0xff) as i64 + (r >> 56) as i64 % 16 - 8).clamp(1, 254) as u32;
        let near = (r as u32 & 0x807f_ffff) | (e << 23);
        ys.push(f32::from_bits(y));
        xs.push(f32::from_bits(if r & (1 << 20) != 0 { r as u32 } else { near }));
    }
    let (mut got, mut want) = (vec![0f32; xs.len()], vec![0f64; xs.len()]);
    let f: Binary = unsafe { lib.function("test_atan2") };
    unsafe { f(ys.as_ptr(), xs.as_ptr(), got.as_mut_ptr(), want.as_mut_ptr(), xs.len() as i64) };
    let bad: Vec<String> = (0..xs.len())
        .filter(|&i| ulp_error(got[i], want[i]) > 0.51)
        .take(10)
        .map(|i| format!("atan2({:e}, {:e}) = {:e}, want {:e}", ys[i], xs[i], got[i], want[i]))
        .collect();
    assert!(bad.is_empty(), "{flags}:\n{}", bad.join("\n"));
}

/// The f64 `erfinv` (the reference of the f32 one) against 50-digit values
/// ([`coil_ir::special::ERFINV_CHECKS`]).
fn check_erfinv_f64(lib: &CLib) {
    let cases = coil_ir::special::ERFINV_CHECKS;
    let x: Vec<f64> = cases.iter().flat_map(|c| [c.0, -c.0]).chain([1.0, -1.0, 1.5, f64::NAN, -0.0]).collect();
    let mut got = vec![0f64; x.len()];
    let f: unsafe extern "C" fn(*const f64, *mut f64, i64) = unsafe { lib.function("test_erfinv_f64") };
    unsafe { f(x.as_ptr(), got.as_mut_ptr(), x.len() as i64) };
    for (i, (x, want)) in cases.iter().flat_map(|&(x, y)| [(x, y), (-x, -y)]).enumerate() {
        assert!((got[i] - want).abs() <= 4e-16 * want.abs(), "erfinv({x}) = {:e}, want {want:e}", got[i]);
    }
    let n = 2 * cases.len();
    assert_eq!(got[n..n + 2], [f64::INFINITY, f64::NEG_INFINITY]);
    assert!(got[n + 2].is_nan() && got[n + 3].is_nan() && got[n + 4].to_bits() == (-0.0f64).to_bits());
}

/// The GELU helper is the `Activation` formula around `coil_tanh_f32`, bit for bit.
fn check_gelu(lib: &CLib) {
    let x = inputs();
    let (mut got, mut want) = (vec![0f32; x.len()], vec![0f32; x.len()]);
    let f: unsafe extern "C" fn(*const f32, *mut f32, *mut f32, i64) = unsafe { lib.function("test_gelu") };
    unsafe { f(x.as_ptr(), got.as_mut_ptr(), want.as_mut_ptr(), x.len() as i64) };
    for i in 0..x.len() {
        assert!(got[i].to_bits() == want[i].to_bits() || got[i].is_nan() && want[i].is_nan(), "gelu({:e})", x[i]);
    }
}

/// The GELU helper against the exact function (`tanhl` in long double): for `x >= 0` within
/// 2.1 ulps of the result; for `x < 0` the result is `x` times a factor in `[0, 1/2]` that the
/// f32 formula gets from `1 + tanh(u)`, which cancels, so the bound is absolute, in ulps of `x`
/// (1.1). Special values: `gelu(±0) = ±0`, `gelu(inf) = inf`, `gelu(-inf) = NaN` (`-inf * 0`, as
/// the formula in any precision), NaN in, NaN out; from `x = 5.3` on (`u > 9.1`, where tanh is
/// 1) `x` itself. (Every third f32 of `[-16, 16]`: at most 2.05 and 1.08.)
fn check_gelu_exact(lib: &CLib, flags: &str) {
    let x = inputs();
    let mut got = vec![0f32; x.len()];
    let mut want = vec![0f64; x.len()];
    let mut copy = vec![0f32; x.len()];
    let f: unsafe extern "C" fn(*const f32, *mut f32, *mut f32, i64) = unsafe { lib.function("test_gelu") };
    unsafe { f(x.as_ptr(), got.as_mut_ptr(), copy.as_mut_ptr(), x.len() as i64) };
    let exact: unsafe extern "C" fn(*const f32, *mut f64, i64) = unsafe { lib.function("test_gelu_exact") };
    unsafe { exact(x.as_ptr(), want.as_mut_ptr(), x.len() as i64) };
    let (mut worst_pos, mut worst_neg) = (0f64, 0f64);
    for i in 0..x.len() {
        let (v, g) = (x[i], got[i]);
        if v.is_nan() || v == f32::NEG_INFINITY {
            assert!(g.is_nan(), "{flags}: gelu({v}) = {g}, want NaN");
        } else if v == 0.0 || v == f32::INFINITY {
            assert_eq!(g.to_bits(), v.to_bits(), "{flags}: gelu({v:e})");
        } else if v > 0.0 {
            worst_pos = worst_pos.max(ulp_error(g, want[i]));
            if v > 5.3 {
                assert_eq!(g, v, "{flags}: gelu({v:e})");
            }
        } else {
            let exponent = ((v.abs().to_bits() >> 23) as i32 - 127).max(-126);
            worst_neg = worst_neg.max((g as f64 - want[i]).abs() / 2f64.powi(exponent - 23));
        }
    }
    assert!(worst_pos <= 2.1, "{flags}: gelu, x > 0: {worst_pos:.3} ulp of the result");
    assert!(worst_neg <= 1.1, "{flags}: gelu, x < 0: {worst_neg:.3} ulp of x");
}

#[test]
fn vector_math_is_within_its_error_bounds_and_exact_on_special_values() {
    let src = source();
    for flags in ["-O2", "-O3 -march=native"] {
        let lib = compile_with(&src, flags);
        check_unary(&lib, flags);
        check_pow(&lib, flags);
        check_atan2(&lib, flags);
        check_erfinv_f64(&lib);
        check_gelu(&lib);
        check_gelu_exact(&lib, flags);
    }
}
