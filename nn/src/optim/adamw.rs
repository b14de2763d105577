//! Adam with decoupled weight decay (`torch.optim.AdamW`).

use super::{check_grads, hyperparameters, restore, zeros_like_all, Optimizer};
use crate::param::Param;
use coil_frontend::{update_in_place, Tensor};
use coil_ir::{Error, Result};
use std::panic::Location;

/// `torch.optim.AdamW`'s options and defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    /// The learning rate.
    pub lr: f64,
    /// `(beta1, beta2)`: the decay of the running first and second moments.
    pub betas: (f64, f64),
    /// Added to the second moment's square root (numerical stability).
    pub eps: f64,
    /// Decoupled weight decay: `p *= 1 - lr * weight_decay` each step.
    pub weight_decay: f64,
    /// Divide by the running maximum of the second moment (AMSGrad).
    pub amsgrad: bool,
}

impl Default for AdamWConfig {
    fn default() -> AdamWConfig {
        AdamWConfig { lr: 1e-3, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 1e-2, amsgrad: false }
    }
}

/// AdamW as `torch.optim.AdamW` computes it, step `t` from 1:
/// `p *= 1 - lr * wd`; `m = lerp(m, g, 1 - beta1)`; `v = beta2 v + (1 - beta2) g^2`;
/// `p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)`.
///
/// Parameters can be in groups of their own weight decay ([`AdamW::with_groups`]; nanoGPT
/// decays only the matrices). One step over every parameter is one graph, compiled once:
/// the learning rate and the bias corrections are its inputs.
///
/// ```
/// use coil_nn::{AdamW, AdamWConfig, Init, Optimizer, ParamStore};
/// use coil_frontend::Tensor;
/// use coil_ir::DType;
/// let store = ParamStore::new();
/// let w = store.root(coil_runtime::Device::Cpu, DType::F32).param("w", &[2], Init::Ones)?;
/// let mut opt = AdamW::new(store.trainable(), AdamWConfig { lr: 0.1, weight_decay: 0.0, ..Default::default() })?;
/// opt.step(&[Tensor::from_vec(vec![1.0f32, -1.0], &[2])?])?;
/// let w = w.tensor().to_vec::<f32>()?; // the first step moves each weight by lr against its sign
/// assert!((w[0] - 0.9).abs() < 1e-5 && (w[1] - 1.1).abs() < 1e-5);
/// # Ok::<(), coil_ir::Error>(())
/// ```
pub struct AdamW {
    params: Vec<Param>,
    /// Per parameter, its group's weight decay.
    weight_decay: Vec<f64>,
    config: AdamWConfig,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// The running maximum of `exp_avg_sq` (AMSGrad only).
    max_exp_avg_sq: Vec<Tensor>,
    steps: u64,
}

impl AdamW {
    /// Every parameter with `config.weight_decay`.
    #[track_caller]
    pub fn new(params: Vec<Param>, config: AdamWConfig) -> Result<AdamW> {
        AdamW::with_groups(vec![(params, config.weight_decay)], config)
    }

    /// Parameter groups, each with its own weight decay (`config.weight_decay` is unused).
    #[track_caller]
    pub fn with_groups(groups: Vec<(Vec<Param>, f64)>, config: AdamWConfig) -> Result<AdamW> {
        let (b1, b2) = config.betas;
        let valid = config.lr >= 0.0 && config.eps >= 0.0 && (0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2);
        if !valid || groups.iter().any(|(_, wd)| *wd < 0.0) {
            return Err(Error::value(format!("invalid AdamW options {config:?}"))
                .in_op("AdamW::new", vec![])
                .at(Location::caller()));
        }
        let mut params = Vec::new();
        let mut weight_decay = Vec::new();
        for (group, wd) in groups {
            weight_decay.extend(std::iter::repeat_n(wd, group.len()));
            params.extend(group);
        }
        let exp_avg = zeros_like_all(&params)?;
        let exp_avg_sq = zeros_like_all(&params)?;
        let max_exp_avg_sq = if config.amsgrad { zeros_like_all(&params)? } else { vec![] };
        Ok(AdamW { params, weight_decay, config, exp_avg, exp_avg_sq, max_exp_avg_sq, steps: 0 })
    }
}

impl Optimizer for AdamW {
    #[track_caller]
    fn step(&mut self, grads: &[Tensor]) -> Result<()> {
        let location = Location::caller();
        check_grads(&self.params, grads, "AdamW::step", location)?;
        let Some(first) = self.params.first() else { return Ok(()) };
        let AdamWConfig { lr, betas: (beta1, beta2), eps, .. } = self.config;
        let t = (self.steps + 1) as i32;
        let step_size = lr / (1.0 - beta1.powi(t));
        let bc2_sqrt = (1.0 - beta2.powi(t)).sqrt();
        // One decay factor per distinct weight decay, then the step size and sqrt(bc2).
        let mut decays: Vec<f64> = Vec::new();
        for &wd in &self.weight_decay {
            if !decays.contains(&(1.0 - lr * wd)) {
                decays.push(1.0 - lr * wd);
            }
        }
        let mut values = decays.clone();
        values.extend([step_size, bc2_sqrt]);
        let h = hyperparameters(&values, first.device())?;
        let (step_size, bc2_sqrt) = (&h[decays.len()], &h[decays.len() + 1]);

        let n = self.params.len();
        let mut targets = Vec::with_capacity(4 * n);
        let mut news = Vec::with_capacity(4 * n);
        for i in 0..n {
            let p = self.params[i].tensor();
            let g = grads[i].to_dtype(p.dtype())?;
            let (m, v) = (&self.exp_avg[i], &self.exp_avg_sq[i]);
            let decay = &h[decays.iter().position(|&d| d == 1.0 - lr * self.weight_decay[i]).expect("listed")];
            let p = if self.weight_decay[i] != 0.0 { p.mul(decay)? } else { p };
            // lerp(m, g, w) = m + w (g - m) for w < 0.5, as PyTorch computes it.
            let m_new = m.add(&g.sub(m)?.mul(1.0 - beta1)?)?;
            let v_new = v.mul(beta2)?.add(&g.mul(&g)?.mul(1.0 - beta2)?)?;
            let v_max = match self.max_exp_avg_sq.get(i) {
                Some(max) => Some((max, max.maximum(&v_new)?)),
                None => None,
            };
            let v_used = v_max.as_ref().map_or(&v_new, |(_, m)| m);
            let denom = v_used.sqrt()?.div(bc2_sqrt)?.add(eps)?;
            let p_new = p.sub(&m_new.div(&denom)?.mul(step_size)?)?;
            targets.extend([self.params[i].tensor(), m.clone(), v.clone()]);
            news.extend([p_new, m_new, v_new]);
            if let Some((max, max_new)) = v_max {
                targets.push(max.clone());
                news.push(max_new);
            }
        }
        let pairs: Vec<(&Tensor, &Tensor)> = targets.iter().zip(&news).collect();
        let updated = update_in_place(&pairs).map_err(|e| e.at(location))?;
        let per = if self.config.amsgrad { 4 } else { 3 };
        for (i, chunk) in updated.chunks(per).enumerate() {
            self.params[i].set(chunk[0].clone())?;
            self.exp_avg[i] = chunk[1].clone();
            self.exp_avg_sq[i] = chunk[2].clone();
            if let Some(max) = chunk.get(3) {
                self.max_exp_avg_sq[i] = max.clone();
            }
        }
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

    /// The moments by parameter name (`<name>.exp_avg`, `<name>.exp_avg_sq`, with AMSGrad
    /// `<name>.max_exp_avg_sq`).
    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(3 * self.params.len());
        for (i, p) in self.params.iter().enumerate() {
            out.push((format!("{}.exp_avg", p.name()), self.exp_avg[i].clone()));
            out.push((format!("{}.exp_avg_sq", p.name()), self.exp_avg_sq[i].clone()));
            if let Some(max) = self.max_exp_avg_sq.get(i) {
                out.push((format!("{}.max_exp_avg_sq", p.name()), max.clone()));
            }
        }
        out
    }

    #[track_caller]
    fn load_state(&mut self, state: &[(String, Tensor)], steps: u64) -> Result<()> {
        let location = Location::caller();
        let mut restored = Vec::with_capacity(2 * self.params.len());
        for ((p, m), v) in self.params.iter().zip(&self.exp_avg).zip(&self.exp_avg_sq) {
            restored.push(restore(state, &format!("{}.exp_avg", p.name()), m));
            restored.push(restore(state, &format!("{}.exp_avg_sq", p.name()), v));
        }
        let restored: Vec<Tensor> = restored
            .into_iter()
            .collect::<Result<_>>()
            .map_err(|e| e.in_op("AdamW::load_state", vec![]).at(location))?;
        coil_frontend::realize(&restored.iter().collect::<Vec<_>>())?;
        for (i, pair) in restored.chunks(2).enumerate() {
            (self.exp_avg[i], self.exp_avg_sq[i]) = (pair[0].detach()?, pair[1].detach()?);
        }
        self.steps = steps;
        Ok(())
    }
}
