//! Structural tests of the decomposition table: every composite op decomposes into a graph
//! that passes `verify_primitive`, keeps the captured metas and inherits the user's line.
//! (Numbers are checked against PyTorch by the golden tests, which run the interpreter.)

use super::{decompose, decompose_with, DecomposeOptions};
use crate::test_graph::{here, m, Capture};
use coil_ir::{BinaryOp, DType, Graph, LossReduction, NodeId, Op, ReduceOp, Scalar, UnaryOp};

/// Decomposes and checks the contract: primitive, same input and output metas, locations
/// inherited, only live nodes, deterministic.
fn check(g: &Graph) -> Graph {
    let p = decompose(g).unwrap_or_else(|e| panic!("{e}\n{g}"));
    if let Err(e) = p.verify_primitive() {
        panic!("{e}\n{p}");
    }
    let metas = |g: &Graph, ids: &[NodeId]| ids.iter().map(|&i| g.meta(i).clone()).collect::<Vec<_>>();
    assert_eq!(metas(&p, &p.inputs), metas(g, &g.inputs), "input metas\n{p}");
    assert_eq!(metas(&p, &p.outputs), metas(g, &g.outputs), "output metas\n{p}");
    for (k, &id) in p.inputs.iter().enumerate() {
        assert_eq!(p.node(id).op, Op::Input { index: k });
    }
    for (i, node) in p.nodes.iter().enumerate() {
        if !matches!(node.op, Op::Input { .. }) {
            assert_eq!(node.location, Some(here()), "%{i} has no inherited location\n{p}");
        }
    }
    let live = p.live_nodes();
    for (i, node) in p.nodes.iter().enumerate() {
        assert!(matches!(node.op, Op::Input { .. }) || live.contains(&NodeId(i)), "%{i} is dead\n{p}");
    }
    assert_eq!(decompose(g).unwrap(), p, "not deterministic");
    p
}

/// Captures `op` applied to fresh inputs of the given metas, and checks its decomposition.
fn case(op: Op, inputs: &[(&[usize], DType)]) -> Graph {
    let mut c = Capture::new();
    let xs: Vec<NodeId> = inputs.iter().map(|(s, t)| c.input(s, *t)).collect();
    let y = c.op(op, &xs);
    check(&c.out(&[y]))
}

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.nodes.iter().filter(|n| pred(&n.op)).count()
}

fn snap(name: &str, g: &Graph) {
    insta::with_settings!({ snapshot_path => "../snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(name, g.to_string());
    });
}

const F32: DType = DType::F32;
const BF16: DType = DType::BF16;
const F16: DType = DType::F16;
const I64: DType = DType::I64;
const I32: DType = DType::I32;

// ---- snapshots ----

#[test]
fn softmax_snapshot() {
    snap("decompose_softmax", &case(Op::Softmax { dim: 1 }, &[(&[2, 5], F32)]));
}

#[test]
fn layer_norm_bf16_snapshot() {
    let op = Op::LayerNorm { ndim: 1, eps: 1e-5, weight: true, bias: true };
    let g = case(op, &[(&[2, 3, 4], BF16), (&[4], BF16), (&[4], BF16)]);
    snap("decompose_layer_norm_bf16", &g);
}

#[test]
fn gelu_tanh_snapshot() {
    snap("decompose_gelu_tanh", &case(Op::Gelu { tanh: true }, &[(&[2, 3], F32)]));
}

#[test]
fn cross_entropy_ignore_index_snapshot() {
    let op =
        Op::CrossEntropy { ignore_index: -100, reduction: LossReduction::Mean, label_smoothing: 0.0, weight: false };
    snap("decompose_cross_entropy_ignore_index", &case(op, &[(&[3, 5], F32), (&[3], I64)]));
}

#[test]
fn linear_bias_3d_snapshot() {
    let g = case(Op::Linear { bias: true }, &[(&[2, 3, 4], F32), (&[5, 4], F32), (&[5], F32)]);
    snap("decompose_linear_bias_3d", &g);
}

#[test]
fn attention_causal_snapshot() {
    let op = Op::Attention { causal: true, scale: None, mask: false, dropout: None };
    let g = case(op, &[(&[2, 3, 8], F32), (&[2, 4, 8], F32), (&[2, 4, 6], F32)]);
    snap("decompose_attention_causal", &g);
}

// ---- broadcasting and promotion ----

#[test]
fn broadcast_and_promote_with_scalar() {
    // (i32[4, 1] + f16[3]) * 2.5 -> f16[4, 3]; i32[4, 1] + 2.5 -> f32[4, 1]
    let mut c = Capture::new();
    let a = c.input(&[4, 1], I32);
    let b = c.input(&[3], F16);
    let s = c.scalar(2.5);
    let sum = c.op(Op::Binary(BinaryOp::Add), &[a, b]);
    let y = c.op(Op::Binary(BinaryOp::Mul), &[sum, s]);
    let z = c.op(Op::Binary(BinaryOp::Add), &[a, s]);
    let p = check(&c.out(&[y, z]));
    assert_eq!(p.meta(p.outputs[0]), &m(&[4, 3], F16));
    assert_eq!(p.meta(p.outputs[1]), &m(&[4, 1], F32));
    assert_eq!(
        p.to_string(),
        "\
graph(%0: i32[4, 1], %1: f16[3]) {
  %2: f16[4, 1] = cast(%0, dtype=f16)
  %3: f16[4, 3] = expand(%2, shape=[4, 3])
  %4: f16[4, 3] = expand(%1, shape=[4, 3])
  %5: f16[4, 3] = add(%3, %4)
  %6: f16[4, 3] = full(value=2.5)
  %7: f16[4, 3] = mul(%5, %6)
  %8: f32[4, 1] = cast(%0, dtype=f32)
  %9: f32[4, 1] = full(value=2.5)
  %10: f32[4, 1] = add(%8, %9)
  return (%7, %10)
}
"
    );
}

#[test]
fn zero_dim_tensor_is_weaker_than_dimensioned() {
    // f16[3] * f64[] -> f16 (a 0-d tensor does not widen within a category)
    let g = case(Op::Binary(BinaryOp::Mul), &[(&[3], F16), (&[], DType::F64)]);
    assert_eq!(count(&g, |o| matches!(o, Op::Cast(DType::F16))), 1);
}

#[test]
fn integer_division_and_float_only_unary_compute_in_f32() {
    let g = case(Op::Binary(BinaryOp::Div), &[(&[3], I32), (&[3], I32)]);
    assert_eq!(count(&g, |o| matches!(o, Op::Cast(F32))), 2);
    let g = case(Op::Unary(UnaryOp::Exp), &[(&[3], I64)]);
    assert_eq!(count(&g, |o| matches!(o, Op::Cast(F32))), 1);
    let g = case(Op::Binary(BinaryOp::Lt), &[(&[3], I32), (&[2, 1], F16)]);
    assert_eq!(count(&g, |o| matches!(o, Op::Cast(F16))), 1);
}

#[test]
fn primitives_pass_through_with_explicit_promotion() {
    // sum of i32 is i64; cumsum of bool is i64; cat casts every operand; where promotes.
    let g = case(Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[(&[2, 3], I32)]);
    assert_eq!(count(&g, |o| matches!(o, Op::Cast(I64))), 1);
    let g = case(Op::Cumsum { dim: 0 }, &[(&[4], DType::Bool)]);
    assert_eq!(count(&g, |o| matches!(o, Op::Cast(I64))), 1);
    let g = case(Op::Cat { dim: 0 }, &[(&[2], I32), (&[3], F16), (&[1], F16)]);
    assert_eq!(count(&g, |o| matches!(o, Op::Cast(_))), 1);
    case(Op::Where, &[(&[2, 1], DType::Bool), (&[3], I32), (&[2, 3], F32)]);
    case(Op::Reduce { op: ReduceOp::ArgMax, dims: vec![0], keepdim: true }, &[(&[4, 2], F16)]);
    case(Op::Reduce { op: ReduceOp::Max, dims: vec![], keepdim: false }, &[(&[], F32)]);
    case(Op::Bmm, &[(&[2, 3, 4], F32), (&[2, 4, 5], F32)]);
    case(Op::Gather { dim: 1 }, &[(&[2, 3], F32), (&[2, 2], I64)]);
    case(Op::IndexSelect { dim: 0 }, &[(&[4, 3], F32), (&[2], I32)]);
    case(Op::Scatter { dim: 0, reduce: Some(ReduceOp::Sum) }, &[(&[4, 3], F32), (&[2, 3], I64), (&[2, 3], F32)]);
    case(Op::Pad { pads: vec![(1, 0), (0, 2)], value: Scalar::Float(0.0) }, &[(&[2, 2], F32)]);
    case(Op::Slice { dim: 0, start: 3, len: 4, step: -1 }, &[(&[4], F32)]);
    case(Op::Permute { perm: vec![1, 0] }, &[(&[2, 3], F32)]);
    // no-ops emit nothing
    let g = case(Op::Slice { dim: 0, start: 0, len: 4, step: 1 }, &[(&[4], F32)]);
    assert_eq!(g.nodes.len(), 1);
    let g = case(Op::Reshape { shape: vec![2, 3] }, &[(&[2, 3], F32)]);
    assert_eq!(g.nodes.len(), 1);
}

#[test]
fn where_with_scalars_and_scalar_output() {
    let mut c = Capture::new();
    let cond = c.input(&[3], DType::Bool);
    let (one, zero) = (c.scalar(1.5), c.scalar(0i64));
    let y = c.op(Op::Where, &[cond, one, zero]);
    let two = c.scalar(2i64);
    let p = check(&c.out(&[y, two]));
    assert_eq!(p.meta(p.outputs[0]), &m(&[3], F32));
    assert_eq!(p.node(p.outputs[1]).op, Op::Full(Scalar::Int(2)));
}

#[test]
fn dead_nodes_are_skipped() {
    let mut c = Capture::new();
    let x = c.input(&[3], F32);
    let unused = c.input(&[2], F32);
    let _dead = c.op(Op::Softmax { dim: 0 }, &[x]);
    let _dead2 = c.op(Op::Relu, &[unused]);
    let y = c.op(Op::Unary(UnaryOp::Neg), &[x]);
    let p = check(&c.out(&[y]));
    assert_eq!(p.nodes.len(), 3, "{p}");
    assert_eq!(p.inputs.len(), 2);
}

#[test]
fn deterministic() {
    let build = || {
        let mut c = Capture::new();
        let x = c.input(&[2, 4, 8], BF16);
        let w = c.input(&[8], BF16);
        let n = c.op(Op::RmsNorm { ndim: 1, eps: None, weight: true }, &[x, w]);
        let a = c.op(Op::Attention { causal: true, scale: Some(0.5), mask: false, dropout: None }, &[n, n, n]);
        let g = c.op(Op::Gelu { tanh: false }, &[a]);
        c.out(&[g])
    };
    let (g1, g2) = (build(), build());
    assert_eq!(decompose(&g1).unwrap().to_string(), decompose(&g2).unwrap().to_string());
    assert_eq!(decompose(&g1).unwrap(), decompose(&g1).unwrap());
}

#[test]
fn errors_name_the_captured_op_and_line() {
    // the inf-norm of an empty vector has no identity, as in PyTorch
    let mut c = Capture::new();
    let x = c.input(&[0], F32);
    let y = c.op(Op::Norm { p: f64::INFINITY, dims: vec![0], keepdim: false }, &[x]);
    let e = decompose(&c.out(&[y])).unwrap_err();
    assert_eq!(e.op.as_deref(), Some("norm"));
    assert_eq!(e.location, Some(here()));
    assert_eq!(e.operands, vec!["f32[0]".to_string()]);
}

// ---- every composite op ----

#[test]
fn matmul_shapes() {
    for (a, b) in [
        (&[3][..], &[3][..]),
        (&[3], &[2, 3, 4]),
        (&[2, 3], &[3]),
        (&[2, 5, 3], &[3, 4]),
        (&[5, 3], &[2, 3, 4]),
        (&[2, 1, 5, 3], &[4, 3, 6]),
        (&[2, 3], &[3, 4]),
    ] {
        let g = case(Op::Matmul, &[(a, F32), (b, F32)]);
        assert_eq!(count(&g, |o| matches!(o, Op::Bmm)), 1);
    }
    // a batched operand times a matrix folds the batch into rows: no expand
    let g = case(Op::Matmul, &[(&[2, 5, 3], F32), (&[3, 4], F32)]);
    assert_eq!(count(&g, |o| matches!(o, Op::Expand { .. })), 0);
}

#[test]
fn linear_variants() {
    case(Op::Linear { bias: false }, &[(&[4], F32), (&[5, 4], F32)]);
    case(Op::Linear { bias: true }, &[(&[3, 4], BF16), (&[5, 4], BF16), (&[5], BF16)]);
}

#[test]
fn activations() {
    for t in [F32, BF16, F16, DType::F64] {
        case(Op::Gelu { tanh: false }, &[(&[2, 3], t)]);
        case(Op::Gelu { tanh: true }, &[(&[2, 3], t)]);
        case(Op::Silu, &[(&[2, 3], t)]);
        case(Op::Softplus { beta: 2.0, threshold: 20.0 }, &[(&[2, 3], t)]);
        case(Op::Relu, &[(&[2, 3], t)]);
    }
    case(Op::Relu, &[(&[2, 3], I32)]);
    // f16 gelu computes in f32 and rounds once
    let g = case(Op::Gelu { tanh: false }, &[(&[4], F16)]);
    assert_eq!(count(&g, |o| matches!(o, Op::Cast(_))), 2);
}

#[test]
fn clamp_promotes_with_its_bounds() {
    // as the frontend records it: x, then the bounds as scalar operands
    let mut c = Capture::new();
    let x = c.input(&[3], I32);
    let (lo, hi) = (c.scalar(0.5), c.scalar(6i64));
    let y = c.op(Op::Clamp { min: Some(Scalar::Float(0.5)), max: Some(Scalar::Int(6)) }, &[x, lo, hi]);
    let p = check(&c.out(&[y]));
    assert_eq!(p.meta(p.outputs[0]).dtype, F32);
    // only x as operand, one bound
    case(Op::Clamp { min: None, max: Some(Scalar::Int(6)) }, &[(&[2, 3], F16)]);
}

#[test]
fn nan_to_num() {
    for t in [F16, BF16, F32, DType::F64] {
        let g = case(Op::NanToNum { nan: 0.0, posinf: None, neginf: None }, &[(&[3], t)]);
        assert_eq!(count(&g, |o| matches!(o, Op::Where)), 3);
    }
    case(Op::NanToNum { nan: 1.0, posinf: Some(2.0), neginf: Some(-2.0) }, &[(&[3], F32)]);
    let g = case(Op::NanToNum { nan: 0.0, posinf: None, neginf: None }, &[(&[3], I32)]);
    assert_eq!(g.nodes.len(), 1);
}

#[test]
fn statistics() {
    for t in [F32, BF16] {
        case(Op::Mean { dims: vec![0, 2], keepdim: false }, &[(&[2, 3, 4], t)]);
        case(Op::Mean { dims: vec![1], keepdim: true }, &[(&[2, 3, 4], t)]);
        case(Op::Var { dims: vec![1], correction: 1.0, keepdim: false }, &[(&[2, 3], t)]);
        case(Op::Std { dims: vec![0, 1], correction: 0.0, keepdim: true }, &[(&[2, 3], t)]);
        case(Op::LogSumExp { dims: vec![1], keepdim: false }, &[(&[2, 3], t)]);
        case(Op::LogSumExp { dims: vec![0], keepdim: true }, &[(&[2, 3], t)]);
    }
    case(Op::Var { dims: vec![0], correction: 2.0, keepdim: false }, &[(&[1], F32)]);
    case(Op::LogSumExp { dims: vec![1], keepdim: false }, &[(&[2, 3], I32)]);
    let g = case(Op::LogSumExp { dims: vec![1], keepdim: false }, &[(&[2, 0], F32)]);
    assert_eq!(g.node(g.outputs[0]).op, Op::Full(Scalar::Float(f64::NEG_INFINITY)));
    case(Op::Mean { dims: vec![], keepdim: false }, &[(&[], F32)]);
}

#[test]
fn norms() {
    for p in [2.0, 1.0, f64::INFINITY, f64::NEG_INFINITY, 0.0, 3.0, 0.5] {
        case(Op::Norm { p, dims: vec![1], keepdim: false }, &[(&[2, 3], F32)]);
        case(Op::Norm { p, dims: vec![0, 1], keepdim: true }, &[(&[2, 3], F16)]);
    }
}

#[test]
fn any_all() {
    for t in [DType::Bool, I32, F32] {
        case(Op::Any { dims: vec![1], keepdim: false }, &[(&[2, 3], t)]);
        case(Op::All { dims: vec![0, 1], keepdim: true }, &[(&[2, 3], t)]);
        case(Op::All { dims: vec![1], keepdim: false }, &[(&[2, 0], t)]);
    }
}

#[test]
fn softmax_variants() {
    for t in [F32, F16, BF16, DType::F64] {
        case(Op::Softmax { dim: 0 }, &[(&[2, 5], t)]);
        case(Op::LogSoftmax { dim: 1 }, &[(&[2, 5], t)]);
    }
    case(Op::Softmax { dim: 0 }, &[(&[], F32)]);
    case(Op::LogSoftmax { dim: 0 }, &[(&[], F32)]);
    case(Op::Softmax { dim: 1 }, &[(&[2, 0], F32)]);
}

#[test]
fn norm_layers() {
    case(Op::LayerNorm { ndim: 2, eps: 1e-5, weight: false, bias: false }, &[(&[2, 3, 4], F32)]);
    case(Op::LayerNorm { ndim: 1, eps: 1e-5, weight: true, bias: false }, &[(&[3, 4], F16), (&[4], F16)]);
    case(Op::LayerNorm { ndim: 1, eps: 1e-5, weight: false, bias: true }, &[(&[3, 4], F32), (&[4], F32)]);
    case(Op::RmsNorm { ndim: 1, eps: Some(1e-6), weight: true }, &[(&[3, 4], BF16), (&[4], BF16)]);
    case(Op::RmsNorm { ndim: 2, eps: None, weight: false }, &[(&[3, 4], DType::F64)]);
    // default eps: the machine epsilon of the compute dtype, as PyTorch's kernel
    let g = case(Op::RmsNorm { ndim: 1, eps: None, weight: false }, &[(&[3, 4], BF16)]);
    let eps = Op::Full(Scalar::Float(f32::EPSILON as f64));
    assert_eq!(count(&g, |o| *o == eps), 1, "{g}");
}

#[test]
fn tril_triu() {
    for k in [-1, 0, 2] {
        case(Op::Tril { k }, &[(&[2, 3, 4], F32)]);
        case(Op::Triu { k }, &[(&[3, 4], DType::Bool)]);
        case(Op::Triu { k }, &[(&[3, 4], I32)]);
    }
    let g = case(Op::Tril { k: 0 }, &[(&[3, 4], F32)]);
    assert_eq!(count(&g, |o| matches!(o, Op::Iota { .. })), 2);
}

#[test]
fn dropout() {
    let g = case(Op::Dropout { p: 0.25, stream: 1, offset: 3 }, &[(&[4, 5], BF16)]);
    assert_eq!(count(&g, |o| *o == Op::Rand { dist: coil_ir::RandDist::Uniform, stream: 1, offset: 3 }), 1);
    let g = case(Op::Dropout { p: 0.0, stream: 0, offset: 3 }, &[(&[4, 5], F32)]);
    assert_eq!(g.nodes.len(), 1);
    let g = case(Op::Dropout { p: 1.0, stream: 0, offset: 3 }, &[(&[4, 5], F32)]);
    assert_eq!(g.node(g.outputs[0]).op, Op::Full(Scalar::Float(0.0)));
}

#[test]
fn embedding() {
    case(Op::Embedding, &[(&[10, 4], F32), (&[2, 3], I64)]);
    case(Op::Embedding, &[(&[10, 4], BF16), (&[3], I32)]);
    case(Op::Embedding, &[(&[10, 4], F32), (&[], I64)]);
}

#[test]
fn cross_entropy_variants() {
    for reduction in [LossReduction::None, LossReduction::Sum, LossReduction::Mean] {
        for smoothing in [0.0, 0.1] {
            let op = Op::CrossEntropy { ignore_index: 1, reduction, label_smoothing: smoothing, weight: false };
            case(op.clone(), &[(&[4, 5], F32), (&[4], I64)]);
            case(op.clone(), &[(&[4, 5], BF16), (&[4], I32)]);
            case(op, &[(&[5], F32), (&[], I64)]);
        }
    }
}

#[test]
fn mse_loss() {
    for reduction in [LossReduction::None, LossReduction::Sum, LossReduction::Mean] {
        case(Op::MseLoss { reduction }, &[(&[2, 3], F32), (&[3], F32)]);
        case(Op::MseLoss { reduction }, &[(&[2, 3], BF16), (&[2, 3], BF16)]);
        case(Op::MseLoss { reduction }, &[(&[3], F16), (&[3], F32)]);
        case(Op::MseLoss { reduction }, &[(&[], F32), (&[], F32)]);
    }
}

#[test]
fn attention_variants() {
    let (q, k, v) = (&[2, 2, 3, 8][..], &[2, 1, 5, 8][..], &[2, 1, 5, 4][..]);
    case(Op::Attention { causal: false, scale: None, mask: false, dropout: None }, &[(q, F32), (k, F32), (v, F32)]);
    case(
        Op::Attention { causal: false, scale: Some(0.1), mask: true, dropout: None },
        &[(q, F32), (k, F32), (v, F32), (&[3, 5], DType::Bool)],
    );
    case(
        Op::Attention { causal: true, scale: None, mask: true, dropout: None },
        &[(q, BF16), (k, BF16), (v, BF16), (&[2, 1, 3, 5], BF16)],
    );
    case(
        Op::Attention { causal: true, scale: None, mask: false, dropout: None },
        &[(&[3, 8], F16), (&[5, 8], F16), (&[5, 8], F16)],
    );
}

#[test]
fn half_attention_takes_its_products_in_its_dtype_only_when_asked() {
    let mut c = Capture::new();
    let q = c.input(&[2, 4, 8], BF16);
    let y = c.op(Op::Attention { causal: true, scale: None, mask: false, dropout: None }, &[q, q, q]);
    let g = c.out(&[y]);
    let bmm_dtypes = |options: &DecomposeOptions| -> Vec<DType> {
        let p = decompose_with(&g, options).unwrap();
        p.nodes.iter().filter(|n| n.op == Op::Bmm).map(|n| n.meta.dtype).collect()
    };
    let reference =
        DecomposeOptions { fused_attention: false, keep_detach: false, half_products: false, conv_template: false };
    assert_eq!(bmm_dtypes(&reference), vec![F32, F32]);
    assert_eq!(bmm_dtypes(&DecomposeOptions { half_products: true, ..reference }), vec![BF16, BF16]);
}
