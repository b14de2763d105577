//! The lazy [`Tensor`]: a node of a DAG that is only computed when a value is asked for.

use crate::dynamo::{BreakKind, HostRead};
use crate::realize;
use crate::storage::Storage;
use coil_ir::graph::check_shape;
use coil_ir::infer::{self, Operand};
use coil_ir::{DType, Error, Op, RandDist, RandomState, Result, Scalar, TensorMeta};
use coil_runtime::{Buffer, Device, Element};
use std::cell::{Cell, UnsafeCell};
use std::fmt;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// A lazily computed tensor.
///
/// Building a tensor from an op records a node; nothing runs until a value is needed
/// ([`Tensor::to_vec`], [`Tensor::item`], [`Tensor::realize`], `Display`). Then the pending
/// nodes that value depends on become one graph, which is decomposed and run.
///
/// Cloning a `Tensor` is cheap (it shares the node).
///
/// ```
/// use coil_frontend::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
/// let y = (&x * 2.0).exp().unwrap();      // recorded, not run
/// let v = y.to_vec::<f32>().unwrap();      // runs now
/// assert!((v[0] - 2f32.exp()).abs() < 1e-6);
/// ```
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorNode>);

/// The fields a capture reads of every node come first, in this order (`repr(C)`), so that a
/// walk over thousands of nodes touches two or three cache lines of each, not five.
#[repr(C)]
pub(crate) struct TensorNode {
    /// The operands ([`TensorNode::srcs`]); emptied once computed when no one can need them
    /// ([`crate::history`]).
    sources: UnsafeCell<Vec<Tensor>>,
    /// Set once the value is computed (or at creation for data).
    pub(crate) storage: OnceLock<Storage>,
    /// For a random op (`rand`, `randn`, `dropout`): where its numbers start in the thread's
    /// stream. Its op's `stream` and `offset` are placeholders (0) until capture makes them the
    /// graph's (a stream per key, offsets relative to the stream's start: `capture_walk`), so
    /// the graph's structure does not depend on them.
    pub(crate) draw: Option<RandomState>,
    pub(crate) meta: TensorMeta,
    pub(crate) op: Op,
    pub(crate) device: Device,
    pub(crate) location: Option<&'static Location<'static>>,
    /// Dims marked dynamic ([`Tensor::mark_dynamic`]), one bit per dim.
    pub(crate) dynamic: AtomicU64,
    /// Why this tensor cannot exist, for a creation function that returns a `Tensor`, not a
    /// `Result` ([`Tensor::full`] of a shape whose size overflows): the error, naming that call
    /// and its line, that every op using the tensor and every realize of it returns.
    pub(crate) invalid: Option<Box<Error>>,
    /// Whether the node is a view of its first operand ([`crate::alias`]).
    pub(crate) view: bool,
    /// The in-place write count ([`crate::alias::epoch`]) when the node was made: its operands
    /// were current then.
    pub(crate) epoch: u64,
    /// How many operand edges of live nodes point at this node ([`crate::history`]: a node
    /// with more owners than edges is held from outside the graph).
    pub(crate) consumers: AtomicUsize,
}

// SAFETY: `sources` is written only by `take_srcs`, whose callers exclude every reader (the
// history lock) and every other borrow, and by `Drop` (exclusive); the other fields are `Sync`.
unsafe impl Sync for TensorNode {}
// As before the operands could be released: a panic never leaves them half-written (they are
// replaced whole).
impl std::panic::RefUnwindSafe for TensorNode {}

/// Drops a node's sources without recursion: a loop that feeds each step's results to the next
/// (a decode loop outside a compiled function) builds a chain as long as the loop, and dropping
/// it recursively overflowed the stack after about a thousand steps.
impl Drop for TensorNode {
    fn drop(&mut self) {
        crate::history::died();
        let mut pending = std::mem::take(self.sources.get_mut());
        while let Some(t) = pending.pop() {
            t.0.consumers.fetch_sub(1, Ordering::AcqRel);
            // The last owner of a source takes its sources over, so that it drops with none.
            if let Ok(mut node) = Arc::try_unwrap(t.0) {
                pending.append(node.sources.get_mut());
            }
        }
    }
}

impl TensorNode {
    /// The operands, borrowed while `_held` keeps [`crate::history::release`] from taking
    /// any (the operands of a computed node that is not a view may be released).
    pub(crate) fn srcs<'b>(&'b self, _held: &'b crate::history::Read) -> &'b [Tensor] {
        // SAFETY: only `take_srcs` (under the history lock for writing, which excludes `_held`)
        // and `Drop` (which has `&mut self`) write the operands.
        unsafe { &*self.sources.get() }
    }

    /// The operands of a view node, which are never released (a view resolves against its
    /// base: [`crate::alias`]). Panics on a node that is not a view.
    pub(crate) fn view_srcs(&self) -> &[Tensor] {
        assert!(self.view, "the operands of a {} node that is not a view", self.op.name());
        // SAFETY: `history::release` never takes a view's operands, and only it (through
        // `take_srcs`) and `Drop` write them.
        unsafe { &*self.sources.get() }
    }

    /// The operands, for a walk whose borrows outlive any one guard's scope.
    ///
    /// # Safety
    /// The caller holds [`crate::history::read`] for as long as the returned borrow (or any
    /// borrow derived from it) is used: [`crate::walk::Walk`] keeps one for its lifetime.
    pub(crate) unsafe fn srcs_unchecked(&self) -> &[Tensor] {
        // SAFETY: the caller's contract excludes `take_srcs` meanwhile.
        unsafe { &*self.sources.get() }
    }

    /// Empties the operands, returning them (to drop).
    ///
    /// # Safety
    /// No borrow of this node's operands ([`TensorNode::srcs`]) may be alive, on any thread:
    /// the caller holds the history lock for writing and borrows none itself.
    pub(crate) unsafe fn take_srcs(&self) -> Vec<Tensor> {
        let srcs = std::mem::take(&mut *self.sources.get());
        for s in &srcs {
            s.0.consumers.fetch_sub(1, Ordering::AcqRel);
        }
        srcs
    }

    /// A pending node: no storage, no dims marked dynamic, no draw.
    fn pending(
        op: Op,
        srcs: Vec<Tensor>,
        meta: TensorMeta,
        device: Device,
        location: Option<&'static Location<'static>>,
    ) -> TensorNode {
        crate::history::born();
        for s in &srcs {
            s.0.consumers.fetch_add(1, Ordering::AcqRel);
        }
        TensorNode {
            op,
            sources: UnsafeCell::new(srcs),
            meta,
            device,
            location,
            storage: OnceLock::new(),
            dynamic: AtomicU64::new(0),
            draw: None,
            invalid: None,
            view: false,
            epoch: crate::alias::epoch(),
            consumers: AtomicUsize::new(0),
        }
    }
}

thread_local! {
    /// The random stream: the key and the next counter. Each random op takes `numel` counters.
    static RNG: Cell<RandomState> = const { Cell::new(RandomState { seed: 0, offset: 0 }) };
    /// Where creation functions (`zeros`, `full`, `arange`, `randn`, ...) put new tensors.
    static DEFAULT_DEVICE: Cell<Device> = const { Cell::new(Device::Cpu) };
}

/// Sets the device new tensors are created on by this thread (like `torch.set_default_device`);
/// the CPU unless set. Tensors made from data (`from_vec`) start on the CPU regardless.
pub fn set_default_device(device: Device) {
    DEFAULT_DEVICE.with(|d| d.set(device));
}

/// The device new tensors are created on by this thread.
pub fn default_device() -> Device {
    DEFAULT_DEVICE.with(|d| d.get())
}

/// Seeds the thread's random stream (like `torch.manual_seed`): the random ops recorded after
/// it draw the same numbers in every run, compiled or not, on every device.
pub fn manual_seed(seed: u64) {
    RNG.with(|r| r.set(RandomState { seed, offset: 0 }));
}

/// Where the thread's random stream stands (the key and the next counter).
pub(crate) fn random_state() -> RandomState {
    RNG.with(|r| r.get())
}

/// Moves the thread's random stream to `state` (a replayed compiled function takes the counters
/// its body would have taken).
pub(crate) fn set_random_state(state: RandomState) {
    RNG.with(|r| r.set(state));
}

/// Takes `n` counters from the random stream: returns where they start.
pub(crate) fn next_random(n: usize) -> RandomState {
    RNG.with(|r| {
        let start = r.get();
        r.set(start.advanced(n as u64));
        start
    })
}

impl Tensor {
    /// A pending leaf (constant, iota, random) on this thread's default device.
    fn leaf(op: Op, meta: TensorMeta, location: Option<&'static Location<'static>>) -> Tensor {
        Tensor::leaf_on(op, meta, default_device(), location)
    }

    /// A pending leaf on `device`.
    pub(crate) fn leaf_on(
        op: Op,
        meta: TensorMeta,
        device: Device,
        location: Option<&'static Location<'static>>,
    ) -> Tensor {
        Tensor(Arc::new(TensorNode::pending(op, vec![], meta, device, location)))
    }

    /// A pending `rand` / `randn` leaf on `device` whose numbers start at `draw`.
    pub(crate) fn random_leaf_on(
        dist: RandDist,
        meta: TensorMeta,
        device: Device,
        draw: RandomState,
        location: Option<&'static Location<'static>>,
    ) -> Tensor {
        let mut node = TensorNode::pending(Op::Rand { dist, stream: 0, offset: 0 }, vec![], meta, device, location);
        node.draw = Some(draw);
        Tensor(Arc::new(node))
    }

    /// A leaf of `op` of `shape`, or the error naming `name` at `location` when no tensor can
    /// have that shape ([`coil_ir::graph::check_shape`]).
    fn checked_leaf(
        op: Op,
        shape: &[usize],
        dtype: DType,
        name: &str,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        check_shape(shape).map_err(|e| e.in_op(name, vec![]).at(location))?;
        Ok(Tensor::leaf(op, TensorMeta::new(shape.to_vec(), dtype), Some(location)))
    }

    /// A new leaf that stands for `error` (see `TensorNode::invalid`), in place of this one.
    fn standing_for(self, error: Error) -> Tensor {
        let node = &self.0;
        let mut standing = TensorNode::pending(node.op.clone(), vec![], node.meta.clone(), node.device, node.location);
        standing.invalid = Some(Box::new(error));
        Tensor(Arc::new(standing))
    }

    /// The error this tensor stands for, if it could not be made (see `TensorNode::invalid`).
    pub(crate) fn invalid(&self) -> Option<&Error> {
        self.0.invalid.as_deref()
    }

    /// Makes dim `dim` of this tensor symbolic for compiled functions that take it as an
    /// argument (`torch._dynamo.mark_dynamic`): the first compile already serves every size of
    /// that dim (sizes 0 and 1 excepted: those are specialized), instead of waiting for a size to
    /// change. The mark stays with the tensor (and its clones).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32; 12], &[3, 4]).unwrap();
    /// x.mark_dynamic(0).unwrap();
    /// assert_eq!(x.dynamic_dims(), vec![0]);
    /// assert!(x.mark_dynamic(2).is_err());
    /// ```
    #[track_caller]
    pub fn mark_dynamic(&self, dim: usize) -> Result<()> {
        if dim >= self.meta().rank() || dim >= 64 {
            return Err(Error::shape(format!(
                "Dimension out of range (expected to be in range of [0, {}], but got {dim})",
                self.meta().rank().saturating_sub(1)
            ))
            .in_op("mark_dynamic", vec![self.meta().to_string()])
            .at(Location::caller()));
        }
        self.0.dynamic.fetch_or(1 << dim, Ordering::Relaxed);
        Ok(())
    }

    /// The dims marked with [`Tensor::mark_dynamic`], in increasing order.
    pub fn dynamic_dims(&self) -> Vec<usize> {
        let bits = self.0.dynamic.load(Ordering::Relaxed);
        (0..64).filter(|d| bits >> d & 1 == 1).collect()
    }

    /// A tensor holding a computed host buffer.
    pub fn from_buffer(buffer: Buffer) -> Tensor {
        Tensor::from_storage(Storage::host(Arc::new(buffer)))
    }

    /// A tensor holding computed elements, on the storage's device.
    pub fn from_storage(storage: Storage) -> Tensor {
        let node = TensorNode::pending(Op::Input { index: 0 }, vec![], storage.meta(), storage.device(), None);
        let _ = node.storage.set(storage);
        Tensor(Arc::new(node))
    }

    /// This tensor on `device`. Pending constants and random leaves are simply recorded on the
    /// new device; anything else is computed first and its elements copied.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_runtime::Device;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    /// assert_eq!(x.to_device(Device::Cpu).unwrap().device(), Device::Cpu);
    /// ```
    #[track_caller]
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        let current = self.current();
        if !Arc::ptr_eq(&current.0, &self.0) {
            return current.to_device(device);
        }
        if device == self.device() {
            return Ok(self.clone());
        }
        if self.0.op.is_leaf() && !self.is_realized() {
            let mut node = TensorNode::pending(self.0.op.clone(), vec![], self.meta().clone(), device, self.0.location);
            node.dynamic = AtomicU64::new(self.0.dynamic.load(Ordering::Relaxed));
            node.draw = self.0.draw;
            node.invalid = self.0.invalid.clone();
            return Ok(Tensor(Arc::new(node)));
        }
        // The caller's line, taken here: inside a closure `Location::caller()` is the closure's.
        let location = Location::caller();
        let storage = {
            let _read = HostRead::enter(BreakKind::ToDevice, Some(location));
            self.storage().map_err(|e| e.at(location))?
        };
        Ok(Tensor::from_storage(storage.to_device(device).map_err(|e| e.at(location))?))
    }

    /// A tensor from row-major data.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// assert!(Tensor::from_vec(vec![1i64, 2, 3], &[2, 2]).is_err());
    /// ```
    #[track_caller]
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        let location = Location::caller();
        check_shape(shape).map_err(|e| e.in_op("from_vec", vec![]).at(location))?;
        let n = coil_ir::graph::numel(shape);
        if data.len() != n {
            return Err(Error::shape(format!("{} values do not fill shape {shape:?} ({n} elements)", data.len()))
                .in_op("from_vec", vec![])
                .at(location));
        }
        Ok(Tensor::from_buffer(Buffer::from_vec(data, shape.to_vec())))
    }

    /// A tensor from a slice, copied.
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape)
    }

    /// A 0-d tensor holding one value.
    pub fn scalar<T: Element>(value: T) -> Tensor {
        Tensor::from_buffer(Buffer::from_vec(vec![value], vec![]))
    }

    /// A Rust scalar as an operand: weak in type promotion (`i32_tensor * 2.5` is f32, `f16_tensor * 2.5` f16).
    #[track_caller]
    pub(crate) fn weak_scalar(value: Scalar) -> Tensor {
        Tensor::leaf(Op::Scalar(value), TensorMeta::new(vec![], value.dtype()), Some(Location::caller()))
    }

    /// A tensor filled with `value`.
    ///
    /// A shape no tensor can have (its size overflows: `&[usize::MAX, 2]`) gives a tensor that
    /// stands for the error, named `full` at the caller's line: every op that uses it and every
    /// realize of it returns that error.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::full(&[usize::MAX, 2], 0.0, DType::F32);
    /// let e = x.sum_all().unwrap_err();
    /// assert_eq!(e.op.as_deref(), Some("full"));
    /// assert!(e.to_string().contains(file!()));
    /// ```
    #[track_caller]
    pub fn full(shape: &[usize], value: impl Into<Scalar>, dtype: DType) -> Tensor {
        let location = Location::caller();
        let t = Tensor::leaf(Op::Full(value.into()), TensorMeta::new(shape.to_vec(), dtype), Some(location));
        match check_shape(shape) {
            Ok(()) => t,
            Err(e) => t.standing_for(e.in_op("full", vec![]).at(location)),
        }
    }

    /// A tensor of zeros (`torch.zeros`).
    #[track_caller]
    pub fn zeros(shape: &[usize], dtype: DType) -> Tensor {
        Tensor::full(shape, 0, dtype)
    }

    /// A tensor of ones (`torch.ones`).
    #[track_caller]
    pub fn ones(shape: &[usize], dtype: DType) -> Tensor {
        Tensor::full(shape, 1, dtype)
    }

    /// Zeros of this tensor's shape and dtype, on its device (`torch.zeros_like`).
    #[track_caller]
    pub fn zeros_like(&self) -> Tensor {
        self.full_like(0)
    }

    /// Ones of this tensor's shape and dtype, on its device (`torch.ones_like`).
    #[track_caller]
    pub fn ones_like(&self) -> Tensor {
        self.full_like(1)
    }

    /// `value` in this tensor's shape and dtype, on its device (`torch.full_like`).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::from_vec(vec![1.5f64, 2.5], &[2]).unwrap();
    /// let y = x.full_like(7);
    /// assert_eq!((y.dtype(), y.device()), (DType::F64, x.device()));
    /// assert_eq!(y.to_vec::<f64>().unwrap(), vec![7.0, 7.0]);
    /// ```
    #[track_caller]
    pub fn full_like(&self, value: impl Into<Scalar>) -> Tensor {
        let meta = TensorMeta::new(self.shape().to_vec(), self.dtype());
        Tensor::leaf_on(Op::Full(value.into()), meta, self.device(), Some(Location::caller()))
    }

    /// i64 tensor of `shape` whose value is each element's index along `dim`.
    #[track_caller]
    pub fn iota(shape: &[usize], dim: usize) -> Result<Tensor> {
        if dim >= shape.len() {
            return Err(Error::shape(format!("dim {dim} is out of range for shape {shape:?}"))
                .in_op("iota", vec![])
                .at(Location::caller()));
        }
        Tensor::checked_leaf(Op::Iota { dim }, shape, DType::I64, "iota", Location::caller())
    }

    /// Uniform random numbers in `[0, 1)` from the thread's Philox stream ([`manual_seed`]).
    #[track_caller]
    pub fn rand(shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::random(shape, dtype, RandDist::Uniform, default_device())
    }

    /// Standard normal random numbers from the thread's Philox stream ([`manual_seed`]).
    #[track_caller]
    pub fn randn(shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::random(shape, dtype, RandDist::Normal, default_device())
    }

    /// Uniform random numbers of this tensor's shape and dtype, on its device
    /// (`torch.rand_like`); an error for a dtype that is not floating.
    #[track_caller]
    pub fn rand_like(&self) -> Result<Tensor> {
        Tensor::random(self.shape(), self.dtype(), RandDist::Uniform, self.device())
    }

    /// Standard normal random numbers of this tensor's shape and dtype, on its device
    /// (`torch.randn_like`); an error for a dtype that is not floating.
    #[track_caller]
    pub fn randn_like(&self) -> Result<Tensor> {
        Tensor::random(self.shape(), self.dtype(), RandDist::Normal, self.device())
    }

    /// A random leaf on `device` drawing the thread stream's next `numel` counters.
    #[track_caller]
    pub(crate) fn random(shape: &[usize], dtype: DType, dist: RandDist, device: Device) -> Result<Tensor> {
        let name = if dist == RandDist::Uniform { "rand" } else { "randn" };
        if !dtype.is_float() {
            return Err(Error::dtype(format!("{name} expects a floating dtype, got {dtype}"))
                .in_op(name, vec![])
                .at(Location::caller()));
        }
        let location = Location::caller();
        check_shape(shape).map_err(|e| e.in_op(name, vec![]).at(location))?;
        let draw = next_random(coil_ir::graph::numel(shape));
        let meta = TensorMeta::new(shape.to_vec(), dtype);
        Ok(Tensor::random_leaf_on(dist, meta, device, draw, Some(location)))
    }

    /// Records `op` applied to `srcs`: infers the meta, and on error names the op, the operands
    /// and the caller's line. Rust scalars take the device of the tensors they meet.
    pub(crate) fn record(op: Op, srcs: &[&Tensor], location: &'static Location<'static>) -> Result<Tensor> {
        Tensor::record_drawing(op, srcs, None, location)
    }

    /// A pending node of `op` on `srcs` (all on `device`) whose meta is known: inferred when
    /// the graph it comes from was built. Records without checking or inferring again.
    pub(crate) fn recorded(
        op: Op,
        srcs: Vec<Tensor>,
        meta: TensorMeta,
        device: Device,
        location: &'static Location<'static>,
    ) -> Tensor {
        Tensor::recorded_drawing(op, srcs, meta, device, location, None)
    }

    /// [`Tensor::recorded`] of a random op (attention with dropout, or its gradient, which
    /// draws the forward's numbers again) whose numbers start at `draw`.
    pub(crate) fn recorded_drawing(
        op: Op,
        srcs: Vec<Tensor>,
        meta: TensorMeta,
        device: Device,
        location: &'static Location<'static>,
        draw: Option<RandomState>,
    ) -> Tensor {
        let mut node = TensorNode::pending(op, srcs, meta, device, Some(location));
        node.draw = draw;
        Tensor(Arc::new(node))
    }

    /// [`Tensor::record`] of a random op (`dropout`) whose numbers start at `draw`.
    pub(crate) fn record_drawing(
        op: Op,
        srcs: &[&Tensor],
        draw: Option<RandomState>,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        if let Some(e) = srcs.iter().find_map(|t| t.invalid()) {
            return Err(e.clone());
        }
        // Each operand as it is now: a view of a base written in place since reads the new value.
        let now = crate::alias::epoch();
        if srcs.iter().any(|t| t.0.epoch != now) {
            let current: Vec<Tensor> = srcs.iter().map(|t| t.current()).collect();
            if current.iter().zip(srcs).any(|(c, s)| !Arc::ptr_eq(&c.0, &s.0)) {
                let refs: Vec<&Tensor> = current.iter().collect();
                return Tensor::record_drawing(op, &refs, draw, location);
            }
        }
        // Inside a composite op, its nodes and errors carry its name and its caller's line.
        let location = crate::ops::composite::location().unwrap_or(location);
        let describe = || srcs.iter().map(|t| t.meta().to_string()).collect::<Vec<_>>();
        let tensors = || srcs.iter().filter(|t| !t.is_weak_scalar());
        // (Only weak scalars: where they are, as a composite op places them beside its tensor.)
        let device = tensors().next().or(srcs.first()).map_or(Device::Cpu, |t| t.device());
        if let Some(other) = tensors().find(|t| t.device() != device) {
            return Err(crate::ops::composite::attribute(
                Error::new(
                    coil_ir::ErrorKind::Device,
                    format!("expected all tensors on one device, found {device} and {}", other.device()),
                )
                .in_op(op.name(), describe())
                .at(location),
            ));
        }
        let operands: Vec<Operand> =
            srcs.iter().map(|t| Operand { meta: &t.0.meta, scalar: t.is_weak_scalar() }).collect();
        let meta = infer::infer(&op, &operands)
            .map_err(|e| crate::ops::composite::attribute(e.in_op(op.name(), describe()).at(location)))?;
        let view = crate::alias::makes_view(&op, srcs.first().copied());
        let srcs = srcs.iter().map(|&t| if t.is_weak_scalar() { t.to_device(device) } else { Ok(t.clone()) });
        let mut node = TensorNode::pending(op, srcs.collect::<Result<Vec<_>>>()?, meta, device, Some(location));
        node.draw = draw;
        node.view = view;
        let node = Arc::new(node);
        if !view && !crate::dynamo::tracing() {
            // Outside a compiled function, a write over computed elements must know what still
            // reads them ([`crate::alias`]).
            let held = crate::history::read();
            for src in node.srcs(&held) {
                let mut base = src;
                while base.0.view {
                    base = &base.0.view_srcs()[0];
                }
                if let Some(storage) = base.0.storage.get() {
                    storage.add_reader(&node);
                }
            }
        }
        Ok(Tensor(node))
    }

    /// An error in `op` on this tensor's operands, at the caller's line.
    pub(crate) fn error(op: &str, srcs: &[&Tensor], e: Error, location: &'static Location<'static>) -> Error {
        let e = e.in_op(op, srcs.iter().map(|t| t.meta().to_string()).collect()).at(location);
        crate::ops::composite::attribute(e)
    }

    pub(crate) fn is_weak_scalar(&self) -> bool {
        matches!(self.0.op, Op::Scalar(_))
    }

    /// The shape and dtype.
    pub fn meta(&self) -> &TensorMeta {
        &self.0.meta
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.0.meta.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.meta.dtype
    }

    /// The number of dims.
    pub fn rank(&self) -> usize {
        self.0.meta.shape.len()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.0.meta.numel()
    }

    /// The device the tensor lives on (where its graph runs).
    pub fn device(&self) -> Device {
        self.0.device
    }

    /// Size of one dim; negative dims count from the end.
    #[track_caller]
    pub fn size(&self, dim: i64) -> Result<usize> {
        let d = self.dim(dim, "size", Location::caller())?;
        Ok(self.shape()[d])
    }

    /// Wraps a possibly negative dim into `0..rank` (a 0-d tensor accepts 0 and -1).
    pub(crate) fn dim(&self, dim: i64, op: &str, location: &'static Location<'static>) -> Result<usize> {
        wrap_dim(dim, self.rank()).map_err(|e| Tensor::error(op, &[self], e, location))
    }

    /// Wraps a list of dims; an empty list means every dim.
    pub(crate) fn dims(&self, dims: &[i64], op: &str, location: &'static Location<'static>) -> Result<Vec<usize>> {
        if dims.is_empty() {
            return Ok((0..self.rank()).collect());
        }
        let mut out = Vec::with_capacity(dims.len());
        for &d in dims {
            let d = self.dim(d, op, location)?;
            if self.rank() == 0 {
                continue; // a 0-d tensor reduces over no dims
            }
            if out.contains(&d) {
                return Err(Tensor::error(
                    op,
                    &[self],
                    Error::shape(format!("dim {d} appears more than once in {dims:?}")),
                    location,
                ));
            }
            out.push(d);
        }
        Ok(out)
    }

    /// Whether the value has been computed.
    pub fn is_realized(&self) -> bool {
        self.0.storage.get().is_some()
    }

    /// Computes the value (and every pending value it needs) now. On a GPU the kernels are
    /// enqueued and this returns without waiting for them: a data error one of them finds
    /// (an index out of bounds) surfaces at the next synchronization point ([`crate::synchronize`],
    /// a host read such as [`Tensor::to_vec`]), with this line.
    #[track_caller]
    pub fn realize(&self) -> Result<()> {
        let location = Location::caller();
        let _read = HostRead::enter(BreakKind::Realize, Some(location));
        realize::realize(&[&self.current()]).map_err(|e| e.at(location))
    }

    /// The computed elements on the tensor's device, realizing first.
    #[track_caller]
    pub fn storage(&self) -> Result<Storage> {
        let _read = HostRead::enter(BreakKind::Storage, Some(Location::caller()));
        let current = self.current();
        current.realize()?;
        Ok(current.0.storage.get().expect("realized").clone())
    }

    /// The computed elements in host memory (copied from the device for a CUDA tensor).
    #[track_caller]
    pub fn buffer(&self) -> Result<Arc<Buffer>> {
        let location = Location::caller();
        let _read = HostRead::enter(BreakKind::Buffer, Some(location));
        self.storage()?.to_host().map_err(|e| e.at(location))
    }

    /// The elements in row-major order, converted to `T` as a cast would.
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let _read = HostRead::enter(BreakKind::ToVec, Some(Location::caller()));
        Ok(self.buffer()?.to_vec())
    }

    /// The value of a one-element tensor.
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Tensor::error(
                "item",
                &[self],
                Error::shape(format!("a tensor with {} elements cannot be converted to a scalar", self.numel())),
                Location::caller(),
            ));
        }
        let _read = HostRead::enter(BreakKind::Item, Some(Location::caller()));
        Ok(self.to_vec::<T>()?[0])
    }

    /// Applies arbitrary Rust code to the computed elements (in host memory) and returns its
    /// result as a tensor on this tensor's device. The code is opaque to the compiler: inside a
    /// compiled function this is a graph break (prefer tensor ops).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_runtime::Buffer;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
    /// let r = x.map_host(|b| Ok(Buffer::from_vec(b.to_vec::<f32>().into_iter().rev().collect(), b.meta().shape))).unwrap();
    /// assert_eq!(r.to_vec::<f32>().unwrap(), vec![3.0, 2.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn map_host(&self, f: impl Fn(&Buffer) -> Result<Buffer>) -> Result<Tensor> {
        let location = Location::caller();
        let input = {
            let _read = HostRead::enter(BreakKind::MapHost, Some(location));
            self.buffer()?
        };
        let output = f(&input).map_err(|e| Tensor::error("map_host", &[self], e, location))?;
        Tensor::from_buffer(output).to_device(self.device())
    }
}

/// Wraps a possibly negative dim into `0..rank` (a 0-d tensor accepts 0 and -1).
pub fn wrap_dim(dim: i64, rank: usize) -> Result<usize> {
    let r = rank.max(1) as i64;
    if dim < -r || dim >= r {
        return Err(Error::shape(format!(
            "dim {dim} is out of range for a tensor of rank {rank} (expected in [{}, {}])",
            -r,
            r - 1
        )));
    }
    Ok(if dim < 0 { (dim + r) as usize } else { dim as usize })
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({}, {}, {})",
            self.meta(),
            self.device(),
            if self.is_realized() { "realized" } else { "lazy" }
        )
    }
}

impl fmt::Display for Tensor {
    /// Realizes and prints the values, nested by dims, like PyTorch.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The formatting machinery hides the caller: a graph break here names the line that
        // computed the printed tensor.
        let read = HostRead::enter(BreakKind::Display, self.0.location);
        let buffer = self.buffer();
        drop(read);
        let buffer = match buffer {
            Ok(b) => b,
            Err(e) => return write!(f, "<error: {e}>"),
        };
        let text: Vec<String> = if self.dtype().is_float() {
            let values = buffer.to_vec::<f64>();
            let scientific = needs_scientific(&values);
            values.iter().map(|&x| format_float(x, scientific)).collect()
        } else if self.dtype() == DType::Bool {
            buffer.to_vec::<bool>().iter().map(|x| x.to_string()).collect()
        } else {
            buffer.to_vec::<i64>().iter().map(|x| x.to_string()).collect()
        };
        let width = text.iter().map(|s| s.len()).max().unwrap_or(0);
        f.write_str("tensor(")?;
        write_nested(f, self.shape(), &text, width, 7)?;
        write!(f, ", dtype={})", self.dtype())
    }
}

/// PyTorch's rule: one format for the whole tensor; scientific when the finite magnitudes span
/// more than 1e3, or reach 1e8, or fall below 1e-4.
fn needs_scientific(values: &[f64]) -> bool {
    let mags: Vec<f64> = values.iter().map(|x| x.abs()).filter(|&x| x.is_finite() && x != 0.0).collect();
    let (lo, hi) = mags.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    !mags.is_empty() && (hi / lo > 1e3 || hi >= 1e8 || lo < 1e-4)
}

fn format_float(x: f64, scientific: bool) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        (if x > 0.0 { "inf" } else { "-inf" }).into()
    } else if scientific {
        format!("{x:.4e}")
    } else {
        format!("{x:.4}")
    }
}

fn write_nested(
    f: &mut fmt::Formatter<'_>,
    shape: &[usize],
    text: &[String],
    width: usize,
    indent: usize,
) -> fmt::Result {
    if shape.is_empty() {
        return f.write_str(&text[0]);
    }
    f.write_str("[")?;
    let inner: usize = shape[1..].iter().product();
    for i in 0..shape[0] {
        if i > 0 {
            if shape.len() == 1 {
                f.write_str(", ")?;
            } else {
                write!(f, ",{}{:indent$}", "\n".repeat(shape.len() - 1), "", indent = indent + 1)?;
            }
        }
        if shape.len() == 1 {
            write!(f, "{:>width$}", text[i])?;
        } else {
            write_nested(f, &shape[1..], &text[i * inner..(i + 1) * inner], width, indent + 1)?;
        }
    }
    f.write_str("]")
}
