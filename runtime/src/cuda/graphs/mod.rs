//! CUDA graphs: a compiled graph's launches captured once and replayed with one
//! `cuGraphLaunch` (torch.compile's `mode="reduce-overhead"`), for static-shape graphs that
//! draw no random numbers.
//!
//! A run enqueues one launch per kernel and library call: hundreds for a training step, each a
//! few microseconds of the host's time, during which a GPU with small kernels waits. A replay
//! costs one launch. [`CudaCompiledGraph::run_replayed`] does, per call:
//!
//! 1. the first call runs as usual (it autotunes, loads libraries, fills caches);
//! 2. the second captures the run on the device's capture stream (`CudaDevice::begin_capture`):
//!    nothing executes, every launch and copy is recorded, with the addresses of its buffers.
//!    Every block the capture is handed (outputs, temporaries, library scratch) then belongs to
//!    the graph (`pool`), so nothing else ever writes over it. The status words are the
//!    graph's own, checked like any run's (`cuda::status`). Then the graph is launched;
//! 3. later calls launch it again. The outputs are the same buffers every time: the caller
//!    gets them shared, and the next replay writes over them (the frontend makes the previous
//!    call's tensors stale, an error on use, as torch's CUDA graph trees do);
//! 4. inputs are baked in by address. An input at another address than at the capture
//!    (fresh data, an output of the graph fed back) makes the graph capture again, that input
//!    now copied into a buffer of the graph's before each launch (a device copy, not a
//!    capture, from then on);
//! 5. a donated input (an output written over it in place: a KV cache, optimizer state) is
//!    never copied: the graph writes the caller's buffer, and hands it back as that output.
//!    When it moves, the graph captures again at its new address.
//!
//! Not replayed (they run as usual, and say why once with `COIL_LOGS=schedule`): graphs of
//! symbolic sizes, graphs that draw random numbers (their streams' values are launch
//! arguments, new at every call), graphs whose run goes through the host (a fallback op, a
//! product cuBLASLt has no algorithm for: the capture fails), and a first run still to
//! autotune.

pub(crate) mod pool;

use super::device::{driver_error, CudaDevice};
use super::gather::copy_batch;
use super::memory::{CudaBuffer, DeviceMemory};
use super::status::KERNEL_STATUS_BYTES;
use super::{CudaCompiledGraph, RunStatus};
use crate::plan::{RunOrigin, RunOutput};
use coil_ir::{Error, Result};
use cudarc::driver::{result as drv, sys};
use std::sync::Arc;

/// A compiled graph's replay state.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    /// Calls so far (the first runs uncaptured).
    calls: usize,
    /// Captures so far (the first, and one per input that moved since).
    captures: usize,
    captured: Option<Box<Captured>>,
    /// Why the graph is not replayed, once that is known.
    off: Option<String>,
}

/// A captured run, ready to launch.
#[derive(Debug)]
struct Captured {
    device: Arc<CudaDevice>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// Per input, the address baked in, or the graph's buffer it is copied into.
    inputs: Vec<Input>,
    /// The outputs, in `program.outputs` order, written by every launch: the graph's buffers,
    /// or the caller's donated inputs.
    outputs: Vec<RunOutput<Arc<CudaBuffer>>>,
    /// The launches' status words (4 per step).
    status: Arc<DeviceMemory>,
    /// The blocks the graph holds (back to the cache when it is destroyed).
    blocks: Vec<(sys::CUdeviceptr, usize)>,
}

#[derive(Debug)]
enum Input {
    /// Read where the caller's buffer was at the capture.
    At(u64),
    /// Copied into this buffer before each launch.
    Copied(CudaBuffer),
}

// SAFETY: the graph handles are used only under the `Replay` mutex, with the context bound.
unsafe impl Send for Captured {}

impl Drop for Captured {
    fn drop(&mut self) {
        // Launches of it may be queued: the stream drains before the graph goes.
        let _ = self.device.wait();
        let _ = self.device.bind();
        // SAFETY: the handles came from `capture` (`exec` is null if instantiation failed), and
        // nothing launches them any more.
        unsafe {
            if !self.exec.is_null() {
                let _ = drv::graph::exec_destroy(self.exec);
            }
            let _ = drv::graph::destroy(self.graph);
        }
        self.device.allocator.release_graph(&self.blocks);
    }
}

impl CudaCompiledGraph {
    /// Why this graph cannot be replayed from a CUDA graph at all, if it cannot.
    fn not_replayable(&self) -> Option<&'static str> {
        if !self.program.symbols.is_empty() {
            Some("its sizes are symbolic")
        } else if self.program.random_streams() > 0 {
            Some("it draws random numbers (their keys and counters are launch arguments)")
        } else {
            None
        }
    }

    /// Runs the graph from a CUDA graph of its launches (see the module doc): `Ok(None)` when
    /// this call runs as usual instead (the first call, or a graph that is not replayed), else
    /// the outputs, the same buffers as the previous replay's (a donated output: the caller's
    /// input, written over). The run's status words are checked at the next synchronization
    /// point, reported with `origin`.
    pub fn run_replayed(
        &self,
        inputs: &[&CudaBuffer],
        origin: Arc<RunOrigin>,
    ) -> Result<Option<Vec<RunOutput<Arc<CudaBuffer>>>>> {
        let mut replay = self.replay.lock().unwrap_or_else(|e| e.into_inner());
        if replay.off.is_some() || (self.autotune && self.tuned.get().is_none()) {
            // (A graph still to autotune is tuned by a plain run first.)
            return Ok(None);
        }
        // Decided at the first call (the program does not change; walking it costs the host
        // microseconds per call).
        if let Some(why) = (replay.calls == 0).then(|| self.not_replayable()).flatten() {
            log(&format!("{}: not replayed: {why}", self.schedule.kernels.first().map_or("a graph", |k| &k.name)));
            replay.off = Some(why.to_string());
            return Ok(None);
        }
        replay.calls += 1;
        if replay.calls == 1 {
            return Ok(None);
        }
        self.check_inputs(inputs)?;
        let moved: Vec<bool> = match &replay.captured {
            None => vec![false; inputs.len()],
            Some(c) => c.inputs.iter().zip(inputs).map(|(i, b)| !matches!(i, Input::At(p) if *p == b.ptr())).collect(),
        };
        let recapture = replay
            .captured
            .as_ref()
            .is_none_or(|c| c.inputs.iter().zip(&moved).any(|(i, &moved)| moved && matches!(i, Input::At(_))));
        if recapture {
            // Inputs copied before, or at another address now, are copied from now on; a
            // donated input never is (the output must land in the caller's buffer).
            let donated = |k: usize| self.schedule.memory.donated.iter().any(|d| d.input == k);
            let copied: Vec<bool> = match &replay.captured {
                None => moved,
                Some(c) => c.inputs.iter().zip(&moved).map(|(i, &m)| m || matches!(i, Input::Copied(_))).collect(),
            };
            let copied: Vec<bool> = copied.into_iter().enumerate().map(|(k, c)| c && !donated(k)).collect();
            replay.captured = None;
            replay.captures += 1;
            let name = self.schedule.kernels.first().map_or("a graph", |k| &k.name);
            let listed: Vec<String> =
                (copied.iter().enumerate()).filter(|(_, &c)| c).map(|(k, _)| k.to_string()).collect();
            // A capture costs about a plain run and an instantiation: more than one per graph
            // is an input at a new address every few calls (see the module doc).
            log(&format!(
                "{name}: capture {} at call {}; inputs copied before each launch: [{}]",
                replay.captures,
                replay.calls,
                listed.join(", ")
            ));
            match self.capture(inputs, &copied) {
                Ok(c) => replay.captured = Some(Box::new(c)),
                Err(e) => {
                    log(&format!("not replayed: the capture failed: {}", e.message));
                    replay.off = Some(e.message);
                    return Ok(None);
                }
            }
        }
        let c = replay.captured.as_ref().expect("captured above");
        let dev = &self.device;
        let copies: Vec<_> = (c.inputs.iter().zip(inputs))
            .filter_map(|(input, buffer)| match input {
                Input::Copied(copy) => Some((copy.ptr(), buffer.ptr(), copy.bytes())),
                Input::At(_) => None,
            })
            .collect();
        // SAFETY: both ends hold the input's bytes (checked by `check_inputs`; each copy was made
        // for its input's meta), and the graph's own buffers overlap no input.
        unsafe { copy_batch(dev, &copies)? };
        dev.bind()?;
        // SAFETY: the executable graph is alive, and every address it holds is a block of the
        // graph or an input checked above to be where it was at the capture.
        unsafe { drv::graph::launch(c.exec, dev.cu_stream()) }.map_err(|e| driver_error("cuGraphLaunch", e))?;
        dev.status.push_owned(c.status.clone(), &self.status_kernels, &origin);
        Ok(Some(c.outputs.clone()))
    }

    /// Captures one run on `inputs` (those marked in `copied` through buffers of the graph's)
    /// and launches nothing.
    fn capture(&self, inputs: &[&CudaBuffer], copied: &[bool]) -> Result<Captured> {
        let dev = &self.device;
        // The graph's own buffers, made before the capture (they are not the capture's blocks).
        let copies: Vec<Option<CudaBuffer>> = (inputs.iter().zip(copied))
            .map(|(b, &c)| c.then(|| CudaBuffer::alloc(dev, b.meta.clone())).transpose())
            .collect::<Result<_>>()?;
        let status = Arc::new(DeviceMemory::alloc(dev, self.steps.len() * KERNEL_STATUS_BYTES)?);
        status.zero(status.bytes())?;
        let bound: Vec<&CudaBuffer> = copies.iter().zip(inputs).map(|(c, &b)| c.as_ref().unwrap_or(b)).collect();

        dev.begin_capture()?;
        let run = self.enqueue(&bound, &[], None, RunStatus::At(status.ptr())).and_then(|p| self.finish(&bound, p));
        let (graph, blocks) = dev.end_capture()?;
        // Destroys the graph (and gives its blocks back) on every way out below.
        let mut c = Captured {
            device: dev.clone(),
            graph,
            exec: std::ptr::null_mut(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            status,
            blocks,
        };
        let outputs = run?;
        c.outputs = (outputs.into_iter())
            .map(|o| match o {
                RunOutput::New(b) => Ok(RunOutput::New(Arc::new(b))),
                RunOutput::Donated(k) if copied[k] => {
                    Err(Error::internal(format!("donated input {k} was copied into the graph's buffer")))
                }
                RunOutput::Donated(k) => Ok(RunOutput::Donated(k)),
            })
            .collect::<Result<_>>()?;
        dev.bind()?;
        // SAFETY: `graph` is the graph just captured.
        c.exec = unsafe { drv::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
            .map_err(|e| driver_error("cuGraphInstantiate", e))?;
        c.inputs = (copies.into_iter().zip(inputs))
            .map(|(copy, b)| match copy {
                Some(copy) => Input::Copied(copy),
                None => Input::At(b.ptr()),
            })
            .collect();
        Ok(c)
    }
}

/// Says why on the `schedule` log channel.
fn log(text: &str) {
    super::schedule_log(&format!("cuda graphs: {text}"));
}
