//! Indexing and data movement: `index_select`, `gather`, `scatter`, `split`, `chunk`, `repeat`,
//! `flip`, `pad`, `tril`/`triu`, `contiguous`, and the free functions [`cat`] and [`stack`].
//!
//! Records `IndexSelect`, `Gather`, `Scatter`, `Pad`, `Cat` (and views for splits, flips and
//! repeats); `F.pad`'s last-dim-first order and negative (cropping) pads are resolved here.

use super::shape::{renamed, Loc};
use crate::tensor::{wrap_dim, Tensor};
use coil_ir::{Error, Op, ReduceOp, Result, Scalar};
use std::panic::Location;

impl Tensor {
    /// `torch.index_select(x, dim, index)`: the entries of `dim` at the positions in the 1-D
    /// integer tensor `index`.
    #[track_caller]
    pub fn index_select(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let dim = self.dim(dim, "index_select", loc)?;
        Tensor::record(Op::IndexSelect { dim }, &[self, index], loc)
    }

    /// `torch.gather(x, dim, index)`: `out[i][j] = x[index[i][j]][j]` for `dim = 0`, and so on.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let idx = Tensor::from_vec(vec![0i64, 0, 1, 0], &[2, 2])?;
    /// assert_eq!(x.gather(1, &idx)?.to_vec::<f32>()?, vec![1.0, 1.0, 4.0, 3.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn gather(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let dim = self.dim(dim, "gather", loc)?;
        Tensor::record(Op::Gather { dim }, &[self, index], loc)
    }

    /// `torch.scatter(x, dim, index, src)`: a copy of `x` with `src`'s values written at the
    /// positions `index` names along `dim` (`out[index[i][j]][j] = src[i][j]` for `dim = 0`).
    #[track_caller]
    pub fn scatter(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let dim = self.dim(dim, "scatter", loc)?;
        Tensor::record(Op::Scatter { dim, reduce: None }, &[self, index, src], loc)
    }

    /// `torch.scatter_add(x, dim, index, src)`: like [`Tensor::scatter`], but adds the values
    /// (repeated indices accumulate).
    #[track_caller]
    pub fn scatter_add(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let dim = self.dim(dim, "scatter_add", loc)?;
        Tensor::record(Op::Scatter { dim, reduce: Some(ReduceOp::Sum) }, &[self, index, src], loc)
    }

    /// `torch.split(x, split_size, dim)`: pieces of `split_size` along `dim` (the last may be
    /// smaller).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::zeros(&[5, 2], DType::F32);
    /// let sizes: Vec<usize> = x.split(2, 0)?.iter().map(|p| p.shape()[0]).collect();
    /// assert_eq!(sizes, vec![2, 2, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn split(&self, split_size: usize, dim: i64) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let d = self.dim_of_sized(dim, "split", loc)?;
        let size = self.shape()[d];
        if split_size == 0 && size != 0 {
            return self.fail(
                "split",
                Error::value(format!("split_size can only be 0 if the dim size is 0, but got dim size {size}")),
                loc,
            );
        }
        let n = if split_size == 0 { 1 } else { size.div_ceil(split_size).max(1) };
        self.split_pieces(d, n, |i| split_size.min(size - (i * split_size).min(size)), "split", loc)
    }

    /// `torch.split(x, [sizes], dim)` (`split_with_sizes`): pieces of the given sizes, which must
    /// add up to the size of `dim`.
    #[track_caller]
    pub fn split_sizes(&self, sizes: &[usize], dim: i64) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let d = self.dim_of_sized(dim, "split_with_sizes", loc)?;
        let size = self.shape()[d];
        if sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s)) != Some(size) {
            return self.fail(
                "split_with_sizes",
                Error::shape(format!("split sizes {sizes:?} must sum exactly to {size} (the input's size at dim {d})")),
                loc,
            );
        }
        self.split_pieces(d, sizes.len(), |i| sizes[i], "split_with_sizes", loc)
    }

    /// `torch.chunk(x, chunks, dim)`: pieces of `ceil(size / chunks)` along `dim`; there may be
    /// fewer than `chunks` pieces, as in PyTorch.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::zeros(&[6], DType::F32);
    /// let sizes: Vec<usize> = x.chunk(4, 0)?.iter().map(|p| p.shape()[0]).collect();
    /// assert_eq!(sizes, vec![2, 2, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn chunk(&self, chunks: usize, dim: i64) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        if chunks == 0 {
            return self.fail("chunk", Error::value("chunk expects `chunks` to be greater than 0, got 0"), loc);
        }
        let d = self.dim_of_sized(dim, "chunk", loc)?;
        let size = self.shape()[d];
        if size == 0 {
            // PyTorch keeps the number of chunks when they are all empty.
            return self.split_pieces(d, chunks, |_| 0, "chunk", loc);
        }
        let split_size = size.div_ceil(chunks);
        let n = size.div_ceil(split_size);
        self.split_pieces(d, n, |i| split_size.min(size - i * split_size), "chunk", loc)
    }

    /// The `n` pieces along dim `d`, piece `i` of `size_of(i)` elements. `n` follows from the
    /// user's arguments (a split of size 1 of a dim of 2^42): more pieces than the host can
    /// hold is an error, not an abort.
    fn split_pieces(
        &self,
        d: usize,
        n: usize,
        size_of: impl Fn(usize) -> usize,
        op: &str,
        loc: Loc,
    ) -> Result<Vec<Tensor>> {
        let mut out = Vec::new();
        if out.try_reserve_exact(n).is_err() {
            return self.fail(op, Error::runtime(format!("out of memory: cannot make {n} pieces")), loc);
        }
        let mut start = 0;
        for len in (0..n).map(size_of) {
            out.push(renamed(self.slice_to(d, if len == 0 { 0 } else { start }, len, 1, loc), op)?);
            start += len;
        }
        Ok(out)
    }

    /// `Tensor.repeat(repeats)`: tiles the tensor `repeats[i]` times along dim `i`; extra leading
    /// repeats add dims.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2], &[2])?;
    /// let y = x.repeat(&[2, 2])?;
    /// assert_eq!(y.shape(), &[2, 4]);
    /// assert_eq!(y.to_vec::<i64>()?, vec![1, 2, 1, 2, 1, 2, 1, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn repeat(&self, repeats: &[usize]) -> Result<Tensor> {
        let loc = Location::caller();
        let rank = self.rank();
        if repeats.len() < rank {
            return self.fail(
                "repeat",
                Error::shape(format!(
                    "the number of repeat dims ({}) cannot be smaller than the number of dims of the tensor ({rank})",
                    repeats.len()
                )),
                loc,
            );
        }
        if repeats.is_empty() {
            return Ok(self.clone());
        }
        let mut padded = vec![1; repeats.len() - rank];
        padded.extend_from_slice(self.shape());
        // [s0, s1] -> [1, s0, 1, s1] -> expand [r0, s0, r1, s1] -> [r0*s0, r1*s1]
        let interleaved: Vec<usize> = padded.iter().flat_map(|&s| [1, s]).collect();
        let expanded: Vec<usize> = repeats.iter().zip(&padded).flat_map(|(&r, &s)| [r, s]).collect();
        let out = repeats.iter().zip(&padded).map(|(&r, &s)| r.checked_mul(s)).collect::<Option<Vec<usize>>>();
        let Some(out) = out else {
            let e = Error::shape(format!("repeating {:?} by {repeats:?} overflows its size", self.shape()));
            return self.fail("repeat", e, loc);
        };
        let x = renamed(self.reshape_to(interleaved, loc), "repeat")?;
        let x = renamed(Tensor::record(Op::Expand { shape: expanded }, &[&x], loc), "repeat")?;
        renamed(x.reshape_to(out, loc), "repeat")
    }

    /// `torch.flip(x, dims)`: reverses the order of elements along each of `dims`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2])?;
    /// assert_eq!(x.flip(&[-1])?.to_vec::<i64>()?, vec![2, 1, 4, 3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn flip(&self, dims: &[i64]) -> Result<Tensor> {
        let loc = Location::caller();
        if dims.is_empty() {
            return Ok(self.clone());
        }
        let dims = self.dims(dims, "flip", loc)?;
        let mut x = self.clone();
        for d in dims {
            let size = self.shape()[d];
            if size > 1 {
                x = renamed(x.slice_to(d, size - 1, size, -1, loc), "flip")?;
            }
        }
        Ok(x)
    }

    /// `F.pad(x, pads, value=value)` (constant mode): `pads` holds `(left, right)` pairs, the
    /// last dim first; fewer pairs than dims pad only the last dims. Negative pads crop.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[1, 3])?;
    /// let y = x.pad(&[1, -1], 0.0)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 1.0, 2.0]);
    /// assert_eq!(x.pad(&[0, 0, 2, 0], 9)?.shape(), &[3, 3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn pad(&self, pads: &[i64], value: impl Into<Scalar>) -> Result<Tensor> {
        let loc = Location::caller();
        let value = value.into();
        let rank = self.rank();
        if pads.len() % 2 == 1 {
            return self.fail(
                "pad",
                Error::shape(format!("padding length must be divisible by 2, got {}", pads.len())),
                loc,
            );
        }
        if pads.len() / 2 > rank {
            return self.fail(
                "pad",
                Error::shape(format!(
                    "padding length {} should be at most twice the number of dims ({rank})",
                    pads.len()
                )),
                loc,
            );
        }
        let mut x = self.clone();
        let mut pairs = vec![(0usize, 0usize); rank];
        let mut cropped = false;
        for (i, pair) in pads.chunks(2).enumerate() {
            let d = rank - 1 - i;
            // In i128: pads from the user may be anything.
            let (l, r) = (pair[0] as i128, pair[1] as i128);
            let size = self.shape()[d] as i128;
            let (crop_l, crop_r) = ((-l).max(0), (-r).max(0));
            if size + l + r < 0 || crop_l + crop_r > size {
                return self.fail(
                    "pad",
                    Error::shape(format!(
                        "the input size {size}, plus negative padding {l} and {r}, crops more than dim {d} holds"
                    )),
                    loc,
                );
            }
            if crop_l + crop_r > 0 {
                let len = (size - crop_l - crop_r) as usize;
                x = renamed(x.slice_to(d, if len == 0 { 0 } else { crop_l as usize }, len, 1, loc), "pad")?;
                cropped = true;
            }
            // At most i64::MAX each; their sum with the size is checked when recorded.
            pairs[d] = (l.max(0) as usize, r.max(0) as usize);
        }
        if cropped && pairs.iter().all(|&p| p == (0, 0)) {
            return Ok(x);
        }
        Tensor::record(Op::Pad { pads: pairs, value }, &[&x], loc)
    }

    /// `torch.tril(x, diagonal=k)`: zeroes the elements above the `k`-th diagonal of the last
    /// two dims.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2])?;
    /// assert_eq!(x.tril(0)?.to_vec::<i64>()?, vec![1, 0, 3, 4]);
    /// assert_eq!(x.triu(1)?.to_vec::<i64>()?, vec![0, 2, 0, 0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn tril(&self, k: i64) -> Result<Tensor> {
        Tensor::record(Op::Tril { k }, &[self], Location::caller())
    }

    /// `torch.triu(x, diagonal=k)`: zeroes the elements below the `k`-th diagonal of the last
    /// two dims.
    #[track_caller]
    pub fn triu(&self, k: i64) -> Result<Tensor> {
        Tensor::record(Op::Triu { k }, &[self], Location::caller())
    }

    /// `Tensor.contiguous()`: the tensor itself when it is laid out contiguously (anything but a
    /// strided view: a transpose, a narrow of an inner dim, ...), else a copy of its values that
    /// is no view of anything, as in PyTorch ([`crate::alias`]).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// assert!(!x.t()?.contiguous().is_view()); // a copy
    /// let row = x.select(0, 0)?;
    /// assert!(row.contiguous().is_view()); // already contiguous: the view itself
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn contiguous(&self) -> Tensor {
        let current = self.current();
        if crate::alias::is_contiguous(&current) {
            current
        } else {
            crate::alias::value_of(current)
        }
    }
}

/// `torch.cat(tensors, dim)`: joins tensors along an existing dim; the other dims must agree.
/// The result dtype is the promoted dtype of the inputs.
///
/// ```
/// use coil_frontend::{ops::movement::cat, Tensor};
/// let a = Tensor::from_vec(vec![1i64, 2], &[1, 2])?;
/// let b = Tensor::from_vec(vec![3i64, 4, 5, 6], &[2, 2])?;
/// let c = cat(&[&a, &b], 0)?;
/// assert_eq!(c.shape(), &[3, 2]);
/// assert_eq!(c.to_vec::<i64>()?, vec![1, 2, 3, 4, 5, 6]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn cat(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
    let loc = Location::caller();
    let Some(first) = tensors.first() else {
        return Err(Error::value("cat expects a non-empty list of tensors").in_op("cat", vec![]).at(loc));
    };
    if let Some(i) = tensors.iter().position(|t| t.rank() == 0) {
        return Err(Tensor::error(
            "cat",
            tensors,
            Error::shape(format!("zero-dimensional tensor (at position {i}) cannot be concatenated")),
            loc,
        ));
    }
    let dim = wrap_dim(dim, first.rank()).map_err(|e| Tensor::error("cat", tensors, e, loc))?;
    Tensor::record(Op::Cat { dim }, tensors, loc)
}

/// `torch.stack(tensors, dim)`: joins tensors of one shape along a new dim, in
/// `[-rank-1, rank]`.
///
/// ```
/// use coil_frontend::{ops::movement::stack, Tensor};
/// let a = Tensor::from_vec(vec![1i64, 2], &[2])?;
/// let b = Tensor::from_vec(vec![3i64, 4], &[2])?;
/// let s = stack(&[&a, &b], 1)?;
/// assert_eq!(s.shape(), &[2, 2]);
/// assert_eq!(s.to_vec::<i64>()?, vec![1, 3, 2, 4]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn stack(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
    let loc = Location::caller();
    let Some(first) = tensors.first() else {
        return Err(Error::value("stack expects a non-empty list of tensors").in_op("stack", vec![]).at(loc));
    };
    if let Some(i) = tensors.iter().position(|t| t.shape() != first.shape()) {
        return Err(Tensor::error(
            "stack",
            tensors,
            Error::shape(format!(
                "stack expects each tensor to be equal size, but got {:?} at entry 0 and {:?} at entry {i}",
                first.shape(),
                tensors[i].shape()
            )),
            loc,
        ));
    }
    let d = wrap_dim(dim, first.rank() + 1).map_err(|e| Tensor::error("stack", tensors, e, loc))?;
    let mut shape = first.shape().to_vec();
    shape.insert(d, 1);
    let parts =
        tensors.iter().map(|t| renamed(t.reshape_to(shape.clone(), loc), "stack")).collect::<Result<Vec<_>>>()?;
    let refs: Vec<&Tensor> = parts.iter().collect();
    renamed(Tensor::record(Op::Cat { dim: d }, &refs, loc), "stack")
}
