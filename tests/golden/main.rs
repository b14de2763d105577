//! Golden tests on the CPU: every PyTorch case, on the reference interpreter and compiled.
//! The harness (loading, comparing, the case tables) is in `harness.rs`.

mod harness;
mod round_trip;

#[test]
fn golden_cases_match_pytorch_interpreted() {
    harness::check_all(coil::Backend::Interpreter, coil::Device::Cpu);
}

#[test]
fn golden_cases_match_pytorch_compiled() {
    // Compiled before it runs: tier 0 (`coil::tiered`) has its own run, `tests/golden_tier0.rs`.
    let config = coil::Config { eager_tier: false, ..coil::config().as_ref().clone() };
    coil::with_config(config, || harness::check_all(coil::Backend::Compiled, coil::Device::Cpu));
}

#[test]
fn golden_graphs_round_trip_through_text() {
    round_trip::check_text_round_trips();
}
