//! Convolution plans through cuDNN's backend ("graph") API: per call shape, an operation graph
//! of one convolution operation (forward, backward data or backward filter) over tensor
//! descriptors that carry each operand's dims, strides, unique id and byte alignment; the engine
//! configs of heuristics mode A in their order; the first allowed for the dtype
//! ([`allowed`]) whose execution plan finalizes within [`WORKSPACE_LIMIT`] ([`fits`]).
//! No timing for convolutions: the choice is deterministic (the attention graphs of
//! `cudnn_sdpa` keep several fitting configs and time them). Each call runs its plan with a
//! variant pack of the operands' addresses and the workspace.
//!
//! The attribute values are built as data first ([`tensor_attrs`], [`conv_attrs`],
//! [`op_roles`]), then set through `cudnnBackendSetAttribute` with the type and element count
//! each value names ([`Value`]); every backend call's status is checked and an error names the
//! call and the attribute or descriptor.

use super::cudnn::{compute_type, data_type, four_d, spatial_params, WORKSPACE_LIMIT};
use coil_ir::loops::{ConvCall, TensorView};
use coil_ir::op::ConvForm;
use coil_ir::{DType, Error, Result};
use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as Attr, cudnnBackendAttributeType_t as Type,
    cudnnBackendDescriptorType_t as Kind, cudnnBackendNumericalNote_t as Note,
};
use std::ffi::c_void;

/// The unique ids of the operands in the operation graph and the variant pack: the first
/// operand, the second, the result.
pub(super) const UIDS: [i64; 3] = [1, 2, 3];

/// Most byte alignment claimed for an operand (what vectorized engines ask for).
const MAX_ALIGNMENT: i64 = 16;

/// One attribute's value: its elements and, through [`Value::typed`], the backend type and
/// element count `cudnnBackendSetAttribute` is told.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Value {
    /// `CUDNN_TYPE_INT64`: dims, strides, ids, alignments, paddings, workspace sizes.
    Int64(Vec<i64>),
    /// `CUDNN_TYPE_DATA_TYPE`: a tensor's element type or a compute type.
    DataType(sys::cudnnDataType_t),
    /// `CUDNN_TYPE_CONVOLUTION_MODE`.
    ConvMode(sys::cudnnConvolutionMode_t),
    /// `CUDNN_TYPE_HEUR_MODE`.
    HeurMode(sys::cudnnBackendHeurMode_t),
    /// `CUDNN_TYPE_FLOAT`: alpha and beta of a float (or half) compute type.
    Float(f32),
    /// `CUDNN_TYPE_DOUBLE`: alpha and beta of a double compute type.
    Double(f64),
    /// `CUDNN_TYPE_BACKEND_DESCRIPTOR`: other descriptors (operands, operations, configs).
    Descriptors(Vec<sys::cudnnBackendDescriptor_t>),
    /// `CUDNN_TYPE_HANDLE`.
    Handle(sys::cudnnHandle_t),
    /// `CUDNN_TYPE_VOID_PTR`: device addresses of a variant pack.
    Pointers(Vec<*mut c_void>),
    /// `CUDNN_TYPE_BOOLEAN`: a tensor's virtual and by-value flags.
    Bool(bool),
    /// `CUDNN_TYPE_POINTWISE_MODE`.
    PointwiseMode(sys::cudnnPointwiseMode_t),
    /// `CUDNN_TYPE_REDUCTION_OPERATOR_TYPE`.
    ReduceOp(sys::cudnnReduceTensorOp_t),
}

impl Value {
    /// The backend type, element count and address of the elements.
    fn typed(&self) -> (Type, i64, *const c_void) {
        fn of<T>(v: &T) -> *const c_void {
            v as *const T as *const c_void
        }
        match self {
            Value::Int64(v) => (Type::CUDNN_TYPE_INT64, v.len() as i64, v.as_ptr() as _),
            Value::DataType(d) => (Type::CUDNN_TYPE_DATA_TYPE, 1, of(d)),
            Value::ConvMode(m) => (Type::CUDNN_TYPE_CONVOLUTION_MODE, 1, of(m)),
            Value::HeurMode(m) => (Type::CUDNN_TYPE_HEUR_MODE, 1, of(m)),
            Value::Float(x) => (Type::CUDNN_TYPE_FLOAT, 1, of(x)),
            Value::Double(x) => (Type::CUDNN_TYPE_DOUBLE, 1, of(x)),
            Value::Descriptors(v) => (Type::CUDNN_TYPE_BACKEND_DESCRIPTOR, v.len() as i64, v.as_ptr() as _),
            Value::Handle(h) => (Type::CUDNN_TYPE_HANDLE, 1, of(h)),
            Value::Pointers(v) => (Type::CUDNN_TYPE_VOID_PTR, v.len() as i64, v.as_ptr() as _),
            Value::Bool(b) => (Type::CUDNN_TYPE_BOOLEAN, 1, of(b)),
            Value::PointwiseMode(m) => (Type::CUDNN_TYPE_POINTWISE_MODE, 1, of(m)),
            Value::ReduceOp(o) => (Type::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, of(o)),
        }
    }
}

/// The largest power of two (at most [`MAX_ALIGNMENT`]) dividing a device address.
pub(super) fn alignment(ptr: u64) -> i64 {
    if ptr == 0 {
        return MAX_ALIGNMENT;
    }
    ((ptr & ptr.wrapping_neg()) as i64).min(MAX_ALIGNMENT)
}

/// The attributes of the tensor descriptor of an operand: dims and strides (a unit height
/// inserted for a 1-d convolution), element type, unique id and the byte alignment its address
/// is known to have.
pub(super) fn tensor_attrs(
    uid: i64,
    dt: sys::cudnnDataType_t,
    shape: &[usize],
    strides: &[usize],
    align: i64,
) -> Vec<(Attr, Value)> {
    let (dims, strides) = four_d(shape, strides);
    let ints = |v: Vec<usize>| Value::Int64(v.into_iter().map(|x| x as i64).collect());
    vec![
        (Attr::CUDNN_ATTR_TENSOR_DATA_TYPE, Value::DataType(dt)),
        (Attr::CUDNN_ATTR_TENSOR_DIMENSIONS, ints(dims)),
        (Attr::CUDNN_ATTR_TENSOR_STRIDES, ints(strides)),
        (Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID, Value::Int64(vec![uid])),
        (Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, Value::Int64(vec![align])),
    ]
}

/// The attributes of the convolution descriptor of `call`: cross-correlation (as PyTorch's
/// convolution), symmetric padding, the compute type of `dtype` (f32 for f16 / bf16). Groups
/// are implied by the operands' channel counts.
pub(super) fn conv_attrs(call: &ConvCall, dtype: DType) -> Vec<(Attr, Value)> {
    let [pads, strides, dilations] = spatial_params(&call.geometry);
    let ints = |v: &[usize]| Value::Int64(v.iter().map(|&x| x as i64).collect());
    vec![
        (Attr::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, Value::Int64(vec![pads.len() as i64])),
        (Attr::CUDNN_ATTR_CONVOLUTION_COMP_TYPE, Value::DataType(compute_type(dtype))),
        (Attr::CUDNN_ATTR_CONVOLUTION_CONV_MODE, Value::ConvMode(sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION)),
        (Attr::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, ints(&pads)),
        (Attr::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, ints(&pads)),
        (Attr::CUDNN_ATTR_CONVOLUTION_DILATIONS, ints(&dilations)),
        (Attr::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, ints(&strides)),
    ]
}

/// The operation descriptor of a form and the attributes its operands fill.
#[derive(Debug, PartialEq)]
pub(super) struct OpRoles {
    /// The operation descriptor's type.
    pub kind: Kind,
    /// The attributes of the first operand, the second and the result (the convolution's
    /// `x, w, y`; `dy, w, dx`; `x, dy, dw`).
    pub operands: [Attr; 3],
    /// The convolution descriptor's attribute.
    pub conv: Attr,
    /// The scale of the result.
    pub alpha: Attr,
    /// The scale of the result's previous value (0: overwritten).
    pub beta: Attr,
}

/// The operation descriptor of `form` and its attributes.
pub(super) fn op_roles(form: &ConvForm) -> OpRoles {
    match form {
        ConvForm::Forward => OpRoles {
            kind: Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            operands: [
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
            ],
            conv: Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            alpha: Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            beta: Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
        },
        ConvForm::BackwardData { .. } => OpRoles {
            kind: Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
            operands: [
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
            ],
            conv: Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
            alpha: Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
            beta: Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
        },
        ConvForm::BackwardWeight { .. } => OpRoles {
            kind: Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
            operands: [
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
            ],
            conv: Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
            alpha: Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
            beta: Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
        },
    }
}

/// A scale (alpha, beta) in the type the compute type asks for: double for f64, else float.
pub(super) fn scale(dtype: DType, x: f64) -> Value {
    if dtype == DType::F64 {
        Value::Double(x)
    } else {
        Value::Float(x as f32)
    }
}

/// The numerical notes' names, short (`tensor_core`, `winograd`, ...), for the logs.
pub(super) fn note_names(notes: &[u32]) -> Vec<&'static str> {
    const NAMES: [&str; 9] = [
        "tensor_core",
        "down_convert_inputs",
        "reduced_precision_reduction",
        "fft",
        "nondeterministic",
        "winograd",
        "winograd_4x4",
        "winograd_6x6",
        "winograd_13x13",
    ];
    notes.iter().map(|&n| NAMES.get(n as usize).copied().unwrap_or("unknown")).collect()
}

/// Whether an engine with these numerical notes gives the same bits on every run (no sums in
/// an order that depends on timing, such as split reductions by atomics). Every cuDNN call
/// coil makes asks for it.
pub(super) fn repeatable(notes: &[u32]) -> std::result::Result<(), &'static str> {
    match notes.contains(&(Note::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC as u32)) {
        true => Err("nondeterministic"),
        false => Ok(()),
    }
}

/// Whether an engine with these numerical notes keeps coil's numerics for `dtype`: the same
/// bits on every run (no order of sums that depends on timing, such as split reductions by
/// atomics), f32 accumulation (no reduced-precision reduction), inputs not converted down, and
/// for f32 no tensor cores (TF32; coil's f32 products do not use it). `Err` names the note in
/// the way.
pub(super) fn allowed(notes: &[u32], dtype: DType) -> std::result::Result<(), &'static str> {
    let has = |n: Note| notes.contains(&(n as u32));
    repeatable(notes)?;
    if has(Note::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) {
        return Err("reduced-precision reduction");
    }
    if has(Note::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) {
        return Err("down-converted inputs");
    }
    if dtype == DType::F32 && has(Note::CUDNN_NUMERICAL_NOTE_TENSOR_CORE) {
        return Err("tensor cores (TF32) for f32");
    }
    Ok(())
}

/// The first `most` candidates `build` makes a plan of (`Ok((plan, workspace bytes))`) within
/// [`WORKSPACE_LIMIT`], trying them in order (at least one); else why each was passed over.
pub(super) fn fits<C, P>(
    candidates: impl IntoIterator<Item = C>,
    mut build: impl FnMut(C) -> std::result::Result<(P, usize), String>,
    most: usize,
) -> std::result::Result<Vec<(P, usize)>, Vec<String>> {
    let (mut found, mut why) = (Vec::new(), Vec::new());
    for (k, c) in candidates.into_iter().enumerate() {
        if found.len() >= most.max(1) {
            break;
        }
        match build(c) {
            Ok((plan, ws)) if ws <= WORKSPACE_LIMIT => found.push((plan, ws)),
            Ok((_, ws)) => why.push(format!("config {k}: workspace {ws} B over the limit")),
            Err(e) => why.push(format!("config {k}: {e}")),
        }
    }
    if !found.is_empty() {
        return Ok(found);
    }
    if why.is_empty() {
        why.push("heuristics returned no engine config".into());
    }
    Err(why)
}

/// A backend descriptor, destroyed with its owner.
pub(super) struct Descriptor {
    pub(super) raw: sys::cudnnBackendDescriptor_t,
    kind: Kind,
}

impl Descriptor {
    pub(super) fn new(kind: Kind) -> Result<Descriptor> {
        let mut raw: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: cuDNN writes the new descriptor's handle into `raw`.
        check(unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut raw) }, || {
            format!("cudnnBackendCreateDescriptor({kind:?})")
        })?;
        Ok(Descriptor { raw, kind })
    }

    pub(super) fn set(&self, name: Attr, value: &Value) -> Result<()> {
        let (ty, count, elements) = value.typed();
        // SAFETY: `elements` addresses `count` elements of `ty`, alive through the call (cuDNN
        // copies them).
        let status = unsafe { sys::cudnnBackendSetAttribute(self.raw, name, ty, count, elements) };
        check(status, || format!("cudnnBackendSetAttribute({:?}, {name:?})", self.kind))
    }

    pub(super) fn set_all(&self, attrs: &[(Attr, Value)]) -> Result<()> {
        attrs.iter().try_for_each(|(name, value)| self.set(*name, value))
    }

    pub(super) fn finalize(&self) -> Result<()> {
        // SAFETY: a descriptor made by `new`, its attributes set.
        check(unsafe { sys::cudnnBackendFinalize(self.raw) }, || format!("cudnnBackendFinalize({:?})", self.kind))
    }

    /// Reads up to `out.len()` elements of `ty` into `out`; the count cuDNN has.
    ///
    /// # Safety
    /// `out`'s elements must be of the C type `ty` names.
    unsafe fn get<T>(&self, name: Attr, ty: Type, out: &mut [T]) -> Result<usize> {
        let mut count: i64 = 0;
        let status = sys::cudnnBackendGetAttribute(
            self.raw,
            name,
            ty,
            out.len() as i64,
            &mut count,
            // No array when only the count is asked for.
            if out.is_empty() { std::ptr::null_mut() } else { out.as_mut_ptr() as *mut c_void },
        );
        check(status, || format!("cudnnBackendGetAttribute({:?}, {name:?})", self.kind))?;
        Ok(count.max(0) as usize)
    }
}

impl Drop for Descriptor {
    fn drop(&mut self) {
        // SAFETY: made by `new` and destroyed once, here. A failure leaks nothing coil can free.
        unsafe { sys::cudnnBackendDestroyDescriptor(self.raw) };
    }
}

fn check(status: sys::cudnnStatus_t, what: impl FnOnce() -> String) -> Result<()> {
    if status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::runtime(format!("cuDNN {} failed: {status:?}", what())))
    }
}

/// The execution plan of one call shape and the descriptors it was built from.
pub(super) struct GraphPlan {
    plan: Descriptor,
    /// Workspace bytes the plan needs.
    pub workspace: usize,
    /// The engine's global index (for the logs).
    pub engine: i64,
    /// The engine's numerical notes (`cudnnBackendNumericalNote_t` values, for the logs).
    pub notes: Vec<u32>,
    /// Further engine configs that fit, in the heuristics' order, where the caller asked for
    /// candidates to time ([`plan_ops`]' `most`).
    pub alternatives: Vec<Alternative>,
    /// The config runs use once chosen: 0 the first, `i` `alternatives[i - 1]`.
    pub chosen: std::sync::OnceLock<usize>,
    /// The operation graph, its operands and the heuristics' configs, kept as long as the plan.
    _parts: Vec<Descriptor>,
}

/// Another engine config's plan of the same graph ([`GraphPlan::alternatives`]).
pub(super) struct Alternative {
    plan: Descriptor,
    /// Workspace bytes the plan needs.
    pub workspace: usize,
    /// The engine's global index (for the logs).
    pub engine: i64,
}

impl GraphPlan {
    /// How many configs there are to choose from (the first and the alternatives).
    pub fn candidates(&self) -> usize {
        1 + self.alternatives.len()
    }

    /// The workspace bytes of config `i` (0: the first).
    pub fn workspace_of(&self, i: usize) -> usize {
        if i == 0 {
            self.workspace
        } else {
            self.alternatives[i - 1].workspace
        }
    }

    /// The engine of config `i` (0: the first).
    pub fn engine_of(&self, i: usize) -> i64 {
        if i == 0 {
            self.engine
        } else {
            self.alternatives[i - 1].engine
        }
    }

    fn descriptor(&self, i: usize) -> &Descriptor {
        if i == 0 {
            &self.plan
        } else {
            &self.alternatives[i - 1].plan
        }
    }
}

// SAFETY: a plan's descriptors are finalized when it is made and only read afterwards (each
// execution makes its own variant pack).
unsafe impl Send for GraphPlan {}
// SAFETY: as above.
unsafe impl Sync for GraphPlan {}

/// The descriptor of one operand, finalized.
fn tensor(uid: i64, dt: sys::cudnnDataType_t, view: (&[usize], &[usize]), align: i64) -> Result<Descriptor> {
    let d = Descriptor::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    d.set_all(&tensor_attrs(uid, dt, view.0, view.1, align))?;
    d.finalize()?;
    Ok(d)
}

/// Builds the plan of `call` (operands and result of `dtype`, their addresses aligned to
/// `aligns` bytes) on `handle`: an error names the backend call that failed, or says why no
/// engine config of the heuristics fits.
///
/// # Safety
/// `handle` is a live cuDNN handle, used by one thread at a time.
pub(super) unsafe fn make_graph_plan(
    handle: sys::cudnnHandle_t,
    call: &ConvCall,
    dtype: DType,
    aligns: [i64; 3],
) -> Result<GraphPlan> {
    let dt = data_type(dtype)?;
    let out_view =
        TensorView { buffer: call.a.buffer, offset: 0, shape: call.out.clone(), strides: call.out_strides.clone() };
    let views = [&call.a, &call.b, &out_view];
    let mut operands = Vec::new();
    for k in 0..3 {
        operands.push(tensor(UIDS[k], dt, (&views[k].shape, &views[k].strides), aligns[k])?);
    }
    let conv = Descriptor::new(Kind::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    conv.set_all(&conv_attrs(call, dtype))?;
    conv.finalize()?;

    let roles = op_roles(&call.form);
    let op = Descriptor::new(roles.kind)?;
    for (attr, d) in roles.operands.iter().zip(&operands) {
        op.set(*attr, &Value::Descriptors(vec![d.raw]))?;
    }
    op.set(roles.conv, &Value::Descriptors(vec![conv.raw]))?;
    op.set(roles.alpha, &scale(dtype, 1.0))?;
    op.set(roles.beta, &scale(dtype, 0.0))?;
    op.finalize()?;
    let mut parts = operands;
    parts.push(conv);
    plan_ops(handle, vec![op], parts, |notes| allowed(notes, dtype), 1)
}

/// The execution plan of the operation graph of `ops` (finalized; `parts`: the descriptors
/// they refer to, kept as long as the plan), with up to `most - 1` alternatives after it: the
/// engine configs of heuristics mode A in their order, the first (`most`) whose numerical notes
/// `allow` accepts and whose plan finalizes within
/// [`WORKSPACE_LIMIT`]; an error names the backend call that failed or says why no config fits.
///
/// # Safety
/// `handle` is a live cuDNN handle, used by one thread at a time.
pub(super) unsafe fn plan_ops(
    handle: sys::cudnnHandle_t,
    ops: Vec<Descriptor>,
    mut parts: Vec<Descriptor>,
    allow: impl Fn(&[u32]) -> std::result::Result<(), &'static str>,
    most: usize,
) -> Result<GraphPlan> {
    let graph = Descriptor::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set(Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, &Value::Handle(handle))?;
    graph.set(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, &Value::Descriptors(ops.iter().map(|o| o.raw).collect()))?;
    graph.finalize()?;

    let heur = Descriptor::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set(Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &Value::Descriptors(vec![graph.raw]))?;
    heur.set(Attr::CUDNN_ATTR_ENGINEHEUR_MODE, &Value::HeurMode(sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A))?;
    heur.finalize()?;
    // How many configs the heuristics have, then that many descriptors for them to fill.
    let results = Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS;
    let count = heur.get::<sys::cudnnBackendDescriptor_t>(results, Type::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut [])?;
    let configs: Vec<Descriptor> =
        (0..count).map(|_| Descriptor::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)).collect::<Result<_>>()?;
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = configs.iter().map(|c| c.raw).collect();
    let got = heur.get(results, Type::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut raw)?.min(configs.len());

    let found = fits(
        &configs[..got],
        |cfg| {
            let (plan, ws, engine) = config_plan(handle, cfg, &allow).map_err(|e| e.message)?;
            Ok(((plan, engine), ws))
        },
        most,
    );
    let mut found = found.map_err(|why| {
        Error::runtime(format!("no engine config of cuDNN's heuristics (mode A) fits: {}", why.join("; ")))
    })?;
    let ((plan, (engine, notes)), workspace) = found.remove(0);
    let alternatives =
        (found.into_iter()).map(|((plan, (engine, _)), workspace)| Alternative { plan, workspace, engine }).collect();
    parts.extend(ops);
    parts.extend([graph, heur]);
    parts.extend(configs);
    let chosen = std::sync::OnceLock::new();
    Ok(GraphPlan { plan, workspace, engine, notes, alternatives, chosen, _parts: parts })
}

/// The execution plan of one engine config, its workspace bytes, engine index and numerical
/// notes; an error
/// where the config's engine is not allowed for `dtype` or the plan does not finalize.
unsafe fn config_plan(
    handle: sys::cudnnHandle_t,
    cfg: &Descriptor,
    allow: &impl Fn(&[u32]) -> std::result::Result<(), &'static str>,
) -> Result<(Descriptor, usize, (i64, Vec<u32>))> {
    let engine = Descriptor::new(Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    let mut slot = [engine.raw];
    cfg.get(Attr::CUDNN_ATTR_ENGINECFG_ENGINE, Type::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut slot)?;
    let mut index = [0i64];
    engine.get(Attr::CUDNN_ATTR_ENGINE_GLOBAL_INDEX, Type::CUDNN_TYPE_INT64, &mut index)?;
    // Notes are C enums (32-bit): read them as u32, not as a Rust enum.
    let mut notes = [0u32; Note::CUDNN_NUMERICAL_NOTE_TYPE_COUNT as usize];
    let n = engine.get(Attr::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, Type::CUDNN_TYPE_NUMERICAL_NOTE, &mut notes)?;
    allow(&notes[..n.min(notes.len())]).map_err(|note| Error::runtime(format!("engine {}: {note}", index[0])))?;
    let plan = Descriptor::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set(Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, &Value::Handle(handle))?;
    plan.set(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &Value::Descriptors(vec![cfg.raw]))?;
    plan.finalize().map_err(|e| Error::runtime(format!("engine {}: {}", index[0], e.message)))?;
    let mut ws = [0i64];
    plan.get(Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, Type::CUDNN_TYPE_INT64, &mut ws)?;
    Ok((plan, ws[0].max(0) as usize, (index[0], notes[..n.min(notes.len())].to_vec())))
}

/// Enqueues `plan` on `handle`'s stream over the operands at `ptrs` (first, second, result)
/// and `workspace` (at least `plan.workspace` bytes).
///
/// # Safety
/// `handle` is live, bound to the stream the operands are ordered on; the addresses hold the
/// views the plan was built for, aligned as it was told.
pub(super) unsafe fn execute(
    handle: sys::cudnnHandle_t,
    plan: &GraphPlan,
    ptrs: [*mut c_void; 3],
    workspace: *mut c_void,
) -> Result<()> {
    execute_pack(handle, plan, &UIDS, &ptrs, workspace)
}

/// Enqueues `plan` on `handle`'s stream with the tensor of unique id `uids[i]` at `ptrs[i]`
/// (a device address, or for a by-value tensor the host address of its value) and
/// `workspace` (at least `plan.workspace` bytes).
///
/// # Safety
/// As [`execute`]; every non-virtual tensor of the plan's graph has its id in `uids`.
pub(super) unsafe fn execute_pack(
    handle: sys::cudnnHandle_t,
    plan: &GraphPlan,
    uids: &[i64],
    ptrs: &[*mut c_void],
    workspace: *mut c_void,
) -> Result<()> {
    // SAFETY: the caller's contract; the chosen config's workspace is the plan's (`run`s
    // allocate what the chosen config needs).
    unsafe { execute_config(handle, plan, plan.chosen.get().copied().unwrap_or(0), uids, ptrs, workspace) }
}

/// [`execute_pack`] with config `i` of `plan` (0: the first), whatever was chosen: for timing.
///
/// # Safety
/// As [`execute_pack`], the workspace at least `plan.workspace_of(i)` bytes.
pub(super) unsafe fn execute_config(
    handle: sys::cudnnHandle_t,
    plan: &GraphPlan,
    i: usize,
    uids: &[i64],
    ptrs: &[*mut c_void],
    workspace: *mut c_void,
) -> Result<()> {
    let pack = Descriptor::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    pack.set(Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, &Value::Int64(uids.to_vec()))?;
    pack.set(Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, &Value::Pointers(ptrs.to_vec()))?;
    pack.set(Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, &Value::Pointers(vec![workspace]))?;
    pack.finalize()?;
    check(sys::cudnnBackendExecute(handle, plan.descriptor(i).raw, pack.raw), || "cudnnBackendExecute".to_string())
}

#[cfg(test)]
#[path = "cudnn_graph_tests.rs"]
mod tests;
