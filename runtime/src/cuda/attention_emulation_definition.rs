//! The reference of the emulated dropout cases: attention's decomposition as the reference
//! interpreter runs it, `softmax(scale q kᵀ (+ mask)) -> Dropout -> @ v` (a row that keeps no
//! key gives 0, as PyTorch's safe softmax), and its gradients, in f64 from the operands' own
//! (rounded) values. Weight `(b, row, key)` is kept iff `Op::Dropout` keeps its element
//! `(b * l + row) * s + key` ([`coil_ir::philox::dropout_keeps`] through
//! [`DropoutDraw::keeps`]): the decomposition's keep decisions, independent of the CPU template.

use super::*;
use crate::cpu::attention::batch_offset;
use crate::cpu::attention_dropout::DropoutDraw;

/// One call's operands as the decomposition reads them.
pub(super) struct Definition<'a> {
    /// The forward's spec: views, causal, scale, the mask's view and the dropout.
    pub spec: &'a AttentionSpec,
    /// The operands' dtype.
    pub dtype: DType,
    /// q, k, v buffers, decoded.
    pub qkv: [Vec<f64>; 3],
    /// The mask's bytes and kind, if any (its view is the spec's).
    pub mask: Option<(&'a [u8], MaskKind)>,
}

impl Definition<'_> {
    /// Element `(row, col)` of batch index `b` of `view` in `data`.
    fn at(&self, data: &[f64], view: &StridedOperand<usize>, b: usize, row: usize, col: usize) -> f64 {
        data[batch_offset(&self.spec.batch, view, b) + row * view.row_stride + col * view.col_stride]
    }

    /// What the scores of `(b, i, j)` get: `None` where causal attention or the mask drops the
    /// key, else the mask's added term (0 for a bool mask or none).
    fn term(&self, b: usize, i: usize, j: usize) -> Option<f64> {
        if self.spec.causal && j > i {
            return None;
        }
        let (Some((bytes, kind)), Some(view)) = (self.mask, &self.spec.mask) else { return Some(0.0) };
        let at = batch_offset(&self.spec.batch, view, b) + i * view.row_stride + j * view.col_stride;
        match kind {
            MaskKind::Bool => (bytes[at] != 0).then_some(0.0),
            MaskKind::Added => {
                let size = self.dtype.size_bytes();
                Some(decode(self.dtype, &bytes[at * size..(at + 1) * size])[0]).filter(|x| x.is_finite())
            }
        }
    }

    /// Dropout's factor on weight `(b, i, j)`: 0 dropped, `1 / (1 - p)` kept, 1 without dropout.
    fn keep(&self, draw: Option<&DropoutDraw>, b: usize, i: usize, j: usize) -> f64 {
        let (l, s) = (self.spec.l, self.spec.s);
        match draw {
            None => 1.0,
            Some(d) if d.keeps(((b * l + i) * s + j) as u64) => d.scale,
            Some(_) => 0.0,
        }
    }

    /// Row `i`'s softmax weights of batch index `b` over the `s` keys (before dropout; all 0
    /// for a row that keeps no key).
    fn weights(&self, b: usize, i: usize) -> Vec<f64> {
        let (s, d, spec) = (self.spec.s, self.spec.d, self.spec);
        let [q, k, _] = &self.qkv;
        let scores: Vec<Option<f64>> = (0..s)
            .map(|j| {
                let t = self.term(b, i, j)?;
                let dot: f64 = (0..d).map(|c| self.at(q, &spec.q, b, i, c) * self.at(k, &spec.k, b, j, c)).sum();
                Some(dot * spec.scale + t)
            })
            .collect();
        let max = scores.iter().flatten().cloned().fold(f64::NEG_INFINITY, f64::max);
        let exp: Vec<f64> = scores.iter().map(|x| x.map_or(0.0, |x| (x - max).exp())).collect();
        let total: f64 = exp.iter().sum();
        exp.iter().map(|&e| if total > 0.0 { e / total } else { 0.0 }).collect()
    }

    /// The output, laid out as the spec's output view in a buffer of `len` elements.
    pub fn forward(&self, len: usize) -> Vec<f64> {
        let (l, s, d, spec) = (self.spec.l, self.spec.s, self.spec.d, self.spec);
        let v = &self.qkv[2];
        let mut out = vec![0.0; len];
        for b in 0..spec.batch_count() {
            let base = batch_offset(&spec.batch, &spec.out, b);
            for i in 0..l {
                let p = self.weights(b, i);
                for c in 0..d {
                    // Keys of weight 0 are not read (a poisoned key the mask drops is NaN).
                    let y: f64 = (0..s)
                        .filter(|&j| p[j] != 0.0)
                        .map(|j| p[j] * self.keep(spec.dropout.as_ref(), b, i, j) * self.at(v, &spec.v, b, j, c))
                        .sum();
                    out[base + i * spec.out.row_stride + c * spec.out.col_stride] = y;
                }
            }
        }
        out
    }

    /// dq, dk, dv (contiguous `[*batch, rows, d]`) given the output gradient `g` (a buffer read
    /// through the spec's output view): `dv = (P Z)ᵀ g`, `dS = P ((g vᵀ) Z - delta)` with
    /// `delta_i = g_i . y_i` (`y` the definition's output), `dq = scale dS k`,
    /// `dk = scale dSᵀ q`, where `Z` holds dropout's factors.
    pub fn backward(&self, g: &[f64]) -> [Vec<f64>; 3] {
        let (l, s, d, spec) = (self.spec.l, self.spec.s, self.spec.d, self.spec);
        let [q, k, v] = &self.qkv;
        let n = spec.batch_count();
        let (mut dq, mut dk, mut dv) = (vec![0.0; n * l * d], vec![0.0; n * s * d], vec![0.0; n * s * d]);
        for b in 0..n {
            for i in 0..l {
                let p = self.weights(b, i);
                let z: Vec<f64> = (0..s).map(|j| self.keep(spec.dropout.as_ref(), b, i, j)).collect();
                let gi: Vec<f64> = (0..d).map(|c| self.at(g, &spec.out, b, i, c)).collect();
                let live: Vec<usize> = (0..s).filter(|&j| p[j] != 0.0).collect();
                let yi: Vec<f64> =
                    (0..d).map(|c| live.iter().map(|&j| p[j] * z[j] * self.at(v, &spec.v, b, j, c)).sum()).collect();
                let delta: f64 = gi.iter().zip(&yi).map(|(a, b)| a * b).sum();
                for j in live {
                    let dp: f64 = (0..d).map(|c| gi[c] * self.at(v, &spec.v, b, j, c)).sum::<f64>() * z[j];
                    let ds = p[j] * (dp - delta);
                    for c in 0..d {
                        dq[(b * l + i) * d + c] += spec.scale * ds * self.at(k, &spec.k, b, j, c);
                        dk[(b * s + j) * d + c] += spec.scale * ds * self.at(q, &spec.q, b, i, c);
                        dv[(b * s + j) * d + c] += p[j] * z[j] * gi[c];
                    }
                }
            }
        }
        [dq, dk, dv]
    }
}
