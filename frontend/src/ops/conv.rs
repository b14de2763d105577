//! Convolutions (`F.conv1d`, `F.conv2d`, `F.conv3d` and their transposes): each records one
//! convolution template node ([`Op::Conv`]), plus a bias add. The compile path keeps the node
//! whole where cuDNN runs it and otherwise decomposes it into im2col and a matrix product, as
//! the reference interpreter does; gradients are the template's two other forms (a transposed
//! convolution is the data gradient form).

use crate::ops::composite::CompositeScope;
use crate::tensor::Tensor;
use coil_ir::op::{ConvForm, ConvGeometry};
use coil_ir::{Error, Op, Result};
use std::panic::Location;

/// A convolution's geometry: stride, padding and dilation per spatial dim, and channel groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvOptions<const D: usize> {
    /// Step between windows, per spatial dim.
    pub stride: [usize; D],
    /// Zeros added on both sides, per spatial dim.
    pub padding: [usize; D],
    /// Spacing between kernel elements, per spatial dim.
    pub dilation: [usize; D],
    /// Channel groups: input and output channels split into `groups` independent convolutions.
    pub groups: usize,
}

impl<const D: usize> Default for ConvOptions<D> {
    /// PyTorch's defaults: stride 1, no padding, dilation 1, one group.
    fn default() -> Self {
        ConvOptions { stride: [1; D], padding: [0; D], dilation: [1; D], groups: 1 }
    }
}

impl<const D: usize> ConvOptions<D> {
    /// The geometry attribute of the template node.
    fn geometry(&self) -> ConvGeometry {
        ConvGeometry {
            stride: self.stride.to_vec(),
            padding: self.padding.to_vec(),
            dilation: self.dilation.to_vec(),
            groups: self.groups,
        }
    }
}

fn fail<T>(op: &str, srcs: &[&Tensor], msg: String, loc: &'static Location<'static>) -> Result<T> {
    Err(Tensor::error(op, srcs, Error::shape(msg), loc))
}

/// The spelling of a `[N, C, *spatial]` shape for `d` spatial dims in error messages.
fn layout(d: usize, channels: &str) -> String {
    let spatial = ["L", "H, W", "D, H, W"][d - 1];
    format!("[N, {channels}, {spatial}]")
}

impl Tensor {
    /// `F.conv2d(x, weight, bias, stride, padding, dilation, groups)` of `x: [N, C, H, W]` and
    /// `weight: [O, C / groups, kh, kw]`: `[N, O, H', W']`. `x` may be any view, channels-last
    /// (`[N, H, W, C]` permuted) included; permuting the result to `[N, H', W', O]` costs
    /// nothing on CUDA (cuDNN writes it so), which is how a network keeps its activations
    /// channels-last (`coil_nn::Conv2d::forward_channels_last`).
    ///
    /// ```
    /// use coil_frontend::{ops::conv::ConvOptions, Tensor};
    /// let x = Tensor::from_vec((0..16).map(|v| v as f32).collect(), &[1, 1, 4, 4])?;
    /// let w = Tensor::ones(&[1, 1, 2, 2], coil_ir::DType::F32);
    /// let y = x.conv2d(&w, None, ConvOptions { stride: [2, 2], ..Default::default() })?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![10.0, 18.0, 42.0, 50.0]); // sums of 2 x 2 blocks
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, o: ConvOptions<2>) -> Result<Tensor> {
        self.conv_nd("conv2d", weight, bias, o.geometry(), Location::caller())
    }

    /// `F.conv1d(x, weight, bias, stride, padding, dilation, groups)` of `x: [N, C, L]` and
    /// `weight: [O, C / groups, k]`: `[N, O, L']`.
    ///
    /// ```
    /// use coil_frontend::{ops::conv::ConvOptions, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 1, 4])?;
    /// let w = Tensor::from_vec(vec![1.0f32, -1.0], &[1, 1, 2])?;
    /// assert_eq!(x.conv1d(&w, None, Default::default())?.to_vec::<f32>()?, vec![-1.0, -1.0, -1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn conv1d(&self, weight: &Tensor, bias: Option<&Tensor>, o: ConvOptions<1>) -> Result<Tensor> {
        self.conv_nd("conv1d", weight, bias, o.geometry(), Location::caller())
    }

    /// `F.conv3d(x, weight, bias, stride, padding, dilation, groups)` of `x: [N, C, D, H, W]`
    /// and `weight: [O, C / groups, kd, kh, kw]`: `[N, O, D', H', W']`.
    ///
    /// ```
    /// use coil_frontend::{ops::conv::ConvOptions, Tensor};
    /// let x = Tensor::ones(&[1, 1, 2, 2, 2], coil_ir::DType::F32);
    /// let w = Tensor::ones(&[1, 1, 2, 2, 2], coil_ir::DType::F32);
    /// assert_eq!(x.conv3d(&w, None, ConvOptions::default())?.to_vec::<f32>()?, vec![8.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn conv3d(&self, weight: &Tensor, bias: Option<&Tensor>, o: ConvOptions<3>) -> Result<Tensor> {
        self.conv_nd("conv3d", weight, bias, o.geometry(), Location::caller())
    }

    /// The convolution template over `geometry.dims()` spatial dims, checked, plus the bias.
    fn conv_nd(
        &self,
        name: &'static str,
        weight: &Tensor,
        bias: Option<&Tensor>,
        geometry: ConvGeometry,
        loc: &'static Location<'static>,
    ) -> Result<Tensor> {
        let srcs: Vec<&Tensor> = [self, weight].into_iter().chain(bias).collect();
        let _scope = CompositeScope::enter(name, &srcs, loc);
        let d = geometry.dims();
        if self.rank() != d + 2 || weight.rank() != d + 2 {
            let msg =
                format!("expected input {} and weight {}", layout(d, "C"), layout(d, "C / groups").replace('N', "O"));
            return fail(name, &srcs, msg, loc);
        }
        let (c, out, cg, g) = (self.shape()[1], weight.shape()[0], weight.shape()[1], geometry.groups);
        if g == 0 || c % g != 0 || out % g != 0 || cg * g != c {
            let msg = format!("{g} groups do not divide input channels {c} and weight {:?}", weight.shape());
            return fail(name, &srcs, msg, loc);
        }
        if let Some(b) = bias {
            if b.shape() != [out] {
                return fail(name, &srcs, format!("bias of shape {:?} for {out} output channels", b.shape()), loc);
            }
        }
        let y = Tensor::record(Op::Conv { geometry, form: ConvForm::Forward }, &[self, weight], loc)?;
        add_bias(y, bias, d)
    }

    /// `F.conv_transpose2d(x, weight, bias, stride, padding, output_padding, groups, dilation)`
    /// of `x: [N, C, H, W]` and `weight: [C, O / groups, kh, kw]`: the adjoint of
    /// [`Tensor::conv2d`] (each input pixel spreads its kernel-weighted copy; overlaps add),
    /// `[N, O, (H - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1, ..]`.
    ///
    /// ```
    /// use coil_frontend::{ops::conv::ConvOptions, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 1, 1, 2])?;
    /// let w = Tensor::ones(&[1, 1, 1, 2], coil_ir::DType::F32);
    /// let y = x.conv_transpose2d(&w, None, Default::default(), [0, 0])?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.0, 3.0, 2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        o: ConvOptions<2>,
        output_padding: [usize; 2],
    ) -> Result<Tensor> {
        self.conv_transpose_nd("conv_transpose2d", weight, bias, o.geometry(), &output_padding, Location::caller())
    }

    /// `F.conv_transpose1d`: [`Tensor::conv_transpose2d`] over one spatial dim.
    #[track_caller]
    pub fn conv_transpose1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        o: ConvOptions<1>,
        output_padding: usize,
    ) -> Result<Tensor> {
        self.conv_transpose_nd("conv_transpose1d", weight, bias, o.geometry(), &[output_padding], Location::caller())
    }

    /// `F.conv_transpose3d`: [`Tensor::conv_transpose2d`] over three spatial dims.
    ///
    /// ```
    /// use coil_frontend::{ops::conv::ConvOptions, Tensor};
    /// let x = Tensor::ones(&[1, 1, 1, 1, 1], coil_ir::DType::F32);
    /// let w = Tensor::ones(&[1, 2, 2, 1, 1], coil_ir::DType::F32);
    /// let y = x.conv_transpose3d(&w, None, ConvOptions::default(), [0, 0, 0])?;
    /// assert_eq!(y.shape(), &[1, 2, 2, 1, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn conv_transpose3d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        o: ConvOptions<3>,
        output_padding: [usize; 3],
    ) -> Result<Tensor> {
        self.conv_transpose_nd("conv_transpose3d", weight, bias, o.geometry(), &output_padding, Location::caller())
    }

    /// The transposed convolution: the data-gradient form of the template, whose `size` is the
    /// output's. An output padding of at least the stride (allowed below the dilation) adds
    /// positions no input reaches: zeros, padded on after the template.
    fn conv_transpose_nd(
        &self,
        name: &'static str,
        weight: &Tensor,
        bias: Option<&Tensor>,
        geometry: ConvGeometry,
        output_padding: &[usize],
        loc: &'static Location<'static>,
    ) -> Result<Tensor> {
        let srcs: Vec<&Tensor> = [self, weight].into_iter().chain(bias).collect();
        let _scope = CompositeScope::enter(name, &srcs, loc);
        let d = geometry.dims();
        if self.rank() != d + 2 || weight.rank() != d + 2 {
            let msg = format!(
                "expected input {} and weight {}",
                layout(d, "C"),
                layout(d, "O / groups").replacen('N', "C", 1)
            );
            return fail(name, &srcs, msg, loc);
        }
        let (c, g) = (self.shape()[1], geometry.groups);
        if g == 0 || weight.shape()[0] != c || c % g != 0 {
            let msg = format!("{g} groups and weight {:?} do not fit input channels {c}", weight.shape());
            return fail(name, &srcs, msg, loc);
        }
        let out = weight.shape()[1] * g;
        if let Some(b) = bias {
            if b.shape() != [out] {
                let msg = format!("bias of shape {:?} for {out} output channels", b.shape());
                return fail(name, &srcs, msg, loc);
            }
        }
        let (mut size, mut extra) = (vec![0; d], vec![0; d]);
        for i in 0..d {
            let (s, dil, p) = (geometry.stride[i], geometry.dilation[i], geometry.padding[i]);
            if output_padding[i] >= s.max(dil) {
                let msg = format!("output padding {output_padding:?} must be smaller than stride or dilation");
                return fail(name, &srcs, msg, loc);
            }
            let (len, k) = (self.shape()[2 + i], weight.shape()[2 + i]);
            let full = (len.max(1) - 1) * s + dil * (k.max(1) - 1) + output_padding[i] + 1;
            if full <= 2 * p {
                let msg = format!("padding {:?} leaves no output of input {:?}", geometry.padding, self.shape());
                return fail(name, &srcs, msg, loc);
            }
            extra[i] = output_padding[i].saturating_sub(s - 1);
            size[i] = full - 2 * p - extra[i];
        }
        let y = Tensor::record(Op::Conv { geometry, form: ConvForm::BackwardData { size } }, &[self, weight], loc)?;
        let y = if extra.iter().any(|&e| e > 0) {
            let pads: Vec<i64> = extra.iter().rev().flat_map(|&e| [0, e as i64]).collect();
            y.pad(&pads, 0.0)?
        } else {
            y
        };
        add_bias(y, bias, d)
    }
}

/// `y + bias` broadcast over the channels of `[N, O, *spatial]`.
fn add_bias(y: Tensor, bias: Option<&Tensor>, d: usize) -> Result<Tensor> {
    match bias {
        Some(b) => {
            let shape: Vec<i64> = [1, b.shape()[0] as i64].into_iter().chain(std::iter::repeat_n(1, d)).collect();
            y.add(&b.reshape(&shape)?)
        }
        None => Ok(y),
    }
}
