//! Scans beyond `cumsum`, written as reductions over prefix masks: element `i` of the result
//! reduces the elements `j <= i` along the dim, picked out of an `[n, n]` lower-triangular
//! mask. That costs `n^2` work and (interpreted) memory per scanned row: right for the moderate
//! lengths of most uses; long scans want a scan primitive of their own.
//! `cummax` / `cummin` (values and PyTorch's indices: the last position of the extreme, NaN
//! included), `logcumsumexp` (stable, through `logsumexp`), `cumprod` (no gradient: `prod` has
//! none yet).

use crate::ops::composite::CompositeScope;
use crate::ops::pointwise::{where_, IntoTensor};
use crate::ops::shape::Loc;
use crate::tensor::Tensor;
use coil_ir::{DType, Result};
use std::panic::Location;

/// The prefix layout of `x` along dim `d`: `x` with `d` moved last and unsqueezed to
/// `[..., 1, n]` (element `j` along the last dim), and the `[n, n]` mask of `j <= i`.
fn prefixes(x: &Tensor, d: usize) -> Result<(Tensor, Tensor)> {
    let n = x.shape()[d];
    let rows = Tensor::iota(&[n, n], 0)?.to_device(x.device())?;
    let cols = Tensor::iota(&[n, n], 1)?.to_device(x.device())?;
    Ok((x.movedim(d as i64, -1)?.unsqueeze(-2)?, cols.le(&rows)?))
}

impl Tensor {
    /// The dim a scan runs along (a 0-d tensor scans as one element).
    fn scan_dim(&self, op: &'static str, dim: i64, loc: Loc) -> Result<(Tensor, usize)> {
        let d = self.dim(dim, op, loc)?;
        if self.rank() == 0 {
            return Ok((self.reshape(&[1])?, 0));
        }
        Ok((self.clone(), d))
    }

    /// The scan's result `[..., n]` (the dim last) back in this tensor's layout.
    fn unscan(&self, y: Tensor, d: usize) -> Result<Tensor> {
        if self.rank() == 0 {
            return y.reshape(&[]);
        }
        y.movedim(-1, d as i64)
    }

    /// Reduces each prefix with `reduce` after filling the positions past it with `fill`.
    fn prefix_reduce(
        &self,
        op: &'static str,
        dim: i64,
        fill: impl IntoTensor,
        reduce: impl Fn(&Tensor) -> Result<Tensor>,
        loc: Loc,
    ) -> Result<Tensor> {
        let (x, d) = self.scan_dim(op, dim, loc)?;
        let (xj, mask) = prefixes(&x, d)?;
        let y = reduce(&where_(&mask, &xj, fill)?)?;
        self.unscan(y, d)
    }

    /// `torch.cummax(x, dim)`: `(values, indices)` of the running maximum along `dim`; NaN
    /// propagates, and the index is the last position of the maximum (or of the NaN), as in
    /// PyTorch. Where equal values tie for a maximum, the gradient is shared among them
    /// (PyTorch gives it all to the last).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0, 3.0, 2.0], &[4])?;
    /// let (values, indices) = x.cummax(0)?;
    /// assert_eq!(values.to_vec::<f32>()?, vec![1.0, 3.0, 3.0, 3.0]);
    /// assert_eq!(indices.to_vec::<i64>()?, vec![0, 1, 2, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn cummax(&self, dim: i64) -> Result<(Tensor, Tensor)> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("cummax", &[self], loc);
        self.cumulative_extreme("cummax", dim, true, loc)
    }

    /// `torch.cummin(x, dim)`: `(values, indices)` of the running minimum along `dim`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![3i64, 1, 1, 2], &[4])?;
    /// let (values, indices) = x.cummin(0)?;
    /// assert_eq!(values.to_vec::<i64>()?, vec![3, 1, 1, 1]);
    /// assert_eq!(indices.to_vec::<i64>()?, vec![0, 1, 2, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn cummin(&self, dim: i64) -> Result<(Tensor, Tensor)> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("cummin", &[self], loc);
        self.cumulative_extreme("cummin", dim, false, loc)
    }

    fn cumulative_extreme(&self, op: &'static str, dim: i64, max: bool, loc: Loc) -> Result<(Tensor, Tensor)> {
        let (x, d) = self.scan_dim(op, dim, loc)?;
        if x.shape()[d] == 0 {
            return Ok((self.clone(), self.zeros_like().to_dtype(DType::I64)?));
        }
        let (xj, mask) = prefixes(&x, d)?;
        // Past the prefix: the first element, which every prefix holds, so it changes no extreme.
        let first = xj.narrow(-1, 0, 1)?;
        let filled = where_(&mask, &xj, &first)?;
        let values = if max { filled.amax(&[-1], true)? } else { filled.amin(&[-1], true)? };
        // The last j <= i holding the extreme (NaN counts as equal to NaN).
        let hit = xj.eq(&values)?;
        let hit = if x.dtype().is_float() { hit.logical_or(&xj.isnan()?.logical_and(&values.isnan()?)?)? } else { hit };
        let n = x.shape()[d];
        let positions = Tensor::iota(&[n], 0)?.to_device(x.device())?;
        let indices = where_(&hit.logical_and(&mask)?, &positions, -1)?.amax(&[-1], false)?;
        Ok((self.unscan(values.squeeze_dim(-1)?, d)?, self.unscan(indices, d)?))
    }

    /// `torch.logcumsumexp(x, dim)`: `log(cumsum(exp(x)))` along `dim`, each prefix through a
    /// stable `logsumexp`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 0.0, 1000.0], &[3])?;
    /// let y = x.logcumsumexp(0)?.to_vec::<f32>()?;
    /// assert!(y[0] == 0.0 && (y[1] - 2f32.ln()).abs() < 1e-6 && y[2] == 1000.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn logcumsumexp(&self, dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("logcumsumexp", &[self], loc);
        crate::ops::math::require_float("logcumsumexp", self, loc)?;
        self.prefix_reduce("logcumsumexp", dim, f64::NEG_INFINITY, |t| t.logsumexp(&[-1], false), loc)
    }

    /// `torch.cumprod(x, dim)`: running products along `dim` (integers and bools multiply in
    /// i64, as `prod`). Not differentiable yet, like `prod`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4], &[4])?;
    /// assert_eq!(x.cumprod(0)?.to_vec::<i64>()?, vec![1, 2, 6, 24]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn cumprod(&self, dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("cumprod", &[self], loc);
        self.prefix_reduce("cumprod", dim, 1, |t| t.prod(&[-1], false), loc)
    }
}
