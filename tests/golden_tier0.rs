//! The golden PyTorch cases (`tests/golden/`) on the CPU's tier 0: each case's graph is new to
//! the process, so every one tier 0 runs is realized there (while it compiles in the
//! background) and must agree with PyTorch at the harness's tolerances; the others compile
//! first, as before. (`tests/golden/main.rs` runs the compiled path, tier 0 off.)

#[path = "golden/harness.rs"]
mod harness;

#[test]
fn golden_cases_match_pytorch_on_tier_0() {
    // (a cache of its own, under the target directory: its compiles are real ones)
    let cache_dir =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("golden-tier0-{}", std::process::id()));
    let config = coil::Config { eager_tier: true, cache_dir, ..coil::config().as_ref().clone() };
    coil::with_config(config, || {
        let before = coil::tiered::tier0_runs();
        harness::check_all(coil::Backend::Compiled, coil::Device::Cpu);
        let ran = coil::tiered::tier0_runs() - before;
        println!("golden on tier 0: {ran} realizations ran on tier 0");
        assert!(ran >= 100, "only {ran} golden realizations ran on tier 0");
    });
}
