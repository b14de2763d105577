//! Normalizations, pooling, resampling and pixel shuffles for `[N, C, *spatial]` tensors,
//! written as compositions of primitives: `group_norm` and `instance_norm` (through
//! `layer_norm`), `batch_norm` (inference, or batch statistics without running statistics),
//! `max_pool` / `avg_pool` (one strided slice per kernel offset), `adaptive_avg_pool` (a product
//! with an averaging matrix per dim), `interpolate` (nearest and linear: `index_select` with
//! indices and weights computed from the sizes), `pixel_shuffle` / `pixel_unshuffle`. `unfold`
//! and `fold` are in [`super::im2col`].
//! Convolutions need a primitive of their own and are not here.

use crate::ops::composite::CompositeScope;
use crate::ops::shape::Loc;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Result};
use std::panic::Location;

fn sizes(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&s| s as i64).collect()
}

/// Pooling: the largest element of each window, or the mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    Max,
    /// The mean over the window; `count_include_pad` counts the padding zeros in the divisor
    /// (PyTorch's default).
    Avg {
        count_include_pad: bool,
    },
}

/// `max_pool2d`, `avg_pool1d`, ...: the name of a pooling of `nd` spatial dims.
fn pool_name(kind: &str, nd: usize) -> &'static str {
    match (kind, nd) {
        ("max", 1) => "max_pool1d",
        ("max", 3) => "max_pool3d",
        ("max", _) => "max_pool2d",
        (_, 1) => "avg_pool1d",
        (_, 3) => "avg_pool3d",
        _ => "avg_pool2d",
    }
}

/// The windows of a pooling: `stride` defaults to the kernel and `dilation` to 1 when empty.
#[derive(Clone, Copy, Debug)]
struct PoolGeometry<'a> {
    kernel: &'a [usize],
    stride: &'a [usize],
    padding: &'a [usize],
    dilation: &'a [usize],
    ceil_mode: bool,
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
    Linear { align_corners: bool },
    /// `mode="bicubic"` (two spatial dims): Keys' cubic convolution with `A = -0.75`, source
    /// indices clamped into the input, as PyTorch.
    Bicubic { align_corners: bool },
    /// `mode="area"`: [`Tensor::adaptive_avg_pool`] to the output size.
    Area,
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
fn along(values: Vec<f64>, dim: usize, rank: usize, dtype: DType, x: &Tensor) -> Result<Tensor> {
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

    /// Pools the last `kernel.len()` dims: one strided slice of the padded input per kernel
    /// offset, combined with `maximum` or summed. With `ceil_mode` the last window may run past
    /// the padded input (padded further with -inf or 0, outside the average's divisor), as long
    /// as it starts inside it, as in PyTorch.
    fn pool(&self, op: &'static str, kind: Pool, g: PoolGeometry, loc: Loc) -> Result<Tensor> {
        let nd = g.kernel.len();
        if !(1..=3).contains(&nd) {
            return fail(op, self, format!("pooling takes 1 to 3 spatial dims, got kernel {:?}", g.kernel), loc);
        }
        self.check_spatial(op, nd, loc)?;
        let stride: Vec<usize> = if g.stride.is_empty() { g.kernel.to_vec() } else { g.stride.to_vec() };
        let dilation: Vec<usize> = if g.dilation.is_empty() { vec![1; nd] } else { g.dilation.to_vec() };
        if stride.len() != nd || g.padding.len() != nd || dilation.len() != nd {
            return fail(
                op,
                self,
                format!(
                    "kernel {:?}, stride {stride:?}, padding {:?} and dilation {dilation:?} need {nd} values each",
                    g.kernel, g.padding
                ),
                loc,
            );
        }
        let rank = self.rank();
        let (mut out_sizes, mut overhang) = (Vec::with_capacity(nd), Vec::with_capacity(nd));
        for i in 0..nd {
            let (k, s, p, d, n) = (g.kernel[i], stride[i], g.padding[i], dilation[i], self.shape()[rank - nd + i]);
            if k == 0 || s == 0 || d == 0 {
                let msg = format!(
                    "kernel size, stride and dilation must be positive, got {:?}, {stride:?} and {dilation:?}",
                    g.kernel
                );
                return fail(op, self, msg, loc);
            }
            if p > k / 2 {
                let msg =
                    format!("pad should be at most half of effective kernel size, but got pad={p}, kernel_size={k}");
                return fail(op, self, msg, loc);
            }
            // In u128: the arguments are the user's, any size.
            let (n, k, s, p, d) = (n as u128, k as u128, s as u128, p as u128, d as u128);
            let (padded, span) = (n + 2 * p, d * (k - 1) + 1);
            if padded < span || padded > i64::MAX as u128 {
                let msg = format!("input size {n} (padded by {p}) does not fit the kernel's span {span}");
                return fail(op, self, msg, loc);
            }
            let mut out = if g.ceil_mode { (padded - span).div_ceil(s) + 1 } else { (padded - span) / s + 1 };
            // The last window must start inside the input or its left padding.
            if g.ceil_mode && (out - 1) * s >= n + p {
                out -= 1;
            }
            out_sizes.push(out as usize);
            overhang.push(((out - 1) * s + span).saturating_sub(padded) as usize);
        }
        let fill = if kind == Pool::Max { f64::NEG_INFINITY } else { 0.0 };
        let pads: Vec<i64> =
            (0..nd).rev().flat_map(|i| [g.padding[i] as i64, (g.padding[i] + overhang[i]) as i64]).collect();
        let padded = if pads.iter().any(|&p| p > 0) { self.pad(&pads, fill)? } else { self.clone() };
        let offsets: Vec<Vec<usize>> = g.kernel.iter().fold(vec![vec![]], |acc, &k| {
            acc.iter().flat_map(|o| (0..k).map(move |j| [o.clone(), vec![j]].concat())).collect()
        });
        let mut acc: Option<Tensor> = None;
        for offset in &offsets {
            let mut w = padded.clone();
            for i in 0..nd {
                let start = (offset[i] * dilation[i]) as i64;
                let end = start + (stride[i] * (out_sizes[i] - 1)) as i64 + 1;
                w = w.slice((rank - nd + i) as i64, Some(start), Some(end), stride[i] as i64)?;
            }
            acc = Some(match (acc, kind) {
                (None, _) => w,
                (Some(a), Pool::Max) => a.maximum(&w)?,
                (Some(a), Pool::Avg { .. }) => a.add(&w)?,
            });
        }
        let total = acc.expect("a kernel has at least one offset");
        let Pool::Avg { count_include_pad } = kind else { return Ok(total) };
        // The divisor of each window, a product over dims: the window's positions inside the
        // padded input (or the input alone without count_include_pad), as PyTorch counts them.
        let mut divisor: Option<Tensor> = None;
        for i in 0..nd {
            let (k, s, p, n) =
                (g.kernel[i] as i64, stride[i] as i64, g.padding[i] as i64, self.shape()[rank - nd + i] as i64);
            let (lo, hi) = if count_include_pad { (-p, n + p) } else { (0, n) };
            let counts: Vec<f64> = (0..out_sizes[i] as i64)
                .map(|o| {
                    let start = o * s - p;
                    ((start + k).min(hi) - start.max(lo)).max(0) as f64
                })
                .collect();
            let c = along(counts, rank - nd + i, rank, self.dtype(), self)?;
            divisor = Some(match divisor {
                None => c,
                Some(dv) => dv.mul(&c)?,
            });
        }
        total.div(&divisor.expect("at least one spatial dim"))
    }

    /// `F.max_pool1d/2d/3d(x, kernel, stride, padding, dilation, ceil_mode)` over the last
    /// `kernel.len()` (1 to 3) dims of `[N, C, *spatial]` or `[C, *spatial]`; an empty `stride`
    /// is the kernel, an empty `dilation` is 1.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..5).map(|v| v as f32).collect(), &[1, 5])?;
    /// assert_eq!(x.max_pool(&[2], &[2], &[0], &[], true)?.to_vec::<f32>()?, vec![1.0, 3.0, 4.0]);
    /// assert_eq!(x.max_pool(&[2], &[1], &[0], &[2], false)?.to_vec::<f32>()?, vec![2.0, 3.0, 4.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn max_pool(
        &self,
        kernel: &[usize],
        stride: &[usize],
        padding: &[usize],
        dilation: &[usize],
        ceil_mode: bool,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let op = pool_name("max", kernel.len());
        let _scope = CompositeScope::enter(op, &[self], loc);
        self.pool(op, Pool::Max, PoolGeometry { kernel, stride, padding, dilation, ceil_mode }, loc)
    }

    /// `F.avg_pool1d/2d/3d(x, kernel, stride, padding, ceil_mode, count_include_pad)` over the
    /// last `kernel.len()` (1 to 3) dims; an empty `stride` is the kernel.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..5).map(|v| v as f32).collect(), &[1, 5])?;
    /// assert_eq!(x.avg_pool(&[2], &[2], &[0], true, true)?.to_vec::<f32>()?, vec![0.5, 2.5, 4.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn avg_pool(
        &self,
        kernel: &[usize],
        stride: &[usize],
        padding: &[usize],
        ceil_mode: bool,
        count_include_pad: bool,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let op = pool_name("avg", kernel.len());
        let _scope = CompositeScope::enter(op, &[self], loc);
        let g = PoolGeometry { kernel, stride, padding, dilation: &[], ceil_mode };
        self.pool(op, Pool::Avg { count_include_pad }, g, loc)
    }

    /// `F.max_pool2d(x, kernel, stride, padding)` on `[N, C, H, W]` or `[C, H, W]` (stride
    /// defaults to the kernel when empty; no dilation, `ceil_mode=False`: see
    /// [`Tensor::max_pool`]).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..16).map(|v| v as f32).collect(), &[1, 4, 4])?;
    /// assert_eq!(x.max_pool2d([2, 2], &[], [0, 0])?.to_vec::<f32>()?, vec![5.0, 7.0, 13.0, 15.0]);
    /// assert_eq!(x.avg_pool2d([2, 2], &[], [0, 0], true)?.to_vec::<f32>()?, vec![2.5, 4.5, 10.5, 12.5]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn max_pool2d(&self, kernel: [usize; 2], stride: &[usize], padding: [usize; 2]) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("max_pool2d", &[self], loc);
        self.pool(
            "max_pool2d",
            Pool::Max,
            PoolGeometry { kernel: &kernel, stride, padding: &padding, dilation: &[], ceil_mode: false },
            loc,
        )
    }

    /// `F.avg_pool2d(x, kernel, stride, padding, count_include_pad=...)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::ones(&[1, 3, 3], coil_ir::DType::F32);
    /// let y = x.avg_pool2d([3, 3], &[1, 1], [1, 1], false)?.to_vec::<f32>()?;
    /// assert!(y.iter().all(|&v| v == 1.0));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn avg_pool2d(
        &self,
        kernel: [usize; 2],
        stride: &[usize],
        padding: [usize; 2],
        count_include_pad: bool,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("avg_pool2d", &[self], loc);
        self.pool(
            "avg_pool2d",
            Pool::Avg { count_include_pad },
            PoolGeometry { kernel: &kernel, stride, padding: &padding, dilation: &[], ceil_mode: false },
            loc,
        )
    }

    /// `F.max_pool1d(x, kernel, stride, padding)` on `[N, C, L]` or `[C, L]`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0, 2.0, 5.0], &[1, 4])?;
    /// assert_eq!(x.max_pool1d(2, None, 0)?.to_vec::<f32>()?, vec![3.0, 5.0]);
    /// assert_eq!(x.avg_pool1d(2, None, 0, true)?.to_vec::<f32>()?, vec![2.0, 3.5]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn max_pool1d(&self, kernel: usize, stride: Option<usize>, padding: usize) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("max_pool1d", &[self], loc);
        let stride: Vec<usize> = stride.into_iter().collect();
        self.pool(
            "max_pool1d",
            Pool::Max,
            PoolGeometry { kernel: &[kernel], stride: &stride, padding: &[padding], dilation: &[], ceil_mode: false },
            loc,
        )
    }

    /// `F.avg_pool1d(x, kernel, stride, padding, count_include_pad=...)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0, 5.0], &[1, 3])?;
    /// assert_eq!(x.avg_pool1d(2, Some(1), 0, true)?.to_vec::<f32>()?, vec![2.0, 4.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn avg_pool1d(
        &self,
        kernel: usize,
        stride: Option<usize>,
        padding: usize,
        count_include_pad: bool,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("avg_pool1d", &[self], loc);
        let stride: Vec<usize> = stride.into_iter().collect();
        self.pool(
            "avg_pool1d",
            Pool::Avg { count_include_pad },
            PoolGeometry { kernel: &[kernel], stride: &stride, padding: &[padding], dilation: &[], ceil_mode: false },
            loc,
        )
    }

    /// `F.max_pool3d(x, kernel, stride, padding)` on `[N, C, D, H, W]` or `[C, D, H, W]`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..8).map(|v| v as f32).collect(), &[1, 2, 2, 2])?;
    /// assert_eq!(x.max_pool3d([2, 2, 2], &[], [0, 0, 0])?.to_vec::<f32>()?, vec![7.0]);
    /// assert_eq!(x.avg_pool3d([2, 2, 2], &[], [0, 0, 0], true)?.to_vec::<f32>()?, vec![3.5]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn max_pool3d(&self, kernel: [usize; 3], stride: &[usize], padding: [usize; 3]) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("max_pool3d", &[self], loc);
        self.pool(
            "max_pool3d",
            Pool::Max,
            PoolGeometry { kernel: &kernel, stride, padding: &padding, dilation: &[], ceil_mode: false },
            loc,
        )
    }

    /// `F.avg_pool3d(x, kernel, stride, padding, count_include_pad=...)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::ones(&[1, 2, 2, 2], coil_ir::DType::F32);
    /// assert_eq!(x.avg_pool3d([2, 2, 2], &[], [0, 0, 0], true)?.to_vec::<f32>()?, vec![1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn avg_pool3d(
        &self,
        kernel: [usize; 3],
        stride: &[usize],
        padding: [usize; 3],
        count_include_pad: bool,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("avg_pool3d", &[self], loc);
        self.pool(
            "avg_pool3d",
            Pool::Avg { count_include_pad },
            PoolGeometry { kernel: &kernel, stride, padding: &padding, dilation: &[], ceil_mode: false },
            loc,
        )
    }

    /// `F.adaptive_max_pool2d(x, (oh, ow))` (and 1-d with one size): the largest element of
    /// the input positions `floor(i * n / o) .. ceil((i + 1) * n / o)` of each spatial dim, one
    /// dim at a time (a window's maximum is the maximum of its rows' maxima); NaN propagates.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 2.0, 4.0, 3.0], &[1, 5])?;
    /// assert_eq!(x.adaptive_max_pool(&[2])?.to_vec::<f32>()?, vec![5.0, 4.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn adaptive_max_pool(&self, output_size: &[usize]) -> Result<Tensor> {
        let loc = Location::caller();
        let op = if output_size.len() == 1 { "adaptive_max_pool1d" } else { "adaptive_max_pool2d" };
        let _scope = CompositeScope::enter(op, &[self], loc);
        let nd = output_size.len();
        if !(1..=2).contains(&nd) {
            return fail(op, self, format!("expected 1 or 2 output sizes, got {output_size:?}"), loc);
        }
        self.check_spatial(op, nd, loc)?;
        let rank = self.rank();
        let mut y = self.clone();
        for (i, &o) in output_size.iter().enumerate() {
            let d = rank - nd + i;
            let n = self.shape()[d];
            if o == 0 || n == 0 {
                return fail(
                    op,
                    self,
                    format!("output size {output_size:?} and input {:?} must be positive", self.shape()),
                    loc,
                );
            }
            // Window r along dim d: a [o, n] mask; the others' elements become -inf.
            let mut inside = vec![false; o * n];
            for r in 0..o {
                for c in r * n / o..((r + 1) * n).div_ceil(o) {
                    inside[r * n + c] = true;
                }
            }
            let mask = Tensor::from_vec(inside, &[o, n])?.to_device(self.device())?;
            let x = y.movedim(d as i64, -1)?.unsqueeze(-2)?;
            let windows = crate::ops::pointwise::where_(&mask, &x, f64::NEG_INFINITY)?;
            y = windows.amax(&[-1], false)?.movedim(-1, d as i64)?;
        }
        Ok(y)
    }

    /// `F.adaptive_avg_pool2d(x, (oh, ow))` (and 1-d with one size): output cell `i` averages
    /// input positions `floor(i * n / o) .. ceil((i + 1) * n / o)` of each spatial dim, as a
    /// product with an averaging matrix per dim.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec((0..16).map(|v| v as f32).collect(), &[1, 4, 4])?;
    /// assert_eq!(x.adaptive_avg_pool(&[1, 1])?.to_vec::<f32>()?, vec![7.5]);
    /// assert_eq!(x.adaptive_avg_pool(&[2, 2])?.to_vec::<f32>()?, vec![2.5, 4.5, 10.5, 12.5]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn adaptive_avg_pool(&self, output_size: &[usize]) -> Result<Tensor> {
        let loc = Location::caller();
        let op = if output_size.len() == 1 { "adaptive_avg_pool1d" } else { "adaptive_avg_pool2d" };
        let _scope = CompositeScope::enter(op, &[self], loc);
        let nd = output_size.len();
        if !(1..=2).contains(&nd) {
            return fail(op, self, format!("expected 1 or 2 output sizes, got {output_size:?}"), loc);
        }
        self.check_spatial(op, nd, loc)?;
        let rank = self.rank();
        let mut y = self.clone();
        for (i, &o) in output_size.iter().enumerate() {
            let d = rank - nd + i;
            let n = self.shape()[d];
            if o == 0 {
                return fail(op, self, format!("output size must be positive, got {output_size:?}"), loc);
            }
            let mut a = vec![0.0f64; o * n];
            for r in 0..o {
                let (start, end) = (r * n / o, ((r + 1) * n).div_ceil(o));
                for c in start..end {
                    a[r * n + c] = 1.0 / (end - start) as f64;
                }
            }
            let a = Tensor::from_vec(a, &[o, n])?.to_dtype(self.dtype())?.to_device(self.device())?;
            // Contract dim d with the matrix: move it last, multiply by a^T, move it back.
            y = y.movedim(d as i64, -1)?.matmul(&a.t()?)?.movedim(-1, d as i64)?;
        }
        Ok(y)
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
}
