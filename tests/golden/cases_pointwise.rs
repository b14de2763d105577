//! Golden cases: pointwise math, comparisons, logic, casts and type promotion.

use super::{Inputs, Outputs};
use coil::{pow, where_, DType, Result, Tensor};

/// The coil method for a PyTorch unary function name; `None` for other names.
fn unary(op: &str, i: &Inputs) -> Option<Result<Tensor>> {
    const NAMES: &[&str] = &[
        "neg",
        "abs",
        "sign",
        "exp",
        "exp2",
        "expm1",
        "log",
        "log2",
        "log1p",
        "sqrt",
        "rsqrt",
        "sin",
        "cos",
        "tan",
        "atan",
        "asin",
        "acos",
        "tanh",
        "sigmoid",
        "relu",
        "gelu",
        "silu",
        "softplus",
        "erf",
        "erfc",
        "erfinv",
        "bitwise_not",
        "floor",
        "ceil",
        "round",
        "trunc",
        "reciprocal",
    ];
    if !NAMES.contains(&op) {
        return None;
    }
    let a = &i["a"];
    Some(match op {
        "neg" => a.neg(),
        "abs" => a.abs(),
        "sign" => a.sign(),
        "exp" => a.exp(),
        "exp2" => a.exp2(),
        "expm1" => a.expm1(),
        "log" => a.log(),
        "log2" => a.log2(),
        "log1p" => a.log1p(),
        "sqrt" => a.sqrt(),
        "rsqrt" => a.rsqrt(),
        "sin" => a.sin(),
        "cos" => a.cos(),
        "tan" => a.tan(),
        "atan" => a.atan(),
        "asin" => a.asin(),
        "acos" => a.acos(),
        "tanh" => a.tanh(),
        "sigmoid" => a.sigmoid(),
        "relu" => a.relu(),
        "gelu" => a.gelu(false),
        "silu" => a.silu(),
        "softplus" => a.softplus(1.0, 20.0),
        "erf" => a.erf(),
        "erfc" => a.erfc(),
        "erfinv" => a.erfinv(),
        "bitwise_not" => a.bitwise_not(),
        "floor" => a.floor(),
        "ceil" => a.ceil(),
        "round" => a.round(),
        "trunc" => a.trunc(),
        "reciprocal" => a.reciprocal(),
        _ => return None,
    })
}

pub fn run(name: &str, i: &Inputs) -> Option<Outputs> {
    case(name, i).transpose()
}

/// The case's outputs, or `Ok(None)` when the case is not in this table.
fn case(name: &str, i: &Inputs) -> coil::Result<Option<Vec<Tensor>>> {
    let (a, b, c) = (|| &i["a"], || &i["b"], || &i["c"]);
    Ok(Some(match name {
        "gelu_tanh_f32" => vec![a().gelu(true)?],
        "softplus_beta2_thr1_f32" => vec![a().softplus(2.0, 1.0)?],
        "round_decimals2" => vec![(a() * 100.0).round().map(|r| r / 100.0)?],
        "trunc_floor_ceil_neg" => vec![coil::stack(&[&a().trunc()?, &a().floor()?, &a().ceil()?], 0)?],
        "exp_transposed" => vec![a().t()?.exp()?],
        "sin_strided" => vec![a().slice(1, None, None, 2)?.sin()?],
        "abs_permuted" => vec![a().permute(&[2, 0, 1])?.abs()?],
        "sigmoid_expanded" => vec![a().expand(&[3, 4])?.sigmoid()?],
        "add_f32"
        | "add_broadcast_row"
        | "add_broadcast_col"
        | "add_broadcast_outer"
        | "add_broadcast_3d"
        | "add_f16"
        | "add_bf16"
        | "add_f64"
        | "add_i32"
        | "add_i64_broadcast"
        | "add_size0"
        | "add_0d" => vec![a().add(b())?],
        "add_alpha" => vec![a().add(b() * 2)?],
        "add_transposed" => vec![a().t()?.add(b())?],
        "add_strided" => vec![a().slice(1, None, None, 2)?.add(b())?],
        "sub_f32" | "sub_i64" | "sub_bf16_broadcast" => vec![a().sub(b())?],
        "sub_alpha" => vec![a().sub(b() * 0.5)?],
        "mul_f32" | "mul_bf16" | "mul_i32" | "mul_broadcast" => vec![a() * b()],
        "div_f32" | "div_f16" | "div_by_zero_f32" | "div_true_i64" => vec![a() / b()],
        "div_floor_f32" | "div_floor_f32_random" | "div_floor_i64" | "floordiv_op_i64" => vec![a().floor_divide(b())?],
        "div_trunc_f32" | "div_trunc_i64" => vec![a().trunc_divide(b())?],
        "div_floor_i32_scalar" => vec![a().floor_divide(3)?],
        "remainder_f32" | "remainder_i64" => vec![a().remainder(b())?],
        "remainder_op_scalar_i64" => vec![a().remainder(3)?],
        "remainder_neg_scalar_f32" => vec![a().remainder(-1.5)?],
        "fmod_f32" => vec![a().fmod(b())?],
        "pow_tensor_tensor" | "pow_i64_tensor" | "pow_bf16" | "pow_broadcast" => vec![a().pow(b())?],
        "pow_tensor_scalar2" => vec![a().pow(2)?],
        "pow_tensor_scalar_half" | "pow_neg_base_frac" => vec![a().pow(0.5)?],
        "pow_tensor_scalar_neg" => vec![a().pow(-1.5)?],
        "pow_scalar_tensor" => vec![pow(2.0, a())?],
        "pow_scalar_tensor_fn" => vec![pow(3.0, a())?],
        "pow_neg_base_int_exp" => vec![a().pow(3.0)?],
        "pow_i64_scalar" => vec![a().pow(3)?],
        "err_int_pow_negative" => vec![a().pow(-1)?],
        "clamp_min" => vec![a().clamp(Some(-0.5), None::<f64>)?],
        "clamp_max" => vec![a().clamp(None::<f64>, Some(0.5))?],
        "clamp_both" | "clamp_bf16" => vec![a().clamp(Some(-0.5), Some(0.5))?],
        "clamp_nan" => vec![a().clamp(Some(-1.0), Some(1.0))?],
        "clamp_i64" => vec![a().clamp(Some(-2), Some(3))?],
        "clamp_min_i32" => vec![a().clamp(Some(0), None::<i64>)?],
        "clamp_tensor_bounds" => vec![a().maximum(b()).and_then(|t| t.minimum(c()))?],
        "maximum_f32" | "maximum_broadcast" | "maximum_nan" | "maximum_bf16" | "max_binary" => vec![a().maximum(b())?],
        "minimum_f32" | "minimum_nan" | "minimum_i32" => vec![a().minimum(b())?],
        "where_f32" | "where_broadcast" | "where_i64" | "where_bf16" => vec![where_(c(), a(), b())?],
        "where_scalar_other" => vec![where_(&a().gt(0)?, a(), 0.0)?],
        "where_scalar_both" => vec![where_(c(), 1.0, -1.0)?],
        "eq_i64" | "eq_f32_values" => vec![a().eq(b())?],
        "ne_i64" | "ne_nan" => vec![a().ne(b())?],
        "lt_f32_broadcast" | "lt_bf16" => vec![a().lt(b())?],
        "le_scalar" => vec![a().le(0.5)?],
        "gt_scalar" => vec![a().gt(0)?],
        "ge_i32_broadcast" => vec![a().ge(b())?],
        "ne_scalar_i64" => vec![a().ne(1)?],
        "gt_int_vs_float" => vec![a().gt(b())?],
        "logical_and_bool" | "logical_and_f32" => vec![a().logical_and(b())?],
        "logical_or_bool" | "logical_or_broadcast" => vec![a().logical_or(b())?],
        "logical_not_bool" | "logical_not_i32" => vec![a().logical_not()?],
        "isnan_f32" | "isnan_bf16" => vec![a().isnan()?],
        "isinf_f32" => vec![a().isinf()?],
        "nan_to_num_default" | "nan_to_num_f16_default" => vec![a().nan_to_num(0.0, None, None)?],
        "nan_to_num_values" => vec![a().nan_to_num(0.5, Some(100.0), Some(-100.0))?],
        "cast_f32_to_i32" | "cast_i64_to_i32" => vec![a().to_dtype(DType::I32)?],
        "cast_f32_to_i64_scaled" => vec![(a() * 10).to_dtype(DType::I64)?],
        "cast_f32_to_bf16" => vec![a().to_dtype(DType::BF16)?],
        "cast_f32_to_f16" | "cast_f32_to_f16_overflow" => vec![a().to_dtype(DType::F16)?],
        "cast_bf16_to_f32" | "cast_f64_to_f32" | "cast_bool_to_f32" | "cast_i64_to_f32" | "cast_u8_to_f32" => {
            vec![a().to_dtype(DType::F32)?]
        }
        "cast_f32_to_bool" | "cast_i32_to_bool" => vec![a().to_dtype(DType::Bool)?],
        "cast_f32_to_u8" => vec![a().to_dtype(DType::U8)?],
        "cast_method_long" => vec![a().to_dtype(DType::I64)?],
        "cast_method_half_transposed" => vec![a().t()?.to_dtype(DType::F16)?],
        "promo_i32_plus_float_scalar" | "promo_f16_plus_float_scalar" => vec![a() + 2.5],
        "promo_i64_times_float_scalar" => vec![a() * 0.5],
        "promo_u8_plus_i8"
        | "promo_f16_plus_bf16"
        | "promo_bool_plus_bool"
        | "promo_i32_plus_i64"
        | "promo_f32_plus_f64_0d"
        | "promo_i32_plus_bool"
        | "promo_f32_plus_i64" => vec![a() + b()],
        "promo_i64_div_i64" => vec![a() / b()],
        "promo_i32_times_f16" | "promo_bool_times_f32" => vec![a() * b()],
        "promo_u8_plus_int_scalar" => vec![a() + 5],
        "promo_bool_plus_int_scalar" => vec![a() + 1],
        "rsub_scalar" => vec![2.0 - a()],
        "sub_scalar" => vec![a() - 1.5],
        "mul_scalar_right" => vec![a() * 3],
        "mul_scalar_left" => vec![0.5 * a()],
        "rdiv_scalar" => vec![1.0 / a()],
        "div_scalar" => vec![a() / 4],
        "radd_scalar_i32" => vec![3 + a()],
        "rsub_scalar_i64" => vec![5 - a()],
        "rfloordiv_scalar_i64" => vec![a().ones_like().mul(7).and_then(|s| s.floor_divide(a()))?],
        "affine_scalar_chain" => vec![a() * 2.0 + 1.0],
        "rsub_scalar_bf16" => vec![1.0 - a()],
        "arctan_alias" => vec![a().arctan()?],
        "asin_random" => vec![a().asin()?],
        "arcsin_alias" => vec![a().arcsin()?],
        "acos_random" => vec![a().acos()?],
        "arccos_alias" => vec![a().arccos()?],
        "erfinv_random" => vec![a().erfinv()?],
        "erfc_random" => vec![a().erfc()?],
        "atan2_f32"
        | "atan2_broadcast"
        | "atan2_f64"
        | "atan2_bf16"
        | "atan2_i64"
        | "atan2_special"
        | "atan2_mixed_f32_i64" => vec![a().atan2(b())?],
        "arctan2_alias" => vec![a().arctan2(b())?],
        "bitwise_and_i64" | "bitwise_and_bool_int" | "err_bitwise_and_f32" => vec![a().bitwise_and(b())?],
        "bitwise_and_values_i32" | "bitwise_and_bool" => vec![a() & b()],
        "bitwise_and_scalar_i32" => vec![a() & 6],
        "bitwise_and_rscalar" => vec![5 & a()],
        "bitwise_or_u8" | "bitwise_or_bool" | "bitwise_or_broadcast" => vec![a() | b()],
        "bitwise_or_i16" => vec![a().to_dtype(DType::I16)?.bitwise_or(&b().to_dtype(DType::I16)?)?],
        "bitwise_xor_i8" => vec![a() ^ b()],
        "bitwise_xor_bool" => vec![a().bitwise_xor(b())?],
        "bitwise_xor_scalar_i64" => vec![a() ^ -1],
        "err_bitwise_xor_float_scalar" => vec![a().bitwise_xor(1.5)?],
        "bitwise_not_u8" | "bitwise_not_bool" => vec![!a()],
        "err_bitwise_not_float" => vec![a().bitwise_not()?],
        "bitwise_left_shift_i64" | "bitwise_left_shift_i32" | "bitwise_left_shift_i8" | "bitwise_left_shift_u8" => {
            vec![a() << b()]
        }
        "bitwise_left_shift_large_i64" | "err_bitwise_left_shift_bool" => vec![a().bitwise_left_shift(b())?],
        "bitwise_left_shift_scalar" => vec![a() << 3],
        "bitwise_left_shift_rscalar" => vec![1 << a()],
        "bitwise_right_shift_i64" | "bitwise_right_shift_u8" => vec![a() >> b()],
        "bitwise_right_shift_negative" => vec![a().bitwise_right_shift(b())?],
        "bitwise_right_shift_i16" => vec![a().to_dtype(DType::I16)? >> b().to_dtype(DType::I16)?],
        "bitwise_right_shift_scalar" => vec![a().bitwise_right_shift(2)?],
        "err_add_shape" => vec![a().add(b())?],
        "err_where_shape" => vec![where_(c(), a(), b())?],
        _ => {
            // `<torch function>_<variant>`: f32/f16/bf16/f64/i32/i8/i64 dtypes, special values, sizes
            let Some((op, variant)) = name.rsplit_once('_') else { return Ok(None) };
            let op = match variant {
                "f32" | "f16" | "bf16" | "f64" | "i32" | "i8" | "i64" | "special" | "extreme" | "nan" | "zero"
                | "small" | "large" | "zeros" | "size0" | "0d" | "even" => op.strip_suffix("_half").unwrap_or(op),
                _ => return Ok(None),
            };
            return unary(op, i).transpose().map(|t| t.map(|t| vec![t]));
        }
    }))
}
