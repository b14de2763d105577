//! Ops whose output shape depends on the values: `nonzero`, `argwhere`, `masked_select`,
//! `unique` and `unique_consecutive`.
//!
//! No graph can hold them (a kernel's output size is fixed when it compiles), so each reads the
//! values it needs on the host and computes its result there, with PyTorch's semantics and i64
//! indices. Inside a compiled function ([`crate::dynamo`]) that read is a **graph break** of kind
//! [`BreakKind::DataDependentShape`]: the pending work is compiled and run, and capture goes on
//! after the op. `masked_select` reads only its mask: the values are an `index_select` of the
//! flattened input at the mask's positions, so they stay on the device and have a gradient.

use crate::dynamo::{BreakKind, HostRead};
use crate::ops::composite::CompositeScope;
use crate::tensor::Tensor;
use coil_ir::{infer, DType, Error, Result};
use coil_runtime::{Buffer, HostData};
use std::cmp::Ordering;
use std::panic::Location;

/// A unique op's result: the distinct values, the position of each input element's value among
/// them (the input's shape), and how often each value occurs.
#[derive(Clone, Debug)]
pub struct Unique {
    /// The distinct values, sorted.
    pub values: Tensor,
    /// Per input element, the position of its value in `values` (the input's shape).
    pub inverse: Tensor,
    /// How often each value occurs.
    pub counts: Tensor,
}

impl Tensor {
    /// `torch.nonzero(x)` (and `torch.argwhere`): the i64 indices of the nonzero elements,
    /// `[n, rank]`, in row-major order. NaN counts as nonzero. A graph break inside a compiled
    /// function (the output's size depends on the data).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 2.0, 0.0, -1.0], &[2, 2])?;
    /// let nz = x.nonzero()?;
    /// assert_eq!(nz.shape(), &[2, 2]);
    /// assert_eq!(nz.to_vec::<i64>()?, vec![0, 1, 1, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn nonzero(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let positions = self.nonzero_positions("nonzero", loc)?;
        let rank = self.rank();
        let mut data = Vec::with_capacity(positions.len() * rank);
        for p in &positions {
            data.extend(unravel(*p, self.shape()));
        }
        self.host_result(Buffer::from_vec(data, vec![positions.len(), rank]), loc)
    }

    /// `torch.argwhere(x)`: the same as [`Tensor::nonzero`].
    #[track_caller]
    pub fn argwhere(&self) -> Result<Tensor> {
        self.nonzero()
    }

    /// `torch.nonzero(x, as_tuple=True)`: one i64 vector of indices per dim (one for a 0-d
    /// tensor), each as long as the number of nonzero elements.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0i64, 5, 7, 0], &[2, 2])?;
    /// let [rows, cols] = <[Tensor; 2]>::try_from(x.nonzero_tuple()?).unwrap();
    /// assert_eq!((rows.to_vec::<i64>()?, cols.to_vec::<i64>()?), (vec![0, 1], vec![1, 0]));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn nonzero_tuple(&self) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let positions = self.nonzero_positions("nonzero", loc)?;
        if self.rank() == 0 {
            let zeros = vec![0i64; positions.len()];
            return Ok(vec![self.host_result(Buffer::from_vec(zeros, vec![positions.len()]), loc)?]);
        }
        let rows: Vec<Vec<i64>> = positions.iter().map(|&p| unravel(p, self.shape())).collect();
        (0..self.rank())
            .map(|d| {
                let column = rows.iter().map(|r| r[d]).collect();
                self.host_result(Buffer::from_vec(column, vec![positions.len()]), loc)
            })
            .collect()
    }

    /// `torch.masked_select(x, mask)`: the elements of `x` where the bool `mask` is true, as a
    /// vector (`x` and `mask` broadcast together). Only the mask is read on the host (a graph
    /// break inside a compiled function); the values are an `index_select` of `x`, so the
    /// gradient flows to `x`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let m = Tensor::from_vec(vec![true, false], &[2])?;
    /// assert_eq!(x.masked_select(&m)?.to_vec::<f32>()?, vec![1.0, 3.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn masked_select(&self, mask: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let fail = |e: Error| Tensor::error("masked_select", &[self, mask], e, loc);
        if mask.dtype() != DType::Bool {
            return Err(fail(Error::dtype(format!("expected a bool mask, got {}", mask.dtype()))));
        }
        let shape = infer::broadcast_shapes(self.shape(), mask.shape()).map_err(fail)?;
        let _scope = CompositeScope::enter("masked_select", &[self, mask], loc);
        let mask = mask.broadcast_to(&shape)?;
        let positions: Vec<i64> = mask.nonzero_positions("masked_select", loc)?.into_iter().map(|p| p as i64).collect();
        let n = positions.len();
        let index = self.host_result(Buffer::from_vec(positions, vec![n]), loc)?;
        self.broadcast_to(&shape)?.reshape(&[-1])?.index_select(0, &index)
    }

    /// `torch.unique(x, sorted=True)`: the distinct values of `x`, flattened and in ascending
    /// order. `-0.0` equals `0.0`; every NaN is distinct (as in PyTorch) and sorts last.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![3i64, 1, 3, 2, 1], &[5])?;
    /// assert_eq!(x.unique()?.to_vec::<i64>()?, vec![1, 2, 3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn unique(&self) -> Result<Tensor> {
        Ok(self.unique_impl(true, Location::caller())?.values)
    }

    /// `torch.unique(x, sorted=True, return_inverse=True, return_counts=True)`: the distinct
    /// values, the index of each element's value among them (i64, the shape of `x`), and the
    /// number of occurrences of each value (i64).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![3i64, 1, 3, 2], &[2, 2])?;
    /// let u = x.unique_all()?;
    /// assert_eq!(u.values.to_vec::<i64>()?, vec![1, 2, 3]);
    /// assert_eq!(u.inverse.to_vec::<i64>()?, vec![2, 0, 2, 1]);
    /// assert_eq!(u.counts.to_vec::<i64>()?, vec![1, 1, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn unique_all(&self) -> Result<Unique> {
        self.unique_impl(true, Location::caller())
    }

    /// `torch.unique_consecutive(x)`: `x` flattened, each run of equal consecutive values
    /// reduced to one (NaNs are never equal).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 1, 2, 2, 1], &[5])?;
    /// assert_eq!(x.unique_consecutive()?.to_vec::<i64>()?, vec![1, 2, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn unique_consecutive(&self) -> Result<Tensor> {
        Ok(self.unique_impl(false, Location::caller())?.values)
    }

    /// `torch.unique_consecutive(x, return_inverse=True, return_counts=True)`: the values, the
    /// index of each element's run (the shape of `x`), and each run's length.
    #[track_caller]
    pub fn unique_consecutive_all(&self) -> Result<Unique> {
        self.unique_impl(false, Location::caller())
    }

    /// The computed elements of `self` on the host, read for a data-dependent op: a graph break
    /// inside a compiled function, reported at the user's line.
    fn host_values(&self, loc: &'static Location<'static>) -> Result<std::sync::Arc<Buffer>> {
        let _read = HostRead::enter(BreakKind::DataDependentShape, Some(loc));
        self.buffer().map_err(|e| e.at(loc))
    }

    /// Row-major positions of the nonzero elements (NaN is nonzero).
    fn nonzero_positions(&self, op: &str, loc: &'static Location<'static>) -> Result<Vec<usize>> {
        let values = self.host_values(loc).map_err(|e| e.in_op(op, vec![self.meta().to_string()]))?;
        let keep: Vec<bool> = values.to_vec::<f64>().iter().map(|&v| v != 0.0).collect();
        Ok(keep.iter().enumerate().filter(|(_, &k)| k).map(|(i, _)| i).collect())
    }

    /// A result computed on the host, on this tensor's device.
    fn host_result(&self, buffer: Buffer, loc: &'static Location<'static>) -> Result<Tensor> {
        Tensor::from_buffer(buffer).to_device(self.device()).map_err(|e| e.at(loc))
    }

    /// `unique` (`sorted`) or `unique_consecutive`: groups of equal elements, each represented
    /// by its first element (in sorted order for `unique`).
    fn unique_impl(&self, sorted: bool, loc: &'static Location<'static>) -> Result<Unique> {
        let op = if sorted { "unique" } else { "unique_consecutive" };
        let buffer = self.host_values(loc).map_err(|e| e.in_op(op, vec![self.meta().to_string()]))?;
        let keys = Keys::of(&buffer);
        let n = buffer.numel();
        let mut order: Vec<usize> = (0..n).collect();
        if sorted {
            order.sort_by(|&i, &j| keys.cmp(i, j));
        }
        let (mut firsts, mut counts, mut inverse) = (Vec::<usize>::new(), Vec::<i64>::new(), vec![0i64; n]);
        for &i in &order {
            match firsts.last() {
                Some(&f) if keys.equal(f, i) => *counts.last_mut().expect("a group") += 1,
                _ => {
                    firsts.push(i);
                    counts.push(1);
                }
            }
            inverse[i] = firsts.len() as i64 - 1;
        }
        let width = buffer.dtype().size_bytes();
        let bytes = buffer.data.as_bytes();
        let picked: Vec<u8> = firsts.iter().flat_map(|&i| bytes[i * width..(i + 1) * width].iter().copied()).collect();
        let values = Buffer::new(vec![firsts.len()], HostData::from_bytes(buffer.dtype(), &picked)?)?;
        let groups = counts.len();
        Ok(Unique {
            values: self.host_result(values, loc)?,
            inverse: self.host_result(Buffer::from_vec(inverse, self.shape().to_vec()), loc)?,
            counts: self.host_result(Buffer::from_vec(counts, vec![groups]), loc)?,
        })
    }
}

/// Row-major position `p` as indices into `shape`.
fn unravel(mut p: usize, shape: &[usize]) -> Vec<i64> {
    let mut index = vec![0i64; shape.len()];
    for (d, &size) in shape.iter().enumerate().rev() {
        index[d] = (p % size) as i64;
        p /= size;
    }
    index
}

/// Elements compared exactly: floats as f64 (every float dtype converts exactly), the others
/// as i64.
enum Keys {
    Float(Vec<f64>),
    Int(Vec<i64>),
}

impl Keys {
    fn of(buffer: &Buffer) -> Keys {
        if buffer.dtype().is_float() {
            Keys::Float(buffer.to_vec())
        } else {
            Keys::Int(buffer.to_vec())
        }
    }

    /// Ascending, NaN last (NaNs keep their order among themselves).
    fn cmp(&self, i: usize, j: usize) -> Ordering {
        match self {
            Keys::Float(v) => match (v[i].is_nan(), v[j].is_nan()) {
                (false, false) => v[i].partial_cmp(&v[j]).expect("not NaN"),
                (a, b) => a.cmp(&b),
            },
            Keys::Int(v) => v[i].cmp(&v[j]),
        }
    }

    /// Equal values (`-0.0 == 0.0`; NaN equals nothing).
    fn equal(&self, i: usize, j: usize) -> bool {
        match self {
            Keys::Float(v) => v[i] == v[j],
            Keys::Int(v) => v[i] == v[j],
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::Tensor;

    #[test]
    fn nonzero_of_a_0d_tensor_and_an_empty_one() {
        let x = Tensor::scalar(5.0f32);
        assert_eq!(x.nonzero().unwrap().shape(), &[1, 0]);
        assert_eq!(x.nonzero_tuple().unwrap()[0].to_vec::<i64>().unwrap(), vec![0]);
        assert_eq!(Tensor::scalar(0i64).nonzero().unwrap().shape(), &[0, 0]);
        let e = Tensor::from_vec(Vec::<f32>::new(), &[0, 3]).unwrap();
        assert_eq!(e.nonzero().unwrap().shape(), &[0, 2]);
    }

    #[test]
    fn unique_keeps_nans_apart_and_zeros_together() {
        let x = Tensor::from_vec(vec![f32::NAN, 1.0, -0.0, f32::NAN, 0.0, 1.0], &[6]).unwrap();
        let u = x.unique_all().unwrap();
        let v = u.values.to_vec::<f32>().unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!((v[0], v[1]), (0.0, 1.0));
        assert!(v[0].is_sign_negative() && v[2].is_nan() && v[3].is_nan());
        assert_eq!(u.inverse.to_vec::<i64>().unwrap(), vec![2, 1, 0, 3, 0, 1]);
        assert_eq!(u.counts.to_vec::<i64>().unwrap(), vec![2, 2, 1, 1]);
    }

    #[test]
    fn unique_is_exact_for_large_i64() {
        let big = (1i64 << 60) + 1;
        let x = Tensor::from_vec(vec![big, big - 1, big], &[3]).unwrap();
        assert_eq!(x.unique().unwrap().to_vec::<i64>().unwrap(), vec![big - 1, big]);
    }

    #[test]
    fn masked_select_wants_a_bool_mask_and_broadcastable_shapes() {
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
        let e = x.masked_select(&Tensor::from_vec(vec![1i64, 0], &[2]).unwrap()).unwrap_err();
        assert!(e.to_string().contains("masked_select") && e.to_string().contains("bool"), "{e}");
        let e = x.masked_select(&Tensor::from_vec(vec![true; 3], &[3]).unwrap()).unwrap_err();
        assert!(e.to_string().contains("masked_select"), "{e}");
    }
}
