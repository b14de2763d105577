//! A small ResNet's training steps on CUDA against the CPU (for the GPU test binary): the
//! compiled step (forward in training mode with the batch norms' running statistics written in
//! place inside it, channels-last activations, convolutions through cuDNN where it loads,
//! gradients) and SGD with momentum, three steps.
//!
//! The two devices run in lockstep: before each step the CPU's model takes the CUDA model's
//! parameters and buffers, and the CPU's optimizer takes the CUDA step's gradients. Each
//! comparison is then one step from the same state, so it can be tight. Two free-running
//! trainings cannot be compared closely: a ReLU or max-pool input that crosses its boundary in
//! one run and not in the other moves a gradient at once (4e-8 of difference in one gradient of
//! step 0 gave 1.4e-3 in step 1 and 8e-2 in step 2).

use coil::nn::models::resnet::{ResNet, ResNetConfig};
use coil::nn::{Optimizer, ParamStore, Sgd, SgdConfig};
use coil::{DType, Device, Tensor};

const STEPS: usize = 3;

/// What three training steps on one device leave: the losses, each step's gradients (in the
/// optimizer's order), then every parameter and buffer (in the store's order).
#[derive(PartialEq)]
pub struct Trained {
    pub losses: Vec<f64>,
    pub grads: Vec<Vec<Vec<f64>>>,
    pub state: Vec<Vec<f64>>,
}

/// A compiled training step: images and labels to the loss and the gradients.
type Step = Box<dyn Fn(&Tensor, &Tensor) -> coil::Result<Vec<Tensor>>>;

/// One model, its optimizer and its compiled step on one device.
struct Trainer {
    store: ParamStore,
    sgd: Sgd,
    step: Step,
}

impl Trainer {
    fn new(device: Device) -> coil::Result<Trainer> {
        // Seed 13: no step of the three sits at a gradient discontinuity (seed 11's second
        // and third did; see `gradient_movement`).
        coil::manual_seed(13);
        let store = ParamStore::new();
        let config = ResNetConfig { layers: [1, 2, 1, 1], width: 8, num_classes: 10 };
        let model = ResNet::new(&store.root(device, DType::F32), config)?;
        store.realize_pending()?;
        let sgd = Sgd::new(
            store.trainable(),
            SgdConfig { lr: 0.05, momentum: 0.9, weight_decay: 1e-4, ..Default::default() },
        )?;
        let order = sgd.params().to_vec();
        let compiled = coil::compile(move |a: &[Tensor]| {
            let loss = model.loss(&a[0].permute(&[0, 3, 1, 2])?, &a[1])?;
            let (loss, grads) = coil::nn::value_and_grad(&loss, &order)?;
            Ok(std::iter::once(loss).chain(grads).collect())
        });
        let step = Box::new(move |images: &Tensor, labels: &Tensor| compiled.call(&[images, labels]));
        Ok(Trainer { store, sgd, step })
    }

    fn state(&self) -> coil::Result<Vec<Vec<f64>>> {
        self.store.params().iter().map(|p| p.tensor().to_vec::<f64>()).collect()
    }
}

/// The batch, made on the CPU and copied to `device`.
fn batch(device: Device) -> coil::Result<(Tensor, Tensor)> {
    coil::manual_seed(12);
    let images = Tensor::randn(&[4, 48, 48, 3], DType::F32)?.to_device(device)?;
    let labels = Tensor::from_vec(vec![1i64, 7, 3, 9], &[4])?.to_device(device)?;
    coil::realize(&[&images, &labels])?;
    Ok((images, labels))
}

fn values(tensors: &[Tensor]) -> coil::Result<Vec<Vec<f64>>> {
    tensors.iter().map(|t| t.to_vec::<f64>()).collect()
}

/// Three training steps on `device`.
pub fn train(device: Device) -> coil::Result<Trained> {
    let mut trainer = Trainer::new(device)?;
    let (images, labels) = batch(device)?;
    let (mut losses, mut grads) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        let out = (trainer.step)(&images, &labels)?;
        losses.push(out[0].item::<f32>()? as f64);
        grads.push(values(&out[1..])?);
        trainer.sgd.step(&out[1..])?;
    }
    Ok(Trained { losses, grads, state: trainer.state()? })
}

/// Three training steps on `device` in lockstep with the CPU (see the module doc); every
/// tensor whose relative error from the CPU's passes its bound, in words (empty: they agree).
pub fn differences_from_the_cpu(device: Device) -> coil::Result<Vec<String>> {
    let (mut got, mut want) = (Trainer::new(device)?, Trainer::new(Device::Cpu)?);
    let (images, labels) = batch(device)?;
    let (cpu_images, cpu_labels) = (images.to_device(Device::Cpu)?, labels.to_device(Device::Cpu)?);
    let mut wrong = Vec::new();
    let mut check = |what: String, a: &[Vec<f64>], b: &[Vec<f64>], bound: f64| {
        for (i, (a, b)) in a.iter().zip(b).enumerate() {
            let err = super::attention::rel_error(a, b);
            if err >= bound {
                wrong.push(format!("{what} {i} ({} values) differs from the CPU's by {err:.2e}", a.len()));
            }
        }
    };
    for step in 0..STEPS {
        for (p, q) in got.store.params().iter().zip(want.store.params()) {
            q.set(p.tensor().to_device(Device::Cpu)?)?;
        }
        let out = (got.step)(&images, &labels)?;
        let reference = (want.step)(&cpu_images, &cpu_labels)?;
        check(format!("step {step} loss"), &values(&out[..1])?, &values(&reference[..1])?, 1e-5);
        check(format!("step {step} gradient"), &values(&out[1..])?, &values(&reference[1..])?, 1e-4);
        got.sgd.step(&out[1..])?;
        let grads = out[1..].iter().map(|g| g.to_device(Device::Cpu)).collect::<coil::Result<Vec<_>>>()?;
        want.sgd.step(&grads)?;
        // Parameters after the update, running statistics after the step.
        check(format!("after step {step}, parameter or buffer"), &got.state()?, &want.state()?, 1e-5);
    }
    Ok(wrong)
}

/// How far the CPU's gradients move, at each of the lockstep's steps, when every f32 parameter
/// moves by up to `rel` of itself (a seeded pattern of `noise`): the largest relative movement
/// of any gradient, per step. A device's rounding moves the parameters and activations by about
/// f32's epsilon, so a step whose gradients jump under such a nudge (a ReLU input at 0 whose
/// max-pool window then routes its gradient elsewhere) cannot be compared at 1e-4 on any device.
pub fn gradient_movement(rel: f64, noise: u64) -> coil::Result<Vec<f64>> {
    let mut trainer = Trainer::new(Device::Cpu)?;
    let (images, labels) = batch(Device::Cpu)?;
    let mut movement = Vec::new();
    let mut state = noise;
    for _ in 0..STEPS {
        let out = (trainer.step)(&images, &labels)?;
        let params: Vec<_> = trainer.store.params().into_iter().filter(|p| p.tensor().dtype() == DType::F32).collect();
        let saved = params.iter().map(|p| p.tensor().to_vec::<f32>()).collect::<coil::Result<Vec<_>>>()?;
        for (p, v) in params.iter().zip(&saved) {
            let nudged = v
                .iter()
                .map(|x| {
                    // A 64-bit LCG: a fixed pattern of uniform draws in [-0.5, 0.5).
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let u = (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
                    (*x as f64 * (1.0 + rel * u)) as f32
                })
                .collect();
            p.set(Tensor::from_vec(nudged, p.tensor().shape())?)?;
        }
        let moved = (trainer.step)(&images, &labels)?;
        let (a, b) = (values(&moved[1..])?, values(&out[1..])?);
        movement.push(a.iter().zip(&b).map(|(a, b)| super::attention::rel_error(a, b)).fold(0.0, f64::max));
        for (p, v) in params.iter().zip(saved) {
            p.set(Tensor::from_vec(v, p.tensor().shape())?)?;
        }
        trainer.sgd.step(&out[1..])?;
    }
    Ok(movement)
}
