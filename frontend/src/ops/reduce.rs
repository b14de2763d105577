//! Reductions and scans: `sum`, `mean`, `prod`, `amax`/`amin`, `max`/`min` with indices,
//! `argmax`/`argmin`, `var`/`std`, `logsumexp`, `norm`, `all`/`any`, `cumsum`.
//!
//! Dims are `i64` and may be negative; an empty dims list means every dim, as in PyTorch. Each
//! reduction records one node (`Reduce`, or the composite `Mean`, `Var`, `Std`, `LogSumExp`,
//! `Norm`, `All`, `Any`) with its dims already wrapped into `0..rank`.

use crate::ops::shape::renamed;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Op, ReduceOp, Result};
use std::panic::Location;

type Loc = &'static Location<'static>;

impl Tensor {
    fn reduce(&self, op: ReduceOp, dims: &[i64], keepdim: bool, loc: Loc) -> Result<Tensor> {
        let dims = self.dims(dims, op.name(), loc)?;
        Tensor::record(Op::Reduce { op, dims, keepdim }, &[self], loc)
    }

    /// `torch.sum(x, dims, keepdim)`: the sum over `dims` (all dims when empty). Integer and bool
    /// tensors sum to i64, as in PyTorch.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// assert_eq!(x.sum(&[-1], false)?.to_vec::<f32>()?, vec![3.0, 7.0]);
    /// assert_eq!(x.sum(&[0], true)?.shape(), &[1, 2]);
    /// assert_eq!(x.sum_all()?.item::<f32>()?, 10.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn sum(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, dims, keepdim, Location::caller())
    }

    /// The sum of every element, as a 0-d tensor (`x.sum()`).
    #[track_caller]
    pub fn sum_all(&self) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, &[], false, Location::caller())
    }

    /// `torch.mean(x, dims, keepdim)` (all dims when empty); floating tensors only, as in PyTorch.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 6.0], &[2, 2])?;
    /// assert_eq!(x.mean(&[1], false)?.to_vec::<f32>()?, vec![1.5, 4.5]);
    /// assert_eq!(x.mean(&[], false)?.item::<f32>()?, 3.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn mean(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let dims = self.dims(dims, "mean", loc)?;
        Tensor::record(Op::Mean { dims, keepdim }, &[self], loc)
    }

    /// `torch.prod(x, dims, keepdim)` (all dims when empty); integers multiply in i64.
    #[track_caller]
    pub fn prod(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Prod, dims, keepdim, Location::caller())
    }

    /// `torch.amax(x, dims, keepdim)`: the maximum over `dims` (all when empty); NaN propagates.
    #[track_caller]
    pub fn amax(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, dims, keepdim, Location::caller())
    }

    /// `torch.amin(x, dims, keepdim)`: the minimum over `dims` (all when empty); NaN propagates.
    #[track_caller]
    pub fn amin(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, dims, keepdim, Location::caller())
    }

    /// `x.max()`: the largest element, as a 0-d tensor (an error for an empty tensor).
    #[track_caller]
    pub fn max_all(&self) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, &[], false, Location::caller())
    }

    /// `x.min()`: the smallest element, as a 0-d tensor (an error for an empty tensor).
    #[track_caller]
    pub fn min_all(&self) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, &[], false, Location::caller())
    }

    /// `torch.max(x, dim, keepdim)`: `(values, indices)` of the maxima along `dim`; the index is
    /// the first maximum's.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 3.0, 4.0, 2.0, 4.0], &[2, 3])?;
    /// let (values, indices) = x.max_dim(1, false)?;
    /// assert_eq!(values.to_vec::<f32>()?, vec![5.0, 4.0]);
    /// assert_eq!(indices.to_vec::<i64>()?, vec![1, 0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn max_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.extremum_dim(ReduceOp::Max, ReduceOp::ArgMax, "max", dim, keepdim, Location::caller())
    }

    /// `torch.min(x, dim, keepdim)`: `(values, indices)` of the minima along `dim`; the index is
    /// the first minimum's.
    #[track_caller]
    pub fn min_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.extremum_dim(ReduceOp::Min, ReduceOp::ArgMin, "min", dim, keepdim, Location::caller())
    }

    fn extremum_dim(
        &self,
        value: ReduceOp,
        index: ReduceOp,
        name: &str,
        dim: i64,
        keepdim: bool,
        loc: Loc,
    ) -> Result<(Tensor, Tensor)> {
        let d = self.dim(dim, name, loc)?;
        // A 0-d tensor reduces as a 1-element vector, to a 0-d result.
        let (x, d, keepdim) = if self.rank() == 0 {
            (renamed(self.reshape_to(vec![1], loc), name)?, 0, false)
        } else {
            (self.clone(), d, keepdim)
        };
        let values = renamed(Tensor::record(Op::Reduce { op: value, dims: vec![d], keepdim }, &[&x], loc), name)?;
        let indices = renamed(Tensor::record(Op::Reduce { op: index, dims: vec![d], keepdim }, &[&x], loc), name)?;
        Ok((values, indices))
    }

    /// `torch.argmax(x, dim, keepdim)`: the index (i64) of the first maximum along `dim`, or in
    /// the flattened tensor when `dim` is `None` (then `keepdim` gives all dims size 1).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 7.0, 4.0], &[2, 2])?;
    /// assert_eq!(x.argmax(None, false)?.item::<i64>()?, 2);
    /// assert_eq!(x.argmax(Some(0), false)?.to_vec::<i64>()?, vec![1, 0]);
    /// assert_eq!(x.argmin(None, true)?.shape(), &[1, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn argmax(&self, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(ReduceOp::ArgMax, dim, keepdim, Location::caller())
    }

    /// `torch.argmin(x, dim, keepdim)`: like [`Tensor::argmax`], for the first minimum.
    #[track_caller]
    pub fn argmin(&self, dim: Option<i64>, keepdim: bool) -> Result<Tensor> {
        self.arg_reduce(ReduceOp::ArgMin, dim, keepdim, Location::caller())
    }

    fn arg_reduce(&self, op: ReduceOp, dim: Option<i64>, keepdim: bool, loc: Loc) -> Result<Tensor> {
        let name = op.name();
        if self.dtype() == DType::Bool {
            // As PyTorch (`max_dim` of bools, which reduces with an argmax, is fine).
            return self.fail(name, Error::dtype(format!("{name} does not support bool input")), loc);
        }
        let reduce =
            |x: &Tensor, d: usize, keepdim: bool| Tensor::record(Op::Reduce { op, dims: vec![d], keepdim }, &[x], loc);
        match dim {
            Some(dim) => {
                let d = self.dim(dim, name, loc)?;
                if self.rank() == 0 {
                    let x = renamed(self.reshape_to(vec![1], loc), name)?;
                    return reduce(&x, 0, false);
                }
                reduce(self, d, keepdim)
            }
            None if self.rank() == 1 => reduce(self, 0, keepdim),
            None => {
                let flat = renamed(self.reshape_to(vec![self.numel()], loc), name)?;
                let r = reduce(&flat, 0, false).map_err(|e| Error { operands: vec![self.meta().to_string()], ..e })?;
                if keepdim && self.rank() > 0 {
                    renamed(r.reshape_to(vec![1; self.rank()], loc), name)
                } else {
                    Ok(r)
                }
            }
        }
    }

    /// `torch.var(x, dims, correction=correction, keepdim)`: the variance over `dims` (all when
    /// empty), dividing by `N - correction` (1 is Bessel's correction, PyTorch's default).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4])?;
    /// assert!((x.var(&[], 1.0, false)?.item::<f32>()? - 5.0 / 3.0).abs() < 1e-6);
    /// assert_eq!(x.std(&[0], 0.0, true)?.shape(), &[1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn var(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let dims = self.dims(dims, "var", loc)?;
        Tensor::record(Op::Var { dims, correction, keepdim }, &[self], loc)
    }

    /// `torch.std(x, dims, correction=correction, keepdim)`: the square root of
    /// [`Tensor::var`].
    #[track_caller]
    pub fn std(&self, dims: &[i64], correction: f64, keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let dims = self.dims(dims, "std", loc)?;
        Tensor::record(Op::Std { dims, correction, keepdim }, &[self], loc)
    }

    /// `torch.logsumexp(x, dims, keepdim)`: `log(sum(exp(x)))` over `dims` (all when empty),
    /// computed stably; integer tensors give the default float.
    #[track_caller]
    pub fn logsumexp(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let dims = self.dims(dims, "logsumexp", loc)?;
        Tensor::record(Op::LogSumExp { dims, keepdim }, &[self], loc)
    }

    /// `torch.linalg.vector_norm(x, ord=p, dim=dims, keepdim)`: `sum(|x|^p)^(1/p)` over `dims`
    /// (all when empty); `p = inf` is the max-norm, `-inf` the min, `0` counts non-zeros.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![3.0f32, -4.0], &[2])?;
    /// assert_eq!(x.norm(2.0, &[], false)?.item::<f32>()?, 5.0);
    /// assert_eq!(x.norm(f64::INFINITY, &[0], false)?.item::<f32>()?, 4.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn norm(&self, p: f64, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let dims = self.dims(dims, "norm", loc)?;
        if (p < 0.0 || p == f64::INFINITY) && dims.iter().any(|&d| self.shape()[d] == 0) {
            return Err(Tensor::error(
                "norm",
                &[self],
                Error::value(format!(
                    "cannot compute the {p} norm over an empty dim because the operation has no identity"
                )),
                loc,
            ));
        }
        Tensor::record(Op::Norm { p, dims, keepdim }, &[self], loc)
    }

    /// `torch.all(x, dims, keepdim)`: whether every element over `dims` (all when empty) is
    /// non-zero; bool result.
    #[track_caller]
    pub fn all(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let dims = self.dims(dims, "all", loc)?;
        Tensor::record(Op::All { dims, keepdim }, &[self], loc)
    }

    /// `torch.any(x, dims, keepdim)`: whether any element over `dims` (all when empty) is
    /// non-zero; bool result.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![true, false, true, true], &[2, 2])?;
    /// assert_eq!(x.all(&[1], false)?.to_vec::<bool>()?, vec![false, true]);
    /// assert!(x.any_all()?.item::<bool>()?);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn any(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let dims = self.dims(dims, "any", loc)?;
        Tensor::record(Op::Any { dims, keepdim }, &[self], loc)
    }

    /// `x.all()`: whether every element is non-zero, as a 0-d bool tensor.
    #[track_caller]
    pub fn all_all(&self) -> Result<Tensor> {
        self.all(&[], false)
    }

    /// `x.any()`: whether any element is non-zero, as a 0-d bool tensor.
    #[track_caller]
    pub fn any_all(&self) -> Result<Tensor> {
        self.any(&[], false)
    }

    /// `torch.cumsum(x, dim)`: running sums along `dim`; integer and bool tensors sum in i64.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4], &[2, 2])?;
    /// assert_eq!(x.cumsum(1)?.to_vec::<i64>()?, vec![1, 3, 3, 7]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn cumsum(&self, dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let dim = self.dim(dim, "cumsum", loc)?;
        Tensor::record(Op::Cumsum { dim }, &[self], loc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_ir::DType;

    fn zeros(shape: &[usize]) -> Tensor {
        Tensor::zeros(shape, DType::F32)
    }

    fn assert_err(r: Result<impl std::fmt::Debug>, op: &str) -> Error {
        let e = r.expect_err("expected an error");
        let text = e.to_string();
        assert_eq!(e.op.as_deref(), Some(op), "{text}");
        assert!(text.contains(file!()), "location missing: {text}");
        e
    }

    #[test]
    fn sum_dims_are_wrapped() {
        let x = zeros(&[2, 3, 4]);
        let s = x.sum(&[-1, 0], false).unwrap();
        assert_eq!(s.shape(), &[3]);
        assert_eq!(s.0.op, Op::Reduce { op: ReduceOp::Sum, dims: vec![2, 0], keepdim: false });
        assert_eq!(x.sum(&[1], true).unwrap().shape(), &[2, 1, 4]);
        assert_eq!(x.sum(&[], true).unwrap().shape(), &[1, 1, 1]);
        assert_eq!(x.sum_all().unwrap().shape(), &[] as &[usize]);
        assert_eq!(Tensor::zeros(&[3], DType::I32).sum_all().unwrap().dtype(), DType::I64);
        assert_eq!(Tensor::zeros(&[3], DType::Bool).sum(&[0], false).unwrap().dtype(), DType::I64);
        assert_eq!(zeros(&[]).sum(&[0], false).unwrap().shape(), &[] as &[usize]);
        assert_err(x.sum(&[3], false), "sum");
        assert_err(x.sum(&[1, -2], false), "sum");
    }

    #[test]
    fn mean_prod_amax_amin() {
        let x = zeros(&[2, 3]);
        assert_eq!(x.mean(&[0], false).unwrap().shape(), &[3]);
        assert_eq!(x.mean(&[], true).unwrap().shape(), &[1, 1]);
        assert_err(Tensor::zeros(&[3], DType::I64).mean(&[], false), "mean");
        assert_eq!(Tensor::zeros(&[3], DType::I8).prod(&[], false).unwrap().dtype(), DType::I64);
        assert_eq!(x.amax(&[-1], true).unwrap().shape(), &[2, 1]);
        assert_eq!(
            x.amin(&[0, 1], false).unwrap().0.op,
            Op::Reduce { op: ReduceOp::Min, dims: vec![0, 1], keepdim: false }
        );
        assert_eq!(x.max_all().unwrap().shape(), &[] as &[usize]);
        assert_eq!(x.min_all().unwrap().dtype(), DType::F32);
        assert_err(zeros(&[0, 2]).max_all(), "amax");
        assert_err(zeros(&[0, 2]).amin(&[0], false), "amin");
        assert_eq!(zeros(&[0, 2]).amax(&[1], false).unwrap().shape(), &[0]);
    }

    #[test]
    fn max_min_dim_give_values_and_indices() {
        let x = zeros(&[2, 3]);
        let (v, i) = x.max_dim(-1, false).unwrap();
        assert_eq!((v.shape(), v.dtype()), (&[2usize][..], DType::F32));
        assert_eq!((i.shape(), i.dtype()), (&[2usize][..], DType::I64));
        assert_eq!(i.0.op, Op::Reduce { op: ReduceOp::ArgMax, dims: vec![1], keepdim: false });
        let (v, i) = x.min_dim(0, true).unwrap();
        assert_eq!(v.shape(), &[1, 3]);
        assert_eq!(i.0.op, Op::Reduce { op: ReduceOp::ArgMin, dims: vec![0], keepdim: true });
        let (v, i) = zeros(&[]).max_dim(0, true).unwrap();
        assert_eq!((v.shape(), i.shape()), (&[] as &[usize], &[] as &[usize]));
        assert_err(x.max_dim(2, false), "max");
        assert_err(zeros(&[0, 3]).min_dim(0, false), "min");
    }

    #[test]
    fn argmax_argmin() {
        let x = zeros(&[2, 3, 4]);
        let a = x.argmax(None, false).unwrap();
        assert_eq!((a.shape(), a.dtype()), (&[] as &[usize], DType::I64));
        assert_eq!(a.0.srcs(&crate::history::read())[0].0.op, Op::Reshape { shape: vec![24] });
        assert_eq!(x.argmax(None, true).unwrap().shape(), &[1, 1, 1]);
        assert_eq!(x.argmin(Some(-2), false).unwrap().shape(), &[2, 4]);
        assert_eq!(x.argmin(Some(1), true).unwrap().shape(), &[2, 1, 4]);
        assert_eq!(zeros(&[5]).argmax(None, true).unwrap().shape(), &[1]);
        assert_eq!(zeros(&[]).argmax(None, true).unwrap().shape(), &[] as &[usize]);
        assert_eq!(zeros(&[]).argmax(Some(-1), false).unwrap().shape(), &[] as &[usize]);
        assert_err(x.argmax(Some(3), false), "argmax");
        let e = assert_err(zeros(&[0, 2]).argmax(None, false), "argmax");
        assert!(e.to_string().contains("f32[0, 2]"), "{e}");
    }

    #[test]
    fn statistics() {
        let x = zeros(&[4, 5]);
        let v = x.var(&[1], 0.0, false).unwrap();
        assert_eq!(v.shape(), &[4]);
        assert_eq!(v.0.op, Op::Var { dims: vec![1], correction: 0.0, keepdim: false });
        assert_eq!(x.std(&[], 1.0, true).unwrap().shape(), &[1, 1]);
        assert_err(Tensor::zeros(&[4], DType::I32).var(&[], 1.0, false), "var");
        let l = Tensor::zeros(&[4, 5], DType::I64).logsumexp(&[-1], false).unwrap();
        assert_eq!((l.shape(), l.dtype()), (&[4usize][..], DType::F32));
        assert_eq!(x.norm(2.0, &[-1], true).unwrap().shape(), &[4, 1]);
        assert_eq!(x.norm(1.0, &[], false).unwrap().0.op, Op::Norm { p: 1.0, dims: vec![0, 1], keepdim: false });
        assert_err(Tensor::zeros(&[4], DType::I64).norm(2.0, &[], false), "norm");
        assert_err(zeros(&[0, 3]).norm(f64::INFINITY, &[0], false), "norm");
        assert_err(zeros(&[0, 3]).norm(-1.0, &[], false), "norm");
        assert_eq!(zeros(&[0, 3]).norm(2.0, &[0], false).unwrap().shape(), &[3]);
    }

    #[test]
    fn logical_reductions_and_cumsum() {
        let x = Tensor::zeros(&[2, 3], DType::Bool);
        assert_eq!(x.all(&[0], false).unwrap().shape(), &[3]);
        assert_eq!(zeros(&[2, 3]).any(&[-1], true).unwrap().dtype(), DType::Bool);
        assert_eq!(x.all_all().unwrap().shape(), &[] as &[usize]);
        assert_eq!(x.any_all().unwrap().0.op, Op::Any { dims: vec![0, 1], keepdim: false });
        assert_err(x.any(&[2], false), "any");
        let c = Tensor::zeros(&[2, 3], DType::I32).cumsum(-1).unwrap();
        assert_eq!((c.shape(), c.dtype()), (&[2usize, 3][..], DType::I64));
        assert_eq!(c.0.op, Op::Cumsum { dim: 1 });
        assert_eq!(zeros(&[]).cumsum(0).unwrap().shape(), &[] as &[usize]);
        assert_err(zeros(&[2]).cumsum(1), "cumsum");
    }
}
