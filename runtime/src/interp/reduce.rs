//! Reductions, cumsum and bmm.
//!
//! A reduction visits its operand through a permuted [`super::layout::Layout`] (kept dims first, reduced dims
//! last), so every output element reduces one contiguous run of the permuted elements, and the
//! outputs come out in row-major order of the kept dims (with or without `keepdim`). Sums and
//! products accumulate in f64 (wrapping i64 for integers and bool) and round once.

use super::{round_float, wrap_int, Data, Value};
use coil_ir::{DType, Error, ReduceOp, Result};

/// The operand's elements grouped per output element: `(groups, group length)`.
fn grouped(x: &Value, dims: &[usize]) -> (Data, usize) {
    let kept = (0..x.shape.len()).filter(|d| !dims.contains(d));
    let reduced = (0..x.shape.len()).filter(|d| dims.contains(d));
    let perm: Vec<usize> = kept.chain(reduced).collect();
    let group: usize = dims.iter().map(|&d| x.shape[d]).product();
    (x.view(&x.layout().permute(&perm)), group)
}

/// Reduces `dims` of `x` (none: every element is its own group), giving a value of `out`.
pub(super) fn reduce(op: ReduceOp, x: &Value, dims: &[usize], out: DType) -> Result<Data> {
    let (data, group) = grouped(x, dims);
    let outputs = x.shape.iter().enumerate().filter(|(d, _)| !dims.contains(d)).map(|(_, &n)| n).product::<usize>();
    if group == 0 && !matches!(op, ReduceOp::Sum | ReduceOp::Prod) {
        return Err(Error::value(format!("{} of an empty dim: the reduction has no identity", op.name())));
    }
    let rows = |len: usize| (0..outputs).map(move |k| k * len..(k + 1) * len);
    Ok(match &data {
        Data::F(v) => {
            let rows = rows(group).map(|r| &v[r]);
            if op.is_arg() {
                Data::I(rows.map(|row| arg_float(op, row)).collect())
            } else {
                Data::F(rows.map(|row| round_float(out, reduce_float(op, row))).collect())
            }
        }
        Data::I(v) => {
            let rows = rows(group).map(|r| &v[r]);
            if op.is_arg() {
                Data::I(rows.map(|row| arg_int(op, row)).collect())
            } else {
                Data::I(rows.map(|row| wrap_int(out, reduce_int(op, row))).collect())
            }
        }
    })
}

fn reduce_float(op: ReduceOp, row: &[f64]) -> f64 {
    match op {
        ReduceOp::Sum => row.iter().fold(0.0, |a, &b| a + b),
        ReduceOp::Prod => row.iter().fold(1.0, |a, &b| a * b),
        ReduceOp::Max | ReduceOp::Min => {
            let max = op == ReduceOp::Max;
            row.iter()
                .copied()
                .reduce(|a, b| match () {
                    _ if a.is_nan() || b.is_nan() => f64::NAN,
                    _ if max => a.max(b),
                    _ => a.min(b),
                })
                .expect("non-empty")
        }
        ReduceOp::ArgMax | ReduceOp::ArgMin => unreachable!(),
    }
}

fn reduce_int(op: ReduceOp, row: &[i64]) -> i64 {
    match op {
        ReduceOp::Sum => row.iter().fold(0i64, |a, &b| a.wrapping_add(b)),
        ReduceOp::Prod => row.iter().fold(1i64, |a, &b| a.wrapping_mul(b)),
        ReduceOp::Max => *row.iter().max().expect("non-empty"),
        ReduceOp::Min => *row.iter().min().expect("non-empty"),
        ReduceOp::ArgMax | ReduceOp::ArgMin => unreachable!(),
    }
}

/// Index of the first maximum (minimum); NaN beats every number and the first NaN wins.
fn arg_float(op: ReduceOp, row: &[f64]) -> i64 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate().skip(1) {
        let b = row[best];
        let better = match op {
            _ if b.is_nan() => false,
            _ if x.is_nan() => true,
            ReduceOp::ArgMax => x > b,
            _ => x < b,
        };
        if better {
            best = i;
        }
    }
    best as i64
}

/// Index of the first maximum (minimum).
fn arg_int(op: ReduceOp, row: &[i64]) -> i64 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate().skip(1) {
        if (op == ReduceOp::ArgMax && x > row[best]) || (op == ReduceOp::ArgMin && x < row[best]) {
            best = i;
        }
    }
    best as i64
}

/// Running sum along `dim`: the dim is moved last, each row is scanned (f64 or wrapping i64
/// accumulator, every output rounded to `out`), and the rows are written back through the same
/// permuted layout of the output.
pub(super) fn cumsum(x: &Value, dim: usize, out: DType) -> Data {
    if x.shape.is_empty() {
        return x.cast(out).data;
    }
    let rank = x.shape.len();
    let perm: Vec<usize> = (0..rank).filter(|&d| d != dim).chain([dim]).collect();
    let layout = x.layout().permute(&perm);
    let len = x.shape[dim];
    let rows = x.view(&layout);
    let scanned = match &rows {
        Data::F(v) => Data::F(
            v.chunks(len.max(1))
                .flat_map(|row| {
                    row.iter().scan(0.0f64, |acc, &e| {
                        *acc += e;
                        Some(round_float(out, *acc))
                    })
                })
                .collect(),
        ),
        Data::I(v) => Data::I(
            v.chunks(len.max(1))
                .flat_map(|row| {
                    row.iter().scan(0i64, |acc, &e| {
                        *acc = acc.wrapping_add(e);
                        Some(wrap_int(out, *acc))
                    })
                })
                .collect(),
        ),
    };
    let mut data = scanned.clone();
    data.put(layout.offsets(), &scanned);
    data
}

/// `[..., m, k] @ [..., k, n]` over equal batch dims; each output accumulates in f64 (wrapping
/// i64 for integers) and rounds once to `out`.
pub(super) fn bmm(a: &Value, b: &Value, out: DType) -> Data {
    let r = a.shape.len();
    let (m, k, n) = (a.shape[r - 2], a.shape[r - 1], b.shape[r - 1]);
    let batch: usize = a.shape[..r - 2].iter().product();
    let outputs = (0..batch).flat_map(|bi| (0..m).flat_map(move |i| (0..n).map(move |j| (bi, i, j))));
    let ai = move |bi: usize, i: usize, kk: usize| (bi * m + i) * k + kk;
    let bj = move |bi: usize, kk: usize, j: usize| (bi * k + kk) * n + j;
    match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => Data::F(
            outputs
                .map(|(bi, i, j)| {
                    round_float(out, (0..k).fold(0.0, |acc, kk| acc + x[ai(bi, i, kk)] * y[bj(bi, kk, j)]))
                })
                .collect(),
        ),
        (Data::I(x), Data::I(y)) => Data::I(
            outputs
                .map(|(bi, i, j)| {
                    let dot =
                        (0..k).fold(0i64, |acc, kk| acc.wrapping_add(x[ai(bi, i, kk)].wrapping_mul(y[bj(bi, kk, j)])));
                    wrap_int(out, dot)
                })
                .collect(),
        ),
        _ => unreachable!("bmm operands share a dtype"),
    }
}
