//! Loss functions (`torch.nn.functional`) written as compositions of primitives: `nll_loss`,
//! `l1_loss`, `smooth_l1_loss`, `huber_loss`, `binary_cross_entropy` (with logits), `kl_div`,
//! `margin_ranking_loss`, `soft_margin_loss`, `hinge_embedding_loss`, `poisson_nll_loss`,
//! `gaussian_nll_loss`; and the distances `cosine_similarity`, `pairwise_distance` and
//! `normalize`. Pointwise losses broadcast input and target, as PyTorch does.

use crate::ops::composite::CompositeScope;
use crate::ops::math::require_float;
use crate::ops::pointwise::where_;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, LossReduction, Result};
use std::panic::Location;

/// How [`Tensor::kl_div`] combines the pointwise losses; `BatchMean` (the sum divided by the
/// size of dim 0) is the one that matches the mathematical definition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KlDivReduction {
    /// The pointwise losses, not reduced.
    None,
    /// The sum divided by the size of dim 0.
    BatchMean,
    /// The sum.
    Sum,
    /// The mean over every element.
    Mean,
}

/// The options of [`Tensor::nll_loss`], with PyTorch's defaults (`ignore_index = -100`,
/// `reduction = mean`, no class weights).
///
/// ```
/// use coil_frontend::ops::loss::NllLossOptions;
/// assert_eq!(NllLossOptions::default().ignore_index, -100);
/// ```
#[derive(Clone, Debug)]
pub struct NllLossOptions {
    /// One weight per class, `[C]`.
    pub weight: Option<Tensor>,
    /// Targets equal to this index contribute nothing and are not counted by `mean`.
    pub ignore_index: i64,
    /// How the per-target losses combine.
    pub reduction: LossReduction,
}

impl Default for NllLossOptions {
    fn default() -> Self {
        NllLossOptions { weight: None, ignore_index: -100, reduction: LossReduction::Mean }
    }
}

/// Applies a loss reduction to the pointwise losses.
pub(crate) fn reduce(loss: Tensor, reduction: LossReduction) -> Result<Tensor> {
    match reduction {
        LossReduction::None => Ok(loss),
        LossReduction::Mean => loss.mean(&[], false),
        LossReduction::Sum => loss.sum_all(),
    }
}

impl Tensor {
    /// `F.l1_loss(input, target, reduction)`: `|input - target|`, reduced.
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// let y = Tensor::from_vec(vec![0.0f32, 4.0], &[2])?;
    /// assert_eq!(x.l1_loss(&y, LossReduction::Mean)?.item::<f32>()?, 1.5);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn l1_loss(&self, target: &Tensor, reduction: LossReduction) -> Result<Tensor> {
        let _scope = CompositeScope::enter("l1_loss", &[self, target], Location::caller());
        reduce(self.sub(target)?.abs()?, reduction)
    }

    /// `F.smooth_l1_loss(input, target, reduction, beta)`: `0.5 d^2 / beta` where
    /// `|d| < beta`, else `|d| - 0.5 beta` (`beta = 0` is the L1 loss).
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let x = Tensor::from_vec(vec![0.5f32, 3.0], &[2])?;
    /// let y = Tensor::zeros(&[2], coil_ir::DType::F32);
    /// assert_eq!(x.smooth_l1_loss(&y, LossReduction::None, 1.0)?.to_vec::<f32>()?, vec![0.125, 2.5]);
    /// assert_eq!(x.huber_loss(&y, LossReduction::None, 2.0)?.to_vec::<f32>()?, vec![0.125, 4.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn smooth_l1_loss(&self, target: &Tensor, reduction: LossReduction, beta: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("smooth_l1_loss", &[self, target], loc);
        if beta < 0.0 {
            let e = Error::value(format!("smooth_l1_loss does not support negative values for beta, got {beta}"));
            return Err(Tensor::error("smooth_l1_loss", &[self, target], e, loc));
        }
        let d = self.sub(target)?.abs()?;
        if beta == 0.0 {
            return reduce(d, reduction);
        }
        let quadratic = d.mul(&d)?.mul(0.5)?.div(beta)?;
        reduce(where_(&d.lt(beta)?, &quadratic, &d.sub(0.5 * beta)?)?, reduction)
    }

    /// `F.huber_loss(input, target, reduction, delta)`: `0.5 d^2` where `|d| < delta`, else
    /// `delta * (|d| - 0.5 delta)`.
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let x = Tensor::from_vec(vec![0.5f32, 3.0], &[2])?;
    /// let y = Tensor::zeros(&[2], coil_ir::DType::F32);
    /// assert_eq!(x.huber_loss(&y, LossReduction::Sum, 1.0)?.item::<f32>()?, 2.625);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn huber_loss(&self, target: &Tensor, reduction: LossReduction, delta: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("huber_loss", &[self, target], loc);
        if delta <= 0.0 {
            let e = Error::value(format!("huber_loss does not support non-positive values for delta, got {delta}"));
            return Err(Tensor::error("huber_loss", &[self, target], e, loc));
        }
        let d = self.sub(target)?.abs()?;
        let quadratic = d.mul(&d)?.mul(0.5)?;
        reduce(where_(&d.lt(delta)?, &quadratic, &d.sub(0.5 * delta)?.mul(delta)?)?, reduction)
    }

    /// `F.binary_cross_entropy(input, target, weight, reduction)`: `-(t log(x) + (1 - t)
    /// log(1 - x))`, each log clamped at -100 as PyTorch does; `input` holds probabilities and
    /// must have the target's shape. An input outside `[0, 1]` gives NaN (PyTorch checks the
    /// data and raises; a lazy graph has no data check to raise from).
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let x = Tensor::from_vec(vec![0.5f32, 1.0], &[2])?;
    /// let t = Tensor::from_vec(vec![1.0f32, 0.0], &[2])?;
    /// let l = x.binary_cross_entropy(&t, None, LossReduction::None)?.to_vec::<f32>()?;
    /// assert!((l[0] - 2f32.ln()).abs() < 1e-6 && l[1] == 100.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn binary_cross_entropy(
        &self,
        target: &Tensor,
        weight: Option<&Tensor>,
        reduction: LossReduction,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let mut srcs = vec![self, target];
        srcs.extend(weight);
        let _scope = CompositeScope::enter("binary_cross_entropy", &srcs, loc);
        require_float("binary_cross_entropy", self, loc)?;
        if self.shape() != target.shape() {
            let e = Error::shape(format!(
                "Using a target size ({:?}) that is different to the input size ({:?}) is deprecated. Please ensure they have the same size.",
                target.shape(),
                self.shape()
            ));
            return Err(Tensor::error("binary_cross_entropy", &srcs, e, loc));
        }
        let log_x = self.log()?.clamp_min(-100.0)?;
        let log_1mx = self.neg()?.log1p()?.clamp_min(-100.0)?;
        // (t - 1) * log(1 - x) - t * log(x), PyTorch's order.
        let loss = target.sub(1)?.mul(&log_1mx)?.sub(&target.mul(&log_x)?)?;
        let loss = match weight {
            Some(w) => loss.mul(w)?,
            None => loss,
        };
        reduce(loss, reduction)
    }

    /// `F.binary_cross_entropy_with_logits(input, target, weight, reduction, pos_weight)`:
    /// `(1 - t) x + (1 + (p - 1) t) softplus(-x)`, stable for large `|x|`.
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let x = Tensor::from_vec(vec![0.0f32], &[1])?;
    /// let t = Tensor::from_vec(vec![1.0f32], &[1])?;
    /// let l = x.binary_cross_entropy_with_logits(&t, None, None, LossReduction::Sum)?;
    /// assert!((l.item::<f32>()? - 2f32.ln()).abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn binary_cross_entropy_with_logits(
        &self,
        target: &Tensor,
        weight: Option<&Tensor>,
        pos_weight: Option<&Tensor>,
        reduction: LossReduction,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let mut srcs = vec![self, target];
        srcs.extend(weight);
        srcs.extend(pos_weight);
        let _scope = CompositeScope::enter("binary_cross_entropy_with_logits", &srcs, loc);
        require_float("binary_cross_entropy_with_logits", self, loc)?;
        if self.shape() != target.shape() {
            let e = Error::shape(format!(
                "Target size ({:?}) must be the same as input size ({:?})",
                target.shape(),
                self.shape()
            ));
            return Err(Tensor::error("binary_cross_entropy_with_logits", &srcs, e, loc));
        }
        let softplus_neg = self.neg()?.softplus(1.0, 20.0)?;
        let log_term = match pos_weight {
            Some(p) => p.sub(1)?.mul(target)?.add(1)?.mul(&softplus_neg)?,
            None => softplus_neg,
        };
        let loss = target.rsub(1)?.mul(self)?.add(&log_term)?;
        let loss = match weight {
            Some(w) => loss.mul(w)?,
            None => loss,
        };
        reduce(loss, reduction)
    }

    /// `F.kl_div(input, target, reduction, log_target)`: `input` holds log-probabilities;
    /// pointwise `target * (log(target) - input)` (0 where the target is 0), or
    /// `exp(target) * (target - input)` with `log_target`.
    ///
    /// ```
    /// use coil_frontend::{ops::loss::KlDivReduction, Tensor};
    /// let p = Tensor::from_vec(vec![0.5f32, 0.5], &[1, 2])?;
    /// let l = p.log()?.kl_div(&p, KlDivReduction::BatchMean, false)?;
    /// assert_eq!(l.item::<f32>()?, 0.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn kl_div(&self, target: &Tensor, reduction: KlDivReduction, log_target: bool) -> Result<Tensor> {
        let _scope = CompositeScope::enter("kl_div", &[self, target], Location::caller());
        let loss = if log_target {
            target.exp()?.mul(&target.sub(self)?)?
        } else {
            target.xlogy(target)?.sub(&target.mul(self)?)?
        };
        match reduction {
            KlDivReduction::None => Ok(loss),
            KlDivReduction::Sum => loss.sum_all(),
            KlDivReduction::Mean => loss.mean(&[], false),
            KlDivReduction::BatchMean if self.rank() == 0 => loss.sum_all(),
            KlDivReduction::BatchMean => loss.sum_all()?.div(self.shape()[0] as f64),
        }
    }

    /// `F.nll_loss(input, target, ...)`: `-input[n, target[n]]` (times the class weight), for
    /// log-probabilities `[N, C]`, `[C]` or `[N, C, d1, ...]` with targets `[N]`, `[]` or
    /// `[N, d1, ...]`; `mean` divides by the total weight of the counted targets. A target out
    /// of range is an error when the graph runs.
    ///
    /// ```
    /// use coil_frontend::{ops::loss::NllLossOptions, Tensor};
    /// let logp = Tensor::from_vec(vec![-1.0f32, -2.0, -3.0, -4.0], &[2, 2])?;
    /// let t = Tensor::from_vec(vec![1i64, 0], &[2])?;
    /// assert_eq!(logp.nll_loss(&t, NllLossOptions::default())?.item::<f32>()?, 2.5);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn nll_loss(&self, target: &Tensor, options: NllLossOptions) -> Result<Tensor> {
        let loc = Location::caller();
        let mut srcs = vec![self, target];
        srcs.extend(options.weight.as_ref());
        let _scope = CompositeScope::enter("nll_loss", &srcs, loc);
        let fail = |msg: String| Err(Tensor::error("nll_loss", &srcs, Error::shape(msg), loc));
        if !matches!(target.dtype(), DType::I64 | DType::I32 | DType::U8 | DType::I8 | DType::I16) {
            let e = Error::dtype(format!("expected an integer target, got {}", target.dtype()));
            return Err(Tensor::error("nll_loss", &srcs, e, loc));
        }
        if self.rank() == 0 {
            return fail("input tensor should be 1D, 2D or more".into());
        }
        // [C] with a 0-d target is one sample; [N, C, d...] moves C last and flattens.
        let (x, t) = if self.rank() == 1 {
            if target.rank() != 0 {
                return fail(format!("expected a 0-d target for 1-D input, got {:?}", target.shape()));
            }
            (self.unsqueeze(0)?, target.reshape(&[1])?)
        } else {
            let mut expected = vec![self.shape()[0]];
            expected.extend_from_slice(&self.shape()[2..]);
            if target.shape() != expected.as_slice() {
                return fail(format!("expected target of shape {expected:?}, got {:?}", target.shape()));
            }
            let c = self.shape()[1] as i64;
            (self.movedim(1, -1)?.reshape(&[-1, c])?, target.reshape(&[-1])?)
        };
        let classes = x.shape()[1];
        if let Some(w) = &options.weight {
            if w.shape() != [classes] {
                return fail(format!("weight tensor should be defined either for all {classes} classes or no classes but got weight tensor of shape: {:?}", w.shape()));
            }
        }
        let t = t.to_dtype(DType::I64)?;
        let counted = t.ne(options.ignore_index)?;
        let safe_t = where_(&counted, &t, 0)?;
        let picked = x.gather(1, &safe_t.unsqueeze(1)?)?.squeeze_dim(1)?.neg()?;
        let w = match &options.weight {
            Some(w) => w.index_select(0, &safe_t)?.mul(&counted.to_dtype(w.dtype())?)?,
            None => counted.to_dtype(x.dtype())?,
        };
        let loss = picked.mul(&w)?;
        match options.reduction {
            LossReduction::None if self.rank() == 1 => loss.reshape(&[]),
            LossReduction::None if self.rank() > 2 => {
                loss.reshape(&target.shape().iter().map(|&s| s as i64).collect::<Vec<_>>())
            }
            LossReduction::None => Ok(loss),
            LossReduction::Sum => loss.sum_all(),
            LossReduction::Mean => loss.sum_all()?.div(&w.sum_all()?),
        }
    }

    /// `F.margin_ranking_loss(x1, x2, y, margin, reduction)`: `max(0, -y (x1 - x2) + margin)`.
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let a = Tensor::from_vec(vec![1.0f32, 1.0], &[2])?;
    /// let b = Tensor::from_vec(vec![0.0f32, 3.0], &[2])?;
    /// let y = Tensor::from_vec(vec![1.0f32, 1.0], &[2])?;
    /// assert_eq!(a.margin_ranking_loss(&b, &y, 0.0, LossReduction::None)?.to_vec::<f32>()?, vec![0.0, 2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn margin_ranking_loss(
        &self,
        other: &Tensor,
        target: &Tensor,
        margin: f64,
        reduction: LossReduction,
    ) -> Result<Tensor> {
        let _scope = CompositeScope::enter("margin_ranking_loss", &[self, other, target], Location::caller());
        let loss = target.neg()?.mul(&self.sub(other)?)?.add(margin)?.clamp_min(0.0)?;
        reduce(loss, reduction)
    }

    /// `F.soft_margin_loss(input, target, reduction)`: `log(1 + exp(-target * input))`.
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let x = Tensor::from_vec(vec![0.0f32], &[1])?;
    /// let l = x.soft_margin_loss(&x.ones_like(), LossReduction::Mean)?;
    /// assert!((l.item::<f32>()? - 2f32.ln()).abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn soft_margin_loss(&self, target: &Tensor, reduction: LossReduction) -> Result<Tensor> {
        let _scope = CompositeScope::enter("soft_margin_loss", &[self, target], Location::caller());
        reduce(target.neg()?.mul(self)?.exp()?.log1p()?, reduction)
    }

    /// `F.hinge_embedding_loss(input, target, margin, reduction)`: `input` where the target is
    /// 1, `max(0, margin - input)` where it is -1 (both for other targets).
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let x = Tensor::from_vec(vec![0.3f32, 0.3], &[2])?;
    /// let y = Tensor::from_vec(vec![1.0f32, -1.0], &[2])?;
    /// let l = x.hinge_embedding_loss(&y, 1.0, LossReduction::None)?.to_vec::<f32>()?;
    /// assert!((l[0] - 0.3).abs() < 1e-6 && (l[1] - 0.7).abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn hinge_embedding_loss(&self, target: &Tensor, margin: f64, reduction: LossReduction) -> Result<Tensor> {
        let _scope = CompositeScope::enter("hinge_embedding_loss", &[self, target], Location::caller());
        let margin_part = where_(&target.ne(1)?, &self.rsub(margin)?.clamp_min(0.0)?, 0.0)?;
        let self_part = where_(&target.ne(-1)?, self, 0.0)?;
        reduce(margin_part.add(&self_part)?, reduction)
    }

    /// `F.poisson_nll_loss(input, target, log_input, full, eps, reduction)`: `exp(x) - t x` for
    /// log-rates (`log_input`), else `x - t log(x + eps)`; `full` adds Stirling's
    /// approximation `t log t - t + log(2 pi t) / 2` where `t > 1`.
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let x = Tensor::from_vec(vec![0.0f32], &[1])?;
    /// let t = Tensor::from_vec(vec![1.0f32], &[1])?;
    /// assert_eq!(x.poisson_nll_loss(&t, true, false, 1e-8, LossReduction::Sum)?.item::<f32>()?, 1.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn poisson_nll_loss(
        &self,
        target: &Tensor,
        log_input: bool,
        full: bool,
        eps: f64,
        reduction: LossReduction,
    ) -> Result<Tensor> {
        let _scope = CompositeScope::enter("poisson_nll_loss", &[self, target], Location::caller());
        let mut loss = if log_input {
            self.exp()?.sub(&target.mul(self)?)?
        } else {
            self.sub(&target.mul(&self.add(eps)?.log()?)?)?
        };
        if full {
            let stirling = target
                .mul(&target.log()?)?
                .sub(target)?
                .add(&target.mul(2.0 * std::f64::consts::PI)?.log()?.mul(0.5)?)?;
            let stirling = where_(&target.gt(1)?, &stirling, 0.0)?;
            loss = loss.add(&stirling)?;
        }
        reduce(loss, reduction)
    }

    /// `F.gaussian_nll_loss(input, target, var, full, eps, reduction)`:
    /// `(log(max(var, eps)) + (input - target)^2 / max(var, eps)) / 2`, plus `log(2 pi) / 2`
    /// when `full`.
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32], &[1])?;
    /// let var = Tensor::from_vec(vec![1.0f32], &[1])?;
    /// let l = x.gaussian_nll_loss(&x.zeros_like(), &var, false, 1e-6, LossReduction::Mean)?;
    /// assert_eq!(l.item::<f32>()?, 0.5);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn gaussian_nll_loss(
        &self,
        target: &Tensor,
        var: &Tensor,
        full: bool,
        eps: f64,
        reduction: LossReduction,
    ) -> Result<Tensor> {
        let _scope = CompositeScope::enter("gaussian_nll_loss", &[self, target, var], Location::caller());
        // PyTorch clamps var without recording it for autograd: the gradient passes as if unclamped.
        let clamped = var.add(&var.clamp_min(eps)?.sub(var)?.detach()?)?;
        let d = self.sub(target)?;
        let mut loss = clamped.log()?.add(&d.mul(&d)?.div(&clamped)?)?.mul(0.5)?;
        if full {
            loss = loss.add(0.5 * (2.0 * std::f64::consts::PI).ln())?;
        }
        reduce(loss, reduction)
    }

    /// `F.cosine_similarity(x1, x2, dim, eps)`: `sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps))`
    /// along `dim`, after broadcasting; as in PyTorch the clamp of the norms passes no gradient.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 0.0], &[1, 2])?;
    /// let b = Tensor::from_vec(vec![2.0f32, 0.0], &[1, 2])?;
    /// assert_eq!(a.cosine_similarity(&b, 1, 1e-8)?.to_vec::<f32>()?, vec![1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn cosine_similarity(&self, other: &Tensor, dim: i64, eps: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("cosine_similarity", &[self, other], loc);
        let shape = self.add(other)?.shape().to_vec();
        let a = self.broadcast_to(&shape)?;
        let b = other.broadcast_to(&shape)?;
        let unit = |x: &Tensor| -> Result<Tensor> {
            let n = x.norm(2.0, &[dim], true)?;
            x.div(&n.add(&n.clamp_min(eps)?.sub(&n)?.detach()?)?)
        };
        unit(&a)?.mul(&unit(&b)?)?.sum(&[dim], false)
    }

    /// `F.pairwise_distance(x1, x2, p, eps, keepdim)`: `||x1 - x2 + eps||_p` over the last dim.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![3.0f32, 0.0], &[1, 2])?;
    /// let b = Tensor::from_vec(vec![0.0f32, 4.0], &[1, 2])?;
    /// let d = a.pairwise_distance(&b, 2.0, 0.0, false)?.to_vec::<f32>()?;
    /// assert_eq!(d, vec![5.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn pairwise_distance(&self, other: &Tensor, p: f64, eps: f64, keepdim: bool) -> Result<Tensor> {
        let _scope = CompositeScope::enter("pairwise_distance", &[self, other], Location::caller());
        let d = self.sub(other)?.add(eps)?;
        let rank = d.rank();
        if rank == 0 {
            return d.norm(p, &[], keepdim);
        }
        d.norm(p, &[-1], keepdim)
    }

    /// `F.normalize(x, p, dim, eps)`: `x / max(||x||_p, eps)` along `dim`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, 4.0], &[1, 2])?;
    /// assert_eq!(x.normalize(2.0, 1, 1e-12)?.to_vec::<f32>()?, vec![0.6, 0.8]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn normalize(&self, p: f64, dim: i64, eps: f64) -> Result<Tensor> {
        let _scope = CompositeScope::enter("normalize", &[self], Location::caller());
        self.div(&self.norm(p, &[dim], true)?.clamp_min(eps)?)
    }

    /// `F.cosine_embedding_loss(x1, x2, y, margin, reduction)`: `1 - cos(x1, x2)` where `y` is 1,
    /// `max(0, cos - margin)` where it is -1, with PyTorch's cosine (`eps = 1e-12` added to each
    /// squared norm) along the last dim.
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let a = Tensor::from_vec(vec![1.0f32, 0.0], &[1, 2])?;
    /// let y = Tensor::from_vec(vec![1.0f32], &[1])?;
    /// assert!(a.cosine_embedding_loss(&a, &y, 0.0, LossReduction::Mean)?.item::<f32>()?.abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn cosine_embedding_loss(
        &self,
        other: &Tensor,
        target: &Tensor,
        margin: f64,
        reduction: LossReduction,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("cosine_embedding_loss", &[self, other, target], loc);
        if self.rank() == 0 || self.rank() > 2 || self.shape() != other.shape() {
            let e = Error::shape(format!(
                "cosine_embedding_loss expects two 1-D or 2-D inputs of one shape, got {:?} and {:?}",
                self.shape(),
                other.shape()
            ));
            return Err(Tensor::error("cosine_embedding_loss", &[self, other, target], e, loc));
        }
        let dim = self.rank() as i64 - 1;
        let dot = self.mul(other)?.sum(&[dim], false)?;
        let m1 = self.mul(self)?.sum(&[dim], false)?.add(1e-12)?;
        let m2 = other.mul(other)?.sum(&[dim], false)?.add(1e-12)?;
        let cos = dot.div(&m1.mul(&m2)?.sqrt()?)?;
        let pos = where_(&target.eq(1)?, &cos.rsub(1)?, 0.0)?;
        let neg = where_(&target.eq(-1)?, &cos.sub(margin)?.clamp_min(0.0)?, 0.0)?;
        reduce(pos.add(&neg)?, reduction)
    }

    /// `F.triplet_margin_loss(anchor, positive, negative, margin, p, eps, swap, reduction)`:
    /// `max(d(a, p) - d(a, n) + margin, 0)` with `d` the [`Tensor::pairwise_distance`]; `swap`
    /// uses `min(d(a, n), d(p, n))`.
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let a = Tensor::from_vec(vec![0.0f32, 0.0], &[1, 2])?;
    /// let p = Tensor::from_vec(vec![0.0f32, 1.0], &[1, 2])?;
    /// let n = Tensor::from_vec(vec![3.0f32, 0.0], &[1, 2])?;
    /// let l = a.triplet_margin_loss(&p, &n, 1.0, 2.0, 0.0, false, LossReduction::Mean)?;
    /// assert_eq!(l.item::<f32>()?, 0.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn triplet_margin_loss(
        &self,
        positive: &Tensor,
        negative: &Tensor,
        margin: f64,
        p: f64,
        eps: f64,
        swap: bool,
        reduction: LossReduction,
    ) -> Result<Tensor> {
        let _scope = CompositeScope::enter("triplet_margin_loss", &[self, positive, negative], Location::caller());
        let d_pos = self.pairwise_distance(positive, p, eps, false)?;
        let mut d_neg = self.pairwise_distance(negative, p, eps, false)?;
        if swap {
            d_neg = d_neg.minimum(&positive.pairwise_distance(negative, p, eps, false)?)?;
        }
        reduce(d_pos.sub(&d_neg)?.add(margin)?.clamp_min(0.0)?, reduction)
    }

    /// `F.multilabel_soft_margin_loss(input, target, weight, reduction)`: the binary cross
    /// entropy of each class's logit, averaged over the classes (the last dim).
    ///
    /// ```
    /// use coil_frontend::{ops::nn::LossReduction, Tensor};
    /// let x = Tensor::zeros(&[1, 2], coil_ir::DType::F32);
    /// let y = Tensor::from_vec(vec![1.0f32, 0.0], &[1, 2])?;
    /// let l = x.multilabel_soft_margin_loss(&y, None, LossReduction::Mean)?;
    /// assert!((l.item::<f32>()? - 2f32.ln()).abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn multilabel_soft_margin_loss(
        &self,
        target: &Tensor,
        weight: Option<&Tensor>,
        reduction: LossReduction,
    ) -> Result<Tensor> {
        let mut srcs = vec![self, target];
        srcs.extend(weight);
        let _scope = CompositeScope::enter("multilabel_soft_margin_loss", &srcs, Location::caller());
        let loss = target.mul(&self.logsigmoid()?)?.add(&target.rsub(1)?.mul(&self.neg()?.logsigmoid()?)?)?.neg()?;
        let loss = match weight {
            Some(w) => loss.mul(w)?,
            None => loss,
        };
        let class_dim = self.rank().max(1) as i64 - 1;
        let classes = if self.rank() == 0 { 1 } else { self.shape()[class_dim as usize] };
        reduce(loss.sum(&[class_dim], false)?.div(classes as f64)?, reduction)
    }
}
