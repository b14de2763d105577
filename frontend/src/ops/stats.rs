//! Reductions written with other reductions and pointwise ops: `var_mean`, `std_mean`,
//! `aminmax`, `nansum`, `nanmean`, `count_nonzero`, `dist`, `frobenius_norm`.

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
}
