//! The walk behind every capture: the pending nodes some tensors depend on, numbered as their
//! captured graph numbers them, and the cheap test that they *are* a graph captured before.
//!
//! A compiled function captures its graph on every call, and a training step's graph has
//! thousands of nodes, so this is coil's hottest host path. [`Walk::new`] visits each node once
//! (one lookup in an address map per edge, nothing cloned); then either [`Walk::graph`] builds
//! the [`Graph`] (a cache miss, or a first capture), or [`Walk::matches`] compares the walk with
//! a cached graph node by node ([`Expected`]: the graph laid out for that), without building
//! anything: equal ops and attributes, metas, edges, inputs and outputs, exactly what
//! [`crate::dynamo::same_structure`] compares. A match
//! is a hit whose guards all hold (a captured graph carries every size and dtype it was compiled
//! for), so the hit costs the walk and the comparison, no hashing and no graph.

use crate::dynamo::guards;
use crate::storage::Storage;
use crate::tensor::Tensor;
use coil_ir::{Graph, Node, NodeId, Op, RandomState, TensorMeta};
use coil_runtime::Device;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// A map keyed by node address. Addresses are distinct and only looked up, never iterated, so
/// a multiplicative hash (as in rustc's FxHash) is enough and much cheaper than SipHash.
pub(crate) type AddrMap<V> = HashMap<usize, V, BuildHasherDefault<AddrHasher>>;

#[derive(Default)]
pub(crate) struct AddrHasher(u64);

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

/// A tensor's node address: what identifies it in a walk.
fn key(t: &Tensor) -> usize {
    Arc::as_ptr(&t.0) as usize
}

/// A node's id during a walk, before the number of graph inputs is known: inputs are numbered
/// from 0 in walk order, pending nodes by their rank among pending nodes, marked by this bit.
/// The graph numbers a pending node `inputs + rank`.
const PENDING: u32 = 1 << 31;

/// The nodes behind some output tensors, in capture order.
pub(crate) struct Walk<'a> {
    /// Every node of the graph, by [`NodeId`]: the graph inputs (computed tensors) first, in
    /// walk order, then the pending nodes in walk order (a depth-first post-order from the
    /// outputs, so operands come first and the same program is always numbered the same way).
    nodes: Vec<&'a Tensor>,
    /// How many of `nodes` are graph inputs.
    inputs: usize,
    /// Each node's walk id ([`PENDING`]), by address.
    ids: AddrMap<u32>,
    outputs: &'a [&'a Tensor],
    /// The graph's random streams (see [`crate::capture`]).
    random: Vec<RandomState>,
    /// Held while the walk borrows nodes' operands: none is released meanwhile
    /// ([`crate::history`]).
    _history: crate::history::Read,
}

impl<'a> Walk<'a> {
    /// Walks the pending nodes behind `outputs`. Computed tensors are graph inputs, except those
    /// an op produced from one of `wrt` (not through a `detach`): they enter as that op again,
    /// operands followed, so that a gradient with respect to `wrt` sees every path.
    pub(crate) fn new(outputs: &'a [&'a Tensor], wrt: &[&Tensor]) -> Walk<'a> {
        Walk::compared(outputs, wrt, None).0
    }

    /// [`Walk::new`], compared with `expected` on the way: also whether the walk is that graph
    /// ([`Walk::matches`]). One pass over the nodes: a compiled function's cache hit.
    pub(crate) fn matching(outputs: &'a [&'a Tensor], expected: &Expected) -> (Walk<'a>, bool) {
        Walk::compared(outputs, &[], Some(expected))
    }

    fn compared(outputs: &'a [&'a Tensor], wrt: &[&Tensor], expected: Option<&Expected>) -> (Walk<'a>, bool) {
        let history = crate::history::read();
        let after_wrt = if wrt.is_empty() { None } else { Some(descends_from(outputs, wrt, &history)) };
        let is_input = |t: &Tensor| {
            t.is_realized() && !after_wrt.as_ref().is_some_and(|m| m.get(&key(t)).copied().unwrap_or(false))
        };
        let hint = SIZE_HINT.with(|h| h.get());
        let mut ids: AddrMap<u32> = AddrMap::with_capacity_and_hasher(hint, Default::default());
        let (mut inputs, mut pending): (Vec<&'a Tensor>, Vec<&'a Tensor>) = (Vec::new(), Vec::with_capacity(hint));
        // Compared as the walk goes, while it matches (random ops after it: their attributes
        // need the streams, known at the end). Inputs and pending nodes each come in the
        // order of their ids, so each kind reads its part of the layout in order.
        let mut same = expected;
        let (mut input_at, mut node_at) = (0, expected.map_or(0, |e| e.pending_at));
        let mut random_ops: Vec<usize> = Vec::new();
        let mut stack: Vec<(&'a Tensor, bool)> = Vec::with_capacity(64);
        // The walk ids of the operands visited so far whose consumer is not numbered yet, in
        // order: a node's operands are the top of it when the node is numbered (each visit of
        // an operand leaves exactly one id), so no lookup finds them again.
        let mut operands: Vec<u32> = Vec::with_capacity(64);
        for &out in outputs {
            // Iterative post-order: (tensor, operands pushed yet?). A node is expanded once:
            // a second copy on the stack lies below the first's operands, so it is popped
            // after the first is numbered.
            stack.push((out, false));
            while let Some((t, expanded)) = stack.pop() {
                if !expanded {
                    if let Some(&id) = ids.get(&key(t)) {
                        operands.push(id);
                        continue;
                    }
                    if is_input(t) {
                        let id = inputs.len() as u32;
                        ids.insert(key(t), id);
                        operands.push(id);
                        if let Some(e) = same {
                            same = e.input(&mut input_at, inputs.len(), t).then_some(e);
                        }
                        inputs.push(t);
                        continue;
                    }
                    stack.push((t, true));
                    // SAFETY: the walk holds `history::read()` for its lifetime (`history` here, then the
                    // struct's field): no operand is released while its borrows live.
                    stack.extend(unsafe { t.0.srcs_unchecked() }.iter().rev().map(|s| (s, false)));
                    continue;
                }
                let first = operands.len() - t.0.srcs(&history).len();
                if let Some(e) = same {
                    let id = e.inputs + pending.len();
                    let ids = operands[first..].iter().map(|&w| walk_id(w, e.inputs));
                    same = e.node(&mut node_at, id, t, ids).then_some(e);
                    if t.0.draw.is_some() {
                        random_ops.push(id);
                    }
                }
                operands.truncate(first);
                let id = PENDING | pending.len() as u32;
                ids.insert(key(t), id);
                operands.push(id);
                pending.push(t);
            }
            operands.clear();
        }
        let n_inputs = inputs.len();
        let mut nodes = inputs;
        nodes.extend(pending);
        SIZE_HINT.with(|h| h.set(nodes.len()));
        let random = random_streams(&nodes[n_inputs..]);
        let walk = Walk { nodes, inputs: n_inputs, ids, outputs, random, _history: history };
        let matches = same.is_some_and(|e| {
            e.ops.len() == walk.nodes.len()
                && e.inputs == walk.inputs
                && walk.outputs_match(e)
                && random_ops.iter().all(|&id| e.ops[id] == walk.op(walk.nodes[id]))
        });
        (walk, matches)
    }

    /// How many nodes the walk visited (graph inputs and pending nodes).
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether `node` is one of the walk's nodes.
    pub(crate) fn contains(&self, node: &Arc<crate::tensor::TensorNode>) -> bool {
        self.ids.contains_key(&(Arc::as_ptr(node) as usize))
    }

    /// The id of a node of the walk.
    fn id(&self, t: &Tensor) -> NodeId {
        walk_id(self.ids[&key(t)], self.inputs)
    }

    /// Node `i`'s line and operands, for naming a compiled graph's data error
    /// ([`crate::compile::Compiled::origin`]).
    pub(crate) fn node_source(&self, i: usize) -> Option<crate::realize::NodeSource> {
        let t = self.nodes.get(i).filter(|_| i >= self.inputs)?;
        Some((t.0.location, t.0.srcs(&self._history).iter().map(|s| s.meta().to_string()).collect()))
    }

    /// The graph's random streams: one per key drawn with, in order of first appearance.
    pub(crate) fn random(&self) -> &[RandomState] {
        &self.random
    }

    /// The computed tensors bound to the graph's inputs, in input order.
    pub(crate) fn input_tensors(&self) -> &[&'a Tensor] {
        &self.nodes[..self.inputs]
    }

    /// Their elements.
    pub(crate) fn input_storages(&self) -> Vec<Storage> {
        self.input_tensors().iter().map(|t| t.0.storage.get().expect("realized").clone()).collect()
    }

    /// The device the graph runs on (its outputs' device).
    pub(crate) fn device(&self) -> Device {
        self.outputs.first().map_or(Device::Cpu, |t| t.device())
    }

    /// Node `t`'s op as the captured graph holds it: a random op draws from its graph stream,
    /// at its offset from the stream's start.
    fn op(&self, t: &Tensor) -> coil_ir::Op {
        match t.0.draw {
            Some(draw) => {
                let stream = self.random.iter().position(|s| s.seed == draw.seed).expect("every key has a stream");
                t.0.op.with_stream(stream, draw.offset.wrapping_sub(self.random[stream].offset))
            }
            None => t.0.op.clone(),
        }
    }

    fn outputs_match(&self, expected: &Expected) -> bool {
        expected.outputs.len() == self.outputs.len()
            && self.outputs.iter().zip(&expected.outputs).all(|(t, &o)| self.id(t) == o)
    }

    /// Whether the walk is the graph laid out in `expected`: the captured graph it would build
    /// has its ops and attributes, metas, edges, inputs and outputs (source lines aside).
    /// Builds nothing.
    pub(crate) fn matches(&self, expected: &Expected) -> bool {
        if expected.ops.len() != self.nodes.len() || expected.inputs != self.inputs || !self.outputs_match(expected) {
            return false;
        }
        let mut at = 0;
        let inputs = self.nodes[..self.inputs].iter().enumerate();
        inputs.clone().all(|(k, t)| expected.input(&mut at, k, t))
            && (self.nodes.iter().enumerate().skip(self.inputs)).all(|(id, t)| {
                expected.node(&mut at, id, t, t.0.srcs(&self._history).iter().map(|s| self.id(s)))
                    && (t.0.draw.is_none() || expected.ops[id] == self.op(t))
            })
    }

    /// The captured graph.
    pub(crate) fn graph(&self) -> Graph {
        let mut graph = Graph::new();
        graph.nodes.reserve(self.nodes.len());
        for t in &self.nodes[..self.inputs] {
            graph.input(t.meta().clone());
        }
        for t in &self.nodes[self.inputs..] {
            let op = self.op(t);
            if op.is_leaf() {
                graph.leaf(op, t.meta().clone(), t.0.location);
            } else {
                // The meta was inferred when the op was recorded, from these same operands:
                // inferring it again would only cost time.
                let inputs: Vec<NodeId> = t.0.srcs(&self._history).iter().map(|s| self.id(s)).collect();
                graph.nodes.push(Node { op, inputs, meta: t.meta().clone(), location: t.0.location, origin: None });
            }
        }
        graph.outputs = self.outputs.iter().map(|t| self.id(t)).collect();
        graph
    }

    /// The captured graph with its inputs' elements and random streams.
    pub(crate) fn captured(&self) -> crate::Captured {
        crate::Captured {
            graph: self.graph(),
            inputs: self.input_storages(),
            random: self.random.clone(),
            device: self.device(),
            marked: self.marked(),
        }
    }

    /// Per graph input, the dims marked dynamic ([`Tensor::mark_dynamic`]), one bit per dim.
    pub(crate) fn marked(&self) -> Vec<u64> {
        let marks = self.input_tensors().iter();
        marks.map(|t| t.0.dynamic.load(std::sync::atomic::Ordering::Relaxed)).collect()
    }
}

/// A captured graph laid out for comparing walks with it ([`Walk::matching`],
/// [`Walk::matches`]): each node's operand ids, dtype and sizes in one array, in node order.
/// A hit compares thousands of nodes, each of whose [`Node`] keeps its operands and sizes in
/// allocations of their own: reading those waited on memory for most of the comparison's
/// time, where one array read in order costs almost nothing. (Sizes are compared element by
/// element: a `memcmp` call per shape cost more than the comparison.)
pub(crate) struct Expected {
    /// How many of the nodes are graph inputs (they come first).
    inputs: usize,
    outputs: Vec<NodeId>,
    /// Each node's op, attributes included.
    ops: Vec<Op>,
    /// Per node, in order: its operand count, its operands' ids, its dtype, its rank, its sizes.
    words: Vec<u64>,
    /// Where the first node after the inputs starts in `words`.
    pending_at: usize,
}

impl Expected {
    /// The layout of a captured graph (inputs first, as captures number them).
    pub(crate) fn new(graph: &Graph) -> Expected {
        let mut words = Vec::with_capacity(graph.nodes.len() * 8);
        let mut pending_at = 0;
        for (id, node) in graph.nodes.iter().enumerate() {
            if id == graph.inputs.len() {
                pending_at = words.len();
            }
            words.push(node.inputs.len() as u64);
            words.extend(node.inputs.iter().map(|i| i.0 as u64));
            words.extend([node.meta.dtype as u64, node.meta.rank() as u64]);
            words.extend(node.meta.shape.iter().map(|&d| d as u64));
        }
        if graph.nodes.len() == graph.inputs.len() {
            pending_at = words.len();
        }
        let ops = graph.nodes.iter().map(|n| n.op.clone()).collect();
        Expected { inputs: graph.inputs.len(), outputs: graph.outputs.clone(), ops, words, pending_at }
    }

    /// Whether graph input `k` (its words at `*at`) has tensor `t`'s meta; moves `at` past it.
    fn input(&self, at: &mut usize, k: usize, t: &Tensor) -> bool {
        let meta = &t.0.meta;
        let Some(w) = self.words.get(*at..*at + 3 + meta.rank()) else { return false };
        *at += w.len();
        k < self.inputs
            && matches!(self.ops[k], Op::Input { index } if index == k)
            && w[0] == 0
            && same_meta(&w[1..], meta)
    }

    /// Whether node `id` (its words at `*at`) has tensor `t`'s operands (whose ids are
    /// `operands`), meta and op (a random op's attributes aside: they need the walk's
    /// streams); moves `at` past it.
    fn node(&self, at: &mut usize, id: usize, t: &Tensor, operands: impl ExactSizeIterator<Item = NodeId>) -> bool {
        let meta = &t.0.meta;
        let n = operands.len();
        let Some(w) = self.words.get(*at..*at + n + 3 + meta.rank()) else { return false };
        *at += w.len();
        id < self.ops.len()
            && w[0] == n as u64
            && operands.zip(&w[1..]).all(|(s, &i)| s.0 as u64 == i)
            && same_meta(&w[n + 1..], meta)
            && (t.0.draw.is_some() || same_op(&self.ops[id], &t.0.op))
    }
}

/// Whether a node's words from its dtype on (dtype, rank, sizes) are `meta`'s.
fn same_meta(w: &[u64], meta: &TensorMeta) -> bool {
    w[0] == meta.dtype as u64
        && w[1] == meta.rank() as u64
        && meta.shape.iter().zip(&w[2..]).all(|(&d, &e)| d as u64 == e)
}

/// [`guards::same_op`], with the attributes of the commonest ops that hold sizes (views,
/// reductions) compared element by element (see [`Expected`]).
fn same_op(a: &Op, b: &Op) -> bool {
    let same = |x: &[usize], y: &[usize]| x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p == q);
    match (a, b) {
        (Op::Reshape { shape: x }, Op::Reshape { shape: y }) | (Op::Expand { shape: x }, Op::Expand { shape: y }) => {
            same(x, y)
        }
        (Op::Permute { perm: x }, Op::Permute { perm: y }) => same(x, y),
        (Op::Reduce { op, dims, keepdim }, Op::Reduce { op: op2, dims: dims2, keepdim: keepdim2 }) => {
            op == op2 && keepdim == keepdim2 && same(dims, dims2)
        }
        _ => guards::same_op(a, b),
    }
}

/// The graph's id of a node of walk id `id` ([`PENDING`]) in a graph of `inputs` inputs.
fn walk_id(id: u32, inputs: usize) -> NodeId {
    match id & PENDING {
        0 => NodeId(id as usize),
        _ => NodeId(inputs + (id & !PENDING) as usize),
    }
}

thread_local! {
    /// The size of this thread's last walk: the next one reserves that much at once (a
    /// compiled function walks the same graph on every call).
    static SIZE_HINT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The random streams of pending nodes: one per key, in order of first appearance, each
/// starting at the lowest counter drawn with that key (so every offset from it is small and
/// non-negative, and the same program draws at the same offsets).
fn random_streams(pending: &[&Tensor]) -> Vec<RandomState> {
    let mut streams: Vec<RandomState> = Vec::new();
    for draw in pending.iter().filter_map(|t| t.0.draw) {
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
fn descends_from(outputs: &[&Tensor], wrt: &[&Tensor], held: &crate::history::Read) -> AddrMap<bool> {
    let targets: AddrMap<()> = wrt.iter().map(|&t| (key(t), ())).collect();
    let mut memo: AddrMap<bool> = AddrMap::default();
    let mut stack: Vec<(&Tensor, bool)> = Vec::new();
    for &out in outputs {
        stack.push((out, false));
        while let Some((t, expanded)) = stack.pop() {
            if memo.contains_key(&key(t)) {
                continue;
            }
            let srcs: &[Tensor] = if t.0.op == coil_ir::Op::Detach { &[] } else { t.0.srcs(held) };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dynamo::same_structure;
    use coil_ir::DType;

    /// A small random program over `x` and `y` (both `[4, 4]`): eight ops drawn from `seed`,
    /// each on earlier values (so some are shared), random ones included. `mutate`: one step
    /// whose draw is nudged (another op, other operands or another constant).
    fn program(seed: u64, mutate: Option<usize>, x: &Tensor, y: &Tensor) -> Vec<Tensor> {
        let mut z = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut vals = vec![x.clone(), y.clone()];
        for step in 0..8 {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            let r = if mutate == Some(step) { z.wrapping_add(1 + (z >> 40) % 5) } else { z };
            let a = vals[(r >> 8) as usize % vals.len()].clone();
            let b = vals[(r >> 16) as usize % vals.len()].clone();
            let v = match r % 9 {
                0 => &a + &b,
                1 => &a * &b,
                2 => a.exp().unwrap(),
                3 => &a + &a.sum(&[1], true).unwrap(),
                4 => a.permute(&[1, 0]).unwrap(),
                5 => a.reshape(&[16]).unwrap().reshape(&[4, 4]).unwrap(),
                6 => &a * ((r >> 24) % 3) as f64,
                7 => a.dropout(0.5, true).unwrap(),
                _ => a.to_dtype(DType::F64).unwrap().to_dtype(DType::F32).unwrap(),
            };
            vals.push(v);
        }
        vals.split_off(vals.len() - 2)
    }

    #[test]
    fn the_walks_comparison_agrees_with_building_and_comparing_the_graphs() {
        let x = Tensor::from_vec((0..16).map(|i| i as f32).collect(), &[4, 4]).unwrap();
        let y = Tensor::from_vec((0..16).map(|i| 1.0 - i as f32).collect(), &[4, 4]).unwrap();
        let (mut same, mut different) = (0, 0);
        for seed in 0..300 {
            let a = program(seed, None, &x, &y);
            let graph = crate::capture(&a.iter().collect::<Vec<_>>()).graph;
            for mutate in [None, Some((seed % 8) as usize), Some(((seed + 3) % 8) as usize)] {
                let b = program(seed, mutate, &x, &y);
                let outputs: Vec<&Tensor> = b.iter().collect();
                let built = crate::capture(&outputs).graph;
                let want = same_structure(&built, &graph);
                let expected = Expected::new(&graph);
                let (walk, matched) = Walk::matching(&outputs, &expected);
                assert_eq!(matched, want, "seed {seed}, mutation {mutate:?}:\n{graph}\nvs\n{built}");
                assert_eq!(walk.matches(&expected), want, "seed {seed}, mutation {mutate:?}");
                assert!(same_structure(&walk.graph(), &built), "the walk builds the captured graph");
                if want {
                    same += 1;
                } else {
                    different += 1;
                }
            }
        }
        // Both outcomes are exercised (a nudged draw sometimes picks the same op again).
        assert!(same >= 300 && different >= 300, "{same} same, {different} different");
    }
}
