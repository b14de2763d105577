//! ResNet-50's convolution shapes (batch 64, 224x224, bf16, channels-last) through cuDNN's legacy
//! API and its graph API side by side, in all three forms (forward, data gradient, weight
//! gradient): the median of 20 timed runs each (CUDA events, after warm-up), what each API
//! planned, and whether the two results agree (max abs difference relative to the result's
//! largest magnitude, bf16 tolerance). One line per shape and form; a failure prints and the
//! next shape runs.
//!
//! ```text
//! cargo run --release -p coil-runtime --example conv_bench [-- --batch 64 --reps 20]
//! ```

use coil_ir::config::CudnnApi;
use coil_ir::loops::{BufferId, ConvCall, TensorView};
use coil_ir::op::{ConvForm, ConvGeometry};
use coil_ir::{DType, Result, TensorMeta};
use coil_runtime::cuda::blas::DevOperand;
use coil_runtime::cuda::cudnn;
use coil_runtime::{Buffer, CudaBuffer, CudaDevice, HostData};
use cudarc::driver::sys::CUevent_flags;
use std::sync::Arc;

/// One convolution of the network: input channels and size, output channels, kernel, stride.
struct Shape {
    name: &'static str,
    c: usize,
    hw: usize,
    k: usize,
    kernel: usize,
    stride: usize,
}

const SHAPES: &[Shape] = &[
    Shape { name: "stem 7x7/2", c: 3, hw: 224, k: 64, kernel: 7, stride: 2 },
    Shape { name: "layer1 3x3", c: 64, hw: 56, k: 64, kernel: 3, stride: 1 },
    Shape { name: "layer1 1x1 64->256", c: 64, hw: 56, k: 256, kernel: 1, stride: 1 },
    Shape { name: "layer2 3x3/2", c: 128, hw: 56, k: 128, kernel: 3, stride: 2 },
    Shape { name: "layer2 3x3", c: 128, hw: 28, k: 128, kernel: 3, stride: 1 },
    Shape { name: "layer2 down 1x1/2", c: 256, hw: 56, k: 512, kernel: 1, stride: 2 },
    Shape { name: "layer3 3x3/2", c: 256, hw: 28, k: 256, kernel: 3, stride: 2 },
    Shape { name: "layer3 3x3", c: 256, hw: 14, k: 256, kernel: 3, stride: 1 },
    Shape { name: "layer3 down 1x1/2", c: 512, hw: 28, k: 1024, kernel: 1, stride: 2 },
    Shape { name: "layer4 3x3/2", c: 512, hw: 14, k: 512, kernel: 3, stride: 2 },
    Shape { name: "layer4 3x3", c: 512, hw: 7, k: 512, kernel: 3, stride: 1 },
    Shape { name: "layer4 down 1x1/2", c: 1024, hw: 14, k: 2048, kernel: 1, stride: 2 },
];

/// Channels-last strides of `[N, C, H, W]` (also a filter's `[K, C, R, S]`).
fn nhwc(shape: [usize; 4]) -> Vec<usize> {
    let [_, c, h, w] = shape;
    vec![h * w * c, 1, w * c, c]
}

fn view(buffer: usize, shape: [usize; 4]) -> TensorView {
    TensorView { buffer: BufferId(buffer), offset: 0, shape: shape.to_vec(), strides: nhwc(shape) }
}

/// The call of `form` for `s` at batch `n`, every operand channels-last.
fn call(s: &Shape, n: usize, form: &str) -> ConvCall {
    let pad = s.kernel / 2;
    let out_hw = (s.hw + 2 * pad - s.kernel) / s.stride + 1;
    let geometry = ConvGeometry { stride: vec![s.stride; 2], padding: vec![pad; 2], dilation: vec![1; 2], groups: 1 };
    let (x, w, y) = ([n, s.c, s.hw, s.hw], [s.k, s.c, s.kernel, s.kernel], [n, s.k, out_hw, out_hw]);
    let (form, a, b, out) = match form {
        "fwd" => (ConvForm::Forward, x, w, y),
        "dgrad" => (ConvForm::BackwardData { size: vec![s.hw; 2] }, y, w, x),
        _ => (ConvForm::BackwardWeight { kernel: vec![s.kernel; 2] }, x, y, w),
    };
    ConvCall { geometry, form, a: view(0, a), b: view(1, b), out: out.to_vec(), out_strides: nhwc(out) }
}

/// A device buffer of `n` pseudo-random bf16 values in [-1, 1).
fn randoms(dev: &Arc<CudaDevice>, n: usize, seed: u64) -> Result<CudaBuffer> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let xs: Vec<f64> = (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect();
    CudaBuffer::from_host(dev, &Buffer::new(vec![n], HostData::from_f64_slice(DType::BF16, &xs))?)
}

fn operand(b: &CudaBuffer) -> DevOperand {
    DevOperand { ptr: b.ptr(), bytes: b.bytes() }
}

/// The median time in microseconds of `reps` runs of `call` through `api` (after warm-up),
/// what it planned, and its result.
fn time(
    dev: &Arc<CudaDevice>,
    c: &ConvCall,
    api: CudnnApi,
    bufs: [&CudaBuffer; 3],
    reps: usize,
) -> Result<(f64, String, Vec<f64>)> {
    let [a, b, out] = bufs.map(operand);
    let plan = cudnn::plan_summary(dev, c, DType::BF16, api, a, b, out)?;
    let run = || cudnn::convolution(dev, c, DType::BF16, api, a, b, out, (0, 0));
    for _ in 0..3 {
        run()?;
    }
    let stream = dev.stream();
    let err = |e: cudarc::driver::DriverError| coil_ir::Error::runtime(format!("CUDA event: {e}"));
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(err)?;
        run()?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(err)?;
        end.synchronize().map_err(err)?;
        times.push(start.elapsed_ms(&end).map_err(err)? as f64 * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let result = bufs[2].to_host()?.data.to_f64_vec();
    Ok((times[times.len() / 2], plan, result))
}

/// One line: both APIs' times and plans, the speedup and the agreement.
fn bench(dev: &Arc<CudaDevice>, s: &Shape, n: usize, form: &str, reps: usize) -> Result<String> {
    let c = call(s, n, form);
    let count = |shape: &[usize]| shape.iter().product::<usize>();
    let a = randoms(dev, count(&c.a.shape), 1)?;
    let b = randoms(dev, count(&c.b.shape), 2)?;
    // A result buffer each, so that a plan that writes nothing cannot pass for the other's.
    let zeros = || CudaBuffer::zeros(dev, TensorMeta::new(vec![count(&c.out)], DType::BF16));
    let (out_legacy, out_graph) = (zeros()?, zeros()?);
    let (legacy_us, legacy_plan, want) = time(dev, &c, CudnnApi::Legacy, [&a, &b, &out_legacy], reps)?;
    let (graph_us, graph_plan, got) = time(dev, &c, CudnnApi::Graph, [&a, &b, &out_graph], reps)?;
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(f64::MIN_POSITIVE);
    let diff = got.iter().zip(&want).fold(0.0f64, |m, (g, w)| m.max((g - w).abs())) / scale;
    let verdict = if diff <= 1e-2 { "ok" } else { "MISMATCH" };
    Ok(format!(
        "{:<20} {:<5} legacy {:>9.1} us  graph {:>9.1} us  x{:>5.2}  diff {:.1e} {verdict}  [legacy: {legacy_plan}] [graph: {graph_plan}]",
        s.name,
        form,
        legacy_us,
        graph_us,
        legacy_us / graph_us,
        diff
    ))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut n, mut reps) = (64usize, 20usize);
    while let Some(a) = args.next() {
        let value = args.next().and_then(|v| v.parse().ok());
        match (a.as_str(), value) {
            ("--batch", Some(v)) => n = v,
            ("--reps", Some(v)) => reps = v,
            _ => {
                eprintln!("usage: conv_bench [--batch N] [--reps R]");
                std::process::exit(2);
            }
        }
    }
    let dev = match CudaDevice::get(0) {
        Ok(dev) if cudnn::available() => dev,
        Ok(_) => return eprintln!("conv_bench: cuDNN not found"),
        Err(e) => return eprintln!("conv_bench: no CUDA device: {e}"),
    };
    println!("{} | batch {n}, bf16, channels-last, median of {reps} (CUDA events)", dev.name());
    for s in SHAPES {
        for form in ["fwd", "dgrad", "wgrad"] {
            match bench(&dev, s, n, form, reps.max(1)) {
                Ok(line) => println!("{line}"),
                Err(e) => println!("{:<20} {form:<5} FAILED: {e}", s.name),
            }
        }
    }
}
