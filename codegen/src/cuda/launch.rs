//! The launch heuristic: block size, elements per thread and rows per block of each kernel, in
//! one place ([`plan`]).
//!
//! The numbers aim at H100-class GPUs (132 SMs, 2048 threads per SM), where memory-bound
//! kernels need 16-byte accesses, coalesced across the warp, and a few of them in flight per
//! thread.

use super::Launch;
use coil_ir::kernel::{KernelKind, TileKernel};

/// Threads per block of pointwise kernels: 8 warps, so that 8 blocks fill an SM and a block's
/// tail wastes little.
pub const POINTWISE_BLOCK: usize = 256;
/// Streaming multiprocessors of an H100 SXM; only used to keep enough blocks in flight.
pub const TARGET_SMS: usize = 132;
/// Widest access of one thread, in bytes (`LDG.128`).
pub const MAX_ACCESS_BYTES: usize = 16;
/// Rows up to this long get one warp each in a persistent reduction; longer rows a block.
pub const WARP_ROW_MAX: i64 = 256;
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
}

impl Plan {
    /// Warps per row: the size of the shared-memory stage of a block reduction.
    pub fn warps_per_row(&self) -> usize {
        (self.lanes / 32).max(1)
    }
}

/// The smallest element size among the kernel's buffers: it decides how many elements make a
/// 16-byte access.
fn min_elem_bytes(k: &TileKernel) -> usize {
    k.args.iter().map(|a| a.dtype.size_bytes()).min().unwrap_or(4).max(1)
}

/// Chooses the launch of a (non-extern) kernel with `xnumel` outputs or rows of `rnumel`.
///
/// * **Pointwise**: `vec` = one 16-byte access of the narrowest buffer (at least 4, at most
///   8 elements: 4 for f32, 8 for f16/bf16, 4 for f64 as two accesses); blocks of 256
///   threads (fewer, in whole warps, for tiny kernels); enough blocks for every group.
/// * **Persistent reduction**: rows up to [`WARP_ROW_MAX`] get one warp (and a block holds up
///   to 8 rows, fewer while that leaves under two blocks per SM); longer rows get a block of
///   64..256 threads (whole warps) sized for about two groups per thread. `vec` divides the row, so a
///   group lies wholly inside it or outside.
/// * **Looped reduction**: one block per row, 256..1024 threads sized for about four groups
///   per thread per pass.
pub fn plan(k: &TileKernel, xnumel: i64, rnumel: i64) -> Plan {
    let xn = xnumel.max(0) as usize;
    let rn = rnumel.max(0) as usize;
    let access = (MAX_ACCESS_BYTES / min_elem_bytes(k)).clamp(1, 8);
    match k.kind {
        KernelKind::Pointwise | KernelKind::Extern => {
            let vec = access.max(4);
            let groups = xn.div_ceil(vec).max(1);
            let block = groups.next_multiple_of(32).min(POINTWISE_BLOCK);
            let grid = groups.div_ceil(block).min(MAX_GRID);
            Plan { launch: launch(grid, block), vec, lanes: 1, rows_per_block: 1, chunks: 1 }
        }
        KernelKind::PersistentReduction => {
            let mut vec = largest_pow2_dividing(access, rn);
            let lanes = if rnumel <= WARP_ROW_MAX {
                // No wider groups than keep all 32 lanes busy.
                while vec > 1 && vec * 32 > rn {
                    vec /= 2;
                }
                32
            } else {
                // Whole warps for about two groups each, so that few lanes idle.
                (rn / vec).div_ceil(2).next_multiple_of(32).clamp(64, 256)
            };
            let chunks = (rn / vec).div_ceil(lanes);
            let mut rows = if lanes == 32 { 8 } else { 1 };
            while rows > 1 && xn.div_ceil(rows) < 2 * TARGET_SMS {
                rows /= 2;
            }
            let grid = xn.div_ceil(rows).min(MAX_GRID);
            Plan { launch: launch(grid, lanes * rows), vec, lanes, rows_per_block: rows, chunks }
        }
        KernelKind::LoopedReduction => {
            let vec = largest_pow2_dividing(access, rn);
            let lanes = (rn / vec / 4).next_power_of_two().clamp(256, 1024);
            Plan { launch: launch(xn.min(MAX_GRID), lanes), vec, lanes, rows_per_block: 1, chunks: 1 }
        }
    }
}

fn launch(grid: usize, block: usize) -> Launch {
    // Shared memory is static (`__shared__` arrays sized at generation), so none is dynamic.
    Launch { grid: grid.max(1) as u32, block: block as u32, shared_bytes: 0 }
}

/// The largest power of two `<= limit` that divides `n` (`n = 0` counts as divisible).
fn largest_pow2_dividing(limit: usize, n: usize) -> usize {
    let mut v = 1;
    while v * 2 <= limit && n.is_multiple_of(v * 2) {
        v *= 2;
    }
    v
}
