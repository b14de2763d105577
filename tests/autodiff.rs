//! Gradients ([`coil::grad`]) against central finite differences, in float64 on the reference
//! interpreter: every primitive's rule, through the composite ops that decompose into it.
//! (PyTorch's own gradients are golden cases, `grad_*` in `tests/golden`; the compiled path is
//! checked against the interpreter there and in `grad_graphs_compile_like_the_interpreter`.)

use coil::{Backend, Buffer, CrossEntropyOptions, DType, ErrorKind, Tensor};

/// Random f64 data in [-1, 1) (offset by `shift`), from a splitmix64 stream.
fn data(shape: &[usize], seed: u64, shift: f64) -> Tensor {
    let mut z = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((x ^ (x >> 31)) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0 + shift
        })
        .collect();
    Tensor::from_vec(v, shape).unwrap()
}

type Loss = fn(&[Tensor]) -> coil::Result<Tensor>;

/// `grad(loss, [x])` agrees with central differences of `loss` at every element of every float
/// input `x`, to 1e-6 relative to the gradient's norm; an input `loss` does not read is an error
/// of `grad`, and its finite differences must then be zero.
fn check(name: &str, loss: Loss, inputs: &[Tensor]) {
    coil::set_backend(Backend::Interpreter);
    let out = loss(inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
    let h = 1e-6;
    for (k, x) in inputs.iter().enumerate().filter(|(_, x)| x.dtype().is_float()) {
        let base = x.to_vec::<f64>().unwrap();
        let mut numeric = vec![0.0; base.len()];
        for j in 0..base.len() {
            let at = |d: f64| {
                let mut v = base.clone();
                v[j] += d;
                let mut moved = inputs.to_vec();
                moved[k] = Tensor::from_buffer(Buffer::from_vec(v, x.shape().to_vec()));
                loss(&moved).unwrap().item::<f64>().unwrap()
            };
            numeric[j] = (at(h) - at(-h)) / (2.0 * h);
        }
        let norm: f64 = numeric.iter().map(|n| n * n).sum::<f64>().sqrt();
        let analytic = match coil::grad(&out, &[x]) {
            Ok(g) => {
                assert_eq!(g[0].shape(), x.shape(), "{name}: gradient {k} shape");
                g[0].to_vec::<f64>().unwrap()
            }
            Err(e) if e.to_string().contains("not used") => {
                assert_eq!(norm, 0.0, "{name}: input {k} is reported unused, but the loss moves with it");
                continue;
            }
            Err(e) => panic!("{name}: input {k}: {e}"),
        };
        let diff: f64 = analytic.iter().zip(&numeric).map(|(a, n)| (a - n) * (a - n)).sum::<f64>().sqrt();
        assert!(
            diff <= 1e-6 * norm.max(1e-3),
            "{name}: gradient {k} differs from finite differences by {diff:.2e} (norm {norm:.2e})\n\
             grad {analytic:?}\nnumeric {numeric:?}"
        );
    }
}

#[test]
fn pointwise_rules_match_finite_differences() {
    let (a, b, p) = (data(&[3, 4], 1, 0.0), data(&[3, 4], 2, 0.0), data(&[3, 4], 3, 1.5));
    let cases: &[(&str, Loss)] = &[
        ("exp_log", |x| x[0].exp()?.add(&x[2].log()?)?.mul(&x[1])?.sum_all()),
        ("exp2_log2_expm1_log1p", |x| {
            x[0].exp2()?.mul(&x[2].log2()?)?.add(&x[1].expm1()?.mul(&x[2].log1p()?)?)?.sum_all()
        }),
        ("sqrt_rsqrt_reciprocal", |x| {
            x[2].sqrt()?.add(&x[2].rsqrt()?)?.mul(&x[2].reciprocal()?)?.mul(&x[0])?.sum_all()
        }),
        ("trig", |x| x[0].sin()?.mul(&x[1].cos()?)?.add(&x[0].mul(0.5)?.tan()?)?.sum_all()),
        ("tanh_sigmoid_erf", |x| x[0].tanh()?.mul(&x[1].sigmoid()?)?.add(&x[1].erf()?)?.sum_all()),
        ("atan_asin_acos_erfinv_atan2", |x| {
            let inverse = x[0].atan()?.mul(&x[1].asin()?)?.add(&x[1].acos()?.mul(&x[0].erfinv()?)?)?;
            inverse.add(&x[0].atan2(&x[1])?.mul(&x[2])?)?.add(&x[2].atan2(&x[0])?)?.sum_all()
        }),
        ("neg_abs_div", |x| x[0].neg()?.mul(&x[1].abs()?)?.div(&x[2])?.sum_all()),
        ("pow_both", |x| x[2].pow(&x[1])?.add(&x[0].pow(3)?)?.sum_all()),
        ("sub_remainder", |x| x[0].sub(&x[1])?.mul(&x[0])?.add(&x[0].remainder(&x[2])?)?.sum_all()),
        ("floor_has_no_gradient", |x| x[0].floor()?.add(&x[0].mul(2.0)?)?.mul(&x[1])?.sum_all()),
        ("where_and_compare", |x| coil::where_(&x[0].gt(&x[1])?, &x[0].mul(&x[1])?, &x[1].exp()?)?.sum_all()),
        ("minimum_maximum", |x| x[0].minimum(&x[1])?.mul(&x[0].maximum(&x[2])?)?.sum_all()),
        ("composite_silu_softplus_gelu_tanh", |x| {
            x[0].silu()?.add(&x[1].softplus(1.0, 20.0)?)?.add(&x[2].gelu(true)?)?.mul(&x[1])?.sum_all()
        }),
    ];
    for &(name, loss) in cases {
        check(name, loss, &[a.clone(), b.clone(), p.clone()]);
    }
}

/// A cast passes the gradient through, converted to each operand's dtype on the way (PyTorch's
/// rule: the gradient of the f32 intermediate is f32); finite differences cannot see through the
/// rounding, so this is checked exactly.
#[test]
fn casts_pass_the_gradient_through() {
    coil::set_backend(Backend::Interpreter);
    let (x, y) = (data(&[5], 20, 0.0), data(&[5], 21, 0.0));
    let loss = x.to_dtype(DType::F32).unwrap().to_dtype(DType::F64).unwrap().mul(&y).unwrap().sum_all().unwrap();
    let g = coil::grad(&loss, &[&x]).unwrap();
    assert_eq!(g[0].dtype(), DType::F64);
    let through_f32 = y.to_dtype(DType::F32).unwrap().to_dtype(DType::F64).unwrap();
    assert_eq!(g[0].to_vec::<f64>().unwrap(), through_f32.to_vec::<f64>().unwrap());
}

#[test]
fn reduction_and_view_rules_match_finite_differences() {
    let a = data(&[3, 4], 4, 0.0);
    let b = data(&[4, 3], 5, 0.0);
    let c = data(&[3, 1], 6, 0.0);
    let cases: &[(&str, Loss)] = &[
        ("sum_mean_keepdim", |x| x[0].sum(&[1], true)?.mul(&x[2])?.add(&x[0].mean(&[0], false)?.sum_all()?)?.sum_all()),
        ("amax_amin", |x| x[0].amax(&[1], false)?.mul(&x[0].amin(&[1], false)?)?.sum_all()),
        ("softmax_log_softmax", |x| x[0].softmax(-1)?.mul(&x[0].log_softmax(0)?)?.sum_all()),
        ("logsumexp_var_std", |x| {
            x[0].logsumexp(&[1], false)?.add(&x[0].var(&[1], 1.0, false)?)?.add(&x[0].std(&[1], 1.0, false)?)?.sum_all()
        }),
        ("cumsum_flip", |x| x[0].cumsum(1)?.flip(&[0])?.mul(&x[0])?.sum_all()),
        ("permute_reshape_expand", |x| x[0].t()?.matmul(&x[2].expand(&[3, 4])?)?.reshape(&[-1])?.sum_all()),
        ("slices_strided_and_reversed", |x| {
            let s = x[0].slice(1, Some(1), None, 2)?;
            let r = x[0].flip(&[1])?.slice(1, Some(0), Some(2), 1)?;
            s.mul(&r)?.sum_all()
        }),
        ("pad_cat_narrow", |x| {
            let p = x[0].pad(&[2, 1], 0.5)?;
            coil::cat(&[&p, &x[0].narrow(1, 1, 3)?], 1)?.mul(&p.sum(&[1], true)?)?.sum_all()
        }),
        ("matmul_bmm", |x| x[0].matmul(&x[1])?.matmul(&x[0])?.sum_all()),
        ("layer_norm_rms_norm", |x| {
            x[0].layer_norm(&[4], None, None, 1e-5)?.mul(&x[0].rms_norm(&[4], None, Some(1e-6))?)?.sum_all()
        }),
    ];
    for &(name, loss) in cases {
        check(name, loss, &[a.clone(), b.clone(), c.clone()]);
    }
}

#[test]
fn indexing_rules_match_finite_differences() {
    let a = data(&[4, 3], 7, 0.0);
    let idx = Tensor::from_vec(vec![2i64, 0, 2, 3], &[4]).unwrap();
    let gidx = Tensor::from_vec(vec![0i64, 2, 2, 1, 0, 0, 2, 2, 1, 1, 1, 0], &[4, 3]).unwrap();
    let targets = Tensor::from_vec(vec![1i64, 0, 2, 2], &[4]).unwrap();
    let src = data(&[4, 3], 8, 0.0);
    let cases: &[(&str, Loss)] = &[
        ("index_select_embedding", |x| x[0].index_select(0, &x[2])?.mul(&coil::embedding(&x[2], &x[0])?)?.sum_all()),
        ("gather", |x| x[0].gather(1, &x[3])?.exp()?.sum_all()),
        ("scatter_and_scatter_add", |x| {
            let s = x[0].scatter(1, &x[3].slice(1, Some(0), Some(1), 1)?, &x[1])?;
            s.scatter_add(1, &x[3], &x[1])?.mul(&x[0])?.sum_all()
        }),
        ("cross_entropy", |x| x[0].mul(&x[1])?.cross_entropy(&x[4], CrossEntropyOptions::default())),
    ];
    for &(name, loss) in cases {
        check(name, loss, &[a.clone(), src.clone(), idx.clone(), gidx.clone(), targets.clone()]);
    }
}

#[test]
fn gradients_through_computed_tensors_recompute_them() {
    // A realized intermediate is still differentiated through (its op is replayed).
    coil::set_backend(Backend::Interpreter);
    let w = data(&[5], 9, 0.0);
    let h = w.exp().unwrap();
    h.realize().unwrap();
    let loss = h.mul(&w).unwrap().sum_all().unwrap();
    let (value, g) = coil::value_and_grad(&loss, &[&w, &h]).unwrap();
    let (wv, hv) = (w.to_vec::<f64>().unwrap(), h.to_vec::<f64>().unwrap());
    let want: f64 = wv.iter().zip(&hv).map(|(a, b)| a * b).sum();
    assert!((value.item::<f64>().unwrap() - want).abs() < 1e-12);
    let gw = g[0].to_vec::<f64>().unwrap();
    for i in 0..5 {
        assert!((gw[i] - (hv[i] + wv[i] * hv[i])).abs() < 1e-12, "d/dw (exp(w) w) = exp(w)(1 + w)");
    }
    assert_eq!(g[1].to_vec::<f64>().unwrap(), wv, "d/dh (h w) = w");
}

#[test]
fn detach_stops_gradients_and_softmax_shifts_get_none() {
    coil::set_backend(Backend::Interpreter);
    let w = data(&[4], 15, 0.0);
    // d/dw sum(w * detach(w)^2) = detach(w)^2
    let loss = w.mul(w.detach().unwrap().pow(2).unwrap()).unwrap().sum_all().unwrap();
    let g = coil::grad(&loss, &[&w]).unwrap()[0].to_vec::<f64>().unwrap();
    let wv = w.to_vec::<f64>().unwrap();
    for i in 0..4 {
        assert!((g[i] - wv[i] * wv[i]).abs() < 1e-12, "{g:?}");
    }
    // Only data feeding a detached value: unused, as in PyTorch.
    assert!(coil::grad(&w.detach().unwrap().sum_all().unwrap(), &[&w]).is_err());
    // A computed tensor's detach is data: no history behind it, for gradients or capture.
    let e = w.exp().unwrap();
    e.realize().unwrap();
    let d = e.detach().unwrap();
    assert_eq!(d.to_vec::<f64>().unwrap(), e.to_vec::<f64>().unwrap());
    let gd = coil::grad(&d.mul(&w).unwrap().sum_all().unwrap(), &[&w]).unwrap();
    assert_eq!(gd[0].to_vec::<f64>().unwrap(), d.to_vec::<f64>().unwrap(), "d/dw (d w) = d");
    // The softmax family's stabilizing maximum is detached: its gradient graph has no amax
    // tie mask (an `eq` of the input with its maximum).
    let x = data(&[3, 5], 16, 0.0);
    let loss = x.log_softmax(1).unwrap().mul(&x).unwrap().sum_all().unwrap();
    let g = coil::grad(&loss, &[&x]).unwrap();
    let text = coil::capture(&[&g[0]]).graph.to_string();
    assert!(!text.contains(" = eq("), "{text}");
}

#[test]
fn a_training_loop_does_not_recapture_its_history() {
    // Plain SGD on sum((x w - y)^2): each step's gradient graph reads the updated weight as data,
    // so it stays the same size however many steps came before.
    coil::set_backend(Backend::Interpreter);
    let x = data(&[6, 3], 17, 0.0);
    let y = data(&[6, 1], 18, 0.0);
    let mut w = data(&[3, 1], 19, 0.0);
    let mut sizes = Vec::new();
    let mut losses = Vec::new();
    for _ in 0..4 {
        let loss = x.matmul(&w).unwrap().sub(&y).unwrap().pow(2).unwrap().sum_all().unwrap();
        let (value, g) = coil::value_and_grad(&loss, &[&w]).unwrap();
        sizes.push(coil::capture(&[&g[0]]).graph.nodes.len());
        losses.push(value.item::<f64>().unwrap());
        w = w.sub(g[0].mul(0.02).unwrap()).unwrap();
        w.realize().unwrap();
    }
    assert!(sizes.windows(2).all(|p| p[0] == p[1]), "gradient graph sizes {sizes:?}");
    assert!(losses.windows(2).all(|p| p[1] < p[0]), "losses {losses:?}");
}

#[test]
fn bad_requests_are_clear_errors() {
    coil::set_backend(Backend::Interpreter);
    let a = data(&[3], 10, 0.0);
    let b = data(&[3], 11, 0.0);
    let e = coil::grad(&a.mul(2.0).unwrap(), &[&a]).unwrap_err();
    assert!(e.to_string().contains("only for outputs of one element"), "{e}");
    let line = line!() + 1;
    let e = coil::grad(&a.sum_all().unwrap(), &[&a, &b]).unwrap_err();
    assert!(e.to_string().contains("input 1 of grad") && e.to_string().contains("not used"), "{e}");
    assert!(e.to_string().contains(&format!("autodiff.rs:{line}")), "{e} should point at the call");
    let prod = a.prod(&[0], false).unwrap();
    let line = line!() - 1;
    let e = coil::grad(&prod, &[&a]).unwrap_err();
    assert!(e.to_string().contains("prod") && e.to_string().contains(&format!("autodiff.rs:{line}")), "{e}");
    let i = Tensor::from_vec(vec![1i64, 2, 3], &[3]).unwrap();
    let e = coil::grad(&a.mul(&i).unwrap().sum_all().unwrap(), &[&i]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::DType, "{e}");
}

#[test]
fn grad_graphs_compile_like_the_interpreter() {
    // A small training step, compiled (C on the CPU) against the interpreter: the forward and
    // backward graph as one program.
    let x = data(&[6, 8], 12, 0.0).to_dtype(DType::F32).unwrap();
    let w1 = data(&[16, 8], 13, 0.0).to_dtype(DType::F32).unwrap();
    let w2 = data(&[5, 16], 14, 0.0).to_dtype(DType::F32).unwrap();
    let t = Tensor::from_vec(vec![0i64, 4, 2, 2, 1, 3], &[6]).unwrap();
    let step = |backend| -> Vec<Vec<f64>> {
        coil::set_backend(backend);
        coil::set_eager_tier(false);
        let h = coil::linear(&x, &w1, None).unwrap().gelu(false).unwrap();
        let loss = coil::linear(&h, &w2, None).unwrap().cross_entropy(&t, CrossEntropyOptions::default()).unwrap();
        let (value, g) = coil::value_and_grad(&loss, &[&w1, &w2]).unwrap();
        let mut all = vec![&value];
        all.extend(g.iter());
        coil::realize(&all).unwrap();
        all.iter().map(|t| t.to_vec::<f64>().unwrap()).collect()
    };
    let (compiled, interpreted) = (step(Backend::Compiled), step(Backend::Interpreter));
    for (k, (c, i)) in compiled.iter().zip(&interpreted).enumerate() {
        let diff: f64 = c.iter().zip(i).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
        let norm: f64 = i.iter().map(|b| b * b).sum::<f64>().sqrt();
        assert!(
            diff <= 1e-5 * norm,
            "output {k}: compiled differs from the interpreter by {diff:.2e} (norm {norm:.2e})"
        );
    }
}

/// The gradient of a tanh gelu after a product (GPT-2's MLP) is computed by the product that
/// carries the gradient in, as its epilogue (`bmm +gelu_tanh_grad`, reading the gelu's saved
/// input), and the forward product computes the gelu and saves its input for it (`saved =`):
/// the compiled gradients, in f32 and bf16, agree with the interpreter.
#[test]
fn the_gelu_gradient_is_a_product_epilogue_and_agrees_with_the_interpreter() {
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 2e-2)] {
        let x = data(&[2, 6, 8], 21, 0.0).to_dtype(dtype).unwrap();
        let w1 = data(&[16, 8], 22, 0.0).to_dtype(dtype).unwrap();
        let b1 = data(&[16], 23, 0.0).to_dtype(dtype).unwrap();
        let w2 = data(&[8, 16], 24, 0.0).to_dtype(dtype).unwrap();
        let step = |backend| -> (Vec<Vec<f64>>, String) {
            coil::set_backend(backend);
            coil::set_eager_tier(false);
            let h = coil::linear(&x, &w1, Some(&b1)).unwrap().gelu(true).unwrap();
            let loss = coil::linear(&h, &w2, None).unwrap().square().unwrap().to_dtype(DType::F32).unwrap().sum_all();
            let g = coil::grad(&loss.unwrap(), &[&x, &w1, &b1, &w2]).unwrap();
            let text = match backend {
                Backend::Compiled => coil::inspect(&g.iter().collect::<Vec<_>>()).unwrap().pre_fusion.clone(),
                Backend::Interpreter => String::new(),
            };
            coil::realize(&g.iter().collect::<Vec<_>>()).unwrap();
            (g.iter().map(|t| t.to_vec::<f64>().unwrap()).collect(), text)
        };
        let ((compiled, program), (interpreted, _)) = (step(Backend::Compiled), step(Backend::Interpreter));
        assert_eq!(program.matches("+gelu_tanh_grad").count(), 1, "{dtype}:\n{program}");
        assert_eq!(program.matches("+bias +gelu_tanh ").count(), 1, "{dtype}:\n{program}");
        assert_eq!(program.matches("    saved = ").count(), 1, "{dtype}:\n{program}");
        for (k, (c, i)) in compiled.iter().zip(&interpreted).enumerate() {
            let diff: f64 = c.iter().zip(i).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
            let norm: f64 = i.iter().map(|b| b * b).sum::<f64>().sqrt();
            assert!(norm > 0.0 && diff <= tol * norm, "{dtype} gradient {k}: off by {diff:.2e} (norm {norm:.2e})");
        }
    }
}

/// An embedding tied to the output projection (GPT-2's `wte`, in f32 and under bf16
/// autocast): the table's gradient is the projection's, with the embedding's rows scattered
/// into it (`scatter-into-addend`; under autocast the product writes f32 directly) in the
/// gradient's own buffer (the memory plan keeps the scatter's base there): no zero fill, no
/// add over the table, no copy. The compiled gradient agrees with the interpreter on ids that
/// repeat.
#[test]
fn a_tied_embedding_gradient_is_scattered_into_the_projection_gradient_in_place() {
    use coil::ir::kernel::KernelKind;
    let (vocab, c) = (11, 6);
    let w = data(&[vocab, c], 20, 0.0).to_dtype(DType::F32).unwrap();
    coil::realize(&[&w]).unwrap(); // an f32 parameter: a graph input
    let ids = Tensor::from_vec(vec![3i64, 0, 3, 7, 3, 10, 0, 2, 3], &[9]).unwrap();
    let targets = Tensor::from_vec(vec![1i64, 4, 2, 9, 0, 3, 3, 8, 5], &[9]).unwrap();
    for autocast in [false, true] {
        let step = |backend| -> (Tensor, Tensor) {
            coil::set_backend(backend);
            coil::set_eager_tier(false);
            let h = w.index_select(0, &ids).unwrap().tanh().unwrap();
            let logits = match autocast {
                false => coil::linear(&h, &w, None).unwrap(),
                true => {
                    let (h, w) = (h.to_dtype(DType::BF16).unwrap(), w.to_dtype(DType::BF16).unwrap());
                    coil::linear(&h, &w, None).unwrap().to_dtype(DType::F32).unwrap()
                }
            };
            let loss = logits.cross_entropy(&targets, CrossEntropyOptions::default()).unwrap();
            let (value, g) = coil::value_and_grad(&loss, &[&w]).unwrap();
            (value, g.into_iter().next().unwrap())
        };
        // The compiled program: the rewrite fires, and no generated kernel stores an f32
        // table (the fill and the add are gone; the product and the scatter are extern calls;
        // under autocast the forward's bf16 copy of the table is one).
        let (value, grad) = step(Backend::Compiled);
        let graph = coil::decompose(&coil::capture(&[&value, &grad]).graph).unwrap();
        let (simple, report) = coil_passes::simplify(&graph, &coil_passes::RewriteOptions::default()).unwrap();
        assert_eq!(report.fired("scatter-into-addend"), 1, "autocast {autocast}: {report}");
        let program = coil_passes::split_reductions(&coil_passes::lower(&simple).unwrap());
        let schedule = coil_passes::schedule(&program);
        let text = coil_passes::print_schedule(&program, &schedule);
        let table = |b: &coil::ir::loops::BufferId| {
            program.buffer(*b).meta == coil::ir::TensorMeta::new(vec![vocab, c], DType::F32)
        };
        for k in schedule.kernels.iter().filter(|k| k.kind != KernelKind::Extern) {
            assert!(!k.stores.iter().any(table), "autocast {autocast}: {} stores the table:\n{text}", k.name);
        }
        assert_eq!(schedule.memory.in_outputs.len(), 1, "autocast {autocast}: the scatter's base\n{text}");
        let interpreted = step(Backend::Interpreter);
        let tol = if autocast { 1e-2 } else { 1e-5 };
        for (k, (got, want)) in [(&value, &interpreted.0), (&grad, &interpreted.1)].into_iter().enumerate() {
            let (got, want) = (got.to_vec::<f64>().unwrap(), want.to_vec::<f64>().unwrap());
            let diff: f64 = got.iter().zip(&want).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
            let norm: f64 = want.iter().map(|b| b * b).sum::<f64>().sqrt();
            assert!(diff <= tol * norm, "autocast {autocast}, output {k}: {diff:.2e} off (norm {norm:.2e})");
        }
    }
}
