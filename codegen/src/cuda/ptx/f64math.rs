//! f64 routines the PTX emitter writes out where PTX has no instruction: `log` and `exp` of
//! f64 (for random normals, `pow` and `erfinv`), the Taylor coefficients of `sin` and `cos` (for
//! those and Box-Muller's `cos`), `pow` and `erfinv` of f32 computed through them, and an exact
//! `fmod` of f32.

use super::asm::{Asm, Class, Opnd, Reg};

/// The mantissa bits of `sqrt(2)`: larger mantissas take the next exponent in `log_f64`.
pub(super) const SQRT2_BITS: u64 = 0x6_A09E_667F_3BCD;
/// `ln 2 = LN2_HI + LN2_LO`, `LN2_HI` with trailing zero bits (so `e * LN2_HI` is exact).
pub(super) const LN2_HI: f64 = 6.931_471_803_691_238e-1;
pub(super) const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;

/// The Taylor coefficient `(-1)^k / n!` of `cos` (`n = 2k`) or `sin` (`n = 2k + 1`).
pub(super) fn taylor_coeff(n: u32) -> f64 {
    let fact: f64 = (1..=n).map(f64::from).product();
    if (n / 2).is_multiple_of(2) {
        1.0 / fact
    } else {
        -1.0 / fact
    }
}

/// `log(x)` for a positive normal f64 `x`: `x = m 2^e` with `m` in `[sqrt(1/2), sqrt(2))`,
/// `log m = 2 atanh(s)` with `s = (m - 1) / (m + 1)`, `|s| < 0.172`, as the odd series
/// `2 (s + s^3/3 + ... + s^23/23)` (the next term is below `1e-18`), plus `e ln 2` in two parts.
pub(super) fn log_f64(a: &mut Asm, x: Reg) -> Reg {
    use Class::*;
    const MANTISSA: u64 = (1 << 52) - 1;
    let bits = a.op(B64, "mov.b64", &[x.into()]);
    let biased = a.op(B64, "shr.u64", &[bits.into(), Opnd::Int(52)]);
    let mant = a.op(B64, "and.b64", &[bits.into(), Opnd::Hex(MANTISSA)]);
    let big = a.op(Pred, "setp.gt.u64", &[mant.into(), Opnd::Hex(SQRT2_BITS)]);
    let bump = a.op(B64, "selp.b64", &[Opnd::Int(1), Opnd::Int(0), big.into()]);
    let e = a.op(B64, "add.s64", &[biased.into(), bump.into()]);
    let e = a.op(B64, "sub.s64", &[e.into(), Opnd::Int(1023)]);
    let exp_bits = a.op(B64, "selp.b64", &[Opnd::Hex(0x3FE << 52), Opnd::Hex(0x3FF << 52), big.into()]);
    let m = a.op(B64, "or.b64", &[mant.into(), exp_bits.into()]);
    let m = a.op(F64, "mov.b64", &[m.into()]);
    let num = a.op(F64, "sub.f64", &[m.into(), Opnd::F64(1.0)]);
    let den = a.op(F64, "add.f64", &[m.into(), Opnd::F64(1.0)]);
    let s = a.op(F64, "div.rn.f64", &[num.into(), den.into()]);
    let z = a.op(F64, "mul.f64", &[s.into(), s.into()]);
    // P(z) = sum z^k / (2k + 1), k = 1..11; log m = 2s + 2s z P(z)
    let mut p = a.op(F64, "mov.f64", &[Opnd::F64(1.0 / 23.0)]);
    for k in (1..11).rev() {
        p = a.op(F64, "fma.rn.f64", &[p.into(), z.into(), Opnd::F64(1.0 / (2 * k + 1) as f64)]);
    }
    let s2 = a.op(F64, "add.f64", &[s.into(), s.into()]);
    let s2z = a.op(F64, "mul.f64", &[s2.into(), z.into()]);
    let log_m = a.op(F64, "fma.rn.f64", &[s2z.into(), p.into(), s2.into()]);
    let ef = a.op(F64, "cvt.rn.f64.s64", &[e.into()]);
    let low = a.op(F64, "fma.rn.f64", &[ef.into(), Opnd::F64(LN2_LO), log_m.into()]);
    a.op(F64, "fma.rn.f64", &[ef.into(), Opnd::F64(LN2_HI), low.into()])
}

/// `(sin x, cos x)` for an f64 `x` in about `[-pi/4, pi/4]`: Taylor series to the `x^17` and
/// `x^16` terms (the next below `1e-18`).
pub(super) fn sin_cos_f64(a: &mut Asm, x: Reg) -> (Reg, Reg) {
    use Class::*;
    let x2 = a.op(F64, "mul.f64", &[x.into(), x.into()]);
    // sum over k = 0..8 of taylor_coeff(first + 2k) x^2k
    let series = |a: &mut Asm, first: u32| {
        let mut p = a.op(F64, "mov.f64", &[Opnd::F64(taylor_coeff(first + 16))]);
        for k in (0..8).rev() {
            p = a.op(F64, "fma.rn.f64", &[p.into(), x2.into(), Opnd::F64(taylor_coeff(first + 2 * k))]);
        }
        p
    };
    let cos = series(a, 0);
    let sin_over_x = series(a, 1);
    (a.op(F64, "mul.f64", &[sin_over_x.into(), x.into()]), cos)
}

/// `exp(t)` for an f64 `t` in `[-110, 110]` (callers clamp: past that an f32 result is 0 or
/// inf anyway): `t = k ln 2 + f` with `k` the nearest integer to `t / ln 2` and `|f| <= 0.35`
/// (two fma steps, `k LN2_HI` exact), `e^f` by its Taylor series to `f^13` (the next term is
/// below `1e-17` relative), times `2^k` built in the exponent bits.
pub(super) fn exp_f64(a: &mut Asm, t: Reg) -> Reg {
    use Class::*;
    let k = a.op(F64, "mul.f64", &[t.into(), Opnd::F64(std::f64::consts::LOG2_E)]);
    let k = a.op(F64, "cvt.rni.f64.f64", &[k.into()]);
    let nk = a.op(F64, "neg.f64", &[k.into()]);
    let f = a.op(F64, "fma.rn.f64", &[nk.into(), Opnd::F64(LN2_HI), t.into()]);
    let f = a.op(F64, "fma.rn.f64", &[nk.into(), Opnd::F64(LN2_LO), f.into()]);
    let mut p = a.op(F64, "mov.f64", &[Opnd::F64(1.0 / factorial(13))]);
    for n in (0..13).rev() {
        p = a.op(F64, "fma.rn.f64", &[p.into(), f.into(), Opnd::F64(1.0 / factorial(n))]);
    }
    let ki = a.op(B64, "cvt.rzi.s64.f64", &[k.into()]);
    let biased = a.op(B64, "add.s64", &[ki.into(), Opnd::Int(1023)]);
    let bits = a.op(B64, "shl.b64", &[biased.into(), Opnd::Int(52)]);
    let scale = a.op(F64, "mov.b64", &[bits.into()]);
    a.op(F64, "mul.f64", &[p.into(), scale.into()])
}

fn factorial(n: u32) -> f64 {
    (1..=n).map(f64::from).product()
}

/// `pow(x, y)` of f32 with C99's special cases (as `powf`): `|x|^y = exp(y log |x|)` in f64
/// (within about `1e-14` relative, far below an f32 ulp), the sign `(-1)^y` for negative `x` and
/// an integer `y`, NaN for a negative `x` and another finite `y`; then zeros, infinities and NaN
/// by the standard's table, `pow(x, 0) = pow(1, y) = 1` last (even for NaN).
pub(super) fn pow_f32(a: &mut Asm, x: Reg, y: Reg) -> Reg {
    use Class::*;
    let xd = a.op(F64, "cvt.f64.f32", &[x.into()]);
    let yd = a.op(F64, "cvt.f64.f32", &[y.into()]);
    let ax = a.op(F64, "abs.f64", &[xd.into()]);
    // y an integer, and odd (f32 integers from 2^24 up are even)
    let yt = a.op(F64, "cvt.rzi.f64.f64", &[yd.into()]);
    let y_int = a.op(Pred, "setp.eq.f64", &[yt.into(), yd.into()]);
    let half = a.op(F64, "mul.f64", &[yd.into(), Opnd::F64(0.5)]);
    let half_t = a.op(F64, "cvt.rzi.f64.f64", &[half.into()]);
    let half_frac = a.op(Pred, "setp.ne.f64", &[half_t.into(), half.into()]);
    let y_odd = a.op(Pred, "and.pred", &[y_int.into(), half_frac.into()]);
    let x_bits = a.op(B32, "mov.b32", &[x.into()]);
    let x_neg = a.op(Pred, "setp.lt.s32", &[x_bits.into(), Opnd::Int(0)]);
    // the finite, nonzero case
    let l = log_f64(a, ax);
    let t = a.op(F64, "mul.f64", &[yd.into(), l.into()]);
    let t = a.op(F64, "max.f64", &[t.into(), Opnd::F64(-110.0)]);
    let t = a.op(F64, "min.f64", &[t.into(), Opnd::F64(110.0)]);
    let mag = exp_f64(a, t);
    let mag = a.op(F32, "cvt.rn.f32.f64", &[mag.into()]);
    let neg_mag = a.op(F32, "neg.f32", &[mag.into()]);
    let neg_result = a.op(Pred, "and.pred", &[x_neg.into(), y_odd.into()]);
    let mut r = a.op(F32, "selp.f32", &[neg_mag.into(), mag.into(), neg_result.into()]);
    let y_frac = a.op(Pred, "not.pred", &[y_int.into()]);
    let nan_case = a.op(Pred, "and.pred", &[x_neg.into(), y_frac.into()]);
    r = a.op(F32, "selp.f32", &[Opnd::F32(f32::NAN), r.into(), nan_case.into()]);
    let y_pos = a.op(Pred, "setp.gt.f32", &[y.into(), Opnd::F32(0.0)]);
    // x = +-0 or +-inf: 0 or inf by the sign of y (swapped for inf), signed for an odd y and a
    // negative x
    let ax32 = a.op(F32, "abs.f32", &[x.into()]);
    let zero = a.op(Pred, "setp.eq.f32", &[ax32.into(), Opnd::F32(0.0)]);
    let inf = a.op(Pred, "setp.eq.f32", &[ax32.into(), Opnd::F32(f32::INFINITY)]);
    let to_zero = a.op(Pred, "xor.pred", &[inf.into(), y_pos.into()]);
    let edge = a.op(F32, "selp.f32", &[Opnd::F32(0.0), Opnd::F32(f32::INFINITY), to_zero.into()]);
    let neg_edge = a.op(F32, "neg.f32", &[edge.into()]);
    let edge = a.op(F32, "selp.f32", &[neg_edge.into(), edge.into(), neg_result.into()]);
    let zero_or_inf = a.op(Pred, "or.pred", &[zero.into(), inf.into()]);
    r = a.op(F32, "selp.f32", &[edge.into(), r.into(), zero_or_inf.into()]);
    // y = +-inf: by |x| against 1 (|x| = 1 gives 1)
    let ay = a.op(F32, "abs.f32", &[y.into()]);
    let y_inf = a.op(Pred, "setp.eq.f32", &[ay.into(), Opnd::F32(f32::INFINITY)]);
    let above = a.op(Pred, "setp.gt.f32", &[ax32.into(), Opnd::F32(1.0)]);
    let vanishes = a.op(Pred, "xor.pred", &[above.into(), y_pos.into()]);
    let lim = a.op(F32, "selp.f32", &[Opnd::F32(0.0), Opnd::F32(f32::INFINITY), vanishes.into()]);
    let unit = a.op(Pred, "setp.eq.f32", &[ax32.into(), Opnd::F32(1.0)]);
    let lim = a.op(F32, "selp.f32", &[Opnd::F32(1.0), lim.into(), unit.into()]);
    r = a.op(F32, "selp.f32", &[lim.into(), r.into(), y_inf.into()]);
    // NaN in, NaN out; then pow(x, 0) = pow(1, y) = 1
    let nan = a.op(Pred, "setp.nan.f32", &[x.into(), y.into()]);
    r = a.op(F32, "selp.f32", &[Opnd::F32(f32::NAN), r.into(), nan.into()]);
    let y_zero = a.op(Pred, "setp.eq.f32", &[y.into(), Opnd::F32(0.0)]);
    let x_one = a.op(Pred, "setp.eq.f32", &[x.into(), Opnd::F32(1.0)]);
    let one = a.op(Pred, "or.pred", &[y_zero.into(), x_one.into()]);
    a.op(F32, "selp.f32", &[Opnd::F32(1.0), r.into(), one.into()])
}

/// `p(t)` of an f64 register by Horner's rule (coefficients from the constant term up), as
/// [`coil_ir::special::horner`].
fn horner_f64(a: &mut Asm, coeffs: &[f64], t: Reg) -> Reg {
    let mut p = a.op(Class::F64, "mov.f64", &[Opnd::F64(coeffs[coeffs.len() - 1])]);
    for &c in coeffs[..coeffs.len() - 1].iter().rev() {
        p = a.op(Class::F64, "fma.rn.f64", &[p.into(), t.into(), Opnd::F64(c)]);
    }
    p
}

/// `erfinv(x)` of f32 as the C prelude's `coil_erfinv_f32`: [`coil_ir::special`]'s
/// approximation `x P(w)`, `w = -log((1 - x)(1 + x))`, in f64 (both polynomials, then a select),
/// one rounding; `±1` give `±inf`, `|x| > 1` NaN, NaN NaN.
pub(super) fn erfinv_f32(a: &mut Asm, x: Reg) -> Reg {
    use coil_ir::special::*;
    use Class::*;
    let xd = a.op(F64, "cvt.f64.f32", &[x.into()]);
    let below = a.op(F64, "sub.f64", &[Opnd::F64(1.0), xd.into()]);
    let above = a.op(F64, "add.f64", &[xd.into(), Opnd::F64(1.0)]);
    let m = a.op(F64, "mul.f64", &[below.into(), above.into()]);
    // log_f64 needs a positive normal: |x| >= 1 and NaN take 1 (their results are selected below)
    let inside = a.op(Pred, "setp.gt.f64", &[m.into(), Opnd::F64(0.0)]);
    let m = a.op(F64, "selp.f64", &[m.into(), Opnd::F64(1.0), inside.into()]);
    let l = log_f64(a, m);
    let w = a.op(F64, "neg.f64", &[l.into()]);
    let tc = a.op(F64, "sub.f64", &[w.into(), Opnd::F64(ERFINV_CENTRAL_MID)]);
    let central = horner_f64(a, &ERFINV_CENTRAL, tc);
    let root = a.op(F64, "sqrt.rn.f64", &[w.into()]);
    let tt = a.op(F64, "sub.f64", &[root.into(), Opnd::F64(ERFINV_TAIL_MID)]);
    let tail = horner_f64(a, &ERFINV_TAIL, tt);
    let near = a.op(Pred, "setp.lt.f64", &[w.into(), Opnd::F64(ERFINV_SPLIT)]);
    let p = a.op(F64, "selp.f64", &[central.into(), tail.into(), near.into()]);
    let r = a.op(F64, "mul.f64", &[xd.into(), p.into()]);
    let f = a.op(F32, "cvt.rn.f32.f64", &[r.into()]);
    let ax = a.op(F32, "abs.f32", &[x.into()]);
    let one = a.op(Pred, "setp.eq.f32", &[ax.into(), Opnd::F32(1.0)]);
    let negative = a.op(Pred, "setp.lt.f32", &[x.into(), Opnd::F32(0.0)]);
    let inf = a.op(F32, "selp.f32", &[Opnd::F32(f32::NEG_INFINITY), Opnd::F32(f32::INFINITY), negative.into()]);
    let f = a.op(F32, "selp.f32", &[inf.into(), f.into(), one.into()]);
    let beyond = a.op(Pred, "setp.gt.f32", &[ax.into(), Opnd::F32(1.0)]);
    a.op(F32, "selp.f32", &[Opnd::F32(f32::NAN), f.into(), beyond.into()])
}

/// `fmodf(x, y)` of f32 values, exact as C's: in f64, `r = |x|` is reduced by `D = |y| 2^k`
/// with `k` chosen so that the quotient `q = trunc(r / D)` stays below `2^52`; `r - q D` by
/// one `fma` is exact (a multiple of `D`'s ulp below `2 D`), and one step back by `D` where the
/// rounded quotient overshot. Each step takes about 51 bits off the exponent gap (at most 277
/// for f32), down to `k = 0`. NaN for a zero divisor, an infinite or NaN operand; `x` for an
/// infinite divisor; the sign of `x`.
pub(super) fn fmod_f32(a: &mut Asm, x: Reg, y: Reg) -> Reg {
    use Class::*;
    let xd = a.op(F64, "cvt.f64.f32", &[x.into()]);
    let yd = a.op(F64, "cvt.f64.f32", &[y.into()]);
    let r = a.op(F64, "abs.f64", &[xd.into()]);
    let d = a.op(F64, "abs.f64", &[yd.into()]);
    let (top, end) = (a.label(), a.label());
    a.place(&top);
    // (NaN compares false: a NaN `r` or `d` leaves the loop at once)
    let more = a.op(Pred, "setp.ge.f64", &[r.into(), d.into()]);
    let finite = a.op(Pred, "testp.finite.f64", &[r.into()]);
    let go = a.op(Pred, "and.pred", &[more.into(), finite.into()]);
    a.branch_if(go, true, &end);
    let t = a.op(F64, "div.rn.f64", &[r.into(), d.into()]);
    let bits = a.op(B64, "mov.b64", &[t.into()]);
    let e = a.op(B64, "shr.u64", &[bits.into(), Opnd::Int(52)]);
    let k = a.op(B64, "sub.s64", &[e.into(), Opnd::Int(1023 + 51)]);
    let k = a.op(B64, "max.s64", &[k.into(), Opnd::Int(0)]);
    let scale = a.op(B64, "add.s64", &[k.into(), Opnd::Int(1023)]);
    let scale = a.op(B64, "shl.b64", &[scale.into(), Opnd::Int(52)]);
    let scale = a.op(F64, "mov.b64", &[scale.into()]);
    let big = a.op(F64, "mul.rn.f64", &[d.into(), scale.into()]);
    let t = a.op(F64, "div.rn.f64", &[r.into(), big.into()]);
    let q = a.op(F64, "cvt.rzi.f64.f64", &[t.into()]);
    let nq = a.op(F64, "neg.f64", &[q.into()]);
    a.op_into(r, "fma.rn.f64", &[nq.into(), big.into(), r.into()]);
    let over = a.op(Pred, "setp.lt.f64", &[r.into(), Opnd::F64(0.0)]);
    let back = a.op(F64, "add.rn.f64", &[r.into(), big.into()]);
    a.op_into(r, "selp.f64", &[back.into(), r.into(), over.into()]);
    a.jump(&top);
    a.place(&end);
    let m = a.op(F32, "cvt.rn.f32.f64", &[r.into()]);
    // the sign of x; NaN where y is 0 or x is not finite (NaN operands stay NaN)
    let mbits = a.op(B32, "mov.b32", &[m.into()]);
    let xbits = a.op(B32, "mov.b32", &[x.into()]);
    let sign = a.op(B32, "and.b32", &[xbits.into(), Opnd::Hex(0x8000_0000)]);
    let signed = a.op(B32, "or.b32", &[mbits.into(), sign.into()]);
    let m = a.op(F32, "mov.b32", &[signed.into()]);
    let zero = a.op(Pred, "setp.eq.f32", &[y.into(), Opnd::F32(0.0)]);
    let inf = a.op(Pred, "testp.infinite.f32", &[x.into()]);
    let bad = a.op(Pred, "or.pred", &[zero.into(), inf.into()]);
    let nan = a.op(F32, "add.f32", &[x.into(), y.into()]);
    let nan = a.op(F32, "selp.f32", &[Opnd::F32(f32::NAN), nan.into(), bad.into()]);
    let any_nan = a.op(Pred, "testp.notanumber.f32", &[nan.into()]);
    a.op(F32, "selp.f32", &[nan.into(), m.into(), any_nan.into()])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fmod_f32`'s reduction on the host (the same f64 steps) against Rust's `%` (C's `fmodf`,
    /// exact) on quotients from below 1 to the whole f32 exponent range, and the special cases.
    #[test]
    fn the_fmod_reduction_is_exact() {
        fn reduce(x: f32, y: f32) -> f32 {
            let (mut r, d) = (f64::from(x).abs(), f64::from(y).abs());
            while r >= d && r.is_finite() {
                let t = r / d;
                let k = ((t.to_bits() >> 52) as i64 - (1023 + 51)).max(0);
                let big = d * f64::from_bits(((k + 1023) as u64) << 52);
                let q = (r / big).trunc();
                r = (-q).mul_add(big, r);
                if r < 0.0 {
                    r += big;
                }
            }
            let m = f32::from_bits((r as f32).to_bits() | (x.to_bits() & 0x8000_0000));
            if y == 0.0 || x.is_infinite() || (x + y).is_nan() {
                f32::NAN
            } else {
                m
            }
        }
        let mut vals = vec![0.0f32, -0.0, 1.0, -1.0, 0.1, 3.0, -7.5, 1e-45, 1e-38, 3.4e38, -3.4e38, 16_777_217.0];
        vals.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MAX, f32::MIN_POSITIVE]);
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..4000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bits = (state as u32) & 0x7FFF_FFFF;
            if f32::from_bits(bits).is_finite() {
                vals.push(if state >> 40 & 1 == 1 { -f32::from_bits(bits) } else { f32::from_bits(bits) });
            }
        }
        for (i, &x) in vals.iter().enumerate() {
            for &y in vals.iter().skip(i % 7).step_by(7).take(600) {
                let (got, want) = (reduce(x, y), x % y);
                let same = got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan());
                assert!(same, "fmod({x:e}, {y:e}) = {got:e}, want {want:e}");
            }
        }
    }

    /// `exp_f64`'s steps on the host against `std` over the range its callers pass.
    #[test]
    fn the_exp_series_matches_std() {
        for i in -22_000..=22_000 {
            let t = f64::from(i) * 0.005 + 1e-3;
            let k = (t * std::f64::consts::LOG2_E).round_ties_even();
            let f = (-k).mul_add(LN2_LO, (-k).mul_add(LN2_HI, t));
            let mut p = 1.0 / factorial(13);
            for n in (0..13).rev() {
                p = p.mul_add(f, 1.0 / factorial(n));
            }
            let got = p * f64::from_bits(((k as i64 + 1023) as u64) << 52);
            let want = t.exp();
            assert!((got - want).abs() <= 4e-16 * want, "exp({t}): {got:e} vs {want:e}");
        }
    }
}
