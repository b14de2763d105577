use super::*;
use crate::testutil::*;
use coil_ir::loops::ScalarOp;
use coil_ir::{BinaryOp, DType, ReduceOp, Scalar, UnaryOp};

fn snapshot(name: &str, text: String) {
    insta::with_settings!({ snapshot_path => "../snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(name, text);
    });
}

/// `relu(x * 2 + 1)` over `[4, 8]` of `d`, one pointwise kernel.
pub(crate) fn pointwise_chain(d: DType) -> (LoopProgram, FusedKernel) {
    let p = LoopProgram::parse(&format!(
        "\
inputs: arg0
  arg0: {d}[4, 8]
buf0: {d}[4, 8] = pointwise ranges=[4, 8] origins=[pointwise]
    v0: {d} = load(arg0, 8*x0 + x1)
    v1: {d} = constant(2.0)
    v2: {d} = mul(v0, v1)
    v3: {d} = constant(1.0)
    v4: {d} = add(v2, v3)
    v5: {d} = constant(0.0)
    v6: {d} = maximum(v4, v5)
    return v6
outputs: buf0
"
    ))
    .unwrap();
    let k = kernel("poi_fused_add_mul_relu_0", KernelKind::Pointwise, vec![0], 32, None, vec![BufferId(1)]);
    (p, k)
}

#[test]
fn pointwise_chain_tile() {
    let (p, k) = pointwise_chain(DType::F32);
    let t = build_kernel(&p, &k);
    assert_eq!((t.xblock, t.rblock), (1024, 1));
    assert_eq!(t.args.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["in_ptr0", "out_ptr0"]);
    snapshot("tile_pointwise_chain", t.to_string());
}

#[test]
fn softmax_persistent_tile() {
    let (p, k) = softmax(4, 8, KernelKind::PersistentReduction, "per_fused_softmax_0");
    let t = build_kernel(&p, &k);
    assert_eq!((t.xblock, t.rblock), (1, 8));
    // amax and sum never reach memory: only x is read and the result written
    assert_eq!(t.args.len(), 2);
    snapshot("tile_softmax_persistent", t.to_string());
}

#[test]
fn softmax_looped_tile() {
    let (p, k) = softmax(2, 2000, KernelKind::LoopedReduction, "red_fused_softmax_0");
    let t = build_kernel(&p, &k);
    assert_eq!(t.rblock, 1024);
    snapshot("tile_softmax_looped", t.to_string());
}

/// `argmax(x, dim=1)` of f32 `[rows, cols]`, one persistent kernel.
pub(crate) fn argmax(rows: usize, cols: usize) -> (LoopProgram, FusedKernel) {
    let p = LoopProgram::parse(&format!(
        "\
inputs: arg0
  arg0: f32[{rows}, {cols}]
buf0: i64[{rows}] = reduction argmax ranges=[{rows}] reduction_ranges=[{cols}] origins=[argmax]
    v0: f32 = load(arg0, {cols}*x0 + r0)
    return v0
outputs: buf0
"
    ))
    .unwrap();
    let kind = if cols <= 1024 { KernelKind::PersistentReduction } else { KernelKind::LoopedReduction };
    (p, kernel("per_fused_argmax_0", kind, vec![0], rows, Some(cols), vec![BufferId(1)]))
}

#[test]
fn argmax_tile() {
    let (p, k) = argmax(3, 5);
    let t = build_kernel(&p, &k);
    snapshot("tile_argmax", t.to_string());
}

/// `table[idx]` (embedding): bf16 table `[5, 4]`, i64 indices `[3]`.
pub(crate) fn embedding() -> (LoopProgram, FusedKernel) {
    let p = LoopProgram::parse(
        "\
inputs: arg0, arg1
  arg0: bf16[5, 4]
  arg1: i64[3]
buf0: bf16[3, 4] = pointwise ranges=[3, 4] origins=[pointwise]
    v0: i64 = load(arg1, x0)
    v1: bf16 = load(arg0, x1, indirect=v0, stride=4, bound=5)
    return v1
outputs: buf0
",
    )
    .unwrap();
    (p, kernel("poi_fused_embedding_0", KernelKind::Pointwise, vec![0], 12, None, vec![BufferId(2)]))
}

/// A KV cache write: `exp(new)` (`[2, 3, 4]`) stored into the cache (`[2, 8, 4]`) at
/// positions `pos..pos + 3` along dim 1, `pos` a 0-d i64 read when the kernel runs.
pub(crate) fn cache_write() -> (LoopProgram, FusedKernel) {
    cache_write_of("f32", 2, 8, 3, 4)
}

/// `exp(new)` (`[b, t, d]` of `dtype`) stored into a cache `[b, cap, d]` at positions
/// `pos..pos + t` along dim 1, as lowering makes it (`scatter` module of `coil_passes`).
pub(crate) fn cache_write_of(dtype: &str, b: i64, cap: i64, t: i64, d: i64) -> (LoopProgram, FusedKernel) {
    let p = LoopProgram::parse(&format!(
        "\
inputs: arg0, arg1, arg2
  arg0: {dtype}[{b}, {cap}, {d}]
  arg1: i64[]
  arg2: {dtype}[{b}, {t}, {d}]
buf0: {dtype}[{b}, {cap}, {d}] = pointwise ranges=[{b}, {t}, {d}] origins=[exp, scatter]
    v0: i64 = index(0)
    v1: i64 = load(arg1, 0)
    v2: i64 = add(v0, v1)
    v3: {dtype} = load(arg2, {td}*x0 + {d}*x1 + x2)
    v4: {dtype} = exp(v3)
    return v4
    scatter(base=arg0, index={cd}*x0 + {d}*x1 + x2, offset=v2, stride={d}, size={t}, bound={cap})
outputs: buf0
",
        td = t * d,
        cd = cap * d,
    ))
    .unwrap();
    (
        p,
        kernel(
            "poi_fused_exp_scatter_0",
            KernelKind::Pointwise,
            vec![0],
            (b * t * d) as usize,
            None,
            vec![BufferId(3)],
        ),
    )
}

#[test]
fn scatter_store_tile() {
    let (p, k) = cache_write();
    let t = build_kernel(&p, &k);
    let text = t.to_string();
    // the window and the offset's values first, then a plain store relative to the window
    assert_eq!(t.window_prologue(), 4, "{text}");
    assert!(text.contains("window(out_ptr0, offset=tmp2, stride=4, size=3, bound=8)"), "{text}");
    assert!(
        text.contains("store(out_ptr0 + (32*(xindex//12) + xindex % 4 + 4*((xindex//4) % 3)), tmp4, xmask)"),
        "{text}"
    );
    // the output is written, never read; the base is not an argument (the runtime copies it)
    assert_eq!(
        t.args.iter().map(|a| (a.buffer.0, a.read, a.written)).collect::<Vec<_>>(),
        [(1, true, false), (2, true, false), (3, false, true)]
    );
    snapshot("tile_cache_write", text);
}

#[test]
fn indirect_load_tile() {
    let (p, k) = embedding();
    snapshot("tile_embedding", build_kernel(&p, &k).to_string());
}

/// Mean and variance over rows of `[2, 6]` in one kernel: `mean = sum(x) / 6` is a per-row
/// epilogue, `var = sum((x - mean)^2) / 6` a second reduction reading it, and `y = (x - mean)`
/// a stored per-element output next to the stored per-row `var`.
pub(crate) fn mean_var(kind: KernelKind, cols: usize) -> (LoopProgram, FusedKernel) {
    let f = DType::F32;
    let mut p = Prog::default();
    let x = p.input(&[2, cols], f);
    let (xv, rv) = (xs(&[2])[0], rs(&[cols])[0]);
    let mut b = B::default();
    let l = b.load(x, xv * cols as i64 + rv, f);
    let sum = p.reduction(&[2], &[cols], ReduceOp::Sum, f, b.done(l));
    let mut b = B::default();
    let s = b.load(sum, xv, f);
    let n = b.constant(cols as f64, f);
    let q = b.binary(BinaryOp::Div, s, n, f);
    let mean = p.pointwise(&[2], f, b.done(q));
    let mut b = B::default();
    let l = b.load(x, xv * cols as i64 + rv, f);
    let m = b.load(mean, xv, f);
    let d = b.binary(BinaryOp::Sub, l, m, f);
    let sq = b.binary(BinaryOp::Mul, d, d, f);
    let ss = p.reduction(&[2], &[cols], ReduceOp::Sum, f, b.done(sq));
    let mut b = B::default();
    let s = b.load(ss, xv, f);
    let n = b.constant(cols as f64, f);
    let q = b.binary(BinaryOp::Div, s, n, f);
    let var = p.pointwise(&[2], f, b.done(q));
    let v = xs(&[2, cols]);
    let mut b = B::default();
    let l = b.load(x, v[0] * cols as i64 + v[1], f);
    let m = b.load(mean, v[0], f);
    let d = b.binary(BinaryOp::Sub, l, m, f);
    let centered = p.pointwise(&[2, cols], f, b.done(d));
    p.output(var);
    p.output(centered);
    (p.p, kernel("per_fused_mean_var_0", kind, vec![0, 1, 2, 3, 4], 2, Some(cols), vec![var, centered]))
}

#[test]
fn per_row_epilogue_and_two_outputs() {
    let (p, k) = mean_var(KernelKind::PersistentReduction, 6);
    let t = build_kernel(&p, &k);
    assert_eq!(t.args.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["in_ptr0", "out_ptr0", "out_ptr1"]);
    snapshot("tile_mean_var_persistent", t.to_string());
    let (p, k) = mean_var(KernelKind::LoopedReduction, 6);
    snapshot("tile_mean_var_looped", build_kernel(&p, &k).to_string());
}

#[test]
fn index_variables_are_rewritten() {
    // A permuted read over [2, 3, 4]: out[x0, x1, x2] = x[x2, x0, x1] (x is [4, 2, 3]).
    let mut p = Prog::default();
    let x = p.input(&[4, 2, 3], DType::F32);
    let v = xs(&[2, 3, 4]);
    let mut b = B::default();
    let l = b.load(x, v[2] * 6 + v[0] * 3 + v[1], DType::F32);
    let out = p.pointwise(&[2, 3, 4], DType::F32, b.done(l));
    let k = kernel("poi_fused_permute_0", KernelKind::Pointwise, vec![0], 24, None, vec![out]);
    let t = build_kernel(&p.p, &k);
    let TileStmt::Let { op: TileOp::Load { index, .. }, .. } = &t.body[0] else { panic!() };
    // 6*x2 + 3*x0 + x1 with x0 = xindex//12, x1 = (xindex//4) % 3, x2 = xindex % 4
    assert_eq!(index.to_string(), "xindex//4 + 6*(xindex % 4)");
    let TileStmt::Store { index, .. } = &t.body[1] else { panic!() };
    assert_eq!(index.to_string(), "xindex");
}

#[test]
fn shared_loads_are_computed_once_and_dead_values_dropped() {
    // Two nodes of one kernel load the same element; a dead value in a body is not emitted.
    let mut p = Prog::default();
    let x = p.input(&[8], DType::F32);
    let v = xs(&[8]);
    let mut b = B::default();
    let l = b.load(x, v[0], DType::F32);
    let _dead = b.unary(UnaryOp::Sin, l, DType::F32);
    let e = b.unary(UnaryOp::Exp, l, DType::F32);
    let a = p.pointwise(&[8], DType::F32, b.done(e));
    let mut b = B::default();
    let l = b.load(x, v[0], DType::F32);
    let ea = b.load(a, v[0], DType::F32);
    let s = b.binary(BinaryOp::Add, l, ea, DType::F32);
    let c = p.pointwise(&[8], DType::F32, b.done(s));
    let k = kernel("poi_fused_add_exp_0", KernelKind::Pointwise, vec![0, 1], 8, None, vec![a, c]);
    let t = build_kernel(&p.p, &k);
    snapshot("tile_shared_load", t.to_string());
    let lets = t.body.iter().filter(|s| matches!(s, TileStmt::Let { .. })).count();
    assert_eq!(lets, 3, "load, exp, add");
}

#[test]
fn masked_read_of_a_fused_buffer_is_a_where() {
    let mut p = Prog::default();
    let x = p.input(&[8], DType::F32);
    let v = xs(&[8]);
    let mut b = B::default();
    let l = b.load(x, v[0], DType::F32);
    let e = b.unary(UnaryOp::Exp, l, DType::F32);
    let a = p.pointwise(&[8], DType::F32, b.done(e));
    let mut b = B::default();
    let i = b.push(ScalarOp::Index(v[0]), DType::I64);
    let four = b.constant(4, DType::I64);
    let mask = b.binary(BinaryOp::Lt, i, four, DType::Bool);
    let m = b.push(ScalarOp::MaskedLoad { buffer: a, index: v[0], mask, other: Scalar::Float(-1.0) }, DType::F32);
    let c = p.pointwise(&[8], DType::F32, b.done(m));
    let k = kernel("poi_fused_exp_pad_0", KernelKind::Pointwise, vec![0, 1], 8, None, vec![c]);
    let t = build_kernel(&p.p, &k);
    assert!(t.body.iter().any(|s| matches!(s, TileStmt::Let { op: TileOp::Where(..), .. })));
    assert_eq!(t.args.len(), 2, "the fused buffer is not an argument");
}

#[test]
#[should_panic(expected = "extern call")]
fn extern_kernels_are_refused() {
    let (p, mut k) = pointwise_chain(DType::F32);
    k.kind = KernelKind::Extern;
    build_kernel(&p, &k);
}

#[test]
fn persistent_values_are_computed_in_the_pass_that_needs_them() {
    // y = (x - sum(x)) * w: the load of w is level 0 but only the epilogue uses it, so it sinks
    // after the reduction; x is used by the reduction and the epilogue, so it stays first.
    let f = DType::F32;
    let mut p = Prog::default();
    let x = p.input(&[2, 4], f);
    let w = p.input(&[4], f);
    let (xv, rv) = (xs(&[2])[0], rs(&[4])[0]);
    let mut b = B::default();
    let l = b.load(x, xv * 4 + rv, f);
    let s = p.reduction(&[2], &[4], ReduceOp::Sum, f, b.done(l));
    let v = xs(&[2, 4]);
    let mut b = B::default();
    let l = b.load(x, v[0] * 4 + v[1], f);
    let m = b.load(s, v[0], f);
    let d = b.binary(BinaryOp::Sub, l, m, f);
    let wl = b.load(w, v[1], f);
    let y = b.binary(BinaryOp::Mul, d, wl, f);
    let out = p.pointwise(&[2, 4], f, b.done(y));
    let k = kernel("per_fused_mul_sub_sum_0", KernelKind::PersistentReduction, vec![0, 1], 2, Some(4), vec![out]);
    let t = build_kernel(&p.p, &k);
    let pos = |f: &dyn Fn(&TileStmt) -> bool| t.body.iter().position(f).unwrap();
    let reduce = pos(&|s| matches!(s, TileStmt::Reduce { .. }));
    let load_x = pos(&|s| matches!(s, TileStmt::Let { op: TileOp::Load { arg: 0, .. }, .. }));
    let load_w = pos(&|s| matches!(s, TileStmt::Let { op: TileOp::Load { arg: 1, .. }, .. }));
    assert!(load_x < reduce && reduce < load_w, "{t}");
}

/// What a kernel of [`online`] computes over the rows of its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Online {
    /// `softmax(x, -1)`.
    Softmax,
    /// `log_softmax(x, -1)`: `(x - amax) - log(sum(exp(x - amax)))`.
    LogSoftmax,
    /// `logsumexp(x, -1)`: `log(sum(exp(x - M))) + M` with `M = where(isinf(amax), 0, amax)`.
    LogSumExp,
    /// `amax(x, -1)` and `sum(exp(x - amax), -1)`, both stored (cross-entropy's statistics).
    Stats,
}

/// `what` over the rows of `x: [rows, cols]` (`cols` = `None`: the size symbol `s0`, dim 1 of
/// the input, hint 3000) of dtype `input`, computed in f32 for f16/bf16 (`cast(load)`, results
/// cast back), as lowering produces it, in one looped kernel. `transposed`: `x` is stored as
/// `[cols, rows]` (the rows run down memory, a column reduction on the GPU).
pub(crate) fn online(
    rows: usize,
    cols: Option<usize>,
    input: DType,
    what: Online,
    transposed: bool,
) -> (LoopProgram, FusedKernel) {
    use coil_ir::loops::{range_var, reduction_var};
    let f = if input.size_bytes() == 2 { DType::F32 } else { input };
    let mut p = Prog::default();
    let n = cols.map_or_else(|| p.symbol("s0", 0, if transposed { 0 } else { 1 }, 3000), Expr::from);
    let r = Expr::from(rows);
    let x = p.input_e(&if transposed { [n, r] } else { [r, n] }, input);
    let at = |row: Expr, col: Expr| if transposed { col * rows as i64 + row } else { row * n + col };
    let value = |b: &mut B, index: Expr| {
        let l = b.load(x, index, input);
        if input == f {
            l
        } else {
            b.push(ScalarOp::Cast(l), f)
        }
    };
    let back = |b: &mut B, v| if input == f { v } else { b.push(ScalarOp::Cast(v), input) };
    let (xv, rv) = (range_var(0, &r), reduction_var(0, &n));
    let mut b = B::default();
    let v = value(&mut b, at(xv, rv));
    let amax = p.reduction_e(&[r], &[n], ReduceOp::Max, f, b.done(v));
    let shift = |b: &mut B, row: Expr| {
        let m = b.load(amax, row, f);
        if what != Online::LogSumExp {
            return m;
        }
        let inf = b.unary(UnaryOp::IsInf, m, DType::Bool);
        let zero = b.constant(0.0, f);
        b.push(ScalarOp::Where(inf, zero, m), f)
    };
    let mut b = B::default();
    let v = value(&mut b, at(xv, rv));
    let m = shift(&mut b, xv);
    let d = b.binary(BinaryOp::Sub, v, m, f);
    let e = b.unary(UnaryOp::Exp, d, f);
    let sum = p.reduction_e(&[r], &[n], ReduceOp::Sum, f, b.done(e));
    let (x0, x1) = (range_var(0, &r), range_var(1, &n));
    let mut b = B::default();
    let outs = match what {
        Online::Softmax | Online::LogSoftmax => {
            let v = value(&mut b, at(x0, x1));
            let m = b.load(amax, x0, f);
            let d = b.binary(BinaryOp::Sub, v, m, f);
            let s = b.load(sum, x0, f);
            let y = if what == Online::Softmax {
                let e = b.unary(UnaryOp::Exp, d, f);
                b.binary(BinaryOp::Div, e, s, f)
            } else {
                let l = b.unary(UnaryOp::Log, s, f);
                b.binary(BinaryOp::Sub, d, l, f)
            };
            let y = back(&mut b, y);
            vec![p.pointwise_e(&[r, n], input, b.done(y))]
        }
        Online::LogSumExp => {
            let s = b.load(sum, x0, f);
            let l = b.unary(UnaryOp::Log, s, f);
            let m = shift(&mut b, x0);
            let y = b.binary(BinaryOp::Add, l, m, f);
            let y = back(&mut b, y);
            vec![p.pointwise_e(&[r], input, b.done(y))]
        }
        Online::Stats => vec![amax, sum],
    };
    outs.iter().for_each(|&o| p.output(o));
    let nodes = (0..p.p.nodes.len()).collect();
    let name = format!("red_fused_{what:?}_0").to_lowercase();
    (p.p, kernel_e(&name, KernelKind::LoopedReduction, nodes, r, Some(n), outs))
}

fn rloops(t: &TileKernel) -> usize {
    t.body.iter().filter(|s| matches!(s, TileStmt::RLoop(_))).count()
}

/// `(online softmax updates, their finishes with finite_shift, plain max updates)` of `t`.
fn online_stmts(t: &TileKernel) -> (usize, Vec<bool>, usize) {
    let mut all: Vec<&TileStmt> = Vec::new();
    for s in &t.body {
        match s {
            TileStmt::RLoop(inner) => all.extend(inner),
            s => all.push(s),
        }
    }
    let updates = all.iter().filter(|s| matches!(s, TileStmt::AccUpdateOnlineSoftmax { .. })).count();
    let finishes = all
        .iter()
        .filter_map(|s| match s {
            TileStmt::ReduceOnlineSoftmax { finite_shift, .. } => Some(*finite_shift),
            _ => None,
        })
        .collect();
    let maxes = all.iter().filter(|s| matches!(s, TileStmt::AccUpdate { op: ReduceOp::Max, .. })).count();
    (updates, finishes, maxes)
}

#[test]
fn online_softmax_reads_the_row_once_for_max_and_sum() {
    for (what, passes) in [(Online::Softmax, 2), (Online::LogSoftmax, 2), (Online::LogSumExp, 1), (Online::Stats, 1)] {
        for (cols, input, transposed) in
            [(Some(8192), DType::F32, false), (None, DType::BF16, false), (Some(2000), DType::F64, true)]
        {
            let (p, k) = online(64, cols, input, what, transposed);
            let t = build_kernel(&p, &k);
            let case = format!("{what:?} {cols:?} {input}");
            assert_eq!(rloops(&t), passes, "{case}\n{t}");
            assert_eq!(online_stmts(&t), (1, vec![what == Online::LogSumExp], 0), "{case}\n{t}");
            // the pair is finished once, max then sum, right after its pass
            let at = t.body.iter().position(|s| matches!(s, TileStmt::ReduceOnlineSoftmax { .. })).unwrap();
            assert!(matches!(t.body[at - 1], TileStmt::RLoop(_)), "{case}\n{t}");
            let TileStmt::ReduceOnlineSoftmax { max, sum, dtype, .. } = t.body[at] else { unreachable!() };
            assert_eq!((sum, dtype), (max + 1, if input == DType::F64 { input } else { DType::F32 }), "{t}");
        }
    }
    let (p, k) = online(2, Some(2000), DType::F32, Online::LogSumExp, false);
    snapshot("tile_logsumexp_looped", build_kernel(&p, &k).to_string());
}

#[test]
fn online_softmax_through_the_passes() {
    use coil_ir::{Graph, LossReduction, Op, TensorMeta};
    let options = coil_passes::ScheduleOptions { persistent_max_rnumel: 1024 };
    // (op, input dtype, whether a target input, looped kernels' passes)
    let ce = |label_smoothing| Op::CrossEntropy {
        ignore_index: -100,
        reduction: LossReduction::Mean,
        label_smoothing,
        weight: false,
    };
    let cases = [
        (Op::Softmax { dim: 1 }, DType::F32, false, 2, false),
        (Op::Softmax { dim: 1 }, DType::BF16, false, 2, false),
        (Op::LogSoftmax { dim: 1 }, DType::F32, false, 2, false),
        (Op::LogSumExp { dims: vec![1], keepdim: false }, DType::F16, false, 1, true),
        (ce(0.0), DType::F32, true, 1, false),
        // the smoothing term sums the log-probabilities: one more pass, not fused
        (ce(0.1), DType::BF16, true, 3, false),
    ];
    for (op, d, target, passes, finite_shift) in cases {
        let mut g = Graph::new();
        let x = g.input(TensorMeta::new(vec![4, 4096], d));
        let inputs = if target { vec![x, g.input(TensorMeta::new(vec![4], DType::I64))] } else { vec![x] };
        let y = g.push(op.clone(), &inputs, None).unwrap();
        g.outputs.push(y);
        let program = coil_passes::lower(&coil_passes::decompose(&g).unwrap()).unwrap();
        let sched = coil_passes::schedule_with(&program, &options);
        let looped: Vec<&FusedKernel> =
            sched.kernels.iter().filter(|k| k.kind == KernelKind::LoopedReduction).collect();
        assert_eq!(looped.len(), 1, "{op:?}");
        let t = build_kernel(&program, looped[0]);
        assert_eq!(rloops(&t), passes, "{op:?}\n{t}");
        assert_eq!(online_stmts(&t), (1, vec![finite_shift], 0), "{op:?}\n{t}");
    }
}

#[test]
fn online_softmax_needs_the_max_of_the_same_values() {
    // sum(exp(x - amax(y))): the maximum of other values, two passes as before
    let f = DType::F32;
    let mut p = Prog::default();
    let (x, y) = (p.input(&[2, 3000], f), p.input(&[2, 3000], f));
    let (xv, rv) = (xs(&[2])[0], rs(&[3000])[0]);
    let mut b = B::default();
    let l = b.load(y, xv * 3000 + rv, f);
    let amax = p.reduction(&[2], &[3000], ReduceOp::Max, f, b.done(l));
    let mut b = B::default();
    let l = b.load(x, xv * 3000 + rv, f);
    let m = b.load(amax, xv, f);
    let d = b.binary(BinaryOp::Sub, l, m, f);
    let e = b.unary(UnaryOp::Exp, d, f);
    let sum = p.reduction(&[2], &[3000], ReduceOp::Sum, f, b.done(e));
    p.output(sum);
    let k = kernel("red_fused_amax_exp_sub_sum_0", KernelKind::LoopedReduction, vec![0, 1], 2, Some(3000), vec![sum]);
    let t = build_kernel(&p.p, &k);
    assert_eq!((rloops(&t), online_stmts(&t)), (2, (0, vec![], 1)), "{t}");
    // amax alone: one plain pass
    let mut p = Prog::default();
    let x = p.input(&[2, 3000], f);
    let mut b = B::default();
    let l = b.load(x, xv * 3000 + rv, f);
    let amax = p.reduction(&[2], &[3000], ReduceOp::Max, f, b.done(l));
    p.output(amax);
    let k = kernel("red_fused_amax_0", KernelKind::LoopedReduction, vec![0], 2, Some(3000), vec![amax]);
    let t = build_kernel(&p.p, &k);
    assert_eq!((rloops(&t), online_stmts(&t)), (1, (0, vec![], 1)), "{t}");
    // persistent rows are read once anyway
    let (p, k) = softmax(4, 8, KernelKind::PersistentReduction, "per_fused_softmax_0");
    assert_eq!(online_stmts(&build_kernel(&p, &k)), (0, vec![], 0));
}
