//! Drawing from distributions over categories: `multinomial`, and [`Tensor::sample_tokens`],
//! the temperature / top-k / top-p (nucleus) sampling of generation.
//!
//! Both are built from ops that run on the device, so a decode step samples without a round
//! trip to the host: a `cumsum` of the probabilities (the inverse CDF's table), uniform random
//! numbers from the thread's Philox stream (seeded by [`crate::manual_seed`], drawn at run-time
//! seed and offset, so a compiled step draws new numbers every call and the same numbers on
//! every device), and a count of the table entries below each draw, which is the drawn
//! category. Sampling without replacement is an exponential race: the `k` smallest of `E_i / p_i`
//! for exponential `E_i` (a weighted draw without replacement, as PyTorch's CPU kernel does),
//! through `argsort`.

use super::shape::Loc;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Op, RandDist, Result, TensorMeta};
use coil_runtime::Device;
use std::panic::Location;

/// How [`Tensor::sample_tokens`] picks a token from logits: the logits are divided by
/// `temperature`, only the `top_k` most likely tokens are kept, then only the smallest set of
/// the most likely tokens whose probabilities reach `top_p`; the kept probabilities are
/// renormalized and one token is drawn. `temperature == 0` picks the most likely token
/// (greedy; ties to the lowest id).
///
/// ```
/// use coil_frontend::ops::sampling::Sampling;
/// let s = Sampling { temperature: 0.8, top_k: Some(50), top_p: Some(0.95) };
/// assert_eq!(Sampling::default(), Sampling { temperature: 1.0, top_k: None, top_p: None });
/// assert_eq!(Sampling::greedy().temperature, 0.0);
/// # let _ = s;
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits (finite, at least 0); 0 is greedy decoding.
    pub temperature: f64,
    /// Keep the `k` most likely tokens (at least 1; more than the vocabulary keeps all).
    pub top_k: Option<usize>,
    /// Keep the most likely tokens until their probabilities reach `p`, in `(0, 1]`.
    pub top_p: Option<f64>,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling { temperature: 1.0, top_k: None, top_p: None }
    }
}

impl Sampling {
    /// Greedy decoding: the most likely token.
    ///
    /// ```
    /// use coil_frontend::{ops::sampling::Sampling, Tensor};
    /// let logits = Tensor::from_vec(vec![0.1f32, 2.0, 2.0, -1.0], &[4])?;
    /// assert_eq!(logits.sample_tokens(&Sampling::greedy())?.to_vec::<i64>()?, vec![1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn greedy() -> Sampling {
        Sampling { temperature: 0.0, ..Sampling::default() }
    }
}

impl Tensor {
    /// `torch.multinomial(probs, num_samples, replacement)`: for a 1-D tensor of category
    /// weights (or each row of a 2-D one), `num_samples` i64 category indices drawn with
    /// probabilities proportional to the weights, with or without replacement. The weights need
    /// not sum to 1; they must be non-negative and finite with a positive sum in every row (and,
    /// without replacement, at least `num_samples` positive): an error when the weights are
    /// already computed in host memory; weights still to be computed (or on a GPU) are not
    /// checked, to keep the draw on the device (a zero-sum row draws category 0). Draws come
    /// from the thread's random stream ([`crate::manual_seed`]).
    ///
    /// ```
    /// use coil_frontend::{manual_seed, Tensor};
    /// let p = Tensor::from_vec(vec![0.0f32, 3.0, 0.0, 1.0], &[4])?;
    /// manual_seed(7);
    /// let draws = p.multinomial(1000, true)?.to_vec::<i64>()?;
    /// assert!(draws.iter().all(|&d| d == 1 || d == 3));
    /// let ones = draws.iter().filter(|&&d| d == 1).count();
    /// assert!((650..850).contains(&ones), "{ones}"); // 750 expected
    /// manual_seed(7);
    /// assert_eq!(p.multinomial(1000, true)?.to_vec::<i64>()?, draws);
    /// let two = p.multinomial(2, false)?.to_vec::<i64>()?;
    /// assert!(two == [1, 3] || two == [3, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn multinomial(&self, num_samples: usize, replacement: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let fail = |e: Error| Err(Tensor::error("multinomial", &[self], e, loc));
        if !self.dtype().is_float() {
            return fail(Error::dtype(format!("expects floating-point probabilities, got {}", self.dtype())));
        }
        if !(1..=2).contains(&self.rank()) {
            return fail(Error::shape(format!("expects a 1-D or 2-D tensor, got {:?}", self.shape())));
        }
        let n = self.shape()[self.rank() - 1];
        if n == 0 {
            return fail(Error::shape("expects at least one category"));
        }
        if num_samples == 0 {
            return fail(Error::value("cannot draw 0 samples"));
        }
        if !replacement && num_samples > n {
            return fail(Error::value(format!(
                "cannot draw {num_samples} samples from {n} categories without replacement"
            )));
        }
        if let Some(weights) = computed_host_values(self) {
            for row in weights.chunks(n) {
                if row.iter().any(|w| !w.is_finite() || *w < 0.0) {
                    return fail(Error::value("the probabilities contain inf, NaN or an element below 0"));
                }
                if row.iter().sum::<f64>() <= 0.0 {
                    return fail(Error::value("invalid distribution: the probabilities of a row sum to 0"));
                }
                let positive = row.iter().filter(|w| **w > 0.0).count();
                if !replacement && positive < num_samples {
                    return fail(Error::value(format!(
                        "cannot draw {num_samples} samples without replacement from a row of {positive} positive weights"
                    )));
                }
            }
        }
        let rows = if self.rank() == 1 { self.reshape_to_at(&[1, n], loc)? } else { self.clone() };
        let b = rows.shape()[0];
        let work = if self.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
        let p = rows.to_dtype(work)?;
        let drawn = if replacement || num_samples == 1 {
            draw_categories(&p, num_samples, loc)?
        } else {
            // Exponential race: `-log(1 - u) / p`, the k smallest (a zero weight never wins).
            let u = Tensor::random(&[b, n], work, RandDist::Uniform, self.device())?;
            let race = u.neg()?.log1p()?.neg()?.div(&p)?;
            race.argsort_at(-1, false, "multinomial", loc)?.narrow(-1, 0, num_samples)?
        };
        if self.rank() == 1 {
            drawn.reshape_to_at(&[num_samples], loc)
        } else {
            Ok(drawn)
        }
    }

    /// Samples one token id per row of `logits` (`[..., vocab]`, any float dtype) as
    /// `sampling` says (see [`Sampling`]): an i64 tensor of the leading dims. One graph: with
    /// `top_p`, the logits are sorted (descending, stable), softmaxed, masked by rank and by the
    /// running sum of probabilities before each token (a token is kept while that sum is below
    /// `top_p`: the most likely token always is), and one draw from the kept probabilities
    /// (renormalized) picks a position, mapped back to its token id. Without `top_p`, the
    /// Gumbel-max draw (`argmax(logits / temperature + G)`, `G = -log(-log(u))` per token,
    /// over the `top_k` largest when given): the same distribution, one fused reduction.
    /// Seeded and reproducible through [`crate::manual_seed`]; a compiled decode step draws new
    /// numbers every call.
    ///
    /// ```
    /// use coil_frontend::{manual_seed, ops::sampling::Sampling, Tensor};
    /// let logits = Tensor::from_vec(vec![0.5f32, 2.0, 1.0, -1.0, 3.0, 0.0], &[2, 3])?;
    /// manual_seed(0);
    /// let nucleus = Sampling { temperature: 1.0, top_k: None, top_p: Some(1e-6) };
    /// assert_eq!(logits.sample_tokens(&nucleus)?.to_vec::<i64>()?, vec![1, 1]); // the argmax
    /// let two = Sampling { temperature: 0.7, top_k: Some(2), top_p: None };
    /// let ids = logits.sample_tokens(&two)?.to_vec::<i64>()?;
    /// assert!((ids[0] == 1 || ids[0] == 2) && (ids[1] == 1 || ids[1] == 2), "{ids:?}");
    /// assert!(logits.sample_tokens(&Sampling { top_p: Some(0.0), ..two }).is_err());
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn sample_tokens(&self, sampling: &Sampling) -> Result<Tensor> {
        let loc = Location::caller();
        let fail = |e: Error| Err(Tensor::error("sample_tokens", &[self], e, loc));
        let Sampling { temperature, top_k, top_p } = *sampling;
        if !self.dtype().is_float() {
            return fail(Error::dtype(format!("expects floating-point logits, got {}", self.dtype())));
        }
        if self.rank() == 0 || self.shape()[self.rank() - 1] == 0 {
            return fail(Error::shape(format!("expects logits of shape [..., vocab], got {:?}", self.shape())));
        }
        if !(temperature.is_finite() && temperature >= 0.0) {
            return fail(Error::value(format!("temperature must be finite and at least 0, got {temperature}")));
        }
        if top_k == Some(0) {
            return fail(Error::value("top_k must be at least 1"));
        }
        if let Some(p) = top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return fail(Error::value(format!("top_p must be in (0, 1], got {p}")));
        }
        let lead = self.shape()[..self.rank() - 1].to_vec();
        let vocab = self.shape()[self.rank() - 1];
        if temperature == 0.0 {
            return self.argmax(Some(-1), false);
        }
        let rows = self.reshape_to_at(&[lead.iter().product(), vocab], loc)?;
        let work = if self.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
        let scaled = rows.to_dtype(work)?.div(temperature)?;
        if top_p.is_none_or(|p| p >= 1.0) {
            // No nucleus: the Gumbel-max draw, `argmax(x + G)` with `G = -log(-log(u))` per
            // token, samples `softmax(x)` exactly, with no softmax, cumsum or (without top-k)
            // sort: one fused reduction.
            let (values, order) = match top_k.filter(|&k| k < vocab) {
                Some(k) => {
                    let (v, o) = scaled.topk(k, -1, true)?;
                    (v, Some(o))
                }
                None => (scaled, None),
            };
            let u = Tensor::random(values.shape(), work, RandDist::Uniform, self.device())?;
            let gumbel = u.log()?.neg()?.log()?.neg()?;
            let pick = values.add(&gumbel)?.argmax(Some(-1), true)?;
            let token = match order {
                Some(o) => o.gather(-1, &pick)?,
                None => pick,
            };
            return token.reshape_to_at(&lead, loc);
        }
        let order = scaled.argsort_at(-1, true, "sample_tokens", loc)?;
        let probs = scaled.gather(-1, &order)?.softmax(-1)?;
        // The kept tokens are a prefix of the sorted order (by rank, and by the mass before
        // each): the running sums of all probabilities are the kept ones' table, and the draw's
        // total is the last kept running sum (the largest kept one), so one cumsum serves both.
        let cdf = probs.cumsum(-1)?;
        let mut keep: Option<Tensor> = None;
        let mut and = |m: Tensor| -> Result<()> {
            keep = Some(match keep.take() {
                Some(k) => k.logical_and(&m)?,
                None => m,
            });
            Ok(())
        };
        if let Some(k) = top_k.filter(|&k| k < vocab) {
            let meta = TensorMeta::new(probs.shape().to_vec(), DType::I64);
            let rank = Tensor::leaf_on(Op::Iota { dim: 1 }, meta, self.device(), Some(loc));
            and(rank.lt(k as i64)?)?;
        }
        if let Some(p) = top_p.filter(|&p| p < 1.0) {
            and(cdf.sub(&probs)?.lt(p)?)?;
        }
        let total = match keep {
            Some(m) => crate::where_(&m, &cdf, 0.0)?.amax(&[-1], true)?,
            None => cdf.narrow(-1, vocab as i64 - 1, 1)?,
        };
        let position = draw_from_table(&cdf, &total, 1, loc)?;
        let token = order.gather(-1, &position)?;
        token.reshape_to_at(&lead, loc)
    }

    fn reshape_to_at(&self, shape: &[usize], loc: Loc) -> Result<Tensor> {
        Tensor::record(Op::Reshape { shape: shape.to_vec() }, &[self], loc)
    }
}

/// `t`'s values when they are already computed and in host memory (reading them costs no
/// device copy and no graph break), else `None`.
fn computed_host_values(t: &Tensor) -> Option<Vec<f64>> {
    if t.device() != Device::Cpu {
        return None;
    }
    let buffer = t.0.storage.get()?.to_host().ok()?;
    Some(buffer.to_vec::<f64>())
}

/// `samples` categories per row of the non-negative weights `p` (`[rows, n]`, f32 or f64),
/// with replacement, from their running sums. i64 `[rows, samples]`.
#[track_caller]
fn draw_categories(p: &Tensor, samples: usize, loc: Loc) -> Result<Tensor> {
    let n = p.shape()[1];
    let cdf = p.cumsum(-1)?;
    let total = cdf.narrow(-1, n as i64 - 1, 1)?;
    draw_from_table(&cdf, &total, samples, loc)
}

/// `samples` draws per row from the table `cdf` (`[rows, n]`, running sums of non-negative
/// weights) whose categories end where the running sum reaches `total` (`[rows, 1]`, one of
/// the row's entries; later entries are not drawn). A draw `u` in `[0, 1)` picks the number
/// of entries with `cdf <= u * total`, counting only entries below `total`: so a draw that
/// rounds up to `total` still lands on the last category of positive weight, and a zero weight,
/// whose running sum equals its predecessor's, is never picked. i64 `[rows, samples]`.
#[track_caller]
fn draw_from_table(cdf: &Tensor, total: &Tensor, samples: usize, loc: Loc) -> Result<Tensor> {
    let rows = cdf.shape()[0];
    let u = Tensor::random(&[rows, samples], cdf.dtype(), RandDist::Uniform, cdf.device())?;
    let target = u.mul(total)?.unsqueeze(-1)?; // [rows, samples, 1]
    let table = cdf.unsqueeze(-2)?; // [rows, 1, n]
    let below = table.le(&target)?.logical_and(&table.lt(&total.unsqueeze(-1)?)?)?;
    below.sum(&[-1], false).map_err(|e| e.in_op("multinomial", vec![]).at(loc))
}
