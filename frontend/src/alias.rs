//! Aliasing: which tensors are views of which, and which value a tensor handle stands for after
//! in-place ops (PyTorch's semantics, functionalized as `torch.compile` does).
//!
//! **Views.** An op that PyTorch answers with a view records a node marked as a *view* of its
//! first operand, its *base*: `slice` (and `narrow`, `split`, `chunk`), `permute` (`t`,
//! `transpose`, `movedim`), `expand` (`broadcast_to`), `reshape` where PyTorch's reshape is a
//! view (the operand's strides allow it, `reshape_is_view`; otherwise it is a copy, and
//! [`Tensor::view`] is an error), and `detach`. Ops built from those are chains of views: `select`
//! (a slice, then a reshape), `unsqueeze`, `squeeze`, `flatten`, `unbind`, `diagonal`. Which ops
//! make views is decided here once (`makes_view`), for the primitive op a node records, with
//! each one's inverse (`scatter`): how a new value of the view is written back into its base
//! (`slice_scatter` for a slice, the inverse permutation, the reshape back; a broadcasting
//! expand cannot be written, as in PyTorch). `clone`-like ops (every other op) are values, and
//! [`Tensor::contiguous`] of a non-contiguous view is a copy, as in PyTorch.
//!
//! **In-place ops** ([`write`]: `x.add_(..)`, `copy_`, slice assignment, ...) write the new value
//! over the *base* of `x` (through the inverse of each view between them), and `x` is rebound
//! to the same views of the base's new value. Every handle then stands for the current value:
//! `Tensor::current` regenerates a view whose base changed since it was made (PyTorch's
//! `FunctionalTensorWrapper` regenerating a view from its updated base), and finds the new value
//! of a base written since (another handle to it, a `detach`ed alias). Ops and reads resolve
//! their operands this way as they are recorded, so one choke point serves every op. A
//! pending computation recorded *before* a write keeps reading the old value (PyTorch computed it
//! then): inside a compiled function that is the value in the graph; outside one, the old
//! elements were written over, and reading them is an error ([`crate::Storage::check_current`]).
//!
//! Where the new value lives: outside a compiled function the base is computed (first, if it
//! was pending) and written over in place ([`crate::update_in_place`]); its elements' version
//! counter ([`crate::Storage`]) is what tells old handles to look again. Inside one, a computed
//! base (an argument, a captured tensor) is updated as [`crate::update_in_place`] does there (the
//! call's graph writes the new value over its buffer, as torch.compile writes mutated inputs
//! back), and a pending base is rebound for the rest of the call (`clear_rebound`).
//!
//! A global *epoch* counts in-place writes: a node made since the last one is current without
//! looking, so resolving costs nothing in code that does not mutate.

use crate::storage::Storage;
use crate::tensor::Tensor;
use crate::walk::AddrMap;
use coil_ir::{Error, Op, Result};
use std::cell::RefCell;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// In-place writes so far (element versions bumped, bases rebound).
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// The number of in-place writes so far: a node made at the current epoch is current.
pub(crate) fn epoch() -> u64 {
    EPOCH.load(Ordering::Acquire)
}

thread_local! {
    /// In-place writes counted by this thread ([`bump`]).
    static OWN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts an in-place write.
pub(crate) fn bump() {
    EPOCH.fetch_add(1, Ordering::AcqRel);
    OWN.with(|n| n.set(n.get() + 1));
}

/// The epoch and this thread's writes so far: between two readings, every write was this
/// thread's when both grew by as much.
pub(crate) fn epoch_and_own() -> (u64, u64) {
    (epoch(), OWN.with(|n| n.get()))
}

thread_local! {
    /// Inside a compiled function: each base rebound by an in-place op (by node address, kept
    /// alive so the address stays its own) and its new value.
    static REBOUND: RefCell<AddrMap<(Tensor, Tensor)>> = RefCell::new(AddrMap::default());
}

fn key(t: &Tensor) -> usize {
    Arc::as_ptr(&t.0) as usize
}

/// Forgets the bases rebound inside a compiled function: called when the outermost one returns
/// (its results resolved first), so nothing of the call stays alive.
pub(crate) fn clear_rebound() {
    let old = REBOUND.with(|r| std::mem::take(&mut *r.borrow_mut()));
    drop(old);
}

/// Whether `op`, recorded on `src` (its first operand), makes a view of `src`.
pub(crate) fn makes_view(op: &Op, src: Option<&Tensor>) -> bool {
    match op {
        Op::Slice { .. } | Op::Permute { .. } | Op::Expand { .. } | Op::Detach => src.is_some(),
        // Inside a composite op (`diagonal`'s flattening of permuted dims) the reshape is a
        // step of a view PyTorch makes directly: its inverse is exact whatever the strides.
        Op::Reshape { shape } => {
            src.is_some_and(|s| crate::ops::composite::location().is_some() || reshape_is_view(s, shape))
        }
        _ => false,
    }
}

/// Whether PyTorch's `reshape` of `t` to `shape` is a view: always for a tensor that is not a
/// view (contiguous); for a view, when its strides allow it (PyTorch's `computeStride`).
pub(crate) fn reshape_is_view(t: &Tensor, shape: &[usize]) -> bool {
    !t.0.view || view_strides(t.shape(), &strides(t), shape).is_some()
}

/// Whether `t` is laid out contiguously (PyTorch's `is_contiguous`): every tensor but a view
/// whose strides say otherwise.
pub(crate) fn is_contiguous(t: &Tensor) -> bool {
    if !t.0.view {
        return true;
    }
    let strides = strides(t);
    let mut expected = 1;
    for (&size, &stride) in t.shape().iter().zip(&strides).rev() {
        if size == 0 {
            return true;
        }
        if size != 1 {
            if stride != expected {
                return false;
            }
            expected = expected.saturating_mul(size);
        }
    }
    true
}

fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1].saturating_mul(shape[d + 1].max(1));
    }
    strides
}

/// The strides of `t` in the elements of its root base (the first node below it that is not a
/// view, laid out contiguously).
fn strides(t: &Tensor) -> Vec<usize> {
    let mut chain = vec![];
    let mut at = t;
    while at.0.view {
        chain.push(at);
        at = &at.0.view_srcs()[0];
    }
    let mut st = contiguous_strides(at.shape());
    for v in chain.into_iter().rev() {
        let base = v.0.view_srcs()[0].shape();
        st = match &v.0.op {
            Op::Slice { dim, step, .. } => {
                st[*dim] = st[*dim].saturating_mul(*step as usize);
                st
            }
            Op::Permute { perm } => perm.iter().map(|&p| st[p]).collect(),
            Op::Expand { shape } => {
                let lead = shape.len() - base.len();
                let zero = |i: usize| i < lead || (base[i - lead] == 1 && shape[i] != 1);
                (0..shape.len()).map(|i| if zero(i) { 0 } else { st[i - lead] }).collect()
            }
            Op::Reshape { shape } => view_strides(base, &st, shape).unwrap_or_else(|| contiguous_strides(shape)),
            _ => st,
        };
    }
    st
}

/// PyTorch's `computeStride`: the strides of a view of shape `new` of a tensor of shape `old`
/// and strides `stride`, or `None` when no view has that shape (a dim would span two
/// non-contiguous runs of elements).
fn view_strides(old: &[usize], stride: &[usize], new: &[usize]) -> Option<Vec<usize>> {
    if old.is_empty() {
        return Some(vec![1; new.len()]);
    }
    if old.contains(&0) {
        return Some(if old == new { stride.to_vec() } else { contiguous_strides(new) });
    }
    let mut out = vec![0; new.len()];
    let mut view_d = new.len() as isize - 1;
    let mut chunk_base = *stride.last().expect("rank > 0");
    let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
    for d in (0..old.len()).rev() {
        tensor_numel = tensor_numel.saturating_mul(old[d]);
        if d == 0 || (old[d - 1] != 1 && stride[d - 1] != tensor_numel.saturating_mul(chunk_base)) {
            while view_d >= 0 && (view_numel < tensor_numel || new[view_d as usize] == 1) {
                out[view_d as usize] = view_numel.saturating_mul(chunk_base);
                view_numel = view_numel.saturating_mul(new[view_d as usize]);
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if d > 0 {
                chunk_base = stride[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(out)
}

impl Tensor {
    /// The tensor this handle stands for now (see the [module docs](self)): itself, unless an
    /// in-place op wrote the tensor, or the base of a view it is, since it was made. Ops and
    /// reads resolve their operands with this.
    pub(crate) fn current(&self) -> Tensor {
        if self.0.epoch == epoch() {
            return self.clone();
        }
        resolve(self).unwrap_or_else(|| self.clone())
    }

    /// Whether this tensor is a view of another (`Tensor._is_view()`): made by an op PyTorch
    /// answers with a view (`narrow`, `select`, `permute`, `t`, `expand`, a `reshape` that
    /// can be a view, `detach` of a pending tensor, ...). An in-place op on a view writes
    /// through to its base, and a view sees in-place writes to its base.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let mut x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let row = x.select(0, 1)?;
    /// assert!(row.is_view() && !x.is_view());
    /// assert!(!x.t()?.reshape(&[4])?.is_view()); // PyTorch copies here
    /// x.mul_(10.0)?;
    /// assert_eq!(row.to_vec::<f32>()?, vec![30.0, 40.0]); // the view sees the write
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn is_view(&self) -> bool {
        self.0.view
    }
}

/// The tensor `t` stands for, when it is not `t` itself.
fn resolve(t: &Tensor) -> Option<Tensor> {
    let now = epoch();
    let mut chain = vec![];
    let mut at = t;
    while at.0.epoch != now && at.0.view {
        chain.push(at);
        at = &at.0.view_srcs()[0];
    }
    let mut new = if at.0.epoch != now { written(at) } else { None };
    for v in chain.into_iter().rev() {
        new = match new {
            Some(base) => Some(replay(v, &base).unwrap_or_else(|_| v.clone())),
            None => written(v),
        };
    }
    new
}

/// The new value of a tensor written in place since `t` was made (a rebound base, or elements
/// written over), if it was.
fn written(t: &Tensor) -> Option<Tensor> {
    let rebound = REBOUND.with(|r| {
        let map = r.borrow();
        let mut found: Option<Tensor> = None;
        while let Some((_, new)) = map.get(&key(found.as_ref().unwrap_or(t))) {
            found = Some(new.clone());
        }
        found
    });
    if let Some(new) = rebound {
        // The new value may be a view (or read a base) written since, in turn.
        return Some(resolve(&new).unwrap_or(new));
    }
    let storage = t.0.storage.get()?;
    if storage.is_latest() {
        return None;
    }
    let latest: Storage = storage.latest()?;
    let fresh = Tensor::from_storage(latest);
    fresh.0.dynamic.store(t.0.dynamic.load(Ordering::Relaxed), Ordering::Relaxed);
    Some(fresh)
}

/// View `v`'s op again, on `base` (a new value of its base).
fn replay(v: &Tensor, base: &Tensor) -> Result<Tensor> {
    let location = v.0.location.unwrap_or(Location::caller());
    Tensor::record(v.0.op.clone(), &[base], location)
}

/// `t` as a value that is no view of anything: the same node when it is none, else a copy of
/// the view's node without the mark (a base's new value must not alias the tensors it was
/// computed from).
pub(crate) fn value_of(t: Tensor) -> Tensor {
    if !t.0.view {
        return t;
    }
    let location = t.0.location.unwrap_or(Location::caller());
    Tensor::recorded(t.0.op.clone(), t.0.view_srcs().to_vec(), t.meta().clone(), t.device(), location)
}

/// The base of view `v` with `value` written over the view's elements (the inverse of its op).
fn scatter(v: &Tensor, value: &Tensor, location: &'static Location<'static>) -> Result<Tensor> {
    let base = &v.0.view_srcs()[0];
    let shape: Vec<i64> = base.shape().iter().map(|&s| s as i64).collect();
    match &v.0.op {
        Op::Slice { dim, start, len, step } => {
            if *len == 0 {
                return Ok(base.clone());
            }
            let end = *start as i64 + (*len as i64 - 1) * step + 1;
            base.slice_scatter(value, *dim as i64, Some(*start as i64), Some(end), *step)
        }
        Op::Permute { perm } => {
            let mut inverse = vec![0i64; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i as i64;
            }
            value.permute(&inverse)
        }
        Op::Reshape { .. } => value.reshape(&shape),
        Op::Expand { .. } if base.numel() == v.numel() => value.reshape(&shape),
        Op::Expand { .. } => Err(Tensor::error(
            "expand",
            &[base, value],
            Error::value(
                "unsupported operation: more than one element of the written-to tensor refers to a single memory \
                 location. Please clone() the tensor before performing the operation.",
            ),
            location,
        )),
        _ => Ok(value.clone()),
    }
}

/// Writes `value` (of `target`'s shape and dtype) over the tensor `target` stands for, as an
/// in-place op does (see the [module docs](self)); returns the handle to rebind `target` to.
pub(crate) fn write(target: &Tensor, value: Tensor, location: &'static Location<'static>) -> Result<Tensor> {
    let target = target.current();
    // The views from the target down to its base: the target first.
    let mut chain = vec![];
    let mut base = target;
    while base.0.view {
        let below = base.0.view_srcs()[0].clone();
        chain.push(base);
        base = below;
    }
    let mut new = value;
    for v in &chain {
        new = scatter(v, &new, location)?;
    }
    let new = value_of(new);
    let tracing = crate::dynamo::tracing();
    let written = if !tracing {
        // As PyTorch's eager ops: the base's elements, computed, written over, unless a pending
        // computation still reads them (it reads the old value, as PyTorch computed it then).
        if base.is_realized() {
            crate::inplace::update_in_place(&[(&base, &new)]).map_err(|e| e.at(location))?.remove(0)
        } else {
            // What reads a pending base is not known: its old value stays where it is.
            crate::realize::realize(&[&base, &new]).map_err(|e| e.at(location))?;
            let (old, written) = (base.0.storage.get(), new.0.storage.get());
            let (old, written) = (old.expect("realized"), written.expect("realized"));
            old.moved_keeping(written);
            Tensor::from_storage(written.clone())
        }
    } else {
        let computed = base.is_realized() || crate::dynamo::is_deferred_update(&base);
        let written = if computed {
            // An argument or captured tensor: the call's graph writes it back.
            value_of(crate::inplace::update_in_place(&[(&base, &new)]).map_err(|e| e.at(location))?.remove(0))
        } else {
            new
        };
        if !Arc::ptr_eq(&base.0, &written.0) {
            REBOUND.with(|r| r.borrow_mut().insert(key(&base), (base.clone(), written.clone())));
            bump();
        }
        written
    };
    let mut rebound = written;
    for v in chain.iter().rev() {
        rebound = replay(v, &rebound)?;
    }
    Ok(rebound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorch_strides_decide_which_reshapes_are_views() {
        // computeStride's cases: merging contiguous dims, splitting a dim, a transposed pair.
        assert_eq!(view_strides(&[2, 3, 4], &[12, 4, 1], &[6, 4]), Some(vec![4, 1]));
        assert_eq!(view_strides(&[6], &[2], &[2, 3]), Some(vec![6, 2]));
        assert_eq!(view_strides(&[3, 4], &[1, 3], &[12]), None);
        assert_eq!(view_strides(&[3, 4], &[1, 3], &[3, 4, 1]), Some(vec![1, 3, 3]));
        assert_eq!(view_strides(&[2, 1, 3], &[3, 100, 1], &[6]), Some(vec![1]));
        let x = Tensor::from_vec((0..24).map(|i| i as f32).collect(), &[2, 3, 4]).unwrap();
        let t = x.transpose(0, 2).unwrap();
        assert!(t.is_view() && !is_contiguous(&t));
        assert!(!t.reshape(&[24]).unwrap().is_view(), "a copy, as in PyTorch");
        assert!(t.unsqueeze(0).unwrap().is_view());
        let narrow = x.narrow(2, 1, 2).unwrap();
        assert!(!is_contiguous(&narrow) && is_contiguous(&x.narrow(0, 1, 1).unwrap()));
        assert!(narrow.reshape(&[6, 2]).unwrap().is_view() && !narrow.reshape(&[12]).unwrap().is_view());
        assert!(is_contiguous(&x.select(0, 1).unwrap()));
    }

    #[test]
    fn only_a_broadcasting_expand_cannot_be_written() {
        let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2, 1]).unwrap();
        let mut wide = x.expand(&[2, 3]).unwrap();
        let e = wide.add_(1.0).unwrap_err();
        assert!(e.to_string().contains("single memory location"), "{e}");
        let mut same = x.expand(&[1, 2, 1]).unwrap();
        same.add_(1.0).unwrap();
        assert_eq!(x.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
    }

    fn t(v: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_vec(v.to_vec(), shape).unwrap()
    }

    fn get(t: &Tensor) -> Vec<f32> {
        t.to_vec::<f32>().unwrap()
    }

    #[test]
    fn a_view_of_a_written_base_reads_the_new_values() {
        let mut x = t(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2]);
        let (rows, col, tr) = (x.narrow(0, 1, 2).unwrap(), x.select(1, 0).unwrap(), x.t().unwrap());
        let flat = x.reshape(&[6]).unwrap();
        let lazy = (&x * 1.0).exp().unwrap().log().unwrap(); // recorded before the write
        let sum = x.narrow(0, 0, 2).unwrap().sum_all().unwrap(); // through a view
        x.add_(10.0).unwrap();
        assert_eq!(get(&rows), vec![12.0, 13.0, 14.0, 15.0]);
        assert_eq!(get(&col), vec![10.0, 12.0, 14.0]);
        assert_eq!(get(&tr), vec![10.0, 12.0, 14.0, 11.0, 13.0, 15.0]);
        assert_eq!(get(&(&flat * 2.0)), vec![20.0, 22.0, 24.0, 26.0, 28.0, 30.0]);
        assert_eq!(get(&lazy), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "old reads see the old values");
        assert_eq!(get(&sum), vec![6.0]);
        assert_eq!(get(&x), vec![10.0, 11.0, 12.0, 13.0, 14.0, 15.0]);
    }

    #[test]
    fn a_write_through_a_view_reaches_the_base_and_its_other_views() {
        let x = t(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]);
        let col = x.select(1, 2).unwrap();
        let mut row = x.select(0, 1).unwrap();
        row.mul_(2.0).unwrap();
        assert_eq!(get(&x), vec![0.0, 1.0, 2.0, 6.0, 8.0, 10.0]);
        assert_eq!(get(&row), vec![6.0, 8.0, 10.0]);
        assert_eq!(get(&col), vec![2.0, 10.0]);
        // A view of a view, through a transpose.
        let mut corner = x.t().unwrap().narrow(0, 1, 2).unwrap().select(1, 0).unwrap();
        corner.fill_(-1.0).unwrap();
        assert_eq!(get(&x), vec![0.0, -1.0, -1.0, 6.0, 8.0, 10.0]);
        // A temporary view, as slice assignment: `x[:, 0] = 7`.
        x.select(1, 0).unwrap().fill_(7.0).unwrap();
        assert_eq!(get(&x), vec![7.0, -1.0, -1.0, 7.0, 8.0, 10.0]);
        assert_eq!(get(&col), vec![-1.0, 10.0]);
    }

    #[test]
    fn a_pending_base_is_computed_then_written() {
        let x = Tensor::arange(0, 6, 1, coil_ir::DType::F32).unwrap().reshape(&[2, 3]).unwrap();
        let flat = x.flatten(0, 1).unwrap();
        x.diagonal(0, 0, 1).unwrap().copy_(&t(&[-1.0, -2.0], &[2])).unwrap();
        assert_eq!(get(&flat), vec![-1.0, 1.0, 2.0, 3.0, -2.0, 5.0]);
    }

    #[test]
    fn copies_are_not_views_and_detached_aliases_are() {
        let x = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
        let copy = x.t().unwrap().contiguous();
        let reshaped = x.t().unwrap().reshape(&[4]).unwrap();
        let pending = x.t().unwrap().contiguous().exp().unwrap(); // a pending read of x
        let alias = x.detach().unwrap();
        let mut d = x.narrow(0, 0, 1).unwrap().detach().unwrap();
        d.add_(100.0).unwrap(); // writes through the detached view into x
        assert_eq!(get(&x), vec![101.0, 102.0, 3.0, 4.0]);
        assert_eq!(get(&alias), vec![101.0, 102.0, 3.0, 4.0]);
        assert_eq!(get(&copy), vec![1.0, 3.0, 2.0, 4.0], "a copy keeps the old values");
        assert_eq!(get(&reshaped), vec![1.0, 3.0, 2.0, 4.0]);
        assert_eq!(get(&pending.log().unwrap()), vec![1.0, 3.0, 2.0, 4.0], "recorded before: the old values");
    }

    #[test]
    fn inside_a_compiled_function_views_and_bases_see_each_others_writes() {
        let f = crate::dynamo::compile(|a: &[Tensor]| {
            let mut x = &a[0] * 1.0; // pending
            let before = x.sum_all()?; // reads the old value
            let rows = x.narrow(0, 1, 1)?;
            x.add_(1.0)?;
            let mut col = x.select(1, 0)?;
            col.mul_(10.0)?;
            let arg = a[1].clone(); // an argument: written back
            arg.narrow(0, 0, 1)?.fill_(5.0)?;
            Ok(vec![x, rows, before, a[1].clone()])
        });
        let y = t(&[0.0, 0.0], &[2]);
        let out = f.call(&[&t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]), &y]).unwrap();
        assert_eq!(get(&out[0]), vec![20.0, 3.0, 40.0, 5.0]);
        assert_eq!(get(&out[1]), vec![40.0, 5.0]);
        assert_eq!(get(&out[2]), vec![10.0]);
        assert_eq!(get(&out[3]), vec![5.0, 0.0]);
        assert_eq!(get(&y), vec![5.0, 0.0], "the argument was written");
    }
}
