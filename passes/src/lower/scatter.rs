//! Scatters along one dim at consecutive run-time positions (a KV cache written at
//! `pos..pos + T`, XLA's `dynamic_update_slice`) become pointwise nodes that store through a
//! [`ScatterStore`], instead of fallback calls.
//!
//! `t = scatter(u, dim, index, src)` qualifies when its positions along `dim` are
//! `x_dim + p` for a value `p` the same for every element (`broadcast(iota(T) + pos)`, with
//! `pos` a 0-d tensor read when the kernel runs) and it overwrites (no `reduce`). Then the
//! elements fill a window of `T` consecutive positions from `p`, an affine store into the
//! output once `p` is known: the node iterates over the index's elements, its body computes
//! `src` there (its pointwise producers fuse into it: a rotary embedding's keys are stored
//! where they are computed) and `p`, the index's value at position 0 of `dim` (the same
//! value, computed once per kernel). The window is checked as a whole (`0 <= p` and
//! `p + T <= size`): out of range nothing is written and the error names the first position
//! out of range, as the fallback names the first bad index. Other scatters stay fallback
//! calls.

use super::{flat, strides, vars, Emit, Lowerer};
use coil_ir::loops::{range_var, Body, LoopKind, ScalarOp, ScatterStore, ValueId};
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, NodeId, Op, Result};

impl Lowerer<'_> {
    /// The pointwise node computing scatter `n` and the graph nodes folded into it, when its
    /// positions are consecutive from a value the same for every element (see the module
    /// docs); `None` when it stays a fallback call.
    pub(super) fn window_scatter(&mut self, n: NodeId) -> Result<Option<(LoopKind, Vec<NodeId>)>> {
        let node = self.g.node(n);
        let Op::Scatter { dim, reduce: None } = node.op else { return Ok(None) };
        let [x, index, src] = node.inputs[..] else { return Ok(None) };
        // (An empty base has no elements to write, but every index to refuse: the fallback does.)
        if self.meta(x).rank() == 0
            || self.meta(x).numel() == 0
            || self.meta(index).numel() == 0
            || !self.meta(index).dtype.is_integral()
        {
            return Ok(None);
        }
        let ranges = self.shape(index).to_vec();
        let idx = vars(&ranges, range_var);
        // The positions, to see their form (emitted apart: the node computes only the offset).
        let mut positions = Emit::new();
        let position = self.emit(&mut positions, index, &idx, None)?;
        if !shifted(&positions.body, position, idx[dim], &idx) {
            return Ok(None);
        }
        let mut e = Emit::new();
        e.folded.push(n);
        // `x_dim + p` at `x_dim = 0`: the window's first position, free of every index variable.
        let mut first = idx.clone();
        first[dim] = Expr::int(0);
        let offset = self.emit(&mut e, index, &first, None)?;
        debug_assert!(uniform(&e.body, offset, &idx), "the offset of a window scatter varies");
        let value = self.emit(&mut e, src, &idx, None)?;
        e.body.result = super::emit::cast(&mut e, value, node.meta.dtype);
        let base = self.realize(x)?;
        let xs = self.shape(x);
        let scatter = ScatterStore {
            base,
            index: flat(&idx, xs),
            offset,
            stride: strides(xs)[dim],
            size: ranges[dim],
            bound: xs[dim],
        };
        Ok(Some((LoopKind::Pointwise { ranges, body: e.body, scatter: Some(scatter) }, e.folded)))
    }
}

/// Whether integer value `v` of `body` is `var + p` with `p` the same for every element (free
/// of the index variables `vars`); `var` is the constant 0 for a dim of one element, where any
/// such `p` qualifies.
fn shifted(body: &Body, v: ValueId, var: Expr, vars: &[Expr]) -> bool {
    let value = body.value(v);
    if !matches!(value.dtype, DType::I64 | DType::I32) {
        return false;
    }
    match &value.op {
        ScalarOp::Index(e) => free_of(*e - var, vars),
        ScalarOp::Binary(BinaryOp::Add, a, b) => {
            (shifted(body, *a, var, vars) && uniform(body, *b, vars))
                || (uniform(body, *a, vars) && shifted(body, *b, var, vars))
        }
        ScalarOp::Binary(BinaryOp::Sub, a, b) => shifted(body, *a, var, vars) && uniform(body, *b, vars),
        ScalarOp::Cast(a) => shifted(body, *a, var, vars),
        _ => var.const_value() == Some(0) && uniform(body, v, vars),
    }
}

/// Whether value `v` of `body` is the same for every element: it depends on no index
/// variable of `vars` (and draws no random number).
fn uniform(body: &Body, v: ValueId, vars: &[Expr]) -> bool {
    match &body.value(v).op {
        ScalarOp::Load { index, .. } | ScalarOp::Index(index) => free_of(*index, vars),
        ScalarOp::IndirectLoad { index, indirect, stride, .. } => {
            free_of(*index, vars) && free_of(*stride, vars) && uniform(body, *indirect, vars)
        }
        ScalarOp::MaskedLoad { .. } | ScalarOp::Rand { .. } => false,
        ScalarOp::Constant(_) => true,
        ScalarOp::Unary(_, a) | ScalarOp::Cast(a) => uniform(body, *a, vars),
        ScalarOp::Binary(_, a, b) => uniform(body, *a, vars) && uniform(body, *b, vars),
        ScalarOp::Where(c, a, b) => [c, a, b].into_iter().all(|x| uniform(body, *x, vars)),
    }
}

/// Whether `e` mentions none of `vars`.
fn free_of(e: Expr, vars: &[Expr]) -> bool {
    e.free_symbols().iter().all(|s| !vars.contains(s))
}
