//! Logs: the configuration's `logs` channels ([`coil_ir::config::Config::logs`]; by default
//! `COIL_LOGS`). `fusion,output_code,schedule` print those events to stderr as graphs compile
//! (`all` prints every channel); `graph_breaks,recompiles,guards` print what compiled functions
//! do ([`crate::dynamo`]).
//!
//! Each line is prefixed with its channel, e.g. `[coil:fusion] ...`, so logs can be filtered.

/// The channels coil logs on.
pub use coil_ir::config::LOG_CHANNELS as CHANNELS;

/// Whether `channel` is on in the configuration in force.
pub(crate) fn enabled(channel: &str) -> bool {
    coil_ir::config::current().logs_on(channel)
}

fn print(channel: &str, text: &str) {
    if enabled(channel) {
        for line in text.lines() {
            eprintln!("[coil:{channel}] {line}");
        }
    }
}

/// The fused kernels and every refused fusion with its reason.
pub fn fusion(post_fusion: &str) {
    print("fusion", post_fusion);
}

/// A generated kernel's block program.
pub fn output_code(name: &str, tile: &str) {
    if enabled("output_code") {
        print("output_code", &format!("kernel {name}:\n{tile}"));
    }
}

/// Launch order, buffers and memory plan.
pub fn schedule(text: &str) {
    print("schedule", text);
}

/// A compiled function's new graph break: id, line, reason and hint.
pub fn graph_break(text: &str) {
    print("graph_breaks", text);
}

/// A recompile and the guard that failed, with old and new values.
pub fn recompile(text: &str) {
    print("recompiles", text);
}

/// The guards of a newly compiled graph of a compiled function.
pub fn guards(text: &str) {
    print("guards", text);
}
