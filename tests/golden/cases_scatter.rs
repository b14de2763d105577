//! Golden cases: scatter with a reduction (`scatter_reduce`, `index_reduce`).
use super::{Inputs, Outputs};
use coil::*;

pub fn run(name: &str, i: &Inputs) -> Option<Outputs> {
    case(name, i).transpose()
}

/// The case's outputs, or `Ok(None)` when the case is not in this table.
fn case(name: &str, i: &Inputs) -> Result<Option<Vec<Tensor>>> {
    use ScatterReduce::{Amax, Amin, Mean, Prod, Sum};
    let (a, b, idx) = (|| &i["a"], || &i["b"], || &i["idx"]);
    let sr = |dim: i64, reduce: ScatterReduce, include_self: bool| -> Result<Vec<Tensor>> {
        Ok(vec![a().scatter_reduce(dim, idx(), b(), reduce, include_self)?])
    };
    let ir = |dim: i64, reduce: ScatterReduce, include_self: bool| -> Result<Vec<Tensor>> {
        Ok(vec![a().index_reduce(dim, idx(), b(), reduce, include_self)?])
    };
    Ok(Some(match name {
        "scatter_reduce_sum_f32" | "scatter_reduce_sum_bf16" | "err_scatter_reduce_dtype" => sr(0, Sum, true)?,
        "scatter_reduce_sum_exclude_f32" => sr(0, Sum, false)?,
        "scatter_reduce_prod_f32" => sr(1, Prod, true)?,
        "scatter_reduce_prod_exclude_f32" => sr(1, Prod, false)?,
        "scatter_reduce_prod_zeros" | "scatter_reduce_prod_bf16" => sr(0, Prod, true)?,
        "scatter_reduce_prod_i64" => sr(0, Prod, false)?,
        "scatter_reduce_mean_f32" | "scatter_reduce_mean_i64" => sr(0, Mean, true)?,
        "scatter_reduce_mean_exclude_f32" | "scatter_reduce_mean_exclude_i32" => sr(0, Mean, false)?,
        "scatter_reduce_amax_f32" | "scatter_reduce_src_larger" => sr(1, Amax, true)?,
        "scatter_reduce_amax_exclude_f32" => sr(1, Amax, false)?,
        "scatter_reduce_amax_ties" | "scatter_reduce_amax_nan" | "err_scatter_reduce_oob" => sr(0, Amax, true)?,
        "scatter_reduce_amax_i32" | "scatter_reduce_amax_f16" => sr(0, Amax, false)?,
        "scatter_reduce_amin_f32" | "scatter_reduce_amin_i64" => sr(0, Amin, true)?,
        "scatter_reduce_amin_exclude_f64" | "scatter_reduce_amin_nan_exclude" => sr(0, Amin, false)?,
        "index_reduce_prod_f32" | "err_index_reduce_2d_index" => ir(0, Prod, true)?,
        "index_reduce_mean_exclude_f32" => ir(1, Mean, false)?,
        "index_reduce_amax_f32" => ir(1, Amax, true)?,
        "index_reduce_amin_i64" => ir(0, Amin, false)?,
        "index_reduce_mean_i64" => ir(0, Mean, true)?,
        _ => return Ok(None),
    }))
}
