//! Network composites: matmul, linear, layer_norm, rms_norm, embedding, the losses and
//! attention.

use super::builder::{compute_dtype, zero, Builder};
use super::pointwise;
use super::reduce::{log_softmax_in, logsumexp, softmax_in};
use coil_ir::graph::numel;
use coil_ir::infer::{broadcast_shapes, matmul_shape};
use coil_ir::{AttentionDropout, AttentionInput, DType, LossReduction, NodeId, Result, Shape};

/// `torch.matmul`: a 1-D operand gains a dim (prepended for `a`, appended for `c`) that the
/// result loses again. A batched `a` times a matrix folds the batch into the rows of one
/// matrix product; otherwise the batch dims broadcast (by `Expand`) into a batched [`Bmm`].
///
/// [`Bmm`]: coil_ir::Op::Bmm
pub fn matmul(b: &mut Builder, a: NodeId, c: NodeId) -> Result<NodeId> {
    let (sa, sc) = (b.shape(a), b.shape(c));
    let out = matmul_shape(&sa, &sc)?;
    let a = if sa.len() == 1 { b.reshape(a, &[1, sa[0]])? } else { a };
    let c = if sc.len() == 1 { b.reshape(c, &[sc[0], 1])? } else { c };
    let (sa, sc) = (b.shape(a), b.shape(c));
    let (ra, rc) = (sa.len(), sc.len());
    let (m, k, n) = (sa[ra - 2], sa[ra - 1], sc[rc - 1]);
    let y = if rc == 2 && ra > 2 {
        let rows = numel(&sa[..ra - 1]);
        let a = b.reshape(a, &[rows, k])?;
        b.bmm(a, c)?
    } else {
        let batch = broadcast_shapes(&sa[..ra - 2], &sc[..rc - 2])?;
        let with = |tail: [usize; 2]| -> Shape { batch.iter().copied().chain(tail).collect() };
        let a = b.broadcast_to(a, &with([m, k]))?;
        let c = b.broadcast_to(c, &with([k, n]))?;
        b.bmm(a, c)?
    };
    b.reshape(y, &out)
}

/// `linear(x, w, bias) = x @ w^T + bias`: x `[..., in]` flattened to `[M, in]`, one matrix
/// product with the permuted weight, reshaped back, plus the broadcast bias.
pub fn linear(b: &mut Builder, x: NodeId, w: NodeId, bias: Option<NodeId>) -> Result<NodeId> {
    let xs = b.shape(x);
    let lead = &xs[..xs.len() - 1];
    let (inner, out) = (xs[xs.len() - 1], b.shape(w)[0]);
    let wt = b.transpose(w, 0, 1)?;
    let x2 = b.reshape(x, &[numel(lead), inner])?;
    let y = b.bmm(x2, wt)?;
    let shape: Shape = lead.iter().copied().chain([out]).collect();
    let y = b.reshape(y, &shape)?;
    match bias {
        Some(bias) => b.add(y, bias),
        None => Ok(y),
    }
}

/// The last `ndim` dims of a rank-`rank` tensor.
fn last_dims(rank: usize, ndim: usize) -> Vec<usize> {
    (rank - ndim..rank).collect()
}

/// `layer_norm` over the last `ndim` dims: `(x - mean) * rsqrt(var + eps) * w + bias`, with
/// the biased variance; f16/bf16 compute in f32 (weight and bias included) and round once.
pub fn layer_norm(
    b: &mut Builder,
    x: NodeId,
    w: Option<NodeId>,
    bias: Option<NodeId>,
    ndim: usize,
    eps: f64,
) -> Result<NodeId> {
    let t = b.dtype(x);
    let dims = last_dims(b.rank(x), ndim);
    let x = b.upcast(x)?;
    let mu = b.mean(x, &dims, true)?;
    let d = b.sub(x, mu)?;
    let sq = b.mul(d, d)?;
    let var = b.mean(sq, &dims, true)?;
    let var_eps = b.add(var, eps)?;
    let rstd = b.rsqrt(var_eps)?;
    let mut y = b.mul(d, rstd)?;
    if let Some(w) = w {
        let w = b.upcast(w)?;
        y = b.mul(y, w)?;
    }
    if let Some(bias) = bias {
        let bias = b.upcast(bias)?;
        y = b.add(y, bias)?;
    }
    b.cast(y, t)
}

/// The default `eps` of `rms_norm`: the machine epsilon of the dtype it computes in, as
/// PyTorch's kernel does (`f32::EPSILON` for f16, bf16 and f32; `f64::EPSILON` for f64).
pub fn rms_norm_default_eps(dtype: DType) -> f64 {
    match compute_dtype(dtype) {
        DType::F64 => f64::EPSILON,
        _ => f32::EPSILON as f64,
    }
}

/// `rms_norm` over the last `ndim` dims: `x * rsqrt(mean(x^2) + eps) * w`, computed in f32
/// for f16/bf16 (weight included) and rounded once.
pub fn rms_norm(b: &mut Builder, x: NodeId, w: Option<NodeId>, ndim: usize, eps: Option<f64>) -> Result<NodeId> {
    let t = b.dtype(x);
    let eps = eps.unwrap_or(rms_norm_default_eps(t));
    let dims = last_dims(b.rank(x), ndim);
    let x = b.upcast(x)?;
    let sq = b.mul(x, x)?;
    let ms = b.mean(sq, &dims, true)?;
    let ms_eps = b.add(ms, eps)?;
    let r = b.rsqrt(ms_eps)?;
    let mut y = b.mul(x, r)?;
    if let Some(w) = w {
        let w = b.upcast(w)?;
        y = b.mul(y, w)?;
    }
    b.cast(y, t)
}

/// `embedding(indices, weight)`: `index_select(weight, 0, indices.flatten())` reshaped to
/// `indices.shape + [D]`.
pub fn embedding(b: &mut Builder, weight: NodeId, indices: NodeId) -> Result<NodeId> {
    let is = b.shape(indices);
    let flat = b.reshape(indices, &[numel(&is)])?;
    let rows = b.index_select(weight, 0, flat)?;
    let shape: Shape = is.iter().copied().chain([b.shape(weight)[1]]).collect();
    b.reshape(rows, &shape)
}

/// Sums a per-element loss (`Sum`), averages it by `count` (`Mean`; `count` defaults to the
/// number of elements), or leaves it (`None`).
fn reduce_loss(b: &mut Builder, loss: NodeId, reduction: LossReduction, count: Option<NodeId>) -> Result<NodeId> {
    if reduction == LossReduction::None {
        return Ok(loss);
    }
    let all: Vec<usize> = (0..b.rank(loss)).collect();
    let n = b.meta(loss).numel();
    let s = b.sum(loss, &all, false)?;
    match (reduction, count) {
        (LossReduction::Mean, Some(count)) => b.div(s, count),
        (LossReduction::Mean, None) => b.div(s, n as f64),
        _ => Ok(s),
    }
}

/// `cross_entropy(logits, target)` with class-index targets, logits `[N, C]` (target `[N]`)
/// or `[C]` (target `[]`): `logp = log_softmax(logits)`, `nll = -logp[target]` masked to 0
/// where `target == ignore_index`; with label smoothing `eps` the per-row loss is
/// `(1 - eps) * nll + eps / C * -sum(logp)` (masked alike). `Mean` divides by the number of
/// rows not ignored (NaN when all are, as in PyTorch).
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy(
    b: &mut Builder,
    logits: NodeId,
    target: NodeId,
    weight: Option<NodeId>,
    ignore_index: i64,
    reduction: LossReduction,
    label_smoothing: f64,
) -> Result<NodeId> {
    let t = b.dtype(logits);
    let ls = b.shape(logits);
    let unbatched = ls.len() == 1;
    let (n, c) = if unbatched { (1, ls[0]) } else { (ls[0], ls[1]) };
    let raw = b.reshape(logits, &[n, c])?;
    let target = b.reshape(target, &[n])?;
    let logits = b.upcast(raw)?;
    let ct = b.dtype(logits);
    let valid = b.ne(target, ignore_index)?;
    let safe = b.where_(valid, target, zero(b.dtype(target)))?;
    let index = b.reshape(safe, &[n, 1])?;
    // Label smoothing sums every class's log-probability; without it, only the target's is
    // needed: `logp[t] = (x[t] - max) - log(sum(exp(x - max)))`, one logit gathered per row
    // from the input instead of a whole log-softmax written to memory (the same values).
    let logp = if label_smoothing > 0.0 { Some(log_softmax_in(b, logits, 1)?) } else { None };
    let picked = match logp {
        Some(logp) => b.gather(logp, 1, index)?,
        None => {
            let m = b.amax(logits, &[1], true)?;
            let m = b.detach(m)?;
            let shifted = b.sub(logits, m)?;
            let e = b.exp(shifted)?;
            let s = b.sum(e, &[1], true)?;
            let l = b.log(s)?;
            let xt = b.gather(raw, 1, index)?;
            let xt = b.upcast(xt)?;
            let xt = b.sub(xt, m)?;
            b.sub(xt, l)?
        }
    };
    let picked = b.reshape(picked, &[n])?;
    let nll = b.neg(picked)?;
    // With class weights (PyTorch's formula): each row's loss is scaled by the weight of its
    // target class, the smoothing term weighs every class, and `mean` divides by the total
    // weight of the counted rows instead of their number.
    let weight = weight.map(|w| b.upcast(w)).transpose()?;
    let row_weight = match weight {
        Some(w) => {
            let picked = b.index_select(w, 0, safe)?;
            Some(b.where_(valid, picked, zero(ct))?)
        }
        None => None,
    };
    let nll = match row_weight {
        Some(rw) => b.mul(nll, rw)?,
        None => nll,
    };
    let mut loss = b.where_(valid, nll, zero(ct))?;
    if label_smoothing > 0.0 {
        let logp = logp.expect("computed with label smoothing");
        let weighted = match weight {
            Some(w) => {
                let w = b.broadcast_to(w, &[n, c])?;
                b.mul(logp, w)?
            }
            None => logp,
        };
        let total = b.sum(weighted, &[1], false)?;
        let smooth = b.neg(total)?;
        let smooth = b.where_(valid, smooth, zero(ct))?;
        let hard = b.mul(loss, 1.0 - label_smoothing)?;
        let soft = b.mul(smooth, label_smoothing / c as f64)?;
        loss = b.add(hard, soft)?;
    }
    let count = match (reduction, row_weight) {
        (LossReduction::Mean, Some(rw)) => Some(b.sum(rw, &[0], false)?),
        (LossReduction::Mean, None) => {
            let ones = b.cast(valid, DType::I64)?;
            let count = b.sum(ones, &[0], false)?;
            Some(b.cast(count, ct)?)
        }
        _ => None,
    };
    let loss = if unbatched && reduction == LossReduction::None { b.reshape(loss, &[])? } else { loss };
    let loss = reduce_loss(b, loss, reduction, count)?;
    b.cast(loss, t)
}

/// `mse_loss(a, c) = (a - c)^2` with broadcasting, then the reduction; f16/bf16 compute in
/// f32 and round once.
pub fn mse_loss(b: &mut Builder, a: NodeId, c: NodeId, reduction: LossReduction, dtype: DType) -> Result<NodeId> {
    let ct = compute_dtype(dtype);
    let a = b.cast(a, ct)?;
    let c = b.cast(c, ct)?;
    let d = b.sub(a, c)?;
    let sq = b.mul(d, d)?;
    let loss = reduce_loss(b, sq, reduction, None)?;
    b.cast(loss, dtype)
}

/// `scaled_dot_product_attention(q, k, v, mask)`: `scores = (q @ k^T) * scale` (default
/// `1 / sqrt(E)`, batch dims broadcast); `causal` keeps `col <= row` (top-left aligned) and
/// sets the rest to `-inf`; a bool mask keeps where true, a float mask is added; then
/// `softmax(scores, -1) @ v`. With a mask, a row whose scores are all `-inf` has probabilities
/// 0 (so its result is 0), as PyTorch's `_safe_softmax`; its softmax is taken of zeros instead
/// (then dropped), so that no NaN reaches its gradients either: they are 0, as PyTorch's. With
/// `dropout`, the probabilities (f32, f64 for f64) go through [`pointwise::dropout`] of its
/// stream and offset before the product with v: `softmax -> Dropout -> @ v` is the definition
/// of attention's dropout. f16/bf16 compute in f32 and round once, or, with
/// [`Builder::half_products`], take both products in their dtype around an f32 softmax.
#[allow(clippy::too_many_arguments)] // attention's operands and attributes
pub fn attention(
    b: &mut Builder,
    q: NodeId,
    k: NodeId,
    v: NodeId,
    mask: Option<NodeId>,
    causal: bool,
    scale: Option<f64>,
    dropout: Option<AttentionDropout>,
) -> Result<NodeId> {
    let t = b.dtype(q);
    let scale = attention_scale(b, q, scale);
    let half = b.half_products && matches!(t, DType::F16 | DType::BF16);
    let (q, k, v) = if half { (q, k, v) } else { (b.upcast(q)?, b.upcast(k)?, b.upcast(v)?) };
    let scores = scaled_scores(b, q, k, scale, causal)?;
    let scores = masked_scores(b, scores, mask)?;
    let last = b.rank(scores) - 1;
    let p = if mask.is_some() {
        let max = b.amax(scores, &[last], true)?;
        let dead = b.eq(max, f64::NEG_INFINITY)?;
        let live = b.where_(dead, 0.0, scores)?;
        let p = softmax_in(b, live, last)?;
        b.where_(dead, 0.0, p)?
    } else {
        softmax_in(b, scores, last)?
    };
    let p = match dropout {
        Some(d) => pointwise::dropout(b, p, d.p, d.stream, d.offset)?,
        None => p,
    };
    let p = if half { b.cast(p, t)? } else { p };
    let y = matmul(b, p, v)?;
    b.cast(y, t)
}

/// The scores with attention's explicit mask applied, if any: a bool mask keeps where true
/// (the rest `-inf`), any other is added (in the scores' dtype).
fn masked_scores(b: &mut Builder, scores: NodeId, mask: Option<NodeId>) -> Result<NodeId> {
    match mask {
        None => Ok(scores),
        Some(mask) if b.dtype(mask) == DType::Bool => b.where_(mask, scores, f64::NEG_INFINITY),
        Some(mask) => {
            let mask = b.upcast(mask)?;
            b.add(scores, mask)
        }
    }
}

/// The factor on attention's scores: `scale`, else `1 / sqrt(E)` (q's last dim).
fn attention_scale(b: &Builder, q: NodeId, scale: Option<f64>) -> f64 {
    scale.unwrap_or_else(|| 1.0 / (*b.shape(q).last().expect("rank >= 2") as f64).sqrt())
}

/// `(q @ k^T) * scale` in f32 (f64 for f64; the product in q's dtype when it is f16 / bf16),
/// `-inf` where the causal mask drops a key (`col > row`, top-left aligned).
fn scaled_scores(b: &mut Builder, q: NodeId, k: NodeId, scale: f64, causal: bool) -> Result<NodeId> {
    let r = b.rank(q);
    let (l, s) = (b.shape(q)[r - 2], b.shape(k)[r - 2]);
    let kt = b.transpose(k, r - 2, r - 1)?;
    let qk = matmul(b, q, kt)?;
    let qk = b.upcast(qk)?;
    let scores = b.mul(qk, scale)?;
    if !causal {
        return Ok(scores);
    }
    let rows = b.iota(&[l, s], 0);
    let cols = b.iota(&[l, s], 1);
    let keep = b.le(cols, rows)?;
    b.where_(keep, scores, f64::NEG_INFINITY)
}

/// `attention_logsumexp(q, k, v, mask?)` ([`coil_ir::Op::AttentionLogsumexp`]): the logsumexp
/// of the scaled, causally masked scores (and masked by `mask`, if any) over the keys, in f32
/// (f64 for f64); `-inf` for a row that keeps no key.
pub fn attention_logsumexp(
    b: &mut Builder,
    q: NodeId,
    k: NodeId,
    mask: Option<NodeId>,
    causal: bool,
    scale: Option<f64>,
) -> Result<NodeId> {
    let scale = attention_scale(b, q, scale);
    let (q, k) = (b.upcast(q)?, b.upcast(k)?);
    let scores = scaled_scores(b, q, k, scale, causal)?;
    let scores = masked_scores(b, scores, mask)?;
    let last = b.rank(scores) - 1;
    logsumexp(b, scores, &[last], false)
}

/// One gradient of attention ([`coil_ir::Op::AttentionBackward`]) from operands
/// `[q, k, v, grad_out, logsumexp, out]` and the mask, if any: the probabilities
/// `P = exp(scores - logsumexp)` recomputed (the scores masked as the forward's; with a mask,
/// a row that keeps no key has logsumexp `-inf` and P 0, so its gradients are 0, as
/// PyTorch's), `dv = P^T @ grad_out`, `delta = sum(grad_out * out, -1)`,
/// `dS = P * (grad_out @ v^T - delta)`,
/// `dq = scale * dS @ k`, `dk = scale * dS^T @ q`; in f32 (f64 for f64), rounded once to the
/// operands' dtype. With `dropout`, the forward's keep mask `Z` is drawn again (the same
/// [`pointwise::dropout`] of the probabilities): `dv = dropout(P)^T @ grad_out` and
/// `dS = P * (dropout(grad_out @ v^T) - delta)` (dropout scales kept values by `1 / (1 - p)`).
pub fn attention_backward(
    b: &mut Builder,
    x: &[NodeId],
    mask: Option<NodeId>,
    causal: bool,
    scale: Option<f64>,
    input: AttentionInput,
    dropout: Option<AttentionDropout>,
) -> Result<NodeId> {
    let t = b.dtype(x[0]);
    let scale = attention_scale(b, x[0], scale);
    let (q, k, v, g) = (b.upcast(x[0])?, b.upcast(x[1])?, b.upcast(x[2])?, b.upcast(x[3])?);
    let scores = scaled_scores(b, q, k, scale, causal)?;
    let scores = masked_scores(b, scores, mask)?;
    let r = b.rank(scores);
    let mut lse = b.unsqueeze(x[4], r - 1)?;
    if mask.is_some() {
        // A row that keeps no key: its scores are all -inf, less 0 (not -inf: NaN).
        let dead = b.eq(lse, f64::NEG_INFINITY)?;
        lse = b.where_(dead, 0.0, lse)?;
    }
    let shifted = b.sub(scores, lse)?;
    let p = b.exp(shifted)?;
    // The same keep decisions as the forward's: dropout of a tensor of the probabilities' shape.
    let drop = |b: &mut Builder, x: NodeId| match dropout {
        Some(d) => pointwise::dropout(b, x, d.p, d.stream, d.offset),
        None => Ok(x),
    };
    let grad = if input == AttentionInput::Value {
        let p = drop(b, p)?;
        let pt = b.transpose(p, r - 2, r - 1)?;
        matmul(b, pt, g)?
    } else {
        let vt = b.transpose(v, r - 2, r - 1)?;
        let dp = matmul(b, g, vt)?;
        let dp = drop(b, dp)?;
        let out = b.upcast(x[5])?;
        let product = b.mul(g, out)?;
        let delta = b.sum(product, &[r - 1], true)?;
        let centered = b.sub(dp, delta)?;
        let ds = b.mul(p, centered)?;
        let product = match input {
            AttentionInput::Query => matmul(b, ds, k)?,
            _ => {
                let dst = b.transpose(ds, r - 2, r - 1)?;
                matmul(b, dst, q)?
            }
        };
        b.mul(product, scale)?
    };
    b.cast(grad, t)
}
