//! The composite-level e-graph language: the captured-graph ops the template rules name, an
//! opaque node for every other graph node, and the virtual nodes the rules build (the partial
//! match `scores`, its attribute leaves, and the template itself); the [`Facts`] analysis; and
//! the cost of each node for extraction.
//!
//! A graph node enters as its language op when the rules name it (`matmul`; `mul`, `div` and
//! `where`; a cast between float dtypes, its target part of the op; a softmax over the last
//! dim; a permute that swaps the last two dims and keeps the others, `transpose`), and as
//! [`COp::Other`] (its node index part of the op, its operands the children, so it is never
//! merged with another) otherwise. Normalizing attributes into the op this way (`softmax` is
//! only ever over the last dim) is what lets the rules be plain egg patterns.

use coil_ir::infer::{self, Operand};
use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, Scalar, TensorMeta};
use egg::{Analysis, DidMerge, EGraph, FromOp, Id, Language};
use std::fmt;

/// An op of the composite-level language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum COp {
    /// A graph node no rule names (inputs, constants and masks included), by index.
    Other(usize),
    /// `matmul` (batched, broadcasting).
    Matmul,
    /// `mul`.
    Mul,
    /// `div`.
    Div,
    /// `where(cond, a, b)`.
    Where,
    /// A cast between float dtypes, to this one.
    Cast(DType),
    /// `softmax` over the last dim.
    Softmax,
    /// `permute` swapping the last two dims.
    Transpose,
    /// Virtual: `scores(q, k, scale, mask, width)`, the scores `q @ k^T`, times `scale`, with
    /// `mask`'s keys dropped, in q's dtype (`narrow`) or f32 (`wide`). Not executable: it marks
    /// a class as a partial match of the template.
    Scores,
    /// Virtual leaf: a scale of 1.
    One,
    /// Virtual: the reciprocal of a constant (the scale of `div`).
    Inv,
    /// Virtual leaf: no mask.
    NoMask,
    /// Virtual leaf: the causal mask (`col <= row` kept).
    Causal,
    /// Virtual leaf: scores in q's dtype.
    Narrow,
    /// Virtual leaf: scores in f32 (an f16 / bf16 softmax computed in f32).
    Wide,
    /// `attention(q, k, v, scale, mask)`: the template (`scaled_dot_product_attention`).
    Attention,
}

/// An e-node: an op and its operand classes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CNode {
    /// The op.
    pub op: COp,
    /// The operand classes.
    pub args: Vec<Id>,
}

impl Language for CNode {
    type Discriminant = COp;

    fn discriminant(&self) -> COp {
        self.op
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

/// The names rule patterns use, with their arities (`cast_f32`: a cast to f32).
const NAMES: &[(&str, COp, usize)] = &[
    ("matmul", COp::Matmul, 2),
    ("mul", COp::Mul, 2),
    ("div", COp::Div, 2),
    ("where", COp::Where, 3),
    ("cast_f32", COp::Cast(DType::F32), 1),
    ("cast_f16", COp::Cast(DType::F16), 1),
    ("cast_bf16", COp::Cast(DType::BF16), 1),
    ("softmax", COp::Softmax, 1),
    ("transpose", COp::Transpose, 1),
    ("scores", COp::Scores, 5),
    ("one", COp::One, 0),
    ("inv", COp::Inv, 1),
    ("nomask", COp::NoMask, 0),
    ("causal", COp::Causal, 0),
    ("narrow", COp::Narrow, 0),
    ("wide", COp::Wide, 0),
    ("attention", COp::Attention, 5),
];

impl FromOp for CNode {
    type Error = String;

    fn from_op(op: &str, args: Vec<Id>) -> Result<CNode, String> {
        let &(_, c, arity) =
            NAMES.iter().find(|(n, _, _)| *n == op).ok_or_else(|| format!("`{op}` is not a template-rule op"))?;
        if args.len() != arity {
            return Err(format!("`{op}` takes {arity} operands, not {}", args.len()));
        }
        Ok(CNode { op: c, args })
    }
}

impl fmt::Display for CNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match NAMES.iter().find(|(_, c, _)| *c == self.op) {
            Some((name, _, _)) => f.write_str(name),
            None => write!(f, "{:?}", self.op),
        }
    }
}

/// The language op of graph node `id` (see the module docs).
pub fn op_of(graph: &Graph, id: NodeId) -> COp {
    let n = graph.node(id);
    let rank = n.meta.rank();
    match &n.op {
        Op::Matmul => COp::Matmul,
        Op::Binary(BinaryOp::Mul) => COp::Mul,
        Op::Binary(BinaryOp::Div) => COp::Div,
        Op::Where => COp::Where,
        Op::Cast(to) if to.is_float() && graph.meta(n.inputs[0]).dtype.is_float() => COp::Cast(*to),
        Op::Softmax { dim } if dim + 1 == rank => COp::Softmax,
        Op::Permute { perm }
            if rank >= 2
                && perm[rank - 2] == rank - 1
                && perm[rank - 1] == rank - 2
                && perm[..rank - 2].iter().enumerate().all(|(i, &p)| i == p) =>
        {
            COp::Transpose
        }
        _ => COp::Other(id.0),
    }
}

/// What the analysis knows about a class.
#[derive(Clone, Debug)]
pub struct Data {
    /// Shape and dtype (virtual leaves: an f64 scalar's).
    pub meta: TensorMeta,
    /// A Rust scalar of the captured graph (it does not promote the other operand's dtype).
    pub scalar: bool,
    /// The value of a one-element constant (`scalar`, `full` of one element, `one`, `inv`).
    pub konst: Option<f64>,
    /// Every element is `-inf` (a scalar, or a `full` of any shape).
    pub neg_inf: bool,
    /// The width leaf `wide`.
    pub wide: bool,
    /// The graph node the class was built from (`None` for what rules built).
    pub node: Option<NodeId>,
    /// Which elements of its last two dims a `where`'s condition keeps, where that follows
    /// from the nodes computing it ([`super::rules::pattern`]).
    pub mask: Option<super::rules::Pattern>,
}

/// The analysis: metas and constants. The graph's facts are set by the builder on the classes
/// it makes from graph nodes ([`Facts::of_node`]); `make` infers the rest.
#[derive(Debug, Default)]
pub struct Facts;

/// The composite-level e-graph.
pub type CEG = EGraph<CNode, Facts>;

/// The meta of a virtual leaf.
fn placeholder() -> TensorMeta {
    TensorMeta::new(vec![], DType::F64)
}

impl Facts {
    /// The facts of graph node `id`; `cond` when a `where` reads it as its condition.
    pub fn of_node(graph: &Graph, id: NodeId, cond: bool) -> Data {
        let n = graph.node(id);
        let konst = match n.op {
            Op::Scalar(s) => Some(s.as_f64()),
            Op::Full(s) if n.meta.numel() == 1 => Some(s.as_f64()),
            _ => None,
        };
        let neg_inf = neg_inf(graph, id);
        let mask = if cond { super::rules::pattern(graph, id) } else { None };
        Data {
            meta: n.meta.clone(),
            scalar: matches!(n.op, Op::Scalar(_)),
            konst,
            neg_inf,
            wide: false,
            node: Some(id),
            mask,
        }
    }
}

/// Whether every element of graph node `id` is `-inf`: a scalar or `full` of it, or a cast of
/// one to a float dtype (`masked_fill(mask, -inf)` on f16 / bf16 scores casts its value).
fn neg_inf(graph: &Graph, id: NodeId) -> bool {
    let n = graph.node(id);
    match n.op {
        Op::Scalar(Scalar::Float(x)) | Op::Full(Scalar::Float(x)) => x == f64::NEG_INFINITY,
        Op::Cast(to) if to.is_float() => neg_inf(graph, n.inputs[0]),
        _ => false,
    }
}

/// The meta of `op` over operands of the given facts, `None` where it is ill-typed (rules
/// check their right sides with it before they are added).
pub fn infer_meta(op: COp, args: &[&Data]) -> Option<TensorMeta> {
    let graph_op = |op: Op| {
        let operands: Vec<Operand> = args.iter().map(|d| Operand { meta: &d.meta, scalar: d.scalar }).collect();
        infer::infer(&op, &operands).ok()
    };
    let rank = args.first().map_or(0, |a| a.meta.rank());
    match op {
        COp::Other(_) => None,
        COp::Matmul => graph_op(Op::Matmul),
        COp::Mul => graph_op(Op::Binary(BinaryOp::Mul)),
        COp::Div => graph_op(Op::Binary(BinaryOp::Div)),
        COp::Where => graph_op(Op::Where),
        COp::Cast(t) => graph_op(Op::Cast(t)),
        COp::Softmax if rank >= 1 => graph_op(Op::Softmax { dim: rank - 1 }),
        COp::Transpose if rank >= 2 => {
            let mut perm: Vec<usize> = (0..rank).collect();
            perm.swap(rank - 2, rank - 1);
            graph_op(Op::Permute { perm })
        }
        COp::Softmax | COp::Transpose => None,
        COp::One | COp::NoMask | COp::Causal | COp::Narrow | COp::Wide => Some(placeholder()),
        COp::Inv => Some(args[0].meta.clone()),
        COp::Scores | COp::Attention => {
            // q [.., L, D], k [.., S, D] (v [.., S, Dv]) of one rank and batch dims: scores
            // [.., L, S] (output [.., L, Dv]) of q's dtype, or f32 for wide scores.
            let (q, k) = (&args[0].meta, &args[1].meta);
            let last = if op == COp::Scores { k } else { &args[2].meta };
            let r = q.rank();
            if r < 2 || k.rank() != r || last.rank() != r || q.shape[..r - 2] != k.shape[..r - 2] {
                return None;
            }
            let mut shape = q.shape.clone();
            shape[r - 1] = last.shape[r - if op == COp::Scores { 2 } else { 1 }];
            let wide = op == COp::Scores && args[4].wide;
            Some(TensorMeta::new(shape, if wide { DType::F32 } else { q.dtype }))
        }
    }
}

impl Analysis<CNode> for Facts {
    type Data = Data;

    fn make(egraph: &mut CEG, enode: &CNode, _id: Id) -> Data {
        let args: Vec<&Data> = enode.args.iter().map(|&a| &egraph[a].data).collect();
        let konst = match enode.op {
            COp::One => Some(1.0),
            COp::Inv => args[0].konst.map(|c| 1.0 / c),
            _ => None,
        };
        // Graph nodes get their facts from the builder; rules add only nodes they checked.
        let meta = infer_meta(enode.op, &args).unwrap_or_else(placeholder);
        Data { meta, scalar: false, konst, neg_inf: false, wide: enode.op == COp::Wide, node: None, mask: None }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        debug_assert_eq!(a.meta, b.meta, "merged classes differ in meta");
        if a.node.is_none() && b.node.is_some() {
            *a = Data { meta: a.meta.clone(), ..b };
            return DidMerge(true, false);
        }
        DidMerge(false, b.node.is_none() && a.node.is_some())
    }
}

/// The time one node costs, on a target of `bandwidth` bytes and `flop_rate` flops per second,
/// plus [`LAUNCH_SECONDS`] per kernel; `None` for a node that cannot run (a virtual `scores`).
/// At this level nothing is fused yet: every executable op reads its tensor operands and
/// writes its result once (softmax: reads once, writes once; its few flops per element do
/// not bind), so the written-out chain pays the `[.., L, S]` scores and probabilities at
/// every step, where the template moves q, k, v and its output and does both products' flops.
pub fn node_seconds(eg: &CEG, node: &CNode, model: &crate::rewrite::CostModel) -> Option<f64> {
    let data = |i: usize| &eg[node.args[i]].data;
    let bytes = |d: &Data| if d.scalar { 0.0 } else { d.meta.nbytes() as f64 };
    let meta_out = || infer_meta(node.op, &node.args.iter().map(|&a| &eg[a].data).collect::<Vec<_>>());
    let io = |out: &TensorMeta, args: &[usize]| -> f64 {
        (out.nbytes() as f64 + args.iter().map(|&i| bytes(data(i))).sum::<f64>()) / model.bandwidth
    };
    Some(match node.op {
        COp::Scores => return None,
        COp::Other(_) | COp::Transpose | COp::One | COp::Inv | COp::NoMask | COp::Causal | COp::Narrow | COp::Wide => {
            0.0
        }
        COp::Mul | COp::Div | COp::Where | COp::Cast(_) | COp::Softmax => {
            let out = meta_out()?;
            io(&out, &(0..node.args.len()).collect::<Vec<_>>()) + LAUNCH_SECONDS
        }
        COp::Matmul => {
            let out = meta_out()?;
            let a = &data(0).meta;
            let flops = 2.0 * out.numel() as f64 * a.shape[a.rank() - 1] as f64;
            io(&out, &[0, 1]) + flops / model.flop_rate + LAUNCH_SECONDS
        }
        COp::Attention => {
            let out = meta_out()?;
            let (q, k) = (&data(0).meta, &data(1).meta);
            let r = q.rank();
            // Both products: [.., L, S] scores of depth D, then [.., L, Dv] of depth S.
            let flops = 2.0
                * (q.numel() / q.shape[r - 1]) as f64
                * k.shape[r - 2] as f64
                * (q.shape[r - 1] + out.shape[r - 1]) as f64;
            io(&out, &[0, 1, 2]) + flops / model.flop_rate + LAUNCH_SECONDS
        }
    })
}

/// What one kernel launch costs (a few microseconds on CUDA, host and device side together).
pub const LAUNCH_SECONDS: f64 = 3e-6;
