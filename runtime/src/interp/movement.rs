//! Data movement: pad, cat, gather, index_select, scatter. (The four views are single
//! [`Layout`] transformations in [`super::eval`].)
//!
//! Each op is expressed through layouts: pad and cat write their operands through a sub-layout
//! of the output; gather, index_select and scatter visit the index tensor's positions with the
//! data tensor's strides, the indexed dim's stride zeroed, and add `index * stride` to reach
//! the chosen element.

use super::layout::Layout;
use super::{round_float, wrap_int, Data, Value};
use coil_ir::{DType, Error, ReduceOp, Result, Scalar};

/// Constant padding: the output is filled with `value`, and `x` is written to the block that
/// starts at the `before` pads.
pub(super) fn pad(x: &Value, pads: &[(usize, usize)], value: Scalar, shape: &[usize], dtype: DType) -> Data {
    let n: usize = shape.iter().product();
    let mut data = Value::scalar(value, dtype).data.repeat(n);
    let out = Layout::contiguous(shape);
    let mut inner = out.with_shape(&x.shape);
    inner.offset = pads.iter().zip(&out.strides).map(|(&(before, _), &s)| before as isize * s).sum();
    data.put(inner.offsets(), &x.cast(dtype).data);
    data
}

/// Concatenation along `dim`: each operand is written to its slice of the output.
pub(super) fn cat(xs: &[&Value], dim: usize, shape: &[usize], dtype: DType) -> Data {
    let n: usize = shape.iter().product();
    let mut data = Value::scalar(Scalar::Int(0), dtype).data.repeat(n);
    let out = Layout::contiguous(shape);
    let mut start = 0;
    for x in xs {
        let len = x.shape[dim];
        data.put(out.slice(dim, start, len, 1).offsets(), &x.cast(dtype).data);
        start += len;
    }
    data
}

/// Index values, checked to lie in `0..size`.
fn checked_indices(index: &Value, dim: usize, size: usize) -> Result<&[i64]> {
    let idx = index.ints();
    if let Some(&bad) = idx.iter().find(|&&i| i < 0 || i as u64 >= size as u64) {
        return Err(Error::value(format!("index {bad} is out of bounds for dim {dim} with size {size}")));
    }
    Ok(idx)
}

/// A 0-d operand behaves as a 1-element 1-D one (PyTorch treats its size along dim 0 as 1).
fn shape_1d(shape: &[usize]) -> Vec<usize> {
    if shape.is_empty() {
        vec![1]
    } else {
        shape.to_vec()
    }
}

/// `torch.gather`: `out[p] = x[p with p[dim] = index[p]]` over the positions `p` of `index`.
pub(super) fn gather(x: &Value, index: &Value, dim: usize) -> Result<Data> {
    let xl = Layout::contiguous(&shape_1d(&x.shape));
    let idx = checked_indices(index, dim, xl.shape[dim])?;
    let stride = xl.strides[dim];
    let base = xl.drop_dim(dim).with_shape(&shape_1d(&index.shape));
    let offsets = base.offsets().zip(idx).map(|(b, &i)| (b as isize + i as isize * stride) as usize);
    Ok(x.data.take(offsets))
}

/// `torch.index_select`: `out[p] = x[p with p[dim] = index[p[dim]]]` over the output's
/// positions `p`; the index is 1-D or 0-d.
pub(super) fn index_select(x: &Value, index: &Value, dim: usize, shape: &[usize]) -> Result<Data> {
    let xl = Layout::contiguous(&shape_1d(&x.shape));
    let idx = checked_indices(index, dim, xl.shape[dim])?;
    let stride = xl.strides[dim];
    let out_shape = shape_1d(shape);
    let base = xl.drop_dim(dim).with_shape(&out_shape);
    let along = Layout::coordinate(&out_shape, dim);
    let offsets = base.offsets().zip(along.offsets()).map(|(b, k)| (b as isize + idx[k] as isize * stride) as usize);
    Ok(x.data.take(offsets))
}

/// `torch.scatter` / `scatter_reduce`: a copy of `x` with `out[p with p[dim] = index[p]] = src[p]`
/// (or combined with `reduce`: `+=`, `*=`, max, min) for every position `p` of `index`, in
/// row-major order (the last write wins). Max and min propagate NaN and keep the value already
/// there on a tie (`-0.0` against `0.0`), as PyTorch's kernels do.
pub(super) fn scatter(x: &Value, index: &Value, src: &Value, dim: usize, reduce: Option<ReduceOp>) -> Result<Data> {
    let xl = Layout::contiguous(&shape_1d(&x.shape));
    let idx = checked_indices(index, dim, xl.shape[dim])?;
    let stride = xl.strides[dim];
    let positions = shape_1d(&index.shape);
    let targets = xl.drop_dim(dim).with_shape(&positions);
    let sources = Layout::contiguous(&shape_1d(&src.shape)).with_shape(&positions);
    let pairs =
        targets.offsets().zip(idx).map(|(b, &i)| (b as isize + i as isize * stride) as usize).zip(sources.offsets());
    let dtype = x.dtype;
    let mut data = x.data.clone();
    match (&mut data, &src.data) {
        (Data::F(out), Data::F(s)) => {
            for (t, o) in pairs {
                let (a, b) = (out[t], s[o]);
                out[t] = match reduce {
                    None => b,
                    Some(ReduceOp::Sum) => round_float(dtype, a + b),
                    Some(ReduceOp::Prod) => round_float(dtype, a * b),
                    Some(ReduceOp::Max) if a.is_nan() || (!b.is_nan() && b <= a) => a,
                    Some(ReduceOp::Min) if a.is_nan() || (!b.is_nan() && b >= a) => a,
                    Some(_) => b,
                };
            }
        }
        (Data::I(out), Data::I(s)) => {
            for (t, o) in pairs {
                let (a, b) = (out[t], s[o]);
                out[t] = match reduce {
                    None => b,
                    Some(ReduceOp::Sum) => wrap_int(dtype, a.wrapping_add(b)),
                    Some(ReduceOp::Prod) => wrap_int(dtype, a.wrapping_mul(b)),
                    Some(ReduceOp::Max) => a.max(b),
                    Some(ReduceOp::Min) => a.min(b),
                    Some(_) => unreachable!("scatter never reduces with an arg op (checked by infer)"),
                };
            }
        }
        _ => unreachable!("scatter src has the input's dtype"),
    }
    Ok(data)
}
