//! In-place updates: new values written over the elements of computed tensors.
//!
//! [`update_in_place`] is how an optimizer step writes new parameters and moments over the old
//! ones, as PyTorch's optimizers do under `no_grad`: the new values are computed in one graph
//! whose outputs are *donated* the old tensors' buffers ([`crate::compile::compile_donating`]),
//! so a training loop's memory does not grow and no step keeps the previous one alive. Every
//! handle to an old tensor (the old `Tensor`, a `detach`ed alias, a view of it) reads the new
//! values afterwards, as PyTorch's references do after an in-place op ([`crate::alias`]); what
//! cannot read them is a pending computation recorded before the update that reads the old
//! elements: they are gone, and computing it is an error ([`crate::Storage::check_current`]),
//! never a silent read of the new values. The in-place ops (`add_`, `copy_`, ...) are built on
//! this ([`crate::ops::mutation`]).

use crate::compile::{compiled_walk, Donated};
use crate::realize::{backend, interpret, Backend};
use crate::storage::Storage;
use crate::tensor::Tensor;
use crate::walk::Walk;
use coil_ir::kernel::Donation;
use coil_ir::{Error, ErrorKind, Result};
use std::panic::Location;

/// Whether a compiled function ([`crate::dynamo`]) is running on this thread
/// (`torch.compiler.is_compiling()`): in-place updates are then recorded and run with the
/// call's graph, so a module need not ask for anything to be computed with them.
///
/// ```
/// assert!(!coil_frontend::is_compiling());
/// let f = coil_frontend::dynamo::compile(|_: &[coil_frontend::Tensor]| {
///     assert!(coil_frontend::is_compiling());
///     Ok(vec![])
/// });
/// f.call(&[]).unwrap();
/// ```
pub fn is_compiling() -> bool {
    crate::dynamo::tracing()
}

/// Computes every `value` and writes it over its `target`'s elements, all in one graph; returns
/// the updated tensors, in order (computed, with no history: they keep nothing of the graph
/// that made them alive).
///
/// Each target must be computed, current and of its value's shape, dtype and device; targets
/// must be distinct. Inside a compiled function ([`crate::dynamo`]) the update is recorded, not
/// run: the returned tensors are the (pending) values, and the next graph the call runs (at its
/// end, or at a graph break) computes them and writes them over the targets' buffers; a target
/// may then also be the value of an earlier update of the same call. After the call the old
/// handles of a target stand for the returned tensor (see the module docs). Where the
/// compiler cannot write a value over its target (the target is read after the value is
/// written, or the value is not computed by a kernel), it writes a new buffer instead; the
/// result is the same and `ir_post_fusion.txt` says why.
///
/// ```
/// use coil_frontend::{update_in_place, Tensor};
/// let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
/// let g = Tensor::from_vec(vec![0.5f32, 0.5, 0.5], &[3]).unwrap();
/// let new = (&w - &(&g * 0.1));
/// let w2 = update_in_place(&[(&w, &new)]).unwrap().remove(0);
/// assert_eq!(w2.to_vec::<f32>().unwrap(), vec![0.95, 1.95, 2.95]);
/// assert_eq!(w.to_vec::<f32>().unwrap(), vec![0.95, 1.95, 2.95]); // the old handle reads the new values
/// ```
#[track_caller]
pub fn update_in_place(updates: &[(&Tensor, &Tensor)]) -> Result<Vec<Tensor>> {
    update_in_place_with(updates, &[])
}

/// [`update_in_place`], computing `also` in the same graph (bound to those tensors, as
/// [`crate::realize()`] does): a decode step's logits with its key/value cache written in place,
/// an optimizer step's gradient norm with the parameters.
///
/// ```
/// use coil_frontend::{update_in_place_with, Tensor};
/// let cache = Tensor::from_vec(vec![0.0f32; 4], &[4]).unwrap();
/// let pos = Tensor::from_vec(vec![2i64], &[]).unwrap();
/// let written = coil_frontend::where_(&Tensor::iota(&[4], 0).unwrap().eq(&pos).unwrap(), 7.0, &cache).unwrap();
/// let total = written.sum(&[0], false).unwrap();
/// let cache = update_in_place_with(&[(&cache, &written)], &[&total]).unwrap().remove(0);
/// assert_eq!((cache.to_vec::<f32>().unwrap(), total.item::<f32>().unwrap()), (vec![0.0, 0.0, 7.0, 0.0], 7.0));
/// ```
#[track_caller]
pub fn update_in_place_with(updates: &[(&Tensor, &Tensor)], also: &[&Tensor]) -> Result<Vec<Tensor>> {
    let caller = Location::caller();
    let fail = |kind: ErrorKind, message: String| Error::new(kind, message).in_op("update_in_place", vec![]).at(caller);
    let tracing = crate::dynamo::tracing();
    let mut targets: Vec<Storage> = Vec::with_capacity(updates.len());
    // Inside a compiled function, a target may be the value of an earlier update of the call.
    let mut updated_again: Vec<*const crate::tensor::TensorNode> = Vec::new();
    for (k, (target, value)) in updates.iter().enumerate() {
        let storage = match target.0.storage.get() {
            Some(storage) => storage,
            None if tracing && crate::dynamo::is_deferred_update(target) => {
                if updated_again.contains(&std::sync::Arc::as_ptr(&target.0)) {
                    return Err(fail(ErrorKind::Value, format!("update {k}: its target is another update's target")));
                }
                updated_again.push(std::sync::Arc::as_ptr(&target.0));
                check_value(k, target, value, updates[0].1, &fail)?;
                continue;
            }
            None => return Err(fail(ErrorKind::Value, format!("target {k} ({}) is not computed", target.meta()))),
        };
        storage.check_current().map_err(|e| e.in_op("update_in_place", vec![]).at(caller))?;
        check_value(k, target, value, updates[0].1, &fail)?;
        if targets.iter().any(|t| t.addr() == storage.addr()) {
            return Err(fail(
                ErrorKind::Value,
                format!("update {k}: its target's elements are another update's target"),
            ));
        }
        targets.push(storage.clone());
    }

    let values: Vec<&Tensor> = updates.iter().map(|(_, v)| *v).collect();
    if let Some(other) = also.iter().find(|t| Some(t.device()) != values.first().map(|v| v.device())) {
        if !values.is_empty() {
            return Err(fail(
                ErrorKind::Device,
                format!("a tensor to compute with the updates is on {}", other.device()),
            ));
        }
    }
    if tracing {
        // Written by the next graph the compiled function runs. A value computed already
        // passes through that graph (a copy), as outside.
        let deferred = (updates.iter())
            .map(|&(t, v)| Ok((t, if v.is_realized() { v.detach()? } else { v.clone() })))
            .collect::<Result<Vec<_>>>()?;
        crate::dynamo::defer_updates(&deferred, also).map_err(|m| fail(ErrorKind::Value, m))?;
        return Ok(deferred.into_iter().map(|(_, v)| v).collect());
    }
    let pending: Vec<&Tensor> = also.iter().copied().filter(|t| !t.is_realized()).collect();
    let mut results = run_donating(&values, &pending, &targets, caller).map_err(|e| e.at(caller))?;
    for (t, storage) in pending.iter().zip(results.split_off(values.len())) {
        let _ = t.0.storage.set(storage);
    }
    let mut updated = Vec::with_capacity(results.len());
    for ((target, value), storage) in targets.iter().zip(&values).zip(results) {
        // A target whose buffer was not written moved to the value's: its old handles follow
        // (and what still reads its old elements reads them).
        if storage.addr() != target.addr() {
            target.moved_keeping(&storage);
        }
        if !value.is_realized() {
            let _ = value.0.storage.set(storage.clone());
        }
        updated.push(Tensor::from_storage(storage));
    }
    Ok(updated)
}

/// The checks of update `k` that do not need its target's elements: the value has the target's
/// meta and device, and the first update's device.
fn check_value(
    k: usize,
    target: &Tensor,
    value: &Tensor,
    first: &Tensor,
    fail: &dyn Fn(ErrorKind, String) -> Error,
) -> Result<()> {
    if target.meta() != value.meta() || target.device() != value.device() {
        return Err(fail(
            ErrorKind::Shape,
            format!(
                "update {k}: the value is {} on {}, its target {} on {}",
                value.meta(),
                value.device(),
                target.meta(),
                target.device()
            ),
        ));
    }
    if value.device() != first.device() {
        return Err(fail(
            ErrorKind::Device,
            format!("update {k} is on {}, update 0 on {}", value.device(), first.device()),
        ));
    }
    Ok(())
}

/// Computes `values` and then `also` (one graph), each value donated the buffer of its target
/// when the target is among the graph's inputs and shares its elements with no other input. A value computed
/// already passes through the graph, which copies it: a result never shares a value's buffer.
fn run_donating(
    values: &[&Tensor],
    also: &[&Tensor],
    targets: &[Storage],
    origin: &'static Location<'static>,
) -> Result<Vec<Storage>> {
    let start = std::time::Instant::now();
    let outputs: Vec<&Tensor> = values.iter().chain(also).copied().collect();
    let walk = Walk::new(&outputs, &[]);
    crate::profile::spent(start, |t| &mut t.capture);
    let inputs = walk.input_storages();
    let mut donations = Vec::new();
    for (output, target) in targets.iter().enumerate() {
        let mut same = inputs.iter().enumerate().filter(|(_, s)| s.addr() == target.addr());
        // A pending computation outside this graph that reads the target reads its old value
        // later: the new one goes to a new buffer.
        let kept = target.read_elsewhere(|n| walk.contains(n));
        if let (Some((input, _)), None, false) = (same.next(), same.next(), kept) {
            donations.push(Donation { output, input });
        }
    }
    match backend() {
        Backend::Interpreter => interpret(&walk.captured()),
        Backend::Compiled => {
            let (compiled, graph) = compiled_walk(&walk, &donations)?;
            let replay = crate::realize::cuda_graphs();
            let origin = compiled.origin(origin, |i| walk.node_source(i));
            crate::guard::guard("running", &graph, || {
                compiled.run_or_replay(replay, &inputs, walk.random(), origin, Donated::Overwritten)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_ir::DType;

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
    }

    fn addr(t: &Tensor) -> usize {
        t.0.storage.get().expect("computed").addr()
    }

    #[test]
    fn sgd_steps_write_over_the_same_buffers() {
        let mut w = t(&[1.0, 2.0, 3.0, 4.0]);
        let mut m = Tensor::zeros(&[4], DType::F32);
        m.realize().unwrap();
        let (w0, m0) = (addr(&w), addr(&m));
        let g = t(&[1.0, -1.0, 0.5, 0.0]);
        for _ in 0..3 {
            let m_new = &(&m * 0.9) + &g;
            let w_new = &w - &(&m_new * 0.1);
            let out = update_in_place(&[(&w, &w_new), (&m, &m_new)]).unwrap();
            (w, m) = (out[0].clone(), out[1].clone());
            assert_eq!((addr(&w), addr(&m)), (w0, m0), "written in place");
        }
        // m = g (1 + 0.9 + 0.81); w -= 0.1 (g + 1.9 g + 2.71 g)
        let want: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .zip([1.0f32, -1.0, 0.5, 0.0])
            .map(|(w, g)| w - 0.1 * g * (1.0 + 1.9 + 2.71))
            .collect();
        let got = w.to_vec::<f32>().unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn old_handles_and_aliases_read_the_new_values_and_earlier_reads_the_old_ones() {
        let w = t(&[1.0, 2.0]);
        let alias = w.detach().unwrap();
        let view = w.narrow(0, 1, 1).unwrap();
        let lazy = &w * 3.0; // recorded before the update, computed after
        let w2 = update_in_place(&[(&w, &(&w + 1.0))]).unwrap().remove(0);
        assert_eq!(w2.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
        for handle in [&w, &alias] {
            assert_eq!(handle.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
        }
        assert_eq!(view.to_vec::<f32>().unwrap(), vec![3.0]);
        assert_eq!((&w * 2.0).to_vec::<f32>().unwrap(), vec![4.0, 6.0], "ops read the new values");
        assert_eq!(lazy.to_vec::<f32>().unwrap(), vec![3.0, 6.0], "recorded before: the old values");
    }

    #[test]
    fn a_target_moved_to_another_buffer_is_followed_by_its_old_handles() {
        // The value does not read the target: the compiler writes a new buffer.
        let w = t(&[1.0, 2.0]);
        let w2 = update_in_place(&[(&w, &t(&[5.0, 6.0]))]).unwrap().remove(0);
        assert_ne!(addr(&w), addr(&w2));
        assert_eq!(w.to_vec::<f32>().unwrap(), vec![5.0, 6.0]);
    }

    #[test]
    fn a_target_read_after_its_new_value_is_written_still_gives_the_right_values() {
        // The sum reads w in a kernel that may run after the one writing w + 1: the compiler
        // must not write over w then.
        let w = t(&[1.0, 2.0, 3.0]);
        let s = t(&[0.0]);
        let new_w = &w + 1.0;
        let new_s = &s + &w.sum(&[0], true).unwrap();
        let out = update_in_place(&[(&w, &new_w), (&s, &new_s)]).unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
        assert_eq!(out[1].to_vec::<f32>().unwrap(), vec![6.0]);
    }

    #[test]
    fn mismatched_or_repeated_targets_are_errors() {
        let w = t(&[1.0, 2.0]);
        let e = update_in_place(&[(&w, &t(&[1.0, 2.0, 3.0]))]).unwrap_err();
        assert!(e.to_string().contains("update_in_place") && e.to_string().contains("f32[3]"), "{e}");
        let alias = w.detach().unwrap();
        let v = &w * 2.0;
        assert!(update_in_place(&[(&w, &v), (&alias, &v)]).is_err());
        let lazy = &w * 2.0;
        assert!(update_in_place(&[(&lazy, &v)]).is_err(), "a target that is not computed");
    }
}
