//! The gradients of masked attention where the templates have none to give: the gradient of an
//! added mask (a learned bias). The attention is decomposed where its gradient is taken (its
//! matrix products and safe softmax, as the reference decomposition writes it) and that
//! decomposition is differentiated primitive by primitive, as a graph whose attention never
//! was a template would be: the gradients of q, k, v and the mask all come from it.

use super::{node_is_float, vjp};
use crate::decompose::{decompose_node, Arg, Builder};
use coil_ir::{Node, NodeId, Result};
use indexmap::IndexMap;

/// The gradient contributions of masked attention `node` (operands q, k, v, mask) given the
/// gradient `g` of its output, for the `wanted` operands: the decomposition of `node` is
/// appended (stabilizing maxima detached, as PyTorch's formulas treat them) and differentiated
/// from its output back to the operands.
pub(super) fn decomposed(b: &mut Builder, node: &Node, g: NodeId, wanted: &[bool]) -> Result<Vec<Option<NodeId>>> {
    let start = b.graph().nodes.len();
    let args: Vec<Arg> = node.inputs.iter().map(|&x| Arg::Node(x)).collect();
    let keep_detach = std::mem::replace(&mut b.keep_detach, true);
    let y = decompose_node(b, &node.op, &args, &node.meta);
    b.keep_detach = keep_detach;
    let y = y?;

    // The decomposition's nodes that depend on a wanted operand need gradients.
    let mut needed = vec![false; b.graph().nodes.len()];
    for (&x, &w) in node.inputs.iter().zip(wanted) {
        needed[x.0] |= w;
    }
    for i in start..needed.len() {
        needed[i] = b.graph().node(NodeId(i)).inputs.iter().any(|x| needed[x.0]);
    }
    let mut grads: IndexMap<NodeId, NodeId> = IndexMap::new();
    grads.insert(y, g);
    for i in (start..=y.0).rev() {
        let id = NodeId(i);
        let Some(&gi) = grads.get(&id) else { continue };
        let made = b.graph().node(id).clone();
        if made.op.is_leaf() || !made.inputs.iter().any(|x| needed[x.0]) {
            continue;
        }
        let contributions = vjp(b, id, &made, gi, &needed)?;
        for (&x, dx) in made.inputs.iter().zip(contributions) {
            let Some(dx) = dx else { continue };
            if !needed[x.0] || !node_is_float(b, x) {
                continue;
            }
            let dx = b.cast(dx, b.dtype(x))?;
            let total = match grads.get(&x) {
                Some(&prev) => b.add(prev, dx)?,
                None => dx,
            };
            grads.insert(x, total);
        }
    }
    // An operand given twice (q = k = v) gets its whole gradient once: the caller adds the
    // contributions of its positions.
    let first = |k: usize| !node.inputs[..k].contains(&node.inputs[k]);
    Ok((0..node.inputs.len())
        .map(|k| if wanted[k] && first(k) { grads.get(&node.inputs[k]).copied() } else { None })
        .collect())
}
