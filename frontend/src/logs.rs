//! Logs: `COIL_LOGS=fusion,output_code,schedule` prints those events to stderr as graphs compile
//! (`COIL_LOGS=all` prints every channel); `COIL_LOGS=graph_breaks,recompiles,guards` prints what
//! compiled functions do ([`crate::dynamo`]).
//!
//! Each line is prefixed with its channel, e.g. `[coil:fusion] ...`, so logs can be filtered.

use std::sync::OnceLock;

/// The channels coil logs on.
pub const CHANNELS: &[&str] = &["fusion", "output_code", "schedule", "graph_breaks", "recompiles", "guards"];

fn enabled(channel: &str) -> bool {
    static SETTING: OnceLock<Vec<String>> = OnceLock::new();
    let on = SETTING.get_or_init(|| {
        let value = std::env::var("COIL_LOGS").unwrap_or_default();
        let names: Vec<String> = value.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        for n in &names {
            if n != "all" && !CHANNELS.contains(&n.as_str()) {
                eprintln!("coil: COIL_LOGS names an unknown channel `{n}` (known: all, {})", CHANNELS.join(", "));
            }
        }
        names
    });
    on.iter().any(|c| c == channel || c == "all")
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
