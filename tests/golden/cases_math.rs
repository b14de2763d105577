//! Golden cases: pointwise math and activation functions that coil writes as compositions of
//! its primitives (`log10`, hyperbolic functions, `lerp`, `hypot`, `leaky_relu`, `mish`, ...).
use super::{Inputs, Outputs};
use coil::*;

pub fn run(name: &str, i: &Inputs) -> Option<Outputs> {
    case(name, i).transpose()
}

/// The activation named by a case's prefix, with the arguments its cases use.
fn activation(op: &str, a: &Tensor) -> Option<Result<Tensor>> {
    Some(match op {
        "leaky_relu" => a.leaky_relu(0.1),
        "elu" => a.elu(1.5),
        "selu" => a.selu(),
        "celu" => a.celu(0.7),
        "mish" => a.mish(),
        "hardswish" => a.hardswish(),
        "hardsigmoid" => a.hardsigmoid(),
        "hardtanh" => a.hardtanh(-0.5, 0.8),
        "relu6" => (a * 4).relu6(),
        "logsigmoid" => a.logsigmoid(),
        "softsign" => a.softsign(),
        "tanhshrink" => a.tanhshrink(),
        "hardshrink" => a.hardshrink(0.4),
        "softshrink" => a.softshrink(0.4),
        "threshold" => a.threshold(0.2, -3.0),
        _ => return None,
    })
}

/// The case's outputs, or `Ok(None)` when the case is not in this table.
fn case(name: &str, i: &Inputs) -> Result<Option<Vec<Tensor>>> {
    let x = |n: &str| &i[n];
    let (a, b, c, w) = (|| x("a"), || x("b"), || x("c"), || x("w"));
    Ok(Some(match name {
        "log10_f32" | "log10_special" | "log10_i64" | "log10_bf16" => vec![a().log10()?],
        "relu_ties" => vec![a().relu()?],
        "frac_f32" | "frac_special" | "frac_f64" | "err_frac_int" => vec![a().frac()?],
        "clamp_min_fn" => vec![a().clamp_min(-0.3)?],
        "clamp_max_fn" => vec![a().clamp_max(0.3)?],
        "clamp_min_fn_i64" => vec![a().clamp_min(2)?],
        "clamp_tensor_both" | "clamp_tensor_nan" => vec![a().clamp_tensor(Some(b()), Some(c()))?],
        "clamp_tensor_min_only" => vec![a().clamp_tensor(Some(b()), None)?],
        "isfinite_f32" | "isfinite_i64" => vec![a().isfinite()?],
        "isposinf_f32" => vec![a().isposinf()?],
        "isneginf_f32" | "isneginf_bf16" => vec![a().isneginf()?],
        "sinh_f32" | "sinh_f64" | "sinh_bf16" | "sinh_special" => vec![a().sinh()?],
        "cosh_f32" | "cosh_f64" | "cosh_bf16" | "cosh_special" => vec![a().cosh()?],
        "asinh_f32" | "asinh_f64" | "asinh_bf16" | "asinh_special" => vec![a().asinh()?],
        "acosh_f32" | "acosh_f64" | "acosh_special" => vec![a().acosh()?],
        "atanh_f32" | "atanh_f64" | "atanh_bf16" | "atanh_special" => vec![a().atanh()?],
        "square_f32" | "square_i32" => vec![a().square()?],
        "lerp_scalar" => vec![a().lerp(b(), 0.3)?],
        "lerp_tensor_weight" => vec![a().lerp(b(), c())?],
        "lerp_weight_one" => vec![a().lerp(b(), 1.0)?],
        "lerp_bf16" => vec![a().lerp(b(), 0.75)?],
        "err_lerp_dtype" => vec![a().lerp(b(), 0.5)?],
        "addcmul_f32" => vec![a().addcmul(b(), c(), 0.5)?],
        "addcmul_i64" => vec![a().addcmul(b(), c(), 2)?],
        "addcdiv_f32" => vec![a().addcdiv(b(), c(), -1.5)?],
        "err_addcdiv_int" => vec![a().addcdiv(b(), c(), 1.0)?],
        "hypot_f32" | "hypot_special" | "hypot_f64" => vec![a().hypot(b())?],
        "logical_xor_bool" | "logical_xor_mixed" => vec![a().logical_xor(b())?],
        "xlogy_f32" | "xlogy_special" => vec![a().xlogy(b())?],
        "xlogy_scalar" => vec![a().xlogy(3.0)?],
        "copysign_f32" | "copysign_special" | "copysign_i64" => vec![a().copysign(b())?],
        "float_power_f32" => vec![a().float_power(b())?],
        "float_power_i64" => vec![a().float_power(2)?],
        "logaddexp_f32" | "logaddexp_special" => vec![a().logaddexp(b())?],
        "logaddexp2_f32" => vec![a().logaddexp2(b())?],
        "sinc_f32" | "sinc_special" => vec![a().sinc()?],
        "deg2rad_f32" | "deg2rad_i64" => vec![a().deg2rad()?],
        "rad2deg_f32" => vec![a().rad2deg()?],
        "logit_f32" => vec![a().logit(None)?],
        "logit_eps" => vec![a().logit(Some(0.1))?],
        "heaviside_f32" | "err_heaviside_dtype" => vec![a().heaviside(b())?],
        "leaky_relu_f64" => vec![a().leaky_relu(0.01)?],
        "elu_f16" => vec![a().elu(1.0)?],
        "mish_large" => vec![a().mish()?],
        "logsigmoid_large" => vec![a().logsigmoid()?],
        "err_leaky_relu_int" => vec![a().leaky_relu(0.01)?],
        "err_celu_alpha0" => vec![a().celu(0.0)?],
        "err_softshrink_negative" => vec![a().softshrink(-1.0)?],
        "glu_last" | "err_glu_odd" => vec![a().glu(-1)?],
        "glu_dim0" => vec![a().glu(0)?],
        "softmin_dim1" => vec![a().softmin(1)?],
        "softmin_3d" => vec![a().softmin(0)?],
        "prelu_channels" | "prelu_single" | "err_prelu_channels" => vec![a().prelu(w())?],
        "rrelu_eval" => vec![a().rrelu(0.1, 0.3)?],
        "fmod_special" | "fmod_random" | "fmod_i64" | "err_fmod_int_zero" => vec![a().fmod(b())?],
        "fmod_scalar_f64" => vec![a().fmod(1.5)?],
        "fmax_f32" | "fmax_nan" => vec![a().fmax(b())?],
        "fmin_f32" | "fmin_nan" => vec![a().fmin(b())?],
        "signbit_f32" | "signbit_i64" => vec![a().signbit()?],
        "xlog1py_f32" | "xlog1py_special" => vec![a().xlog1py(b())?],
        "entr_f32" | "entr_special" => vec![a().entr()?],
        _ => {
            // `<activation>_f32`, `_special`, `_bf16`
            let Some((op, variant)) = name.rsplit_once('_') else { return Ok(None) };
            if !matches!(variant, "f32" | "special" | "bf16") {
                return Ok(None);
            }
            return activation(op, a()).transpose().map(|t| t.map(|t| vec![t]));
        }
    }))
}
