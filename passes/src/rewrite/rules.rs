//! The rewrite rules, in two stages, and the small machinery that runs them in egg.
//!
//! A [`Rule`] is a Rust function that looks at one e-node of one e-class (and at the nodes of
//! its operand classes) and proposes an equivalent term ([`Rhs`]) over classes that exist. Each
//! rule states its conditions (rank, dtype, operand kind, constant value) in code. Proposals are
//! type-checked with the same inference graphs use before they reach the e-graph, so a rule can
//! never change a class's shape or dtype.
//!
//! In egg's terms the rule is its own [`Searcher`] (it computes the proposal while the e-graph
//! is clean, and hands it over as a pattern with one variable per existing class) and its own
//! [`Applier`] (it instantiates the pattern and unions it with the matched class).
//!
//! Rules left out on purpose, because they are not exact equivalences in floating point:
//! `exp(log x) -> x` and `log(exp x) -> x` (wrong for `x <= 0`, overflow, and not bit-exact
//! even for `x > 0`); `x + 0.0 -> x` (`-0.0 + 0.0` is `+0.0`: only `x + (-0.0)` and `x - 0.0`
//! are identities); `x * 0 -> 0` for floats (NaN, inf); `x - x -> 0` (NaN, inf); turning a
//! hand-written `exp(x) / sum(exp(x))` into the max-subtracted stable form (it changes where
//! results overflow: that is a different function); commutativity and associativity of `+`
//! and `*` (they explode the e-graph and change rounding).

use super::lang::{infer_meta, Data, ENode, Facts, Konst, Ordered, Prim, EG};
use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, TensorMeta, UnaryOp};
use egg::{Applier, ENodeOrVar, Id, PatternAst, RecExpr, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};
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

/// A named rewrite rule (see the module docs).
#[derive(Clone)]
pub struct Rule {
    /// The name reported in `rewrites.txt`.
    pub name: &'static str,
    find: Find,
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

/// The operand of a node of class `id` whose op is `op`.
fn child_of(eg: &EG, id: Id, op: &Prim) -> Option<Id> {
    find_in(eg, id, |n| (&n.op == op).then(|| n.args[0]))
}

fn is_one(k: Option<Konst>) -> bool {
    k.is_some_and(|k| k.as_f64() == 1.0)
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
fn is_batched_transpose(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2 && perm[r - 2] == r - 1 && perm[r - 1] == r - 2 && perm[..r - 2].iter().enumerate().all(|(i, &p)| i == p)
}

fn mul(a: Rhs, b: Rhs) -> Rhs {
    node(Prim::Binary(Ordered(BinaryOp::Mul)), vec![a, b])
}

// ---- stage 1: identities, cancellation, views, casts ----

/// `x * 1 -> x`, `1 * x -> x`: exact for every value (NaN, inf and -0.0 included); not bool.
fn mul_one(eg: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    match (&n.op, &n.args[..]) {
        (Prim::Binary(Ordered(BinaryOp::Mul)), &[a, b]) if meta(eg, a).dtype != DType::Bool => {
            if is_one(konst(eg, b)) {
                Some(class(a))
            } else if is_one(konst(eg, a)) {
                Some(class(b))
            } else {
                None
            }
        }
        _ => None,
    }
}

/// `x / 1 -> x` and `pow(x, 1) -> x` (floats; both exact, NaN included).
fn div_pow_one(eg: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    match (&n.op, &n.args[..]) {
        (Prim::Binary(Ordered(BinaryOp::Div | BinaryOp::Pow)), &[a, b])
            if meta(eg, a).dtype.is_float() && is_one(konst(eg, b)) =>
        {
            Some(class(a))
        }
        _ => None,
    }
}

/// `x + 0 -> x` and `x - 0 -> x`. Integers: any zero. Floats: only `x + (-0.0)` (either order)
/// and `x - (+0.0)`, the forms that keep `-0.0`: `-0.0 + 0.0` is `+0.0`, so `x + 0.0` is not an
/// identity.
fn add_zero(eg: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    let (op, a, b) = match (&n.op, &n.args[..]) {
        (Prim::Binary(Ordered(op @ (BinaryOp::Add | BinaryOp::Sub))), &[a, b]) => (*op, a, b),
        _ => return None,
    };
    let t = meta(eg, a).dtype;
    let is = |id: Id, float_zero: f64| match konst(eg, id) {
        Some(Konst::I(0)) => t.is_integral() && t != DType::Bool,
        Some(Konst::F(x)) => t.is_float() && x.to_bits() == float_zero.to_bits(),
        _ => false,
    };
    match op {
        BinaryOp::Add if is(b, -0.0) => Some(class(a)),
        BinaryOp::Add if is(a, -0.0) => Some(class(b)),
        BinaryOp::Sub if is(b, 0.0) => Some(class(a)),
        _ => None,
    }
}

/// `x * 0 -> 0` for integers only (for floats, NaN and inf times 0 are NaN).
fn mul_zero_int(eg: &EG, id: Id, n: &ENode) -> Option<Rhs> {
    match (&n.op, &n.args[..]) {
        (Prim::Binary(Ordered(BinaryOp::Mul)), &[a, b]) => {
            let t = meta(eg, a).dtype;
            let zero = |x: Id| matches!(konst(eg, x), Some(Konst::I(0)));
            (t.is_integral() && t != DType::Bool && (zero(a) || zero(b)))
                .then(|| node(Prim::full(Konst::I(0), meta(eg, id)), vec![]))
        }
        _ => None,
    }
}

/// `neg(neg x) -> x` (not bool; exact, wrapping integers included),
/// `logical_not(logical_not x) -> x` for bool `x` and `bitwise_not(bitwise_not x) -> x`.
fn involution(eg: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    match &n.op {
        Prim::Unary(Ordered(u @ (UnaryOp::Neg | UnaryOp::LogicalNot | UnaryOp::BitwiseNot))) => {
            let x = child_of(eg, n.args[0], &n.op)?;
            let ok = match u {
                UnaryOp::Neg => meta(eg, x).dtype != DType::Bool,
                UnaryOp::BitwiseNot => true,
                _ => meta(eg, x).dtype == DType::Bool,
            };
            ok.then(|| class(x))
        }
        _ => None,
    }
}

/// `maximum(x, x) -> x` (and minimum, logical and/or of bools, bitwise and/or): exact, NaN
/// included.
fn idempotent(_: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    use BinaryOp::*;
    match (&n.op, &n.args[..]) {
        (Prim::Binary(Ordered(Maximum | Minimum | LogicalAnd | LogicalOr | BitwiseAnd | BitwiseOr)), &[a, b])
            if a == b =>
        {
            Some(class(a))
        }
        _ => None,
    }
}

/// `where(true, a, b) -> a`, `where(false, a, b) -> b`, `where(c, x, x) -> x`.
fn where_select(eg: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    match (&n.op, &n.args[..]) {
        (Prim::Where, &[_, a, b]) if a == b => Some(class(a)),
        (Prim::Where, &[c, a, b]) => konst(eg, c).map(|k| class(if k.as_f64() != 0.0 { a } else { b })),
        _ => None,
    }
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

// ---- stage 2: algebra over matrix products and reductions ----

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
fn movable_factor(t: DType, s: f64) -> bool {
    matches!(t, DType::BF16 | DType::F32 | DType::F64) && s.is_finite() && s != 0.0
}

/// `(a * s) @ b -> (a @ b) * s` and `a @ (b * s) -> (a @ b) * s` for a constant `s` (floats,
/// [`movable_factor`]). Extraction keeps whichever side scales fewer elements.
fn bmm_scalar(eg: &EG, id: Id, n: &ENode) -> Option<Rhs> {
    let (Prim::Bmm, &[a, b]) = (&n.op, &n.args[..]) else { return None };
    let out = meta(eg, id);
    for (side, other, left) in [(a, b, true), (b, a, false)] {
        let Some((x, k)) = scaled(eg, side) else { continue };
        if movable_factor(out.dtype, k.as_f64()) {
            let mm = if left { vec![class(x), class(other)] } else { vec![class(other), class(x)] };
            return Some(mul(node(Prim::Bmm, mm), node(Prim::full(k, out), vec![])));
        }
    }
    None
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

/// `(a @ b) @ c -> a @ (b @ c)` (floats): extraction picks the order that moves fewer bytes
/// and flops (a low-rank adapter `B @ (A @ x)`). Matrix chains in real graphs are short, and
/// the node limit bounds the rest.
fn bmm_assoc_right(eg: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    let (Prim::Bmm, &[ab, c]) = (&n.op, &n.args[..]) else { return None };
    if !meta(eg, c).dtype.is_float() {
        return None;
    }
    find_in(eg, ab, |m| match (&m.op, &m.args[..]) {
        (Prim::Bmm, &[a, b]) => Some(node(Prim::Bmm, vec![class(a), node(Prim::Bmm, vec![class(b), class(c)])])),
        _ => None,
    })
}

/// `a @ (b @ c) -> (a @ b) @ c` (floats), the other direction of [`bmm_assoc_right`].
fn bmm_assoc_left(eg: &EG, _: Id, n: &ENode) -> Option<Rhs> {
    let (Prim::Bmm, &[a, bc]) = (&n.op, &n.args[..]) else { return None };
    if !meta(eg, a).dtype.is_float() {
        return None;
    }
    find_in(eg, bc, |m| match (&m.op, &m.args[..]) {
        (Prim::Bmm, &[b, c]) => Some(node(Prim::Bmm, vec![node(Prim::Bmm, vec![class(a), class(b)]), class(c)])),
        _ => None,
    })
}

/// The first stage: rules that only ever make the graph smaller.
pub fn simplify_rules() -> Vec<Rule> {
    vec![
        Rule { name: "mul-one", find: mul_one },
        Rule { name: "div-pow-one", find: div_pow_one },
        Rule { name: "add-zero", find: add_zero },
        Rule { name: "mul-zero-int", find: mul_zero_int },
        Rule { name: "involution", find: involution },
        Rule { name: "idempotent", find: idempotent },
        Rule { name: "where-select", find: where_select },
        Rule { name: "cast-cast", find: cast_cast },
        Rule { name: "view-identity", find: view_identity },
        Rule { name: "view-chain", find: view_chain },
    ]
}

/// The second stage: algebra whose worth the cost model decides (run with the first stage's
/// rules, so what they build is simplified too).
pub fn algebra_rules() -> Vec<Rule> {
    vec![
        Rule { name: "bmm-transpose", find: bmm_transpose },
        Rule { name: "bmm-scalar", find: bmm_scalar },
        Rule { name: "reduce-scalar", find: reduce_scalar },
        Rule { name: "bmm-assoc-right", find: bmm_assoc_right },
        Rule { name: "bmm-assoc-left", find: bmm_assoc_left },
    ]
}

/// Names of every rule, stage by stage, then `constant-fold` (done by the analysis) and `cse`
/// (identical nodes merged before the e-graph).
pub fn rule_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = simplify_rules().iter().chain(&algebra_rules()).map(|r| r.name).collect();
    names.push("constant-fold");
    names.push("cse");
    names
}

// ---- where rules may fire: the cheap look that picks the e-graph's region ----

/// The constant every element of graph node `id` holds: a `full`, or a view of one.
fn graph_konst(g: &Graph, id: NodeId) -> Option<Konst> {
    let n = g.node(id);
    match &n.op {
        Op::Full(v) => Konst::of(*v, n.meta.dtype),
        op if op.is_view() => graph_konst(g, n.inputs[0]),
        _ => None,
    }
}

/// Whether some rule (or constant folding) may fire at node `id` of a primitive graph, whose
/// identical nodes are merged by `rep` (see `region::cse`). Every rule's left-hand side passes
/// this look at the node and its operands, so the e-graph is only built around such nodes; a
/// rule added above needs its trigger here.
pub fn may_fire(g: &Graph, id: NodeId, rep: &[usize]) -> bool {
    let n = g.node(id);
    if n.op.is_leaf() {
        return false;
    }
    let same = |a: NodeId, b: NodeId| rep[a.0] == rep[b.0];
    let k = |i: usize| graph_konst(g, n.inputs[i]);
    let arg = |i: usize| &g.node(n.inputs[i]).op;
    // Constant folding: a pointwise op on constants, a view of a constant.
    if (n.op.is_pointwise() || n.op.is_view()) && (0..n.inputs.len()).all(|i| k(i).is_some()) {
        return true;
    }
    let is = |k: Option<Konst>, v: f64| k.is_some_and(|k| k.as_f64() == v);
    let scaled = |i: usize| {
        matches!(arg(i), Op::Binary(BinaryOp::Mul)) && {
            let m = g.node(n.inputs[i]);
            graph_konst(g, m.inputs[0]).is_some() || graph_konst(g, m.inputs[1]).is_some()
        }
    };
    match &n.op {
        Op::Binary(op) => match op {
            BinaryOp::Maximum
            | BinaryOp::Minimum
            | BinaryOp::LogicalAnd
            | BinaryOp::LogicalOr
            | BinaryOp::BitwiseAnd
            | BinaryOp::BitwiseOr => same(n.inputs[0], n.inputs[1]),
            BinaryOp::Mul => (0..2).any(|i| is(k(i), 1.0) || is(k(i), 0.0)),
            BinaryOp::Div | BinaryOp::Pow => is(k(1), 1.0),
            BinaryOp::Add => (0..2).any(|i| is(k(i), 0.0)),
            BinaryOp::Sub => is(k(1), 0.0),
            _ => false,
        },
        Op::Unary(UnaryOp::Neg | UnaryOp::LogicalNot | UnaryOp::BitwiseNot) => arg(0) == &n.op,
        Op::Where => same(n.inputs[1], n.inputs[2]) || k(0).is_some(),
        Op::Cast(t) => matches!(arg(0), Op::Cast(_)) || g.meta(n.inputs[0]).dtype == *t,
        Op::Reshape { shape } | Op::Expand { shape } => {
            shape == &g.meta(n.inputs[0]).shape || std::mem::discriminant(arg(0)) == std::mem::discriminant(&n.op)
        }
        Op::Permute { perm } => {
            perm.iter().enumerate().all(|(i, &p)| i == p)
                || matches!(arg(0), Op::Permute { .. })
                || (is_batched_transpose(perm) && matches!(arg(0), Op::Bmm))
        }
        Op::Slice { dim, start, len, step } => {
            (*start == 0 && *step == 1 && g.meta(n.inputs[0]).shape[*dim] == *len) || matches!(arg(0), Op::Slice { .. })
        }
        Op::Bmm => (0..2).any(|i| matches!(arg(i), Op::Bmm) || scaled(i)),
        Op::Reduce { .. } => scaled(0),
        _ => false,
    }
}

// ---- running rules in egg ----

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

impl Rule {
    /// The proposals for a class: well-typed, of the class's meta, and not the class itself.
    fn matches(&self, eg: &EG, class: &egg::EClass<ENode, Data>, out: &mut Vec<SearchMatches<'static, ENode>>) {
        let id = class.id;
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
}

impl Searcher<ENode, Facts> for Rule {
    fn search_eclass_with_limit(&self, eg: &EG, eclass: Id, limit: usize) -> Option<SearchMatches<'_, ENode>> {
        let mut out = Vec::new();
        self.matches(eg, &eg[eclass], &mut out);
        out.truncate(limit);
        out.into_iter().next()
    }

    /// Classes in the e-graph's own order (insertion order, with egg's `deterministic`
    /// feature), so proposals and new ids come in the same order every run.
    fn search_with_limit(&self, eg: &EG, limit: usize) -> Vec<SearchMatches<'_, ENode>> {
        let mut out = Vec::new();
        for class in eg.classes() {
            self.matches(eg, class, &mut out);
            if out.len() >= limit {
                out.truncate(limit);
                break;
            }
        }
        out
    }

    fn vars(&self) -> Vec<Var> {
        vec![]
    }
}

impl Applier<ENode, Facts> for Rule {
    /// Instantiates each proposal and unions it with its class; returns the classes changed.
    fn apply_matches(&self, eg: &mut EG, matches: &[SearchMatches<ENode>], _: Symbol) -> Vec<Id> {
        let mut changed = Vec::new();
        for m in matches {
            let (Some(ast), Some(subst)) = (&m.ast, m.substs.first()) else { continue };
            let new = eg.add_instantiation(ast, subst);
            if eg.union(m.eclass, new) {
                changed.push(new);
            }
        }
        changed
    }

    fn apply_one(&self, _: &mut EG, _: Id, _: &Subst, _: Option<&PatternAst<ENode>>, _: Symbol) -> Vec<Id> {
        unreachable!("rules apply through apply_matches")
    }
}

/// The egg rewrites of a stage.
pub fn rewrites(rules: &[Rule]) -> Vec<Rewrite<ENode, Facts>> {
    rules.iter().map(|r| Rewrite::new(r.name, r.clone(), r.clone()).expect("rules bind no variables")).collect()
}

/// A stage: its name and its rewrites.
pub type Stage = (&'static str, Vec<Rewrite<ENode, Facts>>);

/// Whether an algebra rule can match anywhere: they all start at a product, a reduction, or
/// a transpose of a product.
pub fn algebra_may_fire(eg: &EG) -> bool {
    eg.classes().any(|c| c.nodes.iter().any(|n| matches!(n.op, Prim::Bmm | Prim::Reduce { .. })))
}

/// The stages, in order, with their rewrites (made once per process): `simplify`, the rules
/// that only shrink the graph; then `algebra`, whose worth the cost model decides, run with the
/// first stage's rules so that what it builds is simplified too.
pub fn stages() -> &'static [Stage] {
    static STAGES: OnceLock<Vec<Stage>> = OnceLock::new();
    STAGES.get_or_init(|| {
        vec![
            ("simplify", rewrites(&simplify_rules())),
            ("algebra", rewrites(&[algebra_rules(), simplify_rules()].concat())),
        ]
    })
}
