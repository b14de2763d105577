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
// Interval arithmetic. Bounds are i128 where any magnitude >= INF means "unbounded that way";
// infinities are propagated explicitly rather than by arithmetic, so a huge finite value can
// never cancel an infinity back into range.

const INF: i128 = i128::MAX / 4;
type Iv = (i128, i128);

fn is_inf(v: i128) -> bool {
    v.abs() >= INF
}
fn xadd(a: i128, b: i128) -> i128 {
    if is_inf(a) {
        a
    } else if is_inf(b) {
        b
    } else {
        (a + b).clamp(-INF, INF)
    }
}
fn xmul(a: i128, b: i128) -> i128 {
    let sign = a.signum() * b.signum();
    if sign == 0 {
        0
    } else if is_inf(a) || is_inf(b) {
        sign * INF
    } else {
        a.checked_mul(b).map_or(sign * INF, |p| p.clamp(-INF, INF))
    }
}
fn xdiv(a: i128, b: i128) -> i128 {
    if is_inf(a) {
        a.signum() * b.signum() * INF
    } else if is_inf(b) {
        // floor(a / b) for huge |b| is 0, or -1 when the signs differ.
        if a == 0 || (a > 0) == (b > 0) {
            0
        } else {
            -1
        }
    } else {
        let q = a / b;
        if q * b != a && (a < 0) != (b < 0) {
            q - 1
        } else {
            q
        }
    }
}
fn hull(ivs: impl IntoIterator<Item = Iv>) -> Iv {
    ivs.into_iter().reduce(|x, y| (x.0.min(y.0), x.1.max(y.1))).unwrap_or((-INF, INF))
}
fn corners(a: Iv, b: Iv, f: fn(i128, i128) -> i128) -> Iv {
    let c = [f(a.0, b.0), f(a.0, b.1), f(a.1, b.0), f(a.1, b.1)];
    (*c.iter().min().unwrap(), *c.iter().max().unwrap())
}
/// The divisor's interval without 0, as up to two intervals of one sign each.
fn nonzero_parts(b: Iv) -> impl Iterator<Item = Iv> {
    let neg = (b.0 <= -1).then(|| (b.0, b.1.min(-1)));
    let pos = (b.1 >= 1).then(|| (b.0.max(1), b.1));
    neg.into_iter().chain(pos)
}
/// Floor division is monotone in each operand while the divisor keeps one sign, so the
/// extremes are at the corners.
fn div_iv(a: Iv, b: Iv) -> Iv {
    hull(nonzero_parts(b).map(|p| corners(a, p, xdiv)))
}
fn mod_iv(a: Iv, b: Iv) -> Iv {
    hull(nonzero_parts(b).map(|(b1, b2)| {
        if b1 > 0 {
            if a.0 >= 0 && a.1 < b1 {
                a // a % b == a
            } else if a.0 >= 0 {
                (0, xadd(b2, -1).min(a.1)) // 0 <= a % b <= a
            } else {
                (0, xadd(b2, -1))
            }
        } else if a.1 <= 0 && a.0 > b2 {
            a
        } else if a.1 <= 0 {
            (xadd(b1, 1).max(a.0), 0)
        } else {
            (xadd(b1, 1), 0)
        }
    }))
}

fn iv(e: Expr) -> Iv {
    let (lo, hi) = e.bounds();
    (lo.map_or(-INF, i128::from), hi.map_or(INF, i128::from))
}
fn narrow(v: i128) -> Option<i64> {
    if is_inf(v) {
        None
    } else {
        i64::try_from(v).ok()
    }
}

fn node_bounds(kind: &ExprKind) -> (Option<i64>, Option<i64>) {
    let (lo, hi) = match kind {
        ExprKind::Const(c) => return (Some(*c), Some(*c)),
        ExprKind::Symbol(s) => return (s.lo, s.hi),
        ExprKind::Add { terms, constant } => {
            let k = i128::from(*constant);
            terms.iter().fold((k, k), |(lo, hi), &(t, c)| {
                let (tl, th) = corners(iv(t), (c.into(), c.into()), xmul);
                (xadd(lo, tl), xadd(hi, th))
            })
        }
        ExprKind::Mul { coeff, factors } => {
            let k = i128::from(*coeff);
            factors.iter().fold((k, k), |acc, &f| corners(acc, iv(f), xmul))
        }
        ExprKind::FloorDiv(a, b) => div_iv(iv(*a), iv(*b)),
        ExprKind::Mod(a, b) => mod_iv(iv(*a), iv(*b)),
        ExprKind::Min(a, b) => (iv(*a).0.min(iv(*b).0), iv(*a).1.min(iv(*b).1)),
        ExprKind::Max(a, b) => (iv(*a).0.max(iv(*b).0), iv(*a).1.max(iv(*b).1)),
    };
    (narrow(lo), narrow(hi))
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

// ---------------------------------------------------------------------------------------------
// Printing

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Prec {
    Sum,  // a + b, -x, negative constants
    Prod, // a*b, a//b, a % b
    Atom, // names, non-negative constants, calls
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
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

fn render(e: Expr, st: Style) -> (String, Prec) {
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

// ---------------------------------------------------------------------------------------------
// Conversions and operators

impl From<i64> for Expr {
    fn from(v: i64) -> Expr {
        Expr::int(v)
    }
}
impl From<i32> for Expr {
    fn from(v: i32) -> Expr {
        Expr::int(v.into())
    }
}
impl From<usize> for Expr {
    /// # Panics
    /// If `v > i64::MAX`.
    fn from(v: usize) -> Expr {
        Expr::int(i64::try_from(v).expect("sym: usize does not fit in i64"))
    }
}

impl<R: Into<Expr>> Add<R> for Expr {
    type Output = Expr;
    fn add(self, rhs: R) -> Expr {
        sum([(self, 1), (rhs.into(), 1)], 0)
    }
}
impl<R: Into<Expr>> Sub<R> for Expr {
    type Output = Expr;
    fn sub(self, rhs: R) -> Expr {
        sum([(self, 1), (rhs.into(), -1)], 0)
    }
}
impl<R: Into<Expr>> Mul<R> for Expr {
    type Output = Expr;
    fn mul(self, rhs: R) -> Expr {
        product([self, rhs.into()])
    }
}
impl Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        sum([(self, -1)], 0)
    }
}
macro_rules! scalar_lhs {
    ($($t:ty),*) => {$(
        impl Add<Expr> for $t { type Output = Expr; fn add(self, rhs: Expr) -> Expr { Expr::from(self) + rhs } }
        impl Sub<Expr> for $t { type Output = Expr; fn sub(self, rhs: Expr) -> Expr { Expr::from(self) - rhs } }
        impl Mul<Expr> for $t { type Output = Expr; fn mul(self, rhs: Expr) -> Expr { Expr::from(self) * rhs } }
    )*};
}
// Only `i64`, so that a literal on the left (`2 * x`) infers its type.
scalar_lhs!(i64);

impl Sum for Expr {
    fn sum<I: Iterator<Item = Expr>>(iter: I) -> Expr {
        sum(iter.map(|e| (e, 1)).collect::<Vec<_>>(), 0)
    }
}
impl Product for Expr {
    fn product<I: Iterator<Item = Expr>>(iter: I) -> Expr {
        product(iter.collect::<Vec<_>>())
    }
}

#[cfg(test)]
mod tests {
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
                assert!(
                    lo.is_none_or(|l| l <= v) && hi.is_none_or(|h| v <= h),
                    "{}: {v} outside {lo:?}..{hi:?}",
                    ctx()
                );
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
}
