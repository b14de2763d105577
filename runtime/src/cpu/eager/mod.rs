//! Tier 0 of the CPU: runs a primitive graph at once on kernels compiled before (with the
//! crate, or once per machine), for a realization that should not wait for the C compiler
//! while the graph compiles in the background (`coil_frontend`'s tiered policy; see
//! `docs/compiler.md`, "Tier 0").
//!
//! A [`Plan`] sorts the graph's nodes once:
//!
//! * *stored* values get a buffer: inputs, reductions, matrix products, and each pointwise node
//!   that is a graph output, is read by more than one node or by a non-pointwise one (a view, a
//!   reduction, a product);
//! * *fused* pointwise nodes (one pointwise reader) are computed inside their reader's region:
//!   a stored pointwise node is evaluated [`CHUNK`] elements at a time through the tree of fused
//!   nodes below it, so no full-size intermediate exists between them; so is the f32 / f64
//!   operand of a sum, max or min over trailing dims, reduced chunk by chunk as it is computed;
//! * views are strided layouts (`layout::Layout`) of a stored value, read in place (a reshape no
//!   strides express is stored first); constants (`full`, and views of one) are filled in.
//!
//! Values compute as generated kernels compute them (`chunk`): f16 / bf16 in f32, rounded
//! when stored; float math through the prebuilt chunk kernels of
//! `coil_codegen::templates::eager_cpu` (the code generator's expressions); reductions
//! accumulate floats in f64 and round once; products go through [`crate::cpu::gemm`], as a
//! compiled graph's do. Ops it does not run (random numbers, scatter, gather, sort, cumsum,
//! pad, cat, templates) make [`Plan::new`] say why: such a graph compiles before it runs.
//! Bad data (integer division by zero, a negative integer power) is an error naming the op and
//! the user's line, as the interpreter's.

mod chunk;
mod layout;
mod math;
mod reduce;
#[cfg(test)]
mod tests;

use super::jobs;
use super::launch::CHUNKS_PER_THREAD;
use crate::{Buffer, HostData};
use chunk::{Chunk, Class, Dest, Out, Val};
use coil_ir::{DType, Error, Graph, NodeId, Op, Result, Scalar};
use layout::Layout;
use std::sync::Mutex;

/// Elements of a region computed at once: a few kilobytes per value, cache-resident.
pub const CHUNK: usize = 512;

/// Fewest elements of a region, or of a reduction's operand, split among the CPU pool's
/// threads (at least half of it per part). Lower than a compiled launch's
/// (`launch::PARALLEL_MIN_ELEMENTS`): tier 0 spends a few nanoseconds an element (a layer
/// norm and GELU of 8192 elements take about 15 us on one core of the build machine), and a
/// helper lingering after the last parallel step (`jobs::LINGER`) joins within a microsecond.
pub const PARALLEL_MIN: usize = 8192;

/// Loads tier 0's math library (once per process; [`Plan::new`] does at its first call
/// otherwise): an error where it cannot be loaded or built.
pub fn prepare() -> Result<()> {
    math::Math::get().map(|_| ())
}

/// What a node's value is while the plan runs.
#[derive(Clone, Debug)]
enum Kind {
    /// Not needed by any output.
    Dead,
    /// The graph input bound at this position.
    Input(usize),
    /// A buffer of its own, computed by its [`Region`] (pointwise), or by a reduction or product.
    Stored,
    /// A strided view of a stored value (or input).
    View(NodeId, Layout),
    /// Computed inside its one pointwise reader's region.
    Fused,
    /// One value everywhere.
    Const(Scalar),
}

/// Where a region step's values come from.
#[derive(Clone, Debug)]
enum Source {
    /// A stored value (or input) through a layout.
    Read(NodeId, Layout),
    /// A constant.
    Const(Scalar),
    /// The element's index along `dim` of `shape`.
    Iota(usize, Vec<usize>),
    /// A pointwise node on earlier steps (their positions), with its operands' dtypes and its
    /// prebuilt kernel (float math), resolved when the plan is made.
    Node(NodeId, Vec<usize>, Vec<DType>, Option<&'static crate::cpu::Kernel>),
}

/// A stored pointwise value's computation: steps in dependency order, the last the value.
#[derive(Clone, Debug)]
struct Region {
    steps: Vec<(Source, DType)>,
}

/// A primitive graph sorted for tier 0 ([`Plan::new`]), ready to run on any inputs of its
/// metas.
#[derive(Debug)]
pub struct Plan {
    graph: Graph,
    kinds: Vec<Kind>,
    regions: Vec<Option<Region>>,
    /// Stored values freed after each node runs (their last reader).
    frees: Vec<Vec<NodeId>>,
    /// f16 / bf16 products kept in f32 for the bias add that rounds them once
    /// ([`biased_products`]).
    unrounded: Vec<bool>,
}

impl Plan {
    /// The plan of a primitive graph (`coil_passes::decompose`'s output), or why tier 0 does not
    /// run it (an op or dtype it has no kernel for, or no math library on this machine).
    pub fn new(graph: Graph) -> std::result::Result<Plan, String> {
        graph.verify_primitive().map_err(|e| e.message)?;
        math::Math::get().map_err(|e| e.message)?;
        let n = graph.nodes.len();
        let live = graph.live_nodes();
        let mut readers: Vec<Vec<NodeId>> = vec![Vec::new(); n];
        for &id in &live {
            for &x in &graph.node(id).inputs {
                readers[x.0].push(id);
            }
        }
        let output = |id: NodeId| graph.outputs.contains(&id);
        let op = |id: NodeId| &graph.node(id).op;
        let pointwise = |op: &Op| op.is_pointwise() || matches!(op, Op::Iota { .. });
        let heavy = |id: NodeId| readers[id.0].iter().any(|&r| matches!(op(r), Op::Reduce { .. } | Op::Bmm));
        let mut kinds = vec![Kind::Dead; n];
        let mut regions: Vec<Option<Region>> = vec![None; n];
        for &id in &live {
            let node = graph.node(id);
            let operand_dtypes: Vec<DType> = node.inputs.iter().map(|&x| graph.meta(x).dtype).collect();
            let kind = match &node.op {
                Op::Input { index } => Kind::Input(*index),
                Op::Full(_) if heavy(id) => Kind::Stored,
                Op::Full(v) => Kind::Const(*v),
                op if pointwise(op) => {
                    if let Some(why) =
                        (op.is_pointwise()).then(|| chunk::unsupported(op, &operand_dtypes, node.meta.dtype)).flatten()
                    {
                        return Err(why);
                    }
                    let rs = &readers[id.0];
                    let fuses = |r: NodeId| op_is_pointwise(&graph.node(r).op) || reduces_rows(&graph, r, id);
                    match !output(id) && rs.len() == 1 && fuses(rs[0]) {
                        true => Kind::Fused,
                        false => Kind::Stored,
                    }
                }
                op if op.is_view() => {
                    let x = node.inputs[0];
                    let (base, from) = match &kinds[x.0] {
                        Kind::Const(v) if !heavy(id) => {
                            kinds[id.0] = Kind::Const(*v);
                            continue;
                        }
                        Kind::Input(_) | Kind::Stored => (x, Layout::contiguous(&graph.meta(x).shape)),
                        Kind::View(base, l) => (*base, l.clone()),
                        _ => (x, Layout::contiguous(&graph.meta(x).shape)), // a constant a product reads
                    };
                    let viewed = match op {
                        Op::Reshape { shape } => from.reshape(shape),
                        Op::Permute { perm } => Some(from.permute(perm)),
                        Op::Expand { shape } => Some(from.expand(shape)),
                        Op::Slice { dim, start, len, step } => Some(from.slice(*dim, *start, *len, *step)),
                        _ => unreachable!("the four views"),
                    };
                    match viewed {
                        Some(l) if matches!(kinds[x.0], Kind::Input(_) | Kind::Stored | Kind::View(..)) => {
                            if !l.fits(graph.meta(base).numel()) {
                                return Err(format!("{} at {id} leaves its base", node.op));
                            }
                            Kind::View(base, l)
                        }
                        _ => Kind::Stored, // copied by a region reading its operand
                    }
                }
                Op::Reduce { op: r, dims, .. } => {
                    let empty = dims.iter().any(|&d| graph.meta(node.inputs[0]).shape[d] == 0);
                    if empty && !matches!(r, coil_ir::ReduceOp::Sum | coil_ir::ReduceOp::Prod) {
                        return Err(format!("{} over an empty dim", r.name()));
                    }
                    Kind::Stored
                }
                Op::Bmm => Kind::Stored,
                other => return Err(format!("tier 0 has no kernel of {}", other.name())),
            };
            kinds[id.0] = kind;
        }
        for &id in &live {
            let node = graph.node(id);
            match node.op {
                Op::Reduce { .. } if matches!(kinds[node.inputs[0].0], Kind::Fused) => {
                    // the reduction's operand, computed chunk by chunk as it is summed
                    regions[id.0] = Some(region(&graph, &kinds, node.inputs[0]));
                }
                Op::Reduce { .. } | Op::Bmm => {}
                _ if matches!(kinds[id.0], Kind::Stored) => regions[id.0] = Some(region(&graph, &kinds, id)),
                _ => {}
            }
        }
        let frees = frees(&graph, &live, &kinds, &regions);
        let unrounded = biased_products(&graph, &readers);
        Ok(Plan { graph, kinds, regions, frees, unrounded })
    }

    /// The graph the plan runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Runs the graph on `inputs` (of its input metas) and returns one contiguous buffer per
    /// output. An error names the op that failed, its operands and the user's line.
    pub fn run(&self, inputs: &[&Buffer]) -> Result<Vec<Buffer>> {
        let g = &self.graph;
        if inputs.len() != g.inputs.len() {
            return Err(Error::value(format!("the graph takes {} inputs, got {}", g.inputs.len(), inputs.len())));
        }
        for (k, (&id, b)) in g.inputs.iter().zip(inputs).enumerate() {
            if b.meta() != *g.meta(id) {
                return Err(Error::shape(format!("input {k}: expected {}, got {}", g.meta(id), b.meta())));
            }
        }
        // Buffers, not bare data: a dropped intermediate's memory goes back to the host pool
        // for the next one (`crate::host_pool`).
        with_chunks(&RUN_SCRATCH, |scratch| self.run_with(inputs, scratch))
    }

    /// [`Plan::run`] on checked inputs, with `scratch` for its regions' chunks.
    fn run_with(&self, inputs: &[&Buffer], scratch: &mut Vec<Chunk>) -> Result<Vec<Buffer>> {
        let g = &self.graph;
        let mut stored: Vec<Option<Buffer>> = vec![None; g.nodes.len()];
        for (i, kind) in self.kinds.iter().enumerate() {
            if !matches!(kind, Kind::Stored) {
                continue;
            }
            let value = self.compute(NodeId(i), inputs, &stored, scratch).map_err(|e| named(g, NodeId(i), e))?;
            stored[i] = Some(Buffer { shape: g.nodes[i].meta.shape.clone(), data: value });
            for x in &self.frees[i] {
                stored[x.0] = None;
            }
        }
        let mut taken = vec![false; g.nodes.len()];
        g.outputs
            .iter()
            .map(|&o| {
                let meta = g.meta(o);
                let data = match &self.kinds[o.0] {
                    Kind::Stored if !std::mem::replace(&mut taken[o.0], true) && last_output(g, o) => {
                        return Ok(stored[o.0].take().expect("outputs are kept"));
                    }
                    Kind::Stored => stored[o.0].as_ref().expect("outputs are kept").data.clone(),
                    _ => {
                        let r = Region { steps: vec![(self.source_of(o), meta.dtype)] };
                        self.run_region(&r, meta.numel(), meta.dtype, inputs, &stored, scratch)?
                    }
                };
                Buffer::new(meta.shape.clone(), data)
            })
            .collect()
    }

    /// How an output that is no stored value of its own (an input, a view, a constant) is read.
    fn source_of(&self, id: NodeId) -> Source {
        match &self.kinds[id.0] {
            Kind::View(base, l) => Source::Read(*base, l.clone()),
            Kind::Const(v) => Source::Const(*v),
            _ => Source::Read(id, Layout::contiguous(&self.graph.meta(id).shape)),
        }
    }

    /// The elements of a stored value or input.
    fn data<'a>(&self, id: NodeId, inputs: &[&'a Buffer], stored: &'a [Option<Buffer>]) -> &'a HostData {
        match self.kinds[id.0] {
            Kind::Input(k) => &inputs[k].data,
            _ => &stored[id.0].as_ref().expect("a stored value lives until its last reader ran").data,
        }
    }

    /// Computes one stored value.
    fn compute(
        &self,
        id: NodeId,
        inputs: &[&Buffer],
        stored: &[Option<Buffer>],
        scratch: &mut Vec<Chunk>,
    ) -> Result<HostData> {
        let node = self.graph.node(id);
        let meta = &node.meta;
        let operand = |k: usize| {
            let x = node.inputs[k];
            match &self.kinds[x.0] {
                Kind::View(base, l) => (l.clone(), self.data(*base, inputs, stored)),
                _ => (Layout::contiguous(&self.graph.meta(x).shape), self.data(x, inputs, stored)),
            }
        };
        match &node.op {
            Op::Reduce { op, .. } if self.regions[id.0].is_some() => {
                let region = self.regions[id.0].as_ref().expect("checked");
                let outer = meta.numel();
                let r = self.graph.meta(node.inputs[0]).numel() / outer.max(1);
                // rows `lo .. hi` into `out`, reduced as their elements are computed
                let part = |lo: usize, hi: usize, out: &mut [f64], scratch: &mut Vec<Chunk>| -> Result<()> {
                    let mut rows = reduce::Rows::new(*op, lo, hi, r);
                    self.each_chunk(region, lo * r..hi * r, inputs, stored, scratch, None, &mut |start, v| {
                        rows.add(start, v)
                    })?;
                    rows.results(out);
                    Ok(())
                };
                let parts = reduce::row_parts(outer, r);
                let mut values = vec![0f64; outer];
                if parts == 1 {
                    part(0, outer, &mut values, scratch)?;
                } else {
                    // Each part writes its rows of `values` and keeps its chunks on its thread:
                    // memory allocated on one thread and freed on another contends for the
                    // allocator's lock (measured: a 64 x 256 layer norm in parts ran twice as
                    // long as on one thread).
                    let bounds: Vec<usize> = (0..=parts).map(|p| outer * p / parts).collect();
                    let outs: Vec<Mutex<&mut [f64]>> =
                        chunk::split_slice(&mut values, &bounds).into_iter().map(Mutex::new).collect();
                    let errors: Mutex<Vec<(usize, Error)>> = Mutex::new(Vec::new());
                    jobs::run(parts, jobs::helpers(), &|p| {
                        let mut out = outs[p].lock().unwrap_or_else(|e| e.into_inner());
                        let result = with_scratch(|scratch| part(bounds[p], bounds[p + 1], &mut out, scratch));
                        if let Err(e) = result {
                            errors.lock().unwrap_or_else(|e| e.into_inner()).push((p, e));
                        }
                    });
                    drop(outs);
                    first_error(errors)?;
                }
                Ok(HostData::from_f64_slice(meta.dtype, &values))
            }
            Op::Reduce { op, dims, .. } => {
                let (l, data) = operand(0);
                reduce::reduce(*op, dims, &l, data, meta.dtype)
            }
            Op::Bmm => {
                let (la, a) = operand(0);
                let (lb, b) = operand(1);
                let k = la.shape[la.shape.len() - 1];
                // a view with a negative stride (a flip) is gathered first
                let gathered = |l: &Layout, d: &HostData| Ok::<_, Error>((Layout::contiguous(&l.shape), gather(l, d)?));
                let (ga, gb);
                let (oa, da) = match reduce::operand(&la) {
                    Some(o) => (o, a),
                    None => {
                        ga = gathered(&la, a)?;
                        (reduce::operand(&ga.0).expect("contiguous"), &ga.1)
                    }
                };
                let (ob, db) = match reduce::operand(&lb) {
                    Some(o) => (o, b),
                    None => {
                        gb = gathered(&lb, b)?;
                        (reduce::operand(&gb.0).expect("contiguous"), &gb.1)
                    }
                };
                let out = if self.unrounded[id.0] { DType::F32 } else { meta.dtype };
                reduce::bmm((oa, da), (ob, db), &meta.shape, k, (meta.dtype, out))
            }
            _ => {
                let r = self.regions[id.0].as_ref().expect("stored pointwise values have a region");
                self.run_region(r, meta.numel(), meta.dtype, inputs, stored, scratch)
            }
        }
    }

    /// Evaluates a region over `numel` elements, [`CHUNK`] at a time, into a new value
    /// (`scratch`: the chunks of the run's regions, reused from one to the next).
    fn run_region(
        &self,
        r: &Region,
        numel: usize,
        dtype: DType,
        inputs: &[&Buffer],
        stored: &[Option<Buffer>],
        scratch: &mut Vec<Chunk>,
    ) -> Result<HostData> {
        let mut out = HostData::for_output(dtype, numel)?;
        // Large values in parts on the CPU pool, as compiled kernels' launches split theirs
        // (parts of whole chunks: the same chunks as one thread's).
        let threads = jobs::helpers() + 1;
        let parts = match numel >= PARALLEL_MIN && threads > 1 {
            true => (numel / (PARALLEL_MIN / 2)).min(CHUNKS_PER_THREAD as usize * threads).max(2),
            false => 1,
        };
        let bounds: Vec<usize> =
            (0..=parts).map(|p| if p == parts { numel } else { numel * p / parts / CHUNK * CHUNK }).collect();
        let mut dests = Dest::split(&mut out, &bounds);
        if parts == 1 {
            let dest = dests.pop();
            self.each_chunk(r, 0..numel, inputs, stored, scratch, dest, &mut |_, _| {})?;
        } else {
            let dests: Vec<Mutex<Option<Dest>>> = dests.into_iter().map(|d| Mutex::new(Some(d))).collect();
            let errors: Mutex<Vec<(usize, Error)>> = Mutex::new(Vec::new());
            jobs::run(parts, threads - 1, &|p| {
                let dest = dests[p].lock().unwrap_or_else(|e| e.into_inner()).take();
                let range = bounds[p]..bounds[p + 1];
                let result =
                    with_scratch(|scratch| self.each_chunk(r, range, inputs, stored, scratch, dest, &mut |_, _| {}));
                if let Err(e) = result {
                    errors.lock().unwrap_or_else(|e| e.into_inner()).push((p, e));
                }
            });
            first_error(errors)?;
        }
        Ok(out)
    }

    /// Evaluates elements `range` of a region, [`CHUNK`] at a time: into `out` (the part of the
    /// value from `range.start` on) where given, else each chunk's values to `sink` (with the
    /// position of their first element).
    #[allow(clippy::too_many_arguments)]
    fn each_chunk(
        &self,
        r: &Region,
        range: std::ops::Range<usize>,
        inputs: &[&Buffer],
        stored: &[Option<Buffer>],
        scratch: &mut Vec<Chunk>,
        mut out: Option<Dest>,
        sink: &mut dyn FnMut(usize, Val),
    ) -> Result<()> {
        for (i, (_, d)) in r.steps.iter().enumerate() {
            match scratch.get(i) {
                Some(c) if c.class() == Class::of(*d) => {}
                Some(_) => scratch[i] = Class::of(*d).chunk(CHUNK),
                None => scratch.push(Class::of(*d).chunk(CHUNK)),
            }
        }
        // Contiguous reads of a value stored in its compute type are read in place.
        let direct: Vec<Option<(&HostData, usize)>> = r
            .steps
            .iter()
            .map(|(source, _)| match source {
                Source::Read(base, l) if l.is_contiguous() => {
                    let data = self.data(*base, inputs, stored);
                    Val::of(data, 0, 0).map(|_| (data, l.offset as usize))
                }
                _ => None,
            })
            .collect();
        // A pointwise root writes the output itself where it is stored in its compute type.
        let root = r.steps.len() - 1;
        let in_place =
            matches!(r.steps[root].0, Source::Node(..)) && out.as_mut().is_some_and(|o| Out::of(o, 0, 0).is_some());
        let mut start = range.start;
        while start < range.end {
            let n = CHUNK.min(range.end - start);
            let at = start - range.start;
            fn val<'a>(
                direct: &[Option<(&'a HostData, usize)>],
                scratch: &'a [Chunk],
                j: usize,
                at: usize,
                n: usize,
            ) -> Val<'a> {
                match direct[j] {
                    Some((data, offset)) => Val::of(data, offset + at, n).expect("checked above"),
                    None => scratch[j].val(),
                }
            }
            for i in 0..r.steps.len() {
                if direct[i].is_some() {
                    continue;
                }
                let (before, rest) = scratch.split_at_mut(i);
                let out_chunk = &mut rest[0];
                out_chunk.truncate_to(n);
                let (source, dt) = &r.steps[i];
                match source {
                    Source::Read(base, l) => out_chunk.load(l, self.data(*base, inputs, stored), start),
                    // (filled once per region: later chunks are no longer than the first)
                    Source::Const(v) if start == range.start => out_chunk.fill(*v, *dt),
                    Source::Const(_) => {}
                    Source::Iota(dim, shape) => iota(out_chunk, *dim, shape, start, *dt),
                    Source::Node(id, args, dtypes, kernel) => {
                        let node = self.graph.node(*id);
                        let mut vals: [Val; 3] = [val(&direct, before, args[0], start, n); 3];
                        for (k, &j) in args.iter().enumerate() {
                            vals[k] = val(&direct, before, j, start, n);
                        }
                        let target = match i == root && in_place {
                            true => Out::of(out.as_mut().expect("in place"), at, n).expect("checked above"),
                            false => out_chunk.out(),
                        };
                        // a fused node's error names that node, not the region's root
                        chunk::eval(&node.op, *kernel, &vals[..args.len()], dtypes, target, *dt)
                            .map_err(|e| named(&self.graph, *id, e))?;
                    }
                }
            }
            match out.as_mut() {
                Some(_) if in_place => {}
                Some(o) => val(&direct, scratch, root, start, n).store(o, at),
                None => sink(start, val(&direct, scratch, root, start, n)),
            }
            start += n;
        }
        Ok(())
    }
}

/// The error of the first part that failed (in part order, as one thread would have met it).
fn first_error(errors: Mutex<Vec<(usize, Error)>>) -> Result<()> {
    let errors = errors.into_inner().unwrap_or_else(|e| e.into_inner());
    match errors.into_iter().min_by_key(|(p, _)| *p) {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

thread_local! {
    /// This thread's chunks for a run's regions ([`Plan::run`]).
    static RUN_SCRATCH: std::cell::RefCell<Vec<Chunk>> = const { std::cell::RefCell::new(Vec::new()) };
    /// This thread's chunks for parallel parts (the caller's own part runs while its run's
    /// chunks are lent).
    static PART_SCRATCH: std::cell::RefCell<Vec<Chunk>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `f` with chunks of `slot` kept on this thread from one call to the next (so that a run, or
/// a parallel part, allocates none; a fresh set where this thread's are in use already).
fn with_chunks<T>(
    slot: &'static std::thread::LocalKey<std::cell::RefCell<Vec<Chunk>>>,
    f: impl FnOnce(&mut Vec<Chunk>) -> T,
) -> T {
    slot.with(|s| match s.try_borrow_mut() {
        Ok(mut scratch) => f(&mut scratch),
        Err(_) => f(&mut Vec::new()),
    })
}

/// `f` with this thread's chunks for a parallel part.
fn with_scratch<T>(f: impl FnOnce(&mut Vec<Chunk>) -> T) -> T {
    with_chunks(&PART_SCRATCH, f)
}

/// The f16 / bf16 products that `linear(x, w, bias)` adds a bias row to (`add(reshape*(bmm),
/// expand*(row))`, nothing else reading the product or its reshapes): PyTorch, the compiled
/// backends' bias epilogue and the interpreter add the bias before rounding the product, so
/// tier 0 keeps these products in f32 and the add rounds once.
fn biased_products(g: &Graph, readers: &[Vec<NodeId>]) -> Vec<bool> {
    let mut found = vec![false; g.nodes.len()];
    let single = |n: NodeId| readers[n.0].len() == 1 && !g.outputs.contains(&n);
    for id in g.live_nodes() {
        let node = g.node(id);
        let Some(&last) = node.meta.shape.last() else { continue };
        if node.op != Op::Binary(coil_ir::BinaryOp::Add) || !matches!(node.meta.dtype, DType::F16 | DType::BF16) {
            continue;
        }
        for (product, bias) in [(node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])] {
            let mut m = product;
            while matches!(g.node(m).op, Op::Reshape { .. }) && single(m) {
                m = g.node(m).inputs[0];
            }
            let mut row = bias;
            while matches!(g.node(row).op, Op::Expand { .. }) {
                row = g.node(row).inputs[0];
            }
            let row_shape = &g.meta(row).shape;
            let is_row = row_shape.last() == Some(&last) && row_shape.iter().rev().skip(1).all(|&d| d == 1);
            let m_node = g.node(m);
            if m_node.op == Op::Bmm && single(m) && m_node.meta.shape.last() == Some(&last) && is_row {
                found[m.0] = true;
                break;
            }
        }
    }
    found
}

/// Whether node `r` is a sum, max or min over the trailing dims of `x`, an f32 or f64 value
/// (so `x` can be computed chunk by chunk as it is reduced, its rows consecutive elements;
/// half types are left stored, rounded, as the interpreter reduces them).
fn reduces_rows(g: &Graph, r: NodeId, x: NodeId) -> bool {
    let Op::Reduce { op, dims, .. } = &g.node(r).op else { return false };
    let rank = g.meta(x).rank();
    let trailing = dims.iter().enumerate().all(|(k, &d)| d == rank - dims.len() + k);
    let float = matches!(g.meta(x).dtype, DType::F32 | DType::F64);
    matches!(op, coil_ir::ReduceOp::Sum | coil_ir::ReduceOp::Max | coil_ir::ReduceOp::Min) && trailing && float
}

/// Whether a reader computes pointwise (so a single pointwise operand fuses into it).
fn op_is_pointwise(op: &Op) -> bool {
    op.is_pointwise()
}

/// Whether `o` is its last position among the graph's outputs (its buffer can move there).
fn last_output(g: &Graph, o: NodeId) -> bool {
    g.outputs.iter().filter(|&&x| x == o).count() == 1
}

/// `e` named by node `id`'s op, operands and line (unless an inner step named it already).
fn named(g: &Graph, id: NodeId, e: Error) -> Error {
    let node = g.node(id);
    let e = e.in_op(node.op.name(), node.inputs.iter().map(|&x| g.meta(x).to_string()).collect());
    match node.location {
        Some(l) => e.at(l),
        None => e,
    }
}

/// A strided view's elements gathered contiguously (a product's operand of negative strides).
fn gather(l: &Layout, d: &HostData) -> Result<HostData> {
    let mut out = HostData::for_output(d.dtype(), l.numel())?;
    let mut dest = Dest::split(&mut out, &[0, l.numel()]).pop().expect("one part");
    let mut c = Class::of(d.dtype()).chunk(CHUNK);
    let mut start = 0;
    while start < l.numel() {
        let n = CHUNK.min(l.numel() - start);
        c.truncate_to(n);
        c.load(l, d, start);
        c.val().store(&mut dest, start);
        start += n;
    }
    Ok(out)
}

/// The coordinate along `dim` of elements `start ..` of `shape`, as values of `dtype`.
fn iota(out: &mut Chunk, dim: usize, shape: &[usize], start: usize, dtype: DType) {
    let inner: usize = shape[dim + 1..].iter().product();
    let size = shape[dim];
    let at = |i: usize| ((start + i) / inner) % size;
    match out {
        Chunk::F(v) => v.iter_mut().enumerate().for_each(|(i, o)| *o = at(i) as f32),
        Chunk::D(v) => v.iter_mut().enumerate().for_each(|(i, o)| *o = at(i) as f64),
        Chunk::I(v) => v.iter_mut().enumerate().for_each(|(i, o)| *o = chunk::wrap(at(i) as i64, dtype)),
    }
}

/// The region computing the stored value `root`: its fused operands' trees, leaves read.
fn region(g: &Graph, kinds: &[Kind], root: NodeId) -> Region {
    let mut steps = Vec::new();
    fn leaf(g: &Graph, kinds: &[Kind], x: NodeId) -> Source {
        match &kinds[x.0] {
            Kind::View(base, l) => Source::Read(*base, l.clone()),
            Kind::Const(v) => Source::Const(*v),
            _ => Source::Read(x, Layout::contiguous(&g.meta(x).shape)),
        }
    }
    fn build(g: &Graph, kinds: &[Kind], id: NodeId, steps: &mut Vec<(Source, DType)>) -> usize {
        let node = g.node(id);
        let source = match &node.op {
            Op::Full(v) => Source::Const(*v),
            Op::Iota { dim } => Source::Iota(*dim, node.meta.shape.clone()),
            op if op.is_view() => leaf(g, kinds, node.inputs[0]), // a copy of the operand's elements
            _ => {
                let args = node
                    .inputs
                    .iter()
                    .map(|&x| match kinds[x.0] {
                        Kind::Fused => build(g, kinds, x, steps),
                        _ => {
                            steps.push((leaf(g, kinds, x), g.meta(x).dtype));
                            steps.len() - 1
                        }
                    })
                    .collect();
                let dtypes = node.inputs.iter().map(|&x| g.meta(x).dtype).collect();
                let kernel = chunk::kernel(&node.op, node.meta.dtype).expect("the library loaded for the plan");
                Source::Node(id, args, dtypes, kernel)
            }
        };
        steps.push((source, node.meta.dtype));
        steps.len() - 1
    }
    build(g, kinds, root, &mut steps);
    Region { steps }
}

/// Per node, the stored values whose last reader it is (outputs are never freed).
fn frees(g: &Graph, live: &[NodeId], kinds: &[Kind], regions: &[Option<Region>]) -> Vec<Vec<NodeId>> {
    let mut last: Vec<Option<usize>> = vec![None; g.nodes.len()];
    let base = |x: NodeId| match &kinds[x.0] {
        Kind::View(b, _) => *b,
        _ => x,
    };
    for &id in live {
        if !matches!(kinds[id.0], Kind::Stored) {
            continue;
        }
        match &regions[id.0] {
            Some(r) => r.steps.iter().for_each(|(s, _)| {
                if let Source::Read(b, _) = s {
                    last[b.0] = Some(id.0);
                }
            }),
            None => g.node(id).inputs.iter().for_each(|&x| last[base(x).0] = Some(id.0)),
        }
    }
    let mut frees = vec![Vec::new(); g.nodes.len()];
    for (x, l) in last.iter().enumerate() {
        let kept = g.outputs.iter().any(|&o| o.0 == x || base(o).0 == x);
        if let (Some(l), false, Kind::Stored) = (l, kept, &kinds[x]) {
            frees[*l].push(NodeId(x));
        }
    }
    frees
}
