//! Tests of the symbolic algebra: every rule, printing, and a property test against an
//! unsimplified reference evaluator.
use super::*;

fn x() -> Expr {
    Expr::index("x0", 64)
}
fn y() -> Expr {
    Expr::index("x1", 16)
}
fn b() -> Expr {
    Expr::symbol("b", Some(-5), Some(5))
}
fn s() -> Expr {
    Expr::size("s0")
}
fn k(v: i64) -> Expr {
    Expr::int(v)
}

#[test]
fn constants_fold_with_floor_semantics() {
    assert_eq!(k(3) + 4, k(7));
    assert_eq!(k(-7).floor_div(2), k(-4));
    assert_eq!(k(7).floor_div(-2), k(-4));
    assert_eq!(k(-7).modulo(2), k(1));
    assert_eq!(k(7).modulo(-2), k(-1));
    assert_eq!((k(3).min(-2), k(3).max(-2)), (k(-2), k(3)));
    assert_eq!(k(i64::MIN).modulo(-1), k(0));
}

#[test]
fn identities() {
    let (x, b) = (x(), b());
    assert_eq!(x + 0, x);
    assert_eq!(x * 1, x);
    assert_eq!(x * k(0), k(0));
    assert_eq!(x - x, k(0));
    assert_eq!(x.floor_div(1), x);
    assert_eq!(x.modulo(1), k(0));
    assert_eq!(b.floor_div(-1), -b);
    assert_eq!(b.floor_div(b), k(1));
    assert_eq!(b.modulo(b), k(0));
}

#[test]
fn like_terms_collect_and_products_expand() {
    let (x, y, b) = (x(), y(), b());
    let e = 2 * y + 3 * b + x + y + 5 - x * 2;
    assert_eq!(e.to_string(), "3*b - x0 + 3*x1 + 5");
    assert_eq!(e, 5 + 3 * y - x + b * 3);
    assert_eq!((x * y + y * x).to_string(), "2*x0*x1");
    assert_eq!(((x + 1) * (x - 1)).to_string(), "x0*x0 - 1");
    assert_eq!(((b + 2) * 3).to_string(), "3*b + 6");
    assert_eq!([x, y, x].into_iter().sum::<Expr>(), 2 * x + y);
    assert_eq!([x, k(2), y].into_iter().product::<Expr>().to_string(), "2*x0*x1");
}

#[test]
fn floor_div_rules() {
    let (x, y, b, s) = (x(), y(), b(), s());
    assert_eq!((4 * x + b).floor_div(4).to_string(), "x0 + b//4");
    assert_eq!((4 * x + 9).floor_div(4).to_string(), "x0 + 2"); // 9 = 4*2 + 1, 1//4 = 0
    assert_eq!(x.floor_div(2).floor_div(4), x.floor_div(8));
    assert_eq!(b.floor_div(-2).floor_div(4).to_string(), "(b//(-2))//4"); // not merged: -2 < 0
    assert_eq!((2 * x).floor_div(4), x.floor_div(2));
    assert_eq!((6 * x + 4).floor_div(-4).to_string(), "(3*x0)//(-2) - 1");
    assert_eq!(x.floor_div(64), k(0));
    assert_eq!((x - 64).floor_div(64), k(-1));
    assert_eq!((s * x + 3).floor_div(s).to_string(), "x0 + 3//s0");
    assert_eq!((6 * s * y).floor_div(2 * s), 3 * y);
    assert_eq!(y.floor_div(s).bounds(), (Some(0), Some(7)));
}

#[test]
fn mod_rules() {
    let (x, y, b, s) = (x(), y(), b(), s());
    assert_eq!(x.modulo(64), x);
    assert_eq!(x.modulo(s + 62), x); // s0 + 62 >= 64
    assert_eq!(b.modulo(8).to_string(), "b % 8");
    assert_eq!((4 * x + b).modulo(4), b.modulo(4));
    assert_eq!((s * x + b).modulo(s), b.modulo(s));
    assert_eq!((2 * x).modulo(4).to_string(), "2*(x0 % 2)");
    assert_eq!(x.modulo(8).modulo(4), x.modulo(4));
    assert_eq!(x.modulo(4).modulo(8), x.modulo(4));
    assert_eq!((b - 5).modulo(-16), b - 5);
    assert_eq!(4 * x.floor_div(4) + x.modulo(4), x);
    let h = x.floor_div(2);
    assert_eq!(4 * h.floor_div(4) + h.modulo(4), h); // h // 4 is built as x0//8
    assert_eq!(4 * (x + 5).floor_div(4) + (x + 5).modulo(4), x + 5);
    assert_eq!(12 * (x + y).floor_div(4) + 3 * (x + y).modulo(4) + 1, 3 * x + 3 * y + 1);
}

#[test]
fn min_max_rules() {
    let (x, b, s) = (x(), b(), s());
    assert_eq!(x.min(100), x);
    assert_eq!(x.max(-1), x);
    assert_eq!(x.min(x + 1), x);
    assert_eq!(x.max(x + 1), x + 1);
    assert_eq!(x.min(b), b.min(x));
    assert_eq!(x.min(b).to_string(), "min(b, x0)");
    assert_eq!(s.min(4).to_string(), "min(s0, 4)");
    assert!(s.known_le(s * 2) && x.known_lt(64) && !b.known_le(0));
}

#[test]
fn bounds() {
    let (x, b, s) = (x(), b(), s());
    assert_eq!((2 * x + 1).bounds(), (Some(1), Some(127)));
    assert_eq!((b * b).bounds(), (Some(-25), Some(25)));
    assert_eq!((-s).bounds(), (None, Some(-2)));
    assert_eq!(x.floor_div(s).bounds(), (Some(0), Some(31)));
    assert_eq!(x.modulo(s).bounds(), (Some(0), Some(63)));
    assert_eq!(b.modulo(-3).bounds(), (Some(-2), Some(0)));
    assert_eq!(x.floor_div(b).bounds(), (Some(-63), Some(63)));
    assert_eq!(k(-3).floor_div(s).bounds(), (Some(-2), Some(-1)));
    let d = Expr::symbol("d", Some(-9), Some(-2));
    assert_eq!((-x).modulo(d).bounds(), (Some(-8), Some(0)));
    assert!(x.is_known_nonnegative() && !b.is_known_nonnegative() && s.is_known_positive());
    assert_eq!(x.as_symbol().map(|s| (s.lo, s.hi)), Some((Some(0), Some(63))));
    assert_eq!((x * k(0) + 3).const_value(), Some(3));
}

#[test]
fn printing() {
    let (x, y, b, s) = (x(), y(), b(), s());
    assert_eq!((2 * x + y.floor_div(4) + 5).to_string(), "2*x0 + x1//4 + 5");
    assert_eq!((x + 1).modulo(8).to_string(), "(x0 + 1) % 8");
    assert_eq!((1 - x.floor_div(4)).to_string(), "-(x0//4) + 1");
    assert_eq!((-2 * x).to_string(), "-2*x0");
    assert_eq!((-(x * y)).to_string(), "-x0*x1");
    assert_eq!((3 * y.floor_div(4)).to_string(), "3*(x1//4)");
    assert_eq!((x - 3 * y.floor_div(4)).to_string(), "x0 - 3*(x1//4)");
    assert_eq!((x * y.modulo(3)).to_string(), "x0*(x1 % 3)");
    assert_eq!(x.floor_div(s + 1).to_string(), "x0//(s0 + 1)");
    assert_eq!(b.max(0).to_string(), "max(b, 0)");
    assert_eq!(format!("{:?}", k(-3)), "Expr(-3)");
}

#[test]
fn c_printing() {
    let (x, y, b, s) = (x(), y(), b(), s());
    assert_eq!((2 * x + y.floor_div(4) + 5).to_c(), "2*x0 + x1 / 4 + 5");
    assert_eq!((x + 1).modulo(8).to_c(), "(x0 + 1) % 8");
    assert_eq!((1 - x.floor_div(4)).to_c(), "-(x0 / 4) + 1");
    assert_eq!(x.floor_div(s).to_c(), "x0 / s0");
    assert_eq!(b.floor_div(4).to_c(), "coil_floordiv(b, 4)");
    assert_eq!(b.modulo(4).to_c(), "coil_mod(b, 4)");
    assert_eq!(x.floor_div(b).to_c(), "coil_floordiv(x0, b)");
    assert_eq!(x.max(b).to_c(), "coil_max(b, x0)");
    assert_eq!(k(i64::MIN).to_c(), "INT64_MIN");
    assert!(C_HELPERS.contains("coil_floordiv") && C_HELPERS.contains("coil_mod"));
}

#[test]
fn eval_errors() {
    let (x, y, b) = (x(), y(), b());
    let env = IndexMap::from([(x, 10), (b, -3)]);
    assert_eq!(b.floor_div(2).eval(&env), Ok(-2));
    assert_eq!(b.modulo(4).eval(&env), Ok(1));
    assert_eq!((x + y).eval(&env), Err(EvalError::Unbound("x1".into())));
    let bad = IndexMap::from([(x, 64)]);
    assert_eq!(x.eval(&bad), Err(EvalError::OutOfRange { name: "x0".into(), value: 64 }));
    assert_eq!(x.floor_div(b).eval(&IndexMap::from([(x, 1), (b, 0)])), Err(EvalError::DivisionByZero));
    assert_eq!(k(1).floor_div(0).eval(&IndexMap::new()), Err(EvalError::DivisionByZero));
    assert_eq!((k(i64::MAX) + x).eval(&env), Err(EvalError::Overflow));
}

#[test]
fn substitution_and_free_symbols() {
    let (x, y, b) = (x(), y(), b());
    let e = 2 * x + x.modulo(4) + b;
    assert_eq!(e.substitute(&IndexMap::from([(x, 4 * y)])).to_string(), "b + 8*x1");
    assert_eq!(e.substitute_with(|s| (s == b).then(|| k(2))), 2 * x + x.modulo(4) + 2);
    let (p2, p10) = (Expr::index("p2", 4), Expr::index("p10", 4));
    assert_eq!((p10 + x * p2 + b).free_symbols(), vec![b, p2, p10, x]);
}

#[test]
fn canonical_form_is_independent_of_creation_order() {
    // Fresh names, created in the "wrong" order: printing must not follow creation order.
    let (q10, q9) = (Expr::index("q10", 8), Expr::index("q9", 8));
    let e1 = q10.floor_div(2) + q9 * q10 + q10 + q9;
    let e2 = q9 + q10 + q9 * q10 + q10.floor_div(2);
    assert_eq!(e1, e2);
    assert_eq!(e1.to_string(), "q9 + q10 + q9*q10 + q10//2");
}

// ---- property tests ---------------------------------------------------------------------

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }
}

/// An unsimplified expression tree, evaluated directly.
#[derive(Clone, Debug)]
enum Ref {
    C(i64),
    V(usize),
    Neg(Box<Ref>),
    Bin(u8, Box<Ref>, Box<Ref>), // + - * // % min max
}

/// A test symbol: name, facts (lo, hi), sampling range (lo, hi).
type Var = (&'static str, Option<i64>, Option<i64>, i64, i64);
const VARS: [Var; 4] = [
    ("a", Some(0), Some(7), 0, 7),
    ("b", Some(-5), Some(5), -5, 5),
    ("c", Some(2), None, 2, 30), // unbounded above
    ("d", Some(-9), Some(-2), -9, -2),
];

fn gen(r: &mut Rng, depth: u32) -> Ref {
    if depth == 0 || r.range(0, 3) == 0 {
        return if r.range(0, 1) == 0 { Ref::C(r.range(-10, 10)) } else { Ref::V(r.range(0, 3) as usize) };
    }
    let op = r.range(0, 8) as u8;
    if op == 7 {
        return Ref::Neg(Box::new(gen(r, depth - 1)));
    }
    if op == 8 {
        // m*(e // c) + k*(e % c), often with m = k*c so that it recombines to k*e.
        let (e, c, k) = (gen(r, depth - 1), [2, 3, 4, -4, 8][r.range(0, 4) as usize], r.range(-3, 3));
        let m = if r.range(0, 1) == 0 { k * c } else { r.range(-12, 12) };
        let part = |op, coeff, e| {
            Box::new(Ref::Bin(2, Box::new(Ref::C(coeff)), Box::new(Ref::Bin(op, Box::new(e), Box::new(Ref::C(c))))))
        };
        return Ref::Bin(0, part(3, m, e.clone()), part(4, k, e));
    }
    let lhs = Box::new(gen(r, depth - 1));
    let rhs = match (op, r.range(0, 3)) {
        (3 | 4, 0) => Ref::C([-9, -4, -3, -2, -1, 1, 2, 3, 4, 8][r.range(0, 9) as usize]),
        (3 | 4, 1) => Ref::V(2),
        (3 | 4, 2) => Ref::V(3),
        _ => gen(r, depth - 1), // a general divisor may be zero: the case is skipped
    };
    Ref::Bin(op, lhs, Box::new(rhs))
}

fn ref_eval(e: &Ref, env: &[i64]) -> Option<i64> {
    Some(match e {
        Ref::C(c) => *c,
        Ref::V(i) => env[*i],
        Ref::Neg(a) => ref_eval(a, env)?.checked_neg()?,
        Ref::Bin(op, a, b) => {
            let (a, b) = (ref_eval(a, env)?, ref_eval(b, env)?);
            match op {
                0 => a.checked_add(b)?,
                1 => a.checked_sub(b)?,
                2 => a.checked_mul(b)?,
                3 => fdiv(a, b)?,
                4 => fmod(a, b)?,
                5 => a.min(b),
                _ => a.max(b),
            }
        }
    })
}

fn build(e: &Ref, syms: &[Expr]) -> Expr {
    match e {
        Ref::C(c) => k(*c),
        Ref::V(i) => syms[*i],
        Ref::Neg(a) => -build(a, syms),
        Ref::Bin(op, a, b) => {
            let (a, b) = (build(a, syms), build(b, syms));
            [
                |a: Expr, b| a + b,
                |a: Expr, b| a - b,
                |a: Expr, b| a * b,
                Expr::floor_div,
                Expr::modulo,
                Expr::min,
                Expr::max,
            ][*op as usize](a, b)
        }
    }
}

/// Evaluates printed output: Python semantics for `//` and `%` (Display), or C semantics for
/// `/` and `%` plus the helper functions (`to_c`).
struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    c: bool,
    env: &'a dyn Fn(&str) -> i64,
}
impl Parser<'_> {
    fn eat(&mut self, t: &str) -> bool {
        while self.s.get(self.i) == Some(&b' ') {
            self.i += 1;
        }
        let hit = self.s[self.i..].starts_with(t.as_bytes());
        self.i += if hit { t.len() } else { 0 };
        hit
    }
    fn expr(&mut self) -> Option<i64> {
        let mut v = self.term()?;
        loop {
            if self.eat("+") {
                v = v.checked_add(self.term()?)?;
            } else if self.eat("-") {
                v = v.checked_sub(self.term()?)?;
            } else {
                return Some(v);
            }
        }
    }
    fn term(&mut self) -> Option<i64> {
        let mut v = self.unary()?;
        loop {
            if !self.c && self.eat("//") {
                v = fdiv(v, self.unary()?)?;
            } else if self.c && self.eat("/") {
                v = v.checked_div(self.unary()?)?;
            } else if self.eat("%") {
                let d = self.unary()?;
                v = if self.c { v.checked_rem(d)? } else { fmod(v, d)? };
            } else if self.eat("*") {
                v = v.checked_mul(self.unary()?)?;
            } else {
                return Some(v);
            }
        }
    }
    fn unary(&mut self) -> Option<i64> {
        if self.eat("-") {
            return self.unary()?.checked_neg();
        }
        if self.eat("(") {
            let v = self.expr();
            assert!(self.eat(")"));
            return v;
        }
        let start = self.i;
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') {
            self.i += 1;
        }
        let tok = std::str::from_utf8(&self.s[start..self.i]).unwrap();
        if tok.as_bytes()[0].is_ascii_digit() {
            return tok.parse().ok();
        }
        if !self.eat("(") {
            return Some((self.env)(tok));
        }
        let a = self.expr()?;
        assert!(self.eat(","));
        let b = self.expr()?;
        assert!(self.eat(")"));
        match tok {
            "min" | "coil_min" => Some(a.min(b)),
            "max" | "coil_max" => Some(a.max(b)),
            "coil_floordiv" => fdiv(a, b),
            "coil_mod" => fmod(a, b),
            _ => panic!("unknown function {tok}"),
        }
    }
}

fn parse_eval(text: &str, c: bool, env: &dyn Fn(&str) -> i64) -> Option<i64> {
    let mut p = Parser { s: text.as_bytes(), i: 0, c, env };
    let v = p.expr();
    assert!(v.is_none() || p.i == text.len(), "unparsed tail in {text:?}");
    v
}

#[test]
fn simplification_preserves_values() {
    let syms: Vec<Expr> = VARS.iter().map(|&(n, lo, hi, _, _)| Expr::symbol(n, lo, hi)).collect();
    let mut r = Rng(0x5eed);
    let (mut checked, mut subst_checked) = (0, 0);
    for case in 0..3000 {
        let tree = gen(&mut r, 4);
        let e = build(&tree, &syms);
        let (lo, hi) = e.bounds();
        let c_text = e.to_c();
        // A substitution that respects every symbol's facts.
        let sub: Vec<Expr> = (0..4)
            .map(|i| {
                let g = build(&gen(&mut r, 2), &syms);
                [g.modulo(8), g.modulo(11) - 5, g.max(2), g.modulo(8) - 9][i]
            })
            .collect();
        let e_sub = e.substitute(&syms.iter().copied().zip(sub.iter().copied()).collect());
        for _ in 0..8 {
            let vals: Vec<i64> = VARS.iter().map(|v| r.range(v.3, v.4)).collect();
            let env: IndexMap<Expr, i64> = syms.iter().copied().zip(vals.iter().copied()).collect();
            let got = e.eval(&env);
            let ctx = || format!("case {case}: {tree:?}\n  simplified: {e}\n  env: {vals:?}");
            if let Some(want) = ref_eval(&tree, &vals) {
                assert!(got == Ok(want) || got == Err(EvalError::Overflow), "{} -> {got:?}, want {want}", ctx());
                checked += 1;
            }
            let Ok(v) = got else { continue };
            assert!(lo.is_none_or(|l| l <= v) && hi.is_none_or(|h| v <= h), "{}: {v} outside {lo:?}..{hi:?}", ctx());
            let by_name = |n: &str| vals[VARS.iter().position(|var| var.0 == n).unwrap()];
            for (text, c) in [(e.to_string(), false), (c_text.clone(), true)] {
                let p = parse_eval(&text, c, &by_name);
                assert!(p.is_none() || p == Some(v), "{}\n  printed {text:?} gives {p:?}, want {v}", ctx());
            }
            // substitute-then-eval equals eval with composed bindings
            let composed: Result<Vec<i64>, _> = sub.iter().map(|g| g.eval(&env)).collect();
            let Ok(composed) = composed else { continue };
            let env2: IndexMap<Expr, i64> = syms.iter().copied().zip(composed).collect();
            if let Ok(want) = e.eval(&env2) {
                let got = e_sub.eval(&env);
                assert!(
                    got == Ok(want) || got == Err(EvalError::Overflow),
                    "{}\n  substituted: {e_sub} -> {got:?}, want {want}",
                    ctx()
                );
                subst_checked += 1;
            }
        }
    }
    assert!(checked > 12_000 && subst_checked > 8_000, "too many skipped cases: {checked}, {subst_checked}");
}

#[test]
fn division_of_a_block_that_never_straddles_a_multiple() {
    // 32 consecutive values starting at a multiple of 32 lie in one row of 768: the row and
    // the column split into q's and l's parts.
    let q = Expr::index("q", 1000);
    let l = Expr::index("l", 32);
    let x = q * 32 + l;
    assert_eq!(x.floor_div(768), q.floor_div(24));
    assert_eq!(x.modulo(768), q.modulo(24) * 32 + l);
    // l + 1 may reach 32: nothing to split.
    let y = q * 32 + l + 1;
    assert!(matches!(*y.floor_div(768).kind(), ExprKind::FloorDiv(..)), "{}", y.floor_div(768));
    // Checked against the definition.
    for qv in [0, 23, 24, 25, 999] {
        for lv in [0, 1, 31] {
            let b = IndexMap::from([(q, qv), (l, lv)]);
            let xv = 32 * qv + lv;
            assert_eq!(x.floor_div(768).eval(&b).unwrap(), xv.div_euclid(768));
            assert_eq!(x.modulo(768).eval(&b).unwrap(), xv.rem_euclid(768));
        }
    }
}
