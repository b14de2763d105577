//! What a C build for this machine is: the compiler flags of every shared object, and the CPU
//! `-march=native` targets. Shared, through `#[path]`, with the crate's build script
//! (`build.rs`), which builds the matrix-product template with these flags at build time
//! ([`super::prebuilt`]); so nothing here names the crate.

/// Flags every shared object is built with (besides `-fopenmp-simd`, which is dropped when the
/// compiler does not take it, and `-lm`, which must follow the source).
///
/// `-ffp-contract=off`: every operation rounds as written, as in the interpreter. Contracting
/// `a * b - c` into a fused multiply-add made a value recomputed in two kernels differ: a
/// softmax's `x - max(x)` came out as the product's rounding error instead of 0, which near the
/// largest floats is 1e31, and its exp infinite (found by the API fuzzer, `tests/fuzz`). (The
/// prelude's math uses `fma` explicitly where the target has it: one result either way.)
///
/// `-fno-math-errno -fno-trapping-math` change no value (the kernels never read `errno` nor
/// install floating-point traps) but let `sqrt` and the like inline and selects with a division
/// or a comparison in them become vector blends: without them gcc leaves such loops scalar.
pub const BASE_FLAGS: [&str; 7] =
    ["-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC"];

/// Honours `#pragma omp simd` (vectorization) without OpenMP's run time: the kernels have no
/// threads of their own (`crate::cpu::launch` runs them on the rayon pool).
pub const SIMD_FLAG: &str = "-fopenmp-simd";

/// The CPU `-march=native` builds for on this machine: the vendor, family, model, model name
/// and feature flags of the first processor in `/proc/cpuinfo`, one per line. Two machines of
/// one signature get the same code from the same compiler and flags. `None` where there is no
/// `/proc/cpuinfo` (not Linux) or it lacks those lines.
pub fn cpu_signature() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let first = info.split("\n\n").next()?;
    let field = |name: &str| {
        first.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| format!("{name}: {}", value.trim()))
        })
    };
    let fields: Option<Vec<String>> =
        ["vendor_id", "cpu family", "model", "model name", "flags"].into_iter().map(field).collect();
    Some(fields?.join("\n"))
}
