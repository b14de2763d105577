//! Guards: what must hold for a cached compilation to serve a new call, and the structural hash
//! that finds the candidate compilation fast.
//!
//! A captured graph already carries everything its compilation depends on: its input metas
//! (dtypes and sizes), its ops with their attributes, every node's meta and the edges between
//! nodes. So the guards of a cached graph are exactly "the newly captured graph is this one, on
//! this device". They are checked in two steps: an FNV-1a hash of the structure
//! ([`structural_hash`]) picks the candidates, and a node-by-node comparison
//! ([`same_structure`]) confirms the hit, so a hash collision can never run the wrong code.
//!
//! For people, the same guards are spelled out per graph ([`Guard`]): one `TENSOR_MATCH` per
//! graph input (dtype, device, static sizes) and one `GRAPH_STRUCTURE`. Sizes are static: every
//! size is part of the guard, so sizes 0 and 1 are specialized like all others.

use super::dynamic::DynamicSpec;
use coil_ir::sym::Expr;
use coil_ir::{DType, Graph, Op, TensorMeta};
use coil_runtime::Device;
use std::fmt::{self, Write};
use std::hash::{Hash, Hasher};

/// 64-bit FNV-1a: simple, fast, and the same in every process (unlike the standard library's
/// randomly keyed SipHash), so a graph's hash can be printed and compared. It takes 8 bytes per
/// step (xor a word, multiply) rather than one: a cache hit hashes the whole graph, and a
/// collision costs only a failed comparison.
pub(crate) struct Fnv(u64);

impl Fnv {
    pub(crate) fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn word(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(0x0000_0100_0000_01b3);
    }
}

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for &b in chunks.remainder() {
            self.word(b as u64);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.word(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.word(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Write for Fnv {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        Hasher::write(self, s.as_bytes());
        Ok(())
    }
}

/// The structural hash of a graph on a device: FNV-1a over every node's op and attributes,
/// meta and operand edges, then the graph's inputs and outputs. Source lines are left out: the
/// same program written on other lines compiles to the same code.
///
/// ```
/// use coil_frontend::dynamo::structural_hash;
/// use coil_frontend::{capture, Tensor};
/// use coil_runtime::Device;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
/// let (a, b) = (x.exp().unwrap(), x.exp().unwrap());
/// let (ga, gb) = (capture(&[&a]).graph, capture(&[&b]).graph);
/// assert_eq!(structural_hash(&ga, Device::Cpu), structural_hash(&gb, Device::Cpu));
/// let c = x.log().unwrap();
/// assert_ne!(structural_hash(&ga, Device::Cpu), structural_hash(&capture(&[&c]).graph, Device::Cpu));
/// ```
pub fn structural_hash(graph: &Graph, device: Device) -> u64 {
    let mut h = Fnv::new();
    device.hash(&mut h);
    graph.nodes.len().hash(&mut h);
    for node in &graph.nodes {
        // The op's Debug form names the variant and every attribute; writing it straight into
        // the hasher costs no allocation.
        let _ = write!(h, "{:?}", node.op);
        node.inputs.len().hash(&mut h);
        for i in &node.inputs {
            i.0.hash(&mut h);
        }
        node.meta.hash(&mut h);
    }
    for i in &graph.inputs {
        i.0.hash(&mut h);
    }
    for o in &graph.outputs {
        o.0.hash(&mut h);
    }
    h.finish()
}

/// Whether two graphs are the same program: equal ops and attributes, metas, edges, inputs and
/// outputs (source lines ignored). Confirms a hash hit.
pub fn same_structure(a: &Graph, b: &Graph) -> bool {
    a.nodes.len() == b.nodes.len()
        && a.inputs == b.inputs
        && a.outputs == b.outputs
        && a.nodes.iter().zip(&b.nodes).all(|(x, y)| x.inputs == y.inputs && x.meta == y.meta && same_op(&x.op, &y.op))
}

/// Op equality where a NaN attribute equals itself (as in the printed graph that used to key the
/// cache): otherwise a graph holding a NaN constant would never hit.
pub(crate) fn same_op(a: &Op, b: &Op) -> bool {
    a == b || format!("{a:?}") == format!("{b:?}")
}

/// Where a graph input comes from, as guards name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The compiled function's argument `args[i]`.
    Arg(usize),
    /// Output `output` of an earlier graph of the same call (1-based graph number), computed
    /// before a graph break.
    GraphOutput {
        /// The earlier graph, numbered from 1.
        graph: usize,
        /// Which of its outputs.
        output: usize,
    },
    /// A computed tensor the function captured (a weight in its closure, data it made).
    Captured,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Arg(i) => write!(f, "args[{i}]"),
            Source::GraphOutput { graph, output } => write!(f, "graph {graph} output {output}"),
            Source::Captured => f.write_str("captured tensor"),
        }
    }
}

/// One condition a cached graph needs to hold before it serves a call.
#[derive(Clone, Debug, PartialEq)]
pub enum Guard {
    /// Graph input `input` has exactly this dtype, device and sizes. Sizes are static: every
    /// size is guarded (0 and 1 included).
    TensorMatch {
        /// The graph input checked.
        input: usize,
        /// Where the input comes from.
        source: Source,
        /// The dtype and sizes it must have.
        meta: TensorMeta,
        /// The device it must be on.
        device: Device,
    },
    /// The captured graph is this one: ops, attributes, metas and edges (hash, then a
    /// node-by-node comparison).
    GraphStructure {
        /// The graph's structural hash.
        hash: u64,
        /// The graph's node count.
        nodes: usize,
        /// The graph's input count.
        inputs: usize,
        /// The graph's output count.
        outputs: usize,
    },
    /// Graph input `input` has this dtype and device, and sizes that are these expressions of
    /// the size symbols (a constant is exact).
    DynamicTensorMatch {
        /// The graph input checked.
        input: usize,
        /// Where the input comes from.
        source: Source,
        /// The dtype it must have.
        dtype: DType,
        /// Its sizes, as expressions of the size symbols.
        shape: Vec<Expr>,
        /// The device it must be on.
        device: Device,
    },
    /// A size symbol: graph input `input`'s size at `dim`, at least 2 (0 and 1 are specialized).
    SizeSymbol {
        /// The symbol.
        symbol: Expr,
        /// The graph input whose size it is.
        input: usize,
        /// The dim of that input.
        dim: usize,
    },
    /// The captured graph is this one up to its sizes (hash of the graph without its sizes,
    /// then a node-by-node comparison), and each of its sizes is its expression at the
    /// symbols' values.
    GraphStructureUpToSizes {
        /// The hash of the graph without its sizes.
        hash: u64,
        /// The graph's node count.
        nodes: usize,
        /// How many of the graph's size numbers are expressions of the symbols (not constants).
        sizes: usize,
    },
}

impl fmt::Display for Guard {
    /// `{:#}` adds the structural hash (left out of the plain form so that reports stay the
    /// same when the op set's Debug form changes).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Guard::TensorMatch { input, source, meta, device } => {
                write!(f, "TENSOR_MATCH graph input {input} ({source}): {meta} on {device}, static sizes")
            }
            Guard::DynamicTensorMatch { input, source, dtype, shape, device } => {
                let dims: Vec<String> = shape.iter().map(|e| e.to_string()).collect();
                write!(f, "TENSOR_MATCH graph input {input} ({source}): {dtype}[{}] on {device}", dims.join(", "))
            }
            Guard::SizeSymbol { symbol, input, dim } => {
                write!(f, "SYMBOLIC_SIZE {symbol} = size[{dim}] of graph input {input}, {symbol} >= 2")
            }
            Guard::GraphStructureUpToSizes { hash, nodes, sizes } => {
                write!(f, "GRAPH_STRUCTURE up to sizes: {nodes} nodes, {sizes} symbolic sizes checked")?;
                if f.alternate() {
                    write!(f, ", hash {hash:#018x}")?;
                }
                Ok(())
            }
            Guard::GraphStructure { hash, nodes, inputs, outputs } => {
                let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
                write!(
                    f,
                    "GRAPH_STRUCTURE: {}, {}, {}",
                    plural(*nodes, "node"),
                    plural(*inputs, "input"),
                    plural(*outputs, "output")
                )?;
                if f.alternate() {
                    write!(f, ", hash {hash:#018x}")?;
                }
                Ok(())
            }
        }
    }
}

/// The guards of a graph compiled for every size of its symbols (`spec`), whose inputs come
/// from `sources`; `hash` is its [`erased_hash`].
pub(crate) fn dynamic_guards_of(
    graph: &Graph,
    device: Device,
    hash: u64,
    sources: &[Source],
    spec: &DynamicSpec,
) -> Vec<Guard> {
    let mut guards: Vec<Guard> = graph
        .inputs
        .iter()
        .enumerate()
        .map(|(i, &id)| Guard::DynamicTensorMatch {
            input: i,
            source: sources.get(i).copied().unwrap_or(Source::Captured),
            dtype: graph.meta(id).dtype,
            shape: spec.sizes.shape(id.0, graph.meta(id).rank()).to_vec(),
            device,
        })
        .collect();
    guards.extend(spec.symbols.iter().map(|s| Guard::SizeSymbol { symbol: s.symbol, input: s.input, dim: s.dim }));
    let symbolic = spec.sizes.nodes.iter().flatten().filter(|e| e.const_value().is_none()).count();
    guards.push(Guard::GraphStructureUpToSizes { hash, nodes: graph.nodes.len(), sizes: symbolic });
    guards
}

/// The hash of a graph on a device with its sizes left out (ops by name, metas as dtype and
/// rank): equal for the same program at other sizes, so it finds the
/// candidate entries compiled for symbolic sizes.
pub fn erased_hash(graph: &Graph, device: Device) -> u64 {
    let mut h = Fnv::new();
    device.hash(&mut h);
    graph.nodes.len().hash(&mut h);
    for node in &graph.nodes {
        // Ops hash by name only (no formatting of attributes, which may hold sizes): equal
        // hashes are confirmed by the comparison up to sizes.
        node.op.name().hash(&mut h);
        node.inputs.len().hash(&mut h);
        for i in &node.inputs {
            i.0.hash(&mut h);
        }
        node.meta.dtype.hash(&mut h);
        node.meta.rank().hash(&mut h);
    }
    for i in &graph.inputs {
        i.0.hash(&mut h);
    }
    for o in &graph.outputs {
        o.0.hash(&mut h);
    }
    h.finish()
}

/// The guards of a graph whose inputs come from `sources`.
pub(crate) fn guards_of(graph: &Graph, device: Device, hash: u64, sources: &[Source]) -> Vec<Guard> {
    let mut guards: Vec<Guard> = graph
        .inputs
        .iter()
        .enumerate()
        .map(|(i, &id)| Guard::TensorMatch {
            input: i,
            source: sources.get(i).copied().unwrap_or(Source::Captured),
            meta: graph.meta(id).clone(),
            device,
        })
        .collect();
    guards.push(Guard::GraphStructure {
        hash,
        nodes: graph.nodes.len(),
        inputs: graph.inputs.len(),
        outputs: graph.outputs.len(),
    });
    guards
}

/// `guards.txt`: the guards of one graph, one per line, with the hash.
pub(crate) fn guards_text(function: &str, graph_number: usize, guards: &[Guard]) -> String {
    let mut s = format!("guards of graph {graph_number} of {function} (all must hold for the cached code to run)\n");
    for g in guards {
        let _ = writeln!(s, "{g:#}");
    }
    s
}

/// The metas of a call's arguments, kept with each compiled graph to say which guard failed.
pub(crate) type ArgMeta = (TensorMeta, Device);

/// The first guard of a cached graph that a new capture fails, with old and new values, e.g.
/// `input 0 dtype f32 -> bf16` or `input 0 size[0] 1 -> 2`. `used`: the arguments the new
/// graph reads.
pub(crate) fn failed_guard(
    old_args: &[ArgMeta],
    new_args: &[ArgMeta],
    used: &[usize],
    old: (&Graph, Device),
    new: (&Graph, Device),
) -> String {
    if old_args.len() != new_args.len() {
        return format!("number of inputs {} -> {}", old_args.len(), new_args.len());
    }
    for (i, ((om, od), (nm, nd))) in old_args.iter().zip(new_args).enumerate() {
        if !used.contains(&i) {
            continue;
        }
        if let Some(change) = meta_change(om, *od, nm, *nd) {
            return format!("input {i} {change}");
        }
    }
    let ((og, odev), (ng, ndev)) = (old, new);
    if odev != ndev {
        return format!("device {odev} -> {ndev}");
    }
    if og.inputs.len() != ng.inputs.len() {
        return format!("graph inputs {} -> {}", og.inputs.len(), ng.inputs.len());
    }
    for (j, (&a, &b)) in og.inputs.iter().zip(&ng.inputs).enumerate() {
        if let Some(change) = meta_change(og.meta(a), odev, ng.meta(b), ndev) {
            return format!("graph input {j} (not an argument) {change}");
        }
    }
    for (k, (a, b)) in og.nodes.iter().zip(&ng.nodes).enumerate() {
        if a.inputs != b.inputs || a.meta != b.meta || !same_op(&a.op, &b.op) {
            let show = |n: &coil_ir::Node| format!("{} = {}", n.meta, n.op.name());
            return format!("graph structure: node %{k} `{}` -> `{}`", show(a), show(b));
        }
    }
    if og.nodes.len() != ng.nodes.len() {
        return format!("graph structure: {} -> {} nodes", og.nodes.len(), ng.nodes.len());
    }
    "graph outputs changed".to_string()
}

/// How one tensor's dtype, device or sizes changed, if they did.
fn meta_change(om: &TensorMeta, od: Device, nm: &TensorMeta, nd: Device) -> Option<String> {
    if om.dtype != nm.dtype {
        return Some(format!("dtype {} -> {}", om.dtype, nm.dtype));
    }
    if od != nd {
        return Some(format!("device {od} -> {nd}"));
    }
    if om.rank() != nm.rank() {
        return Some(format!("rank {} -> {} (shape {:?} -> {:?})", om.rank(), nm.rank(), om.shape, nm.shape));
    }
    let d = (0..om.rank()).find(|&d| om.shape[d] != nm.shape[d])?;
    Some(format!("size[{d}] {} -> {}", om.shape[d], nm.shape[d]))
}
