//! What the template stage did, as a user reads it: the text of `templates.txt` in the debug
//! dump ([`TemplateReport`]'s `Display`) and one line per attention chain for `explain`
//! ([`Chain::line`]).
//!
//! Every attention chain the stage saw is listed, in graph order: the template chosen, refused
//! (which intermediate is needed elsewhere, by whom), or not matched (the step where the rules
//! stopped). The text is deterministic: no times, no addresses; the costs are the model's
//! estimates, which depend only on the graph and the target's rates.

use crate::rewrite::CostModel;
use coil_ir::{Graph, NodeId};
use std::fmt;
use std::panic::Location;

/// What the stage did: its [`Display`](fmt::Display) is the text of `templates.txt`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TemplateReport {
    /// How often each rule changed the e-graph, in [`super::rules::RULES`] order; rules that
    /// never fired are absent.
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
    /// Wall-clock seconds of the stage (not in the text: it is not deterministic).
    pub seconds: f64,
    /// The rates the stage costed at (the compiling target's; `None` when it did not run).
    pub model: Option<CostModel>,
    /// Every attention chain, in graph order (see the module docs).
    pub chains: Vec<Chain>,
}

impl TemplateReport {
    /// How often rule `name` fired.
    pub fn fired(&self, name: &str) -> usize {
        self.fired.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c)
    }

    /// Chains the extraction kept written out because they cost less ([`Decision::Kept`]).
    pub fn kept(&self) -> usize {
        self.chains.iter().filter(|c| matches!(c.decision, Decision::Kept { .. })).count()
    }

    /// Chains the rules did not match ([`Decision::Unmatched`]).
    pub fn unmatched(&self) -> usize {
        self.chains.iter().filter(|c| matches!(c.decision, Decision::Unmatched { .. })).count()
    }
}

/// One attention chain: `matmul(softmax(scores), v)` as the user wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct Chain {
    /// The final product `matmul(probabilities, v)` (of the graph the stage ran on).
    pub root: NodeId,
    /// The user's line of it.
    pub location: Option<&'static Location<'static>>,
    /// What the stage decided.
    pub decision: Decision,
    /// Estimated seconds of the template at the model's rates (`None`: the rules did not match).
    pub template_seconds: Option<f64>,
    /// ... and of the written-out chain (both products and the scale, mask, casts and softmax
    /// between them, each node on its own).
    pub written_seconds: Option<f64>,
}

/// What became of a chain.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The template replaced it.
    Chosen {
        /// With the causal mask.
        causal: bool,
        /// The factor on the scores.
        scale: f64,
    },
    /// Extraction chose the template, but an intermediate of the chain is needed elsewhere:
    /// refused rather than computing the scores twice (counted in
    /// [`TemplateReport::refused`]).
    Refused {
        /// The intermediate needed elsewhere.
        needed: NodeId,
        /// Why, in words.
        why: String,
    },
    /// The rules matched it, but extraction kept the written-out chain as cheaper (where an
    /// intermediate is needed anyway, the product of the probabilities can cost less than the
    /// template).
    Kept {
        /// The intermediate needed elsewhere, if one is.
        needed: Option<NodeId>,
        /// Why, in words.
        why: String,
    },
    /// The rules did not match the whole chain.
    Unmatched {
        /// Where and why they stopped, in words.
        why: String,
    },
}

/// `%n op at file:line` of a graph node.
pub(crate) fn describe(graph: &Graph, n: NodeId) -> String {
    let node = graph.node(n);
    match node.location {
        Some(l) => format!("{n} {} at {}:{}", node.op.name(), l.file(), l.line()),
        None => format!("{n} {}", node.op.name()),
    }
}

impl Chain {
    /// One line: the chain's final product, and what became of it (no costs: what `explain`
    /// prints).
    pub fn line(&self) -> String {
        let at = self.location.map_or(String::new(), |l| format!(" at {}:{}", l.file(), l.line()));
        let what = match &self.decision {
            Decision::Chosen { causal, scale } => {
                let mask = if *causal { "causal" } else { "no mask" };
                format!("replaced by the attention template ({mask}, scale {scale})")
            }
            Decision::Refused { why, .. } => format!("refused: {why}"),
            Decision::Kept { why, .. } => format!("kept written out: {why}"),
            Decision::Unmatched { why } => format!("not matched: {why}"),
        };
        format!("{} matmul{at}: {what}", self.root)
    }
}

/// Microseconds, for the text.
fn us(seconds: f64) -> String {
    format!("{:.3} us", seconds * 1e6)
}

impl fmt::Display for TemplateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "templates: {} chosen, {} refused (a chain node needed anyway), {} kept (cheaper written out), {} not matched",
            self.chosen,
            self.refused,
            self.kept(),
            self.unmatched()
        )?;
        match &self.model {
            Some(m) => writeln!(
                f,
                "cost model: {:.1} GB/s, {:.1} TFLOP/s, {} per launch",
                m.bandwidth / 1e9,
                m.flop_rate / 1e12,
                us(super::lang::LAUNCH_SECONDS)
            )?,
            None => writeln!(f, "cost model: none (the stage did not run)")?,
        }
        writeln!(f, "region: {} nodes, e-graph: {} nodes", self.region_nodes, self.egraph_nodes)?;
        writeln!(f, "iterations: {}, stop reason: {}", self.iterations, self.stop_reason)?;
        crate::rewrite::write_fired(f, &self.fired)?;
        writeln!(f, "attention chains:")?;
        if self.chains.is_empty() {
            writeln!(f, "  (none)")?;
        }
        for c in &self.chains {
            writeln!(f, "  {}", c.line())?;
            if let (Some(t), Some(w)) = (c.template_seconds, c.written_seconds) {
                writeln!(f, "    estimated: template {}, written out {}", us(t), us(w))?;
            }
        }
        Ok(())
    }
}

/// The live readers of each graph node.
pub(crate) fn readers(graph: &Graph) -> Vec<Vec<NodeId>> {
    let mut readers = vec![Vec::new(); graph.nodes.len()];
    for n in graph.live_nodes() {
        for &x in &graph.node(n).inputs {
            if !readers[x.0].contains(&n) {
                readers[x.0].push(n);
            }
        }
    }
    readers
}

/// The first of a chain's `intermediates` (from the probabilities back) that the graph needs
/// outside the chain ending at `root`, and why in words: it is an output, or a node outside
/// the chain reads it.
pub(crate) fn needed_elsewhere(
    graph: &Graph,
    readers: &[Vec<NodeId>],
    root: NodeId,
    intermediates: &[NodeId],
) -> Option<(NodeId, String)> {
    for &n in intermediates {
        if graph.outputs.contains(&n) {
            return Some((n, format!("{} is an output of the graph", describe(graph, n))));
        }
        if let Some(&r) = readers[n.0].iter().find(|r| **r != root && !intermediates.contains(r)) {
            return Some((n, format!("{} is read by {}", describe(graph, n), describe(graph, r))));
        }
    }
    None
}
