//! The convolution template ([`crate::Op::Conv`]): its geometry, its three forms (the
//! convolution and its two gradients) and their shape rules.
//!
//! A convolution over `D` spatial dims (1, 2 or 3) takes `x: [N, C, *in]` and
//! `w: [O, C / groups, *kernel]` to `y: [N, O, *out]`, with per spatial dim
//! `out = (in + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1` (PyTorch's
//! `F.conv{1,2,3}d`). The two gradients are the other forms: the gradient with respect to the
//! data (also the transposed convolution, `F.conv_transpose{1,2,3}d`) and with respect to the
//! weight. Each form's gradients are again forms of the same geometry, so gradients of
//! gradients stay templates.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::TensorMeta;

/// Stride, padding and dilation per spatial dim, and channel groups (PyTorch's arguments).
///
/// ```
/// use coil_ir::op::ConvGeometry;
/// let g = ConvGeometry { stride: vec![2, 2], padding: vec![1, 1], dilation: vec![1, 1], groups: 1 };
/// assert_eq!(g.out_size(&[7, 8], &[3, 3]).unwrap(), vec![4, 4]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvGeometry {
    /// Step between windows, per spatial dim.
    pub stride: Vec<usize>,
    /// Zeros added on both sides, per spatial dim.
    pub padding: Vec<usize>,
    /// Spacing between kernel elements, per spatial dim.
    pub dilation: Vec<usize>,
    /// Channel groups: input and output channels split into `groups` independent convolutions.
    pub groups: usize,
}

/// Which of the three computations of a convolution a [`crate::Op::Conv`] node is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConvForm {
    /// `(x [N, C, *in], w [O, C / groups, *kernel]) -> y [N, O, *out]`.
    Forward,
    /// The gradient with respect to the data, and the transposed convolution:
    /// `(dy [N, O, *out], w [O, C / groups, *kernel]) -> dx [N, C, *size]`; `size` is the data's
    /// spatial size (`out` does not determine it: the forward rounds down).
    BackwardData {
        /// The data's spatial size.
        size: Vec<usize>,
    },
    /// The gradient with respect to the weight:
    /// `(x [N, C, *in], dy [N, O, *out]) -> dw [O, C / groups, *kernel]`.
    BackwardWeight {
        /// The kernel's spatial size.
        kernel: Vec<usize>,
    },
}

impl ConvForm {
    /// The op's printed name.
    pub fn name(&self) -> &'static str {
        match self {
            ConvForm::Forward => "convolution",
            ConvForm::BackwardData { .. } => "convolution_backward_data",
            ConvForm::BackwardWeight { .. } => "convolution_backward_weight",
        }
    }
}

impl ConvGeometry {
    /// The number of spatial dims.
    pub fn dims(&self) -> usize {
        self.stride.len()
    }

    /// The attributes as printed: `stride=[2, 2], padding=[1, 1], dilation=[1, 1], groups=1`.
    pub fn describe(&self) -> String {
        format!(
            "stride={:?}, padding={:?}, dilation={:?}, groups={}",
            self.stride, self.padding, self.dilation, self.groups
        )
    }

    /// The output's spatial size for input `input` and kernel `kernel` (spatial sizes), or why
    /// the kernel does not fit.
    pub fn out_size(&self, input: &[usize], kernel: &[usize]) -> Result<Vec<usize>> {
        let d = self.dims();
        if self.padding.len() != d || self.dilation.len() != d || input.len() != d || kernel.len() != d {
            return Err(Error::shape(format!(
                "a convolution over {d} spatial dims got input {input:?}, kernel {kernel:?}, {}",
                self.describe()
            )));
        }
        (0..d)
            .map(|i| {
                // In u128: the sizes are the user's, any size.
                let span = self.dilation[i] as u128 * (kernel[i] as u128).saturating_sub(1) + 1;
                let padded = input[i] as u128 + 2 * self.padding[i] as u128;
                if kernel[i] == 0 || self.stride[i] == 0 || self.dilation[i] == 0 || padded < span {
                    return Err(Error::shape(format!(
                        "kernel {kernel:?} does not fit input {input:?} ({})",
                        self.describe()
                    )));
                }
                Ok(((padded - span) / self.stride[i] as u128 + 1) as usize)
            })
            .collect()
    }
}

/// The output meta of `Op::Conv { geometry, form }` on operands `a` and `b` (see [`ConvForm`]).
pub fn infer_conv(geometry: &ConvGeometry, form: &ConvForm, a: &TensorMeta, b: &TensorMeta) -> Result<TensorMeta> {
    let d = geometry.dims();
    if !(1..=3).contains(&d) {
        return Err(Error::shape(format!("convolutions have 1, 2 or 3 spatial dims, got {d}")));
    }
    if a.dtype != b.dtype || !a.dtype.is_float() {
        return Err(Error::dtype(format!(
            "{} expects operands of one floating dtype, got {} and {}",
            form.name(),
            a.dtype,
            b.dtype
        )));
    }
    if a.rank() != d + 2 || b.rank() != d + 2 {
        return Err(Error::shape(format!(
            "{} over {d} spatial dims expects operands of rank {}, got {:?} and {:?}",
            form.name(),
            d + 2,
            a.shape,
            b.shape
        )));
    }
    let g = geometry.groups;
    let channels = |what: &str, c: usize, o: usize, cg: usize| -> Result<()> {
        if g == 0 || !o.is_multiple_of(g) || cg * g != c {
            return Err(Error::shape(format!(
                "{g} groups do not fit {what}: {c} input channels, {o} output channels, {cg} channels per group"
            )));
        }
        Ok(())
    };
    let dtype: DType = a.dtype;
    match form {
        ConvForm::Forward => {
            let (x, w) = (a, b);
            channels("the weight", x.shape[1], w.shape[0], w.shape[1])?;
            let out = geometry.out_size(&x.shape[2..], &w.shape[2..])?;
            Ok(TensorMeta::new([&[x.shape[0], w.shape[0]][..], &out].concat(), dtype))
        }
        ConvForm::BackwardData { size } => {
            let (dy, w) = (a, b);
            let c = w.shape[1] * g;
            channels("the weight", c, w.shape[0], w.shape[1])?;
            let out = geometry.out_size(size, &w.shape[2..])?;
            if dy.shape[1] != w.shape[0] || dy.shape[2..] != out[..] {
                return Err(Error::shape(format!(
                    "the output gradient {:?} does not fit weight {:?} and data size {size:?} ({})",
                    dy.shape,
                    w.shape,
                    geometry.describe()
                )));
            }
            Ok(TensorMeta::new([&[dy.shape[0], c][..], size].concat(), dtype))
        }
        ConvForm::BackwardWeight { kernel } => {
            let (x, dy) = (a, b);
            let o = dy.shape[1];
            if g == 0 || !x.shape[1].is_multiple_of(g) {
                return Err(Error::shape(format!("{g} groups do not divide {} input channels", x.shape[1])));
            }
            channels("the output gradient", x.shape[1], o, x.shape[1] / g)?;
            let out = geometry.out_size(&x.shape[2..], kernel)?;
            if dy.shape[0] != x.shape[0] || dy.shape[2..] != out[..] {
                return Err(Error::shape(format!(
                    "the output gradient {:?} does not fit data {:?} and kernel {kernel:?} ({})",
                    dy.shape,
                    x.shape,
                    geometry.describe()
                )));
            }
            Ok(TensorMeta::new([&[o, x.shape[1] / g][..], kernel].concat(), dtype))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(stride: usize, padding: usize, groups: usize) -> ConvGeometry {
        ConvGeometry { stride: vec![stride; 2], padding: vec![padding; 2], dilation: vec![1; 2], groups }
    }

    fn m(shape: &[usize]) -> TensorMeta {
        TensorMeta::new(shape.to_vec(), DType::F32)
    }

    #[test]
    fn the_three_forms_agree_on_shapes() {
        let g = geometry(2, 1, 2);
        let y = infer_conv(&g, &ConvForm::Forward, &m(&[3, 4, 9, 8]), &m(&[6, 2, 3, 3])).unwrap();
        assert_eq!(y.shape, vec![3, 6, 5, 4]);
        let dx = infer_conv(&g, &ConvForm::BackwardData { size: vec![9, 8] }, &y, &m(&[6, 2, 3, 3])).unwrap();
        assert_eq!(dx.shape, vec![3, 4, 9, 8]);
        let dw = infer_conv(&g, &ConvForm::BackwardWeight { kernel: vec![3, 3] }, &m(&[3, 4, 9, 8]), &y).unwrap();
        assert_eq!(dw.shape, vec![6, 2, 3, 3]);
    }

    #[test]
    fn mismatches_are_errors() {
        let g = geometry(1, 0, 1);
        assert!(infer_conv(&g, &ConvForm::Forward, &m(&[1, 3, 5, 5]), &m(&[2, 4, 3, 3])).is_err());
        assert!(infer_conv(&g, &ConvForm::Forward, &m(&[1, 3, 2, 2]), &m(&[2, 3, 3, 3])).is_err());
        let bad = infer_conv(&g, &ConvForm::BackwardData { size: vec![5, 5] }, &m(&[1, 2, 4, 3]), &m(&[2, 3, 3, 3]));
        assert!(bad.is_err());
    }
}
