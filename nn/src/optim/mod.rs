//! Optimizers ([`Sgd`], [`AdamW`]), gradient clipping ([`clip_grad_norm`]) and learning-rate
//! schedules ([`LrSchedule`]), with PyTorch's semantics and defaults.
//!
//! A step takes the gradients as tensors (computed by `coil::value_and_grad`, or pending: a
//! clipping in front of the step fuses into it) and updates every parameter and every state
//! tensor in place, in one graph ([`coil_frontend::update_in_place`]): the new values are
//! written over the old buffers, so memory does not grow from step to step and nothing of an
//! earlier step stays alive. Hyperparameters that change between steps (the learning rate,
//! bias corrections) enter that graph as a small tensor, not as constants, so it compiles once.

mod adamw;
mod schedule;
mod sgd;

pub use adamw::{AdamW, AdamWConfig};
pub use schedule::{Constant, LrSchedule, WarmupCosine};
pub use sgd::{Sgd, SgdConfig};

use crate::param::Param;
use coil_frontend::Tensor;
use coil_ir::{DType, Error, ErrorKind, Result};
use std::panic::Location;

/// What every optimizer does.
pub trait Optimizer {
    /// One update of every parameter from its gradient (`grads[i]` for `params()[i]`).
    fn step(&mut self, grads: &[Tensor]) -> Result<()>;
    /// The parameters it updates, in order.
    fn params(&self) -> &[Param];
    /// The learning rate of the next step.
    fn lr(&self) -> f64;
    /// Sets the learning rate of the next steps (schedules call this).
    fn set_lr(&mut self, lr: f64);
    /// Steps taken so far.
    fn steps(&self) -> u64;
    /// The state tensors by name (`<param>.exp_avg`, `<param>.momentum_buffer`, ...), as
    /// PyTorch's `state_dict` holds them.
    fn state(&self) -> Vec<(String, Tensor)>;
    /// Restores the state saved by [`Optimizer::state`] and the step count.
    fn load_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()>;
}

/// The state tensor `name` of `state`, checked against `like` and copied into a buffer of its
/// own on `like`'s device (the next steps write over it).
fn restore(state: &[(String, Tensor)], name: &str, like: &Tensor) -> Result<Tensor> {
    let found = state.iter().find(|(n, _)| n == name).map(|(_, t)| t);
    let t = found.ok_or_else(|| Error::value(format!("no optimizer state {name}")))?;
    if t.meta() != like.meta() {
        return Err(Error::shape(format!("optimizer state {name} is {}, expected {}", t.meta(), like.meta())));
    }
    t.to_device(like.device())?.mul(1.0)
}

/// Scales `grads` so that their global L2 norm is at most `max_norm`
/// (`torch.nn.utils.clip_grad_norm_`): each is multiplied by `min(1, max_norm / (norm + 1e-6))`.
/// Returns the clipped gradients and the norm before clipping, all pending: passed to an
/// optimizer step, the clipping runs in the step's graph.
///
/// ```
/// use coil_frontend::Tensor;
/// let g = Tensor::from_vec(vec![3.0f32, 4.0], &[2])?;
/// let (clipped, norm) = coil_nn::clip_grad_norm(&[g], 1.0)?;
/// assert_eq!(norm.item::<f32>()?, 5.0);
/// let c = clipped[0].to_vec::<f32>()?;
/// assert!((c[0] - 0.6).abs() < 1e-6 && (c[1] - 0.8).abs() < 1e-6);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn clip_grad_norm(grads: &[Tensor], max_norm: f64) -> Result<(Vec<Tensor>, Tensor)> {
    let location = Location::caller();
    if grads.is_empty() {
        return Err(Error::value("clip_grad_norm expects at least one gradient")
            .in_op("clip_grad_norm", vec![])
            .at(location));
    }
    let mut total: Option<Tensor> = None;
    for g in grads {
        let squares = g.to_dtype(DType::F32)?.square_sum()?;
        total = Some(match total {
            None => squares,
            Some(t) => t.add(&squares)?,
        });
    }
    let norm = total.expect("one gradient at least").sqrt()?;
    let coef = norm.add(1e-6)?.rdiv(max_norm)?.clamp(None::<f64>, Some(1.0))?;
    let clipped = grads.iter().map(|g| g.mul(&coef.to_dtype(g.dtype())?)).collect::<Result<Vec<_>>>()?;
    Ok((clipped, norm))
}

/// The sum of squares of every element, as a 0-d tensor.
trait SquareSum {
    fn square_sum(&self) -> Result<Tensor>;
}

impl SquareSum for Tensor {
    fn square_sum(&self) -> Result<Tensor> {
        self.mul(self)?.sum(&[], false)
    }
}

/// Checks a step's gradients against the parameters: one each, of the same shape and device.
fn check_grads(
    params: &[Param],
    grads: &[Tensor],
    op: &'static str,
    location: &'static Location<'static>,
) -> Result<()> {
    let fail = |m: String| Err(Error::new(ErrorKind::Shape, m).in_op(op, vec![]).at(location));
    if grads.len() != params.len() {
        return fail(format!("{} gradients for {} parameters", grads.len(), params.len()));
    }
    for (p, g) in params.iter().zip(grads) {
        if g.shape() != p.shape().as_slice() || g.device() != p.device() || !g.dtype().is_float() {
            return fail(format!(
                "the gradient of {} is {} on {}; the parameter is {:?} {} on {}",
                p.name(),
                g.meta(),
                g.device(),
                p.shape(),
                p.dtype(),
                p.device()
            ));
        }
    }
    Ok(())
}

/// The step's changing hyperparameters as one small f32 tensor on the parameters' device, and
/// its elements as 0-d views (one upload per step; the graph's structure does not change).
fn hyperparameters(values: &[f64], device: coil_runtime::Device) -> Result<Vec<Tensor>> {
    let host = Tensor::from_vec(values.iter().map(|&v| v as f32).collect::<Vec<f32>>(), &[values.len()])?;
    let t = host.to_device(device)?;
    (0..values.len()).map(|i| t.select(0, i as i64)).collect()
}

/// Zero-filled state tensors like `params`, computed (one graph).
fn zeros_like_all(params: &[Param]) -> Result<Vec<Tensor>> {
    let zeros: Vec<Tensor> = params.iter().map(|p| p.tensor().zeros_like()).collect();
    let zeros: Vec<Tensor> = zeros.iter().zip(params).map(|(z, p)| z.to_device(p.device())).collect::<Result<_>>()?;
    coil_frontend::realize(&zeros.iter().collect::<Vec<_>>())?;
    Ok(zeros)
}
