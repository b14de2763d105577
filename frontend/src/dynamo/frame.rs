//! One running call of a compiled function: the frame stack, graph breaks, and the guarded
//! cache lookup of each graph (hit, compile, recompile, or eager past the limit).

use super::dynamic::{self, DynamicSpec};
use super::explain::ExplainLog;
use super::guards::{self, structural_hash, ArgMeta, Guard, Source};
use super::replay::{GraphRun, Recording};
use super::{stance, BreakKind, FnState, GraphBreak, GraphInfo, Stance, READ, RECOMPILE_LIMIT};
use crate::compile::{Compiled, Donated};
use crate::debug::Dump;
use crate::realize::{backend, graph_node_source, Backend, Captured};
use crate::storage::Storage;
use crate::walk::{Expected, Walk};
use crate::{logs, profile, Tensor};
use coil_ir::kernel::Donation;
use coil_ir::{Error, ErrorKind, Graph, Result};
use coil_runtime::Device;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::panic::Location;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

thread_local! {
    /// The compiled functions running on this thread, innermost last.
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

/// One compiled graph of a function.
pub(super) struct Entry {
    pub(super) graph: Arc<Graph>,
    /// The graph laid out for comparing walks with it (a hit's check).
    expected: Arc<Expected>,
    pub(super) device: Device,
    /// Which graph of a call it was (0 for the first; later ones follow graph breaks).
    position: usize,
    /// The call's argument metas when it compiled: to say which guard a later miss failed.
    args: Vec<ArgMeta>,
    compiled: Option<Arc<Compiled>>,
    pub(super) guards: Vec<Guard>,
    /// The symbolic sizes it was compiled for; `None` for static sizes.
    pub(super) dynamic: Option<DynamicSpec>,
    /// The outputs written over inputs' buffers (the function's in-place updates).
    pub(super) donations: Vec<Donation>,
}

/// One running call of a compiled function (or of `explain`).
pub(crate) struct Frame {
    state: Rc<RefCell<FnState>>,
    /// Each argument's storage address (to name graph inputs) and meta.
    pub(super) args: Vec<(usize, ArgMeta)>,
    call_site: &'static Location<'static>,
    /// Graphs run so far in this call.
    position: usize,
    /// Storage address -> (graph number, output index) of values earlier graphs computed.
    produced: HashMap<usize, (usize, usize)>,
    /// In-place updates the function made that no graph has run yet ([`defer_updates`]).
    updates: Vec<Update>,
    /// Tensors to compute with those updates ([`crate::update_in_place_with`]'s `also`).
    also: Vec<Tensor>,
    pub(crate) log: Option<ExplainLog>,
    /// What the call ran, when the function replays ([`super::CompiledFn::replay`]).
    pub(super) recording: Option<Recording>,
}

/// The compiled graph that served a place of the call last time ([`Frame::expected`]).
struct Served {
    compiled: Arc<Compiled>,
    graph: Arc<Graph>,
    layout: Arc<Expected>,
    donations: Vec<Donation>,
}

/// An in-place update made while tracing: `value` is written over `target`'s allocation by the
/// next graph the call runs.
struct Update {
    target: Storage,
    value: Tensor,
}

impl Frame {
    /// A frame for a call on `args`, which are computed first: a function's inputs are values
    /// when it starts.
    pub(crate) fn new(
        state: Rc<RefCell<FnState>>,
        args: &[&Tensor],
        call_site: &'static Location<'static>,
        log: Option<ExplainLog>,
    ) -> Result<Frame> {
        crate::realize::realize(args)?;
        let args = args
            .iter()
            .map(|t| (storage_addr(t.0.storage.get().expect("realized")), (t.meta().clone(), t.device())))
            .collect();
        Ok(Frame {
            state,
            args,
            call_site,
            position: 0,
            produced: HashMap::new(),
            updates: vec![],
            also: vec![],
            log,
            recording: None,
        })
    }

    fn name(&self) -> String {
        self.state.borrow().name.clone()
    }

    /// A host read while the function runs: record the break, then compute what it needs.
    fn graph_break(
        &mut self,
        kind: BreakKind,
        location: Option<&'static Location<'static>>,
        pending: Vec<Tensor>,
    ) -> Result<()> {
        let brk = self.record_break(kind, location);
        if let Some(r) = &mut self.recording {
            r.broke = true;
        }
        if stance() == Stance::FailOnGraphBreak && self.log.is_none() {
            let e = Error::unsupported(format!(
                "graph break in {} ({}): {}; hint: {} (stance FailOnGraphBreak)",
                self.name(),
                brk.id,
                brk.reason,
                brk.hint
            ))
            .in_op(kind.api(), vec![]);
            return Err(match location {
                Some(l) => e.at(l),
                None => e,
            });
        }
        if pending.is_empty() {
            return Ok(());
        }
        let live = live_values(&pending);
        self.run_graphs(pending.into_iter().chain(live).collect(), location.unwrap_or(self.call_site))
    }

    /// The break's id (new ones are numbered and logged), and its occurrence for `explain`.
    fn record_break(&mut self, kind: BreakKind, location: Option<&'static Location<'static>>) -> GraphBreak {
        let mut state = self.state.borrow_mut();
        let known = state.breaks.iter().find(|b| b.kind == kind && b.location == location).cloned();
        let brk = known.unwrap_or_else(|| {
            let brk = GraphBreak {
                id: format!("GB{:04}", state.breaks.len() + 1),
                kind,
                reason: kind.reason().to_string(),
                hint: kind.hint().to_string(),
                location,
            };
            logs::graph_break(&format!("graph break in {}: {brk}", state.name));
            state.breaks.push(brk.clone());
            brk
        });
        if let Some(log) = &mut self.log {
            log.breaks.push(brk.clone());
        }
        brk
    }

    /// Computes `tensors` (pending ones), one graph per device.
    /// `origin`: the user's line that asked for them (reported with a data error of a kernel).
    /// The in-place updates made so far run with them, their values written over their
    /// targets' buffers where the compiler can (else the targets are consumed: stale).
    fn run_graphs(&mut self, tensors: Vec<Tensor>, origin: &'static Location<'static>) -> Result<()> {
        let updates = std::mem::take(&mut self.updates);
        let also = std::mem::take(&mut self.also);
        let mut seen = HashSet::new();
        let pending: Vec<Tensor> = (tensors.into_iter().chain(updates.iter().map(|u| u.value.clone())).chain(also))
            .filter(|t| !t.is_realized() && seen.insert(Arc::as_ptr(&t.0) as usize))
            .collect();
        let mut devices: Vec<Device> = vec![];
        for t in &pending {
            if !devices.contains(&t.device()) {
                devices.push(t.device());
            }
        }
        for device in devices {
            let group: Vec<&Tensor> = pending.iter().filter(|t| t.device() == device).collect();
            self.run_graph(&group, &updates, origin)?;
        }
        for u in &updates {
            if let Some(s) = u.value.0.storage.get().filter(|s| s.addr() != u.target.addr()) {
                u.target.moved_keeping(s);
                if let Some(r) = &mut self.recording {
                    r.moved += 1;
                }
            }
        }
        Ok(())
    }

    /// Records in-place updates ([`defer_updates`]): a target that is the value of an earlier
    /// update of this call is updated again.
    fn defer(&mut self, updates: &[(&Tensor, Tensor)], also: &[&Tensor]) -> std::result::Result<(), String> {
        let earlier = |t: &Tensor| self.updates.iter().position(|u| Arc::ptr_eq(&u.value.0, &t.0));
        for (k, (target, _)) in updates.iter().enumerate() {
            let again =
                target.0.storage.get().is_some_and(|s| self.updates.iter().any(|u| u.target.addr() == s.addr()));
            if earlier(target).is_none() && again {
                return Err(format!(
                    "update {k}: its target's elements were updated earlier in this call: update the tensor that \
                     update returned"
                ));
            }
        }
        for (target, value) in updates {
            let found = self.updates.iter().position(|u| Arc::ptr_eq(&u.value.0, &target.0));
            match found {
                Some(i) => self.updates[i].value = value.clone(),
                None => {
                    let storage = target.0.storage.get().expect("checked: computed").clone();
                    self.updates.push(Update { target: storage, value: value.clone() });
                }
            }
        }
        self.also.extend(also.iter().map(|&t| t.clone()));
        Ok(())
    }

    /// Whether `t` is the value of an in-place update this call made and has not run yet.
    fn is_deferred(&self, t: &Tensor) -> bool {
        self.updates.iter().any(|u| Arc::ptr_eq(&u.value.0, &t.0))
    }

    /// Captures one graph, finds it in the guarded cache (compiling on a miss) and runs it.
    fn run_graph(&mut self, outputs: &[&Tensor], updates: &[Update], origin: &'static Location<'static>) -> Result<()> {
        let start = Instant::now();
        let expected = self.expected(outputs);
        let (walk, matches) = match &expected {
            Some(e) => Walk::matching(outputs, &e.layout),
            None => (Walk::new(outputs, &[]), false),
        };
        let donations = donations(&walk, outputs, updates);
        // The comparison is part of the walk: count it all as capture.
        profile::spent(start, |t| &mut t.capture);
        let hit = expected.filter(|e| matches && e.donations == donations).map(|e| (e.compiled, e.graph));
        if hit.is_some() {
            let mut state = self.state.borrow_mut();
            state.stats.graph_hits += 1;
            state.stats.hit_check += start.elapsed();
        }
        let results = match hit {
            Some((compiled, graph)) => {
                let t = Instant::now();
                let (inputs, random) = (walk.input_storages(), walk.random());
                let origin = compiled.origin(origin, |i| walk.node_source(i));
                let results = crate::guard::guard("running", &graph, || self.run(&compiled, &inputs, random, origin))?;
                self.state.borrow_mut().stats.run += t.elapsed();
                self.record_run(inputs, outputs, &donations, random);
                results
            }
            None => {
                let t = Instant::now();
                let captured = walk.captured();
                profile::spent(t, |t| &mut t.capture);
                let results = self.run_captured(&captured, start, origin, &donations)?;
                if self.recording.is_some() {
                    self.record_run(captured.inputs, outputs, &donations, &captured.random);
                }
                results
            }
        };
        self.position += 1;
        for (j, (t, storage)) in outputs.iter().zip(results).enumerate() {
            self.produced.insert(storage_addr(&storage), (self.position, j));
            let _ = t.0.storage.set(storage);
        }
        Ok(())
    }

    /// The compiled graph that served this place of the call last time, if it can serve again
    /// when the new capture is that graph (a static entry on the outputs' device): what the
    /// walk is compared with, node by node, which checks every guard of a static entry (no
    /// graph built, nothing hashed). This is a training loop's hit; anything else takes
    /// [`Frame::run_captured`]'s way (entries for symbolic sizes, `explain`, the interpreter).
    fn expected(&self, outputs: &[&Tensor]) -> Option<Served> {
        if self.log.is_some() || backend() != Backend::Compiled {
            return None;
        }
        let state = self.state.borrow();
        let e = &state.entries[state.served.get(self.position).copied().flatten()?];
        let device = outputs.first().map_or(Device::Cpu, |t| t.device());
        if e.dynamic.is_some() || e.device != device {
            return None;
        }
        Some(Served {
            compiled: e.compiled.clone()?,
            graph: e.graph.clone(),
            layout: e.expected.clone(),
            donations: e.donations.clone(),
        })
    }

    /// Finds a captured graph in the guarded cache (compiling on a miss) and runs it.
    fn run_captured(
        &mut self,
        captured: &Captured,
        start: Instant,
        origin: &'static Location<'static>,
        donations: &[Donation],
    ) -> Result<Vec<Storage>> {
        let device = captured.device;
        let hashed = std::cell::OnceCell::new();
        let hash = || {
            *hashed.get_or_init(|| {
                let t = Instant::now();
                let h = structural_hash(&captured.graph, device);
                profile::spent(t, |t| &mut t.hash);
                h
            })
        };
        let state_rc = self.state.clone();
        let mut state = state_rc.borrow_mut();
        // Entries for symbolic sizes first (the most recent kind of entry; one hash without
        // sizes), then the exact sizes (which also hold what sizes 0 and 1 specialize).
        let t = Instant::now();
        // Entries for symbolic sizes write nothing in place.
        let dynamic = if donations.is_empty() { state.lookup_dynamic(&captured.graph, device) } else { None };
        profile::spent(t, |t| &mut t.guards);
        let found = dynamic.or_else(|| {
            let h = hash();
            let t = Instant::now();
            let found = state.lookup(h, &captured.graph, device, donations);
            profile::spent(t, |t| &mut t.confirm);
            found
        });
        let (executable, entry) = match found {
            Some(i) => {
                state.stats.graph_hits += 1;
                state.stats.hit_check += start.elapsed();
                if state.entries[i].compiled.is_none() && backend() == Backend::Compiled {
                    // Cached while the interpreter was the backend: compile now.
                    let e = &state.entries[i];
                    let compiled = match &e.dynamic {
                        Some(spec) => crate::compile::compile_dynamic(&e.graph, device, spec)?,
                        None => crate::compile::compile_donating(&captured.graph, device, donations)?,
                    };
                    state.entries[i].compiled = Some(compiled);
                }
                (state.entries[i].compiled.clone(), Some(i))
            }
            None => {
                state.stats.graph_misses += 1;
                self.miss(&mut state, captured, hash(), donations)?
            }
        };
        state.serve(self.position, entry);
        let guards = match entry {
            Some(i) if self.log.is_some() => state.entries[i].guards.clone(),
            _ if self.log.is_some() => guards::guards_of(&captured.graph, device, hash(), &self.sources(captured)),
            _ => vec![],
        };
        drop(state);

        let t = Instant::now();
        let results = match (&executable, backend()) {
            (Some(c), Backend::Compiled) => {
                let (inputs, random) = (&captured.inputs, &captured.random);
                let origin = c.origin(origin, |i| graph_node_source(&captured.graph, i));
                crate::guard::guard("running", &captured.graph, || self.run(c, inputs, random, origin))?
            }
            _ => crate::realize::interpret(captured)?,
        };
        self.state.borrow_mut().stats.run += t.elapsed();
        if let Some(log) = &mut self.log {
            log.graphs.push(GraphInfo::new(captured, guards, executable.as_deref()));
        }
        Ok(results)
    }

    /// Runs a compiled graph of the function: replayed from a CUDA graph when the function
    /// asks for that ([`super::CompiledFn::cuda_graphs`]) and the graph can be, else as usual.
    fn run(
        &self,
        compiled: &Compiled,
        inputs: &[Storage],
        random: &[coil_ir::RandomState],
        origin: coil_runtime::RunOrigin,
    ) -> Result<Vec<Storage>> {
        let replay = self.state.borrow().cuda_graphs;
        compiled.run_or_replay(replay, inputs, random, origin, Donated::Overwritten)
    }

    /// Adds a graph run to the call's recording, when the function replays.
    fn record_run(
        &mut self,
        inputs: Vec<Storage>,
        outputs: &[&Tensor],
        donations: &[Donation],
        random: &[coil_ir::RandomState],
    ) {
        if self.recording.is_none() {
            return;
        }
        let run = {
            let state = self.state.borrow();
            let entry = state.served.get(self.position).copied().flatten();
            GraphRun {
                entry,
                compiled: entry.and_then(|i| state.entries[i].compiled.clone()),
                graph: entry.map(|i| state.entries[i].graph.clone()),
                inputs,
                outputs: outputs.iter().map(|t| Arc::as_ptr(&t.0) as usize).collect(),
                donations: donations.to_vec(),
                random: random.to_vec(),
            }
        };
        self.recording.as_mut().expect("checked above").graphs.push(run);
    }

    /// A cache miss: say why when it is a recompile, then compile (or, past the limit, run
    /// eagerly). Returns the executable and the new entry.
    fn miss(
        &self,
        state: &mut FnState,
        captured: &Captured,
        hash: u64,
        donations: &[Donation],
    ) -> Result<(Option<Arc<Compiled>>, Option<usize>)> {
        let (graph, device, position) = (&captured.graph, captured.device, self.position);
        let args: Vec<ArgMeta> = self.args.iter().map(|(_, m)| m.clone()).collect();
        let sources = self.sources(captured);
        let before = state.entries.iter().filter(|e| e.position == position).count();
        if let Some(prev) = state.entries.iter().rev().find(|e| e.position == position) {
            // Only arguments this graph reads can be the guard that failed.
            let used: Vec<usize> =
                sources.iter().filter_map(|s| if let Source::Arg(i) = s { Some(*i) } else { None }).collect();
            let failed = guards::failed_guard(&prev.args, &args, &used, (&prev.graph, prev.device), (graph, device));
            let which = match position {
                0 => state.name.clone(),
                p => format!("{} graph {}", state.name, p + 1),
            };
            let message = format!("recompiling {which} ({} time): {failed}", ordinal(before + 1));
            if stance() == Stance::FailOnRecompile && self.log.is_none() {
                return Err(Error::unsupported(format!("recompile refused (stance FailOnRecompile): {message}"))
                    .at(self.call_site));
            }
            if state.recompiles >= RECOMPILE_LIMIT {
                if !state.eager {
                    state.eager = true;
                    let warning = format!(
                        "coil: warning: {} recompiled {RECOMPILE_LIMIT} times, the limit: new graphs of it now run \
                         eagerly (uncompiled, on the reference interpreter); last failed guard: {failed}",
                        state.name
                    );
                    eprintln!("{warning}");
                    state.warnings.push(warning);
                }
                logs::recompile(&format!("{message}: over the limit, running eagerly"));
                return Ok((None, None));
            }
            state.recompiles += 1;
            logs::recompile(&message);
            state.recompile_reasons.push(message);
        }
        let (dynamic, compiled) = self.compile_entry(state, captured, donations)?;
        if let (Some(spec), true) = (&dynamic, before > 0) {
            // Say which sizes the recompile made symbolic.
            if let Some(reason) = state.recompile_reasons.last_mut() {
                reason.push_str(&format!("; now dynamic: {}", spec.symbol_text()));
            }
        }
        let guards = match &dynamic {
            Some(spec) => guards::dynamic_guards_of(graph, device, guards::erased_hash(graph, device), &sources, spec),
            None => guards::guards_of(graph, device, hash, &sources),
        };
        let text = guards::guards_text(&state.name, position + 1, &guards);
        logs::guards(&text);
        if let Some(c) = &compiled {
            Dump::at(c.dump_dir.clone()).write("guards.txt", || text.clone());
        }
        let index = state.entries.len();
        match &dynamic {
            Some(_) => state.by_erased.entry(guards::erased_hash(graph, device)).or_default().push(index),
            None => state.by_hash.entry(hash).or_default().push(index),
        }
        state.entries.push(Entry {
            graph: Arc::new(graph.clone()),
            expected: Arc::new(Expected::new(graph)),
            device,
            position,
            args,
            compiled: compiled.clone(),
            guards,
            dynamic,
            donations: donations.to_vec(),
        });
        Ok((compiled, Some(index)))
    }

    /// Compiles a missed graph: for symbolic sizes when some input dims are dynamic (marked
    /// with `mark_dynamic`, dynamic in an earlier entry of the same program, or different from
    /// an earlier entry's), else for static sizes. A graph that cannot be generalized compiles
    /// static, and the log says why. A graph with in-place writes (`donations`) compiles for
    /// static sizes.
    fn compile_entry(
        &self,
        state: &FnState,
        captured: &Captured,
        donations: &[Donation],
    ) -> Result<(Option<DynamicSpec>, Option<Arc<Compiled>>)> {
        let (graph, device) = (&captured.graph, captured.device);
        let dims = if donations.is_empty() { dynamic_dims(state, captured, self.position) } else { vec![] };
        let compile_static = || match backend() {
            Backend::Compiled => crate::compile::compile_donating(graph, device, donations).map(Some),
            Backend::Interpreter => Ok(None),
        };
        if dims.is_empty() {
            return Ok((None, compile_static()?));
        }
        let spec = match dynamic::resolve(graph, &dims) {
            Ok(spec) => spec,
            Err(why) => {
                logs::recompile(&format!("{}: sizes kept static: {why}", state.name));
                return Ok((None, compile_static()?));
            }
        };
        match backend() {
            Backend::Interpreter => Ok((Some(spec), None)),
            Backend::Compiled => match crate::compile::compile_dynamic(graph, device, &spec) {
                Ok(c) => {
                    logs::recompile(&format!("{}: compiled for dynamic sizes: {}", state.name, spec.symbol_text()));
                    Ok((Some(spec), Some(c)))
                }
                Err(e) if e.kind == ErrorKind::Unsupported => {
                    logs::recompile(&format!("{}: sizes kept static: {}", state.name, e.message));
                    Ok((None, compile_static()?))
                }
                Err(e) => Err(e),
            },
        }
    }

    /// Where each input of a captured graph comes from.
    fn sources(&self, captured: &Captured) -> Vec<Source> {
        captured
            .inputs
            .iter()
            .map(|s| {
                let addr = storage_addr(s);
                if let Some(i) = self.args.iter().position(|(a, _)| *a == addr) {
                    Source::Arg(i)
                } else if let Some(&(graph, output)) = self.produced.get(&addr) {
                    Source::GraphOutput { graph, output }
                } else {
                    Source::Captured
                }
            })
            .collect()
    }
}

/// The in-place writes of a graph: each update's value (a graph output) written over its
/// target's buffer, when the target is one graph input (not two handles to its elements). In
/// output order, so that the same program always asks for the same donations.
fn donations(walk: &Walk, outputs: &[&Tensor], updates: &[Update]) -> Vec<Donation> {
    if updates.is_empty() {
        return vec![];
    }
    // Per allocation among the inputs: the first input holding it, and whether another does.
    let mut held: HashMap<usize, (usize, bool)> = HashMap::new();
    for (k, t) in walk.input_tensors().iter().enumerate() {
        let addr = t.0.storage.get().expect("an input is computed").addr();
        held.entry(addr).and_modify(|e| e.1 = true).or_insert((k, false));
    }
    let mut found: Vec<Donation> = updates
        .iter()
        .filter_map(|u| {
            let output = outputs.iter().position(|t| Arc::ptr_eq(&t.0, &u.value.0))?;
            match held.get(&u.target.addr()) {
                Some(&(input, false)) => Some(Donation { output, input }),
                _ => None,
            }
        })
        .collect();
    found.sort_unstable_by_key(|d| d.output);
    found
}

/// The graph input dims a missed graph should make symbolic: dims marked dynamic, and, against
/// the latest entry at the same place that is the same program up to sizes, the dims that entry
/// already had symbolic and the dims whose size changed. Dims of size 0 or 1 stay static.
fn dynamic_dims(state: &FnState, captured: &Captured, position: usize) -> Vec<(usize, usize)> {
    let graph = &captured.graph;
    let mut dims: Vec<(usize, usize)> = Vec::new();
    for (j, &bits) in captured.marked.iter().enumerate() {
        dims.extend((0..graph.meta(graph.inputs[j]).rank()).filter(|d| bits >> d & 1 == 1).map(|d| (j, d)));
    }
    let previous = state.entries.iter().rev().find(|e| {
        e.position == position && e.device == captured.device && coil_ir::dynamic::same_up_to_sizes(&e.graph, graph)
    });
    if let Some(prev) = previous {
        for (j, (&a, &b)) in prev.graph.inputs.iter().zip(&graph.inputs).enumerate() {
            let (old, new) = (&prev.graph.meta(a).shape, &graph.meta(b).shape);
            dims.extend((0..new.len()).filter(|&d| old[d] != new[d]).map(|d| (j, d)));
        }
        if let Some(spec) = &prev.dynamic {
            for (j, &id) in prev.graph.inputs.iter().enumerate() {
                let shape = spec.sizes.shape(id.0, prev.graph.meta(id).rank());
                dims.extend((0..shape.len()).filter(|&d| shape[d].const_value().is_none()).map(|d| (j, d)));
            }
        }
    }
    dims.sort_unstable();
    dims.dedup();
    dims.retain(|&(j, d)| graph.meta(graph.inputs[j]).shape[d] >= 2);
    dims
}

/// Runs `f` on `args` inside `frame`, then computes its outputs (the last graph, not a
/// break). Returns the outputs and the frame.
pub(super) fn run_frame<F>(f: &F, args: &[&Tensor], frame: Frame) -> Result<(Vec<Tensor>, Frame)>
where
    F: Fn(&[Tensor]) -> Result<Vec<Tensor>> + ?Sized,
{
    let args: Vec<Tensor> = args.iter().map(|&t| t.current()).collect();
    let outputs = {
        let pushed = PushedFrame::push(frame);
        // The results as they stand after the body's in-place ops ([`crate::alias`]).
        let outputs = f(&args).map(|outs| outs.iter().map(Tensor::current).collect::<Vec<_>>());
        (outputs, pushed.pop())
    };
    let (outputs, mut frame) = outputs;
    let outputs = outputs?;
    let call_site = frame.call_site;
    frame.run_graphs(outputs.clone(), call_site)?;
    Ok((outputs, frame))
}

/// A frame on this thread's stack; popped on drop, so a panicking function leaves no frame.
pub(crate) struct PushedFrame(bool);

impl PushedFrame {
    pub(crate) fn push(frame: Frame) -> PushedFrame {
        FRAMES.with(|f| f.borrow_mut().push(frame));
        PushedFrame(true)
    }

    pub(crate) fn pop(mut self) -> Frame {
        self.0 = false;
        let frame = FRAMES.with(|f| f.borrow_mut().pop()).expect("a pushed frame");
        if !tracing() {
            crate::alias::clear_rebound();
        }
        frame
    }
}

impl Drop for PushedFrame {
    fn drop(&mut self) {
        if self.0 {
            FRAMES.with(|f| f.borrow_mut().pop());
            if !tracing() {
                crate::alias::clear_rebound();
            }
        }
    }
}

/// The state of the innermost compiled function running on this thread, if one is.
pub(super) fn innermost_state() -> Option<Rc<RefCell<FnState>>> {
    FRAMES.with(|f| f.borrow().last().map(|frame| frame.state.clone()))
}

/// Adds what `info` makes to the log of the innermost frame, if it is being explained.
pub(crate) fn explain_note(info: impl FnOnce() -> super::explain::DifferentiationInfo) {
    FRAMES.with(|f| {
        if let Some(log) = f.borrow_mut().last_mut().and_then(|frame| frame.log.as_mut()) {
            log.differentiations.push(info());
        }
    })
}

/// Whether a compiled function (or `explain`) is running on this thread.
pub(crate) fn tracing() -> bool {
    FRAMES.with(|f| !f.borrow().is_empty())
}

/// [`crate::realize::realize`] while tracing: a graph break. The frame is taken off the stack
/// while its graph compiles and runs, so nothing in there can re-enter it.
pub(crate) fn host_read(outputs: &[&Tensor], caller: &'static Location<'static>) -> Result<()> {
    let (kind, location) = READ.with(|r| r.get()).unwrap_or((BreakKind::Realize, Some(caller)));
    let pending: Vec<Tensor> = outputs.iter().filter(|t| !t.is_realized()).map(|&t| t.clone()).collect();
    if pending.is_empty() && !kind.reads_value() {
        return Ok(());
    }
    let mut taken = TakenFrame(FRAMES.with(|f| f.borrow_mut().pop()));
    taken.0.as_mut().expect("tracing").graph_break(kind, location, pending)
}

/// [`crate::update_in_place_with`] inside a compiled function: the updates (targets checked by
/// the caller: computed and current, or the value of an earlier update of this call) are
/// recorded, and the next graph the call runs computes every value and writes it over its
/// target's buffer (functionalized, as `torch.compile` does: the write-back happens at the end
/// of the graph). `also` is computed in that graph too.
/// An error says why an update cannot be made.
pub(crate) fn defer_updates(updates: &[(&Tensor, Tensor)], also: &[&Tensor]) -> std::result::Result<(), String> {
    FRAMES.with(|f| f.borrow_mut().last_mut().expect("tracing").defer(updates, also))
}

/// Whether `t` is the value of an in-place update the running compiled function made and has
/// not computed yet (it can be updated again).
pub(crate) fn is_deferred_update(t: &Tensor) -> bool {
    FRAMES.with(|f| f.borrow().last().is_some_and(|frame| frame.is_deferred(t)))
}

/// A frame taken off the stack; put back on drop (a panic included), so the stack stays
/// balanced for [`PushedFrame`].
struct TakenFrame(Option<Frame>);

impl Drop for TakenFrame {
    fn drop(&mut self) {
        if let Some(frame) = self.0.take() {
            FRAMES.with(|f| f.borrow_mut().push(frame));
        }
    }
}

/// The pending values inside the graph of `requested` that something outside that graph still
/// holds (the user's variables, later ops): they become outputs of the graph at a break, so the
/// graphs after it read them instead of computing them again. Leaves (constants, iota, random)
/// are cheaper to recompute than to store.
fn live_values(requested: &[Tensor]) -> Vec<Tensor> {
    let key = |t: &Tensor| Arc::as_ptr(&t.0) as usize;
    let _history = crate::history::read();
    let outputs: HashSet<usize> = requested.iter().map(key).collect();
    let mut seen = HashSet::new();
    let mut nodes: Vec<Tensor> = vec![];
    let mut stack: Vec<Tensor> = requested.to_vec();
    while let Some(t) = stack.pop() {
        if t.is_realized() || !seen.insert(key(&t)) {
            continue;
        }
        stack.extend(t.0.srcs(&_history).iter().cloned());
        nodes.push(t);
    }
    // Every operand edge inside the graph holds one reference; `nodes` holds one more.
    let mut inside: HashMap<usize, usize> = HashMap::new();
    for t in &nodes {
        for s in t.0.srcs(&_history) {
            *inside.entry(key(s)).or_default() += 1;
        }
    }
    nodes
        .into_iter()
        .filter(|t| {
            let k = key(t);
            !outputs.contains(&k)
                && !t.0.op.is_leaf()
                && Arc::strong_count(&t.0) > 1 + inside.get(&k).copied().unwrap_or(0)
        })
        .collect()
}

/// The address of a computed tensor's elements: identifies arguments among graph inputs.
fn storage_addr(s: &Storage) -> usize {
    s.addr()
}

/// `1st`, `2nd`, `3rd`, `4th`, ..., `11th`, `21st`.
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}
