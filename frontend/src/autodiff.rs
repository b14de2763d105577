//! Gradients of lazy tensors: [`grad`] (`torch.autograd.grad`) and [`value_and_grad`].
//!
//! A gradient is more lazy tensors, not a number: [`grad`] captures the graph behind the output
//! (through the computed tensors that depend on what it differentiates with respect to),
//! decomposes it to primitives, lets
//! [`coil_passes::autodiff::backward`] append the gradient nodes, and records every node the
//! gradients need as a pending tensor. Realizing the gradients then compiles forward and
//! backward as one graph, fused and scheduled together (what AOTAutograd gives torch.compile),
//! and a training step inside a [`crate::CompiledFn`] is captured whole.

use crate::profile;
use crate::tensor::Tensor;
use crate::walk::{Expected, Walk};
use coil_ir::infer::Operand;
use coil_ir::{Graph, NodeId, Op, Result, TensorMeta};
use coil_runtime::Device;
use std::panic::Location;
use std::rc::Rc;
use std::time::Instant;

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
///
/// Inside a compiled function, a forward graph differentiated in an earlier call (the same
/// ops, attributes, metas and edges, and the same `wrt` among them) is not decomposed and
/// differentiated again: the function keeps the differentiated graphs it made
/// ([`crate::dynamo`]), and a training step's call only records them as lazy tensors.
#[track_caller]
pub fn value_and_grad(output: &Tensor, wrt: &[&Tensor]) -> Result<(Tensor, Vec<Tensor>)> {
    let start = Instant::now();
    let caller = Location::caller();
    // The tensors as they stand after in-place ops ([`crate::alias`]).
    let output = &output.current();
    let wrt: Vec<Tensor> = wrt.iter().map(|t| t.current()).collect();
    let wrt: Vec<&Tensor> = wrt.iter().collect();
    let wrt = wrt.as_slice();
    let mut roots = vec![output];
    roots.extend_from_slice(wrt);
    let walk = Walk::new(&roots, wrt);
    let cache = crate::dynamo::differentiated_cache();
    let cached = cache.as_ref().and_then(|c| c.find(&walk));
    let differentiated = match cached {
        Some(d) => {
            profile::record(|t| t.differentiation_hits += 1);
            d
        }
        None => {
            let d = Rc::new(Differentiated::new(walk.graph(), walk.device(), caller)?);
            profile::record(|t| t.differentiations += 1);
            if let Some(cache) = &cache {
                cache.insert(d.clone());
            }
            d
        }
    };
    crate::dynamo::note_differentiation(&differentiated, caller);
    let (value, grads) = differentiated.record(&walk, caller);
    profile::spent(start, |t| &mut t.differentiate);
    Ok((value, grads))
}

/// A forward graph and its gradients, decomposed to primitives: what [`value_and_grad`]
/// records as lazy tensors.
pub(crate) struct Differentiated {
    /// The captured forward graph (outputs: the value, then each of `wrt`), laid out for
    /// comparing later walks with it.
    pub(crate) forward: Expected,
    /// The device it was differentiated for (the template stage costs at its rates).
    pub(crate) device: Device,
    /// What the template stage did with the forward's attention chains (the decomposition
    /// before differentiating runs it): shown by `explain` and the debug dump, as a compiled
    /// graph's `templates.txt` is.
    pub(crate) templates: Option<coil_passes::templates::TemplateReport>,
    /// Forward and backward as one primitive graph; outputs: the value, then the gradients.
    graph: Graph,
    /// The nodes the outputs need, in order.
    live: Vec<NodeId>,
    /// Per node of `graph`, whether it is recorded with its constant operands as Rust scalars
    /// ([`weak_constants`]).
    weak: Vec<bool>,
}

impl Differentiated {
    /// Decomposes `forward` for `device` and differentiates its first output with respect to
    /// the others.
    fn new(forward: Graph, device: Device, caller: &'static Location<'static>) -> Result<Differentiated> {
        // Attention the template supports stays one template node (written out or
        // `scaled_dot_product_attention`), and its gradients become the backward template:
        // neither direction materializes the scores. Attention it does not support decomposes,
        // the products of half-precision attention on tensor cores, forward and backward.
        // Convolutions stay templates too, so that their gradients are the template's gradient
        // forms (cuDNN's backward calls); the compile of the recorded gradients decomposes them
        // where cuDNN does not run them.
        let options = coil_passes::DecomposeOptions {
            fused_attention: true,
            keep_detach: true,
            half_products: true,
            conv_template: true,
        };
        // The template stage weighs a template against the written-out chain at the device's
        // rates, as the compile of a graph for it does.
        let model = crate::compile::rewrite_options(device)?.model;
        let (mut graph, templates) = coil_passes::decompose_for(&forward, &options, &model)?;
        let dump = crate::debug::Dump::new_differentiation();
        dump.write("graph_forward.txt", || forward.print(true));
        if let Some(t) = &templates {
            dump.write("templates.txt", || t.to_string());
        }
        let (out, targets) = (graph.outputs[0], graph.outputs[1..].to_vec());
        let grads = coil_passes::autodiff::backward(&mut graph, out, None, &targets).map_err(|mut e| {
            // Errors of the whole request point at the caller of grad.
            if e.location.is_none() {
                e = e.at(caller);
            }
            e
        })?;
        graph.outputs = std::iter::once(out).chain(grads).collect();
        let live = graph.live_nodes();
        let weak = (0..graph.nodes.len()).map(|i| weak_constants(&graph, NodeId(i))).collect();
        Ok(Differentiated { forward: Expected::new(&forward), device, templates, graph, live, weak })
    }

    /// Records every node the value and the gradients read as a pending tensor, on the
    /// walk's inputs and random streams; returns the value and the gradients.
    fn record(&self, walk: &Walk, caller: &'static Location<'static>) -> (Tensor, Vec<Tensor>) {
        let graph = &self.graph;
        let (inputs, random, device) = (walk.input_tensors(), walk.random(), walk.device());
        let mut tensors: Vec<Option<Tensor>> = vec![None; graph.nodes.len()];
        let operand = |tensors: &[Option<Tensor>], x: NodeId| tensors[x.0].clone().expect("operands come first");
        for &id in &self.live {
            let node = graph.node(id);
            let t = match &node.op {
                Op::Input { index } => inputs[*index].clone(),
                // Differentiated already: the value is the operand's.
                Op::Detach => operand(&tensors, node.inputs[0]),
                // The numbers the forward graph drew: its stream's start, plus the offset.
                Op::Rand { dist, stream, offset } => {
                    let draw = random[*stream].advanced(*offset);
                    Tensor::random_leaf_on(*dist, node.meta.clone(), device, draw, node.location)
                }
                op if op.is_leaf() => Tensor::leaf_on(op.clone(), node.meta.clone(), device, node.location),
                op => {
                    let srcs = node.inputs.iter().map(|&x| match graph.node(x).op {
                        // A constant of a concrete shape would pin a size that a compiled
                        // function may take as symbolic (see `weak_constants`).
                        Op::Full(v) if self.weak[id.0] => {
                            Tensor::leaf_on(Op::Scalar(v), TensorMeta::new(vec![], v.dtype()), device, None)
                        }
                        _ => operand(&tensors, x),
                    });
                    // Every meta was inferred when the graph was built (and the weak form
                    // checked to infer the same): recording only links the nodes.
                    let location = node.location.unwrap_or(caller);
                    // Attention with dropout and its gradients draw where the forward drew.
                    let draw = op.attention_dropout().map(|d| random[d.stream].advanced(d.offset));
                    Tensor::recorded_drawing(op.clone(), srcs.collect(), node.meta.clone(), device, location, draw)
                }
            };
            tensors[id.0] = Some(t);
        }
        let take = |id: &NodeId| tensors[id.0].clone().expect("live");
        (take(&graph.outputs[0]), graph.outputs[1..].iter().map(take).collect())
    }
}

/// Whether node `id` (pointwise) is recorded with its constant operands as Rust scalars: when
/// it has constant and data operands, and the result is the same. The decomposition then makes
/// the constants at the graph's sizes; a constant of a concrete shape would pin a size that a
/// compiled function may take as symbolic (`mark_dynamic`) whenever it equals that size (duck
/// sizing).
fn weak_constants(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    if !matches!(node.op, Op::Binary(_) | Op::Where) {
        return false;
    }
    let constant = |k: usize| matches!(graph.node(node.inputs[k]).op, Op::Full(_));
    let data = (0..node.inputs.len()).filter(|&k| !constant(k)).count();
    if data == 0 || data == node.inputs.len() {
        return false;
    }
    // A Rust scalar's meta: 0-d, of the constant's own type.
    let scalars: Vec<Option<TensorMeta>> = (node.inputs.iter())
        .map(|&x| match graph.node(x).op {
            Op::Full(v) => Some(TensorMeta::new(vec![], v.dtype())),
            _ => None,
        })
        .collect();
    let operands: Vec<Operand> = (0..node.inputs.len())
        .map(|k| match &scalars[k] {
            Some(meta) => Operand { meta, scalar: true },
            None => Operand { meta: graph.meta(node.inputs[k]), scalar: false },
        })
        .collect();
    coil_ir::infer::infer(&node.op, &operands).is_ok_and(|meta| meta == node.meta)
}
