//! The attention templates: template nodes become extern calls that never write the
//! `[*batch, L, S]` scores to memory, their q, k, v (and output gradient) strided views of
//! their buffers (head views of a QKV projection are never copied). An explicit mask is a view
//! too, broadcast to the scores by zero strides: the small mask a decode step builds
//! (`[rows, capacity]`) is never expanded over the batch and heads. A structured mask
//! ([`crate::attention::structured_mask`]: keys up to a run-time position, per row) is not even
//! read: the call gets its rule ([`MaskRule`]), and the mask is never computed.
//!
//! One call computes a *group* of template nodes ([`template_groups`]): an [`Op::Attention`]
//! with the [`Op::AttentionLogsumexp`] of the same operands (an [`ExternCall::Attention`] that
//! also writes the logsumexp a backward reads), or the [`Op::AttentionBackward`] nodes of one
//! attention, one per gradient (one [`ExternCall::AttentionBackward`] writing each). The call
//! is one loop node writing several buffers: the first member's (its `output`) and the
//! others'.
//!
//! The forward call writes `[*batch, L, D]` row-major, or, when the only reader of the
//! attention is a permute that keeps the last dim (the `transpose(1, 2)` that merges the heads
//! back), the permute's own row-major buffer: the call writes each element where the permute
//! puts it, and the permute costs nothing.

use super::{strides, Lowerer};
use coil_ir::loops::{
    AttentionBackwardCall, AttentionCall, BufferId, ExternCall, LoopKind, LoopNode, MaskRule, StridedOperand,
};
use coil_ir::sym::Expr;
use coil_ir::{AttentionInput, Error, NodeId, Op, Result};
use std::collections::HashMap;

/// Attention nodes whose call writes the buffer of the permute after them: by permute. The
/// permute must be the attention's one reader but for attention backward calls, which read
/// the output as a strided view of that buffer (a training graph's forward writes the heads
/// in the layout the projection after it reads).
pub(crate) fn permuted_outputs(l: &Lowerer) -> HashMap<NodeId, NodeId> {
    let g = l.g;
    let mut found = HashMap::new();
    for n in g.live_nodes() {
        if !matches!(g.node(n).op, Op::Attention { .. }) || g.outputs.contains(&n) {
            continue;
        }
        // A backward reads the attention as its output (operand 5) only.
        let backward = |r: NodeId| {
            let node = g.node(r);
            matches!(node.op, Op::AttentionBackward { .. })
                && node.inputs.iter().enumerate().all(|(i, &x)| i == 5 || x != n)
        };
        let (permutes, others): (Vec<NodeId>, Vec<NodeId>) =
            l.readers[n.0].iter().partition(|&&r| matches!(g.node(r).op, Op::Permute { .. }));
        if permutes.len() != 1 || !others.into_iter().all(backward) {
            continue;
        }
        if let Op::Permute { perm } = &g.node(permutes[0]).op {
            if perm.last() == Some(&(perm.len() - 1)) {
                found.insert(permutes[0], n);
            }
        }
    }
    found
}

/// The template nodes one call computes together, in graph order: the live template nodes
/// grouped by operands and attributes, the forward ops (attention, its logsumexp) apart from
/// the gradients, at most one node of each op (and gradient) per group. By node, the index of
/// its group in the returned list.
pub(crate) fn template_groups(l: &Lowerer) -> (HashMap<NodeId, usize>, Vec<Vec<NodeId>>) {
    let g = l.g;
    // (backward?, operands, causal, scale bits) of each group, and the group.
    let mut keys: Vec<(bool, Vec<NodeId>, bool, Option<u64>)> = Vec::new();
    let mut groups: Vec<Vec<NodeId>> = Vec::new();
    let mut group_of = HashMap::new();
    for n in g.live_nodes() {
        let node = g.node(n);
        // A masked attention and its logsumexp have the mask among their operands: their group
        // is another than the maskless attention's on the same q, k, v.
        let key = match node.op {
            Op::Attention { causal, scale, .. } | Op::AttentionLogsumexp { causal, scale, .. } => {
                (false, node.inputs.clone(), causal, scale.map(f64::to_bits))
            }
            // Gradients of attentions with different dropouts read different outputs: the
            // operands tell them apart.
            Op::AttentionBackward { causal, scale, .. } => (true, node.inputs.clone(), causal, scale.map(f64::to_bits)),
            _ => continue,
        };
        let found = (0..groups.len())
            .find(|&i| keys[i] == key && groups[i].iter().all(|&m| !same_member(&g.node(m).op, &node.op)));
        let i = found.unwrap_or_else(|| {
            keys.push(key);
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(n);
        group_of.insert(n, i);
    }
    (group_of, groups)
}

/// Whether two template ops would take the same place in a group: the same op, or (for
/// attention, forward or backward) the same op but for its dropout, so that two attentions of
/// the same operands with different dropouts are two calls.
fn same_member(a: &Op, b: &Op) -> bool {
    match (a, b) {
        (Op::Attention { .. }, Op::Attention { .. }) => true,
        (Op::AttentionBackward { input: x, .. }, Op::AttentionBackward { input: y, .. }) => x == y,
        _ => a == b,
    }
}

impl Lowerer<'_> {
    /// The buffer holding template node `n`, or the permute an attention writes
    /// ([`permuted_outputs`]): the call of `n`'s group is made first if it is not yet.
    pub(crate) fn realize_template(&mut self, n: NodeId) -> Result<BufferId> {
        if let Some(b) = self.buf[n.0] {
            return Ok(b);
        }
        let member = self.attention_roots.get(&n).copied().unwrap_or(n);
        let group = self.groups[self.group_of[&member]].clone();
        let backward = matches!(self.g.node(group[0]).op, Op::AttentionBackward { .. });
        if backward {
            self.attention_backward(&group)?;
        } else {
            self.attention(&group)?;
        }
        self.buf[n.0].ok_or_else(|| {
            let what = self.g.node(n).op.name();
            Error::runtime(format!("the attention call of {n} ({what}) does not write it"))
        })
    }

    /// The forward call of a group: the attention (into its buffer or its permute's) and the
    /// logsumexp, whichever the group has (without the attention, the output goes to a buffer
    /// of its own that nothing reads).
    fn attention(&mut self, group: &[NodeId]) -> Result<()> {
        let att = group.iter().copied().find(|&m| matches!(self.g.node(m).op, Op::Attention { .. }));
        let lse = group.iter().copied().find(|&m| matches!(self.g.node(m).op, Op::AttentionLogsumexp { .. }));
        let first = self.g.node(group[0]);
        let (Op::Attention { causal, scale, .. } | Op::AttentionLogsumexp { causal, scale, .. }) = first.op else {
            unreachable!("a forward group")
        };
        let (q, k, v) = (first.inputs[0], first.inputs[1], first.inputs[2]);
        let (qv, kv, vv) = (self.strided(q)?, self.strided(k)?, self.strided(v)?);
        let qs = self.shape(q);
        let r = qs.len();
        let (l, d, s) = (qs[r - 2], qs[r - 1], self.shape(k)[r - 2]);
        let scale = scale.unwrap_or(1.0 / (self.meta(q).shape[r - 1] as f64).sqrt());
        let batch = qs[..r - 2].to_vec();
        // A structured mask is its rule (the offset buffer the last input): the mask's own
        // nodes get no reader here, and are not computed unless something else reads them.
        // Operands are realized before the call's buffers are named: a realization pushes a
        // node, and names follow the node count.
        let (mask, mask_rule) = match (first.inputs.get(3), crate::attention::mask_rule_of(self.g, first)) {
            (Some(_), Some(rule)) => {
                let offset = rule.offset.map(|o| self.realize(o)).transpose()?;
                (None, Some(MaskRule { offset, constant: rule.constant, period: rule.period }))
            }
            (Some(&m), None) => (Some(self.mask_view(m, r)?), None),
            (None, _) => (None, None),
        };
        let name = format!("buf{}", self.prog.nodes.len());
        // Where the output goes: the attention's buffer, its permute's, or one of its own.
        let root = att.map(|a| self.attention_roots.iter().find(|(_, &x)| x == a).map_or(a, |(&p, _)| p));
        let (output, out_strides) = match (att, root) {
            (Some(a), Some(root)) if root != a => (self.new_buffer(name.clone(), root), self.unpermuted_strides(root)),
            (Some(a), _) => (self.new_buffer(name.clone(), a), strides(self.shape(a))),
            (None, _) => {
                let shape: Vec<Expr> = batch.iter().copied().chain([l, self.shape(v)[r - 1]]).collect();
                let out = strides(&shape);
                (self.new_buffer_of(name.clone(), shape, self.meta(q).dtype), out)
            }
        };
        let out = StridedOperand {
            buffer: output,
            offset: Expr::int(0),
            batch_strides: out_strides[..r - 2].to_vec(),
            row_stride: out_strides[r - 2],
            col_stride: out_strides[r - 1],
        };
        let lse_buffer = lse.map(|m| self.new_buffer(format!("{name}_lse"), m));
        let mut inputs = vec![qv.buffer, kv.buffer, vv.buffer];
        inputs.extend(mask.as_ref().map(|m| m.buffer).or(mask_rule.as_ref().and_then(|r| r.offset)));
        let call = ExternCall::Attention(Box::new(AttentionCall {
            q: qv,
            k: kv,
            v: vv,
            out,
            lse: lse_buffer,
            batch,
            l,
            s,
            d,
            causal,
            scale,
            mask,
            mask_rule,
            dropout: att.and_then(|a| self.g.node(a).op.attention_dropout()),
        }));
        let folded: Vec<NodeId> = group.iter().copied().chain(root).collect();
        self.push_template(output, folded, LoopKind::Extern { call, inputs });
        if let (Some(root), Some(a)) = (root, att) {
            // The attention itself gets no buffer when the call writes its permute's.
            self.buf[root.0] = Some(output);
            if root == a {
                self.buf[a.0] = Some(output);
            }
        }
        if let (Some(m), Some(b)) = (lse, lse_buffer) {
            self.buf[m.0] = Some(b);
        }
        Ok(())
    }

    /// An attention mask (rank 2 to `rank`, broadcastable to the `[*batch, L, S]` scores of
    /// rank `rank`) as a view of the scores' shape: its own strides (size-1 dims get stride 0),
    /// missing leading dims stride 0 too. Nothing of the scores' size is written.
    fn mask_view(&mut self, mask: NodeId, rank: usize) -> Result<StridedOperand> {
        let shape = self.shape(mask);
        if shape.len() < 2 || shape.len() > rank {
            let meta = self.meta(mask);
            return Err(Error::unsupported(format!(
                "an attention mask {meta} for scores of rank {rank} (the template reads masks of rank 2 to {rank})"
            )));
        }
        let mut view = self.strided(mask)?;
        let (r, one) = (shape.len(), |e: &Expr| e.const_value() == Some(1));
        for (stride, size) in
            view.batch_strides.iter_mut().chain([&mut view.row_stride, &mut view.col_stride]).zip(shape)
        {
            if one(size) {
                *stride = Expr::int(0);
            }
        }
        view.batch_strides.splice(0..0, std::iter::repeat_n(Expr::int(0), rank - r));
        Ok(view)
    }

    /// The strides of an attention's dims in the row-major buffer of the permute `root` after
    /// it: dim `perm[j]` of the attention is dim `j` of the permute.
    fn unpermuted_strides(&self, root: NodeId) -> Vec<Expr> {
        let Op::Permute { perm } = &self.g.node(root).op else { unreachable!("a permute root") };
        let permuted = strides(self.shape(root));
        let mut out = vec![Expr::int(0); perm.len()];
        for (j, &p) in perm.iter().enumerate() {
            out[p] = permuted[j];
        }
        out
    }

    /// The attention output `o` as a strided operand: a view of the buffer of the permute
    /// after it where its call writes that ([`permuted_outputs`]), else its own.
    fn attention_output(&mut self, o: NodeId) -> Result<StridedOperand> {
        let Some((&root, _)) = self.attention_roots.iter().find(|(_, &a)| a == o) else { return self.strided(o) };
        let buffer = self.realize_template(root)?;
        let st = self.unpermuted_strides(root);
        let r = st.len();
        Ok(StridedOperand {
            buffer,
            offset: Expr::int(0),
            batch_strides: st[..r - 2].to_vec(),
            row_stride: st[r - 2],
            col_stride: st[r - 1],
        })
    }

    /// The backward call of a group: one gradient buffer per member, the first the node's
    /// output; the forward's mask, if any, read as a view as the forward reads it.
    fn attention_backward(&mut self, group: &[NodeId]) -> Result<()> {
        let first = self.g.node(group[0]);
        let Op::AttentionBackward { causal, scale, dropout, .. } = first.op else { unreachable!("a backward group") };
        let x = first.inputs.clone();
        let (qv, kv, vv, gv) = (self.strided(x[0])?, self.strided(x[1])?, self.strided(x[2])?, self.strided(x[3])?);
        let (lse, out) = (self.realize(x[4])?, self.attention_output(x[5])?);
        let qs = self.shape(x[0]);
        let r = qs.len();
        let (l, d, s) = (qs[r - 2], qs[r - 1], self.shape(x[1])[r - 2]);
        let scale = scale.unwrap_or(1.0 / (self.meta(x[0]).shape[r - 1] as f64).sqrt());
        // Realized before the gradients' buffers are named (see `attention`).
        let mask = x.get(6).map(|&m| self.mask_view(m, r)).transpose()?;
        let name = format!("buf{}", self.prog.nodes.len());
        // Members in gradient order (q, k, v): the first writes the node's output buffer.
        let mut members: Vec<(AttentionInput, NodeId)> = group
            .iter()
            .map(|&m| match self.g.node(m).op {
                Op::AttentionBackward { input, .. } => (input, m),
                _ => unreachable!("a backward group"),
            })
            .collect();
        members.sort_by_key(|(input, _)| input.index());
        let mut grads: [Option<StridedOperand>; 3] = [None, None, None];
        for (i, &(input, m)) in members.iter().enumerate() {
            let named = if i == 0 { name.clone() } else { format!("{name}_d{}", input.name()) };
            // Or into the buffer of the sum that concatenates the gradients (`concat_views`).
            if let Some(view) = self.placed_gradient(m, &named) {
                grads[input.index()] = Some(view);
                continue;
            }
            let buffer = self.new_buffer(named, m);
            let st = strides(self.shape(m));
            grads[input.index()] = Some(StridedOperand {
                buffer,
                offset: Expr::int(0),
                batch_strides: st[..r - 2].to_vec(),
                row_stride: st[r - 2],
                col_stride: st[r - 1],
            });
            self.buf[m.0] = Some(buffer);
        }
        let output = grads.iter().flatten().next().expect("a group has a member").buffer;
        let mut inputs = vec![qv.buffer, kv.buffer, vv.buffer, gv.buffer, lse, out.buffer];
        inputs.extend(mask.as_ref().map(|m| m.buffer));
        let [dq, dk, dv] = grads;
        let call = ExternCall::AttentionBackward(Box::new(AttentionBackwardCall {
            q: qv,
            k: kv,
            v: vv,
            grad_out: gv,
            lse,
            out,
            dq,
            dk,
            dv,
            batch: qs[..r - 2].to_vec(),
            l,
            s,
            d,
            causal,
            scale,
            mask,
            dropout,
        }));
        self.push_template(output, group.to_vec(), LoopKind::Extern { call, inputs });
        Ok(())
    }

    /// Appends a template call's loop node.
    fn push_template(&mut self, output: BufferId, folded: Vec<NodeId>, kind: LoopKind) {
        let origins = self.origins(folded);
        self.prog.nodes.push(LoopNode { output, origins, kind });
    }
}
