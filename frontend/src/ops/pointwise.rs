//! Pointwise ops: math, comparisons, logic, casts, `where`, and the activation functions.

use crate::tensor::Tensor;
use coil_ir::{BinaryOp, DType, Error, Op, Result, Scalar, UnaryOp};
use std::panic::Location;

/// Anything that can stand as a tensor operand: a tensor (by value or reference) or a Rust
/// scalar, which is weak in type promotion.
pub trait IntoTensor {
    /// The operand as a tensor (a Rust scalar becomes a weak scalar node).
    #[track_caller]
    fn into_tensor(self) -> Tensor;
}

impl IntoTensor for Tensor {
    fn into_tensor(self) -> Tensor {
        self
    }
}

impl IntoTensor for &Tensor {
    fn into_tensor(self) -> Tensor {
        self.clone()
    }
}

macro_rules! scalar_operand {
    ($($t:ty),*) => {$(
        impl IntoTensor for $t {
            #[track_caller]
            fn into_tensor(self) -> Tensor {
                Tensor::weak_scalar(Scalar::from(self))
            }
        }
    )*};
}
scalar_operand!(f64, f32, i64, i32, bool);

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor {$(
            $(#[$doc])*
            #[track_caller]
            pub fn $name(&self) -> Result<Tensor> {
                Tensor::record(Op::Unary(UnaryOp::$op), &[self], Location::caller())
            }
        )*}
    };
}

unary_methods! {
    /// `torch.neg`: `-x`.
    neg => Neg,
    /// `torch.abs`: `|x|`.
    abs => Abs,
    /// `torch.sign`: -1, 0 or 1 by the sign of `x` (0 for NaN, as PyTorch).
    sign => Sign,
    /// `torch.exp`: `e^x`.
    exp => Exp,
    /// `torch.exp2`: `2^x`.
    exp2 => Exp2,
    /// `torch.expm1`: `e^x - 1`, accurate near 0.
    expm1 => Expm1,
    /// `torch.log`: the natural logarithm (NaN below 0, `-inf` at 0).
    log => Log,
    /// `torch.log2`: the base-2 logarithm.
    log2 => Log2,
    /// `torch.log1p`: `ln(1 + x)`, accurate near 0.
    log1p => Log1p,
    /// `torch.sqrt`: the square root (NaN below 0).
    sqrt => Sqrt,
    /// `torch.rsqrt`: `1 / sqrt(x)`.
    rsqrt => Rsqrt,
    /// `torch.sin`, in radians.
    sin => Sin,
    /// `torch.cos`, in radians.
    cos => Cos,
    /// `torch.tan`, in radians.
    tan => Tan,
    /// `torch.atan` (`arctan`): in `[-pi/2, pi/2]`; integers give f32.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, f32::NEG_INFINITY], &[2])?;
    /// assert_eq!(x.atan()?.to_vec::<f32>()?, vec![std::f32::consts::FRAC_PI_4, -std::f32::consts::FRAC_PI_2]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    atan => Atan,
    /// `torch.asin` (`arcsin`): NaN outside `[-1, 1]`.
    asin => Asin,
    /// `torch.acos` (`arccos`): NaN outside `[-1, 1]`.
    acos => Acos,
    /// `torch.tanh`: the hyperbolic tangent.
    tanh => Tanh,
    /// `torch.sigmoid`: `1 / (1 + e^-x)`.
    sigmoid => Sigmoid,
    /// `torch.erf`: the error function.
    erf => Erf,
    /// `torch.erfc`: `1 - erf(x)`, accurate where that difference would round to 0
    /// (`erfc(10) = 2.09e-45`).
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![10.0f64, -1.0], &[2])?;
    /// let y = x.erfc()?.to_vec::<f64>()?;
    /// assert!((y[0] / 2.088487583762545e-45 - 1.0).abs() < 1e-13 && (y[1] - 1.8427007929497148).abs() < 1e-15);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    erfc => Erfc,
    /// `torch.erfinv`: the inverse of `erf` on `(-1, 1)`; `±1` give `±inf`, `|x| > 1` NaN.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0.5f64, -1.0], &[2])?;
    /// let y = x.erfinv()?.to_vec::<f64>()?;
    /// assert!((y[0] - 0.4769362762044699).abs() < 1e-15 && y[1] == f64::NEG_INFINITY);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    erfinv => Erfinv,
    /// `torch.floor`: the largest integer not above `x`.
    floor => Floor,
    /// `torch.ceil`: the smallest integer not below `x`.
    ceil => Ceil,
    /// Rounds half to even, as `torch.round`.
    round => Round,
    /// `torch.trunc`: rounds toward zero.
    trunc => Trunc,
    /// `torch.reciprocal`: `1 / x`.
    reciprocal => Reciprocal,
    /// `torch.logical_not`: a bool tensor, true where `x` is zero.
    logical_not => LogicalNot,
    /// `torch.isnan`: a bool tensor, true where `x` is NaN.
    isnan => IsNan,
    /// `torch.isinf`: a bool tensor, true where `x` is `±inf`.
    isinf => IsInf,
    /// `torch.bitwise_not` (`~x`, and `!x` in Rust): every bit flipped for integers,
    /// `logical_not` for bools; floats are an error.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![0i32, 5, -1], &[3])?;
    /// assert_eq!(x.bitwise_not()?.to_vec::<i32>()?, vec![-1, -6, 0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    bitwise_not => BitwiseNot,
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor {$(
            $(#[$doc])*
            #[track_caller]
            pub fn $name(&self, other: impl IntoTensor) -> Result<Tensor> {
                let other = other.into_tensor();
                Tensor::record(Op::Binary(BinaryOp::$op), &[self, &other], Location::caller())
            }
        )*}
    };
}

binary_methods! {
    /// `torch.add` (`+`), with type promotion and broadcasting as every binary op.
    add => Add,
    /// `torch.sub` (`-`).
    sub => Sub,
    /// `torch.mul` (`*`).
    mul => Mul,
    /// True division: integers divide as floats.
    div => Div,
    /// `torch.div(a, b, rounding_mode="floor")` (`torch.floor_divide`).
    floor_divide => FloorDiv,
    /// `torch.div(a, b, rounding_mode="trunc")`.
    trunc_divide => TruncDiv,
    /// `torch.remainder`: the result has the divisor's sign.
    remainder => Remainder,
    /// `torch.pow`: `self` to the power `other`.
    pow => Pow,
    /// Elementwise maximum; NaN propagates.
    maximum => Maximum,
    /// Elementwise minimum; NaN propagates.
    minimum => Minimum,
    /// `torch.eq` (`==`): a bool tensor.
    eq => Eq,
    /// `torch.ne` (`!=`): a bool tensor.
    ne => Ne,
    /// `torch.lt` (`<`): a bool tensor.
    lt => Lt,
    /// `torch.le` (`<=`): a bool tensor.
    le => Le,
    /// `torch.gt` (`>`): a bool tensor.
    gt => Gt,
    /// `torch.ge` (`>=`): a bool tensor.
    ge => Ge,
    /// `torch.logical_and`: a bool tensor, true where both are nonzero.
    logical_and => LogicalAnd,
    /// `torch.logical_or`: a bool tensor, true where either is nonzero.
    logical_or => LogicalOr,
    /// `torch.atan2(self, other)` (`arctan2`): the angle of the point `(other, self)` in
    /// `[-pi, pi]`, as C's `atan2` (signed zeros and infinities included); integers give f32.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let y = Tensor::from_vec(vec![1.0f32, 0.0], &[2])?;
    /// let x = Tensor::from_vec(vec![-1.0f32, -0.0], &[2])?;
    /// let pi = std::f32::consts::PI;
    /// assert_eq!(y.atan2(&x)?.to_vec::<f32>()?, vec![0.75 * pi, pi]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    atan2 => Atan2,
    /// `torch.bitwise_and` (`&`) of integers or bools.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![12i64, -1], &[2])?;
    /// assert_eq!(x.bitwise_and(10)?.to_vec::<i64>()?, vec![8, 10]);
    /// assert_eq!((&x | 3).to_vec::<i64>()?, vec![15, -1]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    bitwise_and => BitwiseAnd,
    /// `torch.bitwise_or` (`|`) of integers or bools.
    bitwise_or => BitwiseOr,
    /// `torch.bitwise_xor` (`^`) of integers or bools.
    bitwise_xor => BitwiseXor,
    /// `torch.bitwise_left_shift` (`<<`) of integers: bits shifted past the dtype's width are
    /// lost, and shifting by a negative amount or by the width or more gives 0, as PyTorch's CPU
    /// kernels.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 3, -1], &[3])?;
    /// let n = Tensor::from_vec(vec![31i32, 32, -1], &[3])?;
    /// assert_eq!(x.bitwise_left_shift(&n)?.to_vec::<i32>()?, vec![i32::MIN, 0, 0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    bitwise_left_shift => ShiftLeft,
    /// `torch.bitwise_right_shift` (`>>`) of integers, arithmetic for the signed dtypes: shifting
    /// by a negative amount or past the value bits leaves the sign fill (0 or -1), as PyTorch's
    /// CPU kernels.
    ///
    /// ```
    /// use coil_frontend::Tensor;
    /// let x = Tensor::from_vec(vec![-7i64, -7, 7], &[3])?;
    /// assert_eq!((x >> 1).to_vec::<i64>()?, vec![-4, -4, 3]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    bitwise_right_shift => ShiftRight,
}

impl Tensor {
    /// `torch.arctan`, PyTorch's alias of [`Tensor::atan`].
    #[track_caller]
    pub fn arctan(&self) -> Result<Tensor> {
        self.atan()
    }

    /// `torch.arcsin`, PyTorch's alias of [`Tensor::asin`].
    #[track_caller]
    pub fn arcsin(&self) -> Result<Tensor> {
        self.asin()
    }

    /// `torch.arccos`, PyTorch's alias of [`Tensor::acos`].
    #[track_caller]
    pub fn arccos(&self) -> Result<Tensor> {
        self.acos()
    }

    /// `torch.arctan2`, PyTorch's alias of [`Tensor::atan2`].
    #[track_caller]
    pub fn arctan2(&self, other: impl IntoTensor) -> Result<Tensor> {
        self.atan2(other)
    }
}

/// `base ** exponent` where the base may be a scalar (`pow(2.0, &x)`).
#[track_caller]
pub fn pow(base: impl IntoTensor, exponent: impl IntoTensor) -> Result<Tensor> {
    let (b, e) = (base.into_tensor(), exponent.into_tensor());
    Tensor::record(Op::Binary(BinaryOp::Pow), &[&b, &e], Location::caller())
}

/// `torch.where(cond, x, y)`: `x` where `cond` is true, else `y`; scalars allowed.
#[track_caller]
pub fn where_(cond: &Tensor, x: impl IntoTensor, y: impl IntoTensor) -> Result<Tensor> {
    let (x, y) = (x.into_tensor(), y.into_tensor());
    Tensor::record(Op::Where, &[cond, &x, &y], Location::caller())
}

impl Tensor {
    /// `other - self` (for a scalar on the left: `x.rsub(1.0)` is `1 - x`).
    #[track_caller]
    pub fn rsub(&self, other: impl IntoTensor) -> Result<Tensor> {
        let other = other.into_tensor();
        Tensor::record(Op::Binary(BinaryOp::Sub), &[&other, self], Location::caller())
    }

    /// `other / self`.
    #[track_caller]
    pub fn rdiv(&self, other: impl IntoTensor) -> Result<Tensor> {
        let other = other.into_tensor();
        Tensor::record(Op::Binary(BinaryOp::Div), &[&other, self], Location::caller())
    }

    /// `torch.where(self_as_cond, x, y)` as a method on the condition.
    #[track_caller]
    pub fn where_cond(&self, x: impl IntoTensor, y: impl IntoTensor) -> Result<Tensor> {
        let (x, y) = (x.into_tensor(), y.into_tensor());
        Tensor::record(Op::Where, &[self, &x, &y], Location::caller())
    }

    /// Converts to another dtype (`.to(dtype)`); a no-op when the dtype is already `dtype`.
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        Tensor::record(Op::Cast(dtype), &[self], Location::caller())
    }

    /// Clamps into `[min, max]`; either bound may be omitted. Bounds take part in type
    /// promotion as scalars (`i32.clamp(0.5, ..)` is f32).
    #[track_caller]
    pub fn clamp(&self, min: Option<impl Into<Scalar>>, max: Option<impl Into<Scalar>>) -> Result<Tensor> {
        let (min, max) = (min.map(Into::into), max.map(Into::into));
        if min.is_none() && max.is_none() {
            return Err(Tensor::error(
                "clamp",
                &[self],
                Error::value("at least one of min or max must be given"),
                Location::caller(),
            ));
        }
        let bounds: Vec<Tensor> = [min, max].into_iter().flatten().map(Tensor::weak_scalar).collect();
        let mut srcs = vec![self];
        srcs.extend(bounds.iter());
        Tensor::record(Op::Clamp { min, max }, &srcs, Location::caller())
    }

    /// `torch.nan_to_num`: NaN -> `nan`, +inf -> `posinf`, -inf -> `neginf` (defaults: 0 and the
    /// dtype's largest and lowest finite values).
    #[track_caller]
    pub fn nan_to_num(&self, nan: f64, posinf: Option<f64>, neginf: Option<f64>) -> Result<Tensor> {
        Tensor::record(Op::NanToNum { nan, posinf, neginf }, &[self], Location::caller())
    }

    /// `x.detach()`: the same values, through which no gradient flows ([`crate::grad`]). A
    /// computed tensor's detach shares its storage and keeps none of its history (outside a
    /// compiled function's trace): how a training loop's updated weights let the earlier steps'
    /// weights and gradients go.
    ///
    /// ```
    /// use coil_frontend::{grad, Tensor};
    /// let w = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// let loss = w.mul(&w.detach()?)?.sum_all()?; // w * stop_gradient(w)
    /// assert_eq!(grad(&loss, &[&w])?[0].to_vec::<f32>()?, vec![1.0, 2.0]);
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn detach(&self) -> Result<Tensor> {
        match self.0.storage.get() {
            Some(storage) if !crate::dynamo::tracing() => {
                let t = Tensor::from_storage(storage.clone());
                t.0.dynamic.store(
                    self.0.dynamic.load(std::sync::atomic::Ordering::Relaxed),
                    std::sync::atomic::Ordering::Relaxed,
                );
                Ok(t)
            }
            _ => Tensor::record(Op::Detach, &[self], Location::caller()),
        }
    }

    /// `torch.relu`: `max(x, 0)`.
    #[track_caller]
    pub fn relu(&self) -> Result<Tensor> {
        Tensor::record(Op::Relu, &[self], Location::caller())
    }

    /// GELU; `approximate_tanh` selects the tanh approximation (`approximate="tanh"`).
    #[track_caller]
    pub fn gelu(&self, approximate_tanh: bool) -> Result<Tensor> {
        Tensor::record(Op::Gelu { tanh: approximate_tanh }, &[self], Location::caller())
    }

    /// `torch.nn.functional.silu`: `x * sigmoid(x)`.
    #[track_caller]
    pub fn silu(&self) -> Result<Tensor> {
        Tensor::record(Op::Silu, &[self], Location::caller())
    }

    /// `F.softplus(x, beta, threshold)` (PyTorch's defaults are 1 and 20).
    #[track_caller]
    pub fn softplus(&self, beta: f64, threshold: f64) -> Result<Tensor> {
        Tensor::record(Op::Softplus { beta, threshold }, &[self], Location::caller())
    }
}
