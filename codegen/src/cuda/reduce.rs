//! Reduction kernels: the row loop, persistent passes over registers, looped passes over
//! memory, and the accumulators.

use super::*;

/// A top-level piece of a persistent kernel: one statement, or a pass of `XR` statements and
/// the reductions folded in it (as the C backend splits it).
pub(in crate::cuda) enum Piece<'s> {
    Row(&'s TileStmt),
    Pass(Vec<&'s TileStmt>),
}

/// Splits a persistent body into row statements and passes (as the C backend does): a pass
/// ends where a statement reads a reduction folded in it.
pub(in crate::cuda) fn pieces(body: &[TileStmt]) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut open: Option<(Vec<&TileStmt>, Vec<Var>)> = None; // statements, reductions in it
    for s in body {
        let xr = match s {
            TileStmt::Let { dims, .. } | TileStmt::Store { dims, .. } => *dims == Dims::XR,
            _ => true,
        };
        if !xr {
            pieces.extend(open.take().map(|(l, _)| Piece::Pass(l)));
            pieces.push(Piece::Row(s));
            continue;
        }
        if open.as_ref().is_some_and(|(_, pending)| s.reads().iter().any(|v| pending.contains(v))) {
            pieces.extend(open.take().map(|(l, _)| Piece::Pass(l)));
        }
        let (stmts, pending) = open.get_or_insert_with(Default::default);
        stmts.push(s);
        if let TileStmt::Reduce { var, .. } = s {
            pending.push(*var);
        }
    }
    pieces.extend(open.map(|(l, _)| Piece::Pass(l)));
    pieces
}

/// The persistent `XR` values read by a later pass than their own: they stay in per-thread
/// arrays (registers), never reloaded.
pub(in crate::cuda) fn persistent_arrays(pieces: &[Piece]) -> IndexSet<Var> {
    let mut arrays = IndexSet::new();
    let mut home = IndexMap::new();
    for (n, p) in pieces.iter().enumerate() {
        if let Piece::Pass(stmts) = p {
            for s in stmts {
                if let TileStmt::Let { var, .. } = s {
                    home.insert(*var, n);
                }
                for v in s.reads() {
                    if home.get(&v).is_some_and(|&h| h != n) {
                        arrays.insert(v);
                    }
                }
            }
        }
    }
    arrays
}

/// The accumulator of a reduction: its C type, identity and combine functor.
struct Acc {
    ty: String,
    init: String,
    combine: &'static str,
}

impl<'a> Gen<'a> {
    /// A persistent or looped reduction: a grid-stride loop over rows, `rows_per_block` rows
    /// per block and `lanes` threads per row.
    pub(super) fn reduction(&mut self) {
        let p = self.plan;
        // A column plan's row threads are `col_threads` apart (see `Plan::col`).
        if p.col {
            self.line(&format!("const int rlane = threadIdx.x / {};", p.col_threads()));
        } else if p.cluster > 1 {
            // the block's place in its cluster (`%cluster_ctarank`: clusters are consecutive
            // blocks of the 1-D grid)
            self.line(&format!("const int rlane = (int)(blockIdx.x % {}) * {} + threadIdx.x;", p.cluster, p.lanes));
        } else {
            self.line(&format!("const int rlane = threadIdx.x % {};", p.lanes));
        }
        // A cluster's block reductions leave the block's result in one more slot.
        // (a column plan with `col_vec` outputs per thread stages them in as many planes)
        let slots =
            if p.col { p.launch.block as usize * p.col_vec } else { p.warps_per_row() + usize::from(p.cluster > 1) };
        for s in flat_stmts(&self.k.body) {
            match s {
                TileStmt::Reduce { var, op, .. } => {
                    let acc = self.acc(*var, *op);
                    self.line(&format!("__shared__ {} smem{var}[{slots}];", acc.ty));
                }
                TileStmt::ReduceOnlineSoftmax { max, dtype, .. } => {
                    // `coil_reduce_costly` keeps the row's result in one more slot
                    let (t, n) = (ops::compute_type(*dtype), if p.col { slots } else { slots + 1 });
                    self.line(&format!("__shared__ coil_ms<{t}> smem{max}[{n}];"));
                }
                _ => {}
            }
        }
        let pieces = if self.k.kind == KernelKind::PersistentReduction { pieces(&self.k.body) } else { vec![] };
        // The plan's `vec` divides the row (provably, for a symbolic one).
        let nchunk = self.rnumel.floor_div(p.vec as i64);
        if nchunk != Expr::int(0) {
            let arr = if p.chunks > 1 { format!("k * {} + i", p.vec) } else { "i".to_string() };
            self.group = Some(if p.col_vec > 1 {
                self.column_group(nchunk)
            } else {
                Group::new(rindex(&self.k.rnumel.unwrap()), "rchunk", nchunk, p.vec, &arr)
            });
            let all = flat_stmts(&self.k.body);
            self.note_alignment(&all);
            self.find_arrays(&pieces);
            self.group = None;
        }
        self.alignment_check();
        if p.col_vec > 1 {
            // a grid-stride loop over the groups of `col_vec` outputs
            let (it, across) = (self.it, p.col_threads());
            let groups = self.xnumel.floor_div(p.col_vec as i64);
            let per_step = p.launch.grid as u64 * across as u64;
            self.open_grid_loop(
                "xg",
                &format!("({it})blockIdx.x * {across} + threadIdx.x % {across}"),
                (&groups, &groups.to_c()),
                &format!("({it})gridDim.x * {across}"),
                per_step,
            );
            self.column_vectors(pieces, nchunk);
            self.close();
            return;
        }
        let first = if p.cluster > 1 {
            format!("({})(blockIdx.x / {})", self.it, p.cluster)
        } else if p.col {
            format!("({})blockIdx.x * {} + threadIdx.x % {}", self.it, p.rows_per_block, p.rows_per_block)
        } else if p.rows_per_block > 1 {
            format!("({})blockIdx.x * {} + threadIdx.x / {}", self.it, p.rows_per_block, p.lanes)
        } else {
            format!("({})blockIdx.x", self.it)
        };
        let step = if p.cluster > 1 {
            format!("({})(gridDim.x / {})", self.it, p.cluster)
        } else if p.rows_per_block > 1 {
            format!("({})gridDim.x * {}", self.it, p.rows_per_block)
        } else {
            format!("({})gridDim.x", self.it)
        };
        let per_step = (p.launch.grid / p.launch.cluster.max(1)) as u64 * p.launch.per_block as u64;
        let xnumel = self.xnumel;
        self.open_grid_loop("xindex", &first, (&xnumel, "xnumel"), &step, per_step);
        if self.k.kind == KernelKind::LoopedReduction {
            let k = self.k;
            for s in &k.body {
                self.stmt(s);
            }
        } else {
            let e = (p.chunks * p.vec).max(1);
            for v in self.arrays.clone() {
                self.line(&format!("{} tmp{v}[{e}];", ops::compute_type(self.dtype(v))));
            }
            for piece in pieces {
                match piece {
                    Piece::Row(s) => self.stmt(s),
                    Piece::Pass(stmts) => self.persistent_pass(&stmts, nchunk),
                }
            }
            if p.cluster > 1 {
                // Every block has read this row's partial results from the others' shared
                // memory before the next row overwrites them, or a block exits.
                self.line("coil_cluster_sync();");
            }
        }
        self.close();
    }

    /// Persistent `XR` values read by a later pass ([`persistent_arrays`]).
    fn find_arrays(&mut self, pieces: &[Piece]) {
        self.arrays = persistent_arrays(pieces);
    }

    /// One pass of a persistent reduction over the thread's `chunks` groups in registers,
    /// then the block-wide reductions it folded.
    fn persistent_pass(&mut self, stmts: &[&TileStmt], nchunk: Expr) {
        let p = self.plan;
        for s in stmts {
            if let TileStmt::Reduce { var, op, .. } = s {
                self.acc_init(*var, *op);
            }
        }
        if nchunk != Expr::int(0) {
            let arr = if p.chunks > 1 { format!("k * {} + i", p.vec) } else { "i".to_string() };
            let all_full = Expr::int((p.chunks * p.row_threads()) as i64) == nchunk;
            if p.chunks > 1 {
                // Fully unrolled, so per-thread arrays stay in registers; a long column plan
                // (hundreds of chunks) unrolls partly (its arrays, if any, go to local memory).
                // A kernel of one block holding no arrays is a latency-bound tail (the last
                // stage of a split reduction, a mean over a batch): unrolling buys it little
                // and costs NVRTC time. H100, cross-entropy's final kernel (8192 values, 2
                // chunks of 8): NVRTC 138 -> 102 ms, run time 15.4 -> 15.6 us.
                let one_block = p.launch.grid == 1 && p.cluster == 1;
                self.line(match p.chunks {
                    _ if one_block && self.arrays.is_empty() => "#pragma unroll 1",
                    c if c <= 32 => "#pragma unroll",
                    _ => "#pragma unroll 8",
                });
                self.open(&format!("for (int k = 0; k < {}; k++) {{", p.chunks));
                self.line(&format!("const {} rchunk = k * {} + rlane;", self.it, p.row_threads()));
            } else {
                self.open("{");
                self.line(&format!("const {} rchunk = rlane;", self.it));
            }
            if !all_full {
                self.open(&format!("if (rchunk < {}) {{", nchunk.to_c()));
            }
            self.line(&format!("/* rindex = {}*rchunk + i */", p.vec));
            self.group = Some(Group::new(rindex(&self.k.rnumel.unwrap()), "rchunk", nchunk, p.vec, &arr));
            self.group_body(stmts);
            self.group = None;
            if !all_full {
                self.close();
            }
            self.close();
        }
        for s in stmts {
            if let TileStmt::Reduce { var, op, dtype, .. } = s {
                self.acc_finish(*var, *op, *dtype, *var);
            }
        }
    }

    /// The group of a column plan's `col_vec` outputs `col_vec*xg + i`, at reduced position
    /// `rchunk` (whose elements are consecutive in memory where the input runs along `x`).
    fn column_group(&self, nchunk: Expr) -> Group {
        let groups = self.xnumel.floor_div(self.plan.col_vec as i64);
        Group::new(xindex(&self.k.xnumel), "xg", groups, self.plan.col_vec, "i")
            .fixing(rindex(&self.k.rnumel.unwrap()), Expr::index_upto("rchunk", nchunk))
    }

    /// The body of a column plan with `col_vec > 1` ([`launch::single_pass`]): the constants,
    /// then the pass, each thread folding one accumulator per output over its share of the
    /// reduced positions with one vector access per position; then the accumulators go to
    /// shared memory (`coil_col_stage`), and the first `col_vec` threads along the reduced dim
    /// take one output each (`xindex = col_vec*xg + rlane`): its reductions (`coil_col_fold`)
    /// and row statements.
    fn column_vectors(&mut self, pieces: Vec<Piece<'a>>, nchunk: Expr) {
        let (p, v) = (self.plan, self.plan.col_vec);
        let (mut pass, mut after) = (None, Vec::new());
        for piece in pieces {
            match piece {
                // constants once; the other row values (the pass does not read them) per output
                Piece::Row(s @ TileStmt::Let { op: TileOp::Constant(_), .. }) if pass.is_none() => self.stmt(s),
                Piece::Row(s) => after.push(s),
                Piece::Pass(stmts) => pass = Some(stmts),
            }
        }
        let stmts = pass.expect("a single-pass kernel");
        let reduces: Vec<(Var, ReduceOp, DType)> = (stmts.iter())
            .filter_map(|s| match s {
                TileStmt::Reduce { var, op, dtype, .. } => Some((*var, *op, *dtype)),
                _ => None,
            })
            .collect();
        for &(var, op, _) in &reduces {
            let a = self.acc(var, op);
            let init = vec![a.init; v].join(", ");
            self.line(&format!("{} acc{var}[{v}] = {{{init}}};", a.ty));
        }
        let all_full = Expr::int((p.chunks * p.lanes) as i64) == nchunk;
        self.line(if p.chunks <= 32 { "#pragma unroll" } else { "#pragma unroll 8" });
        self.open(&format!("for (int k = 0; k < {}; k++) {{", p.chunks));
        self.line(&format!("const {} rchunk = k * {} + rlane;", self.it, p.lanes));
        if !all_full {
            self.open(&format!("if (rchunk < {}) {{", nchunk.to_c()));
        }
        self.line(&format!("/* rindex = rchunk, xindex = {v}*xg + i */"));
        (self.group, self.acc_at) = (Some(self.column_group(nchunk)), Some("i"));
        self.group_body(&stmts);
        self.group = None;
        if !all_full {
            self.close();
        }
        self.close();
        self.acc_at = None;
        for &(var, _, _) in &reduces {
            self.line(&format!("coil_col_stage<{v}>(acc{var}, smem{var});"));
        }
        self.line("__syncthreads();");
        self.open(&format!("if (rlane < {v}) {{"));
        self.line(&format!("const {} xindex = {v} * xg + rlane;", self.it));
        self.own_output = true;
        for &(var, op, dtype) in &reduces {
            self.acc_finish(var, op, dtype, var);
        }
        for s in after {
            self.stmt(s);
        }
        self.own_output = false;
        self.close();
        // the next group's stage overwrites the planes
        self.line("__syncthreads();");
    }

    /// One pass of a looped reduction: the row's threads stride over its groups.
    pub(super) fn rloop(&mut self, body: &[TileStmt]) {
        let p = self.plan;
        let nchunk = self.rnumel.floor_div(p.vec as i64);
        if nchunk == Expr::int(0) {
            return;
        }
        // A few steps' loads in flight before the first of them is used (the accumulators
        // chain the steps, the loads do not). `COIL_ROW_UNROLL=N` sets the factor, for tuning.
        let unroll = coil_ir::config::current().tuning.row_unroll.unwrap_or(4);
        self.line(&format!("#pragma unroll {unroll}"));
        self.open(&format!("for ({} rchunk = rlane; rchunk < {}; rchunk += {}) {{", self.it, nchunk.to_c(), p.lanes));
        self.line(&format!("/* rindex = {}*rchunk + i */", p.vec));
        self.group = Some(Group::new(rindex(&self.k.rnumel.unwrap()), "rchunk", nchunk, p.vec, "i"));
        let stmts: Vec<&TileStmt> = body.iter().collect();
        self.group_body(&stmts);
        self.group = None;
        self.close();
    }

    /// The accumulator of reduction `acc` (of result dtype `out`), as the C backend's except
    /// that float sums and products of f16/bf16/f32 accumulate in f32 (per thread, then a
    /// tree across lanes, which keeps the error near pairwise summation's; f64 halves the
    /// shuffle and register budget) and f64 ones in f64.
    fn acc(&self, acc: Var, op: ReduceOp) -> Acc {
        let src = self.dtype(self.facts.acc_source[&acc]);
        let out = self.dtype(acc);
        let max = matches!(op, ReduceOp::Max | ReduceOp::ArgMax);
        let float = if src == DType::F64 { "double" } else { "float" };
        let (ty, init, combine): (String, String, &'static str) = match op {
            ReduceOp::Sum | ReduceOp::Prod if out.is_float() => {
                let t = if out == DType::F64 { "double" } else { "float" };
                let init = if op == ReduceOp::Sum { "0" } else { "1" };
                (t.into(), format!("({t}){init}"), if op == ReduceOp::Sum { "coil_add" } else { "coil_mul" })
            }
            ReduceOp::Sum => ("int64_t".into(), "0".into(), "coil_iadd"),
            ReduceOp::Prod => ("int64_t".into(), "1".into(), "coil_imul"),
            ReduceOp::Max | ReduceOp::Min if src.is_float() => {
                let c = match (max, src == DType::F64) {
                    (true, false) => "coil_max_f32",
                    (false, false) => "coil_min_f32",
                    (true, true) => "coil_max_f64",
                    (false, true) => "coil_min_f64",
                };
                (float.into(), if max { "-INFINITY" } else { "INFINITY" }.into(), c)
            }
            ReduceOp::Max | ReduceOp::Min => (
                "int64_t".into(),
                if max { "INT64_MIN" } else { "INT64_MAX" }.into(),
                if max { "coil_imax" } else { "coil_imin" },
            ),
            ReduceOp::ArgMax | ReduceOp::ArgMin => {
                let (t, best) = match (src.is_float(), max) {
                    (true, true) => (float, "-INFINITY"),
                    (true, false) => (float, "INFINITY"),
                    (false, true) => ("int64_t", "INT64_MIN"),
                    (false, false) => ("int64_t", "INT64_MAX"),
                };
                let ty = format!("coil_arg<{t}>");
                (ty.clone(), format!("{ty}{{{best}, COIL_NO_INDEX}}"), if max { "coil_argmax" } else { "coil_argmin" })
            }
        };
        Acc { ty, init, combine }
    }

    fn acc_dtype(ty: &str) -> DType {
        match ty {
            "double" => DType::F64,
            "float" => DType::F32,
            _ => DType::I64,
        }
    }

    pub(super) fn acc_init(&mut self, acc: Var, op: ReduceOp) {
        let a = self.acc(acc, op);
        self.line(&format!("{} acc{acc} = {};", a.ty, a.init));
    }

    /// How the current statement names accumulator `acc` ([`Gen::acc_at`]).
    fn acc_ref(&self, acc: Var) -> String {
        match self.acc_at {
            Some(i) => format!("acc{acc}[{i}]"),
            None => format!("acc{acc}"),
        }
    }

    /// Folds `value` (the element at the group's position) into the thread's accumulator.
    pub(super) fn acc_update(&mut self, acc: Var, op: ReduceOp, value: Var) {
        let a = self.acc(acc, op);
        let (src, v, at) = (self.dtype(value), self.r(value), self.acc_ref(acc));
        let line = if op.is_arg() {
            let t = a.ty.trim_start_matches("coil_arg<").trim_end_matches('>');
            let v = ops::convert(&v, src, Self::acc_dtype(t));
            let g = self.group.as_ref().expect("an update inside a pass");
            let pos = g.pos.to_c();
            format!("{at} = {}()({at}, {}{{{v}, {pos}}});", a.combine, a.ty)
        } else {
            let v = match (op, src.is_float()) {
                // max/min of floats compare in the source's own compute type
                (ReduceOp::Max | ReduceOp::Min, true) => v,
                _ => ops::convert(&v, src, Self::acc_dtype(&a.ty)),
            };
            format!("{at} = {}()({at}, {v});", a.combine)
        };
        self.line(&line);
    }

    /// The block reduction of the plan: `coil_reduce<warps>` or `coil_reduce_col<lanes, rows>`,
    /// or their `_costly` forms (the combine is worth doing once per partial, not per thread);
    /// over a cluster, `coil_reduce_cluster<blocks, warps>` (persistent reductions only, whose
    /// combines are cheap).
    fn block_reduce(&self, costly: bool) -> String {
        let p = self.plan;
        let c = if costly { "_costly" } else { "" };
        if p.cluster > 1 {
            assert!(!costly && !p.col, "a cluster plan is a persistent row plan");
            format!("coil_reduce_cluster<{}, {}>", p.cluster, p.warps_per_row())
        } else if p.col {
            format!("coil_reduce_col{c}<{}, {}>", p.lanes, p.col_threads())
        } else {
            format!("coil_reduce{c}<{}>", p.warps_per_row())
        }
    }

    /// Defines `tmp<max>` and `tmp<sum>` of an online softmax pass: the threads' `(m, s)` pairs
    /// (`acc<max>`, `acc<sum>`, both in the value's compute type) combined across the row by
    /// the pairwise rule (`coil_online`, an exponential each: the `_costly` block reduction),
    /// then the sum relative to the row's shift.
    pub(super) fn online_finish(&mut self, max: Var, sum: Var, dtype: DType, finite_shift: bool) {
        let t = ops::compute_type(dtype);
        let reduce = self.block_reduce(true);
        let pair = format!("coil_ms<{t}>{{acc{max}, acc{sum}}}");
        self.line(&format!("const coil_ms<{t}> red{max} = {reduce}({pair}, coil_online(), smem{max});"));
        self.line(&format!("const {t} tmp{max} = red{max}.m;"));
        let f = if finite_shift { "coil_online_sum_finite" } else { "coil_online_sum" };
        let value = ops::convert(&format!("{f}(red{max})"), Self::acc_dtype(t), dtype);
        self.line(&format!("const {t} tmp{sum} = {value};"));
    }

    /// Defines `tmp<var>`: the row-wide reduction of the threads' accumulators `acc`.
    pub(super) fn acc_finish(&mut self, var: Var, op: ReduceOp, out: DType, acc: Var) {
        let a = self.acc(acc, op);
        let reduce = self.block_reduce(false);
        let p = self.plan;
        let red = if self.own_output {
            // this thread's output alone, from its plane of shared memory (`column_vectors`)
            let (lanes, across, block) = (p.lanes, p.col_threads(), p.launch.block);
            format!("coil_col_fold<{lanes}, {across}>(smem{var} + rlane * {block}, {}())", a.combine)
        } else {
            format!("{reduce}({}, {}(), smem{var})", self.acc_ref(acc), a.combine)
        };
        self.line(&format!("const {} red{var} = {red};", a.ty));
        let src = self.dtype(self.facts.acc_source[&acc]);
        let value = match op {
            ReduceOp::ArgMax | ReduceOp::ArgMin => {
                ops::convert(&format!("(red{var}.i == COIL_NO_INDEX ? 0 : red{var}.i)"), DType::I64, out)
            }
            ReduceOp::Max | ReduceOp::Min if src.is_float() => ops::convert(&format!("red{var}"), src, out),
            _ => ops::convert(&format!("red{var}"), Self::acc_dtype(&a.ty), out),
        };
        self.line(&format!("const {} tmp{var} = {value};", ops::compute_type(out)));
    }
}
