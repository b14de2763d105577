//! Which cuBLASLt algorithm a product runs: the heuristic's first, or the fastest of its first
//! [`CANDIDATES`] timed once per problem.
//!
//! cuBLASLt's heuristic ranks algorithms by a model, not a measurement; on the H100 its first
//! choice for GPT-2's products is up to 10% slower than another of its top eight (the logits
//! product 884 against 805 us). So, with the configuration's `tuning.gemm_autotune` on (the
//! default; `COIL_GEMM_AUTOTUNE=0` turns it off), the first call of each *problem* (dtypes,
//! sizes, layouts, epilogue, operand alignments: everything the heuristic sees) times the
//! candidates on the call's own operands and keeps the fastest:
//!
//! * each candidate: one untimed launch, then [`ROUNDS`] rounds of [`REPS`] launches between
//!   two CUDA events, candidates interleaved within a round; its time is its best round's
//!   mean. A candidate that fails to launch is dropped. The heuristic's first stays unless
//!   another beats it by more than the launch autotuner's tie ([`super::autotune::TIE`]).
//! * the chosen algorithm then runs the call itself (the caller's launch), so the output is
//!   the chosen algorithm's whatever ran before it.
//! * the choice is kept for the process (no heuristic query on later calls of the problem) and
//!   on disk under `<cache dir>/gemm/` (a verified [`cache_entry`] keyed by the problem, the
//!   GPU's name, its architecture and cuBLASLt's version), so a later process times nothing.
//!
//! Not timed: while a CUDA graph is being captured (nothing may synchronize), and when the
//! output overlaps an operand (a timing launch would change the operand); those calls take the
//! heuristic's first (or the choice made earlier). `tuning.gemm_algo = i` (`COIL_GEMM_ALGO`, a
//! measuring knob) takes the heuristic's `i`-th for every problem instead.

use super::autotune::fastest;
use super::device::CudaDevice;
use super::StreamTimer;
use crate::cache_entry::{self, Kind};
use coil_ir::Result;
use cudarc::cublaslt::sys as lt_sys;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How many of the heuristic's algorithms are candidates.
pub const CANDIDATES: usize = 8;
/// Timed rounds per candidate (its best counts).
pub const ROUNDS: usize = 2;
/// Launches per timed round.
pub const REPS: usize = 3;

/// Bumped when the key or the entry's meaning changes.
const FORMAT: &str = "coil-gemm-choice-v1";

/// One heuristic result's algorithm.
pub(super) type Algo = lt_sys::cublasLtMatmulAlgo_t;

/// The choices made in this process, per problem text.
#[derive(Default)]
pub(super) struct Choices {
    made: Mutex<HashMap<String, Algo>>,
}

/// How a product's call gets its algorithm.
pub(super) struct Problem<'a> {
    /// Everything the heuristic sees, as text ([`problem_text`]).
    pub text: String,
    /// The device the call runs on.
    pub dev: &'a Arc<CudaDevice>,
    /// Whether timing launches may write the output (it overlaps no operand).
    pub may_time: bool,
}

/// The text that names a problem: the descriptors' contents, one field each.
pub(super) fn problem_text(fields: &[(&str, String)]) -> String {
    fields.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

/// The disk entry's key for `problem` on this GPU and cuBLASLt.
pub fn choice_key(problem: &str, device_name: &str, arch: &str, cublaslt_version: usize) -> String {
    cache_entry::key(&[FORMAT, device_name, arch, &cublaslt_version.to_string(), problem])
}

/// `<cache dir>/gemm/<key>.choice.entry`.
pub fn choice_path(cache_dir: &Path, key: &str) -> PathBuf {
    cache_entry::path(&cache_dir.join("gemm"), key, Kind::Choice)
}

/// The cached index (into the heuristic's list) under `key`, if a valid entry names one; an
/// invalid entry is logged and the problem timed again.
pub fn read_choice(cache_dir: &Path, key: &str) -> Option<usize> {
    cache_entry::read_choice(&cache_dir.join("gemm"), key, |line| line.strip_prefix("algo ")?.parse().ok())
}

/// Caches the index `i` under `key`, with `note` (the timings) as a comment line.
pub fn write_choice(cache_dir: &Path, key: &str, i: usize, note: &str) -> Result<()> {
    cache_entry::write_choice(&cache_dir.join("gemm"), key, &format!("algo {i}"), note)
}

impl Choices {
    /// The algorithm for `problem`: the configuration's `gemm_algo`-th if set, else the choice
    /// made before, else the cached one, else the fastest of the candidates (timed with
    /// `launch`), else the heuristic's first. `candidates(n)` queries the heuristic for up to
    /// `n` algorithms (in its order); `None` from this function: it has none.
    pub(super) fn algo(
        &self,
        problem: &Problem,
        candidates: impl FnOnce(usize) -> std::result::Result<Vec<Algo>, String>,
        mut launch: impl FnMut(&Algo) -> Result<()>,
    ) -> std::result::Result<Option<Algo>, String> {
        let config = coil_ir::config::current();
        let pick = config.tuning.gemm_algo;
        if pick == 0 {
            if let Some(algo) = self.made.lock().expect("gemm choices").get(&problem.text) {
                return Ok(Some(*algo));
            }
        }
        let tune = config.tuning.gemm_autotune && problem.may_time && !problem.dev.capturing();
        let list = candidates(if pick > 0 || tune { CANDIDATES } else { 1 })?;
        if list.is_empty() {
            return Ok(None);
        }
        if pick > 0 {
            return Ok(Some(list[pick.min(list.len() - 1)]));
        }
        if !tune || list.len() == 1 {
            return Ok(Some(list[0]));
        }
        // SAFETY: a plain query; the library is loaded (the handle exists).
        let version = unsafe { lt_sys::cublasLtGetVersion() };
        let key = choice_key(&problem.text, problem.dev.name(), &problem.dev.arch(), version);
        let chosen = match read_choice(&config.cache_dir, &key).filter(|&i| i < list.len()) {
            Some(i) => i,
            None => {
                let times = time(problem.dev, &list, None, &mut launch).map_err(|e| e.message)?;
                let Some(i) = fastest(&times) else { return Ok(Some(list[0])) };
                let note: Vec<String> =
                    times.iter().map(|t| t.map_or("failed".to_string(), |t| format!("{t:.1}"))).collect();
                let note =
                    format!("{}: us per launch of algorithms 0..{}: {}", problem.text, list.len(), note.join(" "));
                super::schedule_log(&format!("gemm: algorithm {i} of {} ({note})", list.len()));
                if let Err(e) = write_choice(&config.cache_dir, &key, i, &note) {
                    super::schedule_log(&format!("gemm: the choice was not cached: {}", e.message));
                }
                i
            }
        };
        self.made.lock().expect("gemm choices").insert(problem.text.clone(), list[chosen]);
        Ok(Some(list[chosen]))
    }
}

/// Each candidate's microseconds per launch (best round), `None` where a launch failed: one
/// untimed launch each, then [`ROUNDS`] rounds of [`REPS`] launches between CUDA events,
/// candidates interleaved within a round. With `flush`, each launch is timed on its own after
/// the buffer is overwritten, so that the operands come from memory, not from the L2 cache
/// (the cuDNN attention choice: its engine configs rank differently on operands the L2 holds).
pub(super) fn time<T>(
    dev: &Arc<CudaDevice>,
    list: &[T],
    flush: Option<&super::memory::DeviceMemory>,
    launch: &mut impl FnMut(&T) -> Result<()>,
) -> Result<Vec<Option<f64>>> {
    let timer = StreamTimer::new(dev)?;
    let mut best: Vec<Option<f64>> = list.iter().map(|a| launch(a).ok().map(|_| f64::INFINITY)).collect();
    for round in 0..ROUNDS {
        for (algo, best) in list.iter().zip(best.iter_mut()) {
            if best.is_none() {
                continue;
            }
            let (ran, us) = match flush {
                None => {
                    timer.start()?;
                    let ran = (0..REPS).try_for_each(|_| launch(algo));
                    (ran, timer.stop()? / REPS as f64)
                }
                Some(scratch) => {
                    let mut total = 0.0;
                    let mut ran = Ok(());
                    for rep in 0..REPS {
                        // A different byte each time: the writes are not elided.
                        scratch.fill((round * REPS + rep) as u8)?;
                        timer.start()?;
                        ran = ran.and_then(|()| launch(algo));
                        total += timer.stop()?;
                    }
                    (ran, total / REPS as f64)
                }
            };
            *best = match ran {
                Ok(()) => best.map(|b| b.min(us)),
                Err(_) => None,
            };
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heuristics_first_stays_unless_another_is_clearly_faster() {
        assert_eq!(fastest(&[Some(100.0), Some(99.0), None]), Some(0));
        assert_eq!(fastest(&[Some(100.0), Some(97.0), Some(98.5)]), Some(1));
        assert_eq!(fastest(&[None, Some(120.0), Some(110.0)]), Some(2));
        assert_eq!(fastest(&[None, None]), None);
    }

    #[test]
    fn a_choice_round_trips_through_the_cache_and_a_corrupt_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("coil-gemm-choice-{}", std::process::id()));
        let key = choice_key("m=8 n=8 k=8", "NVIDIA H100 80GB HBM3", "sm_90", 130000);
        assert_ne!(key, choice_key("m=8 n=8 k=16", "NVIDIA H100 80GB HBM3", "sm_90", 130000));
        assert_ne!(key, choice_key("m=8 n=8 k=8", "NVIDIA H100 80GB HBM3", "sm_90", 130001));
        assert_eq!(read_choice(&dir, &key), None);
        write_choice(&dir, &key, 3, "timings").unwrap();
        assert_eq!(read_choice(&dir, &key), Some(3));
        let path = choice_path(&dir, &key);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(read_choice(&dir, &key), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
