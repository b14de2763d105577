//! Dropout inside the attention templates (`scaled_dot_product_attention_dropout`), shared by
//! `tests/attention/main.rs` (CPU) and `tests/gpu.rs` (CUDA). The reference is the
//! decomposition `softmax -> Dropout -> @ v` that the interpreter runs: the compiled templates
//! must keep exactly the weights it keeps (same Philox numbers) and agree with it in value,
//! forward and backward. PyTorch cannot be the oracle here (its RNG differs).

use super::{normals, rel_error, tensor};
use coil::{Backend, DType, Device, Result, Tensor};
use std::sync::Arc;

/// Restores the compiled backend (with the eager tier off, as the other attention tests run).
fn compiled_backend() {
    coil::set_backend(Backend::Compiled);
    coil::set_eager_tier(false);
}

/// A case's explicit mask.
#[derive(Clone, Copy, Debug, PartialEq)]
enum DropMask {
    /// None (causal or not).
    None,
    /// `[L, S]` bool over the batch: keys dropped for every row, row 1 keeps none.
    Bool,
    /// Of q's dtype, added, `[B, 1, L, S]` (`[B, L, S]` with one batch dim) over the heads:
    /// -inf in places, row 2 all -inf (BERT's padding mask in additive form).
    Added,
}

/// A run's values (the loss, the gradients, the output), and what the compile made of them
/// where compiled.
type Run = (Vec<Vec<f64>>, Option<Arc<coil::Compiled>>);

/// One case: batch dims, L, S, D, causal, the explicit mask, whether the (added) mask's own
/// gradient is wanted too (a learned bias), the dropout probability.
struct DropCase {
    batch: Vec<usize>,
    l: usize,
    s: usize,
    d: usize,
    causal: bool,
    mask: DropMask,
    mask_grad: bool,
    p: f64,
    dtype: DType,
}

impl DropCase {
    fn name(&self) -> String {
        let c = if self.causal { " causal" } else { "" };
        let m = match self.mask {
            DropMask::None => "",
            DropMask::Bool => " bool mask",
            DropMask::Added if self.mask_grad => " added mask (+its gradient)",
            DropMask::Added => " added mask",
        };
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
        let (l, s) = (self.l, self.s);
        match self.mask {
            DropMask::None => {}
            DropMask::Bool => {
                // Some keys are dropped for every row; row 1 keeps none.
                let keep: Vec<bool> = (0..l * s).map(|x| x / s != 1 && ((x % s) % 5 != 3 || x % s == 0)).collect();
                a.push(Tensor::from_vec(keep, &[l, s])?.to_device(device)?);
            }
            DropMask::Added => {
                let b = self.batch[0];
                let mut shape = vec![b];
                shape.extend(std::iter::repeat_n(1, self.batch.len() - 1));
                shape.extend([l, s]);
                let v: Vec<f32> = (0..b * l * s)
                    .map(|x| {
                        let (b, r, j) = (x / (l * s), x / s % l, x % s);
                        // Padding: batch index b drops its last 3 b keys; holes; row 2 dead.
                        if r == 2 || j + 3 * b >= s || (r + 2 * j) % 7 == 3 {
                            f32::NEG_INFINITY
                        } else {
                            ((r * 5 + j + 11 * b) as f32 * 0.3).sin()
                        }
                    })
                    .collect();
                a.push(tensor(&v, &shape, self.dtype, device)?);
            }
        }
        Ok(a)
    }

    /// `y = dropout(attention_dropout(q, k, v, mask?), 0.2)` (a second draw after the
    /// attention's), the loss `sum(y * w)` and the gradients with respect to q, k and v (and
    /// the mask when its gradient is wanted), then `y`, as f64 vectors, with the random stream
    /// seeded by `seed`, on `device`; what the compile made of them when the backend compiles.
    /// `written`: the attention written out as `safe_softmax(..).dropout(p)` with
    /// `Tensor::dropout` (which draws the same numbers: the reference of the definition,
    /// independent of the attention op's capture).
    fn run(&self, seed: u64, device: Device, written: bool) -> Result<Run> {
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
        let wrt: Vec<&Tensor> = a.iter().take(if self.mask_grad { 4 } else { 3 }).collect();
        let (loss, grads) = coil::value_and_grad(&loss, &wrt)?;
        // The value and the gradients as one graph of their own (the forward's own tensors
        // are not in it: its random ops draw where the recorded gradient graph says), then `y`.
        let outputs: Vec<&Tensor> = std::iter::once(&loss).chain(&grads).collect();
        let compiled = match coil::backend() {
            Backend::Compiled => Some(coil::inspect(&outputs)?),
            Backend::Interpreter => None,
        };
        coil::realize(&outputs)?;
        let mut values: Vec<Vec<f64>> = outputs.iter().map(|t| t.to_vec::<f64>()).collect::<Result<_>>()?;
        values.push(y.to_vec::<f64>()?);
        Ok((values, compiled))
    }

    /// The attention written out: f32 scores, the causal or explicit mask, a safe softmax (a
    /// row that keeps no key gives 0, as PyTorch's), then `Tensor::dropout` of the weights,
    /// `@ v`.
    fn written_out(&self, a: &[Tensor]) -> Result<Tensor> {
        let scores = a[0].matmul(&a[1].transpose(-2, -1)?)?.to_dtype(DType::F32)?.mul(1.0 / (self.d as f64).sqrt())?;
        let scores = match (self.causal, self.mask) {
            (true, _) => {
                let keep = Tensor::ones(&[self.l, self.s], DType::Bool).to_device(a[0].device())?.tril(0)?;
                coil::where_(&keep, &scores, f64::NEG_INFINITY)?
            }
            (false, DropMask::Bool) => coil::where_(&a[3], &scores, f64::NEG_INFINITY)?,
            (false, DropMask::Added) => scores.add(&a[3].to_dtype(DType::F32)?)?,
            (false, DropMask::None) => scores,
        };
        // exp(x - max) over its sum, the maximum of a dead row taken as 0 and its sum as 1.
        let max = scores.amax(&[-1], true)?.detach()?;
        let max = coil::where_(&max.isinf()?, 0.0, &max)?;
        let e = scores.sub(&max)?.exp()?;
        let total = e.sum(&[-1], true)?;
        let weights = e.div(&coil::where_(&total.eq(0.0)?, 1.0, &total)?)?;
        weights.dropout(self.p, true)?.to_dtype(self.dtype)?.matmul(&a[2])
    }

    /// What is wrong with the compiled program of the case, if anything: the attention must be
    /// one forward and one backward template call, both with the dropout (and the mask, read
    /// where it lies), and no buffer of the `[*batch, L, S]` scores; a learned bias's gradient
    /// takes the decomposition (no backward call).
    fn program_problem(&self, compiled: &coil::Compiled) -> Option<String> {
        let ir = &compiled.pre_fusion;
        let calls = |name: &str| ir.lines().filter(|l| l.contains(&format!("= extern {name} "))).collect::<Vec<_>>();
        let (forward, backward) = (calls("attention"), calls("attention_backward"));
        if self.mask_grad {
            return (!backward.is_empty())
                .then(|| format!("a backward call where the mask's gradient is wanted:\n{ir}"));
        }
        if forward.len() != 1 || backward.len() != 1 {
            return Some(format!("{} forward and {} backward attention calls in\n{ir}", forward.len(), backward.len()));
        }
        let dropout = format!("dropout_p={}", self.p);
        if !forward.iter().chain(&backward).all(|c| c.contains(&dropout)) {
            return Some(format!("a call without the dropout in\n{ir}"));
        }
        let masked = self.mask != DropMask::None;
        if masked && !forward.iter().chain(&backward).all(|c| c.contains(" mask=[")) {
            return Some(format!("a call without the mask in\n{ir}"));
        }
        let program = match &compiled.executable {
            coil::Executable::Cpu(g) => g.program(),
            coil::Executable::Cuda(g) => g.program(),
        };
        let scores = self.batch.iter().product::<usize>() * self.l * self.s;
        // Intermediates (the inputs are `arg<N>`: a mask may have the scores' shape).
        let full = program
            .buffers
            .iter()
            .filter(|b| !b.name.starts_with("arg"))
            .find(|b| b.meta.shape.ends_with(&[self.l, self.s]) || b.meta.numel() == scores);
        full.map(|b| format!("buffer {} ({}) has the scores' size in\n{ir}", b.name, b.meta))
    }
}

/// Compiled on `device` (the templates, forward and backward, masked or not) against the
/// interpreter, from the same seed: the output, the loss and the gradients, p = 0.1 and 0.5,
/// causal, not, bool and added masks with rows that keep no key, f32, bf16 and f16 (GPT-2's
/// head size with row and key tails); the compiled program holds the template calls with the
/// dropout (and the mask) and no buffer of the scores' size. An added mask whose gradient is
/// wanted takes the decomposition. The interpreter runs the attention op and, as the
/// reference, the attention written out with `Tensor::dropout` on its weights: all three agree.
pub fn check_dropout_grads(device: Device) {
    let c = |batch: &[usize], l, s, d, causal, mask, p, dtype| DropCase {
        batch: batch.to_vec(),
        l,
        s,
        d,
        causal,
        mask,
        mask_grad: false,
        p,
        dtype,
    };
    let bias = |case: DropCase| DropCase { mask_grad: true, ..case };
    let (none, bools, added) = (DropMask::None, DropMask::Bool, DropMask::Added);
    let cases = [
        c(&[2, 3], 37, 37, 16, true, none, 0.1, DType::F32),
        c(&[2, 3], 37, 37, 16, true, none, 0.5, DType::F32),
        c(&[2], 21, 70, 32, false, none, 0.1, DType::F32),
        c(&[3], 70, 19, 8, false, none, 0.5, DType::F32),
        c(&[1, 2], 33, 33, 32, true, none, 0.1, DType::BF16),
        c(&[2, 3], 130, 130, 64, true, none, 0.1, DType::BF16),
        c(&[2], 70, 150, 64, false, none, 0.5, DType::BF16),
        // A mask and dropout (BERT: a padding mask, attention dropout): both template calls.
        c(&[2, 2], 19, 45, 16, false, bools, 0.1, DType::F32),
        c(&[2, 2], 19, 45, 16, false, bools, 0.5, DType::F32),
        c(&[2, 2], 40, 40, 32, false, added, 0.1, DType::F32),
        c(&[3], 20, 33, 16, false, added, 0.5, DType::F32),
        c(&[2, 2], 70, 90, 64, false, bools, 0.1, DType::BF16),
        c(&[2, 2], 130, 130, 64, false, added, 0.1, DType::BF16),
        c(&[2], 33, 70, 40, false, added, 0.3, DType::F16),
        // A learned bias: the mask's gradient too, through the decomposition.
        bias(c(&[2, 2], 19, 45, 16, false, added, 0.1, DType::F32)),
    ];
    let mut failures = Vec::new();
    for case in &cases {
        compiled_backend();
        coil::set_default_device(device);
        let (got, compiled) = case.run(11, device, false).unwrap();
        if let Some(problem) = case.program_problem(&compiled.expect("compiled")) {
            failures.push(format!("{}: {problem}", case.name()));
        }
        coil::set_backend(Backend::Interpreter);
        coil::set_default_device(Device::Cpu);
        let (want, _) = case.run(11, Device::Cpu, true).unwrap();
        let (op, _) = case.run(11, Device::Cpu, false).unwrap();
        compiled_backend();
        coil::set_default_device(device);
        let tolerance = if case.dtype == DType::F32 { 1e-5 } else { 2e-2 };
        let names: &[&str] = if case.mask_grad {
            &["loss", "dq", "dk", "dv", "dmask", "output"]
        } else {
            &["loss", "dq", "dk", "dv", "output"]
        };
        for (path, values) in [("compiled", &got), ("the interpreted op", &op)] {
            for (i, what) in names.iter().enumerate() {
                let err = rel_error(&values[i], &want[i]);
                if values[i].len() != want[i].len() || err > tolerance {
                    failures.push(format!("{}: {path}: {what} relative error {err:.2e}", case.name()));
                }
            }
        }
        // A different seed draws a different mask: the outputs differ.
        let (other, _) = case.run(12, device, false).unwrap();
        let output = names.len() - 1;
        if rel_error(&other[output], &got[output]) < 1e-3 {
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
/// dropout and its gradients (`then_dropout`: then a dropout of its output; `masked`: with a
/// `[B, 1, 1, T]` padding mask instead of the causal rule). At every length it draws what the
/// interpreter draws from the same seed. Alone, one compile serves every length; a draw after
/// the attention's `B H T T` numbers starts at an offset quadratic in the length, which the
/// dynamic machinery (multilinear sizes) does not take: the sizes stay static, one compile per
/// length, still right.
#[allow(dead_code)] // tests/gpu.rs shares this module and runs the device cases only
pub fn check_dropout_dynamic(then_dropout: bool, masked: bool) {
    let body = move |a: &[Tensor]| -> Result<Vec<Tensor>> {
        let (b, t, h, d) = (a[0].shape()[0] as i64, a[0].shape()[1] as i64, 2i64, 8i64);
        let heads = |x: &Tensor| x.view(&[b, t, h, d])?.transpose(1, 2);
        let (q, k, v) = (heads(&a[0])?, heads(&a[1])?, heads(&a[2])?);
        let y = coil::scaled_dot_product_attention_dropout(&q, &k, &v, a.get(3), 0.3, !masked, None)?;
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
    // Padding: batch index 1 keeps its first t - 3 keys.
    let padding = |t: usize| {
        let keep: Vec<bool> = (0..2 * t).map(|x| x % t + 3 * (x / t) < t).collect();
        let mask = Tensor::from_vec(keep, &[2, 1, 1, t]).unwrap();
        mask.mark_dynamic(3).unwrap();
        mask
    };
    let lengths = [5usize, 9, 70];
    for t in lengths {
        let mut args = vec![make(t, 1), make(t, 2), make(t, 3)];
        if masked {
            args.push(padding(t));
        }
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
    // The calls (forward, backward) with the dropout, and the mask when masked.
    let mut args = vec![make(40, 1), make(40, 2), make(40, 3)];
    if masked {
        args.push(padding(40));
    }
    let outputs = body(&args).unwrap();
    let ir = &coil::inspect(&outputs.iter().collect::<Vec<_>>()).unwrap().pre_fusion;
    let calls: Vec<&str> = ir.lines().filter(|l| l.contains("= extern attention")).collect();
    assert_eq!(calls.len(), 2, "{ir}");
    assert!(calls.iter().all(|c| c.contains("dropout_p=0.3") && c.contains(" mask=[") == masked), "{ir}");
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

/// BERT's attention in training: `[B, H, T, D]` heads, a `[B, 1, 1, T]` padding mask, attention
/// dropout, gradients of q, k and v. The graph the compile path makes of the step (decomposed
/// with the attention templates, then simplified) holds the attention, its logsumexp and the
/// three gradients as template ops with the mask (and the forward and the gradients with the
/// dropout), and no node of the `[B, H, T, T]` scores' shape; lowered and compiled for the
/// CPU, one forward and one backward call and no buffer of the scores' size.
#[allow(dead_code)] // tests/gpu.rs shares this module and runs the device cases only
pub fn check_masked_dropout_training_graph() {
    use coil::ir::Op;
    let (b, h, t, d) = (2usize, 4usize, 48usize, 16usize);
    compiled_backend();
    coil::set_default_device(Device::Cpu);
    let shape = [b, h, t, d];
    let a: Vec<Tensor> = (1..=3)
        .map(|seed| tensor(&normals(seed, b * h * t * d), &shape, DType::F32, Device::Cpu))
        .collect::<Result<_>>()
        .unwrap();
    // Batch index 1 pads its last 9 positions.
    let keep: Vec<bool> = (0..b * t).map(|x| x % t + 9 * (x / t) < t).collect();
    let mask = Tensor::from_vec(keep, &[b, 1, 1, t]).unwrap();
    coil::manual_seed(5);
    let y = coil::scaled_dot_product_attention_dropout(&a[0], &a[1], &a[2], Some(&mask), 0.1, false, None).unwrap();
    let loss = y.mul(&y).unwrap().sum_all().unwrap();
    let (loss, grads) = coil::value_and_grad(&loss, &[&a[0], &a[1], &a[2]]).unwrap();
    let outputs: Vec<&Tensor> = std::iter::once(&loss).chain(&grads).collect();

    let graph = coil::capture(&outputs).graph;
    let options = coil_passes::DecomposeOptions { fused_attention: true, ..Default::default() };
    let primitive = coil_passes::decompose_with(&graph, &options).unwrap();
    let (primitive, _) = coil_passes::simplify(&primitive, &coil_passes::RewriteOptions::default()).unwrap();
    let live: Vec<&coil::ir::Node> = primitive.live_nodes().into_iter().map(|n| primitive.node(n)).collect();
    let count = |f: &dyn Fn(&Op) -> bool| live.iter().filter(|n| f(&n.op)).count();
    let text = primitive.to_string();
    let forward = count(&|op| matches!(op, Op::Attention { mask: true, dropout: Some(dr), .. } if dr.p == 0.1));
    let lse = count(&|op| matches!(op, Op::AttentionLogsumexp { mask: true, .. }));
    let backward =
        count(&|op| matches!(op, Op::AttentionBackward { mask: true, dropout: Some(dr), .. } if dr.p == 0.1));
    assert_eq!((forward, lse, backward), (1, 1, 3), "attention, logsumexp, gradients in\n{text}");
    let scores = live.iter().find(|n| n.meta.shape.ends_with(&[t, t]));
    assert!(scores.is_none(), "a node of the scores' shape: {:?}\n{text}", scores.map(|n| &n.meta));

    let compiled = coil::inspect(&outputs).unwrap();
    let coil::Executable::Cpu(cpu) = &compiled.executable else { panic!("a CPU graph") };
    let ir = cpu.program().to_string();
    let calls = |name: &str| ir.lines().filter(|l| l.contains(&format!("= extern {name} "))).collect::<Vec<_>>();
    let (forward, backward) = (calls("attention"), calls("attention_backward"));
    assert!(forward.len() == 1 && backward.len() == 1, "one call each way in\n{ir}");
    assert!(forward.iter().chain(&backward).all(|c| c.contains(" mask=[") && c.contains("dropout_p=0.1")), "{ir}");
    let full = cpu
        .program()
        .buffers
        .iter()
        .filter(|x| !x.name.starts_with("arg"))
        .find(|x| x.meta.shape.ends_with(&[t, t]) || x.meta.numel() == b * h * t * t);
    assert!(full.is_none(), "a buffer of the scores' size: {:?}", full.map(|x| (&x.name, &x.meta)));
}

/// Masked attention with dropout and no gradient, few query rows (a decode step: grouped-query
/// rows against a cache of which a prefix is kept; the split kernels on CUDA): one template call
/// with the mask and the dropout, agreeing with the interpreter from the same seed; f32, bf16.
pub fn check_masked_dropout_forward(device: Device) {
    let (batch, l, s, d, p) = ([2usize, 2usize], 4usize, 150usize, 64usize, 0.3);
    for dtype in [DType::F32, DType::BF16] {
        let run = |device: Device| -> Result<(Vec<f64>, Option<String>)> {
            let rows = |n: usize| [batch[0], batch[1], n, d];
            let make =
                |seed: u64, n: usize| tensor(&normals(seed, batch[0] * batch[1] * n * d), &rows(n), dtype, device);
            let (q, k, v) = (make(1, l)?, make(2, s)?, make(3, s)?);
            // Row r keeps the keys up to position 90 + r: the cache beyond is dropped.
            let keep: Vec<bool> = (0..l * s).map(|x| x % s <= 90 + x / s).collect();
            let mask = Tensor::from_vec(keep, &[l, s])?.to_device(device)?;
            coil::manual_seed(4);
            let y = coil::scaled_dot_product_attention_dropout(&q, &k, &v, Some(&mask), p, false, None)?;
            let ir = match coil::backend() {
                Backend::Compiled => Some(coil::inspect(&[&y])?.pre_fusion.clone()),
                Backend::Interpreter => None,
            };
            Ok((y.to_vec::<f64>()?, ir))
        };
        compiled_backend();
        coil::set_default_device(device);
        let (got, ir) = run(device).unwrap();
        let ir = ir.expect("compiled");
        let calls: Vec<&str> = ir.lines().filter(|x| x.contains("= extern attention")).collect();
        assert!(calls.len() == 1 && calls[0].contains(" mask=[") && calls[0].contains("dropout_p=0.3"), "{ir}");
        coil::set_backend(Backend::Interpreter);
        coil::set_default_device(Device::Cpu);
        let (want, _) = run(Device::Cpu).unwrap();
        compiled_backend();
        coil::set_default_device(device);
        let err = rel_error(&got, &want);
        let tolerance = if dtype == DType::F32 { 1e-5 } else { 1e-2 };
        assert!(err <= tolerance, "{dtype} on {device}: relative error {err:.2e}");
    }
}
