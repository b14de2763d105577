//! An eager loop (each step's result fed to the next outside a compiled function, realized
//! every step) keeps no more of its history than a later `grad` could use
//! (`coil::history`): the live tensor nodes stay bounded where nothing in the history is held,
//! and gradients through realized steps stay right where something is.

use coil::history::live_tensor_nodes;
use coil::{Backend, DType, Tensor};
use std::sync::Mutex;

/// The node count is process-wide: tests here run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn step(x: &Tensor) -> Tensor {
    (x * 0.5 + 1.0).tanh().unwrap()
}

#[test]
fn an_eager_loop_keeps_a_bounded_history() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    let mut x = Tensor::randn(&[256, 256], DType::F32).unwrap();
    let mut counts = Vec::new();
    let start = std::time::Instant::now();
    for i in 0..2000 {
        x = step(&x);
        x.realize().unwrap();
        if i == 99 || i == 1999 {
            counts.push(live_tensor_nodes());
        }
    }
    eprintln!("live tensor nodes after 100 / 2000 steps: {counts:?} ({:.2?})", start.elapsed());
    assert!(counts[1] <= counts[0] + 16, "the history grows with the steps: {counts:?}");
    // The same, keeping the previous step's handle until the next one is computed.
    let mut x = Tensor::randn(&[256, 256], DType::F32).unwrap();
    let mut counts = Vec::new();
    for i in 0..300 {
        let y = step(&x);
        y.realize().unwrap();
        x = y;
        if i == 99 || i == 299 {
            counts.push(live_tensor_nodes());
        }
    }
    assert!(counts[1] <= counts[0] + 16, "the history grows with the steps: {counts:?}");
    let v = x.to_vec::<f32>().unwrap();
    assert!(v.iter().all(|&e| (0.0..1.0).contains(&e)), "tanh(0.5 x + 1) of a fixed point in (0, 1)");
}

#[test]
fn a_held_input_keeps_the_history_its_gradient_needs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    coil::set_backend(Backend::Interpreter);
    let w = Tensor::from_vec(vec![-1.0f64, 0.25, 2.0], &[3]).unwrap();
    let mut x = w.clone();
    let mut values = vec![w.to_vec::<f64>().unwrap()];
    for _ in 0..5 {
        x = step(&x);
        x.realize().unwrap();
        values.push(x.to_vec::<f64>().unwrap());
    }
    // d x5 / d w = prod over steps of 0.5 (1 - x_{k+1}^2).
    let g = coil::grad(&x.sum_all().unwrap(), &[&w]).unwrap()[0].to_vec::<f64>().unwrap();
    for (i, gi) in g.iter().enumerate() {
        let want: f64 = values[1..].iter().map(|v| 0.5 * (1.0 - v[i] * v[i])).product();
        assert!((gi - want).abs() < 1e-12, "element {i}: {gi} vs {want}");
    }
    // A step in the middle, held: the history below it stays, for a gradient with respect to it.
    let mut x = w.clone();
    let mut mid = None;
    for k in 0..6 {
        x = step(&x);
        x.realize().unwrap();
        if k == 2 {
            mid = Some(x.clone());
        }
    }
    let mid = mid.unwrap();
    let g = coil::grad(&x.sum_all().unwrap(), &[&mid, &w]).unwrap();
    assert_eq!(g.len(), 2);
    let gw = g[1].to_vec::<f64>().unwrap();
    for (i, gi) in gw.iter().enumerate() {
        let want: f64 = values[1..].iter().map(|v| 0.5 * (1.0 - v[i] * v[i])).product::<f64>()
            * 0.5
            * (1.0 - {
                let x6 = x.to_vec::<f64>().unwrap()[i];
                x6 * x6
            });
        assert!((gi - want).abs() < 1e-12, "element {i}: {gi} vs {want}");
    }
}

#[test]
fn views_still_see_their_base_after_the_loop_lets_go() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    let mut base = Tensor::from_vec((0..16).map(|i| i as f32).collect(), &[4, 4]).unwrap();
    base = (&base * 1.0).exp().unwrap().log().unwrap(); // a computed base with a history
    base.realize().unwrap();
    let rows = base.narrow(0, 1, 2).unwrap();
    rows.realize().unwrap();
    let mut x = rows.clone();
    for _ in 0..50 {
        x = step(&x);
        x.realize().unwrap();
    }
    base.add_(10.0).unwrap();
    let want: Vec<f32> = (4..12).map(|i| i as f32 + 10.0).collect();
    let got = rows.to_vec::<f32>().unwrap();
    assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-4), "{got:?}");
    let mut col = base.select(1, 0).unwrap();
    col.fill_(-1.0).unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap()[4], -1.0);
}
