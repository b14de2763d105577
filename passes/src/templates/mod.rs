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
//! * **The report** ([`TemplateReport`], [`report`]): every attention chain in graph order,
//!   chosen, refused, kept written out (naming the intermediate needed and who needs it) or not
//!   matched (naming the step where the rules stopped), with the estimated costs compared. Its
//!   text is the debug dump's `templates.txt`; `explain` prints one line per chain.
//!
//! Cost: on GPT-2 written out (12 layers, 520 captured nodes) the region is 157 nodes, the
//! e-graph 343, and the stage ~0.7 ms; a graph without a last-dim softmax costs one scan.
//!
//! Determinism: egg runs with its `deterministic` feature, rules search classes in insertion
//! order, the runner's limits that bind are iterations and nodes (the time limit is a
//! backstop), and extraction breaks ties by class count and node order: the same graph gives
//! the same result every run.

pub mod lang;
pub mod report;
pub mod rules;

pub use report::{Chain, Decision, TemplateReport};

use crate::attention::AttentionMatch;
use crate::rewrite::CostModel;
use coil_ir::{Graph, NodeId, Op};
use egg::{Id, Runner, SimpleScheduler};
use lang::{op_of, CNode, COp, Facts, CEG};
use report::describe;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::time::{Duration, Instant};

/// Iterations: a chain is matched in at most five steps (scores, scale, mask, cast, template).
const ITER_LIMIT: usize = 8;
/// E-graph size (nodes) at which the runner stops: each graph node gets at most one virtual
/// node, plus a handful of leaves.
const NODE_LIMIT_PER_NODE: usize = 4;

/// The attention templates of a captured graph, in graph order, chosen by e-graph rewriting
/// and extraction (see the module docs) with nodes costed at `model`'s rates (the compiling
/// target's: [`crate::rewrite::RewriteOptions::model`]), and what the stage did.
pub fn choose_attention(graph: &Graph, model: &CostModel) -> (Vec<AttentionMatch>, TemplateReport) {
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
    report.model = Some(*model);
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
        extract(graph, &region, &roots, &eg, &class_of, model, &mut report)
    } else {
        vec![]
    };
    report.chains.extend(unmatched(graph, &region, &eg, &class_of));
    report.chains.sort_by_key(|c| c.root.0);
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

/// Extracts the cheapest graph and reads the templates it chose off it; every matched chain
/// goes into the report, chosen, refused or kept ([`Decision`]).
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
    model: &CostModel,
    report: &mut TemplateReport,
) -> Vec<AttentionMatch> {
    let mut local: Vec<Vec<Option<f64>>> = vec![Vec::new(); eg.nodes().len()];
    for class in eg.classes() {
        local[usize::from(class.id)] = class.nodes.iter().map(|n| lang::node_seconds(eg, n, model)).collect();
    }
    let class = |n: NodeId| eg.find(class_of[n.0].expect("region nodes and operands have classes"));
    let all: Vec<Id> = region.iter().map(|&n| class(n)).collect();
    let own = |n: &CNode| lang::node_seconds(eg, n, model).unwrap_or(f64::INFINITY);
    let mut choice = crate::rewrite::cost::extract_dag(eg, &all, &local);
    let outputs: Vec<Id> = roots.iter().map(|&o| class(o)).collect();
    let is_root = |n: NodeId| graph.node(n).op == Op::Matmul;
    if let Some(choice) = &mut choice {
        for &root in region {
            let r = class(root);
            if choice[&r].op != COp::Attention || !is_root(root) {
                continue;
            }
            let product = eg[r].nodes.iter().find(|n| n.op == COp::Matmul).expect("the template replaces a product");
            let elsewhere = reach(eg, choice, &outputs, Some(r));
            let margin = |n: &CNode| {
                let needs = reach(eg, choice, &n.args, None);
                own(n) + needs.iter().filter(|c| !elsewhere.contains(c)).map(|c| own(&choice[c])).sum::<f64>()
            };
            if margin(product) < margin(&choice[&r]) {
                choice.insert(r, product.clone());
            }
        }
    }
    let chosen = choice.as_ref().map_or_else(HashSet::default, |c| reach(eg, c, &outputs, None));
    let node_of = |id: Id| eg[id].data.node.expect("operands of the template are graph values");
    let has_scores = |n: NodeId| eg[class(n)].nodes.iter().any(|e| e.op == COp::Scores);
    // The graph's own e-node of a region node (its language op, not what the rules added).
    let written = |n: NodeId| {
        let op = op_of(graph, n);
        eg[class(n)].nodes.iter().find(|e| e.op == op).map_or(0.0, own)
    };
    let readers = report::readers(graph);
    let mut found = Vec::new();
    for &root in region {
        let r = class(root);
        let Some(matched) = eg[r].nodes.iter().find(|n| n.op == COp::Attention) else { continue };
        if !is_root(root) {
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
        let needed = report::needed_elsewhere(graph, &readers, root, &intermediates);
        let attention = choice.as_ref().map(|c| &c[&r]).filter(|n| n.op == COp::Attention && chosen.contains(&r));
        let decision = match attention {
            Some(_) if intermediates.iter().any(|&n| chosen.contains(&class(n))) => {
                report.refused += 1;
                let (n, why) = needed.unwrap_or_else(|| {
                    let n = *intermediates.iter().find(|&&n| chosen.contains(&class(n))).expect("one is chosen");
                    (n, format!("{} is needed by the rest of the graph", describe(graph, n)))
                });
                Decision::Refused { needed: n, why: format!("{why}; the template would compute it again") }
            }
            Some(attention) => {
                let arg = |i: usize| eg.find(attention.args[i]);
                let causal = eg[arg(4)].nodes.iter().any(|e| e.op == COp::Causal);
                let scale = eg[arg(3)].data.konst.expect("the scale is a constant");
                found.push(AttentionMatch {
                    root,
                    q: node_of(arg(0)),
                    k: node_of(arg(1)),
                    v: node_of(arg(2)),
                    causal,
                    scale,
                    intermediates: intermediates.clone(),
                });
                Decision::Chosen { causal, scale }
            }
            None => match needed {
                Some((n, why)) => Decision::Kept {
                    needed: Some(n),
                    why: format!("{why}, and the product of the probabilities costs less than the template there"),
                },
                None => Decision::Kept { needed: None, why: "the written-out chain costs less".into() },
            },
        };
        report.chains.push(Chain {
            root,
            location: graph.node(root).location,
            decision,
            template_seconds: Some(own(matched)),
            written_seconds: Some(written(root) + intermediates.iter().map(|&n| written(n)).sum::<f64>()),
        });
    }
    found
}

/// The chains the rules did not match: `matmul(softmax(x), v)` (a cast between them allowed)
/// in the region whose class got no template, each with the step where the rules stopped.
fn unmatched(graph: &Graph, region: &[NodeId], eg: &CEG, class_of: &[Option<Id>]) -> Vec<Chain> {
    let has = |n: NodeId, op: COp| class_of[n.0].is_some_and(|c| eg[eg.find(c)].nodes.iter().any(|e| e.op == op));
    let mut out = Vec::new();
    for &root in region {
        let node = graph.node(root);
        if node.op != Op::Matmul || has(root, COp::Attention) {
            continue;
        }
        let mut p = node.inputs[0];
        if matches!(op_of(graph, p), COp::Cast(_)) {
            p = graph.node(p).inputs[0];
        }
        if op_of(graph, p) != COp::Softmax {
            continue;
        }
        let why = unmatched_why(graph, eg, class_of, graph.node(p).inputs[0], node.inputs[1]);
        out.push(Chain {
            root,
            location: node.location,
            decision: Decision::Unmatched { why },
            template_seconds: None,
            written_seconds: None,
        });
    }
    out
}

/// Why the rules stopped short of the template on the chain whose softmax reads `scores` and
/// whose product reads `v`: walking from the softmax towards the scores' product, the first
/// step that is no rule's, or whose condition failed (its operand is a partial match).
fn unmatched_why(graph: &Graph, eg: &CEG, class_of: &[Option<Id>], scores: NodeId, v: NodeId) -> String {
    let partial =
        |n: NodeId| class_of[n.0].and_then(|c| eg[eg.find(c)].nodes.iter().find(|e| e.op == COp::Scores).cloned());
    let mut x = scores;
    for _ in 0..8 {
        if let Some(s) = partial(x) {
            let (q, k) = (&eg[s.args[0]].data.meta, &eg[s.args[1]].data.meta);
            return match crate::attention::template_supports(q, k, graph.meta(v)) {
                Err(e) => format!("the template does not take these operands: {e}"),
                Ok(()) => "the dtypes around the softmax are not the template's (f16 / bf16 scores go to f32 for \
                           the softmax and back for the product)"
                    .into(),
            };
        }
        let node = graph.node(x);
        let step = match op_of(graph, x) {
            COp::Mul | COp::Div => "a finite constant scale (the only one)",
            COp::Where => "the causal mask with -inf elsewhere (the only mask)",
            COp::Cast(_) => "a cast to f32 of f16 / bf16 scores",
            COp::Matmul => {
                return format!(
                    "{} is not the scores `q @ k^T` (k transposed in its last two dims, q and k of one dtype)",
                    describe(graph, x)
                )
            }
            _ => {
                return format!(
                    "{} between the scores and the softmax is no step of the rules (they take a constant scale, \
                     the causal mask and a cast to f32)",
                    describe(graph, x)
                )
            }
        };
        let operands = if node.op == Op::Where { &node.inputs[1..] } else { &node.inputs[..] };
        if operands.iter().any(|&y| partial(y).is_some()) {
            return format!("{} is not {step}", describe(graph, x));
        }
        // On towards the product: the operand of the scores' shape.
        let Some(&y) = operands.iter().find(|&&y| graph.meta(y).shape == graph.meta(x).shape) else {
            return format!("{} does not lead back to the scores `q @ k^T`", describe(graph, x));
        };
        x = y;
    }
    "the chain is longer than the rules follow".into()
}

#[cfg(test)]
pub(crate) mod tests;
