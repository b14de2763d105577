//! Random ops (`dropout`, `rand`, `randn`) compile once: their seed and offset are run-time
//! arguments of the graph (random streams), not part of it. A compiled function that draws
//! compiles once and draws new numbers on each call; a realization outside `compile` hits the
//! compiled-graph cache on the next step; `manual_seed` reproduces the numbers on every path;
//! the compiled CPU code draws what the interpreter draws. Also: `*_like` constructors take
//! the tensor's device and dtype.

use coil::{Backend, DType, Device, Result, Tensor};
use std::sync::Mutex;

/// Runs this file's tests one at a time: one of them counts the process's compiles
/// (`coil::compile_count`, shared by every thread), which the others would add to.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const P: f64 = 0.25;

fn dropout_step(args: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(vec![args[0].dropout(P, true)?])
}

/// Uniform numbers in `args[0]`'s shape added to it, and normal numbers of its shape and
/// dtype.
fn noise(args: &[Tensor]) -> Result<Vec<Tensor>> {
    let x = &args[0];
    Ok(vec![x.add(&Tensor::rand(x.shape(), DType::F32)?)?, x.randn_like()?])
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `f` run eagerly on the interpreter, each output as f32.
fn interpreted(f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>, args: &[Tensor]) -> Vec<Vec<f32>> {
    coil::set_backend(Backend::Interpreter);
    let out = f(args).unwrap().iter().map(f32s).collect();
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    out
}

/// Each element of a dropout of ones is 0 or `1 / (1 - p)`; the share of zeros is within 0.05
/// of `p` (over 4096 elements its standard deviation is 0.007).
fn check_mask(mask: &[f32]) {
    let kept = (1.0 / (1.0 - P)) as f32;
    assert!(mask.iter().all(|&v| v == 0.0 || v == kept), "{mask:?}");
    let dropped = mask.iter().filter(|&&v| v == 0.0).count() as f64 / mask.len() as f64;
    assert!((dropped - P).abs() < 0.05, "dropped {dropped} for p = {P}");
}

#[test]
fn compiled_dropout_compiles_once_and_draws_a_new_mask_per_call() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let _serial = serial();
    let x = Tensor::ones(&[64, 64], DType::F32);
    x.realize().unwrap();
    let f = coil::compile(dropout_step);
    coil::manual_seed(3);
    let masks: Vec<Vec<f32>> = (0..10).map(|_| f32s(&f.call(&[&x]).unwrap()[0])).collect();
    assert_eq!((f.compile_count(), f.recompile_count()), (1, 0), "{:?}", f.recompile_reasons());
    assert!(!f.is_eager());
    assert_eq!(f.stats().graph_hits, 9);
    for (i, m) in masks.iter().enumerate() {
        check_mask(m);
        assert!(masks[..i].iter().all(|earlier| earlier != m), "call {i} repeated a mask");
    }
    // The interpreter, from the same seed, draws the same masks, bit for bit.
    coil::manual_seed(3);
    for (i, m) in masks.iter().enumerate() {
        let want = &interpreted(dropout_step, std::slice::from_ref(&x))[0];
        assert_eq!(bits(m), bits(want), "call {i}");
    }
}

#[test]
fn compiled_rand_and_randn_compile_once_and_draw_new_numbers_per_call() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let _serial = serial();
    let x = Tensor::zeros(&[32, 128], DType::F32);
    x.realize().unwrap();
    let f = coil::compile(noise);
    coil::manual_seed(5);
    let calls: Vec<Vec<Vec<f32>>> = (0..10).map(|_| f.call(&[&x]).unwrap().iter().map(f32s).collect()).collect();
    assert_eq!((f.compile_count(), f.recompile_count()), (1, 0), "{:?}", f.recompile_reasons());
    let n = 32.0 * 128.0;
    for (i, call) in calls.iter().enumerate() {
        let (u, z) = (&call[0], &call[1]);
        assert!(u.iter().all(|v| (0.0..1.0).contains(v)));
        let mean = u.iter().map(|&v| v as f64).sum::<f64>() / n;
        assert!((mean - 0.5).abs() < 0.03, "call {i}: uniform mean {mean}");
        let mean = z.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = z.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.1 && (var - 1.0).abs() < 0.1, "call {i}: normal mean {mean}, variance {var}");
        assert!(calls[..i].iter().all(|earlier| earlier[0] != *u && earlier[1] != *z), "call {i} repeated");
    }
    // The interpreter from the same seed: uniform numbers bit for bit; normal ones within one
    // f32 ulp (the C code's `log` and `cos` are the C library's, the interpreter's Rust's, and
    // an f64 result may differ in its last bit before rounding to f32).
    coil::manual_seed(5);
    for (i, call) in calls.iter().enumerate() {
        let want = interpreted(noise, std::slice::from_ref(&x));
        assert_eq!(bits(&call[0]), bits(&want[0]), "call {i}");
        for (g, w) in call[1].iter().zip(&want[1]) {
            assert!((g - w).abs() <= f32::EPSILON * w.abs().max(1.0), "call {i}: {g} vs {w}");
        }
    }
}

#[test]
fn manual_seed_reproduces_the_numbers_compiled_or_not() {
    let _serial = serial();
    let x = Tensor::ones(&[4096], DType::F32);
    x.realize().unwrap();
    let f = coil::compile(noise);
    let draw_compiled = |seed: u64| {
        coil::manual_seed(seed);
        let mut out: Vec<Vec<f32>> = f.call(&[&x]).unwrap().iter().map(f32s).collect();
        out.extend(f.call(&[&x]).unwrap().iter().map(f32s));
        out
    };
    let draw_eager = |seed: u64, backend: Backend| {
        coil::set_backend(backend);
        coil::set_eager_tier(false);
        coil::manual_seed(seed);
        let mut out: Vec<Vec<f32>> = noise(std::slice::from_ref(&x)).unwrap().iter().map(f32s).collect();
        out.extend(noise(std::slice::from_ref(&x)).unwrap().iter().map(f32s));
        coil::set_backend(Backend::Compiled);
        coil::set_eager_tier(false);
        out
    };
    let first = draw_compiled(42); // compiles
    assert_eq!(first, draw_compiled(42)); // already compiled
    assert_eq!(f.compile_count(), 1);
    assert_eq!(first, draw_eager(42, Backend::Compiled)); // realized outside `compile`
    let interpreted = draw_eager(42, Backend::Interpreter);
    assert_eq!(bits(&first[0]), bits(&interpreted[0]));
    assert_eq!(bits(&first[2]), bits(&interpreted[2]));
    assert_ne!(first, draw_compiled(43));
    assert_ne!(first[0], first[2], "the second call draws new numbers");
}

#[test]
fn realize_outside_compile_hits_the_graph_cache_on_the_second_draw() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let _serial = serial();
    let x = Tensor::ones(&[64, 64], DType::F32);
    x.realize().unwrap();
    coil::manual_seed(9);
    // A training loop's step outside `compile`: dropout, then a loss read on the host.
    let step = || {
        let y = x.dropout(P, true).unwrap();
        let loss = y.sum_all().unwrap();
        coil::realize(&[&y, &loss]).unwrap();
        f32s(&y)
    };
    let first = step();
    let before = coil::compile_count();
    let masks: Vec<Vec<f32>> = (0..3).map(|_| step()).collect();
    assert_eq!(coil::compile_count(), before, "a step after the first compiled again");
    assert!(masks.iter().all(|m| *m != first) && masks[0] != masks[1]);
    masks.iter().for_each(|m| check_mask(m));

    // Two keys in one graph: two streams, whatever the keys' values.
    let two_keys = |a: u64, b: u64| {
        coil::manual_seed(a);
        let u = Tensor::rand(&[256], DType::F32).unwrap();
        coil::manual_seed(b);
        let v = Tensor::randn(&[256], DType::F32).unwrap();
        let s = &u + &v;
        assert_eq!(coil::capture(&[&s]).random.len(), 2);
        f32s(&s)
    };
    let first = two_keys(1, 2);
    let before = coil::compile_count();
    let again = two_keys(u64::MAX, 1 << 40);
    assert_eq!(coil::compile_count(), before, "other keys compiled again");
    assert_ne!(first, again);
    assert_eq!(first, two_keys(1, 2));
}

#[test]
fn graphs_print_streams_and_relative_offsets() {
    let _serial = serial();
    coil::manual_seed(123);
    let _skip = Tensor::rand(&[1000], DType::F32).unwrap(); // moves the stream on: offsets start at 1000
    let x = Tensor::ones(&[4, 8], DType::F32);
    let y = x.dropout(0.5, true).unwrap() * Tensor::randn(&[4, 8], DType::F32).unwrap();
    let captured = coil::capture(&[&y]);
    assert_eq!(captured.random, vec![coil::RandomState { seed: 123, offset: 1000 }]);
    let text = captured.graph.to_string();
    assert!(text.contains("dropout(%0, p=0.5, stream=0, offset=0)"), "{text}");
    assert!(text.contains("randn(stream=0, offset=32)"), "{text}");
    if coil_runtime::testing::c_compiler().is_none() {
        return;
    }
    let compiled = coil::inspect(&[&y]).unwrap();
    let tile = compiled.kernels.iter().flatten().next().expect("a generated kernel").to_string();
    insta::assert_snapshot!("random_ir", format!("{}\n{tile}", compiled.pre_fusion));
}

#[test]
fn dynamic_shapes_keep_drawing_from_the_streams() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let _serial = serial();
    let f = coil::compile(|a: &[Tensor]| {
        let h = a[0].dropout(P, true)?;
        Ok(vec![h.dropout(P, true)?.add(&a[0].rand_like()?)?])
    });
    for (k, rows) in [4usize, 6, 9, 12].into_iter().enumerate() {
        let x = Tensor::ones(&[rows, 16], DType::F32);
        x.realize().unwrap();
        coil::manual_seed(k as u64);
        let got = f32s(&f.call(&[&x]).unwrap()[0]);
        coil::manual_seed(k as u64);
        let want = interpreted(|a| Ok(vec![a[0].dropout(P, true)?.dropout(P, true)?.add(&a[0].rand_like()?)?]), &[x]);
        assert_eq!(bits(&got), bits(&want[0]), "{rows} rows");
    }
    // the first size static, then one compile for every size
    assert_eq!(f.compile_count(), 2, "{:?}", f.recompile_reasons());
}

#[test]
fn gradients_through_dropout_see_the_forward_mask() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let _serial = serial();
    coil::manual_seed(17);
    let x = Tensor::ones(&[4096], DType::F32);
    let w = Tensor::full(&[4096], 3.0, DType::F32);
    coil::realize(&[&x, &w]).unwrap();
    let f = coil::compile(|a: &[Tensor]| {
        let y = a[0].dropout(P, true)?;
        let (loss, g) = coil::value_and_grad(&y.mul(&a[1])?.sum_all()?, &[&a[1]])?;
        Ok(vec![y, loss, g[0].clone()])
    });
    for _ in 0..4 {
        let out = f.call(&[&x, &w]).unwrap();
        let (y, loss, g) = (f32s(&out[0]), f32s(&out[1])[0], f32s(&out[2]));
        check_mask(&y);
        // d(sum(y * w))/dw = y: the same numbers as the forward's
        assert_eq!(bits(&g), bits(&y));
        let want = 3.0 * y.iter().map(|&v| v as f64).sum::<f64>();
        assert!((loss as f64 - want).abs() <= 1e-5 * want, "{loss} vs {want}");
    }
    assert_eq!(f.compile_count(), 1, "{:?}", f.recompile_reasons());
}

#[test]
fn like_constructors_take_the_tensor_device_and_dtype() {
    let _serial = serial();
    let x = Tensor::from_vec(vec![1.5f64, -2.0, 0.25, 4.0], &[2, 2]).unwrap();
    // Whatever the thread's default device, `*_like` follow the tensor (nothing runs on the
    // default device here, so this holds without a GPU).
    coil::set_default_device(Device::Cuda(0));
    let made = [x.zeros_like(), x.ones_like(), x.full_like(7), x.rand_like().unwrap(), x.randn_like().unwrap()];
    let on_gpu = Tensor::zeros(&[3], DType::BF16); // pending, on the default device
    let like_gpu = [on_gpu.zeros_like(), on_gpu.full_like(2.5), on_gpu.randn_like().unwrap()];
    coil::set_default_device(Device::Cpu);
    for t in &made {
        assert_eq!((t.device(), t.dtype(), t.shape()), (Device::Cpu, DType::F64, &[2, 2][..]));
    }
    for t in &like_gpu {
        assert_eq!((t.device(), t.dtype(), t.shape()), (Device::Cuda(0), DType::BF16, &[3][..]));
    }
    let sum = &(&(&x + &made[2]) + &made[1]) - &made[0];
    assert_eq!(sum.to_vec::<f64>().unwrap(), vec![9.5, 6.0, 8.25, 12.0]);
    assert!(made[3].to_vec::<f64>().unwrap().iter().all(|v| (0.0..1.0).contains(v)));
    let ints = Tensor::from_vec(vec![1i64, 2], &[2]).unwrap();
    assert_eq!(ints.full_like(3).to_vec::<i64>().unwrap(), vec![3, 3]);
    let e = ints.rand_like().unwrap_err();
    assert!(e.to_string().contains("rand expects a floating dtype, got i64"), "{e}");
}

/// `normal`, `uniform`, `bernoulli` and `randint` (compositions of `rand` / `randn`) draw from
/// the seeded stream: a seed gives the same numbers interpreted and compiled, in range, with the
/// distribution's moments (4096 draws: the tolerances are several standard errors).
#[test]
fn composite_random_ops_are_seeded_in_range_and_agree_across_backends() {
    let _serial = serial();
    let draw = || -> Vec<Vec<f64>> {
        coil::manual_seed(11);
        let normal = Tensor::normal(3.0, 2.0, &[4096], DType::F32).unwrap();
        let uniform = Tensor::uniform(-1.0, 5.0, &[4096], DType::F32).unwrap();
        let coin = Tensor::full(&[4096], 0.3, DType::F32).bernoulli().unwrap();
        let dice = Tensor::randint(-3, 4, &[4096], DType::I64).unwrap();
        [normal, uniform, coin, dice].iter().map(|t| t.to_vec::<f64>().unwrap()).collect()
    };
    coil::set_backend(Backend::Interpreter);
    let interpreted = draw();
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    let compiled = draw();
    for (i, (a, b)) in interpreted.iter().zip(&compiled).enumerate() {
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(worst <= 1e-5, "draw {i}: interpreted and compiled differ by {worst}");
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let [normal, uniform, coin, dice] = &compiled[..] else { unreachable!() };
    let m = mean(normal);
    let sd = (normal.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / normal.len() as f64).sqrt();
    assert!((m - 3.0).abs() < 0.15 && (sd - 2.0).abs() < 0.15, "normal: mean {m}, std {sd}");
    assert!(uniform.iter().all(|&x| (-1.0..5.0).contains(&x)), "uniform out of [-1, 5)");
    assert!((mean(uniform) - 2.0).abs() < 0.15, "uniform mean {}", mean(uniform));
    assert!(coin.iter().all(|&x| x == 0.0 || x == 1.0) && (mean(coin) - 0.3).abs() < 0.04, "bernoulli");
    assert!(dice.iter().all(|&x| (-3.0..4.0).contains(&x) && x.fract() == 0.0), "randint out of [-3, 4)");
    assert!((-3..4).all(|k| dice.contains(&(k as f64))), "randint never drew some value of [-3, 4)");
    // Random numbers take no part in gradients, and a bad range is an error at the caller's line.
    let e = Tensor::randint(4, 4, &[2], DType::I64).unwrap_err();
    assert!(e.to_string().contains(file!()), "{e}");
    assert!(Tensor::normal(0.0, -1.0, &[2], DType::F32).is_err());
    assert!(Tensor::uniform(1.0, 0.0, &[2], DType::F32).is_err());
}

/// Channel dropout zeroes whole channels with probability p and scales the rest; alpha dropout
/// keeps a standard normal input's mean and variance; both draw the same numbers interpreted and
/// compiled.
#[test]
fn channel_and_alpha_dropout_draw_per_channel_keep_moments_and_agree_across_backends() {
    let _serial = serial();
    let draw = || -> Vec<Vec<f32>> {
        coil::manual_seed(5);
        let ones = Tensor::ones(&[64, 32, 3, 3], DType::F32);
        let channels = ones.feature_dropout(0.25, true, 2).unwrap();
        let x = Tensor::randn(&[16384], DType::F32).unwrap();
        let alpha = x.alpha_dropout(0.2, true).unwrap();
        let feature_alpha = ones.feature_alpha_dropout(0.2, true).unwrap();
        [channels, alpha, feature_alpha].iter().map(f32s).collect()
    };
    coil::set_backend(Backend::Interpreter);
    let interpreted = draw();
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    let compiled = draw();
    for (a, b) in interpreted.iter().zip(&compiled) {
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "interpreted and compiled differ by {worst}");
    }
    let [channels, alpha, feature_alpha] = &compiled[..] else { unreachable!() };
    let kept = (1.0f64 / 0.75) as f32;
    assert!(channels.chunks(9).all(|c| c.iter().all(|&v| v == c[0]) && (c[0] == 0.0 || c[0] == kept)));
    let dropped = channels.chunks(9).filter(|c| c[0] == 0.0).count() as f64 / (64.0 * 32.0);
    assert!((dropped - 0.25).abs() < 0.04, "dropped {dropped} of the channels for p = 0.25");
    let n = alpha.len() as f64;
    let mean = alpha.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = alpha.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.06, "alpha dropout: mean {mean}, variance {var}");
    assert!(feature_alpha.chunks(9).all(|c| c.iter().all(|&v| v == c[0])), "feature alpha dropout per channel");
    let x = Tensor::ones(&[4], DType::F32);
    assert_eq!(f32s(&x.alpha_dropout(1.0, true).unwrap()), vec![0.0; 4]);
    assert_eq!(f32s(&x.feature_dropout(0.5, false, 1).unwrap()), vec![1.0; 4]);
    assert!(x.alpha_dropout(1.5, true).is_err());
}
