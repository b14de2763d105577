//! Replay: calls of a compiled function that run its compiled graph without running its body
//! (tinygrad's `TinyJit`), for functions that opt in ([`super::CompiledFn::replay`]).
//!
//! A traced call runs the body, which records its lazy ops; the frame walks them, finds the
//! compiled graph and binds its inputs. Of a decode step that is hundreds of microseconds of
//! host time per token. Once two consecutive traced calls ran the same single graph the same
//! way ([`Trace::same_as`]), the function is *armed*, and a call checks only what the body cannot
//! see differently under the purity contract:
//! - each argument's dtype, sizes, device and which arguments share elements;
//! - each captured tensor the graph read (a parameter, the cache) is bound to its allocation's
//!   current elements, provided they are that tensor's, updated in place since or not
//!   ([`Storage::descendant`]): an optimizer step or a cache write between calls is seen, a
//!   buffer consumed or reused for another tensor is not taken (the call traces).
//!
//! Then it runs the compiled graph (from a CUDA graph where the function asks for that), writes
//! the traced call's in-place updates over the same buffers, takes the random counters the body
//! would have taken, and returns new output tensors. Anything else traces, and two consecutive
//! traced calls that agree arm it again.

use super::guards::ArgMeta;
use super::FnState;
use crate::compile::{Compiled, Donated};
use crate::storage::Storage;
use crate::Tensor;
use coil_ir::kernel::Donation;
use coil_ir::{Error, Graph, RandomState, Result};
use coil_runtime::{NodeOrigin, RunOrigin};
use std::cell::{Cell, OnceCell, RefCell};
use std::panic::Location;
use std::rc::Rc;
use std::sync::Arc;

/// One graph a traced call ran, as its recording keeps it.
pub(crate) struct GraphRun {
    /// The function's cache entry that served it (`None`: it ran eagerly).
    pub(crate) entry: Option<usize>,
    pub(crate) compiled: Option<Arc<Compiled>>,
    pub(crate) graph: Option<Arc<Graph>>,
    /// The elements bound to its inputs.
    pub(crate) inputs: Vec<Storage>,
    /// Its output tensors, by node address.
    pub(crate) outputs: Vec<usize>,
    pub(crate) donations: Vec<Donation>,
    pub(crate) random: Vec<RandomState>,
}

/// What a traced call of a replaying function ran.
pub(crate) struct Recording {
    pub(crate) graphs: Vec<GraphRun>,
    /// Whether the body read a value on the host (a graph break).
    pub(crate) broke: bool,
    /// In-place updates whose value went to another buffer than its target's.
    pub(crate) moved: usize,
    /// The thread's random stream when the call started.
    rng: RandomState,
}

impl Recording {
    pub(crate) fn new() -> Recording {
        Recording { graphs: vec![], broke: false, moved: 0, rng: crate::tensor::random_state() }
    }
}

/// Where a graph input's elements come from on a replay.
enum Bind {
    Arg(usize),
    /// The allocation of a tensor the body captured, at its current elements.
    Captured(Storage),
}

/// Where a function output comes from on a replay.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Out {
    Graph(usize),
    Arg(usize),
}

/// A traced call reduced to what replaying it takes.
pub(crate) struct Trace {
    entry: usize,
    compiled: Arc<Compiled>,
    graph: Arc<Graph>,
    args: Vec<ArgMeta>,
    /// Per argument, the first argument sharing its elements.
    alias: Vec<usize>,
    inputs: Vec<Bind>,
    /// Per graph input, whether the graph writes it in place (one of `donations`).
    donated_input: Vec<bool>,
    outputs: Vec<Out>,
    donations: Vec<Donation>,
    /// The graph's random streams, as counters after the stream's position at the call's start.
    random: Vec<u64>,
    /// Counters the body took from the stream.
    drawn: u64,
    /// The lines and operands of the graph's data-checked nodes (for a run's errors), made at
    /// the first replay and shared by every replay after it.
    checked: OnceCell<Arc<[NodeOrigin]>>,
    /// The last replay's binding of the graph's inputs (taken while a replay runs).
    bound: RefCell<Vec<Storage>>,
    /// The epoch ([`crate::alias::epoch`]) after the last replay, when nothing but its own
    /// writes happened during it and none of them reached a captured input: while the epoch
    /// stays there, no allocation was written or moved since, so the captured inputs of
    /// `bound` still hold, unchecked (a decode step binds hundreds of parameters per call).
    steady: Cell<Option<u64>>,
    /// The allocations of the captured inputs, sorted ([`Storage::addr`]), and the graph
    /// outputs not written over a donated input.
    captured_addrs: OnceCell<(Vec<usize>, Vec<usize>)>,
}

impl Trace {
    /// The trace of a call that can be replayed, or why it cannot. `arg_addrs`: each argument's
    /// allocation; `args`: the argument tensors; `outputs`: what the body returned.
    pub(crate) fn new(
        recording: Recording,
        arg_addrs: &[(usize, ArgMeta)],
        args: &[&Tensor],
        outputs: &[Tensor],
    ) -> std::result::Result<Trace, String> {
        if recording.broke {
            return Err("the body read a value on the host (a graph break)".into());
        }
        let Recording { mut graphs, moved, rng, .. } = recording;
        if graphs.len() != 1 {
            return Err(format!("the call ran {} graphs, not one", graphs.len()));
        }
        if moved > 0 {
            return Err(format!("{moved} in-place update(s) were not written over their target's buffer"));
        }
        let run = graphs.pop().expect("one");
        let (Some(entry), Some(compiled), Some(graph)) = (run.entry, run.compiled, run.graph) else {
            return Err("its graph ran uncompiled (the interpreter, or eagerly past the recompile limit)".into());
        };
        let end = crate::tensor::random_state();
        if end.seed != rng.seed || run.random.iter().any(|s| s.seed != rng.seed) {
            return Err("the body reseeded the random stream".into());
        }
        let random = run.random.iter().map(|s| s.offset.wrapping_sub(rng.offset)).collect();
        let inputs: Vec<Bind> = (run.inputs.into_iter())
            .map(|s| match arg_addrs.iter().position(|(a, _)| *a == s.addr()) {
                Some(i) => Bind::Arg(i),
                None => Bind::Captured(s),
            })
            .collect();
        if let Some(d) = run.donations.iter().find(|d| matches!(inputs[d.input], Bind::Arg(_))) {
            return Err(format!("graph input {} is an argument written in place", d.input));
        }
        let mut outs = Vec::with_capacity(outputs.len());
        for (k, t) in outputs.iter().enumerate() {
            let key = Arc::as_ptr(&t.0) as usize;
            let out = match run.outputs.iter().position(|&o| o == key) {
                Some(m) => Out::Graph(m),
                None => match args.iter().position(|a| Arc::ptr_eq(&a.0, &t.0)) {
                    Some(i) => Out::Arg(i),
                    None => return Err(format!("output {k} is neither computed by the graph nor an argument")),
                },
            };
            outs.push(out);
        }
        let alias =
            arg_addrs.iter().map(|(a, _)| arg_addrs.iter().position(|(b, _)| a == b).expect("itself")).collect();
        let donated_input = (0..inputs.len()).map(|j| run.donations.iter().any(|d| d.input == j)).collect();
        Ok(Trace {
            entry,
            compiled,
            graph,
            args: arg_addrs.iter().map(|(_, m)| m.clone()).collect(),
            alias,
            inputs,
            donated_input,
            outputs: outs,
            donations: run.donations,
            random,
            drawn: end.offset.wrapping_sub(rng.offset),
            checked: OnceCell::new(),
            bound: RefCell::new(Vec::new()),
            steady: Cell::new(None),
            captured_addrs: OnceCell::new(),
        })
    }

    /// Whether `new` ran the same graph the same way (arguments of the same metas, the same
    /// captured allocations, the same outputs and in-place writes, the same random draws), or
    /// the first difference. `self` holds its captured allocations, so an equal address is the
    /// same allocation, never a new one at a freed one's address.
    fn same_as(&self, new: &Trace) -> std::result::Result<(), String> {
        if self.entry != new.entry {
            return Err("the call ran another graph than the previous call".into());
        }
        if self.args != new.args || self.alias != new.alias {
            return Err("the arguments' dtypes, sizes, devices or shared elements changed".into());
        }
        for (j, (a, b)) in self.inputs.iter().zip(&new.inputs).enumerate() {
            match (a, b) {
                (Bind::Arg(x), Bind::Arg(y)) if x == y => {}
                (Bind::Captured(x), Bind::Captured(y)) if x.addr() == y.addr() => {}
                (Bind::Captured(_), Bind::Captured(_)) => {
                    return Err(format!(
                        "graph input {j} is a captured tensor with other elements at each call (made by the body \
                         from host data? pass it as an argument, or update one tensor in place)"
                    ))
                }
                _ => return Err(format!("graph input {j} comes from another argument or captured tensor")),
            }
        }
        if self.outputs != new.outputs || self.donations != new.donations {
            return Err("the outputs or in-place writes changed".into());
        }
        if self.random != new.random || self.drawn != new.drawn {
            return Err("the body drew other random numbers".into());
        }
        Ok(())
    }

    /// Binds the graph's inputs for a call on `args` into `bound` (the previous replay's
    /// binding, or empty), and returns the allocations the graph writes in place; `None` when
    /// a guard fails. A captured input whose allocation is at the version `bound` holds keeps
    /// that handle (no reference counting per parameter and call); any other slot gets a new
    /// handle, as a binding from scratch would. With `steady` (nothing written since the last
    /// replay, see [`Trace::steady`]), the captured inputs not written in place keep theirs
    /// unchecked.
    fn bind(&self, args: &[&Tensor], bound: &mut Vec<Storage>, steady: bool) -> Option<Vec<Storage>> {
        if args.len() != self.args.len() {
            return None;
        }
        let mut storages: Vec<&Storage> = Vec::with_capacity(args.len());
        for (t, (meta, device)) in args.iter().zip(&self.args) {
            let s = t.0.storage.get()?;
            if t.device() != *device || t.meta() != meta || !s.is_current() {
                return None;
            }
            storages.push(s);
        }
        for (i, s) in storages.iter().enumerate() {
            if storages.iter().position(|o| o.addr() == s.addr()) != Some(self.alias[i]) {
                return None;
            }
        }
        let fresh = bound.len() != self.inputs.len();
        if fresh {
            bound.clear();
        }
        for (j, b) in self.inputs.iter().enumerate() {
            if steady && !fresh && matches!(b, Bind::Captured(_)) && !self.donated_input[j] {
                continue;
            }
            let keep = !fresh
                && match b {
                    Bind::Arg(i) => bound[j].same_handle(storages[*i]),
                    Bind::Captured(s) => s.descendant_held_by(&bound[j])?,
                };
            if keep {
                continue;
            }
            let handle = match b {
                Bind::Arg(i) => storages[*i].clone(),
                Bind::Captured(s) => s.descendant()?,
            };
            if fresh {
                bound.push(handle);
            } else {
                bound[j] = handle;
            }
        }
        let mut written = Vec::with_capacity(self.donations.len());
        for d in &self.donations {
            let target = &bound[d.input];
            if storages.iter().any(|s| s.addr() == target.addr()) {
                return None; // an argument shares the elements written in place
            }
            // Written as an update of the tensor every handle to it stands for
            // (`Donated::Updated`): no handle goes stale (see `CompiledFn::replay`).
            written.push(target.clone());
        }
        Some(written)
    }

    /// Whether a replay whose outputs are `results` (before the donated ones are mapped to
    /// their targets) may leave its captured inputs unchecked at the next call
    /// ([`Trace::steady`]): no output in the graph's own buffers shares a captured input's
    /// allocation (the replay made such an output's old handles stale).
    fn outputs_spare_captured(&self, results: &[Storage]) -> bool {
        let (captured, own) = self.captured_addrs.get_or_init(|| {
            let mut a: Vec<usize> = (self.inputs.iter())
                .filter_map(|b| match b {
                    Bind::Captured(s) => Some(s.addr()),
                    Bind::Arg(_) => None,
                })
                .collect();
            a.sort_unstable();
            let own = (0..results.len()).filter(|i| self.donations.iter().all(|d| d.output != *i)).collect();
            (a, own)
        });
        own.iter().all(|&i| captured.binary_search(&results[i].addr()).is_err())
    }

    /// After a replay's run: the slots of arguments in `bound` let go of them (a call's
    /// arguments do not outlive it), holding a captured input's handle instead.
    fn release_args(&self, bound: &mut [Storage]) {
        let Some(filler) = self.inputs.iter().find_map(|b| match b {
            Bind::Captured(s) => Some(s),
            Bind::Arg(_) => None,
        }) else {
            return;
        };
        for (slot, b) in bound.iter_mut().zip(&self.inputs) {
            if matches!(b, Bind::Arg(_)) {
                *slot = filler.clone();
            }
        }
    }
}

/// A function's replay state.
#[derive(Default)]
pub(crate) struct Replay {
    pub(crate) on: bool,
    /// Every this many replays, a call traces and is checked against the replay.
    pub(crate) check_every: usize,
    /// The last traced call, when it can be replayed.
    last: Option<Rc<Trace>>,
    /// What calls replay; `None` until two consecutive traced calls agree.
    plan: Option<Rc<Trace>>,
    /// Replays since the last check.
    since_check: usize,
    /// The call being traced is a check.
    checking: bool,
    pub(crate) replays: usize,
    /// Why the last traced call did not arm the replay.
    pub(crate) blocker: Option<String>,
}

impl Replay {
    /// Off, checking every `check_every` replays once on.
    pub(crate) fn new(check_every: usize) -> Replay {
        Replay { check_every, ..Default::default() }
    }
}

/// Replays a call of the function of `state` on `args`, when it is armed and the guards hold;
/// `None`: trace it.
pub(crate) fn try_replay(
    state: &Rc<RefCell<FnState>>,
    args: &[&Tensor],
    origin: &'static Location<'static>,
) -> Option<Result<Vec<Tensor>>> {
    let (plan, cuda_graphs) = {
        let mut st = state.borrow_mut();
        let r = &mut st.replay;
        let plan = r.plan.clone().filter(|_| r.on)?;
        if crate::dynamo::tracing() {
            return None; // inside another compiled function: its graph takes the ops
        }
        if r.check_every > 0 && r.since_check >= r.check_every {
            r.since_check = 0;
            r.checking = true;
            return None;
        }
        (plan, st.cuda_graphs)
    };
    if let Err(e) = crate::realize::realize(args) {
        return Some(Err(e));
    }
    // Taken out while the replay runs: a replay inside the run (none today) binds from scratch.
    let mut inputs = plan.bound.take();
    let steady = plan.steady.take() == Some(crate::alias::epoch());
    let written = plan.bind(args, &mut inputs, steady)?;
    let before = crate::alias::epoch_and_own();
    let random: Vec<RandomState> = if plan.drawn == 0 && plan.random.is_empty() {
        vec![]
    } else {
        let start = crate::tensor::random_state();
        crate::tensor::set_random_state(start.advanced(plan.drawn));
        plan.random.iter().map(|&r| start.advanced(r)).collect()
    };
    let checked = plan
        .checked
        .get_or_init(|| plan.compiled.origin(origin, |i| crate::realize::graph_node_source(&plan.graph, i)).nodes);
    let origin = RunOrigin { line: Some(origin), nodes: checked.clone() };
    let run = crate::guard::guard("running", &plan.graph, || {
        plan.compiled.run_or_replay(cuda_graphs, &inputs, &random, origin, Donated::Updated)
    });
    plan.release_args(&mut inputs);
    *plan.bound.borrow_mut() = inputs;
    let mut results = match run {
        Ok(results) => results,
        Err(e) => return Some(Err(e)),
    };
    let after = crate::alias::epoch_and_own();
    let only_own = after.0 - before.0 == after.1 - before.1;
    plan.steady.set((only_own && plan.outputs_spare_captured(&results)).then_some(after.0));
    for (d, target) in plan.donations.iter().zip(written) {
        if results[d.output].addr() != target.addr() {
            return Some(Err(Error::internal(format!(
                "a replay of a compiled function wrote output {} to another buffer than its traced calls did",
                d.output
            ))));
        }
        results[d.output] = target;
    }
    let outputs = plan
        .outputs
        .iter()
        .map(|o| match *o {
            Out::Graph(m) => Tensor::from_storage(results[m].clone()),
            Out::Arg(i) => args[i].clone(),
        })
        .collect();
    let mut st = state.borrow_mut();
    st.replay.replays += 1;
    st.replay.since_check += 1;
    Some(Ok(outputs))
}

/// After a traced call of a replaying function: arms the replay when this call and the last
/// agree; for a check, an error when the call did not run what the replay runs.
pub(crate) fn after_trace(state: &Rc<RefCell<FnState>>, trace: std::result::Result<Trace, String>) -> Result<()> {
    let mut st = state.borrow_mut();
    let name = st.name.clone();
    let r = &mut st.replay;
    let checked = std::mem::take(&mut r.checking).then(|| r.plan.clone()).flatten();
    if let Some(plan) = checked {
        let verdict = match &trace {
            Ok(t) => plan.same_as(t),
            Err(why) => Err(why.clone()),
        };
        if let Err(why) = verdict {
            (r.plan, r.last) = (None, None);
            return Err(Error::unsupported(format!(
                "replay check of {name}: its body no longer runs what its replays ran: {why}. A replayed body must \
                 depend only on its tensor arguments and the tensors it captures, not on other Rust state \
                 (see CompiledFn::replay)"
            )));
        }
    }
    match trace {
        Ok(t) => {
            let t = Rc::new(t);
            let verdict = match &r.last {
                Some(last) => last.same_as(&t),
                None => Err("one traced call so far (replay starts after two that agree)".into()),
            };
            r.plan = verdict.is_ok().then(|| t.clone());
            r.blocker = verdict.err();
            r.last = Some(t);
        }
        Err(why) => {
            (r.plan, r.last) = (None, None);
            r.blocker = Some(why);
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;
