//! Gradients written in place into the sum that concatenates them.
//!
//! **What.** When q, k and v are head views of one projection output (`qkv[B, T, 3C]` split
//! along its last dim, each part reshaped to `[B, T, H, D]` and permuted to `[B, H, T, D]`),
//! the gradient of `qkv` is the gradient of the split: each attention gradient taken back
//! through its views and padded with zeros to `[B, T, 3C]`, and the pads summed,
//! `S = pad(view(dq)) + pad(view(dk)) + pad(view(dv))`. Lowered as it stands, the backward
//! call writes dq, dk and dv into three buffers and a pointwise kernel (`poi_fused_add_pad`)
//! reads them all and writes `S` again. Here the backward call writes each gradient straight
//! into `S`'s buffer, through the strided view that puts element `(b, h, t, d)` where `S`
//! holds it, and `S` needs no kernel: its buffer is the call's.
//!
//! **Why it is exact.** Every element of `S` lies in exactly one pad's interior (the
//! interiors are disjoint and cover `S`), where `S` is that gradient's element plus zeros:
//! the element itself (but for the sign of a zero: `-0 + 0` is `+0`). A view chain of
//! permutes and reshapes is a bijection, so each gradient's elements land on its pad's
//! interior one for one.
//!
//! **Why it costs nothing elsewhere.** `S` gets a buffer where it might have been inlined into
//! its readers, but that buffer replaces the gradients' own buffers element for element: the
//! bytes written are `S`'s instead of the gradients' (the same count), and a reader that
//! inlined `S` loaded the gradient buffers where it now loads `S`'s (the same elements).
//! In a training step `S` is read by matrix products anyway (the input and weight gradients of
//! the projection), so it was realized already and its kernel is saved outright.
//!
//! **Conditions** ([`placed_gradients`]; when any fails the gradients keep buffers of their
//! own and `S` its kernel):
//!
//! * `S` is a tree of adds of the same shape and dtype whose leaves are pads by zeros; the
//!   adds below its root have one reader each (their parent) and are no graph outputs;
//! * each pad reads, through permutes and reshapes only (no expand, slice or cast), an
//!   attention backward node of `S`'s dtype; the backward node, every view and the pad have
//!   one reader each (the next node of the chain) and are no graph outputs, so nothing else
//!   reads a gradient;
//! * all the backward nodes belong to one call ([`super::attention::template_groups`]), each
//!   at most once (a call writes each buffer it writes completely);
//! * the pads' interiors are pairwise disjoint and their sizes add up to `S`'s (so they
//!   cover it);
//! * each gradient's element map into `S` (the views composed, then the pad's offset,
//!   flattened row-major) is affine in the gradient's index: `offset + sum(i_k * stride_k)`,
//!   derived symbolically and checked to rebuild the composed index exactly;
//! * sizes are static (the cover is checked on numbers).
//!
//! Members of the call that feed no such sum (a gradient used elsewhere) keep buffers of their
//! own; the call may write several sums (a cross attention's key/value projection, say).

use super::{flat, view::reshape_index, view_vars, Lowerer};
use coil_ir::loops::StridedOperand;
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, NodeId, Op};
use std::collections::{HashMap, HashSet};

/// Where an attention backward call writes one gradient: into the buffer of `sum`, element
/// `i` of the gradient at `offset + sum(i_k * strides[k])`.
#[derive(Clone, Debug)]
pub(crate) struct Placed {
    /// The sum of pads whose buffer the call writes.
    pub sum: NodeId,
    /// The element offset of the gradient's element 0 in the sum's buffer.
    pub offset: Expr,
    /// The element stride of each of the gradient's dims in the sum's buffer.
    pub strides: Vec<Expr>,
}

/// The gradients found, and the nodes the calls make free.
#[derive(Debug, Default)]
pub(crate) struct PlacedGradients {
    /// By attention backward node, where its call writes it.
    pub placed: HashMap<NodeId, Placed>,
    /// By sum, one backward node whose call writes it (the sum is that call's root).
    pub roots: HashMap<NodeId, NodeId>,
    /// The backward nodes, views, pads and inner adds that get no buffer and no loop.
    pub inside: Vec<NodeId>,
}

/// Finds the sums of padded attention gradients that the backward calls can write in place
/// (see the module docs for the conditions).
pub(crate) fn placed_gradients(l: &Lowerer) -> PlacedGradients {
    let mut found = PlacedGradients::default();
    let mut taken: HashSet<NodeId> = HashSet::new();
    // Later sums first: the largest tree of adds is the one whose root is the sum.
    for n in l.g.live_nodes().into_iter().rev() {
        if taken.contains(&n) || l.inside.contains(&n) || l.epilogues.contains_key(&n) {
            continue;
        }
        if let Some(sum) = match_sum(l, n) {
            taken.extend(sum.inside.iter().copied());
            found.roots.insert(n, sum.placed[0].0);
            found.inside.extend(sum.inside);
            found
                .placed
                .extend(sum.placed.into_iter().map(|(m, offset, strides)| (m, Placed { sum: n, offset, strides })));
        }
    }
    found
}

/// One sum that matched: its gradients with their views into it, and the nodes it frees.
struct SumMatch {
    placed: Vec<(NodeId, Expr, Vec<Expr>)>,
    inside: Vec<NodeId>,
}

/// `s` as a sum of padded gradients of one attention backward call, if it is one.
fn match_sum(l: &Lowerer, s: NodeId) -> Option<SumMatch> {
    let g = l.g;
    if !is_add(l, s) || !constant_shape(l.shape(s)) {
        return None;
    }
    let meta = l.meta(s);
    // The pads under the tree of adds, and the inner adds.
    let (mut pads, mut inside, mut stack) = (Vec::new(), Vec::new(), g.node(s).inputs.clone());
    while let Some(x) = stack.pop() {
        if l.meta(x) != meta || !private(l, x) {
            return None;
        }
        if is_add(l, x) {
            inside.push(x);
            stack.extend(g.node(x).inputs.iter().copied());
        } else if matches!(&g.node(x).op, Op::Pad { value, .. } if value.as_f64() == 0.0) {
            pads.push(x);
        } else {
            return None;
        }
    }
    // Each pad's interior (as numbers) and its gradient's place in `s`.
    let mut boxes: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut placed = Vec::new();
    for &p in &pads {
        let Op::Pad { pads: widths, .. } = &g.node(p).op else { unreachable!("a pad") };
        let attrs = l.attrs(p);
        let x = g.node(p).inputs[0];
        if !constant_shape(l.shape(x)) || !constant_shape(attrs) {
            return None;
        }
        boxes.push(widths.iter().zip(&l.meta(x).shape).map(|(&(before, _), &n)| (before, before + n)).collect());
        let (m, chain) = view_chain(l, x)?;
        inside.extend(chain);
        inside.extend([p, m]);
        let (offset, strides) = element_map(l, m, p)?;
        placed.push((m, offset, strides));
    }
    // One call, each gradient once.
    let group = l.group_of.get(&placed[0].0)?;
    let mut members: Vec<NodeId> = placed.iter().map(|(m, ..)| *m).collect();
    members.sort();
    members.dedup();
    if members.len() != placed.len() || members.iter().any(|m| l.group_of.get(m) != Some(group)) {
        return None;
    }
    // The interiors are disjoint and cover `s`.
    let volume = |b: &Vec<(usize, usize)>| b.iter().map(|(lo, hi)| hi - lo).product::<usize>();
    let disjoint = |a: &Vec<(usize, usize)>, b: &Vec<(usize, usize)>| {
        a.iter().zip(b).any(|(&(alo, ahi), &(blo, bhi))| ahi <= blo || bhi <= alo)
    };
    let covered: usize = boxes.iter().map(volume).sum();
    let apart = boxes.iter().enumerate().all(|(i, a)| boxes[i + 1..].iter().all(|b| disjoint(a, b)));
    (covered == meta.numel() && apart).then_some(SumMatch { placed, inside })
}

/// Whether `n` is an add of two operands of its own shape (no broadcast) and dtype.
fn is_add(l: &Lowerer, n: NodeId) -> bool {
    let node = l.g.node(n);
    node.op == Op::Binary(BinaryOp::Add) && node.inputs.iter().all(|&x| l.meta(x) == &node.meta)
}

/// Whether `n` has one reader (once) and is no graph output: nothing else sees its value.
fn private(l: &Lowerer, n: NodeId) -> bool {
    l.readers[n.0].len() == 1 && !l.g.outputs.contains(&n)
}

/// Whether every size is a number (the cover is checked on numbers).
fn constant_shape(shape: &[Expr]) -> bool {
    shape.iter().all(|e| e.const_value().is_some())
}

/// The attention backward node behind `x`'s permutes and reshapes, each node of the chain (and
/// the backward node) private, with the views from the top down; `None` if the chain holds
/// another op.
fn view_chain(l: &Lowerer, mut x: NodeId) -> Option<(NodeId, Vec<NodeId>)> {
    let mut chain = Vec::new();
    loop {
        let node = l.g.node(x);
        if !private(l, x) || !constant_shape(l.shape(x)) {
            return None;
        }
        match node.op {
            Op::Permute { .. } | Op::Reshape { .. } => {
                chain.push(x);
                x = node.inputs[0];
            }
            Op::AttentionBackward { .. } if l.meta(x).numel() > 0 => return Some((x, chain)),
            _ => return None,
        }
    }
}

/// Where element `i` of gradient `m` lands in the sum that pad `p` (of `m`'s views) feeds:
/// `offset + sum(i_k * strides[k])`, if that map is affine. Each view maps an index into its
/// operand to one into itself (the inverse of what a load through it computes: a permute puts
/// dim `perm[d]` at `d`, a reshape regroups row-major), the pad adds its leading widths.
fn element_map(l: &Lowerer, m: NodeId, p: NodeId) -> Option<(Expr, Vec<Expr>)> {
    let g = l.g;
    let syms = view_vars(l.shape(m));
    let (mut n, mut idx) = (m, syms.clone());
    while n != p {
        let reader = l.readers[n.0][0];
        let node = g.node(reader);
        idx = match &node.op {
            Op::Permute { perm } => perm.iter().map(|&q| idx[q]).collect(),
            // Reading the reshape's input at `idx` is the reshape, viewed from its output.
            Op::Reshape { .. } => reshape_index(l.shape(reader), l.shape(n), &node.meta.shape, &l.meta(n).shape, &idx),
            Op::Pad { .. } => {
                let widths = l.attrs(reader);
                idx.iter().enumerate().map(|(d, &i)| i + widths[2 * d]).collect()
            }
            _ => unreachable!("checked by view_chain"),
        };
        n = reader;
    }
    super::affine(flat(&idx, l.shape(p)), &syms)
}

impl Lowerer<'_> {
    /// Where the backward call writes gradient `m` when it goes straight into the buffer of
    /// the sum it feeds ([`placed_gradients`]): a view of that buffer, made (named `name`) by
    /// the first gradient placed in it. `None`: the gradient gets a buffer of its own.
    pub(crate) fn placed_gradient(&mut self, m: NodeId, name: &str) -> Option<StridedOperand> {
        let Placed { sum, offset, strides } = self.placed.get(&m)?.clone();
        let buffer = match self.buf[sum.0] {
            Some(b) => b,
            None => {
                let b = self.new_buffer(name.to_string(), sum);
                self.buf[sum.0] = Some(b);
                b
            }
        };
        let r = strides.len();
        Some(StridedOperand {
            buffer,
            offset,
            batch_strides: strides[..r - 2].to_vec(),
            row_stride: strides[r - 2],
            col_stride: strides[r - 1],
        })
    }
}

#[cfg(test)]
#[path = "concat_views_tests.rs"]
mod tests;
