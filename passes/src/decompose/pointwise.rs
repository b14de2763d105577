//! Pointwise composites: activations, clamp, nan_to_num, tril/triu masks and dropout.

use super::builder::{upcast_and_back, zero, Builder};
use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, RandDist, Result, Scalar, UnaryOp};
use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};

/// `relu(x)` as PyTorch computes it: `0` below zero, else `x` (so -0.0 and NaN stay), with
/// PyTorch's gradient (`threshold_backward`): it passes where `x > 0` or NaN, not at `x == 0`.
/// The value at and below zero is detached for that: `maximum(x, 0)` split the gradient at a
/// tie in halves. The gradient pass knows this graph ([`relu_operand`]) and takes the mask
/// from the result, as PyTorch does.
pub fn relu(b: &mut Builder, x: NodeId) -> Result<NodeId> {
    let below = b.binary(BinaryOp::Lt, x, 0i64)?;
    let value = b.where_(below, 0i64, x)?;
    let stopped = b.detach(value)?;
    let at_most = b.binary(BinaryOp::Le, x, 0i64)?;
    b.where_(at_most, stopped, x)
}

/// The operand `x` of `y` when `y` is the graph [`relu`] builds with `detach` kept (the
/// gradient decomposition's): `where(x <= 0, detach(where(x < 0, 0, x)), x)`.
///
/// Its gradient mask `x <= 0` is then `y <= 0` (where `x <= 0`, `y` is `0` or `x`, so `+-0.0`;
/// elsewhere `y` is `x`, positive or NaN), and `autodiff` writes it so: the backward pass reads
/// the relu's result, which the next layer keeps anyway, rather than its operand (a ResNet
/// block's residual sum, which would otherwise be stored for the mask alone).
pub fn relu_operand(g: &Graph, y: NodeId) -> Option<NodeId> {
    let is_zero = |n: NodeId| matches!(g.node(n).op, Op::Full(k) if k.as_f64() == 0.0);
    let compares = |n: NodeId, op: BinaryOp, x: NodeId| {
        let node = g.node(n);
        node.op == Op::Binary(op) && node.inputs[0] == x && is_zero(node.inputs[1])
    };
    let node = g.node(y);
    let (Op::Where, &[at_most, stopped, x]) = (&node.op, &node.inputs[..]) else { return None };
    let stopped = g.node(stopped);
    let (Op::Detach, &[value]) = (&stopped.op, &stopped.inputs[..]) else { return None };
    let value = g.node(value);
    let (Op::Where, &[below, zero, x2]) = (&value.op, &value.inputs[..]) else { return None };
    let matches = x2 == x && is_zero(zero) && compares(below, BinaryOp::Lt, x) && compares(at_most, BinaryOp::Le, x);
    matches.then_some(x)
}

/// Exact gelu `0.5 * x * (1 + erf(x / sqrt(2)))`, or the tanh approximation
/// `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`.
pub fn gelu(b: &mut Builder, x: NodeId, tanh: bool) -> Result<NodeId> {
    upcast_and_back(b, x, |b, x| {
        let inner = if tanh {
            let x2 = b.mul(x, x)?;
            let x3 = b.mul(x2, x)?;
            let cubic = b.mul(x3, 0.044715)?;
            let sum = b.add(x, cubic)?;
            let scaled = b.mul(sum, FRAC_2_SQRT_PI * FRAC_1_SQRT_2)?;
            b.unary(UnaryOp::Tanh, scaled)?
        } else {
            let scaled = b.mul(x, FRAC_1_SQRT_2)?;
            b.unary(UnaryOp::Erf, scaled)?
        };
        let one_plus = b.add(inner, 1.0)?;
        let half_x = b.mul(x, 0.5)?;
        b.mul(half_x, one_plus)
    })
}

/// `silu(x) = x * sigmoid(x)`.
pub fn silu(b: &mut Builder, x: NodeId) -> Result<NodeId> {
    upcast_and_back(b, x, |b, x| {
        let s = b.unary(UnaryOp::Sigmoid, x)?;
        b.mul(x, s)
    })
}

/// `softplus(x) = where(x * beta > threshold, x, log1p(exp(x * beta)) / beta)`.
pub fn softplus(b: &mut Builder, x: NodeId, beta: f64, threshold: f64) -> Result<NodeId> {
    upcast_and_back(b, x, |b, x| {
        let xb = b.mul(x, beta)?;
        let linear = b.gt(xb, threshold)?;
        let e = b.exp(xb)?;
        let l = b.unary(UnaryOp::Log1p, e)?;
        let soft = b.div(l, beta)?;
        b.where_(linear, x, soft)
    })
}

/// `clamp(x, min, max) = minimum(maximum(x, min), max)` computed in `dtype`, the captured
/// result dtype (the bounds take part in promotion as scalars). NaN propagates.
pub fn clamp(b: &mut Builder, x: NodeId, min: Option<Scalar>, max: Option<Scalar>, dtype: DType) -> Result<NodeId> {
    let mut y = b.cast(x, dtype)?;
    if let Some(min) = min {
        let lo = b.full_like(min, y);
        y = b.maximum(y, lo)?;
    }
    if let Some(max) = max {
        let hi = b.full_like(max, y);
        y = b.minimum(y, hi)?;
    }
    Ok(y)
}

/// The largest finite value of a floating dtype (`torch.finfo(dtype).max`).
pub fn finite_max(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 65504.0,
        DType::BF16 => 3.3895313892515355e38,
        DType::F32 => f32::MAX as f64,
        _ => f64::MAX,
    }
}

/// `nan_to_num`: NaN -> `nan`, +inf -> `posinf`, -inf -> `neginf` (defaults: the dtype's
/// largest and lowest finite values). Integers and bool are returned unchanged.
pub fn nan_to_num(b: &mut Builder, x: NodeId, nan: f64, posinf: Option<f64>, neginf: Option<f64>) -> Result<NodeId> {
    let t = b.dtype(x);
    if !t.is_float() {
        return Ok(x);
    }
    let posinf = posinf.unwrap_or(finite_max(t));
    let neginf = neginf.unwrap_or(-finite_max(t));
    let is_nan = b.unary(UnaryOp::IsNan, x)?;
    let y = b.where_(is_nan, nan, x)?;
    let is_pos = b.eq(x, f64::INFINITY)?;
    let y = b.where_(is_pos, posinf, y)?;
    let is_neg = b.eq(x, f64::NEG_INFINITY)?;
    b.where_(is_neg, neginf, y)
}

/// `tril(x, k)` (`upper = false`: keep `col - row <= k`) or `triu(x, k)` (`upper = true`:
/// keep `col - row >= k`) over the last two dims; other elements become 0.
pub fn tri(b: &mut Builder, x: NodeId, k: i64, upper: bool) -> Result<NodeId> {
    let shape = b.shape(x);
    let r = shape.len();
    let square = [shape[r - 2], shape[r - 1]];
    let rows = b.iota(&square, 0);
    let cols = b.iota(&square, 1);
    let diff = b.sub(cols, rows)?;
    let keep = if upper { b.ge(diff, k)? } else { b.le(diff, k)? };
    let z = zero(b.dtype(x));
    b.where_(keep, x, z)
}

/// Inverted dropout: `u = rand(stream, offset)` (f32, x's shape), keep where `u >= p`, scale
/// kept values by `1 / (1 - p)`. `p = 0` is the identity, `p = 1` gives zeros.
pub fn dropout(b: &mut Builder, x: NodeId, p: f64, stream: usize, offset: u64) -> Result<NodeId> {
    if p == 0.0 {
        return Ok(x);
    }
    let z = zero(b.dtype(x));
    if p == 1.0 {
        return Ok(b.full_like(z, x));
    }
    let shape = b.shape(x);
    let u = b.rand(RandDist::Uniform, stream, offset, &shape, DType::F32);
    let keep = b.ge(u, p)?;
    let scaled = b.mul(x, 1.0 / (1.0 - p))?;
    b.where_(keep, scaled, z)
}
