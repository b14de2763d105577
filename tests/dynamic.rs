//! Dynamic shapes in compiled functions: automatic dynamic after a size change, `mark_dynamic`,
//! sizes 0 and 1 specialized, guards on symbolic sizes, and values equal to the interpreter's at
//! every size.

mod common;

use coil::{DType, Result, Tensor};
use common::{close, randn, reference, Block};

fn check(
    f: &coil::CompiledFn<impl Fn(&[Tensor]) -> Result<Vec<Tensor>>>,
    body: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    args: &[Tensor],
    tol: f64,
) {
    let refs: Vec<&Tensor> = args.iter().collect();
    let out = f.call(&refs).unwrap();
    let expected = reference(body, args);
    for (o, e) in out.iter().zip(&expected) {
        let got = o.to_vec::<f64>().unwrap();
        let bad: Vec<usize> =
            (0..got.len().min(e.len())).filter(|&i| !close(&got[i..i + 1], &e[i..i + 1], tol)).collect();
        assert!(
            close(&got, e, tol),
            "shape {:?}: {} of {} differ, first at {:?}: {:?} vs {:?}",
            args[0].shape(),
            bad.len(),
            got.len(),
            bad.first(),
            bad.first().map(|&i| got[i]),
            bad.first().map(|&i| e[i])
        );
    }
}

/// Sequence lengths 1, 2, 17, 64 and 1000: size 1 compiles static (specialized), the change to
/// 2 recompiles once with the length symbolic, and that graph serves every later length.
#[test]
fn sequence_lengths_compile_twice_and_match_the_interpreter() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let w = randn(&[16], DType::F32);
    let body = move |a: &[Tensor]| {
        let h = (&a[0] * &w).layer_norm(&[16], None, None, 1e-5)?;
        Ok(vec![h.gelu(true)?.softmax(0)?, h.mean(&[0], false)?])
    };
    let f = coil::compile(body.clone()).named("f");
    for n in [1usize, 2, 17, 64, 1000] {
        let x = randn(&[n, 16], DType::F32);
        for _ in 0..2 {
            check(&f, &body, std::slice::from_ref(&x), 1e-5);
        }
    }
    assert_eq!(f.compile_count(), 2);
    assert_eq!(
        f.recompile_reasons(),
        ["recompiling f (2nd time): input 0 size[0] 1 -> 2; now dynamic: s0 = graph input 0 size[0]"]
    );
    let guards: Vec<String> = f.guards()[1].iter().map(|g| g.to_string()).collect();
    assert_eq!(guards[0], "TENSOR_MATCH graph input 0 (args[0]): f32[s0, 16] on cpu");
    assert!(guards.contains(&"SYMBOLIC_SIZE s0 = size[0] of graph input 0, s0 >= 2".to_string()), "{guards:?}");
    // Size 1 is still served by its static graph, without a recompile.
    check(&f, &body, &[randn(&[1, 16], DType::F32)], 1e-5);
    assert_eq!(f.compile_count(), 2);
}

/// A dim marked dynamic is symbolic from the first compile; sizes 0 and 1 still specialize.
#[test]
fn mark_dynamic_compiles_once_for_every_size() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let body = |a: &[Tensor]| Ok(vec![a[0].softmax(-1)?.sum(&[1], false)? + a[0].amax(&[1], true)?.exp()?]);
    let f = coil::compile(body).named("g");
    for n in [5usize, 9, 33, 2] {
        let x = randn(&[3, n], DType::F32);
        x.mark_dynamic(1).unwrap();
        check(&f, body, &[x], 1e-5);
    }
    assert_eq!((f.compile_count(), f.recompile_count()), (1, 0));
    let x = randn(&[3, 1], DType::F32);
    x.mark_dynamic(1).unwrap();
    check(&f, body, &[x], 1e-5);
    assert_eq!(f.compile_count(), 2, "size 1 is specialized");
}

/// bf16 cross entropy with a mean over a dynamic number of rows: the count the mean divides by
/// is computed from the size at run time.
#[test]
fn cross_entropy_over_a_dynamic_batch() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let body = |a: &[Tensor]| Ok(vec![a[0].cross_entropy(&a[1], Default::default())?]);
    let f = coil::compile(body);
    for n in [4usize, 7, 50] {
        let logits = randn(&[n, 40], DType::BF16);
        let target = Tensor::from_vec((0..n as i64).map(|i| (i * 7) % 40).collect::<Vec<i64>>(), &[n]).unwrap();
        check(&f, body, &[logits, target], 2e-2);
    }
    assert_eq!(f.compile_count(), 2);
}

/// A size the symbols cannot express (half the length) keeps the graph static: every new size
/// recompiles, and the values stay right.
#[test]
fn sizes_that_do_not_follow_from_the_symbols_stay_static() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let body = |a: &[Tensor]| {
        let n = a[0].shape()[0];
        Ok(vec![a[0].reshape(&[(n / 2) as i64, 32])?.exp()?.sum(&[1], false)?])
    };
    let f = coil::compile(body);
    for n in [4usize, 6, 10] {
        check(&f, body, &[randn(&[n, 16], DType::F32)], 1e-5);
    }
    assert_eq!(f.compile_count(), 3);
}

/// A GPT-2 block over sequence lengths 8, 12, 20 and 5: one static compile, one dynamic (its
/// causal mask and head reshapes follow the length), then hits; the guard check of a hit is
/// measured (printed, not asserted: timings are noisy).
#[test]
fn gpt2_block_with_a_dynamic_sequence_length() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    coil::manual_seed(5);
    let block = std::sync::Arc::new(Block::new(32, 2));
    let b2 = block.clone();
    let body = move |a: &[Tensor]| Ok(vec![b2.forward(&a[0])?]);
    let f = coil::compile(body.clone());
    for t in [8usize, 12, 20, 5] {
        // Outputs reach ~100 while some entries cancel to ~0.1: a tolerance of 1e-5 of the scale.
        check(&f, &body, &[randn(&[2, t, 32], DType::F32)], 1e-3);
    }
    assert_eq!(f.compile_count(), 2, "{:?}", f.recompile_reasons());
    let x = randn(&[2, 16, 32], DType::F32);
    f.call(&[&x]).unwrap();
    let warm = f.stats();
    let reps = 100;
    for _ in 0..reps {
        f.call(&[&x]).unwrap();
    }
    let s = f.stats();
    assert_eq!(s.graph_hits - warm.graph_hits, reps);
    let check_us = (s.hit_check - warm.hit_check).as_secs_f64() * 1e6 / reps as f64;
    println!("dynamic GPT-2 block: guard check + cache lookup {check_us:.1} us per call");
}

/// A training step's gradients over a dynamic batch: one compile serves every batch size, even
/// when the first batch size equals the hidden width (the gradient graph's constants are made
/// at the graph's sizes, not pinned to the numbers of the first call).
#[test]
fn gradients_over_a_dynamic_batch_compile_once() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let w1 = randn(&[64, 16], DType::F32);
    let w2 = randn(&[5, 64], DType::F32);
    let body = move |a: &[Tensor]| {
        let h = coil::linear(&a[0], &w1, None)?.gelu(false)?;
        let loss = coil::linear(&h, &w2, None)?.cross_entropy(&a[1], Default::default())?;
        coil::grad(&loss, &[&w1, &w2])
    };
    let f = coil::compile(body.clone());
    for n in [64usize, 17, 100] {
        let x = randn(&[n, 16], DType::F32);
        let t = Tensor::from_vec((0..n as i64).map(|i| (i * 3) % 5).collect::<Vec<i64>>(), &[n]).unwrap();
        x.mark_dynamic(0).unwrap();
        t.mark_dynamic(0).unwrap();
        check(&f, &body, &[x, t], 1e-4);
    }
    assert_eq!((f.compile_count(), f.recompile_count()), (1, 0), "{:?}", f.recompile_reasons());
}
