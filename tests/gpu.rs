//! The GPU tests: every PyTorch golden case and the random differential programs, compiled for
//! CUDA. Without a usable CUDA GPU each test says so and passes, so this file runs in CI (no GPU)
//! as well as on the GPU machine (`../shared/device/README.md`):
//!
//! ```sh
//! ../shared/device/stage.sh test:gpu     # here; then on the GPU machine:
//! .device/bin/gpu --include-ignored --test-threads=1
//! ```

#[path = "golden/harness.rs"]
mod golden;

#[path = "differential/harness.rs"]
mod differential;

#[path = "attention/cases.rs"]
mod attention;

#[path = "signed_zeros/cases.rs"]
mod signed_zeros;

#[path = "sampling/cases.rs"]
mod sampling;

#[path = "replay/cases.rs"]
mod replay;

#[path = "resnet/cases.rs"]
mod resnet;

/// The GPU, or `None` after saying why the test is skipped.
fn gpu() -> Option<coil::Device> {
    coil_runtime::testing::cuda_device().map(|_| coil::Device::Cuda(0))
}

#[test]
fn golden_cases_match_pytorch_on_cuda() {
    if let Some(device) = gpu() {
        golden::check_all(coil::Backend::Compiled, device);
    }
}

/// `0.0` and `-0.0` constants in one kernel, relu, clamp at +-0.0, maximum / minimum ties and
/// `where`, bit for bit as PyTorch's CPU (PTX for f32 / f16 / bf16, CUDA C for f64; run with
/// `COIL_CUDA_PTX=0` too for CUDA C throughout).
#[test]
fn signed_zeros_match_pytorch_on_cuda() {
    if let Some(device) = gpu() {
        signed_zeros::check_all(coil::Backend::Compiled, device);
    }
}

/// `sort`, `argsort`, `topk` (the argsort template: bitonic tiles and merge passes, 50257-long
/// rows included), `multinomial` and `sample_tokens` on CUDA: PyTorch's golden values and
/// positions, the draws' frequencies, and the interpreter's results on random inputs.
#[test]
fn sorting_and_sampling_match_pytorch_on_cuda() {
    if let Some(device) = gpu() {
        sampling::check_sorts(coil::Backend::Compiled, device);
        sampling::check_topk(coil::Backend::Compiled, device);
        sampling::check_multinomial(coil::Backend::Compiled, device);
        sampling::check_sampling(coil::Backend::Compiled, device);
        sampling::check_compiled_against_interpreter(device);
    }
}

#[test]
fn compiled_cuda_programs_agree_with_the_interpreter() {
    if let Some(device) = gpu() {
        differential::check_all(device);
    }
}

/// Rows of 12289 to 65536 elements: split over clusters of blocks on an H100.
#[test]
fn long_row_reductions_agree_with_the_interpreter_on_cuda() {
    if let Some(device) = gpu() {
        differential::check_long_rows(device);
    }
}

#[test]
fn wide_column_reductions_agree_with_the_interpreter_on_cuda() {
    if let Some(device) = gpu() {
        differential::check_wide_columns(device);
    }
}

#[test]
fn long_column_reductions_agree_with_the_interpreter_on_cuda() {
    if let Some(device) = gpu() {
        differential::check_long_columns(device);
    }
}

#[test]
fn dynamic_cuda_programs_agree_with_static_ones_at_every_size() {
    if let Some(device) = gpu() {
        differential::check_all_dynamic(device);
    }
}

/// The attention template's CUDA kernels (tensor-core for f16 / bf16, the simple one for f32)
/// against the interpreter: GPT-2's head views written out and through
/// `scaled_dot_product_attention` (B=2, H=3, T=200 causal bf16, D=64), L != S, D 8 to 128.
#[test]
fn attention_template_agrees_with_the_interpreter_on_cuda() {
    if let Some(device) = gpu() {
        attention::check_all(device);
    }
}

/// Masked attention through the template on CUDA (the split-KV decode kernels for one row or
/// grouped-query rows against a long key range, the row-block kernels with bool and added
/// masks, rows that keep no key) against the interpreter.
#[test]
fn masked_attention_template_agrees_with_the_interpreter_on_cuda() {
    if let Some(device) = gpu() {
        attention::masked::check_masked_all(device);
    }
}

/// Gradients through the attention templates on CUDA (the backward kernels: tensor-core for
/// f16 / bf16, the simple one for f32) against the interpreter and the decomposed path: causal
/// and not, L and S not multiples of 64, head dims 32 to 128, GPT-2's head views.
#[test]
fn attention_gradients_through_the_templates_agree_on_cuda() {
    if let Some(device) = gpu() {
        attention::grad::check_grad_all(device);
    }
}

/// Gradients through masked attention on CUDA: the backward kernels with the mask (bool over
/// the heads, added over the batch, rows that keep no key, 40 and 70 rows, a decode-like row;
/// tensor-core for f16 / bf16, the simple one for f32), and a learned added mask through the
/// decomposition, against the interpreter.
#[test]
fn masked_attention_gradients_agree_on_cuda() {
    if let Some(device) = gpu() {
        attention::masked_grad::check_masked_grad_all(device);
    }
}

/// Attention with dropout on CUDA: the forward and backward kernels (tensor-core for bf16 and
/// f16, the simple ones for f32; the `_masked` entry points with a bool or added mask and
/// dropout together) against the interpreter's decomposition, values and gradients; the
/// kernels keep exactly the decomposition's weights; new masks at every call (`tests/attention/dropout.rs`).
#[test]
fn attention_dropout_templates_agree_with_the_interpreter_on_cuda() {
    if let Some(device) = gpu() {
        attention::dropout::check_dropout_grads(device);
        attention::dropout::check_masked_dropout_forward(device);
        attention::dropout::check_dropout_masks(device);
        attention::dropout::check_dropout_errors();
    }
}

/// GPT-2-sized attention gradients (bf16, B=2, H=4, T=1000 causal, D=64, and f16 T=777 not
/// causal, D=128) on CUDA against the CPU's compiled templates. Where cuDNN loads, both
/// shapes run through its fused attention engines forward and backward, each shape's engine
/// config timed among those that fit and the choice cached (a fresh cache directory).
#[test]
fn large_attention_gradients_agree_with_the_cpu_on_cuda() {
    if let Some(device) = gpu() {
        let dir = std::env::temp_dir().join(format!("coil-attention-choice-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let before = coil_runtime::cuda::cudnn_sdpa::attention_plans();
        let fresh = coil::Config { cache_dir: dir.clone(), ..(*coil::config()).clone() };
        coil::with_config(fresh, || attention::grad::check_grad_large(device));
        let after = coil_runtime::cuda::cudnn_sdpa::attention_plans();
        if coil_runtime::cuda::cudnn::available() {
            assert!(after.0 >= before.0 + 4, "cuDNN attention plans (made, refused): {before:?} -> {after:?}");
            let choices = std::fs::read_dir(dir.join("cudnn")).map_or(0, |d| d.count());
            assert!(choices >= 1, "the engine configs were timed and a choice cached: {choices}");
            std::fs::remove_dir_all(&dir).unwrap();
        } else {
            println!("NOTE: cuDNN not found: attention ran on coil's templates");
        }
    }
}

/// The attention suites of the three tests above with cuDNN's attention turned off
/// (`Config::cudnn_attention`): every shape on coil's own templates.
#[test]
fn attention_templates_without_cudnn_agree_on_cuda() {
    if let Some(device) = gpu() {
        let templates = coil::Config { cudnn_attention: false, ..(*coil::config()).clone() };
        coil::with_config(templates, || {
            attention::check_all(device);
            attention::grad::check_grad_all(device);
            attention::grad::check_grad_large(device);
        });
    }
}

#[test]
fn cpu_and_cuda_tensors_in_one_op_is_an_error() {
    if let Some(device) = gpu() {
        let x = coil::Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
        let y = x.to_device(device).unwrap();
        let e = x.add(&y).unwrap_err();
        assert_eq!(e.kind, coil::ErrorKind::Device, "{e}");
        assert!(e.to_string().contains("cpu") && e.to_string().contains("cuda:0"), "{e}");
    }
}

#[test]
fn compiled_functions_run_on_cuda_with_breaks_and_guards() {
    if let Some(device) = gpu() {
        coil::set_backend(coil::Backend::Compiled);
        coil::set_eager_tier(false);
        let f = coil::compile(|a: &[coil::Tensor]| {
            let s = a[0].softmax(-1)?;
            // a host read inside the function: a graph break, the rest compiles separately
            let scale = if s.amax(&[], false)?.item::<f32>()? > 0.5 { 2.0 } else { 1.0 };
            Ok(vec![s * scale])
        });
        let x = coil::Tensor::from_vec((0..32).map(|i| (i as f32 * 0.37).sin()).collect(), &[4, 8]).unwrap();
        let on_gpu = x.to_device(device).unwrap();
        let first = f.call(&[&on_gpu]).unwrap()[0].to_vec::<f32>().unwrap();
        let again = f.call(&[&on_gpu]).unwrap()[0].to_vec::<f32>().unwrap();
        assert_eq!(first, again);
        let compiles = f.compile_count();
        f.call(&[&on_gpu]).unwrap();
        assert_eq!(f.compile_count(), compiles, "a third call with the same guards compiles nothing");
        assert_eq!(f.graph_breaks().len(), 1);
        // the same function on the CPU agrees
        coil::set_default_device(coil::Device::Cpu);
        let on_cpu = f.call(&[&x]).unwrap()[0].to_vec::<f32>().unwrap();
        for (a, b) in first.iter().zip(&on_cpu) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
    }
}

/// `scatter` / `scatter_add` (the gradients of embedding and gather) run by the device kernel:
/// every dtype it takes, repeated indices (atomic adds), a source larger than the index, against
/// the interpreter; an index out of range is an error, as on the host.
/// A training step's gradient shapes on CUDA: bf16 weight gradients cast to f32 (cuBLASLt
/// writing f32 directly) and bias gradients (column sums split into `[chunks, outputs]`
/// partials), against the interpreter.
#[test]
fn weight_and_bias_gradients_agree_with_the_interpreter_on_cuda() {
    use coil::{Backend, DType, Tensor};
    let Some(device) = gpu() else { return };
    for (rows, cols, k) in [(2048usize, 768usize, 64usize), (1026, 96, 40), (4096, 3072, 16)] {
        let run = |backend: Backend, device: coil::Device| -> (Vec<f32>, Vec<f32>) {
            coil::set_backend(backend);
            coil::set_eager_tier(false);
            coil::manual_seed(3);
            let x = Tensor::randn(&[rows, k], DType::BF16).unwrap().to_device(device).unwrap();
            let dy = Tensor::randn(&[rows, cols], DType::BF16).unwrap().to_device(device).unwrap();
            let dw = x.transpose(0, 1).unwrap().matmul(&dy).unwrap().to_dtype(DType::F32).unwrap();
            let db = dy.sum(&[0], false).unwrap().to_dtype(DType::F32).unwrap();
            (dw.to_vec::<f32>().unwrap(), db.to_vec::<f32>().unwrap())
        };
        let (want_w, want_b) = run(Backend::Interpreter, coil::Device::Cpu);
        let (got_w, got_b) = run(Backend::Compiled, device);
        // The interpreter rounds the product (and the sum) to bf16 first.
        for (what, got, want) in [("dw", got_w, want_w), ("db", got_b, want_b)] {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= 1e-2 * (1.0 + w.abs()), "{rows}x{cols}x{k} {what}[{i}]: {g} vs {w}");
            }
        }
    }
}

/// A tied embedding's gradient (GPT-2's `wte` under bf16 autocast): the product writes the
/// f32 gradient into the output's buffer (a widening epilogue, the scatter's base kept in the
/// output) and the device scatter adds the embedding's rows there in place, with ids that
/// repeat; against the interpreter (which rounds the product to bf16 first and adds after).
#[test]
fn a_tied_embedding_gradient_scattered_in_place_agrees_with_the_interpreter_on_cuda() {
    use coil::{Backend, CrossEntropyOptions, DType, Tensor};
    let Some(device) = gpu() else { return };
    let (vocab, c, n) = (1000usize, 64usize, 512usize);
    let ids: Vec<i64> = (0..n as i64).map(|i| (i * 7919) % 50).collect(); // 50 ids, each ~10 times
    let targets: Vec<i64> = (0..n as i64).map(|i| (i * 104_729) % vocab as i64).collect();
    let run = |backend: Backend, device: coil::Device| -> Vec<f32> {
        coil::set_backend(backend);
        coil::set_eager_tier(false);
        coil::manual_seed(5);
        let w = Tensor::randn(&[vocab, c], DType::F32).unwrap().mul(0.1).unwrap().to_device(device).unwrap();
        w.realize().unwrap();
        let ids = Tensor::from_vec(ids.clone(), &[n]).unwrap().to_device(device).unwrap();
        let t = Tensor::from_vec(targets.clone(), &[n]).unwrap().to_device(device).unwrap();
        let h = w.index_select(0, &ids).unwrap().tanh().unwrap().to_dtype(DType::BF16).unwrap();
        let logits = h.linear(&w.to_dtype(DType::BF16).unwrap(), None).unwrap().to_dtype(DType::F32).unwrap();
        let loss = logits.cross_entropy(&t, CrossEntropyOptions::default()).unwrap();
        let (_, g) = coil::value_and_grad(&loss, &[&w]).unwrap();
        g[0].to_vec::<f32>().unwrap()
    };
    let want = run(Backend::Interpreter, coil::Device::Cpu);
    let got = run(Backend::Compiled, device);
    let scale = want.iter().map(|w| w.abs()).fold(0f32, f32::max);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 2e-2 * scale, "wte grad [{}, {}]: {g} vs {w}", i / c, i % c);
    }
}

#[test]
fn device_scatter_agrees_with_the_interpreter() {
    use coil::{Backend, DType, Tensor};
    let Some(device) = gpu() else { return };
    // Repeated targets for the adds; distinct ones down each column for the stores (with
    // repeats, which store wins is unspecified, as in PyTorch).
    let repeated = Tensor::from_vec(vec![0i64, 3, 3, 1, 3, 0, 2, 2, 3, 3, 3, 3], &[3, 4]).unwrap();
    let distinct = Tensor::from_vec(vec![0i64, 3, 1, 4, 2, 0, 4, 1, 4, 1, 0, 2], &[3, 4]).unwrap();
    for (dtype, add) in [
        (DType::F32, true),
        (DType::F64, true),
        (DType::BF16, true),
        (DType::F16, true),
        (DType::I64, true),
        (DType::I32, true),
        (DType::F32, false),
        (DType::BF16, false),
        (DType::I64, false),
        (DType::Bool, false),
    ] {
        let index = if add { &repeated } else { &distinct };
        let run = |backend: Backend, device: coil::Device| -> Vec<f64> {
            coil::set_backend(backend);
            coil::set_eager_tier(false);
            let x = Tensor::randn(&[5, 6], DType::F32).unwrap().mul(3.0).unwrap().to_dtype(dtype).unwrap();
            let src = Tensor::randn(&[4, 5], DType::F32).unwrap().mul(3.0).unwrap().to_dtype(dtype).unwrap();
            let (x, src, index) =
                (x.to_device(device).unwrap(), src.to_device(device).unwrap(), index.to_device(device).unwrap());
            let y = if add { x.scatter_add(0, &index, &src) } else { x.scatter(0, &index, &src) };
            y.unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
        };
        coil::manual_seed(7);
        let want = run(Backend::Interpreter, coil::Device::Cpu);
        coil::manual_seed(7);
        let got = run(Backend::Compiled, device);
        let tol = if matches!(dtype, DType::BF16 | DType::F16) { 2e-2 } else { 1e-6 };
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{dtype} add={add}: element {k}: {g} vs {w}");
        }
    }
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
    let x = Tensor::zeros(&[3], DType::F32).to_device(device).unwrap();
    let bad = Tensor::from_vec(vec![0i64, 3], &[2]).unwrap().to_device(device).unwrap();
    let src = Tensor::ones(&[2], DType::F32).to_device(device).unwrap();
    let e = x.scatter_add(0, &bad, &src).and_then(|y| y.to_vec::<f32>()).unwrap_err();
    assert!(e.to_string().contains("out of bounds"), "{e}");
}

/// `cumsum` (a fallback op) run by the device kernel: every dtype it takes, along every dim of a
/// few shapes, against the interpreter (the same f64 sums, rounded per output).
#[test]
fn device_cumsum_agrees_with_the_interpreter() {
    use coil::{Backend, DType, Tensor};
    let Some(device) = gpu() else { return };
    for (shape, dims) in [(vec![5usize, 7], vec![0i64, 1]), (vec![3, 4, 6], vec![1, 2]), (vec![1000], vec![0])] {
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64] {
            for &dim in &dims {
                let run = |backend: Backend, device: coil::Device| -> Vec<f64> {
                    coil::set_backend(backend);
                    coil::set_eager_tier(false);
                    let x = Tensor::randn(&shape, DType::F32).unwrap().mul(4.0).unwrap().to_dtype(dtype).unwrap();
                    let y = x.to_device(device).unwrap().cumsum(dim).unwrap();
                    y.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
                };
                coil::manual_seed(11);
                let want = run(Backend::Interpreter, coil::Device::Cpu);
                coil::manual_seed(11);
                let got = run(Backend::Compiled, device);
                let tol = if matches!(dtype, DType::BF16 | DType::F16) { 1e-2 } else { 1e-9 };
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= tol * (1.0 + w.abs()),
                        "{dtype} {shape:?} dim {dim}: element {k}: {g} vs {w}"
                    );
                }
            }
        }
    }
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
}

/// `rand` and `randn` made on the GPU (Philox and, for normals, f64 Box-Muller written out in
/// PTX) against the interpreter's: the same streams, to within rounding in each dtype.
#[test]
fn random_tensors_match_the_interpreter_on_cuda() {
    use coil::{Backend, DType, Device, Tensor};
    let Some(device) = gpu() else { return };
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        for normal in [false, true] {
            let make = |backend: Backend, on: Device| -> Vec<f64> {
                coil::set_backend(backend);
                coil::set_eager_tier(false);
                coil::set_default_device(on);
                let t = if normal { Tensor::randn(&[3, 1000], dtype) } else { Tensor::rand(&[3, 1000], dtype) };
                coil::set_default_device(Device::Cpu);
                t.unwrap().to_vec::<f64>().unwrap()
            };
            coil::manual_seed(11);
            let want = make(Backend::Interpreter, Device::Cpu);
            coil::manual_seed(11);
            let got = make(Backend::Compiled, device);
            coil::set_backend(Backend::Compiled);
            coil::set_eager_tier(false);
            // one unit in the last place (bf16 and f16 round from f32, as the CUDA backend casts)
            let ulp = match dtype {
                DType::BF16 => 8e-3,
                DType::F16 => 1e-3,
                DType::F32 => 1.2e-7,
                _ => 1e-15,
            };
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((g - w).abs() <= ulp * w.abs().max(1e-3), "{dtype} normal={normal}: element {k}: {g} vs {w}");
            }
            assert!(got.iter().any(|&g| g != got[0]), "{dtype}: a constant tensor");
        }
    }
}

/// Dropout masks, uniform and normal numbers drawn by a compiled function on the GPU: it
/// compiles once over 10 calls, and each call draws what the interpreter draws from the same
/// seed. The streams' keys and first counters are kernel parameters: f32 values through PTX,
/// f64 ones through CUDA C (no PTX form); a key with both words set and counters crossing 2^32.
#[test]
fn compiled_random_ops_on_cuda_compile_once_and_match_the_interpreter() {
    use coil::{Backend, DType, Tensor};
    let Some(device) = gpu() else { return };
    let body = |a: &[Tensor]| -> coil::Result<Vec<Tensor>> {
        let x = &a[0];
        let wide = x.to_dtype(DType::F64)?;
        Ok(vec![x.dropout(0.25, true)?, x.rand_like()?, x.randn_like()?, wide.rand_like()?, wide.randn_like()?])
    };
    let f = coil::compile(body);
    let ones = Tensor::ones(&[3, 1000], DType::F32);
    ones.realize().unwrap();
    let on_gpu = ones.to_device(device).unwrap();
    // The same seed and a skip of 2^32 - 1500 - (call % 4) counters (a pending draw, never
    // run) before each: the draws start at every place in a uniform block of four.
    let seed_for = |call: u64| {
        coil::manual_seed(0xDEAD_BEEF_0123_4567 ^ call);
        let _skip = Tensor::rand(&[(1usize << 32) - 1500 - (call as usize % 4)], DType::F32).unwrap();
    };
    for call in 0..10 {
        seed_for(call);
        let got: Vec<Vec<f64>> = f.call(&[&on_gpu]).unwrap().iter().map(|t| t.to_vec::<f64>().unwrap()).collect();
        seed_for(call);
        coil::set_backend(Backend::Interpreter);
        let want: Vec<Vec<f64>> =
            body(std::slice::from_ref(&ones)).unwrap().iter().map(|t| t.to_vec::<f64>().unwrap()).collect();
        coil::set_backend(Backend::Compiled);
        coil::set_eager_tier(false);
        // dropout and uniform values exactly; normal ones to an ulp (f64 Box-Muller routines)
        for (k, ulp) in [(0, 0.0), (1, 0.0), (2, 1.2e-7), (3, 0.0), (4, 1e-15)] {
            for (i, (g, w)) in got[k].iter().zip(&want[k]).enumerate() {
                assert!((g - w).abs() <= ulp * w.abs().max(1e-3), "call {call} output {k} element {i}: {g} vs {w}");
            }
        }
        assert!(got[2].iter().any(|&g| g != got[2][0]), "a constant tensor");
    }
    assert_eq!((f.compile_count(), f.is_eager()), (1, false), "{:?}", f.recompile_reasons());
}

/// `zeros_like`, `ones_like`, `full_like`, `rand_like` and `randn_like` of a CUDA tensor are
/// on its device, of its dtype, whatever the thread's default device.
#[test]
fn like_constructors_stay_on_the_cuda_device() {
    use coil::{DType, Device, Tensor};
    let Some(device) = gpu() else { return };
    coil::set_default_device(Device::Cpu);
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap().to_dtype(DType::BF16).unwrap();
    let x = x.to_device(device).unwrap();
    let made = [x.zeros_like(), x.ones_like(), x.full_like(2), x.rand_like().unwrap(), x.randn_like().unwrap()];
    for t in &made {
        assert_eq!((t.device(), t.dtype()), (device, DType::BF16));
    }
    let y = x.add(&made[0]).unwrap().add(&made[1]).unwrap().mul(&made[2]).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![4.0, 6.0, 8.0]);
    assert!(made[3].to_vec::<f32>().unwrap().iter().all(|v| (0.0..1.0).contains(v)));
}

/// Integer floor and truncating division and remainder on the GPU (PTX): torch's results,
/// `i64::MIN` by -1 wrapping as the CPU does, and a zero divisor reported as an error.
#[test]
fn integer_division_and_pow_match_torch_and_report_errors_on_cuda() {
    use coil::Tensor;
    let Some(device) = gpu() else { return };
    let on = |v: Vec<i64>| Tensor::from_vec(v, &[5]).unwrap().to_device(device).unwrap();
    let (a, b) = (on(vec![7, -7, 7, -7, i64::MIN]), on(vec![2, 2, -2, -2, -1]));
    let get = |t: coil::Result<Tensor>| t.unwrap().to_vec::<i64>().unwrap();
    assert_eq!(get(a.floor_divide(&b)), [3, -4, -4, 3, i64::MIN]);
    assert_eq!(get(a.trunc_divide(&b)), [3, -3, -3, 3, i64::MIN]);
    assert_eq!(get(a.remainder(&b)), [1, 1, -1, -1, 0]);
    let zero = on(vec![2, 2, 0, 2, 2]);
    let e = a.floor_divide(&zero).and_then(|q| q.to_vec::<i64>()).unwrap_err();
    assert!(e.to_string().contains("division by zero"), "{e}");
    // integer pow: square and multiply, wrapping; a negative exponent is an error
    let (x, y) = (on(vec![3, -2, 7, 2, 0]), on(vec![4, 3, 0, 63, 0]));
    assert_eq!(get(x.pow(&y)), [81, -8, 1, i64::MIN, 1]);
    let e = x.pow(on(vec![1, 1, -1, 1, 1])).and_then(|q| q.to_vec::<i64>()).unwrap_err();
    assert!(e.to_string().contains("negative"), "{e}");
}

/// `sin`, `cos` and `tan` of f32 on the GPU (PTX: reduced in f64, through a table of
/// `2^E mod 2 pi` from `2^24` up) against the f64 functions of the same inputs, rounded: within
/// one f32 ulp, small arguments, near multiples of `pi/2` and up to `f32::MAX`.
#[test]
fn trigonometry_is_accurate_over_the_whole_f32_range_on_cuda() {
    use coil::Tensor;
    let Some(device) = gpu() else { return };
    let mut xs: Vec<f32> = vec![0.0, -0.0, 1e-30, -0.5, 1.0, 3.0, 100.0, 1e4, 16_777_215.0, 16_777_218.0, f32::MAX];
    xs.extend((1..400).map(|k| (k as f64 * std::f64::consts::FRAC_PI_2) as f32));
    for e in 0..128u32 {
        for m in [0u32, 1, 0x49_0FDB, 0x7F_FFFF, 0x25_A5A5] {
            xs.push(f32::from_bits(((e + 127) << 23) | m));
            xs.push(-f32::from_bits(((e + 127) << 23) | m));
        }
    }
    let n = xs.len();
    let x = Tensor::from_vec(xs.clone(), &[n]).unwrap().to_device(device).unwrap();
    for (name, got, f) in
        [("sin", x.sin(), f64::sin as fn(f64) -> f64), ("cos", x.cos(), f64::cos), ("tan", x.tan(), f64::tan)]
    {
        let got = got.unwrap().to_vec::<f32>().unwrap();
        for (k, (&g, &x)) in got.iter().zip(&xs).enumerate() {
            let want = f(f64::from(x));
            let ulp = (want as f32).abs().max(f32::MIN_POSITIVE) * f32::EPSILON;
            assert!(
                (f64::from(g) - want).abs() <= f64::from(ulp),
                "{name}({x:e}) = {g:e}, want {want:e} (element {k})"
            );
        }
    }
    let nan = Tensor::from_vec(vec![f32::INFINITY, f32::NAN], &[2]).unwrap().to_device(device).unwrap();
    assert!(nan.sin().unwrap().to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()));
}

/// Every pair `(x, y)` of `vals`, as the two operand lists.
fn pairs(vals: &[f32]) -> (Vec<f32>, Vec<f32>) {
    vals.iter().flat_map(|&x| vals.iter().map(move |&y| (x, y))).unzip()
}

/// `pow` of f32 on the GPU (PTX: through f64 `log` and `exp`) against Rust's `powf` (C99's
/// special cases): zeros, infinities, NaN, negative bases with integer and other exponents.
#[test]
fn pow_matches_powf_with_every_special_case_on_cuda() {
    use coil::Tensor;
    let Some(device) = gpu() else { return };
    let vals = [0.0f32, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, 1e-3, 1e3, 1e-40, 7.3, -7.3];
    let specials = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
    let all: Vec<f32> = vals.iter().chain(&specials).copied().collect();
    let (xs, ys) = pairs(&all);
    let n = xs.len();
    let on = |v: &[f32]| Tensor::from_vec(v.to_vec(), &[n]).unwrap().to_device(device).unwrap();
    let got = on(&xs).pow(on(&ys)).unwrap().to_vec::<f32>().unwrap();
    for k in 0..n {
        let want = xs[k].powf(ys[k]);
        let ok = if want.is_nan() {
            got[k].is_nan()
        } else if want == 0.0 || want.is_infinite() {
            got[k] == want && got[k].is_sign_negative() == want.is_sign_negative()
        } else {
            (got[k] - want).abs() <= 2.0 * f32::EPSILON * want.abs()
        };
        assert!(ok, "pow({:e}, {:e}) = {:e}, want {want:e}", xs[k], ys[k], got[k]);
    }
}

/// Division by a row's value (here its max) on the GPU: the PTX path takes the divisor's
/// reciprocal once (`rcp.approx` and a Newton step) and multiplies; within 2 ulp of IEEE division
/// where the reciprocal is a normal number (divisors of magnitude 2^-126 to 2^126), and IEEE's
/// zeros, infinities and NaN for divisors of zero, infinity and NaN. (Outside that range the
/// reciprocal loses bits or overflows: docs/compiler.md.)
#[test]
fn division_by_a_rows_value_matches_ieee_division_on_cuda() {
    use coil::Tensor;
    let Some(device) = gpu() else { return };
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let rows: Vec<[f32; 4]> = vec![
        [1.0, 0.5, -1.0, 0.25],
        [3.0, 1.0, 2.0, -7.0],
        [7.0, 6.9, 1e-3, -1e3],
        [-5.5, -6.0, -7.0, -100.0],
        [1e10, 1.0, 3e9, -2e10],
        [1e-10, 3e-11, -1.0, 7e-11],
        [2e-38, 1e-38, -1.0, 1.5e-38],
        [8e37, 1e37, -8e37, 7.9e37],
        [0.0, -1.0, -2.0, -0.5],
        [inf, 1.0, -1.0, 0.0],
        [-inf, -inf, -inf, -inf],
        [nan, 1.0, 2.0, 3.0],
    ];
    let n = rows.len();
    let xs: Vec<f32> = rows.iter().flatten().copied().collect();
    let x = Tensor::from_vec(xs.clone(), &[n, 4]).unwrap().to_device(device).unwrap();
    let got = x.div(x.amax(&[1], true).unwrap()).unwrap().to_vec::<f32>().unwrap();
    for (r, row) in rows.iter().enumerate() {
        let d =
            row.iter().copied().fold(f32::NEG_INFINITY, |m, v| if m.is_nan() || v.is_nan() { nan } else { m.max(v) });
        for (c, &v) in row.iter().enumerate() {
            let (g, want) = (got[r * 4 + c], v / d);
            let ok = if want.is_nan() {
                g.is_nan()
            } else if want == 0.0 || want.is_infinite() {
                g == want && g.is_sign_negative() == want.is_sign_negative()
            } else {
                (g - want).abs() <= 2.0 * f32::EPSILON * want.abs()
            };
            assert!(ok, "{v:e} / {d:e} = {g:e}, want {want:e} (row {r})");
        }
    }
}

/// Floor division and remainder of f32 on the GPU (PTX: an exact `fmod` reduced in f64) against
/// the same ops on the CPU (C's `fmodf`), bit for bit: quotients from below 1 to the whole
/// exponent range, signed zeros, infinities, NaN and zero divisors.
#[test]
fn float_floor_division_and_remainder_match_the_cpu_on_cuda() {
    use coil::Tensor;
    let Some(device) = gpu() else { return };
    let mut vals = vec![0.0f32, -0.0, 1.0, -1.0, 0.1, -0.1, 3.0, -7.5, 2.5, 1e-45, 1e-38, 16_777_217.0, 1e20, -1e-20];
    vals.extend([3.4e38, -3.4e38, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
    let (xs, ys) = pairs(&vals);
    let n = xs.len();
    let on = |v: &[f32], d: coil::Device| Tensor::from_vec(v.to_vec(), &[n]).unwrap().to_device(d).unwrap();
    type Op = fn(&Tensor, &Tensor) -> coil::Result<Tensor>;
    let ops: [(&str, Op); 2] = [("remainder", |x, y| x.remainder(y)), ("floor_divide", |x, y| x.floor_divide(y))];
    for (name, op) in ops {
        let run = |d: coil::Device| op(&on(&xs, d), &on(&ys, d)).unwrap().to_vec::<f32>().unwrap();
        let (got, want) = (run(device), run(coil::Device::Cpu));
        for k in 0..n {
            let same = got[k].to_bits() == want[k].to_bits() || (got[k].is_nan() && want[k].is_nan());
            assert!(same, "{name}({:e}, {:e}) = {:e} on cuda, {:e} on the cpu", xs[k], ys[k], got[k], want[k]);
        }
    }
}

/// Runs on the GPU return without waiting for their kernels: a data error a kernel reports
/// surfaces at the next synchronization point (`coil::synchronize`, a host read of any tensor
/// on the device), named by the user's op, its operands and its line (the kernel in
/// parentheses), as on the interpreter; the device is clean afterwards. A compiled function's
/// call returns the same way.
#[test]
fn kernel_errors_surface_at_the_next_synchronization_with_the_op_line_on_cuda() {
    use coil::{DType, Tensor};
    let Some(device) = gpu() else { return };
    let x = Tensor::ones(&[4, 3], DType::F32).to_device(device).unwrap();
    x.realize().unwrap();
    let bad = Tensor::from_vec(vec![0i64, 7], &[2]).unwrap().to_device(device).unwrap();
    let y = x.index_select(0, &bad).unwrap();
    let op_line = line!() - 1;
    y.realize().unwrap(); // enqueued: no error yet
    let z = (&x * 2.0).exp().unwrap();
    z.realize().unwrap(); // a later run
    let e = coil::synchronize().unwrap_err();
    assert!(e.to_string().contains("index 7 is out of bounds"), "{e}");
    // Named by the user's op (the kernel in parentheses), its operands and its line.
    assert!(e.op.as_deref().is_some_and(|op| op.contains("index_select")), "{e}");
    assert!(e.to_string().contains("operands: f32[4, 3], i64[2]"), "{e}");
    assert_eq!(e.location.map(|l| (l.file(), l.line())), Some((file!(), op_line)), "{e}");
    // Reported once: the device is clean, and the later run's values are right.
    coil::synchronize().unwrap();
    assert!(z.to_vec::<f32>().unwrap().iter().all(|&v| (v - 2f32.exp()).abs() < 1e-5));
    // A host read of another tensor is a synchronization point too.
    let y = x.index_select(0, &bad).unwrap();
    y.realize().unwrap();
    let w = &x + 1.0;
    let e = w.to_vec::<f32>().unwrap_err();
    assert!(e.to_string().contains("out of bounds"), "{e}");
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![2.0; 12]);
    // The call of a compiled function returns before its kernels run.
    let f = coil::compile(|a: &[Tensor]| Ok(vec![a[0].index_select(0, &a[1])?.sum_all()?]));
    let body_line = line!() - 1;
    let out = f.call(&[&x, &bad]).unwrap();
    let e = out[0].item::<f32>().unwrap_err();
    assert_eq!(e.location.map(|l| l.line()), Some(body_line), "{e}");
    // A scatter (an embedding's gradient) reports a bad index the same way.
    let table = Tensor::zeros(&[3], DType::F32).to_device(device).unwrap();
    let src = Tensor::ones(&[2], DType::F32).to_device(device).unwrap();
    let s = table.scatter_add(0, &Tensor::from_vec(vec![0i64, 3], &[2]).unwrap().to_device(device).unwrap(), &src);
    s.unwrap().realize().unwrap();
    assert!(coil::synchronize().unwrap_err().to_string().contains("out of bounds"));
}

/// Many runs without a synchronization point fill the status board; the run that finds it full
/// checks it (and reports an earlier error there); values stay right throughout.
#[test]
fn a_long_loop_without_host_reads_keeps_running_on_cuda() {
    use coil::{DType, Tensor};
    let Some(device) = gpu() else { return };
    let mut x = Tensor::zeros(&[1000], DType::F32).to_device(device).unwrap();
    // One launch (4 status words) per run: 40000 runs fill the 1 MiB board once. (Each new
    // value starts a history of its own: a chain of 40000 lazy nodes would be dropped
    // recursively.)
    for _ in 0..40_000 {
        x = Tensor::from_storage((&x + 1.0).storage().unwrap());
    }
    assert_eq!(x.to_vec::<f32>().unwrap()[999], 40_000.0);
}

/// A compiled function replayed from CUDA graphs (`cuda_graphs(true)`) computes what plain runs
/// compute, call after call: new data each call (at reused or new addresses), weights updated
/// in place between calls by an optimizer, an output fed back as the next input. The previous
/// call's outputs are stale after a replay; graphs that draw random numbers run as usual.
#[test]
fn cuda_graph_replays_match_plain_runs_on_cuda() {
    use coil::nn::{AdamW, AdamWConfig, Init, Optimizer, ParamStore};
    use coil::{DType, Tensor};
    let Some(device) = gpu() else { return };
    let train = |cuda_graphs: bool| -> Vec<f32> {
        coil::manual_seed(11);
        let store = ParamStore::new();
        let root = store.root(device, DType::F32);
        root.param("w1", &[16, 32], Init::Normal { mean: 0.0, std: 0.2 }).unwrap();
        root.param("w2", &[32, 4], Init::Normal { mean: 0.0, std: 0.2 }).unwrap();
        store.realize_pending().unwrap();
        let mut opt = AdamW::new(store.trainable(), AdamWConfig { lr: 0.01, ..Default::default() }).unwrap();
        let params = opt.params().to_vec();
        let step = coil::compile(|a: &[Tensor]| {
            let h = a[0].matmul(&params[0].tensor())?.gelu(true)?;
            let y = h.matmul(&params[1].tensor())?;
            let loss = (&y * &y).mean(&[], false)?;
            let (loss, grads) = coil::nn::value_and_grad(&loss, &params)?;
            Ok(std::iter::once(loss).chain(grads).collect())
        })
        .cuda_graphs(cuda_graphs);
        let (mut losses, mut kept) = (Vec::new(), Vec::new());
        for call in 0..6 {
            let x = Tensor::randn(&[8, 16], DType::F32).unwrap().to_device(device).unwrap();
            x.realize().unwrap();
            let out = step.call(&[&x]).unwrap();
            losses.push(out[0].item::<f32>().unwrap());
            opt.step(&out[1..]).unwrap();
            if call == 3 {
                kept.push(x); // the next inputs land elsewhere: copied into the graph's buffer
            }
        }
        losses
    };
    let (plain, replayed) = (train(false), train(true));
    for (k, (a, b)) in plain.iter().zip(&replayed).enumerate() {
        assert!((a - b).abs() <= 1e-6 * (1.0 + a.abs()), "step {k}: plain {a}, replayed {b}");
    }

    // An output fed back, and the staleness of earlier outputs.
    let f = coil::compile(|a: &[Tensor]| Ok(vec![(&a[0] * 0.5 + 1.0)])).cuda_graphs(true);
    let mut x = Tensor::zeros(&[1000], DType::F32).to_device(device).unwrap();
    let mut earlier = Vec::new();
    for _ in 0..8 {
        x = f.call(&[&x]).unwrap().remove(0);
        earlier.push(x.clone());
    }
    let want = (0..8).fold(0.0f32, |v, _| v * 0.5 + 1.0);
    assert!(x.to_vec::<f32>().unwrap().iter().all(|&v| (v - want).abs() < 1e-6));
    let e = earlier[3].to_vec::<f32>().unwrap_err();
    assert!(e.to_string().contains("overwritten"), "{e}");

    // Random numbers: new ones at every call, as without CUDA graphs.
    let d = coil::compile(|a: &[Tensor]| Ok(vec![a[0].dropout(0.5, true)?])).cuda_graphs(true);
    let ones = Tensor::ones(&[4096], DType::F32).to_device(device).unwrap();
    let draws: Vec<Vec<f32>> = (0..3).map(|_| d.call(&[&ones]).unwrap()[0].to_vec::<f32>().unwrap()).collect();
    assert!(draws[0] != draws[1] && draws[1] != draws[2]);
}

/// A graph whose run goes through the host (an integer product: cuBLASLt has none, the host
/// computes it) cannot be captured: it runs as usual, with the right values, call after call.
#[test]
fn graphs_that_cannot_be_captured_run_as_usual_on_cuda() {
    use coil::Tensor;
    let Some(device) = gpu() else { return };
    let f = coil::compile(|a: &[Tensor]| Ok(vec![(a[0].matmul(&a[0])? + 1)])).cuda_graphs(true);
    let x = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2]).unwrap().to_device(device).unwrap();
    for _ in 0..4 {
        assert_eq!(f.call(&[&x]).unwrap()[0].to_vec::<i64>().unwrap(), vec![8, 11, 16, 23]);
    }
}

/// Greedy decoding with a KV cache written in place (`update_in_place_with`, through
/// `KvCache::commit`), its realizations replayed from CUDA graphs (`coil::set_cuda_graphs`),
/// gives the tokens and logits of plain runs: the donated cache is written where it lies,
/// the fed-back token is copied into the graph's buffer, and an earlier step's logits are
/// stale after the next replay.
#[test]
fn decode_steps_replayed_from_cuda_graphs_match_plain_runs_on_cuda() {
    use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
    use coil::nn::ParamStore;
    use coil::{DType, Tensor};
    let Some(device) = gpu() else { return };
    let config = Gpt2Config {
        vocab_size: 97,
        block_size: 32,
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        dropout: 0.0,
        layer_norm_eps: 1e-5,
    };
    let decode = |replay: bool| -> (Vec<i64>, Vec<f32>, Option<coil::Error>) {
        coil::manual_seed(5);
        let store = ParamStore::new();
        store.eval();
        let model = Gpt2::new(&store.root(device, DType::F32), config).unwrap();
        store.realize_pending().unwrap();
        let was = coil::set_cuda_graphs(replay);
        let mut cache = model.new_cache(2, 24).unwrap();
        let prompt = Tensor::from_vec((0..16).map(|i| (i * 7 % 97) as i64).collect(), &[2, 8]).unwrap();
        let prompt = prompt.to_device(device).unwrap();
        let (logits, written) = model.forward_cached(&prompt, &cache.position().unwrap(), &cache).unwrap();
        let mut next = logits.argmax(Some(-1), false).unwrap().reshape(&[2, 1]).unwrap();
        cache.commit(&written, 8, &[&next]).unwrap();
        let (mut tokens, mut last, mut earlier) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..12 {
            let (logits, written) = model.forward_cached(&next, &cache.position().unwrap(), &cache).unwrap();
            next = logits.argmax(Some(-1), false).unwrap().reshape(&[2, 1]).unwrap();
            cache.commit(&written, 1, &[&next, &logits]).unwrap();
            tokens.extend(next.to_vec::<i64>().unwrap());
            last = logits.to_vec::<f32>().unwrap();
            earlier.push(logits);
        }
        coil::set_cuda_graphs(was);
        (tokens, last, earlier[3].to_vec::<f32>().err())
    };
    let (plain, replayed) = (decode(false), decode(true));
    assert_eq!(plain.0, replayed.0, "tokens");
    for (k, (a, b)) in plain.1.iter().zip(&replayed.1).enumerate() {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "logit {k}: plain {a}, replayed {b}");
    }
    assert!(plain.2.is_none(), "plain runs keep every step's logits");
    let stale = replayed.2.expect("an earlier replay's logits are stale");
    assert!(stale.to_string().contains("overwritten"), "{stale}");
}

/// The KV cache write of a decode step is a generated kernel (no scatter fallback): a tiny
/// Llama's prefill and decode steps up to the cache's last position give the CPU's logits on
/// CUDA, plain and replayed from CUDA graphs (the position read from device memory by each
/// replay, the donated cache written where it lies); a write past the end is the scatter's
/// index error, named at the line that recorded it.
#[test]
fn kv_cache_writes_at_run_time_positions_match_the_cpu_up_to_the_last_position_on_cuda() {
    use coil::nn::models::llama::{Llama, LlamaConfig};
    use coil::nn::ParamStore;
    use coil::{DType, Device, Tensor};
    let Some(gpu) = gpu() else { return };
    let capacity = 12;
    // Logits of a prefill of 7 tokens then 5 decode steps (the last at position 11).
    let decode = |device: Device, graphs: bool| -> Vec<Vec<f32>> {
        coil::manual_seed(11);
        let store = ParamStore::new();
        store.eval();
        let model = Llama::new(&store.root(device, DType::F32), LlamaConfig::tiny()).unwrap();
        store.realize_pending().unwrap();
        let was = coil::set_cuda_graphs(graphs);
        let mut cache = model.new_cache(2, capacity).unwrap();
        let prompt = Tensor::from_vec((0..14).map(|i| (i * 37 % 256) as i64).collect(), &[2, 7]).unwrap();
        let (logits, written) =
            model.forward_cached(&prompt.to_device(device).unwrap(), &cache.position().unwrap(), &cache).unwrap();
        let mut next = logits.argmax(Some(-1), false).unwrap().reshape(&[2, 1]).unwrap();
        cache.commit(&written, 7, &[&next]).unwrap();
        let mut seen = vec![];
        while cache.len() < capacity {
            let (logits, written) = model.forward_cached(&next, &cache.position().unwrap(), &cache).unwrap();
            next = logits.argmax(Some(-1), false).unwrap().reshape(&[2, 1]).unwrap();
            cache.commit(&written, 1, &[&next, &logits]).unwrap();
            seen.push(logits.to_vec::<f32>().unwrap());
        }
        coil::set_cuda_graphs(was);
        seen
    };
    let cpu = decode(Device::Cpu, false);
    for graphs in [false, true] {
        let cuda = decode(gpu, graphs);
        assert_eq!(cuda.len(), 5);
        for (step, (a, b)) in cpu.iter().zip(&cuda).enumerate() {
            for (k, (x, y)) in a.iter().zip(b).enumerate() {
                assert!((x - y).abs() <= 1e-4 * (1.0 + x.abs()), "graphs {graphs} step {step} logit {k}: {x} vs {y}");
            }
        }
    }
    // A write past the end (the models refuse one; the write alone does not): the op, its
    // operands and its line.
    let cache = Tensor::from_vec((0..64).map(|i| i as f32 + 0.5).collect(), &[1, 2, 8, 4]).unwrap();
    let (cache, new) = (cache.to_device(gpu).unwrap(), Tensor::ones(&[1, 2, 3, 4], DType::F32).to_device(gpu).unwrap());
    let pos = Tensor::from_vec(vec![6i64], &[]).unwrap().to_device(gpu).unwrap();
    let index = Tensor::iota(&[3], 0).unwrap().to_device(gpu).unwrap().add(&pos).unwrap();
    let index = index.reshape(&[1, 1, 3, 1]).unwrap().broadcast_to(&[1, 2, 3, 4]).unwrap();
    let written = cache.scatter(2, &index, &new).unwrap();
    let line = format!("{}:{}", file!(), line!() - 1);
    let e = written.to_vec::<f32>().unwrap_err().to_string();
    assert!(e.starts_with("value error in scatter") && e.contains(&line), "{e} should name scatter at {line}");
    assert!(e.contains("index 8 is out of bounds for dim 2 with size 8"), "{e}");
}

/// ResNet-sized convolutions (bf16, channels-last activations: a 3x3 stride-2 layer, a 1x1
/// projection, a grouped 3x3, and an f32 conv3d) forward and gradients on CUDA against the
/// CPU's im2col path; on CUDA each convolution is one cuDNN call each way where cuDNN loads.
#[test]
fn convolutions_through_cudnn_agree_with_the_cpu_on_cuda() {
    use coil::{ConvOptions, DType, Device};
    let Some(device) = gpu() else { return };
    let cudnn = coil_runtime::cuda::cudnn::available();
    if !cudnn {
        println!("NOTE: cuDNN not found: convolutions decompose on CUDA too");
    }
    // (input stored [N, *spatial, C], weight, stride, padding, groups, dtype)
    type Case = (&'static [usize], &'static [usize], usize, usize, usize, DType);
    let cases: [Case; 5] = [
        (&[4, 28, 28, 64], &[128, 64, 3, 3], 2, 1, 1, DType::BF16),
        // 1x1 convolutions (a projection with stride 2, a reduction) are matrix products
        // (cuBLASLt), not cuDNN calls.
        (&[4, 14, 14, 256], &[512, 256, 1, 1], 2, 0, 1, DType::BF16),
        (&[4, 7, 7, 2048], &[512, 2048, 1, 1], 1, 0, 1, DType::BF16),
        (&[2, 14, 14, 64], &[64, 16, 3, 3], 1, 1, 4, DType::BF16),
        (&[2, 6, 8, 8, 8], &[16, 8, 3, 3, 3], 1, 1, 1, DType::F32),
    ];
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
    let mut failures = Vec::new();
    for (k, &(xs, ws, stride, padding, groups, dtype)) in cases.iter().enumerate() {
        let run = |device: Device| -> coil::Result<(Vec<Vec<f64>>, String)> {
            let n = |s: &[usize]| s.iter().product::<usize>();
            let x = attention::tensor(&attention::normals(k as u64 + 1, n(xs)), xs, dtype, device)?;
            let w = attention::tensor(&attention::normals(k as u64 + 9, n(ws)), ws, dtype, device)?;
            let y = if xs.len() == 4 {
                let o = ConvOptions { stride: [stride; 2], padding: [padding; 2], groups, ..Default::default() };
                x.permute(&[0, 3, 1, 2])?.conv2d(&w, None, o)?
            } else {
                let o = ConvOptions { stride: [stride; 3], padding: [padding; 3], groups, ..Default::default() };
                x.permute(&[0, 4, 1, 2, 3])?.conv3d(&w, None, o)?
            };
            let g = attention::tensor(&attention::normals(5, n(y.shape())), y.shape(), DType::F32, device)?;
            let loss = y.to_dtype(DType::F32)?.mul(&g)?.sum_all()?;
            let (loss, grads) = coil::value_and_grad(&loss, &[&x, &w])?;
            let outputs = [&loss, &grads[0], &grads[1]];
            let ir = coil::inspect(&outputs)?.pre_fusion.clone();
            coil::realize(&outputs)?;
            Ok((outputs.iter().map(|t| t.to_vec::<f64>()).collect::<coil::Result<_>>()?, ir))
        };
        match (run(Device::Cpu), run(device)) {
            (Ok((want, _)), Ok((got, ir))) => {
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    let err = attention::rel_error(a, b);
                    if err > 2e-2 {
                        failures.push(format!("case {k}: output {i} differs from the CPU's by {err:.2e}"));
                    }
                }
                let calls = ir.matches("extern convolution").count();
                let pointwise = ws[2..].iter().all(|&d| d == 1) && padding == 0 && groups == 1;
                let want = if pointwise { 0 } else { 3 };
                if cudnn && calls != want {
                    failures.push(format!(
                        "case {k}: {calls} convolution calls (want {want}: forward and two gradients, or none for a product) in\n{ir}"
                    ));
                }
            }
            (Err(e), _) | (_, Err(e)) => failures.push(format!("case {k}: {e}")),
        }
    }
    coil::set_default_device(Device::Cpu);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Decode loops through a replayed compiled function (`CompiledFn::replay`), with and without
/// CUDA graphs, give the tokens, logits and cache of plain loops on CUDA, greedy and sampled:
/// the captured cache is written in place by every replay, the fed-back token and position are
/// bound (or copied into a CUDA graph's buffers), and the random counters advance as the body's.
#[test]
fn replayed_decode_steps_match_plain_ones_on_cuda() {
    let Some(device) = gpu() else { return };
    let sampled = coil::Sampling { temperature: 0.8, top_k: Some(5), top_p: None };
    for cuda_graphs in [false, true] {
        for name in replay::MODELS {
            replay::check_replayed_decode(name, device, &coil::Sampling::greedy(), cuda_graphs);
            replay::check_replayed_decode(name, device, &sampled, cuda_graphs);
        }
    }
}

/// `file:line` of the line before the call site of this macro.
macro_rules! line_before {
    () => {
        format!("{}:{}", file!(), line!() - 1)
    };
}

#[test]
fn data_errors_name_the_op_operands_and_line_on_cuda() {
    use coil::{DType, Tensor};
    let Some(device) = gpu() else { return };
    let on = |t: Tensor| t.to_device(device).unwrap();
    let (w, idx) = (on(Tensor::ones(&[5, 3], DType::F32)), on(Tensor::from_vec(vec![0i64, 7], &[2]).unwrap()));
    let (a, b) =
        (on(Tensor::from_vec(vec![5i64, 3], &[2]).unwrap()), on(Tensor::from_vec(vec![2i64, 0], &[2]).unwrap()));
    let x = on(Tensor::ones(&[2, 3], DType::F32));
    let (gidx, src) = (on(Tensor::from_vec(vec![0i64, 5], &[2, 1]).unwrap()), on(Tensor::ones(&[2, 1], DType::F32)));
    type Make<'a> = Box<dyn Fn() -> coil::Result<Tensor> + 'a>;
    let mut cases: Vec<(&str, &str, String, Make)> = vec![];
    let make: Make = Box::new(|| coil::embedding(&idx, &w)?.exp());
    cases.push(("index_select", "f32[5, 3], i64[2]", line_before!(), make));
    let make: Make = Box::new(|| x.gather(1, &gidx)?.exp());
    cases.push(("gather", "f32[2, 3], i64[2, 1]", line_before!(), make));
    let make: Make = Box::new(|| x.scatter_add(1, &gidx, &src)?.exp());
    cases.push(("scatter_add", "f32[2, 3], i64[2, 1], f32[2, 1]", line_before!(), make));
    let make: Make = Box::new(|| a.floor_divide(&b)?.add(1));
    cases.push(("floor_divide", "i64[2], i64[2]", line_before!(), make));
    let make: Make = Box::new(|| a.remainder(&b)?.add(1));
    cases.push(("remainder", "i64[2], i64[2]", line_before!(), make));
    let make: Make = Box::new(|| a.pow(on(Tensor::from_vec(vec![2i64, -1], &[2]).unwrap()))?.add(1));
    cases.push(("pow", "i64[2], i64[2]", line_before!(), make));
    for (op, operands, at, make) in &cases {
        let mut seen = vec![];
        // Realized (the error surfaces at the synchronization point), then inside a compiled function.
        seen.push(make().and_then(|t| t.realize()).and_then(|()| coil::synchronize()).unwrap_err());
        let f = coil::compile(|_: &[Tensor]| Ok(vec![make()?]));
        for _ in 0..3 {
            seen.push(f.call(&[]).and_then(|_| coil::synchronize()).unwrap_err());
        }
        for e in &seen {
            let msg = e.to_string();
            assert_eq!(e.kind, coil::ErrorKind::Value, "{msg}");
            assert!(msg.starts_with(&format!("value error in {op}")), "{msg} should name {op}");
            assert!(msg.contains(&format!("; operands: {operands}")), "{msg} should list {operands}");
            assert!(msg.contains(&format!(" at {at}: ")), "{msg} should point at {at}");
        }
    }
}

/// A small ResNet's three training steps (batch norms writing their running statistics in
/// place inside the compiled step, channels-last convolutions through cuDNN, SGD with momentum)
/// on CUDA agree with the CPU's: losses, parameters and running statistics.
#[test]
fn resnet_training_steps_agree_with_the_cpu_on_cuda() {
    let Some(device) = gpu() else { return };
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
    let wrong = resnet::differences_from_the_cpu(device).unwrap();
    assert!(wrong.is_empty(), "the CUDA run differs from the CPU's:\n{}", wrong.join("\n"));
}

/// As above with every convolution on cuDNN's legacy API (`Config::cudnn_api`).
#[test]
fn resnet_training_steps_on_the_legacy_cudnn_api_agree_with_the_cpu_on_cuda() {
    let Some(device) = gpu() else { return };
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
    let legacy = coil::Config { cudnn_api: coil::CudnnApi::Legacy, ..(*coil::config()).clone() };
    let wrong = coil::with_config(legacy, || resnet::differences_from_the_cpu(device)).unwrap();
    assert!(wrong.is_empty(), "the CUDA run differs from the CPU's:\n{}", wrong.join("\n"));
}

/// Two runs of the ResNet's training steps on CUDA give the same bits: losses, every step's
/// gradients, parameters and buffers (no engine or kernel sums in an order that depends on
/// timing, such as cuDNN's weight-gradient engines that split the sum by atomics).
#[test]
fn resnet_training_steps_repeat_bit_for_bit_on_cuda() {
    let Some(device) = gpu() else { return };
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
    let (first, again) = (resnet::train(device).unwrap(), resnet::train(device).unwrap());
    let mut differ = Vec::new();
    if again.losses != first.losses {
        differ.push(format!("losses {:?} then {:?}", first.losses, again.losses));
    }
    for (step, (a, b)) in again.grads.iter().zip(&first.grads).enumerate() {
        for (i, (a, b)) in a.iter().zip(b).enumerate().filter(|(_, (a, b))| a != b) {
            differ.push(format!("step {step} gradient {i} ({} values): {:.2e}", a.len(), attention::rel_error(a, b)));
        }
    }
    for (i, (a, b)) in again.state.iter().zip(&first.state).enumerate().filter(|(_, (a, b))| a != b) {
        differ.push(format!("parameter or buffer {i}: {:.2e}", attention::rel_error(a, b)));
    }
    assert!(differ.is_empty(), "a second run differs from the first:\n{}", differ.join("\n"));
}

/// `scatter_add` with repeated indices on CUDA, an embedding's gradient: rows of `src` added
/// to the rows of a table by token ids, a few ids hundreds of times. Two runs give the same
/// bits, and they are the interpreter's, which adds each destination's sources in index order
/// as the sorted scatter does: by an expanded index (one sort of the ids, the rows kernel), by
/// the same index materialized (a sort per column), f32 and bf16; and an embedding's gradient
/// through `value_and_grad`.
#[test]
fn scatter_add_with_repeated_indices_repeats_bit_for_bit_on_cuda() {
    use coil::{Backend, DType, Device, Tensor};
    let Some(device) = gpu() else { return };
    let (vocab, c, n) = (3000usize, 768usize, 4096usize);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    // A quarter of the ids one of 3 (runs of about 340 rows), the rest over the vocabulary.
    let ids: Vec<i64> = (0..n)
        .map(|_| next())
        .map(|h| if h % 4 == 0 { (h / 4 % 3) as i64 } else { (h % vocab as u64) as i64 })
        .collect();
    let mut values = |len: usize| -> Vec<f32> {
        let magnitude = |h: u64| 0.25 + (h % 1000) as f32 / 1000.0 * 1.75; // never zero
        (0..len).map(|_| next()).map(|h| if h & 1 == 0 { magnitude(h >> 1) } else { -magnitude(h >> 1) }).collect()
    };
    let (table, rows) = (values(vocab * c), values(n * c));
    let wide: Vec<i64> = ids.iter().flat_map(|&i| std::iter::repeat_n(i, c)).collect();
    let bits = |t: Tensor| -> Vec<u32> {
        t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
    };
    let first_difference = |a: &[u32], b: &[u32]| {
        a.iter().zip(b).position(|(x, y)| x != y).map(|k| {
            let (x, y) = (f32::from_bits(a[k]), f32::from_bits(b[k]));
            format!("element [{}, {}]: {x:e} vs {y:e}", k / c, k % c)
        })
    };
    for dtype in [DType::F32, DType::BF16] {
        for expanded in [true, false] {
            let run = |backend: Backend, device: Device| -> Vec<u32> {
                coil::set_backend(backend);
                coil::set_eager_tier(false);
                let on = |v: &[f32], shape: &[usize]| {
                    Tensor::from_vec(v.to_vec(), shape).unwrap().to_device(device).unwrap().to_dtype(dtype).unwrap()
                };
                let (x, src) = (on(&table, &[vocab, c]), on(&rows, &[n, c]));
                let index = if expanded {
                    let ids = Tensor::from_vec(ids.clone(), &[n, 1]).unwrap().to_device(device).unwrap();
                    ids.expand(&[n as i64, c as i64]).unwrap()
                } else {
                    Tensor::from_vec(wide.clone(), &[n, c]).unwrap().to_device(device).unwrap()
                };
                bits(x.scatter_add(0, &index, &src).unwrap())
            };
            let what = format!("{dtype}, {} index", if expanded { "expanded" } else { "materialized" });
            let (first, again) = (run(Backend::Compiled, device), run(Backend::Compiled, device));
            if let Some(d) = first_difference(&first, &again) {
                panic!("{what}: the second run differs from the first at {d}");
            }
            if let Some(d) = first_difference(&first, &run(Backend::Interpreter, Device::Cpu)) {
                panic!("{what}: CUDA differs from the interpreter at {d}");
            }
        }
    }
    let grad = |backend: Backend, device: Device| -> Vec<u32> {
        coil::set_backend(backend);
        coil::set_eager_tier(false);
        let w = Tensor::from_vec(table.clone(), &[vocab, c]).unwrap().to_device(device).unwrap();
        w.realize().unwrap();
        let ids = Tensor::from_vec(ids.clone(), &[n]).unwrap().to_device(device).unwrap();
        let weights = Tensor::from_vec(rows.clone(), &[n, c]).unwrap().to_device(device).unwrap();
        let loss = w.index_select(0, &ids).unwrap().mul(&weights).unwrap().sum(&[], false).unwrap();
        let (_, g) = coil::value_and_grad(&loss, &[&w]).unwrap();
        bits(g[0].clone())
    };
    let (first, again) = (grad(Backend::Compiled, device), grad(Backend::Compiled, device));
    if let Some(d) = first_difference(&first, &again) {
        panic!("the embedding's gradient: the second run differs from the first at {d}");
    }
    let want = grad(Backend::Interpreter, Device::Cpu);
    for (k, (g, w)) in first.iter().zip(&want).enumerate() {
        let (g, w) = (f32::from_bits(*g), f32::from_bits(*w));
        assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "the embedding's gradient [{}, {}]: {g} vs {w}", k / c, k % c);
    }
}

/// Two runs of a small GPT-2's training steps under bf16 autocast on CUDA give the same bits:
/// attention's backward through cuDNN (or the templates), the tied embedding's gradient by the
/// sorted scatter (token ids repeat), clipping and AdamW. A run-dependent order of sums
/// anywhere (atomics) shows as a difference here.
#[test]
fn gpt2_training_steps_repeat_bit_for_bit_on_cuda() {
    use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
    use coil::nn::{clip_grad_norm, AdamW, AdamWConfig, Optimizer, ParamStore, Precision};
    use coil::{DType, Tensor};
    let Some(device) = gpu() else { return };
    let config = Gpt2Config::tiny();
    let train = || -> coil::Result<(Vec<f32>, Vec<Vec<f32>>)> {
        coil::manual_seed(3);
        let store = ParamStore::new();
        store.set_precision(Precision::autocast(DType::BF16));
        let model = Gpt2::new(&store.root(device, DType::F32), config)?;
        store.realize_pending()?;
        // Few distinct ids, so the embedding's gradient adds many rows into each.
        let ids = |k: i64| Tensor::from_vec((0..256).map(|i| (i * k % 11) * 7).collect(), &[2, 128]);
        let (x, y) = (ids(5)?.to_device(device)?, ids(3)?.to_device(device)?);
        let adamw = AdamWConfig { lr: 1e-3, betas: (0.9, 0.95), eps: 1e-8, weight_decay: 0.1, amsgrad: false };
        let mut opt = AdamW::new(store.trainable(), adamw)?;
        let order = opt.params().to_vec();
        let grads = coil::compile(|a: &[Tensor]| {
            let (loss, grads) = coil::nn::value_and_grad(&model.loss(&a[0], &a[1])?, &order)?;
            Ok(std::iter::once(loss).chain(grads).collect())
        });
        let mut losses = Vec::new();
        for _ in 0..3 {
            let out = grads.call(&[&x, &y])?;
            losses.push(out[0].item::<f32>()?);
            let (clipped, _norm) = clip_grad_norm(&out[1..], 1.0)?;
            opt.step(&clipped)?;
        }
        let state = store.params().iter().map(|p| p.tensor().to_vec::<f32>()).collect::<coil::Result<_>>()?;
        Ok((losses, state))
    };
    let (first, again) = (train().unwrap(), train().unwrap());
    assert!(first.0.iter().all(|l| l.is_finite()), "losses {:?}", first.0);
    assert_eq!(first.0, again.0, "losses");
    let differ: Vec<usize> = (0..first.1.len()).filter(|&i| first.1[i] != again.1[i]).collect();
    assert!(differ.is_empty(), "parameters {differ:?} differ between two runs");
}

/// The premise of the ResNet lockstep tests, checked on the CPU (it runs everywhere): at each
/// step, a nudge of 1e-7 to 1e-6 of every parameter (a device's rounding is about 6e-8) moves
/// no gradient by more than a quarter of the tests' 1e-4 bound. With the model's former seed,
/// steps 1 and 2 sat at a discontinuity (a nudge of 1e-7 moved a gradient by 8.5e-3), and the
/// legacy-cuDNN test failed on the machines whose algorithms rounded across it.
#[test]
fn resnet_lockstep_states_are_well_conditioned() {
    coil::set_backend(coil::Backend::Compiled);
    for (rel, noise) in [(1e-7, 1), (3e-7, 2), (1e-6, 3)] {
        let moved = resnet::gradient_movement(rel, noise).unwrap();
        assert!(moved.iter().all(|m| *m < 2.5e-5), "a nudge of {rel:e} moved the gradients by {moved:?}");
    }
}
