//! Index arithmetic in PTX: index expressions over the bound symbols (memoized per scope),
//! division and modulo by constants without a division instruction, the per-element parts of
//! a group's indices, and integer division of values.

use super::*;

/// The multiplier `m` and shift `s` with `x / d == (x * m) >> (bits + 1 + s)` for every
/// `x < 2^bits` (`bits` 31 or 63; `d >= 2`): `m = ceil(2^(bits + l) / d)` with
/// `l = ceil(log2 d)`, `s = l - 1`. `m` fits in `bits + 1` bits, so `mul.hi` of the register
/// width gives `(x * m) >> (bits + 1)`.
pub(crate) fn division_magic(d: u64, bits: u32) -> (u64, u32) {
    let l = 64 - (d - 1).leading_zeros();
    let m = (1u128 << (bits + l)).div_ceil(u128::from(d));
    (m as u64, l - 1)
}

impl PtxGen<'_> {
    /// The value of an index expression over the bound symbols.
    pub(super) fn expr(&mut self, e: Expr) -> R<Opnd> {
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
                if let Some(d) = y.const_value().filter(|&d| d >= 1 && (nonneg(*x) || d.count_ones() == 1)) {
                    self.div_by_constant(xv, d, div)
                } else if nonneg(*x) && positive {
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

    /// `x // d` or `x % d` (floor) for a constant `d >= 1`, without a division instruction:
    /// ptxas emits its division routine even for an immediate divisor (a bias broadcast's
    /// `xindex % 8192` cost bias + gelu 1%, and a 64-bit one per thread made a dynamic
    /// pointwise kernel 25% slower). A power of two is a shift and a mask (exact floor for
    /// negative `x` too, in two's complement); any other `d` (only for `x >= 0`) multiplies by
    /// `m = ceil(2^(N+l) / d)`, `l = ceil(log2 d)`, `N` the dividend's magnitude bits (31 or
    /// 63: index values are nonnegative and fit), and takes the high half shifted by `l - 1`:
    /// exact for every `x < 2^N` (Granlund & Montgomery 1994), `m` fits in 32 or 64 bits.
    pub(super) fn div_by_constant(&mut self, x: Opnd, d: i64, div: bool) -> Opnd {
        let (c, t) = self.itype();
        if let Opnd::Int(v) = x {
            return Opnd::Int(if div { v.div_euclid(d) } else { v.rem_euclid(d) });
        }
        let xr = self.in_reg(x);
        if d.count_ones() == 1 && d > 1 {
            // also for negative `x`: an arithmetic shift floors, the mask is the floor modulo
            let shift = d.trailing_zeros() as i64;
            return if div {
                self.a.op(c, &format!("shr.{t}"), &[xr.into(), Opnd::Int(shift)]).into()
            } else {
                self.a.op(c, &format!("and.{}", t.replace('s', "b")), &[xr.into(), Opnd::Int(d - 1)]).into()
            };
        }
        self.udiv_const(c, xr, d, div).into()
    }

    /// `x / d` or `x % d` of a nonnegative register of `class` (`B32` or `B64`, below 2^31 or
    /// 2^63) by a constant `d >= 1` ([`division_magic`], or a shift and a mask for a power of
    /// two).
    pub(super) fn udiv_const(&mut self, class: Class, x: Reg, d: i64, div: bool) -> Reg {
        let (bits, w) = if class == Class::B64 { (63u32, 64) } else { (31, 32) };
        if d == 1 {
            return if div { x } else { self.a.op(class, &format!("mov.b{w}"), &[Opnd::Int(0)]) };
        }
        if d.count_ones() == 1 {
            return if div {
                self.a.op(class, &format!("shr.u{w}"), &[x.into(), Opnd::Int(d.trailing_zeros() as i64)])
            } else {
                self.a.op(class, &format!("and.b{w}"), &[x.into(), Opnd::Int(d - 1)])
            };
        }
        let (m, shift) = division_magic(d as u64, bits);
        let hi = self.a.op(class, &format!("mul.hi.u{w}"), &[x.into(), Opnd::Hex(m)]);
        let q = self.a.op(class, &format!("shr.u{w}"), &[hi.into(), Opnd::Int(i64::from(shift))]);
        if div {
            q
        } else {
            let qd = self.a.op(class, &format!("mul.lo.u{w}"), &[q.into(), Opnd::Int(d)]);
            self.a.op(class, &format!("sub.u{w}"), &[x.into(), qd.into()])
        }
    }

    /// Floor division or modulo of signed operands: C's truncating ones, corrected when the
    /// remainder is nonzero and of the other sign than the divisor.
    pub(super) fn floor_div_mod(&mut self, x: Opnd, y: Opnd, div: bool) -> Opnd {
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
    pub(super) fn index_parts(&mut self, index: Expr) -> R<(Opnd, i64)> {
        let i = self.elem.unwrap_or(0) as i64;
        // the pure rewrites (peeling, substitutions) once per group and index: Expr
        // arithmetic dominated the emitter's time when it ran per element
        let peeled = (self.group_id, index, self.rchunk_as, None);
        if let Some(&(base, k, c)) = self.index_cache.get(&peeled) {
            return Ok((self.expr(base)?, k + c * i));
        }
        let at_element = (self.group_id, index, self.rchunk_as, Some(i));
        if let Some(&(base, k, _)) = self.index_cache.get(&at_element) {
            return Ok((self.expr(base)?, k));
        }
        let (key, base, k, c) = match &self.group {
            None => {
                let (b, k) = self.split_expr(index);
                (peeled, b, k, 0)
            }
            Some(g) => match g.peel(index) {
                Some((e0, c)) => {
                    let (b, k) = self.split_expr(e0);
                    (peeled, b, k, c)
                }
                None => {
                    let at = g.at(index, g.pos).substitute(&IndexMap::from([(g.i, Expr::int(i))]));
                    let (b, k) = self.split_expr(at);
                    (at_element, b, k, 0)
                }
            },
        };
        self.index_cache.insert(key, (base, k, c));
        let off = if key.3.is_none() { c * i } else { 0 };
        Ok((self.expr(base)?, k + off))
    }

    /// After [`PtxGen::index_parts`] of `index` in a group: how much it grows from one of the
    /// group's elements to the next (`None`: it did not peel into base + step * element).
    pub(super) fn index_step(&self, index: Expr) -> Option<i64> {
        self.index_cache.get(&(self.group_id, index, self.rchunk_as, None)).map(|&(_, _, step)| step)
    }

    /// `e` with the chunk's `rchunk` substituted, as a computed part and a constant one.
    pub(super) fn split_expr(&self, e: Expr) -> (Expr, i64) {
        let e = match self.rchunk_as {
            Some((from, to)) => e.substitute(&IndexMap::from([(from, to)])),
            None => e,
        };
        match &*e.kind() {
            ExprKind::Add { constant, .. } if *constant != 0 => (e - *constant, *constant),
            _ => (e, 0),
        }
    }

    /// Index expression `e` at the current element, as a 64-bit register.
    pub(super) fn index_b64(&mut self, e: Expr) -> R<Reg> {
        let (b, off) = self.index_parts(e)?;
        Ok(match self.wide_index(b) {
            Opnd::Int(c) => self.a.op(Class::B64, "mov.b64", &[Opnd::Int(c + off)]),
            Opnd::Reg(r) if off == 0 => r,
            o => self.a.op(Class::B64, "add.s64", &[o, Opnd::Int(off)]),
        })
    }

    /// [`PtxGen::split_expr`], the computed part in a register.
    pub(super) fn split_constant(&mut self, e: Expr) -> R<(Opnd, i64)> {
        let (b, k) = self.split_expr(e);
        Ok((self.expr(b)?, k))
    }

    /// Floor or truncating division or `torch.remainder` of two `.s64` values, as the prelude's
    /// `coil_ifloordiv`, `coil_itruncdiv` and `coil_iremainder`: a zero divisor records error 3
    /// in the status and yields 0; a divisor of -1 negates (wrapping) or leaves 0, so that
    /// `i64::MIN / -1` never reaches the hardware division.
    pub(super) fn integer_division(&mut self, op: BinaryOp, a: Reg, b: Reg) -> Reg {
        use Class::*;
        let zero = self.a.op(Pred, "setp.eq.s64", &[b.into(), Opnd::Int(0)]);
        let minus_one = self.a.op(Pred, "setp.eq.s64", &[b.into(), Opnd::Int(-1)]);
        let special = self.a.op(Pred, "or.pred", &[zero.into(), minus_one.into()]);
        let safe = self.a.op(B64, "selp.b64", &[Opnd::Int(1), b.into(), special.into()]);
        let q = self.a.op(B64, "div.s64", &[a.into(), safe.into()]);
        let r = self.a.op(B64, "rem.s64", &[a.into(), safe.into()]);
        // floor: a nonzero remainder of the other sign than the divisor steps once more
        let nonzero = self.a.op(Pred, "setp.ne.s64", &[r.into(), Opnd::Int(0)]);
        let r_neg = self.a.op(Pred, "setp.lt.s64", &[r.into(), Opnd::Int(0)]);
        let b_neg = self.a.op(Pred, "setp.lt.s64", &[b.into(), Opnd::Int(0)]);
        let signs = self.a.op(Pred, "xor.pred", &[r_neg.into(), b_neg.into()]);
        let fix = self.a.op(Pred, "and.pred", &[nonzero.into(), signs.into()]);
        let (plain, by_minus_one) = match op {
            BinaryOp::FloorDiv => {
                let q1 = self.a.op(B64, "sub.s64", &[q.into(), Opnd::Int(1)]);
                (self.a.op(B64, "selp.b64", &[q1.into(), q.into(), fix.into()]), self.a.op(B64, "neg.s64", &[a.into()]))
            }
            BinaryOp::TruncDiv => (q, self.a.op(B64, "neg.s64", &[a.into()])),
            _ => {
                let rb = self.a.op(B64, "add.s64", &[r.into(), b.into()]);
                let m = self.a.op(B64, "selp.b64", &[rb.into(), r.into(), fix.into()]);
                (m, self.a.op(B64, "mov.b64", &[Opnd::Int(0)]))
            }
        };
        let v = self.a.op(B64, "selp.b64", &[by_minus_one.into(), plain.into(), minus_one.into()]);
        let v = self.a.op(B64, "selp.b64", &[Opnd::Int(0), v.into(), zero.into()]);
        self.record_error(zero, 3);
        v
    }

    /// `pow` of two `.s64` values as the prelude's `coil_ipow`: square and multiply over the
    /// exponent's bits (wrapping); a negative exponent records error 2 and yields 0.
    pub(super) fn integer_pow(&mut self, a: Reg, b: Reg) -> Reg {
        use Class::*;
        let negative = self.a.op(Pred, "setp.lt.s64", &[b.into(), Opnd::Int(0)]);
        let (acc, base, e) = (self.a.reg(B64), self.a.reg(B64), self.a.reg(B64));
        self.a.op_into(acc, "mov.b64", &[Opnd::Int(1)]);
        self.a.op_into(base, "mov.b64", &[a.into()]);
        self.a.op_into(e, "mov.b64", &[b.into()]);
        let (top, end) = (self.a.label(), self.a.label());
        self.a.place(&top);
        let done = self.a.op(Pred, "setp.eq.s64", &[e.into(), Opnd::Int(0)]);
        self.a.branch_if(done, false, &end);
        let bit = self.a.op(B64, "and.b64", &[e.into(), Opnd::Int(1)]);
        let odd = self.a.op(Pred, "setp.ne.s64", &[bit.into(), Opnd::Int(0)]);
        let product = self.a.op(B64, "mul.lo.s64", &[acc.into(), base.into()]);
        self.a.op_into(acc, "selp.b64", &[product.into(), acc.into(), odd.into()]);
        self.a.op_into(base, "mul.lo.s64", &[base.into(), base.into()]);
        self.a.op_into(e, "shr.u64", &[e.into(), Opnd::Int(1)]);
        self.a.jump(&top);
        self.a.place(&end);
        self.record_error(negative, 2);
        self.a.op(B64, "selp.b64", &[Opnd::Int(0), acc.into(), negative.into()])
    }

    /// Where `when` holds, the prelude's `coil_fail(status, code, 0, 0)`: the first error of
    /// the launch wins the status word (compare-and-swap from 0), its two operands are zeroed.
    fn record_error(&mut self, when: Reg, code: i64) {
        use Class::*;
        let status = self.status.expect("the status pointer");
        let old = self.a.op(B64, "mov.b64", &[Opnd::Int(1)]);
        self.a.ins(format!("@{when} atom.global.cas.b64 {old}, [{status}], 0, {code}"));
        let won = self.a.op(Pred, "setp.eq.s64", &[old.into(), Opnd::Int(0)]);
        let nothing = self.a.op(B64, "mov.b64", &[Opnd::Int(0)]);
        self.a.ins(format!("@{won} st.global.b64 [{status}+8], {nothing}"));
        self.a.ins(format!("@{won} st.global.b64 [{status}+16], {nothing}"));
    }
}
