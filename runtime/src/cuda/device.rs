//! CUDA devices: one context and one stream per GPU, found once per process.
//!
//! Every operation of the backend on a device (copies, kernel launches, cuBLASLt calls, frees
//! back into the allocator's cache) is ordered on that device's single stream. That one
//! invariant is what makes the caching allocator safe without events: a block returned to the
//! cache may be handed out again at once, because whatever used it before was enqueued earlier
//! on the same stream and therefore finishes first.

use super::loader::{require, CudaLib};
use super::memory::CachingAllocator;
use super::status::StatusBoard;
use coil_ir::target::GpuTarget;
use coil_ir::{Error, Result};
use cudarc::driver::{result as drv, sys, CudaContext, CudaStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Whether a CUDA GPU can be used: the driver library loads, initialises, and reports at least
/// one device. Cheap after the first call (the answer is cached); never panics.
pub fn cuda_available() -> bool {
    cuda_status().is_ok()
}

/// [`cuda_available`] with the reason when it is not: the driver library missing (with every
/// place searched), `cuInit` failing, or no device. Cached.
pub fn cuda_status() -> Result<()> {
    static STATUS: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    STATUS
        .get_or_init(|| device_count().map_err(|e| e.message))
        .as_ref()
        .map(|_| ())
        .map_err(|e| Error::runtime(e.clone()))
}

/// Number of CUDA devices, or why there are none.
fn device_count() -> Result<usize> {
    require(CudaLib::Driver)?;
    drv::init().map_err(|e| driver_error("cuInit", e))?;
    let n = drv::device::get_count().map_err(|e| driver_error("cuDeviceGetCount", e))?;
    if n <= 0 {
        return Err(Error::runtime("CUDA is not available: the driver loaded but reports no device"));
    }
    Ok(n as usize)
}

/// The devices set up so far, by ordinal.
static DEVICES: Mutex<Option<HashMap<usize, Arc<CudaDevice>>>> = Mutex::new(None);

/// [`CudaDevice::synchronize`] on every device set up so far (none without CUDA): waits for
/// all of coil's work on GPUs, and returns the first data error a kernel of an unchecked run
/// reported (`torch.cuda.synchronize`).
pub fn synchronize_all() -> Result<()> {
    let devices: Vec<Arc<CudaDevice>> = {
        let table = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        let mut devices: Vec<_> = table.iter().flat_map(|t| t.values().cloned()).collect();
        devices.sort_by_key(|d| d.ordinal);
        devices
    };
    let mut first = Ok(());
    for dev in devices {
        let checked = dev.synchronize();
        if first.is_ok() {
            first = checked;
        }
    }
    first
}

/// The [`GpuTarget`] of a device, from its attributes. The memory bus, memory clock and SM
/// clock are optional: one the driver reports as zero or refuses (CUDA 13 dropped the clocks
/// from `cudaDeviceProp`, and some parts report none) is taken from the generation's
/// data-center part ([`GpuTarget::with_missing_clocks_filled`]).
fn read_target(ctx: &CudaContext) -> Result<GpuTarget> {
    use sys::CUdevice_attribute as A;
    let read = |attribute: A| -> Result<usize> {
        let v = ctx.attribute(attribute).map_err(|e| driver_error("cuDeviceGetAttribute", e))?;
        Ok(v.max(0) as usize)
    };
    let optional = |attribute: A| ctx.attribute(attribute).map_or(0, |v| v.max(0) as u32);
    let (major, minor) = ctx.compute_capability().map_err(|e| driver_error("cuDeviceGetAttribute", e))?;
    Ok(GpuTarget {
        compute_capability: (major as u32, minor as u32),
        sm_count: read(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
        l2_bytes: read(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
        shared_per_block_optin: read(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        shared_per_sm: read(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
        registers_per_sm: read(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)? as u32,
        max_threads_per_sm: read(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)? as u32,
        clusters: read(A::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)? != 0,
        memory_bus_bits: optional(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
        memory_clock_khz: optional(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
        sm_clock_khz: optional(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
    }
    .with_missing_clocks_filled())
}

/// A driver error as a coil runtime error naming the call.
pub(crate) fn driver_error(call: &str, e: drv::DriverError) -> Error {
    Error::runtime(format!("CUDA {call} failed: {e}"))
}

/// One GPU: its primary context, the stream all of coil's work on it is ordered on, what it is,
/// and its caching allocator.
pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    /// What code is generated for (compute capability, SM count, caches, limits).
    target: GpuTarget,
    pub(crate) allocator: CachingAllocator,
    /// cuBLASLt state, created on the first matrix product.
    pub(crate) blas: OnceLock<std::result::Result<super::blas::Blas, String>>,
    /// cuDNN state, created on the first convolution.
    pub(crate) cudnn: OnceLock<std::result::Result<super::cudnn::Cudnn, String>>,
    /// The built-in helper kernels (strided gather), compiled on first use.
    pub(crate) helpers: OnceLock<std::result::Result<super::gather::Helpers, String>>,
    /// Template kernels compiled on first use ([`super::compiler::template_module`]), by
    /// template and kernels.
    pub(crate) templates: Mutex<HashMap<(usize, String), Arc<super::compiler::LoadedModule>>>,
    /// The status words of runs not checked yet ([`super::status`]).
    pub(crate) status: StatusBoard,
    /// The stream CUDA graphs are captured on ([`super::graphs`]): a capturing thread's work
    /// goes there, never mixed with other threads' work on `stream`.
    capture_stream: OnceLock<Arc<CudaStream>>,
}

thread_local! {
    /// The device this thread is capturing a CUDA graph on, if any.
    static CAPTURING: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("target", &self.target)
            .finish()
    }
}

impl CudaDevice {
    /// The device `ordinal` (0 for the first GPU), set up on first use and shared afterwards.
    /// Fails with the reason when CUDA is unavailable (see [`cuda_status`]) or the ordinal is
    /// out of range.
    pub fn get(ordinal: usize) -> Result<Arc<CudaDevice>> {
        cuda_status()?;
        let mut table = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        let table = table.get_or_insert_with(HashMap::new);
        if let Some(dev) = table.get(&ordinal) {
            return Ok(dev.clone());
        }
        let dev = Arc::new(CudaDevice::open(ordinal)?);
        table.insert(ordinal, dev.clone());
        super::compiler::warm_up(&dev);
        Ok(dev)
    }

    fn open(ordinal: usize) -> Result<CudaDevice> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::value(format!("no CUDA device {ordinal}: there are {count}")));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_error("context creation", e))?;
        // A stream of our own rather than the legacy default stream, which would synchronise
        // with every other user of the context.
        let stream = ctx.new_stream().map_err(|e| driver_error("cuStreamCreate", e))?;
        let name = ctx.name().map_err(|e| driver_error("cuDeviceGetName", e))?;
        let target = read_target(&ctx)?;
        Ok(CudaDevice {
            ordinal,
            ctx,
            stream,
            name,
            target,
            allocator: CachingAllocator::default(),
            blas: OnceLock::new(),
            cudnn: OnceLock::new(),
            helpers: OnceLock::new(),
            templates: Mutex::new(HashMap::new()),
            status: StatusBoard::default(),
            capture_stream: OnceLock::new(),
        })
    }

    /// Its ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The GPU's name, e.g. `NVIDIA H100 80GB HBM3`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability `(major, minor)`, e.g. `(9, 0)` for Hopper.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.target.compute_capability
    }

    /// The NVRTC architecture for this device, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}", self.target.arch())
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.target.sm_count
    }

    /// The GPU as code generation sees it, read from the driver's device attributes: what
    /// launch plans and the templates' launch rules are made for.
    pub fn target(&self) -> &GpuTarget {
        &self.target
    }

    /// The `cudarc` context (the device's primary context).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream everything of coil's on this device is ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The raw stream handle, for driver and library calls: the device's stream, or, while
    /// the calling thread captures a CUDA graph on it, the capture stream.
    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        match self.capture_stream.get() {
            Some(capture) if self.capturing() => capture.cu_stream(),
            _ => self.stream.cu_stream(),
        }
    }

    /// Whether the calling thread is capturing a CUDA graph on this device.
    pub(crate) fn capturing(&self) -> bool {
        CAPTURING.with(|c| c.get()) == Some(self.ordinal)
    }

    /// An error naming `what` while the calling thread captures a CUDA graph: host copies and
    /// waits cannot be part of a graph (the capture then fails, and the graph runs uncaptured).
    pub(crate) fn refuse_while_capturing(&self, what: &str) -> Result<()> {
        match self.capturing() {
            true => Err(Error::unsupported(format!("{what} cannot be captured in a CUDA graph"))),
            false => Ok(()),
        }
    }

    /// Starts capturing the calling thread's work on this device into a CUDA graph: launches
    /// go to the capture stream, and the blocks it is handed belong to the graph.
    pub(crate) fn begin_capture(&self) -> Result<()> {
        if self.capturing() {
            return Err(Error::runtime("a CUDA graph capture is in progress on this thread"));
        }
        let stream = match self.capture_stream.get() {
            Some(s) => s.clone(),
            None => {
                let s = self.ctx.new_stream().map_err(|e| driver_error("cuStreamCreate", e))?;
                self.capture_stream.get_or_init(|| s).clone()
            }
        };
        self.allocator.begin_capture()?;
        self.bind()?;
        // Relaxed: a block the allocator needs from the driver during the capture is allowed;
        // the graph keeps it (`graphs::pool`).
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: the stream is this device's, idle on the host's side (nothing captures on it).
        if let Err(e) = unsafe { drv::stream::begin_capture(stream.cu_stream(), mode) } {
            self.allocator.abort_capture();
            return Err(driver_error("cuStreamBeginCapture", e));
        }
        CAPTURING.with(|c| c.set(Some(self.ordinal)));
        Ok(())
    }

    /// Ends the calling thread's capture: the graph and the blocks it holds, or why the
    /// capture failed (its blocks are then the cache's again).
    pub(crate) fn end_capture(&self) -> Result<(sys::CUgraph, Vec<(sys::CUdeviceptr, usize)>)> {
        CAPTURING.with(|c| c.set(None));
        let stream = self.capture_stream.get().expect("a capture began").cu_stream();
        self.bind()?;
        // SAFETY: the capture began on this stream, on this thread.
        match unsafe { drv::stream::end_capture(stream) } {
            Ok(graph) => Ok((graph, self.allocator.end_capture())),
            Err(e) => {
                self.allocator.abort_capture();
                Err(driver_error("cuStreamEndCapture", e))
            }
        }
    }

    /// Makes the context current on the calling thread; every raw driver call needs it.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| driver_error("cuCtxSetCurrent", e))
    }

    /// Waits until all work enqueued on the stream is done, and checks the status words of the
    /// runs not checked yet (`cuda::status`): the first data error a kernel reported (an
    /// index out of bounds, ...) surfaces here, named by its kernel and the line of its run,
    /// as does an asynchronous error of earlier work (an illegal address in a kernel, ...).
    pub fn synchronize(&self) -> Result<()> {
        self.wait()?;
        self.status.check(self)
    }

    /// Waits until all work enqueued on the stream is done, leaving the runs' status words for
    /// the next [`CudaDevice::synchronize`] (driver errors still surface).
    pub(crate) fn wait(&self) -> Result<()> {
        self.refuse_while_capturing("waiting for the device")?;
        self.bind()?;
        self.stream.synchronize().map_err(|e| driver_error("cuStreamSynchronize", e))
    }

    /// Bytes held in the allocator's cache (freed by coil, not returned to the driver).
    pub fn cached_bytes(&self) -> usize {
        self.allocator.stats().cached_bytes
    }

    /// The allocator's counters: bytes in use, their peak, bytes cached.
    pub fn memory_stats(&self) -> super::memory::AllocatorStats {
        self.allocator.stats()
    }

    /// Restarts the peak of bytes in use at the bytes in use now.
    pub fn reset_peak_memory(&self) {
        self.allocator.reset_peak()
    }

    /// Returns every cached block to the driver (after the stream drains).
    pub fn empty_cache(&self) -> Result<()> {
        self.wait()?;
        self.allocator.release_all(self)
    }
}
