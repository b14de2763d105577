//! Split reductions: a reduction with too few outputs to keep the machine busy (a full sum, a
//! loss) runs as two reductions. The first reduces `S` chunks of every row in parallel into a
//! partial buffer of `X * S` values; the second reduces the `S` partials of each row.
//!
//! This is a `LoopProgram -> LoopProgram` rewrite before scheduling: both stages are ordinary
//! reduction nodes, so the scheduler, the kernel builder and every backend treat them as usual.
//! Only associative reductions split (sum, prod, max, min); arg reductions would need the
//! position carried along and stay whole. Rows need not divide evenly: the last chunk's
//! overhanging lanes read a clamped position and contribute the reduction's identity. Partials of f16/bf16 sums are kept in f32, so the
//! result is rounded once, as an unsplit reduction's is.

use coil_ir::loops::{range_var, reduction_var, Body, BufferId, LoopBuffer, LoopKind, LoopNode, LoopProgram, ScalarOp};
use coil_ir::sym::Expr;
use coil_ir::{BinaryOp, DType, ReduceOp, Scalar, TensorMeta};
use indexmap::IndexMap;

/// When to split: rows at most this many...
const MAX_ROWS: i64 = 32;
/// ...and at least this long.
const MIN_ROW: i64 = 1 << 16;
/// Each chunk of a split row keeps about this many elements or more.
const MIN_CHUNK: i64 = 1 << 12;
/// At most this many chunks per row.
const MAX_SPLITS: i64 = 512;
/// Chunks per row when the row's length is symbolic (dynamic shapes): the same kernels serve
/// every length, so the split cannot follow it. As many as a static split of a long row.
const SYMBOLIC_SPLITS: i64 = 512;

/// Splits every reduction that has few outputs and long rows. Other nodes are unchanged; buffer
/// ids stay valid: partial buffers are appended after the existing ones and named after the
/// buffer they reduce into (`buf3_partial`).
///
/// ```
/// use coil_ir::{Graph, Op, ReduceOp, TensorMeta, DType};
/// let mut g = Graph::new();
/// let x = g.input(TensorMeta::new(vec![1 << 20], DType::F32));
/// let s = g.push(Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[x], None).unwrap();
/// g.outputs.push(s);
/// let program = coil_passes::split_reductions(&coil_passes::lower(&g).unwrap());
/// assert_eq!(program.nodes.len(), 2); // partial sums, then the sum of the partials
/// ```
pub fn split_reductions(program: &LoopProgram) -> LoopProgram {
    let mut out = program.clone();
    out.nodes.clear();
    for node in &program.nodes {
        match split_plan(node) {
            Some(plan) => {
                let (first, second) = split(&mut out.buffers, program, node, plan);
                out.nodes.push(first);
                out.nodes.push(second);
            }
            None => out.nodes.push(node.clone()),
        }
    }
    out
}

/// The number of chunks to split a node's rows into, when it should split.
fn split_plan(node: &LoopNode) -> Option<i64> {
    let LoopKind::Reduction { ranges, reduction_ranges, op, .. } = &node.kind else { return None };
    if op.is_arg() {
        return None;
    }
    let rows: i64 = ranges.iter().map(|e| e.const_value()).product::<Option<i64>>()?;
    if rows > MAX_ROWS {
        return None;
    }
    match reduction_ranges.iter().map(|e| e.const_value()).product::<Option<i64>>() {
        Some(row) if row < MIN_ROW => None,
        Some(row) => Some((row / MIN_CHUNK).min(MAX_SPLITS)),
        None => Some(SYMBOLIC_SPLITS),
    }
}

fn split(buffers: &mut Vec<LoopBuffer>, program: &LoopProgram, node: &LoopNode, splits: i64) -> (LoopNode, LoopNode) {
    let LoopKind::Reduction { ranges, reduction_ranges, op, body } = &node.kind else { unreachable!() };
    let row: Expr = reduction_ranges.iter().copied().product();
    let chunk = (row + (splits - 1)).floor_div(splits);
    let out = program.buffer(node.output);

    // Stage 1: ranges + [S], reduction over one chunk; the original reduction position is
    // s * chunk + c, delinearized back onto the original reduction variables. When the chunks
    // overhang the row, the position is clamped (loads stay in bounds) and the overhanging lanes
    // contribute the reduction's identity.
    let s_var = range_var(ranges.len(), &Expr::int(splits));
    let c_var = reduction_var(0, &chunk);
    let flat = s_var * chunk + c_var;
    let tail = chunk * splits != row;
    let position = if tail { flat.min(row - 1) } else { flat };
    let mut map = IndexMap::new();
    let mut stride = Expr::int(1);
    for (i, extent) in reduction_ranges.iter().enumerate().rev() {
        // The outermost coordinate needs no modulo: the position lies inside the row.
        let coordinate = position.floor_div(stride);
        map.insert(reduction_var(i, extent), if i == 0 { coordinate } else { coordinate.modulo(*extent) });
        stride = stride * *extent;
    }
    let mut first_body = substitute(body, &map);
    if tail {
        let value = first_body.result;
        let dtype = first_body.value(value).dtype;
        let at = first_body.push(ScalarOp::Index(flat), DType::I64);
        let end = match row.const_value() {
            Some(n) => first_body.push(ScalarOp::Constant(Scalar::Int(n)), DType::I64),
            None => first_body.push(ScalarOp::Index(row), DType::I64),
        };
        let inside = first_body.push(ScalarOp::Binary(BinaryOp::Lt, at, end), DType::Bool);
        let identity = first_body.push(ScalarOp::Constant(identity(*op, dtype)), dtype);
        first_body.result = first_body.push(ScalarOp::Where(inside, value, identity), dtype);
    }
    let partial_dtype = partial_dtype(*op, body.value(body.result).dtype);
    if first_body.value(first_body.result).dtype != partial_dtype {
        let result = first_body.result;
        first_body.result = first_body.push(ScalarOp::Cast(result), partial_dtype);
    }
    // A reduction's ranges are its output shape (kept size-1 dims included).
    let mut partial_shape: Vec<usize> = ranges.iter().map(|e| e.const_value().unwrap() as usize).collect();
    partial_shape.push(splits as usize);
    buffers.push(LoopBuffer::new(format!("{}_partial", out.name), TensorMeta::new(partial_shape, partial_dtype)));
    let partial = BufferId(buffers.len() - 1);
    let mut first_ranges = ranges.clone();
    first_ranges.push(Expr::int(splits));
    let first = LoopNode {
        output: partial,
        origins: node.origins.clone(),
        kind: LoopKind::Reduction { ranges: first_ranges, reduction_ranges: vec![chunk], op: *op, body: first_body },
    };

    // Stage 2: reduce the S partials of each row.
    let row_index: Expr = {
        let mut flat = Expr::int(0);
        for (i, extent) in ranges.iter().enumerate() {
            flat = flat * extent.const_value().unwrap() + range_var(i, extent);
        }
        flat
    };
    let mut second_body = Body::default();
    let index = row_index * splits + reduction_var(0, &Expr::int(splits));
    second_body.result = second_body.push(ScalarOp::Load { buffer: partial, index }, partial_dtype);
    let second = LoopNode {
        output: node.output,
        origins: node.origins.clone(),
        kind: LoopKind::Reduction {
            ranges: ranges.clone(),
            reduction_ranges: vec![Expr::int(splits)],
            op: *op,
            body: second_body,
        },
    };
    (first, second)
}

/// The value that leaves a reduction unchanged.
fn identity(op: ReduceOp, dtype: DType) -> Scalar {
    let float = dtype.is_float();
    match op {
        ReduceOp::Sum => Scalar::Int(0),
        ReduceOp::Prod => Scalar::Int(1),
        ReduceOp::Max if float => Scalar::Float(f64::NEG_INFINITY),
        ReduceOp::Min if float => Scalar::Float(f64::INFINITY),
        ReduceOp::Max => Scalar::Int(if dtype == DType::Bool { 0 } else { integer_bounds(dtype).0 }),
        ReduceOp::Min => Scalar::Int(if dtype == DType::Bool { 1 } else { integer_bounds(dtype).1 }),
        ReduceOp::ArgMax | ReduceOp::ArgMin => unreachable!("arg reductions are not split"),
    }
}

/// The smallest and largest value of an integer dtype.
fn integer_bounds(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::U8 => (0, u8::MAX as i64),
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::I16 => (i16::MIN as i64, i16::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        _ => (i64::MIN, i64::MAX),
    }
}

/// Partials of half-precision sums and products are kept in f32 (rounded once at the end);
/// max and min are exact in any dtype.
fn partial_dtype(op: ReduceOp, dtype: DType) -> DType {
    match (op, dtype) {
        (ReduceOp::Sum | ReduceOp::Prod, DType::F16 | DType::BF16) => DType::F32,
        _ => dtype,
    }
}

/// A copy of `body` with symbols replaced in every index expression.
fn substitute(body: &Body, map: &IndexMap<Expr, Expr>) -> Body {
    let mut out = body.clone();
    for v in &mut out.values {
        match &mut v.op {
            ScalarOp::Load { index, .. } | ScalarOp::MaskedLoad { index, .. } | ScalarOp::Index(index) => {
                *index = index.substitute(map)
            }
            ScalarOp::IndirectLoad { index, stride, bound, .. } => {
                *index = index.substitute(map);
                *stride = stride.substitute(map);
                *bound = bound.substitute(map);
            }
            ScalarOp::Rand { counter, .. } => *counter = counter.substitute(map),
            ScalarOp::Constant(_)
            | ScalarOp::Unary(..)
            | ScalarOp::Binary(..)
            | ScalarOp::Where(..)
            | ScalarOp::Cast(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_ir::{Graph, Op};

    fn sum_program(len: usize, dtype: DType) -> LoopProgram {
        let mut g = Graph::new();
        let x = g.input(TensorMeta::new(vec![len], dtype));
        let s = g.push(Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false }, &[x], None).unwrap();
        g.outputs.push(s);
        crate::lower(&g).unwrap()
    }

    #[test]
    fn long_single_row_splits_in_two_stages() {
        let p = split_reductions(&sum_program(1 << 20, DType::F32));
        insta::assert_snapshot!(p.to_string());
    }

    #[test]
    fn uneven_row_masks_the_tail_with_the_identity() {
        let p = split_reductions(&sum_program((1 << 20) + 3, DType::BF16));
        insta::assert_snapshot!(p.to_string());
    }

    #[test]
    fn many_rows_or_short_rows_stay_whole() {
        let short = sum_program(1000, DType::F32);
        assert_eq!(split_reductions(&short), short);
        let mut g = Graph::new();
        let x = g.input(TensorMeta::new(vec![64, 1 << 16], DType::F32));
        let s = g.push(Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: false }, &[x], None).unwrap();
        g.outputs.push(s);
        let many = crate::lower(&g).unwrap();
        assert_eq!(split_reductions(&many), many);
    }
}
