//! The attention matcher on captured graphs built as the frontend records them (GPT-2's
//! written-out attention, and its variants), checked on the printed graphs.

use super::*;
use crate::{decompose, decompose_with, lower, DecomposeOptions};
use coil_ir::loops::{ExternCall, LoopKind};
use coil_ir::{BinaryOp, DType, Graph, Op, Scalar, UnaryOp};

use crate::test_graph::{m, Capture};

/// How the test attention is written.
#[derive(Clone, Copy)]
struct Form {
    dtype: DType,
    /// `where(mask, s, -inf)` (Some(true)), `where(!mask, -inf, s)` (Some(false)), or no mask.
    mask: Option<bool>,
    /// Cast to f32 around the softmax (f16 / bf16).
    wide_softmax: bool,
    /// `s / sqrt(d)` instead of `s * (1 / sqrt(d))`.
    divide: bool,
    /// The probabilities are also a graph output.
    probs_out: bool,
    /// The causal mask's `tril` diagonal.
    tril_k: i64,
    /// The keep mask as `iota(col) <= iota(row)` instead of `tril(ones)`.
    iota_mask: bool,
    /// The merged heads go through a projection (a matrix product) instead of out.
    project: bool,
    /// With `wide_softmax`, the cast to f32 right after the product (scale and mask in f32).
    cast_first: bool,
    head_dim: usize,
}

const GPT2: Form = Form {
    dtype: DType::BF16,
    mask: Some(true),
    wide_softmax: true,
    divide: false,
    probs_out: false,
    tril_k: 0,
    iota_mask: false,
    project: false,
    cast_first: false,
    head_dim: 8,
};

/// GPT-2's attention as `examples/bench.rs` writes it: q, k, v are head views (slice, reshape,
/// transpose) of one `[B, T, 3C]` QKV projection (here an input), and the result is
/// transposed back and reshaped to `[B, T, C]`.
fn gpt2(form: Form) -> Graph {
    let (b, t, h, d) = (2, 5, 2, form.head_dim);
    let c = h * d;
    let mut g = Capture::new();
    let qkv = g.input(&[b, t, 3 * c], form.dtype);
    let head = |g: &mut Capture, i: usize| {
        let part = g.op(Op::Slice { dim: 2, start: i * c, len: c, step: 1 }, &[qkv]);
        let split = g.op(Op::Reshape { shape: vec![b, t, h, d] }, &[part]);
        g.permute(split, &[0, 2, 1, 3])
    };
    let (q, k, v) = (head(&mut g, 0), head(&mut g, 1), head(&mut g, 2));
    let kt = g.permute(k, &[0, 1, 3, 2]);
    let mut s = g.op(Op::Matmul, &[q, kt]);
    if form.wide_softmax && form.cast_first {
        s = g.op(Op::Cast(DType::F32), &[s]);
    }
    s = if form.divide {
        let c = g.scalar((d as f64).sqrt());
        g.op(Op::Binary(BinaryOp::Div), &[s, c])
    } else {
        let c = g.scalar(1.0 / (d as f64).sqrt());
        g.op(Op::Binary(BinaryOp::Mul), &[s, c])
    };
    if let Some(keep) = form.mask {
        let tril = if form.iota_mask {
            let rows = g.g.leaf(Op::Iota { dim: 0 }, m(&[t, t], DType::I64), None);
            let cols = g.g.leaf(Op::Iota { dim: 1 }, m(&[t, t], DType::I64), None);
            g.op(Op::Binary(BinaryOp::Le), &[cols, rows])
        } else {
            let ones = g.full(1, &[t, t], DType::Bool);
            g.op(Op::Tril { k: form.tril_k }, &[ones])
        };
        let ninf = g.scalar(f64::NEG_INFINITY);
        s = if keep {
            g.op(Op::Where, &[tril, s, ninf])
        } else {
            let drop = g.op(Op::Unary(UnaryOp::LogicalNot), &[tril]);
            g.op(Op::Where, &[drop, ninf, s])
        };
    }
    let probs = if form.wide_softmax {
        let up = if form.cast_first { s } else { g.op(Op::Cast(DType::F32), &[s]) };
        let p = g.op(Op::Softmax { dim: 3 }, &[up]);
        g.op(Op::Cast(form.dtype), &[p])
    } else {
        g.op(Op::Softmax { dim: 3 }, &[s])
    };
    let y = g.op(Op::Matmul, &[probs, v]);
    let yt = g.permute(y, &[0, 2, 1, 3]);
    let mut out = g.op(Op::Reshape { shape: vec![b, t, c] }, &[yt]);
    if form.project {
        let w = g.input(&[c, c], form.dtype);
        out = g.op(Op::Matmul, &[out, w]);
    }
    g.g.outputs.push(out);
    if form.probs_out {
        g.g.outputs.push(probs);
    }
    g.g
}

/// GPT-2's attention projected after the heads merge (`Form::project`), for the lowering's
/// tests of what the gradients of the QKV projection become.
pub(crate) fn gpt2_projected() -> Graph {
    gpt2(Form { project: true, ..GPT2 })
}

#[test]
fn gpt2_attention_becomes_one_node() {
    let g = gpt2(GPT2);
    let found = find_attention(&g);
    assert_eq!(found.len(), 1, "{g}");
    assert!(found[0].causal);
    assert_eq!(found[0].scale, 1.0 / 8f64.sqrt());
    assert_eq!(found[0].intermediates.len(), 6, "cast, softmax, cast, where, mul, matmul");
    let fused = fuse_attention(&g);
    assert_eq!(
        fused.to_string(),
        "\
graph(%0: bf16[2, 5, 48]) {
  %1: bf16[2, 5, 16] = slice(%0, dim=2, start=0, len=16, step=1)
  %2: bf16[2, 5, 2, 8] = reshape(%1, shape=[2, 5, 2, 8])
  %3: bf16[2, 2, 5, 8] = permute(%2, perm=[0, 2, 1, 3])
  %4: bf16[2, 5, 16] = slice(%0, dim=2, start=16, len=16, step=1)
  %5: bf16[2, 5, 2, 8] = reshape(%4, shape=[2, 5, 2, 8])
  %6: bf16[2, 2, 5, 8] = permute(%5, perm=[0, 2, 1, 3])
  %7: bf16[2, 5, 16] = slice(%0, dim=2, start=32, len=16, step=1)
  %8: bf16[2, 5, 2, 8] = reshape(%7, shape=[2, 5, 2, 8])
  %9: bf16[2, 2, 5, 8] = permute(%8, perm=[0, 2, 1, 3])
  %10: bf16[2, 2, 5, 8] = scaled_dot_product_attention(%3, %6, %9, causal=true, scale=0.35355339059327373, mask=false)
  %11: bf16[2, 5, 2, 8] = permute(%10, perm=[0, 2, 1, 3])
  %12: bf16[2, 5, 16] = reshape(%11, shape=[2, 5, 16])
  return (%12)
}
"
    );
}

#[test]
fn variants_that_mean_the_same_match() {
    // f32 without casts, `s / sqrt(d)`, and `masked_fill(~mask, -inf)` written as a where.
    let f32 = Form { dtype: DType::F32, wide_softmax: false, divide: true, mask: Some(false), ..GPT2 };
    let found = find_attention(&gpt2(f32));
    assert_eq!(found.len(), 1);
    assert!(found[0].causal);
    assert!((found[0].scale - 1.0 / 8f64.sqrt()).abs() < 1e-15);
    // A bf16 softmax without the f32 detour; no mask (not causal).
    let plain = Form { wide_softmax: false, mask: None, ..GPT2 };
    let found = find_attention(&gpt2(plain));
    assert_eq!(found.len(), 1);
    assert!(!found[0].causal);
    // The cast to f32 first (scale and mask in f32), as `tests/kernels.rs` writes it.
    let found = find_attention(&gpt2(Form { cast_first: true, ..GPT2 }));
    assert_eq!(found.len(), 1);
    assert!(found[0].causal);
    // f16 and larger head dims.
    for d in [32, 64, 128] {
        assert_eq!(find_attention(&gpt2(Form { dtype: DType::F16, head_dim: d, ..GPT2 })).len(), 1, "d = {d}");
    }
}

#[test]
fn an_intermediate_that_is_also_an_output_keeps_the_graph() {
    let g = gpt2(Form { probs_out: true, ..GPT2 });
    assert!(find_attention(&g).is_empty());
    assert_eq!(fuse_attention(&g), g);
}

#[test]
fn masks_other_than_causal_do_not_match() {
    for k in [-1, 1] {
        assert!(find_attention(&gpt2(Form { tril_k: k, ..GPT2 })).is_empty(), "tril(k={k})");
    }
    // triu(ones, 0) keeps col >= row: not causal.
    let mut g = gpt2(GPT2);
    let tril = g.nodes.iter().position(|n| matches!(n.op, Op::Tril { .. })).unwrap();
    g.nodes[tril].op = Op::Triu { k: 0 };
    assert!(find_attention(&g).is_empty());
    // triu(ones, 1) is what is dropped: `where(triu(ones, 1), -inf, s)` is causal.
    g.nodes[tril].op = Op::Triu { k: 1 };
    let w = g.nodes.iter().position(|n| n.op == Op::Where).unwrap();
    g.nodes[w].inputs.swap(1, 2);
    let found = find_attention(&g);
    assert_eq!(found.len(), 1);
    assert!(found[0].causal);
    // A where with a finite value is not a mask.
    let ninf = g.nodes.iter().position(|n| n.op == Op::Scalar(Scalar::Float(f64::NEG_INFINITY))).unwrap();
    g.nodes[ninf].op = Op::Scalar(Scalar::Float(-1e9));
    assert!(find_attention(&g).is_empty());
}

#[test]
fn the_decompositions_own_iota_mask_matches() {
    // `where(iota(col) <= iota(row), s, -inf)`, as `nn::attention` builds it.
    let found = find_attention(&gpt2(Form { iota_mask: true, ..GPT2 }));
    assert_eq!(found.len(), 1);
    assert!(found[0].causal);
}

#[test]
fn dtypes_and_shapes_outside_the_template_do_not_match() {
    // The probabilities cast to f16 for bf16 values.
    let mut g = gpt2(GPT2);
    let back = g.nodes.iter().rposition(|n| n.op == Op::Cast(DType::BF16)).unwrap();
    g.nodes[back].op = Op::Cast(DType::F16);
    g.nodes[back].meta.dtype = DType::F16;
    assert!(find_attention(&g).is_empty());
    // Head dims the template does not run.
    for d in [4, 12, 136] {
        assert!(find_attention(&gpt2(Form { head_dim: d, ..GPT2 })).is_empty(), "d = {d}");
    }
    // f64 stays decomposed.
    assert!(find_attention(&gpt2(Form { dtype: DType::F64, wide_softmax: false, ..GPT2 })).is_empty());
    // A softmax over another dim.
    let mut g = gpt2(GPT2);
    let sm = g.nodes.iter().position(|n| matches!(n.op, Op::Softmax { .. })).unwrap();
    g.nodes[sm].op = Op::Softmax { dim: 2 };
    assert!(find_attention(&g).is_empty());
    // Keys not transposed (a product with k itself, s = L = 5, d = 8 mismatched).
    assert!(
        template_supports(&m(&[2, 5, 8], DType::F32), &m(&[2, 6, 8], DType::F32), &m(&[2, 6, 16], DType::F32)).is_err()
    );
    assert!(
        template_supports(&m(&[2, 5, 8], DType::F32), &m(&[1, 6, 8], DType::F32), &m(&[2, 6, 8], DType::F32)).is_err()
    );
    assert!(template_supports(&m(&[5, 8], DType::F32), &m(&[6, 8], DType::F32), &m(&[6, 8], DType::F32)).is_err());
    assert!(
        template_supports(&m(&[2, 5, 8], DType::F32), &m(&[2, 6, 8], DType::F32), &m(&[2, 6, 8], DType::F32)).is_ok()
    );
}

#[test]
fn the_compile_path_keeps_the_template_and_the_reference_decomposes_it() {
    let g = gpt2(GPT2);
    let is_attention = |g: &Graph| g.nodes.iter().any(|n| n.op.is_template());
    let reference = decompose(&g).unwrap();
    assert!(!is_attention(&reference));
    reference.verify_primitive().unwrap();
    let fused = decompose_with(
        &g,
        &DecomposeOptions { fused_attention: true, keep_detach: false, half_products: false, conv_template: false },
    )
    .unwrap();
    fused.verify_primitive().unwrap();
    assert!(is_attention(&fused), "{fused}");
    // A user's scaled_dot_product_attention with an unsupported head dim is decomposed.
    let mut c = Capture::new();
    let q = c.input(&[2, 3, 5, 12], DType::F32);
    let y = c.op(Op::Attention { causal: true, scale: None, mask: false, dropout: None }, &[q, q, q]);
    c.g.outputs.push(y);
    let p = decompose_with(
        &c.g,
        &DecomposeOptions { fused_attention: true, keep_detach: false, half_products: false, conv_template: false },
    )
    .unwrap();
    assert!(!is_attention(&p), "{p}");
}

#[test]
fn lowering_makes_one_call_on_the_head_views_writing_the_transposed_layout() {
    let g = gpt2(Form { project: true, ..GPT2 });
    let fused = decompose_with(
        &g,
        &DecomposeOptions { fused_attention: true, keep_detach: false, half_products: false, conv_template: false },
    )
    .unwrap();
    let (fused, _) = crate::simplify(&fused, &crate::RewriteOptions::default()).unwrap();
    let p = lower(&fused).unwrap();
    let calls: Vec<&ExternCall> = p
        .nodes
        .iter()
        .filter_map(|n| match &n.kind {
            LoopKind::Extern { call: call @ ExternCall::Attention(_), .. } => Some(call),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 1, "{p}");
    let ExternCall::Attention(call) = calls[0] else { unreachable!() };
    let coil_ir::loops::AttentionCall { q, k, v, out, .. } = &**call;
    // Head views of the QKV input: strides [T*3C, D, 3C, 1], offsets 0, C, 2C; no copies.
    assert_eq!(p.nodes.len(), 3, "the call, the projection, the output copy: {p}");
    let strides = |o: &coil_ir::loops::StridedOperand| {
        let o = o.to_usize().unwrap();
        (o.offset, o.batch_strides, o.row_stride, o.col_stride)
    };
    assert_eq!(strides(q), (0, vec![240, 8], 48, 1));
    assert_eq!(strides(k), (16, vec![240, 8], 48, 1));
    assert_eq!(strides(v), (32, vec![240, 8], 48, 1));
    // The result goes straight into `[B, T, H, D]` (the transpose back costs nothing).
    assert_eq!(strides(out), (0, vec![80, 8], 16, 1));
    assert_eq!(
        p.to_string(),
        "\
inputs: arg0, arg1
  arg0: bf16[2, 5, 48]
  arg1: bf16[16, 16]
buf0: bf16[2, 5, 2, 8] = extern attention causal scale=0.35355339059327373 batch=[2, 2] l=5 s=5 d=8 out=[80, 8, 16, 1](arg0, arg0, arg0) origins=[scaled_dot_product_attention]
    q = view(arg0, offset=0, strides=[240, 8, 48, 1])
    k = view(arg0, offset=16, strides=[240, 8, 48, 1])
    v = view(arg0, offset=32, strides=[240, 8, 48, 1])
    out = view(buf0, offset=0, strides=[80, 8, 16, 1])
buf1: bf16[10, 16] = extern bmm batch=[] m=10 n=16 k=16(buf0, arg1) origins=[bmm]
    a = view(buf0, offset=0, strides=[16, 1])
    b = view(arg1, offset=0, strides=[16, 1])
buf2: bf16[2, 5, 16] = pointwise ranges=[2, 5, 16] origins=[reshape]
    v0: bf16 = load(buf1, 80*x0 + 16*x1 + x2)
    return v0
outputs: buf2
"
    );
}

/// The compile path's options, and the gradient decomposition's (`value_and_grad`).
const COMPILE: DecomposeOptions =
    DecomposeOptions { fused_attention: true, keep_detach: false, half_products: false, conv_template: false };
const GRADIENTS: DecomposeOptions =
    DecomposeOptions { fused_attention: true, keep_detach: true, half_products: true, conv_template: false };

/// `sum(cast(graph's first output, f32))` differentiated with respect to the inputs `wrt` (by
/// index) as `value_and_grad` does it, then decomposed as the compile path does: the loss and
/// the gradients are the outputs.
pub(crate) fn differentiated(g: &Graph, wrt: &[usize]) -> Graph {
    let mut p = decompose_with(g, &GRADIENTS).unwrap();
    let y = p.outputs[0];
    let rank = p.meta(y).rank();
    let wide = p.push(Op::Cast(DType::F32), &[y], None).unwrap();
    let loss = p
        .push(Op::Reduce { op: coil_ir::ReduceOp::Sum, dims: (0..rank).collect(), keepdim: false }, &[wide], None)
        .unwrap();
    let targets: Vec<_> = wrt.iter().map(|&i| p.inputs[i]).collect();
    let grads = crate::autodiff::backward(&mut p, loss, None, &targets).unwrap();
    p.outputs = std::iter::once(loss).chain(grads).collect();
    let p = decompose_with(&p, &COMPILE).unwrap();
    p.verify_primitive().unwrap();
    p
}

fn count(g: &Graph, f: impl Fn(&Op) -> bool) -> usize {
    g.live_nodes().iter().filter(|&&n| f(&g.node(n).op)).count()
}

/// The extern calls of a program, printed.
fn calls(p: &coil_ir::loops::LoopProgram) -> Vec<String> {
    let text = p.to_string();
    text.lines().filter(|l| l.contains(" = extern attention")).map(str::to_string).collect()
}

#[test]
fn gradients_of_the_template_are_templates_and_lower_to_one_call_each_way() {
    let g = gpt2(Form { project: true, ..GPT2 });
    let p = differentiated(&g, &[0, 1]);
    assert_eq!(count(&p, |op| matches!(op, Op::Attention { .. })), 1, "{p}");
    assert_eq!(count(&p, |op| matches!(op, Op::AttentionLogsumexp { .. })), 1, "{p}");
    assert_eq!(count(&p, |op| matches!(op, Op::AttentionBackward { .. })), 3, "{p}");
    // No softmax, no exp: neither direction computes the probabilities outside the calls.
    assert_eq!(count(&p, |op| matches!(op, Op::Unary(UnaryOp::Exp))), 0, "{p}");
    // One reduction, the loss: the backward call computes `delta = sum(grad_out * out, -1)`
    // itself (from the output it reads), so the graph has no reduction for it.
    assert_eq!(count(&p, |op| matches!(op, Op::Reduce { .. })), 1, "{p}");
    let (p, _) = crate::simplify(&p, &crate::RewriteOptions::default()).unwrap();
    let program = lower(&p).unwrap();
    let reductions = program.nodes.iter().filter(|n| matches!(n.kind, coil_ir::loops::LoopKind::Reduction { .. }));
    assert_eq!(reductions.count(), 1, "{program}");
    // One call each way: the forward writes its output (in the layout the projection reads,
    // the buffer of the permute after it: no copy) and the logsumexp, the backward the three
    // gradients (straight into the QKV input's gradient, `lower::concat_views`), each reading
    // q, k and v in place (the QKV input's head views) and the backward the output's gradient
    // (buf4, the projection's) through its transposed view and the output (buf0) through its
    // permuted one.
    assert_eq!(
        calls(&program),
        [
            "buf0: bf16[2, 5, 2, 8], buf0_lse: f32[2, 2, 5] = extern attention causal scale=0.35355339059327373 batch=[2, 2] l=5 s=5 d=8 out=[80, 8, 16, 1](arg0, arg0, arg0) origins=[scaled_dot_product_attention, attention_logsumexp]",
            "buf6: bf16[2, 5, 48] = extern attention_backward causal scale=0.35355339059327373 batch=[2, 2] l=5 s=5 d=8 grads=[q, k, v] dq=[240, 8, 48, 1] dk=[240, 8, 48, 1]+16 dv=[240, 8, 48, 1]+32(arg0, arg0, arg0, buf4, buf0_lse, buf0) origins=[attention_backward]",
        ],
        "{program}"
    );
    assert!(program.to_string().contains("out = view(buf0, offset=0, strides=[80, 8, 16, 1])"), "{program}");
    let copies = program.nodes.iter().filter(|n| n.origins == ["permute"] || n.origins == ["permute", "reshape"]);
    assert_eq!(copies.count(), 0, "{program}");
    assert!(!program.buffers.iter().any(|b| b.meta.shape.ends_with(&[5, 5])), "{program}");
    // The scheduler keeps each call a kernel of its own that stores everything it writes.
    let schedule = crate::schedule(&program);
    let backward = schedule.kernels.iter().find(|k| k.name.starts_with("ext_attention_backward")).unwrap();
    assert_eq!(backward.stores.len(), 1, "the three gradients are one buffer");
    let forward = schedule.kernels.iter().find(|k| k.name.starts_with("ext_attention_")).unwrap();
    assert_eq!(forward.stores.len(), 2, "{}", crate::print_schedule(&program, &schedule));
}

#[test]
fn only_the_wanted_gradients_are_computed() {
    // d/dv alone: one backward node, and a call writing dv only.
    let mut c = Capture::new();
    let (q, k, v) =
        (c.input(&[2, 7, 16], DType::F32), c.input(&[2, 9, 16], DType::F32), c.input(&[2, 9, 16], DType::F32));
    let y = c.op(Op::Attention { causal: false, scale: Some(0.5), mask: false, dropout: None }, &[q, k, v]);
    let p = differentiated(&c.out(&[y]), &[2]);
    let backward: Vec<&Op> =
        p.nodes.iter().map(|n| &n.op).filter(|op| matches!(op, Op::AttentionBackward { .. })).collect();
    assert_eq!(
        backward,
        [&Op::AttentionBackward {
            causal: false,
            scale: Some(0.5),
            input: coil_ir::AttentionInput::Value,
            mask: false,
            dropout: None,
        }]
    );
    let program = lower(&p).unwrap();
    let text = calls(&program).join("\n");
    // The output gradient is ones (a constant read through zero strides); no reduction but
    // the loss's (the call computes delta itself).
    let want = "buf3: f32[2, 9, 16] = extern attention_backward scale=0.5 batch=[2] l=7 s=9 d=16 grads=[v]";
    assert!(text.contains(want), "{program}");
}

#[test]
fn the_gradient_decomposition_expands_the_backward_templates() {
    // Gradients of gradients: the backward templates have no rule of their own, so a graph
    // decomposed to be differentiated expands them (and keeps the forward template).
    let mut c = Capture::new();
    let q = c.input(&[2, 3, 5, 8], DType::F32);
    let y = c.op(Op::Attention { causal: true, scale: None, mask: false, dropout: None }, &[q, q, q]);
    let p = differentiated(&c.out(&[y]), &[0]);
    let again = decompose_with(&p, &GRADIENTS).unwrap();
    assert_eq!(count(&again, |op| matches!(op, Op::Attention { .. })), 1, "{again}");
    assert_eq!(count(&again, |op| matches!(op, Op::AttentionBackward { .. } | Op::AttentionLogsumexp { .. })), 0);
    // The reference decomposition expands them all.
    assert_eq!(count(&decompose(&p).unwrap(), |op| op.is_template()), 0);
}

#[test]
fn a_logsumexp_without_its_attention_gets_a_call_of_its_own() {
    let mut c = Capture::new();
    let (q, k) = (c.input(&[3, 4, 8], DType::F16), c.input(&[3, 6, 8], DType::F16));
    let lse = c.op(Op::AttentionLogsumexp { causal: true, scale: None, mask: false }, &[q, k, k]);
    let p = decompose_with(&c.out(&[lse]), &COMPILE).unwrap();
    let program = lower(&p).unwrap();
    // The call's output goes to a buffer nothing reads; the logsumexp is the graph's output.
    assert_eq!(
        calls(&program),
        ["buf0: f16[3, 4, 8], buf0_lse: f32[3, 4] = extern attention causal scale=0.35355339059327373 batch=[3] l=4 s=6 d=8(arg0, arg1, arg1) origins=[attention_logsumexp]"],
        "{program}"
    );
    assert_eq!(program.buffer(program.outputs[0]).name, "buf0_lse");
}

/// Masked attention `[2, 2, 40, 16]` against 24 keys, the mask an input of `mask_meta`.
fn masked(mask_meta: TensorMeta) -> Graph {
    let mut g = Graph::new();
    let q = g.input(TensorMeta::new(vec![2, 2, 40, 16], DType::F32));
    let k = g.input(TensorMeta::new(vec![2, 2, 24, 16], DType::F32));
    let v = g.input(TensorMeta::new(vec![2, 2, 24, 16], DType::F32));
    let m = g.input(mask_meta);
    let y =
        g.push(Op::Attention { causal: false, scale: None, mask: true, dropout: None }, &[q, k, v, m], None).unwrap();
    g.outputs.push(y);
    g
}

#[test]
fn masked_attention_gradients_are_templates_reading_the_mask() {
    // 40 rows: more than a forward-only graph keeps masked, but its gradients are templates.
    let p = differentiated(&masked(TensorMeta::new(vec![2, 1, 40, 24], DType::Bool)), &[0, 1, 2]);
    assert_eq!(count(&p, |op| matches!(op, Op::Attention { mask: true, .. })), 1, "{p}");
    assert_eq!(count(&p, |op| matches!(op, Op::AttentionLogsumexp { mask: true, .. })), 1, "{p}");
    assert_eq!(count(&p, |op| matches!(op, Op::AttentionBackward { mask: true, .. })), 3, "{p}");
    assert_eq!(count(&p, |op| matches!(op, Op::Unary(UnaryOp::Exp))), 0, "{p}");
    let program = lower(&p).unwrap();
    let calls = calls(&program);
    assert_eq!(calls.len(), 2, "{program}");
    // One forward call writing the logsumexp, one backward call; both read the mask in place,
    // broadcast over the heads (stride 0).
    assert!(calls[0].contains("_lse") && calls[1].contains("extern attention_backward"), "{calls:?}");
    assert!(calls.iter().all(|c| c.contains(" mask=[960, 0, 24, 1]")), "{calls:?}");
}

#[test]
fn a_learned_added_mask_takes_the_decomposition_for_its_gradients() {
    let p = differentiated(&masked(TensorMeta::new(vec![40, 24], DType::F32)), &[0, 1, 2, 3]);
    assert_eq!(count(&p, |op| matches!(op, Op::AttentionBackward { .. })), 0, "{p}");
    assert_eq!(p.outputs.len(), 5);
    assert_eq!(p.meta(p.outputs[4]), &TensorMeta::new(vec![40, 24], DType::F32));
    // Without the mask's gradient, the templates again.
    let p = differentiated(&masked(TensorMeta::new(vec![40, 24], DType::F32)), &[0, 1, 2]);
    assert_eq!(count(&p, |op| matches!(op, Op::AttentionBackward { mask: true, .. })), 3, "{p}");
}

// ---- the e-graph stage that chooses the template (`crate::templates`) ----

#[test]
fn the_stage_names_each_rule_and_counts_its_firings() {
    let (fused, report) = fuse_attention_report(&gpt2(GPT2));
    assert_eq!(fused, fuse_attention(&gpt2(GPT2)));
    // One step each: the scores, the scale, the mask, the cast up, the template.
    for rule in ["attention-scores", "attention-scale", "attention-causal", "attention-f32-softmax", "attention"] {
        assert_eq!(report.fired(rule), 1, "{rule}:\n{report}");
    }
    assert_eq!((report.chosen, report.refused), (1, 0), "{report}");
    assert!(report.to_string().contains("  attention-causal: 1\n"), "{report}");
    // Without a mask or casts, only the steps that are there fire.
    let (_, report) = fuse_attention_report(&gpt2(Form { wide_softmax: false, mask: None, ..GPT2 }));
    assert_eq!(report.fired("attention-causal") + report.fired("attention-f32-softmax"), 0, "{report}");
    assert_eq!(report.fired("attention"), 1, "{report}");
    // A graph without a softmax is not put into an e-graph.
    let mut c = Capture::new();
    let x = c.input(&[4, 4], DType::F32);
    let y = c.op(Op::Matmul, &[x, x]);
    let (_, report) = fuse_attention_report(&c.out(&[y]));
    assert_eq!((report.region_nodes, report.iterations), (0, 0), "{report}");
}

/// Causal attention `[1, 2, t, 64]` in f32 whose probabilities are a graph output too (or, with
/// `read`, summed by another node instead).
fn probabilities_needed(t: usize, read: bool) -> Graph {
    let mut c = Capture::new();
    let (y, p, s) = crate::templates::tests::chain_with_scores(&mut c, t, DType::F32);
    if read {
        let e = c.op(Op::Unary(UnaryOp::Exp), &[s]);
        c.out(&[y, e])
    } else {
        c.out(&[y, p])
    }
}

#[test]
fn a_chain_node_needed_elsewhere_keeps_the_chain_at_every_size() {
    for t in [16, 2048] {
        for read in [false, true] {
            let g = probabilities_needed(t, read);
            let (fused, report) = fuse_attention_report(&g);
            assert_eq!(fused, g, "t = {t}, read = {read}:\n{report}");
            assert_eq!(report.fired("attention"), 1, "the rules match; extraction decides:\n{report}");
            assert_eq!(report.chosen, 0, "{report}");
        }
    }
    // At 16 tokens the cost model itself keeps the product of the probabilities; at 2048 it
    // would recompute the scores (fewer bytes than reading 2048 x 2048 probabilities), which
    // the stage refuses.
    assert_eq!(fuse_attention_report(&probabilities_needed(16, false)).1.refused, 0);
    assert_eq!(fuse_attention_report(&probabilities_needed(2048, false)).1.refused, 1);
    // Nothing else needed: the template.
    let mut g = probabilities_needed(2048, false);
    g.outputs.pop();
    assert_eq!(find_attention(&g).len(), 1);
}

#[test]
fn the_stage_is_deterministic() {
    let g = gpt2(Form { project: true, ..GPT2 });
    let (first, report) = fuse_attention_report(&g);
    for _ in 0..5 {
        let (again, r) = fuse_attention_report(&g);
        assert_eq!(again, first);
        assert_eq!(
            (r.fired.clone(), r.egraph_nodes, r.iterations),
            (report.fired.clone(), report.egraph_nodes, report.iterations)
        );
    }
}
