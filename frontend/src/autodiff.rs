//! Gradients of lazy tensors: [`grad`] (`torch.autograd.grad`) and [`value_and_grad`].
//!
//! A gradient is more lazy tensors, not a number: [`grad`] captures the graph behind the output
//! (through the computed tensors that depend on what it differentiates with respect to),
//! decomposes it to primitives, lets
//! [`coil_passes::autodiff::backward`] append the gradient nodes, and records every node the
//! gradients need as a pending tensor. Realizing the gradients then compiles forward and
//! backward as one graph, fused and scheduled together (what AOTAutograd gives torch.compile),
//! and a training step inside a [`crate::CompiledFn`] is captured whole.

use crate::realize::capture_walk;
use crate::tensor::Tensor;
use coil_ir::{Op, Result};
use std::panic::Location;

/// The gradients of `output` (one element, floating) with respect to each of `wrt`, in order,
/// as pending tensors (`torch.autograd.grad(output, wrt)`).
///
/// `wrt` may be data (weights, inputs) or tensors computed from them. A tensor that `output`
/// does not depend on is an error naming it; one it depends on only through ops with zero
/// derivative (comparisons, `floor`, integer casts) gets zeros.
///
/// ```
/// use coil_frontend::{grad, Tensor};
/// let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
/// let loss = w.mul(&w).unwrap().sum(&[0], false).unwrap(); // sum(w^2)
/// let g = grad(&loss, &[&w]).unwrap();
/// assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
/// ```
#[track_caller]
pub fn grad(output: &Tensor, wrt: &[&Tensor]) -> Result<Vec<Tensor>> {
    Ok(value_and_grad(output, wrt)?.1)
}

/// `output` recomputed in the gradients' graph, and its gradients (see [`grad`]). Realizing the
/// value with the gradients computes the forward pass once, where realizing `output` itself with
/// them could compute it twice.
#[track_caller]
pub fn value_and_grad(output: &Tensor, wrt: &[&Tensor]) -> Result<(Tensor, Vec<Tensor>)> {
    let caller = Location::caller();
    let mut roots = vec![output];
    roots.extend_from_slice(wrt);
    let (captured, inputs) = capture_walk(&roots, wrt);
    // Attention the template supports stays one template node (written out or
    // `scaled_dot_product_attention`), and its gradients become the backward template: neither
    // direction materializes the scores. Attention it does not support decomposes, the products
    // of half-precision attention on tensor cores, forward and backward.
    let options = coil_passes::DecomposeOptions { fused_attention: true, keep_detach: true, half_products: true };
    let mut graph = coil_passes::decompose_with(&captured.graph, &options)?;
    let (out, targets) = (graph.outputs[0], graph.outputs[1..].to_vec());
    let grads = coil_passes::autodiff::backward(&mut graph, out, None, &targets).map_err(|mut e| {
        // Errors of the whole request point at the caller of grad.
        if e.location.is_none() {
            e = e.at(caller);
        }
        e
    })?;

    // Record the nodes the value and the gradients read as pending tensors.
    graph.outputs = std::iter::once(out).chain(grads.iter().copied()).collect();
    let mut tensors: Vec<Option<Tensor>> = vec![None; graph.nodes.len()];
    for id in graph.live_nodes() {
        let node = graph.node(id);
        let t = match &node.op {
            Op::Input { index } => inputs[*index].clone(),
            // Differentiated already: the value is the operand's.
            Op::Detach => tensors[node.inputs[0].0].clone().expect("operands come first"),
            // The numbers the forward graph drew: its stream's start, plus the offset.
            Op::Rand { dist, stream, offset } => {
                let draw = captured.random[*stream].advanced(*offset);
                Tensor::random_leaf_on(*dist, node.meta.clone(), captured.device, draw, node.location)
            }
            op if op.is_leaf() => Tensor::leaf_on(op.clone(), node.meta.clone(), captured.device, node.location),
            op => {
                let srcs: Vec<&Tensor> =
                    node.inputs.iter().map(|x| tensors[x.0].as_ref().expect("operands come first")).collect();
                let location = node.location.unwrap_or(caller);
                match with_weak_constants(&graph, id, &srcs, captured.device, location) {
                    Some(t) => t,
                    None => Tensor::record(op.clone(), &srcs, location)?,
                }
            }
        };
        tensors[id.0] = Some(t);
    }
    let take = |id: coil_ir::NodeId| tensors[id.0].clone().expect("live");
    Ok((take(out), grads.into_iter().map(take).collect()))
}

/// Node `id` (pointwise) recorded with its constant operands as Rust scalars, when it has one
/// and the result is the same: the decomposition then makes the constants at the graph's sizes.
/// A constant of a concrete shape would pin a size that a compiled function may take as
/// symbolic (`mark_dynamic`) whenever it equals that size (duck sizing).
fn with_weak_constants(
    graph: &coil_ir::Graph,
    id: coil_ir::NodeId,
    srcs: &[&Tensor],
    device: coil_runtime::Device,
    location: &'static Location<'static>,
) -> Option<Tensor> {
    let node = graph.node(id);
    if !matches!(node.op, Op::Binary(_) | Op::Where) {
        return None;
    }
    let constant = |k: usize| match graph.node(node.inputs[k]).op {
        Op::Full(v) => Some(v),
        _ => None,
    };
    let data = (0..srcs.len()).filter(|&k| constant(k).is_none()).count();
    if data == 0 || data == srcs.len() {
        return None;
    }
    let weak: Vec<Tensor> = (0..srcs.len())
        .map(|k| match constant(k) {
            Some(v) => Tensor::leaf_on(Op::Scalar(v), coil_ir::TensorMeta::new(vec![], v.dtype()), device, None),
            None => srcs[k].clone(),
        })
        .collect();
    let refs: Vec<&Tensor> = weak.iter().collect();
    Tensor::record(node.op.clone(), &refs, location).ok().filter(|t| t.meta() == &node.meta)
}
