//! The packed matrix product: the `gemm_cpu` template ([`coil_codegen::templates::gemm_cpu`]),
//! built with the crate ([`prebuilt`]) or compiled once per process by the system C compiler
//! (through the kernel cache), and run on the rayon pool the generated kernels use. A second build capped at AVX2 ([`IsaCap::Avx2`],
//! `GemmEngine::PackedAvx2`) runs, on a machine with AVX-512, the kernels a CPU without it gets.
//!
//! One product (all its batches) is one run of [`jobs`] (the calling thread and the pool's
//! others take jobs in order from a shared counter, so a product starts at once and a late
//! thread only joins it): tasks of output tiles, runs of one batch's B panels against all its
//! A panels (or a part of them), each run the panels left over twice the threads, so that the
//! last tasks are single panels (halves of one, when A has many panels) and the threads end
//! together however late one started. A task packs its B panels a block at a time into a
//! workspace of its thread, unless B is packed whole (when A's panels are split among tasks:
//! few B panels, and each part would pack them again).
//!
//! Every distinct A matrix (a batch-broadcast A is packed once), and B when packed whole, is
//! packed in chunks of panels, each by the first task that reads it: the threads
//! share the packing, and a task waits only for chunks it reads that another is packing, not
//! for a packing step before all tiles.
//!
//! Packed A and B, the f32 partial sums (only when k is split into blocks) and the workspaces
//! are reused from call to call, so a product does not fault fresh pages in.

use super::compiler::{c_compiler, default_cache_dir};
use super::gemm::BmmSpec;
use super::jobs;
use super::module::{self, Kernel};
use super::prebuilt;
use coil_codegen::templates::gemm_cpu::{self as template, Blocking, ComputeArgs, IsaCap, Layout, PackArgs};
use coil_ir::loops::{Activation, StridedOperand};
use coil_ir::{DType, Error, Result};
use half::{bf16, f16};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_FLOPS: usize = 1 << 18;

/// Tasks per pool thread of a parallel product: a thread the OS preempts holds back a small
/// share, not half the product.
const TASKS_PER_THREAD: usize = 4;

/// Fewest multiply-adds per task (about 10 us of one core): smaller ones cost more to hand out
/// than they save.
const TASK_FLOPS: usize = 1 << 21;

/// The compiled template.
pub struct Library {
    pack: Kernel,
    compute: Kernel,
    /// [`Layout::feature_bit`]s this build and CPU serve.
    features: i64,
}

impl Library {
    /// The process's library built with at most `cap`'s instructions: the one built with the
    /// crate where it serves this machine ([`prebuilt`], native builds only), else compiled (or
    /// taken from the cache) on first use. `None` without either, or when the compiler fails
    /// (said once on stderr).
    pub fn get(cap: IsaCap) -> Option<&'static Library> {
        static NATIVE: OnceLock<Option<Library>> = OnceLock::new();
        static AVX2: OnceLock<Option<Library>> = OnceLock::new();
        let library = match cap {
            IsaCap::Native => &NATIVE,
            IsaCap::Avx2 => &AVX2,
        };
        library
            .get_or_init(|| {
                let names = [template::FEATURES_KERNEL, template::PACK_KERNEL, template::COMPUTE_KERNEL];
                let (source, cache_dir) = (template::source(cap), default_cache_dir());
                let prebuilt = (cap == IsaCap::Native).then(|| prebuilt::load(&source, &cache_dir)).flatten();
                let library = match prebuilt {
                    Some(lib) => Ok(lib),
                    None => module::load_or_build(c_compiler()?, &source, &cache_dir, &names).map(|(lib, _)| lib),
                };
                let loaded =
                    library.and_then(|lib| Ok((lib.kernel(names[0])?, lib.kernel(names[1])?, lib.kernel(names[2])?)));
                let (features_kernel, pack, compute) =
                    loaded.inspect_err(|e| eprintln!("coil: matrix products use the gemm crate: {e}")).ok()?;
                let mut features = 0i64;
                // SAFETY: the features entry point writes one int64_t at args[0].
                unsafe { features_kernel.call(&[&mut features as *mut i64 as *mut u8], &mut [0; 4]) };
                Some(Library { pack, compute, features })
            })
            .as_ref()
    }

    /// Whether this build serves `layout` on this CPU (and, for AMX, this process: the kernel
    /// granted the tile data).
    pub fn serves(&self, layout: Layout) -> bool {
        self.features & layout.feature_bit() != 0
    }

    /// The layout products of `dtype` use here, if the library serves one: AMX tiles for bf16
    /// where the CPU and kernel give them, else bf16 pairs where the CPU has AVX512-BF16, f32
    /// (AVX-512, else AVX2) for f32, f16 and other bf16.
    pub fn layout_for(&self, dtype: DType) -> Option<Layout> {
        let has = |l: Layout| self.serves(l);
        match dtype {
            DType::BF16 if has(Layout::Bf16Amx) => Some(Layout::Bf16Amx),
            DType::BF16 if has(Layout::Bf16Pairs) => Some(Layout::Bf16Pairs),
            DType::F32 | DType::F16 | DType::BF16 if has(Layout::F32) => Some(Layout::F32),
            DType::F32 | DType::F16 | DType::BF16 if has(Layout::F32Avx2) => Some(Layout::F32Avx2),
            _ => None,
        }
    }
}

/// Rows or columns below which an f32 product is better left to the `gemm` crate: its
/// matrix-vector kernels read the large operand once, where packing reads and writes it first
/// (`examples/gemm_bench.rs --shape f32:1:4096:4096:nt`). Half types have no such path there
/// (the crate widens whole operands to f32), so they always take the packed one.
pub const SKINNY: usize = 8;

/// Whether an `m x n` f32 product is skinny ([`SKINNY`]).
pub fn skinny(m: usize, n: usize) -> bool {
    m < SKINNY || n < SKINNY
}

/// 16 bytes: reused buffers are vectors of these, allocated zeroed (`calloc`: fresh pages are
/// not written first) with room to start at a 64-byte boundary (packed panels are read with
/// aligned loads' speed).
type Chunk = [u32; 4];

/// Chunks of a buffer of `words` 32-bit words from a 64-byte boundary, rounded up to a power of
/// two so that products of growing sizes (eager code on new shapes) reuse a buffer for a while
/// rather than each faulting a new one in.
fn chunks_for(words: usize) -> usize {
    if words == 0 {
        0
    } else {
        (words.div_ceil(4) + 3).next_power_of_two()
    }
}

/// Buffers returned by finished products, for the next ones.
static POOL: Mutex<Vec<Vec<Chunk>>> = Mutex::new(Vec::new());

/// Most buffers [`POOL`] keeps.
const POOL_BUFFERS: usize = 4;

/// Most bytes [`POOL`] keeps (a larger product's buffers are freed after it).
const POOL_BYTES: usize = 256 << 20;

/// A buffer from [`POOL`] (the smallest that fits, else a new one), given back on drop.
struct Pooled(Vec<Chunk>);

impl Pooled {
    fn take(words: usize) -> Pooled {
        let chunks = chunks_for(words);
        if chunks == 0 {
            return Pooled(Vec::new());
        }
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let best = (0..pool.len()).filter(|&i| pool[i].len() >= chunks).min_by_key(|&i| pool[i].len());
        match best {
            Some(i) => Pooled(pool.swap_remove(i)),
            // Room for a product a little larger than this one: a pass over growing shapes then
            // reuses this buffer's mapped pages instead of faulting in fresh ones (its zeros
            // come from the allocator untouched, so the unused part costs no memory).
            None => Pooled(vec![[0; 4]; chunks.next_power_of_two()]),
        }
    }

    /// The buffer's first 64-byte boundary.
    fn ptr(&mut self) -> *mut u32 {
        aligned(&mut self.0)
    }
}

/// The first 64-byte boundary of `buffer` (at most 48 bytes in: [`chunks_for`] leaves room);
/// an empty buffer's dangling pointer, which nothing reads.
fn aligned(buffer: &mut [Chunk]) -> *mut u32 {
    let base = buffer.as_mut_ptr();
    let offset = base.align_offset(64).min(buffer.len());
    // SAFETY: within the buffer (or one past its end, when empty).
    unsafe { base.add(offset) as *mut u32 }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        pool.push(std::mem::take(&mut self.0));
        let bytes = |pool: &Vec<Vec<Chunk>>| pool.iter().map(|b| b.len() * 16).sum::<usize>();
        while pool.len() > POOL_BUFFERS || bytes(&pool) > POOL_BYTES {
            // over the count, keep the largest (they serve every product the small ones do);
            // over the bytes, free the largest
            let pick = (0..pool.len()).min_by_key(|&i| pool[i].len());
            let pick = if pool.len() > POOL_BUFFERS { pick } else { (0..pool.len()).max_by_key(|&i| pool[i].len()) };
            pool.swap_remove(pick.expect("not empty"));
        }
    }
}

thread_local! {
    /// This thread's B workspace.
    static WORKSPACE: RefCell<Vec<Chunk>> = const { RefCell::new(Vec::new()) };
}

/// One task's tiles: batch, A panels `[i0, i1)`, B panels `[j0, j1)`.
#[derive(Clone, Copy, Debug)]
struct Task {
    batch: usize,
    i0: usize,
    i1: usize,
    j0: usize,
    j1: usize,
}

/// The bytes a product reads: its operands and its bias row (empty without one).
#[derive(Clone, Copy, Debug)]
pub struct Operands<'a> {
    /// The left operand's buffer.
    pub a: &'a [u8],
    /// The right operand's buffer.
    pub b: &'a [u8],
    /// The bias row's buffer (empty without one).
    pub bias: &'a [u8],
}

/// `out = act(a @ b + bias)` for every batch with the template in `layout`, on the raw bytes of
/// operands and bias of `dtype` and an output of `out_dtype` (each f32, f16 or bf16: a half-type
/// product may be written as f32, its sums never rounded to the half type). The caller checked
/// `spec` against the buffers (`BmmSpec::check`).
///
/// Of the product's two orientations, `a @ b` and `(b^T a^T)^T` (the template then stores its
/// tiles transposed), the one whose A the micro-kernels read in place (`reads_in_place`)
/// where only one does; else (both or neither) the one whose B is the larger operand, unless
/// `n` is less than half of `m` (`b^T a^T` then): B is packed a block at a time as tasks read
/// it (once, into L2), tasks split B's panels among them, and a small B would leave too few
/// panels to split (so that A's are split and B packed whole first, a step of one thread).
///
/// Measured on 2 threads (`gemm_bench`, bf16 `[m, k] @ [n, k]^T`): making a linear layer's
/// larger operand A, read in place, and its input B, packed, ran 3-4% faster on one thread but
/// 2-4% slower at 410 x 896 x 3648 and 14% slower at 224 x 192 x 576 on two.
pub fn bmm(
    lib: &Library,
    layout: Layout,
    spec: &BmmSpec,
    (dtype, out_dtype): (DType, DType),
    ops: Operands,
    out: &mut [u8],
) -> Result<()> {
    let flip = |op: &StridedOperand<usize>| StridedOperand {
        row_stride: op.col_stride,
        col_stride: op.row_stride,
        ..op.clone()
    };
    let (a_flipped, b_flipped) = (flip(&spec.b), flip(&spec.a));
    let in_place = |op: &StridedOperand<usize>| reads_in_place(layout, dtype, spec.k, op);
    let swap = match (in_place(&spec.a), in_place(&a_flipped)) {
        (true, false) => false,
        (false, true) => true,
        _ => spec.m >= 2 * spec.n,
    };
    if !swap {
        return run(lib, layout, spec, (dtype, out_dtype), ops, out, false);
    }
    let swapped = BmmSpec { a: a_flipped, b: b_flipped, m: spec.n, n: spec.m, ..spec.clone() };
    run(lib, layout, &swapped, (dtype, out_dtype), Operands { a: ops.b, b: ops.a, ..ops }, out, true)
}

/// Whether the micro-kernels read `a` (the left operand of a product over `k`) in place: its
/// rows hold k contiguous elements of the layout's own type (with pairs, an even k, so that no
/// pair reaches past a row). Only a last panel of fewer than MR rows is packed then.
fn reads_in_place(layout: Layout, dtype: DType, k: usize, a: &StridedOperand<usize>) -> bool {
    k > 0
        && a.col_stride == 1
        && match layout {
            Layout::Bf16Pairs | Layout::Bf16Amx => dtype == DType::BF16 && k.is_multiple_of(2),
            Layout::F32 | Layout::F32Avx2 => dtype == DType::F32,
        }
}

/// [`bmm`] in one orientation: with `transposed`, `out` is the `n x m` transpose of the
/// product and the bias runs along `m`.
fn run(
    lib: &Library,
    layout: Layout,
    spec: &BmmSpec,
    (dtype, out_dtype): (DType, DType),
    ops: Operands,
    out: &mut [u8],
    transposed: bool,
) -> Result<()> {
    let Operands { a, b, bias } = ops;
    let unsupported = || Error::unsupported(format!("the packed matrix product of {dtype} into {out_dtype}"));
    let code = template::dtype_code(dtype).ok_or_else(unsupported)?;
    let out_code = template::dtype_code(out_dtype).ok_or_else(unsupported)?;
    let (m, n, k) = (spec.m, spec.n, spec.k);
    let batches = spec.batch_offsets();
    if batches.is_empty() || m == 0 || n == 0 {
        return Ok(());
    }
    let size = dtype.size_bytes();
    let (mr, nr) = layout.tile();
    let (mp, np) = (m.div_ceil(mr), n.div_ceil(nr));
    let blocking = Blocking::choose_for(layout, m, k);
    // The output's row length, and the bias's (one value per output column).
    let ldo = if transposed { m } else { n };
    let bias_row = spec.bias.map(|view| {
        let at = |j: usize| view.offset + view.stride * j;
        (0..ldo).map(|j| element_f32(dtype, bias, at(j))).collect::<Vec<f32>>()
    });

    // The distinct A and B matrices (one for a batch-broadcast operand) and which each batch
    // reads.
    let (a_offsets, a_index) = distinct(batches.iter().map(|&(ao, _)| ao));
    let (b_offsets, b_index) = distinct(batches.iter().map(|&(_, bo)| bo));
    let k_blocks = blocking.k_blocks(layout, k);
    let ldacc = np * nr;
    let acc_words = if k_blocks > 1 { mp * mr * ldacc } else { 0 };
    let mut acc = Pooled::take(acc_words * batches.len());

    let threads = rayon::current_num_threads();
    let flops = batches.len() * m * n * k;
    let parallel = threads > 1 && flops >= PARALLEL_FLOPS;
    let want = if parallel { (threads * TASKS_PER_THREAD).min(flops / TASK_FLOPS).max(threads) } else { 1 };
    let tm = a_parts(batches.len(), mp, np, want);
    // With A's panels split among tasks, B is packed whole before the tiles (else each part
    // would pack B's panels again).
    let prepack_b = tm > 1 && k > 0;
    let in_place_a = reads_in_place(layout, dtype, k, &spec.a);
    // read in place, A's packed panels are at most its last part panel
    let a_first = if in_place_a { mp - 1 } else { 0 };
    let a_words = match in_place_a {
        true if m % mr != 0 => layout.packed_words(mr, k, mr),
        true => 0,
        false => layout.packed_words(m, k, mr),
    };
    let b_words = if prepack_b { layout.packed_words(n, k, nr) } else { 0 };
    let mut packed_a = Pooled::take(a_words * a_offsets.len());
    let mut packed_b = Pooled::take(b_words * b_offsets.len());

    // Addresses as integers, so that the closures run on the pool (the buffers outlive them).
    let (a_base, b_base, out_base) = (a.as_ptr() as usize, b.as_ptr() as usize, out.as_mut_ptr() as usize);
    let (pa_base, pb_base, acc_base) = (packed_a.ptr() as usize, packed_b.ptr() as usize, acc.ptr() as usize);
    let bias_base = bias_row.as_ref().map_or(0, |r| r.as_ptr() as usize);
    let groups = k.div_ceil(layout.group());

    // 1. Packing: every distinct A (and B, when packed whole), in chunks of panels that the
    // tasks reading them pack (in parallel, on the parts' boundaries and panel by panel for B).
    let operands = [
        Packing { src: a_base, offsets: &a_offsets, rs: spec.a.row_stride, ks: spec.a.col_stride, rows: m, panel: mr },
        Packing { src: b_base, offsets: &b_offsets, rs: spec.b.col_stride, ks: spec.b.row_stride, rows: n, panel: nr },
    ];
    // where each operand's packed matrices lie: base, words per matrix, first panel
    let dsts = [(pa_base, a_words, a_first), (pb_base, b_words, 0)];
    let mut chunks = Chunks::default();
    for (operand, packing) in operands.iter().enumerate().take(if prepack_b { 2 } else { 1 }) {
        if k == 0 {
            break;
        }
        let panels = packing.rows.div_ceil(packing.panel);
        for matrix in 0..packing.offsets.len() {
            if operand == 0 && in_place_a {
                // only a last part panel
                chunks.push(operand, matrix, (m % mr != 0).then_some((mp - 1, mp)).into_iter());
                continue;
            }
            let count = match (parallel, operand) {
                (false, _) => 1,
                // A: enough chunks for the threads to share (tasks of every part need them
                // all first), on the parts' boundaries
                (true, 0) => panels.min(want.div_ceil(packing.offsets.len()).div_ceil(tm) * tm),
                // B packed whole: panel by panel, each packed by the first task that reads it
                (true, _) => panels,
            };
            chunks.push(operand, matrix, (0..count).map(|c| (panels * c / count, panels * (c + 1) / count)));
        }
    }
    let pack = |job: &PackJob| {
        let packing = &operands[job.operand];
        let (dst, words, first) = dsts[job.operand];
        let args = PackArgs {
            src: (packing.src + packing.offsets[job.matrix] * size) as *const c_void,
            rs: packing.rs as i64,
            ks: packing.ks as i64,
            rows: packing.rows as i64,
            k: k as i64,
            dtype: code,
            layout: layout.code(),
            panel: packing.panel as i64,
            lo: job.lo as i64,
            hi: job.hi as i64,
            dst: (dst + (job.matrix * words + (job.lo - first) * packing.panel * groups) * 4) as *mut c_void,
            operand: job.operand as i64,
        };
        // SAFETY: `check` proved every element of the operand's view inside its buffer; panels
        // [lo, hi) of this matrix lie inside its packed buffer, and no other job writes them.
        unsafe { lib.pack.call(&[&args as *const PackArgs as *mut u8], &mut [0; 4]) };
    };

    // 2. The tiles.
    let tasks = tile_tasks(batches.len(), mp, np, tm, if parallel { threads } else { 0 });
    let workspace_chunks = chunks_for(blocking.workspace_words(layout));
    let (act, out_stride) = (activation_code(spec.activation), m * n * out_dtype.size_bytes());
    let compute = |task: &Task| {
        WORKSPACE.with_borrow_mut(|ws| {
            if ws.len() < workspace_chunks {
                *ws = vec![[0; 4]; workspace_chunks.next_power_of_two()]; // as `Pooled::take`
            }
            let args = ComputeArgs {
                layout: layout.code(),
                pa: (pa_base + a_index[task.batch] * a_words * 4) as *const c_void,
                pa_first: a_first as i64,
                a: if in_place_a {
                    (a_base + a_offsets[a_index[task.batch]] * size) as *const c_void
                } else {
                    std::ptr::null()
                },
                a_rs: spec.a.row_stride as i64,
                b: (b_base + batches[task.batch].1 * size) as *const c_void,
                b_ns: spec.b.col_stride as i64,
                b_ks: spec.b.row_stride as i64,
                b_dtype: code,
                pb: if prepack_b {
                    (pb_base + b_index[task.batch] * b_words * 4) as *const c_void
                } else {
                    std::ptr::null()
                },
                bws: aligned(ws) as *mut c_void,
                m: m as i64,
                n: n as i64,
                k: k as i64,
                kc: blocking.kc as i64,
                nc: blocking.nc as i64,
                mc: blocking.mc as i64,
                i0: task.i0 as i64,
                i1: task.i1 as i64,
                j0: task.j0 as i64,
                j1: task.j1 as i64,
                bias: bias_base as *const f32,
                act,
                out: (out_base + task.batch * out_stride) as *mut c_void,
                ldo: ldo as i64,
                out_dtype: out_code,
                acc: if acc_words == 0 {
                    std::ptr::null_mut()
                } else {
                    (acc_base + task.batch * acc_words * 4) as *mut f32
                },
                ldacc: ldacc as i64,
                transposed: transposed as i64,
            };
            // SAFETY: `check` proved B's view inside `b`; A is packed above; the task writes
            // only its own tiles of its batch's output (and of `acc`), which no other task
            // touches; the workspace holds `nc` panels of `kc`.
            unsafe { lib.compute.call(&[&args as *const ComputeArgs as *mut u8], &mut [0; 4]) };
        })
    };
    // One run of jobs, the tasks: each first packs the chunks of A (and of B packed whole) it
    // reads that no task has claimed yet, then waits for those others are packing.
    let job = |i: usize| {
        let task = &tasks[i];
        chunks.ensure(0, a_index[task.batch], task.i0, task.i1, &pack);
        if prepack_b {
            chunks.ensure(1, b_index[task.batch], task.j0, task.j1, &pack);
        }
        compute(task);
    };
    jobs::run(tasks.len(), if parallel { jobs::helpers() } else { 0 }, &job);
    drop((packed_a, packed_b, acc));
    Ok(())
}

/// The distinct values of `offsets` in order of first appearance, and the index among them of
/// each (the matrices of a batch-broadcast operand are packed once).
fn distinct(offsets: impl Iterator<Item = usize>) -> (Vec<usize>, Vec<usize>) {
    let mut seen: HashMap<usize, usize> = HashMap::new();
    let mut values = Vec::new();
    let index = offsets
        .map(|o| {
            *seen.entry(o).or_insert_with(|| {
                values.push(o);
                values.len() - 1
            })
        })
        .collect();
    (values, index)
}

/// How one operand is packed: its buffer's address, its distinct matrices' element offsets,
/// element strides between rows and along k, rows, rows per panel.
struct Packing<'a> {
    src: usize,
    offsets: &'a [usize],
    rs: usize,
    ks: usize,
    rows: usize,
    panel: usize,
}

/// Panels `[lo, hi)` of one matrix of one operand (0: A, 1: B).
struct PackJob {
    operand: usize,
    matrix: usize,
    lo: usize,
    hi: usize,
}

/// A chunk no task has claimed.
const UNCLAIMED: u8 = 0;
/// A chunk a task is packing.
const PACKING: u8 = 1;
/// A packed chunk.
const PACKED: u8 = 2;

/// The chunks of panels a product packs before tiles read them (A, unless read in place; B
/// when packed whole), each packed once, by the first task that reads it: packing runs on
/// every thread beside the tiles, with no step of its own that all tiles wait for (with B
/// packed whole at 205 x 896 x 224, the tasks of one part of A pack B's panels while those of
/// the other part only wait for the panels they read).
#[derive(Default)]
struct Chunks {
    jobs: Vec<PackJob>,
    /// [`UNCLAIMED`], [`PACKING`] or [`PACKED`], one per job.
    states: Vec<AtomicU8>,
    /// Per operand, per matrix: the range of its chunks in `jobs` (in order of panels).
    ranges: [Vec<(usize, usize)>; 2],
}

impl Chunks {
    /// Adds the chunks of an operand's next matrix (`matrix`: the operand's matrices in
    /// order), panels `[lo, hi)` each, in order.
    fn push(&mut self, operand: usize, matrix: usize, panels: impl Iterator<Item = (usize, usize)>) {
        debug_assert_eq!(self.ranges[operand].len(), matrix);
        let first = self.jobs.len();
        self.jobs.extend(panels.filter(|(lo, hi)| lo < hi).map(|(lo, hi)| PackJob { operand, matrix, lo, hi }));
        self.states.resize_with(self.jobs.len(), || AtomicU8::new(UNCLAIMED));
        self.ranges[operand].push((first, self.jobs.len()));
    }

    /// Returns once every chunk of `(operand, matrix)` that holds one of panels `[lo, hi)` is
    /// packed: packs those no task claimed yet (with `pack`), then waits for the others, which
    /// tasks are packing now (a task packing a chunk waits for nothing before it is done, so
    /// the wait ends).
    fn ensure(&self, operand: usize, matrix: usize, lo: usize, hi: usize, pack: &(dyn Fn(&PackJob) + Sync)) {
        let Some(&(first, end)) = self.ranges[operand].get(matrix) else { return };
        let wanted = || (first..end).filter(|&c| self.jobs[c].lo < hi && lo < self.jobs[c].hi);
        for c in wanted() {
            let state = &self.states[c];
            if state.load(Ordering::Acquire) == UNCLAIMED
                && state.compare_exchange(UNCLAIMED, PACKING, Ordering::AcqRel, Ordering::Acquire).is_ok()
            {
                // marked packed even if `pack` unwinds, so that no task waits for it forever
                // (`jobs::run` then reports the panic)
                struct Done<'a>(&'a AtomicU8);
                impl Drop for Done<'_> {
                    fn drop(&mut self) {
                        self.0.store(PACKED, Ordering::Release);
                    }
                }
                let _done = Done(state);
                pack(&self.jobs[c]);
            }
        }
        for c in wanted() {
            // a chunk's packing is short: spin, then give the core away (to the packer, when
            // other processes preempted it)
            let mut spins = 0u32;
            while self.states[c].load(Ordering::Acquire) != PACKED {
                if spins < 1 << 12 {
                    std::hint::spin_loop();
                    spins += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// Fewest A panels in half of a last single-B-panel task (`tile_tasks`): each half packs the B
/// panel again (about 2-3 A panels' tiles of work), and lines of many A panels (the 896-row
/// weight gradients: 75) made the last tasks long (67 us on one core at 896 x 205 x 256, of a
/// product of 270 us on two threads) and the threads' ends uneven.
const SPLIT_PANELS: usize = 24;

/// Parts of A's panels of each batch's grid of `mp x np` tiles: 1 when the batches' B panels
/// are enough to deal out about `want` tasks, else enough parts (at most `mp`) to make them so.
fn a_parts(batches: usize, mp: usize, np: usize, want: usize) -> usize {
    mp.min(want.div_ceil(batches * np)).max(1)
}

/// The tasks of `batches` grids of `mp x np` tiles (A panels by B panels), each tile once: each
/// grid's A panels in `tm` parts, each part a line of `np` B panels, and each task a run of one
/// line's B panels. On `threads` threads (0: one thread, and each line one task) runs shrink
/// along the lines, each the panels left over twice the threads (guided self-scheduling): the
/// threads take tasks as they come free, and the last tasks, which decide when the product
/// ends, are single panels however late a thread started or however unevenly the panels divide;
/// those of lines of at least twice [`SPLIT_PANELS`] A panels are halves of such a panel.
fn tile_tasks(batches: usize, mp: usize, np: usize, tm: usize, threads: usize) -> Vec<Task> {
    let mut tasks = Vec::new();
    let mut left = batches * tm * np;
    for batch in 0..batches {
        for ti in 0..tm {
            let (i0, i1) = (mp * ti / tm, mp * (ti + 1) / tm);
            let mut j0 = 0;
            while j0 < np {
                let run = if threads == 0 { np } else { left.div_ceil(2 * threads) };
                let j1 = (j0 + run).min(np);
                if threads > 0 && run == 1 && i1 - i0 >= 2 * SPLIT_PANELS {
                    // a last single panel of many A panels, in two halves
                    let half = i0 + (i1 - i0) / 2;
                    tasks.push(Task { batch, i0, i1: half, j0, j1 });
                    tasks.push(Task { batch, i0: half, i1, j0, j1 });
                } else if i0 < i1 {
                    tasks.push(Task { batch, i0, i1, j0, j1 });
                }
                left -= j1 - j0;
                j0 = j1;
            }
        }
    }
    tasks
}

fn activation_code(act: Option<Activation>) -> i64 {
    match act {
        None => template::ACT_NONE,
        Some(Activation::GeluTanh) => template::ACT_GELU_TANH,
    }
}

/// Element `at` of a buffer of `dtype` (f32, f16 or bf16) as f32.
fn element_f32(dtype: DType, bytes: &[u8], at: usize) -> f32 {
    match dtype {
        DType::F32 => f32::from_ne_bytes(bytes[4 * at..4 * at + 4].try_into().expect("4 bytes")),
        DType::F16 => {
            f16::from_bits(u16::from_ne_bytes(bytes[2 * at..2 * at + 2].try_into().expect("2 bytes"))).to_f32()
        }
        _ => bf16::from_bits(u16::from_ne_bytes(bytes[2 * at..2 * at + 2].try_into().expect("2 bytes"))).to_f32(),
    }
}

#[cfg(test)]
#[path = "gemm_packed_tests.rs"]
mod tests;
