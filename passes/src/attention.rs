//! The attention template: written-out attention in a captured graph becomes one
//! [`Op::Attention`] node, which the compile path keeps whole ([`template_supports`]) and
//! lowering turns into one flash-attention call (`ExternCall::Attention`) that never writes
//! the `[*batch, L, S]` scores to memory. Its gradients are templates too
//! ([`Op::AttentionLogsumexp`], [`Op::AttentionBackward`], emitted by [`crate::autodiff`]), kept
//! under the same [`template_supports`] and lowered to one backward call
//! (`ExternCall::AttentionBackward`).
//!
//! [`fuse_attention`] finds, on the captured (composite-level) graph, the chain PyTorch
//! programs write (GPT-2's attention), by e-graph rewriting and extraction
//! ([`crate::templates`]: the rules are `templates/rules.rs`'s table):
//!
//! ```text
//! scores = matmul(q, permute(k, last two dims swapped))
//! x      = scores, then in any order, each at most once:
//!            mul(x, c) | mul(c, x) | div(x, c)               (c a constant: scale c, 1/c; else 1)
//!            where(keep, x, -inf) | where(drop, -inf, x)     (keep: the causal mask; -inf
//!                                                             or its cast to a float dtype)
//!            cast(x, f32)                                    (f16 / bf16: the softmax in f32)
//! probs  = cast(softmax(x, -1), T) after the cast to f32 | softmax(x, -1)
//! out    = matmul(probs, v)
//! ```
//!
//! and replaces it with `scaled_dot_product_attention(q, k, v, causal, scale=c)`. The rules:
//!
//! * q `[..., L, D]`, k `[..., S, D]`, v `[..., S, D]` of one dtype T (f16, bf16 or f32), the
//!   same batch dims (no broadcasting), within what the template supports
//!   ([`template_supports`]); every node of the chain has the scores' shape `[..., L, S]`
//!   (the output `[..., L, D]`) and dtype T, except the nodes between the two casts of an f32
//!   softmax for f16 / bf16, which are f32;
//! * the scale is a `scalar` or a `full` with one element, finite;
//! * the mask keeps exactly `col <= row` over the last two dims (top-left aligned, PyTorch's
//!   `is_causal`): `tril(ones, 0)` or `iota(col) <= iota(row)` (and the equivalent comparisons)
//!   as kept elements, through casts, views that keep the last two dims or take their top-left
//!   window (`mask[:T, :T]` of a larger causal mask), `logical_not`, `x == 0` and `x != 0`;
//!   `triu(ones, 1)` and the negations are the dropped elements (`masked_fill(~keep, -inf)`);
//! * where a node of the chain from the scores' `matmul` to the softmax's cast back (the
//!   intermediates) is a graph output or read by another node, the scores must exist anyway:
//!   the template is not used (extraction keeps the chain's last product, or the template is
//!   refused as a recomputation: [`crate::templates`]).
//!
//! Anything else is left alone. Numerics: the template computes the scores in f32 (f64 for f64)
//! and never rounds them or the probabilities to T, where the unfused graph rounds the scores
//! and the probabilities to f16 / bf16: a difference within T's rounding.

use coil_ir::{DType, Graph, Node, NodeId, Op, TensorMeta};

/// Largest head dim the template runs (the CUDA kernel keeps a query row block in registers).
pub const MAX_HEAD_DIM: usize = 128;

/// Whether the attention template runs `q @ k^T -> softmax -> @ v` for these operands as one
/// call, and if not, why. Supported: q `[..., L, D]`, k `[..., S, D]`, v `[..., S, D]` of rank 3
/// or 4 with equal batch dims, dtype f16, bf16 or f32, `D` a multiple of 8 up to
/// [`MAX_HEAD_DIM`], and no empty dim. Anything else is decomposed.
pub fn template_supports(q: &TensorMeta, k: &TensorMeta, v: &TensorMeta) -> Result<(), String> {
    let r = q.rank();
    if !(3..=4).contains(&r) || k.rank() != r || v.rank() != r {
        return Err(format!("ranks {}, {}, {} (3 or 4 are supported)", q.rank(), k.rank(), v.rank()));
    }
    if !matches!(q.dtype, DType::F16 | DType::BF16 | DType::F32) || k.dtype != q.dtype || v.dtype != q.dtype {
        return Err(format!("dtypes {}, {}, {} (one of f16, bf16, f32)", q.dtype, k.dtype, v.dtype));
    }
    if q.shape[..r - 2] != k.shape[..r - 2] || q.shape[..r - 2] != v.shape[..r - 2] {
        return Err(format!("batch dims differ: {:?}, {:?}, {:?}", q.shape, k.shape, v.shape));
    }
    let (d, s) = (q.shape[r - 1], k.shape[r - 2]);
    if k.shape[r - 1] != d || v.shape[r - 1] != d || v.shape[r - 2] != s {
        return Err(format!("shapes {:?}, {:?}, {:?} (q [.., L, D], k and v [.., S, D])", q.shape, k.shape, v.shape));
    }
    if d % 8 != 0 || d > MAX_HEAD_DIM {
        return Err(format!("head dim {d} (a multiple of 8 up to {MAX_HEAD_DIM})"));
    }
    if q.numel() == 0 || k.numel() == 0 {
        return Err("an empty dim".into());
    }
    Ok(())
}

/// Most query rows (per batch index) of attention with an explicit mask the template takes: a
/// decode step's few rows against a long cache (the split-KV kernels). With more rows (a
/// prefill) the decomposition's products on cuBLAS ran faster than the row-block kernel reading
/// the mask per element (Llama 1B's 512-token prefill, 2048 grouped rows, on the H100: 0.0083
/// against 0.0123 ms per token). A structured mask ([`structured_mask`]) is never read: no limit.
pub const MASKED_MAX_ROWS: usize = 16;

/// Whether the attention template takes `mask` as the mask of attention on `q` (whose shapes
/// [`template_supports`] accepts), and if not, why: bool or q's dtype (as inference checks),
/// broadcastable to the scores, of rank 2 or more (the lowering reads its last two dims as rows
/// and keys; broadcast dims get stride 0), and, unless `any_rows`, at most [`MASKED_MAX_ROWS`]
/// rows. `any_rows`: a structured mask (the template applies its rule instead of reading it:
/// [`structured_mask`]), or attention whose gradients are templates too (decomposed, a
/// training step would write the scores forward and backward).
pub fn mask_supported(q: &TensorMeta, mask: &TensorMeta, any_rows: bool) -> Result<(), String> {
    let rows = q.shape[q.rank() - 2];
    if rows > MASKED_MAX_ROWS && !any_rows {
        return Err(format!("{rows} query rows with an explicit mask (at most {MASKED_MAX_ROWS})"));
    }
    if mask.dtype != DType::Bool && mask.dtype != q.dtype {
        return Err(format!("a mask of {} for {} operands", mask.dtype, q.dtype));
    }
    if mask.rank() < 2 || mask.rank() > q.rank() {
        return Err(format!("a mask of rank {} for operands of rank {}", mask.rank(), q.rank()));
    }
    Ok(())
}

/// The rule of attention `node`'s mask (a node of `graph`), where the template applies it
/// instead of reading the mask: a structured mask ([`structured_mask`]) of attention (or its
/// logsumexp) that is not also causal.
pub fn mask_rule_of(graph: &Graph, node: &Node) -> Option<StructuredMask> {
    match node.op {
        Op::Attention { causal: false, mask: true, .. } | Op::AttentionLogsumexp { causal: false, mask: true, .. } => {
            structured_mask(graph, node.inputs[3])
        }
        _ => None,
    }
}

/// Whether `graph` holds the logsumexp ([`Op::AttentionLogsumexp`]) of attention `node`: the
/// same operands and attributes (a training graph's, which its backward templates read).
pub fn has_logsumexp(graph: &Graph, node: &Node) -> bool {
    let Op::Attention { causal, scale, mask, .. } = node.op else { return false };
    let lse = Op::AttentionLogsumexp { causal, scale, mask };
    graph.nodes.iter().any(|n| n.op == lse && n.inputs == node.inputs)
}

/// One matched chain: the final `matmul` (replaced) and what replaces it.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionMatch {
    /// The `matmul(probs, v)` node.
    pub root: NodeId,
    /// Queries `[.., L, D]`.
    pub q: NodeId,
    /// Keys `[.., S, D]` (the operand of the transpose).
    pub k: NodeId,
    /// Values `[.., S, D]`.
    pub v: NodeId,
    /// Whether the causal mask was matched.
    pub causal: bool,
    /// The factor on the scores (1 when there is none).
    pub scale: f64,
    /// The nodes from the scores' matmul to the probabilities, which go away.
    pub intermediates: Vec<NodeId>,
}

/// The attention chains of a captured graph (see the module docs), in graph order, costed for
/// an H100 ([`crate::rewrite::CostModel::default`]).
pub fn find_attention(graph: &Graph) -> Vec<AttentionMatch> {
    crate::templates::choose_attention(graph, &crate::rewrite::CostModel::default()).0
}

/// `graph` with every attention chain ([`find_attention`]) replaced by one
/// `scaled_dot_product_attention` node (at the place of the final matmul, with its source line);
/// nodes left without a reader are dropped. The same graph when nothing matches.
pub fn fuse_attention(graph: &Graph) -> Graph {
    fuse_attention_report(graph).0
}

/// [`fuse_attention`], and what the e-graph stage did: which rules fired how often, how many
/// templates it chose and refused ([`crate::templates::TemplateReport`]).
pub fn fuse_attention_report(graph: &Graph) -> (Graph, crate::templates::TemplateReport) {
    fuse_attention_for(graph, &crate::rewrite::CostModel::default())
}

/// [`fuse_attention_report`], the template stage costing nodes at `model`'s rates (the
/// compiling target's).
pub fn fuse_attention_for(
    graph: &Graph,
    model: &crate::rewrite::CostModel,
) -> (Graph, crate::templates::TemplateReport) {
    let (found, report) = crate::templates::choose_attention(graph, model);
    if found.is_empty() {
        return (graph.clone(), report);
    }
    let root_of: std::collections::HashMap<NodeId, &AttentionMatch> = found.iter().map(|m| (m.root, m)).collect();
    // The operands of each node in the new graph: a root reads q, k, v.
    let operands = |n: NodeId| -> Vec<NodeId> {
        match root_of.get(&n) {
            Some(m) => vec![m.q, m.k, m.v],
            None => graph.node(n).inputs.clone(),
        }
    };
    let mut needed = vec![false; graph.nodes.len()];
    for o in &graph.outputs {
        needed[o.0] = true;
    }
    for i in (0..graph.nodes.len()).rev() {
        if needed[i] {
            for x in operands(NodeId(i)) {
                needed[x.0] = true;
            }
        }
    }
    let mut out = Graph::new();
    let mut new_id: Vec<Option<NodeId>> = vec![None; graph.nodes.len()];
    for &id in &graph.inputs {
        out.nodes.push(graph.node(id).clone());
        new_id[id.0] = Some(NodeId(out.nodes.len() - 1));
        out.inputs.push(NodeId(out.nodes.len() - 1));
    }
    for (i, node) in graph.nodes.iter().enumerate() {
        if !needed[i] || new_id[i].is_some() {
            continue;
        }
        let inputs: Vec<NodeId> =
            operands(NodeId(i)).iter().map(|x| new_id[x.0].expect("operands come first")).collect();
        let op = match root_of.get(&NodeId(i)) {
            Some(m) => Op::Attention { causal: m.causal, scale: Some(m.scale), mask: false, dropout: None },
            None => node.op.clone(),
        };
        // Node indices shift here: decomposition's origins are the captured graph's.
        let origin = node.origin.or(Some(i));
        out.nodes.push(Node { op, inputs, meta: node.meta.clone(), location: node.location, origin });
        new_id[i] = Some(NodeId(out.nodes.len() - 1));
    }
    out.outputs = graph.outputs.iter().map(|o| new_id[o.0].expect("outputs are needed")).collect();
    (out, report)
}

#[path = "attention_mask.rs"]
mod mask;
pub use mask::{structured_mask, StructuredMask};

#[cfg(test)]
#[path = "attention_tests.rs"]
pub(crate) mod tests;
