//! The attention template ([`ExternCall::Attention`]) on the CPU: tasks of (batch index, range
//! of query rows) on the rayon pool, each computed by the blocked kernel of
//! `attention_block` (a block of query rows against a block of keys
//! as two small matrix products with an online softmax between).
//!
//! Per query row `i`: the scores `q_i . k_j * scale` for the keys it sees (`j <= i` when causal,
//! top-left aligned as PyTorch's `is_causal`; `j <= offset + (i mod period)` with a structured
//! mask's rule, [`coil_ir::loops::MaskRule`], its offset read from its buffer each run; with a
//! bool mask, where it is true; an added mask is added to the scaled scores), a numerically stable softmax (`exp` of the scores less the
//! running row maximum; partial sums rescaled when the maximum grows), then
//! `sum_j p_j v_j / sum_j p_j`, all in f32 (f64 for f64) from the operands' own values, rounded
//! once to the output dtype; with a logsumexp buffer, also `max + ln(sum_j p_j)` there (f32,
//! f64 for f64). A row that sees no key gives 0 and logsumexp `-inf`, as PyTorch's SDPA
//! (`_safe_softmax`). The operands are read through their strides (head views are not copied;
//! a mask's broadcast dims have stride 0); the output is written through its strides; keys no
//! row of a task sees (a decode step's cache beyond its position) are never read. Tasks are
//! ranges of whole row blocks of about equal work, about two per pool thread (fewer when the
//! call is small: each converts the keys its rows see once). The backward is in
//! `attention_backward`.

pub use super::attention_block::KeyLimit;
use super::attention_block::{self as block, Compute, Element, Isa, Shape, Source, Task, ROWS_PER_BLOCK};
use super::attention_dropout::{DropoutDraw, LANES};
use coil_codegen::templates::attention::MaskKind;
use coil_ir::loops::{const_usize, ExternCall, MaskRule, StridedOperand};
use coil_ir::{DType, Error, Result};
use half::{bf16, f16};
use rayon::prelude::*;

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
    /// An explicit mask: element `(batch, row, key)` of the `[*batch, l, s]` mask (broadcast
    /// dims stride 0).
    pub mask: Option<StridedOperand<usize>>,
    /// A structured mask, by its rule (never with `causal` or `mask`).
    pub mask_rule: Option<MaskRule>,
    /// This run's value of the rule's offset buffer (0 without one): the caller reads it
    /// ([`AttentionSpec::read_offset`]).
    pub offset: i64,
    /// Dropout on the probabilities, bound to this run's random stream: the caller binds the
    /// call's ([`DropoutDraw::of`]).
    pub dropout: Option<DropoutDraw>,
}

/// A mask's elements and what they hold.
#[derive(Clone, Copy, Debug)]
pub struct MaskBytes<'a> {
    /// The mask's elements, of the operands' dtype or one byte each for a bool mask.
    pub bytes: &'a [u8],
    /// Whether the mask keeps keys (bool) or is added to the scores.
    pub kind: MaskKind,
}

impl AttentionSpec {
    /// The spec of an `Attention` call of an instantiated program (constant sizes); `None` for
    /// other extern calls or symbolic sizes.
    pub fn from_call(call: &ExternCall) -> Option<AttentionSpec> {
        match call {
            ExternCall::Attention(call) => Some(AttentionSpec {
                q: call.q.to_usize()?,
                k: call.k.to_usize()?,
                v: call.v.to_usize()?,
                out: call.out.to_usize()?,
                batch: call.batch.iter().map(const_usize).collect::<Option<_>>()?,
                l: const_usize(&call.l)?,
                s: const_usize(&call.s)?,
                d: const_usize(&call.d)?,
                causal: call.causal,
                scale: call.scale,
                mask: match &call.mask {
                    Some(m) => Some(m.to_usize()?),
                    None => None,
                },
                mask_rule: call.mask_rule.clone(),
                offset: 0,
                dropout: None,
            }),
            _ => None,
        }
    }

    /// Reads this run's offset of the mask rule from its buffer's bytes (a 0-d i64); an
    /// error when the rule has an offset and `bytes` do not hold one.
    pub fn read_offset(&mut self, bytes: Option<&[u8]>) -> Result<()> {
        let Some(MaskRule { offset: Some(_), .. }) = &self.mask_rule else { return Ok(()) };
        match bytes.and_then(|b| b.get(..8)) {
            Some(b) => {
                self.offset = i64::from_ne_bytes(b.try_into().expect("8 bytes"));
                Ok(())
            }
            None => Err(Error::runtime("scaled_dot_product_attention: the mask rule's offset is not an i64 buffer")),
        }
    }

    /// The diagonal limit on the keys each row sees: causal, or the mask rule at this run's
    /// offset.
    pub fn limit(&self) -> Option<KeyLimit> {
        if self.causal {
            return Some(KeyLimit::CAUSAL);
        }
        let rule = self.mask_rule.as_ref()?;
        Some(KeyLimit { base: self.offset.wrapping_add(rule.constant), period: rule.period })
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
    /// elements; the mask's, when the call has one), so the strided accesses cannot leave the
    /// buffers whatever the IR says.
    pub fn check(
        &self,
        q_len: usize,
        k_len: usize,
        v_len: usize,
        out_len: usize,
        mask_len: Option<usize>,
    ) -> Result<()> {
        let what = "scaled_dot_product_attention";
        let views = [
            (&self.q, self.l, q_len, "query"),
            (&self.k, self.s, k_len, "key"),
            (&self.v, self.s, v_len, "value"),
            (&self.out, self.l, out_len, "output"),
        ];
        check_views(what, &self.batch, self.l, self.s, self.d, &views)?;
        match (&self.mask, mask_len) {
            (None, None) => Ok(()),
            (Some(mask), Some(len)) => {
                // The mask is `[*batch, l, s]`: its columns are the keys.
                check_views(what, &self.batch, self.l, 1, self.s, &[(mask, self.l, len, "mask")])
            }
            (Some(_), None) => Err(Error::runtime(format!("{what}: a masked call without its mask buffer"))),
            (None, Some(_)) => Err(Error::runtime(format!("{what}: a mask buffer for a call without a mask"))),
        }
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
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn mul_add(self, a: Self, b: Self) -> Self;
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
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            fn mul_add(self, a: Self, b: Self) -> Self {
                self + a * b
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

/// `out = softmax(scale * q k^T (causal) (+ mask)) v` per batch index, on the raw bytes of the
/// buffers (all of `dtype`, the mask bool or `dtype`; `q`, `k`, `v` may be the same buffer),
/// and with `lse` the row logsumexp of the scaled scores, `[*batch, l]` row-major, f32 (f64 for
/// f64). `out` and `lse` must not overlap the operands.
#[allow(clippy::too_many_arguments)] // the call's buffers
pub fn attention_bytes(
    spec: &AttentionSpec,
    dtype: DType,
    q: &[u8],
    k: &[u8],
    v: &[u8],
    mask: Option<MaskBytes>,
    out: &mut [u8],
    lse: Option<&mut [u8]>,
) -> Result<()> {
    let size = dtype.size_bytes();
    let mask_len = mask.map(|m| m.bytes.len() / if m.kind == MaskKind::Bool { 1 } else { size });
    spec.check(q.len() / size, k.len() / size, v.len() / size, out.len() / size, mask_len)?;
    let rows = spec.batch_count() * spec.l;
    match dtype {
        DType::F32 => {
            let ops = Operands { q: cast(q)?, k: cast(k)?, v: cast(v)?, mask: mask_of(mask)? };
            run::<f32, f32>(spec, ops, cast_mut(out)?, stats(lse, rows)?)
        }
        DType::F64 => {
            let ops = Operands { q: cast(q)?, k: cast(k)?, v: cast(v)?, mask: mask_of(mask)? };
            run::<f64, f64>(spec, ops, cast_mut(out)?, stats(lse, rows)?)
        }
        DType::F16 => {
            let ops = Operands { q: cast(q)?, k: cast(k)?, v: cast(v)?, mask: mask_of(mask)? };
            run::<f16, f32>(spec, ops, cast_mut(out)?, stats(lse, rows)?)
        }
        DType::BF16 => {
            let ops = Operands { q: cast(q)?, k: cast(k)?, v: cast(v)?, mask: mask_of(mask)? };
            run::<bf16, f32>(spec, ops, cast_mut(out)?, stats(lse, rows)?)
        }
        _ => return Err(Error::unsupported(format!("scaled_dot_product_attention of {dtype} values"))),
    }
    Ok(())
}

/// A mask's elements as the call reads them.
#[derive(Clone, Copy)]
pub(crate) enum Mask<'a, T> {
    Bool(&'a [u8]),
    Added(&'a [T]),
}

pub(crate) fn mask_of<T: bytemuck::Pod>(mask: Option<MaskBytes<'_>>) -> Result<Option<Mask<'_, T>>> {
    Ok(match mask {
        None => None,
        Some(MaskBytes { bytes, kind: MaskKind::Bool }) => Some(Mask::Bool(bytes)),
        Some(MaskBytes { bytes, kind: MaskKind::Added }) => Some(Mask::Added(cast(bytes)?)),
    })
}

/// The operands of one call, of element type `T`.
struct Operands<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    mask: Option<Mask<'a, T>>,
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

/// The call in `A` on operands of `T`: tasks of (batch index, range of query rows) on the
/// rayon pool, each run by the blocked kernel ([`block::forward`]).
fn run<T: Element<A>, A: Compute>(spec: &AttentionSpec, ops: Operands<T>, out: &mut [T], mut lse: Option<&mut [A]>) {
    let (l, d) = (spec.l, spec.d);
    if spec.batch_count() * l * d == 0 {
        return;
    }
    let tasks = plan(spec);
    let (isa, shape) = (Isa::detect(), Shape { d, limit: spec.limit(), scale: spec.scale });
    let one = |&(b, ref rows): &(usize, std::ops::Range<usize>)| {
        let src = BatchSource::new(spec, &ops, b);
        let task = src.task(rows.clone());
        let (mut result, mut lses) = (vec![A::ZERO; rows.len() * d], vec![A::NEG_INFINITY; rows.len()]);
        block::forward(isa, shape, &task, &src, &mut result, &mut lses);
        (result, lses)
    };
    // Each task returns its block of results and their logsumexps; they are written through
    // the output's strides after (blocks of different tasks may interleave in memory, e.g.
    // heads merged back).
    let blocks: Vec<(Vec<A>, Vec<A>)> =
        if tasks.len() == 1 { vec![one(&tasks[0])] } else { tasks.par_iter().map(one).collect() };
    for ((b, rows), (block, lses)) in tasks.into_iter().zip(blocks) {
        if let Some(lse) = lse.as_deref_mut() {
            lse[b * l + rows.start..b * l + rows.end].copy_from_slice(&lses);
        }
        let base = batch_offset(&spec.batch, &spec.out, b);
        for (r, row) in block.chunks_exact(d).enumerate() {
            let at = base + (rows.start + r) * spec.out.row_stride;
            if spec.out.col_stride == 1 {
                out[at..at + d].iter_mut().zip(row).for_each(|(o, &x)| *o = T::down(x));
            } else {
                for (c, &x) in row.iter().enumerate() {
                    out[at + c * spec.out.col_stride] = T::down(x);
                }
            }
        }
    }
}

/// Fewest multiply-adds a parallel task of attention (forward or backward) should have: smaller
/// ones cost more to hand out, and to convert their operands for, than they save.
const TASK_MACS: usize = 1 << 20;

/// Tasks per pool thread wanted: more balance the load, each converts its operands again (and,
/// backward, adds a share of dQ to sum).
const TASKS_PER_THREAD: usize = 2;

/// Parallel tasks of attention: per batch index of `batches`, ranges of whole `blocks` (of rows
/// forward, of keys backward) of about equal `work` (multiply-adds per block), enough of them
/// in all to keep the pool busy but none too small.
pub(crate) fn split_by_work(
    blocks: &[std::ops::Range<usize>],
    work: &[usize],
    batches: usize,
) -> Vec<(usize, std::ops::Range<usize>)> {
    let total: usize = work.iter().sum();
    let wanted = (rayon::current_num_threads() * TASKS_PER_THREAD).min(total * batches / TASK_MACS).max(1);
    let parts = wanted.div_ceil(batches).clamp(1, blocks.len());
    // Cut where the running work passes each part's share.
    let mut ranges = Vec::with_capacity(parts);
    let (mut start, mut acc, mut next) = (0, 0, 1);
    for (k, w) in work.iter().enumerate() {
        acc += w;
        if acc * parts >= total * next || k + 1 == blocks.len() {
            ranges.push(blocks[start].start..blocks[k].end);
            start = k + 1;
            next += 1;
        }
    }
    (0..batches).flat_map(|b| ranges.iter().map(move |r| (b, r.clone()))).collect()
}

/// The tasks: per batch index, its query rows in ranges of whole row blocks of about equal
/// work (causal rows see more keys the later they are).
fn plan(spec: &AttentionSpec) -> Vec<(usize, std::ops::Range<usize>)> {
    let (l, s, d) = (spec.l, spec.s, spec.d);
    let blocks: Vec<std::ops::Range<usize>> =
        (0..l).step_by(ROWS_PER_BLOCK).map(|r| r..(r + ROWS_PER_BLOCK).min(l)).collect();
    let limit = spec.limit();
    let work: Vec<usize> =
        blocks.iter().map(|r| r.len() * limit.map_or(s, |lim| lim.keys_seen(r.clone(), s)).max(1) * d * 2).collect();
    split_by_work(&blocks, &work, spec.batch_count())
}

/// One batch index's operands, as the blocked kernel reads them.
struct BatchSource<'a, T> {
    spec: &'a AttentionSpec,
    ops: &'a Operands<'a, T>,
    /// Offsets of the batch index in q, k, v and the mask.
    base: [usize; 3],
    mask_base: Option<usize>,
    /// The batch index.
    b: usize,
}

impl<'a, T: Copy> BatchSource<'a, T> {
    fn new(spec: &'a AttentionSpec, ops: &'a Operands<'a, T>, b: usize) -> Self {
        let base = [&spec.q, &spec.k, &spec.v].map(|op| batch_offset(&spec.batch, op, b));
        let mask_base = spec.mask.as_ref().map(|m| batch_offset(&spec.batch, m, b));
        BatchSource { spec, ops, base, mask_base, b }
    }

    /// The task of query rows `rows`: per block of rows, the keys it sees (all, or up to its
    /// last row when causal, narrowed to those the mask keeps for some row), and their union.
    fn task<A: Compute>(&self, rows: std::ops::Range<usize>) -> Task
    where
        T: Element<A>,
    {
        let (s, limit) = (self.spec.s, self.spec.limit());
        let blocks: Vec<std::ops::Range<usize>> = (rows.start..rows.end)
            .step_by(ROWS_PER_BLOCK)
            .map(|r0| {
                let rows = r0..(r0 + ROWS_PER_BLOCK).min(rows.end);
                let seen = limit.map_or(s, |lim| lim.keys_seen(rows.clone(), s));
                if self.spec.mask.is_none() {
                    return 0..seen;
                }
                let below = |i: usize, j: usize| limit.is_none_or(|lim| j as i64 <= lim.last(i));
                let live = |j: usize| rows.clone().any(|i| below(i, j) && Source::<A>::term(self, i, j).is_some());
                let lo = (0..seen).find(|&j| live(j)).unwrap_or(seen);
                lo..(lo..seen).rev().find(|&j| live(j)).map_or(lo, |j| j + 1)
            })
            .collect();
        let lo = blocks.iter().filter(|r| !r.is_empty()).map(|r| r.start).min().unwrap_or(0);
        let hi = blocks.iter().map(|r| r.end).max().unwrap_or(0).max(lo);
        // A block that sees no key sees none of the task's (empty, at its start).
        let blocks = blocks.into_iter().map(|r| if r.is_empty() { lo..lo } else { r }).collect();
        Task { rows, keys: lo..hi, blocks }
    }
}

/// Row `i` of a `[rows, d]` view (from `base`) of `data`, converted into `out`.
#[inline(always)]
fn convert_row<T: Element<A>, A>(data: &[T], view: &StridedOperand<usize>, base: usize, i: usize, out: &mut [A]) {
    let at = base + i * view.row_stride;
    if view.col_stride == 1 {
        let n = out.len();
        out.iter_mut().zip(&data[at..at + n]).for_each(|(o, &x)| *o = x.up());
    } else {
        out.iter_mut().enumerate().for_each(|(c, o)| *o = data[at + c * view.col_stride].up());
    }
}

impl<T: Element<A>, A: Compute> Source<A> for BatchSource<'_, T> {
    #[inline(always)]
    fn key(&self, j: usize, out: &mut [A]) {
        convert_row(self.ops.k, &self.spec.k, self.base[1], j, out)
    }
    #[inline(always)]
    fn value(&self, j: usize, out: &mut [A]) {
        convert_row(self.ops.v, &self.spec.v, self.base[2], j, out)
    }
    #[inline(always)]
    fn query(&self, i: usize, out: &mut [A]) {
        convert_row(self.ops.q, &self.spec.q, self.base[0], i, out)
    }
    fn term(&self, i: usize, j: usize) -> Option<A> {
        let (Some(view), Some(base), Some(mask)) = (&self.spec.mask, self.mask_base, self.ops.mask) else {
            return Some(A::ZERO);
        };
        let at = base + i * view.row_stride + j * view.col_stride;
        match mask {
            Mask::Bool(m) => (m[at] != 0).then_some(A::ZERO),
            Mask::Added(m) => Some(m[at].up()).filter(|&x| x != A::NEG_INFINITY),
        }
    }
    #[inline(always)]
    fn masked(&self) -> bool {
        self.spec.mask.is_some()
    }
    #[inline(always)]
    fn drop_probabilities(&self, i: usize, k0: usize, row: &mut [A]) {
        if let Some(draw) = &self.spec.dropout {
            drop_row(draw, ((self.b * self.spec.l + i) * self.spec.s + k0) as u64, row);
        }
    }
}

/// Dropout of one row's probabilities, `row[jj]` being probability `first + jj` (flat index):
/// dropped ones become 0, kept ones are scaled by `1 / (1 - p)`.
#[inline(always)]
pub(crate) fn drop_row<A: Real>(draw: &DropoutDraw, first: u64, row: &mut [A]) {
    let scale = A::from_f64(draw.scale);
    let mut keep = [false; LANES];
    for (c, chunk) in row.chunks_mut(LANES).enumerate() {
        draw.keeps_lanes(first + (c * LANES) as u64, &mut keep);
        for (x, &k) in chunk.iter_mut().zip(&keep) {
            *x = if k { x.mul(scale) } else { A::ZERO };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_ir::loops::BufferId;

    fn contiguous(rows: usize, d: usize, offset: usize) -> StridedOperand<usize> {
        StridedOperand { buffer: BufferId(0), offset, batch_strides: vec![rows * d], row_stride: d, col_stride: 1 }
    }

    /// The definition, in f64, one batch index: `term(i, j)` is the mask's (`None` drops the
    /// key); a row that sees no key is 0 with logsumexp -inf.
    #[allow(clippy::too_many_arguments)] // the attention problem, spelled out for the test
    fn reference(
        (q, k, v): (&[f64], &[f64], &[f64]),
        (l, s, d): (usize, usize, usize),
        causal: bool,
        scale: f64,
        term: &dyn Fn(usize, usize) -> Option<f64>,
    ) -> (Vec<f64>, Vec<f64>) {
        let (mut out, mut lse) = (vec![0.0; l * d], vec![f64::NEG_INFINITY; l]);
        for i in 0..l {
            let js: Vec<usize> = (0..s).filter(|&j| !(causal && j > i) && term(i, j).is_some()).collect();
            if js.is_empty() {
                continue;
            }
            let dot = |j: usize| (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>();
            let sc: Vec<f64> = js.iter().map(|&j| dot(j) * scale + term(i, j).unwrap()).collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let t: f64 = p.iter().sum();
            lse[i] = m + t.ln();
            for c in 0..d {
                out[i * d + c] = js.iter().zip(&p).map(|(&j, pj)| pj * v[j * d + c]).sum::<f64>() / t;
            }
        }
        (out, lse)
    }

    fn vals(n: usize, seed: f64) -> Vec<f64> {
        (0..n).map(|i| ((i as f64) * 0.37 + seed).sin()).collect()
    }

    fn bytes(x: &[f64]) -> Vec<u8> {
        bytemuck::cast_slice::<f64, u8>(x).to_vec()
    }

    fn spec(l: usize, s: usize, d: usize, causal: bool, mask: Option<StridedOperand<usize>>) -> AttentionSpec {
        AttentionSpec {
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
            mask,
            mask_rule: None,
            offset: 0,
            dropout: None,
        }
    }

    fn close(what: &str, got: &[f64], want: &[f64]) {
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(a == b || (a - b).abs() < 1e-12, "{what}: element {i}: {a} vs {b}");
        }
    }

    #[test]
    fn matches_the_definition_causal_and_not_with_l_and_s_apart() {
        for (l, s, causal) in [(37, 37, true), (5, 70, false), (70, 5, true), (3, 9, true)] {
            let d = 16;
            let (q, k, v) = (vals(l * d, 0.1), vals(s * d, 1.3), vals(s * d, 2.9));
            let (mut out, mut lse) = (vec![0u8; l * d * 8], vec![0u8; l * 8]);
            let spec = spec(l, s, d, causal, None);
            attention_bytes(&spec, DType::F64, &bytes(&q), &bytes(&k), &bytes(&v), None, &mut out, Some(&mut lse))
                .unwrap();
            let (want, want_lse) = reference((&q, &k, &v), (l, s, d), causal, 0.3, &|_, _| Some(0.0));
            let what = format!("{l} {s} {causal}");
            close(&what, bytemuck::cast_slice(&out), &want);
            close(&what, bytemuck::cast_slice(&lse), &want_lse);
        }
    }

    /// A `[l, s]` mask broadcast over 2 batch indices (batch stride 0): a decode-like prefix
    /// with rows that see no key (0, logsumexp -inf), bool and added.
    #[test]
    fn masked_rows_match_the_definition_and_dead_rows_are_zero() {
        let (l, s, d) = (6, 50, 8);
        // Row i keeps keys j <= 7 * i - 1 with j % 5 != 3: row 0 keeps none.
        let keep = |i: usize, j: usize| j < 7 * i && j % 5 != 3;
        let view =
            StridedOperand { buffer: BufferId(0), offset: 0, batch_strides: vec![0], row_stride: s, col_stride: 1 };
        let spec = AttentionSpec { batch: vec![2], ..spec(l, s, d, false, Some(view)) };
        let (q, k, v) = (vals(2 * l * d, 0.1), vals(2 * s * d, 1.3), vals(2 * s * d, 2.9));
        let bool_mask: Vec<u8> = (0..l * s).map(|x| keep(x / s, x % s) as u8).collect();
        let added: Vec<f64> =
            (0..l * s).map(|x| if keep(x / s, x % s) { (x as f64 * 0.1).cos() } else { f64::NEG_INFINITY }).collect();
        let added_bytes = bytes(&added);
        let masks = [
            (MaskBytes { bytes: &bool_mask, kind: MaskKind::Bool }, false),
            (MaskBytes { bytes: &added_bytes, kind: MaskKind::Added }, true),
        ];
        for (mask, is_added) in masks {
            let (mut out, mut lse) = (vec![0u8; 2 * l * d * 8], vec![0u8; 2 * l * 8]);
            attention_bytes(
                &spec,
                DType::F64,
                &bytes(&q),
                &bytes(&k),
                &bytes(&v),
                Some(mask),
                &mut out,
                Some(&mut lse),
            )
            .unwrap();
            let (out, lse): (&[f64], &[f64]) = (bytemuck::cast_slice(&out), bytemuck::cast_slice(&lse));
            for b in 0..2 {
                let term = |i: usize, j: usize| keep(i, j).then(|| if is_added { added[i * s + j] } else { 0.0 });
                let operands = (&q[b * l * d..][..l * d], &k[b * s * d..][..s * d], &v[b * s * d..][..s * d]);
                let (want, want_lse) = reference(operands, (l, s, d), false, 0.3, &term);
                let what = format!("added={is_added} batch {b}");
                close(&what, &out[b * l * d..][..l * d], &want);
                close(&what, &lse[b * l..][..l], &want_lse);
            }
            assert!(out[..d].iter().all(|&x| x == 0.0) && lse[0] == f64::NEG_INFINITY);
        }
    }

    /// A structured mask's rule against the same keys as an explicit mask: grouped-query rows
    /// (period 7) at an offset read from its buffer, rows wrapping periods inside a block,
    /// offsets that reach past the keys, a negative one (rows that see nothing).
    #[test]
    fn mask_rules_match_the_explicit_mask_they_stand_for() {
        let (l, s, d) = (4 * 7 + 50, 90, 16);
        let (q, k, v) = (vals(2 * l * d, 0.1), vals(2 * s * d, 1.3), vals(2 * s * d, 2.9));
        for (offset, constant, period) in
            [(40i64, 0, Some(7)), (85, -1, Some(7)), (3, 0, None), (-10, 2, None), (20, 0, Some(1))]
        {
            let rule = MaskRule { offset: Some(BufferId(4)), constant, period };
            let mut spec =
                AttentionSpec { batch: vec![2], mask_rule: Some(rule.clone()), ..spec(l, s, d, false, None) };
            spec.read_offset(Some(&offset.to_ne_bytes())).unwrap();
            let (mut out, mut lse) = (vec![0u8; 2 * l * d * 8], vec![0u8; 2 * l * 8]);
            attention_bytes(&spec, DType::F64, &bytes(&q), &bytes(&k), &bytes(&v), None, &mut out, Some(&mut lse))
                .unwrap();
            let (out, lse): (&[f64], &[f64]) = (bytemuck::cast_slice(&out), bytemuck::cast_slice(&lse));
            for b in 0..2 {
                let term = |i: usize, j: usize| rule.keeps(Some(offset), i, j).then_some(0.0);
                let operands = (&q[b * l * d..][..l * d], &k[b * s * d..][..s * d], &v[b * s * d..][..s * d]);
                let (want, want_lse) = reference(operands, (l, s, d), false, 0.3, &term);
                let what = format!("{rule} at {offset}, batch {b}");
                close(&what, &out[b * l * d..][..l * d], &want);
                close(&what, &lse[b * l..][..l], &want_lse);
            }
        }
        let mut spec = AttentionSpec {
            mask_rule: Some(MaskRule { offset: Some(BufferId(1)), constant: 0, period: None }),
            ..spec(l, s, d, false, None)
        };
        assert!(spec.read_offset(Some(&[0u8; 4])).is_err() && spec.read_offset(None).is_err());
    }

    #[test]
    fn views_reaching_outside_their_buffers_are_errors() {
        let d = 8;
        let spec = AttentionSpec { k: contiguous(4, d, 8), batch: vec![2], ..spec(4, 4, d, false, None) };
        let buf = vec![0u8; 2 * 4 * d * 4];
        let mut out = buf.clone();
        let e = attention_bytes(&spec, DType::F32, &buf, &buf, &buf, None, &mut out, None).unwrap_err();
        assert!(e.to_string().contains("key view reaches element 71 of 64"), "{e}");
        assert!(attention_bytes(&spec, DType::I32, &buf, &buf, &buf, None, &mut out, None).is_err());
        // A [2, 4, 4] mask in 31 bytes; a masked call without its mask.
        let view =
            StridedOperand { buffer: BufferId(0), offset: 0, batch_strides: vec![16], row_stride: 4, col_stride: 1 };
        let masked = AttentionSpec { k: contiguous(4, d, 0), mask: Some(view), ..spec };
        let mask = MaskBytes { bytes: &buf[..31], kind: MaskKind::Bool };
        let e = attention_bytes(&masked, DType::F32, &buf, &buf, &buf, Some(mask), &mut out, None).unwrap_err();
        assert!(e.to_string().contains("mask view reaches element 31 of 31"), "{e}");
        assert!(attention_bytes(&masked, DType::F32, &buf, &buf, &buf, None, &mut out, None).is_err());
    }
}
