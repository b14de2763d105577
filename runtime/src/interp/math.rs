//! Scalar functions std does not provide with PyTorch's semantics: `erf`, `erfinv`, floor
//! division and remainder of floats, and integer powers.

use coil_ir::{Error, Result};

/// `2 / sqrt(pi)`.
const TWO_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;
/// `1 / sqrt(pi)`.
const ONE_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI / 2.0;

/// The error function, accurate to a few ulp in f64 (relative error below 1e-15).
///
/// * `|x| < 1.5`: the Maclaurin series `2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))`
///   (the alternating terms cancel little in this range);
/// * `1.5 <= |x| < 6`: `1 - erfc(x)`, with `erfc(x) = exp(-x^2) / sqrt(pi) / K(x)` and the
///   continued fraction `K(x) = x + (1/2) / (x + 1 / (x + (3/2) / (x + 2 / ...)))` evaluated
///   backwards from depth 80, and `x^2` split exactly (hi + lo, by fma) so `exp(-x^2)` keeps
///   full precision;
/// * `|x| >= 6`: `erf(x) = ±1` exactly in f64 (`erfc(6) < 2.2e-17`).
pub(super) fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 1.5 {
        erf_series(a)
    } else if a < 6.0 {
        1.0 - erfc_continued_fraction(a)
    } else {
        1.0
    };
    r.copysign(x)
}

/// The complementary error function `1 - erf(x)`, to about 1e-14 relative everywhere (no
/// cancellation for large `x`: `erfc(10)` is `2.09e-45`, not 0). `erfc(x) = 2 - erfc(-x)` for
/// negative `x`, where the result is above 1 and the subtraction is exact enough.
pub(super) fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x < 0.0 {
        2.0 - erfc_nonnegative(-x)
    } else {
        erfc_nonnegative(x)
    }
}

/// `erfc(a) = 1 - erf(a)` for `a >= 0`, to about 1e-14 relative: the continued fraction from
/// 1.5 up (where `1 - erf` would cancel), else `1 - erf(a)` (at least 0.034 there, so the
/// subtraction loses under 5 bits).
fn erfc_nonnegative(a: f64) -> f64 {
    if a < 1.5 {
        1.0 - erf_series(a)
    } else if a < 27.3 {
        erfc_continued_fraction(a)
    } else {
        0.0 // below the smallest subnormal
    }
}

/// The inverse error function, within a few ulp in f64: the shared approximation
/// ([`coil_ir::special::erfinv_approx`], 1e-10 relative) and two Newton steps, on `erf(y) = x`
/// for `|x| <= 0.5` and on `erfc(|y|) = 1 - |x|` beyond (where `1 - |x|` is exact and `erf(y)`
/// would hold too few of the digits that matter). `±1` give `±inf`, `|x| > 1` and NaN NaN.
pub(super) fn erfinv(x: f64) -> f64 {
    let mut y = coil_ir::special::erfinv_approx(x);
    if !y.is_finite() || y == 0.0 {
        return y;
    }
    let a = x.abs();
    for _ in 0..2 {
        let slope = TWO_OVER_SQRT_PI * (-y * y).exp();
        if a <= 0.5 {
            y -= (erf(y) - x) / slope;
        } else {
            // erfc falls where erf rises: |y| grows where erfc(|y|) is above 1 - |x|
            y += (erfc_nonnegative(y.abs()) - (1.0 - a)) * y.signum() / slope;
        }
    }
    y
}

fn erf_series(a: f64) -> f64 {
    let x2 = a * a;
    let (mut term, mut sum) = (a, a);
    for n in 1..200 {
        term *= -x2 / n as f64;
        let t = term / (2 * n + 1) as f64;
        sum += t;
        if t.abs() <= 1e-17 * sum.abs() {
            break;
        }
    }
    TWO_OVER_SQRT_PI * sum
}

fn erfc_continued_fraction(a: f64) -> f64 {
    let hi = a * a;
    let lo = a.mul_add(a, -hi);
    let exp_neg_x2 = (-hi).exp() * (1.0 - lo);
    let mut k = a;
    for n in (1..=80).rev() {
        k = a + (n as f64 / 2.0) / k;
    }
    exp_neg_x2 * ONE_OVER_SQRT_PI / k
}

/// `torch.div(a, b, rounding_mode="floor")` for floats: PyTorch's `div_floor_floating`, with
/// every intermediate step rounded by `r` to the dtype the kernel computes in.
pub(super) fn div_floor(a: f64, b: f64, r: impl Fn(f64) -> f64) -> f64 {
    if b == 0.0 {
        return a / b;
    }
    let m = a % b; // fmod: exact
    let mut div = r(r(a - m) / b);
    if m != 0.0 && (b < 0.0) != (m < 0.0) {
        div = r(div - 1.0);
    }
    if div != 0.0 {
        let mut fd = div.floor();
        if div - fd > 0.5 {
            fd = r(fd + 1.0);
        }
        fd
    } else {
        0.0f64.copysign(a / b)
    }
}

/// `torch.remainder` for floats: `fmod` moved to the divisor's sign.
pub(super) fn remainder(a: f64, b: f64) -> f64 {
    let m = a % b;
    if m != 0.0 && (b < 0.0) != (m < 0.0) {
        m + b
    } else {
        m
    }
}

/// `x ** y` for integers, by squaring, wrapping in i64.
pub(super) fn pow_int(x: i64, y: i64) -> Result<i64> {
    if y < 0 {
        return Err(Error::value("Integers to negative integer powers are not allowed."));
    }
    let (mut base, mut exp, mut acc) = (x, y as u64, 1i64);
    while exp > 0 {
        if exp & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        exp >>= 1;
    }
    Ok(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_reference_values() {
        // Values of the C library's erf (glibc, < 1 ulp).
        let cases = [
            (0.0, 0.0),
            (1e-300, 1.1283791670955126e-300),
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (1.4999, 0.9660932516622953),
            (1.5, 0.9661051464753108),
            (2.0, 0.9953222650189527),
            (3.0, 0.9999779095030014),
            (4.5, 0.9999999998033839),
            (5.9, 0.9999999999999999),
            (6.0, 1.0),
        ];
        for (x, want) in cases {
            for (x, want) in [(x, want), (-x, -want)] {
                let got = erf(x);
                assert!((got - want).abs() <= 1e-15 * want.abs(), "erf({x}) = {got}, want {want}");
            }
        }
        assert!(erf(f64::NAN).is_nan());
        assert_eq!(erf(f64::INFINITY), 1.0);
        assert_eq!(erf(f64::NEG_INFINITY), -1.0);
        assert_eq!(erf(-0.0).to_bits(), (-0.0f64).to_bits());
    }

    #[test]
    fn erfc_keeps_its_digits_for_large_x() {
        // Values of Python's math.erfc (the C library's, < 1 ulp).
        let cases = [
            (-3.0, 1.9999779095030015),
            (-0.5, 1.5204998778130465),
            (0.0, 1.0),
            (0.3, 0.6713732405408726),
            (1.0, 0.15729920705028513),
            (1.5, 0.033894853524689274),
            (3.0, 2.2090496998585438e-05),
            (5.0, 1.5374597944280351e-12),
            (10.0, 2.088487583762545e-45),
            (26.0, 5.663192408856143e-296),
        ];
        for (x, want) in cases {
            let got = erfc(x);
            assert!((got - want).abs() <= 1e-14 * want, "erfc({x}) = {got:e}, want {want:e}");
        }
        assert_eq!((erfc(f64::INFINITY), erfc(f64::NEG_INFINITY), erfc(27.5)), (0.0, 2.0, 0.0));
        assert!(erfc(f64::NAN).is_nan());
    }

    #[test]
    fn erfinv_inverts_erf() {
        for (x, want) in coil_ir::special::ERFINV_CHECKS {
            for (x, want) in [(x, want), (-x, -want)] {
                let got = erfinv(x);
                assert!((got - want).abs() <= 4e-16 * want.abs(), "erfinv({x}) = {got:e}, want {want:e}");
            }
        }
        assert_eq!(erfinv(1.0), f64::INFINITY);
        assert_eq!(erfinv(-1.0), f64::NEG_INFINITY);
        assert_eq!(erfinv(-0.0).to_bits(), (-0.0f64).to_bits());
        assert!(erfinv(1.0000001).is_nan() && erfinv(f64::NAN).is_nan() && erfinv(-f64::INFINITY).is_nan());
    }

    #[test]
    fn floor_division_and_remainder_of_floats() {
        let id = |x: f64| x;
        assert_eq!(div_floor(7.0, 2.0, id), 3.0);
        assert_eq!(div_floor(-7.0, 2.0, id), -4.0);
        assert_eq!(div_floor(7.0, -2.0, id), -4.0);
        assert_eq!(div_floor(-7.0, -2.0, id), 3.0);
        assert_eq!(div_floor(5.5, 0.5, id), 11.0);
        assert_eq!(div_floor(1.0, 0.0, id), f64::INFINITY);
        assert!(div_floor(0.0, 0.0, id).is_nan());
        assert_eq!(div_floor(-0.0, 3.0, id).to_bits(), (-0.0f64).to_bits());
        assert_eq!(div_floor(0.5, -3.0, id), -1.0);
        assert_eq!(remainder(-7.0, 2.0), 1.0);
        assert_eq!(remainder(7.0, -2.0), -1.0);
        assert_eq!(remainder(-7.5, -2.0), -1.5);
        assert!(remainder(1.0, 0.0).is_nan());
    }

    #[test]
    fn integer_powers() {
        assert_eq!(pow_int(3, 4).unwrap(), 81);
        assert_eq!(pow_int(-2, 3).unwrap(), -8);
        assert_eq!(pow_int(0, 0).unwrap(), 1);
        assert_eq!(pow_int(2, 64).unwrap(), 0);
        assert!(pow_int(2, -1).is_err());
    }
}
