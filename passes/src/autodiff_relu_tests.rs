//! relu's gradient mask in a training graph: it reads the relu's result, so a residual block's
//! sum before its relu is not stored for the backward pass (the whole pipeline, from the
//! captured graph to the memory plan, as the frontend compiles a `value_and_grad`).

use super::backward;
use crate::decompose::{decompose, decompose_with, relu_operand, DecomposeOptions};
use crate::{lower, print_schedule, schedule, simplify, split_reductions, RewriteOptions};
use coil_ir::kernel::Schedule;
use coil_ir::loops::{BufferId, ExternCall, LoopKind, LoopProgram};
use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, TensorMeta};

const GRAD: DecomposeOptions =
    DecomposeOptions { fused_attention: false, keep_detach: true, half_products: false, conv_template: false };

fn m(shape: &[usize]) -> TensorMeta {
    TensorMeta::new(shape.to_vec(), DType::F32)
}

fn op(g: &mut Graph, op: Op, inputs: &[NodeId]) -> NodeId {
    g.push(op, inputs, None).unwrap()
}

/// A residual block on `[rows, c]` activations: a product, a batch-norm-like scale and shift
/// per channel, the shortcut added, relu. Returns the block's output and its product's weight.
fn block(g: &mut Graph, x: NodeId, c: usize) -> (NodeId, NodeId) {
    let w = g.input(m(&[c, c]));
    let gamma = g.input(m(&[c]));
    let beta = g.input(m(&[c]));
    let h = op(g, Op::Matmul, &[x, w]);
    let h = op(g, Op::Binary(BinaryOp::Mul), &[h, gamma]);
    let h = op(g, Op::Binary(BinaryOp::Add), &[h, beta]);
    let s = op(g, Op::Binary(BinaryOp::Add), &[h, x]);
    (op(g, Op::Relu, &[s]), w)
}

/// Two residual blocks and a product head, `loss = sum(head^2)`, differentiated with respect to
/// every parameter, compiled as the frontend compiles it: the gradient decomposition (detach
/// kept), `backward`, then the compile's own decomposition (detach dropped), the rewrites,
/// lowering, split reductions and the schedule. Returns the program, its schedule and the
/// weights' input buffers of the two blocks.
fn training_step() -> (LoopProgram, Schedule, [BufferId; 2]) {
    let (rows, c) = (512, 32);
    let mut g = Graph::new();
    let x = g.input(m(&[rows, c]));
    let (y1, w1) = block(&mut g, x, c);
    let (y2, w2) = block(&mut g, y1, c);
    let head = g.input(m(&[c, c]));
    let z = op(&mut g, Op::Matmul, &[y2, head]);
    let zz = op(&mut g, Op::Binary(BinaryOp::Mul), &[z, z]);
    let loss = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1], keepdim: false }, &[zz]);
    let params: Vec<NodeId> = (1..g.nodes.len()).map(NodeId).filter(|&n| g.node(n).op.is_leaf()).collect();
    let weights = [w1, w2].map(|w| params.iter().position(|&p| p == w).unwrap() + 1);
    g.outputs = std::iter::once(loss).chain(params).collect();

    let mut p = decompose_with(&g, &GRAD).unwrap();
    let (loss, wrt) = (p.outputs[0], p.outputs[1..].to_vec());
    let grads = backward(&mut p, loss, None, &wrt).unwrap();
    p.outputs = std::iter::once(loss).chain(grads).collect();
    let p = decompose(&p).unwrap();
    let (p, _) = simplify(&p, &RewriteOptions::default()).unwrap();
    let program = split_reductions(&lower(&p).unwrap());
    let s = schedule(&program);
    let weights = weights.map(|k| program.inputs[k]);
    (program, s, weights)
}

/// The forward product of the block whose weight is `w` (`x @ w`), and its `x`: the block's
/// shortcut. (The first product reading `w`: the backward's data gradient reads it later.)
fn product_of(p: &LoopProgram, w: BufferId) -> (BufferId, BufferId) {
    let forward = |n: &&coil_ir::loops::LoopNode| match &n.kind {
        LoopKind::Extern { call: ExternCall::Bmm { .. }, inputs } => inputs.len() == 2 && inputs[1] == w,
        _ => false,
    };
    let node = p.nodes.iter().find(forward).unwrap_or_else(|| panic!("no product reads {w:?}\n{p}"));
    let LoopKind::Extern { inputs, .. } = &node.kind else { unreachable!() };
    (node.output, inputs[0])
}

#[test]
fn a_residual_blocks_sum_before_its_relu_is_not_stored_for_the_gradient() {
    // Before, the mask `s <= 0` read the sum `s = bn(x @ w) + x`, which the two-full-reads
    // rule (it loads the product and the shortcut) then stored beside the relu's result for
    // the backward pass. The mask reads the result `y` now (`y <= 0`), which the next block's
    // product reads anyway: `s` is computed in the add + relu kernel and never stored.
    let (p, s, weights) = training_step();
    let text = print_schedule(&p, &s);
    let stored: Vec<BufferId> = s.kernels.iter().flat_map(|k| k.stores.iter().copied()).collect();
    let read_by_extern =
        |b: BufferId| (p.nodes.iter()).any(|n| matches!(n.kind, LoopKind::Extern { .. }) && n.reads().contains(&b));
    for w in weights {
        let (product, shortcut) = product_of(&p, w);
        // Every pointwise node computing from the product and the shortcut: the sum, and what
        // it may be inlined into.
        let sums: Vec<BufferId> = (p.nodes.iter())
            .filter(|n| matches!(n.kind, LoopKind::Pointwise { .. }))
            .filter(|n| n.reads().contains(&product) && n.reads().contains(&shortcut))
            .map(|n| n.output)
            .collect();
        assert!(!sums.is_empty(), "no sum of {product:?} and {shortcut:?}\n{p}\n{text}");
        for b in sums {
            // Stored only as the relu's result that the next product reads.
            let kept = stored.contains(&b) || s.memory.slot_of[b.0].is_some();
            assert!(!kept || read_by_extern(b), "{} (the sum before a relu) is stored\n{p}\n{text}", p.buffer(b).name);
        }
    }
}

#[test]
fn relus_gradient_masks_read_the_relus_result() {
    // In the differentiated graph, each relu's mask is `y <= 0` of the relu's result `y`.
    let mut g = Graph::new();
    let x = g.input(m(&[4, 3]));
    let y = op(&mut g, Op::Relu, &[x]);
    let loss = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1], keepdim: false }, &[y]);
    g.outputs = vec![loss, x];
    let mut p = decompose_with(&g, &GRAD).unwrap();
    let (loss, wrt) = (p.outputs[0], p.outputs[1..].to_vec());
    let relu = (0..p.nodes.len()).map(NodeId).find(|&n| relu_operand(&p, n).is_some()).expect("relu's graph");
    assert_eq!(relu_operand(&p, relu), Some(wrt[0]));
    let dx = backward(&mut p, loss, None, &wrt).unwrap()[0];
    // dx = where(le(y, 0), 0, g)
    let node = p.node(dx);
    assert_eq!(node.op, Op::Where, "{p}");
    let mask = p.node(node.inputs[0]);
    assert_eq!((&mask.op, mask.inputs[0]), (&Op::Binary(BinaryOp::Le), relu), "{p}");
    // Without detach (the reference decomposition) the graph is not relu's gradient graph.
    let plain = decompose(&g).unwrap();
    assert!((0..plain.nodes.len()).all(|n| relu_operand(&plain, NodeId(n)).is_none()), "{plain}");
}
