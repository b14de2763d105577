//! Kernels' status words, checked at the next synchronization point instead of after each run.
//!
//! Every generated kernel reports the data errors it detects (an index out of bounds, an
//! integer division by zero, ...) in 4 status words of its own, written only when it fails. A
//! run does not wait to read them: it takes its words from the device's **status board**, one
//! device allocation shared by consecutive runs, zero where no kernel failed, and leaves a
//! record of which kernel owns which words and where the user asked for the run. What waits for
//! the stream anyway reads the board's used part in one copy and reports the first failing
//! kernel, in run and launch order, with that run's location:
//!
//! - a host read of device memory ([`super::CudaBuffer::to_host`]: `item`, `to_vec`, printing);
//! - [`super::CudaDevice::synchronize`] (`coil::synchronize()`);
//! - the next run, when the board is full.
//!
//! After a check without errors the board is still all zeros and is used again from the
//! start; after an error its used part is zeroed (and the runs checked with it are forgotten:
//! later errors are most likely the first one's consequences). A graph replayed from a CUDA
//! graph has its status words at fixed addresses of its own ([`Words::Owned`]), checked the
//! same way.
//!
//! The bookkeeping ([`Unchecked`]) is plain data, tested without a GPU; [`StatusBoard`] adds
//! the device memory.

use super::device::CudaDevice;
use super::memory::{self, DeviceMemory};
use crate::plan::{check_status, LaunchName, RunOrigin};
use coil_ir::{Error, Result};
use std::sync::{Arc, Mutex};

/// Bytes of status words per generated kernel.
pub(crate) const KERNEL_STATUS_BYTES: usize = 32;

/// The board's size: 32768 kernels' words (a training step of 400 kernels runs 80 times
/// before a full board makes a run wait).
const BOARD_BYTES: usize = 1 << 20;

/// Where a run's status words are.
#[derive(Clone, Debug)]
pub(crate) enum Words {
    /// At this byte offset of the board.
    Board(usize),
    /// In an allocation of their own (a CUDA graph's, the same at every replay).
    Owned(Arc<DeviceMemory>),
}

/// One run whose status words nobody has read yet.
#[derive(Clone, Debug)]
pub(crate) struct UncheckedRun {
    pub(crate) words: Words,
    /// The kernel that owns each 4 words, in launch order.
    pub(crate) kernels: Arc<[LaunchName]>,
    /// Where the user asked for the run and the lines of its ops (reported with its error).
    pub(crate) origin: Arc<RunOrigin>,
}

impl UncheckedRun {
    /// The error of the run's first failing kernel, given its words.
    fn error(&self, words: &[i64]) -> Option<Error> {
        let failed = (self.kernels.iter().enumerate())
            .find_map(|(k, name)| check_status(name, &words[4 * k..4 * k + 4]).err())?;
        Some(self.origin.name(failed))
    }
}

/// The runs not yet checked and the board's words they use (no device memory: see
/// [`StatusBoard`]).
#[derive(Debug, Default)]
pub(crate) struct Unchecked {
    runs: Vec<UncheckedRun>,
    /// Bytes of the board in use.
    used: usize,
}

impl Unchecked {
    /// The board offset for `kernels` kernels' words in a board of `capacity` bytes, or `None`
    /// when they do not fit after the runs already there (check them first).
    pub(crate) fn reserve(&mut self, kernels: usize, capacity: usize) -> Option<usize> {
        let bytes = kernels * KERNEL_STATUS_BYTES;
        (self.used + bytes <= capacity).then(|| {
            self.used += bytes;
            self.used - bytes
        })
    }

    /// Records a run whose words were reserved (or are its own).
    pub(crate) fn push(&mut self, run: UncheckedRun) {
        self.runs.push(run);
    }

    /// Whether no run waits to be checked.
    pub(crate) fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Bytes of the board in use.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// The runs using allocations of their own, each allocation once.
    pub(crate) fn owned(&self) -> Vec<Arc<DeviceMemory>> {
        let mut owned: Vec<Arc<DeviceMemory>> = Vec::new();
        for run in &self.runs {
            if let Words::Owned(m) = &run.words {
                if !owned.iter().any(|o| Arc::ptr_eq(o, m)) {
                    owned.push(m.clone());
                }
            }
        }
        owned
    }

    /// Checks every run, given the board's used words and the words of each allocation of
    /// [`Unchecked::owned`] (in that order), and forgets them all. Returns the first failing
    /// kernel's error, in run and launch order, and whether any words were written (then the
    /// caller zeroes them).
    pub(crate) fn check(&mut self, board: &[i64], owned: &[(Arc<DeviceMemory>, Vec<i64>)]) -> (Option<Error>, bool) {
        let runs = std::mem::take(&mut self.runs);
        self.used = 0;
        let error = runs.iter().find_map(|run| match &run.words {
            Words::Board(offset) => run.error(&board[offset / 8..]),
            Words::Owned(m) => {
                let words = &owned.iter().find(|(o, _)| Arc::ptr_eq(o, m)).expect("every allocation read").1;
                run.error(words)
            }
        });
        let dirty = board.iter().chain(owned.iter().flat_map(|(_, w)| w)).any(|&w| w != 0);
        (error, dirty)
    }
}

/// A device's status board: the [`Unchecked`] runs and the device memory of their words.
#[derive(Debug, Default)]
pub(crate) struct StatusBoard {
    inner: Mutex<Board>,
}

#[derive(Debug, Default)]
struct Board {
    unchecked: Unchecked,
    /// The board's memory (allocated and zeroed on first use).
    memory: Option<DeviceMemory>,
}

impl StatusBoard {
    /// The device address of zeroed words for a run of `kernels` generated kernels (4 words
    /// each, in launch order), recorded as unchecked with the run's `origin`. When the board
    /// is full its runs are checked first (waiting for the stream), and an error found there
    /// is returned instead: the next run is where an earlier run's error surfaces when
    /// nothing synchronized in between.
    pub(crate) fn take(
        &self,
        dev: &Arc<CudaDevice>,
        kernels: &Arc<[LaunchName]>,
        origin: &Arc<RunOrigin>,
    ) -> Result<u64> {
        let mut board = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = kernels.len() * KERNEL_STATUS_BYTES;
        let capacity = board.memory.as_ref().map_or(0, |m| m.bytes());
        let offset = match board.unchecked.reserve(kernels.len(), capacity) {
            Some(offset) => offset,
            None => {
                check_locked(&mut board, dev)?;
                if capacity < bytes {
                    // First use, or a run larger than the board: a new board (the old one's
                    // runs were just checked).
                    let size = BOARD_BYTES.max(bytes.next_power_of_two());
                    let memory = DeviceMemory::alloc(dev, size)?;
                    memory.zero(size)?;
                    board.memory = Some(memory);
                }
                let capacity = board.memory.as_ref().map_or(0, |m| m.bytes());
                board.unchecked.reserve(kernels.len(), capacity).expect("an empty board holds the run")
            }
        };
        let run = UncheckedRun { words: Words::Board(offset), kernels: kernels.clone(), origin: origin.clone() };
        board.unchecked.push(run);
        Ok(board.memory.as_ref().expect("allocated above").ptr() + offset as u64)
    }

    /// Records a run whose status words are its own allocation (zero unless a kernel failed).
    pub(crate) fn push_owned(&self, words: Arc<DeviceMemory>, kernels: &Arc<[LaunchName]>, origin: &Arc<RunOrigin>) {
        let mut board = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        board.unchecked.push(UncheckedRun {
            words: Words::Owned(words),
            kernels: kernels.clone(),
            origin: origin.clone(),
        });
    }

    /// Checks every unchecked run (waits for the stream): the first failing kernel's error.
    pub(crate) fn check(&self, dev: &CudaDevice) -> Result<()> {
        let mut board = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        check_locked(&mut board, dev)
    }
}

/// [`StatusBoard::check`] with the board locked.
fn check_locked(board: &mut Board, dev: &CudaDevice) -> Result<()> {
    if board.unchecked.is_empty() {
        return Ok(());
    }
    let used = board.unchecked.used();
    let read = |ptr: u64, bytes: usize| -> Result<Vec<i64>> {
        // SAFETY: `ptr` addresses at least `bytes` bytes of `dev` (the board's used part, or
        // an owned allocation of run words); the download waits for the stream.
        let raw = unsafe { memory::download(dev, ptr, bytes) }
            .map_err(|e| Error::runtime(format!("reading kernels' status words failed: {e}")))?;
        Ok(raw.chunks_exact(8).map(bytemuck::pod_read_unaligned).collect())
    };
    let words = match &board.memory {
        Some(m) if used > 0 => read(m.ptr(), used)?,
        _ => vec![],
    };
    let owned = board.unchecked.owned();
    let owned: Vec<(Arc<DeviceMemory>, Vec<i64>)> =
        owned.into_iter().map(|m| read(m.ptr(), m.bytes()).map(|w| (m, w))).collect::<Result<_>>()?;
    let (error, dirty) = board.unchecked.check(&words, &owned);
    if dirty {
        if let Some(m) = &board.memory {
            m.zero(used)?;
        }
        for (m, _) in &owned {
            m.zero(m.bytes())?;
        }
    }
    error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::Location;

    fn run(offset: usize, kernels: &[&str], origin: Option<&'static Location<'static>>) -> UncheckedRun {
        let kernels: Arc<[LaunchName]> = kernels.iter().map(|k| LaunchName::plain(*k)).collect();
        UncheckedRun { words: Words::Board(offset), kernels, origin: Arc::new(RunOrigin::at(origin)) }
    }

    #[test]
    fn runs_take_consecutive_words_until_the_board_is_full() {
        let mut u = Unchecked::default();
        assert_eq!(u.reserve(3, 256), Some(0));
        assert_eq!(u.reserve(2, 256), Some(96));
        assert_eq!(u.reserve(3, 256), Some(160), "exactly full");
        assert_eq!(u.reserve(1, 256), None);
        assert_eq!(u.used(), 256);
        assert_eq!(u.reserve(0, 256), Some(256), "a run without generated kernels needs no words");
    }

    #[test]
    fn a_check_names_the_first_failing_kernel_of_the_first_failing_run_and_its_line() {
        let mut u = Unchecked::default();
        let here = Location::caller();
        let (a, b) = (u.reserve(2, 1024).unwrap(), u.reserve(3, 1024).unwrap());
        u.push(run(a, &["poi_fused_add_0", "poi_fused_exp_1"], None));
        u.push(run(b, &["poi_fused_gather_0", "poi_fused_div_1", "red_fused_sum_2"], Some(here)));
        let mut words = vec![0i64; u.used() / 8];
        // Run b's second and third kernels failed; a's are clean.
        words[(b / 8) + 4..(b / 8) + 8].copy_from_slice(&[3, 0, 0, 0]);
        words[(b / 8) + 8..(b / 8) + 12].copy_from_slice(&[1, 9, 4, 0]);
        let (error, dirty) = u.check(&words, &[]);
        let e = error.expect("an error");
        assert_eq!(e.op.as_deref(), Some("poi_fused_div_1"));
        assert_eq!(e.message, "ZeroDivisionError: integer division by zero");
        assert_eq!(e.location, Some(here));
        assert!(dirty);
        // Checked runs are forgotten and the board is used from the start again.
        assert!(u.is_empty());
        assert_eq!(u.reserve(1, 1024), Some(0));
    }

    #[test]
    fn clean_words_are_no_error_and_need_no_zeroing() {
        let mut u = Unchecked::default();
        let a = u.reserve(2, 1024).unwrap();
        u.push(run(a, &["k0", "k1"], None));
        let (error, dirty) = u.check(&vec![0; u.used() / 8], &[]);
        assert!(error.is_none() && !dirty);
        let (error, dirty) = u.check(&[], &[]);
        assert!(error.is_none() && !dirty, "nothing to check");
    }

    #[test]
    fn an_out_of_bounds_index_is_reported_with_its_values() {
        let mut u = Unchecked::default();
        let a = u.reserve(1, 1024).unwrap();
        u.push(run(a, &["poi_fused_index_select_0"], None));
        let (error, _) = u.check(&[1, 7, 5, 0], &[]);
        let e = error.unwrap();
        assert_eq!(
            (e.op.as_deref(), e.message.as_str()),
            (Some("poi_fused_index_select_0"), "index 7 is out of bounds for dim of size 5")
        );
        assert_eq!(e.kind, coil_ir::ErrorKind::Value);
    }

    #[test]
    fn an_error_names_its_captured_node_by_the_line_and_operands_of_the_run_that_made_it() {
        let (asked, op_line) = (Location::caller(), Location::caller());
        let check = coil_ir::loops::DataCheck {
            buffer: coil_ir::loops::BufferId(0),
            code: 1,
            op: "index_select",
            dim: Some(0),
            node: Some(3),
        };
        let kernels: Arc<[LaunchName]> =
            vec![LaunchName { kernel: "poi_fused_index_select_0".into(), checks: vec![check] }].into();
        let operands = vec!["f32[5, 3]".to_string(), "i64[2]".to_string()];
        let origin = RunOrigin { line: Some(asked), nodes: vec![(3, Some(op_line), operands.clone())].into() };
        let mut u = Unchecked::default();
        let a = u.reserve(1, 1024).unwrap();
        u.push(UncheckedRun { words: Words::Board(a), kernels, origin: Arc::new(origin) });
        let e = u.check(&[1, 7, 5, 0], &[]).0.unwrap();
        assert_eq!(e.op.as_deref(), Some("index_select (kernel poi_fused_index_select_0)"));
        assert_eq!(e.message, "index 7 is out of bounds for dim 0 with size 5");
        assert_eq!((e.location, e.operands), (Some(op_line), operands));
    }
}
