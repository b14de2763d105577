//! Device memory: a caching allocator and typed device buffers.
//!
//! `cuMemAlloc`/`cuMemFree` are slow (the free synchronises the device), and a compiled graph
//! allocates its outputs and temporaries on every run. So freed blocks go back to a cache, not
//! to the driver, and later allocations reuse them. Requests round up to multiples of 512
//! bytes (as PyTorch's caching allocator rounds). Up to 1 MiB each size has a free list of
//! blocks of its own; larger blocks are cut from shared driver segments and merged back when
//! freed (`super::segments`), so a 2.4 MB weight does not hold a 4 MiB page range. Reuse
//! needs no event: every use of device memory is on the device's one stream (see
//! [`super::device`]), so work that used a block before it was freed precedes, in stream
//! order, any work of its next owner.
//!
//! When the driver is out of memory, the cache is returned to the driver and the allocation
//! tried once more; if it still fails, that is an error (never a panic).

use super::device::{driver_error, CudaDevice};
use super::graphs::pool::GraphPools;
use super::segments::{segment_bytes, Segments, LARGE};
use crate::{Buffer, HostData};
use coil_ir::{DType, Error, Result, TensorMeta};
use cudarc::driver::{result as drv, sys::CUdeviceptr};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Rounds a request up to the bytes of the block it gets: a multiple of 512 (0 stays 0:
/// nothing is allocated). Saturating: a request beyond any device fails in the driver, as an
/// error.
pub fn size_class(bytes: usize) -> usize {
    bytes.div_ceil(512).saturating_mul(512)
}

/// Counters of a device's allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes in blocks handed out and not yet freed.
    pub in_use_bytes: usize,
    /// The most `in_use_bytes` has been since the allocator started or since
    /// [`CachingAllocator::reset_peak`] (`torch.cuda.max_memory_allocated`, in size classes).
    pub peak_in_use_bytes: usize,
    /// Bytes in freed blocks kept for reuse.
    pub cached_bytes: usize,
    /// Blocks obtained from the driver (`cuMemAlloc`) so far.
    pub driver_allocations: u64,
    /// Allocations served from the cache so far.
    pub cache_hits: u64,
}

/// The per-device caching allocator (see the module doc).
#[derive(Debug, Default)]
pub struct CachingAllocator {
    inner: Mutex<Pools>,
}

#[derive(Debug, Default)]
struct Pools {
    /// Free blocks of up to [`LARGE`] bytes, by size.
    free: HashMap<usize, Vec<CUdeviceptr>>,
    /// Larger blocks, free or not, in their driver segments.
    large: Segments,
    stats: AllocatorStats,
    /// The blocks CUDA graphs hold, and those of a capture in progress (counted in use).
    graphs: GraphPools,
}

impl Pools {
    /// Counts a block of `class` bytes handed out.
    fn take(&mut self, class: usize) {
        self.stats.in_use_bytes += class;
        self.stats.peak_in_use_bytes = self.stats.peak_in_use_bytes.max(self.stats.in_use_bytes);
    }

    /// Puts blocks back in the cache.
    fn cache(&mut self, blocks: &[(CUdeviceptr, usize)]) {
        for &(ptr, class) in blocks {
            self.stats.in_use_bytes -= class;
            self.stats.cached_bytes += class;
            if class > LARGE {
                self.large.give(ptr);
            } else {
                self.free.entry(class).or_default().push(ptr);
            }
        }
    }

    /// A cached block of `class` bytes, if there is one.
    fn reuse_cached(&mut self, class: usize) -> Option<CUdeviceptr> {
        let ptr = if class > LARGE { self.large.take(class) } else { self.free.get_mut(&class).and_then(Vec::pop) }?;
        self.stats.cached_bytes -= class;
        self.stats.cache_hits += 1;
        Some(ptr)
    }
}

impl CachingAllocator {
    /// Its counters.
    pub fn stats(&self) -> AllocatorStats {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).stats
    }

    /// Restarts the peak at the bytes in use now (`torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peak(&self) {
        let mut pools = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        pools.stats.peak_in_use_bytes = pools.stats.in_use_bytes;
    }

    /// A block of at least `bytes` (exactly its size class); `0` for zero bytes.
    fn alloc(&self, dev: &CudaDevice, bytes: usize) -> Result<(CUdeviceptr, usize)> {
        let class = size_class(bytes);
        if class == 0 {
            return Ok((0, 0));
        }
        {
            let mut pools = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(ptr) = pools.graphs.reuse(class) {
                return Ok((ptr, class));
            }
            if let Some(ptr) = pools.reuse_cached(class) {
                pools.take(class);
                pools.graphs.handed_out(ptr, class);
                return Ok((ptr, class));
            }
        }
        // From the driver: a block of its own, or a segment to cut large blocks from (the
        // smallest that holds the block when memory is short).
        let (wanted, least) = if class > LARGE { (segment_bytes(class), whole_pages(class)) } else { (class, class) };
        let (ptr, got) = match driver_alloc(dev, wanted) {
            Ok(ptr) => (ptr, wanted),
            Err(_) => {
                // Out of memory (most likely): give the cache back to the driver and retry.
                dev.wait()?;
                self.release_all(dev)?;
                let ptr = driver_alloc(dev, least).map_err(|e| {
                    Error::runtime(format!(
                        "CUDA out of memory: cannot allocate {class} bytes on cuda:{} ({} bytes in use by coil): {e}",
                        dev.ordinal(),
                        self.stats().in_use_bytes
                    ))
                })?;
                (ptr, least)
            }
        };
        let mut pools = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        pools.stats.driver_allocations += 1;
        let ptr = if class > LARGE {
            pools.large.add_segment(ptr, got);
            pools.stats.cached_bytes += got - class;
            pools.large.take(class).expect("the new segment holds the block")
        } else {
            ptr
        };
        pools.take(class);
        pools.graphs.handed_out(ptr, class);
        Ok((ptr, class))
    }

    /// Returns a block to the cache. No driver call: it cannot fail, and it may run on any
    /// thread (a buffer dropped anywhere).
    fn free(&self, ptr: CUdeviceptr, class: usize) {
        if class == 0 {
            return;
        }
        let mut pools = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if pools.graphs.give_back(ptr, class) {
            pools.cache(&[(ptr, class)]);
        }
    }

    /// Starts a CUDA graph's capture on the calling thread: every block it is handed until
    /// [`CachingAllocator::end_capture`] belongs to the graph ([`GraphPools`]).
    pub(crate) fn begin_capture(&self) -> Result<()> {
        let mut pools = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        pools.graphs.begin().map_err(Error::runtime)
    }

    /// Ends the capture: the blocks the graph holds (to pass to
    /// [`CachingAllocator::release_graph`] when it is destroyed).
    pub(crate) fn end_capture(&self) -> Vec<(CUdeviceptr, usize)> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).graphs.end()
    }

    /// Abandons a capture that failed.
    pub(crate) fn abort_capture(&self) {
        let mut pools = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let free = pools.graphs.abort();
        pools.cache(&free);
    }

    /// A graph is destroyed: its blocks go back to the cache (those no handle holds now, the
    /// others when their handle drops them). The graph's launches are before, in stream order,
    /// any work of the blocks' next owners.
    pub(crate) fn release_graph(&self, blocks: &[(CUdeviceptr, usize)]) {
        let mut pools = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let free = pools.graphs.release(blocks);
        pools.cache(&free);
    }

    /// Frees the cached blocks to the driver: the small ones, and the segments of large
    /// blocks with nothing handed out. The caller has synchronised the stream (no pending work
    /// uses a cached block).
    pub(crate) fn release_all(&self, dev: &CudaDevice) -> Result<()> {
        let blocks: Vec<CUdeviceptr> = {
            let mut pools = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let segments = pools.large.drain_free_segments();
            pools.stats.cached_bytes = pools.large.free_bytes();
            let small = pools.free.drain().flat_map(|(_, v)| v);
            small.chain(segments.into_iter().map(|(base, _)| base)).collect()
        };
        dev.bind()?;
        for ptr in blocks {
            // SAFETY: the block came from `malloc_sync` in this context, is in no one's hands
            // (it was in the free list, now drained), and no pending work uses it.
            unsafe { drv::free_sync(ptr) }.map_err(|e| driver_error("cuMemFree", e))?;
        }
        Ok(())
    }
}

/// `bytes` rounded up to the driver's 2 MiB pages.
fn whole_pages(bytes: usize) -> usize {
    bytes.div_ceil(2 << 20).saturating_mul(2 << 20)
}

/// `cuMemAlloc` of `bytes` in `dev`'s context.
fn driver_alloc(dev: &CudaDevice, bytes: usize) -> Result<CUdeviceptr> {
    dev.bind()?;
    // SAFETY: a plain device allocation in the bound context; the pointer is owned by the
    // allocator until it is freed back to the driver.
    unsafe { drv::malloc_sync(bytes) }.map_err(|e| driver_error("cuMemAlloc", e))
}

/// An allocation on a device, returned to the device's cache when dropped.
#[derive(Debug)]
pub struct DeviceMemory {
    device: Arc<CudaDevice>,
    ptr: CUdeviceptr,
    bytes: usize,
    class: usize,
}

impl DeviceMemory {
    /// At least `bytes` bytes of uninitialised device memory (filled with `0xFF` bytes under
    /// the configuration's `poison_device_memory`, a debugging aid).
    pub fn alloc(device: &Arc<CudaDevice>, bytes: usize) -> Result<DeviceMemory> {
        let (ptr, class) = device.allocator.alloc(device, bytes)?;
        let mem = DeviceMemory { device: device.clone(), ptr, bytes, class };
        if bytes > 0 && coil_ir::config::current().tuning.poison_device_memory {
            device.bind()?;
            // SAFETY: the range is this allocation's; stream-ordered like every use of it.
            // The whole block (its size class), so reads past the end show too.
            unsafe { drv::memset_d8_async(ptr, 0xFF, class, device.cu_stream()) }
                .map_err(|e| driver_error("cuMemsetD8Async", e))?;
        }
        Ok(mem)
    }

    /// The device address (0 for an empty allocation).
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The bytes asked for.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The device it lives on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// Enqueues zero-filling of the first `bytes` bytes.
    pub fn zero(&self, bytes: usize) -> Result<()> {
        self.fill_first(bytes, 0)
    }

    /// Enqueues filling the whole allocation with `byte` (timing code overwrites the L2 cache
    /// so).
    pub fn fill(&self, byte: u8) -> Result<()> {
        self.fill_first(self.bytes, byte)
    }

    fn fill_first(&self, bytes: usize, byte: u8) -> Result<()> {
        assert!(bytes <= self.bytes, "filling past the allocation");
        if bytes == 0 {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: the range lies inside this allocation; stream-ordered like every use.
        unsafe { drv::memset_d8_async(self.ptr, byte, bytes, self.device.cu_stream()) }
            .map_err(|e| driver_error("cuMemsetD8Async", e))
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        self.device.allocator.free(self.ptr, self.class);
    }
}

/// Enqueues a host-to-device copy of `src` to `dst`. An error while the calling thread
/// captures a CUDA graph (the graph would keep the host address).
///
/// # Safety
/// `dst` must address at least `src.len()` bytes of device memory of `dev`.
pub(crate) unsafe fn upload(dev: &CudaDevice, dst: CUdeviceptr, src: &[u8]) -> Result<()> {
    dev.refuse_while_capturing("a copy from host memory")?;
    if src.is_empty() {
        return Ok(());
    }
    dev.bind()?;
    // SAFETY: `dst` is valid for `src.len()` bytes (caller). `src` is pageable host memory:
    // the driver stages it before returning, so it may be dropped right after the call.
    unsafe { drv::memcpy_htod_async(dst, src, dev.cu_stream()) }.map_err(|e| driver_error("cuMemcpyHtoDAsync", e))
}

/// Copies `len` bytes at `src` to the host, waiting for the stream (and so for all work
/// enqueued before, whose asynchronous driver errors surface here; kernels' status words are
/// left for the caller: [`CudaBuffer::to_host`] checks them). An error while the calling
/// thread captures a CUDA graph.
///
/// # Safety
/// `src` must address at least `len` bytes of device memory of `dev`.
pub(crate) unsafe fn download(dev: &CudaDevice, src: CUdeviceptr, len: usize) -> Result<Vec<u8>> {
    dev.refuse_while_capturing("a copy to host memory")?;
    let mut out = crate::buffer::try_zeroed_vec::<u8>(len)?;
    if len > 0 {
        dev.bind()?;
        // SAFETY: `src` is valid for `len` bytes (caller); `out` stays alive and unmoved until
        // the synchronisation below.
        unsafe { drv::memcpy_dtoh_async(&mut out[..], src, dev.cu_stream()) }
            .map_err(|e| driver_error("cuMemcpyDtoHAsync", e))?;
    }
    dev.wait()?;
    Ok(out)
}

/// Enqueues a device-to-device copy of `len` bytes.
///
/// # Safety
/// Both addresses must be valid for `len` bytes on `dev` and not overlap.
pub(crate) unsafe fn copy_device(dev: &CudaDevice, dst: CUdeviceptr, src: CUdeviceptr, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    dev.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv::memcpy_dtod_async(dst, src, len, dev.cu_stream()) }.map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
}

/// A contiguous tensor in device memory (row-major, raw bytes as the kernels see them: bool as
/// one byte 0/1, f16/bf16 as their 16 bits).
#[derive(Debug)]
pub struct CudaBuffer {
    mem: DeviceMemory,
    /// Shape and dtype. Public for convenience; whoever uses the memory checks it against
    /// [`bytes`](Self::bytes) (the allocation), so a changed meta cannot reach past it.
    pub meta: TensorMeta,
}

impl CudaBuffer {
    /// An uninitialised buffer for `meta`.
    pub fn alloc(device: &Arc<CudaDevice>, meta: TensorMeta) -> Result<CudaBuffer> {
        Ok(CudaBuffer { mem: DeviceMemory::alloc(device, meta.nbytes())?, meta })
    }

    /// A zero-filled buffer for `meta`.
    pub fn zeros(device: &Arc<CudaDevice>, meta: TensorMeta) -> Result<CudaBuffer> {
        let buf = CudaBuffer::alloc(device, meta)?;
        buf.mem.zero(buf.bytes())?;
        Ok(buf)
    }

    /// Copies a host buffer to `device`.
    pub fn from_host(device: &Arc<CudaDevice>, host: &Buffer) -> Result<CudaBuffer> {
        CudaBuffer::from_bytes(device, host.meta(), host.data.as_bytes())
    }

    /// Copies the raw bytes of a tensor of `meta` (row-major, as [`HostData::as_bytes`] lays
    /// them out: bool as one byte 0/1) to `device`, straight from `bytes` (e.g. a memory-mapped
    /// file: no host copy first). An error if the length is not `meta.nbytes()`.
    pub fn from_bytes(device: &Arc<CudaDevice>, meta: TensorMeta, bytes: &[u8]) -> Result<CudaBuffer> {
        if bytes.len() != meta.nbytes() {
            return Err(Error::value(format!(
                "{} bytes do not hold a {meta} tensor ({} bytes)",
                bytes.len(),
                meta.nbytes()
            )));
        }
        let buf = CudaBuffer::alloc(device, meta)?;
        // SAFETY: the allocation holds `nbytes` = `bytes.len()` bytes.
        unsafe { upload(device, buf.ptr(), bytes)? };
        Ok(buf)
    }

    /// Copies it back to the host: a synchronization point. It waits for the stream, and the
    /// first data error a kernel of an unchecked run reported is returned instead of the
    /// values ([`super::CudaDevice::synchronize`]).
    pub fn to_host(&self) -> Result<Buffer> {
        let dev = &self.mem.device;
        // SAFETY: the allocation holds `bytes()` bytes.
        let bytes = unsafe { download(dev, self.ptr(), self.bytes())? };
        dev.status.check(dev)?;
        Buffer::new(self.meta.shape.clone(), HostData::from_bytes(self.meta.dtype, &bytes)?)
    }

    /// A device-side copy.
    pub fn try_clone(&self) -> Result<CudaBuffer> {
        let copy = CudaBuffer { mem: DeviceMemory::alloc(&self.mem.device, self.bytes())?, meta: self.meta.clone() };
        // SAFETY: both allocations hold `bytes()` bytes and are distinct.
        unsafe { copy_device(&self.mem.device, copy.ptr(), self.ptr(), self.bytes())? };
        Ok(copy)
    }

    /// The device address of the first element (0 when empty).
    pub fn ptr(&self) -> CUdeviceptr {
        self.mem.ptr()
    }

    /// Size in bytes (`meta.nbytes()`).
    pub fn bytes(&self) -> usize {
        self.mem.bytes()
    }

    /// Shape and dtype.
    pub fn meta(&self) -> &TensorMeta {
        &self.meta
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.meta.dtype
    }

    /// The device it lives on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        self.mem.device()
    }

    /// The ordinal of the device it lives on.
    pub fn device_ordinal(&self) -> usize {
        self.mem.device().ordinal()
    }
}
