//! Builds the CPU templates the run time would otherwise compile at first use with the system
//! C compiler while the crate is built: the matrix product (`coil_codegen::templates::gemm_cpu`,
//! as `IsaCap::Native`; about half a second at a process's first product) and the tier-0
//! executor's math (`coil_codegen::templates::eager_cpu`; the first eager realization of a new
//! graph must not wait for a C compiler). `cpu::prebuilt` loads a build when it was made for
//! the CPU the process runs on, from the same source.
//!
//! Writes `$OUT_DIR/prebuilt.rs`: `PREBUILT_GEMM` and `PREBUILT_EAGER`, each `Some((library,
//! source, cpu))` (the shared object's bytes, the C source it was built from, and the
//! `cpu_signature` of the machine) or `None` where nothing was built: a cross build, no
//! `/proc/cpuinfo`, no C compiler that builds it (the run time then compiles it once through
//! the kernel cache, or for products uses the `gemm` crate).

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "src/cpu/native.rs"]
mod native;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/cpu/native.rs");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let gemm = coil_codegen::templates::gemm_cpu::source(coil_codegen::templates::gemm_cpu::IsaCap::Native);
    let eager = coil_codegen::templates::eager_cpu::source();
    let mut code = String::new();
    for (constant, name, source) in [("PREBUILT_GEMM", "gemm_cpu_native", gemm), ("PREBUILT_EAGER", "eager_cpu", eager)]
    {
        let prebuilt = match build(&out, name, &source) {
            Some((library, source, cpu)) => format!(
                "Some((include_bytes!({:?}), include_str!({:?}), {:?}))",
                library.display().to_string(),
                source.display().to_string(),
                cpu
            ),
            None => "None".to_string(),
        };
        code += &format!(
            "/// The template `{name}` built for this machine at build time (`build.rs`): the shared\n\
             /// object, the C source it was built from and the CPU it was built on; `None` where none\n\
             /// was built.\n\
             pub const {constant}: Option<(&[u8], &str, &str)> = {prebuilt};\n"
        );
    }
    std::fs::write(out.join("prebuilt.rs"), code).expect("OUT_DIR takes files");
}

/// The shared object of `source` (named `name`), its source file and the CPU's signature, or
/// `None` where the template cannot be built here for the machine the crate will run on.
fn build(out: &Path, name: &str, source: &str) -> Option<(PathBuf, PathBuf, String)> {
    let target_is_host = std::env::var("TARGET").ok() == std::env::var("HOST").ok();
    if !target_is_host || std::env::var("CARGO_CFG_TARGET_ARCH").ok()? != "x86_64" {
        return None;
    }
    let cpu = native::cpu_signature()?;
    let source_path = out.join(format!("{name}.c"));
    let library = out.join(format!("{name}.so"));
    std::fs::write(&source_path, source).ok()?;
    // `$CC` (its words), else the first of cc, gcc, clang that builds it, as the run time's
    // `CCompiler::detect` picks
    let env_cc = std::env::var("CC").ok().filter(|c| !c.trim().is_empty());
    let compilers = env_cc.into_iter().chain(["cc", "gcc", "clang"].map(String::from));
    for compiler in compilers {
        let mut words = compiler.split_whitespace();
        let Some(program) = words.next() else { continue };
        for simd in [true, false] {
            let mut cmd = Command::new(program);
            cmd.args(words.clone()).args(native::BASE_FLAGS);
            if simd {
                cmd.args(native::SIMD_FLAGS);
            }
            let built = cmd.arg(&source_path).arg("-o").arg(&library).arg("-lm").output();
            if built.is_ok_and(|o| o.status.success()) {
                return Some((library, source_path, cpu));
            }
        }
    }
    println!("cargo:warning=no C compiler built the CPU template {name}; it is compiled at run time instead");
    None
}
