//! The CUDA backend: runs a compiled graph on a GPU.
//!
//! A [`CudaCompiledGraph`] holds a lowered program ([`LoopProgram`]), its [`Schedule`], and the
//! CUBIN that NVRTC built from the CUDA C the code generator emitted for it
//! (`coil_codegen::cuda::emit_cuda`; compiled and cached by [`compiler`]). Running it mirrors
//! the CPU backend ([`crate::cpu::CompiledGraph`]):
//!
//! 1. checks the inputs ([`CudaBuffer`]s on the same device) against the program's inputs and
//!    takes the program at their sizes (`plan::Instances`: with size symbols, bound from the
//!    input shapes and instantiated once per set of sizes, then cached; a static program has
//!    one instance, and a run costs a shape comparison per input);
//! 2. allocates the outputs, and one allocation per memory-plan slot for the temporaries, at
//!    the instance's sizes, from the device's caching allocator ([`memory`]);
//! 3. enqueues the kernels in schedule order on the device's stream: generated kernels with
//!    their launch shape (block fixed at generation; grid fixed too for a constant `xnumel`,
//!    else [`Launch::grid_for`] of the instance's) and, after the buffer pointers, the values
//!    of the size symbols each reads ([`TileKernel::sizes`]) and the key and first counter of
//!    each random stream it draws from ([`TileKernel::random`], the run's values); `Bmm`
//!    through cuBLASLt ([`blas`]) and the attention template through its built-in kernel ([`attention`]) at the instance's
//!    sizes; fallback ops by their built-in kernels ([`fallback`]: scatter, cumsum) where the
//!    dtypes allow, else by copying their operands to the host and running the reference
//!    interpreter;
//! 4. returns the outputs in `program.outputs` order without waiting for the kernels. Each
//!    kernel has 4 status words of its own on the device's status board (`status`), read at
//!    the next synchronization point (a copy to the host, [`CudaDevice::synchronize`], a full
//!    board): the first failing kernel in launch order is named there, with the run's line.
//!
//! With the autotuner on (`COIL_AUTOTUNE=1`, [`autotune`]) the first run also times a few
//! launch plans of each kernel where the heuristic is unsure, as it reaches the kernel, and it
//! and later runs launch the fastest.
//!
//! Nothing here needs CUDA to be installed to build or load: the libraries are found at run
//! time ([`loader`]), and [`cuda_available`] says whether a GPU can be used.

mod ahead;
pub mod attention;
pub mod autotune;
#[cfg(test)]
mod autotune_tests;
pub mod blas;
pub mod blas_choice;
pub mod compiler;
pub mod cudnn;
mod cudnn_graph;
pub mod cudnn_sdpa;
pub mod device;
#[cfg(test)]
mod emulation_build;
pub mod fallback;
pub mod gather;
pub mod graphs;
pub mod loader;
pub mod memory;
mod segments;
pub mod sort;
#[cfg(test)]
mod sort_emulation;
mod status;
#[cfg(test)]
mod tests;
mod units;

pub use autotune::AutotuneChoice;
pub use compiler::{CompiledCubin, LoadedModule};
pub use device::{cuda_available, cuda_status, synchronize_all, CudaDevice};
pub use memory::{AllocatorStats, CudaBuffer, DeviceMemory};
pub use units::CachedUnit;

use crate::plan::{self, check_status, Instance, Instances, LaunchName, RunOrigin, RunOutput, Storage};
use crate::{interpret, Buffer, HostData};
use blas::DevOperand;
use coil_codegen::cuda::{CudaModule, Language, Launch};
use coil_codegen::templates::attention::MaskKind;
use coil_ir::kernel::{Schedule, TileKernel};
use coil_ir::loops::{BufferId, ExternCall, LoopKind, LoopProgram};
use coil_ir::{Error, Graph, Op, RandomState, Result};
use cudarc::driver::{result as drv, sys, CudaEvent};
use device::driver_error;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// Launch shape and resources of one generated kernel, for dumps (`summary.json`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelAttributes {
    /// The kernel's entry point.
    pub name: String,
    /// Blocks in the (1-D) grid; for a kernel of symbolic `xnumel`, at the size symbols' hints
    /// (each run computes its own).
    pub grid: u32,
    /// Threads per (1-D) block.
    pub block: u32,
    /// Registers per thread (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
    pub registers: u32,
    /// Static shared memory per block (`CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`).
    pub static_shared_bytes: u32,
    /// Dynamic shared memory per block, as launched.
    pub dynamic_shared_bytes: u32,
    /// The autotuner's plan when it replaced the heuristic's (`row_threads=512`, ...; see
    /// [`autotune`]), else `None`.
    pub tuning: Option<String>,
    /// What compiled the kernel's unit: `nvrtc` (CUDA C) or `ptxas -O<level>` (PTX, through the
    /// driver's assembler at that optimization level).
    pub compiler: &'static str,
    /// Microseconds the compiler took on the kernel's translation unit in this process (0: a
    /// disk-cache hit).
    pub compile_us: u64,
    /// Microseconds loading its CUBIN (`cuModuleLoadData`, function look-ups).
    pub load_us: u64,
}

/// A graph compiled for a GPU, ready to run any number of times (also from several threads:
/// all runs are ordered on the device's one stream).
#[derive(Debug)]
pub struct CudaCompiledGraph {
    device: Arc<CudaDevice>,
    program: LoopProgram,
    schedule: Schedule,
    /// One per schedule kernel: the tile kernel it was generated from (`None`: extern).
    tiles: Vec<Option<TileKernel>>,
    /// The program at each run's sizes.
    instances: Instances,
    steps: Vec<Step>,

    attributes: Vec<KernelAttributes>,
    /// The loaded CUBINs, one per translation unit (none when every kernel is extern).
    modules: Vec<Arc<LoadedModule>>,
    cubins: Vec<CompiledCubin>,
    /// The translation units with kernels, as the disk cache holds them (for the graph cache).
    units: Vec<CachedUnit>,
    /// Wall-clock seconds of the NVRTC compiles (run in parallel; 0 when all were cached).
    compile_seconds: f64,
    /// The launch that owns each 4 status words of a run (one per step, in launch order).
    status_kernels: Arc<[LaunchName]>,
    /// The kernel cache it was built through (the autotuner's candidates and choices go there).
    cache_dir: PathBuf,
    /// Whether the first run autotunes the launches ([`autotune`]; the configuration's
    /// `autotune`, `COIL_AUTOTUNE=1`).
    autotune: bool,
    /// The configuration it was compiled under, in force while the autotuner builds
    /// candidates (their code follows the same tuning overrides as the graph's kernels).
    config: Arc<coil_ir::config::Config>,
    /// The autotuner's variants, set by the first run when it tunes (unset otherwise).
    tuned: OnceLock<autotune::Tuned>,
    /// Held by the run that tunes, so that a run started meanwhile waits for its choices.
    tuning: Mutex<()>,
    /// Its CUDA graph, for [`CudaCompiledGraph::run_replayed`].
    replay: Mutex<graphs::Replay>,
}

// SAFETY: the raw `CUfunction` handles in `steps` are immutable, belong to `modules` (kept alive
// here) and are used only with the device's context bound; everything else is plain data.
unsafe impl Send for CudaCompiledGraph {}
// SAFETY: as above; `run` takes `&self` and mutates nothing shared.
unsafe impl Sync for CudaCompiledGraph {}

/// One launch.
#[derive(Debug)]
enum Step {
    /// A generated kernel: its function, launch shape (`launch.grid` is 0 when each run
    /// computes it), its index among the schedule's kernels, the buffer of each argument in
    /// order, its index among the generated kernels (in `attributes`), and the language it was
    /// compiled from (the autotuner's candidates are emitted in it).
    Generated {
        name: String,
        func: sys::CUfunction,
        launch: Launch,
        kernel: usize,
        args: Vec<BufferId>,
        attribute: usize,
        language: Language,
    },
    /// An extern node (`Bmm`, attention or a fallback op), by index in `program.nodes`.
    Extern { node: usize },
}

/// Where a run's launches report data errors.
enum RunStatus {
    /// Words taken from the device's status board, the run recorded as asked for at this line.
    Board(Arc<RunOrigin>),
    /// The 4 words per step at this address (a CUDA graph's own).
    At(u64),
}

/// A run enqueued on the stream: its outputs, not yet collected. Its temporaries went back
/// to the allocator's cache when it was enqueued (a later owner's work follows on the stream).
struct Pending {
    /// The program at the run's sizes.
    inst: Arc<Instance>,
    outputs: Vec<Option<CudaBuffer>>,
}

impl CudaCompiledGraph {
    /// Compiles `modules` (translation units, compiled in parallel) with NVRTC for `device` (through the cache in
    /// [`crate::cpu::default_cache_dir`]) and prepares the launches. `kernels` has one entry per
    /// schedule kernel: the tile kernel it was generated from, `None` for an extern kernel;
    /// some module must hold a kernel (with its launch shape) of each tile kernel's name.
    pub fn new(
        device: Arc<CudaDevice>,
        program: LoopProgram,
        schedule: Schedule,
        kernels: Vec<Option<TileKernel>>,
        modules: &[CudaModule],
    ) -> Result<CudaCompiledGraph> {
        CudaCompiledGraph::new_in(device, program, schedule, kernels, modules, &crate::cpu::default_cache_dir())
    }

    /// [`CudaCompiledGraph::new`] with an explicit cache directory.
    pub fn new_in(
        device: Arc<CudaDevice>,
        program: LoopProgram,
        schedule: Schedule,
        kernels: Vec<Option<TileKernel>>,
        modules: &[CudaModule],
        cache_dir: &Path,
    ) -> Result<CudaCompiledGraph> {
        // The first run's attention plans and template units, made beside the kernels' compile.
        ahead::start(&device, &program);
        let start = std::time::Instant::now();
        let units: Vec<&CudaModule> = modules.iter().filter(|m| !m.kernels.is_empty()).collect();
        // Kernels that differ only in their names (each layer of a model has the same ones) are
        // built once: a one-kernel unit is compiled under a canonical name, so identical code
        // is one source, one compile and one disk-cache entry, in this graph and across graphs.
        let canonical: Vec<CudaModule> = units.iter().map(|m| canonical_unit(m)).collect();
        let mut distinct: Vec<&CudaModule> = Vec::new();
        let unit_of: Vec<usize> = canonical
            .iter()
            .map(|c| match distinct.iter().position(|d| d.source == c.source && d.language == c.language) {
                Some(i) => i,
                None => {
                    distinct.push(c);
                    distinct.len() - 1
                }
            })
            .collect();
        let built = build_units(&device, &distinct, cache_dir);
        let (mut loaded, mut cubins) = (Vec::new(), Vec::new());
        for b in built {
            let (m, c) = b?;
            loaded.push(m);
            cubins.push(c);
        }
        let compile_seconds = if cubins.iter().all(|c| c.cache_hit) { 0.0 } else { start.elapsed().as_secs_f64() };
        let units = (units.iter().zip(&canonical).zip(&unit_of))
            .map(|((unit, canonical), &u)| CachedUnit {
                language: unit.language,
                key: cubins[u].key.clone(),
                kernels: unit.kernels.clone(),
                symbols: canonical.kernels.iter().map(|k| k.name.clone()).collect(),
            })
            .collect();
        let built = units::Built { units, unit_of, loaded, cubins, compile_seconds };
        CudaCompiledGraph::assemble(device, program, schedule, kernels, built, cache_dir)
    }

    /// [`CudaCompiledGraph::new_in`] without the kernels' sources: `units` are the translation
    /// units of the graph compiled before ([`CudaCompiledGraph::cached_units`]), whose CUBINs
    /// are loaded from `cache_dir` by key. `Ok(None)` when the cache no longer holds one of them
    /// whole or the driver refuses it (the caller then compiles the graph from its sources).
    pub fn from_cache_in(
        device: Arc<CudaDevice>,
        program: LoopProgram,
        schedule: Schedule,
        kernels: Vec<Option<TileKernel>>,
        units: &[CachedUnit],
        cache_dir: &Path,
    ) -> Result<Option<CudaCompiledGraph>> {
        // The first run's attention plans and template units, made beside the kernels' load.
        ahead::start(&device, &program);
        let Some(built) = units::load_cached(&device, units, cache_dir) else { return Ok(None) };
        CudaCompiledGraph::assemble(device, program, schedule, kernels, built, cache_dir).map(Some)
    }

    /// The translation units it was built from, as the disk cache holds them: what
    /// [`CudaCompiledGraph::from_cache_in`] loads it by.
    pub fn cached_units(&self) -> &[CachedUnit] {
        &self.units
    }

    /// The graph with its built translation units.
    fn assemble(
        device: Arc<CudaDevice>,
        program: LoopProgram,
        schedule: Schedule,
        kernels: Vec<Option<TileKernel>>,
        built: units::Built,
        cache_dir: &Path,
    ) -> Result<CudaCompiledGraph> {
        let bad = |msg: String| Error::runtime(format!("inconsistent CUDA compiled graph: {msg}"));
        let config = coil_ir::config::current();
        let instances = Instances::new(&program, &schedule, &kernels).map_err(bad)?;
        let hints = program.hints();
        let units::Built { units, unit_of, loaded, cubins, compile_seconds } = built;
        let launches = (instances.steps.iter())
            .map(|&step| match step {
                plan::Step::Kernel(i) => {
                    let tile = kernels[i].as_ref().expect("a generated kernel");
                    let launch = (units.iter().flat_map(|m| &m.kernels))
                        .find(|k| k.name == tile.name)
                        .map(|k| k.launch)
                        .ok_or_else(|| bad(format!("no CUDA module has the kernel {}", tile.name)))?;
                    if launch.grid == 0 && tile.xnumel.const_value().is_some() {
                        return Err(bad(format!("{} has a constant xnumel but no grid", tile.name)));
                    }
                    Ok(Ok((i, tile, launch)))
                }
                plan::Step::Extern(node) => Ok(Err(node)),
            })
            .collect::<Result<Vec<std::result::Result<(usize, &TileKernel, Launch), usize>>>>()?;

        let mut steps = Vec::with_capacity(launches.len());
        let mut attributes = Vec::new();
        for p in launches {
            match p {
                Ok((kernel, tile, launch)) => {
                    let unit = units.iter().position(|m| m.kernels.iter().any(|k| k.name == tile.name));
                    let unit = unit.expect("found above");
                    let symbol = (units[unit].symbols.iter().zip(&units[unit].kernels))
                        .find(|(_, k)| k.name == tile.name)
                        .map(|(c, _)| c.clone())
                        .ok_or_else(|| bad(format!("the unit of {} has no symbol for it", tile.name)))?;
                    let func = loaded[unit_of[unit]].function(&symbol)?;
                    compiler::allow_dynamic_shared(&device, func, launch.shared_bytes)?;
                    let (registers, static_shared_bytes) = compiler::function_resources(&device, func)?;
                    let grid = match launch.grid {
                        0 => launch.grid_for(tile.xnumel.eval(&hints).unwrap_or(0)),
                        g => g,
                    };
                    attributes.push(KernelAttributes {
                        name: tile.name.clone(),
                        grid,
                        block: launch.block,
                        registers,
                        static_shared_bytes,
                        dynamic_shared_bytes: launch.shared_bytes,
                        tuning: None,
                        compiler: match units[unit].language {
                            Language::CudaC => "nvrtc",
                            Language::Ptx { level: 0 } => "ptxas -O0",
                            Language::Ptx { level: 1 } => "ptxas -O1",
                            Language::Ptx { level: 2 } => "ptxas -O2",
                            Language::Ptx { level: 3 } => "ptxas -O3",
                            Language::Ptx { .. } => "ptxas -O4",
                        },
                        compile_us: (cubins[unit_of[unit]].compile_seconds * 1e6) as u64,
                        load_us: (cubins[unit_of[unit]].load_seconds * 1e6) as u64,
                    });
                    let attribute = attributes.len() - 1;
                    let args = tile.args.iter().map(|a| a.buffer).collect();
                    let language = units[unit].language;
                    steps.push(Step::Generated {
                        name: tile.name.clone(),
                        func,
                        launch,
                        kernel,
                        args,
                        attribute,
                        language,
                    });
                }
                Err(node) => steps.push(Step::Extern { node }),
            }
        }
        // One slot of 4 status words per launch (generated kernels and the device scatter
        // report data errors there; the other extern calls leave theirs zero).
        let status_kernels = steps
            .iter()
            .map(|step| match step {
                Step::Generated { kernel, .. } => LaunchName::of(&program, &schedule, *kernel),
                Step::Extern { node } => match schedule.kernels.iter().position(|k| k.nodes.contains(node)) {
                    Some(k) => LaunchName::of(&program, &schedule, k),
                    None => LaunchName::plain(crate::plan::extern_name(&schedule, *node)),
                },
            })
            .collect();
        Ok(CudaCompiledGraph {
            device,
            program,
            schedule,
            tiles: kernels,
            instances,
            steps,
            attributes,
            modules: loaded,
            cubins,
            units,
            compile_seconds,
            status_kernels,
            cache_dir: cache_dir.to_path_buf(),
            autotune: config.autotune,
            config,
            tuned: OnceLock::new(),
            tuning: Mutex::new(()),
            replay: Mutex::new(graphs::Replay::default()),
        })
    }

    /// With the launch autotuner on or off ([`autotune`]; the default is on when
    /// `COIL_AUTOTUNE=1`). Takes effect at the first run; call it before that.
    pub fn with_autotune(mut self, on: bool) -> CudaCompiledGraph {
        self.autotune = on;
        self
    }

    /// The autotuner's choice for each kernel it considered (empty before the first run, or
    /// when it is off), in launch order.
    pub fn autotune_choices(&self) -> &[AutotuneChoice] {
        self.tuned.get().map_or(&[], |t| t.choices.as_slice())
    }

    /// The device it runs on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The program it runs (with its size symbols, if any).
    pub fn program(&self) -> &LoopProgram {
        &self.program
    }

    /// Its schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Seconds NVRTC ran to build it (0 when the cache had it or nothing was compiled).
    pub fn compile_seconds(&self) -> f64 {
        self.compile_seconds
    }

    /// True when every CUBIN came from the disk cache (false when there is none).
    pub fn cache_hit(&self) -> bool {
        !self.cubins.is_empty() && self.cubins.iter().all(|c| c.cache_hit)
    }

    /// Why a translation unit's cache entry was not used and its CUBIN was compiled again (the
    /// entry was damaged, another key's, or refused by the driver; also logged on stderr): the
    /// first such unit's reason.
    pub fn cache_rebuilt_because(&self) -> Option<&str> {
        self.cubins.iter().find_map(|c| c.rebuilt_because.as_deref())
    }

    /// The first translation unit's cached CUBIN entry (`None` when every kernel is extern).
    pub fn cubin_path(&self) -> Option<&Path> {
        self.cubins.first().map(|c| c.path.as_path())
    }

    /// The first translation unit's cached CUDA source (`None` when every kernel is extern).
    pub fn source_path(&self) -> Option<PathBuf> {
        self.cubins.first().map(|c| c.source_path.clone())
    }

    /// Launch shape, registers and shared memory of each generated kernel, in launch order.
    pub fn kernel_attributes(&self) -> Vec<KernelAttributes> {
        let mut attributes = self.attributes.clone();
        let Some(tuned) = self.tuned.get() else { return attributes };
        for (i, step) in self.steps.iter().enumerate() {
            let (Step::Generated { attribute, kernel, .. }, Some((func, launch))) = (step, tuned.variant(i)) else {
                continue;
            };
            let a = &mut attributes[*attribute];
            if let Ok((registers, static_shared_bytes)) = compiler::function_resources(&self.device, func) {
                (a.registers, a.static_shared_bytes) = (registers, static_shared_bytes);
            }
            a.block = launch.block;
            let xnumel = self.tiles[*kernel].as_ref().and_then(|t| t.xnumel.eval(&self.program.hints()).ok());
            a.grid = match launch.grid {
                0 => launch.grid_for(xnumel.unwrap_or(0)),
                g => g,
            };
            a.tuning = tuned.choices.iter().find(|c| c.kernel == a.name).map(|c| c.tuning.to_string());
        }
        attributes
    }

    /// Runs the graph on `inputs` (on this graph's device, matching the program's inputs: any
    /// sizes for which its size symbols bind, at least 2 each) and returns the outputs in
    /// `program.outputs` order, at the inputs' sizes. Data errors a kernel detects (an index out
    /// of bounds, ...) are errors naming the kernel, as on the CPU. The run has no random
    /// streams: [`CudaCompiledGraph::run_with`] runs programs that draw random numbers.
    ///
    /// An output the schedule writes over a donated input ([`coil_ir::kernel::MemoryPlan`]'s
    /// `donated`) is written there, so that input changes; here it is returned as a copy.
    pub fn run(&self, inputs: &[&CudaBuffer]) -> Result<Vec<CudaBuffer>> {
        self.run_with(inputs, &[])
    }

    /// [`CudaCompiledGraph::run`] with the run's random streams: `random[s]` is where the
    /// program's stream `s` starts (key and first counter; see `coil_ir::philox`).
    pub fn run_with(&self, inputs: &[&CudaBuffer], random: &[RandomState]) -> Result<Vec<CudaBuffer>> {
        let outputs = self.run_donating(inputs, random)?;
        outputs.into_iter().map(|o| o.or_input(|k| inputs[k].try_clone())).collect()
    }

    /// [`run_with`](Self::run_with), with each output written over a donated input returned as
    /// [`RunOutput::Donated`]: the caller's input buffer now holds it. The caller must not read
    /// a donated input's old elements afterwards.
    pub fn run_donating(&self, inputs: &[&CudaBuffer], random: &[RandomState]) -> Result<Vec<RunOutput<CudaBuffer>>> {
        self.run_donating_at(inputs, random, Default::default())
    }

    /// [`run_donating`](Self::run_donating) for a run the user asked for at `origin`: a data
    /// error one of its kernels reports is named with that line when it surfaces, at the next
    /// synchronization point (see `status`; a run returns without waiting for its kernels).
    pub fn run_donating_at(
        &self,
        inputs: &[&CudaBuffer],
        random: &[RandomState],
        origin: Arc<RunOrigin>,
    ) -> Result<Vec<RunOutput<CudaBuffer>>> {
        let pending = self.enqueue(inputs, random, None, RunStatus::Board(origin))?;
        self.finish(inputs, pending)
    }

    /// Device time of each launch (a generated kernel or an extern call, in launch order, named
    /// as in the schedule), in microseconds: the median over `reps` runs after `warmup`, from
    /// CUDA events recorded on the stream between consecutive launches (`COIL_PROFILE=1`).
    /// Random numbers are drawn from key 0 (what they are does not change the time).
    pub fn profile(&self, inputs: &[&CudaBuffer], warmup: usize, reps: usize) -> Result<Vec<(String, f64)>> {
        let random = plan::timing_streams(self.program.random_streams());
        self.tune_before_timing(inputs, &random)?;
        for _ in 0..warmup {
            self.run_with(inputs, &random)?;
        }
        let events = timing_events(&self.device, self.steps.len() + 1)?;
        let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(reps); self.steps.len()];
        for _ in 0..reps.max(1) {
            let pending = self.enqueue(inputs, &random, Some(&events), RunStatus::Board(Default::default()))?;
            self.finish(inputs, pending)?;
            for (i, sample) in samples.iter_mut().enumerate() {
                sample.push(elapsed_us(&events[i], &events[i + 1])?);
            }
        }
        self.device.synchronize()?;
        Ok(self
            .steps
            .iter()
            .zip(samples)
            .map(|(step, mut t)| (self.step_name(step), crate::plan::median(&mut t)))
            .collect())
    }

    /// The schedule's name for a launch.
    fn step_name(&self, step: &Step) -> String {
        match step {
            Step::Generated { name, .. } => name.clone(),
            Step::Extern { node } => crate::plan::extern_name(&self.schedule, *node),
        }
    }

    /// [`run`](Self::run) on host buffers: uploads the inputs, runs, downloads the outputs.
    pub fn run_host(&self, inputs: &[&Buffer]) -> Result<Vec<Buffer>> {
        let dev: Vec<CudaBuffer> =
            inputs.iter().map(|b| CudaBuffer::from_host(&self.device, b)).collect::<Result<_>>()?;
        let refs: Vec<&CudaBuffer> = dev.iter().collect();
        self.run(&refs)?.iter().map(CudaBuffer::to_host).collect()
    }

    /// Runs `warmup` untimed runs, then `reps` runs each timed with CUDA events recorded on the
    /// stream around its enqueued work; returns each timed run's device time in microseconds.
    /// (A graph with fallback ops synchronises with the host inside the run, which is then
    /// included.) Each run's status is still checked.
    ///
    /// Before each timed run the stream zeroes a 256 MiB scratch buffer, as
    /// `triton.testing.do_bench` (which times PyTorch in `torch_suite.py`) does: every run
    /// starts with a cold L2, and the host's work to enqueue the run overlaps that memset
    /// instead of leaving the GPU idle inside the timed window. Random numbers are drawn from
    /// key 0.
    pub fn time_runs(&self, inputs: &[&CudaBuffer], warmup: usize, reps: usize) -> Result<Vec<f64>> {
        let random = plan::timing_streams(self.program.random_streams());
        self.tune_before_timing(inputs, &random)?;
        for _ in 0..warmup {
            self.run_with(inputs, &random)?;
        }
        const FLUSH_BYTES: usize = 256 << 20;
        let flush = DeviceMemory::alloc(&self.device, FLUSH_BYTES)?;
        let [start, end]: [CudaEvent; 2] = timing_events(&self.device, 2)?.try_into().expect("two events");
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            flush.zero(FLUSH_BYTES)?;
            record(&self.device, &start)?;
            let pending = self.enqueue(inputs, &random, None, RunStatus::Board(Default::default()))?;
            record(&self.device, &end)?;
            self.finish(inputs, pending)?;
            times.push(elapsed_us(&start, &end)?);
        }
        self.device.synchronize()?;
        Ok(times)
    }

    /// Runs once first when that run would autotune, so that no timing includes the tuning.
    fn tune_before_timing(&self, inputs: &[&CudaBuffer], random: &[RandomState]) -> Result<()> {
        if self.autotune && self.tuned.get().is_none() {
            self.run_with(inputs, random)?;
        }
        Ok(())
    }

    /// Checks the inputs and returns the program at their sizes.
    fn check_inputs(&self, inputs: &[&CudaBuffer]) -> Result<Arc<Instance>> {
        let p = &self.program;
        if inputs.len() != p.inputs.len() {
            return Err(Error::value(format!(
                "the compiled graph takes {} inputs, got {}",
                p.inputs.len(),
                inputs.len()
            )));
        }
        let shapes: Vec<&[usize]> = inputs.iter().map(|b| b.meta().shape.as_slice()).collect();
        let inst = self.instances.get(p, &self.schedule, &self.tiles, &shapes)?;
        for (k, (id, buf)) in inst.program.inputs.iter().zip(inputs).enumerate() {
            let want = &inst.program.buffer(*id).meta;
            if buf.dtype() != want.dtype {
                let text = p.buffer(*id).type_text();
                return Err(Error::dtype(format!("input {k}: expected {text}, got {}", buf.meta())));
            }
            if buf.bytes() < want.nbytes() {
                return Err(Error::shape(format!("input {k}: {} bytes for {want}", buf.bytes())));
            }
            if buf.device().ordinal() != self.device.ordinal() {
                return Err(Error::value(format!(
                    "input {k} is on cuda:{}, the graph runs on cuda:{}",
                    buf.device().ordinal(),
                    self.device.ordinal()
                )));
            }
        }
        Ok(inst)
    }

    /// Allocates and enqueues one run (fallback ops synchronise on the way); its status words
    /// are checked later ([`RunStatus`]). With `marks` (one event per launch and one more),
    /// records `marks[i]` before launch `i` and the last one after the last launch.
    fn enqueue(
        &self,
        inputs: &[&CudaBuffer],
        random: &[RandomState],
        marks: Option<&[CudaEvent]>,
        status: RunStatus,
    ) -> Result<Pending> {
        let inst = self.check_inputs(inputs)?;
        // The words of each kernel's random streams, checked before anything is enqueued.
        let words: Vec<Vec<u64>> = (self.tiles.iter())
            .map(|t| t.as_ref().map_or(Ok(vec![]), |t| plan::random_words(t, random)))
            .collect::<Result<_>>()?;
        let p = &inst.program;
        let dev = &self.device;
        // Outputs are not zeroed: every output is fully written by the kernel that produces it.
        let outputs: Vec<Option<CudaBuffer>> = (0..p.buffers.len())
            .map(|i| {
                (inst.storage[i] == Storage::Output)
                    .then(|| CudaBuffer::alloc(dev, p.buffers[i].meta.clone()))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        // One allocation for the temporaries: slots never in use together share addresses.
        let arena = DeviceMemory::alloc(dev, inst.arena.bytes)?;
        let slot = |s: usize| arena.ptr() + inst.arena.offsets[s] as u64;
        let status = match status {
            RunStatus::Board(_) if self.steps.is_empty() => 0,
            RunStatus::Board(origin) => dev.status.take(dev, &self.status_kernels, &origin)?,
            RunStatus::At(words) => words,
        };
        // Launch `i`'s status words.
        let status_of = |i: usize| status + (i * status::KERNEL_STATUS_BYTES) as u64;
        let ptrs: Vec<u64> = (0..p.buffers.len())
            .map(|i| match inst.storage[i] {
                Storage::Input(k) | Storage::Donated(k) => inputs[k].ptr(),
                Storage::Output => outputs[i].as_ref().expect("allocated above").ptr(),
                Storage::InOutput(o) => outputs[o.0].as_ref().expect("allocated above").ptr(),
                Storage::Slot(s) => slot(s),
                Storage::Unused => 0,
            })
            .collect();
        // Generated kernels make 16-byte vector accesses with no fallback for unaligned
        // buffers: every buffer is an allocation start (the allocator's are 256-byte aligned).
        if let Some(p) = ptrs.iter().find(|&&p| p % 16 != 0) {
            return Err(Error::runtime(format!("a buffer at {p:#x} is not 16-byte aligned")));
        }
        let mark = |i: usize| match marks {
            Some(events) => record(dev, &events[i]),
            None => Ok(()),
        };
        // The first run with the autotuner on picks each kernel's variant as it reaches it;
        // later runs launch the variants picked.
        let mut tuner = self.begin_autotune(&inst)?;
        let tuned = self.tuned.get();
        for (i, step) in self.steps.iter().enumerate() {
            mark(i)?;
            match step {
                Step::Generated { name, func, launch, kernel, args, .. } => {
                    for (out, base) in plan::scatter_bases(p, &inst.schedule.kernels[*kernel]) {
                        if ptrs[out.0] != ptrs[base.0] {
                            // SAFETY: both address at least the (equal) size of the buffers, in
                            // distinct allocations or slots (`check_launches`); the copy is
                            // ordered on the stream before the kernel.
                            unsafe {
                                memory::copy_device(dev, ptrs[out.0], ptrs[base.0], p.buffer(out).meta.nbytes())
                            }?;
                        }
                    }
                    let (func, launch) = match (&mut tuner, tuned) {
                        (Some(tuner), _) => tuner.choose(i, &inst, &ptrs)?,
                        (None, Some(tuned)) => tuned.variant(i).unwrap_or((*func, *launch)),
                        (None, None) => (*func, *launch),
                    };
                    if launch.block == 0 {
                        continue; // nothing to compute
                    }
                    let buffers: Vec<u64> = args.iter().map(|b| ptrs[b.0]).collect();
                    let mut params =
                        kernel_params(&buffers, &inst.kernel_sizes[*kernel], &words[*kernel], status_of(i));
                    // SAFETY: each argument's pointer addresses a live allocation of at least its
                    // buffer's size and dtype at this run's sizes (checked by `Instances`), whose
                    // next owner's work follows on the stream; the status words are this
                    // kernel's 4 on the device's status board.
                    unsafe {
                        launch_generated(dev, name, func, &launch, grid_at(&launch, &inst, *kernel), &mut params)
                    }?;
                }
                Step::Extern { node } => {
                    if let Err(e) = self.run_extern(&inst, *node, &ptrs, arena.ptr(), status_of(i), random) {
                        // A failing kernel earlier in the graph (or in an earlier run) explains
                        // garbage operands best.
                        dev.synchronize()?;
                        return Err(e);
                    }
                }
            }
        }
        mark(self.steps.len())?;
        if let Some(tuner) = tuner {
            tuner.finish();
        }
        Ok(Pending { inst, outputs })
    }

    /// Collects the outputs of an enqueued run (without waiting for it).
    fn finish(&self, inputs: &[&CudaBuffer], pending: Pending) -> Result<Vec<RunOutput<CudaBuffer>>> {
        let Pending { inst, mut outputs } = pending;
        let p = &inst.program;
        let mut result: Vec<RunOutput<CudaBuffer>> = Vec::with_capacity(p.outputs.len());
        for (k, &o) in p.outputs.iter().enumerate() {
            let buf = match inst.storage[o.0] {
                Storage::Input(i) => inputs[i].try_clone()?,
                Storage::Donated(i) => {
                    result.push(RunOutput::Donated(i));
                    continue;
                }
                _ => match outputs[o.0].take() {
                    Some(buf) => buf,
                    // The same buffer returned twice: a copy of the earlier one (never a donated
                    // one: a donated output is returned once).
                    None => match &result[p.outputs.iter().position(|&x| x == o).filter(|&j| j < k).expect("taken")] {
                        RunOutput::New(b) => b.try_clone()?,
                        RunOutput::Donated(_) => unreachable!("a donated output is returned once"),
                    },
                },
            };
            result.push(RunOutput::New(buf));
        }
        Ok(result)
    }

    /// Enqueues one extern node on the run's memory, at the run's sizes; `arena`: the address
    /// of the run's arena (a convolution's workspace is a free range of it where it fits:
    /// `Instance::scratch`); `status`: its 4 status words; `random`: the run's random streams
    /// (an attention's dropout draws from them: launch arguments, never compiled in).
    fn run_extern(
        &self,
        inst: &Instance,
        node: usize,
        ptrs: &[u64],
        arena: u64,
        status: u64,
        random: &[RandomState],
    ) -> Result<()> {
        let p = &inst.program;
        let LoopKind::Extern { call, inputs: operands } = &p.nodes[node].kind else {
            unreachable!("checked in new_in")
        };
        let out_id = p.nodes[node].output;
        let operand = |b: BufferId| DevOperand { ptr: ptrs[b.0], bytes: p.buffer(b).meta.nbytes() };
        match call {
            ExternCall::Bmm { a, b, bias, activation_grad, saved, .. } => {
                let spec = crate::cpu::gemm::BmmSpec::from_call(call).expect("a bmm call of constant sizes");
                let bias = bias.as_ref().map(|x| operand(x.buffer));
                blas::bmm(
                    &self.device,
                    &spec,
                    p.buffer(a.buffer).meta.dtype,
                    p.buffer(out_id).meta.dtype,
                    operand(a.buffer),
                    operand(b.buffer),
                    bias,
                    activation_grad.map(|g| operand(g.aux)),
                    saved.map(operand),
                    operand(out_id),
                )
            }
            ExternCall::Attention(attention_call) => {
                let coil_ir::loops::AttentionCall { q, k, v, lse, mask, mask_rule, .. } = &**attention_call;
                let mut spec =
                    crate::cpu::attention::AttentionSpec::from_call(call).expect("an attention call of constant sizes");
                spec.dropout = crate::cpu::attention_dropout::DropoutDraw::of(attention_call.dropout, random)?;
                let dtype = p.buffer(out_id).meta.dtype;
                let mask = match mask {
                    Some(m) => Some((operand(m.buffer), MaskKind::of(p.buffer(m.buffer).meta.dtype, dtype)?)),
                    None => None,
                };
                let bufs = attention::DevForward {
                    q: operand(q.buffer),
                    k: operand(k.buffer),
                    v: operand(v.buffer),
                    mask,
                    out: operand(out_id),
                    lse: lse.map(operand),
                    offset: mask_rule.as_ref().and_then(|r| r.offset).map(operand),
                };
                attention::attention(&self.device, &spec, dtype, bufs)
            }
            ExternCall::AttentionBackward(backward) => {
                let coil_ir::loops::AttentionBackwardCall { q, k, v, grad_out, lse, out, dq, dk, dv, mask, .. } =
                    &**backward;
                let mut spec = crate::cpu::attention_backward::AttentionBackwardSpec::from_call(call)
                    .expect("an attention backward call of constant sizes");
                spec.dropout = crate::cpu::attention_dropout::DropoutDraw::of(backward.dropout, random)?;
                let grad = |g: &Option<coil_ir::loops::StridedOperand>| g.as_ref().map(|g| operand(g.buffer));
                let bufs = attention::DevBackward {
                    q: operand(q.buffer),
                    k: operand(k.buffer),
                    v: operand(v.buffer),
                    grad_out: operand(grad_out.buffer),
                    lse: operand(*lse),
                    out: operand(out.buffer),
                    dq: grad(dq),
                    dk: grad(dk),
                    dv: grad(dv),
                    mask: match mask {
                        Some(m) => Some((
                            operand(m.buffer),
                            MaskKind::of(p.buffer(m.buffer).meta.dtype, p.buffer(q.buffer).meta.dtype)?,
                        )),
                        None => None,
                    },
                };
                attention::attention_backward(&self.device, &spec, p.buffer(q.buffer).meta.dtype, bufs)
            }
            ExternCall::Conv(conv) => {
                let dtype = p.buffer(out_id).meta.dtype;
                cudnn::convolution(
                    &self.device,
                    conv,
                    dtype,
                    self.config.cudnn_api,
                    operand(conv.a.buffer),
                    operand(conv.b.buffer),
                    operand(out_id),
                    (arena + inst.scratch[node].0 as u64, inst.scratch[node].1),
                )
            }
            ExternCall::Fallback { op: Op::Scatter { dim, reduce } }
                if fallback::supports_scatter(&p.buffer(operands[0]).meta, &p.buffer(operands[1]).meta, *reduce) =>
            {
                let arg = |k: usize| (ptrs[operands[k].0], &p.buffer(operands[k]).meta);
                // An expanded index (an embedding's gradient): a float reduction sorts its rows.
                let repeats = coil_passes::lower::repeats_along(p, operands[1], dim + 1);
                // SAFETY: every buffer of the program is contiguous, of its meta, and distinct
                // from the others, but the base, which the output may be (the scatter then runs
                // in place: `check_launches`); `repeats_along` reads the index's producer.
                unsafe {
                    let (x, index, src, out) = (arg(0), arg(1), arg(2), ptrs[out_id.0]);
                    fallback::scatter(&self.device, *dim, *reduce, x, index, src, out, status, repeats)
                }
            }
            ExternCall::Fallback { op: Op::Cumsum { dim } }
                if fallback::supports_cumsum(&p.buffer(operands[0]).meta, &p.buffer(out_id).meta) =>
            {
                let x = (ptrs[operands[0].0], &p.buffer(operands[0]).meta);
                // SAFETY: both buffers are contiguous, of the checked meta, and distinct.
                unsafe { fallback::cumsum(&self.device, *dim, x, ptrs[out_id.0]) }
            }
            ExternCall::Fallback { op: Op::Argsort { dim, descending } }
                if sort::supports_argsort(&p.buffer(operands[0]).meta, *dim) =>
            {
                let x = (ptrs[operands[0].0], &p.buffer(operands[0]).meta);
                // SAFETY: both buffers are contiguous, of their metas, and distinct.
                unsafe { sort::argsort(&self.device, *dim, *descending, x, ptrs[out_id.0]) }
            }
            ExternCall::Fallback { op } => {
                let mut g = Graph::new();
                let mut ids = Vec::new();
                let mut args = Vec::new();
                for &b in operands {
                    let meta = &p.buffer(b).meta;
                    ids.push(g.input(meta.clone()));
                    // SAFETY: each buffer's pointer addresses at least its size in bytes.
                    let bytes = unsafe { memory::download(&self.device, ptrs[b.0], meta.nbytes())? };
                    args.push(Buffer::new(meta.shape.clone(), HostData::from_bytes(meta.dtype, &bytes)?)?);
                }
                let y = g.push(op.clone(), &ids, None)?;
                g.outputs.push(y);
                let refs: Vec<&Buffer> = args.iter().collect();
                let value = interpret(&g, &refs)?.remove(0);
                if value.meta() != p.buffer(out_id).meta {
                    return Err(Error::runtime(format!(
                        "fallback {op} made {} for {}",
                        value.meta(),
                        p.buffer(out_id).meta
                    )));
                }
                let bytes = value.data.to_bytes();
                // SAFETY: the output's memory holds its meta's bytes, which `bytes` has.
                unsafe { memory::upload(&self.device, ptrs[out_id.0], &bytes)? };
                // `bytes` is dropped on return: the driver staged the pageable copy already,
                // but a synchronisation keeps this rare path obviously sound.
                self.device.wait()
            }
        }
    }

    /// The loaded modules, one per translation unit (none when every kernel is extern).
    pub fn modules(&self) -> &[Arc<LoadedModule>] {
        &self.modules
    }
}

/// Prints `text` on the `schedule` log channel (the configuration's `logs`; `COIL_LOGS=schedule`
/// or `all`), as the frontend prints its schedule: how the launches run (autotuning, CUDA graphs).
fn schedule_log(text: &str) {
    if coil_ir::config::current().logs_on("schedule") {
        eprintln!("[coil:schedule] {text}");
    }
}

/// Compiles (or finds in the cache) and loads each translation unit on a thread of rayon's
/// pool: compiles are independent, so the whole takes about its slowest one. The pool's
/// threads live on, so the driver's per-thread set-up for assembling PTX (about 7 ms on the
/// H100 machine, paid again by every fresh thread) is paid once per thread, at start-up
/// ([`compiler::warm_up`]). One result per unit, in order.
/// The symbol a one-kernel unit is compiled under: its code, not its name, tells it apart.
const CANONICAL_KERNEL: &str = "coil_kernel";

/// `unit` with its kernel renamed to [`CANONICAL_KERNEL`] when it has exactly one kernel
/// (every occurrence: the name also prefixes PTX parameter names and heads the comment);
/// otherwise `unit` as it is.
fn canonical_unit(unit: &CudaModule) -> CudaModule {
    let mut canonical = unit.clone();
    if let [kernel] = unit.kernels.as_slice() {
        canonical.source = unit.source.replace(&kernel.name, CANONICAL_KERNEL);
        canonical.kernels[0].name = CANONICAL_KERNEL.to_string();
    }
    canonical
}

fn build_units(
    device: &Arc<CudaDevice>,
    units: &[&CudaModule],
    cache_dir: &Path,
) -> Vec<Result<(Arc<LoadedModule>, CompiledCubin)>> {
    use rayon::prelude::*;
    // The pool's threads compile under the caller's configuration (NVRTC options).
    let config = coil_ir::config::current();
    (units.par_iter())
        .map(|m| {
            let names: Vec<&str> = m.kernels.iter().map(|k| k.name.as_str()).collect();
            coil_ir::config::with_config(config.clone(), || {
                compiler::load_or_build(device, &m.source, m.language, &names, cache_dir)
            })
        })
        .collect()
}

/// The grid of generated kernel `kernel` at the instance's sizes: the launch's own, or for a
/// symbolic `xnumel` (`launch.grid` 0) [`Launch::grid_for`] of this instance's.
fn grid_at(launch: &Launch, inst: &Instance, kernel: usize) -> u32 {
    match launch.grid {
        0 => {
            let xnumel = inst.schedule.kernels[kernel].xnumel.const_value();
            launch.grid_for(xnumel.expect("an instance has constant extents"))
        }
        g => g,
    }
}

/// A generated kernel's parameter values (8 bytes each): its buffers' pointers, the values of
/// its size symbols (in `TileKernel::sizes` order), the key and first counter of each of its
/// random streams (`random`: [`plan::random_words`]), then the pointer to its 4 status words.
fn kernel_params(buffers: &[u64], sizes: &[i64], random: &[u64], status: u64) -> Vec<u64> {
    let mut values = buffers.to_vec();
    values.extend(sizes.iter().map(|&v| v as u64));
    values.extend_from_slice(random);
    values.push(status);
    values
}

/// Enqueues generated kernel `name` on the device's stream with [`kernel_params`] `params`.
///
/// # Safety
/// `func` must be a kernel of a module loaded on `dev` whose parameters `params` match; every
/// pointer in them must address live device memory of at least the bytes the kernel reaches
/// at these sizes, kept alive until the stream has run it.
unsafe fn launch_generated(
    dev: &CudaDevice,
    name: &str,
    func: sys::CUfunction,
    launch: &Launch,
    grid: u32,
    params: &mut [u64],
) -> Result<()> {
    let mut pointers: Vec<*mut c_void> = params.iter_mut().map(|v| (v as *mut u64).cast()).collect();
    dev.bind()?;
    if dev.target().programmatic_launch() && coil_ir::config::current().tuning.programmatic_launch {
        // SAFETY: as below; the kernel waits for the grid before it (`griddepcontrol.wait`)
        // before its first memory access.
        return unsafe { launch_dependent(dev, func, launch, grid, &mut pointers) }
            .map_err(|e| driver_error(&format!("cuLaunchKernelEx({name})"), e));
    }
    // SAFETY: the caller's contract; `pointers` and `params` outlive the call (the driver
    // copies the values).
    unsafe {
        drv::launch_kernel(
            func,
            (grid, 1, 1),
            (launch.block, 1, 1),
            launch.shared_bytes,
            dev.cu_stream(),
            &mut pointers,
        )
    }
    .map_err(|e| driver_error(&format!("cuLaunchKernel({name})"), e))
}

/// Enqueues `func` as a programmatic dependent of the work before it on the device's stream:
/// the launch may begin as soon as that kernel's blocks have all started (or it ends), so the
/// launch latency and the previous kernel's tail overlap. Generated kernels wait for the
/// previous grid's completion and writes (`griddepcontrol.wait`) before touching memory, so
/// the order of their memory accesses is the stream's.
///
/// # Safety
/// As [`launch_generated`]'s; `func` must execute `griddepcontrol.wait` before any access to
/// memory another kernel writes.
unsafe fn launch_dependent(
    dev: &CudaDevice,
    func: sys::CUfunction,
    launch: &Launch,
    grid: u32,
    pointers: &mut [*mut c_void],
) -> std::result::Result<(), drv::DriverError> {
    // SAFETY: a zeroed attribute is a valid value of the plain-data union.
    let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: launch.block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: launch.shared_bytes,
        hStream: dev.cu_stream(),
        attrs: &mut attribute,
        numAttrs: 1,
    };
    // SAFETY: the caller's contract; `config`, `attribute` and `pointers` outlive the call.
    unsafe { sys::cuLaunchKernelEx(&config, func, pointers.as_mut_ptr(), std::ptr::null_mut()) }.result()
}

/// The status words of `kernels` generated kernels (4 each) in `status`, copied to the host
/// (which waits for the stream).
fn status_words(dev: &CudaDevice, status: &DeviceMemory, kernels: usize) -> Result<Vec<i64>> {
    assert!(status.bytes() >= kernels * 32, "status words past the allocation");
    // SAFETY: the allocation holds `kernels * 32` bytes (checked above).
    let bytes = unsafe { memory::download(dev, status.ptr(), kernels * 32) }
        .map_err(|e| Error::runtime(format!("the CUDA graph failed: {e}")))?;
    Ok(bytes.chunks_exact(8).map(bytemuck::pod_read_unaligned).collect())
}

/// `n` events for timing the stream (CUDA events with timing on).
fn timing_events(dev: &CudaDevice, n: usize) -> Result<Vec<CudaEvent>> {
    let ctx = dev.context();
    (0..n)
        .map(|_| ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| driver_error("cuEventCreate", e))
}

/// Records `event` on the device's stream.
fn record(dev: &CudaDevice, event: &CudaEvent) -> Result<()> {
    event.record(dev.stream()).map_err(|e| driver_error("cuEventRecord", e))
}

/// Microseconds between two recorded events (waits for the later one).
fn elapsed_us(start: &CudaEvent, end: &CudaEvent) -> Result<f64> {
    let ms = start.elapsed_ms(end).map_err(|e| driver_error("cuEventElapsedTime", e))?;
    Ok(ms as f64 * 1000.0)
}

/// Device time between two points of a device's stream, from CUDA events: how a benchmark times
/// a sequence of compiled graphs (a training step) as `torch.cuda.Event` does.
pub struct StreamTimer {
    device: Arc<CudaDevice>,
    start: CudaEvent,
    end: CudaEvent,
}

impl StreamTimer {
    /// A timer on `device`'s stream (two CUDA events).
    pub fn new(device: &Arc<CudaDevice>) -> Result<StreamTimer> {
        let [start, end]: [CudaEvent; 2] = timing_events(device, 2)?.try_into().expect("two events");
        Ok(StreamTimer { device: device.clone(), start, end })
    }

    /// Marks the start on the stream (after the work enqueued so far).
    pub fn start(&self) -> Result<()> {
        record(&self.device, &self.start)
    }

    /// Marks the end on the stream and returns the microseconds since the start (waits for it).
    pub fn stop(&self) -> Result<f64> {
        record(&self.device, &self.end)?;
        elapsed_us(&self.start, &self.end)
    }
}
