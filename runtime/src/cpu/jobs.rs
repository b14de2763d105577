//! Parallel jobs shared by the calling thread and rayon's pool, the one pool of the CPU backend
//! (generated kernels' launches, [`super::launch`], and matrix products, [`super::gemm_packed`],
//! run on it: with a second team beside it the two would spin against each other for the
//! cores).
//!
//! The calling thread computes jobs too: it hands one helper per other pool thread to rayon
//! (`rayon::spawn`) and takes jobs from a shared counter with them, so the work starts at once
//! instead of after a sleeping worker wakes (tens of microseconds in a virtual machine), and
//! ends when the last job does, without waking the caller. A helper that starts after the jobs
//! ran out returns without calling anything; the caller waits only for jobs already taken. So
//! a parallel run is never much slower than the same jobs run one after another by the caller,
//! however late the helpers come (rayon's `par_iter` from a thread outside the pool instead
//! queues every job and puts the caller to sleep until a worker has finished them).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// A job function with its borrow's lifetime erased (see [`run`]'s safety argument).
type ErasedJob = *const (dyn Fn(usize) + Sync + 'static);

/// One parallel run, shared by the caller and its helpers (`'static` for `rayon::spawn`).
struct Shared {
    job: ErasedJob,
    jobs: usize,
    /// The next job to take.
    next: AtomicUsize,
    /// Jobs finished.
    done: AtomicUsize,
    /// Whether a job panicked (the caller panics once every taken job has finished).
    panicked: AtomicBool,
}

// SAFETY: `job` points to a `Sync` closure, called only while the caller of `run` waits (see
// `help`); the rest is atomics.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    /// Takes and runs jobs until none is left.
    fn help(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= self.jobs {
                return;
            }
            // SAFETY: job `i` was taken and is not yet counted in `done`, so the caller of `run`
            // is still waiting and the closure it lent is alive.
            let job = unsafe { &*self.job };
            if catch_unwind(AssertUnwindSafe(|| job(i))).is_err() {
                self.panicked.store(true, Ordering::Release);
            }
            self.done.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Pool threads other than the caller's share: one helper per other thread of rayon's pool.
pub fn helpers() -> usize {
    rayon::current_num_threads().saturating_sub(1)
}

/// Calls `job(i)` for every `i` in `0..jobs`, each once, on the calling thread and on up to
/// `helpers` pool threads, jobs taken in order of `i`; returns when all have finished. Jobs
/// may wait for jobs of smaller `i` (each of those was taken by a thread that is running it).
/// With no helper (or one job) the caller runs them in order.
///
/// ```
/// use coil_runtime::cpu::jobs;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// let sum = AtomicUsize::new(0);
/// jobs::run(100, jobs::helpers(), &|i| {
///     sum.fetch_add(i, Ordering::Relaxed);
/// });
/// assert_eq!(sum.into_inner(), 4950);
/// ```
///
/// # Panics
/// If a job panicked (after every other taken job has finished).
pub fn run(jobs: usize, helpers: usize, job: &(dyn Fn(usize) + Sync)) {
    let helpers = helpers.min(jobs.saturating_sub(1));
    if helpers == 0 {
        (0..jobs).for_each(job);
        return;
    }
    // SAFETY: only the lifetime changes. Helpers call `job` only for a job they took, and this
    // function returns only once every job was taken and has finished (`done == jobs`); a
    // helper starting later finds none left and never touches `job`.
    let job: ErasedJob = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), ErasedJob>(job) };
    let shared = Arc::new(Shared {
        job,
        jobs,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
    });
    for _ in 0..helpers {
        let helper = shared.clone();
        rayon::spawn(move || helper.help());
    }
    shared.help();
    // Jobs other threads took and have not finished: short waits (a job is a fraction of the
    // run), so spin, then give the core away.
    let mut spins = 0u32;
    while shared.done.load(Ordering::Acquire) < jobs {
        if spins < 1 << 12 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
    if shared.panicked.load(Ordering::Acquire) {
        panic!("a parallel job panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::sync::Mutex;

    /// Every job runs once, from the pool's threads and from others at once, with jobs that
    /// wait for earlier ones.
    #[test]
    fn every_job_runs_once_and_waits_see_earlier_jobs_done() {
        let check = |_: usize| {
            let counts: Vec<AtomicUsize> = (0..257).map(|_| AtomicUsize::new(0)).collect();
            let first_done = AtomicBool::new(false);
            run(counts.len(), helpers().max(1), &|i| {
                if i == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    first_done.store(true, Ordering::Release);
                } else {
                    while !first_done.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                }
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
            counts.iter().all(|c| c.load(Ordering::Relaxed) == 1)
        };
        let from_pool: Vec<bool> = (0..4).into_par_iter().map(check).collect();
        let from_threads: Vec<bool> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3).map(|i| s.spawn(move || check(i))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(from_pool.iter().chain(&from_threads).all(|&ok| ok));
    }

    #[test]
    fn without_helpers_the_caller_runs_the_jobs_in_order() {
        let order = Mutex::new(Vec::new());
        run(5, 0, &|i| order.lock().unwrap().push(i));
        assert_eq!(order.into_inner().unwrap(), vec![0, 1, 2, 3, 4]);
        run(0, 3, &|_| panic!("no job"));
    }

    #[test]
    fn a_panicking_job_panics_the_caller_after_the_others() {
        let done = AtomicUsize::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            run(16, 1, &|i| {
                if i == 3 {
                    panic!("job 3");
                }
                done.fetch_add(1, Ordering::Relaxed);
            })
        }));
        assert!(result.is_err());
        assert_eq!(done.load(Ordering::Relaxed), 15);
    }
}
