//! Helpers shared by the integration tests: realized random data and a GPT-2 block.

#![allow(dead_code)] // each test crate uses its own part

use coil::{Backend, DType, Result, Tensor};

/// Computed data: a function's inputs and weights are values, not part of its graphs.
#[track_caller]
pub fn randn(shape: &[usize], dtype: DType) -> Tensor {
    let t = Tensor::randn(shape, dtype).unwrap();
    t.realize().unwrap();
    t
}

/// The same function run eagerly on the interpreter.
pub fn reference(f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>, args: &[Tensor]) -> Vec<Vec<f64>> {
    let before = coil::backend();
    coil::set_backend(Backend::Interpreter);
    let out = f(args).unwrap().iter().map(|t| t.to_vec::<f64>().unwrap()).collect();
    coil::set_backend(before);
    out
}

/// Elementwise `|a - b| <= tol * (1 + |b|)`.
pub fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// One GPT-2 block forward (as in `tests/kernels.rs`), weights made outside the function.
pub struct Block {
    ln: [Tensor; 4],
    qkv: (Tensor, Tensor),
    proj: (Tensor, Tensor),
    fc: (Tensor, Tensor),
    out: (Tensor, Tensor),
    heads: usize,
}

impl Block {
    pub fn new(c: usize, heads: usize) -> Block {
        let dt = DType::F32;
        Block {
            ln: [randn(&[c], dt), randn(&[c], dt), randn(&[c], dt), randn(&[c], dt)],
            qkv: (randn(&[3 * c, c], dt), randn(&[3 * c], dt)),
            proj: (randn(&[c, c], dt), randn(&[c], dt)),
            fc: (randn(&[4 * c, c], dt), randn(&[4 * c], dt)),
            out: (randn(&[c, 4 * c], dt), randn(&[c], dt)),
            heads,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, c) = (x.shape()[0] as i64, x.shape()[1] as i64, x.shape()[2] as i64);
        let (cu, hd, heads) = (c as usize, c / self.heads as i64, self.heads as i64);
        let h = x.layer_norm(&[cu], Some(&self.ln[0]), Some(&self.ln[1]), 1e-5)?;
        let parts = h.linear(&self.qkv.0, Some(&self.qkv.1))?.split(cu, -1)?;
        let heads_of = |p: &Tensor| p.reshape(&[b, t, heads, hd])?.transpose(1, 2);
        let (q, k, v) = (heads_of(&parts[0])?, heads_of(&parts[1])?, heads_of(&parts[2])?);
        let scores = q.matmul(&k.transpose(-2, -1)?)? * (1.0 / (hd as f64).sqrt());
        let causal = Tensor::ones(&[t as usize, t as usize], DType::Bool).tril(0)?;
        let probs = coil::where_(&causal, &scores, f64::NEG_INFINITY)?.softmax(-1)?;
        let attn = probs.matmul(&v)?.transpose(1, 2)?.reshape(&[b, t, c])?;
        let x = x + attn.linear(&self.proj.0, Some(&self.proj.1))?;
        let m = x.layer_norm(&[cu], Some(&self.ln[2]), Some(&self.ln[3]), 1e-5)?;
        let m = m.linear(&self.fc.0, Some(&self.fc.1))?.gelu(true)?.linear(&self.out.0, Some(&self.out.1))?;
        Ok(&x + &m)
    }
}

/// `||got - want|| / ||want||` in f64 (absolute when `want` is zero).
pub fn rel_err(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.shape(), want.shape(), "shapes");
    let (a, b) = (got.to_vec::<f64>().unwrap(), want.to_vec::<f64>().unwrap());
    let diff: f64 = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    let norm: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    if norm == 0.0 {
        diff
    } else {
        diff / norm
    }
}

/// Fails with `what` when `got` is further than `tol` from `want` ([`rel_err`]).
#[track_caller]
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    let e = rel_err(got, want);
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:.0e}");
}
