//! Column reductions in PTX (`Plan::col`: consecutive outputs across a block's threads, the
//! reduced dim split over the rest): the one-pass shapes, persistent with one or a vector of
//! outputs per thread or looped, whose partials are folded output by output
//! ([`PtxGen::column_fold`]); and the fold every thread does in the row-shaped plans (several
//! passes, arg reductions: [`PtxGen::column_reduce`]).

use super::*;

impl<'a> PtxGen<'a> {
    /// A column plan's fold of one output per thread in a row-shaped plan (several passes, or
    /// an arg reduction; the prelude's `coil_reduce_col`): the partials go to shared memory
    /// (slot `threadIdx.x`; an arg reduction's indices to a second array), and every thread
    /// folds its output's `lanes` partials in order, so all of them hold the same bits; the
    /// closing barrier lets the next reduction reuse the slots.
    pub(super) fn column_reduce(&mut self, acc: Var, op: ReduceOp) -> R<(Reg, Option<Reg>)> {
        let (d, _) = self.acc_kind(acc, op)?;
        let (class, ty, bytes) = if d == DType::F32 { (Class::F32, "f32", 4) } else { (Class::B64, "b64", 8) };
        let (block, across) = (self.plan.launch.block as usize, self.plan.col_threads());
        let tid = self.tid.expect("the thread index");
        let x = self.udiv_const(Class::B32, tid, across as i64, false);
        // (this thread's slot, its output's first slot) in an array of `size`-byte slots
        let array = |g: &mut Self, name: String, size: usize| {
            g.shared.push((name.clone(), block * size));
            let base = g.a.reg(Class::B32);
            g.a.ins(format!("mov.u32 {base}, {name}"));
            let mine = g.a.op(Class::B32, "mad.lo.u32", &[tid.into(), Opnd::Int(size as i64), base.into()]);
            let first = g.a.op(Class::B32, "mad.lo.u32", &[x.into(), Opnd::Int(size as i64), base.into()]);
            (mine, first)
        };
        let (mine, at) = array(self, format!("{}_smem{acc}", self.k.name), bytes);
        self.a.ins(format!("st.shared.{ty} [{mine}], {}", self.accs[&(acc, 0)]));
        let index = if op.is_arg() {
            let (mine, at) = array(self, format!("{}_smem{acc}_i", self.k.name), 8);
            self.a.ins(format!("st.shared.b64 [{mine}], {}", self.arg_index[&(acc, 0)]));
            Some(at)
        } else {
            None
        };
        self.a.ins("bar.sync 0");
        let mut v = self.shared_load(class, ty, at, 0);
        let mut i = index.map(|at| self.shared_load(Class::B64, "b64", at, 0));
        for r in 1..self.plan.lanes {
            let t = self.shared_load(class, ty, at, r * across * bytes);
            match (index, i) {
                (Some(ia), Some(best)) => {
                    let u = self.shared_load(Class::B64, "b64", ia, r * across * 8);
                    let (nv, ni) = self.arg_pick((v, best), (t, u), op == ReduceOp::ArgMax, d);
                    (v, i) = (nv, Some(ni));
                }
                _ => v = self.a.op(class, Self::combine_instr(op, d), &[v.into(), t.into()]),
            }
        }
        self.a.ins("bar.sync 0");
        Ok((v, i))
    }

    /// A persistent column plan of one pass: its `Reduce` statements accumulate, each into
    /// its own result; row statements after the pass run per output ([`Self::column_fold`]).
    pub(super) fn column_vectors(&mut self, pieces: &[Piece], nchunk: Expr) -> R<()> {
        let (mut pass, mut after) = (None, Vec::new());
        for piece in pieces {
            match piece {
                Piece::Row(s @ TileStmt::Let { op: TileOp::Constant(_), .. }) if pass.is_none() => self.stmt(s)?,
                Piece::Row(s) => after.push(*s),
                Piece::Pass(stmts) => pass = Some(stmts.clone()),
            }
        }
        let stmts = pass.ok_or("a column plan without a pass")?;
        let folds: Vec<(Var, ReduceOp, Var)> = (stmts.iter())
            .filter_map(|s| match s {
                TileStmt::Reduce { var, op, .. } => Some((*var, *op, *var)),
                _ => None,
            })
            .collect();
        self.column_fold(&stmts, &folds, &after, nchunk, 8)
    }

    /// A looped column plan of one [`TileStmt::RLoop`] (the rows symbolic or too long to
    /// unroll): the loop's `AccUpdate`s accumulate, the `Reduce`s of its accumulators after it
    /// are the column folds, the other statements after it run per output.
    pub(super) fn column_looped(&mut self, nchunk: Expr) -> R<()> {
        let body = &self.k.body;
        let at =
            body.iter().position(|s| matches!(s, TileStmt::RLoop(_))).ok_or("a looped column plan without a loop")?;
        let TileStmt::RLoop(pass) = &body[at] else { unreachable!("found above") };
        if pass.iter().any(|s| matches!(s, TileStmt::AccUpdateOnlineSoftmax { .. })) {
            return Err("an online softmax in a column plan".into());
        }
        for s in &body[..at] {
            match s {
                TileStmt::AccInit { .. } => {}
                TileStmt::Let { op: TileOp::Constant(_), .. } => self.stmt(s)?,
                _ => return Err("a row value before a looped column pass".into()),
            }
        }
        let (mut folds, mut after) = (Vec::new(), Vec::new());
        for s in &body[at + 1..] {
            match s {
                TileStmt::Reduce { var, op, source, .. } => folds.push((*source, *op, *var)),
                s => after.push(s),
            }
        }
        let stmts: Vec<&TileStmt> = pass.iter().collect();
        self.column_fold(&stmts, &folds, &after, nchunk, 4)
    }

    /// A column plan with `col_vec` outputs per thread ([`Plan::col_vec`]; one pass): each
    /// thread folds one accumulator per output over its share of the reduced positions
    /// (`stmts`, `unroll` positions per loop step), one vector access per position; the
    /// accumulators go to shared memory (one plane per output place), and the first `col_vec`
    /// threads along the reduced dim fold one output each into the results of `folds`
    /// (accumulator, op, result) and run the row statements `after` (the CUDA emitter's
    /// `column_vectors`).
    pub(super) fn column_fold(
        &mut self,
        stmts: &[&TileStmt],
        folds: &[(Var, ReduceOp, Var)],
        after: &[&TileStmt],
        nchunk: Expr,
        unroll: i64,
    ) -> R<()> {
        let p = self.plan;
        let v = p.col_vec;
        if folds.iter().any(|(_, op, _)| op.is_arg()) {
            return Err("an arg reduction in a column plan".into());
        }
        for &(acc, op, _) in folds {
            let (d, init) = self.acc_kind(acc, op)?;
            for i in 0..v {
                let r = match d {
                    DType::F32 => self.a.op(Class::F32, "mov.f32", &[init]),
                    _ => self.a.op(Class::B64, "mov.b64", &[init]),
                };
                self.accs.insert((acc, i), r);
            }
        }
        let groups = self.k.xnumel.floor_div(v as i64);
        let group = Group::new(xindex(&self.k.xnumel), "xg", groups, v, "i")
            .fixing(rindex(&self.rnumel()), Expr::index_upto("rchunk", nchunk));
        let rlane = self.rlane.expect("the lane");
        self.per_output = true;
        self.strided_groups(stmts, group, nchunk, rlane, p.lanes as i64, unroll)?;
        self.per_output = false;
        // stage: plane i holds every thread's accumulator of output place i
        let block = p.launch.block as usize;
        let tid = self.tid.expect("the thread index");
        let mut planes = IndexMap::new();
        for &(var, op, _) in folds {
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
        let x = self.udiv_const(Class::B32, tid, across as i64, false);
        let rl32 = if c == Class::B64 { self.a.op(Class::B32, "cvt.u32.u64", &[r.into()]) } else { r };
        for &(var, op, result) in folds {
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
            let src = self.dtype(self.facts.acc_source[&var]);
            let from = if matches!(op, ReduceOp::Max | ReduceOp::Min) && src.is_float() { src } else { d };
            let value = scalar::convert(&mut self.a, acc, from, self.facts.dtypes[&result])?;
            self.define(result, value);
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
}
