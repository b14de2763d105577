//! The template rules: a table of egg patterns over the composite-level language
//! ([`super::lang`]), each with a condition written in Rust on the classes its variables bound.
//!
//! Attention is matched in steps that each add one virtual `scores` node to a class of the
//! written-out chain, so that the scale, the mask and the cast to f32 may come in any order,
//! each at most once (its slot of `scores` must still be `one`, `nomask`, `narrow`):
//!
//! ```text
//! attention-scores      (matmul ?q (transpose ?k))                       => (scores ?q ?k one nomask narrow)
//! attention-scale       (mul (scores ?q ?k one ?m ?w) ?c), (mul ?c ..)   => (scores ?q ?k ?c ?m ?w)
//!                       (div (scores ?q ?k one ?m ?w) ?c)                => (scores ?q ?k (inv ?c) ?m ?w)
//! attention-causal      (where ?keep (scores ?q ?k ?c nomask ?w) ?x)     => (scores ?q ?k ?c causal ?w)
//!                       (where ?drop ?x (scores ?q ?k ?c nomask ?w))     => (scores ?q ?k ?c causal ?w)
//! attention-f32-softmax (cast_f32 (scores ?q ?k ?c ?m narrow))           => (scores ?q ?k ?c ?m wide)
//! attention             (matmul (softmax (scores ?q ?k ?c ?m narrow)) ?v) => (attention ?q ?k ?v ?c ?m)
//!                       (matmul (cast_T (softmax (scores ?q ?k ?c ?m wide))) ?v), T = f16, bf16
//! ```
//!
//! The conditions are code because they read what patterns cannot: the scale's constant value
//! (finite), the `-inf` of a mask's other branch, the causal mask's *structure* (which elements
//! of its last two dims it keeps: [`Pattern`], read from the graph nodes that compute it, since
//! `tril(ones)`, `iota(col) <= iota(row)` and their negations, views and casts all mean the
//! same mask), the dtypes of an f32 softmax, and what the template supports
//! ([`crate::attention::template_supports`]). Every right side is type-checked against the
//! matched class ([`super::lang::infer_meta`]): a step fires only where the class has exactly
//! the scores' shape and dtype (`[.., L, S]` of q's dtype, f32 between the casts), which is how
//! a broadcasting mask or a promoting constant is refused.
//!
//! Adding a rule (a GEMM epilogue, online softmax, ...): its language ops in `lang.rs` (a graph op
//! normalized so that its attributes are in the op's name), a line here, its name in
//! [`RULES`], and a test that it fires on the graph users write.

use super::lang::{infer_meta, CNode, Data, CEG};
use crate::attention::template_supports;
use crate::rewrite::rules::Instantiate;
use coil_ir::{BinaryOp, DType, Graph, Node, NodeId, Op, UnaryOp};
use egg::{ENodeOrVar, Id, Language, Pattern as EggPattern, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Var};
use std::sync::OnceLock;

/// What a condition may ask about the classes the left side bound.
pub struct Binding<'a> {
    eg: &'a CEG,
    subst: &'a Subst,
}

impl Binding<'_> {
    /// The facts of variable `var` (`"?q"`).
    pub fn data(&self, var: &str) -> &Data {
        let v: Var = var.parse().expect("conditions name pattern variables");
        &self.eg[self.subst[v]].data
    }

    /// The dtype of `var`.
    pub fn dtype(&self, var: &str) -> DType {
        self.data(var).meta.dtype
    }
}

/// A rule's condition.
pub type Condition = fn(&Binding) -> bool;

/// One line of [`TABLE`]: `lhs => rhs if when`, reported as `name`.
pub struct Line {
    /// The name counted in the report (several lines may share one).
    pub name: &'static str,
    /// The left side, in egg's pattern language over [`super::lang`]'s op names.
    pub lhs: &'static str,
    /// The right side.
    pub rhs: &'static str,
    /// The condition on the bound classes.
    pub when: Condition,
    /// Why it holds.
    pub why: &'static str,
}

const fn line(name: &'static str, lhs: &'static str, rhs: &'static str, when: Condition, why: &'static str) -> Line {
    Line { name, lhs, rhs, when, why }
}

/// The scale `?c` (a one-element constant), reciprocal for `div`, is finite.
fn scale(b: &Binding, div: bool) -> bool {
    b.data("?c").konst.is_some_and(|c| if div { (1.0 / c).is_finite() } else { c.is_finite() })
}

/// `?m` keeps (or drops) exactly `col <= row` of the scores' last two dims, and `?x` is `-inf`.
fn causal(b: &Binding, mask: &str, keeps: bool) -> bool {
    let (m, s) = (b.data(mask), b.data("?q"));
    let Some(p) = m.mask else { return false };
    let p = if keeps { p } else { p.not() };
    let (ms, r) = (&m.meta.shape, s.meta.rank());
    let (l, keys) = (s.meta.shape[r - 2], b.data("?k").meta.shape[r - 2]);
    b.data("?x").neg_inf && p == Pattern::AtMost(0) && ms.len() >= 2 && ms[ms.len() - 2..] == [l, keys]
}

/// q, k and v (and so the scores) are what the template runs.
fn supported(b: &Binding) -> bool {
    template_supports(&b.data("?q").meta, &b.data("?k").meta, &b.data("?v").meta).is_ok()
}

/// The template's rules (see the module docs).
#[rustfmt::skip]
pub const TABLE: &[Line] = &[
    line("attention-scores", "(matmul ?q (transpose ?k))", "(scores ?q ?k one nomask narrow)", |b| b.data("?q").meta.rank() >= 2 && b.dtype("?q") == b.dtype("?k"), "q @ k^T are the scores"),
    line("attention-scale", "(mul (scores ?q ?k one ?m ?w) ?c)", "(scores ?q ?k ?c ?m ?w)", |b| scale(b, false), "scores times a finite constant"),
    line("attention-scale", "(mul ?c (scores ?q ?k one ?m ?w))", "(scores ?q ?k ?c ?m ?w)", |b| scale(b, false), "the other operand order"),
    line("attention-scale", "(div (scores ?q ?k one ?m ?w) ?c)", "(scores ?q ?k (inv ?c) ?m ?w)", |b| scale(b, true), "divided: the reciprocal"),
    line("attention-causal", "(where ?keep (scores ?q ?k ?c nomask ?w) ?x)", "(scores ?q ?k ?c causal ?w)", |b| causal(b, "?keep", true), "the causal keep mask, -inf elsewhere"),
    line("attention-causal", "(where ?drop ?x (scores ?q ?k ?c nomask ?w))", "(scores ?q ?k ?c causal ?w)", |b| causal(b, "?drop", false), "masked_fill(dropped, -inf)"),
    line("attention-f32-softmax", "(cast_f32 (scores ?q ?k ?c ?m narrow))", "(scores ?q ?k ?c ?m wide)", |b| matches!(b.dtype("?q"), DType::F16 | DType::BF16), "f16 / bf16 scores cast up for an f32 softmax"),
    line("attention", "(matmul (softmax (scores ?q ?k ?c ?m narrow)) ?v)", "(attention ?q ?k ?v ?c ?m)", supported, "softmax of the scores times v"),
    line("attention", "(matmul (cast_f16 (softmax (scores ?q ?k ?c ?m wide))) ?v)", "(attention ?q ?k ?v ?c ?m)", |b| supported(b) && b.dtype("?q") == DType::F16, "an f32 softmax cast back to f16"),
    line("attention", "(matmul (cast_bf16 (softmax (scores ?q ?k ?c ?m wide))) ?v)", "(attention ?q ?k ?v ?c ?m)", |b| supported(b) && b.dtype("?q") == DType::BF16, "an f32 softmax cast back to bf16"),
];

/// The rule names, in the order they are reported.
pub const RULES: &[&str] =
    &["attention-scores", "attention-scale", "attention-causal", "attention-f32-softmax", "attention"];

/// A [`Line`], its patterns parsed.
struct Alternative {
    lhs: EggPattern<CNode>,
    rhs: PatternAst<CNode>,
    when: Condition,
}

/// The lines of [`TABLE`] with one name, as one egg searcher.
pub struct Rule {
    alternatives: Vec<Alternative>,
}

impl Rule {
    fn new(name: &str) -> Rule {
        let alternatives: Vec<Alternative> = TABLE
            .iter()
            .filter(|l| l.name == name)
            .map(|l| {
                let lhs: EggPattern<CNode> =
                    l.lhs.parse().unwrap_or_else(|e| panic!("rule {name}: `{}`: {e:?}", l.lhs));
                let rhs: EggPattern<CNode> =
                    l.rhs.parse().unwrap_or_else(|e| panic!("rule {name}: `{}`: {e:?}", l.rhs));
                let bound = lhs.vars();
                assert!(
                    rhs.vars().iter().all(|v| bound.contains(v)),
                    "rule {name}: `{}` binds more than `{}`",
                    l.rhs,
                    l.lhs
                );
                Alternative { lhs, rhs: rhs.ast, when: l.when }
            })
            .collect();
        assert!(!alternatives.is_empty(), "rule {name} has no line in the table");
        Rule { alternatives }
    }

    /// The matches of `alt` at class `id` whose condition holds and whose right side has the
    /// class's meta.
    fn search_alt<'a>(alt: &'a Alternative, eg: &CEG, id: Id, out: &mut Vec<SearchMatches<'a, CNode>>) {
        let meta = &eg[id].data.meta;
        let Some(found) = alt.lhs.search_eclass(eg, id) else { return };
        for subst in found.substs {
            if !(alt.when)(&Binding { eg, subst: &subst }) || check(eg, &alt.rhs, &subst).as_ref() != Some(meta) {
                continue;
            }
            out.push(SearchMatches {
                eclass: id,
                substs: vec![subst],
                ast: Some(std::borrow::Cow::Borrowed(&alt.rhs)),
            });
        }
    }
}

/// The meta of an instantiation, or `None` if it does not type-check.
fn check(eg: &CEG, ast: &PatternAst<CNode>, subst: &Subst) -> Option<coil_ir::TensorMeta> {
    let mut facts: Vec<Data> = Vec::with_capacity(ast.as_ref().len());
    for n in ast.as_ref() {
        let d = match n {
            ENodeOrVar::Var(v) => eg[*subst.get(*v)?].data.clone(),
            ENodeOrVar::ENode(e) => {
                let args: Vec<&Data> = e.children().iter().map(|&c| &facts[usize::from(c)]).collect();
                let meta = infer_meta(e.op, &args)?;
                Data {
                    meta,
                    scalar: false,
                    konst: None,
                    neg_inf: false,
                    wide: e.op == super::lang::COp::Wide,
                    node: None,
                    mask: None,
                }
            }
        };
        facts.push(d);
    }
    facts.pop().map(|d| d.meta)
}

impl Searcher<CNode, super::lang::Facts> for Rule {
    fn search_eclass_with_limit(&self, eg: &CEG, eclass: Id, limit: usize) -> Option<SearchMatches<'_, CNode>> {
        let mut out = Vec::new();
        for alt in &self.alternatives {
            Rule::search_alt(alt, eg, eclass, &mut out);
        }
        out.truncate(limit);
        out.into_iter().next()
    }

    /// Each line's left side is looked for only in the classes holding its root op (egg's
    /// index), in the e-graph's insertion order (egg's `deterministic` feature), so matches and
    /// new ids come in the same order every run.
    fn search_with_limit(&self, eg: &CEG, limit: usize) -> Vec<SearchMatches<'_, CNode>> {
        let mut out = Vec::new();
        for alt in &self.alternatives {
            let Some(ENodeOrVar::ENode(root)) = alt.lhs.ast.as_ref().last() else { continue };
            let Some(ids) = eg.classes_for_op(&root.discriminant()) else { continue };
            for id in ids {
                Rule::search_alt(alt, eg, id, &mut out);
                if out.len() >= limit {
                    out.truncate(limit);
                    return out;
                }
            }
        }
        out
    }

    fn vars(&self) -> Vec<Var> {
        vec![]
    }
}

/// The rewrites (made once per process).
pub fn rewrites() -> &'static [Rewrite<CNode, super::lang::Facts>] {
    static REWRITES: OnceLock<Vec<Rewrite<CNode, super::lang::Facts>>> = OnceLock::new();
    REWRITES.get_or_init(|| {
        RULES.iter().map(|&n| Rewrite::new(n, Rule::new(n), Instantiate).expect("rules bind no variables")).collect()
    })
}

// ---- the causal mask's structure, read from the graph ----

/// Which elements of a mask's last two dims (`row`, `col`) are nonzero (true), the same for
/// every leading index.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pattern {
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

/// The value of a one-element constant graph node (`scalar`, or `full` of one element).
fn constant(g: &Graph, n: NodeId) -> Option<f64> {
    match &g.node(n).op {
        Op::Scalar(s) => Some(s.as_f64()),
        Op::Full(s) if g.meta(n).numel() == 1 => Some(s.as_f64()),
        _ => None,
    }
}

/// Which elements of `n`'s last two dims are nonzero, if that follows from its structure:
/// `ones` / `zeros`, `tril` / `triu` of ones, comparisons of the row and column iotas,
/// `logical_not`, `x == 0`, `x != 0`, casts to and of bool, and views that keep the last two
/// dims or take their top-left window (`mask[:T, :T]` of a larger causal mask).
pub fn pattern(g: &Graph, n: NodeId) -> Option<Pattern> {
    let node = g.node(n);
    let rank = g.meta(n).rank();
    let arg = |i: usize| node.inputs[i];
    // The last two dims of an operand are the node's own (views change only leading dims).
    let same_last_two = |x: NodeId| {
        let (a, b) = (&g.meta(x).shape, &g.meta(n).shape);
        a.len() >= 2 && b.len() >= 2 && a[a.len() - 2..] == b[b.len() - 2..]
    };
    match &node.op {
        // `ones` and `zeros` (other values could round to 0 in the dtype).
        Op::Full(v) if v.as_f64() == 1.0 || v.as_f64() == 0.0 => Some(Pattern::Const(v.as_f64() != 0.0)),
        Op::Tril { k } | Op::Triu { k } if rank >= 2 => {
            let tri = if matches!(node.op, Op::Tril { .. }) { Pattern::AtMost(*k) } else { Pattern::Above(*k - 1) };
            match pattern(g, arg(0))? {
                Pattern::Const(true) => Some(tri),
                Pattern::Const(false) => Some(Pattern::Const(false)),
                _ => None,
            }
        }
        Op::Unary(UnaryOp::LogicalNot) => Some(pattern(g, arg(0))?.not()),
        // Casts to bool, and of bool, keep which elements are nonzero (others may not: 0.5 to
        // an integer is 0).
        Op::Cast(to) if *to == DType::Bool || g.meta(arg(0)).dtype == DType::Bool => pattern(g, arg(0)),
        Op::Binary(op @ (BinaryOp::Eq | BinaryOp::Ne)) => {
            let zero = |i: usize| constant(g, node.inputs[i]) == Some(0.0);
            let x = match (zero(0), zero(1)) {
                (false, true) => arg(0),
                (true, false) => arg(1),
                _ => return iota_compare(g, node),
            };
            let p = pattern(g, x)?;
            Some(if *op == BinaryOp::Eq { p.not() } else { p })
        }
        Op::Binary(BinaryOp::Le | BinaryOp::Lt | BinaryOp::Ge | BinaryOp::Gt) => iota_compare(g, node),
        Op::Reshape { .. } | Op::Expand { .. } if same_last_two(arg(0)) => pattern(g, arg(0)),
        Op::Permute { perm } if rank >= 2 && perm[rank - 2] == rank - 2 && perm[rank - 1] == rank - 1 => {
            pattern(g, arg(0))
        }
        // A top-left window keeps `col - row` of every element.
        Op::Slice { dim, start, step, .. } if *dim + 2 < rank || (*start == 0 && *step == 1) => pattern(g, arg(0)),
        _ => None,
    }
}

/// `a <op> b` of the row and column iotas of the last two dims (`iota(col) <= iota(row)` is
/// the causal keep mask the decomposition itself builds).
fn iota_compare(g: &Graph, node: &Node) -> Option<Pattern> {
    let Op::Binary(op) = node.op else { return None };
    // +1 for the column index, -1 for the row index.
    let axis = |x: NodeId| match g.node(x).op {
        Op::Iota { dim } => {
            let r = g.meta(x).rank();
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
