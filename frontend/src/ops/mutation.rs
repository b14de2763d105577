//! In-place ops (`x.add_(&y)`, `x.copy_(&src)`, `x.index_copy_(..)`, ...), functionalized as
//! PrimTorch does: the functional op, cast to `x`'s dtype, then written back over `x`.
//!
//! `x` is rebound to the new value, and every other handle to the tensor sees it, as in PyTorch
//! ([`crate::alias`]): a view of `x` (`x.narrow(..)`, `x.select(..)`, `x.t()`, ...) reads the
//! new values, a `detach`ed alias or an older handle to `x` too; when `x` is itself a view, the
//! write goes through to its base (`x.narrow(0, 1, 2)?.copy_(&src)?` is slice assignment), and
//! the base's other views see it. Outside a compiled function the write happens at once over
//! the base's buffer ([`crate::update_in_place`]: the buffer is donated to the value, so nothing
//! is copied; a pending base is computed first), as PyTorch's eager in-place ops write. A pending
//! computation recorded before the write that reads the old elements cannot have them any more:
//! computing it is an error, never a silent read of the new values. Inside a compiled function
//! the write is recorded: a computed base (an argument) is written back by the call's graph,
//! a pending one is rebound, and ops recorded before the write read the old value.
//!
//! As in PyTorch, the value must have `x`'s shape (the other operand broadcasts to it, not `x`
//! to the other's), and its dtype must cast to `x`'s without changing kind: a float result
//! cannot go into an integer tensor, nor anything but a bool into a bool tensor.

use crate::ops::pointwise::IntoTensor;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Result, Scalar};
use std::panic::Location;

impl Tensor {
    /// Rebinds `self` to `value` (the result of in-place op `op`), written over `self`'s
    /// elements when it has them.
    fn assign(&mut self, op: &str, value: Tensor, loc: &'static Location<'static>) -> Result<()> {
        let fail = |e: Error| Err(Tensor::error(op, &[self, &value], e, loc));
        if value.shape() != self.shape() {
            return fail(Error::shape(format!(
                "output with shape {:?} doesn't match the broadcast shape {:?}",
                self.shape(),
                value.shape()
            )));
        }
        let (from, to) = (value.dtype(), self.dtype());
        let castable = from == to || (to.is_float() && from != DType::Bool) || (to.is_integral() && from.is_integral());
        if !castable || (to == DType::Bool && from != DType::Bool) {
            return fail(Error::dtype(format!("result type {from} can't be cast to the desired output type {to}")));
        }
        let value = if from == to { value } else { value.to_dtype(to)? };
        *self = crate::alias::write(self, value, loc).map_err(|e| Tensor::error(op, &[self], e, loc))?;
        Ok(())
    }

    /// `x.copy_(src)`: `src` (broadcast to `x`'s shape, cast to its dtype) written over `x`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let mut x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// x.realize()?;
    /// x.copy_(&Tensor::from_vec(vec![5i64, 6], &[2])?)?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![5.0, 6.0, 5.0, 6.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn copy_(&mut self, src: &Tensor) -> Result<()> {
        let loc = Location::caller();
        let shape: Vec<usize> = self.shape().to_vec();
        let value = src.to_dtype(self.dtype())?.broadcast_to(&shape)?.contiguous();
        self.assign("copy_", value, loc)
    }

    /// `x.fill_(value)`: every element set to `value`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let mut x = Tensor::zeros(&[3], coil_ir::DType::I64);
    /// x.fill_(7)?;
    /// assert_eq!(x.to_vec::<i64>()?, vec![7, 7, 7]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn fill_(&mut self, value: impl Into<Scalar>) -> Result<()> {
        let loc = Location::caller();
        let value = self.full_like(value);
        self.assign("fill_", value, loc)
    }

    /// `x.zero_()`: every element set to zero.
    #[track_caller]
    pub fn zero_(&mut self) -> Result<()> {
        let loc = Location::caller();
        let value = self.zeros_like();
        self.assign("zero_", value, loc)
    }

    /// `x.masked_fill_(mask, value)`: `value` where `mask` (broadcast to `x`) is true.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let mut x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// x.masked_fill_(&Tensor::from_vec(vec![false, true, false], &[3])?, -1.0)?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![1.0, -1.0, 3.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn masked_fill_(&mut self, mask: &Tensor, value: impl IntoTensor) -> Result<()> {
        let loc = Location::caller();
        let value = self.masked_fill(mask, value)?;
        self.assign("masked_fill_", value, loc)
    }

    /// `x.index_copy_(dim, index, source)`: the slices of `source` written at positions `index`
    /// along `dim`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let mut cache = Tensor::zeros(&[4, 2], coil_ir::DType::F32);
    /// cache.realize()?;
    /// let pos = Tensor::from_vec(vec![2i64], &[1])?;
    /// cache.index_copy_(0, &pos, &Tensor::from_vec(vec![7.0f32, 8.0], &[1, 2])?)?;
    /// assert_eq!(cache.to_vec::<f32>()?, vec![0.0, 0.0, 0.0, 0.0, 7.0, 8.0, 0.0, 0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn index_copy_(&mut self, dim: i64, index: &Tensor, source: &Tensor) -> Result<()> {
        let loc = Location::caller();
        let value = self.index_copy(dim, index, source)?;
        self.assign("index_copy_", value, loc)
    }

    /// `x.index_add_(dim, index, source, alpha)`: `alpha * source`'s slices added at positions
    /// `index` along `dim` (repeated positions accumulate).
    #[track_caller]
    pub fn index_add_(&mut self, dim: i64, index: &Tensor, source: &Tensor, alpha: f64) -> Result<()> {
        let loc = Location::caller();
        let value = self.index_add(dim, index, source, alpha)?;
        self.assign("index_add_", value, loc)
    }

    /// `x.index_put_(indices, values, accumulate)`: [`Tensor::index_put`] written over `x`
    /// (index tensors over the leading dims, broadcast together).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let mut x = Tensor::zeros(&[2, 2], coil_ir::DType::F32);
    /// x.realize()?;
    /// let (rows, cols) = (Tensor::from_vec(vec![1i64], &[1])?, Tensor::from_vec(vec![0i64, 1], &[2])?);
    /// x.index_put_(&[&rows, &cols], &Tensor::from_vec(vec![7.0f32], &[1])?, false)?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![0.0, 0.0, 7.0, 7.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn index_put_(&mut self, indices: &[&Tensor], values: &Tensor, accumulate: bool) -> Result<()> {
        let loc = Location::caller();
        let value = self.index_put(indices, values, accumulate)?;
        self.assign("index_put_", value, loc)
    }

    /// `x.index_fill_(dim, index, value)`: `value` at positions `index` along `dim`.
    #[track_caller]
    pub fn index_fill_(&mut self, dim: i64, index: &Tensor, value: impl IntoTensor) -> Result<()> {
        let loc = Location::caller();
        let value = self.index_fill(dim, index, value)?;
        self.assign("index_fill_", value, loc)
    }

    /// Slice assignment, `x[.., start:end:step, ..] = src` along `dim` (`torch`'s
    /// `x.narrow(dim, ..).copy_(src)` or `x[:, a:b] = src`): `src` (broadcast to the slice's
    /// shape) written over the slice.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let mut x = Tensor::zeros(&[2, 4], coil_ir::DType::F32);
    /// x.realize()?;
    /// x.slice_assign_(1, Some(1), Some(3), 1, &Tensor::from_vec(vec![5.0f32], &[1])?)?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![0.0, 5.0, 5.0, 0.0, 0.0, 5.0, 5.0, 0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn slice_assign_(
        &mut self,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
        src: &Tensor,
    ) -> Result<()> {
        let loc = Location::caller();
        let slice = self.slice(dim, start, end, step)?;
        let src = src.to_dtype(self.dtype())?.broadcast_to(slice.shape())?.contiguous();
        let value = self.slice_scatter(&src, dim, start, end, step)?;
        self.assign("slice_assign_", value, loc)
    }
}

macro_rules! binary_in_place {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor {$(
            $(#[$doc])*
            #[track_caller]
            pub fn $name(&mut self, other: impl IntoTensor) -> Result<()> {
                let loc = Location::caller();
                let value = self.$op(other)?;
                self.assign(stringify!($name), value, loc)
            }
        )*}
    };
}

binary_in_place! {
    /// `x.add_(other)`: `x + other` written over `x` (`other` broadcasts to `x`).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let mut w = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// w.realize()?;
    /// let (old, last) = (w.clone(), w.narrow(0, 1, 1)?);
    /// w.add_(0.5)?;
    /// assert_eq!(w.to_vec::<f32>()?, vec![1.5, 2.5]);
    /// assert_eq!(old.to_vec::<f32>()?, vec![1.5, 2.5]); // every handle and view sees the write
    /// assert_eq!(last.to_vec::<f32>()?, vec![2.5]);
    /// let mut i = Tensor::from_vec(vec![1i64], &[1])?;
    /// assert!(i.add_(0.5).is_err()); // a float result does not go into an integer tensor
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    add_ => add,
    /// `x.sub_(other)`: `x - other` written over `x`.
    sub_ => sub,
    /// `x.mul_(other)`: `x * other` written over `x`.
    mul_ => mul,
    /// `x.div_(other)`: `x / other` written over `x` (true division: an integer `x` is an
    /// error, as in PyTorch).
    div_ => div,
    /// `x.pow_(other)`: `x ** other` written over `x`.
    pow_ => pow,
    /// `x.clamp_min_(min)`: `maximum(x, min)` written over `x` (`min` a scalar or a tensor).
    clamp_min_ => maximum,
    /// `x.clamp_max_(max)`: `minimum(x, max)` written over `x`.
    clamp_max_ => minimum,
}
