//! Lowering tests: the printed loop program of small graphs (snapshots, checked by eye), and
//! the realization rules.

use super::{
    lower, BODY_CAP, REALIZE_ACC_READS_THRESHOLD, REALIZE_OPCOUNT_THRESHOLD, REALIZE_READS_THRESHOLD,
    SMALL_OPERAND_RATIO,
};
use coil_ir::loops::{Activation, BufferId, ExternCall, LoopKind, LoopProgram, ValueId};
use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Scalar, TensorMeta, UnaryOp};

const F32: DType = DType::F32;

fn m(shape: &[usize], dtype: DType) -> TensorMeta {
    TensorMeta::new(shape.to_vec(), dtype)
}

fn op(g: &mut Graph, op: Op, inputs: &[NodeId]) -> NodeId {
    g.push(op, inputs, None).unwrap()
}

fn snap(name: &str, p: &LoopProgram) {
    insta::with_settings!({ snapshot_path => "../snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(name, p.to_string());
    });
}

fn lowered(mut g: Graph, outputs: &[NodeId]) -> LoopProgram {
    g.outputs.extend_from_slice(outputs);
    lower(&g).unwrap_or_else(|e| panic!("{e}\n{g}"))
}

/// Decomposes a captured graph (composite ops allowed), then lowers it.
pub(crate) fn lowered_composite(mut g: Graph, outputs: &[NodeId]) -> LoopProgram {
    g.outputs.extend_from_slice(outputs);
    let p = crate::decompose(&g).unwrap();
    lower(&p).unwrap_or_else(|e| panic!("{e}\n{p}"))
}

#[test]
fn transpose_reads_with_swapped_strides() {
    let mut g = Graph::new();
    let x = g.input(m(&[3, 4], F32));
    let t = op(&mut g, Op::Permute { perm: vec![1, 0] }, &[x]);
    let p = lowered(g, &[t]);
    snap("lower_transpose", &p);
}

#[test]
fn expand_reads_broadcast_dims_at_zero() {
    let mut g = Graph::new();
    let x = g.input(m(&[3, 1], F32));
    let e = op(&mut g, Op::Expand { shape: vec![2, 3, 4] }, &[x]);
    let y = op(&mut g, Op::Unary(UnaryOp::Exp), &[e]);
    snap("lower_expand", &lowered(g, &[y]));
}

#[test]
fn slices_with_steps() {
    let mut g = Graph::new();
    let x = g.input(m(&[10, 3], F32));
    let a = op(&mut g, Op::Slice { dim: 0, start: 8, len: 4, step: -2 }, &[x]);
    let b = op(&mut g, Op::Slice { dim: 0, start: 1, len: 4, step: 2 }, &[x]);
    let y = op(&mut g, Op::Binary(BinaryOp::Add), &[a, b]);
    snap("lower_slice_step", &lowered(g, &[y]));
}

#[test]
fn reshape_of_permute_splits_dims_without_flat_division() {
    let mut g = Graph::new();
    let x = g.input(m(&[2, 3, 4], F32));
    let t = op(&mut g, Op::Permute { perm: vec![0, 2, 1] }, &[x]);
    let r = op(&mut g, Op::Reshape { shape: vec![8, 3] }, &[t]);
    let y = op(&mut g, Op::Unary(UnaryOp::Neg), &[r]);
    let p = lowered(g, &[y]);
    snap("lower_reshape_of_permute", &p);
    assert!(p.to_string().contains("load(arg0, 4*x1 + 12*(x0//4) + x0 % 4)"), "{p}");
}

#[test]
fn pad_is_a_masked_load() {
    let mut g = Graph::new();
    let x = g.input(m(&[3, 4], F32));
    let y = op(&mut g, Op::Pad { pads: vec![(1, 0), (0, 2)], value: Scalar::Float(1.5) }, &[x]);
    snap("lower_pad", &lowered(g, &[y]));
}

#[test]
fn cat_is_where_over_masked_loads() {
    let mut g = Graph::new();
    let a = g.input(m(&[2, 3], F32));
    let b = g.input(m(&[2, 2], F32));
    let c = g.input(m(&[2, 1], F32));
    // An inlined part: its loads are masked, and a `where` selects it.
    let ec = op(&mut g, Op::Unary(UnaryOp::Exp), &[c]);
    let y = op(&mut g, Op::Cat { dim: 1 }, &[a, b, ec]);
    snap("lower_cat", &lowered(g, &[y]));
}

#[test]
fn gather_and_index_select_are_indirect_loads() {
    let mut g = Graph::new();
    let x = g.input(m(&[4, 5], F32));
    let i = g.input(m(&[4, 2], DType::I64));
    let w = g.input(m(&[6, 3], F32));
    let j = g.input(m(&[5], DType::I32));
    let gathered = op(&mut g, Op::Gather { dim: 1 }, &[x, i]);
    // index_select of a transposed weight: the transpose folds into the indirect access.
    let wt = op(&mut g, Op::Permute { perm: vec![1, 0] }, &[w]);
    let selected = op(&mut g, Op::IndexSelect { dim: 1 }, &[wt, j]);
    snap("lower_gather", &lowered(g, &[gathered, selected]));
}

#[test]
fn pointwise_chain_is_one_node() {
    let mut g = Graph::new();
    let x = g.input(m(&[2, 3], F32));
    let y = g.input(m(&[3], F32));
    let ye = op(&mut g, Op::Expand { shape: vec![2, 3] }, &[y]);
    let a = op(&mut g, Op::Binary(BinaryOp::Add), &[x, ye]);
    let b = op(&mut g, Op::Unary(UnaryOp::Tanh), &[a]);
    let c = op(&mut g, Op::Binary(BinaryOp::Mul), &[b, a]);
    let d = op(&mut g, Op::Cast(DType::F16), &[c]);
    let p = lowered(g, &[d]);
    assert_eq!(p.nodes.len(), 1, "{p}");
    snap("lower_pointwise_chain", &p);
}

#[test]
fn softmax_is_two_reductions_and_an_output() {
    let mut g = Graph::new();
    let x = g.input(m(&[2, 5], F32));
    let y = op(&mut g, Op::Softmax { dim: 1 }, &[x]);
    let p = lowered_composite(g, &[y]);
    snap("lower_softmax", &p);
}

#[test]
fn linear_is_a_bmm_of_strided_views() {
    let mut g = Graph::new();
    let x = g.input(m(&[2, 3, 4], F32));
    let w = g.input(m(&[5, 4], F32));
    let b = g.input(m(&[5], F32));
    let y = op(&mut g, Op::Linear { bias: true }, &[x, w, b]);
    let p = lowered_composite(g, &[y]);
    snap("lower_linear", &p);
    let LoopKind::Extern { call: ExternCall::Bmm { a, b, .. }, .. } = &p.nodes[0].kind else { panic!("{p}") };
    assert_eq!(
        (
            a.to_usize().unwrap().row_stride,
            a.to_usize().unwrap().col_stride,
            b.to_usize().unwrap().row_stride,
            b.to_usize().unwrap().col_stride
        ),
        (4, 1, 1, 4)
    );
}

#[test]
fn bmm_operand_that_is_not_affine_is_copied() {
    let mut g = Graph::new();
    let x = g.input(m(&[4, 6], F32));
    let w = g.input(m(&[4, 5], F32));
    // The first two columns, regrouped: a row of the result straddles two rows of `x`, so no
    // row stride describes it and the operand gets its own contiguous buffer.
    let xs = op(&mut g, Op::Slice { dim: 1, start: 0, len: 2, step: 1 }, &[x]);
    let xr = op(&mut g, Op::Reshape { shape: vec![2, 4] }, &[xs]);
    // The other operand is an affine view (a slice) of an inlined producer: that is realized.
    let e = op(&mut g, Op::Unary(UnaryOp::Exp), &[w]);
    let ws = op(&mut g, Op::Slice { dim: 1, start: 1, len: 2, step: 2 }, &[e]);
    let y = op(&mut g, Op::Bmm, &[xr, ws]);
    let p = lowered(g, &[y]);
    snap("lower_bmm_copy", &p);
    let LoopKind::Extern { call: ExternCall::Bmm { a, b, .. }, .. } = &p.nodes[2].kind else { panic!("{p}") };
    let (a, b) = (a.to_usize().unwrap(), b.to_usize().unwrap());
    assert_eq!((a.buffer, a.offset, a.row_stride, a.col_stride), (p.nodes[0].output, 0, 4, 1));
    assert_eq!((b.buffer, b.offset, b.row_stride, b.col_stride), (p.nodes[1].output, 1, 5, 2));
}

#[test]
fn cumsum_and_scatter_are_fallbacks_on_contiguous_buffers() {
    let mut g = Graph::new();
    let x = g.input(m(&[3, 4], F32));
    let i = g.input(m(&[4, 1], DType::I64));
    let t = op(&mut g, Op::Permute { perm: vec![1, 0] }, &[x]);
    let c = op(&mut g, Op::Cumsum { dim: 1 }, &[t]);
    let s = op(&mut g, Op::Scatter { dim: 1, reduce: Some(ReduceOp::Sum) }, &[c, i, t]);
    snap("lower_fallbacks", &lowered(g, &[s]));
}

#[test]
fn reductions_keepdim_arg_and_degenerate() {
    let mut g = Graph::new();
    let x = g.input(m(&[2, 3, 4], DType::I32));
    let keep = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![2, 0], keepdim: true }, &[x]);
    let arg = op(&mut g, Op::Reduce { op: ReduceOp::ArgMax, dims: vec![1], keepdim: false }, &[x]);
    let none = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![], keepdim: false }, &[x]);
    let e = g.input(m(&[2, 0], F32));
    let empty = op(&mut g, Op::Reduce { op: ReduceOp::Prod, dims: vec![1], keepdim: false }, &[e]);
    snap("lower_reductions", &lowered(g, &[keep, arg, none, empty]));
}

#[test]
fn bmm_with_empty_contraction_is_zeros() {
    let mut g = Graph::new();
    let a = g.input(m(&[3, 0], F32));
    let b = g.input(m(&[0, 2], F32));
    let y = op(&mut g, Op::Bmm, &[a, b]);
    let p = lowered(g, &[y]);
    assert_eq!(p.nodes.len(), 1);
    let text = p.to_string();
    assert!(
        text.contains("buf0: f32[3, 2] = pointwise ranges=[3, 2] origins=[bmm]\n    v0: f32 = constant(0.0)"),
        "{text}"
    );
}

#[test]
fn outputs_alias_inputs_and_each_other() {
    let mut g = Graph::new();
    let x = g.input(m(&[2], F32));
    let y = op(&mut g, Op::Unary(UnaryOp::Exp), &[x]);
    let p = lowered(g, &[x, y, y]);
    assert_eq!(p.nodes.len(), 1);
    assert_eq!(p.outputs, vec![p.inputs[0], p.nodes[0].output, p.nodes[0].output]);
    assert_eq!(p.to_string().lines().last(), Some("outputs: arg0, buf0, buf0"));
}

#[test]
fn long_chains_are_cut_at_the_body_cap() {
    let mut g = Graph::new();
    let x = g.input(m(&[8], F32));
    let mut y = x;
    for _ in 0..3 * BODY_CAP {
        let s = op(&mut g, Op::Unary(UnaryOp::Sin), &[y]);
        y = op(&mut g, Op::Binary(BinaryOp::Add), &[s, y]);
    }
    let p = lowered(g, &[y]);
    assert!(p.nodes.len() > 3, "{}", p.nodes.len());
    for n in &p.nodes {
        let LoopKind::Pointwise { body, .. } = &n.kind else { panic!() };
        assert!(body.values.len() <= BODY_CAP + 2, "{}", body.values.len());
    }
}

/// The buffers each loop node's body loads, by name (extern calls: none).
fn loads(p: &LoopProgram) -> Vec<Vec<String>> {
    let name = |b: &BufferId| p.buffer(*b).name.clone();
    p.nodes
        .iter()
        .map(|n| match &n.kind {
            LoopKind::Pointwise { body, .. } | LoopKind::Reduction { body, .. } => {
                body.reads().iter().map(name).collect()
            }
            LoopKind::Extern { .. } => vec![],
        })
        .collect()
}

#[test]
fn a_node_its_readers_would_each_reload_is_stored_once() {
    // `x + y` loads two buffers of its size and has two readers: inlined, both would load both.
    let mut g = Graph::new();
    let x = g.input(m(&[4, 8], F32));
    let y = g.input(m(&[4, 8], F32));
    let s = op(&mut g, Op::Binary(BinaryOp::Add), &[x, y]);
    let e = op(&mut g, Op::Unary(UnaryOp::Exp), &[s]);
    let r = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[s]);
    let p = lowered(g, &[e, r]);
    assert_eq!(loads(&p), [vec!["arg0", "arg1"], vec!["buf0"], vec!["buf0"]], "{p}");
}

#[test]
fn a_reused_value_read_through_a_widening_cast_is_stored_narrow() {
    // `f32(x + y)` of bf16 `x`, `y`, read by a reduction and an exp: worth storing, and stored
    // as the bf16 sum (the cast is exact, so each reader widens the narrow copy itself), not as
    // the f32 cast at twice the bytes.
    let bf16 = DType::BF16;
    let mut g = Graph::new();
    let x = g.input(m(&[4, 8], bf16));
    let y = g.input(m(&[4, 8], bf16));
    let s = op(&mut g, Op::Binary(BinaryOp::Add), &[x, y]);
    let w = op(&mut g, Op::Cast(F32), &[s]);
    let e = op(&mut g, Op::Unary(UnaryOp::Exp), &[w]);
    let r = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[w]);
    let p = lowered(g, &[e, r]);
    assert_eq!(loads(&p), [vec!["arg0", "arg1"], vec!["buf0"], vec!["buf0"]], "{p}");
    let stored = p.nodes[0].writes()[0];
    assert_eq!(p.buffer(stored).meta.dtype, bf16, "{p}");
    // A narrowing cast is no view of its input: `bf16(a + b)` of f32 operands, read twice,
    // is stored after the cast.
    let mut g = Graph::new();
    let x = g.input(m(&[4, 8], F32));
    let y = g.input(m(&[4, 8], F32));
    let s = op(&mut g, Op::Binary(BinaryOp::Add), &[x, y]);
    let n = op(&mut g, Op::Cast(bf16), &[s]);
    let e = op(&mut g, Op::Unary(UnaryOp::Exp), &[n]);
    let r = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[n]);
    let p = lowered(g, &[e, r]);
    let stored = p.nodes[0].writes()[0];
    assert_eq!(p.buffer(stored).meta.dtype, bf16, "{p}");
}

#[test]
fn broadcast_rows_and_broadcast_readers_keep_a_node_inlined() {
    let mut g = Graph::new();
    // `x * w` with `w` a broadcast row: one load of its size; its two readers reload `w` from
    // cache, so it stays inlined in both (as a layer norm's `x - mean` does).
    let x = g.input(m(&[4, 8], F32));
    let w = g.input(m(&[8], F32));
    let we = op(&mut g, Op::Expand { shape: vec![4, 8] }, &[w]);
    let t = op(&mut g, Op::Binary(BinaryOp::Mul), &[x, we]);
    let e = op(&mut g, Op::Unary(UnaryOp::Exp), &[t]);
    let r = op(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[t]);
    // `a + b` of two scalars, read by its readers through broadcasts: recomputing it costs them
    // nothing, where a buffer would cost a one-element kernel.
    let (a, b) = (g.input(m(&[], F32)), g.input(m(&[], F32)));
    let c = op(&mut g, Op::Binary(BinaryOp::Add), &[a, b]);
    let ce = op(&mut g, Op::Expand { shape: vec![4, 8] }, &[c]);
    let u = op(&mut g, Op::Binary(BinaryOp::Mul), &[e, ce]);
    let v = op(&mut g, Op::Binary(BinaryOp::Sub), &[x, ce]);
    let p = lowered(g, &[r, u, v]);
    assert_eq!(
        loads(&p),
        [vec!["arg0", "arg1"], vec!["arg0", "arg1", "arg2", "arg3"], vec!["arg0", "arg2", "arg3"]],
        "{p}"
    );
}

#[test]
fn a_reused_node_loading_many_buffers_or_computing_much_is_stored() {
    // Inductor's reuse rules: two readers and more than REALIZE_READS_THRESHOLD loads (here
    // of broadcast rows, which the size rule leaves alone), or more than
    // REALIZE_OPCOUNT_THRESHOLD values.
    let mut g = Graph::new();
    let x = g.input(m(&[4, 8], F32));
    let mut t = x;
    for _ in 0..REALIZE_READS_THRESHOLD {
        let w = g.input(m(&[8], F32));
        let we = op(&mut g, Op::Expand { shape: vec![4, 8] }, &[w]);
        t = op(&mut g, Op::Binary(BinaryOp::Add), &[t, we]);
    }
    let mut u = x;
    for _ in 0..REALIZE_OPCOUNT_THRESHOLD {
        u = op(&mut g, Op::Unary(UnaryOp::Sin), &[u]);
    }
    let outputs: Vec<NodeId> =
        [t, u].iter().flat_map(|&n| [UnaryOp::Exp, UnaryOp::Cos].map(|f| op(&mut g, Op::Unary(f), &[n]))).collect();
    let p = lowered(g, &outputs);
    let l = loads(&p);
    assert_eq!(l.len(), 6, "{p}");
    assert_eq!(l[0].len(), REALIZE_READS_THRESHOLD + 1, "{p}");
    assert!(l[1..].iter().all(|l| l.len() == 1), "{p}");
}

#[test]
fn small_broadcast_operands_do_not_make_a_reused_node_stored() {
    // A batch norm's shape: a large activation and per-channel vectors (far smaller than
    // SMALL_OPERAND_RATIO-th of it) read by two readers: inlined into both, where the same
    // vectors on a small activation (the test above) get it stored.
    let (rows, channels) = (SMALL_OPERAND_RATIO * 2, 8);
    let mut g = Graph::new();
    let x = g.input(m(&[rows, channels], F32));
    let mut t = x;
    for _ in 0..REALIZE_READS_THRESHOLD {
        let w = g.input(m(&[channels], F32));
        let we = op(&mut g, Op::Expand { shape: vec![rows, channels] }, &[w]);
        t = op(&mut g, Op::Binary(BinaryOp::Add), &[t, we]);
    }
    let outputs: Vec<NodeId> = [UnaryOp::Exp, UnaryOp::Cos].map(|f| op(&mut g, Op::Unary(f), &[t])).to_vec();
    let p = lowered(g, &outputs);
    let l = loads(&p);
    assert_eq!(l.len(), 2, "{p}");
    assert!(l.iter().all(|l| l.len() == REALIZE_READS_THRESHOLD + 1), "{p}");
}

#[test]
fn loads_piling_up_along_a_chain_are_stored() {
    // One reader each, but a sum of many inputs: stored once it loads more than
    // REALIZE_ACC_READS_THRESHOLD buffers, and the chain goes on from that buffer.
    let mut g = Graph::new();
    let mut acc = g.input(m(&[8], F32));
    for _ in 0..REALIZE_ACC_READS_THRESHOLD + 2 {
        let x = g.input(m(&[8], F32));
        acc = op(&mut g, Op::Binary(BinaryOp::Add), &[acc, x]);
    }
    let p = lowered(g, &[acc]);
    let l = loads(&p);
    assert_eq!(l.iter().map(Vec::len).collect::<Vec<_>>(), [REALIZE_ACC_READS_THRESHOLD + 1, 3], "{p}");
}

#[test]
fn lowering_is_deterministic() {
    let build = || {
        let mut g = Graph::new();
        let x = g.input(m(&[4, 8], F32));
        let w = g.input(m(&[8], F32));
        let b = g.input(m(&[8], F32));
        let y = op(&mut g, Op::LayerNorm { ndim: 1, eps: 1e-5, weight: true, bias: true }, &[x, w, b]);
        lowered_composite(g, &[y])
    };
    assert_eq!(build().to_string(), build().to_string());
}

/// A deterministic pseudo-random generator (the tests must not depend on a crate for this).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// Row-major coordinates of every position of `shape`.
fn coords(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|mut f| {
            let mut c = vec![0; shape.len()];
            for d in (0..shape.len()).rev() {
                c[d] = f % shape[d];
                f /= shape[d];
            }
            c
        })
        .collect()
}

/// The source position each element of a view reads, computed concretely: `src` holds the
/// positions of the operand (row-major over `from`), the result those of the view.
fn apply_view(op: &Op, from: &[usize], to: &[usize], src: &[i64]) -> Vec<i64> {
    let flat = |c: &[usize]| c.iter().zip(coil_ir::graph::contiguous_strides(from)).map(|(i, s)| i * s).sum::<usize>();
    coords(to)
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let at: Vec<usize> = match op {
                Op::Reshape { .. } => return src[k],
                Op::Permute { perm } => {
                    let mut v = vec![0; c.len()];
                    perm.iter().enumerate().for_each(|(d, &p)| v[p] = c[d]);
                    v
                }
                Op::Expand { .. } => {
                    let lead = to.len() - from.len();
                    (0..from.len()).map(|i| if from[i] == 1 { 0 } else { c[lead + i] }).collect()
                }
                Op::Slice { dim, start, step, .. } => {
                    let mut v = c.clone();
                    v[*dim] = (*start as i64 + c[*dim] as i64 * step) as usize;
                    v
                }
                _ => unreachable!(),
            };
            src[flat(&at)]
        })
        .collect()
}

/// A random view of a tensor of `shape`.
fn random_view(r: &mut Lcg, shape: &[usize]) -> Op {
    let rank = shape.len();
    match r.below(4) {
        0 if rank > 1 => {
            let mut perm: Vec<usize> = (0..rank).collect();
            for i in (1..rank).rev() {
                perm.swap(i, r.below(i + 1));
            }
            Op::Permute { perm }
        }
        1 => {
            // Factor the element count into a random shape (size-1 dims included).
            let mut left: usize = shape.iter().product();
            let mut out = Vec::new();
            while left > 1 && out.len() < 4 {
                let divisors: Vec<usize> = (1..=left).filter(|d| left.is_multiple_of(*d)).collect();
                let d = divisors[r.below(divisors.len())];
                out.push(d);
                left /= d;
            }
            out.push(left);
            Op::Reshape { shape: out }
        }
        2 => {
            let mut to: Vec<usize> = shape.iter().map(|&n| if n == 1 { 1 + r.below(3) } else { n }).collect();
            if rank < 4 && r.below(2) == 0 {
                to.insert(0, 2);
            }
            Op::Expand { shape: to }
        }
        _ => {
            let dim = r.below(rank);
            let n = shape[dim];
            let step = [1i64, 2, 3, -1, -2][r.below(5)];
            let start = r.below(n);
            let room = if step > 0 { (n - 1 - start) / step as usize } else { start / (-step) as usize };
            Op::Slice { dim, start, len: 1 + r.below(room + 1), step }
        }
    }
}

#[test]
fn random_view_chains_fold_into_exact_indices() {
    let mut r = Lcg(7);
    for case in 0..300 {
        let mut g = Graph::new();
        let base = [vec![2, 3, 4], vec![6, 4], vec![24], vec![2, 1, 6]][case % 4].clone();
        let mut x = g.input(m(&base, F32));
        let mut positions: Vec<i64> = (0..base.iter().product::<usize>() as i64).collect();
        let mut chain = Vec::new();
        for _ in 0..1 + r.below(4) {
            let from = g.meta(x).shape.clone();
            let view = random_view(&mut r, &from);
            x = op(&mut g, view.clone(), &[x]);
            positions = apply_view(&view, &from, &g.meta(x).shape, &positions);
            chain.push(view.to_string());
        }
        let shape = g.meta(x).shape.clone();
        let y = op(&mut g, Op::Unary(UnaryOp::Neg), &[x]);
        let p = lowered(g, &[y]);
        let LoopKind::Pointwise { body, .. } = &p.nodes[0].kind else { panic!("{p}") };
        let index = match &body.values[0].op {
            coil_ir::loops::ScalarOp::Load { index, .. } => *index,
            other => panic!("{other:?}"),
        };
        for (k, c) in coords(&shape).iter().enumerate() {
            let got = index.eval_with(|s| {
                let name = s.as_symbol().unwrap().name;
                Some(c[name.trim_start_matches('x').parse::<usize>().unwrap()] as i64)
            });
            assert_eq!(got, Ok(positions[k]), "{base:?} {chain:?} at {c:?}: {index}");
        }
    }
}

// ---------------------------------------------------------------- gelu_tanh epilogues

/// Decomposes, simplifies (as the pipeline does) and lowers.
fn lowered_simplified(mut g: Graph, outputs: &[NodeId]) -> LoopProgram {
    g.outputs.extend_from_slice(outputs);
    let d = crate::decompose(&g).unwrap();
    let (s, _) = crate::simplify(&d, &Default::default()).unwrap();
    lower(&s).unwrap_or_else(|e| panic!("{e}\n{s}"))
}

/// `gelu(linear(x, w, b?), tanh)` in `dtype`, x of `x_shape`, `w` `[5, in]`.
fn linear_gelu(dtype: DType, x_shape: &[usize], bias: bool, tanh: bool) -> (Graph, NodeId, NodeId) {
    let mut g = Graph::new();
    let k = *x_shape.last().unwrap();
    let x = g.input(m(x_shape, dtype));
    let w = g.input(m(&[5, k], dtype));
    let mut args = vec![x, w];
    if bias {
        args.push(g.input(m(&[5], dtype)));
    }
    let y = op(&mut g, Op::Linear { bias }, &args);
    let z = op(&mut g, Op::Gelu { tanh }, &[y]);
    (g, y, z)
}

/// The products of a program: (has a bias, activation).
fn products(p: &LoopProgram) -> Vec<(bool, Option<Activation>)> {
    p.nodes
        .iter()
        .filter_map(|n| match &n.kind {
            LoopKind::Extern { call: ExternCall::Bmm { bias, activation, .. }, .. } => {
                Some((bias.is_some(), *activation))
            }
            _ => None,
        })
        .collect()
}

fn pointwise_nodes(p: &LoopProgram) -> usize {
    p.nodes.iter().filter(|n| matches!(n.kind, LoopKind::Pointwise { .. })).count()
}

#[test]
fn gelu_tanh_of_linear_is_one_bmm_call() {
    for (dtype, shape) in [(F32, vec![2, 3, 4]), (DType::BF16, vec![6, 4]), (DType::F16, vec![2, 3, 4])] {
        for bias in [true, false] {
            let (g, _, z) = linear_gelu(dtype, &shape, bias, true);
            let p = lowered_simplified(g, &[z]);
            assert_eq!(products(&p), [(bias, Some(Activation::GeluTanh))], "{dtype} bias={bias}\n{p}");
            assert_eq!(p.nodes.len(), 1, "no pointwise node is left ({dtype}):\n{p}");
            // The call writes the gelu's buffer (the graph output) in the output dtype.
            assert_eq!(p.outputs, [p.nodes[0].output]);
            assert_eq!(
                p.buffer(p.outputs[0]).meta,
                TensorMeta::new(shape[..shape.len() - 1].iter().copied().chain([5]).collect::<Vec<_>>(), dtype)
            );
            let text = p.to_string();
            let want = if bias {
                "extern bmm +bias +gelu_tanh batch=[] m=6 n=5 k=4"
            } else {
                "extern bmm +gelu_tanh batch=[]"
            };
            assert!(text.contains(want), "{text}");
            assert!(text.contains("tanh]"), "origins name the folded ops: {text}");
        }
    }
    // Without `simplify` (COIL_REWRITE=0) the graph is the same.
    let (g, _, z) = linear_gelu(DType::BF16, &[6, 4], true, true);
    assert_eq!(products(&lowered_composite(g, &[z])), [(true, Some(Activation::GeluTanh))]);
}

#[test]
fn other_gelus_and_shared_values_are_not_folded() {
    let unfused = |p: &LoopProgram, what: &str| {
        assert_eq!(products(p), [(true, None)], "{what}:\n{p}");
        assert_eq!(pointwise_nodes(p), 1, "{what}:\n{p}");
    };
    // The exact gelu (erf).
    let (g, _, z) = linear_gelu(F32, &[6, 4], true, false);
    unfused(&lowered_simplified(g, &[z]), "tanh = false");
    let (g, _, z) = linear_gelu(DType::BF16, &[6, 4], true, false);
    unfused(&lowered_simplified(g, &[z]), "tanh = false, bf16");
    // The gelu's input is also an output, or read by another node: the call writes it too
    // (saves it), and the other reader is a kernel of its own.
    for dtype in [F32, DType::BF16] {
        let (g, y, z) = linear_gelu(dtype, &[6, 4], true, true);
        let p = lowered_simplified(g, &[z, y]);
        assert_eq!(products(&p), [(true, Some(Activation::GeluTanh))], "input is an output:\n{p}");
        assert_eq!(p.nodes.len(), 1, "{p}");
        assert_eq!(p.outputs, p.nodes[0].writes(), "the gelu, then its input:\n{p}");
        assert!(p.to_string().contains("saved = buf0_saved"), "{p}");
        let (mut g, y, z) = linear_gelu(dtype, &[6, 4], true, true);
        let e = op(&mut g, Op::Unary(UnaryOp::Exp), &[y]);
        let p = lowered_simplified(g, &[z, e]);
        assert_eq!(products(&p), [(true, Some(Activation::GeluTanh))], "input read by exp:\n{p}");
        assert_eq!(pointwise_nodes(&p), 1, "the exp reads the saved input:\n{p}");
        let saved = p.nodes[0].writes()[1];
        assert!(p.nodes[1].reads().contains(&saved), "{p}");
    }
    // Without a bias the gelu's input is a view of the product: nothing is saved.
    let (g, y, z) = linear_gelu(F32, &[6, 4], false, true);
    let p = lowered_simplified(g, &[z, y]);
    assert_eq!(products(&p), [(false, None)], "no bias, input an output:\n{p}");
    // An intermediate of the formula read by another node (in the primitive graph).
    let (mut g, _, z) = linear_gelu(F32, &[6, 4], true, true);
    g.outputs.push(z);
    let mut d = crate::decompose(&g).unwrap();
    let t = (0..d.nodes.len()).map(NodeId).find(|&n| d.node(n).op == Op::Unary(UnaryOp::Tanh)).unwrap();
    let extra = op(&mut d, Op::Unary(UnaryOp::Exp), &[t]);
    d.outputs.push(extra);
    let p = lower(&d).unwrap();
    assert_eq!(products(&p), [(true, None)], "tanh read elsewhere:\n{p}");
    // A constant that differs from gelu_tanh's.
    let (mut g, _, z) = linear_gelu(F32, &[6, 4], true, true);
    g.outputs.push(z);
    let mut d = crate::decompose(&g).unwrap();
    let c = d.nodes.iter().position(|n| n.op == Op::Full(Scalar::Float(0.044715))).unwrap();
    d.nodes[c].op = Op::Full(Scalar::Float(0.0447));
    let p = lower(&d).unwrap();
    unfused(&p, "another constant");
    // A bf16 product whose gelu computes and returns f32: the call could not write that dtype.
    let mut g = Graph::new();
    let x = g.input(m(&[6, 4], DType::BF16));
    let w = g.input(m(&[5, 4], DType::BF16));
    let b = g.input(m(&[5], DType::BF16));
    let y = op(&mut g, Op::Linear { bias: true }, &[x, w, b]);
    let y = op(&mut g, Op::Cast(F32), &[y]);
    let z = op(&mut g, Op::Gelu { tanh: true }, &[y]);
    unfused(&lowered_simplified(g, &[z]), "bf16 product, f32 gelu");
    // gelu(gelu(linear)): the inner one folds, the outer one is a kernel.
    let (mut g, _, z) = linear_gelu(F32, &[6, 4], true, true);
    let z2 = op(&mut g, Op::Gelu { tanh: true }, &[z]);
    let p = lowered_simplified(g, &[z2]);
    assert_eq!(products(&p), [(true, Some(Activation::GeluTanh))], "{p}");
    assert_eq!(pointwise_nodes(&p), 1, "{p}");
}

#[test]
fn a_data_check_knows_the_captured_node_and_the_dim_it_comes_from() {
    // exp(embedding(w, idx)) + (a // b): the index check comes from captured node 4 (the embedding), the
    // integer division's from node 7, whatever nodes decomposition made.
    let mut g = Graph::new();
    let (w, idx) = (g.input(m(&[5, 3], F32)), g.input(m(&[2], DType::I64)));
    let (a, b) = (g.input(m(&[4], DType::I64)), g.input(m(&[4], DType::I64)));
    let e = op(&mut g, Op::Embedding, &[w, idx]);
    let y = op(&mut g, Op::Unary(UnaryOp::Exp), &[e]);
    let q = op(&mut g, Op::Binary(BinaryOp::Sub), &[a, b]);
    let d = op(&mut g, Op::Binary(BinaryOp::FloorDiv), &[q, b]);
    let p = lowered_composite(g, &[y, d]);
    let checks: Vec<_> = p.data_checks.iter().map(|c| (c.op, c.code, c.dim, c.node)).collect();
    assert!(checks.contains(&("index_select", 1, Some(0), Some(e.0))), "{checks:?}");
    assert!(checks.contains(&("floor_divide", 3, None, Some(d.0))), "{checks:?}");
    assert_eq!(checks.len(), 2, "{checks:?}");
}

/// `cache.scatter(2, broadcast(iota(T) + pos), new * 2)` for `cache` `[2, 3, 8, 4]`, `pos` a 0-d
/// input and `new` `[2, 3, T, 4]`: positions `x2 + pos`, or `step(pos)` where the iota is
/// replaced (a stride, per-element indices); returns the graph and the scatter.
fn cache_write(t: usize, positions: impl Fn(&mut Graph, NodeId, NodeId) -> NodeId) -> (Graph, NodeId) {
    let mut g = Graph::new();
    let cache = g.input(m(&[2, 3, 8, 4], F32));
    let pos = g.input(m(&[], DType::I64));
    let new = g.input(m(&[2, 3, t, 4], F32));
    let iota = g.leaf(Op::Iota { dim: 0 }, m(&[t], DType::I64), None);
    let shifted = positions(&mut g, iota, pos);
    let column = op(&mut g, Op::Reshape { shape: vec![1, 1, t, 1] }, &[shifted]);
    let index = op(&mut g, Op::Expand { shape: vec![2, 3, t, 4] }, &[column]);
    let two = g.leaf(Op::Full(2.0.into()), m(&[2, 3, t, 4], F32), None);
    let src = op(&mut g, Op::Binary(BinaryOp::Mul), &[new, two]);
    let s = op(&mut g, Op::Scatter { dim: 2, reduce: None }, &[cache, index, src]);
    (g, s)
}

fn plus_pos(g: &mut Graph, iota: NodeId, pos: NodeId) -> NodeId {
    let pos = op(g, Op::Expand { shape: g.meta(iota).shape.clone() }, &[pos]);
    op(g, Op::Binary(BinaryOp::Add), &[iota, pos])
}

#[test]
fn a_scatter_at_consecutive_run_time_positions_is_a_pointwise_store() {
    let (g, s) = cache_write(3, plus_pos);
    let p = lowered(g, &[s]);
    snap("lower_cache_write", &p);
    assert_eq!(p.nodes.len(), 1, "{p}");
    let st = p.nodes[0].scatter().expect("a scatter store");
    let e = coil_ir::sym::Expr::int;
    assert_eq!((st.base, st.stride, st.size, st.bound), (BufferId(0), e(4), e(3), e(8)));
    // the window's first position: `pos` plus the iota's first element, the same everywhere
    let body = match &p.nodes[0].kind {
        LoopKind::Pointwise { body, .. } => body,
        k => panic!("{k:?}"),
    };
    assert_eq!(body.value(st.offset).op, coil_ir::loops::ScalarOp::Binary(BinaryOp::Add, ValueId(0), ValueId(1)));
    assert_eq!(body.value(ValueId(0)).op, coil_ir::loops::ScalarOp::Index(e(0)));
    assert_eq!(p.nodes[0].ranges().len(), 4);
    assert!(p.nodes[0].reads().contains(&BufferId(0)), "the base is read");
    // One position (a decode step): the iota of one element is 0, the position `pos`.
    let (g, s) = cache_write(1, plus_pos);
    let p = lowered(g, &[s]);
    assert_eq!(p.nodes[0].scatter().map(|st| st.size), Some(e(1)), "{p}");
    assert_eq!(p.data_checks.len(), 1, "the scatter's index check: {p}");
}

#[test]
fn other_scatters_stay_fallback_calls() {
    let fallback = |p: &LoopProgram| {
        p.nodes.iter().any(|n| matches!(n.kind, LoopKind::Extern { call: ExternCall::Fallback { .. }, .. }))
    };
    // Every other position: two elements of a row could meet another's.
    let (g, s) = cache_write(3, |g, iota, pos| {
        let two = g.leaf(Op::Full(2.into()), m(&[3], DType::I64), None);
        let doubled = op(g, Op::Binary(BinaryOp::Mul), &[iota, two]);
        plus_pos(g, doubled, pos)
    });
    assert!(fallback(&lowered(g, &[s])), "positions 2 * i + pos");
    // A position that differs per element beyond the run (the position read per row).
    let (g, s) = cache_write(3, |g, iota, _| {
        let rows = g.input(m(&[3], DType::I64));
        op(g, Op::Binary(BinaryOp::Add), &[iota, rows])
    });
    assert!(fallback(&lowered(g, &[s])), "positions i + rows[i]");
    // scatter_add accumulates: not a store.
    let mut g = Graph::new();
    let cache = g.input(m(&[8, 4], F32));
    let index = g.leaf(Op::Iota { dim: 0 }, m(&[3, 4], DType::I64), None);
    let src = g.input(m(&[3, 4], F32));
    let s = op(&mut g, Op::Scatter { dim: 0, reduce: Some(ReduceOp::Sum) }, &[cache, index, src]);
    assert!(fallback(&lowered(g, &[s])), "scatter_add");
}

/// `scatter_add(f32(a @ b), index, src)` of a bf16 product (a weight gradient with a tied
/// embedding's rows scattered into it): the cast is the product's widening epilogue, since the
/// scatter's base is a buffer anyway; as the scatter's source it stays a cast of the bf16
/// product.
#[test]
fn a_widened_product_that_is_only_a_scatters_base_is_written_f32_by_the_call() {
    let bf16 = DType::BF16;
    for as_base in [true, false] {
        let mut g = Graph::new();
        let a = g.input(m(&[6, 3], bf16));
        let b = g.input(m(&[3, 4], bf16));
        let index = g.input(m(&[6, 4], DType::I64));
        let other = g.input(m(&[6, 4], F32));
        let product = op(&mut g, Op::Bmm, &[a, b]);
        let wide = op(&mut g, Op::Cast(F32), &[product]);
        let (base, src) = if as_base { (wide, other) } else { (other, wide) };
        let s = op(&mut g, Op::Scatter { dim: 0, reduce: Some(ReduceOp::Sum) }, &[base, index, src]);
        let p = lowered(g, &[s]);
        let call = p.nodes.iter().find(|n| matches!(n.kind, LoopKind::Extern { call: ExternCall::Bmm { .. }, .. }));
        let dtype = p.buffer(call.unwrap().output).meta.dtype;
        assert_eq!(dtype, if as_base { F32 } else { bf16 }, "{p}");
        assert_eq!(p.nodes.len(), if as_base { 2 } else { 3 }, "a cast node only for the source: {p}");
    }
}
