//! Reductions written with other reductions and pointwise ops: `var_mean`, `std_mean`,
//! `aminmax`, `nansum`, `nanmean`, `count_nonzero`, `dist`, `frobenius_norm`, `cov`,
//! `corrcoef`, `trapezoid`, `cumulative_trapezoid`, and the comparison counts `bucketize` and
//! `searchsorted` (every value against every boundary: for moderate sizes; a sort-based search
//! needs its own primitive).

use crate::ops::composite::CompositeScope;
use crate::ops::pointwise::where_;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Result};
use std::panic::Location;

impl Tensor {
    /// `torch.var_mean(x, dims, correction, keepdim)`: `(var, mean)` over `dims` (all when
    /// empty).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0], &[2])?;
    /// let (var, mean) = x.var_mean(&[], 1.0, false)?;
    /// assert_eq!((var.item::<f32>()?, mean.item::<f32>()?), (2.0, 2.0));
    /// let (std, _) = x.std_mean(&[0], 0.0, false)?;
    /// assert_eq!(std.item::<f32>()?, 1.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn var_mean(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let _scope = CompositeScope::enter("var_mean", &[self], Location::caller());
        Ok((self.var(dims, correction, keepdim)?, self.mean(dims, keepdim)?))
    }

    /// `torch.std_mean(x, dims, correction, keepdim)`: `(std, mean)` over `dims`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0], &[2])?;
    /// let (std, mean) = x.std_mean(&[], 0.0, false)?;
    /// assert_eq!((std.item::<f32>()?, mean.item::<f32>()?), (1.0, 2.0));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn std_mean(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let _scope = CompositeScope::enter("std_mean", &[self], Location::caller());
        Ok((self.std(dims, correction, keepdim)?, self.mean(dims, keepdim)?))
    }

    /// `torch.aminmax(x, dim, keepdim)`: `(min, max)` along `dim`, or over all elements when
    /// `dim` is `None`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![3i64, -1, 7], &[3])?;
    /// let (lo, hi) = x.aminmax(None, false)?;
    /// assert_eq!((lo.item::<i64>()?, hi.item::<i64>()?), (-1, 7));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn aminmax(&self, dim: Option<i64>, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let _scope = CompositeScope::enter("aminmax", &[self], Location::caller());
        let dims: Vec<i64> = dim.into_iter().collect();
        Ok((self.amin(&dims, keepdim)?, self.amax(&dims, keepdim)?))
    }

    /// `torch.nansum(x, dims, keepdim)`: the sum with NaN counted as zero.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, f32::NAN, 2.0], &[3])?;
    /// assert_eq!(x.nansum(&[], false)?.item::<f32>()?, 3.0);
    /// assert_eq!(x.nanmean(&[], false)?.item::<f32>()?, 1.5);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn nansum(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        let _scope = CompositeScope::enter("nansum", &[self], Location::caller());
        if !self.dtype().is_float() {
            return self.sum(dims, keepdim);
        }
        where_(&self.isnan()?, 0.0, self)?.sum(dims, keepdim)
    }

    /// `torch.nanmean(x, dims, keepdim)`: the mean of the elements that are not NaN (NaN when
    /// there are none); floating dtypes only. The gradient of a slice that is all NaN is 0
    /// (PyTorch's is NaN).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![f32::NAN, 1.0, 3.0], &[3])?;
    /// assert_eq!(x.nanmean(&[], false)?.item::<f32>()?, 2.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn nanmean(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("nanmean", &[self], loc);
        if !self.dtype().is_float() {
            let e = Error::dtype(format!(
                "nanmean(): expected input to have floating point dtype but got {}",
                self.dtype()
            ));
            return Err(Tensor::error("nanmean", &[self], e, loc));
        }
        let kept = self.isnan()?.logical_not()?;
        let count = kept.sum(dims, keepdim)?.to_dtype(self.dtype())?;
        where_(&kept, self, 0.0)?.sum(dims, keepdim)?.div(&count)
    }

    /// `torch.count_nonzero(x, dims)`: the number of non-zero elements over `dims` (all when
    /// empty), as i64.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 2.0, f32::NAN, 0.0], &[2, 2])?;
    /// assert_eq!(x.count_nonzero(&[1])?.to_vec::<i64>()?, vec![1, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn count_nonzero(&self, dims: &[i64]) -> Result<Tensor> {
        let _scope = CompositeScope::enter("count_nonzero", &[self], Location::caller());
        self.ne(0)?.sum(dims, false)?.to_dtype(DType::I64)
    }

    /// `torch.dist(a, b, p)`: the `p`-norm of `a - b` (broadcast) over all elements.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![3.0f32, 0.0], &[2])?;
    /// let b = Tensor::from_vec(vec![0.0f32, 4.0], &[2])?;
    /// assert_eq!(a.dist(&b, 2.0)?.item::<f32>()?, 5.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn dist(&self, other: &Tensor, p: f64) -> Result<Tensor> {
        let _scope = CompositeScope::enter("dist", &[self, other], Location::caller());
        self.sub(other)?.norm(p, &[], false)
    }

    /// `torch.linalg.matrix_norm(x, "fro")` (`torch.norm(x, "fro", dim)`): the Frobenius norm
    /// over the last two dims.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, 0.0, 0.0, 4.0], &[2, 2])?;
    /// assert_eq!(x.frobenius_norm(false)?.item::<f32>()?, 5.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn frobenius_norm(&self, keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("frobenius_norm", &[self], loc);
        if self.rank() < 2 {
            let e = Error::shape(format!(
                "matrix_norm: the input tensor must be a matrix or a batch of matrices, got {} dims",
                self.rank()
            ));
            return Err(Tensor::error("frobenius_norm", &[self], e, loc));
        }
        self.norm(2.0, &[-2, -1], keepdim)
    }

    /// `torch.cov(x, correction)`: the covariance matrix of the variables in the rows of `x`
    /// (observations in the columns; a 1-D `x` is one variable, with a 0-d result), dividing
    /// by `N - correction` (clamped at 0, so too few observations give inf or NaN, as PyTorch).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 4.0, 0.0, 1.0, 1.0], &[2, 3])?;
    /// let c = x.cov(1.0)?.to_vec::<f32>()?;
    /// assert!((c[0] - 7.0 / 3.0).abs() < 1e-6 && (c[3] - 1.0 / 3.0).abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn cov(&self, correction: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("cov", &[self], loc);
        if self.rank() > 2 {
            let e = Error::shape(format!(
                "cov(): expected input to have two or fewer dimensions but got an input with {} dimensions",
                self.rank()
            ));
            return Err(Tensor::error("cov", &[self], e, loc));
        }
        let x = crate::ops::math::floating(self)?;
        let x = if x.rank() < 2 { x.reshape(&[1, -1])? } else { x };
        let n = x.shape()[1] as f64;
        let centered = x.sub(&x.mean(&[1], true)?)?;
        let c = centered.matmul(&centered.t()?)?.div((n - correction).max(0.0))?;
        if self.rank() < 2 {
            return c.reshape(&[]);
        }
        Ok(c)
    }

    /// `torch.corrcoef(x)`: Pearson's correlation coefficients of the rows of `x`,
    /// `cov / (std_i std_j)`, clipped into `[-1, 1]`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 4.0, 2.0, 4.0, 8.0], &[2, 3])?;
    /// let r = x.corrcoef()?.to_vec::<f32>()?;
    /// assert!(r.iter().all(|v| (v - 1.0).abs() < 1e-6));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn corrcoef(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("corrcoef", &[self], Location::caller());
        let c = self.cov(1.0)?;
        if c.rank() == 0 {
            return c.div(&c);
        }
        let std = c.diagonal(0, 0, 1)?.sqrt()?;
        c.div(&std.unsqueeze(1)?)?.div(&std.unsqueeze(0)?)?.clamp(Some(-1.0), Some(1.0))
    }

    /// `torch.trapezoid(y, dx=dx, dim=dim)`: the trapezoidal rule along `dim` with spacing
    /// `dx`, as PyTorch computes it: `(sum(y) - (y_first + y_last) / 2) * dx`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let y = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// assert_eq!(y.trapezoid(1.0, -1)?.item::<f32>()?, 4.0);
    /// assert_eq!(y.cumulative_trapezoid(1.0, -1)?.to_vec::<f32>()?, vec![1.5, 4.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn trapezoid(&self, dx: f64, dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("trapezoid", &[self], loc);
        let d = self.dim_of_sized(dim, "trapezoid", loc)? as i64;
        if self.shape()[d as usize] == 0 {
            return crate::ops::math::floating(self)?.sum(&[d], false);
        }
        let ends = self.select(d, 0)?.add(&self.select(d, -1)?)?;
        self.sum(&[d], false)?.sub(&ends.mul(0.5)?)?.mul(dx)
    }

    /// `torch.cumulative_trapezoid(y, dx=dx, dim=dim)`: the running trapezoidal rule,
    /// `cumsum((y[1:] + y[:-1]) * dx / 2)`, one shorter along `dim`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let y = Tensor::from_vec(vec![0.0f32, 2.0, 4.0], &[3])?;
    /// assert_eq!(y.cumulative_trapezoid(0.5, 0)?.to_vec::<f32>()?, vec![0.5, 2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn cumulative_trapezoid(&self, dx: f64, dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("cumulative_trapezoid", &[self], loc);
        let d = self.dim_of_sized(dim, "cumulative_trapezoid", loc)?;
        let n = self.shape()[d].saturating_sub(1);
        let pairs = self.narrow(d as i64, 1, n)?.add(&self.narrow(d as i64, 0, n)?)?;
        pairs.mul(dx / 2.0)?.cumsum(d as i64)
    }

    /// `torch.bucketize(x, boundaries, right=right)`: for each element, the index of the bucket
    /// of the sorted 1-D `boundaries` it falls in: the number of boundaries below it (at or below
    /// it with `right`); NaN goes past the last. Computed by comparing with every boundary.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let b = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// let x = Tensor::from_vec(vec![0.5f32, 2.0, 9.0], &[3])?;
    /// assert_eq!(x.bucketize(&b, false)?.to_vec::<i64>()?, vec![0, 1, 3]);
    /// assert_eq!(x.bucketize(&b, true)?.to_vec::<i64>()?, vec![0, 2, 3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn bucketize(&self, boundaries: &Tensor, right: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("bucketize", &[self, boundaries], loc);
        if boundaries.rank() != 1 {
            let e = Error::shape(format!("boundaries tensor must be 1 dimension, but got dim({})", boundaries.rank()));
            return Err(Tensor::error("bucketize", &[self, boundaries], e, loc));
        }
        let n = boundaries.numel() as i64;
        let x = self.unsqueeze(-1)?;
        let below = if right { boundaries.le(&x)? } else { boundaries.lt(&x)? };
        let count = below.sum(&[-1], false)?;
        if !self.dtype().is_float() {
            return Ok(count);
        }
        where_(&self.isnan()?, n, &count)
    }

    /// `torch.searchsorted(sorted, values, right=right)`: for each value, the index at which it
    /// would be inserted into the sorted last dim of `sorted` (1-D, or with the same leading
    /// dims as `values`).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let s = Tensor::from_vec(vec![1.0f32, 3.0, 5.0, 2.0, 4.0, 6.0], &[2, 3])?;
    /// let v = Tensor::from_vec(vec![3.0f32, 6.0, 1.0, 7.0], &[2, 2])?;
    /// assert_eq!(s.searchsorted(&v, false)?.to_vec::<i64>()?, vec![1, 3, 0, 3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn searchsorted(&self, values: &Tensor, right: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("searchsorted", &[self, values], loc);
        if self.rank() == 1 {
            return values.bucketize(self, right);
        }
        if self.rank() == 0
            || self.rank() != values.rank()
            || self.shape()[..self.rank() - 1] != values.shape()[..values.rank() - 1]
        {
            let e = Error::shape(format!(
                "torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 dimensions of boundaries tensor and input value tensor must match, but we got boundaries tensor {:?} and input value tensor {:?}",
                self.shape(),
                values.shape()
            ));
            return Err(Tensor::error("searchsorted", &[self, values], e, loc));
        }
        let n = self.shape()[self.rank() - 1] as i64;
        let seq = self.unsqueeze(-2)?;
        let v = values.unsqueeze(-1)?;
        let below = if right { seq.le(&v)? } else { seq.lt(&v)? };
        let count = below.sum(&[-1], false)?;
        if !values.dtype().is_float() {
            return Ok(count);
        }
        where_(&values.isnan()?, n, &count)
    }

    /// `torch.linalg.matrix_norm(x, ord)` for `ord` 1, -1 (the largest / smallest column sum of
    /// magnitudes) and inf, -inf (row sums), over the last two dims; `"fro"` is
    /// [`Tensor::frobenius_norm`]. The spectral and nuclear norms need singular values, which coil
    /// does not compute.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 4.0], &[2, 2])?;
    /// assert_eq!(x.matrix_norm(1.0, false)?.item::<f32>()?, 6.0);
    /// assert_eq!(x.matrix_norm(f64::INFINITY, false)?.item::<f32>()?, 7.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn matrix_norm(&self, ord: f64, keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("matrix_norm", &[self], loc);
        if self.rank() < 2 {
            let e = Error::shape(format!(
                "linalg.matrix_norm: The input tensor A must have at least 2 dimensions, got {}",
                self.rank()
            ));
            return Err(Tensor::error("matrix_norm", &[self], e, loc));
        }
        let (sum_dim, pick_dim) = match ord.abs() {
            1.0 => (-2, -1),
            f if f.is_infinite() => (-1, -2),
            _ => {
                let e = Error::unsupported(format!("matrix_norm: ord={ord} needs singular values, which coil does not compute (1, -1, inf, -inf and \"fro\" are supported)"));
                return Err(Tensor::error("matrix_norm", &[self], e, loc));
            }
        };
        let sums = self.abs()?.sum(&[sum_dim], true)?;
        let picked = if ord > 0.0 { sums.amax(&[pick_dim], true)? } else { sums.amin(&[pick_dim], true)? };
        if keepdim {
            return Ok(picked);
        }
        picked.squeeze_dim(-1)?.squeeze_dim(-1)
    }

    /// `torch.histc(x, bins, min, max)`: counts of the elements in `bins` equal-width bins over
    /// `[min, max]` (the last bin includes `max`), in `x`'s dtype; elements outside (and NaN)
    /// are not counted. `min == max` uses the data's range (widened by 1 each way when that is
    /// one value), read from the tensor without leaving the graph.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.5, 5.0, 6.0], &[5])?;
    /// assert_eq!(x.histc(5, 0.0, 5.0)?.to_vec::<f32>()?, vec![1.0, 1.0, 1.0, 0.0, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn histc(&self, bins: usize, min: f64, max: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("histc", &[self], loc);
        if !self.dtype().is_float() {
            let e = Error::dtype(format!("\"histogram_cpu\" not implemented for '{}'", self.dtype()));
            return Err(Tensor::error("histc", &[self], e, loc));
        }
        if bins == 0 || min > max || !min.is_finite() || !max.is_finite() {
            let e = Error::value(format!(
                "histc: expected bins > 0 and finite min <= max, got bins={bins}, min={min}, max={max}"
            ));
            return Err(Tensor::error("histc", &[self], e, loc));
        }
        let counts = Tensor::zeros(&[bins], self.dtype()).to_device(self.device())?;
        if self.numel() == 0 {
            return Ok(counts);
        }
        let x = self.reshape(&[-1])?;
        let (lo, hi) = if min == max {
            let (lo, hi) = (x.amin(&[], false)?, x.amax(&[], false)?);
            let same = lo.eq(&hi)?;
            (where_(&same, &lo.sub(1.0)?, &lo)?, where_(&same, &hi.add(1.0)?, &hi)?)
        } else {
            (x.full_like(min).select(0, 0)?, x.full_like(max).select(0, 0)?)
        };
        let inside = x.ge(&lo)?.logical_and(&x.le(&hi)?)?;
        let position = x.sub(&lo)?.mul(bins as f64)?.div(&hi.sub(&lo)?)?;
        // Outside positions (and NaN) go to bin 0 with weight 0; max itself to the last bin.
        let bin = where_(&inside, &position, 0.0)?.floor()?.clamp(Some(0.0), Some(bins as f64 - 1.0))?;
        counts.index_add(0, &bin.to_dtype(DType::I64)?, &inside.to_dtype(self.dtype())?, 1.0)
    }
}
