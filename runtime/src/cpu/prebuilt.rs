//! The CPU templates built with the crate: `build.rs` compiles the matrix product
//! (`coil_codegen::templates::gemm_cpu::source(IsaCap::Native)`) and the tier-0 executor's math
//! (`coil_codegen::templates::eager_cpu::source()`) with the system C compiler and the flags of
//! every shared object ([`super::native`]), and embeds each shared object, its source and the
//! build machine's [`cpu_signature`] in the crate. A process on a machine of the same signature
//! loads them instead of compiling a template at its first use; any other (another CPU, a
//! source that changed since, a cross build) compiles it through the kernel cache as before.

use super::compiler::CompiledObject;
use super::module::KernelLibrary;
use super::native::cpu_signature;
use std::path::Path;

include!(concat!(env!("OUT_DIR"), "/prebuilt.rs"));

/// A library built with the crate: the shared object, its C source and the build machine's CPU.
type Built = Option<(&'static [u8], &'static str, &'static str)>;

/// Each library built with the crate and the key it is loaded under (one per process: the
/// table of loaded libraries keeps it open).
const BUILT: [(Built, &str); 2] = [(PREBUILT_GEMM, "prebuilt-gemm-cpu-native"), (PREBUILT_EAGER, "prebuilt-eager-cpu")];

/// The library built with the crate from `source` (either template's), opened, if it was built
/// on a CPU of this machine's signature (its private copy is written to `cache_dir`'s `c`
/// directory, else the temp dir; see `super::module`); `None` otherwise, or if it does not load.
pub fn load(source: &str, cache_dir: &Path) -> Option<KernelLibrary> {
    let ((library, _, cpu), key) =
        BUILT.into_iter().find_map(|(built, key)| built.filter(|b| b.1 == source).map(|b| (b, key)))?;
    if cpu_signature().as_deref() != Some(cpu) {
        return None;
    }
    let dir = cache_dir.join("c");
    // where shared objects are known to load from; without it the copy goes to the temp dir
    let _ = std::fs::create_dir_all(&dir);
    let object = CompiledObject {
        path: dir.join(format!("{key}.so.entry")),
        source_path: dir.join(format!("{key}.c")),
        key: key.to_string(),
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
        let Some((_, built_from, _)) = PREBUILT_GEMM else {
            assert!(super::super::c_compiler().is_none() || cpu_signature().is_none(), "build.rs built nothing");
            return;
        };
        assert_eq!(built_from, source, "build.rs compiled the template's current source");
        let lib = load(&source, &dir.0).expect("the prebuilt template loads on the machine it was built on");
        for name in [gemm_cpu::FEATURES_KERNEL, gemm_cpu::PACK_KERNEL, gemm_cpu::COMPUTE_KERNEL] {
            lib.kernel(name).unwrap();
        }
        assert!(load(&format!("{source}\n"), &dir.0).is_none());
        let eager = coil_codegen::templates::eager_cpu::source();
        assert_eq!(PREBUILT_EAGER.map(|b| b.1), Some(eager.as_str()), "build.rs built the tier-0 math too");
        let lib = load(&eager, &dir.0).expect("the prebuilt tier-0 math loads");
        for name in coil_codegen::templates::eager_cpu::kernel_names() {
            lib.kernel(&name).unwrap();
        }
    }
}
