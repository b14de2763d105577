//! Replay of compiled functions ([`crate::dynamo::CompiledFn::replay`]) against traced calls.

use crate::dynamo::compile;
use crate::{update_in_place_with, Tensor};
use coil_ir::{DType, Result};
use std::cell::{Cell, RefCell};

/// Deterministic values in [-1, 1) from `seed`.
fn random(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut z = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    Tensor::from_vec(v, shape).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

/// A small layer over a captured weight and bias: what a replay must reproduce.
fn layer(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Vec<Tensor>> {
    let h = (x.matmul(w)? + b).relu()?;
    Ok(vec![h.softmax(-1)?, h.sum(&[1], false)?])
}

#[test]
fn replayed_calls_equal_traced_ones_and_skip_the_body() {
    let (w, b) = (random(&[8, 5], 1), random(&[5], 2));
    let bodies = Cell::new(0);
    let f = compile(|a: &[Tensor]| {
        bodies.set(bodies.get() + 1);
        layer(&a[0], &w, &b)
    })
    .replay(true)
    .replay_check(0);
    for call in 0..6u64 {
        let x = random(&[3, 8], 10 + call);
        let got = f.call(&[&x]).unwrap();
        let want = layer(&x, &w, &b).unwrap();
        for (g, e) in got.iter().zip(&want) {
            assert_eq!(g.shape(), e.shape());
            close(&values(g), &values(e));
        }
    }
    assert_eq!(bodies.get(), 2, "two traced calls arm the replay, the other four replay");
    assert_eq!(f.stats().replays, 4);
    assert_eq!(f.stats().calls, 6);
    assert_eq!(f.replay_blocker(), None);
}

#[test]
fn a_changed_argument_shape_traces_and_rearms() {
    let w = random(&[4, 4], 3);
    let bodies = Cell::new(0);
    let f = compile(|a: &[Tensor]| {
        bodies.set(bodies.get() + 1);
        Ok(vec![a[0].matmul(&w)?.tanh()?])
    })
    .replay(true)
    .replay_check(0);
    let run = |rows: usize, seed: u64| {
        let x = random(&[rows, 4], seed);
        let got = values(&f.call(&[&x]).unwrap()[0]);
        close(&got, &values(&x.matmul(&w).unwrap().tanh().unwrap()));
    };
    (0..3).for_each(|i| run(2, i));
    assert_eq!(bodies.get(), 2);
    run(3, 7); // another size: the guard fails, the body runs
    assert_eq!(bodies.get(), 3);
    run(3, 8); // agrees with the call before: armed again
    run(3, 9);
    assert_eq!(bodies.get(), 4);
    run(2, 10); // back to the first size: traced again
    assert_eq!(bodies.get(), 5);
    // Another dtype traces too.
    let x = random(&[3, 4], 11).to_dtype(DType::F64).unwrap();
    assert!(f.call(&[&x]).is_err(), "f64 @ f32 is an error of the body, not a replay");
    assert_eq!(bodies.get(), 6);
}

/// A key/value-cache-like buffer written in place at a position given as an argument.
#[test]
fn in_place_writes_happen_on_replay_and_later_traced_calls_see_them() {
    let cache = RefCell::new(Tensor::zeros(&[6, 2], DType::F32));
    cache.borrow_mut().realize().unwrap();
    let addr = cache.borrow().0.storage.get().unwrap().addr();
    let bodies = Cell::new(0);
    let f = compile(|a: &[Tensor]| {
        bodies.set(bodies.get() + 1);
        let (row, pos) = (&a[0], &a[1]);
        let mut cache = cache.borrow_mut();
        let written = cache.index_copy(0, &pos.reshape(&[1])?, &row.to_dtype(DType::F32)?)?;
        let total = written.sum(&[0], false)?;
        *cache = update_in_place_with(&[(&*cache, &written)], &[])?.remove(0);
        Ok(vec![total, pos + 1i64])
    })
    .replay(true)
    .replay_check(0);
    let mut pos = Tensor::from_vec(vec![0i64], &[]).unwrap();
    let mut want = vec![0.0f32; 12];
    for step in 0..5 {
        let row = random(&[1, 2], 20 + step as u64);
        let out = f.call(&[&row, &pos]).unwrap();
        want[2 * step..2 * step + 2].copy_from_slice(&values(&row));
        let sums = [0, 1].map(|c| want.iter().skip(c).step_by(2).sum::<f32>());
        close(&values(&out[0]), &sums);
        pos = out[1].clone();
    }
    assert_eq!((bodies.get(), f.stats().replays), (2, 3));
    assert_eq!(cache.borrow().0.storage.get().unwrap().addr(), addr, "written in place");
    // The tensor the last traced call left in the cache is current and holds the replays' writes.
    close(&values(&cache.borrow()), &want);
    // A traced call (another row dtype: the guard fails) reads them and writes after them.
    let row = random(&[1, 2], 30).to_dtype(DType::F64).unwrap();
    let out = f.call(&[&row, &pos]).unwrap();
    assert_eq!(bodies.get(), 3);
    want[10..12].copy_from_slice(&values(&row.to_dtype(DType::F32).unwrap()));
    close(&values(&out[0]), &[0, 1].map(|c| want.iter().skip(c).step_by(2).sum::<f32>()));
    close(&values(&cache.borrow()), &want);
    assert_eq!(cache.borrow().0.storage.get().unwrap().addr(), addr);
}

#[test]
fn a_captured_parameter_updated_in_place_is_seen_by_the_replay() {
    let w = RefCell::new(random(&[4], 4));
    let bodies = Cell::new(0);
    let f = compile(|a: &[Tensor]| {
        bodies.set(bodies.get() + 1);
        Ok(vec![&a[0] * &*w.borrow()])
    })
    .replay(true)
    .replay_check(0);
    let x = random(&[4], 5);
    for _ in 0..3 {
        f.call(&[&x]).unwrap();
    }
    assert_eq!(bodies.get(), 2);
    // An optimizer-like step between calls: written over the same buffer.
    w.borrow_mut().add_(1.0).unwrap();
    let got = values(&f.call(&[&x]).unwrap()[0]);
    close(&got, &values(&(&x * &*w.borrow())));
    assert_eq!(bodies.get(), 2, "replayed, reading the new values");
    // An update that cannot write in place (its value does not read the old one) moves the
    // tensor to another buffer: the replay does not take the old one, the body runs.
    let new = update_in_place_with(&[(&*w.borrow(), &Tensor::full(&[4], 2.0, DType::F32))], &[]).unwrap();
    *w.borrow_mut() = new.into_iter().next().unwrap();
    close(&values(&f.call(&[&x]).unwrap()[0]), &values(&(&x * 2.0)));
    assert_eq!(bodies.get(), 3);
}

#[test]
fn graph_breaks_and_host_data_keep_the_replay_off() {
    let bodies = Cell::new(0);
    let f = compile(|a: &[Tensor]| {
        bodies.set(bodies.get() + 1);
        let s = a[0].sum(&[0], false)?.item::<f32>()?;
        Ok(vec![&a[0] * s as f64])
    })
    .replay(true);
    let x = random(&[3], 6);
    for _ in 0..4 {
        f.call(&[&x]).unwrap();
    }
    assert_eq!((bodies.get(), f.stats().replays), (4, 0));
    assert!(f.replay_blocker().unwrap().contains("graph break"), "{:?}", f.replay_blocker());

    // A tensor made from host data at each call is another allocation each time.
    let g = compile(|a: &[Tensor]| Ok(vec![&a[0] + &Tensor::from_vec(vec![1.0f32; 3], &[3])?])).replay(true);
    for _ in 0..4 {
        g.call(&[&x]).unwrap();
    }
    assert_eq!(g.stats().replays, 0);
    assert!(g.replay_blocker().unwrap().contains("captured tensor"), "{:?}", g.replay_blocker());
}

#[test]
fn the_replay_check_catches_a_body_that_depends_on_rust_state() {
    let scale = Cell::new(1.0f64);
    let f = compile(|a: &[Tensor]| Ok(vec![&a[0] * scale.get()])).replay(true).replay_check(2);
    let x = random(&[3], 7);
    for _ in 0..4 {
        f.call(&[&x]).unwrap(); // 2 traced, 2 replayed
    }
    scale.set(3.0); // Rust state the replays cannot see
    let e = f.call(&[&x]).unwrap_err(); // the check traces this call
    assert!(e.to_string().contains("replay check") && e.to_string().contains("another graph"), "{e}");
    close(&values(&f.call(&[&x]).unwrap()[0]), &values(&(&x * 3.0)));
}

#[test]
fn random_ops_replay_the_draws_of_traced_calls() {
    let draws = |replay: bool| {
        crate::manual_seed(9);
        let f = compile(|a: &[Tensor]| Ok(vec![&a[0] + &a[0].rand_like()?])).replay(replay).replay_check(0);
        let x = random(&[5], 8);
        let out: Vec<Vec<f32>> = (0..5).map(|_| values(&f.call(&[&x]).unwrap()[0])).collect();
        (out, f.stats().replays)
    };
    let ((traced, none), (replayed, some)) = (draws(false), draws(true));
    assert_eq!((none, some), (0, 3));
    assert_eq!(traced, replayed);
    assert_ne!(traced[3], traced[4], "new numbers at each call");
}

#[test]
fn in_place_updates_inside_a_compiled_function_write_the_buffer() {
    let w = RefCell::new(random(&[3], 9));
    let old = w.borrow().clone();
    let addr = old.0.storage.get().unwrap().addr();
    let f = compile(|a: &[Tensor]| {
        let mut w = w.borrow_mut();
        let new = &*w + &a[0];
        *w = update_in_place_with(&[(&*w, &new)], &[])?.remove(0);
        Ok(vec![(&*w * 2.0)])
    });
    let x = random(&[3], 10);
    let want = values(&(&old + &x));
    let out = f.call(&[&x]).unwrap();
    close(&values(&w.borrow()), &want);
    close(&values(&out[0]), &want.iter().map(|v| v * 2.0).collect::<Vec<_>>());
    assert_eq!(w.borrow().0.storage.get().unwrap().addr(), addr, "written over its buffer");
    close(&values(&old), &want); // the old handle stands for the updated tensor
}

#[test]
fn the_replay_check_of_a_pure_body_traces_every_nth_call_and_passes() {
    let bodies = Cell::new(0);
    let f = compile(|a: &[Tensor]| {
        bodies.set(bodies.get() + 1);
        Ok(vec![a[0].exp()?])
    })
    .replay(true)
    .replay_check(3);
    let x = random(&[4], 12);
    for _ in 0..10 {
        close(&values(&f.call(&[&x]).unwrap()[0]), &values(&x.exp().unwrap()));
    }
    // Traced: calls 1 and 2 (arming), 6 and 10 (checks after 3 replays each).
    assert_eq!((bodies.get(), f.stats().replays), (4, 6));
}

#[test]
fn a_graph_compiled_for_symbolic_sizes_replays_at_the_sizes_that_armed_it() {
    let bodies = Cell::new(0);
    let f = compile(|a: &[Tensor]| {
        bodies.set(bodies.get() + 1);
        Ok(vec![a[0].softmax(-1)?])
    })
    .replay(true)
    .replay_check(0);
    for (call, rows) in [2usize, 3, 3, 3, 3, 5].into_iter().enumerate() {
        let x = random(&[rows, 6], 40 + call as u64);
        close(&values(&f.call(&[&x]).unwrap()[0]), &values(&x.softmax(-1).unwrap()));
    }
    assert!(f.guards().iter().any(|g| g.iter().any(|g| matches!(g, crate::dynamo::Guard::SizeSymbol { .. }))));
    // 2 and 3 traced (the second compiles for symbolic rows), 3 again arms, two replays, 5 traces.
    assert_eq!((bodies.get(), f.stats().replays), (4, 2));
}

#[test]
fn the_replay_check_catches_a_captured_variable_rebound_to_another_tensor() {
    let w = RefCell::new(random(&[3], 13));
    let f = compile(|a: &[Tensor]| Ok(vec![&a[0] * &*w.borrow()])).replay(true).replay_check(2);
    let x = random(&[3], 14);
    for _ in 0..4 {
        f.call(&[&x]).unwrap();
    }
    // Rebinding (not writing in place) is Rust state the replays do not see: the check does.
    *w.borrow_mut() = random(&[3], 15);
    let e = f.call(&[&x]).unwrap_err();
    assert!(e.to_string().contains("replay check") && e.to_string().contains("captured tensor"), "{e}");
    close(&values(&f.call(&[&x]).unwrap()[0]), &values(&(&x * &*w.borrow())));
}

#[test]
fn replays_keep_a_captured_parameters_binding_until_it_is_updated_and_let_arguments_go() {
    let w = RefCell::new(random(&[4], 6));
    let bodies = Cell::new(0);
    let f = compile(|a: &[Tensor]| {
        bodies.set(bodies.get() + 1);
        Ok(vec![&a[0] * &*w.borrow()])
    })
    .replay(true)
    .replay_check(0);
    let x = random(&[4], 7);
    for step in 0..8 {
        if step == 4 || step == 6 {
            // Between replays that bound `w` at its version then: the next one binds the new one.
            w.borrow_mut().add_(1.0).unwrap();
        }
        close(&values(&f.call(&[&x]).unwrap()[0]), &values(&(&x * &*w.borrow())));
    }
    assert_eq!((bodies.get(), f.stats().replays), (2, 6));
    // The replay's binding does not hold its arguments: their elements go with the last handle.
    let y = random(&[4], 8);
    let elements = std::sync::Arc::downgrade(&y.0.storage.get().unwrap().to_host().unwrap());
    close(&values(&f.call(&[&y]).unwrap()[0]), &values(&(&y * &*w.borrow())));
    assert_eq!(f.stats().replays, 7);
    drop(y);
    assert!(elements.upgrade().is_none(), "the argument's elements outlived the call");
}

#[test]
fn steady_replays_see_a_captured_parameter_written_on_another_thread() {
    let w = random(&[4], 6);
    let f = compile(|a: &[Tensor]| Ok(vec![&a[0] * &w])).replay(true).replay_check(0);
    let x = random(&[4], 7);
    // Two traced calls arm the replay; the replays after the first bind the weight unchecked.
    for _ in 0..5 {
        close(&values(&f.call(&[&x]).unwrap()[0]), &values(&(&x * &w)));
    }
    let before = values(&w);
    let mut other = w.clone();
    std::thread::spawn(move || other.add_(1.0).map(drop)).join().unwrap().unwrap();
    assert_ne!(values(&w), before, "the write reached the captured tensor");
    close(&values(&f.call(&[&x]).unwrap()[0]), &values(&(&x * &w)));
    assert_eq!(f.stats().replays, 4, "replayed, reading the new values");
}
