//! Unit tests of the pieces (value soundness on random data is in the workspace's
//! `tests/rewrite.rs`, which can run the reference interpreter).

use super::cost::{self, CostModel};
use super::lang::{fold, ENode, Facts, Konst, Ordered, Prim, EG};
use super::region;
use super::rules::{lossless, may_fire};
use super::{simplify, RewriteOptions};
use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, Scalar, TensorMeta, UnaryOp};

fn input(g: &mut Graph, shape: &[usize]) -> coil_ir::NodeId {
    g.input(TensorMeta::new(shape.to_vec(), DType::F32))
}

#[test]
fn lossless_casts_never_narrow() {
    assert!(lossless(DType::F16, DType::F32) && lossless(DType::BF16, DType::F64));
    assert!(lossless(DType::I16, DType::F32) && lossless(DType::Bool, DType::F16));
    assert!(!lossless(DType::F32, DType::F16) && !lossless(DType::F16, DType::BF16));
    assert!(!lossless(DType::I32, DType::F32) && !lossless(DType::I64, DType::F64));
}

#[test]
fn folding_rounds_like_the_interpreter() {
    let add = Prim::Binary(Ordered(BinaryOp::Add));
    // 0.1 + 0.2 in f32 is the f32 nearest to the f64 sum, not the f64 sum.
    let (a, b) =
        (Konst::of(Scalar::Float(0.1), DType::F32).unwrap(), Konst::of(Scalar::Float(0.2), DType::F32).unwrap());
    let Some(Konst::F(sum)) = fold(&add, &[a, b], DType::F32) else { panic!() };
    assert_eq!(sum, (0.1f32 + 0.2f32) as f64);
    // Integers wrap to their width.
    let Some(Konst::I(w)) = fold(&add, &[Konst::I(127), Konst::I(1)], DType::I8) else { panic!() };
    assert_eq!(w, -128);
    // A tie of zeros gives the first operand (as the kernels do); transcendental functions are
    // left to run.
    let (max, min) = (Prim::Binary(Ordered(BinaryOp::Maximum)), Prim::Binary(Ordered(BinaryOp::Minimum)));
    for (op, a, b) in [(&max, -0.0, 0.0), (&max, 0.0, -0.0), (&min, 0.0, -0.0), (&min, -0.0, 0.0)] {
        let Some(Konst::F(r)) = fold(op, &[Konst::F(a), Konst::F(b)], DType::F32) else { panic!() };
        assert_eq!(r.to_bits(), a.to_bits(), "{op:?}({a}, {b})");
    }
    assert!(fold(&Prim::Unary(Ordered(UnaryOp::Exp)), &[Konst::F(1.0)], DType::F32).is_none());
    // NaN to an integer is not folded (C leaves it undefined).
    assert!(Konst::F(f64::NAN).cast(DType::I32).is_none());
}

#[test]
fn cse_keeps_negative_zero_apart() {
    let g = Graph::parse(
        "graph(%0: f32[4]) {
           %1: f32[4] = full(value=-0.0)
           %2: f32[4] = full(value=0.0)
           %3 = exp(%0)
           %4 = exp(%0)
           %5 = mul(%3, %1)
           %6 = mul(%4, %2)
           return (%5, %6)
         }",
    )
    .unwrap();
    let dd = region::cse(&g, &g.live_nodes()).unwrap();
    assert_eq!(dd.merged, 1, "the two exps, not the two zeros");
    assert_eq!(dd.of(NodeId(4)), NodeId(3));
}

#[test]
fn triggers_are_cheap_and_specific() {
    let g = Graph::parse(
        "graph(%0: f32[4, 4]) {
           %1 = permute(%0, perm=[1, 0])
           %2 = permute(%1, perm=[1, 0])
           %3 = mul(%0, %0)
           return (%2, %3)
         }",
    )
    .unwrap();
    let rep: Vec<usize> = (0..g.nodes.len()).collect();
    assert!(may_fire(&g, NodeId(2), &rep));
    assert!(!may_fire(&g, NodeId(1), &rep) && !may_fire(&g, NodeId(3), &rep), "x * x is not an identity");
}

#[test]
fn extraction_counts_a_shared_node_once() {
    // Root = add(e, e) with e = exp(exp(x)), or add(neg(x), sin(sin(x))). As trees the first
    // costs 4 pointwise ops and the second 3; as a DAG the first costs 2 and the second 3.
    let mut eg = EG::new(Facts::default());
    let leaf = Prim::Input { index: 0, shape: vec![1024], dtype: DType::F32 };
    let x = eg.add(ENode::new(leaf, vec![]));
    let un = |eg: &mut EG, u: UnaryOp, a| eg.add(ENode::new(Prim::Unary(Ordered(u)), vec![a]));
    let add = Prim::Binary(Ordered(BinaryOp::Add));
    let e1 = un(&mut eg, UnaryOp::Exp, x);
    let e2 = un(&mut eg, UnaryOp::Exp, e1);
    let shared = eg.add(ENode::new(add.clone(), vec![e2, e2]));
    let f = un(&mut eg, UnaryOp::Neg, x);
    let g1 = un(&mut eg, UnaryOp::Sin, x);
    let g2 = un(&mut eg, UnaryOp::Sin, g1);
    let other = eg.add(ENode::new(add, vec![f, g2]));
    eg.union(shared, other);
    eg.rebuild();
    let root = eg.find(shared);
    let chosen = cost::extract(&eg, &[root], &[root], &CostModel::default()).unwrap();
    assert_eq!(chosen[&root].args, vec![eg.find(e2), eg.find(e2)]);
    assert_eq!(chosen.len(), 4, "x, exp, exp, add");
}

#[test]
fn long_matrix_chains_stay_bounded() {
    // A chain of 12 products: reassociation could build Catalan-many trees; the node limit binds.
    let mut g = Graph::new();
    let mut y = input(&mut g, &[8, 8]);
    for _ in 0..12 {
        let w = input(&mut g, &[8, 8]);
        y = g.push(Op::Bmm, &[y, w], None).unwrap();
    }
    g.outputs.push(y);
    let options = RewriteOptions { node_limit: 400, ..RewriteOptions::default() };
    let (out, report) = simplify(&g, &options).unwrap();
    out.verify_primitive().unwrap();
    assert!(report.egraph_nodes <= 400 + 200, "{report}");
    assert!(report.stages.iter().any(|s| s.stop_reason.starts_with("node limit")), "{report}");
    assert!(report.cost_after.flops <= report.cost_before.flops);
}

#[test]
fn nothing_to_do_returns_the_graph_unchanged() {
    let mut g = Graph::new();
    let x = input(&mut g, &[4]);
    let e = g.push(Op::Unary(UnaryOp::Exp), &[x], None).unwrap();
    g.outputs.push(e);
    let (out, report) = simplify(&g, &RewriteOptions::default()).unwrap();
    assert_eq!(out, g);
    assert!(!report.accepted && report.stages.is_empty());
    assert!(report.to_string().contains("rules fired:\n  (none)"), "{report}");
}
