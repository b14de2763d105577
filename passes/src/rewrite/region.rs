//! Graph regions in and out of the e-graph, and the whole-graph CSE that comes first.
//!
//! Most nodes of a real graph are left alone by every rule, and an e-graph costs far more per
//! node than a pass over the graph. So the e-graph only holds a *region*: the nodes where some
//! rule may fire ([`rules::may_fire`]), their operands (what a rule reads) and the views
//! below those (what a rewrite can cancel against), and their view and pointwise readers
//! (what a rewrite exposes one level up). Operands outside the
//! region enter as leaves (opaque values, or the leaf itself for inputs and constants), so
//! nothing outside is duplicated or recomputed. The region's *roots* are its nodes that a
//! graph output is or a node outside reads; extraction chooses one implementation per root,
//! and [`splice`] puts them back in the graph.
//!
//! Identical nodes anywhere (same op, attributes and operands) are found first by [`cse`],
//! which needs no e-graph; every step after it reads the graph through that mapping, so the
//! graph is copied once, by [`splice`].

use super::lang::{ENode, Prim, EG};
use super::rules;
use coil_ir::{Error, Graph, Node, NodeId, Result};
use egg::Id;
use rustc_hash::{FxHashMap, FxHashSet, FxHasher};
use std::hash::{Hash, Hasher};
use std::panic::Location;

/// A node's source line and captured node ([`Node::location`], [`Node::origin`]).
type Source = (Option<&'static Location<'static>>, Option<usize>);

/// Identical live nodes: `rep[i]` is the first node identical to node `i` (`i` itself when
/// there is none).
pub struct Dedup {
    /// The representative of each node.
    pub rep: Vec<usize>,
    /// Nodes that are a copy of an earlier one.
    pub merged: usize,
}

impl Dedup {
    /// The node that stands for `x`.
    pub fn of(&self, x: NodeId) -> NodeId {
        NodeId(self.rep[x.0])
    }
}

/// Finds identical live nodes (same op and attributes, same operands after merging, same
/// meta). `live` is [`Graph::live_nodes`]. Errors on a composite op.
pub fn cse(graph: &Graph, live: &[NodeId]) -> Result<Dedup> {
    let mut rep: Vec<usize> = (0..graph.nodes.len()).collect();
    // Buckets by a hash of (op name, operands, meta), chained through `next` so that nothing
    // is allocated per node; equality (attributes included) is checked on the chain.
    let mut head: FxHashMap<u64, usize> = FxHashMap::default();
    head.reserve(live.len());
    let mut next: Vec<usize> = vec![usize::MAX; graph.nodes.len()];
    let mut merged = 0;
    for &id in live {
        let n = graph.node(id);
        if !n.op.is_primitive() {
            return Err(Error::runtime(format!("rewrite: {id} ({}) is not a primitive op", n.op)));
        }
        if matches!(n.op, coil_ir::Op::Input { .. }) {
            continue;
        }
        let mut h = FxHasher::default();
        n.op.name().hash(&mut h);
        n.inputs.iter().for_each(|x| rep[x.0].hash(&mut h));
        n.meta.hash(&mut h);
        let h = h.finish();
        let same = |m: usize| {
            let o = graph.node(NodeId(m));
            same_op(&o.op, &n.op)
                && o.meta == n.meta
                && o.inputs.iter().zip(&n.inputs).all(|(a, b)| rep[a.0] == rep[b.0])
        };
        let mut at = head.get(&h).copied().unwrap_or(usize::MAX);
        while at != usize::MAX && !same(at) {
            at = next[at];
        }
        if at != usize::MAX {
            rep[id.0] = at;
            merged += 1;
        } else {
            next[id.0] = head.insert(h, id.0).unwrap_or(usize::MAX);
        }
    }
    Ok(Dedup { rep, merged })
}

/// Whether two primitive ops are the same op with the same attributes. Scalars compare by
/// their bits: `full(-0.0)` is not `full(0.0)` (f64's `==` says it is).
fn same_op(a: &coil_ir::Op, b: &coil_ir::Op) -> bool {
    use super::lang::ScalarKey;
    use coil_ir::Op;
    match (a, b) {
        (Op::Full(x), Op::Full(y)) => ScalarKey::new(*x) == ScalarKey::new(*y),
        (Op::Pad { pads: p, value: x }, Op::Pad { pads: q, value: y }) => {
            p == q && ScalarKey::new(*x) == ScalarKey::new(*y)
        }
        _ => a == b,
    }
}

/// The part of a graph that goes into the e-graph.
pub struct Region {
    /// Whether each graph node is inside.
    pub inside: Vec<bool>,
    /// The nodes inside, in graph order.
    pub nodes: Vec<NodeId>,
    /// The nodes inside that a graph output is or a node outside reads.
    pub roots: Vec<NodeId>,
}

/// The region around the nodes where rules may fire (reading the graph through `dd`), or
/// `None` when there are none. `live` is [`Graph::live_nodes`].
pub fn region(graph: &Graph, live: &[NodeId], dd: &Dedup) -> Option<Region> {
    let canonical: Vec<NodeId> = live.iter().copied().filter(|&id| dd.of(id) == id).collect();
    let mut inside = vec![false; graph.nodes.len()];
    let mut fires = vec![false; graph.nodes.len()];
    let mut any = false;
    for &id in canonical.iter().rev() {
        if !rules::may_fire(graph, id, &dd.rep) {
            continue;
        }
        any = true;
        fires[id.0] = true;
        inside[id.0] = true;
        for &x in &graph.node(id).inputs {
            let x = dd.of(x);
            inside[x.0] = true;
            for &y in &graph.node(x).inputs {
                // Views two levels down: what a rewrite above them can cancel against.
                let y = dd.of(y);
                inside[y.0] |= graph.node(y).op.is_view();
            }
        }
    }
    if !any {
        return None;
    }
    // And their view and pointwise readers: what a rewrite exposes one level up (a reshape
    // after two permutes that cancel, an add of a product that became zero).
    for &id in &canonical {
        let op = &graph.node(id).op;
        if !inside[id.0]
            && (op.is_view() || op.is_pointwise())
            && graph.node(id).inputs.iter().any(|&x| fires[dd.of(x).0])
        {
            inside[id.0] = true;
        }
    }
    // Leaves are cheaper to bring in as themselves than as region nodes: they stay outside.
    // So do templates (attention), which no rule rewrites: they enter as opaque values.
    for &id in &canonical {
        let op = &graph.node(id).op;
        if op.is_leaf() || op.is_template() {
            inside[id.0] = false;
        }
    }
    let mut root = vec![false; graph.nodes.len()];
    for &o in &graph.outputs {
        let o = dd.of(o);
        root[o.0] = inside[o.0];
    }
    for &id in &canonical {
        if !inside[id.0] {
            for &x in &graph.node(id).inputs {
                let x = dd.of(x);
                root[x.0] |= inside[x.0];
            }
        }
    }
    let nodes: Vec<NodeId> = canonical.iter().copied().filter(|id| inside[id.0]).collect();
    let roots = nodes.iter().copied().filter(|id| root[id.0]).collect();
    Some(Region { inside, nodes, roots })
}

/// Adds the region to an empty e-graph; returns each graph node's class (region nodes and the
/// values they read, by their canonical node).
pub fn add_region(graph: &Graph, region: &Region, dd: &Dedup, eg: &mut EG) -> Vec<Option<Id>> {
    let mut class_of: Vec<Option<Id>> = vec![None; graph.nodes.len()];
    for &id in &region.nodes {
        let n = graph.node(id);
        let mut args = Vec::with_capacity(n.inputs.len());
        for &x in &n.inputs {
            let x = dd.of(x);
            let c = match class_of[x.0] {
                Some(c) => c,
                None => {
                    let m = graph.node(x);
                    let op = match Prim::from_op(&m.op, &m.meta) {
                        Some(leaf) if leaf.is_leaf() => leaf,
                        _ => Prim::Opaque { node: x.0, shape: m.meta.shape.clone(), dtype: m.meta.dtype },
                    };
                    let c = eg.add(ENode::new(op, vec![]));
                    class_of[x.0] = Some(c);
                    c
                }
            };
            args.push(c);
        }
        let op = Prim::from_op(&n.op, &n.meta).expect("cse checked the graph is primitive");
        class_of[id.0] = Some(eg.add(ENode::new(op, args)));
    }
    class_of
}

/// A region after rewriting: the e-graph, each graph node's class, and the chosen node of
/// every class the region's roots need.
pub struct Rewritten<'a> {
    /// The region that went in.
    pub region: &'a Region,
    /// The e-graph after the rule stages.
    pub eg: &'a EG,
    /// Each graph node's class ([`add_region`]).
    pub class_of: &'a [Option<Id>],
    /// The extracted node of each class needed ([`super::cost::extract`]).
    pub chosen: &'a FxHashMap<Id, ENode>,
}

/// What a new graph node stands for while splicing.
#[derive(Clone, Copy)]
enum Key {
    /// A node outside the region, copied.
    Node(NodeId),
    /// A class of the region, built from its chosen node.
    Class(Id),
}

/// The graph with identical nodes merged and (when given) the region's roots replaced by
/// their chosen implementations. Nodes keep the graph's order where they can (a new node
/// comes just before its first reader) and the source line of the node they stand for. `None`
/// if the choice would read a value before it is computed (a cycle through the outside: never
/// expected, and then the graph is kept).
pub fn splice(graph: &Graph, live: &[NodeId], dd: &Dedup, rw: Option<&Rewritten>) -> Option<Graph> {
    let mut out = Graph::new();
    out.nodes.reserve(live.len());
    let mut of_node: Vec<Option<NodeId>> = vec![None; graph.nodes.len()];
    let mut of_class: FxHashMap<Id, NodeId> = FxHashMap::default();
    // Each class's source line and captured node (`Node::origin`): its first region node's.
    let mut location: FxHashMap<Id, Source> = FxHashMap::default();
    // A class that holds a value from outside the region (an opaque value, an input, a
    // constant) is that value: nothing is cheaper, and nothing is built twice.
    let mut outside: FxHashMap<Id, NodeId> = FxHashMap::default();
    let inside = |x: NodeId| rw.is_some_and(|rw| rw.region.inside[x.0]);
    if let Some(rw) = rw {
        for (i, c) in rw.class_of.iter().enumerate() {
            let Some(c) = c else { continue };
            if rw.region.inside[i] {
                let node = &graph.nodes[i];
                if node.location.is_some() || node.origin.is_some() {
                    location.entry(rw.eg.find(*c)).or_insert((node.location, node.origin));
                }
            } else {
                outside.entry(rw.eg.find(*c)).or_insert(NodeId(i));
            }
        }
    }
    for &id in &graph.inputs {
        out.nodes.push(graph.node(id).clone());
        of_node[id.0] = Some(NodeId(out.nodes.len() - 1));
        out.inputs.push(NodeId(out.nodes.len() - 1));
    }
    // What a graph node reads: its own copy outside the region, its class's choice inside.
    let key = |x: NodeId| {
        let x = dd.of(x);
        match rw {
            Some(rw) if rw.region.inside[x.0] => {
                let c = rw.eg.find(rw.class_of[x.0].expect("region nodes have classes"));
                outside.get(&c).map_or(Key::Class(c), |&n| Key::Node(n))
            }
            _ => Key::Node(x),
        }
    };
    let class_key = |c: Id| outside.get(&c).map_or(Key::Class(c), |&n| Key::Node(n));
    let mut is_root = vec![false; graph.nodes.len()];
    for r in rw.map_or(&[][..], |rw| &rw.region.roots[..]) {
        is_root[r.0] = true;
    }
    // What the outputs need through the choice: nothing dead is copied.
    let mut needed = vec![false; graph.nodes.len()];
    let mut needed_class: FxHashSet<Id> = FxHashSet::default();
    let mut work: Vec<Key> = graph.outputs.iter().map(|&o| key(o)).collect();
    while let Some(k) = work.pop() {
        match (k, rw) {
            (Key::Node(n), _) if !needed[n.0] => {
                needed[n.0] = true;
                work.extend(graph.node(n).inputs.iter().map(|&x| key(x)));
            }
            (Key::Class(c), Some(rw)) if needed_class.insert(c) => {
                work.extend(rw.chosen.get(&c)?.args.iter().map(|&a| class_key(rw.eg.find(a))));
            }
            _ => {}
        }
    }
    let is_needed = |k: &Key| match k {
        Key::Node(n) => needed[n.0],
        Key::Class(c) => needed_class.contains(c),
    };
    let todo = live.iter().filter(|&&x| dd.of(x) == x && (!inside(x) || is_root[x.0])).map(|&x| key(x));
    let todo = todo.filter(is_needed);
    let mut stack: Vec<(Key, bool, Source)> = Vec::new();
    let mut inputs: Vec<NodeId> = Vec::new();
    for start in todo.chain(graph.outputs.iter().map(|&o| key(o))) {
        // Most nodes are outside the region and come after their operands: copy them at once.
        if let Key::Node(n) = start {
            if of_node[n.0].is_some() {
                continue;
            }
            let node = graph.node(n);
            inputs.clear();
            for &x in &node.inputs {
                match key(x) {
                    Key::Node(m) if of_node[m.0].is_some() => inputs.push(of_node[m.0]?),
                    _ => break,
                }
            }
            if inputs.len() == node.inputs.len() {
                let inputs = inputs.clone();
                out.nodes.push(node.with_inputs(inputs));
                of_node[n.0] = Some(NodeId(out.nodes.len() - 1));
                continue;
            }
        }
        stack.push((start, false, (None, None)));
        while let Some((k, ready, loc)) = stack.pop() {
            let done = match k {
                Key::Node(n) => of_node[n.0].is_some(),
                Key::Class(c) => of_class.contains_key(&c),
            };
            if done {
                continue;
            }
            let (deps, loc): (Vec<Key>, _) = match (k, rw) {
                (Key::Node(n), _) => {
                    let node = graph.node(n);
                    (node.inputs.iter().map(|&x| key(x)).collect(), (node.location, node.origin))
                }
                (Key::Class(c), Some(rw)) => {
                    let deps = rw.chosen[&c].args.iter().map(|&a| class_key(rw.eg.find(a))).collect();
                    (deps, location.get(&c).copied().unwrap_or(loc))
                }
                (Key::Class(_), None) => unreachable!("classes only come from a region"),
            };
            if !ready {
                stack.push((k, true, loc));
                stack.extend(deps.iter().rev().map(|&d| (d, false, loc)));
                continue;
            }
            let mut inputs: Vec<NodeId> = Vec::with_capacity(deps.len());
            for d in &deps {
                inputs.push(match *d {
                    Key::Node(n) => of_node[n.0]?,
                    Key::Class(c) => *of_class.get(&c)?,
                });
            }
            let node = match (k, rw) {
                (Key::Node(n), _) => graph.node(n).with_inputs(inputs),
                (Key::Class(c), Some(rw)) => {
                    let (op, _) = rw.chosen[&c].op.to_op();
                    Node { op, inputs, meta: rw.eg[c].data.meta.clone(), location: loc.0, origin: loc.1 }
                }
                (Key::Class(_), None) => unreachable!("classes only come from a region"),
            };
            out.nodes.push(node);
            let new = NodeId(out.nodes.len() - 1);
            match k {
                Key::Node(n) => of_node[n.0] = Some(new),
                Key::Class(c) => {
                    of_class.insert(c, new);
                }
            }
        }
    }
    for &o in &graph.outputs {
        out.outputs.push(match key(o) {
            Key::Node(n) => of_node[n.0]?,
            Key::Class(c) => *of_class.get(&c)?,
        });
    }
    Some(out)
}
