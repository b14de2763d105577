//! Reductions in PTX: the accumulators, the block-wide combines (shuffle trees, shared-memory
//! stages, online-softmax pairs), persistent passes and looped passes, and the choice of a
//! kernel's shape (column plans: `column.rs`); the shapes of the CUDA emitter's `reduce.rs`.

use super::*;

impl<'a> PtxGen<'a> {
    /// Folds a group's values into the thread's online-softmax pair (the prelude's
    /// `coil_online_group`): their maximum first, one rescale of the sum if it grew, then the
    /// exponentials, unless the maximum is still -inf.
    pub(super) fn online_group(&mut self, m: Var, s: Var, xs: &[Reg]) {
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
    pub(super) fn acc_kind(&self, acc: Var, op: ReduceOp) -> R<(DType, Opnd)> {
        let (src, out) = (self.dtype(self.facts.acc_source[&acc]), self.dtype(acc));
        Ok(match op {
            ReduceOp::Sum | ReduceOp::Prod if out.is_float() => {
                class_of(out)?;
                (DType::F32, Opnd::F32(if op == ReduceOp::Sum { 0.0 } else { 1.0 }))
            }
            ReduceOp::Sum => (DType::I64, Opnd::Int(0)),
            ReduceOp::Prod => (DType::I64, Opnd::Int(1)),
            // (for arg reductions the value half of a (value, index) pair; the index starts at
            // NO_INDEX)
            _ => {
                let max = matches!(op, ReduceOp::Max | ReduceOp::ArgMax);
                if src.is_float() {
                    class_of(src)?;
                    (DType::F32, Opnd::F32(if max { f32::NEG_INFINITY } else { f32::INFINITY }))
                } else {
                    (DType::I64, Opnd::Int(if max { i64::MIN } else { i64::MAX }))
                }
            }
        })
    }

    /// Whether pair `b` beats pair `a` in an arg reduction (the prelude's `coil_argbest`): the
    /// better value, NaN counting as the best; ties, and NaN against NaN, go to the lower
    /// index, so any tree order finds the first best index.
    fn arg_takes(&mut self, a: (Reg, Reg), b: (Reg, Reg), max: bool, d: DType) -> Reg {
        use Class::*;
        let lower = self.a.op(Pred, "setp.lt.s64", &[b.1.into(), a.1.into()]);
        let (ty, cmp) = (if d == DType::F32 { "f32" } else { "s64" }, if max { "gt" } else { "lt" });
        let better = self.a.op(Pred, &format!("setp.{cmp}.{ty}"), &[b.0.into(), a.0.into()]);
        let same = self.a.op(Pred, &format!("setp.eq.{ty}"), &[b.0.into(), a.0.into()]);
        let tie = self.a.op(Pred, "and.pred", &[same.into(), lower.into()]);
        let take = self.a.op(Pred, "or.pred", &[better.into(), tie.into()]);
        if d != DType::F32 {
            return take;
        }
        // comparisons with NaN are false, so `take` is false there and only NaN decides
        let a_nan = self.a.op(Pred, "setp.nan.f32", &[a.0.into(), a.0.into()]);
        let b_nan = self.a.op(Pred, "setp.nan.f32", &[b.0.into(), b.0.into()]);
        let a_num = self.a.op(Pred, "not.pred", &[a_nan.into()]);
        let over = self.a.op(Pred, "or.pred", &[a_num.into(), lower.into()]);
        let nan = self.a.op(Pred, "and.pred", &[b_nan.into(), over.into()]);
        self.a.op(Pred, "or.pred", &[take.into(), nan.into()])
    }

    /// The better of two arg pairs, in new registers.
    pub(super) fn arg_pick(&mut self, a: (Reg, Reg), b: (Reg, Reg), max: bool, d: DType) -> (Reg, Reg) {
        let take = self.arg_takes(a, b, max, d);
        let sel = if d == DType::F32 { "selp.f32" } else { "selp.b64" };
        let v = self.a.op(a.0.class, sel, &[b.0.into(), a.0.into(), take.into()]);
        let i = self.a.op(Class::B64, "selp.b64", &[b.1.into(), a.1.into(), take.into()]);
        (v, i)
    }

    /// The reduced position of the group's current element, as a 64-bit register.
    fn position(&mut self) -> R<Reg> {
        let fast = self.group.as_ref().ok_or("an arg reduction outside a group")?.fast;
        self.index_b64(fast)
    }

    pub(super) fn combine_instr(op: ReduceOp, acc: DType) -> &'static str {
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

    pub(super) fn acc_init(&mut self, acc: Var, op: ReduceOp) -> R<()> {
        let (d, init) = self.acc_kind(acc, op)?;
        let r = if d == DType::F32 {
            self.a.op(Class::F32, "mov.f32", &[init])
        } else {
            self.a.op(Class::B64, "mov.b64", &[init])
        };
        self.accs.insert((acc, 0), r);
        if op.is_arg() {
            let i = self.a.op(Class::B64, "mov.b64", &[Opnd::Int(i64::MAX)]);
            self.arg_index.insert((acc, 0), i);
        }
        Ok(())
    }

    pub(super) fn acc_update(&mut self, acc: Var, op: ReduceOp, value: Var) -> R<()> {
        let (d, _) = self.acc_kind(acc, op)?;
        let (v, src) = (self.val(value)?, self.dtype(value));
        // max/min of floats compare in the source's compute type (f32 here)
        let v = scalar::convert(&mut self.a, v, src, if src.is_float() && d == DType::F32 { DType::F32 } else { d })?;
        let slot = if self.per_output { self.elem.unwrap_or(0) } else { 0 };
        let r = self.accs[&(acc, slot)];
        if op.is_arg() {
            let (i, at) = (self.arg_index[&(acc, slot)], self.position()?);
            let take = self.arg_takes((r, i), (v, at), op == ReduceOp::ArgMax, d);
            let sel = if d == DType::F32 { "selp.f32" } else { "selp.b64" };
            self.a.op_into(r, sel, &[v.into(), r.into(), take.into()]);
            self.a.op_into(i, "selp.b64", &[at.into(), i.into(), take.into()]);
            return Ok(());
        }
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
        if self.plan.col {
            return Ok(self.column_reduce(acc, op)?.0);
        }
        let (d, _) = self.acc_kind(acc, op)?;
        let instr = Self::combine_instr(op, d);
        let mut v = self.accs[&(acc, 0)];
        for o in [16, 8, 4, 2, 1] {
            let t = self.shuffle(v, "down", o);
            v = self.a.op(v.class, instr, &[v.into(), t.into()]);
        }
        v = self.shuffle(v, "idx", 0);
        let (warps, cluster) = (self.plan.warps_per_row(), self.plan.cluster);
        if warps == 1 && cluster == 1 {
            return Ok(v);
        }
        let (ty, bytes) = if d == DType::F32 { ("f32", 4) } else { ("b64", 8) };
        let name = format!("{}_smem{acc}", self.k.name);
        // a cluster's blocks leave their results in one more slot
        self.shared.push((name.clone(), (warps + usize::from(cluster > 1)) * bytes));
        let tid = self.tid.expect("the thread index");
        let base = self.a.reg(Class::B32);
        self.a.ins(format!("mov.u32 {base}, {name}"));
        if warps > 1 {
            let lane = self.a.op(Class::B32, "and.b32", &[tid.into(), Opnd::Int(31)]);
            let first = self.a.op(Class::Pred, "setp.eq.u32", &[lane.into(), Opnd::Int(0)]);
            let warp = self.a.op(Class::B32, "shr.u32", &[tid.into(), Opnd::Int(5)]);
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
        if cluster > 1 {
            // the prelude's `coil_reduce_cluster`: each block's result in slot W, then after the
            // cluster's barrier every thread folds the blocks' results in block order, read
            // from their shared memory (the caller syncs the cluster before the slot is reused)
            let first = self.a.op(Class::Pred, "setp.eq.u32", &[tid.into(), Opnd::Int(0)]);
            let slot = warps * bytes;
            self.a.ins(format!("@{first} st.shared.{ty} [{base}+{slot}], {v}"));
            self.cluster_sync();
            let local = self.a.op(Class::B32, "add.u32", &[base.into(), Opnd::Int(slot as i64)]);
            let mut r: Option<Reg> = None;
            for c in 0..cluster {
                let remote = self.a.op(Class::B32, "mapa.shared::cluster.u32", &[local.into(), Opnd::Int(c as i64)]);
                let t = self.a.reg(v.class);
                self.a.ins(format!("ld.shared::cluster.{ty} {t}, [{remote}]"));
                r = Some(match r {
                    None => t,
                    Some(acc) => self.a.op(v.class, instr, &[acc.into(), t.into()]),
                });
            }
            v = r.expect("a cluster of blocks");
        }
        Ok(v)
    }

    /// The row's best (value, index) pair of arg reduction `acc` ([`PtxGen::block_reduce`]'s
    /// shapes with [`PtxGen::arg_pick`]): a shuffle tree per warp, broadcast from lane 0, then
    /// for several warps a shared-memory stage that every thread folds in warp order.
    fn arg_block_reduce(&mut self, acc: Var, op: ReduceOp) -> R<(Reg, Reg)> {
        let (d, _) = self.acc_kind(acc, op)?;
        if self.plan.cluster > 1 {
            return Err("an arg reduction over a cluster".into());
        }
        if self.plan.col {
            let (v, i) = self.column_reduce(acc, op)?;
            return Ok((v, i.expect("an arg reduction's index")));
        }
        let max = op == ReduceOp::ArgMax;
        let mut v = (self.accs[&(acc, 0)], self.arg_index[&(acc, 0)]);
        for o in [16, 8, 4, 2, 1] {
            let u = (self.shuffle(v.0, "down", o), self.shuffle(v.1, "down", o));
            v = self.arg_pick(v, u, max, d);
        }
        v = (self.shuffle(v.0, "idx", 0), self.shuffle(v.1, "idx", 0));
        let warps = self.plan.warps_per_row();
        if warps == 1 {
            return Ok(v);
        }
        let (ty, bytes) = if d == DType::F32 { ("f32", 4) } else { ("b64", 8) };
        let (values, indices) = (format!("{}_smem{acc}", self.k.name), format!("{}_smem{acc}_i", self.k.name));
        self.shared.push((values.clone(), warps * bytes));
        self.shared.push((indices.clone(), warps * 8));
        let tid = self.tid.expect("the thread index");
        let (vb, ib) = (self.a.reg(Class::B32), self.a.reg(Class::B32));
        self.a.ins(format!("mov.u32 {vb}, {values}"));
        self.a.ins(format!("mov.u32 {ib}, {indices}"));
        let lane = self.a.op(Class::B32, "and.b32", &[tid.into(), Opnd::Int(31)]);
        let first = self.a.op(Class::Pred, "setp.eq.u32", &[lane.into(), Opnd::Int(0)]);
        let warp = self.a.op(Class::B32, "shr.u32", &[tid.into(), Opnd::Int(5)]);
        let vslot = self.a.op(Class::B32, "mad.lo.u32", &[warp.into(), Opnd::Int(bytes as i64), vb.into()]);
        let islot = self.a.op(Class::B32, "mad.lo.u32", &[warp.into(), Opnd::Int(8), ib.into()]);
        self.a.ins(format!("@{first} st.shared.{ty} [{vslot}], {}", v.0));
        self.a.ins(format!("@{first} st.shared.b64 [{islot}], {}", v.1));
        self.a.ins("bar.sync 0");
        let mut r = (self.shared_load(v.0.class, ty, vb, 0), self.shared_load(Class::B64, "b64", ib, 0));
        for w in 1..warps {
            let t = (self.shared_load(v.0.class, ty, vb, w * bytes), self.shared_load(Class::B64, "b64", ib, w * 8));
            r = self.arg_pick(r, t, max, d);
        }
        self.a.ins("bar.sync 0");
        Ok(r)
    }

    /// A barrier of every thread of the cluster, whose shared-memory writes before it are
    /// visible to the whole cluster after it.
    fn cluster_sync(&mut self) {
        self.a.ins("barrier.cluster.arrive.release.aligned");
        self.a.ins("barrier.cluster.wait.acquire.aligned");
    }

    pub(super) fn shared_load(&mut self, class: Class, ty: &str, base: Reg, off: usize) -> Reg {
        let r = self.a.reg(class);
        self.a.ins(format!("ld.shared.{ty} {r}, [{base}+{off}]"));
        r
    }

    /// Defines `tmp<var>`, the row's reduction, from the threads' accumulators `acc`.
    pub(super) fn acc_finish(&mut self, var: Var, op: ReduceOp, acc: Var) -> R<()> {
        let (d, _) = self.acc_kind(acc, op)?;
        if op.is_arg() {
            // the index of the best value; 0 for an empty row (no index)
            let (_, i) = self.arg_block_reduce(acc, op)?;
            let none = self.a.op(Class::Pred, "setp.eq.s64", &[i.into(), Opnd::Int(i64::MAX)]);
            let i = self.a.op(Class::B64, "selp.b64", &[Opnd::Int(0), i.into(), none.into()]);
            let out = self.dtype(var);
            let v = scalar::convert(&mut self.a, i, DType::I64, out)?;
            self.define(var, v);
            return Ok(());
        }
        let red = self.block_reduce(acc, op)?;
        let (src, out) = (self.dtype(self.facts.acc_source[&acc]), self.dtype(var));
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
    pub(super) fn online_finish(&mut self, max: Var, sum: Var, dtype: DType, finite_shift: bool) -> R<()> {
        use Class::*;
        class_of(dtype)?;
        if self.plan.col {
            return Err("an online softmax in a column plan".into());
        }
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
    pub(super) fn rloop(&mut self, body: &[TileStmt]) -> R<()> {
        let p = self.plan;
        let nchunk = self.rnumel().floor_div(p.vec as i64);
        if nchunk == Expr::int(0) {
            return Ok(());
        }
        let unroll = coil_ir::config::current().tuning.row_unroll.map_or(4, i64::from).max(1);
        let stmts: Vec<&TileStmt> = body.iter().collect();
        let group = Group::new(rindex(&self.rnumel()), "rchunk", nchunk, p.vec, "i");
        let rlane = self.rlane.expect("the lane");
        self.strided_groups(&stmts, group, nchunk, rlane, p.lanes as i64, unroll)
    }

    /// The groups `rchunk = first, first + step, ...` below `nchunk` of `stmts` (in `group`,
    /// whose indices name `rchunk`): `unroll` groups per loop step, their loads issued
    /// together, then the rest one per step. Each copy substitutes `rchunk` as the step's
    /// counter plus a constant, so the copies share address registers.
    pub(super) fn strided_groups(
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
            self.set_group(Some(group.clone()));
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
            self.set_group(None);
            self.pop();
            self.a.op_into(ctr, &format!("add.{t}"), &[ctr.into(), Opnd::Int(width * step)]);
            self.a.jump(&top);
            self.a.place(&end);
        }
        Ok(())
    }

    // ---- kernel shapes --------------------------------------------------------------------

    pub(super) fn rnumel(&self) -> Expr {
        self.k.rnumel.expect("a reduction's row")
    }

    /// A persistent or looped reduction: `lanes` threads per row, `rows_per_block` rows per
    /// block, a grid-stride loop over the rows.
    pub(super) fn reduction(&mut self) -> R<()> {
        let p = self.plan;
        let persistent = self.k.kind == KernelKind::PersistentReduction;
        if p.cluster > 1 && !persistent {
            return Err("a looped row split over a cluster".into());
        }
        // column plans of one pass: the shapes `column_fold` writes, any outputs per thread;
        // of several passes (persistent or looped) or with an arg reduction: the row shape, one
        // output per thread (`col_vec` 1), every thread folding its output's partials
        // (`column_reduce`)
        let arg = flat_stmts(&self.k.body).iter().any(|s| match s {
            TileStmt::Reduce { op, .. } | TileStmt::AccUpdate { op, .. } => op.is_arg(),
            _ => false,
        });
        let col_passes = p.col
            && (arg
                || match persistent {
                    true => !crate::cuda::launch::single_pass(self.k),
                    false => self.k.body.iter().filter(|s| matches!(s, TileStmt::RLoop(_))).count() > 1,
                });
        if p.warps_per_row() > 1 && p.rows_per_block != 1 && !p.col {
            return Err("several multi-warp rows per block".into());
        }
        if persistent && (!p.col || col_passes) && p.chunks * p.vec > MAX_ROW_VALUES {
            return Err(format!("{} values per thread", p.chunks * p.vec));
        }
        let tid = self.a.op(Class::B32, "mov.u32", &[Opnd::Text("%tid.x")]);
        self.tid = Some(tid);
        let lanes = p.lanes as i64;
        let rl = if p.col {
            self.udiv_const(Class::B32, tid, p.col_threads() as i64, true)
        } else if p.cluster > 1 {
            // the block's place in its cluster (clusters are consecutive blocks of the grid)
            let ctaid = self.a.op(Class::B32, "mov.u32", &[Opnd::Text("%ctaid.x")]);
            let rank = self.udiv_const(Class::B32, ctaid, p.cluster as i64, false);
            self.a.op(Class::B32, "mad.lo.u32", &[rank.into(), Opnd::Int(lanes), tid.into()])
        } else if lanes == p.launch.block as i64 {
            tid
        } else {
            self.udiv_const(Class::B32, tid, lanes, false)
        };
        let rlane = if self.wide { self.a.op(Class::B64, "cvt.u64.u32", &[rl.into()]) } else { rl };
        self.rlane = Some(rlane.into());
        if p.col && !col_passes {
            // a grid-stride loop over the groups of `col_vec` outputs
            let across = p.col_threads() as i64;
            let (ctaid, t) = (self.special("%ctaid.x"), self.special("%tid.x"));
            let (c, _) = self.itype();
            let within = self.udiv_const(c, t, across, false);
            let first = self.iop("mad.lo", &[ctaid.into(), Opnd::Int(across), within.into()]);
            let groups = self.k.xnumel.floor_div(p.col_vec as i64);
            let pieces = if persistent { pieces(&self.k.body) } else { vec![] };
            let nchunk = self.rnumel().floor_div(p.vec as i64);
            let per_step = p.launch.grid as u64 * across as u64;
            let mut run = |g: &mut Self| match persistent {
                true => g.column_vectors(&pieces, nchunk),
                false => g.column_looped(nchunk),
            };
            return self.grid_loop(
                "xg",
                first,
                groups,
                Step { mul: across, div: 1, covers: false },
                per_step,
                &mut run,
            );
        }
        let ctaid = self.special("%ctaid.x");
        let first = if p.cluster > 1 {
            let (c, _) = self.itype();
            self.udiv_const(c, ctaid, p.cluster as i64, true).into()
        } else if p.col {
            // consecutive outputs across the block's threads
            let t = self.special("%tid.x");
            let (c, _) = self.itype();
            let within = self.udiv_const(c, t, p.col_threads() as i64, false);
            self.iop("mad.lo", &[ctaid.into(), Opnd::Int(p.rows_per_block as i64), within.into()])
        } else if p.rows_per_block > 1 {
            let t = self.special("%tid.x");
            let tr = self.in_reg(t.into());
            let (c, _) = self.itype();
            let within = self.udiv_const(c, tr, lanes, true);
            self.iop("mad.lo", &[ctaid.into(), Opnd::Int(p.rows_per_block as i64), within.into()])
        } else {
            ctaid.into()
        };
        let k = self.k;
        let pieces = if persistent { pieces(&k.body) } else { vec![] };
        self.arrays = persistent_arrays(&pieces);
        if p.cluster == 1 {
            self.early = self.early_loads(&pieces);
        }
        let nchunk = self.rnumel().floor_div(p.vec as i64);
        let first_pass = pieces.iter().position(|piece| matches!(piece, Piece::Pass(_))).unwrap_or(usize::MAX);
        let per_step = (p.launch.grid / p.launch.cluster.max(1)) as u64 * p.launch.per_block as u64;
        let xn = k.xnumel;
        let mut run = |g: &mut Self| -> R<()> {
            if !persistent {
                return k.body.iter().try_for_each(|s| g.stmt(s));
            }
            for (n, piece) in pieces.iter().enumerate() {
                match piece {
                    Piece::Row(s) => g.stmt(s)?,
                    Piece::Pass(stmts) => {
                        g.issuing_early = n == first_pass;
                        g.pass(stmts, nchunk)?;
                        g.issuing_early = false;
                    }
                }
            }
            if p.cluster > 1 {
                // every block has read this row's results from the others' shared memory
                // before the next row overwrites them, or a block exits
                g.cluster_sync();
            }
            Ok(())
        };
        let step = Step { mul: p.rows_per_block as i64, div: p.cluster as i64, covers: p.grid_covers_rows(k) };
        self.grid_loop("xindex", first, xn, step, per_step, &mut run)
    }

    /// The loads a persistent row issues in its first pass although a later pass reads them:
    /// those of a pass that follows two or more reducing passes (a layer norm's weights,
    /// after its mean and its variance) whose index does not depend on the row, from buffers
    /// the kernel does not write. Issued with the row's own loads, their latency is spent
    /// under the reductions rather than after them. H100, the suite's PTX edited and timed
    /// in one call (16 interleaved rounds of 100): layer norm 49.0-49.3 us against 49.4-49.9,
    /// add + layer norm 94.8-95.0 against 94.9-95.1, with 48 registers instead of 38-39;
    /// RMSNorm, one reduction before its weights, 48.9-49.5 against 48.9-49.4 (not done).
    fn early_loads(&self, pieces: &[Piece]) -> Vec<(Var, usize, Expr)> {
        let written: IndexSet<usize> = (flat_stmts(&self.k.body).iter())
            .filter_map(|s| match s {
                TileStmt::Store { arg, .. } => Some(*arg),
                _ => None,
            })
            .collect();
        let row = xindex(&self.k.xnumel);
        let mut reducing = 0;
        let mut early = vec![];
        for piece in pieces {
            let Piece::Pass(stmts) = piece else { continue };
            if reducing >= 2 {
                for s in stmts {
                    if let TileStmt::Let { var, op: TileOp::Load { arg, index }, .. } = s {
                        if !written.contains(arg) && !index.free_symbols().contains(&row) && self.needed.contains(var) {
                            early.push((*var, *arg, *index));
                        }
                    }
                }
            }
            reducing += stmts.iter().any(|s| matches!(s, TileStmt::Reduce { .. })) as usize;
        }
        early
    }

    /// One pass of a persistent reduction over the thread's chunks, then its reductions.
    /// The chunks are written out one after the other, sharing index and address registers
    /// ([`PtxGen::rchunk_as`]), all their loads first when no thread skips one; except in a kernel of one block whose passes keep no values
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
                // (a loop: nothing is issued early for a later pass)
                self.issuing_early = false;
                let ctr = self.a.reg(c);
                self.a.op_into(ctr, &format!("mov.{}", t.replace('s', "b")), &[rlane]);
                let (top, end) = (self.a.label(), self.a.label());
                self.a.place(&top);
                let n = self.expr(nchunk)?;
                let out = self.a.op(Class::Pred, &format!("setp.ge.{t}"), &[ctr.into(), n]);
                self.a.branch_if(out, false, &end);
                self.syms.insert("rchunk".into(), ctr.into());
                self.set_group(Some(Group::new(rindex(&rnumel), "rchunk", nchunk, p.vec, "i")));
                self.push();
                self.group_body(stmts)?;
                self.pop();
                self.set_group(None);
                self.a.op_into(ctr, &format!("add.{t}"), &[ctr.into(), Opnd::Int(rt)]);
                self.a.jump(&top);
                self.a.place(&end);
            } else {
                let all_full = Expr::int(p.chunks as i64 * rt) == nchunk;
                self.syms.insert("rlane".into(), rlane);
                let rlane_sym = Expr::index("rlane", p.lanes as i64);
                let group = Group::new(rindex(&rnumel), "rchunk", nchunk, p.vec, "i");
                self.set_group(Some(group.clone()));
                let at = |k: usize| (rchunk_sym, rlane_sym + k as i64 * rt);
                if all_full {
                    // every chunk's loads, then every chunk's elements: the PTX itself keeps the
                    // row's loads in flight together, whatever the assembler's scheduling does
                    let mut loaded = Vec::with_capacity(p.chunks);
                    for k in 0..p.chunks {
                        loaded.push(self.in_chunk(k, at(k), &group, |g| g.group_loads(stmts))?);
                    }
                    for (k, words) in loaded.iter().enumerate() {
                        self.in_chunk(k, at(k), &group, |g| g.group_elements(stmts, words))?;
                    }
                } else {
                    for k in 0..p.chunks {
                        // a chunk some threads skip keeps what it computes to itself
                        let skip = self.a.label();
                        let rchunk = self.expr(at(k).1)?;
                        let n = self.expr(nchunk)?;
                        let r = self.in_reg(rchunk);
                        let out = self.a.op(Class::Pred, &format!("setp.ge.{t}"), &[r.into(), n]);
                        self.a.branch_if(out, false, &skip);
                        self.push();
                        self.in_chunk(k, at(k), &group, |g| g.group_body(stmts))?;
                        self.pop();
                        self.a.place(&skip);
                    }
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

    /// `f` on chunk `k` of a persistent pass in `group`, `rchunk` read as `at` (its symbol and
    /// the expression that replaces it), in a scope of its own.
    fn in_chunk<T>(&mut self, k: usize, at: (Expr, Expr), group: &Group, f: impl FnOnce(&mut Self) -> R<T>) -> R<T> {
        self.scopes.push(IndexMap::new());
        self.rchunk_as = Some(at);
        self.group = Some(group.clone());
        self.chunk = k;
        let out = f(self);
        self.group = None;
        self.rchunk_as = None;
        self.scopes.pop();
        out
    }
}
