//! Building a template's host emulation (for the emulation tests): one C++ translation unit
//! (the block emulation, the template's CUDA source, a runner) compiled by `g++`.

use std::path::PathBuf;
use std::process::Command;

/// Compiles `unit` into an executable in a temporary folder named after `name` and the
/// process, with `flags` besides the common ones. `None` without g++ (the test is reported
/// skipped); g++ rejecting the unit or warning about it fails the test.
pub(super) fn build_emulator(name: &str, unit: &str, flags: &[&str]) -> Option<PathBuf> {
    let dir = std::env::temp_dir().join(format!("coil_{name}_emulation_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("emu.cpp"), unit).unwrap();
    let exe = dir.join("emu");
    let out = Command::new("g++")
        .args(["-std=c++17", "-O1", "-pthread", "-Wall", "-Wno-unused"])
        .args(flags)
        .args(["emu.cpp", "-o"])
        .arg(&exe)
        .current_dir(&dir)
        .output();
    let Ok(out) = out else {
        coil_ir::testing::skip(format!("the {name} template's host emulation: no g++"));
        return None;
    };
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "g++ rejected the {name} template:\n{log}");
    assert!(!log.contains("warning"), "g++ warns about the {name} template:\n{log}");
    Some(exe)
}
