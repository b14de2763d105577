//! What a computed tensor keeps of the computation that made it, and when it lets it go.
//!
//! A node keeps its sources (operands) after its value is computed, because gradients are taken
//! functionally: [`crate::grad`] walks back from its output through computed tensors that depend
//! on a `wrt` tensor and replays their ops, and `wrt` may be any tensor the caller holds (data
//! or computed; coil has no `requires_grad` mark). So a computed tensor's history is needed
//! exactly while a later `grad` call could name a tensor in it: while some tensor in it is held
//! from outside the history (by the program, a cache, a pending op). A tensor no one holds can
//! never be named again.
//!
//! `release` applies that rule after each realization: for each computed tensor behind the
//! realized ones whose whole history is held only by the history itself, the sources are
//! dropped (and with them every step's intermediate values). A loop that feeds each step's
//! result to the next (`x = f(x); x.realize()`) then keeps one or two steps, not all of them.
//! Where a tensor in the history is still held (the first step's input, or a model's weights
//! that every step reads), the history stays, as a later `grad` with respect to it needs it;
//! [`Tensor::detach`] of a computed tensor keeps none (PyTorch's `no_grad`/`detach`).
//!
//! Views keep their sources always: a view resolves against its base ([`crate::alias`]).
//!
//! Dropping the sources of a node other threads may be walking needs them excluded: every walk
//! over sources holds the history lock for reading (`read`); `release` takes it for writing
//! only when no one reads (else it lets go later). The type system keeps to it: a node's
//! operands are borrowed through the read guard (`TensorNode::srcs(&guard)`), a view's without
//! one (views are never released), and only a walk whose borrows outlive one scope uses the
//! `unsafe` accessor, holding the guard for its whole life.
//!
//! [`Tensor::detach`]: crate::Tensor::detach

use crate::tensor::Tensor;
use crate::walk::AddrMap;
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

/// Held for reading by whoever borrows sources of nodes that may be computed (walks), for
/// writing by [`release`].
static HISTORY: RwLock<()> = RwLock::new(());

/// The number of tensor nodes alive, for diagnostics ([`live_tensor_nodes`]).
static LIVE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's nested read guards: only the outermost locks.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    static GUARD: std::cell::RefCell<Option<RwLockReadGuard<'static, ()>>> = const { std::cell::RefCell::new(None) };
}

/// The number of tensor nodes alive in the process (every [`Tensor`] node: data, pending and
/// computed, those only a computed tensor's history holds included). A diagnostic: a loop
/// whose count grows with its steps keeps its history (see the [module docs](self)).
///
/// ```
/// use coil_frontend::{history::live_tensor_nodes, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
/// assert!(live_tensor_nodes() >= 1); // x, at least (other threads' tensors count too)
/// drop(x);
/// ```
pub fn live_tensor_nodes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Counts a node made.
pub(crate) fn born() {
    LIVE.fetch_add(1, Ordering::Relaxed);
}

/// Counts a node dropped.
pub(crate) fn died() {
    LIVE.fetch_sub(1, Ordering::Relaxed);
}

/// A read hold on the history lock: while one is alive, no node's sources are released.
pub(crate) struct Read(());

/// Holds the history lock for reading until the result drops (nested holds on one thread lock
/// once).
pub(crate) fn read() -> Read {
    DEPTH.with(|d| {
        if d.get() == 0 {
            let guard = HISTORY.read().unwrap_or_else(|e| e.into_inner());
            GUARD.with(|g| *g.borrow_mut() = Some(guard));
        }
        d.set(d.get() + 1);
    });
    Read(())
}

impl Drop for Read {
    fn drop(&mut self) {
        DEPTH.with(|d| {
            d.set(d.get() - 1);
            if d.get() == 0 {
                GUARD.with(|g| g.borrow_mut().take());
            }
        });
    }
}

/// Whether a tensor is held from outside the sources of live nodes: by the program, or by
/// anything else that could hand it to `grad`.
fn held_outside(t: &Tensor) -> bool {
    Arc::strong_count(&t.0) > t.0.consumers.load(Ordering::Acquire)
}

/// Drops the sources of each computed tensor behind `roots` (themselves included) whose history
/// no one outside it holds (see the [module docs](self)). Visits at most `budget` nodes: a
/// history that stays (its first input is held) is not walked whole at every step; what lies
/// beyond counts as held.
pub(crate) fn release(roots: &[&Tensor], budget: usize) {
    // Someone reads sources now (this thread up the stack, or another): let go later.
    if DEPTH.with(|d| d.get()) > 0 {
        return;
    }
    let Ok(write) = HISTORY.try_write() else { return };
    let free = free_of_holders(roots, budget);
    // Released after the walk's borrows end: the nodes are clones, the check is done.
    let mut dropped = Vec::new();
    for t in &free {
        // SAFETY: the write lock excludes every reader of sources, and no borrow of these
        // sources is alive here.
        dropped.push(unsafe { t.0.take_srcs() });
    }
    drop(write);
    drop(free);
    drop(dropped);
}

/// The computed, non-view tensors behind `roots` with sources, none of whose history is held
/// outside it.
fn free_of_holders(roots: &[&Tensor], budget: usize) -> Vec<Tensor> {
    // Called under the write lock.
    let key = |t: &Tensor| Arc::as_ptr(&t.0) as usize;
    // Per node visited: whether nothing in its history is held outside it.
    let mut free: AddrMap<bool> = AddrMap::default();
    // Borrowed, not cloned, until the check is done: a clone would count as a holder.
    let mut out: Vec<&Tensor> = Vec::new();
    let mut visited = 0usize;
    let mut stack: Vec<(&Tensor, bool)> = Vec::new();
    for &root in roots {
        stack.push((root, false));
        while let Some((t, expanded)) = stack.pop() {
            if free.contains_key(&key(t)) {
                continue;
            }
            // SAFETY: `release` holds the history lock for writing (no reader) and takes no
            // operands until this walk's borrows end.
            let srcs = unsafe { t.0.srcs_unchecked() };
            if !expanded {
                visited += 1;
                if srcs.is_empty() || visited > budget {
                    free.insert(key(t), srcs.is_empty());
                    continue;
                }
                stack.push((t, true));
                stack.extend(srcs.iter().filter(|s| !free.contains_key(&key(s))).map(|s| (s, false)));
                continue;
            }
            let is_free = srcs.iter().all(|s| !held_outside(s) && free.get(&key(s)).copied().unwrap_or(false));
            free.insert(key(t), is_free);
            if is_free && t.is_realized() && !t.0.view {
                out.push(t);
            }
        }
    }
    out.into_iter().cloned().collect()
}
