//! The attention backward template ([`ExternCall::AttentionBackward`]) on the CPU: the
//! probabilities recomputed from the logsumexp the forward saved, in blocks of keys and rows
//! as FlashAttention-2's backward (`attention_backward_block.rs`), parallel over
//! (batch index, range of keys).
//!
//! Per query row `i`, `delta_i = g_i . o_i` (the output gradient times the output), first; then
//! per query row `i` and key `j` it sees (`j <= i` when causal): `p = exp(q_i . k_j * scale -
//! lse_i)`, `ds = p * (g_i . v_j - delta_i)`, and `dq_i = scale * sum_j ds k_j`,
//! `dv_j = sum_i p g_i`, `dk_j = scale * sum_i ds q_i`. All in f32 (f64 for f64) from the
//! operands' own values, rounded once to the dtype; operands are read, and gradients written,
//! through their strides. A task takes a range of keys of a batch index and gives their dK and
//! dV, and its share of dQ of the rows that see them; the shares of one batch index are summed
//! in the order of their keys. With an explicit mask (bool, or added to the scaled scores;
//! broadcast dims stride 0), as the forward reads it: a key it drops has `p = ds = 0`, a key no
//! row keeps is not read, and a row that keeps no key (logsumexp `-inf`) has zero gradients,
//! as PyTorch's. With dropout, `p` is the dropped probability in `dv`, and `ds` takes the
//! dropped `g_i . v_j`.

use super::attention::{batch_offset, cast, cast_mut, check_views, dot, mask_of, split_by_work, MaskBytes};
use super::attention_backward_block::{self as block, Grads, MaskRows, Operands, Rows, Shape, Task};
use super::attention_block::{Compute, Element, Isa, KEYS_PER_BLOCK};
use super::attention_dropout::DropoutDraw;
use super::jobs;
use coil_codegen::templates::attention::MaskKind;
use coil_ir::loops::{const_usize, AttentionBackwardCall, ExternCall, StridedOperand};
use coil_ir::{DType, Error, Result};
use half::{bf16, f16};
use std::sync::Mutex;

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
    attention_backward_on(Isa::detect(), spec, dtype, bufs)
}

/// [`attention_backward_bytes`] with the `isa` copy of the kernel.
pub(crate) fn attention_backward_on(
    isa: Isa,
    spec: &AttentionBackwardSpec,
    dtype: DType,
    bufs: BackwardBuffers,
) -> Result<()> {
    let size = dtype.size_bytes();
    let stats_size = if dtype == DType::F64 { 8 } else { 4 };
    spec.check(
        [bufs.q.len(), bufs.k.len(), bufs.v.len(), bufs.grad_out.len(), bufs.out.len()].map(|n| n / size),
        bufs.grads.lens(size),
        bufs.lse.len() / stats_size,
    )?;
    spec.check_mask(bufs.mask.map(|m| m.bytes.len() / if m.kind == MaskKind::Bool { 1 } else { size }))?;
    match dtype {
        DType::F32 => run::<f32, f32>(isa, spec, bufs),
        DType::F64 => run::<f64, f64>(isa, spec, bufs),
        DType::F16 => run::<f16, f32>(isa, spec, bufs),
        DType::BF16 => run::<bf16, f32>(isa, spec, bufs),
        _ => Err(Error::unsupported(format!("the attention backward of {dtype} values"))),
    }
}

/// `delta_i = g_i . o_i` of rows `rows` of a batch index (`[l]`, 0 for the other rows and
/// for rows that keep no key, which are not read).
fn deltas<T: Element<A>, A: Compute>(
    (g, o): (Rows<T>, Rows<T>),
    lse: &[A],
    rows: std::ops::Range<usize>,
    d: usize,
) -> Vec<A> {
    let (mut gi, mut oi) = (vec![A::ZERO; d], vec![A::ZERO; d]);
    let mut delta = vec![A::ZERO; lse.len()];
    for i in rows.filter(|&i| lse[i] != A::NEG_INFINITY) {
        g.convert(i, &mut gi);
        o.convert(i, &mut oi);
        delta[i] = dot(&gi, &oi);
    }
    delta
}

/// Writes `[rows, d]` values (from row `first` on) into batch index `b` of a view, rounded.
fn write_rows<T: Element<A>, A: Compute>(
    spec: &AttentionBackwardSpec,
    op: &StridedOperand<usize>,
    out: &mut [T],
    (b, first): (usize, usize),
    values: &[A],
) {
    let (base, d) = (batch_offset(&spec.batch, op, b), spec.d);
    for (r, row) in values.chunks_exact(d).enumerate() {
        let at = base + (first + r) * op.row_stride;
        if op.col_stride == 1 {
            out[at..at + d].iter_mut().zip(row).for_each(|(o, &x)| *o = T::down(x));
        } else {
            for (c, &x) in row.iter().enumerate() {
                out[at + c * op.col_stride] = T::down(x);
            }
        }
    }
}

/// The tasks: per batch index, its keys in ranges of whole key blocks of about equal work
/// (causal: a key is seen by the rows from it on).
fn plan(spec: &AttentionBackwardSpec) -> Vec<(usize, std::ops::Range<usize>)> {
    let (l, s, d) = (spec.l, spec.s, spec.d);
    let blocks: Vec<std::ops::Range<usize>> =
        (0..s).step_by(KEYS_PER_BLOCK).map(|k| k..(k + KEYS_PER_BLOCK).min(s)).collect();
    let seen_by = |k: usize| if spec.causal { l.saturating_sub(k) } else { l };
    let work: Vec<usize> = blocks.iter().map(|k| k.len() * seen_by(k.start).max(1) * d * 5).collect();
    split_by_work(&blocks, &work, spec.batch_count())
}

/// What one task gives: the first row of its share of dQ, the share (`[rows, d]`), and its
/// keys' dK and dV (`[keys, d]`; each empty when not wanted).
type TaskGrads<A> = (usize, Vec<A>, Vec<A>, Vec<A>);

/// The call in `A` on operands of `T`.
fn run<T: Element<A>, A: Compute>(isa: Isa, spec: &AttentionBackwardSpec, bufs: BackwardBuffers) -> Result<()> {
    let (l, s, d) = (spec.l, spec.s, spec.d);
    if spec.batch_count() * d == 0 || l == 0 || s == 0 {
        return Ok(());
    }
    let rows = spec.batch_count() * l;
    let g: &[T] = cast(bufs.grad_out)?;
    let out: &[T] = cast(bufs.out)?;
    let lse: &[A] = &cast::<A>(bufs.lse)?[..rows];
    let (q, k, v) = (cast::<T>(bufs.q)?, cast::<T>(bufs.k)?, cast::<T>(bufs.v)?);
    let mask = mask_of::<T>(bufs.mask)?;
    let wanted = [spec.dq.is_some(), spec.dk.is_some(), spec.dv.is_some()];
    let shape = Shape { l, s, d, causal: spec.causal, scale: spec.scale, wanted };
    let view = |data, op: &StridedOperand<usize>, b| Rows::of(data, op, &spec.batch, b);
    let one = |&(b, ref keys): &(usize, std::ops::Range<usize>)| -> TaskGrads<A> {
        let ops = Operands {
            q: view(q, &spec.q, b),
            k: view(k, &spec.k, b),
            v: view(v, &spec.v, b),
            g: view(g, &spec.grad_out, b),
            lse: &lse[b * l..(b + 1) * l],
            delta: &[],
            mask: spec.mask.as_ref().zip(mask).map(|(op, mask)| MaskRows {
                mask,
                base: batch_offset(&spec.batch, op, b),
                row_stride: op.row_stride,
                col_stride: op.col_stride,
            }),
            dropout: spec.dropout.map(|draw| (draw, (b * l * s) as u64)),
        };
        let task = live_keys(&shape, &ops, keys.clone());
        let rows = task.rows(&shape);
        let delta = deltas((ops.g, view(out, &spec.out, b)), ops.lse, rows.clone(), d);
        let ops = Operands { delta: &delta, ..ops };
        let grad = |wanted: bool, n: usize| vec![A::ZERO; if wanted { n * d } else { 0 }];
        let (mut dq, mut dk, mut dv) =
            (grad(wanted[0], rows.len()), grad(wanted[1], keys.len()), grad(wanted[2], keys.len()));
        if !task.keys.is_empty() {
            // The live keys' part of the task's dK and dV (the others stay 0).
            let span = |wanted: bool| match wanted {
                true => (task.keys.start - keys.start) * d..(task.keys.end - keys.start) * d,
                false => 0..0,
            };
            let grads = Grads { dq: &mut dq, dk: &mut dk[span(wanted[1])], dv: &mut dv[span(wanted[2])] };
            block::backward(isa, &shape, &task, &ops, grads);
        }
        (rows.start, dq, dk, dv)
    };
    // On the backend's pool as its other kernels (`jobs`: the caller takes tasks too).
    let tasks = plan(spec);
    let slots: Vec<Mutex<Option<TaskGrads<A>>>> = tasks.iter().map(|_| Mutex::new(None)).collect();
    jobs::run(tasks.len(), jobs::helpers(), &|t| {
        let grads = one(&tasks[t]);
        *slots[t].lock().unwrap_or_else(|e| e.into_inner()) = Some(grads);
    });
    let results: Vec<TaskGrads<A>> =
        slots.into_iter().map(|x| x.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every task ran")).collect();
    // Each buffer once: gradients sharing one are written one after the other.
    let [wq, wk, wv] = bufs.grads.which;
    let mut outs: Vec<&mut [T]> = bufs.grads.buffers.into_iter().map(cast_mut).collect::<Result<_>>()?;
    for (&(b, ref keys), (_, _, dk, dv)) in tasks.iter().zip(&results) {
        for (view, which, grad) in [(&spec.dk, wk, dk), (&spec.dv, wv, dv)] {
            if let (Some(view), Some(i)) = (view, which) {
                write_rows(spec, view, outs[i], (b, keys.start), grad);
            }
        }
    }
    if let (Some(view), Some(i)) = (&spec.dq, wq) {
        // Per batch index, its tasks' shares summed in the order of their keys.
        let mut sum = vec![A::ZERO; l * d];
        for b in 0..spec.batch_count() {
            sum.fill(A::ZERO);
            for (_, (first, dq, _, _)) in tasks.iter().zip(&results).filter(|((tb, _), _)| *tb == b) {
                for (x, &y) in sum[first * d..].iter_mut().zip(dq) {
                    *x += y;
                }
            }
            write_rows(spec, view, outs[i], (b, 0), &sum);
        }
    }
    Ok(())
}

/// The task of keys `keys`: without a mask, all of them; with one, narrowed to those some row
/// that sees them keeps, which are the only ones it reads.
fn live_keys<T: Element<A>, A: Compute>(shape: &Shape, ops: &Operands<T, A>, keys: std::ops::Range<usize>) -> Task {
    if ops.mask.is_none() {
        return Task { keys, read: vec![] };
    }
    let first_row = |j: usize| if shape.causal { j } else { 0 };
    let read: Vec<bool> = keys
        .clone()
        .map(|j| (first_row(j)..shape.l).any(|i| ops.lse[i] != A::NEG_INFINITY && ops.term(i, j).is_some()))
        .collect();
    let lo = read.iter().position(|&x| x).unwrap_or(read.len());
    let hi = read.iter().rposition(|&x| x).map_or(lo, |x| x + 1);
    let live = keys.start + lo..keys.start + hi;
    Task { keys: live, read: read[lo..hi].to_vec() }
}

#[cfg(test)]
#[path = "attention_backward_tests.rs"]
mod tests;
