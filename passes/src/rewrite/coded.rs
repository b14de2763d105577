//! The rules written in code: those whose left side reads or whose right side computes an
//! op's attributes (a cast's dtypes, a view's shape, perm or slice, a reduction's dims), which
//! egg's patterns cannot express (a pattern's op matches one value of its attributes, and its
//! right side can only copy ops written in it).
//!
//! A [`CodedRule`] is a Rust function that looks at one e-node of one e-class (and at the nodes
//! of its operand classes) and proposes an equivalent term ([`Rhs`]) over classes that exist,
//! with a *trigger*: the cheap look at a graph node that says whether the rule may fire there
//! (it picks the e-graph's region, so it must accept every node the rule can fire at).
//! Proposals are type-checked with the same inference graphs use before they reach the
//! e-graph, so a rule can never change a class's shape or dtype. Each proposal is handed to
//! egg as a pattern with one variable per existing class.

use super::lang::{infer_meta, ENode, Konst, Ordered, Prim, EG};
use super::pattern::graph_konst;
use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, TensorMeta};
use egg::{ENodeOrVar, Id, PatternAst, RecExpr, SearchMatches, Subst, Var};
use std::borrow::Cow;
use std::sync::OnceLock;

/// A term a rule proposes: existing classes, combined by new nodes.
#[derive(Clone, Debug)]
pub enum Rhs {
    /// A class that exists.
    Class(Id),
    /// A new node over proposals.
    Node(Prim, Vec<Rhs>),
}

/// `op(args...)` as a proposal.
fn node(op: Prim, args: Vec<Rhs>) -> Rhs {
    Rhs::Node(op, args)
}

/// An existing class as (part of) a proposal.
fn class(id: Id) -> Rhs {
    Rhs::Class(id)
}

/// How a rule looks at one e-node of a class.
type Find = fn(&EG, Id, &ENode) -> Option<Rhs>;

/// Whether a rule may fire at a node of a primitive graph whose identical nodes are merged by
/// `rep` (see `region::cse`).
type Trigger = fn(&Graph, NodeId, &[usize]) -> bool;

/// A rule written in code (see the module docs).
#[derive(Clone, Copy)]
pub struct CodedRule {
    /// The name reported in `rewrites.txt`.
    pub name: &'static str,
    find: Find,
    trigger: Trigger,
}

// ---- reading the e-graph ----

fn meta(eg: &EG, id: Id) -> &TensorMeta {
    &eg[id].data.meta
}

fn konst(eg: &EG, id: Id) -> Option<Konst> {
    eg[id].data.konst
}

/// A node of class `id` that `pick` accepts, and what it returned.
fn find_in<T>(eg: &EG, id: Id, pick: impl FnMut(&ENode) -> Option<T>) -> Option<T> {
    eg[id].nodes.iter().find_map(pick)
}

/// `x * c` (either order) with `c` a constant: `(x, c)`.
fn scaled(eg: &EG, id: Id) -> Option<(Id, Konst)> {
    find_in(eg, id, |n| match (&n.op, &n.args[..]) {
        (Prim::Binary(Ordered(BinaryOp::Mul)), &[a, b]) => match (konst(eg, a), konst(eg, b)) {
            (_, Some(k)) => Some((a, k)),
            (Some(k), None) => Some((b, k)),
            _ => None,
        },
        _ => None,
    })
}

/// Whether every value of `from` is exactly a value of `to`, so a cast through `to` loses
/// nothing. Never through a narrower type: f32 -> f16 -> f32 is not the identity.
pub fn lossless(from: DType, to: DType) -> bool {
    use DType::*;
    from == to
        || match from {
            Bool => true,
            U8 | I8 => matches!(to, I16 | I32 | I64 | F16 | BF16 | F32 | F64) || (from == U8 && to == U8),
            I16 => matches!(to, I32 | I64 | F32 | F64),
            I32 => matches!(to, I64 | F64),
            F16 | BF16 => matches!(to, F32 | F64),
            F32 => to == F64,
            I64 | F64 => false,
        }
}

/// Whether `perm` swaps the last two dims and keeps the others (a batched transpose).
pub fn is_batched_transpose(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2 && perm[r - 2] == r - 1 && perm[r - 1] == r - 2 && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
}

fn mul(a: Rhs, b: Rhs) -> Rhs {
    node(Prim::Binary(Ordered(BinaryOp::Mul)), vec![a, b])
}

/// `x * c` (either order) at graph node `id`, with `c` a constant.
fn graph_scaled(g: &Graph, id: NodeId) -> bool {
    let m = g.node(id);
    matches!(m.op, Op::Binary(BinaryOp::Mul)) && m.inputs.iter().any(|&x| graph_konst(g, x).is_some())
}

/// `cast(x, t) -> x` when x already has dtype `t`; `cast(cast(x, t1), t2) -> cast(x, t2)` when
/// `x -> t1` is lossless (so the inner cast changes no value), e.g. f16 -> f32 -> f64.
fn cast_cast(eg: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    let Prim::Cast(t2) = n.op else { return None };
    let y = n.args[0];
    if meta(eg, y).dtype == t2 {
        return Some(class(y));
    }
    find_in(eg, y, |inner| match inner.op {
        Prim::Cast(t1) if lossless(meta(eg, inner.args[0]).dtype, t1) => {
            let x = inner.args[0];
            Some(if meta(eg, x).dtype == t2 { class(x) } else { node(Prim::Cast(t2), vec![class(x)]) })
        }
        _ => None,
    })
}

/// Views that change nothing: a reshape or expand to the same shape, the identity permute, a
/// full slice with step 1.
fn view_identity(eg: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    let x = *n.args.first()?;
    let shape = &meta(eg, x).shape;
    let same = match &n.op {
        Prim::Reshape { shape: s } | Prim::Expand { shape: s } => s == shape,
        Prim::Permute { perm } => perm.iter().enumerate().all(|(i, &p)| i == p),
        Prim::Slice { dim, start: 0, len, step: 1 } => shape[*dim] == *len,
        _ => false,
    };
    same.then(|| class(x))
}

/// Chains of one view kind collapse: `permute(permute(x, p), q) -> permute(x, p[q[i]])`,
/// `reshape(reshape(x)) -> reshape(x)`, `expand(expand(x)) -> expand(x)`,
/// `slice(slice(x))` along one dim -> one slice (starts and steps compose). A chain that
/// composes to nothing becomes `x` (through [`view_identity`] on the next iteration).
fn view_chain(eg: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    let y = *n.args.first()?;
    find_in(eg, y, |inner| {
        let x = *inner.args.first()?;
        let op = match (&n.op, &inner.op) {
            (Prim::Permute { perm: q }, Prim::Permute { perm: p }) => {
                let perm: Vec<usize> = q.iter().map(|&i| p[i]).collect();
                if perm.iter().enumerate().all(|(i, &p)| i == p) {
                    return Some(class(x));
                }
                Prim::Permute { perm }
            }
            (Prim::Reshape { shape }, Prim::Reshape { .. }) => {
                if &meta(eg, x).shape == shape {
                    return Some(class(x));
                }
                Prim::Reshape { shape: shape.clone() }
            }
            (Prim::Expand { shape }, Prim::Expand { .. }) => Prim::Expand { shape: shape.clone() },
            (&Prim::Slice { dim, start: s2, len, step: st2 }, &Prim::Slice { dim: d1, start: s1, step: st1, .. })
                if dim == d1 && len > 0 =>
            {
                let start = s1 as i64 + s2 as i64 * st1;
                let start = usize::try_from(start).ok()?;
                Prim::Slice { dim, start, len, step: st1 * st2 }
            }
            _ => return None,
        };
        Some(node(op, vec![class(x)]))
    })
}

/// `transpose(a @ b) -> transpose(b) @ transpose(a)` for a batched transpose of the last two
/// dims. Each output element is the same dot product (products commute exactly); with the
/// view rules, `(x.t() @ y.t()).t()` becomes `y @ x` and the copy of a transposed output goes.
fn bmm_transpose(eg: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    let Prim::Permute { perm } = &n.op else { return None };
    if !is_batched_transpose(perm) {
        return None;
    }
    find_in(eg, n.args[0], |inner| match (&inner.op, &inner.args[..]) {
        (Prim::Bmm, &[a, b]) => {
            let t = |x: Id| node(Prim::Permute { perm: perm.clone() }, vec![class(x)]);
            Some(node(Prim::Bmm, vec![t(b), t(a)]))
        }
        _ => None,
    })
}

/// Whether a constant factor may move across a sum or product: floats need it finite and
/// nonzero (then NaN and inf in the data propagate the same way on both sides; only rounding,
/// and where finite values overflow, can differ by the factor's magnitude). f16 is left out:
/// its range (65504) is small enough for that overflow to be real; bf16, f32 and f64 have
/// f32's range or more.
pub fn movable_factor(t: DType, s: f64) -> bool {
    matches!(t, DType::BF16 | DType::F32 | DType::F64) && s.is_finite() && s != 0.0
}

/// `sum(x * s) -> sum(x) * s` (floats under [`movable_factor`]; integers always: wrapping
/// arithmetic is a ring), and `amax(x * s) -> amax(x) * s`, `amin` alike, for floats and
/// `s > 0` (rounding is monotone, so this one is exact).
fn reduce_scalar(eg: &EG, id: Id, n: &ENode) -> Option<Rhs> {
    let Prim::Reduce { op: Ordered(op), .. } = &n.op else { return None };
    let (x, k) = scaled(eg, n.args[0])?;
    let (t, s) = (meta(eg, x).dtype, k.as_f64());
    let ok = match op {
        ReduceOp::Sum => movable_factor(t, s) || (t.is_integral() && t != DType::Bool),
        ReduceOp::Max | ReduceOp::Min => t.is_float() && s.is_finite() && s > 0.0,
        _ => false,
    };
    // Sums of integers accumulate in i64 whatever the operand (the result's dtype): the factor
    // must be applied in the dtype it was applied in.
    if !ok || meta(eg, id).dtype != t {
        return None;
    }
    let full = node(Prim::full(k, meta(eg, id)), vec![]);
    Some(mul(node(n.op.clone(), vec![class(x)]), full))
}

/// Whether a constant is a zero a sum may start from: an integer 0, or a float zero of either
/// sign (see [`scatter_into_addend`] for what the sign changes).
fn is_zero(k: Konst) -> bool {
    match k {
        Konst::I(v) => v == 0,
        Konst::F(v) => v == 0.0,
    }
}

/// `add(y, scatter_add(0, index, src))` (either order) -> `scatter_add(y, index, src)`: the
/// scatter accumulates into the other addend instead of into a buffer of zeros, so the zero
/// fill, the scatter's copy of it and the add's pass over both operands go (an embedding's
/// gradient added to the gradient of the output projection tied to it). `y` must have the
/// sum's shape and dtype (checked with every proposal), so casts stay where they were.
///
/// Integers: exact (wrapping addition is associative and commutative). Floats: every element
/// sums the same terms in another order, `y + ((0 + s1) + s2)` becoming `(y + s1) + s2`, so an
/// element that several sources reach may round differently (the order of those sources is
/// open anyway on the GPU, whose scatter adds atomically); and with a `+0.0` fill an element
/// where `y` is `-0.0` and the sources add up to no nonzero value keeps `-0.0` where the
/// original gives `+0.0` (with a `-0.0` fill that is exact too). The cost model takes it
/// because it always removes the add's pass.
fn scatter_into_addend(eg: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    let (Prim::Binary(Ordered(BinaryOp::Add)), &[a, b]) = (&n.op, &n.args[..]) else { return None };
    [(a, b), (b, a)].into_iter().find_map(|(s, y)| {
        find_in(eg, s, |inner| match (&inner.op, &inner.args[..]) {
            (&Prim::Scatter { dim, reduce: Some(Ordered(ReduceOp::Sum)) }, &[zero, index, src])
                if konst(eg, zero).is_some_and(is_zero) && meta(eg, y).dtype != DType::Bool =>
            {
                let reduce = Some(Ordered(ReduceOp::Sum));
                Some(node(Prim::Scatter { dim, reduce }, vec![class(y), class(index), class(src)]))
            }
            _ => None,
        })
    })
}

// ---- triggers: where each rule may fire in the graph ----

/// The op of node `id`'s `i`-th operand.
fn arg_op(g: &Graph, id: NodeId, i: usize) -> &Op {
    &g.node(g.node(id).inputs[i]).op
}

fn cast_trigger(g: &Graph, id: NodeId, _: &[usize]) -> bool {
    let n = g.node(id);
    matches!(n.op, Op::Cast(t) if matches!(arg_op(g, id, 0), Op::Cast(_)) || g.meta(n.inputs[0]).dtype == t)
}

fn view_identity_trigger(g: &Graph, id: NodeId, _: &[usize]) -> bool {
    let n = g.node(id);
    match &n.op {
        Op::Reshape { shape } | Op::Expand { shape } => shape == &g.meta(n.inputs[0]).shape,
        Op::Permute { perm } => perm.iter().enumerate().all(|(i, &p)| i == p),
        Op::Slice { dim, start, len, step } => *start == 0 && *step == 1 && g.meta(n.inputs[0]).shape[*dim] == *len,
        _ => false,
    }
}

fn view_chain_trigger(g: &Graph, id: NodeId, _: &[usize]) -> bool {
    let op = &g.node(id).op;
    matches!(op, Op::Reshape { .. } | Op::Expand { .. } | Op::Permute { .. } | Op::Slice { .. })
        && std::mem::discriminant(arg_op(g, id, 0)) == std::mem::discriminant(op)
}

fn bmm_transpose_trigger(g: &Graph, id: NodeId, _: &[usize]) -> bool {
    matches!(&g.node(id).op, Op::Permute { perm } if is_batched_transpose(perm) && arg_op(g, id, 0) == &Op::Bmm)
}

fn reduce_scalar_trigger(g: &Graph, id: NodeId, _: &[usize]) -> bool {
    matches!(g.node(id).op, Op::Reduce { .. }) && graph_scaled(g, g.node(id).inputs[0])
}

/// `add` of a node that is `scatter_add` into a zero constant.
fn scatter_into_addend_trigger(g: &Graph, id: NodeId, _: &[usize]) -> bool {
    let n = g.node(id);
    n.op == Op::Binary(BinaryOp::Add)
        && n.meta.dtype != DType::Bool
        && n.inputs.iter().any(|&x| {
            let s = g.node(x);
            matches!(s.op, Op::Scatter { reduce: Some(ReduceOp::Sum), .. })
                && graph_konst(g, s.inputs[0]).is_some_and(is_zero)
        })
}

/// The rules written in code, by name.
pub fn rules() -> [CodedRule; 6] {
    [
        CodedRule { name: "cast-cast", find: cast_cast, trigger: cast_trigger },
        CodedRule { name: "view-identity", find: view_identity, trigger: view_identity_trigger },
        CodedRule { name: "view-chain", find: view_chain, trigger: view_chain_trigger },
        CodedRule { name: "bmm-transpose", find: bmm_transpose, trigger: bmm_transpose_trigger },
        CodedRule { name: "reduce-scalar", find: reduce_scalar, trigger: reduce_scalar_trigger },
        CodedRule { name: "scatter-into-addend", find: scatter_into_addend, trigger: scatter_into_addend_trigger },
    ]
}

// ---- proposals as egg patterns ----

/// Pattern variables `?0`, `?1`, ... standing for the existing classes of a proposal.
fn var(i: usize) -> Var {
    static VARS: OnceLock<Vec<Var>> = OnceLock::new();
    let vars = VARS.get_or_init(|| (0..16).map(|i| format!("?{i}").parse().expect("a pattern variable")).collect());
    vars.get(i).copied().unwrap_or_else(|| format!("?{i}").parse().expect("a pattern variable"))
}

/// The meta of a proposal, or `None` if it does not type-check.
fn check(eg: &EG, rhs: &Rhs) -> Option<TensorMeta> {
    match rhs {
        Rhs::Class(id) => Some(meta(eg, *id).clone()),
        Rhs::Node(op, args) => {
            let metas = args.iter().map(|a| check(eg, a)).collect::<Option<Vec<_>>>()?;
            infer_meta(op, &metas.iter().collect::<Vec<_>>()).ok()
        }
    }
}

/// A proposal as an egg pattern, its classes bound in `subst`.
fn encode(rhs: &Rhs, ast: &mut PatternAst<ENode>, subst: &mut Subst, vars: &mut usize) -> Id {
    match rhs {
        Rhs::Class(id) => {
            let v = var(*vars);
            *vars += 1;
            subst.insert(v, *id);
            ast.add(ENodeOrVar::Var(v))
        }
        Rhs::Node(op, args) => {
            let args = args.iter().map(|a| encode(a, ast, subst, vars)).collect();
            ast.add(ENodeOrVar::ENode(ENode::new(op.clone(), args)))
        }
    }
}

impl CodedRule {
    /// The proposals for class `id`: well-typed, of the class's meta, and not the class itself.
    pub fn search<'a>(&self, eg: &EG, id: Id, out: &mut Vec<SearchMatches<'a, ENode>>) {
        let class = &eg[id];
        for n in &class.nodes {
            let Some(rhs) = (self.find)(eg, id, n) else { continue };
            if matches!(rhs, Rhs::Class(c) if eg.find(c) == id) {
                continue;
            }
            if check(eg, &rhs).as_ref() != Some(&class.data.meta) {
                continue;
            }
            let (mut ast, mut subst) = (RecExpr::default(), Subst::default());
            encode(&rhs, &mut ast, &mut subst, &mut 0);
            out.push(SearchMatches { eclass: id, substs: vec![subst], ast: Some(Cow::Owned(ast)) });
        }
    }

    /// Whether the rule may fire at graph node `id` (its trigger).
    pub fn may_fire(&self, g: &Graph, id: NodeId, rep: &[usize]) -> bool {
        (self.trigger)(g, id, rep)
    }
}
