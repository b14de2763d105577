//! Conversions and arithmetic operators on [`Expr`].

use super::*;

// ---------------------------------------------------------------------------------------------
// Conversions and operators

impl From<i64> for Expr {
    fn from(v: i64) -> Expr {
        Expr::int(v)
    }
}
impl From<i32> for Expr {
    fn from(v: i32) -> Expr {
        Expr::int(v.into())
    }
}
impl From<usize> for Expr {
    /// # Panics
    /// If `v > i64::MAX`.
    fn from(v: usize) -> Expr {
        Expr::int(i64::try_from(v).expect("sym: usize does not fit in i64"))
    }
}

impl<R: Into<Expr>> Add<R> for Expr {
    type Output = Expr;
    fn add(self, rhs: R) -> Expr {
        sum([(self, 1), (rhs.into(), 1)], 0)
    }
}
impl<R: Into<Expr>> Sub<R> for Expr {
    type Output = Expr;
    fn sub(self, rhs: R) -> Expr {
        sum([(self, 1), (rhs.into(), -1)], 0)
    }
}
impl<R: Into<Expr>> Mul<R> for Expr {
    type Output = Expr;
    fn mul(self, rhs: R) -> Expr {
        product([self, rhs.into()])
    }
}
impl Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        sum([(self, -1)], 0)
    }
}
macro_rules! scalar_lhs {
    ($($t:ty),*) => {$(
        impl Add<Expr> for $t { type Output = Expr; fn add(self, rhs: Expr) -> Expr { Expr::from(self) + rhs } }
        impl Sub<Expr> for $t { type Output = Expr; fn sub(self, rhs: Expr) -> Expr { Expr::from(self) - rhs } }
        impl Mul<Expr> for $t { type Output = Expr; fn mul(self, rhs: Expr) -> Expr { Expr::from(self) * rhs } }
    )*};
}
// Only `i64`, so that a literal on the left (`2 * x`) infers its type.
scalar_lhs!(i64);

impl Sum for Expr {
    fn sum<I: Iterator<Item = Expr>>(iter: I) -> Expr {
        sum(iter.map(|e| (e, 1)).collect::<Vec<_>>(), 0)
    }
}
impl Product for Expr {
    fn product<I: Iterator<Item = Expr>>(iter: I) -> Expr {
        product(iter.collect::<Vec<_>>())
    }
}
