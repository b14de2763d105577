//! Symbolic integers for shapes and index expressions (a small sympy, as TorchInductor uses it).
//!
//! An [`Expr`] is a `Copy` handle into one process-wide, append-only interner, so handles compare
//! and hash as integers and stay valid on every thread (passes may run under rayon). Nodes are
//! only built by smart constructors that return the simplified canonical form, so two
//! expressions that simplify to the same form are the same handle:
//!
//! * `Add`: `Σ coeff·term + constant`, like terms collected, terms in structural order;
//! * `Mul`: `coeff · f1 · f2 ...`, repeated factors kept side by side; a product of sums is
//!   expanded, so polynomials over the atoms have a single normal form;
//! * atoms: symbols, `FloorDiv` and `Mod` (floor semantics, as Python's `//` and `%`), `Min`, `Max`.
//!
//! Symbols carry range facts `lo <= s <= hi`. Every node caches an interval ([`Expr::bounds`])
//! computed from its children, and the rules consult it: `x % 8` is `x` when `0 <= x < 8`, a node
//! whose interval is a single point is that constant, `min`/`max` fold when one side is provably
//! the smaller.
//!
//! **Soundness.** A rewrite never changes the value at a binding that satisfies every symbol's
//! facts and at which the original expression is defined (no division by zero). Substituting an
//! expression for a symbol is only meaningful if its values satisfy that symbol's facts.
//!
//! **Determinism.** Terms are ordered structurally (kind, symbol names in natural order, then
//! contents), never by creation order, so printed forms are identical in every run and thread.
//! The interner never frees nodes; index expressions are small, so this is cheap.
//!
//! Arithmetic on constants is checked: an `i64` overflow while simplifying panics, and one while
//! evaluating is [`EvalError::Overflow`].

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::iter::{Product, Sum};
use std::ops::{Add, Mul, Neg, Sub};
use std::sync::{Arc, LazyLock, PoisonError, RwLock};

use indexmap::IndexMap;

/// A named integer unknown with inclusive range facts `lo <= value <= hi`.
///
/// A symbol's identity is its name *and* its facts: the same name declared with other facts is
/// another symbol (that prints the same), so facts can never change under an existing expression.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Symbol {
    /// The name, a C identifier (it is printed verbatim by [`Expr::to_c`]).
    pub name: String,
    /// Inclusive lower bound, if known.
    pub lo: Option<i64>,
    /// Inclusive upper bound, if known.
    pub hi: Option<i64>,
}

/// The node behind an [`Expr`], in canonical form (see the module docs for the invariants).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ExprKind {
    /// An integer constant.
    Const(i64),
    /// A symbol with its facts.
    Symbol(Symbol),
    /// `Σ coeff·term + constant`: at least two parts, terms sorted and distinct, coefficients
    /// nonzero, no term is a constant, a sum, or a product with a coefficient other than 1.
    Add {
        /// `(term, coefficient)` pairs.
        terms: Vec<(Expr, i64)>,
        /// The constant part.
        constant: i64,
    },
    /// `coeff · Π factors`: factors sorted, each a symbol or `FloorDiv`/`Mod`/`Min`/`Max`.
    Mul {
        /// The constant coefficient (never 0).
        coeff: i64,
        /// The factors; a repeated factor appears once per power.
        factors: Vec<Expr>,
    },
    /// `floor(a / b)`.
    FloorDiv(Expr, Expr),
    /// `a - b·floor(a / b)`: zero or of the divisor's sign.
    Mod(Expr, Expr),
    /// The smaller operand (operands in structural order).
    Min(Expr, Expr),
    /// The larger operand (operands in structural order).
    Max(Expr, Expr),
}

/// An interned, simplified symbolic integer expression.
///
/// ```
/// use coil_ir::sym::Expr;
/// use indexmap::IndexMap;
///
/// let x = Expr::index("x0", 64); // 0 <= x0 < 64
/// let s = Expr::size("s0"); // s0 >= 2
/// assert_eq!((x * 4 + 3).floor_div(4), x); // x0 + 3//4, and 3//4 is 0
/// assert_eq!(x.modulo(64), x); // the facts prove 0 <= x0 < 64
/// let e = 2 * x + (x + 1).modulo(8) + s.min(4) + 5;
/// assert_eq!(e.to_string(), "2*x0 + (x0 + 1) % 8 + min(s0, 4) + 5");
/// assert_eq!(e.to_c(), "2*x0 + (x0 + 1) % 8 + coil_min(s0, 4) + 5");
/// assert_eq!(e.eval(&IndexMap::from([(x, 10), (s, 3)])), Ok(31));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Expr(u32);

/// Why [`Expr::eval`] could not produce a value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// A symbol had no binding.
    #[error("symbol `{0}` is not bound")]
    Unbound(String),
    /// A binding violates the symbol's declared facts.
    #[error("symbol `{name}` = {value} is outside its declared range")]
    OutOfRange {
        /// The symbol's name.
        name: String,
        /// The offending value.
        value: i64,
    },
    /// A divisor evaluated to zero.
    #[error("division by zero")]
    DivisionByZero,
    /// An intermediate value does not fit in `i64`.
    #[error("i64 overflow")]
    Overflow,
}

/// C definitions of the helpers [`Expr::to_c`] may call. Code generators must emit them (after
/// `#include <stdint.h>`); define `COIL_SYM_FN` first to change the qualifiers, e.g. to
/// `__device__ __forceinline__` for CUDA.
pub const C_HELPERS: &str = "\
#ifndef COIL_SYM_FN
#define COIL_SYM_FN static inline
#endif
COIL_SYM_FN int64_t coil_floordiv(int64_t a, int64_t b) { int64_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
COIL_SYM_FN int64_t coil_mod(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
COIL_SYM_FN int64_t coil_min(int64_t a, int64_t b) { return a < b ? a : b; }
COIL_SYM_FN int64_t coil_max(int64_t a, int64_t b) { return a > b ? a : b; }
";

// ---------------------------------------------------------------------------------------------
// Interner

struct Entry {
    kind: Arc<ExprKind>,
    lo: Option<i64>,
    hi: Option<i64>,
}

#[derive(Default)]
struct Arena {
    entries: Vec<Entry>,
    ids: FxMap<Arc<ExprKind>, u32>,
}

/// A multiply-rotate hasher (as rustc's FxHash): SipHash dominated profiles, and the maps here
/// are only used for lookups, never iterated, so hash order cannot reach any output.
#[derive(Default)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v.into());
    }
    fn write_i64(&mut self, v: i64) {
        self.write_u64(v as u64);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

static ARENA: LazyLock<RwLock<Arena>> = LazyLock::new(Default::default);

/// Interns a canonical node, replacing it by a constant when its interval is a single point.
fn make(kind: ExprKind) -> Expr {
    let found = ARENA.read().unwrap_or_else(PoisonError::into_inner).ids.get(&kind).copied();
    if let Some(id) = found {
        return Expr(id);
    }
    let (lo, hi) = node_bounds(&kind);
    if let (Some(l), Some(h)) = (lo, hi) {
        if l == h && !matches!(kind, ExprKind::Const(_) | ExprKind::Symbol(_)) {
            return Expr::int(l);
        }
    }
    let mut arena = ARENA.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(&id) = arena.ids.get(&kind) {
        return Expr(id); // another thread interned it meanwhile
    }
    let id = u32::try_from(arena.entries.len()).expect("sym: interner full");
    let kind = Arc::new(kind);
    arena.entries.push(Entry { kind: kind.clone(), lo, hi });
    arena.ids.insert(kind, id);
    Expr(id)
}

fn ck<T>(v: Option<T>) -> T {
    v.expect("sym: i64 overflow while simplifying")
}

/// Floor division (Python `//`); `None` on division by zero or overflow.
fn fdiv(a: i64, b: i64) -> Option<i64> {
    let q = a.checked_div(b)?;
    Some(if q * b != a && (a < 0) != (b < 0) { q - 1 } else { q })
}

/// Floor modulo (Python `%`); `None` on division by zero.
fn fmod(a: i64, b: i64) -> Option<i64> {
    let r = a.checked_rem(b).or(if b == -1 { Some(0) } else { None })?;
    Some(if r != 0 && (r < 0) != (b < 0) { r + b } else { r })
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

// ---------------------------------------------------------------------------------------------
// Structural order

fn rank(k: &ExprKind) -> u8 {
    match k {
        ExprKind::Symbol(_) => 0,
        ExprKind::Mul { .. } => 1,
        ExprKind::FloorDiv(..) => 2,
        ExprKind::Mod(..) => 3,
        ExprKind::Min(..) => 4,
        ExprKind::Max(..) => 5,
        ExprKind::Add { .. } => 6,
        ExprKind::Const(_) => 7, // last, so `min(s0, 4)` reads naturally
    }
}

fn binary_args(k: &ExprKind) -> Option<(Expr, Expr)> {
    match *k {
        ExprKind::FloorDiv(a, b) | ExprKind::Mod(a, b) | ExprKind::Min(a, b) | ExprKind::Max(a, b) => Some((a, b)),
        _ => None,
    }
}

/// Names compare by prefix, then by trailing number as a number: `x2 < x10`.
fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn split(s: &str) -> (&str, &str) {
        let digits = s.bytes().rev().take_while(u8::is_ascii_digit).count();
        let (p, d) = s.split_at(s.len() - digits);
        (p, d.trim_start_matches('0'))
    }
    let ((pa, da), (pb, db)) = (split(a), split(b));
    pa.cmp(pb).then(da.len().cmp(&db.len())).then(da.cmp(db)).then(a.cmp(b))
}

fn cmp_lists<T: Copy>(a: &[T], b: &[T], f: impl Fn(T, T) -> Ordering) -> Ordering {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).find(|o| o.is_ne()).unwrap_or(a.len().cmp(&b.len()))
}

fn cmp_expr(a: Expr, b: Expr) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let (ka, kb) = (a.kind(), b.kind());
    rank(&ka).cmp(&rank(&kb)).then_with(|| match (&*ka, &*kb) {
        (ExprKind::Const(x), ExprKind::Const(y)) => x.cmp(y),
        (ExprKind::Symbol(x), ExprKind::Symbol(y)) => {
            natural_cmp(&x.name, &y.name).then(x.lo.cmp(&y.lo)).then(x.hi.cmp(&y.hi))
        }
        (ExprKind::Add { terms: ta, constant: ca }, ExprKind::Add { terms: tb, constant: cb }) => {
            cmp_lists(ta, tb, |(x, cx), (y, cy)| cmp_expr(x, y).then(cx.cmp(&cy))).then(ca.cmp(cb))
        }
        (ExprKind::Mul { coeff: ca, factors: fa }, ExprKind::Mul { coeff: cb, factors: fb }) => {
            cmp_lists(fa, fb, cmp_expr).then(ca.cmp(cb))
        }
        _ => {
            let ((a1, a2), (b1, b2)) = (binary_args(&ka).unwrap(), binary_args(&kb).unwrap());
            cmp_expr(a1, b1).then_with(|| cmp_expr(a2, b2))
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Smart constructors

/// `e` as `Σ coeff·term + constant` with terms in `Add`-term form.
fn as_sum(e: Expr) -> (Vec<(Expr, i64)>, i64) {
    match &*e.kind() {
        ExprKind::Const(c) => (vec![], *c),
        ExprKind::Add { terms, constant } => (terms.clone(), *constant),
        ExprKind::Mul { coeff, factors } => (vec![(monomial(1, factors.clone()), *coeff)], 0),
        _ => (vec![(e, 1)], 0),
    }
}

/// `e` as `coeff · Π factors`, or `None` for a sum.
fn as_monomial(e: Expr) -> Option<(i64, Vec<Expr>)> {
    match &*e.kind() {
        ExprKind::Const(c) => Some((*c, vec![])),
        ExprKind::Add { .. } => None,
        ExprKind::Mul { coeff, factors } => Some((*coeff, factors.clone())),
        _ => Some((1, vec![e])),
    }
}

/// Canonical product of atoms (no constants, sums or products among `factors`).
fn monomial(coeff: i64, mut factors: Vec<Expr>) -> Expr {
    factors.sort_by(|&a, &b| cmp_expr(a, b));
    match (coeff, factors.len()) {
        (0, _) | (_, 0) => Expr::int(coeff),
        (1, 1) => factors[0],
        _ => make(ExprKind::Mul { coeff, factors }),
    }
}

/// Canonical sum: flattens nested sums, pulls coefficients out of products, collects like terms.
fn sum(parts: impl IntoIterator<Item = (Expr, i64)>, constant: i64) -> Expr {
    let mut constant = constant;
    let mut terms = Vec::new();
    for (e, c) in parts {
        let (ts, k) = as_sum(e);
        constant = ck(constant.checked_add(ck(k.checked_mul(c))));
        terms.extend(ts.into_iter().map(|(t, tc)| (t, ck(tc.checked_mul(c)))));
    }
    terms.sort_by(|a, b| cmp_expr(a.0, b.0));
    let mut merged: Vec<(Expr, i64)> = Vec::with_capacity(terms.len());
    for (t, c) in terms {
        match merged.last_mut() {
            Some((last, lc)) if *last == t => *lc = ck(lc.checked_add(c)),
            _ => merged.push((t, c)),
        }
    }
    merged.retain(|&(_, c)| c != 0);
    if let Some(rebuilt) = recombine_div_mod(&merged) {
        return sum(rebuilt, constant);
    }
    match (merged.as_slice(), constant) {
        ([], k) => Expr::int(k),
        ([(t, c)], 0) => product([*t, Expr::int(*c)]),
        _ => make(ExprKind::Add { terms: merged, constant }),
    }
}

/// Recombines `k·c·q + k·(x % c)` into `k·x`, where `q = x // c` for a nonzero constant `c`
/// (`c·floor(x / c) + x mod c = x`). `q` is built by the smart constructor, so the rule also
/// fires when `x // c` was simplified (`(x//2)//4` is `x//8`).
fn recombine_div_mod(terms: &[(Expr, i64)]) -> Option<Vec<(Expr, i64)>> {
    for (i, &(t, k)) in terms.iter().enumerate() {
        let ExprKind::Mod(x, m) = *t.kind() else { continue };
        let Some(want) = m.const_value().and_then(|c| c.checked_mul(k)) else { continue };
        let q = floor_div(x, m);
        if let Some(j) = terms.iter().position(|&(u, cu)| u == q && cu == want) {
            let mut rest: Vec<_> =
                terms.iter().enumerate().filter(|&(n, _)| n != i && n != j).map(|(_, &p)| p).collect();
            rest.push((x, k));
            return Some(rest);
        }
    }
    None
}

/// Canonical product; products of sums are expanded.
fn product(items: impl IntoIterator<Item = Expr>) -> Expr {
    let (mut coeff, mut atoms, mut sums) = (1i64, Vec::new(), Vec::new());
    for e in items {
        match &*e.kind() {
            ExprKind::Const(k) => coeff = ck(coeff.checked_mul(*k)),
            ExprKind::Mul { coeff: k, factors } => {
                coeff = ck(coeff.checked_mul(*k));
                atoms.extend(factors);
            }
            ExprKind::Add { .. } => sums.push(e),
            _ => atoms.push(e),
        }
    }
    if coeff == 0 {
        return Expr::int(0);
    }
    let mut acc = monomial(coeff, atoms);
    for s in sums {
        let (terms, constant) = as_sum(s);
        let parts: Vec<_> = terms.into_iter().map(|(t, c)| (product([acc, t]), c)).collect();
        acc = sum(parts.into_iter().chain([(acc, constant)]), 0);
    }
    acc
}

/// Splits `a` into `d·q + r` where `q` collects the terms that `d` (a monomial) divides exactly.
/// Since `floor((d·q + r) / d) = q + floor(r / d)` and `(d·q + r) mod d = r mod d` for every
/// nonzero `d`, the division rules can drop `q` from the dividend.
fn split_divisible(a: Expr, d: Expr) -> Option<(Expr, Expr)> {
    let (dc, dfs) = as_monomial(d)?;
    let (terms, constant) = as_sum(a);
    let (mut q, mut r) = (Vec::new(), Vec::new());
    for (t, c) in terms {
        let mut fs = as_monomial(t).expect("a sum term is a monomial").1;
        let divides = c.checked_rem(dc) == Some(0)
            && dfs.iter().all(|df| match fs.iter().position(|f| f == df) {
                Some(p) => {
                    fs.remove(p);
                    true
                }
                None => false,
            });
        if divides {
            q.push((monomial(1, fs), ck(c.checked_div(dc))));
        } else {
            r.push((t, c));
        }
    }
    let (qc, rc) = if dfs.is_empty() && constant.checked_rem(dc) == Some(0) {
        (ck(constant.checked_div(dc)), 0)
    } else {
        (0, constant)
    };
    (!q.is_empty() || qc != 0).then(|| (sum(q, qc), sum(r, rc)))
}

/// Splits `a` into `g·high + low` with `g > 1` dividing `m > 0` and `0 <= low < g` by bounds:
/// then `floor(a / m) = floor(high / (m/g))` and `a mod m = g·(high mod (m/g)) + low`, since
/// `g` consecutive values from a multiple of `g` never straddle a multiple of `m`. (A thread's
/// lane `l < 32` in `32·q + l` stays within a row of 768.) The largest such `g` is tried first.
fn split_low(a: Expr, m: i64) -> Option<(Expr, i64, Expr)> {
    type Terms = Vec<(Expr, i64)>;
    if m <= 1 {
        return None;
    }
    let (terms, constant) = as_sum(a);
    let mut gs: Vec<i64> =
        terms.iter().map(|&(_, c)| gcd(c.unsigned_abs(), m as u64) as i64).filter(|&g| g > 1).collect();
    gs.sort_unstable_by(|x, y| y.cmp(x));
    gs.dedup();
    for g in gs {
        let (high, low): (Terms, Terms) = terms.iter().partition(|&&(_, c)| c % g == 0);
        if low.is_empty() && constant == 0 {
            continue; // g divides every term: the gcd rules apply
        }
        let low = sum(low, constant);
        let (lo, hi) = low.bounds();
        if lo.is_some_and(|lo| lo >= 0) && hi.is_some_and(|hi| hi < g) {
            return Some((sum(high.into_iter().map(|(t, c)| (t, c / g)).collect::<Vec<_>>(), 0), g, low));
        }
    }
    None
}

/// The gcd of all coefficients and the constant of `e` (0 for the constant 0).
fn content(e: Expr) -> u64 {
    let (terms, constant) = as_sum(e);
    terms.iter().fold(constant.unsigned_abs(), |g, &(_, c)| gcd(g, c.unsigned_abs()))
}

/// `e / g` for a `g` that divides [`content`]`(e)`.
fn div_exact(e: Expr, g: i64) -> Expr {
    let (terms, constant) = as_sum(e);
    sum(terms.into_iter().map(|(t, c)| (t, c / g)), constant / g)
}

fn floor_div(a: Expr, b: Expr) -> Expr {
    let (ka, kb) = (a.const_value(), b.const_value());
    match (ka, kb) {
        (_, Some(0)) => return make(ExprKind::FloorDiv(a, b)), // undefined: keep, eval reports it
        (Some(x), Some(y)) => return Expr::int(ck(fdiv(x, y))),
        (_, Some(1)) => return a,
        (_, Some(-1)) => return -a,
        (Some(0), _) => return a,
        _ if a == b => return Expr::int(1),
        _ => {}
    }
    if let Some((q, r)) = split_divisible(a, b) {
        return q + floor_div(r, b);
    }
    if let Some(c) = kb {
        // floor(a / c) = floor((a/g) / (c/g)): the same rational number.
        let g = gcd(content(a), c.unsigned_abs()) as i64;
        if g > 1 {
            return floor_div(div_exact(a, g), Expr::int(c / g));
        }
    }
    if let Some((high, g, _)) = kb.and_then(|m| split_low(a, m)) {
        return floor_div(high, Expr::int(kb.unwrap() / g));
    }
    if let ExprKind::FloorDiv(x, p) = *a.kind() {
        // floor(floor(x / p) / b) = floor(x / (p·b)) needs p > 0 and b > 0.
        if p.is_known_positive() && b.is_known_positive() {
            return floor_div(x, p * b);
        }
    }
    make(ExprKind::FloorDiv(a, b))
}

fn modulo(a: Expr, b: Expr) -> Expr {
    let (ka, kb) = (a.const_value(), b.const_value());
    match (ka, kb) {
        (_, Some(0)) => return make(ExprKind::Mod(a, b)),
        (Some(x), Some(y)) => return Expr::int(ck(fmod(x, y))),
        (_, Some(1 | -1)) | (Some(0), _) => return Expr::int(0),
        _ if a == b => return Expr::int(0),
        _ => {}
    }
    if let Some((_, r)) = split_divisible(a, b) {
        return modulo(r, b);
    }
    if let Some(c) = kb {
        // a mod c = g·((a/g) mod (c/g)) for g > 0 dividing both.
        let g = gcd(content(a), c.unsigned_abs()) as i64;
        if g > 1 {
            return modulo(div_exact(a, g), Expr::int(c / g)) * g;
        }
        if let Some((high, g, low)) = split_low(a, c) {
            return modulo(high, Expr::int(c / g)) * g + low;
        }
        if let ExprKind::Mod(x, m) = *a.kind() {
            // (x mod m) ≡ x modulo c whenever c divides m.
            if m.const_value().is_some_and(|m| m % c == 0) {
                return modulo(x, b);
            }
        }
    }
    let ((alo, ahi), (blo, bhi)) = (a.bounds(), b.bounds());
    let lt = |x: Option<i64>, y: Option<i64>| matches!((x, y), (Some(x), Some(y)) if x < y);
    // 0 <= a < b (or b < a <= 0): a is its own remainder.
    if (lt(Some(0), blo) && lt(Some(-1), alo) && lt(ahi, blo)) || (lt(bhi, Some(0)) && lt(ahi, Some(1)) && lt(bhi, alo))
    {
        return a;
    }
    make(ExprKind::Mod(a, b))
}

fn min_max(a: Expr, b: Expr, is_min: bool) -> Expr {
    if let (Some(x), Some(y)) = (a.const_value(), b.const_value()) {
        return Expr::int(if is_min { x.min(y) } else { x.max(y) });
    }
    if a.known_le(b) {
        return if is_min { a } else { b };
    }
    if b.known_le(a) {
        return if is_min { b } else { a };
    }
    let (a, b) = if cmp_expr(a, b).is_gt() { (b, a) } else { (a, b) };
    make(if is_min { ExprKind::Min(a, b) } else { ExprKind::Max(a, b) })
}

// ---------------------------------------------------------------------------------------------
// Public API

impl Expr {
    /// The constant `v`.
    pub fn int(v: i64) -> Expr {
        make(ExprKind::Const(v))
    }

    /// A symbol with inclusive facts `lo <= value <= hi` (`None`: unbounded that way). The
    /// same name with the same facts gives the same handle; with other facts, another symbol.
    ///
    /// # Panics
    /// If `name` is not a C identifier or `lo > hi`.
    pub fn symbol(name: &str, lo: Option<i64>, hi: Option<i64>) -> Expr {
        let ident = name
            .bytes()
            .enumerate()
            .all(|(i, c)| c == b'_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
        assert!(!name.is_empty() && ident, "sym: symbol name `{name}` is not a C identifier");
        assert!(!matches!((lo, hi), (Some(l), Some(h)) if l > h), "sym: symbol `{name}` has an empty range");
        make(ExprKind::Symbol(Symbol { name: name.to_owned(), lo, hi }))
    }

    /// A loop index `0 <= name < extent`.
    ///
    /// # Panics
    /// If `extent < 1` or `name` is not a C identifier.
    pub fn index(name: &str, extent: i64) -> Expr {
        assert!(extent >= 1, "sym: index `{name}` needs a positive extent, got {extent}");
        Expr::symbol(name, Some(0), Some(extent - 1))
    }

    /// A loop index `0 <= name < extent` for a symbolic extent: a constant extent gives
    /// [`Expr::index`]; a symbolic one only the fact `name >= 0` (facts are constants).
    pub fn index_upto(name: &str, extent: Expr) -> Expr {
        match extent.const_value() {
            Some(n) => Expr::index(name, n),
            None => Expr::symbol(name, Some(0), None),
        }
    }

    /// A dynamic size `name >= 2`: coil specializes sizes 0 and 1, so a symbolic size is at
    /// least 2 (as in TorchInductor). Use [`Expr::symbol`] for other facts.
    pub fn size(name: &str) -> Expr {
        Expr::symbol(name, Some(2), None)
    }

    /// The canonical node behind this handle.
    pub fn kind(self) -> Arc<ExprKind> {
        let arena = ARENA.read().unwrap_or_else(PoisonError::into_inner);
        arena.entries[self.0 as usize].kind.clone()
    }

    /// The value, if this is a constant.
    pub fn const_value(self) -> Option<i64> {
        match *self.kind() {
            ExprKind::Const(c) => Some(c),
            _ => None,
        }
    }

    /// The symbol, if this is one.
    pub fn as_symbol(self) -> Option<Symbol> {
        match &*self.kind() {
            ExprKind::Symbol(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// Inclusive `(lower, upper)` bounds over all bindings that satisfy the facts (interval
    /// arithmetic, so possibly loose); `None` where unbounded or unknown.
    pub fn bounds(self) -> (Option<i64>, Option<i64>) {
        let arena = ARENA.read().unwrap_or_else(PoisonError::into_inner);
        let e = &arena.entries[self.0 as usize];
        (e.lo, e.hi)
    }

    /// Whether the facts prove `self >= 0`.
    pub fn is_known_nonnegative(self) -> bool {
        self.bounds().0.is_some_and(|l| l >= 0)
    }

    /// Whether the facts prove `self >= 1`.
    pub fn is_known_positive(self) -> bool {
        self.bounds().0.is_some_and(|l| l >= 1)
    }

    /// Whether the facts prove `self <= other` (from the bounds of both, or of `self - other`).
    pub fn known_le(self, other: impl Into<Expr>) -> bool {
        let other = other.into();
        matches!((self.bounds().1, other.bounds().0), (Some(h), Some(l)) if h <= l)
            || (self - other).bounds().1.is_some_and(|h| h <= 0)
    }

    /// Whether the facts prove `self < other`.
    pub fn known_lt(self, other: impl Into<Expr>) -> bool {
        (self + 1).known_le(other)
    }

    /// `floor(self / rhs)`, like Python's `//`.
    pub fn floor_div(self, rhs: impl Into<Expr>) -> Expr {
        floor_div(self, rhs.into())
    }

    /// `self - rhs·floor(self / rhs)`, like Python's `%`: zero or of the divisor's sign.
    pub fn modulo(self, rhs: impl Into<Expr>) -> Expr {
        modulo(self, rhs.into())
    }

    /// The smaller of `self` and `rhs` (this inherent method is symbolic; `Expr` is not `Ord`).
    pub fn min(self, rhs: impl Into<Expr>) -> Expr {
        min_max(self, rhs.into(), true)
    }

    /// The larger of `self` and `rhs`.
    pub fn max(self, rhs: impl Into<Expr>) -> Expr {
        min_max(self, rhs.into(), false)
    }

    /// The structural order used for canonical forms: deterministic, independent of creation
    /// order; `Equal` exactly when the handles are equal.
    pub fn structural_cmp(self, other: Expr) -> Ordering {
        cmp_expr(self, other)
    }

    /// Replaces the symbols that are keys of `map` and re-simplifies. Each replacement must
    /// satisfy the replaced symbol's facts, or earlier simplifications may no longer hold.
    pub fn substitute(self, map: &IndexMap<Expr, Expr>) -> Expr {
        self.substitute_with(|s| map.get(&s).copied())
    }

    /// Like [`Expr::substitute`], asking `f` for each symbol's replacement (`None`: keep it).
    pub fn substitute_with(self, f: impl Fn(Expr) -> Option<Expr>) -> Expr {
        fn go(e: Expr, f: &dyn Fn(Expr) -> Option<Expr>, memo: &mut FxMap<Expr, Expr>) -> Expr {
            if let Some(&r) = memo.get(&e) {
                return r;
            }
            let r = match &*e.kind() {
                ExprKind::Const(_) => e,
                ExprKind::Symbol(_) => f(e).unwrap_or(e),
                ExprKind::Add { terms, constant } => {
                    sum(terms.iter().map(|&(t, c)| (go(t, f, memo), c)).collect::<Vec<_>>(), *constant)
                }
                ExprKind::Mul { coeff, factors } => {
                    product(factors.iter().map(|&x| go(x, f, memo)).collect::<Vec<_>>()) * *coeff
                }
                ExprKind::FloorDiv(a, b) => floor_div(go(*a, f, memo), go(*b, f, memo)),
                ExprKind::Mod(a, b) => modulo(go(*a, f, memo), go(*b, f, memo)),
                ExprKind::Min(a, b) => min_max(go(*a, f, memo), go(*b, f, memo), true),
                ExprKind::Max(a, b) => min_max(go(*a, f, memo), go(*b, f, memo), false),
            };
            memo.insert(e, r);
            r
        }
        go(self, &f, &mut FxMap::default())
    }

    /// The value under `bindings` (symbol handle -> value), with floor semantics.
    pub fn eval(self, bindings: &IndexMap<Expr, i64>) -> Result<i64, EvalError> {
        self.eval_with(|s| bindings.get(&s).copied())
    }

    /// Like [`Expr::eval`], asking `lookup` for each symbol's value.
    pub fn eval_with(self, lookup: impl Fn(Expr) -> Option<i64>) -> Result<i64, EvalError> {
        fn go(e: Expr, look: &dyn Fn(Expr) -> Option<i64>, memo: &mut FxMap<Expr, i64>) -> Result<i64, EvalError> {
            if let Some(&v) = memo.get(&e) {
                return Ok(v);
            }
            let ov = |v: Option<i64>| v.ok_or(EvalError::Overflow);
            let div = |a: Expr, b: Expr, memo: &mut FxMap<Expr, i64>, f: fn(i64, i64) -> Option<i64>| {
                let (x, y) = (go(a, look, memo)?, go(b, look, memo)?);
                if y == 0 {
                    return Err(EvalError::DivisionByZero);
                }
                ov(f(x, y))
            };
            let v = match &*e.kind() {
                ExprKind::Const(c) => *c,
                ExprKind::Symbol(s) => {
                    let v = look(e).ok_or_else(|| EvalError::Unbound(s.name.clone()))?;
                    if s.lo.is_some_and(|l| v < l) || s.hi.is_some_and(|h| v > h) {
                        return Err(EvalError::OutOfRange { name: s.name.clone(), value: v });
                    }
                    v
                }
                ExprKind::Add { terms, constant } => terms.iter().try_fold(*constant, |acc, &(t, c)| {
                    ov(go(t, look, memo)?.checked_mul(c).and_then(|p| acc.checked_add(p)))
                })?,
                ExprKind::Mul { coeff, factors } => {
                    factors.iter().try_fold(*coeff, |acc, &x| ov(acc.checked_mul(go(x, look, memo)?)))?
                }
                ExprKind::FloorDiv(a, b) => div(*a, *b, memo, fdiv)?,
                ExprKind::Mod(a, b) => div(*a, *b, memo, fmod)?,
                ExprKind::Min(a, b) => go(*a, look, memo)?.min(go(*b, look, memo)?),
                ExprKind::Max(a, b) => go(*a, look, memo)?.max(go(*b, look, memo)?),
            };
            memo.insert(e, v);
            Ok(v)
        }
        go(self, &lookup, &mut FxMap::default())
    }

    /// The symbols occurring in `self`, each once, in structural (natural name) order.
    pub fn free_symbols(self) -> Vec<Expr> {
        let (mut stack, mut seen, mut out) = (vec![self], FxMap::default(), Vec::new());
        while let Some(e) = stack.pop() {
            if seen.insert(e, ()).is_some() {
                continue;
            }
            match &*e.kind() {
                ExprKind::Const(_) => {}
                ExprKind::Symbol(_) => out.push(e),
                ExprKind::Add { terms, .. } => stack.extend(terms.iter().map(|t| t.0)),
                ExprKind::Mul { factors, .. } => stack.extend(factors),
                k => stack.extend(<[Expr; 2]>::from(binary_args(k).unwrap())),
            }
        }
        out.sort_by(|&a, &b| cmp_expr(a, b));
        out
    }

    /// A C expression of type `int64_t` with the same value (symbols print as their names).
    /// Division and modulo whose dividend is provably `>= 0` and divisor provably `>= 1` use C's
    /// `/` and `%`; the others call `coil_floordiv` / `coil_mod`, and min/max call
    /// `coil_min` / `coil_max`: the code generator must define them ([`C_HELPERS`]).
    pub fn to_c(self) -> String {
        render(self, Style::C).0
    }
}

mod interval;
mod ops;
mod print;

use interval::node_bounds;
use print::{render, Style};

#[cfg(test)]
mod tests;
