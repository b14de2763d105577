//! The attention template ([`ExternCall::Attention`]) on the CPU: a straightforward,
//! exact-order implementation, parallel over (batch index, block of query rows).
//!
//! Per query row `i`: the scores `q_i . k_j * scale` for the keys it sees (`j <= i` when causal,
//! top-left aligned as PyTorch's `is_causal`), a numerically stable softmax (the row maximum
//! subtracted before `exp`), then `sum_j p_j v_j / sum_j p_j`, all in f32 (f64 for f64) from
//! the operands' own values, rounded once to the output dtype; with a logsumexp buffer, also
//! `max + ln(sum_j p_j)` there (f32, f64 for f64). The operands are read through their strides
//! (head views are not copied); the output is written through its strides. The backward is in
//! `attention_backward`.

use coil_ir::loops::{const_usize, ExternCall, StridedOperand};
use coil_ir::{DType, Error, Result};
use half::{bf16, f16};
use rayon::prelude::*;

/// Query rows one parallel task computes (it converts the batch's keys and values once).
const ROWS_PER_TASK: usize = 32;

/// The shape of an attention call: the fields of [`ExternCall::Attention`] at one run's sizes.
#[derive(Clone, Debug)]
pub struct AttentionSpec {
    /// `[*batch, l, d]` queries.
    pub q: StridedOperand<usize>,
    /// `[*batch, s, d]` keys.
    pub k: StridedOperand<usize>,
    /// `[*batch, s, d]` values.
    pub v: StridedOperand<usize>,
    /// Where element `(batch, row, col)` of the `[*batch, l, d]` result goes in the output.
    pub out: StridedOperand<usize>,
    /// Batch dims (row-major batch index order).
    pub batch: Vec<usize>,
    /// Query rows.
    pub l: usize,
    /// Keys (and values).
    pub s: usize,
    /// Head dim of q, k and v.
    pub d: usize,
    /// Row `i` sees keys `j <= i` only (top-left aligned).
    pub causal: bool,
    /// The factor on `q . k`.
    pub scale: f64,
}

impl AttentionSpec {
    /// The spec of an `Attention` call of an instantiated program (constant sizes); `None` for
    /// other extern calls or symbolic sizes.
    pub fn from_call(call: &ExternCall) -> Option<AttentionSpec> {
        match call {
            ExternCall::Attention { q, k, v, out, batch, l, s, d, causal, scale, .. } => Some(AttentionSpec {
                q: q.to_usize()?,
                k: k.to_usize()?,
                v: v.to_usize()?,
                out: out.to_usize()?,
                batch: batch.iter().map(const_usize).collect::<Option<_>>()?,
                l: const_usize(l)?,
                s: const_usize(s)?,
                d: const_usize(d)?,
                causal: *causal,
                scale: *scale,
            }),
            _ => None,
        }
    }

    /// Number of batch indices.
    pub fn batch_count(&self) -> usize {
        self.batch.iter().product()
    }

    /// Element offset of batch index `b` (row-major over `batch`) in an operand.
    pub fn batch_offset(&self, op: &StridedOperand<usize>, b: usize) -> usize {
        batch_offset(&self.batch, op, b)
    }

    /// Checks that every element the call reads or writes lies inside its buffer (lengths in
    /// elements), so the strided accesses cannot leave the buffers whatever the IR says.
    pub fn check(&self, q_len: usize, k_len: usize, v_len: usize, out_len: usize) -> Result<()> {
        let views = [
            (&self.q, self.l, q_len, "query"),
            (&self.k, self.s, k_len, "key"),
            (&self.v, self.s, v_len, "value"),
            (&self.out, self.l, out_len, "output"),
        ];
        check_views("scaled_dot_product_attention", &self.batch, self.l, self.s, self.d, &views)
    }
}

/// Element offset of batch index `b` (row-major over `batch`) in a view.
pub(crate) fn batch_offset(batch: &[usize], op: &StridedOperand<usize>, mut b: usize) -> usize {
    let mut off = op.offset;
    for (n, stride) in batch.iter().zip(&op.batch_strides).rev() {
        off += (b % n) * stride;
        b /= n;
    }
    off
}

/// Checks views of `[*batch, rows, d]` (each with its rows, its buffer's length in elements and
/// what it is) against their buffers: every element inside. `op` names the call in errors.
pub(crate) fn check_views(
    op: &str,
    batch: &[usize],
    l: usize,
    s: usize,
    d: usize,
    views: &[(&StridedOperand<usize>, usize, usize, &str)],
) -> Result<()> {
    let bad = |msg: String| Err(Error::runtime(format!("{op}: {msg}")));
    for (view, _, _, what) in views {
        if view.batch_strides.len() != batch.len() {
            return bad(format!("{} batch dims but {what} strides {:?}", batch.len(), view.batch_strides));
        }
    }
    if batch.iter().product::<usize>() * l * d == 0 {
        return Ok(());
    }
    if s == 0 {
        return bad(format!("no keys for {l} query rows"));
    }
    let last = |view: &StridedOperand<usize>, rows: usize| {
        view.offset
            + batch.iter().zip(&view.batch_strides).map(|(n, s)| (n - 1) * s).sum::<usize>()
            + (rows - 1) * view.row_stride
            + (d - 1) * view.col_stride
    };
    for (view, rows, len, what) in views {
        let at = last(view, *rows);
        if at >= *len {
            return bad(format!("the {what} view reaches element {at} of {len}"));
        }
    }
    Ok(())
}

/// The float type the calls compute in (f32 for f16 / bf16 / f32, f64 for f64).
pub(crate) trait Real: Copy + Send + Sync + PartialOrd + std::ops::AddAssign + bytemuck::Pod + 'static {
    const ZERO: Self;
    const NEG_INFINITY: Self;
    fn mul_add(self, a: Self, b: Self) -> Self;
    fn sub_exp(self, max: Self) -> Self;
    fn mul(self, b: Self) -> Self;
    fn sub(self, b: Self) -> Self;
    fn from_f64(x: f64) -> Self;
    fn recip(self) -> Self;
    fn ln(self) -> Self;
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            fn mul_add(self, a: Self, b: Self) -> Self {
                self + a * b
            }
            fn sub_exp(self, max: Self) -> Self {
                (self - max).exp()
            }
            fn mul(self, b: Self) -> Self {
                self * b
            }
            fn sub(self, b: Self) -> Self {
                self - b
            }
            fn ln(self) -> Self {
                self.ln()
            }
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn recip(self) -> Self {
                1.0 / self
            }
        }
    };
}
real!(f32);
real!(f64);

/// `out = softmax(scale * q k^T (causal)) v` per batch index, on the raw bytes of the buffers
/// (all of `dtype`; `q`, `k`, `v` may be the same buffer), and with `lse` the row logsumexp of
/// the scaled scores, `[*batch, l]` row-major, f32 (f64 for f64). `out` and `lse` must not
/// overlap the operands.
pub fn attention_bytes(
    spec: &AttentionSpec,
    dtype: DType,
    q: &[u8],
    k: &[u8],
    v: &[u8],
    out: &mut [u8],
    lse: Option<&mut [u8]>,
) -> Result<()> {
    let size = dtype.size_bytes();
    spec.check(q.len() / size, k.len() / size, v.len() / size, out.len() / size)?;
    let rows = spec.batch_count() * spec.l;
    match dtype {
        DType::F32 => {
            run::<f32, f32>(spec, cast(q)?, cast(k)?, cast(v)?, cast_mut(out)?, stats(lse, rows)?, |x| x, |x| x)
        }
        DType::F64 => {
            run::<f64, f64>(spec, cast(q)?, cast(k)?, cast(v)?, cast_mut(out)?, stats(lse, rows)?, |x| x, |x| x)
        }
        DType::F16 => {
            let (up, down) = (f16::to_f32, f16::from_f32);
            run::<f16, f32>(spec, cast(q)?, cast(k)?, cast(v)?, cast_mut(out)?, stats(lse, rows)?, up, down)
        }
        DType::BF16 => {
            let (up, down) = (bf16::to_f32, bf16::from_f32);
            run::<bf16, f32>(spec, cast(q)?, cast(k)?, cast(v)?, cast_mut(out)?, stats(lse, rows)?, up, down)
        }
        _ => return Err(Error::unsupported(format!("scaled_dot_product_attention of {dtype} values"))),
    }
    Ok(())
}

/// A statistics buffer (`[*batch, l]` of `A`) of at least `rows` elements, if any.
pub(crate) fn stats<A: Real>(bytes: Option<&mut [u8]>, rows: usize) -> Result<Option<&mut [A]>> {
    let Some(bytes) = bytes else { return Ok(None) };
    let x: &mut [A] = cast_mut(bytes)?;
    if x.len() < rows {
        return Err(Error::runtime(format!("attention: a statistics buffer of {} elements for {rows} rows", x.len())));
    }
    Ok(Some(x))
}

pub(crate) fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> Result<&[T]> {
    bytemuck::try_cast_slice(bytes).map_err(|e| Error::runtime(format!("attention operand memory: {e}")))
}

pub(crate) fn cast_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> Result<&mut [T]> {
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| Error::runtime(format!("attention output memory: {e}")))
}

/// The rows `rows` of batch index `b` of a `[*batch, rows, d]` view, as `[rows.len(), d]`
/// values in `A`.
pub(crate) fn rows_of<T: Copy, A: Real>(
    (batch, d): (&[usize], usize),
    op: &StridedOperand<usize>,
    data: &[T],
    b: usize,
    rows: std::ops::Range<usize>,
    up: fn(T) -> A,
) -> Vec<A> {
    let base = batch_offset(batch, op, b);
    let mut out = Vec::with_capacity(rows.len() * d);
    for i in rows {
        let row = base + i * op.row_stride;
        out.extend((0..d).map(|c| up(data[row + c * op.col_stride])));
    }
    out
}

/// Writes `[rows, d]` values (from row `first` on) into batch index `b` of a view, rounded.
pub(crate) fn write_rows<T: Copy, A: Real>(
    (batch, d): (&[usize], usize),
    op: &StridedOperand<usize>,
    out: &mut [T],
    b: usize,
    first: usize,
    values: &[A],
    down: fn(A) -> T,
) {
    let base = batch_offset(batch, op, b);
    for (r, row) in values.chunks_exact(d).enumerate() {
        let at = base + (first + r) * op.row_stride;
        for (c, &x) in row.iter().enumerate() {
            out[at + c * op.col_stride] = down(x);
        }
    }
}

/// `a . b` with eight partial sums (vectorizable; the order is fixed, so results repeat).
pub(crate) fn dot<A: Real>(a: &[A], b: &[A]) -> A {
    let mut acc = [A::ZERO; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] = acc[i].mul_add(x[i], y[i]);
        }
    }
    let mut total = A::ZERO;
    for (x, y) in ra.iter().zip(rb) {
        total = total.mul_add(*x, *y);
    }
    for x in acc {
        total += x;
    }
    total
}

/// The call in `A` on operands of `T`.
#[allow(clippy::too_many_arguments)] // the operands, the statistics and the two conversions
fn run<T: Copy + Send + Sync, A: Real>(
    spec: &AttentionSpec,
    q: &[T],
    k: &[T],
    v: &[T],
    out: &mut [T],
    mut lse: Option<&mut [A]>,
    up: fn(T) -> A,
    down: fn(A) -> T,
) {
    let (l, s, d) = (spec.l, spec.s, spec.d);
    if spec.batch_count() * l * d == 0 {
        return;
    }
    let scale = A::from_f64(spec.scale);
    let tasks: Vec<(usize, usize)> =
        (0..spec.batch_count()).flat_map(|b| (0..l).step_by(ROWS_PER_TASK).map(move |r| (b, r))).collect();
    // Each task returns its block of results and their logsumexps; they are written through
    // the output's strides after (blocks of different tasks may interleave in memory, e.g.
    // heads merged back).
    let blocks: Vec<(Vec<A>, Vec<A>)> = tasks
        .par_iter()
        .map(|&(b, first)| {
            let rows = first..(first + ROWS_PER_TASK).min(l);
            // Keys a row of this block can see: all, or up to its last row (causal).
            let seen = if spec.causal { s.min(rows.end) } else { s };
            let shape = (&spec.batch[..], d);
            let keys = rows_of(shape, &spec.k, k, b, 0..seen, up);
            let values = rows_of(shape, &spec.v, v, b, 0..seen, up);
            let queries = rows_of(shape, &spec.q, q, b, rows.clone(), up);
            let mut result = vec![A::ZERO; rows.len() * d];
            let mut lses = vec![A::NEG_INFINITY; rows.len()];
            let mut scores = vec![A::ZERO; seen];
            for (r, i) in rows.enumerate() {
                let n = if spec.causal { seen.min(i + 1) } else { seen };
                let qi = &queries[r * d..(r + 1) * d];
                let mut max = A::NEG_INFINITY;
                for (j, sj) in scores[..n].iter_mut().enumerate() {
                    *sj = dot(qi, &keys[j * d..(j + 1) * d]).mul(scale);
                    if *sj > max {
                        max = *sj;
                    }
                }
                // All scores -inf (or NaN): subtracting the maximum would make NaN of -inf.
                let shift = if max == A::NEG_INFINITY { A::ZERO } else { max };
                let o = &mut result[r * d..(r + 1) * d];
                let mut total = A::ZERO;
                for (j, &sj) in scores[..n].iter().enumerate() {
                    let p = sj.sub_exp(shift);
                    total += p;
                    for (oc, &vc) in o.iter_mut().zip(&values[j * d..(j + 1) * d]) {
                        *oc = oc.mul_add(p, vc);
                    }
                }
                let inv = total.recip();
                o.iter_mut().for_each(|x| *x = x.mul(inv));
                if n > 0 {
                    lses[r] = total.ln();
                    lses[r] += shift;
                }
            }
            (result, lses)
        })
        .collect();
    for (&(b, first), (block, lses)) in tasks.iter().zip(blocks) {
        if let Some(lse) = lse.as_deref_mut() {
            lse[b * l + first..b * l + first + lses.len()].copy_from_slice(&lses);
        }
        write_rows((&spec.batch[..], d), &spec.out, out, b, first, &block, down);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_ir::loops::BufferId;

    fn contiguous(rows: usize, d: usize, offset: usize) -> StridedOperand<usize> {
        StridedOperand { buffer: BufferId(0), offset, batch_strides: vec![rows * d], row_stride: d, col_stride: 1 }
    }

    /// The definition, in f64.
    #[allow(clippy::too_many_arguments)] // the attention problem, spelled out for the test
    fn reference(q: &[f64], k: &[f64], v: &[f64], l: usize, s: usize, d: usize, causal: bool, scale: f64) -> Vec<f64> {
        let mut out = vec![0.0; l * d];
        for i in 0..l {
            let n = if causal { s.min(i + 1) } else { s };
            let sc: Vec<f64> =
                (0..n).map(|j| (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>() * scale).collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let t: f64 = p.iter().sum();
            for c in 0..d {
                out[i * d + c] = (0..n).map(|j| p[j] * v[j * d + c]).sum::<f64>() / t;
            }
        }
        out
    }

    #[test]
    fn matches_the_definition_causal_and_not_with_l_and_s_apart() {
        for (l, s, causal) in [(37, 37, true), (5, 70, false), (70, 5, true), (3, 9, true)] {
            let d = 16;
            let vals = |n: usize, seed: f64| -> Vec<f64> { (0..n).map(|i| ((i as f64) * 0.37 + seed).sin()).collect() };
            let (q, k, v) = (vals(l * d, 0.1), vals(s * d, 1.3), vals(s * d, 2.9));
            let spec = AttentionSpec {
                q: contiguous(l, d, 0),
                k: contiguous(s, d, 0),
                v: contiguous(s, d, 0),
                out: contiguous(l, d, 0),
                batch: vec![1],
                l,
                s,
                d,
                causal,
                scale: 0.3,
            };
            let to_bytes = |x: &[f64]| bytemuck::cast_slice::<f64, u8>(x).to_vec();
            let mut out = vec![0u8; l * d * 8];
            let mut lse = vec![0u8; l * 8];
            attention_bytes(&spec, DType::F64, &to_bytes(&q), &to_bytes(&k), &to_bytes(&v), &mut out, Some(&mut lse))
                .unwrap();
            let lse: &[f64] = bytemuck::cast_slice(&lse);
            for (i, &x) in lse.iter().enumerate() {
                let n = if causal { s.min(i + 1) } else { s };
                let want = (0..n)
                    .map(|j| ((0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>() * 0.3).exp())
                    .sum::<f64>()
                    .ln();
                assert!((x - want).abs() < 1e-12, "{l} {s} {causal}: logsumexp {x} vs {want}");
            }
            let got: &[f64] = bytemuck::cast_slice(&out);
            let want = reference(&q, &k, &v, l, s, d, causal, 0.3);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-12, "{l} {s} {causal}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn views_reaching_outside_their_buffers_are_errors() {
        let d = 8;
        let spec = AttentionSpec {
            q: contiguous(4, d, 0),
            k: contiguous(4, d, 8),
            v: contiguous(4, d, 0),
            out: contiguous(4, d, 0),
            batch: vec![2],
            l: 4,
            s: 4,
            d,
            causal: false,
            scale: 1.0,
        };
        let buf = vec![0u8; 2 * 4 * d * 4];
        let mut out = buf.clone();
        let e = attention_bytes(&spec, DType::F32, &buf, &buf, &buf, &mut out, None).unwrap_err();
        assert!(e.to_string().contains("key view reaches element 71 of 64"), "{e}");
        assert!(attention_bytes(&spec, DType::I32, &buf, &buf, &buf, &mut out, None).is_err());
    }
}
