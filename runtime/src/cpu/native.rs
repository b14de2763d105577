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
/// threads of their own (`crate::cpu::launch` runs them on the rayon pool); on x86-64, also
/// lets the vectorizer use 512-bit vectors where the target has AVX-512 (gcc's default for
/// recent Intel CPUs is 256-bit; PyTorch's vectorized CPU kernels use 512-bit ones there).
/// Dropped together when the compiler does not take them.
///
/// Measured on the build machine (Sapphire Rapids): the f32 layer norm + erf GELU kernel of
/// `examples/eager_shapes` at 64 x 256 from 28 to 21 us. Elementwise results are the same at
/// either width; a vectorized sum adds its lanes in another order (16 partial sums instead of
/// 8, each within f32 rounding, as PyTorch's own vectorized reductions do).
#[cfg(target_arch = "x86_64")]
pub const SIMD_FLAGS: &[&str] = &["-fopenmp-simd", "-mprefer-vector-width=512"];

/// Honours `#pragma omp simd` (vectorization) without OpenMP's run time: the kernels have no
/// threads of their own (`crate::cpu::launch` runs them on the rayon pool). Dropped when the
/// compiler does not take it.
#[cfg(not(target_arch = "x86_64"))]
pub const SIMD_FLAGS: &[&str] = &["-fopenmp-simd"];

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
