//! Golden cases: reductions and scans (sum, mean, prod, max/min, amax/amin, argmax/argmin, var,
//! std, logsumexp, norm, all/any, cumsum) and their `err_` cases.
use super::{Inputs, Outputs};
use coil::*;

pub fn run(name: &str, i: &Inputs) -> Option<Outputs> {
    case(name, i).transpose()
}

/// The case's outputs, or `Ok(None)` when the case is not in this table.
fn case(name: &str, i: &Inputs) -> Result<Option<Vec<Tensor>>> {
    let a = || &i["a"];
    let inf = f64::INFINITY;
    Ok(Some(match name {
        // ---- sum ----
        "sum_all" => vec![a().sum_all()?],
        "sum_dim1" => vec![a().sum(&[1], false)?],
        "sum_dim_neg1_keepdim" => vec![a().sum(&[-1], true)?],
        "sum_dims02" => vec![a().sum(&[0, 2], false)?],
        "sum_dims_neg_keepdim" => vec![a().sum(&[-1, -3], true)?],
        "sum_i32_all_to_i64" => vec![a().sum_all()?],
        "sum_i32_dim0_to_i64" => vec![a().sum(&[0], false)?],
        "sum_bool_all" => vec![a().sum_all()?],
        "sum_bool_dim1" => vec![a().sum(&[1], false)?],
        "sum_bf16_dim" => vec![a().sum(&[-1], false)?],
        "sum_f16_all" => vec![a().sum_all()?],
        "sum_f64_dim" => vec![a().sum(&[0], false)?],
        "sum_size0_dim" => vec![a().sum(&[0], false)?],
        "sum_size0_all" => vec![a().sum_all()?],
        "sum_transposed" => vec![a().t()?.sum(&[0], false)?],
        "sum_permuted" => vec![a().permute(&[2, 0, 1])?.sum(&[-1], false)?],
        // `sum(dtype=torch.float64)` casts the input before summing.
        "sum_dtype_f64" => vec![a().to_dtype(DType::F64)?.sum(&[-1], false)?],
        "sum_long_row" => vec![a().sum(&[-1], false)?],

        // ---- mean ----
        "mean_all" => vec![a().mean(&[], false)?],
        "mean_dim1" => vec![a().mean(&[1], false)?],
        "mean_dims_keepdim" => vec![a().mean(&[1, 2], true)?],
        "mean_neg_dim" => vec![a().mean(&[-2], false)?],
        "mean_bf16" => vec![a().mean(&[-1], false)?],
        "mean_f16" => vec![a().mean(&[], false)?],
        "mean_size0" => vec![a().mean(&[], false)?],

        // ---- prod ----
        "prod_all" => vec![a().prod(&[], false)?],
        "prod_dim" => vec![a().prod(&[1], false)?],
        "prod_keepdim_neg" => vec![a().prod(&[-1], true)?],
        "prod_i32_to_i64" => vec![a().prod(&[], false)?],
        "prod_size0" => vec![a().prod(&[0], false)?],

        // ---- max / min ----
        "max_all" => vec![a().max_all()?],
        "min_all" => vec![a().min_all()?],
        "max_dim1" => {
            let (values, indices) = a().max_dim(1, false)?;
            vec![values, indices]
        }
        "min_dim_keepdim" => {
            let (values, indices) = a().min_dim(-1, true)?;
            vec![values, indices]
        }
        "max_dim_i64" => {
            let (values, indices) = a().max_dim(1, false)?;
            vec![values, indices]
        }
        "max_dim_bf16" => {
            let (values, indices) = a().max_dim(-1, false)?;
            vec![values, indices]
        }
        "max_nan" => vec![a().max_all()?],
        "max_dim_nan" => {
            let (values, indices) = a().max_dim(1, false)?;
            vec![values, indices]
        }

        // ---- amax / amin ----
        "amax_dims" => vec![a().amax(&[0, 2], false)?],
        "amin_keepdim" => vec![a().amin(&[-1], true)?],
        "amax_all" => vec![a().amax(&[], false)?],
        "amax_i32" => vec![a().amax(&[1], false)?],
        "amin_bf16" => vec![a().amin(&[0], false)?],

        // ---- argmax / argmin ----
        "argmax_all" => vec![a().argmax(None, false)?],
        "argmax_dim1" => vec![a().argmax(Some(1), false)?],
        "argmax_keepdim" => vec![a().argmax(Some(-1), true)?],
        "argmin_all" => vec![a().argmin(None, false)?],
        "argmin_dim0" => vec![a().argmin(Some(0), false)?],
        "argmax_transposed" => vec![a().t()?.argmax(Some(-1), false)?],
        "argmax_ties_first" => vec![a().argmax(Some(1), false)?],
        "argmax_i64" => vec![a().argmax(Some(0), false)?],

        // ---- var / std ----
        "var_default" => vec![a().var(&[], 1.0, false)?],
        "var_dim_corr0" => vec![a().var(&[1], 0.0, false)?],
        "var_dim_corr1_keepdim" => vec![a().var(&[-1], 1.0, true)?],
        // `unbiased=False` is `correction=0`.
        "var_unbiased_false" => vec![a().var(&[2], 0.0, false)?],
        "var_dims" => vec![a().var(&[0, 2], 1.0, false)?],
        "var_size1_dim_nan" => vec![a().var(&[1], 1.0, false)?],
        "std_default" => vec![a().std(&[], 1.0, false)?],
        "std_dim_corr0" => vec![a().std(&[0], 0.0, false)?],
        "std_dims_keepdim" => vec![a().std(&[0, 1], 1.0, true)?],
        "std_f64" => vec![a().std(&[-1], 1.0, false)?],

        // ---- logsumexp ----
        "logsumexp_dim1" => vec![a().logsumexp(&[1], false)?],
        "logsumexp_dims" => vec![a().logsumexp(&[0, 2], false)?],
        "logsumexp_keepdim_neg" => vec![a().logsumexp(&[-1], true)?],
        "logsumexp_large" => vec![a().logsumexp(&[-1], false)?],
        "logsumexp_neginf" => vec![a().logsumexp(&[-1], false)?],
        "logsumexp_bf16" => vec![a().logsumexp(&[-1], false)?],

        // ---- norm (torch.norm / torch.linalg.vector_norm) ----
        "norm_l2_all" => vec![a().norm(2.0, &[], false)?],
        "norm_l2_dim" => vec![a().norm(2.0, &[1], false)?],
        "norm_l1_dim" => vec![a().norm(1.0, &[-1], false)?],
        "norm_inf_all" => vec![a().norm(inf, &[], false)?],
        "norm_inf_dim_keepdim" => vec![a().norm(inf, &[0, 1], true)?],
        "norm_p1_all" => vec![a().norm(1.0, &[], false)?],
        "norm_l2_bf16" => vec![a().norm(2.0, &[-1], false)?],

        // ---- all / any ----
        "all_bool" => vec![a().all_all()?],
        "all_true" => vec![a().all_all()?],
        "all_dim1" => vec![a().all(&[1], false)?],
        "any_bool" => vec![a().any_all()?],
        "any_dim0_keepdim" => vec![a().any(&[0], true)?],
        "any_f32_dim" => vec![a().any(&[1], false)?],
        "all_i64" => vec![a().all_all()?],
        "all_empty" => vec![a().all_all()?],
        "any_empty" => vec![a().any_all()?],

        // ---- cumsum ----
        "cumsum_dim0" => vec![a().cumsum(0)?],
        "cumsum_neg_dim" => vec![a().cumsum(-1)?],
        "cumsum_i32_to_i64" => vec![a().cumsum(1)?],
        "cumsum_bool" => vec![a().cumsum(0)?],
        "cumsum_bf16" => vec![a().cumsum(-1)?],
        "cumsum_transposed" => vec![a().t()?.cumsum(1)?],

        // ---- errors PyTorch raises ----
        "err_sum_dim_range" => vec![a().sum(&[3], false)?],
        "err_mean_int" => vec![a().mean(&[], false)?],
        "err_max_empty_dim" => {
            let (values, indices) = a().max_dim(0, false)?;
            vec![values, indices]
        }

        _ => return Ok(None),
    }))
}
