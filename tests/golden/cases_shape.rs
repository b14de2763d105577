//! Golden cases: views, indexing and data movement (reshape, view, flatten, permute, expand,
//! squeeze, slicing, select, index_select, gather, scatter, cat, stack, split, chunk, repeat, flip,
//! pad, tril/triu, contiguous) and their `err_` cases.
use super::{Inputs, Outputs};
use coil::*;

pub fn run(name: &str, i: &Inputs) -> Option<Outputs> {
    case(name, i).transpose()
}

/// `a[idx]` for an integer index tensor of any shape: the selected rows, in the index's shape.
fn index_rows(a: &Tensor, idx: &Tensor) -> coil::Result<Tensor> {
    let rows = a.index_select(0, &idx.reshape(&[-1])?)?;
    let shape: Vec<i64> = idx.shape().iter().chain(&a.shape()[1..]).map(|&d| d as i64).collect();
    rows.reshape(&shape)
}

/// The case's outputs, or `Ok(None)` when the case is not in this table.
fn case(name: &str, i: &Inputs) -> coil::Result<Option<Vec<Tensor>>> {
    let a = || &i["a"];
    let b = || &i["b"];
    let c = || &i["c"];
    let idx = || &i["idx"];
    Ok(Some(match name {
        // ---- reshape / view ----
        "reshape_2d_to_3d" => vec![a().reshape(&[2, 3, 2])?],
        "reshape_infer" => vec![a().reshape(&[-1, 6])?],
        "reshape_flat" => vec![a().reshape(&[-1])?],
        "reshape_transposed" => vec![a().t()?.reshape(&[12])?],
        "reshape_size0" => vec![a().reshape(&[3, 0, 2])?],
        "reshape_to_0d" => vec![a().reshape(&[])?],
        "reshape_i64" => vec![a().reshape(&[4, 3])?],
        "view_2x6" => vec![a().view(&[2, 6])?],
        "view_add_dim" => vec![a().view(&[3, 1, 4])?],
        "err_view_noncontig" => vec![a().t()?.view(&[12])?],
        "view_infer_neg" => vec![a().view(&[-1, 2])?],

        // ---- flatten / unflatten ----
        "flatten_all" => vec![a().flatten(0, -1)?],
        "flatten_start1" => vec![a().flatten(1, -1)?],
        "flatten_0_1" => vec![a().flatten(0, 1)?],
        "flatten_neg" => vec![a().flatten(-2, -1)?],
        "flatten_0d" => vec![a().flatten(0, -1)?],
        "flatten_permuted" => vec![a().permute(&[1, 0, 2])?.flatten(1, -1)?],
        "unflatten_dim1" => vec![a().unflatten(1, &[2, 3])?],
        "unflatten_infer_neg" => vec![a().unflatten(-1, &[2, -1])?],

        // ---- permute / transpose / t ----
        "permute_3d" => vec![a().permute(&[2, 0, 1])?],
        "permute_neg" => vec![a().permute(&[-1, 0, -2])?],
        "permute_4d" => vec![a().permute(&[0, 2, 3, 1])?],
        "transpose_02" => vec![a().transpose(0, 2)?],
        "transpose_neg" => vec![a().transpose(-1, -2)?],
        "t_2d" => vec![a().t()?],
        "t_1d" => vec![a().t()?],

        // ---- expand / broadcast_to ----
        "expand_col" => vec![a().expand(&[3, 4])?],
        "expand_neg1" => vec![a().expand(&[-1, 4])?],
        "expand_new_dim" => vec![a().expand(&[2, 3, 4])?],
        "expand_as" => vec![a().expand_as(b())?],
        "broadcast_to_2d" => vec![a().broadcast_to(&[3, 4])?],
        "broadcast_to_3d" => vec![a().broadcast_to(&[2, 3, 4])?],

        // ---- squeeze / unsqueeze ----
        "squeeze_all" => vec![a().squeeze()?],
        "squeeze_dim" => vec![a().squeeze_dim(2)?],
        "squeeze_neg" => vec![a().squeeze_dim(-4)?],
        "squeeze_noop" => vec![a().squeeze_dim(1)?],
        // `squeeze((0, 2))`: the higher dim first, so the lower one keeps its index.
        "squeeze_dims" => vec![a().squeeze_dim(2)?.squeeze_dim(0)?],
        "unsqueeze_0" => vec![a().unsqueeze(0)?],
        "unsqueeze_neg" => vec![a().unsqueeze(-1)?],
        "unsqueeze_mid" => vec![a().unsqueeze(1)?],

        // ---- narrow / slicing / select ----
        "narrow_dim1" => vec![a().narrow(1, 1, 2)?],
        "narrow_neg" => vec![a().narrow(-1, 0, 3)?],
        "narrow_len0" => vec![a().narrow(0, 2, 0)?],
        "slice_step2" => vec![a().slice(0, Some(1), Some(5), 2)?],
        "slice_col_step3" => vec![a().slice(1, None, None, 3)?],
        "slice_neg_bounds" => vec![a().slice(0, Some(-3), None, 1)?.slice(1, Some(1), Some(-1), 1)?],
        "slice_2d_steps" => vec![a().slice(0, None, None, 2)?.slice(1, Some(1), None, 2)?],
        "slice_ellipsis" => vec![a().slice(-1, None, None, 2)?],
        "slice_oob_empty" => vec![a().slice(0, Some(5), Some(10), 1)?],
        "slice_clamped_end" => vec![a().slice(0, Some(1), Some(100), 1)?],
        // `a[:, None, 1:]`: the new axis is dim 1, so the sliced dim moves to 2.
        "slice_none" => vec![a().unsqueeze(1)?.slice(2, Some(1), None, 1)?],
        "select_dim1" => vec![a().select(1, 2)?],
        "select_index" => vec![a().select(0, 2)?],
        "select_neg_index" => vec![a().select(0, -1)?],
        "select_col_neg" => vec![a().select(1, -1)?],
        "select_neg_dim" => vec![a().select(-1, 0)?],

        // ---- index_select / advanced indexing / gather / scatter ----
        "index_select_dim0" => vec![a().index_select(0, idx())?],
        "index_select_dim1" => vec![a().index_select(1, idx())?],
        "index_select_neg_dim" => vec![a().index_select(-1, idx())?],
        "index_select_i64_data" => vec![a().index_select(0, idx())?],
        "index_tensor_rows" => vec![a().index_select(0, idx())?],
        "index_tensor_2d_idx" => vec![index_rows(a(), idx())?],
        "index_tensor_cols" => vec![a().index_select(1, idx())?],
        "gather_dim1" => vec![a().gather(1, idx())?],
        "gather_dim0" => vec![a().gather(0, idx())?],
        "gather_neg_dim" => vec![a().gather(-1, idx())?],
        "gather_smaller_index" => vec![a().gather(1, idx())?],
        "scatter_dim1" => vec![a().scatter(1, idx(), b())?],
        // A scalar source is a full tensor of the index's shape in `a`'s dtype.
        "scatter_scalar_dim0" => vec![a().scatter(0, idx(), &Tensor::full(idx().shape(), 2.0, a().dtype()))?],
        "scatter_add_dim1" => vec![a().scatter_add(1, idx(), b())?],
        "scatter_add_dim0" => vec![a().scatter_add(0, idx(), b())?],
        "scatter_add_i64" => vec![a().scatter_add(0, idx(), b())?],

        // ---- cat / stack ----
        "cat_dim0" => vec![cat(&[a(), b()], 0)?],
        "cat_dim1_three" => vec![cat(&[a(), b(), c()], 1)?],
        "cat_neg_dim" => vec![cat(&[a(), b()], -1)?],
        "cat_with_empty" => vec![cat(&[a(), b()], 0)?],
        "cat_promote_f32_f16" => vec![cat(&[a(), b()], 0)?],
        "cat_transposed" => vec![cat(&[&a().t()?, b()], 0)?],
        "cat_i64" => vec![cat(&[a(), b()], 1)?],
        "stack_dim0" => vec![stack(&[a(), b()], 0)?],
        "stack_neg" => vec![stack(&[a(), b(), c()], -1)?],
        "stack_mid" => vec![stack(&[a(), b()], 1)?],

        // ---- split / chunk ----
        "split_even" => a().split(2, 0)?,
        "split_uneven" => a().split(2, 1)?,
        "split_sizes" => a().split_sizes(&[1, 4], -1)?,
        "chunk_3" => a().chunk(3, 0)?,
        "chunk_fewer" => a().chunk(4, 0)?,
        "chunk_neg_dim" => a().chunk(2, -1)?,

        // ---- repeat / flip / pad ----
        "repeat_2d" => vec![a().repeat(&[2, 3])?],
        "repeat_add_dim" => vec![a().repeat(&[2, 1, 1])?],
        "repeat_ones" => vec![a().repeat(&[1, 1])?],
        "flip_dim0" => vec![a().flip(&[0])?],
        "flip_multi" => vec![a().flip(&[0, 2])?],
        "flip_neg" => vec![a().flip(&[-1])?],
        "pad_last" => vec![a().pad(&[1, 2], 0.0)?],
        "pad_2d_value" => vec![a().pad(&[1, 0, 2, 1], -1.5)?],
        "pad_3d" => vec![a().pad(&[1, 1, 0, 2, 1, 0], 0.5)?],
        "pad_negative_crop" => vec![a().pad(&[-1, 2], 0.0)?],
        "pad_i64" => vec![a().pad(&[1, 1], 7)?],
        "pad_bf16" => vec![a().pad(&[0, 3], 1.0)?],

        // ---- tril / triu ----
        "tril_default" => vec![a().tril(0)?],
        "tril_pos" => vec![a().tril(1)?],
        "tril_neg_tall" => vec![a().tril(-1)?],
        "triu_default" => vec![a().triu(0)?],
        "triu_pos2" => vec![a().triu(2)?],
        "triu_neg_tall" => vec![a().triu(-1)?],
        "triu_batched" => vec![a().triu(1)?],
        "tril_i64" => vec![a().tril(0)?],

        // ---- contiguous ----
        "contiguous_t" => vec![a().t()?.contiguous()],
        "contiguous_permute" => vec![a().permute(&[1, 0, 2])?.contiguous()],
        "contiguous_slice" => vec![a().slice(1, Some(1), None, 2)?.contiguous()],

        // ---- errors PyTorch raises ----
        "err_reshape_numel" => vec![a().reshape(&[5, 3])?],
        "err_reshape_two_infer" => vec![a().reshape(&[-1, -1])?],
        "err_unflatten_sizes" => vec![a().unflatten(1, &[5, 2])?],
        "err_cat_dims" => vec![cat(&[a(), b()], 0)?],
        "err_stack_shape" => vec![stack(&[a(), b()], 0)?],
        "err_split_sizes" => a().split_sizes(&[2, 2], 0)?,
        "err_chunk_zero" => a().chunk(0, 0)?,
        "err_gather_rank" => vec![a().gather(1, idx())?],
        "err_index_select_oob" => vec![a().index_select(0, idx())?],
        "err_permute_repeated" => vec![a().permute(&[0, 0, 1])?],
        "err_permute_len" => vec![a().permute(&[0, 1])?],
        "err_transpose_dim" => vec![a().transpose(0, 2)?],
        "err_t_3d" => vec![a().t()?],
        "err_expand_non1" => vec![a().expand(&[6, 4])?],
        "err_broadcast_to" => vec![a().broadcast_to(&[3, 5])?],
        "err_squeeze_dim_range" => vec![a().squeeze_dim(3)?],
        "err_narrow_oob" => vec![a().narrow(1, 2, 5)?],
        // `a[::-1]`
        "err_slice_negative_step" => vec![a().slice(0, None, None, -1)?],
        "err_repeat_fewer_dims" => vec![a().repeat(&[2])?],
        "err_pad_too_long" => vec![a().pad(&[1, 1, 1, 1], 0.0)?],

        _ => return Ok(None),
    }))
}
