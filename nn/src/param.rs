//! Named parameters: [`Param`], the [`ParamStore`] that owns a model's parameters by name, and
//! the [`Path`] modules are built from (a prefix into the store, a device and a dtype).
//!
//! A model is built by handing each module the path of its parameters, as candle's
//! `VarBuilder` does: `Linear::new(&path.pp("c_attn"), ...)` creates `h.0.attn.c_attn.weight`
//! in the store. So the store lists every parameter by its full name in creation order, loads
//! and saves them by name, and gives an optimizer what to update, with no derive macro and no
//! walk over the module tree.

use coil_frontend::Tensor;
use coil_ir::{DType, Error, ErrorKind, Result};
use coil_runtime::Device;
use indexmap::IndexMap;
use std::fmt;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

/// A model parameter: a name and the tensor that currently holds its value.
///
/// Cloning shares the parameter (a module and the store hold the same one). An optimizer step
/// replaces the value ([`Param::set`]); modules read the current one at each forward pass
/// ([`Param::tensor`]).
#[derive(Clone)]
pub struct Param(Arc<ParamInner>);

struct ParamInner {
    name: String,
    trainable: bool,
    value: RwLock<Tensor>,
    /// The store, to compute every parameter still pending (its initialization) in one graph.
    store: Weak<StoreInner>,
}

impl Param {
    /// The full name (`h.0.attn.c_attn.weight`).
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Whether an optimizer updates it ([`ParamStore::trainable`]).
    pub fn trainable(&self) -> bool {
        self.0.trainable
    }

    /// The current value. A parameter whose initialization is still pending is computed first,
    /// together with every other pending parameter of its store (one graph).
    pub fn tensor(&self) -> Tensor {
        let t = self.0.value.read().expect("parameter lock").clone();
        if !t.is_realized() {
            if let Some(store) = self.0.store.upgrade() {
                // An error here surfaces again, with its line, wherever the value is used.
                let _ = ParamStore(store).realize_pending();
            }
            return self.0.value.read().expect("parameter lock").clone();
        }
        t
    }

    /// Shape of the value.
    pub fn shape(&self) -> Vec<usize> {
        self.0.value.read().expect("parameter lock").shape().to_vec()
    }

    /// Dtype of the value.
    pub fn dtype(&self) -> DType {
        self.0.value.read().expect("parameter lock").dtype()
    }

    /// Device of the value.
    pub fn device(&self) -> Device {
        self.0.value.read().expect("parameter lock").device()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// Replaces the value with `value` of the same shape, dtype and device.
    #[track_caller]
    pub fn set(&self, value: Tensor) -> Result<()> {
        let mut slot = self.0.value.write().expect("parameter lock");
        if slot.meta() != value.meta() || slot.device() != value.device() {
            return Err(Error::new(
                ErrorKind::Shape,
                format!(
                    "parameter {} is {} on {}; the new value is {} on {}",
                    self.0.name,
                    slot.meta(),
                    slot.device(),
                    value.meta(),
                    value.device()
                ),
            )
            .in_op("Param::set", vec![])
            .at(Location::caller()));
        }
        *slot = value;
        Ok(())
    }
}

impl fmt::Debug for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.0.value.read().expect("parameter lock");
        write!(f, "Param({}, {}, {})", self.0.name, t.meta(), t.device())
    }
}

/// How a model computes: training or evaluation mode (dropout), and the mixed-precision policy.
/// Shared by the store and every module built from it, so one switch reaches them all.
#[derive(Clone, Debug)]
pub struct Mode(Arc<ModeInner>);

#[derive(Debug)]
struct ModeInner {
    training: AtomicBool,
    precision: RwLock<Precision>,
}

impl Mode {
    fn new() -> Mode {
        Mode(Arc::new(ModeInner { training: AtomicBool::new(true), precision: RwLock::new(Precision::default()) }))
    }

    /// Whether modules run in training mode (dropout active).
    pub fn training(&self) -> bool {
        self.0.training.load(Ordering::Relaxed)
    }

    /// The mixed-precision policy.
    pub fn precision(&self) -> Precision {
        *self.0.precision.read().expect("mode lock")
    }

    /// The dtype matrix products and attention compute in, given operands of `dtype`: the
    /// policy's compute dtype for floating operands, else `dtype` itself.
    pub fn compute_dtype(&self, dtype: DType) -> DType {
        match self.precision().compute {
            Some(c) if dtype.is_float() => c,
            _ => dtype,
        }
    }
}

/// The mixed-precision policy, as `torch.autocast` applies it: parameters keep their dtype;
/// matrix products (linear layers, the output projection) and attention cast their floating
/// operands to `compute` and produce it; norms, softmax and losses compute in f32.
///
/// ```
/// use coil_nn::{ParamStore, Precision};
/// use coil_ir::DType;
/// let store = ParamStore::new();
/// store.set_precision(Precision::autocast(DType::BF16));
/// assert_eq!(store.mode().compute_dtype(DType::F32), DType::BF16);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Precision {
    /// The dtype of matrix products and attention; `None`: the parameters' own.
    pub compute: Option<DType>,
}

impl Precision {
    /// Products and attention in `dtype` (bf16 or f16), everything else as the parameters.
    pub fn autocast(dtype: DType) -> Precision {
        Precision { compute: Some(dtype) }
    }
}

/// A model's parameters by full name, in creation order.
///
/// ```
/// use coil_nn::{Init, ParamStore};
/// use coil_ir::DType;
/// let store = ParamStore::new();
/// let root = store.root(coil_runtime::Device::Cpu, DType::F32);
/// let w = root.pp("layer").pp(0).param("weight", &[2, 3], Init::Ones)?;
/// assert_eq!(w.name(), "layer.0.weight");
/// assert_eq!(store.names(), vec!["layer.0.weight"]);
/// assert_eq!(w.tensor().to_vec::<f32>()?, vec![1.0; 6]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[derive(Clone)]
pub struct ParamStore(Arc<StoreInner>);

struct StoreInner {
    params: Mutex<IndexMap<String, Param>>,
    mode: Mode,
}

impl Default for ParamStore {
    fn default() -> ParamStore {
        ParamStore::new()
    }
}

impl ParamStore {
    /// An empty store, in training mode, with no mixed precision.
    pub fn new() -> ParamStore {
        ParamStore(Arc::new(StoreInner { params: Mutex::new(IndexMap::new()), mode: Mode::new() }))
    }

    /// The path at the root of the store: parameters made from it on `device` in `dtype`.
    pub fn root(&self, device: Device, dtype: DType) -> Path {
        Path { store: self.clone(), prefix: String::new(), device, dtype }
    }

    /// The mode shared by the modules built from this store.
    pub fn mode(&self) -> Mode {
        self.0.mode.clone()
    }

    /// Training mode (`model.train()`): dropout is active.
    pub fn train(&self) {
        self.0.mode.0.training.store(true, Ordering::Relaxed);
    }

    /// Evaluation mode (`model.eval()`): dropout is the identity.
    pub fn eval(&self) {
        self.0.mode.0.training.store(false, Ordering::Relaxed);
    }

    /// Sets the mixed-precision policy of every module built from this store.
    pub fn set_precision(&self, precision: Precision) {
        *self.0.mode.0.precision.write().expect("mode lock") = precision;
    }

    /// Every parameter, in creation order.
    pub fn params(&self) -> Vec<Param> {
        self.lock().values().cloned().collect()
    }

    /// The parameters an optimizer updates, in creation order.
    pub fn trainable(&self) -> Vec<Param> {
        self.lock().values().filter(|p| p.trainable()).cloned().collect()
    }

    /// The full names, in creation order.
    pub fn names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// The parameter called `name`.
    pub fn get(&self, name: &str) -> Option<Param> {
        self.lock().get(name).cloned()
    }

    /// Total number of elements of all parameters.
    pub fn num_elements(&self) -> usize {
        self.lock().values().map(Param::numel).sum()
    }

    /// Computes every parameter whose initialization is still pending, in one graph.
    #[track_caller]
    pub fn realize_pending(&self) -> Result<()> {
        let pending: Vec<Tensor> = self
            .lock()
            .values()
            .map(|p| p.0.value.read().expect("parameter lock").clone())
            .filter(|t| !t.is_realized())
            .collect();
        let refs: Vec<&Tensor> = pending.iter().collect();
        coil_frontend::realize(&refs)
    }

    /// Adds a parameter; an error if the name is taken.
    fn insert(
        &self,
        name: String,
        value: Tensor,
        trainable: bool,
        location: &'static Location<'static>,
    ) -> Result<Param> {
        let mut params = self.lock();
        if params.contains_key(&name) {
            return Err(Error::new(ErrorKind::Value, format!("a parameter named {name} already exists"))
                .in_op("Path::param", vec![])
                .at(location));
        }
        let param = Param(Arc::new(ParamInner {
            name: name.clone(),
            trainable,
            value: RwLock::new(value),
            store: Arc::downgrade(&self.0),
        }));
        params.insert(name, param.clone());
        Ok(param)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, IndexMap<String, Param>> {
        self.0.params.lock().expect("parameter store lock")
    }
}

/// Where a module's parameters go: a store, a name prefix, a device and a dtype (candle's
/// `VarBuilder`). [`Path::pp`] descends one level.
#[derive(Clone)]
pub struct Path {
    store: ParamStore,
    prefix: String,
    device: Device,
    dtype: DType,
}

impl Path {
    /// The path one level down: `h` then `0` gives `h.0.`.
    pub fn pp(&self, name: impl fmt::Display) -> Path {
        let prefix = if self.prefix.is_empty() { name.to_string() } else { format!("{}.{name}", self.prefix) };
        Path { prefix, ..self.clone() }
    }

    /// The full name of `leaf` here.
    pub fn name(&self, leaf: &str) -> String {
        if self.prefix.is_empty() {
            leaf.to_string()
        } else {
            format!("{}.{leaf}", self.prefix)
        }
    }

    /// The same path making parameters in `dtype`.
    pub fn with_dtype(&self, dtype: DType) -> Path {
        Path { dtype, ..self.clone() }
    }

    /// The device new parameters are made on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The dtype new parameters are made in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The store the parameters made here go into.
    pub fn store(&self) -> &ParamStore {
        &self.store
    }

    /// The mode of the store (training, precision).
    pub fn mode(&self) -> Mode {
        self.store.mode()
    }

    /// A new trainable parameter `leaf` of `shape`, initialized by `init` (computed with the
    /// store's other pending parameters when first used, [`Param::tensor`]).
    #[track_caller]
    pub fn param(&self, leaf: &str, shape: &[usize], init: Init) -> Result<Param> {
        let location = Location::caller();
        let value = init.tensor(shape, self.dtype, self.device).map_err(|e| e.at(location))?;
        self.store.insert(self.name(leaf), value, true, location)
    }

    /// A parameter an optimizer does not update (a buffer in PyTorch's terms), saved and loaded
    /// with the others.
    #[track_caller]
    pub fn frozen(&self, leaf: &str, shape: &[usize], init: Init) -> Result<Param> {
        let location = Location::caller();
        let value = init.tensor(shape, self.dtype, self.device).map_err(|e| e.at(location))?;
        self.store.insert(self.name(leaf), value, false, location)
    }
}

/// How a new parameter is initialized. The random ones draw from coil's Philox stream
/// (`coil::manual_seed`), so a model is reproducible on every device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// All zeros (`nn.init.zeros_`).
    Zeros,
    /// All ones (`nn.init.ones_`).
    Ones,
    /// Every element this value (`nn.init.constant_`).
    Const(f64),
    /// Normal with this mean and standard deviation (`nn.init.normal_`).
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation.
        std: f64,
    },
    /// Uniform on `[lo, hi)` (`nn.init.uniform_`).
    Uniform {
        /// The lower bound (included).
        lo: f64,
        /// The upper bound (excluded).
        hi: f64,
    },
}

impl Init {
    /// PyTorch's default for `nn.Linear`'s weight and bias: `kaiming_uniform_(a=sqrt(5))` on the
    /// weight is uniform on `±1/sqrt(fan_in)`, and the bias draws from the same range.
    pub fn linear_default(fan_in: usize) -> Init {
        let bound = if fan_in == 0 { 0.0 } else { 1.0 / (fan_in as f64).sqrt() };
        Init::Uniform { lo: -bound, hi: bound }
    }

    /// A pending tensor of `shape` with these values.
    #[track_caller]
    pub fn tensor(self, shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        let on = |t: Tensor| t.to_device(device);
        // Draw in f32 (f64 for f64 parameters), then round once to the parameter's dtype.
        let draw = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
        match self {
            Init::Zeros => on(Tensor::zeros(shape, dtype)),
            Init::Ones => on(Tensor::ones(shape, dtype)),
            Init::Const(v) => on(Tensor::full(shape, v, dtype)),
            Init::Normal { mean, std } => {
                let z = on(Tensor::randn(shape, draw)?)?;
                z.mul(std)?.add(mean)?.to_dtype(dtype)
            }
            Init::Uniform { lo, hi } => {
                let u = on(Tensor::rand(shape, draw)?)?;
                u.mul(hi - lo)?.add(lo)?.to_dtype(dtype)
            }
        }
    }
}
