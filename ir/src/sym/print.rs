//! Printing expressions: the readable form (`Display`) and C (`Expr::to_c`).

use super::*;

// ---------------------------------------------------------------------------------------------
// Printing

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Prec {
    Sum,  // a + b, -x, negative constants
    Prod, // a*b, a//b, a % b
    Atom, // names, non-negative constants, calls
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Style {
    Math,
    C,
}

fn wrap(e: Expr, need: Prec, st: Style) -> String {
    let (s, p) = render(e, st);
    if p < need {
        format!("({s})")
    } else {
        s
    }
}

/// `k*f1*f2...`; a lone factor keeps `Prod` unless it follows a unary minus (`-(x//4)`, since
/// `-x//4` would mean `(-x)//4`).
fn product_str(k: u64, factors: &[Expr], after_neg: bool, st: Style) -> String {
    if k == 1 && factors.len() == 1 {
        return wrap(factors[0], if after_neg { Prec::Atom } else { Prec::Prod }, st);
    }
    let mut parts: Vec<String> = (k != 1).then(|| k.to_string()).into_iter().collect();
    parts.extend(factors.iter().map(|&f| wrap(f, Prec::Atom, st)));
    parts.join("*")
}

pub(super) fn render(e: Expr, st: Style) -> (String, Prec) {
    let call = |name: &str, a: Expr, b: Expr| (format!("{name}({}, {})", render(a, st).0, render(b, st).0), Prec::Atom);
    let plain = |a: Expr, b: Expr| st == Style::Math || (a.is_known_nonnegative() && b.is_known_positive());
    let binop = |op: &str, a: Expr, b: Expr| {
        (format!("{}{op}{}", wrap(a, Prec::Atom, st), wrap(b, Prec::Atom, st)), Prec::Prod)
    };
    match &*e.kind() {
        ExprKind::Const(i64::MIN) if st == Style::C => ("INT64_MIN".into(), Prec::Atom),
        ExprKind::Const(c) => (c.to_string(), if *c < 0 { Prec::Sum } else { Prec::Atom }),
        ExprKind::Symbol(s) => (s.name.clone(), Prec::Atom),
        ExprKind::Add { terms, constant } => {
            let mut out = String::new();
            for (i, &(t, c)) in terms.iter().enumerate() {
                out += match (i, c < 0) {
                    (0, false) => "",
                    (0, true) => "-",
                    (_, false) => " + ",
                    (_, true) => " - ",
                };
                let factors = match &*t.kind() {
                    ExprKind::Mul { factors, .. } => factors.clone(), // coefficient is 1 in a sum
                    _ => vec![t],
                };
                out += &product_str(c.unsigned_abs(), &factors, i == 0 && c < 0, st);
            }
            if *constant != 0 {
                out += &format!(" {} {}", if *constant < 0 { '-' } else { '+' }, constant.unsigned_abs());
            }
            (out, Prec::Sum)
        }
        ExprKind::Mul { coeff, factors } => {
            let s = product_str(coeff.unsigned_abs(), factors, *coeff < 0, st);
            if *coeff < 0 {
                (format!("-{s}"), Prec::Sum)
            } else {
                (s, Prec::Prod)
            }
        }
        ExprKind::FloorDiv(a, b) => match st {
            Style::Math => binop("//", *a, *b),
            Style::C if plain(*a, *b) => binop(" / ", *a, *b),
            Style::C => call("coil_floordiv", *a, *b),
        },
        ExprKind::Mod(a, b) if plain(*a, *b) => binop(" % ", *a, *b),
        ExprKind::Mod(a, b) => call("coil_mod", *a, *b),
        ExprKind::Min(a, b) => call(if st == Style::C { "coil_min" } else { "min" }, *a, *b),
        ExprKind::Max(a, b) => call(if st == Style::C { "coil_max" } else { "max" }, *a, *b),
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&render(*self, Style::Math).0)
    }
}

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Expr({self})")
    }
}
