//! Pointwise evaluation of the tier-0 executor over chunks of elements.
//!
//! Every value lives in its dtype's compute type while a region runs, as in generated kernels
//! (`coil_codegen::c::ops`): f32 for f16, bf16 and f32 (rounded to the half types only when
//! stored or cast), f64 for f64, i64 for the integers (wrapped to the dtype's width after each
//! op that can leave it) and bool (0 / 1). Float math goes through the prebuilt chunk kernels
//! ([`super::math`]): the code generator's own expressions; comparisons, selects, casts and
//! integer arithmetic are the plain loops below.

use super::math::{call_binary, call_unary, Math};
use crate::cpu::Kernel;
use crate::HostData;
use coil_ir::{BinaryOp, DType, Op, Result, Scalar, UnaryOp};
use half::{bf16, f16};

/// A chunk of values in one compute type.
#[derive(Clone, Debug)]
pub(super) enum Chunk {
    /// f32 (f16, bf16, f32 values).
    F(Vec<f32>),
    /// f64 values.
    D(Vec<f64>),
    /// Integer and bool values, wrapped to their dtype.
    I(Vec<i64>),
}

/// Values of one compute type read in place: a chunk's, or a stored value's own elements.
#[derive(Clone, Copy, Debug)]
pub(super) enum Val<'a> {
    /// f32 (f16, bf16, f32 values).
    F(&'a [f32]),
    /// f64 values.
    D(&'a [f64]),
    /// Integer and bool values, wrapped to their dtype.
    I(&'a [i64]),
}

impl<'a> Val<'a> {
    /// Elements `start .. start + n` of a stored value whose elements are its compute type's
    /// (f32, f64, i64): read in place, not copied into a chunk. `None` for other dtypes.
    pub fn of(data: &'a HostData, start: usize, n: usize) -> Option<Val<'a>> {
        match data {
            HostData::F32(v) => Some(Val::F(&v[start..start + n])),
            HostData::F64(v) => Some(Val::D(&v[start..start + n])),
            HostData::I64(v) => Some(Val::I(&v[start..start + n])),
            _ => None,
        }
    }

    /// Stores the values into `out` (of the value's dtype) at `at ..`: the one rounding of f16
    /// and bf16 values.
    pub fn store(self, out: &mut Dest, at: usize) {
        macro_rules! put {
            ($o:expr, $v:expr, $f:expr) => {
                for (o, &x) in $o[at..at + $v.len()].iter_mut().zip($v.iter()) {
                    *o = $f(x);
                }
            };
        }
        match (self, out) {
            (Val::F(v), Dest::F32(o)) => o[at..at + v.len()].copy_from_slice(v),
            (Val::F(v), Dest::F16(o)) => put!(o, v, f16::from_f32),
            (Val::F(v), Dest::BF16(o)) => put!(o, v, bf16::from_f32),
            (Val::D(v), Dest::F64(o)) => o[at..at + v.len()].copy_from_slice(v),
            (Val::I(v), Dest::Bool(o)) => put!(o, v, |x: i64| x != 0),
            (Val::I(v), Dest::U8(o)) => put!(o, v, |x: i64| x as u8),
            (Val::I(v), Dest::I8(o)) => put!(o, v, |x: i64| x as i8),
            (Val::I(v), Dest::I16(o)) => put!(o, v, |x: i64| x as i16),
            (Val::I(v), Dest::I32(o)) => put!(o, v, |x: i64| x as i32),
            (Val::I(v), Dest::I64(o)) => o[at..at + v.len()].copy_from_slice(v),
            (v, _) => unreachable!("{v:?} stored into another dtype"),
        }
    }
}

/// A part of a value being stored: its elements' memory, by dtype (parts of one value are
/// computed on different threads).
#[derive(Debug)]
pub(super) enum Dest<'a> {
    /// bool elements.
    Bool(&'a mut [bool]),
    /// u8 elements.
    U8(&'a mut [u8]),
    /// i8 elements.
    I8(&'a mut [i8]),
    /// i16 elements.
    I16(&'a mut [i16]),
    /// i32 elements.
    I32(&'a mut [i32]),
    /// i64 elements.
    I64(&'a mut [i64]),
    /// f16 elements.
    F16(&'a mut [f16]),
    /// bf16 elements.
    BF16(&'a mut [bf16]),
    /// f32 elements.
    F32(&'a mut [f32]),
    /// f64 elements.
    F64(&'a mut [f64]),
}

/// The parts of `v` between consecutive `bounds` (the first 0, the last `v.len()`).
pub(super) fn split_slice<'a, T>(mut v: &'a mut [T], bounds: &[usize]) -> Vec<&'a mut [T]> {
    let mut parts = Vec::with_capacity(bounds.len().saturating_sub(1));
    for w in bounds.windows(2) {
        let (part, rest) = std::mem::take(&mut v).split_at_mut(w[1] - w[0]);
        parts.push(part);
        v = rest;
    }
    parts
}

impl<'a> Dest<'a> {
    /// The parts of `data` between consecutive `bounds` (the first 0, the last its length).
    pub fn split(data: &'a mut HostData, bounds: &[usize]) -> Vec<Dest<'a>> {
        macro_rules! parts {
            ($v:expr, $variant:ident) => {
                split_slice($v, bounds).into_iter().map(Dest::$variant).collect()
            };
        }
        match data {
            HostData::Bool(v) => parts!(v, Bool),
            HostData::U8(v) => parts!(v, U8),
            HostData::I8(v) => parts!(v, I8),
            HostData::I16(v) => parts!(v, I16),
            HostData::I32(v) => parts!(v, I32),
            HostData::I64(v) => parts!(v, I64),
            HostData::F16(v) => parts!(v, F16),
            HostData::BF16(v) => parts!(v, BF16),
            HostData::F32(v) => parts!(v, F32),
            HostData::F64(v) => parts!(v, F64),
        }
    }
}

/// Where a pointwise node's values go: a chunk, or a region's output itself where it is
/// stored in its compute type (f32, f64, i64).
#[derive(Debug)]
pub(super) enum Out<'a> {
    /// f32 (f16, bf16, f32 values).
    F(&'a mut [f32]),
    /// f64 values.
    D(&'a mut [f64]),
    /// Integer and bool values, wrapped to their dtype.
    I(&'a mut [i64]),
}

impl<'a> Out<'a> {
    /// Elements `at .. at + n` of an output part stored in its compute type; `None` for other
    /// dtypes.
    pub fn of(dest: &'a mut Dest, at: usize, n: usize) -> Option<Out<'a>> {
        match dest {
            Dest::F32(v) => Some(Out::F(&mut v[at..at + n])),
            Dest::F64(v) => Some(Out::D(&mut v[at..at + n])),
            Dest::I64(v) => Some(Out::I(&mut v[at..at + n])),
            _ => None,
        }
    }
}

/// The compute type of `dtype`: its [`Chunk`] variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    /// f32.
    F,
    /// f64.
    D,
    /// i64.
    I,
}

impl Class {
    /// The compute type of `dtype`.
    pub fn of(dtype: DType) -> Class {
        match dtype {
            DType::F16 | DType::BF16 | DType::F32 => Class::F,
            DType::F64 => Class::D,
            _ => Class::I,
        }
    }

    /// An empty chunk of this class with room for `n` values.
    pub fn chunk(self, n: usize) -> Chunk {
        match self {
            Class::F => Chunk::F(vec![0.0; n]),
            Class::D => Chunk::D(vec![0.0; n]),
            Class::I => Chunk::I(vec![0; n]),
        }
    }
}

/// Wraps an i64 to the width of an integer dtype, as a C cast does (bool: nonzero): the
/// interpreter's rule.
pub(super) fn wrap(x: i64, dtype: DType) -> i64 {
    crate::interp::wrap_int(dtype, x)
}

/// A float rounded to a float dtype and back to its compute type's precision.
fn round_float(x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f16::from_f32(x as f32).to_f64(),
        DType::BF16 => bf16::from_f32(x as f32).to_f64(),
        DType::F32 => x as f32 as f64,
        _ => x,
    }
}

impl Chunk {
    /// Keeps the first `n` values (room for them must exist).
    pub fn truncate_to(&mut self, n: usize) {
        match self {
            Chunk::F(v) => v.resize(n, 0.0),
            Chunk::D(v) => v.resize(n, 0.0),
            Chunk::I(v) => v.resize(n, 0),
        }
    }

    /// `value` of `dtype` in every position (the constant rounded or wrapped to `dtype` first).
    pub fn fill(&mut self, value: Scalar, dtype: DType) {
        match self {
            Chunk::F(v) => v.fill(round_float(value.as_f64(), dtype) as f32),
            Chunk::D(v) => v.fill(value.as_f64()),
            Chunk::I(v) => v.fill(wrap(scalar_int(value, dtype), dtype)),
        }
    }

    /// Reads a stored value of `data`'s dtype through `layout`, elements `start ..`.
    pub fn load(&mut self, layout: &super::layout::Layout, data: &HostData, start: usize) {
        match (self, data) {
            (Chunk::F(o), HostData::F32(s)) => layout.read(s, start, o, |x| x),
            (Chunk::F(o), HostData::F16(s)) => layout.read(s, start, o, f16::to_f32),
            (Chunk::F(o), HostData::BF16(s)) => layout.read(s, start, o, bf16::to_f32),
            (Chunk::D(o), HostData::F64(s)) => layout.read(s, start, o, |x| x),
            (Chunk::I(o), HostData::Bool(s)) => layout.read(s, start, o, |x| x as i64),
            (Chunk::I(o), HostData::U8(s)) => layout.read(s, start, o, |x| x as i64),
            (Chunk::I(o), HostData::I8(s)) => layout.read(s, start, o, |x| x as i64),
            (Chunk::I(o), HostData::I16(s)) => layout.read(s, start, o, |x| x as i64),
            (Chunk::I(o), HostData::I32(s)) => layout.read(s, start, o, |x| x as i64),
            (Chunk::I(o), HostData::I64(s)) => layout.read(s, start, o, |x| x),
            (c, d) => unreachable!("a {} value read into a {:?} chunk", d.dtype(), Class::of_chunk(c)),
        }
    }

    /// The values, to be written.
    pub fn out(&mut self) -> Out<'_> {
        match self {
            Chunk::F(v) => Out::F(v),
            Chunk::D(v) => Out::D(v),
            Chunk::I(v) => Out::I(v),
        }
    }

    /// The values, read in place.
    pub fn val(&self) -> Val<'_> {
        match self {
            Chunk::F(v) => Val::F(v),
            Chunk::D(v) => Val::D(v),
            Chunk::I(v) => Val::I(v),
        }
    }
}

impl Chunk {
    /// The compute type of the values.
    pub fn class(&self) -> Class {
        Class::of_chunk(self)
    }
}

impl Class {
    fn of_chunk(c: &Chunk) -> Class {
        match c {
            Chunk::F(_) => Class::F,
            Chunk::D(_) => Class::D,
            Chunk::I(_) => Class::I,
        }
    }
}

/// A constant as an integer of `dtype`, as the C literal of generated code is.
fn scalar_int(s: Scalar, dtype: DType) -> i64 {
    match s {
        Scalar::Bool(b) => b as i64,
        Scalar::Int(i) => i,
        Scalar::Float(x) if dtype == DType::Bool => (x != 0.0) as i64,
        Scalar::Float(x) => x as i64,
    }
}

/// Why a pointwise node with these operand and result dtypes is not one tier-0 runs (`None`:
/// it runs it). Checked when the plan is made, so that [`eval`] meets no surprise.
pub(super) fn unsupported(op: &Op, operands: &[DType], out: DType) -> Option<String> {
    let same = operands.iter().all(|&d| Class::of(d) == Class::of(out));
    let why = |what: &str| Some(format!("{} {what}", op.name()));
    match op {
        Op::Unary(u) if u.returns_bool() => None,
        Op::Unary(u) if out.is_float() => (!same || !coil_codegen::templates::eager_cpu::has_unary(*u))
            .then(|| format!("{} of {:?} into {out}", u.name(), operands)),
        Op::Unary(u) => {
            use UnaryOp::*;
            (!same || !matches!(u, Neg | Abs | Sign | Floor | Ceil | Round | Trunc | BitwiseNot))
                .then(|| format!("{} of {:?} into {out}", u.name(), operands))
        }
        Op::Binary(b) if b.returns_bool() => {
            (operands[0] != operands[1]).then(|| format!("{} of mixed dtypes", b.name()))
        }
        Op::Binary(b) if out.is_float() => {
            (!same || !coil_codegen::templates::eager_cpu::has_binary(*b)).then(|| format!("{} into {out}", b.name()))
        }
        Op::Binary(b) => {
            (!same || matches!(b, BinaryOp::Div | BinaryOp::Atan2)).then(|| format!("{} into {out}", b.name()))
        }
        Op::Where => (Class::of(operands[1]) != Class::of(out) || Class::of(operands[2]) != Class::of(out))
            .then(|| "where of mixed dtypes".to_string()),
        Op::Cast(_) => None,
        _ => why("is not pointwise"),
    }
}

/// The prebuilt chunk kernel a pointwise node with a result of `dtype` runs, if it runs one
/// (float math); looked up once, when the plan is made.
pub(super) fn kernel(op: &Op, dtype: DType) -> Result<Option<&'static Kernel>> {
    let math = Math::get()?;
    Ok(match op {
        Op::Unary(u) if dtype.is_float() && !u.returns_bool() => math.unary(*u, dtype),
        Op::Binary(b) if dtype.is_float() && !b.returns_bool() => math.binary(*b, dtype),
        _ => None,
    })
}

/// Evaluates one pointwise node (`op`, result `out` of dtype `dtype`) on its operands' chunks
/// (`dtypes` theirs), through its [`kernel`] where it has one. Errors (integer division by
/// zero, a negative integer power) are the interpreter's; the caller names the op.
pub(super) fn eval(
    op: &Op,
    kernel: Option<&Kernel>,
    args: &[Val],
    dtypes: &[DType],
    out: Out,
    dtype: DType,
) -> Result<()> {
    match op {
        Op::Unary(u) => unary(*u, kernel, args[0], dtypes[0], out, dtype),
        Op::Binary(b) => binary(*b, kernel, args[0], args[1], dtypes[0], out, dtype),
        Op::Where => {
            let Val::I(c) = args[0] else { unreachable!("a where's condition is bool") };
            match (args[1], args[2], out) {
                (Val::F(x), Val::F(y), Out::F(o)) => select(c, x, y, o),
                (Val::D(x), Val::D(y), Out::D(o)) => select(c, x, y, o),
                (Val::I(x), Val::I(y), Out::I(o)) => select(c, x, y, o),
                _ => unreachable!("where operands of the result's compute type (checked by the plan)"),
            }
            Ok(())
        }
        Op::Cast(to) => {
            cast(args[0], dtypes[0], out, *to);
            Ok(())
        }
        _ => unreachable!("{} is not pointwise", op.name()),
    }
}

fn select<T: Copy>(c: &[i64], x: &[T], y: &[T], o: &mut [T]) {
    for i in 0..o.len() {
        o[i] = if c[i] != 0 { x[i] } else { y[i] };
    }
}

fn map<S: Copy, T>(x: &[S], o: &mut [T], f: impl Fn(S) -> T) {
    for (o, &x) in o.iter_mut().zip(x) {
        *o = f(x);
    }
}

/// A cast, as `coil_codegen::c::ops::convert` computes it: floats to integers truncate (NaN
/// to 0, saturating) then wrap; anything to bool is `!= 0`; f64 to a half type rounds
/// through f32, as the C code does.
fn cast(x: Val, from: DType, out: Out, to: DType) {
    let _ = from;
    match (x, out) {
        (Val::F(x), Out::F(o)) => match to {
            DType::F16 => map(x, o, |v| f16::from_f32(v).to_f32()),
            DType::BF16 => map(x, o, |v| bf16::from_f32(v).to_f32()),
            _ => o.copy_from_slice(x),
        },
        (Val::D(x), Out::F(o)) => match to {
            DType::F16 => map(x, o, |v| f16::from_f32(v as f32).to_f32()),
            DType::BF16 => map(x, o, |v| bf16::from_f32(v as f32).to_f32()),
            _ => map(x, o, |v| v as f32),
        },
        (Val::I(x), Out::F(o)) => match to {
            DType::F16 => map(x, o, |v| f16::from_f32(v as f32).to_f32()),
            DType::BF16 => map(x, o, |v| bf16::from_f32(v as f32).to_f32()),
            _ => map(x, o, |v| v as f32),
        },
        (Val::F(x), Out::D(o)) => map(x, o, |v| v as f64),
        (Val::D(x), Out::D(o)) => o.copy_from_slice(x),
        (Val::I(x), Out::D(o)) => map(x, o, |v| v as f64),
        (Val::F(x), Out::I(o)) if to == DType::Bool => map(x, o, |v| (v != 0.0) as i64),
        (Val::D(x), Out::I(o)) if to == DType::Bool => map(x, o, |v| (v != 0.0) as i64),
        (Val::F(x), Out::I(o)) => map(x, o, |v| wrap(v as f64 as i64, to)),
        (Val::D(x), Out::I(o)) => map(x, o, |v| wrap(v as i64, to)),
        (Val::I(x), Out::I(o)) => map(x, o, |v| wrap(v, to)),
    }
}

fn unary(op: UnaryOp, kernel: Option<&Kernel>, x: Val, from: DType, out: Out, dtype: DType) -> Result<()> {
    use UnaryOp::*;
    if op.returns_bool() {
        let Out::I(o) = out else { unreachable!("a bool result") };
        match (op, x) {
            (IsNan, Val::F(x)) => map(x, o, |v| v.is_nan() as i64),
            (IsNan, Val::D(x)) => map(x, o, |v| v.is_nan() as i64),
            (IsInf, Val::F(x)) => map(x, o, |v| v.is_infinite() as i64),
            (IsInf, Val::D(x)) => map(x, o, |v| v.is_infinite() as i64),
            (IsNan | IsInf, Val::I(_)) => o.fill(0),
            (_, Val::F(x)) => map(x, o, |v| (v == 0.0) as i64),
            (_, Val::D(x)) => map(x, o, |v| (v == 0.0) as i64),
            (_, Val::I(x)) => map(x, o, |v| (v == 0) as i64),
        }
        return Ok(());
    }
    match (x, out) {
        (Val::F(x), Out::F(o)) => call_unary(kernel.expect("looked up by the plan"), x, o),
        (Val::D(x), Out::D(o)) => call_unary(kernel.expect("looked up by the plan"), x, o),
        (Val::I(x), Out::I(o)) => {
            let _ = from;
            let f = |v: i64| match op {
                Neg => v.wrapping_neg(),
                Abs => v.wrapping_abs(),
                Sign => v.signum(),
                BitwiseNot if dtype == DType::Bool => (v == 0) as i64,
                BitwiseNot => !v,
                _ => v, // floor, ceil, round, trunc of an integer
            };
            map(x, o, |v| wrap(f(v), dtype));
        }
        _ => unreachable!("operand of the result's compute type (checked by the plan)"),
    }
    Ok(())
}

/// Comparisons and logical ops element by element, as the interpreter computes them.
fn compare<T: PartialOrd + Default + Copy>(op: BinaryOp, a: &[T], b: &[T], o: &mut [i64]) {
    for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
        *o = crate::interp::compare(op, x, y) as i64;
    }
}

fn binary(op: BinaryOp, kernel: Option<&Kernel>, a: Val, b: Val, from: DType, out: Out, dtype: DType) -> Result<()> {
    if op.returns_bool() {
        let Out::I(o) = out else { unreachable!("a bool result") };
        match (a, b) {
            (Val::F(a), Val::F(b)) => compare(op, a, b, o),
            (Val::D(a), Val::D(b)) => compare(op, a, b, o),
            (Val::I(a), Val::I(b)) => compare(op, a, b, o),
            _ => unreachable!("comparison operands of one dtype (checked by the plan)"),
        }
        return Ok(());
    }
    let _ = from;
    match (a, b, out) {
        (Val::F(a), Val::F(b), Out::F(o)) => call_binary(kernel.expect("looked up by the plan"), a, b, o),
        (Val::D(a), Val::D(b), Out::D(o)) => call_binary(kernel.expect("looked up by the plan"), a, b, o),
        (Val::I(a), Val::I(b), Out::I(o)) => {
            for i in 0..o.len() {
                o[i] = wrap(crate::interp::binary_int(op, a[i], b[i], dtype)?, dtype);
            }
        }
        _ => unreachable!("operands of the result's compute type (checked by the plan)"),
    }
    Ok(())
}
