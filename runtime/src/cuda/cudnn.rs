//! Convolutions ([`ConvCall`]: the forward, data-gradient and weight-gradient forms) through
//! cuDNN, loaded at run time like cuBLASLt, by one of two APIs ([`CudnnApi`], the
//! configuration's `cudnn_api`):
//!
//! * The backend ("graph") API, the default (`super::cudnn_graph`): an operation graph of the
//!   one convolution per call shape, the engine configs of heuristics mode A in order, the first
//!   allowed for the dtype whose execution plan finalizes within [`WORKSPACE_LIMIT`] (no
//!   timing). These are the engines PyTorch runs (e.g. implicit-GEMM tensor-core kernels on
//!   channels-last operands, channel padding for the 3-channel stem).
//! * The legacy API (`cudnnConvolutionForward`, `cudnnConvolutionBackwardData`,
//!   `cudnnConvolutionBackwardFilter`): cuDNN's heuristic choice
//!   (`cudnnGetConvolution*Algorithm_v7`, the first that succeeds within [`WORKSPACE_LIMIT`]).
//!   It is also the graph API's fallback: where no engine config fits or a backend call fails,
//!   the call shape takes the legacy plan, and the `schedule` log says why, once.
//!
//! Either way the plan is made once per shape, layout, dtype (and for the graph API the
//! operands' address alignment) and cached; the workspace comes from coil's caching allocator
//! per call.
//!
//! * Descriptors take each operand's strides, so a channels-last (`NHWC`) activation is read
//!   in place; a filter (the weight operand, or the weight gradient) is row-major (`NCHW`
//!   filter format) or channels-last (`NHWC`); the lowering copies anything else first.
//!   1-d convolutions run as 2-d ones over a height of 1.
//! * f16 / bf16 accumulate in f32 (legacy: `CUDNN_TENSOR_OP_MATH`; graph: compute type float,
//!   no reduced-precision reductions); f32 runs without TF32 (legacy: `CUDNN_FMA_MATH`; graph:
//!   no tensor-core engines), as coil's matrix products; f64 in f64.
//! * Every run gives the same bits: engines noted nondeterministic and legacy algorithms that
//!   are not `CUDNN_DETERMINISTIC` (weight gradients summed by atomics) are passed over.
//! * Where cuDNN cannot be loaded, or neither API has a plan for a call, the call runs on the
//!   host (operands downloaded, [`crate::interp::conv`], result uploaded): slow but correct.
//!   The compile path keeps convolutions whole only where [`available`] says cuDNN loads, so
//!   this is a safety net, not a path a model takes.

use super::cudnn_graph::{self, GraphPlan};
use super::device::CudaDevice;
use super::loader::{require, CudaLib};
use super::memory::{download, upload, DeviceMemory};
use crate::cuda::blas::DevOperand;
use coil_ir::config::CudnnApi;
use coil_ir::loops::{ConvCall, TensorView};
use coil_ir::op::{ConvForm, ConvGeometry};
use coil_ir::{DType, Error, Result};
use cudarc::cudnn::{result as dnn, sys};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

/// The most workspace an algorithm may ask for.
pub const WORKSPACE_LIMIT: usize = 1 << 30;

/// Whether cuDNN loads on this machine (searched once per process; see [`super::loader`]).
pub fn available() -> bool {
    require(CudaLib::Cudnn).is_ok()
}

/// A device's cuDNN handle and the plans made so far (both live as long as the process).
pub struct Cudnn {
    handle: sys::cudnnHandle_t,
    plans: Mutex<HashMap<String, Arc<Planned>>>,
}

// SAFETY: the handle is only used on the device's stream, under the plans' lock or in stream
// order; descriptors are immutable once made.
unsafe impl Send for Cudnn {}
// SAFETY: as above.
unsafe impl Sync for Cudnn {}

impl Cudnn {
    /// The device's cuDNN, loaded and its handle made on first use.
    pub(super) fn get(dev: &CudaDevice) -> Result<&Cudnn> {
        dev.cudnn
            .get_or_init(|| {
                require(CudaLib::Cudnn).map_err(|e| e.message)?;
                dev.bind().map_err(|e| e.message)?;
                let handle = dnn::create_handle().map_err(|e| format!("cudnnCreate failed: {e}"))?;
                Ok(Cudnn { handle, plans: Mutex::new(HashMap::new()) })
            })
            .as_ref()
            .map_err(|e| Error::runtime(e.clone()))
    }

    /// `f` on the handle, under the plans' lock (a handle serves one thread at a time).
    pub(super) fn with_handle<R>(&self, f: impl FnOnce(sys::cudnnHandle_t) -> R) -> R {
        let _plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        f(self.handle)
    }
}

/// The plan of one call shape: through the graph API, or the legacy one.
enum Chosen<G, L> {
    Graph(G),
    Legacy(L),
}

/// The plan of one convolution call shape.
type Plan = Chosen<GraphPlan, LegacyPlan>;

impl Plan {
    /// What runs, in words (for the logs and the benchmark).
    fn describe(&self) -> String {
        match self {
            Chosen::Graph(p) => format!(
                "graph API, engine {} (notes {:?}), workspace {} B",
                p.engine,
                cudnn_graph::note_names(&p.notes),
                p.workspace
            ),
            Chosen::Legacy(p) => format!("legacy API, {}, workspace {} B", p.algo.name(), p.workspace),
        }
    }
}

/// A cached plan and, where it is the graph API's fallback, why the graph API had none.
struct Planned {
    plan: Plan,
    graph_failure: Option<String>,
}

impl Planned {
    /// What runs, in words, with the reason of a fallback.
    fn describe(&self) -> String {
        match &self.graph_failure {
            Some(why) => format!("{} (graph API: {why})", self.plan.describe()),
            None => self.plan.describe(),
        }
    }
}

/// The descriptors and algorithm of one convolution call shape (legacy API).
struct LegacyPlan {
    a: Desc,
    b: Desc,
    out: Desc,
    conv: sys::cudnnConvolutionDescriptor_t,
    algo: Algo,
    workspace: usize,
    /// Whether alpha and beta are doubles (f64 operands), else floats.
    f64: bool,
}

// SAFETY: a plan's descriptors are set once, when it is made, and only read afterwards.
unsafe impl Send for LegacyPlan {}
// SAFETY: as above.
unsafe impl Sync for LegacyPlan {}

impl Algo {
    fn name(&self) -> String {
        match self {
            Algo::Forward(a) => format!("{a:?}"),
            Algo::Data(a) => format!("{a:?}"),
            Algo::Filter(a) => format!("{a:?}"),
        }
    }
}

/// The algorithm chosen for a plan, of its form's kind.
#[derive(Clone, Copy)]
enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    Data(sys::cudnnConvolutionBwdDataAlgo_t),
    Filter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

/// A tensor or a filter descriptor.
enum Desc {
    Tensor(sys::cudnnTensorDescriptor_t),
    Filter(sys::cudnnFilterDescriptor_t),
}

impl Desc {
    fn tensor(&self) -> sys::cudnnTensorDescriptor_t {
        match self {
            Desc::Tensor(t) => *t,
            Desc::Filter(_) => unreachable!("a filter where a tensor belongs"),
        }
    }

    fn filter(&self) -> sys::cudnnFilterDescriptor_t {
        match self {
            Desc::Filter(f) => *f,
            Desc::Tensor(_) => unreachable!("a tensor where a filter belongs"),
        }
    }
}

/// Enqueues `call` (operands and result of `dtype`) on the device's stream through cuDNN's
/// `api` (the graph API falling back to the legacy one per call shape), or on the host where
/// cuDNN is missing or has no plan. `scratch`: device memory free during the call
/// (`(address, bytes)`: the run's arena less the slots in use at this launch), used as the
/// plan's workspace when it fits, so the workspace adds nothing to the run's memory; else the
/// workspace is allocated for the call.
#[allow(clippy::too_many_arguments)]
pub fn convolution(
    dev: &Arc<CudaDevice>,
    call: &ConvCall,
    dtype: DType,
    api: CudnnApi,
    a: DevOperand,
    b: DevOperand,
    out: DevOperand,
    scratch: (u64, usize),
) -> Result<()> {
    let dnn = match Cudnn::get(dev) {
        Ok(dnn) => dnn,
        Err(e) => {
            log_host_fallback(call, dtype, &e.to_string());
            return on_host(dev, call, dtype, a, b, out);
        }
    };
    let size = dtype.size_bytes() as u64;
    let ptrs = [a.ptr + call.a.offset as u64 * size, b.ptr + call.b.offset as u64 * size, out.ptr];
    let plan = match plan(dnn, call, dtype, api, ptrs) {
        Ok(plan) => plan,
        Err(e) => {
            log_host_fallback(call, dtype, &e.to_string());
            return on_host(dev, call, dtype, a, b, out);
        }
    };
    let workspace_bytes = match &plan.plan {
        Chosen::Graph(p) => p.workspace,
        Chosen::Legacy(p) => p.workspace,
    };
    let in_scratch = scratch.0 != 0 && workspace_bytes <= scratch.1;
    let workspace = if in_scratch { None } else { Some(DeviceMemory::alloc(dev, workspace_bytes.max(1))?) };
    dev.bind()?;
    let ws = workspace.as_ref().map_or(scratch.0, |w| w.ptr()) as *mut c_void;
    // SAFETY: the plans describe the operands' views inside their buffers (checked by
    // `check_extern` and the lowering) at these addresses, the workspace holds the plan's
    // bytes (its own allocation, or the caller's scratch range, which no buffer in use at
    // this launch occupies), and everything is ordered on the device's stream.
    let status = unsafe {
        dnn::set_stream(dnn.handle, dev.cu_stream() as sys::cudaStream_t)
            .map_err(|e| Error::runtime(format!("cudnnSetStream failed: {e}")))?;
        match &plan.plan {
            Chosen::Graph(p) => cudnn_graph::execute(dnn.handle, p, ptrs.map(|p| p as *mut c_void), ws),
            Chosen::Legacy(p) => run_legacy(dnn.handle, p, ptrs, ws).map_err(|e| Error::runtime(e.to_string())),
        }
    };
    // The workspace goes back to the cache now: later users are ordered after this call.
    drop(workspace);
    status.map_err(|e| Error::runtime(format!("cuDNN {} failed: {} ({})", call.form.name(), e.message, describe(call))))
}

/// What runs `call` through `api` (making its plan if it is new), in words: the graph API's
/// engine, or the legacy API's algorithm (as the graph API's fallback too), and the
/// workspace. For benchmarks and the logs.
pub fn plan_summary(
    dev: &Arc<CudaDevice>,
    call: &ConvCall,
    dtype: DType,
    api: CudnnApi,
    a: DevOperand,
    b: DevOperand,
    out: DevOperand,
) -> Result<String> {
    let size = dtype.size_bytes() as u64;
    let ptrs = [a.ptr + call.a.offset as u64 * size, b.ptr + call.b.offset as u64 * size, out.ptr];
    Ok(plan(Cudnn::get(dev)?, call, dtype, api, ptrs)?.describe())
}

/// Enqueues a legacy plan over the operands at `ptrs` (first, second, result).
///
/// # Safety
/// As [`convolution`]'s call: live handle on the device's stream, the views at the addresses.
unsafe fn run_legacy(
    handle: sys::cudnnHandle_t,
    plan: &LegacyPlan,
    ptrs: [u64; 3],
    ws: *mut c_void,
) -> std::result::Result<(), dnn::CudnnError> {
    let (one_f, zero_f, one_d, zero_d) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
    let (alpha, beta): (*const c_void, *const c_void) = if plan.f64 {
        (&one_d as *const f64 as _, &zero_d as *const f64 as _)
    } else {
        (&one_f as *const f32 as _, &zero_f as *const f32 as _)
    };
    let ws_bytes = plan.workspace;
    let (pa, pb, po) = (ptrs[0] as *const c_void, ptrs[1] as *const c_void, ptrs[2] as *mut c_void);
    // alpha and beta live through the call (cuDNN reads host scalars before returning).
    match plan.algo {
        Algo::Forward(algo) => dnn::convolution_forward(
            handle,
            alpha,
            plan.a.tensor(),
            pa,
            plan.b.filter(),
            pb,
            plan.conv,
            algo,
            ws,
            ws_bytes,
            beta,
            plan.out.tensor(),
            po,
        ),
        Algo::Data(algo) => dnn::convolution_backward_data(
            handle,
            alpha,
            plan.b.filter(),
            pb,
            plan.a.tensor(),
            pa,
            plan.conv,
            algo,
            ws,
            ws_bytes,
            beta,
            plan.out.tensor(),
            po,
        ),
        Algo::Filter(algo) => dnn::convolution_backward_filter(
            handle,
            alpha,
            plan.a.tensor(),
            pa,
            plan.b.tensor(),
            pb,
            plan.conv,
            algo,
            ws,
            ws_bytes,
            beta,
            plan.out.filter(),
            po,
        ),
    }
}

/// The call as an error names it: form, geometry, operand shapes and strides.
fn describe(call: &ConvCall) -> String {
    format!(
        "{}; a {:?} strides {:?}, b {:?} strides {:?}, out {:?} strides {:?}",
        call.geometry.describe(),
        call.a.shape,
        call.a.strides,
        call.b.shape,
        call.b.strides,
        call.out,
        call.out_strides
    )
}

/// The cached plan of `call` through `api`, made on first use; the operands are at `ptrs`
/// (first, second, result), whose alignment the graph API's plan relies on.
fn plan(dnn: &Cudnn, call: &ConvCall, dtype: DType, api: CudnnApi, ptrs: [u64; 3]) -> Result<Arc<Planned>> {
    let aligns = ptrs.map(cudnn_graph::alignment);
    let mut key = format!("{api:?} {dtype} {:?} {:?} {}", call.form, call.geometry, describe(call));
    if api == CudnnApi::Graph {
        key += &format!(" aligned {aligns:?}");
    }
    let mut plans = dnn.plans.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = plans.get(&key) {
        return Ok(p.clone());
    }
    let (plan, graph_failure) = choose(
        api,
        // SAFETY: the handle is used under the plans' lock; descriptors live with the plan.
        || unsafe { cudnn_graph::make_graph_plan(dnn.handle, call, dtype, aligns) },
        || unsafe { make_plan(dnn.handle, call, dtype) },
    )?;
    if let Some(why) = &graph_failure {
        super::schedule_log(&format!("convolution through cuDNN's legacy API (graph API: {why}): {key}"));
    }
    super::schedule_log(&format!("convolution plan: {} for {key}", plan.describe()));
    let plan = Arc::new(Planned { plan, graph_failure });
    plans.insert(key, plan.clone());
    Ok(plan)
}

/// The plan `api` asks for: the graph API's where it builds, else the legacy API's, with why
/// the graph API's did not; an error where the legacy API has none either.
fn choose<G, L>(
    api: CudnnApi,
    graph: impl FnOnce() -> Result<G>,
    legacy: impl FnOnce() -> Result<L>,
) -> Result<(Chosen<G, L>, Option<String>)> {
    let graph_failure = match api {
        CudnnApi::Graph => match graph() {
            Ok(g) => return Ok((Chosen::Graph(g), None)),
            Err(e) => Some(e.message),
        },
        CudnnApi::Legacy => None,
    };
    match legacy() {
        Ok(l) => Ok((Chosen::Legacy(l), graph_failure)),
        Err(e) => Err(match graph_failure {
            Some(why) => Error::runtime(format!("{} (graph API: {why})", e.message)),
            None => e,
        }),
    }
}

fn dnn_err(what: &str) -> impl Fn(dnn::CudnnError) -> Error + '_ {
    move |e| Error::runtime(format!("cuDNN {what} failed: {e}"))
}

/// cuDNN's element type of `dtype` (floating types only).
pub(super) fn data_type(dtype: DType) -> Result<sys::cudnnDataType_t> {
    Ok(match dtype {
        DType::F32 => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
        DType::F64 => sys::cudnnDataType_t::CUDNN_DATA_DOUBLE,
        DType::F16 => sys::cudnnDataType_t::CUDNN_DATA_HALF,
        DType::BF16 => sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        other => return Err(Error::dtype(format!("cuDNN convolutions take floating operands, not {other}"))),
    })
}

/// The accumulation type of `dtype`'s convolutions: f64 for f64, else f32.
pub(super) fn compute_type(dtype: DType) -> sys::cudnnDataType_t {
    if dtype == DType::F64 {
        sys::cudnnDataType_t::CUDNN_DATA_DOUBLE
    } else {
        sys::cudnnDataType_t::CUDNN_DATA_FLOAT
    }
}

/// Shape and strides with a unit height inserted for a 1-d convolution (cuDNN wants 4 or 5
/// dims); the unit dim's stride is that of the dim after it times its size, as packing has it.
pub(super) fn four_d(shape: &[usize], strides: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let (mut shape, mut strides) = (shape.to_vec(), strides.to_vec());
    if shape.len() == 3 {
        shape.insert(2, 1);
        strides.insert(2, strides[2] * shape[3]);
    }
    (shape, strides)
}

/// `[paddings, strides, dilations]` per spatial dim, a unit dim (padding 0, stride and
/// dilation 1) first for a 1-d convolution, as [`four_d`] inserts a unit height.
pub(super) fn spatial_params(g: &ConvGeometry) -> [Vec<usize>; 3] {
    let pick = |v: &[usize], unit: usize| -> Vec<usize> {
        let mut v = v.to_vec();
        if g.dims() == 1 {
            v.insert(0, unit);
        }
        v
    };
    [pick(&g.padding, 0), pick(&g.stride, 1), pick(&g.dilation, 1)]
}

fn c_ints(v: &[usize]) -> Vec<c_int> {
    v.iter().map(|&x| x as c_int).collect()
}

/// Row-major strides of `shape`.
fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// Channels-last strides of `[O, C, *spatial]`: C fastest, then the spatial dims, then O.
fn channels_last(shape: &[usize]) -> Vec<usize> {
    let r = shape.len();
    let mut strides = vec![0; r];
    strides[1] = 1;
    let mut s = shape[1];
    for d in (2..r).rev() {
        strides[d] = s;
        s *= shape[d];
    }
    strides[0] = s;
    strides
}

/// Whether `view`'s strides match `want` on every dim of size above 1.
fn same_layout(shape: &[usize], strides: &[usize], want: &[usize]) -> bool {
    shape.iter().zip(strides).zip(want).all(|((&n, &s), &w)| n <= 1 || s == w)
}

unsafe fn tensor_desc(dt: sys::cudnnDataType_t, shape: &[usize], strides: &[usize]) -> Result<Desc> {
    let desc = dnn::create_tensor_descriptor().map_err(dnn_err("cudnnCreateTensorDescriptor"))?;
    let (dims, strides) = four_d(shape, strides);
    let (dims, strides) = (c_ints(&dims), c_ints(&strides));
    dnn::set_tensornd_descriptor(desc, dt, dims.len() as c_int, dims.as_ptr(), strides.as_ptr())
        .map_err(dnn_err("cudnnSetTensorNdDescriptor"))?;
    Ok(Desc::Tensor(desc))
}

unsafe fn filter_desc(dt: sys::cudnnDataType_t, shape: &[usize], strides: &[usize]) -> Result<Desc> {
    let format = if same_layout(shape, strides, &row_major(shape)) {
        sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW
    } else if same_layout(shape, strides, &channels_last(shape)) {
        sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC
    } else {
        return Err(Error::runtime(format!("a filter of shape {shape:?} with strides {strides:?}")));
    };
    let desc = dnn::create_filter_descriptor().map_err(dnn_err("cudnnCreateFilterDescriptor"))?;
    let dims = c_ints(&four_d(shape, strides).0);
    dnn::set_filternd_descriptor(desc, dt, format, dims.len() as c_int, dims.as_ptr())
        .map_err(dnn_err("cudnnSetFilterNdDescriptor"))?;
    Ok(Desc::Filter(desc))
}

unsafe fn view_desc(dt: sys::cudnnDataType_t, v: &TensorView, filter: bool) -> Result<Desc> {
    if filter {
        filter_desc(dt, &v.shape, &v.strides)
    } else {
        tensor_desc(dt, &v.shape, &v.strides)
    }
}

/// The descriptors of `call` and cuDNN's first working algorithm for them.
unsafe fn make_plan(handle: sys::cudnnHandle_t, call: &ConvCall, dtype: DType) -> Result<LegacyPlan> {
    let dt = data_type(dtype)?;
    let g = &call.geometry;
    // Which operand is the filter: the weight (forward, data gradient) or the result.
    let (a_filter, b_filter, out_filter) = match call.form {
        ConvForm::Forward | ConvForm::BackwardData { .. } => (false, true, false),
        ConvForm::BackwardWeight { .. } => (false, false, true),
    };
    let a = view_desc(dt, &call.a, a_filter)?;
    let b = view_desc(dt, &call.b, b_filter)?;
    let out = view_desc(
        dt,
        &TensorView { buffer: call.a.buffer, offset: 0, shape: call.out.clone(), strides: call.out_strides.clone() },
        out_filter,
    )?;

    let [pads, strides, dilations] = spatial_params(g).map(|v| c_ints(&v));
    let conv = dnn::create_convolution_descriptor().map_err(dnn_err("cudnnCreateConvolutionDescriptor"))?;
    let compute = compute_type(dtype);
    dnn::set_convolutionnd_descriptor(
        conv,
        pads.len() as c_int,
        pads.as_ptr(),
        strides.as_ptr(),
        dilations.as_ptr(),
        sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
        compute,
    )
    .map_err(dnn_err("cudnnSetConvolutionNdDescriptor"))?;
    dnn::set_convolution_group_count(conv, g.groups as i32).map_err(dnn_err("cudnnSetConvolutionGroupCount"))?;
    let math = match dtype {
        DType::F16 | DType::BF16 => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        _ => sys::cudnnMathType_t::CUDNN_FMA_MATH,
    };
    dnn::set_convolution_math_type(conv, math).map_err(dnn_err("cudnnSetConvolutionMathType"))?;

    const COUNT: usize = 16;
    let mut returned: c_int = 0;
    // (algo, workspace bytes, math type, status) of each candidate, best first.
    let candidates: Vec<Candidate<Algo>> = match call.form {
        ConvForm::Forward => {
            let mut perf = [std::mem::zeroed::<sys::cudnnConvolutionFwdAlgoPerf_t>(); COUNT];
            let (x, w, y) = (a.tensor(), b.filter(), out.tensor());
            dnn::get_convolution_forward_algorithm(
                handle,
                x,
                w,
                conv,
                y,
                COUNT as c_int,
                &mut returned,
                perf.as_mut_ptr(),
            )
            .map_err(dnn_err("cudnnGetConvolutionForwardAlgorithm_v7"))?;
            perf[..returned as usize]
                .iter()
                .map(|p| (Algo::Forward(p.algo), p.memory, p.mathType, p.status, p.determinism))
                .collect()
        }
        ConvForm::BackwardData { .. } => {
            let mut perf = [std::mem::zeroed::<sys::cudnnConvolutionBwdDataAlgoPerf_t>(); COUNT];
            let (dy, w, dx) = (a.tensor(), b.filter(), out.tensor());
            dnn::get_convolution_backward_data_algorithm(
                handle,
                w,
                dy,
                conv,
                dx,
                COUNT as c_int,
                &mut returned,
                perf.as_mut_ptr(),
            )
            .map_err(dnn_err("cudnnGetConvolutionBackwardDataAlgorithm_v7"))?;
            perf[..returned as usize]
                .iter()
                .map(|p| (Algo::Data(p.algo), p.memory, p.mathType, p.status, p.determinism))
                .collect()
        }
        ConvForm::BackwardWeight { .. } => {
            let mut perf = [std::mem::zeroed::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>(); COUNT];
            let (x, dy, dw) = (a.tensor(), b.tensor(), out.filter());
            dnn::get_convolution_backward_filter_algorithm(
                handle,
                x,
                dy,
                conv,
                dw,
                COUNT as c_int,
                &mut returned,
                perf.as_mut_ptr(),
            )
            .map_err(dnn_err("cudnnGetConvolutionBackwardFilterAlgorithm_v7"))?;
            perf[..returned as usize]
                .iter()
                .map(|p| (Algo::Filter(p.algo), p.memory, p.mathType, p.status, p.determinism))
                .collect()
        }
    };
    let Some(&(algo, workspace, math, _, _)) = first_usable(&candidates, dtype) else {
        return Err(Error::runtime(format!("cuDNN has no algorithm for {} ({})", call.form.name(), describe(call))));
    };
    dnn::set_convolution_math_type(conv, math).map_err(dnn_err("cudnnSetConvolutionMathType"))?;
    Ok(LegacyPlan { a, b, out, conv, algo, workspace, f64: dtype == DType::F64 })
}

/// One of the legacy heuristics' candidates: algorithm, workspace bytes, math type, status and
/// determinism.
type Candidate<A> = (A, usize, sys::cudnnMathType_t, sys::cudnnStatus_t, sys::cudnnDeterminism_t);

/// The first of the legacy heuristics' candidates (best first) that ran, fits
/// [`WORKSPACE_LIMIT`], gives the same bits on every run (some weight-gradient algorithms sum
/// by atomics) and keeps `dtype`'s precision. The heuristics list candidates of every math
/// type whatever the descriptor says; for f32 and f64 only FMA math qualifies
/// (`CUDNN_DEFAULT_MATH` may take TF32 tensor cores on sm_80 and newer, which coil's f32 never
/// does).
fn first_usable<A>(candidates: &[Candidate<A>], dtype: DType) -> Option<&Candidate<A>> {
    let precise = |m: sys::cudnnMathType_t| {
        matches!(dtype, DType::F16 | DType::BF16) || m == sys::cudnnMathType_t::CUDNN_FMA_MATH
    };
    candidates.iter().find(|(_, memory, m, status, determinism)| {
        *status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
            && *memory <= WORKSPACE_LIMIT
            && precise(*m)
            && *determinism == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC
    })
}

/// Says once per call shape (`COIL_LOGS=schedule`) that a convolution runs on the host, and why:
/// it is correct there but orders of magnitude slower, so a slow step can be traced to it.
fn log_host_fallback(call: &ConvCall, dtype: DType, why: &str) {
    static LOGGED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let key = format!("{dtype} {:?} {:?} {}", call.form, call.geometry, describe(call));
    let mut logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    if !logged.contains(&key) {
        super::schedule_log(&format!("convolution on the host (cuDNN: {why}): {key}"));
        logged.push(key);
    }
}

/// The call on the host: operands downloaded, the reference computation, the result uploaded.
fn on_host(
    dev: &CudaDevice,
    call: &ConvCall,
    dtype: DType,
    a: DevOperand,
    b: DevOperand,
    out: DevOperand,
) -> Result<()> {
    // SAFETY: each operand's pointer addresses its buffer's bytes.
    let (ha, hb) = unsafe { (download(dev, a.ptr, a.bytes)?, download(dev, b.ptr, b.bytes)?) };
    let y = crate::interp::conv::conv_bytes(call, dtype, &ha, &hb)?;
    if y.len() != out.bytes {
        return Err(Error::runtime(format!("a convolution made {} bytes for {}", y.len(), out.bytes)));
    }
    // SAFETY: the output holds `out.bytes` bytes.
    unsafe { upload(dev, out.ptr, &y)? };
    dev.wait()
}

/// The graph API's fallbacks on `dev` so far: each call shape's key and why (for tests).
#[cfg(test)]
fn graph_fallbacks(dev: &CudaDevice) -> Vec<String> {
    let Ok(dnn) = Cudnn::get(dev) else { return vec![] };
    let plans = dnn.plans.lock().unwrap_or_else(|e| e.into_inner());
    let mut fallbacks: Vec<String> = plans
        .iter()
        .filter(|(_, p)| p.graph_failure.is_some())
        .map(|(k, p)| format!("{k}: {}", p.describe()))
        .collect();
    fallbacks.sort();
    fallbacks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_of_filters_and_one_d_views() {
        assert_eq!(row_major(&[4, 3, 2, 2]), vec![12, 4, 2, 1]);
        assert_eq!(channels_last(&[4, 3, 2, 2]), vec![12, 1, 6, 3]);
        // A size-1 dim's stride does not matter.
        assert!(same_layout(&[4, 1, 2, 2], &[4, 99, 2, 1], &row_major(&[4, 1, 2, 2])));
        let (dims, strides) = four_d(&[2, 3, 10], &[30, 1, 3]);
        assert_eq!(dims, vec![2, 3, 1, 10]);
        assert_eq!(strides, vec![30, 1, 30, 3]);
    }

    #[test]
    fn legacy_candidates_keep_f32_off_tensor_cores_and_repeat_bit_for_bit() {
        use sys::cudnnDeterminism_t::{CUDNN_DETERMINISTIC, CUDNN_NON_DETERMINISTIC};
        use sys::cudnnMathType_t::{CUDNN_DEFAULT_MATH, CUDNN_FMA_MATH, CUDNN_TENSOR_OP_MATH};
        use sys::cudnnStatus_t::{CUDNN_STATUS_NOT_SUPPORTED, CUDNN_STATUS_SUCCESS};
        let (ok, same) = (CUDNN_STATUS_SUCCESS, CUDNN_DETERMINISTIC);
        let candidates = [
            ("atomics", 0, CUDNN_TENSOR_OP_MATH, ok, CUDNN_NON_DETERMINISTIC),
            ("tf32", 0, CUDNN_DEFAULT_MATH, ok, same),
            ("tensor", 0, CUDNN_TENSOR_OP_MATH, ok, same),
            ("failed", 0, CUDNN_FMA_MATH, CUDNN_STATUS_NOT_SUPPORTED, same),
            ("too big", WORKSPACE_LIMIT + 1, CUDNN_FMA_MATH, ok, same),
            ("fma atomics", 0, CUDNN_FMA_MATH, ok, CUDNN_NON_DETERMINISTIC),
            ("fma", 64, CUDNN_FMA_MATH, ok, same),
        ];
        let name = |dtype| first_usable(&candidates, dtype).map(|c| c.0);
        assert_eq!(name(DType::F32), Some("fma"));
        assert_eq!(name(DType::F64), Some("fma"));
        assert_eq!(name(DType::BF16), Some("tf32"), "16-bit floats take the first deterministic one");
        assert_eq!(first_usable(&candidates[..3], DType::F32), None);
    }

    #[test]
    fn the_graph_api_falls_back_to_the_legacy_plan_and_says_why() {
        let fail = |what: &str| Error::runtime(what.to_string());
        let picked = |r: Result<(Chosen<&str, &str>, Option<String>)>| match r {
            Ok((Chosen::Graph(g), why)) => (format!("graph {g}"), why),
            Ok((Chosen::Legacy(l), why)) => (format!("legacy {l}"), why),
            Err(e) => (format!("error: {}", e.message), None),
        };
        let graph = choose(CudnnApi::Graph, || Ok("engine"), || -> Result<&str> { panic!("legacy not needed") });
        assert_eq!(picked(graph), ("graph engine".into(), None));
        let fallback = choose(CudnnApi::Graph, || Err(fail("no engine config fits")), || Ok("algo"));
        assert_eq!(picked(fallback), ("legacy algo".into(), Some("no engine config fits".into())));
        let legacy = choose(CudnnApi::Legacy, || -> Result<&str> { panic!("graph API not asked for") }, || Ok("algo"));
        assert_eq!(picked(legacy), ("legacy algo".into(), None));
        let neither =
            picked(choose(CudnnApi::Graph, || -> Result<&str> { Err(fail("finalize")) }, || Err(fail("no algo"))));
        assert_eq!(neither.0, "error: no algo (graph API: finalize)");
    }
}

#[cfg(test)]
#[path = "cudnn_tests.rs"]
mod end_to_end;
