//! Capture and realize: from lazy tensors to a graph, and from a graph to values.
//!
//! [`capture`] walks the DAG behind some tensors and records every pending node they depend on
//! as one [`Graph`]; computed tensors enter it as inputs. [`realize`] captures, decomposes to
//! primitives and runs the graph, then binds the results to the tensors.

use crate::storage::Storage;
use crate::tensor::Tensor;
use coil_ir::{Graph, Node, NodeId, RandomState, Result};
use coil_runtime::{Buffer, Device};
use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, OnceLock};

/// A map keyed by node address. Addresses are distinct and only looked up, never iterated, so
/// a multiplicative hash (as in rustc's FxHash) is enough and much cheaper than SipHash.
type AddrMap<V> = HashMap<usize, V, BuildHasherDefault<AddrHasher>>;

#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A captured graph and the storage bound to its inputs.
pub struct Captured {
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
    capture_walk(outputs, &[]).0
}

/// [`capture`], and the tensors bound to the graph's inputs, in input order. A computed tensor
/// that an op produced from one of `wrt` (not through a `detach`) enters the graph as that op
/// again, its operands followed, so that a gradient with respect to `wrt` sees every path; other
/// computed tensors are inputs, as in [`capture`] (an updated weight does not drag the steps
/// that made it into the graph).
pub(crate) fn capture_walk(outputs: &[&Tensor], wrt: &[&Tensor]) -> (Captured, Vec<Tensor>) {
    // Keyed by node address only to find shared nodes; the numbering follows the walk. The walk
    // borrows (no reference counting) and the maps hash addresses cheaply: a compiled
    // function captures on every call, so this is on its hot path.
    let key = |t: &Tensor| Arc::as_ptr(&t.0) as usize;
    let after_wrt = if wrt.is_empty() { AddrMap::default() } else { descends_from(outputs, wrt) };
    let is_input = |t: &Tensor| t.is_realized() && !after_wrt.get(&key(t)).copied().unwrap_or(false);
    let mut order: Vec<&Tensor> = Vec::new();
    let mut seen: AddrMap<()> = AddrMap::default();
    for &out in outputs {
        // Iterative post-order: (tensor, operands pushed yet?)
        let mut stack: Vec<(&Tensor, bool)> = vec![(out, false)];
        while let Some((t, expanded)) = stack.pop() {
            if seen.contains_key(&key(t)) {
                continue;
            }
            if !expanded && !is_input(t) {
                stack.push((t, true));
                stack.extend(t.0.srcs.iter().rev().map(|s| (s, false)));
                continue;
            }
            seen.insert(key(t), ());
            order.push(t);
        }
    }
    let random = random_streams(&order, is_input);
    // Inputs (computed tensors) first, then the pending nodes in walk order.
    let mut graph = Graph::new();
    let mut inputs = Vec::new();
    let mut marked = Vec::new();
    let mut ids: AddrMap<NodeId> = AddrMap::default();
    let mut input_tensors = Vec::new();
    for &t in order.iter().filter(|&&t| is_input(t)) {
        ids.insert(key(t), graph.input(t.meta().clone()));
        inputs.push(t.0.storage.get().expect("realized").clone());
        input_tensors.push(t.clone());
        marked.push(t.0.dynamic.load(std::sync::atomic::Ordering::Relaxed));
    }
    for &t in order.iter().filter(|&&t| !is_input(t)) {
        let op = match t.0.draw {
            Some(draw) => {
                let stream = random.iter().position(|s| s.seed == draw.seed).expect("every key has a stream");
                t.0.op.with_stream(stream, draw.offset.wrapping_sub(random[stream].offset))
            }
            None => t.0.op.clone(),
        };
        let id = if op.is_leaf() {
            graph.leaf(op, t.meta().clone(), t.0.location)
        } else {
            // The meta was inferred when the op was recorded, from these same operands:
            // inferring it again would only cost time.
            let inputs: Vec<NodeId> = t.0.srcs.iter().map(|s| ids[&key(s)]).collect();
            graph.nodes.push(Node { op, inputs, meta: t.meta().clone(), location: t.0.location });
            NodeId(graph.nodes.len() - 1)
        };
        ids.insert(key(t), id);
    }
    graph.outputs = outputs.iter().map(|t| ids[&key(t)]).collect();
    let device = outputs.first().map_or(Device::Cpu, |t| t.device());
    (Captured { graph, inputs, random, device, marked }, input_tensors)
}

/// The random streams of the pending nodes among `order`: one per key, in order of first
/// appearance, each starting at the lowest counter drawn with that key (so every offset from
/// it is small and non-negative, and the same program draws at the same offsets).
fn random_streams(order: &[&Tensor], is_input: impl Fn(&Tensor) -> bool) -> Vec<RandomState> {
    let mut streams: Vec<RandomState> = Vec::new();
    for draw in order.iter().filter(|t| !is_input(t)).filter_map(|t| t.0.draw) {
        match streams.iter_mut().find(|s| s.seed == draw.seed) {
            Some(s) => s.offset = s.offset.min(draw.offset),
            None => streams.push(draw),
        }
    }
    streams
}

/// For every tensor behind `outputs` (computed ones included), whether one of `wrt` is among its
/// operands, direct or not, other than through a `detach`. Iterative: a long training loop's
/// history is deep.
fn descends_from(outputs: &[&Tensor], wrt: &[&Tensor]) -> AddrMap<bool> {
    let key = |t: &Tensor| Arc::as_ptr(&t.0) as usize;
    let targets: AddrMap<()> = wrt.iter().map(|&t| (key(t), ())).collect();
    let mut memo: AddrMap<bool> = AddrMap::default();
    for &out in outputs {
        let mut stack: Vec<(&Tensor, bool)> = vec![(out, false)];
        while let Some((t, expanded)) = stack.pop() {
            if memo.contains_key(&key(t)) {
                continue;
            }
            let srcs: &[Tensor] = if t.0.op == coil_ir::Op::Detach { &[] } else { &t.0.srcs };
            if !expanded {
                stack.push((t, true));
                stack.extend(srcs.iter().filter(|s| !memo.contains_key(&key(s))).map(|s| (s, false)));
                continue;
            }
            let reached = srcs.iter().any(|s| targets.contains_key(&key(s)) || memo[&key(s)]);
            memo.insert(key(t), reached);
        }
    }
    memo
}

/// Computes every pending tensor among `outputs` and binds the results to them: one graph per
/// device. Inside a compiled function this is a graph break ([`crate::dynamo`]).
#[track_caller]
pub fn realize(outputs: &[&Tensor]) -> Result<()> {
    if crate::dynamo::tracing() {
        return crate::dynamo::host_read(outputs, std::panic::Location::caller());
    }
    let pending: Vec<&Tensor> = outputs.iter().copied().filter(|t| !t.is_realized()).collect();
    if let Some(e) = pending.iter().find_map(|t| t.invalid()) {
        return Err(e.clone());
    }
    let mut devices: Vec<Device> = pending.iter().map(|t| t.device()).collect();
    devices.dedup();
    for device in devices {
        let group: Vec<&Tensor> = pending.iter().copied().filter(|t| t.device() == device).collect();
        let captured = capture(&group);
        let results = run(&captured)?;
        for (t, storage) in group.iter().zip(results) {
            let _ = t.0.storage.set(storage);
        }
    }
    Ok(())
}

/// How realized graphs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Compiled: fused kernels, generated C, built by the system C compiler (the default).
    Compiled,
    /// The reference interpreter: every primitive op by op (the oracle, and the fallback when
    /// no C compiler exists).
    Interpreter,
}

thread_local! {
    static BACKEND: Cell<Option<Backend>> = const { Cell::new(None) };
}

/// Chooses the backend for this thread's realizations.
pub fn set_backend(backend: Backend) {
    BACKEND.with(|b| b.set(Some(backend)));
}

/// The backend in use: the one set on this thread, else `COIL_BACKEND` (`compiled` or
/// `interpreter`), else compiled when a C compiler exists. Without one, coil says so once and
/// interprets.
pub fn backend() -> Backend {
    if let Some(b) = BACKEND.with(|b| b.get()) {
        return b;
    }
    static DEFAULT: OnceLock<Backend> = OnceLock::new();
    *DEFAULT.get_or_init(|| match std::env::var("COIL_BACKEND").as_deref() {
        Ok("interpreter") | Ok("interp") => Backend::Interpreter,
        _ if coil_runtime::cpu::c_compiler().is_none() => {
            eprintln!(
                "coil: no C compiler found (tried $CC, cc, gcc, clang): running graphs with the reference interpreter"
            );
            Backend::Interpreter
        }
        _ => Backend::Compiled,
    })
}

/// Runs a captured graph on the current backend and its device.
fn run(captured: &Captured) -> Result<Vec<Storage>> {
    match backend() {
        Backend::Interpreter => interpret(captured),
        Backend::Compiled => {
            let compiled = crate::compile::compile(&captured.graph, captured.device)?;
            crate::guard::guard("running", &captured.graph, || compiled.run(&captured.inputs, &captured.random))
        }
    }
}

/// Runs a captured graph on the reference interpreter (also how compiled functions run eagerly).
pub(crate) fn interpret(captured: &Captured) -> Result<Vec<Storage>> {
    crate::guard::guard("interpreting", &captured.graph, || interpret_unguarded(captured))
}

fn interpret_unguarded(captured: &Captured) -> Result<Vec<Storage>> {
    // The oracle runs on the host whatever the device; results go back to the device.
    let primitive = coil_passes::decompose(&captured.graph)?;
    let hosts = captured.inputs.iter().map(|s| s.to_host()).collect::<Result<Vec<_>>>()?;
    let inputs: Vec<&Buffer> = hosts.iter().map(|b| b.as_ref()).collect();
    let outputs = coil_runtime::interpret_with(&primitive, &inputs, &captured.random)?;
    outputs.into_iter().map(|b| Storage::host(Arc::new(b)).to_device(captured.device)).collect()
}
