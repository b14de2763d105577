//! Templates chosen by e-graph rewriting: the composite-level stage that finds where a fused
//! implementation (today the attention template, [`crate::attention`]) replaces the
//! written-out ops, as rewrite rules and extraction by cost, the same mechanism as the
//! primitive-level simplification ([`crate::rewrite`]).
//!
//! # Design
//!
//! * **Where it runs.** On the captured (composite-level) graph, before decomposition (in
//!   [`crate::decompose_with`] with [`crate::DecomposeOptions::fused_attention`]): softmax and
//!   matmul are still whole ops there, and the template node it makes is what decomposition
//!   keeps. The primitive pass after decomposition would see the softmax as max, sub, exp, sum
//!   and div, and the products as bmm of reshapes: a far larger pattern for the same chain. So
//!   this stage has its own small language ([`lang`]): the graph ops the rules name, attributes
//!   normalized into the op (`softmax` is over the last dim, `transpose` swaps the last two,
//!   `cast_f32` casts to f32), and every other node opaque (`Other(index)`, its operands its
//!   children). As in the rewrite pass, only a *region* goes in: the nodes of those ops, their
//!   other operands as opaque leaves; the region's nodes that are outputs or read outside it
//!   are the roots extraction must keep (so an intermediate read elsewhere is kept). The e-graph
//!   of the whole graph would cost far more: extraction's dependency sets grow with the depth
//!   of a transformer. The stage is skipped when the graph has no softmax over its last dim
//!   (no rule can fire).
//! * **The rules** ([`rules`]) are egg patterns with conditions, applied by egg's runner. The
//!   template is matched in small steps that each add a virtual `scores(q, k, scale, mask,
//!   width)` node to a class of the chain (the scale, the mask and an f32 cast in any order,
//!   each at most once), then `attention(q, k, v, scale, mask)` to the class of the final
//!   product. Conditions are Rust where they must read what a pattern cannot: the scale's
//!   constant, the causal mask's structure (from the graph nodes computing it), dtypes, and
//!   what the template supports. Every right side is type-checked against its class.
//! * **Extraction** is the greedy DAG extraction of the rewrite pass
//!   ([`crate::rewrite::cost::extract_dag`]), shared classes counted once, under the costs of
//!   [`lang::node_seconds`]: bytes moved and flops at the target's rates plus a launch per
//!   kernel. The template moves q, k, v and its output; the chain writes and reads the
//!   `[.., L, S]` scores at every step; virtual `scores` nodes cannot be chosen. So where the
//!   chain's nodes are private the template is always cheaper (it does the same products and
//!   moves a subset of the bytes). Where a node of the chain is an output or read elsewhere,
//!   the greedy choice, which scores each class on its own, would still see the template as
//!   cheaper (the product's score includes the chain); so each chosen template is re-costed at
//!   the margin: it and the product it replaces cost their own node plus the classes they need
//!   that the rest of the region does not, and the cheaper is kept.
//! * **No recomputation.** The template recomputes the scores: where extraction chose it
//!   while a node of its chain is still chosen (needed by another reader or an output), it is
//!   refused (counted in [`TemplateReport::refused`]), as Inductor's pattern replacement
//!   refuses a match whose intermediates have other users. The cost model alone would
//!   sometimes pick it there (recomputing `q @ k^T` on tensor cores can move fewer bytes than
//!   reading large probabilities), but whether the template beats the product of
//!   probabilities it has to read anyway is not measured, and the structure of a graph should
//!   not change with its sizes (dynamic shapes compile at probe sizes).
//!
//! Cost: on GPT-2 written out (12 layers, 520 captured nodes) the region is 157 nodes, the
//! e-graph 343, and the stage ~0.7 ms; a graph without a last-dim softmax costs one scan.
//!
//! Determinism: egg runs with its `deterministic` feature, rules search classes in insertion
//! order, the runner's limits that bind are iterations and nodes (the time limit is a
//! backstop), and extraction breaks ties by class count and node order: the same graph gives
//! the same result every run.

pub mod lang;
pub mod rules;

use crate::attention::AttentionMatch;
use coil_ir::{Graph, NodeId, Op};
use egg::{Id, Runner, SimpleScheduler};
use lang::{op_of, CNode, COp, Facts, CEG};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::fmt;
use std::time::{Duration, Instant};

/// What the stage did: its [`Display`](fmt::Display) is the text the explain shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TemplateReport {
    /// How often each rule changed the e-graph, in [`rules::RULES`] order; rules that never
    /// fired are absent.
    pub fired: Vec<(String, usize)>,
    /// Templates extracted and used.
    pub chosen: usize,
    /// Templates extracted but refused: a node of their chain is needed anyway.
    pub refused: usize,
    /// Graph nodes put into the e-graph (0 when no rule could fire).
    pub region_nodes: usize,
    /// Size of the final e-graph.
    pub egraph_nodes: usize,
    /// Iterations the runner made.
    pub iterations: usize,
    /// `saturated`, or the limit that stopped the runner.
    pub stop_reason: String,
    /// Wall-clock seconds of the stage.
    pub seconds: f64,
}

impl TemplateReport {
    /// How often rule `name` fired.
    pub fn fired(&self, name: &str) -> usize {
        self.fired.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c)
    }
}

impl fmt::Display for TemplateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "templates: {} chosen, {} refused (a chain node needed anyway)", self.chosen, self.refused)?;
        writeln!(f, "region: {} nodes, e-graph: {} nodes", self.region_nodes, self.egraph_nodes)?;
        writeln!(f, "iterations: {}, stop reason: {}", self.iterations, self.stop_reason)?;
        writeln!(f, "time: {:.3} ms", self.seconds * 1e3)?;
        crate::rewrite::write_fired(f, &self.fired)
    }
}

/// Iterations: a chain is matched in at most five steps (scores, scale, mask, cast, template).
const ITER_LIMIT: usize = 8;
/// E-graph size (nodes) at which the runner stops: each graph node gets at most one virtual
/// node, plus a handful of leaves.
const NODE_LIMIT_PER_NODE: usize = 4;

/// The attention templates of a captured graph, in graph order, chosen by e-graph rewriting
/// and extraction (see the module docs), and what the stage did.
pub fn choose_attention(graph: &Graph) -> (Vec<AttentionMatch>, TemplateReport) {
    let start = Instant::now();
    let mut report =
        TemplateReport { stop_reason: "not run: no softmax over the last dim".into(), ..Default::default() };
    let live = graph.live_nodes();
    if !live.iter().any(|&n| op_of(graph, n) == COp::Softmax) {
        report.seconds = start.elapsed().as_secs_f64();
        return (vec![], report);
    }
    // The region: the live nodes whose op the rules name; their other operands enter as
    // opaque leaves. A `where`'s condition gets its mask structure.
    let in_region: Vec<bool> = (0..graph.nodes.len()).map(|i| op_of(graph, NodeId(i)) != COp::Other(i)).collect();
    let mut cond = vec![false; graph.nodes.len()];
    // Region nodes that a graph output is or a node outside reads: what extraction must keep.
    let mut root = vec![false; graph.nodes.len()];
    for &o in &graph.outputs {
        root[o.0] = true;
    }
    for &n in &live {
        let node = graph.node(n);
        if node.op == Op::Where {
            cond[node.inputs[0].0] = true;
        }
        if !in_region[n.0] {
            node.inputs.iter().for_each(|x| root[x.0] = true);
        }
    }
    let mut eg = CEG::new(Facts);
    let mut class_of: Vec<Option<Id>> = vec![None; graph.nodes.len()];
    let mut region = Vec::new();
    for &n in live.iter().filter(|n| in_region[n.0]) {
        let mut args = Vec::with_capacity(graph.node(n).inputs.len());
        for &x in &graph.node(n).inputs {
            let id = *class_of[x.0].get_or_insert_with(|| eg.add(CNode { op: COp::Other(x.0), args: vec![] }));
            if eg[id].data.node.is_none() {
                eg[id].data = Facts::of_node(graph, x, cond[x.0]);
            }
            args.push(id);
        }
        let id = eg.add(CNode { op: op_of(graph, n), args });
        if eg[id].data.node.is_none() {
            eg[id].data = Facts::of_node(graph, n, cond[n.0]);
        }
        class_of[n.0] = Some(id);
        region.push(n);
    }
    report.region_nodes = region.len();
    let runner = Runner::<CNode, Facts>::default()
        .with_egraph(eg)
        .with_scheduler(SimpleScheduler)
        .with_iter_limit(ITER_LIMIT)
        .with_node_limit(NODE_LIMIT_PER_NODE * region.len() + 64)
        .with_time_limit(Duration::from_secs(30))
        .run(rules::rewrites());
    let mut fired = vec![0usize; rules::RULES.len()];
    for it in &runner.iterations {
        for (rule, count) in &it.applied {
            fired[rules::RULES.iter().position(|r| *r == rule.as_str()).expect("a rule of the table")] += count;
        }
    }
    report.fired = rules::RULES.iter().zip(fired).filter(|(_, c)| *c > 0).map(|(n, c)| (n.to_string(), c)).collect();
    report.iterations = runner.iterations.len();
    report.stop_reason = crate::rewrite::stop_text(&runner.stop_reason);
    let eg = runner.egraph;
    report.egraph_nodes = eg.total_number_of_nodes();
    let roots: Vec<NodeId> = region.iter().copied().filter(|n| root[n.0]).collect();
    let found = if report.fired("attention") > 0 {
        extract(graph, &region, &roots, &eg, &class_of, &mut report)
    } else {
        vec![]
    };
    report.chosen = found.len();
    report.seconds = start.elapsed().as_secs_f64();
    (found, report)
}

/// Classes reachable from `from` through the choice `choice`, not entering `stop`.
fn reach(eg: &CEG, choice: &HashMap<Id, CNode>, from: &[Id], stop: Option<Id>) -> HashSet<Id> {
    let mut seen = HashSet::default();
    let mut stack: Vec<Id> = from.iter().map(|&c| eg.find(c)).collect();
    while let Some(c) = stack.pop() {
        if Some(c) == stop || !seen.insert(c) {
            continue;
        }
        stack.extend(choice[&c].args.iter().map(|&a| eg.find(a)));
    }
    seen
}

/// Extracts the cheapest graph and reads the templates it chose off it.
///
/// The greedy DAG extraction scores each class on its own, so a template looks cheaper than
/// a product of probabilities that another reader needs anyway (the product's score includes
/// the chain). So each template's class is then re-costed at the margin: the template and
/// the product it replaces each cost their own node plus the classes they need that the rest
/// of the graph does not; the cheaper is kept.
fn extract(
    graph: &Graph,
    region: &[NodeId],
    roots: &[NodeId],
    eg: &CEG,
    class_of: &[Option<Id>],
    report: &mut TemplateReport,
) -> Vec<AttentionMatch> {
    let model = crate::rewrite::CostModel::default();
    let mut local: Vec<Vec<Option<f64>>> = vec![Vec::new(); eg.nodes().len()];
    for class in eg.classes() {
        local[usize::from(class.id)] = class.nodes.iter().map(|n| lang::node_seconds(eg, n, &model)).collect();
    }
    let class = |n: NodeId| eg.find(class_of[n.0].expect("region nodes and operands have classes"));
    let all: Vec<Id> = region.iter().map(|&n| class(n)).collect();
    let Some(mut choice) = crate::rewrite::cost::extract_dag(eg, &all, &local) else { return vec![] };
    let outputs: Vec<Id> = roots.iter().map(|&o| class(o)).collect();
    let own = |n: &CNode| lang::node_seconds(eg, n, &model).unwrap_or(f64::INFINITY);
    for &root in region {
        let r = class(root);
        if choice[&r].op != COp::Attention || graph.node(root).op != Op::Matmul {
            continue;
        }
        let product = eg[r].nodes.iter().find(|n| n.op == COp::Matmul).expect("the template replaces a product");
        let elsewhere = reach(eg, &choice, &outputs, Some(r));
        let margin = |n: &CNode| {
            let needs = reach(eg, &choice, &n.args, None);
            own(n) + needs.iter().filter(|c| !elsewhere.contains(c)).map(|c| own(&choice[c])).sum::<f64>()
        };
        if margin(product) < margin(&choice[&r]) {
            choice.insert(r, product.clone());
        }
    }
    let chosen = reach(eg, &choice, &outputs, None);
    let node_of = |id: Id| eg[id].data.node.expect("operands of the template are graph values");
    let has_scores = |n: NodeId| eg[class(n)].nodes.iter().any(|e| e.op == COp::Scores);
    let mut found = Vec::new();
    for &root in region {
        let attention = &choice[&class(root)];
        if attention.op != COp::Attention || !chosen.contains(&class(root)) || graph.node(root).op != Op::Matmul {
            continue;
        }
        // The chain from the probabilities back to the scores' product: the operand that is
        // a partial match at each step (softmax and the cast back have one operand).
        let mut intermediates = Vec::new();
        let mut x = graph.node(root).inputs[0];
        loop {
            intermediates.push(x);
            let n = graph.node(x);
            if n.op == Op::Matmul || intermediates.len() > 8 {
                break;
            }
            x = n.inputs.iter().copied().find(|&i| has_scores(i)).unwrap_or(n.inputs[0]);
        }
        if intermediates.iter().any(|&n| chosen.contains(&class(n))) {
            report.refused += 1;
            continue;
        }
        let arg = |i: usize| eg.find(attention.args[i]);
        let causal = eg[arg(4)].nodes.iter().any(|e| e.op == COp::Causal);
        found.push(AttentionMatch {
            root,
            q: node_of(arg(0)),
            k: node_of(arg(1)),
            v: node_of(arg(2)),
            causal,
            scale: eg[arg(3)].data.konst.expect("the scale is a constant"),
            intermediates,
        });
    }
    found
}
