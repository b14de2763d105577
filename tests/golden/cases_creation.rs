//! Golden cases: tensor creation.

use super::{Inputs, Outputs};
use coil::{DType, Tensor};

pub fn run(name: &str, i: &Inputs) -> Option<Outputs> {
    case(name, i).transpose()
}

/// The case's outputs, or `Ok(None)` when the case is not in this table.
fn case(name: &str, i: &Inputs) -> coil::Result<Option<Vec<Tensor>>> {
    let a = || &i["a"];
    Ok(Some(match name {
        "zeros_f32" => vec![Tensor::zeros(&[2, 3], DType::F32)],
        "zeros_i32" => vec![Tensor::zeros(&[2, 3], DType::I32)],
        "zeros_size0" => vec![Tensor::zeros(&[0, 3], DType::F32)],
        "ones_bf16" => vec![Tensor::ones(&[4], DType::BF16)],
        "ones_3d" => vec![Tensor::ones(&[2, 1, 3], DType::F32)],
        "full_f32" => vec![Tensor::full(&[2, 3], 1.5, DType::F32)],
        "full_int_infers_i64" => vec![Tensor::full(&[2, 3], 7, DType::I64)],
        "full_bool" => vec![Tensor::full(&[3], true, DType::Bool)],
        "full_f16" => vec![Tensor::full(&[2, 2], -0.25, DType::F16)],
        "arange_int" => vec![Tensor::arange(0.0, 5.0, 1.0, DType::I64)?],
        "arange_int_start_step" => vec![Tensor::arange(-3.0, 7.0, 2.0, DType::I64)?],
        "arange_int_neg_step" => vec![Tensor::arange(10.0, 0.0, -3.0, DType::I64)?],
        "arange_float_step" => vec![Tensor::arange(0.5, 2.0, 0.25, DType::F32)?],
        "arange_f32_dtype" => vec![Tensor::arange(0.0, 6.0, 1.0, DType::F32)?],
        "arange_empty" => vec![Tensor::arange(3.0, 3.0, 1.0, DType::I64)?],
        "linspace_0_1_5" => vec![Tensor::linspace(0.0, 1.0, 5, DType::F32)?],
        "linspace_neg" => vec![Tensor::linspace(-2.0, 3.0, 7, DType::F32)?],
        "linspace_one_step" => vec![Tensor::linspace(2.0, 3.0, 1, DType::F32)?],
        "linspace_f64" => vec![Tensor::linspace(0.0, 1.0, 4, DType::F64)?],
        "eye_3" => vec![Tensor::eye(3, None, DType::F32)?],
        "eye_rect" => vec![Tensor::eye(2, Some(4), DType::F32)?],
        "eye_i64" => vec![Tensor::eye(3, None, DType::I64)?],
        "zeros_like_f32" => vec![a().zeros_like()],
        "ones_like_i32" => vec![a().ones_like()],
        "ones_like_dtype_f16" => vec![Tensor::ones(a().shape(), DType::F16)],
        "full_like_f32" => vec![a().full_like(2.5)],
        "full_like_i64" => vec![a().full_like(3)],
        "full_like_noncontig" => vec![a().t()?.full_like(-1.0)],
        _ => return Ok(None),
    }))
}
