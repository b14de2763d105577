//! The back of a compile, shared by a compile of every stage and a graph-cache hit: the tile
//! kernels, the dumps of what the front stages made, `schedule.txt` and `summary.json`, and the
//! [`Compiled`] itself; and the hit ([`from_entry`]), which reads its program and schedule from
//! the entry and loads the kernels' binaries by key.

use super::*;

/// The compiled graph of a graph-cache entry: its program and schedule, the tile kernels built
/// again from them, the kernels' binaries loaded by key. When the binaries are no longer in
/// the cache (or do not load), why, with the dump folder back (the caller compiles the graph).
/// `templates` gives the template stage's report, asked for only when dumps are on.
pub(super) fn from_entry(
    entry: graph_cache::Entry,
    device: Device,
    dump: Dump,
    start: Instant,
    templates: impl FnOnce() -> Result<Option<coil_passes::templates::TemplateReport>>,
) -> std::result::Result<Compiled, (String, Dump)> {
    let graph_cache::Entry { program, pre_fusion, post_fusion, schedule, binary, rewrites, rewrite_json } = entry;
    let (program_view, schedule_view) = (program.clone(), schedule.clone());
    // An entry is checked whole and its program and schedule were checked to read back before
    // it was written, so building from them cannot fail; should it panic all the same, the
    // graph is compiled from scratch rather than the compile failing.
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let kernels = build_tiles(&program, &schedule, &dump);
        let cache_dir = coil_runtime::cpu::default_cache_dir();
        let executable = match (device, binary) {
            (Device::Cpu, graph_cache::Binary::Cpu(key)) => {
                CompiledGraph::from_cache_in(program, schedule, kernels.clone(), key.as_deref(), &cache_dir)
                    .map(|g| g.map(Executable::Cpu))
            }
            (Device::Cuda(n), graph_cache::Binary::Cuda { nvrtc, units }) => {
                let same_nvrtc =
                    nvrtc.is_none_or(|v| coil_runtime::cuda::compiler::nvrtc_version().is_ok_and(|now| now == v));
                match (same_nvrtc, CudaDevice::get(n)) {
                    (true, Ok(dev)) => {
                        CudaCompiledGraph::from_cache_in(dev, program, schedule, kernels.clone(), &units, &cache_dir)
                            .map(|g| g.map(Executable::Cuda))
                    }
                    _ => Ok(None),
                }
            }
            _ => Ok(None),
        };
        executable.map(|e| e.map(|e| (kernels, e)))
    }));
    let (kernels, executable) = match built {
        Ok(Ok(Some(built))) => built,
        Ok(Ok(None)) => return Err(("its kernels' binaries are no longer in the cache".into(), dump)),
        Ok(Err(e)) => return Err((format!("its kernels do not load: {}", e.message), dump)),
        Err(_) => return Err(("building its kernels panicked".into(), dump)),
    };
    let times = StageTimes {
        graph_cache: GraphCacheUse::Hit,
        cache_read: start.elapsed().as_secs_f64(),
        total: start.elapsed().as_secs_f64(),
        ..StageTimes::default()
    };
    dump_texts(&dump, &rewrites, &pre_fusion, &post_fusion);
    // A report that cannot be made costs the dump its file, never the compile.
    let templates = if dump.dir().is_some() { templates().ok().flatten() } else { None };
    if let Some(t) = &templates {
        dump.write("templates.txt", || t.to_string());
    }
    let generated: Vec<TileKernel> = kernels.iter().flatten().cloned().collect();
    dump_sources(&dump, device, &generated);
    Ok(finish(
        executable,
        device,
        times,
        program_view,
        schedule_view,
        kernels,
        [pre_fusion, post_fusion],
        Front { rewrite_json: &rewrite_json, templates },
        dump,
    ))
}

/// The tile kernel of each of `schedule`'s kernels (`None` for an extern one), each written to
/// the dump and the `output_code` log.
pub(super) fn build_tiles(
    program: &coil_ir::loops::LoopProgram,
    schedule: &coil_ir::kernel::Schedule,
    dump: &Dump,
) -> Vec<Option<TileKernel>> {
    use rayon::prelude::*;
    // In parallel, each under this thread's configuration (the builder reads its tuning).
    let config = coil_ir::config::current();
    let build = |k: &coil_ir::kernel::FusedKernel| {
        let build = || coil_codegen::build_kernel(program, k);
        (k.kind != KernelKind::Extern).then(|| coil_ir::config::with_config(config.clone(), build))
    };
    let kernels: Vec<Option<TileKernel>> = schedule.kernels.par_iter().map(build).collect();
    for k in kernels.iter().flatten() {
        dump.write(&format!("kernels/{}.tile", k.name), || k.to_string());
        logs::output_code(&k.name, &k.to_string());
    }
    kernels
}

/// Writes `rewrites.txt`, `ir_pre_fusion.txt` and `ir_post_fusion.txt` (and the `fusion` log).
fn dump_texts(dump: &Dump, rewrites: &str, pre_fusion: &str, post_fusion: &str) {
    dump.write("rewrites.txt", || rewrites.to_string());
    dump.write("ir_pre_fusion.txt", || pre_fusion.to_string());
    dump.write("ir_post_fusion.txt", || post_fusion.to_string());
    logs::fusion(post_fusion);
}

/// Writes each generated kernel's source for `device` to the dump (C on the CPU, CUDA C on a
/// GPU), computed only when dumps are on.
pub(super) fn dump_sources(dump: &Dump, device: Device, generated: &[TileKernel]) {
    if dump.dir().is_none() {
        return;
    }
    for k in generated {
        match device {
            Device::Cpu => {
                dump.write(&format!("kernels/{}.c", k.name), || coil_codegen::emit_c(std::slice::from_ref(k)))
            }
            Device::Cuda(n) => dump.write(&format!("kernels/{}.cu", k.name), || {
                let target =
                    CudaDevice::get(n).map(|d| *d.target()).unwrap_or_else(|_| coil_codegen::cuda::GpuTarget::h100());
                coil_codegen::cuda::emit_cuda_kernel_source(k, &target).unwrap_or_else(|e| format!("/* {e} */"))
            }),
        }
    }
}

/// What the front stages report for `summary.json` and the [`Compiled`].
pub(super) struct Front<'a> {
    /// The `rewrite` object of `summary.json`.
    pub rewrite_json: &'a serde_json::Value,
    /// The template stage's report (on a graph-cache hit, only with dumps on: the stage run
    /// again for them).
    pub templates: Option<coil_passes::templates::TemplateReport>,
}

/// The compiled graph of `executable`, with `schedule.txt` and `summary.json` written.
#[allow(clippy::too_many_arguments)]
pub(super) fn finish(
    executable: Executable,
    device: Device,
    times: StageTimes,
    program: coil_ir::loops::LoopProgram,
    schedule: coil_ir::kernel::Schedule,
    kernels: Vec<Option<TileKernel>>,
    [pre_fusion, post_fusion]: [String; 2],
    front: Front,
    dump: Dump,
) -> Compiled {
    // The launch order and memory plan as text only where someone reads it (a warm start of
    // GPT-2 124M's gradients graph spends about 1 ms making it).
    if dump.dir().is_some() || logs::enabled("schedule") {
        let schedule_text = debug::schedule_text(&program, &schedule, &kernels);
        dump.write("schedule.txt", || schedule_text.clone());
        logs::schedule(&schedule_text);
    }
    let launches = match &executable {
        Executable::Cuda(g) => g.kernel_attributes(),
        Executable::Cpu(_) => vec![],
    };
    let templates = front.templates.as_ref().map_or(serde_json::Value::Null, debug::templates_json);
    let summary = debug::summary_json(&program, &schedule, &kernels, &times, front.rewrite_json, &templates, &launches);
    dump.write("summary.json", || summary.clone());
    let mut checked_nodes: Vec<usize> = program.data_checks.iter().filter_map(|c| c.node).collect();
    checked_nodes.sort_unstable();
    checked_nodes.dedup();
    Compiled {
        executable,
        device,
        times,
        kernels,
        pre_fusion,
        post_fusion,
        summary,
        dump_dir: dump.dir().cloned(),
        templates: front.templates,
        profiled: OnceLock::new(),
        replayed: Mutex::new(Vec::new()),
        checked_nodes,
    }
}
