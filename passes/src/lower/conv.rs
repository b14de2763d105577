//! Lowering of the convolution template ([`Op::Conv`], kept whole by
//! [`crate::DecomposeOptions::conv_template`]) to one [`ExternCall::Conv`]: each operand a
//! strided view of its buffer when it is dense in some dim order (a channels-last activation
//! is read in place), else first copied to a contiguous buffer; the weight operand (and a
//! weight gradient's result) row-major or channels-last, as cuDNN's filter formats allow.
//!
//! The result is written row-major, or, when its only reader is the permute to channels-last
//! (`[N, C, *spatial]` to `[N, *spatial, C]`; for a weight gradient `[O, C, *k]` to
//! `[O, *k, C]`), into that permute's own row-major buffer: the call writes each element where
//! the permute puts it (cuDNN takes the output's strides, or the channels-last filter format),
//! and the permute costs nothing. A network that keeps its activations channels-last (the
//! permute after each convolution, the inverse one before it, a view of the buffer) so never
//! transposes one.

use super::{affine, flat, view_vars, Lowerer};
use coil_ir::loops::{const_usize, BufferId, ConvCall, ExternCall, LoopKind, LoopNode, TensorView};
use coil_ir::op::ConvForm;
use coil_ir::{Error, NodeId, Op, Result};
use std::collections::HashMap;

/// Convolutions (any form) whose call writes the buffer of the channels-last permute after them:
/// by permute.
pub(crate) fn permuted_outputs(l: &Lowerer) -> HashMap<NodeId, NodeId> {
    let g = l.g;
    let mut found = HashMap::new();
    for n in g.live_nodes() {
        let conv = matches!(g.node(n).op, Op::Conv { .. });
        if !conv || g.outputs.contains(&n) || l.readers[n.0].len() != 1 {
            continue;
        }
        let p = l.readers[n.0][0];
        if let Op::Permute { perm } = &g.node(p).op {
            if is_channels_last(perm) {
                found.insert(p, n);
            }
        }
    }
    found
}

/// Whether `perm` moves dim 1 last and keeps the others in order: `[0, 2, ..., r - 1, 1]`.
fn is_channels_last(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 3 && perm[0] == 0 && perm[r - 1] == 1 && (1..r - 1).all(|j| perm[j] == j + 1)
}

impl Lowerer<'_> {
    /// The extern node computing convolution node `n`, writing its row-major buffer, or the
    /// buffer of its channels-last permute ([`permuted_outputs`]); returns the buffer written.
    pub(crate) fn realize_conv(&mut self, n: NodeId) -> Result<BufferId> {
        let root = self.conv_roots.iter().find(|(_, &c)| c == n).map(|(&p, _)| p);
        if let Some(b) = root.and_then(|p| self.buf[p.0]) {
            return Ok(b);
        }
        let node = self.g.node(n);
        let Op::Conv { geometry, form } = &node.op else { unreachable!("called on convolutions") };
        let (geometry, form) = (geometry.clone(), form.clone());
        let filter_operand = !matches!(form, ConvForm::BackwardWeight { .. });
        let a = self.conv_view(node.inputs[0], false)?;
        let b = self.conv_view(node.inputs[1], filter_operand)?;
        let out = self.g.meta(n).shape.clone();
        let name = format!("buf{}", self.prog.nodes.len());
        let (output, out_strides, folded) = match root {
            Some(p) => {
                // Dim `perm[j]` of the convolution is dim `j` of the permute's row-major buffer.
                let Op::Permute { perm } = &self.g.node(p).op else { unreachable!("a permute root") };
                let permuted = row_major(&self.g.meta(p).shape);
                let mut strides = vec![0; out.len()];
                for (j, &d) in perm.iter().enumerate() {
                    strides[d] = permuted[j];
                }
                (self.new_buffer(name, p), strides, vec![n, p])
            }
            None => (self.new_buffer(name, n), row_major(&out), vec![n]),
        };
        let inputs = vec![a.buffer, b.buffer];
        let call = ExternCall::Conv(Box::new(ConvCall { geometry, form, a, b, out, out_strides }));
        self.prog.nodes.push(LoopNode {
            output,
            origins: self.origins(folded),
            kind: LoopKind::Extern { call, inputs },
        });
        // The convolution itself gets no buffer when the call writes its permute's.
        self.buf[root.unwrap_or(n).0] = Some(output);
        Ok(output)
    }

    /// `x` as a dense strided view of a buffer (see the module docs), copied when it is not one.
    fn conv_view(&mut self, x: NodeId, filter: bool) -> Result<TensorView> {
        let shape: Vec<usize> = self.g.meta(x).shape.clone();
        let exprs = self.shape(x).to_vec();
        let syms = view_vars(&exprs);
        let (base, bidx) = self.resolve(x, &syms);
        let found = affine(flat(&bidx, self.shape(base)), &syms).and_then(|(offset, strides)| {
            let offset = const_usize(&offset)?;
            let strides: Option<Vec<usize>> = strides.iter().map(const_usize).collect();
            Some((offset, strides?))
        });
        if let Some((offset, strides)) = found.filter(|(_, s)| !self.degenerate(base) && usable(&shape, s, filter)) {
            let buffer = self.realize(base)?;
            return Ok(TensorView { buffer, offset, shape, strides });
        }
        let buffer = self.realize(x)?;
        let strides = row_major(&shape);
        if shape.iter().any(|&s| s > i32::MAX as usize) {
            return Err(Error::unsupported(format!("a convolution operand of shape {shape:?}")));
        }
        Ok(TensorView { buffer, offset: 0, shape, strides })
    }
}

/// Row-major strides of `shape`.
fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// Whether cuDNN takes `strides` for `shape` as they are: a filter row-major or channels-last
/// (`[O, C, *k]` with C fastest); data dense in some order of its dims (no gaps, no overlap,
/// no broadcast), ignoring dims of size 1.
fn usable(shape: &[usize], strides: &[usize], filter: bool) -> bool {
    let matches = |want: &[usize]| shape.iter().zip(strides).zip(want).all(|((&n, &s), &w)| n <= 1 || s == w);
    if filter {
        let r = shape.len();
        let mut last = vec![0; r];
        last[1] = 1;
        let mut s = shape[1];
        for d in (2..r).rev() {
            last[d] = s;
            s *= shape[d];
        }
        last[0] = s;
        return matches(&row_major(shape)) || matches(&last);
    }
    let mut dims: Vec<usize> = (0..shape.len()).filter(|&d| shape[d] > 1).collect();
    dims.sort_by_key(|&d| strides[d]);
    let mut want = 1;
    for d in dims {
        if strides[d] != want {
            return false;
        }
        want *= shape[d];
    }
    true
}

#[cfg(test)]
mod tests {
    use super::{is_channels_last, usable};

    #[test]
    fn channels_last_permutes_move_dim_one_last() {
        assert!(is_channels_last(&[0, 2, 3, 1]));
        assert!(is_channels_last(&[0, 2, 1]));
        assert!(is_channels_last(&[0, 2, 3, 4, 1]));
        assert!(!is_channels_last(&[0, 3, 1, 2]));
        assert!(!is_channels_last(&[0, 3, 2, 1]));
        assert!(!is_channels_last(&[1, 0]));
    }

    #[test]
    fn dense_views_in_any_order_are_usable() {
        assert!(usable(&[2, 3, 4, 5], &[60, 20, 5, 1], false));
        assert!(usable(&[2, 3, 4, 5], &[60, 1, 15, 3], false)); // channels-last
        assert!(!usable(&[2, 3, 4, 5], &[120, 40, 10, 2], false)); // a strided slice
        assert!(!usable(&[2, 3, 4, 5], &[0, 20, 5, 1], false)); // broadcast
        assert!(usable(&[4, 3, 2, 2], &[12, 1, 6, 3], true));
        assert!(!usable(&[4, 3, 2, 2], &[12, 4, 1, 2], true)); // spatial dims swapped
    }
}
