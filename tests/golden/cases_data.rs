//! Golden cases: ops whose output shape depends on the data (`nonzero`, `argwhere`,
//! `masked_select`, `unique`, `unique_consecutive`), computed on the host.
use super::{Inputs, Outputs};
use coil::*;

pub fn run(name: &str, i: &Inputs) -> Option<Outputs> {
    case(name, i).transpose()
}

/// The case's outputs, or `Ok(None)` when the case is not in this table.
fn case(name: &str, i: &Inputs) -> Result<Option<Vec<Tensor>>> {
    let (a, m) = (|| &i["a"], || &i["m"]);
    let all = |u: coil::Unique| vec![u.values, u.inverse, u.counts];
    Ok(Some(match name {
        "nonzero_f32" | "nonzero_bool_3d" | "nonzero_i64" | "nonzero_0d" | "nonzero_0d_zero" | "nonzero_empty"
        | "nonzero_all_zero" => vec![a().nonzero()?],
        "nonzero_as_tuple" => a().nonzero_tuple()?,
        "nonzero_transposed" => vec![a().t()?.nonzero()?],
        "argwhere_i32" => vec![a().argwhere()?],
        "masked_select_f32"
        | "masked_select_broadcast_mask"
        | "masked_select_broadcast_both"
        | "masked_select_i64"
        | "masked_select_bf16"
        | "masked_select_none"
        | "err_masked_select_int_mask"
        | "err_masked_select_shape" => vec![a().masked_select(m())?],
        "unique_i64" | "unique_f16" | "unique_u8" => vec![a().unique()?],
        "unique_f32_all" | "unique_empty" | "unique_0d" => all(a().unique_all()?),
        "unique_inverse_2d" => all(a().unique_all()?)[..2].to_vec(),
        "unique_counts_bool" => {
            let u = a().unique_all()?;
            vec![u.values, u.counts]
        }
        "unique_consecutive_i64" => all(a().unique_consecutive_all()?),
        "unique_consecutive_f32" => vec![a().unique_consecutive()?],
        "unique_consecutive_2d" => all(a().unique_consecutive_all()?)[..2].to_vec(),
        _ => return Ok(None),
    }))
}
