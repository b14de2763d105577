//! Neural-network ops (`torch.nn.functional`): `softmax`, `log_softmax`, `layer_norm`,
//! `rms_norm`, `dropout`, `embedding`, `cross_entropy`, `mse_loss` and
//! `scaled_dot_product_attention`.
//!
//! Each records one composite node, so captured graphs show what the user called; the
//! decomposition table in `coil-passes` rewrites them to primitives.

use crate::ops::composite::CompositeScope;
use crate::tensor::{next_random, Tensor};
use coil_ir::{Error, Op, Result};
use std::panic::Location;

pub use coil_ir::LossReduction;

/// The options of [`Tensor::cross_entropy`], with PyTorch's defaults
/// (`ignore_index = -100`, `reduction = mean`, `label_smoothing = 0`).
///
/// ```
/// use coil_frontend::ops::nn::{CrossEntropyOptions, LossReduction};
/// let opts = CrossEntropyOptions { reduction: LossReduction::Sum, ..Default::default() };
/// assert_eq!(opts.ignore_index, -100);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropyOptions {
    /// Targets equal to this class index contribute nothing (and are not counted by `mean`).
    pub ignore_index: i64,
    /// How the per-sample losses combine.
    pub reduction: LossReduction,
    /// Mixes the one-hot target with the uniform distribution by this amount, in `[0, 1]`.
    pub label_smoothing: f64,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions { ignore_index: -100, reduction: LossReduction::Mean, label_smoothing: 0.0 }
    }
}

/// Checks that `normalized_shape` is non-empty and equals the trailing dims of `x`.
fn check_normalized_shape(
    x: &Tensor,
    normalized_shape: &[usize],
    op: &str,
    loc: &'static Location<'static>,
) -> Result<()> {
    let rank = x.rank();
    let fits = !normalized_shape.is_empty()
        && normalized_shape.len() <= rank
        && x.shape()[rank - normalized_shape.len()..] == *normalized_shape;
    if fits {
        return Ok(());
    }
    let msg = if normalized_shape.is_empty() {
        "expected normalized_shape to have at least one element, got []".to_string()
    } else {
        format!("given normalized_shape={normalized_shape:?}, expected input with shape [*, {}], but got input of size {:?}", join(normalized_shape), x.shape())
    };
    Err(Tensor::error(op, &[x], Error::shape(msg), loc))
}

fn join(shape: &[usize]) -> String {
    shape.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
}

impl Tensor {
    /// `F.softmax(x, dim)`: `exp(x) / sum(exp(x))` along `dim`, computed stably.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 0.0, 1.0, 1.0], &[2, 2])?;
    /// assert_eq!(x.softmax(-1)?.to_vec::<f32>()?, vec![0.5, 0.5, 0.5, 0.5]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn softmax(&self, dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let dim = self.dim(dim, "softmax", loc)?;
        Tensor::record(Op::Softmax { dim }, &[self], loc)
    }

    /// `F.log_softmax(x, dim)`: `x - logsumexp(x)` along `dim`.
    #[track_caller]
    pub fn log_softmax(&self, dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let dim = self.dim(dim, "log_softmax", loc)?;
        Tensor::record(Op::LogSoftmax { dim }, &[self], loc)
    }

    /// `F.layer_norm(x, normalized_shape, weight, bias, eps)`: normalizes over the trailing dims
    /// `normalized_shape` (biased variance), then scales by `weight` and shifts by `bias`, both
    /// of the normalized shape when given.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0, 4.0, 8.0], &[2, 2])?;
    /// let y = x.layer_norm(&[2], None, None, 0.0)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![-1.0, 1.0, -1.0, 1.0]);
    /// assert!(x.layer_norm(&[3], None, None, 1e-5).is_err());
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        check_normalized_shape(self, normalized_shape, "layer_norm", loc)?;
        let mut srcs = vec![self];
        srcs.extend(weight);
        srcs.extend(bias);
        let op = Op::LayerNorm { ndim: normalized_shape.len(), eps, weight: weight.is_some(), bias: bias.is_some() };
        Tensor::record(op, &srcs, loc)
    }

    /// `F.rms_norm(x, normalized_shape, weight, eps)`: `x / sqrt(mean(x^2) + eps)` over the
    /// trailing dims `normalized_shape`, times `weight`; `eps = None` uses the dtype's machine
    /// epsilon, as PyTorch does.
    #[track_caller]
    pub fn rms_norm(&self, normalized_shape: &[usize], weight: Option<&Tensor>, eps: Option<f64>) -> Result<Tensor> {
        let loc = Location::caller();
        check_normalized_shape(self, normalized_shape, "rms_norm", loc)?;
        let mut srcs = vec![self];
        srcs.extend(weight);
        Tensor::record(Op::RmsNorm { ndim: normalized_shape.len(), eps, weight: weight.is_some() }, &srcs, loc)
    }

    /// `F.dropout(x, p, training)`: in training, zeroes each element with probability `p` and
    /// scales the rest by `1 / (1 - p)`, drawing from the thread's Philox stream
    /// ([`crate::manual_seed`]); outside training (or with `p = 0`) returns `x` unchanged.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::ones(&[1000], DType::F32);
    /// assert_eq!(x.dropout(0.5, false)?.to_vec::<f32>()?, vec![1.0; 1000]);
    /// let y = x.dropout(0.5, true)?.to_vec::<f32>()?;
    /// assert!(y.iter().all(|&v| v == 0.0 || v == 2.0));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn dropout(&self, p: f64, train: bool) -> Result<Tensor> {
        let loc = Location::caller();
        if !(0.0..=1.0).contains(&p) {
            return Err(Tensor::error(
                "dropout",
                &[self],
                Error::value(format!("dropout probability has to be between 0 and 1, but got {p}")),
                loc,
            ));
        }
        if !train || p == 0.0 || self.numel() == 0 {
            return Ok(self.clone());
        }
        if !self.dtype().is_float() {
            return Err(Tensor::error(
                "dropout",
                &[self],
                Error::dtype(format!("dropout expects a floating tensor, got {}", self.dtype())),
                loc,
            ));
        }
        if p == 1.0 {
            // PyTorch returns `x * 0` without drawing random numbers.
            return self.mul(0.0);
        }
        let draw = next_random(self.numel());
        Tensor::record_drawing(Op::Dropout { p, stream: 0, offset: 0 }, &[self], Some(draw), loc)
    }

    /// `F.cross_entropy(logits, target, ...)` with class-index targets: logits `[N, C]` (or
    /// `[C]`), target `[N]` (or `[]`) of i64/i32 class indices. See [`CrossEntropyOptions`].
    ///
    /// ```
    /// use coil_frontend::{ops::nn::CrossEntropyOptions, Tensor};
    /// let logits = Tensor::from_vec(vec![0.0f32, 0.0, 5.0, 5.0], &[2, 2])?;
    /// let target = Tensor::from_vec(vec![0i64, 1], &[2])?;
    /// let loss = logits.cross_entropy(&target, CrossEntropyOptions::default())?;
    /// assert!((loss.item::<f32>()? - 2f32.ln()).abs() < 1e-5);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    ///
    /// Logits `[N, C, d1, ...]` with targets `[N, d1, ...]` are taken as `N * d1 * ...` rows
    /// (the class dim moved last); `reduction = none` gives the loss in the target's shape.
    #[track_caller]
    pub fn cross_entropy(&self, target: &Tensor, options: CrossEntropyOptions) -> Result<Tensor> {
        self.cross_entropy_any(target, None, options, Location::caller())
    }

    fn cross_entropy_any(
        &self,
        target: &Tensor,
        weight: Option<&Tensor>,
        options: CrossEntropyOptions,
        loc: &'static Location<'static>,
    ) -> Result<Tensor> {
        let CrossEntropyOptions { ignore_index, reduction, label_smoothing } = options;
        let op = Op::CrossEntropy { ignore_index, reduction, label_smoothing, weight: weight.is_some() };
        if self.rank() <= 2 {
            let mut srcs = vec![self, target];
            srcs.extend(weight);
            return Tensor::record(op, &srcs, loc);
        }
        let mut srcs = vec![self, target];
        srcs.extend(weight);
        let _scope = CompositeScope::enter("cross_entropy", &srcs, loc);
        let mut expected = vec![self.shape()[0]];
        expected.extend_from_slice(&self.shape()[2..]);
        if target.shape() != expected.as_slice() {
            let e = Error::shape(format!(
                "expected target of shape {expected:?} for logits {:?}, got {:?}",
                self.shape(),
                target.shape()
            ));
            return Err(Tensor::error("cross_entropy", &srcs, e, loc));
        }
        let classes = self.shape()[1] as i64;
        let rows = self.movedim(1, -1)?.reshape(&[-1, classes])?;
        let flat_target = target.reshape(&[-1])?;
        let mut flat = vec![&rows, &flat_target];
        flat.extend(weight);
        let loss = Tensor::record(op, &flat, loc)?;
        match reduction {
            LossReduction::None => loss.reshape(&expected.iter().map(|&s| s as i64).collect::<Vec<_>>()),
            _ => Ok(loss),
        }
    }

    /// `F.cross_entropy(logits, target, weight=weight, ...)`: as [`Tensor::cross_entropy`], each
    /// row's loss scaled by its target class's weight (`weight` is `[C]`, the logits' dtype);
    /// `mean` divides by the total weight of the counted rows.
    ///
    /// ```
    /// use coil_frontend::{ops::nn::CrossEntropyOptions, Tensor};
    /// let logits = Tensor::from_vec(vec![0.0f32, 0.0, 0.0, 0.0], &[2, 2])?;
    /// let target = Tensor::from_vec(vec![0i64, 1], &[2])?;
    /// let weight = Tensor::from_vec(vec![1.0f32, 3.0], &[2])?;
    /// let loss = logits.cross_entropy_weighted(&target, &weight, CrossEntropyOptions::default())?;
    /// assert!((loss.item::<f32>()? - 2f32.ln()).abs() < 1e-5); // (1*ln2 + 3*ln2) / (1 + 3)
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn cross_entropy_weighted(
        &self,
        target: &Tensor,
        weight: &Tensor,
        options: CrossEntropyOptions,
    ) -> Result<Tensor> {
        self.cross_entropy_any(target, Some(weight), options, Location::caller())
    }

    /// `F.mse_loss(input, target, reduction)`: the squared differences, broadcast, then
    /// averaged, summed or kept as they are.
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// let y = Tensor::from_vec(vec![0.0f32, 4.0], &[2])?;
    /// assert_eq!(x.mse_loss(&y, LossReduction::Mean)?.item::<f32>()?, 2.5);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn mse_loss(&self, target: &Tensor, reduction: LossReduction) -> Result<Tensor> {
        Tensor::record(Op::MseLoss { reduction }, &[self, target], Location::caller())
    }
}

/// `F.embedding(indices, weight)`: the rows of `weight` (`[num, dim]`) at `indices` (i64/i32,
/// any shape); the result has shape `indices.shape + [dim]`.
///
/// ```
/// use coil_frontend::{ops::nn::embedding, Tensor};
/// let weight = Tensor::from_vec(vec![0.0f32, 1.0, 10.0, 11.0, 20.0, 21.0], &[3, 2])?;
/// let idx = Tensor::from_vec(vec![2i64, 0], &[2])?;
/// assert_eq!(embedding(&idx, &weight)?.to_vec::<f32>()?, vec![20.0, 21.0, 0.0, 1.0]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn embedding(indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
    Tensor::record(Op::Embedding, &[weight, indices], Location::caller())
}

/// How [`embedding_bag`] combines the rows of a bag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BagMode {
    /// The sum of the bag's rows.
    Sum,
    /// The mean of the bag's rows.
    Mean,
    /// Only for `[B, L]` indices (bags of one length): 1-D indices with offsets would need a
    /// scatter with a maximum, which coil does not have.
    Max,
}

/// `F.embedding_bag(indices, weight, offsets, mode, per_sample_weights, include_last_offset,
/// padding_idx)`: the rows of `weight` at `indices`, summed (averaged, maxed) per bag. Bags are
/// the rows of 2-D `indices`, or the runs of 1-D `indices` starting at each of `offsets`;
/// an empty bag gives zeros; indices equal to `padding_idx` take no part.
///
/// ```
/// use coil_frontend::ops::nn::{embedding_bag, BagMode};
/// use coil_frontend::Tensor;
/// let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3, 1])?;
/// let idx = Tensor::from_vec(vec![0i64, 1, 2], &[3])?;
/// let offsets = Tensor::from_vec(vec![0i64, 2], &[2])?;
/// let y = embedding_bag(&idx, &w, Some(&offsets), BagMode::Sum, None, false, None)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![3.0, 3.0]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn embedding_bag(
    indices: &Tensor,
    weight: &Tensor,
    offsets: Option<&Tensor>,
    mode: BagMode,
    per_sample_weights: Option<&Tensor>,
    include_last_offset: bool,
    padding_idx: Option<i64>,
) -> Result<Tensor> {
    let loc = Location::caller();
    let mut srcs = vec![indices, weight];
    srcs.extend(offsets);
    srcs.extend(per_sample_weights);
    let _scope = CompositeScope::enter("embedding_bag", &srcs, loc);
    let fail = |msg: String| Err(Tensor::error("embedding_bag", &srcs, Error::shape(msg), loc));
    if weight.rank() != 2 {
        return fail(format!("weight has to be a 2D Tensor, but got Tensor of dimension {}", weight.rank()));
    }
    if per_sample_weights.is_some() && mode != BagMode::Sum {
        let e = Error::value("embedding_bag: per_sample_weights is only supported for mode='sum'");
        return Err(Tensor::error("embedding_bag", &srcs, e, loc));
    }
    let flat = indices.reshape(&[-1])?;
    let rows = embedding(&flat, weight)?;
    let rows = match per_sample_weights {
        Some(w) => rows.mul(&w.reshape(&[-1, 1])?)?,
        None => rows,
    };
    // Which positions count: not the padding index.
    let kept = match padding_idx {
        Some(p) => flat.ne(p)?,
        None => flat.ge(i64::MIN)?,
    };
    let rows = crate::ops::pointwise::where_(&kept.unsqueeze(1)?, &rows, 0.0)?;
    let (bags, bag_of) = match (indices.rank(), offsets) {
        (2, None) => {
            let (b, l) = (indices.shape()[0], indices.shape()[1]);
            (b, Tensor::iota(&[b, l], 0)?.to_device(indices.device())?.reshape(&[-1])?)
        }
        (1, Some(offsets)) => {
            if offsets.rank() != 1 {
                return fail(format!("offsets has to be a 1D Tensor, but got Tensor of dimension {}", offsets.rank()));
            }
            let b = if include_last_offset { offsets.numel().saturating_sub(1) } else { offsets.numel() };
            let starts = offsets.narrow(0, 0, b)?;
            // Position i belongs to the last bag that starts at or before it.
            let positions = Tensor::iota(&[flat.numel()], 0)?.to_device(indices.device())?;
            (b, positions.bucketize(&starts, true)?.sub(1)?)
        }
        _ => {
            return fail(format!(
                "expected 2-D indices without offsets or 1-D indices with offsets, got {:?} indices {} offsets",
                indices.shape(),
                if offsets.is_some() { "with" } else { "without" }
            ))
        }
    };
    let dim = weight.shape()[1];
    if mode == BagMode::Max {
        if indices.rank() != 2 {
            let e = Error::unsupported("embedding_bag with mode='max' and offsets needs a scatter with a maximum, which coil does not have: pass [B, L] indices");
            return Err(Tensor::error("embedding_bag", &srcs, e, loc));
        }
        let grid = rows.reshape(&[bags as i64, -1, dim as i64])?;
        let masked = crate::ops::pointwise::where_(&kept.reshape(&[bags as i64, -1, 1])?, &grid, f64::NEG_INFINITY)?;
        let out = masked.amax(&[1], false)?;
        // A bag with nothing kept gives zeros, as in PyTorch.
        return crate::ops::pointwise::where_(&out.isinf()?.logical_and(&out.lt(0.0)?)?, 0.0, &out);
    }
    let zeros = Tensor::zeros(&[bags, dim], weight.dtype()).to_device(weight.device())?;
    let sums = zeros.index_add(0, &bag_of, &rows, 1.0)?;
    if mode == BagMode::Sum {
        return Ok(sums);
    }
    let counts = Tensor::zeros(&[bags], weight.dtype()).to_device(weight.device())?;
    let counts = counts.index_add(0, &bag_of, &kept.to_dtype(weight.dtype())?, 1.0)?;
    sums.div(&counts.clamp_min(1.0)?.unsqueeze(1)?)
}

/// `F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale)`:
/// `softmax(q @ k^T * scale + mask) @ v` with q `[..., L, E]`, k `[..., S, E]`, v `[..., S, Ev]`.
/// `scale` defaults to `1 / sqrt(E)`; a mask (broadcastable to `[..., L, S]`) of bool keeps the
/// `true` positions, one of q's dtype is added; `causal` masks the upper triangle. A mask and
/// `causal` together are an error, as in PyTorch. A row whose every key is masked out gives 0,
/// as PyTorch 2.15 does. Compiled, masked attention runs as one template call that reads the
/// mask where it lies (a decode step's `[rows, capacity]` mask serves every batch index and
/// head) and skips key tiles it drops; its gradients are template calls that read the mask too
/// (but for an added mask's own gradient, a learned bias, which takes the decomposition).
///
/// ```
/// use coil_frontend::{ops::nn::scaled_dot_product_attention, Tensor};
/// use coil_ir::DType;
/// let q = Tensor::ones(&[2, 4, 8], DType::F32);
/// let k = Tensor::ones(&[2, 6, 8], DType::F32);
/// let v = Tensor::ones(&[2, 6, 3], DType::F32);
/// let y = scaled_dot_product_attention(&q, &k, &v, None, false, None)?;
/// assert_eq!(y.shape(), &[2, 4, 3]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    attention_at(q, k, v, mask, 0.0, causal, scale, Location::caller())
}

/// `F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale)`:
/// [`scaled_dot_product_attention`] with dropout on the attention weights, as PyTorch's:
/// after the softmax each weight is dropped with probability `dropout_p` and the kept ones
/// are scaled by `1 / (1 - dropout_p)`, then `@ v`. `dropout_p` must be in `[0, 1)`; 0 is
/// attention without dropout. The keep decisions are those of [`Tensor::dropout`] on the
/// `[..., L, S]` weights (the same random numbers, counter for counter), drawn from the
/// thread's random stream, so a compiled function draws new ones at every call without
/// recompiling. Compiled, attention with dropout stays one template call forward and one
/// backward (the weights are never written to memory; the backward draws the same mask
/// again), with an explicit mask too (BERT's padding mask: the mask is read where it lies), but
/// for an added mask whose own gradient is wanted (a learned bias), which takes the
/// decomposition.
///
/// ```
/// use coil_frontend::{ops::nn::scaled_dot_product_attention_dropout, Tensor};
/// use coil_ir::DType;
/// let q = Tensor::ones(&[2, 4, 8], DType::F32);
/// let k = Tensor::ones(&[2, 6, 8], DType::F32);
/// let v = Tensor::ones(&[2, 6, 3], DType::F32);
/// let y = scaled_dot_product_attention_dropout(&q, &k, &v, None, 0.1, true, None)?;
/// assert_eq!(y.shape(), &[2, 4, 3]);
/// assert!(scaled_dot_product_attention_dropout(&q, &k, &v, None, 1.0, true, None).is_err());
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn scaled_dot_product_attention_dropout(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    dropout_p: f64,
    causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    attention_at(q, k, v, mask, dropout_p, causal, scale, Location::caller())
}

/// Both attention functions, called from `loc`.
#[allow(clippy::too_many_arguments)] // attention's operands and attributes
fn attention_at(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    dropout_p: f64,
    causal: bool,
    scale: Option<f64>,
    loc: &'static Location<'static>,
) -> Result<Tensor> {
    let mut srcs = vec![q, k, v];
    srcs.extend(mask);
    let name = "scaled_dot_product_attention";
    if mask.is_some() && causal {
        return Err(Tensor::error(
            name,
            &srcs,
            Error::value("an explicit attention mask should not be set when causal is true"),
            loc,
        ));
    }
    if !(0.0..1.0).contains(&dropout_p) {
        let e = Error::value(format!("dropout_p has to be in [0, 1), but got {dropout_p}"));
        return Err(Tensor::error(name, &srcs, e, loc));
    }
    if dropout_p == 0.0 {
        return Tensor::record(Op::Attention { causal, scale, mask: mask.is_some(), dropout: None }, &srcs, loc);
    }
    // One number per weight of the `[*batch, L, S]` probabilities (checked shapes: a bad call
    // fails in `record_drawing` with its own message, having drawn nothing that matters).
    let (qs, ks) = (q.shape(), k.shape());
    let (r, rk) = (qs.len(), ks.len());
    let probabilities = if r >= 2 && rk >= 2 {
        let batch = coil_ir::infer::broadcast_shapes(&qs[..r - 2], &ks[..rk - 2])
            .and_then(|b| coil_ir::infer::broadcast_shapes(&b, &v.shape()[..v.shape().len().max(2) - 2]))
            .unwrap_or_default();
        batch.iter().product::<usize>() * qs[r - 2] * ks[rk - 2]
    } else {
        0
    };
    let draw = next_random(probabilities);
    let dropout = Some(coil_ir::AttentionDropout { p: dropout_p, stream: 0, offset: 0 });
    Tensor::record_drawing(Op::Attention { causal, scale, mask: mask.is_some(), dropout }, &srcs, Some(draw), loc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_ir::DType;

    fn zeros(shape: &[usize]) -> Tensor {
        Tensor::zeros(shape, DType::F32)
    }

    fn assert_err(r: Result<Tensor>, op: &str) -> Error {
        let e = r.expect_err("expected an error");
        let text = e.to_string();
        assert_eq!(e.op.as_deref(), Some(op), "{text}");
        assert!(text.contains(file!()), "location missing: {text}");
        e
    }

    #[test]
    fn softmax_wraps_dim() {
        let x = zeros(&[2, 3]);
        assert_eq!(x.softmax(-1).unwrap().0.op, Op::Softmax { dim: 1 });
        assert_eq!(x.log_softmax(0).unwrap().0.op, Op::LogSoftmax { dim: 0 });
        assert_err(x.softmax(2), "softmax");
        assert_err(Tensor::zeros(&[3], DType::I64).softmax(0), "softmax");
        assert_eq!(zeros(&[]).softmax(0).unwrap().shape(), &[] as &[usize]);
    }

    #[test]
    fn layer_norm_checks_normalized_shape() {
        let x = zeros(&[2, 3, 4]);
        let (w, b) = (zeros(&[3, 4]), zeros(&[3, 4]));
        let y = x.layer_norm(&[3, 4], Some(&w), Some(&b), 1e-5).unwrap();
        assert_eq!(y.shape(), &[2, 3, 4]);
        assert_eq!(y.0.op, Op::LayerNorm { ndim: 2, eps: 1e-5, weight: true, bias: true });
        let y = x.layer_norm(&[4], None, Some(&zeros(&[4])), 1e-5).unwrap();
        assert_eq!(
            (y.0.srcs(&crate::history::read()).len(), &y.0.op),
            (2, &Op::LayerNorm { ndim: 1, eps: 1e-5, weight: false, bias: true })
        );
        let e = assert_err(x.layer_norm(&[3], None, None, 1e-5), "layer_norm");
        assert!(e.to_string().contains("[*, 3]"), "{e}");
        assert_err(x.layer_norm(&[], None, None, 1e-5), "layer_norm");
        assert_err(x.layer_norm(&[1, 2, 3, 4], None, None, 1e-5), "layer_norm");
        assert_err(x.layer_norm(&[4], Some(&zeros(&[3])), None, 1e-5), "layer_norm");
        assert_err(Tensor::zeros(&[2, 4], DType::I32).layer_norm(&[4], None, None, 1e-5), "layer_norm");
    }

    #[test]
    fn rms_norm_args() {
        let x = zeros(&[2, 8]);
        let y = x.rms_norm(&[8], Some(&zeros(&[8])), None).unwrap();
        assert_eq!(y.0.op, Op::RmsNorm { ndim: 1, eps: None, weight: true });
        assert_eq!(x.rms_norm(&[2, 8], None, Some(1e-6)).unwrap().0.srcs(&crate::history::read()).len(), 1);
        assert_err(x.rms_norm(&[2], None, None), "rms_norm");
    }

    #[test]
    fn dropout_modes() {
        let x = zeros(&[4, 5]);
        let same = x.dropout(0.5, false).unwrap();
        assert!(std::sync::Arc::ptr_eq(&same.0, &x.0));
        assert!(std::sync::Arc::ptr_eq(&x.dropout(0.0, true).unwrap().0, &x.0));
        crate::manual_seed(7);
        let a = x.dropout(0.25, true).unwrap();
        let b = x.dropout(0.25, true).unwrap();
        // each draws its own counters; the graph gets them as one stream at offsets 0 and 20
        assert_eq!(a.0.draw, Some(coil_ir::RandomState { seed: 7, offset: 0 }));
        assert_eq!(b.0.draw, Some(coil_ir::RandomState { seed: 7, offset: 20 }));
        let captured = crate::capture(&[&b, &a]);
        assert_eq!(captured.random, vec![coil_ir::RandomState { seed: 7, offset: 0 }]);
        let ops: Vec<&Op> = captured.graph.nodes.iter().map(|n| &n.op).collect();
        assert!(ops.contains(&&Op::Dropout { p: 0.25, stream: 0, offset: 20 }), "{}", captured.graph);
        assert!(ops.contains(&&Op::Dropout { p: 0.25, stream: 0, offset: 0 }), "{}", captured.graph);
        assert_eq!(x.dropout(1.0, true).unwrap().shape(), &[4, 5]);
        assert_err(x.dropout(1.5, false), "dropout");
        assert_err(x.dropout(-0.1, true), "dropout");
        assert_err(Tensor::zeros(&[3], DType::I64).dropout(0.5, true), "dropout");
    }

    #[test]
    fn embedding_operand_order() {
        let w = zeros(&[10, 4]);
        let idx = Tensor::zeros(&[2, 3], DType::I64);
        let y = embedding(&idx, &w).unwrap();
        assert_eq!(y.shape(), &[2, 3, 4]);
        assert!(std::sync::Arc::ptr_eq(&y.0.srcs(&crate::history::read())[0].0, &w.0));
        assert_err(embedding(&zeros(&[3]), &w), "embedding");
        assert_err(embedding(&idx, &zeros(&[10])), "embedding");
    }

    #[test]
    fn losses() {
        let logits = zeros(&[8, 5]);
        let target = Tensor::zeros(&[8], DType::I64);
        let l = logits.cross_entropy(&target, CrossEntropyOptions::default()).unwrap();
        assert_eq!(l.shape(), &[] as &[usize]);
        assert_eq!(
            l.0.op,
            Op::CrossEntropy {
                ignore_index: -100,
                reduction: LossReduction::Mean,
                label_smoothing: 0.0,
                weight: false
            }
        );
        let opts = CrossEntropyOptions { reduction: LossReduction::None, ..Default::default() };
        assert_eq!(logits.cross_entropy(&target, opts).unwrap().shape(), &[8]);
        assert_err(logits.cross_entropy(&Tensor::zeros(&[7], DType::I64), opts), "cross_entropy");
        assert_err(logits.cross_entropy(&zeros(&[8]), opts), "cross_entropy");
        let bad = CrossEntropyOptions { label_smoothing: 1.5, ..Default::default() };
        assert_err(logits.cross_entropy(&target, bad), "cross_entropy");
        assert_eq!(logits.mse_loss(&zeros(&[5]), LossReduction::None).unwrap().shape(), &[8, 5]);
        assert_eq!(logits.mse_loss(&logits, LossReduction::Sum).unwrap().shape(), &[] as &[usize]);
        assert_err(logits.mse_loss(&zeros(&[4]), LossReduction::Mean), "mse_loss");
    }

    #[test]
    fn attention_args() {
        let (q, k, v) = (zeros(&[2, 4, 8]), zeros(&[2, 6, 8]), zeros(&[2, 6, 3]));
        let y = scaled_dot_product_attention(&q, &k, &v, None, true, Some(0.5)).unwrap();
        assert_eq!(y.shape(), &[2, 4, 3]);
        assert_eq!(y.0.op, Op::Attention { causal: true, scale: Some(0.5), mask: false, dropout: None });
        let y = scaled_dot_product_attention_dropout(&q, &k, &v, None, 0.25, true, None).unwrap();
        assert!(matches!(y.0.op, Op::Attention { dropout: Some(d), .. } if d.p == 0.25));
        for p in [1.0, -0.1, f64::NAN] {
            let e = assert_err(
                scaled_dot_product_attention_dropout(&q, &k, &v, None, p, false, None),
                "scaled_dot_product_attention",
            );
            assert!(e.to_string().contains("dropout_p") && e.to_string().contains("f32[2, 4, 8]"), "{e}");
        }
        let mask = Tensor::zeros(&[4, 6], DType::Bool);
        let y = scaled_dot_product_attention(&q, &k, &v, Some(&mask), false, None).unwrap();
        assert_eq!(y.0.srcs(&crate::history::read()).len(), 4);
        let e = assert_err(
            scaled_dot_product_attention(&q, &k, &v, Some(&mask), true, None),
            "scaled_dot_product_attention",
        );
        assert!(e.to_string().contains("bool[4, 6]"), "{e}");
        assert_err(
            scaled_dot_product_attention(&q, &zeros(&[2, 6, 7]), &v, None, false, None),
            "scaled_dot_product_attention",
        );
    }
}
