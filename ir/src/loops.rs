//! The loop-level IR: what a primitive graph becomes before fusion.
//!
//! A [`LoopProgram`] is a list of buffers and a list of [`LoopNode`]s in execution order. Each
//! node writes one buffer, contiguously (row-major) (but the attention templates' calls, which
//! write several, [`LoopNode::writes`]), and is one of:
//!
//! * **pointwise**: `out[flat(x)] = body(x)` for every `x` in `ranges`; or, for a scatter along
//!   one dim at consecutive positions from a run-time offset ([`ScatterStore`]: a KV cache
//!   write), `out = base` with `out[index(x) + stride * offset] = body(x)`;
//! * **reduction**: `out[flat(x)] = reduce over r in reduction_ranges of body(x, r)`;
//! * **extern**: a call coil does not generate code for (a matrix product, the attention
//!   templates, or a fallback op run by the reference interpreter).
//!
//! A [`Body`] is a small SSA list of scalar ops ([`ScalarOp`]). It reads buffers through
//! symbolic index expressions ([`crate::sym::Expr`]) over the node's index variables: `x0, x1, ...`
//! (one per range, `0 <= xi < ranges[i]`) and, for reductions, `r0, r1, ...`. Views (permute,
//! expand, slice, reshape) never become nodes: lowering folds them into those index expressions.
//! Pointwise producers are inlined into their consumers' bodies unless something forces them
//! into a buffer (an output, an extern operand, a reduction), so each node is already a
//! vertical fusion of pointwise ops; the scheduler then groups nodes into kernels.
//!
//! The printer is deterministic and prints everything a program holds; it is what
//! `ir_pre_fusion.txt` shows, and [`LoopProgram::parse`] reads it back ([`crate::parse`]
//! describes the text).

use crate::dtype::{DType, Scalar};
use crate::graph::TensorMeta;
use crate::op::{BinaryOp, Op, RandDist, ReduceOp, UnaryOp};
use crate::sym::Expr;
use indexmap::IndexMap;
use std::fmt;

mod print;
pub(crate) use print::appearance_order;

/// Index of a buffer in [`LoopProgram::buffers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub usize);

/// A buffer: contiguous, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopBuffer {
    /// `arg0, arg1, ...` for graph inputs, `buf<N>` for the rest (N = the writing node's index).
    pub name: String,
    /// Dtype and sizes; in a program with size symbols, the sizes at the symbols' hints.
    pub meta: TensorMeta,
    /// The sizes as expressions of the program's size symbols (constants when static).
    pub shape: Vec<Expr>,
}

impl LoopBuffer {
    /// A buffer of static sizes.
    pub fn new(name: impl Into<String>, meta: TensorMeta) -> LoopBuffer {
        let shape = meta.shape.iter().map(|&n| Expr::from(n)).collect();
        LoopBuffer { name: name.into(), meta, shape }
    }

    /// `f32[s0, 64]`: the dtype and the sizes as expressions.
    pub fn type_text(&self) -> String {
        format!("{}{}", self.meta.dtype, print::exprs(&self.shape))
    }

    /// Number of elements, as an expression of the size symbols.
    pub fn numel(&self) -> Expr {
        self.shape.iter().copied().product()
    }
}

/// Index of a value in [`Body::values`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// One scalar operation of a body. Operands are earlier values of the same body.
#[derive(Clone, Debug, PartialEq)]
pub enum ScalarOp {
    /// `buffer[index]`.
    Load {
        /// The buffer read.
        buffer: BufferId,
        /// The element index, over the node's range variables.
        index: Expr,
    },
    /// `buffer[index]` where `mask` (a bool value) holds, else `other` (pad, cat, tails).
    MaskedLoad {
        /// The buffer read.
        buffer: BufferId,
        /// The element index, over the node's range variables.
        index: Expr,
        /// The bool value that says where to load.
        mask: ValueId,
        /// The value where `mask` is false.
        other: Scalar,
    },
    /// A data-dependent load (gather, index_select, embedding): `buffer[index + stride * v]`
    /// where `v` is the integer value `indirect`, which must lie in `[0, bound)`; generated code
    /// reports an out-of-bounds `v` as an error rather than reading outside the buffer.
    IndirectLoad {
        /// The buffer read.
        buffer: BufferId,
        /// The index without the data-dependent part.
        index: Expr,
        /// The integer value holding the data-dependent position.
        indirect: ValueId,
        /// Elements between consecutive positions.
        stride: Expr,
        /// The position's exclusive upper bound.
        bound: Expr,
    },
    /// A constant.
    Constant(Scalar),
    /// The i64 value of an index expression (iota; the masks of pad, cat, tril).
    Index(Expr),
    /// Philox random number of the program's random stream `stream` ([`crate::philox`]):
    /// key `seed<stream>`, counter `offset<stream> + counter` (wrapping), the stream's
    /// [`crate::RandomState`] being a run-time argument; `counter` is relative to it.
    Rand {
        /// The distribution drawn from.
        dist: RandDist,
        /// The program's random stream drawn from.
        stream: usize,
        /// The counter relative to the stream's start.
        counter: Expr,
    },
    /// A unary function of a value.
    Unary(UnaryOp, ValueId),
    /// A binary function of two values.
    Binary(BinaryOp, ValueId, ValueId),
    /// `where(cond, a, b)`.
    Where(ValueId, ValueId, ValueId),
    /// Converts the operand to this value's dtype.
    Cast(ValueId),
}

/// A scalar op and the dtype of its result.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// What computes the value.
    pub op: ScalarOp,
    /// The value's dtype.
    pub dtype: DType,
}

/// An SSA list of scalar ops; `result` is the value the node stores (or reduces).
///
/// Bodies are built without duplicates (value numbering), so inlining a producer twice costs
/// nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Body {
    /// The values, operands before their users.
    pub values: Vec<Value>,
    /// The value the node stores (or reduces).
    pub result: ValueId,
}

impl Body {
    /// The value `id`.
    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.0 as usize]
    }

    /// Appends a value, or returns the existing identical one.
    pub fn push(&mut self, op: ScalarOp, dtype: DType) -> ValueId {
        let value = Value { op, dtype };
        if let Some(i) = self.values.iter().position(|v| *v == value) {
            return ValueId(i as u32);
        }
        self.values.push(value);
        ValueId(self.values.len() as u32 - 1)
    }

    /// The buffers this body reads, in first-read order, without repeats.
    pub fn reads(&self) -> Vec<BufferId> {
        let mut out = Vec::new();
        for v in &self.values {
            if let ScalarOp::Load { buffer, .. }
            | ScalarOp::MaskedLoad { buffer, .. }
            | ScalarOp::IndirectLoad { buffer, .. } = v.op
            {
                if !out.contains(&buffer) {
                    out.push(buffer);
                }
            }
        }
        out
    }
}

/// A call coil does not generate a kernel for.
#[derive(Clone, Debug, PartialEq)]
pub enum ExternCall {
    /// `out[b] = act(a[b] @ b[b] (+ bias))` for every batch index; each operand is a strided view
    /// of its buffer (a transpose is a stride swap, never a copy). The optional bias is added to
    /// every row inside the call, as an epilogue (`linear(x, w, b)` is one call); the optional
    /// [`Activation`] is applied after it, also inside the call (`gelu_tanh(linear(x, w, b))` is
    /// one call). Without an activation the printer shows `bmm` / `bmm +bias`, with one
    /// `bmm +bias +gelu_tanh`.
    Bmm {
        /// The left operand, `[*batch, m, k]`.
        a: StridedOperand,
        /// The right operand, `[*batch, k, n]`.
        b: StridedOperand,
        /// The bias row added to every output row, if any.
        bias: Option<BiasOperand>,
        /// The activation applied after the bias, if any.
        activation: Option<Activation>,
        /// With `Some`, the call computes the gradient of an activation at its saved input
        /// instead: `out = (a @ b) * act'(aux)` (no bias, no activation; cuBLASLt's
        /// `CUBLASLT_EPILOGUE_DGELU`). The printer shows `bmm +gelu_tanh_grad` and an `aux` line.
        activation_grad: Option<ActivationGrad>,
        /// With an activation, a buffer the call also writes: the activation's input (the
        /// product plus the bias, rounded to the output dtype, laid out as the output), which
        /// a training graph's backward reads (cuBLASLt's `CUBLASLT_EPILOGUE_GELU_AUX_BIAS`).
        /// The printer shows a `saved` line.
        saved: Option<BufferId>,
        /// Batch dims of the output.
        batch: Vec<Expr>,
        /// Rows of each product.
        m: Expr,
        /// Columns of each product.
        n: Expr,
        /// The contracted dim.
        k: Expr,
    },
    /// The attention template (flash-attention style): see [`AttentionCall`] (boxed, as the
    /// backward's).
    Attention(Box<AttentionCall>),
    /// The attention backward template (FlashAttention-2 style): see [`AttentionBackwardCall`]
    /// (boxed: the largest call by far).
    AttentionBackward(Box<AttentionBackwardCall>),
    /// A primitive op run by the reference interpreter on its operand buffers (an op with no
    /// generated kernel yet, e.g. scatter or cumsum). The dump says so.
    Fallback {
        /// The op the interpreter runs.
        op: Op,
    },
    /// The convolution template ([`Op::Conv`]): see [`ConvCall`] (boxed: descriptors are long).
    Conv(Box<ConvCall>),
}

/// One form of a convolution ([`Op::Conv`]) as one call (cuDNN on CUDA): operands `a` and
/// `b` (x and w, dy and w, or x and dy, as [`crate::op::ConvForm`] says) are strided views of
/// their buffers, in elements, so a channels-last input is read in place; the result is written
/// with `out_strides` (row-major, or channels-last: the buffer of the permute after it). Sizes are constants: the compile path keeps convolutions whole
/// only for static shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvCall {
    /// Stride, padding, dilation and groups.
    pub geometry: crate::op::ConvGeometry,
    /// The convolution or which of its gradients.
    pub form: crate::op::ConvForm,
    /// The first operand (x, or dy for the data gradient).
    pub a: TensorView,
    /// The second operand (w, or dy for the weight gradient).
    pub b: TensorView,
    /// The result's shape, `[N, C, *spatial]` or the weight's.
    pub out: Vec<usize>,
    /// The result's strides in its buffer: row-major, or channels-last (`C` fastest) where
    /// the call writes the buffer of the permute to `[N, *spatial, C]` after it.
    pub out_strides: Vec<usize>,
}

/// A dense tensor seen through its buffer: element `i` is at `offset + sum(i_k * strides[k])`.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorView {
    /// The buffer viewed.
    pub buffer: BufferId,
    /// The element offset of element 0.
    pub offset: usize,
    /// The view's shape.
    pub shape: Vec<usize>,
    /// The element stride of each dim.
    pub strides: Vec<usize>,
}

/// The attention template's call ([`ExternCall::Attention`]): `out[b] = softmax(scale * q[b] @
/// k[b]^T (causal: -inf where col > row) (+ mask[b])) @ v[b]` for every batch index, as one
/// call that never materializes the `[*batch, l, s]` scores. `q` is `[*batch, l, d]`, `k` and
/// `v` `[*batch, s, d]`, each a strided view of its buffer (attention heads are views of one
/// QKV projection, never copied); `out` says where element `(b, row, col)` of the
/// `[*batch, l, d]` result lands in the node's output buffer (`out.buffer` is that buffer):
/// row-major, or the layout of a following permute that keeps the last dim (so a
/// `transpose(1, 2)` of the heads costs no copy). Scores and the softmax are computed in f32
/// (f64 for f64) and the result is rounded once. `causal` is top-left aligned, as PyTorch's
/// `is_causal`: query row `i` sees keys `j <= i`.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionCall {
    /// The queries, `[*batch, l, d]`.
    pub q: StridedOperand,
    /// The keys, `[*batch, s, d]`.
    pub k: StridedOperand,
    /// The values, `[*batch, s, d]`.
    pub v: StridedOperand,
    /// Where element `(b, row, col)` of the result lands in the node's output buffer.
    pub out: StridedOperand,
    /// A second buffer the call writes, when an attention backward needs it: the row
    /// logsumexp of the scaled (masked) scores, natural log, `[*batch, l]` row-major, f32 (f64
    /// for f64 operands).
    pub lse: Option<BufferId>,
    /// Batch dims of q, k, v and the result.
    pub batch: Vec<Expr>,
    /// Query rows.
    pub l: Expr,
    /// Keys (and values).
    pub s: Expr,
    /// Head dim of q, k and v.
    pub d: Expr,
    /// Query row `i` sees keys `j <= i` only.
    pub causal: bool,
    /// The factor on `q . k` (`1 / sqrt(d)` unless given).
    pub scale: f64,
    /// An explicit mask: element `(b, row, key)` of the `[*batch, l, s]` mask as a view of its
    /// buffer (broadcast dims have stride 0; its column stride is the key's). A bool mask keeps
    /// the keys where it is true (the others score `-inf`), a mask of the operands' dtype is
    /// added to the scaled scores. A row that keeps no key gives 0 (and logsumexp `-inf`), as
    /// PyTorch's SDPA.
    pub mask: Option<StridedOperand>,
    /// A mask given by its rule instead of its elements (see [`MaskRule`]): nothing of the
    /// `[*batch, l, s]` mask is read or computed. Never with `causal` or `mask`.
    pub mask_rule: Option<MaskRule>,
    /// Dropout on the probabilities ([`crate::op::AttentionDropout`]: its keep decision of
    /// element `(b, row, key)` is `Dropout`'s of flat index `(b * l + row) * s + key`, `b`
    /// row-major over `batch`). The stream's [`crate::RandomState`] is a run-time argument of
    /// the call, never part of it.
    pub dropout: Option<crate::op::AttentionDropout>,
}

/// A structured attention mask ([`AttentionCall::mask_rule`]): query row `r` keeps key `j`
/// iff `j <= offset + constant + (r mod period)` (`r` itself without a period; `offset` 0
/// without a buffer), the same for every batch index. PyTorch's `is_causal` is
/// `constant = 0` without offset or period; a decode step or prefill at cache position `pos`
/// is `offset = pos`, with `period = T` when the `rep` query heads that share a key/value
/// head are `rep * T` rows of one matrix.
///
/// ```
/// use coil_ir::loops::{BufferId, MaskRule};
/// let rule = MaskRule { offset: Some(BufferId(3)), constant: 0, period: Some(512) };
/// assert!(rule.keeps(Some(100), 513, 101) && !rule.keeps(Some(100), 513, 102));
/// assert_eq!(rule.to_string(), "key<=offset+row%512");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MaskRule {
    /// A 0-d i64 buffer added to `constant`, read when the call runs (a CUDA graph replay
    /// reads the value of its run); the call's last input buffer.
    pub offset: Option<BufferId>,
    /// Added to the offset.
    pub constant: i64,
    /// The row term is `r mod period` (`Some(p)`, `p >= 1`; 1: no row term), else `r`.
    pub period: Option<usize>,
}

impl MaskRule {
    /// The last key row `r` keeps (negative: none), `offset` the offset buffer's value.
    pub fn diagonal(&self, offset: Option<i64>, r: usize) -> i64 {
        let row = match self.period {
            Some(p) => r % p,
            None => r,
        } as i64;
        offset.unwrap_or(0).saturating_add(self.constant).saturating_add(row)
    }

    /// Whether row `r` keeps key `j`, `offset` the offset buffer's value.
    pub fn keeps(&self, offset: Option<i64>, r: usize, j: usize) -> bool {
        (j as i64) <= self.diagonal(offset, r)
    }
}

impl fmt::Display for MaskRule {
    /// `key<=offset+row%12`, `key<=offset-1+row`, `key<=3+row%1`, `key<=0+row` (causal): the
    /// offset buffer (when there is one), the constant (nonzero, or without an offset buffer),
    /// the row term.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key<=")?;
        match (self.offset.is_some(), self.constant) {
            (true, 0) => write!(f, "offset")?,
            (true, c) if c > 0 => write!(f, "offset+{c}")?,
            (true, c) => write!(f, "offset{c}")?,
            (false, c) => write!(f, "{c}")?,
        }
        match self.period {
            Some(p) => write!(f, "+row%{p}"),
            None => write!(f, "+row"),
        }
    }
}

/// The attention backward template's call ([`ExternCall::AttentionBackward`]): the gradients of
/// [`ExternCall::Attention`] with respect to q, k and v, the probabilities recomputed from the
/// saved logsumexp and never stored. With `delta = sum(grad_out * out, -1)` (computed by the
/// call itself), `P = exp(scale * q k^T (+ mask) - lse)` (0 where masked, causally or by the
/// mask, and in a row that keeps no key, whose `lse` is `-inf`) and
/// `dS = P * (grad_out v^T - delta)`: `dq = scale * dS k`, `dk = scale * dS^T q`,
/// `dv = P^T grad_out`, accumulated in f32 (f64 for f64) and rounded once. `q`, `k`, `v`,
/// `grad_out` and `out` (`[*batch, l, d]`) are strided views of their buffers; `lse` is a
/// `[*batch, l]` row-major buffer of the statistics' dtype (f32, f64 for f64). Each wanted gradient is written through its operand (`dq`
/// `[*batch, l, d]`, `dk` and `dv` `[*batch, s, d]`); at least one is, and the node's output
/// buffer is the first of them.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionBackwardCall {
    /// The queries, `[*batch, l, d]`.
    pub q: StridedOperand,
    /// The keys, `[*batch, s, d]`.
    pub k: StridedOperand,
    /// The values, `[*batch, s, d]`.
    pub v: StridedOperand,
    /// The gradient of the attention's output, `[*batch, l, d]`.
    pub grad_out: StridedOperand,
    /// The forward's row logsumexp, `[*batch, l]`.
    pub lse: BufferId,
    /// The attention's output, `[*batch, l, d]` (delta is `sum(grad_out * out, -1)`).
    pub out: StridedOperand,
    /// Where the queries' gradient goes, when wanted.
    pub dq: Option<StridedOperand>,
    /// Where the keys' gradient goes, when wanted.
    pub dk: Option<StridedOperand>,
    /// Where the values' gradient goes, when wanted.
    pub dv: Option<StridedOperand>,
    /// Batch dims of every operand.
    pub batch: Vec<Expr>,
    /// Query rows.
    pub l: Expr,
    /// Keys (and values).
    pub s: Expr,
    /// Head dim of q, k and v.
    pub d: Expr,
    /// Query row `i` sees keys `j <= i` only.
    pub causal: bool,
    /// The factor on `q . k`.
    pub scale: f64,
    /// The forward's explicit mask, as [`AttentionCall::mask`]: element `(b, row, key)` of the
    /// `[*batch, l, s]` mask as a view of its buffer (broadcast dims stride 0); bool (true
    /// keeps the key) or of the operands' dtype (added to the scaled scores).
    pub mask: Option<StridedOperand>,
    /// The forward's dropout ([`AttentionCall::dropout`]): the same keep decisions,
    /// regenerated from the run's random stream.
    pub dropout: Option<crate::op::AttentionDropout>,
}

impl AttentionBackwardCall {
    /// The wanted gradients' views, in q, k, v order.
    pub fn grads(&self) -> [&Option<StridedOperand>; 3] {
        [&self.dq, &self.dk, &self.dv]
    }
}

impl ExternCall {
    /// The dropout of an attention call (forward or backward), if it has one: the call draws
    /// from its stream.
    pub fn dropout(&self) -> Option<crate::op::AttentionDropout> {
        match self {
            ExternCall::Attention(call) => call.dropout,
            ExternCall::AttentionBackward(call) => call.dropout,
            _ => None,
        }
    }

    /// What the printers call it: `bmm`, `attention`, `attention_backward`, `fallback`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            ExternCall::Bmm { .. } => "bmm",
            ExternCall::Attention(_) => "attention",
            ExternCall::AttentionBackward(_) => "attention_backward",
            ExternCall::Fallback { .. } => "fallback",
            ExternCall::Conv(_) => "convolution",
        }
    }

    /// The buffers the call names as written (the attention templates': the output and the
    /// logsumexp, or the gradients), in the call's order, each once (gradients may share a
    /// buffer: views of disjoint elements of the sum that concatenates them); for a product,
    /// its saved activation input (its output, which it does not name, comes first in
    /// [`LoopNode::writes`]); empty for calls that write only their node's output (fallback).
    pub fn written(&self) -> Vec<BufferId> {
        match self {
            ExternCall::Bmm { saved, .. } => saved.iter().copied().collect(),
            ExternCall::Attention(call) => std::iter::once(call.out.buffer).chain(call.lse).collect(),
            ExternCall::AttentionBackward(call) => {
                let mut out: Vec<BufferId> = Vec::new();
                for g in call.grads().into_iter().flatten() {
                    if !out.contains(&g.buffer) {
                        out.push(g.buffer);
                    }
                }
                out
            }
            ExternCall::Fallback { .. } | ExternCall::Conv(_) => vec![],
        }
    }

    /// Whether the call names its node's output among [`ExternCall::written`] (first).
    pub fn names_output(&self) -> bool {
        matches!(self, ExternCall::Attention(_) | ExternCall::AttentionBackward(_))
    }
}

/// A pointwise function an [`ExternCall::Bmm`] applies to its result inside the call, after the
/// bias (an epilogue, as cuBLASLt's `CUBLASLT_EPILOGUE_GELU_BIAS`).
///
/// It is computed in f32 on the f32 value of the product plus the bias (in f64 for an f64
/// product), and the result rounded once to the output dtype. For f16 / bf16 outputs that
/// differs from the unfused graph (which rounds the product plus bias to the output dtype before
/// the activation reads it back) by at most the output dtype's rounding; lowering folds an
/// activation only into f32, f16 and bf16 products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// gelu with the tanh approximation (PyTorch's `gelu(x, approximate='tanh')`):
    /// `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`.
    GeluTanh,
}

impl Activation {
    /// The name the printer shows (`bmm +bias +gelu_tanh`).
    pub fn name(self) -> &'static str {
        match self {
            Activation::GeluTanh => "gelu_tanh",
        }
    }

    /// The activation at one value, in f32, with the operations in the order of the primitive
    /// graph `gelu(x, tanh=True)` decomposes to (so a CPU result matches the unfused kernel's):
    /// `(x * 0.5) * (tanh((x + ((x * x) * x) * 0.044715) * sqrt(2 / pi)) + 1)`.
    pub fn apply_f32(self, x: f32) -> f32 {
        match self {
            Activation::GeluTanh => {
                let cubic = x * x * x * 0.044715f64 as f32;
                let scaled = (x + cubic) * (std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2) as f32;
                (x * 0.5f32) * (scaled.tanh() + 1.0f32)
            }
        }
    }

    /// [`Activation::apply_f32`] in f64.
    pub fn apply_f64(self, x: f64) -> f64 {
        match self {
            Activation::GeluTanh => {
                let scaled =
                    (x + x * x * x * 0.044715) * (std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2);
                (x * 0.5) * (scaled.tanh() + 1.0)
            }
        }
    }

    /// The activation's derivative at one value, in f32: for gelu_tanh, with
    /// `t = tanh(c * (x + 0.044715 x^3))`, `c = sqrt(2 / pi)`,
    /// `0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2)`.
    ///
    /// ```
    /// use coil_ir::loops::Activation;
    /// let (x, h) = (0.7f32, 1e-3f32);
    /// let numeric = (Activation::GeluTanh.apply_f32(x + h) - Activation::GeluTanh.apply_f32(x - h)) / (2.0 * h);
    /// assert!((Activation::GeluTanh.grad_f32(x) - numeric).abs() < 1e-3);
    /// ```
    pub fn grad_f32(self, x: f32) -> f32 {
        match self {
            Activation::GeluTanh => {
                let c = (std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2) as f32;
                let k = 0.044715f64 as f32;
                let t = ((x + x * x * x * k) * c).tanh();
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * k * x * x)
            }
        }
    }

    /// [`Activation::grad_f32`] in f64.
    pub fn grad_f64(self, x: f64) -> f64 {
        match self {
            Activation::GeluTanh => {
                let c = std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;
                let t = ((x + x * x * x * 0.044715) * c).tanh();
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x)
            }
        }
    }
}

/// The gradient of an [`Activation`] an [`ExternCall::Bmm`] applies to its product: the
/// backward of `act(y)` multiplies the incoming gradient (the product) by `act'(y)`, read from
/// `aux`, the saved input `y`, so that neither the product nor the derivative is stored.
///
/// `aux` is a contiguous buffer of the output's shape and dtype (`[*batch, m, n]`, row-major).
/// The derivative is computed in f32 (f64 for f64) on the unrounded product and the result
/// rounded once to the output dtype ([`Activation::grad_f32`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ActivationGrad {
    /// The activation whose derivative multiplies the product.
    pub activation: Activation,
    /// The activation's input, as saved by the forward pass.
    pub aux: BufferId,
}

/// A matrix operand given as a strided view of a buffer, in elements. In the loop IR the
/// numbers are expressions of the size symbols (`S = Expr`); a backend runs an instantiated
/// program, where they are constants, and reads them as `StridedOperand<usize>`
/// ([`StridedOperand::to_usize`]).
#[derive(Clone, Debug, PartialEq)]
pub struct StridedOperand<S = Expr> {
    /// The buffer viewed.
    pub buffer: BufferId,
    /// The element offset of element `(0, .., 0)`.
    pub offset: S,
    /// One stride per batch dim (0 for a broadcast batch dim).
    pub batch_strides: Vec<S>,
    /// Elements between rows.
    pub row_stride: S,
    /// Elements between columns.
    pub col_stride: S,
}

/// A bias row: column `j` of every output row gets `buffer[offset + stride * j]` added.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BiasOperand<S = Expr> {
    /// The buffer read.
    pub buffer: BufferId,
    /// The element offset of column 0.
    pub offset: S,
    /// Elements between columns.
    pub stride: S,
}

/// A constant, non-negative expression as a `usize` (`None` when symbolic).
pub fn const_usize(e: &Expr) -> Option<usize> {
    e.const_value().and_then(|v| usize::try_from(v).ok())
}

impl StridedOperand {
    /// The operand of an instantiated program (all numbers constant).
    pub fn to_usize(&self) -> Option<StridedOperand<usize>> {
        Some(StridedOperand {
            buffer: self.buffer,
            offset: const_usize(&self.offset)?,
            batch_strides: self.batch_strides.iter().map(const_usize).collect::<Option<_>>()?,
            row_stride: const_usize(&self.row_stride)?,
            col_stride: const_usize(&self.col_stride)?,
        })
    }

    fn map(&self, f: &impl Fn(Expr) -> Expr) -> StridedOperand {
        StridedOperand {
            buffer: self.buffer,
            offset: f(self.offset),
            batch_strides: self.batch_strides.iter().map(|&e| f(e)).collect(),
            row_stride: f(self.row_stride),
            col_stride: f(self.col_stride),
        }
    }
}

impl BiasOperand {
    /// The bias of an instantiated program (all numbers constant).
    pub fn to_usize(&self) -> Option<BiasOperand<usize>> {
        Some(BiasOperand {
            buffer: self.buffer,
            offset: const_usize(&self.offset)?,
            stride: const_usize(&self.stride)?,
        })
    }
}

/// Where a pointwise node that scatters stores (the `scatter` of [`LoopKind::Pointwise`]): the
/// output holds `base`'s elements, except for a window of `size` consecutive positions along
/// one dim, from the run-time position `offset` on, where element `x` of the node's ranges is
/// written at `index(x) + stride * offset`. `offset`, an integer body value the same for every
/// element (lowering makes one only where it is: a KV cache written at `pos..pos + T`, XLA's
/// `dynamic_update_slice`), is checked once: the window must lie in the dim, `0 <= offset` and
/// `offset + size <= bound`. Outside, generated code stores nothing and reports the scatter's
/// index error (status code 1) at the first position out of range in the index's element
/// order (`offset` when negative, else `max(offset, bound)`), as the interpreter names it; so
/// the output is the base unchanged, never partly written (PyTorch's `index_copy_` raises
/// before it writes).
///
/// The node's body never loads `base`: before the kernel runs, the runtime copies `base` into
/// the output unless the output *is* `base`'s storage (donated, or written in place over a
/// temporary that dies there), as the fallback scatter does.
///
/// ```
/// use coil_ir::loops::{BufferId, ScatterStore, ValueId};
/// use coil_ir::sym::Expr;
/// // a [1, 1, 3, 4] source into a [1, 1, 16, 4] cache at positions pos..pos + 3 (v1 = pos)
/// let x = |i: usize, n: i64| Expr::index_upto(&format!("x{i}"), Expr::int(n));
/// let index = x(2, 3) * 4 + x(3, 4);
/// let store = ScatterStore { base: BufferId(0), index, offset: ValueId(1), stride: Expr::int(4), size: Expr::int(3), bound: Expr::int(16) };
/// assert_eq!(store.last_offset(), Expr::int(13));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ScatterStore {
    /// The buffer whose elements the output keeps where the node does not write.
    pub base: BufferId,
    /// Where element `x` goes in a window at offset 0 (over the node's range variables).
    pub index: Expr,
    /// The integer body value, the same for every element, of the window's first position.
    pub offset: ValueId,
    /// Elements between consecutive positions of the dim.
    pub stride: Expr,
    /// Positions the window spans (the index's extent along the dim).
    pub size: Expr,
    /// The dim's size.
    pub bound: Expr,
}

impl ScatterStore {
    /// The largest valid offset, `bound - size` (negative when the window cannot fit).
    pub fn last_offset(&self) -> Expr {
        self.bound - self.size
    }
}

/// What a loop node computes.
#[derive(Clone, Debug, PartialEq)]
pub enum LoopKind {
    /// `output[x] = body(x)` for every index `x` in `ranges`; with `scatter`, `output = base`
    /// but in the window [`ScatterStore`] says.
    Pointwise {
        /// The extents iterated, one range variable each (the output's, without `scatter`).
        ranges: Vec<Expr>,
        /// The value of one element.
        body: Body,
        /// Where the values go when the node scatters (else `output[flat(x)]`).
        scatter: Option<ScatterStore>,
    },
    /// `output[x] = reduce(op, body(x, r) for r in reduction_ranges)` for every `x` in `ranges`.
    Reduction {
        /// The output's extents.
        ranges: Vec<Expr>,
        /// The extents reduced over, one reduction variable each.
        reduction_ranges: Vec<Expr>,
        /// The reduction.
        op: ReduceOp,
        /// The value reduced, over range and reduction variables.
        body: Body,
    },
    /// A call coil does not generate a kernel for.
    Extern {
        /// The call.
        call: ExternCall,
        /// The buffers it reads.
        inputs: Vec<BufferId>,
    },
}

/// One node: computes `output` from earlier buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopNode {
    /// The buffer the node writes.
    pub output: BufferId,
    /// The primitive ops folded into this node, in graph order, without repeats (kernel names
    /// are made from them: `poi_fused_add_gelu_0`).
    pub origins: Vec<&'static str>,
    /// What the node computes.
    pub kind: LoopKind,
}

impl LoopNode {
    /// Every buffer the node writes: its `output`, then the other buffers its extern call
    /// writes ([`ExternCall::written`]: the attention templates write several).
    pub fn writes(&self) -> Vec<BufferId> {
        let mut out = vec![self.output];
        if let LoopKind::Extern { call, .. } = &self.kind {
            out.extend(call.written().into_iter().filter(|&b| b != self.output));
        }
        out
    }

    /// The buffers the node reads (a scatter's base among them, though its body never loads it).
    pub fn reads(&self) -> Vec<BufferId> {
        match &self.kind {
            LoopKind::Pointwise { body, scatter: Some(s), .. } => {
                let mut out = body.reads();
                if !out.contains(&s.base) {
                    out.push(s.base);
                }
                out
            }
            LoopKind::Pointwise { body, .. } | LoopKind::Reduction { body, .. } => body.reads(),
            LoopKind::Extern { inputs, .. } => inputs.clone(),
        }
    }

    /// Where the node scatters its values, if it does ([`ScatterStore`]).
    pub fn scatter(&self) -> Option<&ScatterStore> {
        match &self.kind {
            LoopKind::Pointwise { scatter, .. } => scatter.as_ref(),
            _ => None,
        }
    }

    /// The extents the node iterates (its output's, unless it scatters); empty for extern calls.
    pub fn ranges(&self) -> &[Expr] {
        match &self.kind {
            LoopKind::Pointwise { ranges, .. } | LoopKind::Reduction { ranges, .. } => ranges,
            LoopKind::Extern { .. } => &[],
        }
    }
}

/// The index variable of range `i` of a node: `x<i>` in `[0, extent)`.
pub fn range_var(i: usize, extent: &Expr) -> Expr {
    Expr::index_upto(&format!("x{i}"), *extent)
}

/// The index variable of reduction range `i`: `r<i>` in `[0, extent)`.
pub fn reduction_var(i: usize, extent: &Expr) -> Expr {
    Expr::index_upto(&format!("r{i}"), *extent)
}

/// A size symbol of a program with dynamic shapes: its value comes from dim `dim` of input
/// `input` at run time; `hint` is the value it was compiled at (for heuristics and dumps).
#[derive(Clone, Debug, PartialEq)]
pub struct SizeSymbol {
    /// The symbol (an [`Expr::size`]: at least 2).
    pub symbol: Expr,
    /// The graph input whose size it is.
    pub input: usize,
    /// The dim of that input.
    pub dim: usize,
    /// The value it was compiled at.
    pub hint: i64,
}

/// Values of a program's size symbols for one run.
pub type Bindings = IndexMap<Expr, i64>;

/// A lowered program: buffers, inputs, outputs and nodes in execution order.
///
/// With dynamic shapes, sizes and index expressions mention the [`SizeSymbol`]s; one run binds
/// them from its inputs ([`LoopProgram::bind`]) and the backends launch an
/// [`instantiated`](LoopProgram::instantiate) copy whose sizes are constants, passing the
/// symbols' values to the kernels, which were compiled once for every size.
///
/// Random numbers come from the run's random streams ([`LoopProgram::random_streams`]), each a
/// [`crate::RandomState`] passed to the kernels that draw from it, whatever the sizes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoopProgram {
    /// Size symbols, in order (empty for static shapes).
    pub symbols: Vec<SizeSymbol>,
    /// Every buffer, indexed by [`BufferId`].
    pub buffers: Vec<LoopBuffer>,
    /// Graph inputs, in order.
    pub inputs: Vec<BufferId>,
    /// Graph outputs, in order (an output may be an input buffer, and may repeat).
    pub outputs: Vec<BufferId>,
    /// The nodes, in execution order.
    pub nodes: Vec<LoopNode>,
    /// The user's ops whose data a kernel checks at run time, by the buffer of the node they
    /// were folded into: what a kernel's data error is reported as.
    pub data_checks: Vec<DataCheck>,
}

/// An op that checks its data at run time (an index within bounds, an integer divisor other
/// than zero), folded into the node writing `buffer`: a kernel's status `code` (1: index out
/// of bounds, 2: negative integer power, 3: integer division by zero) there is this op's
/// error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataCheck {
    /// The buffer of the node the op was folded into.
    pub buffer: BufferId,
    /// The status code the op reports (1, 2 or 3).
    pub code: i64,
    /// The op's name, as errors name it.
    pub op: &'static str,
    /// The dim an index check indexes (the error names it as the interpreter does).
    pub dim: Option<usize>,
    /// The captured graph's node the op comes from ([`crate::Node::origin`]).
    pub node: Option<usize>,
}

impl LoopProgram {
    /// The buffer `id`.
    pub fn buffer(&self, id: BufferId) -> &LoopBuffer {
        &self.buffers[id.0]
    }

    /// Index of the node writing `buffer`, if any (inputs have none).
    pub fn producer(&self, buffer: BufferId) -> Option<usize> {
        self.nodes.iter().position(|n| n.writes().contains(&buffer))
    }

    /// The symbols' values for inputs of these shapes; an error when a symbolic size is below
    /// 2 (sizes 0 and 1 are specialized) or an input's shape disagrees with its expressions.
    pub fn bind(&self, inputs: &[&[usize]]) -> Result<Bindings, String> {
        if inputs.len() != self.inputs.len() {
            return Err(format!("the compiled graph takes {} inputs, got {}", self.inputs.len(), inputs.len()));
        }
        let mut bindings = Bindings::new();
        for s in &self.symbols {
            let value =
                inputs[s.input].get(s.dim).copied().ok_or_else(|| format!("input {} has no dim {}", s.input, s.dim))?;
            if value < 2 {
                return Err(format!(
                    "{} = {value} (input {} dim {}): symbolic sizes are at least 2",
                    s.symbol, s.input, s.dim
                ));
            }
            bindings.insert(s.symbol, value as i64);
        }
        for (k, (&id, shape)) in self.inputs.iter().zip(inputs).enumerate() {
            let want = &self.buffer(id).shape;
            let ok = want.len() == shape.len()
                && want.iter().zip(shape.iter()).all(|(e, &n)| e.eval(&bindings) == Ok(n as i64));
            if !ok {
                let want: Vec<String> = want.iter().map(|e| e.to_string()).collect();
                return Err(format!("input {k}: expected shape [{}], got {shape:?}", want.join(", ")));
            }
        }
        Ok(bindings)
    }

    /// A copy with every size at `bindings` (buffer shapes and metas, ranges, extern calls):
    /// what a backend launches. Bodies keep their symbols: kernels take the sizes as arguments.
    pub fn instantiate(&self, bindings: &Bindings) -> LoopProgram {
        let at = |e: Expr| e.substitute_with(|s| bindings.get(&s).map(|&v| Expr::int(v)));
        let mut p = self.clone();
        p.symbols.clear();
        for b in &mut p.buffers {
            b.shape = b.shape.iter().map(|&e| at(e)).collect();
            b.meta.shape = b.shape.iter().map(|e| const_usize(e).expect("every size symbol bound")).collect();
        }
        for n in &mut p.nodes {
            match &mut n.kind {
                // A scatter's index, stride and bound stay in the body's terms, as an indirect
                // load's do: the kernel takes the symbols.
                LoopKind::Pointwise { ranges, .. } => ranges.iter_mut().for_each(|e| *e = at(*e)),
                LoopKind::Reduction { ranges, reduction_ranges, .. } => {
                    ranges.iter_mut().chain(reduction_ranges.iter_mut()).for_each(|e| *e = at(*e))
                }
                // The activation (not a size) is carried over by the clone.
                LoopKind::Extern { call: ExternCall::Bmm { a, b, bias, batch, m, n, k, .. }, .. } => {
                    (*a, *b) = (a.map(&at), b.map(&at));
                    if let Some(bias) = bias {
                        (bias.offset, bias.stride) = (at(bias.offset), at(bias.stride));
                    }
                    batch.iter_mut().chain([m, n, k]).for_each(|e| *e = at(*e));
                }
                LoopKind::Extern { call: ExternCall::Attention(call), .. } => {
                    let AttentionCall { q, k, v, out, batch, l, s, d, mask, .. } = &mut **call;
                    (*q, *k, *v, *out) = (q.map(&at), k.map(&at), v.map(&at), out.map(&at));
                    if let Some(mask) = mask {
                        *mask = mask.map(&at);
                    }
                    batch.iter_mut().chain([l, s, d]).for_each(|e| *e = at(*e));
                }
                LoopKind::Extern { call: ExternCall::AttentionBackward(call), .. } => {
                    let AttentionBackwardCall { q, k, v, grad_out, out, dq, dk, dv, batch, l, s, d, mask, .. } =
                        &mut **call;
                    (*q, *k, *v, *grad_out, *out) =
                        (q.map(&at), k.map(&at), v.map(&at), grad_out.map(&at), out.map(&at));
                    for g in [dq, dk, dv, mask].into_iter().flatten() {
                        *g = g.map(&at);
                    }
                    batch.iter_mut().chain([l, s, d]).for_each(|e| *e = at(*e));
                }
                // Sizes of a convolution call are constants already.
                LoopKind::Extern { call: ExternCall::Fallback { .. } | ExternCall::Conv(_), .. } => {}
            }
        }
        p
    }

    /// How many random streams the program's bodies draw from (one more than the highest
    /// stream of a [`ScalarOp::Rand`]; 0 for none): a run passes at least that many
    /// [`crate::RandomState`]s.
    pub fn random_streams(&self) -> usize {
        let bodies = self.nodes.iter().filter_map(|n| match &n.kind {
            LoopKind::Pointwise { body, .. } | LoopKind::Reduction { body, .. } => Some(body),
            LoopKind::Extern { .. } => None,
        });
        let streams = bodies.flat_map(|b| &b.values).filter_map(|v| match v.op {
            ScalarOp::Rand { stream, .. } => Some(stream + 1),
            _ => None,
        });
        let calls = self.nodes.iter().filter_map(|n| match &n.kind {
            LoopKind::Extern { call, .. } => call.dropout().map(|d| d.stream + 1),
            _ => None,
        });
        streams.chain(calls).max().unwrap_or(0)
    }

    /// The hint value of every size symbol.
    pub fn hints(&self) -> Bindings {
        self.symbols.iter().map(|s| (s.symbol, s.hint)).collect()
    }
}
