//! The gradients of a split QKV projection written in place by the attention backward call:
//! the differentiated GPT-2-like graphs of `attention_tests`, lowered, and variants where a
//! condition fails and the lowering stays as before.

use crate::attention::tests::{differentiated, gpt2_projected};
use crate::lower::lower;
use crate::test_graph::Capture;
use coil_ir::loops::{AttentionBackwardCall, ExternCall, LoopKind, LoopProgram, StridedOperand};
use coil_ir::{AttentionInput, DType, Graph, NodeId, Op, Scalar};

const BF16: DType = DType::BF16;
/// Batch, tokens, heads, head dim of the test attention (`C = H * D`).
const B: usize = 2;
const T: usize = 5;
const H: usize = 2;
const D: usize = 8;
const C: usize = H * D;

/// How the test attention gets its q, k and v.
#[derive(Clone, Copy, PartialEq)]
enum Heads {
    /// Head views of `x @ w`, `[B, T, 3C]` (GPT-2): inputs x, w.
    Projected,
    /// Head views of an f32 projection input, cast to bf16 per head: input qkv.
    Cast,
    /// q an input `[B, H, T, D]`, k and v head views of a `[B, T, 2C]` input: inputs q, kv.
    CrossKv,
}

/// `[B, H, T, D]` head `i` of `[B, T, n * C]` `qkv`: slice, reshape, transpose.
fn head(c: &mut Capture, qkv: NodeId, i: usize) -> NodeId {
    let part = c.op(Op::Slice { dim: 2, start: i * C, len: C, step: 1 }, &[qkv]);
    let split = c.op(Op::Reshape { shape: vec![B, T, H, D] }, &[part]);
    c.permute(split, &[0, 2, 1, 3])
}

/// Causal attention on q, k, v as `heads` says, heads merged back to `[B, T, C]`.
fn attention(heads: Heads) -> Graph {
    let mut c = Capture::new();
    let (q, k, v) = match heads {
        Heads::Projected => {
            let (x, w) = (c.input(&[B, T, C], BF16), c.input(&[C, 3 * C], BF16));
            let qkv = c.op(Op::Matmul, &[x, w]);
            (head(&mut c, qkv, 0), head(&mut c, qkv, 1), head(&mut c, qkv, 2))
        }
        Heads::Cast => {
            let qkv = c.input(&[B, T, 3 * C], DType::F32);
            let mut cast = |i| {
                let h = head(&mut c, qkv, i);
                c.op(Op::Cast(BF16), &[h])
            };
            (cast(0), cast(1), cast(2))
        }
        Heads::CrossKv => {
            let (q, kv) = (c.input(&[B, H, T, D], BF16), c.input(&[B, T, 2 * C], BF16));
            (q, head(&mut c, kv, 0), head(&mut c, kv, 1))
        }
    };
    let y = c.op(Op::Attention { causal: true, scale: None, mask: false, dropout: None }, &[q, k, v]);
    let yt = c.permute(y, &[0, 2, 1, 3]);
    let out = c.op(Op::Reshape { shape: vec![B, T, C] }, &[yt]);
    c.out(&[out])
}

/// The graph differentiated with respect to inputs `wrt`, simplified as the compile path does.
fn gradient_graph(g: &Graph, wrt: &[usize]) -> Graph {
    let p = differentiated(g, wrt);
    crate::simplify(&p, &crate::RewriteOptions::default()).unwrap().0
}

fn lowered(g: &Graph) -> LoopProgram {
    lower(g).unwrap_or_else(|e| panic!("{e}\n{g}"))
}

/// The program's one attention backward call.
fn backward(p: &LoopProgram) -> &AttentionBackwardCall {
    let calls: Vec<&AttentionBackwardCall> = p
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            LoopKind::Extern { call: ExternCall::AttentionBackward(call), .. } => Some(&**call),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 1, "{p}");
    calls[0]
}

/// A gradient's view as numbers: (buffer name, offset, strides).
fn view(p: &LoopProgram, g: &Option<StridedOperand>) -> (String, usize, Vec<usize>) {
    let g = g.as_ref().expect("a wanted gradient").to_usize().expect("static sizes");
    let mut strides = g.batch_strides.clone();
    strides.extend([g.row_stride, g.col_stride]);
    (p.buffer(g.buffer).name.clone(), g.offset, strides)
}

/// The pointwise nodes that pad (the split's gradient, when it has a kernel).
fn pad_kernels(p: &LoopProgram) -> usize {
    p.nodes.iter().filter(|n| matches!(n.kind, LoopKind::Pointwise { .. }) && n.origins.contains(&"pad")).count()
}

/// The live nodes of `op`'s kind.
fn nodes(g: &Graph, f: impl Fn(&Op) -> bool) -> Vec<NodeId> {
    g.live_nodes().into_iter().filter(|&n| f(&g.node(n).op)).collect()
}

/// The backward node of gradient `input`.
fn gradient(g: &Graph, input: AttentionInput) -> NodeId {
    let found = nodes(g, |op| matches!(op, Op::AttentionBackward { input: i, .. } if *i == input));
    assert_eq!(found.len(), 1, "{g}");
    found[0]
}

/// Asserts the old lowering: each gradient in a dense buffer of its own, and a pad kernel.
fn assert_not_placed(g: &Graph) {
    let p = lowered(g);
    let call = backward(&p);
    let names: Vec<String> = call.grads().iter().map(|v| view(&p, v).0).collect();
    assert_eq!(names.len(), 3);
    assert!(names[0] != names[1] && names[1] != names[2] && names[0] != names[2], "{p}");
    for g in call.grads() {
        assert_eq!(view(&p, g).1, 0, "{p}");
        assert_eq!(view(&p, g).2, [2 * T * D, T * D, D, 1], "{p}");
    }
    assert_eq!(pad_kernels(&p), 1, "{p}");
}

#[test]
fn gpt2s_qkv_gradient_is_the_backward_calls_buffer() {
    // The QKV projection is an input: its gradient, a graph output, is the call's buffer.
    let g = gradient_graph(&gpt2_projected(), &[0, 1]);
    let p = lowered(&g);
    let call = backward(&p);
    // Element (b, h, t, d) of dq, dk, dv at b*T*3C + t*3C + h*D + d, past 0, C, 2C.
    let want = |offset| (p.buffer(p.outputs[1]).name.clone(), offset, vec![T * 3 * C, D, 3 * C, 1]);
    assert_eq!(view(&p, &call.dq), want(0), "{p}");
    assert_eq!(view(&p, &call.dk), want(C), "{p}");
    assert_eq!(view(&p, &call.dv), want(2 * C), "{p}");
    assert_eq!(p.buffer(p.outputs[1]).meta.shape, [B, T, 3 * C]);
    assert_eq!(pad_kernels(&p), 0, "{p}");
    // One buffer written, and the scheduler stores it once.
    let node =
        p.nodes.iter().find(|n| matches!(n.kind, LoopKind::Extern { call: ExternCall::AttentionBackward(_), .. }));
    assert_eq!(node.unwrap().writes(), [p.outputs[1]]);
    let schedule = crate::schedule(&p);
    let kernel = schedule.kernels.iter().find(|k| k.name.starts_with("ext_attention_backward")).unwrap();
    assert_eq!(kernel.stores.len(), 1, "{}", crate::print_schedule(&p, &schedule));
    // The printed program reads back.
    assert_eq!(LoopProgram::parse(&p.to_string()).unwrap(), p);
}

#[test]
fn a_projections_gradient_read_by_products_needs_no_kernel() {
    // GPT-2's training step: `x @ w` split into heads; the split's gradient is read by the
    // input and weight gradients' products.
    let g = gradient_graph(&attention(Heads::Projected), &[0, 1]);
    let p = lowered(&g);
    let call = backward(&p);
    let (dq, dk, dv) = (view(&p, &call.dq), view(&p, &call.dk), view(&p, &call.dv));
    assert_eq!((dq.1, dk.1, dv.1), (0, C, 2 * C), "{p}");
    assert!(dq.0 == dk.0 && dk.0 == dv.0, "{p}");
    for (_, _, strides) in [&dq, &dk, &dv] {
        assert_eq!(strides, &[T * 3 * C, D, 3 * C, 1], "{p}");
    }
    assert_eq!(pad_kernels(&p), 0, "{p}");
    let bmm_reads = |n: &&coil_ir::loops::LoopNode| match &n.kind {
        LoopKind::Extern { call: ExternCall::Bmm { .. }, inputs } => inputs.iter().any(|&b| p.buffer(b).name == dq.0),
        _ => false,
    };
    assert_eq!(p.nodes.iter().filter(bmm_reads).count(), 2, "dx and dw read the call's buffer: {p}");
}

#[test]
fn a_gradient_read_elsewhere_keeps_its_buffer() {
    let mut g = gradient_graph(&gpt2_projected(), &[0, 1]);
    let dq = gradient(&g, AttentionInput::Query);
    g.outputs.push(dq);
    assert_not_placed(&g);
}

#[test]
fn pads_by_other_values_or_overlapping_keep_the_kernel() {
    let g = gradient_graph(&gpt2_projected(), &[0, 1]);
    let pads = nodes(&g, |op| matches!(op, Op::Pad { .. }));
    assert_eq!(pads.len(), 3, "{g}");
    // A pad by ones.
    let mut ones = g.clone();
    let Op::Pad { value, .. } = &mut ones.nodes[pads[0].0].op else { unreachable!() };
    *value = Scalar::Float(1.0);
    assert_not_placed(&ones);
    // Two pads at the same place: they overlap (and a third of the sum is not covered, though
    // the sizes add up).
    let mut overlap = g.clone();
    let Op::Pad { pads: first, .. } = overlap.nodes[pads[0].0].op.clone() else { unreachable!() };
    let Op::Pad { pads: widths, .. } = &mut overlap.nodes[pads[1].0].op else { unreachable!() };
    *widths = first;
    assert_not_placed(&overlap);
}

#[test]
fn a_cast_between_the_gradient_and_the_pad_keeps_the_kernel() {
    // Heads cast from an f32 projection: the gradients are cast back to f32 before the pads.
    let g = gradient_graph(&attention(Heads::Cast), &[0]);
    assert!(!nodes(&g, |op| matches!(op, Op::Cast(DType::F32))).is_empty(), "{g}");
    assert_not_placed(&g);
}

#[test]
fn gradients_that_feed_no_sum_keep_buffers_of_their_own() {
    // q is an input of its own: dq is a graph output in its own buffer; dk and dv go into the
    // gradient of the `[B, T, 2C]` key/value projection.
    let g = gradient_graph(&attention(Heads::CrossKv), &[0, 1]);
    let p = lowered(&g);
    let call = backward(&p);
    let (dq, dk, dv) = (view(&p, &call.dq), view(&p, &call.dk), view(&p, &call.dv));
    assert_eq!(dq.0, p.buffer(p.outputs[1]).name, "{p}");
    assert_eq!((dq.1, dq.2), (0, vec![H * T * D, T * D, D, 1]), "{p}");
    assert_eq!(dk.0, p.buffer(p.outputs[2]).name, "{p}");
    assert_eq!(dk, (dv.0.clone(), 0, vec![T * 2 * C, D, 2 * C, 1]), "{p}");
    assert_eq!(dv.1, C, "{p}");
    assert_eq!(pad_kernels(&p), 0, "{p}");
    // The call writes two buffers, dq's first (the node's output).
    let node =
        p.nodes.iter().find(|n| matches!(n.kind, LoopKind::Extern { call: ExternCall::AttentionBackward(_), .. }));
    assert_eq!(node.unwrap().writes(), [p.outputs[1], p.outputs[2]]);
    assert_eq!(LoopProgram::parse(&p.to_string()).unwrap(), p);
}
