//! Index expressions ([`Expr`]) as their `Display` writes them: `5*x0 + x1 - 4`, `(xindex//16) % 4`,
//! `min(r0, s0 - 1)`. Rebuilding through the smart constructors gives the canonical form the
//! printed expression had.
//!
//! Symbols are names the caller declares with their range facts ([`Scope`]): a loop node's
//! `x<i>` and `r<i>`, a tile kernel's `xindex` and `rindex`, a program's size symbols. The text
//! never carries the facts.

use super::lex::Tok;
use super::{Located, Parser};
use crate::sym::Expr;
use std::collections::HashMap;

/// The symbols an expression may name, with their facts.
pub(super) type Scope = HashMap<String, Expr>;

impl Parser {
    /// `, stride=.., size=.., bound=..)`: the tail a window store shares in loop IR
    /// (`scatter(..)`) and tile IR (`window(..)`); `what` names the closed call in the error.
    pub(super) fn window_tail(&mut self, scope: &Scope, what: &str) -> Result<[Expr; 3], Located> {
        self.phrase(", stride=")?;
        let stride = self.expr(scope)?;
        self.phrase(", size=")?;
        let size = self.expr(scope)?;
        self.phrase(", bound=")?;
        let bound = self.expr(scope)?;
        self.expect(')', &format!("to close the {what}"))?;
        Ok([stride, size, bound])
    }

    /// `a + b - c`: sums of products.
    pub(super) fn expr(&mut self, scope: &Scope) -> Result<Expr, Located> {
        let mut e = self.product(scope)?;
        loop {
            if self.eat('+') {
                e = e + self.product(scope)?;
            } else if self.eat('-') {
                e = e - self.product(scope)?;
            } else {
                return Ok(e);
            }
        }
    }

    /// `a*b`, `a//b`, `a % b`, left to right.
    fn product(&mut self, scope: &Scope) -> Result<Expr, Located> {
        let mut e = self.unary(scope)?;
        loop {
            if self.eat('*') {
                e = e * self.unary(scope)?;
            } else if self.punct_ahead(0, '/') && self.punct_ahead(1, '/') {
                self.at += 2;
                let (pos, d) = (self.peek().1, self.unary(scope)?);
                if d == Expr::int(0) {
                    return Err((pos, "division by zero".into()));
                }
                e = e.floor_div(d);
            } else if self.eat('%') {
                let (pos, d) = (self.peek().1, self.unary(scope)?);
                if d == Expr::int(0) {
                    return Err((pos, "modulo by zero".into()));
                }
                e = e.modulo(d);
            } else {
                return Ok(e);
            }
        }
    }

    fn unary(&mut self, scope: &Scope) -> Result<Expr, Located> {
        if self.eat('-') {
            return Ok(-self.unary(scope)?);
        }
        self.atom(scope)
    }

    /// A constant, a symbol, `min(a, b)`, `max(a, b)` or `(e)`.
    fn atom(&mut self, scope: &Scope) -> Result<Expr, Located> {
        let pos = self.peek().1;
        // The token is borrowed, not cloned: this runs for every leaf of every index.
        match &self.peek().0 {
            Tok::Num(s) => {
                let digits = s.strip_prefix('+').unwrap_or(s);
                let v: i64 = digits.parse().map_err(|_| (pos, format!("expected an integer, found `{s}`")))?;
                self.at += 1;
                Ok(Expr::int(v))
            }
            Tok::Ident(name) if (name == "min" || name == "max") && self.punct_ahead(1, '(') => {
                let name = if name == "min" { "min" } else { "max" };
                self.at += 2;
                let a = self.expr(scope)?;
                self.expect(',', &format!("between the operands of `{name}`"))?;
                let b = self.expr(scope)?;
                self.expect(')', &format!("after the operands of `{name}`"))?;
                Ok(if name == "min" { a.min(b) } else { a.max(b) })
            }
            Tok::Ident(name) => match scope.get(name) {
                Some(&e) => {
                    self.at += 1;
                    Ok(e)
                }
                None => {
                    let mut known: Vec<&str> = scope.keys().map(String::as_str).collect();
                    known.sort_unstable();
                    Err((pos, format!("unknown symbol `{name}` (here: {})", known.join(", "))))
                }
            },
            Tok::Punct('(') => {
                self.at += 1;
                let e = self.expr(scope)?;
                self.expect(')', "to close the parenthesis")?;
                Ok(e)
            }
            _ => self.expected("an index expression"),
        }
    }

    /// `[e, e, ...]`.
    pub(super) fn expr_list(&mut self, scope: &Scope) -> Result<Vec<Expr>, Located> {
        self.expect('[', "to open a list")?;
        let mut out = Vec::new();
        if !self.eat(']') {
            loop {
                out.push(self.expr(scope)?);
                if self.eat(']') {
                    break;
                }
                self.expect(',', "or `]` in the list")?;
            }
        }
        Ok(out)
    }

    /// `[n, n, ...]` of non-negative integers.
    pub(super) fn usize_list(&mut self) -> Result<Vec<usize>, Located> {
        self.list(|p| Ok(p.number("a non-negative integer")?.0))
    }

    /// `[item, item, ...]`.
    pub(super) fn list<T>(
        &mut self,
        mut item: impl FnMut(&mut Parser) -> Result<T, Located>,
    ) -> Result<Vec<T>, Located> {
        self.expect('[', "to open a list")?;
        let mut out = Vec::new();
        if !self.eat(']') {
            loop {
                out.push(item(self)?);
                if self.eat(']') {
                    break;
                }
                self.expect(',', "or `]` in the list")?;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::lex;

    fn parse(text: &str, scope: &Scope) -> Result<Expr, String> {
        let mut p = Parser { tokens: lex::lex(text).map_err(|(_, m)| m)?, at: 0 };
        let e = p.expr(scope).map_err(|(_, m)| m)?;
        assert_eq!(p.peek().0, Tok::End, "{text}: trailing tokens");
        Ok(e)
    }

    #[test]
    fn printed_expressions_parse_to_the_same_handle() {
        let (x, r, s) = (Expr::index("x0", 12), Expr::index("r0", 16), Expr::size("s0"));
        let scope: Scope = [("x0", x), ("r0", r), ("s0", s)].into_iter().map(|(n, e)| (n.to_string(), e)).collect();
        let cases = [
            x * 16 + r,
            x * 5 - 4,
            -x * 2 + r,
            -(x.floor_div(4)),
            (x * 16 + r).floor_div(8).modulo(4),
            x.modulo(s) + s * s * 3,
            (r + s).min(s * 2 - 1),
            x.max(s - 3) * 7,
            Expr::int(i64::MIN),
            Expr::int(-5),
            (s - 1).floor_div(2) * 4 + 1,
        ];
        for e in cases {
            let text = e.to_string();
            assert_eq!(parse(&text, &scope), Ok(e), "{text}");
        }
    }

    #[test]
    fn unknown_symbols_and_zero_divisors_are_errors() {
        let scope: Scope = [("x0".to_string(), Expr::index("x0", 4))].into();
        assert!(parse("x1 + 1", &scope).unwrap_err().contains("unknown symbol `x1` (here: x0)"));
        assert_eq!(parse("x0 // 0", &scope).unwrap_err(), "division by zero");
        assert!(parse("x0 +", &scope).unwrap_err().contains("expected an index expression"));
    }
}
