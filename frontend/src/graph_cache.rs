//! The disk cache of whole compiled graphs: a process compiling a graph that some process
//! compiled before reads the final loop program and schedule from the graph's entry, rebuilds
//! the tile kernels from them, and loads the kernels' binaries from the runtime's disk cache by
//! key, skipping decomposition, rewriting, lowering, scheduling and source emission.
//!
//! An entry is `<cache dir>/graphs/<key>.graph.entry`, a verified cache entry
//! ([`coil_runtime::cache_entry`]: key and checksum in its header, written atomically). Its
//! **key** hashes everything the compile reads (`key_parts`): the entry format, the build id
//! of coil's own compiler ([`BUILD_ID`], a hash of the sources of the ir, passes, codegen,
//! runtime and frontend crates and of `Cargo.lock`: an entry from another build is never
//! used), the captured graph (every node's op with its attributes, operands and meta, as the
//! in-process cache compares them; no source lines), the device (the CPU with its C compiler's
//! version; a GPU's [`GpuTarget`](coil_ir::target::GpuTarget), whether cuDNN loads and the
//! driver's version), the configuration's settings that change code
//! ([`Config::code_settings`]), the symbolic sizes of a dynamic compile and the donations.
//! Its **payload** is text, in sections: the loop program and the schedule (their IR texts,
//! which parse back to equal values: checked before an entry is written; and the texts of
//! `ir_pre_fusion.txt` and `ir_post_fusion.txt`, which a hit would otherwise print again), the key of the C
//! kernels' shared object or each CUDA translation unit's language, CUBIN key, kernels,
//! symbols and launches, and what the dumps and `summary.json` show of the rewrite pass.
//!
//! A damaged, truncated, wrong-key or unparsable entry is logged on stderr and rebuilt; an
//! entry whose kernels' binaries are no longer in the cache (or no longer load) is a miss. The
//! configuration's `graph_cache` (`COIL_GRAPH_CACHE=0`) turns the cache off.

use crate::dynamo::dynamic::DynamicSpec;
use coil_codegen::cuda::{CudaKernel, Language, Launch};
use coil_ir::config::Config;
use coil_ir::kernel::{Donation, Schedule};
use coil_ir::loops::LoopProgram;
use coil_ir::{Graph, Result};
use coil_runtime::cache_entry::{self, Kind, Lookup};
use coil_runtime::cuda::{CachedUnit, CudaDevice};
use coil_runtime::Device;
use std::fmt::Write;
use std::path::PathBuf;

/// The layout of the key and payload; bumped when either changes.
const FORMAT: &str = "coil-graph-cache-v1";

/// The build id of this coil's compiler: changes whenever the source of the crates that decide
/// what a compiled graph is changes (see `frontend/build.rs`).
pub const BUILD_ID: &str = env!("COIL_BUILD_ID");

/// How a compile used the disk cache of whole compiled graphs (`summary.json`'s
/// `graph_cache`).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum GraphCacheUse {
    /// Not used: the configuration's `graph_cache` is off, or the CPU has no C compiler.
    #[default]
    Off,
    /// No entry: the graph was compiled, and its entry written.
    Miss,
    /// From the entry: the stages before the kernels' binaries were skipped.
    Hit,
    /// An entry was there but not used, for this reason (damaged, unparsable, its kernels'
    /// binaries gone): the graph was compiled, and its entry written again.
    Rebuilt(String),
}

impl GraphCacheUse {
    /// `off`, `miss`, `hit` or `rebuilt`.
    pub fn name(&self) -> &'static str {
        match self {
            GraphCacheUse::Off => "off",
            GraphCacheUse::Miss => "miss",
            GraphCacheUse::Hit => "hit",
            GraphCacheUse::Rebuilt(_) => "rebuilt",
        }
    }
}

/// Where the entry of one compile lies.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Slot {
    /// The entry's key.
    pub key: String,
    /// `<cache dir>/graphs/<key>.graph.entry`.
    pub path: PathBuf,
}

/// What the back end needs to build a compiled graph's executable without its front stages.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry {
    /// The final loop program (after `split_reductions`).
    pub program: LoopProgram,
    /// Its text (`ir_pre_fusion.txt`).
    pub pre_fusion: String,
    /// The text of `ir_post_fusion.txt`.
    pub post_fusion: String,
    /// Its schedule, memory plan and donations included.
    pub schedule: Schedule,
    /// Where the kernels' binaries lie in the runtime's disk cache.
    pub binary: Binary,
    /// The text of `rewrites.txt`.
    pub rewrites: String,
    /// The `rewrite` object of `summary.json`.
    pub rewrite_json: serde_json::Value,
}

/// The kernels' binaries of a compiled graph, by their keys in the runtime's disk cache.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Binary {
    /// The shared object of the C kernels (`None`: every kernel is extern).
    Cpu(Option<String>),
    /// The CUDA translation units, and the NVRTC version that compiled those in CUDA C.
    Cuda { nvrtc: Option<(i32, i32)>, units: Vec<CachedUnit> },
}

/// What [`read`] found.
pub(crate) enum Found {
    /// A verified, parsed entry.
    Entry(Box<Entry>),
    /// No entry.
    Missing,
    /// An entry that must not be used, and why.
    Invalid(String),
}

/// The entry's place for a compile of `captured` for `device` (with `dynamic` sizes and
/// `donations`) under `config`; `None` when the graph cache is off or does not apply (a CPU
/// without a C compiler).
pub(crate) fn slot(
    captured: &Graph,
    device: Device,
    dynamic: Option<&DynamicSpec>,
    donations: &[Donation],
    config: &Config,
) -> Result<Option<Slot>> {
    if !config.graph_cache {
        return Ok(None);
    }
    let Some(device) = device_text(device)? else { return Ok(None) };
    let parts = key_parts(captured, &device, dynamic, donations, config);
    let key = cache_entry::key(&parts.iter().map(String::as_str).collect::<Vec<_>>());
    let path = cache_entry::path(&config.cache_dir.join("graphs"), &key, Kind::Graph);
    Ok(Some(Slot { key, path }))
}

/// Everything the compile of a graph reads besides the graph itself: the device, as codegen
/// sees it; `None` for a CPU without a C compiler (nothing to cache).
fn device_text(device: Device) -> Result<Option<String>> {
    Ok(match device {
        Device::Cpu => coil_runtime::cpu::c_compiler().map(|cc| format!("cpu; cc {}", cc.version())),
        Device::Cuda(n) => {
            let dev = CudaDevice::get(n)?;
            let driver = coil_runtime::cuda::compiler::driver_version()?;
            let cudnn = coil_runtime::cuda::cudnn::available();
            Some(format!("cuda {:?}; cudnn {cudnn}; driver {driver}", dev.target()))
        }
    })
}

/// The parts of the key of a compile (see the module doc); `device` is [`device_text`]'s.
fn key_parts(
    captured: &Graph,
    device: &str,
    dynamic: Option<&DynamicSpec>,
    donations: &[Donation],
    config: &Config,
) -> Vec<String> {
    // What `crate::dynamo::same_structure` compares: ops by their Debug form (every attribute,
    // floats exactly), operands, metas, inputs, outputs.
    let mut graph = String::with_capacity(64 * captured.nodes.len());
    for node in &captured.nodes {
        let _ = writeln!(graph, "{:?} {:?} {:?}", node.op, node.inputs, node.meta);
    }
    let _ = write!(graph, "inputs {:?} outputs {:?}", captured.inputs, captured.outputs);
    let dynamic = dynamic.map_or("static".to_string(), |spec| {
        let mut s = String::new();
        for sym in &spec.symbols {
            let _ = writeln!(s, "symbol {} input {} dim {} hint {}", sym.symbol, sym.input, sym.dim, sym.hint);
        }
        for sizes in &spec.sizes.nodes {
            let _ = writeln!(s, "{}", sizes.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(" "));
        }
        s
    });
    let donations: Vec<String> = donations.iter().map(|d| format!("{}<-{}", d.output, d.input)).collect();
    vec![
        FORMAT.to_string(),
        BUILD_ID.to_string(),
        graph,
        device.to_string(),
        format!("{:?}", config.code_settings()),
        dynamic,
        donations.join(" "),
    ]
}

/// The entry at `slot`, verified and parsed.
pub(crate) fn read(slot: &Slot) -> Found {
    match cache_entry::read(&slot.path, Kind::Graph, &slot.key) {
        Lookup::Missing => Found::Missing,
        Lookup::Invalid(why) => Found::Invalid(why),
        Lookup::Found(payload) => match String::from_utf8(payload).map_err(|_| "it is not text".to_string()) {
            Ok(text) => parse(&text).map_or_else(Found::Invalid, |e| Found::Entry(Box::new(e))),
            Err(why) => Found::Invalid(why),
        },
    }
}

/// Writes the entry of a compiled graph at `slot` (atomically), after checking that its
/// program and schedule parse back to what they are. Best effort: a cache that cannot be
/// written costs the next process a compile, and an IR the texts do not carry whole is not
/// cached (and said so on stderr).
#[allow(clippy::too_many_arguments)]
pub(crate) fn write(
    slot: &Slot,
    program: &LoopProgram,
    program_text: &str,
    schedule: &Schedule,
    post_fusion: &str,
    binary: &Binary,
    rewrites: &str,
    rewrite_json: &serde_json::Value,
) {
    let schedule_text = schedule.to_string();
    let same = LoopProgram::parse(program_text).is_ok_and(|p| p == *program)
        && Schedule::parse(&schedule_text).is_ok_and(|s| s == *schedule);
    if !same {
        eprintln!("coil: graph cache: this graph's program or schedule does not read back from its text; not cached");
        return;
    }
    let mut text = String::new();
    for (name, body) in [
        ("program", program_text),
        ("schedule", schedule_text.as_str()),
        ("post_fusion", post_fusion),
        ("binary", &binary_text(binary)),
        ("rewrites", rewrites),
        ("rewrite_json", &rewrite_json.to_string()),
    ] {
        let _ = writeln!(text, "== {name} {}", body.len());
        text.push_str(body);
        text.push('\n');
    }
    let _ = cache_entry::write(&slot.path, Kind::Graph, &slot.key, text.as_bytes());
}

/// The entry in `text` (its payload), or why it does not parse.
fn parse(text: &str) -> std::result::Result<Entry, String> {
    let mut sections = Sections { rest: text };
    let pre_fusion = sections.next("program")?;
    let program = LoopProgram::parse(pre_fusion).map_err(|e| e.to_string())?;
    let schedule = Schedule::parse(sections.next("schedule")?).map_err(|e| e.to_string())?;
    let post_fusion = sections.next("post_fusion")?.to_string();
    let binary = parse_binary(sections.next("binary")?)?;
    let rewrites = sections.next("rewrites")?.to_string();
    let rewrite_json = serde_json::from_str(sections.next("rewrite_json")?).map_err(|e| e.to_string())?;
    if !sections.rest.is_empty() {
        return Err("text after its last section".into());
    }
    let pre_fusion = pre_fusion.to_string();
    Ok(Entry { program, pre_fusion, post_fusion, schedule, binary, rewrites, rewrite_json })
}

/// The sections of a payload, in order: `== <name> <bytes>\n<body>\n`.
struct Sections<'a> {
    rest: &'a str,
}

impl<'a> Sections<'a> {
    /// The body of the next section, which must be `name`.
    fn next(&mut self, name: &str) -> std::result::Result<&'a str, String> {
        let bad = || format!("no section `{name}` where it belongs");
        let (header, rest) = self.rest.split_once('\n').ok_or_else(bad)?;
        let len: usize = header
            .strip_prefix("== ")
            .and_then(|h| h.strip_prefix(name))
            .and_then(|h| h.strip_prefix(' '))
            .and_then(|n| n.parse().ok())
            .ok_or_else(bad)?;
        let body = rest.get(..len).ok_or_else(bad)?;
        self.rest = rest[len..].strip_prefix('\n').ok_or_else(bad)?;
        Ok(body)
    }
}

/// The `binary` section: `cpu <key>` (`cpu none`), or `cuda` with `nvrtc <major>.<minor>`
/// when a unit is CUDA C, then per unit `unit <language> <key>` and per kernel `kernel <name>
/// <symbol> <grid> <block> <shared bytes> <per block> <max grid> <cluster>`.
fn binary_text(binary: &Binary) -> String {
    match binary {
        Binary::Cpu(key) => format!("cpu {}\n", key.as_deref().unwrap_or("none")),
        Binary::Cuda { nvrtc, units } => {
            let mut s = String::from("cuda\n");
            if let Some((major, minor)) = nvrtc {
                let _ = writeln!(s, "nvrtc {major}.{minor}");
            }
            for u in units {
                let language = match u.language {
                    Language::CudaC => "cuda_c".to_string(),
                    Language::Ptx { level } => format!("ptx{level}"),
                };
                let _ = writeln!(s, "unit {language} {}", u.key);
                for (k, symbol) in u.kernels.iter().zip(&u.symbols) {
                    let l = k.launch;
                    let _ = writeln!(
                        s,
                        "kernel {} {symbol} {} {} {} {} {} {}",
                        k.name, l.grid, l.block, l.shared_bytes, l.per_block, l.max_grid, l.cluster
                    );
                }
            }
            s
        }
    }
}

/// [`binary_text`]'s inverse.
fn parse_binary(text: &str) -> std::result::Result<Binary, String> {
    let bad = |line: &str| format!("a damaged binary section at `{line}`");
    let mut lines = text.lines();
    match lines.next() {
        Some(line) if line.starts_with("cpu ") => match (&line[4..], lines.next()) {
            ("none", None) => Ok(Binary::Cpu(None)),
            (key, None) if !key.contains(' ') => Ok(Binary::Cpu(Some(key.to_string()))),
            _ => Err(bad(line)),
        },
        Some("cuda") => {
            let (mut nvrtc, mut units) = (None, Vec::<CachedUnit>::new());
            for line in lines {
                let words: Vec<&str> = line.split(' ').collect();
                match words[..] {
                    ["nvrtc", version] if nvrtc.is_none() && units.is_empty() => {
                        let (major, minor) = version.split_once('.').ok_or_else(|| bad(line))?;
                        nvrtc = Some((major.parse().map_err(|_| bad(line))?, minor.parse().map_err(|_| bad(line))?));
                    }
                    ["unit", language, key] => {
                        let language = match language {
                            "cuda_c" => Language::CudaC,
                            ptx => Language::Ptx {
                                level: ptx.strip_prefix("ptx").and_then(|l| l.parse().ok()).ok_or_else(|| bad(line))?,
                            },
                        };
                        let key = key.to_string();
                        units.push(CachedUnit { language, key, kernels: vec![], symbols: vec![] });
                    }
                    ["kernel", name, symbol, ref numbers @ ..] if numbers.len() == 6 => {
                        let n: Vec<u32> = numbers
                            .iter()
                            .map(|w| w.parse().map_err(|_| bad(line)))
                            .collect::<std::result::Result<_, _>>()?;
                        let launch = Launch {
                            grid: n[0],
                            block: n[1],
                            shared_bytes: n[2],
                            per_block: n[3],
                            max_grid: n[4],
                            cluster: n[5],
                        };
                        let unit = units.last_mut().ok_or_else(|| bad(line))?;
                        unit.kernels.push(CudaKernel { name: name.to_string(), launch });
                        unit.symbols.push(symbol.to_string());
                    }
                    _ => return Err(bad(line)),
                }
            }
            Ok(Binary::Cuda { nvrtc, units })
        }
        _ => Err(bad(text.lines().next().unwrap_or(""))),
    }
}

#[cfg(test)]
#[path = "graph_cache_tests.rs"]
mod tests;
