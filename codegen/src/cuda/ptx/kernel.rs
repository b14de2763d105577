//! One tile kernel to one PTX `.entry`, in the code shapes of the CUDA C emitter (the same
//! [`Plan`], groups, vector accesses, passes and block reductions), written out unrolled: a
//! group's elements and a thread's chunks become straight-line code, the loops that remain
//! (grid-stride loops, where the grid does not cover the work) become branches.

use super::asm::{Asm, Class, Opnd, Reg};
use super::scalar::{self, class_of, mem_type, raw_class, R};
use crate::cuda::emit::reduce::{persistent_arrays, pieces, Piece};
use crate::cuda::emit::{fast_one_plus_tanh, index_type, single_float, uniform_values, Access, Group};
use crate::cuda::launch::Plan;
use coil_ir::kernel::{flat_stmts, rindex, xindex, Dims, KernelKind, TileKernel, TileOp, TileStmt, Var};
use coil_ir::sym::{Expr, ExprKind};
use coil_ir::{BinaryOp, DType, ReduceOp, UnaryOp};
use indexmap::{IndexMap, IndexSet};
use std::fmt::Write;

/// Most values one thread holds in a persistent row (chunks times group size): beyond that the
/// unrolled code grows past what a quick compile allows, and NVRTC's partial unrolling serves.
const MAX_ROW_VALUES: usize = 64;

/// The emitter of one kernel.
pub(super) struct PtxGen<'a> {
    k: &'a TileKernel,
    plan: Plan,
    a: Asm,
    /// 64-bit index arithmetic (the CUDA emitter's `int64_t` kernels).
    wide: bool,
    dtypes: IndexMap<Var, DType>,
    acc_source: IndexMap<Var, Var>,
    twos: IndexSet<Var>,
    /// `tmp<v> = 1 + tanh(z)` candidates: constants 1 and the `z` of each tanh.
    ones: IndexSet<Var>,
    tanh_of: IndexMap<Var, Var>,
    /// Values some store or reduction needs (the others are never computed).
    needed: IndexSet<Var>,
    ptrs: Vec<Reg>,
    status: Option<Reg>,
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
    /// Values by scope (row, group, element).
    scopes: Vec<IndexMap<Var, Reg>>,
    /// Persistent values read by later passes: one register per (value, chunk * vec + i).
    arrays: IndexSet<Var>,
    array_regs: IndexMap<(Var, usize), Reg>,
    /// Accumulators by (reduction, slot): slot 0, or in a column plan with `col_vec` outputs
    /// per thread the output's place `i` in the thread's group.
    accs: IndexMap<(Var, usize), Reg>,
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
    tid: Option<Reg>,
    rlane: Option<Opnd>,
}

/// The raw words of a group's vector load of a buffer of `buf`.
struct Words {
    buf: DType,
    words: Vec<Reg>,
}

fn mem(addr: Reg, off: i64) -> String {
    if off == 0 {
        format!("[{addr}]")
    } else {
        format!("[{addr}+{off}]")
    }
}

impl<'a> PtxGen<'a> {
    pub(super) fn new(k: &'a TileKernel, plan: Plan) -> PtxGen<'a> {
        let mut dtypes = IndexMap::new();
        let mut acc_source = IndexMap::new();
        let (mut twos, mut ones, mut tanh_of) = (IndexSet::new(), IndexSet::new(), IndexMap::new());
        for s in flat_stmts(&k.body) {
            match s {
                TileStmt::Let { var, dtype, op, .. } => {
                    dtypes.insert(*var, *dtype);
                    match op {
                        TileOp::Constant(c) if c.as_f64() == 2.0 => _ = twos.insert(*var),
                        TileOp::Constant(c) if c.as_f64() == 1.0 => _ = ones.insert(*var),
                        TileOp::Unary(UnaryOp::Tanh, z)
                            if single_float(*dtype) && dtypes.get(z).is_some_and(|d| single_float(*d)) =>
                        {
                            _ = tanh_of.insert(*var, *z)
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
                TileStmt::AccUpdate { acc, value, .. } => _ = acc_source.insert(*acc, *value),
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
        let mut g = PtxGen {
            k,
            plan,
            a: Asm::default(),
            wide: index_type(k) != "int",
            dtypes,
            acc_source,
            twos,
            ones,
            tanh_of,
            needed: IndexSet::new(),
            ptrs: vec![],
            status: None,
            syms: IndexMap::new(),
            memo: vec![IndexMap::new()],
            addresses: vec![IndexMap::new()],
            rchunk_as: None,
            scopes: vec![IndexMap::new()],
            arrays: IndexSet::new(),
            array_regs: IndexMap::new(),
            accs: IndexMap::new(),
            per_output: false,
            own_output: false,
            shared: vec![],
            group: None,
            elem: None,
            chunk: 0,
            tid: None,
            rlane: None,
        };
        g.needed = g.needed_values();
        g
    }

    /// The `z` of `x + y` when it is `1 + tanh(z)` (computed as `coil_one_plus_tanh`).
    fn one_plus_tanh(&self, x: Var, y: Var, out: DType) -> Option<Var> {
        if !single_float(out) || !fast_one_plus_tanh() {
            return None;
        }
        match (self.tanh_of.get(&x), self.tanh_of.get(&y)) {
            (Some(z), _) if self.ones.contains(&y) => Some(*z),
            (_, Some(z)) if self.ones.contains(&x) => Some(*z),
            _ => None,
        }
    }

    fn needed_values(&self) -> IndexSet<Var> {
        let mut needed = IndexSet::new();
        for s in flat_stmts(&self.k.body).into_iter().rev() {
            match s {
                TileStmt::Let { var, .. } if !needed.contains(var) => {}
                TileStmt::Let { op: TileOp::Binary(BinaryOp::Add, x, y), dtype, .. }
                    if self.one_plus_tanh(*x, *y, *dtype).is_some() =>
                {
                    needed.insert(self.one_plus_tanh(*x, *y, *dtype).expect("matched"));
                }
                TileStmt::Let { op: TileOp::Binary(BinaryOp::Pow, x, y), dtype, .. }
                    if dtype.is_float() && self.twos.contains(y) =>
                {
                    needed.insert(*x);
                }
                _ => needed.extend(s.reads()),
            }
        }
        needed
    }

    fn dtype(&self, v: Var) -> DType {
        self.dtypes[&v]
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

    // ---- index expressions ----------------------------------------------------------------

    /// The value of an index expression over the bound symbols.
    fn expr(&mut self, e: Expr) -> R<Opnd> {
        if let Some(c) = e.const_value() {
            return Ok(Opnd::Int(c));
        }
        if let Some(o) = self.memo.iter().rev().find_map(|m| m.get(&e)) {
            return Ok(*o);
        }
        let nonneg = |e: Expr| e.bounds().0.is_some_and(|l| l >= 0);
        let o = match &*e.kind() {
            ExprKind::Const(c) => Opnd::Int(*c),
            ExprKind::Symbol(s) => *self.syms.get(&s.name).ok_or_else(|| format!("unbound index symbol {}", s.name))?,
            ExprKind::Add { terms, constant } => {
                let mut sum: Option<Opnd> = None;
                for &(t, k) in terms {
                    let v = self.expr(t)?;
                    sum = Some(match (sum, k) {
                        (None, 1) => v,
                        (None, k) => self.iop("mul.lo", &[v, Opnd::Int(k)]),
                        (Some(s), 1) => self.iop("add", &[s, v]),
                        (Some(s), k) => self.iop("mad.lo", &[v, Opnd::Int(k), s]),
                    });
                }
                let s = sum.ok_or("an empty sum")?;
                if *constant != 0 {
                    self.iop("add", &[s, Opnd::Int(*constant)])
                } else {
                    s
                }
            }
            ExprKind::Mul { coeff, factors } => {
                let mut prod = self.expr(factors[0])?;
                for &f in &factors[1..] {
                    let v = self.expr(f)?;
                    prod = self.iop("mul.lo", &[prod, v]);
                }
                if *coeff != 1 {
                    prod = self.iop("mul.lo", &[prod, Opnd::Int(*coeff)]);
                }
                prod
            }
            ExprKind::FloorDiv(x, y) | ExprKind::Mod(x, y) => {
                let div = matches!(&*e.kind(), ExprKind::FloorDiv(..));
                let (xv, yv) = (self.expr(*x)?, self.expr(*y)?);
                let positive = y.bounds().0.is_some_and(|l| l >= 1);
                if nonneg(*x) && positive {
                    // C's `/` and `%` agree with floor division here; unsigned is cheaper
                    let (c, t) = self.itype();
                    let t = t.replace('s', "u");
                    let xr = self.in_reg(xv);
                    self.a.op(c, &format!("{}.{t}", if div { "div" } else { "rem" }), &[xr.into(), yv]).into()
                } else {
                    self.floor_div_mod(xv, yv, div)
                }
            }
            ExprKind::Min(x, y) | ExprKind::Max(x, y) => {
                let min = matches!(&*e.kind(), ExprKind::Min(..));
                let (xv, yv) = (self.expr(*x)?, self.expr(*y)?);
                self.iop(if min { "min" } else { "max" }, &[xv, yv])
            }
        };
        self.memo.last_mut().expect("a scope").insert(e, o);
        Ok(o)
    }

    /// Floor division or modulo of signed operands: C's truncating ones, corrected when the
    /// remainder is nonzero and of the other sign than the divisor.
    fn floor_div_mod(&mut self, x: Opnd, y: Opnd, div: bool) -> Opnd {
        let (c, t) = self.itype();
        let xr = self.in_reg(x);
        let q = self.a.op(c, &format!("div.{t}"), &[xr.into(), y]);
        let r = self.a.op(c, &format!("rem.{t}"), &[xr.into(), y]);
        let yr = self.in_reg(y);
        let nz = self.a.op(Class::Pred, &format!("setp.ne.{t}"), &[r.into(), Opnd::Int(0)]);
        let rn = self.a.op(Class::Pred, &format!("setp.lt.{t}"), &[r.into(), Opnd::Int(0)]);
        let yn = self.a.op(Class::Pred, &format!("setp.lt.{t}"), &[yr.into(), Opnd::Int(0)]);
        let other = self.a.op(Class::Pred, "xor.pred", &[rn.into(), yn.into()]);
        let fix = self.a.op(Class::Pred, "and.pred", &[nz.into(), other.into()]);
        let (base, fixed) = if div {
            (q, self.a.op(c, &format!("sub.{t}"), &[q.into(), Opnd::Int(1)]))
        } else {
            (r, self.a.op(c, &format!("add.{t}"), &[r.into(), yr.into()]))
        };
        let b = t.replace('s', "b");
        self.a.op(c, &format!("selp.{b}"), &[fixed.into(), base.into(), fix.into()]).into()
    }

    /// `index` at the current position, as `(base, c)`: the element index is `base + c`
    /// (`c` folds into the address). Inside a group it is the group's `e0 + c*i` form where
    /// [`Group::peel`] finds it.
    fn index_parts(&mut self, index: Expr) -> R<(Opnd, i64)> {
        let Some(g) = &self.group else { return self.split_constant(index) };
        let i = self.elem.unwrap_or(0) as i64;
        let (base, off) = match g.peel(index) {
            Some((e0, c)) => (e0, c * i),
            None => {
                let at = g.at(index, g.pos);
                (at.substitute(&IndexMap::from([(g.i, Expr::int(i))])), 0)
            }
        };
        let (b, c) = self.split_constant(base)?;
        Ok((b, c + off))
    }

    /// `e` (with the chunk's `rchunk` substituted) as a computed part and a constant one.
    fn split_constant(&mut self, e: Expr) -> R<(Opnd, i64)> {
        let e = match self.rchunk_as {
            Some((from, to)) => e.substitute(&IndexMap::from([(from, to)])),
            None => e,
        };
        match &*e.kind() {
            ExprKind::Add { constant, .. } if *constant != 0 => {
                let c = *constant;
                Ok((self.expr(e - c)?, c))
            }
            _ => Ok((self.expr(e)?, 0)),
        }
    }

    /// The address of element `idx + extra` of argument `arg`, as a register and a byte offset.
    fn address(&mut self, arg: usize, idx: Opnd, extra: i64) -> (Reg, i64) {
        let size = self.k.args[arg].dtype.size_bytes() as i64;
        let base = self.ptrs[arg];
        match idx {
            Opnd::Reg(r) => {
                if let Some(a) = self.addresses.iter().rev().find_map(|m| m.get(&(arg, r))) {
                    return (*a, extra * size);
                }
                let instr = if r.class == Class::B64 { "mul.lo.s64" } else { "mul.wide.s32" };
                let off = self.a.op(Class::B64, instr, &[r.into(), Opnd::Int(size)]);
                let a = self.a.op(Class::B64, "add.s64", &[base.into(), off.into()]);
                self.addresses.last_mut().expect("a scope").insert((arg, r), a);
                (a, extra * size)
            }
            Opnd::Int(c) => (base, (c + extra) * size),
            _ => unreachable!("an index is a register or a constant"),
        }
    }

    // ---- values ---------------------------------------------------------------------------

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

    /// The qualifiers of a load from `arg` (then `.ty` when given). `COIL_PTX_LOAD_HINT` adds
    /// cache qualifiers, for measuring: e.g. `.L2::256B` (a prefetch-size hint) or
    /// `.L1::no_allocate`; `.nc` (the read-only data path) only applies to buffers the kernel
    /// does not write.
    fn load_hint(&self, arg: usize, ty: &str) -> String {
        let hint = std::env::var("COIL_PTX_LOAD_HINT").unwrap_or_default();
        let hint = if self.k.args[arg].written { hint.replace(".nc", "") } else { hint };
        let ty = if ty.is_empty() { String::new() } else { format!(".{ty}") };
        format!("{hint}{ty}")
    }

    /// A scalar load of element `idx + extra` of `arg` as a value of `val`; under `guard` only
    /// (else the raw element is 0).
    fn load(&mut self, arg: usize, idx: Opnd, extra: i64, val: DType, guard: Option<Reg>) -> R<Reg> {
        let buf = self.k.args[arg].dtype;
        let (ty, class) = (mem_type(buf)?, raw_class(buf)?);
        let (addr, off) = self.address(arg, idx, extra);
        let raw = self.a.reg(class);
        let text = format!("ld.global{} {raw}, {}", self.load_hint(arg, ty), mem(addr, off));
        match guard {
            Some(p) => {
                let zero = match class {
                    Class::F32 => Opnd::F32(0.0),
                    _ => Opnd::Int(0),
                };
                let mov = match class {
                    Class::F32 => "mov.f32",
                    Class::B16 => "mov.b16",
                    _ => "mov.b64",
                };
                self.a.op_into(raw, mov, &[zero]);
                self.a.ins(format!("@{p} {text}"));
            }
            None => self.a.ins(text),
        }
        scalar::from_storage(&mut self.a, raw, buf, val)
    }

    /// A scalar store of `v` (a value of `val`) into element `idx + extra` of `arg`.
    fn store(&mut self, arg: usize, idx: Opnd, extra: i64, v: Reg, val: DType, guard: Option<Reg>) -> R<()> {
        let buf = self.k.args[arg].dtype;
        let raw = scalar::to_storage(&mut self.a, v, val, buf)?;
        let (addr, off) = self.address(arg, idx, extra);
        let g = guard.map_or(String::new(), |p| format!("@{p} "));
        self.a.ins(format!("{g}st.global.{} {}, {raw}", mem_type(buf)?, mem(addr, off)));
        Ok(())
    }

    /// How the current group reaches `arg` at `index`: as the CUDA emitter does, except that
    /// 1-byte elements go one by one.
    fn access(&self, arg: usize, index: Expr) -> Access {
        let dtype = self.k.args[arg].dtype;
        match &self.group {
            Some(g) => match g.access(index, dtype) {
                Access::Vector { .. } if dtype.size_bytes() == 1 => Access::Scalar,
                a => a,
            },
            None => Access::Scalar,
        }
    }

    /// The group's vector load of `arg` at `index`: the raw words, decoded element by element
    /// where each is used ([`PtxGen::element`]), so that only the words are live across the
    /// group's other loads.
    fn load_vector(&mut self, arg: usize, index: Expr, piece: usize) -> R<Words> {
        let g = self.group.clone().expect("a vector load inside a group");
        let base = g.peel(index).map_or_else(|| g.at(index, g.base), |(e0, _)| e0);
        let (b, c0) = self.split_constant(base)?;
        let buf = self.k.args[arg].dtype;
        let size = buf.size_bytes();
        let (addr, off0) = self.address(arg, b, c0);
        // (register class, PTX element type, registers per access)
        let (class, ty, n) = match buf {
            DType::F32 => (Class::F32, "f32", piece),
            DType::I32 => (Class::B32, "b32", piece),
            DType::I64 => (Class::B64, "b64", piece),
            DType::F16 | DType::BF16 if piece >= 2 => (Class::B32, "b32", piece / 2),
            DType::F16 | DType::BF16 => (Class::B16, "b16", 1),
            _ => return Err(format!("a vector load of {buf}")),
        };
        let mut words = Vec::new();
        for c in 0..g.vec / piece {
            let at = mem(addr, off0 + (c * piece * size) as i64);
            let regs: Vec<Reg> = (0..n).map(|_| self.a.reg(class)).collect();
            let list: Vec<String> = regs.iter().map(|r| r.to_string()).collect();
            match n {
                1 => self.a.ins(format!("ld.global{} {}, {at}", self.load_hint(arg, ty), list[0])),
                _ => {
                    self.a.ins(format!("ld.global{}.v{n}.{ty} {{{}}}, {at}", self.load_hint(arg, ""), list.join(", ")))
                }
            }
            words.extend(regs);
        }
        Ok(Words { buf, words })
    }

    /// Element `i` of a vector load as a value of `val`.
    fn element(&mut self, w: &Words, i: usize, val: DType) -> R<Reg> {
        let pairs = w.words[0].class == Class::B32 && matches!(w.buf, DType::F16 | DType::BF16);
        let e = match w.buf {
            DType::I32 => self.a.op(Class::B64, "cvt.s64.s32", &[w.words[i].into()]),
            DType::BF16 if pairs => {
                let word = w.words[i / 2];
                let bits = if i % 2 == 0 {
                    self.a.op(Class::B32, "shl.b32", &[word.into(), Opnd::Int(16)])
                } else {
                    self.a.op(Class::B32, "and.b32", &[word.into(), Opnd::Int(0xffff_0000u32 as i64)])
                };
                self.a.op(Class::F32, "mov.b32", &[bits.into()])
            }
            DType::F16 if pairs => {
                let (lo, hi) = (self.a.reg(Class::B16), self.a.reg(Class::B16));
                self.a.ins(format!("mov.b32 {{{lo}, {hi}}}, {}", w.words[i / 2]));
                self.a.op(Class::F32, "cvt.f32.f16", &[if i % 2 == 0 { lo } else { hi }.into()])
            }
            DType::F16 => self.a.op(Class::F32, "cvt.f32.f16", &[w.words[i].into()]),
            DType::BF16 => scalar::bf16_to_f32(&mut self.a, w.words[i]),
            _ => w.words[i],
        };
        // a value of the buffer's dtype (in its register class)
        scalar::convert(&mut self.a, e, w.buf, val)
    }

    /// The group's vector store of `values` (one per element, with their dtypes) into `arg`.
    fn store_vector(&mut self, arg: usize, index: Expr, piece: usize, values: &[(Reg, DType)]) -> R<()> {
        let g = self.group.clone().expect("a vector store inside a group");
        let base = g.peel(index).map_or_else(|| g.at(index, g.base), |(e0, _)| e0);
        let (b, c0) = self.split_constant(base)?;
        let buf = self.k.args[arg].dtype;
        let size = buf.size_bytes();
        let (addr, off0) = self.address(arg, b, c0);
        for c in 0..g.vec / piece {
            let at = mem(addr, off0 + (c * piece * size) as i64);
            let elems = &values[c * piece..(c + 1) * piece];
            let (ty, regs): (&str, Vec<Reg>) = match buf {
                DType::F32 => {
                    let regs = elems.iter().map(|&(v, d)| scalar::convert(&mut self.a, v, d, DType::F32));
                    ("f32", regs.collect::<R<_>>()?)
                }
                DType::I64 => {
                    let regs = elems.iter().map(|&(v, d)| scalar::convert(&mut self.a, v, d, DType::I64));
                    ("b64", regs.collect::<R<_>>()?)
                }
                DType::I32 => {
                    let mut regs = vec![];
                    for &(v, d) in elems {
                        let w = scalar::convert(&mut self.a, v, d, DType::I32)?;
                        regs.push(self.a.op(Class::B32, "cvt.u32.u64", &[w.into()]));
                    }
                    ("b32", regs)
                }
                DType::F16 | DType::BF16 if piece >= 2 => {
                    let mut regs = vec![];
                    let instr = if buf == DType::F16 { "cvt.rn.f16x2.f32" } else { "cvt.rn.bf16x2.f32" };
                    for pair in elems.chunks(2) {
                        let mut f = vec![];
                        for &(v, d) in pair {
                            f.push(if single_float(d) { v } else { scalar::convert(&mut self.a, v, d, DType::F32)? });
                        }
                        // the first element in the low half, as memory has it
                        regs.push(self.a.op(Class::B32, instr, &[f[1].into(), f[0].into()]));
                    }
                    ("b32", regs)
                }
                DType::F16 | DType::BF16 => {
                    let (v, d) = elems[0];
                    ("b16", vec![scalar::to_storage(&mut self.a, v, d, buf)?])
                }
                _ => return Err(format!("a vector store of {buf}")),
            };
            let list: Vec<String> = regs.iter().map(|r| r.to_string()).collect();
            match regs.len() {
                1 => self.a.ins(format!("st.global.{ty} {at}, {}", list[0])),
                n => self.a.ins(format!("st.global.v{n}.{ty} {at}, {{{}}}", list.join(", "))),
            }
        }
        Ok(())
    }

    // ---- statements -----------------------------------------------------------------------

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
            TileOp::Rand { .. } => return Err("random numbers".into()),
            TileOp::Unary(u, x) => {
                let xv = self.val(*x)?;
                scalar::unary(&mut self.a, *u, xv, self.dtypes[x], out)?
            }
            TileOp::Binary(BinaryOp::Pow, x, y) if out.is_float() && self.twos.contains(y) => {
                // pow(x, 2) is x * x, as the CUDA emitter computes it
                let (xv, dx) = (self.val(*x)?, self.dtype(*x));
                scalar::binary(&mut self.a, BinaryOp::Mul, xv, dx, xv, dx, out)?
            }
            TileOp::Binary(BinaryOp::Add, x, y) if self.one_plus_tanh(*x, *y, out).is_some() => {
                let z = self.one_plus_tanh(*x, *y, out).expect("matched");
                let zv = self.val(z)?;
                let zf = scalar::convert(&mut self.a, zv, self.dtypes[&z], DType::F32)?;
                let r = scalar::one_plus_tanh_f32(&mut self.a, zf);
                scalar::convert(&mut self.a, r, DType::F32, out)?
            }
            TileOp::Binary(b, x, y) => {
                let (xv, yv) = (self.val(*x)?, self.val(*y)?);
                scalar::binary(&mut self.a, *b, xv, self.dtypes[x], yv, self.dtypes[y], out)?
            }
            TileOp::Where(c, x, y) => {
                let (cv, xv, yv) = (self.val(*c)?, self.val(*x)?, self.val(*y)?);
                let xo = scalar::convert(&mut self.a, xv, self.dtypes[x], out)?;
                let yo = scalar::convert(&mut self.a, yv, self.dtypes[y], out)?;
                scalar::select(&mut self.a, cv, xo, yo, out)?
            }
            TileOp::Cast(x) => {
                let xv = self.val(*x)?;
                scalar::convert(&mut self.a, xv, self.dtypes[x], out)?
            }
        })
    }

    /// `arg[index + stride * v]` for the loaded index `v` in `0..bound`; out of range, the
    /// first failing thread of the launch records `(1, v, bound)` in `status` and the value
    /// is 0 (the CUDA prelude's `coil_index_error`).
    fn indirect_load(
        &mut self,
        arg: usize,
        index: Expr,
        indirect: Var,
        stride: Expr,
        bound: Expr,
        out: DType,
    ) -> R<Reg> {
        use Class::*;
        let v = self.val(indirect)?;
        let v = scalar::convert(&mut self.a, v, self.dtypes[&indirect], DType::I64)?;
        let bound = self.expr(bound)?;
        let bound = self.wide_index(bound);
        let stride = self.expr(stride)?;
        let stride = self.wide_index(stride);
        let (b, off) = self.index_parts(index)?;
        let b = self.wide_index(b);
        let lo = self.a.op(Pred, "setp.ge.s64", &[v.into(), Opnd::Int(0)]);
        let hi = self.a.op(Pred, "setp.lt.s64", &[v.into(), bound]);
        let ok = self.a.op(Pred, "and.pred", &[lo.into(), hi.into()]);
        let pos = match stride {
            Opnd::Int(1) => self.a.op(B64, "add.s64", &[v.into(), b]),
            s => self.a.op(B64, "mad.lo.s64", &[v.into(), s, b]),
        };
        let value = self.load(arg, pos.into(), off, out, Some(ok))?;
        let status = self.status.expect("the status pointer");
        let bad = self.a.op(Pred, "not.pred", &[ok.into()]);
        let old = self.a.op(B64, "mov.b64", &[Opnd::Int(1)]);
        self.a.ins(format!("@{bad} atom.global.cas.b64 {old}, [{status}], 0, 1"));
        let won = self.a.op(Pred, "setp.eq.s64", &[old.into(), Opnd::Int(0)]);
        self.a.ins(format!("@{won} st.global.b64 [{status}+8], {v}"));
        let br = match bound {
            Opnd::Int(c) => self.a.op(B64, "mov.b64", &[Opnd::Int(c)]),
            Opnd::Reg(r) => r,
            _ => unreachable!(),
        };
        self.a.ins(format!("@{won} st.global.b64 [{status}+16], {br}"));
        Ok(value)
    }

    /// Whether this thread stores the row's values (its first thread).
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

    /// The group's vector loads: one value per element, by variable.
    fn group_loads(&mut self, stmts: &[&TileStmt]) -> R<IndexMap<Var, Words>> {
        let mut loaded = IndexMap::new();
        for s in stmts {
            if let (TileStmt::Let { var, .. }, Some((arg, index, piece))) = (s, self.vector_access(s)) {
                if self.needed.contains(var) {
                    let words = self.load_vector(arg, index, piece)?;
                    loaded.insert(*var, words);
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
        for i in 0..vec {
            self.elem = Some(i);
            self.scopes.push(IndexMap::new());
            for (n, s) in stmts.iter().enumerate() {
                match (s, self.vector_access(s)) {
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
                        let v = scalar::convert(&mut self.a, v, self.dtypes[value], DType::F32)?;
                        online.entry((*max_acc, *sum_acc)).or_default().push(v);
                    }
                    _ => self.stmt(s)?,
                }
            }
            self.scopes.pop();
        }
        self.elem = None;
        for (n, values) in stores {
            let (arg, index, piece) = self.vector_access(stmts[n]).expect("a vector store");
            self.store_vector(arg, index, piece, &values)?;
        }
        for ((m, s), xs) in online {
            self.online_group(m, s, &xs);
        }
        Ok(())
    }

    /// Folds a group's values into the thread's online-softmax pair (the prelude's
    /// `coil_online_group`): their maximum first, one rescale of the sum if it grew, then the
    /// exponentials, unless the maximum is still -inf.
    fn online_group(&mut self, m: Var, s: Var, xs: &[Reg]) {
        use Class::*;
        let (macc, sacc) = (self.accs[&(m, 0)], self.accs[&(s, 0)]);
        let mut mn = macc;
        for &x in xs {
            mn = self.a.op(F32, "max.NaN.f32", &[mn.into(), x.into()]);
        }
        let grew = self.a.op(Pred, "setp.neu.f32", &[mn.into(), macc.into()]);
        let d = self.a.op(F32, "sub.f32", &[macc.into(), mn.into()]);
        let e = scalar::exp_f32(&mut self.a, d);
        let scaled = self.a.op(F32, "mul.f32", &[sacc.into(), e.into()]);
        let s1 = self.a.op(F32, "selp.f32", &[scaled.into(), sacc.into(), grew.into()]);
        self.a.op_into(macc, "mov.f32", &[mn.into()]);
        let mut sum = s1;
        for &x in xs {
            let d = self.a.op(F32, "sub.f32", &[x.into(), mn.into()]);
            let e = scalar::exp_f32(&mut self.a, d);
            sum = self.a.op(F32, "add.f32", &[sum.into(), e.into()]);
        }
        let finite = self.a.op(Pred, "setp.neu.f32", &[mn.into(), Opnd::F32(f32::NEG_INFINITY)]);
        self.a.op_into(sacc, "selp.f32", &[sum.into(), s1.into(), finite.into()]);
    }

    // ---- reductions -----------------------------------------------------------------------

    /// The accumulator class and identity of reduction `acc` (the CUDA emitter's `acc`).
    fn acc_kind(&self, acc: Var, op: ReduceOp) -> R<(DType, Opnd)> {
        let (src, out) = (self.dtype(self.acc_source[&acc]), self.dtype(acc));
        Ok(match op {
            ReduceOp::Sum | ReduceOp::Prod if out.is_float() => {
                class_of(out)?;
                (DType::F32, Opnd::F32(if op == ReduceOp::Sum { 0.0 } else { 1.0 }))
            }
            ReduceOp::Sum => (DType::I64, Opnd::Int(0)),
            ReduceOp::Prod => (DType::I64, Opnd::Int(1)),
            ReduceOp::Max | ReduceOp::Min if src.is_float() => {
                class_of(src)?;
                let inf = if op == ReduceOp::Max { f32::NEG_INFINITY } else { f32::INFINITY };
                (DType::F32, Opnd::F32(inf))
            }
            ReduceOp::Max => (DType::I64, Opnd::Int(i64::MIN)),
            ReduceOp::Min => (DType::I64, Opnd::Int(i64::MAX)),
            ReduceOp::ArgMax | ReduceOp::ArgMin => return Err("an arg reduction".into()),
        })
    }

    fn combine_instr(op: ReduceOp, acc: DType) -> &'static str {
        let float = acc == DType::F32;
        match (op, float) {
            (ReduceOp::Sum, true) => "add.f32",
            (ReduceOp::Sum, false) => "add.s64",
            (ReduceOp::Prod, true) => "mul.f32",
            (ReduceOp::Prod, false) => "mul.lo.s64",
            (ReduceOp::Max, true) => "max.NaN.f32",
            (ReduceOp::Max, false) => "max.s64",
            (ReduceOp::Min, true) => "min.NaN.f32",
            (_, _) => "min.s64",
        }
    }

    fn acc_init(&mut self, acc: Var, op: ReduceOp) -> R<()> {
        let (d, init) = self.acc_kind(acc, op)?;
        let r = if d == DType::F32 {
            self.a.op(Class::F32, "mov.f32", &[init])
        } else {
            self.a.op(Class::B64, "mov.b64", &[init])
        };
        self.accs.insert((acc, 0), r);
        Ok(())
    }

    fn acc_update(&mut self, acc: Var, op: ReduceOp, value: Var) -> R<()> {
        let (d, _) = self.acc_kind(acc, op)?;
        let (v, src) = (self.val(value)?, self.dtype(value));
        // max/min of floats compare in the source's compute type (f32 here)
        let v = scalar::convert(&mut self.a, v, src, if src.is_float() && d == DType::F32 { DType::F32 } else { d })?;
        let slot = if self.per_output { self.elem.unwrap_or(0) } else { 0 };
        let r = self.accs[&(acc, slot)];
        self.a.op_into(r, Self::combine_instr(op, d), &[r.into(), v.into()]);
        Ok(())
    }

    /// A value shuffled from lane `lane ^ ...`: `shfl.sync.{mode}` of a 32- or 64-bit register.
    fn shuffle(&mut self, v: Reg, mode: &str, by: i64) -> Reg {
        if v.class == Class::B64 {
            let (lo, hi) = (self.a.reg(Class::B32), self.a.reg(Class::B32));
            self.a.ins(format!("mov.b64 {{{lo}, {hi}}}, {v}"));
            let instr = format!("shfl.sync.{mode}.b32");
            let l2 = self.a.op(Class::B32, &instr, &[lo.into(), Opnd::Int(by), Opnd::Int(31), Opnd::Int(-1)]);
            let h2 = self.a.op(Class::B32, &instr, &[hi.into(), Opnd::Int(by), Opnd::Int(31), Opnd::Int(-1)]);
            let r = self.a.reg(Class::B64);
            self.a.ins(format!("mov.b64 {r}, {{{l2}, {h2}}}"));
            r
        } else {
            self.a.op(
                v.class,
                &format!("shfl.sync.{mode}.b32"),
                &[v.into(), Opnd::Int(by), Opnd::Int(31), Opnd::Int(-1)],
            )
        }
    }

    /// The row-wide combination of every thread's `acc` (the prelude's `coil_reduce<W>`): a
    /// shuffle tree in each warp, broadcast from lane 0, then for several warps a
    /// shared-memory stage read by every thread in the same order, between two barriers.
    fn block_reduce(&mut self, acc: Var, op: ReduceOp) -> R<Reg> {
        let (d, _) = self.acc_kind(acc, op)?;
        let instr = Self::combine_instr(op, d);
        let mut v = self.accs[&(acc, 0)];
        for o in [16, 8, 4, 2, 1] {
            let t = self.shuffle(v, "down", o);
            v = self.a.op(v.class, instr, &[v.into(), t.into()]);
        }
        v = self.shuffle(v, "idx", 0);
        let warps = self.plan.warps_per_row();
        if warps > 1 {
            let (ty, bytes) = if d == DType::F32 { ("f32", 4) } else { ("b64", 8) };
            let name = format!("{}_smem{acc}", self.k.name);
            self.shared.push((name.clone(), warps * bytes));
            let tid = self.tid.expect("the thread index");
            let lane = self.a.op(Class::B32, "and.b32", &[tid.into(), Opnd::Int(31)]);
            let first = self.a.op(Class::Pred, "setp.eq.u32", &[lane.into(), Opnd::Int(0)]);
            let warp = self.a.op(Class::B32, "shr.u32", &[tid.into(), Opnd::Int(5)]);
            let base = self.a.reg(Class::B32);
            self.a.ins(format!("mov.u32 {base}, {name}"));
            let slot = self.a.op(Class::B32, "mad.lo.u32", &[warp.into(), Opnd::Int(bytes as i64), base.into()]);
            self.a.ins(format!("@{first} st.shared.{ty} [{slot}], {v}"));
            self.a.ins("bar.sync 0");
            let mut r = self.shared_load(v.class, ty, base, 0);
            for w in 1..warps {
                let t = self.shared_load(v.class, ty, base, w * bytes);
                r = self.a.op(v.class, instr, &[r.into(), t.into()]);
            }
            self.a.ins("bar.sync 0");
            v = r;
        }
        Ok(v)
    }

    fn shared_load(&mut self, class: Class, ty: &str, base: Reg, off: usize) -> Reg {
        let r = self.a.reg(class);
        self.a.ins(format!("ld.shared.{ty} {r}, [{base}+{off}]"));
        r
    }

    /// Defines `tmp<var>`, the row's reduction, from the threads' accumulators `acc`.
    fn acc_finish(&mut self, var: Var, op: ReduceOp, acc: Var) -> R<()> {
        let (d, _) = self.acc_kind(acc, op)?;
        let red = self.block_reduce(acc, op)?;
        let (src, out) = (self.dtype(self.acc_source[&acc]), self.dtype(var));
        let from = if matches!(op, ReduceOp::Max | ReduceOp::Min) && src.is_float() { src } else { d };
        let v = scalar::convert(&mut self.a, red, from, out)?;
        self.define(var, v);
        Ok(())
    }

    /// The online-softmax pair `(m, s)` of two partials (the prelude's `coil_online`): the
    /// larger maximum, and the sum of the one with the smaller maximum rescaled by
    /// `exp(-|m_a - m_b|)`; `(-inf, 0)` when both maxima are -inf.
    fn online_combine(&mut self, a: (Reg, Reg), b: (Reg, Reg)) -> (Reg, Reg) {
        use Class::*;
        let m = self.a.op(F32, "max.NaN.f32", &[a.0.into(), b.0.into()]);
        let empty = self.a.op(Pred, "setp.eq.f32", &[m.into(), Opnd::F32(f32::NEG_INFINITY)]);
        let d = self.a.op(F32, "sub.f32", &[a.0.into(), b.0.into()]);
        let ad = self.a.op(F32, "abs.f32", &[d.into()]);
        let nd = self.a.op(F32, "neg.f32", &[ad.into()]);
        let e = scalar::exp_f32(&mut self.a, nd);
        let lt = self.a.op(Pred, "setp.lt.f32", &[a.0.into(), b.0.into()]);
        let sa = self.a.op(F32, "mul.f32", &[a.1.into(), e.into()]);
        let sa = self.a.op(F32, "add.f32", &[sa.into(), b.1.into()]);
        let sb = self.a.op(F32, "mul.f32", &[b.1.into(), e.into()]);
        let sb = self.a.op(F32, "add.f32", &[a.1.into(), sb.into()]);
        let s = self.a.op(F32, "selp.f32", &[sa.into(), sb.into(), lt.into()]);
        let s = self.a.op(F32, "selp.f32", &[Opnd::F32(0.0), s.into(), empty.into()]);
        (m, s)
    }

    /// The row's online-softmax pair from the threads' pairs (the prelude's
    /// `coil_reduce_costly` with `coil_online`): a shuffle tree per warp, broadcast from lane
    /// 0; for several warps, the first warp combines the warps' pairs (a shuffle tree over
    /// shared memory) and publishes the result in one more slot. Then `tmp<max>` and
    /// `tmp<sum>` (the sum relative to the row's shift, as `coil_online_sum[_finite]`).
    fn online_finish(&mut self, max: Var, sum: Var, dtype: DType, finite_shift: bool) -> R<()> {
        use Class::*;
        class_of(dtype)?;
        let mut v = (self.accs[&(max, 0)], self.accs[&(sum, 0)]);
        let shfl =
            |g: &mut Self, v: (Reg, Reg), mode: &str, by: i64| (g.shuffle(v.0, mode, by), g.shuffle(v.1, mode, by));
        for o in [16, 8, 4, 2, 1] {
            let u = shfl(self, v, "down", o);
            v = self.online_combine(v, u);
        }
        v = shfl(self, v, "idx", 0);
        let warps = self.plan.warps_per_row();
        if warps > 1 {
            let name = format!("{}_smem{max}", self.k.name);
            self.shared.push((name.clone(), (warps + 1) * 8));
            let tid = self.tid.expect("the thread index");
            let base = self.a.reg(B32);
            self.a.ins(format!("mov.u32 {base}, {name}"));
            let lane = self.a.op(B32, "and.b32", &[tid.into(), Opnd::Int(31)]);
            let first = self.a.op(Pred, "setp.eq.u32", &[lane.into(), Opnd::Int(0)]);
            let warp = self.a.op(B32, "shr.u32", &[tid.into(), Opnd::Int(5)]);
            let slot = self.a.op(B32, "mad.lo.u32", &[warp.into(), Opnd::Int(8), base.into()]);
            self.a.ins(format!("@{first} st.shared.v2.f32 [{slot}], {{{}, {}}}", v.0, v.1));
            self.a.ins("bar.sync 0");
            let skip = self.a.label();
            let outside = self.a.op(Pred, "setp.ge.u32", &[tid.into(), Opnd::Int(32)]);
            self.a.branch_if(outside, false, &skip);
            // the first warp: lane t < W holds warp t's pair
            let inside = self.a.op(Pred, "setp.lt.u32", &[tid.into(), Opnd::Int(warps as i64)]);
            let t = self.a.op(B32, "selp.b32", &[tid.into(), Opnd::Int(0), inside.into()]);
            let at = self.a.op(B32, "mad.lo.u32", &[t.into(), Opnd::Int(8), base.into()]);
            let (mut m, mut s) = (self.a.reg(F32), self.a.reg(F32));
            self.a.ins(format!("ld.shared.v2.f32 {{{m}, {s}}}, [{at}]"));
            for o in [16, 8, 4, 2, 1] {
                let u = shfl(self, (m, s), "down", o);
                let c = self.online_combine((m, s), u);
                let to = self.a.op(B32, "add.u32", &[tid.into(), Opnd::Int(o)]);
                let take = self.a.op(Pred, "setp.lt.u32", &[to.into(), Opnd::Int(warps as i64)]);
                m = self.a.op(F32, "selp.f32", &[c.0.into(), m.into(), take.into()]);
                s = self.a.op(F32, "selp.f32", &[c.1.into(), s.into(), take.into()]);
            }
            let zero = self.a.op(Pred, "setp.eq.u32", &[tid.into(), Opnd::Int(0)]);
            self.a.ins(format!("@{zero} st.shared.v2.f32 [{base}+{}], {{{m}, {s}}}", warps * 8));
            self.a.place(&skip);
            self.a.ins("bar.sync 0");
            let (rm, rs) = (self.a.reg(F32), self.a.reg(F32));
            self.a.ins(format!("ld.shared.v2.f32 {{{rm}, {rs}}}, [{base}+{}]", warps * 8));
            self.a.ins("bar.sync 0");
            v = (rm, rs);
        }
        let (m, s) = v;
        let ninf = self.a.op(Pred, "setp.eq.f32", &[m.into(), Opnd::F32(f32::NEG_INFINITY)]);
        let total = if finite_shift {
            let pinf = self.a.op(Pred, "setp.eq.f32", &[m.into(), Opnd::F32(f32::INFINITY)]);
            let t = self.a.op(F32, "selp.f32", &[Opnd::F32(f32::INFINITY), s.into(), pinf.into()]);
            self.a.op(F32, "selp.f32", &[Opnd::F32(0.0), t.into(), ninf.into()])
        } else {
            self.a.op(F32, "selp.f32", &[Opnd::F32(f32::NAN), s.into(), ninf.into()])
        };
        // `tmp<max>` is the maximum as a value of the row's dtype, as is the sum
        let mv = scalar::convert(&mut self.a, m, DType::F32, dtype)?;
        let sv = scalar::convert(&mut self.a, total, DType::F32, dtype)?;
        self.define(max, mv);
        self.define(sum, sv);
        Ok(())
    }

    /// One pass of a looped reduction: the row's threads stride over its groups, four groups
    /// per step (their loads issued together, as the CUDA emitter's `#pragma unroll 4`), then
    /// the remaining groups one per step.
    fn rloop(&mut self, body: &[TileStmt]) -> R<()> {
        let p = self.plan;
        let nchunk = self.rnumel().floor_div(p.vec as i64);
        if nchunk == Expr::int(0) {
            return Ok(());
        }
        let unroll = std::env::var("COIL_ROW_UNROLL").ok().and_then(|v| v.parse::<i64>().ok()).unwrap_or(4).max(1);
        let stmts: Vec<&TileStmt> = body.iter().collect();
        let group = Group::new(rindex(&self.rnumel()), "rchunk", nchunk, p.vec, "i");
        let rlane = self.rlane.expect("the lane");
        self.strided_groups(&stmts, group, nchunk, rlane, p.lanes as i64, unroll)
    }

    /// The groups `rchunk = first, first + step, ...` below `nchunk` of `stmts` (in `group`,
    /// whose indices name `rchunk`): `unroll` groups per loop step, their loads issued
    /// together, then the rest one per step. Each copy substitutes `rchunk` as the step's
    /// counter plus a constant, so the copies share address registers.
    fn strided_groups(
        &mut self,
        stmts: &[&TileStmt],
        group: Group,
        nchunk: Expr,
        first: Opnd,
        step: i64,
        unroll: i64,
    ) -> R<()> {
        let (c, t) = self.itype();
        let rchunk_sym = Expr::index_upto("rchunk", nchunk);
        let step_sym = Expr::index_upto("rstep", nchunk);
        let ctr = self.a.reg(c);
        self.a.op_into(ctr, &format!("mov.{}", t.replace('s', "b")), &[first]);
        let n = self.expr(nchunk)?;
        let widths: &[i64] = if unroll > 1 { &[unroll, 1] } else { &[1] };
        for &width in widths {
            let (top, end) = (self.a.label(), self.a.label());
            self.a.place(&top);
            let last = match width {
                1 => ctr,
                _ => self.a.op(c, &format!("add.{t}"), &[ctr.into(), Opnd::Int((width - 1) * step)]),
            };
            let out = self.a.op(Class::Pred, &format!("setp.ge.{t}"), &[last.into(), n]);
            self.a.branch_if(out, false, &end);
            self.push();
            self.syms.insert("rstep".into(), ctr.into());
            self.group = Some(group.clone());
            let mut loads = vec![];
            for u in 0..width {
                self.rchunk_as = Some((rchunk_sym, step_sym + u * step));
                loads.push(self.group_loads(stmts)?);
            }
            for (u, loaded) in loads.iter().enumerate() {
                self.rchunk_as = Some((rchunk_sym, step_sym + u as i64 * step));
                self.group_elements(stmts, loaded)?;
            }
            self.rchunk_as = None;
            self.group = None;
            self.pop();
            self.a.op_into(ctr, &format!("add.{t}"), &[ctr.into(), Opnd::Int(width * step)]);
            self.a.jump(&top);
            self.a.place(&end);
        }
        Ok(())
    }

    /// A column plan with `col_vec` outputs per thread ([`Plan::col_vec`]; one pass): each
    /// thread folds one accumulator per output over its share of the reduced positions, one
    /// vector access per position; the accumulators go to shared memory (one plane per
    /// output place), and the first `col_vec` threads along the reduced dim fold one output
    /// each and run its row statements (the CUDA emitter's `column_vectors`).
    fn column_vectors(&mut self, pieces: &[Piece], nchunk: Expr) -> R<()> {
        let p = self.plan;
        let v = p.col_vec;
        let (mut pass, mut after) = (None, Vec::new());
        for piece in pieces {
            match piece {
                Piece::Row(s @ TileStmt::Let { op: TileOp::Constant(_), .. }) if pass.is_none() => self.stmt(s)?,
                Piece::Row(s) => after.push(*s),
                Piece::Pass(stmts) => pass = Some(stmts.clone()),
            }
        }
        let stmts = pass.ok_or("a column plan without a pass")?;
        let reduces: Vec<(Var, ReduceOp)> = (stmts.iter())
            .filter_map(|s| match s {
                TileStmt::Reduce { var, op, .. } => Some((*var, *op)),
                _ => None,
            })
            .collect();
        for &(var, op) in &reduces {
            let (d, init) = self.acc_kind(var, op)?;
            for i in 0..v {
                let r = match d {
                    DType::F32 => self.a.op(Class::F32, "mov.f32", &[init]),
                    _ => self.a.op(Class::B64, "mov.b64", &[init]),
                };
                self.accs.insert((var, i), r);
            }
        }
        let groups = self.k.xnumel.floor_div(v as i64);
        let group = Group::new(xindex(&self.k.xnumel), "xg", groups, v, "i")
            .fixing(rindex(&self.rnumel()), Expr::index_upto("rchunk", nchunk));
        let rlane = self.rlane.expect("the lane");
        self.per_output = true;
        self.strided_groups(&stmts, group, nchunk, rlane, p.lanes as i64, 8)?;
        self.per_output = false;
        // stage: plane i holds every thread's accumulator of output place i
        let block = p.launch.block as usize;
        let tid = self.tid.expect("the thread index");
        let mut planes = IndexMap::new();
        for &(var, op) in &reduces {
            let (d, _) = self.acc_kind(var, op)?;
            let (ty, bytes) = if d == DType::F32 { ("f32", 4) } else { ("b64", 8) };
            let name = format!("{}_smem{var}", self.k.name);
            self.shared.push((name.clone(), block * v * bytes));
            let base = self.a.reg(Class::B32);
            self.a.ins(format!("mov.u32 {base}, {name}"));
            let mine = self.a.op(Class::B32, "mad.lo.u32", &[tid.into(), Opnd::Int(bytes as i64), base.into()]);
            for i in 0..v {
                let r = self.accs[&(var, i)];
                self.a.ins(format!("st.shared.{ty} [{mine}+{}], {r}", i * block * bytes));
            }
            planes.insert(var, (base, ty, bytes, d));
        }
        self.a.ins("bar.sync 0");
        // the first `v` threads along the reduced dim: output `v * xg + rlane` each
        let (c, t) = self.itype();
        let skip = self.a.label();
        let r = self.in_reg(rlane);
        let idle = self.a.op(Class::Pred, &format!("setp.ge.{t}"), &[r.into(), Opnd::Int(v as i64)]);
        self.a.branch_if(idle, false, &skip);
        self.push();
        let xg = self.syms["xg"];
        let xi = self.iop("mad.lo", &[xg, Opnd::Int(v as i64), rlane]);
        self.syms.insert("xindex".into(), xi);
        let across = p.col_threads();
        let x = self.a.op(Class::B32, "rem.u32", &[tid.into(), Opnd::Int(across as i64)]);
        let rl32 = if c == Class::B64 { self.a.op(Class::B32, "cvt.u32.u64", &[r.into()]) } else { r };
        for &(var, op) in &reduces {
            let (base, ty, bytes, d) = planes[&var];
            // plane `rlane`, slot `x`, then `x + across`, ... (the order of coil_col_fold)
            let plane =
                self.a.op(Class::B32, "mad.lo.u32", &[rl32.into(), Opnd::Int((block * bytes) as i64), base.into()]);
            let at = self.a.op(Class::B32, "mad.lo.u32", &[x.into(), Opnd::Int(bytes as i64), plane.into()]);
            let class = if d == DType::F32 { Class::F32 } else { Class::B64 };
            let mut acc = self.a.reg(class);
            self.a.ins(format!("ld.shared.{ty} {acc}, [{at}]"));
            for row in 1..p.lanes {
                let u = self.a.reg(class);
                self.a.ins(format!("ld.shared.{ty} {u}, [{at}+{}]", row * across * bytes));
                acc = self.a.op(class, Self::combine_instr(op, d), &[acc.into(), u.into()]);
            }
            let src = self.dtype(self.acc_source[&var]);
            let from = if matches!(op, ReduceOp::Max | ReduceOp::Min) && src.is_float() { src } else { d };
            let value = scalar::convert(&mut self.a, acc, from, self.dtypes[&var])?;
            self.define(var, value);
        }
        self.own_output = true;
        for s in after {
            self.stmt(s)?;
        }
        self.own_output = false;
        self.pop();
        self.a.place(&skip);
        // the next group's stage overwrites the planes
        self.a.ins("bar.sync 0");
        Ok(())
    }

    // ---- kernel shapes --------------------------------------------------------------------

    /// `for (name = first; name < count; name += gridDim.x * step_per_block)`, or, when the grid covers `count` at
    /// once (`per_step` values per step), the body once behind `name < count` (none if exact).
    fn grid_loop(
        &mut self,
        name: &str,
        first: Opnd,
        count: Expr,
        step_per_block: i64,
        per_step: u64,
        body: &mut dyn FnMut(&mut Self) -> R<()>,
    ) -> R<()> {
        let (c, t) = self.itype();
        let covered = count.const_value().filter(|&n| self.plan.launch.grid > 0 && per_step as i64 >= n);
        let end = self.a.label();
        let n = self.expr(count)?;
        match covered {
            Some(exact) if exact == per_step as i64 => {
                self.syms.insert(name.into(), first);
                self.push();
                body(self)?;
                self.pop();
            }
            Some(_) => {
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
                let s = self.iop("mul.lo", &[nct.into(), Opnd::Int(step_per_block)]);
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
        let body: Vec<&TileStmt> = self.k.body.iter().collect();
        let group = some_full.then(|| Group::new(xindex(&xn), "xvec", full, vec as usize, "i"));
        let uniform = group.as_ref().map(|g| uniform_values(g, &body)).unwrap_or_default();
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
                g.group = group.clone();
                g.push();
                let (uni, other): (Vec<&TileStmt>, Vec<&TileStmt>) =
                    body.iter().partition(|s| matches!(s, TileStmt::Let { var, .. } if uniform.contains(var)));
                for s in uni {
                    g.stmt(s)?;
                }
                g.group_body(&other)?;
                g.pop();
                g.group = None;
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
        self.grid_loop("xvec", first, groups, block, per_step, &mut run)
    }

    fn rnumel(&self) -> Expr {
        self.k.rnumel.expect("a reduction's row")
    }

    /// A persistent or looped reduction: `lanes` threads per row, `rows_per_block` rows per
    /// block, a grid-stride loop over the rows.
    fn reduction(&mut self) -> R<()> {
        let p = self.plan;
        let persistent = self.k.kind == KernelKind::PersistentReduction;
        if p.cluster > 1 {
            return Err("a row split over a cluster".into());
        }
        if p.col && (p.col_vec == 1 || !persistent) {
            return Err("a column plan of one output per thread".into());
        }
        if p.warps_per_row() > 1 && p.rows_per_block != 1 && !p.col {
            return Err("several multi-warp rows per block".into());
        }
        if persistent && !p.col && p.chunks * p.vec > MAX_ROW_VALUES {
            return Err(format!("{} values per thread", p.chunks * p.vec));
        }
        let tid = self.a.op(Class::B32, "mov.u32", &[Opnd::Text("%tid.x")]);
        self.tid = Some(tid);
        let lanes = p.lanes as i64;
        let rl = if p.col {
            self.a.op(Class::B32, "div.u32", &[tid.into(), Opnd::Int(p.col_threads() as i64)])
        } else if lanes == p.launch.block as i64 {
            tid
        } else {
            self.a.op(Class::B32, "rem.u32", &[tid.into(), Opnd::Int(lanes)])
        };
        let rlane = if self.wide { self.a.op(Class::B64, "cvt.u64.u32", &[rl.into()]) } else { rl };
        self.rlane = Some(rlane.into());
        if p.col {
            // a grid-stride loop over the groups of `col_vec` outputs
            let across = p.col_threads() as i64;
            let (ctaid, t) = (self.special("%ctaid.x"), self.special("%tid.x"));
            let (c, ty) = self.itype();
            let within = self.a.op(c, &format!("rem.{}", ty.replace('s', "u")), &[t.into(), Opnd::Int(across)]);
            let first = self.iop("mad.lo", &[ctaid.into(), Opnd::Int(across), within.into()]);
            let groups = self.k.xnumel.floor_div(p.col_vec as i64);
            let pieces = pieces(&self.k.body);
            let nchunk = self.rnumel().floor_div(p.vec as i64);
            let per_step = p.launch.grid as u64 * across as u64;
            let mut run = |g: &mut Self| g.column_vectors(&pieces, nchunk);
            return self.grid_loop("xg", first, groups, across, per_step, &mut run);
        }
        let ctaid = self.special("%ctaid.x");
        let first = if p.rows_per_block > 1 {
            let t = self.special("%tid.x");
            let tr = self.in_reg(t.into());
            let (c, ty) = self.itype();
            let within = self.a.op(c, &format!("div.{}", ty.replace('s', "u")), &[tr.into(), Opnd::Int(lanes)]);
            self.iop("mad.lo", &[ctaid.into(), Opnd::Int(p.rows_per_block as i64), within.into()])
        } else {
            ctaid.into()
        };
        let k = self.k;
        let pieces = if persistent { pieces(&k.body) } else { vec![] };
        self.arrays = persistent_arrays(&pieces);
        let nchunk = self.rnumel().floor_div(p.vec as i64);
        let per_step = (p.launch.grid as u64) * p.launch.per_block as u64;
        let xn = k.xnumel;
        let mut run = |g: &mut Self| -> R<()> {
            if !persistent {
                return k.body.iter().try_for_each(|s| g.stmt(s));
            }
            for piece in &pieces {
                match piece {
                    Piece::Row(s) => g.stmt(s)?,
                    Piece::Pass(stmts) => g.pass(stmts, nchunk)?,
                }
            }
            Ok(())
        };
        self.grid_loop("xindex", first, xn, p.rows_per_block as i64, per_step, &mut run)
    }

    /// One pass of a persistent reduction over the thread's chunks, then its reductions.
    /// The chunks are written out one after the other, sharing index and address registers
    /// ([`PtxGen::rchunk_as`]); except in a kernel of one block whose passes keep no values
    /// (the last stage of a split reduction, a mean over a batch: latency-bound, as the CUDA
    /// emitter's `#pragma unroll 1` says), where a loop over the chunks keeps the code short.
    fn pass(&mut self, stmts: &[&TileStmt], nchunk: Expr) -> R<()> {
        let p = self.plan;
        for s in stmts {
            if let TileStmt::Reduce { var, op, .. } = s {
                self.acc_init(*var, *op)?;
            }
        }
        if nchunk != Expr::int(0) {
            let rnumel = self.k.rnumel.expect("a reduction's row");
            let rt = p.row_threads() as i64;
            let rchunk_sym = Expr::index_upto("rchunk", nchunk);
            let rlane = self.rlane.expect("the lane");
            let (c, t) = self.itype();
            let one_block = p.launch.grid == 1 && p.chunks > 1;
            if one_block && self.arrays.is_empty() {
                let ctr = self.a.reg(c);
                self.a.op_into(ctr, &format!("mov.{}", t.replace('s', "b")), &[rlane]);
                let (top, end) = (self.a.label(), self.a.label());
                self.a.place(&top);
                let n = self.expr(nchunk)?;
                let out = self.a.op(Class::Pred, &format!("setp.ge.{t}"), &[ctr.into(), n]);
                self.a.branch_if(out, false, &end);
                self.syms.insert("rchunk".into(), ctr.into());
                self.group = Some(Group::new(rindex(&rnumel), "rchunk", nchunk, p.vec, "i"));
                self.push();
                self.group_body(stmts)?;
                self.pop();
                self.group = None;
                self.a.op_into(ctr, &format!("add.{t}"), &[ctr.into(), Opnd::Int(rt)]);
                self.a.jump(&top);
                self.a.place(&end);
            } else {
                let all_full = Expr::int(p.chunks as i64 * rt) == nchunk;
                self.syms.insert("rlane".into(), rlane);
                let rlane_sym = Expr::index("rlane", p.lanes as i64);
                for k in 0..p.chunks {
                    let skip = self.a.label();
                    // a chunk some threads skip keeps what it computes to itself
                    if !all_full {
                        let rchunk = self.expr(rlane_sym + k as i64 * rt)?;
                        let n = self.expr(nchunk)?;
                        let r = self.in_reg(rchunk);
                        let out = self.a.op(Class::Pred, &format!("setp.ge.{t}"), &[r.into(), n]);
                        self.a.branch_if(out, false, &skip);
                        self.push();
                    } else {
                        self.scopes.push(IndexMap::new());
                    }
                    self.rchunk_as = Some((rchunk_sym, rlane_sym + k as i64 * rt));
                    self.group = Some(Group::new(rindex(&rnumel), "rchunk", nchunk, p.vec, "i"));
                    self.chunk = k;
                    self.group_body(stmts)?;
                    self.group = None;
                    self.rchunk_as = None;
                    if !all_full {
                        self.pop();
                    } else {
                        self.scopes.pop();
                    }
                    self.a.place(&skip);
                }
            }
        }
        for s in stmts {
            if let TileStmt::Reduce { var, op, .. } = s {
                self.acc_finish(*var, *op, *var)?;
            }
        }
        Ok(())
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
        let raw = self.a.reg(Class::B64);
        self.a.ins(format!("ld.param.u64 {raw}, [{}]", param(n)));
        self.status = Some(self.a.op(Class::B64, "cvta.to.global.u64", &[raw.into()]));
        match k.kind {
            KernelKind::Pointwise => self.pointwise()?,
            KernelKind::PersistentReduction | KernelKind::LoopedReduction => self.reduction()?,
            _ => return Err(format!("a {} kernel", k.kind.name())),
        }
        self.a.ins("ret");
        let mut out = String::new();
        for (name, bytes) in &self.shared {
            let _ = writeln!(out, ".shared .align 8 .b8 {name}[{bytes}];");
        }
        let params: Vec<String> = (0..=n).map(|i| format!("\t.param .u64 {}", param(i))).collect();
        let _ = writeln!(out, ".visible .entry {}(\n{}\n)", k.name, params.join(",\n"));
        let block = self.plan.launch.block;
        let _ = writeln!(out, ".maxntid {block}, 1, 1");
        if k.kind == KernelKind::LoopedReduction && block >= 512 && self.plan.launch.grid != 1 {
            // Two blocks of 1024 threads per SM need at most 32 registers each; left alone,
            // the driver's assembler gave cross-entropy's looped online softmax 47 (one block
            // per SM: 314 us, where NVRTC's 32 registers ran in 283 us on the H100).
            let _ = writeln!(out, ".minnctapersm {}", 2048 / block);
        }
        out.push_str("{\n");
        out.push_str(&self.a.finish());
        out.push_str("}\n");
        Ok(out)
    }
}
