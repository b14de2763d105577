//! Operator overloads: `&a + &b`, `a * 2.0`, `1.0 - &a`, `-&a`, and the bit ops `&a & &b`,
//! `a | 1`, `a ^ b`, `!a` (PyTorch's `~a`), `a << 2`, `a >> b`.
//!
//! Like slice indexing, an operator cannot return a `Result`: on a shape or dtype error it
//! panics with the same message the fallible method returns, at the caller's line.

use crate::ops::pointwise::IntoTensor;
use crate::tensor::Tensor;
use coil_ir::{BinaryOp, Op, Result};
use std::ops::{Add, BitAnd, BitOr, BitXor, Div, Mul, Neg, Not, Shl, Shr, Sub};
use std::panic::Location;

#[track_caller]
fn or_panic(r: Result<Tensor>) -> Tensor {
    r.unwrap_or_else(|e| panic!("{e}"))
}

#[track_caller]
fn binary(op: BinaryOp, a: Tensor, b: Tensor) -> Tensor {
    or_panic(Tensor::record(Op::Binary(op), &[&a, &b], Location::caller()))
}

macro_rules! overload {
    ($Trait:ident, $method:ident, $op:ident) => {
        overload!($Trait, $method, $op; f64, f32, i64, i32);
    };
    ($Trait:ident, $method:ident, $op:ident; $($t:ty),*) => {
        impl<R: IntoTensor> $Trait<R> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: R) -> Tensor {
                binary(BinaryOp::$op, self.clone(), rhs.into_tensor())
            }
        }
        impl<R: IntoTensor> $Trait<R> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: R) -> Tensor {
                binary(BinaryOp::$op, self, rhs.into_tensor())
            }
        }
        overload!(@scalar $Trait, $method, $op, $($t),*);
    };
    (@scalar $Trait:ident, $method:ident, $op:ident, $($t:ty),*) => {$(
        impl $Trait<&Tensor> for $t {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                binary(BinaryOp::$op, self.into_tensor(), rhs.clone())
            }
        }
        impl $Trait<Tensor> for $t {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                binary(BinaryOp::$op, self.into_tensor(), rhs)
            }
        }
    )*};
}

overload!(Add, add, Add);
overload!(Sub, sub, Sub);
overload!(Mul, mul, Mul);
overload!(Div, div, Div);
// Bit ops: a Rust integer or bool may stand on the left (a float there is always an error).
overload!(BitAnd, bitand, BitwiseAnd; i64, i32, bool);
overload!(BitOr, bitor, BitwiseOr; i64, i32, bool);
overload!(BitXor, bitxor, BitwiseXor; i64, i32, bool);
overload!(Shl, shl, ShiftLeft; i64, i32);
overload!(Shr, shr, ShiftRight; i64, i32);

impl Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        or_panic(self.neg())
    }
}

impl Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        or_panic(Tensor::neg(&self))
    }
}

/// `!x` is PyTorch's `~x`: [`Tensor::bitwise_not`].
impl Not for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn not(self) -> Tensor {
        or_panic(self.bitwise_not())
    }
}

impl Not for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn not(self) -> Tensor {
        or_panic(self.bitwise_not())
    }
}
