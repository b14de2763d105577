//! Views as index maps: each view op turns an index into its output into an index into its
//! operand, so a chain of views folds into one symbolic index expression of the base buffer.

use super::Lowerer;
use coil_ir::graph::reshape_groups;
use coil_ir::sym::Expr;
use coil_ir::{NodeId, Op};

impl Lowerer<'_> {
    /// Follows unrealized views from `n` at `idx` down to the node that holds the data, and
    /// the index into it.
    pub(crate) fn resolve(&self, mut n: NodeId, idx: &[Expr]) -> (NodeId, Vec<Expr>) {
        let mut idx = idx.to_vec();
        while self.buf[n.0].is_none() && self.g.node(n).op.is_view() {
            (n, idx) = self.view_step(n, &idx);
        }
        (n, idx)
    }

    /// The node behind `n`'s unrealized views.
    pub(crate) fn view_base(&self, mut n: NodeId) -> NodeId {
        while self.buf[n.0].is_none() && self.g.node(n).op.is_view() {
            n = self.g.node(n).inputs[0];
        }
        n
    }

    /// One view: the operand and the index into it that `idx` (into the view) reads.
    pub(crate) fn view_step(&self, n: NodeId, idx: &[Expr]) -> (NodeId, Vec<Expr>) {
        let node = self.g.node(n);
        let x = node.inputs[0];
        let xs = self.shape(x);
        let out = match &node.op {
            Op::Permute { perm } => {
                let mut v = vec![Expr::int(0); idx.len()];
                for (d, &p) in perm.iter().enumerate() {
                    v[p] = idx[d];
                }
                v
            }
            Op::Expand { shape } => {
                let lead = shape.len() - xs.len();
                (0..xs.len()).map(|i| if xs[i] == Expr::int(1) { Expr::int(0) } else { idx[lead + i] }).collect()
            }
            Op::Slice { dim, step, .. } => {
                let mut v = idx.to_vec();
                v[*dim] = self.attrs(n)[0] + idx[*dim] * *step;
                v
            }
            Op::Reshape { .. } => reshape_index(xs, self.shape(n), &self.g.meta(x).shape, &node.meta.shape, idx),
            op => unreachable!("{op} is not a view"),
        };
        (x, out)
    }
}

/// The index into a tensor of shape `from` that its reshape to `to` reads at `idx`. The
/// shapes are expressions (of the size symbols, if any); `from_n` and `to_n` are the same
/// shapes as numbers at some binding, which decide how dims group.
///
/// Dims are matched in groups of equal products (size-1 dims aside, their index is 0), and
/// only within a group is the index linearized and delinearized: a split or merged dim then
/// reads `x0 // 4` and `x0 % 4`, never a `//`/`%` of the whole flat index that the
/// simplifier could not see through.
pub(crate) fn reshape_index(from: &[Expr], to: &[Expr], from_n: &[usize], to_n: &[usize], idx: &[Expr]) -> Vec<Expr> {
    let mut out = vec![Expr::int(0); from.len()];
    if from_n.contains(&0) {
        return out;
    }
    for (ins, outs) in reshape_groups(from_n, to_n) {
        let mut linear = Expr::int(0);
        for &d in &outs {
            linear = linear * to[d] + idx[d];
        }
        // Successive divisions, innermost first: each one simplifies on its own.
        for (k, &d) in ins.iter().enumerate().rev() {
            out[d] = if k == 0 { linear } else { linear.modulo(from[d]) };
            linear = linear.floor_div(from[d]);
        }
    }
    out
}
