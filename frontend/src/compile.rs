//! The compile driver: a captured graph through every stage to a runnable [`CompiledGraph`].
//!
//! Stages (see `docs/compiler.md`): decompose, rewrite (e-graph simplification), lower,
//! schedule (fuse), build kernels, emit C, compile and load. Each is timed; with a dump folder
//! configured (`debug_dir`, `COIL_DEBUG`), each writes its dump file ([`crate::debug`]).
//! Compiled graphs are cached in the process by a structural hash of the graph (ops,
//! attributes, shapes, dtypes, edges: no source lines), confirmed node by node and by the
//! settings of the configuration that change code ([`coil_ir::config::Config::same_code`]), so
//! running the same program again costs a lookup; compiled kernels are cached on disk by the
//! runtime, and whole compiled graphs (program, schedule, the kernels' binary keys) by
//! [`crate::graph_cache`], so another process compiling the graph skips every stage before
//! loading the binaries.

use crate::debug::{self, Dump};
use crate::dynamo::dynamic::DynamicSpec;
use crate::graph_cache::{self, GraphCacheUse};
use crate::storage::Storage;
use crate::walk::{Expected, Walk};
use crate::{logs, profile};
use coil_ir::config::Config;
use coil_ir::kernel::{Donation, KernelKind, TileKernel};
use coil_ir::{Error, Graph, RandomState, Result};
use coil_runtime::cpu::CompiledGraph;
use coil_runtime::cuda::{CudaBuffer, CudaCompiledGraph, CudaDevice};
use coil_runtime::{Buffer, Device, RunOrigin, RunOutput};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Seconds spent in each compile stage.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StageTimes {
    /// Decomposition to primitives.
    pub decompose: f64,
    /// The e-graph rewrite pass (`coil_passes::simplify`; 0 with the configuration's `rewrite`
    /// off).
    pub rewrite: f64,
    /// Lowering to loop IR.
    pub lower: f64,
    /// The fusion scheduler and memory plan.
    pub schedule: f64,
    /// Kernel IR and source generation.
    pub codegen: f64,
    /// The C compiler (0 on a disk-cache hit).
    pub cc: f64,
    /// Reading a graph-cache entry and loading its kernels (on a hit: then every stage above
    /// is 0).
    pub cache_read: f64,
    /// The whole compile.
    pub total: f64,
    /// Whether the graph came from the disk cache of compiled graphs ([`crate::graph_cache`]).
    pub graph_cache: GraphCacheUse,
}

/// The runnable form of a compiled graph, per device.
pub enum Executable {
    /// Compiled for the CPU ([`CompiledGraph`]).
    Cpu(CompiledGraph),
    /// Compiled for a CUDA GPU ([`CudaCompiledGraph`]).
    Cuda(CudaCompiledGraph),
}

/// What a run makes of the handle of an input it writes in place (a donated input).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Donated {
    /// The write is a new version of the input's elements: the run returns a handle to it, and
    /// every older handle is stale ([`Storage::check_current`]).
    Overwritten,
    /// The write updates the tensor every handle to it stands for (a replayed compiled
    /// function writing its captured tensors): the run returns the input's own handle, and no
    /// handle goes stale.
    Updated,
}

impl Donated {
    /// The handle a run returns for `input`, which it wrote in place.
    fn mark(self, input: &Storage) -> Storage {
        match self {
            Donated::Overwritten => input.overwritten(),
            Donated::Updated => input.clone(),
        }
    }
}

/// A compiled graph and what it took to build it.
pub struct Compiled {
    /// What runs the graph.
    pub executable: Executable,
    /// The device it runs on.
    pub device: Device,
    /// Seconds per compile stage.
    pub times: StageTimes,
    /// The generated kernels, in launch order (`None` for extern calls).
    pub kernels: Vec<Option<TileKernel>>,
    /// The text of `ir_pre_fusion.txt` (this and the next two are also written to the dump
    /// folder when dumps are on).
    pub pre_fusion: String,
    /// The text of `ir_post_fusion.txt`.
    pub post_fusion: String,
    /// The text of `summary.json`.
    pub summary: String,
    /// The dump folder of this graph, when dumps are on (`debug_dir`, `COIL_DEBUG`).
    pub dump_dir: Option<std::path::PathBuf>,
    /// What the template stage did (the text of `templates.txt`): every attention chain and
    /// what became of it. `None` where the stage did not run, and for a graph read from the
    /// graph cache without dumps (its entry does not carry the report; `explain` runs the stage
    /// again).
    pub templates: Option<coil_passes::templates::TemplateReport>,
    /// Time per launch from the first run, with the configuration's `profile` on
    /// (`COIL_PROFILE=1`; [`Compiled::profile`]).
    pub profiled: OnceLock<Vec<(String, f64)>>,
    /// The outputs of the last replay of its CUDA graph ([`Compiled::run_replayed`]) in the
    /// graph's own buffers, made stale by the next one (`None` for a donated output: its buffer
    /// is the caller's).
    replayed: Mutex<Vec<Option<Storage>>>,
    /// The captured nodes whose data its kernels check (`coil_ir::loops::DataCheck::node`).
    checked_nodes: Vec<usize>,
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
///
/// Dims marked with [`crate::Tensor::mark_dynamic`] on the inputs are symbolic: the graph is
/// compiled for every size of them (or, when it cannot be, for its static sizes; `COIL_LOGS=
/// recompiles` says why).
pub fn inspect(outputs: &[&crate::Tensor]) -> Result<Arc<Compiled>> {
    let captured = crate::capture(outputs);
    let graph = &captured.graph;
    let mut dims = Vec::new();
    for (j, &bits) in captured.marked.iter().enumerate() {
        let shape = &graph.meta(graph.inputs[j]).shape;
        dims.extend((0..shape.len()).filter(|&d| bits >> d & 1 == 1 && shape[d] >= 2).map(|d| (j, d)));
    }
    if !dims.is_empty() {
        let dynamic = crate::dynamo::dynamic::resolve(graph, &dims)
            .map_err(|why| Error::unsupported(format!("dynamic shapes: {why}")))
            .and_then(|spec| compile_dynamic(graph, captured.device, &spec));
        match dynamic {
            Ok(compiled) => return Ok(compiled),
            Err(e) if e.kind == coil_ir::ErrorKind::Unsupported => logs::recompile(&format!("sizes kept static: {e}")),
            Err(e) => return Err(e),
        }
    }
    compile(graph, captured.device)
}

impl Compiled {
    /// Host buffers copied to this graph's GPU (once, for timing).
    fn upload(&self, inputs: &[&Buffer]) -> Result<Vec<CudaBuffer>> {
        let device = CudaDevice::get(match self.device {
            Device::Cuda(n) => n,
            Device::Cpu => 0,
        })?;
        inputs.iter().map(|b| CudaBuffer::from_host(&device, b)).collect()
    }

    /// Launch shape, registers and shared memory of each generated CUDA kernel as it runs (after
    /// the first run, the autotuner's choices when `COIL_AUTOTUNE=1`); empty on the CPU.
    pub fn launches(&self) -> Vec<coil_runtime::cuda::KernelAttributes> {
        match &self.executable {
            Executable::Cuda(g) => g.kernel_attributes(),
            Executable::Cpu(_) => vec![],
        }
    }

    /// Device time of each launch (generated kernel or extern call, named as in the schedule),
    /// in microseconds: the median of `reps` runs after `warmup` (CUDA events between launches
    /// on the GPU, the wall clock on the CPU). Inputs are host buffers.
    pub fn profile(&self, inputs: &[&Buffer], warmup: usize, reps: usize) -> Result<Vec<(String, f64)>> {
        match &self.executable {
            Executable::Cpu(g) => g.profile(inputs, warmup, reps),
            Executable::Cuda(g) => g.profile(&self.upload(inputs)?.iter().collect::<Vec<_>>(), warmup, reps),
        }
    }

    /// With the configuration's `profile` on (`COIL_PROFILE=1`), the first run of a compiled
    /// graph also profiles it
    /// ([`Compiled::profile`]: 2 warm-up runs, median of 10): the times go to
    /// [`Compiled::profiled`], to `summary.json` in the dump folder (`time_us` per kernel) and,
    /// with `COIL_LOGS=schedule`, to stderr.
    fn profile_once(&self, inputs: &[Storage]) -> Result<()> {
        if self.profiled.get().is_some() || !coil_ir::config::current().profile {
            return Ok(());
        }
        let hosts = inputs.iter().map(|s| s.to_host()).collect::<Result<Vec<_>>>()?;
        let times = self.profile(&hosts.iter().map(|b| b.as_ref()).collect::<Vec<_>>(), 2, 10)?;
        let mut summary: serde_json::Value = serde_json::from_str(&self.summary).unwrap_or_default();
        // The launches as run: the autotuner (`COIL_AUTOTUNE=1`) chose them in the first run.
        let launches = self.launches();
        if let Some(kernels) = summary["kernels"].as_array_mut() {
            for k in kernels {
                let time = times.iter().filter(|(name, _)| k["name"] == name.as_str()).map(|(_, t)| t).sum::<f64>();
                k["time_us"] = time.into();
                if let Some(l) = launches.iter().find(|l| k["name"] == l.name.as_str()) {
                    k["launch"] = debug::launch_json(l);
                }
            }
        }
        let lines: Vec<String> = times.iter().map(|(name, t)| format!("{t:>10.1} us  {name}")).collect();
        logs::schedule(&format!("profile (median of 10 runs):\n{}", lines.join("\n")));
        Dump::at(self.dump_dir.clone())
            .write("summary.json", || serde_json::to_string_pretty(&summary).expect("json") + "\n");
        let _ = self.profiled.set(times);
        Ok(())
    }

    /// Runs on inputs already on the graph's device, with the random streams `random` (as
    /// [`crate::capture`] binds them: [`crate::Captured::random`]).
    ///
    /// An output compiled to be written over a donated input ([`compile_donating`]) is written
    /// there: its storage is that input's allocation at a new version, and every older handle
    /// to it is stale ([`Storage::check_current`]).
    pub fn run(&self, inputs: &[Storage], random: &[RandomState]) -> Result<Vec<Storage>> {
        self.run_at(inputs, random, RunOrigin::default())
    }

    /// [`Compiled::run`] for values the user asked for at `origin`. On a GPU the run returns
    /// without waiting for its kernels: a data error one of them reports (an index out of
    /// bounds, ...) surfaces at the next synchronization point (a host read such as `to_vec`
    /// or `item`, [`crate::synchronize`]), named by its kernel and `origin`. The CPU runs
    /// synchronously and reports it here.
    pub fn run_at(&self, inputs: &[Storage], random: &[RandomState], origin: RunOrigin) -> Result<Vec<Storage>> {
        self.run_marking(inputs, random, origin, Donated::Overwritten)
    }

    /// [`Compiled::run_at`], the inputs written in place marked as `donated` says.
    fn run_marking(
        &self,
        inputs: &[Storage],
        random: &[RandomState],
        origin: RunOrigin,
        donated: Donated,
    ) -> Result<Vec<Storage>> {
        let start = Instant::now();
        let outputs = self.run_untimed(inputs, random, origin, donated);
        profile::record(|t| {
            t.graphs += 1;
            t.run += start.elapsed();
        });
        outputs
    }

    /// [`Compiled::run_at`] from a CUDA graph of the run's launches, replayed with one launch
    /// (`CompiledFn::cuda_graphs`; see `coil_runtime::cuda::graphs`): `Ok(None)` when this call
    /// runs as usual instead (on the CPU, on a graph's first call, for a graph that cannot be
    /// replayed). The outputs are the graph's own buffers, written again by the next replay:
    /// the tensors of the previous replay's outputs are stale from then on (an error on use,
    /// never a silent read of the new values).
    pub fn run_replayed(
        &self,
        inputs: &[Storage],
        origin: &RunOrigin,
        donated: Donated,
    ) -> Result<Option<Vec<Storage>>> {
        let Executable::Cuda(g) = &self.executable else { return Ok(None) };
        let start = Instant::now();
        // Inputs already on the device are read where they are, not cloned (a replayed decode
        // step binds hundreds of parameters per call); others are copied there.
        let mut copied: Vec<(usize, Storage)> = Vec::new();
        for (k, s) in inputs.iter().enumerate() {
            match s.cuda_buffer() {
                Some(b) if Device::Cuda(b.device_ordinal()) == self.device => s.check_current()?,
                _ => copied.push((k, s.to_device(self.device)?)),
            }
        }
        let refs: Vec<&CudaBuffer> = (inputs.iter().enumerate())
            .map(|(k, s)| {
                let s = copied.iter().find(|(j, _)| *j == k).map_or(s, |(_, c)| c);
                s.cuda_buffer().expect("on the device").as_ref()
            })
            .collect();
        let Some(buffers) = g.run_replayed(&refs, Arc::new(origin.clone()))? else { return Ok(None) };
        let mut last = self.replayed.lock().unwrap_or_else(|e| e.into_inner());
        last.resize(buffers.len(), None);
        // An output in the buffer of the previous replay's: that tensor is stale from now on.
        let outputs: Vec<Storage> = (buffers.into_iter().zip(last.iter_mut()))
            .map(|(o, last)| match o {
                RunOutput::Donated(k) => donated.mark(&inputs[k]),
                RunOutput::New(b) => {
                    let s = match last {
                        Some(s) if s.cuda_buffer().is_some_and(|x| Arc::ptr_eq(x, &b)) => s.replaced(),
                        _ => Storage::cuda(b),
                    };
                    *last = Some(s.clone());
                    s
                }
            })
            .collect();
        profile::record(|t| {
            t.graphs += 1;
            t.run += start.elapsed();
        });
        Ok(Some(outputs))
    }

    /// [`Compiled::run_at`], replayed from a CUDA graph when `replay` asks for it and the graph
    /// can be ([`Compiled::run_replayed`]); the inputs written in place marked as `donated`
    /// says.
    pub fn run_or_replay(
        &self,
        replay: bool,
        inputs: &[Storage],
        random: &[RandomState],
        origin: RunOrigin,
        donated: Donated,
    ) -> Result<Vec<Storage>> {
        if replay {
            if let Some(outputs) = self.run_replayed(inputs, &origin, donated)? {
                return Ok(outputs);
            }
        }
        self.run_marking(inputs, random, origin, donated)
    }

    /// [`Compiled::run`], without adding to the host times.
    fn run_untimed(
        &self,
        inputs: &[Storage],
        random: &[RandomState],
        origin: RunOrigin,
        donated: Donated,
    ) -> Result<Vec<Storage>> {
        self.profile_once(inputs)?;
        // The buffer the run wrote is the one the input's handle addresses (same device).
        let donated = |k: usize| Ok(donated.mark(&inputs[k]));
        match &self.executable {
            Executable::Cpu(g) => {
                let hosts = inputs.iter().map(|s| s.to_host()).collect::<Result<Vec<_>>>()?;
                let refs: Vec<&Buffer> = hosts.iter().map(|b| b.as_ref()).collect();
                let outputs = g.run_donating(&refs, random).map_err(|e| origin.name(e))?.into_iter();
                outputs.map(|o| o.map(|b| Storage::host(Arc::new(b))).or_input(donated)).collect()
            }
            Executable::Cuda(g) => {
                let on_device = inputs.iter().map(|s| s.to_device(self.device)).collect::<Result<Vec<_>>>()?;
                let refs: Vec<&CudaBuffer> =
                    on_device.iter().map(|s| s.cuda_buffer().expect("moved to the device above").as_ref()).collect();
                let outputs = g.run_donating_at(&refs, random, Arc::new(origin))?.into_iter();
                outputs.map(|o| o.map(|b| Storage::cuda(Arc::new(b))).or_input(donated)).collect()
            }
        }
    }

    /// Where the data errors of a run of this graph for the capture that `source` describes
    /// point: `line` (the user's line that asked for the values), and the line and operands
    /// of each captured node whose data the kernels check.
    pub(crate) fn origin(
        &self,
        line: &'static std::panic::Location<'static>,
        source: impl Fn(usize) -> Option<crate::realize::NodeSource>,
    ) -> RunOrigin {
        let nodes = self.checked_nodes.iter().filter_map(|&n| source(n).map(|(l, operands)| (n, l, operands)));
        RunOrigin { line: Some(line), nodes: nodes.collect() }
    }

    /// Runs on host buffers and returns host buffers (copies to and from the device for CUDA),
    /// without random streams (a graph that draws random numbers runs with [`Compiled::run`]).
    pub fn run_host(&self, inputs: &[&Buffer]) -> Result<Vec<Buffer>> {
        match &self.executable {
            Executable::Cpu(g) => g.run(inputs),
            Executable::Cuda(g) => g.run_host(inputs),
        }
    }

    /// Device time of `reps` runs after `warmup`, in microseconds each (CUDA events on the GPU;
    /// the wall clock on the CPU). Inputs are host buffers, copied to the device once.
    pub fn time_runs(&self, inputs: &[&Buffer], warmup: usize, reps: usize) -> Result<Vec<f64>> {
        match &self.executable {
            Executable::Cpu(g) => {
                for _ in 0..warmup {
                    g.run(inputs)?;
                }
                (0..reps)
                    .map(|_| {
                        let t = Instant::now();
                        g.run(inputs)?;
                        Ok(t.elapsed().as_secs_f64() * 1e6)
                    })
                    .collect()
            }
            Executable::Cuda(g) => g.time_runs(&self.upload(inputs)?.iter().collect::<Vec<_>>(), warmup, reps),
        }
    }
}

/// The scheduler's options for `device`: a GPU block holds rows up to 8192 long in registers,
/// a cluster of blocks (sm_90 and later) rows up to 65536, so that every pass over a row reads
/// it once. The configuration's `persistent_max` (`COIL_PERSISTENT_MAX=N`) sets the longest
/// persistent row on CUDA, for measuring (the codegen holds at most 65536).
fn schedule_options(device: Device) -> Result<coil_passes::ScheduleOptions> {
    match device {
        Device::Cuda(n) => Ok(cuda_schedule_options(CudaDevice::get(n)?.compute_capability().0 >= 9)),
        Device::Cpu => Ok(Default::default()),
    }
}

/// [`schedule_options`] of a CUDA device, with or without thread-block clusters.
fn cuda_schedule_options(clusters: bool) -> coil_passes::ScheduleOptions {
    use coil_codegen::cuda::launch::{BLOCK_ROW_MAX, CLUSTER_ROW_MAX};
    let most = if clusters { CLUSTER_ROW_MAX } else { BLOCK_ROW_MAX };
    let knob = coil_ir::config::current().tuning.persistent_max;
    // An override beyond what the GPU can hold in one block or cluster is capped there: a
    // longer row would need a cluster this GPU cannot launch.
    coil_passes::ScheduleOptions { persistent_max_rnumel: knob.map_or(most, |n| n.min(most)) }
}

/// The CUDA C source of each kernel `captured` compiles to (static sizes), as `(name, source)`
/// in launch order, without a GPU: what `kernels/<name>.cu` would hold in the dump of a GPU with
/// thread-block clusters (an H100). For
/// reading and diffing generated GPU code on a machine that has none.
///
/// ```
/// use coil_frontend::{capture, compile::cuda_sources, Tensor};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
/// let y = x.softmax(-1).unwrap();
/// let sources = cuda_sources(&capture(&[&y]).graph).unwrap();
/// assert_eq!(sources.len(), 1);
/// assert!(sources[0].1.contains("__global__"));
/// ```
pub fn cuda_sources(captured: &Graph) -> Result<Vec<(String, String)>> {
    generated_tiles(captured)?
        .iter()
        .map(|tile| Ok((tile.name.clone(), coil_codegen::cuda::emit_cuda(std::slice::from_ref(tile))?.source)))
        .collect()
}

/// The PTX of each generated kernel of a graph for the GPU `target` (e.g.
/// [`GpuTarget::h100`](coil_codegen::cuda::GpuTarget::h100)), by name, or why the kernel has no
/// PTX form (it then compiles from CUDA C); needs no GPU.
pub fn ptx_sources(
    captured: &Graph,
    target: &coil_codegen::cuda::GpuTarget,
) -> Result<Vec<(String, std::result::Result<String, String>)>> {
    let tuning = coil_codegen::cuda::Tuning::configured();
    Ok(generated_tiles(captured)?
        .iter()
        .map(|tile| (tile.name.clone(), coil_codegen::cuda::ptx::emit_ptx(tile, target, &tuning).map(|m| m.source)))
        .collect())
}

/// The generated (not extern) kernels of a graph as compiled for CUDA.
fn generated_tiles(captured: &Graph) -> Result<Vec<coil_ir::kernel::TileKernel>> {
    let primitive = coil_passes::decompose_with(captured, &COMPILE_DECOMPOSITION)?;
    let (primitive, _) = coil_passes::simplify(&primitive, &coil_passes::RewriteOptions::configured())?;
    let program = coil_passes::split_reductions(&coil_passes::lower(&primitive)?);
    let mut schedule = coil_passes::schedule_with(&program, &cuda_schedule_options(true));
    coil_codegen::cuda::launch::settle_row_kinds(&program, &mut schedule, &coil_codegen::cuda::GpuTarget::h100());
    Ok(schedule
        .kernels
        .iter()
        .filter(|k| k.kind != KernelKind::Extern)
        .map(|k| coil_codegen::build_kernel(&program, k))
        .collect())
}

/// The compile path's decomposition: attention (written out, or `scaled_dot_product_attention`)
/// stays one template node where the template supports it, for one flash-attention call; where
/// it does not (an explicit mask: a decode step over its KV cache), f16/bf16 attention takes its
/// products in the operands' dtype, as PyTorch's kernels do, instead of upcasting the whole
/// cache to f32 at every step. The reference interpreter decomposes it fully, in f32
/// (`coil_passes::decompose`).
const COMPILE_DECOMPOSITION: coil_passes::DecomposeOptions = coil_passes::DecomposeOptions {
    fused_attention: true,
    keep_detach: false,
    half_products: true,
    conv_template: false,
};

/// The rewrite options of a compile for `device`: the e-graph's cost model is that GPU's
/// ([`coil_ir::target::GpuTarget`], read from the device) or the CPU's.
pub(crate) fn rewrite_options(device: Device) -> Result<coil_passes::RewriteOptions> {
    Ok(match device {
        Device::Cpu => coil_passes::RewriteOptions::for_target(None),
        Device::Cuda(n) => coil_passes::RewriteOptions::for_target(Some(CudaDevice::get(n)?.target())),
    })
}

/// What the template stage makes of `captured` compiled for `device`, costed at its rates,
/// without the rest of the compile: for a graph read from the graph cache (whose entry does not
/// carry the report) where a dump or `explain` reads it. `None` where the stage does not run.
pub(crate) fn template_report(
    captured: &Graph,
    device: Device,
) -> Result<Option<coil_passes::templates::TemplateReport>> {
    if !compile_decomposition(device).fused_attention {
        return Ok(None);
    }
    let model = rewrite_options(device)?.model;
    Ok(Some(coil_passes::templates::choose_attention(captured, &model).1))
}

/// [`COMPILE_DECOMPOSITION`] for `device`: convolutions stay one template node (one cuDNN call
/// each way) on a CUDA device where cuDNN loads, at static shapes (the dynamic path takes
/// [`COMPILE_DECOMPOSITION`]); everywhere else they decompose into im2col and a matrix
/// product, as the reference interpreter runs them.
fn compile_decomposition(device: Device) -> coil_passes::DecomposeOptions {
    let cudnn = matches!(device, Device::Cuda(_)) && coil_runtime::cuda::cudnn::available();
    coil_passes::DecomposeOptions { conv_template: cudnn, ..COMPILE_DECOMPOSITION }
}

pub(crate) fn compile_uncached(
    captured: &Graph,
    device: Device,
    dynamic: Option<&DynamicSpec>,
    donations: &[Donation],
) -> Result<Compiled> {
    crate::guard::guard("compiling", captured, || compile_stages(captured, device, dynamic, donations))
}

/// Every stage of [`compile_uncached`]; with the graph cache on
/// ([`coil_ir::config::Config::graph_cache`]), a graph some process compiled before is read
/// from its entry instead ([`crate::graph_cache`]), and a graph compiled here is stored.
fn compile_stages(
    captured: &Graph,
    device: Device,
    dynamic: Option<&DynamicSpec>,
    donations: &[Donation],
) -> Result<Compiled> {
    let start = Instant::now();
    let dump = Dump::new_graph();
    dump.write("graph_captured.txt", || captured.print(true));
    let slot = graph_cache::slot(captured, device, dynamic, donations, &coil_ir::config::current())?;
    let (mut dump, mut cache_use) = (dump, GraphCacheUse::Off);
    if let Some(slot) = &slot {
        cache_use = match graph_cache::read(slot) {
            graph_cache::Found::Entry(entry) => match from_entry(*entry, device, dump, start, || {
                // The entry does not carry the template stage's report: the stage runs again
                // where the dump reads it (a scan, or under a millisecond for GPT-2).
                template_report(captured, device)
            }) {
                Ok(compiled) => return Ok(compiled),
                Err((why, returned)) => {
                    dump = returned;
                    GraphCacheUse::Rebuilt(why)
                }
            },
            graph_cache::Found::Missing => GraphCacheUse::Miss,
            graph_cache::Found::Invalid(why) => {
                coil_runtime::cache_entry::log_invalid(&slot.path, &why);
                GraphCacheUse::Rebuilt(why)
            }
        };
    }
    compile_front(captured, device, dynamic, donations, dump, start, slot.as_ref(), cache_use)
}

/// Every stage from decomposition on (`dump` has the captured graph), storing the result at
/// `slot` when given.
#[allow(clippy::too_many_arguments)]
fn compile_front(
    captured: &Graph,
    device: Device,
    dynamic: Option<&DynamicSpec>,
    donations: &[Donation],
    dump: Dump,
    start: Instant,
    slot: Option<&graph_cache::Slot>,
    cache_use: GraphCacheUse,
) -> Result<Compiled> {
    let mut times = StageTimes { graph_cache: cache_use, ..StageTimes::default() };
    let options = rewrite_options(device)?;

    let (program, rewrites, templates) = match dynamic {
        None => {
            let t = Instant::now();
            // The template stage costs at the rewrite pass's rates: the device's.
            let (primitive, templates) =
                coil_passes::decompose_for(captured, &compile_decomposition(device), &options.model)?;
            times.decompose = t.elapsed().as_secs_f64();
            dump.write("graph_decomposed.txt", || primitive.print(true));

            let t = Instant::now();
            let (primitive, rewrites) = coil_passes::simplify(&primitive, &options)?;
            times.rewrite = t.elapsed().as_secs_f64();

            let t = Instant::now();
            let program = coil_passes::split_reductions(&coil_passes::lower(&primitive)?);
            times.lower = t.elapsed().as_secs_f64();
            (program, rewrites, templates)
        }
        Some(spec) => {
            // Decomposition and rewriting run at probe sizes (timed together as `decompose`).
            let t = Instant::now();
            let symbols: Vec<_> = spec.symbols.iter().map(|s| s.symbol).collect();
            let d = coil_passes::dynamic::generalize_with(
                captured,
                &spec.sizes,
                &symbols,
                &options,
                &COMPILE_DECOMPOSITION,
            )
            .map_err(|why| Error::unsupported(format!("dynamic shapes: {why}")))?;
            times.decompose = t.elapsed().as_secs_f64();
            dump.write("graph_decomposed.txt", || d.primitive.print(true));

            let t = Instant::now();
            let program = coil_passes::split_reductions(&coil_passes::lower_dynamic(
                &d.primitive,
                &d.sizes,
                spec.symbols.clone(),
            )?);
            times.lower = t.elapsed().as_secs_f64();
            (program, d.rewrites, d.templates)
        }
    };
    if let Some(t) = &templates {
        dump.write("templates.txt", || t.to_string());
    }
    let rewrites_text = rewrites.to_string();
    let pre_fusion = program.to_string();
    dump.write("rewrites.txt", || rewrites_text.clone());
    dump.write("ir_pre_fusion.txt", || pre_fusion.clone());

    let t = Instant::now();
    let mut schedule = coil_passes::schedule_with(&program, &schedule_options(device)?);
    if let Device::Cuda(n) = device {
        coil_codegen::cuda::launch::settle_row_kinds(&program, &mut schedule, CudaDevice::get(n)?.target());
    }
    coil_passes::donate(&program, &mut schedule, donations);
    times.schedule = t.elapsed().as_secs_f64();
    let post_fusion = coil_passes::print_schedule(&program, &schedule);
    dump.write("ir_post_fusion.txt", || post_fusion.clone());
    logs::fusion(&post_fusion);

    let t = Instant::now();
    let kernels = build_tiles(&program, &schedule, &dump);
    let generated: Vec<TileKernel> = kernels.iter().flatten().cloned().collect();
    let (program_view, schedule_view) = (program.clone(), schedule.clone());
    let built = match device {
        Device::Cpu => {
            let source = coil_codegen::emit_c(&generated);
            times.codegen = t.elapsed().as_secs_f64();
            dump_sources(&dump, device, &generated);
            CompiledGraph::new(program, schedule, kernels.clone(), &source)
                .map(|g| (g.compile_seconds(), Executable::Cpu(g)))
                .inspect_err(|_| dump.write("kernels/graph.c", || source.clone()))
        }
        Device::Cuda(n) => {
            // One translation unit per kernel, each with only the helpers it uses: the runtime
            // compiles them in parallel, and the disk cache serves a kernel whatever graph it
            // appears in. A failed build keeps every unit's source in the dump (written here).
            // PTX where the PTX emitter covers the kernel (no NVRTC front end or optimizer in a
            // cold compile), else CUDA C; the dump has the CUDA C of every kernel either way.
            let dev = CudaDevice::get(n)?;
            let target = *dev.target();
            let emitted: Vec<_> = {
                use rayon::prelude::*;
                // The pool's threads emit under this thread's configuration.
                let config = coil_ir::config::current();
                let emit = |k| {
                    coil_ir::config::with_config(config.clone(), || coil_codegen::cuda::emit_for_device(k, &target))
                };
                generated.par_iter().map(emit).collect()
            };
            let mut units = Vec::with_capacity(generated.len());
            for (k, e) in generated.iter().zip(emitted) {
                let (unit, why) = e?;
                if let Some(why) = why {
                    logs::output_code(&k.name, &format!("CUDA C through NVRTC (no PTX form: {why})"));
                }
                units.push(unit);
            }
            times.codegen = t.elapsed().as_secs_f64();
            for (k, unit) in generated.iter().zip(&units) {
                match unit.language {
                    coil_codegen::cuda::Language::CudaC => {
                        dump.write(&format!("kernels/{}.cu", k.name), || unit.source.clone())
                    }
                    coil_codegen::cuda::Language::Ptx { .. } => {
                        dump.write(&format!("kernels/{}.ptx", k.name), || unit.source.clone());
                        dump_sources(&dump, device, std::slice::from_ref(k));
                    }
                }
            }
            CudaCompiledGraph::new(dev, program, schedule, kernels.clone(), &units)
                .map(|g| (g.compile_seconds(), Executable::Cuda(g)))
        }
    };
    // A failed build keeps the source that failed next to the other dumps (written above).
    let (cc_seconds, executable) = built?;
    times.cc = cc_seconds;
    let rewrite_json = debug::rewrite_json(&rewrites);
    if let Some(slot) = slot {
        let binary = match &executable {
            Executable::Cpu(g) => graph_cache::Binary::Cpu(g.library_key().map(str::to_string)),
            Executable::Cuda(g) => {
                let units = g.cached_units().to_vec();
                let cuda_c = units.iter().any(|u| u.language == coil_codegen::cuda::Language::CudaC);
                let nvrtc = if cuda_c { Some(coil_runtime::cuda::compiler::nvrtc_version()?) } else { None };
                graph_cache::Binary::Cuda { nvrtc, units }
            }
        };
        let (program, schedule) = (&program_view, &schedule_view);
        graph_cache::write(slot, program, &pre_fusion, schedule, &post_fusion, &binary, &rewrites_text, &rewrite_json);
    }
    times.total = start.elapsed().as_secs_f64();
    let texts = [pre_fusion, post_fusion];
    let front = back::Front { rewrite_json: &rewrite_json, templates };
    Ok(finish(executable, device, times, program_view, schedule_view, kernels, texts, front, dump))
}

#[path = "compile_back.rs"]
mod back;
#[path = "compile_cache.rs"]
mod cache;
use back::{build_tiles, dump_sources, finish, from_entry};
pub use cache::{compile, compile_count, compile_donating, compile_dynamic, compile_fresh};
pub(crate) use cache::{compile_ahead, compile_walked, compiled_walk, find_walk};

#[cfg(test)]
#[path = "compile_tests.rs"]
mod tests;
