//! The blocked kernel of the CPU attention backward ([`super::attention_backward`]), as
//! FlashAttention-2's backward: one task takes a range of keys of one batch index, a block of
//! [`KEYS_PER_BLOCK`] keys at a time, and for each block of [`ROWS_PER_BLOCK`] query rows that
//! sees a key of the block recomputes the probabilities from the forward's logsumexp, with
//! five small matrix products:
//!
//! - `S = Q K^T`, then `P = exp(scale * S (+ mask term) - lse)`: 0 where the mask or
//!   causality drops the key, and in a row that keeps no key (logsumexp `-inf`);
//! - `dP = dO V^T`, then `dS = scale * P * (dP - delta)` (`delta = rowsum(dO * O)`); with
//!   dropout, `P` and `dP` are taken times the keep factor (0, or `1 / (1 - p)`) first, `dS`
//!   on the undropped `P`;
//! - `dV += P^T dO` and `dK += dS^T Q` (the key block's, in the task's workspace), and
//!   `dQ += dS K` (the task's rows, summed over its key blocks; the caller sums the tasks that
//!   share rows).
//!
//! The products are the forward's register tiles ([`product`]; `P^T` and `dS^T` are read in
//! place as transposed left operands); the per-row loops run over fixed-size arrays so they
//! vectorize, the mask's terms and the dropout's draws aside. Like the forward, the kernel is
//! compiled for AVX-512, for AVX2 with FMA, and for the build's own target ([`Isa`]).
//!
//! Measured on the 2-core AVX-512 build machine (`backward_timing` in the tests: 8 batch
//! indices, 256 rows and keys, head dim 64, f32, best of 20): 1.9 ms unmasked (about 180
//! GFLOP/s over the five products), 1.1 ms causal, 1.5 ms with a padding mask that drops 56 of
//! the keys. Replacing the scalar implementation brought a training step through the
//! templates from about 40 ms to 11-14 ms, against 9-11 ms decomposed (the program
//! `examples/attention_cpu.rs` times such steps).

use super::attention::{batch_offset, Mask};
use super::attention_block::{
    product, round_up, transpose, Compute, Element, Isa, Left, AVX2, AVX512, KEYS_PER_BLOCK, PORTABLE, ROWS_PER_BLOCK,
    WORKSPACE,
};
use super::attention_dropout::{DropoutDraw, LANES};
use coil_ir::loops::StridedOperand;

/// A strided `[rows, d]` operand of one batch index: element `(i, c)` is
/// `data[base + i * row_stride + c * col_stride]`.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a, T> {
    /// The buffer's elements.
    pub data: &'a [T],
    /// The batch index's first element.
    pub base: usize,
    /// Elements from a row to the next.
    pub row_stride: usize,
    /// Elements from a column to the next.
    pub col_stride: usize,
}

impl<'a, T: Copy> Rows<'a, T> {
    /// Batch index `b` of a `[*batch, rows, d]` view of `data`.
    pub fn of(data: &'a [T], op: &StridedOperand<usize>, batch: &[usize], b: usize) -> Self {
        Rows { data, base: batch_offset(batch, op, b), row_stride: op.row_stride, col_stride: op.col_stride }
    }

    /// Row `i`'s first `out.len()` elements, converted.
    #[inline(always)]
    pub fn convert<A>(&self, i: usize, out: &mut [A])
    where
        T: Element<A>,
    {
        let at = self.base + i * self.row_stride;
        if self.col_stride == 1 {
            let n = out.len();
            out.iter_mut().zip(&self.data[at..at + n]).for_each(|(o, &x)| *o = x.up());
        } else {
            out.iter_mut().enumerate().for_each(|(c, o)| *o = self.data[at + c * self.col_stride].up());
        }
    }
}

/// One batch index's operands and statistics, as the kernel reads them.
pub(crate) struct Operands<'a, T, A> {
    /// Queries, `[l, d]`.
    pub q: Rows<'a, T>,
    /// Keys, `[s, d]`.
    pub k: Rows<'a, T>,
    /// Values, `[s, d]`.
    pub v: Rows<'a, T>,
    /// The output's gradient, `[l, d]`.
    pub g: Rows<'a, T>,
    /// Per query row, the forward's logsumexp of the scaled (masked) scores.
    pub lse: &'a [A],
    /// Per query row, `rowsum(dO * O)`.
    pub delta: &'a [A],
    /// The explicit mask, `[l, s]` (its columns being the keys), if any.
    pub mask: Option<MaskRows<'a, T>>,
    /// The dropout, and the flat index of the batch index's weight `(0, 0)` (`b * l * s`).
    pub dropout: Option<(DropoutDraw, u64)>,
}

/// One batch index's `[l, s]` mask: element `(i, j)` at `base + i * row_stride + j *
/// col_stride` of `mask` (broadcast dims stride 0).
#[derive(Clone, Copy)]
pub(crate) struct MaskRows<'a, T> {
    /// The mask's elements and what they hold.
    pub mask: Mask<'a, T>,
    /// The batch index's element `(0, 0)`.
    pub base: usize,
    /// Elements from a row to the next.
    pub row_stride: usize,
    /// Elements from a key to the next.
    pub col_stride: usize,
}

impl<T: Copy, A: Compute> Operands<'_, T, A>
where
    T: Element<A>,
{
    /// The mask's term of (row `i`, key `j`): `None` where it drops the key (a false bool,
    /// an added `-inf`), else what it adds to the scaled score (0 without a mask).
    #[inline(always)]
    pub fn term(&self, i: usize, j: usize) -> Option<A> {
        let Some(view) = &self.mask else { return Some(A::ZERO) };
        let at = view.base + i * view.row_stride + j * view.col_stride;
        match view.mask {
            Mask::Bool(m) => (m[at] != 0).then_some(A::ZERO),
            Mask::Added(m) => Some(m[at].up()).filter(|&x| x != A::NEG_INFINITY),
        }
    }
}

impl<T: Copy, A: Compute> Operands<'_, T, A>
where
    T: Element<A>,
{
    /// The mask's terms of row `i` and keys `k0..k0 + n` into `out[..n]` (`-inf` where it
    /// drops the key); the rest of `out` becomes `-inf`.
    #[inline(always)]
    fn terms(&self, i: usize, k0: usize, n: usize, out: &mut [A]) {
        let Some(view) = &self.mask else { return out.fill(A::ZERO) };
        let at = view.base + i * view.row_stride + k0 * view.col_stride;
        let (live, rest) = out.split_at_mut(n);
        rest.fill(A::NEG_INFINITY);
        match (view.mask, view.col_stride) {
            (Mask::Bool(m), 1) => {
                for (o, &x) in live.iter_mut().zip(&m[at..at + n]) {
                    *o = if x != 0 { A::ZERO } else { A::NEG_INFINITY };
                }
            }
            (Mask::Added(m), 1) => {
                for (o, &x) in live.iter_mut().zip(&m[at..at + n]) {
                    *o = x.up();
                }
            }
            _ => {
                for (jj, o) in live.iter_mut().enumerate() {
                    *o = self.term(i, k0 + jj).unwrap_or(A::NEG_INFINITY);
                }
            }
        }
    }
}

/// The sizes and options every task of a call shares.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// Query rows.
    pub l: usize,
    /// Keys.
    pub s: usize,
    /// Head dim.
    pub d: usize,
    /// Row `i` sees keys `j <= i` only.
    pub causal: bool,
    /// The factor on `q . k`.
    pub scale: f64,
    /// Whether dq, dk and dv are wanted.
    pub wanted: [bool; 3],
}

/// One task: keys `keys` of a batch index, and the query rows that may see them
/// ([`Task::rows`]).
pub(crate) struct Task {
    /// The keys.
    pub keys: std::ops::Range<usize>,
    /// Per key of `keys`, whether some row keeps it (empty: all): the others are not read
    /// (taken as zeros; their probabilities are 0 anyway).
    pub read: Vec<bool>,
}

impl Task {
    /// The query rows that may see a key of the task: from its first key on when causal.
    pub fn rows(&self, shape: &Shape) -> std::ops::Range<usize> {
        if shape.causal {
            self.keys.start.min(shape.l)..shape.l
        } else {
            0..shape.l
        }
    }
}

/// Where one task's gradients go (each empty when not wanted): `dq` `[rows, d]` of
/// [`Task::rows`] (the task's share, overwritten), `dk` and `dv` `[keys, d]`.
pub(crate) struct Grads<'a, A> {
    /// The rows' share of dQ.
    pub dq: &'a mut [A],
    /// The keys' dK.
    pub dk: &'a mut [A],
    /// The keys' dV.
    pub dv: &'a mut [A],
}

/// Runs one task with the `isa` copy of the kernel.
pub(crate) fn backward<T: Element<A>, A: Compute>(
    isa: Isa,
    shape: &Shape,
    task: &Task,
    ops: &Operands<T, A>,
    out: Grads<A>,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` saw every feature these copies are compiled for.
        Isa::Avx512 => unsafe { backward_avx512(shape, task, ops, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { backward_avx2(shape, task, ops, out) },
        _ => backward_in::<T, A, { cfg!(target_arch = "aarch64") }, 4, 16, PORTABLE>(shape, task, ops, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
unsafe fn backward_avx512<T: Element<A>, A: Compute>(shape: &Shape, task: &Task, ops: &Operands<T, A>, out: Grads<A>) {
    backward_in::<T, A, true, 8, 32, AVX512>(shape, task, ops, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn backward_avx2<T: Element<A>, A: Compute>(shape: &Shape, task: &Task, ops: &Operands<T, A>, out: Grads<A>) {
    backward_in::<T, A, true, 4, 16, AVX2>(shape, task, ops, out)
}

/// Converts the rows `j0..j0 + n` of `src` into `out` (`[KEYS_PER_BLOCK][d]`), zero past
/// them and for keys the task does not read.
#[inline(always)]
fn load_keys<T: Element<A>, A: Compute>(src: &Rows<T>, task: &Task, (j0, n, d): (usize, usize, usize), out: &mut [A]) {
    for (jj, row) in out.chunks_exact_mut(d).enumerate() {
        let j = j0 + jj;
        if jj < n && (task.read.is_empty() || task.read[j - task.keys.start]) {
            src.convert(j, row);
        } else {
            row.fill(A::ZERO);
        }
    }
}

/// The task in register tiles of `MR` rows by `NR` columns.
#[inline(always)]
fn backward_in<T: Element<A>, A: Compute, const FMA: bool, const MR: usize, const NR: usize, const SIMD: u8>(
    shape: &Shape,
    task: &Task,
    ops: &Operands<T, A>,
    out: Grads<A>,
) {
    let Grads { dq: dq_out, dk: dk_out, dv: dv_out } = out;
    const BN: usize = KEYS_PER_BLOCK;
    const BM: usize = ROWS_PER_BLOCK;
    let (l, s, d) = (shape.l, shape.s, shape.d);
    let dp = round_up(d, NR);
    let task_rows = task.rows(shape);
    let [want_dq, want_dk, want_dv] = shape.wanted;
    // A key block's rows before transposing [BN][d]; keys and values transposed [d][BN];
    // keys [BN][dp]; a row block's queries and output gradients [BM][dp]; scores, then the
    // probabilities [BM][BN]; dP, then dS [BM][BN]; the key block's dK and dV [BN][dp]; the
    // task's rows' dQ [rows][dp]; a row's dropout factors and mask terms [BN] each.
    let dq_len = if want_dq { task_rows.len() * dp } else { 0 };
    let sizes = [BN * d, d * BN, d * BN, BN * dp, BM * dp, BM * dp, BM * BN, BM * BN, BN * dp, BN * dp, dq_len, BN, BN];
    let words = sizes.iter().sum::<usize>() * std::mem::size_of::<A>() / 8 + 1;
    // Taken out of the thread-local (not used in a closure, which would be compiled without
    // the caller's target features), put back at the end.
    let mut ws = WORKSPACE.with(|ws| std::mem::take(&mut *ws.borrow_mut()));
    {
        if ws.len() < words {
            ws.resize(words, 0);
        }
        let all: &mut [A] = bytemuck::cast_slice_mut(&mut ws[..words]);
        let (kr, rest) = all.split_at_mut(sizes[0]);
        let (kt, rest) = rest.split_at_mut(sizes[1]);
        let (vt, rest) = rest.split_at_mut(sizes[2]);
        let (kp, rest) = rest.split_at_mut(sizes[3]);
        let (qt, rest) = rest.split_at_mut(sizes[4]);
        let (gt, rest) = rest.split_at_mut(sizes[5]);
        let (st, rest) = rest.split_at_mut(sizes[6]);
        let (pt, rest) = rest.split_at_mut(sizes[7]);
        let (dkb, rest) = rest.split_at_mut(sizes[8]);
        let (dvb, rest) = rest.split_at_mut(sizes[9]);
        let (dq, rest) = rest.split_at_mut(sizes[10]);
        let (keep, terms) = rest.split_at_mut(BN);
        let keep: &mut [A; BN] = keep.try_into().unwrap();
        let terms: &mut [A; BN] = (&mut terms[..BN]).try_into().unwrap();
        dq.fill(A::ZERO);
        let scale = A::from_f64(shape.scale);
        for k0 in task.keys.clone().step_by(BN) {
            let kn = BN.min(task.keys.end - k0);
            load_keys(&ops.k, task, (k0, kn, d), kr);
            transpose::<A, SIMD, BN>(kr, d, kt);
            for (row, key) in kp.chunks_exact_mut(dp).zip(kr.chunks_exact(d)) {
                row[..d].copy_from_slice(key);
                row[d..].fill(A::ZERO);
            }
            load_keys(&ops.v, task, (k0, kn, d), kr);
            transpose::<A, SIMD, BN>(kr, d, vt);
            dkb.fill(A::ZERO);
            dvb.fill(A::ZERO);
            if ops.mask.as_ref().is_some_and(|m| m.row_stride == 0) {
                ops.terms(0, k0, kn, terms);
            }
            // Rows that see a key of the block: all, or from its first key on (causal).
            let mut r0 = if shape.causal { k0 } else { 0 };
            while r0 < l {
                let rows = BM.min(l - r0);
                // Keys of the block the rows see (a prefix): all, or up to the last row.
                let kb = if shape.causal { (r0 + rows - k0).min(kn) } else { kn };
                // The rows' queries and output gradients; a row that keeps no key is not read.
                for (r, (q, g)) in qt.chunks_exact_mut(dp).zip(gt.chunks_exact_mut(dp)).enumerate().take(rows) {
                    let i = r0 + r;
                    if ops.lse[i] == A::NEG_INFINITY {
                        q.fill(A::ZERO);
                        g.fill(A::ZERO);
                    } else {
                        ops.q.convert(i, &mut q[..d]);
                        ops.g.convert(i, &mut g[..d]);
                        q[d..].fill(A::ZERO);
                        g[d..].fill(A::ZERO);
                    }
                }
                let cols = round_up(kb, NR);
                // S = Q K^T and dP = dO V^T over the block's keys.
                product::<A, FMA, MR, NR, SIMD>((rows, cols, d), (qt, dp, Left::Rows), (kt, BN), (st, BN), false);
                product::<A, FMA, MR, NR, SIMD>((rows, cols, d), (gt, dp, Left::Rows), (vt, BN), (pt, BN), false);
                for r in 0..rows {
                    let i = r0 + r;
                    let srow: &mut [A; BN] = (&mut st[r * BN..(r + 1) * BN]).try_into().unwrap();
                    let prow: &mut [A; BN] = (&mut pt[r * BN..(r + 1) * BN]).try_into().unwrap();
                    let lse = ops.lse[i];
                    if lse == A::NEG_INFINITY {
                        srow.fill(A::ZERO);
                        prow.fill(A::ZERO);
                        continue;
                    }
                    // Keys of the block row i sees by position (a prefix).
                    let live = if shape.causal { (i + 1 - k0).min(kb) } else { kb };
                    match &ops.mask {
                        None => {
                            for x in srow.iter_mut() {
                                *x = x.mul(scale);
                            }
                        }
                        Some(mask) => {
                            // A mask the same for every row (a padding mask) was read once.
                            if mask.row_stride != 0 {
                                ops.terms(i, k0, live, terms);
                            }
                            masked_scores::<A, BN>(srow, terms, scale);
                        }
                    }
                    probabilities::<A, FMA, BN>(srow, lse, live);
                    match &ops.dropout {
                        None => gradients::<A, BN>(srow, prow, ops.delta[i], scale),
                        Some((draw, at)) => {
                            let first = at + (i * s + k0) as u64;
                            let kept = A::from_f64(draw.scale);
                            let mut lanes = [false; LANES];
                            for (c, chunk) in keep.chunks_exact_mut(LANES).enumerate() {
                                let j0 = c * LANES;
                                if j0 < live {
                                    draw.keeps_lanes(first + j0 as u64, &mut lanes);
                                }
                                for (i, x) in chunk.iter_mut().enumerate() {
                                    *x = if j0 + i < live && lanes[i] { kept } else { A::ZERO };
                                }
                            }
                            dropped_gradients::<A, BN>(srow, prow, keep, ops.delta[i], scale);
                        }
                    }
                }
                // dV += P^T dO, dK += dS^T Q over the rows; dQ += dS K over the keys.
                if want_dv {
                    product::<A, FMA, MR, NR, SIMD>((kb, dp, rows), (st, BN, Left::Columns), (gt, dp), (dvb, dp), true);
                }
                if want_dk {
                    product::<A, FMA, MR, NR, SIMD>((kb, dp, rows), (pt, BN, Left::Columns), (qt, dp), (dkb, dp), true);
                }
                if want_dq {
                    let dq = &mut dq[(r0 - task_rows.start) * dp..];
                    product::<A, FMA, MR, NR, SIMD>((rows, dp, kb), (pt, BN, Left::Rows), (kp, dp), (dq, dp), true);
                }
                r0 += rows;
            }
            let at = (k0 - task.keys.start) * d;
            for (wanted, acc, out) in [(want_dk, &*dkb, &mut *dk_out), (want_dv, &*dvb, &mut *dv_out)] {
                if wanted {
                    for (o, x) in out[at..at + kn * d].chunks_exact_mut(d).zip(acc.chunks_exact(dp)) {
                        o.copy_from_slice(&x[..d]);
                    }
                }
            }
        }
        if want_dq {
            for (o, x) in dq_out.chunks_exact_mut(d).zip(dq.chunks_exact(dp)) {
                o.copy_from_slice(&x[..d]);
            }
        }
    }
    WORKSPACE.with(|w| *w.borrow_mut() = ws);
}

/// `x = x * scale + term` over a row of scores, `-inf` where the term is (the mask drops the
/// key, whatever the score).
#[inline(always)]
fn masked_scores<A: Compute, const N: usize>(x: &mut [A; N], terms: &[A; N], scale: A) {
    for (v, &t) in x.iter_mut().zip(terms) {
        let mut y = v.mul(scale);
        y += t;
        *v = if t == A::NEG_INFINITY { t } else { y };
    }
}

/// A row's probabilities from its scaled (masked) scores `x`: `exp(x - lse)`, 0 for the keys
/// from `live` on. `x - lse` is at most 0 but for rounding, and is taken as 0 above it.
#[inline(always)]
fn probabilities<A: Compute, const FMA: bool, const N: usize>(x: &mut [A; N], lse: A, live: usize) {
    for v in x.iter_mut() {
        let t = v.sub(lse);
        *v = A::exp_nonpositive::<FMA>(if t > A::ZERO { A::ZERO } else { t });
    }
    for v in &mut x[live..] {
        *v = A::ZERO;
    }
}

/// `dp = scale * p * (dp - delta)` over a row, 0 where `p` is (the key dropped, or its
/// probability too small: no term of a dropped key's values reaches the gradients).
#[inline(always)]
fn gradients<A: Compute, const N: usize>(p: &[A; N], dp: &mut [A; N], delta: A, scale: A) {
    for (g, &p) in dp.iter_mut().zip(p) {
        let ds = p.mul(g.sub(delta)).mul(scale);
        *g = if p == A::ZERO { A::ZERO } else { ds };
    }
}

/// [`gradients`] with dropout's factors `keep` (0, or `1 / (1 - p)`): `dp` takes them before
/// `delta` is subtracted, and `p` becomes the dropped probabilities `dV` takes.
#[inline(always)]
fn dropped_gradients<A: Compute, const N: usize>(p: &mut [A; N], dp: &mut [A; N], keep: &[A; N], delta: A, scale: A) {
    for ((g, p), &k) in dp.iter_mut().zip(p.iter_mut()).zip(keep) {
        let ds = p.mul(g.mul(k).sub(delta)).mul(scale);
        *g = if *p == A::ZERO { A::ZERO } else { ds };
        *p = p.mul(k);
    }
}
