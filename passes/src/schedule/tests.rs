//! Scheduler tests: the fused kernels of common blocks (printed schedules as snapshots, checked
//! by eye), each refusal reason, the memory plan, determinism.

use super::{print_schedule, schedule};
use crate::lower::tests::lowered_composite;
use coil_ir::kernel::{KernelKind, Schedule};
use coil_ir::loops::{ExternCall, LoopKind, LoopProgram};
use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, TensorMeta, UnaryOp};

const F32: DType = DType::F32;

fn m(shape: &[usize]) -> TensorMeta {
    TensorMeta::new(shape.to_vec(), F32)
}

fn op(g: &mut Graph, op: Op, inputs: &[NodeId]) -> NodeId {
    g.push(op, inputs, None).unwrap()
}

/// Decomposes, lowers and schedules; checks that every scheduled node is in exactly one kernel.
fn scheduled(g: Graph, outputs: &[NodeId]) -> (LoopProgram, Schedule, String) {
    let p = lowered_composite(g, outputs);
    let s = schedule(&p);
    let mut seen: Vec<usize> = s.kernels.iter().flat_map(|k| k.nodes.clone()).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..p.nodes.len()).collect::<Vec<_>>(), "{p}");
    let text = print_schedule(&p, &s);
    (p, s, text)
}

fn snap(name: &str, text: &str) {
    insta::with_settings!({ snapshot_path => "../snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(name, text);
    });
}

fn names(s: &Schedule) -> Vec<&str> {
    s.kernels.iter().map(|k| k.name.as_str()).collect()
}

fn layer_norm(g: &mut Graph, x: NodeId, c: usize) -> NodeId {
    let w = g.input(m(&[c]));
    let b = g.input(m(&[c]));
    op(g, Op::LayerNorm { ndim: 1, eps: 1e-5, weight: true, bias: true }, &[x, w, b])
}

#[test]
fn softmax_is_one_persistent_reduction() {
    let mut g = Graph::new();
    let x = g.input(m(&[2, 5]));
    let y = op(&mut g, Op::Softmax { dim: 1 }, &[x]);
    let (_, s, text) = scheduled(g, &[y]);
    snap("schedule_softmax", &text);
    assert_eq!(s.kernels.len(), 1, "{text}");
    assert_eq!(s.kernels[0].kind, KernelKind::PersistentReduction);
    assert!(s.refusals.is_empty(), "{text}");
}

#[test]
fn layer_norm_is_one_kernel() {
    let mut g = Graph::new();
    let x = g.input(m(&[4, 8]));
    let y = layer_norm(&mut g, x, 8);
    let (_, s, text) = scheduled(g, &[y]);
    snap("schedule_layer_norm", &text);
    assert_eq!(names(&s), ["per_fused_add_div_mul_rsqrt_sub_0"], "{text}");
}

#[test]
fn residual_add_and_layer_norm_is_one_kernel_storing_both() {
    let mut g = Graph::new();
    let x = g.input(m(&[4, 8]));
    let r = g.input(m(&[4, 8]));
    let h = op(&mut g, Op::Binary(BinaryOp::Add), &[x, r]);
    let y = layer_norm(&mut g, h, 8);
    let (p, s, text) = scheduled(g, &[h, y]);
    snap("schedule_add_layer_norm", &text);
    assert_eq!(s.kernels.len(), 1, "{text}");
    assert_eq!(s.kernels[0].stores, p.outputs, "{text}");
}

#[test]
fn bias_gelu_is_one_pointwise_kernel() {
    let mut g = Graph::new();
    let x = g.input(m(&[4, 8]));
    let b = g.input(m(&[8]));
    let h = op(&mut g, Op::Binary(BinaryOp::Add), &[x, b]);
    let y = op(&mut g, Op::Gelu { tanh: false }, &[h]);
    let (_, s, text) = scheduled(g, &[y]);
    snap("schedule_bias_gelu", &text);
    assert_eq!(s.kernels.len(), 1, "{text}");
    assert_eq!(s.kernels[0].kind, KernelKind::Pointwise);
}

#[test]
fn log_softmax_and_rms_norm_are_one_kernel_each() {
    for composite in [Op::LogSoftmax { dim: 1 }, Op::RmsNorm { ndim: 1, eps: None, weight: false }] {
        let mut g = Graph::new();
        let x = g.input(m(&[3, 16]));
        let y = op(&mut g, composite, &[x]);
        let (_, s, text) = scheduled(g, &[y]);
        assert_eq!(s.kernels.len(), 1, "{text}");
        assert_eq!(s.kernels[0].kind, KernelKind::PersistentReduction, "{text}");
    }
}

#[test]
fn long_rows_are_looped_reductions() {
    let mut g = Graph::new();
    let x = g.input(m(&[2, 4096]));
    let y = op(&mut g, Op::Softmax { dim: 1 }, &[x]);
    let (_, s, text) = scheduled(g, &[y]);
    assert_eq!(names(&s), ["red_fused_amax_div_exp_sub_sum_0"], "{text}");
}

#[test]
fn matmul_bias_relu_is_a_bmm_with_bias_and_one_pointwise_kernel() {
    let mut g = Graph::new();
    let x = g.input(m(&[4, 8]));
    let w = g.input(m(&[8, 6]));
    let b = g.input(m(&[6]));
    let y = op(&mut g, Op::Matmul, &[x, w]);
    let y = op(&mut g, Op::Binary(BinaryOp::Add), &[y, b]);
    let y = op(&mut g, Op::Relu, &[y]);
    let (_, s, text) = scheduled(g, &[y]);
    snap("schedule_matmul_bias_relu", &text);
    // The bias add is the product's epilogue; the relu is the only generated kernel.
    assert_eq!(names(&s), ["ext_bmm_0", "poi_fused_le_lt_where_1"], "{text}");
    assert_eq!(s.refusals.len(), 1, "{text}");
    assert_eq!(s.refusals[0].reason, "extern call");
}

#[test]
fn column_and_row_sums_stay_apart() {
    let mut g = Graph::new();
    let x = g.input(m(&[4, 6]));
    let cols = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[x]);
    let rows = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[x]);
    let (_, s, text) = scheduled(g, &[cols, rows]);
    snap("schedule_column_row_sums", &text);
    assert_eq!(s.kernels.len(), 2, "{text}");
    assert_eq!(s.refusals.len(), 1, "{text}");
    assert_eq!((s.refusals[0].producer.as_str(), s.refusals[0].reason.as_str()), ("buf0", "iteration spaces differ"));
}

/// `w_i - g_i / |a|` for 8 tensors, as a clipped optimizer step: the norm's reduction of one
/// row keeps its scalar consumers, but updating 8 other tensors (16 buffers read) is a kernel
/// of its own, not the one-block kernel of the reduction; a softmax of one row stays one kernel.
#[test]
fn a_one_row_reduction_reads_few_buffers() {
    let mut g = Graph::new();
    let a = g.input(m(&[16]));
    let sq = op(&mut g, Op::Binary(BinaryOp::Mul), &[a, a]);
    let total = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[sq]);
    let norm = op(&mut g, Op::Unary(UnaryOp::Sqrt), &[total]);
    let mut outputs = vec![];
    for _ in 0..8 {
        let (w, grad) = (g.input(m(&[16])), g.input(m(&[16])));
        let step = op(&mut g, Op::Binary(BinaryOp::Div), &[grad, norm]);
        outputs.push(op(&mut g, Op::Binary(BinaryOp::Sub), &[w, step]));
    }
    let (_, s, text) = scheduled(g, &outputs);
    assert_eq!(s.kernels[0].kind, KernelKind::PersistentReduction, "{text}");
    let in_reduction = s.kernels[0].nodes.len();
    assert!(in_reduction <= 1 + 4, "{text}");
    assert!(s.refusals.iter().any(|r| r.reason == "one-row reduction reads too many buffers"), "{text}");

    let mut g = Graph::new();
    let x = g.input(m(&[1, 16]));
    let y = op(&mut g, Op::Softmax { dim: 1 }, &[x]);
    let y = layer_norm(&mut g, y, 16);
    let (_, s, text) = scheduled(g, &[y]);
    assert_eq!(s.kernels.len(), 1, "{text}");
}

#[test]
fn transposed_read_is_an_index_mismatch() {
    let mut g = Graph::new();
    let x = g.input(m(&[3, 4]));
    let y = op(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let t = op(&mut g, Op::Permute { perm: vec![1, 0] }, &[y]);
    let z = op(&mut g, Op::Unary(UnaryOp::Neg), &[t]);
    let (_, s, text) = scheduled(g, &[y, z]);
    assert_eq!(s.kernels.len(), 2, "{text}");
    assert_eq!(s.refusals[0].reason, "index mismatch", "{text}");
}

#[test]
fn gathered_buffer_is_an_index_mismatch() {
    let mut g = Graph::new();
    let x = g.input(m(&[4, 5]));
    let i = g.input(TensorMeta::new(vec![4, 5], DType::I64));
    // (A gather of a unary op gathers its operand instead; a binary op is realized.)
    let e = op(&mut g, Op::Binary(BinaryOp::Add), &[x, x]);
    let y = op(&mut g, Op::Gather { dim: 1 }, &[e, i]);
    let (_, s, text) = scheduled(g, &[y]);
    assert_eq!(s.kernels.len(), 2, "{text}");
    assert_eq!(s.refusals[0].reason, "index mismatch", "{text}");
}

#[test]
fn path_through_an_extern_would_create_a_cycle() {
    let mut g = Graph::new();
    let x = g.input(m(&[4, 4]));
    let w = g.input(m(&[4, 4]));
    let e = op(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let y = op(&mut g, Op::Matmul, &[e, w]);
    let z = op(&mut g, Op::Binary(BinaryOp::Add), &[e, y]);
    let (_, s, text) = scheduled(g, &[z]);
    assert_eq!(s.kernels.len(), 3, "{text}");
    assert!(text.contains("buf0 -> buf2: would create cycle"), "{text}");
}

#[test]
fn memory_plan_reuses_a_dead_temporary() {
    let mut g = Graph::new();
    let x = g.input(m(&[4, 4]));
    let w = g.input(m(&[4, 4]));
    let mut y = x;
    for _ in 0..2 {
        let mm = op(&mut g, Op::Matmul, &[y, w]);
        y = op(&mut g, Op::Relu, &[mm]);
    }
    let y = op(&mut g, Op::Matmul, &[y, w]);
    let (p, s, text) = scheduled(g, &[y]);
    snap("schedule_memory_reuse", &text);
    // Each relu writes in place over the product it reads (which dies there); each product
    // takes the slot the previous relu's value leaves when the product has read it.
    assert_eq!(s.memory.slots, vec![64, 64], "{text}");
    let slot = |k: usize| s.memory.slot_of[p.nodes[k].output.0];
    assert_eq!([slot(0), slot(1), slot(2), slot(3), slot(4)], [Some(0), Some(0), Some(1), Some(1), None]);
    assert_eq!(s.memory.peak_bytes, 128);
}

#[test]
fn memory_plan_writes_in_place_only_at_the_index_read() {
    // relu(mm) reads mm where it writes: in place. exp(mm^T) reads mm transposed: another
    // thread's element may be overwritten first, so it takes a slot of its own.
    for transposed in [false, true] {
        let mut g = Graph::new();
        let x = g.input(m(&[4, 4]));
        let w = g.input(m(&[4, 4]));
        let mm = op(&mut g, Op::Matmul, &[x, w]);
        let v = if transposed { op(&mut g, Op::Permute { perm: vec![1, 0] }, &[mm]) } else { mm };
        let y = op(&mut g, Op::Unary(UnaryOp::Exp), &[v]);
        let z = op(&mut g, Op::Matmul, &[y, w]);
        let (p, s, text) = scheduled(g, &[z]);
        let slot = |b: coil_ir::loops::BufferId| s.memory.slot_of[b.0];
        let exp = s.kernels.iter().find(|k| k.kind == KernelKind::Pointwise).expect("a pointwise kernel");
        let bmm = p.nodes[s.kernels[0].nodes[0]].output;
        assert_eq!(slot(exp.stores[0]) == slot(bmm), !transposed, "{text}");
    }
}

#[test]
fn a_ready_kernel_that_frees_memory_launches_first() {
    // h and g are matrix products (temporaries); out1 = (g @ w) @ w is a chain, out2 =
    // sum(h * g) reads both. In node order the chain comes first and keeps h alive through it;
    // the reduction is the last reader of h and stores one row, so it launches as soon as it is
    // ready (how a weight gradient frees its activation early in a backward pass).
    let mut g = Graph::new();
    let x = g.input(m(&[64, 64]));
    let w = g.input(m(&[64, 64]));
    let w2 = g.input(m(&[64, 64]));
    let h = op(&mut g, Op::Matmul, &[x, w]);
    let gr = op(&mut g, Op::Matmul, &[x, w2]);
    let c = op(&mut g, Op::Matmul, &[gr, w]);
    let out1 = op(&mut g, Op::Matmul, &[c, w]);
    let hg = op(&mut g, Op::Binary(BinaryOp::Mul), &[h, gr]);
    let out2 = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[hg]);
    let (_, s, text) = scheduled(g, &[out1, out2]);
    let kinds: Vec<KernelKind> = s.kernels.iter().map(|k| k.kind).collect();
    assert_eq!(kinds.len(), 5, "{text}");
    assert_ne!(kinds[2], KernelKind::Extern, "the reduction launches third: {text}");
    // Live at most: two 64x64 f32 matrices and the reduction's row.
    assert_eq!(s.memory.peak_bytes, 2 * 64 * 64 * 4 + 64 * 4, "{text}");
}

/// A GPT-2 block: attention (layer_norm, qkv projection, causal softmax attention, output
/// projection, residual) and MLP (layer_norm, fc, gelu, projection, residual).
fn gpt2_block() -> (Graph, NodeId) {
    let (b, t, c, heads) = (2, 8, 16, 2);
    let d = c / heads;
    let mut g = Graph::new();
    let x = g.input(m(&[b, t, c]));
    let h = layer_norm(&mut g, x, c);
    let w_qkv = g.input(m(&[3 * c, c]));
    let b_qkv = g.input(m(&[3 * c]));
    let qkv = op(&mut g, Op::Linear { bias: true }, &[h, w_qkv, b_qkv]);
    let mut heads_of = |k: usize| {
        let s = op(&mut g, Op::Slice { dim: 2, start: k * c, len: c, step: 1 }, &[qkv]);
        let r = op(&mut g, Op::Reshape { shape: vec![b, t, heads, d] }, &[s]);
        op(&mut g, Op::Permute { perm: vec![0, 2, 1, 3] }, &[r])
    };
    let (q, k, v) = (heads_of(0), heads_of(1), heads_of(2));
    let a = op(&mut g, Op::Attention { causal: true, scale: None, mask: false, dropout: None }, &[q, k, v]);
    let a = op(&mut g, Op::Permute { perm: vec![0, 2, 1, 3] }, &[a]);
    let a = op(&mut g, Op::Reshape { shape: vec![b, t, c] }, &[a]);
    let w_o = g.input(m(&[c, c]));
    let b_o = g.input(m(&[c]));
    let o = op(&mut g, Op::Linear { bias: true }, &[a, w_o, b_o]);
    let x = op(&mut g, Op::Binary(BinaryOp::Add), &[x, o]);
    let h = layer_norm(&mut g, x, c);
    let w_fc = g.input(m(&[4 * c, c]));
    let b_fc = g.input(m(&[4 * c]));
    let f = op(&mut g, Op::Linear { bias: true }, &[h, w_fc, b_fc]);
    let f = op(&mut g, Op::Gelu { tanh: true }, &[f]);
    let w_p = g.input(m(&[c, 4 * c]));
    let b_p = g.input(m(&[c]));
    let f = op(&mut g, Op::Linear { bias: true }, &[f, w_p, b_p]);
    let y = op(&mut g, Op::Binary(BinaryOp::Add), &[x, f]);
    (g, y)
}

#[test]
fn gpt2_block_schedule() {
    let (g, y) = gpt2_block();
    let (p, s, text) = scheduled(g, &[y]);
    snap("schedule_gpt2_block", &format!("{p}\n{text}"));
    let bmms = s.kernels.iter().filter(|k| k.name.starts_with("ext_bmm")).count();
    assert_eq!(bmms, 6, "{text}");
    // The fc product's gelu_tanh is its epilogue (`bmm +bias +gelu_tanh`): no kernel of its own.
    let generated = s.kernels.iter().filter(|k| k.kind != KernelKind::Extern).count();
    assert_eq!(generated, 5, "{text}");
    // q @ k^T (the second product) reads both heads straight out of the qkv buffer: k^T is a
    // stride swap at offset C.
    let products: Vec<&LoopKind> = p
        .nodes
        .iter()
        .map(|n| &n.kind)
        .filter(|k| matches!(k, LoopKind::Extern { call: ExternCall::Bmm { .. }, .. }))
        .collect();
    let LoopKind::Extern { call: ExternCall::Bmm { a, b, .. }, .. } = products[1] else { panic!("{p}") };
    let (a, b) = (a.to_usize().unwrap(), b.to_usize().unwrap());
    assert_eq!((a.offset, a.batch_strides.as_slice(), a.row_stride, a.col_stride), (0, &[384, 8][..], 48, 1));
    assert_eq!((b.offset, b.batch_strides.as_slice(), b.row_stride, b.col_stride), (16, &[384, 8][..], 1, 48));
}

#[test]
fn empty_nodes_get_no_kernel() {
    let mut g = Graph::new();
    let x = g.input(m(&[0, 3]));
    let y = op(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let z = g.input(m(&[2, 3]));
    let w = op(&mut g, Op::Unary(UnaryOp::Exp), &[z]);
    let p = lowered_composite(g, &[y, w]);
    let s = schedule(&p);
    assert_eq!(p.nodes.len(), 2, "{p}");
    assert_eq!(names(&s), ["poi_fused_exp_0"]);
    assert_eq!(s.kernels[0].nodes, vec![1]);
}

#[test]
fn twelve_blocks_schedule_in_reasonable_time() {
    let (block, _) = gpt2_block();
    // Chain 12 copies: the output of one block is the input of the next.
    let mut g = Graph::new();
    let mut x = g.input(block.meta(block.inputs[0]).clone());
    for _ in 0..12 {
        let mut map = vec![NodeId(0); block.nodes.len()];
        for (i, node) in block.nodes.iter().enumerate() {
            map[i] = match &node.op {
                Op::Input { index: 0 } => x,
                Op::Input { .. } => g.input(node.meta.clone()),
                op => g.push(op.clone(), &node.inputs.iter().map(|i| map[i.0]).collect::<Vec<_>>(), None).unwrap(),
            };
        }
        x = map[block.nodes.len() - 1];
    }
    let start = std::time::Instant::now();
    let (_, s, text) = scheduled(g, &[x]);
    // Each block's last residual add fuses into the next block's first layer_norm; biases, and
    // the MLP's gelu_tanh, ride in the products.
    assert_eq!(s.kernels.len(), 12 * 10 + 1, "{text}");
    let took = start.elapsed().as_secs_f64();
    assert!(took < 20.0, "{took}s");
    eprintln!("12 blocks: decompose + lower + schedule + print in {took:.3}s");
}

#[test]
fn scheduling_is_deterministic() {
    let (g, y) = gpt2_block();
    let (p, s, text) = scheduled(g.clone(), &[y]);
    assert_eq!(schedule(&p), s);
    assert_eq!(print_schedule(&p, &schedule(&p)), text);
    let (_, _, again) = scheduled(g, &[y]);
    assert_eq!(again, text);
}

#[test]
fn independent_kernels_of_one_size_share_a_launch() {
    // Casts and sums of squares of inputs (an optimizer's gradient norms, a model's weight
    // casts): of equal sizes they run as one kernel; another size keeps its own.
    let mut g = Graph::new();
    let mut outs = Vec::new();
    for shape in [[4, 8], [4, 8], [2, 3], [4, 8]] {
        let x = g.input(m(&shape));
        outs.push(op(&mut g, Op::Cast(DType::BF16), &[x]));
        let sq = op(&mut g, Op::Binary(BinaryOp::Mul), &[x, x]);
        outs.push(op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1], keepdim: false }, &[sq]));
    }
    let (p, s, text) = scheduled(g, &outs);
    // Each input's cast and sum share it (one kernel each); the three of size 32 then share
    // one launch, the one of size 6 keeps its own, and every output is still stored.
    let stores: Vec<usize> = s.kernels.iter().map(|k| k.stores.len()).collect();
    assert_eq!(stores, [6, 2], "{text}");
    assert_eq!(s.kernels[1].stores, p.outputs[4..6], "{text}");

    // Ten casts writing 8 MiB each: 8 fill a kernel's 64 MiB, the other 2 the next.
    let mut g = Graph::new();
    let outs: Vec<NodeId> = (0..10)
        .map(|_| {
            let x = g.input(m(&[4096, 1024]));
            op(&mut g, Op::Cast(DType::BF16), &[x])
        })
        .collect();
    let (_, s, text) = scheduled(g, &outs);
    assert_eq!(s.kernels.iter().map(|k| k.nodes.len()).collect::<Vec<_>>(), [8, 2], "{text}");
}

#[test]
fn a_kernel_reading_a_computed_buffer_is_not_fused_independently() {
    // cast(x @ w) waits for the product; cast(y), of the same size, does not join it (it would
    // then wait too, or the two would need the product earlier).
    let mut g = Graph::new();
    let x = g.input(m(&[4, 8]));
    let w = g.input(m(&[8, 8]));
    let y = g.input(m(&[4, 8]));
    let z = op(&mut g, Op::Matmul, &[x, w]);
    let cz = op(&mut g, Op::Cast(DType::BF16), &[z]);
    let cy = op(&mut g, Op::Cast(DType::BF16), &[y]);
    let (_, s, text) = scheduled(g, &[cz, cy]);
    assert_eq!(s.kernels.len(), 3, "{text}");
}

#[test]
fn small_sinks_of_one_size_share_a_launch() {
    // Casts of two products (a backward graph's bias gradients after their split sums) that
    // nothing reads: one launch after both products. The cast of a 2 MiB product waits for no
    // other (its product would live longer), nor does a cast whose result is read.
    let mut g = Graph::new();
    let mut outs = Vec::new();
    for rows in [4, 4, 4] {
        let x = g.input(m(&[rows, 8]));
        let w = g.input(m(&[8, 8]));
        let z = op(&mut g, Op::Matmul, &[x, w]);
        outs.push(op(&mut g, Op::Cast(DType::BF16), &[z]));
    }
    let (_, s, text) = scheduled(g.clone(), &outs);
    let casts: Vec<usize> = s.kernels.iter().filter(|k| k.name.starts_with("poi")).map(|k| k.nodes.len()).collect();
    assert_eq!(casts, [3], "{text}");

    let big = {
        let x = g.input(m(&[1024, 512]));
        let w = g.input(m(&[512, 512]));
        let z = op(&mut g, Op::Matmul, &[x, w]);
        op(&mut g, Op::Cast(DType::BF16), &[z])
    };
    let (_, s, text) = scheduled(g.clone(), &[outs[0], outs[1], big]);
    let casts: Vec<usize> = s.kernels.iter().filter(|k| k.name.starts_with("poi")).map(|k| k.nodes.len()).collect();
    assert_eq!(casts, [2, 1], "{text}");

    let w = g.input(TensorMeta::new(vec![8, 8], DType::BF16));
    let read = op(&mut g, Op::Matmul, &[outs[2], w]);
    let (_, s, text) = scheduled(g, &[outs[0], outs[1], read]);
    let casts: Vec<usize> = s.kernels.iter().filter(|k| k.name.starts_with("poi")).map(|k| k.nodes.len()).collect();
    assert_eq!(casts, [2, 1], "{text}");
}

#[test]
fn small_groups_read_by_one_kernel_share_a_launch() {
    // A gradient norm's shape: sums of products' squares, added up by one kernel. The sum over
    // 512 fuses into the adding kernel; the three over 48 (another row length) join each other,
    // as they are read by that kernel alone.
    let mut g = Graph::new();
    let mut sums = Vec::new();
    for rows in [64, 6, 6, 6] {
        let x = g.input(m(&[rows, 8]));
        let w = g.input(m(&[8, 8]));
        let z = op(&mut g, Op::Matmul, &[x, w]);
        let sq = op(&mut g, Op::Binary(BinaryOp::Mul), &[z, z]);
        sums.push(op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1], keepdim: false }, &[sq]));
    }
    let total = sums[1..].iter().fold(sums[0], |acc, &s| op(&mut g, Op::Binary(BinaryOp::Add), &[acc, s]));
    let (_, s, text) = scheduled(g, &[total]);
    let sizes: Vec<usize> = s.kernels.iter().filter(|k| k.name.starts_with("per")).map(|k| k.nodes.len()).collect();
    assert_eq!(sizes.len(), 2, "{text}");
}

/// A scatter at run-time positions (a KV cache write) stores where its positions say: a reader
/// of its output is another kernel, and so is the producer of its base (the runtime copies
/// the base into the output before the kernel); its source's producers fuse into it.
#[test]
fn a_cache_write_fuses_its_source_but_not_its_base_or_readers() {
    let mut g = Graph::new();
    let cache = g.input(m(&[2, 8, 4]));
    let pos = g.input(TensorMeta::new(vec![], DType::I64));
    let new = g.input(m(&[2, 1, 4]));
    let base = op(&mut g, Op::Unary(UnaryOp::Neg), &[cache]);
    let index = op(&mut g, Op::Expand { shape: vec![2, 1, 4] }, &[pos]);
    let src = op(&mut g, Op::Unary(UnaryOp::Exp), &[new]);
    let s = op(&mut g, Op::Scatter { dim: 1, reduce: None }, &[base, index, src]);
    let read = op(&mut g, Op::Unary(UnaryOp::Abs), &[s]);
    let (p, sched, text) = scheduled(g, &[read]);
    assert_eq!(sched.kernels.len(), 3, "{text}");
    let writer = sched.kernels.iter().find(|k| k.nodes.iter().any(|&n| p.nodes[n].scatter().is_some())).unwrap();
    assert_eq!(writer.nodes.len(), 1, "{text}");
    assert!(p.nodes[writer.nodes[0]].origins.contains(&"exp"), "the source is computed in the store's kernel: {text}");
    // Written over a dying base in place (no copy): the base's slot.
    let (b, o) = (p.nodes[0].output, p.nodes[writer.nodes[0]].output);
    assert_eq!(sched.memory.slot_of[b.0], sched.memory.slot_of[o.0], "{text}");
}

/// The donated cache of a decode step is written in place by the scatter's kernel, unless that
/// kernel also loads the cache elsewhere.
#[test]
fn a_cache_write_is_written_over_its_donated_base() {
    use coil_ir::kernel::Donation;
    let build = |read_base: bool| {
        let mut g = Graph::new();
        let cache = g.input(m(&[2, 8, 4]));
        let pos = g.input(TensorMeta::new(vec![], DType::I64));
        let new = g.input(m(&[2, 1, 4]));
        let index = op(&mut g, Op::Expand { shape: vec![2, 1, 4] }, &[pos]);
        let src = if read_base {
            // the source reads the cache's first row: the kernel loads the base
            let row = op(&mut g, Op::Slice { dim: 1, start: 0, len: 1, step: 1 }, &[cache]);
            op(&mut g, Op::Binary(BinaryOp::Add), &[new, row])
        } else {
            new
        };
        let s = op(&mut g, Op::Scatter { dim: 1, reduce: None }, &[cache, index, src]);
        let (p, mut sched, _) = scheduled(g, &[s]);
        crate::donate(&p, &mut sched, &[Donation { output: 0, input: 0 }]);
        sched.memory
    };
    let plain = build(false);
    assert_eq!(plain.donor_of(0), Some(0), "{:?}", plain.declined);
    let reading = build(true);
    assert_eq!(reading.donor_of(0), None);
    assert!(reading.declined[0].1.contains("reads the input at elements other than"), "{:?}", reading.declined);
}

/// An extern scatter (`scatter_add`) runs in place over a base that dies there: a graph
/// output's memory holds the base, a temporary output takes the base's slot. A base that is a
/// graph input, a graph output, or read by a later kernel is copied (kept apart).
#[test]
fn an_extern_scatter_runs_in_place_over_a_dying_base() {
    // `base = neg(x)` (or `x`), `s = scatter_add(base, index, src)`; `then` builds the outputs.
    let build = |base_is_input: bool, then: &dyn Fn(&mut Graph, NodeId, NodeId) -> Vec<NodeId>| {
        let mut g = Graph::new();
        let x = g.input(m(&[5, 4]));
        let index = g.input(TensorMeta::new(vec![8, 4], DType::I64));
        let src = g.input(m(&[8, 4]));
        let base = if base_is_input { x } else { op(&mut g, Op::Unary(UnaryOp::Neg), &[x]) };
        let s = op(&mut g, Op::Scatter { dim: 0, reduce: Some(ReduceOp::Sum) }, &[base, index, src]);
        let outputs = then(&mut g, base, s);
        let (p, sched, text) = scheduled(g, &outputs);
        let scatter = p.nodes.iter().find(|n| matches!(n.kind, LoopKind::Extern { .. })).unwrap();
        let LoopKind::Extern { inputs, .. } = &scatter.kind else { unreachable!() };
        (inputs[0], scatter.output, sched, text)
    };
    // The gradient of a tied embedding: the scatter's output is the graph's.
    let (b, o, sched, text) = build(false, &|_, _, s| vec![s]);
    assert_eq!(sched.memory.in_outputs, [coil_ir::kernel::InOutput { temporary: b, output: o }], "{text}");
    assert_eq!(sched.memory.slot_of[b.0], None, "{text}");
    assert_eq!(sched.memory.peak_bytes, 80, "the output alone: {text}");
    assert!(text.contains("in place: buf0 kept in output buf1 (the base of its scatter)"), "{text}");
    // A temporary output: the base's slot.
    let (b, o, sched, text) = build(false, &|g, _, s| vec![op(g, Op::Unary(UnaryOp::Abs), &[s])]);
    assert!(sched.memory.in_outputs.is_empty(), "{text}");
    assert_eq!(sched.memory.slot_of[b.0], sched.memory.slot_of[o.0], "{text}");
    assert!(sched.memory.slot_of[b.0].is_some(), "{text}");
    // Kept apart: an input base, a base that is an output too, a base read after the scatter.
    let (_, _, sched, text) = build(true, &|_, _, s| vec![s]);
    assert!(sched.memory.in_outputs.is_empty(), "{text}");
    let (_, _, sched, text) = build(false, &|_, base, s| vec![s, base]);
    assert!(sched.memory.in_outputs.is_empty(), "{text}");
    let (b, o, sched, text) = build(false, &|g, base, s| vec![op(g, Op::Binary(BinaryOp::Add), &[s, base])]);
    assert!(sched.memory.in_outputs.is_empty(), "{text}");
    assert_ne!(sched.memory.slot_of[b.0], sched.memory.slot_of[o.0], "{text}");
}
