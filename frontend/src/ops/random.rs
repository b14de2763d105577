//! Creation ops written with `rand` / `randn` / `iota` and pointwise ops: `normal`, `uniform`,
//! `bernoulli`, `randint` (all drawing from the thread's seeded Philox stream, so the same seed
//! gives the same numbers on every backend and device; the numbers are not PyTorch's), and
//! `logspace`, `empty`, `tril_indices`, `triu_indices`.

use crate::ops::composite::CompositeScope;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Result, Scalar};
use std::panic::Location;

impl Tensor {
    /// `torch.normal(mean, std, size)`: normal random numbers, `randn * std + mean`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// coil_frontend::manual_seed(0);
    /// let x = Tensor::normal(10.0, 0.5, &[1000], DType::F32)?;
    /// let mean = x.mean(&[], false)?.item::<f32>()?;
    /// assert!((mean - 10.0).abs() < 0.1);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn normal(mean: f64, std: f64, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("normal", &[], loc);
        if std.is_nan() || std < 0.0 {
            return Err(Error::value(format!("normal expects std >= 0.0, but found std {std}"))
                .in_op("normal", vec![])
                .at(loc));
        }
        Tensor::randn(shape, dtype)?.mul(std)?.add(mean)
    }

    /// `torch.empty(size)`: a tensor whose values are unspecified by contract. coil fills it
    /// with zeros (a lazy graph has no uninitialised memory to hand out), but code must not rely
    /// on that: as in PyTorch, write every element before reading it.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::empty(&[2, 3], DType::F32);
    /// assert_eq!(x.shape(), &[2, 3]);
    /// assert_eq!(x.empty_like().dtype(), DType::F32);
    /// ```
    #[track_caller]
    pub fn empty(shape: &[usize], dtype: DType) -> Tensor {
        Tensor::full(shape, 0, dtype)
    }

    /// `torch.empty_like(x)`: [`Tensor::empty`] of this tensor's shape, dtype and device.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2], &[2])?;
    /// let e = x.empty_like();
    /// assert_eq!((e.shape(), e.dtype()), (x.shape(), x.dtype()));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn empty_like(&self) -> Tensor {
        self.full_like(0)
    }

    /// `torch.rand(size) * (high - low) + low` (`Tensor.uniform_`): uniform random numbers in
    /// `[low, high)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::uniform(-2.0, 2.0, &[100], DType::F32)?.to_vec::<f32>()?;
    /// assert!(x.iter().all(|&v| (-2.0..2.0).contains(&v)));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn uniform(low: f64, high: f64, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("uniform", &[], loc);
        if low.is_nan() || high.is_nan() || low > high {
            let e = Error::value(format!("uniform expects low <= high, but found low={low} > high={high}"));
            return Err(e.in_op("uniform", vec![]).at(loc));
        }
        Tensor::rand(shape, dtype)?.mul(high - low)?.add(low)
    }

    /// `torch.bernoulli(p)`: 1 with probability `p` (each element of this tensor), else 0, in
    /// this tensor's dtype.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let p = Tensor::from_vec(vec![0.0f32, 1.0], &[2])?;
    /// assert_eq!(p.bernoulli()?.to_vec::<f32>()?, vec![0.0, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn bernoulli(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("bernoulli", &[self], Location::caller());
        self.rand_like()?.lt(self)?.to_dtype(self.dtype())
    }

    /// `torch.randint(low, high, size, dtype=dtype)`: uniform random integers in `[low, high)`
    /// (drawn as `floor(u * (high - low)) + low` from f64 uniforms).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::randint(3, 6, &[100], DType::I64)?.to_vec::<i64>()?;
    /// assert!(x.iter().all(|v| (3..6).contains(v)));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn randint(low: i64, high: i64, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("randint", &[], loc);
        Tensor::randint_on(low, high, shape, dtype, crate::tensor::default_device(), loc)
    }

    /// `torch.randint_like(x, low, high)`: [`Tensor::randint`] of this tensor's shape, dtype and
    /// device.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::zeros(&[50], coil_ir::DType::I32);
    /// let r = x.randint_like(0, 2)?.to_vec::<i32>()?;
    /// assert!(r.iter().all(|v| *v == 0 || *v == 1));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn randint_like(&self, low: i64, high: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("randint_like", &[self], loc);
        Tensor::randint_on(low, high, self.shape(), self.dtype(), self.device(), loc)
    }

    fn randint_on(
        low: i64,
        high: i64,
        shape: &[usize],
        dtype: DType,
        device: coil_runtime::Device,
        loc: &'static Location<'static>,
    ) -> Result<Tensor> {
        if low >= high {
            let e =
                Error::value(format!("random_ expects 'from' to be less than 'to', but got from={low} >= to={high}"));
            return Err(e.in_op("randint", vec![]).at(loc));
        }
        let n = (high as i128 - low as i128) as f64;
        let u = Tensor::rand(shape, DType::F64)?.to_device(device)?;
        // u < 1, but u * n may round up to n: clamp.
        let k = u.mul(n)?.floor()?.clamp(None::<f64>, Some(n - 1.0))?.to_dtype(DType::I64)?;
        k.add(low)?.to_dtype(dtype)
    }

    /// `torch.logspace(start, end, steps, base, dtype=dtype)`: `base ** linspace(start, end,
    /// steps)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::logspace(0.0, 2.0, 3, 10.0, DType::F32)?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![1.0, 10.0, 100.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn logspace(
        start: impl Into<Scalar>,
        end: impl Into<Scalar>,
        steps: usize,
        base: f64,
        dtype: DType,
    ) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("logspace", &[], loc);
        let exponents = Tensor::linspace(start, end, steps, if dtype.is_float() { dtype } else { DType::F64 })?;
        crate::ops::pointwise::pow(base, &exponents)?.to_dtype(dtype)
    }

    /// `torch.tril_indices(row, col, offset)`: the `[2, n]` i64 coordinates of the lower
    /// triangle (on and below the `offset` diagonal), row by row.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let i = Tensor::tril_indices(2, 2, 0)?;
    /// assert_eq!(i.to_vec::<i64>()?, vec![0, 1, 1, 0, 0, 1]);
    /// let j = Tensor::triu_indices(2, 2, 0)?;
    /// assert_eq!(j.to_vec::<i64>()?, vec![0, 0, 1, 0, 1, 1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn tril_indices(row: usize, col: usize, offset: i64) -> Result<Tensor> {
        Tensor::triangle_indices("tril_indices", row, col, |i, j| j <= i.saturating_add(offset))
    }

    /// `torch.triu_indices(row, col, offset)`: the coordinates of the upper triangle (on and
    /// above the `offset` diagonal).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let i = Tensor::triu_indices(2, 3, 1)?;
    /// assert_eq!(i.to_vec::<i64>()?, vec![0, 0, 1, 1, 2, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn triu_indices(row: usize, col: usize, offset: i64) -> Result<Tensor> {
        Tensor::triangle_indices("triu_indices", row, col, |i, j| j >= i.saturating_add(offset))
    }

    /// The coordinates `(i, j)` of a `row x col` grid where `inside(i, j)`: they depend on the
    /// arguments only, so they are computed here, as data.
    #[track_caller]
    fn triangle_indices(op: &str, row: usize, col: usize, inside: impl Fn(i64, i64) -> bool) -> Result<Tensor> {
        let (mut rows, mut cols) = (Vec::new(), Vec::new());
        // At most row * col of each: refuse what the host cannot hold rather than abort.
        let cells = row.saturating_mul(col);
        if rows.try_reserve(cells).is_err() || cols.try_reserve(cells).is_err() {
            return Err(Error::runtime(format!("out of memory: the indices of a {row} x {col} matrix"))
                .in_op(op, vec![])
                .at(Location::caller()));
        }
        for i in 0..row as i64 {
            for j in 0..col as i64 {
                if inside(i, j) {
                    rows.push(i);
                    cols.push(j);
                }
            }
        }
        let n = rows.len();
        rows.extend(cols);
        Tensor::from_vec(rows, &[2, n])?.to_device(crate::tensor::default_device())
    }

    /// `F.dropout1d` / `dropout2d` / `dropout3d(x, p, training)`: in training, zeroes whole
    /// channels (each with probability `p`, one draw per sample and channel of
    /// `[N, C, *spatial]` or `[C, *spatial]` with `spatial_dims` trailing dims) and scales the
    /// rest by `1 / (1 - p)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::ones(&[8, 16, 4, 4], DType::F32);
    /// let y = x.feature_dropout(0.5, true, 2)?.to_vec::<f32>()?;
    /// // Each 4 x 4 channel is all zeros or all twos.
    /// assert!(y.chunks(16).all(|c| c.iter().all(|&v| v == c[0]) && (c[0] == 0.0 || c[0] == 2.0)));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn feature_dropout(&self, p: f64, train: bool, spatial_dims: usize) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("feature_dropout", &[self], loc);
        self.channel_noise("feature_dropout", p, train, spatial_dims, false, loc)
    }

    /// `F.alpha_dropout(x, p, training)`: dropout for SELU networks, keeping the mean and
    /// variance: dropped elements become SELU's negative saturation value, then all are scaled
    /// and shifted (PyTorch's `a` and `b`).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// coil_frontend::manual_seed(3);
    /// let x = Tensor::randn(&[20000], DType::F32)?;
    /// let y = x.alpha_dropout(0.2, true)?;
    /// let (m, s) = (y.mean(&[], false)?.item::<f32>()?, y.std(&[], 0.0, false)?.item::<f32>()?);
    /// assert!(m.abs() < 0.05 && (s - 1.0).abs() < 0.05);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn alpha_dropout(&self, p: f64, train: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("alpha_dropout", &[self], loc);
        self.channel_noise("alpha_dropout", p, train, 0, true, loc)
    }

    /// `F.feature_alpha_dropout(x, p, training)`: [`Tensor::alpha_dropout`] of whole channels
    /// (dims 2.. of `[N, C, ...]` share a draw).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::ones(&[2, 3, 4], coil_ir::DType::F32);
    /// assert_eq!(x.feature_alpha_dropout(0.5, false)?.to_vec::<f32>()?, vec![1.0; 24]);
    /// let y = x.feature_alpha_dropout(0.5, true)?.to_vec::<f32>()?;
    /// assert!(y.chunks(4).all(|c| c.iter().all(|&v| v == c[0])));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn feature_alpha_dropout(&self, p: f64, train: bool) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("feature_alpha_dropout", &[self], loc);
        self.channel_noise("feature_alpha_dropout", p, train, self.rank().saturating_sub(2), true, loc)
    }

    /// Dropout with one draw per element of the leading `rank - shared_dims` dims (the trailing
    /// `shared_dims` share it: 0 draws per element); `alpha` selects alpha dropout's affine
    /// noise.
    fn channel_noise(
        &self,
        op: &'static str,
        p: f64,
        train: bool,
        shared_dims: usize,
        alpha: bool,
        loc: &'static Location<'static>,
    ) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&p) {
            let e = Error::value(format!("dropout probability has to be between 0 and 1, but got {p}"));
            return Err(Tensor::error(op, &[self], e, loc));
        }
        if !train || p == 0.0 || self.numel() == 0 {
            return Ok(self.clone());
        }
        if !self.dtype().is_float() {
            let e = Error::dtype(format!("{op} expects a floating tensor, got {}", self.dtype()));
            return Err(Tensor::error(op, &[self], e, loc));
        }
        let shared = shared_dims.min(self.rank());
        let mut noise_shape = self.shape().to_vec();
        for d in noise_shape.iter_mut().skip(self.rank() - shared) {
            *d = 1;
        }
        if p == 1.0 {
            // PyTorch returns `x * 0` without drawing random numbers.
            return self.mul(0.0);
        }
        let keep = Tensor::rand(&noise_shape, self.dtype())?.to_device(self.device())?.ge(p)?.to_dtype(self.dtype())?;
        if !alpha {
            return self.mul(&keep)?.div(1.0 - p);
        }
        // PyTorch's constants: alpha' = -scale * alpha of SELU.
        const ALPHA: f64 = 1.758_099_340_847_376_6;
        let a = 1.0 / ((ALPHA * ALPHA * p + 1.0) * (1.0 - p)).sqrt();
        let b = keep.sub(1.0)?.mul(ALPHA * a)?.add(ALPHA * a * p)?;
        self.mul(&keep.mul(a)?)?.add(&b)
    }
}
