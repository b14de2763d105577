//! Dynamic shapes at the graph level: the size numbers of a graph, graphs that agree up to
//! their sizes, and symbolic sizes recovered from copies of one graph at other sizes.
//!
//! Every size a graph depends on is one of its nodes' **size numbers** ([`size_numbers`]): the
//! dims of its meta, then the sizes among its op's attributes (a reshape's or expand's shape, a
//! slice's start and length, pad widths, a random op's counter offset, an integral `full`
//! value such as the count a mean divides by). Two graphs that differ only there are **equal
//! up to sizes** ([`same_up_to_sizes`]). Rust code computes sizes in plain `usize`, so coil
//! cannot trace how a size was computed; instead, the compiler builds the same program at a few
//! *probe* sizes and reads each size number as a function of the size symbols: a number that
//! is a multilinear polynomial with integer coefficients in the symbols (`s0`, `64*s0`,
//! `s0*s1`, `s0 - 1`, ...) is recovered exactly from the probes at `a` and `a + 1` per symbol
//! ([`decode`]), and checked at a further point; anything else (a size `s0*s0`, a `float` value
//! of `1/s0`) fails the check and the graph is compiled for static sizes instead.
//!
//! ```
//! use coil_ir::dynamic::{decode, Probe};
//! use coil_ir::sym::Expr;
//! let s0 = Expr::size("s0");
//! // A size that is 64*s0 - 1 at the probes s0 = 1009 and s0 = 1010.
//! let probe = Probe::new(vec![s0], vec![1009]);
//! let e = decode(&probe, &[64 * 1009 - 1, 64 * 1010 - 1]).unwrap();
//! assert_eq!(e, s0 * 64 - 1);
//! ```

use crate::dtype::Scalar;
use crate::graph::{Graph, Node};
use crate::op::Op;
use crate::sym::Expr;

/// A value at most this large is a size number when it is an integral `full` value.
const MAX_INTEGRAL_FULL: f64 = 9.0e15;

fn integral(x: f64) -> Option<i64> {
    (x.fract() == 0.0 && x.abs() < MAX_INTEGRAL_FULL).then_some(x as i64)
}

/// The size attributes of an op, in a fixed order (see the module docs).
fn attr_numbers(op: &Op) -> Vec<i64> {
    match op {
        Op::Reshape { shape } | Op::Expand { shape } => shape.iter().map(|&n| n as i64).collect(),
        Op::Slice { start, len, .. } => vec![*start as i64, *len as i64],
        Op::Pad { pads, .. } => pads.iter().flat_map(|&(a, b)| [a as i64, b as i64]).collect(),
        Op::Rand { offset, .. } | Op::Dropout { offset, .. } => vec![*offset as i64],
        Op::Attention { dropout: Some(d), .. } | Op::AttentionBackward { dropout: Some(d), .. } => {
            vec![d.offset as i64]
        }
        Op::Full(Scalar::Float(x)) | Op::Scalar(Scalar::Float(x)) => integral(*x).into_iter().collect(),
        Op::Full(Scalar::Int(v)) | Op::Scalar(Scalar::Int(v)) => vec![*v],
        _ => vec![],
    }
}

/// The size numbers of a node: its meta's dims, then its op's size attributes.
pub fn size_numbers(node: &Node) -> Vec<i64> {
    let mut out: Vec<i64> = node.meta.shape.iter().map(|&n| n as i64).collect();
    out.extend(attr_numbers(&node.op));
    out
}

/// `op` with its size attributes set to `numbers` (in [`size_numbers`] order, after the dims).
///
/// # Panics
/// If `numbers` has the wrong length or a negative size.
pub fn with_sizes(op: &Op, numbers: &[i64]) -> Op {
    assert_eq!(numbers.len(), attr_numbers(op).len(), "with_sizes: {} numbers for {op}", numbers.len());
    let u = |v: i64| usize::try_from(v).expect("with_sizes: a negative size");
    let mut op = op.clone();
    match &mut op {
        Op::Reshape { shape } | Op::Expand { shape } => *shape = numbers.iter().map(|&v| u(v)).collect(),
        Op::Slice { start, len, .. } => (*start, *len) = (u(numbers[0]), u(numbers[1])),
        Op::Pad { pads, .. } => *pads = numbers.chunks(2).map(|p| (u(p[0]), u(p[1]))).collect(),
        Op::Rand { offset, .. } | Op::Dropout { offset, .. } => *offset = numbers[0] as u64,
        Op::Attention { dropout: Some(d), .. } | Op::AttentionBackward { dropout: Some(d), .. } => {
            d.offset = numbers[0] as u64
        }
        Op::Full(Scalar::Float(x)) | Op::Scalar(Scalar::Float(x)) if !numbers.is_empty() => *x = numbers[0] as f64,
        Op::Full(Scalar::Int(v)) | Op::Scalar(Scalar::Int(v)) => *v = numbers[0],
        _ => {}
    }
    op
}

/// Whether two graphs are the same program up to their size numbers: the same ops with the
/// same other attributes, dtypes, ranks, edges, inputs and outputs.
pub fn same_up_to_sizes(a: &Graph, b: &Graph) -> bool {
    a.inputs == b.inputs
        && a.outputs == b.outputs
        && a.nodes.len() == b.nodes.len()
        && a.nodes.iter().zip(&b.nodes).all(|(x, y)| {
            x.inputs == y.inputs
                && x.meta.dtype == y.meta.dtype
                && x.meta.rank() == y.meta.rank()
                && same_op_up_to_sizes(&x.op, &y.op)
        })
}

/// Whether two ops differ at most in their size attributes.
pub fn same_op_up_to_sizes(a: &Op, b: &Op) -> bool {
    if a == b {
        return true;
    }
    let (na, nb) = (attr_numbers(a), attr_numbers(b));
    !na.is_empty() && na.len() == nb.len() && with_sizes(a, &vec![0; na.len()]) == with_sizes(b, &vec![0; nb.len()])
}

/// Whether an op has size attributes (see [`size_numbers`]); cheap, no allocation.
pub fn has_size_attrs(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. }
            | Op::Expand { .. }
            | Op::Slice { .. }
            | Op::Pad { .. }
            | Op::Rand { .. }
            | Op::Dropout { .. }
            | Op::Attention { dropout: Some(_), .. }
            | Op::AttentionBackward { dropout: Some(_), .. }
            | Op::Full(_)
            | Op::Scalar(_)
    )
}

/// The size attributes of an op (the numbers after its meta's dims in [`size_numbers`]).
pub fn size_attrs(op: &Op) -> Vec<i64> {
    attr_numbers(op)
}

/// Probe points for `k` size symbols: symbol `i` at `base[i]` and `base[i] + 1`, so the
/// `2^k` probes are indexed by a bit mask (bit `i` set: symbol `i` at `base[i] + 1`).
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    /// The size symbols.
    pub symbols: Vec<Expr>,
    /// Each symbol's lower probe value.
    pub base: Vec<i64>,
}

impl Probe {
    /// The probes of `symbols` at `base`; panics unless there is one base value per symbol.
    pub fn new(symbols: Vec<Expr>, base: Vec<i64>) -> Probe {
        assert_eq!(symbols.len(), base.len(), "Probe: one base value per symbol");
        Probe { symbols, base }
    }

    /// The symbols' values at probe `mask`.
    pub fn point(&self, mask: usize) -> Vec<i64> {
        self.base.iter().enumerate().map(|(i, &b)| b + ((mask >> i) & 1) as i64).collect()
    }

    /// Number of probes (`2^k`).
    pub fn count(&self) -> usize {
        1 << self.symbols.len()
    }
}

/// The multilinear polynomial with integer coefficients through `values` (one per probe, by
/// mask): `f = Σ_S d_S Π_{i∈S} (s_i - base_i)` with `d_S` the Möbius differences of the values
/// (exact: the probes are one apart). `None` if the values are not all given.
pub fn decode(probe: &Probe, values: &[i64]) -> Option<Expr> {
    if values.len() != probe.count() {
        return None;
    }
    let mut f = Expr::int(0);
    for set in 0..probe.count() {
        // d_S = Σ_{T ⊆ S} (-1)^{|S|-|T|} v[T]
        let mut d: i64 = 0;
        let mut t = set;
        loop {
            let sign = if (set.count_ones() - t.count_ones()) % 2 == 0 { 1 } else { -1 };
            d = d.checked_add(sign * values[t])?;
            if t == 0 {
                break;
            }
            t = (t - 1) & set;
        }
        if d == 0 {
            continue;
        }
        let mut term = Expr::int(d);
        for (i, &s) in probe.symbols.iter().enumerate() {
            if (set >> i) & 1 == 1 {
                term = term * (s - probe.base[i]);
            }
        }
        f = f + term;
    }
    Some(f)
}

/// Symbolic size numbers of a graph: per node, its [`size_numbers`] as expressions of the size
/// symbols.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SymSizes {
    /// Per node, its size numbers as expressions of the symbols.
    pub nodes: Vec<Vec<Expr>>,
}

impl SymSizes {
    /// The sizes of a static graph: every number a constant.
    pub fn constant(g: &Graph) -> SymSizes {
        SymSizes { nodes: g.nodes.iter().map(|n| size_numbers(n).into_iter().map(Expr::int).collect()).collect() }
    }

    /// Decodes every size number of `graphs[mask]` (the same graph up to sizes at each probe).
    /// `None` when some number has no polynomial form (see [`decode`]).
    pub fn decode(probe: &Probe, graphs: &[Graph]) -> Option<SymSizes> {
        let first = graphs.first()?;
        let numbers: Vec<Vec<Vec<i64>>> = graphs.iter().map(|g| g.nodes.iter().map(size_numbers).collect()).collect();
        let mut nodes = Vec::with_capacity(first.nodes.len());
        for n in 0..first.nodes.len() {
            let count = numbers[0][n].len();
            let mut exprs = Vec::with_capacity(count);
            for j in 0..count {
                let values: Vec<i64> = numbers.iter().map(|g| g.get(n)?.get(j).copied()).collect::<Option<_>>()?;
                exprs.push(decode(probe, &values)?);
            }
            nodes.push(exprs);
        }
        Some(SymSizes { nodes })
    }

    /// Whether these sizes, at `values` of the probe's symbols, are exactly `g`'s.
    pub fn matches(&self, probe: &Probe, values: &[i64], g: &Graph) -> bool {
        let env = |s: Expr| probe.symbols.iter().position(|&x| x == s).map(|i| values[i]);
        self.nodes.len() == g.nodes.len()
            && self.nodes.iter().zip(&g.nodes).all(|(exprs, node)| {
                let nums = size_numbers(node);
                nums.len() == exprs.len() && exprs.iter().zip(&nums).all(|(e, &v)| e.eval_with(env) == Ok(v))
            })
    }

    /// The dims of node `n` (of rank `rank`).
    pub fn shape(&self, n: usize, rank: usize) -> &[Expr] {
        &self.nodes[n][..rank]
    }

    /// The size attributes of node `n` (of rank `rank`), in [`size_numbers`] order.
    pub fn attrs(&self, n: usize, rank: usize) -> &[Expr] {
        &self.nodes[n][rank..]
    }
}

/// `g` rebuilt with the size numbers of `sizes` at `values` of the probe's symbols: leaves get
/// their shapes, ops their size attributes, and every other meta is inferred again (so the
/// result is well-typed, or an error names the op that cannot take those sizes).
pub fn instantiate(g: &Graph, sizes: &SymSizes, probe: &Probe, values: &[i64]) -> crate::Result<Graph> {
    let env = |s: Expr| probe.symbols.iter().position(|&x| x == s).map(|i| values[i]);
    let mut out = Graph::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let nums: Vec<i64> = sizes.nodes[i]
            .iter()
            .map(|e| e.eval_with(env))
            .collect::<Result<_, _>>()
            .map_err(|e| crate::Error::shape(format!("size of {}: {e:?}", node.op)))?;
        let rank = node.meta.rank();
        let op = with_sizes(&node.op, &nums[rank..]);
        let shape: Vec<usize> = nums[..rank].iter().map(|&v| v.max(0) as usize).collect();
        let id = match op {
            Op::Input { .. } => out.input(crate::TensorMeta::new(shape, node.meta.dtype)),
            op if op.is_leaf() => out.leaf(op, crate::TensorMeta::new(shape, node.meta.dtype), node.location),
            op => out.push(op, &node.inputs, node.location)?,
        };
        debug_assert_eq!(id.0, i);
    }
    out.inputs = g.inputs.clone();
    out.outputs = g.outputs.clone();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_multilinear_sizes() {
        let (s0, s1) = (Expr::size("s0"), Expr::size("s1"));
        let probe = Probe::new(vec![s0, s1], vec![1009, 1109]);
        let f = |p: &[i64]| 3 * p[0] * p[1] + 8 * p[1] - 5;
        let values: Vec<i64> = (0..4).map(|m| f(&probe.point(m))).collect();
        assert_eq!(decode(&probe, &values).unwrap(), s0 * s1 * 3 + s1 * 8 - 5);
        let constant: Vec<i64> = vec![7; 4];
        assert_eq!(decode(&probe, &constant).unwrap(), Expr::int(7));
    }
}
