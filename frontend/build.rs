//! The build id of the compiler (`COIL_BUILD_ID`): a hash of the sources of every crate whose
//! code decides what a compiled graph is (ir, passes, codegen, runtime, frontend: their `src`
//! trees, templates included) and of `Cargo.lock` (the versions of the libraries they use). It
//! is part of the key of the disk cache of whole compiled graphs (`graph_cache`), so an entry
//! written by another build of coil is never used.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

/// The crates whose `src` trees are hashed, relative to this crate's directory.
const CRATES: [&str; 5] = ["../ir", "../passes", "../codegen", "../runtime", "."];

fn main() {
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for krate in CRATES {
        let src = here.join(krate).join("src");
        println!("cargo:rerun-if-changed={}", src.display());
        collect(&src, &mut files);
    }
    let lock = here.join("../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    files.push(lock);
    files.sort();
    // SipHash with its fixed keys: the same sources give the same id under one toolchain; a
    // new toolchain may give another id, which only costs a recompile.
    let mut h = DefaultHasher::new();
    for f in &files {
        // Paths relative to the workspace, so the id does not depend on where it is checked out.
        f.strip_prefix(&here).unwrap_or(f).hash(&mut h);
        std::fs::read(f).unwrap_or_default().hash(&mut h);
    }
    println!("cargo:rustc-env=COIL_BUILD_ID={:016x}-{}", h.finish(), files.len());
}

/// Every file under `dir`, recursively.
fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            collect(&path, out);
        } else {
            out.push(path);
        }
    }
}
