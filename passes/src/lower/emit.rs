//! Emitting a graph node's value at a symbolic index into a body: loads of realized buffers,
//! inlined pointwise math, leaves, and the data-movement ops (pad, cat, gather, index_select).
//!
//! Pad and cat read their operands only where a mask holds. A realized operand is read with a
//! `MaskedLoad` directly; an inlined one is emitted *under* the mask (each of its loads becomes
//! masked, so no lane reads outside a buffer) and selected with a `Where`.

use super::{flat, offset_error, Emit, Lowerer};
use crate::decompose::{scalar_as, zero};
use coil_ir::loops::{BufferId, ScalarOp, ValueId};
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, NodeId, Op, ReduceOp, Result, Scalar, UnaryOp};

impl Lowerer<'_> {
    /// `n`'s value at `idx`: a load when `n` has a buffer, else its computation, inlined.
    /// Under `mask`, loads are masked (their other value, 0, is never selected).
    pub(crate) fn emit(&mut self, e: &mut Emit, n: NodeId, idx: &[Expr], mask: Option<ValueId>) -> Result<ValueId> {
        if let Some(b) = self.buf[n.0] {
            return Ok(self.load(e, b, flat(idx, self.shape(n)), mask));
        }
        let key = (n, idx.to_vec(), mask);
        if let Some(&v) = e.memo.get(&key) {
            return Ok(v);
        }
        let v = self.compute(e, n, idx, mask)?;
        e.memo.insert(key, v);
        Ok(v)
    }

    fn load(&self, e: &mut Emit, buffer: BufferId, index: Expr, mask: Option<ValueId>) -> ValueId {
        let dtype = self.prog.buffer(buffer).meta.dtype;
        let op = match mask {
            None => ScalarOp::Load { buffer, index },
            Some(mask) => ScalarOp::MaskedLoad { buffer, index, mask, other: zero(dtype) },
        };
        e.push(op, dtype)
    }

    /// `n`'s own computation at `idx` (never a load of `n`'s buffer).
    pub(crate) fn compute(&mut self, e: &mut Emit, n: NodeId, idx: &[Expr], mask: Option<ValueId>) -> Result<ValueId> {
        let node = self.g.node(n);
        let dtype = node.meta.dtype;
        e.folded.push(n);
        if self.degenerate(n) {
            let value = match &node.op {
                _ if node.meta.numel() == 0 => Scalar::Int(0),
                Op::Reduce { op, dims, .. } if dims.is_empty() && !op.is_arg() => {
                    // A reduction over no dims: the operand, in the result type.
                    let v = self.emit(e, node.inputs[0], idx, mask)?;
                    return Ok(cast(e, v, dtype));
                }
                Op::Reduce { op: ReduceOp::Prod, .. } => Scalar::Int(1),
                _ => Scalar::Int(0), // sums over empty dims, arg reductions of 0-d tensors, k = 0
            };
            return Ok(e.push(ScalarOp::Constant(scalar_as(value, dtype)), dtype));
        }
        if mask.is_some() && unsafe_under_mask(&node.op, dtype) {
            // Masked lanes read 0s: an index value would be garbage, an integer division could
            // trap. Compute it in its own buffer and read that through the mask instead.
            let b = self.realize(n)?;
            return Ok(self.load(e, b, flat(idx, self.shape(n)), mask));
        }
        let arg = |i: usize| node.inputs[i];
        Ok(match &node.op {
            // A value that depends on the sizes (the count of a mean over a dynamic dim).
            Op::Full(_) if self.attrs(n).first().is_some_and(|a| a.const_value().is_none()) => {
                let i = e.push(ScalarOp::Index(self.attrs(n)[0]), DType::I64);
                cast(e, i, dtype)
            }
            Op::Full(v) => e.push(ScalarOp::Constant(scalar_as(*v, dtype)), dtype),
            Op::Iota { dim } => {
                let i = e.push(ScalarOp::Index(idx.get(*dim).copied().unwrap_or(Expr::int(0))), DType::I64);
                cast(e, i, dtype)
            }
            Op::Rand { dist, stream, offset } => {
                i64::try_from(*offset).map_err(|_| offset_error(*offset))?;
                let counter = self.attrs(n)[0] + flat(idx, self.shape(n));
                e.push(ScalarOp::Rand { dist: *dist, stream: *stream, counter }, dtype)
            }
            Op::Unary(u) => {
                let a = self.emit(e, arg(0), idx, mask)?;
                unary(e, *u, a, dtype)
            }
            Op::Binary(b) => {
                let (mut x, mut y) = (self.emit(e, arg(0), idx, mask)?, self.emit(e, arg(1), idx, mask)?);
                if !b.returns_bool() {
                    (x, y) = (cast(e, x, dtype), cast(e, y, dtype));
                }
                e.push(ScalarOp::Binary(*b, x, y), dtype)
            }
            Op::Where => {
                let c = self.emit(e, arg(0), idx, mask)?;
                let (x, y) = (self.emit(e, arg(1), idx, mask)?, self.emit(e, arg(2), idx, mask)?);
                let (x, y) = (cast(e, x, dtype), cast(e, y, dtype));
                e.push(ScalarOp::Where(c, x, y), dtype)
            }
            Op::Cast(t) => {
                let a = self.emit(e, arg(0), idx, mask)?;
                cast(e, a, *t)
            }
            op if op.is_view() => {
                let (x, xi) = self.view_step(n, idx);
                self.emit(e, x, &xi, mask)?
            }
            Op::Pad { pads, value } => {
                let xs = self.shape(arg(0));
                let widths = self.attrs(n);
                let mut conds = Vec::new();
                let mut xi = idx.to_vec();
                for (d, &(before, after)) in pads.iter().enumerate() {
                    let b = widths[2 * d];
                    xi[d] = idx[d] - b;
                    if before > 0 {
                        conds.push(compare(e, BinaryOp::Ge, idx[d], b));
                    }
                    if after > 0 {
                        conds.push(compare(e, BinaryOp::Lt, idx[d], b + xs[d]));
                    }
                }
                let m = conds.into_iter().fold(mask, |m, c| Some(and(e, m, c)));
                self.masked(e, arg(0), &xi, m, scalar_as(*value, dtype))?
            }
            Op::Cat { dim } => self.cat(e, n, *dim, idx, mask)?,
            Op::Gather { dim } => {
                let v = self.emit(e, arg(1), idx, None)?;
                let mut xi = idx.to_vec();
                self.indirect(e, arg(0), &mut xi, *dim, v)?
            }
            Op::IndexSelect { dim } => {
                let index_idx: Vec<Expr> = match self.meta(arg(1)).shape.len() {
                    0 => vec![],
                    _ => vec![idx.get(*dim).copied().unwrap_or(Expr::int(0))],
                };
                let v = self.emit(e, arg(1), &index_idx, None)?;
                let mut xi = idx.to_vec();
                self.indirect(e, arg(0), &mut xi, *dim, v)?
            }
            Op::Reduce { .. } | Op::Bmm | Op::Cumsum { .. } | Op::Argsort { .. } | Op::Scatter { .. } => {
                // `prepare` realizes these before any reader is built; kept total regardless.
                let b = self.realize(n)?;
                self.load(e, b, flat(idx, self.shape(n)), mask)
            }
            op if op.is_template() => {
                let b = self.realize(n)?;
                self.load(e, b, flat(idx, self.shape(n)), mask)
            }
            op => unreachable!("{op} in a primitive graph"),
        })
    }

    /// `x` at `idx` where `mask` holds, else `other`.
    fn masked(
        &mut self,
        e: &mut Emit,
        x: NodeId,
        idx: &[Expr],
        mask: Option<ValueId>,
        other: Scalar,
    ) -> Result<ValueId> {
        let Some(m) = mask else { return self.emit(e, x, idx, None) };
        let dtype = self.meta(x).dtype;
        let (base, bidx) = self.resolve(x, idx);
        if let Some(buffer) = self.buf[base.0] {
            let index = flat(&bidx, self.shape(base));
            return Ok(e.push(ScalarOp::MaskedLoad { buffer, index, mask: m, other }, dtype));
        }
        let v = self.emit(e, x, idx, Some(m))?;
        let o = e.push(ScalarOp::Constant(other), dtype);
        Ok(e.push(ScalarOp::Where(m, v, o), dtype))
    }

    /// `cat` along `dim`: each part read under "the index lies in its range", the parts chained
    /// by `Where`s (the last part is the fallback of the chain).
    fn cat(&mut self, e: &mut Emit, n: NodeId, dim: usize, idx: &[Expr], mask: Option<ValueId>) -> Result<ValueId> {
        let node = self.g.node(n);
        let mut parts = Vec::new();
        let mut start = Expr::int(0);
        for &x in &node.inputs {
            let len = self.shape(x)[dim];
            if self.meta(x).shape[dim] > 0 {
                parts.push((x, start, len));
            }
            start = start + len;
        }
        let last = parts.len() - 1;
        let mut values = Vec::new();
        for (k, &(x, start, len)) in parts.iter().enumerate() {
            let mut xi = idx.to_vec();
            xi[dim] = idx[dim] - start;
            let mut m = mask;
            if k > 0 {
                let c = compare(e, BinaryOp::Ge, idx[dim], start);
                m = Some(and(e, m, c));
            }
            if k < last {
                let c = compare(e, BinaryOp::Lt, idx[dim], start + len);
                m = Some(and(e, m, c));
            }
            values.push((m, self.masked(e, x, &xi, m, zero(node.meta.dtype))?));
        }
        let mut acc = values[last].1;
        for &(m, v) in values[..last].iter().rev() {
            acc = e.push(ScalarOp::Where(m.expect("every part but the last is masked"), v, acc), node.meta.dtype);
        }
        Ok(acc)
    }

    /// A data-dependent read of `x` (gather, index_select): `xi` is the index into `x` with
    /// `xi[dim]` about to be replaced by the value `v`. The view chain of `x` is folded when it
    /// is affine in that dim; otherwise `x` is copied into a contiguous buffer first.
    fn indirect(&mut self, e: &mut Emit, x: NodeId, xi: &mut [Expr], dim: usize, v: ValueId) -> Result<ValueId> {
        // A gather of a cast or unary op is that op of a gather: only the picked elements are
        // converted (a gather from `logits.to(f32)` reads bf16 logits, no f32 copy of them).
        let node = self.g.node(x);
        if self.buf[x.0].is_none() && !self.degenerate(x) {
            match node.op {
                Op::Cast(t) => {
                    let a = self.indirect(e, node.inputs[0], xi, dim, v)?;
                    e.folded.push(x);
                    return Ok(cast(e, a, t));
                }
                Op::Unary(u) => {
                    let a = self.indirect(e, node.inputs[0], xi, dim, v)?;
                    e.folded.push(x);
                    return Ok(unary(e, u, a, node.meta.dtype));
                }
                _ => {}
            }
        }
        let xm = self.meta(x);
        let (dtype, rank) = (xm.dtype, xm.shape.len());
        // A 0-d operand behaves as a 1-element 1-D one (PyTorch treats its size along dim 0 as 1).
        let size = if rank == 0 { Expr::int(1) } else { self.shape(x)[dim] };
        let varies = rank > 0 && xm.shape[dim] >= 2;
        let t = if varies { Expr::index_upto("t", size) } else { Expr::int(0) };
        if rank > 0 {
            xi[dim] = t;
        }
        let (base, bidx) = self.resolve(x, xi);
        let access = |l: &Self, base: NodeId, bidx: &[Expr]| {
            let f = flat(bidx, l.shape(base));
            let at = |k: i64| f.substitute_with(|s| (s == t).then(|| Expr::int(k)));
            let (index, stride) = if varies { (at(0), at(1) - at(0)) } else { (f, Expr::int(0)) };
            (index + stride * t == f).then_some((index, stride))
        };
        let (buffer, (index, stride)) = match access(self, base, &bidx) {
            Some(found) if !self.degenerate(base) => (self.realize(base)?, found),
            _ => {
                let b = self.realize(x)?;
                let contiguous: Vec<Expr> = xi.to_vec();
                (b, access(self, x, &contiguous).expect("a contiguous buffer is affine in each dim"))
            }
        };
        Ok(e.push(ScalarOp::IndirectLoad { buffer, index, indirect: v, stride, bound: size }, dtype))
    }
}

/// Ops that must not run on the made-up values of masked lanes.
fn unsafe_under_mask(op: &Op, dtype: DType) -> bool {
    let int_div =
        matches!(op, Op::Binary(BinaryOp::FloorDiv | BinaryOp::TruncDiv | BinaryOp::Remainder | BinaryOp::Pow));
    matches!(op, Op::Gather { .. } | Op::IndexSelect { .. }) || (int_div && !dtype.is_float())
}

/// `u(a)` with result `dtype`; float-only ops on ints compute in the result type (the
/// conversion made explicit).
fn unary(e: &mut Emit, u: UnaryOp, a: ValueId, dtype: DType) -> ValueId {
    let a = if u.returns_bool() { a } else { cast(e, a, dtype) };
    e.push(ScalarOp::Unary(u, a), dtype)
}

/// `v` converted to `dtype` (no op when it already has it).
pub(super) fn cast(e: &mut Emit, v: ValueId, dtype: DType) -> ValueId {
    if e.dtype(v) == dtype {
        v
    } else {
        e.push(ScalarOp::Cast(v), dtype)
    }
}

/// `index <op> bound` as a bool value.
fn compare(e: &mut Emit, op: BinaryOp, index: Expr, bound: Expr) -> ValueId {
    let i = e.push(ScalarOp::Index(index), DType::I64);
    let b = match bound.const_value() {
        Some(c) => e.push(ScalarOp::Constant(Scalar::Int(c)), DType::I64),
        None => e.push(ScalarOp::Index(bound), DType::I64),
    };
    e.push(ScalarOp::Binary(op, i, b), DType::Bool)
}

/// `mask && c` (just `c` without an outer mask).
fn and(e: &mut Emit, mask: Option<ValueId>, c: ValueId) -> ValueId {
    match mask {
        None => c,
        Some(m) => e.push(ScalarOp::Binary(BinaryOp::LogicalAnd, m, c), DType::Bool),
    }
}
