//! Special functions whose formulas every backend shares: the polynomial approximation of
//! `erfinv` (the interpreter refines it by Newton's method; the f32 kernels of the C and PTX
//! backends evaluate it in f64 and round once).
//!
//! `erfinv(x) = x P(w)` with `w = -log((1 - x)(1 + x))`, as in Giles, "Approximating the erfinv
//! function" (GPU Computing Gems, 2011), with coefficients of our own: `P` is
//! [`ERFINV_CENTRAL`] in `w - ERFINV_CENTRAL_MID` for `w < ERFINV_SPLIT` (`|x| < 0.99805`), else
//! [`ERFINV_TAIL`] in `sqrt(w) - ERFINV_TAIL_MID`. They were fitted to `erfinv(x) / x` in
//! 50-digit arithmetic (weighted least squares at Chebyshev nodes, Lawson's iteration toward
//! the minimax relative error) over `w` in `[0, 6.25]` and `[6.25, 36.1]`, the last the `w` of
//! the f64 closest to 1: relative errors below `3.5e-11` and `9.5e-11`, so an f32 result
//! rounds correctly but for ties within `1e-10` of a half ulp.

/// Where the central polynomial hands over to the tail (`w = 6.25`, `|x| ≈ 0.99805`).
pub const ERFINV_SPLIT: f64 = 6.25;
/// The central polynomial's variable is `w - ERFINV_CENTRAL_MID`.
pub const ERFINV_CENTRAL_MID: f64 = 3.125;
/// The tail polynomial's variable is `sqrt(w) - ERFINV_TAIL_MID`.
pub const ERFINV_TAIL_MID: f64 = 4.25;

/// `erfinv(x) / x` for `w < ERFINV_SPLIT`, in `w - ERFINV_CENTRAL_MID`, constant term first.
pub const ERFINV_CENTRAL: [f64; 15] = [
    1.6536545626481618,
    0.24015818220017535,
    -0.0060336704995519064,
    -0.0007407016400966506,
    0.0001867335516257608,
    -1.3883544164188462e-05,
    -1.3650237346189039e-06,
    4.239919014390806e-07,
    -2.9220408067684723e-08,
    -4.245300749093209e-09,
    1.0791515330059881e-09,
    -3.565489982683741e-11,
    -1.5975473815046894e-11,
    1.2966971294022543e-12,
    1.0511370302754983e-13,
];

/// `erfinv(x) / x` for `w >= ERFINV_SPLIT`, in `sqrt(w) - ERFINV_TAIL_MID`, constant term first.
pub const ERFINV_TAIL: [f64; 17] = [
    4.092223423928439,
    1.009978279997614,
    0.0007127383661748767,
    -0.0006079398803289916,
    0.00021226295826884327,
    -6.420572986702938e-05,
    2.1730448368684473e-05,
    -1.0642250425321077e-05,
    6.17392821592335e-06,
    -2.7262429567506565e-06,
    1.183248660422005e-06,
    -8.105080465163281e-07,
    2.4701322887178595e-07,
    1.243586806964959e-07,
    -7.606379111995079e-08,
    -2.0242411070814833e-09,
    4.480602060371582e-09,
];

/// `(x, erfinv(x))` from 50-digit arithmetic (mpmath), rounded to f64: near 0, across both
/// polynomials and at the f64 closest to 1, for the tests of every implementation.
pub const ERFINV_CHECKS: [(f64, f64); 11] = [
    (1e-300, 8.86226925452758e-301),
    (1e-08, 8.86226925452758e-09),
    (0.1, 0.08885599049425769),
    (0.5, 0.4769362762044699),
    (0.9, 1.1630871536766743),
    (0.99, 1.8213863677184494),
    (0.998, 2.1851242191330043),
    (0.999, 2.3267537655135246),
    (0.99999999, 4.052237243268763),
    (0.9999999403953552, 3.832506856900711),
    (0.9999999999999999, 5.8635847487551676),
];

/// `p(t)` by Horner's rule with fused multiply-adds (coefficients from the constant term up),
/// in the order the kernels evaluate it.
pub fn horner(coeffs: &[f64], t: f64) -> f64 {
    coeffs.iter().rev().fold(0.0, |p, &c| p.mul_add(t, c))
}

/// The approximation of `erfinv(x)` (relative error below `1e-10`) for `|x| < 1`; `±1` give
/// `±inf`, `|x| > 1` and NaN give NaN, `-0.0` gives `-0.0`.
///
/// ```
/// let y = coil_ir::special::erfinv_approx(0.5);
/// assert!((y - 0.4769362762044699).abs() < 1e-10);
/// assert_eq!(coil_ir::special::erfinv_approx(-1.0), f64::NEG_INFINITY);
/// ```
pub fn erfinv_approx(x: f64) -> f64 {
    let a = x.abs();
    if a.is_nan() || a > 1.0 {
        return f64::NAN;
    }
    if a == 1.0 {
        return f64::INFINITY.copysign(x);
    }
    let w = -((1.0 - x) * (1.0 + x)).ln();
    let p = if w < ERFINV_SPLIT {
        horner(&ERFINV_CENTRAL, w - ERFINV_CENTRAL_MID)
    } else {
        horner(&ERFINV_TAIL, w.sqrt() - ERFINV_TAIL_MID)
    };
    x * p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against [`ERFINV_CHECKS`], across both polynomials and up to the f64 closest to 1.
    #[test]
    fn erfinv_approx_is_within_its_bound() {
        for (x, want) in ERFINV_CHECKS {
            for (x, want) in [(x, want), (-x, -want)] {
                let got = erfinv_approx(x);
                assert!((got - want).abs() <= 1.2e-10 * want.abs(), "erfinv({x}) = {got}, want {want}");
            }
        }
        assert_eq!(erfinv_approx(-0.0).to_bits(), (-0.0f64).to_bits());
        assert!(erfinv_approx(1.5).is_nan() && erfinv_approx(f64::NAN).is_nan());
    }
}
