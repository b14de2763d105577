//! One tile kernel to one PTX `.entry`, in the code shapes of the CUDA C emitter (the same
//! [`Plan`], groups, vector accesses, passes and block reductions), written out unrolled: a
//! group's elements and a thread's chunks become straight-line code, the loops that remain
//! (grid-stride loops, where the grid does not cover the work) become branches.

use super::asm::{Asm, Class, Opnd, Reg};
use super::random;
use super::scalar::{self, class_of, mem_type, raw_class, R};
use crate::cuda::emit::reduce::{persistent_arrays, pieces, Piece};
use crate::cuda::emit::{index_type, single_float, uniform_values, Access, Group, KernelFacts};
use crate::cuda::launch::Plan;
use coil_ir::kernel::{flat_stmts, rindex, xindex, Dims, KernelKind, TileKernel, TileOp, TileStmt, Var};
use coil_ir::op::RandDist;
use coil_ir::sym::{Expr, ExprKind};
use coil_ir::target::GpuTarget;
use coil_ir::{BinaryOp, DType, ReduceOp};
use indexmap::{IndexMap, IndexSet};
use std::fmt::Write;

/// Most values one thread holds in a persistent row (chunks times group size): beyond that the
/// unrolled code grows past what a quick compile allows, and NVRTC's partial unrolling serves.
const MAX_ROW_VALUES: usize = 64;

/// The emitter of one kernel.
pub(super) struct PtxGen<'a> {
    k: &'a TileKernel,
    plan: Plan,
    /// Resident threads of one SM of the target (the occupancy hint of wide looped kernels).
    threads_per_sm: u32,
    /// Whether the kernel waits for the grid before it on entry ([`GpuTarget::programmatic_launch`]).
    dependent: bool,
    a: Asm,
    /// 64-bit index arithmetic (the CUDA emitter's `int64_t` kernels).
    wide: bool,
    /// The kernel's values: dtypes, accumulators' sources, the fast-path patterns.
    facts: KernelFacts,
    /// Values some store or reduction needs (the others are never computed).
    needed: IndexSet<Var>,
    ptrs: Vec<Reg>,
    status: Option<Reg>,
    /// The random streams the kernel draws from ([`TileKernel::random`]), loaded at the entry.
    streams: IndexMap<usize, random::StreamRegs>,
    /// Index symbols by name: their registers or constants.
    syms: IndexMap<String, Opnd>,
    /// Index expressions already computed, and element addresses `(arg, index register)`, per
    /// scope (a scope ends where code may not have run: a branch, a loop).
    memo: Vec<IndexMap<Expr, Opnd>>,
    addresses: Vec<IndexMap<(usize, Reg), Reg>>,
    /// In an unrolled pass, chunk `k`'s `rchunk` as `rlane + k * row_threads` (substituted into
    /// indices, so that every chunk shares the address registers of chunk 0 and differs by an
    /// immediate offset).
    rchunk_as: Option<(Expr, Expr)>,
    /// [`PtxGen::index_parts`]' pure rewrites by (group, index, `rchunk_as`, element when the
    /// index does not peel): the computed part, the constant, the coefficient of `i`.
    index_cache: IndexMap<IndexKey, (Expr, i64, i64)>,
    /// Counts [`PtxGen::set_group`] calls: the group of the cache's keys.
    group_id: u32,
    /// Values by scope (row, group, element).
    scopes: Vec<IndexMap<Var, Reg>>,
    /// Persistent values read by later passes: one register per (value, chunk * vec + i).
    arrays: IndexSet<Var>,
    array_regs: IndexMap<(Var, usize), Reg>,
    /// Loads of a later pass issued in the first pass of a persistent reduction
    /// ([`PtxGen::early_loads`]): (value, buffer, index), and once loaded their words by
    /// (value, chunk) until the later pass takes them.
    early: Vec<(Var, usize, Expr)>,
    early_words: IndexMap<(Var, usize), Words>,
    /// Whether the pass being written issues the `early` loads.
    issuing_early: bool,
    /// Accumulators by (reduction, slot): slot 0, or in a column plan with `col_vec` outputs
    /// per thread the output's place `i` in the thread's group.
    accs: IndexMap<(Var, usize), Reg>,
    /// An arg reduction's index (`.b64`) beside its value in `accs`, by the same key.
    arg_index: IndexMap<(Var, usize), Reg>,
    /// Inside a column plan's pass: accumulators are per output (slot = element).
    per_output: bool,
    /// In a column plan's epilogue each thread stores its own output (no row-leader guard).
    own_output: bool,
    /// `.shared` arrays: name, bytes.
    shared: Vec<(String, usize)>,
    group: Option<Group>,
    /// The element of the group being emitted (`None`: values of the whole group).
    elem: Option<usize>,
    chunk: usize,
    /// The uniform runs of the group's elements ([`PtxGen::uniform_in_group`]) by (stream,
    /// the counter's computed part, its constant at element 0); for one group's elements.
    uniform_runs: IndexMap<(usize, String, i64), random::UniformRun>,
    /// Reciprocals of divisors defined outside a group's elements, by the divisor's register
    /// (emitted where the divisor is, so it is set wherever the divisor is).
    reciprocals: IndexMap<Reg, Reg>,
    tid: Option<Reg>,
    rlane: Option<Opnd>,
}

/// A key of [`PtxGen::index_cache`].
type IndexKey = (u32, Expr, Option<(Expr, Expr)>, Option<i64>);

/// The stride of a grid-stride loop: `gridDim.x * mul / div` (`div`: blocks per cluster);
/// `covers`: the launch's grid covers every value of a symbolic count (no loop needed).
#[derive(Clone, Copy)]
struct Step {
    mul: i64,
    div: i64,
    covers: bool,
}

impl<'a> PtxGen<'a> {
    pub(super) fn new(k: &'a TileKernel, plan: Plan, target: &GpuTarget) -> PtxGen<'a> {
        let mut g = PtxGen {
            k,
            plan,
            threads_per_sm: target.max_threads_per_sm,
            dependent: target.programmatic_launch(),
            a: Asm::default(),
            wide: index_type(k) != "int",
            facts: KernelFacts::new(k),
            needed: IndexSet::new(),
            ptrs: vec![],
            status: None,
            streams: IndexMap::new(),
            syms: IndexMap::new(),
            memo: vec![IndexMap::new()],
            addresses: vec![IndexMap::new()],
            rchunk_as: None,
            index_cache: IndexMap::new(),
            group_id: 0,
            scopes: vec![IndexMap::new()],
            arrays: IndexSet::new(),
            array_regs: IndexMap::new(),
            early: vec![],
            early_words: IndexMap::new(),
            issuing_early: false,
            accs: IndexMap::new(),
            arg_index: IndexMap::new(),
            per_output: false,
            own_output: false,
            shared: vec![],
            group: None,
            elem: None,
            chunk: 0,
            uniform_runs: IndexMap::new(),
            reciprocals: IndexMap::new(),
            tid: None,
            rlane: None,
        };
        g.needed = g.needed_values();
        g
    }

    fn needed_values(&self) -> IndexSet<Var> {
        let mut needed = IndexSet::new();
        for s in flat_stmts(&self.k.body).into_iter().rev() {
            match s {
                TileStmt::Let { var, .. } if !needed.contains(var) => {}
                TileStmt::Let { op: TileOp::Binary(BinaryOp::Add, x, y), dtype, .. }
                    if self.facts.one_plus_tanh(*x, *y, *dtype).is_some() =>
                {
                    needed.insert(self.facts.one_plus_tanh(*x, *y, *dtype).expect("matched"));
                }
                TileStmt::Let { op: TileOp::Binary(BinaryOp::Pow, x, y), dtype, .. }
                    if dtype.is_float() && self.facts.twos.contains(y) =>
                {
                    needed.insert(*x);
                }
                _ => needed.extend(s.reads()),
            }
        }
        needed
    }

    fn dtype(&self, v: Var) -> DType {
        self.facts.dtypes[&v]
    }

    /// The index class and its PTX type suffix.
    fn itype(&self) -> (Class, &'static str) {
        if self.wide {
            (Class::B64, "s64")
        } else {
            (Class::B32, "s32")
        }
    }

    /// `o` in a register (immediates moved into one).
    fn in_reg(&mut self, o: Opnd) -> Reg {
        match o {
            Opnd::Reg(r) => r,
            _ => {
                let (c, t) = self.itype();
                self.a.op(c, &format!("mov.{}", t.replace('s', "b")), &[o])
            }
        }
    }

    /// `instr.{s32|s64}` on index operands.
    fn iop(&mut self, instr: &str, args: &[Opnd]) -> Opnd {
        let (c, t) = self.itype();
        let mut args = args.to_vec();
        args[0] = self.in_reg(args[0]).into();
        self.a.op(c, &format!("{instr}.{t}"), &args).into()
    }

    /// A special register (`%tid.x`) in the index class.
    fn special(&mut self, name: &'static str) -> Reg {
        let r = self.a.op(Class::B32, "mov.u32", &[Opnd::Text(name)]);
        if self.wide {
            self.a.op(Class::B64, "cvt.u64.u32", &[r.into()])
        } else {
            r
        }
    }

    /// A 64-bit copy of an index operand.
    fn wide_index(&mut self, o: Opnd) -> Opnd {
        match o {
            Opnd::Reg(r) if r.class == Class::B32 => self.a.op(Class::B64, "cvt.s64.s32", &[r.into()]).into(),
            o => o,
        }
    }

    /// Enters (or leaves, with `None`) a group: indices are peeled anew.
    fn set_group(&mut self, g: Option<Group>) {
        self.group = g;
        self.group_id += 1;
    }

    fn val(&self, v: Var) -> R<Reg> {
        if let (Some(g), Some(i)) = (&self.group, self.elem) {
            if self.arrays.contains(&v) {
                let slot = self.chunk * g.vec + i;
                return self.array_regs.get(&(v, slot)).copied().ok_or_else(|| format!("tmp{v}[{slot}] unset"));
            }
        }
        self.scopes.iter().rev().find_map(|s| s.get(&v).copied()).ok_or_else(|| format!("tmp{v} used before set"))
    }

    fn define(&mut self, v: Var, r: Reg) {
        if let (Some(g), Some(i)) = (&self.group, self.elem) {
            if self.arrays.contains(&v) {
                let slot = self.chunk * g.vec + i;
                self.array_regs.insert((v, slot), r);
                return;
            }
        }
        self.scopes.last_mut().expect("a scope").insert(v, r);
        if self.elem.is_none() && self.facts.divisors.contains(&v) {
            let rcp = match self.facts.constants.get(&v) {
                // IEEE division on the host is what `rcp.rn` would give; a literal's costs nothing
                // (and the assembler took a quarter longer over the RMSNorm kernel's `rcp.rn` of 4096)
                Some(&c) => self.a.op(Class::F32, "mov.f32", &[Opnd::F32(1.0 / c as f32)]),
                None => scalar::reciprocal_f32(&mut self.a, r),
            };
            self.reciprocals.insert(r, rcp);
        }
    }

    fn push(&mut self) {
        self.memo.push(IndexMap::new());
        self.addresses.push(IndexMap::new());
        self.scopes.push(IndexMap::new());
    }

    fn pop(&mut self) {
        self.memo.pop();
        self.addresses.pop();
        self.scopes.pop();
    }

    /// The value `op` defines, of dtype `out`.
    fn let_value(&mut self, op: &TileOp, out: DType) -> R<Reg> {
        Ok(match op {
            TileOp::Load { arg, index } => {
                let (b, off) = self.index_parts(*index)?;
                self.load(*arg, b, off, out, None)?
            }
            TileOp::MaskedLoad { arg, index, mask, other } => {
                let (b, off) = self.index_parts(*index)?;
                let m = self.val(*mask)?;
                let v = self.load(*arg, b, off, out, Some(m))?;
                let o = scalar::literal(&mut self.a, *other, out)?;
                scalar::select(&mut self.a, m, v, o, out)?
            }
            TileOp::IndirectLoad { arg, index, indirect, stride, bound } => {
                self.indirect_load(*arg, *index, *indirect, *stride, *bound, out)?
            }
            TileOp::Constant(c) => scalar::literal(&mut self.a, *c, out)?,
            TileOp::Index(e) => {
                let (b, off) = self.index_parts(*e)?;
                let b = self.wide_index(b);
                let i = match b {
                    Opnd::Int(c) => self.a.op(Class::B64, "mov.b64", &[Opnd::Int(c + off)]),
                    o => self.a.op(Class::B64, "add.s64", &[o, Opnd::Int(off)]),
                };
                scalar::convert(&mut self.a, i, DType::I64, out)?
            }
            TileOp::Rand { dist, stream, counter } => {
                if !single_float(out) {
                    return Err(format!("random numbers of {out}"));
                }
                let regs = *self.streams.get(stream).ok_or_else(|| format!("random stream {stream} not loaded"))?;
                let v = match self.uniform_in_group(*dist, *stream, *counter)? {
                    Some(v) => v,
                    None => {
                        let relative = self.index_b64(*counter)?;
                        let at = self.a.op(Class::B64, "add.u64", &[regs.offset.into(), relative.into()]);
                        random::random_f64(&mut self.a, *dist, &regs, at)
                    }
                };
                let f = self.a.op(Class::F32, "cvt.rn.f32.f64", &[v.into()]);
                scalar::convert(&mut self.a, f, DType::F32, out)?
            }
            TileOp::Unary(u, x) => {
                let xv = self.val(*x)?;
                scalar::unary(&mut self.a, *u, xv, self.facts.dtypes[x], out)?
            }
            TileOp::Binary(BinaryOp::Pow, x, y) if out.is_float() && self.facts.twos.contains(y) => {
                // pow(x, 2) is x * x, as the CUDA emitter computes it
                let (xv, dx) = (self.val(*x)?, self.dtype(*x));
                scalar::binary(&mut self.a, BinaryOp::Mul, xv, dx, xv, dx, out)?
            }
            TileOp::Binary(BinaryOp::Add, x, y) if self.facts.one_plus_tanh(*x, *y, out).is_some() => {
                let z = self.facts.one_plus_tanh(*x, *y, out).expect("matched");
                let zv = self.val(z)?;
                let zf = scalar::convert(&mut self.a, zv, self.facts.dtypes[&z], DType::F32)?;
                let r = scalar::one_plus_tanh_f32(&mut self.a, zf);
                scalar::convert(&mut self.a, r, DType::F32, out)?
            }
            TileOp::Binary(BinaryOp::Div, x, y)
                if out == DType::F32 && self.reciprocals.contains_key(&self.val(*y)?) =>
            {
                let rcp = self.reciprocals[&self.val(*y)?];
                let xv = self.val(*x)?;
                let xf = scalar::convert(&mut self.a, xv, self.facts.dtypes[x], out)?;
                self.a.op(Class::F32, "mul.f32", &[xf.into(), rcp.into()])
            }
            TileOp::Binary(op @ (BinaryOp::FloorDiv | BinaryOp::TruncDiv | BinaryOp::Remainder), x, y)
                if !out.is_float() && out != DType::Bool =>
            {
                let (xv, yv) = (self.val(*x)?, self.val(*y)?);
                let xi = scalar::convert(&mut self.a, xv, self.facts.dtypes[x], out)?;
                let yi = scalar::convert(&mut self.a, yv, self.facts.dtypes[y], out)?;
                let r = self.integer_division(*op, xi, yi);
                scalar::convert(&mut self.a, r, DType::I64, out)?
            }
            TileOp::Binary(BinaryOp::Pow, x, y) if !out.is_float() && out != DType::Bool => {
                let (xv, yv) = (self.val(*x)?, self.val(*y)?);
                let xi = scalar::convert(&mut self.a, xv, self.facts.dtypes[x], out)?;
                let yi = scalar::convert(&mut self.a, yv, self.facts.dtypes[y], out)?;
                let r = self.integer_pow(xi, yi);
                scalar::convert(&mut self.a, r, DType::I64, out)?
            }
            TileOp::Binary(b, x, y) => {
                let (xv, yv) = (self.val(*x)?, self.val(*y)?);
                scalar::binary(&mut self.a, *b, xv, self.facts.dtypes[x], yv, self.facts.dtypes[y], out)?
            }
            TileOp::Where(c, x, y) => {
                let (cv, xv, yv) = (self.val(*c)?, self.val(*x)?, self.val(*y)?);
                let xo = scalar::convert(&mut self.a, xv, self.facts.dtypes[x], out)?;
                let yo = scalar::convert(&mut self.a, yv, self.facts.dtypes[y], out)?;
                scalar::select(&mut self.a, cv, xo, yo, out)?
            }
            TileOp::Cast(x) => {
                let xv = self.val(*x)?;
                scalar::convert(&mut self.a, xv, self.facts.dtypes[x], out)?
            }
        })
    }

    /// Whether this thread stores the row's values (its first thread).
    /// A uniform draw of a group's element whose counter is the element 0's plus `i` (a
    /// vector group's consecutive elements): the group's run of uniform blocks
    /// ([`random::uniform_run`]), made at the first element that draws, and this element's
    /// word of it. `None` elsewhere (the element draws alone).
    fn uniform_in_group(&mut self, dist: RandDist, stream: usize, counter: Expr) -> R<Option<Reg>> {
        let (Some(vec), Some(i)) = (self.group.as_ref().map(|g| g.vec), self.elem) else { return Ok(None) };
        if dist != RandDist::Uniform || vec < 2 {
            return Ok(None);
        }
        let (base, off) = self.index_parts(counter)?;
        if self.index_step(counter) != Some(1) {
            return Ok(None);
        }
        let key = (stream, base.to_string(), off - i as i64);
        if !self.uniform_runs.contains_key(&key) {
            let regs = self.streams[&stream];
            let base = match self.wide_index(base) {
                Opnd::Int(c) => self.a.op(Class::B64, "mov.b64", &[Opnd::Int(c)]),
                Opnd::Reg(r) => r,
                o => self.a.op(Class::B64, "mov.b64", &[o]),
            };
            let first = self.a.op(Class::B64, "add.u64", &[regs.offset.into(), base.into()]);
            let first = self.a.op(Class::B64, "add.u64", &[first.into(), Opnd::Int(key.2)]);
            let run = random::uniform_run(&mut self.a, &regs, first, vec);
            self.uniform_runs.insert(key.clone(), run);
        }
        Ok(Some(random::uniform_run_f64(&mut self.a, &self.uniform_runs[&key], i)))
    }

    fn row_leader(&mut self) -> Reg {
        let (_, t) = self.itype();
        let rlane = self.rlane.expect("a reduction's lane");
        let r = self.in_reg(rlane);
        self.a.op(Class::Pred, &format!("setp.eq.{t}"), &[r.into(), Opnd::Int(0)])
    }

    fn stmt(&mut self, s: &TileStmt) -> R<()> {
        match s {
            TileStmt::Let { var, .. } if !self.needed.contains(var) => Ok(()),
            TileStmt::Let { var, dtype, op, .. } => {
                let r = self.let_value(op, *dtype)?;
                self.define(*var, r);
                Ok(())
            }
            TileStmt::Store { arg, index, value, dims } => {
                let row = self.k.kind != KernelKind::Pointwise && *dims == Dims::X && !self.own_output;
                let guard = if row { Some(self.row_leader()) } else { None };
                let (b, off) = self.index_parts(*index)?;
                let v = self.val(*value)?;
                self.store(*arg, b, off, v, self.dtype(*value), guard)
            }
            TileStmt::Window { .. } => Err("a window outside the prologue".into()),
            TileStmt::Reduce { var, op, source, .. } if self.k.kind == KernelKind::PersistentReduction => {
                self.acc_update(*var, *op, *source)
            }
            TileStmt::Reduce { var, op, source, .. } => self.acc_finish(*var, *op, *source),
            TileStmt::AccInit { acc, op, .. } => self.acc_init(*acc, *op),
            TileStmt::AccUpdate { acc, op, value } => self.acc_update(*acc, *op, *value),
            TileStmt::AccUpdateOnlineSoftmax { .. } => Err("an online softmax outside a group".into()),
            TileStmt::ReduceOnlineSoftmax { max, sum, dtype, finite_shift } => {
                self.online_finish(*max, *sum, *dtype, *finite_shift)
            }
            TileStmt::RLoop(body) => self.rloop(body),
        }
    }

    /// `(arg, index, piece)` of a statement's vector access in the current group.
    fn vector_access(&self, s: &TileStmt) -> Option<(usize, Expr, usize)> {
        let (arg, index) = match s {
            TileStmt::Let { op: TileOp::Load { arg, index }, .. } | TileStmt::Store { arg, index, .. } => {
                (*arg, *index)
            }
            _ => return None,
        };
        match self.access(arg, index) {
            Access::Vector { piece } => Some((arg, index, piece)),
            _ => None,
        }
    }

    /// One group: its vector loads first (in flight together), the elements one after the
    /// other, then its vector stores.
    fn group_body(&mut self, stmts: &[&TileStmt]) -> R<()> {
        let loaded = self.group_loads(stmts)?;
        self.group_elements(stmts, &loaded)
    }

    /// The group's vector loads: one value per element, by variable (those an earlier pass
    /// issued taken from it); in a pass that issues a later pass's loads, those too.
    fn group_loads(&mut self, stmts: &[&TileStmt]) -> R<IndexMap<Var, Words>> {
        let mut loaded = IndexMap::new();
        for s in stmts {
            if let (TileStmt::Let { var, .. }, Some((arg, index, piece))) = (s, self.vector_access(s)) {
                if self.needed.contains(var) {
                    let words = match self.early_words.shift_remove(&(*var, self.chunk)) {
                        Some(words) => words,
                        None => self.load_vector(arg, index, piece)?,
                    };
                    loaded.insert(*var, words);
                }
            }
        }
        if self.issuing_early {
            for (var, arg, index) in self.early.clone() {
                if let Access::Vector { piece } = self.access(arg, index) {
                    let words = self.load_vector(arg, index, piece)?;
                    self.early_words.insert((var, self.chunk), words);
                }
            }
        }
        Ok(loaded)
    }

    /// The group's elements (their vector loads done: `loaded`), then its vector stores and its
    /// online-softmax folds.
    fn group_elements(&mut self, stmts: &[&TileStmt], loaded: &IndexMap<Var, Words>) -> R<()> {
        let vec = self.group.as_ref().expect("inside a group").vec;
        let mut stores: IndexMap<usize, Vec<(Reg, DType)>> = IndexMap::new();
        let mut online: IndexMap<(Var, Var), Vec<Reg>> = IndexMap::new();
        let access: Vec<_> = stmts.iter().map(|s| self.vector_access(s)).collect();
        self.uniform_runs.clear(); // their registers are set in this group's code only
        for i in 0..vec {
            self.elem = Some(i);
            self.scopes.push(IndexMap::new());
            for (n, s) in stmts.iter().enumerate() {
                match (s, access[n]) {
                    (TileStmt::Let { var, dtype, .. }, Some(_)) => {
                        if let Some(words) = loaded.get(var) {
                            let v = self.element(words, i, *dtype)?;
                            self.define(*var, v);
                        }
                    }
                    (TileStmt::Store { value, .. }, Some(_)) => {
                        let v = self.val(*value)?;
                        stores.entry(n).or_default().push((v, self.dtype(*value)));
                    }
                    (TileStmt::AccUpdateOnlineSoftmax { max_acc, sum_acc, value }, _) => {
                        let v = self.val(*value)?;
                        let v = scalar::convert(&mut self.a, v, self.facts.dtypes[value], DType::F32)?;
                        online.entry((*max_acc, *sum_acc)).or_default().push(v);
                    }
                    _ => self.stmt(s)?,
                }
            }
            self.scopes.pop();
        }
        self.elem = None;
        for (n, values) in stores {
            let (arg, index, piece) = access[n].expect("a vector store");
            self.store_vector(arg, index, piece, &values)?;
        }
        for ((m, s), xs) in online {
            self.online_group(m, s, &xs);
        }
        Ok(())
    }

    /// `for (name = first; name < count; name += gridDim.x * step.mul / step.div)`, or, when the grid covers `count` at
    /// once (`per_step` values per step, or `step.covers`), the body once behind `name < count`
    /// (none if exact).
    fn grid_loop(
        &mut self,
        name: &str,
        first: Opnd,
        count: Expr,
        step: Step,
        per_step: u64,
        body: &mut dyn FnMut(&mut Self) -> R<()>,
    ) -> R<()> {
        let (c, t) = self.itype();
        // Some(exact): one step covers the count, exactly or behind a guard; None: a loop
        let covered = match count.const_value() {
            Some(n) => (self.plan.launch.grid > 0 && per_step as i64 >= n).then_some(per_step as i64 == n),
            None => step.covers.then_some(false),
        };
        let end = self.a.label();
        let n = self.expr(count)?;
        match covered {
            Some(true) => {
                self.syms.insert(name.into(), first);
                self.push();
                body(self)?;
                self.pop();
            }
            Some(false) => {
                let f = self.in_reg(first);
                let out = self.a.op(Class::Pred, &format!("setp.ge.{t}"), &[f.into(), n]);
                self.a.branch_if(out, false, &end);
                self.syms.insert(name.into(), first);
                self.push();
                body(self)?;
                self.pop();
            }
            None => {
                let ctr = self.a.reg(c);
                let b = t.replace('s', "b");
                self.a.op_into(ctr, &format!("mov.{b}"), &[first]);
                let top = self.a.label();
                self.a.place(&top);
                let out = self.a.op(Class::Pred, &format!("setp.ge.{t}"), &[ctr.into(), n]);
                self.a.branch_if(out, false, &end);
                self.syms.insert(name.into(), ctr.into());
                self.push();
                body(self)?;
                self.pop();
                let nct = self.special("%nctaid.x");
                let mut s = self.iop("mul.lo", &[nct.into(), Opnd::Int(step.mul)]);
                if step.div > 1 {
                    let (c, _) = self.itype();
                    let sr = self.in_reg(s);
                    s = self.udiv_const(c, sr, step.div, true).into();
                }
                self.a.op_into(ctr, &format!("add.{t}"), &[ctr.into(), s]);
                self.a.jump(&top);
            }
        }
        self.a.place(&end);
        Ok(())
    }

    fn pointwise(&mut self) -> R<()> {
        let vec = self.plan.vec as i64;
        let xn = self.k.xnumel;
        let (groups, full) = ((xn + (vec - 1)).floor_div(vec), xn.floor_div(vec));
        let some_full = full != Expr::int(0);
        let partial = full != groups;
        let prologue = self.k.window_prologue();
        let whole: Vec<&TileStmt> = self.k.body.iter().collect();
        let body = whole[prologue..].to_vec();
        let group = some_full.then(|| Group::new(xindex(&xn), "xvec", full, vec as usize, "i"));
        let uniform = group.as_ref().map(|g| uniform_values(g, &whole)).unwrap_or_default();
        // The window prologue: once per thread, before its groups (the windows' pointers
        // moved, so that the stores are plain ones).
        for (i, s) in whole[..prologue].iter().enumerate() {
            match s {
                TileStmt::Window { arg, offset, stride, size, bound } => {
                    self.window(*arg, *offset, *stride, *size, *bound, self.k.window_needs_check(i))?
                }
                s => self.stmt(s)?,
            }
        }
        let block = self.plan.launch.block as i64;
        let (ctaid, tid) = (self.special("%ctaid.x"), self.special("%tid.x"));
        let first = self.iop("mad.lo", &[ctaid.into(), Opnd::Int(block), tid.into()]);
        let per_step = self.plan.launch.grid as u64 * block as u64;
        let mut run = |g: &mut Self| -> R<()> {
            let xvec = g.syms["xvec"];
            let (done, rest) = (g.a.label(), g.a.label());
            if some_full {
                if partial {
                    let f = g.expr(full)?;
                    let (_, t) = g.itype();
                    let xr = g.in_reg(xvec);
                    let p = g.a.op(Class::Pred, &format!("setp.ge.{t}"), &[xr.into(), f]);
                    g.a.branch_if(p, false, &rest);
                }
                g.set_group(group.clone());
                g.push();
                let (uni, other): (Vec<&TileStmt>, Vec<&TileStmt>) =
                    body.iter().partition(|s| matches!(s, TileStmt::Let { var, .. } if uniform.contains(var)));
                for s in uni {
                    g.stmt(s)?;
                }
                g.group_body(&other)?;
                g.pop();
                g.set_group(None);
                if partial {
                    g.a.jump(&done);
                    g.a.place(&rest);
                }
            }
            if partial {
                // the last, partial group: element by element
                let (_, t) = g.itype();
                let n = g.expr(xn)?;
                for i in 0..vec {
                    g.push();
                    let xi = g.iop("mad.lo", &[xvec, Opnd::Int(vec), Opnd::Int(i)]);
                    let xr = g.in_reg(xi);
                    let p = g.a.op(Class::Pred, &format!("setp.ge.{t}"), &[xr.into(), n]);
                    g.a.branch_if(p, false, &done);
                    g.syms.insert("xindex".into(), xi);
                    for s in &body {
                        g.stmt(s)?;
                    }
                    g.pop();
                }
            }
            g.a.place(&done);
            Ok(())
        };
        self.grid_loop("xvec", first, groups, Step { mul: block, div: 1, covers: false }, per_step, &mut run)
    }

    /// The kernel's `.entry` (and the `.shared` arrays it uses), or why it has no PTX form.
    pub(super) fn kernel(mut self) -> R<String> {
        let k = self.k;
        let param = |n: usize| format!("{}_param_{n}", k.name);
        let mut n = 0;
        for _ in &k.args {
            let raw = self.a.reg(Class::B64);
            self.a.ins(format!("ld.param.u64 {raw}, [{}]", param(n)));
            let g = self.a.op(Class::B64, "cvta.to.global.u64", &[raw.into()]);
            self.ptrs.push(g);
            n += 1;
        }
        for s in &k.sizes {
            let name = s.as_symbol().map(|s| s.name).ok_or("a size that is not a symbol")?;
            if !self.wide {
                return Err("size parameters in 32-bit index arithmetic".into());
            }
            let r = self.a.reg(Class::B64);
            self.a.ins(format!("ld.param.u64 {r}, [{}]", param(n)));
            self.syms.insert(name, r.into());
            n += 1;
        }
        for &stream in &k.random {
            let regs = random::stream_registers(&mut self.a, &param(n), &param(n + 1));
            self.streams.insert(stream, regs);
            n += 2;
        }
        let raw = self.a.reg(Class::B64);
        self.a.ins(format!("ld.param.u64 {raw}, [{}]", param(n)));
        self.status = Some(self.a.op(Class::B64, "cvta.to.global.u64", &[raw.into()]));
        if self.dependent {
            // Launched as a programmatic dependent, the kernel may start before the grid
            // before it ends: let the next grid start as this one's blocks are all resident,
            // and wait for the previous grid's writes before the first memory access.
            self.a.ins("griddepcontrol.launch_dependents");
            self.a.ins("griddepcontrol.wait");
        }
        match k.kind {
            KernelKind::Pointwise => self.pointwise()?,
            KernelKind::PersistentReduction | KernelKind::LoopedReduction => self.reduction()?,
            _ => return Err(format!("a {} kernel", k.kind.name())),
        }
        self.a.ins("ret");
        let mut out = String::new();
        for g in self.a.globals() {
            let _ = writeln!(out, "{g}");
        }
        for (name, bytes) in &self.shared {
            let _ = writeln!(out, ".shared .align 8 .b8 {name}[{bytes}];");
        }
        let params: Vec<String> = (0..=n).map(|i| format!("\t.param .u64 {}", param(i))).collect();
        let _ = writeln!(out, ".visible .entry {}(\n{}\n)", k.name, params.join(",\n"));
        let block = self.plan.launch.block;
        if self.plan.cluster > 1 {
            // `__cluster_dims__`: a plain launch forms the clusters
            let _ = writeln!(out, ".explicitcluster\n.reqnctapercluster {}, 1, 1", self.plan.cluster);
        }
        let _ = writeln!(out, ".maxntid {block}, 1, 1");
        if k.kind == KernelKind::LoopedReduction && block >= 512 && self.plan.launch.grid != 1 {
            // Two blocks of 1024 threads per SM (of 2048) need at most 32 registers each; left
            // alone, the driver's assembler gave cross-entropy's looped online softmax 47 (one
            // block per SM: 314 us, where NVRTC's 32 registers ran in 283 us on the H100).
            let _ = writeln!(out, ".minnctapersm {}", (self.threads_per_sm / block).max(1));
        }
        out.push_str("{\n");
        out.push_str(&self.a.finish());
        out.push_str("}\n");
        Ok(out)
    }
}

/// Reductions: a child module, so that it shares the emitter's private state.
#[path = "reduce.rs"]
mod reduce;

/// Column reductions: the same.
#[path = "column.rs"]
mod column;

/// Loads and stores: a child module, so that it shares the emitter's private state.
#[path = "index.rs"]
mod index;
#[cfg(test)]
pub(super) use index::division_magic;

#[path = "memory.rs"]
mod memory;
use memory::Words;
