//! Attention through cuDNN's fused flash-attention engines: the forward and the backward of
//! [`ExternCall::Attention`](coil_ir::loops::ExternCall) as operation graphs of the backend
//! API, laid out as cuDNN's own frontend lays out its scaled-dot-product-attention nodes
//! (cuDNN recognizes the pattern and runs one fused kernel per graph, on Hopper with `wgmma`).
//!
//! * Forward: `S = Q Kᵀ · scale`, the causal rule as `row >= col` selecting `-inf`, softmax as
//!   `max`, `exp(S - max)`, `sum`, the row logsumexp `max + ln(sum)` (coil's statistic: the
//!   backward reads it), `P = exp / sum` in the operands' dtype, `O = P V`.
//! * Backward: `delta = sum(dO · O)` per row (the engines want it in their graph),
//!   `P = exp(S - lse)` recomputed, `dV = Pᵀ dO`,
//!   `dS = P (dO Vᵀ - delta) · scale`, `dK = dSᵀ Q`, `dQ = dS K` written directly. (The
//!   frontend's other form sums dQ into an f32 accumulator by atomics, whose bits change from
//!   run to run; this one keeps dP in the plan's workspace, `B·H·L·S·2` bytes, and gives the
//!   same bits every run, as the frontend's `set_deterministic_algorithm` does on Hopper.)
//!
//! Only what these engines serve is sent: f16 / bf16, no mask or the plain causal rule, equal
//! heads, head dims that are multiples of 8 up to 128, unit column strides and 16-byte aligned
//! rows, sm_80 or later. A plan is made once per call shape (dims, strides, alignment, scale);
//! a shape cuDNN has no engine for is remembered and runs on coil's own templates
//! ([`super::attention`]), and the `schedule` log says why, once.
//!
//! Which engine config runs: the heuristics' order is a model's guess (on the H100, GPT-2's
//! causal forward took 61 us with the first config and 52 with the second, the same engine
//! with other knobs). So the plan keeps the first `CANDIDATES` (4) configs that fit, and the
//! first run of each shape times them on its own operands, out of the L2 cache, and keeps the
//! fastest (`choose`, as the cuBLASLt algorithm choice does: the same tie rule, a choice cached on
//! disk under `<cache dir>/cudnn/` keyed by the shape, the GPU and cuDNN's version); not while
//! a CUDA graph is captured, and not with `tuning.attention_autotune` off
//! (`COIL_ATTENTION_AUTOTUNE=0`), where the first runs. Every candidate is repeatable (the
//! same bits every run), but two configs may differ in the last bits.

use super::autotune::fastest;
use super::cudnn::{data_type, Cudnn};
use super::cudnn_graph::{alignment, execute_config, execute_pack, plan_ops, Descriptor, GraphPlan, Value};
use super::device::CudaDevice;
use super::memory::DeviceMemory;
use crate::cache_entry;
use crate::cpu::attention::AttentionSpec;
use crate::cpu::attention_backward::AttentionBackwardSpec;
use crate::cuda::blas::DevOperand;
use coil_ir::loops::StridedOperand;
use coil_ir::{DType, Error, Result};
use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as Attr, cudnnBackendDescriptorType_t as Kind, cudnnDataType_t as Dt,
    cudnnPointwiseMode_t as Pw, cudnnReduceTensorOp_t as Red,
};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// The unique ids of the graphs' non-virtual tensors (virtual ones count from [`FIRST_VIRTUAL`]).
mod uid {
    pub const Q: i64 = 1;
    pub const K: i64 = 2;
    pub const V: i64 = 3;
    pub const O: i64 = 4;
    pub const STATS: i64 = 5;
    pub const DO: i64 = 6;
    pub const DQ: i64 = 7;
    pub const DK: i64 = 8;
    pub const DV: i64 = 9;
    pub const DELTA: i64 = 10;
    pub const SCALE: i64 = 20;
    pub const NEG_INF: i64 = 21;
    pub const ONE: i64 = 22;
}
const FIRST_VIRTUAL: i64 = 100;

/// Dims and strides of a four-dim tensor `[b, h, rows, cols]`, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Layout {
    dims: [i64; 4],
    strides: [i64; 4],
}

impl Layout {
    /// Row-major.
    fn dense(dims: [i64; 4]) -> Layout {
        Layout { dims, strides: [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1] }
    }

    /// The last two dims swapped (a transposed view of the same elements).
    fn transposed(self) -> Layout {
        let Layout { dims: [b, h, r, c], strides: [sb, sh, sr, sc] } = self;
        Layout { dims: [b, h, c, r], strides: [sb, sh, sc, sr] }
    }

    /// The `[b, h, rows, cols]` layout of a strided attention operand with at most two batch
    /// dims (`[b, h]`, `[h]` or none), or `None` where the engines cannot read it: a column
    /// stride other than 1, or rows not 16-byte aligned.
    fn of(op: &StridedOperand<usize>, batch: &[usize], rows: usize, cols: usize, elem: usize) -> Option<Layout> {
        if op.col_stride != 1 && cols > 1 {
            return None;
        }
        let (dims_bh, strides_bh) = match (batch, &op.batch_strides[..]) {
            ([], []) => ([1, 1], [0, 0]),
            ([h], [sh]) => ([1, *h], [0, *sh]),
            ([b, h], [sb, sh]) => ([*b, *h], [*sb, *sh]),
            _ => return None,
        };
        if dims_bh.iter().zip(&strides_bh).any(|(&n, &s)| n > 1 && s == 0) {
            return None; // a broadcast batch dim
        }
        let aligned = |stride: usize| (stride * elem).is_multiple_of(16);
        if !aligned(op.row_stride) || !strides_bh.iter().all(|&s| aligned(s)) {
            return None;
        }
        let i = |x: usize| x as i64;
        let mut strides = [i(strides_bh[0]), i(strides_bh[1]), i(op.row_stride), 1];
        // A dim of one element is not a broadcast: give it the stride of a packed layout
        // (the engines refuse a zero stride).
        if dims_bh[1] == 1 {
            strides[1] = strides[2] * i(rows);
        }
        if dims_bh[0] == 1 {
            strides[0] = strides[1] * i(dims_bh[1]);
        }
        Some(Layout { dims: [i(dims_bh[0]), i(dims_bh[1]), i(rows), i(cols)], strides })
    }
}

/// The address every buffer of a plan made ahead has ([`plan_forward`]): aligned beyond
/// [`super::cudnn_graph::alignment`]'s cap, as the allocator's blocks are, so a view's alignment
/// is its offset's, as in the run.
const AHEAD_BASE: u64 = 1 << 40;

/// What a plan is made for: its cache key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Shape {
    backward: bool,
    dtype: DType,
    causal: bool,
    scale_bits: u32,
    /// Whether the forward writes the row logsumexp.
    stats: bool,
    /// q, k, v, the output, and the output gradient (backward).
    operands: Vec<Layout>,
    /// dq, dk, dv (backward).
    grads: Option<[Layout; 3]>,
    /// The byte alignment of every device address the plan reads or writes.
    aligns: Vec<i64>,
}

/// The plans made so far (and the shapes cuDNN has none for), by device ordinal and shape.
type Plans = HashMap<(usize, Shape), std::result::Result<Arc<GraphPlan>, String>>;

static PLANS: Mutex<Option<Plans>> = Mutex::new(None);

/// How many attention call shapes have a cuDNN plan in this process, and how many cuDNN had
/// none for (those run on coil's templates).
pub fn attention_plans() -> (usize, usize) {
    let table = PLANS.lock().unwrap_or_else(|e| e.into_inner());
    let plans = table.iter().flat_map(|t| t.values());
    plans.fold((0, 0), |(made, refused), p| if p.is_ok() { (made + 1, refused) } else { (made, refused + 1) })
}

/// Whether the engines serve an attention of `dtype` over these sizes at all.
fn served(dev: &CudaDevice, dtype: DType, batch: &[usize], l: usize, s: usize, d: usize) -> bool {
    let usable = coil_ir::config::current().cudnn_attention && super::cudnn::available();
    usable
        && matches!(dtype, DType::BF16 | DType::F16)
        && dev.target().compute_capability.0 >= 8
        && batch.len() <= 2
        && d.is_multiple_of(8)
        && (8..=128).contains(&d)
        && l >= 64
        && s >= 64
}

/// Runs the forward call `spec` through cuDNN when it serves it: `Ok(true)` when enqueued,
/// `Ok(false)` when the caller's templates must run it. `bases`: the buffers of q, k, v and the output; `lse`: the row logsumexp's, when wanted.
pub(super) fn forward(
    dev: &Arc<CudaDevice>,
    spec: &AttentionSpec,
    dtype: DType,
    bases: [u64; 4],
    lse: Option<u64>,
) -> Result<bool> {
    match forward_call(dev, spec, dtype, bases, lse) {
        Some((shape, uids, ptrs)) => run(dev, shape, uids, ptrs, &[]),
        None => Ok(false),
    }
}

/// Makes the plan [`forward`] will want for `spec` on buffers aligned as the allocator aligns
/// them, before the call's first run needs it ([`super::ahead`]); `None` when cuDNN does not
/// serve the call or has no plan for it.
pub(super) fn plan_forward(dev: &Arc<CudaDevice>, spec: &AttentionSpec, dtype: DType, lse: bool) -> Option<()> {
    let (shape, ..) = forward_call(dev, spec, dtype, [AHEAD_BASE; 4], lse.then_some(AHEAD_BASE))?;
    plan(dev, shape).ok().flatten().map(|_| ())
}

/// The plan key, tensor ids and addresses of the forward call `spec` over `bases`, when cuDNN
/// serves it.
fn forward_call(
    dev: &Arc<CudaDevice>,
    spec: &AttentionSpec,
    dtype: DType,
    bases: [u64; 4],
    lse: Option<u64>,
) -> Option<(Shape, Vec<i64>, Vec<u64>)> {
    // Dropout runs coil's kernels: cuDNN's random numbers are not coil's Philox stream.
    if spec.mask.is_some()
        || spec.mask_rule.is_some()
        || spec.dropout.is_some()
        || !served(dev, dtype, &spec.batch, spec.l, spec.s, spec.d)
    {
        return None;
    }
    let elem = dtype.size_bytes();
    let (b, l, s, d) = (&spec.batch, spec.l, spec.s, spec.d);
    let layouts = (
        Layout::of(&spec.q, b, l, d, elem),
        Layout::of(&spec.k, b, s, d, elem),
        Layout::of(&spec.v, b, s, d, elem),
        Layout::of(&spec.out, b, l, d, elem),
    );
    let (Some(ql), Some(kl), Some(vl), Some(ol)) = layouts else { return None };
    let at = |base: u64, op: &StridedOperand<usize>| base + (op.offset * elem) as u64;
    let [q, k, v, out] = bases;
    let mut ptrs = vec![at(q, &spec.q), at(k, &spec.k), at(v, &spec.v), at(out, &spec.out)];
    let mut uids = vec![uid::Q, uid::K, uid::V, uid::O];
    if let Some(lse) = lse {
        ptrs.push(lse);
        uids.push(uid::STATS);
    }
    let shape = Shape {
        backward: false,
        dtype,
        causal: spec.causal,
        scale_bits: (spec.scale as f32).to_bits(),
        stats: lse.is_some(),
        operands: vec![ql, kl, vl, ol],
        grads: None,
        aligns: ptrs.iter().map(|&p| alignment(p)).collect(),
    };
    Some((shape, uids, ptrs))
}

/// Runs the backward call `spec` through cuDNN when it serves it (every gradient wanted):
/// `Ok(true)` when enqueued, `Ok(false)` when the caller's templates must run it.
/// `operands`: the buffers of q, k, v, the output gradient and the output; `lse`: the
/// logsumexp's; `grads`: dq's, dk's and dv's.
pub(super) fn backward(
    dev: &Arc<CudaDevice>,
    spec: &AttentionBackwardSpec,
    dtype: DType,
    operands: [u64; 5],
    lse: u64,
    grads: [Option<DevOperand>; 3],
) -> Result<bool> {
    match backward_call(dev, spec, dtype, operands, lse, grads.map(|g| g.map(|g| g.ptr))) {
        // The graph's own delta.
        Some((shape, uids, ptrs)) => run(dev, shape, uids, ptrs, &[(uid::DELTA, spec.batch_count() * spec.l * 4)]),
        None => Ok(false),
    }
}

/// Makes the plan [`backward`] will want for `spec` (every gradient wanted) on buffers aligned
/// as the allocator aligns them, before the call's first run needs it ([`super::ahead`]).
pub(super) fn plan_backward(dev: &Arc<CudaDevice>, spec: &AttentionBackwardSpec, dtype: DType) -> Option<()> {
    let (shape, ..) = backward_call(dev, spec, dtype, [AHEAD_BASE; 5], AHEAD_BASE, [Some(AHEAD_BASE); 3])?;
    plan(dev, shape).ok().flatten().map(|_| ())
}

/// The plan key, tensor ids and addresses of the backward call `spec`, when cuDNN serves it.
fn backward_call(
    dev: &Arc<CudaDevice>,
    spec: &AttentionBackwardSpec,
    dtype: DType,
    operands: [u64; 5],
    lse: u64,
    grads: [Option<u64>; 3],
) -> Option<(Shape, Vec<i64>, Vec<u64>)> {
    let [dq, dk, dv] = grads;
    let (dq, dk, dv) = (dq?, dk?, dv?);
    let (dqv, dkv, dvv) = (spec.dq.as_ref()?, spec.dk.as_ref()?, spec.dv.as_ref()?);
    // An explicit mask and dropout run on coil's kernels, as the forward's do.
    if spec.mask.is_some() || spec.dropout.is_some() || !served(dev, dtype, &spec.batch, spec.l, spec.s, spec.d) {
        return None;
    }
    let elem = dtype.size_bytes();
    let (b, l, s, d) = (&spec.batch, spec.l, spec.s, spec.d);
    let views =
        [(&spec.q, l), (&spec.k, s), (&spec.v, s), (&spec.out, l), (&spec.grad_out, l), (dqv, l), (dkv, s), (dvv, s)];
    let layouts = views.iter().map(|(op, rows)| Layout::of(op, b, *rows, d, elem)).collect::<Option<Vec<_>>>()?;
    let at = |base: u64, op: &StridedOperand<usize>| base + (op.offset * elem) as u64;
    let [q, k, v, g, o] = operands;
    let ptrs = vec![
        at(q, &spec.q),
        at(k, &spec.k),
        at(v, &spec.v),
        at(o, &spec.out),
        at(g, &spec.grad_out),
        at(dq, dqv),
        at(dk, dkv),
        at(dv, dvv),
        lse,
    ];
    let uids = vec![uid::Q, uid::K, uid::V, uid::O, uid::DO, uid::DQ, uid::DK, uid::DV, uid::STATS];
    let shape = Shape {
        backward: true,
        dtype,
        causal: spec.causal,
        scale_bits: (spec.scale as f32).to_bits(),
        stats: true,
        operands: layouts[..5].to_vec(),
        grads: Some([layouts[5], layouts[6], layouts[7]]),
        aligns: ptrs.iter().map(|&p| alignment(p)).collect(),
    };
    Some((shape, uids, ptrs))
}

/// The plan of `shape`, made once per device and shape (`None`: cuDNN has none, the templates
/// run it). A call made ahead ([`plan_forward`]) and the run's own meet here: the plans' lock
/// is held while one is made, so the run waits for it rather than making it again.
fn plan(dev: &Arc<CudaDevice>, shape: Shape) -> Result<Option<Arc<GraphPlan>>> {
    let dnn = Cudnn::get(dev)?;
    let key = (dev.ordinal(), shape);
    let mut table = PLANS.lock().unwrap_or_else(|e| e.into_inner());
    let entry = table.get_or_insert_with(HashMap::new).entry(key.clone()).or_insert_with(|| {
        // SAFETY: the handle is used under the plans' lock; the descriptors live with the plan.
        let made = dnn.with_handle(|h| unsafe { make_plan(h, &key.1) });
        match &made {
            Ok(p) => super::schedule_log(&format!(
                "attention through cuDNN, engine {} (notes {:?}): {:?}",
                p.engine,
                super::cudnn_graph::note_names(&p.notes),
                key.1
            )),
            Err(e) => {
                super::schedule_log(&format!("attention through coil's templates (cuDNN: {}): {:?}", e.message, key.1))
            }
        }
        made.map(Arc::new).map_err(|e| e.message)
    });
    Ok(entry.as_ref().ok().cloned())
}

/// Plans `shape` (once) and enqueues it over the tensors `uids` at `ptrs`, with device
/// scratch tensors `(uid, bytes)`.
fn run(
    dev: &Arc<CudaDevice>,
    shape: Shape,
    mut uids: Vec<i64>,
    mut ptrs: Vec<u64>,
    scratch: &[(i64, usize)],
) -> Result<bool> {
    let scale_bits = shape.scale_bits;
    let (causal, backward) = (shape.causal, shape.backward);
    let Some(plan) = plan(dev, shape.clone())? else { return Ok(false) };
    let dnn = Cudnn::get(dev)?;
    // Room for every candidate's workspace until one is chosen.
    let room = match plan.chosen.get() {
        Some(&i) => plan.workspace_of(i),
        None => (0..plan.candidates()).map(|i| plan.workspace_of(i)).max().unwrap_or(0),
    };
    let workspace = DeviceMemory::alloc(dev, room.max(1))?;
    let mut temps = Vec::with_capacity(scratch.len());
    for &(id, bytes) in scratch {
        let t = DeviceMemory::alloc(dev, bytes.max(1))?;
        uids.push(id);
        ptrs.push(t.ptr());
        temps.push(t);
    }
    // The by-value scalars the graph has (a pack naming a tensor the graph lacks is refused).
    let scalars = [(uid::SCALE, f32::from_bits(scale_bits)), (uid::NEG_INF, f32::NEG_INFINITY), (uid::ONE, 1.0)];
    let used = [true, causal, backward];
    let mut pointers: Vec<*mut c_void> = ptrs.iter().map(|&p| p as *mut c_void).collect();
    for ((id, value), _) in scalars.iter().zip(used).filter(|(_, used)| *used) {
        uids.push(*id);
        pointers.push(value as *const f32 as *mut c_void);
    }
    dev.bind()?;
    // SAFETY: the plan was made for these views at addresses of these alignments (the key);
    // the callers bounds-checked every view; the scalars live through the call (cuDNN reads
    // them when it enqueues); the scratch holds the plan's workspace and the accumulator and
    // goes back to the stream-ordered cache after the call is enqueued.
    let status = dnn.with_handle(|h| unsafe {
        cudarc::cudnn::result::set_stream(h, dev.cu_stream() as sys::cudaStream_t)
            .map_err(|e| Error::runtime(format!("cudnnSetStream failed: {e}")))?;
        let ws = workspace.ptr() as *mut c_void;
        choose(dev, &plan, &shape, |i| execute_config(h, &plan, i, &uids, &pointers, ws))?;
        execute_pack(h, &plan, &uids, &pointers, ws)
    });
    drop((workspace, temps));
    status.map(|()| true).map_err(|e| Error::runtime(format!("attention through cuDNN failed: {}", e.message)))
}

/// The operation graph under construction: tensors and operations, finalized as they are added.
struct Graph {
    parts: Vec<Descriptor>,
    ops: Vec<Descriptor>,
    next_uid: i64,
}

/// A tensor of the graph: its descriptor's handle and layout.
#[derive(Clone, Copy)]
struct T {
    raw: sys::cudnnBackendDescriptor_t,
    layout: Layout,
}

impl Graph {
    fn tensor(&mut self, id: Option<i64>, dt: Dt, layout: Layout, align: i64, by_value: bool) -> Result<T> {
        let virt = id.is_none();
        let id = id.unwrap_or_else(|| {
            self.next_uid += 1;
            self.next_uid
        });
        let d = Descriptor::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        d.set_all(&[
            (Attr::CUDNN_ATTR_TENSOR_DATA_TYPE, Value::DataType(dt)),
            (Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, Value::Int64(layout.dims.to_vec())),
            (Attr::CUDNN_ATTR_TENSOR_STRIDES, Value::Int64(layout.strides.to_vec())),
            (Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID, Value::Int64(vec![id])),
            (Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, Value::Int64(vec![align])),
            (Attr::CUDNN_ATTR_TENSOR_IS_VIRTUAL, Value::Bool(virt)),
        ])?;
        if by_value {
            d.set(Attr::CUDNN_ATTR_TENSOR_IS_BY_VALUE, &Value::Bool(true))?;
        }
        d.finalize()?;
        let raw = d.raw;
        self.parts.push(d);
        Ok(T { raw, layout })
    }

    /// A virtual tensor of `dt`.
    fn virt(&mut self, dt: Dt, layout: Layout) -> Result<T> {
        self.tensor(None, dt, layout, 16, false)
    }

    /// A float scalar passed by value at execution.
    fn scalar(&mut self, id: i64) -> Result<T> {
        self.tensor(Some(id), Dt::CUDNN_DATA_FLOAT, Layout::dense([1, 1, 1, 1]), 16, true)
    }

    fn op(&mut self, kind: Kind, attrs: &[(Attr, Value)]) -> Result<()> {
        let op = Descriptor::new(kind)?;
        op.set_all(attrs)?;
        op.finalize()?;
        self.ops.push(op);
        Ok(())
    }

    fn desc(&mut self, kind: Kind, attrs: &[(Attr, Value)]) -> Result<sys::cudnnBackendDescriptor_t> {
        let d = Descriptor::new(kind)?;
        d.set_all(attrs)?;
        d.finalize()?;
        let raw = d.raw;
        self.parts.push(d);
        Ok(raw)
    }

    /// `c = a @ b` (batched over the first two dims), accumulating in f32.
    fn matmul(&mut self, a: T, b: T, c: T) -> Result<()> {
        let mm = self.desc(
            Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR,
            &[(Attr::CUDNN_ATTR_MATMUL_COMP_TYPE, Value::DataType(Dt::CUDNN_DATA_FLOAT))],
        )?;
        let one = |t: T| Value::Descriptors(vec![t.raw]);
        self.op(
            Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
            &[
                (Attr::CUDNN_ATTR_OPERATION_MATMUL_ADESC, one(a)),
                (Attr::CUDNN_ATTR_OPERATION_MATMUL_BDESC, one(b)),
                (Attr::CUDNN_ATTR_OPERATION_MATMUL_CDESC, one(c)),
                (Attr::CUDNN_ATTR_OPERATION_MATMUL_DESC, Value::Descriptors(vec![mm])),
            ],
        )
    }

    /// `y = mode(x, b, t)` elementwise (broadcasting), computed in `prec`; `axis` for index
    /// generation.
    fn pointwise(&mut self, mode: Pw, inputs: &[T], y: T, prec: Dt, axis: Option<i64>) -> Result<()> {
        let mut attrs = vec![
            (Attr::CUDNN_ATTR_POINTWISE_MODE, Value::PointwiseMode(mode)),
            (Attr::CUDNN_ATTR_POINTWISE_MATH_PREC, Value::DataType(prec)),
        ];
        if let Some(axis) = axis {
            attrs.push((Attr::CUDNN_ATTR_POINTWISE_AXIS, Value::Int64(vec![axis])));
        }
        let pw = self.desc(Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &attrs)?;
        let roles = [
            Attr::CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
            Attr::CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
            Attr::CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
        ];
        let mut op = vec![(Attr::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, Value::Descriptors(vec![pw]))];
        op.extend(roles.iter().zip(inputs).map(|(r, t)| (*r, Value::Descriptors(vec![t.raw]))));
        op.push((Attr::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, Value::Descriptors(vec![y.raw])));
        self.op(Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &op)
    }

    /// A new virtual f32 tensor `mode(inputs)` of `layout`.
    fn map(&mut self, mode: Pw, inputs: &[T], layout: Layout) -> Result<T> {
        let y = self.virt(Dt::CUDNN_DATA_FLOAT, layout)?;
        self.pointwise(mode, inputs, y, Dt::CUDNN_DATA_FLOAT, None)?;
        Ok(y)
    }

    /// `y = op(x)` over the last dim.
    fn reduce(&mut self, op: Red, x: T, y: T) -> Result<()> {
        let red = self.desc(
            Kind::CUDNN_BACKEND_REDUCTION_DESCRIPTOR,
            &[
                (Attr::CUDNN_ATTR_REDUCTION_OPERATOR, Value::ReduceOp(op)),
                (Attr::CUDNN_ATTR_REDUCTION_COMP_TYPE, Value::DataType(Dt::CUDNN_DATA_FLOAT)),
            ],
        )?;
        self.op(
            Kind::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
            &[
                (Attr::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, Value::Descriptors(vec![x.raw])),
                (Attr::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, Value::Descriptors(vec![y.raw])),
                (Attr::CUDNN_ATTR_OPERATION_REDUCTION_DESC, Value::Descriptors(vec![red])),
            ],
        )
    }

    /// `y`, a view of `x`'s elements in another layout.
    fn reshape(&mut self, x: T, y: T) -> Result<()> {
        self.op(
            Kind::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
            &[
                (Attr::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, Value::Descriptors(vec![x.raw])),
                (Attr::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, Value::Descriptors(vec![y.raw])),
            ],
        )
    }

    /// The scores `x` with `-inf` where the key comes after the query row (`row >= col` keeps).
    fn causal(&mut self, x: T, neg_inf: T) -> Result<T> {
        let int = |g: &mut Graph| g.virt(Dt::CUDNN_DATA_INT32, x.layout);
        let row = int(self)?;
        self.pointwise(Pw::CUDNN_POINTWISE_GEN_INDEX, &[x], row, Dt::CUDNN_DATA_FLOAT, Some(2))?;
        let col = int(self)?;
        self.pointwise(Pw::CUDNN_POINTWISE_GEN_INDEX, &[x], col, Dt::CUDNN_DATA_FLOAT, Some(3))?;
        let keep = self.virt(Dt::CUDNN_DATA_BOOLEAN, x.layout)?;
        self.pointwise(Pw::CUDNN_POINTWISE_CMP_GE, &[row, col], keep, Dt::CUDNN_DATA_BOOLEAN, None)?;
        self.map(Pw::CUDNN_POINTWISE_BINARY_SELECT, &[x, neg_inf, keep], x.layout)
    }
}

/// The execution plan of `shape`'s graph.
///
/// # Safety
/// `handle` is a live cuDNN handle, used by one thread at a time.
unsafe fn make_plan(handle: sys::cudnnHandle_t, shape: &Shape) -> Result<GraphPlan> {
    let dt = data_type(shape.dtype)?;
    let f32 = Dt::CUDNN_DATA_FLOAT;
    let mut g = Graph { parts: Vec::new(), ops: Vec::new(), next_uid: FIRST_VIRTUAL };
    let (ql, kl, vl, ol) = (shape.operands[0], shape.operands[1], shape.operands[2], shape.operands[3]);
    let align = |k: usize| shape.aligns[k];
    let [b, h, l, d] = ql.dims;
    let s = kl.dims[2];
    let scores = Layout::dense([b, h, l, s]);
    let rows = Layout { dims: [b, h, l, 1], strides: [h * l, l, 1, 1] };
    let q = g.tensor(Some(uid::Q), dt, ql, align(0), false)?;
    let kt = g.tensor(Some(uid::K), dt, kl.transposed(), align(1), false)?;
    let scale = g.scalar(uid::SCALE)?;
    let masked = |g: &mut Graph, x: T| {
        if shape.causal {
            let neg_inf = g.scalar(uid::NEG_INF)?;
            g.causal(x, neg_inf)
        } else {
            Ok(x)
        }
    };
    if !shape.backward {
        let v = g.tensor(Some(uid::V), dt, vl, align(2), false)?;
        let o = g.tensor(Some(uid::O), dt, ol, align(3), false)?;
        let raw = g.virt(f32, scores)?;
        g.matmul(q, kt, raw)?;
        let scaled = g.map(Pw::CUDNN_POINTWISE_MUL, &[raw, scale], scores)?;
        let x = masked(&mut g, scaled)?;
        let max = g.virt(f32, rows)?;
        g.reduce(Red::CUDNN_REDUCE_TENSOR_MAX, x, max)?;
        let shifted = g.map(Pw::CUDNN_POINTWISE_SUB, &[x, max], scores)?;
        let e = g.map(Pw::CUDNN_POINTWISE_EXP, &[shifted], scores)?;
        let sum = g.virt(f32, rows)?;
        g.reduce(Red::CUDNN_REDUCE_TENSOR_ADD, e, sum)?;
        let log = g.map(Pw::CUDNN_POINTWISE_LOG, &[sum], rows)?;
        let stats =
            if shape.stats { g.tensor(Some(uid::STATS), f32, rows, align(4), false)? } else { g.virt(f32, rows)? };
        g.pointwise(Pw::CUDNN_POINTWISE_ADD, &[max, log], stats, f32, None)?;
        let p = g.virt(dt, scores)?;
        g.pointwise(Pw::CUDNN_POINTWISE_DIV, &[e, sum], p, f32, None)?;
        g.matmul(p, v, o)?;
    } else {
        let [dql, dkl, dvl] = shape.grads.expect("a backward's gradients");
        let vt = g.tensor(Some(uid::V), dt, vl.transposed(), align(2), false)?;
        let o = g.tensor(Some(uid::O), dt, ol, align(3), false)?;
        let dout = g.tensor(Some(uid::DO), dt, shape.operands[4], align(4), false)?;
        let dq = g.tensor(Some(uid::DQ), dt, dql, align(5), false)?;
        let dk = g.tensor(Some(uid::DK), dt, dkl, align(6), false)?;
        let dv = g.tensor(Some(uid::DV), dt, dvl, align(7), false)?;
        let stats = g.tensor(Some(uid::STATS), f32, rows, align(8), false)?;
        let one = g.scalar(uid::ONE)?;
        // The frontend's layout of the product (virtual: its strides only name an order).
        let product = Layout { dims: [b, h, l, d], strides: [h * l * d, l * d, h * d, 1] };
        let dot = g.map(Pw::CUDNN_POINTWISE_MUL, &[dout, o], product)?;
        let summed = g.virt(f32, rows)?;
        g.reduce(Red::CUDNN_REDUCE_TENSOR_ADD, dot, summed)?;
        let delta = g.tensor(Some(uid::DELTA), f32, rows, 16, false)?;
        g.pointwise(Pw::CUDNN_POINTWISE_MUL, &[summed, one], delta, f32, None)?;
        let raw = g.virt(f32, scores)?;
        g.matmul(q, kt, raw)?;
        let scaled = g.map(Pw::CUDNN_POINTWISE_MUL, &[raw, scale], scores)?;
        let shifted = g.map(Pw::CUDNN_POINTWISE_SUB, &[scaled, stats], scores)?;
        let x = masked(&mut g, shifted)?;
        let p = g.map(Pw::CUDNN_POINTWISE_EXP, &[x], scores)?;
        let pt = g.virt(dt, scores.transposed())?;
        g.reshape(p, pt)?;
        g.matmul(pt, dout, dv)?;
        let dp = g.virt(f32, scores)?;
        g.matmul(dout, vt, dp)?;
        let centered = g.map(Pw::CUDNN_POINTWISE_SUB, &[dp, delta], scores)?;
        let ds_unscaled = g.map(Pw::CUDNN_POINTWISE_MUL, &[centered, p], scores)?;
        let ds = g.map(Pw::CUDNN_POINTWISE_MUL, &[ds_unscaled, scale], scores)?;
        let dst = g.virt(dt, scores.transposed())?;
        g.reshape(ds, dst)?;
        g.matmul(dst, q, dk)?;
        let k = g.virt(f32, kl)?;
        g.reshape(kt, k)?;
        g.matmul(ds, k, dq)?;
    }
    // P rounds to the operands' dtype by construction (as in coil's templates and
    // FlashAttention), so reduced-precision notes are expected; only an engine whose bits
    // change from run to run is refused.
    plan_ops(handle, g.ops, g.parts, super::cudnn_graph::repeatable, CANDIDATES)
}

/// Engine configs that fit kept per plan, to time ([`choose`]).
const CANDIDATES: usize = 4;

/// Bumped when the choice's key or meaning changes.
const CHOICE_FORMAT: &str = "coil-cudnn-attention-choice-v1";

/// The config `plan` runs for `shape` (0: the heuristics' first): the one chosen before, else
/// the one cached on disk, else the fastest of its candidates timed by `launch(i)` (which
/// enqueues config `i` on the run's operands); the heuristics' first where nothing may be
/// timed (a CUDA graph being captured, or no memory for the timing: chosen at a later run) or
/// tuning is off.
fn choose(
    dev: &Arc<CudaDevice>,
    plan: &GraphPlan,
    shape: &Shape,
    mut launch: impl FnMut(usize) -> Result<()>,
) -> Result<usize> {
    if let Some(&i) = plan.chosen.get() {
        return Ok(i);
    }
    let config = coil_ir::config::current();
    if plan.candidates() == 1 || !config.tuning.attention_autotune {
        return Ok(*plan.chosen.get_or_init(|| 0));
    }
    if dev.capturing() {
        return Ok(0);
    }
    // SAFETY: a plain query of the loaded library.
    let version = unsafe { sys::cudnnGetVersion() };
    let text = format!("{shape:?}");
    let key = cache_entry::key(&[CHOICE_FORMAT, dev.name(), &dev.arch(), &version.to_string(), &text]);
    let dir = config.cache_dir.join("cudnn");
    let cached = cache_entry::read_choice(&dir, &key, |line| line.strip_prefix("config ")?.parse().ok());
    let i = match cached.filter(|&i| i < plan.candidates()) {
        Some(i) => i,
        None => {
            let list: Vec<usize> = (0..plan.candidates()).collect();
            // Timed with the operands out of the L2 cache, as a model's layer finds most of
            // them: GPT-2's first config took 52 us per launch repeated on cached operands,
            // like the second, but 61 us in the model against the second's 52.
            // Timing needs room (the fill's 2x L2): without it this run takes the first and a
            // later one times.
            let timed = DeviceMemory::alloc(dev, 2 * dev.target().l2_bytes.max(1 << 20))
                .and_then(|flush| super::blas_choice::time(dev, &list, Some(&flush), &mut |&i| launch(i)));
            let times = match timed {
                Ok(times) => times,
                Err(e) => {
                    super::schedule_log(&format!("attention through cuDNN: configs not timed ({})", e.message));
                    return Ok(0);
                }
            };
            let i = fastest(&times).unwrap_or(0);
            let engines: Vec<String> = (list.iter().zip(&times))
                .map(|(&k, t)| format!("{}: {}", plan.engine_of(k), t.map_or("failed".into(), |t| format!("{t:.1}"))))
                .collect();
            let note =
                format!("{text}: us per launch of configs 0..{} (engine: us): {}", list.len(), engines.join(", "));
            super::schedule_log(&format!("attention through cuDNN: config {i} ({note})"));
            if let Err(e) = cache_entry::write_choice(&dir, &key, &format!("config {i}"), &note) {
                super::schedule_log(&format!("attention through cuDNN: the choice was not cached: {}", e.message));
            }
            i
        }
    };
    Ok(*plan.chosen.get_or_init(|| i))
}

#[cfg(test)]
mod tests {
    use super::Layout;
    use coil_ir::loops::{BufferId, StridedOperand};

    fn view(offset: usize, batch_strides: &[usize], row_stride: usize, col_stride: usize) -> StridedOperand<usize> {
        StridedOperand { buffer: BufferId(0), offset, batch_strides: batch_strides.to_vec(), row_stride, col_stride }
    }

    #[test]
    fn operands_become_four_dim_layouts_the_engines_read() {
        // GPT-2's query heads inside the [B, T, 3C] projection: B=8, T=1024, 12 heads of 64.
        let q = view(0, &[1024 * 2304, 64], 2304, 1);
        let got = Layout::of(&q, &[8, 12], 1024, 64, 2).unwrap();
        assert_eq!(got, Layout { dims: [8, 12, 1024, 64], strides: [2359296, 64, 2304, 1] });
        assert_eq!(got.transposed(), Layout { dims: [8, 12, 64, 1024], strides: [2359296, 64, 1, 2304] });
        // One batch dim is the heads of a batch of one; a dim of one gets a packed stride.
        let heads = Layout::of(&view(0, &[4096], 64, 1), &[3], 64, 64, 2).unwrap();
        assert_eq!(heads, Layout { dims: [1, 3, 64, 64], strides: [12288, 4096, 64, 1] });
        let single = Layout::of(&view(0, &[], 64, 1), &[], 10, 64, 2).unwrap();
        assert_eq!(single, Layout { dims: [1, 1, 10, 64], strides: [640, 640, 64, 1] });
        assert_eq!(Layout::dense([2, 3, 4, 5]).strides, [60, 20, 5, 1]);
    }

    #[test]
    fn layouts_the_engines_cannot_read_are_refused() {
        // A column stride, rows not 16-byte aligned, a broadcast batch dim, three batch dims.
        assert_eq!(Layout::of(&view(0, &[64], 1, 64), &[2], 64, 64, 2), None);
        assert_eq!(Layout::of(&view(0, &[4096], 60, 1), &[2], 64, 60, 2), None);
        assert_eq!(Layout::of(&view(0, &[0, 64], 192, 1), &[2, 3], 64, 64, 2), None);
        assert_eq!(Layout::of(&view(0, &[1, 1, 1], 64, 1), &[1, 1, 1], 64, 64, 2), None);
    }
}
