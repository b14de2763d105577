//! The structured-mask matcher: Llama's KV-cache mask (captured, decomposed, rewritten and
//! lowered), the forms that mean the same rule, and near misses that must stay explicit masks.

use super::*;
use crate::test_graph::Capture;
use crate::{decompose_with, lower, simplify, DecomposeOptions, RewriteOptions};
use coil_ir::loops::{ExternCall, LoopKind};
use coil_ir::{DType, Graph, NodeId};

/// How the test mask is written: `keys <op> rows`, rows `iota(rep * t) % period + pos + shift`.
#[derive(Clone, Copy)]
struct Form {
    /// The comparison, keys first.
    op: BinaryOp,
    /// `remainder`'s divisor (`None`: no remainder).
    period: Option<i64>,
    /// Added to the rows (`None`: no addition).
    shift: Option<i64>,
    /// The run-time position is added to the rows.
    pos: bool,
    /// The keys' iota is of i32 (cast to i64 by the comparison's promotion).
    keys_i32: bool,
}

const LLAMA: Form = Form { op: BinaryOp::Le, period: Some(12), shift: None, pos: true, keys_i32: false };

/// Llama's prefill mask as `forward_cached` records it (rep 4, T 12, a cache of 40): the mask
/// node, the position input, and the graph under construction.
fn llama_mask(c: &mut Capture, form: Form) -> (NodeId, NodeId) {
    let (rows, cap) = (48, 40);
    let pos = c.input(&[], DType::I64);
    let keys = c.g.leaf(Op::Iota { dim: 1 }, crate::test_graph::m(&[1, cap], DType::I64), None);
    let keys = if form.keys_i32 {
        let k = c.g.leaf(Op::Iota { dim: 1 }, crate::test_graph::m(&[1, cap], DType::I32), None);
        c.op(Op::Cast(DType::I64), &[k])
    } else {
        keys
    };
    let mut r = c.g.leaf(Op::Iota { dim: 0 }, crate::test_graph::m(&[rows], DType::I64), None);
    if let Some(p) = form.period {
        let p = c.scalar(p);
        r = c.op(Op::Binary(BinaryOp::Remainder), &[r, p]);
    }
    if form.pos {
        r = c.op(Op::Binary(BinaryOp::Add), &[r, pos]);
    }
    if let Some(k) = form.shift {
        let k = c.scalar(k);
        r = c.op(Op::Binary(BinaryOp::Add), &[r, k]);
    }
    let r = c.op(Op::Reshape { shape: vec![rows, 1] }, &[r]);
    (c.op(Op::Binary(form.op), &[keys, r]), pos)
}

fn rule_of(form: Form) -> Option<StructuredMask> {
    let mut c = Capture::new();
    let (mask, _) = llama_mask(&mut c, form);
    structured_mask(&c.g, mask)
}

/// The mask's rule with the position input as its offset.
fn with_pos(constant: i64, period: Option<usize>) -> Option<StructuredMask> {
    Some(StructuredMask { offset: Some(NodeId(0)), constant, period })
}

#[test]
fn llamas_kv_cache_mask_is_a_rule_and_comparisons_are_exact() {
    assert_eq!(rule_of(LLAMA), with_pos(0, Some(12)));
    // `keys < rows` keeps one key less; `keys <= rows + 3` three more.
    assert_eq!(rule_of(Form { op: BinaryOp::Lt, ..LLAMA }), with_pos(-1, Some(12)));
    assert_eq!(rule_of(Form { shift: Some(3), ..LLAMA }), with_pos(3, Some(12)));
    // Another period is that period (one of the rows too); no position: a constant.
    assert_eq!(rule_of(Form { period: Some(5), ..LLAMA }), with_pos(0, Some(5)));
    assert_eq!(rule_of(Form { period: Some(48), ..LLAMA }), with_pos(0, Some(48)));
    assert_eq!(rule_of(Form { period: Some(1), ..LLAMA }), with_pos(0, Some(1)));
    let causal = Form { period: None, pos: false, ..LLAMA };
    assert_eq!(rule_of(causal), Some(StructuredMask { offset: None, constant: 0, period: None }));
    // An i32 iota widened by promotion.
    assert_eq!(rule_of(Form { keys_i32: true, ..LLAMA }), with_pos(0, Some(12)));
    // `keys >= rows` and `keys > rows` keep the other side of the diagonal.
    assert_eq!(rule_of(Form { op: BinaryOp::Ge, ..LLAMA }), None);
    assert_eq!(rule_of(Form { op: BinaryOp::Gt, ..LLAMA }), None);
}

#[test]
fn the_same_rule_written_otherwise_matches() {
    // `rows >= keys`, and `!(keys > rows)`, are `keys <= rows`.
    let mut c = Capture::new();
    let (mask, _) = llama_mask(&mut c, Form { op: BinaryOp::Gt, ..LLAMA });
    let not = c.op(Op::Unary(UnaryOp::LogicalNot), &[mask]);
    assert_eq!(structured_mask(&c.g, not), with_pos(0, Some(12)));
    let mut c = Capture::new();
    let (lt, _) = llama_mask(&mut c, Form { op: BinaryOp::Lt, ..LLAMA });
    let node = c.g.node(lt).clone();
    let swapped = c.op(Op::Binary(BinaryOp::Gt), &[node.inputs[1], node.inputs[0]]);
    assert_eq!(structured_mask(&c.g, swapped), with_pos(-1, Some(12)));
    // Views that keep the rows and keys: broadcast over batch and heads, a transpose back.
    let mut c = Capture::new();
    let (mask, _) = llama_mask(&mut c, LLAMA);
    let wide = c.op(Op::Expand { shape: vec![2, 3, 48, 40] }, &[mask]);
    assert_eq!(structured_mask(&c.g, wide), with_pos(0, Some(12)));
    let t = c.permute(mask, &[1, 0]);
    let back = c.permute(t, &[1, 0]);
    assert_eq!(structured_mask(&c.g, back), with_pos(0, Some(12)));
    // ... but not a transposed mask, nor a window that starts past row 0 of a period.
    assert_eq!(structured_mask(&c.g, t), None);
    let late = c.op(Op::Slice { dim: 0, start: 1, len: 40, step: 1 }, &[mask]);
    assert_eq!(structured_mask(&c.g, late), None);
    let first = c.op(Op::Slice { dim: 1, start: 0, len: 30, step: 1 }, &[mask]);
    assert_eq!(structured_mask(&c.g, first), with_pos(0, Some(12)));
}

#[test]
fn near_misses_stay_explicit_masks() {
    let none = |build: &dyn Fn(&mut Capture, NodeId, NodeId, NodeId) -> NodeId| {
        let mut c = Capture::new();
        let (mask, pos) = llama_mask(&mut c, LLAMA);
        let node = c.g.node(mask).clone();
        let m = build(&mut c, node.inputs[0], node.inputs[1], pos);
        let g: &Graph = &c.g;
        assert_eq!(structured_mask(g, m), None, "{g}");
    };
    // The position on the keys' side (on both it cancels: a rule); twice; the keys doubled;
    // the rows' remainder shifted.
    none(&|c, keys, _, pos| {
        let k = c.op(Op::Binary(BinaryOp::Add), &[keys, pos]);
        let r = c.g.leaf(Op::Iota { dim: 0 }, crate::test_graph::m(&[48, 1], DType::I64), None);
        c.op(Op::Binary(BinaryOp::Le), &[k, r])
    });
    none(&|c, keys, rows, pos| {
        let r = c.op(Op::Binary(BinaryOp::Add), &[rows, pos]);
        c.op(Op::Binary(BinaryOp::Le), &[keys, r])
    });
    none(&|c, keys, rows, _| {
        let k = c.op(Op::Binary(BinaryOp::Add), &[keys, keys]);
        c.op(Op::Binary(BinaryOp::Le), &[k, rows])
    });
    none(&|c, keys, _, pos| {
        let one = c.scalar(1i64);
        let r = c.g.leaf(Op::Iota { dim: 0 }, crate::test_graph::m(&[48], DType::I64), None);
        let r = c.op(Op::Binary(BinaryOp::Add), &[r, one]);
        let twelve = c.scalar(12i64);
        let r = c.op(Op::Binary(BinaryOp::Remainder), &[r, twelve]);
        let r = c.op(Op::Binary(BinaryOp::Add), &[r, pos]);
        let r = c.op(Op::Reshape { shape: vec![48, 1] }, &[r]);
        c.op(Op::Binary(BinaryOp::Le), &[keys, r])
    });
    // An extra term: a batch dim's index; a mask combined with another.
    none(&|c, keys, rows, _| {
        let b = c.g.leaf(Op::Iota { dim: 0 }, crate::test_graph::m(&[2, 1, 1], DType::I64), None);
        let r = c.op(Op::Binary(BinaryOp::Add), &[rows, b]);
        c.op(Op::Binary(BinaryOp::Le), &[keys, r])
    });
    none(&|c, keys, rows, _| {
        let m = c.op(Op::Binary(BinaryOp::Le), &[keys, rows]);
        let other = c.input(&[48, 40], DType::Bool);
        c.op(Op::Binary(BinaryOp::LogicalAnd), &[m, other])
    });
    // An i32 position (not the rule's i64 offset), a narrowing cast, float indices.
    none(&|c, keys, _, _| {
        let p = c.input(&[], DType::I32);
        let r = c.g.leaf(Op::Iota { dim: 0 }, crate::test_graph::m(&[48, 1], DType::I32), None);
        let r = c.op(Op::Binary(BinaryOp::Add), &[r, p]);
        let k = c.op(Op::Cast(DType::I32), &[keys]);
        c.op(Op::Binary(BinaryOp::Le), &[k, r])
    });
    none(&|c, keys, rows, _| {
        let k = c.op(Op::Cast(DType::F32), &[keys]);
        let r = c.op(Op::Cast(DType::F32), &[rows]);
        c.op(Op::Binary(BinaryOp::Le), &[k, r])
    });
}

/// Grouped-query attention over Llama's mask, 48 rows (more than an explicit mask may have):
/// the compile path keeps the template, and lowering gives the call the rule, the position its
/// offset, and computes nothing of the mask.
#[test]
fn a_prefill_mask_lowers_to_the_rule_and_is_never_computed() {
    let mut c = Capture::new();
    let (mask, pos) = llama_mask(&mut c, LLAMA);
    let q = c.input(&[1, 2, 48, 16], DType::F32);
    let kv = c.input(&[1, 2, 40, 16], DType::F32);
    let y = c.op(Op::Attention { causal: false, scale: None, mask: true, dropout: None }, &[q, kv, kv, mask]);
    let g = c.out(&[y]);
    let options =
        DecomposeOptions { fused_attention: true, keep_detach: false, half_products: false, conv_template: false };
    let primitive = decompose_with(&g, &options).unwrap();
    let (primitive, _) = simplify(&primitive, &RewriteOptions::default()).unwrap();
    assert!(primitive.nodes.iter().any(|n| matches!(n.op, Op::Attention { .. })), "{primitive}");
    let p = lower(&primitive).unwrap();
    let calls: Vec<&ExternCall> = p
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            LoopKind::Extern { call, .. } => Some(call),
            _ => None,
        })
        .collect();
    let [ExternCall::Attention(call)] = calls[..] else { panic!("one attention call in\n{p}") };
    let rule = call.mask_rule.as_ref().expect("a mask rule");
    assert!(call.mask.is_none() && rule.period == Some(12) && rule.constant == 0, "{p}");
    assert_eq!(rule.offset, Some(p.inputs[pos.0]), "the position input is the offset\n{p}");
    assert!(p.nodes.len() == 1 && p.buffers.iter().all(|b| b.meta.numel() < 48 * 40), "nothing of the mask\n{p}");
    assert!(p.to_string().contains("mask_rule=key<=offset+row%12"), "{p}");
    // The loop IR text holds the rule and its offset buffer: it parses back to the same call.
    let parsed = coil_ir::loops::LoopProgram::parse(&p.to_string()).unwrap();
    assert_eq!(parsed.to_string(), p.to_string());
    assert_eq!(parsed.nodes[0].kind, p.nodes[0].kind, "{p}");
    // An explicit mask of as many rows is decomposed.
    let mut c = Capture::new();
    let q = c.input(&[1, 2, 48, 16], DType::F32);
    let kv = c.input(&[1, 2, 40, 16], DType::F32);
    let mask = c.input(&[48, 40], DType::Bool);
    let y = c.op(Op::Attention { causal: false, scale: None, mask: true, dropout: None }, &[q, kv, kv, mask]);
    let primitive = decompose_with(&c.out(&[y]), &options).unwrap();
    assert!(!primitive.nodes.iter().any(|n| matches!(n.op, Op::Attention { .. })), "{primitive}");
}
