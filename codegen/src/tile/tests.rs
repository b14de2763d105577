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
    let mut p = Prog::default();
    let x = p.input(&[4, 8], d);
    let v = xs(&[4, 8]);
    let mut b = B::default();
    let l = b.load(x, v[0] * 8 + v[1], d);
    let two = b.constant(2.0, d);
    let m = b.binary(BinaryOp::Mul, l, two, d);
    let one = b.constant(1.0, d);
    let a = b.binary(BinaryOp::Add, m, one, d);
    let zero = b.constant(0.0, d);
    let r = b.binary(BinaryOp::Maximum, a, zero, d);
    let out = p.pointwise(&[4, 8], d, b.done(r));
    p.output(out);
    let k = kernel("poi_fused_add_mul_relu_0", KernelKind::Pointwise, vec![0], 32, None, vec![out]);
    (p.p, k)
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
    let mut p = Prog::default();
    let x = p.input(&[rows, cols], DType::F32);
    let mut b = B::default();
    let l = b.load(x, xs(&[rows])[0] * cols as i64 + rs(&[cols])[0], DType::F32);
    let out = p.reduction(&[rows], &[cols], ReduceOp::ArgMax, DType::I64, b.done(l));
    p.output(out);
    let kind = if cols <= 1024 { KernelKind::PersistentReduction } else { KernelKind::LoopedReduction };
    (p.p, kernel("per_fused_argmax_0", kind, vec![0], rows, Some(cols), vec![out]))
}

#[test]
fn argmax_tile() {
    let (p, k) = argmax(3, 5);
    let t = build_kernel(&p, &k);
    snapshot("tile_argmax", t.to_string());
}

/// `table[idx]` (embedding): bf16 table `[5, 4]`, i64 indices `[3]`.
pub(crate) fn embedding() -> (LoopProgram, FusedKernel) {
    let mut p = Prog::default();
    let table = p.input(&[5, 4], DType::BF16);
    let idx = p.input(&[3], DType::I64);
    let v = xs(&[3, 4]);
    let mut b = B::default();
    let i = b.load(idx, v[0], DType::I64);
    let g = b.push(
        ScalarOp::IndirectLoad { buffer: table, index: v[1], indirect: i, stride: Expr::from(4), bound: Expr::from(5) },
        DType::BF16,
    );
    let out = p.pointwise(&[3, 4], DType::BF16, b.done(g));
    p.output(out);
    (p.p, kernel("poi_fused_embedding_0", KernelKind::Pointwise, vec![0], 12, None, vec![out]))
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
