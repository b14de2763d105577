//! The walk behind every capture: the pending nodes some tensors depend on, numbered as their
//! captured graph numbers them, and the cheap test that they *are* a graph captured before.
//!
//! A compiled function captures its graph on every call, and a training step's graph has
//! thousands of nodes, so this is coil's hottest host path. [`Walk::new`] visits each node once
//! (one lookup in an address map per edge, nothing cloned); then either [`Walk::graph`] builds
//! the [`Graph`] (a cache miss, or a first capture), or [`Walk::matches`] compares the walk with
//! a cached graph node by node, without building anything: equal ops and attributes, metas,
//! edges, inputs and outputs, exactly what [`crate::dynamo::same_structure`] compares. A match
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
    pub(crate) fn matching(outputs: &'a [&'a Tensor], expected: &Graph) -> (Walk<'a>, bool) {
        Walk::compared(outputs, &[], Some(expected))
    }

    fn compared(outputs: &'a [&'a Tensor], wrt: &[&Tensor], expected: Option<&Graph>) -> (Walk<'a>, bool) {
        let after_wrt = if wrt.is_empty() { None } else { Some(descends_from(outputs, wrt)) };
        let is_input = |t: &Tensor| {
            t.is_realized() && !after_wrt.as_ref().is_some_and(|m| m.get(&key(t)).copied().unwrap_or(false))
        };
        let hint = SIZE_HINT.with(|h| h.get());
        let mut ids: AddrMap<u32> = AddrMap::with_capacity_and_hasher(hint, Default::default());
        let (mut inputs, mut pending): (Vec<&'a Tensor>, Vec<&'a Tensor>) = (Vec::new(), Vec::with_capacity(hint));
        // Compared as the walk goes while it matches; random ops after it (their attributes
        // need the streams, known at the end).
        let mut same = expected;
        let mut random_ops: Vec<usize> = Vec::new();
        let mut stack: Vec<(&'a Tensor, bool)> = Vec::with_capacity(64);
        for &out in outputs {
            // Iterative post-order: (tensor, operands pushed yet?). A node is expanded once:
            // a second copy on the stack lies below the first's operands, so it is popped
            // after the first is numbered.
            stack.push((out, false));
            while let Some((t, expanded)) = stack.pop() {
                if !expanded {
                    if ids.contains_key(&key(t)) {
                        continue;
                    }
                    if is_input(t) {
                        ids.insert(key(t), inputs.len() as u32);
                        inputs.push(t);
                        if let Some(g) = same {
                            let k = inputs.len() - 1;
                            same = (g.inputs.get(k) == Some(&NodeId(k)) && same_meta(&g.nodes[k].meta, &t.0.meta))
                                .then_some(g);
                        }
                        continue;
                    }
                    stack.push((t, true));
                    stack.extend(t.0.srcs.iter().rev().map(|s| (s, false)));
                    continue;
                }
                if let Some(g) = same {
                    let id = g.inputs.len() + pending.len();
                    let node_matches = g.nodes.get(id).is_some_and(|node| {
                        let edge = |(i, s): (&NodeId, &Tensor)| walk_id(ids[&key(s)], g.inputs.len()) == *i;
                        same_meta(&node.meta, &t.0.meta)
                            && node.inputs.len() == t.0.srcs.len()
                            && node.inputs.iter().zip(&t.0.srcs).all(edge)
                            && (t.0.draw.is_some() || same_op(&node.op, &t.0.op))
                    });
                    same = node_matches.then_some(g);
                    if t.0.draw.is_some() {
                        random_ops.push(id);
                    }
                }
                ids.insert(key(t), PENDING | pending.len() as u32);
                pending.push(t);
            }
        }
        let n_inputs = inputs.len();
        let mut nodes = inputs;
        nodes.extend(pending);
        SIZE_HINT.with(|h| h.set(nodes.len()));
        let random = random_streams(&nodes[n_inputs..]);
        let walk = Walk { nodes, inputs: n_inputs, ids, outputs, random };
        let matches = same.is_some_and(|g| {
            g.nodes.len() == walk.nodes.len()
                && g.inputs.len() == walk.inputs
                && walk.outputs_match(g)
                && random_ops.iter().all(|&id| g.nodes[id].op == walk.op(walk.nodes[id]))
        });
        (walk, matches)
    }

    /// The id of a node of the walk.
    fn id(&self, t: &Tensor) -> NodeId {
        walk_id(self.ids[&key(t)], self.inputs)
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

    fn outputs_match(&self, graph: &Graph) -> bool {
        graph.outputs.len() == self.outputs.len()
            && self.outputs.iter().zip(&graph.outputs).all(|(t, &o)| self.id(t) == o)
    }

    /// Whether the walk is `graph`: the captured graph it would build has `graph`'s ops and
    /// attributes, metas, edges, inputs and outputs (source lines aside). Builds nothing.
    pub(crate) fn matches(&self, graph: &Graph) -> bool {
        if graph.nodes.len() != self.nodes.len() || graph.inputs.len() != self.inputs || !self.outputs_match(graph) {
            return false;
        }
        let inputs_match = (self.nodes[..self.inputs].iter().enumerate())
            .all(|(k, t)| graph.inputs[k] == NodeId(k) && same_meta(&graph.nodes[k].meta, &t.0.meta));
        inputs_match
            && (self.nodes[self.inputs..].iter().zip(&graph.nodes[self.inputs..])).all(|(t, node)| {
                same_meta(&node.meta, &t.0.meta)
                    && node.inputs.len() == t.0.srcs.len()
                    && node.inputs.iter().zip(&t.0.srcs).all(|(&i, s)| self.id(s) == i)
                    && match t.0.draw {
                        None => same_op(&node.op, &t.0.op),
                        Some(_) => node.op == self.op(t),
                    }
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
                let inputs: Vec<NodeId> = t.0.srcs.iter().map(|s| self.id(s)).collect();
                graph.nodes.push(Node { op, inputs, meta: t.meta().clone(), location: t.0.location });
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

/// `a == b`, element by element: shapes are short, and the slice comparison calls `memcmp`,
/// which costs more than the comparison itself (a third of a hit's walk).
fn same_meta(a: &TensorMeta, b: &TensorMeta) -> bool {
    a.dtype == b.dtype && a.shape.len() == b.shape.len() && a.shape.iter().zip(&b.shape).all(|(x, y)| x == y)
}

/// [`guards::same_op`], with the attributes of the commonest ops that hold sizes (views,
/// reductions) compared element by element, for the reason of [`same_meta`].
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
fn descends_from(outputs: &[&Tensor], wrt: &[&Tensor]) -> AddrMap<bool> {
    let targets: AddrMap<()> = wrt.iter().map(|&t| (key(t), ())).collect();
    let mut memo: AddrMap<bool> = AddrMap::default();
    let mut stack: Vec<(&Tensor, bool)> = Vec::new();
    for &out in outputs {
        stack.push((out, false));
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
                let (walk, matched) = Walk::matching(&outputs, &graph);
                assert_eq!(matched, want, "seed {seed}, mutation {mutate:?}:\n{graph}\nvs\n{built}");
                assert_eq!(walk.matches(&graph), want, "seed {seed}, mutation {mutate:?}");
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
