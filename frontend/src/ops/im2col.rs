//! `F.unfold` (im2col) and `F.fold` (col2im) on `[N, C, H, W]`, written with pads, strided
//! slices and reshapes: one block per kernel offset.

use crate::ops::composite::CompositeScope;
use crate::ops::shape::Loc;
use crate::tensor::Tensor;
use coil_ir::{Error, Result};
use std::panic::Location;

fn fail<T>(op: &str, x: &Tensor, msg: String, loc: Loc) -> Result<T> {
    Err(Tensor::error(op, &[x], Error::shape(msg), loc))
}

fn sizes(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&s| s as i64).collect()
}

impl Tensor {
    /// `F.unfold(x, kernel, dilation, padding, stride)` (im2col): the `[N, C * kh * kw, L]`
    /// columns of every sliding `kh x kw` block of `[N, C, H, W]`, channel-major as PyTorch orders
    /// them; one strided slice per kernel offset.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..9).map(|v| v as f32).collect(), &[1, 1, 3, 3])?;
    /// let cols = x.unfold2d([2, 2], [1, 1], [0, 0], [1, 1])?;
    /// assert_eq!(cols.shape(), &[1, 4, 4]);
    /// assert_eq!(cols.to_vec::<f32>()?[..4], [0.0, 1.0, 3.0, 4.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn unfold2d(
        &self,
        kernel: [usize; 2],
        dilation: [usize; 2],
        padding: [usize; 2],
        stride: [usize; 2],
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("unfold", &[self], loc);
        if self.rank() != 4 {
            return fail(
                "unfold",
                self,
                format!("Input Error: Only 4D input Tensors are supported (got {}D)", self.rank()),
                loc,
            );
        }
        let (n, c) = (self.shape()[0] as i64, self.shape()[1] as i64);
        let mut out = [0usize; 2];
        for i in 0..2 {
            // In u128: the arguments are the user's, any size.
            let span = dilation[i] as u128 * (kernel[i].max(1) as u128 - 1) + 1;
            let size = self.shape()[2 + i] as u128 + 2 * padding[i] as u128;
            if kernel[i] == 0 || dilation[i] == 0 || stride[i] == 0 || size < span || padding[i] > i64::MAX as usize / 2
            {
                let msg = format!("unfold: kernel {kernel:?} (dilation {dilation:?}) does not fit input {:?} padded by {padding:?} with stride {stride:?}", self.shape());
                return fail("unfold", self, msg, loc);
            }
            out[i] = ((size - span) / stride[i] as u128 + 1) as usize;
        }
        let x = if padding != [0, 0] {
            self.pad(&[padding[1] as i64, padding[1] as i64, padding[0] as i64, padding[0] as i64], 0.0)?
        } else {
            self.clone()
        };
        let mut blocks = Vec::with_capacity(kernel[0] * kernel[1]);
        for i in 0..kernel[0] {
            for j in 0..kernel[1] {
                let mut w = x.clone();
                for (axis, offset) in [(0, i), (1, j)] {
                    let start = (offset * dilation[axis]) as i64;
                    let end = start + (stride[axis] * (out[axis] - 1)) as i64 + 1;
                    w = w.slice(2 + axis as i64, Some(start), Some(end), stride[axis] as i64)?;
                }
                blocks.push(w);
            }
        }
        let stacked = crate::ops::movement::stack(&blocks.iter().collect::<Vec<_>>(), 2)?;
        let k = (kernel[0] * kernel[1]) as i64;
        stacked.reshape(&[n, c * k, (out[0] * out[1]) as i64])
    }

    /// `F.fold(x, output_size, kernel, dilation, padding, stride)` (col2im), the adjoint of
    /// [`Tensor::unfold2d`]: sums the `[N, C * kh * kw, L]` columns back into `[N, C, H, W]`,
    /// overlapping blocks adding up. Each kernel offset's block is spread to its stride (zeros
    /// between), padded into place and added.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::ones(&[1, 1, 3, 3], coil_ir::DType::F32);
    /// let cols = x.unfold2d([2, 2], [1, 1], [0, 0], [1, 1])?;
    /// let back = cols.fold([3, 3], [2, 2], [1, 1], [0, 0], [1, 1])?;
    /// assert_eq!(back.to_vec::<f32>()?, vec![1.0, 2.0, 1.0, 2.0, 4.0, 2.0, 1.0, 2.0, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn fold(
        &self,
        output_size: [usize; 2],
        kernel: [usize; 2],
        dilation: [usize; 2],
        padding: [usize; 2],
        stride: [usize; 2],
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("fold", &[self], loc);
        if self.rank() != 3 {
            return fail(
                "fold",
                self,
                format!("Input Error: Only 3D input Tensors are supported (got {}D)", self.rank()),
                loc,
            );
        }
        let mut blocks_per_dim = [0usize; 2];
        for i in 0..2 {
            // In u128: the arguments are the user's, any size.
            let span = dilation[i] as u128 * (kernel[i].max(1) as u128 - 1) + 1;
            let size = output_size[i] as u128 + 2 * padding[i] as u128;
            if kernel[i] == 0 || dilation[i] == 0 || stride[i] == 0 || size < span || size > i64::MAX as u128 {
                let msg = format!("fold: kernel {kernel:?} (dilation {dilation:?}) does not fit output {output_size:?} padded by {padding:?} with stride {stride:?}");
                return fail("fold", self, msg, loc);
            }
            blocks_per_dim[i] = ((size - span) / stride[i] as u128 + 1) as usize;
        }
        let (n, ck, l) = (self.shape()[0], self.shape()[1], self.shape()[2]);
        let k = kernel[0] * kernel[1];
        if ck % k != 0 || l != blocks_per_dim[0] * blocks_per_dim[1] {
            let msg = format!(
                "fold: expected input of size [N, C * {k}, {}] for kernel {kernel:?} and output {output_size:?}, got {:?}",
                blocks_per_dim[0] * blocks_per_dim[1],
                self.shape()
            );
            return fail("fold", self, msg, loc);
        }
        let c = ck / k;
        let [oh, ow] = blocks_per_dim;
        let (ph, pw) = (output_size[0] + 2 * padding[0], output_size[1] + 2 * padding[1]);
        let cols = self.reshape(&[n as i64, c as i64, k as i64, oh as i64, ow as i64])?;
        let mut total: Option<Tensor> = None;
        for i in 0..kernel[0] {
            for j in 0..kernel[1] {
                let mut block = cols.select(2, (i * kernel[1] + j) as i64)?;
                // Spread to the stride along H (dim 2) and W (dim 3), then pad into place.
                for (axis, blocks, s) in [(2i64, oh, stride[0]), (3, ow, stride[1])] {
                    if s > 1 {
                        let mut shape = sizes(block.shape());
                        block = block
                            .unsqueeze(axis + 1)?
                            .pad(&pad_last_of(block.rank() + 1, axis as usize + 1, s - 1), 0)?;
                        shape[axis as usize] = (blocks * s) as i64;
                        block = block.reshape(&shape)?.narrow(axis, 0, (blocks - 1) * s + 1)?;
                    }
                }
                let (top, left) = (i * dilation[0], j * dilation[1]);
                let bottom = ph - top - block.shape()[2];
                let right = pw - left - block.shape()[3];
                let placed = block.pad(&[left as i64, right as i64, top as i64, bottom as i64], 0)?;
                total = Some(match total {
                    None => placed,
                    Some(t) => t.add(&placed)?,
                });
            }
        }
        let total = total.expect("a kernel has at least one offset");
        total.narrow(2, padding[0] as i64, output_size[0])?.narrow(3, padding[1] as i64, output_size[1])
    }
}

/// `F.pad` pairs (last dim first) that pad only dim `dim` of a rank-`rank` tensor, by `after`
/// at its end.
fn pad_last_of(rank: usize, dim: usize, after: usize) -> Vec<i64> {
    let mut pads = vec![0i64; 2 * (rank - dim)];
    pads[2 * (rank - 1 - dim) + 1] = after as i64;
    pads
}
