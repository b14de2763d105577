//! Each declarative rule fires where it should, and its condition blocks it where it must
//! (graphs as text; values on random data are checked in the workspace's `tests/rewrite.rs`).

use super::rules::{may_fire, TABLE};
use super::{simplify, RewriteOptions};
use coil_ir::{Graph, NodeId};

/// How often `rule` fired on `text`, a graph whose last node is where it should fire; also
/// checks that the region trigger accepts that node when the rule fired.
fn fired(rule: &str, text: &str) -> usize {
    let g = Graph::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let (out, report) = simplify(&g, &RewriteOptions::default()).unwrap();
    out.verify_primitive().unwrap();
    let count = report.fired(rule);
    let rep: Vec<usize> = (0..g.nodes.len()).collect();
    let last = NodeId(g.nodes.len() - 1);
    assert!(count == 0 || may_fire(&g, last, &rep), "{rule} fired, its trigger missed it:\n{g}");
    count
}

/// A graph of one f32/int/... input `%0` of `dtype[4]`, a constant `%1` of the same meta, and
/// `body` (nodes from `%2`), returning its last node.
fn with_const(dtype: &str, value: &str, body: &str) -> String {
    let last = body.lines().filter(|l| l.contains('=')).count() + 1;
    format!("graph(%0: {dtype}[4]) {{\n %1: {dtype}[4] = full(value={value})\n{body}\n return (%{last})\n}}")
}

#[test]
fn every_rule_of_the_table_parses_and_has_a_reason() {
    for d in TABLE {
        assert!(!d.why.is_empty(), "{}", d.name);
    }
    // Building the stages parses every line (a bad line panics).
    assert_eq!(super::rules::stages().len(), 2);
}

#[test]
fn mul_one() {
    assert_eq!(fired("mul-one", &with_const("f32", "1.0", " %2 = mul(%0, %1)")), 1);
    assert_eq!(fired("mul-one", &with_const("i32", "1", " %2 = mul(%1, %0)")), 1);
    assert_eq!(fired("mul-one", &with_const("bool", "true", " %2 = mul(%0, %1)")), 0, "bool");
}

#[test]
fn div_pow_one() {
    assert_eq!(fired("div-pow-one", &with_const("f32", "1.0", " %2 = div(%0, %1)")), 1);
    assert_eq!(fired("div-pow-one", &with_const("f64", "1.0", " %2 = pow(%0, %1)")), 1);
    assert_eq!(fired("div-pow-one", &with_const("f32", "1.0", " %2 = div(%1, %0)")), 0, "1 / x");
    assert_eq!(fired("div-pow-one", &with_const("i32", "1", " %2 = pow(%0, %1)")), 0, "integers");
}

#[test]
fn add_zero() {
    assert_eq!(fired("add-zero", &with_const("f32", "-0.0", " %2 = add(%0, %1)")), 1);
    assert_eq!(fired("add-zero", &with_const("i64", "0", " %2 = add(%1, %0)")), 1);
    assert_eq!(fired("add-zero", &with_const("f32", "0.0", " %2 = sub(%0, %1)")), 1);
    assert_eq!(fired("add-zero", &with_const("f32", "0.0", " %2 = add(%0, %1)")), 0, "x + 0.0");
    assert_eq!(fired("add-zero", &with_const("f32", "-0.0", " %2 = sub(%0, %1)")), 0, "x - (-0.0)");
}

#[test]
fn mul_zero_int() {
    assert_eq!(fired("mul-zero-int", &with_const("i32", "0", " %2 = mul(%0, %1)")), 1);
    assert_eq!(fired("mul-zero-int", &with_const("i64", "0", " %2 = mul(%1, %0)")), 1);
    assert_eq!(fired("mul-zero-int", &with_const("f32", "0.0", " %2 = mul(%0, %1)")), 0, "floats");
}

#[test]
fn involution() {
    let twice = |t: &str, op: &str| format!("graph(%0: {t}[4]) {{\n %1 = {op}(%0)\n %2 = {op}(%1)\n return (%2)\n}}");
    assert_eq!(fired("involution", &twice("f32", "neg")), 1);
    assert_eq!(fired("involution", &twice("bool", "logical_not")), 1);
    assert_eq!(fired("involution", &twice("i16", "bitwise_not")), 1);
    assert_eq!(fired("involution", &twice("f32", "logical_not")), 0, "not of a float is x == 0");
}

#[test]
fn idempotent() {
    let same = |t: &str, op: &str| format!("graph(%0: {t}[4]) {{\n %1 = {op}(%0, %0)\n return (%1)\n}}");
    for (t, op) in [
        ("f32", "maximum"),
        ("f32", "minimum"),
        ("bool", "logical_and"),
        ("bool", "logical_or"),
        ("i32", "bitwise_and"),
        ("u8", "bitwise_or"),
    ] {
        assert_eq!(fired("idempotent", &same(t, op)), 1, "{op}");
    }
    assert_eq!(fired("idempotent", &same("f32", "logical_and")), 0, "a bool of a float");
    let two = "graph(%0: f32[4], %1: f32[4]) {\n %2 = maximum(%0, %1)\n return (%2)\n}";
    assert_eq!(fired("idempotent", two), 0, "two values");
}

#[test]
fn where_select() {
    let pick = |c: &str| {
        format!(
            "graph(%0: f32[4], %1: f32[4]) {{\n %2: bool[4] = full(value={c})\n %3 = where(%2, %0, %1)\n return (%3)\n}}"
        )
    };
    assert_eq!(fired("where-select", &pick("true")), 1);
    assert_eq!(fired("where-select", &pick("false")), 1);
    let same = "graph(%0: bool[4], %1: f32[4]) {\n %2 = where(%0, %1, %1)\n return (%2)\n}";
    assert_eq!(fired("where-select", same), 1);
    let unknown = "graph(%0: bool[4], %1: f32[4], %2: f32[4]) {\n %3 = where(%0, %1, %2)\n return (%3)\n}";
    assert_eq!(fired("where-select", unknown), 0, "a condition not known");
}

/// `a @ (b * s)` and `(s * a) @ b` of `dtype`, `s` the constant `value`.
fn scaled_product(dtype: &str, value: &str, left: bool) -> String {
    let (mul, mm) = if left { ("mul(%3, %0)", "bmm(%4, %1)") } else { ("mul(%1, %3)", "bmm(%0, %4)") };
    format!(
        "graph(%0: {dtype}[4, 8], %1: {dtype}[8, 2]) {{\n %3: {dtype}[{}] = full(value={value})\n %4 = {mul}\n %5 = {mm}\n return (%5)\n}}",
        if left { "4, 8" } else { "8, 2" }
    )
}

#[test]
fn bmm_scalar() {
    assert!(fired("bmm-scalar", &scaled_product("f32", "0.125", true)) >= 1);
    assert!(fired("bmm-scalar", &scaled_product("bf16", "3.0", false)) >= 1);
    assert_eq!(fired("bmm-scalar", &scaled_product("f16", "0.125", true)), 0, "f16 may overflow");
    assert_eq!(fired("bmm-scalar", &scaled_product("f32", "inf", false)), 0, "not finite");
}

#[test]
fn bmm_assoc() {
    let chain = |t: &str| {
        format!(
            "graph(%0: {t}[2, 3], %1: {t}[3, 4], %2: {t}[4, 5]) {{\n %3 = bmm(%0, %1)\n %4 = bmm(%3, %2)\n return (%4)\n}}"
        )
    };
    assert!(fired("bmm-assoc-right", &chain("f32")) >= 1);
    assert_eq!(fired("bmm-assoc-right", &chain("i64")), 0, "integers");
    let right =
        "graph(%0: f32[2, 3], %1: f32[3, 4], %2: f32[4, 5]) {\n %3 = bmm(%1, %2)\n %4 = bmm(%0, %3)\n return (%4)\n}";
    assert!(fired("bmm-assoc-left", right) >= 1);
    assert_eq!(fired("bmm-assoc-left", &right.replace("f32", "i32")), 0, "integers");
}

/// `y + scatter(fill, index, src)` of `dtype` (`op` the scatter's name), the sum's operands in
/// the given order.
fn scattered_sum(dtype: &str, fill: &str, op: &str, scatter_first: bool) -> String {
    let add = if scatter_first { "add(%4, %0)" } else { "add(%0, %4)" };
    format!(
        "graph(%0: {dtype}[5, 4], %1: i64[6, 4], %2: {dtype}[6, 4]) {{\n %3: {dtype}[5, 4] = full(value={fill})\n %4 = {op}(%3, %1, %2, dim=0)\n %5 = {add}\n return (%5)\n}}"
    )
}

#[test]
fn scatter_into_addend() {
    let rule = "scatter-into-addend";
    assert_eq!(fired(rule, &scattered_sum("f32", "0.0", "scatter_add", false)), 1);
    assert_eq!(fired(rule, &scattered_sum("f32", "-0.0", "scatter_add", true)), 1);
    assert_eq!(fired(rule, &scattered_sum("bf16", "0.0", "scatter_add", true)), 1);
    assert_eq!(fired(rule, &scattered_sum("i64", "0", "scatter_add", false)), 1);
    assert_eq!(fired(rule, &scattered_sum("f32", "1.0", "scatter_add", false)), 0, "a fill that is not zero");
    assert_eq!(fired(rule, &scattered_sum("f32", "0.0", "scatter", false)), 0, "the last write wins");
    assert_eq!(fired(rule, &scattered_sum("f32", "0.0", "scatter_amax", false)), 0, "max");
    // A scatter that is read elsewhere too would have to run twice: the add is cheaper.
    let g = Graph::parse(&scattered_sum("f32", "0.0", "scatter_add", false).replace("return (%5)", "return (%5, %4)"))
        .unwrap();
    let (out, report) = simplify(&g, &RewriteOptions::default()).unwrap();
    assert_eq!(report.fired(rule), 1);
    assert!(!report.accepted, "{out}");
}
