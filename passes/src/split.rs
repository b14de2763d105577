//! Split reductions: a reduction with too few outputs to keep the machine busy (a full sum, a
//! loss) runs as two reductions. The first reduces `S` chunks of every row in parallel into a
//! partial buffer of `X * S` values; the second reduces the `S` partials of each row.
//!
//! A *column* reduction (rows running down memory, `x.sum(dim=0)`: a bias gradient) with a few
//! thousand outputs is split too: a GPU covers 32 outputs per block, so 768 outputs of 8192
//! rows are 24 blocks on a machine of 132 SMs. Its chunks are the outer dim of the partial
//! buffer (`[S, X]`), so both stages read consecutive outputs at consecutive addresses.
//!
//! This is a `LoopProgram -> LoopProgram` rewrite before scheduling: both stages are ordinary
//! reduction nodes, so the scheduler, the kernel builder and every backend treat them as usual.
//! Only associative reductions split (sum, prod, max, min); arg reductions would need the
//! position carried along and stay whole. Rows need not divide evenly: the last chunk's
//! overhanging lanes read a clamped position and contribute the reduction's identity. Partials of f16/bf16 sums are kept in f32, so the
//! result is rounded once, as an unsplit reduction's is.

use coil_ir::kernel::{rindex, xindex};
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

/// Column reductions split while they have fewer outputs than this...
const COLUMN_OUTPUTS: i64 = 1 << 14;
/// ...into a power of two of chunks, so that outputs times chunks reach it, each chunk at
/// least this many rows.
const MIN_COLUMN_CHUNK: i64 = 256;

/// How a reduction splits: into `splits` chunks per row, the chunk index the inner dim of the
/// partial buffer (`[X, S]`, long rows) or its outer dim (`[S, X]`, column reductions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Plan {
    splits: i64,
    chunks_outer: bool,
}

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
        match split_plan(program, node) {
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

/// How to split a node's rows, when it should split.
fn split_plan(program: &LoopProgram, node: &LoopNode) -> Option<Plan> {
    let LoopKind::Reduction { ranges, reduction_ranges, op, .. } = &node.kind else { return None };
    if op.is_arg() {
        return None;
    }
    let rows: i64 = ranges.iter().map(|e| e.const_value()).product::<Option<i64>>()?;
    let row = reduction_ranges.iter().map(|e| e.const_value()).product::<Option<i64>>();
    if rows > MAX_ROWS {
        let row = row?;
        if rows >= COLUMN_OUTPUTS || !runs_down_columns(program, node) {
            return None;
        }
        let mut splits = ((COLUMN_OUTPUTS / rows) as u64).next_power_of_two() as i64;
        while splits > 1 && row / splits < MIN_COLUMN_CHUNK {
            splits /= 2;
        }
        return (splits > 1).then_some(Plan { splits, chunks_outer: true });
    }
    let splits = match row {
        Some(row) if row < MIN_ROW => return None,
        Some(row) => (row / MIN_CHUNK).min(MAX_SPLITS),
        None => SYMBOLIC_SPLITS,
    };
    Some(Plan { splits, chunks_outer: false })
}

/// Whether a reduction reads down columns: in its flat `(xindex, rindex)` space some load
/// steps by 1 along `xindex` and by a nonzero stride along `rindex`, and none is contiguous
/// along the row (as the GPU's column plan decides, `coil_codegen::cuda::launch::column_like`).
fn runs_down_columns(program: &LoopProgram, node: &LoopNode) -> bool {
    let LoopKind::Reduction { ranges, reduction_ranges, body, .. } = &node.kind else { return false };
    let (xn, rn): (Expr, Expr) = (ranges.iter().copied().product(), reduction_ranges.iter().copied().product());
    let (x, r) = (xindex(&xn), rindex(&rn));
    let mut map = IndexMap::new();
    for (vars, extents, flat) in
        [(range_var as fn(usize, &Expr) -> Expr, ranges, x), (reduction_var, reduction_ranges, r)]
    {
        let coords = crate::schedule::delinearize(flat, extents);
        for (i, (extent, c)) in extents.iter().zip(coords).enumerate() {
            map.insert(vars(i, extent), c);
        }
    }
    let step = |e: Expr, v: Expr| e.substitute(&IndexMap::from([(v, v + 1)])) - e;
    let mut column = false;
    for v in &body.values {
        let ScalarOp::Load { buffer, index } = &v.op else { continue };
        if program.buffer(*buffer).meta.numel() <= 1 {
            continue;
        }
        let index = index.substitute(&map);
        let (dr, dx) = (step(index, r), step(index, x));
        if dr == Expr::int(1) && dx != Expr::int(0) {
            return false;
        }
        column |= dr != Expr::int(0) && dx == Expr::int(1);
    }
    column
}

fn split(buffers: &mut Vec<LoopBuffer>, program: &LoopProgram, node: &LoopNode, plan: Plan) -> (LoopNode, LoopNode) {
    let LoopKind::Reduction { ranges, reduction_ranges, op, body } = &node.kind else { unreachable!() };
    let Plan { splits, chunks_outer } = plan;
    let row: Expr = reduction_ranges.iter().copied().product();
    let chunk = (row + (splits - 1)).floor_div(splits);
    let out = program.buffer(node.output);

    // Stage 1: ranges + [S] (or [S] + ranges, the range variables renumbered), reduction over
    // one chunk; the original reduction position is s * chunk + c, delinearized back onto the
    // original reduction variables. When the chunks overhang the row, the position is clamped
    // (loads stay in bounds) and the overhanging lanes contribute the reduction's identity.
    let mut map = IndexMap::new();
    let s_var = if chunks_outer {
        for (i, extent) in ranges.iter().enumerate() {
            map.insert(range_var(i, extent), range_var(i + 1, extent));
        }
        range_var(0, &Expr::int(splits))
    } else {
        range_var(ranges.len(), &Expr::int(splits))
    };
    let c_var = reduction_var(0, &chunk);
    let flat = s_var * chunk + c_var;
    let tail = chunk * splits != row;
    let position = if tail { flat.min(row - 1) } else { flat };
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
    let mut first_ranges = ranges.clone();
    if chunks_outer {
        first_ranges.insert(0, Expr::int(splits));
    } else {
        first_ranges.push(Expr::int(splits));
    }
    let partial_shape: Vec<usize> = first_ranges.iter().map(|e| e.const_value().unwrap() as usize).collect();
    buffers.push(LoopBuffer::new(format!("{}_partial", out.name), TensorMeta::new(partial_shape, partial_dtype)));
    let partial = BufferId(buffers.len() - 1);
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
    let s_var = reduction_var(0, &Expr::int(splits));
    let rows: i64 = ranges.iter().map(|e| e.const_value().unwrap()).product();
    let index = if chunks_outer { s_var * rows + row_index } else { row_index * splits + s_var };
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

    fn column_sum_program(rows: usize, cols: usize) -> LoopProgram {
        let mut g = Graph::new();
        let x = g.input(TensorMeta::new(vec![8, rows / 8, cols], DType::BF16));
        let s = g.push(Op::Reduce { op: ReduceOp::Sum, dims: vec![0, 1], keepdim: false }, &[x], None).unwrap();
        g.outputs.push(s);
        crate::lower(&g).unwrap()
    }

    #[test]
    fn column_sum_with_few_outputs_splits_with_the_chunks_outer() {
        // A bias gradient: 768 outputs of 8192 rows, 32 chunks of 256 rows.
        let p = split_reductions(&column_sum_program(8192, 768));
        insta::assert_snapshot!(p.to_string());
        let LoopKind::Reduction { ranges, reduction_ranges, .. } = &p.nodes[0].kind else { panic!("{p}") };
        assert_eq!(
            (ranges.as_slice(), reduction_ranges.as_slice()),
            (&[Expr::int(32), Expr::int(768)][..], &[Expr::int(256)][..])
        );
        // Wide enough already, or rows contiguous: whole.
        let wide = column_sum_program(1024, 1 << 14);
        assert_eq!(split_reductions(&wide), wide);
        let short = column_sum_program(256, 768);
        assert_eq!(split_reductions(&short), short);
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
