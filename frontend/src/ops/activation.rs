//! Activation functions (`torch.nn.functional`) written as compositions of primitives:
//! `leaky_relu`, `elu`, `selu`, `celu`, `mish`, `hardswish`, `hardsigmoid`, `hardtanh`, `relu6`,
//! `glu`, `logsigmoid`, `softmin`, `softsign`, `tanhshrink`, `hardshrink`, `softshrink`,
//! `threshold`, `prelu`. Each is PyTorch's formula, with PyTorch's choice of branch at the
//! boundary (which decides the gradient there) and NaN propagation.

use crate::ops::composite::CompositeScope;
use crate::ops::math::require_float;
use crate::ops::pointwise::where_;
use crate::tensor::Tensor;
use coil_ir::{Error, Result};
use std::panic::Location;

/// SELU's constants, as in PyTorch.
const SELU_ALPHA: f64 = 1.673_263_242_354_377_3;
const SELU_SCALE: f64 = 1.050_700_987_355_480_5;

impl Tensor {
    /// `F.leaky_relu(x, negative_slope)`: `x` where positive, else `x * negative_slope`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-2.0f32, 3.0], &[2])?;
    /// assert_eq!(x.leaky_relu(0.01)?.to_vec::<f32>()?, vec![-0.02, 3.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn leaky_relu(&self, negative_slope: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("leaky_relu", &[self], loc);
        require_float("leaky_relu", self, loc)?;
        where_(&self.gt(0)?, self, &self.mul(negative_slope)?)
    }

    /// `F.elu(x, alpha)`: `x` where positive, else `alpha * (exp(x) - 1)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 2.0], &[2])?;
    /// assert_eq!(x.elu(1.0)?.to_vec::<f32>()?, vec![0.0, 2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn elu(&self, alpha: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("elu", &[self], loc);
        require_float("elu", self, loc)?;
        self.elu_scaled(alpha, 1.0, 1.0)
    }

    /// PyTorch's `elu` kernel: `x * scale` where positive, else
    /// `alpha * scale * expm1(x * input_scale)`.
    fn elu_scaled(&self, alpha: f64, scale: f64, input_scale: f64) -> Result<Tensor> {
        let positive = self.gt(0)?;
        // The negative branch sees only non-positive inputs, so exp cannot overflow into its gradient.
        let neg = where_(&positive, 0.0, self)?;
        let neg = if input_scale == 1.0 { neg } else { neg.mul(input_scale)? };
        let neg = neg.expm1()?.mul(alpha * scale)?;
        let pos = if scale == 1.0 { self.clone() } else { self.mul(scale)? };
        where_(&positive, &pos, &neg)
    }

    /// `F.selu(x)`: `scale * elu(x, alpha)` with PyTorch's constants.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0], &[2])?;
    /// let y = x.selu()?.to_vec::<f32>()?;
    /// assert!(y[0] == 0.0 && (y[1] - 1.0507).abs() < 1e-4);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn selu(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("selu", &[self], loc);
        require_float("selu", self, loc)?;
        self.elu_scaled(SELU_ALPHA, SELU_SCALE, 1.0)
    }

    /// `F.celu(x, alpha)`: `x` where positive, else `alpha * (exp(x / alpha) - 1)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![2.0f32], &[1])?;
    /// assert_eq!(x.celu(1.0)?.to_vec::<f32>()?, vec![2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn celu(&self, alpha: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("celu", &[self], loc);
        require_float("celu", self, loc)?;
        if alpha == 0.0 {
            return Err(Tensor::error(
                "celu",
                &[self],
                Error::value("ZeroDivisionError: alpha cannot be 0 for celu"),
                loc,
            ));
        }
        self.elu_scaled(alpha, 1.0, 1.0 / alpha)
    }

    /// `F.mish(x)`: `x * tanh(softplus(x))`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32], &[1])?;
    /// assert_eq!(x.mish()?.to_vec::<f32>()?, vec![0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn mish(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("mish", &[self], loc);
        require_float("mish", self, loc)?;
        self.mul(&self.softplus(1.0, 20.0)?.tanh()?)
    }

    /// `F.hardswish(x)`: `x * clamp(x + 3, 0, 6) / 6`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-4.0f32, 0.0, 4.0], &[3])?;
    /// assert_eq!(x.hardswish()?.to_vec::<f32>()?, vec![0.0, 0.0, 4.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn hardswish(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("hardswish", &[self], loc);
        require_float("hardswish", self, loc)?;
        self.mul(&self.add(3.0)?.clamp(Some(0.0), Some(6.0))?)?.div(6.0)
    }

    /// `F.hardsigmoid(x)`: `clamp(x + 3, 0, 6) / 6`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-4.0f32, 0.0, 4.0], &[3])?;
    /// assert_eq!(x.hardsigmoid()?.to_vec::<f32>()?, vec![0.0, 0.5, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn hardsigmoid(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("hardsigmoid", &[self], loc);
        require_float("hardsigmoid", self, loc)?;
        self.add(3.0)?.clamp(Some(0.0), Some(6.0))?.div(6.0)
    }

    /// `F.hardtanh(x, min_val, max_val)`: [`Tensor::clamp`] into `[min_val, max_val]`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-4.0f32, 0.5, 7.0], &[3])?;
    /// assert_eq!(x.hardtanh(-1.0, 1.0)?.to_vec::<f32>()?, vec![-1.0, 0.5, 1.0]);
    /// assert_eq!(x.relu6()?.to_vec::<f32>()?, vec![0.0, 0.5, 6.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn hardtanh(&self, min_val: f64, max_val: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("hardtanh", &[self], loc);
        if min_val > max_val {
            let e = Error::value(format!("min_val ({min_val}) cannot be greater than max_val ({max_val})"));
            return Err(Tensor::error("hardtanh", &[self], e, loc));
        }
        self.clamp(Some(min_val), Some(max_val))
    }

    /// `F.relu6(x)`: `hardtanh(x, 0, 6)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-1.0f32, 3.0, 9.0], &[3])?;
    /// assert_eq!(x.relu6()?.to_vec::<f32>()?, vec![0.0, 3.0, 6.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn relu6(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("relu6", &[self], Location::caller());
        self.hardtanh(0.0, 6.0)
    }

    /// `F.glu(x, dim)`: the first half of `dim` times the sigmoid of the second half; `dim`'s
    /// size must be even.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![2.0f32, 0.0], &[2])?;
    /// assert_eq!(x.glu(-1)?.to_vec::<f32>()?, vec![1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn glu(&self, dim: i64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("glu", &[self], loc);
        if self.rank() == 0 {
            return Err(Tensor::error("glu", &[self], Error::shape("glu does not support scalars"), loc));
        }
        let d = self.dim(dim, "glu", loc)?;
        let n = self.shape()[d];
        if !n.is_multiple_of(2) {
            let e = Error::shape(format!("Halving dimension must be even, but dimension {d} is size {n}"));
            return Err(Tensor::error("glu", &[self], e, loc));
        }
        let a = self.narrow(d as i64, 0, n / 2)?;
        let b = self.narrow(d as i64, (n / 2) as i64, n / 2)?;
        a.mul(&b.sigmoid()?)
    }

    /// `F.logsigmoid(x)`: `log(sigmoid(x))` as `-softplus(-x)`, finite for large negative `x`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-200.0f32, 0.0], &[2])?;
    /// let y = x.logsigmoid()?.to_vec::<f32>()?;
    /// assert!(y[0] == -200.0 && (y[1] + 2f32.ln()).abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn logsigmoid(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("logsigmoid", &[self], loc);
        require_float("logsigmoid", self, loc)?;
        self.neg()?.softplus(1.0, 20.0)?.neg()
    }

    /// `F.softmin(x, dim)`: `softmax(-x, dim)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 1.0], &[2])?;
    /// assert_eq!(x.softmin(0)?.to_vec::<f32>()?, vec![0.5, 0.5]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn softmin(&self, dim: i64) -> Result<Tensor> {
        let _scope = CompositeScope::enter("softmin", &[self], Location::caller());
        self.neg()?.softmax(dim)
    }

    /// `F.softsign(x)`: `x / (1 + |x|)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, -3.0], &[2])?;
    /// assert_eq!(x.softsign()?.to_vec::<f32>()?, vec![0.5, -0.75]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn softsign(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("softsign", &[self], Location::caller());
        self.div(&self.abs()?.add(1)?)
    }

    /// `F.tanhshrink(x)`: `x - tanh(x)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32], &[1])?;
    /// assert_eq!(x.tanhshrink()?.to_vec::<f32>()?, vec![0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn tanhshrink(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("tanhshrink", &[self], Location::caller());
        self.sub(&self.tanh()?)
    }

    /// `F.hardshrink(x, lambd)`: 0 inside `[-lambd, lambd]`, `x` outside (and for NaN).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-1.0f32, 0.25, 2.0], &[3])?;
    /// assert_eq!(x.hardshrink(0.5)?.to_vec::<f32>()?, vec![-1.0, 0.0, 2.0]);
    /// assert_eq!(x.softshrink(0.5)?.to_vec::<f32>()?, vec![-0.5, 0.0, 1.5]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn hardshrink(&self, lambd: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("hardshrink", &[self], loc);
        require_float("hardshrink", self, loc)?;
        let inside = self.ge(-lambd)?.logical_and(&self.le(lambd)?)?;
        where_(&inside, 0.0, self)
    }

    /// `F.softshrink(x, lambd)`: `x - lambd` above `lambd`, `x + lambd` below `-lambd`, 0
    /// between; NaN stays NaN. `lambd` must not be negative.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-2.0f32, 0.1, f32::NAN], &[3])?;
    /// let y = x.softshrink(0.5)?.to_vec::<f32>()?;
    /// assert!(y[0] == -1.5 && y[1] == 0.0 && y[2].is_nan());
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn softshrink(&self, lambd: f64) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("softshrink", &[self], loc);
        require_float("softshrink", self, loc)?;
        if lambd < 0.0 {
            let e = Error::value(format!("lambda must be greater or equal to 0, but found to be {lambd}."));
            return Err(Tensor::error("softshrink", &[self], e, loc));
        }
        // `x * 0` in the middle keeps NaN, as PyTorch's kernel does.
        let middle = where_(&self.lt(-lambd)?, &self.add(lambd)?, &self.mul(0.0)?)?;
        where_(&self.gt(lambd)?, &self.sub(lambd)?, &middle)
    }

    /// `F.threshold(x, threshold, value)`: `value` where `x <= threshold`, else `x`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.5f32, 2.0], &[2])?;
    /// assert_eq!(x.threshold(1.0, -1.0)?.to_vec::<f32>()?, vec![-1.0, 2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn threshold(&self, threshold: f64, value: f64) -> Result<Tensor> {
        let _scope = CompositeScope::enter("threshold", &[self], Location::caller());
        where_(&self.le(threshold)?, value, self)
    }

    /// `F.prelu(x, weight)`: `x` where positive, else `weight * x`; `weight` has one element or
    /// one per channel (dim 1 of `x`).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-1.0f32, -1.0, 1.0, -2.0], &[2, 2])?;
    /// let w = Tensor::from_vec(vec![0.5f32, 0.25], &[2])?;
    /// assert_eq!(x.prelu(&w)?.to_vec::<f32>()?, vec![-0.5, -0.25, 1.0, -0.5]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn prelu(&self, weight: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("prelu", &[self, weight], loc);
        require_float("prelu", self, loc)?;
        let n = weight.numel();
        let channels = if self.rank() >= 2 { self.shape()[1] } else { 1 };
        if weight.rank() > 1 || (n != 1 && n != channels) {
            let e = Error::shape(format!(
                "mismatch of parameter numbers and input channel size: weight has {n} elements, the input {channels} channels"
            ));
            return Err(Tensor::error("prelu", &[self, weight], e, loc));
        }
        // One weight per channel: [C] -> [C, 1, ..., 1] against dims 1.. of x.
        let w = if n == 1 || self.rank() < 2 {
            weight.reshape(&[])?
        } else {
            let mut shape = vec![n as i64];
            shape.extend(std::iter::repeat_n(1, self.rank() - 2));
            weight.reshape(&shape)?
        };
        where_(&self.gt(0)?, self, &self.mul(&w)?)
    }

    /// `F.rrelu(x, lower, upper, training=False)`: [`Tensor::leaky_relu`] with the mean slope
    /// `(lower + upper) / 2`. (In training PyTorch draws a slope per element; coil has only the
    /// evaluation form.)
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-4.0f32, 2.0], &[2])?;
    /// assert_eq!(x.rrelu(0.125, 0.375)?.to_vec::<f32>()?, vec![-1.0, 2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn rrelu(&self, lower: f64, upper: f64) -> Result<Tensor> {
        let _scope = CompositeScope::enter("rrelu", &[self], Location::caller());
        self.leaky_relu((lower + upper) / 2.0)
    }
}
