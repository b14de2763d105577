//! Training: a two-layer MLP classifier fit by plain SGD on the default device (a CUDA GPU when
//! one is usable, else the CPU).
//!
//! The training step (forward, cross-entropy, gradients) is one compiled function: `coil::grad`
//! returns the gradients as lazy tensors, so forward and backward are captured, fused and
//! compiled as one graph, once; later steps reuse it. The weights are updated outside it,
//! computed and detached, so each step starts from data and nothing of earlier steps is kept.
//!
//! Run with `cargo run --release --example train_mlp`.

use coil::{CrossEntropyOptions, DType, Device, Tensor};

fn main() -> coil::Result<()> {
    let device = Device::default();
    coil::set_default_device(device);
    coil::manual_seed(0);
    let (n, d, hidden, classes) = (512, 16, 64, 4);

    // Labels from a random linear teacher: the class with the largest score.
    let x = Tensor::randn(&[n, d], DType::F32)?;
    let teacher = Tensor::randn(&[d, classes], DType::F32)?;
    let labels = x.matmul(&teacher)?.argmax(Some(1), false)?;
    coil::realize(&[&x, &labels])?;

    let w1 = Tensor::randn(&[hidden, d], DType::F32)? * 0.25;
    let w2 = Tensor::randn(&[classes, hidden], DType::F32)? * 0.125;
    coil::realize(&[&w1, &w2])?;
    let (mut w1, mut w2) = (w1.detach()?, w2.detach()?);

    // One training step: the loss and its gradients with respect to the weights.
    let step = coil::compile(|a: &[Tensor]| {
        let (x, labels, w1, w2) = (&a[0], &a[1], &a[2], &a[3]);
        let h = coil::linear(x, w1, None)?.gelu(false)?;
        let loss = coil::linear(&h, w2, None)?.cross_entropy(labels, CrossEntropyOptions::default())?;
        let (loss, grads) = coil::value_and_grad(&loss, &[w1, w2])?;
        Ok(vec![loss, grads[0].clone(), grads[1].clone()])
    })
    .named("train_step");

    let lr = 0.5;
    let mut first = None;
    for i in 0..=60 {
        let out = step.call(&[&x, &labels, &w1, &w2])?;
        let loss = out[0].item::<f32>()?;
        first.get_or_insert(loss);
        if i % 10 == 0 {
            println!("step {i:3}: loss {loss:.4}");
        }
        // SGD. Computed, then detached: the new weights keep none of the steps that made them,
        // so the old weights and gradients are freed.
        let (n1, n2) = (&w1 - &(&out[1] * lr), &w2 - &(&out[2] * lr));
        coil::realize(&[&n1, &n2])?;
        (w1, w2) = (n1.detach()?, n2.detach()?);
    }

    let logits = coil::linear(&coil::linear(&x, &w1, None)?.gelu(false)?, &w2, None)?;
    let predicted = logits.argmax(Some(1), false)?.to_vec::<i64>()?;
    let truth = labels.to_vec::<i64>()?;
    let right = predicted.iter().zip(&truth).filter(|(p, t)| p == t).count();
    println!(
        "on {device}: loss {:.4} -> {:.4}, training accuracy {:.1}%, {} compile(s) of the step",
        first.unwrap_or(f32::NAN),
        step.call(&[&x, &labels, &w1, &w2])?[0].item::<f32>()?,
        100.0 * right as f64 / n as f64,
        step.compile_count()
    );
    Ok(())
}
