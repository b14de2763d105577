use super::*;
use crate::dtype::Scalar;
use crate::op::{
    AttentionDropout, AttentionInput, BinaryOp, ConvForm, ConvGeometry, LossReduction, RandDist, ReduceOp, UnaryOp,
};

/// The op of a printed node line, parsed as the graph parser parses one.
fn parse_op(line: &str) -> std::result::Result<Op, String> {
    let tokens = lex::lex(line).map_err(|(_, m)| m)?;
    let mut parser = Parser { tokens, at: 0 };
    let (_, s) = parser.statement().map_err(|(_, m)| m)?;
    op::build(&s.op, s.op_pos, s.attrs).map_err(|(_, m)| m)
}

/// Which variant of [`Op`] `op` is. No wildcard arm: a new variant does not compile until it
/// has a number here, and then [`every_op_variant_round_trips`] fails until [`examples`] has
/// one of it (which the parser must read back).
fn variant(op: &Op) -> usize {
    match op {
        Op::Input { .. } => 0,
        Op::Scalar(_) => 1,
        Op::Full(_) => 2,
        Op::Iota { .. } => 3,
        Op::Rand { .. } => 4,
        Op::Unary(_) => 5,
        Op::Binary(_) => 6,
        Op::Where => 7,
        Op::Cast(_) => 8,
        Op::Reduce { .. } => 9,
        Op::Cumsum { .. } => 10,
        Op::Argsort { .. } => 11,
        Op::Reshape { .. } => 12,
        Op::Permute { .. } => 13,
        Op::Expand { .. } => 14,
        Op::Slice { .. } => 15,
        Op::Pad { .. } => 16,
        Op::Cat { .. } => 17,
        Op::Gather { .. } => 18,
        Op::IndexSelect { .. } => 19,
        Op::Scatter { .. } => 20,
        Op::Bmm => 21,
        Op::Matmul => 22,
        Op::Linear { .. } => 23,
        Op::Relu => 24,
        Op::Detach => 25,
        Op::Gelu { .. } => 26,
        Op::Silu => 27,
        Op::Softplus { .. } => 28,
        Op::Clamp { .. } => 29,
        Op::NanToNum { .. } => 30,
        Op::Mean { .. } => 31,
        Op::Var { .. } => 32,
        Op::Std { .. } => 33,
        Op::LogSumExp { .. } => 34,
        Op::Norm { .. } => 35,
        Op::Any { .. } => 36,
        Op::All { .. } => 37,
        Op::Softmax { .. } => 38,
        Op::LogSoftmax { .. } => 39,
        Op::LayerNorm { .. } => 40,
        Op::RmsNorm { .. } => 41,
        Op::Tril { .. } => 42,
        Op::Triu { .. } => 43,
        Op::Dropout { .. } => 44,
        Op::Embedding => 45,
        Op::CrossEntropy { .. } => 46,
        Op::MseLoss { .. } => 47,
        Op::Attention { .. } => 48,
        Op::AttentionLogsumexp { .. } => 49,
        Op::AttentionBackward { .. } => 50,
        Op::Conv { .. } => 51,
    }
}
const VARIANTS: usize = 52;

/// At least one op of every variant (but `Input`, which the header declares), with attribute
/// values that print in every form (negative, fractional, tiny, infinite, NaN, `none`).
fn examples() -> Vec<Op> {
    let geometry = ConvGeometry { stride: vec![2, 1], padding: vec![1, 0], dilation: vec![1, 2], groups: 3 };
    let mut ops = vec![
        Op::Scalar(Scalar::Float(2.5)),
        Op::Scalar(Scalar::Int(-3)),
        Op::Full(Scalar::Float(-0.0)),
        Op::Full(Scalar::Float(f64::NEG_INFINITY)),
        Op::Full(Scalar::Float(f64::NAN)),
        Op::Full(Scalar::Float(1e-30)),
        Op::Full(Scalar::Float(1e20)),
        Op::Full(Scalar::Bool(true)),
        Op::Full(Scalar::Int(i64::MIN)),
        Op::Iota { dim: 1 },
        Op::Rand { dist: RandDist::Uniform, stream: 2, offset: u64::MAX },
        Op::Rand { dist: RandDist::Normal, stream: 0, offset: 48 },
        Op::Where,
        Op::Cast(DType::BF16),
        Op::Cumsum { dim: 2 },
        Op::Argsort { dim: 0, descending: true },
        Op::Reshape { shape: vec![] },
        Op::Reshape { shape: vec![6, 1] },
        Op::Permute { perm: vec![2, 0, 1] },
        Op::Expand { shape: vec![4, 3] },
        Op::Slice { dim: 1, start: 5, len: 3, step: -2 },
        Op::Pad { pads: vec![(1, 2), (0, 0)], value: Scalar::Float(-1.5) },
        Op::Pad { pads: vec![], value: Scalar::Int(7) },
        Op::Cat { dim: 1 },
        Op::Gather { dim: 0 },
        Op::IndexSelect { dim: 2 },
        Op::Scatter { dim: 1, reduce: None },
        Op::Bmm,
        Op::Matmul,
        Op::Linear { bias: true },
        Op::Relu,
        Op::Detach,
        Op::Gelu { tanh: true },
        Op::Gelu { tanh: false },
        Op::Silu,
        Op::Softplus { beta: 2.0, threshold: 20.0 },
        Op::Clamp { min: Some(Scalar::Int(0)), max: None },
        Op::Clamp { min: None, max: Some(Scalar::Float(6.0)) },
        Op::NanToNum { nan: 0.0, posinf: None, neginf: Some(-1e30) },
        Op::Mean { dims: vec![0, 2], keepdim: true },
        Op::Var { dims: vec![1], correction: 1.0, keepdim: false },
        Op::Std { dims: vec![], correction: 0.5, keepdim: true },
        Op::LogSumExp { dims: vec![1], keepdim: false },
        Op::Norm { p: f64::INFINITY, dims: vec![0], keepdim: false },
        Op::Any { dims: vec![0], keepdim: true },
        Op::All { dims: vec![1], keepdim: false },
        Op::Softmax { dim: 1 },
        Op::LogSoftmax { dim: 0 },
        Op::LayerNorm { ndim: 2, eps: 1e-5, weight: true, bias: false },
        Op::RmsNorm { ndim: 1, eps: None, weight: true },
        Op::RmsNorm { ndim: 1, eps: Some(1e-6), weight: false },
        Op::Tril { k: -1 },
        Op::Triu { k: 2 },
        Op::Dropout { p: 0.1, stream: 1, offset: 1024 },
        Op::Embedding,
        Op::CrossEntropy { ignore_index: -100, reduction: LossReduction::Mean, label_smoothing: 0.1, weight: true },
        Op::MseLoss { reduction: LossReduction::None },
        Op::MseLoss { reduction: LossReduction::Sum },
        Op::Attention { causal: true, scale: None, mask: false, dropout: None },
        Op::Attention { causal: false, scale: Some(0.125), mask: true, dropout: None },
        Op::Attention {
            causal: true,
            scale: None,
            mask: false,
            dropout: Some(AttentionDropout { p: 0.1, stream: 1, offset: 4096 }),
        },
        Op::AttentionLogsumexp { causal: true, scale: Some(0.5), mask: false },
        Op::AttentionLogsumexp { causal: false, scale: None, mask: true },
        Op::Conv { geometry: geometry.clone(), form: ConvForm::Forward },
        Op::Conv { geometry: geometry.clone(), form: ConvForm::BackwardData { size: vec![7, 8] } },
        Op::Conv { geometry, form: ConvForm::BackwardWeight { kernel: vec![3, 3] } },
    ];
    ops.extend(UnaryOp::ALL.map(Op::Unary));
    ops.extend(BinaryOp::ALL.map(Op::Binary));
    for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::ArgMax, ReduceOp::ArgMin] {
        ops.push(Op::Reduce { op, dims: vec![1], keepdim: op == ReduceOp::Sum });
    }
    for reduce in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
        ops.push(Op::Scatter { dim: 0, reduce: Some(reduce) });
    }
    for input in AttentionInput::ALL {
        ops.push(Op::AttentionBackward { causal: false, scale: None, input, mask: false, dropout: None });
        ops.push(Op::AttentionBackward { causal: true, scale: Some(0.25), input, mask: true, dropout: None });
        let dropout = Some(AttentionDropout { p: 0.5, stream: 0, offset: 7 });
        ops.push(Op::AttentionBackward { causal: true, scale: Some(0.25), input, mask: false, dropout });
    }
    ops
}

#[test]
fn every_op_variant_round_trips() {
    let ops = examples();
    let mut seen = [false; VARIANTS];
    seen[variant(&Op::Input { index: 0 })] = true; // declared by the header: see the graph tests
    for op in &ops {
        seen[variant(op)] = true;
        let operands = if op.is_leaf() { "" } else { "%0, " };
        let attrs = op.attributes();
        let line = format!("%1: f32[] = {}({operands}{attrs})", op.name());
        let line = line.replace(", )", ")");
        let parsed = parse_op(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(&parsed, op, "{line}");
    }
    let missing: Vec<usize> = (0..VARIANTS).filter(|&v| !seen[v]).collect();
    assert!(missing.is_empty(), "Op variants {missing:?} (numbered in `variant`) have no example");
}

#[test]
fn input_nodes_are_declared_in_the_header() {
    let e = parse_op("%1: f32[] = input(index=0)").unwrap_err();
    assert!(e.contains("declared in the header"), "{e}");
}

/// A graph with every kind of node the text must carry: inputs declared after other nodes and
/// not in label order, leaves, a scalar operand, a dead node, several outputs.
fn sample() -> Graph {
    let mut g = Graph::new();
    let c = g.full(Scalar::Float(0.5), vec![], DType::F32, None);
    let x = g.input(TensorMeta::new(vec![2, 3], DType::F32));
    let i = g.leaf(Op::Iota { dim: 1 }, TensorMeta::new(vec![2, 3], DType::I64), None);
    let y = g.input(TensorMeta::new(vec![3], DType::BF16));
    let s = g.leaf(Op::Scalar(Scalar::Int(2)), TensorMeta::new(vec![], DType::I64), None);
    let e = g.push(Op::Unary(UnaryOp::Exp), &[x], None).unwrap();
    let _dead = g.push(Op::Binary(BinaryOp::Mul), &[x, s], None).unwrap();
    let m = g.push(Op::Reduce { op: ReduceOp::Max, dims: vec![1], keepdim: true }, &[e], None).unwrap();
    let sum = g.push(Op::Binary(BinaryOp::Add), &[e, y], None).unwrap();
    let lt = g.push(Op::Binary(BinaryOp::Lt), &[i, s], None).unwrap();
    let w = g.push(Op::Where, &[lt, sum, c], None).unwrap();
    g.outputs = vec![w, m, x];
    g
}

#[test]
fn printed_graphs_parse_to_the_same_graph() {
    let g = sample();
    let text = g.to_string();
    let parsed = Graph::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(parsed, g);
    assert_eq!(parsed.to_string(), text);
    assert_eq!(text.parse::<Graph>().unwrap(), g);
}

#[test]
#[track_caller]
fn locations_are_comments() {
    let mut g = sample();
    let here = std::panic::Location::caller();
    for node in &mut g.nodes {
        node.location = Some(here);
    }
    let text = g.print(true);
    assert!(text.contains("# "), "{text}");
    assert_eq!(Graph::parse(&text).unwrap().to_string(), g.to_string());
}

#[test]
fn labels_may_have_gaps_and_any_line_order() {
    let g = Graph::parse(
        "; a hand-written graph\n\
         graph(%10: f32[4], %20: f32[4]) {\n\
           %40 = mul(%30, %20)\n\
           %30 = add(%10, %20)  # sums\n\
           return (%40)\n\
         }",
    )
    .unwrap();
    assert_eq!(
        g.to_string(),
        "graph(%0: f32[4], %1: f32[4]) {\n  %2: f32[4] = add(%0, %1)\n  %3: f32[4] = mul(%2, %1)\n  return (%3)\n}\n"
    );
}

/// The error `text` gives: its message must contain `want`.
#[track_caller]
fn fails(text: &str, want: &str) {
    let e = Graph::parse(text).expect_err(text).to_string();
    assert!(e.contains(want), "expected `{want}` in:\n{e}");
}

#[test]
fn errors_name_line_column_and_what_was_expected() {
    let head = "graph(%0: f32[2, 3]) {\n";
    fails(&format!("{head}  %1 = frobnicate(%0)\n  return (%1)\n}}"), "2:8: unknown op `frobnicate`");
    fails(&format!("{head}  %1 = amax(%0, dims=[1])\n  return (%1)\n}}"), "2:8: `amax` needs the attribute `keepdim=`");
    fails(&format!("{head}  %1 = exp(%0, fast=true)\n  return (%1)\n}}"), "2:16: `exp` has no attribute `fast`");
    fails(
        &format!("{head}  %1 = cumsum(%0, dim=-1)\n  return (%1)\n}}"),
        "2:23: attribute `dim` of `cumsum` must be a non-negative integer, found `-1`",
    );
    fails(&format!("{head}  %1 = exp(%5)\n  return (%1)\n}}"), "2:12: `%5` is not defined");
    fails(
        &format!("{head}  %1 = exp(%2)\n  %2 = exp(%0)\n  return (%1)\n}}"),
        "2:12: `%2` is an operand of `%1`, so its label must be smaller",
    );
    fails(
        &format!("{head}  %1: f32[3, 2] = exp(%0)\n  return (%1)\n}}"),
        "2:7: the meta is f32[3, 2], but `exp` gives f32[2, 3]",
    );
    fails(&format!("{head}  %0 = exp(%0)\n  return (%0)\n}}"), "2:3: `%0` is defined twice");
    fails(&format!("{head}  %1 = full(value=1.0)\n  return (%1)\n}}"), "2:3: a `full` node needs its meta");
    fails(
        &format!("{head}  %1: f33[2] = exp(%0)\n  return (%1)\n}}"),
        "2:7: expected a dtype (f32, bf16, i64, bool, ...), found `f33`",
    );
    fails(&format!("{head}  %1 = exp(%0\n  return (%1)\n}}"), "3:3: expected `,` or `)`, found `return`");
    fails(&format!("{head}  return (%1)\n}}"), "2:11: output `%1` is not defined");
    fails(&format!("{head}  return (%0)\n}}\nextra"), "4:1: expected the end of the text after the graph");
    fails("graph(%0: f32[2]) {\n  %1 = mm(%0, %0)\n  return (%1)\n}", "unknown op `mm`");
    // Inference errors keep their kind and point at the op.
    let e = Graph::parse("graph(%0: f32[2], %1: f32[3]) {\n  %2 = add(%0, %1)\n  return (%2)\n}").unwrap_err();
    assert_eq!(e.kind, crate::ErrorKind::Shape);
    assert!(e.to_string().contains("2:8: shape error in add"), "{e}");
    // The error shows the line and a caret under the column.
    let e = Graph::parse(&format!("{head}  %1 = frobnicate(%0)\n  return (%1)\n}}")).unwrap_err().to_string();
    assert!(e.ends_with("  %1 = frobnicate(%0)\n         ^"), "{e}");
}
