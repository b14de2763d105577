//! The cost model (bytes moved and flops) and extraction that counts a shared node once.
//!
//! A node's cost, roughly what running it costs once fused kernels are formed:
//! * views (reshape, permute, expand, slice) and constants (`full`, `iota`): nothing, they
//!   fold into the index expressions of their readers; inputs: nothing;
//! * pointwise ops and `rand`: their output bytes and one flop per element;
//! * reductions: their output bytes and one flop per element read;
//! * `bmm`: its operands' and output's bytes, and `2 * batch * m * n * k` flops;
//! * data movement (pad, cat, gather, index_select, scatter, cumsum): their output bytes
//!   (scatter and cumsum also read their operand: they run as fallbacks on a buffer);
//! * a graph output that is a view, a constant or a random leaf must be written out: a view
//!   costs a copy (read and write), a constant or `rand` its write.
//!
//! A choice of nodes is scored by estimated time on the target, `bytes / bandwidth +
//! flops / flop_rate`, then by node count (fewer nodes win a tie).
//!
//! egg's `Extractor` scores trees: a class used twice is paid twice, so it would prefer
//! duplicating work to sharing it. [`extract`] is a greedy DAG extraction instead: the cost of
//! choosing a node for a class is the sum over the *set* of classes it depends on, so each
//! shared class counts once. It is greedy (per class), so its choice is compared with the
//! input graph's cost before it is used.

use super::lang::{ENode, Prim, EG};
use coil_ir::target::GpuTarget;
use coil_ir::{Graph, NodeId, Op, TensorMeta};
use egg::{Analysis, EGraph, Id, Language};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::fmt;
use std::rc::Rc;

/// The target the cost is estimated for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// Memory bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Arithmetic throughput, flops per second.
    pub flop_rate: f64,
}

impl Default for CostModel {
    /// An H100 ([`CostModel::gpu`] of [`GpuTarget::h100`]).
    fn default() -> CostModel {
        CostModel::gpu(&GpuTarget::h100())
    }
}

/// The share of [`GpuTarget::memory_bandwidth`] (the theoretical peak) that copies reach: ~3.0
/// TB/s measured on the H100 SXM5 against its 3.35.
pub const COPY_EFFICIENCY: f64 = 0.895;

/// The share of [`GpuTarget::tensor_flop_rate`] (the dense 16-bit peak at the driver's highest
/// clock) that matrix products are costed at: ~400 TFLOP/s on the H100 SXM5, whose peak is 1070
/// there, for dense f32/tf32 and 16-bit products alike (pointwise flops never bind next to
/// their bytes).
pub const TENSOR_EFFICIENCY: f64 = 0.375;

impl CostModel {
    /// A GPU: the target's peak memory bandwidth times [`COPY_EFFICIENCY`] and its peak tensor
    /// throughput times [`TENSOR_EFFICIENCY`], both from the bus, clocks, SMs and tensor-core
    /// generation the driver reports, so a consumer card gets its own bandwidth (an RTX 4090
    /// ~0.9 TB/s, an A100 40GB ~1.4, an H100 SXM5 3.0). Only the ratio of the two rates steers
    /// extraction (every choice is compared at the same rates). A GPU without tensor cores is
    /// costed as a Volta of its SMs and clock, so that its flop rate is not zero.
    ///
    /// ```
    /// use coil_ir::target::GpuTarget;
    /// use coil_passes::rewrite::CostModel;
    /// assert_eq!(CostModel::gpu(&GpuTarget::h100()), CostModel::default());
    /// let a100 = CostModel::gpu(&GpuTarget::a100());
    /// assert!(a100.flop_rate < CostModel::default().flop_rate);
    /// assert!(a100.bandwidth < CostModel::default().bandwidth);
    /// ```
    pub fn gpu(target: &GpuTarget) -> CostModel {
        let with_tensor_cores = GpuTarget { compute_capability: target.compute_capability.max((7, 0)), ..*target };
        CostModel {
            bandwidth: target.memory_bandwidth() * COPY_EFFICIENCY,
            flop_rate: with_tensor_cores.tensor_flop_rate() * TENSOR_EFFICIENCY,
        }
    }

    /// A CPU of a few cores: ~20 GB/s of memory bandwidth a few threads reach, ~200 GFLOP/s
    /// of f32 vector arithmetic (the `gemm` crate on AVX2 or NEON). Graphs compiled for the
    /// CPU backend have ten times the GPU's flops per byte, so products count for more.
    pub fn cpu() -> CostModel {
        CostModel { bandwidth: 2.0e10, flop_rate: 2.0e11 }
    }
}

/// Bytes moved and flops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Bytes read and written.
    pub bytes: u64,
    /// Arithmetic operations.
    pub flops: u64,
}

impl Cost {
    /// Estimated seconds on the target.
    pub fn seconds(&self, model: &CostModel) -> f64 {
        self.bytes as f64 / model.bandwidth + self.flops as f64 / model.flop_rate
    }
}

impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost { bytes: self.bytes + o.bytes, flops: self.flops + o.flops }
    }
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes, {} flops", self.bytes, self.flops)
    }
}

/// What the cost model distinguishes between ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Inputs, and values computed outside the e-graph's region.
    Given,
    /// `full`, `iota`.
    Constant,
    /// Counter-based random numbers, computed where they are read.
    Rand,
    /// Reshape, permute, expand, slice.
    View,
    /// Unary, binary, where, cast.
    Pointwise,
    /// Sum, prod, max, min, argmax, argmin.
    Reduce,
    /// Batched matrix product.
    Bmm,
    /// Scatter, cumsum and argsort: fallbacks that read their operands from buffers.
    Fallback,
    /// Pad, cat, gather, index_select.
    Movement,
}

impl Kind {
    /// The kind of an e-node's op.
    pub fn of_prim(op: &Prim) -> Kind {
        match op {
            Prim::Opaque { .. } | Prim::Input { .. } => Kind::Given,
            Prim::Full { .. } | Prim::Iota { .. } => Kind::Constant,
            Prim::Rand { .. } => Kind::Rand,
            op if op.is_view() => Kind::View,
            op if op.is_pointwise() => Kind::Pointwise,
            Prim::Reduce { .. } => Kind::Reduce,
            Prim::Bmm => Kind::Bmm,
            Prim::Scatter { .. } | Prim::Cumsum { .. } | Prim::Argsort { .. } => Kind::Fallback,
            _ => Kind::Movement,
        }
    }

    /// The kind of a graph op.
    pub fn of_op(op: &Op) -> Kind {
        match op {
            Op::Input { .. } => Kind::Given,
            Op::Full(_) | Op::Iota { .. } | Op::Scalar(_) => Kind::Constant,
            Op::Rand { .. } => Kind::Rand,
            op if op.is_view() => Kind::View,
            op if op.is_pointwise() => Kind::Pointwise,
            Op::Reduce { .. } => Kind::Reduce,
            Op::Bmm => Kind::Bmm,
            Op::Scatter { .. } | Op::Cumsum { .. } | Op::Argsort { .. } => Kind::Fallback,
            _ => Kind::Movement,
        }
    }
}

/// The cost of one node (see the module docs); `output` when its value is a graph output.
pub fn node_cost(kind: Kind, args: &[&TensorMeta], out: &TensorMeta, output: bool) -> Cost {
    let bytes = |m: &TensorMeta| m.nbytes() as u64;
    let numel = out.numel() as u64;
    let written = if output { bytes(out) } else { 0 };
    match kind {
        // Inputs are there already; an opaque value was paid for outside the region.
        Kind::Given => Cost::default(),
        Kind::Constant => Cost { bytes: written, flops: 0 },
        Kind::Rand => Cost { bytes: written, flops: numel },
        Kind::View => Cost { bytes: 2 * written, flops: 0 },
        Kind::Pointwise => Cost { bytes: bytes(out), flops: numel },
        Kind::Reduce => Cost { bytes: bytes(out), flops: args[0].numel() as u64 },
        Kind::Bmm => {
            let a = args[0];
            let k = a.shape[a.rank() - 1] as u64;
            Cost { bytes: bytes(args[0]) + bytes(args[1]) + bytes(out), flops: 2 * numel * k }
        }
        Kind::Fallback => Cost { bytes: bytes(out) + args.iter().map(|m| bytes(m)).sum::<u64>(), flops: numel },
        Kind::Movement => Cost { bytes: bytes(out), flops: 0 },
    }
}

/// The cost of some nodes of a primitive graph (each once); `output[i]` when node `i` is a
/// graph output.
pub fn nodes_cost(graph: &Graph, nodes: &[NodeId], output: &[bool]) -> Cost {
    let mut total = Cost::default();
    let mut args: Vec<&TensorMeta> = Vec::with_capacity(3);
    for &id in nodes {
        let n = graph.node(id);
        args.clear();
        args.extend(n.inputs.iter().map(|&x| graph.meta(x)));
        total = total + node_cost(Kind::of_op(&n.op), &args, &n.meta, output[id.0]);
    }
    total
}

/// Which nodes of a graph are outputs.
pub fn output_flags(graph: &Graph) -> Vec<bool> {
    let mut output = vec![false; graph.nodes.len()];
    for o in &graph.outputs {
        output[o.0] = true;
    }
    output
}

/// The cost of a primitive graph: every live node once.
pub fn graph_cost(graph: &Graph) -> Cost {
    nodes_cost(graph, &graph.live_nodes(), &output_flags(graph))
}

/// A class's best choice so far: the node, the classes it depends on (sorted ids, its own
/// included), and the summed score of those classes.
#[derive(Clone)]
struct Best {
    node: usize,
    deps: Rc<Vec<u32>>,
    score: f64,
}

/// Evaluations per e-node before the greedy extraction stops improving (it converges in one or
/// two on graphs without cycles; this bounds it on any e-graph).
const MAX_EVALS_PER_NODE: usize = 8;

/// One node per class reachable from `roots`: the greedy DAG choice (see the module docs).
/// `outputs` are the classes that are graph outputs. `None` if some root has no finite choice
/// or the choice has a cycle (then the caller keeps the graph it has).
pub fn extract(eg: &EG, roots: &[Id], outputs: &[Id], model: &CostModel) -> Option<HashMap<Id, ENode>> {
    let size = eg.nodes().len();
    let mut output = vec![false; size];
    for &r in outputs {
        output[usize::from(eg.find(r))] = true;
    }
    // Local scores of every node, once. A class holding an input is that input: nothing is
    // cheaper, and the graph keeps it.
    let mut local: Vec<Vec<Option<f64>>> = vec![Vec::new(); size];
    for class in eg.classes() {
        let input = class.nodes.iter().any(|n| matches!(n.op, Prim::Input { .. }));
        local[usize::from(class.id)] = class
            .nodes
            .iter()
            .map(|n| {
                if input && !matches!(n.op, Prim::Input { .. }) {
                    return None;
                }
                let args: Vec<&TensorMeta> = n.args.iter().map(|&a| &eg[a].data.meta).collect();
                let out = output[usize::from(class.id)];
                Some(node_cost(Kind::of_prim(&n.op), &args, &class.data.meta, out).seconds(model))
            })
            .collect();
    }
    extract_dag(eg, roots, &local)
}

/// The greedy DAG extraction of any e-graph (this pass's, and the composite-level one of
/// [`crate::templates`]): one node per class reachable from `roots`, where choosing a node
/// costs its own `local[class][node]` seconds plus those of the *set* of classes it depends
/// on, so each shared class counts once. `None` in `local` is a node that may not be chosen.
/// `None` if some root has no choice or the choice has a cycle.
///
/// A worklist re-evaluates a class when one of its operands' choice changed; classes are
/// indexed densely by their id. Ties go to fewer classes, then to the earlier node.
pub fn extract_dag<L: Language, N: Analysis<L>>(
    eg: &EGraph<L, N>,
    roots: &[Id],
    local: &[Vec<Option<f64>>],
) -> Option<HashMap<Id, L>> {
    let size = eg.nodes().len();
    let mut ids: Vec<Id> = eg.classes().map(|c| c.id).collect();
    ids.sort_unstable();
    let mut best: Vec<Option<Best>> = vec![None; size];
    // The score of each class's current choice.
    let mut chosen_score = vec![0.0f64; size];
    let mut queue: std::collections::VecDeque<Id> = ids.iter().copied().collect();
    let mut queued = vec![false; size];
    for &id in &ids {
        queued[usize::from(id)] = true;
    }
    let mut budget = MAX_EVALS_PER_NODE * eg.total_number_of_nodes().max(1);
    let mut deps: Vec<u32> = Vec::new();
    while let Some(id) = queue.pop_front() {
        let c = usize::from(id);
        queued[c] = false;
        if budget == 0 {
            break;
        }
        let class = &eg[id];
        let mut pick: Option<Best> = None;
        for (i, n) in class.nodes.iter().enumerate() {
            let Some(own) = local[c][i] else { continue };
            budget = budget.saturating_sub(1);
            deps.clear();
            let mut complete = true;
            for &a in n.children() {
                match &best[usize::from(eg.find(a))] {
                    Some(b) => deps.extend_from_slice(&b.deps),
                    None => complete = false,
                }
            }
            if !complete {
                continue;
            }
            deps.sort_unstable();
            deps.dedup();
            if deps.binary_search(&(c as u32)).is_ok() {
                continue; // the node depends on its own class
            }
            // Shared classes count once: each dependency's current score, plus this node's.
            let score = own + deps.iter().map(|&d| chosen_score[d as usize]).sum::<f64>();
            let better = match &pick {
                None => true,
                Some(p) => score < p.score || (score == p.score && deps.len() + 1 < p.deps.len()),
            };
            if better {
                let mut set = deps.clone();
                let at = set.binary_search(&(c as u32)).unwrap_err();
                set.insert(at, c as u32);
                pick = Some(Best { node: i, deps: Rc::new(set), score });
            }
        }
        let Some(p) = pick else { continue };
        let same = best[c].as_ref().is_some_and(|b| b.node == p.node && b.score == p.score && b.deps == p.deps);
        if same {
            continue;
        }
        chosen_score[c] = local[c][p.node].expect("chosen nodes have a cost");
        best[c] = Some(p);
        for parent in class.parents() {
            let parent = eg.find(parent);
            if !queued[usize::from(parent)] {
                queued[usize::from(parent)] = true;
                queue.push_back(parent);
            }
        }
    }
    // Walk the choice from the roots, refusing cycles.
    let mut chosen: HashMap<Id, L> = HashMap::default();
    let mut on_path: HashSet<Id> = HashSet::default();
    let mut stack: Vec<(Id, bool)> = roots.iter().rev().map(|&r| (eg.find(r), false)).collect();
    while let Some((id, done)) = stack.pop() {
        if done {
            on_path.remove(&id);
            continue;
        }
        if chosen.contains_key(&id) {
            continue;
        }
        on_path.insert(id);
        let n = eg[id].nodes[best[usize::from(id)].as_ref()?.node].clone();
        stack.push((id, true));
        for &a in n.children().iter().rev() {
            let a = eg.find(a);
            if on_path.contains(&a) {
                return None;
            }
            if !chosen.contains_key(&a) {
                stack.push((a, false));
            }
        }
        chosen.insert(id, n);
    }
    Some(chosen)
}

/// The cost of a choice made by [`extract`]: each chosen class once.
pub fn choice_cost(eg: &EG, chosen: &HashMap<Id, ENode>, outputs: &[Id]) -> Cost {
    let outputs: HashSet<Id> = outputs.iter().map(|&r| eg.find(r)).collect();
    let mut total = Cost::default();
    let mut ids: Vec<&Id> = chosen.keys().collect();
    ids.sort_unstable();
    for id in ids {
        let n = &chosen[id];
        let args: Vec<&TensorMeta> = n.args.iter().map(|&a| &eg[a].data.meta).collect();
        total = total + node_cost(Kind::of_prim(&n.op), &args, &eg[*id].data.meta, outputs.contains(id));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_h100_keeps_its_measured_anchor() {
        // ~3.0 TB/s of copy and ~400 TFLOP/s of matrix products, measured (within 1%).
        let h100 = CostModel::gpu(&GpuTarget::h100());
        assert!((h100.bandwidth / 3.0e12 - 1.0).abs() < 0.01, "{h100:?}");
        assert!((h100.flop_rate / 4.0e14 - 1.0).abs() < 0.01, "{h100:?}");
    }

    #[test]
    fn each_gpu_gets_its_own_bandwidth() {
        let [h100, a100, rtx_4090] =
            [GpuTarget::h100(), GpuTarget::a100(), GpuTarget::rtx_4090()].map(|t| CostModel::gpu(&t));
        assert!(a100.bandwidth < 0.5 * h100.bandwidth, "{a100:?}");
        assert!((a100.bandwidth / (1.555e12 * COPY_EFFICIENCY) - 1.0).abs() < 0.01, "{a100:?}");
        // A consumer card is costed by its own bus, not its generation's data-center part's.
        assert!(rtx_4090.bandwidth < 0.7 * a100.bandwidth, "{rtx_4090:?}");
        assert!((rtx_4090.bandwidth / (1.008e12 * COPY_EFFICIENCY) - 1.0).abs() < 0.01, "{rtx_4090:?}");
        // Its SMs do half the A100's tensor work per clock, at a higher clock on more SMs.
        assert!((rtx_4090.flop_rate / a100.flop_rate - 330.3 / 312.0).abs() < 0.01, "{rtx_4090:?}");
    }

    #[test]
    fn a_gpu_without_tensor_cores_has_a_positive_flop_rate() {
        let pascal = GpuTarget { compute_capability: (6, 0), ..GpuTarget::v100() };
        assert_eq!(CostModel::gpu(&pascal).flop_rate, CostModel::gpu(&GpuTarget::v100()).flop_rate);
    }
}
