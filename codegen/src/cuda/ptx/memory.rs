//! Memory in PTX: element addresses, scalar and vector loads and stores (raw words decoded
//! element by element), and the bounds-checked loads of gathers.

use super::*;

/// The raw words of a group's vector load of a buffer of `buf`.
pub(super) struct Words {
    buf: DType,
    words: Vec<Reg>,
}

/// The address operand `[addr+off]` (a byte offset).
pub(super) fn mem(addr: Reg, off: i64) -> String {
    if off == 0 {
        format!("[{addr}]")
    } else {
        format!("[{addr}+{off}]")
    }
}

impl<'a> PtxGen<'a> {
    /// The address of element `idx + extra` of argument `arg`, as a register and a byte offset.
    pub(super) fn address(&mut self, arg: usize, idx: Opnd, extra: i64) -> (Reg, i64) {
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

    /// A scalar load of element `idx + extra` of `arg` as a value of `val`; under `guard` only
    /// (else the raw element is 0).
    pub(super) fn load(&mut self, arg: usize, idx: Opnd, extra: i64, val: DType, guard: Option<Reg>) -> R<Reg> {
        let buf = self.k.args[arg].dtype;
        let (ty, class) = (mem_type(buf)?, raw_class(buf)?);
        let (addr, off) = self.address(arg, idx, extra);
        let raw = self.a.reg(class);
        let text = format!("ld.global.{ty} {raw}, {}", mem(addr, off));
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
    pub(super) fn store(&mut self, arg: usize, idx: Opnd, extra: i64, v: Reg, val: DType, guard: Option<Reg>) -> R<()> {
        let buf = self.k.args[arg].dtype;
        let raw = scalar::to_storage(&mut self.a, v, val, buf)?;
        let (addr, off) = self.address(arg, idx, extra);
        let g = guard.map_or(String::new(), |p| format!("@{p} "));
        self.a.ins(format!("{g}st.global.{} {}, {raw}", mem_type(buf)?, mem(addr, off)));
        Ok(())
    }

    /// How the current group reaches `arg` at `index`: as the CUDA emitter does, except that
    /// 1-byte elements go one by one.
    pub(super) fn access(&self, arg: usize, index: Expr) -> Access {
        let dtype = self.k.args[arg].dtype;
        match &self.group {
            Some(g) => match g.access(index, dtype) {
                Access::Vector { .. } if dtype.size_bytes() == 1 => Access::Scalar,
                a => self.facts.window_aligned(arg, a),
            },
            None => Access::Scalar,
        }
    }

    /// The group's vector load of `arg` at `index`: the raw words, decoded element by element
    /// where each is used ([`PtxGen::element`]), so that only the words are live across the
    /// group's other loads.
    pub(super) fn load_vector(&mut self, arg: usize, index: Expr, piece: usize) -> R<Words> {
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
                1 => self.a.ins(format!("ld.global.{ty} {}, {at}", list[0])),
                _ => self.a.ins(format!("ld.global.v{n}.{ty} {{{}}}, {at}", list.join(", "))),
            }
            words.extend(regs);
        }
        Ok(Words { buf, words })
    }

    /// Element `i` of a vector load as a value of `val`.
    pub(super) fn element(&mut self, w: &Words, i: usize, val: DType) -> R<Reg> {
        let pairs = w.words[0].class == Class::B32 && matches!(w.buf, DType::F16 | DType::BF16);
        let e = match w.buf {
            DType::I32 => self.a.op(Class::B64, "cvt.s64.s32", &[w.words[i].into()]),
            DType::BF16 if pairs => {
                let word = w.words[i / 2];
                let bits = if i.is_multiple_of(2) {
                    self.a.op(Class::B32, "shl.b32", &[word.into(), Opnd::Int(16)])
                } else {
                    self.a.op(Class::B32, "and.b32", &[word.into(), Opnd::Int(0xffff_0000u32 as i64)])
                };
                self.a.op(Class::F32, "mov.b32", &[bits.into()])
            }
            DType::F16 if pairs => {
                let (lo, hi) = (self.a.reg(Class::B16), self.a.reg(Class::B16));
                self.a.ins(format!("mov.b32 {{{lo}, {hi}}}, {}", w.words[i / 2]));
                self.a.op(Class::F32, "cvt.f32.f16", &[if i.is_multiple_of(2) { lo } else { hi }.into()])
            }
            DType::F16 => self.a.op(Class::F32, "cvt.f32.f16", &[w.words[i].into()]),
            DType::BF16 => scalar::bf16_to_f32(&mut self.a, w.words[i]),
            _ => w.words[i],
        };
        // a value of the buffer's dtype (in its register class)
        scalar::convert(&mut self.a, e, w.buf, val)
    }

    /// The group's vector store of `values` (one per element, with their dtypes) into `arg`.
    pub(super) fn store_vector(&mut self, arg: usize, index: Expr, piece: usize, values: &[(Reg, DType)]) -> R<()> {
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
                DType::I16 => {
                    // wrapped to 16 bits, two to a word (the first in the low half)
                    let mut halves = vec![];
                    for &(v, d) in elems {
                        let w = scalar::convert(&mut self.a, v, d, DType::I16)?;
                        let w = self.a.op(Class::B32, "cvt.u32.u64", &[w.into()]);
                        halves.push(self.a.op(Class::B32, "and.b32", &[w.into(), Opnd::Hex(0xFFFF)]));
                    }
                    match halves[..] {
                        [h] => ("b16", vec![self.a.op(Class::B16, "cvt.u16.u32", &[h.into()])]),
                        _ => {
                            let words = halves.chunks(2).map(|pair| {
                                let high = self.a.op(Class::B32, "shl.b32", &[pair[1].into(), Opnd::Int(16)]);
                                self.a.op(Class::B32, "or.b32", &[pair[0].into(), high.into()])
                            });
                            ("b32", words.collect())
                        }
                    }
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

    /// `arg[index + stride * v]` for the loaded index `v` in `0..bound`; out of range, the
    /// first failing thread of the launch records `(1, v, bound)` in `status` and the value
    /// is 0 (the CUDA prelude's `coil_index_error`).
    pub(super) fn indirect_load(
        &mut self,
        arg: usize,
        index: Expr,
        indirect: Var,
        stride: Expr,
        bound: Expr,
        out: DType,
    ) -> R<Reg> {
        let (pos, off, ok, check) = self.indirect_position(index, indirect, stride, bound)?;
        let value = self.load(arg, pos.into(), off, out, Some(ok))?;
        self.record_index_error(ok, check);
        Ok(value)
    }

    /// A window of `arg` ([`TileStmt::Window`]) at offset `v`: checks `0 <= v <= bound - size`
    /// where `check` (out of range, the launch's first thread records `(1, first position
    /// outside, bound)` in `status`, as the CUDA emitter does, and every thread returns before
    /// it stores anything), then moves `arg`'s pointer by `stride * v` elements.
    pub(super) fn window(
        &mut self,
        arg: usize,
        offset: Var,
        stride: Expr,
        size: Expr,
        bound: Expr,
        check: bool,
    ) -> R<()> {
        use Class::*;
        let v = self.val(offset)?;
        let v = scalar::convert(&mut self.a, v, self.facts.dtypes[&offset], DType::I64)?;
        if check {
            self.window_check(v, size, bound)?;
        }
        let stride = self.index_b64(stride)?;
        let elems = self.a.op(B64, "mul.lo.s64", &[v.into(), stride.into()]);
        let bytes = self.k.args[arg].dtype.size_bytes() as i64;
        self.ptrs[arg] = self.a.op(B64, "mad.lo.s64", &[elems.into(), Opnd::Int(bytes), self.ptrs[arg].into()]);
        Ok(())
    }

    /// [`PtxGen::window`]'s check of the offset `v` (an `.s64` register).
    fn window_check(&mut self, v: Reg, size: Expr, bound: Expr) -> R<()> {
        use Class::*;
        let last = self.index_b64(bound - size)?;
        let bound = self.index_b64(bound)?;
        let below = self.a.op(Pred, "setp.lt.s64", &[v.into(), Opnd::Int(0)]);
        let above = self.a.op(Pred, "setp.gt.s64", &[v.into(), last.into()]);
        let bad = self.a.op(Pred, "or.pred", &[below.into(), above.into()]);
        // the first position outside: `v` below 0 or past the dim, else the dim's end
        let past = self.a.op(Pred, "setp.gt.s64", &[v.into(), bound.into()]);
        let at_v = self.a.op(Pred, "or.pred", &[below.into(), past.into()]);
        let first = self.a.op(B64, "selp.b64", &[v.into(), bound.into(), at_v.into()]);
        let (tid, ctaid) = (self.special("%tid.x"), self.special("%ctaid.x"));
        let (_, t) = self.itype();
        let either = self.a.op(tid.class, &format!("or.b{}", &t[1..]), &[tid.into(), ctaid.into()]);
        let leader = self.a.op(Pred, &format!("setp.eq.{t}"), &[either.into(), Opnd::Int(0)]);
        let report = self.a.op(Pred, "and.pred", &[bad.into(), leader.into()]);
        let status = self.status.expect("the status pointer");
        let old = self.a.op(B64, "mov.b64", &[Opnd::Int(1)]);
        self.a.ins(format!("@{report} atom.global.cas.b64 {old}, [{status}], 0, 1"));
        let won = self.a.op(Pred, "setp.eq.s64", &[old.into(), Opnd::Int(0)]);
        self.a.ins(format!("@{won} st.global.b64 [{status}+8], {first}"));
        self.a.ins(format!("@{won} st.global.b64 [{status}+16], {bound}"));
        self.a.ins(format!("@{bad} ret"));
        Ok(())
    }

    /// The element `index + stride * v` of a data-dependent access (a register and a constant
    /// offset), the predicate `0 <= v < bound`, and `(v, bound)` for
    /// [`PtxGen::record_index_error`].
    fn indirect_position(
        &mut self,
        index: Expr,
        indirect: Var,
        stride: Expr,
        bound: Expr,
    ) -> R<(Reg, i64, Reg, (Reg, Opnd))> {
        use Class::*;
        let v = self.val(indirect)?;
        let v = scalar::convert(&mut self.a, v, self.facts.dtypes[&indirect], DType::I64)?;
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
        Ok((pos, off, ok, (v, bound)))
    }

    /// Where `ok` fails, the first failing thread of the launch records `(1, v, bound)` in
    /// `status`.
    fn record_index_error(&mut self, ok: Reg, (v, bound): (Reg, Opnd)) {
        use Class::*;
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
    }
}
