//! Normalizations, resampling and pixel shuffles for `[N, C, *spatial]` tensors, written as
//! compositions of primitives: `group_norm` and `instance_norm` (through `layer_norm`),
//! `batch_norm` (inference, or batch statistics without running statistics),
//! `local_response_norm`, `interpolate` (`index_select` with indices and weights computed from
//! the sizes), `pixel_shuffle` / `pixel_unshuffle`. Pooling is in [`super::pooling`], `unfold`
//! and `fold` in [`super::im2col`]; convolutions need a primitive of their own.

use crate::ops::composite::CompositeScope;
use crate::ops::shape::Loc;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Result};
use std::panic::Location;

fn sizes(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&s| s as i64).collect()
}

/// `F.interpolate`'s modes coil computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interpolation {
    /// `mode="nearest"`: source index `floor(dst * in / out)`.
    Nearest,
    /// `mode="nearest-exact"`: source index `floor((dst + 0.5) * in / out)`.
    NearestExact,
    /// `mode="linear"` / `"bilinear"` / `"trilinear"` (by the number of spatial dims), with
    /// `align_corners`.
    Linear {
        /// Corner pixels' centers align (`align_corners=True`), else their outer edges.
        align_corners: bool,
    },
    /// `mode="bicubic"` (two spatial dims): Keys' cubic convolution with `A = -0.75`, source
    /// indices clamped into the input, as PyTorch.
    Bicubic {
        /// Corner pixels' centers align (`align_corners=True`), else their outer edges.
        align_corners: bool,
    },
    /// `mode="area"`: [`Tensor::adaptive_avg_pool`] to the output size.
    Area,
}

/// `F.grid_sample`'s modes and padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GridSample {
    /// `mode="bilinear"`, `"nearest"` (`bilinear = false`); `border` clamps coordinates into
    /// the input (`padding_mode="border"`), else outside samples are zeros.
    Sample {
        /// Bilinear interpolation, else the nearest pixel.
        bilinear: bool,
        /// Coordinates outside the input are clamped to its border, else samples there are 0.
        border: bool,
        /// Grid coordinates -1 and 1 are the corner pixels' centers, else their outer edges.
        align_corners: bool,
    },
}

/// Keys' cubic convolution weights of the four taps around a source position with fraction
/// `t`, as PyTorch's `get_cubic_upsample_coefficients` (in f32).
fn cubic_weights(t: f32) -> [f32; 4] {
    const A: f32 = -0.75;
    let near = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// An error of `op` on `x` at `loc`.
fn fail<T>(op: &str, x: &Tensor, msg: String, loc: Loc) -> Result<T> {
    Err(Tensor::error(op, &[x], Error::shape(msg), loc))
}

/// A host-computed vector as a tensor of `dtype` on `x`'s device, shaped to broadcast along dim
/// `dim` of a tensor of rank `rank`.
pub(crate) fn along(values: Vec<f64>, dim: usize, rank: usize, dtype: DType, x: &Tensor) -> Result<Tensor> {
    let mut shape = vec![1i64; rank];
    shape[dim] = values.len() as i64;
    let n = values.len();
    Tensor::from_vec(values, &[n])?.to_dtype(dtype)?.to_device(x.device())?.reshape(&shape)
}

fn indices(values: Vec<i64>, x: &Tensor) -> Result<Tensor> {
    let n = values.len();
    Tensor::from_vec(values, &[n])?.to_device(x.device())
}

impl Tensor {
    /// Checks a `[N, C, *spatial]` (or `[C, *spatial]`) input with `nd` spatial dims.
    pub(crate) fn check_spatial(&self, op: &'static str, nd: usize, loc: Loc) -> Result<()> {
        if self.rank() != nd + 1 && self.rank() != nd + 2 {
            return fail(op, self, format!("expected {}D or {}D input, got {}D", nd + 1, nd + 2, self.rank()), loc);
        }
        if !self.dtype().is_float() {
            let e = Error::dtype(format!("\"{op}\" not implemented for '{}'", self.dtype()));
            return Err(Tensor::error(op, &[self], e, loc));
        }
        Ok(())
    }

    /// `F.group_norm(x, num_groups, weight, bias, eps)`: normalizes each group of
    /// `C / num_groups` channels of each sample (biased variance), then scales and shifts per
    /// channel.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0, 10.0, 30.0], &[1, 2, 2])?;
    /// let y = x.group_norm(2, None, None, 0.0)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![-1.0, 1.0, -1.0, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn group_norm(
        &self,
        num_groups: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let mut srcs = vec![self];
        srcs.extend(weight);
        srcs.extend(bias);
        let _scope = CompositeScope::enter("group_norm", &srcs, loc);
        if self.rank() < 2 {
            return fail(
                "group_norm",
                self,
                format!("expected at least 2 dims [N, C, ...], got {:?}", self.shape()),
                loc,
            );
        }
        let (n, c) = (self.shape()[0], self.shape()[1]);
        if num_groups == 0 || !c.is_multiple_of(num_groups) {
            let msg = format!("Expected number of channels in input to be divisible by num_groups, but got input of shape {:?} and num_groups={num_groups}", self.shape());
            return fail("group_norm", self, msg, loc);
        }
        let group_numel = self.numel() / (n * num_groups).max(1);
        let grouped = self.reshape(&[n as i64, num_groups as i64, group_numel as i64])?;
        let normalized = grouped.layer_norm(&[group_numel], None, None, eps)?.reshape(&sizes(self.shape()))?;
        self.affine_per_channel(normalized, weight, bias)
    }

    /// `y * weight + bias` with `weight` and `bias` (`[C]`) along dim 1 of this tensor's shape.
    fn affine_per_channel(&self, y: Tensor, weight: Option<&Tensor>, bias: Option<&Tensor>) -> Result<Tensor> {
        let mut shape = vec![1i64; self.rank()];
        shape[1] = self.shape()[1] as i64;
        let y = match weight {
            Some(w) => y.mul(&w.reshape(&shape)?)?,
            None => y,
        };
        match bias {
            Some(b) => y.add(&b.reshape(&shape)?),
            None => Ok(y),
        }
    }

    /// `F.instance_norm(x, weight=w, bias=b, eps=eps)` with the input's statistics (no running
    /// statistics): each channel of each sample normalized over its spatial dims.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0, 10.0, 30.0], &[1, 2, 2])?;
    /// assert_eq!(x.instance_norm(None, None, 0.0)?.to_vec::<f32>()?, vec![-1.0, 1.0, -1.0, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn instance_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("instance_norm", &[self], loc);
        if self.rank() < 3 {
            return fail(
                "instance_norm",
                self,
                format!("expected at least 3 dims [N, C, *spatial], got {:?}", self.shape()),
                loc,
            );
        }
        self.group_norm(self.shape()[1], weight, bias, eps)
    }

    /// `F.batch_norm(x, running_mean, running_var, weight, bias, training, eps=eps)`: in
    /// inference (`training = false`), normalizes with the running statistics; in training,
    /// with the batch's (biased variance over every dim but the channels). Training with
    /// running statistics would update them in place, which this function does not do: that is
    /// an error, not a silent difference.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0], &[2, 1])?;
    /// let y = x.batch_norm(None, None, None, None, true, 0.0)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![-1.0, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn batch_norm(
        &self,
        running_mean: Option<&Tensor>,
        running_var: Option<&Tensor>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        training: bool,
        eps: f64,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("batch_norm", &[self], loc);
        if self.rank() < 2 {
            return fail(
                "batch_norm",
                self,
                format!("expected at least 2 dims [N, C, ...], got {:?}", self.shape()),
                loc,
            );
        }
        let mut shape = vec![1i64; self.rank()];
        shape[1] = self.shape()[1] as i64;
        let (mean, var) = match (training, running_mean, running_var) {
            (false, Some(m), Some(v)) => (m.reshape(&shape)?, v.reshape(&shape)?),
            (false, _, _) => {
                let e = Error::value("batch_norm in inference needs running_mean and running_var");
                return Err(Tensor::error("batch_norm", &[self], e, loc));
            }
            (true, None, None) => {
                let dims: Vec<i64> = (0..self.rank() as i64).filter(|&d| d != 1).collect();
                (self.mean(&dims, true)?, self.var(&dims, 0.0, true)?)
            }
            (true, _, _) => {
                let e = Error::unsupported(
                    "batch_norm in training with running statistics updates them in place; coil's functional batch_norm does not: pass None for both, or training = false",
                );
                return Err(Tensor::error("batch_norm", &[self], e, loc));
            }
        };
        let y = self.sub(&mean)?.mul(&var.add(eps)?.rsqrt()?)?;
        self.affine_per_channel(y, weight, bias)
    }

    /// `F.interpolate(x, size, mode)` on `[N, C, *spatial]` with one to three spatial dims:
    /// nearest, nearest-exact, linear / bilinear / trilinear and bicubic (with
    /// `align_corners`), area. Source indices and weights follow PyTorch's formulas (computed in
    /// f32 from the sizes), each spatial dim in turn, the last first.
    ///
    /// ```
    /// use coil_frontend::{ops::vision::Interpolation, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 1, 2])?;
    /// assert_eq!(x.interpolate(&[4], Interpolation::Nearest)?.to_vec::<f32>()?, vec![1.0, 1.0, 2.0, 2.0]);
    /// let y = x.interpolate(&[4], Interpolation::Linear { align_corners: true })?.to_vec::<f32>()?;
    /// assert!((y[1] - 4.0 / 3.0).abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn interpolate(&self, size: &[usize], mode: Interpolation) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("interpolate", &[self], loc);
        let nd = size.len();
        if mode == Interpolation::Area {
            return self.adaptive_avg_pool(size);
        }
        if matches!(mode, Interpolation::Bicubic { .. }) && nd != 2 {
            return fail(
                "interpolate",
                self,
                format!("bicubic interpolation takes 2 spatial dims, got output size {size:?}"),
                loc,
            );
        }
        if !(1..=3).contains(&nd) || self.rank() != nd + 2 {
            return fail(
                "interpolate",
                self,
                format!("expected [N, C] plus {} spatial dims for output size {size:?}, got {:?}", nd, self.shape()),
                loc,
            );
        }
        self.check_spatial("interpolate", nd, loc)?;
        let rank = self.rank();
        let mut y = self.clone();
        for i in (0..nd).rev() {
            let d = rank - nd + i;
            let (n, o) = (self.shape()[d], size[i]);
            if o == 0 {
                return fail("interpolate", self, format!("output size must be positive, got {size:?}"), loc);
            }
            let scale = n as f32 / o as f32;
            match mode {
                Interpolation::Nearest | Interpolation::NearestExact => {
                    let shift = if mode == Interpolation::NearestExact { 0.5f32 } else { 0.0 };
                    let src: Vec<i64> =
                        (0..o).map(|j| (((j as f32 + shift) * scale).floor() as i64).min(n as i64 - 1)).collect();
                    y = y.index_select(d as i64, &indices(src, self)?)?;
                }
                Interpolation::Linear { align_corners } => {
                    let (mut i0, mut i1, mut w0, mut w1) = (vec![], vec![], vec![], vec![]);
                    for j in 0..o {
                        let src = if align_corners {
                            let s = if o > 1 { (n as f32 - 1.0) / (o as f32 - 1.0) } else { 0.0 };
                            s * j as f32
                        } else {
                            (scale * (j as f32 + 0.5) - 0.5).max(0.0)
                        };
                        let lo = (src.floor() as i64).min(n as i64 - 1);
                        let hi = if lo < n as i64 - 1 { lo + 1 } else { lo };
                        let l1 = src - lo as f32;
                        i0.push(lo);
                        i1.push(hi);
                        w0.push((1.0 - l1) as f64);
                        w1.push(l1 as f64);
                    }
                    let a = y.index_select(d as i64, &indices(i0, self)?)?;
                    let b = y.index_select(d as i64, &indices(i1, self)?)?;
                    let w0 = along(w0, d, rank, self.dtype(), self)?;
                    let w1 = along(w1, d, rank, self.dtype(), self)?;
                    y = a.mul(&w0)?.add(&b.mul(&w1)?)?;
                }
                Interpolation::Bicubic { align_corners } => {
                    let mut taps = vec![(vec![], vec![]); 4];
                    for j in 0..o {
                        let src = if align_corners {
                            let s = if o > 1 { (n as f32 - 1.0) / (o as f32 - 1.0) } else { 0.0 };
                            s * j as f32
                        } else {
                            scale * (j as f32 + 0.5) - 0.5
                        };
                        let base = src.floor();
                        let weights = cubic_weights(src - base);
                        for (k, (index, weight)) in taps.iter_mut().enumerate() {
                            index.push((base as i64 - 1 + k as i64).clamp(0, n as i64 - 1));
                            weight.push(weights[k] as f64);
                        }
                    }
                    let mut acc: Option<Tensor> = None;
                    for (index, weight) in taps {
                        let term = y.index_select(d as i64, &indices(index, self)?)?.mul(&along(
                            weight,
                            d,
                            rank,
                            self.dtype(),
                            self,
                        )?)?;
                        acc = Some(match acc {
                            None => term,
                            Some(a) => a.add(&term)?,
                        });
                    }
                    y = acc.expect("four taps");
                }
                // Computed by adaptive_avg_pool before the loop.
                Interpolation::Area => {}
            }
        }
        Ok(y)
    }

    /// `F.pixel_shuffle(x, r)`: `[*, C r^2, H, W]` -> `[*, C, H r, W r]`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..4i64).collect(), &[4, 1, 1])?;
    /// let y = x.pixel_shuffle(2)?;
    /// assert_eq!((y.shape(), y.to_vec::<i64>()?), (&[1usize, 2, 2][..], vec![0, 1, 2, 3]));
    /// assert_eq!(y.pixel_unshuffle(2)?.to_vec::<i64>()?, vec![0, 1, 2, 3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn pixel_shuffle(&self, upscale: usize) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("pixel_shuffle", &[self], loc);
        let r = self.rank();
        let square = upscale.checked_mul(upscale).unwrap_or(0);
        if r < 3 || square == 0 || !self.shape()[r - 3].is_multiple_of(square) {
            let msg = format!("pixel_shuffle expects [*, C * {upscale}^2, H, W], got {:?}", self.shape());
            return fail("pixel_shuffle", self, msg, loc);
        }
        let (c, h, w) = (self.shape()[r - 3], self.shape()[r - 2], self.shape()[r - 1]);
        let u = upscale as i64;
        let batch = sizes(&self.shape()[..r - 3]);
        let b = batch.len() as i64;
        let split = [batch.clone(), vec![(c / square) as i64, u, u, h as i64, w as i64]].concat();
        // [*, C, r, r, H, W] -> [*, C, H, r, W, r]
        let mut perm: Vec<i64> = (0..b).collect();
        perm.extend([b, b + 3, b + 1, b + 4, b + 2]);
        let out = [batch, vec![(c / square) as i64, h as i64 * u, w as i64 * u]].concat();
        self.reshape(&split)?.permute(&perm)?.reshape(&out)
    }

    /// `F.pixel_unshuffle(x, r)`: `[*, C, H r, W r]` -> `[*, C r^2, H, W]`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[1, 4, 6], coil_ir::DType::F32);
    /// assert_eq!(x.pixel_unshuffle(2)?.shape(), &[4, 2, 3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn pixel_unshuffle(&self, downscale: usize) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("pixel_unshuffle", &[self], loc);
        let r = self.rank();
        let d = downscale;
        if r < 3 || d == 0 || !self.shape()[r - 2].is_multiple_of(d) || !self.shape()[r - 1].is_multiple_of(d) {
            let msg = format!("pixel_unshuffle expects [*, C, H * {d}, W * {d}], got {:?}", self.shape());
            return fail("pixel_unshuffle", self, msg, loc);
        }
        let (c, h, w) = (self.shape()[r - 3], self.shape()[r - 2] / d, self.shape()[r - 1] / d);
        let u = d as i64;
        let batch = sizes(&self.shape()[..r - 3]);
        let b = batch.len() as i64;
        let split = [batch.clone(), vec![c as i64, h as i64, u, w as i64, u]].concat();
        // [*, C, H, r, W, r] -> [*, C, r, r, H, W]
        let mut perm: Vec<i64> = (0..b).collect();
        perm.extend([b, b + 2, b + 4, b + 1, b + 3]);
        let out = [batch, vec![(c * d * d) as i64, h as i64, w as i64]].concat();
        self.reshape(&split)?.permute(&perm)?.reshape(&out)
    }

    /// `F.local_response_norm(x, size, alpha, beta, k)`: `x / (k + alpha * mean(x^2))^beta`, the
    /// mean over `size` neighbouring channels (zero-padded, as PyTorch's average pool counts).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::ones(&[1, 2, 1], coil_ir::DType::F32);
    /// let y = x.local_response_norm(1, 1.0, 1.0, 1.0)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.5, 0.5]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn local_response_norm(&self, size: usize, alpha: f64, beta: f64, k: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("local_response_norm", &[self], loc);
        if self.rank() < 3 || size == 0 {
            let msg = format!(
                "Expected 3D or higher dimensionality input and a positive size (got {}D, size {size})",
                self.rank()
            );
            return fail("local_response_norm", self, msg, loc);
        }
        let channels = self.shape()[1];
        let mut pads = vec![0i64; 2 * (self.rank() - 2)];
        pads.extend([(size / 2) as i64, ((size - 1) / 2) as i64]);
        let squares = self.mul(self)?.pad(&pads, 0.0)?;
        let mut sum = squares.narrow(1, 0, channels)?;
        for offset in 1..size {
            sum = sum.add(&squares.narrow(1, offset as i64, channels)?)?;
        }
        let div = sum.div(size as f64)?.mul(alpha)?.add(k)?.pow(beta)?;
        self.div(&div)
    }

    /// `F.affine_grid(theta, size, align_corners)` for 2-D: the `[N, H, W, 2]` sampling grid of
    /// the affine maps `theta` (`[N, 2, 3]`) over the normalized coordinates of an output of
    /// `size` `[N, C, H, W]`, computed as PyTorch's decomposition does.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let identity = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0], &[1, 2, 3])?;
    /// let grid = identity.affine_grid([1, 1, 1, 2], true)?;
    /// assert_eq!(grid.to_vec::<f32>()?, vec![-1.0, 0.0, 1.0, 0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn affine_grid(&self, size: [usize; 4], align_corners: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("affine_grid", &[self], loc);
        let [n, _, h, w] = size;
        if self.shape() != [n, 2, 3] || !self.dtype().is_float() {
            let msg = format!(
                "Expected a batch of 2D affine matrices of shape Nx2x3 for size {size:?}. Got {}.",
                self.meta()
            );
            return fail("affine_grid", self, msg, loc);
        }
        if h == 0 || w == 0 {
            return fail("affine_grid", self, format!("Expected non-zero, positive output size. Got {size:?}"), loc);
        }
        // Normalized coordinates: linspace(-a, a) with a = (s - 1) / s unless align_corners.
        let line = |steps: usize| -> Result<Tensor> {
            if steps <= 1 {
                return Tensor::zeros(&[1], self.dtype()).to_device(self.device());
            }
            let a = if align_corners { 1.0 } else { (steps as f64 - 1.0) / steps as f64 };
            Tensor::linspace(-a, a, steps, self.dtype())?.to_device(self.device())
        };
        let xs = line(w)?.reshape(&[1, w as i64, 1])?.pad(&[0, 2], 0)?;
        let ys = line(h)?.reshape(&[h as i64, 1, 1])?.pad(&[1, 1], 0)?;
        let ones = Tensor::ones(&[1, 1, 1], self.dtype()).to_device(self.device())?.pad(&[2, 0], 0)?;
        let base = xs.add(&ys)?.add(&ones)?.reshape(&[-1, 3, 1])?;
        let grid = base.mul(&self.transpose(1, 2)?.unsqueeze(1)?)?.sum(&[-2], false)?;
        grid.reshape(&[n as i64, h as i64, w as i64, 2])
    }

    /// `F.grid_sample(x, grid, mode, padding_mode, align_corners)` for `[N, C, H, W]` input and
    /// `[N, oH, oW, 2]` grid of normalized `(x, y)` coordinates: bilinear or nearest, with
    /// zeros or border padding, as PyTorch's decomposition: the corners are gathered from the
    /// flattened input and weighted (a corner outside the input weighs 0).
    ///
    /// ```
    /// use coil_frontend::{ops::vision::GridSample, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[1, 1, 2, 2])?;
    /// let centre = Tensor::zeros(&[1, 1, 1, 2], coil_ir::DType::F32);
    /// let mode = GridSample::Sample { bilinear: true, border: false, align_corners: false };
    /// assert_eq!(x.grid_sample(&centre, mode)?.to_vec::<f32>()?, vec![2.5]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn grid_sample(&self, grid: &Tensor, mode: GridSample) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("grid_sample", &[self, grid], loc);
        let GridSample::Sample { bilinear, border, align_corners } = mode;
        if self.rank() != 4 || grid.rank() != 4 || grid.shape()[3] != 2 || grid.shape()[0] != self.shape()[0] {
            let msg = format!(
                "grid_sample expects [N, C, H, W] input and an [N, oH, oW, 2] grid, got {:?} and {:?}",
                self.shape(),
                grid.shape()
            );
            return Err(Tensor::error("grid_sample", &[self, grid], Error::shape(msg), loc));
        }
        if !self.dtype().is_float() || grid.dtype() != self.dtype() {
            let e = Error::dtype(format!(
                "grid_sample expects floating input and grid of one dtype, got {} and {}",
                self.dtype(),
                grid.dtype()
            ));
            return Err(Tensor::error("grid_sample", &[self, grid], e, loc));
        }
        let [n, c, h, w] = [self.shape()[0], self.shape()[1], self.shape()[2], self.shape()[3]];
        let (oh, ow) = (grid.shape()[1], grid.shape()[2]);
        // Normalized [-1, 1] to pixel coordinates.
        let source = |coords: Tensor, size: usize| -> Result<Tensor> {
            let size = size as f64;
            let scale = if align_corners { size * 0.5 - 0.5 } else { size * 0.5 };
            let pixel = coords.mul(scale)?.add(size * 0.5 - 0.5)?;
            if border {
                return pixel.clamp(Some(0.0), Some(size - 1.0));
            }
            Ok(pixel)
        };
        let ix = source(grid.select(-1, 0)?, w)?;
        let iy = source(grid.select(-1, 1)?, h)?;
        let flat = self.reshape(&[n as i64, c as i64, (h * w) as i64])?;
        // One corner: its value where it lies inside the input, weighted; 0 outside.
        let corner = |xs: &Tensor, ys: &Tensor, weight: Option<&Tensor>| -> Result<Tensor> {
            let inside = xs
                .ge(0.0)?
                .logical_and(&xs.lt(w as f64)?)?
                .logical_and(&ys.ge(0.0)?)?
                .logical_and(&ys.lt(h as f64)?)?;
            let x = crate::ops::pointwise::where_(&inside, xs, 0.0)?.to_dtype(DType::I64)?;
            let y = crate::ops::pointwise::where_(&inside, ys, 0.0)?.to_dtype(DType::I64)?;
            let index = y.mul(w as i64)?.add(&x)?.reshape(&[n as i64, 1, (oh * ow) as i64])?;
            let index = index.expand(&[n as i64, c as i64, (oh * ow) as i64])?;
            let values = flat.gather(2, &index)?.reshape(&[n as i64, c as i64, oh as i64, ow as i64])?;
            let weight = match weight {
                Some(wt) => crate::ops::pointwise::where_(&inside, wt, 0.0)?,
                None => inside.to_dtype(self.dtype())?,
            };
            values.mul(&weight.unsqueeze(1)?)
        };
        if !bilinear {
            return corner(&ix.round()?, &iy.round()?, None);
        }
        let (x0, y0) = (ix.floor()?, iy.floor()?);
        let (x1, y1) = (x0.add(1.0)?, y0.add(1.0)?);
        let w_nw = x1.sub(&ix)?.mul(&y1.sub(&iy)?)?;
        let w_ne = ix.sub(&x0)?.mul(&y1.sub(&iy)?)?;
        let w_sw = x1.sub(&ix)?.mul(&iy.sub(&y0)?)?;
        let w_se = ix.sub(&x0)?.mul(&iy.sub(&y0)?)?;
        corner(&x0, &y0, Some(&w_nw))?
            .add(&corner(&x1, &y0, Some(&w_ne))?)?
            .add(&corner(&x0, &y1, Some(&w_sw))?)?
            .add(&corner(&x1, &y1, Some(&w_se))?)
    }
}
