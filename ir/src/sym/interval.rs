//! Interval arithmetic over i128 with explicit infinities: the range facts the simplifier
//! consults ([`super::Expr::bounds`]).

use super::*;

// ---------------------------------------------------------------------------------------------
// Interval arithmetic. Bounds are i128 where any magnitude >= INF means "unbounded that way";
// infinities are propagated explicitly rather than by arithmetic, so a huge finite value can
// never cancel an infinity back into range.

const INF: i128 = i128::MAX / 4;
type Iv = (i128, i128);

fn is_inf(v: i128) -> bool {
    v.abs() >= INF
}
fn xadd(a: i128, b: i128) -> i128 {
    if is_inf(a) {
        a
    } else if is_inf(b) {
        b
    } else {
        (a + b).clamp(-INF, INF)
    }
}
fn xmul(a: i128, b: i128) -> i128 {
    let sign = a.signum() * b.signum();
    if sign == 0 {
        0
    } else if is_inf(a) || is_inf(b) {
        sign * INF
    } else {
        a.checked_mul(b).map_or(sign * INF, |p| p.clamp(-INF, INF))
    }
}
fn xdiv(a: i128, b: i128) -> i128 {
    if is_inf(a) {
        a.signum() * b.signum() * INF
    } else if is_inf(b) {
        // floor(a / b) for huge |b| is 0, or -1 when the signs differ.
        if a == 0 || (a > 0) == (b > 0) {
            0
        } else {
            -1
        }
    } else {
        let q = a / b;
        if q * b != a && (a < 0) != (b < 0) {
            q - 1
        } else {
            q
        }
    }
}
fn hull(ivs: impl IntoIterator<Item = Iv>) -> Iv {
    ivs.into_iter().reduce(|x, y| (x.0.min(y.0), x.1.max(y.1))).unwrap_or((-INF, INF))
}
fn corners(a: Iv, b: Iv, f: fn(i128, i128) -> i128) -> Iv {
    let c = [f(a.0, b.0), f(a.0, b.1), f(a.1, b.0), f(a.1, b.1)];
    (*c.iter().min().unwrap(), *c.iter().max().unwrap())
}
/// The divisor's interval without 0, as up to two intervals of one sign each.
fn nonzero_parts(b: Iv) -> impl Iterator<Item = Iv> {
    let neg = (b.0 <= -1).then(|| (b.0, b.1.min(-1)));
    let pos = (b.1 >= 1).then(|| (b.0.max(1), b.1));
    neg.into_iter().chain(pos)
}
/// Floor division is monotone in each operand while the divisor keeps one sign, so the
/// extremes are at the corners.
fn div_iv(a: Iv, b: Iv) -> Iv {
    hull(nonzero_parts(b).map(|p| corners(a, p, xdiv)))
}
fn mod_iv(a: Iv, b: Iv) -> Iv {
    hull(nonzero_parts(b).map(|(b1, b2)| {
        if b1 > 0 {
            if a.0 >= 0 && a.1 < b1 {
                a // a % b == a
            } else if a.0 >= 0 {
                (0, xadd(b2, -1).min(a.1)) // 0 <= a % b <= a
            } else {
                (0, xadd(b2, -1))
            }
        } else if a.1 <= 0 && a.0 > b2 {
            a
        } else if a.1 <= 0 {
            (xadd(b1, 1).max(a.0), 0)
        } else {
            (xadd(b1, 1), 0)
        }
    }))
}

pub(super) fn iv(e: Expr) -> Iv {
    let (lo, hi) = e.bounds();
    (lo.map_or(-INF, i128::from), hi.map_or(INF, i128::from))
}
fn narrow(v: i128) -> Option<i64> {
    if is_inf(v) {
        None
    } else {
        i64::try_from(v).ok()
    }
}

pub(super) fn node_bounds(kind: &ExprKind) -> (Option<i64>, Option<i64>) {
    let (lo, hi) = match kind {
        ExprKind::Const(c) => return (Some(*c), Some(*c)),
        ExprKind::Symbol(s) => return (s.lo, s.hi),
        ExprKind::Add { terms, constant } => {
            let k = i128::from(*constant);
            terms.iter().fold((k, k), |(lo, hi), &(t, c)| {
                let (tl, th) = corners(iv(t), (c.into(), c.into()), xmul);
                (xadd(lo, tl), xadd(hi, th))
            })
        }
        ExprKind::Mul { coeff, factors } => {
            let k = i128::from(*coeff);
            factors.iter().fold((k, k), |acc, &f| corners(acc, iv(f), xmul))
        }
        ExprKind::FloorDiv(a, b) => div_iv(iv(*a), iv(*b)),
        ExprKind::Mod(a, b) => mod_iv(iv(*a), iv(*b)),
        ExprKind::Min(a, b) => (iv(*a).0.min(iv(*b).0), iv(*a).1.min(iv(*b).1)),
        ExprKind::Max(a, b) => (iv(*a).0.max(iv(*b).0), iv(*a).1.max(iv(*b).1)),
    };
    (narrow(lo), narrow(hi))
}
