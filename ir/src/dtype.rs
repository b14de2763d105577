//! Element types and PyTorch's type-promotion rules.
//!
//! coil follows PyTorch exactly so that PyTorch's outputs can serve as the oracle:
//! categories order as `bool < integer < floating`, two types of one category promote to the
//! wider one (`f16 + bf16 -> f32`, `u8 + i8 -> i16`), and in a mixed expression a 0-d tensor
//! or a Rust scalar only decides the result when it belongs to a higher category than the
//! dimensioned tensors (`i32_tensor * 2.5 -> f32`, `f16_tensor * 2.5 -> f16`).

use std::fmt;

/// The element type of a tensor.
///
/// ```
/// use coil_ir::DType;
/// assert_eq!(DType::promote(DType::F16, DType::BF16), DType::F32);
/// assert_eq!(DType::BF16.to_string(), "bf16");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `torch.bool`, one byte per element.
    Bool,
    /// `torch.uint8`.
    U8,
    /// `torch.int8`.
    I8,
    /// `torch.int16`.
    I16,
    /// `torch.int32`.
    I32,
    /// `torch.int64`, also the dtype of indices.
    I64,
    /// `torch.float16`, IEEE half precision.
    F16,
    /// `torch.bfloat16`.
    BF16,
    /// `torch.float32`, the default float.
    F32,
    /// `torch.float64`.
    F64,
}

/// The promotion category of a dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    /// `bool`.
    Bool,
    /// The integer dtypes.
    Integer,
    /// The floating-point dtypes.
    Float,
}

impl DType {
    /// Every dtype, in a fixed order.
    pub const ALL: [DType; 10] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// PyTorch's default floating dtype, used when integers meet a float scalar or a float-only op.
    pub const DEFAULT_FLOAT: DType = DType::F32;

    /// Size of one element in bytes (`bool` is stored as one byte).
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// Whether casting to `to` keeps every value exactly and makes the element no narrower:
    /// a float to a wider float (`bf16`/`f16` to `f32` or `f64`, `f32` to `f64`), an integer
    /// to a wider integer of the same signedness or a signed one wider than `u8`, bool to
    /// anything. (`u8`/`i8` to a float is exact too, but makes a wider element from a cheaper
    /// one only with `f32`/`f64`; the rule is for storage decisions, so it stays by width.)
    ///
    /// ```
    /// use coil_ir::DType;
    /// assert!(DType::BF16.widens_exactly(DType::F32));
    /// assert!(!DType::F32.widens_exactly(DType::BF16));
    /// assert!(!DType::F16.widens_exactly(DType::BF16));
    /// assert!(!DType::I64.widens_exactly(DType::F64));
    /// ```
    pub fn widens_exactly(self, to: DType) -> bool {
        use DType::*;
        match (self, to) {
            (a, b) if a == b => true,
            (Bool, _) => true,
            (F16 | BF16, F32 | F64) | (F32, F64) => true,
            (U8, I16 | I32 | I64) | (I8, I16 | I32 | I64) | (I16, I32 | I64) | (I32, I64) => true,
            _ => false,
        }
    }

    /// The promotion category: bool, integer or float.
    pub fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::U8 | DType::I8 | DType::I16 | DType::I32 | DType::I64 => Category::Integer,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Category::Float,
        }
    }

    /// Whether the dtype is a floating-point one.
    pub fn is_float(self) -> bool {
        self.category() == Category::Float
    }

    /// Integers and bool: the types computed exactly in 64-bit integers.
    pub fn is_integral(self) -> bool {
        !self.is_float()
    }

    /// The short name used in printed graphs (`f32`, `bf16`, `i64`, `bool`).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Parses the short name (`f32`) or PyTorch's name (`float32`, `bfloat16`, `int64`).
    ///
    /// ```
    /// use coil_ir::DType;
    /// assert_eq!(DType::parse("bfloat16"), Some(DType::BF16));
    /// assert_eq!(DType::parse("i32"), Some(DType::I32));
    /// ```
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s {
            "bool" => DType::Bool,
            "u8" | "uint8" => DType::U8,
            "i8" | "int8" => DType::I8,
            "i16" | "int16" => DType::I16,
            "i32" | "int32" => DType::I32,
            "i64" | "int64" => DType::I64,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "f32" | "float32" | "float" => DType::F32,
            "f64" | "float64" | "double" => DType::F64,
            _ => return None,
        })
    }

    /// `torch.promote_types`: the smallest dtype both values fit in.
    ///
    /// ```
    /// use coil_ir::DType;
    /// assert_eq!(DType::promote(DType::U8, DType::I8), DType::I16);
    /// assert_eq!(DType::promote(DType::I64, DType::F16), DType::F16);
    /// assert_eq!(DType::promote(DType::Bool, DType::U8), DType::U8);
    /// ```
    pub fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        if a == b {
            return a;
        }
        match (a.category(), b.category()) {
            (Category::Bool, _) => b,
            (_, Category::Bool) => a,
            (Category::Float, Category::Integer) => a,
            (Category::Integer, Category::Float) => b,
            (Category::Float, Category::Float) => match (a, b) {
                (F16, BF16) | (BF16, F16) => F32,
                _ => a.max(b),
            },
            (Category::Integer, Category::Integer) => match (a, b) {
                (U8, I8) | (I8, U8) => I16,
                (U8, x) | (x, U8) => x,
                _ => a.max(b),
            },
        }
    }

    /// The dtype a float-only op (exp, sqrt, true division, mean) computes in: the dtype itself
    /// when floating, else the default float.
    pub fn to_float(self) -> DType {
        if self.is_float() {
            self
        } else {
            DType::DEFAULT_FLOAT
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust scalar taking part in an expression (`x * 2.5`, `x.clamp(0, 6)`).
///
/// A scalar is "weak": it only changes the result dtype across categories (see [`result_type`]).
///
/// Equality is by bit pattern for floats: `0.0` and `-0.0` are different constants (`1 / x`
/// tells them apart), and a NaN equals itself. Everything that deduplicates constants (value
/// numbering of loop bodies, tile programs, graph CSE) compares through this.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    /// A bool.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
}

impl PartialEq for Scalar {
    fn eq(&self, other: &Scalar) -> bool {
        match (self, other) {
            (Scalar::Bool(a), Scalar::Bool(b)) => a == b,
            (Scalar::Int(a), Scalar::Int(b)) => a == b,
            (Scalar::Float(a), Scalar::Float(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

impl Eq for Scalar {}

impl Scalar {
    /// The dtype PyTorch gives a wrapped number: i64 for integers, the default float for floats.
    pub fn dtype(self) -> DType {
        match self {
            Scalar::Bool(_) => DType::Bool,
            Scalar::Int(_) => DType::I64,
            Scalar::Float(_) => DType::DEFAULT_FLOAT,
        }
    }

    /// The value as an `f64` (bool: 0 or 1; integers beyond 2^53 round).
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as i64 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(x) => x,
        }
    }

    /// The value as an integer (floats truncate toward zero, as a cast does).
    pub fn as_i64(self) -> i64 {
        match self {
            Scalar::Bool(b) => b as i64,
            Scalar::Int(i) => i,
            Scalar::Float(x) => x as i64,
        }
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) if x.is_nan() => f.write_str("nan"),
            Scalar::Float(x) if x.is_infinite() => f.write_str(if *x > 0.0 { "inf" } else { "-inf" }),
            // `{:?}` keeps a trailing `.0` so floats and integers print differently.
            Scalar::Float(x) => write!(f, "{x:?}"),
        }
    }
}

macro_rules! scalar_from {
    ($($t:ty => $v:ident as $c:ty),*) => {$(
        impl From<$t> for Scalar {
            fn from(x: $t) -> Scalar { Scalar::$v(x as $c) }
        }
    )*};
}
scalar_from!(f64 => Float as f64, f32 => Float as f64, i64 => Int as i64, i32 => Int as i64,
             u8 => Int as i64, i8 => Int as i64, i16 => Int as i64, usize => Int as i64, u32 => Int as i64);
impl From<bool> for Scalar {
    fn from(b: bool) -> Scalar {
        Scalar::Bool(b)
    }
}

/// How an operand takes part in type promotion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    /// A tensor with at least one dimension.
    Dimensioned(DType),
    /// A 0-d tensor.
    ZeroDim(DType),
    /// A Rust scalar (PyTorch's "wrapped number").
    Scalar(DType),
}

/// `torch.result_type` over several operands.
///
/// ```
/// use coil_ir::{dtype::{result_type, Operand}, DType};
/// // an i32 tensor times 2.5 is f32; an f16 tensor times 2.5 stays f16
/// assert_eq!(result_type(&[Operand::Dimensioned(DType::I32), Operand::Scalar(DType::F32)]), DType::F32);
/// assert_eq!(result_type(&[Operand::Dimensioned(DType::F16), Operand::Scalar(DType::F32)]), DType::F16);
/// // a 0-d i64 tensor does not widen a u8 tensor
/// assert_eq!(result_type(&[Operand::Dimensioned(DType::U8), Operand::ZeroDim(DType::I64)]), DType::U8);
/// ```
pub fn result_type(operands: &[Operand]) -> DType {
    let (mut dim, mut zero, mut wrapped) = (None, None, None);
    for op in operands {
        let (slot, t) = match *op {
            Operand::Dimensioned(t) => (&mut dim, t),
            Operand::ZeroDim(t) => (&mut zero, t),
            Operand::Scalar(t) => (&mut wrapped, t),
        };
        *slot = Some(match *slot {
            None => t,
            Some(prev) => DType::promote(prev, t),
        });
    }
    combine(dim, combine(zero, wrapped)).unwrap_or(DType::DEFAULT_FLOAT)
}

/// PyTorch's `combine_categories`: the higher-priority result wins unless the lower one is of
/// a higher category.
fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    match (higher, lower) {
        (None, l) => l,
        (h, None) => h,
        (Some(h), Some(l)) => Some(if h.is_float() {
            h
        } else if h == DType::Bool || l.is_float() {
            DType::promote(h, l)
        } else {
            h
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promote_is_symmetric_and_idempotent() {
        for a in DType::ALL {
            assert_eq!(DType::promote(a, a), a);
            for b in DType::ALL {
                assert_eq!(DType::promote(a, b), DType::promote(b, a), "{a} {b}");
            }
        }
    }

    #[test]
    fn bool_tensor_and_int_scalar() {
        let t = result_type(&[Operand::Dimensioned(DType::Bool), Operand::Scalar(DType::I64)]);
        assert_eq!(t, DType::I64);
        let t = result_type(&[Operand::Dimensioned(DType::I32), Operand::Scalar(DType::I64)]);
        assert_eq!(t, DType::I32);
        let t = result_type(&[Operand::ZeroDim(DType::F64), Operand::Dimensioned(DType::I32)]);
        assert_eq!(t, DType::F64);
        let t = result_type(&[Operand::ZeroDim(DType::F64), Operand::Dimensioned(DType::F16)]);
        assert_eq!(t, DType::F16);
    }

    #[test]
    fn scalars_are_equal_by_bit_pattern() {
        assert_ne!(Scalar::Float(0.0), Scalar::Float(-0.0));
        assert_eq!(Scalar::Float(-0.0), Scalar::Float(-0.0));
        assert_eq!(Scalar::Float(f64::NAN), Scalar::Float(f64::NAN));
        assert_ne!(Scalar::Float(1.0), Scalar::Int(1));
        assert_ne!(Scalar::Int(0), Scalar::Bool(false));
    }

    #[test]
    fn scalar_display_keeps_float_point() {
        assert_eq!(Scalar::Float(1.0).to_string(), "1.0");
        assert_eq!(Scalar::Int(1).to_string(), "1");
        assert_eq!(Scalar::Float(f64::NEG_INFINITY).to_string(), "-inf");
    }
}
