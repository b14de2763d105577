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
use coil_ir::loops::{range_var, Body, BufferId, LoopKind, LoopProgram, ScalarOp, ScatterStore, ValueId};
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

/// Whether the values of `buffer` repeat along its dims from `from` on: its producer is a
/// pointwise node whose stored value depends on none of those dims' index variables (and
/// draws no random number). An expanded index is: `index_select`'s and an embedding's
/// gradient scatter rows by an `[N, 1]` index expanded to `[N, C]`, which the GPU's sorted
/// scatter then sorts once per row, not once per element. `false` where it is not shown (an
/// input, an extern call's output, a reduction, a scatter store).
///
/// ```
/// use coil_ir::{DType, Graph, Op, ReduceOp, TensorMeta};
/// let mut g = Graph::new();
/// let table = g.input(TensorMeta::new(vec![10, 4], DType::F32));
/// let ids = g.input(TensorMeta::new(vec![6, 1], DType::I64));
/// let rows = g.input(TensorMeta::new(vec![6, 4], DType::F32));
/// let index = g.push(Op::Expand { shape: vec![6, 4] }, &[ids], None)?;
/// let y = g.push(Op::Scatter { dim: 0, reduce: Some(ReduceOp::Sum) }, &[table, index, rows], None)?;
/// g.outputs.push(y);
/// let p = coil_passes::lower(&g)?;
/// let coil_ir::loops::LoopKind::Extern { inputs, .. } = &p.nodes.last().unwrap().kind else { panic!() };
/// assert!(coil_passes::lower::repeats_along(&p, inputs[1], 1));
/// assert!(!coil_passes::lower::repeats_along(&p, inputs[2], 1)); // an input
/// # Ok::<(), coil_ir::Error>(())
/// ```
pub fn repeats_along(p: &LoopProgram, buffer: BufferId, from: usize) -> bool {
    let Some(node) = p.nodes.iter().find(|n| n.output == buffer) else { return false };
    let LoopKind::Pointwise { ranges, body, scatter: None } = &node.kind else { return false };
    let idx = vars(ranges, range_var);
    from >= idx.len() || uniform(body, body.result, &idx[from..])
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

#[cfg(test)]
mod tests {
    use super::repeats_along;
    use coil_ir::loops::{BufferId, LoopKind, LoopProgram};
    use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, TensorMeta};

    /// The index buffer of `scatter_add(table, 0, index, rows)` for an `[6, 4]` index built by
    /// `make` from ids `[6, 1]`, lowered.
    fn index_of(make: impl Fn(&mut Graph, NodeId) -> NodeId) -> (LoopProgram, BufferId) {
        let mut g = Graph::new();
        let table = g.input(TensorMeta::new(vec![10, 4], DType::F32));
        let ids = g.input(TensorMeta::new(vec![6, 1], DType::I64));
        let rows = g.input(TensorMeta::new(vec![6, 4], DType::F32));
        let index = make(&mut g, ids);
        let y = g.push(Op::Scatter { dim: 0, reduce: Some(ReduceOp::Sum) }, &[table, index, rows], None).unwrap();
        g.outputs.push(y);
        let p = crate::lower(&g).unwrap();
        let LoopKind::Extern { inputs, .. } = &p.nodes.last().unwrap().kind else { panic!("{p}") };
        let index = inputs[1];
        (p, index)
    }

    #[test]
    fn an_expanded_index_repeats_along_its_rows_and_a_varying_one_does_not() {
        let expand = |g: &mut Graph, ids| g.push(Op::Expand { shape: vec![6, 4] }, &[ids], None).unwrap();
        let (p, index) = index_of(expand);
        assert!(repeats_along(&p, index, 1) && repeats_along(&p, index, 2), "{p}");
        assert!(!repeats_along(&p, index, 0), "the ids differ down the rows: {p}");
        // Plus an iota along the columns: each column its own place.
        let (p, index) = index_of(|g, ids| {
            let wide = expand(g, ids);
            let iota = g.leaf(Op::Iota { dim: 1 }, TensorMeta::new(vec![6, 4], DType::I64), None);
            g.push(Op::Binary(BinaryOp::Add), &[wide, iota], None).unwrap()
        });
        assert!(!repeats_along(&p, index, 1), "{p}");
    }
}
