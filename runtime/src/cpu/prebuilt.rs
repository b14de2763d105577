//! The matrix-product template built with the crate: `build.rs` compiles
//! `coil_codegen::templates::gemm_cpu::source(IsaCap::Native)` with the system C compiler and
//! the flags of every shared object ([`super::native`]), and embeds the shared object, its
//! source and the build machine's [`cpu_signature`] in the crate. A process on a machine of the
//! same signature loads it instead of compiling the template at its first product; any other
//! (another CPU, a source that changed since, a cross build) compiles it through the kernel
//! cache as before.

use super::compiler::CompiledObject;
use super::module::KernelLibrary;
use super::native::cpu_signature;
use std::path::Path;

include!(concat!(env!("OUT_DIR"), "/prebuilt_gemm.rs"));

/// The key the prebuilt library is loaded under (one per process: the table of loaded
/// libraries keeps it open).
const KEY: &str = "prebuilt-gemm-cpu-native";

/// The library built with the crate, opened, if it was built from `source` on a CPU of this
/// machine's signature (its private copy is written to `cache_dir`'s `c` directory, else the
/// temp dir; see `super::module`); `None` otherwise, or if it does not load.
pub fn load(source: &str, cache_dir: &Path) -> Option<KernelLibrary> {
    let (library, built_from, cpu) = PREBUILT?;
    if built_from != source || cpu_signature().as_deref() != Some(cpu) {
        return None;
    }
    let dir = cache_dir.join("c");
    // where shared objects are known to load from; without it the copy goes to the temp dir
    let _ = std::fs::create_dir_all(&dir);
    let object = CompiledObject {
        path: dir.join(format!("{KEY}.so.entry")),
        source_path: dir.join(format!("{KEY}.c")),
        key: KEY.to_string(),
        cache_hit: true,
        compile_seconds: 0.0,
        rebuilt_because: None,
    };
    KernelLibrary::load(&object, library).inspect_err(|e| eprintln!("coil: {}", e.message)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use coil_codegen::templates::gemm_cpu::{self, IsaCap};

    /// Built here (a native build with a C compiler on Linux, as the test machines are), it
    /// loads for the current source and has the template's entry points; for another source it
    /// is not used.
    #[test]
    fn the_prebuilt_template_loads_for_its_own_source_only() {
        let dir = super::super::tests::TempDir::new("prebuilt");
        let source = gemm_cpu::source(IsaCap::Native);
        let Some((_, built_from, _)) = PREBUILT else {
            assert!(super::super::c_compiler().is_none() || cpu_signature().is_none(), "build.rs built nothing");
            return;
        };
        assert_eq!(built_from, source, "build.rs compiled the template's current source");
        let lib = load(&source, &dir.0).expect("the prebuilt template loads on the machine it was built on");
        for name in [gemm_cpu::FEATURES_KERNEL, gemm_cpu::PACK_KERNEL, gemm_cpu::COMPUTE_KERNEL] {
            lib.kernel(name).unwrap();
        }
        assert!(load(&format!("{source}\n"), &dir.0).is_none());
    }
}
