//! The kernel emitter: one tile kernel to one `__global__` function (see the module docs of
//! [`super`] for the code shapes).
//!
//! Variables keep the tile IR's numbers, as in the C backend: `tmpN` is a value, `accN` the
//! per-thread accumulator of reduction `tmpN`, `redN` its row-wide result, `wN` the elements of
//! the vector load of `tmpN`, `sN` those of a vector store. Scalar expressions come from the C
//! backend's `ops`, so both backends compute alike.

use super::launch::{Plan, MAX_ACCESS_BYTES};
use super::ops;
use coil_ir::kernel::{flat_stmts, rindex, xindex, Dims, KernelKind, TileKernel, TileOp, TileStmt, Var};
use coil_ir::op::RandDist;
use coil_ir::philox;
use coil_ir::sym::{Expr, ExprKind};
use coil_ir::{BinaryOp, DType, ReduceOp, UnaryOp};
use indexmap::{IndexMap, IndexSet};
use std::fmt::Write;

/// The element to store for a value `e` of `val` into a buffer of `buf`: [`ops::store_value`],
/// except that an f32 (or f16/bf16 compute) value goes into an f16/bf16 buffer with one
/// rounding (`coil_f32_to_bf16(x)` is `coil_f32_to_bf16(coil_round_bf16(x))`, NaN included).
fn store_value(e: &str, val: DType, buf: DType) -> String {
    match buf {
        DType::F16 | DType::BF16 if matches!(val, DType::F32 | DType::F16 | DType::BF16) => {
            let f = if buf == DType::F16 { "coil_f32_to_f16" } else { "coil_f32_to_bf16" };
            format!("{f}({e})")
        }
        _ => ops::store_value(e, val, buf),
    }
}

/// Whether a vector store of pieces of `piece` elements of a value of `val` into a buffer of
/// `buf` keeps the values in f32 and rounds them in pairs at the store (`coil_store_bf16`,
/// `coil_store_f16`: one `cvt.rn.*x2.f32` per pair), with the same bits as [`store_value`].
fn packed_store(piece: usize, val: DType, buf: DType) -> bool {
    piece >= 2 && matches!(buf, DType::F16 | DType::BF16) && matches!(val, DType::F32 | DType::F16 | DType::BF16)
}

/// Whether `e` is a multiple of `n` for every binding (from its canonical form).
pub(super) fn divisible(e: Expr, n: i64) -> bool {
    if n == 1 || e.modulo(n).const_value() == Some(0) {
        return true;
    }
    match &*e.kind() {
        ExprKind::Const(c) => c % n == 0,
        ExprKind::Mul { coeff, .. } => coeff % n == 0,
        ExprKind::Add { terms, constant } => {
            constant % n == 0 && terms.iter().all(|&(t, c)| c % n == 0 || divisible(t, n))
        }
        _ => false,
    }
}

/// The largest magnitude any step of evaluating `e` in C can reach (each symbol at its bounds),
/// or `None` when a symbol is unbounded.
fn magnitude(e: Expr) -> Option<i128> {
    Some(match &*e.kind() {
        ExprKind::Const(c) => i128::from(*c).abs(),
        ExprKind::Symbol(_) => {
            let (lo, hi) = e.bounds();
            i128::from(lo?).abs().max(i128::from(hi?).abs())
        }
        // Partial sums are at most the sum of the terms' magnitudes.
        ExprKind::Add { terms, constant } => {
            let mut m = i128::from(*constant).abs();
            for &(t, c) in terms {
                m = m.saturating_add(magnitude(t)?.saturating_mul(i128::from(c).abs()));
            }
            m
        }
        // Factors count at least 1, so partial products are at most the whole.
        ExprKind::Mul { coeff, factors } => {
            let mut m = i128::from(*coeff).abs().max(1);
            for &f in factors {
                m = m.saturating_mul(magnitude(f)?.max(1));
            }
            m
        }
        ExprKind::FloorDiv(a, b) | ExprKind::Mod(a, b) | ExprKind::Min(a, b) | ExprKind::Max(a, b) => {
            magnitude(*a)?.max(magnitude(*b)?)
        }
    })
}

/// The C type of the kernel's index variables and index arithmetic: `int` when every index
/// expression (every step of it) and the loop counters fit in 32 bits, else `int64_t`.
/// GPUs have 32-bit integer units: 64-bit multiplies take several instructions, and 64-bit
/// division and remainder are emulated (a call of dozens of instructions), so a kernel such as
/// a bias broadcast paid more in index arithmetic than in memory traffic. Decided per kernel
/// from its static sizes; data-dependent (indirect) offsets stay 64-bit regardless, since the
/// loaded index is an `int64_t`. A kernel of symbolic sizes is 64-bit throughout (its size
/// symbols have no upper bound).
pub(super) fn index_type(k: &TileKernel) -> &'static str {
    let (Some(xnumel), Some(rnumel)) = (k.xnumel.const_value(), k.rnumel.map_or(Some(1), |r| r.const_value())) else {
        return "int64_t";
    };
    // Grid-stride counters reach below `2 * count + block`: keep a wide margin.
    let counters = i128::from(xnumel.max(1)) * i128::from(rnumel.max(1)) * 2 + (1 << 20);
    let mut exprs = vec![xindex(&k.xnumel)];
    if let Some(r) = k.rnumel {
        exprs.push(rindex(&r));
    }
    for s in flat_stmts(&k.body) {
        match s {
            TileStmt::Let { op, .. } => match op {
                TileOp::Load { index, .. } | TileOp::MaskedLoad { index, .. } | TileOp::Index(index) => {
                    exprs.push(*index)
                }
                TileOp::IndirectLoad { index, stride, bound, .. } => exprs.extend([*index, *stride, *bound]),
                TileOp::Rand { counter, .. } => exprs.push(*counter),
                _ => {}
            },
            TileStmt::Store { index, .. } => exprs.push(*index),
            TileStmt::Window { stride, size, bound, .. } => exprs.extend([*stride, *size, *bound]),
            _ => {}
        }
    }
    let limit = i128::from(i32::MAX);
    let fits = counters <= limit && exprs.into_iter().all(|e| magnitude(e).is_some_and(|m| m <= limit));
    if fits {
        "int"
    } else {
        "int64_t"
    }
}

/// How the elements of a thread's group reach a buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// The same element for the whole group.
    Uniform,
    /// Consecutive elements from an offset that is a multiple of `piece`: vector accesses.
    Vector { piece: usize },
    /// Anything else: one access per element.
    Scalar,
}

/// A thread's group of `vec` consecutive positions along the fast index (`xindex` of a
/// pointwise kernel, `rindex` of a reduction): position `vec * group + i`.
#[derive(Clone)]
pub(super) struct Group {
    pub(super) fast: Expr,
    /// `vec * group + i`, and `vec * group` (the first element).
    pub(super) pos: Expr,
    pub(super) base: Expr,
    pub(super) i: Expr,
    pub(super) vec: usize,
    /// How the element loop indexes per-thread arrays (persistent values read by later passes).
    arr: String,
    /// Other index variables fixed for the whole group (a column plan's group of outputs is
    /// at one reduced position: `rindex -> rchunk`).
    fixed: IndexMap<Expr, Expr>,
}

impl Group {
    /// `groups` full groups (at least one, or symbolic): the substitution
    /// `fast -> vec * group + i` respects `fast`'s range.
    pub(super) fn new(fast: Expr, group: &str, groups: Expr, vec: usize, arr: &str) -> Group {
        let g = Expr::index_upto(group, groups);
        // A group of one needs no `i` in its indices.
        let i = if vec > 1 { Expr::index("i", vec as i64) } else { Expr::int(0) };
        let base = g * vec as i64;
        Group { fast, pos: base + i, base, i, vec, arr: arr.to_string(), fixed: IndexMap::new() }
    }

    /// The same group with `var` replaced by `value` in every index.
    pub(super) fn fixing(mut self, var: Expr, value: Expr) -> Group {
        self.fixed.insert(var, value);
        self
    }

    pub(super) fn at(&self, index: Expr, p: Expr) -> Expr {
        let mut map = self.fixed.clone();
        map.insert(self.fast, p);
        index.substitute(&map)
    }

    /// `index` at the group's element `base + i` as `(e0, c)`: `e0 + c*i` for every `i` in
    /// `0..vec`, `e0` free of `i`. Beyond sums and multiples this sees through `% m` and
    /// `// m` when `vec` divides `m` and the operand is `a0 + i` with `vec | a0`: then `a0`
    /// and `a0 + i` lie in the same block of `m`, so `(a0 + i) % m = a0 % m + i` and
    /// `(a0 + i) // m = a0 // m`. That makes a broadcast operand such as a bias
    /// (`b[xindex % 8192]`) one vector load per group, a per-row value (`mean[xindex // n]`)
    /// uniform, and leaves no `% m` inside the element loop: `e0` is computed once per group
    /// (the unrolled loop only adds `i`), where `(8*xvec + i) % 8192` cost one 64-bit
    /// remainder per element. `None` when the index is not of that form.
    pub(super) fn peel(&self, index: Expr) -> Option<(Expr, i64)> {
        self.peel_at(self.at(index, self.pos))
    }

    fn peel_at(&self, e: Expr) -> Option<(Expr, i64)> {
        if self.vec == 1 || !e.free_symbols().contains(&self.i) {
            return Some((e, 0));
        }
        if e == self.i {
            return Some((Expr::int(0), 1));
        }
        let v = self.vec as i64;
        match &*e.kind() {
            ExprKind::Add { terms, constant } => {
                let (mut e0, mut c) = (Expr::int(*constant), 0);
                for &(t, k) in terms {
                    let (t0, ct) = self.peel_at(t)?;
                    e0 = e0 + t0 * k;
                    c += ct * k;
                }
                Some((e0, c))
            }
            ExprKind::Mul { coeff, factors } if factors.len() == 1 => {
                let (f0, cf) = self.peel_at(factors[0])?;
                Some((f0 * *coeff, cf * coeff))
            }
            ExprKind::Mod(a, m) | ExprKind::FloorDiv(a, m) => {
                let m = m.const_value().filter(|&m| m > 0 && m % v == 0)?;
                let (a0, ca) = self.peel_at(*a)?;
                if ca != 1 || !divisible(a0, v) {
                    return None;
                }
                Some(match &*e.kind() {
                    ExprKind::Mod(..) => (a0.modulo(m), 1),
                    _ => (a0.floor_div(m), 0),
                })
            }
            _ => None,
        }
    }

    pub(super) fn access(&self, index: Expr, dtype: DType) -> Access {
        let piece = self.vec.min((MAX_ACCESS_BYTES / dtype.size_bytes()).max(1));
        match self.peel(index) {
            Some((_, 0)) => Access::Uniform,
            Some((e0, 1)) if self.vec > 1 && divisible(e0, piece as i64) => Access::Vector { piece },
            _ => Access::Scalar,
        }
    }
}

/// What both CUDA emitters know of a kernel's values, from one walk of its body.
pub(super) struct KernelFacts {
    pub(super) dtypes: IndexMap<Var, DType>,
    /// The value each accumulator folds.
    pub(super) acc_source: IndexMap<Var, Var>,
    /// Float constants equal to 2 (`pow(x, 2)` is `x * x`).
    pub(super) twos: IndexSet<Var>,
    /// Float constants equal to 1, and `tanh(z)` values by their `z` (computed in f32):
    /// `tanh(z) + 1` becomes `coil_one_plus_tanh(z)` (see [`fast_one_plus_tanh`]).
    pub(super) ones: IndexSet<Var>,
    pub(super) tanh_of: IndexMap<Var, Var>,
    /// f32 values that divide f32 values into f32 quotients. Where such a value is defined
    /// outside a group's elements (a row's sum, a group's uniform load), the PTX emitter takes
    /// its reciprocal once and multiplies: within 1 ulp (`div.full` is within 2),
    /// and the driver assembled the cluster softmax (64 `div.full`s of one divisor per thread)
    /// in 70 ms instead of 98 (H100 machine).
    pub(super) divisors: IndexSet<Var>,
    /// Values of `Constant` lets, so that a literal divisor's reciprocal is folded.
    pub(super) constants: IndexMap<Var, f64>,
    /// The stride of each argument written through a window ([`TileStmt::Window`]): its
    /// pointer moves by a multiple of it at run time.
    pub(super) windows: IndexMap<usize, Expr>,
}

impl KernelFacts {
    pub(super) fn new(k: &TileKernel) -> KernelFacts {
        let mut dtypes = IndexMap::new();
        let mut acc_source = IndexMap::new();
        let (mut twos, mut ones, mut tanh_of) = (IndexSet::new(), IndexSet::new(), IndexMap::new());
        let (mut divisors, mut constants) = (IndexSet::new(), IndexMap::new());
        let mut windows = IndexMap::new();
        for s in flat_stmts(&k.body) {
            match s {
                TileStmt::Window { arg, stride, .. } => _ = windows.insert(*arg, *stride),
                TileStmt::Let { var, dtype, op, .. } => {
                    dtypes.insert(*var, *dtype);
                    if let TileOp::Constant(c) = op {
                        constants.insert(*var, c.as_f64());
                    }
                    match op {
                        TileOp::Constant(c) if c.as_f64() == 2.0 => _ = twos.insert(*var),
                        TileOp::Constant(c) if c.as_f64() == 1.0 => _ = ones.insert(*var),
                        TileOp::Unary(UnaryOp::Tanh, z)
                            if single_float(*dtype) && dtypes.get(z).is_some_and(|d| single_float(*d)) =>
                        {
                            _ = tanh_of.insert(*var, *z)
                        }
                        TileOp::Binary(BinaryOp::Div, x, y)
                            if *dtype == DType::F32
                                && dtypes.get(x).is_some_and(|d| single_float(*d))
                                && dtypes.get(y) == Some(&DType::F32) =>
                        {
                            _ = divisors.insert(*y)
                        }
                        _ => {}
                    }
                }
                TileStmt::Reduce { var, dtype, source, .. } => {
                    dtypes.insert(*var, *dtype);
                    if k.kind == KernelKind::PersistentReduction {
                        acc_source.insert(*var, *source);
                    }
                }
                TileStmt::AccInit { acc, dtype, .. } => _ = dtypes.entry(*acc).or_insert(*dtype),
                TileStmt::AccUpdate { acc, value, .. } => {
                    acc_source.insert(*acc, *value);
                }
                TileStmt::AccUpdateOnlineSoftmax { max_acc, sum_acc, value } => {
                    acc_source.insert(*max_acc, *value);
                    acc_source.insert(*sum_acc, *value);
                }
                TileStmt::ReduceOnlineSoftmax { max, sum, dtype, .. } => {
                    dtypes.insert(*max, *dtype);
                    dtypes.insert(*sum, *dtype);
                }
                _ => {}
            }
        }
        KernelFacts { dtypes, acc_source, twos, ones, tanh_of, divisors, constants, windows }
    }

    /// `access` of argument `arg`, unless it is a vector access through a window whose stride
    /// is no multiple of the pieces: the moved pointer keeps only the stride's alignment (a
    /// cache row of 64 elements moves by whole 16-byte pieces, one of 5 would not).
    pub(super) fn window_aligned(&self, arg: usize, access: Access) -> Access {
        match (access, self.windows.get(&arg)) {
            (Access::Vector { piece }, Some(&stride)) if !divisible(stride, piece as i64) => Access::Scalar,
            (a, _) => a,
        }
    }

    /// The `z` of `x + y` (a value of `out`) when it is `1 + tanh(z)` computed in f32.
    pub(super) fn one_plus_tanh(&self, x: Var, y: Var, out: DType) -> Option<Var> {
        if !single_float(out) || !fast_one_plus_tanh() {
            return None;
        }
        match (self.tanh_of.get(&x), self.tanh_of.get(&y)) {
            (Some(z), _) if self.ones.contains(&y) => Some(*z),
            (_, Some(z)) if self.ones.contains(&x) => Some(*z),
            _ => None,
        }
    }
}

/// The emitter of one kernel.
pub(super) struct Gen<'a> {
    k: &'a TileKernel,
    plan: Plan,
    /// Outputs (or rows) and the row length (1 for a pointwise kernel): constants, or
    /// expressions of the kernel's size parameters.
    xnumel: Expr,
    rnumel: Expr,
    /// The prefix of the arrays of vector stores: `s` (`s4`), or `st` in a kernel with size
    /// parameters, which are named `s0, s1, ...`.
    st: &'static str,
    pub(super) out: String,
    indent: usize,
    /// The kernel's values: dtypes, accumulators' sources, the fast-path patterns.
    facts: KernelFacts,
    /// Persistent `XR` values read by a later pass: per-thread arrays indexed by `Group::arr`.
    arrays: IndexSet<Var>,
    /// Pointwise values that are the same for a whole group: computed once per group.
    uniform: IndexSet<Var>,
    /// Inside a group: how indices map.
    group: Option<Group>,
    /// How the current statement indexes its accumulators: `None` for scalars, `Some("i")`
    /// where each thread folds one per output of its column group ([`Plan::col_vec`]).
    pub(super) acc_at: Option<&'static str>,
    /// Inside `column_vectors`' epilogue: each thread computes and stores one output of its
    /// own (row values are otherwise stored by the row's first thread only).
    pub(super) own_output: bool,
    /// Per argument, the alignment in bytes its vector accesses need (checked at run time).
    align: IndexMap<usize, usize>,
    /// The type of index variables and arithmetic ([`index_type`]).
    pub(super) it: &'static str,
}

impl<'a> Gen<'a> {
    pub(super) fn new(k: &'a TileKernel, plan: Plan) -> Gen<'a> {
        Gen {
            k,
            plan,
            xnumel: k.xnumel,
            rnumel: k.rnumel.unwrap_or(Expr::int(1)),
            st: if k.sizes.is_empty() { "s" } else { "st" },
            out: String::new(),
            indent: 0,
            facts: KernelFacts::new(k),
            arrays: IndexSet::new(),
            uniform: IndexSet::new(),
            group: None,
            acc_at: None,
            own_output: false,
            align: IndexMap::new(),
            it: index_type(k),
        }
    }

    fn line(&mut self, text: &str) {
        let _ = writeln!(self.out, "{:w$}{text}", "", w = self.indent * 4);
    }

    fn open(&mut self, text: &str) {
        self.line(text);
        self.indent += 1;
    }

    fn close(&mut self) {
        self.indent -= 1;
        self.line("}");
    }

    /// Opens the grid-stride loop `for (var = first; var < count; var += step)`, where one
    /// stride covers `per_step` values. When the grid covers all `count` at once (a constant
    /// count, a known grid) the loop would run once: the body opens as a block instead (behind
    /// `var < count` unless the cover is exact), which spares NVVM its loop passes (the layer
    /// norm's NVRTC time: 78 -> 63 ms on the build machine, same code after ptxas).
    pub(super) fn open_grid_loop(&mut self, var: &str, first: &str, count: (&Expr, &str), step: &str, per_step: u64) {
        let (it, (count, count_c)) = (self.it, count);
        let covered = count.const_value().filter(|&c| self.plan.launch.grid > 0 && per_step as i64 >= c);
        match covered {
            Some(c) => {
                self.line(&format!("const {it} {var} = {first};"));
                if per_step as i64 == c {
                    self.open("{");
                } else {
                    self.open(&format!("if ({var} < {count_c}) {{"));
                }
            }
            None => self.open(&format!("for ({it} {var} = {first}; {var} < {count_c}; {var} += {step}) {{")),
        }
    }

    fn dtype(&self, v: Var) -> DType {
        self.facts.dtypes[&v]
    }

    /// How the current statement reads `v`.
    fn r(&self, v: Var) -> String {
        match &self.group {
            Some(g) if self.arrays.contains(&v) => format!("tmp{v}[{}]", g.arr),
            _ => format!("tmp{v}"),
        }
    }

    /// An index expression as C; inside a group, in terms of the group's symbols, as
    /// `e0 + c*i` where [`Group::peel`] finds that form (the compiler hoists `e0` out of the
    /// unrolled element loop).
    fn index_c(&self, e: Expr) -> String {
        match &self.group {
            Some(g) => match g.peel(e) {
                Some((e0, c)) => (e0 + g.i * c).to_c(),
                None => g.at(e, g.pos).to_c(),
            },
            None => e.to_c(),
        }
    }

    /// The offset of a vector access: its index at the group's first element.
    fn base_c(&self, e: Expr) -> String {
        let g = self.group.as_ref().expect("a vector access inside a group");
        g.peel(e).map_or_else(|| g.at(e, g.base), |(e0, _)| e0).to_c()
    }

    fn access(&self, index: Expr, arg: usize) -> Access {
        let access = self.group.as_ref().map_or(Access::Scalar, |g| g.access(index, self.k.args[arg].dtype));
        self.facts.window_aligned(arg, access)
    }

    /// `(arg, index, piece)` of a vector load or store.
    fn vector_access(&self, s: &TileStmt) -> Option<(usize, Expr, usize)> {
        let (arg, index) = match s {
            TileStmt::Let { op: TileOp::Load { arg, index }, .. } | TileStmt::Store { arg, index, .. } => {
                (*arg, *index)
            }
            _ => return None,
        };
        match self.access(index, arg) {
            Access::Vector { piece } => Some((arg, index, piece)),
            _ => None,
        }
    }

    /// Records the alignment the vector accesses among `stmts` need.
    fn note_alignment(&mut self, stmts: &[&TileStmt]) {
        for s in stmts {
            if let Some((arg, _, piece)) = self.vector_access(s) {
                let bytes = piece * self.k.args[arg].dtype.size_bytes();
                let e = self.align.entry(arg).or_insert(1);
                *e = (*e).max(bytes);
            }
        }
    }

    /// `const bool aligned = ...;`: whether every vector-accessed buffer is aligned enough.
    fn alignment_check(&mut self) {
        if self.align.is_empty() {
            return;
        }
        // The runtime passes allocation starts only, 16-byte aligned (it checks each launch):
        // the element-by-element fallback of the vector accesses is dead code, left out by
        // NVRTC (a smaller kernel, a quicker compile).
        let most = self.align.values().max().copied().unwrap_or(1);
        self.line(&format!("/* vector accesses of up to {most} bytes: every buffer is 16-byte aligned */"));
        self.line("const bool aligned = true;");
    }

    pub(super) fn kernel(&mut self) {
        let (k, p) = (self.k, self.plan);
        let mut header = format!("/* {}: {}, xnumel = {}", k.name, k.kind.name(), self.xnumel);
        if k.rnumel.is_some() {
            let _ = write!(header, ", rnumel = {}", self.rnumel);
        }
        if self.xnumel.const_value().is_some() {
            let _ = write!(header, "; grid {}", p.launch.grid);
        } else {
            let _ = write!(header, "; grid ceil(xnumel / {})", p.launch.per_block);
        }
        let _ = write!(header, " x block {}; groups of {}", p.launch.block, p.vec);
        if p.cluster > 1 {
            let _ = write!(header, ", clusters of {} blocks, {} threads per row", p.cluster, p.row_threads());
        } else if k.kind != KernelKind::Pointwise {
            let _ = write!(header, ", {} threads per row", p.lanes);
        }
        if p.col_vec > 1 {
            let _ = write!(header, ", {} outputs per thread", p.col_vec);
        }
        self.line(&(header + " */"));
        let mut params: Vec<String> = (k.args.iter())
            .map(|a| format!("{}{} *{}", if a.written { "" } else { "const " }, ops::storage_type(a.dtype), a.name))
            .collect();
        params.extend(k.sizes.iter().map(|s| format!("int64_t {}", s.to_c())));
        for &stream in &k.random {
            params.push(format!("uint64_t {}, uint64_t {}", philox::seed_name(stream), philox::offset_name(stream)));
        }
        params.push("int64_t *status".into());
        let bounds = match min_blocks_override() {
            Some(m) if k.kind != KernelKind::Pointwise => format!("{}, {m}", p.launch.block),
            _ => p.launch.block.to_string(),
        };
        let cluster = match p.cluster {
            1 => String::new(),
            c => format!("__cluster_dims__({c}, 1, 1) "),
        };
        let head = format!("extern \"C\" __global__ void {cluster}__launch_bounds__({bounds}) {}", k.name);
        self.line(&format!("{head}({})", params.join(", ")));
        self.open("{");
        self.line("(void)status;");
        // As the PTX kernels: a programmatic dependent on sm_90 and newer
        // (`GpuTarget::programmatic_launch`) lets the next grid start and waits for the one
        // before it here, before any memory access.
        self.line("#if __CUDA_ARCH__ >= 900");
        self.line("asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\");");
        self.line("asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");");
        self.line("#endif");
        self.line(&format!("const {} xnumel = {};", self.it, self.xnumel.to_c()));
        match k.kind {
            KernelKind::Pointwise => self.pointwise(),
            _ => self.reduction(),
        }
        self.close();
    }

    /// A grid-stride loop over groups of `vec` outputs: full groups take the vector path,
    /// the last partial one goes element by element. With a symbolic `xnumel`, whether there
    /// are full groups and a partial one is decided at run time (`xvec < full`).
    fn pointwise(&mut self) {
        let vec = self.plan.vec as i64;
        let k = self.k;
        let prologue = k.window_prologue();
        let body: Vec<&TileStmt> = k.body[prologue..].iter().collect();
        let (groups, full) = ((self.xnumel + (vec - 1)).floor_div(vec), self.xnumel.floor_div(vec));
        // Provably none / provably all: nothing to decide at run time.
        let some_full = full != Expr::int(0);
        let partial = full != groups;
        let full_c = full.to_c();
        if some_full {
            self.group = Some(Group::new(xindex(&k.xnumel), "xvec", full, vec as usize, "i"));
            self.note_alignment(&body);
            // (the prologue's values are uniform too, and so may be what derives from them)
            self.find_uniform(&k.body.iter().collect::<Vec<_>>());
        }
        self.alignment_check();
        // The window prologue: once per thread, before its groups (the windows' pointers
        // moved, so that the stores are plain ones).
        let group = self.group.take();
        for (i, s) in k.body[..prologue].iter().enumerate() {
            match s {
                TileStmt::Window { arg, offset, stride, size, bound } => {
                    if k.window_needs_check(i) {
                        self.window_check(*offset, *size, *bound);
                    }
                    let (p, name) = (self.r(*offset), &k.args[*arg].name);
                    self.line(&format!("{name} += ({})*{p};", stride.to_c()));
                }
                s => self.stmt(s),
            }
        }
        self.group = group;
        let it = self.it;
        let per_step = self.plan.launch.grid as u64 * self.plan.launch.block as u64;
        self.open_grid_loop(
            "xvec",
            &format!("({it})blockIdx.x * blockDim.x + threadIdx.x"),
            (&groups, &groups.to_c()),
            &format!("({it})gridDim.x * blockDim.x"),
            per_step,
        );
        if some_full {
            if partial {
                self.open(&format!("if (xvec < {full_c}) {{"));
            }
            self.line(&format!("/* a full group: xindex = {vec}*xvec + i */"));
            let (uniform, rest): (Vec<&TileStmt>, Vec<&TileStmt>) = body.iter().partition(|s| self.is_uniform(s));
            for s in uniform {
                self.stmt(s);
            }
            self.group_body(&rest);
            self.group = None;
            if partial {
                self.indent -= 1;
                self.open("} else {");
            }
        }
        if partial {
            self.line("/* the last, partial group: element by element */");
            self.open(&format!("for (int i = 0; i < {vec}; i++) {{"));
            self.line(&format!("const {} xindex = {vec} * xvec + i;", self.it));
            self.line("if (xindex >= xnumel) break;");
            for s in &body {
                self.stmt(s);
            }
            self.close();
            if some_full {
                self.close();
            }
        }
        self.close();
    }

    /// A window's check ([`TileStmt::Window`]): out of range, the launch's first thread
    /// records the error at the first position outside, and every thread returns before it
    /// stores anything (they all see the same offset).
    fn window_check(&mut self, offset: Var, size: Expr, bound: Expr) {
        let (p, size, bound) = (self.r(offset), size.to_c(), bound.to_c());
        self.open(&format!("if ({p} < 0 || {p} > ({bound}) - ({size})) {{"));
        let first = format!("{p} < 0 || {p} > ({bound}) ? {p} : ({bound})");
        self.line(&format!("if (blockIdx.x == 0 && threadIdx.x == 0) coil_fail(status, 1, {first}, {bound});"));
        self.line("return;");
        self.close();
    }

    /// Pointwise values the same for every element of a group ([`uniform_values`]).
    fn find_uniform(&mut self, body: &[&TileStmt]) {
        let g = self.group.as_ref().expect("inside a group");
        self.uniform = uniform_values(g, body);
    }

    fn is_uniform(&self, s: &TileStmt) -> bool {
        matches!(s, TileStmt::Let { var, .. } if self.uniform.contains(var))
    }

    /// One group of elements: its vector loads, all issued before any use so that they are in
    /// flight together; the element loop over `i`; then its vector stores.
    fn group_body(&mut self, stmts: &[&TileStmt]) {
        let vec = self.group.as_ref().expect("inside a group").vec;
        let mut stores = Vec::new();
        for (n, s) in stmts.iter().enumerate() {
            // An online softmax folds the group's values at once: one rescale per group, and
            // independent exponentials.
            if let TileStmt::AccUpdateOnlineSoftmax { max_acc: m, sum_acc: a, value } = s {
                let t = ops::compute_type(self.dtype(*value));
                self.line(&format!("{t} ox{m}[{vec}];"));
                stores.push(format!("coil_online_group<{t}, {vec}>(acc{m}, acc{a}, ox{m});"));
            }
            let Some((arg, index, piece)) = self.vector_access(s) else { continue };
            let (name, t) = (&self.k.args[arg].name, ops::storage_type(self.k.args[arg].dtype));
            let at = self.base_c(index);
            match s {
                TileStmt::Let { var, .. } => self.line(&format!(
                    "const coil_elems<{t}, {vec}> w{var} = coil_load<{t}, {vec}, {piece}>({name} + ({at}), aligned);"
                )),
                TileStmt::Store { value, .. } if packed_store(piece, self.dtype(*value), self.k.args[arg].dtype) => {
                    let (kind, st) = (if self.k.args[arg].dtype == DType::F16 { "f16" } else { "bf16" }, self.st);
                    self.line(&format!("coil_elems<float, {vec}> {st}{n};"));
                    stores.push(format!("coil_store_{kind}<{vec}, {piece}>({name} + ({at}), {st}{n}, aligned);"));
                }
                _ => {
                    let st = self.st;
                    self.line(&format!("coil_elems<{t}, {vec}> {st}{n};"));
                    stores.push(format!("coil_store<{t}, {vec}, {piece}>({name} + ({at}), {st}{n}, aligned);"));
                }
            }
        }
        if vec > 1 {
            self.line("#pragma unroll");
        }
        self.open(&format!("for (int i = 0; i < {vec}; i++) {{"));
        for (n, s) in stmts.iter().enumerate() {
            match (s, self.vector_access(s)) {
                (TileStmt::Store { value, .. }, Some((arg, _, piece)))
                    if packed_store(piece, self.dtype(*value), self.k.args[arg].dtype) =>
                {
                    // the f32 value; `coil_store_bf16` / `_f16` round pairs of them
                    self.line(&format!("{}{n}.v[i] = {};", self.st, self.r(*value)));
                }
                (TileStmt::Store { value, .. }, Some((arg, ..))) => {
                    let v = store_value(&self.r(*value), self.dtype(*value), self.k.args[arg].dtype);
                    self.line(&format!("{}{n}.v[i] = {v};", self.st));
                }
                _ => self.stmt(s),
            }
        }
        self.close();
        for s in stores {
            self.line(&s);
        }
    }

    /// A statement at the current level (row, group or element).
    fn stmt(&mut self, s: &TileStmt) {
        match s {
            TileStmt::Window { .. } => unreachable!("a window outside the prologue"),
            TileStmt::Let { var, dtype, op, .. } => {
                let rhs = match self.vector_access(s) {
                    Some((arg, ..)) => ops::load(&format!("w{var}.v"), "i", self.k.args[arg].dtype, *dtype),
                    None => self.op_expr(op, *dtype),
                };
                if self.group.is_some() && self.arrays.contains(var) {
                    self.line(&format!("{} = {rhs};", self.r(*var)));
                } else {
                    self.line(&format!("const {} tmp{var} = {rhs};", ops::compute_type(*dtype)));
                }
            }
            TileStmt::Store { arg, index, value, dims } => {
                let a = &self.k.args[*arg];
                let v = store_value(&self.r(*value), self.dtype(*value), a.dtype);
                // A row's value is stored by the row's first thread only.
                let row = self.k.kind != KernelKind::Pointwise && *dims == Dims::X && !self.own_output;
                let guard = if row { "if (rlane == 0) " } else { "" };
                self.line(&format!("{guard}{}[{}] = {v};", a.name, self.index_c(*index)));
            }
            TileStmt::AccInit { acc, op, .. } => self.acc_init(*acc, *op),
            TileStmt::AccUpdate { acc, op, value } => self.acc_update(*acc, *op, *value),
            TileStmt::Reduce { var, op, dtype, source } if self.k.kind == KernelKind::LoopedReduction => {
                self.acc_finish(*var, *op, *dtype, *source)
            }
            TileStmt::Reduce { var, op, source, .. } => self.acc_update(*var, *op, *source),
            // inside a group (see `group_body`), which folds the values after the element loop
            TileStmt::AccUpdateOnlineSoftmax { max_acc, value, .. } => {
                self.line(&format!("ox{max_acc}[i] = {};", self.r(*value)))
            }
            TileStmt::ReduceOnlineSoftmax { max, sum, dtype, finite_shift } => {
                self.online_finish(*max, *sum, *dtype, *finite_shift)
            }
            TileStmt::RLoop(body) => self.rloop(body),
        }
    }

    /// The CUDA expression of `op`, a value of `out`.
    fn op_expr(&self, op: &TileOp, out: DType) -> String {
        let arg = |i: usize| (&self.k.args[i].name, self.k.args[i].dtype);
        match op {
            TileOp::Load { arg: i, index } => {
                let (p, d) = arg(*i);
                ops::load(p, &self.index_c(*index), d, out)
            }
            TileOp::MaskedLoad { arg: i, index, mask, other } => {
                let (p, d) = arg(*i);
                // The conditional never evaluates the load where the mask is off.
                let load = ops::load(p, &self.index_c(*index), d, out);
                format!("{} ? {load} : {}", self.r(*mask), ops::literal(*other, out))
            }
            TileOp::IndirectLoad { arg: i, index, indirect, stride, bound } => {
                let (p, d) = arg(*i);
                let v = self.r(*indirect);
                let at = format!("({}) + ({})*{v}", self.index_c(*index), stride.to_c());
                let bound = bound.to_c();
                format!(
                    "(0 <= {v} && {v} < {bound}) ? {} : coil_index_error(status, {v}, {bound})",
                    ops::load(p, &at, d, out)
                )
            }
            TileOp::Constant(c) => ops::literal(*c, out),
            TileOp::Index(e) => ops::convert(&format!("(int64_t)({})", self.index_c(*e)), DType::I64, out),
            TileOp::Rand { dist, stream, counter } => {
                let f = if *dist == RandDist::Normal { "coil_rand_normal" } else { "coil_rand_uniform" };
                let (seed, offset) = (philox::seed_name(*stream), philox::offset_name(*stream));
                // unsigned: the counter wraps modulo 2^64, as the definition says
                let e = format!("{f}({seed}, {offset} + (uint64_t)({}))", self.index_c(*counter));
                ops::convert(&e, DType::F64, out)
            }
            TileOp::Unary(UnaryOp::Exp, a) if out == DType::F32 && single_float(self.dtype(*a)) => {
                format!("coil_exp_f32({})", self.r(*a))
            }
            TileOp::Unary(UnaryOp::Rsqrt, a) if out == DType::F32 && single_float(self.dtype(*a)) => {
                format!("coil_rsqrt_f32({})", self.r(*a))
            }
            TileOp::Unary(u, a) => ops::unary(*u, &self.r(*a), self.dtype(*a), out),
            // pow(x, 2) is x * x: IEEE pow with exponent 2 is the correctly rounded square
            // (signed zeros, infinities and NaN included), which one multiply gives; CUDA's
            // powf is a long routine (and up to 2 ulp off).
            TileOp::Binary(BinaryOp::Pow, x, y) if out.is_float() && self.facts.twos.contains(y) => {
                let a = self.r(*x);
                ops::binary(BinaryOp::Mul, &a, self.dtype(*x), &a, self.dtype(*x), out)
            }
            TileOp::Binary(BinaryOp::Add, x, y) if single_float(out) && fast_one_plus_tanh() => {
                match self.facts.one_plus_tanh(*x, *y, out) {
                    Some(z) => ops::convert(&format!("coil_one_plus_tanh({})", self.r(z)), DType::F32, out),
                    None => ops::binary(BinaryOp::Add, &self.r(*x), self.dtype(*x), &self.r(*y), self.dtype(*y), out),
                }
            }
            TileOp::Binary(BinaryOp::Div, x, y)
                if single_float(out) && single_float(self.dtype(*x)) && single_float(self.dtype(*y)) =>
            {
                format!("coil_div_f32({}, {})", self.r(*x), self.r(*y))
            }
            TileOp::Binary(b, x, y) => ops::binary(*b, &self.r(*x), self.dtype(*x), &self.r(*y), self.dtype(*y), out),
            TileOp::Where(c, x, y) => {
                let x = ops::convert(&self.r(*x), self.dtype(*x), out);
                let y = ops::convert(&self.r(*y), self.dtype(*y), out);
                format!("{} ? {x} : {y}", self.r(*c))
            }
            TileOp::Cast(a) => ops::convert(&self.r(*a), self.dtype(*a), out),
        }
    }
}

/// The values of `body` that are the same for every element of group `g`: constants, broadcast
/// loads and what is computed from them only (computed once per group). Both CUDA emitters
/// use it.
pub(super) fn uniform_values(g: &Group, body: &[&TileStmt]) -> IndexSet<Var> {
    let mut uniform = IndexSet::new();
    for s in body {
        let TileStmt::Let { var, op, .. } = s else { continue };
        let same = |e: Expr| g.access(e, DType::I64) == Access::Uniform;
        let u = match op {
            TileOp::Constant(_) => true,
            TileOp::Load { index, .. } | TileOp::Index(index) => same(*index),
            TileOp::Rand { counter, .. } => same(*counter),
            TileOp::MaskedLoad { index, mask, .. } => same(*index) && uniform.contains(mask),
            TileOp::IndirectLoad { index, indirect, .. } => same(*index) && uniform.contains(indirect),
            _ => s.reads().iter().all(|v| uniform.contains(v)),
        };
        if u {
            uniform.insert(*var);
        }
    }
    uniform
}

/// Whether values of `d` are computed in f32 (f32, f16, bf16).
pub(super) fn single_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// `min_blocks` of the configuration's tuning (`COIL_MIN_BLOCKS=N`): reduction kernels declare
/// `__launch_bounds__(block, N)`, so that NVRTC keeps their registers low enough for N blocks
/// per SM. A tuning knob.
fn min_blocks_override() -> Option<u32> {
    coil_ir::config::current().tuning.min_blocks.filter(|&n| (1..=32).contains(&n))
}

/// Whether `tanh(z) + 1` (gelu's tanh form) is computed as `2 / (1 + exp(-2z))`
/// (`coil_one_plus_tanh`: an `ex2` and an `rcp`, a few ulp) instead of `tanhf` (a long routine,
/// and cancellation where `tanh(z)` is near -1). `plain_tanh` of the configuration's tuning
/// (`COIL_CUDA_PLAIN_TANH=1`) turns it off, to compare.
pub(super) fn fast_one_plus_tanh() -> bool {
    !coil_ir::config::current().tuning.plain_tanh
}

/// Reduction kernels: a child module, so that it shares the emitter's private state.
#[path = "reduce.rs"]
pub(super) mod reduce;
