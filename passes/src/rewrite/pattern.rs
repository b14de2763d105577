//! Declarative rules: an egg [`Pattern`] on each side, and a condition on what the left side
//! bound.
//!
//! A rule is written as text in the table of [`super::rules`], in egg's pattern language over
//! this pass's ops (the names graphs print: `mul`, `neg`, `where`, `bmm`, ...):
//!
//! ```text
//! "mul-one": (mul ?x ?c) => ?x   if c is 1 and x is not bool
//! ```
//!
//! A [`Decl`] holds one left side (a rule with several, such as both operand orders of `mul`,
//! is several `Decl`s of one name), one right side, an optional condition on the facts of
//! the classes the variables bound ([`Binding`]: shape, dtype, constant value), and optionally
//! a *fill* variable: `?k` on the right stands for a new `full` of the matched class's shape
//! and dtype holding the constant of another variable (`x * s` moved across a product keeps
//! `s` but needs it at the product's shape).
//!
//! Matching is egg's (its compiled pattern machine); the condition is checked while
//! searching, on the clean e-graph, as egg's `ConditionalApplier` would check it before
//! applying. Every right side is type-checked against the matched class with the inference
//! graphs use ([`infer_meta`]), so a rule can never change a class's shape or dtype: a
//! variable-only right side (`?x`) therefore also requires `x` to have the class's meta.
//!
//! The same left side and condition also decide, on the graph, whether a rule may fire at a
//! node ([`PatternRule::may_fire`]): that picks the region the e-graph is built around, so
//! there is no hand-kept list of triggers to keep in step with the rules.

use super::lang::{infer_meta, ENode, Konst, Ordered, Prim, EG};
use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, TensorMeta, UnaryOp};
use egg::{ENodeOrVar, FromOp, Id, Language, Pattern, PatternAst, RecExpr, SearchMatches, Searcher, Subst, Var};
use std::borrow::Cow;

impl FromOp for ENode {
    type Error = String;

    /// The ops patterns may name: those without attributes (unary and binary ops by their
    /// printed names, `where`, `bmm`). An op with attributes (a cast's dtype, a permute's
    /// perm) would match only one value of them, so rules over those are written in code.
    fn from_op(op: &str, args: Vec<Id>) -> Result<ENode, String> {
        let (prim, arity) = if let Some(u) = UnaryOp::ALL.into_iter().find(|u| u.name() == op) {
            (Prim::Unary(Ordered(u)), 1)
        } else if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.name() == op) {
            (Prim::Binary(Ordered(b)), 2)
        } else {
            match op {
                "where" => (Prim::Where, 3),
                "bmm" => (Prim::Bmm, 2),
                _ => return Err(format!("`{op}` is not an op rewrite patterns can name")),
            }
        };
        if args.len() != arity {
            return Err(format!("`{op}` takes {arity} operands, not {}", args.len()));
        }
        Ok(ENode::new(prim, args))
    }
}

/// What a rule's condition may ask about the classes (or graph nodes) its variables bound.
pub struct Binding<'a> {
    at: At<'a>,
    /// The matched class's (node's) meta.
    out: &'a TensorMeta,
}

/// Where the bound values live.
enum At<'a> {
    /// In the e-graph, by class.
    Classes(&'a EG, &'a Subst),
    /// In a graph, by node (reading constants as [`graph_konst`] does).
    Nodes(&'a Graph, &'a [(Var, NodeId)]),
}

impl Binding<'_> {
    fn fact(&self, var: &str) -> (&TensorMeta, Option<Konst>) {
        let v: Var = var.parse().expect("conditions name pattern variables");
        match self.at {
            At::Classes(eg, subst) => {
                let data = &eg[subst[v]].data;
                (&data.meta, data.konst)
            }
            At::Nodes(g, bound) => {
                let &(_, n) = bound.iter().find(|(w, _)| *w == v).expect("conditions name bound variables");
                (g.meta(n), graph_konst(g, n))
            }
        }
    }

    /// The shape and dtype of variable `var` (`"?x"`).
    pub fn meta(&self, var: &str) -> &TensorMeta {
        self.fact(var).0
    }

    /// The dtype of `var`.
    pub fn dtype(&self, var: &str) -> DType {
        self.fact(var).0.dtype
    }

    /// The value every element of `var` holds, when it is a known constant.
    pub fn konst(&self, var: &str) -> Option<Konst> {
        self.fact(var).1
    }

    /// Whether `var` is the constant `value` (compared as numbers: `-0.0` is `0.0`).
    pub fn is(&self, var: &str, value: f64) -> bool {
        self.konst(var).is_some_and(|k| k.as_f64() == value)
    }

    /// The matched class's shape and dtype.
    pub fn out(&self) -> &TensorMeta {
        self.out
    }
}

/// A rule's condition.
pub type Condition = fn(&Binding) -> bool;

/// One line of the rule table: `lhs => rhs if when`, reported as `name`.
#[derive(Clone, Copy)]
pub struct Decl {
    /// The name reported in `rewrites.txt` (several lines may share one).
    pub name: &'static str,
    /// The left side, in egg's pattern language.
    pub lhs: &'static str,
    /// The right side, over the left side's variables (and the fill variable).
    pub rhs: &'static str,
    /// The condition on the bound classes, if any.
    pub when: Option<Condition>,
    /// `(k, s)`: variable `k` of the right side is a `full` of the matched class's meta holding
    /// the constant of `s`.
    pub fill: Option<(&'static str, &'static str)>,
    /// Why the rewrite is exact (or where extraction decides its worth).
    pub why: &'static str,
}

/// A [`Decl`], its patterns parsed.
struct Alternative {
    lhs: Pattern<ENode>,
    rhs: PatternAst<ENode>,
    when: Option<Condition>,
    fill: Option<(Var, Var)>,
}

/// A declarative rule: every line of the table that has its name, tried in table order.
pub struct PatternRule {
    /// The rule's name.
    pub name: &'static str,
    alternatives: Vec<Alternative>,
}

fn parse_var(v: &str) -> Var {
    v.parse().unwrap_or_else(|e| panic!("`{v}` is not a pattern variable: {e}"))
}

impl PatternRule {
    /// The rule named `name`, from the lines of `table` that have that name. Panics on a
    /// line that does not parse or binds on the right what the left does not (a bug in the
    /// table, caught by the tests of every rule).
    pub fn new(name: &'static str, table: &[Decl]) -> PatternRule {
        let alternatives: Vec<Alternative> = table
            .iter()
            .filter(|d| d.name == name)
            .map(|d| {
                let lhs: Pattern<ENode> =
                    d.lhs.parse().unwrap_or_else(|e| panic!("rule {name}: left side `{}`: {e:?}", d.lhs));
                let rhs: Pattern<ENode> =
                    d.rhs.parse().unwrap_or_else(|e| panic!("rule {name}: right side `{}`: {e:?}", d.rhs));
                let fill = d.fill.map(|(k, s)| (parse_var(k), parse_var(s)));
                let bound = lhs.vars();
                for v in rhs.vars() {
                    assert!(
                        bound.contains(&v) || fill.is_some_and(|(k, _)| k == v),
                        "rule {name}: `{v}` of `{}` is not bound by `{}`",
                        d.rhs,
                        d.lhs
                    );
                }
                Alternative { lhs, rhs: rhs.ast, when: d.when, fill }
            })
            .collect();
        assert!(!alternatives.is_empty(), "rule {name} has no line in the table");
        PatternRule { name, alternatives }
    }

    /// The proposals for class `id`: the right side of each alternative whose left side
    /// matches and whose condition holds, well-typed, of the class's meta, and not the class
    /// itself; each with its instantiation (the right side, fills made concrete).
    pub fn search<'a>(&'a self, eg: &EG, id: Id, out: &mut Vec<SearchMatches<'a, ENode>>) {
        let meta = &eg[id].data.meta;
        for alt in &self.alternatives {
            let Some(found) = alt.lhs.search_eclass(eg, id) else { continue };
            for subst in found.substs {
                let binding = Binding { at: At::Classes(eg, &subst), out: meta };
                if alt.when.is_some_and(|when| !when(&binding)) {
                    continue;
                }
                let ast = match alt.fill {
                    None => Cow::Borrowed(&alt.rhs),
                    Some((k, s)) => {
                        let Some(value) = eg[subst[s]].data.konst else { continue };
                        let full = ENode::new(Prim::full(value, meta), vec![]);
                        let nodes = alt.rhs.as_ref().iter().map(|n| match n {
                            ENodeOrVar::Var(v) if *v == k => ENodeOrVar::ENode(full.clone()),
                            n => n.clone(),
                        });
                        Cow::Owned(nodes.collect::<Vec<_>>().into())
                    }
                };
                if let [ENodeOrVar::Var(v)] = ast.as_ref().as_ref() {
                    if eg.find(subst[*v]) == id {
                        continue;
                    }
                }
                if check(eg, &ast, &subst).as_ref() != Some(meta) {
                    continue;
                }
                out.push(SearchMatches { eclass: id, substs: vec![subst], ast: Some(ast) });
            }
        }
    }

    /// Whether some alternative matches graph node `id` and its condition holds there (the
    /// graph's identical nodes merged by `rep`, constants read as [`graph_konst`] does).
    pub fn may_fire(&self, g: &Graph, id: NodeId, rep: &[usize]) -> bool {
        let mut bound = Vec::new();
        self.alternatives.iter().any(|alt| {
            bound.clear();
            let ast = alt.lhs.ast.as_ref();
            match_node(ast, ast.len() - 1, g, id, rep, &mut bound)
                && same_meta_as_var(&alt.rhs, g, id, &bound)
                && alt.when.is_none_or(|when| when(&Binding { at: At::Nodes(g, &bound), out: g.meta(id) }))
        })
    }
}

/// Whether a right side that is one variable (`?x`) has the meta of the matched node, as
/// the type check of every match requires (other right sides are checked in the e-graph).
fn same_meta_as_var(rhs: &PatternAst<ENode>, g: &Graph, id: NodeId, bound: &[(Var, NodeId)]) -> bool {
    match rhs.as_ref() {
        [ENodeOrVar::Var(v)] => bound.iter().find(|(w, _)| w == v).is_none_or(|&(_, n)| g.meta(n) == g.meta(id)),
        _ => true,
    }
}

/// Whether pattern node `at` of `ast` matches graph node `id`, binding variables to nodes (a
/// variable bound twice needs identical nodes).
fn match_node(
    ast: &[ENodeOrVar<ENode>],
    at: usize,
    g: &Graph,
    id: NodeId,
    rep: &[usize],
    bound: &mut Vec<(Var, NodeId)>,
) -> bool {
    match &ast[at] {
        ENodeOrVar::Var(v) => match bound.iter().find(|(w, _)| w == v) {
            Some(&(_, n)) => rep[n.0] == rep[id.0],
            None => {
                bound.push((*v, id));
                true
            }
        },
        ENodeOrVar::ENode(e) => {
            let node = g.node(id);
            // Pattern ops have no attributes: their graph op is cheap to make.
            e.op.to_op().0 == node.op
                && e.args.len() == node.inputs.len()
                && e.children()
                    .iter()
                    .zip(&node.inputs)
                    .all(|(&c, &x)| match_node(ast, usize::from(c), g, NodeId(rep[x.0]), rep, bound))
        }
    }
}

/// The constant every element of graph node `id` holds: a `full`, or a view of one.
pub fn graph_konst(g: &Graph, id: NodeId) -> Option<Konst> {
    let n = g.node(id);
    match &n.op {
        Op::Full(v) => Konst::of(*v, n.meta.dtype),
        op if op.is_view() => graph_konst(g, n.inputs[0]),
        _ => None,
    }
}

/// The meta of an instantiation, or `None` if it does not type-check.
fn check(eg: &EG, ast: &RecExpr<ENodeOrVar<ENode>>, subst: &Subst) -> Option<TensorMeta> {
    let mut metas: Vec<TensorMeta> = Vec::with_capacity(ast.as_ref().len());
    for n in ast.as_ref() {
        let meta = match n {
            ENodeOrVar::Var(v) => eg[*subst.get(*v)?].data.meta.clone(),
            ENodeOrVar::ENode(e) => {
                let args: Vec<&TensorMeta> = e.children().iter().map(|&c| &metas[usize::from(c)]).collect();
                infer_meta(&e.op, &args).ok()?
            }
        };
        metas.push(meta);
    }
    metas.pop()
}
