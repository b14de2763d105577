//! ResNet with bottleneck blocks (He et al. 2016) as torchvision writes it (`resnet50`, the
//! "v1.5" variant: a block's stride on its 3x3 convolution), with torchvision's parameter names
//! (`conv1.weight`, `bn1.running_mean`, `layer1.0.conv2.weight`, `layer1.0.downsample.0.weight`,
//! `fc.bias`, ...), so a `state_dict` saved as safetensors loads by name ([`crate::io`]).

use crate::modules::conv::Conv2d;
use crate::modules::layers::Linear;
use crate::modules::norm::{BatchNorm2d, BatchNormConfig};
use crate::param::{Init, Path};
use crate::Module;
use coil_frontend::ops::conv::ConvOptions;
use coil_frontend::{CrossEntropyOptions, Tensor};
use coil_ir::{DType, Result};

/// A bottleneck ResNet's sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResNetConfig {
    /// Blocks per stage (`[3, 4, 6, 3]` for ResNet-50).
    pub layers: [usize; 4],
    /// Channels of the stem and of the first stage's 3x3 convolutions (64); stage `i` has
    /// `width << i`, and a block's output four times that.
    pub width: usize,
    /// Outputs of the final linear layer (`fc`): 1000 ImageNet classes.
    pub num_classes: usize,
}

impl ResNetConfig {
    /// torchvision's `resnet50`: 25.6M parameters.
    pub fn resnet50() -> ResNetConfig {
        ResNetConfig { layers: [3, 4, 6, 3], width: 64, num_classes: 1000 }
    }
}

/// The output channels of a bottleneck block are this many times its inner width.
const EXPANSION: usize = 4;

/// torchvision's `Bottleneck`: 1x1 (reduce), 3x3 (with the block's stride), 1x1 (expand), each
/// followed by batch norm, relu after the first two and after adding the shortcut; the shortcut
/// is a 1x1 convolution and batch norm (`downsample`) where the shape changes.
#[derive(Clone, Debug)]
pub struct Bottleneck {
    /// The 1x1 reduction to the block's inner width.
    pub conv1: Conv2d,
    /// Batch norm after `conv1`.
    pub bn1: BatchNorm2d,
    /// The 3x3 convolution, with the block's stride.
    pub conv2: Conv2d,
    /// Batch norm after `conv2`.
    pub bn2: BatchNorm2d,
    /// The 1x1 expansion to four times the inner width.
    pub conv3: Conv2d,
    /// Batch norm after `conv3` (before the shortcut is added).
    pub bn3: BatchNorm2d,
    /// The shortcut's 1x1 convolution and batch norm where the shape changes (torchvision's
    /// `downsample.0` and `downsample.1`); `None`: the identity.
    pub downsample: Option<(Conv2d, BatchNorm2d)>,
}

/// A bias-free convolution with torchvision's `kaiming_normal_(mode="fan_out", relu)` weights.
#[track_caller]
fn conv(path: &Path, cin: usize, cout: usize, k: usize, stride: usize, padding: usize) -> Result<Conv2d> {
    let std = (2.0 / (cout * k * k) as f64).sqrt();
    let options = ConvOptions { stride: [stride; 2], padding: [padding; 2], ..Default::default() };
    Conv2d::with_init(path, cin, cout, [k, k], options, None, Init::Normal { mean: 0.0, std })
}

#[track_caller]
fn bn(path: &Path, channels: usize) -> Result<BatchNorm2d> {
    BatchNorm2d::new(path, channels, BatchNormConfig::default())
}

impl Bottleneck {
    /// A block under `path` from `inplanes` channels, of inner width `planes` (output
    /// `4 * planes`) and `stride` on its 3x3 convolution; a shortcut projection where the
    /// stride or the channel count changes.
    #[track_caller]
    pub fn new(path: &Path, inplanes: usize, planes: usize, stride: usize) -> Result<Bottleneck> {
        let out = planes * EXPANSION;
        // Created in torchvision's order (the state_dict's): the shortcut last.
        let (conv1, bn1) = (conv(&path.pp("conv1"), inplanes, planes, 1, 1, 0)?, bn(&path.pp("bn1"), planes)?);
        let (conv2, bn2) = (conv(&path.pp("conv2"), planes, planes, 3, stride, 1)?, bn(&path.pp("bn2"), planes)?);
        let (conv3, bn3) = (conv(&path.pp("conv3"), planes, out, 1, 1, 0)?, bn(&path.pp("bn3"), out)?);
        let downsample = if stride != 1 || inplanes != out {
            let p = path.pp("downsample");
            Some((conv(&p.pp(0), inplanes, out, 1, stride, 0)?, bn(&p.pp(1), out)?))
        } else {
            None
        };
        Ok(Bottleneck { conv1, bn1, conv2, bn2, conv3, bn3, downsample })
    }
}

impl Bottleneck {
    /// The block on channels-last activations (`[N, H, W, C]` to `[N, H', W', 4 planes]`).
    #[track_caller]
    pub fn forward_channels_last(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.bn1.forward_channels_last(&self.conv1.forward_channels_last(x)?)?.relu()?;
        let h = self.bn2.forward_channels_last(&self.conv2.forward_channels_last(&h)?)?.relu()?;
        let h = self.bn3.forward_channels_last(&self.conv3.forward_channels_last(&h)?)?;
        let shortcut = match &self.downsample {
            Some((conv, bn)) => bn.forward_channels_last(&conv.forward_channels_last(x)?)?,
            None => x.to_dtype(h.dtype())?,
        };
        h.add(&shortcut)?.relu()
    }
}

impl Module for Bottleneck {
    /// `[N, C, H, W]` to `[N, 4 planes, H', W']`.
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_channels_last(&x.permute(&[0, 2, 3, 1])?)?.permute(&[0, 3, 1, 2])
    }
}

/// torchvision's `ResNet` with bottleneck blocks: a 7x7 stride-2 stem, batch norm, relu, 3x3
/// stride-2 max pooling, four stages (strides 1, 2, 2, 2), global average pooling and a linear
/// classifier. Convolutions and the classifier compute in the store's mixed-precision dtype
/// ([`crate::Precision`]); batch norms compute their statistics in f32 and keep the activations'
/// dtype. The activations are kept channels-last (`[N, H, W, C]`, PyTorch's `channels_last`
/// memory format; the values are the same), so the convolutions read and write them in place:
/// the input is best a `[N, H, W, 3]` buffer permuted to `[N, 3, H, W]`.
///
/// ```
/// use coil_nn::models::resnet::{ResNet, ResNetConfig};
/// use coil_nn::{Module, ParamStore};
/// use coil_frontend::Tensor;
/// # fn main() -> coil_ir::Result<()> {
/// let store = ParamStore::new();
/// let config = ResNetConfig { layers: [1, 1, 1, 1], width: 4, num_classes: 3 };
/// let model = ResNet::new(&store.root(coil_runtime::Device::Cpu, coil_ir::DType::F32), config)?;
/// assert_eq!(&store.names()[..3], ["conv1.weight", "bn1.weight", "bn1.bias"]);
/// let logits = model.forward(&Tensor::randn(&[2, 3, 32, 32], coil_ir::DType::F32)?)?;
/// assert_eq!(logits.shape(), &[2, 3]);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ResNet {
    /// The sizes it was built with.
    pub config: ResNetConfig,
    /// The stem: a 7x7 stride-2 convolution.
    pub conv1: Conv2d,
    /// Batch norm after the stem.
    pub bn1: BatchNorm2d,
    /// `layer1` to `layer4`.
    pub stages: Vec<Vec<Bottleneck>>,
    /// The classifier after global average pooling.
    pub fc: Linear,
}

impl ResNet {
    /// A ResNet of `config` under `path`, with torchvision's initialization and parameter names.
    #[track_caller]
    pub fn new(path: &Path, config: ResNetConfig) -> Result<ResNet> {
        let w = config.width;
        let conv1 = conv(&path.pp("conv1"), 3, w, 7, 2, 3)?;
        let bn1 = bn(&path.pp("bn1"), w)?;
        let mut inplanes = w;
        let mut stages = Vec::with_capacity(4);
        for (i, &blocks) in config.layers.iter().enumerate() {
            let planes = w << i;
            let stage = path.pp(format!("layer{}", i + 1));
            let mut layer = Vec::with_capacity(blocks);
            for b in 0..blocks {
                let stride = if i > 0 && b == 0 { 2 } else { 1 };
                layer.push(Bottleneck::new(&stage.pp(b), inplanes, planes, stride)?);
                inplanes = planes * EXPANSION;
            }
            stages.push(layer);
        }
        let fc = Linear::new(&path.pp("fc"), inplanes, config.num_classes, true)?;
        Ok(ResNet { config, conv1, bn1, stages, fc })
    }

    /// The mean cross-entropy of the logits of `images` (`[N, 3, H, W]`) against `labels`
    /// (`[N]`, class indices), computed in f32.
    #[track_caller]
    pub fn loss(&self, images: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let logits = self.forward(images)?.to_dtype(DType::F32)?;
        logits.cross_entropy(labels, CrossEntropyOptions::default())
    }
}

impl Module for ResNet {
    /// `[N, 3, H, W]` images to `[N, num_classes]` logits.
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.permute(&[0, 2, 3, 1])?;
        let h = self.bn1.forward_channels_last(&self.conv1.forward_channels_last(&x)?)?.relu()?;
        let mut h = h.max_pool2d_channels_last([3, 3], &[2, 2], [1, 1])?;
        for block in self.stages.iter().flatten() {
            h = block.forward_channels_last(&h)?;
        }
        // adaptive_avg_pool2d to 1x1, then flatten.
        let pooled = h.mean(&[1, 2], false)?;
        self.fc.forward(&pooled)
    }
}
