//! Running a generated kernel on the thread pool.
//!
//! The generated C has no threads of its own (`coil_codegen::c`): every kernel takes the range
//! of `xindex` a call computes. A small launch (fewer than [`PARALLEL_MIN_ELEMENTS`] elements,
//! `xnumel * rnumel`) is one call on the calling thread; waking other threads would cost more
//! than the work. A larger one is split into ranges of whole rows, at most
//! [`CHUNKS_PER_THREAD`] per thread of rayon's pool, the pool the matrix products (`gemm`) run
//! on too: one pool, so kernel threads never spin against product threads for the cores (with
//! OpenMP's team beside rayon's, on 2 cores, the GPT-2 block ran 20.9 ms instead of 14.6).
//! Several ranges per thread let a thread that the OS preempted hold back one small range
//! rather than half the launch. Each range has its own status words; the first range (in
//! `xindex` order) that failed names the error, so which error is reported does not depend on
//! the threads' timing.

use super::module::Kernel;
use rayon::prelude::*;

/// Below this many elements a launch runs in one call on the calling thread.
pub const PARALLEL_MIN_ELEMENTS: i64 = 1 << 15;

/// Ranges per pool thread of a parallel launch (each at least half of
/// [`PARALLEL_MIN_ELEMENTS`] elements).
pub const CHUNKS_PER_THREAD: i64 = 4;

/// Pointwise ranges start at multiples of this many elements, so the vector loops of all but
/// the first range begin on a cache line.
const ALIGN: i64 = 16;

/// The argument pointers of one launch, shared by the threads running its ranges.
struct Args<'a>(&'a [*mut u8]);

impl<'a> Args<'a> {
    /// The pointers (a method, so that closures capture the `Sync` wrapper, not the field).
    fn get(&self) -> &'a [*mut u8] {
        self.0
    }
}

// SAFETY: the pointers address the launch's buffers, which outlive it; ranges of `xindex` write
// disjoint elements (each index computes its own output elements, as every kernel is
// generated), and inputs are only read.
unsafe impl Send for Args<'_> {}
unsafe impl Sync for Args<'_> {}

/// Calls `kernel` over `0..xnumel` (`rnumel` elements per index: 1 for a pointwise kernel)
/// with `args` (the buffers, then the sizes and random-stream pointers), in one call or in
/// parallel ranges, and returns the status words of the first range that failed (all zeros
/// when none did).
///
/// # Safety
/// As [`Kernel::call`]: `args` must be the kernel's buffers (live, of the sizes it was generated
/// for at this launch's size values) followed by the pointers to those values and to its
/// random-stream words.
pub unsafe fn launch(kernel: &Kernel, args: &[*mut u8], xnumel: i64, rnumel: i64) -> [i64; 4] {
    let threads = rayon::current_num_threads() as i64;
    let total = xnumel.saturating_mul(rnumel.max(1));
    if threads <= 1 || xnumel < 2 || total < PARALLEL_MIN_ELEMENTS {
        // SAFETY: the caller's contract.
        return unsafe { call_range(kernel, args, 0, xnumel) };
    }
    let chunks = (total / (PARALLEL_MIN_ELEMENTS / 2)).min(CHUNKS_PER_THREAD * threads).min(xnumel).max(2);
    let align = if rnumel <= 1 && xnumel >= chunks * ALIGN { ALIGN } else { 1 };
    let bound = |c: i64| if c == chunks { xnumel } else { (xnumel * c / chunks) / align * align };
    let shared = Args(args);
    let statuses: Vec<[i64; 4]> = (0..chunks as usize)
        .into_par_iter()
        .with_max_len(1)
        // SAFETY: the caller's contract, for disjoint sub-ranges of the launch.
        .map(|c| unsafe { call_range(kernel, shared.get(), bound(c as i64), bound(c as i64 + 1)) })
        .collect();
    statuses.into_iter().find(|s| s[0] != 0).unwrap_or([0; 4])
}

/// One call of `kernel` over `start..end`; its status words.
///
/// # Safety
/// As [`launch`].
unsafe fn call_range(kernel: &Kernel, args: &[*mut u8], start: i64, end: i64) -> [i64; 4] {
    let range = [start, end];
    let mut with_range = Vec::with_capacity(args.len() + 1);
    with_range.extend_from_slice(args);
    with_range.push(range.as_ptr() as *mut u8);
    let mut status = [0i64; 4];
    // SAFETY: the caller's contract; `range` outlives the call.
    unsafe { kernel.call(&with_range, &mut status) };
    status
}
