//! Views: `reshape`, `view`, `flatten`, `unflatten`, `permute`, `transpose`, `t`, `expand`,
//! `broadcast_to`, `squeeze`, `unsqueeze`, `narrow`, `slice`, `select`. Data movement is in
//! [`super::movement`], the range constructors in [`super::creation`].
//!
//! Views record `Reshape` / `Permute` / `Expand` / `Slice` nodes. PyTorch's argument conventions
//! (negative dims and indices, a `-1` size, Python slice bounds that clamp) are resolved here, so
//! every recorded node carries plain non-negative attributes; shape checks that inference already
//! does are left to it.
use crate::tensor::{wrap_dim, Tensor};
use coil_ir::{Error, Op, Result};
use std::panic::Location;

pub(crate) type Loc = &'static Location<'static>;

/// Resolves a size list with at most one `-1` against `numel` elements, as `torch.reshape` does.
fn infer_sizes(sizes: &[i64], numel: usize) -> Result<Vec<usize>> {
    let mut infer = None;
    let mut known: usize = 1;
    for (i, &s) in sizes.iter().enumerate() {
        if s == -1 {
            if infer.is_some() {
                return Err(Error::shape(format!("only one dimension can be inferred, got shape {sizes:?}")));
            }
            infer = Some(i);
        } else if s < 0 {
            return Err(Error::shape(format!("invalid shape dimension {s} in {sizes:?}")));
        } else {
            known = known.saturating_mul(s as usize);
        }
    }
    let mut out: Vec<usize> = sizes.iter().map(|&s| s.max(0) as usize).collect();
    match infer {
        None if known == numel => Ok(out),
        Some(_) if known == 0 && numel == 0 => Err(Error::shape(format!(
            "cannot reshape a tensor of 0 elements into shape {sizes:?}: the unspecified size -1 can be any value and is ambiguous"
        ))),
        Some(i) if numel.checked_rem(known) == Some(0) => {
            out[i] = numel / known;
            Ok(out)
        }
        _ => Err(Error::shape(format!("shape {sizes:?} is invalid for input of size {numel}"))),
    }
}

/// Renames the op of an error raised while recording (for methods that record a node of
/// another name, e.g. `view` records `reshape`); inside a composite op the error stays that
/// op's.
pub(crate) fn renamed(r: Result<Tensor>, op: &str) -> Result<Tensor> {
    r.map_err(|mut e| {
        e.op = Some(op.to_string());
        crate::ops::composite::attribute(e)
    })
}

impl Tensor {
    /// Records a reshape to `shape` (the element count is checked by inference).
    pub(crate) fn reshape_to(&self, shape: Vec<usize>, loc: Loc) -> Result<Tensor> {
        Tensor::record(Op::Reshape { shape }, &[self], loc)
    }

    /// Records a slice with resolved, in-bounds attributes.
    pub(crate) fn slice_to(&self, dim: usize, start: usize, len: usize, step: i64, loc: Loc) -> Result<Tensor> {
        Tensor::record(Op::Slice { dim, start, len, step }, &[self], loc)
    }

    /// An error of kind `e` in `op` on this tensor, at `loc`.
    pub(crate) fn fail<T>(&self, op: &str, e: Error, loc: Loc) -> Result<T> {
        Err(Tensor::error(op, &[self], e, loc))
    }

    /// Wraps `dim`, refusing 0-d tensors (for ops that index a dim's size).
    pub(crate) fn dim_of_sized(&self, dim: i64, op: &str, loc: Loc) -> Result<usize> {
        if self.rank() == 0 {
            return self.fail(op, Error::shape(format!("{op} cannot be applied to a 0-dim tensor")), loc);
        }
        self.dim(dim, op, loc)
    }

    fn reshape_named(&self, shape: &[i64], op: &str, loc: Loc) -> Result<Tensor> {
        let shape = infer_sizes(shape, self.numel()).map_err(|e| Tensor::error(op, &[self], e, loc))?;
        renamed(self.reshape_to(shape, loc), op)
    }

    /// `torch.reshape`: the same elements in a new shape; one size may be `-1`, inferred from the
    /// others.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3])?;
    /// let y = x.reshape(&[3, -1])?;
    /// assert_eq!(y.shape(), &[3, 2]);
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    /// assert!(x.reshape(&[4, -1]).is_err());
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        self.reshape_named(shape, "reshape", Location::caller())
    }

    /// `Tensor.view`: [`Tensor::reshape`] that must be a view, as in PyTorch: an error for a view
    /// whose strides do not allow the new shape (`x.t().view(-1)`; use `reshape`, which copies).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3])?;
    /// assert!(x.view(&[3, 2])?.is_view());
    /// assert!(x.t()?.view(&[6]).is_err());
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn view(&self, shape: &[i64]) -> Result<Tensor> {
        let loc = Location::caller();
        let this = self.current();
        let sizes = infer_sizes(shape, self.numel()).map_err(|e| Tensor::error("view", &[self], e, loc))?;
        if !crate::alias::reshape_is_view(&this, &sizes) {
            let e = Error::shape(
                "view size is not compatible with input tensor's size and stride (at least one dimension spans \
                 across two contiguous subspaces). Use .reshape(...) instead.",
            );
            return self.fail("view", e, loc);
        }
        this.reshape_named(shape, "view", loc)
    }

    /// `torch.flatten(x, start_dim, end_dim)`: merges dims `start..=end` into one (a 0-d tensor
    /// becomes 1-d).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::zeros(&[2, 3, 4, 5], DType::F32);
    /// assert_eq!(x.flatten(1, -2)?.shape(), &[2, 12, 5]);
    /// assert_eq!(x.flatten(0, -1)?.shape(), &[120]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn flatten(&self, start_dim: i64, end_dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        if self.rank() == 0 {
            return renamed(self.reshape_to(vec![1], loc), "flatten");
        }
        let (s, e) = (self.dim(start_dim, "flatten", loc)?, self.dim(end_dim, "flatten", loc)?);
        if s > e {
            return self.fail(
                "flatten",
                Error::shape(format!("start_dim {start_dim} cannot come after end_dim {end_dim}")),
                loc,
            );
        }
        if s == e {
            return Ok(self.clone());
        }
        let shape = self.shape();
        let mut out = shape[..s].to_vec();
        out.push(shape[s..=e].iter().product());
        out.extend_from_slice(&shape[e + 1..]);
        renamed(self.reshape_to(out, loc), "flatten")
    }

    /// `Tensor.unflatten(dim, sizes)`: splits one dim into `sizes` (one of them may be `-1`).
    #[track_caller]
    pub fn unflatten(&self, dim: i64, sizes: &[i64]) -> Result<Tensor> {
        let loc = Location::caller();
        let d = self.dim_of_sized(dim, "unflatten", loc)?;
        if sizes.is_empty() {
            return self.fail("unflatten", Error::shape("sizes must be non-empty"), loc);
        }
        let size = self.shape()[d];
        let sizes = infer_sizes(sizes, size).map_err(|_| {
            Tensor::error(
                "unflatten",
                &[self],
                Error::shape(format!("sizes {sizes:?} do not multiply up to the size of dim {d} ({size})")),
                loc,
            )
        })?;
        let mut out = self.shape()[..d].to_vec();
        out.extend(sizes);
        out.extend_from_slice(&self.shape()[d + 1..]);
        renamed(self.reshape_to(out, loc), "unflatten")
    }

    /// `torch.permute`: reorders the dims; `dims[i]` is the input dim that becomes dim `i`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::zeros(&[2, 3, 4], DType::F32);
    /// assert_eq!(x.permute(&[2, 0, 1])?.shape(), &[4, 2, 3]);
    /// assert_eq!(x.permute(&[-1, 1, 0])?.shape(), &[4, 3, 2]);
    /// assert!(x.permute(&[0, 0, 1]).is_err());
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn permute(&self, dims: &[i64]) -> Result<Tensor> {
        let loc = Location::caller();
        let perm = if self.rank() == 0 && dims.is_empty() {
            vec![]
        } else {
            dims.iter()
                .map(|&d| wrap_dim(d, self.rank()))
                .collect::<Result<Vec<_>>>()
                .map_err(|e| Tensor::error("permute", &[self], e, loc))?
        };
        Tensor::record(Op::Permute { perm }, &[self], loc)
    }

    /// `torch.transpose(x, dim0, dim1)`: swaps two dims.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], &[2, 3])?;
    /// let y = x.transpose(0, -1)?;
    /// assert_eq!(y.shape(), &[3, 2]);
    /// assert_eq!(y.to_vec::<i64>()?, vec![1, 4, 2, 5, 3, 6]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn transpose(&self, dim0: i64, dim1: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let (a, b) = (self.dim(dim0, "transpose", loc)?, self.dim(dim1, "transpose", loc)?);
        if self.rank() == 0 {
            return Ok(self.clone());
        }
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        renamed(Tensor::record(Op::Permute { perm }, &[self], loc), "transpose")
    }

    /// `Tensor.t()`: transposes a 2-D tensor; 0-d and 1-d tensors are returned as they are, and
    /// higher ranks are an error, as in PyTorch.
    #[track_caller]
    pub fn t(&self) -> Result<Tensor> {
        let loc = Location::caller();
        match self.rank() {
            0 | 1 => Ok(self.clone()),
            2 => renamed(Tensor::record(Op::Permute { perm: vec![1, 0] }, &[self], loc), "t"),
            r => self.fail("t", Error::shape(format!("t() expects a tensor with <= 2 dims, but self is {r}-D")), loc),
        }
    }

    /// `Tensor.expand(sizes)`: broadcasts size-1 dims to `sizes` without copying; `-1` keeps a
    /// dim's size, and new leading dims may be added.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2, 1])?;
    /// let y = x.expand(&[3, -1, 2])?;
    /// assert_eq!(y.shape(), &[3, 2, 2]);
    /// assert_eq!(y.to_vec::<f32>()?[..4], [1.0, 1.0, 2.0, 2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn expand(&self, sizes: &[i64]) -> Result<Tensor> {
        let loc = Location::caller();
        let rank = self.rank();
        if sizes.len() < rank {
            return self.fail(
                "expand",
                Error::shape(format!("the number of sizes provided ({}) must be greater or equal to the number of dims in the tensor ({rank})", sizes.len())),
                loc,
            );
        }
        let lead = sizes.len() - rank;
        let mut shape = Vec::with_capacity(sizes.len());
        for (i, &s) in sizes.iter().enumerate() {
            let size = match s {
                -1 if i < lead => {
                    return self.fail(
                        "expand",
                        Error::shape(format!("the expanded size -1 is not allowed in a leading, non-existing dim {i}")),
                        loc,
                    )
                }
                -1 => self.shape()[i - lead],
                s if s < 0 => {
                    return self.fail("expand", Error::shape(format!("invalid expanded size {s} at dim {i}")), loc)
                }
                s => s as usize,
            };
            shape.push(size);
        }
        Tensor::record(Op::Expand { shape }, &[self], loc)
    }

    /// `torch.broadcast_to(x, shape)`: [`Tensor::expand`] to an explicit shape.
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        renamed(Tensor::record(Op::Expand { shape: shape.to_vec() }, &[self], Location::caller()), "broadcast_to")
    }

    /// `Tensor.expand_as(other)`: expands to `other`'s shape.
    #[track_caller]
    pub fn expand_as(&self, other: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        Tensor::record(Op::Expand { shape: other.shape().to_vec() }, &[self], loc).map_err(|e| Error {
            op: Some("expand_as".into()),
            operands: vec![self.meta().to_string(), other.meta().to_string()],
            ..e
        })
    }

    /// `torch.squeeze(x)`: removes every dim of size 1.
    #[track_caller]
    pub fn squeeze(&self) -> Result<Tensor> {
        if !self.shape().contains(&1) {
            return Ok(self.clone());
        }
        let shape = self.shape().iter().copied().filter(|&s| s != 1).collect();
        renamed(self.reshape_to(shape, Location::caller()), "squeeze")
    }

    /// `torch.squeeze(x, dim)`: removes `dim` if its size is 1; otherwise returns the tensor
    /// unchanged, as PyTorch does.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::zeros(&[2, 1, 3], DType::F32);
    /// assert_eq!(x.squeeze_dim(1)?.shape(), &[2, 3]);
    /// assert_eq!(x.squeeze_dim(0)?.shape(), &[2, 1, 3]);
    /// assert_eq!(x.unsqueeze(-1)?.shape(), &[2, 1, 3, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn squeeze_dim(&self, dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let d = self.dim(dim, "squeeze", loc)?;
        if self.rank() == 0 || self.shape()[d] != 1 {
            return Ok(self.clone());
        }
        let mut shape = self.shape().to_vec();
        shape.remove(d);
        renamed(self.reshape_to(shape, loc), "squeeze")
    }

    /// `torch.unsqueeze(x, dim)`: inserts a dim of size 1 at `dim`, in `[-rank-1, rank]`.
    #[track_caller]
    pub fn unsqueeze(&self, dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let d = wrap_dim(dim, self.rank() + 1).map_err(|e| Tensor::error("unsqueeze", &[self], e, loc))?;
        let mut shape = self.shape().to_vec();
        shape.insert(d, 1);
        renamed(self.reshape_to(shape, loc), "unsqueeze")
    }

    /// `torch.narrow(x, dim, start, length)`: elements `start..start + length` of `dim`;
    /// a negative `start` counts from the end.
    #[track_caller]
    pub fn narrow(&self, dim: i64, start: i64, length: usize) -> Result<Tensor> {
        let loc = Location::caller();
        let d = self.dim_of_sized(dim, "narrow", loc)?;
        let size = self.shape()[d] as i64;
        if start < -size || start > size {
            return self.fail(
                "narrow",
                Error::value(format!(
                    "start {start} is out of range for dim {d} of size {size} (expected in [{}, {size}])",
                    -size
                )),
                loc,
            );
        }
        let start = if start < 0 { start + size } else { start };
        if start as i128 + length as i128 > size as i128 {
            return self.fail(
                "narrow",
                Error::value(format!("start ({start}) + length ({length}) exceeds dimension size ({size})")),
                loc,
            );
        }
        let start = if length == 0 { 0 } else { start as usize };
        renamed(self.slice_to(d, start, length, 1, loc), "narrow")
    }

    /// `x[start:end:step]` along `dim`, with Python's rules: `None` means the whole range,
    /// negative bounds count from the end, out-of-range bounds clamp; `step` must be positive
    /// (as in PyTorch; use [`Tensor::flip`] to reverse).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..10i64).collect(), &[10])?;
    /// assert_eq!(x.slice(0, Some(-4), None, 1)?.to_vec::<i64>()?, vec![6, 7, 8, 9]);
    /// assert_eq!(x.slice(0, Some(1), Some(100), 3)?.to_vec::<i64>()?, vec![1, 4, 7]);
    /// assert_eq!(x.slice(0, Some(5), Some(2), 1)?.shape(), &[0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn slice(&self, dim: i64, start: Option<i64>, end: Option<i64>, step: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let d = self.dim_of_sized(dim, "slice", loc)?;
        if step <= 0 {
            return self.fail("slice", Error::value(format!("slice step must be positive, got {step}")), loc);
        }
        let size = self.shape()[d] as i64;
        let clamp = |i: i64| (if i < 0 { i + size } else { i }).clamp(0, size);
        let start = clamp(start.unwrap_or(0));
        let end = clamp(end.unwrap_or(size)).max(start);
        let len = if end == start { 0 } else { (end - start - 1) / step + 1 };
        let start = if len == 0 { 0 } else { start as usize };
        self.slice_to(d, start, len as usize, step, loc)
    }

    /// `x.select(dim, index)` (`x[..., index, ...]`): the slice at `index` of `dim`, with that
    /// dim removed; a negative index counts from the end.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..6i64).collect(), &[2, 3])?;
    /// assert_eq!(x.select(1, -1)?.to_vec::<i64>()?, vec![2, 5]);
    /// assert_eq!(x.select(0, 1)?.shape(), &[3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn select(&self, dim: i64, index: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let d = self.dim_of_sized(dim, "select", loc)?;
        let size = self.shape()[d] as i64;
        if index < -size || index >= size {
            return self.fail(
                "select",
                Error::value(format!("index {index} is out of bounds for dim {d} with size {size}")),
                loc,
            );
        }
        let index = if index < 0 { index + size } else { index };
        let sliced = renamed(self.slice_to(d, index as usize, 1, 1, loc), "select")?;
        let mut shape = self.shape().to_vec();
        shape.remove(d);
        renamed(sliced.reshape_to(shape, loc), "select")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::movement::{cat, stack};
    use coil_ir::ErrorKind;
    use coil_ir::{DType, ReduceOp, Scalar};

    fn zeros(shape: &[usize]) -> Tensor {
        Tensor::zeros(shape, DType::F32)
    }

    /// The error names the op and points at this file.
    fn assert_err(r: Result<impl std::fmt::Debug>, op: &str) -> Error {
        let e = r.expect_err("expected an error");
        let text = e.to_string();
        assert_eq!(e.op.as_deref(), Some(op), "{text}");
        assert!(text.contains(file!()), "location missing: {text}");
        assert!(text.contains(&format!(" in {op} ")), "{text}");
        e
    }

    fn sizes(parts: &[Tensor], d: usize) -> Vec<usize> {
        parts.iter().map(|p| p.shape()[d]).collect()
    }

    #[test]
    fn reshape_infers_minus_one() {
        let x = zeros(&[2, 3, 4]);
        assert_eq!(x.reshape(&[-1, 4]).unwrap().shape(), &[6, 4]);
        assert_eq!(x.reshape(&[4, -1, 2]).unwrap().shape(), &[4, 3, 2]);
        assert_eq!(x.view(&[24]).unwrap().shape(), &[24]);
        assert_eq!(zeros(&[]).reshape(&[-1]).unwrap().shape(), &[1]);
        assert_eq!(zeros(&[0, 3]).reshape(&[3, -1]).unwrap().shape(), &[3, 0]);
        let r = x.reshape(&[6, 4]).unwrap();
        assert_eq!(r.0.op, Op::Reshape { shape: vec![6, 4] });
    }

    #[test]
    fn reshape_errors() {
        let x = zeros(&[2, 3]);
        let e = assert_err(x.reshape(&[4, -1]), "reshape");
        assert_eq!(e.kind, ErrorKind::Shape);
        assert!(e.to_string().contains("f32[2, 3]"), "{e}");
        assert_err(x.reshape(&[-1, -1]), "reshape");
        assert_err(x.reshape(&[-2, -3]), "reshape");
        assert_err(x.reshape(&[7]), "reshape");
        assert_err(x.view(&[5]), "view");
        assert_err(zeros(&[0, 3]).reshape(&[0, -1]), "reshape");
    }

    #[test]
    fn flatten_and_unflatten() {
        let x = zeros(&[2, 3, 4, 5]);
        assert_eq!(x.flatten(1, 2).unwrap().shape(), &[2, 12, 5]);
        assert_eq!(x.flatten(0, -1).unwrap().shape(), &[120]);
        assert_eq!(x.flatten(2, 2).unwrap().shape(), &[2, 3, 4, 5]);
        assert_eq!(zeros(&[]).flatten(0, -1).unwrap().shape(), &[1]);
        assert_err(x.flatten(2, 1), "flatten");
        assert_err(x.flatten(0, 4), "flatten");
        assert_eq!(x.unflatten(1, &[3, 1]).unwrap().shape(), &[2, 3, 1, 4, 5]);
        assert_eq!(x.unflatten(-1, &[-1, 5]).unwrap().shape(), &[2, 3, 4, 1, 5]);
        assert_err(x.unflatten(1, &[2, 2]), "unflatten");
        assert_err(x.unflatten(1, &[]), "unflatten");
        assert_err(zeros(&[]).unflatten(0, &[1]), "unflatten");
    }

    #[test]
    fn permute_transpose_t() {
        let x = zeros(&[2, 3, 4]);
        let p = x.permute(&[-1, 0, 1]).unwrap();
        assert_eq!(p.shape(), &[4, 2, 3]);
        assert_eq!(p.0.op, Op::Permute { perm: vec![2, 0, 1] });
        assert_err(x.permute(&[0, 1]), "permute");
        assert_err(x.permute(&[0, 1, 1]), "permute");
        assert_err(x.permute(&[0, 1, 3]), "permute");
        assert_eq!(x.transpose(0, -1).unwrap().shape(), &[4, 3, 2]);
        assert_err(x.transpose(0, 3), "transpose");
        assert_eq!(zeros(&[]).transpose(0, -1).unwrap().shape(), &[] as &[usize]);
        assert_eq!(zeros(&[2, 5]).t().unwrap().shape(), &[5, 2]);
        assert_eq!(zeros(&[5]).t().unwrap().shape(), &[5]);
        assert_err(x.t(), "t");
        assert_eq!(zeros(&[]).permute(&[]).unwrap().shape(), &[] as &[usize]);
    }

    #[test]
    fn expand_variants() {
        let x = zeros(&[3, 1]);
        assert_eq!(x.expand(&[2, -1, 4]).unwrap().shape(), &[2, 3, 4]);
        assert_eq!(x.expand(&[-1, 0]).unwrap().shape(), &[3, 0]);
        assert_err(x.expand(&[-1, 3, 4]), "expand");
        assert_err(x.expand(&[4]), "expand");
        assert_err(x.expand(&[2, 4]), "expand");
        assert_err(x.expand(&[3, -2]), "expand");
        assert_eq!(x.broadcast_to(&[5, 3, 2]).unwrap().shape(), &[5, 3, 2]);
        assert_err(x.broadcast_to(&[4, 2]), "broadcast_to");
        assert_eq!(x.expand_as(&zeros(&[3, 7])).unwrap().shape(), &[3, 7]);
        let e = assert_err(x.expand_as(&zeros(&[2, 7])), "expand_as");
        assert!(e.to_string().contains("f32[2, 7]"), "{e}");
    }

    #[test]
    fn squeeze_unsqueeze() {
        let x = zeros(&[1, 2, 1, 3]);
        assert_eq!(x.squeeze().unwrap().shape(), &[2, 3]);
        assert_eq!(x.squeeze_dim(-2).unwrap().shape(), &[1, 2, 3]);
        assert_eq!(x.squeeze_dim(1).unwrap().shape(), &[1, 2, 1, 3]);
        assert_err(x.squeeze_dim(4), "squeeze");
        assert_eq!(zeros(&[]).squeeze_dim(0).unwrap().shape(), &[] as &[usize]);
        assert_eq!(x.unsqueeze(4).unwrap().shape(), &[1, 2, 1, 3, 1]);
        assert_eq!(x.unsqueeze(-5).unwrap().shape(), &[1, 1, 2, 1, 3]);
        assert_eq!(x.unsqueeze(-1).unwrap().shape(), &[1, 2, 1, 3, 1]);
        assert_err(x.unsqueeze(5), "unsqueeze");
        assert_err(x.unsqueeze(-6), "unsqueeze");
        assert_eq!(zeros(&[]).unsqueeze(0).unwrap().shape(), &[1]);
        assert_eq!(zeros(&[]).unsqueeze(-1).unwrap().shape(), &[1]);
    }

    #[test]
    fn slice_clamps_like_python() {
        let x = zeros(&[10, 3]);
        let s = x.slice(0, Some(-4), None, 1).unwrap();
        assert_eq!(s.0.op, Op::Slice { dim: 0, start: 6, len: 4, step: 1 });
        let s = x.slice(0, Some(1), Some(100), 3).unwrap();
        assert_eq!(s.0.op, Op::Slice { dim: 0, start: 1, len: 3, step: 3 });
        assert_eq!(x.slice(0, Some(-100), Some(2), 1).unwrap().shape(), &[2, 3]);
        assert_eq!(x.slice(0, Some(5), Some(2), 1).unwrap().shape(), &[0, 3]);
        assert_eq!(x.slice(0, Some(20), None, 1).unwrap().shape(), &[0, 3]);
        assert_eq!(x.slice(-1, None, Some(-1), 2).unwrap().shape(), &[10, 1]);
        assert_eq!(x.slice(0, None, None, 4).unwrap().shape(), &[3, 3]);
        assert_err(x.slice(0, None, None, 0), "slice");
        assert_err(x.slice(0, None, None, -1), "slice");
        assert_err(x.slice(2, None, None, 1), "slice");
        assert_err(zeros(&[]).slice(0, None, None, 1), "slice");
    }

    #[test]
    fn narrow_and_select() {
        let x = zeros(&[4, 5]);
        let n = x.narrow(1, -3, 2).unwrap();
        assert_eq!(n.0.op, Op::Slice { dim: 1, start: 2, len: 2, step: 1 });
        assert_eq!(x.narrow(0, 4, 0).unwrap().shape(), &[0, 5]);
        assert_err(x.narrow(1, 4, 2), "narrow");
        assert_err(x.narrow(1, -6, 1), "narrow");
        let s = x.select(1, -1).unwrap();
        assert_eq!(s.shape(), &[4]);
        assert_eq!(s.0.srcs(&crate::history::read())[0].0.op, Op::Slice { dim: 1, start: 4, len: 1, step: 1 });
        assert_eq!(x.select(0, 3).unwrap().shape(), &[5]);
        let e = assert_err(x.select(0, 4), "select");
        assert_eq!(e.kind, ErrorKind::Value);
        assert_err(x.select(0, -5), "select");
        assert_err(zeros(&[]).select(0, 0), "select");
    }

    #[test]
    fn indexing_ops() {
        let x = zeros(&[4, 5]);
        let idx = Tensor::zeros(&[3], DType::I64);
        assert_eq!(x.index_select(-1, &idx).unwrap().shape(), &[4, 3]);
        assert_err(x.index_select(0, &zeros(&[3])), "index_select");
        let idx2 = Tensor::zeros(&[2, 5], DType::I64);
        assert_eq!(x.gather(0, &idx2).unwrap().shape(), &[2, 5]);
        assert_err(x.gather(2, &idx2), "gather");
        let src = zeros(&[2, 5]);
        assert_eq!(x.scatter(0, &idx2, &src).unwrap().shape(), &[4, 5]);
        let sa = x.scatter_add(-2, &idx2, &src).unwrap();
        assert_eq!(sa.0.op, Op::Scatter { dim: 0, reduce: Some(ReduceOp::Sum) });
        assert_err(x.scatter(0, &idx2, &Tensor::zeros(&[2, 5], DType::F64)), "scatter");
    }

    #[test]
    fn cat_and_stack() {
        let a = zeros(&[2, 3]);
        let b = Tensor::zeros(&[4, 3], DType::F16);
        let c = cat(&[&a, &b], -2).unwrap();
        assert_eq!(c.shape(), &[6, 3]);
        assert_eq!(c.dtype(), DType::F32);
        assert_err(cat(&[&a, &b], 1), "cat");
        assert_err(cat(&[], 0), "cat");
        assert_err(cat(&[&zeros(&[])], 0), "cat");
        assert_err(cat(&[&a], 2), "cat");
        let s = stack(&[&a, &a, &a], -1).unwrap();
        assert_eq!(s.shape(), &[2, 3, 3]);
        assert_eq!(stack(&[&a, &a], 0).unwrap().shape(), &[2, 2, 3]);
        assert_err(stack(&[&a, &zeros(&[2, 4])], 0), "stack");
        assert_err(stack(&[&a], 3), "stack");
        assert_err(stack(&[], 0), "stack");
    }

    #[test]
    fn split_and_chunk_sizes() {
        let x = zeros(&[7, 2]);
        assert_eq!(sizes(&x.split(3, 0).unwrap(), 0), vec![3, 3, 1]);
        assert_eq!(sizes(&x.split(10, 0).unwrap(), 0), vec![7]);
        assert_eq!(sizes(&x.split(1, -1).unwrap(), 1), vec![1, 1]);
        let parts = x.split(3, 0).unwrap();
        assert_eq!(parts[2].0.op, Op::Slice { dim: 0, start: 6, len: 1, step: 1 });
        assert_err(x.split(0, 0), "split");
        assert_eq!(sizes(&zeros(&[0]).split(0, 0).unwrap(), 0), vec![0]);
        assert_eq!(sizes(&x.split_sizes(&[2, 0, 5], 0).unwrap(), 0), vec![2, 0, 5]);
        assert_err(x.split_sizes(&[2, 4], 0), "split_with_sizes");
        assert_eq!(sizes(&zeros(&[6]).chunk(4, 0).unwrap(), 0), vec![2, 2, 2]);
        assert_eq!(sizes(&zeros(&[5]).chunk(3, 0).unwrap(), 0), vec![2, 2, 1]);
        assert_eq!(sizes(&zeros(&[10]).chunk(4, 0).unwrap(), 0), vec![3, 3, 3, 1]);
        assert_eq!(sizes(&zeros(&[2]).chunk(5, 0).unwrap(), 0), vec![1, 1]);
        assert_eq!(sizes(&zeros(&[0]).chunk(3, 0).unwrap(), 0), vec![0, 0, 0]);
        assert_err(x.chunk(0, 0), "chunk");
        assert_err(zeros(&[]).chunk(1, 0), "chunk");
    }

    #[test]
    fn repeat_shapes() {
        let x = zeros(&[2, 3]);
        assert_eq!(x.repeat(&[2, 2]).unwrap().shape(), &[4, 6]);
        let r = x.repeat(&[4, 1, 3]).unwrap();
        assert_eq!(r.shape(), &[4, 2, 9]);
        let held = crate::history::read();
        let expand = &r.0.srcs(&held)[0];
        assert_eq!(expand.0.op, Op::Expand { shape: vec![4, 1, 1, 2, 3, 3] });
        assert_eq!(zeros(&[]).repeat(&[3]).unwrap().shape(), &[3]);
        assert_eq!(x.repeat(&[0, 1]).unwrap().shape(), &[0, 3]);
        assert_err(x.repeat(&[2]), "repeat");
    }

    #[test]
    fn flip_records_negative_steps() {
        let x = zeros(&[2, 3, 1]);
        let f = x.flip(&[0, -2]).unwrap();
        assert_eq!(f.shape(), &[2, 3, 1]);
        assert_eq!(f.0.op, Op::Slice { dim: 1, start: 2, len: 3, step: -1 });
        assert_eq!(f.0.srcs(&crate::history::read())[0].0.op, Op::Slice { dim: 0, start: 1, len: 2, step: -1 });
        assert_err(x.flip(&[0, 0]), "flip");
        assert_err(x.flip(&[3]), "flip");
    }

    #[test]
    fn pad_orders_and_crops() {
        let x = zeros(&[2, 3, 4]);
        let p = x.pad(&[1, 2], 0.0).unwrap();
        assert_eq!(p.shape(), &[2, 3, 7]);
        assert_eq!(p.0.op, Op::Pad { pads: vec![(0, 0), (0, 0), (1, 2)], value: Scalar::Float(0.0) });
        assert_eq!(x.pad(&[0, 0, 1, 1, 2, 0], 1).unwrap().shape(), &[4, 5, 4]);
        // negative pads crop via a slice
        let c = x.pad(&[-1, 2, 0, -3], 0).unwrap();
        assert_eq!(c.shape(), &[2, 0, 5]);
        let c = x.pad(&[-1, -2], 0).unwrap();
        assert_eq!(c.shape(), &[2, 3, 1]);
        assert_eq!(c.0.op, Op::Slice { dim: 2, start: 1, len: 1, step: 1 });
        assert_err(x.pad(&[1], 0), "pad");
        assert_err(x.pad(&[1, 1, 1, 1, 1, 1, 1, 1], 0), "pad");
        assert_err(x.pad(&[-3, -2], 0), "pad");
        assert_err(x.pad(&[-5, 4], 0), "pad");
    }

    #[test]
    fn tril_triu_contiguous() {
        assert_eq!(zeros(&[2, 3, 3]).tril(-1).unwrap().0.op, Op::Tril { k: -1 });
        assert_eq!(zeros(&[3, 3]).triu(2).unwrap().shape(), &[3, 3]);
        assert_err(zeros(&[3]).tril(0), "tril");
        assert_eq!(zeros(&[3]).contiguous().shape(), &[3]);
    }

    #[test]
    fn arange_lengths_and_errors() {
        assert_eq!(Tensor::arange(0, 10, 3, DType::I64).unwrap().shape(), &[4]);
        assert_eq!(Tensor::arange(0, 10, 1, DType::I32).unwrap().dtype(), DType::I32);
        assert_eq!(Tensor::arange(10, 0, -3, DType::I64).unwrap().shape(), &[4]);
        assert_eq!(Tensor::arange(0.0, 1.0, 0.1, DType::F32).unwrap().shape(), &[10]);
        assert_eq!(Tensor::arange(0.0, 1.0, 0.3, DType::F64).unwrap().shape(), &[4]);
        assert_eq!(Tensor::arange(5, 5, 1, DType::F32).unwrap().shape(), &[0]);
        let x = Tensor::arange(0, 4, 1, DType::I64).unwrap();
        assert_eq!(x.0.op, Op::Iota { dim: 0 });
        assert_eq!(Tensor::arange(0, 4, 1, DType::BF16).unwrap().dtype(), DType::BF16);
        assert_err(Tensor::arange(0, 10, 0, DType::I64), "arange");
        assert_err(Tensor::arange(0.0, 1.0, -0.5, DType::F32), "arange");
        assert_err(Tensor::arange(0.0, f64::INFINITY, 1.0, DType::F32), "arange");
        assert_err(Tensor::arange(0, 3, 1, DType::Bool), "arange");
    }

    #[test]
    fn linspace_and_eye() {
        assert_eq!(Tensor::linspace(0.0, 1.0, 5, DType::F32).unwrap().shape(), &[5]);
        assert_eq!(Tensor::linspace(0, 10, 4, DType::I64).unwrap().dtype(), DType::I64);
        assert_eq!(Tensor::linspace(3.0, 1.0, 1, DType::F16).unwrap().0.op, Op::Full(Scalar::Float(3.0)));
        assert_eq!(Tensor::linspace(3.0, 1.0, 0, DType::F32).unwrap().shape(), &[0]);
        assert_err(Tensor::linspace(0, 1, 3, DType::Bool), "linspace");
        let e = Tensor::eye(3, None, DType::F32).unwrap();
        assert_eq!((e.shape(), e.dtype()), (&[3usize, 3][..], DType::F32));
        assert_eq!(Tensor::eye(2, Some(4), DType::Bool).unwrap().shape(), &[2, 4]);
    }
}
