//! The attention template on the CPU: written-out attention and `scaled_dot_product_attention`
//! compiled to one extern call agree with the reference interpreter (the full decomposition);
//! the cases are in `cases.rs` (shared with `tests/gpu.rs`).

mod cases;

use coil::{DType, Device, Tensor};

#[test]
fn attention_template_agrees_with_the_interpreter_on_the_cpu() {
    cases::check_all(Device::Cpu);
}

/// Gradients through the templates (forward and backward calls, no scores in memory) agree
/// with the interpreter and with the decomposed path (`grad.rs`).
#[test]
fn attention_gradients_through_the_templates_agree_on_the_cpu() {
    cases::grad::check_grad_all(Device::Cpu);
}

/// `scaled_dot_product_attention` with a mask (bool or added, broadcast, decode-like) is one
/// template call that agrees with the interpreter (`masked.rs`).
#[test]
fn masked_attention_through_the_template_agrees_on_the_cpu() {
    cases::masked::check_masked_all(Device::Cpu);
}

/// Attention with dropout through the templates (forward and backward calls; with a bool or
/// added mask too) agrees with the interpreter's decomposition `softmax -> Dropout -> @ v`,
/// values and gradients (`dropout.rs`).
#[test]
fn dropout_attention_and_its_gradients_agree_with_the_interpreter_on_the_cpu() {
    cases::dropout::check_dropout_grads(Device::Cpu);
}

/// Masked attention with dropout in a forward-only decode step: one template call with the mask
/// and the dropout, the interpreter's values (`dropout.rs`).
#[test]
fn masked_dropout_decode_step_is_one_template_call() {
    cases::dropout::check_masked_dropout_forward(Device::Cpu);
}

/// BERT-style training (a padding mask, attention dropout): the step's graph holds the
/// attention templates with the mask and the dropout both ways and no `[B, H, T, T]` node or
/// buffer (`dropout.rs`).
#[test]
fn masked_dropout_training_graph_keeps_the_templates() {
    cases::dropout::check_masked_dropout_training_graph();
}

/// The templates keep exactly the weights the decomposition keeps, `1 - p` of them, a new mask
/// at every call of a compiled function; `p = 0` is attention without dropout.
#[test]
fn dropout_masks_match_the_decomposition_and_change_every_call_on_the_cpu() {
    cases::dropout::check_dropout_masks(Device::Cpu);
}

/// Attention with dropout in a compiled function whose sequence length is dynamic: one compile,
/// and the interpreter's numbers at every length (causal, or with a padding mask); with a
/// dropout after it, static sizes (the second draw's offset is quadratic in the length) and the
/// interpreter's numbers still.
#[test]
fn dropout_attention_with_a_dynamic_sequence_length() {
    cases::dropout::check_dropout_dynamic(false, false);
    cases::dropout::check_dropout_dynamic(true, false);
    cases::dropout::check_dropout_dynamic(false, true);
}

/// GPT-2 training with attention dropout: template calls both ways, the interpreter's numbers.
#[test]
fn gpt2_training_with_attention_dropout_keeps_the_templates() {
    cases::dropout::check_gpt2_training_with_dropout();
}

/// A dropout probability outside `[0, 1)` is an error naming the op, shapes and line.
#[test]
fn dropout_probability_out_of_range_is_an_error() {
    cases::dropout::check_dropout_errors();
}

/// Gradients through masked attention are templates too: one forward and one backward call
/// reading the mask in place (bool or added, broadcast, any number of rows, rows that keep no
/// key), agreeing with the interpreter; a learned bias's gradient takes the decomposition
/// (`masked_grad.rs`).
#[test]
fn gradients_of_masked_attention_through_the_templates() {
    cases::masked_grad::check_masked_grad_all(Device::Cpu);
}

/// A compiled function whose sequence length is dynamic: one attention call serves every
/// length, and every length agrees with the interpreter.
#[test]
fn attention_with_a_dynamic_sequence_length() {
    let body = |a: &[Tensor]| -> coil::Result<Vec<Tensor>> {
        let (b, t, h, d) = (a[0].shape()[0] as i64, a[0].shape()[1] as i64, 2i64, 8i64);
        let heads = |x: &Tensor| x.view(&[b, t, h, d])?.transpose(1, 2);
        let (q, k, v) = (heads(&a[0])?, heads(&a[1])?, heads(&a[2])?);
        let att = q.matmul(&k.transpose(-2, -1)?)?.mul(1.0 / (d as f64).sqrt())?;
        let mask = Tensor::ones(&[t as usize, t as usize], DType::Bool).tril(0)?;
        let att = coil::where_(&mask, &att, f64::NEG_INFINITY)?.softmax(-1)?;
        Ok(vec![att.matmul(&v)?.transpose(1, 2)?.reshape(&[b, t, h * d])?])
    };
    let f = coil::compile(body).named("attention");
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
    coil::set_default_device(Device::Cpu);
    for t in [5usize, 9, 70] {
        let make = |seed: usize| {
            let v: Vec<f32> = (0..2 * t * 16).map(|i| ((i * 7 + seed * 13) as f32 * 0.37).sin()).collect();
            Tensor::from_vec(v, &[2, t, 16]).unwrap()
        };
        let args = [make(1), make(2), make(3)];
        for a in &args {
            a.mark_dynamic(1).unwrap();
        }
        let got = f.call(&args.iter().collect::<Vec<_>>()).unwrap()[0].to_vec::<f64>().unwrap();
        coil::set_backend(coil::Backend::Interpreter);
        let want = body(&args).unwrap()[0].to_vec::<f64>().unwrap();
        coil::set_backend(coil::Backend::Compiled);
        coil::set_eager_tier(false);
        for (x, y) in got.iter().zip(&want) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "T = {t}: {x} vs {y}");
        }
    }
    assert_eq!(f.compile_count(), 1, "one compile serves every length");
    // The one compile is the attention call with the length symbolic.
    let args: Vec<Tensor> =
        (0..3).map(|_| Tensor::from_vec(vec![0.5f32; 2 * 12 * 16], &[2, 12, 16]).unwrap()).collect();
    for a in &args {
        a.mark_dynamic(1).unwrap();
    }
    let y = body(&args).unwrap();
    let compiled = coil::inspect(&[&y[0]]).unwrap();
    let ir = &compiled.pre_fusion;
    assert!(ir.starts_with("symbol s0"), "{ir}");
    assert!(ir.contains("extern attention causal scale=0.35355339059327373 batch=[2, 2] l=s0 s=s0 d=8"), "{ir}");
}

/// Gradients through the templates in a compiled function whose sequence length is dynamic:
/// one compile (a forward and a backward call with the length symbolic) serves every length,
/// and every length agrees with the interpreter.
#[test]
fn attention_gradients_with_a_dynamic_sequence_length() {
    let body = |a: &[Tensor]| -> coil::Result<Vec<Tensor>> {
        let (b, t, h, d) = (a[0].shape()[0] as i64, a[0].shape()[1] as i64, 2i64, 8i64);
        let heads = |x: &Tensor| x.view(&[b, t, h, d])?.transpose(1, 2);
        let (q, k, v) = (heads(&a[0])?, heads(&a[1])?, heads(&a[2])?);
        let y = coil::scaled_dot_product_attention(&q, &k, &v, None, true, None)?;
        let loss = y.mul(&y)?.sum_all()?;
        let (loss, grads) = coil::value_and_grad(&loss, &[&a[0], &a[1], &a[2]])?;
        Ok(std::iter::once(loss).chain(grads).collect())
    };
    let f = coil::compile(body).named("attention_grad");
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
    coil::set_default_device(Device::Cpu);
    let make = |t: usize, seed: usize| {
        let v: Vec<f32> = (0..2 * t * 16).map(|i| ((i * 7 + seed * 13) as f32 * 0.37).sin()).collect();
        let x = Tensor::from_vec(v, &[2, t, 16]).unwrap();
        x.mark_dynamic(1).unwrap();
        x
    };
    for t in [5usize, 9, 70] {
        let args = [make(t, 1), make(t, 2), make(t, 3)];
        let got: Vec<Vec<f64>> =
            f.call(&args.iter().collect::<Vec<_>>()).unwrap().iter().map(|x| x.to_vec::<f64>().unwrap()).collect();
        coil::set_backend(coil::Backend::Interpreter);
        let want: Vec<Vec<f64>> = body(&args).unwrap().iter().map(|x| x.to_vec::<f64>().unwrap()).collect();
        coil::set_backend(coil::Backend::Compiled);
        coil::set_eager_tier(false);
        for (i, (x, y)) in got.iter().zip(&want).enumerate() {
            let err = cases::rel_error(x, y);
            assert!(err <= 1e-5, "T = {t}: output {i} (0: the loss) differs by {err:.2e}");
        }
    }
    assert_eq!(f.compile_count(), 1, "one compile serves every length");
    let args = [make(12, 1), make(12, 2), make(12, 3)];
    let outputs = body(&args).unwrap();
    let ir = &coil::inspect(&outputs.iter().collect::<Vec<_>>()).unwrap().pre_fusion;
    assert!(ir.starts_with("symbol s0"), "{ir}");
    assert!(ir.contains("= extern attention causal scale=0.35355339059327373 batch=[2, 2] l=s0 s=s0 d=8"), "{ir}");
    assert!(
        ir.contains(
            "= extern attention_backward causal scale=0.35355339059327373 batch=[2, 2] l=s0 s=s0 d=8 grads=[q, k, v]"
        ),
        "{ir}"
    );
}

/// Gradients through masked templates in a compiled function whose sequence length is dynamic
/// (the padding mask's too): one compile serves every length, the forward and backward calls
/// read the mask with the length symbolic, and every length agrees with the interpreter.
#[test]
fn masked_attention_gradients_with_a_dynamic_sequence_length() {
    let body = |a: &[Tensor]| -> coil::Result<Vec<Tensor>> {
        let (b, t, h, d) = (a[0].shape()[0] as i64, a[0].shape()[1] as i64, 2i64, 8i64);
        let heads = |x: &Tensor| x.view(&[b, t, h, d])?.transpose(1, 2);
        let (q, k, v) = (heads(&a[0])?, heads(&a[1])?, heads(&a[2])?);
        let y = coil::scaled_dot_product_attention(&q, &k, &v, Some(&a[3]), false, None)?;
        let loss = y.mul(&y)?.sum_all()?;
        let (loss, grads) = coil::value_and_grad(&loss, &[&a[0], &a[1], &a[2]])?;
        Ok(std::iter::once(loss).chain(grads).collect())
    };
    let f = coil::compile(body).named("masked_attention_grad");
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
    coil::set_default_device(Device::Cpu);
    let make = |t: usize| {
        let x: Vec<Tensor> = (1..=3)
            .map(|seed| {
                let v: Vec<f32> = (0..2 * t * 16).map(|i| ((i * 7 + seed * 13) as f32 * 0.37).sin()).collect();
                Tensor::from_vec(v, &[2, t, 16]).unwrap()
            })
            .collect();
        // Padding: batch index 1 keeps its first t - 3 keys.
        let keep: Vec<bool> = (0..2 * t).map(|x| x % t + 3 * (x / t) < t).collect();
        let mask = Tensor::from_vec(keep, &[2, 1, 1, t]).unwrap();
        let args: Vec<Tensor> = x.into_iter().chain([mask]).collect();
        args[..3].iter().for_each(|a| a.mark_dynamic(1).unwrap());
        args[3].mark_dynamic(3).unwrap();
        args
    };
    for t in [20usize, 33, 70] {
        let args = make(t);
        let got: Vec<Vec<f64>> =
            f.call(&args.iter().collect::<Vec<_>>()).unwrap().iter().map(|x| x.to_vec::<f64>().unwrap()).collect();
        coil::set_backend(coil::Backend::Interpreter);
        let want: Vec<Vec<f64>> = body(&args).unwrap().iter().map(|x| x.to_vec::<f64>().unwrap()).collect();
        coil::set_backend(coil::Backend::Compiled);
        coil::set_eager_tier(false);
        for (i, (x, y)) in got.iter().zip(&want).enumerate() {
            let err = cases::rel_error(x, y);
            assert!(err <= 1e-5, "T = {t}: output {i} (0: the loss) differs by {err:.2e}");
        }
    }
    assert_eq!(f.compile_count(), 1, "one compile serves every length");
    let outputs = body(&make(40)).unwrap();
    let ir = &coil::inspect(&outputs.iter().collect::<Vec<_>>()).unwrap().pre_fusion;
    let calls: Vec<&str> = ir.lines().filter(|l| l.contains("= extern attention")).collect();
    assert_eq!(calls.len(), 2, "{ir}");
    assert!(calls.iter().all(|c| c.contains(" l=s0 s=s0 ") && c.contains(" mask=[s0, 0, 0, 1]")), "{ir}");
}

/// A GPT-2 training step (`coil::nn`, causal `scaled_dot_product_attention` in every block,
/// gradients of every parameter) lowers with each layer's attention one template call forward
/// and one backward, and no buffer of the `[B, H, T, T]` scores: in bf16 (the passes alone, as
/// the compile path runs them) and in f32, compiled and run, where it agrees with the
/// interpreter.
#[test]
fn gpt2_training_step_keeps_attention_templates_both_ways() {
    use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
    use coil::nn::ParamStore;
    let (b, t, n_layer, n_head) = (2usize, 40usize, 2usize, 2usize);
    let config =
        Gpt2Config { vocab_size: 50, block_size: 64, n_layer, n_head, n_embd: 64, dropout: 0.0, layer_norm_eps: 1e-5 };
    coil::set_default_device(Device::Cpu);
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
    // Whatever a lowered program holds: each layer's calls, and no buffer of the scores.
    let check = |dtype: DType, program: &coil::ir::loops::LoopProgram| {
        let ir = program.to_string();
        assert_eq!(ir.matches("extern attention causal").count(), n_layer, "{dtype}: forward calls in\n{ir}");
        let backward = ir.matches("extern attention_backward causal").count();
        assert_eq!(backward, n_layer, "{dtype}: backward calls in\n{ir}");
        let scores = b * n_head * t * t;
        let found = program.buffers.iter().find(|x| x.meta.shape.ends_with(&[t, t]) || x.meta.numel() == scores);
        assert!(found.is_none(), "{dtype}: a buffer of the scores' size: {:?}", found.map(|x| (&x.name, &x.meta)));
    };
    for dtype in [DType::BF16, DType::F32] {
        coil::manual_seed(3);
        let store = ParamStore::new();
        let model = Gpt2::new(&store.root(Device::Cpu, dtype), config).unwrap();
        let tokens = |seed: i64| -> Tensor {
            let v: Vec<i64> = (0..(b * t) as i64).map(|i| (i * 7 + seed * 13) % 50).collect();
            Tensor::from_vec(v, &[b, t]).unwrap()
        };
        let (idx, targets) = (tokens(1), tokens(2));
        let step = || {
            let (loss, grads) = coil::nn::value_and_grad(&model.loss(&idx, &targets)?, &store.params())?;
            Ok::<_, coil::Error>(std::iter::once(loss).chain(grads).collect::<Vec<Tensor>>())
        };
        let outputs = step().unwrap();
        let outputs: Vec<&Tensor> = outputs.iter().collect();
        if dtype == DType::BF16 {
            // The compile path's passes, without the C compiler.
            let graph = coil::capture(&outputs).graph;
            let options = coil_passes::DecomposeOptions { fused_attention: true, ..Default::default() };
            let primitive = coil_passes::decompose_with(&graph, &options).unwrap();
            let (primitive, _) = coil_passes::simplify(&primitive, &coil_passes::RewriteOptions::default()).unwrap();
            check(dtype, &coil_passes::lower(&primitive).unwrap());
            continue;
        }
        let compiled = coil::inspect(&outputs).unwrap();
        let coil::Executable::Cpu(graph) = &compiled.executable else { panic!("a CPU graph") };
        check(dtype, graph.program());
        let got: Vec<Vec<f64>> = outputs.iter().map(|x| x.to_vec::<f64>().unwrap()).collect();
        coil::set_backend(coil::Backend::Interpreter);
        let want: Vec<Vec<f64>> = step().unwrap().iter().map(|x| x.to_vec::<f64>().unwrap()).collect();
        coil::set_backend(coil::Backend::Compiled);
        coil::set_eager_tier(false);
        for (i, (x, y)) in got.iter().zip(&want).enumerate() {
            let err = cases::rel_error(x, y);
            assert!(err <= 1e-5, "output {i} (0: the loss): relative error {err:.2e}");
        }
    }
}

/// Gradients of gradients through attention: the first gradient is the backward template, which
/// the second decomposes (it has no rule of its own); the result agrees with the same program
/// written so that attention decomposes from the start (an added zero mask, which the matcher
/// does not recognise).
#[test]
fn second_order_gradients_through_the_templates() {
    coil::set_default_device(Device::Cpu);
    let zeros = Tensor::zeros(&[9, 11], DType::F32);
    check_second_order(
        |q, k, v| coil::scaled_dot_product_attention(q, k, v, None, false, None),
        |s, v| s.add(&zeros)?.softmax(-1)?.matmul(v),
    );
}

/// Gradients of gradients through masked attention: the first gradient is the masked backward
/// template, which the second expands (its decomposition, as the interpreter's); the result
/// agrees with the same program written out (the mask applied by `where` before a softmax, which
/// the matcher leaves alone), compiled and interpreted.
#[test]
fn second_order_gradients_through_masked_templates() {
    coil::set_default_device(Device::Cpu);
    // Holes in every row, no row without a key (the written-out softmax has no safe form).
    let keep: Vec<bool> = (0..9 * 11).map(|x| (x % 11 + 2 * (x / 11)) % 3 != 1 || x % 11 == x / 11).collect();
    let mask = Tensor::from_vec(keep, &[9, 11]).unwrap();
    check_second_order(
        |q, k, v| coil::scaled_dot_product_attention(q, k, v, Some(&mask), false, None),
        |s, v| coil::where_(&mask, s, f64::NEG_INFINITY)?.softmax(-1)?.matmul(v),
    );
}

/// Gradients of gradients through masked attention with dropout: the masked backward template
/// with the dropout, expanded by the second gradient (its `Dropout` at the forward's draw),
/// against the program written out with `Tensor::dropout` on the weights (the same numbers from
/// the same seed), compiled and interpreted.
#[test]
fn second_order_gradients_through_masked_dropout_templates() {
    coil::set_default_device(Device::Cpu);
    let keep: Vec<bool> = (0..9 * 11).map(|x| (x % 11 + 2 * (x / 11)) % 3 != 1 || x % 11 == x / 11).collect();
    let mask = Tensor::from_vec(keep, &[9, 11]).unwrap();
    check_second_order(
        |q, k, v| coil::scaled_dot_product_attention_dropout(q, k, v, Some(&mask), 0.3, false, None),
        |s, v| coil::where_(&mask, s, f64::NEG_INFINITY)?.softmax(-1)?.dropout(0.3, true)?.matmul(v),
    );
}

/// `d/dk sum((d/dq sum(y^2))^2)` of `y = templated(q, k, v)` (q `[2, 9, 8]`, k and v
/// `[2, 11, 8]`) against the same with `y = written(q @ k^T / sqrt(8), v)`, interpreted and
/// compiled, both from one seed (a dropout draws the same numbers): within 1e-5.
fn check_second_order(
    templated: impl Fn(&Tensor, &Tensor, &Tensor) -> coil::Result<Tensor>,
    written: impl Fn(&Tensor, &Tensor) -> coil::Result<Tensor>,
) {
    coil::set_default_device(Device::Cpu);
    let make = |seed: usize, shape: &[usize]| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| ((i * 7 + seed * 13) as f32 * 0.37).sin()).collect();
        Tensor::from_vec(v, shape).unwrap()
    };
    let (q, k, v) = (make(1, &[2, 9, 8]), make(2, &[2, 11, 8]), make(3, &[2, 11, 8]));
    let second = |use_template: bool| -> Vec<f64> {
        coil::manual_seed(9);
        let y = if use_template {
            templated(&q, &k, &v).unwrap()
        } else {
            let s = q.matmul(&k.transpose(-2, -1).unwrap()).unwrap().mul(1.0 / 8f64.sqrt()).unwrap();
            written(&s, &v).unwrap()
        };
        let loss = y.mul(&y).unwrap().sum_all().unwrap();
        let dq = coil::grad(&loss, &[&q]).unwrap().remove(0);
        let again = dq.mul(&dq).unwrap().sum_all().unwrap();
        coil::grad(&again, &[&k]).unwrap()[0].to_vec::<f64>().unwrap()
    };
    for backend in [coil::Backend::Interpreter, coil::Backend::Compiled] {
        coil::set_backend(backend);
        coil::set_eager_tier(false);
        let (got, want) = (second(true), second(false));
        let err = cases::rel_error(&got, &want);
        assert!(err <= 1e-5, "{backend:?}: relative error {err:.2e}");
    }
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
}
