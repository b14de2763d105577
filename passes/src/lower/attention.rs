//! The attention template: an [`Op::Attention`] node (kept whole by the compile path's
//! decomposition) becomes one [`ExternCall::Attention`], its q, k and v strided views of their
//! buffers (head views of a QKV projection are never copied).
//!
//! The call writes `[*batch, L, D]` row-major, or, when the only reader of the attention is a
//! permute that keeps the last dim (the `transpose(1, 2)` that merges the heads back), the
//! permute's own row-major buffer: the call writes each element where the permute puts it, and
//! the permute costs nothing.

use super::{strides, Lowerer};
use coil_ir::loops::{BufferId, ExternCall, LoopKind, StridedOperand};
use coil_ir::sym::Expr;
use coil_ir::{Error, NodeId, Op, Result};
use std::collections::HashMap;

/// Attention nodes whose call writes the buffer of the permute after them: by permute.
pub(crate) fn permuted_outputs(l: &Lowerer) -> HashMap<NodeId, NodeId> {
    let g = l.g;
    let mut found = HashMap::new();
    for n in g.live_nodes() {
        if !g.node(n).op.is_template() || g.outputs.contains(&n) || l.readers[n.0].len() != 1 {
            continue;
        }
        let p = l.readers[n.0][0];
        if let Op::Permute { perm } = &g.node(p).op {
            if perm.last() == Some(&(perm.len() - 1)) {
                found.insert(p, n);
            }
        }
    }
    found
}

impl Lowerer<'_> {
    /// The call computing attention node `att` into the buffer of `root`: `att` itself, or the
    /// permute reading it ([`permuted_outputs`]). `out.buffer` is a placeholder: the caller
    /// sets it to the buffer it makes for `root`.
    pub(crate) fn attention(&mut self, att: NodeId, root: NodeId) -> Result<LoopKind> {
        let node = self.g.node(att);
        let Op::Attention { causal, scale, mask: false } = node.op else {
            return Err(Error::unsupported(format!("{} as a template (an explicit mask)", node.op)));
        };
        let (q, k, v) = (node.inputs[0], node.inputs[1], node.inputs[2]);
        let (qv, kv, vv) = (self.strided(q)?, self.strided(k)?, self.strided(v)?);
        let qs = self.shape(q);
        let r = qs.len();
        let (l, d, s) = (qs[r - 2], qs[r - 1], self.shape(k)[r - 2]);
        let scale = scale.unwrap_or(1.0 / (self.meta(q).shape[r - 1] as f64).sqrt());
        let out_strides = if root == att {
            strides(self.shape(att))
        } else {
            // Dim `perm[j]` of the attention is dim `j` of the permute's row-major buffer.
            let Op::Permute { perm } = &self.g.node(root).op else { unreachable!("a permute root") };
            let permuted = strides(self.shape(root));
            let mut out = vec![Expr::int(0); r];
            for (j, &p) in perm.iter().enumerate() {
                out[p] = permuted[j];
            }
            out
        };
        let out = StridedOperand {
            buffer: BufferId(usize::MAX),
            offset: Expr::int(0),
            batch_strides: out_strides[..r - 2].to_vec(),
            row_stride: out_strides[r - 2],
            col_stride: out_strides[r - 1],
        };
        let inputs = vec![qv.buffer, kv.buffer, vv.buffer];
        let batch = self.shape(att)[..r - 2].to_vec();
        let call = ExternCall::Attention { q: qv, k: kv, v: vv, out, batch, l, s, d, causal, scale };
        Ok(LoopKind::Extern { call, inputs })
    }
}
