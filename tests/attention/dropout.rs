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

    /// The loss `sum(y * w)` and the gradients with respect to q, k and v, then `y`, as f64
    /// vectors, with the random stream seeded by `seed`, on `device`; the compiled program's
    /// pre-fusion IR when the backend compiles.
    fn run(&self, seed: u64, device: Device) -> Result<(Vec<Vec<f64>>, Option<String>)> {
        let a = self.inputs(device)?;
        coil::manual_seed(seed);
        let y = coil::scaled_dot_product_attention_dropout(&a[0], &a[1], &a[2], a.get(3), self.p, self.causal, None)?;
        let w = tensor(&normals(7, y.shape().iter().product()), y.shape(), DType::F32, device)?;
        let loss = y.to_dtype(DType::F32)?.mul(&w)?.sum_all()?;
        let (loss, grads) = coil::value_and_grad(&loss, &[&a[0], &a[1], &a[2]])?;
        let outputs: Vec<&Tensor> = std::iter::once(&loss).chain(&grads).chain([&y]).collect();
        let ir = match coil::backend() {
            Backend::Compiled => Some(coil::inspect(&outputs)?.pre_fusion.clone()),
            Backend::Interpreter => None,
        };
        coil::realize(&outputs)?;
        Ok((outputs.iter().map(|t| t.to_vec::<f64>()).collect::<Result<_>>()?, ir))
    }
}

/// Compiled on `device` (the templates, forward and backward, for maskless attention; the
/// decomposition with a mask) against the interpreter, from the same seed: the output, the
/// loss and the three gradients, p = 0.1 and 0.5, causal, not, masked, f32 and bf16 (GPT-2's
/// head size with row and key tails); the compiled program keeps both template calls.
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
        let (got, ir) = case.run(11, device).unwrap();
        let ir = ir.expect("compiled");
        let templates = ir.contains("extern attention ") && ir.contains("extern attention_backward");
        if !case.masked && !templates {
            failures.push(format!("{}: no attention template calls in\n{ir}", case.name()));
        }
        coil::set_backend(Backend::Interpreter);
        coil::set_default_device(Device::Cpu);
        let (want, _) = case.run(11, Device::Cpu).unwrap();
        compiled_backend();
        coil::set_default_device(device);
        let tolerance = if case.dtype == DType::F32 { 1e-5 } else { 2e-2 };
        for (i, what) in ["loss", "dq", "dk", "dv", "output"].iter().enumerate() {
            let err = rel_error(&got[i], &want[i]);
            if err > tolerance {
                failures.push(format!("{}: {what} relative error {err:.2e}", case.name()));
            }
        }
        // A different seed draws a different mask: the outputs differ.
        let (other, _) = case.run(12, device).unwrap();
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
