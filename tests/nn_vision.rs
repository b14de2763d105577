//! `coil::nn`'s convolutional-network pieces: `BatchNorm2d` against PyTorch (training-mode
//! steps with their running statistics, gradients, evaluation mode; eagerly and inside a
//! compiled function), and ResNet-50's architecture (torchvision's parameter names and shapes;
//! a small one's forward and gradients on the compiled CPU path against the reference
//! interpreter; a PyTorch checkpoint's logits; its convolutions writing channels-last results
//! where cuDNN would run them). The batch-norm data is `tests/golden_nn/batch_norm.safetensors`
//! (`tests/golden_nn/make_batch_norm.py` makes it).

mod common;

use coil::nn::models::resnet::{ResNet, ResNetConfig};
use coil::nn::{BatchNorm2d, BatchNormConfig, Module, ParamStore};
use coil::{DType, Device, Tensor};
use common::assert_close;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Tests that switch the backend hold this lock.
static BACKEND: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn golden() -> &'static BTreeMap<String, Tensor> {
    static DATA: OnceLock<BTreeMap<String, Tensor>> = OnceLock::new();
    DATA.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden_nn/batch_norm.safetensors");
        coil::safetensors::load(path, Device::Cpu).expect("golden data")
    })
}

/// A copy of golden tensor `name` (updates in place must not make the golden data stale).
fn g(name: &str) -> Tensor {
    let t = golden().get(name).unwrap_or_else(|| panic!("no golden tensor {name}"));
    match t.dtype() {
        DType::I64 => Tensor::from_vec(t.to_vec::<i64>().unwrap(), t.shape()).unwrap(),
        _ => Tensor::from_vec(t.to_vec::<f32>().unwrap(), t.shape()).unwrap(),
    }
}

const TOL: f64 = 2e-6;

const CASES: [(&str, usize, Option<f64>); 2] = [("bn_momentum", 4, Some(0.1)), ("bn_cumulative", 3, None)];

fn batch_norm(case: &str, channels: usize, momentum: Option<f64>) -> (ParamStore, BatchNorm2d) {
    let store = ParamStore::new();
    let config = BatchNormConfig { momentum, ..Default::default() };
    let bn = BatchNorm2d::new(&store.root(Device::Cpu, DType::F32), channels, config).unwrap();
    bn.weight.as_ref().unwrap().set(g(&format!("{case}.param.weight"))).unwrap();
    bn.bias.as_ref().unwrap().set(g(&format!("{case}.param.bias"))).unwrap();
    assert_eq!(store.names(), ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]);
    (store, bn)
}

fn check_running(case: &str, bn: &BatchNorm2d, step: usize) {
    let r = bn.running.as_ref().unwrap();
    assert_close(
        &format!("{case} running_mean step {step}"),
        &r.mean.tensor(),
        &g(&format!("{case}.out.running_mean.step{step}")),
        TOL,
    );
    assert_close(
        &format!("{case} running_var step {step}"),
        &r.var.tensor(),
        &g(&format!("{case}.out.running_var.step{step}")),
        TOL,
    );
    let count = r.num_batches_tracked.tensor().item::<i64>().unwrap();
    assert_eq!(count, g(&format!("{case}.out.num_batches_tracked.step{step}")).item::<i64>().unwrap());
}

fn check_eval(case: &str, store: &ParamStore, bn: &BatchNorm2d) {
    store.eval();
    let y = bn.forward(&g(&format!("{case}.in.x_eval"))).unwrap();
    assert_close(&format!("{case} eval"), &y, &g(&format!("{case}.out.y_eval")), TOL);
    store.train();
}

#[test]
fn batch_norm_training_steps_match_pytorch_eagerly() {
    let _lock = BACKEND.lock().unwrap_or_else(|e| e.into_inner());
    for (case, channels, momentum) in CASES {
        let (store, bn) = batch_norm(case, channels, momentum);
        for s in 0..3 {
            let x = g(&format!("{case}.in.x.step{s}"));
            let y = bn.forward(&x).unwrap();
            assert_close(&format!("{case} y step {s}"), &y, &g(&format!("{case}.out.y.step{s}")), TOL);
            check_running(case, &bn, s);
            if s == 0 {
                let loss = y.mul(g(&format!("{case}.in.upstream"))).unwrap().sum_all().unwrap();
                let (w, b) = (bn.weight.as_ref().unwrap().tensor(), bn.bias.as_ref().unwrap().tensor());
                let grads = coil::grad(&loss, &[&w, &b, &x]).unwrap();
                for (name, grad) in ["weight", "bias", "x"].iter().zip(&grads) {
                    assert_close(&format!("{case} d/d{name}"), grad, &g(&format!("{case}.grad.{name}")), 1e-5);
                }
            }
        }
        check_eval(case, &store, &bn);
    }
}

/// Inside a compiled function the running statistics' update is recorded and runs with the
/// step's graph; the values are PyTorch's all the same, call after call.
#[test]
fn batch_norm_training_steps_match_pytorch_in_a_compiled_function() {
    let _lock = BACKEND.lock().unwrap_or_else(|e| e.into_inner());
    for (case, channels, momentum) in CASES {
        let (store, bn) = batch_norm(case, channels, momentum);
        let params = vec![bn.weight.clone().unwrap(), bn.bias.clone().unwrap()];
        let step = coil::compile(|a: &[Tensor]| {
            let loss = bn.forward(&a[0])?.mul(&a[1])?.sum_all()?;
            let (loss, grads) = coil::nn::value_and_grad(&loss, &params)?;
            Ok(std::iter::once(loss).chain(grads).collect())
        });
        let upstream = g(&format!("{case}.in.upstream"));
        for s in 0..3 {
            let x = g(&format!("{case}.in.x.step{s}"));
            let out = step.call(&[&x, &upstream]).unwrap();
            let want = g(&format!("{case}.out.y.step{s}")).mul(&upstream).unwrap().sum_all().unwrap();
            assert_close(&format!("{case} loss step {s}"), &out[0], &want, 1e-5);
            if s == 0 {
                assert_close(&format!("{case} d/dweight"), &out[1], &g(&format!("{case}.grad.weight")), 1e-5);
                assert_close(&format!("{case} d/dbias"), &out[2], &g(&format!("{case}.grad.bias")), 1e-5);
            }
            check_running(case, &bn, s);
        }
        check_eval(case, &store, &bn);
    }
}

#[test]
fn batch_norm_names_the_shape_it_expected() {
    let store = ParamStore::new();
    let bn = BatchNorm2d::new(&store.root(Device::Cpu, DType::F32), 4, BatchNormConfig::default()).unwrap();
    let e = bn.forward(&Tensor::zeros(&[2, 3, 4, 4], DType::F32)).unwrap_err().to_string();
    assert!(e.contains("BatchNorm2d") && e.contains("[2, 3, 4, 4]") && e.contains("nn_vision.rs"), "{e}");
}

/// torchvision's `resnet50().state_dict()`: 320 entries (161 parameters, 159 buffers) whose
/// parameters hold 25,557,032 elements, in this order.
#[test]
fn resnet50_has_torchvisions_names_and_shapes() {
    let store = ParamStore::new();
    let _model = ResNet::new(&store.root(Device::Cpu, DType::F32), ResNetConfig::resnet50()).unwrap();
    let params = store.params();
    assert_eq!(params.len(), 320);
    assert_eq!(store.trainable().len(), 161);
    assert_eq!(store.trainable().iter().map(|p| p.numel()).sum::<usize>(), 25_557_032);
    let shape = |name: &str| store.get(name).unwrap_or_else(|| panic!("no {name}")).shape();
    let expected: [(&str, &[usize]); 16] = [
        ("conv1.weight", &[64, 3, 7, 7]),
        ("bn1.running_var", &[64]),
        ("bn1.num_batches_tracked", &[]),
        ("layer1.0.conv1.weight", &[64, 64, 1, 1]),
        ("layer1.0.conv2.weight", &[64, 64, 3, 3]),
        ("layer1.0.conv3.weight", &[256, 64, 1, 1]),
        ("layer1.0.downsample.0.weight", &[256, 64, 1, 1]),
        ("layer1.0.downsample.1.running_mean", &[256]),
        ("layer1.2.bn3.bias", &[256]),
        ("layer2.0.conv1.weight", &[128, 256, 1, 1]),
        ("layer2.0.downsample.0.weight", &[512, 256, 1, 1]),
        ("layer3.5.conv2.weight", &[256, 256, 3, 3]),
        ("layer4.0.downsample.0.weight", &[2048, 1024, 1, 1]),
        ("layer4.2.conv3.weight", &[2048, 512, 1, 1]),
        ("fc.weight", &[1000, 2048]),
        ("fc.bias", &[1000]),
    ];
    for (name, want) in expected {
        assert_eq!(shape(name), want, "{name}");
    }
    assert_eq!(store.get("bn1.num_batches_tracked").unwrap().dtype(), DType::I64);
    assert!(store.get("layer1.1.downsample.0.weight").is_none(), "only a stage's first block projects");
    // The order of the state_dict: a block's convolutions and norms in turn, its shortcut last.
    let names = store.names();
    let at = |n: &str| names.iter().position(|m| m == n).unwrap();
    assert!(at("layer1.0.bn3.num_batches_tracked") < at("layer1.0.downsample.0.weight"));
    assert!(at("layer1.0.downsample.1.num_batches_tracked") < at("layer1.1.conv1.weight"));
    assert_eq!((names[0].as_str(), names[319].as_str()), ("conv1.weight", "fc.bias"));
    // The 3x3 convolution carries a block's stride (v1.5): a 224x224 image ends 7x7.
    let model = ResNet::new(&ParamStore::new().root(Device::Cpu, DType::F32), ResNetConfig::resnet50()).unwrap();
    assert_eq!(model.stages[1][0].conv2.options.stride, [2, 2]);
    assert_eq!(model.stages[1][0].conv1.options.stride, [1, 1]);
}

/// One small ResNet's training-mode loss, every gradient and the running statistics it leaves,
/// compiled for the CPU (channels-last input), agree with the reference interpreter's.
#[test]
fn a_small_resnet_forward_and_backward_agree_with_the_interpreter() {
    let _lock = BACKEND.lock().unwrap_or_else(|e| e.into_inner());
    let config = ResNetConfig { layers: [1, 2, 1, 1], width: 8, num_classes: 10 };
    let run = |backend: coil::Backend| -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        coil::set_backend(backend);
        coil::set_eager_tier(false);
        coil::manual_seed(7);
        let store = ParamStore::new();
        let model = ResNet::new(&store.root(Device::Cpu, DType::F32), config).unwrap();
        store.realize_pending().unwrap();
        // Channels-last: a [N, H, W, C] buffer viewed as [N, C, H, W].
        let x = Tensor::randn(&[2, 64, 64, 3], DType::F32).unwrap().permute(&[0, 3, 1, 2]).unwrap();
        let labels = Tensor::from_vec(vec![3i64, 8], &[2]).unwrap();
        let params = store.trainable();
        let (loss, grads) = coil::nn::value_and_grad(&model.loss(&x, &labels).unwrap(), &params).unwrap();
        let mut outputs: Vec<&Tensor> = vec![&loss];
        outputs.extend(&grads);
        coil::realize(&outputs).unwrap();
        let values = outputs.iter().map(|t| t.to_vec::<f64>().unwrap()).collect();
        let buffers =
            store.params().iter().filter(|p| !p.trainable()).map(|p| p.tensor().to_vec::<f64>().unwrap()).collect();
        (values, buffers)
    };
    let (want, want_buffers) = run(coil::Backend::Interpreter);
    let (got, got_buffers) = run(coil::Backend::Compiled);
    coil::set_backend(coil::Backend::Compiled);
    coil::set_eager_tier(false);
    assert!(want[0][0].is_finite() && want[0][0] > 0.0, "loss {}", want[0][0]);
    let err = |a: &[f64], b: &[f64]| {
        let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
        d / b.iter().map(|y| y * y).sum::<f64>().sqrt().max(1e-30)
    };
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(err(a, b) < 1e-4, "output {i} (0: the loss, then each gradient) differs by {:.2e}", err(a, b));
    }
    for (i, (a, b)) in got_buffers.iter().zip(&want_buffers).enumerate() {
        assert!(err(a, b) < 1e-5, "buffer {i} differs by {:.2e}", err(a, b));
    }
    // Every batch norm ran once in training mode.
    assert!(want_buffers.iter().filter(|b| b.len() == 1).all(|b| b[0] == 1.0));
}

/// Every entry of ResNet-50's `state_dict` (`tests/golden_nn/resnet50_state_dict.txt`, from
/// `make_resnet50_names.py`), in order, with its dtype and shape.
#[test]
fn resnet50_state_dict_matches_pytorchs_entry_for_entry() {
    let store = ParamStore::new();
    let _model = ResNet::new(&store.root(Device::Cpu, DType::F32), ResNetConfig::resnet50()).unwrap();
    let ours: Vec<String> = store
        .params()
        .iter()
        .map(|p| {
            let dtype = if p.dtype() == DType::I64 { "int64" } else { "float32" };
            let shape: Vec<String> = p.shape().iter().map(usize::to_string).collect();
            format!("{} {dtype} {}", p.name(), shape.join(","))
        })
        .collect();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden_nn/resnet50_state_dict.txt");
    let theirs: Vec<String> = std::fs::read_to_string(path).unwrap().lines().map(String::from).collect();
    assert_eq!(ours.len(), theirs.len());
    for (a, b) in ours.iter().zip(&theirs) {
        assert_eq!(a, b);
    }
}

/// A small ResNet loaded from a PyTorch checkpoint (`tests/golden_nn/resnet_tiny.safetensors`)
/// gives PyTorch's logits in evaluation mode (running statistics) and in training mode (batch
/// statistics), and the running statistics PyTorch's training-mode forward leaves.
#[test]
fn a_small_resnet_loaded_from_pytorch_gives_its_logits_and_running_statistics() {
    let _lock = BACKEND.lock().unwrap_or_else(|e| e.into_inner());
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden_nn/resnet_tiny.safetensors");
    let file = coil::safetensors::load(path, Device::Cpu).unwrap();
    let store = ParamStore::new();
    let config = ResNetConfig { layers: [1, 1, 1, 1], width: 4, num_classes: 5 };
    let model = ResNet::new(&store.root(Device::Cpu, DType::F32), config).unwrap();
    let rename = |n: &str| n.strip_prefix("model.").map(String::from);
    store.load_with(path, &coil::nn::LoadOptions { rename: Some(&rename), ..Default::default() }).unwrap();
    let x = &file["in.x"];
    store.eval();
    assert_close("eval logits", &model.forward(x).unwrap(), &file["out.logits_eval"], 1e-5);
    store.train();
    assert_close("train logits", &model.forward(x).unwrap(), &file["out.logits_train"], 1e-4);
    for p in store.params().iter().filter(|p| !p.trainable()) {
        let want = &file[&format!("out.{}", p.name())];
        if p.dtype() == DType::I64 {
            assert_eq!(p.tensor().item::<i64>().unwrap(), 4, "{}", p.name());
        } else {
            assert_close(p.name(), &p.tensor(), want, 1e-5);
        }
    }
}

/// What the CUDA compile path (convolutions kept whole for cuDNN) makes of a small ResNet's
/// training step (one graph: forward in training mode, the batch norms' running statistics
/// written in place, gradients): each convolution's forward is computed once (the running
/// statistics share it with the gradients), and under the bf16 policy every convolution reads
/// and writes channels-last activations and filters (the f32 images cast, the max pooling, the
/// weights' bf16 copies and their gradients too), and no kernel only transposes one.
#[test]
fn resnet_training_step_convolutions_write_channels_last_results_when_kept_whole() {
    use coil::ir::loops::{ExternCall, LoopKind};
    use coil::ir::op::ConvForm;
    let _lock = BACKEND.lock().unwrap_or_else(|e| e.into_inner());
    coil::manual_seed(1);
    let store = ParamStore::new();
    let config = ResNetConfig { layers: [1, 1, 1, 1], width: 4, num_classes: 5 };
    let model = ResNet::new(&store.root(Device::Cpu, DType::F32), config).unwrap();
    store.set_precision(coil::nn::Precision::autocast(DType::BF16));
    store.realize_pending().unwrap();
    let x = Tensor::randn(&[2, 32, 32, 3], DType::F32).unwrap();
    let labels = Tensor::from_vec(vec![1i64, 4], &[2]).unwrap();
    coil::realize(&[&x, &labels]).unwrap();
    let params = store.trainable();
    let report = coil::explain(|| {
        let loss = model.loss(&x.permute(&[0, 3, 1, 2])?, &labels)?;
        let (loss, grads) = coil::nn::value_and_grad(&loss, &params)?;
        Ok(std::iter::once(loss).chain(grads).collect())
    })
    .unwrap();
    assert_eq!(report.graphs.len(), 1, "{report}");
    let options = coil_passes::DecomposeOptions {
        fused_attention: true,
        keep_detach: false,
        half_products: true,
        conv_template: true,
    };
    let primitive = coil_passes::decompose_with(&report.graphs[0].graph, &options).unwrap();
    let (primitive, _) = coil_passes::simplify(&primitive, &coil_passes::RewriteOptions::default()).unwrap();
    let program = coil_passes::lower(&primitive).unwrap();
    let (mut forward, mut data, mut weight, mut row_major) = (0, 0, 0, 0);
    for node in &program.nodes {
        let LoopKind::Extern { call: ExternCall::Conv(call), .. } = &node.kind else { continue };
        match call.form {
            ConvForm::BackwardWeight { .. } => weight += 1,
            ConvForm::Forward => forward += 1,
            ConvForm::BackwardData { .. } => data += 1,
        }
        // The operands read in place and the result, the filter (the weight, or the weight
        // gradient) included: channels-last, C's stride 1.
        let weight_grad = matches!(call.form, ConvForm::BackwardWeight { .. });
        let filter = if weight_grad { &call.out_strides } else { &call.b.strides };
        let data_b = if weight_grad { call.b.strides[1] } else { 1 };
        if call.a.strides[1] != 1 || data_b != 1 || call.out_strides[1] != 1 || filter[1] != 1 {
            row_major += 1;
            eprintln!("not channels-last: {call:?}");
        }
    }
    // 17 convolutions, 5 of them kept whole (each a forward and a weight gradient, all but the
    // stem a data gradient): the stem and the four 3x3 ones. The other 12 (1x1) are matrix
    // products (`pointwise_conv` in the decomposition).
    assert_eq!((forward, data, weight, row_major), (5, 4, 5, 0), "{program}");
    let transposes = program.nodes.iter().filter(|n| n.origins == ["permute"]).count();
    assert_eq!(transposes, 0, "{program}");
    // The 1x1 convolutions of channels-last activations are products over the whole batch
    // (forward, data and weight gradients alike; so is the classifier), nothing only copies
    // an activation to move it (a graph output that is a reshape of a product aside), and no
    // gradient scatters: neither the strided 1x1 projections' subsampling nor the max pooling.
    let mut products = 0;
    for node in &program.nodes {
        match &node.kind {
            LoopKind::Extern { call: ExternCall::Bmm { batch, .. }, .. } => {
                products += 1;
                assert!(batch.is_empty(), "a per-batch product: {}\n{program}", node.output.0);
            }
            LoopKind::Extern { call: ExternCall::Fallback { op }, .. } => panic!("a fallback {op}\n{program}"),
            _ => {}
        }
    }
    // 12 1x1 convolutions: 12 forward, 12 weight and 12 data gradients, and the classifier's 3.
    assert_eq!(products, 39, "{program}");
    // The only copies: the strided projections' subsampled inputs (`x[:, ::2, ::2]`, read by
    // their forward and weight-gradient products).
    let moves = |o: &[&str]| !o.is_empty() && o.iter().all(|o| ["permute", "reshape", "slice"].contains(o));
    for n in &program.nodes {
        if moves(&n.origins) && !program.outputs.contains(&n.output) {
            assert_eq!(n.origins, ["slice", "reshape"], "{program}");
        }
    }
}

/// Channels-last activations (`[N, H, W, C]`) give the same outputs and running statistics.
#[test]
fn batch_norm_on_channels_last_activations_matches_pytorch() {
    let _lock = BACKEND.lock().unwrap_or_else(|e| e.into_inner());
    for (case, channels, momentum) in CASES {
        let (store, bn) = batch_norm(case, channels, momentum);
        let nhwc = |t: &Tensor| t.permute(&[0, 2, 3, 1]).unwrap();
        for s in 0..3 {
            let y = bn.forward_channels_last(&nhwc(&g(&format!("{case}.in.x.step{s}")))).unwrap();
            assert_close(&format!("{case} y step {s}"), &y, &nhwc(&g(&format!("{case}.out.y.step{s}"))), TOL);
            check_running(case, &bn, s);
        }
        store.eval();
        let y = bn.forward_channels_last(&nhwc(&g(&format!("{case}.in.x_eval")))).unwrap();
        assert_close(&format!("{case} eval"), &y, &nhwc(&g(&format!("{case}.out.y_eval"))), TOL);
    }
}

/// Max pooling's training step (ResNet's stem: a scale, relu, 3x3 stride-2 pooling with
/// padding, channels-last), compiled: no scatter (the slices' gradients are index arithmetic),
/// one kernel each way. (Its values, ties included, are golden cases.)
#[test]
fn max_pool_gradient_is_pointwise() {
    use coil::ir::loops::{ExternCall, LoopKind};
    let _lock = BACKEND.lock().unwrap_or_else(|e| e.into_inner());
    let x = Tensor::randn(&[2, 12, 10, 8], DType::F32).unwrap();
    let s = Tensor::randn(&[8], DType::F32).unwrap();
    let c = Tensor::randn(&[2, 6, 5, 8], DType::F32).unwrap();
    coil::realize(&[&x, &s, &c]).unwrap();
    let report = coil::explain(|| {
        let h = x.mul(&s)?.relu()?;
        let y = h.max_pool2d_channels_last([3, 3], &[2, 2], [1, 1])?;
        let loss = y.mul(&c)?.sum_all()?;
        let grads = coil::grad(&loss, &[&x, &s])?;
        Ok(std::iter::once(loss).chain(grads).collect())
    })
    .unwrap();
    let primitive = coil_passes::decompose(&report.graphs[0].graph).unwrap();
    let (primitive, _) = coil_passes::simplify(&primitive, &coil_passes::RewriteOptions::default()).unwrap();
    let program = coil_passes::lower(&primitive).unwrap();
    for node in &program.nodes {
        assert!(!matches!(node.kind, LoopKind::Extern { call: ExternCall::Fallback { .. }, .. }), "{program}");
    }
    // The forward (which stores the window offsets of the maxima, as `int8`, and the loss), the
    // pooling's gradient (one pointwise kernel over the padded input, gathering from the windows
    // that can hold each position), the relu's and the scale's gradients.
    let schedule = coil_passes::schedule(&program);
    assert_eq!(schedule.kernels.len(), 4, "{}", coil_passes::print_schedule(&program, &schedule));
}
