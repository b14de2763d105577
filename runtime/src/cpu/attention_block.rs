//! The blocked kernel of the CPU attention forward ([`super::attention`]): one task computes a
//! range of query rows of one batch index, a block of rows against a block of keys at a time,
//! as two small matrix products (`S = Q K^T`, then `O += P V`) with an online softmax between.
//!
//! A task converts the keys and values its rows see to the compute type once (keys transposed,
//! a block of keys after another, so the score product reads them contiguously; values with
//! their rows padded to a whole number of register tiles), then for each block of query rows
//! walks the key blocks that block sees (causal, or a structured mask: none past the block's
//! largest diagonal). Per row it keeps the
//! running maximum `m` and sum `l` of `exp(x - m)`; a block that raises the maximum rescales the
//! row's sum and partial output by `exp(m_old - m_new)` once.
//!
//! The products and the softmax loops are written over fixed-size arrays so the compiler
//! vectorizes them; they are compiled three times, for AVX-512 and for AVX2 with FMA (chosen at
//! run time by CPU feature detection), and for the build's own target (SSE2 on x86-64, NEON with
//! FMA on aarch64). `exp` of f32 is [`exp_nonpositive_f32`], the C backend's `coil_exp_f32`
//! (`codegen/src/c/vecmath.rs`) written again in Rust for the vectorizer (0.97 ulp).

use super::attention::Real;
use half::{bf16, f16};
use std::cell::RefCell;

/// Keys in one block (a multiple of every `NR` and of the softmax's 16 lanes).
pub(crate) const KEYS_PER_BLOCK: usize = 64;

/// Query rows in one block (a multiple of every `MR`).
pub(crate) const ROWS_PER_BLOCK: usize = 32;

/// An operand's element type, converted to and from the compute type `A` inline (the kernels
/// convert whole tiles: a call through a function pointer per element would cost more than
/// the products).
pub(crate) trait Element<A>: Copy + Send + Sync + bytemuck::Pod + 'static {
    /// The value in `A`, exactly.
    fn up(self) -> A;
    /// `x` rounded to the element type.
    fn down(x: A) -> Self;
}

impl Element<f32> for f32 {
    #[inline(always)]
    fn up(self) -> f32 {
        self
    }
    #[inline(always)]
    fn down(x: f32) -> f32 {
        x
    }
}

impl Element<f64> for f64 {
    #[inline(always)]
    fn up(self) -> f64 {
        self
    }
    #[inline(always)]
    fn down(x: f64) -> f64 {
        x
    }
}

impl Element<f32> for bf16 {
    #[inline(always)]
    fn up(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn down(x: f32) -> bf16 {
        bf16::from_f32(x)
    }
}

impl Element<f32> for f16 {
    #[inline(always)]
    fn up(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn down(x: f32) -> f16 {
        f16::from_f32(x)
    }
}

/// The compute type's kernel arithmetic: fused or separate multiply-add (`FMA`: the target has
/// a fused one; without it `mul_add` would call the C library) and `exp` of `x <= 0`.
pub(crate) trait Compute: Real {
    /// `a * b + c`, fused when `FMA`.
    fn fma<const FMA: bool>(a: Self, b: Self, c: Self) -> Self;
    /// `e^x` for `x <= 0` or NaN (NaN stays NaN, `-inf` gives 0).
    fn exp_nonpositive<const FMA: bool>(x: Self) -> Self;
    /// The larger of `a` and `b` by `>` (`a` when `b` is NaN).
    fn max_of(a: Self, b: Self) -> Self;
}

impl Compute for f32 {
    #[inline(always)]
    fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
        if FMA {
            a.mul_add(b, c)
        } else {
            a * b + c
        }
    }
    #[inline(always)]
    fn exp_nonpositive<const FMA: bool>(x: f32) -> f32 {
        exp_nonpositive_f32::<FMA>(x)
    }
    #[inline(always)]
    fn max_of(a: f32, b: f32) -> f32 {
        if b > a {
            b
        } else {
            a
        }
    }
}

impl Compute for f64 {
    #[inline(always)]
    fn fma<const FMA: bool>(a: f64, b: f64, c: f64) -> f64 {
        if FMA {
            a.mul_add(b, c)
        } else {
            a * b + c
        }
    }
    #[inline(always)]
    fn exp_nonpositive<const FMA: bool>(x: f64) -> f64 {
        x.exp()
    }
    #[inline(always)]
    fn max_of(a: f64, b: f64) -> f64 {
        if b > a {
            b
        } else {
            a
        }
    }
}

/// `e^x` for `x <= 0` or NaN: `coil_exp_nonpositive_f32` of the C prelude (`x = n ln2 + r`
/// in two steps, `e^r - 1` by a degree-7 polynomial, `2^n` as one exact factor; 0 below -87,
/// where the result would leave f32's normal range), branch-free so loops over it vectorize.
#[inline(always)]
pub(crate) fn exp_nonpositive_f32<const FMA: bool>(x: f32) -> f32 {
    let fma = f32::fma::<FMA>;
    let c = if x > -87.0 { x } else { -87.0 }; // below: 0 (NaN restored at the end)
                                               // k = round(c / ln2): adding 1.5 * 2^23 leaves the integer in the low mantissa bits.
    let k = c * f32::from_bits(0x3fb8_aa3b) + f32::from_bits(0x4b40_0000);
    let n = k.to_bits() as i32 - 0x4b40_0000;
    let kf = k - f32::from_bits(0x4b40_0000);
    let r = c - kf * f32::from_bits(0x3f31_7200); // exact: ln2's high part has few bits
    let r = r - kf * f32::from_bits(0x35bf_be8e);
    let mut p = f32::from_bits(0x394f_6398);
    p = fma(p, r, f32::from_bits(0x3ab6_a8fb));
    p = fma(p, r, f32::from_bits(0x3c08_895e));
    p = fma(p, r, f32::from_bits(0x3d2a_aa74));
    p = fma(p, r, f32::from_bits(0x3e2a_aaaa));
    p = fma(p, r, 0.5);
    let q = fma(r * r, p, r);
    let y = (1.0 + q) * f32::from_bits(((n + 127) as u32) << 23);
    if x.is_nan() {
        x
    } else if x < -87.0 {
        0.0
    } else {
        y
    }
}

/// Which compiled copy of the kernels runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Isa {
    /// x86-64 with AVX-512 (F, VL, BW, DQ), AVX2 and FMA.
    Avx512,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// The build's target features only.
    Portable,
}

impl Isa {
    /// The best copy this CPU runs.
    pub(crate) fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f")
                && has!("avx512vl")
                && has!("avx512bw")
                && has!("avx512dq")
                && has!("avx2")
                && has!("fma")
            {
                return Isa::Avx512;
            }
            if has!("avx2") && has!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }
}

/// One task's problem: the batch index's operands as the kernels read them.
pub(crate) trait Source<A> {
    /// Converts key `j` of the task's batch index: `out[c]` is its element `c` (`d` of them).
    fn key(&self, j: usize, out: &mut [A]);
    /// Converts value row `j` into `out` (`d` elements).
    fn value(&self, j: usize, out: &mut [A]);
    /// Converts query row `i` into `out` (`d` elements).
    fn query(&self, i: usize, out: &mut [A]);
    /// The mask's term of (row `i`, key `j`): `None` drops the key, else what is added to the
    /// scaled score. Only called when [`Source::masked`].
    fn term(&self, i: usize, j: usize) -> Option<A>;
    /// Whether the call has a mask.
    fn masked(&self) -> bool;
    /// Applies the call's dropout to row `i`'s probabilities of keys `k0..k0 + row.len()`
    /// (after the softmax's sums took them whole): nothing without dropout.
    fn drop_probabilities(&self, _i: usize, _k0: usize, _row: &mut [A]) {}
}

/// One task: query rows `rows` of a batch index, against keys `keys` (the union of what its
/// rows see); `blocks` gives, per block of [`ROWS_PER_BLOCK`] rows from `rows.start`, the keys
/// that block sees.
pub(crate) struct Task {
    /// The query rows.
    pub rows: std::ops::Range<usize>,
    /// The keys the rows see (converted once).
    pub keys: std::ops::Range<usize>,
    /// Per block of rows, the keys it sees (inside `keys`).
    pub blocks: Vec<std::ops::Range<usize>>,
}

/// The sizes every task shares.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    /// Head dim.
    pub d: usize,
    /// Row `i` sees keys `j <= limit.last(i)` only (causal, or a structured mask), if given.
    pub limit: Option<KeyLimit>,
    /// The factor on `q . k`.
    pub scale: f64,
}

/// A diagonal limit on the keys each row sees: row `i` sees keys `j <= base + (i mod period)`
/// (`base + i` without a period), in i64 arithmetic. Causal attention is base 0 without a
/// period; a structured mask ([`coil_ir::loops::MaskRule`]) is its offset's value plus its
/// constant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeyLimit {
    /// The last key row 0 sees.
    pub base: i64,
    /// The row term is `i mod period`, else `i`.
    pub period: Option<usize>,
}

impl KeyLimit {
    /// PyTorch's `is_causal`: row `i` sees keys `j <= i`.
    pub const CAUSAL: KeyLimit = KeyLimit { base: 0, period: None };

    /// The last key row `i` sees (negative: none).
    #[inline(always)]
    pub fn last(&self, i: usize) -> i64 {
        self.base.wrapping_add(match self.period {
            Some(p) => i % p,
            None => i,
        } as i64)
    }

    /// How many of the `kn` keys from `k0` row `i` sees (a prefix of them).
    #[inline(always)]
    pub fn seen(&self, i: usize, k0: usize, kn: usize) -> usize {
        (self.last(i).saturating_add(1).saturating_sub(k0 as i64)).clamp(0, kn as i64) as usize
    }

    /// Keys `0..n` hold every key some row of `rows` sees, `n <= s`: one past the largest
    /// [`KeyLimit::last`] over the rows (rows that wrap a period reach `period - 1`).
    pub fn keys_seen(&self, rows: std::ops::Range<usize>, s: usize) -> usize {
        if rows.is_empty() {
            return 0;
        }
        let (a, b) = (rows.start, rows.end - 1);
        let top = match self.period {
            Some(p) if b - a >= p - 1 || a % p > b % p => self.base.wrapping_add(p as i64 - 1),
            _ => self.last(b),
        };
        top.saturating_add(1).clamp(0, s as i64) as usize
    }
}

/// Runs one task: `out` gets the rows' results (`[rows, d]`, row-major) and `lse` their
/// logsumexps.
pub(crate) fn forward<A: Compute, S: Source<A>>(
    isa: Isa,
    shape: Shape,
    task: &Task,
    src: &S,
    out: &mut [A],
    lse: &mut [A],
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` saw every feature these copies are compiled for.
        Isa::Avx512 => unsafe { forward_avx512(shape, task, src, out, lse) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { forward_avx2(shape, task, src, out, lse) },
        _ => forward_in::<A, S, { cfg!(target_arch = "aarch64") }, 4, 16, PORTABLE>(shape, task, src, out, lse),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
unsafe fn forward_avx512<A: Compute, S: Source<A>>(shape: Shape, task: &Task, src: &S, out: &mut [A], lse: &mut [A]) {
    forward_in::<A, S, true, 8, 32, AVX512>(shape, task, src, out, lse)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn forward_avx2<A: Compute, S: Source<A>>(shape: Shape, task: &Task, src: &S, out: &mut [A], lse: &mut [A]) {
    forward_in::<A, S, true, 4, 16, AVX2>(shape, task, src, out, lse)
}

/// [`forward_in`]'s `SIMD`: the register tiles in the build's own vector instructions (what
/// the compiler makes of scalar code), ...
pub(crate) const PORTABLE: u8 = 0;
/// ... in AVX2 and FMA intrinsics (f32; `NR` 16), ...
pub(crate) const AVX2: u8 = 1;
/// ... or in AVX-512 ones (f32; `NR` 32).
pub(crate) const AVX512: u8 = 2;

thread_local! {
    /// Each pool thread's workspace (converted operands, tiles), kept from call to call so a
    /// call does not fault fresh pages in.
    pub(crate) static WORKSPACE: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// `n` rounded up to a multiple of `m`.
pub(crate) fn round_up(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}

/// The task in register tiles of `MR` rows by `NR` columns.
#[inline(always)]
fn forward_in<A: Compute, S: Source<A>, const FMA: bool, const MR: usize, const NR: usize, const SIMD: u8>(
    shape: Shape,
    task: &Task,
    src: &S,
    out: &mut [A],
    lse: &mut [A],
) {
    const BN: usize = KEYS_PER_BLOCK;
    const BM: usize = ROWS_PER_BLOCK;
    let d = shape.d;
    let dp = round_up(d, NR);
    let nk = task.keys.len();
    let key_blocks = nk.div_ceil(BN);
    // Keys transposed per block ([block][c][BN]), values [key][dp], the query tile [BM][d],
    // scores [BM][BN], the output tile [BM][dp], and per row the running max and sum.
    let sizes = [key_blocks * d * BN, key_blocks * BN * dp, BM * d, BM * BN, BM * dp, BM, BM, BN * d];
    let words = sizes.iter().sum::<usize>() * std::mem::size_of::<A>() / 8 + 1;
    // Taken out of the thread-local (not used in a closure, which would be compiled without
    // the caller's target features), put back at the end.
    let mut ws = WORKSPACE.with(|ws| std::mem::take(&mut *ws.borrow_mut()));
    {
        if ws.len() < words {
            ws.resize(words, 0);
        }
        let all: &mut [A] = bytemuck::cast_slice_mut(&mut ws[..words]);
        let (kt, rest) = all.split_at_mut(sizes[0]);
        let (vb, rest) = rest.split_at_mut(sizes[1]);
        let (qt, rest) = rest.split_at_mut(sizes[2]);
        let (st, rest) = rest.split_at_mut(sizes[3]);
        let (ot, rest) = rest.split_at_mut(sizes[4]);
        let (mt, rest) = rest.split_at_mut(sizes[5]);
        let (lt, rest) = rest.split_at_mut(sizes[6]);
        let kb = &mut rest[..sizes[7]];
        // The keys, transposed block by block (zero past the last key): converted by rows,
        // then read down the columns (gathers; scattered writes are slow on some CPUs).
        for (blk, kt) in kt.chunks_exact_mut(d * BN).enumerate() {
            for (jj, row) in kb.chunks_exact_mut(d).enumerate() {
                if jj < nk - blk * BN {
                    src.key(task.keys.start + blk * BN + jj, row);
                } else {
                    row.fill(A::ZERO);
                }
            }
            transpose::<A, SIMD, BN>(kb, d, kt);
        }
        for (j, vrow) in vb.chunks_exact_mut(dp).enumerate() {
            if j < nk {
                src.value(task.keys.start + j, &mut vrow[..d]);
                vrow[d..].fill(A::ZERO);
            } else {
                vrow.fill(A::ZERO);
            }
        }
        let scale = A::from_f64(shape.scale);
        for (qb, seen) in task.blocks.iter().enumerate() {
            let q0 = task.rows.start + qb * BM;
            let rows = BM.min(task.rows.end - q0);
            for (r, q) in qt.chunks_exact_mut(d).enumerate().take(rows) {
                src.query(q0 + r, q);
            }
            ot[..rows * dp].fill(A::ZERO);
            mt.fill(A::NEG_INFINITY);
            lt.fill(A::ZERO);
            // Key blocks of the task's layout that hold keys this block sees.
            let first_blk = (seen.start - task.keys.start) / BN;
            let end_blk = (seen.end - task.keys.start).div_ceil(BN);
            for blk in first_blk..end_blk {
                let k0 = task.keys.start + blk * BN;
                // No row of the block sees keys past its largest limit.
                let kn = match shape.limit {
                    Some(limit) => {
                        BN.min(task.keys.end - k0).min(limit.keys_seen(q0..q0 + rows, task.keys.end).saturating_sub(k0))
                    }
                    None => BN.min(task.keys.end - k0),
                };
                let ktb = &kt[blk * d * BN..(blk + 1) * d * BN];
                // S = Q K^T over the block's keys.
                product::<A, FMA, MR, NR, SIMD>(
                    (rows, round_up(kn, NR), d),
                    (qt, d, Left::Rows),
                    (ktb, BN),
                    (st, BN),
                    false,
                );
                // Scale, mask, and the online softmax per row; P replaces S.
                for r in 0..rows {
                    let srow: &mut [A; BN] = (&mut st[r * BN..(r + 1) * BN]).try_into().unwrap();
                    let i = q0 + r;
                    // Keys of the block row i sees by position (a prefix: its limit, or the end).
                    let live = shape.limit.map_or(kn, |limit| limit.seen(i, k0, kn));
                    scale_row::<A, BN>(srow, scale);
                    if src.masked() {
                        for (jj, x) in srow.iter_mut().enumerate().take(live) {
                            match src.term(i, k0 + jj) {
                                Some(add) => *x += add,
                                None => *x = A::NEG_INFINITY,
                            }
                        }
                    }
                    let (m, l) = (&mut mt[r], &mut lt[r]);
                    let alpha = softmax_row::<A, FMA, BN>(srow, live, m, l);
                    src.drop_probabilities(i, k0, &mut srow[..live]);
                    if alpha != A::ONE {
                        for x in &mut ot[r * dp..(r + 1) * dp] {
                            *x = x.mul(alpha);
                        }
                    }
                }
                // O += P V over the block's keys.
                let vblk = &vb[blk * BN * dp..];
                product::<A, FMA, MR, NR, SIMD>((rows, dp, kn), (st, BN, Left::Rows), (vblk, dp), (ot, dp), true);
            }
            // Divide by the sums; a row that saw no key keeps 0 and logsumexp -inf.
            let base = q0 - task.rows.start;
            for r in 0..rows {
                let (m, l) = (mt[r], lt[r]);
                let o = &mut out[(base + r) * d..(base + r + 1) * d];
                if l != A::ZERO {
                    let inv = l.recip();
                    for (x, &y) in o.iter_mut().zip(&ot[r * dp..r * dp + d]) {
                        *x = y.mul(inv);
                    }
                    let mut s = l.ln();
                    s += m;
                    lse[base + r] = s;
                } else {
                    o.fill(A::ZERO);
                    lse[base + r] = A::NEG_INFINITY;
                }
            }
        }
    }
    WORKSPACE.with(|w| *w.borrow_mut() = ws);
}

/// `x *= scale` over a row.
#[inline(always)]
fn scale_row<A: Compute, const N: usize>(x: &mut [A; N], scale: A) {
    for v in x.iter_mut() {
        *v = v.mul(scale);
    }
}

/// The online softmax step of one row of scores: the first `live` are the row's (the rest
/// become 0); updates the running max `m` and sum `l`, replaces the scores by `exp(x - m)`
/// and returns the factor the row's partial output must take (1 when the max did not grow).
/// The loops run over the whole row (dead scores as `-inf`), so they vectorize without tails.
#[inline(always)]
fn softmax_row<A: Compute, const FMA: bool, const N: usize>(x: &mut [A; N], live: usize, m: &mut A, l: &mut A) -> A {
    const LANES: usize = 16;
    for v in &mut x[live..] {
        *v = A::NEG_INFINITY;
    }
    let mut lanes = [A::NEG_INFINITY; LANES];
    for chunk in x.chunks_exact(LANES) {
        for (a, &v) in lanes.iter_mut().zip(chunk) {
            *a = A::max_of(*a, v);
        }
    }
    let mut top = *m;
    for a in lanes {
        top = A::max_of(top, a);
    }
    if top == A::NEG_INFINITY {
        // Nothing seen yet: all probabilities 0 (-inf - -inf would be NaN).
        x.fill(A::ZERO);
        return A::ONE;
    }
    let alpha = if top == *m { A::ONE } else { A::exp_nonpositive::<FMA>(m.sub(top)) };
    let mut sums = [A::ZERO; LANES];
    for chunk in x.chunks_exact_mut(LANES) {
        for (s, v) in sums.iter_mut().zip(chunk) {
            *v = A::exp_nonpositive::<FMA>(v.sub(top));
            *s += *v;
        }
    }
    let mut total = A::ZERO;
    for s in sums {
        total += s;
    }
    *l = A::fma::<FMA>(*l, alpha, total);
    *m = top;
    alpha
}

/// `out[c][j] = rows[j][c]` for `N` rows of `d` (`out` is `[d][N]`).
#[inline(always)]
pub(crate) fn transpose<A: Compute, const SIMD: u8, const N: usize>(rows: &[A], d: usize, out: &mut [A]) {
    assert!(rows.len() >= N * d && out.len() >= N * d && N.is_multiple_of(16));
    #[cfg(target_arch = "x86_64")]
    if SIMD != PORTABLE && std::mem::size_of::<A>() == 4 {
        let (src, dst) = (rows.as_ptr() as *const f32, out.as_mut_ptr() as *mut f32);
        // SAFETY: element `(j, c)` is read at `j * d + c < N * d`, written at `c * N + j`
        // (checked above); the copies with these features run only where they were seen.
        unsafe {
            if SIMD == AVX512 {
                x86::transpose_avx512::<N>(src, d, dst);
            } else {
                x86::transpose_avx2::<N>(src, d, dst);
            }
        }
        return;
    }
    for (c, col) in out.chunks_exact_mut(N).take(d).enumerate() {
        for (j, x) in col.iter_mut().enumerate() {
            *x = rows[j * d + c];
        }
    }
}

/// How a product's left operand `a` (`rows` by `k`) lies in memory, `lda` being its stride.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Left {
    /// Element `(r, p)` at `r * lda + p`: row-major.
    Rows,
    /// Element `(r, p)` at `p * lda + r`: the transpose of a row-major `k` by `rows` matrix.
    Columns,
}

/// `c (+)= a b` of `rows` by `cols` (a multiple of `NR`) with `k` terms, operands given with
/// their strides (`a` row-major or transposed): tiles of `MR` rows, the rest of the rows in
/// tiles of 4, 2 or 1 (a decode step's one row is not padded to `MR`).
#[inline(always)]
pub(crate) fn product<A: Compute, const FMA: bool, const MR: usize, const NR: usize, const SIMD: u8>(
    (rows, cols, k): (usize, usize, usize),
    (a, lda, left): (&[A], usize, Left),
    (b, ldb): (&[A], usize),
    (c, ldc): (&mut [A], usize),
    accumulate: bool,
) {
    let mut r0 = 0;
    while r0 < rows {
        let left_rows = rows - r0;
        let take = if left_rows >= MR {
            MR
        } else if left_rows >= 4 {
            4
        } else if left_rows >= 2 {
            2
        } else {
            1
        };
        let a = match left {
            Left::Rows => &a[r0 * lda..],
            Left::Columns => &a[r0..],
        };
        for n0 in (0..cols).step_by(NR) {
            let (b, c) = (&b[n0..], &mut c[r0 * ldc + n0..]);
            let a = (a, lda, left);
            match take {
                4 => tile::<A, FMA, 4, NR, SIMD>(k, a, b, ldb, c, ldc, accumulate),
                2 => tile::<A, FMA, 2, NR, SIMD>(k, a, b, ldb, c, ldc, accumulate),
                1 => tile::<A, FMA, 1, NR, SIMD>(k, a, b, ldb, c, ldc, accumulate),
                _ => tile::<A, FMA, MR, NR, SIMD>(k, a, b, ldb, c, ldc, accumulate),
            }
        }
        r0 += take;
    }
}

/// `acc[n] += x * b[n]`, fused when `FMA`.
#[inline(always)]
fn fma_row<A: Compute, const FMA: bool, const NR: usize>(acc: &mut [A; NR], x: A, b: &[A; NR]) {
    for n in 0..NR {
        acc[n] = A::fma::<FMA>(x, b[n], acc[n]);
    }
}

/// `c[r][n] (+)= sum_p a(r, p) b[p][n]` for an `MR` by `NR` tile, `k` terms (`a` laid out as
/// its [`Left`] says with stride `lda`, rows of `b` `ldb` apart, of `c` `ldc`); `accumulate`
/// adds to `c`, else overwrites it.
#[inline(always)]
fn tile<A: Compute, const FMA: bool, const MR: usize, const NR: usize, const SIMD: u8>(
    k: usize,
    (a, lda, left): (&[A], usize, Left),
    b: &[A],
    ldb: usize,
    c: &mut [A],
    ldc: usize,
    accumulate: bool,
) {
    // The last element of `a` read, plus one.
    let a_end = match left {
        Left::Rows => (MR - 1) * lda + k,
        Left::Columns if k == 0 => 0,
        Left::Columns => (k - 1) * lda + MR,
    };
    #[cfg(target_arch = "x86_64")]
    if SIMD != PORTABLE && std::mem::size_of::<A>() == 4 {
        // f32: the compiler does not keep scalar code's tile of sums in vector registers.
        assert!(a.len() >= a_end && c.len() >= (MR - 1) * ldc + NR);
        assert!(k == 0 || b.len() >= (k - 1) * ldb + NR);
        let (rs, cs) = match left {
            Left::Rows => (lda, 1),
            Left::Columns => (1, lda),
        };
        let (a, b, c) = (a.as_ptr() as *const f32, b.as_ptr() as *const f32, c.as_mut_ptr() as *mut f32);
        // SAFETY: the reads and writes stay inside the slices (checked above); the kernels run
        // these copies only where `Isa::detect` saw their features.
        unsafe {
            if SIMD == AVX512 && NR == 32 {
                return x86::tile_avx512::<MR>(k, (a, rs, cs), b, ldb, c, ldc, accumulate);
            }
            if SIMD == AVX2 && NR == 16 {
                return x86::tile_avx2::<MR>(k, (a, rs, cs), b, ldb, c, ldc, accumulate);
            }
        }
    }
    let mut acc = [[A::ZERO; NR]; MR];
    if accumulate {
        for (r, row) in acc.iter_mut().enumerate() {
            row.copy_from_slice(&c[r * ldc..r * ldc + NR]);
        }
    }
    match left {
        Left::Rows => {
            let arows: [&[A]; MR] = std::array::from_fn(|r| &a[r * lda..r * lda + k]);
            for p in 0..k {
                let brow: &[A; NR] = b[p * ldb..p * ldb + NR].try_into().unwrap();
                for r in 0..MR {
                    fma_row::<A, FMA, NR>(&mut acc[r], arows[r][p], brow);
                }
            }
        }
        Left::Columns => {
            assert!(a.len() >= a_end);
            for p in 0..k {
                let brow: &[A; NR] = b[p * ldb..p * ldb + NR].try_into().unwrap();
                let acol: &[A; MR] = a[p * lda..p * lda + MR].try_into().unwrap();
                for r in 0..MR {
                    fma_row::<A, FMA, NR>(&mut acc[r], acol[r], brow);
                }
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        c[r * ldc..r * ldc + NR].copy_from_slice(row);
    }
}

/// The f32 register tiles in intrinsics: `MR` rows of sums in two vector registers each.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::tile`] of f32 with `NR` 32, on raw pointers (the caller checks the extents):
    /// element `(r, p)` of `a` at `r * rs + p * cs`.
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
    #[inline]
    #[allow(clippy::too_many_arguments)] // a matrix product's operands
    pub(super) unsafe fn tile_avx512<const MR: usize>(
        k: usize,
        (a, rs, cs): (*const f32, usize, usize),
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                row[0] = _mm512_loadu_ps(c.add(r * ldc));
                row[1] = _mm512_loadu_ps(c.add(r * ldc + 16));
            }
        }
        for p in 0..k {
            let (b0, b1) = (_mm512_loadu_ps(b.add(p * ldb)), _mm512_loadu_ps(b.add(p * ldb + 16)));
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*a.add(r * rs + p * cs));
                row[0] = _mm512_fmadd_ps(x, b0, row[0]);
                row[1] = _mm512_fmadd_ps(x, b1, row[1]);
            }
        }
        for (r, row) in acc.iter().enumerate() {
            _mm512_storeu_ps(c.add(r * ldc), row[0]);
            _mm512_storeu_ps(c.add(r * ldc + 16), row[1]);
        }
    }

    /// [`super::transpose`] of f32 by gathering 16 rows' elements at a time.
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
    #[inline]
    pub(super) unsafe fn transpose_avx512<const N: usize>(src: *const f32, d: usize, dst: *mut f32) {
        let step = _mm512_set1_epi32(d as i32);
        let idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), step);
        for c in 0..d {
            for j in (0..N).step_by(16) {
                let x = _mm512_i32gather_ps::<4>(idx, src.add(j * d + c));
                _mm512_storeu_ps(dst.add(c * N + j), x);
            }
        }
    }

    /// [`super::transpose`] of f32 by gathering 8 rows' elements at a time.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(super) unsafe fn transpose_avx2<const N: usize>(src: *const f32, d: usize, dst: *mut f32) {
        let idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(d as i32));
        for c in 0..d {
            for j in (0..N).step_by(8) {
                let x = _mm256_i32gather_ps::<4>(src.add(j * d + c), idx);
                _mm256_storeu_ps(dst.add(c * N + j), x);
            }
        }
    }

    /// [`super::tile`] of f32 with `NR` 16, on raw pointers (the caller checks the extents):
    /// element `(r, p)` of `a` at `r * rs + p * cs`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    #[allow(clippy::too_many_arguments)] // a matrix product's operands
    pub(super) unsafe fn tile_avx2<const MR: usize>(
        k: usize,
        (a, rs, cs): (*const f32, usize, usize),
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                row[0] = _mm256_loadu_ps(c.add(r * ldc));
                row[1] = _mm256_loadu_ps(c.add(r * ldc + 8));
            }
        }
        for p in 0..k {
            let (b0, b1) = (_mm256_loadu_ps(b.add(p * ldb)), _mm256_loadu_ps(b.add(p * ldb + 8)));
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm256_set1_ps(*a.add(r * rs + p * cs));
                row[0] = _mm256_fmadd_ps(x, b0, row[0]);
                row[1] = _mm256_fmadd_ps(x, b1, row[1]);
            }
        }
        for (r, row) in acc.iter().enumerate() {
            _mm256_storeu_ps(c.add(r * ldc), row[0]);
            _mm256_storeu_ps(c.add(r * ldc + 8), row[1]);
        }
    }
}

#[cfg(test)]
#[path = "attention_block_tests.rs"]
mod tests;
