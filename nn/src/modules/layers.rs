//! The basic layers: [`Linear`], [`Embedding`], [`LayerNorm`], [`RmsNorm`], [`Dropout`].

use crate::param::{Init, Mode, Param, Path};
use crate::Module;
use coil_frontend::Tensor;
use coil_ir::{DType, Result};

/// How a linear layer's weight is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `[out_features, in_features]`, as `nn.Linear` (`y = x W^T + b`).
    OutIn,
    /// `[in_features, out_features]`, as Hugging Face's `Conv1D` in GPT-2 (`y = x W + b`).
    InOut,
}

/// A linear layer `y = x W^T + b` (`nn.Linear`), or `x W + b` for the [`Layout::InOut`] layout.
/// Under a mixed-precision policy the product runs in its compute dtype.
///
/// ```
/// use coil_nn::{Linear, Module, ParamStore};
/// use coil_frontend::Tensor;
/// use coil_ir::DType;
/// let store = ParamStore::new();
/// let fc = Linear::new(&store.root(coil_runtime::Device::Cpu, DType::F32).pp("fc"), 4, 3, true)?;
/// assert_eq!(store.names(), vec!["fc.weight", "fc.bias"]);
/// let y = fc.forward(&Tensor::ones(&[2, 4], DType::F32))?;
/// assert_eq!(y.shape(), &[2, 3]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Linear {
    /// The weight, `[out, in]` or `[in, out]` as `layout` says.
    pub weight: Param,
    /// `[out]`, when the layer has a bias.
    pub bias: Option<Param>,
    /// How `weight` is laid out.
    pub layout: Layout,
    mode: Mode,
}

impl Linear {
    /// `nn.Linear(in_features, out_features, bias)` with PyTorch's initialization (uniform on
    /// `±1/sqrt(in_features)`); parameters `weight` `[out, in]` and `bias` `[out]`.
    #[track_caller]
    pub fn new(path: &Path, in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let init = Init::linear_default(in_features);
        Linear::with_init(path, in_features, out_features, bias, Layout::OutIn, init, init)
    }

    /// Hugging Face's `Conv1D(nf=out_features, nx=in_features)` (GPT-2's projections): weight
    /// `[in, out]` drawn from `N(0, 0.02)`, bias zeros.
    #[track_caller]
    pub fn conv1d(path: &Path, in_features: usize, out_features: usize) -> Result<Linear> {
        let init = Init::Normal { mean: 0.0, std: 0.02 };
        Linear::with_init(path, in_features, out_features, true, Layout::InOut, init, Init::Zeros)
    }

    /// A linear layer with every choice explicit.
    #[track_caller]
    pub fn with_init(
        path: &Path,
        in_features: usize,
        out_features: usize,
        bias: bool,
        layout: Layout,
        weight_init: Init,
        bias_init: Init,
    ) -> Result<Linear> {
        let shape = match layout {
            Layout::OutIn => [out_features, in_features],
            Layout::InOut => [in_features, out_features],
        };
        let weight = path.param("weight", &shape, weight_init)?;
        let bias = if bias { Some(path.param("bias", &[out_features], bias_init)?) } else { None };
        Ok(Linear { weight, bias, layout, mode: path.mode() })
    }
}

impl Module for Linear {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = self.mode.compute_dtype(x.dtype());
        let w = self.weight.tensor().to_dtype(dtype)?;
        let w = match self.layout {
            Layout::OutIn => w,
            // A transposed view: the product reads it with a layout flag, no copy.
            Layout::InOut => w.t()?,
        };
        let b = self.bias.as_ref().map(|b| b.tensor().to_dtype(dtype)).transpose()?;
        coil_frontend::linear(&x.to_dtype(dtype)?, &w, b.as_ref())
    }
}

/// A lookup table of `num` vectors of `dim` (`nn.Embedding`), initialized from `N(0, 1)`.
#[derive(Clone, Debug)]
pub struct Embedding {
    /// The table, `[num, dim]`.
    pub weight: Param,
}

impl Embedding {
    /// `nn.Embedding(num, dim)`: parameter `weight` `[num, dim]`.
    #[track_caller]
    pub fn new(path: &Path, num: usize, dim: usize) -> Result<Embedding> {
        Embedding::with_init(path, num, dim, Init::Normal { mean: 0.0, std: 1.0 })
    }

    /// An embedding table with another initialization (GPT-2 draws from `N(0, 0.02)`).
    #[track_caller]
    pub fn with_init(path: &Path, num: usize, dim: usize, init: Init) -> Result<Embedding> {
        Ok(Embedding { weight: path.param("weight", &[num, dim], init)? })
    }
}

impl Module for Embedding {
    /// The rows at `indices` (i64 or i32, any shape): shape `indices.shape + [dim]`.
    #[track_caller]
    fn forward(&self, indices: &Tensor) -> Result<Tensor> {
        coil_frontend::embedding(indices, &self.weight.tensor())
    }
}

/// Layer normalization over the last dim (`nn.LayerNorm(dim, eps)`), weight ones, bias zeros.
/// Under a mixed-precision policy it computes in f32 and returns f32, as autocast does.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// The scale, `[dim]`.
    pub weight: Param,
    /// The shift, `[dim]`, when the norm has one.
    pub bias: Option<Param>,
    /// Added to the variance.
    pub eps: f64,
    mode: Mode,
}

impl LayerNorm {
    /// `nn.LayerNorm(dim, eps)` with weight and bias.
    #[track_caller]
    pub fn new(path: &Path, dim: usize, eps: f64) -> Result<LayerNorm> {
        LayerNorm::with_bias(path, dim, eps, true)
    }

    /// `nn.LayerNorm(dim, eps, bias=bias)`.
    #[track_caller]
    pub fn with_bias(path: &Path, dim: usize, eps: f64, bias: bool) -> Result<LayerNorm> {
        let weight = path.param("weight", &[dim], Init::Ones)?;
        let bias = if bias { Some(path.param("bias", &[dim], Init::Zeros)?) } else { None };
        Ok(LayerNorm { weight, bias, eps, mode: path.mode() })
    }
}

impl Module for LayerNorm {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = upcast_under_autocast(&self.mode, x)?;
        let dim = x.shape().last().copied().unwrap_or(1);
        let b = self.bias.as_ref().map(|b| b.tensor());
        x.layer_norm(&[dim], Some(&self.weight.tensor()), b.as_ref(), self.eps)
    }
}

/// Root-mean-square normalization over the last dim (`nn.RMSNorm(dim, eps)`), weight ones.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// The scale, `[dim]`.
    pub weight: Param,
    /// `None`: the dtype's machine epsilon, as PyTorch.
    pub eps: Option<f64>,
    mode: Mode,
}

impl RmsNorm {
    /// `nn.RMSNorm(dim, eps)`: parameter `weight` `[dim]`.
    #[track_caller]
    pub fn new(path: &Path, dim: usize, eps: Option<f64>) -> Result<RmsNorm> {
        Ok(RmsNorm { weight: path.param("weight", &[dim], Init::Ones)?, eps, mode: path.mode() })
    }
}

impl Module for RmsNorm {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = upcast_under_autocast(&self.mode, x)?;
        let dim = x.shape().last().copied().unwrap_or(1);
        x.rms_norm(&[dim], Some(&self.weight.tensor()), self.eps)
    }
}

/// Autocast runs norms in f32: a half-precision input is upcast when a policy is set.
fn upcast_under_autocast(mode: &Mode, x: &Tensor) -> Result<Tensor> {
    let half = matches!(x.dtype(), DType::BF16 | DType::F16);
    if half && mode.precision().compute.is_some() {
        x.to_dtype(DType::F32)
    } else {
        Ok(x.clone())
    }
}

/// Inverted dropout with probability `p` in training mode; the identity in evaluation mode
/// ([`crate::ParamStore::eval`]).
#[derive(Clone, Debug)]
pub struct Dropout {
    /// The probability of zeroing an element.
    pub p: f64,
    mode: Mode,
}

impl Dropout {
    /// `nn.Dropout(p)`, in the mode of `path`'s store.
    pub fn new(path: &Path, p: f64) -> Dropout {
        Dropout { p, mode: path.mode() }
    }
}

impl Module for Dropout {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.dropout(self.p, self.mode.training())
    }
}
