//! Reduction composites: mean, var/std, logsumexp, norm, any/all, softmax and log_softmax.

use super::builder::{compute_dtype, upcast_and_back, zero, Builder};
use coil_ir::infer::reduced_shape;
use coil_ir::{DType, NodeId, Result, UnaryOp};

/// `mean(x, dims) = sum(x, dims) / n`, n the number of reduced elements.
pub fn mean(b: &mut Builder, x: NodeId, dims: &[usize], keepdim: bool) -> Result<NodeId> {
    upcast_and_back(b, x, |b, x| b.mean(x, dims, keepdim))
}

/// `var(x, dims, correction) = sum((x - mean_keepdim)^2) / (n - correction)`, and
/// `std = sqrt(var)` when `sqrt`. The divisor is clamped at 0, so `n <= correction` gives
/// inf or NaN, as in PyTorch.
pub fn var(b: &mut Builder, x: NodeId, dims: &[usize], correction: f64, keepdim: bool, sqrt: bool) -> Result<NodeId> {
    upcast_and_back(b, x, |b, x| {
        let n = b.reduced_numel(x, dims) as f64;
        let mu = b.mean(x, dims, true)?;
        let d = b.sub(x, mu)?;
        let sq = b.mul(d, d)?;
        let s = b.sum(sq, dims, keepdim)?;
        let v = b.div(s, (n - correction).max(0.0))?;
        if sqrt {
            b.sqrt(v)
        } else {
            Ok(v)
        }
    })
}

/// `logsumexp(x, dims)`: `m = amax(x, keepdim)`, `m' = where(isinf(m), 0, m)`,
/// `log(sum(exp(x - m'))) + m'`. Integers compute in the default float; a reduction over an
/// empty dim gives `-inf`.
pub fn logsumexp(b: &mut Builder, x: NodeId, dims: &[usize], keepdim: bool) -> Result<NodeId> {
    let out = b.dtype(x).to_float();
    let shape = b.shape(x);
    if dims.iter().any(|&d| shape[d] == 0) {
        return Ok(b.full(f64::NEG_INFINITY, &reduced_shape(&shape, dims, keepdim), out));
    }
    let x = b.cast(x, compute_dtype(out))?;
    // The result does not depend on the shift: no gradient flows through it (as in PyTorch).
    let m = b.amax(x, dims, true)?;
    let m = b.detach(m)?;
    let inf = b.unary(UnaryOp::IsInf, m)?;
    let m = b.where_(inf, 0.0, m)?;
    let shifted = b.sub(x, m)?;
    let e = b.exp(shifted)?;
    let s = b.sum(e, dims, true)?;
    let l = b.log(s)?;
    let r = b.add(l, m)?;
    let r = if keepdim { r } else { b.drop_dims(r, dims)? };
    b.cast(r, out)
}

/// The p-norm over `dims`: `p = 2` `sqrt(sum(x*x))`, `p = 1` `sum(|x|)`, `p = inf` `amax(|x|)`,
/// `p = -inf` `amin(|x|)`, `p = 0` the count of nonzeros, else `sum(|x|^p)^(1/p)`.
pub fn norm(b: &mut Builder, x: NodeId, p: f64, dims: &[usize], keepdim: bool) -> Result<NodeId> {
    upcast_and_back(b, x, |b, x| {
        if p == 2.0 {
            let sq = b.mul(x, x)?;
            let s = b.sum(sq, dims, keepdim)?;
            b.sqrt(s)
        } else if p == 1.0 {
            let a = b.abs(x)?;
            b.sum(a, dims, keepdim)
        } else if p == f64::INFINITY {
            let a = b.abs(x)?;
            b.amax(a, dims, keepdim)
        } else if p == f64::NEG_INFINITY {
            let a = b.abs(x)?;
            b.amin(a, dims, keepdim)
        } else if p == 0.0 {
            let nonzero = b.ne(x, 0.0)?;
            let t = b.dtype(x);
            let ones = b.cast(nonzero, t)?;
            b.sum(ones, dims, keepdim)
        } else {
            let a = b.abs(x)?;
            let powered = b.pow(a, p)?;
            let s = b.sum(powered, dims, keepdim)?;
            b.pow(s, 1.0 / p)
        }
    })
}

/// `any(x, dims) = sum(x != 0 as i64) > 0` (`all = false`), or
/// `all(x, dims) = sum(x == 0 as i64) == 0` (`all = true`); both are right on empty dims.
pub fn any_all(b: &mut Builder, x: NodeId, dims: &[usize], keepdim: bool, all: bool) -> Result<NodeId> {
    let t = b.dtype(x);
    let hit = match (t == DType::Bool, all) {
        (true, false) => x,
        (true, true) => b.unary(UnaryOp::LogicalNot, x)?,
        (false, false) => b.ne(x, zero(t))?,
        (false, true) => b.eq(x, zero(t))?,
    };
    let count = b.cast(hit, DType::I64)?;
    let s = b.sum(count, dims, keepdim)?;
    if all {
        b.eq(s, 0i64)
    } else {
        b.gt(s, 0i64)
    }
}

/// Runs a reduction along `dim` of a 0-d tensor as one over a 1-element vector.
fn along_dim<'g>(
    b: &mut Builder<'g>,
    x: NodeId,
    dim: usize,
    f: impl FnOnce(&mut Builder<'g>, NodeId, usize) -> Result<NodeId>,
) -> Result<NodeId> {
    if b.rank(x) > 0 {
        return f(b, x, dim);
    }
    let v = b.reshape(x, &[1])?;
    let y = f(b, v, 0)?;
    b.reshape(y, &[])
}

/// Softmax in x's dtype (no upcast): `e = exp(x - amax(x, dim)); e / sum(e, dim)`.
pub fn softmax_in(b: &mut Builder, x: NodeId, dim: usize) -> Result<NodeId> {
    if b.meta(x).numel() == 0 {
        return Ok(x);
    }
    along_dim(b, x, dim, |b, x, dim| {
        let m = b.amax(x, &[dim], true)?;
        let m = b.detach(m)?;
        let shifted = b.sub(x, m)?;
        let e = b.exp(shifted)?;
        let s = b.sum(e, &[dim], true)?;
        b.div(e, s)
    })
}

/// Log-softmax in x's dtype (no upcast): `s = x - amax(x, dim); s - log(sum(exp(s), dim))`.
pub fn log_softmax_in(b: &mut Builder, x: NodeId, dim: usize) -> Result<NodeId> {
    if b.meta(x).numel() == 0 {
        return Ok(x);
    }
    along_dim(b, x, dim, |b, x, dim| {
        let m = b.amax(x, &[dim], true)?;
        let m = b.detach(m)?;
        let shifted = b.sub(x, m)?;
        let e = b.exp(shifted)?;
        let s = b.sum(e, &[dim], true)?;
        let l = b.log(s)?;
        b.sub(shifted, l)
    })
}

/// `softmax(x, dim)`, computed in f32 for f16/bf16.
pub fn softmax(b: &mut Builder, x: NodeId, dim: usize) -> Result<NodeId> {
    upcast_and_back(b, x, |b, x| softmax_in(b, x, dim))
}

/// `log_softmax(x, dim)`, computed in f32 for f16/bf16.
pub fn log_softmax(b: &mut Builder, x: NodeId, dim: usize) -> Result<NodeId> {
    upcast_and_back(b, x, |b, x| log_softmax_in(b, x, dim))
}
