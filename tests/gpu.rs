//! The GPU tests: every PyTorch golden case and the random differential programs, compiled for
//! CUDA. Without a usable CUDA GPU each test says so and passes, so this file runs in CI (no GPU)
//! as well as on the GPU machine (`../shared/device/README.md`):
//!
//! ```sh
//! ../shared/device/stage.sh test:gpu     # here; then on the GPU machine:
//! .device/bin/gpu --include-ignored --test-threads=1
//! ```

#[path = "golden/harness.rs"]
mod golden;

#[path = "differential/harness.rs"]
mod differential;

/// The GPU, or `None` after saying why the test is skipped.
fn gpu() -> Option<coil::Device> {
    if coil::cuda_available() {
        Some(coil::Device::Cuda(0))
    } else {
        println!(
            "SKIP: no usable CUDA GPU ({})",
            coil_runtime::cuda::cuda_status().err().map_or(String::new(), |e| e.to_string())
        );
        None
    }
}

#[test]
fn golden_cases_match_pytorch_on_cuda() {
    if let Some(device) = gpu() {
        golden::check_all(coil::Backend::Compiled, device);
    }
}

#[test]
fn compiled_cuda_programs_agree_with_the_interpreter() {
    if let Some(device) = gpu() {
        differential::check_all(device);
    }
}

#[test]
fn cpu_and_cuda_tensors_in_one_op_is_an_error() {
    if let Some(device) = gpu() {
        let x = coil::Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
        let y = x.to_device(device).unwrap();
        let e = x.add(&y).unwrap_err();
        assert_eq!(e.kind, coil::ErrorKind::Device, "{e}");
        assert!(e.to_string().contains("cpu") && e.to_string().contains("cuda:0"), "{e}");
    }
}
