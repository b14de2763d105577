//! The packed matrix product: the `gemm_cpu` template ([`coil_codegen::templates::gemm_cpu`]),
//! compiled once per process by the system C compiler (through the kernel cache) and run on
//! the rayon pool the generated kernels use. A second build capped at AVX2 ([`IsaCap::Avx2`],
//! `GemmEngine::PackedAvx2`) runs, on a machine with AVX-512, the kernels a CPU without it gets.
//!
//! One product (all its batches) runs in two parallel steps:
//!
//! 1. every distinct A matrix (a batch-broadcast A is packed once) is packed, in chunks of
//!    panels;
//! 2. tasks of output tiles run: a grid over batches, then B panels, then A panels (splitting
//!    B's columns first, since a task packs the B panels it reads and tasks of the same columns
//!    would pack them again). Each task packs its B panels a block at a time into a workspace
//!    of its thread.
//!
//! Packed A, the f32 partial sums (only when k is split into blocks) and the workspaces are
//! reused from call to call, so a product does not fault fresh pages in.

use super::compiler::{c_compiler, default_cache_dir};
use super::gemm::BmmSpec;
use super::module::{self, Kernel};
use coil_codegen::templates::gemm_cpu::{self as template, Blocking, ComputeArgs, IsaCap, Layout, PackArgs};
use coil_ir::loops::{Activation, StridedOperand};
use coil_ir::{DType, Error, Result};
use half::{bf16, f16};
use rayon::prelude::*;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_FLOPS: usize = 1 << 18;

/// Tasks per pool thread of a parallel product: a thread the OS preempts holds back a small
/// share, not half the product.
const TASKS_PER_THREAD: usize = 4;

/// Fewest multiply-adds per task (about 10 us of one core): smaller ones cost more to hand out
/// than they save.
const TASK_FLOPS: usize = 1 << 21;

/// Most bytes of packed A packed on the calling thread rather than in parallel tasks (a few
/// microseconds of work: less than waking the pool for it).
const SERIAL_PACK_BYTES: usize = 256 << 10;

/// The compiled template.
pub struct Library {
    pack: Kernel,
    compute: Kernel,
    /// [`Layout::feature_bit`]s this build and CPU serve.
    features: i64,
}

impl Library {
    /// The process's library built with at most `cap`'s instructions: compiled (or taken from
    /// the cache) on first use. `None` without a C compiler or when it fails (said once on
    /// stderr).
    pub fn get(cap: IsaCap) -> Option<&'static Library> {
        static NATIVE: OnceLock<Option<Library>> = OnceLock::new();
        static AVX2: OnceLock<Option<Library>> = OnceLock::new();
        let library = match cap {
            IsaCap::Native => &NATIVE,
            IsaCap::Avx2 => &AVX2,
        };
        library
            .get_or_init(|| {
                let cc = c_compiler()?;
                let names = [template::FEATURES_KERNEL, template::PACK_KERNEL, template::COMPUTE_KERNEL];
                let loaded = module::load_or_build(cc, &template::source(cap), &default_cache_dir(), &names)
                    .and_then(|(lib, _)| Ok((lib.kernel(names[0])?, lib.kernel(names[1])?, lib.kernel(names[2])?)));
                let (features_kernel, pack, compute) =
                    loaded.inspect_err(|e| eprintln!("coil: matrix products use the gemm crate: {e}")).ok()?;
                let mut features = 0i64;
                // SAFETY: the features entry point writes one int64_t at args[0].
                unsafe { features_kernel.call(&[&mut features as *mut i64 as *mut u8], &mut [0; 4]) };
                Some(Library { pack, compute, features })
            })
            .as_ref()
    }

    /// The layout products of `dtype` use here, if the library serves one: bf16 pairs where
    /// the CPU has AVX512-BF16, f32 (AVX-512, else AVX2) for f32, f16 and other bf16.
    pub fn layout_for(&self, dtype: DType) -> Option<Layout> {
        let has = |l: Layout| self.features & l.feature_bit() != 0;
        match dtype {
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

/// 64 bytes, the unit of the reused buffers (packed panels are read with aligned loads' speed).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u32; 16]);

/// `words` 32-bit words of 64-byte aligned memory, zeroed when first allocated.
fn lines_for(words: usize) -> usize {
    words.div_ceil(16)
}

/// Buffers returned by finished products, for the next ones.
static POOL: Mutex<Vec<Vec<Line>>> = Mutex::new(Vec::new());

/// Most buffers [`POOL`] keeps.
const POOL_BUFFERS: usize = 4;

/// Most bytes [`POOL`] keeps (a larger product's buffers are freed after it).
const POOL_BYTES: usize = 256 << 20;

/// A buffer from [`POOL`] (the smallest that fits, else a new one), given back on drop.
struct Pooled(Vec<Line>);

impl Pooled {
    fn take(words: usize) -> Pooled {
        let lines = lines_for(words);
        if lines == 0 {
            return Pooled(Vec::new());
        }
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let best = (0..pool.len()).filter(|&i| pool[i].len() >= lines).min_by_key(|&i| pool[i].len());
        match best {
            Some(i) => Pooled(pool.swap_remove(i)),
            None => Pooled(vec![Line([0; 16]); lines]),
        }
    }

    fn ptr(&mut self) -> *mut u32 {
        self.0.as_mut_ptr() as *mut u32
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        pool.push(std::mem::take(&mut self.0));
        let bytes = |pool: &Vec<Vec<Line>>| pool.iter().map(|b| b.len() * 64).sum::<usize>();
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
    static WORKSPACE: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
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
/// The larger operand goes to B, which tasks pack a block at a time as they read it (once,
/// into L2), where A is packed whole before (read, written, then read again): with `m` at
/// least twice `n` the template computes `b^T a^T` and stores its tiles transposed.
pub fn bmm(
    lib: &Library,
    layout: Layout,
    spec: &BmmSpec,
    (dtype, out_dtype): (DType, DType),
    ops: Operands,
    out: &mut [u8],
) -> Result<()> {
    if spec.m < 2 * spec.n {
        return run(lib, layout, spec, (dtype, out_dtype), ops, out, false);
    }
    let flip = |op: &StridedOperand<usize>| StridedOperand {
        row_stride: op.col_stride,
        col_stride: op.row_stride,
        ..op.clone()
    };
    let swapped = BmmSpec { a: flip(&spec.b), b: flip(&spec.a), m: spec.n, n: spec.m, ..spec.clone() };
    run(lib, layout, &swapped, (dtype, out_dtype), Operands { a: ops.b, b: ops.a, ..ops }, out, true)
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
    let blocking = Blocking::choose(layout, k);
    // The output's row length, and the bias's (one value per output column).
    let ldo = if transposed { m } else { n };
    let bias_row = spec.bias.map(|view| {
        let at = |j: usize| view.offset + view.stride * j;
        (0..ldo).map(|j| element_f32(dtype, bias, at(j))).collect::<Vec<f32>>()
    });

    // The distinct A matrices (one for a batch-broadcast A) and which each batch reads.
    let mut distinct: HashMap<usize, usize> = HashMap::new();
    let mut a_offsets = Vec::new();
    let a_index: Vec<usize> = batches
        .iter()
        .map(|&(ao, _)| {
            *distinct.entry(ao).or_insert_with(|| {
                a_offsets.push(ao);
                a_offsets.len() - 1
            })
        })
        .collect();
    let a_words = layout.packed_words(m, k, mr);
    let mut packed_a = Pooled::take(a_words * a_offsets.len());
    let k_blocks = blocking.k_blocks(layout, k);
    let ldacc = np * nr;
    let acc_words = if k_blocks > 1 { mp * mr * ldacc } else { 0 };
    let mut acc = Pooled::take(acc_words * batches.len());

    let threads = rayon::current_num_threads();
    let flops = batches.len() * m * n * k;
    let parallel = threads > 1 && flops >= PARALLEL_FLOPS;
    let want = if parallel { (threads * TASKS_PER_THREAD).min(flops / TASK_FLOPS).max(threads) } else { 1 };

    // Addresses as integers, so that the closures run on the pool (the buffers outlive them).
    let (a_base, b_base, out_base) = (a.as_ptr() as usize, b.as_ptr() as usize, out.as_mut_ptr() as usize);
    let (pa_base, acc_base) = (packed_a.ptr() as usize, acc.ptr() as usize);
    let bias_base = bias_row.as_ref().map_or(0, |r| r.as_ptr() as usize);
    let groups = k.div_ceil(layout.group());

    // 1. Pack A.
    if k > 0 {
        let chunks = mp.min(want.div_ceil(a_offsets.len())).max(1);
        let jobs: Vec<(usize, usize, usize)> = (0..a_offsets.len())
            .flat_map(|u| (0..chunks).map(move |c| (u, mp * c / chunks, mp * (c + 1) / chunks)))
            .filter(|&(_, lo, hi)| lo < hi)
            .collect();
        let pack = |&(u, lo, hi): &(usize, usize, usize)| {
            let args = PackArgs {
                src: (a_base + a_offsets[u] * size) as *const c_void,
                rs: spec.a.row_stride as i64,
                ks: spec.a.col_stride as i64,
                rows: m as i64,
                k: k as i64,
                dtype: code,
                layout: layout.code(),
                panel: mr as i64,
                lo: lo as i64,
                hi: hi as i64,
                dst: (pa_base + (u * a_words + lo * mr * groups) * 4) as *mut c_void,
            };
            // SAFETY: `check` proved every element of A's view inside `a`; panels [lo, hi) of
            // matrix u lie inside `packed_a`, and no other job writes them.
            unsafe { lib.pack.call(&[&args as *const PackArgs as *mut u8], &mut [0; 4]) };
        };
        if parallel && jobs.len() > 1 && a_words * a_offsets.len() * 4 > SERIAL_PACK_BYTES {
            jobs.par_iter().with_max_len(1).for_each(pack);
        } else {
            jobs.iter().for_each(pack);
        }
    }

    // 2. The tiles.
    let tasks = tile_tasks(batches.len(), mp, np, want);
    let workspace_lines = lines_for(blocking.workspace_words(layout));
    let (act, out_stride) = (activation_code(spec.activation), m * n * out_dtype.size_bytes());
    let compute = |task: &Task| {
        WORKSPACE.with_borrow_mut(|ws| {
            if ws.len() < workspace_lines {
                *ws = vec![Line([0; 16]); workspace_lines];
            }
            let args = ComputeArgs {
                layout: layout.code(),
                pa: (pa_base + a_index[task.batch] * a_words * 4) as *const c_void,
                b: (b_base + batches[task.batch].1 * size) as *const c_void,
                b_ns: spec.b.col_stride as i64,
                b_ks: spec.b.row_stride as i64,
                b_dtype: code,
                bws: ws.as_mut_ptr() as *mut c_void,
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
    if parallel && tasks.len() > 1 {
        tasks.par_iter().with_max_len(1).for_each(compute);
    } else {
        tasks.iter().for_each(compute);
    }
    drop(packed_a);
    drop(acc);
    Ok(())
}

/// About `want` tasks covering `batches` grids of `mp x np` tiles (A panels by B panels), each
/// tile once: whole batches when there are enough of them, else each batch split along B's
/// panels first (a task packs the B panels it reads, so splitting A's would pack them twice),
/// then along A's.
fn tile_tasks(batches: usize, mp: usize, np: usize, want: usize) -> Vec<Task> {
    let per_batch = want.div_ceil(batches).max(1);
    let tn = np.min(per_batch).max(1);
    let tm = mp.min(per_batch.div_ceil(tn)).max(1);
    (0..batches)
        .flat_map(|batch| {
            (0..tm).flat_map(move |ti| {
                (0..tn).map(move |tj| Task {
                    batch,
                    i0: mp * ti / tm,
                    i1: mp * (ti + 1) / tm,
                    j0: np * tj / tn,
                    j1: np * (tj + 1) / tn,
                })
            })
        })
        .filter(|t| t.i0 < t.i1 && t.j0 < t.j1)
        .collect()
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
