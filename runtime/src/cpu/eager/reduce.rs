//! The tier-0 executor's non-pointwise ops: reductions over any dims of a strided value, and
//! batched matrix products through the CPU GEMM routine compiled graphs call
//! ([`crate::cpu::gemm::bmm_bytes_to`]), so that products agree with the compiled path's.

use super::chunk::Val;
use super::layout::Layout;
use crate::cpu::gemm::{bmm_bytes_to, BmmSpec};
use crate::HostData;
use coil_ir::loops::{BufferId, StridedOperand};
use coil_ir::{DType, ReduceOp, Result};

/// Rows read at once by a reduction (the values of one output element are one row).
const ROW_CHUNK: usize = 4096;

/// `op` over `dims` of the value `layout` views in `data`, as `dtype` (the node's result):
/// floats accumulate in f64 and round once (as the interpreter does), integers wrap in i64;
/// max / min propagate NaN; argmax / argmin give the first extreme (NaN counts as one).
pub(super) fn reduce(op: ReduceOp, dims: &[usize], layout: &Layout, data: &HostData, dtype: DType) -> Result<HostData> {
    let nd = layout.shape.len();
    let kept: Vec<usize> = (0..nd).filter(|d| !dims.contains(d)).collect();
    let perm: Vec<usize> = kept.iter().chain(dims).copied().collect();
    let rows = layout.permute(&perm);
    let r: usize = dims.iter().map(|&d| layout.shape[d]).product();
    let outer: usize = kept.iter().map(|&d| layout.shape[d]).product();
    let float = data.dtype().is_float();
    if let (true, HostData::F32(xs), ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min) = (rows.is_contiguous(), data, op) {
        // Rows of f32 in place (the common case: a norm's or a softmax's last dim): no copy.
        let first = rows.offset as usize;
        let out = by_rows(outer, r, |o| {
            let row = &xs[first + o * r..first + (o + 1) * r];
            match op {
                ReduceOp::Sum => sum_f32(row),
                _ if r == 0 => 0.0,
                _ => extreme(op == ReduceOp::Max, row),
            }
        });
        return Ok(HostData::from_f64_slice(dtype, &out));
    }
    if float {
        let mut out = vec![0f64; outer];
        let mut row = vec![0f64; r.min(ROW_CHUNK)];
        for (o, v) in out.iter_mut().enumerate() {
            let mut acc = Acc::new(op);
            let mut done = 0;
            while done < r {
                let n = (r - done).min(ROW_CHUNK);
                load_f64(&rows, data, o * r + done, &mut row[..n]);
                let part = &row[..n];
                match op {
                    // the common reductions in loops the compiler vectorizes (8 running sums)
                    ReduceOp::Sum => acc.f += sum(part),
                    ReduceOp::Max | ReduceOp::Min if !acc.f.is_nan() => {
                        let m = extreme(op == ReduceOp::Max, part);
                        acc.f = if !acc.seen || m.is_nan() {
                            m
                        } else if op == ReduceOp::Max {
                            acc.f.max(m)
                        } else {
                            acc.f.min(m)
                        };
                        acc.seen = true;
                    }
                    ReduceOp::Max | ReduceOp::Min => {}
                    _ => part.iter().enumerate().for_each(|(i, &x)| acc.float(done + i, x)),
                }
                done += n;
            }
            *v = acc.float_result();
        }
        return Ok(if dtype.is_float() {
            HostData::from_f64_slice(dtype, &out)
        } else {
            HostData::from_i64_slice(dtype, &out.iter().map(|&x| x as i64).collect::<Vec<_>>())
        });
    }
    let mut out = vec![0i64; outer];
    let mut row = vec![0i64; r.min(ROW_CHUNK)];
    for (o, v) in out.iter_mut().enumerate() {
        let mut acc = Acc::new(op);
        let mut done = 0;
        while done < r {
            let n = (r - done).min(ROW_CHUNK);
            load_i64(&rows, data, o * r + done, &mut row[..n]);
            row[..n].iter().enumerate().for_each(|(i, &x)| acc.int(done + i, x));
            done += n;
        }
        *v = acc.int_result();
    }
    Ok(HostData::from_i64_slice(dtype, &out))
}

/// The sum of `xs` in eight running sums (vectorizable; no less accurate than one).
fn sum(xs: &[f64]) -> f64 {
    let mut lanes = [0f64; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    let tail: f64 = chunks.remainder().iter().sum();
    lanes.iter().sum::<f64>() + tail
}

/// How many parts of whole rows a reduction of `outer` rows of `r` elements runs in on the CPU
/// pool: one below the compiled launches' parallel threshold, else about as many as theirs.
pub(super) fn row_parts(outer: usize, r: usize) -> usize {
    let (numel, threads) = (outer * r, crate::cpu::jobs::helpers() + 1);
    let min = super::PARALLEL_MIN;
    if numel < min || threads < 2 || outer < 2 {
        return 1;
    }
    (numel / (min / 2)).min(crate::cpu::launch::CHUNKS_PER_THREAD as usize * threads).min(outer).max(2)
}

/// `row(o)` for every row `o` of `outer`, in [`row_parts`] parts on the CPU pool (each part
/// writing its rows of the result: nothing allocated on one thread and freed on another).
pub(super) fn by_rows(outer: usize, r: usize, row: impl Fn(usize) -> f64 + Sync) -> Vec<f64> {
    let parts = row_parts(outer, r);
    if parts == 1 {
        return (0..outer).map(row).collect();
    }
    let mut out = vec![0f64; outer];
    let outs: Vec<std::sync::Mutex<&mut [f64]>> = out.chunks_mut(outer.div_ceil(parts)).map(Into::into).collect();
    let size = outer.div_ceil(parts);
    crate::cpu::jobs::run(outs.len(), crate::cpu::jobs::helpers(), &|p| {
        let mut part = outs[p].lock().unwrap_or_else(|e| e.into_inner());
        for (k, v) in part.iter_mut().enumerate() {
            *v = row(p * size + k);
        }
    });
    drop(outs);
    out
}

/// [`sum`] of f32 values, accumulated in f64.
fn sum_f32(xs: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x as f64;
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&x| x as f64).sum();
    lanes.iter().sum::<f64>() + tail
}

/// The max (else min) of a nonempty `xs` (f32 or f64), NaN if any is NaN.
fn extreme<T: Copy + PartialOrd + Into<f64>>(max: bool, xs: &[T]) -> f64 {
    let mut nan = false;
    let mut m = xs[0];
    for &x in xs {
        #[allow(clippy::eq_op)] // x != x: NaN, for f32 and f64 alike
        let is_nan = x != x;
        nan |= is_nan;
        m = match max {
            true if x > m => x,
            false if x < m => x,
            _ => m,
        };
    }
    if nan {
        f64::NAN
    } else {
        m.into()
    }
}

fn load_f64(layout: &Layout, data: &HostData, start: usize, out: &mut [f64]) {
    match data {
        HostData::F32(s) => layout.read(s, start, out, |x| x as f64),
        HostData::F64(s) => layout.read(s, start, out, |x| x),
        HostData::F16(s) => layout.read(s, start, out, |x| x.to_f64()),
        HostData::BF16(s) => layout.read(s, start, out, |x| x.to_f64()),
        d => unreachable!("{} is not a float", d.dtype()),
    }
}

fn load_i64(layout: &Layout, data: &HostData, start: usize, out: &mut [i64]) {
    match data {
        HostData::Bool(s) => layout.read(s, start, out, |x| x as i64),
        HostData::U8(s) => layout.read(s, start, out, |x| x as i64),
        HostData::I8(s) => layout.read(s, start, out, |x| x as i64),
        HostData::I16(s) => layout.read(s, start, out, |x| x as i64),
        HostData::I32(s) => layout.read(s, start, out, |x| x as i64),
        HostData::I64(s) => layout.read(s, start, out, |x| x),
        d => unreachable!("{} is a float", d.dtype()),
    }
}

/// A sum, max or min over the trailing dims of a value computed chunk by chunk (its rows are
/// consecutive elements): the partial results of each chunk's pieces of rows, combined.
pub(super) struct Rows {
    op: ReduceOp,
    /// Elements per row.
    r: usize,
    /// The first row.
    lo: usize,
    acc: Vec<f64>,
    seen: Vec<bool>,
}

impl Rows {
    /// Rows `lo .. hi` of `r` elements each.
    pub fn new(op: ReduceOp, lo: usize, hi: usize, r: usize) -> Rows {
        Rows { op, r, lo, acc: vec![0.0; hi - lo], seen: vec![false; hi - lo] }
    }

    /// Elements `start ..` of the value.
    pub fn add(&mut self, start: usize, v: Val) {
        let n = match v {
            Val::F(x) => x.len(),
            Val::D(x) => x.len(),
            Val::I(_) => unreachable!("float rows only (checked by the plan)"),
        };
        let mut k = 0;
        while k < n {
            let o = (start + k) / self.r;
            let end = ((o + 1) * self.r - start).min(n);
            let part = match (v, self.op) {
                (Val::F(x), ReduceOp::Sum) => sum_f32(&x[k..end]),
                (Val::D(x), ReduceOp::Sum) => sum(&x[k..end]),
                (Val::F(x), op) => extreme(op == ReduceOp::Max, &x[k..end]),
                (Val::D(x), op) => extreme(op == ReduceOp::Max, &x[k..end]),
                (Val::I(_), _) => unreachable!("float rows only"),
            };
            let (acc, seen) = (&mut self.acc[o - self.lo], &mut self.seen[o - self.lo]);
            *acc = match self.op {
                ReduceOp::Sum => *acc + part,
                _ if !*seen || acc.is_nan() || part.is_nan() => {
                    if acc.is_nan() && *seen {
                        *acc
                    } else {
                        part
                    }
                }
                ReduceOp::Max => acc.max(part),
                _ => acc.min(part),
            };
            *seen = true;
            k = end;
        }
    }

    /// The results, into `out` (one per row).
    pub fn results(self, out: &mut [f64]) {
        out.copy_from_slice(&self.acc);
    }
}

/// One output element's accumulator.
struct Acc {
    op: ReduceOp,
    f: f64,
    i: i64,
    /// The position of the extreme so far (arg reductions), and whether one was seen.
    at: usize,
    seen: bool,
}

impl Acc {
    fn new(op: ReduceOp) -> Acc {
        let (f, i) = match op {
            ReduceOp::Prod => (1.0, 1),
            _ => (0.0, 0),
        };
        Acc { op, f, i, at: 0, seen: false }
    }

    fn float(&mut self, k: usize, x: f64) {
        match self.op {
            ReduceOp::Sum => self.f += x,
            ReduceOp::Prod => self.f *= x,
            ReduceOp::Max | ReduceOp::Min => {
                let better = if self.op == ReduceOp::Max { x > self.f } else { x < self.f };
                if !self.seen || x.is_nan() || (!self.f.is_nan() && better) {
                    self.f = if self.f.is_nan() && self.seen { self.f } else { x };
                }
            }
            ReduceOp::ArgMax | ReduceOp::ArgMin => {
                let better = if self.op == ReduceOp::ArgMax { x > self.f } else { x < self.f };
                // the first NaN wins and stays; else the first strict extreme
                if !self.seen || (!self.f.is_nan() && (x.is_nan() || better)) {
                    self.f = x;
                    self.at = k;
                }
            }
        }
        self.seen = true;
    }

    fn float_result(&self) -> f64 {
        if self.op.is_arg() {
            self.at as f64
        } else {
            self.f
        }
    }

    fn int(&mut self, k: usize, x: i64) {
        match self.op {
            ReduceOp::Sum => self.i = self.i.wrapping_add(x),
            ReduceOp::Prod => self.i = self.i.wrapping_mul(x),
            ReduceOp::Max => self.i = if self.seen { self.i.max(x) } else { x },
            ReduceOp::Min => self.i = if self.seen { self.i.min(x) } else { x },
            ReduceOp::ArgMax | ReduceOp::ArgMin => {
                let better = if self.op == ReduceOp::ArgMax { x > self.i } else { x < self.i };
                if !self.seen || better {
                    self.i = x;
                    self.at = k;
                }
            }
        }
        self.seen = true;
    }

    fn int_result(&self) -> i64 {
        if self.op.is_arg() {
            self.at as i64
        } else {
            self.i
        }
    }
}

/// A bmm operand's layout as the GEMM routine's strided operand, where its strides are not
/// negative (`None`: the caller stores it contiguously first).
pub(super) fn operand(layout: &Layout) -> Option<StridedOperand<usize>> {
    let nd = layout.shape.len();
    let nonneg = |s: isize| usize::try_from(s).ok();
    Some(StridedOperand {
        buffer: BufferId(0),
        offset: usize::try_from(layout.offset).ok()?,
        batch_strides: layout.strides[..nd - 2].iter().map(|&s| nonneg(s)).collect::<Option<_>>()?,
        row_stride: nonneg(layout.strides[nd - 2])?,
        col_stride: nonneg(layout.strides[nd - 1])?,
    })
}

/// `a @ b` per batch into a new value of `shape` (`[*batch, m, n]`): operands of `dtype`, the
/// result of `out` (`dtype`, or f32 for a half-type product a bias add rounds).
pub(super) fn bmm(
    (a, a_data): (StridedOperand<usize>, &HostData),
    (b, b_data): (StridedOperand<usize>, &HostData),
    shape: &[usize],
    k: usize,
    (dtype, out_dtype): (DType, DType),
) -> Result<HostData> {
    let nd = shape.len();
    let spec = BmmSpec {
        a,
        b,
        batch: shape[..nd - 2].to_vec(),
        m: shape[nd - 2],
        n: shape[nd - 1],
        k,
        bias: None,
        activation: None,
        activation_grad: None,
    };
    let mut out = HostData::for_output(out_dtype, shape.iter().product())?;
    let len = out.byte_len();
    // SAFETY: the pointer addresses the `len` bytes of `out`'s elements, borrowed once here.
    let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr(), len) };
    bmm_bytes_to(&spec, dtype, out_dtype, a_data.as_bytes(), b_data.as_bytes(), &[], bytes)?;
    Ok(out)
}
