//! Pointwise math written as compositions of coil's primitives: `log10`, `frac`, hyperbolic
//! functions, `lerp`, `addcmul`, `hypot`, `xlogy`, `copysign`, `logaddexp`, ... Each follows
//! PyTorch's formula where PyTorch has a specific one (`lerp`'s two halves, `xlogy`'s zeros) and
//! a numerically careful one otherwise (`expm1` / `log1p` near zero, scaling against overflow),
//! so that results agree with PyTorch within the golden tolerance. Gradients come from the
//! decomposition.

use crate::ops::composite::{beside, CompositeScope};
use crate::ops::pointwise::{where_, IntoTensor};
use crate::ops::shape::Loc;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, Result, Scalar};
use std::f64::consts::{LN_2, LOG10_E, PI};
use std::panic::Location;

/// `x` as a floating tensor: integers and bools become f32 (PyTorch's default dtype), as
/// PyTorch's float functions promote them.
pub(crate) fn floating(x: &Tensor) -> Result<Tensor> {
    if x.dtype().is_float() {
        Ok(x.clone())
    } else {
        x.to_dtype(DType::F32)
    }
}

/// Computes `f` of `x` in f32 for f16 and bf16 (and integer) tensors and rounds once at the
/// end, as PyTorch's kernels compute half-precision math in float ("opmath").
pub(crate) fn in_opmath(x: &Tensor, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    match x.dtype() {
        DType::F16 | DType::BF16 => f(&x.to_dtype(DType::F32)?)?.to_dtype(x.dtype()),
        DType::F32 | DType::F64 => f(x),
        _ => f(&x.to_dtype(DType::F32)?),
    }
}

/// An error unless `x` is floating (for ops PyTorch implements only for floating dtypes).
pub(crate) fn require_float(op: &'static str, x: &Tensor, loc: Loc) -> Result<()> {
    if x.dtype().is_float() {
        return Ok(());
    }
    Err(Tensor::error(op, &[x], Error::dtype(format!("\"{op}\" not implemented for '{}'", x.dtype())), loc))
}

impl Tensor {
    /// `torch.log10(x)`: `log(x) * log10(e)`; integers give f32.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 100.0], &[2])?;
    /// let y = x.log10()?.to_vec::<f32>()?;
    /// assert!(y[0] == 0.0 && (y[1] - 2.0).abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn log10(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("log10", &[self], Location::caller());
        in_opmath(self, |x| x.log()?.mul(LOG10_E))
    }

    /// `torch.frac(x)`: `x - trunc(x)`, with the sign of `x`; floating dtypes only.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![2.5f32, -1.25], &[2])?;
    /// assert_eq!(x.frac()?.to_vec::<f32>()?, vec![0.5, -0.25]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn frac(&self) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("frac", &[self], loc);
        require_float("frac", self, loc)?;
        self.sub(&self.trunc()?)
    }

    /// `torch.clamp_min(x, min)`: [`Tensor::clamp`] with only a lower bound.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-1.0f32, 2.0], &[2])?;
    /// assert_eq!(x.clamp_min(0.0)?.to_vec::<f32>()?, vec![0.0, 2.0]);
    /// assert_eq!(x.clamp_max(0.0)?.to_vec::<f32>()?, vec![-1.0, 0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn clamp_min(&self, min: impl Into<coil_ir::Scalar>) -> Result<Tensor> {
        self.clamp(Some(min), None::<f64>)
    }

    /// `torch.clamp_max(x, max)`: [`Tensor::clamp`] with only an upper bound.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-1i64, 5], &[2])?;
    /// assert_eq!(x.clamp_max(2)?.to_vec::<i64>()?, vec![-1, 2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn clamp_max(&self, max: impl Into<coil_ir::Scalar>) -> Result<Tensor> {
        self.clamp(None::<f64>, Some(max))
    }

    /// `torch.clamp(x, min=lo, max=hi)` with tensor bounds (broadcast): `minimum(maximum(x, lo),
    /// hi)`, so NaN in any operand gives NaN and `hi` wins where `lo > hi`, as in PyTorch.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-1.0f32, 5.0], &[2])?;
    /// let lo = Tensor::from_vec(vec![0.0f32, 0.0], &[2])?;
    /// let hi = Tensor::from_vec(vec![1.0f32], &[1])?;
    /// assert_eq!(x.clamp_tensor(Some(&lo), Some(&hi))?.to_vec::<f32>()?, vec![0.0, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn clamp_tensor(&self, min: Option<&Tensor>, max: Option<&Tensor>) -> Result<Tensor> {
        let loc = Location::caller();
        let mut srcs = vec![self];
        srcs.extend(min);
        srcs.extend(max);
        let _scope = CompositeScope::enter("clamp", &srcs, loc);
        if min.is_none() && max.is_none() {
            return Err(Tensor::error("clamp", &srcs, Error::value("at least one of min or max must be given"), loc));
        }
        let mut x = self.clone();
        if let Some(lo) = min {
            x = x.maximum(lo)?;
        }
        if let Some(hi) = max {
            x = x.minimum(hi)?;
        }
        Ok(x)
    }

    /// `torch.isfinite(x)`: neither NaN nor infinite; always true for integers and bools.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY], &[4])?;
    /// assert_eq!(x.isfinite()?.to_vec::<bool>()?, vec![true, false, false, false]);
    /// assert_eq!(x.isposinf()?.to_vec::<bool>()?, vec![false, false, true, false]);
    /// assert_eq!(x.isneginf()?.to_vec::<bool>()?, vec![false, false, false, true]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn isfinite(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("isfinite", &[self], Location::caller());
        if !self.dtype().is_float() {
            return self.eq(self); // integers are always finite
        }
        self.isnan()?.logical_or(&self.isinf()?)?.logical_not()
    }

    /// `torch.isposinf(x)`: equal to +infinity.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![f32::INFINITY, 1.0], &[2])?;
    /// assert_eq!(x.isposinf()?.to_vec::<bool>()?, vec![true, false]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn isposinf(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("isposinf", &[self], Location::caller());
        if !self.dtype().is_float() {
            return self.ne(self);
        }
        self.eq(f64::INFINITY)
    }

    /// `torch.isneginf(x)`: equal to -infinity.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![f32::NEG_INFINITY, 1.0], &[2])?;
    /// assert_eq!(x.isneginf()?.to_vec::<bool>()?, vec![true, false]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn isneginf(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("isneginf", &[self], Location::caller());
        if !self.dtype().is_float() {
            return self.ne(self);
        }
        self.eq(f64::NEG_INFINITY)
    }

    /// `torch.sinh(x)`: `(expm1(x) - expm1(-x)) / 2` (accurate near zero), and
    /// `sign(x) * exp(|x| - ln 2)` for `|x| > 20`, which stays finite as far as PyTorch's does.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0], &[2])?;
    /// let y = x.sinh()?.to_vec::<f32>()?;
    /// assert!(y[0] == 0.0 && (y[1] - 1f32.sinh()).abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn sinh(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("sinh", &[self], Location::caller());
        in_opmath(self, |x| {
            let big = x.abs()?.gt(20.0)?;
            // Each branch sees only the inputs it serves, so neither overflows into the other's gradient.
            let small_x = where_(&big, 0.0, x)?;
            let small = small_x.expm1()?.sub(&small_x.neg()?.expm1()?)?.mul(0.5)?;
            let big_x = where_(&big, x, 21.0)?;
            let large = big_x.abs()?.sub(LN_2)?.exp()?.mul(&big_x.sign()?)?;
            where_(&big, &large, &small)
        })
    }

    /// `torch.cosh(x)`: `(exp(x) + exp(-x)) / 2`, and `exp(|x| - ln 2)` for `|x| > 20`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32], &[1])?;
    /// assert_eq!(x.cosh()?.to_vec::<f32>()?, vec![1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn cosh(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("cosh", &[self], Location::caller());
        in_opmath(self, |x| {
            let big = x.abs()?.gt(20.0)?;
            let small_x = where_(&big, 0.0, x)?;
            let small = small_x.exp()?.add(&small_x.neg()?.exp()?)?.mul(0.5)?;
            let large = where_(&big, x, 21.0)?.abs()?.sub(LN_2)?.exp()?;
            where_(&big, &large, &small)
        })
    }

    /// `torch.asinh(x)`: `sign(x) * log1p(|x| + x^2 / (1 + sqrt(1 + x^2)))`, and
    /// `sign(x) * (log|x| + ln 2)` for `|x| > 1e8`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, -1.0], &[2])?;
    /// let y = x.asinh()?.to_vec::<f32>()?;
    /// assert!(y[0] == 0.0 && (y[1] - (-1f32).asinh()).abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn asinh(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("asinh", &[self], Location::caller());
        in_opmath(self, |x| {
            let a = x.abs()?;
            let big = a.gt(1e8)?;
            let s = where_(&big, 0.0, &a)?;
            let s2 = s.mul(&s)?;
            let small = s.add(&s2.div(&s2.add(1.0)?.sqrt()?.add(1.0)?)?)?.log1p()?;
            let large = where_(&big, &a, 1e9)?.log()?.add(LN_2)?;
            let magnitude = where_(&big, &large, &small)?;
            where_(&x.lt(0.0)?, &magnitude.neg()?, &magnitude)
        })
    }

    /// `torch.acosh(x)`: `log1p((x - 1) + sqrt((x - 1)(x + 1)))` (accurate near 1), and
    /// `log(x) + ln 2` for `x > 1e8`; NaN below 1.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 0.5], &[2])?;
    /// let y = x.acosh()?.to_vec::<f32>()?;
    /// assert!(y[0] == 0.0 && y[1].is_nan());
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn acosh(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("acosh", &[self], Location::caller());
        in_opmath(self, |x| {
            let big = x.gt(1e8)?;
            let s = where_(&big, 2.0, x)?;
            let t = s.sub(1.0)?;
            let small = t.add(&t.mul(&s.add(1.0)?)?.sqrt()?)?.log1p()?;
            let large = where_(&big, x, 1e9)?.log()?.add(LN_2)?;
            where_(&big, &large, &small)
        })
    }

    /// `torch.atanh(x)`: `log1p(2x / (1 - x)) / 2`; `±1` give `±inf`, `|x| > 1` NaN.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.0], &[3])?;
    /// let y = x.atanh()?.to_vec::<f32>()?;
    /// assert!(y[0] == 0.0 && y[1] == f32::INFINITY && y[2].is_nan());
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn atanh(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("atanh", &[self], Location::caller());
        in_opmath(self, |x| x.mul(2.0)?.div(&x.rsub(1.0)?)?.log1p()?.mul(0.5))
    }

    /// `torch.square(x)`: `x * x`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-3i64, 2], &[2])?;
    /// assert_eq!(x.square()?.to_vec::<i64>()?, vec![9, 4]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn square(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("square", &[self], Location::caller());
        if self.dtype() == DType::Bool {
            // PyTorch's square is pow(x, 2), which makes bools i64.
            let x = self.to_dtype(DType::I64)?;
            return x.mul(&x);
        }
        self.mul(self)
    }

    /// `torch.lerp(start, end, weight)`: PyTorch's two-sided formula, `start + w * (end - start)`
    /// for `|w| < 0.5` and `end - (end - start) * (1 - w)` otherwise, so `w = 1` gives `end`
    /// exactly. `weight` is a tensor or a scalar.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![0.0f32, 10.0], &[2])?;
    /// let b = Tensor::from_vec(vec![1.0f32, 20.0], &[2])?;
    /// assert_eq!(a.lerp(&b, 0.25)?.to_vec::<f32>()?, vec![0.25, 12.5]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn lerp(&self, end: &Tensor, weight: impl IntoTensor) -> Result<Tensor> {
        let loc = Location::caller();
        let weight = beside(self, weight)?;
        let _scope = CompositeScope::enter("lerp", &[self, end, &weight], loc);
        require_float("lerp", self, loc)?;
        if end.dtype() != self.dtype() || (!weight.is_weak_scalar() && weight.dtype() != self.dtype()) {
            let e = Error::dtype(format!(
                "expected dtype {} for `end` and `weight`, got {} and {}",
                self.dtype(),
                end.dtype(),
                weight.dtype()
            ));
            return Err(Tensor::error("lerp", &[self, end, &weight], e, loc));
        }
        let diff = end.sub(self)?;
        let low = self.add(&diff.mul(&weight)?)?;
        let high = end.sub(&diff.mul(&weight.rsub(1.0)?)?)?;
        where_(&weight.abs()?.lt(0.5)?, &low, &high)
    }

    /// `torch.addcmul(x, t1, t2, value=v)`: `x + v * t1 * t2`, broadcast.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 1.0], &[2])?;
    /// let a = Tensor::from_vec(vec![2.0f32, 3.0], &[2])?;
    /// assert_eq!(x.addcmul(&a, &a, 0.5)?.to_vec::<f32>()?, vec![3.0, 5.5]);
    /// assert_eq!(x.addcdiv(&a, &a, 2.0)?.to_vec::<f32>()?, vec![3.0, 3.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn addcmul(&self, tensor1: &Tensor, tensor2: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let _scope = CompositeScope::enter("addcmul", &[self, tensor1, tensor2], Location::caller());
        let value = value.into();
        // An integer value keeps integer tensors integers, as a Python int does in PyTorch.
        let prod = if value.as_f64() == 1.0 { tensor1.clone() } else { tensor1.mul(Tensor::weak_scalar(value))? };
        self.add(&prod.mul(tensor2)?)
    }

    /// `torch.addcdiv(x, t1, t2, value=v)`: `x + v * t1 / t2`, broadcast; integer `t1` and `t2`
    /// are an error, as in PyTorch.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32], &[1])?;
    /// let (a, b) = (Tensor::from_vec(vec![3.0f32], &[1])?, Tensor::from_vec(vec![2.0f32], &[1])?);
    /// assert_eq!(x.addcdiv(&a, &b, 2.0)?.to_vec::<f32>()?, vec![4.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn addcdiv(&self, tensor1: &Tensor, tensor2: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("addcdiv", &[self, tensor1, tensor2], loc);
        if !tensor1.dtype().is_float() && !tensor2.dtype().is_float() {
            let e = Error::dtype("integer division with addcdiv is not supported; use true division");
            return Err(Tensor::error("addcdiv", &[self, tensor1, tensor2], e, loc));
        }
        let value = value.into();
        let num = if value.as_f64() == 1.0 { tensor1.clone() } else { tensor1.mul(Tensor::weak_scalar(value))? };
        self.add(&num.div(tensor2)?)
    }

    /// `torch.hypot(a, b)`: `sqrt(a^2 + b^2)` computed as `m * sqrt(1 + (n / m)^2)` with `m` the
    /// larger magnitude, so it overflows only where the result does; an infinite operand gives
    /// infinity even against NaN, as C's `hypot`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![3.0f32, 3e30], &[2])?;
    /// let b = Tensor::from_vec(vec![4.0f32, 4e30], &[2])?;
    /// let y = a.hypot(&b)?.to_vec::<f32>()?;
    /// assert!((y[0] - 5.0).abs() < 1e-6 && (y[1] / 5e30 - 1.0).abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn hypot(&self, other: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("hypot", &[self, other], loc);
        require_float("hypot", self, loc)?;
        // The promoted dtype, read off a node that is never computed.
        let dtype = self.add(other)?.dtype();
        in_opmath(&self.to_dtype(dtype)?, |a| {
            let (a, b) = (a.abs()?, other.to_dtype(a.dtype())?.abs()?);
            let m = a.maximum(&b)?;
            let n = a.minimum(&b)?;
            let zero = m.eq(0.0)?;
            let safe_m = where_(&zero, 1.0, &m)?;
            let r = n.div(&safe_m)?;
            let h = safe_m.mul(&r.mul(&r)?.add(1.0)?.sqrt()?)?;
            let h = where_(&zero, 0.0, &h)?;
            where_(&a.isinf()?.logical_or(&b.isinf()?)?, f64::INFINITY, &h)
        })
    }

    /// `torch.logical_xor(a, b)`: exactly one of the two is non-zero; bool result.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![true, true, false], &[3])?;
    /// let b = Tensor::from_vec(vec![0.0f32, 2.0, 0.0], &[3])?;
    /// assert_eq!(a.logical_xor(&b)?.to_vec::<bool>()?, vec![true, false, false]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn logical_xor(&self, other: &Tensor) -> Result<Tensor> {
        let _scope = CompositeScope::enter("logical_xor", &[self, other], Location::caller());
        self.ne(0)?.ne(&other.ne(0)?)
    }

    /// `torch.xlogy(x, y)`: `x * log(y)`, with 0 where `x == 0` (unless `y` is NaN).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 2.0], &[2])?;
    /// let y = Tensor::from_vec(vec![0.0f32, 1.0], &[2])?;
    /// assert_eq!(x.xlogy(&y)?.to_vec::<f32>()?, vec![0.0, 0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn xlogy(&self, other: impl IntoTensor) -> Result<Tensor> {
        let other = beside(self, other)?;
        let _scope = CompositeScope::enter("xlogy", &[self, &other], Location::caller());
        let x = floating(self)?;
        let zero = x.eq(0.0)?.logical_and(&other.isnan()?.logical_not()?)?;
        // log(1) = 0 where x is 0: the product is 0 there, and so are both gradients, as in
        // PyTorch, without a log(0) = -inf to multiply.
        x.mul(&where_(&zero, 1.0, &other)?.log()?)
    }

    /// `torch.copysign(a, b)`: `|a|` with the sign of `b` (the sign bit: `-0.0` counts as
    /// negative); integers give f32.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], &[3])?;
    /// let b = Tensor::from_vec(vec![-1.0f32, 5.0, -0.0], &[3])?;
    /// assert_eq!(a.copysign(&b)?.to_vec::<f32>()?, vec![-1.0, 2.0, -3.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn copysign(&self, other: impl IntoTensor) -> Result<Tensor> {
        let other = beside(self, other)?;
        let _scope = CompositeScope::enter("copysign", &[self, &other], Location::caller());
        let a = floating(self)?;
        let b = floating(&other)?;
        // -0.0 == 0.0, but 1 / -0.0 is -inf: how the sign bit of a zero shows.
        let negative = b.lt(0.0)?.logical_or(&b.eq(0.0)?.logical_and(&b.reciprocal()?.lt(0.0)?)?)?;
        let magnitude = a.abs()?;
        where_(&negative, &magnitude.neg()?, &magnitude)
    }

    /// `torch.float_power(a, b)`: `pow` computed in f64, with an f64 result.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// use coil_ir::DType;
    /// let x = Tensor::from_vec(vec![2i64, 3], &[2])?;
    /// let y = x.float_power(2)?;
    /// assert_eq!((y.dtype(), y.to_vec::<f64>()?), (DType::F64, vec![4.0, 9.0]));
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn float_power(&self, exponent: impl IntoTensor) -> Result<Tensor> {
        let exponent = beside(self, exponent)?;
        let _scope = CompositeScope::enter("float_power", &[self, &exponent], Location::caller());
        self.to_dtype(DType::F64)?.pow(&exponent.to_dtype(DType::F64)?)
    }

    /// `torch.logaddexp(a, b)`: `log(exp(a) + exp(b))` as `max + log1p(exp(-|a - b|))`; equal
    /// infinities give themselves.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![0.0f32, 1000.0], &[2])?;
    /// let y = a.logaddexp(&a)?.to_vec::<f32>()?;
    /// assert!((y[0] - 2f32.ln()).abs() < 1e-6 && (y[1] - 1000.0 - 2f32.ln()).abs() < 1e-3);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn logaddexp(&self, other: &Tensor) -> Result<Tensor> {
        let _scope = CompositeScope::enter("logaddexp", &[self, other], Location::caller());
        self.log_add_exp_base(other, false)
    }

    /// `torch.logaddexp2(a, b)`: `log2(2^a + 2^b)`.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32], &[1])?;
    /// assert_eq!(x.logaddexp2(&x)?.to_vec::<f32>()?, vec![2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn logaddexp2(&self, other: &Tensor) -> Result<Tensor> {
        let _scope = CompositeScope::enter("logaddexp2", &[self, other], Location::caller());
        self.log_add_exp_base(other, true)
    }

    fn log_add_exp_base(&self, other: &Tensor, base2: bool) -> Result<Tensor> {
        let (a, b) = (floating(self)?, floating(other)?);
        let m = a.maximum(&b)?;
        let same = a.eq(&b)?;
        // Where a == b (infinities included) a - b may be NaN: use a zero difference there.
        let d = where_(&same, 0.0, &a.sub(&b)?.abs()?.neg()?)?;
        let tail = if base2 { d.exp2()?.log1p()?.div(LN_2)? } else { d.exp()?.log1p()? };
        // Equal infinities: m + log(2) is m itself.
        m.add(&where_(&same, if base2 { 1.0 } else { LN_2 }, &tail)?)
    }

    /// `torch.sinc(x)`: `sin(pi x) / (pi x)`, and 1 at 0.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0], &[2])?;
    /// let y = x.sinc()?.to_vec::<f32>()?;
    /// assert!(y[0] == 1.0 && y[1].abs() < 1e-6);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn sinc(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("sinc", &[self], Location::caller());
        in_opmath(self, |x| {
            let zero = x.eq(0.0)?;
            let px = where_(&zero, 1.0, x)?.mul(PI)?;
            where_(&zero, 1.0, &px.sin()?.div(&px)?)
        })
    }

    /// `torch.deg2rad(x)`: `x * pi / 180`; integers give f32.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![180.0f32], &[1])?;
    /// assert!((x.deg2rad()?.item::<f32>()? - std::f32::consts::PI).abs() < 1e-6);
    /// assert!((x.deg2rad()?.rad2deg()?.item::<f32>()? - 180.0).abs() < 1e-4);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn deg2rad(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("deg2rad", &[self], Location::caller());
        floating(self)?.mul(PI / 180.0)
    }

    /// `torch.rad2deg(x)`: `x * 180 / pi`; integers give f32.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![std::f32::consts::PI], &[1])?;
    /// assert!((x.rad2deg()?.item::<f32>()? - 180.0).abs() < 1e-4);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn rad2deg(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("rad2deg", &[self], Location::caller());
        floating(self)?.mul(180.0 / PI)
    }

    /// `torch.logit(x, eps)`: `log(x / (1 - x))`, `x` first clamped into `[eps, 1 - eps]` when
    /// `eps` is given.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.5f32, 0.0], &[2])?;
    /// assert_eq!(x.logit(None)?.to_vec::<f32>()?, vec![0.0, f32::NEG_INFINITY]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn logit(&self, eps: Option<f64>) -> Result<Tensor> {
        let _scope = CompositeScope::enter("logit", &[self], Location::caller());
        in_opmath(self, |x| {
            let x = match eps {
                Some(e) => x.clamp(Some(e), Some(1.0 - e))?,
                None => x.clone(),
            };
            x.div(&x.rsub(1.0)?)?.log()
        })
    }

    /// `torch.heaviside(x, values)`: 0 for negative `x`, 1 for positive, `values` where `x` is 0.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-1.0f32, 0.0, 2.0], &[3])?;
    /// let v = Tensor::from_vec(vec![0.5f32], &[1])?;
    /// assert_eq!(x.heaviside(&v)?.to_vec::<f32>()?, vec![0.0, 0.5, 1.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn heaviside(&self, values: &Tensor) -> Result<Tensor> {
        let loc = Location::caller();
        let _scope = CompositeScope::enter("heaviside", &[self, values], loc);
        if self.dtype() != values.dtype() {
            let e = Error::dtype(format!(
                "heaviside is not yet implemented for tensors with different dtypes ({} and {})",
                self.dtype(),
                values.dtype()
            ));
            return Err(Tensor::error("heaviside", &[self, values], e, loc));
        }
        let step = self.gt(0)?.to_dtype(self.dtype())?;
        where_(&self.eq(0)?, values, &step)
    }

    /// `torch.fmax(a, b)`: the larger of the two, ignoring NaN (NaN only where both are); on a
    /// tie the gradient goes to `a`, as in PyTorch.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, f32::NAN, 3.0], &[3])?;
    /// let b = Tensor::from_vec(vec![2.0f32, 5.0, f32::NAN], &[3])?;
    /// assert_eq!(a.fmax(&b)?.to_vec::<f32>()?, vec![2.0, 5.0, 3.0]);
    /// assert_eq!(a.fmin(&b)?.to_vec::<f32>()?, vec![1.0, 5.0, 3.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn fmax(&self, other: &Tensor) -> Result<Tensor> {
        let _scope = CompositeScope::enter("fmax", &[self, other], Location::caller());
        where_(&self.ge(other)?.logical_or(&other.isnan()?)?, self, other)
    }

    /// `torch.fmin(a, b)`: the smaller of the two, ignoring NaN.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![f32::NAN, 2.0], &[2])?;
    /// let b = Tensor::from_vec(vec![1.0f32, 3.0], &[2])?;
    /// assert_eq!(a.fmin(&b)?.to_vec::<f32>()?, vec![1.0, 2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn fmin(&self, other: &Tensor) -> Result<Tensor> {
        let _scope = CompositeScope::enter("fmin", &[self, other], Location::caller());
        where_(&self.le(other)?.logical_or(&other.isnan()?)?, self, other)
    }

    /// `torch.signbit(x)`: whether the sign bit is set (`-0.0` included; NaN's sign is not
    /// seen: false).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-1.0f32, -0.0, 0.0, 2.0], &[4])?;
    /// assert_eq!(x.signbit()?.to_vec::<bool>()?, vec![true, true, false, false]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn signbit(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("signbit", &[self], Location::caller());
        if !self.dtype().is_float() {
            return self.lt(0);
        }
        // -0.0 == 0.0, but 1 / -0.0 is -inf.
        self.lt(0.0)?.logical_or(&self.eq(0.0)?.logical_and(&self.reciprocal()?.lt(0.0)?)?)
    }

    /// `torch.special.xlog1py(x, y)`: `x * log1p(y)`, with 0 where `x == 0` (unless `y` is NaN).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 2.0], &[2])?;
    /// let y = Tensor::from_vec(vec![-1.0f32, 0.0], &[2])?;
    /// assert_eq!(x.xlog1py(&y)?.to_vec::<f32>()?, vec![0.0, 0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn xlog1py(&self, other: &Tensor) -> Result<Tensor> {
        let _scope = CompositeScope::enter("xlog1py", &[self, other], Location::caller());
        let x = floating(self)?;
        let zero = x.eq(0.0)?.logical_and(&other.isnan()?.logical_not()?)?;
        x.mul(&where_(&zero, 0.0, other)?.log1p()?)
    }

    /// `torch.special.entr(x)`: `-x log(x)` for positive `x`, 0 at 0, `-inf` below 0.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0, -1.0], &[3])?;
    /// assert_eq!(x.entr()?.to_vec::<f32>()?, vec![0.0, 0.0, f32::NEG_INFINITY]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn entr(&self) -> Result<Tensor> {
        let _scope = CompositeScope::enter("entr", &[self], Location::caller());
        let x = floating(self)?;
        let positive = x.gt(0.0)?;
        let safe = where_(&positive, &x, 1.0)?;
        let value = safe.mul(&safe.log()?)?.neg()?;
        let rest = where_(&x.eq(0.0)?, 0.0, &where_(&x.isnan()?, &x, f64::NEG_INFINITY)?)?;
        where_(&positive, &value, &rest)
    }

    /// `torch.fmod(a, b)`: the remainder of truncated division, with the sign of `a` (C's
    /// `fmod`). Exact, from [`Tensor::remainder`] (floored, the sign of `b`): where `|a| < |b|`
    /// the result is `a` itself; elsewhere `remainder`'s result is a multiple of `b`'s ulp, so
    /// moving it back by `b` where the signs differ rounds nothing. Integer division by zero is
    /// an error when the graph runs, as in PyTorch.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let a = Tensor::from_vec(vec![-7.5f32, 7.5, -1e-30, 1e30], &[4])?;
    /// let b = Tensor::from_vec(vec![2.0f32, -2.0, 1.0, 3.0], &[4])?;
    /// assert_eq!(a.fmod(&b)?.to_vec::<f32>()?, vec![-1.5, 1.5, -1e-30, 0.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn fmod(&self, other: impl IntoTensor) -> Result<Tensor> {
        let other = beside(self, other)?;
        let _scope = CompositeScope::enter("fmod", &[self, &other], Location::caller());
        let r = self.remainder(&other)?;
        let signs_differ = r.lt(0)?.ne(&self.lt(0)?)?;
        let adjust = r.ne(0)?.logical_and(&signs_differ)?;
        let truncated = where_(&adjust, &r.sub(&other)?, &r)?;
        where_(&self.abs()?.lt(&other.abs()?)?, self, &truncated)
    }
}
