//! Signed zeros as PyTorch computes them, on the reference interpreter and the compiled CPU
//! backend; the cases are in `cases.rs` (shared with `tests/gpu.rs`).

mod cases;

use coil::{Backend, Device};

#[test]
fn the_interpreter_gives_pytorchs_signed_zeros() {
    cases::check_all(Backend::Interpreter, Device::Cpu);
}

#[test]
fn the_cpu_backend_gives_pytorchs_signed_zeros() {
    cases::check_all(Backend::Compiled, Device::Cpu);
}
