//! Lowering: a primitive graph becomes a [`LoopProgram`] (see `docs/compiler.md`, "Loop IR").
//!
//! Each graph node either gets a buffer (it is *realized*: one [`LoopNode`] writes it) or is
//! *inlined*: recomputed inside the body of every node that reads it. Views never get buffers of
//! their own unless something asks for one; they are folded into the index expressions of loads
//! (`view` module). A node is realized when it is
//!
//! * a graph input (buffer `arg<k>`, no node) or a graph output;
//! * a reduction (reductions always write a buffer, their consumers load it), a matrix product,
//!   an attention template, `cumsum` or `scatter` (extern calls; but a scatter at consecutive
//!   positions from a run-time offset, a KV cache write, is a pointwise node that stores
//!   through a [`coil_ir::loops::ScatterStore`]: `scatter` module);
//! * an extern operand that is not an affine view of a buffer (copied into a contiguous one);
//!   when the view *is* affine over an unrealized producer, that producer is realized instead;
//! * the data operand of a gather / index_select that is not an affine view of a buffer along
//!   the indexed dim;
//! * a gather / index_select, or an integer division, remainder or power, read under a pad /
//!   cat mask: masked lanes see made-up zeros, which would make a garbage index or a division
//!   by zero (that generated code reports as an error);
//! * the operand (behind its views) of a node whose inlined body would exceed [`BODY_CAP`]
//!   values, so that bodies stay bounded however long the pointwise chain;
//! * a pointwise node (or pad, or cat) that costs more inlined than stored (`realize` module):
//!   several readers and a body that loads more than [`REALIZE_READS_THRESHOLD`] buffers or
//!   has more than [`REALIZE_OPCOUNT_THRESHOLD`] values; a body that loads more than
//!   [`REALIZE_ACC_READS_THRESHOLD`] buffers; or several readers reading it element for element
//!   and a body that loads at least [`REALIZE_MIN_FULL_READS`] buffers of its own size (a
//!   residual stream is then written once per block, not recomputed by every later reader);
//! * the operand (behind its views) that a node reads only in part (the node has no elements,
//!   is a shorter slice, or picks from it as a gather or index_select does), when computing it
//!   can report a data error (an index out of bounds, an integer division by zero): PyTorch
//!   computes every element of every op and reports the error, so all of it is computed.
//!
//! A matrix product may take the nodes after it into its call (`epilogue` module): the add of a
//! bias row (`linear`), then a gelu with the tanh approximation. Those nodes get no buffer and no
//! loop; the call writes the buffer of the last one.
//!
//! The attention templates (`attention` module) are extern calls on strided views of q, k and
//! v: the forward writes its own buffer (or that of the permute after it when that is its only
//! reader) and the logsumexp a backward needs; the backward writes the gradients of q, k and v,
//! one call per attention, each into a buffer of its own or, when a sum of pads concatenates
//! them (the gradient of a split QKV projection), straight into that sum's buffer, which then
//! needs no loop (`concat_views` module).
//!
//! A convolution template (`conv` module) is one extern call on strided views of its operands;
//! it writes its own buffer, or that of the channels-last permute after it when that is its only
//! reader.
//!
//! Degenerate nodes need no loop at all and are inlined as constants: anything with no elements
//! (but a gather, index_select or scatter with indices to check, which runs as a fallback call
//! so that an index out of bounds is an error, as in PyTorch),
//! a reduction over an empty dim (its identity), a matrix product with `k = 0` (zeros), an arg
//! reduction over no dims (index 0); a reduction over no dims is a pointwise copy (a cast when
//! the result dtype differs, e.g. a sum of ints).
//!
//! `origins` lists the ops that compute; views and constants are named only when a node does
//! nothing else (a transpose copy has `[permute]`), so kernel names say what a kernel computes.
//!
//! Index variables: `x<i>` / `r<i>` ([`range_var`], [`reduction_var`]) for dims of extent >= 2;
//! a dim of extent 1 has the constant index 0, so no variable (and no `+ x1` whose only value is
//! 0) appears in expressions.

mod attention;
mod concat_views;
mod conv;
mod emit;
mod epilogue;
mod realize;
mod scatter;
#[cfg(test)]
pub(crate) mod tests;
mod view;

pub use scatter::repeats_along;

pub use realize::{
    REALIZE_ACC_READS_THRESHOLD, REALIZE_MIN_FULL_READS, REALIZE_OPCOUNT_THRESHOLD, REALIZE_READS_THRESHOLD,
    SMALL_OPERAND_RATIO,
};

use coil_ir::dynamic::SymSizes;
use coil_ir::loops::{
    range_var, reduction_var, ActivationGrad, BiasOperand, Bindings, Body, BufferId, DataCheck, ExternCall, LoopBuffer,
    LoopKind, LoopNode, LoopProgram, ScalarOp, SizeSymbol, StridedOperand, ValueId,
};
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, Error, Graph, NodeId, Op, ReduceOp, Result, TensorMeta};
use epilogue::Epilogue;
use std::collections::{HashMap, HashSet};

/// Most values a node's body may have before its producers are realized instead of inlined.
pub const BODY_CAP: usize = 128;

/// Lowers a primitive graph (checked with [`Graph::verify_primitive`]) to loop IR.
///
/// Only the nodes the outputs depend on are lowered. Buffers: `arg<k>` for the graph inputs (in
/// order, first), then `buf<N>` written by `nodes[N]`. An output that is an input, or the same
/// node as another output, reuses that buffer.
pub fn lower(graph: &Graph) -> Result<LoopProgram> {
    lower_dynamic(graph, &SymSizes::constant(graph), vec![])
}

/// [`lower`] with symbolic sizes: `sizes` gives every size number of `graph` as an expression
/// of `symbols` (see [`coil_ir::dynamic`]), and the program computes with those expressions, so
/// one program serves every binding of the symbols. Buffer metas are taken at the hints.
pub fn lower_dynamic(graph: &Graph, sizes: &SymSizes, symbols: Vec<SizeSymbol>) -> Result<LoopProgram> {
    graph.verify_primitive()?;
    let mut l = Lowerer::new(graph, sizes);
    l.hints = symbols.iter().map(|s| (s.symbol, s.hint)).collect();
    l.prog.symbols = symbols;
    for (k, &id) in graph.inputs.iter().enumerate() {
        let b = l.new_buffer(format!("arg{k}"), id);
        l.prog.inputs.push(b);
        l.buf[id.0] = Some(b);
    }
    let mut is_output = vec![false; graph.nodes.len()];
    for o in &graph.outputs {
        is_output[o.0] = true;
    }
    for id in graph.live_nodes() {
        l.prepare(id)?;
        if is_output[id.0] {
            l.realize(id)?;
        }
    }
    l.prog.outputs = graph.outputs.iter().map(|o| l.buf[o.0].expect("outputs are realized")).collect();
    // The program's text names buffers: a name given twice would make it read back as
    // another program (and the graph cache would not keep it).
    debug_assert!(
        {
            let mut seen = std::collections::HashSet::new();
            l.prog.buffers.iter().all(|b| seen.insert(&b.name))
        },
        "two buffers of one name in\n{}",
        l.prog
    );
    Ok(l.prog)
}

/// The state of one lowering.
pub(crate) struct Lowerer<'g> {
    g: &'g Graph,
    /// Every node's size numbers as expressions (constants for static shapes).
    sizes: &'g SymSizes,
    /// The size symbols' hints: buffer metas are taken there.
    hints: Bindings,
    prog: LoopProgram,
    /// The buffer holding each graph node's value, once realized.
    buf: Vec<Option<BufferId>>,
    /// Matrix products computed with the nodes after them (a bias add, a gelu) in one call, by
    /// the node whose buffer the call writes (`epilogue` module).
    epilogues: HashMap<NodeId, Epilogue>,
    /// The other nodes those calls compute (products included): no buffer, no loop.
    inside: HashSet<NodeId>,
    /// Activation inputs a product's call also writes (for a backward that reads them), with
    /// the node whose buffer the call writes.
    saved_by: HashMap<NodeId, NodeId>,
    /// Attention nodes computed by the call that writes the buffer of the permute after them,
    /// by permute (the attention nodes are in `inside`); and attention gradients whose call
    /// writes the buffer of the sum of pads after them, by sum (`concat_views`).
    attention_roots: HashMap<NodeId, NodeId>,
    /// Attention gradients written into the buffer of the sum of pads that concatenates them,
    /// and where (`concat_views`).
    placed: HashMap<NodeId, concat_views::Placed>,
    /// Convolutions computed by the call that writes the buffer of the channels-last permute
    /// after them, by permute (the convolutions are in `inside`).
    conv_roots: HashMap<NodeId, NodeId>,
    /// The attention template nodes one call computes together (`attention` module), and each
    /// template node's group.
    groups: Vec<Vec<NodeId>>,
    group_of: HashMap<NodeId, usize>,
    /// The live nodes reading each node, once per operand that reads it.
    readers: Vec<Vec<NodeId>>,
    /// The full-reads realization threshold in force ([`realize::REALIZE_MIN_FULL_READS`]
    /// unless [`coil_ir::config::Tuning::realize_min_full_reads`] sets it).
    min_full_reads: usize,
}

/// One body under construction: the values, a memo of emitted `(node, index, mask)` triples
/// (so a producer read twice at one index is emitted once, without exponential recursion over
/// diamonds), and the graph nodes folded into it (its origins).
pub(crate) struct Emit {
    body: Body,
    memo: HashMap<(NodeId, Vec<Expr>, Option<ValueId>), ValueId>,
    folded: Vec<NodeId>,
}

impl Emit {
    fn new() -> Emit {
        Emit { body: Body::default(), memo: HashMap::new(), folded: Vec::new() }
    }

    fn push(&mut self, op: ScalarOp, dtype: DType) -> ValueId {
        self.body.push(op, dtype)
    }

    fn dtype(&self, v: ValueId) -> DType {
        self.body.value(v).dtype
    }
}

/// The index variables of a shape: `make(i, extent)` for extents >= 2, the constant 0 for
/// extents 1 and 0 (nothing is read at an extent of 0). `make` is [`range_var`]
/// or [`reduction_var`]; the scheduler rebuilds a node's variables with this same function.
pub(crate) fn vars(shape: &[Expr], make: fn(usize, &Expr) -> Expr) -> Vec<Expr> {
    // A dim of one element has index 0; a dim of none has no index at all (nothing reads it):
    // 0 stands for it, as an index needs a positive extent.
    let single = |n: &Expr| *n == Expr::int(1) || *n == Expr::int(0);
    shape.iter().enumerate().map(|(i, n)| if single(n) { Expr::int(0) } else { make(i, n) }).collect()
}

/// Row-major strides of a contiguous tensor of `shape`.
pub(crate) fn strides(shape: &[Expr]) -> Vec<Expr> {
    let mut out = vec![Expr::int(1); shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        out[i] = out[i + 1] * shape[i + 1];
    }
    out
}

/// Row-major flat index of `idx` in a contiguous tensor of `shape`.
pub(crate) fn flat(idx: &[Expr], shape: &[Expr]) -> Expr {
    idx.iter().zip(strides(shape)).map(|(&i, s)| i * s).sum()
}

impl<'g> Lowerer<'g> {
    fn new(g: &'g Graph, sizes: &'g SymSizes) -> Lowerer<'g> {
        let mut l = Lowerer {
            g,
            sizes,
            hints: Bindings::new(),
            prog: LoopProgram::default(),
            buf: vec![None; g.nodes.len()],
            epilogues: HashMap::new(),
            inside: HashSet::new(),
            saved_by: HashMap::new(),
            attention_roots: HashMap::new(),
            placed: HashMap::new(),
            conv_roots: HashMap::new(),
            groups: Vec::new(),
            group_of: HashMap::new(),
            readers: vec![Vec::new(); g.nodes.len()],
            min_full_reads: coil_ir::config::current()
                .tuning
                .realize_min_full_reads
                .unwrap_or(realize::REALIZE_MIN_FULL_READS),
        };
        for n in g.live_nodes() {
            for x in &g.node(n).inputs {
                l.readers[x.0].push(n);
            }
        }
        (l.epilogues, l.inside) = epilogue::epilogues(&l);
        l.saved_by = l.epilogues.iter().filter_map(|(&root, ep)| Some((ep.saved?, root))).collect();
        l.attention_roots = attention::permuted_outputs(&l);
        l.inside.extend(l.attention_roots.values().copied());
        l.conv_roots = conv::permuted_outputs(&l);
        l.inside.extend(l.conv_roots.values().copied());
        (l.group_of, l.groups) = attention::template_groups(&l);
        let found = concat_views::placed_gradients(&l);
        l.attention_roots.extend(found.roots);
        l.inside.extend(found.inside);
        l.placed = found.placed;
        l
    }

    /// A buffer holding node `n`'s value.
    fn new_buffer(&mut self, name: String, n: NodeId) -> BufferId {
        self.new_buffer_of(name, self.shape(n).to_vec(), self.meta(n).dtype)
    }

    /// A buffer of `shape` (expressions of the size symbols) and `dtype`.
    fn new_buffer_of(&mut self, name: String, shape: Vec<Expr>, dtype: DType) -> BufferId {
        let dims: Vec<usize> = if self.hints.is_empty() {
            shape.iter().map(|e| coil_ir::loops::const_usize(e).expect("static sizes are constants")).collect()
        } else {
            shape.iter().map(|e| e.eval(&self.hints).map_or(0, |v| v.max(0) as usize)).collect()
        };
        self.prog.buffers.push(LoopBuffer { name, meta: TensorMeta::new(dims, dtype), shape });
        BufferId(self.prog.buffers.len() - 1)
    }

    /// Dtype and sizes of `n` (at the sizes the graph was built with; for decisions that hold
    /// at every size, such as "this dim is 1", and dtypes).
    fn meta(&self, n: NodeId) -> &'g TensorMeta {
        self.g.meta(n)
    }

    /// `n`'s dims as expressions of the size symbols.
    pub(crate) fn shape(&self, n: NodeId) -> &'g [Expr] {
        self.sizes.shape(n.0, self.g.meta(n).rank())
    }

    /// `n`'s size attributes as expressions ([`coil_ir::dynamic::size_numbers`] order).
    pub(crate) fn attrs(&self, n: NodeId) -> &'g [Expr] {
        self.sizes.attrs(n.0, self.g.meta(n).rank())
    }

    /// Whether a node needs no loop: it is inlined as a constant (see the module docs).
    fn degenerate(&self, n: NodeId) -> bool {
        let node = self.g.node(n);
        if node.meta.numel() == 0 {
            return !self.checks_indices_only(n);
        }
        match &node.op {
            Op::Reduce { op, dims, .. } => {
                let x = self.meta(node.inputs[0]);
                dims.is_empty() || x.shape.is_empty() || (!op.is_arg() && dims.iter().any(|&d| x.shape[d] == 0))
            }
            Op::Bmm => {
                let a = &self.meta(node.inputs[0]).shape;
                a[a.len() - 1] == 0
            }
            _ => false,
        }
    }

    /// Whether `n` is an indexing op (gather, index_select, scatter) with no elements to
    /// compute but index values to check: PyTorch refuses an index out of bounds even then, so
    /// it runs as a fallback call (the interpreter checks every index) instead of vanishing as
    /// a constant.
    fn checks_indices_only(&self, n: NodeId) -> bool {
        let node = self.g.node(n);
        let indexing = matches!(node.op, Op::Gather { .. } | Op::IndexSelect { .. } | Op::Scatter { .. });
        indexing && node.meta.numel() == 0 && self.meta(node.inputs[1]).numel() > 0
    }

    /// Realizes the operands `n` reads only in part, when computing them can report a data
    /// error (an index out of bounds, an integer division by zero): PyTorch computes every
    /// element of every op, and so reports an error in any of them. A node reads an operand in
    /// part when it has no elements itself, when it is a slice shorter than its operand, or when
    /// the operand is the data a gather or index_select picks from.
    fn realize_partly_read(&mut self, n: NodeId) -> Result<()> {
        let node = self.g.node(n);
        for (k, &x) in node.inputs.iter().enumerate() {
            let partly = node.meta.numel() == 0
                || match &node.op {
                    Op::Slice { dim, len, .. } => *len < self.meta(x).shape[*dim],
                    Op::Gather { .. } | Op::IndexSelect { .. } => k == 0,
                    _ => false,
                };
            let base = self.view_base(x);
            if partly && self.meta(base).numel() > 0 && self.may_fail(base) {
                self.realize(base)?;
            }
        }
        Ok(())
    }

    /// Whether computing `n`, with the producers not realized inlined into it, can report a
    /// data error: an index out of bounds, an integer division by zero, an integer raised to a
    /// negative power.
    fn may_fail(&self, n: NodeId) -> bool {
        let (mut stack, mut seen) = (vec![n], HashSet::new());
        while let Some(n) = stack.pop() {
            if !seen.insert(n) || self.buf[n.0].is_some() {
                continue;
            }
            let node = self.g.node(n);
            let checks = match &node.op {
                Op::Gather { .. } | Op::IndexSelect { .. } | Op::Scatter { .. } => true,
                Op::Binary(b) => {
                    use coil_ir::BinaryOp::{FloorDiv, Pow, Remainder, TruncDiv};
                    node.meta.dtype.is_integral() && matches!(b, FloorDiv | TruncDiv | Remainder | Pow)
                }
                _ => false,
            };
            if checks {
                return true;
            }
            stack.extend(node.inputs.iter().copied());
        }
        false
    }

    /// Decides, in graph order, which nodes get buffers (see the module docs); outputs are
    /// realized by the caller.
    fn prepare(&mut self, n: NodeId) -> Result<()> {
        let node = self.g.node(n);
        if self.buf[n.0].is_none() {
            self.realize_partly_read(n)?;
        }
        if self.buf[n.0].is_some() || self.degenerate(n) {
            return Ok(());
        }
        match &node.op {
            // A product whose only reader adds a bias row (and maybe applies a gelu) is computed
            // by the call that writes the last node's buffer.
            _ if self.epilogues.contains_key(&n) || self.saved_by.contains_key(&n) => {
                self.realize(n)?;
            }
            _ if self.inside.contains(&n) => {}
            _ if self.attention_roots.contains_key(&n) || self.conv_roots.contains_key(&n) => {
                self.realize(n)?;
            }
            Op::Reduce { .. } | Op::Bmm | Op::Cumsum { .. } | Op::Argsort { .. } | Op::Scatter { .. } => {
                self.realize(n)?;
            }
            op if op.is_template() => {
                self.realize(n)?;
            }
            _ if self.checks_indices_only(n) => {
                self.realize(n)?;
            }
            op if op.is_pointwise() || matches!(op, Op::Pad { .. } | Op::Cat { .. }) => self.settle(n)?,
            _ => {}
        }
        Ok(())
    }

    /// Decides a pointwise node (or pad, or cat): its producers (behind their views) are
    /// realized when inlining them would make `n`'s body exceed [`BODY_CAP`] values (each
    /// producer passed this check itself, so bodies stay within a small multiple of the cap);
    /// then `n` is realized when inlining it into its readers costs more than storing it
    /// (`realize` module).
    fn settle(&mut self, n: NodeId) -> Result<()> {
        let mut body = self.inlined_body(n)?;
        if body.values.len() > BODY_CAP {
            for &x in &self.g.node(n).inputs {
                let base = self.view_base(x);
                if self.buf[base.0].is_none() && !self.g.node(base).op.is_leaf() && !self.degenerate(base) {
                    self.realize(base)?;
                }
            }
            body = self.inlined_body(n)?;
        }
        if self.costs_more_inlined(n, &body) {
            self.realize(n)?;
        }
        Ok(())
    }

    /// `n`'s body as it would be inlined now (its realized producers loaded, the others
    /// inlined), for the decisions above.
    fn inlined_body(&mut self, n: NodeId) -> Result<Body> {
        let mut scratch = Emit::new();
        let idx = vars(self.shape(n), range_var);
        self.emit(&mut scratch, n, &idx, None)?;
        Ok(scratch.body)
    }

    /// Gives `n` a buffer (if it has none): a node computing it, after any node it needs.
    pub(crate) fn realize(&mut self, n: NodeId) -> Result<BufferId> {
        if let Some(b) = self.buf[n.0] {
            return Ok(b);
        }
        if let Some(&root) = self.saved_by.get(&n) {
            self.realize(root)?;
            return Ok(self.buf[n.0].expect("the call saving it gave it its buffer"));
        }
        let node = self.g.node(n);
        if let Op::Conv { .. } = node.op {
            return self.realize_conv(n);
        }
        if let Some(&conv) = self.conv_roots.get(&n) {
            return self.realize_conv(conv);
        }
        if node.op.is_template() || self.attention_roots.contains_key(&n) {
            return self.realize_template(n);
        }
        let scattered = match node.op {
            Op::Scatter { .. } if !self.degenerate(n) && !self.checks_indices_only(n) => self.window_scatter(n)?,
            _ => None,
        };
        let (kind, folded) = match &node.op {
            _ if self.degenerate(n) => self.pointwise(n)?,
            _ if scattered.is_some() => scattered.expect("matched"),
            _ if self.epilogues.contains_key(&n) => {
                let ep = self.epilogues[&n].clone();
                let folded = [ep.mm].into_iter().chain(ep.inside.iter().copied()).chain(ep.saved).chain([n]).collect();
                (self.bmm(ep.mm, Some(&ep))?, folded)
            }
            Op::Reduce { op, dims, keepdim } => self.reduction(n, *op, dims, *keepdim)?,
            Op::Bmm => (self.bmm(n, None)?, vec![n]),
            _ if self.checks_indices_only(n)
                || matches!(node.op, Op::Cumsum { .. } | Op::Argsort { .. } | Op::Scatter { .. }) =>
            {
                let inputs = node.inputs.iter().map(|&x| self.realize(x)).collect::<Result<Vec<_>>>()?;
                (LoopKind::Extern { call: ExternCall::Fallback { op: node.op.clone() }, inputs }, vec![n])
            }
            _ => self.pointwise(n)?,
        };
        let origins = self.origins(folded.clone());
        let output = self.new_buffer(format!("buf{}", self.prog.nodes.len()), n);
        self.record_data_checks(&folded, output);
        self.prog.nodes.push(LoopNode { output, origins, kind });
        self.buf[n.0] = Some(output);
        Ok(output)
    }

    /// Records the folded graph nodes whose kernels check data at run time (indices within
    /// bounds, integer divisors, integer powers), so that a kernel's data error names the
    /// user's op ([`coil_ir::loops::DataCheck`]).
    fn record_data_checks(&mut self, folded: &[NodeId], output: BufferId) {
        let mut folded = folded.to_vec();
        folded.sort();
        folded.dedup();
        for n in folded {
            let node = self.g.node(n);
            let integral = node.meta.dtype.is_integral();
            let (code, dim) = match &node.op {
                Op::IndexSelect { dim } | Op::Gather { dim } => (1, Some(*dim)),
                Op::Scatter { dim, .. } => (1, Some(*dim)),
                Op::Binary(BinaryOp::Pow) if integral => (2, None),
                Op::Binary(BinaryOp::FloorDiv | BinaryOp::TruncDiv | BinaryOp::Remainder) if integral => (3, None),
                _ => continue,
            };
            let check = DataCheck { buffer: output, code, op: node.op.name(), dim, node: node.origin };
            if !self.prog.data_checks.contains(&check) {
                self.prog.data_checks.push(check);
            }
        }
    }

    /// The op names of the folded graph nodes, in graph order, each once. Views and constants
    /// only move or fill data, so they are left out of a node that also computes something:
    /// kernel names then say what a kernel computes (`poi_fused_add_gelu`), not how it indexes.
    fn origins(&self, mut folded: Vec<NodeId>) -> Vec<&'static str> {
        folded.sort();
        folded.dedup();
        let names = |keep: &dyn Fn(&Op) -> bool| {
            let mut out: Vec<&'static str> = Vec::new();
            for n in &folded {
                let op = &self.g.node(*n).op;
                if keep(op) && !out.contains(&op.name()) {
                    out.push(op.name());
                }
            }
            out
        };
        let computing = names(&|op| !op.is_view() && !matches!(op, Op::Full(_) | Op::Input { .. }));
        if computing.is_empty() {
            names(&|op| !matches!(op, Op::Input { .. }))
        } else {
            computing
        }
    }

    fn pointwise(&mut self, n: NodeId) -> Result<(LoopKind, Vec<NodeId>)> {
        let shape = self.shape(n);
        let mut e = Emit::new();
        // An empty node has no index to vary (and extent-0 variables cannot exist).
        let idx = if self.meta(n).numel() == 0 { vec![Expr::int(0); shape.len()] } else { vars(shape, range_var) };
        e.body.result = self.compute(&mut e, n, &idx, None)?;
        Ok((LoopKind::Pointwise { ranges: shape.to_vec(), body: e.body, scatter: None }, e.folded))
    }

    /// A reduction node: `ranges` are the output dims (kept size-1 dims included), the
    /// reduction ranges the reduced dims in increasing order, as the interpreter visits them.
    fn reduction(&mut self, n: NodeId, op: ReduceOp, dims: &[usize], keepdim: bool) -> Result<(LoopKind, Vec<NodeId>)> {
        let node = self.g.node(n);
        let x = node.inputs[0];
        let xs = self.shape(x);
        let mut reduced: Vec<usize> = dims.to_vec();
        reduced.sort_unstable();
        let rshape: Vec<Expr> = reduced.iter().map(|&d| xs[d]).collect();
        let (xv, rv) = (vars(self.shape(n), range_var), vars(&rshape, reduction_var));
        let mut kept = 0;
        let idx: Vec<Expr> = (0..xs.len())
            .map(|d| match reduced.iter().position(|&r| r == d) {
                Some(j) => {
                    kept += keepdim as usize;
                    rv[j]
                }
                None => {
                    kept += 1;
                    xv[kept - 1]
                }
            })
            .collect();
        let mut e = Emit::new();
        e.folded.push(n);
        let mut v = self.emit(&mut e, x, &idx, None)?;
        // Sums and products of ints accumulate in the (i64) result type: make that explicit.
        if !op.is_arg() && e.dtype(v) != node.meta.dtype {
            v = e.push(ScalarOp::Cast(v), node.meta.dtype);
        }
        e.body.result = v;
        let kind = LoopKind::Reduction { ranges: self.shape(n).to_vec(), reduction_ranges: rshape, op, body: e.body };
        Ok((kind, e.folded))
    }

    /// `out[b] = a[b] @ c[b]`, each operand a strided view of a buffer; with an epilogue, the
    /// add of its bias row and its activation (or an activation's gradient, reading the
    /// activation's saved input) are part of the call.
    fn bmm(&mut self, n: NodeId, epilogue: Option<&Epilogue>) -> Result<LoopKind> {
        let node = self.g.node(n);
        let (a, c) = (self.strided(node.inputs[0])?, self.strided(node.inputs[1])?);
        let out = self.shape(n);
        let r = out.len();
        let (m, nn) = (out[r - 2], out[r - 1]);
        let k = self.shape(node.inputs[0])[r - 1];
        let mut inputs = vec![a.buffer, c.buffer];
        let bias = match epilogue.and_then(|ep| ep.bias) {
            Some((add, bias)) => {
                let syms = view_vars(self.shape(add));
                let (base, bidx) = self.resolve(bias, &syms);
                let (offset, strides) =
                    affine(flat(&bidx, self.shape(base)), &syms).expect("checked by epilogue::bias_epilogues");
                let buffer = self.realize(base)?;
                inputs.push(buffer);
                Some(BiasOperand { buffer, offset, stride: strides[strides.len() - 1] })
            }
            None => None,
        };
        let activation = epilogue.and_then(|ep| ep.activation);
        let activation_grad = match epilogue.and_then(|ep| ep.activation_grad) {
            Some((activation, y)) => {
                let aux = self.realize(y)?;
                inputs.push(aux);
                Some(ActivationGrad { activation, aux })
            }
            None => None,
        };
        // The saved activation input: named after the buffer `realize` gives the call next.
        let saved = epilogue.and_then(|ep| ep.saved).map(|y| {
            let buffer = self.new_buffer(format!("buf{}_saved", self.prog.nodes.len()), y);
            self.buf[y.0] = Some(buffer);
            buffer
        });
        let batch = out[..r - 2].to_vec();
        let call = ExternCall::Bmm { a, b: c, bias, activation, activation_grad, saved, batch, m, n: nn, k };
        Ok(LoopKind::Extern { call, inputs })
    }

    /// `x` as a strided view of a buffer: the view chain is folded when it is affine over its
    /// base (which is realized if needed); otherwise `x` is copied into a contiguous buffer.
    fn strided(&mut self, x: NodeId) -> Result<StridedOperand> {
        let shape = self.shape(x);
        let syms = view_vars(shape);
        let (base, bidx) = self.resolve(x, &syms);
        let found = affine(flat(&bidx, self.shape(base)), &syms);
        let (buffer, offset, strides) = match found {
            Some((offset, strides)) if !self.degenerate(base) => (self.realize(base)?, offset, strides),
            _ => (self.realize(x)?, Expr::int(0), self::strides(shape)),
        };
        let r = shape.len();
        Ok(StridedOperand {
            buffer,
            offset,
            batch_strides: strides[..r - 2].to_vec(),
            row_stride: strides[r - 2],
            col_stride: strides[r - 1],
        })
    }
}

/// Index variables `t0, t1, ...` over `shape` for finding a view's strides ([`affine`]).
fn view_vars(shape: &[Expr]) -> Vec<Expr> {
    vars(shape, |i, n| Expr::index_upto(&format!("t{i}"), *n))
}

/// `e` as `offset + sum(stride_i * syms_i)` with offset and strides free of `syms` and known
/// non-negative (constants, or expressions of the size symbols), if it is one (a dim whose
/// symbol is the constant 0 gets stride 0).
fn affine(e: Expr, syms: &[Expr]) -> Option<(Expr, Vec<Expr>)> {
    let at = |one: Option<Expr>| {
        e.substitute_with(|s| if Some(s) == one { Some(Expr::int(1)) } else { syms.contains(&s).then(|| Expr::int(0)) })
    };
    let free = |x: Expr| x.is_known_nonnegative() && x.free_symbols().iter().all(|s| !syms.contains(s));
    let offset = at(None);
    if !free(offset) {
        return None;
    }
    let mut strides = Vec::with_capacity(syms.len());
    let mut rebuilt = offset;
    for &s in syms {
        let stride = if s.const_value().is_some() { Expr::int(0) } else { at(Some(s)) - offset };
        if !free(stride) {
            return None;
        }
        rebuilt = rebuilt + s * stride;
        strides.push(stride);
    }
    (rebuilt == e).then_some((offset, strides))
}

/// The error for a `Rand` offset that does not fit the i64 index algebra.
fn offset_error(offset: u64) -> Error {
    Error::unsupported(format!("rand offset {offset} does not fit in an i64 index"))
}
