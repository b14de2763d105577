//! The launch autotuner, opt-in (the configuration's `autotune`, `COIL_AUTOTUNE=1` in the
//! environment, or [`CudaCompiledGraph::with_autotune`]).
//!
//! Where the launch heuristic is unsure ([`launch::candidates`]: persistent reductions of rows
//! longer than a warp's, looped reductions), the first run of a compiled graph times a few
//! launch plans of each such kernel and keeps the fastest, for that run and every later one.
//!
//! * **When**: inside the first run, as the run reaches each kernel, so that its operands hold
//!   what the run's earlier kernels wrote: real data (an index buffer's indices are in
//!   bounds), never random bytes.
//! * **Building**: every candidate is emitted in the language the graph's kernel was compiled
//!   from (`emit_in`; a plan without a PTX form is dropped for a PTX kernel), so that a
//!   comparison is between launch plans, not compilers, and compiled through the
//!   kernel cache ([`compiler::load_or_build`]), all kernels' candidates in parallel before
//!   the run's first launch. The heuristic's plan is the graph's own kernel.
//! * **Timing**: each candidate runs on scratch copies of the launch's argument buffers
//!   (device-to-device copies of their bytes), so that a kernel that updates a buffer in place
//!   (`in_out_ptr`) never touches the run's own; an in-place operand is copied afresh before
//!   each launch, so that every launch sees the same values. [`WARMUP`] launches, then the
//!   median of [`REPS`], each between two CUDA events. A candidate that fails to build or to
//!   launch, or that reports an error in its status words, is discarded. The fastest wins
//!   unless it is within [`TIE`] of the heuristic's plan, which then stays.
//! * **Cache**: the choice goes to `<cache dir>/autotune/<key>.choice.entry` ([`choice_key`]:
//!   the heuristic's source, the architecture, the GPU's name and the kernel's size values), a
//!   verified cache entry ([`crate::cache_entry`]: key and checksum checked, an invalid one
//!   logged and timed again) whose payload's first line is the chosen [`Tuning`] (`heuristic`,
//!   `looped_threads=512`, ...), then a comment with the timings. A later process finds it and
//!   loads the chosen variant without timing; a cached choice that is no longer a candidate is
//!   timed again.
//!
//! Not tuned: kernels without alternatives, and kernels whose launch is not the heuristic's
//! (the environment's tuning knobs are set, and win; a hand-written module). A kernel of
//! dynamic shapes is tuned at its first run's sizes, and that choice serves every later size.
//! The candidates' compiles happen in the first run, not in [`CudaCompiledGraph::new`]
//! (`compile_seconds` leaves them out). Choices are logged on `COIL_LOGS=schedule` and listed by
//! [`CudaCompiledGraph::autotune_choices`].

use super::*;
use crate::cache_entry::{self, Kind};
use coil_codegen::cuda::{emit_cuda_with, emit_for_device_with, launch, GpuTarget, Tuning};
use std::sync::MutexGuard;

/// Untimed launches of each candidate before its timed ones (instruction cache, clocks).
pub const WARMUP: usize = 2;
/// Timed launches of each candidate; the median counts.
pub const REPS: usize = 10;
/// A candidate must beat the heuristic's plan by more than this fraction to replace it: a
/// smaller difference is within the noise of [`REPS`] launches.
pub const TIE: f64 = 0.02;

/// Bumped when the key or the file's meaning changes, so stale choices are never read.
const CHOICE_FORMAT: &str = "coil-autotune-v3";

/// What the autotuner chose for one kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct AutotuneChoice {
    /// The kernel, as in the schedule.
    pub kernel: String,
    /// The plan it launches with (`Tuning::default()`: the heuristic's).
    pub tuning: Tuning,
    /// True when the choice came from the disk cache (nothing was timed).
    pub cached: bool,
    /// Each candidate timed, heuristic first, with its median device time per launch in
    /// microseconds (`None`: discarded); empty for a cached choice.
    pub timings: Vec<(Tuning, Option<f64>)>,
}

/// The cache key of a kernel's choice: a 128-bit FNV-1a hash of the heuristic's source (a
/// whole translation unit: the kernel, and so every size it was generated for), the
/// architecture, the GPU's name (GPUs of one architecture differ in SMs and bandwidth) and the
/// values of the kernel's size symbols at the run that tuned it (empty for static kernels).
pub fn choice_key(source: &str, arch: &str, device_name: &str, sizes: &[i64]) -> String {
    let sizes: Vec<String> = sizes.iter().map(i64::to_string).collect();
    cache_entry::key(&[CHOICE_FORMAT, arch, device_name, &sizes.join(","), source])
}

/// `<cache dir>/autotune/<key>.choice.entry`.
pub fn choice_path(cache_dir: &Path, key: &str) -> PathBuf {
    cache_entry::path(&cache_dir.join("autotune"), key, Kind::Choice)
}

/// The choice cached under `key`, if a valid entry is there and its first line names a
/// tuning; an invalid entry (or one that names none) is logged, and the kernel is timed again.
pub fn read_choice(cache_dir: &Path, key: &str) -> Option<Tuning> {
    cache_entry::read_choice(&cache_dir.join("autotune"), key, |line| line.parse().ok())
}

/// Caches `tuning` under `key`, with `note` (the timings, for people) as a comment line.
pub fn write_choice(cache_dir: &Path, key: &str, tuning: &Tuning, note: &str) -> Result<()> {
    cache_entry::write_choice(&cache_dir.join("autotune"), key, &tuning.to_string(), note)
}

/// `tile` under `tuning` in `language` where it has that form (PTX: where the PTX emitter
/// covers the plan; the caller drops a candidate that came back in the other language).
pub(super) fn emit_in(
    language: Language,
    tile: &TileKernel,
    target: &GpuTarget,
    tuning: &Tuning,
) -> Result<CudaModule> {
    match language {
        Language::CudaC => emit_cuda_with(std::slice::from_ref(tile), tuning, target),
        Language::Ptx { .. } => Ok(emit_for_device_with(tile, target, tuning)?.0),
    }
}

/// Prints `text` on the `schedule` log channel: the choices belong with the launches.
fn log(text: &str) {
    super::schedule_log(&format!("autotune: {text}"));
}

/// A loaded kernel variant.
#[derive(Debug)]
struct Variant {
    func: sys::CUfunction,
    launch: Launch,
    /// Keeps `func`'s module loaded (`None`: the graph's own kernel, kept by the graph).
    _module: Option<Arc<LoadedModule>>,
}

/// The autotuner's result: a variant per launch step where it replaced the graph's kernel.
#[derive(Debug)]
pub(super) struct Tuned {
    /// Per step of the graph (`None`: the graph's own kernel).
    variants: Vec<Option<Variant>>,
    /// What it chose, in launch order.
    pub choices: Vec<AutotuneChoice>,
}

impl Tuned {
    /// The function and launch that replace step `step`'s, if any.
    pub fn variant(&self, step: usize) -> Option<(sys::CUfunction, Launch)> {
        self.variants[step].as_ref().map(|v| (v.func, v.launch))
    }
}

/// What the tuning run does at one step.
enum Pick {
    /// Time the candidates (heuristic first, then the others, each built or why not) and
    /// cache the winner under `key`.
    Time { key: String, candidates: Vec<(Tuning, std::result::Result<Variant, String>)> },
    /// Launch this cached choice (`None` for the variant: the graph's own kernel).
    Cached(Tuning, Option<Variant>),
}

/// The run that tunes: prepared before its first launch, consulted at each generated kernel
/// ([`Tuner::choose`]), then stored in the graph ([`Tuner::finish`]).
pub(super) struct Tuner<'g> {
    graph: &'g CudaCompiledGraph,
    /// Held until [`Tuner::finish`]: a run started meanwhile waits for the choices.
    _lock: MutexGuard<'g, ()>,
    /// Per step: what to do there (`None`: launch the graph's kernel).
    picks: Vec<Option<Pick>>,
    variants: Vec<Option<Variant>>,
    choices: Vec<AutotuneChoice>,
    /// Some kernel's heuristic plan failed in its timing: the choices are not kept.
    retry: bool,
}

impl CudaCompiledGraph {
    /// The tuner of this run when it is the first with the autotuner on (`None` otherwise, or
    /// when another run tuned meanwhile): reads cached choices and builds the candidates of
    /// every kernel that has some, for the run's sizes (`inst`).
    pub(super) fn begin_autotune(&self, inst: &Instance) -> Result<Option<Tuner<'_>>> {
        if !self.autotune || self.tuned.get().is_some() {
            return Ok(None);
        }
        coil_ir::config::with_config(self.config.clone(), || self.begin_autotune_configured(inst))
    }

    /// [`CudaCompiledGraph::begin_autotune`] under the graph's configuration.
    fn begin_autotune_configured(&self, inst: &Instance) -> Result<Option<Tuner<'_>>> {
        let lock = self.tuning.lock().unwrap_or_else(|e| e.into_inner());
        if self.tuned.get().is_some() {
            return Ok(None);
        }
        let mut picks: Vec<Option<Pick>> = (0..self.steps.len()).map(|_| None).collect();
        let knobs = Tuning::configured();
        if !knobs.is_heuristic() {
            log(&format!("the configuration's tuning overrides ({knobs}) are set and win: nothing is tuned"));
            let variants = (0..self.steps.len()).map(|_| None).collect();
            return Ok(Some(Tuner { graph: self, _lock: lock, picks, variants, choices: Vec::new(), retry: false }));
        }
        // Per kernel to tune: its step, its key, the tunings to build (besides the heuristic's,
        // the graph's own kernel), and whether they are a cached choice (then only it).
        let mut todo: Vec<(usize, String, Vec<Tuning>, bool, Language)> = Vec::new();
        for (i, step) in self.steps.iter().enumerate() {
            let Step::Generated { name, launch, kernel, language, .. } = step else { continue };
            let tile = self.tiles[*kernel].as_ref().expect("a generated kernel");
            let tunings = launch::candidates(tile, self.device.target());
            if tunings.len() < 2 || launch.block == 0 {
                continue;
            }
            let heuristic = emit_in(*language, tile, self.device.target(), &Tuning::default())?;
            if heuristic.kernels[0].launch != *launch {
                log(&format!("{name}: its launch is not the heuristic's, not tuned"));
                continue;
            }
            let sizes = &inst.kernel_sizes[*kernel];
            let key = choice_key(&heuristic.source, &self.device.arch(), self.device.name(), sizes);
            match read_choice(&self.cache_dir, &key).filter(|t| tunings.contains(t)) {
                Some(t) if t.is_heuristic() => picks[i] = Some(Pick::Cached(t, None)),
                Some(t) => todo.push((i, key, vec![t], true, heuristic.language)),
                None => todo.push((i, key, tunings[1..].to_vec(), false, heuristic.language)),
            }
        }
        // Every module to build, in `todo` order, built in parallel.
        let target = self.device.target();
        let emitted: Vec<Result<CudaModule>> = (todo.iter())
            .flat_map(|(i, _, want, _, language)| {
                let Step::Generated { kernel, .. } = &self.steps[*i] else { unreachable!("a kernel's step") };
                let tile = self.tiles[*kernel].as_ref().expect("a generated kernel");
                // A candidate in another language than the graph's kernel would compare compilers.
                let same = |m: &CudaModule| std::mem::discriminant(&m.language) == std::mem::discriminant(language);
                want.iter().map(move |t| {
                    let m = emit_in(*language, tile, target, t)?;
                    match same(&m) {
                        true => Ok(m),
                        false => Err(Error::unsupported(format!("{t} has no {language:?} form"))),
                    }
                })
            })
            .collect();
        let units: Vec<&CudaModule> = emitted.iter().filter_map(|m| m.as_ref().ok()).collect();
        let mut built = build_units(&self.device, &units, &self.cache_dir).into_iter();
        let mut variants = emitted.iter().map(|m| {
            let m = m.as_ref().map_err(|e| e.message.clone())?;
            let (module, _) = built.next().expect("one per unit").map_err(|e| e.message)?;
            self.variant(module, &m.kernels[0]).map_err(|e| e.message)
        });
        for (i, key, want, cached, _) in todo {
            let Step::Generated { name, func, launch, .. } = &self.steps[i] else { unreachable!("a kernel's step") };
            let mut candidates: Vec<(Tuning, std::result::Result<Variant, String>)> =
                want.into_iter().map(|t| (t, variants.next().expect("one per tuning"))).collect();
            picks[i] = Some(if cached {
                match candidates.pop().expect("the cached choice") {
                    (t, Ok(v)) => Pick::Cached(t, Some(v)),
                    (t, Err(e)) => {
                        log(&format!("{name}: the cached choice {t} failed to build ({e}); the heuristic's plan runs"));
                        Pick::Cached(Tuning::default(), None)
                    }
                }
            } else {
                let heuristic = Variant { func: *func, launch: *launch, _module: None };
                candidates.insert(0, (Tuning::default(), Ok(heuristic)));
                Pick::Time { key, candidates }
            });
        }
        let variants = (0..self.steps.len()).map(|_| None).collect();
        Ok(Some(Tuner { graph: self, _lock: lock, picks, variants, choices: Vec::new(), retry: false }))
    }

    /// A built candidate's kernel, ready to launch.
    fn variant(&self, module: Arc<LoadedModule>, kernel: &coil_codegen::cuda::CudaKernel) -> Result<Variant> {
        let func = module.function(&kernel.name)?;
        compiler::allow_dynamic_shared(&self.device, func, kernel.launch.shared_bytes)?;
        Ok(Variant { func, launch: kernel.launch, _module: Some(module) })
    }
}

impl Tuner<'_> {
    /// The function and launch step `step` runs with, in the run whose buffers are at `ptrs`:
    /// the graph's own, a cached choice, or the winner of the candidates timed now (which is
    /// cached).
    pub fn choose(&mut self, step: usize, inst: &Instance, ptrs: &[u64]) -> Result<(sys::CUfunction, Launch)> {
        let g = self.graph;
        let Step::Generated { name, func, launch, .. } = &g.steps[step] else {
            unreachable!("called at generated kernels")
        };
        let (tuning, variant, cached, timings) = match self.picks[step].take() {
            None => return Ok((*func, *launch)),
            Some(Pick::Cached(t, v)) => (t, v, true, vec![]),
            Some(Pick::Time { key, candidates }) => {
                let (times, infrastructure) = match self.time(step, inst, ptrs, &candidates) {
                    Ok(times) => (times, false),
                    // Out of memory for the scratch copies, say: the heuristic's plan runs (if the
                    // device is broken, the run's own launches say so), and nothing is retried.
                    Err(e) => {
                        log(&format!("{name}: not tuned: {e}"));
                        (vec![None; candidates.len()], true)
                    }
                };
                let timings: Vec<(Tuning, Option<f64>)> = candidates.iter().map(|(t, _)| *t).zip(times).collect();
                let note = format!("{name} on {} ({}): {}", g.device.arch(), g.device.name(), timings_text(&timings));
                let won = winner(&timings);
                let tuning = timings[won.unwrap_or(0)].0;
                log(&format!("{note} -> {tuning}"));
                if won.is_some() {
                    if let Err(e) = write_choice(&g.cache_dir, &key, &tuning, &note) {
                        log(&format!("{name}: the choice is not cached: {e}"));
                    }
                } else if !infrastructure {
                    // The heuristic's plan failed on this run's data (an index out of bounds,
                    // which the run reports): nothing is cached, and the next run tunes again.
                    self.retry = true;
                }
                let (_, variant) = candidates.into_iter().nth(won.unwrap_or(0)).expect("a candidate");
                (tuning, variant.ok().filter(|_| !tuning.is_heuristic()), false, timings)
            }
        };
        if cached {
            log(&format!("{name}: {tuning} (cached)"));
        }
        let chosen = variant.as_ref().map_or((*func, *launch), |v| (v.func, v.launch));
        self.variants[step] = variant;
        self.choices.push(AutotuneChoice { kernel: name.clone(), tuning, cached, timings });
        Ok(chosen)
    }

    /// The median device time per launch of each candidate of step `step`, in microseconds,
    /// on scratch copies of its arguments (`None`: discarded: it failed to build, to launch, or
    /// reported an error in its status words).
    fn time(
        &self,
        step: usize,
        inst: &Instance,
        ptrs: &[u64],
        candidates: &[(Tuning, std::result::Result<Variant, String>)],
    ) -> Result<Vec<Option<f64>>> {
        let g = self.graph;
        let dev = &g.device;
        let Step::Generated { name, kernel, .. } = &g.steps[step] else { unreachable!("a kernel's step") };
        let tile = g.tiles[*kernel].as_ref().expect("a generated kernel");
        // (scratch, the run's buffer, bytes, copied afresh before each launch)
        let mut scratch = Vec::with_capacity(tile.args.len());
        for a in &tile.args {
            let bytes = inst.program.buffer(a.buffer).meta.nbytes();
            let mem = DeviceMemory::alloc(dev, bytes)?;
            let real = ptrs[a.buffer.0];
            // SAFETY: both allocations hold the buffer's bytes at this run's sizes, and are
            // distinct (the scratch one is new).
            unsafe { memory::copy_device(dev, mem.ptr(), real, bytes)? };
            scratch.push((mem, real, bytes, a.read && a.written));
        }
        let buffers: Vec<u64> = scratch.iter().map(|(m, ..)| m.ptr()).collect();
        let events = timing_events(dev, 2 * REPS)?;
        let mut medians = Vec::with_capacity(candidates.len());
        for (tuning, variant) in candidates {
            let v = match variant {
                Ok(v) => v,
                Err(e) => {
                    log(&format!("{name} with {tuning}: discarded, it did not build: {e}"));
                    medians.push(None);
                    continue;
                }
            };
            let status = DeviceMemory::alloc(dev, 32)?;
            status.zero(32)?;
            // Random numbers from key 0: what they are does not change the time.
            let random = vec![0u64; 2 * tile.random.len()];
            let mut params = kernel_params(&buffers, &inst.kernel_sizes[*kernel], &random, status.ptr());
            let grid = grid_at(&v.launch, inst, *kernel);
            let mut launched = Ok(());
            for rep in 0..WARMUP + REPS {
                for (mem, real, bytes, _) in scratch.iter().filter(|s| s.3) {
                    // SAFETY: as above.
                    unsafe { memory::copy_device(dev, mem.ptr(), *real, *bytes)? };
                }
                let timed = rep.checked_sub(WARMUP).map(|r| (&events[2 * r], &events[2 * r + 1]));
                if let Some((start, _)) = timed {
                    record(dev, start)?;
                }
                // SAFETY: `v` is this kernel generated for another plan: the same parameters;
                // every pointer is a scratch copy of the buffer's full size at these sizes (or
                // this candidate's status words), alive until after the status is read below.
                launched = unsafe { launch_generated(dev, name, v.func, &v.launch, grid, &mut params) };
                if launched.is_err() {
                    break;
                }
                if let Some((_, end)) = timed {
                    record(dev, end)?;
                }
            }
            let checked = launched
                .and_then(|()| check_status(&LaunchName::plain(name.as_str()), &status_words(dev, &status, 1)?));
            if let Err(e) = checked {
                log(&format!("{name} with {tuning}: discarded: {e}"));
                medians.push(None);
                continue;
            }
            let mut times =
                (0..REPS).map(|r| elapsed_us(&events[2 * r], &events[2 * r + 1])).collect::<Result<Vec<f64>>>()?;
            medians.push(Some(crate::plan::median(&mut times)));
        }
        Ok(medians)
    }

    /// Stores the choices in the graph: later runs launch them (unless the next run is to
    /// tune again).
    pub fn finish(self) {
        let Tuner { graph, variants, choices, retry, .. } = self;
        if !retry {
            let _ = graph.tuned.set(Tuned { variants, choices });
        }
    }
}

/// The index of the candidate to keep given their times (heuristic first): the fastest,
/// unless it is within [`TIE`] of the heuristic's, which then stays; `None` when the
/// heuristic's plan itself failed (the run's own launch will report why).
pub fn winner(timings: &[(Tuning, Option<f64>)]) -> Option<usize> {
    timings.first()?.1?;
    fastest(&timings.iter().map(|(_, t)| *t).collect::<Vec<_>>())
}

/// The index of the fastest of `times` (microseconds, `None`: failed), the first (the
/// heuristic's) unless another beats it by more than [`TIE`]; `None` when all failed. The
/// launch autotuner and the GEMM algorithm choice (`blas_choice`) both keep this way.
pub fn fastest(times: &[Option<f64>]) -> Option<usize> {
    let (best, t) =
        times.iter().enumerate().filter_map(|(i, t)| Some((i, (*t)?))).min_by(|a, b| a.1.total_cmp(&b.1))?;
    match times.first().copied().flatten() {
        Some(first) if t >= first * (1.0 - TIE) => Some(0),
        _ => Some(best),
    }
}

/// `heuristic 12.3 us, looped_threads=512 11.0 us, looped_threads=1024 failed`.
fn timings_text(timings: &[(Tuning, Option<f64>)]) -> String {
    let each = timings.iter().map(|(t, us)| match us {
        Some(us) => format!("{t} {us:.1} us"),
        None => format!("{t} failed"),
    });
    format!("median of {REPS} launches: {}", each.collect::<Vec<_>>().join(", "))
}
