//! Batch normalization (`nn.BatchNorm2d`), with running statistics updated in place.

use crate::param::{Init, Mode, Param, Path};
use crate::Module;
use coil_frontend::{is_compiling, update_in_place_with, IntoTensor, Tensor};
use coil_ir::{DType, Error, Result};
use std::panic::Location;

/// `nn.BatchNorm2d`'s options and defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormConfig {
    /// Added to the variance before its square root (1e-5).
    pub eps: f64,
    /// The weight of a batch's statistics in the running ones; `None`: a cumulative average
    /// (`1 / num_batches_tracked`), as PyTorch's `momentum=None`.
    pub momentum: Option<f64>,
    /// Learnable `weight` (ones) and `bias` (zeros).
    pub affine: bool,
    /// Keep `running_mean`, `running_var` and `num_batches_tracked`, used in evaluation mode;
    /// without them both modes normalize with the batch's statistics.
    pub track_running_stats: bool,
}

impl Default for BatchNormConfig {
    fn default() -> BatchNormConfig {
        BatchNormConfig { eps: 1e-5, momentum: Some(0.1), affine: true, track_running_stats: true }
    }
}

/// The running statistics of a [`BatchNorm2d`] (PyTorch's buffers): frozen parameters, saved
/// and loaded with the others, never updated by an optimizer.
#[derive(Clone, Debug)]
pub struct RunningStats {
    /// `running_mean`, per channel.
    pub mean: Param,
    /// `running_var` (unbiased), per channel.
    pub var: Param,
    /// i64, 0-d: the training-mode forward passes so far.
    pub num_batches_tracked: Param,
}

/// `nn.BatchNorm2d(num_features, eps, momentum, affine, track_running_stats)` over
/// `[N, C, H, W]` (any rank >= 2 works: every dim but 1 is reduced).
///
/// In training mode ([`crate::ParamStore::train`]) it normalizes with the batch's mean and
/// biased variance and writes `running = (1 - momentum) running + momentum batch` over the
/// running statistics in place (the variance unbiased, `n / (n - 1)`), adding one to
/// `num_batches_tracked`, as PyTorch does; in evaluation mode it normalizes with the running
/// statistics. Parameter and buffer names are torchvision's: `weight`, `bias`, `running_mean`,
/// `running_var`, `num_batches_tracked`.
///
/// The statistics and the normalization compute in f32 for a half-precision input, and the
/// result has the input's dtype (as PyTorch's CUDA batch norm does under autocast).
///
/// Outside a compiled function the training-mode update runs at once, computing the output
/// with it (one graph); inside one ([`coil_frontend::compile`]) it is recorded and runs in the
/// graph that computes the step, as `torch.compile` functionalizes it.
///
/// ```
/// use coil_nn::{BatchNorm2d, BatchNormConfig, Module, ParamStore};
/// use coil_frontend::Tensor;
/// # fn main() -> coil_ir::Result<()> {
/// let store = ParamStore::new();
/// let bn = BatchNorm2d::new(&store.root(coil_runtime::Device::Cpu, coil_ir::DType::F32), 1, BatchNormConfig::default())?;
/// let x = Tensor::from_vec(vec![1.0f32, 3.0], &[2, 1, 1, 1])?;
/// let y = bn.forward(&x)?.to_vec::<f32>()?;
/// assert!((y[0] + 1.0).abs() < 1e-4 && (y[1] - 1.0).abs() < 1e-4);
/// let stats = bn.running.as_ref().unwrap();
/// // 0.9 * 0 + 0.1 * 2; 0.9 * 1 + 0.1 * 2 (the unbiased variance of 1 and 3)
/// assert_eq!(stats.mean.tensor().to_vec::<f32>()?, vec![0.2]);
/// assert!((stats.var.tensor().to_vec::<f32>()?[0] - 1.1).abs() < 1e-6);
/// assert_eq!(stats.num_batches_tracked.tensor().item::<i64>()?, 1);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct BatchNorm2d {
    /// The per-channel scale (`affine`).
    pub weight: Option<Param>,
    /// The per-channel shift (`affine`).
    pub bias: Option<Param>,
    /// The running statistics (`track_running_stats`).
    pub running: Option<RunningStats>,
    /// The options it was built with.
    pub config: BatchNormConfig,
    mode: Mode,
}

impl BatchNorm2d {
    /// A batch norm of `num_features` channels under `path` (`weight` ones, `bias` zeros,
    /// `running_mean` zeros, `running_var` ones).
    #[track_caller]
    pub fn new(path: &Path, num_features: usize, config: BatchNormConfig) -> Result<BatchNorm2d> {
        let c = [num_features];
        let (weight, bias) = if config.affine {
            (Some(path.param("weight", &c, Init::Ones)?), Some(path.param("bias", &c, Init::Zeros)?))
        } else {
            (None, None)
        };
        let running = if config.track_running_stats {
            Some(RunningStats {
                mean: path.frozen("running_mean", &c, Init::Zeros)?,
                var: path.frozen("running_var", &c, Init::Ones)?,
                num_batches_tracked: path.with_dtype(DType::I64).frozen("num_batches_tracked", &[], Init::Zeros)?,
            })
        } else {
            None
        };
        Ok(BatchNorm2d { weight, bias, running, config, mode: path.mode() })
    }

    /// [`Module::forward`] on channels-last activations, `[N, *spatial, C]`: the same values,
    /// the channels in the last dim (a network that keeps its activations so never transposes
    /// them; see [`crate::Conv2d::forward_channels_last`]).
    #[track_caller]
    pub fn forward_channels_last(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_at(x, x.rank().saturating_sub(1), Location::caller())
    }

    /// `(x - mean) / sqrt(var + eps) * weight + bias` as `x * scale + shift` with per-channel
    /// `scale` and `shift` (`[C]`, f32, along `channel_dim`): one multiply-add per element.
    fn normalize(&self, x: &Tensor, mean: &Tensor, var: &Tensor, channel_dim: usize) -> Result<Tensor> {
        let mut scale = var.add(self.config.eps)?.rsqrt()?;
        if let Some(w) = &self.weight {
            scale = scale.mul(&w.tensor().to_dtype(DType::F32)?)?;
        }
        let mut shift = mean.mul(&scale)?.neg()?;
        if let Some(b) = &self.bias {
            shift = shift.add(&b.tensor().to_dtype(DType::F32)?)?;
        }
        let mut per_channel = vec![1i64; x.rank()];
        per_channel[channel_dim] = -1;
        x.mul(&scale.reshape(&per_channel)?)?.add(&shift.reshape(&per_channel)?)
    }
}

impl Module for BatchNorm2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_at(x, 1, Location::caller())
    }
}

impl BatchNorm2d {
    /// The forward pass with the channels along `channel_dim`.
    fn forward_at(&self, x: &Tensor, channel_dim: usize, location: &'static Location<'static>) -> Result<Tensor> {
        let channels = self.weight.as_ref().or(self.running.as_ref().map(|r| &r.mean)).map(|p| p.shape()[0]);
        if x.rank() < 2 || channels.is_some_and(|c| x.shape()[channel_dim] != c) {
            let layout = if channel_dim == 1 { "[N, C, ...]" } else { "[N, ..., C]" };
            let c = channels.unwrap_or(0);
            let e = Error::shape(format!("expected {layout} with C = {c}, got {:?}", x.shape()));
            return Err(e.in_op("BatchNorm2d", vec![x.meta().to_string()]).at(location));
        }
        let x32 = x.to_dtype(DType::F32)?;
        let batch_statistics = self.mode.training() || self.running.is_none();
        let Some(running) = self.running.as_ref().filter(|_| !batch_statistics) else {
            let dims: Vec<i64> = (0..x.rank()).filter(|&d| d != channel_dim).map(|d| d as i64).collect();
            let (var, mean) = x32.var_mean(&dims, 0.0, false)?;
            let y = self.normalize(&x32, &mean, &var, channel_dim)?.to_dtype(x.dtype())?;
            return match (&self.running, self.mode.training()) {
                (Some(running), true) => self.update_running(running, x, &y, &mean, &var, channel_dim, location),
                _ => Ok(y),
            };
        };
        let (mean, var) = (running.mean.tensor().to_dtype(DType::F32)?, running.var.tensor().to_dtype(DType::F32)?);
        self.normalize(&x32, &mean, &var, channel_dim)?.to_dtype(x.dtype())
    }

    /// Writes the batch's statistics into the running ones (in place) and, outside a compiled
    /// function, computes `y` with them (and `x`, which the rest of the model reads too);
    /// returns `y`.
    #[allow(clippy::too_many_arguments)]
    fn update_running(
        &self,
        running: &RunningStats,
        x: &Tensor,
        y: &Tensor,
        mean: &Tensor,
        var: &Tensor,
        channel_dim: usize,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let n = (x.numel() / x.shape()[channel_dim]) as f64;
        let (old_mean, old_var, count) =
            (running.mean.tensor(), running.var.tensor(), running.num_batches_tracked.tensor());
        let new_count = count.add(1i64)?;
        let factor = match self.config.momentum {
            Some(m) => m.into_tensor(),
            None => new_count.to_dtype(DType::F32)?.rdiv(1.0)?,
        };
        // The unbiased variance (a batch of one value per channel divides by zero, as PyTorch).
        let unbiased = var.detach()?.mul(n / (n - 1.0))?;
        let blend = |old: &Tensor, batch: &Tensor| -> Result<Tensor> {
            let old32 = old.to_dtype(DType::F32)?;
            old32.add(&batch.sub(&old32)?.mul(&factor)?)?.to_dtype(old.dtype())
        };
        let (new_mean, new_var) = (blend(&old_mean, &mean.detach()?)?, blend(&old_var, &unbiased)?);
        let updates = [(&old_mean, &new_mean), (&old_var, &new_var), (&count, &new_count)];
        // Eagerly, the input and the output are computed with the update, so that nothing
        // before them is computed again; a compiled function computes everything in its graph.
        let also = if is_compiling() { vec![] } else { vec![x, y] };
        let updated = update_in_place_with(&updates, &also).map_err(|e| e.at(location))?;
        running.mean.set(updated[0].clone())?;
        running.var.set(updated[1].clone())?;
        running.num_batches_tracked.set(updated[2].clone())?;
        Ok(y.clone())
    }
}
