//! Tier 0 against the reference interpreter, on random inputs (never zeros): every op family
//! and dtype it runs, views and broadcasts, reductions over different dims, products, errors.

use super::Plan;
use crate::{interpret, Buffer, HostData};
use coil_ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, Scalar, UnaryOp};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Random nonzero values of `dtype`: floats in +-[0.1, 2), integers in +-[1, 6] (bool: mixed).
fn random(shape: &[usize], dtype: DType, seed: u64) -> Buffer {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as f64 / (1u64 << 31) as f64
    };
    let xs: Vec<f64> = (0..n)
        .map(|_| {
            let (mag, sign) = (next(), if next() < 0.5 { -1.0 } else { 1.0 });
            if dtype.is_float() {
                sign * (0.1 + 1.9 * mag)
            } else if dtype == DType::Bool {
                (mag < 0.5) as i64 as f64
            } else {
                sign * (1.0 + (mag * 6.0).floor())
            }
        })
        .collect();
    let data = match dtype {
        DType::U8 => HostData::from_f64_slice(dtype, &xs.iter().map(|x| x.abs()).collect::<Vec<_>>()),
        _ => HostData::from_f64_slice(dtype, &xs),
    };
    Buffer::new(shape.to_vec(), data).unwrap()
}

/// The tolerance of a float dtype's results (the prelude's f32 math is within 2.4 ulp).
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 2e-6,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 0.0,
    }
}

/// Runs `g` on tier 0 and on the interpreter and compares every output.
fn check(g: &Graph, inputs: &[&Buffer]) {
    let plan = Plan::new(g.clone()).unwrap_or_else(|why| panic!("tier 0 does not run {}: {why}", g.print(false)));
    let got = plan.run(inputs).unwrap();
    let want = interpret(g, inputs).unwrap();
    for (k, (got, want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(got.meta(), want.meta(), "output {k} of {}", g.print(false));
        let tol = tolerance(want.dtype());
        let (a, b) = (got.to_vec::<f64>(), want.to_vec::<f64>());
        for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
            let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= tol * (1.0 + y.abs());
            assert!(ok, "output {k} element {i}: tier 0 {x}, interpreter {y}\n{}", g.print(false));
        }
    }
}

fn push(g: &mut Graph, op: Op, inputs: &[NodeId]) -> NodeId {
    g.push(op, inputs, None).unwrap()
}

#[test]
fn every_float_unary_op_agrees_with_the_interpreter_fused_and_stored() {
    for dtype in FLOATS {
        let x = random(&[3, 37], dtype, 1);
        let y = random(&[3, 37], dtype, 2);
        for op in UnaryOp::ALL {
            if op.integral_only() {
                continue;
            }
            let mut g = Graph::new();
            let (a, b) = (g.input(x.meta()), g.input(y.meta()));
            // fused: the unary feeds a multiply; stored: it is also an output
            let u = push(&mut g, Op::Unary(op), &[a]);
            let out = if op.returns_bool() {
                push(&mut g, Op::Where, &[u, a, b])
            } else {
                push(&mut g, Op::Binary(BinaryOp::Mul), &[u, b])
            };
            g.outputs.push(out);
            check(&g, &[&x, &y]);
            g.outputs.push(u);
            check(&g, &[&x, &y]);
        }
    }
}

#[test]
fn every_binary_op_agrees_with_the_interpreter() {
    let ints = [DType::I32, DType::I64, DType::I8, DType::U8];
    for dtype in FLOATS.into_iter().chain(ints) {
        let x = random(&[5, 9], dtype, 3);
        let y = random(&[5, 9], dtype, 4);
        for op in BinaryOp::ALL {
            let float_only = matches!(op, BinaryOp::Div | BinaryOp::Atan2);
            let int_only = matches!(
                op,
                BinaryOp::BitwiseAnd
                    | BinaryOp::BitwiseOr
                    | BinaryOp::BitwiseXor
                    | BinaryOp::ShiftLeft
                    | BinaryOp::ShiftRight
            );
            if (float_only && !dtype.is_float())
                || (int_only && dtype.is_float())
                || (op == BinaryOp::Pow && !dtype.is_float())
            {
                continue;
            }
            let mut g = Graph::new();
            let (a, b) = (g.input(x.meta()), g.input(y.meta()));
            let z = push(&mut g, Op::Binary(op), &[a, b]);
            g.outputs.push(z);
            check(&g, &[&x, &y]);
        }
    }
}

#[test]
fn casts_between_every_dtype_agree() {
    let all =
        [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I8, DType::U8, DType::Bool];
    for from in all {
        // values past the narrow integers' range (and fractions): wrapping and truncation
        let wide: Vec<f64> = random(&[4, 6], DType::F64, 5).to_vec::<f64>().iter().map(|v| v * 150.3).collect();
        let x = Buffer::new(vec![4, 6], HostData::from_f64_slice(from, &wide)).unwrap();
        for to in all {
            let mut g = Graph::new();
            let a = g.input(x.meta());
            let c = push(&mut g, Op::Cast(to), &[a]);
            // and back through a fused op of the target's type
            let d = push(&mut g, Op::Binary(BinaryOp::Maximum), &[c, c]);
            g.outputs.push(d);
            check(&g, &[&x]);
            // the cast fused into a widening one: its value never passes through a store
            let mut g = Graph::new();
            let a = g.input(x.meta());
            let c = push(&mut g, Op::Cast(to), &[a]);
            let wide = push(&mut g, Op::Cast(DType::F64), &[c]);
            g.outputs.push(wide);
            check(&g, &[&x]);
        }
    }
}

#[test]
fn views_broadcasts_constants_and_iota_read_in_place() {
    for dtype in [DType::F32, DType::BF16, DType::F64] {
        let x = random(&[4, 6, 5], dtype, 6);
        let row = random(&[5], dtype, 7);
        let mut g = Graph::new();
        let (a, r) = (g.input(x.meta()), g.input(row.meta()));
        let p = push(&mut g, Op::Permute { perm: vec![2, 0, 1] }, &[a]); // [5, 4, 6]
        let s = push(&mut g, Op::Slice { dim: 2, start: 5, len: 3, step: -2 }, &[p]); // [5, 4, 3]
        let e = push(&mut g, Op::Reshape { shape: vec![5, 1, 1] }, &[r]);
        let e = push(&mut g, Op::Expand { shape: vec![5, 4, 3] }, &[e]);
        let sum = push(&mut g, Op::Binary(BinaryOp::Add), &[s, e]);
        let two = g.full(Scalar::Float(2.5), vec![], dtype, None);
        let two = push(&mut g, Op::Expand { shape: vec![5, 4, 3] }, &[two]);
        let scaled = push(&mut g, Op::Binary(BinaryOp::Mul), &[sum, two]);
        let i = g.leaf(Op::Iota { dim: 1 }, coil_ir::TensorMeta::new(vec![5, 4, 3], DType::I64), None);
        let i = push(&mut g, Op::Cast(dtype), &[i]);
        let shifted = push(&mut g, Op::Binary(BinaryOp::Sub), &[scaled, i]);
        // a transposed value flattened is no view: stored first, then read
        let t = push(&mut g, Op::Permute { perm: vec![1, 0, 2] }, &[shifted]);
        let flat = push(&mut g, Op::Reshape { shape: vec![60] }, &[t]);
        let ex = push(&mut g, Op::Unary(UnaryOp::Exp), &[flat]);
        // rows 1..3: a contiguous view at an offset, read in place
        let rows = push(&mut g, Op::Slice { dim: 0, start: 1, len: 2, step: 1 }, &[a]);
        let rows = push(&mut g, Op::Unary(UnaryOp::Tanh), &[rows]);
        g.outputs.extend([ex, t, e, two, rows]); // outputs that are views and constants are copied out
        check(&g, &[&x, &row]);
    }
}

#[test]
fn reductions_over_any_dims_agree() {
    for dtype in [DType::F32, DType::F16, DType::F64, DType::I32, DType::Bool] {
        let x = random(&[3, 4, 5], dtype, 8);
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::ArgMax, ReduceOp::ArgMin] {
            let dims_list: &[&[usize]] = if op.is_arg() { &[&[0], &[2]] } else { &[&[2], &[0], &[0, 2], &[0, 1, 2]] };
            for dims in dims_list {
                if dtype == DType::Bool && op != ReduceOp::Sum {
                    continue;
                }
                for keepdim in [false, true] {
                    let mut g = Graph::new();
                    let a = g.input(x.meta());
                    // a fused producer (stored, as a reduction reads it) and a permuted read
                    let src = if dtype.is_float() { push(&mut g, Op::Unary(UnaryOp::Neg), &[a]) } else { a };
                    let p = push(&mut g, Op::Permute { perm: vec![1, 2, 0] }, &[src]);
                    let r = push(&mut g, Op::Reduce { op, dims: dims.to_vec(), keepdim }, &[p]);
                    g.outputs.push(r);
                    check(&g, &[&x]);
                }
            }
        }
    }
}

#[test]
fn products_of_strided_and_broadcast_operands_agree() {
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64] {
        let a = random(&[2, 7, 5], dtype, 9);
        let b = random(&[3, 5], dtype, 10);
        let mut g = Graph::new();
        let (x, w) = (g.input(a.meta()), g.input(b.meta()));
        let wt = push(&mut g, Op::Permute { perm: vec![1, 0] }, &[w]); // [5, 3], transposed
        let wt = push(&mut g, Op::Reshape { shape: vec![1, 5, 3] }, &[wt]);
        let wt = push(&mut g, Op::Expand { shape: vec![2, 5, 3] }, &[wt]); // batch stride 0
        let flipped = push(&mut g, Op::Slice { dim: 1, start: 6, len: 7, step: -1 }, &[x]); // gathered first
        let y = push(&mut g, Op::Bmm, &[flipped, wt]);
        g.outputs.push(y);
        check(&g, &[&a, &b]);
    }
}

#[test]
fn layer_norm_gelu_and_softmax_shaped_graphs_agree() {
    // the primitive forms: mean and variance over the last dim, erf gelu, softmax along rows
    for dtype in [DType::F32, DType::BF16] {
        let x = random(&[6, 33], dtype, 11);
        let mut g = Graph::new();
        let a = g.input(x.meta());
        let s = push(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: true }, &[a]);
        let n = g.full(Scalar::Float(1.0 / 33.0), vec![6, 1], dtype, None);
        let mean = push(&mut g, Op::Binary(BinaryOp::Mul), &[s, n]);
        let mean = push(&mut g, Op::Expand { shape: vec![6, 33] }, &[mean]);
        let c = push(&mut g, Op::Binary(BinaryOp::Sub), &[a, mean]);
        let sq = push(&mut g, Op::Binary(BinaryOp::Mul), &[c, c]);
        let v = push(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: true }, &[sq]);
        let r = push(&mut g, Op::Unary(UnaryOp::Rsqrt), &[v]);
        let r = push(&mut g, Op::Expand { shape: vec![6, 33] }, &[r]);
        let y = push(&mut g, Op::Binary(BinaryOp::Mul), &[c, r]);
        let h = g.full(Scalar::Float(std::f64::consts::FRAC_1_SQRT_2), vec![6, 33], dtype, None);
        let e = push(&mut g, Op::Binary(BinaryOp::Mul), &[y, h]);
        let e = push(&mut g, Op::Unary(UnaryOp::Erf), &[e]);
        let gelu = push(&mut g, Op::Binary(BinaryOp::Mul), &[y, e]);
        let m = push(&mut g, Op::Reduce { op: ReduceOp::Max, dims: vec![1], keepdim: true }, &[gelu]);
        let m = push(&mut g, Op::Expand { shape: vec![6, 33] }, &[m]);
        let z = push(&mut g, Op::Binary(BinaryOp::Sub), &[gelu, m]);
        let z = push(&mut g, Op::Unary(UnaryOp::Exp), &[z]);
        let t = push(&mut g, Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: true }, &[z]);
        let t = push(&mut g, Op::Expand { shape: vec![6, 33] }, &[t]);
        let soft = push(&mut g, Op::Binary(BinaryOp::Div), &[z, t]);
        g.outputs.push(soft);
        check(&g, &[&x]);
    }
}

#[test]
fn a_data_error_names_the_op_and_the_line() {
    let x = random(&[4], DType::I64, 12);
    let zero = Buffer::from_vec(vec![3i64, 0, 2, 1], vec![4]);
    let mut g = Graph::new();
    let (a, b) = (g.input(x.meta()), g.input(zero.meta()));
    let line = std::panic::Location::caller();
    let q = g.push(Op::Binary(BinaryOp::FloorDiv), &[a, b], Some(line)).unwrap();
    let y = push(&mut g, Op::Binary(BinaryOp::Add), &[q, a]); // the failing node is fused
    g.outputs.push(y);
    let e = Plan::new(g).unwrap().run(&[&x, &zero]).unwrap_err();
    assert_eq!(e.op.as_deref(), Some("floor_divide"), "{e}");
    assert_eq!(e.location, Some(line));
    assert!(e.message.contains("division by zero"), "{e}");
}

#[test]
fn ops_without_a_tier_0_kernel_are_refused_with_a_reason() {
    let mut g = Graph::new();
    let a = g.input(coil_ir::TensorMeta::new(vec![4], DType::F32));
    let c = push(&mut g, Op::Cumsum { dim: 0 }, &[a]);
    g.outputs.push(c);
    let why = Plan::new(g).unwrap_err();
    assert!(why.contains("cumsum"), "{why}");
}

#[test]
fn reductions_of_a_fused_operand_agree_across_chunk_boundaries() {
    // rows of 300 and 60 elements: chunks of 512 end mid-row
    for (shape, dims) in [(vec![7, 300], vec![1]), (vec![9, 4, 15], vec![1, 2])] {
        for dtype in [DType::F32, DType::F64] {
            let mut x = random(&shape, dtype, 14);
            if let HostData::F32(v) = &mut x.data {
                v[301] = f32::NAN; // row 1 (or 5) has a NaN: max and min propagate it
            }
            if let HostData::F64(v) = &mut x.data {
                v[301] = f64::NAN;
            }
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
                let mut g = Graph::new();
                let a = g.input(x.meta());
                let e = push(&mut g, Op::Unary(UnaryOp::Exp), &[a]);
                let m = push(&mut g, Op::Binary(BinaryOp::Mul), &[e, a]); // fused into the reduction
                let r = push(&mut g, Op::Reduce { op, dims: dims.clone(), keepdim: false }, &[m]);
                g.outputs.push(r);
                let plan = Plan::new(g.clone()).unwrap();
                assert!(plan.regions[r.0].is_some(), "the operand is computed as it is reduced");
                check(&g, &[&x]);
            }
        }
    }
}

#[test]
fn large_values_are_computed_in_parts_on_the_pool_alike() {
    // 40000 elements: parts on the CPU pool's threads (where it has more than one)
    for dtype in [DType::F32, DType::BF16, DType::I32] {
        let x = random(&[40, 1000], dtype, 15);
        let y = random(&[1000], dtype, 16);
        let mut g = Graph::new();
        let (a, b) = (g.input(x.meta()), g.input(y.meta()));
        let e = push(&mut g, Op::Expand { shape: vec![40, 1000] }, &[b]);
        let m = push(&mut g, Op::Binary(BinaryOp::Mul), &[a, e]);
        let s = push(&mut g, Op::Binary(BinaryOp::Sub), &[m, a]);
        g.outputs.push(s);
        check(&g, &[&x, &y]);
    }
    // reductions by rows in parts: of a stored value, and of a fused operand
    for dtype in [DType::F32, DType::F64] {
        let x = random(&[40, 1000], dtype, 19);
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let mut g = Graph::new();
            let a = g.input(x.meta());
            let r = push(&mut g, Op::Reduce { op, dims: vec![1], keepdim: true }, &[a]);
            let t = push(&mut g, Op::Unary(UnaryOp::Tanh), &[a]);
            let f = push(&mut g, Op::Reduce { op, dims: vec![1], keepdim: false }, &[t]);
            g.outputs.extend([r, f]);
            check(&g, &[&x]);
        }
    }
    // a data error in a late part is still the op's
    let x = random(&[40, 1000], DType::I64, 17);
    let mut d: Vec<i64> = random(&[40, 1000], DType::I64, 18).to_vec();
    d[39_999] = 0;
    let d = Buffer::from_vec(d, vec![40, 1000]);
    let mut g = Graph::new();
    let (a, b) = (g.input(x.meta()), g.input(d.meta()));
    let q = push(&mut g, Op::Binary(BinaryOp::Remainder), &[a, b]);
    g.outputs.push(q);
    let e = Plan::new(g).unwrap().run(&[&x, &d]).unwrap_err();
    assert_eq!(e.op.as_deref(), Some("remainder"), "{e}");
}
