//! Simplification by e-graph rewriting (egg), between decomposition and lowering.
//!
//! [`simplify`] first merges identical nodes (CSE), then puts the *region* of the graph where
//! some rule may fire into an e-graph ([`region`]: those nodes and the operands they read; the
//! rest of the graph enters as opaque leaves, so shared nodes stay shared), runs the rule
//! stages of [`rules`] under node, iteration and time limits, and extracts the cheapest
//! equivalent region under the cost model of [`cost`] (bytes moved and flops, a shared node
//! counted once), which is spliced back into the graph. The result has the same inputs and
//! outputs (order and metas) and satisfies
//! [`Graph::verify_primitive`](coil_ir::Graph::verify_primitive); when nothing cheaper is
//! found, the input graph is returned as it is.
//!
//! The rules ([`rules`]) are a table of egg patterns with conditions ([`pattern`]), one line
//! per rule and operand order, plus the few written in code ([`coded`]) because they read or
//! compute op attributes; [`rules`] says how to add one. The cost model's rates are the
//! target's ([`CostModel::gpu`], [`CostModel::cpu`], [`RewriteOptions::for_target`]).
//!
//! ```
//! use coil_ir::{BinaryOp, DType, Graph, Op, Scalar, TensorMeta, UnaryOp};
//! use coil_passes::rewrite::{simplify, RewriteOptions};
//! let mut g = Graph::new();
//! let x = g.input(TensorMeta::new(vec![4], DType::F32));
//! let one = g.full(Scalar::Float(1.0), vec![4], DType::F32, None);
//! let y = g.push(Op::Binary(BinaryOp::Mul), &[x, one], None).unwrap();
//! let z = g.push(Op::Unary(UnaryOp::Exp), &[y], None).unwrap();
//! g.outputs.push(z);
//! let (out, report) = simplify(&g, &RewriteOptions::default()).unwrap();
//! assert_eq!(report.fired("mul-one"), 1);
//! assert_eq!(out.to_string(), "graph(%0: f32[4]) {\n  %1: f32[4] = exp(%0)\n  return (%1)\n}\n");
//! ```
//!
//! Determinism: egg runs with its `deterministic` feature (its maps iterate in insertion
//! order), rules search classes in that order, extraction breaks ties by node count and then
//! by node order, and the limits that bind on real graphs are the node and iteration limits;
//! the time limit is a generous backstop. So the same graph gives the same output every run.
//!
//! Cost: only the region goes through egg (on a GPT-2 block, 6 of 122 nodes), so the pass
//! stays a small fraction of compile time; the rest of the graph costs one CSE pass and one
//! copy.

pub mod coded;
pub mod cost;
pub mod lang;
pub mod pattern;
pub mod region;
pub mod rules;
#[cfg(test)]
mod rules_tests;
#[cfg(test)]
mod tests;

pub use cost::{Cost, CostModel};

use coil_ir::{Graph, NodeId, Result};
use egg::{Id, Runner, SimpleScheduler, StopReason};
use lang::{ENode, Facts, EG};
use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

/// Settings of the rewrite pass.
#[derive(Clone, Debug, PartialEq)]
pub struct RewriteOptions {
    /// `false` returns the graph unchanged ([`coil_ir::config::Config::rewrite`];
    /// `COIL_REWRITE=0`).
    pub enabled: bool,
    /// E-graph size (nodes) at which a stage stops.
    pub node_limit: usize,
    /// Iterations per stage.
    pub iter_limit: usize,
    /// Wall-clock backstop per stage; the node and iteration limits bind first on real graphs,
    /// so that output does not depend on the machine's speed.
    pub time_limit: Duration,
    /// The target the cost is estimated for: [`CostModel::gpu`] of the GPU code is generated
    /// for, or [`CostModel::cpu`] ([`RewriteOptions::for_target`]); an H100 by default.
    pub model: CostModel,
}

impl Default for RewriteOptions {
    fn default() -> RewriteOptions {
        RewriteOptions {
            enabled: true,
            node_limit: 20_000,
            iter_limit: 16,
            time_limit: Duration::from_secs(30),
            model: CostModel::default(),
        }
    }
}

impl RewriteOptions {
    /// The defaults, switched off when the configuration says so
    /// ([`coil_ir::config::Config::rewrite`]; `COIL_REWRITE=0` in the environment).
    pub fn configured() -> RewriteOptions {
        RewriteOptions { enabled: coil_ir::config::current().rewrite, ..RewriteOptions::default() }
    }

    /// [`RewriteOptions::configured`], costed for the GPU `gpu` (its memory bandwidth and tensor
    /// throughput, [`CostModel::gpu`]), or for the CPU when `gpu` is `None`.
    ///
    /// ```
    /// use coil_ir::target::GpuTarget;
    /// use coil_passes::rewrite::{CostModel, RewriteOptions};
    /// let a100 = RewriteOptions::for_target(Some(&GpuTarget::a100()));
    /// assert_eq!(a100.model, CostModel::gpu(&GpuTarget::a100()));
    /// assert_eq!(RewriteOptions::for_target(None).model, CostModel::cpu());
    /// ```
    pub fn for_target(gpu: Option<&coil_ir::target::GpuTarget>) -> RewriteOptions {
        let model = gpu.map_or_else(CostModel::cpu, CostModel::gpu);
        RewriteOptions { model, ..RewriteOptions::configured() }
    }
}

/// What one stage of rules did.
#[derive(Clone, Debug, PartialEq)]
pub struct StageReport {
    /// `simplify` or `algebra`.
    pub name: &'static str,
    /// Iterations the runner made (0 when the stage was skipped).
    pub iterations: usize,
    /// `saturated`, `iteration limit (N)`, `node limit (N)` or `time limit (S s)`.
    pub stop_reason: String,
}

/// What the pass did: the text of `rewrites.txt` is its [`Display`](fmt::Display).
#[derive(Clone, Debug, PartialEq)]
pub struct RewriteReport {
    /// `false` when the pass was switched off.
    pub enabled: bool,
    /// How often each rule changed the e-graph (`constant-fold` counts classes folded), in
    /// the order the rules are listed; rules that never fired are absent.
    pub fired: Vec<(String, usize)>,
    /// The stages that ran on the region, in order (none when no rule could fire).
    pub stages: Vec<StageReport>,
    /// Size of the final e-graph.
    pub egraph_nodes: usize,
    /// Classes of the final e-graph.
    pub egraph_classes: usize,
    /// Graph nodes put into the e-graph (the region where rules may fire).
    pub region_nodes: usize,
    /// Live nodes of the graph going in, inputs not counted.
    pub nodes_before: usize,
    /// ... and coming out.
    pub nodes_after: usize,
    /// The graph's estimated bytes and flops going in ([`cost`]).
    pub cost_before: Cost,
    /// ... and coming out.
    pub cost_after: Cost,
    /// Whether the graph changed (identical nodes merged, or a cheaper region extracted).
    pub accepted: bool,
    /// Wall-clock seconds of the whole pass.
    pub seconds: f64,
}

impl RewriteReport {
    /// How often rule `name` fired.
    pub fn fired(&self, name: &str) -> usize {
        self.fired.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c)
    }

    /// Iterations over all stages.
    pub fn iterations(&self) -> usize {
        self.stages.iter().map(|s| s.iterations).sum()
    }

    /// The stop reason of the last stage that ran (`none ran` when no rule could fire).
    pub fn stop_reason(&self) -> &str {
        self.stages.iter().rev().find(|s| s.iterations > 0).map_or("none ran", |s| s.stop_reason.as_str())
    }
}

impl fmt::Display for RewriteReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.enabled {
            return writeln!(f, "rewrite: off (COIL_REWRITE=0)");
        }
        let verdict = if self.accepted { "rewritten graph used" } else { "nothing cheaper found: graph unchanged" };
        writeln!(f, "rewrite: {verdict}")?;
        writeln!(f, "graph nodes: {} -> {}", self.nodes_before, self.nodes_after)?;
        writeln!(f, "region: {} of {} nodes", self.region_nodes, self.nodes_before)?;
        writeln!(f, "e-graph: {} nodes, {} classes", self.egraph_nodes, self.egraph_classes)?;
        for s in &self.stages {
            writeln!(f, "stage {}: {} iterations, stop: {}", s.name, s.iterations, s.stop_reason)?;
        }
        writeln!(f, "iterations: {}, stop reason: {}", self.iterations(), self.stop_reason())?;
        writeln!(f, "time: {:.3} ms", self.seconds * 1e3)?;
        writeln!(f, "cost before: {}", self.cost_before)?;
        writeln!(f, "cost after:  {}", self.cost_after)?;
        write_fired(f, &self.fired)
    }
}

/// The `rules fired:` list of a report (this pass's and the template stage's), one rule a line.
pub(crate) fn write_fired(f: &mut fmt::Formatter<'_>, fired: &[(String, usize)]) -> fmt::Result {
    writeln!(f, "rules fired:")?;
    if fired.is_empty() {
        writeln!(f, "  (none)")?;
    }
    for (name, count) in fired {
        writeln!(f, "  {name}: {count}")?;
    }
    Ok(())
}

pub(crate) fn stop_text(reason: &Option<StopReason>) -> String {
    match reason {
        Some(StopReason::Saturated) => "saturated".into(),
        Some(StopReason::IterationLimit(n)) => format!("iteration limit ({n})"),
        Some(StopReason::NodeLimit(n)) => format!("node limit ({n})"),
        Some(StopReason::TimeLimit(s)) => format!("time limit ({s:.1} s)"),
        Some(StopReason::Other(s)) => s.clone(),
        None => "not run".into(),
    }
}

/// Simplifies a primitive graph (see the module docs). The graph must be primitive (as
/// [`decompose`](crate::decompose()) makes it; [`lower`](crate::lower()) verifies it): a
/// composite op is an error.
pub fn simplify(graph: &Graph, options: &RewriteOptions) -> Result<(Graph, RewriteReport)> {
    let start = Instant::now();
    let live = graph.live_nodes();
    let output = cost::output_flags(graph);
    let cost_before = cost::nodes_cost(graph, &live, &output);
    let mut report = RewriteReport {
        enabled: options.enabled,
        fired: vec![],
        stages: vec![],
        egraph_nodes: 0,
        egraph_classes: 0,
        region_nodes: 0,
        nodes_before: live.iter().filter(|id| !matches!(graph.node(**id).op, coil_ir::Op::Input { .. })).count(),
        nodes_after: 0,
        cost_before,
        cost_after: cost_before,
        accepted: false,
        seconds: 0.0,
    };
    report.nodes_after = report.nodes_before;
    if !options.enabled {
        return Ok((graph.clone(), report));
    }
    let mut fired: HashMap<String, usize> = HashMap::new();

    // Identical nodes anywhere become one, without an e-graph.
    let dd = region::cse(graph, &live)?;
    if dd.merged > 0 {
        fired.insert("cse".into(), dd.merged);
    }
    // The region where rules may fire goes into the e-graph; the cheapest equivalent comes out.
    let mut result = None;
    if let Some(region) = region::region(graph, &live, &dd) {
        report.region_nodes = region.nodes.len();
        result = rewrite_region(graph, &live, &dd, &region, options, &mut report, &mut fired);
    }
    if result.is_none() && dd.merged > 0 {
        result = region::splice(graph, &live, &dd, None);
    }
    report.fired = rules::rule_names().into_iter().filter_map(|n| fired.get(n).map(|&c| (n.to_string(), c))).collect();
    if let Some(out) = &result {
        // `splice` copies only what the outputs need (and every input).
        let all: Vec<NodeId> = (0..out.nodes.len()).map(NodeId).collect();
        report.accepted = true;
        report.cost_after = cost::nodes_cost(out, &all, &cost::output_flags(out));
        report.nodes_after = out.nodes.len() - out.inputs.len();
    }
    report.seconds = start.elapsed().as_secs_f64();
    Ok((result.unwrap_or_else(|| graph.clone()), report))
}

/// Runs the rule stages on a region and returns the graph with the region's cheapest
/// equivalent spliced in (and identical nodes merged), or `None` when it is not cheaper.
fn rewrite_region(
    graph: &Graph,
    live: &[NodeId],
    dd: &region::Dedup,
    region: &region::Region,
    options: &RewriteOptions,
    report: &mut RewriteReport,
    fired: &mut HashMap<String, usize>,
) -> Option<Graph> {
    let mut eg = EG::new(Facts::default());
    let class_of = region::add_region(graph, region, dd, &mut eg);
    for (name, rules) in rules::stages() {
        if *name == "algebra" && !rules::algebra_may_fire(&eg) {
            report.stages.push(StageReport {
                name,
                iterations: 0,
                stop_reason: "skipped: no product, reduction or scatter".into(),
            });
            continue;
        }
        let runner = Runner::<ENode, Facts>::default()
            .with_egraph(eg)
            .with_scheduler(SimpleScheduler)
            .with_node_limit(options.node_limit)
            .with_iter_limit(options.iter_limit)
            .with_time_limit(options.time_limit)
            .run(rules);
        for it in &runner.iterations {
            for (rule, count) in &it.applied {
                *fired.entry(rule.to_string()).or_default() += count;
            }
        }
        let stop_reason = stop_text(&runner.stop_reason);
        report.stages.push(StageReport { name, iterations: runner.iterations.len(), stop_reason });
        eg = runner.egraph;
    }
    if eg.analysis.folded > 0 {
        fired.insert("constant-fold".into(), eg.analysis.folded);
    }
    report.egraph_nodes = eg.total_number_of_nodes();
    report.egraph_classes = eg.number_of_classes();

    let class = |id: NodeId| eg.find(class_of[id.0].expect("region nodes have classes"));
    let roots: Vec<Id> = region.roots.iter().map(|&r| class(r)).collect();
    let outputs: Vec<Id> = graph.outputs.iter().map(|&o| dd.of(o)).filter(|o| region.inside[o.0]).map(class).collect();
    let chosen = cost::extract(&eg, &roots, &outputs, &options.model)?;
    // Cheaper by the model, or as cheap with fewer nodes.
    let built = chosen.values().filter(|n| !n.op.is_leaf()).count();
    let after = (cost::choice_cost(&eg, &chosen, &outputs).seconds(&options.model), built);
    let mut output = vec![false; graph.nodes.len()];
    for &o in &graph.outputs {
        output[dd.of(o).0] = true;
    }
    let before = cost::nodes_cost(graph, &region.nodes, &output).seconds(&options.model);
    if after >= (before, region.nodes.len()) {
        return None;
    }
    let rw = region::Rewritten { region, eg: &eg, class_of: &class_of, chosen: &chosen };
    region::splice(graph, live, dd, Some(&rw))
}
