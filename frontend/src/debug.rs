//! Debug dumps: with the configuration's `debug_dir` set ([`coil_ir::config::Config::debug_dir`];
//! by default `COIL_DEBUG=1` for `./coil_debug/`, `COIL_DEBUG=<dir>` for `<dir>`), every compiled
//! graph's stages are written under it:
//!
//! ```text
//! run_<YYYYmmdd_HHMMSS>-pid_<pid>/graph_<n>/
//!   graph_captured.txt   templates.txt          graph_decomposed.txt  rewrites.txt
//!   ir_pre_fusion.txt    ir_post_fusion.txt     kernels/<name>.tile   kernels/<name>.c
//!   schedule.txt         summary.json           guards.txt (graphs of compiled functions:
//!                                                           what a call must match)
//! ```
//!
//! and every forward graph `value_and_grad` differentiates, under `grad_<n>/`: `graph_forward.txt`
//! (the captured forward) and its `templates.txt` (the decomposition before differentiating
//! decides which attention chains become templates; the gradient graph compiled later holds
//! template nodes, no chains).
//!
//! `templates.txt` is the template stage's report (`coil_passes::templates::TemplateReport`):
//! the rates it costed at, rules fired, and every attention chain with what became of it (the
//! template chosen; refused or kept written out, naming the intermediate needed elsewhere; or
//! not matched, naming the step where the rules stopped) and the estimated costs compared;
//! `summary.json`'s `templates` object has its counts.
//!
//! The files' contents are deterministic (no addresses, no hash orders), except the compile
//! times in `summary.json` and `rewrites.txt`; the run folder's name carries the time and
//! process id. A graph read from the graph cache (`summary.json`'s `graph_cache` is `hit`) has
//! no `graph_decomposed.txt`: the stages that would write it did not run; its `templates.txt`
//! comes from the template stage run again for the dump (the entry does not carry it).

use crate::compile::StageTimes;
use coil_ir::kernel::{KernelKind, Schedule, TileKernel};
use coil_ir::loops::{BufferId, ExternCall, LoopKind, LoopProgram};
use std::collections::HashMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// The dump folder of one graph, or nothing when dumps are off.
pub struct Dump(Option<PathBuf>);

/// `run_<time>-pid_<pid>` under the configured dump folder, named once per process and folder.
fn run_dir() -> Option<PathBuf> {
    static RUNS: OnceLock<Mutex<HashMap<PathBuf, PathBuf>>> = OnceLock::new();
    let root = coil_ir::config::current().debug_dir.clone()?;
    let mut runs = RUNS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    let run = runs
        .entry(root)
        .or_insert_with_key(|root| root.join(format!("run_{}-pid_{}", timestamp(), std::process::id())));
    Some(run.clone())
}

impl Dump {
    /// The next `graph_<n>` folder of this run.
    pub fn new_graph() -> Dump {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Dump::numbered("graph", &NEXT)
    }

    /// The next `grad_<n>` folder of this run: a forward graph [`crate::value_and_grad`]
    /// differentiated (a compiled function's later calls reuse it and write none).
    pub fn new_differentiation() -> Dump {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Dump::numbered("grad", &NEXT)
    }

    /// The folder `<prefix>_<n>` of this run, `n` the next value of `next` (none when dumps are
    /// off: the counter then does not move).
    fn numbered(prefix: &str, next: &AtomicUsize) -> Dump {
        Dump(run_dir().map(|dir| dir.join(format!("{prefix}_{}", next.fetch_add(1, Ordering::Relaxed)))))
    }

    /// The dump of a graph already given a folder (`None`: dumps are off), to add files to it.
    pub fn at(dir: Option<PathBuf>) -> Dump {
        Dump(dir)
    }

    /// The graph's folder, when dumps are on.
    pub fn dir(&self) -> Option<&PathBuf> {
        self.0.as_ref()
    }

    /// Writes `name` (a path under the graph folder); `contents` is only computed when dumps are
    /// on. A dump that cannot be written is reported once on stderr and otherwise ignored: dumps
    /// must never make a program fail.
    pub fn write(&self, name: &str, contents: impl FnOnce() -> String) {
        let Some(dir) = &self.0 else { return };
        let path = dir.join(name);
        let result =
            path.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|_| std::fs::write(&path, contents()));
        if let Err(e) = result {
            static WARNED: OnceLock<()> = OnceLock::new();
            WARNED.get_or_init(|| eprintln!("coil: cannot write debug dump {}: {e}", path.display()));
        }
    }
}

/// UTC `YYYYmmdd_HHMMSS`.
fn timestamp() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    format!("{year:04}{month:02}{day:02}_{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Bytes a kernel reads and writes, counting each buffer once (estimated for a scatter that
/// runs in place).
fn kernel_bytes(program: &LoopProgram, schedule: &Schedule, index: usize, tile: Option<&TileKernel>) -> (usize, usize) {
    let nbytes = |b: BufferId| program.buffer(b).meta.nbytes();
    match tile {
        Some(t) => t.args.iter().fold((0, 0), |(r, w), a| {
            (r + if a.read { nbytes(a.buffer) } else { 0 }, w + if a.written { nbytes(a.buffer) } else { 0 })
        }),
        None => {
            let k = &schedule.kernels[index];
            let node = &program.nodes[k.nodes[0]];
            match &node.kind {
                // A scatter run in place over its base reads its index and source and updates
                // at most one element per index element; else it copies its base first.
                LoopKind::Extern { call: ExternCall::Fallback { op: coil_ir::Op::Scatter { .. } }, inputs }
                    if schedule.memory.shares_memory(inputs[0], node.output) =>
                {
                    let touched =
                        program.buffer(inputs[1]).meta.numel() * program.buffer(node.output).meta.dtype.size_bytes();
                    (nbytes(inputs[1]) + nbytes(inputs[2]) + touched, touched)
                }
                _ => (node.reads().into_iter().map(nbytes).sum(), node.writes().into_iter().map(nbytes).sum()),
            }
        }
    }
}

/// `schedule.txt`: launch order, launch shape, arguments, and the memory plan.
pub fn schedule_text(program: &LoopProgram, schedule: &Schedule, kernels: &[Option<TileKernel>]) -> String {
    let mut s = String::new();
    let buffer = |b: BufferId| format!("{}: {}", program.buffer(b).name, program.buffer(b).meta);
    for (i, k) in schedule.kernels.iter().enumerate() {
        let _ = write!(s, "{i}: {} ({})", k.name, k.kind.name());
        match &kernels[i] {
            Some(t) => {
                let _ = writeln!(
                    s,
                    " xnumel={}{} XBLOCK={} RBLOCK={}",
                    t.xnumel,
                    t.rnumel.as_ref().map_or(String::new(), |r| format!(" rnumel={r}")),
                    t.xblock,
                    t.rblock
                );
                for a in &t.args {
                    let role = match (a.read, a.written) {
                        (true, true) => "in/out",
                        (false, true) => "out",
                        _ => "in",
                    };
                    let _ = writeln!(s, "    {} <- {} ({role})", a.name, buffer(a.buffer));
                }
            }
            None => {
                let node = &program.nodes[k.nodes[0]];
                let what = match &node.kind {
                    LoopKind::Extern { call: ExternCall::Bmm { .. }, .. } => "gemm".to_string(),
                    LoopKind::Extern { call: ExternCall::Attention(_), .. } => "attention template".to_string(),
                    LoopKind::Extern { call: ExternCall::AttentionBackward(_), .. } => {
                        "attention backward template".to_string()
                    }
                    // A fallback runs a built-in kernel where the backend has one (CUDA's
                    // scatter and cumsum), else the reference interpreter.
                    LoopKind::Extern { call: ExternCall::Fallback { op }, .. } => {
                        format!("fallback: {op}")
                    }
                    LoopKind::Extern { call: ExternCall::Conv(_), .. } => "convolution template".to_string(),
                    _ => "extern".to_string(),
                };
                let _ = writeln!(s, " via {what}");
                for b in node.reads() {
                    let _ = writeln!(s, "    in  {}", buffer(b));
                }
                for b in node.writes() {
                    let _ = writeln!(s, "    out {}", buffer(b));
                }
            }
        }
    }
    let _ = writeln!(s, "\nmemory plan:");
    let arena = schedule.memory.arena(&schedule.memory.slots);
    for (slot, bytes) in schedule.memory.slots.iter().enumerate() {
        let users: Vec<String> = (0..program.buffers.len())
            .filter(|&b| schedule.memory.slot_of.get(b).copied().flatten() == Some(slot))
            .map(|b| program.buffers[b].name.clone())
            .collect();
        let (first, last) = schedule.memory.slot_lives.get(slot).copied().unwrap_or_default();
        let at = arena.offsets[slot];
        let _ =
            writeln!(s, "  slot {slot}: {bytes} bytes at {at}, launches {first}..={last}, holds {}", users.join(", "));
    }
    let _ = writeln!(s, "  arena bytes: {}", arena.bytes);
    for x in &schedule.memory.in_outputs {
        let name = |b: BufferId| &program.buffer(b).name;
        let _ = writeln!(s, "  output {} holds {} (its scatter's base)", name(x.output), name(x.temporary));
    }
    let _ = writeln!(s, "  peak bytes: {}", schedule.memory.peak_bytes);
    s
}

/// A kernel's `launch` entry in `summary.json`: grid, block, registers, shared memory, and the
/// autotuner's plan when it replaced the heuristic's.
pub fn launch_json(l: &coil_runtime::cuda::KernelAttributes) -> serde_json::Value {
    let mut launch = serde_json::json!({
        "grid": l.grid,
        "block": l.block,
        "registers": l.registers,
        "static_shared_bytes": l.static_shared_bytes,
        "dynamic_shared_bytes": l.dynamic_shared_bytes,
        "compiler": l.compiler,
        "compile_us": l.compile_us,
        "load_us": l.load_us,
    });
    if let Some(t) = &l.tuning {
        launch["tuning"] = t.as_str().into();
    }
    launch
}

/// `summary.json`: kernels (name, kind, ops, estimated bytes), compile time per stage, peak
/// bytes, the rewrite pass's estimated bytes and flops before and after, and the template
/// stage's counts ([`templates_json`]; `null` where it did not run).
pub fn summary_json(
    program: &LoopProgram,
    schedule: &Schedule,
    kernels: &[Option<TileKernel>],
    times: &StageTimes,
    rewrite: &serde_json::Value,
    templates: &serde_json::Value,
    launches: &[coil_runtime::cuda::KernelAttributes],
) -> String {
    let list: Vec<serde_json::Value> = schedule
        .kernels
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let mut ops: Vec<&str> = Vec::new();
            for &n in &k.nodes {
                for o in &program.nodes[n].origins {
                    if !ops.contains(o) {
                        ops.push(o);
                    }
                }
            }
            let (read, written) = kernel_bytes(program, schedule, i, kernels[i].as_ref());
            serde_json::json!({
                "name": k.name,
                "kind": k.kind.name(),
                "ops": ops,
                "xnumel": extent(k.xnumel),
                "rnumel": k.rnumel.map(extent),
                "bytes_read": read,
                "bytes_written": written,
                "launch": launches.iter().find(|l| l.name == k.name).map(launch_json),
            })
        })
        .collect();
    let generated = schedule.kernels.iter().filter(|k| k.kind != KernelKind::Extern).count();
    let symbols: Vec<serde_json::Value> = program
        .symbols
        .iter()
        .map(|s| serde_json::json!({"name": s.symbol.to_string(), "input": s.input, "dim": s.dim, "hint": s.hint}))
        .collect();
    let summary = serde_json::json!({
        "size_symbols": symbols,
        "random_streams": program.random_streams(),
        "kernels": list,
        "generated_kernels": generated,
        "extern_calls": schedule.kernels.len() - generated,
        "compile_seconds": {
            "decompose": times.decompose,
            "rewrite": times.rewrite,
            "lower": times.lower,
            "schedule": times.schedule,
            "codegen": times.codegen,
            "cc": times.cc,
            "graph_cache_read": times.cache_read,
            "total": times.total,
        },
        "graph_cache": times.graph_cache.name(),
        "peak_bytes": schedule.memory.peak_bytes,
        "rewrite": rewrite,
        "templates": templates,
    });
    serde_json::to_string_pretty(&summary).expect("json") + "\n"
}

/// The `rewrite` object of `summary.json`: the graph's estimated bytes and flops before and
/// after the rewrite pass.
pub fn rewrite_json(rewrites: &coil_passes::RewriteReport) -> serde_json::Value {
    serde_json::json!({
        "bytes_before": rewrites.cost_before.bytes,
        "bytes_after": rewrites.cost_after.bytes,
        "flops_before": rewrites.cost_before.flops,
        "flops_after": rewrites.cost_after.flops,
    })
}

/// The `templates` object of `summary.json`: the template stage's counts (chains chosen,
/// refused, kept written out, not matched), its e-graph, its runner's stop and its time.
pub fn templates_json(report: &coil_passes::templates::TemplateReport) -> serde_json::Value {
    serde_json::json!({
        "chosen": report.chosen,
        "refused": report.refused,
        "kept": report.kept(),
        "not_matched": report.unmatched(),
        "rules_fired": report.fired.iter().map(|(_, c)| c).sum::<usize>(),
        "region_nodes": report.region_nodes,
        "egraph_nodes": report.egraph_nodes,
        "iterations": report.iterations,
        "stop_reason": report.stop_reason,
        "seconds": report.seconds,
    })
}

/// A kernel extent for `summary.json`: a number, or the expression (`"4*s0"`) when symbolic.
fn extent(e: coil_ir::sym::Expr) -> serde_json::Value {
    match e.const_value() {
        Some(n) => n.into(),
        None => e.to_string().into(),
    }
}
