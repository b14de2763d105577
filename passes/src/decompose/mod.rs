//! Decomposition: a captured graph (composite ops, Rust scalars, implicit broadcasting and type
//! promotion) becomes a *primitive graph* that satisfies [`Graph::verify_primitive`].
//!
//! One mechanism does it all: a [`Builder`] whose helpers broadcast and promote like PyTorch
//! and emit the explicit `Expand`s, `Cast`s and `Full`s, and one decomposition function per
//! composite op written against it (like PyTorch's `torch/_decomp`), dispatched by a single
//! `match` in [`decompose_node`]. Primitive ops pass through the same helpers, so their implicit
//! broadcasting and promotion become explicit too.
//!
//! The output keeps the captured graph's inputs (same order and metas) and outputs (same
//! order and metas); every node inherits the source line of the captured node it came from;
//! only nodes the outputs depend on are emitted; the result is a pure function of the input
//! graph. Composite ops on f16/bf16 compute in f32 and round once, as PyTorch's CPU kernels do.
//!
//! ```
//! use coil_ir::{DType, Graph, Op, TensorMeta};
//! let mut g = Graph::new();
//! let x = g.input(TensorMeta::new(vec![2, 3], DType::F32));
//! let y = g.push(Op::Relu, &[x], None).unwrap();
//! g.outputs.push(y);
//! let p = coil_passes::decompose(&g).unwrap();
//! p.verify_primitive().unwrap();
//! assert_eq!(p.to_string(), "\
//! graph(%0: f32[2, 3]) {
//!   %1: f32[2, 3] = full(value=0.0)
//!   %2: bool[2, 3] = lt(%0, %1)
//!   %3: f32[2, 3] = full(value=0.0)
//!   %4: f32[2, 3] = where(%2, %3, %0)
//!   %5: f32[2, 3] = full(value=0.0)
//!   %6: bool[2, 3] = le(%0, %5)
//!   %7: f32[2, 3] = where(%6, %4, %0)
//!   return (%7)
//! }
//! ");
//! ```

mod builder;
mod conv;
mod nn;
mod pointwise;
mod reduce;
#[cfg(test)]
mod tests;

pub use builder::{compute_dtype, scalar_as, upcast_and_back, zero, Arg, Builder};
pub(crate) use pointwise::relu_operand;

use coil_ir::op::{ConvForm, ConvGeometry};
use coil_ir::{DType, Error, Graph, NodeId, Op, Result, TensorMeta};

/// Decomposes a captured graph into a primitive graph (see the module docs): the reference
/// decomposition, which expands every composite op (what the interpreter, the oracle, runs).
///
/// Errors name the captured op, its operands and the user's source line.
pub fn decompose(graph: &Graph) -> Result<Graph> {
    decompose_with(graph, &DecomposeOptions::default())
}

/// Where the compile path's decomposition differs from the reference one ([`decompose`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecomposeOptions {
    /// Recognise written-out attention ([`crate::attention::fuse_attention`]) and keep every
    /// `scaled_dot_product_attention` the template supports
    /// ([`crate::attention::template_supports`]) as one primitive node, for lowering to run
    /// as one flash-attention call; so too its logsumexp and gradients (the attention backward
    /// template), unless `keep_detach`, and attention with an explicit mask
    /// ([`crate::attention::mask_supported`]; with any number of rows where its gradients are
    /// templates too). Off: attention is decomposed into its matrix products and softmax.
    pub fused_attention: bool,
    /// Keep `detach` nodes (and mark the stabilizing maximum of softmax, log_softmax,
    /// logsumexp and cross_entropy with one, as PyTorch's backward formulas treat it as a
    /// constant) for [`crate::autodiff`]; otherwise `detach` is the identity. The graph is to be
    /// differentiated: the attention backward templates, which have no gradient rule, are
    /// decomposed.
    pub keep_detach: bool,
    /// Decompose f16/bf16 attention with its two matrix products in the operands' dtype (f32
    /// accumulation inside the product, the result rounded to the dtype), the softmax in f32 and
    /// the probabilities rounded to the dtype for `P @ V`, as FlashAttention and PyTorch's math
    /// backend on CUDA compute it: the products run on tensor cores, forward and backward. Off
    /// (the reference): q, k and v are upcast to f32 and the result rounded once.
    pub half_products: bool,
    /// Keep convolutions ([`coil_ir::Op::Conv`]: the convolution and its two gradients) as
    /// template nodes, for lowering to run each as one call (cuDNN on CUDA). Set where the
    /// target runs them (the frontend checks that cuDNN loads) and when differentiating, so
    /// that gradients are the backward templates; off, they decompose into im2col and a
    /// matrix product. A 1x1 convolution without padding or groups decomposes either way: it is
    /// a matrix product.
    pub conv_template: bool,
}

/// [`decompose`] with the compile path's choices (see [`DecomposeOptions`]); the template
/// stage, if it runs, costs at an H100's rates ([`decompose_for`] takes the target's).
pub fn decompose_with(graph: &Graph, options: &DecomposeOptions) -> Result<Graph> {
    Ok(decompose_for(graph, options, &crate::rewrite::CostModel::default())?.0)
}

/// [`decompose_with`], the template stage ([`crate::templates`], with
/// [`DecomposeOptions::fused_attention`]) costing nodes at `model`'s rates (the compiling
/// target's, as the rewrite pass's [`crate::RewriteOptions::model`]), and what that stage did
/// (`None` when it did not run).
pub fn decompose_for(
    graph: &Graph,
    options: &DecomposeOptions,
    model: &crate::rewrite::CostModel,
) -> Result<(Graph, Option<crate::templates::TemplateReport>)> {
    graph.check_shapes()?;
    if options.fused_attention {
        let (fused, report) = crate::attention::fuse_attention_for(graph, model);
        return Ok((decompose_graph(&fused, options)?, Some(report)));
    }
    Ok((decompose_graph(graph, options)?, None))
}

fn decompose_graph(graph: &Graph, options: &DecomposeOptions) -> Result<Graph> {
    let mut out = Graph::new();
    let mut values: Vec<Option<Arg>> = vec![None; graph.nodes.len()];
    for (index, &id) in graph.inputs.iter().enumerate() {
        let node = graph.node(id);
        let new = out.leaf(Op::Input { index }, node.meta.clone(), node.location);
        out.inputs.push(new);
        values[id.0] = Some(Arg::Node(new));
    }
    for id in graph.live_nodes() {
        if values[id.0].is_some() {
            continue;
        }
        let node = graph.node(id);
        let made_from = out.nodes.len();
        let value = match &node.op {
            Op::Scalar(s) => Arg::Scalar(*s),
            Op::Input { .. } => {
                return Err(Error::runtime(format!("{id} is an input that is not among the graph's inputs")));
            }
            op if op.is_leaf() => Arg::Node(out.leaf(op.clone(), node.meta.clone(), node.location)),
            op if op.is_template() && keeps_template(graph, node, options) => {
                let args: Vec<NodeId> = node
                    .inputs
                    .iter()
                    .map(|x| match values[x.0].expect("operands come first") {
                        Arg::Node(n) => n,
                        Arg::Scalar(_) => unreachable!("template operands are tensors (checked)"),
                    })
                    .collect();
                Arg::Node(out.push(op.clone(), &args, node.location)?)
            }
            op => {
                let args: Vec<Arg> = node.inputs.iter().map(|x| values[x.0].expect("operands come first")).collect();
                let mut b = Builder::new(&mut out, node.location);
                b.keep_detach = options.keep_detach;
                b.half_products = options.half_products;
                let y = decompose_node(&mut b, op, &args, &node.meta).map_err(|mut e| {
                    // The user called `op`: name it (not the primitive that failed inside it).
                    e.op = Some(op.name().to_string());
                    e.operands = node.inputs.iter().map(|&x| graph.meta(x).to_string()).collect();
                    match node.location {
                        Some(l) => e.at(l),
                        None => e,
                    }
                })?;
                if out.meta(y) != &node.meta {
                    let e = Error::runtime(format!(
                        "decomposition of {op} produced {} where the captured graph has {}",
                        out.meta(y),
                        node.meta
                    ));
                    return Err(match node.location {
                        Some(l) => e.at(l),
                        None => e,
                    });
                }
                Arg::Node(y)
            }
        };
        values[id.0] = Some(value);
        // Every node made for `id` comes from it (a graph rebuilt before, such as by
        // attention fusion, says which captured node it was).
        let origin = node.origin.unwrap_or(id.0);
        for made in &mut out.nodes[made_from..] {
            made.origin = Some(origin);
        }
    }
    for &o in &graph.outputs {
        let node = graph.node(o);
        let y = match values[o.0].expect("outputs are live") {
            Arg::Node(y) => y,
            Arg::Scalar(s) => Builder::new(&mut out, node.location).full(s, &node.meta.shape, node.meta.dtype),
        };
        out.outputs.push(y);
    }
    Ok(out)
}

/// Whether a convolution is a matrix product ([`conv::is_pointwise`]): a 1x1 kernel, no
/// padding, one group. Its decomposition (a strided view, a reshape and a product; one product
/// over the batch where the activations are channels-last) runs through cuBLASLt, which takes
/// every layout; cuDNN's legacy API has no algorithm for the gradients of ResNet-50's bf16
/// channels-last 1x1 convolutions on the H100 (data and weight, stride 1 and 2), where the
/// call would fall back to the host.
fn pointwise_conv(graph: &Graph, node: &coil_ir::Node, geometry: &ConvGeometry, form: &ConvForm) -> bool {
    let kernel: Vec<usize> = match form {
        ConvForm::BackwardWeight { kernel } => kernel.clone(),
        ConvForm::Forward | ConvForm::BackwardData { .. } => graph.meta(node.inputs[1]).shape[2..].to_vec(),
    };
    conv::is_pointwise(geometry, &kernel)
}

/// Whether a template node of a captured graph stays whole: a convolution where
/// [`DecomposeOptions::conv_template`] says so (its forms have gradient rules); attention the
/// template supports ([`crate::attention::template_supports`]), on tensor operands (not Rust
/// scalars), with its logsumexp and gradients. Those two have no gradient rule of their own: a
/// graph decomposed for differentiation ([`DecomposeOptions::keep_detach`]) expands them, so
/// that gradients (of gradients) differentiate their decomposition. Attention with an explicit
/// mask ([`crate::attention::mask_supported`]), with or without dropout, is kept with any number
/// of query rows where its gradients are templates too (a graph to be differentiated, or one that
/// has its logsumexp: decomposed, the scores would be written forward and backward), else with
/// few rows.
fn keeps_template(graph: &Graph, node: &coil_ir::Node, options: &DecomposeOptions) -> bool {
    let tensors = node.inputs.iter().all(|&x| !matches!(graph.node(x).op, Op::Scalar(_)));
    if let Op::Conv { geometry, form } = &node.op {
        return options.conv_template && tensors && !pointwise_conv(graph, node, geometry, form);
    }
    if !options.fused_attention {
        return false;
    }
    let metas: Vec<&TensorMeta> = node.inputs.iter().map(|&x| graph.meta(x)).collect();
    let kept = match node.op {
        Op::Attention { mask: false, .. } => true,
        // With or without dropout: the masked kernels draw its keep decisions as the maskless ones.
        Op::Attention { mask: true, .. } => {
            let any_rows = options.keep_detach
                || crate::attention::mask_rule_of(graph, node).is_some()
                || crate::attention::has_logsumexp(graph, node);
            tensors && crate::attention::mask_supported(metas[0], metas[3], any_rows).is_ok()
        }
        Op::AttentionLogsumexp { mask: true, .. } => {
            !options.keep_detach && tensors && crate::attention::mask_supported(metas[0], metas[3], true).is_ok()
        }
        Op::AttentionBackward { mask: true, .. } => {
            !options.keep_detach && tensors && crate::attention::mask_supported(metas[0], metas[6], true).is_ok()
        }
        Op::AttentionLogsumexp { .. } | Op::AttentionBackward { .. } => !options.keep_detach,
        _ => false,
    };
    kept && tensors && crate::attention::template_supports(metas[0], metas[1], metas[2]).is_ok()
}

/// The decomposition table: emits the primitive nodes computing `op` on `args` (the
/// already-decomposed operands; Rust scalars stay [`Arg::Scalar`]) and returns the node holding
/// the result, whose meta must be `meta`, the captured node's.
pub fn decompose_node(b: &mut Builder, op: &Op, args: &[Arg], meta: &TensorMeta) -> Result<NodeId> {
    let x: Vec<NodeId> = match op {
        // Bounds of a clamp are read from its attributes; its scalar operands stay unused.
        Op::Clamp { .. } => vec![b.tensor(args[0])],
        Op::Unary(_) | Op::Binary(_) | Op::Where => vec![],
        _ => args.iter().map(|&a| b.tensor(a)).collect(),
    };
    match op {
        Op::Input { .. } | Op::Scalar(_) | Op::Full(_) | Op::Iota { .. } | Op::Rand { .. } => {
            Err(Error::runtime(format!("{} is a leaf: it is copied, not decomposed", op.name())))
        }

        // ---- primitives: pass through, with broadcasting and promotion made explicit ----
        Op::Unary(u) => b.unary(*u, args[0]),
        Op::Binary(o) => b.binary(*o, args[0], args[1]),
        Op::Where => {
            let cond = b.tensor(args[0]);
            b.where_(cond, args[1], args[2])
        }
        Op::Cast(t) => b.cast(x[0], *t),
        Op::Reduce { op, dims, keepdim } => b.reduce(*op, x[0], dims, *keepdim),
        Op::Cumsum { .. } => {
            let x = if b.dtype(x[0]).is_integral() { b.cast(x[0], DType::I64)? } else { x[0] };
            b.push(op.clone(), &[x])
        }
        Op::Reshape { shape } => b.reshape(x[0], shape),
        Op::Permute { perm } => b.permute(x[0], perm),
        Op::Expand { shape } => b.expand(x[0], shape),
        Op::Slice { dim, start: 0, len, step: 1 } if b.shape(x[0])[*dim] == *len => Ok(x[0]),
        Op::Pad { pads, .. } if pads.iter().all(|&p| p == (0, 0)) => Ok(x[0]),
        Op::Cat { .. } => {
            let parts = x.iter().map(|&p| b.cast(p, meta.dtype)).collect::<Result<Vec<_>>>()?;
            if parts.len() == 1 {
                return Ok(parts[0]);
            }
            b.push(op.clone(), &parts)
        }
        Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Gather { .. }
        | Op::IndexSelect { .. }
        | Op::Scatter { .. }
        | Op::Argsort { .. }
        | Op::Bmm => b.push(op.clone(), &x),

        // ---- composites ----
        Op::Matmul => nn::matmul(b, x[0], x[1]),
        Op::Linear { bias } => nn::linear(b, x[0], x[1], bias.then(|| x[2])),
        Op::Relu => pointwise::relu(b, x[0]),
        Op::Detach => b.detach(x[0]),
        Op::Gelu { tanh } => pointwise::gelu(b, x[0], *tanh),
        Op::Silu => pointwise::silu(b, x[0]),
        Op::Softplus { beta, threshold } => pointwise::softplus(b, x[0], *beta, *threshold),
        Op::Clamp { min, max } => pointwise::clamp(b, x[0], *min, *max, meta.dtype),
        Op::NanToNum { nan, posinf, neginf } => pointwise::nan_to_num(b, x[0], *nan, *posinf, *neginf),
        Op::Mean { dims, keepdim } => reduce::mean(b, x[0], dims, *keepdim),
        Op::Var { dims, correction, keepdim } => reduce::var(b, x[0], dims, *correction, *keepdim, false),
        Op::Std { dims, correction, keepdim } => reduce::var(b, x[0], dims, *correction, *keepdim, true),
        Op::LogSumExp { dims, keepdim } => reduce::logsumexp(b, x[0], dims, *keepdim),
        Op::Norm { p, dims, keepdim } => reduce::norm(b, x[0], *p, dims, *keepdim),
        Op::Any { dims, keepdim } => reduce::any_all(b, x[0], dims, *keepdim, false),
        Op::All { dims, keepdim } => reduce::any_all(b, x[0], dims, *keepdim, true),
        Op::Softmax { dim } => reduce::softmax(b, x[0], *dim),
        Op::LogSoftmax { dim } => reduce::log_softmax(b, x[0], *dim),
        Op::LayerNorm { ndim, eps, weight, bias } => {
            let w = weight.then(|| x[1]);
            let bias = bias.then(|| x[1 + *weight as usize]);
            nn::layer_norm(b, x[0], w, bias, *ndim, *eps)
        }
        Op::RmsNorm { ndim, eps, weight } => nn::rms_norm(b, x[0], weight.then(|| x[1]), *ndim, *eps),
        Op::Tril { k } => pointwise::tri(b, x[0], *k, false),
        Op::Triu { k } => pointwise::tri(b, x[0], *k, true),
        Op::Dropout { p, stream, offset } => pointwise::dropout(b, x[0], *p, *stream, *offset),
        Op::Embedding => nn::embedding(b, x[0], x[1]),
        Op::CrossEntropy { ignore_index, reduction, label_smoothing, weight } => {
            let weight = weight.then(|| x[2]);
            nn::cross_entropy(b, x[0], x[1], weight, *ignore_index, *reduction, *label_smoothing)
        }
        Op::MseLoss { reduction } => nn::mse_loss(b, x[0], x[1], *reduction, meta.dtype),
        Op::Attention { causal, scale, mask, dropout } => {
            nn::attention(b, x[0], x[1], x[2], mask.then(|| x[3]), *causal, *scale, *dropout)
        }
        Op::AttentionLogsumexp { causal, scale, mask } => {
            nn::attention_logsumexp(b, x[0], x[1], mask.then(|| x[3]), *causal, *scale)
        }
        Op::AttentionBackward { causal, scale, input, mask, dropout } => {
            nn::attention_backward(b, &x[..6], mask.then(|| x[6]), *causal, *scale, *input, *dropout)
        }
        Op::Conv { geometry, form } => conv::conv(b, geometry, form, x[0], x[1]),
    }
}
