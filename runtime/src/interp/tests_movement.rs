//! Tests of views and data movement.

use super::tests::{bools, err, f32s, i32s, i64s, ok};
use crate::Buffer;
use coil_ir::{Op, ReduceOp, Scalar};

fn arange(n: usize, shape: &[usize]) -> Buffer {
    f32s(&(0..n).map(|i| i as f32).collect::<Vec<_>>(), shape)
}

fn vals(b: &Buffer) -> (Vec<usize>, Vec<f32>) {
    (b.shape.clone(), b.to_vec::<f32>())
}

#[test]
fn reshape_and_permute() {
    let x = arange(6, &[2, 3]);
    assert_eq!(vals(&ok(Op::Reshape { shape: vec![3, 1, 2] }, &[&x])), (vec![3, 1, 2], x.to_vec::<f32>()));
    let x = arange(24, &[2, 3, 4]);
    let p = ok(Op::Permute { perm: vec![2, 0, 1] }, &[&x]);
    let want: Vec<f32> =
        (0..4).flat_map(|k| (0..2).flat_map(move |i| (0..3).map(move |j| (12 * i + 4 * j + k) as f32))).collect();
    assert_eq!(vals(&p), (vec![4, 2, 3], want));
}

#[test]
fn expand_broadcasts_new_and_unit_dims() {
    let x = f32s(&[1.0, 2.0, 3.0], &[3]);
    assert_eq!(vals(&ok(Op::Expand { shape: vec![2, 3] }, &[&x])), (vec![2, 3], vec![1., 2., 3., 1., 2., 3.]));
    let y = f32s(&[1.0, 2.0], &[2, 1]);
    let e = ok(Op::Expand { shape: vec![2, 2, 3] }, &[&y]);
    assert_eq!(vals(&e), (vec![2, 2, 3], vec![1., 1., 1., 2., 2., 2., 1., 1., 1., 2., 2., 2.]));
    let s = ok(Op::Expand { shape: vec![2, 2] }, &[&i64s(&[7], &[])]);
    assert_eq!(s.to_vec::<i64>(), vec![7; 4]);
}

#[test]
fn slices_with_positive_and_negative_steps() {
    let x = arange(10, &[2, 5]);
    let s = |start, len, step| vals(&ok(Op::Slice { dim: 1, start, len, step }, &[&x]));
    assert_eq!(s(1, 2, 2), (vec![2, 2], vec![1., 3., 6., 8.]));
    assert_eq!(s(4, 5, -1), (vec![2, 5], vec![4., 3., 2., 1., 0., 9., 8., 7., 6., 5.]));
    assert_eq!(s(4, 3, -2), (vec![2, 3], vec![4., 2., 0., 9., 7., 5.]));
    assert_eq!(s(2, 0, 1), (vec![2, 0], vec![]));
    let r = ok(Op::Slice { dim: 0, start: 1, len: 2, step: -1 }, &[&x]);
    assert_eq!(vals(&r), (vec![2, 5], vec![5., 6., 7., 8., 9., 0., 1., 2., 3., 4.]));
}

#[test]
fn pad_with_constants() {
    let x = f32s(&[1., 2., 3., 4.], &[2, 2]);
    let p = ok(Op::Pad { pads: vec![(1, 0), (0, 2)], value: Scalar::Float(9.0) }, &[&x]);
    assert_eq!(vals(&p), (vec![3, 4], vec![9., 9., 9., 9., 1., 2., 9., 9., 3., 4., 9., 9.]));
    let p = ok(Op::Pad { pads: vec![(2, 1)], value: Scalar::Float(-1.5) }, &[&i32s(&[5, 6], &[2])]);
    assert_eq!(p.to_vec::<i32>(), vec![-1, -1, 5, 6, -1]);
    let p = ok(Op::Pad { pads: vec![(0, 1)], value: Scalar::Bool(true) }, &[&bools(&[false], &[1])]);
    assert_eq!(p.to_vec::<bool>(), vec![false, true]);
}

#[test]
fn cat_along_each_dim() {
    let a = f32s(&[1., 2., 3., 4.], &[2, 2]);
    let b = f32s(&[5., 6.], &[2, 1]);
    let c = f32s(&[], &[2, 0]);
    let r = ok(Op::Cat { dim: 1 }, &[&a, &b, &c, &a]);
    assert_eq!(vals(&r), (vec![2, 5], vec![1., 2., 5., 1., 2., 3., 4., 6., 3., 4.]));
    let r = ok(Op::Cat { dim: 0 }, &[&a, &f32s(&[7., 8.], &[1, 2])]);
    assert_eq!(vals(&r), (vec![3, 2], vec![1., 2., 3., 4., 7., 8.]));
}

#[test]
fn gather_along_each_dim() {
    let x = f32s(&[0., 10., 20., 30., 40., 50., 60., 70., 80., 90.], &[2, 5]);
    let g = ok(Op::Gather { dim: 1 }, &[&x, &i64s(&[4, 0, 4, 1, 1, 3], &[2, 3])]);
    assert_eq!(vals(&g), (vec![2, 3], vec![40., 0., 40., 60., 60., 80.]));
    // the index may be smaller than x outside dim
    let g = ok(Op::Gather { dim: 1 }, &[&x, &i64s(&[2, 3], &[1, 2])]);
    assert_eq!(vals(&g), (vec![1, 2], vec![20., 30.]));
    let y = f32s(&[1., 2., 3., 4., 5., 6.], &[3, 2]);
    let g = ok(Op::Gather { dim: 0 }, &[&y, &i32s(&[2, 0, 1, 1], &[2, 2])]);
    assert_eq!(vals(&g), (vec![2, 2], vec![5., 2., 3., 4.]));
    let g = ok(Op::Gather { dim: 0 }, &[&f32s(&[5.], &[]), &i64s(&[0], &[])]);
    assert_eq!(vals(&g), (vec![], vec![5.]));
}

#[test]
fn out_of_bounds_indices_are_errors() {
    let x = arange(10, &[2, 5]);
    let e = err(Op::Gather { dim: 1 }, &[&x, &i64s(&[0, 7], &[1, 2])]);
    assert_eq!(e.message, "index 7 is out of bounds for dim 1 with size 5");
    assert_eq!(e.op.as_deref(), Some("gather"));
    let e = err(Op::Gather { dim: 0 }, &[&x, &i32s(&[-1], &[1, 1])]);
    assert_eq!(e.message, "index -1 is out of bounds for dim 0 with size 2");
    let e = err(Op::IndexSelect { dim: 0 }, &[&x, &i64s(&[2], &[1])]);
    assert_eq!(e.message, "index 2 is out of bounds for dim 0 with size 2");
    let e = err(Op::Scatter { dim: 1, reduce: Some(ReduceOp::Sum) }, &[&x, &i64s(&[5], &[1, 1]), &x]);
    assert_eq!(e.message, "index 5 is out of bounds for dim 1 with size 5");
}

#[test]
fn index_select_rows_and_columns() {
    let y = f32s(&[1., 2., 3., 4., 5., 6.], &[3, 2]);
    let s = ok(Op::IndexSelect { dim: 0 }, &[&y, &i64s(&[2, 0, 2], &[3])]);
    assert_eq!(vals(&s), (vec![3, 2], vec![5., 6., 1., 2., 5., 6.]));
    let s = ok(Op::IndexSelect { dim: 1 }, &[&y, &i32s(&[1], &[])]);
    assert_eq!(vals(&s), (vec![3, 1], vec![2., 4., 6.]));
    let s = ok(Op::IndexSelect { dim: 1 }, &[&y, &i64s(&[], &[0])]);
    assert_eq!(vals(&s), (vec![3, 0], vec![]));
}

#[test]
fn scatter_and_scatter_add() {
    let zeros = f32s(&[0.; 9], &[3, 3]);
    let src = f32s(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let s = ok(Op::Scatter { dim: 0, reduce: None }, &[&zeros, &i64s(&[0, 1, 2, 2, 0, 1], &[2, 3]), &src]);
    assert_eq!(vals(&s), (vec![3, 3], vec![1., 5., 0., 0., 2., 6., 4., 0., 3.]));
    // index smaller than src: only src's leading block is used
    let s = ok(Op::Scatter { dim: 1, reduce: None }, &[&f32s(&[0.; 8], &[2, 4]), &i64s(&[3, 0], &[1, 2]), &src]);
    assert_eq!(vals(&s), (vec![2, 4], vec![2., 0., 0., 1., 0., 0., 0., 0.]));
    let s = ok(
        Op::Scatter { dim: 0, reduce: Some(ReduceOp::Sum) },
        &[&f32s(&[1.; 3], &[3]), &i64s(&[0, 0, 2, 0], &[4]), &f32s(&[1., 2., 3., 4.], &[4])],
    );
    assert_eq!(s.to_vec::<f32>(), vec![8., 1., 4.]);
    let s = ok(
        Op::Scatter { dim: 0, reduce: None },
        &[&f32s(&[0.; 2], &[2]), &i32s(&[1, 1], &[2]), &f32s(&[7., 9.], &[2])],
    );
    assert_eq!(s.to_vec::<f32>(), vec![0., 9.]);
    let i8s = |v: Vec<i8>| Buffer::from_vec(v.clone(), vec![v.len()]);
    let s = ok(
        Op::Scatter { dim: 0, reduce: Some(ReduceOp::Sum) },
        &[&i8s(vec![100]), &i64s(&[0, 0], &[2]), &i8s(vec![100, 100])],
    );
    assert_eq!(s.to_vec::<i8>(), vec![44]);
}

#[test]
fn scatter_with_prod_max_and_min() {
    let scatter = |reduce, x: &[f32], src: &[f32]| {
        let idx = i64s(&[0, 0, 1, 2], &[4]);
        ok(Op::Scatter { dim: 0, reduce: Some(reduce) }, &[&f32s(x, &[3]), &idx, &f32s(src, &[4])]).to_vec::<f32>()
    };
    assert_eq!(scatter(ReduceOp::Prod, &[2., 3., 1.], &[4., -1., 0.5, 0.]), vec![-8., 1.5, 0.]);
    assert_eq!(scatter(ReduceOp::Max, &[2., 3., 1.], &[4., -1., 0.5, 7.]), vec![4., 3., 7.]);
    assert_eq!(scatter(ReduceOp::Min, &[2., 3., 1.], &[4., -1., 0.5, 7.]), vec![-1., 0.5, 1.]);
    // NaN wins from either side; a tie keeps the stored value (its sign of zero).
    let m = scatter(ReduceOp::Max, &[f32::NAN, 0., -0.], &[1., 2., -0., 0.]);
    assert!(m[0].is_nan() && m[1] == 0. && m[1].is_sign_positive() && m[2].is_sign_negative());
    assert!(scatter(ReduceOp::Min, &[1., 0., 0.], &[f32::NAN, 2., 0., 0.])[0].is_nan());
    // Integers wrap like PyTorch's.
    let i8s = |v: Vec<i8>| Buffer::from_vec(v.clone(), vec![v.len()]);
    let s = ok(
        Op::Scatter { dim: 0, reduce: Some(ReduceOp::Prod) },
        &[&i8s(vec![16]), &i64s(&[0, 0], &[2]), &i8s(vec![4, 3])],
    );
    assert_eq!(s.to_vec::<i8>(), vec![-64]);
}
