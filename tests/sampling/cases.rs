//! Checks of `sort`, `argsort`, `topk`, `multinomial` and `sample_tokens` against PyTorch's
//! results in `golden.safetensors` (made by `make_golden.py`), run on one backend and device:
//! `tests/sampling.rs` runs them on the interpreter and the compiled CPU, `tests/gpu.rs` on
//! CUDA. Draws are checked statistically: each category's count within 5 standard deviations
//! (plus 3) of its expectation, and exactly 0 for a category of probability 0. The draws are
//! seeded, so a check that passes passes every time; a wrong distribution (a category kept that
//! should not be, weights not renormalized) misses the bound by far more.

use coil::{Backend, DType, Device, Sampling, Tensor};
use std::collections::BTreeMap;

/// The golden tensors, on the CPU: from the source tree the test was built in, else from the
/// working directory (a test binary run on another machine, in a copy of the repository).
pub fn golden() -> BTreeMap<String, Tensor> {
    let built = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sampling/golden.safetensors");
    coil::safetensors::load(built, Device::Cpu)
        .or_else(|_| coil::safetensors::load("tests/sampling/golden.safetensors", Device::Cpu))
        .expect("tests/sampling/golden.safetensors (see make_golden.py)")
}

/// Values as f64 with every NaN the same, so that vectors compare with `==`.
fn values(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap().into_iter().map(|v| if v.is_nan() { f64::NAN.abs() } else { v }).collect()
}

fn same_values(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

/// `case.x` of the golden file on `device`.
fn input(golden: &BTreeMap<String, Tensor>, key: &str, device: Device) -> Tensor {
    golden[key].to_device(device).unwrap()
}

/// The dim and flag at the end of a case name: `..._d2_desc` is `(2, "desc")`.
fn dim_and_flag(case: &str) -> (i64, &str) {
    let mut parts = case.rsplit('_');
    let flag = parts.next().unwrap();
    let dim = parts.next().unwrap().strip_prefix('d').unwrap().parse().unwrap();
    (dim, flag)
}

/// Every `sort_*` case: `sort` and `argsort` give PyTorch's stable order and values, dtypes kept.
pub fn check_sorts(backend: Backend, device: Device) {
    coil::set_backend(backend);
    coil::set_eager_tier(false);
    let golden = golden();
    let cases: Vec<&str> = golden.keys().filter_map(|k| k.strip_prefix("sort_")?.strip_suffix(".x")).collect();
    assert!(cases.len() >= 18, "{cases:?}");
    let mut failures = Vec::new();
    for case in cases {
        let (dim, flag) = dim_and_flag(case);
        let x = input(&golden, &format!("sort_{case}.x"), device);
        let (want_v, want_i) = (&golden[&format!("sort_{case}.values")], &golden[&format!("sort_{case}.indices")]);
        let (v, i) = x.sort(dim, flag == "desc").unwrap();
        let positions = x.argsort(dim, flag == "desc").unwrap();
        if v.dtype() != x.dtype() || v.shape() != want_v.shape() || i.shape() != want_i.shape() {
            failures.push(format!("{case}: {} and {} for {} and {}", v.meta(), i.meta(), want_v.meta(), want_i.meta()));
            continue;
        }
        let want = want_i.to_vec::<i64>().unwrap();
        if i.to_vec::<i64>().unwrap() != want || positions.to_vec::<i64>().unwrap() != want {
            failures.push(format!("{case}: positions differ"));
        }
        if !same_values(&values(&v), &values(want_v)) {
            failures.push(format!("{case}: values differ"));
        }
    }
    assert!(failures.is_empty(), "{backend:?} on {device}:\n{}", failures.join("\n"));
}

/// Every `topk_*` case: PyTorch's values; positions lowest first among ties, and PyTorch's own
/// positions name equal values.
pub fn check_topk(backend: Backend, device: Device) {
    coil::set_backend(backend);
    coil::set_eager_tier(false);
    let golden = golden();
    let cases: Vec<&str> = golden.keys().filter_map(|k| k.strip_prefix("topk_")?.strip_suffix(".x")).collect();
    assert!(cases.len() >= 6, "{cases:?}");
    for case in cases {
        let (dim, flag) = dim_and_flag(case);
        let k: usize = case.split('_').find_map(|p| p.strip_prefix('k')?.parse().ok()).unwrap();
        let x = input(&golden, &format!("topk_{case}.x"), device);
        let (v, i) = x.topk(k, dim, flag == "largest").unwrap();
        let want_v = &golden[&format!("topk_{case}.values")];
        assert!(same_values(&values(&v), &values(want_v)), "{case}: values differ on {device}");
        assert_eq!(
            i.to_vec::<i64>().unwrap(),
            golden[&format!("topk_{case}.indices")].to_vec::<i64>().unwrap(),
            "{case}"
        );
        let torch_i = input(&golden, &format!("topk_{case}.torch_indices"), device);
        let at_torch = x.gather(dim, &torch_i).unwrap();
        assert!(same_values(&values(&at_torch), &values(want_v)), "{case}: torch's positions name other values");
    }
}

/// Counts of `draws` (category ids below `n`) per category.
fn counts(draws: &[i64], n: usize) -> Vec<usize> {
    let mut c = vec![0; n];
    for &d in draws {
        assert!((0..n as i64).contains(&d), "draw {d} outside 0..{n}");
        c[d as usize] += 1;
    }
    c
}

/// Each count within 5 standard deviations (plus 3) of `draws * p`; none where `p` is 0.
fn check_frequencies(what: &str, counts: &[usize], p: &[f64]) {
    let n: usize = counts.iter().sum();
    for (k, (&c, &p)) in counts.iter().zip(p).enumerate() {
        let expected = n as f64 * p;
        let bound = 5.0 * (n as f64 * p * (1.0 - p)).sqrt() + 3.0;
        let ok = if p == 0.0 { c == 0 } else { (c as f64 - expected).abs() <= bound };
        assert!(ok, "{what}: category {k} drawn {c} times in {n}, expected {expected:.1} (p = {p})");
    }
}

/// Every `sample_*` case: `sample_tokens` over many copies of the logits draws each token as
/// often as PyTorch's renormalized distribution says, never a token it removes; top-p tiny
/// and temperature 0 give the argmax.
pub fn check_sampling(backend: Backend, device: Device) {
    coil::set_backend(backend);
    coil::set_eager_tier(false);
    let golden = golden();
    const DRAWS: usize = 3000;
    for case in golden.keys().filter_map(|k| k.strip_prefix("sample_")?.strip_suffix(".logits")) {
        let logits = input(&golden, &format!("sample_{case}.logits"), device);
        let (rows, vocab) = (logits.shape()[0], logits.shape()[1]);
        let mut s = Sampling::default();
        for part in case.split('_') {
            let (key, v) = part.split_at(1);
            match key {
                "t" => s.temperature = v.parse().unwrap(),
                "k" => s.top_k = Some(v.parse().unwrap()),
                "p" => s.top_p = Some(v.parse().unwrap()),
                _ => unreachable!("{case}"),
            }
        }
        coil::manual_seed(21);
        let many = logits.unsqueeze(0).unwrap().expand(&[DRAWS as i64, rows as i64, vocab as i64]).unwrap();
        let ids = many.sample_tokens(&s).unwrap();
        assert_eq!((ids.shape(), ids.dtype()), (&[DRAWS, rows][..], DType::I64));
        let ids = ids.to_vec::<i64>().unwrap();
        let dist = golden[&format!("sample_{case}.dist")].to_vec::<f64>().unwrap();
        for r in 0..rows {
            let row: Vec<i64> = (0..DRAWS).map(|d| ids[d * rows + r]).collect();
            check_frequencies(
                &format!("{case} row {r} on {device}"),
                &counts(&row, vocab),
                &dist[r * vocab..][..vocab],
            );
        }
        let argmax = logits.argmax(Some(-1), false).unwrap().to_vec::<i64>().unwrap();
        let tiny = Sampling { top_p: Some(1e-9), ..s };
        assert_eq!(logits.sample_tokens(&tiny).unwrap().to_vec::<i64>().unwrap(), argmax, "{case}: top_p 1e-9");
        let greedy = logits.sample_tokens(&Sampling::greedy()).unwrap().to_vec::<i64>().unwrap();
        assert_eq!(greedy, argmax, "{case}: temperature 0");
    }
}

/// `multinomial` with replacement matches the weights' frequencies (zeros never drawn, rows
/// not normalized), is reproducible under `manual_seed`, and without replacement draws
/// distinct categories whose first draw follows the weights.
pub fn check_multinomial(backend: Backend, device: Device) {
    coil::set_backend(backend);
    coil::set_eager_tier(false);
    let weights = vec![0.1f32, 0.0, 0.4, 0.2, 0.3, 5.0, 1.0, 0.0, 0.0, 4.0];
    let p = Tensor::from_vec(weights.clone(), &[2, 5]).unwrap().to_device(device).unwrap();
    const DRAWS: usize = 20000;
    coil::manual_seed(5);
    let draws = p.multinomial(DRAWS, true).unwrap();
    assert_eq!((draws.shape(), draws.dtype()), (&[2, DRAWS][..], DType::I64));
    let draws = draws.to_vec::<i64>().unwrap();
    for r in 0..2 {
        let w = &weights[r * 5..][..5];
        let total: f32 = w.iter().sum();
        let p: Vec<f64> = w.iter().map(|&x| (x / total) as f64).collect();
        check_frequencies(&format!("multinomial row {r} on {device}"), &counts(&draws[r * DRAWS..][..DRAWS], 5), &p);
    }
    coil::manual_seed(5);
    assert_eq!(p.multinomial(DRAWS, true).unwrap().to_vec::<i64>().unwrap(), draws, "seeded draws repeat");
    coil::manual_seed(6);
    assert_ne!(p.multinomial(DRAWS, true).unwrap().to_vec::<i64>().unwrap(), draws, "another seed, other draws");

    let w = [1.0f32, 2.0, 3.0, 4.0];
    const ROWS: usize = 4000;
    let many = Tensor::from_vec(w.to_vec(), &[1, 4]).unwrap().to_device(device).unwrap();
    let many = many.expand(&[ROWS as i64, 4]).unwrap();
    let picks = many.multinomial(3, false).unwrap().to_vec::<i64>().unwrap();
    let mut first = Vec::with_capacity(ROWS);
    for row in picks.chunks(3) {
        assert!(row[0] != row[1] && row[0] != row[2] && row[1] != row[2], "{row:?} repeats a category");
        first.push(row[0]);
    }
    check_frequencies("multinomial without replacement", &counts(&first, 4), &[0.1, 0.2, 0.3, 0.4]);
}

/// A small deterministic generator (xorshift) of values with ties, NaN and -0.0.
fn random_values(n: usize, seed: u64, levels: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            match s % 97 {
                0 => f64::NAN,
                1 => -0.0,
                _ => (s % levels) as f64 - (levels / 2) as f64,
            }
        })
        .collect()
}

/// A tensor's elements as f64 bits, every NaN the same.
pub fn bits(t: &Tensor) -> Vec<u64> {
    t.to_vec::<f64>().unwrap().iter().map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() }).collect()
}

/// `sort` compiled on `device` gives the interpreter's values and positions (on the CPU), for
/// every dtype, dim and direction, short lines and lines of several tiles (50257 long, several
/// of them; a long middle dim), with work after the sort in the same graph.
pub fn check_compiled_against_interpreter(device: Device) {
    let shapes: [&[usize]; 7] = [&[7, 129], &[3, 1000], &[65, 3], &[2, 3, 5, 4], &[1], &[3, 50257], &[2, 4500, 3]];
    for (k, shape) in shapes.iter().enumerate() {
        let n = shape.iter().product();
        let long = n > 10000;
        let dtypes: &[DType] = if long {
            &[DType::F32, DType::BF16]
        } else {
            &[DType::F32, DType::BF16, DType::F16, DType::F64, DType::I64, DType::I32, DType::Bool]
        };
        for &dtype in dtypes {
            let x = Tensor::from_vec(random_values(n, k as u64 + 1, 9 + 50 * k as u64), shape).unwrap();
            let x = match dtype {
                DType::Bool => x.gt(0.0).unwrap(),
                d if d.is_float() => x.to_dtype(d).unwrap(),
                d => x.nan_to_num(0.0, None, None).unwrap().to_dtype(d).unwrap(),
            };
            x.realize().unwrap();
            let dims: Vec<i64> = if long { vec![1] } else { (0..shape.len() as i64).collect() };
            for &dim in &dims {
                for descending in [false, true] {
                    let run = |backend: Backend, x: &Tensor| -> Vec<Vec<u64>> {
                        coil::set_backend(backend);
                        coil::set_eager_tier(false);
                        let (v, i) = x.sort(dim, descending).unwrap();
                        // Work after the sort in the same graph: the positions feed a fused kernel.
                        let shifted = i.add(1).unwrap().mul(2).unwrap();
                        [v, i, shifted].iter().map(bits).collect()
                    };
                    let interpreted = run(Backend::Interpreter, &x);
                    let compiled = run(Backend::Compiled, &x.to_device(device).unwrap());
                    assert!(interpreted == compiled, "{dtype} {shape:?} dim {dim} descending {descending} on {device}");
                }
            }
        }
    }
}
