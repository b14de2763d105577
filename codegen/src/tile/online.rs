//! Online softmax in looped reductions: `amax(x)` and `sum(exp(x - amax(x)))` in one pass.
//!
//! Softmax, log-softmax, logsumexp and cross-entropy reduce a row twice: its maximum `m`, then
//! the sum of `exp(x - m)`. A looped kernel would read the row once per reduction; the online
//! rule (Milakov & Gimelshein 2018) keeps a running maximum and rescales the running sum
//! whenever it grows, so one pass gives both
//! ([`coil_ir::kernel::TileStmt::AccUpdateOnlineSoftmax`], finished by
//! [`coil_ir::kernel::TileStmt::ReduceOnlineSoftmax`]). Later passes (the softmax's stores)
//! are unchanged.
//!
//! A pair is fused when, in a looped kernel whose row is known non-empty:
//! * a live `Sum` reduction's source is `exp(sub(v, M))`, the `exp`, the `sub`, `v` and the sum
//!   all of one float dtype (casts belong to `v`: `v = cast(load)` for bf16 inputs);
//! * `v` is an `XR` value of level 0 (no reduction on its inputs);
//! * `M` is a `Max` reduction of that same `v` (of the same dtype), or logsumexp's
//!   `where(isinf(max), c, max)` with `c` a finite constant of that dtype.
//!
//! Each `Max` pairs with at most one sum (the first, in def order). The maximum may have any
//! other uses (the softmax epilogue, stores): the fused pass yields the final maximum too.
//!
//! `online_softmax: false` in the configuration's tuning (`COIL_ONLINE_SOFTMAX=0`) turns the
//! fusion off (two passes, as before), for comparisons.

use super::{Builder, Def, Dims};
use coil_ir::kernel::{TileOp, Var};
use coil_ir::op::{BinaryOp, UnaryOp};
use coil_ir::{DType, ReduceOp};

/// A `Max` reduction of `value` and a `Sum` reduction of `exp(value - shift)` that one pass
/// computes; see [`coil_ir::kernel::TileStmt::ReduceOnlineSoftmax`] for `finite_shift`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OnlinePair {
    pub max: Var,
    pub sum: Var,
    pub value: Var,
    pub dtype: DType,
    pub finite_shift: bool,
}

impl Builder<'_> {
    fn let_def(&self, v: Var) -> Option<(&TileOp, DType, Dims)> {
        match &self.defs[v as usize] {
            Def::Let { dims, dtype, op } => Some((op, *dtype, *dims)),
            Def::Reduce { .. } => None,
        }
    }

    /// `m` when it is a `Max` reduction of `value` with result dtype `dtype`.
    fn max_of(&self, m: Var, value: Var, dtype: DType) -> Option<Var> {
        match self.defs[m as usize] {
            Def::Reduce { op: ReduceOp::Max, dtype: d, source } if d == dtype && source == value => Some(m),
            _ => None,
        }
    }

    /// The `Max` reduction that `shift` is, or is shifted from (`where(isinf(max), c, max)`
    /// with a finite constant `c`), and whether it is that shifted form.
    fn shift_of(&self, shift: Var, value: Var, dtype: DType) -> Option<(Var, bool)> {
        if let Some(m) = self.max_of(shift, value, dtype) {
            return Some((m, false));
        }
        let (&TileOp::Where(cond, c, m), d, _) = self.let_def(shift)? else { return None };
        let m = self.max_of(m, value, dtype).filter(|_| d == dtype)?;
        let is_inf_of_m = matches!(self.let_def(cond)?, (&TileOp::Unary(UnaryOp::IsInf, a), _, _) if a == m);
        let finite_c =
            matches!(self.let_def(c)?, (TileOp::Constant(k), cd, _) if cd == dtype && k.as_f64().is_finite());
        (is_inf_of_m && finite_c).then_some((m, true))
    }

    /// The sum reduction `sum` of dtype `dtype` with source `source` as an [`OnlinePair`],
    /// when its source has the fused form (see the module docs).
    fn online_pair(&self, sum: Var, dtype: DType, source: Var) -> Option<OnlinePair> {
        if !dtype.is_float() {
            return None;
        }
        let (&TileOp::Unary(UnaryOp::Exp, diff), de, _) = self.let_def(source)? else { return None };
        let (&TileOp::Binary(BinaryOp::Sub, value, shift), dd, _) = self.let_def(diff)? else { return None };
        let (_, dv, dims) = self.let_def(value)?;
        if de != dtype || dd != dtype || dv != dtype || dims != Dims::XR || self.levels[value as usize] != 0 {
            return None;
        }
        let (max, finite_shift) = self.shift_of(shift, value, dtype)?;
        Some(OnlinePair { max, sum, value, dtype, finite_shift })
    }

    /// The pairs of live reductions of a looped kernel that share one pass.
    pub(super) fn online_pairs(&self, live: &[bool]) -> Vec<OnlinePair> {
        // An empty row sums to 0 where the online finish would say NaN (`max = -inf`).
        if !self.rnumel.is_known_positive() || !coil_ir::config::current().tuning.online_softmax {
            return vec![];
        }
        let mut pairs: Vec<OnlinePair> = Vec::new();
        for (v, def) in self.defs.iter().enumerate() {
            let Def::Reduce { op: ReduceOp::Sum, dtype, source } = *def else { continue };
            if !live[v] {
                continue;
            }
            if let Some(p) = self.online_pair(v as Var, dtype, source) {
                if live[p.max as usize] && pairs.iter().all(|q| q.max != p.max) {
                    pairs.push(p);
                }
            }
        }
        pairs
    }
}
