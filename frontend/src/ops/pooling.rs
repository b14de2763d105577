//! Pooling over the last 1 to 3 dims of `[N, C, *spatial]` (or the middle ones of a
//! channels-last `[N, H, W, C]`: `max_pool2d_channels_last`), written with pads and strided
//! slices: `max_pool` / `avg_pool` (one strided slice of the padded input per kernel offset,
//! combined with `maximum` or summed; `ceil_mode` and dilation as PyTorch), and the adaptive
//! pools (`adaptive_avg_pool`: a product with an averaging matrix per dim; `adaptive_max_pool`:
//! window masks and `amax`).

use crate::ops::composite::CompositeScope;
use crate::ops::pointwise::where_;
use crate::ops::shape::Loc;
use crate::ops::vision::along;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Result};
use std::panic::Location;

fn fail<T>(op: &str, x: &Tensor, msg: String, loc: Loc) -> Result<T> {
    Err(Tensor::error(op, &[x], Error::shape(msg), loc))
}

/// Pooling: the largest element of each window, or the mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    /// The largest element of the window (padding never wins).
    Max,
    /// The mean over the window; `count_include_pad` counts the padding zeros in the divisor
    /// (PyTorch's default).
    Avg {
        /// Count padding elements in the mean's divisor.
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
    /// The spatial dims are those after the batch, the channels last (`[N, *spatial, C]`).
    channels_last: bool,
}

/// The largest of `windows` (one strided view of the padded input per kernel offset, in
/// window order), as `max_pool2d_with_indices` picks it: the first maximum in window order,
/// or the last NaN (`val > max || isnan(val)`). The forward finds the offset (`arg`, a small
/// integer per output), then selects that window's value: `sum_k where(arg == k, w_k, -0.0)`,
/// exact for every value, signed zeros included (`x + -0.0 == x`). So the gradient is PyTorch's:
/// all of it goes to the chosen element (ties are not shared, as `maximum`'s gradient would
/// share them), and each window's share is `where(arg == k, g, 0)`, which the slices' gradients
/// place by index arithmetic: one pointwise kernel gathers an input position's gradient from the
/// windows that can hold it, with no scatter. (A window whose real elements are all `-inf`
/// may pick a padding position, whose gradient is dropped; PyTorch picks the first real one.)
fn select_max(windows: &[Tensor]) -> Result<Tensor> {
    let index = if windows.len() <= i8::MAX as usize { DType::I8 } else { DType::I32 };
    if windows.len() == 1 {
        return Ok(windows[0].clone());
    }
    let (mut best, mut arg) = (windows[0].clone(), None);
    for (k, w) in windows.iter().enumerate().skip(1) {
        let take = w.gt(&best)?.logical_or(&w.isnan()?)?;
        best = where_(&take, w, &best)?;
        arg = Some(match arg {
            None => take.to_dtype(index)?,
            Some(arg) => where_(&take, k as i64, &arg)?,
        });
    }
    let arg = arg.expect("two windows or more");
    let mut y: Option<Tensor> = None;
    for (k, w) in windows.iter().enumerate() {
        let picked = where_(&arg.eq(k as i64)?, w, -0.0)?;
        y = Some(match y {
            None => picked,
            Some(y) => y.add(&picked)?,
        });
    }
    Ok(y.expect("a kernel has at least one offset"))
}

impl Tensor {
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
        // Spatial dim `i` of the tensor.
        let first = if g.channels_last { 1 } else { rank - nd };
        let (mut out_sizes, mut overhang) = (Vec::with_capacity(nd), Vec::with_capacity(nd));
        for i in 0..nd {
            let (k, s, p, d, n) = (g.kernel[i], stride[i], g.padding[i], dilation[i], self.shape()[first + i]);
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
        // `pad` takes the last dim's pair first: the channels' (none) when they are last.
        let channels = if g.channels_last { vec![0, 0] } else { vec![] };
        let pads: Vec<i64> = (channels.into_iter())
            .chain((0..nd).rev().flat_map(|i| [g.padding[i] as i64, (g.padding[i] + overhang[i]) as i64]))
            .collect();
        let padded = if pads.iter().any(|&p| p > 0) { self.pad(&pads, fill)? } else { self.clone() };
        let offsets: Vec<Vec<usize>> = g.kernel.iter().fold(vec![vec![]], |acc, &k| {
            acc.iter().flat_map(|o| (0..k).map(move |j| [o.clone(), vec![j]].concat())).collect()
        });
        let mut windows = Vec::with_capacity(offsets.len());
        for offset in &offsets {
            let mut w = padded.clone();
            for i in 0..nd {
                let start = (offset[i] * dilation[i]) as i64;
                let end = start + (stride[i] * (out_sizes[i] - 1)) as i64 + 1;
                w = w.slice((first + i) as i64, Some(start), Some(end), stride[i] as i64)?;
            }
            windows.push(w);
        }
        let Pool::Avg { count_include_pad } = kind else { return select_max(&windows) };
        let mut total = windows[0].clone();
        for w in &windows[1..] {
            total = total.add(w)?;
        }
        // The divisor of each window, a product over dims: the window's positions inside the
        // padded input (or the input alone without count_include_pad), as PyTorch counts them.
        let mut divisor: Option<Tensor> = None;
        for i in 0..nd {
            let (k, s, p, n) =
                (g.kernel[i] as i64, stride[i] as i64, g.padding[i] as i64, self.shape()[first + i] as i64);
            let (lo, hi) = if count_include_pad { (-p, n + p) } else { (0, n) };
            let counts: Vec<f64> = (0..out_sizes[i] as i64)
                .map(|o| {
                    let start = o * s - p;
                    ((start + k).min(hi) - start.max(lo)).max(0) as f64
                })
                .collect();
            let c = along(counts, first + i, rank, self.dtype(), self)?;
            divisor = Some(match divisor {
                None => c,
                Some(dv) => dv.mul(&c)?,
            });
        }
        total.div(divisor.expect("at least one spatial dim"))
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
        self.pool(
            op,
            Pool::Max,
            PoolGeometry { kernel, stride, padding, dilation, ceil_mode, channels_last: false },
            loc,
        )
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
        let g = PoolGeometry { kernel, stride, padding, dilation: &[], ceil_mode, channels_last: false };
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
            PoolGeometry {
                kernel: &kernel,
                stride,
                padding: &padding,
                dilation: &[],
                ceil_mode: false,
                channels_last: false,
            },
            loc,
        )
    }

    /// [`Tensor::max_pool2d`] of channels-last `[N, H, W, C]` (the same values, permuted):
    /// computed in that layout, so a network that keeps its activations channels-last never
    /// transposes one for pooling.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::randn(&[2, 3, 7, 6], coil_ir::DType::F32)?;
    /// let want = x.max_pool2d([3, 3], &[2, 2], [1, 1])?.permute(&[0, 2, 3, 1])?;
    /// let got = x.permute(&[0, 2, 3, 1])?.max_pool2d_channels_last([3, 3], &[2, 2], [1, 1])?;
    /// assert_eq!(got.to_vec::<f32>()?, want.to_vec::<f32>()?);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn max_pool2d_channels_last(
        &self,
        kernel: [usize; 2],
        stride: &[usize],
        padding: [usize; 2],
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("max_pool2d", &[self], loc);
        if self.rank() != 4 {
            return fail("max_pool2d", self, format!("expected [N, H, W, C], got {:?}", self.shape()), loc);
        }
        let g = PoolGeometry {
            kernel: &kernel,
            stride,
            padding: &padding,
            dilation: &[],
            ceil_mode: false,
            channels_last: true,
        };
        self.pool("max_pool2d", Pool::Max, g, loc)
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
            PoolGeometry {
                kernel: &kernel,
                stride,
                padding: &padding,
                dilation: &[],
                ceil_mode: false,
                channels_last: false,
            },
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
            PoolGeometry {
                kernel: &[kernel],
                stride: &stride,
                padding: &[padding],
                dilation: &[],
                ceil_mode: false,
                channels_last: false,
            },
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
            PoolGeometry {
                kernel: &[kernel],
                stride: &stride,
                padding: &[padding],
                dilation: &[],
                ceil_mode: false,
                channels_last: false,
            },
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
            PoolGeometry {
                kernel: &kernel,
                stride,
                padding: &padding,
                dilation: &[],
                ceil_mode: false,
                channels_last: false,
            },
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
            PoolGeometry {
                kernel: &kernel,
                stride,
                padding: &padding,
                dilation: &[],
                ceil_mode: false,
                channels_last: false,
            },
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
            let windows = where_(&mask, &x, f64::NEG_INFINITY)?;
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
}
