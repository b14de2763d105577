//! Automatic dynamic shapes: which sizes of a captured graph are symbolic, as expressions of
//! size symbols, and the guard that a later capture is the same program at other sizes.
//!
//! A graph's inputs have symbolic dims (marked with [`crate::Tensor::mark_dynamic`], or seen to
//! change between calls); inputs dims of equal size share one symbol (`s0`, `s1`, ...). Rust
//! code computes the other sizes (a reshape's target, a mask's shape) in plain `usize`, so they
//! are read back from the graph: node by node, each size attribute is resolved against its
//! operands' symbolic shapes (a reshape's target by grouping dims of equal products, an expand
//! or a new tensor's dim by the symbol of that size, a slice to the end of a symbolic dim as
//! ending there), and every inferred size is recovered from copies of the graph at probe sizes
//! ([`coil_ir::dynamic`]). A guess that is wrong for other sizes costs a recompile, never a
//! wrong result: a call is served only when every size number of its graph equals the
//! expression at its symbols' values ([`DynamicSpec::bind`]).

use coil_ir::dynamic::{decode, has_size_attrs, size_attrs, size_numbers, with_sizes, Probe, SymSizes};
use coil_ir::graph::reshape_groups;
use coil_ir::loops::{Bindings, SizeSymbol};
use coil_ir::sym::Expr;
use coil_ir::{Graph, Node, Op, TensorMeta};

/// The symbolic sizes of a captured graph.
#[derive(Clone, Debug, PartialEq)]
pub struct DynamicSpec {
    /// Every size number of the captured graph as an expression of `symbols`.
    pub sizes: SymSizes,
    /// The size symbols; `input` is a graph input, `hint` the size it had when compiled.
    pub symbols: Vec<SizeSymbol>,
    /// `sizes` as polynomials, for the guard check of every call (no expression interning).
    polys: Vec<Vec<Poly>>,
}

/// A multilinear polynomial in the size symbols: `Σ coeff · Π_{i in mask} (s_i - 2)` (sizes
/// are at least 2, and symbols are only evaluated within their facts).
#[derive(Clone, Debug, PartialEq)]
struct Poly(Vec<(u32, i64)>);

impl Poly {
    /// `e` (a multilinear polynomial in `syms`) by its values at the corners `{2, 3}^k`.
    fn of(e: Expr, syms: &[Expr]) -> Poly {
        if let Some(c) = e.const_value() {
            return Poly(vec![(0, c)]);
        }
        let at = |mask: u32| {
            e.eval_with(|s| syms.iter().position(|&x| x == s).map(|i| 2 + (mask >> i & 1) as i64)).unwrap_or(0)
        };
        let mut terms = Vec::new();
        for set in 0..1u32 << syms.len() {
            // Möbius inversion over the subsets of `set`.
            let mut d = 0i64;
            let mut t = set;
            loop {
                let sign = if (set.count_ones() - t.count_ones()) % 2 == 0 { 1 } else { -1 };
                d = d.wrapping_add(sign * at(t));
                if t == 0 {
                    break;
                }
                t = (t - 1) & set;
            }
            if d != 0 {
                terms.push((set, d));
            }
        }
        Poly(terms)
    }

    fn eval(&self, values: &[i64]) -> i64 {
        let term = |&(mask, c): &(u32, i64)| {
            (0..values.len()).filter(|i| mask >> i & 1 == 1).fold(c, |acc, i| acc.wrapping_mul(values[i] - 2))
        };
        self.0.iter().map(term).fold(0, i64::wrapping_add)
    }
}

impl DynamicSpec {
    /// The symbols' values if `graph` (equal to the compiled one up to sizes) is the compiled
    /// program at those values; `None` otherwise.
    pub fn bind(&self, graph: &Graph) -> Option<Bindings> {
        let mut values = Vec::with_capacity(self.symbols.len());
        for s in &self.symbols {
            let v = *graph.meta(*graph.inputs.get(s.input)?).shape.get(s.dim)? as i64;
            if v < 2 {
                return None;
            }
            values.push(v);
        }
        for (polys, node) in self.polys.iter().zip(&graph.nodes) {
            let rank = node.meta.rank();
            if !polys[..rank].iter().zip(&node.meta.shape).all(|(p, &n)| p.eval(&values) == n as i64) {
                return None;
            }
            if has_size_attrs(&node.op)
                && !polys[rank..].iter().zip(size_attrs(&node.op)).all(|(p, v)| p.eval(&values) == v)
            {
                return None;
            }
        }
        Some(self.symbols.iter().map(|s| s.symbol).zip(values).collect())
    }

    /// `s0 = graph input 0 size[1]`, one per symbol.
    pub fn symbol_text(&self) -> String {
        let parts: Vec<String> =
            self.symbols.iter().map(|s| format!("{} = graph input {} size[{}]", s.symbol, s.input, s.dim)).collect();
        parts.join(", ")
    }

    /// `f32[s0, 64]`: graph input `j`'s type with symbolic sizes.
    pub fn input_text(&self, graph: &Graph, j: usize) -> String {
        let id = graph.inputs[j];
        let dims: Vec<String> = self.sizes.shape(id.0, graph.meta(id).rank()).iter().map(|e| e.to_string()).collect();
        format!("{}[{}]", graph.meta(id).dtype, dims.join(", "))
    }
}

/// The symbolic sizes of `graph` with dims `dims` (graph input, dim) symbolic; an error says
/// why the graph cannot be generalized (it then compiles for static sizes).
pub fn resolve(graph: &Graph, dims: &[(usize, usize)]) -> Result<DynamicSpec, String> {
    let mut symbols: Vec<SizeSymbol> = Vec::new();
    for &(input, dim) in dims {
        let hint = graph.meta(graph.inputs[input]).shape[dim] as i64;
        if hint >= 2 && !symbols.iter().any(|s| s.hint == hint) {
            let symbol = Expr::size(&format!("s{}", symbols.len()));
            symbols.push(SizeSymbol { symbol, input, dim, hint });
        }
    }
    if symbols.is_empty() {
        return Err("no dim of size 2 or more to make dynamic".into());
    }
    let symbolic: Vec<(usize, usize)> =
        dims.iter().copied().filter(|&(input, dim)| graph.meta(graph.inputs[input]).shape[dim] >= 2).collect();
    let syms: Vec<Expr> = symbols.iter().map(|s| s.symbol).collect();
    let probe = Probe::new(syms.clone(), (0..syms.len() as i64).map(|i| 1009 + 100 * i).collect());
    // The probes, then a check point; each gets a copy of the graph built node by node.
    let mut points: Vec<Vec<i64>> = (0..probe.count()).map(|m| probe.point(m)).collect();
    points.push(probe.base.iter().map(|b| b + 37).collect());
    let hints: Vec<i64> = symbols.iter().map(|s| s.hint).collect();
    let mut copies: Vec<Graph> = vec![Graph::new(); points.len()];
    let mut sizes = SymSizes::default();
    let by_hint = |v: usize| symbols.iter().find(|s| s.hint == v as i64).map_or(Expr::from(v), |s| s.symbol);
    for (i, node) in graph.nodes.iter().enumerate() {
        let operand = |k: usize| {
            let x = node.inputs[k];
            (sizes.shape(x.0, graph.meta(x).rank()).to_vec(), &graph.meta(x).shape)
        };
        let attrs = resolve_attrs(node, &operand, &by_hint);
        let leaf_shape: Option<Vec<Expr>> = match &node.op {
            Op::Input { .. } => {
                let j = graph.inputs.iter().position(|&x| x.0 == i).ok_or("an input node that is no graph input")?;
                Some(
                    node.meta
                        .shape
                        .iter()
                        .enumerate()
                        .map(|(d, &n)| if symbolic.contains(&(j, d)) { by_hint(n) } else { Expr::from(n) })
                        .collect(),
                )
            }
            op if op.is_leaf() => Some(node.meta.shape.iter().map(|&n| by_hint(n)).collect()),
            _ => None,
        };
        for (copy, point) in copies.iter_mut().zip(&points) {
            let env = |e: Expr| syms.iter().position(|&s| s == e).map(|k| point[k]);
            let eval = |e: &Expr| e.eval_with(env).map_err(|e| format!("{e:?}"));
            let nums: Vec<i64> = attrs.iter().map(eval).collect::<Result<_, _>>()?;
            let op = with_sizes(&node.op, &nums);
            match &leaf_shape {
                Some(shape) => {
                    let dims: Vec<usize> =
                        shape.iter().map(|e| eval(e).map(|v| v as usize)).collect::<Result<_, _>>()?;
                    copy.leaf(op, TensorMeta::new(dims, node.meta.dtype), None);
                }
                None => {
                    copy.push(op, &node.inputs, None).map_err(|e| format!("{} at other sizes: {e}", node.op))?;
                }
            }
        }
        let shape: Vec<Expr> = match leaf_shape {
            Some(shape) => shape,
            None => (0..node.meta.rank())
                .map(|d| {
                    let values: Vec<i64> =
                        copies[..probe.count()].iter().map(|c| c.nodes[i].meta.shape[d] as i64).collect();
                    decode(&probe, &values).ok_or_else(|| format!("size {d} of {}", node.op))
                })
                .collect::<Result<_, _>>()?,
        };
        // The expressions must give this graph at the hints and the copy at the check point.
        let at = |point: &[i64], e: &Expr| e.eval_with(|s| syms.iter().position(|&x| x == s).map(|k| point[k])).ok();
        let check = copies.last().expect("a check copy");
        let ok = shape.iter().zip(&node.meta.shape).all(|(e, &n)| at(&hints, e) == Some(n as i64))
            && shape
                .iter()
                .zip(&check.nodes[i].meta.shape)
                .all(|(e, &n)| at(&points[points.len() - 1], e) == Some(n as i64))
            && attrs.iter().zip(&size_numbers(node)[node.meta.rank()..]).all(|(e, &n)| at(&hints, e) == Some(n));
        if !ok {
            return Err(format!("the sizes of {} (node %{i}) do not follow from the symbols", node.op));
        }
        let mut numbers = shape;
        numbers.extend(attrs);
        sizes.nodes.push(numbers);
    }
    random_offsets(graph, &mut sizes);
    let polys = sizes.nodes.iter().map(|n| n.iter().map(|&e| Poly::of(e, &syms)).collect()).collect();
    Ok(DynamicSpec { sizes, symbols, polys })
}

/// The offsets of the random ops (from their stream's start) as expressions: an op that starts
/// where an earlier draw of its stream ends starts at that end's expression (a second dropout
/// after the first's `16*s0` numbers), any other at its constant offset. Each expression is
/// its offset at the hints; at other sizes the guard ([`DynamicSpec::bind`]) checks it.
/// Attention with dropout draws one number per probability (`[*batch, L, S]`); the gradient
/// of an attention with dropout regenerates the draw that starts at its offset.
fn random_offsets(graph: &Graph, sizes: &mut SymSizes) {
    let mut draws: Vec<(usize, u64, usize)> = (graph.nodes.iter().enumerate())
        .filter_map(|(i, n)| match n.op {
            Op::Rand { stream, offset, .. } | Op::Dropout { stream, offset, .. } => Some((stream, offset, i)),
            Op::Attention { dropout: Some(d), .. } => Some((d.stream, d.offset, i)),
            _ => None,
        })
        .collect();
    draws.sort_unstable();
    // (stream, counter, its expression) where some draw ends
    let mut ends: Vec<(usize, u64, Expr)> = Vec::new();
    // (stream, counter, its expression) where some draw starts
    let mut starts: Vec<(usize, u64, Expr)> = Vec::new();
    for (stream, offset, i) in draws {
        let at = ends.iter().find(|(s, v, _)| (*s, *v) == (stream, offset)).map(|e| e.2);
        let start = at.unwrap_or_else(|| Expr::int(offset as i64));
        let rank = graph.nodes[i].meta.rank();
        sizes.nodes[i][rank] = start;
        let (numel, count) = drawn(graph, sizes, i);
        starts.push((stream, offset, start));
        ends.push((stream, offset + count, start + numel));
    }
    for (i, node) in graph.nodes.iter().enumerate() {
        if let Op::AttentionBackward { dropout: Some(d), .. } = node.op {
            if let Some(&(_, _, start)) = starts.iter().find(|(s, v, _)| (*s, *v) == (d.stream, d.offset)) {
                sizes.nodes[i][node.meta.rank()] = start;
            }
        }
    }
}

/// How many numbers random node `i` draws: as an expression of the symbols, and at the hints.
/// An attention draws one per probability, `[*batch, L]` of its output times `S` of its keys.
fn drawn(graph: &Graph, sizes: &SymSizes, i: usize) -> (Expr, u64) {
    let node = &graph.nodes[i];
    let rank = node.meta.rank();
    if let Op::Attention { .. } = node.op {
        let k = node.inputs[1].0;
        let s_dim = graph.nodes[k].meta.rank() - 2;
        let numel: Expr = sizes.nodes[i][..rank - 1].iter().copied().product::<Expr>() * sizes.nodes[k][s_dim];
        let count = node.meta.shape[..rank - 1].iter().product::<usize>() * graph.nodes[k].meta.shape[s_dim];
        return (numel, count as u64);
    }
    (sizes.nodes[i][..rank].iter().copied().product(), node.meta.numel() as u64)
}

/// A node's size attributes as expressions, from its operands' symbolic shapes (see the
/// module docs); `operand(k)` is operand `k`'s (symbolic shape, sizes).
fn resolve_attrs<'g>(
    node: &Node,
    operand: &dyn Fn(usize) -> (Vec<Expr>, &'g Vec<usize>),
    by_hint: &dyn Fn(usize) -> Expr,
) -> Vec<Expr> {
    let consts = || size_numbers(node)[node.meta.rank()..].iter().map(|&v| Expr::int(v)).collect();
    match &node.op {
        Op::Reshape { shape } => {
            let (xs, xn) = operand(0);
            reshape_target(&xs, xn, shape, by_hint)
        }
        Op::Expand { shape } => {
            let (xs, xn) = operand(0);
            let lead = shape.len() - xn.len();
            (0..shape.len())
                .map(|d| match d.checked_sub(lead) {
                    Some(k) if xn[k] == shape[d] => xs[k],
                    _ => by_hint(shape[d]),
                })
                .collect()
        }
        Op::Slice { dim, start, len, step } if *step == 1 => {
            let (xs, xn) = operand(0);
            let (size, n) = (xs[*dim], xn[*dim]);
            if size.const_value().is_some() || start + len != n {
                consts()
            } else if *start == 0 {
                vec![Expr::int(0), size]
            } else if len <= start {
                vec![size - *len as i64, Expr::from(*len)]
            } else {
                vec![Expr::from(*start), size - *start as i64]
            }
        }
        _ => consts(),
    }
}

/// A reshape's target sizes from its operand's: dims grouped by equal products; in a group, a
/// target dim equal to an operand dim of the group is that dim, and the one left (if any) is
/// the rest of the group's product.
fn reshape_target(xs: &[Expr], xn: &[usize], to: &[usize], by_hint: &dyn Fn(usize) -> Expr) -> Vec<Expr> {
    let mut out: Vec<Expr> = to.iter().map(|&n| Expr::from(n)).collect();
    if xn.contains(&0) {
        return out;
    }
    for (group, targets) in reshape_groups(xn, to) {
        let product: Expr = group.iter().map(|&d| xs[d]).product();
        if product.const_value().is_some() {
            continue; // a static group splits into static dims
        }
        if targets.len() == 1 {
            out[targets[0]] = product;
            continue;
        }
        // Split dims: match equal sizes in order; the one unmatched dim takes the rest.
        let mut unused = group.clone();
        let mut rest = Vec::new();
        for &t in &targets {
            match unused.iter().position(|&d| xn[d] == to[t]) {
                Some(k) => out[t] = xs[unused.remove(k)],
                None => rest.push(t),
            }
        }
        if rest.len() == 1 {
            let matched: Expr = targets.iter().filter(|&&t| t != rest[0]).map(|&t| out[t]).product();
            let left: Expr = unused.iter().map(|&d| xs[d]).product();
            out[rest[0]] = if matched.const_value().is_some() { product.floor_div(matched) } else { left };
        } else {
            for t in rest {
                out[t] = by_hint(to[t]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_ir::DType;

    #[test]
    fn resolves_a_reshape_of_a_dynamic_dim() {
        let mut g = Graph::new();
        let x = g.input(TensorMeta::new(vec![3, 5, 8], DType::F32));
        let y = g.push(Op::Reshape { shape: vec![15, 8] }, &[x], None).unwrap();
        let z = g.push(Op::Reshape { shape: vec![3, 5, 2, 4] }, &[y], None).unwrap();
        g.outputs.push(z);
        let spec = resolve(&g, &[(0, 1)]).unwrap();
        let s0 = Expr::size("s0");
        assert_eq!(spec.sizes.nodes[1], vec![s0 * 3, Expr::int(8), s0 * 3, Expr::int(8)]);
        assert_eq!(spec.sizes.nodes[2][..4], [Expr::int(3), s0, Expr::int(2), Expr::int(4)]);
        // The same program at 7 binds s0 = 7; at a mismatched reshape it does not.
        let mut h = Graph::new();
        let x = h.input(TensorMeta::new(vec![3, 7, 8], DType::F32));
        let y = h.push(Op::Reshape { shape: vec![21, 8] }, &[x], None).unwrap();
        let z = h.push(Op::Reshape { shape: vec![3, 7, 2, 4] }, &[y], None).unwrap();
        h.outputs.push(z);
        assert_eq!(spec.bind(&h).unwrap()[&s0], 7);
        h.nodes[2].op = Op::Reshape { shape: vec![7, 3, 2, 4] };
        h.nodes[2].meta.shape = vec![7, 3, 2, 4];
        assert!(spec.bind(&h).is_none());
    }
}
