//! The API fuzzer as a command: random op chains over random tensors, realized on the
//! interpreter and on every compiled backend (the CPU, and CUDA when a GPU is usable), each
//! batch of trials in a child process so that a crash is caught and its seed kept.
//!
//! ```sh
//! cargo run --release --example fuzz -- --trials 20000            # seeds 0..20000
//! cargo run --release --example fuzz -- --seed 1234 --trials 1 --verbose   # one seed's script
//! ```
//!
//! Options: `--seed S --trials N --device cpu|cuda|all --jobs J --batch B --timeout SECS
//! --verbose`. The code is shared with the test `tests/fuzz` (see `docs/testing.md`).

#[path = "../tests/fuzz/compare.rs"]
mod compare;
#[path = "../tests/fuzz/gen.rs"]
mod gen;
#[path = "../tests/fuzz/nn.rs"]
mod nn;
#[path = "../tests/fuzz/ops.rs"]
mod ops;
#[path = "../tests/fuzz/runner.rs"]
mod runner;

fn main() -> std::process::ExitCode {
    runner::main(10_000, false)
}
