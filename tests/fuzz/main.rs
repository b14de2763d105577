//! The API fuzzer as a test (`cargo test --test fuzz`): a fixed-seed run of random op chains,
//! each realized on the interpreter and compiled, in child processes. It passes with no crash,
//! no panic, no recording error without its op and line, no internal error at realize and no
//! disagreement beyond the documented tolerances. `docs/testing.md` says how to run more
//! seeds and how to turn a failing seed into a regression test.
//!
//! The same code is the command `cargo run --release --example fuzz -- --trials N`.

mod compare;
mod gen;
mod nn;
mod ops;
mod runner;

/// Trials in the CI run (seeds `0..CI_TRIALS`): 93 s on the 2-core development machine in a
/// debug build with a cold kernel cache, tier 0 included (under 3 minutes is the budget).
const CI_TRIALS: u64 = 4000;

fn main() -> std::process::ExitCode {
    // First a self-test: a crash and a panic injected into a child are caught with their seeds.
    runner::main(CI_TRIALS, true)
}
