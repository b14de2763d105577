//! Stochastic gradient descent with momentum, Nesterov momentum and weight decay
//! (`torch.optim.SGD`).

use super::{check_grads, hyperparameters, restore, zeros_like_all, Optimizer};
use crate::param::Param;
use coil_frontend::{update_in_place, Tensor};
use coil_ir::{Error, Result};
use std::panic::Location;

/// `torch.optim.SGD`'s options and defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// The learning rate.
    pub lr: f64,
    /// The momentum factor (0: none).
    pub momentum: f64,
    /// Dampening: after the first step the momentum buffer adds `(1 - dampening) * g`.
    pub dampening: f64,
    /// L2 penalty: `g += weight_decay * p`.
    pub weight_decay: f64,
    /// Nesterov momentum (needs a momentum and zero dampening).
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> SgdConfig {
        SgdConfig { lr: 1e-3, momentum: 0.0, dampening: 0.0, weight_decay: 0.0, nesterov: false }
    }
}

/// SGD as `torch.optim.SGD` computes it: `g += wd * p`; with momentum, `buf = g` on the first
/// step and `buf = momentum * buf + (1 - dampening) * g` after, `g = g + momentum * buf`
/// (Nesterov) or `g = buf`; then `p -= lr * g`.
///
/// ```
/// use coil_nn::{Init, Optimizer, ParamStore, Sgd, SgdConfig};
/// use coil_frontend::Tensor;
/// use coil_ir::DType;
/// let store = ParamStore::new();
/// let w = store.root(coil_runtime::Device::Cpu, DType::F32).param("w", &[2], Init::Ones)?;
/// let mut sgd = Sgd::new(store.trainable(), SgdConfig { lr: 0.5, ..Default::default() })?;
/// sgd.step(&[Tensor::from_vec(vec![1.0f32, -1.0], &[2])?])?;
/// assert_eq!(w.tensor().to_vec::<f32>()?, vec![0.5, 1.5]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
pub struct Sgd {
    params: Vec<Param>,
    config: SgdConfig,
    /// Momentum buffers (none without momentum): zeros until the first step writes the
    /// gradients into them.
    momentum: Vec<Tensor>,
    steps: u64,
}

impl Sgd {
    /// SGD over `params`; an error for invalid options (negative rates, Nesterov without momentum
    /// or with dampening).
    #[track_caller]
    pub fn new(params: Vec<Param>, config: SgdConfig) -> Result<Sgd> {
        if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
            return Err(Error::value("Nesterov momentum requires a momentum and zero dampening")
                .in_op("Sgd::new", vec![])
                .at(Location::caller()));
        }
        if config.lr < 0.0 || config.momentum < 0.0 || config.weight_decay < 0.0 {
            return Err(Error::value(format!("invalid SGD options {config:?}"))
                .in_op("Sgd::new", vec![])
                .at(Location::caller()));
        }
        let momentum = if config.momentum != 0.0 { zeros_like_all(&params)? } else { vec![] };
        Ok(Sgd { params, config, momentum, steps: 0 })
    }
}

impl Optimizer for Sgd {
    #[track_caller]
    fn step(&mut self, grads: &[Tensor]) -> Result<()> {
        let location = Location::caller();
        check_grads(&self.params, grads, "Sgd::step", location)?;
        let Some(first) = self.params.first() else { return Ok(()) };
        let SgdConfig { lr, momentum, dampening, weight_decay, nesterov } = self.config;
        let lr = &hyperparameters(&[lr], first.device())?[0];
        let mut targets: Vec<Tensor> = Vec::new();
        let mut values: Vec<Tensor> = Vec::new();
        let mut new_bufs = Vec::new();
        for (i, (p, g)) in self.params.iter().zip(grads).enumerate() {
            let w = p.tensor();
            let mut g = g.to_dtype(w.dtype())?;
            if weight_decay != 0.0 {
                g = g.add(&w.mul(weight_decay)?)?;
            }
            if momentum != 0.0 {
                // PyTorch's first step takes the gradient itself as the buffer.
                let buf = match self.steps {
                    0 => g.clone(),
                    _ => self.momentum[i].mul(momentum)?.add(&g.mul(1.0 - dampening)?)?,
                };
                g = if nesterov { g.add(&buf.mul(momentum)?)? } else { buf.clone() };
                new_bufs.push(buf);
            }
            targets.push(w);
            values.push(p.tensor().sub(&g.mul(&lr.to_dtype(g.dtype())?)?)?);
        }
        targets.extend(self.momentum.iter().cloned());
        values.extend(new_bufs);
        let pairs: Vec<(&Tensor, &Tensor)> = targets.iter().zip(&values).collect();
        let updated = update_in_place(&pairs).map_err(|e| e.at(location))?;
        let n = self.params.len();
        for (p, t) in self.params.iter().zip(&updated[..n]) {
            p.set(t.clone())?;
        }
        self.momentum = updated[n..].to_vec();
        self.steps += 1;
        Ok(())
    }

    fn params(&self) -> &[Param] {
        &self.params
    }

    fn lr(&self) -> f64 {
        self.config.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.config.lr = lr;
    }

    fn steps(&self) -> u64 {
        self.steps
    }

    /// The momentum buffers by parameter name (`<name>.momentum_buffer`; none without
    /// momentum).
    fn state(&self) -> Vec<(String, Tensor)> {
        self.params
            .iter()
            .zip(&self.momentum)
            .map(|(p, b)| (format!("{}.momentum_buffer", p.name()), b.clone()))
            .collect()
    }

    #[track_caller]
    fn load_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        let location = Location::caller();
        let restored: Vec<Tensor> = self
            .params
            .iter()
            .zip(&self.momentum)
            .map(|(p, b)| restore(state, &format!("{}.momentum_buffer", p.name()), b))
            .collect::<Result<_>>()
            .map_err(|e| e.in_op("Sgd::load_state", vec![]).at(location))?;
        coil_frontend::realize(&restored.iter().collect::<Vec<_>>())?;
        self.momentum = restored.iter().map(|t| t.detach()).collect::<Result<_>>()?;
        self.steps = steps;
        Ok(())
    }
}
