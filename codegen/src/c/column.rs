//! Column reductions: a reduction whose rows run down the columns of its operands (`x.sum(0)`
//! of a row-major `[r, n]`: element `rindex` of row `xindex` at `n * rindex + xindex`).
//!
//! Walking a row there reads one element per cache line, `n * 4` bytes apart (and a vector
//! loop over `rindex` would gather). Instead a block of rows (columns of the operand) is
//! reduced at once: for each `rindex`, an inner vector loop over the block's `xindex` values
//! reads contiguous memory into one accumulator per column, kept in arrays; then a vector loop
//! over the block finishes the reductions and stores them. (On the 2-core build machine,
//! `x.sum(0)` of `[410, 8192]` f32 went from 8.0 ms, a scalar loop per column, to about 1 ms.)
//!
//! Each step of the row loop folds [`ROW_UNROLL`] rows into the accumulators copied into
//! locals, in the order of one row at a time (the same results), and a block is as wide as
//! [`ACC_BYTES`] of accumulators allow (up to a page of an f32 row): rows lie a page or more
//! apart, which the hardware prefetchers do not cross, so each visit to a page should read as
//! much of it as it can. (`x.sum(0)` of `[8192, 8192]` f32, hand-written C on the 2-core
//! build machine: 64 columns one row a step 44 GB/s, 1024 columns four rows a step 61.5, the
//! copy 81; either change alone was slower than neither.)
//!
//! A kernel takes this form when its reductions fit one `rindex` loop (a looped reduction's
//! `RLoop`s, when none reads another's result; a persistent reduction whose row needs one loop
//! and no arrays), only constants come before the loop, no statement may fail, there is no arg
//! reduction or online softmax, and no index in the loop is contiguous along `rindex` while at
//! least one is contiguous along `xindex`, or, where `xindex` itself is not (`xindex / n`
//! picks a plane or a split reduction's chunk, `xindex % n` the column), along `xinner` of the
//! kernel's nest (`super::nest`): the blocks then run within each `xouter`. (The first stage of
//! `x.sum(0)` of `[8192, 8192]` f32, split into 2 chunks of 4096 rows, walked each column at a
//! 32 KB stride without the nest: 220 ms on the 2-core build machine, 8 ms with it.)

use super::nest::Nest;
use super::{may_fail, Emitter, Piece};
use coil_ir::kernel::{flat_stmts, KernelKind, TileOp, TileStmt, Var};
use coil_ir::sym::Expr;
use coil_ir::{DType, ReduceOp};
use indexmap::IndexMap;

/// Bytes of accumulator arrays per block: a block's columns are as many as fit (a power of two,
/// [`MIN_BLOCK`] to [`MAX_BLOCK`], and no more than the kernel's columns rounded up to one), so
/// the arrays stay in L1 while each row's segment that a block reads is as long as they allow.
pub const ACC_BYTES: i64 = 8 << 10;

/// The fewest columns of a block.
pub const MIN_BLOCK: i64 = 64;

/// The most columns of a block (4 KiB of an f32 row: a page).
pub const MAX_BLOCK: i64 = 1024;

/// Rows folded per step of the unrolled row loop, into accumulators held in locals.
pub const ROW_UNROLL: i64 = 4;

/// A kernel's statements arranged for the column form.
pub(super) struct Column<'s> {
    /// Constants, before everything.
    pre: Vec<&'s TileStmt>,
    /// The accumulators: `(acc, op, result dtype)`.
    accs: Vec<(Var, ReduceOp, DType)>,
    /// The loop's statements.
    body: Vec<&'s TileStmt>,
    /// After the loop: the finished reductions `(var, op, dtype, acc)`, then the rest.
    finish: Vec<(Var, ReduceOp, DType, Var)>,
    post: Vec<&'s TileStmt>,
    /// The split of `xindex` whose `xinner` runs along the columns, when `xindex` itself does
    /// not (`super::nest`).
    nest: Option<Nest>,
}

/// How an index moves when `s` does: the constant difference, if any.
pub(super) fn step(e: Expr, s: Expr) -> Option<i64> {
    let mut map = IndexMap::new();
    map.insert(s, s + 1);
    (e.substitute(&map) - e).const_value()
}

impl<'a> Emitter<'a> {
    /// The column form of this kernel, when it takes one (see the module doc).
    pub(super) fn column(&self) -> Option<Column<'a>> {
        let k = self.k;
        if may_fail(k.body.iter()) {
            return None;
        }
        let mut c = Column { pre: vec![], accs: vec![], body: vec![], finish: vec![], post: vec![], nest: None };
        let constant = |s: &TileStmt| matches!(s, TileStmt::Let { op: TileOp::Constant(_), .. });
        match k.kind {
            KernelKind::LoopedReduction => {
                // Every loop's statements go into one loop: none may read a finished
                // reduction, and only constants may come before the last loop.
                let last = k.body.iter().rposition(|s| matches!(s, TileStmt::RLoop(_)))?;
                for (i, s) in k.body.iter().enumerate() {
                    match s {
                        TileStmt::AccInit { acc, op, dtype } => c.accs.push((*acc, *op, *dtype)),
                        TileStmt::RLoop(body) => {
                            // a value two loops recompute (the same variable) is defined once
                            for s in body {
                                let seen =
                                    |v: &Var| c.body.iter().any(|t| matches!(t, TileStmt::Let { var, .. } if var == v));
                                if !matches!(s, TileStmt::Let { var, .. } if seen(var)) {
                                    c.body.push(s);
                                }
                            }
                        }
                        TileStmt::Reduce { var, op, dtype, source } => c.finish.push((*var, *op, *dtype, *source)),
                        s if constant(s) => c.pre.push(s),
                        TileStmt::Let { .. } | TileStmt::Store { .. } if i > last => c.post.push(s),
                        _ => return None,
                    }
                }
                let finished: Vec<Var> = c.finish.iter().map(|f| f.0).collect();
                if c.body.iter().any(|s| s.reads().iter().any(|v| finished.contains(v))) {
                    return None;
                }
            }
            KernelKind::PersistentReduction => {
                let pieces = self.pieces();
                let at = pieces.iter().position(|p| matches!(p, Piece::Loop(_)))?;
                for p in &pieces[..at] {
                    match p {
                        Piece::Scalar(s) if constant(s) => c.pre.push(s),
                        _ => return None,
                    }
                }
                let Piece::Loop(body) = &pieces[at] else { unreachable!() };
                for s in body {
                    if let TileStmt::Reduce { var, op, dtype, .. } = s {
                        c.accs.push((*var, *op, *dtype));
                        c.finish.push((*var, *op, *dtype, *var));
                    }
                }
                c.body = body.clone();
                for p in &pieces[at + 1..] {
                    match p {
                        Piece::Scalar(s) => c.post.push(s),
                        Piece::Loop(_) => return None,
                    }
                }
            }
            KernelKind::Pointwise | KernelKind::Extern => return None,
        }
        if c.accs.iter().any(|(_, op, _)| op.is_arg())
            || c.body.iter().any(|s| {
                !matches!(
                    s,
                    TileStmt::Let { .. }
                        | TileStmt::Store { .. }
                        | TileStmt::AccUpdate { .. }
                        | TileStmt::Reduce { .. }
                )
            })
        {
            return None;
        }
        if [k.xnumel, self.rnumel].iter().any(|e| e.const_value().is_some_and(|n| n < 1)) {
            return None; // empty: nothing to arrange
        }
        let x = coil_ir::kernel::xindex(&k.xnumel);
        if self.runs_down_columns(x, |e| e) {
            return Some(c);
        }
        // `xindex / n`, `xindex % n` (planes or chunks of columns): columns within each `xouter`
        let nest = Nest::find(k)?;
        self.runs_down_columns(nest.xinner(), |e| nest.rewrite(e)).then_some(Column { nest: Some(nest), ..c })
    }

    /// Whether the kernel's loads and stores, indexed through `rewrite`, run down columns: some
    /// index steps by 1 along `x` and not 0 along `rindex`, and none steps by 1 along `rindex`.
    fn runs_down_columns(&self, x: Expr, rewrite: impl Fn(Expr) -> Expr) -> bool {
        let r = coil_ir::kernel::rindex(&self.rnumel);
        let (mut along_x, mut along_r) = (false, false);
        for s in flat_stmts(&self.k.body) {
            let index = match s {
                TileStmt::Store { index, .. } => *index,
                TileStmt::Let { op: TileOp::Load { index, .. } | TileOp::MaskedLoad { index, .. }, .. } => *index,
                _ => continue,
            };
            let index = rewrite(index);
            along_x |= step(index, x) == Some(1) && step(index, r) != Some(0);
            along_r |= step(index, r) == Some(1);
        }
        along_x && !along_r
    }

    /// The kernel body in column form: blocks of columns (values of `xindex` in the call's
    /// range, or of `xinner` in each `xouter`'s part of it under a nest), their rows folded
    /// [`ROW_UNROLL`] at a time into accumulators held in locals, then one at a time.
    pub(super) fn column_body(&mut self, mut c: Column<'a>) {
        let arrays: usize = c.accs.iter().map(|&(acc, op, dtype)| self.acc_vars(acc, op, dtype).len()).sum();
        // a power of two, no wider than the columns a block can get when their count is known
        let b = (ACC_BYTES / 8 / arrays.max(1) as i64).clamp(MIN_BLOCK, MAX_BLOCK);
        let columns = c.nest.as_ref().map_or(self.k.xnumel, |n| n.period).const_value();
        let fits = columns.map_or(MAX_BLOCK, |n| (n.max(MIN_BLOCK) as u64).next_power_of_two() as i64);
        let b = (1 << b.ilog2()).min(fits);
        self.column_block = b;
        self.nest = c.nest.take();
        self.open_nest();
        let (lo, hi, x) = if self.nest.is_some() { ("xlo", "xhi", "xinner") } else { ("xstart", "xend", "xindex") };
        self.line(&format!("for (int64_t xblock = {lo}; xblock < {hi}; xblock += {b}) {{"));
        self.indent += 1;
        self.line(&format!("const int64_t xcount = {hi} - xblock < {b} ? {hi} - xblock : {b};"));
        for s in &c.pre {
            self.simple(s);
        }
        self.acc_at = "[xi]";
        for &(acc, op, dtype) in &c.accs {
            self.acc_init(acc, op, dtype);
        }
        // The unrolled rows first (none when a constant row count is shorter), then the rest.
        let u = ROW_UNROLL;
        let rnumel = self.rnumel;
        let rest = match rnumel.const_value() {
            Some(n) if n < u => "0".to_string(),
            Some(n) => (n / u * u).to_string(),
            None => format!("({}) / {u} * {u}", rnumel.to_c()),
        };
        if rest != "0" {
            self.line(&format!("for (int64_t rstep = 0; rstep < {rest}; rstep += {u}) {{"));
            self.indent += 1;
            self.column_step(&c, x, "rstep", u);
            self.indent -= 1;
            self.line("}");
        }
        if rnumel.const_value().is_none_or(|n| n % u != 0) {
            self.line(&format!("for (int64_t rindex = {rest}; rindex < {}; rindex++) {{", rnumel.to_c()));
            self.indent += 1;
            self.column_step(&c, x, "rindex", 1);
            self.indent -= 1;
            self.line("}");
        }
        self.line("#pragma omp simd");
        self.line("for (int64_t xi = 0; xi < xcount; xi++) {");
        self.indent += 1;
        self.line(&format!("const int64_t {x} = xblock + xi;"));
        for (var, op, dtype, acc) in c.finish {
            self.acc_finish(var, op, dtype, acc);
        }
        self.acc_at = "";
        for s in c.post {
            self.simple(s);
        }
        self.indent -= 1;
        self.line("}");
        self.indent -= 1;
        self.line("}");
        if self.nest.is_some() {
            self.indent -= 1;
            self.line("}");
        }
    }

    /// One step of the row loop: a vector loop over the block's columns folding `rows` rows
    /// from `row` on. With more than one, each column's accumulators are copied into locals
    /// (`acc<n>_r`) and back, and each row's statements get their own scope and `rindex`: the
    /// same folds in the same order as one row at a time, with one load and store of each
    /// accumulator per step instead of per row.
    fn column_step(&mut self, c: &Column<'a>, x: &str, row: &str, rows: i64) {
        self.line("#pragma omp simd");
        self.line("for (int64_t xi = 0; xi < xcount; xi++) {");
        self.indent += 1;
        self.line(&format!("const int64_t {x} = xblock + xi;"));
        let locals: Vec<(&str, String)> = if rows > 1 {
            c.accs
                .iter()
                .flat_map(|&(acc, op, dtype)| self.acc_vars(acc, op, dtype))
                .map(|(t, name, _)| (t, name))
                .collect()
        } else {
            vec![]
        };
        for (t, name) in &locals {
            self.line(&format!("{t} {name}_r = {name}[xi];"));
        }
        if rows > 1 {
            self.acc_at = "_r";
        }
        self.in_loop = true;
        for i in 0..rows {
            if rows > 1 {
                let r = if i == 0 { row.to_string() } else { format!("{row} + {i}") };
                self.line(&format!("{{ const int64_t rindex = {r};"));
                self.indent += 1;
            }
            for s in &c.body {
                match s {
                    TileStmt::AccUpdate { acc, op, value } => self.acc_update(*acc, *op, *value),
                    TileStmt::Reduce { var, op, source, .. } => self.acc_update(*var, *op, *source),
                    _ => self.simple(s),
                }
            }
            if rows > 1 {
                self.indent -= 1;
                self.line("}");
            }
        }
        self.in_loop = false;
        self.acc_at = "[xi]";
        for (_, name) in &locals {
            self.line(&format!("{name}[xi] = {name}_r;"));
        }
        self.indent -= 1;
        self.line("}");
    }
}
