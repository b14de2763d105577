//! Online softmax passes ([`TileStmt::AccUpdateOnlineSoftmax`]) in C.
//!
//! A row of static length up to [`TWO_PASS_MAX_RNUMEL`] runs in two passes, as Inductor's CPU
//! kernels do: the loop takes the row's maximum `m` (a plain vector max reduction), then a
//! second loop recomputes the value `x` and sums `exp(x - m)` in f32 lanes ([`super::rloop`]).
//! The second pass reads the row from the cache the first one filled, and each exponential is
//! computed once, with no rescaling. When a later loop of the kernel computes the same
//! `exp(x - m)` (a softmax's normalization: `tmp = sub(x, m)`, `e = exp(tmp)`), the second pass
//! keeps those values in a stack array of the row (at most [`EXP_CACHE_BYTES`]) and the later
//! loop reads them instead of computing them again: the same C expression of the same values,
//! so the same bits. (On the build machine, one core: softmax of `[410, 4096]` f32 took
//! 1.13 ms in the online form, 0.55 ms in two passes with the array.)
//!
//! A longer or symbolic row keeps the online form: blocks of [`ONLINE_BLOCK`] values go to
//! `ox<max>[]`, then one call folds them (`coil_online_softmax_f32`: the block's maximum, at
//! most one rescale of the sum, then the block's exponentials summed in f32 lanes into the
//! `double` sum), so the row is read from memory once.

use super::{ops, Emitter, VarInfo, ONLINE_BLOCK};
use coil_ir::kernel::{KernelKind, TileKernel, TileOp, TileStmt, Var};
use coil_ir::{BinaryOp, DType, ReduceOp, UnaryOp};
use indexmap::{IndexMap, IndexSet};

/// The longest (static) row an online softmax takes in two passes: its second pass should
/// find the row in the core's cache.
pub const TWO_PASS_MAX_RNUMEL: i64 = 1 << 17;

/// The largest array of exponentials a two-pass softmax keeps for a later loop (on the stack of
/// the calling thread; the runtime's threads have 2 MiB).
pub const EXP_CACHE_BYTES: i64 = 256 << 10;

/// An online softmax that runs in two passes, keyed by its maximum's accumulator.
#[derive(Clone, Copy)]
pub(super) struct TwoPass {
    /// The sum's accumulator.
    sum: Var,
    /// The value folded.
    value: Var,
    /// The dtype of the finished maximum and sum.
    dtype: DType,
    /// `(tmp, e)`: a later loop's `tmp = sub(value, max)` and `e = exp(tmp)`, which the
    /// second pass computes into the array `tmp<e>[]`.
    cache: Option<(Var, Var)>,
}

/// The two-pass online softmaxes of `k` (see the module doc).
pub(super) fn plan(k: &TileKernel, vars: &IndexMap<Var, VarInfo>) -> IndexMap<Var, TwoPass> {
    let mut plans = IndexMap::new();
    let Some(n) = k.rnumel.and_then(|r| r.const_value()) else { return plans };
    if k.kind != KernelKind::LoopedReduction || !(1..=TWO_PASS_MAX_RNUMEL).contains(&n) {
        return plans;
    }
    for (i, s) in k.body.iter().enumerate() {
        let TileStmt::RLoop(body) = s else { continue };
        for s in body {
            let TileStmt::AccUpdateOnlineSoftmax { max_acc: m, sum_acc, value: v } = *s else { continue };
            let Some(dtype) = k.body[i..].iter().find_map(|s| match s {
                TileStmt::ReduceOnlineSoftmax { max, dtype, .. } if *max == m => Some(*dtype),
                _ => None,
            }) else {
                continue;
            };
            let dv = vars[&v].dtype;
            let later = k.body[i + 1..].iter().filter_map(|s| if let TileStmt::RLoop(b) = s { Some(b) } else { None });
            let lets = || later.clone().flatten();
            let sub = lets().find_map(|s| match s {
                TileStmt::Let { var, dtype, op: TileOp::Binary(BinaryOp::Sub, a, b), .. }
                    if *a == v && *b == m && *dtype == dv =>
                {
                    Some(*var)
                }
                _ => None,
            });
            let exp = sub.and_then(|t| {
                lets().find_map(|s| match s {
                    TileStmt::Let { var, dtype, op: TileOp::Unary(UnaryOp::Exp, a), .. } if *a == t && *dtype == dv => {
                        Some(*var)
                    }
                    _ => None,
                })
            });
            let fits = n * dv.size_bytes().max(4) as i64 <= EXP_CACHE_BYTES;
            let cache = match (sub, exp) {
                (Some(t), Some(e)) if fits && dtype == dv => Some((t, e)),
                _ => None,
            };
            plans.insert(m, TwoPass { sum: sum_acc, value: v, dtype, cache });
        }
    }
    plans
}

/// `exp(x)` of `x <= 0` (or NaN), a value of `d`: f32 (f16, bf16) values call
/// `coil_exp_nonpositive_f32`, which gives `coil_exp_f32`'s value there in fewer vector
/// instructions (the C prelude); f64 ones the library's `exp`. (Below `-87` it gives 0 where
/// `coil_exp_f32` gives a subnormal.)
pub(super) fn exp_nonpositive(x: &str, d: DType) -> String {
    if ops::compute_type(d) == "float" {
        format!("coil_exp_nonpositive_f32({x})")
    } else {
        ops::unary(UnaryOp::Exp, x, d, d) // a call: no parentheses needed
    }
}

impl Emitter<'_> {
    /// An `RLoop` with online softmax updates: in two passes when planned, else online.
    pub(super) fn softmax_rloop(&mut self, body: &[TileStmt]) {
        let two_pass = body.iter().any(
            |s| matches!(s, TileStmt::AccUpdateOnlineSoftmax { max_acc, .. } if self.two_pass.contains_key(max_acc)),
        );
        if two_pass {
            self.two_pass_rloop(body)
        } else {
            self.online_rloop(body)
        }
    }

    /// Whether `var` is an exponential a two-pass softmax keeps in an array.
    pub(super) fn is_cached_exp(&self, var: Var) -> bool {
        self.two_pass.values().any(|p| p.cache.is_some_and(|(_, e)| e == var))
    }

    /// The statements of a loop `body` without the values an earlier pass kept in arrays
    /// (exponentials here, values of the row: [`super::rowcache`]) and what only they needed.
    pub(super) fn live_without_kept<'b>(&self, body: &'b [TileStmt]) -> Vec<&'b TileStmt> {
        let kept_before = |v: Var| self.is_cached_exp(v) || self.row_cached.contains(&v);
        if !body.iter().any(|s| matches!(s, TileStmt::Let { var, .. } if kept_before(*var))) {
            return body.iter().collect();
        }
        let mut live: Vec<Var> = Vec::new();
        let mut kept = Vec::new();
        for s in body.iter().rev() {
            let keep = match s {
                TileStmt::Let { var, .. } => live.contains(var) && !kept_before(*var),
                _ => true,
            };
            if keep {
                live.extend(s.reads());
                kept.push(s);
            }
        }
        kept.reverse();
        kept
    }

    /// `tmp<max>` and `tmp<sum>` of a finished online softmax; a two-pass one defined its
    /// maximum before its second pass.
    pub(super) fn finish_online_softmax(&mut self, max: Var, sum: Var, dtype: DType, finite_shift: bool) {
        if !self.two_pass.contains_key(&max) {
            self.acc_finish(max, ReduceOp::Max, dtype, max);
        }
        let f = if finite_shift { "coil_online_sum_finite" } else { "coil_online_sum" };
        let value = ops::convert(&format!("{f}(tmp{max}, acc{sum})"), DType::F64, dtype);
        self.line(&format!("{} tmp{sum} = {value};", ops::compute_type(dtype)));
    }

    /// The two passes of an `RLoop` (see the module doc).
    fn two_pass_rloop(&mut self, body: &[TileStmt]) {
        let rn = self.rnumel.to_c();
        let all: Vec<&TileStmt> = body.iter().collect();
        self.rloop(&all, &rn, |e| e.stmts(body));
        // (the maximum's accumulator, its plan)
        let updates: Vec<(Var, TwoPass)> = body
            .iter()
            .filter_map(|s| match s {
                TileStmt::AccUpdateOnlineSoftmax { max_acc, .. } => Some((*max_acc, self.two_pass[max_acc])),
                _ => None,
            })
            .collect();
        for &(m, p) in &updates {
            self.acc_finish(m, ReduceOp::Max, p.dtype, m);
            if let Some((_, e)) = p.cache {
                let t = ops::compute_type(self.dtype(e));
                self.line(&format!("{t} tmp{e}[{rn}];"));
                self.arrays.insert(e);
            }
        }
        // the statements the values need, recomputed
        let mut needed: Vec<Var> = updates.iter().map(|u| u.1.value).collect();
        let mut slice = Vec::new();
        for s in body.iter().rev() {
            if let TileStmt::Let { var, op, .. } = s {
                if needed.contains(var) {
                    needed.extend(op.operands());
                    slice.push(s);
                }
            }
        }
        slice.reverse();
        let vector = !super::may_fail(slice.iter().copied());
        let lanes: Vec<Var> =
            updates.iter().map(|u| u.1.sum).filter(|&a| vector && self.lane_sum(a, ReduceOp::Sum)).collect();
        self.lanes = lanes.clone();
        let pragma = vector.then(|| {
            let sums: String = updates.iter().map(|u| format!(" reduction(+:{})", self.acc_in_loop(u.1.sum))).collect();
            format!("#pragma omp simd{sums}")
        });
        let defs: IndexMap<Var, &TileStmt> = self
            .k
            .body
            .iter()
            .filter_map(|s| if let TileStmt::RLoop(b) = s { Some(b) } else { None })
            .flatten()
            .filter_map(|s| if let TileStmt::Let { var, .. } = s { Some((*var, s)) } else { None })
            .collect();
        self.blocked_rloop(pragma, &rn, &lanes, |e| {
            for s in &slice {
                e.simple(s);
            }
            for &(m, TwoPass { sum: a, value: v, cache, .. }) in &updates {
                let dv = e.dtype(v);
                let term = match cache {
                    Some((t, x)) => {
                        // the later loop's `tmp<t>`, and its exp: the same value (see exp_nonpositive)
                        e.simple(defs[&t]);
                        e.line(&format!("{} = {};", e.r(x), exp_nonpositive(&format!("tmp{t}"), dv)));
                        e.r(x)
                    }
                    None => exp_nonpositive(&ops::binary(BinaryOp::Sub, &e.r(v), dv, &format!("tmp{m}"), dv, dv), dv),
                };
                let to = if e.lanes.contains(&a) { DType::F32 } else { DType::F64 };
                e.line(&format!("{} += {};", e.acc_in_loop(a), ops::convert(&term, dv, to)));
            }
        });
        self.lanes.clear();
    }

    /// An `RLoop` with online softmax updates, in blocks of [`ONLINE_BLOCK`] positions: the
    /// block's values go to `ox<max>[]`, then one call folds them (the block's maximum first,
    /// so the sum is rescaled at most once per block and its exponentials are independent).
    fn online_rloop(&mut self, body: &[TileStmt]) {
        let (rn, b) = (self.rnumel.to_c(), ONLINE_BLOCK);
        self.line(&format!("for (int64_t rblock = 0; rblock < {rn}; rblock += {b}) {{"));
        self.indent += 1;
        let left =
            if self.rnumel.const_value().is_some() { format!("{rn} - rblock") } else { format!("({rn}) - rblock") };
        self.line(&format!("const int64_t rcount = {left} < {b} ? {left} : {b};"));
        let mut folds = Vec::new();
        for s in body {
            if let TileStmt::AccUpdateOnlineSoftmax { max_acc: m, sum_acc: a, value } = s {
                let d = self.dtype(*value);
                self.line(&format!("{} ox{m}[{b}];", ops::compute_type(d)));
                let f = if d == DType::F64 { "_f64" } else { "_f32" };
                folds.push(format!("coil_online_softmax{f}(&acc{m}, &acc{a}, ox{m}, rcount);"));
            }
        }
        if let Some(pragma) = self.simd_pragma(body) {
            self.line(&pragma);
        }
        self.line("for (int64_t rindex = rblock; rindex < rblock + rcount; rindex++) {");
        self.indent += 1;
        self.in_loop = true;
        self.stmts(body);
        self.in_loop = false;
        self.indent -= 1;
        self.line("}");
        for f in folds {
            self.line(&f);
        }
        self.indent -= 1;
        self.line("}");
    }
}

/// Whether `op`, defining a value of `dtype`, is a square of a value of that float type:
/// `y * y` or `y ** 2` (`vars` holds the values defined before it).
pub(super) fn square(op: &TileOp, dtype: DType, vars: &IndexMap<Var, VarInfo>) -> bool {
    let same = |y: &Var| vars.get(y).is_some_and(|v| v.dtype == dtype);
    dtype.is_float()
        && match op {
            TileOp::Binary(BinaryOp::Mul, y, z) => y == z && same(y),
            TileOp::Binary(BinaryOp::Pow, y, e) => {
                same(y) && vars.get(e).and_then(|e| e.constant).is_some_and(|c| c.as_f64() == 2.0)
            }
            _ => false,
        }
}

/// Whether `op`, defining a value of `dtype`, negates one of `squares` of that dtype: `-(y *
/// y)` is -0 or less (or NaN) in any float type, so its exponential is
/// [`exp_nonpositive`]'s, a Gaussian's `exp(-x^2 / 2)` (the erf GELU's gradient: that kernel
/// took 18% less time on one core of the build machine, 152 against 185 us at 183680 floats).
pub(super) fn negated_square(
    op: &TileOp,
    dtype: DType,
    vars: &IndexMap<Var, VarInfo>,
    squares: &IndexSet<Var>,
) -> bool {
    let square = |y: &Var| squares.contains(y) && vars.get(y).is_some_and(|v| v.dtype == dtype);
    dtype.is_float() && matches!(op, TileOp::Unary(UnaryOp::Neg, y) if square(y))
}
