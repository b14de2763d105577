//! Built-in kernels for the fallback ops (ops with no generated kernel yet): `scatter` /
//! `scatter_add` (the gradients of `embedding`, `index_select` and `gather`) and `cumsum`, run
//! on the device instead of on the host.
//!
//! **Scatter.** The result starts as a copy of `x`; each thread then takes elements of `index`
//! (row-major), finds the element of `x` it names (the index's own position, with the scattered
//! dim replaced by the index value) and stores `src` there or combines it atomically: adds
//! (f32, f64, i32, i64 natively), integer max and min natively, float max and min and every
//! product by a compare-and-swap loop on the value's word (f16 and bf16 on the 32-bit word
//! holding them, each update rounded once, as PyTorch's CUDA kernels do). An index out of range is reported in
//! status words of the run's, as generated kernels report theirs ([`super::status`]: code 1,
//! the index, the dim's size), checked at the next synchronization point: the call does not
//! wait for the kernel.
//!
//! **Cumsum.** One thread per line along the scanned dim (consecutive threads take consecutive
//! inner positions, so loads coalesce unless the dim is the last), summing in f64 (i64 for
//! integers, wrapping) and rounding each output to the dtype: the reference interpreter's
//! values, bit for bit. A long line is one thread's sequential work, still no host round trip.
//!
//! Other dtypes stay on the host path. Built-in CUDA C, compiled by NVRTC (through the disk
//! cache) the first time a device needs it.

use super::compiler::{compile, LoadedModule};
use super::device::CudaDevice;
use super::gather::launch_grid_stride;
use super::memory::copy_device;
use coil_ir::{DType, Error, ReduceOp, Result, TensorMeta};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Arc;

/// Most dims a scatter handles.
const SCATTER_DIMS: usize = 8;

const FALLBACK_SOURCE: &str = r#"
struct CoilScatterDims { long long size[8]; long long xstride[8]; long long sstride[8]; };
__device__ __forceinline__ float coil_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short coil_f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float coil_b2f(unsigned short h) { return __uint_as_float((unsigned)h << 16); }
__device__ __forceinline__ unsigned short coil_f2b(float f) { unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#define COIL_SAME(v) (v)
/* How scatter_reduce combines the stored value a with a source value b: max and min
   propagate NaN and keep the stored value on a tie (PyTorch's kernels). */
#define COIL_ADDF(a, b) ((a) + (b))
#define COIL_MULF(a, b) ((a) * (b))
#define COIL_MAXF(a, b) ((a) != (a) ? (a) : ((b) != (b) || (b) > (a)) ? (b) : (a))
#define COIL_MINF(a, b) ((a) != (a) ? (a) : ((b) != (b) || (b) < (a)) ? (b) : (a))
/* A 16-bit float update by compare-and-swap on the aligned 32-bit word that holds it (the
   f32 result of two 16-bit values is exact for these combines, so it rounds once). */
#define COIL_RMW16(NAME, TOF, FROMF, COMBINE)                                                   \
__device__ __forceinline__ void NAME(unsigned short *p, unsigned short v) {                    \
    unsigned *w = (unsigned *)((unsigned long long)p & ~3ULL);                                 \
    const unsigned shift = ((unsigned long long)p & 2) ? 16 : 0;                               \
    unsigned old = *w, assumed;                                                                \
    do {                                                                                       \
        assumed = old;                                                                         \
        const unsigned short r = FROMF(COMBINE(TOF((unsigned short)(assumed >> shift)), TOF(v))); \
        const unsigned next = (assumed & ~(0xffffu << shift)) | ((unsigned)r << shift);        \
        old = atomicCAS(w, assumed, next);                                                     \
    } while (old != assumed);                                                                  \
}
COIL_RMW16(coil_add_f16, coil_h2f, coil_f2h, COIL_ADDF)
COIL_RMW16(coil_add_bf16, coil_b2f, coil_f2b, COIL_ADDF)
COIL_RMW16(coil_prod_f16, coil_h2f, coil_f2h, COIL_MULF)
COIL_RMW16(coil_prod_bf16, coil_b2f, coil_f2b, COIL_MULF)
COIL_RMW16(coil_amax_f16, coil_h2f, coil_f2h, COIL_MAXF)
COIL_RMW16(coil_amax_bf16, coil_b2f, coil_f2b, COIL_MAXF)
COIL_RMW16(coil_amin_f16, coil_h2f, coil_f2h, COIL_MINF)
COIL_RMW16(coil_amin_bf16, coil_b2f, coil_f2b, COIL_MINF)
/* A 32- or 64-bit update by compare-and-swap on its own word: WORD the word type, TOV/FROMV
   its conversions to and from the value type V. */
#define COIL_RMW(NAME, V, WORD, TOV, FROMV, COMBINE)                                            \
__device__ __forceinline__ void NAME(V *p, V v) {                                              \
    WORD *w = (WORD *)p;                                                                       \
    WORD old = *w, assumed;                                                                    \
    do {                                                                                       \
        assumed = old;                                                                         \
        old = atomicCAS(w, assumed, FROMV(COMBINE(TOV(assumed), v)));                          \
    } while (old != assumed);                                                                  \
}
#define COIL_U2F(w) __uint_as_float(w)
#define COIL_F2U(f) __float_as_uint(f)
#define COIL_U2D(w) __longlong_as_double((long long)(w))
#define COIL_D2U(d) ((unsigned long long)__double_as_longlong(d))
COIL_RMW(coil_prod_f32, float, unsigned, COIL_U2F, COIL_F2U, COIL_MULF)
COIL_RMW(coil_amax_f32, float, unsigned, COIL_U2F, COIL_F2U, COIL_MAXF)
COIL_RMW(coil_amin_f32, float, unsigned, COIL_U2F, COIL_F2U, COIL_MINF)
COIL_RMW(coil_prod_f64, double, unsigned long long, COIL_U2D, COIL_D2U, COIL_MULF)
COIL_RMW(coil_amax_f64, double, unsigned long long, COIL_U2D, COIL_D2U, COIL_MAXF)
COIL_RMW(coil_amin_f64, double, unsigned long long, COIL_U2D, COIL_D2U, COIL_MINF)
COIL_RMW(coil_prod_i32, unsigned, unsigned, COIL_SAME, COIL_SAME, COIL_MULF)
COIL_RMW(coil_prod_i64, unsigned long long, unsigned long long, COIL_SAME, COIL_SAME, COIL_MULF)
#define COIL_SCATTER(NAME, T, UPDATE)                                                         \
extern "C" __global__ void NAME(T *out, const long long *__restrict__ index,                   \
                                const T *__restrict__ src, long long n, int ndim, int dim,    \
                                long long dim_size, CoilScatterDims d, long long *status) {   \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                \
         i += (long long)gridDim.x * blockDim.x) {                                             \
        long long rem = i, xo = 0, so = 0;                                                     \
        for (int k = ndim - 1; k >= 0; --k) {                                                  \
            const long long q = rem / d.size[k], c = rem - q * d.size[k];                      \
            rem = q;                                                                           \
            so += c * d.sstride[k];                                                            \
            if (k != dim) xo += c * d.xstride[k];                                              \
        }                                                                                      \
        const long long j = index[i];                                                          \
        if (j < 0 || j >= dim_size) {                                                          \
            if (status[0] == 0) { status[0] = 1; status[1] = j; status[2] = dim_size; }        \
            continue;                                                                          \
        }                                                                                      \
        T *p = out + xo + j * d.xstride[dim];                                                  \
        UPDATE;                                                                                \
    }                                                                                          \
}
COIL_SCATTER(coil_scatter_1, unsigned char, *p = src[so])
COIL_SCATTER(coil_scatter_2, unsigned short, *p = src[so])
COIL_SCATTER(coil_scatter_4, unsigned int, *p = src[so])
COIL_SCATTER(coil_scatter_8, unsigned long long, *p = src[so])
COIL_SCATTER(coil_scatter_add_f32, float, atomicAdd(p, src[so]))
COIL_SCATTER(coil_scatter_add_f64, double, atomicAdd(p, src[so]))
COIL_SCATTER(coil_scatter_add_i32, int, atomicAdd(p, src[so]))
COIL_SCATTER(coil_scatter_add_i64, unsigned long long, atomicAdd(p, src[so]))
COIL_SCATTER(coil_scatter_add_f16, unsigned short, coil_add_f16(p, src[so]))
COIL_SCATTER(coil_scatter_add_bf16, unsigned short, coil_add_bf16(p, src[so]))
COIL_SCATTER(coil_scatter_prod_f32, float, coil_prod_f32(p, src[so]))
COIL_SCATTER(coil_scatter_prod_f64, double, coil_prod_f64(p, src[so]))
COIL_SCATTER(coil_scatter_prod_i32, unsigned, coil_prod_i32(p, src[so]))
COIL_SCATTER(coil_scatter_prod_i64, unsigned long long, coil_prod_i64(p, src[so]))
COIL_SCATTER(coil_scatter_prod_f16, unsigned short, coil_prod_f16(p, src[so]))
COIL_SCATTER(coil_scatter_prod_bf16, unsigned short, coil_prod_bf16(p, src[so]))
COIL_SCATTER(coil_scatter_amax_f32, float, coil_amax_f32(p, src[so]))
COIL_SCATTER(coil_scatter_amax_f64, double, coil_amax_f64(p, src[so]))
COIL_SCATTER(coil_scatter_amax_i32, int, atomicMax(p, src[so]))
COIL_SCATTER(coil_scatter_amax_i64, long long, atomicMax(p, src[so]))
COIL_SCATTER(coil_scatter_amax_f16, unsigned short, coil_amax_f16(p, src[so]))
COIL_SCATTER(coil_scatter_amax_bf16, unsigned short, coil_amax_bf16(p, src[so]))
COIL_SCATTER(coil_scatter_amin_f32, float, coil_amin_f32(p, src[so]))
COIL_SCATTER(coil_scatter_amin_f64, double, coil_amin_f64(p, src[so]))
COIL_SCATTER(coil_scatter_amin_i32, int, atomicMin(p, src[so]))
COIL_SCATTER(coil_scatter_amin_i64, long long, atomicMin(p, src[so]))
COIL_SCATTER(coil_scatter_amin_f16, unsigned short, coil_amin_f16(p, src[so]))
COIL_SCATTER(coil_scatter_amin_bf16, unsigned short, coil_amin_bf16(p, src[so]))
#define COIL_CUMSUM(NAME, T, ACC, LOAD, STORE)                                                 \
extern "C" __global__ void NAME(const T *__restrict__ x, T *__restrict__ y, long long lines,     \
                                long long len, long long inner) {                               \
    for (long long l = blockIdx.x * (long long)blockDim.x + threadIdx.x; l < lines;              \
         l += (long long)gridDim.x * blockDim.x) {                                              \
        const long long o = l / inner, base = o * len * inner + (l - o * inner);                \
        ACC acc = 0;                                                                            \
        for (long long j = 0; j < len; j++) {                                                   \
            acc += LOAD(x[base + j * inner]);                                                   \
            y[base + j * inner] = STORE(acc);                                                   \
        }                                                                                       \
    }                                                                                           \
}
#define COIL_TO_F32(v) ((float)(v))
#define COIL_H2D(v) ((double)coil_h2f(v))
#define COIL_D2H(v) coil_f2h((float)(v))
#define COIL_B2D(v) ((double)coil_b2f(v))
#define COIL_D2B(v) coil_f2b((float)(v))
COIL_CUMSUM(coil_cumsum_f32, float, double, COIL_SAME, COIL_TO_F32)
COIL_CUMSUM(coil_cumsum_f64, double, double, COIL_SAME, COIL_SAME)
COIL_CUMSUM(coil_cumsum_i64, unsigned long long, unsigned long long, COIL_SAME, COIL_SAME)
COIL_CUMSUM(coil_cumsum_f16, unsigned short, double, COIL_H2D, COIL_D2H)
COIL_CUMSUM(coil_cumsum_bf16, unsigned short, double, COIL_B2D, COIL_D2B)
"#;

/// The kernel argument `CoilScatterDims`, laid out as the C struct.
#[repr(C)]
#[derive(Clone, Copy)]
struct ScatterDims {
    size: [i64; SCATTER_DIMS],
    xstride: [i64; SCATTER_DIMS],
    sstride: [i64; SCATTER_DIMS],
}

/// The built-in fallback kernels of one device.
pub struct FallbackKernels {
    module: LoadedModule,
}

// SAFETY: the module's function handles are immutable and usable from any thread with the
// context bound.
unsafe impl Send for FallbackKernels {}
// SAFETY: as above.
unsafe impl Sync for FallbackKernels {}

impl FallbackKernels {
    fn get(dev: &Arc<CudaDevice>) -> Result<&FallbackKernels> {
        dev.fallback
            .get_or_init(|| {
                let build = || -> Result<FallbackKernels> {
                    let (cubin, _) = compile(FALLBACK_SOURCE, &dev.arch(), &crate::cpu::default_cache_dir())?;
                    Ok(FallbackKernels { module: LoadedModule::load(dev, &cubin)? })
                };
                build().map_err(|e| e.message)
            })
            .as_ref()
            .map_err(|e| Error::runtime(e.clone()))
    }
}

/// The scatter kernel for `dtype`, if the device path handles it.
fn scatter_kernel(dtype: DType, reduce: Option<ReduceOp>) -> Option<String> {
    let Some(reduce) = reduce else {
        return Some(format!("coil_scatter_{}", dtype.size_bytes()));
    };
    let kind = match reduce {
        ReduceOp::Sum => "add",
        ReduceOp::Prod => "prod",
        ReduceOp::Max => "amax",
        ReduceOp::Min => "amin",
        ReduceOp::ArgMax | ReduceOp::ArgMin => return None,
    };
    let suffix = match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => return None,
    };
    Some(format!("coil_scatter_{kind}_{suffix}"))
}

/// Whether the device kernel runs `scatter(x, dim, index, src)` of these operands
/// (an i64 index, a dtype it has a kernel for, at most 8 dims).
pub fn supports_scatter(x: &TensorMeta, index: &TensorMeta, reduce: Option<ReduceOp>) -> bool {
    index.dtype == DType::I64 && x.rank() <= SCATTER_DIMS && scatter_kernel(x.dtype, reduce).is_some()
}

/// Row-major strides of `shape`, in elements.
fn strides(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1] as i64;
    }
    s
}

/// Enqueues `out = scatter(x, dim, index, src)` (combined by `reduce`, if any) on contiguous device
/// buffers; an index out of range is reported in the 4 status words at `status` (zero before).
///
/// # Safety
/// Each pointer must address a contiguous buffer of its meta on `dev`; `out` (the shape of `x`)
/// must not overlap `index` or `src`; `status` must address 4 `i64` words on `dev`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn scatter(
    dev: &Arc<CudaDevice>,
    dim: usize,
    reduce: Option<ReduceOp>,
    (x, xm): (sys::CUdeviceptr, &TensorMeta),
    (index, im): (sys::CUdeviceptr, &TensorMeta),
    (src, sm): (sys::CUdeviceptr, &TensorMeta),
    out: sys::CUdeviceptr,
    status: sys::CUdeviceptr,
) -> Result<()> {
    let name = scatter_kernel(xm.dtype, reduce).filter(|_| supports_scatter(xm, im, reduce));
    let Some(name) = name else {
        return Err(Error::unsupported(format!("a device scatter of {xm} with a {} index", im.dtype)));
    };
    if out != x {
        // SAFETY: both hold x's bytes (caller); distinct buffers of the program do not overlap.
        unsafe { copy_device(dev, out, x, xm.nbytes())? };
    }
    let n = im.numel();
    if n == 0 {
        return Ok(());
    }
    let kernels = FallbackKernels::get(dev)?;
    let f = kernels.module.function(&name)?;
    let mut d = ScatterDims { size: [1; SCATTER_DIMS], xstride: [0; SCATTER_DIMS], sstride: [0; SCATTER_DIMS] };
    let (xs, ss) = (strides(&xm.shape), strides(&sm.shape));
    for k in 0..xm.rank() {
        d.size[k] = im.shape[k] as i64;
        d.xstride[k] = xs[k];
        d.sstride[k] = ss[k];
    }
    let (mut out_p, mut index_p, mut src_p, mut status_p) = (out, index, src, status);
    let (mut n64, mut ndim, mut dim32, mut dim_size) =
        (n as i64, xm.rank().max(1) as i32, dim as i32, xm.shape.get(dim).copied().unwrap_or(1) as i64);
    let mut params: [*mut c_void; 9] = [
        (&mut out_p as *mut u64).cast(),
        (&mut index_p as *mut u64).cast(),
        (&mut src_p as *mut u64).cast(),
        (&mut n64 as *mut i64).cast(),
        (&mut ndim as *mut i32).cast(),
        (&mut dim32 as *mut i32).cast(),
        (&mut dim_size as *mut i64).cast(),
        (&mut d as *mut ScatterDims).cast(),
        (&mut status_p as *mut u64).cast(),
    ];
    // SAFETY: the parameters match the scatter kernels' signature; the memory contract is the
    // caller's.
    unsafe { launch_grid_stride(dev, f, n, &mut params, "coil_scatter") }
}

/// The cumsum kernel for `dtype`, if the device path handles it (integers arrive as i64: the
/// decomposition casts them).
fn cumsum_kernel(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "coil_cumsum_f32",
        DType::F64 => "coil_cumsum_f64",
        DType::I64 => "coil_cumsum_i64",
        DType::F16 => "coil_cumsum_f16",
        DType::BF16 => "coil_cumsum_bf16",
        _ => return None,
    })
}

/// Whether the device kernel runs `cumsum(x, dim)` with this output (of x's dtype).
pub fn supports_cumsum(x: &TensorMeta, out: &TensorMeta) -> bool {
    x.dtype == out.dtype && x.shape == out.shape && cumsum_kernel(x.dtype).is_some()
}

/// `out = cumsum(x, dim)` on contiguous device buffers of x's meta.
///
/// # Safety
/// `x` and `out` must address contiguous buffers of `xm` on `dev`, not overlapping.
pub(crate) unsafe fn cumsum(
    dev: &Arc<CudaDevice>,
    dim: usize,
    (x, xm): (sys::CUdeviceptr, &TensorMeta),
    out: sys::CUdeviceptr,
) -> Result<()> {
    let Some(name) = cumsum_kernel(xm.dtype) else {
        return Err(Error::unsupported(format!("a device cumsum of {xm}")));
    };
    let n = xm.numel();
    if n == 0 {
        return Ok(());
    }
    // A 0-d tensor is one line of one element.
    let len = xm.shape.get(dim).copied().unwrap_or(1);
    let inner: usize = xm.shape.get(dim + 1..).map_or(1, |s| s.iter().product());
    let f = FallbackKernels::get(dev)?.module.function(name)?;
    let (mut x_p, mut out_p) = (x, out);
    let (mut lines, mut len64, mut inner64) = ((n / len) as i64, len as i64, inner as i64);
    let mut params: [*mut c_void; 5] = [
        (&mut x_p as *mut u64).cast(),
        (&mut out_p as *mut u64).cast(),
        (&mut lines as *mut i64).cast(),
        (&mut len64 as *mut i64).cast(),
        (&mut inner64 as *mut i64).cast(),
    ];
    // SAFETY: the parameters match the cumsum kernels' signature; the memory contract is the
    // caller's.
    unsafe { launch_grid_stride(dev, f, lines as usize, &mut params, "coil_cumsum") }
}
