//! Snapshots of captured and decomposed graphs: the printed IR is part of coil's interface
//! (debug dumps show it), so it must be deterministic and reviewed when it changes.

use coil::{DType, Tensor};

#[track_caller]
fn randn(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::randn(shape, dtype).unwrap()
}

/// The captured graph (with source lines) and the primitive graph it decomposes to.
fn both(outputs: &[&Tensor]) -> String {
    let captured = coil::capture(outputs).graph;
    let primitive = coil::decompose(&captured).unwrap();
    primitive.verify_primitive().unwrap();
    format!("{}\n{}", captured.print(true), primitive)
}

#[test]
fn softmax_graph() {
    coil::manual_seed(0);
    let x = randn(&[4, 16], DType::F32);
    let y = x.softmax(-1).unwrap();
    insta::assert_snapshot!(both(&[&y]));
}

#[test]
fn layer_norm_graph() {
    coil::manual_seed(0);
    let x = randn(&[4, 16], DType::BF16);
    let (w, b) = (randn(&[16], DType::BF16), randn(&[16], DType::BF16));
    let y = x.layer_norm(&[16], Some(&w), Some(&b), 1e-5).unwrap();
    insta::assert_snapshot!(both(&[&y]));
}

/// One GPT-2 attention block, written out as a user would: pre-norm, QKV projection, causal
/// attention with an explicit mask and softmax in f32, output projection, residual.
fn gpt2_attention(x: &Tensor, heads: usize) -> coil::Result<Tensor> {
    let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let hd = c / heads;
    let ln_w = Tensor::ones(&[c], DType::F32);
    let ln_b = Tensor::zeros(&[c], DType::F32);
    let w_qkv = randn(&[3 * c, c], DType::F32);
    let b_qkv = randn(&[3 * c], DType::F32);
    let w_proj = randn(&[c, c], DType::F32);
    let b_proj = randn(&[c], DType::F32);

    let h = x.layer_norm(&[c], Some(&ln_w), Some(&ln_b), 1e-5)?;
    let qkv = h.linear(&w_qkv, Some(&b_qkv))?;
    let heads_of = |part: &Tensor| part.reshape(&[b as i64, t as i64, heads as i64, hd as i64])?.transpose(1, 2);
    let parts = qkv.split(c, -1)?;
    let (q, k, v) = (heads_of(&parts[0])?, heads_of(&parts[1])?, heads_of(&parts[2])?);
    let scores = q.matmul(&k.transpose(-2, -1)?)? * (1.0 / (hd as f64).sqrt());
    let causal = Tensor::ones(&[t, t], DType::Bool).tril(0)?;
    let scores = coil::where_(&causal, &scores, f64::NEG_INFINITY)?;
    let attn = scores.softmax(-1)?.matmul(&v)?;
    let y = attn.transpose(1, 2)?.reshape(&[b as i64, t as i64, c as i64])?;
    Ok(x + y.linear(&w_proj, Some(&b_proj))?)
}

#[test]
fn gpt2_attention_graph() {
    coil::manual_seed(0);
    let x = randn(&[2, 8, 16], DType::F32);
    let y = gpt2_attention(&x, 2).unwrap();
    insta::assert_snapshot!(both(&[&y]));
}

#[test]
fn gpt2_attention_runs_and_rows_are_finite() {
    coil::manual_seed(1);
    let x = randn(&[2, 8, 16], DType::F32);
    let y = gpt2_attention(&x, 2).unwrap();
    let v = y.to_vec::<f32>().unwrap();
    assert_eq!(v.len(), 2 * 8 * 16);
    assert!(v.iter().all(|x| x.is_finite()));
}

#[test]
fn printing_is_deterministic() {
    let run = || {
        coil::manual_seed(3);
        let x = randn(&[2, 8, 16], DType::F32);
        both(&[&gpt2_attention(&x, 2).unwrap()])
    };
    assert_eq!(run(), run());
}
