//! Memory plan tests on a ResNet-like network: bottleneck blocks whose activations shrink from
//! stage to stage, where a plan that hands a dead large slot to a small temporary strands the
//! large one's bytes for the rest of the graph.

use super::schedule;
use crate::lower::tests::lowered_composite;
use coil_ir::kernel::{KernelKind, Schedule};
use coil_ir::loops::{BufferId, LoopProgram};
use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, TensorMeta};

fn m(shape: &[usize]) -> TensorMeta {
    TensorMeta::new(shape.to_vec(), DType::F32)
}

fn op(g: &mut Graph, op: Op, inputs: &[NodeId]) -> NodeId {
    g.push(op, inputs, None).unwrap()
}

fn matmul(g: &mut Graph, x: NodeId, cin: usize, cout: usize) -> NodeId {
    let w = g.input(m(&[cin, cout]));
    op(g, Op::Matmul, &[x, w])
}

/// A bottleneck block on `[rows, cin]` activations (1x1 convolutions as products, relu for
/// batch norm and relu): reduce to `c`, `c` to `c`, expand to `4c`, add the shortcut (a
/// projection where the width changes), relu.
fn bottleneck(g: &mut Graph, x: NodeId, cin: usize, c: usize) -> NodeId {
    let h = matmul(g, x, cin, c);
    let h = op(g, Op::Relu, &[h]);
    let h = matmul(g, h, c, c);
    let h = op(g, Op::Relu, &[h]);
    let h = matmul(g, h, c, 4 * c);
    let shortcut = if cin == 4 * c { x } else { matmul(g, x, cin, 4 * c) };
    let y = op(g, Op::Binary(BinaryOp::Add), &[h, shortcut]);
    op(g, Op::Relu, &[y])
}

/// Three stages of two blocks; between stages the rows shrink by 4 (a sum over groups of 4
/// rows, as a stride-2 stage quarters the pixels) and the width doubles, so each stage's
/// activations are half the bytes of the one before.
fn resnet_like() -> (LoopProgram, Schedule) {
    let mut g = Graph::new();
    let (mut rows, mut cin) = (1024, 16);
    let mut x = g.input(m(&[rows, cin]));
    for stage in 0..3 {
        let c = 8 << stage;
        if stage > 0 {
            let grouped = op(&mut g, Op::Reshape { shape: vec![rows / 4, 4, cin] }, &[x]);
            x = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[grouped]);
            rows /= 4;
        }
        for _ in 0..2 {
            x = bottleneck(&mut g, x, cin, c);
            cin = 4 * c;
        }
    }
    let p = lowered_composite(g, &[x]);
    let s = schedule(&p);
    (p, s)
}

/// The most bytes of temporaries alive at one launch, each from the kernel that stores it to
/// the last that reads it, less at a pointwise kernel the bytes of one temporary of its
/// result's size that dies in it (here every pointwise kernel reads its inputs at the element
/// it writes, so it may write over one of them): what any plan of these kernels needs.
fn live_bytes(p: &LoopProgram, s: &Schedule) -> usize {
    let n = p.buffers.len();
    let (mut def, mut last) = (vec![None; n], vec![0; n]);
    for (k, kernel) in s.kernels.iter().enumerate() {
        for &b in &kernel.stores {
            def[b.0] = Some(k);
        }
        for &node in &kernel.nodes {
            for b in p.nodes[node].reads() {
                last[b.0] = last[b.0].max(k);
            }
        }
    }
    let bytes = |b: usize| p.buffers[b].meta.nbytes();
    let temporary =
        |b: usize| def[b].is_some() && !p.inputs.contains(&BufferId(b)) && !p.outputs.contains(&BufferId(b));
    let live = |b: usize, k: usize| temporary(b) && def[b] <= Some(k) && k <= last[b].max(def[b].unwrap_or(0));
    (s.kernels.iter().enumerate())
        .map(|(k, kernel)| {
            let all: usize = (0..n).filter(|&b| live(b, k)).map(bytes).sum();
            let [out] = kernel.stores[..] else { return all };
            let in_place = (kernel.kind == KernelKind::Pointwise && temporary(out.0))
                && (kernel.nodes.iter().flat_map(|&node| p.nodes[node].reads()))
                    .any(|u| live(u.0, k) && last[u.0] == k && def[u.0] < Some(k) && bytes(u.0) == bytes(out.0));
            all - if in_place { bytes(out.0) } else { 0 }
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn a_resnet_like_plan_holds_no_more_than_its_live_temporaries() {
    let (p, s) = resnet_like();
    let arena = s.memory.arena(&s.memory.slots);
    let live = live_bytes(&p, &s);
    // Before each temporary had a slot of its own (in-place writes aside), the small
    // temporaries of later stages took the large slots of the first: the arena held 1.33x
    // the live bytes (ResNet-50's forward: 608 MiB for 221).
    assert!(
        s.memory.peak_bytes <= live && arena.bytes <= live,
        "peak {} and arena {} bytes against {live} live",
        s.memory.peak_bytes,
        arena.bytes
    );
    // The arena reaches the plan's peak: the slots pack without gaps on this network.
    assert_eq!(arena.bytes, s.memory.peak_bytes);
}

#[test]
fn every_relu_of_a_resnet_like_network_writes_over_what_it_reads() {
    // A relu (batch norm and relu, the residual add and relu) reads a product's result that
    // dies in it, at the element it writes: the result's slot is reused in place, whatever
    // stage the product is in.
    let (p, s) = resnet_like();
    let mut seen = 0;
    for (k, kernel) in s.kernels.iter().enumerate() {
        if kernel.kind != KernelKind::Pointwise || kernel.stores.len() != 1 {
            continue;
        }
        let out = kernel.stores[0];
        let products: Vec<BufferId> = (kernel.nodes.iter())
            .flat_map(|&n| p.nodes[n].reads())
            .filter(|b| s.kernels[..k].iter().any(|e| e.kind == KernelKind::Extern && e.stores.contains(b)))
            .collect();
        if products.is_empty() || p.outputs.contains(&out) {
            continue;
        }
        seen += 1;
        assert!(
            products.iter().any(|&b| s.memory.shares_memory(b, out)),
            "{} writes {} in a slot of its own, not over what it reads",
            kernel.name,
            p.buffer(out).name
        );
    }
    // Two relus per block and one after each residual add (the last block's is the output).
    assert_eq!(seen, 6 * 3 - 1);
}

#[test]
fn the_free_range_at_a_launch_overlaps_no_slot_in_use_there() {
    // What a library call may use as its workspace (`MemoryPlan::free_range`): inside the
    // arena and clear of every slot in use at its launch; at some launch of this network,
    // most of the arena.
    let (_, s) = resnet_like();
    let plan = &s.memory;
    let arena = plan.arena(&plan.slots);
    let mut most = 0;
    for k in 0..s.kernels.len() {
        let (at, bytes) = plan.free_range(&arena, &plan.slots, k);
        assert!(at + bytes <= arena.bytes, "launch {k}: {at} + {bytes} past the arena's {}", arena.bytes);
        for (slot, &(first, last)) in plan.slot_lives.iter().enumerate() {
            let (start, end) = (arena.offsets[slot], arena.offsets[slot] + plan.slots[slot]);
            let in_use = first <= k && k <= last;
            assert!(!in_use || bytes == 0 || end <= at || at + bytes <= start, "launch {k}: slot {slot} in the range");
        }
        most = most.max(bytes);
    }
    assert!(2 * most >= arena.bytes, "{most} of {} bytes free at best", arena.bytes);
}
