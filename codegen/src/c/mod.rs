//! The C backend: tile kernels to one C translation unit, compiled by the system `cc` with
//! OpenMP.
//!
//! Each kernel becomes `void NAME(char *const *args, int64_t *status)`; `args` holds one pointer
//! per [`TileKernel::args`] entry, in order, then two more: a pointer to the values of
//! [`TileKernel::sizes`] (`int64_t`, in that order; read into `const int64_t s0 = ...` locals, so
//! index expressions print as they are), and a pointer to the random streams of
//! [`TileKernel::random`] (two `uint64_t` each, key and first counter, in that order; read into
//! `seed0`, `offset0`, ...). A kernel without sizes or random numbers never reads its pointer,
//! so callers may pass both always. `status` (at least 3 words, zeroed by the caller) receives the first error
//! of the launch ([`status`]). Blocks become plain loops: one
//! OpenMP-parallel loop over `xindex`, and inside it loops over `rindex` (a CPU thread handles a
//! whole row, so `XBLOCK` and `RBLOCK` are advisory here and no lane masks are needed). Kernels
//! under [`PARALLEL_MIN_ELEMENTS`] elements stay on the calling thread (with symbolic sizes, an
//! OpenMP `if` clause decides at run time).
//!
//! * **Pointwise**: the body of the `xindex` loop, which is `parallel for simd` unless some
//!   statement may write `status` (an indirect load, integer division or power).
//! * **Persistent reduction**: the row's `XR` statements run in `rindex` loops, one per run of
//!   consecutive `XR` statements (a reduction joins the loop computing its operand and is
//!   finished after it; a statement that needs a reduction's result starts a new loop). An `XR`
//!   value lives in a stack array of `rnumel` elements only when a later loop reads it;
//!   otherwise it is a scalar of its loop, like every value of a looped reduction.
//! * **Looped reduction**: each [`TileStmt::RLoop`] is one `rindex` loop; accumulators are
//!   scalars of the `xindex` iteration. An online softmax pass runs in blocks of
//!   [`ONLINE_BLOCK`] positions, each folded into the maximum and the `double` sum of
//!   exponentials at once (`coil_online_softmax_f32`: the block's maximum, at most one rescale
//!   of the sum, then the block's exponentials).
//!
//! Reductions accumulate sums and products of floats in `double` (the interpreter sums in f64
//! and rounds once, and f32 accumulation drifts on long rows), integers in wrapping `int64_t`;
//! max/min propagate NaN; argmax/argmin keep the first best index, NaN counting as the best.
//!
//! Variables keep the tile IR's numbers (`tmpN`; `accN` is the accumulator of the reduction
//! `tmpN`), so a kernel's `.tile` and `.c` read side by side. The text is deterministic.

mod ops;
mod prelude;

pub use prelude::{prelude, status};

use coil_ir::kernel::{flat_stmts, Dims, KernelKind, TileKernel, TileOp, TileStmt, Var};
use coil_ir::op::RandDist;
use coil_ir::philox;
use coil_ir::sym::Expr;
use coil_ir::{DType, ReduceOp};
use indexmap::{IndexMap, IndexSet};
use std::fmt::Write;

/// Below this many elements (`xnumel * rnumel`) a kernel runs on the calling thread: waking
/// the OpenMP team costs more than the work.
pub const PARALLEL_MIN_ELEMENTS: i64 = 1 << 15;

/// Row positions an online softmax pass folds at once (see `Emitter::online_rloop`).
pub const ONLINE_BLOCK: usize = 32;

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
}

/// When the `xindex` loop runs on the OpenMP team.
enum Parallel {
    Never,
    Always,
    /// When this C condition holds (symbolic sizes).
    If(String),
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
        for s in flat_stmts(&k.body) {
            match s {
                TileStmt::Let { var, dtype, .. } => {
                    vars.insert(*var, VarInfo { dtype: *dtype });
                }
                TileStmt::Reduce { var, dtype, source, .. } => {
                    vars.insert(*var, VarInfo { dtype: *dtype });
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
                    vars.insert(*max, VarInfo { dtype: *dtype });
                    vars.insert(*sum, VarInfo { dtype: *dtype });
                }
                _ => {}
            }
        }
        let rnumel = k.rnumel.unwrap_or(Expr::int(1));
        Emitter { k, out: String::new(), indent: 0, vars, acc_source, arrays: IndexSet::new(), in_loop: false, rnumel }
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

    /// Whether the `xindex` loop is worth the OpenMP team: more than one row and at least
    /// [`PARALLEL_MIN_ELEMENTS`] elements (decided here when the sizes are constant).
    fn parallel(&self) -> Parallel {
        let xnumel = self.k.xnumel;
        let total = xnumel * self.rnumel;
        let at_least = |e: Expr, n: i64| e.bounds().0.is_some_and(|lo| lo >= n);
        match (xnumel.const_value(), total.const_value()) {
            (Some(x), _) if x <= 1 => Parallel::Never,
            (_, Some(t)) if t < PARALLEL_MIN_ELEMENTS => Parallel::Never,
            (_, Some(_)) => Parallel::Always,
            _ if at_least(xnumel, 2) && at_least(total, PARALLEL_MIN_ELEMENTS) => Parallel::Always,
            _ => {
                let mut cond = format!("{} >= {PARALLEL_MIN_ELEMENTS}", total.to_c());
                if !at_least(xnumel, 2) {
                    cond = format!("{} > 1 && {cond}", xnumel.to_c());
                }
                Parallel::If(cond)
            }
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
        self.line("(void)status;");
        let may_fail = flat_stmts(&k.body).iter().any(|s| match s {
            TileStmt::Let { op: TileOp::IndirectLoad { .. }, .. } => true,
            TileStmt::Let { op: TileOp::Binary(op, ..), dtype, .. } => ops::binary_may_fail(*op, *dtype),
            _ => false,
        });
        let simd = k.kind == KernelKind::Pointwise && !may_fail;
        let pragma = match (self.parallel(), simd) {
            (Parallel::Always, true) => Some("#pragma omp parallel for simd".to_string()),
            (Parallel::Always, false) => Some("#pragma omp parallel for".to_string()),
            // `parallel:` so that the clause leaves `simd` on when the team is not worth it.
            (Parallel::If(c), true) => Some(format!("#pragma omp parallel for simd if(parallel: {c})")),
            (Parallel::If(c), false) => Some(format!("#pragma omp parallel for if({c})")),
            (Parallel::Never, true) => Some("#pragma omp simd".to_string()),
            (Parallel::Never, false) => None,
        };
        if let Some(p) = pragma {
            self.line(&p);
        }
        self.line(&format!("for (int64_t xindex = 0; xindex < {}; xindex++) {{", k.xnumel.to_c()));
        self.indent += 1;
        match k.kind {
            KernelKind::PersistentReduction => self.persistent_body(),
            _ => self.stmts(&k.body),
        }
        self.indent -= 1;
        self.line("}");
        self.indent -= 1;
        self.line("}");
    }

    /// Statements of a pointwise or looped kernel (the latter with explicit loops).
    fn stmts(&mut self, stmts: &[TileStmt]) {
        for s in stmts {
            match s {
                TileStmt::Let { .. } | TileStmt::Store { .. } => self.simple(s),
                TileStmt::AccInit { acc, op, dtype } => self.acc_init(*acc, *op, *dtype),
                TileStmt::AccUpdate { acc, op, value } => self.acc_update(*acc, *op, *value),
                TileStmt::Reduce { var, op, dtype, source } => self.acc_finish(*var, *op, *dtype, *source),
                // inside a blocked loop (`online_rloop`), which folds the block after its loop
                TileStmt::AccUpdateOnlineSoftmax { max_acc, value, .. } => {
                    self.line(&format!("ox{max_acc}[rindex - rblock] = {};", self.r(*value)))
                }
                TileStmt::ReduceOnlineSoftmax { max, sum, dtype, finite_shift } => {
                    self.acc_finish(*max, ReduceOp::Max, *dtype, *max);
                    let f = if *finite_shift { "coil_online_sum_finite" } else { "coil_online_sum" };
                    let value = ops::convert(&format!("{f}(acc{max}, acc{sum})"), DType::F64, *dtype);
                    self.line(&format!("{} tmp{sum} = {value};", ops::compute_type(*dtype)));
                }
                TileStmt::RLoop(body) if body.iter().any(|s| matches!(s, TileStmt::AccUpdateOnlineSoftmax { .. })) => {
                    self.online_rloop(body)
                }
                TileStmt::RLoop(body) => {
                    self.line(&format!("for (int64_t rindex = 0; rindex < {}; rindex++) {{", self.rnumel.to_c()));
                    self.indent += 1;
                    self.in_loop = true;
                    self.stmts(body);
                    self.in_loop = false;
                    self.indent -= 1;
                    self.line("}");
                }
            }
        }
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
        for p in pieces {
            match p {
                Piece::Scalar(s) => self.simple(s),
                Piece::Loop(stmts) => self.persistent_loop(&stmts),
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
        self.line(&format!("for (int64_t rindex = 0; rindex < {}; rindex++) {{", self.rnumel.to_c()));
        self.indent += 1;
        self.in_loop = true;
        for s in stmts {
            match s {
                TileStmt::Reduce { var, op, source, .. } => self.acc_update(*var, *op, *source),
                _ => self.simple(s),
            }
        }
        self.in_loop = false;
        self.indent -= 1;
        self.line("}");
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
                let rhs = self.op_expr(op, *dtype);
                if self.in_loop && self.arrays.contains(var) {
                    self.line(&format!("tmp{var}[rindex] = {rhs};"));
                } else {
                    self.line(&format!("{} tmp{var} = {rhs};", ops::compute_type(*dtype)));
                }
            }
            TileStmt::Store { arg, index, value, .. } => {
                let a = &self.k.args[*arg];
                let v = ops::store_value(&self.r(*value), self.dtype(*value), a.dtype);
                self.line(&format!("{}[{}] = {v};", a.name, index.to_c()));
            }
            _ => unreachable!("not a simple statement"),
        }
    }

    /// The C expression of `op`, a value of `out`.
    fn op_expr(&self, op: &TileOp, out: DType) -> String {
        let arg = |i: usize| (&self.k.args[i].name, self.k.args[i].dtype);
        match op {
            TileOp::Load { arg: i, index } => {
                let (p, d) = arg(*i);
                ops::load(p, &index.to_c(), d, out)
            }
            TileOp::MaskedLoad { arg: i, index, mask, other } => {
                let (p, d) = arg(*i);
                // The conditional never evaluates the load where the mask is off.
                format!("{} ? {} : {}", self.r(*mask), ops::load(p, &index.to_c(), d, out), ops::literal(*other, out))
            }
            TileOp::IndirectLoad { arg: i, index, indirect, stride, bound } => {
                let (p, d) = arg(*i);
                let v = self.r(*indirect);
                let at = format!("({}) + ({})*{v}", index.to_c(), stride.to_c());
                let bound = bound.to_c();
                format!(
                    "(0 <= {v} && {v} < {bound}) ? {} : coil_index_error(status, {v}, {bound})",
                    ops::load(p, &at, d, out)
                )
            }
            TileOp::Constant(c) => ops::literal(*c, out),
            TileOp::Index(e) => ops::convert(&format!("(int64_t)({})", e.to_c()), DType::I64, out),
            TileOp::Rand { dist, stream, counter } => {
                let f = if *dist == RandDist::Normal { "coil_rand_normal" } else { "coil_rand_uniform" };
                let (seed, offset) = (philox::seed_name(*stream), philox::offset_name(*stream));
                // unsigned: the counter wraps modulo 2^64, as the definition says
                let call = format!("{f}({seed}, {offset} + (uint64_t)({}))", counter.to_c());
                ops::convert(&call, DType::F64, out)
            }
            TileOp::Unary(u, a) => ops::unary(*u, &self.r(*a), self.dtype(*a), out),
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

    /// Declares the accumulator of a reduction with result dtype `out`.
    fn acc_init(&mut self, acc: Var, op: ReduceOp, out: DType) {
        let src = self.source_dtype(acc);
        let (t, init) = match op {
            ReduceOp::Sum | ReduceOp::Prod if out.is_float() => {
                ("double", if op == ReduceOp::Sum { "0.0" } else { "1.0" })
            }
            ReduceOp::Sum | ReduceOp::Prod => ("int64_t", if op == ReduceOp::Sum { "0" } else { "1" }),
            _ if src.is_float() => {
                let max = matches!(op, ReduceOp::Max | ReduceOp::ArgMax);
                (ops::compute_type(src), if max { "-INFINITY" } else { "INFINITY" })
            }
            _ => ("int64_t", if matches!(op, ReduceOp::Max | ReduceOp::ArgMax) { "INT64_MIN" } else { "INT64_MAX" }),
        };
        self.line(&format!("{t} acc{acc} = {init};"));
        if op.is_arg() {
            self.line(&format!("int64_t acc{acc}_index = 0;"));
        }
    }

    /// Folds `value` (the element at `rindex`) into the accumulator.
    fn acc_update(&mut self, acc: Var, op: ReduceOp, value: Var) {
        let (src, v) = (self.dtype(value), self.r(value));
        let out = self.dtype(acc);
        let line = match op {
            ReduceOp::Sum if out.is_float() => format!("acc{acc} += {};", ops::convert(&v, src, DType::F64)),
            ReduceOp::Prod if out.is_float() => format!("acc{acc} *= {};", ops::convert(&v, src, DType::F64)),
            ReduceOp::Sum => format!("acc{acc} = coil_wadd(acc{acc}, {});", ops::convert(&v, src, DType::I64)),
            ReduceOp::Prod => format!("acc{acc} = coil_wmul(acc{acc}, {});", ops::convert(&v, src, DType::I64)),
            ReduceOp::Max | ReduceOp::Min if src.is_float() => {
                let f = if op == ReduceOp::Max { "coil_maximum" } else { "coil_minimum" };
                let s = if src == DType::F64 { "_f64" } else { "_f32" };
                format!("acc{acc} = {f}{s}(acc{acc}, {v});")
            }
            ReduceOp::Max => format!("acc{acc} = {v} > acc{acc} ? {v} : acc{acc};"),
            ReduceOp::Min => format!("acc{acc} = {v} < acc{acc} ? {v} : acc{acc};"),
            ReduceOp::ArgMax | ReduceOp::ArgMin => {
                let cmp = if op == ReduceOp::ArgMax { ">" } else { "<" };
                // Strict comparison keeps the first best index; the first NaN wins for good.
                let better = if src.is_float() {
                    format!("!isnan(acc{acc}) && (isnan({v}) || {v} {cmp} acc{acc})")
                } else {
                    format!("{v} {cmp} acc{acc}")
                };
                format!("if ({better}) {{ acc{acc} = {v}; acc{acc}_index = rindex; }}")
            }
        };
        self.line(&line);
    }

    /// Defines `tmp<var>`, the finished reduction of accumulator `acc`.
    fn acc_finish(&mut self, var: Var, op: ReduceOp, out: DType, acc: Var) {
        let src = self.source_dtype(acc);
        let value = match op {
            ReduceOp::Sum | ReduceOp::Prod if out.is_float() => ops::convert(&format!("acc{acc}"), DType::F64, out),
            ReduceOp::Sum | ReduceOp::Prod => ops::convert(&format!("acc{acc}"), DType::I64, out),
            ReduceOp::Max | ReduceOp::Min if src.is_float() => ops::convert(&format!("acc{acc}"), src, out),
            ReduceOp::Max | ReduceOp::Min => ops::convert(&format!("acc{acc}"), DType::I64, out),
            ReduceOp::ArgMax | ReduceOp::ArgMin => ops::convert(&format!("acc{acc}_index"), DType::I64, out),
        };
        self.line(&format!("{} tmp{var} = {value};", ops::compute_type(out)));
    }
}

#[cfg(test)]
mod tests;
