//! Epilogues: the pointwise nodes after a matrix product that are computed inside its
//! [`ExternCall::Bmm`](coil_ir::loops::ExternCall) call instead of in a kernel of their own.
//!
//! * **Bias.** `linear(x, w, b)` decomposes to `bmm`, a reshape back, and an add of the
//!   broadcast bias row: that add is the call's bias ([`bias_epilogues`]).
//! * **gelu_tanh.** The primitive graph of `gelu(y, tanh=True)` on a product `y` (with or
//!   without a bias add) is the call's [`Activation::GeluTanh`] ([`gelu_epilogue`]): the call
//!   writes the gelu's buffer, and neither the product nor the bias add is ever materialized;
//!   or, where something else reads the bias add (a training graph's gelu gradient), the call
//!   writes its buffer too (`saved`).
//! * **gelu_tanh's gradient.** `g * gelu_tanh'(y)` with `g` a product is that product's call
//!   reading `y`'s buffer ([`gelu_grad_epilogue`]).
//!
//! * **Widening cast.** `cast(reshape*(bmm), f32)` of an f16 / bf16 product with no bias or
//!   activation, the cast a graph output or only a scatter's base ([`widening_epilogue`]: a
//!   weight gradient cast back to its f32 parameter's dtype, perhaps with a tied embedding's
//!   gradient scattered into it): the call writes the f32 result directly, one rounding fewer
//!   than the unfused graph (which rounds the product to f16 / bf16 first), and no
//!   half-precision product is stored. A cast that other kernels read stays with them (they
//!   load the half-precision product and widen it in registers: logits read by a loss).
//!
//! The gelu pattern is not written out here: it is *traced*, as Inductor's
//! `register_replacement` traces its patterns. [`traced_gelu_tanh`] runs `decompose` on a
//! graph holding one `gelu(y, tanh=True)` of a placeholder `y` (f32, f16 or bf16), and
//! [`gelu_epilogue`] matches that graph against the graph being lowered, node for node
//! (operands of commutative ops in either order, constants by value in their dtype, shapes
//! ignored). So a change to the decomposition changes the pattern with it, and the tests of
//! this module (`lower/tests.rs`) fail if the decomposition stops being what the call's
//! activation computes. Today the trace is (`simplify` leaves it as it is):
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
//! the trace's in their dtype (each a `full`, or a view of one), the product not degenerate, and every node
//! between the product and the result (the reshapes, the add, `x`, the formula's nodes) read by
//! nothing else and not a graph output. The call then computes "bias add, gelu_tanh in f32,
//! one rounding to the output dtype", which is what cuBLASLt's `CUBLASLT_EPILOGUE_GELU_BIAS`
//! does with an f32 compute type. For f16 / bf16 the product plus bias is not rounded to the
//! output dtype before the gelu (the unfused graph rounds it): a difference within the output
//! dtype's rounding. Anything else is left alone.

use super::{affine, flat, view_vars, Lowerer};
use crate::rewrite::lang::Konst;
use coil_ir::loops::Activation;
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, Scalar, TensorMeta};
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

/// A matrix product and the nodes after it that its call computes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Epilogue {
    /// The `bmm` node.
    pub mm: NodeId,
    /// The bias: the add and its bias-row operand.
    pub bias: Option<(NodeId, NodeId)>,
    pub activation: Option<Activation>,
    /// An activation whose gradient multiplies the product, and the node of its saved input
    /// (the call reads that node's buffer).
    pub activation_grad: Option<(Activation, NodeId)>,
    /// The activation's input (the bias add), when a backward reads it: the call writes its
    /// buffer too (a training graph's forward, `gelu_epilogue`).
    pub saved: Option<NodeId>,
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
        .map(|(add, (mm, bias))| {
            let bias = Some((add, bias));
            (add, Epilogue { mm, bias, activation: None, activation_grad: None, saved: None, inside: vec![] })
        })
        .collect();
    // Gradients of gelus first: a forward gelu whose nodes the gradient's call reads (and so
    // does not need stored) may then save its input for it.
    let grads: Vec<(NodeId, Epilogue)> =
        live.iter().filter_map(|&n| gelu_grad_epilogue(l, n, readers, &output).map(|ep| (n, ep))).collect();
    let mut grad_reads: HashMap<NodeId, HashSet<NodeId>> = HashMap::new();
    for (root, ep) in &grads {
        let (_, y) = ep.activation_grad.expect("a gradient's epilogue");
        grad_reads.entry(y).or_default().extend(ep.inside.iter().copied().chain([*root]));
    }
    for &n in &live {
        if let Some(ep) = gelu_epilogue(l, n, &found, readers, &output, &grad_reads) {
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
    for (n, ep) in grads {
        if !found.values().any(|e| e.mm == ep.mm) {
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
///
/// In a training graph the gelu's input `y` (the bias add) is also read by the gradient: by
/// the gelu gradient's call ([`gelu_grad_epilogue`]; `grad_reads` holds, by saved input, the
/// nodes such calls compute) or by any other kernel. The call then also writes `y`'s buffer
/// (cuBLASLt's `CUBLASLT_EPILOGUE_GELU_AUX_BIAS`), as long as the gelu's own nodes are read
/// only inside this call or inside a gradient's call that reads `y`.
fn gelu_epilogue(
    l: &Lowerer,
    root: NodeId,
    bias: &HashMap<NodeId, Epilogue>,
    readers: &[Vec<NodeId>],
    output: &[bool],
    grad_reads: &HashMap<NodeId, HashSet<NodeId>>,
) -> Option<Epilogue> {
    let g = l.g;
    let out = g.meta(root).dtype;
    let trace = traced_gelu_tanh(out)?;
    // The trace's nodes as matched (not `y`, not the constants), and `y`.
    let mut inside = Vec::new();
    let mut y = None;
    if !matches_trace(l, trace, trace.outputs[0], root, &mut y, &mut inside) {
        return None;
    }
    let y = y?;
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
    let mut saved = None;
    if !inside.iter().all(|&n| private(n)) {
        // The saving form: `y` is stored (it is a value of its own, the bias add), and the
        // gelu's nodes may also be read inside the calls of its gradient.
        let (add, _) = bias?;
        let theirs = grad_reads.get(&y);
        let read_here = |n: NodeId| {
            !output[n.0] && readers[n.0].iter().all(|r| within.contains(r) || theirs.is_some_and(|t| t.contains(r)))
        };
        if add != y || !inside.iter().all(|&n| n == y || read_here(n)) {
            return None;
        }
        saved = Some(y);
        inside.retain(|&n| n != y);
    }
    inside.sort();
    inside.dedup();
    inside.retain(|&n| n != mm);
    Some(Epilogue { mm, bias, activation: Some(Activation::GeluTanh), activation_grad: None, saved, inside })
}

/// `root` as the gradient of a gelu_tanh at its input `y`, `g * gelu_tanh'(y)`, where the
/// incoming gradient `g` is a product (`reshape*(bmm)`): the graph [`traced_gelu_tanh_grad`]
/// traces, matched node for node as [`gelu_epilogue`] matches its trace. The call then writes
/// `root` from the product and `y`'s buffer (`CUBLASLT_EPILOGUE_DGELU`), and neither the product
/// nor the derivative is stored.
///
/// The nodes of the derivative that read `g` (directly or not) must be read by nothing else
/// and not be graph outputs; those that depend on `y` only are the forward pass's gelu nodes,
/// which the forward computes anyway: they stay where they are, and join the call only when
/// nothing else reads them. `y` must be a value of its own (not a view), of the product's dtype
/// and shape, and is stored.
fn gelu_grad_epilogue(l: &Lowerer, root: NodeId, readers: &[Vec<NodeId>], output: &[bool]) -> Option<Epilogue> {
    let g = l.g;
    let out = g.meta(root).dtype;
    let trace = traced_gelu_tanh_grad(out)?;
    // A cheap refusal first: the trace's root op.
    if g.node(root).op != trace.node(trace.outputs[0]).op || g.meta(root).numel() == 0 {
        return None;
    }
    let mut bound = [None, None];
    let mut matched = Vec::new();
    if !matches_trace_inputs(l, trace, trace.outputs[0], root, &mut bound, &mut matched) {
        return None;
    }
    let (y, incoming) = (bound[0]?, bound[1]?);
    if g.node(y).op.is_view() || g.meta(y).dtype != out || l.shape(y) != l.shape(root) {
        return None;
    }
    matched.sort();
    matched.dedup();
    // Matched nodes reading the incoming gradient (operands precede their readers in id order).
    let mut backward: HashSet<NodeId> = HashSet::new();
    for &n in &matched {
        if g.node(n).inputs.iter().any(|&x| x == incoming || backward.contains(&x)) {
            backward.insert(n);
        }
    }
    // The incoming gradient is the product, seen through reshapes.
    let mut chain = vec![incoming];
    while matches!(g.node(*chain.last()?).op, Op::Reshape { .. }) {
        chain.push(g.node(*chain.last()?).inputs[0]);
    }
    let mm = chain.pop()?;
    if g.node(mm).op != Op::Bmm || g.meta(mm).dtype != out || l.degenerate(mm) {
        return None;
    }
    // Nothing outside the call reads the product, the reshapes or the derivative's nodes.
    let mut within: HashSet<NodeId> = backward.iter().copied().chain(chain.iter().copied()).collect();
    let private = |n: NodeId| !output[n.0] && readers[n.0].iter().all(|r| within.contains(r));
    if !backward.iter().chain(&chain).chain([&mm]).all(|&n| n == root || private(n)) {
        return None;
    }
    // Forward nodes read only inside the call go with it (nothing else would compute them).
    loop {
        let before = within.len();
        for &n in &matched {
            if !within.contains(&n) && !output[n.0] && readers[n.0].iter().all(|r| within.contains(r)) {
                within.insert(n);
            }
        }
        if within.len() == before {
            break;
        }
    }
    within.remove(&root);
    let mut inside: Vec<NodeId> = within.into_iter().collect();
    inside.sort();
    let activation_grad = Some((Activation::GeluTanh, y));
    Some(Epilogue { mm, bias: None, activation: None, activation_grad, saved: None, inside })
}

/// `root`, a value stored anyway (a graph output, or the base of a scatter: see
/// [`scatter_base_only`]), as `cast(reshape*(bmm), f32)` of an f16 / bf16 product (see the
/// module docs), every node from the product to the cast read only by the next one and not a
/// graph output.
fn widening_epilogue(l: &Lowerer, root: NodeId, readers: &[Vec<NodeId>], output: &[bool]) -> Option<Epilogue> {
    let g = l.g;
    let stored = output[root.0] || scatter_base_only(l, root, readers);
    if g.node(root).op != Op::Cast(DType::F32) || g.meta(root).numel() == 0 || !stored {
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
        activation_grad: None,
        saved: None,
        inside,
    })
}

/// Whether `n`'s one reader is a scatter that takes it as its base (and reads it nowhere
/// else): the scatter's output starts as a copy of its base, or is written in place over it,
/// so the base is a buffer whatever computes it (`scatter_add(cast(w_grad), ...)`, a weight
/// gradient the tied embedding's gradient is added into).
fn scatter_base_only(l: &Lowerer, n: NodeId, readers: &[Vec<NodeId>]) -> bool {
    match readers[n.0][..] {
        [s] => matches!(l.g.node(s).op, Op::Scatter { .. }) && l.g.node(s).inputs[0] == n,
        _ => false,
    }
}

/// The primitive graph `decompose` makes of `gelu(y, tanh=True)` for a placeholder `y` of
/// dtype `dtype` (f32, f16 or bf16; `None` for others), traced once per dtype: the pattern
/// [`gelu_epilogue`] matches. Its one output is the gelu's value, its one input `y`.
pub(crate) fn traced_gelu_tanh(dtype: DType) -> Option<&'static Graph> {
    static TRACES: [OnceLock<Option<Graph>>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let at = [DType::F32, DType::F16, DType::BF16].iter().position(|&t| t == dtype)?;
    let trace = || {
        let mut g = Graph::new();
        let y = g.input(TensorMeta::new(vec![2, 3], dtype));
        let gelu = g.push(Op::Gelu { tanh: true }, &[y], None).ok()?;
        g.outputs.push(gelu);
        crate::decompose(&g).ok()
    };
    TRACES[at].get_or_init(trace).as_ref()
}

/// The primitive graph of the gradient of `gelu(y, tanh=True)` for placeholders `y` and `g`
/// (the gradient flowing into the gelu's output) of dtype `dtype` (f32, f16 or bf16; `None`
/// for others), traced once per dtype: `decompose` makes the gelu, `autodiff::backward` its
/// gradient, as a training graph gets them. Its one output is the gradient at `y`, its inputs
/// `y` and `g`: the pattern [`gelu_grad_epilogue`] matches.
pub(crate) fn traced_gelu_tanh_grad(dtype: DType) -> Option<&'static Graph> {
    static TRACES: [OnceLock<Option<Graph>>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let at = [DType::F32, DType::F16, DType::BF16].iter().position(|&t| t == dtype)?;
    let trace = || {
        let mut g = Graph::new();
        let meta = TensorMeta::new(vec![2, 3], dtype);
        g.input(meta.clone());
        g.input(meta);
        let gelu = g.push(Op::Gelu { tanh: true }, &[g.inputs[0]], None).ok()?;
        g.outputs.push(gelu);
        let mut d = crate::decompose(&g).ok()?;
        let (y, seed, out) = (d.inputs[0], d.inputs[1], d.outputs[0]);
        let grads = crate::autodiff::backward(&mut d, out, Some(seed), &[y]).ok()?;
        d.outputs = grads;
        Some(d)
    };
    TRACES[at].get_or_init(trace).as_ref()
}

/// [`matches_trace_inputs`] for a trace of one input, bound in `y`.
fn matches_trace(
    l: &Lowerer,
    trace: &Graph,
    t: NodeId,
    n: NodeId,
    y: &mut Option<NodeId>,
    inside: &mut Vec<NodeId>,
) -> bool {
    let mut bound = [*y];
    let found = matches_trace_inputs(l, trace, t, n, &mut bound, inside);
    *y = bound[0];
    found
}

/// Whether node `n` of the graph being lowered computes what node `t` of `trace` does: the
/// same op and dtype, operands matching (both orders for commutative binary ops), a trace
/// constant (a `full`, or a view of one) by a constant of the same value in that dtype, and
/// each of the trace's inputs by one node throughout (`bound[i]` for input `i`). The nodes
/// matched to the trace's computing nodes are pushed to `inside` (undone on a failed match).
fn matches_trace_inputs(
    l: &Lowerer,
    trace: &Graph,
    t: NodeId,
    n: NodeId,
    bound: &mut [Option<NodeId>],
    inside: &mut Vec<NodeId>,
) -> bool {
    let g = l.g;
    let node = trace.node(t);
    let dtype = node.meta.dtype;
    if let Op::Input { .. } = node.op {
        let Some(i) = trace.inputs.iter().position(|&x| x == t) else { return false };
        return g.meta(n).dtype == dtype && *bound[i].get_or_insert(n) == n;
    }
    if g.meta(n).dtype != dtype {
        return false;
    }
    if let Some(value) = trace_constant(trace, t) {
        let same = |v: f64| Konst::of(Scalar::Float(v), dtype) == Konst::of(Scalar::Float(value), dtype);
        return constant(l, n).is_some_and(same);
    }
    let m = g.node(n);
    if m.op != node.op || m.inputs.len() != node.inputs.len() {
        return false;
    }
    let mut orders = vec![m.inputs.clone()];
    if commutative(&node.op) {
        orders.push(m.inputs.iter().rev().copied().collect());
    }
    for operands in orders {
        let (before, len) = (bound.to_vec(), inside.len());
        if node.inputs.iter().zip(operands).all(|(&ti, ni)| matches_trace_inputs(l, trace, ti, ni, bound, inside)) {
            inside.push(n);
            return true;
        }
        bound.copy_from_slice(&before);
        inside.truncate(len);
    }
    false
}

/// Binary ops whose operands may be swapped exactly (not maximum and minimum: a tie of zeros
/// gives the first operand).
fn commutative(op: &Op) -> bool {
    use BinaryOp::*;
    matches!(op, Op::Binary(Add | Mul | Eq | Ne | LogicalAnd | LogicalOr | BitwiseAnd | BitwiseOr | BitwiseXor))
}

/// The value of every element of trace node `t`: a `full`, or a view of one.
fn trace_constant(trace: &Graph, mut t: NodeId) -> Option<f64> {
    while trace.node(t).op.is_view() {
        t = trace.node(t).inputs[0];
    }
    match trace.node(t).op {
        Op::Full(v) => Some(v.as_f64()),
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

#[cfg(test)]
mod tests {
    use super::traced_gelu_tanh;
    use coil_ir::loops::{Activation, ExternCall, LoopKind, LoopProgram};
    use coil_ir::{DType, Graph, Op, TensorMeta};

    /// `gelu(linear(x, w, b), tanh)` of `dtype`, decomposed, optionally simplified, lowered.
    fn lowered_linear_gelu(dtype: DType, tanh: bool, simplify: bool) -> LoopProgram {
        let mut g = Graph::new();
        let x = g.input(TensorMeta::new(vec![3, 7, 9], dtype));
        let w = g.input(TensorMeta::new(vec![11, 9], dtype));
        let b = g.input(TensorMeta::new(vec![11], dtype));
        let y = g.push(Op::Linear { bias: true }, &[x, w, b], None).unwrap();
        let z = g.push(Op::Gelu { tanh }, &[y], None).unwrap();
        g.outputs.push(z);
        let mut d = crate::decompose(&g).unwrap();
        if simplify {
            d = crate::simplify(&d, &Default::default()).unwrap().0;
        }
        crate::lower(&d).unwrap()
    }

    /// The gradients of `linear(gelu(linear(x, w1, b1), tanh), w2)` of `dtype` with respect to
    /// every input, for an incoming gradient `seed`, as a training graph makes them (decompose,
    /// then `autodiff::backward`), optionally simplified, lowered.
    fn lowered_mlp_gradients(dtype: DType, tanh: bool, simplify: bool) -> LoopProgram {
        let mut g = Graph::new();
        let x = g.input(TensorMeta::new(vec![3, 7, 9], dtype));
        let w1 = g.input(TensorMeta::new(vec![16, 9], dtype));
        let b1 = g.input(TensorMeta::new(vec![16], dtype));
        let w2 = g.input(TensorMeta::new(vec![8, 16], dtype));
        g.input(TensorMeta::new(vec![3, 7, 8], dtype)); // the incoming gradient
        let y = g.push(Op::Linear { bias: true }, &[x, w1, b1], None).unwrap();
        let z = g.push(Op::Gelu { tanh }, &[y], None).unwrap();
        let o = g.push(Op::Linear { bias: false }, &[z, w2], None).unwrap();
        g.outputs.push(o);
        let mut d = crate::decompose(&g).unwrap();
        let (out, seed, wrt) = (d.outputs[0], d.inputs[4], d.inputs[..4].to_vec());
        d.outputs = crate::autodiff::backward(&mut d, out, Some(seed), &wrt).unwrap();
        if simplify {
            d = crate::simplify(&d, &Default::default()).unwrap().0;
        }
        crate::lower(&d).unwrap()
    }

    /// The products computing an activation's gradient, with the name of the buffer they read
    /// the saved input from.
    fn activation_grads(p: &LoopProgram) -> Vec<(Activation, String)> {
        p.nodes
            .iter()
            .filter_map(|n| match &n.kind {
                LoopKind::Extern { call: ExternCall::Bmm { activation_grad: Some(g), .. }, .. } => {
                    Some((g.activation, p.buffer(g.aux).name.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// The gradient of a tanh gelu through the product after it is one call reading the
    /// gelu's input; no kernel computes the derivative or stores the incoming gradient. The
    /// forward product's call computes the gelu and saves its input (the bias add) for that
    /// call, so no kernel computes tanh either. The exact gelu (another derivative) is not
    /// matched.
    #[test]
    fn the_gelu_gradient_is_the_products_epilogue() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for simplify in [true, false] {
                let p = lowered_mlp_gradients(dtype, true, simplify);
                let grads = activation_grads(&p);
                assert_eq!(grads.len(), 1, "{dtype} simplify={simplify}\n{p}");
                let writer = p
                    .nodes
                    .iter()
                    .find(|n| n.writes().iter().any(|&b| p.buffer(b).name == grads[0].1))
                    .expect("a stored input");
                let LoopKind::Extern { call: ExternCall::Bmm { bias, activation, saved, .. }, .. } = &writer.kind
                else {
                    panic!("the saved input is written by the forward product's call:\n{p}")
                };
                assert!(bias.is_some() && *activation == Some(Activation::GeluTanh), "{p}");
                assert_eq!(saved.map(|b| p.buffer(b).name.clone()).as_ref(), Some(&grads[0].1), "{p}");
                let kernel = |n: &&coil_ir::loops::LoopNode| !matches!(n.kind, LoopKind::Extern { .. });
                let tanh_kernels = p.nodes.iter().filter(kernel).filter(|n| n.origins.contains(&"tanh")).count();
                assert_eq!(tanh_kernels, 0, "no kernel computes the gelu ({dtype}):\n{p}");
            }
            assert!(activation_grads(&lowered_mlp_gradients(dtype, false, true)).is_empty());
        }
    }

    #[test]
    fn the_gradient_trace_has_two_inputs_and_one_output() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let trace = super::traced_gelu_tanh_grad(dtype).expect("gelu_tanh differentiates");
            assert_eq!((trace.inputs.len(), trace.outputs.len()), (2, 1), "{trace}");
            assert_eq!(trace.meta(trace.outputs[0]).dtype, dtype);
        }
        assert!(super::traced_gelu_tanh_grad(DType::F64).is_none());
    }

    fn activations(p: &LoopProgram) -> Vec<Option<Activation>> {
        p.nodes
            .iter()
            .filter_map(|n| match &n.kind {
                LoopKind::Extern { call: ExternCall::Bmm { activation, .. }, .. } => Some(*activation),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_trace_is_decompose_output_and_simplify_keeps_it() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let trace = traced_gelu_tanh(dtype).expect("gelu_tanh decomposes");
            assert_eq!((trace.inputs.len(), trace.outputs.len()), (1, 1));
            let (simplified, report) = crate::simplify(trace, &Default::default()).unwrap();
            assert_eq!(&simplified, trace, "simplify changes the gelu trace ({dtype}):\n{report}");
        }
        assert!(traced_gelu_tanh(DType::F64).is_none() && traced_gelu_tanh(DType::I32).is_none());
    }

    /// The decomposition and the matcher agree: a gelu_tanh of another shape than the trace's,
    /// as the pipeline makes it (with and without `simplify`), is the call's activation; the
    /// exact gelu (another decomposition) is not.
    #[test]
    fn the_decomposition_matches_its_trace() {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for simplify in [true, false] {
                let p = lowered_linear_gelu(dtype, true, simplify);
                assert_eq!(activations(&p), [Some(Activation::GeluTanh)], "{dtype} simplify={simplify}\n{p}");
                assert_eq!(p.nodes.len(), 1, "{p}");
            }
            assert_eq!(activations(&lowered_linear_gelu(dtype, false, true)), [None]);
        }
    }
}
