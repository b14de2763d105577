//! Shared by coil's tests (not part of the supported interface): one way for a test that cannot
//! check anything on this machine (no GPU, no `ptxas`, no C or C++ compiler, no PyTorch) to say
//! so, instead of passing silently.

/// Prints `skipped: <reason>` on stderr: the test checked nothing. `cargo test -- --nocapture`
/// (or a failing run) shows the lines; `grep 'skipped:'` lists what a machine could not check.
///
/// ```
/// if std::process::Command::new("no-such-tool").output().is_err() {
///     coil_ir::testing::skip("no no-such-tool on the PATH");
/// }
/// ```
pub fn skip(reason: impl std::fmt::Display) {
    eprintln!("skipped: {reason}");
}
