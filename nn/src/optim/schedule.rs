//! Learning-rate schedules: the learning rate of each step, set on an optimizer before it.

/// A learning rate per step (`step` counts from 0).
pub trait LrSchedule {
    /// The learning rate of step `step`.
    fn lr(&self, step: u64) -> f64;
}

/// The same learning rate at every step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Constant(pub f64);

impl LrSchedule for Constant {
    fn lr(&self, _: u64) -> f64 {
        self.0
    }
}

/// Linear warm-up to `max_lr` over `warmup` steps, then cosine decay to `min_lr` at step
/// `total`, then `min_lr` (nanoGPT's schedule): step `s < warmup` has `max_lr (s + 1) / warmup`;
/// from `warmup` to `total`, `min_lr + (max_lr - min_lr) (1 + cos(pi r)) / 2` with
/// `r = (s - warmup) / (total - warmup)`.
///
/// ```
/// use coil_nn::{LrSchedule, WarmupCosine};
/// let s = WarmupCosine { max_lr: 1.0, min_lr: 0.1, warmup: 2, total: 6 };
/// assert_eq!((s.lr(0), s.lr(1), s.lr(2)), (0.5, 1.0, 1.0));
/// assert!((s.lr(4) - 0.55).abs() < 1e-12);
/// assert_eq!((s.lr(6), s.lr(100)), (0.1, 0.1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmupCosine {
    /// The peak learning rate, reached at the end of the warm-up.
    pub max_lr: f64,
    /// The learning rate at and after step `total`.
    pub min_lr: f64,
    /// Warm-up steps.
    pub warmup: u64,
    /// The step at which the decay reaches `min_lr`.
    pub total: u64,
}

impl LrSchedule for WarmupCosine {
    fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.max_lr * (step + 1) as f64 / self.warmup as f64;
        }
        if step >= self.total {
            return self.min_lr;
        }
        let r = (step - self.warmup) as f64 / (self.total - self.warmup).max(1) as f64;
        self.min_lr + 0.5 * (1.0 + (std::f64::consts::PI * r).cos()) * (self.max_lr - self.min_lr)
    }
}
