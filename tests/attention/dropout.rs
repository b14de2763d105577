//! Dropout inside the attention templates (`scaled_dot_product_attention_dropout`), shared by
//! `tests/attention/main.rs` (CPU) and `tests/gpu.rs` (CUDA). The reference is the
//! decomposition `softmax -> Dropout -> @ v` that the interpreter runs: the compiled templates
//! must keep exactly the weights it keeps (same Philox numbers) and agree with it in value,
//! forward and backward. PyTorch cannot be the oracle here (its RNG differs).

use super::{normals, rel_error, tensor};
use coil::{Backend, DType, Device, Result, Tensor};

/// Restores the compiled backend (with the eager tier off, as the other attention tests run).
fn compiled_backend() {
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
}

/// One case: batch dims, L, S, D, causal, an explicit bool mask, the dropout probability.
struct DropCase {
    batch: Vec<usize>,
    l: usize,
    s: usize,
    d: usize,
    causal: bool,
    masked: bool,
    p: f64,
    dtype: DType,
}

impl DropCase {
    fn name(&self) -> String {
        let (c, m) = (if self.causal { " causal" } else { "" }, if self.masked { " masked" } else { "" });
        format!("{} {:?} L={} S={} D={} p={}{c}{m}", self.dtype, self.batch, self.l, self.s, self.d, self.p)
    }

    /// The inputs on `device`: q, k, v (and the mask when masked).
    fn inputs(&self, device: Device) -> Result<Vec<Tensor>> {
        let shape = |rows: usize| -> Vec<usize> { self.batch.iter().copied().chain([rows, self.d]).collect() };
        let make = |seed: u64, rows: usize| {
            let shape = shape(rows);
            tensor(&normals(seed, shape.iter().product()), &shape, self.dtype, device)
        };
        let mut a = vec![make(1, self.l)?, make(2, self.s)?, make(3, self.s)?];
        if self.masked {
            // Every row keeps a few keys; some keys are dropped for every row.
            let keep: Vec<bool> = (0..self.l * self.s).map(|x| (x % self.s) % 5 != 3 || x % self.s == 0).collect();
            a.push(Tensor::from_vec(keep, &[self.l, self.s])?.to_device(device)?);
        }
        Ok(a)
    }

    /// `y = dropout(attention_dropout(q, k, v), 0.2)` (a second draw after the attention's),
    /// the loss `sum(y * w)` and the gradients with respect to q, k and v, then `y`, as f64
    /// vectors, with the random stream seeded by `seed`, on `device`; the compiled program's
    /// pre-fusion IR when the backend compiles. `written`: the attention written out as
    /// `softmax(..).dropout(p)` with `Tensor::dropout` (which draws the same numbers: the
    /// reference of the definition, independent of the attention op's capture).
    fn run(&self, seed: u64, device: Device, written: bool) -> Result<(Vec<Vec<f64>>, Option<String>)> {
        let a = self.inputs(device)?;
        coil::manual_seed(seed);
        let y = if written {
            self.written_out(&a)?
        } else {
            coil::scaled_dot_product_attention_dropout(&a[0], &a[1], &a[2], a.get(3), self.p, self.causal, None)?
        };
        let y = y.dropout(0.2, true)?;
        let w = tensor(&normals(7, y.shape().iter().product()), y.shape(), DType::F32, device)?;
        let loss = y.to_dtype(DType::F32)?.mul(&w)?.sum_all()?;
        let (loss, grads) = coil::value_and_grad(&loss, &[&a[0], &a[1], &a[2]])?;
        // The value and the gradients as one graph of their own (the forward's own tensors
        // are not in it: its random ops draw where the recorded gradient graph says), then `y`.
        let outputs: Vec<&Tensor> = std::iter::once(&loss).chain(&grads).collect();
        let ir = match coil::backend() {
            Backend::Compiled => Some(coil::inspect(&outputs)?.pre_fusion.clone()),
            Backend::Interpreter => None,
        };
        coil::realize(&outputs)?;
        let mut values: Vec<Vec<f64>> = outputs.iter().map(|t| t.to_vec::<f64>()).collect::<Result<_>>()?;
        values.push(y.to_vec::<f64>()?);
        Ok((values, ir))
    }

    /// The attention written out: f32 scores, the causal or explicit mask, softmax, then
    /// `Tensor::dropout` of the weights, `@ v`.
    fn written_out(&self, a: &[Tensor]) -> Result<Tensor> {
        let scores = a[0].matmul(&a[1].transpose(-2, -1)?)?.to_dtype(DType::F32)?.mul(1.0 / (self.d as f64).sqrt())?;
        let keep = if self.causal {
            Some(Tensor::ones(&[self.l, self.s], DType::Bool).to_device(a[0].device())?.tril(0)?)
        } else {
            a.get(3).cloned()
        };
        let scores = match keep {
            Some(keep) => coil::where_(&keep, &scores, f64::NEG_INFINITY)?,
            None => scores,
        };
        scores.softmax(-1)?.dropout(self.p, true)?.to_dtype(self.dtype)?.matmul(&a[2])
    }
}

/// Compiled on `device` (the templates, forward and backward, for maskless attention; the
/// decomposition with a mask) against the interpreter, from the same seed: the output, the
/// loss and the three gradients, p = 0.1 and 0.5, causal, not, masked, f32 and bf16 (GPT-2's
/// head size with row and key tails); the compiled program keeps both template calls. The
/// interpreter runs the attention op and, as the reference, the attention written out with
/// `Tensor::dropout` on its weights: all three agree.
pub fn check_dropout_grads(device: Device) {
    let c = |batch: &[usize], l, s, d, causal, masked, p, dtype| DropCase {
        batch: batch.to_vec(),
        l,
        s,
        d,
        causal,
        masked,
        p,
        dtype,
    };
    let cases = [
        c(&[2, 3], 37, 37, 16, true, false, 0.1, DType::F32),
        c(&[2, 3], 37, 37, 16, true, false, 0.5, DType::F32),
        c(&[2], 21, 70, 32, false, false, 0.1, DType::F32),
        c(&[3], 70, 19, 8, false, false, 0.5, DType::F32),
        c(&[2, 2], 19, 45, 16, false, true, 0.1, DType::F32),
        c(&[2, 2], 19, 45, 16, false, true, 0.5, DType::F32),
        c(&[1, 2], 33, 33, 32, true, false, 0.1, DType::BF16),
        c(&[2, 3], 130, 130, 64, true, false, 0.1, DType::BF16),
        c(&[2], 70, 150, 64, false, false, 0.5, DType::BF16),
    ];
    let mut failures = Vec::new();
    for case in &cases {
        compiled_backend();
        coil::set_default_device(device);
        let (got, ir) = case.run(11, device, false).unwrap();
        let ir = ir.expect("compiled");
        let templates = ir.contains("extern attention ") && ir.contains("extern attention_backward");
        if !case.masked && !templates {
            failures.push(format!("{}: no attention template calls in\n{ir}", case.name()));
        }
        coil::set_backend(Backend::Interpreter);
        coil::set_default_device(Device::Cpu);
        let (want, _) = case.run(11, Device::Cpu, true).unwrap();
        let (op, _) = case.run(11, Device::Cpu, false).unwrap();
        compiled_backend();
        coil::set_default_device(device);
        let tolerance = if case.dtype == DType::F32 { 1e-5 } else { 2e-2 };
        for (path, values) in [("compiled", &got), ("the interpreted op", &op)] {
            for (i, what) in ["loss", "dq", "dk", "dv", "output"].iter().enumerate() {
                let err = rel_error(&values[i], &want[i]);
                if err > tolerance {
                    failures.push(format!("{}: {path}: {what} relative error {err:.2e}", case.name()));
                }
            }
        }
        // A different seed draws a different mask: the outputs differ.
        let (other, _) = case.run(12, device, false).unwrap();
        if rel_error(&other[4], &got[4]) < 1e-3 {
            failures.push(format!("{}: seeds 11 and 12 gave the same output", case.name()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `q = 0` makes every weight `1 / S` and `v = I` reads the weights out: `y` is the dropped
/// weights themselves, 0 or `1 / (S (1 - p))`. Returns `y` of `f` (as f32) on `[B, H, S, S]`
/// inputs of `dtype` on `device`.
fn weights(
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>>,
    (batch, s): (&[usize], usize),
    dtype: DType,
    device: Device,
) -> Result<Vec<f32>> {
    let shape: Vec<usize> = batch.iter().copied().chain([s, s]).collect();
    let n: usize = shape.iter().product();
    let q = tensor(&vec![0.0; n], &shape, dtype, device)?;
    let k = tensor(&normals(5, n), &shape, dtype, device)?;
    let eye: Vec<f32> = (0..n).map(|i| if i % s == (i / s) % s { 1.0 } else { 0.0 }).collect();
    let v = tensor(&eye, &shape, dtype, device)?;
    f(&[q, k, v])?[0].to_vec::<f32>()
}

/// The template on `device` keeps exactly the weights the decomposition keeps, bit for bit,
/// and their share is `1 - p` (f32 and bf16: the simple and the tensor-core kernels on CUDA);
/// a compiled function draws a new mask at every call without recompiling; `p = 0` is
/// attention without dropout, exactly.
pub fn check_dropout_masks(device: Device) {
    let (batch, s) = ([4, 4], 64);
    for (p, dtype) in [(0.1, DType::F32), (0.5, DType::F32), (0.1, DType::BF16), (0.5, DType::BF16)] {
        let step = move |a: &[Tensor]| -> Result<Vec<Tensor>> {
            Ok(vec![coil::scaled_dot_product_attention_dropout(&a[0], &a[1], &a[2], None, p, false, None)?])
        };
        let f = coil::compile(step);
        compiled_backend();
        coil::set_default_device(device);
        coil::manual_seed(3);
        let first = weights(|a| f.call(&a.iter().collect::<Vec<_>>()), (&batch, s), dtype, device).unwrap();
        let second = weights(|a| f.call(&a.iter().collect::<Vec<_>>()), (&batch, s), dtype, device).unwrap();
        assert_eq!(f.compile_count(), 1, "{:?}", f.recompile_reasons());
        coil::set_backend(Backend::Interpreter);
        coil::set_default_device(Device::Cpu);
        coil::manual_seed(3);
        let want = weights(step, (&batch, s), dtype, Device::Cpu).unwrap();
        compiled_backend();
        coil::set_default_device(device);
        let kept = |w: &[f32]| -> Vec<bool> { w.iter().map(|&x| x != 0.0).collect() };
        let what = format!("{dtype} p={p} on {device}");
        assert_eq!(kept(&first), kept(&want), "{what}: the template keeps other weights than the decomposition");
        let (scaled, tolerance) = (1.0 / (s as f64 * (1.0 - p)), if dtype == DType::F32 { 1e-6 } else { 1e-2 });
        assert!(first.iter().all(|&x| x == 0.0 || ((x as f64) - scaled).abs() <= tolerance * scaled), "{what}");
        let share = first.iter().filter(|&&x| x != 0.0).count() as f64 / first.len() as f64;
        // 65536 weights: the share's standard deviation is at most 0.002.
        assert!((share - (1.0 - p)).abs() < 0.01, "{what}: kept share {share}");
        let same = kept(&first).iter().zip(kept(&second)).filter(|(a, b)| **a == *b).count();
        assert!(same < first.len() * 95 / 100, "{what}: two calls drew (nearly) the same mask");
    }
    // p = 0: exactly the attention without dropout, compiled and interpreted.
    for (backend, device) in [(Backend::Compiled, device), (Backend::Interpreter, Device::Cpu)] {
        coil::set_backend(backend);
        coil::set_default_device(device);
        let a: Vec<Tensor> = (0..3)
            .map(|i| tensor(&normals(i, 2 * 9 * 16), &[2, 9, 16], DType::F32, device))
            .collect::<Result<_>>()
            .unwrap();
        let y0 = coil::scaled_dot_product_attention_dropout(&a[0], &a[1], &a[2], None, 0.0, true, None).unwrap();
        let y = coil::scaled_dot_product_attention(&a[0], &a[1], &a[2], None, true, None).unwrap();
        assert_eq!(y0.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
    }
    compiled_backend();
    coil::set_default_device(device);
}

/// A probability outside `[0, 1)` is an error naming the op, the operands and this line.
pub fn check_dropout_errors() {
    let q = Tensor::zeros(&[2, 4, 8], DType::F32);
    for p in [1.0, 1.5, -0.25] {
        let e = coil::scaled_dot_product_attention_dropout(&q, &q, &q, None, p, false, None).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("scaled_dot_product_attention") && text.contains("f32[2, 4, 8]"), "{text}");
        assert!(text.contains(file!()), "{text}");
    }
}

/// A compiled function whose sequence length is dynamic (`mark_dynamic`): attention with
/// dropout and its gradients (`then_dropout`: then a dropout of its output). At every length it
/// draws what the interpreter draws from the same seed. Alone, one compile serves every length;
/// a draw after the attention's `B H T T` numbers starts at an offset quadratic in the length,
/// which the dynamic machinery (multilinear sizes) does not take: the sizes stay static, one
/// compile per length, still right.
#[allow(dead_code)] // tests/gpu.rs shares this module and runs the device cases only
pub fn check_dropout_dynamic(then_dropout: bool) {
    let body = move |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let (b, t, h, d) = (a[0].shape()[0] as i64, a[0].shape()[1] as i64, 2i64, 8i64);
        let heads = |x: &Tensor| x.view(&[b, t, h, d])?.transpose(1, 2);
        let (q, k, v) = (heads(&a[0])?, heads(&a[1])?, heads(&a[2])?);
        let y = coil::scaled_dot_product_attention_dropout(&q, &k, &v, None, 0.3, true, None)?;
        let y = if then_dropout { y.dropout(0.2, true)? } else { y };
        let loss = y.mul(&y)?.sum_all()?;
        let (loss, grads) = coil::value_and_grad(&loss, &[&a[0], &a[1], &a[2]])?;
        Ok(std::iter::once(loss).chain(grads).collect())
    };
    let f = coil::compile(body).named("attention_dropout_dynamic");
    compiled_backend();
    coil::set_default_device(Device::Cpu);
    let make = |t: usize, seed: u64| {
        let x = tensor(&normals(seed, 2 * t * 16), &[2, t, 16], DType::F32, Device::Cpu).unwrap();
        x.mark_dynamic(1).unwrap();
        x
    };
    let lengths = [5usize, 9, 70];
    for t in lengths {
        let args = [make(t, 1), make(t, 2), make(t, 3)];
        coil::manual_seed(21);
        let got: Vec<Vec<f64>> =
            f.call(&args.iter().collect::<Vec<_>>()).unwrap().iter().map(|x| x.to_vec::<f64>().unwrap()).collect();
        coil::set_backend(Backend::Interpreter);
        coil::manual_seed(21);
        let want: Vec<Vec<f64>> = body(&args).unwrap().iter().map(|x| x.to_vec::<f64>().unwrap()).collect();
        compiled_backend();
        for (i, (x, y)) in got.iter().zip(&want).enumerate() {
            let err = rel_error(x, y);
            assert!(err <= 1e-5, "T = {t}: output {i} (0: the loss) differs by {err:.2e}");
        }
    }
    let compiles = if then_dropout { lengths.len() } else { 1 };
    assert_eq!(f.compile_count(), compiles, "{:?}", f.recompile_reasons());
}

/// A GPT-2 training step with attention dropout (`coil::nn`: `CausalSelfAttention` calls
/// `scaled_dot_product_attention_dropout` in training) keeps each layer's attention one
/// template call forward and one backward, both with the dropout, and agrees with the
/// interpreter from the same seed; in eval mode the calls have no dropout.
#[allow(dead_code)] // tests/gpu.rs shares this module and runs the device cases only
pub fn check_gpt2_training_with_dropout() {
    use coil::nn::models::gpt2::{Gpt2, Gpt2Config};
    use coil::nn::ParamStore;
    let (b, t, n_layer) = (2usize, 24usize, 2usize);
    let config = Gpt2Config {
        vocab_size: 50,
        block_size: 32,
        n_layer,
        n_head: 2,
        n_embd: 32,
        dropout: 0.1,
        layer_norm_eps: 1e-5,
    };
    coil::set_default_device(Device::Cpu);
    compiled_backend();
    coil::manual_seed(3);
    let store = ParamStore::new();
    let model = Gpt2::new(&store.root(Device::Cpu, DType::F32), config).unwrap();
    let tokens = |seed: i64| -> Tensor {
        let v: Vec<i64> = (0..(b * t) as i64).map(|i| (i * 7 + seed * 13) % 50).collect();
        Tensor::from_vec(v, &[b, t]).unwrap()
    };
    let (idx, targets) = (tokens(1), tokens(2));
    let step = || -> Vec<Vec<f64>> {
        coil::manual_seed(17);
        let (loss, grads) = coil::nn::value_and_grad(&model.loss(&idx, &targets).unwrap(), &store.params()).unwrap();
        let outputs: Vec<&Tensor> = std::iter::once(&loss).chain(&grads).collect();
        if coil::backend() == Backend::Compiled {
            let ir = coil::inspect(&outputs).unwrap().pre_fusion.clone();
            let forward = ir.matches("extern attention causal").count();
            let dropped = ir.lines().filter(|l| l.contains("extern attention") && l.contains("dropout_p=0.1")).count();
            assert_eq!((forward, dropped), (n_layer, 2 * n_layer), "forward and backward calls with dropout in\n{ir}");
        }
        outputs.iter().map(|x| x.to_vec::<f64>().unwrap()).collect()
    };
    let got = step();
    coil::set_backend(Backend::Interpreter);
    let want = step();
    compiled_backend();
    for (i, (x, y)) in got.iter().zip(&want).enumerate() {
        let err = rel_error(x, y);
        assert!(err <= 1e-4, "output {i} (0: the loss): relative error {err:.2e}");
    }
    store.eval();
    let logits = model.forward(&idx).unwrap();
    let ir = coil::inspect(&[&logits]).unwrap().pre_fusion.clone();
    assert!(ir.contains("extern attention causal") && !ir.contains("dropout_p"), "eval mode drops nothing:\n{ir}");
    store.train();
}
