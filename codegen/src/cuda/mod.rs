//! CUDA C from the kernel IR, compiled at run time by NVRTC (see `docs/compiler.md`).
//!
//! A translation unit ([`emit_cuda`]) holds the [`prelude`] helpers its kernels use
//! ([`prelude_for`]) and one kernel per [`TileKernel`], in order (the frontend makes one unit
//! per kernel, compiled in parallel). Each generated kernel is
//! `extern "C" __global__ void NAME(<one typed pointer per TileKernel arg, in order>,
//! <one long long per TileKernel size, in order>, <two unsigned long long per TileKernel random
//! stream, its key and first counter: seed0, offset0, ...>, long long *status)`
//! (`int64_t` is a typedef of `long long`; read-only buffers are `const`; a static kernel has
//! no sizes, a kernel that draws no random numbers no streams), launched with the [`Launch`] shape the generator chose. `status` has 4 words,
//! zeroed by the caller; it is set as in the C backend ([`crate::status`]), first error wins
//! (atomicCAS). The source depends on no CUDA header: f16/bf16 are 16-bit integers converted by
//! the prelude. Compile it without `--use_fast_math` (NaN tests are `x != x`, and division and
//! `expf` must be IEEE).
//!
//! Code shapes ([`launch::plan`] picks the numbers; [`Tuning`] overrides them: the
//! configuration's tuning overrides, or the runtime's autotuner through [`emit_cuda_with`]):
//! * **Pointwise**: a grid-stride loop over *groups* of `vec` consecutive `xindex` values per
//!   thread. In a full group, a load or store whose index is `xindex + c` with a suitably
//!   aligned offset is one vector access (16 bytes at most per piece, [`prelude`]'s
//!   `coil_load`/`coil_store`), all loads issued before the element loop; values the same for
//!   the whole group (constants, broadcast loads) are computed once. The last, partial group
//!   runs element by element. Buffer alignment is checked once at run time: a misaligned
//!   buffer only turns vector accesses into scalar ones.
//! * **Persistent reduction**: one warp per row (rows up to 256; several rows per block) or one
//!   block per row; each thread holds `chunks` groups of `vec` consecutive row elements in
//!   registers (compile-time-unrolled loops only). The body is split into passes as in the C
//!   backend; an `XR` value read by a later pass stays in a per-thread array, never reloaded.
//!   Each reduction folds into a per-thread accumulator, then `coil_reduce`: warp shuffles and,
//!   for several warps, a shared-memory stage. A row longer than one block holds
//!   ([`launch::BLOCK_ROW_MAX`], sm_90 and later) is split over a thread-block cluster
//!   (`__cluster_dims__`): each block reduces its share, and the blocks' results meet in
//!   distributed shared memory (`coil_reduce_cluster`); such rows stay on chip only where a
//!   looped kernel would read them twice and there are few rows per SM
//!   ([`launch::settle_row_kinds`]).
//! * **Looped reduction**: one block per row; each `RLoop` strides over the row's groups with
//!   vector loads where contiguous, into per-thread accumulators, then a block reduction. An
//!   online softmax pass folds each group into the thread's `(max, sum of exp)` pair at once
//!   (`coil_online_group`: the group's maximum, at most one rescale, independent
//!   exponentials); the pairs combine pairwise (`coil_online`) in warp shuffles of both
//!   halves, then the first warp folds the warps' pairs (`coil_reduce_costly`).
//! * **Column reduction** (either kind, when the rows run down memory, e.g. `x.sum(dim=0)`;
//!   [`launch::column_like`]): a block holds 32 consecutive outputs, one per lane, times up to
//!   32 threads along the reduced dim, so each warp load is 32 consecutive elements (a large
//!   persistent one: 64 outputs, two warps side by side, times 16 threads); the block stage goes
//!   through shared memory (`coil_reduce_col`). A large persistent one of a single pass
//!   ([`launch::single_pass`]) gives each thread 4 consecutive outputs instead (16 threads
//!   across, up to 64 along the reduced dim), loaded as one vector per reduced position into 4
//!   accumulators; the accumulators are staged in shared memory once (`coil_col_stage`), and
//!   the first 4 threads along the reduced dim fold one output each and run its row
//!   statements (`coil_col_fold`).
//!
//! Index arithmetic is 32-bit (`int`) in a kernel whose every index fits (decided from the static
//! sizes), else 64-bit; inside a group an index is written `e0 + c*i`, `e0` once per group.
//!
//! **Dynamic shapes**: a kernel compiled once for every size reads its size symbols
//! ([`TileKernel::sizes`]) as `int64_t` parameters named as the symbols, and its `xnumel`,
//! `rnumel` and indices are C expressions of them (64-bit arithmetic). Its block is fixed here;
//! its grid is [`Launch::grid_for`] of each run's `xnumel`. A vector access needs its offset
//! provably aligned for every size (`4096*x0 + r` is; `s0*x0 + r` is not and goes element by
//! element), a looped reduction's `vec` provably divides the row, and a pointwise kernel's
//! partial last group is guarded at run time (`xvec < xnumel / vec`). Persistent reductions
//! have constant rows (the scheduler makes symbolic rows looped).
//!
//! Accumulation: float sums and products of f16, bf16 and f32 accumulate in f32 (per thread,
//! then a tree across threads, whose error stays near pairwise summation's), f64 ones in f64,
//! integers in wrapping i64; max/min propagate NaN; argmax/argmin keep the first best index,
//! NaN counting as the best, through the shuffles too. Row values are stored by the row's
//! first thread. Out-of-range rows and row positions are never loaded, stored or reduced.
//!
//! The text is deterministic, and variables keep the tile IR's numbers (`tmpN`), so a kernel's
//! `.tile`, `.c` and `.cu` read side by side.

mod emit;
pub mod launch;
#[cfg(test)]
mod launch_tests;
/// The C backend's scalar ops (types, conversions, literals, unary and binary ops), compiled
/// once more here: the CUDA prelude defines every helper they call under the same name, so
/// both backends share one definition of each op's semantics.
/// (`crate::c` keeps its `ops` private; a `use` would need it `pub(crate)`.)
#[allow(dead_code)] // `binary_may_fail` serves the C backend's `simd` pragmas only
#[allow(clippy::duplicate_mod)]
#[path = "../c/ops.rs"]
mod ops;
/// CUDA C calls the CUDA math library (`expf`, ...), not the C prelude's vector math.
const PRELUDE_MATH: bool = false;
mod prelude;
pub mod ptx;
#[cfg(test)]
pub(crate) mod tests;

pub use coil_ir::target::{GpuTarget, TensorCores};
pub use launch::Tuning;
pub use prelude::{prelude, prelude_for};

use coil_ir::kernel::{flat_stmts, KernelKind, TileKernel, TileOp, TileStmt};
use coil_ir::{BinaryOp, Error, Result};

/// Launch shape of one kernel: a 1-D grid of 1-D blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Blocks, for a constant `xnumel`; 0 when `xnumel` is symbolic: the runtime takes
    /// [`Launch::grid_for`] of each run's value.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory, in bytes.
    pub shared_bytes: u32,
    /// Outputs (pointwise) or rows (reductions) one block covers in one grid-stride step: the
    /// grid is `ceil(xnumel / per_block)`.
    pub per_block: u32,
    /// At most this many blocks (0: no cap besides the hardware's): a looped reduction that
    /// reads its rows twice keeps few enough rows in flight that the second read hits L2.
    pub max_grid: u32,
    /// Blocks per thread-block cluster (1: none). The kernel declares it
    /// (`__cluster_dims__`), so a plain launch forms the clusters; `grid` is a multiple of it.
    pub cluster: u32,
}

/// One kernel of a [`CudaModule`].
#[derive(Clone, Debug, PartialEq)]
pub struct CudaKernel {
    /// The `extern "C"` name, as in the [`TileKernel`].
    pub name: String,
    /// How to launch it.
    pub launch: Launch,
}

/// What a [`CudaModule`]'s source is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    /// CUDA C, compiled by NVRTC.
    CudaC,
    /// PTX ([`ptx`]), assembled by the driver at optimization `level` (0-4: 1 for memory-bound
    /// row reductions whose loads the PTX already groups, 4 for the rest; `COIL_PTXAS_OPT` sets
    /// one level for all).
    Ptx {
        /// The driver assembler's optimization level.
        level: u32,
    },
}

/// A graph's CUDA source and how to launch each of its kernels.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaModule {
    /// One translation unit for NVRTC, or one PTX module.
    pub source: String,
    /// The kernels of `source`, in the order given.
    pub kernels: Vec<CudaKernel>,
    /// The language of `source`.
    pub language: Language,
}

/// One translation unit for `kernels`: the helpers of the [`prelude`] they use ([`prelude_for`]),
/// then each kernel, launched as on the default target ([`GpuTarget::h100`]: for reading
/// generated code without a GPU, and tests; [`emit_cuda_with`] takes the GPU's).
///
/// # Errors
/// `Unsupported` for an extern kernel, a persistent reduction with a symbolic row, a size symbol
/// whose name the generated code uses itself, and ops the interpreter rejects on their dtypes
/// (an integer result of true division or of a float-only function).
pub fn emit_cuda(kernels: &[TileKernel]) -> Result<CudaModule> {
    emit_cuda_with(kernels, &Tuning::configured(), &GpuTarget::h100())
}

/// [`emit_cuda`] for `target`, with the launch plans of `tuning` ([`launch::plan_with`]) in
/// place of the configuration's overrides: the runtime's autotuner builds its candidates
/// ([`launch::candidates`]) with it. Errors as [`emit_cuda`].
pub fn emit_cuda_with(kernels: &[TileKernel], tuning: &Tuning, target: &GpuTarget) -> Result<CudaModule> {
    let mut code = String::new();
    let mut out = Vec::new();
    for k in kernels {
        let (text, launch) = emit_one(k, tuning, target)?;
        code.push('\n');
        code.push_str(&text);
        out.push(CudaKernel { name: k.name.clone(), launch });
    }
    Ok(CudaModule { source: format!("{}{code}", prelude_for(&code)), kernels: out, language: Language::CudaC })
}

/// One kernel for the GPU `target`: as PTX where the [`ptx`] emitter covers it (a cold compile
/// skips NVRTC's front end and optimizer), else as CUDA C, with the reason it has no PTX form.
/// [`ptx_enabled`] false turns the PTX path off (to compare). Errors as [`emit_cuda`].
pub fn emit_for_device(kernel: &TileKernel, target: &GpuTarget) -> Result<(CudaModule, Option<ptx::Unsupported>)> {
    emit_for_device_with(kernel, target, &Tuning::configured())
}

/// [`emit_for_device`] with the launch plans of `tuning`: the runtime's autotuner builds its
/// candidates with it, so that they are in the language of the kernel they would replace.
pub fn emit_for_device_with(
    kernel: &TileKernel,
    target: &GpuTarget,
    tuning: &Tuning,
) -> Result<(CudaModule, Option<ptx::Unsupported>)> {
    let why = if ptx_enabled() {
        match ptx::emit_ptx(kernel, target, tuning) {
            Ok(module) => return Ok((module, None)),
            Err(why) => why,
        }
    } else {
        "COIL_CUDA_PTX=0".to_string()
    };
    Ok((emit_cuda_with(std::slice::from_ref(kernel), tuning, target)?, Some(why)))
}

/// Whether [`emit_for_device`] tries PTX first (`ptx` of the configuration's tuning;
/// `COIL_CUDA_PTX=0` turns it off).
pub fn ptx_enabled() -> bool {
    coil_ir::config::current().tuning.ptx
}

/// One kernel for `target` with the prelude before it: a complete translation unit, for dumps
/// (`kernels/<name>.cu`). Errors as [`emit_cuda`].
pub fn emit_cuda_kernel_source(kernel: &TileKernel, target: &GpuTarget) -> Result<String> {
    Ok(emit_cuda_with(std::slice::from_ref(kernel), &Tuning::configured(), target)?.source)
}

/// The text of one kernel (it needs the [`prelude`]) and its launch, for the default target
/// ([`GpuTarget::h100`]).
pub fn emit_cuda_kernel(kernel: &TileKernel) -> Result<(String, Launch)> {
    emit_one(kernel, &Tuning::configured(), &GpuTarget::h100())
}

fn emit_one(k: &TileKernel, tuning: &Tuning, target: &GpuTarget) -> Result<(String, Launch)> {
    validate(k)?;
    let plan = launch::plan_with(k, tuning, target);
    let mut g = emit::Gen::new(k, plan);
    g.kernel();
    Ok((g.out, plan.launch))
}

/// What every CUDA kernel must be (errors as [`emit_cuda`]).
fn validate(k: &TileKernel) -> Result<()> {
    let unsupported = |what: String| Err(Error::unsupported(format!("CUDA kernel {}: {what}", k.name)));
    if k.kind == KernelKind::Extern {
        return unsupported("an extern call has no generated code".into());
    }
    if k.kind != KernelKind::Pointwise && k.rnumel.is_none() {
        return unsupported("a reduction without rnumel".into());
    }
    if let Some(r) = k.rnumel.filter(|r| k.kind == KernelKind::PersistentReduction && r.const_value().is_none()) {
        return unsupported(format!("a persistent reduction needs a constant row, not {r}"));
    }
    if let Some(s) = k.sizes.iter().find(|s| s.as_symbol().is_none_or(|s| reserved(&s.name))) {
        return unsupported(format!("size symbol `{s}` is not a symbol of a free name"));
    }
    check_ops(k)
}

/// Whether the generated code declares a name of this form itself (a size parameter of that
/// name would clash with it).
fn reserved(name: &str) -> bool {
    const FIXED: [&str; 12] =
        ["xnumel", "rnumel", "xindex", "rindex", "xvec", "rchunk", "rlane", "i", "k", "status", "aligned", "int64_t"];
    const NUMBERED: [&str; 11] = ["tmp", "acc", "red", "w", "st", "smem", "ox", "in_ptr", "out_ptr", "seed", "offset"];
    let numbered =
        |p: &str| name.strip_prefix(p).is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()));
    FIXED.contains(&name)
        || NUMBERED.iter().any(|p| numbered(p))
        || name.starts_with("in_out_ptr")
        || name.to_ascii_lowercase().starts_with("coil_")
        || name.starts_with("__")
}

/// Rejects what the shared scalar ops would refuse (they panic: the IR is malformed).
fn check_ops(k: &TileKernel) -> Result<()> {
    for s in flat_stmts(&k.body) {
        let TileStmt::Let { dtype, op, var, .. } = s else { continue };
        let bad = match op {
            TileOp::Unary(u, _) => !dtype.is_float() && u.float_only(),
            TileOp::Binary(BinaryOp::Div, ..) => !dtype.is_float(),
            _ => false,
        };
        if bad {
            return Err(Error::unsupported(format!("CUDA kernel {}: tmp{var} is {dtype}, not a float", k.name)));
        }
    }
    Ok(())
}
