//! Sorting and sampling (`sort`, `argsort`, `topk`, `multinomial`, `sample_tokens`) against
//! PyTorch's results (`tests/sampling/golden.safetensors`, made by `tests/sampling/make_golden.py`)
//! on the interpreter and the compiled CPU; the compiled CPU's sort agrees with the
//! interpreter's on random inputs; gradients flow through sorted values; bad arguments are
//! errors naming the op and the line. `tests/gpu.rs` runs the same cases on CUDA.

#[path = "sampling/cases.rs"]
mod cases;

use coil::{Backend, DType, Device, Sampling, Tensor};

const BACKENDS: [Backend; 2] = [Backend::Interpreter, Backend::Compiled];

/// Runs this file's tests one at a time: one of them counts the process's compiles
/// (`coil::compile_count`, shared by every thread), which the others would add to.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn sort_and_argsort_match_pytorch() {
    let _serial = serial();
    for backend in BACKENDS {
        cases::check_sorts(backend, Device::Cpu);
    }
}

#[test]
fn topk_matches_pytorch() {
    let _serial = serial();
    for backend in BACKENDS {
        cases::check_topk(backend, Device::Cpu);
    }
}

#[test]
fn sampled_tokens_follow_pytorchs_distribution() {
    let _serial = serial();
    for backend in BACKENDS {
        cases::check_sampling(backend, Device::Cpu);
    }
}

#[test]
fn multinomial_follows_the_weights_and_repeats_under_a_seed() {
    let _serial = serial();
    for backend in BACKENDS {
        cases::check_multinomial(backend, Device::Cpu);
    }
}

/// `f`'s outputs as f64 bits (NaN as one value) on the interpreter, then compiled.
fn on_both(f: &dyn Fn() -> Vec<Tensor>) -> [Vec<Vec<u64>>; 2] {
    BACKENDS.map(|backend| {
        coil::set_backend(backend);
        coil::set_eager_tier(false);
        f().iter().map(cases::bits).collect()
    })
}

#[test]
fn compiled_sorts_agree_with_the_interpreter_on_random_inputs() {
    let _serial = serial();
    cases::check_compiled_against_interpreter(Device::Cpu);
}

#[test]
fn compiled_multinomial_draws_what_the_interpreter_draws() {
    let _serial = serial();
    let p = Tensor::from_vec(vec![0.5f32, 0.0, 1.5, 2.0, 0.25, 0.25, 0.0, 3.0], &[2, 4]).unwrap();
    let [interpreted, compiled] = on_both(&|| {
        coil::manual_seed(11);
        vec![p.multinomial(257, true).unwrap(), p.multinomial(3, false).unwrap()]
    });
    assert_eq!(interpreted, compiled);
}

/// The gradient of `sum(sort(x) * w)` is `w` scattered back to the sorted positions; of topk's
/// values, the same on the kept positions and 0 elsewhere.
#[test]
fn gradients_flow_back_to_the_sorted_positions() {
    let _serial = serial();
    let x = Tensor::from_vec(vec![3.0f32, -1.0, 2.0, 2.0, 0.5, 7.0, 1.0, -4.0], &[2, 4]).unwrap();
    let w = Tensor::from_vec(vec![1.0f32, 10.0, 100.0, 1000.0, 2.0, 20.0, 200.0, 2000.0], &[2, 4]).unwrap();
    for backend in BACKENDS {
        coil::set_backend(backend);
        coil::set_eager_tier(false);
        let (v, _) = x.sort(1, false).unwrap();
        let g = coil::grad(&v.mul(&w).unwrap().sum_all().unwrap(), &[&x]).unwrap();
        // Row 0 ascending: -1 (1), 2 (2), 2 (3), 3 (0); row 1: -4 (3), 0.5 (0), 1 (2), 7 (1).
        assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![1000.0, 1.0, 10.0, 100.0, 20.0, 2000.0, 200.0, 2.0]);
        let (top, _) = x.topk(2, 1, true).unwrap();
        let w2 = w.narrow(1, 0, 2).unwrap();
        let g = coil::grad(&top.mul(&w2).unwrap().sum_all().unwrap(), &[&x]).unwrap();
        assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![1.0, 0.0, 10.0, 0.0, 0.0, 2.0, 20.0, 0.0]);
    }
}

#[test]
fn bad_arguments_are_errors_naming_the_op_and_line() {
    let _serial = serial();
    let x = Tensor::zeros(&[3, 5], DType::F32);
    let check = |e: coil::Error, op: &str, words: &[&str]| {
        let text = e.to_string();
        assert_eq!(e.op.as_deref(), Some(op), "{text}");
        assert!(text.contains(file!()), "no line: {text}");
        for w in words {
            assert!(text.contains(w), "{w:?} missing: {text}");
        }
    };
    check(x.topk(6, -1, true).unwrap_err(), "topk", &["k (6)", "[3, 5]"]);
    check(x.sort(2, false).unwrap_err(), "sort", &["[3, 5]"]);
    check(x.argsort(-3, true).unwrap_err(), "argsort", &["[3, 5]"]);
    let ints = Tensor::zeros(&[5], DType::I64);
    check(ints.multinomial(1, true).unwrap_err(), "multinomial", &["floating", "i64"]);
    check(Tensor::zeros(&[2, 2, 2], DType::F32).multinomial(1, true).unwrap_err(), "multinomial", &["[2, 2, 2]"]);
    check(x.multinomial(6, false).unwrap_err(), "multinomial", &["without replacement"]);
    check(x.multinomial(0, true).unwrap_err(), "multinomial", &["0 samples"]);
    // Weights already computed on the host are checked.
    let bad = |w: Vec<f32>| Tensor::from_vec(w, &[2, 2]).unwrap();
    check(bad(vec![0.5, -0.1, 1.0, 1.0]).multinomial(1, true).unwrap_err(), "multinomial", &["below 0", "[2, 2]"]);
    check(bad(vec![0.5, f32::NAN, 1.0, 1.0]).multinomial(1, true).unwrap_err(), "multinomial", &["NaN"]);
    check(bad(vec![0.5, 0.5, 0.0, 0.0]).multinomial(1, true).unwrap_err(), "multinomial", &["sum to 0"]);
    check(bad(vec![0.5, 0.0, 1.0, 1.0]).multinomial(2, false).unwrap_err(), "multinomial", &["1 positive"]);
    let s = Sampling { temperature: 1.0, top_k: None, top_p: Some(1.5) };
    check(x.sample_tokens(&s).unwrap_err(), "sample_tokens", &["top_p", "1.5"]);
    check(x.sample_tokens(&Sampling { temperature: -1.0, ..s }).unwrap_err(), "sample_tokens", &["temperature"]);
    check(x.sample_tokens(&Sampling { top_k: Some(0), top_p: None, ..s }).unwrap_err(), "sample_tokens", &["top_k"]);
    check(ints.sample_tokens(&Sampling::default()).unwrap_err(), "sample_tokens", &["floating"]);
}

/// A decode loop that samples on the device inside each step's graph (as
/// `examples/generate` does) compiles the decode step once: the random numbers' seed and
/// offset are run-time arguments. Greedy sampling in the step picks the logits' argmax.
#[test]
fn sampling_inside_a_decode_step_compiles_once() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let _serial = serial();
    use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
    let store = coil::nn::ParamStore::new();
    let config = Gpt2Config {
        vocab_size: 61,
        block_size: 16,
        n_layer: 1,
        n_head: 2,
        n_embd: 16,
        dropout: 0.0,
        layer_norm_eps: 1e-5,
    };
    let model = Gpt2::new(&store.root(Device::Cpu, DType::F32), config).unwrap();
    for sampling in [Sampling { temperature: 0.9, top_k: Some(20), top_p: Some(0.9) }, Sampling::greedy()] {
        let mut cache = model.new_cache(2, 16).unwrap();
        let prompt = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
        let (logits, written) = model.forward_cached(&prompt, &cache.position().unwrap(), &cache).unwrap();
        let mut token = logits.sample_tokens(&sampling).unwrap();
        cache.commit(&written, 3, &[&token, &logits]).unwrap();
        let mut logits = logits;
        let mut after_first = None;
        for _ in 0..5 {
            let ids = token.to_vec::<i64>().unwrap();
            assert!(ids.iter().all(|&t| (0..61).contains(&t)), "{ids:?}");
            if sampling.temperature == 0.0 {
                assert_eq!(ids, logits_argmax(&logits.to_vec::<f32>().unwrap()), "greedy picks the argmax");
            }
            let x = token.reshape(&[2, 1]).unwrap();
            let (logits_now, written) = model.forward_cached(&x, &cache.position().unwrap(), &cache).unwrap();
            token = logits_now.sample_tokens(&sampling).unwrap();
            cache.commit(&written, 1, &[&token, &logits_now]).unwrap();
            logits = logits_now;
            after_first.get_or_insert(coil::compile_count());
            assert_eq!(coil::compile_count(), after_first.unwrap(), "the decode step compiled again");
        }
    }
}

fn logits_argmax(logits: &[f32]) -> Vec<i64> {
    logits
        .chunks(61)
        .map(|row| (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a))).unwrap() as i64)
        .collect()
}

/// A compiled function that sorts and samples serves every length from one dynamic graph after
/// its first recompile (the argsort's line length and the sampler's vocabulary are size
/// symbols), with the interpreter's results.
#[test]
fn sorting_and_sampling_compile_once_for_every_length() {
    let _serial = serial();
    let body = |args: &[Tensor]| -> coil::Result<Vec<Tensor>> {
        let (v, i) = args[0].sort(-1, true)?;
        let s = Sampling { temperature: 1.0, top_k: Some(3), top_p: Some(1e-9) };
        Ok(vec![v, i, args[0].sample_tokens(&s)?])
    };
    let f = coil::compile(body).named("sort_and_sample");
    for n in [5usize, 6, 17, 300] {
        let x = Tensor::from_vec((0..3 * n).map(|k| ((k * 7919) % 23) as f32 - 11.0).collect(), &[3, n]).unwrap();
        let got: Vec<Vec<u64>> = f.call(&[&x]).unwrap().iter().map(cases::bits).collect();
        coil::set_backend(Backend::Interpreter);
        let want: Vec<Vec<u64>> = body(std::slice::from_ref(&x)).unwrap().iter().map(cases::bits).collect();
        coil::set_backend(Backend::Compiled);
        coil::set_eager_tier(false);
        assert_eq!(got, want, "length {n}");
    }
    assert_eq!(f.compile_count(), 2, "{:?}", f.recompile_reasons());
}
