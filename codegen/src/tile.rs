//! The kernel builder: a [`FusedKernel`] (loop nodes that run together) becomes a [`TileKernel`],
//! the block-level program every backend consumes.
//!
//! Building happens in two steps.
//!
//! 1. **Values.** Each member node's index variables are rewritten in terms of `xindex` and
//!    `rindex` (see [`build_kernel`]), and its body is appended to one value list for the whole
//!    kernel, with common values shared across nodes (two nodes loading the same element load it
//!    once). A load of a buffer written by an earlier node of the kernel becomes that node's
//!    result: the buffer never reaches memory unless it is also stored. Every value knows its
//!    block shape (`XR` iff it depends on `rindex`) and its *level*: how many reductions lie on
//!    its longest input path (a load is level 0, `amax(x)` level 1, `exp(x - amax)` level 1,
//!    `sum(exp(...))` level 2).
//! 2. **Placement.** Live values become statements. Pointwise and persistent kernels emit level by
//!    level (the reductions finishing at that level, then its `X` values and stores, then its `XR`
//!    values and stores; an `XR` value waits for the first level that uses it), so every `XR` run
//!    of one level is contiguous and a backend computes it in one pass over the row, keeping only
//!    values that later passes read. Looped kernels make one [`TileStmt::RLoop`] per reduction,
//!    recomputing the `XR` values that reduction needs inside it, and a final `RLoop` for the
//!    `XR` epilogue and its stores; except that `amax(x)` and `sum(exp(x - amax(x)))` share one
//!    `RLoop` (online softmax: the rule and its conditions are in the `online` module). A
//!    pointwise kernel that scatters into a window found at run time (a KV cache write,
//!    [`coil_ir::loops::ScatterStore`]) starts with its window prologue: the values the
//!    windows' offsets read, then a [`TileStmt::Window`] per scattered output, whose stores
//!    are then plain ones relative to the window ([`TileKernel::window_prologue`]).
//!
//! Block variables are numbered in order of definition in the final body, so the numbering
//! depends only on the kernel, never on construction details.

use coil_ir::kernel::{
    flat_stmts, rindex, xindex, Dims, FusedKernel, KernelKind, TileArg, TileKernel, TileOp, TileStmt, Var,
};
use coil_ir::loops::{range_var, reduction_var, Body, BufferId, LoopKind, LoopProgram, ScalarOp, ValueId};
use coil_ir::sym::Expr;
use coil_ir::{DType, ReduceOp};
use indexmap::IndexMap;

/// Outputs per program of a pointwise kernel (advisory on the CPU, where a thread runs a range
/// of `xindex` anyway).
pub const POINTWISE_XBLOCK: usize = 1024;
/// Row elements per pass of a looped reduction.
pub const LOOPED_RBLOCK: usize = 1024;

/// Builds the block-level kernel of a fused group of loop nodes.
///
/// Index variables map to the kernel's symbols as `docs/compiler.md` fixes it:
/// * pointwise kernel: a node's `x0, x1, ...` delinearize `xindex` over its `ranges`;
/// * reduction kernel: a reduction node's `x*` delinearize `xindex` over `ranges` and its `r*`
///   delinearize `rindex` over `reduction_ranges`; a pointwise node with one element per row
///   element (`numel = xnumel * rnumel`) delinearizes `xindex * rnumel + rindex`, one with one
///   element per row (`numel = xnumel`) delinearizes `xindex`.
///
/// Block sizes: `XBLOCK` 1024 for pointwise kernels and 1 for reductions; `RBLOCK` the next
/// power of two of the row for persistent reductions, [`LOOPED_RBLOCK`] for looped ones.
///
/// Arguments are the buffers the kernel reads from memory (`in_ptrN`), writes (`out_ptrN`) or
/// both (`in_out_ptrN`), in order of first use.
///
/// # Panics
/// For an [`KernelKind::Extern`] kernel, a node whose size fits neither signature of the kernel,
/// and a data-dependent load of a buffer produced inside the kernel (the scheduler never fuses
/// those).
pub fn build_kernel(program: &LoopProgram, kernel: &FusedKernel) -> TileKernel {
    assert!(
        kernel.kind != KernelKind::Extern,
        "build_kernel: {} is an extern call, not a generated kernel",
        kernel.name
    );
    let mut b = Builder::new(program, kernel);
    for &n in &kernel.nodes {
        b.add_node(n);
    }
    let live = b.live();
    let body = match kernel.kind {
        KernelKind::Pointwise | KernelKind::PersistentReduction => b.window_prologue(b.place_by_level(&live)),
        KernelKind::LoopedReduction => b.place_looped(&live),
        KernelKind::Extern => unreachable!(),
    };
    // A persistent row is static: the scheduler makes symbolic rows looped.
    let rnumel = kernel.rnumel.and_then(|r| r.const_value()).map(|r| r as usize);
    let (xblock, rblock) = match kernel.kind {
        KernelKind::Pointwise => (POINTWISE_XBLOCK, 1),
        KernelKind::PersistentReduction => (1, rnumel.unwrap_or(1).next_power_of_two()),
        _ => (1, LOOPED_RBLOCK),
    };
    let body = renumber(body);
    let sizes = size_symbols(program, kernel, &body);
    let random = random_streams(&body);
    TileKernel {
        name: kernel.name.clone(),
        kind: kernel.kind,
        args: b.tile_args(),
        xnumel: kernel.xnumel,
        rnumel: kernel.rnumel,
        sizes,
        random,
        xblock,
        rblock,
        body,
    }
}

/// The program's size symbols that a kernel's extents or indices mention, in program order.
fn size_symbols(program: &LoopProgram, kernel: &FusedKernel, body: &[TileStmt]) -> Vec<Expr> {
    fn collect(stmts: &[TileStmt], out: &mut Vec<Expr>) {
        for st in stmts {
            match st {
                TileStmt::Let { op, .. } => out.extend(exprs(op)),
                TileStmt::Store { index, .. } => out.push(*index),
                TileStmt::Window { stride, size, bound, .. } => out.extend([*stride, *size, *bound]),
                TileStmt::RLoop(body) => collect(body, out),
                _ => {}
            }
        }
    }
    if program.symbols.is_empty() {
        return vec![];
    }
    let mut used = vec![kernel.xnumel];
    used.extend(kernel.rnumel);
    collect(body, &mut used);
    let free: Vec<Expr> = used.iter().flat_map(|e| e.free_symbols()).collect();
    program.symbols.iter().map(|s| s.symbol).filter(|s| free.contains(s)).collect()
}

/// The random streams a kernel's body draws from, in increasing order.
fn random_streams(body: &[TileStmt]) -> Vec<usize> {
    let mut streams: Vec<usize> = flat_stmts(body)
        .into_iter()
        .filter_map(|s| match s {
            TileStmt::Let { op: TileOp::Rand { stream, .. }, .. } => Some(*stream),
            _ => None,
        })
        .collect();
    streams.sort_unstable();
    streams.dedup();
    streams
}

/// The substitution [`build_kernel`] applies to the index variables of `kernel`'s member node
/// `node` (an index into `program.nodes`): the same map as the scheduler's
/// `coil_passes::schedule::kernel_index_map`, which the pipeline tests check.
#[cfg(test)]
pub(crate) fn node_index_map(program: &LoopProgram, kernel: &FusedKernel, node: usize) -> IndexMap<Expr, Expr> {
    Builder::new(program, kernel).index_map(node).0
}

/// A kernel value before placement.
#[derive(Clone, Debug, PartialEq)]
enum Def {
    Let {
        dims: Dims,
        dtype: DType,
        op: TileOp,
    },
    /// A reduction of `source` along the row; its result has shape `X`.
    Reduce {
        op: ReduceOp,
        dtype: DType,
        source: Var,
    },
}

/// A store before placement.
struct StoreDef {
    arg: usize,
    index: Expr,
    value: Var,
    dims: Dims,
}

/// A scatter's window before placement ([`TileStmt::Window`]).
struct WindowDef {
    arg: usize,
    offset: Var,
    stride: Expr,
    size: Expr,
    bound: Expr,
}

/// A buffer the kernel touches in memory.
struct ArgUse {
    buffer: BufferId,
    read: bool,
    written: bool,
}

struct Builder<'a> {
    program: &'a LoopProgram,
    kernel: &'a FusedKernel,
    xindex: Expr,
    rindex: Option<Expr>,
    xnumel: Expr,
    /// Row length (1 for a pointwise kernel).
    rnumel: Expr,
    defs: Vec<Def>,
    /// Level of each def (see the module docs).
    levels: Vec<u32>,
    args: Vec<ArgUse>,
    /// Buffers written by earlier nodes of this kernel: the producing value and the index it
    /// was written at.
    produced: IndexMap<BufferId, (Var, Expr)>,
    stores: Vec<StoreDef>,
    windows: Vec<WindowDef>,
}

fn numel(ranges: &[Expr]) -> Expr {
    ranges.iter().copied().product()
}

/// Row-major coordinates of `flat` over `ranges`, by successive division from the innermost
/// dim (`flat % n`, then `flat // n` for the rest, the outermost without a modulo). Each step is
/// one the simplifier sees through (`(16*xindex + rindex) // 16` is `xindex`), where a single
/// `(16*xindex + rindex) // 128` would stay opaque; the scheduler maps indices the same way
/// (`coil_passes::schedule::kernel_index_map`), so reads it matched compare equal here too.
fn delinearize(flat: Expr, ranges: &[Expr]) -> Vec<Expr> {
    let mut rest = flat;
    let mut out = vec![Expr::int(0); ranges.len()];
    for d in (0..ranges.len()).rev() {
        let n = ranges[d];
        out[d] = if d == 0 { rest } else { rest.modulo(n) };
        rest = rest.floor_div(n);
    }
    out
}

/// Binds each index variable to its coordinate (dims of extent 1 have no variable: lowering
/// writes 0 for them).
fn bind(map: &mut IndexMap<Expr, Expr>, ranges: &[Expr], coords: Vec<Expr>, var: fn(usize, &Expr) -> Expr) {
    for (i, (r, e)) in ranges.iter().zip(coords).enumerate() {
        if r.const_value() != Some(1) {
            map.insert(var(i, r), e);
        }
    }
}

/// The index expressions an op evaluates.
fn exprs(op: &TileOp) -> Vec<Expr> {
    match op {
        TileOp::Load { index, .. } | TileOp::MaskedLoad { index, .. } | TileOp::Index(index) => vec![*index],
        TileOp::IndirectLoad { index, stride, bound, .. } => vec![*index, *stride, *bound],
        TileOp::Rand { counter, .. } => vec![*counter],
        _ => vec![],
    }
}

/// `op` with every operand replaced by `f(operand)`.
fn map_operands(op: &TileOp, f: impl Fn(Var) -> Var) -> TileOp {
    let mut op = op.clone();
    match &mut op {
        TileOp::MaskedLoad { mask, .. } => *mask = f(*mask),
        TileOp::IndirectLoad { indirect, .. } => *indirect = f(*indirect),
        TileOp::Unary(_, a) | TileOp::Cast(a) => *a = f(*a),
        TileOp::Binary(_, a, b) => (*a, *b) = (f(*a), f(*b)),
        TileOp::Where(c, a, b) => (*c, *a, *b) = (f(*c), f(*a), f(*b)),
        TileOp::Load { .. } | TileOp::Constant(_) | TileOp::Index(_) | TileOp::Rand { .. } => {}
    }
    op
}

/// Whether two index expressions over `xindex` / `rindex` agree: equal handles, or equal values
/// at every point of a bounded sample (the simplifier need not find every identity).
fn indices_agree(a: Expr, b: Expr, syms: &[Expr]) -> bool {
    if a == b {
        return true;
    }
    let points = |s: &Expr| -> Vec<i64> {
        let hi = s.bounds().1.unwrap_or(0);
        if hi < 64 {
            (0..=hi).collect()
        } else {
            (0..32).chain(hi - 31..=hi).collect()
        }
    };
    let (xs, rs) = (points(&syms[0]), syms.get(1).map_or(vec![0], points));
    // Size symbols (dynamic shapes) take a few values of their own.
    [2, 3, 17, 64].iter().all(|&size| {
        xs.iter().all(|&x| {
            rs.iter().all(|&r| {
                let env = |s: Expr| {
                    Some(if s == syms[0] {
                        x
                    } else if Some(&s) == syms.get(1) {
                        r
                    } else {
                        size
                    })
                };
                a.eval_with(env) == b.eval_with(env)
            })
        })
    })
}

impl<'a> Builder<'a> {
    fn new(program: &'a LoopProgram, kernel: &'a FusedKernel) -> Builder<'a> {
        Builder {
            program,
            kernel,
            // A kernel without elements still gets symbols (of extent 1); its loops never run.
            xindex: xindex(&kernel.xnumel.max(1)),
            rindex: kernel.rnumel.map(|r| rindex(&r.max(1))),
            xnumel: kernel.xnumel,
            rnumel: kernel.rnumel.unwrap_or(Expr::int(1)),
            defs: Vec::new(),
            levels: Vec::new(),
            args: Vec::new(),
            produced: IndexMap::new(),
            stores: Vec::new(),
            windows: Vec::new(),
        }
    }

    fn dims(&self, v: Var) -> Dims {
        match &self.defs[v as usize] {
            Def::Let { dims, .. } => *dims,
            Def::Reduce { .. } => Dims::X,
        }
    }

    fn uses_rindex(&self, e: Expr) -> bool {
        self.rindex.is_some_and(|r| e.free_symbols().contains(&r))
    }

    /// Appends a def, or returns the identical one already there (value numbering across nodes).
    fn push(&mut self, def: Def) -> Var {
        if let Some(i) = self.defs.iter().position(|d| *d == def) {
            return i as Var;
        }
        let level = match &def {
            Def::Let { op, .. } => op.operands().iter().map(|&v| self.levels[v as usize]).max().unwrap_or(0),
            Def::Reduce { source, .. } => self.levels[*source as usize] + 1,
        };
        self.defs.push(def);
        self.levels.push(level);
        (self.defs.len() - 1) as Var
    }

    fn push_let(&mut self, dtype: DType, op: TileOp) -> Var {
        let xr = op.operands().iter().any(|&v| self.dims(v) == Dims::XR)
            || exprs(&op).into_iter().any(|e| self.uses_rindex(e));
        self.push(Def::Let { dims: if xr { Dims::XR } else { Dims::X }, dtype, op })
    }

    /// The argument slot of `buffer`, registered on first use.
    fn arg(&mut self, buffer: BufferId, write: bool) -> usize {
        let i = match self.args.iter().position(|a| a.buffer == buffer) {
            Some(i) => i,
            None => {
                self.args.push(ArgUse { buffer, read: false, written: false });
                self.args.len() - 1
            }
        };
        if write {
            self.args[i].written = true;
        } else {
            self.args[i].read = true;
        }
        i
    }

    /// The substitution of node `n`'s index variables, and the flat index its output is written at.
    fn index_map(&self, n: usize) -> (IndexMap<Expr, Expr>, Expr) {
        let node = &self.program.nodes[n];
        let ranges = node.ranges();
        let size = numel(ranges);
        let (xnumel, rnumel) = (self.xnumel, self.rnumel);
        let mut map = IndexMap::new();
        let is_reduction = matches!(node.kind, LoopKind::Reduction { .. });
        let fits = match self.rindex {
            Some(_) if !is_reduction => size == xnumel || size == xnumel * rnumel,
            None if is_reduction => false,
            _ => size == xnumel,
        };
        let name = &self.kernel.name;
        assert!(fits, "{name}: node {n} has {size} elements, which fits neither signature of the kernel");
        if size == Expr::int(0) || rnumel == Expr::int(0) {
            return (map, self.xindex); // no element: no index variable either
        }
        let flat = match (&node.kind, self.rindex) {
            (LoopKind::Reduction { reduction_ranges, .. }, Some(r)) => {
                assert_eq!(numel(reduction_ranges), rnumel, "{name}: row length differs");
                bind(&mut map, reduction_ranges, delinearize(r, reduction_ranges), reduction_var);
                self.xindex
            }
            (_, Some(r)) if size != xnumel => self.xindex * rnumel + r, // per row element
            _ => self.xindex, // pointwise kernel, or per row (also when rnumel = 1)
        };
        bind(&mut map, ranges, delinearize(flat, ranges), range_var);
        (map, flat)
    }

    fn add_node(&mut self, n: usize) {
        let node = &self.program.nodes[n];
        let (map, out_index) = self.index_map(n);
        let dtype = self.program.buffer(node.output).meta.dtype;
        let result = match &node.kind {
            LoopKind::Pointwise { body, scatter: Some(st), .. } => {
                // Written in a window found at run time: nothing in the kernel reads it (the
                // scheduler fuses no reader), so it is always stored and never `produced`.
                let (value, offset) = self.add_body_with(body, &map, Some(st.offset));
                let arg = self.arg(node.output, true);
                let sub = |e: &Expr| e.substitute(&map);
                let (offset, stride, size, bound) =
                    (offset.expect("asked for"), sub(&st.stride), sub(&st.size), sub(&st.bound));
                self.windows.push(WindowDef { arg, offset, stride, size, bound });
                self.stores.push(StoreDef { arg, index: sub(&st.index), value, dims: Dims::X });
                return;
            }
            LoopKind::Pointwise { body, .. } => self.add_body(body, &map),
            LoopKind::Reduction { op, body, .. } => {
                let source = self.add_body(body, &map);
                self.push(Def::Reduce { op: *op, dtype, source })
            }
            LoopKind::Extern { .. } => panic!("{}: extern node {n} inside a generated kernel", self.kernel.name),
        };
        self.produced.insert(node.output, (result, out_index));
        if self.kernel.stores.contains(&node.output) {
            let arg = self.arg(node.output, true);
            let xr = self.dims(result) == Dims::XR || self.uses_rindex(out_index);
            self.stores.push(StoreDef {
                arg,
                index: out_index,
                value: result,
                dims: if xr { Dims::XR } else { Dims::X },
            });
        }
    }

    /// Appends a node's body; returns the variable of its result.
    fn add_body(&mut self, body: &Body, map: &IndexMap<Expr, Expr>) -> Var {
        self.add_body_with(body, map, None).0
    }

    /// [`Builder::add_body`], also returning the variable of body value `also`, if asked.
    fn add_body_with(&mut self, body: &Body, map: &IndexMap<Expr, Expr>, also: Option<ValueId>) -> (Var, Option<Var>) {
        let mut vars: Vec<Var> = Vec::with_capacity(body.values.len());
        let syms: Vec<Expr> = std::iter::once(self.xindex).chain(self.rindex).collect();
        for value in &body.values {
            let v = |id: &ValueId| vars[id.0 as usize];
            let sub = |e: &Expr| e.substitute(map);
            let op = match &value.op {
                ScalarOp::Load { buffer, index } => {
                    if let Some(&(var, written_at)) = self.produced.get(buffer) {
                        debug_assert!(
                            indices_agree(sub(index), written_at, &syms),
                            "{}: fused read at another index",
                            self.kernel.name
                        );
                        vars.push(var);
                        continue;
                    }
                    TileOp::Load { arg: self.arg(*buffer, false), index: sub(index) }
                }
                ScalarOp::MaskedLoad { buffer, index, mask, other } => {
                    if let Some(&(var, written_at)) = self.produced.get(buffer) {
                        // Read in registers: the mask still selects the value or `other`.
                        debug_assert!(
                            indices_agree(sub(index), written_at, &syms),
                            "{}: fused read at another index",
                            self.kernel.name
                        );
                        let other = self.push_let(value.dtype, TileOp::Constant(*other));
                        TileOp::Where(v(mask), var, other)
                    } else {
                        TileOp::MaskedLoad {
                            arg: self.arg(*buffer, false),
                            index: sub(index),
                            mask: v(mask),
                            other: *other,
                        }
                    }
                }
                ScalarOp::IndirectLoad { buffer, index, indirect, stride, bound } => {
                    assert!(
                        !self.produced.contains_key(buffer),
                        "{}: data-dependent read of a buffer produced in the same kernel",
                        self.kernel.name
                    );
                    let arg = self.arg(*buffer, false);
                    TileOp::IndirectLoad {
                        arg,
                        index: sub(index),
                        indirect: v(indirect),
                        stride: sub(stride),
                        bound: sub(bound),
                    }
                }
                ScalarOp::Constant(c) => TileOp::Constant(*c),
                ScalarOp::Index(e) => TileOp::Index(sub(e)),
                ScalarOp::Rand { dist, stream, counter } => {
                    TileOp::Rand { dist: *dist, stream: *stream, counter: sub(counter) }
                }
                ScalarOp::Unary(u, a) => TileOp::Unary(*u, v(a)),
                ScalarOp::Binary(op, a, b) => TileOp::Binary(*op, v(a), v(b)),
                ScalarOp::Where(c, a, b) => TileOp::Where(v(c), v(a), v(b)),
                ScalarOp::Cast(a) => TileOp::Cast(v(a)),
            };
            let var = self.push_let(value.dtype, op);
            vars.push(var);
        }
        (vars[body.result.0 as usize], also.map(|v| vars[v.0 as usize]))
    }

    /// Which defs the stores need (defs only read earlier defs, so one backward sweep suffices).
    fn live(&self) -> Vec<bool> {
        let mut live = vec![false; self.defs.len()];
        for s in &self.stores {
            live[s.value as usize] = true;
        }
        for w in &self.windows {
            live[w.offset as usize] = true;
        }
        for i in (0..self.defs.len()).rev() {
            if !live[i] {
                continue;
            }
            match &self.defs[i] {
                Def::Let { op, .. } => op.operands().into_iter().for_each(|v| live[v as usize] = true),
                Def::Reduce { source, .. } => live[*source as usize] = true,
            }
        }
        live
    }

    fn stmt(&self, v: Var) -> TileStmt {
        match &self.defs[v as usize] {
            Def::Let { dims, dtype, op } => TileStmt::Let { var: v, dims: *dims, dtype: *dtype, op: op.clone() },
            Def::Reduce { op, dtype, source } => TileStmt::Reduce { var: v, op: *op, dtype: *dtype, source: *source },
        }
    }

    fn store_stmt(s: &StoreDef) -> TileStmt {
        TileStmt::Store { arg: s.arg, index: s.index, value: s.value, dims: s.dims }
    }

    /// `body` (a pointwise kernel's) with its windows and the lets their offsets read moved to
    /// the front, in def order: the window prologue ([`TileKernel::window_prologue`]). Those
    /// lets read no `xindex` (lowering makes a window's offset the same for every element).
    fn window_prologue(&self, body: Vec<TileStmt>) -> Vec<TileStmt> {
        if self.windows.is_empty() {
            return body;
        }
        assert_eq!(self.kernel.kind, KernelKind::Pointwise, "{}: a scatter's window in a reduction", self.kernel.name);
        let cone = self.pass_deps(self.windows.iter().map(|w| w.offset));
        let mut out: Vec<TileStmt> = cone.iter().map(|&v| self.stmt(v)).collect();
        for s in &out {
            let TileStmt::Let { op, .. } = s else { unreachable!("a pointwise kernel's values are lets") };
            assert!(
                exprs(op).iter().all(|e| !e.free_symbols().contains(&self.xindex)),
                "{}: a window offset that varies with xindex",
                self.kernel.name
            );
        }
        out.extend(self.windows.iter().map(|w| TileStmt::Window {
            arg: w.arg,
            offset: w.offset,
            stride: w.stride,
            size: w.size,
            bound: w.bound,
        }));
        let early = |s: &TileStmt| matches!(s, TileStmt::Let { var, .. } if cone.contains(var));
        out.extend(body.into_iter().filter(|s| !early(s)));
        out
    }

    /// Where each live def is placed by [`Builder::place_by_level`]: its level, except that an
    /// `XR` value sinks to the earliest level that uses it (a reduction uses its operand in the
    /// level before its own). So a value is computed in the pass over the row that needs it, and
    /// only a value needed by several passes has to be kept across them (the weight of a layer
    /// norm is loaded where it is applied, the normalized input once for all passes).
    fn placement(&self, live: &[bool]) -> Vec<u32> {
        let mut place = self.levels.clone();
        let mut first_use: Vec<Option<u32>> = vec![None; self.defs.len()];
        fn used_at(v: Var, at: u32, first_use: &mut [Option<u32>]) {
            let u = &mut first_use[v as usize];
            *u = Some(u.map_or(at, |u| u.min(at)));
        }
        // Users come after their operands, so one backward sweep sees every use first.
        for v in (0..self.defs.len()).rev() {
            if !live[v] {
                continue;
            }
            match &self.defs[v] {
                Def::Let { dims, op, .. } => {
                    if *dims == Dims::XR {
                        place[v] = first_use[v].unwrap_or(self.levels[v]);
                    }
                    op.operands().into_iter().for_each(|o| used_at(o, place[v], &mut first_use));
                }
                Def::Reduce { source, .. } => used_at(*source, self.levels[v] - 1, &mut first_use),
            }
        }
        place
    }

    /// Pointwise and persistent kernels: level by level, the reductions finishing at the level,
    /// its `X` values and stores, then its `XR` values and stores (see [`Builder::placement`]).
    fn place_by_level(&self, live: &[bool]) -> Vec<TileStmt> {
        let place = self.placement(live);
        let max_level = place.iter().copied().max().unwrap_or(0);
        let mut body = Vec::new();
        for level in 0..=max_level {
            let at = |v: Var| place[v as usize] == level;
            let lets = |dims: Dims| {
                (0..self.defs.len() as Var)
                    .filter(move |&v| live[v as usize] && at(v))
                    .filter(move |&v| matches!(self.defs[v as usize], Def::Let { dims: d, .. } if d == dims))
            };
            let reduces = (0..self.defs.len() as Var)
                .filter(|&v| live[v as usize] && at(v) && matches!(self.defs[v as usize], Def::Reduce { .. }));
            body.extend(reduces.map(|v| self.stmt(v)));
            for dims in [Dims::X, Dims::XR] {
                body.extend(lets(dims).map(|v| self.stmt(v)));
                body.extend(self.stores.iter().filter(|s| s.dims == dims && at(s.value)).map(Self::store_stmt));
            }
        }
        body
    }

    /// Every def `v` depends on without crossing a reduction (whose result is already computed),
    /// `v` included, in def order.
    fn pass_deps(&self, roots: impl IntoIterator<Item = Var>) -> Vec<Var> {
        let mut need = vec![false; self.defs.len()];
        let mut stack: Vec<Var> = roots.into_iter().collect();
        while let Some(v) = stack.pop() {
            if std::mem::replace(&mut need[v as usize], true) {
                continue;
            }
            if let Def::Let { op, .. } = &self.defs[v as usize] {
                stack.extend(op.operands());
            }
        }
        (0..self.defs.len() as Var).filter(|&v| need[v as usize]).collect()
    }

    /// Looped reductions: one pass per reduction (one for both of an online softmax pair, at the
    /// place of its maximum), `X` values outside the passes, and a final pass for the `XR`
    /// epilogue and stores.
    fn place_looped(&self, live: &[bool]) -> Vec<TileStmt> {
        let mut body = Vec::new();
        let mut emitted = vec![false; self.defs.len()];
        let pairs = self.online_pairs(live);
        let mut reduces: Vec<Var> = (0..self.defs.len() as Var)
            .filter(|&v| live[v as usize] && matches!(self.defs[v as usize], Def::Reduce { .. }))
            .collect();
        reduces.sort_by_key(|&v| (self.levels[v as usize], v));
        // Emits the `X` values among `deps` not yet emitted, and returns the `XR` ones.
        let outer = |deps: Vec<Var>, body: &mut Vec<TileStmt>, emitted: &mut Vec<bool>| -> Vec<TileStmt> {
            let mut inner = Vec::new();
            for v in deps {
                if matches!(self.defs[v as usize], Def::Reduce { .. }) {
                    continue;
                }
                if self.dims(v) == Dims::XR {
                    inner.push(self.stmt(v));
                } else if !std::mem::replace(&mut emitted[v as usize], true) {
                    body.push(self.stmt(v));
                }
            }
            inner
        };
        for &r in &reduces {
            if pairs.iter().any(|p| p.sum == r) {
                continue; // finished with its maximum
            }
            if let Some(p) = pairs.iter().find(|p| p.max == r) {
                let mut pass = outer(self.pass_deps([p.value]), &mut body, &mut emitted);
                pass.push(TileStmt::AccUpdateOnlineSoftmax { max_acc: p.max, sum_acc: p.sum, value: p.value });
                body.push(TileStmt::AccInit { acc: p.max, op: ReduceOp::Max, dtype: p.dtype });
                body.push(TileStmt::AccInit { acc: p.sum, op: ReduceOp::Sum, dtype: p.dtype });
                body.push(TileStmt::RLoop(pass));
                let (max, sum, dtype, finite_shift) = (p.max, p.sum, p.dtype, p.finite_shift);
                body.push(TileStmt::ReduceOnlineSoftmax { max, sum, dtype, finite_shift });
                continue;
            }
            let Def::Reduce { op, dtype, source } = self.defs[r as usize] else { unreachable!() };
            let mut pass = outer(self.pass_deps([source]), &mut body, &mut emitted);
            pass.push(TileStmt::AccUpdate { acc: r, op, value: source });
            body.push(TileStmt::AccInit { acc: r, op, dtype });
            body.push(TileStmt::RLoop(pass));
            body.push(TileStmt::Reduce { var: r, op, dtype, source: r });
        }
        let rest: Vec<Var> = (0..self.defs.len() as Var)
            .filter(|&v| {
                live[v as usize] && self.dims(v) == Dims::X && !matches!(self.defs[v as usize], Def::Reduce { .. })
            })
            .collect();
        outer(rest, &mut body, &mut emitted);
        body.extend(self.stores.iter().filter(|s| s.dims == Dims::X).map(Self::store_stmt));
        let xr_stores: Vec<&StoreDef> = self.stores.iter().filter(|s| s.dims == Dims::XR).collect();
        if !xr_stores.is_empty() {
            let mut pass = outer(self.pass_deps(xr_stores.iter().map(|s| s.value)), &mut body, &mut emitted);
            pass.extend(xr_stores.into_iter().map(Self::store_stmt));
            body.push(TileStmt::RLoop(pass));
        }
        body
    }

    /// Argument names by role, each role numbered in argument order.
    fn tile_args(&self) -> Vec<TileArg> {
        let mut counts = IndexMap::<&str, usize>::new();
        self.args
            .iter()
            .map(|a| {
                let role = match (a.read, a.written) {
                    (true, true) => "in_out_ptr",
                    (false, true) => "out_ptr",
                    _ => "in_ptr",
                };
                let n = counts.entry(role).or_insert(0);
                *n += 1;
                TileArg {
                    name: format!("{role}{}", *n - 1),
                    buffer: a.buffer,
                    dtype: self.program.buffer(a.buffer).meta.dtype,
                    read: a.read,
                    written: a.written,
                }
            })
            .collect()
    }
}

/// Renumbers block variables `0, 1, ...` in order of definition (a `Let` or a `Reduce`, an
/// online softmax's maximum then its sum; an accumulator takes the number of the reduction
/// that finishes it).
fn renumber(body: Vec<TileStmt>) -> Vec<TileStmt> {
    fn define(v: Var, order: &mut IndexMap<Var, Var>) {
        let n = order.len() as Var;
        order.entry(v).or_insert(n);
    }
    fn collect(stmts: &[TileStmt], order: &mut IndexMap<Var, Var>) {
        for s in stmts {
            match s {
                TileStmt::Let { var, .. } | TileStmt::Reduce { var, .. } => define(*var, order),
                TileStmt::ReduceOnlineSoftmax { max, sum, .. } => {
                    define(*max, order);
                    define(*sum, order);
                }
                TileStmt::RLoop(inner) => collect(inner, order),
                _ => {}
            }
        }
    }
    fn rewrite(stmts: Vec<TileStmt>, m: &IndexMap<Var, Var>) -> Vec<TileStmt> {
        let f = |v: Var| m[&v];
        stmts
            .into_iter()
            .map(|s| match s {
                TileStmt::Let { var, dims, dtype, op } => {
                    TileStmt::Let { var: f(var), dims, dtype, op: map_operands(&op, f) }
                }
                TileStmt::Store { arg, index, value, dims } => TileStmt::Store { arg, index, value: f(value), dims },
                TileStmt::Window { arg, offset, stride, size, bound } => {
                    TileStmt::Window { arg, offset: f(offset), stride, size, bound }
                }
                TileStmt::AccInit { acc, op, dtype } => TileStmt::AccInit { acc: f(acc), op, dtype },
                TileStmt::AccUpdate { acc, op, value } => TileStmt::AccUpdate { acc: f(acc), op, value: f(value) },
                TileStmt::AccUpdateOnlineSoftmax { max_acc, sum_acc, value } => {
                    TileStmt::AccUpdateOnlineSoftmax { max_acc: f(max_acc), sum_acc: f(sum_acc), value: f(value) }
                }
                TileStmt::ReduceOnlineSoftmax { max, sum, dtype, finite_shift } => {
                    TileStmt::ReduceOnlineSoftmax { max: f(max), sum: f(sum), dtype, finite_shift }
                }
                TileStmt::RLoop(inner) => TileStmt::RLoop(rewrite(inner, m)),
                TileStmt::Reduce { var, op, dtype, source } => {
                    TileStmt::Reduce { var: f(var), op, dtype, source: f(source) }
                }
            })
            .collect()
    }
    let mut order = IndexMap::new();
    collect(&body, &mut order);
    rewrite(body, &order)
}

mod online;
#[cfg(test)]
pub(crate) mod tests;
