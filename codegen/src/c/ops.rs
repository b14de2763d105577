//! C expressions for values: types, conversions, literals, loads and stores, and the scalar ops.
//!
//! Every value lives in its dtype's *compute type*: `float` for f16, bf16 and f32 (f16/bf16 are
//! rounded only when stored or explicitly cast, as Inductor does), `double` for f64, `int64_t`
//! for every integer dtype (wrapped to the dtype's width by a C cast after each op that can
//! leave it) and `uint8_t` 0/1 for bool. Operands are always variable references (`tmp3` or
//! `tmp3[rindex]`), so no expression here needs protection from operator precedence except
//! where it is composed further, and there it is parenthesized.

use coil_ir::{BinaryOp, DType, Scalar, UnaryOp};

/// The C type a value of `d` is computed in.
pub(crate) fn compute_type(d: DType) -> &'static str {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => "float",
        DType::F64 => "double",
        DType::Bool => "uint8_t",
        _ => "int64_t",
    }
}

/// The C element type of a buffer of `d`.
pub(super) fn storage_type(d: DType) -> &'static str {
    match d {
        DType::Bool | DType::U8 => "uint8_t",
        DType::I8 => "int8_t",
        DType::I16 => "int16_t",
        DType::I32 => "int32_t",
        DType::I64 => "int64_t",
        DType::F16 | DType::BF16 => "uint16_t",
        DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// Name suffix of the float helpers (`coil_floordiv_f32`) and of libm (`expf`) for a float dtype.
fn float_suffixes(d: DType) -> (&'static str, &'static str) {
    if d == DType::F64 {
        ("_f64", "")
    } else {
        ("_f32", "f")
    }
}

/// Wraps an `int64_t` expression to the width of an integer dtype, as a C cast does.
fn wrap(e: &str, to: DType) -> String {
    match to {
        DType::I64 => e.to_string(),
        DType::Bool => format!("(uint8_t)(({e}) != 0)"),
        _ => format!("(int64_t)({})({e})", storage_type(to)),
    }
}

/// `e`, a value of `from` in its compute type, converted to `to` as the interpreter's cast
/// does: floats to integers truncate (NaN -> 0, saturating), then wrap; anything to bool is
/// `!= 0` (NaN is true); integers to f16/bf16 go through f32; every float result is rounded to
/// its dtype once.
pub(super) fn convert(e: &str, from: DType, to: DType) -> String {
    if from == to {
        return e.to_string();
    }
    match to {
        DType::Bool => format!("(uint8_t)(({e}) != 0)"),
        DType::F64 => format!("(double)({e})"),
        DType::F32 if from == DType::F16 || from == DType::BF16 => e.to_string(),
        DType::F32 => format!("(float)({e})"),
        DType::F16 => format!("coil_round_f16((float)({e}))"),
        DType::BF16 => format!("coil_round_bf16((float)({e}))"),
        _ if from.is_float() => wrap(&format!("coil_f2i((double)({e}))"), to),
        _ => wrap(e, to),
    }
}

/// A constant of dtype `d` as a C literal of its compute type, rounded or wrapped to `d` first.
pub(super) fn literal(s: Scalar, d: DType) -> String {
    if d.is_float() {
        let x = s.as_f64();
        let x = match d {
            DType::F16 => half::f16::from_f32(x as f32).to_f64(),
            DType::BF16 => half::bf16::from_f32(x as f32).to_f64(),
            DType::F32 => x as f32 as f64,
            _ => x,
        };
        return match () {
            _ if x.is_nan() => "NAN".into(),
            _ if x.is_infinite() => if x > 0.0 { "INFINITY" } else { "-INFINITY" }.into(),
            // `{:?}` prints the shortest text that reads back to the same value.
            _ if d == DType::F64 => format!("{x:?}"),
            _ => format!("{:?}f", x as f32),
        };
    }
    let i = match s {
        Scalar::Bool(b) => b as i64,
        Scalar::Int(i) => i,
        Scalar::Float(x) if d == DType::Bool => (x != 0.0) as i64,
        Scalar::Float(x) => x as i64, // truncates, NaN -> 0, saturates: the interpreter's cast
    };
    let i = match d {
        DType::Bool => (i != 0) as i64,
        DType::U8 => i as u8 as i64,
        DType::I8 => i as i8 as i64,
        DType::I16 => i as i16 as i64,
        DType::I32 => i as i32 as i64,
        _ => i,
    };
    if i == i64::MIN {
        "INT64_MIN".into()
    } else {
        i.to_string()
    }
}

/// `ptr[index]` of a buffer of `buf`, as a value of `val`.
pub(super) fn load(ptr: &str, index: &str, buf: DType, val: DType) -> String {
    let raw = format!("{ptr}[{index}]");
    let e = match buf {
        DType::F16 => format!("coil_f16_to_f32({raw})"),
        DType::BF16 => format!("coil_bf16_to_f32({raw})"),
        DType::Bool | DType::F32 | DType::F64 => raw,
        _ => format!("(int64_t){raw}"),
    };
    convert(&e, buf, val)
}

/// The element to store for a value `e` of `val` into a buffer of `buf`.
pub(super) fn store_value(e: &str, val: DType, buf: DType) -> String {
    let e = convert(e, val, buf);
    match buf {
        DType::F16 => format!("coil_f32_to_f16({e})"),
        DType::BF16 => format!("coil_f32_to_bf16({e})"),
        DType::Bool | DType::F32 | DType::F64 | DType::I64 => e,
        _ => format!("({})({e})", storage_type(buf)),
    }
}

/// `op(a)` with `a` of `da` and a result of `out`, as the interpreter computes it: float-only
/// ops convert an integer operand to the result dtype first.
pub(crate) fn unary(op: UnaryOp, a: &str, da: DType, out: DType) -> String {
    use UnaryOp::*;
    if op.returns_bool() {
        let e = match op {
            IsNan if da.is_float() => format!("(uint8_t)(isnan({a}) != 0)"),
            IsInf if da.is_float() => format!("(uint8_t)(isinf({a}) != 0)"),
            IsNan | IsInf => "(uint8_t)0".into(),
            _ => format!("(uint8_t)({a} == 0)"),
        };
        return convert(&e, DType::Bool, out);
    }
    if out.is_float() {
        let a = convert(a, da, out);
        let (s, m) = float_suffixes(out);
        let one = if out == DType::F64 { "1.0" } else { "1.0f" };
        let call = |f: &str| format!("{f}{m}({a})");
        // f32 (f16, bf16) in C: the prelude's vectorizable functions; f64, and CUDA: the
        // library's.
        let own = super::PRELUDE_MATH && out != DType::F64;
        let math = |f: &str| if own { format!("coil_{f}_f32({a})") } else { call(f) };
        return match op {
            Neg => format!("-{a}"),
            Abs => call("fabs"),
            Sign => format!("coil_sign{s}({a})"),
            Exp => math("exp"),
            Exp2 => math("exp2"),
            Expm1 => math("expm1"),
            Log => math("log"),
            Log2 => math("log2"),
            Log1p => math("log1p"),
            Sqrt => call("sqrt"),
            Rsqrt => format!("{one} / sqrt{m}({a})"),
            Sin => math("sin"),
            Cos => math("cos"),
            Tan => math("tan"),
            Atan => math("atan"),
            Asin => math("asin"),
            Acos => math("acos"),
            Tanh => math("tanh"),
            Sigmoid if own => format!("coil_sigmoid_f32({a})"),
            Sigmoid => format!("{one} / ({one} + exp{m}(-{a}))"),
            Erf => math("erf"),
            // The C and CUDA libraries' erfc (no cancellation for large x).
            Erfc => call("erfc"),
            // C has no erfinv: the preludes define it (CUDA's calls the math library's)
            Erfinv => format!("coil_erfinv{s}({a})"),
            Floor => call("floor"),
            Ceil => call("ceil"),
            Round => call("nearbyint"), // the default rounding mode: half to even
            Trunc => call("trunc"),
            Reciprocal => format!("{one} / {a}"),
            LogicalNot | IsNan | IsInf | BitwiseNot => unreachable!(),
        };
    }
    let e = match op {
        BitwiseNot if out == DType::Bool => format!("({a} == 0)"),
        BitwiseNot => format!("~{a}"),
        Neg => format!("coil_wneg({a})"),
        Abs => format!("({a} < 0 ? coil_wneg({a}) : {a})"),
        Sign => format!("(int64_t)(({a} > 0) - ({a} < 0))"),
        Floor | Ceil | Round | Trunc => a.to_string(),
        _ => panic!("{} of an integer yields a float, not {out}", op.name()),
    };
    wrap(&e, out)
}

/// `op(a, b)` with operands of `da` / `db` and a result of `out`. Comparisons and logical ops
/// compute in the first operand's dtype; the others in the result's (true division converts
/// integers to it first). Integer ops that can fail take `status`.
pub(crate) fn binary(op: BinaryOp, a: &str, da: DType, b: &str, db: DType, out: DType) -> String {
    use BinaryOp::*;
    if op.returns_bool() {
        let b = convert(b, db, da);
        let e = match op {
            Eq => format!("({a} == {b})"),
            Ne => format!("({a} != {b})"),
            Lt => format!("({a} < {b})"),
            Le => format!("({a} <= {b})"),
            Gt => format!("({a} > {b})"),
            Ge => format!("({a} >= {b})"),
            LogicalAnd => format!("({a} != 0 && {b} != 0)"),
            _ => format!("({a} != 0 || {b} != 0)"),
        };
        return convert(&format!("(uint8_t){e}"), DType::Bool, out);
    }
    let (a, b) = (convert(a, da, out), convert(b, db, out));
    if out.is_float() {
        let (s, m) = float_suffixes(out);
        return match op {
            Add => format!("{a} + {b}"),
            Sub => format!("{a} - {b}"),
            Mul => format!("{a} * {b}"),
            Div => format!("{a} / {b}"),
            FloorDiv => format!("coil_floordiv{s}({a}, {b})"),
            TruncDiv => format!("trunc{m}({a} / {b})"),
            Remainder => format!("coil_remainder{s}({a}, {b})"),
            Pow if super::PRELUDE_MATH && out != DType::F64 => format!("coil_pow_f32({a}, {b})"),
            Pow => format!("pow{m}({a}, {b})"),
            Maximum => format!("coil_maximum{s}({a}, {b})"),
            Minimum => format!("coil_minimum{s}({a}, {b})"),
            Atan2 if super::PRELUDE_MATH && out != DType::F64 => format!("coil_atan2_f32({a}, {b})"),
            Atan2 => format!("atan2{m}({a}, {b})"),
            _ => unreachable!(),
        };
    }
    // The shift amount is compared in the operands' dtype (`BinaryOp::shift`): shifting by the
    // width or more is undefined in C, so the limits are selected before the shift.
    let bits = 8 * out.size_bytes();
    let limit = if out == DType::U8 { bits } else { bits - 1 };
    let e = match op {
        Add => format!("coil_wadd({a}, {b})"),
        Sub => format!("coil_wsub({a}, {b})"),
        Mul => format!("coil_wmul({a}, {b})"),
        FloorDiv => format!("coil_ifloordiv({a}, {b}, status)"),
        TruncDiv => format!("coil_itruncdiv({a}, {b}, status)"),
        Remainder => format!("coil_iremainder({a}, {b}, status)"),
        Pow => format!("coil_ipow({a}, {b}, status)"),
        Maximum => format!("({a} > {b} ? {a} : {b})"),
        Minimum => format!("({a} < {b} ? {a} : {b})"),
        BitwiseAnd => format!("({a} & {b})"),
        BitwiseOr => format!("({a} | {b})"),
        BitwiseXor => format!("({a} ^ {b})"),
        ShiftLeft => format!("(({b} < 0 || {b} >= {bits}) ? (int64_t)0 : (int64_t)((uint64_t){a} << {b}))"),
        ShiftRight => format!("({a} >> (({b} < 0 || {b} >= {limit}) ? (int64_t){limit} : {b}))"),
        Div | Atan2 => panic!("{} yields a float, not {out}", op.name()),
        _ => unreachable!(),
    };
    wrap(&e, out)
}

/// Whether `op` on a result of `out` may write `status` (such loops are not marked `simd`).
pub(super) fn binary_may_fail(op: BinaryOp, out: DType) -> bool {
    !out.is_float() && matches!(op, BinaryOp::FloorDiv | BinaryOp::TruncDiv | BinaryOp::Remainder | BinaryOp::Pow)
}
