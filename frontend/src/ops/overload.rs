//! Operator overloads: `&a + &b`, `a * 2.0`, `1.0 - &a`, `-&a`.
//!
//! Like slice indexing, an operator cannot return a `Result`: on a shape or dtype error it
//! panics with the same message the fallible method returns, at the caller's line.

use crate::ops::pointwise::IntoTensor;
use crate::tensor::Tensor;
use coil_ir::{BinaryOp, Op, Result};
use std::ops::{Add, Div, Mul, Neg, Sub};
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
        overload!(@scalar $Trait, $method, $op, f64, f32, i64, i32);
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
