//! A strided gather on the device: copies any strided view into a contiguous buffer.
//!
//! cuBLASLt takes a matrix only as a leading dimension plus a transpose flag, and its bias
//! epilogue only a contiguous vector; the few views that are not expressible so are first
//! gathered by these kernels. They are built-in CUDA C, compiled with NVRTC (through the disk
//! cache) the first time a device needs them.

use super::compiler::{compile, LoadedModule};
use super::device::{driver_error, CudaDevice};
use coil_ir::{Error, Result};
use cudarc::driver::{result as drv, sys};
use std::ffi::c_void;
use std::sync::Arc;

/// The built-in helper kernels: a strided gather per element size (1, 2, 4, 8 bytes).
pub struct Helpers {
    _module: LoadedModule,
    gather: [sys::CUfunction; 4],
}

// SAFETY: function handles are immutable and usable from any thread with the context bound.
unsafe impl Send for Helpers {}
// SAFETY: as above.
unsafe impl Sync for Helpers {}

/// Most dims a gather handles (after dropping size-1 dims).
const GATHER_DIMS: usize = 8;

const HELPERS_SOURCE: &str = r#"
struct CoilDims { long long size[8]; long long stride[8]; };
#define COIL_GATHER(NAME, T)                                                                  \
extern "C" __global__ void NAME(const T* __restrict__ src, T* __restrict__ dst, long long n,   \
                                int ndim, CoilDims d) {                                        \
    if (n < 2147483648LL) { /* 32-bit divisions: several times cheaper than 64-bit ones */   \
        for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned)n;             \
             i += gridDim.x * blockDim.x) {                                                    \
            unsigned rem = i;                                                                  \
            long long off = 0;                                                                 \
            for (int k = ndim - 1; k >= 0; --k) {                                              \
                unsigned s = (unsigned)d.size[k], q = rem / s;                                 \
                off += (long long)(rem - q * s) * d.stride[k];                                 \
                rem = q;                                                                       \
            }                                                                                  \
            dst[i] = src[off];                                                                 \
        }                                                                                      \
        return;                                                                                \
    }                                                                                          \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                \
         i += (long long)gridDim.x * blockDim.x) {                                             \
        long long rem = i, off = 0;                                                            \
        for (int k = ndim - 1; k >= 0; --k) {                                                  \
            long long q = rem / d.size[k];                                                     \
            off += (rem - q * d.size[k]) * d.stride[k];                                        \
            rem = q;                                                                           \
        }                                                                                      \
        dst[i] = src[off];                                                                     \
    }                                                                                          \
}
COIL_GATHER(coil_gather_1, unsigned char)
COIL_GATHER(coil_gather_2, unsigned short)
COIL_GATHER(coil_gather_4, unsigned int)
COIL_GATHER(coil_gather_8, unsigned long long)
"#;

/// The kernel argument `CoilDims`, laid out as the C struct.
#[repr(C)]
#[derive(Clone, Copy)]
struct GatherDims {
    size: [i64; GATHER_DIMS],
    stride: [i64; GATHER_DIMS],
}

impl Helpers {
    fn get(dev: &Arc<CudaDevice>) -> Result<&Helpers> {
        dev.helpers
            .get_or_init(|| {
                let build = || -> Result<Helpers> {
                    let (cubin, _) = compile(HELPERS_SOURCE, &dev.arch(), &crate::cpu::default_cache_dir())?;
                    let module = LoadedModule::load(dev, &cubin)?;
                    let f = |n: usize| module.function(&format!("coil_gather_{n}"));
                    let gather = [f(1)?, f(2)?, f(4)?, f(8)?];
                    Ok(Helpers { _module: module, gather })
                };
                build().map_err(|e| e.message)
            })
            .as_ref()
            .map_err(|e| Error::runtime(e.clone()))
    }
}

/// Enqueues `dst[i] = src[sum_d idx_d(i) * strides[d]]` for the row-major index `i` over
/// `sizes`, elements of `elem` bytes. `src` already includes the view's offset.
///
/// # Safety
/// Every element the view reaches must lie inside `src`'s allocation, and `dst` must hold
/// `product(sizes)` elements, not overlapping `src`.
pub(crate) unsafe fn gather(
    dev: &Arc<CudaDevice>,
    src: sys::CUdeviceptr,
    dst: sys::CUdeviceptr,
    elem: usize,
    sizes: &[usize],
    strides: &[usize],
) -> Result<()> {
    let n: usize = sizes.iter().product();
    if n == 0 {
        return Ok(());
    }
    let dims: Vec<(usize, usize)> =
        sizes.iter().copied().zip(strides.iter().copied()).filter(|&(s, _)| s != 1).collect();
    if dims.len() > GATHER_DIMS {
        return Err(Error::unsupported(format!("a strided copy of {} dims (at most {GATHER_DIMS})", dims.len())));
    }
    let mut d = GatherDims { size: [1; GATHER_DIMS], stride: [0; GATHER_DIMS] };
    for (k, &(s, st)) in dims.iter().enumerate() {
        d.size[k] = s as i64;
        d.stride[k] = st as i64;
    }
    let f = Helpers::get(dev)?.gather[match elem {
        1 => 0,
        2 => 1,
        4 => 2,
        8 => 3,
        _ => return Err(Error::unsupported(format!("a strided copy of {elem}-byte elements"))),
    }];
    let (mut src, mut dst, mut n64, mut ndim) = (src, dst, n as i64, dims.len() as i32);
    let mut params: [*mut c_void; 5] = [
        (&mut src as *mut u64).cast(),
        (&mut dst as *mut u64).cast(),
        (&mut n64 as *mut i64).cast(),
        (&mut ndim as *mut i32).cast(),
        (&mut d as *mut GatherDims).cast(),
    ];
    // SAFETY: the parameters match coil_gather's signature; the memory contract is the caller's.
    unsafe { launch_grid_stride(dev, f, n, &mut params, "coil_gather") }
}

/// Launches a built-in grid-stride kernel over `n` items: blocks of 256 threads, at most 32
/// blocks per SM (the loop covers the rest).
///
/// # Safety
/// `params` must match `f`'s signature and point at values that live until the call returns (the
/// driver copies them); whatever memory the kernel touches is the caller's to guarantee.
pub(crate) unsafe fn launch_grid_stride(
    dev: &Arc<CudaDevice>,
    f: sys::CUfunction,
    n: usize,
    params: &mut [*mut c_void],
    name: &str,
) -> Result<()> {
    let block = 256u32;
    let grid = n.div_ceil(block as usize).min(dev.sm_count() as usize * 32).max(1) as u32;
    dev.bind()?;
    // SAFETY: the caller's contract.
    unsafe { drv::launch_kernel(f, (grid, 1, 1), (block, 1, 1), 0, dev.cu_stream(), params) }
        .map_err(|e| driver_error(&format!("cuLaunchKernel({name})"), e))
}
