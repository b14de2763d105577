//! The pointwise primitives' functions: [`UnaryOp`] and [`BinaryOp`], their names (PyTorch's),
//! the dtype classes they accept and return, and the semantics every backend shares where a
//! formula decides them (NaN-propagating `maximum`, shifts by out-of-range amounts).

use crate::dtype::DType;

/// Pointwise functions of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// -1, 0 or 1 by the sign of `x` (0 for NaN, as PyTorch).
    Sign,
    /// `e^x`.
    Exp,
    /// `2^x`.
    Exp2,
    /// `e^x - 1`, accurate near 0.
    Expm1,
    /// The natural logarithm.
    Log,
    /// The base-2 logarithm.
    Log2,
    /// `ln(1 + x)`, accurate near 0.
    Log1p,
    /// The square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// Sine, in radians.
    Sin,
    /// Cosine, in radians.
    Cos,
    /// Tangent, in radians.
    Tan,
    /// `torch.atan`, in `[-pi/2, pi/2]`.
    Atan,
    /// `torch.asin`: NaN outside `[-1, 1]`.
    Asin,
    /// `torch.acos`: NaN outside `[-1, 1]`.
    Acos,
    /// The hyperbolic tangent.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// The error function.
    Erf,
    /// `torch.erfc`: `1 - erf(x)` computed without the cancellation (full precision for large x).
    Erfc,
    /// `torch.erfinv`: the inverse of `erf` on `(-1, 1)`; `±1` give `±inf`, `|x| > 1` NaN.
    Erfinv,
    /// The largest integer not above `x`.
    Floor,
    /// The smallest integer not below `x`.
    Ceil,
    /// Round half to even, as `torch.round`.
    Round,
    /// Rounds toward zero.
    Trunc,
    /// `1 / x`.
    Reciprocal,
    /// Bool: `x` is zero.
    LogicalNot,
    /// Bool: `x` is NaN.
    IsNan,
    /// Bool: `x` is `±inf`.
    IsInf,
    /// `torch.bitwise_not`: `~x` of integers, `logical_not` of bools; no floats.
    BitwiseNot,
}

impl UnaryOp {
    /// Every unary op, in declaration order.
    pub const ALL: [UnaryOp; 31] = {
        use UnaryOp::*;
        [
            Neg, Abs, Sign, Exp, Exp2, Expm1, Log, Log2, Log1p, Sqrt, Rsqrt, Sin, Cos, Tan, Atan, Asin, Acos, Tanh,
            Sigmoid, Erf, Erfc, Erfinv, Floor, Ceil, Round, Trunc, Reciprocal, LogicalNot, IsNan, IsInf, BitwiseNot,
        ]
    };

    /// The op's name in printed graphs and generated code (PyTorch's: `neg`, `rsqrt`, ...).
    pub fn name(self) -> &'static str {
        use UnaryOp::*;
        match self {
            Neg => "neg",
            Abs => "abs",
            Sign => "sign",
            Exp => "exp",
            Exp2 => "exp2",
            Expm1 => "expm1",
            Log => "log",
            Log2 => "log2",
            Log1p => "log1p",
            Sqrt => "sqrt",
            Rsqrt => "rsqrt",
            Sin => "sin",
            Cos => "cos",
            Tan => "tan",
            Atan => "atan",
            Asin => "asin",
            Acos => "acos",
            Tanh => "tanh",
            Sigmoid => "sigmoid",
            Erf => "erf",
            Erfc => "erfc",
            Erfinv => "erfinv",
            Floor => "floor",
            Ceil => "ceil",
            Round => "round",
            Trunc => "trunc",
            Reciprocal => "reciprocal",
            LogicalNot => "logical_not",
            IsNan => "isnan",
            IsInf => "isinf",
            BitwiseNot => "bitwise_not",
        }
    }

    /// Transcendental ops compute in floating point: integer inputs give the default float.
    pub fn float_only(self) -> bool {
        use UnaryOp::*;
        matches!(
            self,
            Exp | Exp2
                | Expm1
                | Log
                | Log2
                | Log1p
                | Sqrt
                | Rsqrt
                | Sin
                | Cos
                | Tan
                | Atan
                | Asin
                | Acos
                | Tanh
                | Sigmoid
                | Erf
                | Erfc
                | Erfinv
                | Reciprocal
        )
    }

    /// Bit ops take integers and bools only (PyTorch has no kernel of them for floats).
    pub fn integral_only(self) -> bool {
        self == UnaryOp::BitwiseNot
    }

    /// Ops whose result is `bool` whatever the operand.
    pub fn returns_bool(self) -> bool {
        matches!(self, UnaryOp::LogicalNot | UnaryOp::IsNan | UnaryOp::IsInf)
    }
}

/// Pointwise functions of two operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// True division: integers divide as floats.
    Div,
    /// `div(rounding_mode="floor")`.
    FloorDiv,
    /// `div(rounding_mode="trunc")`.
    TruncDiv,
    /// `torch.remainder`: the result has the sign of the divisor.
    Remainder,
    /// `a` to the power `b`.
    Pow,
    /// `torch.maximum`: NaN propagates; a tie of `+0.0` and `-0.0` gives the first operand
    /// ([`BinaryOp::max_min`]).
    Maximum,
    /// `torch.minimum`: NaN propagates; a tie of `+0.0` and `-0.0` gives the first operand.
    Minimum,
    /// Bool: `a == b`.
    Eq,
    /// Bool: `a != b`.
    Ne,
    /// Bool: `a < b`.
    Lt,
    /// Bool: `a <= b`.
    Le,
    /// Bool: `a > b`.
    Gt,
    /// Bool: `a >= b`.
    Ge,
    /// Bool: both nonzero.
    LogicalAnd,
    /// Bool: either nonzero.
    LogicalOr,
    /// `torch.atan2(y, x)`: the angle of the point `(x, y)`, in `[-pi, pi]`; integers divide as
    /// floats.
    Atan2,
    /// `torch.bitwise_and` of integers or bools (`&`).
    BitwiseAnd,
    /// `torch.bitwise_or` of integers or bools (`|`).
    BitwiseOr,
    /// `torch.bitwise_xor` of integers or bools (`^`).
    BitwiseXor,
    /// `torch.bitwise_left_shift` of integers (`<<`): a shift by a negative amount or by the
    /// width or more gives 0 ([`BinaryOp::shift`]).
    ShiftLeft,
    /// `torch.bitwise_right_shift` of integers (`>>`), arithmetic for signed dtypes: a shift by
    /// a negative amount or past the value bits fills with the sign ([`BinaryOp::shift`]).
    ShiftRight,
}

impl BinaryOp {
    /// Every binary op, in declaration order.
    pub const ALL: [BinaryOp; 24] = {
        use BinaryOp::*;
        [
            Add, Sub, Mul, Div, FloorDiv, TruncDiv, Remainder, Pow, Maximum, Minimum, Eq, Ne, Lt, Le, Gt, Ge,
            LogicalAnd, LogicalOr, Atan2, BitwiseAnd, BitwiseOr, BitwiseXor, ShiftLeft, ShiftRight,
        ]
    };

    /// The op's name in printed graphs and generated code (PyTorch's: `add`, `floor_divide`, ...).
    pub fn name(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div => "div",
            FloorDiv => "floor_divide",
            TruncDiv => "trunc_divide",
            Remainder => "remainder",
            Pow => "pow",
            Maximum => "maximum",
            Minimum => "minimum",
            Eq => "eq",
            Ne => "ne",
            Lt => "lt",
            Le => "le",
            Gt => "gt",
            Ge => "ge",
            LogicalAnd => "logical_and",
            LogicalOr => "logical_or",
            Atan2 => "atan2",
            BitwiseAnd => "bitwise_and",
            BitwiseOr => "bitwise_or",
            BitwiseXor => "bitwise_xor",
            ShiftLeft => "bitwise_left_shift",
            ShiftRight => "bitwise_right_shift",
        }
    }

    /// Comparisons and logical ops return `bool`.
    pub fn returns_bool(self) -> bool {
        use BinaryOp::*;
        matches!(self, Eq | Ne | Lt | Le | Gt | Ge | LogicalAnd | LogicalOr)
    }

    /// True division and `atan2` compute in floating point: integer operands give the default
    /// float.
    pub fn float_only(self) -> bool {
        matches!(self, BinaryOp::Div | BinaryOp::Atan2)
    }

    /// Bit ops take integers (and bools, except the shifts) only.
    pub fn integral_only(self) -> bool {
        use BinaryOp::*;
        matches!(self, BitwiseAnd | BitwiseOr | BitwiseXor | ShiftLeft | ShiftRight)
    }

    /// [`BinaryOp::ShiftLeft`] (else [`BinaryOp::ShiftRight`]) of integers of `dtype` (`a` and
    /// `b` its values, sign- or zero-extended to i64), as PyTorch's CPU kernels compute it: the
    /// amount `b` is taken in `dtype` too; a left shift by `b < 0` or `b >= bits` is 0 (bits
    /// shifted out of the dtype are lost: the caller wraps the result to its width); a right
    /// shift by `b < 0` or `b >= bits - 1` (signed) / `bits` (`u8`) shifts by that limit, which
    /// leaves the sign fill: -1 or 0. (`1 << 63` in i64 is `i64::MIN`; `-1 >> 100` is -1.)
    ///
    /// ```
    /// use coil_ir::{BinaryOp, DType};
    /// assert_eq!(BinaryOp::ShiftLeft.shift(3, 2, DType::I32), 12);
    /// assert_eq!(BinaryOp::ShiftLeft.shift(3, 32, DType::I32), 0);
    /// assert_eq!(BinaryOp::ShiftRight.shift(-7, 1, DType::I8), -4);
    /// assert_eq!(BinaryOp::ShiftRight.shift(-7, -1, DType::I64), -1);
    /// assert_eq!(BinaryOp::ShiftRight.shift(200, 9, DType::U8), 0);
    /// ```
    pub fn shift(self, a: i64, b: i64, dtype: DType) -> i64 {
        let bits = 8 * dtype.size_bytes() as i64;
        if self == BinaryOp::ShiftLeft {
            if (0..bits).contains(&b) {
                ((a as u64) << b) as i64
            } else {
                0
            }
        } else {
            let limit = if dtype == DType::U8 { bits } else { bits - 1 };
            a >> if (0..limit).contains(&b) { b } else { limit }
        }
    }

    /// [`BinaryOp::Maximum`] (else [`BinaryOp::Minimum`]) of two floats, as every backend
    /// computes it: NaN if either is NaN; on a tie of `+0.0` and `-0.0`, the first operand, so
    /// that `relu(x) = maximum(x, 0)` of `-0.0` is `-0.0` and `clamp` keeps `x` at an equal
    /// bound, as PyTorch's do.
    pub fn max_min(self, a: f64, b: f64) -> f64 {
        let b_wins = if self == BinaryOp::Maximum { b > a } else { b < a };
        match () {
            _ if a.is_nan() || b.is_nan() => f64::NAN,
            _ if b_wins => b,
            _ => a,
        }
    }
}
