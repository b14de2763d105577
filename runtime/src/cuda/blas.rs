//! Batched matrix products ([`ExternCall::Bmm`](coil_ir::loops::ExternCall)) on the GPU.
//!
//! * f32, f16, bf16 (and f64) run through cuBLASLt (`cublasLtMatmul`): compute type
//!   `CUBLAS_COMPUTE_32F` — plain fp32 accumulation, **TF32 off** (that would take
//!   `CUBLAS_COMPUTE_32F_FAST_TF32`) — with the output in the input dtype, f64 in
//!   `CUBLAS_COMPUTE_64F`. A bias row is fused as the `CUBLASLT_EPILOGUE_BIAS` epilogue; an
//!   activation ([`Activation::GeluTanh`], after the bias) as `CUBLASLT_EPILOGUE_GELU_BIAS`
//!   (`CUBLASLT_EPILOGUE_GELU` without a bias): cuBLASLt's GELU is the tanh approximation,
//!   computed in the compute type (f32) on the accumulator plus bias, rounded once to the output.
//! * Activation fallbacks (correctness first): when the heuristic finds no algorithm with the
//!   GELU epilogue (for the views as they are, nor gathered), the product runs with the plain
//!   (bias) epilogue and a built-in in-place kernel applies the activation to the output
//!   (`apply_activation`: f32 in f32; f16 / bf16 read, computed in f32, rounded again; f64 in
//!   f64); for `k = 0` (the bias, or zeros) the same kernel follows; the host path applies it in
//!   [`crate::cpu::gemm::bmm_bytes`].
//! * Layout: the output `[*batch, m, n]` is row-major, i.e. column-major `n x m`; so cuBLASLt
//!   computes `out^T = b^T a^T`, each operand's row/column strides expressed as a leading
//!   dimension and a transpose flag. Batch dims that collapse into one stride (a broadcast
//!   batch is stride 0) use cuBLASLt's strided batch. A view that cannot be expressed so (both
//!   strides != 1, overlapping rows, a batch that does not collapse) is first gathered into a
//!   contiguous temporary on the device by a small built-in kernel ([`super::gather`]).
//! * Integer products (rare, exact wrapping arithmetic) and any product cuBLASLt has no
//!   algorithm for go to the host: operands downloaded, [`crate::cpu::gemm`], result uploaded.

mod activation;
use super::blas_choice::{problem_text, Algo, Choices, Problem};
use super::device::{driver_error, CudaDevice};
use super::gather::gather;
use super::loader::{require, CudaLib};
use super::memory::{download, upload, DeviceMemory};
use crate::cpu::gemm::{bmm_bytes_grad, bmm_bytes_to, BmmSpec};
use activation::ActivationKernels;
pub(crate) use activation::{apply_activation, apply_activation_grad};
use coil_ir::loops::{Activation, StridedOperand};
use coil_ir::{DType, Error, Result};
use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::{result as drv, sys};
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

/// cuBLASLt workspace: 32 MiB, what NVIDIA recommends for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

/// A device's cuBLASLt handle and workspace (both live as long as the process: devices are
/// never dropped).
pub struct Blas {
    handle: lt_sys::cublasLtHandle_t,
    workspace: sys::CUdeviceptr,
    /// The activation kernels, built the first time a product needs one ([`apply_activation`],
    /// [`apply_activation_grad`]).
    activation: OnceLock<std::result::Result<ActivationKernels, String>>,
    /// The algorithm chosen per problem ([`super::blas_choice`]).
    choices: Choices,
}

// SAFETY: a cuBLASLt handle is thread safe; the workspace is only used in stream order.
unsafe impl Send for Blas {}
// SAFETY: as above.
unsafe impl Sync for Blas {}

impl Blas {
    fn get(dev: &CudaDevice) -> Result<&Blas> {
        dev.blas
            .get_or_init(|| {
                require(CudaLib::CublasLt).map_err(|e| e.message)?;
                dev.bind().map_err(|e| e.message)?;
                let handle = lt::create_handle().map_err(|e| format!("cublasLtCreate failed: {e}"))?;
                // SAFETY: a plain allocation, kept for good.
                let workspace = unsafe { drv::malloc_sync(WORKSPACE_BYTES) }
                    .map_err(|e| format!("cannot allocate the cuBLASLt workspace: {e}"))?;
                Ok(Blas { handle, workspace, activation: OnceLock::new(), choices: Choices::default() })
            })
            .as_ref()
            .map_err(|e| Error::runtime(e.clone()))
    }
}

/// A device operand: the buffer's base address and its size in bytes.
#[derive(Clone, Copy, Debug)]
pub struct DevOperand {
    /// The buffer's device address.
    pub ptr: sys::CUdeviceptr,
    /// The buffer's size in bytes.
    pub bytes: usize,
}

/// Enqueues `out = act(a @ b (+ bias))` per batch for `spec` (operands and bias of `dtype`,
/// `out` of `out_dtype`: `dtype`, or f32 for f16 / bf16 operands without bias or activation,
/// the product then written in f32; `out` is the contiguous `[*batch, m, n]` output, not
/// overlapping any operand). Every view is bounds-checked against its buffer first.
#[allow(clippy::too_many_arguments)]
pub fn bmm(
    dev: &Arc<CudaDevice>,
    spec: &BmmSpec,
    dtype: DType,
    out_dtype: DType,
    a: DevOperand,
    b: DevOperand,
    bias: Option<DevOperand>,
    aux: Option<DevOperand>,
    saved: Option<DevOperand>,
    out: DevOperand,
) -> Result<()> {
    if let Some(saved) = saved {
        return bmm_saving(dev, spec, dtype, (a, b, bias), saved, out);
    }
    let (size, out_size) = (dtype.size_bytes(), out_dtype.size_bytes());
    let count: usize = spec.batch.iter().product();
    check(spec, a.bytes / size, b.bytes / size, bias.map_or(0, |x| x.bytes / size), out.bytes / out_size)?;
    let (m, n, k) = (spec.m, spec.n, spec.k);
    if count * m * n == 0 {
        return Ok(());
    }
    if out_dtype != dtype
        && !(matches!((dtype, out_dtype), (DType::F16 | DType::BF16, DType::F32))
            && spec.bias.is_none()
            && spec.activation.is_none())
    {
        return Err(Error::unsupported(format!("a {dtype} matrix product into a {out_dtype} result")));
    }
    if (spec.activation.is_some() || spec.activation_grad.is_some()) && !dtype.is_float() {
        return Err(Error::unsupported(format!("a {dtype} matrix product with an activation epilogue")));
    }
    let aux = match (spec.activation_grad, aux) {
        (None, _) => None,
        (Some(act), Some(aux)) if aux.bytes == out.bytes && spec.bias.is_none() && spec.activation.is_none() => {
            Some((act, aux))
        }
        (Some(_), _) => {
            return Err(Error::runtime(format!(
                "bmm: an activation gradient needs its saved input of the output's {} bytes, and no bias or activation",
                out.bytes
            )))
        }
    };
    if k == 0 {
        // An empty sum: the bias broadcast over the rows, or zeros; then the activation.
        match (spec.bias, bias) {
            // SAFETY: `check` bounded the bias view; `out` holds count*m*n elements.
            (Some(view), Some(buf)) => unsafe {
                gather(dev, buf.ptr + (view.offset * size) as u64, out.ptr, size, &[count * m, n], &[0, view.stride])?
            },
            _ => {
                dev.bind()?;
                // SAFETY: `out` holds count*m*n elements.
                unsafe { drv::memset_d8_async(out.ptr, 0, count * m * n * out_size, dev.cu_stream()) }
                    .map_err(|e| driver_error("cuMemsetD8Async", e))?
            }
        }
        // (An activation's gradient times a product of zeros is zero.)
        return match spec.activation {
            // SAFETY: `out` holds count*m*n elements of `dtype`.
            Some(act) => unsafe { apply_activation(dev, act, dtype, out.ptr, count * m * n) },
            None => Ok(()),
        };
    }
    if matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64) {
        // The epilogue in cuBLASLt first; then without it, followed by our kernel.
        let wanted = match (spec.activation, aux) {
            (Some(act), _) => Some(Epilogue::Activation(act)),
            (None, Some((act, aux))) => Some(Epilogue::Grad(act, aux.ptr)),
            (None, None) => None,
        };
        let in_library: &[Option<Epilogue>] = match wanted {
            Some(e) => &[Some(e), None],
            None => &[None],
        };
        let parts = outer_split(spec);
        for &epilogue in in_library {
            for gather_all in [false, true] {
                let mut result = Ok(());
                for (part, first) in &parts {
                    let at = first * out_size;
                    let out = DevOperand { ptr: out.ptr + at as u64, bytes: out.bytes - at };
                    // The saved input is laid out as the output.
                    let epilogue = epilogue.map(|e| match e {
                        Epilogue::Grad(act, aux) => Epilogue::Grad(act, aux + at as u64),
                        e => e,
                    });
                    result = lt_matmul(dev, part, (dtype, out_dtype), a, b, bias, out, gather_all, epilogue);
                    if result.is_err() {
                        break;
                    }
                }
                match result {
                    Err(LtError::NoAlgorithm) => {}
                    Err(LtError::Other(e)) => return Err(e),
                    Ok(()) if epilogue.is_some() => return Ok(()),
                    Ok(()) => {
                        let n = count * m * n;
                        return match wanted {
                            Some(e) => {
                                ACTIVATION_KERNELS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                match e {
                                    // SAFETY: `out` holds count*m*n elements of `dtype`.
                                    Epilogue::Activation(act) => unsafe {
                                        apply_activation(dev, act, dtype, out.ptr, n)
                                    },
                                    // SAFETY: `out` and the saved input (checked above) hold n elements.
                                    Epilogue::Grad(act, aux) => unsafe {
                                        apply_activation_grad(dev, act, dtype, out.ptr, aux, n)
                                    },
                                    Epilogue::Saving(..) => unreachable!("products saving their input: bmm_saving"),
                                }
                            }
                            None => Ok(()),
                        };
                    }
                }
            }
        }
    }
    on_host(dev, spec, (dtype, out_dtype), a, b, bias, aux.map(|(_, x)| x), out)
}

/// Enqueues `saved = a @ b (+ bias)` and `out = act(saved)` (`spec`'s activation; `saved`
/// laid out as `out`, both of `dtype`): cuBLASLt's `CUBLASLT_EPILOGUE_GELU_AUX_BIAS` (or
/// `GELU_AUX`), which computes the activation on the unrounded sum; where cuBLASLt has no
/// algorithm for it, the product into `saved`, a copy to `out` and [`apply_activation`] there.
fn bmm_saving(
    dev: &Arc<CudaDevice>,
    spec: &BmmSpec,
    dtype: DType,
    (a, b, bias): (DevOperand, DevOperand, Option<DevOperand>),
    saved: DevOperand,
    out: DevOperand,
) -> Result<()> {
    let Some(act) = spec.activation else {
        return Err(Error::runtime("bmm: a saved activation input without an activation".to_string()));
    };
    if saved.bytes != out.bytes || !dtype.is_float() {
        return Err(Error::runtime(format!(
            "bmm: a {dtype} product saving its activation's input needs a float output and a saved buffer of its {} \
             bytes (got {})",
            out.bytes, saved.bytes
        )));
    }
    let size = dtype.size_bytes();
    check(spec, a.bytes / size, b.bytes / size, bias.map_or(0, |x| x.bytes / size), out.bytes / size)?;
    if spec.k > 0 && matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        let parts = outer_split(spec);
        for gather_all in [false, true] {
            let mut result = Ok(());
            for (part, first) in &parts {
                let at = (first * size) as u64;
                let out = DevOperand { ptr: out.ptr + at, bytes: out.bytes - at as usize };
                let epilogue = Some(Epilogue::Saving(act, saved.ptr + at));
                result = lt_matmul(dev, part, (dtype, dtype), a, b, bias, out, gather_all, epilogue);
                if result.is_err() {
                    break;
                }
            }
            match result {
                Ok(()) => return Ok(()),
                Err(LtError::NoAlgorithm) => {}
                Err(LtError::Other(e)) => return Err(e),
            }
        }
    }
    let plain = BmmSpec { activation: None, ..spec.clone() };
    bmm(dev, &plain, dtype, dtype, a, b, bias, None, None, saved)?;
    ACTIVATION_KERNELS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: `saved` and `out` are distinct buffers of `out.bytes` bytes, `out.bytes / size`
    // elements of `dtype`.
    unsafe {
        super::memory::copy_device(dev, out.ptr, saved.ptr, out.bytes)?;
        apply_activation(dev, act, dtype, out.ptr, out.bytes / size)
    }
}

/// What cuBLASLt applies to the product (besides the bias): an activation, an activation
/// also writing its input to the given device address, or an activation's gradient at the
/// saved input at the given device address (both laid out as the output).
#[derive(Clone, Copy, Debug)]
enum Epilogue {
    Activation(Activation),
    Saving(Activation, sys::CUdeviceptr),
    Grad(Activation, sys::CUdeviceptr),
}

/// The calls that compute `spec` on cuBLASLt, each with the first output element it writes:
/// `spec` itself, or, when its operands' batch dims do not collapse into one stride (heads
/// viewed out of a fused QKV product: `[B, H]` with strides `T*3C` and `hd`) but do without
/// the outermost dim, one call per index of that dim, which spares gathering the operands.
fn outer_split(spec: &BmmSpec) -> Vec<(BmmSpec, usize)> {
    let whole = |op: &StridedOperand<usize>, rows, cols| lt_view(op, &spec.batch, rows, cols).is_some();
    let (m, n, k) = (spec.m, spec.n, spec.k);
    if spec.batch.len() < 2 || (whole(&spec.a, m, k) && whole(&spec.b, k, n)) {
        return vec![(spec.clone(), 0)];
    }
    let inner = |op: &StridedOperand<usize>, i: usize| StridedOperand {
        buffer: op.buffer,
        offset: op.offset + i * op.batch_strides[0],
        batch_strides: op.batch_strides[1..].to_vec(),
        row_stride: op.row_stride,
        col_stride: op.col_stride,
    };
    let rest = &spec.batch[1..];
    let fits = |op: &StridedOperand<usize>, rows, cols| lt_view(&inner(op, 0), rest, rows, cols).is_some();
    if !(fits(&spec.a, m, k) && fits(&spec.b, k, n)) {
        return vec![(spec.clone(), 0)];
    }
    let per = rest.iter().product::<usize>() * m * n;
    (0..spec.batch[0])
        .map(|i| {
            let part = BmmSpec { a: inner(&spec.a, i), b: inner(&spec.b, i), batch: rest.to_vec(), ..spec.clone() };
            (part, i * per)
        })
        .collect()
}

/// Products whose activation cuBLASLt could not take, applied by [`apply_activation`] after
/// the product instead (tests check which way a product went).
pub(crate) static ACTIVATION_KERNELS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Products that took the host path so far (tests check that float products never do).
pub(crate) static HOST_PRODUCTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The host path: download, [`bmm_bytes`] (or [`bmm_bytes_grad`]), upload.
#[allow(clippy::too_many_arguments)]
fn on_host(
    dev: &Arc<CudaDevice>,
    spec: &BmmSpec,
    (dtype, out_dtype): (DType, DType),
    a: DevOperand,
    b: DevOperand,
    bias: Option<DevOperand>,
    aux: Option<DevOperand>,
    out: DevOperand,
) -> Result<()> {
    HOST_PRODUCTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: each pointer addresses its stated number of bytes.
    let (ha, hb) = unsafe { (download_words(dev, a)?, download_words(dev, b)?) };
    let hbias = match bias {
        // SAFETY: as above.
        Some(x) if spec.bias.is_some() => unsafe { download_words(dev, x)? },
        _ => Vec::new(),
    };
    // u64 words keep every buffer aligned for every dtype (`bmm_bytes` casts to elements).
    let mut words = vec![0u64; out.bytes.div_ceil(8)];
    let host_out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..out.bytes];
    fn view(w: &[u64], x: Option<DevOperand>) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(w)[..x.map_or(0, |x| x.bytes)]
    }
    match aux {
        Some(aux) => {
            // SAFETY: as above.
            let haux = unsafe { download_words(dev, aux)? };
            bmm_bytes_grad(spec, dtype, view(&ha, Some(a)), view(&hb, Some(b)), view(&haux, Some(aux)), host_out)?
        }
        None => bmm_bytes_to(
            spec,
            dtype,
            out_dtype,
            view(&ha, Some(a)),
            view(&hb, Some(b)),
            view(&hbias, bias.filter(|_| spec.bias.is_some())),
            host_out,
        )?,
    }
    // SAFETY: `out` holds `out.bytes` bytes.
    unsafe { upload(dev, out.ptr, host_out) }?;
    // Pageable memory is staged by the driver before the upload returns; waiting anyway keeps
    // the host path from ever racing its own buffer.
    dev.wait()
}

/// An operand's bytes on the host, in u64 words (so aligned for any element type).
///
/// # Safety
/// `x.ptr` must address `x.bytes` bytes on `dev`.
unsafe fn download_words(dev: &CudaDevice, x: DevOperand) -> Result<Vec<u64>> {
    // SAFETY: caller's contract.
    let bytes = unsafe { download(dev, x.ptr, x.bytes)? };
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(&bytes);
    Ok(words)
}

/// Checks every element each view reaches against its buffer's length (in elements).
fn check(spec: &BmmSpec, a_len: usize, b_len: usize, bias_len: usize, out_len: usize) -> Result<()> {
    let bad = |msg: String| Err(Error::runtime(format!("bmm: {msg}")));
    let nb = spec.batch.len();
    if spec.a.batch_strides.len() != nb || spec.b.batch_strides.len() != nb {
        return bad(format!(
            "{nb} batch dims but operand strides {:?} and {:?}",
            spec.a.batch_strides, spec.b.batch_strides
        ));
    }
    let count: usize = spec.batch.iter().product();
    if out_len < count * spec.m * spec.n {
        return bad(format!("output has {out_len} elements, expected {:?} x {} x {}", spec.batch, spec.m, spec.n));
    }
    if count * spec.m * spec.n == 0 {
        return Ok(());
    }
    if let Some(bias) = spec.bias {
        let last = bias.offset + (spec.n - 1) * bias.stride;
        if last >= bias_len {
            return bad(format!("bias view reaches element {last} of {bias_len}"));
        }
    }
    if spec.k == 0 {
        return Ok(());
    }
    let (la, lb) = (last(&spec.a, &spec.batch, spec.m, spec.k), last(&spec.b, &spec.batch, spec.k, spec.n));
    if la >= a_len || lb >= b_len {
        return bad(format!("operand view reaches element {la} of {a_len} / {lb} of {b_len}"));
    }
    Ok(())
}

/// The last element a (non-empty) view reaches.
fn last(op: &StridedOperand<usize>, batch: &[usize], rows: usize, cols: usize) -> usize {
    op.offset
        + batch.iter().zip(&op.batch_strides).map(|(n, s)| (n - 1) * s).sum::<usize>()
        + (rows - 1) * op.row_stride
        + (cols - 1) * op.col_stride
}

/// How cuBLASLt sees one operand `X` (`rows x cols`, row-major logic): the column-major matrix
/// `X^T` (`cols x rows`), stored either as itself (`transpose = false`, leading dim = X's row
/// stride) or as `X` column-major (`transpose = true`, leading dim = X's column stride).
#[derive(Clone, Copy, Debug, PartialEq)]
struct LtView {
    /// Element offset of batch 0's first element.
    offset: usize,
    transpose: bool,
    /// The stored matrix's rows, columns and leading dimension (column-major).
    rows: u64,
    cols: u64,
    ld: i64,
    /// Elements between batches (0: broadcast).
    batch_stride: i64,
}

impl LtView {
    /// The view as cuBLASLt's layout sees it (its offset only moves the address).
    fn shape_text(&self) -> String {
        let t = if self.transpose { "T" } else { "N" };
        format!("{t}{}x{}/{}/{}", self.rows, self.cols, self.ld, self.batch_stride)
    }
}

/// `op` as a cuBLASLt view, or `None` when it needs a gather first.
fn lt_view(op: &StridedOperand<usize>, batch: &[usize], rows: usize, cols: usize) -> Option<LtView> {
    let (rs, cs) = (op.row_stride, op.col_stride);
    // Batch dims: drop size-1 dims, then they must collapse into one stride.
    let dims: Vec<(usize, usize)> =
        batch.iter().copied().zip(op.batch_strides.iter().copied()).filter(|&(n, _)| n != 1).collect();
    if dims.windows(2).any(|w| w[0].1 != w[1].1 * w[1].0) {
        return None;
    }
    let batch_stride = dims.last().map_or(0, |&(_, s)| s) as i64;
    let base = LtView { offset: op.offset, transpose: false, rows: 0, cols: 0, ld: 0, batch_stride };
    // X^T as itself: element (j, i) of X^T at j + i * rs, needs unit column stride.
    if cs == 1 || cols == 1 {
        let ld = if rows == 1 { cols } else { rs };
        if ld >= cols && ld > 0 {
            return Some(LtView { rows: cols as u64, cols: rows as u64, ld: ld as i64, ..base });
        }
    }
    // X column-major, transposed by cuBLASLt: element (i, j) at i + j * cs.
    if rs == 1 || rows == 1 {
        let ld = if cols == 1 { rows } else { cs };
        if ld >= rows && ld > 0 {
            return Some(LtView { transpose: true, rows: rows as u64, cols: cols as u64, ld: ld as i64, ..base });
        }
    }
    None
}

/// The view of a contiguous `[count, rows, cols]` temporary.
fn contiguous_view(rows: usize, cols: usize) -> LtView {
    LtView {
        offset: 0,
        transpose: false,
        rows: cols as u64,
        cols: rows as u64,
        ld: cols as i64,
        batch_stride: (rows * cols) as i64,
    }
}

/// Why a cuBLASLt product did not run.
enum LtError {
    /// The heuristic found no algorithm for these layouts: try another way.
    NoAlgorithm,
    Other(Error),
}

impl From<Error> for LtError {
    fn from(e: Error) -> LtError {
        LtError::Other(e)
    }
}

fn lt_err(call: &str, e: lt::CublasError) -> LtError {
    if e.0 == lt_sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED {
        LtError::NoAlgorithm
    } else {
        LtError::Other(Error::runtime(format!("{call} failed: {e}")))
    }
}

/// Destroys cuBLASLt descriptors when the product is done with them.
#[derive(Default)]
struct Descs {
    layouts: Vec<lt_sys::cublasLtMatrixLayout_t>,
    desc: Option<lt_sys::cublasLtMatmulDesc_t>,
    pref: Option<lt_sys::cublasLtMatmulPreference_t>,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each handle was created once and is destroyed once, here. Destroying a
        // descriptor after cublasLtMatmul was enqueued is allowed (it is read at the call).
        unsafe {
            for &l in &self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            if let Some(d) = self.desc {
                let _ = lt::destroy_matmul_desc(d);
            }
            if let Some(p) = self.pref {
                let _ = lt::destroy_matmul_pref(p);
            }
        }
    }
}

/// Largest power of two (at most 256) dividing an address: the alignment cuBLASLt may assume.
fn alignment(ptr: u64) -> u32 {
    if ptr == 0 {
        256
    } else {
        (1u64 << ptr.trailing_zeros().min(8)) as u32
    }
}

/// One cuBLASLt product (see the module doc). `gather_all` copies every operand to a
/// contiguous temporary first (the retry when the heuristic finds nothing for the views);
/// `activation` is the activation to apply in the epilogue (`None`: the bias alone, whatever
/// `spec.activation` says).
#[allow(clippy::too_many_arguments)]
fn lt_matmul(
    dev: &Arc<CudaDevice>,
    spec: &BmmSpec,
    (dtype, out_dtype): (DType, DType),
    a: DevOperand,
    b: DevOperand,
    bias: Option<DevOperand>,
    out: DevOperand,
    gather_all: bool,
    epilogue: Option<Epilogue>,
) -> std::result::Result<(), LtError> {
    let blas = Blas::get(dev)?;
    let size = dtype.size_bytes();
    let (m, n, k) = (spec.m, spec.n, spec.k);
    let count: usize = spec.batch.iter().product();
    let mut temps: Vec<DeviceMemory> = Vec::new();
    // Each operand as (address of batch 0, view), gathered when needed.
    let mut prepare =
        |op: &StridedOperand<usize>, buf: DevOperand, rows: usize, cols: usize| -> Result<(u64, LtView)> {
            if !gather_all {
                if let Some(v) = lt_view(op, &spec.batch, rows, cols) {
                    return Ok((buf.ptr + (v.offset * size) as u64, v));
                }
            }
            let tmp = DeviceMemory::alloc(dev, count * rows * cols * size)?;
            let sizes: Vec<usize> = spec.batch.iter().copied().chain([rows, cols]).collect();
            let strides: Vec<usize> = op.batch_strides.iter().copied().chain([op.row_stride, op.col_stride]).collect();
            // SAFETY: `check` bounded the view inside `buf`; `tmp` is fresh and large enough.
            unsafe { gather(dev, buf.ptr + (op.offset * size) as u64, tmp.ptr(), size, &sizes, &strides)? };
            let ptr = tmp.ptr();
            temps.push(tmp);
            Ok((ptr, contiguous_view(rows, cols)))
        };
    let (pa, va) = prepare(&spec.a, a, m, k)?;
    let (pb, vb) = prepare(&spec.b, b, k, n)?;
    // The epilogue wants a contiguous, aligned bias of n elements.
    let bias_ptr = match (spec.bias, bias) {
        (Some(view), Some(buf)) => {
            let p = buf.ptr + (view.offset * size) as u64;
            if (view.stride == 1 || n == 1) && p.is_multiple_of(16) {
                Some(p)
            } else {
                let tmp = DeviceMemory::alloc(dev, n * size)?;
                // SAFETY: `check` bounded the bias view; `tmp` holds n elements.
                unsafe { gather(dev, p, tmp.ptr(), size, &[n], &[view.stride])? };
                let ptr = tmp.ptr();
                temps.push(tmp);
                Some(ptr)
            }
        }
        _ => None,
    };

    let types = |dtype: DType| match dtype {
        DType::F32 => Some((lt_sys::cudaDataType::CUDA_R_32F, lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, 32)),
        DType::F16 => Some((lt_sys::cudaDataType::CUDA_R_16F, lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, 32)),
        DType::BF16 => Some((lt_sys::cudaDataType::CUDA_R_16BF, lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, 32)),
        DType::F64 => Some((lt_sys::cudaDataType::CUDA_R_64F, lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_64F, 64)),
        _ => None,
    };
    let (Some((data, compute, scale)), Some((out_data, ..))) = (types(dtype), types(out_dtype)) else {
        return Err(LtError::NoAlgorithm);
    };
    let scale_type = if scale == 64 { lt_sys::cudaDataType::CUDA_R_64F } else { lt_sys::cudaDataType::CUDA_R_32F };
    dev.bind()?;
    let mut descs = Descs::default();
    // cuBLASLt's A is our b (out^T = b^T a^T), its B our a; D (and C) the output, n x m.
    let dv = LtView {
        offset: 0,
        transpose: false,
        rows: n as u64,
        cols: m as u64,
        ld: n as i64,
        batch_stride: (m * n) as i64,
    };
    let mut layout = |v: &LtView, data| -> std::result::Result<lt_sys::cublasLtMatrixLayout_t, LtError> {
        let l = lt::create_matrix_layout(data, v.rows, v.cols, v.ld)
            .map_err(|e| lt_err("cublasLtMatrixLayoutCreate", e))?;
        descs.layouts.push(l);
        if count > 1 {
            let (c, s) = (count as i32, v.batch_stride);
            // SAFETY: attribute values of the documented types (int32, int64), live for the call.
            unsafe {
                lt::set_matrix_layout_attribute(
                    l,
                    lt_sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    (&c as *const i32).cast(),
                    4,
                )
                .map_err(|e| lt_err("cublasLtMatrixLayoutSetAttribute", e))?;
                lt::set_matrix_layout_attribute(
                    l,
                    lt_sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    (&s as *const i64).cast(),
                    8,
                )
                .map_err(|e| lt_err("cublasLtMatrixLayoutSetAttribute", e))?;
            }
        }
        Ok(l)
    };
    let (la, lb, ld) = (layout(&vb, data)?, layout(&va, data)?, layout(&dv, out_data)?);
    let desc = lt::create_matmul_desc(compute, scale_type).map_err(|e| lt_err("cublasLtMatmulDescCreate", e))?;
    descs.desc = Some(desc);
    use lt_sys::cublasLtMatmulDescAttributes_t as D;
    let set = |attr: D, value: *const c_void, bytes: usize| -> std::result::Result<(), LtError> {
        // SAFETY: `value` points to a live value of the attribute's documented type.
        unsafe { lt::set_matmul_desc_attribute(desc, attr, value, bytes) }
            .map_err(|e| lt_err("cublasLtMatmulDescSetAttribute", e))
    };
    // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 (int32).
    let (ta, tb) = (vb.transpose as i32, va.transpose as i32);
    set(D::CUBLASLT_MATMUL_DESC_TRANSA, (&ta as *const i32).cast(), 4)?;
    set(D::CUBLASLT_MATMUL_DESC_TRANSB, (&tb as *const i32).cast(), 4)?;
    use lt_sys::cublasLtEpilogue_t as E;
    let (epilogue, aux) = match (bias_ptr.is_some(), epilogue) {
        (false, None) => (None, None),
        (true, None) => (Some(E::CUBLASLT_EPILOGUE_BIAS), None),
        (true, Some(Epilogue::Activation(Activation::GeluTanh))) => (Some(E::CUBLASLT_EPILOGUE_GELU_BIAS), None),
        (false, Some(Epilogue::Activation(Activation::GeluTanh))) => (Some(E::CUBLASLT_EPILOGUE_GELU), None),
        (true, Some(Epilogue::Saving(Activation::GeluTanh, aux))) => {
            (Some(E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS), Some(aux))
        }
        (false, Some(Epilogue::Saving(Activation::GeluTanh, aux))) => (Some(E::CUBLASLT_EPILOGUE_GELU_AUX), Some(aux)),
        (false, Some(Epilogue::Grad(Activation::GeluTanh, aux))) => (Some(E::CUBLASLT_EPILOGUE_DGELU), Some(aux)),
        (true, Some(Epilogue::Grad(..))) => return Err(LtError::NoAlgorithm),
    };
    // cuBLASLt's gelu derivative differs from the graph's by up to 1e-4 relative (measured in
    // f32): within the rounding of half types, not of f32. f32 and f64 take the kernel, whose
    // derivative is the host's.
    if matches!(epilogue, Some(E::CUBLASLT_EPILOGUE_DGELU)) && !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(LtError::NoAlgorithm);
    }
    if let Some(aux) = aux {
        // The saved input is read as a column-major n x m matrix like D: cuBLASLt wants its
        // leading dimension a multiple of 8 and the address 16-byte aligned.
        if n % 8 != 0 || aux % 16 != 0 {
            return Err(LtError::NoAlgorithm);
        }
        let (ptr, ld, stride) = (aux as *const c_void, n as i64, (m * n) as i64);
        set(D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, (&ptr as *const *const c_void).cast(), 8)?;
        set(D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, (&ld as *const i64).cast(), 8)?;
        if count > 1 {
            set(D::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, (&stride as *const i64).cast(), 8)?;
        }
    }
    if let Some(epilogue) = epilogue {
        // cublasLtEpilogue_t is a uint32 attribute.
        let epilogue = epilogue as u32;
        set(D::CUBLASLT_MATMUL_DESC_EPILOGUE, (&epilogue as *const u32).cast(), 4)?;
    }
    if let Some(p) = bias_ptr {
        let ptr = p as *const c_void;
        set(
            D::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
            (&ptr as *const *const c_void).cast(),
            std::mem::size_of::<*const c_void>(),
        )?;
    }
    let pref = lt::create_matmul_pref().map_err(|e| lt_err("cublasLtMatmulPreferenceCreate", e))?;
    descs.pref = Some(pref);
    use lt_sys::cublasLtMatmulPreferenceAttributes_t as P;
    let ws = WORKSPACE_BYTES as u64;
    // SAFETY: attribute values of the documented types (uint64, uint32), live for the call.
    unsafe {
        lt::set_matmul_pref_attribute(pref, P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, (&ws as *const u64).cast(), 8)
            .map_err(|e| lt_err("cublasLtMatmulPreferenceSetAttribute", e))?;
        // The heuristic assumes 256-byte-aligned operands unless told: a view with an offset
        // is not, and an algorithm relying on it would fault.
        for (attr, ptr) in [
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, pb),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, pa),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, out.ptr),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, out.ptr),
        ] {
            let al = alignment(ptr);
            lt::set_matmul_pref_attribute(pref, attr, (&al as *const u32).cast(), 4)
                .map_err(|e| lt_err("cublasLtMatmulPreferenceSetAttribute", e))?;
        }
    }
    let (alpha32, beta32, alpha64, beta64) = (1f32, 0f32, 1f64, 0f64);
    let (alpha, beta): (*const c_void, *const c_void) = if scale == 64 {
        ((&alpha64 as *const f64).cast(), (&beta64 as *const f64).cast())
    } else {
        ((&alpha32 as *const f32).cast(), (&beta32 as *const f32).cast())
    };
    let launch = |algo: &Algo| -> std::result::Result<(), LtError> {
        // SAFETY: operands, bias and output were bounds-checked for these layouts (or gathered
        // into temporaries of exactly that size); the workspace is ours and stream-ordered;
        // alpha/beta are host scalars read during the call. Temporaries are freed into the
        // cache after the call, which is safe in stream order.
        unsafe {
            lt::matmul(
                blas.handle,
                desc,
                alpha,
                beta,
                pb as *const c_void,
                la,
                pa as *const c_void,
                lb,
                out.ptr as *const c_void,
                ld,
                out.ptr as *mut c_void,
                ld,
                algo,
                blas.workspace as *mut c_void,
                WORKSPACE_BYTES,
                dev.cu_stream() as lt_sys::cudaStream_t,
            )
        }
        .map_err(|e| lt_err("cublasLtMatmul", e))
    };
    // Everything the heuristic sees names the problem (addresses only by their alignment).
    let text = problem_text(&[
        ("types", format!("{dtype}>{out_dtype}")),
        ("mnk", format!("{m}x{n}x{k}x{count}")),
        ("a", vb.shape_text()),
        ("b", va.shape_text()),
        ("epilogue", format!("{:?}", epilogue.map(|e| e as u32))),
        ("aux_ld", format!("{}", aux.map_or(0, |_| n))),
        ("align", format!("{} {} {}", alignment(pb), alignment(pa), alignment(out.ptr))),
    ]);
    // Timing launches rewrite the output: only where it overlaps no operand.
    let overlaps = |p: u64, bytes: usize| p < out.ptr + out.bytes as u64 && out.ptr < p + bytes as u64;
    let may_time = !overlaps(a.ptr, a.bytes)
        && !overlaps(b.ptr, b.bytes)
        && !bias.is_some_and(|x| overlaps(x.ptr, x.bytes))
        && !aux.is_some_and(|x| overlaps(x, out.bytes));
    let problem = Problem { text, dev, may_time };
    let candidates = |count: usize| {
        // SAFETY: every descriptor is live (owned by `descs`).
        unsafe { heuristics(blas.handle, desc, la, lb, ld, pref, count) }
            .map_err(|e| format!("cublasLtMatmulAlgoGetHeuristic failed: {e}"))
    };
    let algo = blas
        .choices
        .algo(&problem, candidates, |algo| {
            launch(algo).map_err(|e| match e {
                LtError::Other(e) => e,
                LtError::NoAlgorithm => Error::runtime("cublasLtMatmul: not supported"),
            })
        })
        .map_err(|e| LtError::Other(Error::runtime(e)))?
        .ok_or(LtError::NoAlgorithm)?;
    launch(&algo)?;
    drop(temps);
    Ok(())
}

/// Up to `count` of the heuristic's algorithms for the problem, in its order (none: it has
/// no algorithm for these layouts).
unsafe fn heuristics(
    handle: lt_sys::cublasLtHandle_t,
    desc: lt_sys::cublasLtMatmulDesc_t,
    la: lt_sys::cublasLtMatrixLayout_t,
    lb: lt_sys::cublasLtMatrixLayout_t,
    ld: lt_sys::cublasLtMatrixLayout_t,
    pref: lt_sys::cublasLtMatmulPreference_t,
    count: usize,
) -> std::result::Result<Vec<Algo>, lt::CublasError> {
    let mut results: Vec<lt_sys::cublasLtMatmulHeuristicResult_t> = Vec::with_capacity(count);
    let mut found = 0;
    let status = lt_sys::cublasLtMatmulAlgoGetHeuristic(
        handle,
        desc,
        la,
        lb,
        ld,
        ld,
        pref,
        count as i32,
        results.as_mut_ptr(),
        &mut found,
    );
    match status.result() {
        Ok(()) => {}
        Err(e) if e.0 == lt_sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED => return Ok(vec![]),
        Err(e) => return Err(e),
    }
    // SAFETY: cuBLASLt wrote `found` (at most `count`) results.
    results.set_len((found.max(0) as usize).min(count));
    Ok(results.iter().filter(|r| r.state == lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS).map(|r| r.algo).collect())
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use coil_ir::loops::BufferId;

    fn op(offset: usize, batch_strides: Vec<usize>, row_stride: usize, col_stride: usize) -> StridedOperand<usize> {
        StridedOperand { buffer: BufferId(0), offset, batch_strides, row_stride, col_stride }
    }

    #[test]
    fn views_map_to_cublaslt_layouts() {
        // Row-major [2, 3, 4]: X^T as itself, ld 4, batch stride 12.
        let v = lt_view(&op(0, vec![12], 4, 1), &[2], 3, 4).unwrap();
        assert_eq!((v.transpose, v.rows, v.cols, v.ld, v.batch_stride), (false, 4, 3, 4, 12));
        // A transposed view (column-major X): cuBLASLt transposes, ld = column stride.
        let v = lt_view(&op(0, vec![12], 1, 3), &[2], 3, 4).unwrap();
        assert_eq!((v.transpose, v.rows, v.cols, v.ld), (true, 3, 4, 3));
        // Broadcast batch: stride 0; batch dims that collapse; size-1 dims ignored.
        assert_eq!(lt_view(&op(0, vec![0, 0], 4, 1), &[2, 5], 3, 4).unwrap().batch_stride, 0);
        assert_eq!(lt_view(&op(0, vec![60, 12, 7], 4, 1), &[2, 5, 1], 3, 4).unwrap().batch_stride, 12);
        // Not expressible: both strides != 1, overlapping rows, a batch that does not collapse.
        assert_eq!(lt_view(&op(0, vec![], 8, 2), &[], 3, 4), None);
        assert_eq!(lt_view(&op(0, vec![], 0, 1), &[], 3, 4), None);
        assert_eq!(lt_view(&op(0, vec![0, 12], 4, 1), &[2, 5], 3, 4), None);
        // A single column may have any column stride.
        let v = lt_view(&op(0, vec![], 1, 99), &[], 3, 1).unwrap();
        assert_eq!((v.rows, v.cols, v.ld), (1, 3, 1));
        assert_eq!(alignment(0x1000), 256);
        assert_eq!(alignment(0x1004), 4);
    }

    /// Attention heads viewed out of a fused QKV product `[B=2, T=4, 3C]` (C = 3 heads of 2):
    /// q `[2, 3, 4, 2]` and k^T `[2, 3, 2, 4]` have batch strides (72, 2) that do not collapse,
    /// so the product runs as one call per batch index, each over the 3 heads.
    #[test]
    fn head_views_split_the_outer_batch_instead_of_gathering() {
        let (q, kt) = (op(0, vec![72, 2], 18, 1), op(6, vec![72, 2], 1, 18));
        let spec = BmmSpec {
            a: q,
            b: kt,
            batch: vec![2, 3],
            m: 4,
            n: 4,
            k: 2,
            bias: None,
            activation: None,
            activation_grad: None,
        };
        let parts = outer_split(&spec);
        assert_eq!(parts.len(), 2);
        let (second, first) = &parts[1];
        assert_eq!(*first, 3 * 4 * 4);
        assert_eq!((second.batch.as_slice(), second.a.offset, second.b.offset), (&[3][..], 72, 78));
        assert_eq!(lt_view(&second.a, &second.batch, 4, 2).map(|v| v.batch_stride), Some(2));
        // Operands whose batch collapses stay one call.
        let flat = BmmSpec { a: op(0, vec![24, 8], 2, 1), b: op(0, vec![24, 8], 4, 1), ..spec.clone() };
        assert_eq!(outer_split(&flat).len(), 1);
    }
}
