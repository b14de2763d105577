//! Lowering of the convolution template ([`Op::Conv`], kept whole by
//! [`crate::DecomposeOptions::conv_template`]) to one [`ExternCall::Conv`]: each operand a
//! strided view of its buffer when it is dense in some dim order (a channels-last activation
//! is read in place), else first copied to a contiguous buffer; the weight operand (and a
//! weight gradient's result) row-major or channels-last, as cuDNN's filter formats allow.

use super::{affine, flat, view_vars, Lowerer};
use coil_ir::loops::{const_usize, BufferId, ConvCall, ExternCall, LoopKind, LoopNode, TensorView};
use coil_ir::op::ConvForm;
use coil_ir::{Error, NodeId, Op, Result};

impl Lowerer<'_> {
    /// The extern node computing convolution node `n`, writing its row-major buffer.
    pub(crate) fn realize_conv(&mut self, n: NodeId) -> Result<BufferId> {
        let node = self.g.node(n);
        let Op::Conv { geometry, form } = &node.op else { unreachable!("called on convolutions") };
        let (geometry, form) = (geometry.clone(), form.clone());
        let filter_operand = !matches!(form, ConvForm::BackwardWeight { .. });
        let a = self.conv_view(node.inputs[0], false)?;
        let b = self.conv_view(node.inputs[1], filter_operand)?;
        let out = self.g.meta(n).shape.clone();
        let inputs = vec![a.buffer, b.buffer];
        let call = ExternCall::Conv(Box::new(ConvCall { geometry, form, a, b, out }));
        let output = self.new_buffer(format!("buf{}", self.prog.nodes.len()), n);
        self.prog.nodes.push(LoopNode {
            output,
            origins: self.origins(vec![n]),
            kind: LoopKind::Extern { call, inputs },
        });
        self.buf[n.0] = Some(output);
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
    use super::usable;

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
