//! What the bench reads of its own process on Linux: page faults, and its children's CPU time.

/// Minor page faults of this process so far (`/proc/self/stat`), `None` where there is none.
pub fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // after the command name (in parentheses, which may hold spaces): state, ppid, pgrp, session,
    // tty, tpgid, flags, then minflt
    stat.rsplit_once(')')?.1.split_whitespace().nth(7)?.parse().ok()
}

/// CPU seconds (user + system) of the child processes this process has waited for so far
/// (`getrusage(RUSAGE_CHILDREN)`): around a cold compile, its C compiler runs' own time,
/// without the time they waited for a core. `None` off Linux or if the call fails.
pub fn children_cpu_seconds() -> Option<f64> {
    #[cfg(target_os = "linux")]
    {
        use std::os::raw::c_long;
        /// Linux's `struct rusage`: two `timeval`s (seconds, microseconds), then 14 counters.
        #[repr(C)]
        struct Rusage {
            user: [c_long; 2],
            system: [c_long; 2],
            counters: [c_long; 14],
        }
        extern "C" {
            fn getrusage(who: i32, usage: *mut Rusage) -> i32;
        }
        const RUSAGE_CHILDREN: i32 = -1;
        let mut u = Rusage { user: [0; 2], system: [0; 2], counters: [0; 14] };
        // SAFETY: `getrusage` writes one `struct rusage`, whose layout `Rusage` is, into `u`.
        if unsafe { getrusage(RUSAGE_CHILDREN, &mut u) } != 0 {
            return None;
        }
        let secs = |t: [c_long; 2]| t[0] as f64 + t[1] as f64 * 1e-6;
        Some(secs(u.user) + secs(u.system))
    }
    #[cfg(not(target_os = "linux"))]
    None
}
