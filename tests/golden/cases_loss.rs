//! Golden cases: losses and distances that coil writes as compositions of its primitives
//! (`nll_loss`, `l1_loss`, `binary_cross_entropy`, `kl_div`, `cosine_similarity`, ...), and
//! `cross_entropy` over `[N, C, d1, ...]` logits.
use super::{Inputs, Outputs};
use coil::*;

pub fn run(name: &str, i: &Inputs) -> Option<Outputs> {
    case(name, i).transpose()
}

fn reduction(name: &str) -> LossReduction {
    if name.ends_with("_sum") {
        LossReduction::Sum
    } else if name.ends_with("_none") {
        LossReduction::None
    } else {
        LossReduction::Mean
    }
}

/// The case's outputs, or `Ok(None)` when the case is not in this table.
fn case(name: &str, i: &Inputs) -> Result<Option<Vec<Tensor>>> {
    let x = |n: &str| &i[n];
    let (a, b, t, y, z) = (|| x("a"), || x("b"), || x("t"), || x("y"), || x("z"));
    let red = reduction(name);
    let nll = |weight: Option<&Tensor>, ignore_index: i64, reduction: LossReduction| NllLossOptions {
        weight: weight.cloned(),
        ignore_index,
        reduction,
    };
    Ok(Some(match name {
        "l1_loss_mean" | "l1_loss_sum" | "l1_loss_none" | "l1_loss_bf16" => vec![a().l1_loss(y(), red)?],
        "smooth_l1_loss_mean" | "smooth_l1_loss_sum" | "smooth_l1_loss_none" => {
            vec![a().smooth_l1_loss(y(), red, 0.5)?]
        }
        "smooth_l1_loss_beta0" => vec![a().smooth_l1_loss(y(), red, 0.0)?],
        "huber_loss_mean" | "huber_loss_sum" | "huber_loss_none" => vec![a().huber_loss(y(), red, 0.7)?],
        "err_huber_loss_delta" => vec![a().huber_loss(y(), red, 0.0)?],
        "binary_cross_entropy_mean" | "err_binary_cross_entropy_shape" => {
            vec![a().binary_cross_entropy(y(), None, LossReduction::Mean)?]
        }
        "binary_cross_entropy_weight_sum" => vec![a().binary_cross_entropy(y(), Some(z()), LossReduction::Sum)?],
        "binary_cross_entropy_edges" => vec![a().binary_cross_entropy(y(), None, LossReduction::None)?],
        "binary_cross_entropy_with_logits_mean" => {
            vec![a().binary_cross_entropy_with_logits(y(), None, None, LossReduction::Mean)?]
        }
        "binary_cross_entropy_with_logits_pos_weight" => {
            vec![a().binary_cross_entropy_with_logits(y(), Some(z()), Some(b()), LossReduction::None)?]
        }
        "binary_cross_entropy_with_logits_weight" => {
            vec![a().binary_cross_entropy_with_logits(y(), Some(z()), None, LossReduction::Sum)?]
        }
        "binary_cross_entropy_with_logits_large" => {
            vec![a().binary_cross_entropy_with_logits(y(), None, None, LossReduction::None)?]
        }
        "kl_div_batchmean" => vec![a().kl_div(y(), KlDivReduction::BatchMean, false)?],
        "kl_div_log_target_sum" => vec![a().kl_div(y(), KlDivReduction::Sum, true)?],
        "kl_div_none_zero_target" => vec![a().kl_div(y(), KlDivReduction::None, false)?],
        "kl_div_mean" => vec![a().kl_div(y(), KlDivReduction::Mean, false)?],
        "nll_loss_mean" | "nll_loss_4d" | "nll_loss_1d" | "err_nll_loss_target_shape" | "err_nll_loss_target_oob" => {
            vec![a().nll_loss(t(), NllLossOptions::default())?]
        }
        "nll_loss_weight_ignore" => vec![a().nll_loss(t(), nll(Some(z()), 1, LossReduction::Mean))?],
        "nll_loss_none" | "nll_loss_4d_none" => vec![a().nll_loss(t(), nll(None, -100, LossReduction::None))?],
        "nll_loss_sum" => vec![a().nll_loss(t(), nll(None, -100, LossReduction::Sum))?],
        "cross_entropy_4d_label_smoothing" => {
            vec![a().cross_entropy(t(), CrossEntropyOptions { label_smoothing: 0.2, ..Default::default() })?]
        }
        "cross_entropy_3d_none" => {
            vec![a().cross_entropy(t(), CrossEntropyOptions { reduction: LossReduction::None, ..Default::default() })?]
        }
        "cross_entropy_3d_weight_ignore" => {
            vec![a().cross_entropy_weighted(t(), z(), CrossEntropyOptions::default())?]
        }
        "margin_ranking_loss_mean" => vec![a().margin_ranking_loss(b(), y(), 0.3, LossReduction::Mean)?],
        "soft_margin_loss_mean" => vec![a().soft_margin_loss(y(), LossReduction::Mean)?],
        "hinge_embedding_loss_mean" => vec![a().hinge_embedding_loss(y(), 0.8, LossReduction::Mean)?],
        "poisson_nll_loss_log" => vec![a().poisson_nll_loss(y(), true, false, 1e-8, LossReduction::Mean)?],
        "poisson_nll_loss_full" => vec![a().poisson_nll_loss(y(), false, true, 1e-8, LossReduction::Sum)?],
        "gaussian_nll_loss_mean" => vec![a().gaussian_nll_loss(y(), b(), false, 1e-6, LossReduction::Mean)?],
        "gaussian_nll_loss_full_sum" => vec![a().gaussian_nll_loss(y(), b(), true, 1e-6, LossReduction::Sum)?],
        "cosine_similarity_dim1" => vec![a().cosine_similarity(b(), 1, 1e-8)?],
        "cosine_similarity_broadcast" => vec![a().cosine_similarity(b(), -1, 1e-8)?],
        "cosine_similarity_zero" => vec![a().cosine_similarity(b(), 0, 1e-8)?],
        "pairwise_distance_p2" => vec![a().pairwise_distance(b(), 2.0, 1e-6, false)?],
        "pairwise_distance_p1_keepdim" => vec![a().pairwise_distance(b(), 1.0, 1e-6, true)?],
        "normalize_dim1" | "normalize_zero_row" => vec![a().normalize(2.0, 1, 1e-12)?],
        "normalize_p1_dim0" => vec![a().normalize(1.0, 0, 1e-12)?],
        "cosine_embedding_loss_mean" => vec![a().cosine_embedding_loss(b(), y(), 0.2, LossReduction::Mean)?],
        "cosine_embedding_loss_none_1d" => vec![a().cosine_embedding_loss(b(), y(), 0.0, LossReduction::None)?],
        "triplet_margin_loss_mean" => {
            vec![a().triplet_margin_loss(b(), x("c"), 1.0, 2.0, 1e-6, false, LossReduction::Mean)?]
        }
        "triplet_margin_loss_swap_p1" => {
            vec![a().triplet_margin_loss(b(), x("c"), 0.5, 1.0, 1e-6, true, LossReduction::Sum)?]
        }
        "multilabel_soft_margin_loss_mean" => vec![a().multilabel_soft_margin_loss(y(), None, LossReduction::Mean)?],
        "multilabel_soft_margin_loss_weight" => {
            vec![a().multilabel_soft_margin_loss(y(), Some(z()), LossReduction::None)?]
        }
        _ => return Ok(None),
    }))
}
