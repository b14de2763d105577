//! Indexing and rearranging ops written with views, `where`, `gather` / `scatter` and
//! `index_select`: `masked_fill`, `tile`, `unbind`, `roll`, `diagonal`, `diag`, `diag_embed`,
//! `trace`, `one_hot`, `repeat_interleave`, `index_add`, `index_copy`, `index_fill`, `take`,
//! `take_along_dim`, `movedim`, `swapaxes`, `rot90`, `fliplr`, `flipud`, the `*stack` family,
//! `meshgrid` and `atleast_*d`.

use crate::ops::composite::{beside, CompositeScope};
use crate::ops::movement::cat;
use crate::ops::pointwise::{where_, IntoTensor};
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Result};
use std::panic::Location;

fn sizes(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&s| s as i64).collect()
}

impl Tensor {
    /// `x.masked_fill(mask, value)`: `value` where the bool `mask` (broadcast) is true.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// let m = Tensor::from_vec(vec![true, false], &[2])?;
    /// assert_eq!(x.masked_fill(&m, -1.0)?.to_vec::<f32>()?, vec![-1.0, 2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn masked_fill(&self, mask: &Tensor, value: impl IntoTensor) -> Result<Tensor> {
        let loc = Location::caller();
        let value = beside(self, value)?;
        let _scope = CompositeScope::enter("masked_fill", &[self, mask], loc);
        if mask.dtype() != DType::Bool {
            let e = Error::dtype(format!(
                "masked_fill only supports boolean masks, but got mask with dtype {}",
                mask.dtype()
            ));
            return Err(Tensor::error("masked_fill", &[self, mask], e, loc));
        }
        if !value.is_weak_scalar() && value.rank() != 0 {
            let e = Error::shape(format!(
                "masked_fill only supports a 0-dimensional value tensor, but got tensor with {} dimension(s)",
                value.rank()
            ));
            return Err(Tensor::error("masked_fill", &[self, mask], e, loc));
        }
        // The result keeps x's dtype and shape (the mask may only broadcast into it).
        let out = where_(mask, &value.to_dtype(self.dtype())?, self)?;
        if out.shape() != self.shape() {
            let e = Error::shape(format!("mask of shape {:?} does not broadcast to {:?}", mask.shape(), self.shape()));
            return Err(Tensor::error("masked_fill", &[self, mask], e, loc));
        }
        Ok(out)
    }

    /// `torch.tile(x, reps)`: [`Tensor::repeat`], with `reps` padded with leading ones when
    /// shorter than the rank.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2])?;
    /// assert_eq!(x.tile(&[2])?.to_vec::<i64>()?, vec![1, 2, 1, 2, 3, 4, 3, 4]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn tile(&self, reps: &[usize]) -> Result<Tensor> {
        let _scope = CompositeScope::enter("tile", &[self], Location::caller());
        let mut full = vec![1; self.rank().saturating_sub(reps.len())];
        full.extend_from_slice(reps);
        self.repeat(&full)
    }

    /// `torch.unbind(x, dim)`: the slices along `dim`, each without that dim.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2])?;
    /// let cols = x.unbind(1)?;
    /// assert_eq!(cols[1].to_vec::<i64>()?, vec![2, 4]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn unbind(&self, dim: i64) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("unbind", &[self], loc);
        let d = self.dim_of_sized(dim, "unbind", loc)?;
        let n = self.shape()[d];
        let mut out = Vec::new();
        if out.try_reserve_exact(n).is_err() {
            return Err(Tensor::error(
                "unbind",
                &[self],
                Error::runtime(format!("out of memory: cannot make {n} pieces")),
                loc,
            ));
        }
        for i in 0..n {
            out.push(self.select(d as i64, i as i64)?);
        }
        Ok(out)
    }

    /// `torch.roll(x, shifts, dims)`: rotates elements along each of `dims` by its shift
    /// (positive towards higher indices); with no dims, rolls the flattened tensor.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], &[4])?;
    /// assert_eq!(x.roll(&[1], &[0])?.to_vec::<i64>()?, vec![4, 1, 2, 3]);
    /// assert_eq!(x.roll(&[-1], &[])?.to_vec::<i64>()?, vec![2, 3, 4, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn roll(&self, shifts: &[i64], dims: &[i64]) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("roll", &[self], loc);
        if dims.is_empty() {
            if shifts.len() != 1 {
                let e = Error::shape(format!("shifts {shifts:?} need dims of the same length"));
                return Err(Tensor::error("roll", &[self], e, loc));
            }
            let flat = self.reshape(&[-1])?.roll(shifts, &[0])?;
            return flat.reshape(&sizes(self.shape()));
        }
        if shifts.len() != dims.len() {
            let e = Error::shape(format!(
                "shifts and dimensions must align. shifts: {}, dims: {}",
                shifts.len(),
                dims.len()
            ));
            return Err(Tensor::error("roll", &[self], e, loc));
        }
        let mut x = self.clone();
        for (&shift, &dim) in shifts.iter().zip(dims) {
            let d = self.dim_of_sized(dim, "roll", loc)?;
            let n = self.shape()[d] as i64;
            if n == 0 {
                continue;
            }
            let s = shift.rem_euclid(n);
            if s == 0 {
                continue;
            }
            let tail = x.narrow(d as i64, n - s, s as usize)?;
            let head = x.narrow(d as i64, 0, (n - s) as usize)?;
            x = cat(&[&tail, &head], d as i64)?;
        }
        Ok(x)
    }

    /// `torch.diagonal(x, offset, dim1, dim2)`: the diagonal of the `dim1` x `dim2` matrices,
    /// as a new last dim (above the main diagonal for a positive `offset`).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..6i64).collect(), &[2, 3])?;
    /// assert_eq!(x.diagonal(0, 0, 1)?.to_vec::<i64>()?, vec![0, 4]);
    /// assert_eq!(x.diagonal(1, 0, 1)?.to_vec::<i64>()?, vec![1, 5]);
    /// assert_eq!(x.diagonal(-1, 0, 1)?.to_vec::<i64>()?, vec![3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn diagonal(&self, offset: i64, dim1: i64, dim2: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("diagonal", &[self], loc);
        let d1 = self.dim_of_sized(dim1, "diagonal", loc)?;
        let d2 = self.dim_of_sized(dim2, "diagonal", loc)?;
        if d1 == d2 {
            let e = Error::shape(format!("diagonal dimensions cannot be identical {dim1}, {dim2}"));
            return Err(Tensor::error("diagonal", &[self], e, loc));
        }
        let (rows, cols) = (self.shape()[d1] as i64, self.shape()[d2] as i64);
        // The matrices last, flattened row-major: element (i, i + offset) sits at
        // i * (cols + 1) + offset, a strided slice.
        let mut perm: Vec<i64> = (0..self.rank()).filter(|&d| d != d1 && d != d2).map(|d| d as i64).collect();
        perm.extend([d1 as i64, d2 as i64]);
        let batch: Vec<i64> = perm[..perm.len() - 2].iter().map(|&d| self.shape()[d as usize] as i64).collect();
        let len = if offset >= 0 { rows.min(cols - offset) } else { (rows + offset).min(cols) }.max(0);
        let start = if offset >= 0 { offset } else { -offset * cols };
        let mut flat_shape = batch.clone();
        flat_shape.push(rows * cols);
        let flat = self.permute(&perm)?.reshape(&flat_shape)?;
        let last = flat.rank() as i64 - 1;
        if len == 0 {
            return flat.narrow(last, 0, 0);
        }
        let end = start + (len - 1) * (cols + 1) + 1;
        flat.slice(last, Some(start), Some(end), cols + 1)
    }

    /// `torch.diag_embed(x, offset)`: matrices whose `offset` diagonal holds the last dim of `x`
    /// (batched over the other dims).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let v = Tensor::from_vec(vec![1i64, 2], &[2])?;
    /// assert_eq!(v.diag_embed(0)?.to_vec::<i64>()?, vec![1, 0, 0, 2]);
    /// assert_eq!(v.diag_embed(1)?.shape(), &[3, 3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn diag_embed(&self, offset: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("diag_embed", &[self], loc);
        if self.rank() == 0 {
            let e = Error::shape("diag_embed expects a tensor of at least 1 dim");
            return Err(Tensor::error("diag_embed", &[self], e, loc));
        }
        let n = self.shape()[self.rank() - 1];
        let k = offset.unsigned_abs() as usize;
        let size = n + k;
        let row = Tensor::iota(&[size, size], 0)?.to_device(self.device())?;
        let col = Tensor::iota(&[size, size], 1)?.to_device(self.device())?;
        // Element (i, j) is on the diagonal when j - i == offset; it holds v[min(i, j)].
        let on = col.sub(&row)?.eq(offset)?;
        let last = self.rank() as i64 - 1;
        let padded = self.pad(&[0, k as i64], 0)?;
        // Above the main diagonal the value follows the row, below it the column.
        let values = if offset >= 0 { padded.unsqueeze(last + 1)? } else { padded.unsqueeze(last)? };
        where_(&on, &values, 0)
    }

    /// `torch.diag(x, diagonal)`: for a vector, the square matrix with it on the `diagonal`-th
    /// diagonal; for a matrix, that diagonal as a vector.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let m = Tensor::from_vec((0..4i64).collect(), &[2, 2])?;
    /// assert_eq!(m.diag(0)?.to_vec::<i64>()?, vec![0, 3]);
    /// assert_eq!(m.diag(0)?.diag(0)?.to_vec::<i64>()?, vec![0, 0, 0, 3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn diag(&self, diagonal: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("diag", &[self], loc);
        match self.rank() {
            1 => self.diag_embed(diagonal),
            2 => self.diagonal(diagonal, 0, 1),
            r => Err(Tensor::error(
                "diag",
                &[self],
                Error::shape(format!("diag(): Supports 1D or 2D tensors. Got {r}D")),
                loc,
            )),
        }
    }

    /// `torch.trace(x)`: the sum of the main diagonal of a matrix.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let m = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// assert_eq!(m.trace()?.item::<f32>()?, 5.0);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn trace(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("trace", &[self], loc);
        if self.rank() != 2 {
            let e = Error::shape(format!("trace: expected a matrix, but got tensor with dim {}", self.rank()));
            return Err(Tensor::error("trace", &[self], e, loc));
        }
        self.diagonal(0, 0, 1)?.sum_all()
    }

    /// `F.one_hot(x, num_classes)`: i64 one-hot vectors of the integer classes in `x`, in a new
    /// last dim of `num_classes`. PyTorch's `num_classes=-1` (the largest class + 1) depends on
    /// the data, which a lazy graph cannot: it must be given. A class out of range is an error
    /// when the graph runs (rows of an identity matrix are selected by class).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![2i64, 0], &[2])?;
    /// assert_eq!(x.one_hot(3)?.to_vec::<i64>()?, vec![0, 0, 1, 1, 0, 0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn one_hot(&self, num_classes: usize) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("one_hot", &[self], loc);
        if self.dtype() != DType::I64 {
            let e = Error::dtype(format!(
                "one_hot is only applicable to index tensor of type LongTensor, got {}",
                self.dtype()
            ));
            return Err(Tensor::error("one_hot", &[self], e, loc));
        }
        let eye = Tensor::eye(num_classes, None, DType::I64)?.to_device(self.device())?;
        let mut shape: Vec<i64> = sizes(self.shape());
        shape.push(num_classes as i64);
        eye.index_select(0, &self.reshape(&[-1])?)?.reshape(&shape)
    }

    /// `torch.repeat_interleave(x, repeats, dim)` with one static repeat count: each element
    /// repeated `repeats` times along `dim` (of the flattened tensor when `dim` is `None`).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2], &[2])?;
    /// assert_eq!(x.repeat_interleave(2, None)?.to_vec::<i64>()?, vec![1, 1, 2, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn repeat_interleave(&self, repeats: usize, dim: Option<i64>) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("repeat_interleave", &[self], loc);
        let (x, d) = match dim {
            None => (self.reshape(&[-1])?, 0),
            Some(dim) => (self.clone(), self.dim(dim, "repeat_interleave", loc)?),
        };
        if x.rank() == 0 {
            return x.reshape(&[1])?.repeat_interleave(repeats, Some(0));
        }
        let mut expanded = sizes(x.shape());
        expanded.insert(d + 1, repeats as i64);
        let mut out = sizes(x.shape());
        let Some(n) = (x.shape()[d]).checked_mul(repeats).filter(|&n| n <= i64::MAX as usize) else {
            let e = Error::shape(format!("repeating dim {d} of {:?} {repeats} times overflows its size", x.shape()));
            return Err(Tensor::error("repeat_interleave", &[self], e, loc));
        };
        out[d] = n as i64;
        x.unsqueeze(d as i64 + 1)?.expand(&expanded)?.reshape(&out)
    }

    /// A 1-D `index` along `dim` made into the shape of `src` for `scatter`: `index[i]` at every
    /// position whose coordinate along `dim` is `i`.
    pub(crate) fn index_along(
        &self,
        op: &'static str,
        dim: usize,
        index: &Tensor,
        src_shape: &[usize],
    ) -> Result<Tensor> {
        let loc = Location::caller();
        if index.rank() > 1 || !matches!(index.dtype(), DType::I64 | DType::I32) {
            let e = Error::shape(format!("{op}: index must be a 1-D integer tensor, got {}", index.meta()));
            return Err(Tensor::error(op, &[self, index], e, loc));
        }
        let n = index.numel();
        let mut expected = self.shape().to_vec();
        if self.rank() > 0 {
            expected[dim] = n;
        }
        if src_shape != expected.as_slice() && !(self.rank() == 0 && src_shape.iter().product::<usize>() == n) {
            let e = Error::shape(format!("{op}: source of shape {src_shape:?} does not match {expected:?}"));
            return Err(Tensor::error(op, &[self, index], e, loc));
        }
        let mut shape = vec![1i64; self.rank().max(1)];
        shape[dim] = n as i64;
        let idx = index.to_dtype(DType::I64)?.reshape(&shape)?;
        idx.expand(&sizes(&expected))
    }

    /// `torch.index_add(x, dim, index, source, alpha)`: adds `alpha * source[.., i, ..]` into
    /// `x[.., index[i], ..]` along `dim` (repeated indices accumulate).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[3], coil_ir::DType::F32);
    /// let idx = Tensor::from_vec(vec![0i64, 2, 0], &[3])?;
    /// let src = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    /// assert_eq!(x.index_add(0, &idx, &src, 1.0)?.to_vec::<f32>()?, vec![4.0, 0.0, 2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn index_add(&self, dim: i64, index: &Tensor, source: &Tensor, alpha: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("index_add", &[self, index, source], loc);
        let d = self.dim(dim, "index_add", loc)?;
        let idx = self.index_along("index_add", d, index, source.shape())?;
        let src = if alpha == 1.0 { source.clone() } else { source.mul(alpha)?.to_dtype(source.dtype())? };
        let (x, idx, src) =
            if self.rank() == 0 { (self.reshape(&[1])?, idx, src.reshape(&[-1])?) } else { (self.clone(), idx, src) };
        x.scatter_add(d as i64, &idx, &src)?.reshape(&sizes(self.shape()))
    }

    /// `torch.index_copy(x, dim, index, source)`: writes `source[.., i, ..]` to
    /// `x[.., index[i], ..]` along `dim` (with repeated indices, one of the writes wins).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[3], coil_ir::DType::F32);
    /// let idx = Tensor::from_vec(vec![2i64, 0], &[2])?;
    /// let src = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// assert_eq!(x.index_copy(0, &idx, &src)?.to_vec::<f32>()?, vec![2.0, 0.0, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn index_copy(&self, dim: i64, index: &Tensor, source: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("index_copy", &[self, index, source], loc);
        let d = self.dim(dim, "index_copy", loc)?;
        let idx = self.index_along("index_copy", d, index, source.shape())?;
        if self.rank() == 0 {
            return self.reshape(&[1])?.scatter(0, &idx, &source.reshape(&[-1])?)?.reshape(&[]);
        }
        self.scatter(d as i64, &idx, source)
    }

    /// `torch.index_fill(x, dim, index, value)`: `value` at the positions `index` names along
    /// `dim` (negative indices count from the end; one out of range is an error when the graph
    /// runs).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[2, 3], coil_ir::DType::F32);
    /// let idx = Tensor::from_vec(vec![1i64], &[1])?;
    /// assert_eq!(x.index_fill(1, &idx, 5.0)?.to_vec::<f32>()?, vec![0.0, 5.0, 0.0, 0.0, 5.0, 0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn index_fill(&self, dim: i64, index: &Tensor, value: impl IntoTensor) -> Result<Tensor> {
        let loc = Location::caller();
        let value = beside(self, value)?;
        let _scope = CompositeScope::enter("index_fill", &[self, index], loc);
        let d = self.dim(dim, "index_fill", loc)?;
        if index.rank() > 1 || !matches!(index.dtype(), DType::I64 | DType::I32) {
            let e = Error::shape(format!("index_fill: index must be a 1-D integer tensor, got {}", index.meta()));
            return Err(Tensor::error("index_fill", &[self, index], e, loc));
        }
        let n = if self.rank() == 0 { 1 } else { self.shape()[d] };
        // A mask along dim, made by scattering ones to the indices: the scatter checks their
        // bounds when the graph runs.
        let idx = index.to_dtype(DType::I64)?.reshape(&[-1])?;
        let idx = where_(&idx.lt(0)?, &idx.add(n as i64)?, &idx)?;
        let zeros = Tensor::zeros(&[n], DType::I64).to_device(self.device())?;
        let hit = zeros.scatter(0, &idx, &idx.ones_like())?.ne(0)?;
        let mut shape = vec![1i64; self.rank()];
        if self.rank() > 0 {
            shape[d] = n as i64;
        }
        let mask = hit.reshape(&shape)?;
        where_(&mask, &value.to_dtype(self.dtype())?, self)
    }

    /// `torch.take(x, index)`: the elements of the flattened `x` at `index` (any shape; negative
    /// indices count from the end), in `index`'s shape.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2])?;
    /// let idx = Tensor::from_vec(vec![3i64, -4], &[2])?;
    /// assert_eq!(x.take(&idx)?.to_vec::<i64>()?, vec![4, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn take(&self, index: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("take", &[self, index], loc);
        if index.dtype() != DType::I64 {
            let e = Error::dtype(format!("take(): Expected a long tensor for index, but got {}", index.dtype()));
            return Err(Tensor::error("take", &[self, index], e, loc));
        }
        let n = self.numel() as i64;
        let flat_idx = index.reshape(&[-1])?;
        let flat_idx = where_(&flat_idx.lt(0)?, &flat_idx.add(n)?, &flat_idx)?;
        self.reshape(&[-1])?.index_select(0, &flat_idx)?.reshape(&sizes(index.shape()))
    }

    /// `torch.take_along_dim(x, indices, dim)`: [`Tensor::gather`] after broadcasting `x` and
    /// `indices` against each other in every dim but `dim`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![10i64, 30, 20, 40], &[2, 2])?;
    /// let idx = Tensor::from_vec(vec![1i64, 0], &[2, 1])?;
    /// assert_eq!(x.take_along_dim(&idx, 1)?.to_vec::<i64>()?, vec![30, 20]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn take_along_dim(&self, indices: &Tensor, dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("take_along_dim", &[self, indices], loc);
        if self.rank() != indices.rank() {
            let e = Error::shape(format!(
                "torch.take_along_dim(): input and indices should have the same number of dimensions, but got {} and {}",
                self.rank(),
                indices.rank()
            ));
            return Err(Tensor::error("take_along_dim", &[self, indices], e, loc));
        }
        let d = self.dim_of_sized(dim, "take_along_dim", loc)?;
        let mut xs = sizes(self.shape());
        let mut is = sizes(indices.shape());
        for k in 0..self.rank() {
            if k != d {
                let m = xs[k].max(is[k]);
                xs[k] = m;
                is[k] = m;
            }
        }
        self.expand(&xs)?.gather(d as i64, &indices.expand(&is)?)
    }

    /// `torch.movedim(x, source, destination)`: moves dim `source` to position `destination`,
    /// keeping the order of the others.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[2, 3, 4], coil_ir::DType::F32);
    /// assert_eq!(x.movedim(0, -1)?.shape(), &[3, 4, 2]);
    /// assert_eq!(x.swapaxes(0, 2)?.shape(), &[4, 3, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn movedim(&self, source: i64, destination: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("movedim", &[self], loc);
        let s = self.dim(source, "movedim", loc)?;
        let d = self.dim(destination, "movedim", loc)?;
        if self.rank() == 0 {
            return Ok(self.clone());
        }
        let mut order: Vec<i64> = (0..self.rank() as i64).filter(|&k| k != s as i64).collect();
        order.insert(d, s as i64);
        self.permute(&order)
    }

    /// `torch.swapaxes(x, a, b)` (`swapdims`): [`Tensor::transpose`].
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[2, 3], coil_ir::DType::F32);
    /// assert_eq!(x.swapaxes(0, 1)?.shape(), &[3, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn swapaxes(&self, axis0: i64, axis1: i64) -> Result<Tensor> {
        let _scope = CompositeScope::enter("swapaxes", &[self], Location::caller());
        self.transpose(axis0, axis1)
    }

    /// `torch.fliplr(x)`: reverses dim 1 (at least 2-D).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2])?;
    /// assert_eq!(x.fliplr()?.to_vec::<i64>()?, vec![2, 1, 4, 3]);
    /// assert_eq!(x.flipud()?.to_vec::<i64>()?, vec![3, 4, 1, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn fliplr(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("fliplr", &[self], loc);
        if self.rank() < 2 {
            return Err(Tensor::error("fliplr", &[self], Error::shape("Input must be >= 2-d."), loc));
        }
        self.flip(&[1])
    }

    /// `torch.flipud(x)`: reverses dim 0 (at least 1-D).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3], &[3])?;
    /// assert_eq!(x.flipud()?.to_vec::<i64>()?, vec![3, 2, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn flipud(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("flipud", &[self], loc);
        if self.rank() < 1 {
            return Err(Tensor::error("flipud", &[self], Error::shape("Input must be >= 1-d."), loc));
        }
        self.flip(&[0])
    }

    /// `torch.rot90(x, k, dims)`: rotates by 90 degrees `k` times in the plane of `dims`, from
    /// the first towards the second.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2])?;
    /// assert_eq!(x.rot90(1, [0, 1])?.to_vec::<i64>()?, vec![2, 4, 1, 3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn rot90(&self, k: i64, dims: [i64; 2]) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("rot90", &[self], loc);
        let d0 = self.dim_of_sized(dims[0], "rot90", loc)?;
        let d1 = self.dim_of_sized(dims[1], "rot90", loc)?;
        if d0 == d1 || self.rank() < 2 {
            let e = Error::shape(format!("expected rotation dims to be different, got dims = {dims:?}"));
            return Err(Tensor::error("rot90", &[self], e, loc));
        }
        let (a, b) = (d0 as i64, d1 as i64);
        match k.rem_euclid(4) {
            1 => self.flip(&[b])?.transpose(a, b),
            2 => self.flip(&[a, b]),
            3 => self.flip(&[a])?.transpose(a, b),
            _ => Ok(self.clone()),
        }
    }

    /// `torch.atleast_1d(x)`: a 0-d tensor as `[1]`, others unchanged.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::scalar(1.0f32);
    /// assert_eq!(x.atleast_1d()?.shape(), &[1]);
    /// assert_eq!(x.atleast_2d()?.shape(), &[1, 1]);
    /// assert_eq!(x.atleast_3d()?.shape(), &[1, 1, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn atleast_1d(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("atleast_1d", &[self], Location::caller());
        if self.rank() == 0 {
            return self.reshape(&[1]);
        }
        Ok(self.clone())
    }

    /// `torch.atleast_2d(x)`: 0-d and 1-d tensors as `[1, n]`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[3], coil_ir::DType::F32);
    /// assert_eq!(x.atleast_2d()?.shape(), &[1, 3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn atleast_2d(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("atleast_2d", &[self], Location::caller());
        match self.rank() {
            0 | 1 => self.reshape(&[1, -1]),
            _ => Ok(self.clone()),
        }
    }

    /// `torch.atleast_3d(x)`: `[]` -> `[1, 1, 1]`, `[n]` -> `[1, n, 1]`, `[m, n]` -> `[m, n, 1]`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[3], coil_ir::DType::F32);
    /// assert_eq!(x.atleast_3d()?.shape(), &[1, 3, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn atleast_3d(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("atleast_3d", &[self], Location::caller());
        match self.rank() {
            0 => self.reshape(&[1, 1, 1]),
            1 => self.reshape(&[1, -1, 1]),
            2 => self.unsqueeze(2),
            _ => Ok(self.clone()),
        }
    }
}

/// `torch.hstack(tensors)`: [`cat`] along dim 1, or dim 0 for 1-D tensors.
///
/// ```
/// use coil_frontend::{ops::indexing::{hstack, vstack, dstack}, Tensor};
/// let a = Tensor::from_vec(vec![1i64, 2], &[2])?;
/// assert_eq!(hstack(&[&a, &a])?.shape(), &[4]);
/// assert_eq!(vstack(&[&a, &a])?.shape(), &[2, 2]);
/// assert_eq!(dstack(&[&a, &a])?.shape(), &[1, 2, 2]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn hstack(tensors: &[&Tensor]) -> Result<Tensor> {
    let loc = Location::caller();
    let _scope = CompositeScope::enter("hstack", tensors, loc);
    let ts = tensors.iter().map(|t| t.atleast_1d()).collect::<Result<Vec<_>>>()?;
    let dim = if ts.first().is_some_and(|t| t.rank() == 1) { 0 } else { 1 };
    cat(&ts.iter().collect::<Vec<_>>(), dim)
}

/// `torch.vstack(tensors)`: [`cat`] along dim 0 of [`Tensor::atleast_2d`] of each.
///
/// ```
/// use coil_frontend::{ops::indexing::vstack, Tensor};
/// let a = Tensor::from_vec(vec![1i64, 2], &[2])?;
/// assert_eq!(vstack(&[&a, &a])?.to_vec::<i64>()?, vec![1, 2, 1, 2]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn vstack(tensors: &[&Tensor]) -> Result<Tensor> {
    let _scope = CompositeScope::enter("vstack", tensors, Location::caller());
    let ts = tensors.iter().map(|t| t.atleast_2d()).collect::<Result<Vec<_>>>()?;
    cat(&ts.iter().collect::<Vec<_>>(), 0)
}

/// `torch.dstack(tensors)`: [`cat`] along dim 2 of [`Tensor::atleast_3d`] of each.
///
/// ```
/// use coil_frontend::{ops::indexing::dstack, Tensor};
/// let a = Tensor::from_vec(vec![1i64, 2], &[2])?;
/// assert_eq!(dstack(&[&a, &a])?.to_vec::<i64>()?, vec![1, 1, 2, 2]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn dstack(tensors: &[&Tensor]) -> Result<Tensor> {
    let _scope = CompositeScope::enter("dstack", tensors, Location::caller());
    let ts = tensors.iter().map(|t| t.atleast_3d()).collect::<Result<Vec<_>>>()?;
    cat(&ts.iter().collect::<Vec<_>>(), 2)
}

/// `torch.column_stack(tensors)`: 0-d and 1-d tensors as columns `[n, 1]`, then [`hstack`].
///
/// ```
/// use coil_frontend::{ops::indexing::column_stack, Tensor};
/// let a = Tensor::from_vec(vec![1i64, 2], &[2])?;
/// assert_eq!(column_stack(&[&a, &a])?.to_vec::<i64>()?, vec![1, 1, 2, 2]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn column_stack(tensors: &[&Tensor]) -> Result<Tensor> {
    let _scope = CompositeScope::enter("column_stack", tensors, Location::caller());
    let ts = tensors
        .iter()
        .map(|t| if t.rank() <= 1 { t.reshape(&[-1, 1]) } else { Ok((*t).clone()) })
        .collect::<Result<Vec<_>>>()?;
    cat(&ts.iter().collect::<Vec<_>>(), 1)
}

/// `torch.meshgrid(tensors, indexing="ij" or "xy")`: the 1-D tensors expanded to the grid of
/// their sizes; `xy` swaps the first two dims of the grid, as NumPy does.
///
/// ```
/// use coil_frontend::{ops::indexing::meshgrid, Tensor};
/// let a = Tensor::from_vec(vec![1i64, 2], &[2])?;
/// let b = Tensor::from_vec(vec![3i64, 4, 5], &[3])?;
/// let g = meshgrid(&[&a, &b], "ij")?;
/// assert_eq!(g[0].shape(), &[2, 3]);
/// assert_eq!(g[1].to_vec::<i64>()?, vec![3, 4, 5, 3, 4, 5]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn meshgrid(tensors: &[&Tensor], indexing: &str) -> Result<Vec<Tensor>> {
    let loc = Location::caller();
    let _scope = CompositeScope::enter("meshgrid", tensors, loc);
    let fail = |msg: String| Err(Error::value(msg).in_op("meshgrid", vec![]).at(loc));
    if indexing != "ij" && indexing != "xy" {
        return fail(format!("indexing must be one of \"xy\" or \"ij\", got {indexing}"));
    }
    if let Some(t) = tensors.iter().find(|t| t.rank() > 1) {
        return fail(format!("expected 0D or 1D tensors, got {}", t.meta()));
    }
    let swap = indexing == "xy" && tensors.len() >= 2;
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    if swap {
        order.swap(0, 1);
    }
    let grid: Vec<i64> = order.iter().map(|&i| tensors[i].numel() as i64).collect();
    let mut out = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        let pos = order.iter().position(|&o| o == i).expect("a permutation");
        let mut shape = vec![1i64; tensors.len()];
        shape[pos] = t.numel() as i64;
        out.push(t.reshape(&shape)?.expand(&grid)?);
    }
    Ok(out)
}

/// `torch.row_stack(tensors)`: [`vstack`].
///
/// ```
/// use coil_frontend::{ops::indexing::row_stack, Tensor};
/// let a = Tensor::from_vec(vec![1i64, 2], &[2])?;
/// assert_eq!(row_stack(&[&a, &a])?.shape(), &[2, 2]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn row_stack(tensors: &[&Tensor]) -> Result<Tensor> {
    let _scope = CompositeScope::enter("row_stack", tensors, Location::caller());
    vstack(tensors)
}
