//! `coil::nn` against PyTorch: every module's forward pass and gradients, SGD and AdamW steps
//! (momentum, Nesterov, weight decay, AMSGrad, clipping, a schedule), a tiny GPT-2 loaded from
//! Hugging Face's checkpoint layouts (forward, loss, gradients), and three AdamW steps of it.
//! The data is `tests/golden_nn/nn.safetensors` (`tests/golden_nn/README.md` says what each
//! tensor is; `make_golden.py` makes it).

mod common;

use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
use coil::nn::{
    clip_grad_norm, AdamW, AdamWConfig, CausalSelfAttention, Embedding, GatedMlp, Init, LayerNorm, Linear, LoadOptions,
    LrSchedule, Mlp, Module, Optimizer, ParamStore, Path, RmsNorm, Rotary, Sgd, SgdConfig, WarmupCosine,
};
use coil::{DType, Device, Tensor};
use common::assert_close;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Tests that compile graphs hold this lock, and the one that counts compiles (process-wide)
/// holds it too, so that no other test compiles meanwhile.
static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden_nn");

fn golden() -> &'static BTreeMap<String, Tensor> {
    static DATA: OnceLock<BTreeMap<String, Tensor>> = OnceLock::new();
    DATA.get_or_init(|| coil::safetensors::load(format!("{DIR}/nn.safetensors"), Device::Cpu).expect("golden data"))
}

fn g(name: &str) -> Tensor {
    golden().get(name).unwrap_or_else(|| panic!("no golden tensor {name}")).clone()
}

/// f32 against PyTorch's f32: a few roundings apart.
const TOL: f64 = 2e-6;

fn root(store: &ParamStore) -> Path {
    store.root(Device::Cpu, DType::F32)
}

/// Sets every parameter of `store` to the case's `param.<name>`.
fn set_params(store: &ParamStore, case: &str) {
    for p in store.params() {
        p.set(g(&format!("{case}.param.{}", p.name()))).unwrap();
    }
}

/// Runs `module` on `case.in.x`, checks `case.out.y`, then the gradients of `sum(y * upstream)`
/// with respect to every parameter and `x` against `case.grad.*`.
fn check_module(case: &str, store: &ParamStore, module: &dyn Module, input: &str) {
    set_params(store, case);
    let x = g(&format!("{case}.in.{input}"));
    let y = module.forward(&x).unwrap();
    assert_close(&format!("{case} forward"), &y, &g(&format!("{case}.out.y")), TOL);
    let loss = y.mul(g(&format!("{case}.in.upstream"))).unwrap().sum(&[], false).unwrap();
    let params = store.params();
    let mut wrt: Vec<Tensor> = params.iter().map(|p| p.tensor()).collect();
    let float_input = x.dtype().is_float();
    if float_input {
        wrt.push(x.clone());
    }
    let grads = coil::grad(&loss, &wrt.iter().collect::<Vec<_>>()).unwrap();
    for (p, grad) in params.iter().zip(&grads) {
        assert_close(&format!("{case} d/d{}", p.name()), grad, &g(&format!("{case}.grad.{}", p.name())), TOL);
    }
    if float_input {
        assert_close(&format!("{case} d/d{input}"), &grads[params.len()], &g(&format!("{case}.grad.{input}")), TOL);
    }
}

#[test]
fn layers_match_pytorch_forward_and_backward() {
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let s = ParamStore::new();
    check_module("linear", &s, &Linear::new(&root(&s), 5, 7, true).unwrap(), "x");
    let s = ParamStore::new();
    check_module("linear_nobias", &s, &Linear::new(&root(&s), 5, 7, false).unwrap(), "x");
    let s = ParamStore::new();
    check_module("embedding", &s, &Embedding::new(&root(&s), 11, 6).unwrap(), "idx");
    let s = ParamStore::new();
    check_module("layer_norm", &s, &LayerNorm::new(&root(&s), 8, 1e-5).unwrap(), "x");
    let s = ParamStore::new();
    check_module("rms_norm", &s, &RmsNorm::new(&root(&s), 8, Some(1e-6)).unwrap(), "x");
}

#[test]
fn transformer_pieces_match_pytorch_forward_and_backward() {
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let s = ParamStore::new();
    let attn = CausalSelfAttention::gpt2(&root(&s).pp("attn"), 16, 4, 0.0, 0.02).unwrap();
    check_module("gpt2_attention", &s, &attn, "x");
    let s = ParamStore::new();
    check_module("gpt2_mlp", &s, &Mlp::gpt2(&root(&s).pp("mlp"), 16, 0.0, 0.02).unwrap(), "x");
    let s = ParamStore::new();
    check_module("swiglu_mlp", &s, &GatedMlp::new(&root(&s), 8, 24).unwrap(), "x");
}

#[test]
fn rotary_embeddings_match_hugging_face_llama() {
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let rope = Rotary::new(8, 5, 10000.0, Device::Cpu).unwrap();
    let (q, k) = (g("rotary.in.q"), g("rotary.in.k"));
    let (q_rot, k_rot) = (rope.apply(&q, 0).unwrap(), rope.apply(&k, 0).unwrap());
    assert_close("q_rot", &q_rot, &g("rotary.out.q_rot"), TOL);
    assert_close("k_rot", &k_rot, &g("rotary.out.k_rot"), TOL);
    let loss = q_rot
        .mul(g("rotary.in.upstream_q_rot"))
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .add(k_rot.mul(g("rotary.in.upstream_k_rot")).unwrap().sum(&[], false).unwrap())
        .unwrap();
    let grads = coil::grad(&loss, &[&q, &k]).unwrap();
    assert_close("d/dq", &grads[0], &g("rotary.grad.q"), TOL);
    assert_close("d/dk", &grads[1], &g("rotary.grad.k"), TOL);
}

fn tiny_config() -> Gpt2Config {
    Gpt2Config { vocab_size: 37, block_size: 8, n_layer: 2, n_head: 2, n_embd: 16, dropout: 0.0, layer_norm_eps: 1e-5 }
}

/// The tiny GPT-2 with the weights of a Hugging Face checkpoint file.
fn tiny_gpt2(file: &str) -> (ParamStore, Gpt2) {
    let store = ParamStore::new();
    let model = Gpt2::new(&root(&store), tiny_config()).unwrap();
    let rename = |n: &str| Gpt2Config::hf_name(n);
    store.load_with(format!("{DIR}/{file}"), &LoadOptions { rename: Some(&rename), ..Default::default() }).unwrap();
    (store, model)
}

#[test]
fn gpt2_loads_both_hugging_face_layouts_and_matches_its_logits_loss_and_gradients() {
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    for file in ["gpt2_tiny_hf.safetensors", "gpt2_tiny_hf_prefixed.safetensors"] {
        let (store, model) = tiny_gpt2(file);
        let file_config = Gpt2Config::from_hf(&coil::safetensors::WeightFile::open(format!("{DIR}/{file}")).unwrap());
        assert_eq!(file_config.unwrap(), Gpt2Config { n_head: 0, ..tiny_config() }, "sizes read from {file}");
        let (idx, targets) = (g("gpt2_tiny.in.idx"), g("gpt2_tiny.in.targets"));
        assert_close("logits", &model.forward(&idx).unwrap(), &g("gpt2_tiny.out.logits"), TOL);
        let loss = model.loss(&idx, &targets).unwrap();
        let (loss, grads) = coil::nn::value_and_grad(&loss, &store.params()).unwrap();
        assert_close("loss", &loss, &g("gpt2_tiny.out.loss"), TOL);
        for (p, grad) in store.params().iter().zip(&grads) {
            assert_close(&format!("d loss / d {}", p.name()), grad, &g(&format!("gpt2_tiny.grad.{}", p.name())), 1e-5);
        }
    }
}

#[test]
fn gpt2_trained_three_adamw_steps_matches_pytorch_and_its_loss_goes_down() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (store, model) = tiny_gpt2("gpt2_tiny_hf.safetensors");
    let params = store.trainable();
    let (decay, no_decay): (Vec<_>, Vec<_>) = params.iter().cloned().partition(|p| p.shape().len() >= 2);
    let config = AdamWConfig { lr: 1e-3, betas: (0.9, 0.95), eps: 1e-8, weight_decay: 0.1, amsgrad: false };
    let mut opt = AdamW::with_groups(vec![(decay, 0.1), (no_decay, 0.0)], config).unwrap();
    let order = opt.params().to_vec();
    let step = coil::compile(|a: &[Tensor]| {
        let (loss, grads) = coil::nn::value_and_grad(&model.loss(&a[0], &a[1])?, &order)?;
        Ok(std::iter::once(loss).chain(grads).collect())
    });
    for s in 0..3 {
        let out = step.call(&[
            &g(&format!("gpt2_tiny_train.in.idx.step{s}")),
            &g(&format!("gpt2_tiny_train.in.targets.step{s}")),
        ]);
        let out = out.unwrap();
        assert_close(&format!("loss at step {s}"), &out[0], &g(&format!("gpt2_tiny_train.out.loss.step{s}")), TOL);
        opt.step(&out[1..]).unwrap();
    }
    assert_eq!(step.compile_count(), 1, "the training step compiles once");
    let after = model.loss(&g("gpt2_tiny_train.in.idx.step0"), &g("gpt2_tiny_train.in.targets.step0")).unwrap();
    assert_close("loss after", &after, &g("gpt2_tiny_train.out.loss_after.batch0"), 1e-5);
    assert!(after.item::<f32>().unwrap() < g("gpt2_tiny_train.out.loss.step0").item::<f32>().unwrap());
    for p in store.params() {
        let want = g(&format!("gpt2_tiny_train.out.final.{}", p.name()));
        let (got, want) = (p.tensor().to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        // The key third of c_attn's bias has no gradient in exact arithmetic: AdamW turns each
        // side's rounding noise into steps of up to lr (README), so it gets lr per step.
        let noise = |i: usize| p.name().ends_with("attn.c_attn.bias") && (16..32).contains(&i);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            let tol = if noise(i) { 3e-3 } else { 2e-5 + 2e-5 * b.abs() };
            assert!((a - b).abs() <= tol, "{}[{i}]: {a} vs {b}", p.name());
        }
    }
}

/// Two parameters of an optimizer case, from `in.param0` and `in.param1`.
fn two_params(case: &str) -> (ParamStore, Vec<coil::nn::Param>) {
    let store = ParamStore::new();
    let r = root(&store);
    let params = vec![r.param("param0", &[3, 4], Init::Zeros).unwrap(), r.param("param1", &[4], Init::Zeros).unwrap()];
    for (i, p) in params.iter().enumerate() {
        // A copy: the optimizer writes over its parameters' buffers, which must not be the
        // golden data's (that would make it stale for the next test).
        let t = g(&format!("{case}.in.param{i}"));
        p.set(Tensor::from_vec(t.to_vec::<f32>().unwrap(), t.shape()).unwrap()).unwrap();
    }
    (store, params)
}

fn grads(case: &str, step: usize) -> Vec<Tensor> {
    (0..2).map(|i| g(&format!("{case}.in.grad{i}.step{step}"))).collect()
}

#[test]
fn sgd_steps_match_torch_optim() {
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let cases = [
        ("sgd_plain", SgdConfig { lr: 0.1, ..Default::default() }),
        ("sgd_momentum", SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() }),
        ("sgd_nesterov", SgdConfig { lr: 0.1, momentum: 0.9, nesterov: true, ..Default::default() }),
        (
            "sgd_wd_momentum_dampening",
            SgdConfig { lr: 0.1, momentum: 0.9, dampening: 0.1, weight_decay: 0.01, nesterov: false },
        ),
    ];
    for (case, config) in cases {
        let (_store, params) = two_params(case);
        let mut sgd = Sgd::new(params.clone(), config).unwrap();
        for s in 0..5 {
            sgd.step(&grads(case, s)).unwrap();
            for (i, p) in params.iter().enumerate() {
                assert_close(
                    &format!("{case} param{i} step {s}"),
                    &p.tensor(),
                    &g(&format!("{case}.out.param{i}.step{s}")),
                    TOL,
                );
            }
            for (i, (_, buf)) in sgd.state().iter().enumerate() {
                let want = g(&format!("{case}.out.momentum_buffer{i}.step{s}"));
                assert_close(&format!("{case} momentum{i} step {s}"), buf, &want, TOL);
            }
        }
    }
}

#[test]
fn adamw_steps_match_torch_optim_with_clipping_amsgrad_and_a_schedule() {
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let ours = AdamWConfig { lr: 1e-2, betas: (0.9, 0.95), eps: 1e-8, weight_decay: 0.1, amsgrad: false };
    let cases = [
        ("adamw_defaults", AdamWConfig::default()),
        ("adamw", ours),
        ("adamw_amsgrad", AdamWConfig { amsgrad: true, ..ours }),
        ("adamw_clip", ours),
        ("adamw_schedule", ours),
    ];
    let schedule = WarmupCosine { max_lr: 1e-2, min_lr: 1e-3, warmup: 2, total: 4 };
    for (case, config) in cases {
        let (_store, params) = two_params(case);
        let mut opt = AdamW::new(params.clone(), config).unwrap();
        for s in 0..5 {
            let mut step_grads = grads(case, s);
            if case == "adamw_clip" {
                let (clipped, norm) = clip_grad_norm(&step_grads, 0.5).unwrap();
                assert_close(&format!("norm step {s}"), &norm, &g(&format!("{case}.out.grad_norm.step{s}")), TOL);
                for (i, c) in clipped.iter().enumerate() {
                    assert_close("clipped", c, &g(&format!("{case}.out.clipped_grad{i}.step{s}")), TOL);
                }
                step_grads = clipped;
            }
            if case == "adamw_schedule" {
                let want = g(&format!("{case}.out.lr.step{s}")).item::<f64>().unwrap();
                assert!((schedule.lr(s as u64) - want).abs() < 1e-12, "lr at step {s}");
                opt.set_lr(schedule.lr(s as u64));
            }
            opt.step(&step_grads).unwrap();
            let state: BTreeMap<String, Tensor> = opt.state().into_iter().collect();
            for (i, p) in params.iter().enumerate() {
                let at = |what: &str| g(&format!("{case}.out.{what}{i}.step{s}"));
                assert_close(&format!("{case} param{i} step {s}"), &p.tensor(), &at("param"), TOL);
                assert_close(&format!("{case} exp_avg{i}"), &state[&format!("param{i}.exp_avg")], &at("exp_avg"), TOL);
                assert_close(
                    &format!("{case} exp_avg_sq{i}"),
                    &state[&format!("param{i}.exp_avg_sq")],
                    &at("exp_avg_sq"),
                    TOL,
                );
                if config.amsgrad {
                    let max = &state[&format!("param{i}.max_exp_avg_sq")];
                    assert_close(&format!("{case} max_exp_avg_sq{i}"), max, &at("max_exp_avg_sq"), TOL);
                }
            }
        }
    }
}

#[test]
fn an_optimizer_step_compiles_once_and_writes_over_the_old_parameters() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (_store, params) = two_params("adamw");
    let mut opt = AdamW::new(params.clone(), AdamWConfig::default()).unwrap();
    let mut old = params[0].tensor();
    let mut after_first = 0;
    for s in 0..4 {
        opt.set_lr(1e-3 * (s + 1) as f64);
        opt.step(&grads("adamw", s)).unwrap();
        // The old handle stands for the updated parameter, as a PyTorch reference does.
        assert_eq!(old.to_vec::<f32>().unwrap(), params[0].tensor().to_vec::<f32>().unwrap());
        old = params[0].tensor();
        if s == 0 {
            after_first = coil::compile_count();
        }
    }
    // Later steps (new learning rates, bias corrections) reuse the first step's graph.
    assert_eq!(coil::compile_count(), after_first);
}

#[test]
fn loading_a_file_that_does_not_fit_reports_every_problem_and_changes_nothing() {
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("coil-nn-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("other.safetensors");
    let other = ParamStore::new();
    let r = root(&other);
    r.pp("fc").param("weight", &[2, 3], Init::Ones).unwrap();
    r.pp("fc").param("extra", &[1], Init::Ones).unwrap();
    r.pp("ln").with_dtype(DType::F64).param("weight", &[4], Init::Ones).unwrap();
    other.save(&file, &[]).unwrap();

    let store = ParamStore::new();
    let r = root(&store);
    let w = r.pp("fc").param("weight", &[3, 2], Init::Const(7.0)).unwrap();
    r.pp("fc").param("bias", &[3], Init::Zeros).unwrap();
    r.pp("ln").param("weight", &[4], Init::Zeros).unwrap();
    let e = store.load(&file).unwrap_err().to_string();
    for part in [
        "unexpected: 'fc.extra'",
        "missing: 'fc.bias'",
        "shape mismatch: 'fc.weight' is [2, 3] in the file, [3, 2] expected",
        "dtype mismatch: 'ln.weight' is f64 in the file, f32 expected",
        "tests/nn.rs",
    ] {
        assert!(e.contains(part), "{part} in: {e}");
    }
    assert_eq!(w.tensor().to_vec::<f32>().unwrap(), vec![7.0; 6], "nothing half-loaded");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dropout_modules_follow_train_and_eval_mode() {
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let store = ParamStore::new();
    let drop = coil::nn::Dropout::new(&root(&store), 0.5);
    let x = Tensor::ones(&[64], DType::F32);
    let train = drop.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert!(train.contains(&0.0) && train.contains(&2.0));
    store.eval();
    assert_eq!(drop.forward(&x).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 64]);
}

#[test]
fn bf16_attention_gradients_stay_within_bf16_rounding_of_f32() {
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    // Gradients of half-precision attention take their products in bf16 (tensor cores): they
    // must stay within bf16's rounding of the f32 computation.
    let (q, k, v) = (g("rotary.in.q"), g("rotary.in.k"), g("rotary.in.upstream_k_rot"));
    let attn = |q: &Tensor, k: &Tensor, v: &Tensor| coil::scaled_dot_product_attention(q, k, v, None, true, None);
    let up = g("rotary.in.upstream_q_rot");
    let loss = |y: Tensor| y.to_dtype(DType::F32).unwrap().mul(&up).unwrap().sum(&[], false).unwrap();
    let want = coil::grad(&loss(attn(&q, &k, &v).unwrap()), &[&q, &k, &v]).unwrap();
    let half: Vec<Tensor> = [&q, &k, &v].iter().map(|t| t.to_dtype(DType::BF16).unwrap()).collect();
    let got = coil::grad(&loss(attn(&half[0], &half[1], &half[2]).unwrap()), &[&half[0], &half[1], &half[2]]).unwrap();
    for (name, (a, b)) in ["q", "k", "v"].iter().zip(got.iter().zip(&want)) {
        assert_close(&format!("d/d{name} in bf16"), &a.to_dtype(DType::F32).unwrap(), b, 3e-2);
    }
}

#[test]
fn decoding_with_a_kv_cache_gives_the_full_forward_logits_and_compiles_once() {
    // Counts compiles: tier 0's background compiles would land in the count at any time.
    coil::set_eager_tier(false);
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let (_store, model) = tiny_gpt2("gpt2_tiny_hf.safetensors");
    let idx = g("gpt2_tiny.in.idx");
    let full = model.forward(&idx).unwrap(); // [2, 8, 37]
    let full: Vec<Tensor> = (0..8).map(|t| full.select(1, t).unwrap()).collect();
    coil::realize(&full.iter().collect::<Vec<_>>()).unwrap();
    let mut cache = model.new_cache(2, 8).unwrap();
    // Prefill 5 tokens, then decode the other 3 one at a time.
    let (logits, written) =
        model.forward_cached(&idx.narrow(1, 0, 5).unwrap(), &cache.position().unwrap(), &cache).unwrap();
    cache.commit(&written, 5, &[&logits]).unwrap();
    assert_close("prefill logits", &logits, &full[4], TOL);
    let mut after_first = 0;
    let ids = idx.to_vec::<i64>().unwrap();
    for t in 5..8 {
        // The next tokens come from the host, as a sampler gives them.
        let next = Tensor::from_vec(vec![ids[t], ids[8 + t]], &[2, 1]).unwrap();
        let (logits, written) = model.forward_cached(&next, &cache.position().unwrap(), &cache).unwrap();
        let before = (cache.k[1].clone(), cache.v[0].clone());
        cache.commit(&written, 1, &[&logits]).unwrap();
        assert_close(&format!("logits at {t}"), &logits, &full[t], TOL);
        // The step's scatter wrote over the cache's buffers: the old handles read the new values.
        for (old, new) in [(&before.0, &cache.k[1]), (&before.1, &cache.v[0])] {
            assert_eq!(old.to_vec::<f32>().unwrap(), new.to_vec::<f32>().unwrap());
        }
        if t == 5 {
            after_first = coil::compile_count();
        }
    }
    assert_eq!(coil::compile_count(), after_first, "later decode steps reuse the first one's graph");
    assert_eq!(cache.len(), 8);
    assert!(cache.commit(&[], 1, &[]).is_err(), "a full cache says so");
}

/// A decode step (GPT-2: one row per head; Llama: 2 grouped-query rows per key/value head)
/// runs each layer's attention as one template call over the cache with the mask's rule (keys
/// up to the position): no buffer of the `[B, H, rows, capacity]` scores in the compiled graph.
#[test]
fn decode_steps_run_attention_as_one_masked_template_call_per_layer() {
    use coil::nn::models::llama::{Llama, LlamaConfig};
    use coil::nn::models::CausalLm;
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    coil::manual_seed(7);
    let (gpt2_store, llama_store) = (ParamStore::new(), ParamStore::new());
    let gpt2: Box<dyn CausalLm> = Box::new(Gpt2::new(&root(&gpt2_store), Gpt2Config::tiny()).unwrap());
    let llama: Box<dyn CausalLm> = Box::new(Llama::new(&root(&llama_store), LlamaConfig::tiny()).unwrap());
    gpt2_store.realize_pending().unwrap();
    llama_store.realize_pending().unwrap();
    let (batch, capacity) = (2usize, 40usize);
    // (model, layers, key/value heads, rows per key/value head)
    for (model, layers, kv_heads, rows) in [(gpt2, 2, 2, 1), (llama, 2, 2, 2)] {
        let cache = model.new_cache(batch, capacity).unwrap();
        let token = Tensor::from_vec(vec![3i64, 5], &[2, 1]).unwrap();
        let (logits, _) = model.forward_cached(&token, &cache.position().unwrap(), &cache).unwrap();
        let compiled = coil::inspect(&[&logits]).unwrap();
        let ir = &compiled.pre_fusion;
        assert_eq!(ir.matches("extern attention").count(), layers, "{ir}");
        // Keys up to the position, the same for every row: the mask is its rule.
        assert_eq!(ir.matches(" mask_rule=key<=offset+row%1(").count(), layers, "the mask's rule: {ir}");
        let coil::Executable::Cpu(graph) = &compiled.executable else { panic!("a CPU graph") };
        let scores = batch * kv_heads * rows * capacity;
        let found = graph
            .program()
            .buffers
            .iter()
            .find(|b| b.meta.numel() >= scores && b.meta.shape.ends_with(&[rows, capacity]));
        assert!(found.is_none(), "a buffer of the scores: {:?}", found.map(|b| (&b.name, &b.meta)));
        // The cache writes are generated code: each layer's new keys (after the rotary
        // embedding, computed in the same kernel) and values are stored into the cache at the
        // position read when the kernel runs, by one pointwise kernel; no scatter fallback.
        let kernels = &graph.schedule().kernels;
        let fallbacks: Vec<&str> = kernels.iter().filter(|k| k.name.contains("fallback")).map(|k| &*k.name).collect();
        assert!(fallbacks.is_empty(), "fallback calls: {fallbacks:?}");
        let program = graph.program();
        let writes: Vec<&coil_ir::kernel::FusedKernel> =
            kernels.iter().filter(|k| k.nodes.iter().any(|&n| program.nodes[n].scatter().is_some())).collect();
        assert_eq!(writes.len(), layers, "one kernel writes each layer's keys and values: {writes:?}");
        assert!(writes.iter().all(|k| k.nodes.len() == 2 && k.stores.len() == 2), "{writes:?}");
    }
}

#[test]
fn llama_loads_a_hugging_face_checkpoint_and_matches_its_logits_cached_or_not() {
    use coil::nn::models::llama::{Llama, LlamaConfig};
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let config = std::fs::read_to_string(format!("{DIR}/llama_tiny/config.json")).unwrap();
    let config = LlamaConfig::from_hf_json(&config).unwrap();
    assert_eq!((config.n_head, config.n_kv_head, config.tie_word_embeddings), (4, 2, false));
    let store = ParamStore::new();
    let model = Llama::new(&root(&store), config).unwrap();
    store.load(format!("{DIR}/llama_tiny/model.safetensors")).unwrap();
    let golden = coil::safetensors::load(format!("{DIR}/llama_tiny_golden.safetensors"), Device::Cpu).unwrap();
    let (idx, want) = (&golden["idx"], &golden["logits"]);
    assert_close("llama logits", &model.forward(idx).unwrap(), want, 1e-5);
    let (x, y) = (idx.narrow(1, 0, 6).unwrap(), idx.narrow(1, 1, 6).unwrap());
    assert_close("llama loss", &model.loss(&x, &y).unwrap(), &golden["loss"], 1e-5);
    // Prefill 4 tokens, decode 3: the last position's logits each time.
    let mut cache = model.new_cache(2, 8).unwrap();
    let ids = idx.to_vec::<i64>().unwrap();
    for (start, len) in [(0, 4), (4, 1), (5, 1), (6, 1)] {
        let step: Vec<i64> = (0..2).flat_map(|b| ids[b * 7 + start..b * 7 + start + len].to_vec()).collect();
        let step = Tensor::from_vec(step, &[2, len]).unwrap();
        let (logits, written) = model.forward_cached(&step, &cache.position().unwrap(), &cache).unwrap();
        cache.commit(&written, len, &[&logits]).unwrap();
        let last = want.select(1, (start + len - 1) as i64).unwrap();
        assert_close(&format!("cached logits at {}", start + len - 1), &logits, &last, 1e-5);
    }
}

/// A small convolutional network (`Conv2d`, relu, `Conv2d` with stride 2, global average pool,
/// `Linear`) fits random labels of 16 images with SGD: the gradients through im2col, the grouped
/// products and `fold` are right enough to train.
#[test]
fn a_convolutional_network_learns() {
    use coil::nn::{Conv2d, Linear};
    use coil::ConvOptions;
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    coil::manual_seed(3);
    let store = ParamStore::new();
    let root = store.root(Device::Cpu, DType::F32);
    let pad = ConvOptions { padding: [1, 1], ..Default::default() };
    let c1 = Conv2d::new(&root.pp("c1"), 3, 8, [3, 3], pad, true).unwrap();
    let c2 = Conv2d::new(&root.pp("c2"), 8, 8, [3, 3], ConvOptions { stride: [2, 2], groups: 2, ..pad }, true).unwrap();
    let head = Linear::new(&root.pp("head"), 8, 4, true).unwrap();
    store.realize_pending().unwrap();
    let x = Tensor::randn(&[16, 3, 8, 8], DType::F32).unwrap();
    let labels = Tensor::from_vec((0..16).map(|i| (i * 7 % 4) as i64).collect(), &[16]).unwrap();
    coil::realize(&[&x, &labels]).unwrap();
    let mut sgd = Sgd::new(store.trainable(), SgdConfig { lr: 0.5, momentum: 0.9, ..Default::default() }).unwrap();
    let params = sgd.params().to_vec();
    let mut losses = Vec::new();
    for _ in 0..30 {
        let h = c2.forward(&c1.forward(&x).unwrap().relu().unwrap()).unwrap().relu().unwrap();
        let logits = head.forward(&h.mean(&[2, 3], false).unwrap()).unwrap();
        let loss = logits.cross_entropy(&labels, Default::default()).unwrap();
        let (loss, grads) = coil::nn::value_and_grad(&loss, &params).unwrap();
        losses.push(loss.item::<f32>().unwrap());
        sgd.step(&grads).unwrap();
    }
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(last < 0.5 * first, "the loss falls: {losses:?}");
}

/// A tiny Llama's prefill in two chunks (12 tokens at position 0, then 9 at 12: 24 and 18
/// grouped-query rows, more than an explicit mask may have) and a decode step: each layer's
/// attention is one template call with the mask's rule (keys up to the position plus the row
/// modulo the chunk's length), no softmax kernel and no buffer of the scores; the logits agree
/// with the interpreter's.
#[test]
fn a_llama_prefill_runs_attention_as_one_template_call_with_the_masks_rule() {
    use coil::nn::models::llama::{Llama, LlamaConfig};
    use coil::Backend;
    let _lock = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    coil::manual_seed(11);
    let store = ParamStore::new();
    let model = Llama::new(&root(&store), LlamaConfig::tiny()).unwrap();
    store.realize_pending().unwrap();
    let (batch, capacity, layers) = (2usize, 40usize, 2usize);
    let ids: Vec<i64> = (0..batch * 22).map(|i| (i as i64 * 37 + 5) % 256).collect();
    let chunk = |start: usize, len: usize| {
        let v: Vec<i64> = (0..batch).flat_map(|b| ids[b * 22 + start..b * 22 + start + len].to_vec()).collect();
        Tensor::from_vec(v, &[batch, len]).unwrap()
    };
    let steps = [(0, 12), (12, 9), (21, 1)];
    let run = |backend: Backend, check: bool| -> Vec<Vec<f32>> {
        coil::set_backend(backend);
        coil::set_eager_tier(false);
        let mut cache = model.new_cache(batch, capacity).unwrap();
        let mut all = vec![];
        for (start, len) in steps {
            let (logits, written) =
                model.forward_cached(&chunk(start, len), &cache.position().unwrap(), &cache).unwrap();
            if check && len > 1 {
                let compiled = coil::inspect(&[&logits]).unwrap();
                let ir = &compiled.pre_fusion;
                assert_eq!(ir.matches("extern attention").count(), layers, "{ir}");
                let rule = format!(" mask_rule=key<=offset+row%{len}(");
                assert_eq!(ir.matches(&rule).count(), layers, "the mask's rule: {ir}");
                assert!(!ir.contains("softmax"), "no softmax kernel: {ir}");
                let coil::Executable::Cpu(graph) = &compiled.executable else { panic!("a CPU graph") };
                let rows = 2 * len;
                let scores = graph.program().buffers.iter().find(|b| b.meta.shape.ends_with(&[rows, capacity]));
                assert!(scores.is_none(), "a buffer of the scores: {:?}", scores.map(|b| (&b.name, &b.meta)));
            }
            cache.commit(&written, len, &[&logits]).unwrap();
            all.push(logits.to_vec::<f32>().unwrap());
        }
        all
    };
    let reference = run(Backend::Interpreter, false);
    let compiled = run(Backend::Compiled, true);
    for ((got, want), (start, len)) in compiled.iter().zip(&reference).zip(steps) {
        let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "logits of tokens {start}..{}: off by {worst}", start + len);
    }
}
