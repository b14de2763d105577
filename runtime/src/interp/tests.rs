//! Tests of the interpreter: leaves, pointwise ops and dtypes, reductions, bmm, errors.
//! (Views and data movement are in `tests_movement.rs`.)

use super::interpret;
use crate::Buffer;
use coil_ir::{
    philox, BinaryOp, DType, Error, Graph, Op, RandDist, RandomState, ReduceOp, Result, Scalar, TensorMeta, UnaryOp,
};
use half::{bf16, f16};

/// Runs one op on graph inputs bound to `inputs`; returns its single output.
pub(super) fn apply(op: Op, inputs: &[&Buffer]) -> Result<Buffer> {
    let mut g = Graph::new();
    let ids: Vec<_> = inputs.iter().map(|b| g.input(b.meta())).collect();
    let y = g.push(op, &ids, None)?;
    g.outputs.push(y);
    Ok(interpret(&g, inputs)?.remove(0))
}

pub(super) fn ok(op: Op, inputs: &[&Buffer]) -> Buffer {
    apply(op, inputs).unwrap()
}

pub(super) fn err(op: Op, inputs: &[&Buffer]) -> Error {
    apply(op, inputs).unwrap_err()
}

pub(super) fn f32s(v: &[f32], shape: &[usize]) -> Buffer {
    Buffer::from_vec(v.to_vec(), shape.to_vec())
}

pub(super) fn i64s(v: &[i64], shape: &[usize]) -> Buffer {
    Buffer::from_vec(v.to_vec(), shape.to_vec())
}

pub(super) fn i32s(v: &[i32], shape: &[usize]) -> Buffer {
    Buffer::from_vec(v.to_vec(), shape.to_vec())
}

pub(super) fn bools(v: &[bool], shape: &[usize]) -> Buffer {
    Buffer::from_vec(v.to_vec(), shape.to_vec())
}

/// f32 values equal bit for bit (so the sign of zero counts), any NaN equal to any NaN.
fn same_f32(got: &[f32], want: &[f32]) {
    let key = |x: &f32| if x.is_nan() { u32::MAX } else { x.to_bits() };
    let g: Vec<u32> = got.iter().map(key).collect();
    let w: Vec<u32> = want.iter().map(key).collect();
    assert_eq!(g, w, "got {got:?}, want {want:?}");
}

fn leaf(op: Op, meta: TensorMeta) -> Buffer {
    random_leaf(op, meta, &[]).unwrap()
}

/// A leaf run with random streams `random`.
fn random_leaf(op: Op, meta: TensorMeta, random: &[RandomState]) -> Result<Buffer> {
    let mut g = Graph::new();
    let x = g.leaf(op, meta, None);
    g.outputs.push(x);
    Ok(super::interpret_with(&g, &[], random)?.remove(0))
}

#[test]
fn full_iota_rand() {
    let b = leaf(Op::Full(Scalar::Int(3)), TensorMeta::new(vec![2], DType::F32));
    assert_eq!(b.data, crate::HostData::F32(vec![3.0, 3.0]));
    let b = leaf(Op::Full(Scalar::Float(-2.7)), TensorMeta::new(vec![2], DType::I32));
    assert_eq!(b.to_vec::<i32>(), vec![-2, -2]);
    let b = leaf(Op::Full(Scalar::Float(0.5)), TensorMeta::new(vec![], DType::Bool));
    assert_eq!(b.to_vec::<bool>(), vec![true]);
    let b = leaf(Op::Full(Scalar::Int(300)), TensorMeta::new(vec![1], DType::U8));
    assert_eq!(b.to_vec::<u8>(), vec![44]);
    let b = leaf(Op::Iota { dim: 1 }, TensorMeta::new(vec![2, 3], DType::I64));
    assert_eq!(b.to_vec::<i64>(), vec![0, 1, 2, 0, 1, 2]);
    let b = leaf(Op::Iota { dim: 0 }, TensorMeta::new(vec![2, 3], DType::I64));
    assert_eq!(b.to_vec::<i64>(), vec![0, 0, 0, 1, 1, 1]);

    // stream 1 starts at counter 1000; the op draws 7 counters further on
    let (seed, offset) = (99, 1007);
    let streams = [RandomState { seed: 5, offset: 0 }, RandomState { seed, offset: 1000 }];
    let uniform = Op::Rand { dist: RandDist::Uniform, stream: 1, offset: 7 };
    let b = random_leaf(uniform.clone(), TensorMeta::new(vec![2, 3], DType::F32), &streams).unwrap();
    let want: Vec<f32> = (0..6).map(|i| philox::uniform(seed, offset + i) as f32).collect();
    same_f32(&b.to_vec::<f32>(), &want);
    let normal = Op::Rand { dist: RandDist::Normal, stream: 1, offset: 7 };
    let b = random_leaf(normal, TensorMeta::new(vec![4], DType::BF16), &streams).unwrap();
    let want: Vec<bf16> = (0..4).map(|i| bf16::from_f32(philox::normal(seed, offset + i) as f32)).collect();
    assert_eq!(b.to_vec::<bf16>(), want);
    // the counter wraps modulo 2^64
    let end = [RandomState { seed, offset: u64::MAX - 2 }];
    let first = Op::Rand { dist: RandDist::Uniform, stream: 0, offset: 7 };
    let b = random_leaf(first, TensorMeta::new(vec![6], DType::F64), &end[..]).unwrap();
    let want: Vec<f64> = (0..6).map(|i| philox::uniform(seed, (u64::MAX - 2).wrapping_add(7 + i))).collect();
    assert_eq!(b.to_vec::<f64>(), want);
    // a stream the run does not give
    let e = random_leaf(uniform, TensorMeta::new(vec![2], DType::F32), &end[..]).unwrap_err();
    assert!(e.to_string().contains("random stream 1 is not given"), "{e}");
}

#[test]
fn unary_float_ops() {
    let xs = [-2.5f32, -0.5, -0.0, 0.0, 0.3, 0.5, 1.5, 2.5, 7.0];
    let x = f32s(&xs, &[xs.len()]);
    let f = |x: f32| x as f64;
    type Func = fn(f64) -> f64;
    let cases: Vec<(UnaryOp, Func)> = vec![
        (UnaryOp::Neg, |a| -a),
        (UnaryOp::Abs, f64::abs),
        (UnaryOp::Exp, f64::exp),
        (UnaryOp::Exp2, f64::exp2),
        (UnaryOp::Expm1, f64::exp_m1),
        (UnaryOp::Log, f64::ln),
        (UnaryOp::Log2, f64::log2),
        (UnaryOp::Log1p, f64::ln_1p),
        (UnaryOp::Sqrt, f64::sqrt),
        (UnaryOp::Rsqrt, |a| 1.0 / a.sqrt()),
        (UnaryOp::Sin, f64::sin),
        (UnaryOp::Cos, f64::cos),
        (UnaryOp::Tan, f64::tan),
        (UnaryOp::Atan, f64::atan),
        (UnaryOp::Asin, f64::asin),
        (UnaryOp::Acos, f64::acos),
        (UnaryOp::Tanh, f64::tanh),
        (UnaryOp::Sigmoid, |a| 1.0 / (1.0 + (-a).exp())),
        (UnaryOp::Floor, f64::floor),
        (UnaryOp::Ceil, f64::ceil),
        (UnaryOp::Trunc, f64::trunc),
        (UnaryOp::Reciprocal, |a| 1.0 / a),
    ];
    for (op, func) in cases {
        let want: Vec<f32> = xs.iter().map(|&a| func(f(a)) as f32).collect();
        same_f32(&ok(Op::Unary(op), &[&x]).to_vec::<f32>(), &want);
    }
    // round half to even; sign as PyTorch: sign(nan) = 0, sign(-0.0) = +0.0
    let r = ok(Op::Unary(UnaryOp::Round), &[&x]).to_vec::<f32>();
    same_f32(&r, &[-2.0, -0.0, -0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 7.0]);
    let y = f32s(&[-3.0, -0.0, 0.0, f32::NAN, 2.0, f32::NEG_INFINITY], &[6]);
    same_f32(&ok(Op::Unary(UnaryOp::Sign), &[&y]).to_vec::<f32>(), &[-1.0, 0.0, 0.0, 0.0, 1.0, -1.0]);
    assert_eq!(ok(Op::Unary(UnaryOp::IsNan), &[&y]).to_vec::<bool>(), vec![false, false, false, true, false, false]);
    assert_eq!(ok(Op::Unary(UnaryOp::IsInf), &[&y]).to_vec::<bool>(), vec![false, false, false, false, false, true]);
    assert_eq!(
        ok(Op::Unary(UnaryOp::LogicalNot), &[&y]).to_vec::<bool>(),
        vec![false, true, true, false, false, false]
    );
    let e = ok(Op::Unary(UnaryOp::Erf), &[&f32s(&[-1.0, 0.5, 3.0], &[3])]).to_vec::<f32>();
    same_f32(&e, &[-0.8427007929497149f64 as f32, 0.5204998778130465f64 as f32, 0.9999779095030014f64 as f32]);
}

#[test]
fn unary_integer_ops() {
    let x = i32s(&[i32::MIN, -5, 0, 7], &[4]);
    assert_eq!(ok(Op::Unary(UnaryOp::Neg), &[&x]).to_vec::<i32>(), vec![i32::MIN, 5, 0, -7]);
    assert_eq!(ok(Op::Unary(UnaryOp::Abs), &[&x]).to_vec::<i32>(), vec![i32::MIN, 5, 0, 7]);
    assert_eq!(ok(Op::Unary(UnaryOp::Sign), &[&x]).to_vec::<i32>(), vec![-1, -1, 0, 1]);
    assert_eq!(ok(Op::Unary(UnaryOp::Floor), &[&x]).to_vec::<i32>(), vec![i32::MIN, -5, 0, 7]);
    assert_eq!(ok(Op::Unary(UnaryOp::LogicalNot), &[&x]).to_vec::<bool>(), vec![false, false, true, false]);
    assert_eq!(ok(Op::Unary(UnaryOp::IsNan), &[&x]).to_vec::<bool>(), vec![false; 4]);
    // float-only ops on integers give the default float
    let s = ok(Op::Unary(UnaryOp::Sqrt), &[&i32s(&[4, 2], &[2])]);
    assert_eq!(s.dtype(), DType::F32);
    same_f32(&s.to_vec::<f32>(), &[2.0, std::f32::consts::SQRT_2]);
    let b = ok(Op::Unary(UnaryOp::Abs), &[&Buffer::from_vec(vec![-128i8, 3], vec![2])]);
    assert_eq!(b.to_vec::<i8>(), vec![-128, 3]);
}

fn bin(op: BinaryOp, a: &Buffer, b: &Buffer) -> Buffer {
    ok(Op::Binary(op), &[a, b])
}

#[test]
fn low_precision_rounds_per_op() {
    // bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: round to even.
    let a = Buffer::from_vec(vec![bf16::from_f32(1.0), bf16::from_f32(1.0)], vec![2]);
    let b = Buffer::from_vec(vec![bf16::from_f32(0.00390625), bf16::from_f32(0.005)], vec![2]);
    let c = bin(BinaryOp::Add, &a, &b);
    assert_eq!(c.dtype(), DType::BF16);
    assert_eq!(c.to_vec::<f32>(), vec![1.0, 1.0078125]);
    // f16 spacing is 2 above 2048
    let a = Buffer::from_vec(vec![f16::from_f32(2048.0); 2], vec![2]);
    let b = Buffer::from_vec(vec![f16::from_f32(1.0), f16::from_f32(3.0)], vec![2]);
    assert_eq!(bin(BinaryOp::Add, &a, &b).to_vec::<f32>(), vec![2048.0, 2052.0]);
    // exp in f16 is rounded to f16
    let e = ok(Op::Unary(UnaryOp::Exp), &[&Buffer::from_vec(vec![f16::from_f32(1.0)], vec![1])]);
    assert_eq!(e.to_vec::<f16>(), vec![f16::from_f64(std::f64::consts::E)]);
}

#[test]
fn integer_arithmetic_wraps() {
    let a = i32s(&[i32::MAX, -7, 6], &[3]);
    let b = i32s(&[1, 2, -4], &[3]);
    assert_eq!(bin(BinaryOp::Add, &a, &b).to_vec::<i32>(), vec![i32::MIN, -5, 2]);
    assert_eq!(bin(BinaryOp::Mul, &a, &b).to_vec::<i32>(), vec![i32::MAX, -14, -24]);
    let u = Buffer::from_vec(vec![3u8, 200], vec![2]);
    let v = Buffer::from_vec(vec![5u8, 100], vec![2]);
    assert_eq!(bin(BinaryOp::Sub, &u, &v).to_vec::<u8>(), vec![254, 100]);
    assert_eq!(bin(BinaryOp::Add, &u, &v).to_vec::<u8>(), vec![8, 44]);
    let p = bin(BinaryOp::Pow, &i32s(&[2, 2, -3, 0], &[4]), &i32s(&[10, 31, 3, 0], &[4]));
    assert_eq!(p.to_vec::<i32>(), vec![1024, i32::MIN, -27, 1]);
    let e = err(Op::Binary(BinaryOp::Pow), &[&i32s(&[2], &[1]), &i32s(&[-1], &[1])]);
    assert!(e.to_string().contains("Integers to negative integer powers are not allowed"), "{e}");
    assert_eq!(e.op.as_deref(), Some("pow"));
    // true division of integers is float
    let d = bin(BinaryOp::Div, &i32s(&[7, -7, 1], &[3]), &i32s(&[2, 2, 0], &[3]));
    assert_eq!(d.dtype(), DType::F32);
    assert_eq!(d.to_vec::<f32>(), vec![3.5, -3.5, f32::INFINITY]);
}

#[test]
fn bool_arithmetic_and_logic() {
    let a = bools(&[true, true, false, false], &[4]);
    let b = bools(&[true, false, true, false], &[4]);
    assert_eq!(bin(BinaryOp::Add, &a, &b).to_vec::<bool>(), vec![true, true, true, false]);
    assert_eq!(bin(BinaryOp::Mul, &a, &b).to_vec::<bool>(), vec![true, false, false, false]);
    assert_eq!(bin(BinaryOp::Maximum, &a, &b).to_vec::<bool>(), vec![true, true, true, false]);
    assert_eq!(bin(BinaryOp::LogicalAnd, &a, &b).to_vec::<bool>(), vec![true, false, false, false]);
    assert_eq!(bin(BinaryOp::LogicalOr, &a, &b).to_vec::<bool>(), vec![true, true, true, false]);
    assert_eq!(bin(BinaryOp::Gt, &a, &b).to_vec::<bool>(), vec![false, true, false, false]);
    let x = f32s(&[0.0, f32::NAN, 2.0], &[3]);
    let y = f32s(&[1.0, 1.0, 0.0], &[3]);
    assert_eq!(bin(BinaryOp::LogicalAnd, &x, &y).to_vec::<bool>(), vec![false, true, false]);
}

#[test]
fn comparisons_and_nan() {
    let a = f32s(&[1.0, f32::NAN, 3.0, 2.0], &[4]);
    let b = f32s(&[2.0, 1.0, f32::NAN, 2.0], &[4]);
    assert_eq!(bin(BinaryOp::Lt, &a, &b).to_vec::<bool>(), vec![true, false, false, false]);
    assert_eq!(bin(BinaryOp::Le, &a, &b).to_vec::<bool>(), vec![true, false, false, true]);
    assert_eq!(bin(BinaryOp::Eq, &a, &b).to_vec::<bool>(), vec![false, false, false, true]);
    assert_eq!(bin(BinaryOp::Ne, &a, &b).to_vec::<bool>(), vec![true, true, true, false]);
    assert_eq!(bin(BinaryOp::Ge, &a, &b).to_vec::<bool>(), vec![false, false, false, true]);
    let max = bin(BinaryOp::Maximum, &a, &b).to_vec::<f32>();
    same_f32(&max, &[2.0, f32::NAN, f32::NAN, 2.0]);
    let min = bin(BinaryOp::Minimum, &a, &b).to_vec::<f32>();
    same_f32(&min, &[1.0, f32::NAN, f32::NAN, 2.0]);
    let p = bin(BinaryOp::Pow, &f32s(&[f32::NAN, 2.0, -8.0], &[3]), &f32s(&[0.0, 0.5, 1.0 / 3.0], &[3]));
    same_f32(&p.to_vec::<f32>(), &[1.0, std::f32::consts::SQRT_2, f32::NAN]);
}

#[test]
fn floor_division_and_remainder_with_negative_operands() {
    let a = i64s(&[7, -7, 7, -7, 0], &[5]);
    let b = i64s(&[2, 2, -2, -2, 3], &[5]);
    assert_eq!(bin(BinaryOp::FloorDiv, &a, &b).to_vec::<i64>(), vec![3, -4, -4, 3, 0]);
    assert_eq!(bin(BinaryOp::TruncDiv, &a, &b).to_vec::<i64>(), vec![3, -3, -3, 3, 0]);
    assert_eq!(bin(BinaryOp::Remainder, &a, &b).to_vec::<i64>(), vec![1, 1, -1, -1, 0]);
    let x = f32s(&[7.5, -7.5, 7.5, -7.5, -0.0, 1.0], &[6]);
    let y = f32s(&[2.0, 2.0, -2.0, -2.0, 3.0, 0.0], &[6]);
    same_f32(&bin(BinaryOp::FloorDiv, &x, &y).to_vec::<f32>(), &[3.0, -4.0, -4.0, 3.0, -0.0, f32::INFINITY]);
    same_f32(&bin(BinaryOp::TruncDiv, &x, &y).to_vec::<f32>(), &[3.0, -3.0, -3.0, 3.0, -0.0, f32::INFINITY]);
    same_f32(&bin(BinaryOp::Remainder, &x, &y).to_vec::<f32>(), &[1.5, 0.5, -0.5, -1.5, -0.0, f32::NAN]);
    // i8: -128 // -1 wraps like the C division it is
    let q = bin(BinaryOp::FloorDiv, &Buffer::from_vec(vec![-128i8], vec![1]), &Buffer::from_vec(vec![-1i8], vec![1]));
    assert_eq!(q.to_vec::<i8>(), vec![-128]);
}

#[test]
fn inverse_functions_and_their_special_values() {
    let x = f32s(&[-1.0, -0.0, 0.5, 1.0, 1.5, f32::NAN, f32::INFINITY], &[7]);
    let pi = std::f32::consts::PI;
    let asin = ok(Op::Unary(UnaryOp::Asin), &[&x]).to_vec::<f32>();
    same_f32(&asin, &[-pi / 2.0, -0.0, 0.5f64.asin() as f32, pi / 2.0, f32::NAN, f32::NAN, f32::NAN]);
    let acos = ok(Op::Unary(UnaryOp::Acos), &[&x]).to_vec::<f32>();
    same_f32(&acos, &[pi, pi / 2.0, 0.5f64.acos() as f32, 0.0, f32::NAN, f32::NAN, f32::NAN]);
    let e = ok(Op::Unary(UnaryOp::Erfinv), &[&x]).to_vec::<f32>();
    same_f32(&e, &[f32::NEG_INFINITY, -0.0, 0.47693628, f32::INFINITY, f32::NAN, f32::NAN, f32::NAN]);
    // integers give the default float
    let a = ok(Op::Unary(UnaryOp::Atan), &[&i32s(&[1, -3], &[2])]);
    same_f32(&a.to_vec::<f32>(), &[pi / 4.0, -(3f64.atan() as f32)]);
    // atan2 as C's: signed zeros and infinities pick the quadrant
    let y = f32s(&[0.0, -0.0, 0.0, 1.0, f32::INFINITY, -2.0], &[6]);
    let xx = f32s(&[-0.0, -0.0, 0.0, f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0], &[6]);
    let t = bin(BinaryOp::Atan2, &y, &xx).to_vec::<f32>();
    same_f32(&t, &[pi, -pi, 0.0, pi, 0.75 * pi, -pi / 2.0]);
    assert_eq!(bin(BinaryOp::Atan2, &i32s(&[1], &[1]), &i32s(&[1], &[1])).dtype(), DType::F32);
}

#[test]
fn bit_ops_and_shifts_follow_pytorch() {
    let a = i32s(&[12, -7, 5, 1, -1], &[5]);
    let b = i32s(&[10, 3, 31, 32, -1], &[5]);
    assert_eq!(bin(BinaryOp::BitwiseAnd, &a, &b).to_vec::<i32>(), vec![8, 1, 5, 0, -1]);
    assert_eq!(bin(BinaryOp::BitwiseOr, &a, &b).to_vec::<i32>(), vec![14, -5, 31, 33, -1]);
    assert_eq!(bin(BinaryOp::BitwiseXor, &a, &b).to_vec::<i32>(), vec![6, -6, 26, 33, 0]);
    assert_eq!(ok(Op::Unary(UnaryOp::BitwiseNot), &[&a]).to_vec::<i32>(), vec![-13, 6, -6, -2, 0]);
    // bits shifted past the width are lost; amounts < 0 or >= 32 give 0
    assert_eq!(bin(BinaryOp::ShiftLeft, &a, &b).to_vec::<i32>(), vec![12 << 10, -56, i32::MIN, 0, 0]);
    // arithmetic; amounts < 0 or >= 31 shift by 31 (the sign fill)
    assert_eq!(bin(BinaryOp::ShiftRight, &a, &b).to_vec::<i32>(), vec![0, -1, 0, 0, -1]);
    // u8: 255 - 7 = 249 shifts logically, amounts >= 8 give 0
    let u = Buffer::from_vec(vec![249u8, 200, 3], vec![3]);
    let n = Buffer::from_vec(vec![1u8, 8, 7], vec![3]);
    assert_eq!(bin(BinaryOp::ShiftRight, &u, &n).to_vec::<u8>(), vec![124, 0, 0]);
    assert_eq!(bin(BinaryOp::ShiftLeft, &u, &n).to_vec::<u8>(), vec![242, 0, 128]);
    assert_eq!(ok(Op::Unary(UnaryOp::BitwiseNot), &[&u]).to_vec::<u8>(), vec![6, 55, 252]);
    // bools: logic
    let (p, q) = (bools(&[true, true, false, false], &[4]), bools(&[true, false, true, false], &[4]));
    assert_eq!(bin(BinaryOp::BitwiseAnd, &p, &q).to_vec::<bool>(), vec![true, false, false, false]);
    assert_eq!(bin(BinaryOp::BitwiseXor, &p, &q).to_vec::<bool>(), vec![false, true, true, false]);
    assert_eq!(ok(Op::Unary(UnaryOp::BitwiseNot), &[&p]).to_vec::<bool>(), vec![false, false, true, true]);
    // floats have no bits to operate on
    let e = err(Op::Binary(BinaryOp::BitwiseAnd), &[&f32s(&[1.0], &[1]), &f32s(&[1.0], &[1])]);
    assert!(e.to_string().contains("only integers and bool"), "{e}");
    let e = err(Op::Binary(BinaryOp::ShiftLeft), &[&p, &q]);
    assert!(e.to_string().contains("bool"), "{e}");
}

#[test]
fn integer_division_by_zero_is_an_error() {
    for op in [BinaryOp::FloorDiv, BinaryOp::TruncDiv, BinaryOp::Remainder] {
        let e = err(Op::Binary(op), &[&i32s(&[1, 2], &[2]), &i32s(&[1, 0], &[2])]);
        assert!(e.to_string().contains("ZeroDivisionError"), "{e}");
        assert_eq!(e.op.as_deref(), Some(op.name()));
    }
}

#[test]
fn where_and_cast() {
    let c = bools(&[true, false, true], &[3]);
    let w = ok(Op::Where, &[&c, &i32s(&[1, 2, 3], &[3]), &i32s(&[-1, -2, -3], &[3])]);
    assert_eq!(w.to_vec::<i32>(), vec![1, -2, 3]);
    let x = f32s(&[-2.7, 2.7, 300.0, -1.0, f32::NAN, -0.0], &[6]);
    assert_eq!(ok(Op::Cast(DType::I32), &[&x]).to_vec::<i32>()[..4], [-2, 2, 300, -1]);
    assert_eq!(ok(Op::Cast(DType::U8), &[&x]).to_vec::<u8>()[..4], [254, 2, 44, 255]);
    assert_eq!(ok(Op::Cast(DType::Bool), &[&x]).to_vec::<bool>(), vec![true, true, true, true, true, false]);
    let big = i64s(&[2049, 16_777_217, -3], &[3]);
    assert_eq!(ok(Op::Cast(DType::F16), &[&big]).to_vec::<f32>(), vec![2048.0, f32::INFINITY, -3.0]);
    assert_eq!(ok(Op::Cast(DType::F32), &[&big]).to_vec::<f32>(), vec![2049.0, 16_777_216.0, -3.0]);
    assert_eq!(ok(Op::Cast(DType::I8), &[&i32s(&[200, -129], &[2])]).to_vec::<i8>(), vec![-56, 127]);
    let b = ok(Op::Cast(DType::BF16), &[&f32s(&[1.0 + 1.0 / 256.0, 3.140625], &[2])]);
    assert_eq!(b.to_vec::<f32>(), vec![1.0, 3.140625]);
    assert_eq!(ok(Op::Cast(DType::F32), &[&bools(&[true, false], &[2])]).to_vec::<f32>(), vec![1.0, 0.0]);
}

fn red(op: ReduceOp, dims: &[usize], keepdim: bool, x: &Buffer) -> Buffer {
    ok(Op::Reduce { op, dims: dims.to_vec(), keepdim }, &[x])
}

#[test]
fn reductions_over_several_dims() {
    let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let x = f32s(&v, &[2, 3, 4]);
    let s = red(ReduceOp::Sum, &[0, 2], true, &x);
    assert_eq!(s.shape, vec![1, 3, 1]);
    // element (i, j, k) is 12i + 4j + k
    let want: Vec<f32> =
        (0..3).map(|j| (0..2).flat_map(|i| (0..4).map(move |k| (12 * i + 4 * j + k) as f32)).sum()).collect();
    assert_eq!(s.to_vec::<f32>(), want);
    let s = red(ReduceOp::Sum, &[2, 0], false, &x);
    assert_eq!((s.shape.clone(), s.to_vec::<f32>()), (vec![3], want));
    let m = red(ReduceOp::Max, &[1], false, &x);
    assert_eq!((m.shape.clone(), m.to_vec::<f32>()), (vec![2, 4], vec![8.0, 9.0, 10.0, 11.0, 20.0, 21.0, 22.0, 23.0]));
    let m = red(ReduceOp::Min, &[0, 1, 2], false, &x);
    assert_eq!((m.shape.clone(), m.to_vec::<f32>()), (vec![], vec![0.0]));
    let p = red(ReduceOp::Prod, &[1], true, &f32s(&[1.0, 2.0, 3.0, -1.0, 0.5, 4.0], &[2, 3]));
    assert_eq!((p.shape.clone(), p.to_vec::<f32>()), (vec![2, 1], vec![6.0, -2.0]));
    let y = red(ReduceOp::Sum, &[], false, &x);
    assert_eq!((y.shape.clone(), y.to_vec::<f32>()), (vec![2, 3, 4], v.clone()));
}

#[test]
fn reductions_nan_empty_integer_and_bool() {
    let x = f32s(&[1.0, f32::NAN, 3.0, -1.0, 5.0, 2.0], &[2, 3]);
    same_f32(&red(ReduceOp::Max, &[1], false, &x).to_vec::<f32>(), &[f32::NAN, 5.0]);
    same_f32(&red(ReduceOp::Min, &[0], false, &x).to_vec::<f32>(), &[-1.0, f32::NAN, 2.0]);
    let empty = f32s(&[], &[2, 0]);
    let s = red(ReduceOp::Sum, &[1], false, &empty);
    same_f32(&s.to_vec::<f32>(), &[0.0, 0.0]);
    assert_eq!(red(ReduceOp::Prod, &[1], false, &empty).to_vec::<f32>(), vec![1.0, 1.0]);
    let i = red(ReduceOp::Sum, &[0], false, &i32s(&[i32::MAX, i32::MAX], &[2]));
    assert_eq!((i.dtype(), i.to_vec::<i64>()), (DType::I64, vec![2 * i32::MAX as i64]));
    let b = bools(&[true, false, true, true], &[2, 2]);
    let c = red(ReduceOp::Sum, &[1], false, &b);
    assert_eq!((c.dtype(), c.to_vec::<i64>()), (DType::I64, vec![1, 2]));
    assert_eq!(red(ReduceOp::Max, &[1], false, &b).to_vec::<bool>(), vec![true, true]);
    assert_eq!(red(ReduceOp::Min, &[1], false, &b).to_vec::<bool>(), vec![false, true]);
    // f16 accumulates wide and rounds once: 2048 + 1 + 1 = 2050 (per-step f16 would give 2048)
    let h = Buffer::from_vec([2048.0f32, 1.0, 1.0].map(f16::from_f32).to_vec(), vec![3]);
    assert_eq!(red(ReduceOp::Sum, &[0], false, &h).to_vec::<f32>(), vec![2050.0]);
}

#[test]
fn argmax_argmin_ties_and_nan() {
    let x = f32s(&[1.0, 3.0, 3.0, 0.0, 0.0, 2.0, f32::NAN, 5.0, f32::NAN], &[3, 3]);
    let am = red(ReduceOp::ArgMax, &[1], false, &x);
    assert_eq!((am.dtype(), am.to_vec::<i64>()), (DType::I64, vec![1, 2, 0]));
    assert_eq!(red(ReduceOp::ArgMin, &[1], false, &x).to_vec::<i64>(), vec![0, 0, 0]);
    let am = red(ReduceOp::ArgMax, &[0], true, &x);
    assert_eq!((am.shape.clone(), am.to_vec::<i64>()), (vec![1, 3], vec![2, 2, 2]));
    let y = f32s(&[4.0, f32::NAN, 1.0, f32::NAN], &[4]);
    assert_eq!(red(ReduceOp::ArgMin, &[0], false, &y).to_vec::<i64>(), vec![1]);
    assert_eq!(red(ReduceOp::ArgMax, &[], false, &f32s(&[7.0], &[])).to_vec::<i64>(), vec![0]);
    let i = i32s(&[2, 9, 9, -4, -4], &[5]);
    assert_eq!(red(ReduceOp::ArgMax, &[0], false, &i).to_vec::<i64>(), vec![1]);
    assert_eq!(red(ReduceOp::ArgMin, &[0], false, &i).to_vec::<i64>(), vec![3]);
}

#[test]
fn cumsum_along_each_dim() {
    let x = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    assert_eq!(ok(Op::Cumsum { dim: 1 }, &[&x]).to_vec::<f32>(), vec![1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
    assert_eq!(ok(Op::Cumsum { dim: 0 }, &[&x]).to_vec::<f32>(), vec![1.0, 2.0, 3.0, 5.0, 7.0, 9.0]);
    let c = ok(Op::Cumsum { dim: 0 }, &[&i32s(&[i32::MAX, 1, -5], &[3])]);
    assert_eq!((c.dtype(), c.to_vec::<i64>()), (DType::I64, vec![i32::MAX as i64, 1 << 31, (1 << 31) - 5]));
    assert_eq!(ok(Op::Cumsum { dim: 0 }, &[&f32s(&[2.5], &[])]).to_vec::<f32>(), vec![2.5]);
}

#[test]
fn bmm_with_batch() {
    // batch 2 of [2, 3] @ [3, 2]
    let a = f32s(&[1., 2., 3., 4., 5., 6., 1., 0., -1., 0., 1., 0.], &[2, 2, 3]);
    let b = f32s(&[1., 0., 0., 1., 1., 1., 2., 3., 4., 5., 6., 7.], &[2, 3, 2]);
    let c = ok(Op::Bmm, &[&a, &b]);
    assert_eq!(c.shape, vec![2, 2, 2]);
    assert_eq!(c.to_vec::<f32>(), vec![4., 5., 10., 11., -4., -4., 4., 5.]);
    let a = i32s(&[i32::MAX, 1, 2, 3], &[1, 2, 2]);
    let c = ok(Op::Bmm, &[&a, &i32s(&[2, 0, 0, 1], &[1, 2, 2])]);
    assert_eq!(c.to_vec::<i32>(), vec![-2, 1, 4, 3]);
    let e = ok(Op::Bmm, &[&f32s(&[], &[2, 0]), &f32s(&[], &[0, 3])]);
    assert_eq!(e.to_vec::<f32>(), vec![0.0; 6]);
}

#[test]
fn test_sizes_run_quickly() {
    let n = 64;
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 * 0.5).collect();
    let (a, b) = (f32s(&a, &[n, n]), f32s(&b, &[n, n]));
    let x: Vec<f32> = (0..100_000).map(|i| i as f32 * 1e-3).collect();
    let x = f32s(&x, &[100, 1000]);
    let start = std::time::Instant::now();
    let mut g = Graph::new();
    let (ia, ib, ix) = (g.input(a.meta()), g.input(b.meta()), g.input(x.meta()));
    let c = g.push(Op::Bmm, &[ia, ib], None).unwrap();
    let e = g.push(Op::Unary(UnaryOp::Exp), &[ix], None).unwrap();
    let t = g.push(Op::Permute { perm: vec![1, 0] }, &[e], None).unwrap();
    let s = g.push(Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[t], None).unwrap();
    g.outputs.extend([c, s]);
    let out = interpret(&g, &[&a, &b, &x]).unwrap();
    let elapsed = start.elapsed();
    assert!(elapsed.as_secs_f64() < 1.0, "took {elapsed:?}");
    let (av, bv) = (a.to_vec::<f32>(), b.to_vec::<f32>());
    let c00: f32 = (0..n).map(|k| av[k] * bv[k * n]).sum();
    assert_eq!(out[0].to_vec::<f32>()[0], c00);
    assert_eq!(out[1].shape, vec![1000]);
}

#[test]
fn inputs_must_match_the_graph() {
    let mut g = Graph::new();
    let x = g.input(TensorMeta::new(vec![2, 3], DType::F32));
    let y = g.push(Op::Unary(UnaryOp::Neg), &[x], None).unwrap();
    g.outputs.push(y);
    assert!(interpret(&g, &[]).unwrap_err().to_string().contains("takes 1 inputs, got 0"));
    let e = interpret(&g, &[&f32s(&[1.0; 3], &[3])]).unwrap_err();
    assert!(e.to_string().contains("input 0: expected f32[2, 3], got f32[3]"), "{e}");
    let e = interpret(&g, &[&i32s(&[1; 6], &[2, 3])]).unwrap_err();
    assert!(e.to_string().contains("expected f32[2, 3], got i32[2, 3]"), "{e}");
}

#[test]
fn shared_values_and_several_outputs() {
    let mut g = Graph::new();
    let x = g.input(TensorMeta::new(vec![3], DType::F32));
    let two = g.full(Scalar::Float(2.0), vec![3], DType::F32, None);
    let y = g.push(Op::Binary(BinaryOp::Mul), &[x, two], None).unwrap();
    let z = g.push(Op::Binary(BinaryOp::Add), &[y, y], None).unwrap();
    let w = g.push(Op::Binary(BinaryOp::Sub), &[z, x], None).unwrap();
    // a dead node with bad data never runs
    let zero = g.full(Scalar::Int(0), vec![3], DType::I32, None);
    let _dead = g.push(Op::Binary(BinaryOp::FloorDiv), &[zero, zero], None).unwrap();
    g.outputs.extend([w, y, w]);
    let out = interpret(&g, &[&f32s(&[1.0, 2.0, 3.0], &[3])]).unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(out[0].to_vec::<f32>(), vec![3.0, 6.0, 9.0]);
    assert_eq!(out[1].to_vec::<f32>(), vec![2.0, 4.0, 6.0]);
    assert_eq!(out[2], out[0]);
}

#[test]
fn composite_ops_are_refused() {
    let e = err(Op::Relu, &[&f32s(&[1.0], &[1])]);
    assert!(e.to_string().contains("not primitive"), "{e}");
}
