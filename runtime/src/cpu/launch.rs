//! Running a generated kernel on the thread pool.
//!
//! The generated C has no threads of its own (`coil_codegen::c`): every kernel takes the range
//! of `xindex` a call computes. A small launch (fewer than [`PARALLEL_MIN_ELEMENTS`] elements,
//! `xnumel * rnumel`, or [`PARALLEL_MIN_REDUCED`] for a reduction) is one call on the calling
//! thread; waking other threads would cost more than the work. A larger one is split into ranges of whole rows, at most
//! [`CHUNKS_PER_THREAD`] per thread of rayon's pool, run as [`super::jobs`] (the calling thread
//! and the pool's other threads take ranges from a shared counter; the pool the matrix products
//! run on too: on 2 cores, with OpenMP's team beside rayon's, the GPT-2 block ran 20.9 ms
//! instead of 14.6). Several ranges per thread let a thread that the OS preempted hold back one
//! small range rather than half the launch. Each range has its own status words; the first
//! range (in `xindex` order) that failed names the error, so which error is reported does not
//! depend on the threads' timing.

use super::jobs;
use super::module::Kernel;
use std::sync::Mutex;

/// Below this many elements a launch runs in one call on the calling thread.
pub const PARALLEL_MIN_ELEMENTS: i64 = 1 << 15;

/// [`PARALLEL_MIN_ELEMENTS`] for a reduction's launch (`rnumel > 1`): its rows cost more an
/// element (a layer norm with an erf GELU, 1.3 ns on the build machine, against a few tenths
/// for the usual pointwise kernel), and a pool thread lingering after the last parallel step
/// (`jobs::LINGER`) joins at once: the steady-state layer norm of `examples/eager_shapes`
/// (64 x 256) runs in parts from 21 to about 12 us.
pub const PARALLEL_MIN_REDUCED: i64 = 1 << 13;

/// Ranges per pool thread of a parallel launch (each at least half of
/// [`PARALLEL_MIN_ELEMENTS`] elements).
pub const CHUNKS_PER_THREAD: i64 = 4;

/// Pointwise ranges start at multiples of this many elements, so the vector loops of all but
/// the first range begin on a cache line.
const ALIGN: i64 = 16;

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
    let min = if rnumel > 1 { PARALLEL_MIN_REDUCED } else { PARALLEL_MIN_ELEMENTS };
    if threads <= 1 || xnumel < 2 || total < min {
        // SAFETY: the caller's contract.
        return unsafe { call_range(kernel, args, 0, xnumel) };
    }
    let chunks = (total / (min / 2)).min(CHUNKS_PER_THREAD * threads).min(xnumel).max(2);
    let align = if rnumel <= 1 && xnumel >= chunks * ALIGN { ALIGN } else { 1 };
    // The start of range `c` (`xnumel` for `c == chunks`).
    let bound = |c: i64| if c == chunks { xnumel } else { (xnumel * c / chunks) / align * align };
    // Addresses as integers, so that the ranges run on other threads (`jobs::run` returns only
    // after every range has finished).
    let addresses: Vec<usize> = args.iter().map(|&p| p as usize).collect();
    let statuses = Mutex::new(vec![[0i64; 4]; chunks as usize]);
    jobs::run(chunks as usize, jobs::helpers(), &|c| {
        let c = c as i64;
        let args: Vec<*mut u8> = addresses.iter().map(|&a| a as *mut u8).collect();
        // SAFETY: the launch's contract, for a sub-range of it taken once.
        let status = unsafe { call_range(kernel, &args, bound(c), bound(c + 1)) };
        if status[0] != 0 {
            statuses.lock().unwrap_or_else(|e| e.into_inner())[c as usize] = status;
        }
    });
    let statuses = statuses.into_inner().unwrap_or_else(|e| e.into_inner());
    statuses.iter().copied().find(|s| s[0] != 0).unwrap_or([0; 4])
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

#[cfg(test)]
mod tests {
    use super::super::module;
    use super::super::tests::TempDir;
    use super::*;
    use rayon::prelude::*;

    /// Launches from several threads at once, pool threads among them (a launch inside a
    /// parallel job): each computes every index of its own buffer once, and none waits on the
    /// others' helpers.
    #[test]
    fn launches_from_pool_threads_and_others_at_once() {
        let Some(cc) = super::super::tests::cc() else { return };
        const SRC: &str = "#include <stdint.h>
void k(char *const *args, int64_t *status) {
    int32_t *out = (int32_t *)args[0];
    const int64_t *r = (const int64_t *)args[3];
    (void)status;
    for (int64_t x = r[0]; x < r[1]; x++) out[x] += (int32_t)(x % 7) + 1;
}
";
        let dir = TempDir::new("launches");
        let (lib, _) = module::load_or_build(cc, SRC, &dir.0, &["k"]).unwrap();
        let kernel = lib.kernel("k").unwrap();
        let n = 100_003i64;
        let run = |_: usize| {
            let mut out = vec![0i32; n as usize];
            for _ in 0..3 {
                let args = [out.as_mut_ptr() as *mut u8, std::ptr::null_mut(), std::ptr::null_mut()];
                // SAFETY: `out` has `n` elements; the kernel reads no sizes or random words.
                assert_eq!(unsafe { launch(&kernel, &args, n, 1) }, [0; 4]);
            }
            out.iter().enumerate().all(|(x, &v)| v == 3 * ((x % 7) as i32 + 1))
        };
        let from_pool: Vec<bool> = (0..6).into_par_iter().map(run).collect();
        let from_threads: Vec<bool> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3).map(|i| s.spawn(move || run(i))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(from_pool.iter().chain(&from_threads).all(|&ok| ok));
    }
}
