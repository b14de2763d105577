//! `argsort`: the reference for the sort primitive, one line at a time with the standard
//! library's stable sort and PyTorch's order of floats (NaN after every number ascending and
//! before every number descending, all NaNs equal to each other, `-0.0` equal to `0.0`).

use super::{Data, Value};
use std::cmp::Ordering;

/// PyTorch's ascending order of two floats: NaN is larger than everything, equal to NaN.
pub(crate) fn float_order(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).expect("neither is NaN"),
    }
}

/// The stable sorting permutation of each line of `x` along `dim`, as i64 positions along `dim`
/// at the line's places: the dim is moved last, each row's positions are sorted by their values
/// (ties keep ascending positions in both directions, as `stable=True` does), and written back
/// through the same permuted layout.
pub(super) fn argsort(x: &Value, dim: usize, descending: bool) -> Data {
    if x.shape.is_empty() {
        return Data::I(vec![0]);
    }
    let rank = x.shape.len();
    let perm: Vec<usize> = (0..rank).filter(|&d| d != dim).chain([dim]).collect();
    let layout = x.layout().permute(&perm);
    let len = x.shape[dim].max(1);
    let rows = x.view(&layout);
    let mut positions: Vec<i64> = Vec::with_capacity(rows.len());
    let mut sort_row = |order: &dyn Fn(usize, usize) -> Ordering, n: usize| {
        let mut row: Vec<usize> = (0..n).collect();
        // `sort_by` is stable: equal elements keep their (ascending) positions.
        row.sort_by(|&i, &j| if descending { order(j, i) } else { order(i, j) });
        positions.extend(row.into_iter().map(|i| i as i64));
    };
    match &rows {
        Data::F(v) => v.chunks(len).for_each(|r| sort_row(&|i, j| float_order(r[i], r[j]), r.len())),
        Data::I(v) => v.chunks(len).for_each(|r| sort_row(&|i, j| r[i].cmp(&r[j]), r.len())),
    }
    let sorted = Data::I(positions);
    let mut data = sorted.clone();
    data.put(layout.offsets(), &sorted);
    data
}
