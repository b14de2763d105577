//! Structured attention masks: a bool mask that provably keeps key `j` for query row `r` iff
//! `j <= offset + constant + (r mod period)` (see [`coil_ir::loops::MaskRule`]) is recognized
//! from the nodes that compute it, so the template applies the rule instead of reading the mask
//! (and the mask is never computed). The causal mask of a decode step or prefill over a KV cache
//! at run-time position `pos` (Llama's: `iota(cap) <= (iota(rep * T) % T + pos)`, the grouped
//! query heads as rows) is one.
//!
//! The analysis is exact: each integer node is an affine expression of its own index (terms:
//! the index along a dim, that index modulo a constant, a one-element i64 tensor read at run
//! time; integer coefficients; a constant), built from `iota`, integer constants, one-element
//! i64 tensors, `add`, `sub`, `remainder` of an index by a positive constant, widening integer
//! casts and the views that keep each element's index expressible (`reshape` inserting or
//! removing size-1 dims, `expand`, `permute`, `slice`), with the implicit broadcasting of the
//! captured graph's binary ops. A bool node is such an expression `e` with "kept iff `e >= 0`",
//! from `le`, `lt`, `ge`, `gt` of two integer expressions (integers: `a < b` iff
//! `b - a - 1 >= 0`), `logical_not` and the same views. Anything else is not a structured
//! mask, and neither is an expression with any other term (a batch dim, a coefficient other
//! than the rule's, two run-time offsets). It reads the captured graph (the compile path's
//! decision to keep the template) and the primitive graph after rewriting (lowering) alike.

use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, Scalar, UnaryOp};

/// A structured mask of a graph: its rule, the offset a node of the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StructuredMask {
    /// The one-element i64 node added to `constant`, if any.
    pub offset: Option<NodeId>,
    /// Added to the offset.
    pub constant: i64,
    /// The row term is `r mod period` (1: none), else `r` (`None`).
    pub period: Option<usize>,
}

/// The rule of `mask` (bool, of rank 2 or more, its last two dims the rows and the keys of the
/// scores it broadcasts to), if its nodes provably compute one (see the module docs).
pub fn structured_mask(graph: &Graph, mask: NodeId) -> Option<StructuredMask> {
    let meta = graph.meta(mask);
    let r = meta.rank();
    if meta.dtype != DType::Bool || r < 2 {
        return None;
    }
    let e = Reader { g: graph }.kept(mask)?;
    // Kept iff `-key + rest >= 0`, i.e. `key <= rest`.
    let (mut key, mut period, mut offset) = (false, None, None);
    for &(term, coef) in &e.terms {
        match (term, coef) {
            (Term::Dim(d), -1) if d == r - 1 => key = true,
            (Term::Dim(d), 1) if d == r - 2 => period = Some(None),
            (Term::DimMod(d, p), 1) if d == r - 2 => period = Some(Some(p)),
            (Term::Offset(n), 1) => offset = Some(n),
            _ => return None,
        }
    }
    key.then_some(StructuredMask { offset, constant: e.constant, period: period.unwrap_or(Some(1)) })
}

/// A term of an integer expression over a node's own index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Term {
    /// The index along a dim.
    Dim(usize),
    /// The index along a dim modulo a constant (at least 2).
    DimMod(usize, usize),
    /// A one-element i64 tensor, read at run time.
    Offset(NodeId),
}

/// `sum(coef * term) + constant`; terms sorted, each once, no zero coefficient.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Affine {
    terms: Vec<(Term, i64)>,
    constant: i64,
}

impl Affine {
    fn constant(c: i64) -> Affine {
        Affine { terms: vec![], constant: c }
    }

    fn term(t: Term) -> Affine {
        Affine { terms: vec![(t, 1)], constant: 0 }
    }

    /// `self + k * other`.
    fn add_scaled(mut self, other: &Affine, k: i64) -> Option<Affine> {
        for &(t, c) in &other.terms {
            let c = c.checked_mul(k)?;
            match self.terms.iter_mut().find(|(u, _)| *u == t) {
                Some((_, x)) => *x = x.checked_add(c)?,
                None => self.terms.push((t, c)),
            }
        }
        self.constant = self.constant.checked_add(other.constant.checked_mul(k)?)?;
        self.terms.retain(|&(_, c)| c != 0);
        self.terms.sort();
        Some(self)
    }

    /// The expression over another node's index, where dim `d` of this node's index is
    /// `at(d) = Some((dim, step, start))`: index `step * i + start` of that node's dim `dim`, or
    /// `None`: always 0 (a size-1 dim). `None` where a term cannot follow.
    fn remap(&self, at: impl Fn(usize) -> Option<(usize, i64, i64)>) -> Option<Affine> {
        let mut out = Affine::constant(self.constant);
        for &(t, c) in &self.terms {
            let part = match t {
                Term::Offset(_) => Affine::term(t),
                Term::Dim(d) => match at(d) {
                    None => continue,
                    Some((dim, step, start)) => Affine { terms: vec![(Term::Dim(dim), step)], constant: start }
                        .add_scaled(&Affine::constant(0), 1)?,
                },
                Term::DimMod(d, p) => match at(d) {
                    None => continue,
                    Some((dim, 1, 0)) => Affine::term(Term::DimMod(dim, p)),
                    Some(_) => return None,
                },
            };
            out = out.add_scaled(&part, c)?;
        }
        Some(out)
    }

    /// Drops index terms of size-1 dims and of modulus 1 (always 0). A modulus no smaller than
    /// its dim stays (exact whatever size a symbolic dim takes).
    fn normalize(mut self, shape: &[usize]) -> Affine {
        self.terms.retain(|&(t, _)| match t {
            Term::Dim(d) => shape[d] > 1,
            Term::DimMod(d, p) => shape[d] > 1 && p > 1,
            Term::Offset(_) => true,
        });
        let merged = Affine::constant(self.constant);
        merged.add_scaled(&Affine { terms: self.terms, constant: 0 }, 1).expect("no new overflow")
    }
}

/// A dim of a shape and its size.
type Dim = (usize, usize);

/// Reads a graph's integer and bool nodes as affine expressions.
struct Reader<'g> {
    g: &'g Graph,
}

impl Reader<'_> {
    fn shape(&self, n: NodeId) -> &[usize] {
        &self.g.meta(n).shape
    }

    /// `x`'s expression over the index of `n`, where `x` broadcasts to `n`'s shape (trailing
    /// dims aligned, size-1 dims stretched).
    fn broadcast(&self, e: &Affine, x: NodeId, n: NodeId) -> Option<Affine> {
        let (xs, ns) = (self.shape(x), self.shape(n));
        let lead = ns.len().checked_sub(xs.len())?;
        e.remap(|d| (xs[d] != 1).then_some((d + lead, 1, 0)))
    }

    /// The view `n` of its operand `x`: the operand's expression over `n`'s index.
    fn view(&self, e: &Affine, n: NodeId) -> Option<Affine> {
        let node = self.g.node(n);
        let x = node.inputs[0];
        let (xs, ns) = (self.shape(x), self.shape(n));
        match &node.op {
            Op::Expand { .. } => self.broadcast(e, x, n),
            Op::Reshape { .. } => {
                // Only size-1 dims inserted or removed: the other dims in order.
                let big = |s: &[usize]| s.iter().enumerate().filter(|(_, &k)| k != 1).map(|(i, &k)| (i, k)).collect();
                let (from, to): (Vec<Dim>, Vec<Dim>) = (big(xs), big(ns));
                if from.iter().map(|p| p.1).ne(to.iter().map(|p| p.1)) {
                    return None;
                }
                e.remap(|d| from.iter().position(|p| p.0 == d).map(|k| (to[k].0, 1, 0)))
            }
            Op::Permute { perm } => {
                e.remap(|d| (xs[d] != 1).then(|| (perm.iter().position(|&p| p == d).expect("a permutation"), 1, 0)))
            }
            Op::Slice { dim, start, step, .. } => {
                // A positive step from `start`: index `i` of the view is `start + step * i`.
                let (start, step) = (i64::try_from(*start).ok()?, *step);
                if step <= 0 {
                    return None;
                }
                e.remap(|d| (xs[d] != 1).then_some(if d == *dim { (d, step, start) } else { (d, 1, 0) }))
            }
            _ => None,
        }
        .map(|e| e.normalize(ns))
    }

    /// The value of integer node `n` over its index.
    fn value(&self, n: NodeId) -> Option<Affine> {
        let node = self.g.node(n);
        let meta = self.g.meta(n);
        if !matches!(meta.dtype, DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U8) {
            return None;
        }
        let arg = |i: usize| node.inputs[i];
        let e = match &node.op {
            Op::Iota { dim } => Affine::term(Term::Dim(*dim)),
            Op::Scalar(s) | Op::Full(s) => Affine::constant(integer(*s)?),
            // Any other one-element i64 node is a run-time offset.
            _ if meta.numel() == 1 && meta.dtype == DType::I64 => Affine::term(Term::Offset(n)),
            Op::Binary(op @ (BinaryOp::Add | BinaryOp::Sub)) => {
                let (a, b) = (self.value(arg(0))?, self.value(arg(1))?);
                let (a, b) = (self.broadcast(&a, arg(0), n)?, self.broadcast(&b, arg(1), n)?);
                a.add_scaled(&b, if *op == BinaryOp::Add { 1 } else { -1 })?
            }
            Op::Binary(BinaryOp::Remainder) => {
                // An index (non-negative) modulo a positive constant.
                let a = self.broadcast(&self.value(arg(0))?, arg(0), n)?;
                let b = self.value(arg(1))?;
                let ([(Term::Dim(d), 1)], 0, true, Ok(p)) =
                    (&a.terms[..], a.constant, b.terms.is_empty(), usize::try_from(b.constant))
                else {
                    return None;
                };
                if p == 0 {
                    return None;
                }
                Affine::term(Term::DimMod(*d, p))
            }
            Op::Cast(to) => {
                // Every value of the operand's (integer) dtype is one of the result's.
                let from = self.g.meta(arg(0)).dtype;
                let signed = matches!(to, DType::I16 | DType::I32 | DType::I64);
                if *to != from && !(signed && to.size_bytes() > from.size_bytes()) {
                    return None;
                }
                self.value(arg(0))?
            }
            Op::Reshape { .. } | Op::Expand { .. } | Op::Permute { .. } | Op::Slice { .. } => {
                self.view(&self.value(arg(0))?, n)?
            }
            _ => return None,
        };
        Some(e.normalize(&meta.shape))
    }

    /// Bool node `n` as `e` with "kept iff `e >= 0`".
    fn kept(&self, n: NodeId) -> Option<Affine> {
        let node = self.g.node(n);
        let meta = self.g.meta(n);
        if meta.dtype != DType::Bool {
            return None;
        }
        let arg = |i: usize| node.inputs[i];
        let e = match &node.op {
            Op::Binary(op @ (BinaryOp::Le | BinaryOp::Lt | BinaryOp::Ge | BinaryOp::Gt)) => {
                let a = self.broadcast(&self.value(arg(0))?, arg(0), n)?;
                let b = self.broadcast(&self.value(arg(1))?, arg(1), n)?;
                match op {
                    BinaryOp::Le => b.add_scaled(&a, -1)?,
                    BinaryOp::Lt => b.add_scaled(&a, -1)?.add_scaled(&Affine::constant(1), -1)?,
                    BinaryOp::Ge => a.add_scaled(&b, -1)?,
                    _ => a.add_scaled(&b, -1)?.add_scaled(&Affine::constant(1), -1)?,
                }
            }
            // `e < 0` iff `-e - 1 >= 0`.
            Op::Unary(UnaryOp::LogicalNot) => Affine::constant(-1).add_scaled(&self.kept(arg(0))?, -1)?,
            Op::Cast(DType::Bool) if self.g.meta(arg(0)).dtype == DType::Bool => self.kept(arg(0))?,
            Op::Reshape { .. } | Op::Expand { .. } | Op::Permute { .. } | Op::Slice { .. } => {
                self.view(&self.kept(arg(0))?, n)?
            }
            _ => return None,
        };
        Some(e.normalize(&meta.shape))
    }
}

/// An integer constant's value (a float only when it is an integer).
fn integer(s: Scalar) -> Option<i64> {
    match s {
        Scalar::Int(v) => Some(v),
        Scalar::Float(x) if x.fract() == 0.0 && x.abs() < 9.0e18 => Some(x as i64),
        Scalar::Float(_) => None,
        Scalar::Bool(b) => Some(b as i64),
    }
}

#[cfg(test)]
#[path = "attention_mask_tests.rs"]
mod tests;
