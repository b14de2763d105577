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
//!
//! A helper that ran out of jobs lingers for [`LINGER`] before it gives its thread back to
//! rayon: it watches for the next run and joins it at once. A program that alternates short
//! serial steps with parallel ones (a row kernel, then a matrix product; tier 0's regions) would
//! otherwise wake a sleeping pool thread for each parallel step, which in a virtual machine
//! takes longer than a small product's share of work (measured: 64 x 256 x 256 f32 after a
//! 28 us layer norm took 63 us on two threads against 55 us on one; lingering, 39 us). While
//! it lingers the helper runs any rayon job that is queued meanwhile (`rayon::yield_now`), so
//! other users of the pool are not held back; like OpenMP's spinning threads, a lingering
//! helper keeps its core busy for at most [`LINGER`] after the last parallel step, and not at
//! all while the process has [`Background`] work (a compile) that wants the core.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a helper that ran out of jobs watches for the next run before it returns its
/// thread to rayon's pool (where it goes to sleep, and must be woken again).
pub const LINGER: Duration = Duration::from_micros(300);

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
    /// Helpers that may still join (the run's `helpers`), each taking one seat.
    seats: AtomicUsize,
}

// SAFETY: `job` points to a `Sync` closure, called only while the caller of `run` waits (see
// `help`); the rest is atomics.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    /// Takes one of the run's seats for a helper; `false` when the run has all it asked for.
    fn take_seat(&self) -> bool {
        self.seats.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| s.checked_sub(1)).is_ok()
    }

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

/// Background threads of the process doing work of their own now ([`Background`]).
static BACKGROUND: AtomicUsize = AtomicUsize::new(0);

/// When the latest [`Background`] span began: nanoseconds after [`epoch`].
static BACKGROUND_SINCE: AtomicU64 = AtomicU64::new(0);

/// How long into a [`Background`] span helpers leave their cores to it: a short compile (a
/// disk-cache hit, under a millisecond on a free core) finishes within it, and a long one
/// (a cold compile of tens of milliseconds, most of it in the C compiler) does not hold the
/// program's parallel steps back for its whole length.
pub const BACKGROUND_PRIORITY: Duration = Duration::from_millis(3);

/// The process's reference instant for [`BACKGROUND_SINCE`].
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Whether background work wants the cores now (a [`Background`] span open, begun less than
/// [`BACKGROUND_PRIORITY`] ago, and not waiting for another process).
fn background_wants_cores(now: Instant) -> bool {
    BACKGROUND.load(Ordering::Acquire) > 0
        && now.saturating_duration_since(epoch()).as_nanos() as u64
            <= BACKGROUND_SINCE.load(Ordering::Acquire) + BACKGROUND_PRIORITY.as_nanos() as u64
}

thread_local! {
    /// [`Background`] spans open on this thread.
    static IN_BACKGROUND: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks the calling thread's work as background work (a compile while the program runs on,
/// `coil_frontend::tiered`) until dropped: for its first [`BACKGROUND_PRIORITY`] no helper
/// lingers after its run, so that the background work gets the core the helper would have
/// spun on. (On the build machine, a
/// warm process's background compile of `examples/eager_shapes`' graph, a disk-cache hit,
/// takes under a millisecond on a free core, but with helpers lingering beside the program's
/// own thread on its two cores it did not finish within the 20 realizations it would serve.)
/// While the thread waits for a process it started ([`waiting`]: the C compiler, which runs
/// at a low priority for a tenth of a second and more) the mark is lifted.
pub struct Background(());

impl Background {
    /// Starts a span of background work.
    pub fn begin() -> Background {
        BACKGROUND_SINCE.store(Instant::now().saturating_duration_since(epoch()).as_nanos() as u64, Ordering::Release);
        BACKGROUND.fetch_add(1, Ordering::AcqRel);
        IN_BACKGROUND.with(|n| n.set(n.get() + 1));
        Background(())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        IN_BACKGROUND.with(|n| n.set(n.get() - 1));
        BACKGROUND.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The pool background work runs on (tier 0's background compiles, `coil_frontend::tiered`):
/// one thread of its own, at a lower scheduling priority (Linux: nice 10, which the C compiler
/// it starts inherits: a compile in the background must not take the cores from the program
/// it serves; a C compiler beside a matrix product on a 2-core machine halved the product's
/// speed, and a helper of the program's pool that the compile preempted in the middle of its
/// share of a product held the product back for a time slice). What such work runs in
/// parallel (a graph-cache hit builds its tile kernels with rayon) runs there in line, instead
/// of queueing for the program's pool, which the program keeps busy meanwhile: a warm hit of
/// `examples/eager_shapes`' graph took 1-5 ms so on the build machine, 0.6 ms in line. `None`
/// where no thread can start. [`super::prepare`] starts it.
pub fn background_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).thread_name(|_| "coil-background".into());
        // (a job's panic is its own to catch, as a background compile does; one that escapes
        // is reported rather than aborting the process, rayon's default for spawned jobs)
        let pool = pool.panic_handler(|_| eprintln!("coil: a background job panicked"));
        pool.start_handler(|_| lower_priority()).build().ok()
    })
    .as_ref()
}

/// Lowers the calling thread's scheduling priority (Linux: its nice value, 10), as the
/// [`background_pool`]'s thread runs.
pub fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        extern "C" {
            fn setpriority(which: i32, who: u32, prio: i32) -> i32;
        }
        // SAFETY: `setpriority(PRIO_PROCESS, 0, n)` sets the calling thread's nice value (a
        // per-thread attribute on Linux); it reads and writes no memory of ours.
        let _ = unsafe { setpriority(0, 0, 10) };
    }
}

/// `wait()`, the calling thread blocked on another process meanwhile: its [`Background`]
/// marks are lifted for the time (helpers linger again: the other process runs at its own
/// priority and is better served by the program's progress than by an idle core).
pub fn waiting<T>(wait: impl FnOnce() -> T) -> T {
    let marks = IN_BACKGROUND.with(|n| n.get());
    BACKGROUND.fetch_sub(marks, Ordering::AcqRel);
    let result = wait();
    BACKGROUND.fetch_add(marks, Ordering::AcqRel);
    result
}

/// The latest run posted for lingering helpers: a counter bumped at each post, the run, and
/// how many helpers linger now.
struct Board {
    posts: AtomicU64,
    run: Mutex<Option<Arc<Shared>>>,
    lingering: AtomicUsize,
}

static BOARD: Board = Board { posts: AtomicU64::new(0), run: Mutex::new(None), lingering: AtomicUsize::new(0) };

impl Board {
    /// Posts `run` for the helpers lingering now; returns how many were lingering.
    fn post(&self, run: &Arc<Shared>) -> usize {
        *self.run.lock().unwrap_or_else(|e| e.into_inner()) = Some(run.clone());
        self.posts.fetch_add(1, Ordering::AcqRel);
        self.lingering.load(Ordering::Acquire)
    }

    /// Takes the run posted on the board down if it is still `run` (so that a finished run's
    /// memory is not kept).
    fn retract(&self, run: &Arc<Shared>) {
        let mut posted = self.run.lock().unwrap_or_else(|e| e.into_inner());
        if posted.as_ref().is_some_and(|p| Arc::ptr_eq(p, run)) {
            *posted = None;
        }
    }
}

/// A helper's work: `first`'s jobs (if a seat is left), then every run posted while it
/// lingers, until [`LINGER`] passes with none. At most [`helpers`] linger at once (with the
/// caller, one thread per core of the pool: more would spin against each other and against
/// the caller for the cores).
fn helper(first: Arc<Shared>) {
    if first.take_seat() {
        first.help();
    }
    drop(first);
    let most = helpers();
    let joined = BOARD.lingering.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < most).then_some(n + 1));
    if joined.is_err() || background_wants_cores(Instant::now()) {
        if joined.is_ok() {
            BOARD.lingering.fetch_sub(1, Ordering::AcqRel);
        }
        return;
    }
    let mut seen = BOARD.posts.load(Ordering::Acquire);
    let mut until = Instant::now() + LINGER;
    let mut spins = 0u32;
    loop {
        let posts = BOARD.posts.load(Ordering::Acquire);
        if posts != seen {
            seen = posts;
            let run = BOARD.run.lock().unwrap_or_else(|e| e.into_inner()).clone();
            // (still counted as lingering while it helps: the next run is posted once this
            // one's jobs have finished, when this helper is back on the watch; counted out, it
            // would have the caller wake a sleeping pool thread for nothing)
            if let Some(run) = run.filter(|r| r.take_seat()) {
                run.help();
                until = Instant::now() + LINGER;
            }
            continue;
        }
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) {
            // other users of the pool first (a job queued meanwhile runs here), then the clock
            if let Some(rayon::Yield::Executed) = rayon::yield_now() {
                until = Instant::now() + LINGER;
            }
            let now = Instant::now();
            if now >= until || background_wants_cores(now) {
                break;
            }
        }
    }
    BOARD.lingering.fetch_sub(1, Ordering::AcqRel);
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
        seats: AtomicUsize::new(helpers),
    });
    // Helpers lingering after an earlier run join at once; pool threads are woken for the rest.
    let lingering = BOARD.post(&shared);
    for _ in 0..helpers.saturating_sub(lingering) {
        let first = shared.clone();
        rayon::spawn(move || helper(first));
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
    BOARD.retract(&shared);
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

    /// Background work wants the cores (no helper lingers) from the start of its span for
    /// BACKGROUND_PRIORITY, not while its thread waits for another process, and not after the
    /// span; jobs run either way. (Tests of other modules may open spans meanwhile: only
    /// `compiler` does, and it waits for a process inside them.)
    #[test]
    fn background_work_has_the_cores_for_a_while() {
        let background = Background::begin();
        assert!(background_wants_cores(Instant::now()), "at the start of a span");
        let marks = BACKGROUND.load(Ordering::Acquire);
        assert!(marks >= 1);
        assert_eq!(waiting(|| BACKGROUND.load(Ordering::Acquire)), marks - 1, "lifted while waiting");
        assert_eq!(BACKGROUND.load(Ordering::Acquire), marks, "restored after");
        assert!(!background_wants_cores(Instant::now() + BACKGROUND_PRIORITY * 2), "not past its priority");
        let sum = AtomicUsize::new(0);
        run(64, helpers().max(1), &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 64 * 63 / 2);
        drop(background);
        assert_eq!(IN_BACKGROUND.with(|n| n.get()), 0);
    }

    /// The background pool is one thread, at nice 10 or lower priority (Linux), on which rayon's parallel
    /// iterators run in line.
    #[test]
    fn the_background_pool_is_one_low_priority_thread() {
        let pool = background_pool().expect("a background thread");
        let (threads, nice, name) = pool.install(|| {
            #[cfg(target_os = "linux")]
            let nice = {
                extern "C" {
                    fn getpriority(which: i32, who: u32) -> i32;
                }
                // SAFETY: reads the calling thread's nice value; no memory.
                unsafe { getpriority(0, 0) }
            };
            #[cfg(not(target_os = "linux"))]
            let nice = 10;
            let name = std::thread::current().name().map(String::from);
            let ran_here: Vec<Option<String>> =
                (0..8).into_par_iter().map(|_| std::thread::current().name().map(String::from)).collect();
            assert!(ran_here.iter().all(|n| *n == name), "in line: {ran_here:?}");
            (rayon::current_num_threads(), nice, name)
        });
        // (at least 10: a process started at a lower priority stays there)
        assert_eq!((threads, name.as_deref()), (1, Some("coil-background")));
        assert!(nice >= 10, "nice {nice}");
        assert!(std::ptr::eq(pool, background_pool().expect("the same")));
        // A job that panics is reported; the process and the pool go on.
        let (done, ran) = std::sync::mpsc::channel();
        pool.spawn(|| panic!("a background job's panic (expected by this test)"));
        pool.spawn(move || done.send(()).expect("the test waits"));
        ran.recv_timeout(Duration::from_secs(10)).expect("the pool runs jobs after a panic");
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
