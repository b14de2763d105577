//! Splitting and assembling tensors, written with slices, `cat`, `pad` and `index_copy`:
//! `diff`, `block_diag`, `cartesian_prod`, `broadcast_tensors`, `tensor_split` (sections or
//! indices), `hsplit`, `vsplit`, `slice_scatter`, `select_scatter`.

use crate::ops::composite::CompositeScope;
use crate::ops::indexing::meshgrid;
use crate::ops::movement::{cat, stack};
use crate::ops::shape::Loc;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Result};
use std::panic::Location;

fn fail<T>(op: &str, srcs: &[&Tensor], msg: String, loc: Loc) -> Result<T> {
    Err(Tensor::error(op, srcs, Error::shape(msg), loc))
}

/// The shape `shapes` broadcast to, by PyTorch's rules, or `None` when they do not broadcast.
fn broadcast_shape<'a>(shapes: impl Iterator<Item = &'a [usize]>) -> Option<Vec<usize>> {
    let mut out: Vec<usize> = Vec::new();
    for s in shapes {
        if s.len() > out.len() {
            let mut grown = vec![1; s.len() - out.len()];
            grown.extend(&out);
            out = grown;
        }
        let offset = out.len() - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[offset + i];
            match (*o, d) {
                (a, b) if a == b => {}
                (1, b) => *o = b,
                (_, 1) => {}
                _ => return None,
            }
        }
    }
    Some(out)
}

impl Tensor {
    /// `torch.diff(x, n, dim, prepend, append)`: the `n`-th forward difference along `dim`, of
    /// `x` with `prepend` and `append` joined on (bools differ by `!=`, as in PyTorch).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 4, 9, 16], &[4])?;
    /// assert_eq!(x.diff(1, -1, None, None)?.to_vec::<i64>()?, vec![3, 5, 7]);
    /// assert_eq!(x.diff(2, -1, None, None)?.to_vec::<i64>()?, vec![2, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn diff(&self, n: usize, dim: i64, prepend: Option<&Tensor>, append: Option<&Tensor>) -> Result<Tensor> {
        let loc = Location::caller();
        let mut srcs = vec![self];
        srcs.extend(prepend);
        srcs.extend(append);
        let _scope = CompositeScope::enter("diff", &srcs, loc);
        let d = self.dim_of_sized(dim, "diff", loc)?;
        let mut parts: Vec<&Tensor> = Vec::new();
        parts.extend(prepend);
        parts.push(self);
        parts.extend(append);
        let mut x = if parts.len() > 1 { cat(&parts, d as i64)? } else { self.clone() };
        for _ in 0..n {
            let len = x.shape()[d];
            if len == 0 {
                break;
            }
            let hi = x.narrow(d as i64, 1, len - 1)?;
            let lo = x.narrow(d as i64, 0, len - 1)?;
            x = if x.dtype() == DType::Bool { hi.ne(&lo)? } else { hi.sub(&lo)? };
        }
        Ok(x)
    }

    /// `torch.tensor_split(x, sections, dim)`: `sections` pieces along `dim`, the first
    /// `size % sections` of them one longer.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..5i64).collect(), &[5])?;
    /// let sizes: Vec<usize> = x.tensor_split(3, 0)?.iter().map(|p| p.numel()).collect();
    /// assert_eq!(sizes, vec![2, 2, 1]);
    /// let at: Vec<usize> = x.tensor_split_at(&[1, 4], 0)?.iter().map(|p| p.numel()).collect();
    /// assert_eq!(at, vec![1, 3, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn tensor_split(&self, sections: usize, dim: i64) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("tensor_split", &[self], loc);
        let d = self.dim_of_sized(dim, "tensor_split", loc)?;
        if sections == 0 {
            return fail("tensor_split", &[self], "number of sections must be larger than 0, got 0".into(), loc);
        }
        let size = self.shape()[d];
        let (base, extra) = (size / sections, size % sections);
        let mut bounds = Vec::new();
        if bounds.try_reserve_exact(sections - 1).is_err() {
            let e = Error::runtime(format!("out of memory: cannot make {sections} pieces"));
            return Err(Tensor::error("tensor_split", &[self], e, loc));
        }
        let mut at = 0;
        for i in 0..sections - 1 {
            at += base + (i < extra) as usize;
            bounds.push(at as i64);
        }
        self.tensor_split_at(&bounds, d as i64)
    }

    /// `torch.tensor_split(x, indices, dim)`: the pieces `[0, i0)`, `[i0, i1)`, ..., `[ik, end)`
    /// along `dim` (indices clamp to the size; negative ones count from the end).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..4i64).collect(), &[4])?;
    /// let parts = x.tensor_split_at(&[1, -1], 0)?;
    /// assert_eq!(parts[1].to_vec::<i64>()?, vec![1, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn tensor_split_at(&self, indices: &[i64], dim: i64) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("tensor_split", &[self], loc);
        let d = self.dim_of_sized(dim, "tensor_split", loc)?;
        let size = self.shape()[d] as i64;
        let clamp = |i: i64| if i < 0 { (i + size).max(0) } else { i.min(size) };
        let mut start = 0;
        let mut out = Vec::with_capacity(indices.len() + 1);
        for end in indices.iter().map(|&i| clamp(i)).chain([size]) {
            let len = (end - start).max(0) as usize;
            out.push(self.narrow(d as i64, if len == 0 { 0 } else { start }, len)?);
            start = start.max(end);
        }
        Ok(out)
    }

    /// `torch.hsplit(x, n)`: `n` equal pieces along dim 1 (dim 0 for a 1-D tensor).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[2, 6], coil_ir::DType::F32);
    /// assert_eq!(x.hsplit(3)?[0].shape(), &[2, 2]);
    /// assert_eq!(x.vsplit(2)?[1].shape(), &[1, 6]);
    /// assert!(x.hsplit(4).is_err());
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn hsplit(&self, sections: usize) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("hsplit", &[self], loc);
        let dim = if self.rank() == 1 { 0 } else { 1 };
        self.even_split("hsplit", sections, dim, loc)
    }

    /// `torch.vsplit(x, n)`: `n` equal pieces along dim 0 (at least 2-D).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[4, 2], coil_ir::DType::F32);
    /// assert_eq!(x.vsplit(2)?[0].shape(), &[2, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn vsplit(&self, sections: usize) -> Result<Vec<Tensor>> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("vsplit", &[self], loc);
        if self.rank() < 2 {
            return fail(
                "vsplit",
                &[self],
                format!(
                    "torch.vsplit requires a tensor with at least 2 dimension, but got a tensor with {} dimensions!",
                    self.rank()
                ),
                loc,
            );
        }
        self.even_split("vsplit", sections, 0, loc)
    }

    fn even_split(&self, op: &'static str, sections: usize, dim: usize, loc: Loc) -> Result<Vec<Tensor>> {
        if self.rank() == 0 {
            return fail(op, &[self], format!("{op} requires a tensor with at least 1 dimension"), loc);
        }
        let size = self.shape()[dim];
        if sections == 0 || !size.is_multiple_of(sections) {
            let msg = format!("torch.{op} attempted to split along dimension {dim}, but the size of the dimension {size} is not divisible by the split_size {sections}!");
            return fail(op, &[self], msg, loc);
        }
        self.tensor_split(sections, dim as i64)
    }

    /// `torch.slice_scatter(x, src, dim, start, end, step)`: `x` with `src` written to the
    /// slice `start:end:step` of `dim`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[5], coil_ir::DType::F32);
    /// let src = Tensor::ones(&[2], coil_ir::DType::F32);
    /// assert_eq!(x.slice_scatter(&src, 0, Some(1), None, 2)?.to_vec::<f32>()?, vec![0.0, 1.0, 0.0, 1.0, 0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn slice_scatter(
        &self,
        src: &Tensor,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("slice_scatter", &[self, src], loc);
        let d = self.dim_of_sized(dim, "slice_scatter", loc)?;
        // The positions the slice covers, as the slice of an index range.
        let positions = Tensor::iota(&[self.shape()[d]], 0)?.to_device(self.device())?.slice(0, start, end, step)?;
        let mut expected = self.shape().to_vec();
        expected[d] = positions.numel();
        if src.shape() != expected.as_slice() {
            return fail(
                "slice_scatter",
                &[self, src],
                format!("expected src to have a size equal to the slice of self, {expected:?}, got {:?}", src.shape()),
                loc,
            );
        }
        self.index_copy(d as i64, &positions, src)
    }

    /// `torch.select_scatter(x, src, dim, index)`: `x` with `src` written to `x.select(dim,
    /// index)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[2, 2], coil_ir::DType::F32);
    /// let src = Tensor::ones(&[2], coil_ir::DType::F32);
    /// assert_eq!(x.select_scatter(&src, 1, -1)?.to_vec::<f32>()?, vec![0.0, 1.0, 0.0, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn select_scatter(&self, src: &Tensor, dim: i64, index: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("select_scatter", &[self, src], loc);
        let d = self.dim_of_sized(dim, "select_scatter", loc)?;
        let n = self.shape()[d] as i64;
        if index < -n || index >= n {
            return fail(
                "select_scatter",
                &[self, src],
                format!("index {index} is out of bounds for dimension {d} with size {n}"),
                loc,
            );
        }
        let i = if index < 0 { index + n } else { index };
        let slice_end = if i + 1 == n { None } else { Some(i + 1) };
        self.slice_scatter(&src.unsqueeze(d as i64)?, d as i64, Some(i), slice_end, 1)
    }
}

/// `torch.block_diag(tensors)`: the matrices (0-d and 1-d tensors as one row) on the diagonal of
/// a zero matrix, in the promoted dtype.
///
/// ```
/// use coil_frontend::{ops::assemble::block_diag, Tensor};
/// let a = Tensor::from_vec(vec![1i64, 2], &[1, 2])?;
/// let b = Tensor::from_vec(vec![3i64], &[1])?;
/// assert_eq!(block_diag(&[&a, &b])?.to_vec::<i64>()?, vec![1, 2, 0, 0, 0, 3]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn block_diag(tensors: &[&Tensor]) -> Result<Tensor> {
    let loc = Location::caller();
    let _scope = CompositeScope::enter("block_diag", tensors, loc);
    if let Some(t) = tensors.iter().find(|t| t.rank() > 2) {
        return fail(
            "block_diag",
            tensors,
            format!(
                "torch.block_diag: Input tensors must have 2 or fewer dimensions. Input has {} dimensions",
                t.rank()
            ),
            loc,
        );
    }
    let blocks = tensors
        .iter()
        .map(|t| t.reshape(&[if t.rank() == 2 { t.shape()[0] as i64 } else { 1 }, -1]))
        .collect::<Result<Vec<_>>>()?;
    let total: usize = blocks.iter().map(|b| b.shape()[1]).sum();
    let mut left = 0;
    let mut rows = Vec::with_capacity(blocks.len());
    for b in &blocks {
        let w = b.shape()[1];
        rows.push(b.pad(&[left as i64, (total - left - w) as i64], 0)?);
        left += w;
    }
    if rows.is_empty() {
        return Ok(Tensor::zeros(&[0, 0], DType::F32));
    }
    cat(&rows.iter().collect::<Vec<_>>(), 0)
}

/// `torch.cartesian_prod(tensors)`: every combination of one element of each 1-D tensor, as the
/// rows of a `[n1 * n2 * ..., k]` tensor (a single tensor is returned as it is).
///
/// ```
/// use coil_frontend::{ops::assemble::cartesian_prod, Tensor};
/// let a = Tensor::from_vec(vec![1i64, 2], &[2])?;
/// let b = Tensor::from_vec(vec![3i64, 4], &[2])?;
/// assert_eq!(cartesian_prod(&[&a, &b])?.to_vec::<i64>()?, vec![1, 3, 1, 4, 2, 3, 2, 4]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn cartesian_prod(tensors: &[&Tensor]) -> Result<Tensor> {
    let loc = Location::caller();
    let _scope = CompositeScope::enter("cartesian_prod", tensors, loc);
    if let Some(t) = tensors.iter().find(|t| t.rank() != 1) {
        return fail("cartesian_prod", tensors, format!("Expect a 1D vector, but got shape {:?}", t.shape()), loc);
    }
    if tensors.len() == 1 {
        return Ok(tensors[0].clone());
    }
    let grid = meshgrid(tensors, "ij")?;
    let flat = grid.iter().map(|g| g.reshape(&[-1])).collect::<Result<Vec<_>>>()?;
    stack(&flat.iter().collect::<Vec<_>>(), 1)
}

/// `torch.broadcast_tensors(tensors)`: each tensor expanded to the shape they broadcast to.
///
/// ```
/// use coil_frontend::{ops::assemble::broadcast_tensors, Tensor};
/// use coil_ir::DType;
/// let (a, b) = (Tensor::zeros(&[3, 1], DType::F32), Tensor::zeros(&[4], DType::I64));
/// let out = broadcast_tensors(&[&a, &b])?;
/// assert_eq!((out[0].shape(), out[1].shape()), (&[3usize, 4][..], &[3usize, 4][..]));
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn broadcast_tensors(tensors: &[&Tensor]) -> Result<Vec<Tensor>> {
    let loc = Location::caller();
    let _scope = CompositeScope::enter("broadcast_tensors", tensors, loc);
    let Some(shape) = broadcast_shape(tensors.iter().map(|t| t.shape())) else {
        let shapes: Vec<&[usize]> = tensors.iter().map(|t| t.shape()).collect();
        return fail("broadcast_tensors", tensors, format!("shapes {shapes:?} do not broadcast to one shape"), loc);
    };
    tensors.iter().map(|t| t.broadcast_to(&shape)).collect()
}
