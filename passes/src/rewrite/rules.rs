//! The rewrite rules, in two stages: a table of declarative rules ([`TABLE`]: egg patterns
//! with conditions, see [`super::pattern`]) and the few written in code
//! ([`super::coded`]: rules that read or compute an op's attributes).
//!
//! # Adding a rule
//!
//! * If both sides can be written over ops without attributes (unary and binary ops by their
//!   printed names, `where`, `bmm`), add a line to [`TABLE`]: name, left side, right side, why
//!   it is exact, and `.when(..)` with the condition on the bound classes' dtype, shape or
//!   constant value ([`Binding`]). Each operand order or variant is its own line with the same
//!   name. `.fill("?k", "?s")` makes `?k` a `full` of the matched class's meta holding `?s`'s
//!   constant. Nothing else is needed: the graph-side trigger that picks the e-graph's region
//!   is the same pattern and condition.
//! * Otherwise write a searcher in `coded.rs` with its trigger, and say there why a pattern
//!   cannot express it.
//! * Then list the name in [`simplify_rules`] or [`algebra_rules`] (the order rules run in),
//!   and add a test that it fires and one that its condition blocks it
//!   (`rules_tests.rs`), and a soundness case in the workspace's `tests/rewrite.rs`.
//!
//! Rules left out on purpose, because they are not exact equivalences in floating point:
//! `exp(log x) -> x` and `log(exp x) -> x` (wrong for `x <= 0`, overflow, and not bit-exact
//! even for `x > 0`); `x + 0.0 -> x` (`-0.0 + 0.0` is `+0.0`: only `x + (-0.0)` and `x - 0.0`
//! are identities); `x * 0 -> 0` for floats (NaN, inf); `x - x -> 0` (NaN, inf); turning a
//! hand-written `exp(x) / sum(exp(x))` into the max-subtracted stable form (it changes where
//! results overflow: that is a different function); commutativity and associativity of `+`
//! and `*` (they explode the e-graph and change rounding).

use super::coded::{self, movable_factor, CodedRule};
use super::lang::{ENode, Facts, Konst, Prim, EG};
use super::pattern::{graph_konst, Binding, Decl, PatternRule};
use coil_ir::{DType, Graph, NodeId};
use egg::{Applier, Id, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};
use std::sync::OnceLock;

pub use coded::lossless;

/// A line of [`TABLE`] without a condition.
const fn rule(name: &'static str, lhs: &'static str, rhs: &'static str, why: &'static str) -> Decl {
    Decl { name, lhs, rhs, when: None, fill: None, why }
}

impl Decl {
    /// The line, applied only where `condition` holds.
    const fn when(self, condition: fn(&Binding) -> bool) -> Decl {
        Decl { when: Some(condition), ..self }
    }

    /// The line, with `?k` of the right side a `full` of the matched class's meta holding the
    /// constant of `?s`.
    const fn fill(self, k: &'static str, s: &'static str) -> Decl {
        Decl { fill: Some((k, s)), ..self }
    }
}

fn not_bool(b: &Binding, x: &str) -> bool {
    b.dtype(x) != DType::Bool
}

/// Whether `z` is a zero that `x + z` (or `x - z`) keeps `x` with: any integer zero; for
/// floats only the zero of the given sign (`x + (-0.0)`, `x - (+0.0)`).
fn neutral_zero(b: &Binding, x: &str, z: &str, float_zero: f64) -> bool {
    let t = b.dtype(x);
    match b.konst(z) {
        Some(Konst::I(0)) => t.is_integral() && t != DType::Bool,
        Some(Konst::F(v)) => t.is_float() && v.to_bits() == float_zero.to_bits(),
        _ => false,
    }
}

fn int_zero(b: &Binding, x: &str, z: &str) -> bool {
    let t = b.dtype(x);
    t.is_integral() && t != DType::Bool && matches!(b.konst(z), Some(Konst::I(0)))
}

/// `s`, a constant factor that may move across a product of the matched dtype.
fn movable(b: &Binding, s: &str) -> bool {
    b.konst(s).is_some_and(|k| movable_factor(b.out().dtype, k.as_f64()))
}

/// The declarative rules. Every right side must also have the matched class's shape and
/// dtype (checked on every match), so `?x` on the right implies `x` has them.
#[rustfmt::skip]
pub const TABLE: &[Decl] = &[
    // ---- stage 1: identities and cancellation ----
    rule("mul-one", "(mul ?x ?c)", "?x", "exact for every value, NaN, inf and -0.0 included").when(|b| b.is("?c", 1.0) && not_bool(b, "?x")),
    rule("mul-one", "(mul ?c ?x)", "?x", "the other operand order").when(|b| b.is("?c", 1.0) && not_bool(b, "?x")),
    rule("div-pow-one", "(div ?x ?c)", "?x", "x / 1 is exact for floats, NaN included").when(|b| b.is("?c", 1.0) && b.dtype("?x").is_float()),
    rule("div-pow-one", "(pow ?x ?c)", "?x", "pow(x, 1) is exact for floats, NaN included").when(|b| b.is("?c", 1.0) && b.dtype("?x").is_float()),
    rule("add-zero", "(add ?x ?z)", "?x", "integer 0, or float -0.0 (x + 0.0 turns -0.0 into +0.0)").when(|b| neutral_zero(b, "?x", "?z", -0.0)),
    rule("add-zero", "(add ?z ?x)", "?x", "the other operand order").when(|b| neutral_zero(b, "?x", "?z", -0.0)),
    rule("add-zero", "(sub ?x ?z)", "?x", "integer 0, or float +0.0").when(|b| neutral_zero(b, "?x", "?z", 0.0)),
    rule("mul-zero-int", "(mul ?x ?z)", "?z", "integers only: for floats NaN * 0 and inf * 0 are NaN").when(|b| int_zero(b, "?x", "?z")),
    rule("mul-zero-int", "(mul ?z ?x)", "?z", "the other operand order").when(|b| int_zero(b, "?x", "?z")),
    rule("involution", "(neg (neg ?x))", "?x", "exact, wrapping integers included; bool has no neg").when(|b| not_bool(b, "?x")),
    rule("involution", "(logical_not (logical_not ?x))", "?x", "only of bools (of others it is x != 0)").when(|b| b.dtype("?x") == DType::Bool),
    rule("involution", "(bitwise_not (bitwise_not ?x))", "?x", "exact for integers and bools"),
    rule("idempotent", "(maximum ?x ?x)", "?x", "exact, NaN included"),
    rule("idempotent", "(minimum ?x ?x)", "?x", "exact, NaN included"),
    rule("idempotent", "(logical_and ?x ?x)", "?x", "bools only (the result's dtype must be x's)"),
    rule("idempotent", "(logical_or ?x ?x)", "?x", "bools only (the result's dtype must be x's)"),
    rule("idempotent", "(bitwise_and ?x ?x)", "?x", "exact"),
    rule("idempotent", "(bitwise_or ?x ?x)", "?x", "exact"),
    rule("where-select", "(where ?c ?x ?x)", "?x", "both branches the same value"),
    rule("where-select", "(where ?c ?a ?b)", "?a", "a condition known true").when(|b| b.konst("?c").is_some_and(|k| k.as_f64() != 0.0)),
    rule("where-select", "(where ?c ?a ?b)", "?b", "a condition known false").when(|b| b.is("?c", 0.0)),
    // ---- stage 2: algebra whose worth the cost model decides ----
    rule("bmm-scalar", "(bmm (mul ?a ?s) ?b)", "(mul (bmm ?a ?b) ?k)", "a finite nonzero factor moves across a product (not f16: overflow)").when(|b| movable(b, "?s")).fill("?k", "?s"),
    rule("bmm-scalar", "(bmm (mul ?s ?a) ?b)", "(mul (bmm ?a ?b) ?k)", "the other operand order").when(|b| movable(b, "?s")).fill("?k", "?s"),
    rule("bmm-scalar", "(bmm ?a (mul ?b ?s))", "(mul (bmm ?a ?b) ?k)", "the factor on the right").when(|b| movable(b, "?s")).fill("?k", "?s"),
    rule("bmm-scalar", "(bmm ?a (mul ?s ?b))", "(mul (bmm ?a ?b) ?k)", "the other operand order").when(|b| movable(b, "?s")).fill("?k", "?s"),
    rule("bmm-assoc-right", "(bmm (bmm ?a ?b) ?c)", "(bmm ?a (bmm ?b ?c))", "floats: extraction picks the cheaper order (a low-rank B @ (A @ x))").when(|b| b.dtype("?c").is_float()),
    rule("bmm-assoc-left", "(bmm ?a (bmm ?b ?c))", "(bmm (bmm ?a ?b) ?c)", "floats: the other direction").when(|b| b.dtype("?a").is_float()),
];

/// A rule of a stage: a declarative one, or one written in code.
pub enum Rule {
    /// The lines of [`TABLE`] with one name.
    Pattern(PatternRule),
    /// A searcher written in code.
    Coded(CodedRule),
}

impl Rule {
    /// The rule named `name`: its lines of [`TABLE`], or else the coded rule.
    pub fn named(name: &'static str) -> Rule {
        if TABLE.iter().any(|d| d.name == name) {
            return Rule::Pattern(PatternRule::new(name, TABLE));
        }
        let coded = coded::rules().into_iter().find(|r| r.name == name);
        Rule::Coded(coded.unwrap_or_else(|| panic!("no rule is named {name}")))
    }

    /// The name reported in `rewrites.txt`.
    pub fn name(&self) -> &'static str {
        match self {
            Rule::Pattern(r) => r.name,
            Rule::Coded(r) => r.name,
        }
    }

    /// Whether the rule may fire at graph node `id` (see [`may_fire`]).
    pub fn may_fire(&self, g: &Graph, id: NodeId, rep: &[usize]) -> bool {
        match self {
            Rule::Pattern(r) => r.may_fire(g, id, rep),
            Rule::Coded(r) => r.may_fire(g, id, rep),
        }
    }

    fn search<'a>(&'a self, eg: &EG, id: Id, out: &mut Vec<SearchMatches<'a, ENode>>) {
        match self {
            Rule::Pattern(r) => r.search(eg, id, out),
            Rule::Coded(r) => r.search(eg, id, out),
        }
    }
}

/// The first stage: rules that only ever make the graph smaller.
pub fn simplify_rules() -> Vec<Rule> {
    [
        "mul-one",
        "div-pow-one",
        "add-zero",
        "mul-zero-int",
        "involution",
        "idempotent",
        "where-select",
        "cast-cast",
        "view-identity",
        "view-chain",
    ]
    .into_iter()
    .map(Rule::named)
    .collect()
}

/// The second stage: algebra whose worth the cost model decides (run with the first stage's
/// rules, so what they build is simplified too).
pub fn algebra_rules() -> Vec<Rule> {
    ["bmm-transpose", "bmm-scalar", "reduce-scalar", "bmm-assoc-right", "bmm-assoc-left", "scatter-into-addend"]
        .into_iter()
        .map(Rule::named)
        .collect()
}

/// Names of every rule, stage by stage, then `constant-fold` (done by the analysis) and `cse`
/// (identical nodes merged before the e-graph).
pub fn rule_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = simplify_rules().iter().chain(&algebra_rules()).map(|r| r.name()).collect();
    names.push("constant-fold");
    names.push("cse");
    names
}

/// Whether some rule (or constant folding) may fire at node `id` of a primitive graph, whose
/// identical nodes are merged by `rep` (see `region::cse`): the e-graph is only built around
/// such nodes. A declarative rule's look is its own left side and condition; a coded rule
/// carries its trigger.
pub fn may_fire(g: &Graph, id: NodeId, rep: &[usize]) -> bool {
    static RULES: OnceLock<Vec<Rule>> = OnceLock::new();
    let n = g.node(id);
    if n.op.is_leaf() {
        return false;
    }
    // Constant folding: a pointwise op on constants, a view of a constant.
    if (n.op.is_pointwise() || n.op.is_view()) && n.inputs.iter().all(|&x| graph_konst(g, x).is_some()) {
        return true;
    }
    let rules = RULES.get_or_init(|| simplify_rules().into_iter().chain(algebra_rules()).collect());
    rules.iter().any(|r| r.may_fire(g, id, rep))
}

// ---- running rules in egg ----

impl Searcher<ENode, Facts> for Rule {
    fn search_eclass_with_limit(&self, eg: &EG, eclass: Id, limit: usize) -> Option<SearchMatches<'_, ENode>> {
        let mut out = Vec::new();
        self.search(eg, eclass, &mut out);
        out.truncate(limit);
        out.into_iter().next()
    }

    /// Classes in the e-graph's own order (insertion order, with egg's `deterministic`
    /// feature), so proposals and new ids come in the same order every run.
    fn search_with_limit(&self, eg: &EG, limit: usize) -> Vec<SearchMatches<'_, ENode>> {
        let mut out = Vec::new();
        for class in eg.classes() {
            self.search(eg, class.id, &mut out);
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

/// The applier of every rule, of this pass and of the template stage's e-graph
/// ([`crate::templates`]): each match carries its instantiation (a pattern over the match's
/// substitution), which is added and unioned with the matched class.
pub struct Instantiate;

impl<L: egg::Language, N: egg::Analysis<L>> Applier<L, N> for Instantiate {
    /// Instantiates each proposal and unions it with its class; returns the classes changed.
    fn apply_matches(&self, eg: &mut egg::EGraph<L, N>, matches: &[SearchMatches<L>], _: Symbol) -> Vec<Id> {
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

    fn apply_one(&self, _: &mut egg::EGraph<L, N>, _: Id, _: &Subst, _: Option<&PatternAst<L>>, _: Symbol) -> Vec<Id> {
        unreachable!("rules apply through apply_matches")
    }
}

/// The egg rewrites of a stage.
pub fn rewrites(rules: Vec<Rule>) -> Vec<egg::Rewrite<ENode, Facts>> {
    rules.into_iter().map(|r| Rewrite::new(r.name(), r, Instantiate).expect("rules bind no variables")).collect()
}

/// A stage: its name and its rewrites.
pub type Stage = (&'static str, Vec<Rewrite<ENode, Facts>>);

/// Whether an algebra rule can match anywhere: they all start at a product, a reduction, a
/// transpose of a product, or an add of a scatter.
pub fn algebra_may_fire(eg: &EG) -> bool {
    eg.classes().any(|c| c.nodes.iter().any(|n| matches!(n.op, Prim::Bmm | Prim::Reduce { .. } | Prim::Scatter { .. })))
}

/// The stages, in order, with their rewrites (made once per process): `simplify`, the rules
/// that only shrink the graph; then `algebra`, whose worth the cost model decides, run with the
/// first stage's rules so that what it builds is simplified too.
pub fn stages() -> &'static [Stage] {
    static STAGES: OnceLock<Vec<Stage>> = OnceLock::new();
    STAGES.get_or_init(|| {
        vec![
            ("simplify", rewrites(simplify_rules())),
            ("algebra", rewrites(algebra_rules().into_iter().chain(simplify_rules()).collect())),
        ]
    })
}
