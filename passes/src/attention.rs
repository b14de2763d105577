//! The attention template: written-out attention in a captured graph becomes one
//! [`Op::Attention`] node, which the compile path keeps whole ([`template_supports`]) and
//! lowering turns into one flash-attention call (`ExternCall::Attention`) that never writes
//! the `[*batch, L, S]` scores to memory. Its gradients are templates too
//! ([`Op::AttentionLogsumexp`], [`Op::AttentionBackward`], emitted by [`crate::autodiff`]), kept
//! under the same [`template_supports`] and lowered to one backward call
//! (`ExternCall::AttentionBackward`).
//!
//! [`fuse_attention`] matches, on the captured (composite-level) graph, the chain PyTorch
//! programs write (GPT-2's attention):
//!
//! ```text
//! scores = matmul(q, permute(k, last two dims swapped))
//! x      = scores, then in any order, each at most once:
//!            mul(x, c) | mul(c, x) | div(x, c)               (c a constant: scale c, 1/c; else 1)
//!            where(keep, x, -inf) | where(drop, -inf, x)     (keep: the causal mask)
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
//! * every node from the scores' `matmul` to the softmax's cast back (the intermediates) is read
//!   only by the next one and is not a graph output (else the scores must exist anyway).
//!
//! Anything else is left alone. Numerics: the template computes the scores in f32 (f64 for f64)
//! and never rounds them or the probabilities to T, where the unfused graph rounds the scores
//! and the probabilities to f16 / bf16: a difference within T's rounding.

use coil_ir::{BinaryOp, DType, Graph, Node, NodeId, Op, Scalar, TensorMeta, UnaryOp};

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

/// The attention chains of a captured graph (see the module docs), in graph order.
pub fn find_attention(graph: &Graph) -> Vec<AttentionMatch> {
    let live = graph.live_nodes();
    let mut readers = vec![0usize; graph.nodes.len()];
    for &n in &live {
        for x in &graph.node(n).inputs {
            readers[x.0] += 1;
        }
    }
    for o in &graph.outputs {
        // An output is read by the caller: never an intermediate.
        readers[o.0] += 2;
    }
    let m = Matcher { g: graph, readers };
    live.iter().filter_map(|&n| m.chain(n)).collect()
}

/// `graph` with every attention chain ([`find_attention`]) replaced by one
/// `scaled_dot_product_attention` node (at the place of the final matmul, with its source line);
/// nodes left without a reader are dropped. The same graph when nothing matches.
pub fn fuse_attention(graph: &Graph) -> Graph {
    let found = find_attention(graph);
    if found.is_empty() {
        return graph.clone();
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
    out
}

/// Which elements of a mask's last two dims (`row`, `col`) are nonzero (true), the same for
/// every leading index.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Pattern {
    /// Every element, or none.
    Const(bool),
    /// `col - row <= k`.
    AtMost(i64),
    /// `col - row > k`.
    Above(i64),
}

impl Pattern {
    fn not(self) -> Pattern {
        match self {
            Pattern::Const(b) => Pattern::Const(!b),
            Pattern::AtMost(k) => Pattern::Above(k),
            Pattern::Above(k) => Pattern::AtMost(k),
        }
    }
}

/// Reads a captured graph: node kinds and the number of readers of each node.
struct Matcher<'g> {
    g: &'g Graph,
    /// Readers among the live nodes; a graph output counts 2 more.
    readers: Vec<usize>,
}

impl Matcher<'_> {
    fn node(&self, n: NodeId) -> &Node {
        self.g.node(n)
    }

    fn meta(&self, n: NodeId) -> &TensorMeta {
        self.g.meta(n)
    }

    /// Read once, by the next node of the chain, and not an output.
    fn private(&self, n: NodeId) -> bool {
        self.readers[n.0] == 1
    }

    /// The value of a one-element constant (`scalar`, or `full` of one element).
    fn constant(&self, n: NodeId) -> Option<f64> {
        match &self.node(n).op {
            Op::Scalar(s) => Some(s.as_f64()),
            Op::Full(s) if self.meta(n).numel() == 1 => Some(s.as_f64()),
            _ => None,
        }
    }

    /// Whether `n` is `-inf` everywhere (a scalar, or a `full` of any shape).
    fn neg_inf(&self, n: NodeId) -> bool {
        matches!(self.node(n).op, Op::Scalar(Scalar::Float(x)) | Op::Full(Scalar::Float(x)) if x == f64::NEG_INFINITY)
    }

    /// The attention chain ending at `root` (a `matmul(probs, v)`), if it is one.
    fn chain(&self, root: NodeId) -> Option<AttentionMatch> {
        let node = self.node(root);
        if node.op != Op::Matmul {
            return None;
        }
        let (mut x, v) = (node.inputs[0], node.inputs[1]);
        let t = self.meta(v).dtype;
        // Every intermediate, from the probabilities back to the scores' product, with the
        // dtype it must have: T, or f32 between the two casts of an f32 softmax.
        let mut intermediates: Vec<(NodeId, DType)> = Vec::new();
        // The cast back to T after an f32 softmax.
        let mut wide = false;
        if let Op::Cast(to) = self.node(x).op {
            let y = self.node(x).inputs[0];
            if to != t || t == DType::F32 || self.meta(y).dtype != DType::F32 {
                return None;
            }
            intermediates.push((x, t));
            (x, wide) = (y, true);
        }
        let inner = if wide { DType::F32 } else { t };
        let Op::Softmax { dim } = self.node(x).op else { return None };
        if dim + 1 != self.meta(x).rank() {
            return None;
        }
        intermediates.push((x, inner));
        x = self.node(x).inputs[0];
        let shape = self.meta(x).shape.clone();
        let r = shape.len();
        if r < 2 {
            return None;
        }
        let (l, s) = (shape[r - 2], shape[r - 1]);
        // The mask, the scale and (for an f32 softmax) the cast up, in any order, each at most
        // once, then the scores' product.
        let (mut causal, mut scale, mut cast_up) = (false, None, false);
        let mut dtype = inner;
        loop {
            let n = self.node(x);
            let next = match &n.op {
                Op::Matmul => break,
                Op::Cast(DType::F32) if wide && !cast_up && self.meta(n.inputs[0]).dtype == t => {
                    cast_up = true;
                    n.inputs[0]
                }
                Op::Where if !causal => {
                    let (cond, a, b) = (n.inputs[0], n.inputs[1], n.inputs[2]);
                    let (kept, pattern) = match (self.neg_inf(a), self.neg_inf(b)) {
                        (false, true) => (a, self.pattern(cond)?),
                        (true, false) => (b, self.pattern(cond)?.not()),
                        _ => return None,
                    };
                    let cs = &self.meta(cond).shape;
                    if pattern != Pattern::AtMost(0) || cs.len() < 2 || cs[cs.len() - 2..] != [l, s] {
                        return None;
                    }
                    causal = true;
                    kept
                }
                Op::Binary(op @ (BinaryOp::Mul | BinaryOp::Div)) if scale.is_none() => {
                    let (a, b) = (n.inputs[0], n.inputs[1]);
                    let (y, c) = match (op, self.constant(a), self.constant(b)) {
                        (BinaryOp::Mul, None, Some(c)) => (a, c),
                        (BinaryOp::Mul, Some(c), None) => (b, c),
                        (BinaryOp::Div, None, Some(c)) => (a, 1.0 / c),
                        _ => return None,
                    };
                    if !c.is_finite() {
                        return None;
                    }
                    scale = Some(c);
                    y
                }
                _ => return None,
            };
            intermediates.push((x, dtype));
            if cast_up {
                dtype = t;
            }
            x = next;
        }
        if wide && !cast_up {
            return None;
        }
        // The scores' product with the transposed keys.
        intermediates.push((x, t));
        let mm = self.node(x);
        let (q, kt) = (mm.inputs[0], mm.inputs[1]);
        let Op::Permute { perm } = &self.node(kt).op else { return None };
        let rk = perm.len();
        let swapped = rk >= 2
            && perm[rk - 2] == rk - 1
            && perm[rk - 1] == rk - 2
            && perm[..rk - 2].iter().enumerate().all(|(i, &p)| i == p);
        if !swapped {
            return None;
        }
        let k = self.node(kt).inputs[0];
        let (qm, km, vm) = (self.meta(q), self.meta(k), self.meta(v));
        template_supports(qm, km, vm).ok()?;
        if qm.rank() != r || qm.dtype != t {
            return None;
        }
        // Every intermediate has the scores' shape `[.., L, S]`, its dtype, and no other
        // reader; the result is q's rows of v's width.
        let mut want = qm.shape.clone();
        want[r - 1] = s;
        if shape != want {
            return None;
        }
        for &(n, dtype) in &intermediates {
            let m = self.meta(n);
            if m.shape != shape || m.dtype != dtype || !self.private(n) {
                return None;
            }
        }
        let mut out = qm.shape.clone();
        out[r - 1] = vm.shape[r - 1];
        if node.meta != TensorMeta::new(out, t) {
            return None;
        }
        let intermediates = intermediates.into_iter().map(|(n, _)| n).collect();
        Some(AttentionMatch { root, q, k, v, causal, scale: scale.unwrap_or(1.0), intermediates })
    }

    /// Which elements of `n`'s last two dims are nonzero, if that follows from its structure
    /// (see [`Pattern`] and the module docs).
    fn pattern(&self, n: NodeId) -> Option<Pattern> {
        let node = self.node(n);
        let rank = self.meta(n).rank();
        let arg = |i: usize| node.inputs[i];
        // The last two dims of an operand are the node's own (views change only leading dims).
        let same_last_two = |x: NodeId| {
            let (a, b) = (&self.meta(x).shape, &self.meta(n).shape);
            a.len() >= 2 && b.len() >= 2 && a[a.len() - 2..] == b[b.len() - 2..]
        };
        match &node.op {
            // `ones` and `zeros` (other values could round to 0 in the dtype).
            Op::Full(v) if v.as_f64() == 1.0 || v.as_f64() == 0.0 => Some(Pattern::Const(v.as_f64() != 0.0)),
            Op::Tril { k } | Op::Triu { k } if rank >= 2 => {
                let tri = if matches!(node.op, Op::Tril { .. }) { Pattern::AtMost(*k) } else { Pattern::Above(*k - 1) };
                match self.pattern(arg(0))? {
                    Pattern::Const(true) => Some(tri),
                    Pattern::Const(false) => Some(Pattern::Const(false)),
                    _ => None,
                }
            }
            Op::Unary(UnaryOp::LogicalNot) => Some(self.pattern(arg(0))?.not()),
            // Casts to bool, and of bool, keep which elements are nonzero (others may not:
            // 0.5 to an integer is 0).
            Op::Cast(to) if *to == DType::Bool || self.meta(arg(0)).dtype == DType::Bool => self.pattern(arg(0)),
            Op::Binary(op @ (BinaryOp::Eq | BinaryOp::Ne)) => {
                let zero = |i: usize| self.constant(node.inputs[i]) == Some(0.0);
                let x = match (zero(0), zero(1)) {
                    (false, true) => arg(0),
                    (true, false) => arg(1),
                    _ => return self.iota_compare(node),
                };
                let p = self.pattern(x)?;
                Some(if *op == BinaryOp::Eq { p.not() } else { p })
            }
            Op::Binary(BinaryOp::Le | BinaryOp::Lt | BinaryOp::Ge | BinaryOp::Gt) => self.iota_compare(node),
            Op::Reshape { .. } | Op::Expand { .. } if same_last_two(arg(0)) => self.pattern(arg(0)),
            Op::Permute { perm } if rank >= 2 && perm[rank - 2] == rank - 2 && perm[rank - 1] == rank - 1 => {
                self.pattern(arg(0))
            }
            // A top-left window keeps `col - row` of every element.
            Op::Slice { dim, start, step, .. } if *dim + 2 < rank || (*start == 0 && *step == 1) => {
                self.pattern(arg(0))
            }
            _ => None,
        }
    }

    /// `a <op> b` of the row and column iotas of the last two dims (`iota(col) <= iota(row)` is
    /// the causal keep mask the decomposition itself builds).
    fn iota_compare(&self, node: &Node) -> Option<Pattern> {
        let Op::Binary(op) = node.op else { return None };
        // +1 for the column index, -1 for the row index.
        let axis = |x: NodeId| match self.node(x).op {
            Op::Iota { dim } => {
                let r = self.meta(x).rank();
                if r >= 2 && dim == r - 1 {
                    Some(1i64)
                } else if r >= 2 && dim == r - 2 {
                    Some(-1)
                } else {
                    None
                }
            }
            _ => None,
        };
        let (a, b) = (axis(node.inputs[0])?, axis(node.inputs[1])?);
        if a == b {
            return None;
        }
        // `col <op> row`, with the operands swapped if the row comes first.
        let op = if a == 1 { op } else { swap(op)? };
        Some(match op {
            BinaryOp::Le => Pattern::AtMost(0),
            BinaryOp::Lt => Pattern::AtMost(-1),
            BinaryOp::Ge => Pattern::Above(-1),
            BinaryOp::Gt => Pattern::Above(0),
            _ => return None,
        })
    }
}

/// `b <op'> a` for `a <op> b`.
fn swap(op: BinaryOp) -> Option<BinaryOp> {
    Some(match op {
        BinaryOp::Le => BinaryOp::Ge,
        BinaryOp::Lt => BinaryOp::Gt,
        BinaryOp::Ge => BinaryOp::Le,
        BinaryOp::Gt => BinaryOp::Lt,
        _ => return None,
    })
}

#[path = "attention_mask.rs"]
mod mask;
pub use mask::{structured_mask, StructuredMask};

#[cfg(test)]
#[path = "attention_tests.rs"]
pub(crate) mod tests;
