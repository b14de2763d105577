//! The reference interpreter: runs a primitive graph op by op on the CPU.
//!
//! It is the oracle every compiled path is tested against, so it favours clarity and PyTorch's
//! CPU semantics over speed:
//!
//! * every value is decoded to `f64` (float dtypes) or `i64` (integer and bool dtypes), computed
//!   in that wide type, and **rounded to the node's dtype after every op** (f32 / f16 / bf16
//!   round to nearest even, f16 and bf16 through f32 as PyTorch's `float` opmath does; integers
//!   wrap to their width like C casts; bool is 0 / 1). So f16 and bf16 are "computed in wider
//!   precision and rounded per op", as PyTorch's CPU kernels do;
//! * sums and matrix products accumulate in f64 (wrapping i64 for integers) and round once;
//! * views and data movement all go through one strided-index mechanism (`layout::Layout`);
//! * bad data (an index out of bounds, integer division by zero, an integer raised to a
//!   negative power) is an [`Error`] naming the op, never a panic.
//!
//! Modules: `layout` (strided indexing), `pointwise` (unary, binary, where; casts are
//! `Value::cast`), `math` (erf, floor division, remainder), `movement` (pad, cat, gather,
//! index_select, scatter; views are one layout each, in `eval`), `reduce` (reductions,
//! cumsum, bmm), `sort` (argsort).

pub mod conv;
mod layout;
mod math;
mod movement;
mod pointwise;
pub(crate) use pointwise::{binary_int, compare};
mod reduce;
mod sort;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_movement;

use crate::{Buffer, HostData};
use coil_ir::{philox, BinaryOp, DType, Error, Graph, Node, NodeId, Op, RandDist, RandomState, Result, Scalar};
use half::{bf16, f16};
pub(crate) use layout::Layout;

/// Runs a primitive graph on the CPU, op by op, and returns one contiguous buffer per graph
/// output, in order.
///
/// The inputs must match the graph's input metas (shape and dtype). Only the nodes the outputs
/// depend on run; an intermediate value is freed after its last use. The run has no random
/// streams: [`interpret_with`] runs graphs that draw random numbers.
pub fn interpret(graph: &Graph, inputs: &[&Buffer]) -> Result<Vec<Buffer>> {
    interpret_with(graph, inputs, &[])
}

/// [`interpret`] with the run's random streams: `random[s]` is where the graph's stream `s`
/// starts (its key and first counter, [`coil_ir::philox`]). A random op of a stream past the
/// end of `random` is an error naming it.
pub fn interpret_with(graph: &Graph, inputs: &[&Buffer], random: &[RandomState]) -> Result<Vec<Buffer>> {
    check_inputs(graph, inputs)?;
    graph.verify_primitive()?;
    let live = graph.live_nodes();
    // The last node that reads each value; outputs are never freed.
    let mut last_use = vec![None; graph.nodes.len()];
    for id in &live {
        for x in &graph.node(*id).inputs {
            last_use[x.0] = Some(id.0);
        }
    }
    for o in &graph.outputs {
        last_use[o.0] = None;
    }
    let unrounded = biased_products(graph, &last_use);
    let mut values: Vec<Option<Value>> = vec![None; graph.nodes.len()];
    for id in live {
        let node = graph.node(id);
        let args: Vec<&Value> =
            node.inputs.iter().map(|x| values[x.0].as_ref().expect("operands run before their users")).collect();
        // Values are f64 or i64 here: an allocation the host cannot make is an error naming
        // the op, not an abort.
        let value = crate::buffer::check_allocation(node.meta.numel().saturating_mul(8))
            .and_then(|()| match unrounded.contains(&id) {
                // Exact products (f64 accumulation), rounded once by the bias add.
                true => Ok(Value {
                    shape: node.meta.shape.clone(),
                    dtype: node.meta.dtype,
                    data: reduce::bmm(args[0], args[1], DType::F64),
                }),
                false => eval(node, &args, inputs, random),
            })
            .map_err(|e| {
                let operands = node.inputs.iter().map(|&x| graph.meta(x).to_string()).collect();
                let e = e.in_op(node.op.name(), operands);
                match node.location {
                    Some(l) => e.at(l),
                    None => e,
                }
            })?;
        debug_assert_eq!(value.shape, node.meta.shape, "{} at {id}", node.op);
        debug_assert_eq!(value.dtype, node.meta.dtype, "{} at {id}", node.op);
        debug_assert_eq!(value.data.len(), node.meta.numel(), "{} at {id}", node.op);
        values[id.0] = Some(value);
        for x in &node.inputs {
            if last_use[x.0] == Some(id.0) {
                values[x.0] = None;
            }
        }
    }
    Ok(graph.outputs.iter().map(|o| values[o.0].as_ref().expect("outputs are live").to_buffer()).collect())
}

/// The f16 / bf16 matrix products that `linear(x, w, bias)` adds a bias row to
/// (`add(reshape*(bmm), expand*(row))`, nothing else reading the product or its reshapes):
/// PyTorch, and the compiled backends' bias epilogue, add the bias before rounding the product,
/// so the interpreter keeps these products unrounded and the add rounds once.
fn biased_products(graph: &Graph, last_use: &[Option<usize>]) -> std::collections::HashSet<NodeId> {
    let mut readers = vec![0usize; graph.nodes.len()];
    for id in graph.live_nodes() {
        for x in &graph.node(id).inputs {
            readers[x.0] += 1;
        }
    }
    let single = |n: NodeId| readers[n.0] == 1 && last_use[n.0].is_some();
    let mut found = std::collections::HashSet::new();
    for id in graph.live_nodes() {
        let node = graph.node(id);
        let Some(&last) = node.meta.shape.last() else { continue };
        if node.op != Op::Binary(BinaryOp::Add) || !matches!(node.meta.dtype, DType::F16 | DType::BF16) {
            continue;
        }
        for (product, bias) in [(node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])] {
            let mut m = product;
            while matches!(graph.node(m).op, Op::Reshape { .. }) && single(m) {
                m = graph.node(m).inputs[0];
            }
            let mut row = bias;
            while matches!(graph.node(row).op, Op::Expand { .. }) {
                row = graph.node(row).inputs[0];
            }
            let row_shape = &graph.meta(row).shape;
            let is_row = row_shape.last() == Some(&last) && row_shape.iter().rev().skip(1).all(|&d| d == 1);
            let m_node = graph.node(m);
            if m_node.op == Op::Bmm && single(m) && m_node.meta.shape.last() == Some(&last) && is_row {
                found.insert(m);
                break;
            }
        }
    }
    found
}

fn check_inputs(graph: &Graph, inputs: &[&Buffer]) -> Result<()> {
    if inputs.len() != graph.inputs.len() {
        return Err(Error::value(format!("the graph takes {} inputs, got {}", graph.inputs.len(), inputs.len())));
    }
    for (k, (&id, buf)) in graph.inputs.iter().zip(inputs).enumerate() {
        let want = graph.meta(id);
        let got = buf.meta();
        if buf.numel() != want.numel() || got.shape != want.shape {
            return Err(Error::shape(format!("input {k}: expected {want}, got {got} ({} elements)", buf.numel())));
        }
        if got.dtype != want.dtype {
            return Err(Error::dtype(format!("input {k}: expected {want}, got {got}")));
        }
    }
    Ok(())
}

/// Evaluates one node on its operands' values.
fn eval(node: &Node, args: &[&Value], inputs: &[&Buffer], random: &[RandomState]) -> Result<Value> {
    let meta = &node.meta;
    let (shape, dtype) = (&meta.shape, meta.dtype);
    let done = |data: Data| Ok(Value { shape: shape.clone(), dtype, data });
    match &node.op {
        Op::Input { index } => {
            let buf = inputs
                .get(*index)
                .ok_or_else(|| Error::value(format!("input {index} is not bound ({} inputs given)", inputs.len())))?;
            Ok(Value::from_buffer(buf))
        }
        Op::Full(v) => done(Value::scalar(*v, dtype).data.repeat(meta.numel())),
        Op::Iota { dim } => {
            let iota: Vec<i64> = if shape.is_empty() {
                vec![0]
            } else {
                Layout::coordinate(shape, *dim).offsets().map(|i| i as i64).collect()
            };
            Ok(Value::from_ints(shape, DType::I64, iota).cast(dtype))
        }
        Op::Rand { dist, stream, offset } => {
            let start = random.get(*stream).ok_or_else(|| {
                Error::value(format!("random stream {stream} is not given ({} random streams)", random.len()))
            })?;
            let first = start.advanced(*offset);
            let draw = |i: usize| {
                let index = first.offset.wrapping_add(i as u64);
                match dist {
                    RandDist::Uniform => philox::uniform(first.seed, index),
                    RandDist::Normal => philox::normal(first.seed, index),
                }
            };
            let xs = (0..meta.numel()).map(draw).collect();
            Ok(Value::from_floats(shape, DType::F64, xs).cast(dtype))
        }
        Op::Unary(u) => done(pointwise::unary(*u, args[0], dtype)),
        Op::Binary(b) => done(pointwise::binary(*b, args[0], args[1], dtype)?),
        Op::Where => done(pointwise::where_(args[0], args[1], args[2], dtype)),
        Op::Cast(t) => Ok(args[0].cast(*t)),
        Op::Reduce { op, dims, keepdim: _ } => done(reduce::reduce(*op, args[0], dims, dtype)?),
        Op::Cumsum { dim } => done(reduce::cumsum(args[0], *dim, dtype)),
        Op::Argsort { dim, descending } => done(sort::argsort(args[0], *dim, *descending)),
        Op::Bmm => done(reduce::bmm(args[0], args[1], dtype)),
        Op::Reshape { .. } => done(args[0].data.clone()),
        Op::Permute { perm } => done(args[0].view(&args[0].layout().permute(perm))),
        Op::Expand { shape } => done(args[0].view(&args[0].layout().expand(shape))),
        Op::Slice { dim, start, len, step } => done(args[0].view(&args[0].layout().slice(*dim, *start, *len, *step))),
        Op::Pad { pads, value } => done(movement::pad(args[0], pads, *value, shape, dtype)),
        Op::Cat { dim } => done(movement::cat(args, *dim, shape, dtype)),
        Op::Gather { dim } => done(movement::gather(args[0], args[1], *dim)?),
        Op::IndexSelect { dim } => done(movement::index_select(args[0], args[1], *dim, shape)?),
        Op::Scatter { dim, reduce } => done(movement::scatter(args[0], args[1], args[2], *dim, *reduce)?),
        op => Err(Error::unsupported(format!("{op} is not a primitive: decompose the graph before interpreting it"))),
    }
}

/// Elements decoded to the wide type of their dtype family.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Data {
    /// f16, bf16, f32, f64.
    F(Vec<f64>),
    /// bool, u8, i8, i16, i32, i64.
    I(Vec<i64>),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
        }
    }

    /// `n` copies of a one-element value.
    fn repeat(&self, n: usize) -> Data {
        match self {
            Data::F(v) => Data::F(vec![v[0]; n]),
            Data::I(v) => Data::I(vec![v[0]; n]),
        }
    }

    /// The elements at `offsets`, in order.
    pub fn take(&self, offsets: impl Iterator<Item = usize>) -> Data {
        match self {
            Data::F(v) => Data::F(offsets.map(|o| v[o]).collect()),
            Data::I(v) => Data::I(offsets.map(|o| v[o]).collect()),
        }
    }

    /// Writes `src`'s elements, in order, to `offsets`. Both sides are of one dtype family.
    pub fn put(&mut self, offsets: impl Iterator<Item = usize>, src: &Data) {
        match (self, src) {
            (Data::F(d), Data::F(s)) => offsets.zip(s).for_each(|(o, &x)| d[o] = x),
            (Data::I(d), Data::I(s)) => offsets.zip(s).for_each(|(o, &x)| d[o] = x),
            _ => unreachable!("put mixes float and integer data"),
        }
    }
}

/// A node's value: contiguous row-major elements of `dtype`, already rounded to it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Value {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub data: Data,
}

impl Value {
    pub fn from_buffer(buf: &Buffer) -> Value {
        let data = if buf.dtype().is_float() { Data::F(buf.data.to_f64_vec()) } else { Data::I(buf.data.to_i64_vec()) };
        Value { shape: buf.shape.clone(), dtype: buf.dtype(), data }
    }

    pub fn to_buffer(&self) -> Buffer {
        let data = match &self.data {
            Data::F(v) => HostData::from_f64_slice(self.dtype, v),
            Data::I(v) => HostData::from_i64_slice(self.dtype, v),
        };
        Buffer { shape: self.shape.clone(), data }
    }

    /// Float values of a float dtype, rounded to it.
    pub fn from_floats(shape: &[usize], dtype: DType, xs: Vec<f64>) -> Value {
        let xs = xs.into_iter().map(|x| round_float(dtype, x)).collect();
        Value { shape: shape.to_vec(), dtype, data: Data::F(xs) }
    }

    /// Integer values of an integral dtype, wrapped to it.
    pub fn from_ints(shape: &[usize], dtype: DType, xs: Vec<i64>) -> Value {
        let xs = xs.into_iter().map(|x| wrap_int(dtype, x)).collect();
        Value { shape: shape.to_vec(), dtype, data: Data::I(xs) }
    }

    /// A 0-d value holding `v` cast to `dtype`.
    pub fn scalar(v: Scalar, dtype: DType) -> Value {
        let v = match v {
            Scalar::Float(x) => Value::from_floats(&[], DType::F64, vec![x]),
            Scalar::Int(i) => Value::from_ints(&[], DType::I64, vec![i]),
            Scalar::Bool(b) => Value::from_ints(&[], DType::Bool, vec![b as i64]),
        };
        v.cast(dtype)
    }

    pub fn layout(&self) -> Layout {
        Layout::contiguous(&self.shape)
    }

    /// The elements seen through `layout` (a view of this value), as a new contiguous value.
    pub fn view(&self, layout: &Layout) -> Data {
        self.data.take(layout.offsets())
    }

    pub fn floats(&self) -> &[f64] {
        match &self.data {
            Data::F(v) => v,
            Data::I(_) => unreachable!("{} value holds integers", self.dtype),
        }
    }

    pub fn ints(&self) -> &[i64] {
        match &self.data {
            Data::I(v) => v,
            Data::F(_) => unreachable!("{} value holds floats", self.dtype),
        }
    }

    /// Converts to `dtype` as `tensor.to(dtype)` does: floats to integers truncate toward zero
    /// (NaN gives 0, out of range saturates to i64 and then wraps: undefined in PyTorch) and
    /// wrap; to bool is `x != 0` (NaN is true); integers to f16 / bf16 go through f32.
    pub fn cast(&self, dtype: DType) -> Value {
        if dtype == self.dtype {
            return self.clone();
        }
        let data = match (&self.data, dtype.is_float()) {
            (Data::F(v), true) => Data::F(v.iter().map(|&x| round_float(dtype, x)).collect()),
            (Data::F(v), false) if dtype == DType::Bool => Data::I(v.iter().map(|&x| (x != 0.0) as i64).collect()),
            (Data::F(v), false) => Data::I(v.iter().map(|&x| wrap_int(dtype, x.trunc() as i64)).collect()),
            (Data::I(v), true) => Data::F(v.iter().map(|&x| int_to_float(dtype, x)).collect()),
            (Data::I(v), false) => Data::I(v.iter().map(|&x| wrap_int(dtype, x)).collect()),
        };
        Value { shape: self.shape.clone(), dtype, data }
    }
}

/// Rounds an f64 to the nearest value of a float dtype (f16 and bf16 through f32).
pub(crate) fn round_float(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f32(x as f32).to_f64(),
        DType::BF16 => bf16::from_f32(x as f32).to_f64(),
        _ => unreachable!("round_float to {dtype}"),
    }
}

/// Wraps an i64 to an integral dtype like a C cast (bool: nonzero is 1).
pub(crate) fn wrap_int(dtype: DType, x: i64) -> i64 {
    match dtype {
        DType::Bool => (x != 0) as i64,
        DType::U8 => x as u8 as i64,
        DType::I8 => x as i8 as i64,
        DType::I16 => x as i16 as i64,
        DType::I32 => x as i32 as i64,
        DType::I64 => x,
        _ => unreachable!("wrap_int to {dtype}"),
    }
}

/// An integer converted to a float dtype (f32, f16 and bf16 round from the integer once via
/// f32, as PyTorch's `static_cast<float>` does).
pub(crate) fn int_to_float(dtype: DType, x: i64) -> f64 {
    match dtype {
        DType::F64 => x as f64,
        _ => round_float(dtype, x as f32 as f64),
    }
}
