//! The attention backward template ([`ExternCall::AttentionBackward`]) on the CPU: a
//! straightforward, exact-order implementation, the probabilities recomputed from the
//! logsumexp the forward saved, parallel over (batch index, block of rows).
//!
//! Per query row `i`, `delta_i = g_i . o_i` (the output gradient times the output), first; then
//! per query row `i` and key `j` it sees (`j <= i` when causal): `p = exp(q_i . k_j * scale -
//! lse_i)`, `ds = p * (g_i . v_j - delta_i)`. dQ tasks take blocks of query rows:
//! `dq_i = scale * sum_j ds k_j`; dK / dV tasks take blocks of keys: `dv_j = sum_i p g_i`,
//! `dk_j = scale * sum_i ds q_i`. All in f32 (f64 for f64) from the operands' own values,
//! rounded once to the dtype; operands are read, and gradients written, through their strides.
//! With an explicit mask (bool, or added to the scaled scores; broadcast dims stride 0), as the
//! forward reads it: a key it drops has `p = ds = 0`, so a row that keeps no key (logsumexp
//! `-inf`) has zero gradients, as PyTorch's.

use super::attention::{
    batch_offset, cast, cast_mut, check_views, dot, mask_of, rows_of, write_rows, Mask, MaskBytes, Real,
};
use super::attention_dropout::DropoutDraw;
use coil_codegen::templates::attention::MaskKind;
use coil_ir::loops::{const_usize, AttentionBackwardCall, ExternCall, StridedOperand};
use coil_ir::{DType, Error, Result};
use half::{bf16, f16};
use rayon::prelude::*;

/// Rows (or keys) one parallel task computes.
const ROWS_PER_TASK: usize = 32;

/// The shape of an attention backward call: the fields of [`ExternCall::AttentionBackward`] at
/// one run's sizes (the buffers of the statistics and gradients are passed separately).
#[derive(Clone, Debug)]
pub struct AttentionBackwardSpec {
    /// `[*batch, l, d]` queries.
    pub q: StridedOperand<usize>,
    /// `[*batch, s, d]` keys.
    pub k: StridedOperand<usize>,
    /// `[*batch, s, d]` values.
    pub v: StridedOperand<usize>,
    /// `[*batch, l, d]` gradient of the attention's output.
    pub grad_out: StridedOperand<usize>,
    /// `[*batch, l, d]` the attention's output (delta is `rowsum(grad_out * out)`).
    pub out: StridedOperand<usize>,
    /// Where each wanted gradient goes (`dq` `[*batch, l, d]`, `dk` and `dv` `[*batch, s, d]`).
    pub dq: Option<StridedOperand<usize>>,
    /// Where the keys' gradient goes, when wanted.
    pub dk: Option<StridedOperand<usize>>,
    /// Where the values' gradient goes, when wanted.
    pub dv: Option<StridedOperand<usize>>,
    /// Batch dims (row-major batch index order).
    pub batch: Vec<usize>,
    /// Query rows.
    pub l: usize,
    /// Keys (and values).
    pub s: usize,
    /// Head dim.
    pub d: usize,
    /// Row `i` sees keys `j <= i` only (top-left aligned).
    pub causal: bool,
    /// The factor on `q . k`.
    pub scale: f64,
    /// The forward's explicit mask: element `(batch, row, key)` of the `[*batch, l, s]` mask
    /// (broadcast dims stride 0).
    pub mask: Option<StridedOperand<usize>>,
    /// The forward's dropout, bound to this run's random stream: the caller binds the call's
    /// ([`DropoutDraw::of`]); the keep decisions are the forward's.
    pub dropout: Option<DropoutDraw>,
}

impl AttentionBackwardSpec {
    /// The spec of an `AttentionBackward` call of an instantiated program (constant sizes);
    /// `None` for other extern calls or symbolic sizes.
    pub fn from_call(call: &ExternCall) -> Option<AttentionBackwardSpec> {
        let ExternCall::AttentionBackward(call) = call else { return None };
        let AttentionBackwardCall { q, k, v, grad_out, out, dq, dk, dv, batch, l, s, d, causal, scale, mask, .. } =
            &**call;
        let grad = |g: &Option<StridedOperand>| match g {
            Some(g) => g.to_usize().map(Some),
            None => Some(None),
        };
        Some(AttentionBackwardSpec {
            q: q.to_usize()?,
            k: k.to_usize()?,
            v: v.to_usize()?,
            grad_out: grad_out.to_usize()?,
            out: out.to_usize()?,
            dq: grad(dq)?,
            dk: grad(dk)?,
            dv: grad(dv)?,
            batch: batch.iter().map(const_usize).collect::<Option<_>>()?,
            l: const_usize(l)?,
            s: const_usize(s)?,
            d: const_usize(d)?,
            causal: *causal,
            scale: *scale,
            mask: grad(mask)?,
            dropout: None,
        })
    }

    /// Number of batch indices.
    pub fn batch_count(&self) -> usize {
        self.batch.iter().product()
    }

    /// Checks the mask's view against its buffer's length in elements (`None`: no buffer).
    pub fn check_mask(&self, len: Option<usize>) -> Result<()> {
        let what = "attention backward";
        match (&self.mask, len) {
            (None, None) => Ok(()),
            // The mask is `[*batch, l, s]`: its columns are the keys.
            (Some(mask), Some(len)) => {
                check_views(what, &self.batch, self.l, 1, self.s, &[(mask, self.l, len, "mask")])
            }
            (Some(_), None) => Err(Error::runtime(format!("{what}: a masked call without its mask buffer"))),
            (None, Some(_)) => Err(Error::runtime(format!("{what}: a mask buffer for a call without a mask"))),
        }
    }

    /// Checks every view against its buffer's length in elements (q, k, v, grad_out, out, then
    /// the wanted gradients' in q, k, v order) and the logsumexp's length.
    pub fn check(&self, operands: [usize; 5], grads: [Option<usize>; 3], lse: usize) -> Result<()> {
        let mut views = vec![
            (&self.q, self.l, operands[0], "query"),
            (&self.k, self.s, operands[1], "key"),
            (&self.v, self.s, operands[2], "value"),
            (&self.grad_out, self.l, operands[3], "output gradient"),
            (&self.out, self.l, operands[4], "output"),
        ];
        let wanted = [(&self.dq, self.l, "dq"), (&self.dk, self.s, "dk"), (&self.dv, self.s, "dv")];
        for ((view, rows, what), len) in wanted.into_iter().zip(grads) {
            match (view, len) {
                (Some(view), Some(len)) => views.push((view, rows, len, what)),
                (None, None) => {}
                _ => {
                    return Err(Error::runtime(format!("attention backward: {what} has a view or a buffer, not both")))
                }
            }
        }
        if self.dq.is_none() && self.dk.is_none() && self.dv.is_none() {
            return Err(Error::runtime("attention backward: no gradient is wanted"));
        }
        check_views("attention backward", &self.batch, self.l, self.s, self.d, &views)?;
        let rows = self.batch_count() * self.l;
        if lse < rows {
            return Err(Error::runtime(format!("attention backward: a logsumexp of {lse} elements for {rows} rows")));
        }
        Ok(())
    }
}

/// The buffers of one backward call, as raw bytes: the operands (of the call's dtype; q, k, v,
/// the output gradient and the output may share buffers), the logsumexp (`[*batch, l]`, f32,
/// f64 for f64), and the wanted gradients' ([`GradBuffers`]), which overlap no operand.
pub struct BackwardBuffers<'a> {
    /// The queries.
    pub q: &'a [u8],
    /// The keys.
    pub k: &'a [u8],
    /// The values.
    pub v: &'a [u8],
    /// The gradient of the attention's output.
    pub grad_out: &'a [u8],
    /// The forward's row logsumexp of the scaled scores.
    pub lse: &'a [u8],
    /// The attention's output.
    pub out: &'a [u8],
    /// Where the wanted gradients go.
    pub grads: GradBuffers<'a>,
    /// The forward's explicit mask and what it holds, if any.
    pub mask: Option<MaskBytes<'a>>,
}

/// The buffers the wanted gradients are written into, as raw bytes: each buffer once, and
/// which of them dq, dk and dv go to. Gradients may share a buffer, at disjoint elements (the
/// views of one tensor that concatenates them, as the lowering places the gradients of a
/// split QKV projection into its gradient).
///
/// ```
/// use coil_runtime::cpu::attention_backward::GradBuffers;
/// let (mut a, mut b) = (vec![0u8; 8], vec![0u8; 8]);
/// let grads = GradBuffers::separate(Some(&mut a), None, Some(&mut b));
/// assert_eq!(grads.which, [Some(0), None, Some(1)]);
/// ```
pub struct GradBuffers<'a> {
    /// The distinct buffers.
    pub buffers: Vec<&'a mut [u8]>,
    /// For dq, dk and dv, the index in `buffers` of the buffer it goes to, when wanted.
    pub which: [Option<usize>; 3],
}

impl<'a> GradBuffers<'a> {
    /// A buffer of its own for each wanted gradient (`dq`, `dk`, `dv`).
    pub fn separate(dq: Option<&'a mut [u8]>, dk: Option<&'a mut [u8]>, dv: Option<&'a mut [u8]>) -> GradBuffers<'a> {
        let mut grads = GradBuffers { buffers: Vec::new(), which: [None; 3] };
        for (i, b) in [dq, dk, dv].into_iter().enumerate() {
            if let Some(b) = b {
                grads.which[i] = Some(grads.buffers.len());
                grads.buffers.push(b);
            }
        }
        grads
    }

    /// The length in elements of `size` bytes of the buffer each gradient goes to.
    fn lens(&self, size: usize) -> [Option<usize>; 3] {
        self.which.map(|w| w.map(|i| self.buffers[i].len() / size))
    }
}

/// The gradients of attention ([`AttentionBackwardSpec`]) into the wanted buffers.
pub fn attention_backward_bytes(spec: &AttentionBackwardSpec, dtype: DType, bufs: BackwardBuffers) -> Result<()> {
    let size = dtype.size_bytes();
    let stats_size = if dtype == DType::F64 { 8 } else { 4 };
    spec.check(
        [bufs.q.len(), bufs.k.len(), bufs.v.len(), bufs.grad_out.len(), bufs.out.len()].map(|n| n / size),
        bufs.grads.lens(size),
        bufs.lse.len() / stats_size,
    )?;
    spec.check_mask(bufs.mask.map(|m| m.bytes.len() / if m.kind == MaskKind::Bool { 1 } else { size }))?;
    match dtype {
        DType::F32 => run::<f32, f32>(spec, bufs, |x| x, |x| x),
        DType::F64 => run::<f64, f64>(spec, bufs, |x| x, |x| x),
        DType::F16 => run::<f16, f32>(spec, bufs, f16::to_f32, f16::from_f32),
        DType::BF16 => run::<bf16, f32>(spec, bufs, bf16::to_f32, bf16::from_f32),
        _ => Err(Error::unsupported(format!("the attention backward of {dtype} values"))),
    }
}

/// The operands of one batch index, converted to `A`, and the statistics' rows.
struct Batch<'a, T, A> {
    spec: &'a AttentionBackwardSpec,
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    g: &'a [T],
    lse: &'a [A],
    /// Per query row, `g_i . o_i`.
    delta: &'a [A],
    up: fn(T) -> A,
    mask: Option<Mask<'a, T>>,
    /// Per batch index, the offset of its mask elements (empty without a mask).
    mask_bases: Vec<usize>,
}

/// `delta_i = g_i . o_i` of every query row (row-major over batch indices and rows), in `A`.
fn deltas<T: Copy + Send + Sync, A: Real>(spec: &AttentionBackwardSpec, g: &[T], o: &[T], up: fn(T) -> A) -> Vec<A> {
    let (l, d) = (spec.l, spec.d);
    let shape = (&spec.batch[..], d);
    let per_batch: Vec<Vec<A>> = (0..spec.batch_count())
        .into_par_iter()
        .map(|b| {
            let (gs, os) = (rows_of(shape, &spec.grad_out, g, b, 0..l, up), rows_of(shape, &spec.out, o, b, 0..l, up));
            gs.chunks_exact(d).zip(os.chunks_exact(d)).map(|(gi, oi)| dot(gi, oi)).collect()
        })
        .collect();
    per_batch.concat()
}

impl<T: Copy + Send + Sync + bytemuck::Pod, A: Real> Batch<'_, T, A> {
    /// `(p, ds)` of query row `i` and key `j` of batch index `b`, from the rows' values; `None`
    /// (both 0) for a key the mask drops, whose values are not read. With dropout, `p` is the
    /// dropped probability (what `dv` takes) and `ds` takes the dropped `g_i . v_j`.
    #[allow(clippy::too_many_arguments)] // the position and the rows' values
    fn p_ds(&self, b: usize, i: usize, j: usize, qi: &[A], gi: &[A], kj: &[A], vj: &[A]) -> Option<(A, A)> {
        let row = b * self.spec.l + i;
        let term = self.mask_term(b, i, j)?;
        let mut score = dot(qi, kj).mul(A::from_f64(self.spec.scale));
        score += term;
        let p = score.sub_exp(self.lse[row]);
        let dp = dot(gi, vj);
        Some(match &self.spec.dropout {
            None => (p, p.mul(dp.sub(self.delta[row]))),
            Some(draw) => {
                let (kept, dp) = if draw.keeps((row * self.spec.s + j) as u64) {
                    let scale = A::from_f64(draw.scale);
                    (p.mul(scale), dp.mul(scale))
                } else {
                    (A::ZERO, A::ZERO)
                };
                (kept, p.mul(dp.sub(self.delta[row])))
            }
        })
    }

    /// The mask's term for query row `i` and key `j` of batch index `b`: `None` where it drops
    /// the key (a false bool, an added `-inf`), else what it adds to the scaled score.
    fn mask_term(&self, b: usize, i: usize, j: usize) -> Option<A> {
        let (Some(view), Some(mask)) = (&self.spec.mask, self.mask) else { return Some(A::ZERO) };
        let at = self.mask_bases[b] + i * view.row_stride + j * view.col_stride;
        match mask {
            Mask::Bool(m) => (m[at] != 0).then_some(A::ZERO),
            Mask::Added(m) => Some((self.up)(m[at])).filter(|&x| x != A::NEG_INFINITY),
        }
    }

    /// dQ of rows `rows` of batch index `b`, `[rows, d]`.
    fn dq(&self, b: usize, rows: std::ops::Range<usize>) -> Vec<A> {
        let (s, d, up) = (self.spec.s, self.spec.d, self.up);
        let shape = (&self.spec.batch[..], d);
        let seen = if self.spec.causal { s.min(rows.end) } else { s };
        let (keys, values) = (
            rows_of(shape, &self.spec.k, self.k, b, 0..seen, up),
            rows_of(shape, &self.spec.v, self.v, b, 0..seen, up),
        );
        let (queries, grads) = (
            rows_of(shape, &self.spec.q, self.q, b, rows.clone(), up),
            rows_of(shape, &self.spec.grad_out, self.g, b, rows.clone(), up),
        );
        let mut out = vec![A::ZERO; rows.len() * d];
        for (r, i) in rows.enumerate() {
            let n = if self.spec.causal { seen.min(i + 1) } else { seen };
            let (qi, gi) = (&queries[r * d..(r + 1) * d], &grads[r * d..(r + 1) * d]);
            let o = &mut out[r * d..(r + 1) * d];
            for j in 0..n {
                let kj = &keys[j * d..(j + 1) * d];
                let Some((_, ds)) = self.p_ds(b, i, j, qi, gi, kj, &values[j * d..(j + 1) * d]) else { continue };
                o.iter_mut().zip(kj).for_each(|(x, &kc)| *x = x.mul_add(ds, kc));
            }
        }
        let scale = A::from_f64(self.spec.scale);
        out.iter_mut().for_each(|x| *x = x.mul(scale));
        out
    }

    /// dK and dV of keys `keys` of batch index `b`, `[keys, d]` each.
    fn dkdv(&self, b: usize, keys: std::ops::Range<usize>) -> (Vec<A>, Vec<A>) {
        let (l, d, up) = (self.spec.l, self.spec.d, self.up);
        let shape = (&self.spec.batch[..], d);
        // Query rows that see a key of the block: all, or from its first key on (causal).
        let first = if self.spec.causal { keys.start.min(l) } else { 0 };
        let (queries, grads) = (
            rows_of(shape, &self.spec.q, self.q, b, first..l, up),
            rows_of(shape, &self.spec.grad_out, self.g, b, first..l, up),
        );
        let (kb, vb) = (
            rows_of(shape, &self.spec.k, self.k, b, keys.clone(), up),
            rows_of(shape, &self.spec.v, self.v, b, keys.clone(), up),
        );
        let (mut dk, mut dv) = (vec![A::ZERO; keys.len() * d], vec![A::ZERO; keys.len() * d]);
        for (r, j) in keys.enumerate() {
            let (kj, vj) = (&kb[r * d..(r + 1) * d], &vb[r * d..(r + 1) * d]);
            let start = if self.spec.causal { j.max(first) } else { first };
            for i in start..l {
                let (qi, gi) =
                    (&queries[(i - first) * d..(i - first + 1) * d], &grads[(i - first) * d..(i - first + 1) * d]);
                let Some((p, ds)) = self.p_ds(b, i, j, qi, gi, kj, vj) else { continue };
                dv[r * d..(r + 1) * d].iter_mut().zip(gi).for_each(|(x, &gc)| *x = x.mul_add(p, gc));
                dk[r * d..(r + 1) * d].iter_mut().zip(qi).for_each(|(x, &qc)| *x = x.mul_add(ds, qc));
            }
        }
        let scale = A::from_f64(self.spec.scale);
        dk.iter_mut().for_each(|x| *x = x.mul(scale));
        (dk, dv)
    }
}

/// The call in `A` on operands of `T`.
fn run<T: Copy + Send + Sync + bytemuck::Pod, A: Real>(
    spec: &AttentionBackwardSpec,
    bufs: BackwardBuffers,
    up: fn(T) -> A,
    down: fn(A) -> T,
) -> Result<()> {
    let (l, s, d) = (spec.l, spec.s, spec.d);
    if spec.batch_count() * d == 0 || l == 0 || s == 0 {
        return Ok(());
    }
    let rows = spec.batch_count() * l;
    let g = cast(bufs.grad_out)?;
    let delta = deltas(spec, g, cast(bufs.out)?, up);
    let batch = Batch {
        spec,
        q: cast(bufs.q)?,
        k: cast(bufs.k)?,
        v: cast(bufs.v)?,
        g,
        lse: &cast::<A>(bufs.lse)?[..rows],
        delta: &delta,
        up,
        mask: mask_of(bufs.mask)?,
        mask_bases: match &spec.mask {
            Some(view) => (0..spec.batch_count()).map(|b| batch_offset(&spec.batch, view, b)).collect(),
            None => vec![],
        },
    };
    let shape = (&spec.batch[..], d);
    let blocks = |n: usize| -> Vec<(usize, usize)> {
        (0..spec.batch_count()).flat_map(|b| (0..n).step_by(ROWS_PER_TASK).map(move |r| (b, r))).collect()
    };
    // Each buffer once: gradients sharing one are written one after the other.
    let [wq, wk, wv] = bufs.grads.which;
    let mut outs: Vec<&mut [T]> = bufs.grads.buffers.into_iter().map(cast_mut).collect::<Result<_>>()?;
    if let (Some(view), Some(i)) = (&spec.dq, wq) {
        let tasks = blocks(l);
        let results: Vec<Vec<A>> =
            tasks.par_iter().map(|&(b, first)| batch.dq(b, first..(first + ROWS_PER_TASK).min(l))).collect();
        for (&(b, first), block) in tasks.iter().zip(results) {
            write_rows(shape, view, outs[i], b, first, &block, down);
        }
    }
    if spec.dk.is_some() || spec.dv.is_some() {
        let tasks = blocks(s);
        let results: Vec<(Vec<A>, Vec<A>)> =
            tasks.par_iter().map(|&(b, first)| batch.dkdv(b, first..(first + ROWS_PER_TASK).min(s))).collect();
        for (&(b, first), (kblock, vblock)) in tasks.iter().zip(results) {
            if let (Some(view), Some(i)) = (&spec.dk, wk) {
                write_rows(shape, view, outs[i], b, first, &kblock, down);
            }
            if let (Some(view), Some(i)) = (&spec.dv, wv) {
                write_rows(shape, view, outs[i], b, first, &vblock, down);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::attention::{attention_bytes, AttentionSpec};
    use coil_ir::loops::BufferId;

    fn view(batch_stride: usize, row_stride: usize) -> StridedOperand<usize> {
        StridedOperand { buffer: BufferId(0), offset: 0, batch_strides: vec![batch_stride], row_stride, col_stride: 1 }
    }

    fn vals(n: usize, seed: f64) -> Vec<f64> {
        (0..n).map(|i| ((i as f64) * 0.37 + seed).sin()).collect()
    }

    /// A mask's term for (row, key): `None` drops the key, else what is added to the score.
    type Term<'a> = &'a dyn Fn(usize, usize) -> Option<f64>;

    /// The gradients by their definition in f64 (dq, dk, dv of every batch index), from the
    /// forward's output and logsumexp: `term(i, j)` is the mask's (`None` drops the key).
    #[allow(clippy::type_complexity)]
    fn reference(
        spec: &AttentionBackwardSpec,
        (q, k, v, g, o, lse): (&[f64], &[f64], &[f64], &[f64], &[f64], &[f64]),
        term: Term,
    ) -> [Vec<f64>; 3] {
        let (l, s, d) = (spec.l, spec.s, spec.d);
        let n = spec.batch_count();
        let (mut dq, mut dk, mut dv) = (vec![0.0; n * l * d], vec![0.0; n * s * d], vec![0.0; n * s * d]);
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        for b in 0..n {
            let row = |x: &[f64], r: usize| x[(b * l + r) * d..(b * l + r + 1) * d].to_vec();
            let key = |x: &[f64], j: usize| x[(b * s + j) * d..(b * s + j + 1) * d].to_vec();
            for i in 0..l {
                let (qi, gi) = (row(q, i), row(g, i));
                let delta = dot(&gi, &row(o, i));
                for j in (0..s).filter(|&j| !(spec.causal && j > i)) {
                    let Some(t) = term(i, j) else { continue };
                    let (kj, vj) = (key(k, j), key(v, j));
                    let p = (dot(&qi, &kj) * spec.scale + t - lse[b * l + i]).exp();
                    let ds = p * (dot(&gi, &vj) - delta);
                    for c in 0..d {
                        dq[(b * l + i) * d + c] += spec.scale * ds * kj[c];
                        dk[(b * s + j) * d + c] += spec.scale * ds * qi[c];
                        dv[(b * s + j) * d + c] += p * gi[c];
                    }
                }
            }
        }
        [dq, dk, dv]
    }

    /// A `[l, s]` mask broadcast over 2 batch indices, bool and added, with a row that keeps no
    /// key (whose gradients are 0, no NaN), causal and not: the definition's gradients.
    #[test]
    fn masked_gradients_match_the_definition_and_dead_rows_are_zero() {
        let (l, s, d, n) = (37, 45, 16, 2);
        let keep = |i: usize, j: usize| i != 4 && (i * 3 + j) % 7 != 2;
        let added = |i: usize, j: usize| keep(i, j).then(|| ((i * 5 + j) as f64 * 0.23).cos());
        let bools: Vec<u8> = (0..l * s).map(|x| keep(x / s, x % s) as u8).collect();
        let terms: Vec<f64> = (0..l * s).map(|x| added(x / s, x % s).unwrap_or(f64::NEG_INFINITY)).collect();
        let (q, k, v, g) = (vals(n * l * d, 0.1), vals(n * s * d, 1.3), vals(n * s * d, 2.9), vals(n * l * d, 4.2));
        let bytes = |x: &[f64]| bytemuck::cast_slice::<f64, u8>(x).to_vec();
        let (qb, kb, vb, gb) = (bytes(&q), bytes(&k), bytes(&v), bytes(&g));
        let terms_bytes = bytes(&terms);
        let bool_term = |i: usize, j: usize| keep(i, j).then_some(0.0);
        let cases: [(MaskBytes, Term); 2] = [
            (MaskBytes { bytes: &bools, kind: MaskKind::Bool }, &bool_term),
            (MaskBytes { bytes: &terms_bytes, kind: MaskKind::Added }, &added),
        ];
        for (mask, term) in cases {
            for causal in [false, true] {
                let fwd = AttentionSpec {
                    q: view(l * d, d),
                    k: view(s * d, d),
                    v: view(s * d, d),
                    out: view(l * d, d),
                    batch: vec![n],
                    l,
                    s,
                    d,
                    causal,
                    scale: 0.3,
                    mask: Some(view(0, s)),
                    dropout: None,
                    mask_rule: None,
                    offset: 0,
                };
                let (mut out, mut lse) = (vec![0u8; n * l * d * 8], vec![0u8; n * l * 8]);
                attention_bytes(&fwd, DType::F64, &qb, &kb, &vb, Some(mask), &mut out, Some(&mut lse)).unwrap();
                let spec = AttentionBackwardSpec {
                    q: fwd.q.clone(),
                    k: fwd.k.clone(),
                    v: fwd.v.clone(),
                    grad_out: fwd.out.clone(),
                    out: fwd.out.clone(),
                    dq: Some(view(l * d, d)),
                    dk: Some(view(s * d, d)),
                    dv: Some(view(s * d, d)),
                    batch: vec![n],
                    l,
                    s,
                    d,
                    causal,
                    scale: 0.3,
                    mask: Some(view(0, s)),
                    dropout: None,
                };
                let (mut dq, mut dk, mut dv) =
                    (vec![0u8; n * l * d * 8], vec![0u8; n * s * d * 8], vec![0u8; n * s * d * 8]);
                let grads = GradBuffers::separate(Some(&mut dq), Some(&mut dk), Some(&mut dv));
                let bufs = BackwardBuffers {
                    q: &qb,
                    k: &kb,
                    v: &vb,
                    grad_out: &gb,
                    lse: &lse,
                    out: &out,
                    grads,
                    mask: Some(mask),
                };
                attention_backward_bytes(&spec, DType::F64, bufs).unwrap();
                let (o, lse): (&[f64], &[f64]) = (bytemuck::cast_slice(&out), bytemuck::cast_slice(&lse));
                assert!(lse[4].is_infinite() && lse[l + 4].is_infinite(), "row 4 keeps no key");
                let want = reference(&spec, (&q, &k, &v, &g, o, lse), term);
                for (name, got, want) in [("dq", &dq, &want[0]), ("dk", &dk, &want[1]), ("dv", &dv, &want[2])] {
                    let got: &[f64] = bytemuck::cast_slice(got);
                    for (i, (a, b)) in got.iter().zip(want).enumerate() {
                        assert!((a - b).abs() < 1e-12, "{:?} causal={causal} {name}[{i}]: {a} vs {b}", mask.kind);
                    }
                }
                let dq: &[f64] = bytemuck::cast_slice(&dq);
                assert!(dq[4 * d..5 * d].iter().all(|&x| x == 0.0), "a row that keeps no key: dq 0");
            }
        }
    }

    #[test]
    fn a_mask_view_reaching_outside_its_buffer_is_an_error() {
        let (l, s, d) = (4, 4, 8);
        let spec = AttentionBackwardSpec {
            q: view(l * d, d),
            k: view(s * d, d),
            v: view(s * d, d),
            grad_out: view(l * d, d),
            out: view(l * d, d),
            dq: Some(view(l * d, d)),
            dk: None,
            dv: None,
            batch: vec![2],
            l,
            s,
            d,
            causal: false,
            scale: 0.3,
            mask: Some(view(l * s, s)),
            dropout: None,
        };
        let e = spec.check_mask(Some(31)).unwrap_err();
        assert!(e.to_string().contains("mask view reaches element 31 of 31"), "{e}");
        assert!(spec.check_mask(None).is_err());
        assert!(spec.check_mask(Some(32)).is_ok());
    }
}
