//! Tiered execution of CPU realizations: a graph this process has no compiled form of yet runs
//! at once on tier 0 (`coil_runtime::cpu::eager`, kernels built with the crate), while its
//! compile runs on a background thread; later realizations of that structure use the compiled
//! graph as soon as it is ready. So everyday eager code on new shapes never waits for the C
//! compiler (about 85 ms a graph), and a loop still ends up on fused compiled kernels.
//!
//! The policy, per realization on the compiled backend, on the CPU, with
//! [`coil_ir::config::Config::eager_tier`] on:
//!
//! 1. a graph the process compiled (a recent run's, the compile cache's, or a compilation for
//!    symbolic sizes that serves it) runs compiled, as before;
//! 2. else, if tier 0 runs it (its ops, [`coil_runtime::cpu::eager::Plan::new`]): it runs on
//!    tier 0, and unless a compile of the same structure (the graph up to sizes, device and
//!    code settings) is in flight, one starts in the background, for symbolic sizes at once
//!    where the program generalizes (`compile::compile_ahead`): one compile serves
//!    every later shape. One worker thread runs the compiles in line, one at a time;
//! 3. the same graph at the same sizes realized again while that compile is in flight runs on
//!    tier 0 up to [`WAIT_AFTER`] times, then waits for the compile (or, still in line, runs it
//!    itself): a loop, where the compiled graph pays off;
//! 4. a background compile that failed is not lost: the next realization of that structure,
//!    and every later one, compiles in the foreground and reports its error (as it would
//!    without tier 0);
//! 5. anything else (tier 0 does not run it, the knob is off) compiles before it runs.
//!
//! The background thread runs under the caller's configuration. [`pending`] and
//! [`tier0_runs`] expose the state (tests check that a realization did not wait through
//! them, not by timing); [`wait_for_background_compiles`] waits for every compile in flight.

use crate::compile::Compiled;
use crate::storage::Storage;
use crate::walk::Walk;
use coil_ir::config::Config;
use coil_ir::{Graph, Result};
use coil_runtime::cpu::eager::Plan;
use coil_runtime::{Buffer, Device};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// Tier-0 runs of one graph (same sizes) while its structure's compile is in flight, before
/// the next realization waits for the compile instead.
pub const WAIT_AFTER: u32 = 2;

/// Where a realization runs.
pub(crate) enum Route {
    /// The compiled graph (and the captured graph it serves).
    Compiled(Arc<Compiled>, Arc<Graph>),
    /// Done on tier 0: the outputs.
    Done(Vec<Storage>),
}

/// One compile of a structure: what it compiles, and its outcome once there.
struct Task {
    /// The graph it compiles (its structure is the task's).
    graph: Arc<Graph>,
    /// The structure's hash without sizes (its key in [`jobs`]).
    erased: u64,
    device: Device,
    /// The configuration of the realization that asked for it.
    config: Arc<Config>,
    /// Set by the thread that runs it: the worker, or a realization that waits for it and
    /// found it still in line (it compiles it itself rather than wait behind others).
    taken: AtomicBool,
    /// `None` until it ran.
    outcome: Mutex<Option<Result<()>>>,
    ready: Condvar,
}

impl Task {
    fn new(graph: Arc<Graph>, erased: u64, device: Device, config: Arc<Config>) -> Arc<Task> {
        let (taken, outcome, ready) = (AtomicBool::new(false), Mutex::new(None), Condvar::new());
        Arc::new(Task { graph, erased, device, config, taken, outcome, ready })
    }

    /// Compiles, under the task's configuration, unless another thread took it.
    fn run(&self) {
        if self.taken.swap(true, Ordering::AcqRel) {
            return;
        }
        // (no pool thread lingers to spin on the core this compile wants)
        let _background = coil_runtime::cpu::jobs::Background::begin();
        let outcome = coil_ir::config::with_config(self.config.clone(), || {
            let compile = || crate::compile::compile_ahead(&self.graph, self.device);
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(compile))
                .unwrap_or_else(|_| Err(coil_ir::Error::internal("the background compile panicked")))
        });
        let compiled = outcome.is_ok();
        self.finish(outcome);
        if compiled {
            // The compiled graph is in the process's caches now: the job has served. (A failed
            // one stays, so that its structure compiles in the foreground from now on.)
            let mut jobs = jobs().lock().unwrap_or_else(|e| e.into_inner());
            if let Some(list) = jobs.get_mut(&self.erased) {
                list.retain(|j| !std::ptr::eq(Arc::as_ptr(&j.task), self));
            }
        }
    }

    fn finish(&self, outcome: Result<()>) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
        self.ready.notify_all();
    }

    fn outcome(&self) -> Option<Result<()>> {
        self.outcome.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The outcome: compiled here if the task is still in line, else waited for.
    fn wait(&self) -> Result<()> {
        self.run();
        let mut outcome = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        while outcome.is_none() {
            outcome = self.ready.wait(outcome).unwrap_or_else(|e| e.into_inner());
        }
        outcome.clone().expect("set before the notification")
    }
}

/// The background compile of a structure and the tier-0 runs it has seen.
struct Job {
    task: Arc<Task>,
    /// Tier-0 runs per exact graph (structural hash with sizes) while it is in flight.
    runs: HashMap<u64, u32>,
}

/// Background compiles by the structure's hash without sizes.
fn jobs() -> &'static Mutex<HashMap<u64, Vec<Job>>> {
    static JOBS: OnceLock<Mutex<HashMap<u64, Vec<Job>>>> = OnceLock::new();
    JOBS.get_or_init(Default::default)
}

/// Compiles waiting for the worker, and whether the worker thread is running. One worker: a
/// program with many new graphs runs one C compiler at a time beside it, not one per graph.
fn queue() -> &'static Mutex<(VecDeque<Arc<Task>>, bool)> {
    static QUEUE: OnceLock<Mutex<(VecDeque<Arc<Task>>, bool)>> = OnceLock::new();
    QUEUE.get_or_init(Default::default)
}

/// Puts a compile in line, starting the worker if it is not running.
fn enqueue(task: Arc<Task>) {
    let mut q = queue().lock().unwrap_or_else(|e| e.into_inner());
    q.0.push_back(task);
    if q.1 {
        return;
    }
    q.1 = true;
    let worker = || loop {
        let next = {
            let mut q = queue().lock().unwrap_or_else(|e| e.into_inner());
            let next = q.0.pop_front();
            q.1 = next.is_some();
            next
        };
        match next {
            Some(task) => task.run(),
            None => return,
        }
    };
    // On the background pool's thread, so that what the compile runs in parallel runs there
    // in line rather than waiting for the program's pool, which tier 0 keeps busy.
    if let Some(pool) = coil_runtime::cpu::jobs::background_pool() {
        pool.spawn(worker);
        return;
    }
    let lowered = move || {
        coil_runtime::cpu::jobs::lower_priority();
        worker()
    };
    if let Err(e) = std::thread::Builder::new().name("coil-compile".into()).spawn(lowered) {
        // No thread: what is in line fails, and the realizations that would use it compile in
        // the foreground.
        q.1 = false;
        for task in q.0.drain(..) {
            if !task.taken.swap(true, Ordering::AcqRel) {
                task.finish(Err(coil_ir::Error::runtime(format!("cannot start a compile thread: {e}"))));
            }
        }
    }
}

thread_local! {
    /// Realizations this thread ran on tier 0.
    static TIER0_RUNS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Realizations this thread ran on tier 0 (for tests and reports; per thread, so that tests
/// running beside each other do not count each other's).
pub fn tier0_runs() -> usize {
    TIER0_RUNS.with(|c| c.get())
}

/// Background compiles in flight or in line now.
pub fn pending() -> usize {
    let jobs = jobs().lock().unwrap_or_else(|e| e.into_inner());
    jobs.values().flatten().filter(|j| j.task.outcome().is_none()).count()
}

/// Waits for every background compile in flight or in line (their errors are reported by
/// the realizations that would use them, not here).
pub fn wait_for_background_compiles() {
    let tasks: Vec<Arc<Task>> = {
        let jobs = jobs().lock().unwrap_or_else(|e| e.into_inner());
        jobs.values().flatten().map(|j| j.task.clone()).collect()
    };
    for task in tasks {
        let _ = task.wait();
    }
}

/// Where the graph `walk` captures runs (see the module doc), for a realization asked for at
/// `origin`; the tier-0 outputs when it ran there.
pub(crate) fn route(walk: &Walk, origin: &'static std::panic::Location<'static>) -> Result<Route> {
    let config = coil_ir::config::current();
    let device = walk.device();
    if !crate::realize::eager_tier() || device != Device::Cpu {
        let (compiled, graph) = crate::compile::compiled_walk(walk, &[])?;
        return Ok(Route::Compiled(compiled, graph));
    }
    let graph = match crate::compile::find_walk(walk) {
        Ok((compiled, graph)) => return Ok(Route::Compiled(compiled, graph)),
        Err(graph) => graph,
    };
    let erased = crate::dynamo::guards::erased_hash(&graph, device);
    let exact = crate::dynamo::structural_hash(&graph, device);
    let same = |j: &Job| {
        let t = &j.task;
        t.device == device && t.config.same_code(&config) && coil_ir::dynamic::same_up_to_sizes(&t.graph, &graph)
    };
    let mut all = jobs().lock().unwrap_or_else(|e| e.into_inner());
    let list = all.entry(erased).or_default();
    let job = list.iter().position(same);
    match job.map(|i| (i, list[i].task.outcome())) {
        // In flight: tier 0, unless this graph came back often enough to wait for it.
        Some((i, None)) => {
            let runs = list[i].runs.entry(exact).or_default();
            if *runs >= WAIT_AFTER {
                let task = list[i].task.clone();
                drop(all);
                let outcome = task.wait();
                return foreground(graph, device, outcome);
            }
        }
        // Failed: this realization and every later one of the structure compile in the
        // foreground, which reports the error (as a realization without tier 0 would), or
        // caches the compiled graph where it succeeds now.
        Some((_, Some(Err(e)))) => {
            drop(all);
            return foreground(graph, device, Err(e));
        }
        // Finished, and still no compiled graph serves this one (it was made for another
        // size, or this size is to be specialized): a new one starts below.
        Some((i, Some(Ok(())))) => {
            list.remove(i);
        }
        None => {}
    }
    drop(all);
    let start = std::time::Instant::now(); // (planning counts as part of the run)
    let plan = match tier0_plan(&graph) {
        Ok(plan) => plan,
        Err(why) => {
            crate::logs::recompile(&format!("realize: compiled before it runs (tier 0 does not run it: {why})"));
            let (compiled, graph) = crate::compile::compile_walked(graph, device, &[])?;
            return Ok(Route::Compiled(compiled, graph));
        }
    };
    let mut all = jobs().lock().unwrap_or_else(|e| e.into_inner());
    let list = all.entry(erased).or_default();
    match list.iter_mut().find(|j| same(j)) {
        Some(job) => *job.runs.entry(exact).or_default() += 1,
        None => {
            let task = Task::new(graph.clone(), erased, device, config.clone());
            list.push(Job { task: task.clone(), runs: HashMap::from([(exact, 1)]) });
            enqueue(task);
        }
    }
    drop(all);
    run(&plan, walk, origin, start).map(Route::Done)
}

/// After a compile finished: the compiled graph that serves `graph` now, else (it failed, or
/// served another size) a compile in the foreground, which reports any error.
fn foreground(graph: Arc<Graph>, device: Device, outcome: Result<()>) -> Result<Route> {
    let _ = outcome; // an error comes back from the compile below, at this realization
    let (compiled, graph) = crate::compile::compile_walked(graph, device, &[])?;
    Ok(Route::Compiled(compiled, graph))
}

/// The tier-0 plan of a captured graph, or why it has none.
fn tier0_plan(graph: &Graph) -> std::result::Result<Plan, String> {
    let primitive = coil_passes::decompose(graph).map_err(|e| e.message)?;
    Plan::new(primitive)
}

/// Runs a plan on the walk's inputs (its time since `start` counts as the run's).
fn run(
    plan: &Plan,
    walk: &Walk,
    origin: &'static std::panic::Location<'static>,
    start: std::time::Instant,
) -> Result<Vec<Storage>> {
    let storages = walk.input_storages();
    let hosts = storages.iter().map(|s| s.to_host()).collect::<Result<Vec<_>>>()?;
    let inputs: Vec<&Buffer> = hosts.iter().map(|b| b.as_ref()).collect();
    let outputs = crate::guard::guard("running", plan.graph(), || plan.run(&inputs)).map_err(|e| e.at(origin));
    TIER0_RUNS.with(|c| c.set(c.get() + 1));
    crate::profile::record(|t| {
        t.graphs += 1;
        t.run += start.elapsed();
    });
    Ok(outputs?.into_iter().map(|b| Storage::host(Arc::new(b))).collect())
}
