//! Signed zeros as PyTorch computes them, shared by `tests/signed_zeros/main.rs` (the
//! interpreter and the CPU backend) and `tests/gpu.rs` (CUDA).
//!
//! Each case is a small program over `x = [-0.0, 0.0, -1.5, 2.0]`, `y = [0.0, -0.0, 0.0, -0.0]`
//! and `c = [true, false, true, false]`; the expected values are PyTorch's (eager, CPU), printed
//! by `pytorch.py` beside this file, the same for f32, f64, f16 and bf16, and compared **bit for
//! bit** (the sign of a zero included). Every case runs alone, and all of a dtype's cases run
//! as one graph (one fused kernel holding `0.0` and `-0.0` constants side by side: the graph
//! where constants deduplicated by float equality once turned `-0.0` into `0.0`).
//!
//! `maximum` / `minimum`: on a tie of `+0.0` and `-0.0` the first operand wins (coil's rule on
//! every backend, the one relu and clamp need); PyTorch's CPU loop does the same on fewer than
//! 16 elements, as here (see `pytorch.py` for its vectorized chunks).

use coil::{Backend, DType, Device, Result, Tensor};

const INF: f64 = f64::INFINITY;

/// A case: its name, the program and PyTorch's result.
type Case = (&'static str, fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>, &'static [f64]);

/// The cases, in `pytorch.py`'s order.
const CASES: [Case; 17] = [
    // the example: `add(0.0)` then `div(-0.0)` in one graph
    ("add_zero_div_neg_zero", |x, _, _| x.abs()?.add(1.0)?.add(0.0)?.div(-0.0), &[-INF, -INF, -INF, -INF]),
    (
        "mul_by_both_zeros",
        |x, _, _| coil::cat(&[&x.mul(0.0)?, &x.mul(-0.0)?], 0),
        &[-0.0, 0.0, -0.0, 0.0, 0.0, -0.0, 0.0, -0.0],
    ),
    ("relu", |x, _, _| x.relu(), &[-0.0, 0.0, 0.0, 2.0]),
    ("clamp_min_pos_zero", |x, _, _| x.clamp(Some(0.0), None::<f64>), &[-0.0, 0.0, 0.0, 2.0]),
    ("clamp_min_neg_zero", |x, _, _| x.clamp(Some(-0.0), None::<f64>), &[-0.0, 0.0, -0.0, 2.0]),
    ("clamp_max_pos_zero", |x, _, _| x.clamp(None::<f64>, Some(0.0)), &[-0.0, 0.0, -1.5, 0.0]),
    ("clamp_max_neg_zero", |x, _, _| x.clamp(None::<f64>, Some(-0.0)), &[-0.0, 0.0, -1.5, -0.0]),
    ("clamp_both_zeros", |x, _, _| x.clamp(Some(-0.0), Some(0.0)), &[-0.0, 0.0, -0.0, 0.0]),
    ("maximum_xy", |x, y, _| x.maximum(y), &[-0.0, 0.0, 0.0, 2.0]),
    ("maximum_yx", |x, y, _| y.maximum(x), &[0.0, -0.0, 0.0, 2.0]),
    ("minimum_xy", |x, y, _| x.minimum(y), &[-0.0, 0.0, -1.5, -0.0]),
    ("minimum_yx", |x, y, _| y.minimum(x), &[0.0, -0.0, -1.5, -0.0]),
    ("maximum_scalar_zero", |x, _, _| x.maximum(0.0), &[-0.0, 0.0, 0.0, 2.0]),
    ("minimum_scalar_neg_zero", |x, _, _| x.minimum(-0.0), &[-0.0, 0.0, -1.5, -0.0]),
    ("where_zeros", |x, _, c| coil::where_(c, -0.0, 0.0)?.to_dtype(x.dtype()), &[-0.0, 0.0, -0.0, 0.0]),
    ("where_x_or_neg_zero", |x, _, _| coil::where_(&x.gt(0.0)?, x, -0.0), &[-0.0, -0.0, -0.0, 2.0]),
    ("where_y_or_x", |x, y, c| coil::where_(c, y, x), &[0.0, 0.0, 0.0, 2.0]),
];

/// The dtypes every case runs in.
const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// `x`, `y` and `c` of `dtype` on `device`, realized (data, not part of the programs' graphs).
fn inputs(dtype: DType, device: Device) -> [Tensor; 3] {
    let data = |v: &[f64]| {
        let t = Tensor::from_slice(v, &[v.len()]).unwrap().to_dtype(dtype).unwrap().to_device(device).unwrap();
        t.realize().unwrap();
        t
    };
    let c = Tensor::from_slice(&[true, false, true, false], &[4]).unwrap().to_device(device).unwrap();
    [data(&[-0.0, 0.0, -1.5, 2.0]), data(&[0.0, -0.0, 0.0, -0.0]), c]
}

/// Whether `got` is `want` bit for bit (as f64; every value here is exact in every dtype).
fn same_bits(got: &[f64], want: &[f64]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(g, w)| g.to_bits() == w.to_bits())
}

/// Runs every case on `backend` and `device`, alone and all of a dtype's at once; returns one
/// line per disagreement with PyTorch.
pub fn failures(backend: Backend, device: Device) -> Vec<String> {
    coil::set_backend(backend);
    coil::set_eager_tier(false);
    coil::set_default_device(device);
    let mut failures = Vec::new();
    for dtype in DTYPES {
        let [x, y, c] = inputs(dtype, device);
        let mut together = Vec::new();
        for (name, program, want) in CASES {
            let alone = program(&x, &y, &c).and_then(|t| t.to_vec::<f64>());
            match alone {
                Ok(got) if same_bits(&got, want) => {}
                got => failures.push(format!("{name} ({dtype}, alone): {got:?}, PyTorch gives {want:?}")),
            }
            together.push(program(&x, &y, &c).unwrap());
        }
        coil::realize(&together.iter().collect::<Vec<_>>()).unwrap();
        for ((name, _, want), t) in CASES.iter().zip(&together) {
            let got = t.to_vec::<f64>().unwrap();
            if !same_bits(&got, want) {
                failures
                    .push(format!("{name} ({dtype}, in one graph with the others): {got:?}, PyTorch gives {want:?}"));
            }
        }
    }
    failures
}

/// Asserts that `backend` on `device` gives PyTorch's signed zeros in every case.
pub fn check_all(backend: Backend, device: Device) {
    let failures = failures(backend, device);
    assert!(failures.is_empty(), "{} of the signed-zero cases differ:\n{}", failures.len(), failures.join("\n"));
}
