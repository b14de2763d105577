//! Reduction loops that stop where their row does: a split reduction's chunks
//! (`coil_passes::split_reductions`) overhang the row when the chunk count does not divide it;
//! each position `p = rindex + base` then reads `x[min(p, n - 1)]` and folds
//! `p < n ? x[..] : identity`. Folding the identity changes nothing, so such a loop can end at
//! `min(rnumel, n - base)` instead, where every position is inside the row: the load is a plain
//! contiguous load and the condition true. (The full sum of 13421773 floats took 8.6 ms on one
//! core with the masked form, 1.6 ms with the loop cut.)
//!
//! A loop is cut when it holds no store and every reduction it folds folds
//! `where(index(p) < n, value, identity)` with one such condition, `p` advancing by 1 with
//! `rindex`, `n` a constant or an expression of the sizes.

use super::{column, Emitter};
use coil_ir::kernel::{flat_stmts, TileOp, TileStmt, Var};
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, ReduceOp};
use indexmap::IndexMap;

/// A loop's cut.
#[derive(Clone)]
pub(super) struct Narrow {
    /// The position `p` (an expression of `rindex`).
    pub position: Expr,
    /// The condition `p < n` every fold tests.
    pub cond: Var,
    /// The loop's end, as C.
    pub end: String,
}

impl Emitter<'_> {
    /// The cut of a reduction loop over `stmts`, when one applies (see the module doc).
    pub(super) fn cut_of<'s>(&self, stmts: impl IntoIterator<Item = &'s TileStmt>) -> Option<Narrow> {
        let defs: IndexMap<Var, &TileOp> = flat_stmts(&self.k.body)
            .into_iter()
            .filter_map(|s| match s {
                TileStmt::Let { var, op, .. } => Some((*var, op)),
                _ => None,
            })
            .collect();
        let mut cond = None;
        for s in stmts {
            let (op, value) = match s {
                TileStmt::AccUpdate { op, value, .. } => (*op, *value),
                TileStmt::Reduce { op, source, .. } => (*op, *source),
                TileStmt::Let { .. } => continue,
                _ => return None,
            };
            let TileOp::Where(c, _, k) = defs.get(&value)? else { return None };
            let identity = match op {
                ReduceOp::Sum => 0.0,
                ReduceOp::Prod => 1.0,
                ReduceOp::Max if self.dtype(value).is_float() => f64::NEG_INFINITY,
                ReduceOp::Min if self.dtype(value).is_float() => f64::INFINITY,
                _ => return None,
            };
            if self.vars[k].constant.map(|v| v.as_f64()) != Some(identity) || cond.is_some_and(|x| x != *c) {
                return None;
            }
            cond = Some(*c);
        }
        let cond = cond?;
        if self.rnumel.const_value().is_some_and(|r| r < 1) {
            return None;
        }
        let TileOp::Binary(BinaryOp::Lt, i, n) = defs.get(&cond)? else { return None };
        let TileOp::Index(position) = defs.get(i)? else { return None };
        let (x, rindex) = (coil_ir::kernel::xindex(&self.k.xnumel), coil_ir::kernel::rindex(&self.rnumel));
        let n = match defs.get(n)? {
            TileOp::Constant(c) if !self.dtype(*n).is_float() => format!("{}", c.as_f64() as i64),
            TileOp::Index(e) if column::step(*e, rindex) == Some(0) && column::step(*e, x) == Some(0) => {
                format!("({})", self.c(*e))
            }
            _ => return None,
        };
        if column::step(*position, rindex) != Some(1) {
            return None;
        }
        let mut zero = IndexMap::new();
        zero.insert(rindex, Expr::int(0));
        let base = position.substitute(&zero);
        let end = format!("coil_max(0, coil_min({}, {n} - ({})))", self.rnumel.to_c(), self.c(base));
        Some(Narrow { position: *position, cond, end })
    }
}
