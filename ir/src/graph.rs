//! The tensor graph: an FX-like arena of nodes in topological order.
//!
//! Each [`Node`] holds an [`Op`], its operands (earlier nodes), its inferred [`TensorMeta`]
//! and the user's source line. [`Graph::push`] infers the meta through [`crate::infer`], so a
//! graph can only hold well-typed nodes. The printer is deterministic: it prints ids, ops,
//! attributes, metas and source lines, never addresses or hash orders.
//!
//! ```
//! use coil_ir::{Graph, Op, UnaryOp, DType, TensorMeta};
//! let mut g = Graph::new();
//! let x = g.input(TensorMeta::new(vec![2, 3], DType::F32));
//! let y = g.push(Op::Unary(UnaryOp::Exp), &[x], None).unwrap();
//! g.outputs.push(y);
//! assert_eq!(g.to_string(), "\
//! graph(%0: f32[2, 3]) {
//!   %1: f32[2, 3] = exp(%0)
//!   return (%1)
//! }
//! ");
//! ```

use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::infer;
use crate::op::Op;
use std::fmt::{self, Write};
use std::panic::Location;

/// A tensor's extent per dim. Sizes are static in the graph; symbolic sizes live in index
/// expressions ([`crate::sym`]) once the graph is lowered.
pub type Shape = Vec<usize>;

/// Number of elements of a shape (1 for a 0-d tensor). Every recorded tensor's shape passes
/// [`check_shape`], so this is exact for them; for a shape that fails it, it saturates at
/// `usize::MAX` instead of overflowing.
pub fn numel(shape: &[usize]) -> usize {
    match shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
        Some(n) => n,
        None if shape.contains(&0) => 0,
        None => usize::MAX,
    }
}

/// The most elements a tensor may hold: PyTorch's sizes, strides and element counts are i64.
pub const MAX_NUMEL: usize = i64::MAX as usize;

/// Checks that a tensor of `shape` can exist, as PyTorch does: its element count, and every
/// stride of it (each dim counted as at least 1), at most [`MAX_NUMEL`]. Every size computation
/// of a valid shape then fits in an `i64`.
///
/// ```
/// use coil_ir::graph::check_shape;
/// assert!(check_shape(&[1 << 31, 1 << 31]).is_ok());
/// assert!(check_shape(&[usize::MAX, 2]).is_err());
/// assert!(check_shape(&[0, 1 << 62, 4]).is_err()); // no elements, but its strides overflow
/// ```
pub fn check_shape(shape: &[usize]) -> Result<()> {
    let mut strides: u128 = 1;
    for &d in shape {
        strides = strides.saturating_mul(d.max(1) as u128);
        if strides > MAX_NUMEL as u128 {
            return Err(Error::shape(format!(
                "a tensor of shape {shape:?} cannot exist: its size overflows (at most 2^63 - 1 elements, counting each empty dim as 1)"
            )));
        }
    }
    Ok(())
}

/// Row-major (C-contiguous) strides of a shape, in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// How a reshape from `from` to `to` (equal element counts, none zero) maps dims: groups of
/// consecutive dims with equal products, each as (dims of `from`, dims of `to`); size-1 dims
/// belong to no group. A merge is one group with several `from` dims, a split one with several
/// `to` dims.
///
/// ```
/// use coil_ir::graph::reshape_groups;
/// assert_eq!(reshape_groups(&[2, 3, 4], &[6, 1, 4]), vec![(vec![0, 1], vec![0]), (vec![2], vec![2])]);
/// ```
pub fn reshape_groups(from: &[usize], to: &[usize]) -> Vec<(Vec<usize>, Vec<usize>)> {
    let ins: Vec<usize> = (0..from.len()).filter(|&d| from[d] != 1).collect();
    let outs: Vec<usize> = (0..to.len()).filter(|&d| to[d] != 1).collect();
    let (mut i, mut o) = (0, 0);
    let mut groups = Vec::new();
    while i < ins.len() && o < outs.len() {
        let (i0, o0) = (i, o);
        let (mut pi, mut po) = (from[ins[i]], to[outs[o]]);
        (i, o) = (i + 1, o + 1);
        while pi != po {
            if pi < po {
                pi *= from[ins[i]];
                i += 1;
            } else {
                po *= to[outs[o]];
                o += 1;
            }
        }
        groups.push((ins[i0..i].to_vec(), outs[o0..o].to_vec()));
    }
    groups
}

/// Shape and dtype of a tensor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMeta {
    /// The size of each dim.
    pub shape: Shape,
    /// The element type.
    pub dtype: DType,
}

impl TensorMeta {
    /// The meta of `shape` and `dtype`.
    pub fn new(shape: impl Into<Shape>, dtype: DType) -> TensorMeta {
        TensorMeta { shape: shape.into(), dtype }
    }
    /// The number of dims.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// The number of elements (1 for a 0-d tensor).
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    /// Bytes the tensor takes when contiguous (saturating: a valid shape's bytes may exceed
    /// `usize` only on a 32-bit host, where no allocation of them can succeed anyway).
    pub fn nbytes(&self) -> usize {
        self.numel().saturating_mul(self.dtype.size_bytes())
    }
}

impl fmt::Display for TensorMeta {
    /// `f32[2, 3]`; a 0-d tensor prints as `f32[]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Index of a node in its graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub usize);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// One op applied to earlier nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The operation.
    pub op: Op,
    /// The operands, earlier nodes of the same graph.
    pub inputs: Vec<NodeId>,
    /// The result's shape and dtype.
    pub meta: TensorMeta,
    /// Where the user's program created this node (decompositions inherit it).
    pub location: Option<&'static Location<'static>>,
    /// The index of the captured graph's node this node computes (part of): set by
    /// decomposition, kept by rewrites and differentiation, so that a compiled graph's data
    /// error names the user's node ([`crate::loops::DataCheck::node`]). `None` in a captured
    /// graph.
    pub origin: Option<usize>,
}

impl Node {
    /// This node reading `inputs` instead (the same op, meta, line and origin).
    pub fn with_inputs(&self, inputs: Vec<NodeId>) -> Node {
        Node { op: self.op.clone(), inputs, meta: self.meta.clone(), location: self.location, origin: self.origin }
    }
}

/// A tensor program: nodes in topological order, the input nodes, and the outputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    /// Every node, operands before their users.
    pub nodes: Vec<Node>,
    /// The [`Op::Input`] nodes, by input index.
    pub inputs: Vec<NodeId>,
    /// The nodes whose values the graph returns, in order.
    pub outputs: Vec<NodeId>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// The node `id`.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0]
    }

    /// The shape and dtype of node `id`.
    pub fn meta(&self, id: NodeId) -> &TensorMeta {
        &self.nodes[id.0].meta
    }

    /// Adds the next graph input.
    pub fn input(&mut self, meta: TensorMeta) -> NodeId {
        let index = self.inputs.len();
        let id = self.leaf(Op::Input { index }, meta, None);
        self.inputs.push(id);
        id
    }

    /// Adds a leaf ([`Op::is_leaf`]) whose meta is given.
    pub fn leaf(&mut self, op: Op, meta: TensorMeta, location: Option<&'static Location<'static>>) -> NodeId {
        debug_assert!(op.is_leaf(), "{op} is not a leaf");
        self.nodes.push(Node { op, inputs: vec![], meta, location, origin: None });
        NodeId(self.nodes.len() - 1)
    }

    /// Adds a constant of the given shape and dtype.
    pub fn full(
        &mut self,
        value: Scalar,
        shape: Shape,
        dtype: DType,
        location: Option<&'static Location<'static>>,
    ) -> NodeId {
        self.leaf(Op::Full(value), TensorMeta::new(shape, dtype), location)
    }

    /// Adds a non-leaf node, inferring its meta. The error names the op and operands.
    pub fn push(&mut self, op: Op, inputs: &[NodeId], location: Option<&'static Location<'static>>) -> Result<NodeId> {
        let operands: Vec<infer::Operand> = inputs
            .iter()
            .map(|&i| infer::Operand { meta: self.meta(i), scalar: matches!(self.node(i).op, Op::Scalar(_)) })
            .collect();
        let meta = infer::infer(&op, &operands).map_err(|e| {
            let described = operands.iter().map(|o| o.meta.to_string()).collect();
            let e = e.in_op(op.name(), described);
            match location {
                Some(l) => e.at(l),
                None => e,
            }
        })?;
        self.nodes.push(Node { op, inputs: inputs.to_vec(), meta, location, origin: None });
        Ok(NodeId(self.nodes.len() - 1))
    }

    /// Checks that every node's shape can exist ([`check_shape`]); the error names the first
    /// node that cannot and its source line. Recording checks every shape already; this guards
    /// graphs built by other means.
    pub fn check_shapes(&self) -> Result<()> {
        for node in &self.nodes {
            check_shape(&node.meta.shape).map_err(|e| {
                let e = e.in_op(node.op.name(), vec![]);
                match node.location {
                    Some(l) => e.at(l),
                    None => e,
                }
            })?;
        }
        Ok(())
    }

    /// Checks the invariants of a primitive graph: every op is primitive, operands of pointwise
    /// nodes have the node's shape and one dtype (broadcasting and promotion made explicit), and
    /// every node's meta is what inference says.
    pub fn verify_primitive(&self) -> Result<()> {
        for (i, node) in self.nodes.iter().enumerate() {
            let bad = |msg: String| Err(Error::runtime(format!("graph is not primitive at %{i} ({}): {msg}", node.op)));
            if !node.op.is_primitive() {
                return bad("composite op".into());
            }
            if node.op.is_pointwise() {
                for &input in &node.inputs {
                    if self.meta(input).shape != node.meta.shape {
                        return bad(format!("operand {input} has shape {:?}", self.meta(input).shape));
                    }
                }
                let data = match node.op {
                    Op::Where => &node.inputs[1..],
                    _ => &node.inputs[..],
                };
                if !matches!(node.op, Op::Cast(_))
                    && data.iter().any(|&x| self.meta(x).dtype != self.meta(data[0]).dtype)
                {
                    return bad("operands differ in dtype".into());
                }
            }
            if matches!(node.op, Op::Cat { .. }) && node.inputs.iter().any(|&x| self.meta(x).dtype != node.meta.dtype) {
                return bad("cat operands differ in dtype from the result".into());
            }
            if !node.op.is_leaf() {
                let operands: Vec<infer::Operand> =
                    node.inputs.iter().map(|&x| infer::Operand { meta: self.meta(x), scalar: false }).collect();
                let meta = infer::infer(&node.op, &operands)?;
                if meta != node.meta {
                    return bad(format!("meta {} but inference says {meta}", node.meta));
                }
            }
        }
        Ok(())
    }

    /// Ids of the nodes the outputs depend on, in topological order.
    pub fn live_nodes(&self) -> Vec<NodeId> {
        let mut live = vec![false; self.nodes.len()];
        for o in &self.outputs {
            live[o.0] = true;
        }
        for i in (0..self.nodes.len()).rev() {
            if live[i] {
                for x in &self.nodes[i].inputs {
                    live[x.0] = true;
                }
            }
        }
        (0..self.nodes.len()).filter(|&i| live[i]).map(NodeId).collect()
    }

    /// Prints the graph, with `# file:line` comments when `with_locations`.
    pub fn print(&self, with_locations: bool) -> String {
        let mut s = String::from("graph(");
        for (k, id) in self.inputs.iter().enumerate() {
            if k > 0 {
                s.push_str(", ");
            }
            let _ = write!(s, "{id}: {}", self.meta(*id));
        }
        s.push_str(") {\n");
        for (i, node) in self.nodes.iter().enumerate() {
            if matches!(node.op, Op::Input { .. }) {
                continue;
            }
            let mut line = format!("  %{i}: {} = {}(", node.meta, node.op.name());
            let mut args: Vec<String> = node.inputs.iter().map(|x| x.to_string()).collect();
            let attrs = node.op.attributes();
            if !attrs.is_empty() {
                args.push(attrs);
            }
            line.push_str(&args.join(", "));
            line.push(')');
            if let (true, Some(loc)) = (with_locations, node.location) {
                let pad = 56usize.saturating_sub(line.len());
                let _ = write!(line, "{:pad$}  # {}:{}", "", loc.file(), loc.line());
            }
            s.push_str(&line);
            s.push('\n');
        }
        let outs: Vec<String> = self.outputs.iter().map(|x| x.to_string()).collect();
        let _ = writeln!(s, "  return ({})\n}}", outs.join(", "));
        s
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.print(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::BinaryOp;

    #[test]
    fn strides() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(contiguous_strides(&[]), Vec::<usize>::new());
    }

    #[test]
    fn push_reports_op_and_operands() {
        let mut g = Graph::new();
        let a = g.input(TensorMeta::new(vec![2, 3], DType::F32));
        let b = g.input(TensorMeta::new(vec![4], DType::F32));
        let e = g.push(Op::Binary(BinaryOp::Add), &[a, b], None).unwrap_err();
        assert_eq!(e.op.as_deref(), Some("add"));
        assert!(e.to_string().contains("f32[2, 3], f32[4]"), "{e}");
    }

    #[test]
    fn verify_rejects_implicit_broadcast() {
        let mut g = Graph::new();
        let a = g.input(TensorMeta::new(vec![2, 3], DType::F32));
        let b = g.input(TensorMeta::new(vec![3], DType::F32));
        let c = g.push(Op::Binary(BinaryOp::Add), &[a, b], None).unwrap();
        g.outputs.push(c);
        assert!(g.verify_primitive().is_err());
    }
}
