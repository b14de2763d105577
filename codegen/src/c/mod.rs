//! The C backend: tile kernels to one C translation unit, compiled by the system `cc`.
//!
//! Each kernel becomes `void NAME(char *const *args, int64_t *status)`; `args` holds one pointer
//! per [`TileKernel::args`] entry, in order, then three more: a pointer to the values of
//! [`TileKernel::sizes`] (`int64_t`, in that order; read into `const int64_t s0 = ...` locals, so
//! index expressions print as they are), a pointer to the random streams of
//! [`TileKernel::random`] (two `uint64_t` each, key and first counter, in that order; read into
//! `seed0`, `offset0`, ...), and a pointer to two `int64_t`, the range `[xstart, xend)` of
//! `xindex` this call computes (null: all of `0..xnumel`). A kernel without sizes or random
//! numbers never reads their pointers, so callers may pass both always. `status` (at least 3
//! words, zeroed by the caller) receives the first error of the call ([`status`]).
//!
//! There are no threads in the generated code: the runtime splits `xindex` into ranges and runs
//! them on its one thread pool (rayon, which the matrix products use too), or runs a small
//! kernel in one call (`coil_runtime::cpu::launch`). Blocks become plain loops: one loop over
//! the call's `xindex` range, and inside it loops over `rindex` (a thread handles whole rows,
//! so `XBLOCK` and `RBLOCK` are advisory here and no lane masks are needed). Loops are marked
//! `omp simd` (compiled with `-fopenmp-simd`: vectorization only, no OpenMP run time) unless a
//! statement in them may write `status` (an indirect load, integer division or power) or an
//! arg reduction keeps its first best index; the float math they call is the prelude's own,
//! which vectorizes (`vecmath`).
//!
//! * **Pointwise**: the body of the `xindex` loop, which is the `simd` loop.
//! * **Persistent reduction**: the row's `XR` statements run in `rindex` loops, one per run of
//!   consecutive `XR` statements (a reduction joins the loop computing its operand and is
//!   finished after it; a statement that needs a reduction's result starts a new loop). An `XR`
//!   value lives in a stack array of `rnumel` elements only when a later loop reads it;
//!   otherwise it is a scalar of its loop, like every value of a looped reduction.
//! * **Looped reduction**: each [`TileStmt::RLoop`] is one `rindex` loop; accumulators are
//!   scalars of the `xindex` iteration. An online softmax pass over a static row of up to
//!   `softmax::TWO_PASS_MAX_RNUMEL` runs in two passes (the maximum, then the sum of
//!   exponentials, kept in an array when a later loop needs them: `softmax`); over a longer
//!   or symbolic row, in blocks of [`ONLINE_BLOCK`] positions, each folded into the maximum
//!   and the sum at once (`coil_online_softmax_f32`: the block's maximum, at most one rescale
//!   of the sum, then the block's exponentials, each a vector loop).
//!
//! Reductions are `simd` reductions (one accumulator per vector lane, combined at the end of
//! the loop). Sums of f32 values (f16 and bf16 ones too) add in f32 lanes by blocks of
//! [`rloop::SUM_BLOCK`] positions, each block's total going into a `double` (the error stays
//! within a bound that does not grow with the row: `rloop`); sums in scalar loops and
//! products of floats, and sums of f64, are `double`; integers wrap in `uint64_t`; max/min keep
//! the best non-NaN value and a NaN flag (NaN propagates; which of `+0.0` and `-0.0` wins a
//! tie depends on the lanes); argmax/argmin keep the first best index, NaN counting as the
//! best, in a scalar loop.
//!
//! A bf16 load quiets a signalling NaN (as the interpreter does) only where its bits may reach
//! an f32 store (`quiet`); a bf16 store of a value a cast rounded to bf16 takes its top bits.
//!
//! Variables keep the tile IR's numbers (`tmpN`; `accN` is the accumulator of the reduction
//! `tmpN`), so a kernel's `.tile` and `.c` read side by side. The text is deterministic.

mod column;
mod narrow;
mod nest;
pub(crate) mod ops;
mod prefetch;
mod prelude;
mod quiet;
mod rloop;
mod rowcache;
mod softmax;
mod vecmath;

/// Whether f32 math calls the prelude's own functions (`coil_exp_f32`, ...: [`vecmath`]) rather
/// than the C library's (`expf`); read by the scalar ops `ops.rs`, which CUDA C shares.
const PRELUDE_MATH: bool = true;

pub use prelude::{prelude, status};
pub use rloop::SUM_BLOCK;

use coil_ir::kernel::{flat_stmts, Dims, KernelKind, TileKernel, TileOp, TileStmt, Var};
use coil_ir::op::RandDist;
use coil_ir::philox;
use coil_ir::sym::{Expr, ExprKind};
use coil_ir::{BinaryOp, DType, ReduceOp, Scalar, UnaryOp};
use indexmap::{IndexMap, IndexSet};
use std::fmt::Write;

/// Row positions an online softmax pass folds at once (see `Emitter::online_rloop`): enough
/// for the fold's two loops to run in vectors, few enough for the block to stay in L1.
pub const ONLINE_BLOCK: usize = 256;

/// One C translation unit: the [`prelude`] and one function per kernel, in order.
///
/// A kernel whose code is an earlier one's under another name (each layer of a model has the
/// same kernels) is emitted as a call of that one, so the C compiler builds each body once.
pub fn emit_c(kernels: &[TileKernel]) -> String {
    let mut s = prelude().to_string();
    // Each distinct body (the kernel's C with its name taken out) and the first kernel with it.
    let mut bodies: Vec<(String, &str)> = Vec::new();
    for k in kernels {
        let text = emit_kernel(k);
        let body = text.replace(&k.name, "");
        s.push('\n');
        match bodies.iter().find(|(b, _)| *b == body) {
            Some((_, first)) => {
                let _ = writeln!(s, "/* {}: the same code as {first} */", k.name);
                let _ = writeln!(
                    s,
                    "void {}(char *const *args, int64_t *status)\n{{\n    {first}(args, status);\n}}",
                    k.name
                );
            }
            None => {
                s.push_str(&text);
                bodies.push((body, &k.name));
            }
        }
    }
    s
}

/// Name of the support function applying a tanh GELU in place ([`support_source`]).
pub const SUPPORT_GELU_TANH_F32: &str = "coil_support_gelu_tanh_f32";

/// The [`support_source`] function of the gelu's gradient at a saved input.
pub const SUPPORT_GELU_TANH_GRAD_F32: &str = "coil_support_gelu_tanh_grad_f32";

/// A translation unit of helpers the CPU runtime calls outside generated kernels, with the
/// kernels' signature: [`SUPPORT_GELU_TANH_F32`] (`args[0]`: `float *x`, `args[1]`: `const
/// int64_t *n`) sets `x[i] = gelu_tanh(x[i])` for `i < n`, as the prelude's
/// `coil_gelu_tanh_f32` (the epilogue of a matrix product, computed as a generated kernel
/// would: the same function, vectorized); [`SUPPORT_GELU_TANH_GRAD_F32`] (`args[0]`: `float
/// *g`, `args[1]`: `const float *x`, `args[2]`: `const int64_t *n`) sets
/// `g[i] *= gelu_tanh'(x[i])` (a product's gradient epilogue).
pub fn support_source() -> String {
    format!(
        "{}
void {SUPPORT_GELU_TANH_F32}(char *const *args, int64_t *status)
{{
    float *x = (float *)args[0];
    const int64_t n = *(const int64_t *)args[1];
    (void)status;
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) x[i] = coil_gelu_tanh_f32(x[i]);
}}
void {SUPPORT_GELU_TANH_GRAD_F32}(char *const *args, int64_t *status)
{{
    float *g = (float *)args[0];
    const float *x = (const float *)args[1];
    const int64_t n = *(const int64_t *)args[2];
    (void)status;
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) g[i] = g[i] * coil_gelu_tanh_grad_f32(x[i]);
}}
",
        prelude()
    )
}

/// The C function of one kernel (it needs the [`prelude`] before it).
///
/// # Panics
/// For an extern kernel, and for ops the interpreter rejects on these dtypes (an integer
/// result of true division or of a float-only function).
pub fn emit_kernel(k: &TileKernel) -> String {
    assert!(k.kind != KernelKind::Extern, "emit_kernel: {} is an extern call", k.name);
    let mut e = Emitter::new(k);
    e.function();
    e.out
}

/// What the emitter knows of a variable.
#[derive(Clone, Copy)]
struct VarInfo {
    dtype: DType,
    /// Its value, when it is a constant.
    constant: Option<Scalar>,
    /// Whether it is `-(y * y)` in its float type (`softmax::negated_square`): never positive.
    nonpositive: bool,
}

struct Emitter<'a> {
    k: &'a TileKernel,
    out: String,
    indent: usize,
    vars: IndexMap<Var, VarInfo>,
    /// The value each accumulator folds (its dtype decides the accumulator's type).
    acc_source: IndexMap<Var, Var>,
    /// Persistent `XR` values held in stack arrays (read by a later loop than their own).
    arrays: IndexSet<Var>,
    /// Inside an `rindex` loop.
    in_loop: bool,
    /// Row length (1 for a pointwise kernel); symbolic in a looped reduction.
    rnumel: Expr,
    /// A pointwise kernel's split of `xindex` into an outer and an inner loop.
    nest: Option<nest::Nest>,
    /// `[xi]` while accumulators are arrays of a column kernel's block, `_r` while a column
    /// kernel folds rows into their copies in locals (`super::column`), else empty.
    acc_at: &'static str,
    /// A column kernel's columns per block (`super::column`).
    column_block: i64,
    /// The cut of the `rindex` loop being emitted, if any.
    narrow: Option<narrow::Narrow>,
    /// bf16 loads that quiet a NaN ([`quiet`]); the others widen the bits as they are.
    quiet: IndexSet<Var>,
    /// Accumulators the loop being emitted sums in f32 lanes ([`rloop`]).
    lanes: Vec<Var>,
    /// Whether the `rindex` loop being written may read its blocks as streams ([`rloop`]).
    streams: bool,
    /// The online softmaxes that run in two passes, by their maximum ([`softmax`]).
    two_pass: IndexMap<Var, softmax::TwoPass>,
    /// Values rounded to bf16 by a cast (`coil_round_bf16`): a bf16 store takes their top bits.
    rounded_bf16: IndexSet<Var>,
    /// Values of a looped reduction's row kept in arrays for later passes ([`rowcache`]).
    row_cache: Vec<Var>,
    /// Those of them a pass has computed: later passes read them.
    row_cached: IndexSet<Var>,
    /// The rows a row kernel's last pass prefetches, of the next `xindex` ([`prefetch`]).
    prefetch: Vec<prefetch::Stream>,
    /// Set just before the loop of that last pass is emitted; the loop takes it.
    prefetch_next: bool,
}

/// `(e, bound)` when `index` is `min(e, bound)` with `bound` free of `xindex` and `rindex`: the
/// position a split reduction's overhanging chunk clamps (`coil_passes::split_reductions`).
fn clamped(index: Expr) -> Option<(Expr, Expr)> {
    let ExprKind::Min(a, b) = *index.kind() else { return None };
    let invariant = |e: Expr| {
        e.free_symbols().iter().all(|s| s.as_symbol().is_none_or(|s| s.name != "xindex" && s.name != "rindex"))
    };
    match (invariant(a), invariant(b)) {
        (false, true) => Some((a, b)),
        (true, false) => Some((b, a)),
        _ => None,
    }
}

/// Whether a statement of `stmts` (or of a loop among them) may write `status`: an indirect
/// load, a window, or integer division, remainder or power. Such loops are not marked `simd`.
fn may_fail<'s>(stmts: impl IntoIterator<Item = &'s TileStmt>) -> bool {
    stmts.into_iter().any(|s| match s {
        TileStmt::Let { op: TileOp::IndirectLoad { .. }, .. } | TileStmt::Window { .. } => true,
        TileStmt::Let { op: TileOp::Binary(op, ..), dtype, .. } => ops::binary_may_fail(*op, *dtype),
        TileStmt::RLoop(body) => may_fail(body),
        _ => false,
    })
}

/// A top-level piece of a persistent kernel: one statement, or an `rindex` loop of `XR`
/// statements and the reductions folded in it.
enum Piece<'s> {
    Scalar(&'s TileStmt),
    Loop(Vec<&'s TileStmt>),
}

impl<'a> Emitter<'a> {
    fn new(k: &'a TileKernel) -> Emitter<'a> {
        let mut vars = IndexMap::new();
        let mut acc_source = IndexMap::new();
        let mut rounded_bf16 = IndexSet::new();
        // values `y * y` (or `y ** 2`) of a float type, y of the same type
        let mut squares: IndexSet<Var> = IndexSet::new();
        for s in flat_stmts(&k.body) {
            match s {
                TileStmt::Let { var, dtype, op, .. } => {
                    let constant = if let TileOp::Constant(c) = op { Some(*c) } else { None };
                    let nonpositive = softmax::negated_square(op, *dtype, &vars, &squares);
                    if softmax::square(op, *dtype, &vars) {
                        squares.insert(*var);
                    }
                    vars.insert(*var, VarInfo { dtype: *dtype, constant, nonpositive });
                    let from = |a: &Var| vars.get(a).map(|a: &VarInfo| a.dtype);
                    if let TileOp::Cast(a) = op {
                        if *dtype == DType::BF16 && from(a).is_some_and(|d| d.is_float() && d != DType::BF16) {
                            rounded_bf16.insert(*var);
                        }
                    }
                }
                TileStmt::Reduce { var, dtype, source, .. } => {
                    vars.insert(*var, VarInfo { dtype: *dtype, constant: None, nonpositive: false });
                    if k.kind == KernelKind::PersistentReduction {
                        acc_source.insert(*var, *source);
                    }
                }
                TileStmt::AccUpdate { acc, value, .. } => {
                    acc_source.insert(*acc, *value);
                }
                TileStmt::AccUpdateOnlineSoftmax { max_acc, sum_acc, value } => {
                    acc_source.insert(*max_acc, *value);
                    acc_source.insert(*sum_acc, *value);
                }
                TileStmt::ReduceOnlineSoftmax { max, sum, dtype, .. } => {
                    vars.insert(*max, VarInfo { dtype: *dtype, constant: None, nonpositive: false });
                    vars.insert(*sum, VarInfo { dtype: *dtype, constant: None, nonpositive: false });
                }
                _ => {}
            }
        }
        let rnumel = k.rnumel.unwrap_or(Expr::int(1));
        let nest = nest::Nest::of_pointwise(k);
        let two_pass = softmax::plan(k, &vars);
        Emitter {
            k,
            out: String::new(),
            indent: 0,
            vars,
            acc_source,
            arrays: IndexSet::new(),
            in_loop: false,
            rnumel,
            nest,
            acc_at: "",
            column_block: 0,
            narrow: None,
            quiet: quiet::loads_to_quiet(k),
            lanes: Vec::new(),
            streams: false,
            two_pass,
            rounded_bf16,
            row_cache: Vec::new(),
            row_cached: IndexSet::new(),
            prefetch: Vec::new(),
            prefetch_next: false,
        }
    }

    fn line(&mut self, text: &str) {
        let _ = writeln!(self.out, "{:w$}{text}", "", w = self.indent * 4);
    }

    fn dtype(&self, v: Var) -> DType {
        self.vars[&v].dtype
    }

    /// How a statement reads `v` here.
    fn r(&self, v: Var) -> String {
        if self.in_loop && self.arrays.contains(&v) {
            format!("tmp{v}[rindex]")
        } else {
            format!("tmp{v}")
        }
    }

    fn function(&mut self) {
        let k = self.k;
        let mut header = format!("/* {}: {}, xnumel = {}", k.name, k.kind.name(), k.xnumel);
        if let Some(r) = k.rnumel {
            let _ = write!(header, ", rnumel = {r}");
        }
        self.line(&(header + " */"));
        self.line(&format!("void {}(char *const *args, int64_t *status)", k.name));
        self.line("{");
        self.indent += 1;
        for (i, a) in k.args.iter().enumerate() {
            let t = ops::storage_type(a.dtype);
            let c = if a.written { "" } else { "const " };
            self.line(&format!("{c}{t} *{} = ({c}{t} *)args[{i}]; /* {}, buffer {} */", a.name, a.dtype, a.buffer.0));
        }
        let n = k.args.len();
        for (i, s) in k.sizes.iter().enumerate() {
            self.line(&format!("const int64_t {} = ((const int64_t *)args[{n}])[{i}];", s.to_c()));
        }
        for (i, &stream) in k.random.iter().enumerate() {
            let (seed, offset) = (philox::seed_name(stream), philox::offset_name(stream));
            let at = |word: usize| format!("((const uint64_t *)args[{}])[{word}]", n + 1);
            self.line(&format!("const uint64_t {seed} = {}, {offset} = {};", at(2 * i), at(2 * i + 1)));
        }
        self.line(&format!("const int64_t *xrange = (const int64_t *)args[{}];", n + 2));
        let xnumel = k.xnumel.to_c();
        self.line(&format!("const int64_t xstart = xrange ? xrange[0] : 0, xend = xrange ? xrange[1] : {xnumel};"));
        self.line("(void)status;");
        if let Some(c) = self.column() {
            self.column_body(c);
            self.indent -= 1;
            self.line("}");
            return;
        }
        // The window prologue: once per call, before the loop (the windows' pointers moved).
        let prologue = k.window_prologue();
        for (i, s) in k.body[..prologue].iter().enumerate() {
            match s {
                TileStmt::Window { arg, offset, stride, size, bound } => {
                    if k.window_needs_check(i) {
                        self.window_check(*offset, *size, *bound);
                    }
                    let (p, name) = (self.r(*offset), &k.args[*arg].name);
                    self.line(&format!("{name} += ({})*{p};", self.c(*stride)));
                }
                s => self.stmt(s),
            }
        }
        let body = &k.body[prologue..];
        let simd = k.kind == KernelKind::Pointwise && !may_fail(body.iter());
        self.open_nest();
        if simd {
            self.line("#pragma omp simd");
        }
        match self.nest {
            Some(_) => self.line("for (int64_t xinner = xlo; xinner < xhi; xinner++) {"),
            None => self.line("for (int64_t xindex = xstart; xindex < xend; xindex++) {"),
        }
        self.indent += 1;
        match k.kind {
            KernelKind::PersistentReduction => self.persistent_body(),
            KernelKind::LoopedReduction => {
                // no kept values where a pass stops short of the row (a split reduction's cut)
                let cut = k.body.iter().any(|s| matches!(s, TileStmt::RLoop(b) if self.cut_of(b).is_some()));
                if !cut {
                    self.row_cache = rowcache::plan(k, &self.vars);
                    self.arrays.extend(self.row_cache.iter().copied());
                    self.declare_row_cache();
                }
                self.prefetch = prefetch::plan(k, None);
                self.declare_next_row();
                self.stmts(&k.body)
            }
            _ => self.stmts(body),
        }
        self.indent -= 1;
        self.line("}");
        if self.nest.is_some() {
            self.indent -= 1;
            self.line("}");
        }
        self.indent -= 1;
        self.line("}");
    }

    /// Opens the nest's loop over `xouter`, if there is a nest: `xindex = xouter * period +
    /// xinner`, the call's range cut at whole periods, `xinner` running over `[xlo, xhi)`.
    fn open_nest(&mut self) {
        let Some(nest) = &self.nest else { return };
        let period = match nest.period.const_value() {
            Some(c) => c.to_string(),
            None => format!("({})", nest.period.to_c()),
        };
        self.line(&format!("for (int64_t xouter = xstart / {period}; xouter * {period} < xend; xouter++) {{"));
        self.indent += 1;
        self.line(&format!("const int64_t xbase = xouter * {period};"));
        self.line("const int64_t xlo = xstart > xbase ? xstart - xbase : 0;");
        self.line(&format!("const int64_t xhi = xend - xbase < {period} ? xend - xbase : {period};"));
    }

    /// An index expression as C (through the nest's rewrite of `xindex`, if any).
    fn c(&self, e: Expr) -> String {
        match &self.nest {
            Some(n) => n.rewrite(e).to_c(),
            None => e.to_c(),
        }
    }

    /// The `omp simd` pragma of an `rindex` loop over `stmts` (nested loops included), with a
    /// reduction clause per accumulator it folds; `None` when a statement may write `status`
    /// or an arg reduction keeps its first best index (those loops stay scalar).
    fn simd_pragma<'s>(&self, stmts: impl IntoIterator<Item = &'s TileStmt> + Clone) -> Option<String> {
        if may_fail(stmts.clone()) {
            return None;
        }
        let mut clauses: Vec<(&str, String)> = Vec::new();
        for s in stmts {
            let (acc, op) = match s {
                TileStmt::AccUpdate { acc, op, .. } => (*acc, *op),
                TileStmt::Reduce { var, op, .. } if self.k.kind == KernelKind::PersistentReduction => (*var, *op),
                // the first pass of a two-pass softmax takes the maximum
                TileStmt::AccUpdateOnlineSoftmax { max_acc, .. } if self.two_pass.contains_key(max_acc) => {
                    (*max_acc, ReduceOp::Max)
                }
                _ => continue,
            };
            let name = self.acc_in_loop(acc);
            match op {
                ReduceOp::ArgMax | ReduceOp::ArgMin => return None,
                ReduceOp::Sum => clauses.push(("+", name)),
                ReduceOp::Prod => clauses.push(("*", name)),
                ReduceOp::Max | ReduceOp::Min => {
                    clauses.push((if op == ReduceOp::Max { "max" } else { "min" }, name));
                    if self.source_dtype(acc).is_float() {
                        clauses.push(("|", format!("acc{acc}_nan")));
                    }
                }
            }
        }
        let mut pragma = "#pragma omp simd".to_string();
        for (op, acc) in clauses {
            let _ = write!(pragma, " reduction({op}:{acc})");
        }
        Some(pragma)
    }

    /// Statements of a pointwise or looped kernel (the latter with explicit loops).
    fn stmts(&mut self, stmts: &[TileStmt]) {
        for s in stmts {
            self.stmt(s);
        }
    }

    /// One statement of a pointwise or looped kernel.
    fn stmt(&mut self, s: &TileStmt) {
        match s {
            TileStmt::Let { .. } | TileStmt::Store { .. } => self.simple(s),
            TileStmt::Window { .. } => unreachable!("a window outside the prologue"),

            TileStmt::AccInit { acc, op, dtype } => self.acc_init(*acc, *op, *dtype),
            TileStmt::AccUpdate { acc, op, value } => self.acc_update(*acc, *op, *value),
            TileStmt::Reduce { var, op, dtype, source } => self.acc_finish(*var, *op, *dtype, *source),
            // the first pass of a two-pass softmax ([`softmax`]) takes the maximum
            TileStmt::AccUpdateOnlineSoftmax { max_acc, value, .. } if self.two_pass.contains_key(max_acc) => {
                self.acc_update(*max_acc, ReduceOp::Max, *value)
            }
            // inside a blocked loop (`online_rloop`), which folds the block after its loop
            TileStmt::AccUpdateOnlineSoftmax { max_acc, value, .. } => {
                self.line(&format!("ox{max_acc}[rindex - rblock] = {};", self.r(*value)))
            }
            TileStmt::ReduceOnlineSoftmax { max, sum, dtype, finite_shift } => {
                self.finish_online_softmax(*max, *sum, *dtype, *finite_shift)
            }
            TileStmt::RLoop(body) if body.iter().any(|s| matches!(s, TileStmt::AccUpdateOnlineSoftmax { .. })) => {
                self.softmax_rloop(body)
            }
            TileStmt::RLoop(body) => {
                self.narrow = self.cut_of(body);
                let end = self.narrow.as_ref().map_or_else(|| self.rnumel.to_c(), |n| n.end.clone());
                // without values kept in arrays ([`softmax`], [`rowcache`]) and what only they needed
                let live = self.live_without_kept(body);
                let last = self.k.body.iter().rev().find(|s| matches!(s, TileStmt::RLoop(_)));
                self.prefetch_next =
                    !self.prefetch.is_empty() && self.narrow.is_none() && last.is_some_and(|l| std::ptr::eq(l, s));
                self.rloop(&live, &end, |e| live.iter().for_each(|s| e.stmt(s)));
                self.narrow = None;
            }
        }
    }

    /// Splits a persistent body into scalar statements and `rindex` loops (see the module docs).
    fn pieces(&self) -> Vec<Piece<'a>> {
        let mut pieces = Vec::new();
        let mut open: Option<(Vec<&TileStmt>, Vec<Var>)> = None; // statements, reductions in it
        for s in &self.k.body {
            let xr = match s {
                TileStmt::Let { dims, .. } | TileStmt::Store { dims, .. } => *dims == Dims::XR,
                TileStmt::Reduce { .. } => true,
                _ => panic!("{}: accumulators and loops in a persistent reduction", self.k.name),
            };
            if !xr {
                pieces.extend(open.take().map(|(l, _)| Piece::Loop(l)));
                pieces.push(Piece::Scalar(s));
                continue;
            }
            if open.as_ref().is_some_and(|(_, pending)| s.reads().iter().any(|v| pending.contains(v))) {
                pieces.extend(open.take().map(|(l, _)| Piece::Loop(l)));
            }
            let (stmts, pending) = open.get_or_insert_with(Default::default);
            stmts.push(s);
            if let TileStmt::Reduce { var, .. } = s {
                pending.push(*var);
            }
        }
        pieces.extend(open.map(|(l, _)| Piece::Loop(l)));
        pieces
    }

    fn persistent_body(&mut self) {
        let pieces = self.pieces();
        // An XR value read outside the loop that defines it needs an array.
        let mut home = IndexMap::new();
        for (i, p) in pieces.iter().enumerate() {
            if let Piece::Loop(stmts) = p {
                for s in stmts {
                    if let TileStmt::Let { var, .. } = s {
                        home.insert(*var, i);
                    }
                    for v in s.reads() {
                        if home.get(&v).is_some_and(|&h| h != i) {
                            self.arrays.insert(v);
                        }
                    }
                }
            }
        }
        self.prefetch = prefetch::plan(self.k, Some(&pieces));
        self.declare_next_row();
        let last = pieces.iter().rposition(|p| matches!(p, Piece::Loop(_)));
        for (i, p) in pieces.into_iter().enumerate() {
            match p {
                Piece::Scalar(s) => self.simple(s),
                Piece::Loop(stmts) => {
                    self.prefetch_next = !self.prefetch.is_empty() && Some(i) == last;
                    self.persistent_loop(&stmts)
                }
            }
        }
    }

    fn persistent_loop(&mut self, stmts: &[&TileStmt]) {
        for s in stmts {
            match s {
                TileStmt::Let { var, dtype, .. } if self.arrays.contains(var) => {
                    let len = self.rnumel.const_value().expect("a persistent row is static").max(1); // C has no empty arrays
                    self.line(&format!("{} tmp{var}[{len}];", ops::compute_type(*dtype)));
                }
                TileStmt::Reduce { var, op, dtype, .. } => self.acc_init(*var, *op, *dtype),
                _ => {}
            }
        }
        self.narrow = if self.arrays.is_empty() { self.cut_of(stmts.iter().copied()) } else { None };
        let end = self.narrow.as_ref().map_or_else(|| self.rnumel.to_c(), |n| n.end.clone());
        self.rloop(stmts, &end, |e| {
            for s in stmts {
                match s {
                    TileStmt::Reduce { var, op, source, .. } => e.acc_update(*var, *op, *source),
                    _ => e.simple(s),
                }
            }
        });
        self.narrow = None;
        for s in stmts {
            if let TileStmt::Reduce { var, op, dtype, .. } = s {
                self.acc_finish(*var, *op, *dtype, *var);
            }
        }
    }

    /// A `Let` or a `Store`.
    fn simple(&mut self, s: &TileStmt) {
        match s {
            TileStmt::Let { var, dtype, op, .. } => {
                let rhs = match op {
                    // inside a cut loop the position is in the row: the test is true (its
                    // operands stay referenced, so no variable goes unused)
                    TileOp::Binary(_, a, b) if self.narrow.as_ref().is_some_and(|n| n.cond == *var) => {
                        format!("((void){}, (void){}, (uint8_t)1)", self.r(*a), self.r(*b))
                    }
                    _ => self.op_expr(*var, op, *dtype),
                };
                if self.in_loop && self.arrays.contains(var) {
                    self.line(&format!("tmp{var}[rindex] = {rhs};"));
                    if self.row_cache.contains(var) {
                        self.row_cached.insert(*var);
                    }
                } else {
                    self.line(&format!("{} tmp{var} = {rhs};", ops::compute_type(*dtype)));
                }
            }
            TileStmt::Store { arg, index, value, .. } => {
                let v = self.stored(*arg, *value);
                self.line(&format!("{}[{}] = {v};", self.k.args[*arg].name, self.c(*index)));
            }
            _ => unreachable!("not a simple statement"),
        }
    }

    /// A window's check ([`TileStmt::Window`]): out of range, the error at the first position
    /// outside, and a return before anything is stored.
    fn window_check(&mut self, offset: Var, size: Expr, bound: Expr) {
        let (p, size, bound) = (self.r(offset), self.c(size), self.c(bound));
        self.line(&format!("if ({p} < 0 || {p} > ({bound}) - ({size})) {{"));
        self.line(&format!("    coil_index_error(status, {p} < 0 || {p} > ({bound}) ? {p} : ({bound}), {bound});"));
        self.line("    return;");
        self.line("}");
    }

    /// The C value `value` is stored as into kernel argument `arg`.
    fn stored(&self, arg: usize, value: Var) -> String {
        let a = &self.k.args[arg];
        if a.dtype == DType::BF16 && self.rounded_bf16.contains(&value) {
            format!("coil_rounded_bf16_bits({})", self.r(value))
        } else {
            ops::store_value(&self.r(value), self.dtype(value), a.dtype)
        }
    }

    /// `ptr[index]` of a buffer of `buf` as a value of `out`, for variable `var`: a bf16 that
    /// no f32 store can see keeps its NaN bits ([`quiet`]).
    fn load(&self, var: Var, ptr: &str, index: &str, buf: DType, out: DType) -> String {
        if buf == DType::BF16 && !self.quiet.contains(&var) {
            return ops::convert(&format!("coil_bf16_bits_f32({ptr}[{index}])"), buf, out);
        }
        ops::load(ptr, index, buf, out)
    }

    /// The C expression of `op`, the value of `var` (of `out`).
    fn op_expr(&self, var: Var, op: &TileOp, out: DType) -> String {
        let arg = |i: usize| (&self.k.args[i].name, self.k.args[i].dtype);
        let load = |p: &str, index: &str, d: DType| self.load(var, p, index, d, out);
        match op {
            TileOp::Load { arg: i, index } => {
                let (p, d) = arg(*i);
                match clamped(*index) {
                    // inside a cut loop (`narrow`) the position is in the row: no clamp
                    Some((e, _)) if self.narrow.as_ref().is_some_and(|n| n.position == e) => load(p, &self.c(e), d),
                    // The unselected load is never made; in a vector loop this one is a masked
                    // contiguous load, where `p[min(e, bound)]` would be a gather.
                    Some((e, bound)) => format!(
                        "({} <= {} ? {} : {})",
                        self.c(e),
                        self.c(bound),
                        load(p, &self.c(e), d),
                        load(p, &self.c(bound), d)
                    ),
                    None => load(p, &self.c(*index), d),
                }
            }
            TileOp::MaskedLoad { arg: i, index, mask, other } => {
                let (p, d) = arg(*i);
                // The conditional never evaluates the load where the mask is off.
                format!("{} ? {} : {}", self.r(*mask), load(p, &self.c(*index), d), ops::literal(*other, out))
            }
            TileOp::IndirectLoad { arg: i, index, indirect, stride, bound } => {
                let (p, d) = arg(*i);
                let v = self.r(*indirect);
                let at = format!("({}) + ({})*{v}", self.c(*index), self.c(*stride));
                let bound = self.c(*bound);
                format!("(0 <= {v} && {v} < {bound}) ? {} : coil_index_error(status, {v}, {bound})", load(p, &at, d))
            }
            TileOp::Constant(c) => ops::literal(*c, out),
            TileOp::Index(e) => ops::convert(&format!("(int64_t)({})", self.c(*e)), DType::I64, out),
            TileOp::Rand { dist, stream, counter } => {
                let f = if *dist == RandDist::Normal { "coil_rand_normal" } else { "coil_rand_uniform" };
                let (seed, offset) = (philox::seed_name(*stream), philox::offset_name(*stream));
                // unsigned: the counter wraps modulo 2^64, as the definition says
                let call = format!("{f}({seed}, {offset} + (uint64_t)({}))", self.c(*counter));
                ops::convert(&call, DType::F64, out)
            }
            TileOp::Unary(UnaryOp::Exp, a) if self.vars[a].nonpositive && self.dtype(*a) == out => {
                softmax::exp_nonpositive(&self.r(*a), out)
            }
            TileOp::Unary(u, a) => ops::unary(*u, &self.r(*a), self.dtype(*a), out),
            // x ** 2 is x * x (one rounding either way), as in RMS norms; f32 only (f64 keeps pow)
            TileOp::Binary(BinaryOp::Pow, x, y)
                if out != DType::F64 && out.is_float() && self.vars[y].constant.is_some_and(|c| c.as_f64() == 2.0) =>
            {
                let x = ops::convert(&self.r(*x), self.dtype(*x), out);
                format!("{x} * {x}")
            }
            TileOp::Binary(b, x, y) => ops::binary(*b, &self.r(*x), self.dtype(*x), &self.r(*y), self.dtype(*y), out),
            TileOp::Where(c, x, y) => {
                let (x, y) =
                    (ops::convert(&self.r(*x), self.dtype(*x), out), ops::convert(&self.r(*y), self.dtype(*y), out));
                format!("{} ? {x} : {y}", self.r(*c))
            }
            TileOp::Cast(a) => ops::convert(&self.r(*a), self.dtype(*a), out),
        }
    }

    /// The dtype the accumulator of `acc` folds (its source's).
    fn source_dtype(&self, acc: Var) -> DType {
        self.dtype(self.acc_source[&acc])
    }

    /// The accumulator of `acc` as C (an element of an array in a column kernel).
    fn acc(&self, acc: Var) -> String {
        format!("acc{acc}{}", self.acc_at)
    }

    /// The C variables of accumulator `acc` of a reduction with result dtype `out`: `(type,
    /// name, initial value)`. Floats sum and multiply in `double`, integers in wrapping
    /// `uint64_t`; a float maximum or minimum keeps the best non-NaN value and a flag for NaN
    /// (two vectorizable reductions; a NaN wins in the end).
    fn acc_vars(&self, acc: Var, op: ReduceOp, out: DType) -> Vec<(&'static str, String, &'static str)> {
        let src = self.source_dtype(acc);
        let (t, init) = match op {
            ReduceOp::Sum | ReduceOp::Prod if out.is_float() => {
                ("double", if op == ReduceOp::Sum { "0.0" } else { "1.0" })
            }
            ReduceOp::Sum | ReduceOp::Prod => ("uint64_t", if op == ReduceOp::Sum { "0" } else { "1" }),
            _ if src.is_float() => {
                let max = matches!(op, ReduceOp::Max | ReduceOp::ArgMax);
                (ops::compute_type(src), if max { "-INFINITY" } else { "INFINITY" })
            }
            _ => ("int64_t", if matches!(op, ReduceOp::Max | ReduceOp::ArgMax) { "INT64_MIN" } else { "INT64_MAX" }),
        };
        let mut vars = vec![(t, format!("acc{acc}"), init)];
        if op.is_arg() {
            vars.push(("int64_t", format!("acc{acc}_index"), "0"));
        } else if matches!(op, ReduceOp::Max | ReduceOp::Min) && src.is_float() {
            vars.push(("int32_t", format!("acc{acc}_nan"), "0"));
        }
        vars
    }

    /// Declares the accumulator of a reduction with result dtype `out` ([`Emitter::acc_vars`]).
    /// In a column kernel, an array of them, one per column of its block of `column_block`.
    fn acc_init(&mut self, acc: Var, op: ReduceOp, out: DType) {
        let vars = self.acc_vars(acc, op, out);
        if self.acc_at.is_empty() {
            for (t, name, init) in vars {
                self.line(&format!("{t} {name} = {init};"));
            }
            return;
        }
        let b = self.column_block;
        for (t, name, _) in &vars {
            self.line(&format!("{t} {name}[{b}];"));
        }
        let inits: Vec<String> = vars.iter().map(|(_, name, init)| format!("{name}[xi] = {init};")).collect();
        self.line(&format!("for (int64_t xi = 0; xi < {b}; xi++) {{ {} }}", inits.join(" ")));
    }

    /// Folds `value` (the element at `rindex`) into the accumulator.
    fn acc_update(&mut self, acc: Var, op: ReduceOp, value: Var) {
        let (src, v) = (self.dtype(value), self.r(value));
        let out = self.dtype(acc);
        let (a, at) = (self.acc_in_loop(acc), self.acc_at);
        let line = match op {
            ReduceOp::Sum if self.lanes.contains(&acc) => format!("{a} += {};", ops::convert(&v, src, DType::F32)),
            ReduceOp::Sum if out.is_float() => format!("{a} += {};", ops::convert(&v, src, DType::F64)),
            ReduceOp::Prod if out.is_float() => format!("{a} *= {};", ops::convert(&v, src, DType::F64)),
            ReduceOp::Sum => format!("{a} += (uint64_t){};", ops::convert(&v, src, DType::I64)),
            ReduceOp::Prod => format!("{a} *= (uint64_t){};", ops::convert(&v, src, DType::I64)),
            // Strict comparisons keep the accumulator on a tie (the first operand wins, as in
            // coil_maximum); NaN never enters it but sets the flag.
            ReduceOp::Max | ReduceOp::Min if src.is_float() => {
                let cmp = if op == ReduceOp::Max { ">" } else { "<" };
                format!("{a} = {v} {cmp} {a} ? {v} : {a}; acc{acc}_nan{at} |= {v} != {v};")
            }
            ReduceOp::Max => format!("{a} = {v} > {a} ? {v} : {a};"),
            ReduceOp::Min => format!("{a} = {v} < {a} ? {v} : {a};"),
            ReduceOp::ArgMax | ReduceOp::ArgMin => {
                let cmp = if op == ReduceOp::ArgMax { ">" } else { "<" };
                // Strict comparison keeps the first best index; the first NaN wins for good.
                let better = if src.is_float() {
                    format!("!isnan({a}) && (isnan({v}) || {v} {cmp} {a})")
                } else {
                    format!("{v} {cmp} {a}")
                };
                format!("if ({better}) {{ {a} = {v}; acc{acc}_index{at} = rindex; }}")
            }
        };
        self.line(&line);
    }

    /// Defines `tmp<var>`, the finished reduction of accumulator `acc`.
    fn acc_finish(&mut self, var: Var, op: ReduceOp, out: DType, acc: Var) {
        let src = self.source_dtype(acc);
        let (a, at) = (self.acc(acc), self.acc_at);
        let value = match op {
            ReduceOp::Sum | ReduceOp::Prod if out.is_float() => ops::convert(&a, DType::F64, out),
            ReduceOp::Sum | ReduceOp::Prod => ops::convert(&format!("(int64_t){a}"), DType::I64, out),
            ReduceOp::Max | ReduceOp::Min if src.is_float() => {
                let t = ops::compute_type(src);
                ops::convert(&format!("(acc{acc}_nan{at} ? ({t})NAN : {a})"), src, out)
            }
            ReduceOp::Max | ReduceOp::Min => ops::convert(&a, DType::I64, out),
            ReduceOp::ArgMax | ReduceOp::ArgMin => ops::convert(&format!("acc{acc}_index{at}"), DType::I64, out),
        };
        self.line(&format!("{} tmp{var} = {value};", ops::compute_type(out)));
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_online;
#[cfg(test)]
mod tests_prefetch;
#[cfg(test)]
mod tests_rows;
#[cfg(test)]
mod vecmath_tests;
