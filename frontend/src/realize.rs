//! Capture and realize: from lazy tensors to a graph, and from a graph to values.
//!
//! [`capture`] walks the DAG behind some tensors and records every pending node they depend on
//! as one [`Graph`]; computed tensors enter it as inputs. [`realize`] captures, decomposes to
//! primitives and runs the graph, then binds the results to the tensors, and lets go of the
//! history behind them that no later gradient can need ([`crate::history`]).

use crate::compile::Donated;
use crate::storage::Storage;
use crate::tensor::Tensor;
use crate::walk::Walk;
use coil_ir::{Graph, RandomState, Result};
use coil_runtime::{Buffer, Device};
use std::cell::Cell;
use std::sync::{Arc, OnceLock};

/// A captured graph and the storage bound to its inputs.
pub struct Captured {
    /// The graph captured from the pending tensors.
    pub graph: Graph,
    /// One computed tensor's elements per graph input, in input order.
    pub inputs: Vec<Storage>,
    /// Where each of the graph's random streams starts, in stream order: the run-time
    /// arguments of its random ops (see [`capture`]).
    pub random: Vec<RandomState>,
    /// The device the graph runs on (its outputs' device).
    pub device: Device,
    /// Per graph input, the dims marked dynamic ([`Tensor::mark_dynamic`]), one bit per dim.
    pub marked: Vec<u64>,
}

/// Records the pending computation behind `outputs` as one graph.
///
/// The graph's outputs are `outputs` in order. Nodes are numbered in a depth-first post-order
/// from the outputs, so the same program always prints the same graph.
///
/// Random ops (`rand`, `randn`, `dropout`) draw from the graph's *random streams*, one per key
/// (seed) they use, in order of first appearance; a stream starts at the first counter drawn
/// with its key, and each op keeps its offset from there as an attribute. The streams' values
/// ([`Captured::random`]) are arguments of the run, not part of the graph: a program that
/// draws new numbers each time (a training step's dropout) is the same graph each time, and
/// compiles once.
///
/// ```
/// use coil_frontend::{capture, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
/// let y = x.exp().unwrap();
/// let g = capture(&[&y]).graph;
/// assert_eq!(g.to_string(), "graph(%0: f32[2]) {\n  %1: f32[2] = exp(%0)\n  return (%1)\n}\n");
/// ```
pub fn capture(outputs: &[&Tensor]) -> Captured {
    let start = std::time::Instant::now();
    let captured = Walk::new(outputs, &[]).captured();
    crate::profile::spent(start, |t| &mut t.capture);
    captured
}

/// Computes every pending tensor among `outputs` and binds the results to them: one graph per
/// device. Inside a compiled function this is a graph break ([`crate::dynamo`]). On a GPU the
/// run is enqueued, not waited for (see [`synchronize`]).
#[track_caller]
pub fn realize(outputs: &[&Tensor]) -> Result<()> {
    // Each tensor as it stands after in-place ops ([`crate::alias`]).
    let current: Vec<Tensor> = outputs.iter().map(|t| t.current()).collect();
    let outputs: Vec<&Tensor> = current.iter().collect();
    if crate::dynamo::tracing() {
        return crate::dynamo::host_read(&outputs, std::panic::Location::caller());
    }
    let pending: Vec<&Tensor> = outputs.iter().copied().filter(|t| !t.is_realized()).collect();
    if let Some(e) = pending.iter().find_map(|t| t.invalid()) {
        return Err(e.clone());
    }
    let mut devices: Vec<Device> = pending.iter().map(|t| t.device()).collect();
    devices.dedup();
    let mut walked = 0;
    for device in devices {
        let group: Vec<&Tensor> = pending.iter().copied().filter(|t| t.device() == device).collect();
        let start = std::time::Instant::now();
        let walk = Walk::new(&group, &[]);
        crate::profile::spent(start, |t| &mut t.capture);
        walked += walk.len();
        let results = run(&walk, std::panic::Location::caller())?;
        for (t, storage) in group.iter().zip(results) {
            let _ = t.0.storage.set(storage);
        }
    }
    // What no later `grad` can need of the computed tensors' history goes now; the search
    // visits a few times what this realization walked, so a history that stays costs no more.
    crate::history::release(&pending, 4 * walked + 64);
    Ok(())
}

pub use coil_ir::config::Backend;

thread_local! {
    static BACKEND: Cell<Option<Backend>> = const { Cell::new(None) };
    static CUDA_GRAPHS: Cell<Option<bool>> = const { Cell::new(None) };
    static EAGER_TIER: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Replays this thread's realizations on a GPU from CUDA graphs (off by default), as
/// [`crate::dynamo::CompiledFn::cuda_graphs`] does for a compiled function: a graph realized
/// again and again with the same structure (a decode step, with its KV cache written in place
/// by [`crate::update_in_place_with`]) is captured at its second run and replayed with one
/// launch from then on. The outputs are the graph's buffers, written again by its next replay:
/// a tensor of an earlier replay's output is stale afterwards (an error on use), so use a value
/// (or copy it) before the same graph runs again. Graphs of symbolic sizes, that draw random
/// numbers or that run on the CPU run as usual. Overrides the configuration's `cuda_graphs`
/// ([`coil_ir::config::Config::cuda_graphs`]) on this thread. Returns the previous setting.
///
/// ```
/// let was = coil_frontend::set_cuda_graphs(true);
/// let x = coil_frontend::Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
/// assert_eq!(x.exp().unwrap().to_vec::<f32>().unwrap()[0], 1.0f32.exp()); // on the CPU: as usual
/// coil_frontend::set_cuda_graphs(was);
/// ```
pub fn set_cuda_graphs(on: bool) -> bool {
    let previous = cuda_graphs();
    CUDA_GRAPHS.with(|c| c.set(Some(on)));
    previous
}

/// Whether this thread's realizations replay CUDA graphs ([`set_cuda_graphs`], else the
/// configuration's `cuda_graphs`).
pub(crate) fn cuda_graphs() -> bool {
    CUDA_GRAPHS.with(|c| c.get()).unwrap_or_else(|| coil_ir::config::current().cuda_graphs)
}

/// Turns tier 0 on or off for this thread's CPU realizations ([`crate::tiered`]): off, every
/// new graph is compiled before it runs, as a test of the compiled kernels wants. Overrides the
/// configuration's `eager_tier` ([`coil_ir::config::Config::eager_tier`]) on this thread.
/// Returns the previous setting.
///
/// ```
/// let was = coil_frontend::set_eager_tier(false);
/// let x = coil_frontend::Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
/// assert_eq!(x.exp().unwrap().to_vec::<f32>().unwrap()[1], 2.0f32.exp());
/// coil_frontend::set_eager_tier(was);
/// ```
pub fn set_eager_tier(on: bool) -> bool {
    let previous = eager_tier();
    EAGER_TIER.with(|c| c.set(Some(on)));
    previous
}

/// Whether this thread's CPU realizations may run on tier 0 ([`set_eager_tier`], else the
/// configuration's `eager_tier`).
pub(crate) fn eager_tier() -> bool {
    EAGER_TIER.with(|c| c.get()).unwrap_or_else(|| coil_ir::config::current().eager_tier)
}

/// Chooses the backend for this thread's realizations.
pub fn set_backend(backend: Backend) {
    BACKEND.with(|b| b.set(Some(backend)));
}

/// The backend in use: the one set on this thread, else the configuration's
/// ([`coil_ir::config::Config::backend`]; `COIL_BACKEND=compiled|interpreter`), else compiled
/// when a C compiler exists. Without one, coil says so once and interprets.
pub fn backend() -> Backend {
    if let Some(b) = BACKEND.with(|b| b.get()) {
        return b;
    }
    match coil_ir::config::current().backend {
        Some(Backend::Interpreter) => Backend::Interpreter,
        _ if coil_runtime::cpu::c_compiler().is_none() => {
            static WARNED: OnceLock<()> = OnceLock::new();
            WARNED.get_or_init(|| {
                eprintln!(
                    "coil: no C compiler found (tried the configured one or $CC, cc, gcc, clang): running graphs \
                     with the reference interpreter"
                )
            });
            Backend::Interpreter
        }
        _ => Backend::Compiled,
    }
}

/// Runs the graph of a walk on the current backend and its device, for values the user asked
/// for at `origin`: on the CPU, a graph not compiled yet may run on tier 0 while it compiles
/// ([`crate::tiered`]).
fn run(walk: &Walk, origin: &'static std::panic::Location<'static>) -> Result<Vec<Storage>> {
    match backend() {
        Backend::Interpreter => interpret(&walk.captured()),
        Backend::Compiled => {
            let (compiled, graph) = match crate::tiered::route(walk, origin)? {
                crate::tiered::Route::Compiled(compiled, graph) => (compiled, graph),
                crate::tiered::Route::Done(outputs) => return Ok(outputs),
            };
            let inputs = walk.input_storages();
            let replay = cuda_graphs();
            let origin = compiled.origin(origin, |i| walk.node_source(i));
            crate::guard::guard("running", &graph, || {
                compiled.run_or_replay(replay, &inputs, walk.random(), origin, Donated::Overwritten)
            })
        }
    }
}

/// A captured node's line and its operands (`dtype[shape]`), for naming a compiled graph's
/// data error as the interpreter names it ([`crate::compile::Compiled::origin`]).
pub(crate) type NodeSource = (Option<&'static std::panic::Location<'static>>, Vec<String>);

/// [`NodeSource`] of node `i` of a captured graph.
pub(crate) fn graph_node_source(graph: &Graph, i: usize) -> Option<NodeSource> {
    let node = graph.nodes.get(i)?;
    Some((node.location, node.inputs.iter().map(|&x| graph.meta(x).to_string()).collect()))
}

/// Waits for every GPU's queued work and reports the first data error one of its kernels
/// found (an index out of bounds, ...) since the last synchronization point, named by the
/// kernel and the line that asked for its run (`torch.cuda.synchronize`). Runs on a GPU return
/// without waiting for their kernels; host reads (`to_vec`, `item`, printing) synchronize
/// too. Nothing to do on the CPU, whose runs are synchronous.
///
/// ```
/// let x = coil_frontend::Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
/// x.exp().unwrap().realize().unwrap();
/// coil_frontend::synchronize().unwrap();
/// ```
pub fn synchronize() -> Result<()> {
    coil_runtime::cuda::synchronize_all()
}

/// Runs a captured graph on the reference interpreter (also how compiled functions run eagerly).
pub(crate) fn interpret(captured: &Captured) -> Result<Vec<Storage>> {
    let start = std::time::Instant::now();
    let outputs = crate::guard::guard("interpreting", &captured.graph, || interpret_unguarded(captured));
    crate::profile::record(|t| {
        t.graphs += 1;
        t.run += start.elapsed();
    });
    outputs
}

fn interpret_unguarded(captured: &Captured) -> Result<Vec<Storage>> {
    // The oracle runs on the host whatever the device; results go back to the device.
    let primitive = coil_passes::decompose(&captured.graph)?;
    let hosts = captured.inputs.iter().map(|s| s.to_host()).collect::<Result<Vec<_>>>()?;
    let inputs: Vec<&Buffer> = hosts.iter().map(|b| b.as_ref()).collect();
    let outputs = coil_runtime::interpret_with(&primitive, &inputs, &captured.random)?;
    outputs.into_iter().map(|b| Storage::host(Arc::new(b)).to_device(captured.device)).collect()
}
