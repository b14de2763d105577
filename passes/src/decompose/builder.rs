//! [`Builder`]: emits primitive nodes with broadcasting and type promotion made explicit.
//!
//! Every decomposition is written against this builder, the way PyTorch's `torch/_decomp`
//! functions are written against ATen ops. Binary helpers broadcast and promote like PyTorch
//! (a scalar [`Arg`] is weak), then insert the `Expand`s, `Cast`s and `Full`s that a primitive
//! graph spells out. Helpers skip no-ops (a cast to the same dtype, a reshape to the same shape,
//! a reduction over no dims) but simplify nothing else: that is the e-graph pass's job.

use coil_ir::infer::{self, broadcast_shapes, reduced_shape, Operand};
use coil_ir::{
    BinaryOp, DType, Error, Graph, NodeId, Op, RandDist, ReduceOp, Result, Scalar, Shape, TensorMeta, UnaryOp,
};
use std::panic::Location;

/// An operand of a builder helper: a node of the graph being built, or a Rust scalar.
///
/// Scalars are *weak* in type promotion (`f16_tensor * 0.5` stays f16) and are materialized as
/// [`Op::Full`] leaves of the promoted dtype and the result's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A node of the graph under construction.
    Node(NodeId),
    /// A Rust scalar (PyTorch's "wrapped number").
    Scalar(Scalar),
}

impl From<NodeId> for Arg {
    fn from(x: NodeId) -> Arg {
        Arg::Node(x)
    }
}

impl From<Scalar> for Arg {
    fn from(s: Scalar) -> Arg {
        Arg::Scalar(s)
    }
}

impl From<f64> for Arg {
    fn from(x: f64) -> Arg {
        Arg::Scalar(Scalar::Float(x))
    }
}

impl From<i64> for Arg {
    fn from(x: i64) -> Arg {
        Arg::Scalar(Scalar::Int(x))
    }
}

impl From<bool> for Arg {
    fn from(x: bool) -> Arg {
        Arg::Scalar(Scalar::Bool(x))
    }
}

/// `value` as the natural scalar kind of `dtype` (`Float` for floats, `Int` for integers,
/// `Bool` for bool), converted the way a cast converts it.
pub fn scalar_as(value: Scalar, dtype: DType) -> Scalar {
    match dtype {
        DType::Bool => Scalar::Bool(value.as_f64() != 0.0),
        t if t.is_float() => Scalar::Float(value.as_f64()),
        _ => Scalar::Int(value.as_i64()),
    }
}

/// Zero in the scalar kind of `dtype`; weak, so it never changes the dtype it meets.
pub fn zero(dtype: DType) -> Scalar {
    scalar_as(Scalar::Int(0), dtype)
}

/// f16 and bf16 compute in f32 inside composite ops (PyTorch's CPU kernels round once).
pub fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        t => t,
    }
}

/// Emits nodes into a graph, each stamped with the user's source line.
pub struct Builder<'g> {
    graph: &'g mut Graph,
    /// The source line every emitted node inherits (the captured node being decomposed).
    pub location: Option<&'static Location<'static>>,
    /// Emit `detach` nodes ([`Builder::detach`]) rather than the identity.
    pub keep_detach: bool,
    /// Attention's matrix products of f16/bf16 operands in their dtype
    /// ([`super::DecomposeOptions::half_products`]).
    pub half_products: bool,
}

impl<'g> Builder<'g> {
    /// A builder appending to `graph`.
    pub fn new(graph: &'g mut Graph, location: Option<&'static Location<'static>>) -> Builder<'g> {
        Builder { graph, location, keep_detach: false, half_products: false }
    }

    /// The graph built so far.
    pub fn graph(&self) -> &Graph {
        self.graph
    }

    /// Shape and dtype of a node.
    pub fn meta(&self, x: NodeId) -> &TensorMeta {
        self.graph.meta(x)
    }

    /// Shape of a node.
    pub fn shape(&self, x: NodeId) -> Shape {
        self.graph.meta(x).shape.clone()
    }

    /// Dtype of a node.
    pub fn dtype(&self, x: NodeId) -> DType {
        self.graph.meta(x).dtype
    }

    /// Rank of a node.
    pub fn rank(&self, x: NodeId) -> usize {
        self.graph.meta(x).rank()
    }

    /// Appends `op` applied to `inputs` as is (its meta inferred), at the current location.
    pub fn push(&mut self, op: Op, inputs: &[NodeId]) -> Result<NodeId> {
        self.graph.push(op, inputs, self.location)
    }

    /// Appends a leaf with the given meta.
    pub fn leaf(&mut self, op: Op, meta: TensorMeta) -> NodeId {
        self.graph.leaf(op, meta, self.location)
    }

    /// A constant tensor; the value is stored in the scalar kind of `dtype`.
    pub fn full(&mut self, value: impl Into<Scalar>, shape: &[usize], dtype: DType) -> NodeId {
        let value = scalar_as(value.into(), dtype);
        self.graph.full(value, shape.to_vec(), dtype, self.location)
    }

    /// A constant with the shape and dtype of `x`.
    pub fn full_like(&mut self, value: impl Into<Scalar>, x: NodeId) -> NodeId {
        let m = self.meta(x).clone();
        self.full(value, &m.shape, m.dtype)
    }

    /// i64 tensor of `shape` holding each element's index along `dim`.
    pub fn iota(&mut self, shape: &[usize], dim: usize) -> NodeId {
        self.leaf(Op::Iota { dim }, TensorMeta::new(shape.to_vec(), DType::I64))
    }

    /// Counter-based random numbers of `shape` and `dtype` from random stream `stream`, at
    /// `offset` from its start.
    pub fn rand(&mut self, dist: RandDist, stream: usize, offset: u64, shape: &[usize], dtype: DType) -> NodeId {
        self.leaf(Op::Rand { dist, stream, offset }, TensorMeta::new(shape.to_vec(), dtype))
    }

    /// `arg` as a node: a scalar becomes a 0-d `Full` of its own dtype.
    pub fn tensor(&mut self, arg: impl Into<Arg>) -> NodeId {
        match arg.into() {
            Arg::Node(x) => x,
            Arg::Scalar(s) => self.full(s, &[], s.dtype()),
        }
    }

    // ---- casts and views ----

    /// Converts `x` to `dtype`; no node when it already has it.
    pub fn cast(&mut self, x: NodeId, dtype: DType) -> Result<NodeId> {
        if self.dtype(x) == dtype {
            return Ok(x);
        }
        self.push(Op::Cast(dtype), &[x])
    }

    /// `x` cut off from gradients: a `detach` node when the builder keeps them, else `x`.
    pub fn detach(&mut self, x: NodeId) -> Result<NodeId> {
        if self.keep_detach {
            self.push(Op::Detach, &[x])
        } else {
            Ok(x)
        }
    }

    /// Casts f16/bf16 to f32 (see [`compute_dtype`]); other dtypes are left alone.
    pub fn upcast(&mut self, x: NodeId) -> Result<NodeId> {
        let t = compute_dtype(self.dtype(x));
        self.cast(x, t)
    }

    /// Reshapes `x`; no node when the shape is unchanged.
    pub fn reshape(&mut self, x: NodeId, shape: &[usize]) -> Result<NodeId> {
        if self.meta(x).shape == shape {
            return Ok(x);
        }
        self.push(Op::Reshape { shape: shape.to_vec() }, &[x])
    }

    /// Permutes the dims of `x`; no node for the identity permutation.
    pub fn permute(&mut self, x: NodeId, perm: &[usize]) -> Result<NodeId> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) && perm.len() == self.rank(x) {
            return Ok(x);
        }
        self.push(Op::Permute { perm: perm.to_vec() }, &[x])
    }

    /// Swaps dims `a` and `b`.
    pub fn transpose(&mut self, x: NodeId, a: usize, b: usize) -> Result<NodeId> {
        let mut perm: Vec<usize> = (0..self.rank(x)).collect();
        perm.swap(a, b);
        self.permute(x, &perm)
    }

    /// `Expand`s `x` to `shape` (leading dims added, size-1 dims stretched); no node when the
    /// shape is unchanged.
    pub fn expand(&mut self, x: NodeId, shape: &[usize]) -> Result<NodeId> {
        if self.meta(x).shape == shape {
            return Ok(x);
        }
        self.push(Op::Expand { shape: shape.to_vec() }, &[x])
    }

    /// Right-aligned broadcast of `x` to `shape` (PyTorch's rule). One `Expand` does it, since
    /// `Expand` adds leading dims itself.
    pub fn broadcast_to(&mut self, x: NodeId, shape: &[usize]) -> Result<NodeId> {
        self.expand(x, shape)
    }

    /// Inserts a dim of size 1 at `dim`.
    pub fn unsqueeze(&mut self, x: NodeId, dim: usize) -> Result<NodeId> {
        let mut shape = self.shape(x);
        shape.insert(dim, 1);
        self.reshape(x, &shape)
    }

    /// Removes the size-1 dim `dim`.
    pub fn squeeze(&mut self, x: NodeId, dim: usize) -> Result<NodeId> {
        let mut shape = self.shape(x);
        debug_assert_eq!(shape[dim], 1, "squeeze of a dim of size {}", shape[dim]);
        shape.remove(dim);
        self.reshape(x, &shape)
    }

    /// `arg` as a node of exactly `shape` and `dtype`: a scalar becomes a `Full` of that shape;
    /// a node is cast (first, while it is small) and then expanded.
    pub fn materialize(&mut self, arg: impl Into<Arg>, shape: &[usize], dtype: DType) -> Result<NodeId> {
        match arg.into() {
            Arg::Scalar(s) => Ok(self.full(s, shape, dtype)),
            Arg::Node(x) => {
                let x = self.cast(x, dtype)?;
                self.broadcast_to(x, shape)
            }
        }
    }

    // ---- pointwise math ----

    fn operand_meta(&self, arg: Arg) -> (TensorMeta, bool) {
        match arg {
            Arg::Node(x) => (self.meta(x).clone(), false),
            Arg::Scalar(s) => (TensorMeta::new(vec![], s.dtype()), true),
        }
    }

    /// Names the op and the operands, and the user's line, in an error raised here.
    fn op_error(&self, e: Error, name: &str, args: &[Arg]) -> Error {
        let described = args.iter().map(|&a| self.operand_meta(a).0.to_string()).collect();
        let e = e.in_op(name, described);
        match self.location {
            Some(l) => e.at(l),
            None => e,
        }
    }

    /// The common shape and promoted dtype of `args` (`torch.result_type`, scalars weak).
    pub fn promote(&self, args: &[Arg]) -> Result<(Shape, DType)> {
        let metas: Vec<(TensorMeta, bool)> = args.iter().map(|&a| self.operand_meta(a)).collect();
        let mut shape = Shape::new();
        for (m, _) in &metas {
            shape = broadcast_shapes(&shape, &m.shape)?;
        }
        let operands: Vec<Operand> = metas.iter().map(|(meta, scalar)| Operand { meta, scalar: *scalar }).collect();
        Ok((shape, infer::promote(&operands)))
    }

    /// A unary op; float-only ops on integers compute in the default float.
    pub fn unary(&mut self, op: UnaryOp, x: impl Into<Arg>) -> Result<NodeId> {
        let x = self.tensor(x);
        let x = if op.float_only() { self.cast(x, self.dtype(x).to_float())? } else { x };
        self.push(Op::Unary(op), &[x])
    }

    /// A binary op with broadcasting and promotion made explicit. Comparisons compute in the
    /// promoted dtype; true division of integers computes in the default float.
    pub fn binary(&mut self, op: BinaryOp, a: impl Into<Arg>, b: impl Into<Arg>) -> Result<NodeId> {
        let args = [a.into(), b.into()];
        let (shape, common) = self.promote(&args).map_err(|e| self.op_error(e, op.name(), &args))?;
        let dtype = if op.float_only() { common.to_float() } else { common };
        let a = self.materialize(args[0], &shape, dtype)?;
        let b = self.materialize(args[1], &shape, dtype)?;
        self.push(Op::Binary(op), &[a, b])
    }

    /// `where(cond, x, y)`: broadcasts all three, promotes `x` and `y`.
    pub fn where_(&mut self, cond: NodeId, x: impl Into<Arg>, y: impl Into<Arg>) -> Result<NodeId> {
        let args = [Arg::Node(cond), x.into(), y.into()];
        let (shape, _) = self.promote(&args).map_err(|e| self.op_error(e, "where", &args))?;
        let (_, dtype) = self.promote(&args[1..]).map_err(|e| self.op_error(e, "where", &args))?;
        let c = self.broadcast_to(cond, &shape)?;
        let x = self.materialize(args[1], &shape, dtype)?;
        let y = self.materialize(args[2], &shape, dtype)?;
        self.push(Op::Where, &[c, x, y])
    }

    /// `exp(x)`.
    pub fn exp(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Exp, x)
    }

    /// `log(x)`.
    pub fn log(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Log, x)
    }

    /// `sqrt(x)`.
    pub fn sqrt(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Sqrt, x)
    }

    /// `rsqrt(x)`.
    pub fn rsqrt(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Rsqrt, x)
    }

    /// `abs(x)`.
    pub fn abs(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Abs, x)
    }

    /// `-x`.
    pub fn neg(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Neg, x)
    }
}

/// Binary helpers: `b.add(x, y)`, `b.mul(x, 0.5)`, ... (see [`Builder::binary`]).
macro_rules! binary_helpers {
    ($($name:ident => $op:ident),* $(,)?) => {
        impl Builder<'_> {
            $(
                #[doc = concat!("`", stringify!($name), "(a, b)` with broadcasting and promotion.")]
                pub fn $name(&mut self, a: impl Into<Arg>, b: impl Into<Arg>) -> Result<NodeId> {
                    self.binary(BinaryOp::$op, a, b)
                }
            )*
        }
    };
}

binary_helpers! {
    add => Add, sub => Sub, mul => Mul, div => Div, pow => Pow,
    maximum => Maximum, minimum => Minimum,
    eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge,
}

impl Builder<'_> {
    // ---- reductions ----

    /// A reduction over `dims`. `Sum`/`Prod` of integers and bool cast to i64 first. A `Sum`,
    /// `Prod`, `Max` or `Min` over no dims is the identity and emits no reduction.
    pub fn reduce(&mut self, op: ReduceOp, x: NodeId, dims: &[usize], keepdim: bool) -> Result<NodeId> {
        let x = match op {
            ReduceOp::Sum | ReduceOp::Prod if self.dtype(x).is_integral() => self.cast(x, DType::I64)?,
            _ => x,
        };
        if dims.is_empty() && !op.is_arg() {
            return Ok(x);
        }
        self.push(Op::Reduce { op, dims: dims.to_vec(), keepdim }, &[x])
    }

    /// `sum(x, dims, keepdim)`.
    pub fn sum(&mut self, x: NodeId, dims: &[usize], keepdim: bool) -> Result<NodeId> {
        self.reduce(ReduceOp::Sum, x, dims, keepdim)
    }

    /// `amax(x, dims, keepdim)` (NaN propagates).
    pub fn amax(&mut self, x: NodeId, dims: &[usize], keepdim: bool) -> Result<NodeId> {
        self.reduce(ReduceOp::Max, x, dims, keepdim)
    }

    /// `amin(x, dims, keepdim)` (NaN propagates).
    pub fn amin(&mut self, x: NodeId, dims: &[usize], keepdim: bool) -> Result<NodeId> {
        self.reduce(ReduceOp::Min, x, dims, keepdim)
    }

    /// Number of elements the reduction over `dims` combines per output.
    pub fn reduced_numel(&self, x: NodeId, dims: &[usize]) -> usize {
        let shape = &self.meta(x).shape;
        dims.iter().map(|&d| shape[d]).product()
    }

    /// `sum(x, dims) / n` in x's dtype (callers upcast first where they need to).
    pub fn mean(&mut self, x: NodeId, dims: &[usize], keepdim: bool) -> Result<NodeId> {
        let n = self.reduced_numel(x, dims);
        let s = self.sum(x, dims, keepdim)?;
        self.div(s, n as f64)
    }

    /// Drops the reduced dims of a keepdim result (a reshape).
    pub fn drop_dims(&mut self, x: NodeId, dims: &[usize]) -> Result<NodeId> {
        let shape = reduced_shape(&self.shape(x), dims, false);
        self.reshape(x, &shape)
    }

    // ---- data movement and linear algebra ----

    /// `torch.gather(x, dim, index)`.
    pub fn gather(&mut self, x: NodeId, dim: usize, index: NodeId) -> Result<NodeId> {
        self.push(Op::Gather { dim }, &[x, index])
    }

    /// `torch.index_select(x, dim, index)` with a 1-D index.
    pub fn index_select(&mut self, x: NodeId, dim: usize, index: NodeId) -> Result<NodeId> {
        self.push(Op::IndexSelect { dim }, &[x, index])
    }

    /// `x` with `stride - 1` zeros between consecutive elements along `dim` (length
    /// `(len - 1) * stride + 1`): the adjoint of a slice with that step. Written as a pad of an
    /// added dim, merged and cut, so it lowers to index arithmetic (`i % stride == 0 ?
    /// x[i / stride] : 0`) inside whatever kernel reads it, not to a scatter.
    pub fn spread(&mut self, x: NodeId, dim: usize, stride: usize) -> Result<NodeId> {
        let mut shape = self.shape(x);
        let len = shape[dim];
        if stride == 1 || len <= 1 {
            return Ok(x);
        }
        let x = self.unsqueeze(x, dim + 1)?;
        let mut pads = vec![(0, 0); shape.len() + 1];
        pads[dim + 1] = (0, stride - 1);
        let x = self.push(Op::Pad { pads, value: 0.0.into() }, &[x])?;
        shape[dim] = len * stride;
        let x = self.reshape(x, &shape)?;
        self.push(Op::Slice { dim, start: 0, len: (len - 1) * stride + 1, step: 1 }, &[x])
    }

    /// `[..., m, k] @ [..., k, n]` with equal batch dims.
    pub fn bmm(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.push(Op::Bmm, &[a, b])
    }
}

/// Runs `f` on `x` upcast to [`compute_dtype`] and casts its result back to x's dtype: how
/// composite ops on f16/bf16 compute in f32 and round once.
pub fn upcast_and_back<'g>(
    b: &mut Builder<'g>,
    x: NodeId,
    f: impl FnOnce(&mut Builder<'g>, NodeId) -> Result<NodeId>,
) -> Result<NodeId> {
    let t = b.dtype(x);
    let x = b.upcast(x)?;
    let y = f(b, x)?;
    b.cast(y, t)
}
