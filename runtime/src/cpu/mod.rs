//! The CPU backend: runs a compiled graph.
//!
//! A [`CompiledGraph`] holds a lowered program ([`LoopProgram`]), its [`Schedule`], and the
//! shared object built from the C translation unit the code generator emitted for it (compiled
//! and cached by [`compiler`], loaded by [`module`]). Running it:
//!
//! 1. checks the inputs against the program's inputs and, when the program has size symbols
//!    (dynamic shapes), binds them from the input shapes and takes the program at those sizes
//!    (made once per set of sizes, then cached: `plan::Instances`);
//! 2. allocates the outputs, and one allocation per [`MemoryPlan`](coil_ir::kernel::MemoryPlan)
//!    slot for the temporaries (buffers whose lives do not overlap share a slot), at those sizes;
//! 3. launches the kernels in schedule order: generated kernels through their C entry point
//!    (with the values of the size symbols they read: one compiled kernel serves every size;
//!    and the run's random streams they draw from: one compiled kernel serves every seed),
//!    `Bmm` through [`gemm`], the attention template through [`attention`], `argsort` through
//!    [`sort`], `cumsum` through [`scan`], `scatter` and `scatter_add` through [`scatter`] (in
//!    place over a base the memory plan kept in the output's memory), other fallback ops
//!    through the reference interpreter;
//! 4. returns the outputs in `program.outputs` order.
//!
//! [`eager`] is tier 0: a primitive graph run at once on prebuilt kernels, without a compile.
//!
//! Every buffer is seen as raw bytes here, as the generated code sees it: bool as one byte 0/1,
//! f16/bf16 as their 16 bits.

pub mod attention;
pub mod attention_backward;
mod attention_backward_block;
mod attention_block;
pub mod attention_dropout;
mod children;
pub mod compiler;
pub mod eager;
pub mod gemm;
pub mod gemm_packed;
pub mod jobs;
pub mod launch;
pub mod module;
pub mod native;
pub mod prebuilt;
pub mod scan;
pub mod scatter;
pub mod sort;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_dynamic;

pub use compiler::{c_compiler, default_cache_dir, CCompiler, CompiledObject};
pub use module::{Kernel, KernelLibrary};

/// Loads now what the CPU backend's first realizations would otherwise load then: tier 0's
/// math library and the packed matrix product (each built with the crate where it serves this
/// machine, else taken from the kernel cache or compiled once), and starts the thread pool
/// and the background compiles' thread ([`jobs::background_pool`]).
/// About a millisecond on the build machine, paid once per process either way; a program may
/// call it at start-up (as `import torch` loads PyTorch's kernels) so that its first
/// realizations do not wait for it. Nothing depends on it having run; a library that cannot be
/// loaded is reported by the realization that needs it, as without this call.
pub fn prepare() {
    let _ = eager::prepare();
    let _ = gemm_packed::Library::get(coil_codegen::templates::gemm_cpu::IsaCap::Native);
    rayon::broadcast(|_| ());
    let _ = jobs::background_pool();
}

use crate::plan::{
    check_status, extern_error, random_words, timing_streams, Instance, Instances, LaunchName, RunOutput, Step, Storage,
};
use crate::{interpret, Buffer, HostData};
use coil_codegen::templates::attention::MaskKind;
use coil_ir::kernel::{Schedule, TileKernel};
use coil_ir::loops::{BufferId, ExternCall, LoopKind, LoopProgram};
use coil_ir::sym::Expr;
use coil_ir::{DType, Error, Graph, RandomState, Result};
use std::path::{Path, PathBuf};

/// A graph compiled for the CPU, ready to run any number of times (also from several threads).
#[derive(Debug)]
pub struct CompiledGraph {
    program: LoopProgram,
    schedule: Schedule,
    /// One per schedule kernel: the tile kernel it was generated from (`None`: extern).
    tiles: Vec<Option<TileKernel>>,
    /// One per schedule kernel: the loaded kernel and the buffer of each argument, in argument
    /// order (`None`: extern).
    kernels: Vec<Option<(Kernel, Vec<BufferId>)>>,
    /// The launches, and the program at each run's sizes.
    instances: Instances,
    /// The compiled kernels; `None` when every kernel is extern (nothing to compile).
    object: Option<CompiledObject>,
}

impl CompiledGraph {
    /// Compiles `c_source` (through the cache in [`default_cache_dir`]) and prepares the
    /// launches. `kernels` has one entry per schedule kernel: the tile kernel it was generated
    /// from, `None` for an extern kernel. Fails if no C compiler exists (unless every kernel is
    /// extern), if the source does not compile, or if the pieces disagree.
    pub fn new(
        program: LoopProgram,
        schedule: Schedule,
        kernels: Vec<Option<TileKernel>>,
        c_source: &str,
    ) -> Result<CompiledGraph> {
        CompiledGraph::new_in(program, schedule, kernels, c_source, &default_cache_dir())
    }

    /// [`CompiledGraph::new`] with an explicit cache directory.
    pub fn new_in(
        program: LoopProgram,
        schedule: Schedule,
        kernels: Vec<Option<TileKernel>>,
        c_source: &str,
        cache_dir: &Path,
    ) -> Result<CompiledGraph> {
        let names: Vec<&str> = kernels.iter().flatten().map(|k| k.name.as_str()).collect();
        let built = if names.is_empty() {
            None
        } else {
            let compiler = c_compiler().ok_or_else(|| {
                Error::runtime("no C compiler found (tried $CC, cc, gcc, clang): cannot compile kernels for the CPU")
            })?;
            Some(module::load_or_build(compiler, c_source, cache_dir, &names)?)
        };
        CompiledGraph::assemble(program, schedule, kernels, built)
    }

    /// [`CompiledGraph::new_in`] without the C source: the kernels are the shared object of
    /// cache key `library` ([`CompiledGraph::library_key`] of the graph compiled before; `None`
    /// when every kernel is extern), loaded from `cache_dir` ([`module::load_cached`]).
    /// `Ok(None)` when the cache no longer holds it whole (the caller compiles the source).
    pub fn from_cache_in(
        program: LoopProgram,
        schedule: Schedule,
        kernels: Vec<Option<TileKernel>>,
        library: Option<&str>,
        cache_dir: &Path,
    ) -> Result<Option<CompiledGraph>> {
        let names: Vec<&str> = kernels.iter().flatten().map(|k| k.name.as_str()).collect();
        let built = match (library, names.is_empty()) {
            (None, true) => None,
            (Some(key), false) => match module::load_cached(key, cache_dir, &names) {
                Some(loaded) => Some(loaded),
                None => return Ok(None),
            },
            _ => {
                return Err(Error::runtime(
                    "inconsistent compiled graph: a library key without kernels, or kernels without one",
                ))
            }
        };
        CompiledGraph::assemble(program, schedule, kernels, built).map(Some)
    }

    /// The graph with its loaded kernels (`built`: `None` when every kernel is extern).
    fn assemble(
        program: LoopProgram,
        schedule: Schedule,
        kernels: Vec<Option<TileKernel>>,
        built: Option<(KernelLibrary, CompiledObject)>,
    ) -> Result<CompiledGraph> {
        let bad = |msg: String| Error::runtime(format!("inconsistent compiled graph: {msg}"));
        let instances = Instances::new(&program, &schedule, &kernels).map_err(bad)?;
        let (library, object) = built.unzip();
        let loaded = kernels
            .iter()
            .map(|tile| {
                let Some(tile) = tile else { return Ok(None) };
                let kernel = library.as_ref().expect("compiled when any kernel is generated").kernel(&tile.name)?;
                Ok(Some((kernel, tile.args.iter().map(|a| a.buffer).collect())))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CompiledGraph { program, schedule, tiles: kernels, kernels: loaded, instances, object })
    }

    /// The program it runs (with its size symbols, if any).
    pub fn program(&self) -> &LoopProgram {
        &self.program
    }

    /// Its schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Seconds the C compiler ran to build it (0 when the cache had it or nothing was compiled).
    pub fn compile_seconds(&self) -> f64 {
        self.object.as_ref().map_or(0.0, |o| o.compile_seconds)
    }

    /// True when the shared object came from the disk cache.
    pub fn cache_hit(&self) -> bool {
        self.object.as_ref().is_some_and(|o| o.cache_hit)
    }

    /// Why the shared object's cache entry was not used and the kernels were compiled again
    /// (the entry was damaged, another key's, or did not load; also logged on stderr).
    pub fn cache_rebuilt_because(&self) -> Option<&str> {
        self.object.as_ref().and_then(|o| o.rebuilt_because.as_deref())
    }

    /// The shared object's cache entry (`None` when every kernel is extern).
    pub fn library_path(&self) -> Option<&Path> {
        self.object.as_ref().map(|o| o.path.as_path())
    }

    /// The cache key of its shared object (`None` when every kernel is extern): what
    /// [`CompiledGraph::from_cache_in`] loads it by.
    pub fn library_key(&self) -> Option<&str> {
        self.object.as_ref().map(|o| o.key.as_str())
    }

    /// The cached C source's path (`None` when every kernel is extern).
    pub fn source_path(&self) -> Option<PathBuf> {
        self.object.as_ref().map(|o| o.source_path.clone())
    }

    /// Runs the graph on `inputs` (matching the program's inputs: any sizes for which its size
    /// symbols bind, at least 2 each) and returns the outputs in `program.outputs` order, at the
    /// inputs' sizes. Data errors a kernel detects (an index out of bounds, an integer division
    /// by zero, ...) are errors naming the kernel. The run has no random streams:
    /// [`CompiledGraph::run_with`] runs programs that draw random numbers.
    ///
    /// An output the schedule writes over a donated input ([`coil_ir::kernel::MemoryPlan`]'s
    /// `donated`) is written there, so that input changes; here it is returned as a copy.
    pub fn run(&self, inputs: &[&Buffer]) -> Result<Vec<Buffer>> {
        self.run_with(inputs, &[])
    }

    /// [`CompiledGraph::run`] with the run's random streams: `random[s]` is where the program's
    /// stream `s` starts (key and first counter; see `coil_ir::philox`).
    pub fn run_with(&self, inputs: &[&Buffer], random: &[RandomState]) -> Result<Vec<Buffer>> {
        let outputs = self.run_donating(inputs, random)?;
        outputs.into_iter().map(|o| o.or_input(|k| Ok(inputs[k].clone()))).collect()
    }

    /// [`run_with`](Self::run_with), with each output written over a donated input returned as
    /// [`RunOutput::Donated`]: the caller's input buffer now holds it.
    ///
    /// The caller must not read a donated input's old elements afterwards, and nothing may
    /// read it while the graph runs: it is written through the pointer the caller lent.
    pub fn run_donating(&self, inputs: &[&Buffer], random: &[RandomState]) -> Result<Vec<RunOutput<Buffer>>> {
        self.run_timed(inputs, random, None)
    }

    /// Wall time of each launch (a generated kernel or an extern call, in launch order, named
    /// as in the schedule), in microseconds: the median over `reps` runs after `warmup`
    /// (`COIL_PROFILE=1`). Random numbers are drawn from key 0 (what they are does not change
    /// the time).
    pub fn profile(&self, inputs: &[&Buffer], warmup: usize, reps: usize) -> Result<Vec<(String, f64)>> {
        let random = timing_streams(self.program.random_streams());
        for _ in 0..warmup {
            self.run_donating(inputs, &random)?;
        }
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); self.instances.steps.len()];
        for _ in 0..reps.max(1) {
            let mut times = Vec::with_capacity(samples.len());
            self.run_timed(inputs, &random, Some(&mut times))?;
            for (sample, t) in samples.iter_mut().zip(times) {
                sample.push(t);
            }
        }
        let name = |step: &Step| match *step {
            Step::Kernel(i) => self.schedule.kernels[i].name.clone(),
            Step::Extern(node) => crate::plan::extern_name(&self.schedule, node),
        };
        Ok(self.instances.steps.iter().zip(samples).map(|(s, mut t)| (name(s), crate::plan::median(&mut t))).collect())
    }

    /// [`run_donating`](Self::run_donating), pushing each launch's wall time (microseconds) to
    /// `times` if given.
    fn run_timed(
        &self,
        inputs: &[&Buffer],
        random: &[RandomState],
        mut times: Option<&mut Vec<f64>>,
    ) -> Result<Vec<RunOutput<Buffer>>> {
        let inst = self.check_inputs(inputs)?;
        let p = &inst.program;
        let mut outputs: Vec<Option<HostData>> = (0..p.buffers.len())
            .map(|i| {
                let meta = &p.buffers[i].meta;
                (inst.storage[i] == Storage::Output).then(|| HostData::for_output(meta.dtype, meta.numel())).transpose()
            })
            .collect::<Result<_>>()?;
        // 8-byte words (every dtype's alignment divides 8), from the host cache: temporaries are
        // written before they are read.
        // One allocation for them: slots never in use together share addresses.
        let mut arena = HostData::for_output(DType::I64, inst.arena.bytes.div_ceil(8))?;
        let arena_start = arena.as_mut_ptr();
        // The pointers are taken once, after every allocation: nothing reallocates while they
        // are in use. Inputs are only ever read through theirs (checked in `new_in`).
        let ptrs: Vec<*mut u8> = (0..p.buffers.len())
            .map(|i| match inst.storage[i] {
                // A donated input is written through the pointer the caller lent
                // (`run_donating`'s contract).
                Storage::Input(k) | Storage::Donated(k) => inputs[k].data.as_ptr() as *mut u8,
                Storage::Output => outputs[i].as_mut().expect("allocated above").as_mut_ptr(),
                Storage::InOutput(o) => outputs[o.0].as_mut().expect("allocated above").as_mut_ptr(),
                // SAFETY: the offset and the slot's bytes lie within the arena (`MemoryPlan::arena`).
                Storage::Slot(s) => unsafe { arena_start.add(inst.arena.offsets[s]) },
                Storage::Unused => std::ptr::null_mut(),
            })
            .collect();
        for &step in &self.instances.steps {
            let start = std::time::Instant::now();
            match step {
                Step::Kernel(i) => {
                    for (out, base) in crate::plan::scatter_bases(p, &inst.schedule.kernels[i]) {
                        if ptrs[out.0] != ptrs[base.0] {
                            // SAFETY: both address at least the (equal) size of the buffers, in
                            // distinct allocations or slots (`check_launches`).
                            unsafe {
                                std::ptr::copy_nonoverlapping(ptrs[base.0], ptrs[out.0], p.buffer(out).meta.nbytes())
                            }
                        }
                    }
                    let (kernel, buffers) = self.kernels[i].as_ref().expect("a generated kernel");
                    let tile = self.tiles[i].as_ref().expect("a generated kernel");
                    let words = random_words(tile, random)?;
                    // The buffers, then the values of the sizes the kernel reads and the words
                    // of its random streams (`coil_codegen::c`; `launch` adds the range).
                    let mut args: Vec<*mut u8> = buffers.iter().map(|b| ptrs[b.0]).collect();
                    args.push(inst.kernel_sizes[i].as_ptr() as *mut u8);
                    args.push(words.as_ptr() as *mut u8);
                    let (xnumel, rnumel) = extents(tile, &inst.kernel_sizes[i])?;
                    // SAFETY: each pointer addresses a live allocation of at least the buffer's
                    // size and dtype at this run's sizes, which the kernel is given.
                    let status = unsafe { launch::launch(kernel, &args, xnumel, rnumel) };
                    if status[0] != 0 {
                        check_status(&LaunchName::of(&self.program, &self.schedule, i), &status)?;
                    }
                }
                Step::Extern(node) => (self.run_extern(&inst, node, &ptrs, inputs, random))
                    .map_err(|e| extern_error(&self.program, node, e))?,
            }
            if let Some(times) = times.as_deref_mut() {
                times.push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
        crate::host_pool::give(arena);
        let mut result: Vec<RunOutput<Buffer>> = Vec::with_capacity(p.outputs.len());
        for (k, &o) in p.outputs.iter().enumerate() {
            let buf = match inst.storage[o.0] {
                Storage::Input(i) => inputs[i].clone(),
                Storage::Donated(i) => {
                    result.push(RunOutput::Donated(i));
                    continue;
                }
                _ => match outputs[o.0].take() {
                    Some(data) => Buffer::new(p.buffer(o).meta.shape.clone(), data)?,
                    // The same buffer returned twice: the earlier copy (never a donated one:
                    // a donated output is returned once).
                    None => match &result[p.outputs.iter().position(|&x| x == o).filter(|&j| j < k).expect("taken")] {
                        RunOutput::New(b) => b.clone(),
                        RunOutput::Donated(_) => unreachable!("a donated output is returned once"),
                    },
                },
            };
            result.push(RunOutput::New(buf));
        }
        Ok(result)
    }

    /// Checks the inputs and returns the instance at their sizes.
    fn check_inputs(&self, inputs: &[&Buffer]) -> Result<std::sync::Arc<Instance>> {
        let p = &self.program;
        if inputs.len() != p.inputs.len() {
            return Err(Error::value(format!(
                "the compiled graph takes {} inputs, got {}",
                p.inputs.len(),
                inputs.len()
            )));
        }
        for (k, buf) in inputs.iter().enumerate() {
            if buf.numel() != buf.shape.iter().product::<usize>() {
                return Err(Error::shape(format!("input {k}: {} elements for shape {:?}", buf.numel(), buf.shape)));
            }
        }
        let shapes: Vec<&[usize]> = inputs.iter().map(|b| b.shape.as_slice()).collect();
        let inst = self.instances.get(p, &self.schedule, &self.tiles, &shapes)?;
        for (k, (id, buf)) in p.inputs.iter().zip(inputs).enumerate() {
            let want = p.buffer(*id);
            if buf.dtype() != want.meta.dtype {
                return Err(Error::dtype(format!("input {k}: expected {}, got {}", want.type_text(), buf.meta())));
            }
        }
        Ok(inst)
    }

    /// Runs one extern node on the run's memory (an attention with dropout draws from the
    /// run's random streams `random`).
    fn run_extern(
        &self,
        inst: &Instance,
        node: usize,
        ptrs: &[*mut u8],
        inputs: &[&Buffer],
        random: &[RandomState],
    ) -> Result<()> {
        let p = &inst.program;
        let LoopKind::Extern { call, inputs: operands } = &p.nodes[node].kind else {
            unreachable!("checked in new_in")
        };
        let out_id = p.nodes[node].output;
        let bytes = |b: BufferId| p.buffer(b).meta.nbytes();
        // SAFETY (both): every buffer's pointer addresses at least its size in bytes; the
        // buffers a node writes overlap neither each other nor any operand (separate
        // allocations, or slots checked distinct), but a scatter's base, which no arm holds as
        // a slice while it holds the output; and each is borrowed mutably once.
        let written = |b: BufferId| unsafe { std::slice::from_raw_parts_mut(ptrs[b.0], bytes(b)) };
        let view = |b: BufferId| unsafe { std::slice::from_raw_parts(ptrs[b.0] as *const u8, bytes(b)) };
        match call {
            ExternCall::Bmm { a, b, bias, activation_grad, saved, .. } => {
                let spec = gemm::BmmSpec::from_call(call).expect("a bmm call of constant sizes");
                let bias = bias.as_ref().map_or(&[][..], |bias| view(bias.buffer));
                let out = written(out_id);
                let (dtype, out_dtype) = (p.buffer(a.buffer).meta.dtype, p.buffer(out_id).meta.dtype);
                match (activation_grad, saved) {
                    (Some(grad), _) => {
                        gemm::bmm_bytes_grad(&spec, dtype, view(a.buffer), view(b.buffer), view(grad.aux), out)
                    }
                    (None, Some(saved)) => {
                        let saved = written(*saved);
                        gemm::bmm_bytes_saving(&spec, dtype, view(a.buffer), view(b.buffer), bias, saved, out)
                    }
                    (None, None) => {
                        gemm::bmm_bytes_to(&spec, dtype, out_dtype, view(a.buffer), view(b.buffer), bias, out)
                    }
                }
            }
            ExternCall::Attention(attention_call) => {
                let coil_ir::loops::AttentionCall { q, k, v, lse, mask, mask_rule, .. } = &**attention_call;
                let mut spec = attention::AttentionSpec::from_call(call).expect("an attention call of constant sizes");
                spec.read_offset(mask_rule.as_ref().and_then(|r| r.offset).map(view))?;
                spec.dropout = attention_dropout::DropoutDraw::of(attention_call.dropout, random)?;
                let dtype = p.buffer(out_id).meta.dtype;
                let mask = match mask {
                    Some(m) => {
                        let kind = MaskKind::of(p.buffer(m.buffer).meta.dtype, dtype)?;
                        Some(attention::MaskBytes { bytes: view(m.buffer), kind })
                    }
                    None => None,
                };
                let (out, lse) = (written(out_id), lse.map(written));
                let (q, k, v) = (view(q.buffer), view(k.buffer), view(v.buffer));
                attention::attention_bytes(&spec, dtype, q, k, v, mask, out, lse)
            }
            ExternCall::AttentionBackward(backward) => {
                let coil_ir::loops::AttentionBackwardCall { q, k, v, grad_out, lse, out, dq, dk, dv, mask, .. } =
                    &**backward;
                let mut spec = attention_backward::AttentionBackwardSpec::from_call(call)
                    .expect("an attention backward call of constant sizes");
                spec.dropout = attention_dropout::DropoutDraw::of(backward.dropout, random)?;
                // Gradients may share a buffer (disjoint views of it): each is borrowed once.
                let mut grads = attention_backward::GradBuffers { buffers: Vec::new(), which: [None; 3] };
                let mut ids: Vec<BufferId> = Vec::new();
                for (i, g) in [dq, dk, dv].into_iter().enumerate() {
                    if let Some(g) = g {
                        let at = ids.iter().position(|&b| b == g.buffer).unwrap_or_else(|| {
                            ids.push(g.buffer);
                            grads.buffers.push(written(g.buffer));
                            ids.len() - 1
                        });
                        grads.which[i] = Some(at);
                    }
                }
                let bufs = attention_backward::BackwardBuffers {
                    q: view(q.buffer),
                    k: view(k.buffer),
                    v: view(v.buffer),
                    grad_out: view(grad_out.buffer),
                    lse: view(*lse),
                    out: view(out.buffer),
                    grads,
                    mask: match mask {
                        Some(m) => {
                            let kind = MaskKind::of(p.buffer(m.buffer).meta.dtype, p.buffer(q.buffer).meta.dtype)?;
                            Some(attention::MaskBytes { bytes: view(m.buffer), kind })
                        }
                        None => None,
                    },
                };
                attention_backward::attention_backward_bytes(&spec, p.buffer(q.buffer).meta.dtype, bufs)
            }
            ExternCall::Conv(conv) => {
                let dtype = p.buffer(out_id).meta.dtype;
                let y = crate::interp::conv::conv_bytes(conv, dtype, view(conv.a.buffer), view(conv.b.buffer))?;
                written(out_id).copy_from_slice(&y);
                Ok(())
            }
            ExternCall::Fallback { op: coil_ir::Op::Cumsum { dim } }
                if scan::supports_cumsum(&p.buffer(operands[0]).meta, &p.buffer(out_id).meta) =>
            {
                scan::cumsum_bytes(view(operands[0]), &p.buffer(operands[0]).meta, *dim, written(out_id))
            }
            ExternCall::Fallback { op: coil_ir::Op::Scatter { dim, reduce } }
                if scatter::supports_scatter(
                    &p.buffer(out_id).meta,
                    &p.buffer(operands[1]).meta,
                    &p.buffer(operands[2]).meta,
                    *reduce,
                ) && scatter::index_in_range(view(operands[1]), &p.buffer(out_id).meta, *dim) =>
            {
                // (An index out of range goes to the interpreter below, whose error names it.)
                let (base, index, src) = (operands[0], operands[1], operands[2]);
                if ptrs[base.0] != ptrs[out_id.0] {
                    // SAFETY: distinct buffers of the same meta (`check_launches`: an extern's
                    // output shares memory with no operand but a scatter's base).
                    unsafe { std::ptr::copy_nonoverlapping(ptrs[base.0], ptrs[out_id.0], bytes(out_id)) }
                }
                let meta = |b: BufferId| &p.buffer(b).meta;
                let out = written(out_id);
                scatter::scatter_bytes(out, meta(out_id), *dim, *reduce, view(index), meta(index), view(src), meta(src))
            }
            ExternCall::Fallback { op: coil_ir::Op::Argsort { dim, descending } } => {
                let meta = &p.buffer(operands[0]).meta;
                sort::argsort_bytes(view(operands[0]), meta, *dim, *descending, written(out_id))
            }
            ExternCall::Fallback { op } => {
                let mut g = Graph::new();
                let mut ids = Vec::new();
                let mut owned = Vec::new();
                for &b in operands {
                    ids.push(g.input(p.buffer(b).meta.clone()));
                    if !matches!(inst.storage[b.0], Storage::Input(_)) {
                        let meta = &p.buffer(b).meta;
                        owned.push((b, Buffer::new(meta.shape.clone(), HostData::from_bytes(meta.dtype, view(b))?)?));
                    }
                }
                let y = g.push(op.clone(), &ids, None)?;
                g.outputs.push(y);
                let args: Vec<&Buffer> = operands
                    .iter()
                    .map(|b| match inst.storage[b.0] {
                        Storage::Input(k) => inputs[k],
                        _ => &owned.iter().find(|(x, _)| x == b).expect("copied above").1,
                    })
                    .collect();
                let value = interpret(&g, &args)?.remove(0);
                if value.meta() != p.buffer(out_id).meta {
                    return Err(Error::runtime(format!(
                        "fallback {op} made {} for {}",
                        value.meta(),
                        p.buffer(out_id).meta
                    )));
                }
                written(out_id).copy_from_slice(&value.data.to_bytes());
                Ok(())
            }
        }
    }
}

/// A kernel's `xnumel` and `rnumel` (1 for a pointwise kernel) at a launch's values of its
/// size symbols (`tile.sizes`, in order).
fn extents(tile: &TileKernel, sizes: &[i64]) -> Result<(i64, i64)> {
    let lookup = |s: Expr| tile.sizes.iter().position(|&t| t == s).map(|k| sizes[k]);
    let eval = |e: Expr| {
        e.eval_with(lookup).map_err(|e| Error::runtime(format!("{}: cannot size the launch: {e:?}", tile.name)))
    };
    Ok((eval(tile.xnumel)?, tile.rnumel.map_or(Ok(1), eval)?))
}
