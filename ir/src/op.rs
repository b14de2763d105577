//! The op set: every node of a tensor graph is one [`Op`].
//!
//! Two levels share this one enum:
//!
//! * **Primitives** ([`Op::is_primitive`]) are the closed set every later stage understands:
//!   leaves (inputs, constants, iota, random), pointwise math ([`UnaryOp`], [`BinaryOp`],
//!   `where`, casts), reductions ([`ReduceOp`]), `cumsum`, `argsort`, views (reshape, permute, expand,
//!   slice), data movement (pad, cat, gather, index_select, scatter), `bmm`, and the
//!   *templates* of attention: attention ([`Op::Attention`], with or without an explicit
//!   mask), the row logsumexp of its scores ([`Op::AttentionLogsumexp`]) and its gradients
//!   ([`Op::AttentionBackward`]), which the compile path keeps whole (one
//!   flash-attention call forward, one backward) where it supports their shapes and dtypes,
//!   and the convolution template ([`Op::Conv`]: the convolution and its two gradients, kept
//!   whole where cuDNN runs them); the reference decomposition always expands them.
//!   A *primitive graph* also makes broadcasting and type promotion explicit: the operands of a
//!   pointwise node have the node's shape, and one dtype (see [`crate::Graph::verify_primitive`]).
//! * **Composite** ops (softmax, layer_norm, gelu, cross_entropy, linear, ...) are what users call.
//!   They appear in captured graphs and are rewritten to primitives by the decomposition table in
//!   `coil-passes`.
//!
//! Names and semantics follow PyTorch. Shape and dtype inference for every op lives in
//! [`crate::infer`], so the frontend and the decompositions agree by construction.

use crate::dtype::{DType, Scalar};
use std::fmt::{self, Write};

mod attention_dropout;
mod conv;
mod pointwise;
pub use attention_dropout::AttentionDropout;
pub use conv::{infer_conv, ConvForm, ConvGeometry};
pub use pointwise::{BinaryOp, UnaryOp};

/// Reductions over a set of dims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum; integers and bool sum to i64 (the composite level casts first).
    Sum,
    /// Product; integers and bool multiply in i64, as `Sum`.
    Prod,
    /// Max / min propagate NaN.
    Max,
    /// The minimum (propagates NaN).
    Min,
    /// Index (i64) of the first maximum along exactly one dim; NaN counts as the maximum.
    ArgMax,
    /// Index (i64) of the first minimum along exactly one dim; NaN counts as the minimum.
    ArgMin,
}

impl ReduceOp {
    /// PyTorch's name of the reduction (`sum`, `amax`, `argmin`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "amax",
            ReduceOp::Min => "amin",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
        }
    }

    /// Whether the result is an index (`ArgMax`, `ArgMin`) rather than a value.
    pub fn is_arg(self) -> bool {
        matches!(self, ReduceOp::ArgMax | ReduceOp::ArgMin)
    }
}

/// How a loss combines its per-element values (`reduction=` in PyTorch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossReduction {
    /// The per-element losses, not reduced.
    None,
    /// Their mean (a weighted mean with class weights).
    Mean,
    /// Their sum.
    Sum,
}

impl LossReduction {
    /// PyTorch's spelling: `none`, `mean` or `sum`.
    pub fn name(self) -> &'static str {
        match self {
            LossReduction::None => "none",
            LossReduction::Mean => "mean",
            LossReduction::Sum => "sum",
        }
    }
}

/// Which operand of attention a gradient is taken with respect to ([`Op::AttentionBackward`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionInput {
    /// The queries, `q`.
    Query,
    /// The keys, `k`.
    Key,
    /// The values, `v`.
    Value,
}

impl AttentionInput {
    /// `q`, `k` or `v`.
    pub fn name(self) -> &'static str {
        match self {
            AttentionInput::Query => "q",
            AttentionInput::Key => "k",
            AttentionInput::Value => "v",
        }
    }

    /// The operand's position among attention's operands (q 0, k 1, v 2).
    pub fn index(self) -> usize {
        self as usize
    }

    /// All three, in operand order.
    pub const ALL: [AttentionInput; 3] = [AttentionInput::Query, AttentionInput::Key, AttentionInput::Value];
}

/// Distribution of a [`Op::Rand`] leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RandDist {
    /// Uniform on `[0, 1)`.
    Uniform,
    /// Standard normal.
    Normal,
}

/// One node's operation. See the module docs for the two levels.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    // ---- leaves (primitive); their shape and dtype are given, not inferred ----
    /// The `index`-th input of the graph, bound to a buffer when the graph runs.
    Input {
        /// Which graph input.
        index: usize,
    },
    /// A Rust scalar in an expression; weak in type promotion. Composite level only: the
    /// decomposition turns it into a [`Op::Full`] of the promoted dtype.
    Scalar(Scalar),
    /// A tensor filled with one value.
    Full(Scalar),
    /// i64 tensor whose value is the element's index along `dim`.
    Iota {
        /// The dim whose index each element holds.
        dim: usize,
    },
    /// Counter-based (Philox 4x32-10) random numbers from the graph's random stream `stream`:
    /// element `i` draws at counter `base + offset + i` under the stream's key, where the key
    /// and `base` are the stream's [`crate::RandomState`], an argument of each run
    /// ([`crate::philox`]). So every device draws the same numbers, and a graph's structure
    /// does not depend on which numbers it draws.
    Rand {
        /// The distribution drawn from.
        dist: RandDist,
        /// The graph's random stream drawn from.
        stream: usize,
        /// The counter offset of element 0 within the stream.
        offset: u64,
    },

    // ---- pointwise (primitive) ----
    /// An elementwise function of one operand.
    Unary(UnaryOp),
    /// An elementwise function of two operands, broadcast to one shape.
    Binary(BinaryOp),
    /// `where(cond, x, y)`.
    Where,
    /// Elementwise conversion to the dtype, as `Tensor.to(dtype)`.
    Cast(DType),

    // ---- reductions and scans (primitive) ----
    /// A reduction over `dims`.
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// The dims reduced.
        dims: Vec<usize>,
        /// Whether reduced dims stay as size 1.
        keepdim: bool,
    },
    /// `torch.cumsum` along `dim`.
    Cumsum {
        /// The dim scanned.
        dim: usize,
    },
    /// The i64 positions that sort each line along `dim` (`torch.argsort(x, dim, descending,
    /// stable=True)`): stable (equal elements keep their order, in both directions), NaN after
    /// every number ascending and before every number descending, `-0.0` equal to `0.0`. Sorted
    /// values are a `gather` of these positions.
    Argsort {
        /// The dim sorted.
        dim: usize,
        /// Largest first when true.
        descending: bool,
    },

    // ---- views (primitive) ----
    /// The same elements in row-major order with another shape.
    Reshape {
        /// The new shape (same element count).
        shape: Vec<usize>,
    },
    /// Reorders the dims.
    Permute {
        /// Output dim `i` is input dim `perm[i]`.
        perm: Vec<usize>,
    },
    /// Broadcasts size-1 dims (and new leading dims) to `shape`.
    Expand {
        /// The broadcast shape.
        shape: Vec<usize>,
    },
    /// Elements `start, start+step, ...` (`len` of them) along `dim`; a negative step walks
    /// backwards (flip).
    Slice {
        /// The dim sliced.
        dim: usize,
        /// The first element taken.
        start: usize,
        /// How many elements are taken.
        len: usize,
        /// The stride between taken elements; negative walks backwards.
        step: i64,
    },

    // ---- data movement (primitive) ----
    /// Constant padding, `(before, after)` per dim.
    Pad {
        /// `(before, after)` per dim.
        pads: Vec<(usize, usize)>,
        /// The padding value.
        value: Scalar,
    },
    /// `torch.cat` of the operands along `dim`.
    Cat {
        /// The dim concatenated along.
        dim: usize,
    },
    /// `torch.gather(x, dim, index)`.
    Gather {
        /// The dim indexed.
        dim: usize,
    },
    /// `torch.index_select(x, dim, index)` with a 1-D index.
    IndexSelect {
        /// The dim indexed.
        dim: usize,
    },
    /// `torch.scatter(x, dim, index, src)` (`reduce` none: the last write wins), or
    /// `scatter_reduce(x, dim, index, src, reduce, include_self=True)` with `Sum` (that is
    /// `scatter_add`), `Prod`, `Max` or `Min` (these two propagate NaN). `mean` and
    /// `include_self=False` are compositions in the frontend.
    Scatter {
        /// The dim indexed.
        dim: usize,
        /// How colliding writes combine; `None`: the last write wins.
        reduce: Option<ReduceOp>,
    },

    // ---- linear algebra (primitive) ----
    /// `[..., m, k] @ [..., k, n]` with equal batch dims.
    Bmm,

    // ---- composite ops (decomposed before lowering) ----
    /// `torch.matmul`: 1-D operands and batch broadcasting.
    Matmul,
    /// `F.linear(x, w, b?)`: `x @ w^T + b`.
    Linear {
        /// Whether a bias operand follows `x` and `w`.
        bias: bool,
    },
    /// `F.relu`: `max(x, 0)`.
    Relu,
    /// `x.detach()`: the same values, cut off from gradients. The reference decomposition is the
    /// identity; the one gradients use (`DecomposeOptions::keep_detach`) keeps the node, which
    /// `coil_passes::autodiff` gives no gradient.
    Detach,
    /// `F.gelu`, exact (erf) or with the tanh approximation.
    Gelu {
        /// The tanh approximation (`approximate="tanh"`).
        tanh: bool,
    },
    /// `F.silu`: `x * sigmoid(x)`.
    Silu,
    /// `F.softplus`: `log(1 + exp(beta x)) / beta`, the identity above the threshold.
    Softplus {
        /// The factor on `x`.
        beta: f64,
        /// Where `beta x` exceeds this, the result is `x`.
        threshold: f64,
    },
    /// `torch.clamp`: `min(max(x, min), max)`; a missing bound does not clamp.
    Clamp {
        /// The lower bound.
        min: Option<Scalar>,
        /// The upper bound.
        max: Option<Scalar>,
    },
    /// `torch.nan_to_num`: NaN and infinities replaced by finite values.
    NanToNum {
        /// What NaN becomes.
        nan: f64,
        /// What `+inf` becomes (`None`: the dtype's largest finite value).
        posinf: Option<f64>,
        /// What `-inf` becomes (`None`: minus the dtype's largest finite value).
        neginf: Option<f64>,
    },
    /// `torch.mean` over `dims`.
    Mean {
        /// The dims reduced.
        dims: Vec<usize>,
        /// Whether reduced dims stay as size 1.
        keepdim: bool,
    },
    /// `torch.var` over `dims`.
    Var {
        /// The dims reduced.
        dims: Vec<usize>,
        /// Subtracted from the element count in the divisor (1: Bessel's correction).
        correction: f64,
        /// Whether reduced dims stay as size 1.
        keepdim: bool,
    },
    /// `torch.std` over `dims`: the square root of [`Op::Var`].
    Std {
        /// The dims reduced.
        dims: Vec<usize>,
        /// Subtracted from the element count in the divisor (1: Bessel's correction).
        correction: f64,
        /// Whether reduced dims stay as size 1.
        keepdim: bool,
    },
    /// `torch.logsumexp` over `dims`.
    LogSumExp {
        /// The dims reduced.
        dims: Vec<usize>,
        /// Whether reduced dims stay as size 1.
        keepdim: bool,
    },
    /// p-norm over dims (`p = inf` is the max-norm).
    Norm {
        /// The norm's order.
        p: f64,
        /// The dims reduced.
        dims: Vec<usize>,
        /// Whether reduced dims stay as size 1.
        keepdim: bool,
    },
    /// `any` / `all` over dims.
    Any {
        /// The dims reduced.
        dims: Vec<usize>,
        /// Whether reduced dims stay as size 1.
        keepdim: bool,
    },
    /// `torch.all` over `dims`.
    All {
        /// The dims reduced.
        dims: Vec<usize>,
        /// Whether reduced dims stay as size 1.
        keepdim: bool,
    },
    /// `torch.softmax` along `dim`.
    Softmax {
        /// The dim normalized.
        dim: usize,
    },
    /// `torch.log_softmax` along `dim`.
    LogSoftmax {
        /// The dim normalized.
        dim: usize,
    },
    /// Normalizes over the last `ndim` dims; optional weight and bias follow `x`.
    LayerNorm {
        /// How many trailing dims are normalized.
        ndim: usize,
        /// Added to the variance.
        eps: f64,
        /// Whether a weight operand follows `x`.
        weight: bool,
        /// Whether a bias operand follows (the weight, if any).
        bias: bool,
    },
    /// `eps = None` uses the dtype's machine epsilon, as PyTorch does.
    RmsNorm {
        /// How many trailing dims are normalized.
        ndim: usize,
        /// Added to the mean square.
        eps: Option<f64>,
        /// Whether a weight operand follows `x`.
        weight: bool,
    },
    /// `torch.tril`: zeros above diagonal `k` of the last two dims.
    Tril {
        /// The diagonal: 0 the main one, positive above it, negative below.
        k: i64,
    },
    /// `torch.triu`: zeros below diagonal `k` of the last two dims.
    Triu {
        /// The diagonal: 0 the main one, positive above it, negative below.
        k: i64,
    },
    /// Inverted dropout: keep with probability `1 - p`, scale kept values by `1 / (1 - p)`.
    /// The mask draws uniform numbers as `Rand { stream, offset }` of the operand's shape.
    Dropout {
        /// The probability of dropping an element.
        p: f64,
        /// The graph's random stream the mask draws from.
        stream: usize,
        /// The counter offset of the mask's element 0 within the stream.
        offset: u64,
    },
    /// `F.embedding(indices, weight)`: inputs are `(weight, indices)`.
    Embedding,
    /// `F.cross_entropy(logits, target, weight?)` with class-index targets; logits `[N, C]` or
    /// `[C]`; with `weight`, a third operand `[C]` weighs each class.
    CrossEntropy {
        /// Targets equal to this contribute nothing and are not counted by `mean`.
        ignore_index: i64,
        /// How the per-target losses combine.
        reduction: LossReduction,
        /// The weight moved from the target class to a uniform distribution over the classes.
        label_smoothing: f64,
        /// Whether the class-weight operand is present.
        weight: bool,
    },
    /// `F.mse_loss(input, target)`.
    MseLoss {
        /// How the squared errors combine.
        reduction: LossReduction,
    },
    /// `F.scaled_dot_product_attention(q, k, v, mask?)`. With `mask`, a fourth operand
    /// broadcastable to the scores `[*batch, L, S]`: bool (true keeps the key, false scores
    /// `-inf`) or of q's dtype (added to the scaled scores). A row whose every key is dropped
    /// gives 0, as PyTorch's SDPA (its `_safe_softmax`). With `dropout`, a random op: the
    /// probabilities are dropped as [`AttentionDropout`] defines, before the product with v.
    Attention {
        /// Keys after the query's position are dropped (`is_causal`).
        causal: bool,
        /// The factor on `q @ k^T` (`None`: `1 / sqrt(head dim)`).
        scale: Option<f64>,
        /// Whether the mask operand is present.
        mask: bool,
        /// Dropout on the probabilities (`dropout_p > 0`), drawing from a random stream.
        dropout: Option<AttentionDropout>,
    },
    /// The row logsumexp of attention's scores, `logsumexp(scale * q @ k^T (causal: -inf where
    /// col > row) (masked), -1)`: `[*batch, L]`, f32 (f64 for f64 operands); `-inf` for a row
    /// that keeps no key. Its operands are those of the [`Op::Attention`] it belongs to, v
    /// included (`q, k, v`, then the mask when `mask`), and so are its attributes: the compile
    /// path computes both in one call, and the attention backward ([`Op::AttentionBackward`])
    /// recomputes the probabilities from it.
    AttentionLogsumexp {
        /// Keys after the query's position are dropped (`is_causal`).
        causal: bool,
        /// The factor on `q @ k^T` (`None`: `1 / sqrt(head dim)`).
        scale: Option<f64>,
        /// Whether the mask operand is present (the last operand; as [`Op::Attention`]'s).
        mask: bool,
    },
    /// The gradient of attention with respect to `input` (q, k or v), as FlashAttention's
    /// backward computes it. Operands `(q, k, v, grad_out, logsumexp, out)`, then the mask when
    /// `mask`: attention's operands, the gradient of its output, the
    /// [`Op::AttentionLogsumexp`] of the same operands and the attention's output `out`. With
    /// `delta = sum(grad_out * out, -1)` (accumulated in the logsumexp's dtype; every backend
    /// computes it from its operands), `P = exp(scale * q @ k^T (+ mask) - logsumexp)` (0 where
    /// masked, and in a row that keeps no key, whose logsumexp is `-inf`) and
    /// `dS = P * (grad_out @ v^T - delta)`: `dq = scale * dS @ k`, `dk = scale * dS^T @ q`,
    /// `dv = P^T @ grad_out`, in the operands' dtype. q, k and v have equal batch dims.
    /// With `dropout` (the forward's), the same keep mask `Z` is regenerated:
    /// `dv = (P * Z / (1 - p))^T @ grad_out` and `dS = P * ((grad_out @ v^T) * Z / (1 - p) - delta)`.
    AttentionBackward {
        /// Keys after the query's position are dropped (`is_causal`).
        causal: bool,
        /// The factor on `q @ k^T` (`None`: `1 / sqrt(head dim)`).
        scale: Option<f64>,
        /// The operand the gradient is taken with respect to.
        input: AttentionInput,
        /// Whether the mask operand is present (the last operand; as [`Op::Attention`]'s).
        mask: bool,
        /// The forward's dropout, whose keep decisions the gradient regenerates.
        dropout: Option<AttentionDropout>,
    },
    /// A convolution over 1, 2 or 3 spatial dims, or one of its two gradients (`form`; see
    /// [`ConvForm`] for the operands). A template: the compile path keeps it whole where a
    /// backend runs convolutions itself (cuDNN); the reference decomposition is im2col and a
    /// batched matrix product.
    Conv {
        /// Stride, padding, dilation and groups.
        geometry: ConvGeometry,
        /// The convolution or which of its gradients.
        form: ConvForm,
    },
}

impl Op {
    /// The printed name of the op (PyTorch's where one exists).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Scalar(_) => "scalar",
            Op::Full(_) => "full",
            Op::Iota { .. } => "iota",
            Op::Rand { dist: RandDist::Uniform, .. } => "rand",
            Op::Rand { dist: RandDist::Normal, .. } => "randn",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Where => "where",
            Op::Cast(_) => "cast",
            Op::Reduce { op, .. } => op.name(),
            Op::Cumsum { .. } => "cumsum",
            Op::Argsort { .. } => "argsort",
            Op::Reshape { .. } => "reshape",
            Op::Permute { .. } => "permute",
            Op::Expand { .. } => "expand",
            Op::Slice { .. } => "slice",
            Op::Pad { .. } => "pad",
            Op::Cat { .. } => "cat",
            Op::Gather { .. } => "gather",
            Op::IndexSelect { .. } => "index_select",
            Op::Scatter { reduce: None, .. } => "scatter",
            Op::Scatter { reduce: Some(ReduceOp::Sum), .. } => "scatter_add",
            Op::Scatter { reduce: Some(ReduceOp::Prod), .. } => "scatter_prod",
            Op::Scatter { reduce: Some(ReduceOp::Max), .. } => "scatter_amax",
            Op::Scatter { reduce: Some(ReduceOp::Min), .. } => "scatter_amin",
            Op::Scatter { reduce: Some(_), .. } => "scatter_arg",
            Op::Bmm => "bmm",
            Op::Matmul => "matmul",
            Op::Linear { .. } => "linear",
            Op::Relu => "relu",
            Op::Detach => "detach",
            Op::Gelu { .. } => "gelu",
            Op::Silu => "silu",
            Op::Softplus { .. } => "softplus",
            Op::Clamp { .. } => "clamp",
            Op::NanToNum { .. } => "nan_to_num",
            Op::Mean { .. } => "mean",
            Op::Var { .. } => "var",
            Op::Std { .. } => "std",
            Op::LogSumExp { .. } => "logsumexp",
            Op::Norm { .. } => "norm",
            Op::Any { .. } => "any",
            Op::All { .. } => "all",
            Op::Softmax { .. } => "softmax",
            Op::LogSoftmax { .. } => "log_softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Tril { .. } => "tril",
            Op::Triu { .. } => "triu",
            Op::Dropout { .. } => "dropout",
            Op::Embedding => "embedding",
            Op::CrossEntropy { .. } => "cross_entropy",
            Op::MseLoss { .. } => "mse_loss",
            Op::Attention { .. } => "scaled_dot_product_attention",
            Op::AttentionLogsumexp { .. } => "attention_logsumexp",
            Op::AttentionBackward { .. } => "attention_backward",
            Op::Conv { form, .. } => form.name(),
        }
    }

    /// Whether the op belongs to the closed primitive set (see the module docs; the attention
    /// template, [`Op::is_template`], included).
    pub fn is_primitive(&self) -> bool {
        self.is_template() || self.is_basic_primitive()
    }

    /// Templates: composite ops a primitive graph may keep whole, for a backend to run as one
    /// call (attention, with or without an explicit mask, its logsumexp and its gradients).
    /// Decomposing them is always correct too.
    pub fn is_template(&self) -> bool {
        matches!(
            self,
            Op::Attention { .. } | Op::AttentionLogsumexp { .. } | Op::AttentionBackward { .. } | Op::Conv { .. }
        )
    }

    /// The primitives that are not templates.
    fn is_basic_primitive(&self) -> bool {
        matches!(
            self,
            Op::Input { .. }
                | Op::Full(_)
                | Op::Iota { .. }
                | Op::Rand { .. }
                | Op::Unary(_)
                | Op::Binary(_)
                | Op::Where
                | Op::Cast(_)
                | Op::Reduce { .. }
                | Op::Cumsum { .. }
                | Op::Argsort { .. }
                | Op::Reshape { .. }
                | Op::Permute { .. }
                | Op::Expand { .. }
                | Op::Slice { .. }
                | Op::Pad { .. }
                | Op::Cat { .. }
                | Op::Gather { .. }
                | Op::IndexSelect { .. }
                | Op::Scatter { .. }
                | Op::Bmm
        )
    }

    /// Leaves have no operands; their shape and dtype are given when they are created.
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::Input { .. } | Op::Scalar(_) | Op::Full(_) | Op::Iota { .. } | Op::Rand { .. })
    }

    /// Pointwise primitives: one output element depends on the operands' elements at the same index.
    pub fn is_pointwise(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast(_))
    }

    /// A random op ([`Op::Rand`], [`Op::Dropout`], attention with dropout and its gradients)
    /// drawing from `stream` at `offset`; any other op as it is.
    pub fn with_stream(&self, stream: usize, offset: u64) -> Op {
        match self {
            Op::Rand { dist, .. } => Op::Rand { dist: *dist, stream, offset },
            Op::Dropout { p, .. } => Op::Dropout { p: *p, stream, offset },
            Op::Attention { causal, scale, mask, dropout: Some(d) } => Op::Attention {
                causal: *causal,
                scale: *scale,
                mask: *mask,
                dropout: Some(d.with_stream(stream, offset)),
            },
            Op::AttentionBackward { causal, scale, input, mask, dropout: Some(d) } => Op::AttentionBackward {
                causal: *causal,
                scale: *scale,
                input: *input,
                mask: *mask,
                dropout: Some(d.with_stream(stream, offset)),
            },
            op => op.clone(),
        }
    }

    /// Views: the output is the operand's data seen through a different index map.
    pub fn is_view(&self) -> bool {
        matches!(self, Op::Reshape { .. } | Op::Permute { .. } | Op::Expand { .. } | Op::Slice { .. })
    }

    /// The attributes as printed after the operands: `dims=[1], keepdim=true`.
    pub fn attributes(&self) -> String {
        let mut s = String::new();
        let mut put = |k: &str, v: String| {
            if !s.is_empty() {
                s.push_str(", ");
            }
            let _ = write!(s, "{k}={v}");
        };
        fn opt<T: fmt::Display>(x: &Option<T>) -> String {
            x.as_ref().map_or("none".into(), |v| v.to_string())
        }
        // Attention's dropout, only when it has one (`dropout_p=0.1, stream=0, offset=64`).
        fn put_dropout(put: &mut impl FnMut(&str, String), dropout: &Option<AttentionDropout>) {
            if let Some(d) = dropout {
                put("dropout_p", Scalar::Float(d.p).to_string());
                put("stream", d.stream.to_string());
                put("offset", d.offset.to_string());
            }
        }
        match self {
            Op::Input { index } => put("index", index.to_string()),
            Op::Scalar(v) | Op::Full(v) => put("value", v.to_string()),
            Op::Iota { dim } | Op::Cumsum { dim } | Op::Cat { dim } | Op::Gather { dim } => put("dim", dim.to_string()),
            Op::IndexSelect { dim } | Op::Scatter { dim, .. } => put("dim", dim.to_string()),
            Op::Argsort { dim, descending } => {
                put("dim", dim.to_string());
                put("descending", descending.to_string());
            }
            Op::Softmax { dim } | Op::LogSoftmax { dim } => put("dim", dim.to_string()),
            Op::Rand { stream, offset, .. } => {
                put("stream", stream.to_string());
                put("offset", offset.to_string());
            }
            Op::Cast(t) => put("dtype", t.to_string()),
            Op::Reduce { dims, keepdim, .. }
            | Op::Mean { dims, keepdim }
            | Op::LogSumExp { dims, keepdim }
            | Op::Any { dims, keepdim }
            | Op::All { dims, keepdim } => {
                put("dims", format!("{dims:?}"));
                put("keepdim", keepdim.to_string());
            }
            Op::Var { dims, correction, keepdim } | Op::Std { dims, correction, keepdim } => {
                put("dims", format!("{dims:?}"));
                put("correction", Scalar::Float(*correction).to_string());
                put("keepdim", keepdim.to_string());
            }
            Op::Norm { p, dims, keepdim } => {
                put("p", Scalar::Float(*p).to_string());
                put("dims", format!("{dims:?}"));
                put("keepdim", keepdim.to_string());
            }
            Op::Reshape { shape } | Op::Expand { shape } => put("shape", format!("{shape:?}")),
            Op::Permute { perm } => put("perm", format!("{perm:?}")),
            Op::Slice { dim, start, len, step } => {
                put("dim", dim.to_string());
                put("start", start.to_string());
                put("len", len.to_string());
                put("step", step.to_string());
            }
            Op::Pad { pads, value } => {
                put("pads", format!("{pads:?}"));
                put("value", value.to_string());
            }
            Op::Linear { bias } => put("bias", bias.to_string()),
            Op::Gelu { tanh } => put("approximate", if *tanh { "tanh" } else { "none" }.into()),
            Op::Softplus { beta, threshold } => {
                put("beta", Scalar::Float(*beta).to_string());
                put("threshold", Scalar::Float(*threshold).to_string());
            }
            Op::Clamp { min, max } => {
                put("min", opt(min));
                put("max", opt(max));
            }
            Op::NanToNum { nan, posinf, neginf } => {
                put("nan", Scalar::Float(*nan).to_string());
                put("posinf", opt(&posinf.map(Scalar::Float)));
                put("neginf", opt(&neginf.map(Scalar::Float)));
            }
            Op::LayerNorm { ndim, eps, weight, bias } => {
                put("ndim", ndim.to_string());
                put("eps", Scalar::Float(*eps).to_string());
                put("weight", weight.to_string());
                put("bias", bias.to_string());
            }
            Op::RmsNorm { ndim, eps, weight } => {
                put("ndim", ndim.to_string());
                put("eps", opt(&eps.map(Scalar::Float)));
                put("weight", weight.to_string());
            }
            Op::Tril { k } | Op::Triu { k } => put("k", k.to_string()),
            Op::Dropout { p, stream, offset } => {
                put("p", Scalar::Float(*p).to_string());
                put("stream", stream.to_string());
                put("offset", offset.to_string());
            }
            Op::CrossEntropy { ignore_index, reduction, label_smoothing, weight } => {
                put("ignore_index", ignore_index.to_string());
                put("reduction", reduction.name().into());
                put("label_smoothing", Scalar::Float(*label_smoothing).to_string());
                put("weight", weight.to_string());
            }
            Op::MseLoss { reduction } => put("reduction", reduction.name().into()),
            Op::Attention { causal, scale, mask, dropout } => {
                put("causal", causal.to_string());
                put("scale", opt(&scale.map(Scalar::Float)));
                put("mask", mask.to_string());
                put_dropout(&mut put, dropout);
            }
            Op::AttentionLogsumexp { causal, scale, mask } => {
                put("causal", causal.to_string());
                put("scale", opt(&scale.map(Scalar::Float)));
                put("mask", mask.to_string());
            }
            Op::AttentionBackward { causal, scale, input, mask, dropout } => {
                put("causal", causal.to_string());
                put("scale", opt(&scale.map(Scalar::Float)));
                put("input", input.name().into());
                put("mask", mask.to_string());
                put_dropout(&mut put, dropout);
            }
            Op::Conv { geometry, form } => {
                put("stride", format!("{:?}", geometry.stride));
                put("padding", format!("{:?}", geometry.padding));
                put("dilation", format!("{:?}", geometry.dilation));
                put("groups", geometry.groups.to_string());
                match form {
                    ConvForm::Forward => {}
                    ConvForm::BackwardData { size } => put("size", format!("{size:?}")),
                    ConvForm::BackwardWeight { kernel } => put("kernel", format!("{kernel:?}")),
                }
            }
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::Bmm
            | Op::Matmul
            | Op::Relu
            | Op::Detach
            | Op::Silu
            | Op::Embedding => {}
        }
        s
    }
}

impl fmt::Display for Op {
    /// `name` or `name[attrs]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attrs = self.attributes();
        if attrs.is_empty() {
            f.write_str(self.name())
        } else {
            write!(f, "{}[{}]", self.name(), attrs)
        }
    }
}
