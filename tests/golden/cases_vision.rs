//! Golden cases: assembling and splitting (`diff`, `block_diag`, `tensor_split`,
//! `slice_scatter`, ...) and the `[N, C, *spatial]` ops (`group_norm`, `batch_norm`, pooling,
//! `interpolate`, `pixel_shuffle`) that coil writes as compositions of its primitives.
use super::{Inputs, Outputs};
use coil::*;

pub fn run(name: &str, i: &Inputs) -> Option<Outputs> {
    case(name, i).transpose()
}

/// The case's outputs, or `Ok(None)` when the case is not in this table.
fn case(name: &str, i: &Inputs) -> Result<Option<Vec<Tensor>>> {
    let x = |n: &str| &i[n];
    let (a, b, c, w, y, z) = (|| x("a"), || x("b"), || x("c"), || x("w"), || x("y"), || x("z"));
    let linear = |align_corners| Interpolation::Linear { align_corners };
    let conv = ConvOptions::<2>::default;
    let sample = |bilinear, border, align_corners| GridSample::Sample { bilinear, border, align_corners };
    let bag = |mode, offsets: Option<&Tensor>, weights: Option<&Tensor>, last, padding| {
        embedding_bag(x("idx"), w(), offsets, mode, weights, last, padding)
    };
    Ok(Some(match name {
        "diff_1" | "diff_bool" | "diff_i64" => vec![a().diff(1, -1, None, None)?],
        "diff_2_dim0" => vec![a().diff(2, 0, None, None)?],
        "diff_prepend_append" => vec![a().diff(1, 1, Some(b()), Some(c()))?],
        "block_diag_mixed" => vec![block_diag(&[a(), b(), c()])?],
        "block_diag_i64" => vec![block_diag(&[a(), b()])?],
        "cartesian_prod_2" => vec![cartesian_prod(&[a(), b()])?],
        "cartesian_prod_3_i64" => vec![cartesian_prod(&[a(), b(), c()])?],
        "broadcast_tensors_3" => broadcast_tensors(&[a(), b(), c()])?,
        "err_broadcast_tensors" => broadcast_tensors(&[a(), b()])?,
        "tensor_split_sections" => a().tensor_split(3, 1)?,
        "tensor_split_indices" => a().tensor_split_at(&[1, 4, 10], 0)?,
        "hsplit_2d" => a().hsplit(2)?,
        "vsplit_2d" => a().vsplit(3)?,
        "err_hsplit_uneven" => a().hsplit(3)?,
        "slice_scatter_step" => vec![a().slice_scatter(b(), 1, Some(1), None, 2)?],
        "slice_scatter_dim0" => vec![a().slice_scatter(b(), 0, Some(2), Some(4), 1)?],
        "select_scatter_dim1" => vec![a().select_scatter(b(), 1, -1)?],
        "group_norm_affine" => vec![a().group_norm(2, Some(w()), Some(b()), 1e-5)?],
        "group_norm_plain_4d" => vec![a().group_norm(3, None, None, 1e-3)?],
        "err_group_norm_groups" => vec![a().group_norm(3, None, None, 1e-5)?],
        "instance_norm_affine" => vec![a().instance_norm(Some(w()), Some(b()), 1e-5)?],
        "instance_norm_plain_4d" => vec![a().instance_norm(None, None, 1e-5)?],
        "batch_norm_inference" => vec![a().batch_norm(Some(y()), Some(z()), Some(w()), Some(b()), false, 1e-5)?],
        "batch_norm_training_no_stats" => vec![a().batch_norm(None, None, Some(w()), Some(b()), true, 1e-3)?],
        "batch_norm_training_2d" => vec![a().batch_norm(None, None, None, None, true, 1e-5)?],
        "max_pool2d_k2" | "max_pool2d_nan" => vec![a().max_pool2d([2, 2], &[], [0, 0])?],
        "max_pool2d_k3_s2_p1" => vec![a().max_pool2d([3, 3], &[2, 2], [1, 1])?],
        "err_max_pool2d_pad" => vec![a().max_pool2d([2, 2], &[], [2, 2])?],
        "avg_pool2d_k2" => vec![a().avg_pool2d([2, 2], &[], [0, 0], true)?],
        "avg_pool2d_k3_p1_exclude" => vec![a().avg_pool2d([3, 3], &[2, 2], [1, 1], false)?],
        "avg_pool2d_k3_p1_include" => vec![a().avg_pool2d([3, 3], &[2, 2], [1, 1], true)?],
        "max_pool1d_k3_s2" => vec![a().max_pool1d(3, Some(2), 0)?],
        "avg_pool1d_k2" => vec![a().avg_pool1d(2, None, 0, true)?],
        "adaptive_avg_pool2d_uneven" => vec![a().adaptive_avg_pool(&[3, 2])?],
        "adaptive_avg_pool2d_global" => vec![a().adaptive_avg_pool(&[1, 1])?],
        "adaptive_avg_pool1d_3" => vec![a().adaptive_avg_pool(&[3])?],
        "interpolate_nearest_2d" => vec![a().interpolate(&[5, 3], Interpolation::Nearest)?],
        "interpolate_nearest_exact_1d" => vec![a().interpolate(&[7], Interpolation::NearestExact)?],
        "interpolate_bilinear" => vec![a().interpolate(&[5, 7], linear(false))?],
        "interpolate_bilinear_align" => vec![a().interpolate(&[2, 5], linear(true))?],
        "interpolate_linear_1d_down" => vec![a().interpolate(&[3], linear(false))?],
        "interpolate_bicubic_up" => vec![a().interpolate(&[5, 7], Interpolation::Bicubic { align_corners: false })?],
        "interpolate_bicubic_down_align" => {
            vec![a().interpolate(&[3, 2], Interpolation::Bicubic { align_corners: true })?]
        }
        "interpolate_trilinear" => vec![a().interpolate(&[3, 4, 5], linear(false))?],
        "interpolate_nearest_3d" => vec![a().interpolate(&[4, 2, 3], Interpolation::Nearest)?],
        "interpolate_area" => vec![a().interpolate(&[2, 3], Interpolation::Area)?],
        "pixel_shuffle_2" | "err_pixel_shuffle_channels" => vec![a().pixel_shuffle(2)?],
        "pixel_unshuffle_2" => vec![a().pixel_unshuffle(2)?],
        "local_response_norm_3d" => vec![a().local_response_norm(3, 1e-4, 0.75, 1.0)?],
        "local_response_norm_4d" => vec![a().local_response_norm(2, 0.1, 0.5, 2.0)?],
        "embedding_bag_mean_offsets" => vec![bag(BagMode::Mean, Some(x("o")), None, false, None)?],
        "embedding_bag_sum_padding" => vec![bag(BagMode::Sum, Some(x("o")), None, false, Some(4))?],
        "embedding_bag_include_last_offset" => vec![bag(BagMode::Sum, Some(x("o")), None, true, None)?],
        "embedding_bag_per_sample_weights" => vec![bag(BagMode::Sum, Some(x("o")), Some(b()), false, None)?],
        "embedding_bag_2d_max" => vec![bag(BagMode::Max, None, None, false, None)?],
        "embedding_bag_2d_mean" => vec![bag(BagMode::Mean, None, None, false, None)?],
        "max_pool3d_k2" => vec![a().max_pool3d([2, 2, 2], &[], [0, 0, 0])?],
        "max_pool3d_k3_s2_p1" => vec![a().max_pool3d([3, 3, 3], &[2, 2, 2], [1, 1, 1])?],
        "avg_pool3d_k2_s1" => vec![a().avg_pool3d([2, 2, 2], &[1, 1, 1], [0, 0, 0], true)?],
        "adaptive_max_pool2d_uneven" => vec![a().adaptive_max_pool(&[3, 2])?],
        "adaptive_max_pool1d_4" => vec![a().adaptive_max_pool(&[4])?],
        "adaptive_max_pool2d_nan" => vec![a().adaptive_max_pool(&[1, 1])?],
        "fold_k2" | "err_fold_blocks" => vec![a().fold([3, 4], [2, 2], [1, 1], [0, 0], [1, 1])?],
        "fold_k3_d2_p1_s2" => vec![a().fold([6, 7], [3, 3], [2, 2], [1, 1], [2, 2])?],
        "max_pool2d_ceil_dilation" => vec![a().max_pool(&[3, 3], &[2, 2], &[1, 1], &[2, 2], true)?],
        "max_pool1d_ceil" => vec![a().max_pool(&[2], &[2], &[0], &[], true)?],
        "avg_pool2d_ceil_include" => vec![a().avg_pool(&[3, 3], &[2, 2], &[1, 1], true, true)?],
        "avg_pool2d_ceil_exclude" => vec![a().avg_pool(&[3, 3], &[2, 2], &[1, 1], true, false)?],
        "avg_pool1d_ceil" => vec![a().avg_pool(&[2], &[2], &[0], true, true)?],
        "max_pool2d_ties" => vec![a().max_pool2d([3, 3], &[2, 2], [1, 1])?],
        "max_pool2d_ties_channels_last" => vec![a().max_pool2d_channels_last([3, 3], &[2, 2], [1, 1])?],
        "max_pool1d_ties_ceil" => vec![a().max_pool(&[3], &[2], &[0], &[], true)?],
        "max_pool2d_signed_zeros" => vec![a().max_pool2d([2, 2], &[], [0, 0])?],
        "max_pool3d_dilation" => vec![a().max_pool(&[2, 2, 2], &[1, 1, 1], &[0, 0, 0], &[2, 2, 2], false)?],
        "affine_grid_align" => vec![a().affine_grid([2, 3, 4, 5], true)?],
        "affine_grid_no_align" => vec![a().affine_grid([1, 1, 3, 2], false)?],
        "grid_sample_bilinear_zeros" => vec![a().grid_sample(&(b() * 0.8), sample(true, false, false))?],
        "grid_sample_bilinear_border_align" => vec![a().grid_sample(b(), sample(true, true, true))?],
        "grid_sample_nearest" => vec![a().grid_sample(&(b() * 0.8), sample(false, false, false))?],
        "unfold_k2" => vec![a().unfold2d([2, 2], [1, 1], [0, 0], [1, 1])?],
        "unfold_k3_d2_p1_s2" => vec![a().unfold2d([3, 3], [2, 2], [1, 1], [2, 2])?],
        "conv2d_basic" => vec![a().conv2d(w(), Some(b()), ConvOptions::default())?],
        "conv2d_stride_pad_dil" => {
            vec![a().conv2d(w(), None, ConvOptions { stride: [2, 2], padding: [1, 1], dilation: [2, 2], groups: 1 })?]
        }
        "conv2d_groups" => vec![a().conv2d(w(), Some(b()), ConvOptions { padding: [1, 1], groups: 2, ..conv() })?],
        "conv2d_depthwise" => {
            vec![a().conv2d(w(), None, ConvOptions { stride: [1, 2], padding: [2, 1], groups: 3, ..conv() })?]
        }
        "conv2d_bf16" => vec![a().conv2d(w(), Some(b()), ConvOptions { padding: [1, 1], ..conv() })?],
        "err_conv2d_channels" => vec![a().conv2d(w(), None, conv())?],
        "conv1d_basic" => {
            vec![a().conv1d(w(), Some(b()), ConvOptions { stride: [2], padding: [1], ..Default::default() })?]
        }
        "conv_transpose2d_basic" => {
            let o = ConvOptions { stride: [2, 2], padding: [1, 1], ..conv() };
            vec![a().conv_transpose2d(w(), Some(b()), o, [1, 1])?]
        }
        "conv_transpose2d_groups_dil" => {
            vec![a().conv_transpose2d(w(), None, ConvOptions { dilation: [2, 2], groups: 2, ..conv() }, [0, 0])?]
        }
        "conv_transpose1d_stride" => {
            vec![a().conv_transpose1d(w(), None, ConvOptions { stride: [3], ..Default::default() }, 0)?]
        }
        // The convolution template in every rank, channels-last views included.
        "conv3d_basic" => vec![a().conv3d(w(), Some(b()), ConvOptions::default())?],
        "conv3d_stride_pad_dil_groups" => {
            let o = ConvOptions { stride: [2, 1, 2], padding: [1, 2, 0], dilation: [1, 2, 2], groups: 2 };
            vec![a().conv3d(w(), None, o)?]
        }
        "conv3d_bf16" => vec![a().conv3d(w(), Some(b()), ConvOptions { padding: [1; 3], ..Default::default() })?],
        "conv3d_channels_last" => {
            let o = ConvOptions { padding: [1; 3], ..Default::default() };
            vec![a().permute(&[0, 4, 1, 2, 3])?.conv3d(w(), Some(b()), o)?]
        }
        "conv2d_channels_last" => {
            let o = ConvOptions { stride: [2, 2], padding: [1, 1], ..conv() };
            vec![a().permute(&[0, 3, 1, 2])?.conv2d(w(), Some(b()), o)?]
        }
        "conv2d_channels_last_groups_dil" => {
            let o = ConvOptions { padding: [2, 2], dilation: [2, 2], groups: 3, ..conv() };
            vec![a().permute(&[0, 3, 1, 2])?.conv2d(w(), None, o)?]
        }
        "conv2d_1x1_stride2" => vec![a().conv2d(w(), None, ConvOptions { stride: [2, 2], ..conv() })?],
        "conv2d_1x1_channels_last" => vec![a().permute(&[0, 3, 1, 2])?.conv2d(w(), Some(b()), conv())?],
        "conv2d_1x1_stride2_channels_last" => {
            vec![a().permute(&[0, 3, 1, 2])?.conv2d(w(), None, ConvOptions { stride: [2, 2], ..conv() })?]
        }
        "conv3d_1x1_stride_channels_last" => {
            let o = ConvOptions { stride: [1, 2, 3], ..Default::default() };
            vec![a().permute(&[0, 4, 1, 2, 3])?.conv3d(w(), None, o)?]
        }
        "conv_transpose2d_1x1_channels_last" => {
            let o = ConvOptions { stride: [2, 2], ..conv() };
            vec![a().permute(&[0, 3, 1, 2])?.conv_transpose2d(w(), None, o, [1, 1])?]
        }
        "conv1d_dil_groups" => {
            let o = ConvOptions { padding: [3], dilation: [3], groups: 2, ..Default::default() };
            vec![a().conv1d(w(), Some(b()), o)?]
        }
        "conv1d_channels_last" => {
            let o = ConvOptions { stride: [2], ..Default::default() };
            vec![a().permute(&[0, 2, 1])?.conv1d(w(), None, o)?]
        }
        "conv_transpose3d_basic" => {
            let o = ConvOptions { stride: [2; 3], padding: [1; 3], ..Default::default() };
            vec![a().conv_transpose3d(w(), Some(b()), o, [1; 3])?]
        }
        "conv_transpose2d_outpad_dil" => {
            let o = ConvOptions { stride: [2, 2], dilation: [3, 3], ..conv() };
            vec![a().conv_transpose2d(w(), None, o, [2, 2])?]
        }
        "err_conv3d_rank" | "err_conv3d_kernel_too_large" => vec![a().conv3d(w(), None, ConvOptions::default())?],
        _ => return Ok(None),
    }))
}
