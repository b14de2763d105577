//! Epilogues: the pointwise nodes after a matrix product that are computed inside its
//! [`ExternCall::Bmm`](coil_ir::loops::ExternCall) call instead of in a kernel of their own.
//!
//! * **Bias.** `linear(x, w, b)` decomposes to `bmm`, a reshape back, and an add of the
//!   broadcast bias row: that add is the call's bias ([`bias_epilogues`]).
//! * **gelu_tanh.** The primitive graph of `gelu(y, tanh=True)` on a product `y` (with or
//!   without a bias add) is the call's [`Activation::GeluTanh`] ([`gelu_epilogue`]): the call
//!   writes the gelu's buffer, and neither the product nor the bias add is ever materialized.
//!
//! * **Widening cast.** `cast(reshape*(bmm), f32)` of an f16 / bf16 product with no bias or
//!   activation, the cast a graph output ([`widening_epilogue`]: a weight gradient cast back to
//!   its f32 parameter's dtype): the call writes the f32 result directly, one rounding fewer
//!   than the unfused graph (which rounds the product to f16 / bf16 first), and no
//!   half-precision product is stored. A cast that other kernels read stays with them (they
//!   load the half-precision product and widen it in registers: logits read by a loss).
//!
//! The gelu pattern is matched exactly, on the graph `decompose` (then `simplify`) makes of
//! `gelu(y, tanh=True)` (operands of `add` and `mul` in either order):
//!
//! ```text
//! x       = y                                   (y: f32)
//!         | cast(y, f32)                        (y: f16 / bf16)
//! g       = mul(mul(x, 0.5),
//!               add(tanh(mul(add(x, mul(mul(mul(x, x), x), 0.044715)), sqrt(2/pi))), 1.0))
//! result  = g                                   (y: f32)
//!         | cast(g, f16 / bf16)                 (y: f16 / bf16; the dtype of y)
//! y       = add(reshape*(bmm), bias row)        (a bias epilogue)
//!         | reshape*(bmm)
//! ```
//!
//! every node from `y` to `g` of dtype f32 (f16 / bf16 for `y` itself), the constants equal to
//! those as f32 (each a `full`, or a view of one), the product not degenerate, and every node
//! between the product and the result (the reshapes, the add, `x`, the formula's nodes) read by
//! nothing else and not a graph output. The call then computes "bias add, gelu_tanh in f32,
//! one rounding to the output dtype", which is what cuBLASLt's `CUBLASLT_EPILOGUE_GELU_BIAS`
//! does with an f32 compute type. For f16 / bf16 the product plus bias is not rounded to the
//! output dtype before the gelu (the unfused graph rounds it): a difference within the output
//! dtype's rounding. Anything else is left alone.

use super::{affine, flat, view_vars, Lowerer};
use coil_ir::loops::Activation;
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, NodeId, Op, UnaryOp};
use std::collections::{HashMap, HashSet};
use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};

/// A matrix product and the nodes after it that its call computes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Epilogue {
    /// The `bmm` node.
    pub mm: NodeId,
    /// The bias: the add and its bias-row operand.
    pub bias: Option<(NodeId, NodeId)>,
    pub activation: Option<Activation>,
    /// The nodes computed inside the call other than the product and the root (the node whose
    /// buffer the call writes): reshapes, the bias add under an activation, the activation's
    /// nodes. They get no buffer and no loop.
    pub inside: Vec<NodeId>,
}

/// The calls' epilogues, by root (the node the call's output buffer holds: the bias add, or
/// the activation's last node), and every node computed inside a call other than the roots
/// (products included).
pub(crate) fn epilogues(l: &Lowerer) -> (HashMap<NodeId, Epilogue>, HashSet<NodeId>) {
    let g = l.g;
    let readers = &l.readers;
    let live = g.live_nodes();
    let mut output = vec![false; g.nodes.len()];
    for o in &g.outputs {
        output[o.0] = true;
    }
    let mut found: HashMap<NodeId, Epilogue> = bias_epilogues(l, readers, &output)
        .into_iter()
        .map(|(add, (mm, bias))| (add, Epilogue { mm, bias: Some((add, bias)), activation: None, inside: vec![] }))
        .collect();
    for &n in &live {
        if let Some(ep) = gelu_epilogue(l, n, &found, readers, &output) {
            // The bias epilogue it extends is replaced; no product is in two calls.
            let replaced = ep.bias.map(|(add, _)| add);
            if found.iter().any(|(&r, e)| e.mm == ep.mm && Some(r) != replaced) {
                continue;
            }
            if let Some(add) = replaced {
                found.remove(&add);
            }
            found.insert(n, ep);
        }
    }
    for &n in &live {
        if let Some(ep) = widening_epilogue(l, n, readers, &output) {
            if !found.values().any(|e| e.mm == ep.mm) {
                found.insert(n, ep);
            }
        }
    }
    let mut inside = HashSet::new();
    for ep in found.values() {
        inside.insert(ep.mm);
        inside.extend(ep.inside.iter().copied());
    }
    (found, inside)
}

/// The `add` nodes that are the bias epilogue of a matrix product (`linear(x, w, b)` decomposes
/// to `bmm`, a reshape back, and an add of the broadcast bias): `add -> (bmm, bias operand)`.
///
/// The pattern: one operand of the add is the product, seen through reshapes that keep its last
/// dim (so the add's column is the product's column), with no other reader anywhere along the
/// way and not a graph output; the other operand reads a fixed row, `bias[offset + stride * j]`
/// for column `j`, whatever the other indices.
fn bias_epilogues(l: &Lowerer, readers: &[Vec<NodeId>], output: &[bool]) -> HashMap<NodeId, (NodeId, NodeId)> {
    let g = l.g;
    let count = |n: NodeId| readers[n.0].len() + output[n.0] as usize;
    let mut found = HashMap::new();
    for n in g.live_nodes() {
        let node = g.node(n);
        // An empty sum has no elements to compute: nothing to fuse.
        if node.op != Op::Binary(BinaryOp::Add) || node.meta.shape.len() < 2 || node.meta.numel() == 0 {
            continue;
        }
        let last = *l.shape(n).last().unwrap();
        for (mm_side, bias_side) in [(node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])] {
            let mut m = mm_side;
            while matches!(g.node(m).op, Op::Reshape { .. }) && count(m) == 1 {
                m = g.node(m).inputs[0];
            }
            let is_product = g.node(m).op == Op::Bmm && count(m) == 1 && l.shape(m).last() == Some(&last);
            if is_product && reads_a_row(l, bias_side, l.shape(n)) && !found.values().any(|&(p, _)| p == m) {
                found.insert(n, (m, bias_side));
                break;
            }
        }
    }
    found
}

/// Whether `x` (of `shape`, through its views) reads `offset + stride * j` for column `j`,
/// independent of the other indices: a broadcast row.
fn reads_a_row(l: &Lowerer, x: NodeId, shape: &[Expr]) -> bool {
    let g = l.g;
    let mut n = x;
    while g.node(n).op.is_view() {
        n = g.node(n).inputs[0];
    }
    let last = *shape.last().unwrap();
    if g.meta(n).rank() != 1 && l.shape(n).iter().copied().product::<Expr>() != last {
        return false;
    }
    // Walk the views symbolically, as lowering will.
    let syms = view_vars(shape);
    let mut idx = syms.clone();
    let mut m = x;
    while g.node(m).op.is_view() {
        (m, idx) = l.view_step(m, &idx);
    }
    match affine(flat(&idx, l.shape(m)), &syms) {
        Some((_, strides)) => strides[..strides.len() - 1].iter().all(|&s| s == Expr::int(0)),
        None => false,
    }
}

/// `root` as the last node of a gelu_tanh of a product (see the module docs), with the call
/// that computes it; `bias` holds the bias epilogues found so far, by add.
fn gelu_epilogue(
    l: &Lowerer,
    root: NodeId,
    bias: &HashMap<NodeId, Epilogue>,
    readers: &[Vec<NodeId>],
    output: &[bool],
) -> Option<Epilogue> {
    let g = l.g;
    let out = g.meta(root).dtype;
    let mut inside = Vec::new();
    // The formula's result `f`, and its input `x` (both f32).
    let f = match g.node(root).op {
        Op::Cast(t @ (DType::F16 | DType::BF16)) if t == out => {
            let f = g.node(root).inputs[0];
            inside.push(f);
            f
        }
        _ if out == DType::F32 => root,
        _ => return None,
    };
    let x = gelu_tanh_formula(l, f, &mut inside)?;
    // `y`: the value the gelu reads, in the output dtype.
    let y = if out == DType::F32 {
        x
    } else {
        if g.node(x).op != Op::Cast(DType::F32) {
            return None;
        }
        inside.push(x);
        g.node(x).inputs[0]
    };
    if g.meta(y).dtype != out {
        return None;
    }
    inside.push(y);
    let (mm, bias) = match bias.get(&y).filter(|ep| ep.activation.is_none()) {
        Some(ep) => (ep.mm, ep.bias),
        None => {
            // The reshapes and the product join `inside` for the check below.
            let mut m = y;
            while matches!(g.node(m).op, Op::Reshape { .. }) {
                m = g.node(m).inputs[0];
                inside.push(m);
            }
            if g.node(m).op != Op::Bmm {
                return None;
            }
            (m, None)
        }
    };
    // A product with no sum (k = 0) or no elements is a constant: nothing to fuse.
    if g.meta(mm).dtype != out || l.degenerate(mm) || g.meta(root).numel() == 0 {
        return None;
    }
    // Nothing outside the call may read what the call does not write (a bias epilogue's
    // product side was checked by `bias_epilogues`).
    inside.retain(|&n| n != root);
    let within: HashSet<NodeId> = inside.iter().copied().chain([root]).collect();
    let private = |n: NodeId| !output[n.0] && readers[n.0].iter().all(|r| within.contains(r));
    if !inside.iter().all(|&n| private(n)) {
        return None;
    }
    inside.sort();
    inside.dedup();
    inside.retain(|&n| n != mm);
    Some(Epilogue { mm, bias, activation: Some(Activation::GeluTanh), inside })
}

/// `root`, a graph output, as `cast(reshape*(bmm), f32)` of an f16 / bf16 product (see the
/// module docs), every node from the product to the cast read only by the next one and not a
/// graph output.
fn widening_epilogue(l: &Lowerer, root: NodeId, readers: &[Vec<NodeId>], output: &[bool]) -> Option<Epilogue> {
    let g = l.g;
    if g.node(root).op != Op::Cast(DType::F32) || g.meta(root).numel() == 0 || !output[root.0] {
        return None;
    }
    let private = |n: NodeId| !output[n.0] && readers[n.0].len() == 1;
    let mut inside = Vec::new();
    let mut m = g.node(root).inputs[0];
    while matches!(g.node(m).op, Op::Reshape { .. }) && private(m) {
        inside.push(m);
        m = g.node(m).inputs[0];
    }
    let half = matches!(g.meta(m).dtype, DType::F16 | DType::BF16);
    (g.node(m).op == Op::Bmm && half && private(m) && !l.degenerate(m)).then_some(Epilogue {
        mm: m,
        bias: None,
        activation: None,
        inside,
    })
}

/// `f` as `gelu_tanh(x)` computed in f32, the way `decompose` writes it (operands of `add` and
/// `mul` in either order): returns `x` and pushes the formula's nodes (not `x`, not the
/// constants) to `inside`.
fn gelu_tanh_formula(l: &Lowerer, f: NodeId, inside: &mut Vec<NodeId>) -> Option<NodeId> {
    let g = l.g;
    let f32_node = |n: NodeId| g.meta(n).dtype == DType::F32;
    let (p, q) = binary(l, f, BinaryOp::Mul)?;
    for (half_x, one_plus) in [(p, q), (q, p)] {
        let Some(x) = with_constant(l, half_x, BinaryOp::Mul, 0.5) else { continue };
        let Some(t) = with_constant(l, one_plus, BinaryOp::Add, 1.0) else { continue };
        if g.node(t).op != Op::Unary(UnaryOp::Tanh) {
            continue;
        }
        let scaled = g.node(t).inputs[0];
        let Some(sum) = with_constant(l, scaled, BinaryOp::Mul, FRAC_2_SQRT_PI * FRAC_1_SQRT_2) else { continue };
        let Some((a, b)) = binary(l, sum, BinaryOp::Add) else { continue };
        let cubic = match (a == x, b == x) {
            (true, false) => b,
            (false, true) => a,
            _ => continue,
        };
        let Some(x3) = with_constant(l, cubic, BinaryOp::Mul, 0.044715) else { continue };
        let Some((a, b)) = binary(l, x3, BinaryOp::Mul) else { continue };
        let square = |n: NodeId| binary(l, n, BinaryOp::Mul) == Some((x, x));
        let x2 = match (a == x && square(b), b == x && square(a)) {
            (true, _) => b,
            (_, true) => a,
            _ => continue,
        };
        let nodes = [f, half_x, one_plus, t, scaled, sum, cubic, x3, x2];
        if !nodes.iter().chain([&x]).all(|&n| f32_node(n)) {
            continue;
        }
        inside.extend(nodes);
        return Some(x);
    }
    None
}

/// The operands of `n` if it is the binary op `op`.
fn binary(l: &Lowerer, n: NodeId, op: BinaryOp) -> Option<(NodeId, NodeId)> {
    let node = l.g.node(n);
    (node.op == Op::Binary(op)).then(|| (node.inputs[0], node.inputs[1]))
}

/// The other operand of `n` if `n` is the binary op `op` with one operand the constant `value`
/// (compared as f32: the formula computes in f32).
fn with_constant(l: &Lowerer, n: NodeId, op: BinaryOp, value: f64) -> Option<NodeId> {
    let (a, b) = binary(l, n, op)?;
    let is = |c: NodeId| constant(l, c).is_some_and(|v| v as f32 == value as f32);
    match (is(a), is(b)) {
        (_, true) => Some(a),
        (true, false) => Some(b),
        _ => None,
    }
}

/// The value of every element of `n`: a `full` (of a plain number, not a size), or a view of
/// one.
fn constant(l: &Lowerer, mut n: NodeId) -> Option<f64> {
    let g = l.g;
    while g.node(n).op.is_view() {
        n = g.node(n).inputs[0];
    }
    match g.node(n).op {
        Op::Full(v) if l.attrs(n).first().is_none_or(|a| a.const_value().is_some()) => Some(v.as_f64()),
        _ => None,
    }
}
