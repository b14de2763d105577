//! [`explain`]: what coil made of a function: its graphs, the breaks between them with reasons,
//! hints and lines, the ops and guards of each graph, what became of each attention chain
//! (the template stage's decision, [`coil_passes::templates::Chain::line`]), and compile times
//! (like `torch._dynamo.explain`).

use super::{run_frame, FnState, Frame, GraphBreak, Guard};
use crate::compile::{Compiled, StageTimes};
use crate::graph_cache::GraphCacheUse;
use crate::realize::Captured;
use crate::Tensor;
use coil_ir::{Graph, Op, Result};
use coil_runtime::Device;
use std::cell::RefCell;
use std::fmt;
use std::panic::Location;
use std::rc::Rc;

/// What one explained run recorded (every occurrence, in order).
#[derive(Default)]
pub(crate) struct ExplainLog {
    pub(crate) graphs: Vec<GraphInfo>,
    pub(crate) breaks: Vec<GraphBreak>,
    pub(crate) differentiations: Vec<DifferentiationInfo>,
}

/// One call of [`crate::value_and_grad`] in an explained run: the forward graph's
/// decomposition before differentiating chose the attention templates, so the gradient graph
/// compiled after it holds template nodes, not chains; this is where its decisions show.
#[derive(Clone, Debug)]
pub struct DifferentiationInfo {
    /// The user's line of the call.
    pub location: &'static Location<'static>,
    /// The device it differentiated for (the template stage costs at its rates).
    pub device: Device,
    /// What the template stage did with the forward's attention chains (`None` where it did
    /// not run).
    pub templates: Option<coil_passes::templates::TemplateReport>,
}

/// One graph of an explained run.
#[derive(Clone, Debug)]
pub struct GraphInfo {
    /// The captured graph.
    pub graph: Graph,
    /// The device it ran on.
    pub device: Device,
    /// The graph's ops (inputs and Rust scalars are not ops) with the user's lines.
    pub ops: Vec<(String, Option<&'static Location<'static>>)>,
    /// The guards a later call must pass to reuse the graph.
    pub guards: Vec<Guard>,
    /// Seconds per compile stage (`None` when the interpreter ran it).
    pub times: Option<StageTimes>,
    /// What the template stage did with the graph's attention chains (`None` when the
    /// interpreter ran it or the stage did not run; for a graph read from the graph cache, the
    /// stage run again on the captured graph).
    pub templates: Option<coil_passes::templates::TemplateReport>,
}

impl GraphInfo {
    pub(crate) fn new(captured: &Captured, guards: Vec<Guard>, compiled: Option<&Compiled>) -> GraphInfo {
        let times = compiled.map(|c| c.times.clone());
        // A graph read from the graph cache (without dumps) has no report: the stage runs
        // again here, at the captured sizes.
        let templates = compiled.and_then(|c| match (&c.templates, &c.times.graph_cache) {
            (Some(t), _) => Some(t.clone()),
            (None, GraphCacheUse::Hit) => {
                crate::compile::template_report(&captured.graph, captured.device).ok().flatten()
            }
            (None, _) => None,
        });
        let ops = captured
            .graph
            .nodes
            .iter()
            .filter(|n| !matches!(n.op, Op::Input { .. } | Op::Scalar(_)))
            .map(|n| (n.op.name().to_string(), n.location))
            .collect();
        GraphInfo { graph: captured.graph.clone(), device: captured.device, ops, guards, times, templates }
    }
}

/// The report of [`explain`]. `Display` prints it like `torch._dynamo.explain`; the plain form
/// is deterministic, `{:#}` adds compile times and guard hashes.
pub struct ExplainReport {
    /// The graphs captured and run.
    pub graph_count: usize,
    /// Breaks as they happened (a break in a loop counts each time).
    pub graph_break_count: usize,
    /// Ops over all graphs.
    pub op_count: usize,
    /// The breaks, as they happened.
    pub breaks: Vec<GraphBreak>,
    /// The graphs, in run order.
    pub graphs: Vec<GraphInfo>,
    /// The `value_and_grad` calls, in run order.
    pub differentiations: Vec<DifferentiationInfo>,
    /// The function's outputs, computed.
    pub outputs: Vec<Tensor>,
}

impl ExplainReport {
    pub(crate) fn new(log: ExplainLog, outputs: Vec<Tensor>) -> ExplainReport {
        ExplainReport {
            graph_count: log.graphs.len(),
            graph_break_count: log.breaks.len(),
            op_count: log.graphs.iter().map(|g| g.ops.len()).sum(),
            breaks: log.breaks,
            graphs: log.graphs,
            differentiations: log.differentiations,
            outputs,
        }
    }
}

/// Runs `f` as a compiled function would run (graphs cut at every host read, each compiled and
/// run) and reports what happened. The stance does not apply: explaining is how one finds the
/// breaks a stance would refuse.
///
/// ```
/// use coil_frontend::{dynamo::explain, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, -2.0], &[2]).unwrap();
/// let report = explain(|| {
///     let s = x.abs()?.sum_all()?;
///     let y = if s.item::<f32>()? > 1.0 { x.exp()? } else { x.neg()? };
///     Ok(vec![y])
/// })
/// .unwrap();
/// assert_eq!((report.graph_count, report.graph_break_count), (2, 1));
/// assert!(report.to_string().contains("host read of a tensor value (`item`)"));
/// ```
#[track_caller]
pub fn explain<F: FnOnce() -> Result<Vec<Tensor>>>(f: F) -> Result<ExplainReport> {
    let state = Rc::new(RefCell::new(FnState::new(super::name_of::<F>())));
    let frame = Frame::new(state, &[], Location::caller(), Some(ExplainLog::default()))?;
    // `run_frame` calls an `Fn`; the closure runs once, so hand it over through a cell.
    let once = RefCell::new(Some(f));
    let g = |_: &[Tensor]| (once.borrow_mut().take().expect("explain runs its function once"))();
    let (outputs, frame) = run_frame(&g, &[], frame)?;
    Ok(ExplainReport::new(frame.log.unwrap_or_default(), outputs))
}

impl fmt::Display for ExplainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Graph Count: {}", self.graph_count)?;
        writeln!(f, "Graph Break Count: {}", self.graph_break_count)?;
        writeln!(f, "Op Count: {}", self.op_count)?;
        writeln!(f, "Break Reasons:")?;
        for (i, b) in self.breaks.iter().enumerate() {
            writeln!(f, "  Break Reason {}:", i + 1)?;
            writeln!(f, "    Id: {}", b.id)?;
            writeln!(f, "    Reason: {}", b.reason)?;
            writeln!(f, "    Hint: {}", b.hint)?;
            writeln!(f, "    User Location: {}", b.location_text())?;
        }
        writeln!(f, "Ops per Graph:")?;
        for (i, g) in self.graphs.iter().enumerate() {
            writeln!(f, "  Ops {} ({}):", i + 1, g.device)?;
            for (op, loc) in &g.ops {
                match loc {
                    Some(l) => writeln!(f, "    {op:<24} # {}:{}", l.file(), l.line())?,
                    None => writeln!(f, "    {op}")?,
                }
            }
        }
        // Only where a graph or a differentiation has an attention chain (matched or not).
        fn chains(t: &Option<coil_passes::templates::TemplateReport>) -> &[coil_passes::templates::Chain] {
            t.as_ref().map_or(&[], |t| &t.chains)
        }
        let graphs = self.graphs.iter().enumerate().filter(|(_, g)| !chains(&g.templates).is_empty());
        let grads = self.differentiations.iter().filter(|d| !chains(&d.templates).is_empty());
        if graphs.clone().next().is_some() || grads.clone().next().is_some() {
            writeln!(f, "Attention Templates:")?;
            for (i, g) in graphs {
                writeln!(f, "  Graph {}:", i + 1)?;
                for c in chains(&g.templates) {
                    writeln!(f, "    {}", c.line())?;
                }
            }
            for d in grads {
                writeln!(f, "  value_and_grad at {}:{}:", d.location.file(), d.location.line())?;
                for c in chains(&d.templates) {
                    writeln!(f, "    {}", c.line())?;
                }
            }
        }
        writeln!(f, "Out Guards:")?;
        for (i, g) in self.graphs.iter().enumerate() {
            writeln!(f, "  Guards {}:", i + 1)?;
            for guard in &g.guards {
                if f.alternate() {
                    writeln!(f, "    {guard:#}")?;
                } else {
                    writeln!(f, "    {guard}")?;
                }
            }
        }
        if f.alternate() {
            writeln!(f, "Compile Times (seconds; decompose, rewrite, lower, schedule, codegen, cc = total):")?;
            for (i, g) in self.graphs.iter().enumerate() {
                match &g.times {
                    Some(t) => writeln!(
                        f,
                        "  Graph {}: {:.6}, {:.6}, {:.6}, {:.6}, {:.6}, {:.6} = {:.6}",
                        i + 1,
                        t.decompose,
                        t.rewrite,
                        t.lower,
                        t.schedule,
                        t.codegen,
                        t.cc,
                        t.total
                    )?,
                    None => writeln!(f, "  Graph {}: not compiled (reference interpreter)", i + 1)?,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::compile_fresh;
    use coil_ir::config::{current, with_config, Config};

    /// A graph read from the graph cache has no template report of its own (the stage did not
    /// run): explain runs the stage again and reports the same chains.
    #[test]
    fn a_graph_from_the_graph_cache_gets_its_template_report() {
        if coil_runtime::testing::c_compiler().is_none() {
            return;
        }
        let shape = [1, 2, 16, 8];
        let values = |seed: usize| {
            let v = (0..shape.iter().product()).map(|i: usize| ((i * 37 + seed) % 101) as f32 / 50.0 - 1.0);
            Tensor::from_vec(v.collect(), &shape).unwrap()
        };
        let (q, k, v) = (values(0), values(1), values(2));
        let p = (q.matmul(&k.transpose(-2, -1).unwrap()).unwrap() * 0.125).softmax(-1).unwrap();
        let y = p.matmul(&v).unwrap();
        let captured = crate::capture(&[&y]);
        let dir = std::env::temp_dir().join(format!("coil-explain-templates-{}", std::process::id()));
        let config = Config { cache_dir: dir.clone(), graph_cache: true, debug_dir: None, ..(*current()).clone() };
        let (first, second) = with_config(config, || {
            (compile_fresh(&captured.graph, Device::Cpu).unwrap(), compile_fresh(&captured.graph, Device::Cpu).unwrap())
        });
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(second.times.graph_cache, GraphCacheUse::Hit);
        assert!(second.templates.is_none(), "no dump: the hit did not run the stage");
        let first = first.templates.expect("the stage ran");
        assert_eq!(first.chosen, 1, "{first}");
        let info = GraphInfo::new(&captured, vec![], Some(&second));
        assert_eq!(info.templates.map(|t| t.to_string()), Some(first.to_string()));
    }
}
