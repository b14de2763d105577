//! Where the host's time goes around the device's work: coil's per-call overhead by phase.
//!
//! A compiled function's call, or a realize, costs host time before its kernels run: walking
//! the lazy nodes (capture), finding the cached compilation (hash, structural comparison,
//! guards of symbolic sizes), differentiating (`value_and_grad`), and running (binding inputs,
//! allocating, enqueueing launches). [`host_times`] reads this thread's cumulative times;
//! subtract two readings ([`HostTimes::since`]) to time a stretch of a program.
//! [`crate::dynamo::CallStats::host`] holds the same for one compiled function's calls.
//!
//! ```
//! use coil_frontend::{profile::host_times, Tensor};
//! let before = host_times();
//! let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
//! x.exp().unwrap().realize().unwrap();
//! let spent = host_times().since(&before);
//! assert_eq!(spent.graphs, 1);
//! ```

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Host time by phase (cumulative, this thread).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostTimes {
    /// Graphs captured and run (realize, compiled functions, in-place updates).
    pub graphs: u64,
    /// Walking the lazy nodes behind the requested values, and building the graph where it is
    /// not a cached one.
    pub capture: Duration,
    /// Structural hashing of captured graphs (only when the graph is not the one expected).
    pub hash: Duration,
    /// Comparing a capture with a cached graph node by node (the structural guard).
    pub confirm: Duration,
    /// Evaluating the size guards of graphs compiled for symbolic sizes.
    pub guards: Duration,
    /// Compiling (cache misses), disk cache included.
    pub compile: Duration,
    /// Running compiled graphs, host side: binding inputs, allocating outputs, enqueueing the
    /// launches (on the CPU backend also executing them); the interpreter's runs too.
    pub run: Duration,
    /// `grad` / `value_and_grad`: capturing the forward graph, differentiating it (or finding it
    /// differentiated), and recording the result as lazy tensors.
    pub differentiate: Duration,
    /// Forward graphs decomposed and differentiated.
    pub differentiations: u64,
    /// Forward graphs found differentiated in a compiled function's cache.
    pub differentiation_hits: u64,
}

impl HostTimes {
    /// What was spent between `earlier` and this reading.
    pub fn since(&self, earlier: &HostTimes) -> HostTimes {
        HostTimes {
            graphs: self.graphs - earlier.graphs,
            capture: self.capture - earlier.capture,
            hash: self.hash - earlier.hash,
            confirm: self.confirm - earlier.confirm,
            guards: self.guards - earlier.guards,
            compile: self.compile - earlier.compile,
            run: self.run - earlier.run,
            differentiate: self.differentiate - earlier.differentiate,
            differentiations: self.differentiations - earlier.differentiations,
            differentiation_hits: self.differentiation_hits - earlier.differentiation_hits,
        }
    }

    /// Adds `other` to this one.
    pub fn add(&mut self, other: &HostTimes) {
        self.graphs += other.graphs;
        self.capture += other.capture;
        self.hash += other.hash;
        self.confirm += other.confirm;
        self.guards += other.guards;
        self.compile += other.compile;
        self.run += other.run;
        self.differentiate += other.differentiate;
        self.differentiations += other.differentiations;
        self.differentiation_hits += other.differentiation_hits;
    }
}

thread_local! {
    static TIMES: Cell<HostTimes> = Cell::new(HostTimes::default());
}

/// This thread's cumulative host times.
pub fn host_times() -> HostTimes {
    TIMES.with(|t| t.get())
}

/// Changes this thread's times.
pub(crate) fn record(f: impl FnOnce(&mut HostTimes)) {
    TIMES.with(|t| {
        let mut times = t.get();
        f(&mut times);
        t.set(times);
    })
}

/// The time since `start`, added to the phase `f` picks.
pub(crate) fn spent(start: Instant, phase: impl FnOnce(&mut HostTimes) -> &mut Duration) {
    let d = start.elapsed();
    record(|t| *phase(t) += d);
}
