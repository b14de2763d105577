//! The e-graph language: one e-node per primitive op, its attributes part of the node, its
//! operands the children; and the [`Facts`] analysis that gives every e-class its shape, dtype
//! and, where every element is the same known value, that constant.
//!
//! Leaves (`input`, `full`, `iota`, `rand`) carry their meta in the node, so two `full(0.0)`s of
//! different shapes are different nodes while two identical ones are one (hash-consing is CSE).
//! The meta of every other node is inferred by [`coil_ir::infer`], the function graphs use, so a
//! class's meta is exactly what the node would get in a [`Graph`](coil_ir::Graph).

use coil_ir::infer::{self, Operand};
use coil_ir::{BinaryOp, DType, Op, RandDist, ReduceOp, Result, Scalar, TensorMeta, UnaryOp};
use egg::{Analysis, DidMerge, EGraph, Id, Language};
use half::{bf16, f16};
use std::cmp::Ordering;

/// A coil enum without fields, given a total order by its declaration order so that e-nodes
/// can be sorted (egg needs `Ord`; the coil-ir enums only derive `Eq` and `Hash`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ordered<T>(pub T);

/// Position of a fieldless enum value in its declaration.
pub trait Code: Copy {
    /// The value's position in its enum's declaration.
    fn code(self) -> u8;
}

macro_rules! code {
    ($($t:ty),*) => {$(impl Code for $t { fn code(self) -> u8 { self as u8 } })*};
}
code!(UnaryOp, BinaryOp, ReduceOp, RandDist);

impl<T: Code + Eq> PartialOrd for Ordered<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: Code + Eq> Ord for Ordered<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.code().cmp(&other.0.code())
    }
}

/// A [`Scalar`] that can be hashed and ordered: floats by their bits (so NaN equals itself and
/// `-0.0` differs from `0.0`, which is what a constant's identity needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScalarKey {
    /// A bool.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float, by its bits.
    Float(u64),
}

impl ScalarKey {
    /// The key of a scalar.
    pub fn new(s: Scalar) -> ScalarKey {
        match s {
            Scalar::Bool(b) => ScalarKey::Bool(b),
            Scalar::Int(i) => ScalarKey::Int(i),
            Scalar::Float(x) => ScalarKey::Float(x.to_bits()),
        }
    }

    /// The scalar again.
    pub fn scalar(self) -> Scalar {
        match self {
            ScalarKey::Bool(b) => Scalar::Bool(b),
            ScalarKey::Int(i) => Scalar::Int(i),
            ScalarKey::Float(x) => Scalar::Float(f64::from_bits(x)),
        }
    }
}

/// The operation of an e-node: a primitive [`Op`] with its attributes (the variants and their
/// fields are those of [`Op`]), and for leaves the shape and dtype they are given.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Prim {
    /// A value computed outside the region in the e-graph (the graph's node `node`): a leaf
    /// that rules cannot look into.
    Opaque {
        /// The graph node the value comes from.
        node: usize,
        /// The value's shape.
        shape: Vec<usize>,
        /// The value's dtype.
        dtype: DType,
    },
    /// [`Op::Input`]: the graph's `index`-th input.
    Input {
        /// Which input of the graph.
        index: usize,
        /// The input's shape.
        shape: Vec<usize>,
        /// The input's dtype.
        dtype: DType,
    },
    /// [`Op::Full`]: a tensor filled with `value`.
    Full {
        /// The fill value.
        value: ScalarKey,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// The tensor's dtype.
        dtype: DType,
    },
    /// [`Op::Iota`]: the i64 index of each element along `dim`.
    Iota {
        /// The dim whose index each element holds.
        dim: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// [`Op::Rand`]: counter-based random numbers of stream `stream` at `offset`.
    Rand {
        /// The distribution drawn from.
        dist: Ordered<RandDist>,
        /// The graph's random stream drawn from.
        stream: usize,
        /// The counter offset of element 0 within the stream.
        offset: u64,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// The tensor's dtype.
        dtype: DType,
    },
    /// [`Op::Unary`]: one child.
    Unary(Ordered<UnaryOp>),
    /// [`Op::Binary`]: two children.
    Binary(Ordered<BinaryOp>),
    /// [`Op::Where`]: children `cond, x, y`.
    Where,
    /// [`Op::Cast`] to the dtype.
    Cast(DType),
    /// [`Op::Reduce`] over `dims`.
    Reduce {
        /// The reduction.
        op: Ordered<ReduceOp>,
        /// The dims reduced.
        dims: Vec<usize>,
        /// Whether reduced dims stay as size 1.
        keepdim: bool,
    },
    /// [`Op::Cumsum`] along `dim`.
    Cumsum {
        /// The dim scanned.
        dim: usize,
    },
    /// [`Op::Argsort`] along `dim`.
    Argsort {
        /// The dim sorted.
        dim: usize,
        /// Largest first when true.
        descending: bool,
    },
    /// [`Op::Reshape`] to `shape`.
    Reshape {
        /// The new shape.
        shape: Vec<usize>,
    },
    /// [`Op::Permute`] by `perm`.
    Permute {
        /// Output dim `i` is input dim `perm[i]`.
        perm: Vec<usize>,
    },
    /// [`Op::Expand`] (broadcast) to `shape`.
    Expand {
        /// The broadcast shape.
        shape: Vec<usize>,
    },
    /// [`Op::Slice`]: `len` elements `start, start+step, ...` along `dim`.
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
    /// [`Op::Pad`]: constant padding.
    Pad {
        /// `(before, after)` per dim.
        pads: Vec<(usize, usize)>,
        /// The padding value.
        value: ScalarKey,
    },
    /// [`Op::Cat`] of the children along `dim`.
    Cat {
        /// The dim concatenated along.
        dim: usize,
    },
    /// [`Op::Gather`]: children `x, index`.
    Gather {
        /// The dim indexed.
        dim: usize,
    },
    /// [`Op::IndexSelect`]: children `x, index` (1-D).
    IndexSelect {
        /// The dim indexed.
        dim: usize,
    },
    /// [`Op::Scatter`]: children `x, index, src`.
    Scatter {
        /// The dim indexed.
        dim: usize,
        /// How colliding writes combine; `None`: the last write wins.
        reduce: Option<Ordered<ReduceOp>>,
    },
    /// [`Op::Bmm`]: batched `[..., m, k] @ [..., k, n]`.
    Bmm,
}

impl Prim {
    /// The e-node operation of a primitive op; `meta` is the node's (used by leaves).
    /// `None` for composite ops, which never reach this pass.
    pub fn from_op(op: &Op, meta: &TensorMeta) -> Option<Prim> {
        let (shape, dtype) = (meta.shape.clone(), meta.dtype);
        Some(match op {
            Op::Input { index } => Prim::Input { index: *index, shape, dtype },
            Op::Full(v) => Prim::Full { value: ScalarKey::new(*v), shape, dtype },
            Op::Iota { dim } => Prim::Iota { dim: *dim, shape },
            Op::Rand { dist, stream, offset } => {
                Prim::Rand { dist: Ordered(*dist), stream: *stream, offset: *offset, shape, dtype }
            }
            Op::Unary(u) => Prim::Unary(Ordered(*u)),
            Op::Binary(b) => Prim::Binary(Ordered(*b)),
            Op::Where => Prim::Where,
            Op::Cast(t) => Prim::Cast(*t),
            Op::Reduce { op, dims, keepdim } => {
                Prim::Reduce { op: Ordered(*op), dims: dims.clone(), keepdim: *keepdim }
            }
            Op::Cumsum { dim } => Prim::Cumsum { dim: *dim },
            Op::Argsort { dim, descending } => Prim::Argsort { dim: *dim, descending: *descending },
            Op::Reshape { shape } => Prim::Reshape { shape: shape.clone() },
            Op::Permute { perm } => Prim::Permute { perm: perm.clone() },
            Op::Expand { shape } => Prim::Expand { shape: shape.clone() },
            Op::Slice { dim, start, len, step } => Prim::Slice { dim: *dim, start: *start, len: *len, step: *step },
            Op::Pad { pads, value } => Prim::Pad { pads: pads.clone(), value: ScalarKey::new(*value) },
            Op::Cat { dim } => Prim::Cat { dim: *dim },
            Op::Gather { dim } => Prim::Gather { dim: *dim },
            Op::IndexSelect { dim } => Prim::IndexSelect { dim: *dim },
            Op::Scatter { dim, reduce } => Prim::Scatter { dim: *dim, reduce: reduce.map(Ordered) },
            Op::Bmm => Prim::Bmm,
            _ => return None,
        })
    }

    /// The graph op, and for a leaf the meta it is created with. An [`Prim::Opaque`] value
    /// has no op of its own: it is the graph node it names, spliced back by the caller.
    pub fn to_op(&self) -> (Op, Option<TensorMeta>) {
        let leaf = |shape: &Vec<usize>, dtype: DType| Some(TensorMeta::new(shape.clone(), dtype));
        match self {
            Prim::Opaque { .. } => unreachable!("opaque values are spliced back, not rebuilt"),
            Prim::Input { index, shape, dtype } => (Op::Input { index: *index }, leaf(shape, *dtype)),
            Prim::Full { value, shape, dtype } => (Op::Full(value.scalar()), leaf(shape, *dtype)),
            Prim::Iota { dim, shape } => (Op::Iota { dim: *dim }, leaf(shape, DType::I64)),
            Prim::Rand { dist, stream, offset, shape, dtype } => {
                (Op::Rand { dist: dist.0, stream: *stream, offset: *offset }, leaf(shape, *dtype))
            }
            Prim::Unary(u) => (Op::Unary(u.0), None),
            Prim::Binary(b) => (Op::Binary(b.0), None),
            Prim::Where => (Op::Where, None),
            Prim::Cast(t) => (Op::Cast(*t), None),
            Prim::Reduce { op, dims, keepdim } => {
                (Op::Reduce { op: op.0, dims: dims.clone(), keepdim: *keepdim }, None)
            }
            Prim::Cumsum { dim } => (Op::Cumsum { dim: *dim }, None),
            Prim::Argsort { dim, descending } => (Op::Argsort { dim: *dim, descending: *descending }, None),
            Prim::Reshape { shape } => (Op::Reshape { shape: shape.clone() }, None),
            Prim::Permute { perm } => (Op::Permute { perm: perm.clone() }, None),
            Prim::Expand { shape } => (Op::Expand { shape: shape.clone() }, None),
            Prim::Slice { dim, start, len, step } => {
                (Op::Slice { dim: *dim, start: *start, len: *len, step: *step }, None)
            }
            Prim::Pad { pads, value } => (Op::Pad { pads: pads.clone(), value: value.scalar() }, None),
            Prim::Cat { dim } => (Op::Cat { dim: *dim }, None),
            Prim::Gather { dim } => (Op::Gather { dim: *dim }, None),
            Prim::IndexSelect { dim } => (Op::IndexSelect { dim: *dim }, None),
            Prim::Scatter { dim, reduce } => (Op::Scatter { dim: *dim, reduce: reduce.map(|r| r.0) }, None),
            Prim::Bmm => (Op::Bmm, None),
        }
    }

    /// The meta of a leaf (opaque values included), `None` for other ops.
    pub fn leaf_meta(&self) -> Option<TensorMeta> {
        match self {
            Prim::Opaque { shape, dtype, .. } => Some(TensorMeta::new(shape.clone(), *dtype)),
            _ => self.to_op().1,
        }
    }

    /// Leaves: no operands, meta given.
    pub fn is_leaf(&self) -> bool {
        matches!(
            self,
            Prim::Opaque { .. } | Prim::Input { .. } | Prim::Full { .. } | Prim::Iota { .. } | Prim::Rand { .. }
        )
    }

    /// Views: data seen through another index map (cost nothing until something reads them).
    pub fn is_view(&self) -> bool {
        matches!(self, Prim::Reshape { .. } | Prim::Permute { .. } | Prim::Expand { .. } | Prim::Slice { .. })
    }

    /// Pointwise ops (one output element from the operands' elements at its index).
    pub fn is_pointwise(&self) -> bool {
        matches!(self, Prim::Unary(_) | Prim::Binary(_) | Prim::Where | Prim::Cast(_))
    }

    /// A constant `full` of the given meta holding `k`.
    pub fn full(k: Konst, meta: &TensorMeta) -> Prim {
        Prim::Full { value: ScalarKey::new(k.scalar(meta.dtype)), shape: meta.shape.clone(), dtype: meta.dtype }
    }
}

/// An e-node: an operation and its operand e-classes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ENode {
    /// The op and its attributes.
    pub op: Prim,
    /// The operand classes.
    pub args: Vec<Id>,
}

impl ENode {
    /// `op` applied to `args`.
    pub fn new(op: Prim, args: Vec<Id>) -> ENode {
        ENode { op, args }
    }
}

impl Language for ENode {
    type Discriminant = std::mem::Discriminant<Prim>;

    fn discriminant(&self) -> Self::Discriminant {
        std::mem::discriminant(&self.op)
    }

    fn matches(&self, other: &Self) -> bool {
        self.op == other.op && self.args.len() == other.args.len()
    }

    fn children(&self) -> &[Id] {
        &self.args
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.args
    }
}

/// The meta of `op` applied to operands of the given metas (a leaf's own meta), or the
/// inference error: the one place rules and the analysis learn whether a node is well-typed.
pub fn infer_meta(op: &Prim, args: &[&TensorMeta]) -> Result<TensorMeta> {
    if op.is_leaf() {
        return Ok(op.leaf_meta().expect("leaves carry their meta"));
    }
    let (op, _) = op.to_op();
    let operands: Vec<Operand> = args.iter().map(|m| Operand::tensor(m)).collect();
    infer::infer(&op, &operands)
}

/// A value every element of a tensor holds, already converted to the tensor's dtype the way
/// the reference interpreter converts it: floats rounded to the dtype (`F`), integers wrapped
/// to their width and bool as 0/1 (`I`).
#[derive(Clone, Copy, Debug)]
pub enum Konst {
    /// A float, already rounded to its dtype.
    F(f64),
    /// An integer (bool as 0 / 1), already wrapped to its dtype.
    I(i64),
}

impl PartialEq for Konst {
    /// Bitwise for floats: `-0.0 != 0.0` and `NaN == NaN` (the same constant).
    fn eq(&self, other: &Konst) -> bool {
        match (self, other) {
            (Konst::F(a), Konst::F(b)) => a.to_bits() == b.to_bits(),
            (Konst::I(a), Konst::I(b)) => a == b,
            _ => false,
        }
    }
}

/// Rounds an f64 to a float dtype (f16 and bf16 through f32), as the interpreter does.
pub fn round_float(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f32(x as f32).to_f64(),
        DType::BF16 => bf16::from_f32(x as f32).to_f64(),
        _ => x,
    }
}

/// Wraps an i64 to an integral dtype like a C cast (bool: nonzero is 1).
pub fn wrap_int(dtype: DType, x: i64) -> i64 {
    match dtype {
        DType::Bool => (x != 0) as i64,
        DType::U8 => x as u8 as i64,
        DType::I8 => x as i8 as i64,
        DType::I16 => x as i16 as i64,
        DType::I32 => x as i32 as i64,
        _ => x,
    }
}

impl Konst {
    /// `value` converted to `dtype` (a `full`'s elements). `None` where the conversion is not
    /// one this pass wants to reason about (a non-finite float to an integer).
    pub fn of(value: Scalar, dtype: DType) -> Option<Konst> {
        match value {
            Scalar::Float(x) => Konst::F(x).cast(dtype),
            Scalar::Int(i) => Konst::I(i).cast(dtype),
            Scalar::Bool(b) => Konst::I(b as i64).cast(dtype),
        }
    }

    /// The value as a scalar of the natural kind of `dtype`.
    pub fn scalar(self, dtype: DType) -> Scalar {
        match self {
            Konst::F(x) => Scalar::Float(x),
            Konst::I(i) if dtype == DType::Bool => Scalar::Bool(i != 0),
            Konst::I(i) => Scalar::Int(i),
        }
    }

    /// The value as an f64 (exact for every value a `Konst` of a float dtype holds).
    pub fn as_f64(self) -> f64 {
        match self {
            Konst::F(x) => x,
            Konst::I(i) => i as f64,
        }
    }

    /// A cast to `to`, as the interpreter casts (a conversion depends only on the value and on
    /// whether it is a float). Casts of NaN and infinities to integers or bool, and of floats
    /// outside an integer type's range, are left alone (`None`): C leaves them undefined, so
    /// generated code need not agree with the interpreter.
    pub fn cast(self, to: DType) -> Option<Konst> {
        match (self, to.is_float()) {
            (Konst::F(x), true) => Some(Konst::F(round_float(to, x))),
            (Konst::F(x), false) if x.is_finite() && to == DType::Bool => Some(Konst::I((x != 0.0) as i64)),
            (Konst::F(x), false) if x.is_finite() && x.trunc().abs() < 2f64.powi(62) => {
                let i = x.trunc() as i64;
                (wrap_int(to, i) == i).then_some(Konst::I(i))
            }
            (Konst::F(_), false) => None,
            (Konst::I(i), true) if to == DType::F64 => Some(Konst::F(i as f64)),
            (Konst::I(i), true) => Some(Konst::F(round_float(to, i as f32 as f64))),
            (Konst::I(i), false) => Some(Konst::I(wrap_int(to, i))),
        }
    }
}

/// Constant-folds a pointwise op whose operands are all constants: the value the interpreter
/// computes (in f64 or i64, rounded or wrapped to the node's dtype). Only exactly-rounded
/// operations fold (+, -, *, /, comparisons and bit ops): transcendental functions are left to run,
/// since a C library and the interpreter may differ in their last bit.
pub fn fold(op: &Prim, args: &[Konst], out: DType) -> Option<Konst> {
    use BinaryOp::*;
    let bool_k = |b: bool| Some(Konst::I(b as i64));
    match (op, args) {
        (Prim::Cast(t), [k]) => k.cast(*t),
        (Prim::Unary(Ordered(UnaryOp::Neg)), [Konst::F(x)]) => Some(Konst::F(-x)),
        (Prim::Unary(Ordered(UnaryOp::Neg)), [Konst::I(i)]) if out != DType::Bool => {
            Some(Konst::I(wrap_int(out, i.wrapping_neg())))
        }
        (Prim::Unary(Ordered(UnaryOp::LogicalNot)), [k]) => bool_k(k.as_f64() == 0.0),
        (Prim::Unary(Ordered(UnaryOp::BitwiseNot)), [Konst::I(i)]) if out == DType::Bool => bool_k(*i == 0),
        (Prim::Unary(Ordered(UnaryOp::BitwiseNot)), [Konst::I(i)]) => Some(Konst::I(wrap_int(out, !i))),
        (Prim::Where, [c, a, b]) => Some(if c.as_f64() != 0.0 { *a } else { *b }),
        (Prim::Binary(Ordered(op)), [Konst::F(a), Konst::F(b)]) => {
            let (a, b) = (*a, *b);
            let r = match op {
                Add => a + b,
                Sub => a - b,
                Mul => a * b,
                Div => a / b,
                // as the interpreter and the kernels: NaN propagates, a tie of zeros gives `a`
                Maximum | Minimum => op.max_min(a, b),
                Eq => return bool_k(a == b),
                Ne => return bool_k(a != b),
                Lt => return bool_k(a < b),
                Le => return bool_k(a <= b),
                Gt => return bool_k(a > b),
                Ge => return bool_k(a >= b),
                _ => return None,
            };
            Some(Konst::F(round_float(out, r)))
        }
        (Prim::Binary(Ordered(op)), [Konst::I(a), Konst::I(b)]) => {
            let (a, b) = (*a, *b);
            let r = match op {
                Add if out != DType::Bool => a.wrapping_add(b),
                Sub if out != DType::Bool => a.wrapping_sub(b),
                Mul if out != DType::Bool => a.wrapping_mul(b),
                Maximum => a.max(b),
                Minimum => a.min(b),
                Eq => return bool_k(a == b),
                Ne => return bool_k(a != b),
                Lt => return bool_k(a < b),
                Le => return bool_k(a <= b),
                Gt => return bool_k(a > b),
                Ge => return bool_k(a >= b),
                LogicalAnd => return bool_k(a != 0 && b != 0),
                LogicalOr => return bool_k(a != 0 || b != 0),
                BitwiseAnd => a & b,
                BitwiseOr => a | b,
                BitwiseXor => a ^ b,
                ShiftLeft | ShiftRight => op.shift(a, b, out),
                _ => return None,
            };
            Some(Konst::I(wrap_int(out, r)))
        }
        _ => None,
    }
}

/// What the analysis knows about an e-class.
#[derive(Clone, Debug)]
pub struct Data {
    /// Shape and dtype, equal for every node of the class.
    pub meta: TensorMeta,
    /// The value of every element, when the class is a known constant.
    pub konst: Option<Konst>,
}

/// The e-graph analysis: metas, constants, and how many classes constant folding settled.
#[derive(Debug, Default)]
pub struct Facts {
    /// Classes that constant folding gave a `full` node (reported as the `constant-fold` rule).
    pub folded: usize,
}

/// The e-graph this pass works on.
pub type EG = EGraph<ENode, Facts>;

impl Analysis<ENode> for Facts {
    type Data = Data;

    fn make(egraph: &mut EG, enode: &ENode, _id: Id) -> Data {
        let metas: Vec<&TensorMeta> = enode.args.iter().map(|&a| &egraph[a].data.meta).collect();
        // Rules only add nodes whose meta they checked with `infer_meta`, and the graph going in
        // was verified: a failure here is a bug in this pass, not in the user's program.
        let meta = infer_meta(&enode.op, &metas).expect("rewrite rules build well-typed nodes");
        let konst = konst_of(egraph, enode, &meta);
        Data { meta, konst }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        debug_assert_eq!(a.meta, b.meta, "merged classes differ in meta");
        match (a.konst, b.konst) {
            (None, Some(k)) => {
                a.konst = Some(k);
                DidMerge(true, false)
            }
            (Some(_), None) => DidMerge(false, true),
            (Some(x), Some(y)) => {
                debug_assert!(x == y, "merged classes hold different constants {x:?} and {y:?}");
                DidMerge(false, false)
            }
            (None, None) => DidMerge(false, false),
        }
    }

    /// A class known to be constant gets a `full` node: the cheapest way to compute it.
    fn modify(egraph: &mut EG, id: Id) {
        let data = &egraph[id].data;
        let Some(k) = data.konst else { return };
        if data.meta.numel() == 0 || egraph[id].nodes.iter().any(|n| matches!(n.op, Prim::Full { .. })) {
            return;
        }
        let full = Prim::full(k, &data.meta);
        let new = egraph.add(ENode::new(full, vec![]));
        if egraph.union(id, new) {
            egraph.analysis.folded += 1;
        }
    }
}

/// The constant a new node holds: a `full`, a view or (non-empty) max/min of a constant, or a
/// pointwise op on constants that [`fold`] can evaluate.
fn konst_of(egraph: &EG, enode: &ENode, meta: &TensorMeta) -> Option<Konst> {
    let arg = |i: usize| egraph[enode.args[i]].data.konst;
    match &enode.op {
        Prim::Full { value, dtype, .. } => Konst::of(value.scalar(), *dtype),
        op if op.is_view() => arg(0),
        Prim::Reduce { op: Ordered(ReduceOp::Max | ReduceOp::Min), .. } if meta.numel() > 0 => {
            let input = &egraph[enode.args[0]].data.meta;
            if input.numel() > 0 {
                arg(0)
            } else {
                None
            }
        }
        op if op.is_pointwise() => {
            let ks = (0..enode.args.len()).map(arg).collect::<Option<Vec<Konst>>>()?;
            fold(op, &ks, meta.dtype)
        }
        _ => None,
    }
}
