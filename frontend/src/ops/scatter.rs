//! Scatter with a reduction: `scatter_reduce` and `index_reduce`.
//!
//! One primitive does the work: [`Op::Scatter`] with a [`ReduceOp`] (sum, prod, amax, amin),
//! which combines each source value into the element its index names, the element's own value
//! included. The rest is composition: `include_self=False` first writes the reduction's identity
//! (0, 1, the lowest or the highest value) at every position the index names, and `mean` is a
//! sum divided by a count scattered the same way (a floor division for integers, as in
//! PyTorch). Gradients: sum and mean through the scatter's adjoint (a gather), amax and amin
//! split evenly among the elements equal to the result, prod as the product of the other
//! factors (zeros handled as PyTorch does) — see `coil_passes::autodiff`.

use crate::ops::composite::CompositeScope;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Op, ReduceOp, Result, Scalar};
use std::panic::Location;

/// The `reduce` argument of `scatter_reduce` and `index_reduce`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScatterReduce {
    /// Sum the values into the element.
    Sum,
    /// Multiply the values into the element.
    Prod,
    /// The mean of the values (and the element, with `include_self`).
    Mean,
    /// The largest value (NaN propagates).
    Amax,
    /// The smallest value (NaN propagates).
    Amin,
}

impl ScatterReduce {
    /// PyTorch's name (`"sum"`, `"prod"`, `"mean"`, `"amax"`, `"amin"`).
    pub fn name(self) -> &'static str {
        match self {
            ScatterReduce::Sum => "sum",
            ScatterReduce::Prod => "prod",
            ScatterReduce::Mean => "mean",
            ScatterReduce::Amax => "amax",
            ScatterReduce::Amin => "amin",
        }
    }

    /// The primitive's reduction (`mean` scatters a sum).
    fn op(self) -> ReduceOp {
        match self {
            ScatterReduce::Sum | ScatterReduce::Mean => ReduceOp::Sum,
            ScatterReduce::Prod => ReduceOp::Prod,
            ScatterReduce::Amax => ReduceOp::Max,
            ScatterReduce::Amin => ReduceOp::Min,
        }
    }

    /// The value that leaves every other value unchanged, in `dtype`.
    fn identity(self, dtype: DType) -> Scalar {
        let (lowest, highest) = match dtype {
            DType::Bool => (Scalar::Bool(false), Scalar::Bool(true)),
            DType::U8 => (Scalar::Int(0), Scalar::Int(u8::MAX.into())),
            DType::I8 => (Scalar::Int(i8::MIN.into()), Scalar::Int(i8::MAX.into())),
            DType::I16 => (Scalar::Int(i16::MIN.into()), Scalar::Int(i16::MAX.into())),
            DType::I32 => (Scalar::Int(i32::MIN.into()), Scalar::Int(i32::MAX.into())),
            DType::I64 => (Scalar::Int(i64::MIN), Scalar::Int(i64::MAX)),
            _ => (Scalar::Float(f64::NEG_INFINITY), Scalar::Float(f64::INFINITY)),
        };
        match self {
            ScatterReduce::Sum | ScatterReduce::Mean => Scalar::Int(0),
            ScatterReduce::Prod => Scalar::Int(1),
            ScatterReduce::Amax => lowest,
            ScatterReduce::Amin => highest,
        }
    }
}

impl Tensor {
    /// `torch.scatter_reduce(x, dim, index, src, reduce, include_self)`: a copy of `x` where each
    /// `src[p]` is combined into `out[p with p[dim] = index[p]]` by `reduce`, for every position
    /// `p` of `index` (the same rules as [`Tensor::scatter`]). With `include_self` false the
    /// elements the index names start from the reduction's identity instead of `x`'s value
    /// (the mean counts only the scattered values); the others keep `x`'s value. amax and amin
    /// propagate NaN. An index out of range is an error when the graph runs.
    ///
    /// ```
    /// use coil_frontend::{ops::scatter::ScatterReduce, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// let idx = Tensor::from_vec(vec![0i64, 0, 2], &[3])?;
    /// let src = Tensor::from_vec(vec![5.0f32, -1.0, 4.0], &[3])?;
    /// let max = x.scatter_reduce(0, &idx, &src, ScatterReduce::Amax, true)?;
    /// assert_eq!(max.to_vec::<f32>()?, vec![5.0, 2.0, 4.0]);
    /// let mean = x.scatter_reduce(0, &idx, &src, ScatterReduce::Mean, false)?;
    /// assert_eq!(mean.to_vec::<f32>()?, vec![2.0, 2.0, 4.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn scatter_reduce(
        &self,
        dim: i64,
        index: &Tensor,
        src: &Tensor,
        reduce: ScatterReduce,
        include_self: bool,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("scatter_reduce", &[self, index, src], loc);
        let d = self.dim(dim, "scatter_reduce", loc)?;
        self.scatter_reduce_at(d, index, src, reduce, include_self, loc)
    }

    /// `torch.index_reduce(x, dim, index, source, reduce, include_self)`: combines
    /// `source[.., i, ..]` into `x[.., index[i], ..]` along `dim` by `reduce` (`prod`, `mean`,
    /// `amax` or `amin`; PyTorch has no `sum` here: that is [`Tensor::index_add`]), `index` a 1-D
    /// integer tensor. `include_self` as in [`Tensor::scatter_reduce`].
    ///
    /// ```
    /// use coil_frontend::{ops::scatter::ScatterReduce, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let idx = Tensor::from_vec(vec![1i64, 1], &[2])?;
    /// let src = Tensor::from_vec(vec![2.0f32, 3.0, 4.0, 5.0], &[2, 2])?;
    /// let y = x.index_reduce(0, &idx, &src, ScatterReduce::Prod, true)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.0, 2.0, 24.0, 60.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn index_reduce(
        &self,
        dim: i64,
        index: &Tensor,
        source: &Tensor,
        reduce: ScatterReduce,
        include_self: bool,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        if reduce == ScatterReduce::Sum {
            let e = Error::unsupported("index_reduce reduces with prod, mean, amax or amin (use index_add to sum)");
            return Err(Tensor::error("index_reduce", &[self, index, source], e, loc));
        }
        let _scope = CompositeScope::enter("index_reduce", &[self, index, source], loc);
        let d = self.dim(dim, "index_reduce", loc)?;
        let idx = self.index_along("index_reduce", d, index, source.shape())?;
        if self.rank() == 0 {
            let (x, src) = (self.reshape(&[1])?, source.reshape(&[-1])?);
            return x.scatter_reduce_at(0, &idx, &src, reduce, include_self, loc)?.reshape(&[]);
        }
        self.scatter_reduce_at(d, &idx, source, reduce, include_self, loc)
    }

    /// The composition, inside the caller's composite scope.
    fn scatter_reduce_at(
        &self,
        dim: usize,
        index: &Tensor,
        src: &Tensor,
        reduce: ScatterReduce,
        include_self: bool,
        loc: &'static Location<'static>,
    ) -> Result<Tensor> {
        let scatter = |x: &Tensor, op: Option<ReduceOp>, values: &Tensor| {
            Tensor::record(Op::Scatter { dim, reduce: op }, &[x, index, values], loc)
        };
        let base = if include_self {
            self.clone()
        } else {
            let identity = Tensor::full(index.shape(), reduce.identity(self.dtype()), self.dtype());
            scatter(self, None, &identity.to_device(self.device())?)?
        };
        let total = scatter(&base, Some(reduce.op()), src)?;
        if reduce != ScatterReduce::Mean {
            return Ok(total);
        }
        let start = if include_self { self.ones_like() } else { self.zeros_like() };
        let ones = Tensor::full(index.shape(), 1, self.dtype()).to_device(self.device())?;
        let count = scatter(&start, Some(ReduceOp::Sum), &ones)?;
        let count = count.ne(0)?.where_cond(&count, 1)?;
        if self.dtype().is_float() {
            total.div(&count)
        } else {
            total.floor_divide(&count)
        }
    }
}
