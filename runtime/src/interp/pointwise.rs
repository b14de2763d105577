//! Pointwise primitives: unary and binary math, `where`. (Casts are [`super::Value::cast`].)
//!
//! In a primitive graph the operands already have the node's shape and one dtype, so every op
//! here is a map over aligned elements. Float results are computed in f64 and rounded to the
//! node's dtype; multi-step formulas (floor division) round after every step, as PyTorch's
//! kernels do in the dtype's arithmetic. Integer results are computed in i64 with wrapping and
//! wrapped to the node's width.

use super::math;
use super::{round_float, wrap_int, Data, Value};
use coil_ir::{BinaryOp, DType, Error, Result, UnaryOp};

/// `op(x)` with result dtype `out`.
pub(super) fn unary(op: UnaryOp, x: &Value, out: DType) -> Data {
    use UnaryOp::*;
    if op.returns_bool() {
        let test: Vec<i64> = match &x.data {
            Data::F(v) => v
                .iter()
                .map(|&a| match op {
                    IsNan => a.is_nan(),
                    IsInf => a.is_infinite(),
                    _ => a == 0.0,
                } as i64)
                .collect(),
            Data::I(v) => v.iter().map(|&a| (op == LogicalNot && a == 0) as i64).collect(),
        };
        return Data::I(test);
    }
    if out.is_float() {
        // Integer operands of float-only ops are converted to the result dtype first.
        let xs = x.cast(out);
        return Data::F(xs.floats().iter().map(|&a| round_float(out, unary_float(op, a))).collect());
    }
    let ys = x.ints().iter().map(|&a| match op {
        BitwiseNot if out == DType::Bool => (a == 0) as i64,
        BitwiseNot => !a,
        Neg => a.wrapping_neg(),
        Abs => a.wrapping_abs(),
        Sign => a.signum(),
        Floor | Ceil | Round | Trunc => a,
        _ => unreachable!("{} on integers yields a float", op.name()),
    });
    Data::I(ys.map(|a| wrap_int(out, a)).collect())
}

/// A unary function on one float.
fn unary_float(op: UnaryOp, a: f64) -> f64 {
    use UnaryOp::*;
    match op {
        Neg => -a,
        Abs => a.abs(),
        // PyTorch computes `(0 < a) - (a < 0)`: sign(nan) = 0 and sign(-0.0) = +0.0.
        Sign => ((0.0 < a) as i64 - (a < 0.0) as i64) as f64,
        Exp => a.exp(),
        Exp2 => a.exp2(),
        Expm1 => a.exp_m1(),
        Log => a.ln(),
        Log2 => a.log2(),
        Log1p => a.ln_1p(),
        Sqrt => a.sqrt(),
        Rsqrt => 1.0 / a.sqrt(),
        Sin => a.sin(),
        Cos => a.cos(),
        Tan => a.tan(),
        Atan => a.atan(),
        Asin => a.asin(),
        Acos => a.acos(),
        Tanh => a.tanh(),
        Sigmoid => 1.0 / (1.0 + (-a).exp()),
        Erf => math::erf(a),
        Erfc => math::erfc(a),
        Erfinv => math::erfinv(a),
        Floor => a.floor(),
        Ceil => a.ceil(),
        Round => a.round_ties_even(),
        Trunc => a.trunc(),
        Reciprocal => 1.0 / a,
        LogicalNot | IsNan | IsInf => unreachable!("boolean unary op"),
        BitwiseNot => unreachable!("bitwise_not of a float"),
    }
}

/// `op(a, b)` with result dtype `out`. Comparisons and logical ops compute in the operands'
/// dtype; the others compute in `out` (true division converts integer operands to it first).
pub(super) fn binary(op: BinaryOp, a: &Value, b: &Value, out: DType) -> Result<Data> {
    let compute = if op.returns_bool() { a.dtype } else { out };
    let (a, b) = (a.cast(compute), b.cast(compute));
    if compute.is_float() {
        let (xs, ys) = (a.floats(), b.floats());
        if op.returns_bool() {
            return Ok(Data::I(xs.iter().zip(ys).map(|(&x, &y)| compare(op, x, y) as i64).collect()));
        }
        let r = |v: f64| round_float(compute, v);
        return Ok(Data::F(xs.iter().zip(ys).map(|(&x, &y)| r(binary_float(op, x, y, r))).collect()));
    }
    let (xs, ys) = (a.ints(), b.ints());
    if op.returns_bool() {
        return Ok(Data::I(xs.iter().zip(ys).map(|(&x, &y)| compare(op, x, y) as i64).collect()));
    }
    let zs = xs.iter().zip(ys).map(|(&x, &y)| binary_int(op, x, y, out).map(|z| wrap_int(out, z)));
    Ok(Data::I(zs.collect::<Result<_>>()?))
}

/// Comparisons and logical ops, for floats (NaN compares false except `ne`; NaN is truthy) and
/// integers alike.
pub(crate) fn compare<T: PartialOrd + Default>(op: BinaryOp, x: T, y: T) -> bool {
    use BinaryOp::*;
    let zero = T::default();
    match op {
        Eq => x == y,
        Ne => x != y,
        Lt => x < y,
        Le => x <= y,
        Gt => x > y,
        Ge => x >= y,
        LogicalAnd => x != zero && y != zero,
        LogicalOr => x != zero || y != zero,
        _ => unreachable!("{} is not a comparison", op.name()),
    }
}

/// A binary function on floats; `r` rounds to the computation dtype (for multi-step formulas).
fn binary_float(op: BinaryOp, x: f64, y: f64, r: impl Fn(f64) -> f64) -> f64 {
    use BinaryOp::*;
    match op {
        Add => x + y,
        Sub => x - y,
        Mul => x * y,
        Div => x / y,
        FloorDiv => math::div_floor(x, y, r),
        TruncDiv => r(x / y).trunc(),
        Remainder => math::remainder(x, y),
        Pow => x.powf(y),
        Maximum | Minimum => op.max_min(x, y),
        Atan2 => x.atan2(y),
        BitwiseAnd | BitwiseOr | BitwiseXor | ShiftLeft | ShiftRight => unreachable!("{} of floats", op.name()),
        _ => unreachable!("{} returns bool", op.name()),
    }
}

/// A binary function on integers of `dtype` (wrapping in i64; the caller wraps to the dtype's
/// width).
pub(crate) fn binary_int(op: BinaryOp, x: i64, y: i64, dtype: DType) -> Result<i64> {
    use BinaryOp::*;
    let nonzero = || if y == 0 { Err(Error::value("ZeroDivisionError: integer division by zero")) } else { Ok(()) };
    Ok(match op {
        Add => x.wrapping_add(y),
        Sub => x.wrapping_sub(y),
        Mul => x.wrapping_mul(y),
        FloorDiv => {
            nonzero()?;
            let (q, rem) = (x.wrapping_div(y), x.wrapping_rem(y));
            if rem != 0 && (rem < 0) != (y < 0) {
                q - 1
            } else {
                q
            }
        }
        TruncDiv => {
            nonzero()?;
            x.wrapping_div(y)
        }
        Remainder => {
            nonzero()?;
            let rem = x.wrapping_rem(y);
            if rem != 0 && (rem < 0) != (y < 0) {
                rem + y
            } else {
                rem
            }
        }
        Pow => math::pow_int(x, y)?,
        Maximum => x.max(y),
        Minimum => x.min(y),
        BitwiseAnd => x & y,
        BitwiseOr => x | y,
        BitwiseXor => x ^ y,
        ShiftLeft | ShiftRight => op.shift(x, y, dtype),
        Div | Atan2 => unreachable!("{} yields a float", op.name()),
        _ => unreachable!("{} returns bool", op.name()),
    })
}

/// `where(cond, x, y)` with result dtype `out`.
pub(super) fn where_(cond: &Value, x: &Value, y: &Value, out: DType) -> Data {
    let (x, y) = (x.cast(out), y.cast(out));
    let c = cond.ints();
    match (&x.data, &y.data) {
        (Data::F(xs), Data::F(ys)) => Data::F((0..c.len()).map(|i| if c[i] != 0 { xs[i] } else { ys[i] }).collect()),
        (Data::I(xs), Data::I(ys)) => Data::I((0..c.len()).map(|i| if c[i] != 0 { xs[i] } else { ys[i] }).collect()),
        _ => unreachable!("where operands were cast to one dtype"),
    }
}
