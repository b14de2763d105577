//! Sorting: `sort`, `argsort` and `topk`.
//!
//! One primitive does the work: [`Op::Argsort`], the stable sorting positions of each line
//! along a dim (a built-in kernel on CUDA, a parallel kernel on the CPU backend, a comparator
//! sort in the reference interpreter). Sorted values are a `gather` of those positions, so their
//! gradient is the gather's (a scatter of the gradient back to the positions). `topk` is a full
//! sort and a `narrow` of the first `k` positions: the same cost as a sort, which is what a
//! top-k of a whole vocabulary row costs anyway.
//!
//! Order: PyTorch's (`stable=True`): NaN is larger than every number (last ascending, first
//! descending), `-0.0` equals `0.0`, and equal elements keep their order in both directions.
//! `topk` therefore returns ties lowest position first; PyTorch's CPU `topk` returns the same
//! values but its tie order is its selection algorithm's, not specified.

use super::shape::Loc;
use crate::tensor::Tensor;
use coil_ir::{Error, Op, Result};
use std::panic::Location;

impl Tensor {
    /// `torch.sort(x, dim, descending, stable=True)`: the values of each line along `dim` in
    /// order, and the i64 positions they came from. Stable in both directions; NaN sorts as the
    /// largest value. A negative `dim` counts from the end (`-1`: the last dim, PyTorch's default).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![2.0f32, f32::NAN, 1.0, 2.0], &[4])?;
    /// let (values, positions) = x.sort(-1, false)?;
    /// assert_eq!(positions.to_vec::<i64>()?, vec![2, 0, 3, 1]);
    /// assert_eq!(values.to_vec::<f32>()?[..3], [1.0, 2.0, 2.0]);
    /// let (_, down) = x.sort(0, true)?;
    /// assert_eq!(down.to_vec::<i64>()?, vec![1, 0, 3, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn sort(&self, dim: i64, descending: bool) -> Result<(Tensor, Tensor)> {
        let loc = Location::caller();
        let positions = self.argsort_at(dim, descending, "sort", loc)?;
        let values = self.gather_at(dim, &positions, "sort", loc)?;
        Ok((values, positions))
    }

    /// `torch.argsort(x, dim, descending, stable=True)`: the i64 positions that sort each line
    /// along `dim` (see [`Tensor::sort`] for the order).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![3i64, 1, 2, 1, 1, 0], &[2, 3])?;
    /// assert_eq!(x.argsort(1, false)?.to_vec::<i64>()?, vec![1, 2, 0, 2, 0, 1]);
    /// assert_eq!(x.argsort(0, true)?.to_vec::<i64>()?, vec![0, 0, 0, 1, 1, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn argsort(&self, dim: i64, descending: bool) -> Result<Tensor> {
        self.argsort_at(dim, descending, "argsort", Location::caller())
    }

    /// `torch.topk(x, k, dim, largest, sorted=True)`: the `k` largest (or, with `largest` false,
    /// smallest) values of each line along `dim`, in order, and their i64 positions. Ties come
    /// lowest position first; NaN counts as the largest value. `k` larger than the dim is an
    /// error.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 3.0, 5.0, 0.5, 2.0], &[2, 3])?;
    /// let (values, positions) = x.topk(2, -1, true)?;
    /// assert_eq!(values.to_vec::<f32>()?, vec![5.0, 3.0, 5.0, 2.0]);
    /// assert_eq!(positions.to_vec::<i64>()?, vec![1, 2, 0, 2]);
    /// let (smallest, _) = x.topk(1, 1, false)?;
    /// assert_eq!(smallest.to_vec::<f32>()?, vec![1.0, 0.5]);
    /// assert!(x.topk(4, 1, true).is_err());
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn topk(&self, k: usize, dim: i64, largest: bool) -> Result<(Tensor, Tensor)> {
        let loc = Location::caller();
        let d = self.dim(dim, "topk", loc)?;
        let size = self.shape().get(d).copied().unwrap_or(1);
        if k > size {
            let e =
                Error::value(format!("k ({k}) is larger than the size {size} of dim {d}: selected index out of range"));
            return Err(Tensor::error("topk", &[self], e, loc));
        }
        if self.rank() == 0 {
            // One element: `k` is 0 or 1 and the line is already sorted.
            let line = self.reshape_at(&[1], loc)?;
            let (values, positions) = line.topk_at(k, 0, largest, loc)?;
            let shape: &[usize] = if k == 1 { &[] } else { &[0] };
            return Ok((values.reshape_at(shape, loc)?, positions.reshape_at(shape, loc)?));
        }
        self.topk_at(k, d as i64, largest, loc)
    }

    fn topk_at(&self, k: usize, dim: i64, largest: bool, loc: Loc) -> Result<(Tensor, Tensor)> {
        let order = self.argsort_at(dim, largest, "topk", loc)?;
        let size = self.shape()[self.dim(dim, "topk", loc)?];
        let positions = if k == size { order } else { order.narrow_at(dim, k, loc)? };
        let values = self.gather_at(dim, &positions, "topk", loc)?;
        Ok((values, positions))
    }

    pub(crate) fn argsort_at(&self, dim: i64, descending: bool, op: &str, loc: Loc) -> Result<Tensor> {
        let dim = self.dim(dim, op, loc)?;
        Tensor::record(Op::Argsort { dim, descending }, &[self], loc).map_err(|e| renamed_op(e, op))
    }

    fn gather_at(&self, dim: i64, index: &Tensor, op: &str, loc: Loc) -> Result<Tensor> {
        let dim = self.dim(dim, op, loc)?;
        Tensor::record(Op::Gather { dim }, &[self, index], loc).map_err(|e| renamed_op(e, op))
    }

    fn narrow_at(&self, dim: i64, k: usize, loc: Loc) -> Result<Tensor> {
        let dim = self.dim(dim, "topk", loc)?;
        Tensor::record(Op::Slice { dim, start: 0, len: k, step: 1 }, &[self], loc).map_err(|e| renamed_op(e, "topk"))
    }

    fn reshape_at(&self, shape: &[usize], loc: Loc) -> Result<Tensor> {
        Tensor::record(Op::Reshape { shape: shape.to_vec() }, &[self], loc).map_err(|e| renamed_op(e, "topk"))
    }
}

/// The error of an op recorded on behalf of `op`, named as `op`.
fn renamed_op(mut e: Error, op: &str) -> Error {
    e.op = Some(op.to_string());
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_ir::DType;

    #[test]
    fn records_one_argsort_and_a_gather() {
        let x = Tensor::zeros(&[2, 5], DType::BF16);
        let (v, i) = x.sort(-1, true).unwrap();
        assert_eq!(i.0.op, Op::Argsort { dim: 1, descending: true });
        assert_eq!((v.dtype(), i.dtype()), (DType::BF16, DType::I64));
        let (v, i) = x.topk(3, 1, false).unwrap();
        assert_eq!((v.shape(), i.shape()), (&[2usize, 3][..], &[2usize, 3][..]));
    }

    #[test]
    fn bad_arguments_name_the_op_and_line() {
        let x = Tensor::zeros(&[2, 5], DType::F32);
        for (r, op) in [(x.topk(6, 1, true).map(|_| ()), "topk"), (x.sort(2, false).map(|_| ()), "sort")] {
            let e = r.expect_err("refused");
            assert_eq!(e.op.as_deref(), Some(op), "{e}");
            assert!(e.to_string().contains(file!()), "{e}");
        }
        let e = x.argsort(-3, false).expect_err("dim out of range");
        assert!(e.to_string().contains("argsort") && e.to_string().contains("[2, 5]"), "{e}");
    }
}
