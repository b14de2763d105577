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
//!    where the program generalizes ([`crate::compile::compile_ahead`]): one compile serves
//!    every later shape;
//! 3. the same graph at the same sizes realized again while that compile is in flight runs on
//!    tier 0 up to [`WAIT_AFTER`] times, then waits for the compile: a loop, where the
//!    compiled graph pays off;
//! 4. a background compile that failed is not lost: the next realization of that structure
//!    compiles in the foreground and reports its error (that is step 5 for it);
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
use std::collections::HashMap;
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

/// A compile of one structure running on a background thread.
struct Job {
    /// The graph it compiles (its structure is the job's).
    graph: Arc<Graph>,
    device: Device,
    config: Arc<Config>,
    /// `None` while it runs; then its outcome.
    done: Done,
    /// Tier-0 runs per exact graph (structural hash with sizes) while it runs.
    runs: HashMap<u64, u32>,
}

impl Job {
    fn outcome(&self) -> Option<Result<()>> {
        self.done.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A job's outcome, once it is there.
fn wait(done: &Done) -> Result<()> {
    let (lock, ready) = &**done;
    let mut d = lock.lock().unwrap_or_else(|e| e.into_inner());
    while d.is_none() {
        d = ready.wait(d).unwrap_or_else(|e| e.into_inner());
    }
    d.clone().expect("set before the notification")
}

/// Where a job's outcome is put, and the signal that it was.
type Done = Arc<(Mutex<Option<Result<()>>>, Condvar)>;

/// Background compiles by the structure's hash without sizes.
fn jobs() -> &'static Mutex<HashMap<u64, Vec<Job>>> {
    static JOBS: OnceLock<Mutex<HashMap<u64, Vec<Job>>>> = OnceLock::new();
    JOBS.get_or_init(Default::default)
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

/// Background compiles in flight now.
pub fn pending() -> usize {
    let jobs = jobs().lock().unwrap_or_else(|e| e.into_inner());
    jobs.values().flatten().filter(|j| j.outcome().is_none()).count()
}

/// Waits for every background compile in flight (their errors are reported by the
/// realizations that would use them, not here).
pub fn wait_for_background_compiles() {
    let waits: Vec<_> = {
        let jobs = jobs().lock().unwrap_or_else(|e| e.into_inner());
        jobs.values().flatten().map(|j| j.done.clone()).collect()
    };
    for done in waits {
        let _ = wait(&done);
    }
}

/// Where the graph `walk` captures runs (see the module doc), for a realization asked for at
/// `origin`; the tier-0 outputs when it ran there.
pub(crate) fn route(walk: &Walk, origin: &'static std::panic::Location<'static>) -> Result<Route> {
    let config = coil_ir::config::current();
    let device = walk.device();
    if !config.eager_tier || device != Device::Cpu {
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
        j.device == device && j.config.same_code(&config) && coil_ir::dynamic::same_up_to_sizes(&j.graph, &graph)
    };
    let mut all = jobs().lock().unwrap_or_else(|e| e.into_inner());
    let list = all.entry(erased).or_default();
    let job = list.iter().position(same);
    match job.map(|i| (i, list[i].outcome())) {
        // In flight: tier 0, unless this graph came back often enough to wait for it.
        Some((i, None)) => {
            let runs = list[i].runs.entry(exact).or_default();
            if *runs >= WAIT_AFTER {
                let waited = list[i].done.clone();
                drop(all);
                let outcome = wait(&waited);
                return foreground(graph, device, outcome);
            }
        }
        // Finished, and still no compiled graph serves this one: failed (reported now, by a
        // compile in the foreground), or made for another size; a new one starts below.
        Some((i, Some(outcome))) => {
            list.remove(i);
            if outcome.is_err() {
                drop(all);
                return foreground(graph, device, outcome);
            }
        }
        None => {}
    }
    drop(all);
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
            let mut job = start(graph.clone(), device, config.clone());
            job.runs.insert(exact, 1);
            list.push(job);
        }
    }
    drop(all);
    run(&plan, walk, origin).map(Route::Done)
}

/// After a compile finished: the compiled graph that serves `graph` now, else (it failed, or
/// served another size) a compile in the foreground, which reports any error.
fn foreground(graph: Arc<Graph>, device: Device, outcome: Result<()>) -> Result<Route> {
    let _ = outcome; // an error comes back from the compile below, at this realization
    let (compiled, graph) = crate::compile::compile_walked(graph, device, &[])?;
    Ok(Route::Compiled(compiled, graph))
}

/// Starts compiling `graph` on a new thread under `config`.
fn start(graph: Arc<Graph>, device: Device, config: Arc<Config>) -> Job {
    let done: Done = Arc::new((Mutex::new(None), Condvar::new()));
    let (g, c, d) = (graph.clone(), config.clone(), done.clone());
    let spawned = std::thread::Builder::new().name("coil-compile".into()).spawn(move || {
        let outcome = coil_ir::config::with_config(c, || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| crate::compile::compile_ahead(&g, device)))
                .unwrap_or_else(|_| Err(coil_ir::Error::internal("the background compile panicked")))
        });
        let (lock, ready) = &*d;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
        ready.notify_all();
    });
    if let Err(e) = spawned {
        // no thread: the next realization compiles in the foreground
        *done.0.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Err(coil_ir::Error::runtime(format!("cannot start a compile thread: {e}"))));
    }
    Job { graph, device, config, done, runs: HashMap::new() }
}

/// The tier-0 plan of a captured graph, or why it has none.
fn tier0_plan(graph: &Graph) -> std::result::Result<Plan, String> {
    let primitive = coil_passes::decompose(graph).map_err(|e| e.message)?;
    Plan::new(primitive)
}

/// Runs a plan on the walk's inputs.
fn run(plan: &Plan, walk: &Walk, origin: &'static std::panic::Location<'static>) -> Result<Vec<Storage>> {
    let start = std::time::Instant::now();
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
