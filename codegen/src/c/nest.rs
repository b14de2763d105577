//! Loop nests: `xindex` split as `xouter * period + xinner`.
//!
//! A pointwise kernel over `[rows, n]` reading an `[n]` operand (a bias row) indexes it
//! `xindex % n`; one over `[rows, n]` reading a `[rows]` operand, `xindex / n`. In one flat loop
//! those are gathers (or, for 16-bit loads, which have no gather, a scalar loop). With `xindex`
//! split at the period `n`, `xindex % n` is `xinner` (a contiguous load in the inner vector
//! loop) and `xindex / n` is `xouter` (invariant in it). The split is taken when every index of
//! the kernel becomes affine in `xinner` (no `/`, `%`, `min` or `max` of it left), trying the
//! periods of the kernel's `xindex / C` and `xindex % C` from the largest; constant inner loops
//! shorter than [`MIN_PERIOD`] are not worth their set-up. A symbolic period (a kernel compiled
//! for dynamic sizes, `xindex % s1`) always is: without the split each element pays 64-bit
//! divisions, which do not vectorize.
//!
//! The same split serves reductions down the columns of a tensor with dims on both sides of
//! the reduced one (`x.sum(1)` of `[a, r, n]`, or the chunks of a split column reduction,
//! `coil_passes::split_reductions`: `[S, n]` partials of chunks of rows): there `xindex / n`
//! picks the plane or chunk and `xindex % n` the column, and with `xindex` split the columns
//! are contiguous in `xinner`, so the column form (`super::column`) applies within each
//! `xouter`.

use coil_ir::kernel::{flat_stmts, KernelKind, TileKernel, TileOp, TileStmt};
use coil_ir::sym::{Expr, ExprKind};

/// The shortest inner loop worth a nest.
pub const MIN_PERIOD: i64 = 32;

/// A kernel's split of `xindex`.
pub(super) struct Nest {
    /// The inner loop's length: a constant, or a size known only at run time (at least 1).
    pub period: Expr,
    xindex: Expr,
    xouter: Expr,
    xinner: Expr,
}

/// Every index expression of a kernel's statements.
fn exprs(k: &TileKernel) -> Vec<Expr> {
    let mut out = Vec::new();
    for s in flat_stmts(&k.body) {
        match s {
            TileStmt::Store { index, .. } => out.push(*index),
            TileStmt::Let { op, .. } => match op {
                TileOp::Load { index, .. } | TileOp::MaskedLoad { index, .. } | TileOp::Index(index) => {
                    out.push(*index)
                }
                TileOp::IndirectLoad { index, stride, bound, .. } => out.extend([*index, *stride, *bound]),
                TileOp::Rand { counter, .. } => out.push(*counter),
                _ => {}
            },
            _ => {}
        }
    }
    out
}

/// Calls `f` on `e` and every subexpression.
fn walk(e: Expr, f: &mut impl FnMut(Expr)) {
    f(e);
    match &*e.kind() {
        ExprKind::Add { terms, .. } => terms.iter().for_each(|&(t, _)| walk(t, f)),
        ExprKind::Mul { factors, .. } => factors.iter().for_each(|&x| walk(x, f)),
        ExprKind::FloorDiv(a, b) | ExprKind::Mod(a, b) | ExprKind::Min(a, b) | ExprKind::Max(a, b) => {
            walk(*a, f);
            walk(*b, f)
        }
        ExprKind::Const(_) | ExprKind::Symbol(_) => {}
    }
}

impl Nest {
    /// The nest of a pointwise kernel, when one applies (see the module doc).
    pub fn of_pointwise(k: &TileKernel) -> Option<Nest> {
        if k.kind != KernelKind::Pointwise {
            return None;
        }
        Nest::find(k)
    }

    /// A split of `xindex` under which every index of `k` (of any kind) is affine in `xinner`,
    /// when one exists: the largest period that gives one.
    pub fn find(k: &TileKernel) -> Option<Nest> {
        let xindex = coil_ir::kernel::xindex(&k.xnumel);
        let exprs = exprs(k);
        let mut periods: Vec<Expr> = Vec::new();
        for &e in &exprs {
            walk(e, &mut |s| {
                if let ExprKind::FloorDiv(a, b) | ExprKind::Mod(a, b) = *s.kind() {
                    // A symbolic period is at least 2 (sizes 0 and 1 specialize); its loops are
                    // taken whatever its length, as each saves a 64-bit division per element.
                    let worth = b.const_value().map_or(b.is_known_positive(), |c| c >= MIN_PERIOD);
                    if a == xindex && worth && !periods.contains(&b) {
                        periods.push(b)
                    }
                }
            });
        }
        // Largest first, by the facts' lower bounds (a constant's value).
        periods.sort_by_key(|p| std::cmp::Reverse(p.bounds().0));
        periods.into_iter().map(|period| Nest::new(xindex, period)).find(|n| exprs.iter().all(|&e| n.affine(e)))
    }

    fn new(xindex: Expr, period: Expr) -> Nest {
        let xinner = Expr::index_upto("xinner", period);
        Nest { period, xindex, xouter: Expr::symbol("xouter", Some(0), None), xinner }
    }

    /// The inner loop's variable.
    pub fn xinner(&self) -> Expr {
        self.xinner
    }

    /// `e` with `xindex` as `xouter * period + xinner`, and its `/ period`, `% period` as
    /// `xouter`, `xinner`.
    pub fn rewrite(&self, e: Expr) -> Expr {
        let whole = |a: Expr, b: Expr| a == self.xindex && b == self.period;
        match &*e.kind() {
            ExprKind::Const(_) => e,
            ExprKind::Symbol(_) if e == self.xindex => self.xouter * self.period + self.xinner,
            ExprKind::Symbol(_) => e,
            ExprKind::Add { terms, constant } => {
                terms.iter().fold(Expr::int(*constant), |sum, &(t, c)| sum + self.rewrite(t) * c)
            }
            ExprKind::Mul { coeff, factors } => factors.iter().fold(Expr::int(*coeff), |p, &x| p * self.rewrite(x)),
            ExprKind::FloorDiv(a, b) if whole(*a, *b) => self.xouter,
            ExprKind::Mod(a, b) if whole(*a, *b) => self.xinner,
            ExprKind::FloorDiv(a, b) => self.rewrite(*a).floor_div(self.rewrite(*b)),
            ExprKind::Mod(a, b) => self.rewrite(*a).modulo(self.rewrite(*b)),
            ExprKind::Min(a, b) => self.rewrite(*a).min(self.rewrite(*b)),
            ExprKind::Max(a, b) => self.rewrite(*a).max(self.rewrite(*b)),
        }
    }

    /// Whether `e` rewritten is affine in `xinner`: `xinner` under no `/`, `%`, `min`, `max`.
    fn affine(&self, e: Expr) -> bool {
        let mut ok = true;
        walk(self.rewrite(e), &mut |s| {
            if let ExprKind::FloorDiv(a, b) | ExprKind::Mod(a, b) | ExprKind::Min(a, b) | ExprKind::Max(a, b) =
                *s.kind()
            {
                let mut inner = false;
                walk(a, &mut |t| inner |= t == self.xinner);
                walk(b, &mut |t| inner |= t == self.xinner);
                ok &= !inner;
            }
        });
        ok
    }
}
