//! The e-graph rewrite pass (`coil_passes::simplify`): one soundness test per rule (the rule
//! fires, and the graph before and after agree on random inputs under the reference
//! interpreter), and the measured effects (bytes, flops, kernels, compile-time share).

use coil::ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Scalar, TensorMeta, UnaryOp};
use coil::Tensor;
use coil_passes::rewrite::{Cost, RewriteOptions, RewriteReport};
use coil_runtime::{Buffer, HostData};
use std::time::Instant;

// ---- building primitive graphs ----

/// A primitive graph under construction.
#[derive(Default)]
struct G(Graph);

impl G {
    fn input(&mut self, shape: &[usize], dtype: DType) -> NodeId {
        self.0.input(TensorMeta::new(shape.to_vec(), dtype))
    }
    fn full(&mut self, v: Scalar, shape: &[usize], dtype: DType) -> NodeId {
        self.0.full(v, shape.to_vec(), dtype, None)
    }
    fn f(&mut self, v: f64, like: NodeId) -> NodeId {
        let m = self.0.meta(like).clone();
        self.full(Scalar::Float(v), &m.shape, m.dtype)
    }
    fn op(&mut self, op: Op, args: &[NodeId]) -> NodeId {
        self.0.push(op, args, None).unwrap()
    }
    fn bin(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> NodeId {
        self.op(Op::Binary(op), &[a, b])
    }
    fn un(&mut self, op: UnaryOp, a: NodeId) -> NodeId {
        self.op(Op::Unary(op), &[a])
    }
    fn permute(&mut self, x: NodeId, perm: &[usize]) -> NodeId {
        self.op(Op::Permute { perm: perm.to_vec() }, &[x])
    }
    fn bmm(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.op(Op::Bmm, &[a, b])
    }
    fn out(mut self, outputs: &[NodeId]) -> Graph {
        self.0.outputs.extend_from_slice(outputs);
        self.0
    }
}

// ---- evaluating and comparing ----

/// Deterministic pseudo-random numbers (xorshift), uniform in [0, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Random data for each input of `g`: floats in [-2, 2), integers in [-20, 20], bools.
fn random_inputs(g: &Graph, seed: u64) -> Vec<Buffer> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
    g.inputs
        .iter()
        .map(|&i| {
            let m = g.meta(i);
            let data = if m.dtype.is_float() {
                let xs: Vec<f64> = (0..m.numel()).map(|_| rng.next() * 4.0 - 2.0).collect();
                HostData::from_f64_slice(m.dtype, &xs)
            } else if m.dtype == DType::Bool {
                let xs: Vec<i64> = (0..m.numel()).map(|_| (rng.next() < 0.5) as i64).collect();
                HostData::from_i64_slice(m.dtype, &xs)
            } else {
                let xs: Vec<i64> = (0..m.numel()).map(|_| (rng.next() * 41.0) as i64 - 20).collect();
                HostData::from_i64_slice(m.dtype, &xs)
            };
            Buffer::new(m.shape.clone(), data).unwrap()
        })
        .collect()
}

/// Relative tolerance of a dtype (integers and bool: exact).
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-9,
        DType::F32 => 1e-4,
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        _ => 0.0,
    }
}

/// Asserts both graphs give the same outputs on a few random inputs, within dtype tolerance
/// (relative to each output's mean magnitude, so cancellation does not make noise fail).
fn assert_same_values(before: &Graph, after: &Graph) {
    assert_eq!(before.inputs.len(), after.inputs.len());
    for seed in 0..3 {
        let inputs = random_inputs(before, seed);
        let refs: Vec<&Buffer> = inputs.iter().collect();
        let a = coil_runtime::interpret(before, &refs).unwrap();
        let b = coil_runtime::interpret(after, &refs).unwrap();
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.meta(), y.meta());
            let (xs, ys) = (x.data.to_f64_vec(), y.data.to_f64_vec());
            let finite: Vec<f64> = xs.iter().filter(|v| v.is_finite()).map(|v| v.abs()).collect();
            let scale = finite.iter().sum::<f64>() / finite.len().max(1) as f64;
            let tol = tolerance(x.dtype());
            for (i, (p, q)) in xs.iter().zip(&ys).enumerate() {
                let same = p.to_bits() == q.to_bits()
                    || (p.is_nan() && q.is_nan())
                    || (p - q).abs() <= tol * (p.abs() + scale);
                assert!(same, "element {i}: {p} before, {q} after\nbefore:\n{before}\nafter:\n{after}");
            }
        }
    }
}

/// Runs the pass on `g`, checks the result is primitive with the same inputs and outputs,
/// that `rule` fired, and that values agree. Returns the result and the report.
#[track_caller]
fn sound(g: &Graph, rule: &str) -> (Graph, RewriteReport) {
    let (out, report) = coil_passes::simplify(g, &RewriteOptions::default()).unwrap();
    out.verify_primitive().unwrap();
    let metas = |g: &Graph, ids: &[NodeId]| ids.iter().map(|&i| g.meta(i).clone()).collect::<Vec<_>>();
    assert_eq!(metas(g, &g.inputs), metas(&out, &out.inputs));
    assert_eq!(metas(g, &g.outputs), metas(&out, &out.outputs));
    assert!(report.fired(rule) > 0, "{rule} did not fire on\n{g}\n{report}");
    assert_same_values(g, &out);
    (out, report)
}

/// The ops of a graph's live nodes, by name.
fn op_names(g: &Graph) -> Vec<&'static str> {
    g.live_nodes().into_iter().map(|i| g.node(i).op.name()).filter(|n| *n != "input").collect()
}

// ---- one soundness test per rule ----

#[test]
fn mul_one_is_removed() {
    for dtype in [DType::F32, DType::F16, DType::I32] {
        let mut g = G::default();
        let x = g.input(&[3, 4], dtype);
        let one = g.full(Scalar::Int(1), &[3, 4], dtype);
        let y = g.bin(BinaryOp::Mul, x, one);
        let z = g.bin(BinaryOp::Mul, one, y);
        let w = g.un(UnaryOp::Abs, z);
        let (out, _) = sound(&g.out(&[w]), "mul-one");
        assert_eq!(op_names(&out), ["abs"]);
    }
}

#[test]
fn div_and_pow_by_one_are_removed() {
    let mut g = G::default();
    let x = g.input(&[8], DType::F32);
    let one = g.f(1.0, x);
    let y = g.bin(BinaryOp::Div, x, one);
    let z = g.bin(BinaryOp::Pow, y, one);
    let w = g.un(UnaryOp::Exp, z);
    let (out, r) = sound(&g.out(&[w]), "div-pow-one");
    assert_eq!(r.fired("div-pow-one"), 2);
    assert_eq!(op_names(&out), ["exp"]);
}

#[test]
fn add_zero_only_where_it_keeps_negative_zero() {
    let mut g = G::default();
    let (x, i) = (g.input(&[8], DType::F32), g.input(&[8], DType::I32));
    let nz = g.f(-0.0, x);
    let a = g.bin(BinaryOp::Add, x, nz); // x + (-0.0) == x, -0.0 included
    let pz = g.f(0.0, x);
    let b = g.bin(BinaryOp::Sub, a, pz); // x - 0.0 == x
    let iz = g.full(Scalar::Int(0), &[8], DType::I32);
    let c = g.bin(BinaryOp::Add, iz, i);
    let (out, r) = sound(&g.out(&[b, c]), "add-zero");
    assert_eq!(r.fired("add-zero"), 3, "{r}");
    assert_eq!(out.outputs, out.inputs, "{out}");

    // x + 0.0 is not the identity (-0.0 + 0.0 = +0.0): it must stay.
    let mut g = G::default();
    let x = g.input(&[8], DType::F32);
    let pz = g.f(0.0, x);
    let y = g.bin(BinaryOp::Add, x, pz);
    let (_, r) = coil_passes::simplify(&g.out(&[y]), &RewriteOptions::default()).unwrap();
    assert_eq!(r.fired("add-zero"), 0);
}

#[test]
fn integer_times_zero_is_zero() {
    let mut g = G::default();
    let x = g.input(&[6], DType::I64);
    let z = g.full(Scalar::Int(0), &[6], DType::I64);
    let y = g.bin(BinaryOp::Mul, x, z);
    let w = g.bin(BinaryOp::Add, y, x);
    let (out, _) = sound(&g.out(&[w]), "mul-zero-int");
    assert_eq!(out.outputs, out.inputs, "{out}");
}

#[test]
fn double_negation_cancels() {
    let mut g = G::default();
    let (x, b) = (g.input(&[5], DType::F32), g.input(&[5], DType::Bool));
    let n1 = g.un(UnaryOp::Neg, x);
    let n2 = g.un(UnaryOp::Neg, n1);
    let y = g.un(UnaryOp::Exp, n2);
    let l1 = g.un(UnaryOp::LogicalNot, b);
    let l2 = g.un(UnaryOp::LogicalNot, l1);
    let (out, r) = sound(&g.out(&[y, l2]), "involution");
    assert_eq!(r.fired("involution"), 2);
    assert_eq!(op_names(&out), ["exp"]);
}

#[test]
fn max_of_a_value_with_itself_is_the_value() {
    let mut g = G::default();
    let x = g.input(&[7], DType::F32);
    let e = g.un(UnaryOp::Exp, x);
    let m = g.bin(BinaryOp::Maximum, e, e);
    let (out, _) = sound(&g.out(&[m]), "idempotent");
    assert_eq!(op_names(&out), ["exp"]);
}

#[test]
fn bit_ops_cancel_and_absorb() {
    let mut g = G::default();
    let (x, b) = (g.input(&[6], DType::I32), g.input(&[6], DType::Bool));
    let n1 = g.un(UnaryOp::BitwiseNot, x);
    let n2 = g.un(UnaryOp::BitwiseNot, n1);
    let m = g.bin(BinaryOp::BitwiseOr, n2, n2);
    let s = g.bin(BinaryOp::BitwiseXor, m, x); // 0, computed
    let c1 = g.un(UnaryOp::BitwiseNot, b);
    let c2 = g.un(UnaryOp::BitwiseNot, c1);
    let c = g.bin(BinaryOp::BitwiseAnd, c2, c2);
    let (out, r) = sound(&g.out(&[s, c]), "involution");
    assert_eq!(r.fired("involution"), 2);
    assert!(r.fired("idempotent") >= 2, "{r}");
    assert_eq!(op_names(&out), ["bitwise_xor"], "{out}");
}

#[test]
fn shifts_of_constants_fold_as_pytorch_shifts() {
    // 1 << 33 in i32 and -8 >> 40 (shifts by at least the width) fold to 0 and -1, as the
    // interpreter computes them
    let mut g = G::default();
    let x = g.input(&[3], DType::I32);
    let one = g.full(Scalar::Int(1), &[3], DType::I32);
    let far = g.full(Scalar::Int(33), &[3], DType::I32);
    let l = g.bin(BinaryOp::ShiftLeft, one, far);
    let neg = g.full(Scalar::Int(-8), &[3], DType::I32);
    let forty = g.full(Scalar::Int(40), &[3], DType::I32);
    let r = g.bin(BinaryOp::ShiftRight, neg, forty);
    let y = g.bin(BinaryOp::Add, x, l);
    let z = g.bin(BinaryOp::Mul, x, r);
    let (out, _) = sound(&g.out(&[y, z]), "constant-fold");
    assert!(!op_names(&out).iter().any(|n| n.contains("shift")), "{out}");
}

#[test]
fn where_on_a_constant_condition_selects() {
    let mut g = G::default();
    let (a, b, c) = (g.input(&[4], DType::F32), g.input(&[4], DType::F32), g.input(&[4], DType::Bool));
    let t = g.full(Scalar::Bool(true), &[4], DType::Bool);
    let y = g.op(Op::Where, &[t, a, b]);
    let e = g.un(UnaryOp::Exp, b);
    let z = g.op(Op::Where, &[c, e, e]);
    let (out, r) = sound(&g.out(&[y, z]), "where-select");
    assert_eq!(r.fired("where-select"), 2);
    assert_eq!(op_names(&out), ["exp"]);
}

#[test]
fn lossless_cast_chains_collapse_and_narrowing_ones_stay() {
    let mut g = G::default();
    let x = g.input(&[6], DType::F16);
    let a = g.op(Op::Cast(DType::F32), &[x]);
    let b = g.op(Op::Cast(DType::F64), &[a]);
    let i = g.input(&[6], DType::I16);
    let c = g.op(Op::Cast(DType::I32), &[i]);
    let d = g.op(Op::Cast(DType::I16), &[c]); // a round trip through a wider type
    let e = g.un(UnaryOp::Neg, d);
    let (out, r) = sound(&g.out(&[b, e]), "cast-cast");
    assert_eq!(r.fired("cast-cast"), 2);
    assert_eq!(op_names(&out), ["cast", "neg"], "{out}");

    // f32 -> f16 -> f32 rounds: it must stay.
    let mut g = G::default();
    let x = g.input(&[6], DType::F32);
    let a = g.op(Op::Cast(DType::F16), &[x]);
    let b = g.op(Op::Cast(DType::F32), &[a]);
    let (_, r) = coil_passes::simplify(&g.out(&[b]), &RewriteOptions::default()).unwrap();
    assert_eq!(r.fired("cast-cast"), 0);
}

#[test]
fn views_that_change_nothing_go() {
    let mut g = G::default();
    let x = g.input(&[3, 4], DType::F32);
    let a = g.op(Op::Reshape { shape: vec![3, 4] }, &[x]);
    let b = g.op(Op::Slice { dim: 1, start: 0, len: 4, step: 1 }, &[a]);
    let c = g.un(UnaryOp::Exp, b);
    let (out, _) = sound(&g.out(&[c]), "view-identity");
    assert_eq!(op_names(&out), ["exp"]);
}

#[test]
fn view_chains_compose() {
    let mut g = G::default();
    let x = g.input(&[2, 3, 4], DType::F32);
    let p1 = g.permute(x, &[2, 0, 1]);
    let p2 = g.permute(p1, &[0, 2, 1]); // [4, 3, 2] = permute(x, [2, 1, 0])
    let r1 = g.op(Op::Reshape { shape: vec![4, 6] }, &[p2]);
    let r2 = g.op(Op::Reshape { shape: vec![2, 12] }, &[r1]);
    let s1 = g.op(Op::Slice { dim: 1, start: 10, len: 6, step: -2 }, &[r2]);
    let s2 = g.op(Op::Slice { dim: 1, start: 1, len: 2, step: 2 }, &[s1]);
    let u = g.input(&[1, 4], DType::F32);
    let e1 = g.op(Op::Expand { shape: vec![3, 4] }, &[u]);
    let e2 = g.op(Op::Expand { shape: vec![2, 3, 4] }, &[e1]);
    let y = g.un(UnaryOp::Exp, s2);
    let z = g.un(UnaryOp::Exp, e2);
    let (out, r) = sound(&g.out(&[y, z]), "view-chain");
    assert!(r.fired("view-chain") >= 4, "{r}");
    let names = op_names(&out);
    assert_eq!(names.iter().filter(|n| **n == "permute").count(), 1, "{out}");
    assert_eq!(names.iter().filter(|n| **n == "slice").count(), 1, "{out}");
    assert_eq!(names.iter().filter(|n| **n == "expand").count(), 1, "{out}");
}

#[test]
fn constants_fold() {
    let mut g = G::default();
    let x = g.input(&[4], DType::F32);
    let two = g.f(2.0, x);
    let three = g.f(3.0, x);
    let five = g.bin(BinaryOp::Add, two, three);
    let y = g.bin(BinaryOp::Mul, x, five);
    let (out, _) = sound(&g.out(&[y]), "constant-fold");
    assert_eq!(op_names(&out), ["full", "mul"], "{out}");
}

#[test]
fn transpose_of_a_product_swaps_its_operands() {
    let mut g = G::default();
    let (x, y) = (g.input(&[5, 3], DType::F32), g.input(&[4, 5], DType::F32));
    let (xt, yt) = (g.permute(x, &[1, 0]), g.permute(y, &[1, 0]));
    let p = g.bmm(xt, yt); // [3, 4]
    let z = g.permute(p, &[1, 0]);
    let (out, r) = sound(&g.out(&[z]), "bmm-transpose");
    assert_eq!(op_names(&out), ["bmm"], "{out}");
    assert!(r.cost_after.bytes < r.cost_before.bytes, "{r}");
}

#[test]
fn scalar_factors_leave_products() {
    let mut g = G::default();
    let (a, b) = (g.input(&[2, 16, 32], DType::F32), g.input(&[2, 32, 2], DType::F32));
    let s = g.f(0.125, a);
    let scaled = g.bin(BinaryOp::Mul, a, s);
    let y = g.bmm(scaled, b); // [2, 16, 2]: scaling the output is 16x cheaper
    let (out, r) = sound(&g.out(&[y]), "bmm-scalar");
    assert_eq!(op_names(&out), ["bmm", "full", "mul"], "{out}");
    assert!(r.cost_after.bytes < r.cost_before.bytes, "{r}");
}

#[test]
fn scalar_factors_leave_reductions() {
    let mut g = G::default();
    let x = g.input(&[8, 64], DType::F32);
    let s = g.f(3.0, x);
    let xs = g.bin(BinaryOp::Mul, s, x);
    let sum = g.op(Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[xs]);
    let max = g.op(Op::Reduce { op: ReduceOp::Max, dims: vec![1], keepdim: true }, &[xs]);
    let (out, r) = sound(&g.out(&[sum, max]), "reduce-scalar");
    assert_eq!(r.fired("reduce-scalar"), 2);
    let big_muls = out.live_nodes().into_iter().filter(|&i| out.node(i).op.name() == "mul" && out.meta(i).numel() > 8);
    assert_eq!(big_muls.count(), 0, "the factor applies to the 8 results: {out}");
    assert!(r.cost_after.bytes < r.cost_before.bytes, "{r}");

    // A negative factor does not commute with max.
    let mut g = G::default();
    let x = g.input(&[8, 64], DType::F32);
    let s = g.f(-3.0, x);
    let xs = g.bin(BinaryOp::Mul, x, s);
    let max = g.op(Op::Reduce { op: ReduceOp::Max, dims: vec![1], keepdim: false }, &[xs]);
    let (_, r) = coil_passes::simplify(&g.out(&[max]), &RewriteOptions::default()).unwrap();
    assert_eq!(r.fired("reduce-scalar"), 0);
}

#[test]
fn a_scatter_add_into_zeros_accumulates_into_the_other_addend() {
    for (dtype, zero) in [
        (DType::F32, Scalar::Float(0.0)),
        (DType::F32, Scalar::Float(-0.0)),
        (DType::F64, Scalar::Float(0.0)),
        (DType::BF16, Scalar::Float(0.0)),
        (DType::I64, Scalar::Int(0)),
    ] {
        for scatter_first in [false, true] {
            let mut g = G::default();
            let y = g.input(&[5, 4], dtype);
            let raw = g.input(&[12, 1], DType::I64);
            let src = g.input(&[12, 4], dtype);
            let five = g.full(Scalar::Int(5), &[12, 1], DType::I64);
            let rows = g.bin(BinaryOp::Remainder, raw, five); // 12 rows into 5: indices repeat
            let index = g.op(Op::Expand { shape: vec![12, 4] }, &[rows]);
            let zeros = g.full(zero, &[5, 4], dtype);
            let s = g.op(Op::Scatter { dim: 0, reduce: Some(ReduceOp::Sum) }, &[zeros, index, src]);
            let sum = if scatter_first { g.bin(BinaryOp::Add, s, y) } else { g.bin(BinaryOp::Add, y, s) };
            let (out, r) = sound(&g.out(&[sum]), "scatter-into-addend");
            assert_eq!(op_names(&out), ["full", "remainder", "expand", "scatter_add"], "{dtype}: {out}");
            assert!(r.cost_after.bytes < r.cost_before.bytes, "{r}");
        }
    }
}

/// `B @ A @ x` for a low-rank adapter: B `[out, r]`, A `[r, in]`, x `[in, batch]`, built in the
/// expensive order `(B @ A) @ x` (`cheap = false`) or the cheap `B @ (A @ x)`.
fn adapter(out: usize, inp: usize, r: usize, batch: usize, cheap: bool) -> Graph {
    let mut g = G::default();
    let (b, a, x) =
        (g.input(&[out, r], DType::F32), g.input(&[r, inp], DType::F32), g.input(&[inp, batch], DType::F32));
    let y = if cheap {
        let ax = g.bmm(a, x);
        g.bmm(b, ax)
    } else {
        let ba = g.bmm(b, a);
        g.bmm(ba, x)
    };
    g.out(&[y])
}

/// Whether the graph computes `B @ (A @ x)` (inputs 0, 1, 2).
fn is_cheap_order(g: &Graph) -> bool {
    let out = g.node(g.outputs[0]);
    matches!(out.op, Op::Bmm)
        && out.inputs[0] == g.inputs[0]
        && matches!(g.node(out.inputs[1]).op, Op::Bmm)
        && g.node(out.inputs[1]).inputs == [g.inputs[1], g.inputs[2]]
}

#[test]
fn matrix_chains_reassociate_to_the_cheap_order() {
    // Small sizes in the adapter's proportions (out 11008 : in 4096 : r 16 : batch 8192 / 64).
    let (_, r) = sound(&adapter(172, 64, 2, 128, false), "bmm-assoc-right");
    assert!(r.cost_after.flops < r.cost_before.flops, "{r}");
    let (out, r) = sound(&adapter(86, 64, 2, 16, true), "bmm-assoc-left");
    assert!(is_cheap_order(&out) && !r.accepted, "the cheap order stays\n{out}");
}

// ---- measured effects ----

/// Held by the tests that compile C or spawn processes, and by the timing test: timings are
/// not taken while this binary keeps the machine busy.
static QUIET: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Live non-extern kernels the scheduler makes of a primitive graph.
fn kernel_count(g: &Graph) -> usize {
    let program = coil_passes::split_reductions(&coil_passes::lower(g).unwrap());
    let schedule = coil_passes::schedule(&program);
    schedule.kernels.iter().filter(|k| k.kind != coil::ir::kernel::KernelKind::Extern).count()
}

fn effect(name: &str, before: &Graph, after: &Graph, r: &RewriteReport) {
    let (kb, ka) = (kernel_count(before), kernel_count(after));
    println!(
        "{name}: bytes {} -> {}, flops {} -> {}, generated kernels {kb} -> {ka}, nodes {} -> {}",
        r.cost_before.bytes, r.cost_after.bytes, r.cost_before.flops, r.cost_after.flops, r.nodes_before, r.nodes_after
    );
}

fn primitive(outputs: &[&Tensor]) -> Graph {
    coil::decompose(&coil::capture(outputs).graph).unwrap()
}

fn zeros(shape: &[usize]) -> Tensor {
    Tensor::from_vec(vec![0f32; shape.iter().product()], shape).unwrap()
}

#[test]
fn effect_low_rank_adapter_at_real_sizes() {
    // Meta only: the pass never touches data, so the real sizes cost nothing to check.
    let expensive = adapter(11008, 4096, 16, 8192, false);
    let (out, r) = coil_passes::simplify(&expensive, &RewriteOptions::default()).unwrap();
    assert!(is_cheap_order(&out), "{out}\n{r}");
    let Cost { flops, .. } = r.cost_after;
    assert_eq!(flops, 2 * 16 * 4096 * 8192 + 2 * 11008 * 16 * 8192);
    println!("{r}");
    println!(
        "low-rank adapter (11008, 4096, r 16, batch 8192): bytes {} -> {}, flops {} -> {}",
        r.cost_before.bytes, r.cost_after.bytes, r.cost_before.flops, r.cost_after.flops
    );
    let cheap = adapter(11008, 4096, 16, 8192, true);
    let (out, r) = coil_passes::simplify(&cheap, &RewriteOptions::default()).unwrap();
    assert!(is_cheap_order(&out) && !r.accepted, "{r}");
}

#[test]
fn effect_transposed_product() {
    let (x, y) = (zeros(&[64, 32]), zeros(&[48, 64]));
    let z = x.t().unwrap().matmul(&y.t().unwrap()).unwrap().t().unwrap();
    let g = primitive(&[&z]);
    let (out, r) = sound(&g, "bmm-transpose");
    effect("(x.t() @ y.t()).t()", &g, &out, &r);
    assert_eq!(op_names(&out), ["bmm"], "{out}");
    assert!(kernel_count(&out) < kernel_count(&g));
}

#[test]
fn effect_redundant_view_chain() {
    let x = zeros(&[8, 6]);
    let y = x.reshape(&[2, 4, 6]).unwrap().permute(&[0, 2, 1]).unwrap().permute(&[0, 2, 1]).unwrap();
    let y = y.reshape(&[8, 6]).unwrap();
    let g = primitive(&[&y]);
    let (out, r) = sound(&g, "view-chain");
    effect("reshape -> permute -> permute -> reshape", &g, &out, &r);
    assert_eq!(out.outputs, out.inputs, "{out}");
    assert!(r.cost_after.bytes < r.cost_before.bytes && kernel_count(&out) < kernel_count(&g));
}

#[test]
fn effect_hand_written_softmax() {
    // `exp(x) / sum(exp(x))` written with exp twice: the e-graph shares it. The stable form
    // (max subtracted) is not an equivalence, so the pass does not introduce it.
    let x = zeros(&[8, 64]);
    let y = &x.exp().unwrap() / &x.exp().unwrap().sum(&[-1], true).unwrap();
    let g = primitive(&[&y]);
    let (out, r) = coil_passes::simplify(&g, &RewriteOptions::default()).unwrap();
    assert_same_values(&g, &out);
    effect("hand-written softmax", &g, &out, &r);
    assert!(r.accepted && r.cost_after.bytes < r.cost_before.bytes, "{r}");
    assert_eq!(op_names(&out).iter().filter(|n| **n == "exp").count(), 1, "{out}");
    assert!(!op_names(&out).contains(&"amax"), "no stable form is made up: {out}");
}

/// One GPT-2 block forward (pre-norm attention and MLP, as in `tests/kernels.rs`), f32.
fn gpt2_block(b: usize, t: usize, c: usize, heads: usize) -> Tensor {
    let mut seed = 1u64;
    let mut param = |shape: &[usize]| {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        seed += 1;
        let v: Vec<f32> = (0..shape.iter().product()).map(|_| (rng.next() as f32 - 0.5) * 0.2).collect();
        Tensor::from_vec(v, shape).unwrap()
    };
    let x = param(&[b, t, c]);
    let (bi, ti, ci, hd) = (b as i64, t as i64, c as i64, (c / heads) as i64);
    let (ln1_w, ln1_b, ln2_w, ln2_b) = (param(&[c]), param(&[c]), param(&[c]), param(&[c]));
    let (w_qkv, b_qkv) = (param(&[3 * c, c]), param(&[3 * c]));
    let (w_proj, b_proj) = (param(&[c, c]), param(&[c]));
    let (w_fc, b_fc) = (param(&[4 * c, c]), param(&[4 * c]));
    let (w_out, b_out) = (param(&[c, 4 * c]), param(&[c]));
    let h = x.layer_norm(&[c], Some(&ln1_w), Some(&ln1_b), 1e-5).unwrap();
    let qkv = h.linear(&w_qkv, Some(&b_qkv)).unwrap();
    let parts = qkv.split(c, -1).unwrap();
    let heads_of = |p: &Tensor| p.reshape(&[bi, ti, heads as i64, hd]).unwrap().transpose(1, 2).unwrap();
    let (q, k, v) = (heads_of(&parts[0]), heads_of(&parts[1]), heads_of(&parts[2]));
    let scores = q.matmul(&k.transpose(-2, -1).unwrap()).unwrap() * (1.0 / (hd as f64).sqrt());
    let causal = Tensor::ones(&[t, t], DType::Bool).tril(0).unwrap();
    let probs = coil::where_(&causal, &scores, f64::NEG_INFINITY).unwrap().softmax(-1).unwrap();
    let attn = probs.matmul(&v).unwrap().transpose(1, 2).unwrap().reshape(&[bi, ti, ci]).unwrap();
    let x = &x + &attn.linear(&w_proj, Some(&b_proj)).unwrap();
    let m = x.layer_norm(&[c], Some(&ln2_w), Some(&ln2_b), 1e-5).unwrap();
    let m = m.linear(&w_fc, Some(&b_fc)).unwrap().gelu(true).unwrap().linear(&w_out, Some(&b_out)).unwrap();
    &x + &m
}

#[test]
fn effect_gpt2_block_and_compile_time_share() {
    let y = gpt2_block(2, 16, 64, 4);
    let captured = coil::capture(&[&y]).graph;
    let prim = coil::decompose(&captured).unwrap();
    let (out, r) = coil_passes::simplify(&prim, &RewriteOptions::default()).unwrap();
    out.verify_primitive().unwrap();
    assert_same_values(&prim, &out);
    effect("GPT-2 block", &prim, &out, &r);
    println!("{r}");
    assert!(r.cost_after.bytes <= r.cost_before.bytes && r.cost_after.flops <= r.cost_before.flops);

    // Compile time in-process without the C compiler: decompose, rewrite, lower, schedule,
    // build and emit kernels. Best of several runs per stage (the machine is shared), and not
    // while this binary's compiling tests run.
    let _quiet = QUIET.lock().unwrap_or_else(|e| e.into_inner());
    let mut best = [f64::INFINITY; 5];
    for _ in 0..20 {
        let mut lap = Instant::now();
        let mut time = |i: usize, best: &mut [f64; 5]| {
            best[i] = best[i].min(lap.elapsed().as_secs_f64());
            lap = Instant::now();
        };
        let prim = coil::decompose(&captured).unwrap();
        time(0, &mut best);
        let (g, _) = coil_passes::simplify(&prim, &RewriteOptions::default()).unwrap();
        time(1, &mut best);
        let program = coil_passes::split_reductions(&coil_passes::lower(&g).unwrap());
        time(2, &mut best);
        let schedule = coil_passes::schedule(&program);
        time(3, &mut best);
        let kernels: Vec<_> = schedule
            .kernels
            .iter()
            .filter(|k| k.kind != coil::ir::kernel::KernelKind::Extern)
            .map(|k| coil_codegen::build_kernel(&program, k))
            .collect();
        let _ = coil_codegen::emit_c(&kernels);
        time(4, &mut best);
    }
    let total: f64 = best.iter().sum();
    let share = best[1] / total;
    println!(
        "GPT-2 block compile (ms): decompose {:.2}, rewrite {:.2}, lower {:.2}, schedule {:.2}, codegen {:.2}; rewrite share {:.1}%",
        best[0] * 1e3,
        best[1] * 1e3,
        best[2] * 1e3,
        best[3] * 1e3,
        best[4] * 1e3,
        share * 100.0
    );
    // A measurement, not a pass/fail timing (timings on a shared machine are noise-prone): the
    // share is printed here and reported on the issue; a share far off the 10% budget means the
    // pass has lost its bounds, which the structural assertions above would not catch, so a
    // generous ceiling still guards against that.
    assert!(share <= 0.5, "the rewrite pass takes {:.1}% of compile time", share * 100.0);
}

#[test]
fn switched_off_leaves_the_graph_alone() {
    let mut g = G::default();
    let x = g.input(&[4], DType::F32);
    let one = g.f(1.0, x);
    let y = g.bin(BinaryOp::Mul, x, one);
    let g = g.out(&[y]);
    let off = RewriteOptions { enabled: false, ..RewriteOptions::default() };
    let (out, r) = coil_passes::simplify(&g, &off).unwrap();
    assert_eq!(out, g);
    assert_eq!(r.to_string(), "rewrite: off (COIL_REWRITE=0)\n");
}

#[test]
fn output_is_deterministic() {
    let y = gpt2_block(1, 8, 32, 2);
    let prim = primitive(&[&y]);
    let first = coil_passes::simplify(&prim, &RewriteOptions::default()).unwrap();
    for _ in 0..3 {
        let again = coil_passes::simplify(&prim, &RewriteOptions::default()).unwrap();
        assert_eq!(again.0, first.0);
        assert_eq!(again.1.fired, first.1.fired);
        assert_eq!((again.1.egraph_nodes, again.1.egraph_classes), (first.1.egraph_nodes, first.1.egraph_classes));
    }
}

// ---- wired into the compiler ----

/// `(x.t() @ y.t()).t()` compiled: the summary carries the rewrite's time, bytes and flops.
#[test]
fn compiled_graphs_report_the_rewrite() {
    if coil_runtime::testing::c_compiler().is_none() {
        return;
    }
    let _busy = QUIET.lock().unwrap_or_else(|e| e.into_inner());
    let (x, y) = (zeros(&[16, 8]), zeros(&[12, 16]));
    let z = x.t().unwrap().matmul(&y.t().unwrap()).unwrap().t().unwrap();
    let compiled = coil::inspect(&[&z]).unwrap();
    let s: serde_json::Value = serde_json::from_str(&compiled.summary).unwrap();
    assert!(s["compile_seconds"]["rewrite"].as_f64().is_some(), "{s}");
    let r = &s["rewrite"];
    let off = !coil::config().rewrite;
    if off {
        assert_eq!(r["bytes_before"], r["bytes_after"], "{s}");
    } else {
        assert!(r["bytes_after"].as_u64() < r["bytes_before"].as_u64(), "{s}");
        assert_eq!(s["generated_kernels"], 0, "the transposed output needs no copy: {s}");
    }
}

/// `rewrites.txt` is dumped, and `COIL_REWRITE=0` switches the pass off.
#[test]
fn rewrites_txt_is_dumped_and_the_pass_can_be_switched_off() {
    if coil_runtime::testing::c_compiler().is_none() {
        return;
    }
    let _busy = QUIET.lock().unwrap_or_else(|e| e.into_inner());
    for (setting, expect) in [("1", "  bmm-transpose: 1\n"), ("0", "rewrite: off")] {
        let dir = std::env::temp_dir().join(format!("coil_rewrite_dump_{setting}_{}", std::process::id()));
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "compiled_graphs_report_the_rewrite", "--nocapture"])
            .env("COIL_DEBUG", &dir)
            .env("COIL_REWRITE", setting)
            .status()
            .unwrap();
        assert!(status.success());
        let run = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        let text = std::fs::read_to_string(run.join("graph_0").join("rewrites.txt")).unwrap();
        assert!(text.contains(expect), "COIL_REWRITE={setting}:\n{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// ---- the attention template, chosen by the composite-level e-graph stage ----

/// `layers` of GPT-2's causal self-attention as a PyTorch user writes it (nanoGPT's
/// `CausalSelfAttention` without `F.scaled_dot_product_attention`): the fused QKV projection
/// split into heads, `q @ k.transpose(-2, -1) * (1 / sqrt(d))`, `masked_fill(bias[:T, :T] == 0,
/// -inf)` of a `tril` buffer larger than the block, softmax (in f32 for `dtype` f16 / bf16), `@ v`, the
/// heads merged and projected. The output of the last layer.
fn gpt2_attention(layers: usize, b: usize, t: usize, c: usize, heads: usize, dtype: DType) -> Tensor {
    let mut rng = Rng(7);
    let mut param = |shape: &[usize]| {
        let v: Vec<f32> = (0..shape.iter().product()).map(|_| (rng.next() as f32 - 0.5) * 0.2).collect();
        Tensor::from_vec(v, shape).unwrap().to_dtype(dtype).unwrap()
    };
    let (bi, ti, ci, hd) = (b as i64, t as i64, c as i64, (c / heads) as i64);
    // The buffer nanoGPT registers: the causal mask of the largest block, sliced to T.
    let bias = Tensor::ones(&[2 * t, 2 * t], DType::Bool).tril(0).unwrap();
    let mut x = param(&[b, t, c]);
    for _ in 0..layers {
        let (w_qkv, w_proj) = (param(&[3 * c, c]), param(&[c, c]));
        let parts = x.linear(&w_qkv, None).unwrap().split(c, -1).unwrap();
        let heads_of = |p: &Tensor| p.view(&[bi, ti, heads as i64, hd]).unwrap().transpose(1, 2).unwrap();
        let (q, k, v) = (heads_of(&parts[0]), heads_of(&parts[1]), heads_of(&parts[2]));
        let att = q.matmul(&k.transpose(-2, -1).unwrap()).unwrap() * (1.0 / (hd as f64).sqrt());
        let mask = bias.slice(0, None, Some(ti), 1).unwrap().slice(1, None, Some(ti), 1).unwrap();
        let att = att.masked_fill(&mask.eq(0).unwrap(), f64::NEG_INFINITY).unwrap();
        let att = if dtype == DType::F32 {
            att.softmax(-1).unwrap()
        } else {
            att.to_dtype(DType::F32).unwrap().softmax(-1).unwrap().to_dtype(dtype).unwrap()
        };
        let y = att.matmul(&v).unwrap().transpose(1, 2).unwrap().reshape(&[bi, ti, ci]).unwrap();
        x = &x + &y.linear(&w_proj, None).unwrap();
    }
    x
}

/// The attention rule fires on GPT-2's attention as users write it: every step of it once per
/// layer, and the template is chosen, so a rule that stops matching fails here.
#[test]
fn gpt2_written_out_attention_is_chosen_by_the_egraph() {
    for (dtype, wide) in [(DType::F32, 0), (DType::BF16, 1), (DType::F16, 1)] {
        let layers = 2;
        let y = gpt2_attention(layers, 2, 8, 32, 2, dtype);
        let captured = coil::capture(&[&y]).graph;
        let (fused, r) = coil_passes::attention::fuse_attention_report(&captured);
        for (rule, times) in [
            ("attention-scores", 1),
            ("attention-scale", 1),
            ("attention-causal", 1),
            ("attention-f32-softmax", wide),
            ("attention", 1),
        ] {
            assert_eq!(r.fired(rule), times * layers, "{dtype} {rule}:\n{r}\n{captured}");
        }
        assert_eq!((r.chosen, r.refused), (layers, 0), "{dtype}:\n{r}");
        let count = |f: &dyn Fn(&Op) -> bool| fused.live_nodes().iter().filter(|&&n| f(&fused.node(n).op)).count();
        assert_eq!(count(&|op| matches!(op, Op::Attention { causal: true, mask: false, .. })), layers, "{fused}");
        assert_eq!(count(&|op| matches!(op, Op::Softmax { .. })), 0, "{fused}");
    }
}
