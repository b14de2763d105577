//! Golden cases: linear algebra (matmul, mm, bmm, linear), nn functions (softmax, log_softmax,
//! layer_norm, rms_norm, embedding, cross_entropy, mse_loss, scaled_dot_product_attention), the
//! composite model blocks, and their `err_` cases.
use super::{Inputs, Outputs};
use coil::*;

pub fn run(name: &str, i: &Inputs) -> Option<Outputs> {
    case(name, i).transpose()
}

/// PyTorch's default `eps` for `F.layer_norm`.
const LN_EPS: f64 = 1e-5;

/// `F.cross_entropy` over `[N, C, d1, ...]` logits, which coil's `cross_entropy` does not take:
/// the class dim moved last and the rest flattened into the batch (same mean and sum).
fn cross_entropy_nd(logits: &Tensor, target: &Tensor, options: CrossEntropyOptions) -> coil::Result<Tensor> {
    let mut perm: Vec<i64> = vec![0];
    perm.extend(2..logits.rank() as i64);
    perm.push(1);
    let classes = logits.shape()[1] as i64;
    logits.permute(&perm)?.reshape(&[-1, classes])?.cross_entropy(&target.reshape(&[-1])?, options)
}

/// The case's outputs, or `Ok(None)` when the case is not in this table.
fn case(name: &str, i: &Inputs) -> coil::Result<Option<Vec<Tensor>>> {
    let x = |n: &str| &i[n];
    let (a, b, c, w, t) = (|| x("a"), || x("b"), || x("c"), || x("w"), || x("t"));
    let (q, k, v, m) = (|| x("q"), || x("k"), || x("v"), || x("m"));
    let ce = CrossEntropyOptions::default;
    Ok(Some(match name {
        // ---- matmul / mm / bmm ----
        "matmul_2d" => vec![a().matmul(b())?],
        "matmul_1d_2d" => vec![a().matmul(b())?],
        "matmul_2d_1d" => vec![a().matmul(b())?],
        "matmul_1d_1d" => vec![a().matmul(b())?],
        "matmul_batched_bcast" => vec![a().matmul(b())?],
        "matmul_3d_2d" => vec![a().matmul(b())?],
        "matmul_1d_3d" => vec![a().matmul(b())?],
        "matmul_transposed" => vec![a().t()?.matmul(b())?],
        "matmul_inner0" => vec![a().matmul(b())?],
        "matmul_bf16" => vec![a().matmul(b())?],
        "matmul_f64" => vec![a().matmul(b())?],
        "matmul_larger" => vec![a().matmul(b())?],
        "mm_f32" => vec![a().mm(b())?],
        "mm_transposed_b" => vec![a().mm(&b().t()?)?],
        "bmm_f32" => vec![a().bmm(b())?],
        "bmm_transposed_b" => vec![a().bmm(&b().transpose(1, 2)?)?],

        // ---- linear ----
        "linear_bias" => vec![linear(a(), w(), Some(b()))?],
        "linear_nobias" => vec![linear(a(), w(), None)?],
        "linear_3d_input" => vec![linear(a(), w(), Some(b()))?],
        "linear_1d_input" => vec![linear(a(), w(), Some(b()))?],

        // ---- softmax / log_softmax ----
        "softmax_f32_dim1" => vec![a().softmax(1)?],
        "softmax_f32_dim0" => vec![a().softmax(0)?],
        "softmax_f32_neg1_3d" => vec![a().softmax(-1)?],
        "softmax_3d_dim1" => vec![a().softmax(1)?],
        "softmax_bf16" => vec![a().softmax(-1)?],
        "softmax_f16" => vec![a().softmax(-1)?],
        "softmax_f64" => vec![a().softmax(-1)?],
        // `softmax(dtype=torch.float32)` casts the input first.
        "softmax_bf16_dtype_f32" => vec![a().to_dtype(DType::F32)?.softmax(-1)?],
        "softmax_neginf" => vec![a().softmax(-1)?],
        "softmax_large" => vec![a().softmax(-1)?],
        "softmax_transposed" => vec![a().t()?.softmax(-1)?],
        "softmax_size1_dim" => vec![a().softmax(-1)?],
        "softmax_long_row" => vec![a().softmax(-1)?],
        "log_softmax_f32_dim1" => vec![a().log_softmax(1)?],
        "log_softmax_dim0" => vec![a().log_softmax(0)?],
        "log_softmax_bf16" => vec![a().log_softmax(-1)?],
        "log_softmax_3d_neg2" => vec![a().log_softmax(-2)?],
        "log_softmax_large" => vec![a().log_softmax(-1)?],
        "log_softmax_neginf" => vec![a().log_softmax(-1)?],

        // ---- layer_norm / rms_norm ----
        "layer_norm_plain" => vec![a().layer_norm(&[8], None, None, LN_EPS)?],
        "layer_norm_weight_bias" => vec![a().layer_norm(&[8], Some(w()), Some(b()), LN_EPS)?],
        "layer_norm_weight_only" => vec![a().layer_norm(&[8], Some(w()), None, LN_EPS)?],
        "layer_norm_2d_shape" => vec![a().layer_norm(&[3, 4], Some(w()), Some(b()), LN_EPS)?],
        "layer_norm_eps" => vec![a().layer_norm(&[8], Some(w()), Some(b()), 1e-2)?],
        "layer_norm_bf16" => vec![a().layer_norm(&[8], Some(w()), Some(b()), LN_EPS)?],
        "layer_norm_3d_input" => vec![a().layer_norm(&[8], Some(w()), Some(b()), LN_EPS)?],
        "rms_norm_weight" => vec![a().rms_norm(&[8], Some(w()), None)?],
        "rms_norm_eps" => vec![a().rms_norm(&[8], Some(w()), Some(1e-3))?],
        "rms_norm_eps_none" => vec![a().rms_norm(&[8], None, None)?],
        "rms_norm_2d_shape" => vec![a().rms_norm(&[3, 4], Some(w()), None)?],
        "rms_norm_bf16" => vec![a().rms_norm(&[8], Some(w()), Some(1e-6))?],

        // ---- embedding ----
        "embedding_1d" => vec![embedding(x("idx"), w())?],
        "embedding_2d" => vec![embedding(x("idx"), w())?],
        "embedding_bf16" => vec![embedding(x("idx"), w())?],
        // `padding_idx` only changes the gradient; the forward value is a plain lookup.
        "embedding_padding_idx" => vec![embedding(x("idx"), w())?],

        // ---- cross_entropy / mse_loss ----
        "cross_entropy_mean" => vec![a().cross_entropy(t(), ce())?],
        "cross_entropy_weight" => vec![a().cross_entropy_weighted(t(), w(), ce())?],
        "cross_entropy_sum" => {
            vec![a().cross_entropy(t(), CrossEntropyOptions { reduction: LossReduction::Sum, ..ce() })?]
        }
        "cross_entropy_none" => {
            vec![a().cross_entropy(t(), CrossEntropyOptions { reduction: LossReduction::None, ..ce() })?]
        }
        "cross_entropy_ignore_default" => vec![a().cross_entropy(t(), ce())?],
        "cross_entropy_ignore_none" => {
            vec![a().cross_entropy(t(), CrossEntropyOptions { reduction: LossReduction::None, ..ce() })?]
        }
        "cross_entropy_ignore_custom" => vec![a().cross_entropy(t(), CrossEntropyOptions { ignore_index: 2, ..ce() })?],
        "cross_entropy_label_smoothing" => {
            vec![a().cross_entropy(t(), CrossEntropyOptions { label_smoothing: 0.1, ..ce() })?]
        }
        "cross_entropy_ls_sum" => {
            vec![a().cross_entropy(
                t(),
                CrossEntropyOptions { reduction: LossReduction::Sum, label_smoothing: 0.1, ..ce() },
            )?]
        }
        "cross_entropy_ls_ignore" => {
            vec![a().cross_entropy(t(), CrossEntropyOptions { label_smoothing: 0.1, ..ce() })?]
        }
        "cross_entropy_bf16_upcast" => vec![a().to_dtype(DType::F32)?.cross_entropy(t(), ce())?],
        "cross_entropy_3d" => vec![cross_entropy_nd(a(), t(), ce())?],
        "cross_entropy_all_ignored_nan" => vec![a().cross_entropy(t(), ce())?],
        "cross_entropy_large_logits" => vec![a().cross_entropy(t(), ce())?],
        "mse_loss_mean" => vec![a().mse_loss(b(), LossReduction::Mean)?],
        "mse_loss_sum" => vec![a().mse_loss(b(), LossReduction::Sum)?],
        "mse_loss_none" => vec![a().mse_loss(b(), LossReduction::None)?],
        "mse_loss_bf16" => vec![a().mse_loss(b(), LossReduction::Mean)?],

        // ---- scaled_dot_product_attention ----
        "sdpa_basic" => vec![scaled_dot_product_attention(q(), k(), v(), None, false, None)?],
        "sdpa_causal" => vec![scaled_dot_product_attention(q(), k(), v(), None, true, None)?],
        "sdpa_float_mask" => vec![scaled_dot_product_attention(q(), k(), v(), Some(m()), false, None)?],
        "sdpa_bool_mask" => vec![scaled_dot_product_attention(q(), k(), v(), Some(m()), false, None)?],
        "sdpa_scale" => vec![scaled_dot_product_attention(q(), k(), v(), None, false, Some(0.5))?],
        "sdpa_causal_scale" => vec![scaled_dot_product_attention(q(), k(), v(), None, true, Some(0.25))?],
        "sdpa_cross_len" => vec![scaled_dot_product_attention(q(), k(), v(), None, false, None)?],
        "sdpa_3d" => vec![scaled_dot_product_attention(q(), k(), v(), None, false, None)?],
        "sdpa_bf16_causal" => vec![scaled_dot_product_attention(q(), k(), v(), None, true, None)?],
        "sdpa_bool_mask_dead_row"
        | "sdpa_decode_mask"
        | "sdpa_gqa_rows_mask"
        | "sdpa_bf16_bool_mask"
        | "sdpa_float_mask_neg_inf"
        | "sdpa_bool_mask_long" => vec![scaled_dot_product_attention(q(), k(), v(), Some(m()), false, None)?],
        "sdpa_float_mask_fixed" => vec![scaled_dot_product_attention(q(), k(), v(), Some(x("z")), false, None)?],

        // ---- composites ----
        "composite_softmax_affine" => vec![a().matmul(b())?.add(c())?.softmax(-1)?],
        "composite_attention" => {
            let scores = q().matmul(&k().transpose(-2, -1)?)?.div(8f64.sqrt())?;
            vec![scores.softmax(-1)?.matmul(v())?]
        }
        "composite_gelu_mlp" => {
            let hidden = linear(a(), b(), Some(c()))?.gelu(false)?;
            vec![linear(&hidden, x("d"), Some(x("e")))?]
        }
        "composite_prenorm_residual" => {
            let normed = a().layer_norm(&[8], None, None, LN_EPS)?;
            vec![a().add(&linear(&normed, w(), None)?)?]
        }
        "composite_swiglu" => {
            let gated = linear(a(), b(), None)?.silu()?.mul(&linear(a(), c(), None)?)?;
            vec![linear(&gated, x("d"), None)?]
        }
        "composite_linear_cross_entropy" => vec![linear(a(), w(), None)?.cross_entropy(t(), ce())?],
        "composite_sigmoid_tanh_bcast" => vec![a().mul(2.0)?.add(1.0)?.sigmoid()?.mul(&b().tanh()?)?],
        "composite_centered_var" => vec![a().sub(&a().mean(&[-1], true)?)?.pow(2)?.mean(&[-1], false)?],

        // ---- errors PyTorch raises ----
        "err_matmul_inner" => vec![a().matmul(b())?],
        "err_matmul_0d" => vec![a().matmul(b())?],
        "err_mm_3d" => vec![a().mm(b())?],
        "err_bmm_batch" => vec![a().bmm(b())?],
        "err_linear_shape" => vec![linear(a(), w(), None)?],
        "err_embedding_oob" => vec![embedding(x("idx"), w())?],
        "err_softmax_dim" => vec![a().softmax(2)?],
        "err_layer_norm_shape" => vec![a().layer_norm(&[5], None, None, LN_EPS)?],
        "err_cross_entropy_target_oob" => vec![a().cross_entropy(t(), ce())?],
        "err_sdpa_head_dim" => vec![scaled_dot_product_attention(q(), k(), v(), None, false, None)?],

        _ => return Ok(None),
    }))
}
