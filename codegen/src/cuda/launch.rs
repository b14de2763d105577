//! The launch heuristic: block size, elements per thread and rows per block of each kernel, in
//! one place ([`plan`]).
//!
//! The numbers were measured on the H100 (132 SMs, 2048 threads per SM), where memory-bound
//! kernels need 16-byte accesses, coalesced across the warp, and a few of them in flight per
//! thread; what depends on the GPU (its SM count, its L2) comes from the [`GpuTarget`].

use super::emit::divisible;
use super::Launch;
use coil_ir::kernel::{
    flat_stmts, rindex, xindex, Dims, FusedKernel, KernelKind, Schedule, TileKernel, TileOp, TileStmt,
};
use coil_ir::loops::LoopProgram;
use coil_ir::sym::Expr;
use coil_ir::target::GpuTarget;
use coil_ir::DType;
use indexmap::{IndexMap, IndexSet};

/// Threads per block of pointwise kernels: 8 warps, so that 8 blocks fill an SM and a block's
/// tail wastes little.
pub const POINTWISE_BLOCK: usize = 256;
/// Widest access of one thread, in bytes (`LDG.128`).
pub const MAX_ACCESS_BYTES: usize = 16;
/// Rows up to this long get one warp each in a persistent reduction (up to 32 values per
/// thread; the row's reductions are shuffles, no barrier); longer rows a block. Measured on
/// the H100 with a causal softmax over bf16 rows of 1024: a warp per row 237 us, 64 threads
/// 251 us, 128 threads 266 us.
pub const WARP_ROW_MAX: i64 = 1024;
/// Longest row one block holds in registers in a persistent reduction (256 threads of up to
/// 32 values); the scheduler keeps longer rows looped unless the GPU has clusters.
pub const BLOCK_ROW_MAX: i64 = 8192;
/// Most blocks of a thread-block cluster (the portable limit of sm_90).
pub const MAX_CLUSTER: usize = 8;
/// Longest row a persistent reduction holds on a GPU with thread-block clusters (sm_90 and
/// later): [`MAX_CLUSTER`] blocks of [`BLOCK_ROW_MAX`], their partial results exchanged
/// through distributed shared memory.
pub const CLUSTER_ROW_MAX: i64 = BLOCK_ROW_MAX * MAX_CLUSTER as i64;
/// Outputs per block of a column reduction (one warp wide).
pub const COL_OUTPUTS: usize = 32;
/// Outputs per thread of a wide one-pass column reduction ([`Plan::col_vec`]).
pub const COL_VEC: usize = 4;
/// Fewest blocks of a column reduction with two warps of outputs per block: about one per SM.
const WIDE_COL_MIN_BLOCKS: usize = 128;
/// Shared memory of a column reduction's block stages, at most (16 bytes per slot, the widest
/// accumulator; NVRTC's static limit is 48 KiB).
const COL_SMEM_BYTES: usize = 40 << 10;
/// Largest grid launched (the grid-stride loops of the kernels cover the rest).
const MAX_GRID: usize = i32::MAX as usize;

/// How one kernel maps onto threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Grid and block.
    pub launch: Launch,
    /// Consecutive elements a thread handles as one group: `xindex` values of a pointwise
    /// kernel, `rindex` values of a reduction. Accesses contiguous in them become vector
    /// accesses of `vec * size` bytes (in pieces of at most 16 bytes).
    pub vec: usize,
    /// Threads that share one row of a reduction (a multiple of 32; 1 for pointwise kernels).
    pub lanes: usize,
    /// Rows of a reduction per block (`block / lanes`).
    pub rows_per_block: usize,
    /// Groups of `vec` elements each thread holds in registers in a persistent reduction.
    pub chunks: usize,
    /// A column reduction ([`column_like`]): the block's `rows_per_block` rows are consecutive
    /// outputs, one per thread of each warp (`threadIdx.x % rows_per_block`), and its `lanes`
    /// threads per row split the reduced dim (`threadIdx.x / rows_per_block`), so that a warp
    /// reads 32 consecutive elements (one per output) at each reduced position instead of 32
    /// positions `stride` apart. The block stage goes through shared memory
    /// (`coil_reduce_col`).
    pub col: bool,
    /// Blocks of a thread-block cluster that share one row of a persistent reduction (1: no
    /// cluster): block `c` of the cluster holds the row's groups `lanes * (c + cluster * k) +
    /// t`, and the blocks' partial results meet in distributed shared memory
    /// (`coil_reduce_cluster`). Rows longer than [`BLOCK_ROW_MAX`] only.
    pub cluster: usize,
    /// Consecutive outputs each thread of a column plan holds (1 otherwise): the block's
    /// `rows_per_block` outputs are `rows_per_block / col_vec` threads across, each loading its
    /// outputs' elements of a row as one vector ([`col_threads`](Plan::col_threads)).
    pub col_vec: usize,
}

impl Plan {
    /// Warps per row: the size of the shared-memory stage of a block reduction.
    pub fn warps_per_row(&self) -> usize {
        (self.lanes / 32).max(1)
    }

    /// Threads of a row over all the blocks of its cluster: the stride between one thread's
    /// groups.
    pub fn row_threads(&self) -> usize {
        self.lanes * self.cluster
    }

    /// Whether the grid of [`Launch::grid_for`] has a block (or cluster) for every row of a
    /// persistent reduction whatever its symbolic row count, so that its kernel needs no
    /// grid-stride loop: one row per block, no grid cap, rows of more than [`WARP_ROW_MAX`]
    /// elements, of which no GPU's memory holds `2^31` (that would be `2^41` elements).
    /// As a loop (of one iteration) the driver's assembler hoists the row's addresses out of
    /// it: the dynamic layer norm took 63 registers instead of 48 and ran 5% slower.
    pub fn grid_covers_rows(&self, k: &TileKernel) -> bool {
        let long_rows = k.rnumel.and_then(|r| r.const_value()).is_some_and(|r| r > WARP_ROW_MAX);
        k.kind == KernelKind::PersistentReduction
            && long_rows
            && self.rows_per_block == 1
            && self.launch.max_grid == 0
            && !self.col
    }

    /// Threads across a column plan's outputs: `threadIdx.x % col_threads` picks the thread's
    /// outputs, `threadIdx.x / col_threads` its place along the reduced dim.
    pub fn col_threads(&self) -> usize {
        self.rows_per_block / self.col_vec
    }
}

/// Overrides of the heuristic's choices ([`plan_with`]); `None` keeps the heuristic's. The
/// configuration's overrides make one ([`Tuning::configured`]), and the runtime's autotuner
/// tries a few per kernel ([`candidates`]) and caches the fastest in its text form
/// (`Display` / `FromStr`: `row_threads=512 cluster=4`, or `heuristic` when nothing is set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tuning {
    /// Threads per row of a persistent reduction (a multiple of 32, at most 1024; rows of one
    /// warp are packed 8 to a block). `COIL_ROW_THREADS`.
    pub row_threads: Option<usize>,
    /// Blocks per row of a persistent reduction (a power of two, at most [`MAX_CLUSTER`]; more
    /// than 1 needs sm_90 or later). `COIL_CLUSTER`.
    pub cluster: Option<usize>,
    /// Threads per row of a looped reduction (a multiple of 32, at most 1024).
    /// `COIL_LOOPED_THREADS`.
    pub looped_threads: Option<usize>,
    /// Most blocks of a looped reduction ([`Launch::max_grid`]; 0: no cap). `COIL_LOOPED_GRID`.
    pub looped_grid: Option<u32>,
    /// Elements per thread of a pointwise kernel (a power of two, at most 32).
    /// `COIL_POINTWISE_VEC`.
    pub pointwise_vec: Option<usize>,
}

/// Each knob of [`Tuning`]: its name in the text form, and its environment variable. The
/// order is that of [`Tuning::fields`].
const KNOBS: [(&str, &str); 5] = [
    ("row_threads", "COIL_ROW_THREADS"),
    ("cluster", "COIL_CLUSTER"),
    ("looped_threads", "COIL_LOOPED_THREADS"),
    ("looped_grid", "COIL_LOOPED_GRID"),
    ("pointwise_vec", "COIL_POINTWISE_VEC"),
];

/// Whether knob `name` takes the value `n` (the one check of every way a value comes in).
fn accepts(name: &str, n: usize) -> bool {
    let whole_warps = (32..=1024).contains(&n) && n.is_multiple_of(32);
    match name {
        "row_threads" | "looped_threads" => whole_warps,
        "cluster" => n.is_power_of_two() && n <= MAX_CLUSTER,
        "looped_grid" => u32::try_from(n).is_ok(),
        "pointwise_vec" => n.is_power_of_two() && n <= 32,
        _ => false,
    }
}

impl Tuning {
    /// The launch overrides of the configuration ([`coil_ir::config::Tuning`]; by default
    /// `COIL_ROW_THREADS`, `COIL_CLUSTER`, `COIL_LOOPED_THREADS`, `COIL_LOOPED_GRID`,
    /// `COIL_POINTWISE_VEC`); a value outside the knob's range is ignored.
    pub fn configured() -> Tuning {
        let t = &coil_ir::config::current().tuning;
        let fields = [t.row_threads, t.cluster, t.looped_threads, t.looped_grid, t.pointwise_vec];
        Tuning::from_fields(std::array::from_fn(|i| fields[i].filter(|&n| accepts(KNOBS[i].0, n))))
    }

    /// True when nothing is overridden.
    pub fn is_heuristic(&self) -> bool {
        *self == Tuning::default()
    }

    /// The knobs' values in [`KNOBS`] order.
    fn fields(&self) -> [Option<usize>; 5] {
        let grid = self.looped_grid.map(|g| g as usize);
        [self.row_threads, self.cluster, self.looped_threads, grid, self.pointwise_vec]
    }

    /// The inverse of [`Tuning::fields`] (values already checked).
    fn from_fields([row_threads, cluster, looped_threads, grid, pointwise_vec]: [Option<usize>; 5]) -> Tuning {
        let looped_grid = grid.and_then(|g| u32::try_from(g).ok());
        Tuning { row_threads, cluster, looped_threads, looped_grid, pointwise_vec }
    }

    /// Without the values outside their knob's range (a struct built in code may hold any).
    fn checked(&self) -> Tuning {
        let fields = self.fields();
        Tuning::from_fields(std::array::from_fn(|i| fields[i].filter(|&n| accepts(KNOBS[i].0, n))))
    }
}

impl std::fmt::Display for Tuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_heuristic() {
            return f.write_str("heuristic");
        }
        let set: Vec<String> =
            (KNOBS.iter().zip(self.fields())).filter_map(|((name, _), v)| Some(format!("{name}={}", v?))).collect();
        f.write_str(&set.join(" "))
    }
}

impl std::str::FromStr for Tuning {
    type Err = String;

    /// The `Display` form back: `heuristic`, or `knob=value` pairs separated by spaces.
    fn from_str(text: &str) -> Result<Tuning, String> {
        let text = text.trim();
        let mut fields = [None; 5];
        if text == "heuristic" {
            return Ok(Tuning::default());
        }
        for pair in text.split_whitespace() {
            let (name, value) = pair.split_once('=').ok_or_else(|| format!("`{pair}` is not knob=value"))?;
            let i = KNOBS.iter().position(|(n, _)| *n == name).ok_or_else(|| format!("unknown knob `{name}`"))?;
            let n = value.parse::<usize>().ok().filter(|&n| accepts(name, n));
            fields[i] = Some(n.ok_or_else(|| format!("`{pair}`: not a value {name} takes"))?);
        }
        if fields.iter().all(Option::is_none) {
            return Err(format!("`{text}` sets no knob"));
        }
        Ok(Tuning::from_fields(fields))
    }
}

/// Most alternatives to the heuristic's plan that [`candidates`] offers: each costs a compile
/// and a timing when autotuning.
pub const MAX_CANDIDATES: usize = 3;

/// The plans worth timing for `k`: the heuristic's own first (`Tuning::default()`), then at
/// most [`MAX_CANDIDATES`] alternatives, only where the heuristic is unsure:
///
/// * a persistent reduction of rows longer than [`WARP_ROW_MAX`] (a block or a cluster per
///   row): half and double the heuristic's threads per row (whole warps, 64..1024, each
///   thread holding at least one group); for a cluster plan also half the cluster with twice
///   the threads (the same threads per row, fewer and larger blocks);
/// * a persistent reduction of shorter rows that hold more groups than a warp has lanes: a
///   warp per row, 64 and 128 threads per row, besides the heuristic's;
/// * a looped reduction: 256, 512 and 1024 threads per row besides the heuristic's.
///
/// Pointwise kernels, rows of at most 32 groups and column reductions get none (the
/// heuristic's choice alone): their plans were measured across the workloads. Every
/// candidate is a plan the generator emits correctly (any whole number of warps per row and
/// any cluster of [`plan_with`]: `chunks` follows, and partial chunks are guarded), and no two
/// have the same plan, so no two emit the same source.
pub fn candidates(k: &TileKernel, target: &GpuTarget) -> Vec<Tuning> {
    let heuristic = plan_with(k, &Tuning::default(), target);
    let mut out = vec![Tuning::default()];
    if heuristic.col {
        return out;
    }
    let mut alternatives = Vec::new();
    let groups = k.rnumel.and_then(|r| r.const_value()).unwrap_or(0) as usize / heuristic.vec;
    match k.kind {
        KernelKind::PersistentReduction if k.rnumel.and_then(|r| r.const_value()).is_some_and(|r| r > WARP_ROW_MAX) => {
            let (lanes, cluster) = (heuristic.lanes, heuristic.cluster);
            let useful = |threads: usize, cluster: usize| {
                threads != lanes && (64..=1024).contains(&threads) && threads * cluster <= groups
            };
            for threads in [(lanes / 2).next_multiple_of(32), lanes * 2] {
                if useful(threads, cluster) {
                    alternatives.push(Tuning { row_threads: Some(threads), ..Tuning::default() });
                }
            }
            if cluster > 1 && lanes * 2 <= 1024 {
                alternatives.push(Tuning {
                    row_threads: Some(lanes * 2),
                    cluster: Some(cluster / 2),
                    ..Tuning::default()
                });
            }
        }
        KernelKind::PersistentReduction if groups > 32 => {
            // rows of up to WARP_ROW_MAX with more groups than a warp has lanes: a warp per
            // row, or a block of 64 or 128 threads ([`few_rows_block`])
            for threads in [32, 64, 128] {
                if threads != heuristic.lanes && threads < 2 * groups {
                    alternatives.push(Tuning { row_threads: Some(threads), ..Tuning::default() });
                }
            }
        }
        KernelKind::LoopedReduction => {
            for threads in [256, 512, 1024] {
                alternatives.push(Tuning { looped_threads: Some(threads), ..Tuning::default() });
            }
        }
        _ => {}
    }
    let mut plans = vec![heuristic];
    for t in alternatives {
        let p = plan_with(k, &t, target);
        if out.len() <= MAX_CANDIDATES && !plans.contains(&p) {
            plans.push(p);
            out.push(t);
        }
    }
    out
}

/// The smallest element size among the kernel's buffers: it decides how many elements make a
/// 16-byte access.
fn min_elem_bytes(k: &TileKernel) -> usize {
    k.args.iter().map(|a| a.dtype.size_bytes()).min().unwrap_or(4).max(1)
}

/// Chooses the launch of a (non-extern) kernel on `target` from its `xnumel` outputs (or rows)
/// and its rows of `rnumel`, either of which may be an expression of size symbols (dynamic
/// shapes):
///
/// * **Pointwise**: `vec` = one 16-byte access of the narrowest buffer (at least 4, at most
///   8 elements: 4 for f32, 8 for f16/bf16, 4 for f64 as two accesses); blocks of 256
///   threads (fewer, in whole warps, for tiny kernels of a constant size); enough blocks for
///   every group.
/// * **Persistent reduction** (a constant row): rows up to [`WARP_ROW_MAX`] get one warp (and a
///   block holds up to 8 rows, fewer while that leaves under two blocks per SM; 8 when the
///   number of rows is symbolic); longer rows get a block of 64..256 threads (whole warps;
///   up to 1024 when there are fewer rows than `target`'s SMs) sized for about two groups per
///   thread.
///   Rows longer than [`BLOCK_ROW_MAX`] are split over a cluster of 2..8 blocks (the fewest
///   that leave each at most `BLOCK_ROW_MAX` elements), each of whole warps for about 64
///   values per thread (32 of f64) and at most 32 groups.
///   `vec` divides the row, so a group lies wholly inside it or outside.
/// * **Looped reduction**: one block per row, 256..1024 threads sized for about four groups
///   per thread per pass (1024 for a row of symbolic length); `vec` provably divides the row.
///   A kernel that reads its rows twice caps its grid so that the second read hits
///   `target`'s L2 (`rereading_grid_cap`).
///
/// The grid is `ceil(xnumel / per_block)` ([`Launch::grid_for`]): fixed here for a constant
/// `xnumel`, computed by the runtime for each run's sizes otherwise (`Launch::grid` is then 0).
///
/// The configuration's launch overrides ([`Tuning::configured`]) override these choices.
pub fn plan(k: &TileKernel, target: &GpuTarget) -> Plan {
    plan_with(k, &Tuning::configured(), target)
}

/// [`plan`] with the choices `tuning` sets in place of the heuristic's (values outside a
/// knob's range, see [`Tuning`], are ignored). Column reductions keep their plan.
pub fn plan_with(k: &TileKernel, tuning: &Tuning, target: &GpuTarget) -> Plan {
    let t = tuning.checked();
    let sms = target.sm_count as usize;
    let rnumel = k.rnumel.unwrap_or(Expr::int(1));
    let xn = k.xnumel.const_value().map(|x| x.max(0) as usize);
    let rn = rnumel.const_value().map(|r| r.max(0) as usize);
    let access = (MAX_ACCESS_BYTES / min_elem_bytes(k)).clamp(1, 8);
    if k.kind != KernelKind::Pointwise && k.kind != KernelKind::Extern && column_like(k) {
        return column_plan(k, xn, rn);
    }
    match k.kind {
        KernelKind::Pointwise | KernelKind::Extern => {
            let vec = t.pointwise_vec.unwrap_or(access.max(4));
            let block = match xn {
                Some(xn) => xn.div_ceil(vec).max(1).next_multiple_of(32).min(POINTWISE_BLOCK),
                None => POINTWISE_BLOCK,
            };
            let pl = Plan {
                launch: launch(block, vec * block),
                vec,
                lanes: 1,
                rows_per_block: 1,
                chunks: 1,
                col: false,
                cluster: 1,
                col_vec: 1,
            };
            pl.at(xn)
        }
        KernelKind::PersistentReduction => {
            let rn = rn.expect("a persistent reduction has a constant row");
            let mut vec = largest_pow2_dividing(access, rn);
            // A GPU without clusters holds the row in one block, however long (the scheduler
            // keeps rows over `BLOCK_ROW_MAX` looped there).
            let cluster = match target.clusters {
                true => (t.cluster)
                    .unwrap_or_else(|| rn.div_ceil(BLOCK_ROW_MAX as usize).next_power_of_two())
                    .min(MAX_CLUSTER),
                false => 1,
            };
            let lanes = if let Some(lanes) = t.row_threads {
                lanes
            } else if let Some(lanes) = few_rows_block(rn, rn / vec, xn, sms) {
                lanes
            } else if rn as i64 <= WARP_ROW_MAX {
                // No wider groups than keep all 32 lanes busy.
                while vec > 1 && vec * 32 > rn {
                    vec /= 2;
                }
                32
            } else if cluster > 1 {
                // A block's share of a long row: about 64 values per thread (32 of f64) in
                // registers, so that more of the row's loads are in flight per SM, and at most
                // 32 groups (the fully unrolled limit). H100, softmax over f32 rows of 65536 in
                // clusters of 8 (the autotuner's timings): 128 threads 193 us, 256 199 us, 512
                // 223 us.
                let values = if k.args.iter().any(|a| a.dtype == DType::F64) { 32 } else { 64 };
                let fewest = (rn / vec).div_ceil(32 * cluster);
                (rn.div_ceil(cluster) / values).max(fewest).next_multiple_of(32).clamp(64, 1024)
            } else {
                // Whole warps for about two groups each, so that few lanes idle; up to 1024
                // threads when there are too few rows to fill the GPU anyway (a whole-tensor
                // reduction: more of its loads in flight at once).
                let most = if xn.is_some_and(|x| x < sms) { 1024 } else { 256 };
                (rn / vec).div_ceil(2).next_multiple_of(32).clamp(64, most)
            };
            let chunks = (rn / vec).div_ceil(lanes * cluster);
            let mut rows = if lanes == 32 && cluster == 1 { 8 } else { 1 };
            if let Some(xn) = xn {
                while rows > 1 && xn.div_ceil(rows) < 2 * sms {
                    rows /= 2;
                }
            }
            let mut launch = launch(lanes * rows, rows);
            launch.cluster = cluster as u32;
            Plan { launch, vec, lanes, rows_per_block: rows, chunks, col: false, cluster, col_vec: 1 }.at(xn)
        }
        KernelKind::LoopedReduction => {
            let vec = (1..=access.ilog2()).map(|p| 1 << p).take_while(|&v| divisible(rnumel, v as i64)).last();
            let vec = vec.unwrap_or(1);
            let heuristic = || rn.map_or(SYMBOLIC_ROW_LANES, |rn| looped_lanes(rn / vec));
            let lanes = t.looped_threads.unwrap_or_else(heuristic);
            let mut launch = launch(lanes, 1);
            launch.max_grid = t.looped_grid.unwrap_or_else(|| rereading_grid_cap(k, rn, target));
            Plan { launch, vec, lanes, rows_per_block: 1, chunks: 1, col: false, cluster: 1, col_vec: 1 }.at(xn)
        }
    }
}

/// Keeps a row on chip over a cluster of blocks only where that pays: a persistent reduction
/// of `schedule` whose row is longer than one block holds ([`BLOCK_ROW_MAX`]) becomes a looped
/// one (`per_` names become `red_`) when its looped kernel reads the row in one pass (an online
/// logsumexp, a plain sum), or in two with at least [`LOOPED_TWO_PASS_ROWS_PER_SM`] rows per SM
/// of `target` (the second pass then reads the row back from the L2, its grid capped so that
/// the rows in flight fit: [`l2_row_budget`]). Measured on the H100: cross-entropy over bf16
/// rows of 50304, 299 us looped against 613 us over clusters of 8 (clusters of short-lived
/// blocks schedule slowly); on the H200: a training cross-entropy (its gradient written in
/// the second pass) over 8192 such rows 656 us looped against 798 over clusters, a softmax
/// over 1024 f32 rows of 65536 (8 per SM) 186 us looped against 149 over clusters.
pub fn settle_row_kinds(program: &LoopProgram, schedule: &mut Schedule, target: &GpuTarget) {
    for k in &mut schedule.kernels {
        let long = k.rnumel.and_then(|r| r.const_value()).is_some_and(|r| r > BLOCK_ROW_MAX);
        if k.kind != KernelKind::PersistentReduction || !long {
            continue;
        }
        let looped = FusedKernel { kind: KernelKind::LoopedReduction, ..k.clone() };
        let passes =
            crate::build_kernel(program, &looped).body.iter().filter(|s| matches!(s, TileStmt::RLoop(_))).count();
        let many_rows =
            k.xnumel.const_value().is_some_and(|x| x >= LOOPED_TWO_PASS_ROWS_PER_SM * i64::from(target.sm_count));
        if passes <= 1 || (passes == 2 && many_rows) {
            k.name = match k.name.strip_prefix(KernelKind::PersistentReduction.prefix()) {
                Some(rest) => format!("{}{rest}", KernelKind::LoopedReduction.prefix()),
                None => k.name.clone(),
            };
            k.kind = KernelKind::LoopedReduction;
        }
    }
}

/// Bytes of rows a looped reduction that reads its rows twice may keep in flight: the share
/// of `target`'s L2 that the second pass can count on, 12/25 of it (24 MiB of the H100's 50).
pub fn l2_row_budget(target: &GpuTarget) -> usize {
    target.l2_bytes / 25 * 12
}

/// The grid cap of a looped reduction ([`Launch::max_grid`]): a kernel that reads a row again
/// in a later pass runs at most [`l2_row_budget`]` / row bytes` rows at once, so that its later
/// passes read the row from L2 instead of HBM (short rows get a cap above any grid they need).
/// The row bytes are those of the buffers read in two or more passes (a cross-entropy's
/// logits, not its per-row targets), and the cap a whole number of blocks per SM (at least
/// one), so that every SM runs as many rows at once. 0 (no cap) when no pass reads a row
/// again. [`Tuning::looped_grid`] overrides it. H200 (60 MiB of L2), GPT-2's training
/// cross-entropy over 8192 bf16 rows of 50304, its gradient written in the second pass:
/// 132 blocks (one per SM, the cap the widest argument, an i64 target, used to give) 653 us,
/// 264 blocks 560 us, 396 590 us, 528 601 us.
fn rereading_grid_cap(k: &TileKernel, rn: Option<usize>, target: &GpuTarget) -> u32 {
    let passes: Vec<IndexSet<usize>> = (k.body.iter())
        .filter_map(|s| match s {
            TileStmt::RLoop(body) => Some(loaded_args(body)),
            _ => None,
        })
        .collect();
    let reread = (k.args.iter().enumerate())
        .filter(|(arg, _)| passes.iter().filter(|loads| loads.contains(arg)).count() >= 2)
        .map(|(_, a)| a.dtype.size_bytes())
        .sum::<usize>();
    let Some(rn) = rn.filter(|_| reread > 0) else { return 0 };
    let sms = target.sm_count as usize;
    let rows = l2_row_budget(target) / (rn * reread).max(1);
    (rows / sms * sms).clamp(sms, MAX_GRID) as u32
}

/// The arguments `stmts` load from.
fn loaded_args(stmts: &[TileStmt]) -> IndexSet<usize> {
    (flat_stmts(stmts).into_iter())
        .filter_map(|s| match s {
            TileStmt::Let {
                op: TileOp::Load { arg, .. } | TileOp::MaskedLoad { arg, .. } | TileOp::IndirectLoad { arg, .. },
                ..
            } => Some(*arg),
            _ => None,
        })
        .collect()
}

/// Fewest rows per SM for which a long row's two passes loop ([`settle_row_kinds`]).
pub const LOOPED_TWO_PASS_ROWS_PER_SM: i64 = 16;

/// Threads per row of a looped reduction of `groups` vector groups per row: about 4 groups per
/// thread (256 to 1024 threads), halved while that cuts the last pass's idle lanes by more than
/// 5% of the row. H200, GPT-2's logsumexp over bf16 rows of 50304 (6288 groups of 8): 1024
/// threads (7 passes, the last 14% short) 195 us, 512 (13 passes, 6%) 183 us, 256 183 us.
fn looped_lanes(groups: usize) -> usize {
    let groups = groups.max(1);
    let idle = |lanes: usize| (groups.div_ceil(lanes) * lanes) as f64 / groups as f64 - 1.0;
    let mut lanes = (groups / 4).next_power_of_two().clamp(256, 1024);
    while lanes > 256 && idle(lanes / 2) + 0.05 < idle(lanes) {
        lanes /= 2;
    }
    lanes
}

/// Threads per row of a looped reduction whose row length is symbolic (its loads are scalar:
/// nothing proves a vector divides the row). With 512 chunks of a split row (`coil_passes::
/// split`), 1024 threads keep enough loads in flight: a dynamic 256M-element sum took 505 us
/// with 256 chunks of 512 threads, 387 us with 512 of 1024 (static: 362 us).
const SYMBOLIC_ROW_LANES: usize = 1024;

impl Launch {
    /// The grid for `xnumel` outputs (or rows): `ceil(xnumel / per_block)` times the
    /// cluster's blocks, at least one cluster and at most `2^31 - 1` blocks, a whole number of
    /// clusters (the kernels' grid-stride loops cover the rest).
    pub fn grid_for(&self, xnumel: i64) -> u32 {
        let n = usize::try_from(xnumel).unwrap_or(0);
        let cluster = self.cluster.max(1) as usize;
        let cap = if self.max_grid == 0 { MAX_GRID } else { self.max_grid as usize };
        let cap = (cap.min(MAX_GRID) / cluster).max(1);
        (n.div_ceil(self.per_block.max(1) as usize).clamp(1, cap) * cluster) as u32
    }
}

impl Plan {
    /// With the grid for a constant `xnumel` (`None`: symbolic, the grid is left 0).
    fn at(mut self, xnumel: Option<usize>) -> Plan {
        self.launch.grid = xnumel.map_or(0, |x| self.launch.grid_for(x as i64));
        self
    }
}

/// Whether a reduction reads its rows across memory, down columns: no `XR` load that differs
/// between outputs is contiguous along `rindex` (a per-row value, the same for every output, such
/// as a layer norm's saved statistics in its weight gradient, does not count), and some `XR`
/// load steps by 1 along `xindex` and by a nonzero stride along `rindex` (`x.sum(dim=0)`:
/// `x[stride*rindex + xindex]`). One block per row
/// would read such rows one element per thread at `stride` apart; see [`Plan::col`].
/// Needs whole blocks of outputs (`xnumel` provably a multiple of 32): every thread of a block
/// then runs the same iterations, as the block stage's barriers require.
pub fn column_like(k: &TileKernel) -> bool {
    let Some(r) = k.rnumel else { return false };
    if !k.xnumel.is_known_positive() || !divisible(k.xnumel, COL_OUTPUTS as i64) || r.bounds().0.is_none_or(|lo| lo < 2)
    {
        return false;
    }
    // A block's outputs are `xindex = 32·q + lane`: a load is column-like when it steps by 1
    // along the lane (within the block's 32 outputs; `xindex % 768` does, a split reduction's
    // `[chunks, 768]` partials do) and by a nonzero stride along `rindex`.
    let (x, r) = (xindex(&k.xnumel), rindex(&r));
    let lane = Expr::index("lane", COL_OUTPUTS as i64);
    let block = Expr::index_upto("block", k.xnumel.floor_div(COL_OUTPUTS as i64));
    let by_lane = IndexMap::from([(x, block * COL_OUTPUTS as i64 + lane)]);
    let first_lane = IndexMap::from([(lane, Expr::int(0))]);
    let step = |e: Expr, v: Expr| e.substitute(&IndexMap::from([(v, v + 1)])) - e;
    let mut col = false;
    for s in flat_stmts(&k.body) {
        let TileStmt::Let { dims: Dims::XR, op: TileOp::Load { index, .. } | TileOp::MaskedLoad { index, .. }, .. } = s
        else {
            continue;
        };
        let e = index.substitute(&by_lane);
        let (dr, dx) = (step(e, r), e - e.substitute(&first_lane));
        if dr == Expr::int(1) && dx != Expr::int(0) {
            return false;
        }
        col |= dr != Expr::int(0) && dx == lane;
    }
    col
}

/// The launch of a column reduction: blocks of [`COL_OUTPUTS`] outputs (twice that for a
/// persistent one when that still makes [`WIDE_COL_MIN_BLOCKS`] blocks) times up to 32 threads along the reduced dim
/// (fewer for short rows, about 8 positions per thread, at most 1024 threads, and fewer where
/// the block stages' shared memory would pass [`COL_SMEM_BYTES`]; 32 for a symbolic row).
/// Accesses go element by element (`vec = 1`): consecutive in the warp, not in the thread;
/// except in a wide plan of one pass ([`single_pass`]), where each thread takes
/// [`COL_VEC`] consecutive outputs, loaded as one vector per row, and up to 64 threads go along
/// the reduced dim.
fn column_plan(k: &TileKernel, xn: Option<usize>, rn: Option<usize>) -> Plan {
    let reductions = flat_stmts(&k.body)
        .iter()
        .filter(|s| matches!(s, TileStmt::Reduce { .. } | TileStmt::ReduceOnlineSoftmax { .. }))
        .count()
        .max(1);
    // Two warps side by side read 256 contiguous bytes of a row per step where there are
    // outputs enough for a block on about every SM anyway. H100, an f32 [8192, 8192] sum over
    // dim 0: 64 outputs (16 threads along the column) 101.9 us, 32 (32 threads) 103.7 us,
    // 128 (8 threads) 116.8 us. Persistent only: the same sum with its rows symbolic (looped)
    // took 113.3 us with 64 outputs against 102.1 us with 32.
    let wide = 2 * COL_OUTPUTS;
    let persistent = k.kind == KernelKind::PersistentReduction;
    let is_wide = persistent && xn.is_some_and(|x| x % wide == 0 && x / wide >= WIDE_COL_MIN_BLOCKS);
    let outputs = if is_wide { wide } else { COL_OUTPUTS };
    // 4 outputs per thread, 16-byte loads of f32 (hand-written kernels, same run, the sum
    // above: 16 threads across x 64 along 99.5 us, 16 x 32 100.0 us, 32 x 32 101.0 us,
    // against 101.7 us for the scalar plan).
    // (arg reductions keep one output per thread: their index is the reduced position)
    let no_arg = !flat_stmts(&k.body).iter().any(|s| matches!(s, TileStmt::Reduce { op, .. } if op.is_arg()));
    let col_vec = if is_wide && no_arg && single_pass(k) { COL_VEC } else { 1 };
    let across = outputs / col_vec;
    // shared memory: a slot per thread and output (16 bytes: the widest accumulator; with
    // vectors of outputs, 8: arg reductions keep one output per thread)
    let slot = if col_vec > 1 { 8 * col_vec } else { 16 };
    let smem_lanes = (COL_SMEM_BYTES / (across * slot * reductions)).max(1).min(1024 / across);
    let most = if col_vec > 1 { 64 } else { 32 };
    // (at least one thread along the reduced dim per output of a vector, which folds it)
    let mut lanes = rn.map_or(32, |rn| rn.div_ceil(8).next_power_of_two().clamp(col_vec, most));
    while lanes > smem_lanes && lanes > col_vec {
        lanes /= 2;
    }
    let chunks = match rn {
        Some(rn) if persistent => rn.div_ceil(lanes),
        _ => 1,
    };
    let launch = launch(across * lanes, outputs);
    Plan { launch, vec: 1, lanes, rows_per_block: outputs, chunks, col: true, cluster: 1, col_vec }.at(xn)
}

/// Whether a persistent kernel is one pass between row statements: row values (the pass reads
/// only the constants among them), then `XR` statements and the reductions they fold (none
/// reading another's result), then row statements. A column plan with [`Plan::col_vec`] `> 1`
/// emits that shape as the constants, the pass over vectors of outputs, then the other row
/// statements output by output.
pub fn single_pass(k: &TileKernel) -> bool {
    let mut phase = 0; // 0: row values, 1: the pass, 2: row statements after it
    let (mut early, mut reduced) = (Vec::new(), Vec::new());
    for s in &k.body {
        let xr = match s {
            TileStmt::Let { dims, .. } | TileStmt::Store { dims, .. } => *dims == Dims::XR,
            TileStmt::Reduce { .. } => true,
            _ => return false,
        };
        if xr && s.reads().iter().any(|v| reduced.contains(v) || early.contains(v)) {
            return false;
        }
        match s {
            TileStmt::Reduce { var, .. } => reduced.push(*var),
            TileStmt::Let { var, op, .. } if !xr && phase == 0 && !matches!(op, TileOp::Constant(_)) => {
                early.push(*var)
            }
            _ => {}
        }
        phase = match (phase, xr, s) {
            (0, false, TileStmt::Let { .. }) => 0,
            (0 | 1, true, _) => 1,
            (1 | 2, false, _) => 2,
            _ => return false,
        };
    }
    phase == 2
}

/// A launch of `block` threads covering `per_block` outputs (or rows) per block; the grid
/// comes from [`Plan::at`].
fn launch(block: usize, per_block: usize) -> Launch {
    // Shared memory is static (`__shared__` arrays sized at generation), so none is dynamic.
    Launch { grid: 0, block: block as u32, shared_bytes: 0, per_block: per_block as u32, max_grid: 0, cluster: 1 }
}

/// Threads per row for rows of `rn` up to [`WARP_ROW_MAX`] that would give each lane of a warp
/// more than one of their `groups`, when there are at most [`FEW_ROWS_PER_SM`] rows per SM of
/// `sms`: a block of 64 or 128 threads per row (the groups' next power of two, at most 128).
/// A warp per row packs 8 rows to a block, so few rows make few blocks, and their last wave
/// leaves SMs idle. H200, GPT-2's 8192 rows of 768 (62 per SM), a training
/// step: the layer norm's backward 741 us per step with a warp per row, 650 with 96 threads,
/// 634 with 128; its forward 529 / 533 / 480 us. Many rows keep the warp: H100, a causal softmax
/// over 98304 bf16 rows of 1024 (745 per SM), a warp per row 237 us, 64 threads 251, 128 266.
fn few_rows_block(rn: usize, groups: usize, xn: Option<usize>, sms: usize) -> Option<usize> {
    let few = xn.is_some_and(|xn| xn <= FEW_ROWS_PER_SM * sms);
    (few && groups > 32 && rn as i64 <= WARP_ROW_MAX).then(|| groups.next_power_of_two().min(128))
}

/// Most rows per SM for which [`few_rows_block`] gives short rows a block each.
const FEW_ROWS_PER_SM: usize = 128;

/// The largest power of two `<= limit` that divides `n` (`n = 0` counts as divisible).
fn largest_pow2_dividing(limit: usize, n: usize) -> usize {
    let mut v = 1;
    while v * 2 <= limit && n.is_multiple_of(v * 2) {
        v *= 2;
    }
    v
}
