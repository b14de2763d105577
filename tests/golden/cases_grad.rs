//! Golden cases: gradients (`torch.autograd.grad` of a scalar loss against [`coil::grad`]), a
//! small training step of the bench's MLP among them, and their `err_` cases.
use super::{Inputs, Outputs};
use coil::*;

pub fn run(name: &str, i: &Inputs) -> Option<Outputs> {
    case(name, i).transpose()
}

/// The case's outputs (the gradients, in the case's order), or `Ok(None)` when the case is not in
/// this table.
fn case(name: &str, i: &Inputs) -> Result<Option<Vec<Tensor>>> {
    let x = |n: &str| &i[n];
    let (a, b, c, d, w) = (|| x("a"), || x("b"), || x("c"), || x("d"), || x("w"));
    let sum = |t: Tensor| t.sum_all();
    Ok(Some(match name {
        "grad_mlp_train_step" => {
            let h = linear(a(), b(), None)?.gelu(false)?;
            let h = linear(&h, c(), None)?.gelu(false)?;
            let loss = linear(&h, d(), None)?.cross_entropy(x("t"), CrossEntropyOptions::default())?;
            grad(&loss, &[b(), c(), d()])?
        }
        "grad_softmax_weighted" => grad(&sum(a().softmax(-1)?.mul(b())?)?, &[a()])?,
        "grad_layer_norm_affine" => {
            let y = a().layer_norm(&[6], Some(w()), Some(c()), 1e-5)?;
            grad(&sum(y.mul(d())?)?, &[a(), w(), c()])?
        }
        "grad_pointwise_chain" => {
            let (b, c) = (b(), c());
            let terms = [
                a().tanh()?.mul(&b.sigmoid()?)?,
                a().mul(0.3)?.exp()?.div(&b.mul(b)?.add(1.0)?)?,
                c.sqrt()?.mul(&c.log()?)?,
                c.rsqrt()?,
                a().erf()?.mul(&b.sin()?)?,
                a().cos()?.neg()?,
                b.abs()?.mul(&c.reciprocal()?)?,
            ];
            let mut total = terms[0].clone();
            for t in &terms[1..] {
                total = total.add(t)?;
            }
            grad(&sum(total)?, &[a(), b, c])?
        }
        "grad_pow_tensor" => grad(&sum(a().pow(b())?)?, &[a(), b()])?,
        "grad_amax_ties" => grad(&sum(a().amax(&[1], false)?.mul(b())?)?, &[a()])?,
        "grad_maximum_ties" => grad(&sum(a().maximum(b())?.mul(c())?)?, &[a(), b()])?,
        "grad_views" => {
            let v = a().permute(&[1, 0])?.slice(0, Some(1), None, 1)?.slice(1, None, None, 2)?;
            grad(&sum(v.add(c())?.sum(&[0], false)?.mul(b())?)?, &[a(), c()])?
        }
        "grad_slice_steps" => {
            let v = a().slice(0, Some(1), None, 2)?.slice(1, Some(2), Some(10), 3)?;
            grad(&sum(v.mul(b())?)?, &[a()])?
        }
        "grad_cat_pad_flip" => {
            let y = cat(&[&a().pad(&[1, 2], 0.0)?, &a().flip(&[1])?], 1)?;
            grad(&sum(y.mul(b())?)?, &[a()])?
        }
        "grad_cumsum" => grad(&sum(a().cumsum(1)?.mul(b())?)?, &[a()])?,
        "grad_embedding" => grad(&sum(embedding(x("idx"), w())?.mul(b())?)?, &[w()])?,
        "grad_gather" => grad(&sum(a().gather(1, x("idx"))?.mul(b())?)?, &[a()])?,
        "grad_bmm" => grad(&sum(a().bmm(b())?.mul(c())?)?, &[a(), b()])?,
        "grad_mse_var" => {
            let loss = a().mse_loss(b(), LossReduction::Mean)?.add(&a().var(&[1], 1.0, false)?.sum_all()?)?;
            grad(&loss, &[a()])?
        }
        "grad_bf16_linear_gelu" => {
            let y = linear(a(), w(), None)?.gelu(false)?.to_dtype(DType::F32)?;
            grad(&sum(y)?, &[a(), w()])?
        }
        "err_grad_nonscalar" => grad(&a().mul(2.0)?, &[a()])?,
        "err_grad_unused" => grad(&sum(a().mul(2.0)?)?, &[a(), b()])?,
        _ => return Ok(None),
    }))
}
