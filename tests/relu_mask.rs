//! relu's gradient in a training step whose mask reads the relu's result (`y <= 0`, as
//! PyTorch's `threshold_backward(grad, result)`), not its operand: a residual block's
//! gradients, compiled for the CPU, agree with the reference interpreter, and relu's operand at
//! exactly `0.0`, `-0.0` and NaN gets PyTorch's gradient (none at either zero, all of it at
//! NaN). That the sum before the relu is not stored is `coil-passes`'s test
//! (`autodiff::relu_tests`).

use coil::{Backend, Tensor};

/// Random f32 data in [-1, 1), from a splitmix64 stream.
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut z = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (((x ^ (x >> 31)) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

const ROWS: usize = 8;
const C: usize = 6;

/// The values set at the relu's operand: `(row, col, value)`.
fn specials() -> Vec<(usize, usize, f32)> {
    vec![(0, 1, 0.0), (1, 2, -0.0), (2, 3, f32::NAN), (3, 0, 0.0), (4, 5, -0.0), (5, 4, 0.75), (6, 2, -0.5)]
}

/// `s = where(special, v, bn(x @ w1) + x)`, `y = relu(s)`, `loss = sum((y @ w2 + y) * c)`:
/// the loss and its gradients with respect to `w1, gamma, beta, w2, v, x`, on `backend`.
fn step(backend: Backend) -> Vec<Vec<f32>> {
    coil::set_backend(backend);
    coil::set_eager_tier(false);
    let t = |v: Vec<f32>, shape: &[usize]| Tensor::from_vec(v, shape).unwrap();
    let x = t(data(ROWS * C, 1), &[ROWS, C]);
    let w1 = t(data(C * C, 2), &[C, C]);
    let gamma = t(data(C, 3), &[C]);
    let beta = t(data(C, 4), &[C]);
    let w2 = t(data(C * C, 5), &[C, C]);
    let c = t(data(ROWS * C, 6), &[ROWS, C]);
    let (mut mask, mut values) = (vec![false; ROWS * C], vec![0.0f32; ROWS * C]);
    for (r, k, v) in specials() {
        mask[r * C + k] = true;
        values[r * C + k] = v;
    }
    let special = Tensor::from_vec(mask, &[ROWS, C]).unwrap();
    let v = t(values, &[ROWS, C]);
    let forward = || -> coil::Result<Tensor> {
        let pre = x.matmul(&w1)?.mul(&gamma)?.add(&beta)?.add(&x)?;
        let y = special.where_cond(&v, &pre)?.relu()?;
        y.matmul(&w2)?.add(&y)?.mul(&c)?.sum_all()
    };
    let loss = forward().unwrap();
    let (loss, grads) = coil::value_and_grad(&loss, &[&w1, &gamma, &beta, &w2, &v, &x]).unwrap();
    let mut all = vec![&loss];
    all.extend(grads.iter());
    coil::realize(&all).unwrap();
    all.iter().map(|t| t.to_vec::<f32>().unwrap()).collect()
}

#[test]
fn relu_gradients_at_zero_signed_zero_and_nan_compile_like_the_interpreter_and_pytorch() {
    let (compiled, interpreted) = (step(Backend::Compiled), step(Backend::Interpreter));
    coil::set_backend(Backend::Compiled);
    for (k, (got, want)) in compiled.iter().zip(&interpreted).enumerate() {
        // NaN where the interpreter has NaN (the NaN element reaches the loss and w2's
        // gradient), close elsewhere.
        let nan_agrees = got.iter().zip(want).all(|(a, b)| a.is_nan() == b.is_nan());
        assert!(nan_agrees, "output {k}: NaNs differ\ncompiled {got:?}\ninterpreter {want:?}");
        let finite = |v: &[f32]| v.iter().filter(|x| !x.is_nan()).map(|&x| x as f64).collect::<Vec<_>>();
        let (a, b) = (finite(got), finite(want));
        let diff: f64 = a.iter().zip(&b).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
        let norm: f64 = b.iter().map(|b| b * b).sum::<f64>().sqrt();
        assert!(diff <= 1e-5 * norm.max(1e-30), "output {k}: off by {diff:.2e} (norm {norm:.2e})");
    }
    // The gradient of `v` is relu's: the incoming gradient `dL/dy = c @ w2^T + c` where relu's
    // operand is positive or NaN, 0 at 0.0, -0.0 and below zero (`threshold_backward`).
    let (w2, c) = (data(C * C, 5), data(ROWS * C, 6));
    for grads in [&compiled, &interpreted] {
        let dv = &grads[5];
        for (r, k, v) in specials() {
            let dy: f32 = (0..C).map(|j| c[r * C + j] * w2[k * C + j]).sum::<f32>() + c[r * C + k];
            let want = if v > 0.0 || v.is_nan() { dy } else { 0.0 };
            let got = dv[r * C + k];
            assert!(
                (got - want).abs() <= 1e-5 * dy.abs().max(1.0),
                "relu's operand {v} at ({r}, {k}): {got}, not {want}"
            );
        }
    }
    // Nonzero gradients elsewhere too (the check is not vacuous): w1's and v's at the positive.
    assert!(compiled[1].iter().any(|&g| g != 0.0) && compiled[5][5 * C + 4] != 0.0);
}
