//! The CUDA graphs' private pool: which device blocks captured graphs hold.
//!
//! A captured graph has the addresses of every buffer its launches touch baked in: its
//! outputs, its temporaries, the scratch blocks a library call gathers operands into. So a
//! block handed out while a graph is being captured belongs to that graph for as long as the
//! graph may be replayed: it must never be handed to anyone else, even after its holder drops
//! it (the temporaries are dropped before the capture even ends). During the capture, blocks
//! the capturing thread frees go to the capture's own free list (reusing them within the graph
//! is safe: the graph runs its launches in order); when it ends they become *retained*. A
//! retained block goes back to the allocator's cache when its graph is gone and no handle
//! ([`super::super::DeviceMemory`]) holds it (a graph's outputs are shared with the caller).
//!
//! Plain bookkeeping over addresses (tested without a GPU); the allocator
//! ([`super::super::memory`]) owns the memory and the counters.

use cudarc::driver::sys::CUdeviceptr;
use std::collections::HashMap;
use std::thread::ThreadId;

/// A block a graph holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Retained {
    class: usize,
    /// Handles holding it.
    holders: usize,
    /// Whether its graph still exists.
    graph: bool,
}

/// The capture in progress: its thread, the blocks handed out to it (with their holders), and
/// the ones freed since (to be handed out again only to it).
#[derive(Debug)]
struct Session {
    thread: ThreadId,
    blocks: HashMap<CUdeviceptr, (usize, usize)>,
    free: HashMap<usize, Vec<CUdeviceptr>>,
}

/// The blocks of captures in progress and of captured graphs on one device.
#[derive(Debug, Default)]
pub(crate) struct GraphPools {
    session: Option<Session>,
    retained: HashMap<CUdeviceptr, Retained>,
}

impl GraphPools {
    /// The capture in progress, if the calling thread is the one capturing.
    fn mine(&mut self) -> Option<&mut Session> {
        let me = std::thread::current().id();
        self.session.as_mut().filter(|s| s.thread == me)
    }

    /// Starts recording the blocks the calling thread is handed. An error when a capture is in
    /// progress already (one at a time per device).
    pub(crate) fn begin(&mut self) -> Result<(), String> {
        if self.session.is_some() {
            return Err("another CUDA graph is being captured on this device".into());
        }
        let thread = std::thread::current().id();
        self.session = Some(Session { thread, blocks: HashMap::new(), free: HashMap::new() });
        Ok(())
    }

    /// A block of `class` bytes the capture freed, for the capturing thread.
    pub(crate) fn reuse(&mut self, class: usize) -> Option<CUdeviceptr> {
        let session = self.mine()?;
        let ptr = session.free.get_mut(&class).and_then(Vec::pop)?;
        session.blocks.get_mut(&ptr).expect("a block of the capture").1 += 1;
        Some(ptr)
    }

    /// Records a block just handed out (from the cache or the driver): the capture's, when the
    /// calling thread is capturing.
    pub(crate) fn handed_out(&mut self, ptr: CUdeviceptr, class: usize) {
        if let Some(session) = self.mine() {
            session.blocks.insert(ptr, (class, 1));
        }
    }

    /// A handle dropped its block: `true` when the block goes back to the allocator's cache,
    /// `false` when a capture or a graph keeps it.
    pub(crate) fn give_back(&mut self, ptr: CUdeviceptr, class: usize) -> bool {
        if let Some(session) = self.mine() {
            if let Some((_, holders)) = session.blocks.get_mut(&ptr) {
                *holders -= 1;
                if *holders == 0 {
                    session.free.entry(class).or_default().push(ptr);
                }
                return false;
            }
        }
        let Some(r) = self.retained.get_mut(&ptr) else { return true };
        r.holders -= 1;
        if r.holders > 0 || r.graph {
            return false;
        }
        self.retained.remove(&ptr);
        true
    }

    /// Ends the capture: its blocks are retained by the graph captured, whose list this is.
    pub(crate) fn end(&mut self) -> Vec<(CUdeviceptr, usize)> {
        let Some(session) = self.session.take() else { return vec![] };
        let mut blocks: Vec<(CUdeviceptr, usize)> = Vec::with_capacity(session.blocks.len());
        for (ptr, (class, holders)) in session.blocks {
            self.retained.insert(ptr, Retained { class, holders, graph: true });
            blocks.push((ptr, class));
        }
        blocks.sort_unstable();
        blocks
    }

    /// Abandons the capture (it failed): the blocks nobody holds go back to the cache (this
    /// list); the others are plain blocks again.
    pub(crate) fn abort(&mut self) -> Vec<(CUdeviceptr, usize)> {
        let Some(session) = self.session.take() else { return vec![] };
        let mut free: Vec<(CUdeviceptr, usize)> =
            session.blocks.into_iter().filter(|(_, (_, holders))| *holders == 0).map(|(p, (c, _))| (p, c)).collect();
        free.sort_unstable();
        free
    }

    /// A graph is gone: its blocks that no handle holds go back to the cache (this list); the
    /// others go back when their last handle drops them.
    pub(crate) fn release(&mut self, blocks: &[(CUdeviceptr, usize)]) -> Vec<(CUdeviceptr, usize)> {
        let mut free = Vec::new();
        for &(ptr, class) in blocks {
            let Some(r) = self.retained.get_mut(&ptr) else { continue };
            r.graph = false;
            if r.holders == 0 {
                self.retained.remove(&ptr);
                free.push((ptr, class));
            }
        }
        free
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_freed_during_a_capture_are_reused_only_by_it_then_kept_for_the_graph() {
        let mut p = GraphPools::default();
        p.handed_out(0x100, 512); // before the capture: a plain block
        p.begin().unwrap();
        assert!(p.begin().is_err(), "one capture at a time");
        p.handed_out(0x200, 512); // an output, held to the end
        p.handed_out(0x300, 1024); // a temporary, dropped during the capture
        assert!(!p.give_back(0x300, 1024), "kept for the capture");
        assert_eq!(p.reuse(512), None);
        assert_eq!(p.reuse(1024), Some(0x300), "the capture reuses its own block");
        assert!(!p.give_back(0x300, 1024));
        assert!(p.give_back(0x100, 512), "a block from before the capture is the cache's");
        let blocks = p.end();
        assert_eq!(blocks, vec![(0x200, 512), (0x300, 1024)]);
        assert_eq!(p.reuse(1024), None, "no capture: the graph's blocks are nobody else's");
        // The output's handle drops: the graph still holds the block.
        assert!(!p.give_back(0x200, 512));
        // The graph goes: both blocks are free (no handle holds them).
        assert_eq!(p.release(&blocks), vec![(0x200, 512), (0x300, 1024)]);
        assert!(p.give_back(0x200, 512), "an unknown block is the cache's");
    }

    #[test]
    fn a_block_still_held_when_its_graph_goes_returns_with_its_handle() {
        let mut p = GraphPools::default();
        p.begin().unwrap();
        p.handed_out(0x200, 512);
        let blocks = p.end();
        assert_eq!(p.release(&blocks), vec![], "held");
        assert!(p.give_back(0x200, 512), "its handle returns it");
    }

    #[test]
    fn an_abandoned_capture_gives_back_what_nobody_holds() {
        let mut p = GraphPools::default();
        p.begin().unwrap();
        p.handed_out(0x200, 512);
        p.handed_out(0x300, 512);
        assert!(!p.give_back(0x300, 512));
        assert_eq!(p.abort(), vec![(0x300, 512)]);
        assert!(p.give_back(0x200, 512), "a plain block again");
        assert!(p.begin().is_ok());
    }

    #[test]
    fn another_threads_blocks_are_not_the_captures() {
        let mut p = GraphPools::default();
        p.begin().unwrap();
        // The capture is this thread's: what another thread is handed and drops is the cache's.
        let p = std::sync::Mutex::new(p);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut p = p.lock().unwrap();
                p.handed_out(0x400, 512);
                assert!(p.give_back(0x400, 512), "not the capture's");
            });
        });
        assert_eq!(p.into_inner().unwrap().end(), vec![]);
    }
}
