//! Everyday eager use on new shapes: `layer_norm -> gelu -> matmul` realized outside a compiled
//! function on 20 shapes never seen before, then one shape again and again (issue 20's
//! "eager-like" measurement; `bench/cpu_eager_shapes.py` runs it against PyTorch eager).
//!
//! The inputs exist before timing starts (data a program loads). Prints one JSON line:
//! `first_pass_s` (wall seconds for the 20 new shapes, including every
//! compile it waits for: cold or warm depending on the disk cache, `COIL_CACHE_DIR`),
//! `steady_us` (median wall microseconds per call of one shape after warm-up), `compiles`
//! (graphs compiled by the first pass, background compiles finished by its end included),
//! `tier0` (realizations of the first pass that ran on the CPU's tier 0 while their graph
//! compiled in the background, `coil::tiered`; `COIL_EAGER_TIER=0` turns it off) and the device.
//!
//! On the CPU the backend's prebuilt libraries (tier 0's math, the packed matrix product) and
//! its threads (the pool, and the background compiles' thread) are loaded and started before
//! the clock starts (`coil_runtime::cpu::prepare`, about a millisecond once per process), as
//! `import torch` loads PyTorch's kernels before its side's clock; nothing of the measured
//! graphs is compiled or cached by it (`--no-prepare` leaves the loading to the first
//! realization).
//!
//! `cargo run --release --example eager_shapes -- [--device cpu|cuda] [--shapes N] [--reps N]
//! [--phases] [--each] [--no-prepare]` (`--phases`: also print the host's time per phase in the
//! first pass and over 100 more steady calls; `--each`: each realization's time in the first
//! pass, and whether it ran on tier 0)

use coil::{Device, Tensor};
use std::time::Instant;

/// The `i`-th new shape: rows and features, both different for every `i`.
fn shape(i: usize) -> (usize, usize) {
    (16 + 8 * i, 64 + 16 * i)
}

/// Host data in [-1, 1) from a fixed generator (data a program loads: no graph of its own).
fn data(shape: &[usize], seed: u64, device: Device) -> coil::Result<Tensor> {
    let len = shape.iter().product();
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let v: Vec<f32> = (0..len)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    Tensor::from_vec(v, shape)?.to_device(device)
}

/// Inputs of shape `(n, d)`: `x` `[n, d]`, `w` `[d, d]`, `g` and `b` `[d]`.
fn inputs(n: usize, d: usize, device: Device) -> coil::Result<[Tensor; 4]> {
    Ok([data(&[n, d], 1, device)?, data(&[d, d], 2, device)?, data(&[d], 3, device)?, data(&[d], 4, device)?])
}

/// `gelu(layer_norm(x, g, b)) @ w`, realized and one element read back (as a user printing a
/// value does; PyTorch's side reads `y[0, 0].item()`: the element, not a copy of the whole
/// result).
fn step([x, w, g, b]: &[Tensor; 4]) -> coil::Result<f32> {
    let d = w.shape()[0];
    let y = x.layer_norm(&[d], Some(g), Some(b), 1e-5)?.gelu(false)?.matmul(w)?;
    y.realize()?;
    let result = y.buffer()?;
    match &result.data {
        coil::HostData::F32(v) => Ok(v[0]),
        other => Ok(other.to_f64_vec()[0] as f32),
    }
}

fn main() -> coil::Result<()> {
    let mut device = Device::default();
    let (mut shapes, mut reps, mut phases, mut prepare, mut each) = (20usize, 200usize, false, true, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--device" => device = if value() == "cuda" { Device::Cuda(0) } else { Device::Cpu },
            "--shapes" => shapes = value().parse().expect("--shapes N"),
            "--reps" => reps = value().parse().expect("--reps N"),
            "--phases" => phases = true,
            "--each" => each = true,
            "--no-prepare" => prepare = false,
            _ => {
                panic!("unknown argument {a}: --device cpu|cuda, --shapes N, --reps N, --phases, --each, --no-prepare")
            }
        }
    }
    if prepare && device == Device::Cpu {
        coil_runtime::cpu::prepare();
    }
    coil::manual_seed(0);
    let before = coil::compile_count();
    // The data exist before the clock starts (loaded, in a real program); only the ops run.
    let all = (0..shapes).map(|i| inputs(shape(i).0, shape(i).1, device)).collect::<coil::Result<Vec<_>>>()?;
    let (start, host) = (Instant::now(), coil::profile::host_times());
    let mut times = Vec::with_capacity(all.len());
    for x in &all {
        let (t, tier0) = (Instant::now(), coil::tiered::tier0_runs());
        step(x)?;
        times.push((t.elapsed().as_secs_f64() * 1e6, coil::tiered::tier0_runs() > tier0));
    }
    let first_pass_s = start.elapsed().as_secs_f64();
    if each {
        for (i, (us, tier0)) in times.iter().enumerate() {
            let on = if *tier0 { "tier 0" } else { "compiled" };
            eprintln!("realization {i:2} {:?}: {us:7.1} us ({on})", shape(i));
        }
    }
    if phases {
        eprintln!("first pass: {:?}", coil::profile::host_times().since(&host));
    }
    let compiles = coil::compile_count() - before;
    let tier0 = coil::tiered::tier0_runs();
    let (n, d) = (64, 256);
    let steady = inputs(n, d, device)?;
    for _ in 0..10 {
        step(&steady)?;
    }
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            step(&steady).map(|_| t.elapsed().as_secs_f64() * 1e6)
        })
        .collect::<coil::Result<_>>()?;
    if phases {
        let before = coil::profile::host_times();
        for _ in 0..100 {
            step(&steady)?;
        }
        eprintln!("steady: {:?}", coil::profile::host_times().since(&before));
    }
    times.sort_by(f64::total_cmp);
    let steady_us = times[times.len() / 2];
    println!(
        "{{\"device\": \"{device}\", \"shapes\": {shapes}, \"first_pass_s\": {first_pass_s:.4}, \"compiles\": {compiles}, \"tier0\": {tier0}, \"steady_us\": {steady_us:.1}, \"steady_shape\": [{n}, {d}]}}"
    );
    Ok(())
}
