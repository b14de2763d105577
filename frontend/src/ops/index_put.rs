//! Advanced indexing by a tuple of index tensors over the leading dims: `x[i0, i1, ...]`
//! (`torch.ops.aten.index`, [`Tensor::index`]) and `x.index_put(indices, values, accumulate)`
//! (`torch.index_put`, [`Tensor::index_put`]; `index_put_` is in [`crate::ops::mutation`]).
//!
//! The index tensors broadcast together to a shape `B`; element `b` of `B` names the position
//! `(i0[b], i1[b], ..)` of the first `k` dims, the rest of the dims kept whole. Both ops merge
//! the `k` dims into one (a reshape) and address it by the flat position
//! `sum_j ij * stride_j`, so they are an `index_select`, `index_copy` or `index_add` along dim 0:
//! the compiler sees the same primitives as for one index. Each index is checked against its
//! own dim first (an `index_select` of that dim's positions), so an index out of range is an
//! error even where the flat position would be in range; negative indices count from the end.

use crate::ops::assemble::broadcast_tensors;
use crate::ops::composite::CompositeScope;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Result};
use std::panic::Location;

/// The flat positions `[n]` into the first `indices.len()` dims of `x` (merged), and the
/// shape `B` the indices broadcast to; errors name `op`.
fn flat_positions(
    x: &Tensor,
    indices: &[&Tensor],
    op: &'static str,
    loc: &'static Location<'static>,
) -> Result<(Tensor, Vec<usize>)> {
    let fail = |msg: String| {
        let mut srcs = vec![x];
        srcs.extend_from_slice(indices);
        Err(Tensor::error(op, &srcs, Error::shape(msg), loc))
    };
    if indices.is_empty() || indices.len() > x.rank() {
        return fail(format!("{} index tensors for a tensor of {} dims", indices.len(), x.rank()));
    }
    if let Some(bad) = indices.iter().find(|i| !matches!(i.dtype(), DType::I64 | DType::I32)) {
        let msg = format!(
            "tensors used as indices must be long or int tensors, got {} (a bool mask: use masked_fill)",
            bad.dtype()
        );
        return Err(Tensor::error(op, &[x, bad], Error::dtype(msg), loc));
    }
    let broadcast = broadcast_tensors(indices).map_err(|e| e.in_op(op, vec![]).at(loc))?;
    let shape = broadcast[0].shape().to_vec();
    let mut flat: Option<Tensor> = None;
    let mut stride = 1i64;
    for (j, index) in broadcast.iter().enumerate().rev() {
        let size = x.shape()[j];
        let index = index.to_dtype(DType::I64)?.reshape(&[-1])?;
        // Negative indices count from the end; then each is checked against its own dim.
        let wrapped = crate::ops::pointwise::where_(&index.lt(0i64)?, &index.add(size as i64)?, &index)?;
        let checked = Tensor::arange(0i64, size as i64, 1i64, DType::I64)?.index_select(0, &wrapped)?;
        let term = if stride == 1 { checked } else { checked.mul(stride)? };
        flat = Some(match flat {
            Some(f) => f.add(&term)?,
            None => term,
        });
        stride *= size as i64;
    }
    Ok((flat.expect("at least one index"), shape))
}

/// `x` with its first `k` dims merged into one.
fn merged(x: &Tensor, k: usize) -> Result<Tensor> {
    let mut shape = vec![-1i64];
    shape.extend(x.shape()[k..].iter().map(|&d| d as i64));
    if x.numel() == 0 {
        shape[0] = x.shape()[..k].iter().product::<usize>() as i64;
    }
    x.reshape(&shape)
}

impl Tensor {
    /// `x[i0, i1, ...]` for index tensors over the leading dims (`torch.ops.aten.index`): the
    /// indices broadcast to a shape `B`, and the result is `B` followed by the dims not indexed.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..12).map(|v| v as f32).collect(), &[3, 4])?;
    /// let rows = Tensor::from_vec(vec![0i64, 2, -1], &[3])?;
    /// let cols = Tensor::from_vec(vec![1i64, 3, 0], &[3])?;
    /// assert_eq!(x.index(&[&rows, &cols])?.to_vec::<f32>()?, vec![1.0, 11.0, 8.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn index(&self, indices: &[&Tensor]) -> Result<Tensor> {
        let loc = Location::caller();
        let mut srcs = vec![self];
        srcs.extend_from_slice(indices);
        let _scope = CompositeScope::enter("index", &srcs, loc);
        let (flat, batch) = flat_positions(self, indices, "index", loc)?;
        let k = indices.len();
        let picked = merged(self, k)?.index_select(0, &flat)?;
        let shape: Vec<i64> = batch.iter().chain(&self.shape()[k..]).map(|&d| d as i64).collect();
        picked.reshape(&shape)
    }

    /// `torch.index_put(x, indices, values, accumulate)`: `values` (broadcast to the indexed
    /// shape: the indices' broadcast shape, then the dims not indexed) written at the positions
    /// the index tensors name over the leading dims; with `accumulate`, added there instead
    /// (repeated positions add up; without it, one of the writes wins, as in PyTorch).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[2, 3], coil_ir::DType::F32);
    /// let (rows, cols) = (Tensor::from_vec(vec![0i64, 1, 1], &[3])?, Tensor::from_vec(vec![2i64, 0, 0], &[3])?);
    /// let v = Tensor::from_vec(vec![5.0f32, 1.0, 2.0], &[3])?;
    /// assert_eq!(x.index_put(&[&rows, &cols], &v, true)?.to_vec::<f32>()?, vec![0.0, 0.0, 5.0, 3.0, 0.0, 0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn index_put(&self, indices: &[&Tensor], values: &Tensor, accumulate: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let mut srcs = vec![self];
        srcs.extend_from_slice(indices);
        srcs.push(values);
        let _scope = CompositeScope::enter("index_put", &srcs, loc);
        let (flat, batch) = flat_positions(self, indices, "index_put", loc)?;
        let k = indices.len();
        let n = flat.numel();
        let rest: Vec<usize> = self.shape()[k..].to_vec();
        let target: Vec<usize> = batch.iter().chain(&rest).copied().collect();
        let values =
            values.to_dtype(self.dtype())?.broadcast_to(&target).map_err(|e| e.in_op("index_put", vec![]).at(loc))?;
        let rows: Vec<i64> = std::iter::once(n as i64).chain(rest.iter().map(|&d| d as i64)).collect();
        let values = values.reshape(&rows)?;
        let x = merged(self, k)?;
        let out = if accumulate { x.index_add(0, &flat, &values, 1.0)? } else { x.index_copy(0, &flat, &values)? };
        out.reshape(&self.shape().iter().map(|&d| d as i64).collect::<Vec<_>>())
    }
}
