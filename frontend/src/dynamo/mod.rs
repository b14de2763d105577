//! Compiled functions: graph breaks, guards, recompiles and `explain` (TorchDynamo's part of
//! `torch.compile`).
//!
//! [`compile`] wraps a function of tensors into a [`CompiledFn`]. In Rust there is no bytecode
//! to trace: each call simply runs the function again, which only records lazy nodes (cheap),
//! and every graph it produces is looked up in the function's **guarded cache**
//! ([`guards`]). The common hit costs one walk over the lazy nodes: the walk is compared, node
//! by node as it goes, with the graph that served the same place of the call last time (which
//! checks every guard of a static entry; nothing is built or hashed). Otherwise the graph is
//! captured, a structural hash finds the candidates, a node-by-node comparison confirms one,
//! and only a miss compiles. The function also keeps the forward graphs its `value_and_grad`
//! calls differentiated ([`DIFFERENTIATED_LIMIT`]), so a training step differentiates once,
//! and, with [`CompiledFn::cuda_graphs`], replays its static graphs on a GPU from CUDA graphs.
//! A miss where the function already has a graph at that place is a
//! **recompile**; coil says which guard failed, with old and new values
//! (`COIL_LOGS=recompiles`), and after [`RECOMPILE_LIMIT`] recompiles it runs new graphs
//! eagerly (the reference interpreter) and warns once.
//!
//! While a compiled function runs, anything that needs a value on the host before the
//! function returns (`item`, `to_vec`, `Display`, `buffer`, `realize`, an opaque
//! [`Tensor::map_host`]) is a **graph break** ([`GraphBreak`]): the pending work it needs is
//! compiled and run as one graph, together with every pending value the function still holds
//! (so nothing is computed twice), and capture goes on after it. Each break has a stable id, a
//! reason, a hint and the user's line (`COIL_LOGS=graph_breaks`). [`explain()`] reports all of
//! it; a [`Stance`] turns breaks or recompiles into errors for CI.
//!
//! **In-place updates** ([`crate::update_in_place_with`], as a key/value cache's write) made
//! inside the function are functionalized: the next graph the call runs computes the new
//! values and writes them over their targets' buffers (donated inputs), as PyTorch's
//! functionalization writes mutated inputs back at the end of the graph.
//!
//! **Replay** ([`CompiledFn::replay`], opt-in; tinygrad's `TinyJit`): once two consecutive
//! calls ran the same single graph the same way, later calls check their arguments, bind the
//! captured tensors' current elements and run the compiled graph without running the body
//! (the in-place writes included), a few microseconds of host time instead of recording and
//! walking hundreds of lazy ops. The body must then depend only on its tensor arguments and
//! the tensors it captures; [`CompiledFn::replay_check`] checks that every N-th call.
//!
//! **Dynamic shapes** ([`dynamic`]): shapes are static first (every size guarded). When a
//! graph misses only because some input sizes changed, coil recompiles it once with those
//! dims symbolic (automatic dynamic; [`Tensor::mark_dynamic`] makes a dim symbolic from the
//! first call) and serves every later size from that graph: its kernels take the sizes as
//! arguments. Sizes 0 and 1 are specialized (a symbol is at least 2).

pub mod dynamic;
pub mod explain;
mod frame;
pub mod guards;
mod replay;

pub use explain::{explain, DifferentiationInfo, ExplainReport, GraphInfo};
pub use guards::{same_structure, structural_hash, Guard, Source};

pub(crate) use frame::{defer_updates, host_read, is_deferred_update, tracing};

use crate::autodiff::Differentiated;
use crate::profile::{host_times, HostTimes};
use crate::walk::Walk;
use crate::Tensor;
use coil_ir::kernel::Donation;
use coil_ir::{Graph, Result};
use coil_runtime::Device;
use explain::ExplainLog;
use frame::{run_frame, Entry, Frame};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::panic::Location;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The most differentiated graphs a compiled function keeps (the most recently used ones):
/// one per `value_and_grad` of its body, and a few sizes of a dynamic one.
pub const DIFFERENTIATED_LIMIT: usize = 8;

/// How often a replaying function checks its body by default ([`CompiledFn::replay_check`]):
/// every 64th replayable call in debug builds, never in release builds.
pub const DEFAULT_REPLAY_CHECK: usize = if cfg!(debug_assertions) { 64 } else { 0 };

/// After this many recompiles of one function, its new graphs run eagerly (uncompiled, on the
/// reference interpreter) and coil warns once; graphs already compiled keep serving hits.
pub const RECOMPILE_LIMIT: usize = 8;

/// How compiled functions treat graph breaks and recompiles on this thread
/// (`torch.compiler.set_stance`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stance {
    /// Break graphs and recompile as needed.
    #[default]
    Default,
    /// A graph break is an [`Error`](coil_ir::Error) (kind `Unsupported`) naming the reason, hint and line.
    FailOnGraphBreak,
    /// A recompile is an [`Error`](coil_ir::Error) (kind `Unsupported`) naming the failed guard.
    FailOnRecompile,
}

thread_local! {
    static STANCE: Cell<Stance> = const { Cell::new(Stance::Default) };
    /// The outermost host read in progress (`item` calls `to_vec` calls `realize`: the break is
    /// the `item`, at the user's line).
    static READ: Cell<Option<(BreakKind, Option<&'static Location<'static>>)>> = const { Cell::new(None) };
}

/// Sets this thread's stance; returns the previous one.
///
/// ```
/// use coil_frontend::dynamo::{set_stance, Stance};
/// let before = set_stance(Stance::FailOnGraphBreak);
/// // ... run compiled functions that must capture whole ...
/// set_stance(before);
/// ```
pub fn set_stance(stance: Stance) -> Stance {
    STANCE.with(|s| s.replace(stance))
}

/// This thread's stance.
pub fn stance() -> Stance {
    STANCE.with(|s| s.get())
}

/// What made a graph break: one kind per API that needs computed values (named by
/// [`BreakKind::api`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakKind {
    /// `Tensor::item`.
    Item,
    /// `Tensor::to_vec`.
    ToVec,
    /// Printing a tensor (`Display`).
    Display,
    /// `Tensor::buffer`.
    Buffer,
    /// `Tensor::storage`.
    Storage,
    /// An explicit `Tensor::realize`.
    Realize,
    /// `Tensor::to_device` of a pending value.
    ToDevice,
    /// `map_host`: an opaque host function.
    MapHost,
    /// An op whose output shape depends on the values (`nonzero`, `masked_select`, `unique`).
    DataDependentShape,
}

impl BreakKind {
    /// The API that broke the graph.
    pub fn api(self) -> &'static str {
        match self {
            BreakKind::Item => "item",
            BreakKind::ToVec => "to_vec",
            BreakKind::Display => "Display",
            BreakKind::Buffer => "buffer",
            BreakKind::Storage => "storage",
            BreakKind::Realize => "realize",
            BreakKind::ToDevice => "to_device",
            BreakKind::MapHost => "map_host",
            BreakKind::DataDependentShape => "nonzero/masked_select/unique",
        }
    }

    /// Why this kind breaks a graph, for reports.
    pub fn reason(self) -> &'static str {
        match self {
            BreakKind::Item => "host read of a tensor value (`item`)",
            BreakKind::ToVec => "host read of tensor values (`to_vec`)",
            BreakKind::Display => "printing a tensor (`Display`)",
            BreakKind::Buffer => "host read of tensor values (`buffer`)",
            BreakKind::Storage => "read of a tensor's storage (`storage`)",
            BreakKind::Realize => "explicit realization (`realize`)",
            BreakKind::ToDevice => "device copy of a pending value (`to_device`)",
            BreakKind::MapHost => "opaque host function (`map_host`)",
            BreakKind::DataDependentShape => {
                "output shape depends on the data (`nonzero`, `argwhere`, `masked_select`, `unique`)"
            }
        }
    }

    /// How to avoid the break, for reports.
    pub fn hint(self) -> &'static str {
        match self {
            BreakKind::Item => "keep the value on the device: use `where` instead of branching on `x.sum().item()`",
            BreakKind::ToVec | BreakKind::Buffer | BreakKind::Storage => {
                "return the tensor from the compiled function and read it after the call"
            }
            BreakKind::Display => "print outside the compiled function: return the tensor and print the result",
            BreakKind::Realize => "remove the `realize`: a compiled function realizes its outputs when it returns",
            BreakKind::ToDevice => "move inputs to the device before calling the compiled function",
            BreakKind::MapHost => "express it with tensor ops, or move it outside the compiled function",
            BreakKind::DataDependentShape => {
                "use a fixed-size alternative (`masked_fill`, `where`, `topk`) or move it out of the compiled function"
            }
        }
    }

    /// Reads of values break even when nothing is pending (they are host syncs in the
    /// function); a `realize` or `to_device` of computed values does nothing, so breaks nothing.
    fn reads_value(self) -> bool {
        !matches!(self, BreakKind::Realize | BreakKind::Storage | BreakKind::ToDevice)
    }
}

/// One place where a compiled function's graph was cut.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphBreak {
    /// `GB0001`, `GB0002`, ...: one per distinct (kind, location) of a function, numbered in
    /// order of first occurrence, so the same program always gets the same ids.
    pub id: String,
    /// What broke the graph.
    pub kind: BreakKind,
    /// Why it breaks a graph ([`BreakKind::reason`]).
    pub reason: String,
    /// How to avoid it ([`BreakKind::hint`]).
    pub hint: String,
    /// The user's line (for `Display`: where the printed tensor was computed, since formatting
    /// machinery hides the caller).
    pub location: Option<&'static Location<'static>>,
}

impl GraphBreak {
    /// `file:line`, or `unknown location`.
    pub fn location_text(&self) -> String {
        self.location.map_or("unknown location".into(), |l| format!("{}:{}", l.file(), l.line()))
    }
}

impl fmt::Display for GraphBreak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}: {}; hint: {}", self.id, self.location_text(), self.reason, self.hint)
    }
}

/// Marks the outermost host read in progress; the graph break it causes is reported as that
/// API at that line. Inner reads (`item` -> `to_vec` -> ...) leave it alone.
pub(crate) struct HostRead(bool);

impl HostRead {
    pub(crate) fn enter(kind: BreakKind, location: Option<&'static Location<'static>>) -> HostRead {
        READ.with(|r| match r.get() {
            Some(_) => HostRead(false),
            None => {
                r.set(Some((kind, location)));
                HostRead(true)
            }
        })
    }
}

impl Drop for HostRead {
    fn drop(&mut self) {
        if self.0 {
            READ.with(|r| r.set(None));
        }
    }
}

/// Time and counts of a compiled function's calls.
#[derive(Clone, Debug, Default)]
pub struct CallStats {
    /// Calls of the function.
    pub calls: usize,
    /// Graphs served by the cache.
    pub graph_hits: usize,
    /// Graphs that missed the cache (compiled or run eagerly).
    pub graph_misses: usize,
    /// Time from a graph's capture to its cached executable on hits: capturing the graph,
    /// hashing it, finding and confirming the entry (the guard check).
    pub hit_check: Duration,
    /// Time running graphs (compiled code or the interpreter).
    pub run: Duration,
    /// Whole calls, function body included.
    pub total: Duration,
    /// The host's time in these calls by phase ([`crate::profile`]): capture, hash, structural
    /// comparison, guards, compiles, runs, differentiation (and how many forward graphs were
    /// differentiated, or found differentiated).
    pub host: HostTimes,
    /// Calls replayed without running the body ([`CompiledFn::replay`]).
    pub replays: usize,
}

/// A function compiled by [`compile`]: call it like the function; see the module docs. It
/// belongs to the thread that made it (stances and running frames are per thread).
pub struct CompiledFn<F> {
    f: F,
    state: Rc<RefCell<FnState>>,
}

/// Compiles `f` (lazily: graphs compile on first use, and again when a guard fails).
///
/// ```
/// use coil_frontend::{dynamo, Tensor};
/// let f = dynamo::compile(|a: &[Tensor]| Ok(vec![(a[0].exp()? + 1.0).log()?]));
/// let x = Tensor::from_vec(vec![0.0f32, 1.0], &[2]).unwrap();
/// let y = &f.call(&[&x]).unwrap()[0];
/// assert!((y.to_vec::<f32>().unwrap()[0] - 2f32.ln()).abs() < 1e-6);
/// f.call(&[&x]).unwrap();
/// assert_eq!(f.compile_count(), 1); // the second call hit the cache
/// ```
pub fn compile<F>(f: F) -> CompiledFn<F>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let state = FnState::new(name_of::<F>());
    CompiledFn { f, state: Rc::new(RefCell::new(state)) }
}

/// A readable name from a function's type: `two_breaks` for a fn item, `closure in my_test`
/// for a closure.
pub(crate) fn name_of<F>() -> String {
    let full = std::any::type_name::<F>();
    let parts: Vec<&str> = full.split("::").collect();
    match parts.iter().rposition(|p| *p != "{{closure}}") {
        Some(i) if i + 1 < parts.len() => format!("closure in {}", parts[i]),
        Some(i) => parts[i].to_string(),
        None => full.to_string(),
    }
}

impl<F> CompiledFn<F>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>>,
{
    /// The name logs and errors use (by default derived from the function's type).
    pub fn named(self, name: impl Into<String>) -> Self {
        self.state.borrow_mut().name = name.into();
        self
    }

    /// Replays its graphs on a GPU from CUDA graphs (torch.compile's `mode="reduce-overhead"`;
    /// off by default): a graph's launches are captured at its second call and replayed with
    /// one launch from then on, which spares the host a launch per kernel. Graphs of symbolic
    /// sizes or that draw random numbers run as usual, as does anything on the CPU. An input at
    /// another address than at the capture is copied into the graph's own buffer first. The
    /// outputs are the graph's buffers, written again by the next call: use a value before the
    /// next call (or copy it); a tensor of an earlier call's output is stale afterwards (an
    /// error on use). See `coil_runtime::cuda::graphs`.
    ///
    /// ```
    /// use coil_frontend::{dynamo, Tensor};
    /// let f = dynamo::compile(|a: &[Tensor]| Ok(vec![a[0].exp()?])).cuda_graphs(true);
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0], &[2]).unwrap();
    /// assert_eq!(f.call(&[&x]).unwrap()[0].to_vec::<f32>().unwrap()[0], 1.0);
    /// ```
    pub fn cuda_graphs(self, on: bool) -> Self {
        self.state.borrow_mut().cuda_graphs = on;
        self
    }

    /// Replays calls without running the function's body (tinygrad's `TinyJit`; off by
    /// default). Once two consecutive calls ran the same single graph the same way (no graph
    /// break, the same captured tensors, in-place updates written over their targets), a call
    /// checks its arguments' dtypes, sizes and devices, binds the tensors the graph read to
    /// their current elements and runs the compiled graph (from a CUDA graph with
    /// [`CompiledFn::cuda_graphs`]): no lazy ops recorded, no graph walked, a few microseconds
    /// of host time. Anything that fails a check runs the body as usual (and two agreeing calls
    /// arm the replay again).
    ///
    /// **The contract**: the body must depend only on its tensor arguments (their dtypes, sizes
    /// and values) and on the tensors it captures, never on other Rust state (a counter, a
    /// `Vec` length, a value read before the call), since a replay does not run it:
    /// - a captured tensor is bound to its *allocation*: updating it in place between calls
    ///   ([`crate::update_in_place`], `add_`, an optimizer step) is seen; rebinding the Rust
    ///   variable to another tensor is not (replays keep reading the old one);
    /// - a tensor the body makes from host data at each call (a position from a `usize`) keeps
    ///   the replay off: pass such values as arguments (0-d tensors computed on the device);
    /// - in-place updates ([`crate::update_in_place_with`]) of captured tensors are replayed:
    ///   the new values are written over the same buffers. The tensors the traced call left in
    ///   the Rust variables see them, and are not made stale by a replay (older handles of
    ///   the tensors see them too); Rust state the body changes besides (a length) is not
    ///   changed by a replay.
    ///
    /// [`CompiledFn::replay_check`] traces every N-th replayable call and errors if the body
    /// no longer runs what the replays run. Random ops replay (they take the counters the body
    /// would have taken). Graphs compiled for symbolic sizes replay at the sizes of the calls
    /// that armed them: another size traces, since the body's dependence on sizes is hidden in
    /// Rust code.
    ///
    /// ```
    /// use coil_frontend::{dynamo, update_in_place_with, Tensor};
    /// use std::cell::{Cell, RefCell};
    /// // A running sum in a captured buffer, written in place at each call.
    /// let total = RefCell::new(Tensor::from_vec(vec![0.0f32; 2], &[2])?);
    /// let bodies = Cell::new(0);
    /// let step = dynamo::compile(|a: &[Tensor]| {
    ///     bodies.set(bodies.get() + 1);
    ///     let mut total = total.borrow_mut();
    ///     let new = &*total + &a[0];
    ///     let doubled = &new * 2.0;
    ///     *total = update_in_place_with(&[(&*total, &new)], &[])?.remove(0);
    ///     Ok(vec![doubled])
    /// })
    /// .replay(true)
    /// .replay_check(0);
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// for _ in 0..5 {
    ///     step.call(&[&x])?;
    /// }
    /// assert_eq!((bodies.get(), step.stats().replays), (2, 3)); // two traced calls armed it
    /// assert_eq!(total.borrow().to_vec::<f32>()?, vec![5.0, 10.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn replay(self, on: bool) -> Self {
        self.state.borrow_mut().replay.on = on;
        self
    }

    /// With [`CompiledFn::replay`], every `every`-th replayable call runs the body instead and
    /// checks that it ran what the replays run (the same graph, captured tensors, outputs and
    /// in-place writes): an error naming the difference if not, a broken purity contract. `0`
    /// never checks; the default is [`DEFAULT_REPLAY_CHECK`].
    pub fn replay_check(self, every: usize) -> Self {
        self.state.borrow_mut().replay.check_every = every;
        self
    }

    /// Why calls are not replayed now (the last traced call did not arm the replay), if they
    /// are not; `None` when replay is armed or off.
    pub fn replay_blocker(&self) -> Option<String> {
        let state = self.state.borrow();
        state.replay.blocker.clone().filter(|_| state.replay.on)
    }

    /// Runs the function: arguments are computed first, its graphs come from the guarded
    /// cache (compiled on a miss), and the outputs are computed when it returns (or, with
    /// [`CompiledFn::replay`], its compiled graph runs without the body).
    #[track_caller]
    pub fn call(&self, args: &[&Tensor]) -> Result<Vec<Tensor>> {
        let (start, host) = (Instant::now(), host_times());
        let result = match replay::try_replay(&self.state, args, Location::caller()) {
            Some(result) => {
                self.state.borrow_mut().stats.replays += result.is_ok() as usize;
                result
            }
            None => self.trace(args, Location::caller()),
        };
        let mut state = self.state.borrow_mut();
        state.stats.calls += 1;
        state.stats.total += start.elapsed();
        state.stats.host.add(&host_times().since(&host));
        result
    }

    /// A call that runs the body (recorded for replay when the function replays).
    fn trace(&self, args: &[&Tensor], call_site: &'static Location<'static>) -> Result<Vec<Tensor>> {
        let mut frame = Frame::new(self.state.clone(), args, call_site, None)?;
        let replaying = self.state.borrow().replay.on;
        if replaying {
            frame.recording = Some(replay::Recording::new());
        }
        let (outputs, frame) = run_frame(&self.f, args, frame)?;
        if let Some(recording) = frame.recording {
            let trace = replay::Trace::new(recording, &frame.args, args, &outputs);
            replay::after_trace(&self.state, trace)?;
        }
        Ok(outputs)
    }

    /// Runs the function once under [`explain()`]'s recording, with a cache of its own (this
    /// function's cache and counters are left as they are).
    #[track_caller]
    pub fn explain(&self, args: &[&Tensor]) -> Result<ExplainReport> {
        let state = Rc::new(RefCell::new(FnState::new(self.state.borrow().name.clone())));
        let frame = Frame::new(state, args, Location::caller(), Some(ExplainLog::default()))?;
        let (outputs, frame) = run_frame(&self.f, args, frame)?;
        Ok(ExplainReport::new(frame.log.unwrap_or_default(), outputs))
    }

    /// Graphs compiled for this function (cache misses, recompiles included; eager runs past
    /// the recompile limit excluded).
    pub fn compile_count(&self) -> usize {
        self.state.borrow().entries.len()
    }

    /// Recompiles so far.
    pub fn recompile_count(&self) -> usize {
        self.state.borrow().recompiles
    }

    /// One line per recompile, naming the failed guard with old and new values, e.g.
    /// `recompiling f (2nd time): input 0 dtype f32 -> bf16`.
    pub fn recompile_reasons(&self) -> Vec<String> {
        self.state.borrow().recompile_reasons.clone()
    }

    /// The distinct graph breaks seen so far, in order of first occurrence.
    pub fn graph_breaks(&self) -> Vec<GraphBreak> {
        self.state.borrow().breaks.clone()
    }

    /// Warnings given (the recompile limit), each also printed once on stderr.
    pub fn warnings(&self) -> Vec<String> {
        self.state.borrow().warnings.clone()
    }

    /// Whether the recompile limit was reached (new graphs run eagerly).
    pub fn is_eager(&self) -> bool {
        self.state.borrow().eager
    }

    /// The guards of every compiled graph, in compile order.
    pub fn guards(&self) -> Vec<Vec<Guard>> {
        self.state.borrow().entries.iter().map(|e| e.guards.clone()).collect()
    }

    /// The time and counts of the calls so far.
    pub fn stats(&self) -> CallStats {
        self.state.borrow().stats.clone()
    }
}

/// A function's guarded cache and what it has seen.
pub(crate) struct FnState {
    name: String,
    entries: Vec<Entry>,
    /// The entry that served each graph of the last call (by its place in the call), when one
    /// did: what the next call's graph at that place is compared with first.
    served: Vec<Option<usize>>,
    by_hash: HashMap<u64, Vec<usize>>,
    /// Entries compiled for symbolic sizes, by [`guards::erased_hash`].
    by_erased: HashMap<u64, Vec<usize>>,
    /// The forward graphs its `value_and_grad` calls differentiated, most recently used first
    /// (at most [`DIFFERENTIATED_LIMIT`]).
    differentiated: Vec<Rc<Differentiated>>,
    breaks: Vec<GraphBreak>,
    /// Whether its graphs are replayed from CUDA graphs ([`CompiledFn::cuda_graphs`]).
    cuda_graphs: bool,
    /// Calls replayed without the body ([`CompiledFn::replay`]).
    replay: replay::Replay,
    recompiles: usize,
    recompile_reasons: Vec<String>,
    eager: bool,
    warnings: Vec<String>,
    stats: CallStats,
}

impl FnState {
    pub(crate) fn new(name: String) -> FnState {
        FnState {
            name,
            entries: vec![],
            served: vec![],
            by_hash: HashMap::new(),
            by_erased: HashMap::new(),
            differentiated: vec![],
            breaks: vec![],
            cuda_graphs: false,
            replay: replay::Replay::new(DEFAULT_REPLAY_CHECK),
            recompiles: 0,
            recompile_reasons: vec![],
            eager: false,
            warnings: vec![],
            stats: CallStats::default(),
        }
    }

    /// Remembers which entry served the graph at `position` of a call (`None`: it ran eagerly).
    fn serve(&mut self, position: usize, entry: Option<usize>) {
        if self.served.len() <= position {
            self.served.resize(position + 1, None);
        }
        self.served[position] = entry;
    }

    /// The entry holding this graph on this device: hash first, then the full comparison.
    fn lookup(&self, hash: u64, graph: &Graph, device: Device, donations: &[Donation]) -> Option<usize> {
        let candidates = self.by_hash.get(&hash)?;
        candidates.iter().copied().find(|&i| {
            let e = &self.entries[i];
            e.device == device && e.donations == donations && same_structure(&e.graph, graph)
        })
    }

    /// The entry compiled for symbolic sizes that serves this graph: same program up to sizes,
    /// and every size the expression of the compiled one at this graph's symbol values.
    fn lookup_dynamic(&self, graph: &Graph, device: Device) -> Option<usize> {
        if self.by_erased.is_empty() {
            return None;
        }
        let candidates = self.by_erased.get(&guards::erased_hash(graph, device))?;
        candidates.iter().copied().find(|&i| {
            let e = &self.entries[i];
            e.device == device
                && coil_ir::dynamic::same_up_to_sizes(&e.graph, graph)
                && e.dynamic.as_ref().is_some_and(|spec| spec.bind(graph).is_some())
        })
    }
}

/// Tells an `explain` running on this thread (if one is) that [`crate::value_and_grad`] at
/// `location` used `differentiated`, with what its template stage did.
pub(crate) fn note_differentiation(differentiated: &Differentiated, location: &'static Location<'static>) {
    frame::explain_note(|| explain::DifferentiationInfo {
        location,
        device: differentiated.device,
        templates: differentiated.templates.clone(),
    })
}

/// The differentiated graphs of the compiled function running on this thread (the innermost):
/// [`crate::value_and_grad`] looks there before it differentiates. `None` outside compiled
/// functions.
pub(crate) fn differentiated_cache() -> Option<DifferentiatedCache> {
    frame::innermost_state().map(DifferentiatedCache)
}

/// A compiled function's differentiated graphs (see [`differentiated_cache`]).
pub(crate) struct DifferentiatedCache(Rc<RefCell<FnState>>);

impl DifferentiatedCache {
    /// The differentiation of the forward graph `walk` is, if the function made it before:
    /// compared node by node with each forward graph kept, most recently used first (a
    /// mismatch shows within the first few nodes, so no hash is needed to pick candidates).
    pub(crate) fn find(&self, walk: &Walk) -> Option<Rc<Differentiated>> {
        let t = Instant::now();
        let mut state = self.0.borrow_mut();
        let kept = &mut state.differentiated;
        let found = kept.iter().position(|d| d.device == walk.device() && walk.matches(&d.forward)).map(|i| {
            let d = kept.remove(i);
            kept.insert(0, d.clone());
            d
        });
        crate::profile::spent(t, |t| &mut t.confirm);
        found
    }

    /// Keeps a new differentiation (forgetting the least recently used past the limit).
    pub(crate) fn insert(&self, differentiated: Rc<Differentiated>) {
        let kept = &mut self.0.borrow_mut().differentiated;
        kept.insert(0, differentiated);
        kept.truncate(DIFFERENTIATED_LIMIT);
    }
}
