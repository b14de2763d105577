//! A small ResNet's training steps on CUDA against the CPU (for the GPU test binary): the
//! compiled step (forward in training mode with the batch norms' running statistics written in
//! place inside it, channels-last activations, convolutions through cuDNN where it loads,
//! gradients) and SGD with momentum, three steps; the losses, the parameters and the running
//! statistics after them agree.

use coil::nn::models::resnet::{ResNet, ResNetConfig};
use coil::nn::{Optimizer, ParamStore, Sgd, SgdConfig};
use coil::{DType, Device, Tensor};

/// The losses of three steps, then every parameter and buffer (in the store's order).
pub fn train(device: Device) -> coil::Result<(Vec<f64>, Vec<Vec<f64>>)> {
    coil::manual_seed(11);
    let store = ParamStore::new();
    let config = ResNetConfig { layers: [1, 2, 1, 1], width: 8, num_classes: 10 };
    let model = ResNet::new(&store.root(device, DType::F32), config)?;
    store.realize_pending()?;
    let images = Tensor::randn(&[4, 48, 48, 3], DType::F32)?.to_device(device)?;
    let labels = Tensor::from_vec(vec![1i64, 7, 3, 9], &[4])?.to_device(device)?;
    coil::realize(&[&images, &labels])?;
    let mut sgd =
        Sgd::new(store.trainable(), SgdConfig { lr: 0.05, momentum: 0.9, weight_decay: 1e-4, ..Default::default() })?;
    let order = sgd.params().to_vec();
    let step = coil::compile(|a: &[Tensor]| {
        let loss = model.loss(&a[0].permute(&[0, 3, 1, 2])?, &a[1])?;
        let (loss, grads) = coil::nn::value_and_grad(&loss, &order)?;
        Ok(std::iter::once(loss).chain(grads).collect())
    });
    let mut losses = Vec::new();
    for _ in 0..3 {
        let out = step.call(&[&images, &labels])?;
        losses.push(out[0].item::<f32>()? as f64);
        sgd.step(&out[1..])?;
    }
    let state = store.params().iter().map(|p| p.tensor().to_vec::<f64>()).collect::<coil::Result<_>>()?;
    Ok((losses, state))
}
