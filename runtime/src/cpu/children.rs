//! The C compiler runs this process starts do not outlive it.
//!
//! Tier 0's background compiles (`coil_frontend::tiered`) run the C compiler on a worker
//! thread; a program that ends meanwhile (its realizations ran on tier 0 and did not wait)
//! would leave the compiler and its own children (`cc1`, the assembler, the linker) running,
//! writing into the kernel cache after the program is gone. So each run is made the leader of
//! a process group of its own ([`contain`]), registered while it runs ([`Running`]), and at
//! the process's exit (`exit`, or the return from `main`) every group still registered is
//! killed. (A process killed by a signal runs no exit handler; asking the kernel to kill the
//! child with its parent, `PR_SET_PDEATHSIG`, takes a `pre_exec` hook, which makes the
//! standard library fork the whole process instead of `posix_spawn`: copying its page tables
//! stalled the program's other threads, and a background compile started during
//! `examples/eager_shapes`' first pass made it 30% slower.) A half-written output is a
//! temporary file the cache never serves.

use std::process::Command;
use std::sync::{Mutex, Once};

/// Process groups of compiler runs in progress.
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

#[cfg(unix)]
extern "C" {
    fn atexit(callback: extern "C" fn()) -> i32;
    fn kill(pid: i32, signal: i32) -> i32;
}

/// `SIGKILL` on Linux and the BSDs.
#[cfg(unix)]
const SIGKILL: i32 = 9;

/// Makes the process `cmd` starts the leader of a new process group (its children join it).
pub fn contain(cmd: &mut Command) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    #[cfg(not(unix))]
    let _ = cmd;
}

/// A compiler run in progress (the process group its leader `pid` heads, see [`contain`]):
/// killed if the process exits while it is registered; unregistered when dropped.
pub struct Running(u32);

impl Running {
    /// Registers the group of `pid`, a process started with [`contain`].
    pub fn register(pid: u32) -> Running {
        static HOOK: Once = Once::new();
        #[cfg(unix)]
        HOOK.call_once(|| {
            // SAFETY: registers a plain function with the C library; it runs at exit.
            unsafe { atexit(kill_running) };
        });
        #[cfg(not(unix))]
        HOOK.call_once(|| {});
        RUNNING.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
        Running(pid)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = running.iter().position(|&p| p == self.0) {
            running.swap_remove(i);
        }
    }
}

/// The exit handler: kills every registered group. (A thread that holds the list for the
/// moment of a push or a removal is waited for; a poisoned list is still read.)
#[cfg(unix)]
extern "C" fn kill_running() {
    let running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    for &pid in running.iter() {
        if let Ok(pid) = i32::try_from(pid) {
            // SAFETY: signals the process group `pid` leads (a compiler run of ours); no memory.
            unsafe { kill(-pid, SIGKILL) };
        }
    }
}
