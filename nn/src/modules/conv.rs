//! Convolution layers (`nn.Conv1d`, `nn.Conv2d`) over [`coil_frontend::ops::conv`].

use crate::param::{Init, Mode, Param, Path};
use crate::Module;
use coil_frontend::ops::conv::ConvOptions;
use coil_frontend::Tensor;
use coil_ir::Result;

/// `nn.Conv2d(in, out, kernel, stride, padding, dilation, groups, bias)` with PyTorch's
/// initialization (uniform on `±1/sqrt(in / groups * kh * kw)`); parameters `weight`
/// `[out, in / groups, kh, kw]` and `bias` `[out]`. Computes in the mixed-precision policy's
/// dtype, as [`crate::Linear`] does.
///
/// ```
/// use coil_nn::{Conv2d, Module, ParamStore};
/// use coil_frontend::{ops::conv::ConvOptions, Tensor};
/// # fn main() -> coil_ir::Result<()> {
/// let store = ParamStore::new();
/// let conv = Conv2d::new(&store.root(coil_runtime::Device::Cpu, coil_ir::DType::F32), 3, 8, [3, 3],
///     ConvOptions { padding: [1, 1], ..Default::default() }, true)?;
/// let y = conv.forward(&Tensor::zeros(&[2, 3, 16, 16], coil_ir::DType::F32))?;
/// assert_eq!(y.shape(), &[2, 8, 16, 16]);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Conv2d {
    /// `[out, in / groups, kh, kw]`.
    pub weight: Param,
    /// `[out]`, when the layer has a bias.
    pub bias: Option<Param>,
    /// Stride, padding, dilation and groups.
    pub options: ConvOptions<2>,
    mode: Mode,
}

impl Conv2d {
    /// `nn.Conv2d(in_channels, out_channels, kernel, ...)`: parameters `weight` and (with `bias`)
    /// `bias` under `path`.
    #[track_caller]
    pub fn new(
        path: &Path,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        options: ConvOptions<2>,
        bias: bool,
    ) -> Result<Conv2d> {
        let fan_in = in_channels / options.groups.max(1) * kernel[0] * kernel[1];
        let init = Init::linear_default(fan_in);
        Conv2d::with_init(path, in_channels, out_channels, kernel, options, bias.then_some(init), init)
    }

    /// A convolution whose weight is drawn from `weight_init`, with a bias drawn from
    /// `bias_init` where one is given (torchvision's ResNet: no bias, weights from
    /// `kaiming_normal_(mode="fan_out")`).
    #[track_caller]
    pub fn with_init(
        path: &Path,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        options: ConvOptions<2>,
        bias_init: Option<Init>,
        weight_init: Init,
    ) -> Result<Conv2d> {
        let shape = [out_channels, in_channels / options.groups.max(1), kernel[0], kernel[1]];
        let weight = path.param("weight", &shape, weight_init)?;
        let bias = bias_init.map(|init| path.param("bias", &[out_channels], init)).transpose()?;
        Ok(Conv2d { weight, bias, options, mode: path.mode() })
    }
}

impl Module for Conv2d {
    /// `[N, in, H, W]` to `[N, out, H', W']`.
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = self.mode.compute_dtype(x.dtype());
        let w = self.weight.tensor().to_dtype(dtype)?;
        let b = self.bias.as_ref().map(|b| b.tensor().to_dtype(dtype)).transpose()?;
        x.to_dtype(dtype)?.conv2d(&w, b.as_ref(), self.options)
    }
}

impl Conv2d {
    /// [`Module::forward`] on channels-last activations: `[N, H, W, in]` to `[N, H', W', out]`
    /// (the same values, permuted). The convolution reads its input in place and, on CUDA,
    /// writes its result channels-last directly, so a network that keeps its activations so
    /// (PyTorch's `channels_last` memory format) never transposes one.
    ///
    /// ```
    /// use coil_nn::{Conv2d, Module, ParamStore};
    /// use coil_frontend::{ops::conv::ConvOptions, Tensor};
    /// # fn main() -> coil_ir::Result<()> {
    /// let store = ParamStore::new();
    /// let conv = Conv2d::new(&store.root(coil_runtime::Device::Cpu, coil_ir::DType::F32), 3, 8, [3, 3],
    ///     ConvOptions::default(), true)?;
    /// let x = Tensor::randn(&[2, 3, 6, 6], coil_ir::DType::F32)?;
    /// let y = conv.forward_channels_last(&x.permute(&[0, 2, 3, 1])?)?;
    /// assert_eq!(y.shape(), &[2, 4, 4, 8]);
    /// let want = conv.forward(&x)?.permute(&[0, 2, 3, 1])?;
    /// assert!(y.sub(&want)?.abs()?.max_all()?.item::<f32>()? < 1e-5);
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn forward_channels_last(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = self.mode.compute_dtype(x.dtype());
        // The weight cast to the compute dtype is written channels-last too (`[O, kh, kw, C]`),
        // as cuDNN's fast channels-last kernels want their filter.
        let w = self.weight.tensor().permute(&[0, 2, 3, 1])?.to_dtype(dtype)?.permute(&[0, 3, 1, 2])?;
        let b = self.bias.as_ref().map(|b| b.tensor().to_dtype(dtype)).transpose()?;
        // Cast in the channels-last layout, then viewed as [N, C, H, W].
        let x = x.to_dtype(dtype)?.permute(&[0, 3, 1, 2])?;
        x.conv2d(&w, b.as_ref(), self.options)?.permute(&[0, 2, 3, 1])
    }
}

/// `nn.Conv1d(in, out, kernel, ...)`: [`Conv2d`]'s rules over `[N, in, L]`; parameters `weight`
/// `[out, in / groups, k]` and `bias` `[out]`.
#[derive(Clone, Debug)]
pub struct Conv1d {
    /// `[out, in / groups, k]`.
    pub weight: Param,
    /// `[out]`, when the layer has a bias.
    pub bias: Option<Param>,
    /// Stride, padding, dilation and groups.
    pub options: ConvOptions<1>,
    mode: Mode,
}

impl Conv1d {
    /// `nn.Conv1d(in_channels, out_channels, kernel, ...)`: parameters `weight` and (with `bias`)
    /// `bias` under `path`.
    #[track_caller]
    pub fn new(
        path: &Path,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        options: ConvOptions<1>,
        bias: bool,
    ) -> Result<Conv1d> {
        let init = Init::linear_default(in_channels / options.groups.max(1) * kernel);
        let weight = path.param("weight", &[out_channels, in_channels / options.groups.max(1), kernel], init)?;
        let bias = if bias { Some(path.param("bias", &[out_channels], init)?) } else { None };
        Ok(Conv1d { weight, bias, options, mode: path.mode() })
    }
}

impl Module for Conv1d {
    /// `[N, in, L]` to `[N, out, L']`.
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = self.mode.compute_dtype(x.dtype());
        let w = self.weight.tensor().to_dtype(dtype)?;
        let b = self.bias.as_ref().map(|b| b.tensor().to_dtype(dtype)).transpose()?;
        x.to_dtype(dtype)?.conv1d(&w, b.as_ref(), self.options)
    }
}
