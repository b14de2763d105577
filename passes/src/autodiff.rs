//! Reverse-mode automatic differentiation of primitive graphs (`torch.autograd.grad`).
//!
//! [`backward`] appends to a primitive graph the nodes that compute the gradient of one output
//! with respect to chosen nodes. It walks the graph once from the output back (node ids are a
//! topological order), and each primitive contributes its vector-Jacobian product, written with
//! the same [`Builder`] the decompositions use, so the gradient nodes are ordinary primitives:
//! they are simplified, fused and compiled with the forward nodes they read, as one graph.
//! Composite ops never reach this pass: the frontend decomposes first, so one rule per primitive
//! covers every composite op (the way JAX and tinygrad differentiate their primitive sets).
//!
//! The rules follow PyTorch's `derivatives.yaml` where it makes a choice: ties of `amax` share the
//! gradient evenly, `maximum(a, b)` gives half to each side on a tie, `floor`, `round` and the
//! like have zero gradient, and gradients keep the dtype of the value they belong to.
//!
//! ```
//! use coil_ir::{DType, Graph, Op, TensorMeta, UnaryOp};
//! use coil_passes::autodiff::backward;
//!
//! let mut g = Graph::new();
//! let x = g.input(TensorMeta::new(vec![3], DType::F32));
//! let y = g.push(Op::Unary(UnaryOp::Exp), &[x], None).unwrap();
//! let s = g.push(Op::Reduce { op: coil_ir::ReduceOp::Sum, dims: vec![0], keepdim: false }, &[y], None).unwrap();
//! let dx = backward(&mut g, s, None, &[x]).unwrap();
//! assert_eq!(g.meta(dx[0]), g.meta(x)); // d/dx sum(exp(x)) = exp(x)
//! ```

use crate::decompose::{relu_operand, Builder};
use coil_ir::op::{ConvForm, ConvGeometry};
use coil_ir::{AttentionDropout, AttentionInput, BinaryOp, Error, Graph, Node, NodeId, Op, ReduceOp, Result, UnaryOp};
use indexmap::IndexMap;
use std::f64::consts::{LN_2, PI};

/// Appends the gradient of `output` with respect to each of `wrt` to `graph` and returns the
/// gradient nodes, in `wrt`'s order.
///
/// `seed` is the gradient flowing into `output` (`grad_outputs` in PyTorch), of its shape and
/// dtype; without one, `output` must have one element and the seed is 1. A node of `wrt` that
/// `output` depends on only through ops with zero derivative (comparisons, `floor`, integer
/// casts) gets a zero gradient; one that `output` does not depend on at all is an error, as in
/// PyTorch. `graph` must be primitive ([`Graph::verify_primitive`]).
pub fn backward(graph: &mut Graph, output: NodeId, seed: Option<NodeId>, wrt: &[NodeId]) -> Result<Vec<NodeId>> {
    let location = graph.node(output).location;
    let at = |e: Error| match location {
        Some(l) => e.in_op("grad", vec![]).at(l),
        None => e.in_op("grad", vec![]),
    };
    let out_meta = graph.meta(output).clone();
    if !out_meta.dtype.is_float() {
        return Err(at(Error::dtype(format!(
            "grad of a {} tensor: only floating outputs have gradients",
            out_meta.dtype
        ))));
    }
    for &w in wrt {
        let m = graph.meta(w);
        if !m.dtype.is_float() {
            return Err(at(Error::dtype(format!(
                "only floating tensors can have gradients, but one of the inputs is {m}"
            ))));
        }
    }
    let seed = match seed {
        Some(s) if graph.meta(s) == &out_meta => s,
        Some(s) => {
            return Err(at(Error::shape(format!(
                "the seed gradient is {} but the output is {out_meta}",
                graph.meta(s)
            ))))
        }
        None if out_meta.numel() == 1 => graph.full(1.0.into(), out_meta.shape.clone(), out_meta.dtype, location),
        None => {
            return Err(at(Error::shape(format!(
                "grad can be implicitly created only for outputs of one element, got {out_meta}"
            ))))
        }
    };

    // Nodes that depend on some node of `wrt`: only their gradients are needed.
    let mut needed = vec![false; graph.nodes.len()];
    for &w in wrt {
        needed[w.0] = true;
    }
    for (i, node) in graph.nodes.iter().enumerate() {
        if node.inputs.iter().any(|x| needed[x.0]) {
            needed[i] = true;
        }
    }
    for (k, &w) in wrt.iter().enumerate() {
        if w != output && !depends_on(graph, output, w) {
            return Err(at(Error::value(format!(
                "input {k} of grad ({}) is not used in computing the output",
                graph.meta(w)
            ))));
        }
    }

    let mut grads: IndexMap<NodeId, NodeId> = IndexMap::new();
    grads.insert(output, seed);
    for i in (0..=output.0).rev() {
        let y = NodeId(i);
        let Some(&g) = grads.get(&y) else { continue };
        let node = graph.node(y).clone();
        if node.op.is_leaf() || !node.inputs.iter().any(|x| needed[x.0]) {
            continue;
        }
        let made_from = graph.nodes.len();
        let mut b = Builder::new(graph, node.location);
        let contributions = vjp(&mut b, y, &node, g, &needed)?;
        for (&x, dx) in node.inputs.iter().zip(contributions) {
            let Some(dx) = dx else { continue };
            if !needed[x.0] || !node_is_float(&b, x) {
                continue;
            }
            let dx = b.cast(dx, b.dtype(x))?;
            let total = match grads.get(&x) {
                Some(&prev) => b.add(prev, dx)?,
                None => dx,
            };
            grads.insert(x, total);
        }
        // The gradient's nodes come from the captured node `y` came from.
        for made in &mut graph.nodes[made_from..] {
            made.origin = node.origin;
        }
    }
    wrt.iter()
        .map(|&w| match grads.get(&w) {
            Some(&g) => Ok(g),
            None => {
                let m = graph.meta(w).clone();
                Ok(graph.full(0.0.into(), m.shape, m.dtype, location))
            }
        })
        .collect()
}

/// Whether `x` is among the operands, direct or not, of `y`, other than through a `detach`.
fn depends_on(graph: &Graph, y: NodeId, x: NodeId) -> bool {
    let mut seen = vec![false; y.0 + 1];
    let mut stack = vec![y];
    while let Some(n) = stack.pop() {
        if n == x {
            return true;
        }
        if n.0 < x.0 || std::mem::replace(&mut seen[n.0], true) || graph.node(n).op == Op::Detach {
            continue;
        }
        stack.extend(graph.node(n).inputs.iter().copied());
    }
    false
}

/// The gradient contributions of node `y` (= `node`) to each of its operands, given the
/// gradient `g` of `y`; `None` where an operand gets none (it is not a float, or the derivative
/// is zero).
fn vjp(b: &mut Builder, y: NodeId, node: &Node, g: NodeId, needed: &[bool]) -> Result<Vec<Option<NodeId>>> {
    let x = &node.inputs;
    let wanted: Vec<bool> = x.iter().map(|&xk| needed[xk.0] && node_is_float(b, xk)).collect();
    let wants = |k: usize| wanted[k];
    Ok(match &node.op {
        Op::Unary(u) => vec![unary(b, *u, x[0], y, g)?],
        Op::Binary(op) => {
            let (da, db) = binary(b, *op, x[0], x[1], y, g, wants(0), wants(1))?;
            vec![da, db]
        }
        // relu's mask from its result (`threshold_backward(g, y)`), as PyTorch saves it: the
        // operand then need not be kept for the backward pass.
        Op::Where if wants(2) && relu_operand(b.graph(), y) == Some(x[2]) => {
            let off = b.binary(BinaryOp::Le, y, 0i64)?;
            vec![None, None, Some(b.where_(off, 0.0, g)?)]
        }
        Op::Where => {
            let c = x[0];
            vec![None, side(b, wants(1), |b| b.where_(c, g, 0.0))?, side(b, wants(2), |b| b.where_(c, 0.0, g))?]
        }
        Op::Cast(_) => vec![node_is_float(b, x[0]).then_some(g)],
        Op::Detach => vec![None],
        // Positions: the sorted values are a gather of them, and the gather carries the gradient.
        Op::Argsort { .. } => vec![None],
        Op::Reduce { op, dims, .. } => vec![reduce(b, *op, dims, x[0], y, g, node)?],
        Op::Cumsum { dim } => {
            let flipped = flip(b, g, *dim)?;
            let summed = b.push(Op::Cumsum { dim: *dim }, &[flipped])?;
            vec![Some(flip(b, summed, *dim)?)]
        }
        Op::Reshape { .. } => {
            let shape = b.shape(x[0]);
            vec![Some(b.reshape(g, &shape)?)]
        }
        Op::Permute { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            vec![Some(b.permute(g, &inverse)?)]
        }
        Op::Expand { shape } => vec![Some(sum_to(b, g, shape, &b.shape(x[0]))?)],
        Op::Slice { dim, start, len, step } => vec![Some(unslice(b, g, x[0], *dim, *start, *len, *step)?)],
        Op::Pad { pads, .. } => {
            let mut dx = g;
            for (d, &(before, _)) in pads.iter().enumerate() {
                let len = b.shape(x[0])[d];
                if b.shape(dx)[d] != len {
                    dx = b.push(Op::Slice { dim: d, start: before, len, step: 1 }, &[dx])?;
                }
            }
            vec![Some(dx)]
        }
        Op::Cat { dim } => {
            let mut start = 0;
            let mut parts = Vec::with_capacity(x.len());
            for &part in x {
                let len = b.shape(part)[*dim];
                parts.push(Some(b.push(Op::Slice { dim: *dim, start, len, step: 1 }, &[g])?));
                start += len;
            }
            parts
        }
        Op::Gather { dim } if gathers_one_per_row(b, x[0], x[1], *dim) => {
            // One element per row (cross-entropy's target logit): a one-hot mask, pointwise, so
            // it fuses into its consumer where a scatter would be a kernel of its own.
            let shape = b.shape(x[0]);
            let iota = b.iota(&shape, *dim);
            let index = b.expand(x[1], &shape)?;
            let hit = b.eq(iota, index)?;
            let ge = b.expand(g, &shape)?;
            vec![Some(b.where_(hit, ge, 0.0)?), None]
        }
        Op::Gather { dim } => {
            let zeros = zeros_like(b, x[0]);
            vec![Some(b.push(Op::Scatter { dim: *dim, reduce: Some(ReduceOp::Sum) }, &[zeros, x[1], g])?), None]
        }
        Op::IndexSelect { dim } => {
            // index_select's gradient is index_add: a scatter_add with the index spread over g.
            let (rank, gshape) = (b.rank(x[0]), b.shape(g));
            let mut index_shape = vec![1; rank];
            index_shape[*dim] = gshape[*dim];
            let index = b.reshape(x[1], &index_shape)?;
            let index = b.expand(index, &gshape)?;
            let zeros = zeros_like(b, x[0]);
            vec![Some(b.push(Op::Scatter { dim: *dim, reduce: Some(ReduceOp::Sum) }, &[zeros, index, g])?), None]
        }
        Op::Scatter { dim, reduce } => {
            let dim = *dim;
            // The part of src the scatter reads (src may be larger than the index).
            let src = narrow_to(b, x[2], &b.shape(x[1]))?;
            let (dx, dsrc) = match reduce {
                Some(ReduceOp::Sum) => (g, b.gather(g, dim, x[1])?),
                None => {
                    // Overwritten positions do not reach the result: their gradient is zero.
                    let index_shape = b.shape(x[1]);
                    let zeros = b.full(0.0, &index_shape, b.dtype(g));
                    (b.push(Op::Scatter { dim, reduce: None }, &[g, x[1], zeros])?, b.gather(g, dim, x[1])?)
                }
                Some(ReduceOp::Max | ReduceOp::Min) => scatter_extremum_vjp(b, dim, x[0], x[1], src, y, g)?,
                Some(ReduceOp::Prod) => scatter_prod_vjp(b, dim, x[0], x[1], src, y, g)?,
                Some(op) => return Err(Error::unsupported(format!("the gradient of a scatter with {}", op.name()))),
            };
            let (have, want) = (b.shape(dsrc), b.shape(x[2]));
            let pads: Vec<(usize, usize)> = have.iter().zip(want.iter()).map(|(h, w)| (0, w - h)).collect();
            let dsrc = if have == want { dsrc } else { b.push(Op::Pad { pads, value: 0.0.into() }, &[dsrc])? };
            vec![Some(dx), None, Some(dsrc)]
        }
        Op::Bmm => {
            let r = b.rank(x[0]);
            let da = if wants(0) {
                let bt = b.transpose(x[1], r - 2, r - 1)?;
                Some(b.bmm(g, bt)?)
            } else {
                None
            };
            let db = if wants(1) {
                let at = b.transpose(x[0], r - 2, r - 1)?;
                Some(b.bmm(at, g)?)
            } else {
                None
            };
            vec![da, db]
        }
        Op::Attention { causal, scale, mask, dropout } => {
            attention(b, y, node, g, &wanted, *causal, *scale, *mask, *dropout)?
        }
        Op::Conv { geometry, form } => conv(b, geometry, form, x, g, &wanted)?,
        op => {
            let e = Error::value(format!("no gradient rule for {op}: it is not a primitive the autodiff pass knows"));
            return Err(match node.location {
                Some(l) => e.in_op("grad", vec![]).at(l),
                None => e.in_op("grad", vec![]),
            });
        }
    })
}

/// The gradients of the attention template `y = attention(q, k, v, mask?)`, as templates too:
/// the logsumexp of its scores (which the compile path computes in the forward call itself) and
/// one [`Op::AttentionBackward`] per wanted operand, reading `y` too (the compile path computes
/// them in one call, which computes `delta = sum(g * y, -1)` itself), and the mask, if any. A
/// bool mask has no gradient. Where the gradient of an added mask is wanted (a learned bias),
/// the templates have none to give: every gradient of that attention is the decomposition's
/// instead ([`masked::decomposed`]: the scores are written, as without the template; with
/// dropout, the decomposition's `Dropout` keeps what the forward kept). With dropout (masked or
/// not), the gradients regenerate the forward's keep decisions (the same stream and offset):
/// the logsumexp is the undropped (masked) softmax's, and `delta = sum(g * y, -1)` still equals
/// `sum(P * dP, -1)` with `dP` the dropped `g @ v^T`.
#[allow(clippy::too_many_arguments)] // the node, its gradient and attention's attributes
fn attention(
    b: &mut Builder,
    y: NodeId,
    node: &Node,
    g: NodeId,
    wanted: &[bool],
    causal: bool,
    scale: Option<f64>,
    mask: bool,
    dropout: Option<AttentionDropout>,
) -> Result<Vec<Option<NodeId>>> {
    if !wanted.iter().any(|&w| w) {
        return Ok(vec![None; node.inputs.len()]);
    }
    if mask && wanted[3] {
        return masked::decomposed(b, node, g, wanted);
    }
    let forward = &node.inputs;
    let lse = b.push(Op::AttentionLogsumexp { causal, scale, mask }, forward)?;
    let operands: Vec<NodeId> =
        [forward[0], forward[1], forward[2], g, lse, y].into_iter().chain(forward.get(3).copied()).collect();
    let mut grads: Vec<Option<NodeId>> = AttentionInput::ALL
        .iter()
        .map(|&input| {
            side(b, wanted[input.index()], |b| {
                b.push(Op::AttentionBackward { causal, scale, input, mask, dropout }, &operands)
            })
        })
        .collect::<Result<_>>()?;
    grads.resize(forward.len(), None);
    Ok(grads)
}

#[path = "autodiff_masked.rs"]
mod masked;

/// The gradients of a convolution template, as templates of the same geometry: each form is
/// bilinear in its two operands, and `<dz, form(a, c)>` is `<dy, conv(x, w)>` with the
/// operands in their places, so the gradient with respect to each is another form.
fn conv(
    b: &mut Builder,
    geometry: &ConvGeometry,
    form: &ConvForm,
    x: &[NodeId],
    g: NodeId,
    wanted: &[bool],
) -> Result<Vec<Option<NodeId>>> {
    let spatial = |b: &Builder, n: NodeId| b.shape(n)[2..].to_vec();
    let push = |b: &mut Builder, want: bool, form: ConvForm, a: NodeId, c: NodeId| {
        side(b, want, |b| b.push(Op::Conv { geometry: geometry.clone(), form }, &[a, c]))
    };
    Ok(match form {
        // y = conv(x, w): dx = data gradient of (g, w), dw = weight gradient of (x, g).
        ConvForm::Forward => {
            let (size, kernel) = (spatial(b, x[0]), spatial(b, x[1]));
            vec![
                push(b, wanted[0], ConvForm::BackwardData { size }, g, x[1])?,
                push(b, wanted[1], ConvForm::BackwardWeight { kernel }, x[0], g)?,
            ]
        }
        // z = data gradient of (dy, w): d(dy) = conv(g, w), dw = weight gradient of (g, dy).
        ConvForm::BackwardData { .. } => {
            let kernel = spatial(b, x[1]);
            vec![
                push(b, wanted[0], ConvForm::Forward, g, x[1])?,
                push(b, wanted[1], ConvForm::BackwardWeight { kernel }, g, x[0])?,
            ]
        }
        // z = weight gradient of (x, dy): dx = data gradient of (dy, g), d(dy) = conv(x, g).
        ConvForm::BackwardWeight { .. } => {
            let size = spatial(b, x[0]);
            vec![
                push(b, wanted[0], ConvForm::BackwardData { size }, x[1], g)?,
                push(b, wanted[1], ConvForm::Forward, x[0], g)?,
            ]
        }
    })
}

fn node_is_float(b: &Builder, x: NodeId) -> bool {
    b.dtype(x).is_float()
}

/// Whether `gather(x, dim, index)` takes one element of each row along `dim` (index of size 1
/// there, of x's size elsewhere).
fn gathers_one_per_row(b: &Builder, x: NodeId, index: NodeId, dim: usize) -> bool {
    let (xs, is) = (b.shape(x), b.shape(index));
    xs.len() == is.len() && (0..xs.len()).all(|d| if d == dim { is[d] == 1 } else { is[d] == xs[d] })
}

/// A zero tensor of x's shape and dtype.
/// `x` sliced to its first `shape[d]` elements along every dim.
fn narrow_to(b: &mut Builder, mut x: NodeId, shape: &[usize]) -> Result<NodeId> {
    for (dim, &len) in shape.iter().enumerate() {
        if b.shape(x)[dim] != len {
            x = b.push(Op::Slice { dim, start: 0, len, step: 1 }, &[x])?;
        }
    }
    Ok(x)
}

/// The gradient of `y = scatter_amax(x, index, src)` (or amin), PyTorch's: each result's
/// gradient is split evenly among the elements equal to it, of `x` and of `src`.
fn scatter_extremum_vjp(
    b: &mut Builder,
    dim: usize,
    x: NodeId,
    index: NodeId,
    src: NodeId,
    y: NodeId,
    g: NodeId,
) -> Result<(NodeId, NodeId)> {
    let dtype = b.dtype(g);
    let value = b.gather(y, dim, index)?;
    let x_is = b.eq(x, y)?;
    let x_is = b.cast(x_is, dtype)?;
    let src_is = b.eq(src, value)?;
    let src_is = b.cast(src_is, dtype)?;
    let ties = b.push(Op::Scatter { dim, reduce: Some(ReduceOp::Sum) }, &[x_is, index, src_is])?;
    let share = b.div(g, ties)?;
    let dx = b.mul(x_is, share)?;
    let at_src = b.gather(share, dim, index)?;
    Ok((dx, b.mul(src_is, at_src)?))
}

/// The gradient of `y = scatter_prod(x, index, src)`, PyTorch's: the product of the other
/// factors, computed without dividing by a zero factor (a zero among the factors is left out
/// by replacing it with one and computing that product again).
fn scatter_prod_vjp(
    b: &mut Builder,
    dim: usize,
    x: NodeId,
    index: NodeId,
    src: NodeId,
    y: NodeId,
    g: NodeId,
) -> Result<(NodeId, NodeId)> {
    let dtype = b.dtype(g);
    let prod = |b: &mut Builder, base: NodeId, values: NodeId| {
        b.push(Op::Scatter { dim, reduce: Some(ReduceOp::Prod) }, &[base, index, values])
    };
    // dx = g * (product of the src factors) = g * prod(x with its zeros as ones) / that x.
    let x_zero = b.eq(x, 0.0)?;
    let x_ones = b.where_(x_zero, 1.0, x)?;
    let others = prod(b, x_ones, src)?;
    let ratio = b.div(others, x_ones)?;
    let dx = b.mul(g, ratio)?;
    // dsrc = g * y / src where src is not zero; where src is the line's only zero src factor,
    // g * (the product with that factor as one); elsewhere (two zeros or more) zero.
    let src_zero = b.eq(src, 0.0)?;
    let zeros_f = b.cast(src_zero, dtype)?;
    let zeros_x = zeros_like(b, x);
    let zero_count = b.push(Op::Scatter { dim, reduce: Some(ReduceOp::Sum) }, &[zeros_x, index, zeros_f])?;
    let zero_count = b.gather(zero_count, dim, index)?;
    let single = b.eq(zero_count, 1.0)?;
    let single = b.binary(BinaryOp::LogicalAnd, src_zero, single)?;
    let src_ones = b.where_(single, 1.0, src)?;
    let without = prod(b, x, src_ones)?;
    let g_without = b.mul(g, without)?;
    let g_without = b.gather(g_without, dim, index)?;
    let gy = b.mul(g, y)?;
    let gy = b.gather(gy, dim, index)?;
    let src_safe = b.where_(src_zero, 1.0, src)?;
    let plain = b.div(gy, src_safe)?;
    Ok((dx, b.where_(single, g_without, plain)?))
}

fn zeros_like(b: &mut Builder, x: NodeId) -> NodeId {
    let (shape, dtype) = (b.shape(x), b.dtype(x));
    b.full(0.0, &shape, dtype)
}

/// `x` reversed along `dim`.
fn flip(b: &mut Builder, x: NodeId, dim: usize) -> Result<NodeId> {
    let n = b.shape(x)[dim];
    if n <= 1 {
        return Ok(x);
    }
    b.push(Op::Slice { dim, start: n - 1, len: n, step: -1 }, &[x])
}

/// Sums `g` (of the expanded `shape`) back to `to`: over the leading dims an expand added and
/// over the dims it stretched from 1.
fn sum_to(b: &mut Builder, g: NodeId, shape: &[usize], to: &[usize]) -> Result<NodeId> {
    let lead = shape.len() - to.len();
    let leading: Vec<usize> = (0..lead).collect();
    let g = b.sum(g, &leading, false)?;
    let stretched: Vec<usize> = (0..to.len()).filter(|&d| to[d] == 1 && shape[lead + d] != 1).collect();
    let g = b.sum(g, &stretched, true)?;
    b.reshape(g, to)
}

/// The gradient of a slice: `g` placed where the slice read `x`, zeros elsewhere. A strided
/// slice's gradient is `g` spread to the step ([`Builder::spread`]) and padded into place, so
/// it is index arithmetic in the kernel that reads it (`i % step == start % step` and in range:
/// `g[(i - start) / step]`, else 0), as Inductor's `slice_backward`; a negative step reads
/// `g` reversed.
fn unslice(b: &mut Builder, g: NodeId, x: NodeId, dim: usize, start: usize, len: usize, step: i64) -> Result<NodeId> {
    if len == 0 {
        return Ok(zeros_like(b, x));
    }
    let (g, start) = if step < 0 {
        // Reads start, start - |step|, ...: reversed, the positions rise from the last one.
        (flip(b, g, dim)?, start - (len - 1) * step.unsigned_abs() as usize)
    } else {
        (g, start)
    };
    let spread = b.spread(g, dim, step.unsigned_abs() as usize)?;
    let (n, placed) = (b.shape(x)[dim], b.shape(spread)[dim]);
    let mut pads = vec![(0, 0); b.rank(x)];
    pads[dim] = (start, n - start - placed);
    if pads[dim] == (0, 0) {
        return Ok(spread);
    }
    b.push(Op::Pad { pads, value: 0.0.into() }, &[spread])
}

fn unary(b: &mut Builder, u: UnaryOp, x: NodeId, y: NodeId, g: NodeId) -> Result<Option<NodeId>> {
    use UnaryOp::*;
    if !node_is_float(b, x) || u.returns_bool() {
        return Ok(None);
    }
    let dx = match u {
        Neg => b.neg(g)?,
        Abs => {
            let s = b.unary(Sign, x)?;
            b.mul(g, s)?
        }
        Sign | Floor | Ceil | Round | Trunc => return Ok(None),
        Exp => b.mul(g, y)?,
        Exp2 => {
            let gy = b.mul(g, y)?;
            b.mul(gy, LN_2)?
        }
        Expm1 => {
            let e = b.add(y, 1.0)?;
            b.mul(g, e)?
        }
        Log => b.div(g, x)?,
        Log2 => {
            let d = b.mul(x, LN_2)?;
            b.div(g, d)?
        }
        Log1p => {
            let d = b.add(x, 1.0)?;
            b.div(g, d)?
        }
        Sqrt => {
            let d = b.mul(y, 2.0)?;
            b.div(g, d)?
        }
        Rsqrt => {
            // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
            let y2 = b.mul(y, y)?;
            let y3 = b.mul(y2, y)?;
            let gy3 = b.mul(g, y3)?;
            b.mul(gy3, -0.5)?
        }
        Sin => {
            let c = b.unary(Cos, x)?;
            b.mul(g, c)?
        }
        Cos => {
            let s = b.unary(Sin, x)?;
            let gs = b.mul(g, s)?;
            b.neg(gs)?
        }
        Tan => {
            let y2 = b.mul(y, y)?;
            let d = b.add(y2, 1.0)?;
            b.mul(g, d)?
        }
        Atan => {
            let x2 = b.mul(x, x)?;
            let d = b.add(x2, 1.0)?;
            b.div(g, d)?
        }
        Asin | Acos => {
            // ±1 / sqrt(1 - x^2), as PyTorch's `(1 - x * x).rsqrt()`
            let x2 = b.mul(x, x)?;
            let d = b.sub(1.0, x2)?;
            let r = b.rsqrt(d)?;
            let gr = b.mul(g, r)?;
            if u == Acos {
                b.neg(gr)?
            } else {
                gr
            }
        }
        Tanh => {
            let y2 = b.mul(y, y)?;
            let d = b.sub(1.0, y2)?;
            b.mul(g, d)?
        }
        Sigmoid => {
            let one_minus = b.sub(1.0, y)?;
            let d = b.mul(y, one_minus)?;
            b.mul(g, d)?
        }
        Erf => {
            // d/dx erf(x) = 2/sqrt(pi) exp(-x^2)
            let x2 = b.mul(x, x)?;
            let nx2 = b.neg(x2)?;
            let e = b.exp(nx2)?;
            let d = b.mul(e, 2.0 / PI.sqrt())?;
            b.mul(g, d)?
        }
        Erfc => {
            // d/dx erfc(x) = -2/sqrt(pi) exp(-x^2)
            let x2 = b.mul(x, x)?;
            let nx2 = b.neg(x2)?;
            let e = b.exp(nx2)?;
            let d = b.mul(e, -2.0 / PI.sqrt())?;
            b.mul(g, d)?
        }
        Erfinv => {
            // d/dx erfinv(x) = sqrt(pi)/2 exp(erfinv(x)^2)
            let y2 = b.mul(y, y)?;
            let e = b.exp(y2)?;
            let d = b.mul(e, PI.sqrt() / 2.0)?;
            b.mul(g, d)?
        }
        Reciprocal => {
            let y2 = b.mul(y, y)?;
            let gy2 = b.mul(g, y2)?;
            b.neg(gy2)?
        }
        LogicalNot | IsNan | IsInf | BitwiseNot => return Ok(None),
    };
    Ok(Some(dx))
}

/// `f(b)` when the operand wants a gradient: the other side's nodes would be dead weight.
fn side(b: &mut Builder, want: bool, f: impl FnOnce(&mut Builder) -> Result<NodeId>) -> Result<Option<NodeId>> {
    if want {
        f(b).map(Some)
    } else {
        Ok(None)
    }
}

#[allow(clippy::too_many_arguments)]
fn binary(
    b: &mut Builder,
    op: BinaryOp,
    a: NodeId,
    c: NodeId,
    y: NodeId,
    g: NodeId,
    want_a: bool,
    want_c: bool,
) -> Result<(Option<NodeId>, Option<NodeId>)> {
    use BinaryOp::*;
    if op.returns_bool() || !node_is_float(b, a) {
        return Ok((None, None));
    }
    Ok(match op {
        Add => (want_a.then_some(g), want_c.then_some(g)),
        Sub => (want_a.then_some(g), side(b, want_c, |b| b.neg(g))?),
        Mul => (side(b, want_a, |b| b.mul(g, c))?, side(b, want_c, |b| b.mul(g, a))?),
        Div => (
            side(b, want_a, |b| b.div(g, c))?,
            side(b, want_c, |b| {
                // d/dc a/c = -a/c^2 = -y/c
                let q = b.div(y, c)?;
                let gq = b.mul(g, q)?;
                b.neg(gq)
            })?,
        ),
        Pow => (
            side(b, want_a, |b| {
                // c a^(c-1), and 0 where c == 0 (PyTorch's choice, also for a == 0)
                let cm1 = b.sub(c, 1.0)?;
                let p = b.pow(a, cm1)?;
                let d = b.mul(p, c)?;
                let gd = b.mul(g, d)?;
                let zero_exp = b.eq(c, 0.0)?;
                b.where_(zero_exp, 0.0, gd)
            })?,
            side(b, want_c, |b| {
                // y ln a, and 0 where a == 0 and c >= 0 (the limit PyTorch takes)
                let ln = b.log(a)?;
                let d = b.mul(y, ln)?;
                let gd = b.mul(g, d)?;
                let a0 = b.eq(a, 0.0)?;
                let c_nonneg = b.ge(c, 0.0)?;
                let zero = b.binary(LogicalAnd, a0, c_nonneg)?;
                b.where_(zero, 0.0, gd)
            })?,
        ),
        Maximum | Minimum => {
            // The larger (smaller) side takes g; a tie gives each side half.
            let tie = b.eq(a, c)?;
            let half = b.mul(g, 0.5)?;
            let shared = b.where_(tie, half, g)?;
            let (lose_a, lose_c) = if op == Maximum { (Lt, Gt) } else { (Gt, Lt) };
            (
                side(b, want_a, |b| {
                    let lost = b.binary(lose_a, a, c)?;
                    b.where_(lost, 0.0, shared)
                })?,
                side(b, want_c, |b| {
                    let lost = b.binary(lose_c, a, c)?;
                    b.where_(lost, 0.0, shared)
                })?,
            )
        }
        Remainder => (
            want_a.then_some(g),
            side(b, want_c, |b| {
                let q = b.binary(FloorDiv, a, c)?;
                let gq = b.mul(g, q)?;
                b.neg(gq)
            })?,
        ),
        Atan2 => {
            // d/da atan2(a, c) = c / (a^2 + c^2), d/dc = -a / (a^2 + c^2)
            let a2 = b.mul(a, a)?;
            let c2 = b.mul(c, c)?;
            let r2 = b.add(a2, c2)?;
            let gr = b.div(g, r2)?;
            (
                side(b, want_a, |b| b.mul(gr, c))?,
                side(b, want_c, |b| {
                    let ga = b.mul(gr, a)?;
                    b.neg(ga)
                })?,
            )
        }
        FloorDiv | TruncDiv => (None, None),
        Eq | Ne | Lt | Le | Gt | Ge | LogicalAnd | LogicalOr => (None, None),
        BitwiseAnd | BitwiseOr | BitwiseXor | ShiftLeft | ShiftRight => (None, None),
    })
}

#[allow(clippy::too_many_arguments)]
fn reduce(
    b: &mut Builder,
    op: ReduceOp,
    dims: &[usize],
    x: NodeId,
    y: NodeId,
    g: NodeId,
    node: &Node,
) -> Result<Option<NodeId>> {
    if !node_is_float(b, x) || op.is_arg() {
        return Ok(None);
    }
    let shape = b.shape(x);
    let kept: Vec<usize> = (0..shape.len()).map(|d| if dims.contains(&d) { 1 } else { shape[d] }).collect();
    let gk = b.reshape(g, &kept)?;
    Ok(Some(match op {
        ReduceOp::Sum => b.expand(gk, &shape)?,
        ReduceOp::Max | ReduceOp::Min => {
            // The elements equal to the extreme share g evenly (PyTorch's amax/amin rule).
            let yk = b.reshape(y, &kept)?;
            let ye = b.expand(yk, &shape)?;
            let hit = b.eq(x, ye)?;
            let ones = b.cast(hit, b.dtype(x))?;
            let count = b.sum(ones, dims, true)?;
            let share = b.div(gk, count)?;
            let share = b.expand(share, &shape)?;
            b.where_(hit, share, 0.0)?
        }
        ReduceOp::Prod => {
            let e = Error::value("no gradient rule for prod yet (its zeros need PyTorch's special case)");
            return Err(match node.location {
                Some(l) => e.in_op("grad", vec![]).at(l),
                None => e.in_op("grad", vec![]),
            });
        }
        ReduceOp::ArgMax | ReduceOp::ArgMin => unreachable!("arg reductions return early"),
    }))
}

#[cfg(test)]
mod tests {
    use super::backward;
    use crate::decompose::{decompose_with, DecomposeOptions};
    use coil_ir::{DType, Graph, LossReduction, NodeId, Op, ReduceOp, TensorMeta, UnaryOp};

    const GRAD: DecomposeOptions =
        DecomposeOptions { fused_attention: false, keep_detach: true, half_products: false, conv_template: false };

    fn m(shape: &[usize]) -> TensorMeta {
        TensorMeta::new(shape.to_vec(), DType::F32)
    }

    /// The primitive graph of `g` (outputs: the loss, then `wrt`) with its gradients appended as
    /// outputs after the loss.
    fn differentiated(g: &Graph) -> Graph {
        let mut p = decompose_with(g, &GRAD).unwrap();
        let (loss, wrt) = (p.outputs[0], p.outputs[1..].to_vec());
        let grads = backward(&mut p, loss, None, &wrt).unwrap();
        p.outputs = std::iter::once(loss).chain(grads).collect();
        p
    }

    /// Only the live nodes, renumbered: what the frontend records.
    fn pruned(g: &Graph) -> String {
        let mut out = Graph::new();
        let mut ids: Vec<Option<NodeId>> = vec![None; g.nodes.len()];
        for id in g.live_nodes() {
            let n = g.node(id);
            ids[id.0] = Some(match n.op {
                Op::Input { .. } => out.input(n.meta.clone()),
                ref op if op.is_leaf() => out.leaf(op.clone(), n.meta.clone(), None),
                ref op => {
                    out.push(op.clone(), &n.inputs.iter().map(|x| ids[x.0].unwrap()).collect::<Vec<_>>(), None).unwrap()
                }
            });
        }
        out.outputs = g.outputs.iter().map(|o| ids[o.0].unwrap()).collect();
        out.to_string()
    }

    #[test]
    fn linear_cross_entropy_gradient_snapshot() {
        // loss = cross_entropy(x @ w^T, t): the weight's gradient is (softmax - onehot)^T x / n,
        // with the maximum detached and the target's logit as a one-hot mask (no scatter).
        let mut g = Graph::new();
        let x = g.input(m(&[4, 3]));
        let w = g.input(m(&[5, 3]));
        let t = g.input(TensorMeta::new(vec![4], DType::I64));
        let logits = g.push(Op::Linear { bias: false }, &[x, w], None).unwrap();
        let ce = Op::CrossEntropy {
            ignore_index: -100,
            reduction: LossReduction::Mean,
            label_smoothing: 0.0,
            weight: false,
        };
        let loss = g.push(ce, &[logits, t], None).unwrap();
        g.outputs = vec![loss, w];
        let text = pruned(&differentiated(&g));
        assert!(!text.contains("scatter") && text.matches("amax(").count() == 1 && text.contains("detach("), "{text}");
        insta::with_settings!({ snapshot_path => "snapshots", prepend_module_to_snapshot => false }, {
            insta::assert_snapshot!("autodiff_linear_cross_entropy", text);
        });
    }

    #[test]
    fn only_nodes_between_the_inputs_and_the_loss_get_gradients() {
        // y = exp(a) * b + sum(c): differentiating with respect to a alone emits no node for
        // b's or c's gradient.
        let mut g = Graph::new();
        let a = g.input(m(&[3]));
        let b = g.input(m(&[3]));
        let c = g.input(m(&[3]));
        let e = g.push(Op::Unary(UnaryOp::Exp), &[a], None).unwrap();
        let p = g.push(Op::Binary(coil_ir::BinaryOp::Mul), &[e, b], None).unwrap();
        let s = g.push(Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[p], None).unwrap();
        let sc = g.push(Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[c], None).unwrap();
        let y = g.push(Op::Binary(coil_ir::BinaryOp::Add), &[s, sc], None).unwrap();
        let before = g.nodes.len();
        let da = backward(&mut g, y, None, &[a]).unwrap()[0];
        // The seed, its reshape and expand to [3], times b, times exp(a): nothing for b or c.
        let added: Vec<&str> = g.nodes[before..].iter().map(|n| n.op.name()).collect();
        assert_eq!(added, ["full", "reshape", "expand", "mul", "mul"]);
        assert_eq!(g.meta(da), &m(&[3]));
    }
}

#[cfg(test)]
mod conv_tests {
    use super::backward;
    use crate::decompose::{decompose, decompose_with, DecomposeOptions};
    use coil_ir::op::{ConvForm, ConvGeometry};
    use coil_ir::{DType, Graph, Op, ReduceOp, TensorMeta};

    /// The gradients of a convolution are the template's two other forms, and theirs (gradients
    /// of gradients) are forms again; the reference decomposition expands every one.
    #[test]
    fn convolution_gradients_are_templates_all_the_way_down() {
        let geometry = ConvGeometry { stride: vec![2, 1], padding: vec![1, 0], dilation: vec![1, 2], groups: 2 };
        let mut g = Graph::new();
        let x = g.input(TensorMeta::new(vec![2, 4, 7, 6], DType::F32));
        let w = g.input(TensorMeta::new(vec![6, 2, 3, 2], DType::F32));
        let y = g.push(Op::Conv { geometry: geometry.clone(), form: ConvForm::Forward }, &[x, w], None).unwrap();
        let loss =
            g.push(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1, 2, 3], keepdim: false }, &[y], None).unwrap();
        g.outputs = vec![loss, x, w];
        let options = DecomposeOptions { keep_detach: true, conv_template: true, ..Default::default() };
        let mut p = decompose_with(&g, &options).unwrap();
        let (loss, wrt) = (p.outputs[0], p.outputs[1..].to_vec());
        let grads = backward(&mut p, loss, None, &wrt).unwrap();
        let form = |p: &Graph, n: coil_ir::NodeId| match &p.node(n).op {
            Op::Conv { form, .. } => form.clone(),
            op => panic!("{op} is not a convolution form"),
        };
        assert_eq!(form(&p, grads[0]), ConvForm::BackwardData { size: vec![7, 6] });
        assert_eq!(form(&p, grads[1]), ConvForm::BackwardWeight { kernel: vec![3, 2] });
        assert_eq!(p.meta(grads[0]), p.meta(wrt[0]));
        assert_eq!(p.meta(grads[1]), p.meta(wrt[1]));

        // d/dx of sum(dW) and d/d(dy) of sum(dX): the other forms.
        let total = p.push(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1, 2, 3], keepdim: false }, &[grads[1]], None);
        let second = backward(&mut p, total.unwrap(), None, &[wrt[0]]).unwrap();
        assert!(matches!(p.node(second[0]).op, Op::Reduce { .. } | Op::Conv { .. } | Op::Reshape { .. }));
        p.outputs = std::iter::once(loss).chain(grads).chain(second).collect();
        let reference = decompose(&p).unwrap();
        reference.verify_primitive().unwrap();
        assert!(reference.nodes.iter().all(|n| !n.op.is_template()));
    }
}

#[cfg(test)]
#[path = "autodiff_relu_tests.rs"]
mod relu_tests;
