//! The tier-0 CPU math library (`coil_runtime::cpu::eager`): one C function per float
//! pointwise op and compute type (f32, which f16 and bf16 compute in, and f64), each applying
//! the op over a contiguous chunk of elements. The expressions are the code generator's own
//! (`c::ops`, with the [`prelude`] and its vectorized math before them), so a graph
//! run by tier-0 computes `exp`, `erf`, `tanh`, `pow`, ... with exactly the functions its
//! compiled kernels inline.
//!
//! Built once with the crate (the runtime's `build.rs`, as [`super::gemm_cpu`] is) or, where
//! that build does not serve the machine, once through the kernel cache at first use: never per
//! graph or per shape.
//!
//! Every entry point has the kernels' signature `void NAME(char *const *args, int64_t
//! *status)`: a unary one takes `args = [x, out, &n]`, a binary one `args = [a, b, out, &n]`
//! (`n` an `int64_t`; `out` may be one of the operands: each element is read before it is
//! written).

use crate::c::ops;
use crate::c::prelude;
use coil_ir::{BinaryOp, DType, UnaryOp};
use std::fmt::Write;

/// The compute types the library has kernels for: f32 (also f16's and bf16's) and f64.
pub const DTYPES: [DType; 2] = [DType::F32, DType::F64];

/// Whether `op` has a kernel of a float compute type: every unary op with a float result
/// (not the bool-valued tests, not `bitwise_not`).
pub fn has_unary(op: UnaryOp) -> bool {
    !op.returns_bool() && !op.integral_only()
}

/// Whether `op` has a kernel of a float compute type: the arithmetic, `pow`, `atan2`,
/// `maximum` and `minimum` (comparisons, logical and bit ops are not float-valued).
pub fn has_binary(op: BinaryOp) -> bool {
    use BinaryOp::*;
    matches!(op, Add | Sub | Mul | Div | FloorDiv | TruncDiv | Remainder | Pow | Maximum | Minimum | Atan2)
}

/// The suffix of a compute type's kernel names.
fn suffix(dtype: DType) -> &'static str {
    if dtype == DType::F64 {
        "f64"
    } else {
        "f32"
    }
}

/// The entry point applying `op` over f32 (`dtype` f32, f16 or bf16) or f64 elements.
pub fn unary_kernel(op: UnaryOp, dtype: DType) -> String {
    format!("coil_eager_{}_{}", op.name(), suffix(dtype))
}

/// The entry point applying `op` elementwise over two chunks of the compute type of `dtype`.
pub fn binary_kernel(op: BinaryOp, dtype: DType) -> String {
    format!("coil_eager_{}_{}", op.name(), suffix(dtype))
}

/// Every entry point's name, for checking a loaded library.
pub fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for dtype in DTYPES {
        names.extend(UnaryOp::ALL.into_iter().filter(|&op| has_unary(op)).map(|op| unary_kernel(op, dtype)));
        names.extend(BinaryOp::ALL.into_iter().filter(|&op| has_binary(op)).map(|op| binary_kernel(op, dtype)));
    }
    names
}

/// Lets gcc use 512-bit vectors in the kernels after it where the target has AVX-512 (its
/// default for recent Intel CPUs is 256-bit). The kernels are elementwise, so the width changes
/// no value, only speed: f32 erf 1.14 -> 0.70 ns an element, exp 0.46 -> 0.33 on the build
/// machine (Xeon, Sapphire Rapids), where PyTorch's vectorized math is 512-bit too.
pub const WIDE_VECTORS: &str =
    "#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__AVX512F__)\n\
     #pragma GCC target(\"prefer-vector-width=512\")\n#endif\n";

/// The library's C source: the prelude, then every kernel.
pub fn source() -> String {
    let mut s = String::from(prelude());
    s.push_str("\n/* ---- tier-0 chunk kernels (coil_codegen::templates::eager_cpu) ---- */\n");
    s.push_str(WIDE_VECTORS);
    for dtype in DTYPES {
        let t = ops::compute_type(dtype);
        for op in UnaryOp::ALL.into_iter().filter(|&op| has_unary(op)) {
            let e = ops::unary(op, "x[i]", dtype, dtype);
            let _ = writeln!(
                s,
                "void {name}(char *const *args, int64_t *status) {{\n    const {t} *x = (const {t} *)args[0];\n    \
                 {t} *out = ({t} *)args[1];\n    const int64_t n = *(const int64_t *)args[2];\n    (void)status;\n    \
                 #pragma omp simd\n    for (int64_t i = 0; i < n; i++) out[i] = {e};\n}}",
                name = unary_kernel(op, dtype)
            );
        }
        for op in BinaryOp::ALL.into_iter().filter(|&op| has_binary(op)) {
            let e = ops::binary(op, "a[i]", dtype, "b[i]", dtype, dtype);
            let _ = writeln!(
                s,
                "void {name}(char *const *args, int64_t *status) {{\n    const {t} *a = (const {t} *)args[0];\n    \
                 const {t} *b = (const {t} *)args[1];\n    {t} *out = ({t} *)args[2];\n    \
                 const int64_t n = *(const int64_t *)args[3];\n    (void)status;\n    \
                 #pragma omp simd\n    for (int64_t i = 0; i < n; i++) out[i] = {e};\n}}",
                name = binary_kernel(op, dtype)
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel named is defined once, with the generator's expressions (the prelude's
    /// vectorized f32 functions, the C library's for f64).
    #[test]
    fn the_source_defines_every_kernel_with_the_generators_math() {
        let s = source();
        for name in kernel_names() {
            assert_eq!(s.matches(&format!("void {name}(")).count(), 1, "{name}");
        }
        assert!(s.contains("out[i] = coil_erf_f32(x[i]);"), "f32 erf is the prelude's");
        assert!(s.contains("out[i] = erf(x[i]);"), "f64 erf is libm's");
        assert!(s.contains("out[i] = coil_maximum_f64(a[i], b[i]);"));
        assert!(!kernel_names().iter().any(|n| n.contains("isnan") || n.contains("eq_")));
    }
}
