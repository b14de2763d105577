//! Convolutions as im2col + matrix product (`F.conv1d`, `F.conv2d`, `F.conv_transpose1d`,
//! `F.conv_transpose2d`), written with [`Tensor::unfold2d`] and [`Tensor::fold`]: the columns of
//! every kernel window times the weight as a matrix, grouped channels as a batch of products.
//! Gradients come from differentiating the composition. This is the path of every backend for
//! now (the design's cuDNN path is not written yet): correct everywhere, not yet fast on a GPU.

use crate::ops::composite::CompositeScope;
use crate::tensor::Tensor;
use coil_ir::{Error, Result};
use std::panic::Location;

/// A convolution's geometry: stride, padding and dilation per spatial dim, and channel groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvOptions<const D: usize> {
    pub stride: [usize; D],
    pub padding: [usize; D],
    pub dilation: [usize; D],
    pub groups: usize,
}

impl<const D: usize> Default for ConvOptions<D> {
    /// PyTorch's defaults: stride 1, no padding, dilation 1, one group.
    fn default() -> Self {
        ConvOptions { stride: [1; D], padding: [0; D], dilation: [1; D], groups: 1 }
    }
}

fn fail<T>(op: &str, srcs: &[&Tensor], msg: String, loc: &'static Location<'static>) -> Result<T> {
    Err(Tensor::error(op, srcs, Error::shape(msg), loc))
}

impl Tensor {
    /// `F.conv2d(x, weight, bias, stride, padding, dilation, groups)` of `x: [N, C, H, W]` and
    /// `weight: [O, C / groups, kh, kw]`: `[N, O, H', W']`.
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
        let loc = Location::caller();
        let srcs: Vec<&Tensor> = [self, weight].into_iter().chain(bias).collect();
        let _scope = CompositeScope::enter("conv2d", &srcs, loc);
        let (&[n, c, _, _], &[out, cg, kh, kw]) = (self.shape(), weight.shape()) else {
            return fail("conv2d", &srcs, "expected input [N, C, H, W] and weight [O, C / groups, kh, kw]".into(), loc);
        };
        let g = o.groups;
        if g == 0 || c % g != 0 || out % g != 0 || cg * g != c {
            let msg = format!("{g} groups do not divide input channels {c} and weight {:?}", weight.shape());
            return fail("conv2d", &srcs, msg, loc);
        }
        if let Some(b) = bias {
            if b.shape() != [out] {
                return fail("conv2d", &srcs, format!("bias of shape {:?} for {out} output channels", b.shape()), loc);
            }
        }
        // [N, C * kh * kw, L], channel-major: group g's columns are a contiguous block.
        let cols = self.unfold2d([kh, kw], o.dilation, o.padding, o.stride)?;
        let l = cols.shape()[2];
        let cols = cols.reshape(&[n as i64, g as i64, (cg * kh * kw) as i64, l as i64])?;
        let w = weight.reshape(&[1, g as i64, (out / g) as i64, (cg * kh * kw) as i64])?;
        let y = w.matmul(&cols)?; // [N, G, O / G, L]
        let (oh, ow) = out_size(self.shape()[2..].try_into().expect("rank 4"), [kh, kw], &o);
        let y = y.reshape(&[n as i64, out as i64, oh as i64, ow as i64])?;
        match bias {
            Some(b) => y.add(&b.reshape(&[1, out as i64, 1, 1])?),
            None => Ok(y),
        }
    }

    /// `F.conv1d(x, weight, bias, stride, padding, dilation, groups)` of `x: [N, C, L]` and
    /// `weight: [O, C / groups, k]`: [`Tensor::conv2d`] over a height of 1.
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
        let loc = Location::caller();
        let srcs: Vec<&Tensor> = [self, weight].into_iter().chain(bias).collect();
        let _scope = CompositeScope::enter("conv1d", &srcs, loc);
        if self.rank() != 3 || weight.rank() != 3 {
            return fail("conv1d", &srcs, "expected input [N, C, L] and weight [O, C / groups, k]".into(), loc);
        }
        let o2 = ConvOptions {
            stride: [1, o.stride[0]],
            padding: [0, o.padding[0]],
            dilation: [1, o.dilation[0]],
            groups: o.groups,
        };
        self.unsqueeze(2)?.conv2d(&weight.unsqueeze(2)?, bias, o2)?.squeeze_dim(2)
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
        let loc = Location::caller();
        let srcs: Vec<&Tensor> = [self, weight].into_iter().chain(bias).collect();
        let _scope = CompositeScope::enter("conv_transpose2d", &srcs, loc);
        let (&[n, c, h, w_in], &[wc, og, kh, kw]) = (self.shape(), weight.shape()) else {
            return fail(
                "conv_transpose2d",
                &srcs,
                "expected input [N, C, H, W] and weight [C, O / groups, kh, kw]".into(),
                loc,
            );
        };
        let g = o.groups;
        if g == 0 || wc != c || c % g != 0 {
            let msg = format!("{g} groups and weight {:?} do not fit input channels {c}", weight.shape());
            return fail("conv_transpose2d", &srcs, msg, loc);
        }
        let out = og * g;
        if let Some(b) = bias {
            if b.shape() != [out] {
                let msg = format!("bias of shape {:?} for {out} output channels", b.shape());
                return fail("conv_transpose2d", &srcs, msg, loc);
            }
        }
        let mut size = [0usize; 2];
        for (i, (&len, k)) in [h, w_in].iter().zip([kh, kw]).enumerate() {
            if output_padding[i] >= o.stride[i].max(o.dilation[i]) {
                let msg = format!("output padding {output_padding:?} must be smaller than stride or dilation");
                return fail("conv_transpose2d", &srcs, msg, loc);
            }
            let full = (len.max(1) - 1) * o.stride[i] + o.dilation[i] * (k.max(1) - 1) + output_padding[i] + 1;
            if full <= 2 * o.padding[i] {
                let msg = format!("padding {:?} leaves no output of input {:?}", o.padding, self.shape());
                return fail("conv_transpose2d", &srcs, msg, loc);
            }
            size[i] = full - 2 * o.padding[i];
        }
        let (cg, k) = (c / g, kh * kw);
        // Columns [N, G, O/G * k, H * W] = weightᵀ (per group) @ x, then fold adds them up.
        let x = self.reshape(&[n as i64, g as i64, cg as i64, (h * w_in) as i64])?;
        let wt = weight.reshape(&[1, g as i64, cg as i64, (og * k) as i64])?.transpose(-1, -2)?;
        let cols = wt.matmul(&x)?.reshape(&[n as i64, (out * k) as i64, (h * w_in) as i64])?;
        let y = cols.fold(size, [kh, kw], o.dilation, o.padding, o.stride)?;
        match bias {
            Some(b) => y.add(&b.reshape(&[1, out as i64, 1, 1])?),
            None => Ok(y),
        }
    }

    /// `F.conv_transpose1d`: [`Tensor::conv_transpose2d`] over a height of 1.
    #[track_caller]
    pub fn conv_transpose1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        o: ConvOptions<1>,
        output_padding: usize,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let srcs: Vec<&Tensor> = [self, weight].into_iter().chain(bias).collect();
        let _scope = CompositeScope::enter("conv_transpose1d", &srcs, loc);
        if self.rank() != 3 || weight.rank() != 3 {
            return fail(
                "conv_transpose1d",
                &srcs,
                "expected input [N, C, L] and weight [C, O / groups, k]".into(),
                loc,
            );
        }
        let o2 = ConvOptions {
            stride: [1, o.stride[0]],
            padding: [0, o.padding[0]],
            dilation: [1, o.dilation[0]],
            groups: o.groups,
        };
        self.unsqueeze(2)?.conv_transpose2d(&weight.unsqueeze(2)?, bias, o2, [0, output_padding])?.squeeze_dim(2)
    }
}

/// The output size of a convolution of `input` (spatial) by `kernel` (unfold checked it fits).
fn out_size(input: [usize; 2], kernel: [usize; 2], o: &ConvOptions<2>) -> (usize, usize) {
    let one = |i: usize| (input[i] + 2 * o.padding[i] - o.dilation[i] * (kernel[i] - 1) - 1) / o.stride[i] + 1;
    (one(0), one(1))
}
