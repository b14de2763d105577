//! The ResNet rows, as `bench/models_torch.py` measures them: torchvision's ResNet-50 (f32
//! parameters, the bf16 mixed-precision policy: convolutions and the classifier in bf16, batch
//! norm bf16 in and out with f32 statistics), a batch of 64 bf16 images of 224x224 stored
//! channels-last (`[N, H, W, C]`, viewed as `[N, C, H, W]`). `resnet50_fwd_bf16`: the inference
//! forward to the logits (evaluation mode). `resnet50_train_step_bf16`: the forward in training
//! mode (batch norms update their running statistics in place, inside the step's graph), the
//! cross-entropy on random labels, the gradients, and an SGD step (lr 0.1, momentum 0.9, weight
//! decay 1e-4, in place). `--config tiny`: `resnet_tiny_*`, one block per stage of width 8, 10
//! classes, batch 2 of 64x64.

use super::{bench, report_replays, Opts, Row, Timer};
use coil::nn::models::resnet::{ResNet, ResNetConfig};
use coil::nn::{Module, Optimizer, ParamStore, Precision, Sgd, SgdConfig};
use coil::{DType, Tensor};

pub fn rows(o: &Opts, timer: &Timer) -> coil::Result<Vec<Row>> {
    let device = o.device;
    let prefix = if o.tiny { "resnet_tiny" } else { "resnet50" };
    let (fwd_name, train_name) = (format!("{prefix}_fwd_bf16"), format!("{prefix}_train_step_bf16"));
    let wanted = |r: &str| o.rows.is_empty() || o.rows.iter().any(|w| w == r);
    if !wanted(&fwd_name) && !wanted(&train_name) {
        return Ok(vec![]);
    }
    let (config, batch, image) = if o.tiny {
        (ResNetConfig { layers: [1, 1, 1, 1], width: 8, num_classes: 10 }, 2, 64)
    } else {
        (ResNetConfig::resnet50(), 64, 224)
    };
    coil::manual_seed(0);
    let store = ParamStore::new();
    store.set_precision(Precision::autocast(DType::BF16));
    let model = ResNet::new(&store.root(device, DType::F32), config)?;
    store.realize_pending()?;
    eprintln!("ResNet with {} parameters on {device}", store.trainable().iter().map(|p| p.numel()).sum::<usize>());

    // Channels-last bf16 images (the permute to [N, C, H, W] is a view) and labels.
    let images = Tensor::randn(&[batch, image, image, 3], DType::F32)?.to_dtype(DType::BF16)?.to_device(device)?;
    let labels = Tensor::randint(0, config.num_classes as i64, &[batch], DType::I64)?.to_device(device)?;
    coil::realize(&[&images, &labels])?;
    let nchw = |x: &Tensor| x.permute(&[0, 3, 1, 2]);
    let mut rows = Vec::new();

    if wanted(&fwd_name) {
        store.eval();
        let forward = coil::compile(|a: &[Tensor]| Ok(vec![model.forward(&nchw(&a[0])?)?]))
            .named("resnet_forward")
            .replay(o.replay)
            .cuda_graphs(o.cuda_graphs);
        let mut step = || forward.call(&[&images]).map(|_| ());
        let notes = o.with_modes(
            "inference forward to the logits (batch norm with running statistics), channels-last bf16 input",
        );
        rows.push(bench(&fwd_name, o, timer, &notes, &mut step)?);
        report_replays(&fwd_name, &forward.stats(), o);
        store.train();
    }

    if wanted(&train_name) {
        let sgd = SgdConfig { lr: 0.1, momentum: 0.9, weight_decay: 1e-4, ..Default::default() };
        let mut opt = Sgd::new(store.trainable(), sgd)?;
        let order = opt.params().to_vec();
        let grads = coil::compile(|a: &[Tensor]| {
            let (loss, grads) = coil::nn::value_and_grad(&model.loss(&nchw(&a[0])?, &a[1])?, &order)?;
            Ok(std::iter::once(loss).chain(grads).collect())
        })
        .named("resnet_train_step")
        .replay(o.replay)
        .cuda_graphs(o.cuda_graphs);
        let mut step = || -> coil::Result<()> {
            let out = grads.call(&[&images, &labels])?;
            opt.step(&out[1..])
        };
        let notes = o.with_modes("forward (batch norms update their running statistics in place), cross-entropy on random labels, backward, SGD (lr 0.1, momentum 0.9, weight decay 1e-4; in place)");
        rows.push(bench(&train_name, o, timer, &notes, &mut step)?);
        report_replays(&train_name, &grads.stats(), o);
    }
    Ok(rows)
}
