//! The compile driver: a captured graph through every stage to a runnable [`CompiledGraph`].
//!
//! Stages (see `docs/compiler.md`): decompose, lower, schedule (fuse), build kernels, emit C,
//! compile and load. Each is timed; with `COIL_DEBUG` set, each writes its dump file
//! ([`crate::debug`]). Compiled graphs are cached in the process by the graph's printed form
//! (ops, attributes, shapes, dtypes: no source lines), so running the same program again costs a
//! lookup; compiled C is cached on disk by the runtime.

use crate::debug::{self, Dump};
use crate::logs;
use coil_ir::kernel::{KernelKind, TileKernel};
use coil_ir::{Graph, Result};
use coil_runtime::cpu::CompiledGraph;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Seconds spent in each compile stage.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StageTimes {
    pub decompose: f64,
    pub lower: f64,
    pub schedule: f64,
    pub codegen: f64,
    /// The C compiler (0 on a disk-cache hit).
    pub cc: f64,
    pub total: f64,
}

/// A compiled graph and what it took to build it.
pub struct Compiled {
    pub graph: CompiledGraph,
    pub times: StageTimes,
    /// The generated kernels, in launch order (`None` for extern calls).
    pub kernels: Vec<Option<TileKernel>>,
    /// The texts of `ir_pre_fusion.txt`, `ir_post_fusion.txt` and `summary.json` (also written
    /// to the dump folder when dumps are on).
    pub pre_fusion: String,
    pub post_fusion: String,
    pub summary: String,
    /// The dump folder of this graph, when `COIL_DEBUG` is set.
    pub dump_dir: Option<std::path::PathBuf>,
}

/// Compiles the pending computation behind `outputs` without running it, and returns what the
/// compiler made: kernels, stage times, the summary. Computed tensors count as inputs.
///
/// ```
/// use coil_frontend::{compile::inspect, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
/// let y = x.softmax(-1).unwrap();
/// if coil_runtime::cpu::c_compiler().is_some() {
///     let compiled = inspect(&[&y]).unwrap();
///     assert_eq!(compiled.kernels.iter().flatten().count(), 1); // softmax is one kernel
/// }
/// ```
pub fn inspect(outputs: &[&crate::Tensor]) -> Result<Arc<Compiled>> {
    compile(&crate::capture(outputs).graph)
}

fn cache() -> &'static Mutex<HashMap<String, Arc<Compiled>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Compiled>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Number of graphs compiled by this process (cache misses), for tests and reports.
pub fn compile_count() -> usize {
    cache().lock().map(|c| c.len()).unwrap_or(0)
}

/// Compiles a captured graph, or returns the cached compilation of an identical one.
pub fn compile(captured: &Graph) -> Result<Arc<Compiled>> {
    let key = captured.print(false);
    if let Some(hit) = cache().lock().expect("compile cache").get(&key) {
        return Ok(hit.clone());
    }
    let compiled = Arc::new(compile_uncached(captured)?);
    cache().lock().expect("compile cache").insert(key, compiled.clone());
    Ok(compiled)
}

fn compile_uncached(captured: &Graph) -> Result<Compiled> {
    let start = Instant::now();
    let mut times = StageTimes::default();
    let dump = Dump::new_graph();
    dump.write("graph_captured.txt", || captured.print(true));

    let t = Instant::now();
    let primitive = coil_passes::decompose(captured)?;
    times.decompose = t.elapsed().as_secs_f64();
    dump.write("graph_decomposed.txt", || primitive.print(true));

    let t = Instant::now();
    let program = coil_passes::split_reductions(&coil_passes::lower(&primitive)?);
    times.lower = t.elapsed().as_secs_f64();
    let pre_fusion = program.to_string();
    dump.write("ir_pre_fusion.txt", || pre_fusion.clone());

    let t = Instant::now();
    let schedule = coil_passes::schedule(&program);
    times.schedule = t.elapsed().as_secs_f64();
    let post_fusion = coil_passes::print_schedule(&program, &schedule);
    dump.write("ir_post_fusion.txt", || post_fusion.clone());
    logs::fusion(&post_fusion);

    let t = Instant::now();
    let kernels: Vec<Option<TileKernel>> = schedule
        .kernels
        .iter()
        .map(|k| (k.kind != KernelKind::Extern).then(|| coil_codegen::build_kernel(&program, k)))
        .collect();
    let generated: Vec<TileKernel> = kernels.iter().flatten().cloned().collect();
    let source = coil_codegen::emit_c(&generated);
    times.codegen = t.elapsed().as_secs_f64();
    for k in &generated {
        dump.write(&format!("kernels/{}.tile", k.name), || k.to_string());
        dump.write(&format!("kernels/{}.c", k.name), || coil_codegen::emit_c(std::slice::from_ref(k)));
        logs::output_code(&k.name, &k.to_string());
    }

    let (program_view, schedule_view) = (program.clone(), schedule.clone());
    let compiled = match CompiledGraph::new(program, schedule, kernels.clone(), &source) {
        Ok(c) => c,
        Err(e) => {
            // Keep the source that failed next to the other dumps.
            dump.write("kernels/graph.c", || source.clone());
            return Err(e);
        }
    };
    times.cc = compiled.compile_seconds();
    times.total = start.elapsed().as_secs_f64();
    let schedule_text = debug::schedule_text(&program_view, &schedule_view, &kernels);
    dump.write("schedule.txt", || schedule_text.clone());
    logs::schedule(&schedule_text);
    let summary = debug::summary_json(&program_view, &schedule_view, &kernels, &times);
    dump.write("summary.json", || summary.clone());
    Ok(Compiled { graph: compiled, times, kernels, pre_fusion, post_fusion, summary, dump_dir: dump.dir().cloned() })
}
