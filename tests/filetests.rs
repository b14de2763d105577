//! Filetests: compiler stages checked on text, after Cranelift's `.clif` tests.
//!
//! Each `tests/filetests/*.coil` file is IR text with directives in `;` comments. By default
//! the IR is a graph, in the text [`coil::Graph::print`] writes (and [`coil::Graph::parse`]
//! reads); `; level: loops` makes it a loop program ([`LoopProgram::parse`]: the text of
//! `ir_pre_fusion.txt`) and `; level: tile` one or more tile kernels ([`TileKernel::parse_all`]:
//! the `.tile` files of a dump). A graph file:
//!
//! ```text
//! ; Softmax decomposes to one max and one sum over the row.
//! ; pass: decompose
//! ; run
//! graph(%0: f32[4, 16]) {
//!   %1 = softmax(%0, dim=1)
//!   return (%1)
//! }
//! ; check: amax(%0, dims=[1], keepdim=true)
//! ; nextln: expand(
//! ; not: softmax
//! ; count: 1 sum(
//! ```
//!
//! * `; level: graph | loops | tile`: the IR the file holds (default `graph`); the stages then
//!   start there (a loop program at `split` or `schedule`, tile kernels at `c`, `cuda`, `ptx`).
//! * `; pass: a, b, ...`: the stages run on the IR, in order; the checks read the text of the
//!   last (none: the parsed IR printed). Stages: `decompose` (the interpreter's
//!   decomposition: graph to primitive graph), `decompose-fused` (the compile path's: attention
//!   and convolution templates kept whole, half-precision products kept), `rewrite` (e-graph
//!   simplification of a primitive graph: prints the graph, then the rewrite report with the
//!   rules fired), `lower` (primitive graph to loop IR), `split` (split reductions), `schedule`
//!   (fusion into kernels: prints the schedule), `tile` (the scheduled kernels' tile IR), `c`
//!   (their C functions, without the shared prelude), `cuda` (their CUDA C kernels, without the
//!   prelude, launched for the H100), `ptx` (their PTX modules, default tuning, each after a
//!   line `// launch: grid G x block B[, at most M blocks][, clusters of C][, S bytes of
//!   dynamic shared memory]; ptxas level L`: how the runtime launches and assembles it). The
//!   `c`, `cuda` and `ptx` stages generate twice and fail if the two texts differ.
//!   Several `pass:` lines before the first check add up; a `pass:` line after checks starts
//!   another pipeline from the parsed IR, matched by the checks after it (one file can check
//!   the C, CUDA C and PTX of the same kernels).
//! * `; arch: sm_NN`: the GPU the `cuda` and `ptx` stages generate for (default `sm_90`, the
//!   H100; `sm_80` the A100, `sm_89` the RTX 4090, `sm_70` the V100, another the data-center
//!   part of its generation with that compute capability). `cuda` generates for the H100 only.
//! * `; error: P`: the pipeline's stages must fail with an error containing `P` (a kernel
//!   without a PTX form, a GPU without a PTX target); no other check in that pipeline.
//! * `; dynamic: s0 = %L[d]`: dim `d` of input `%L` is the size symbol `s0`; every size of the
//!   graph equal to that dim's written value is taken as `s0` (write a value no other size
//!   has). The `decompose` and `rewrite` stages then run at probe sizes
//!   (`coil_passes::dynamic::generalize`) and `lower` lowers for every size.
//! * `; check: P`: `P` (a literal substring) occurs after the previous match.
//! * `; nextln: P`: `P` occurs on the line after the previous match's line.
//! * `; not: P`: `P` does not occur between the previous match and the next one (or the end).
//! * `; count: N P`: the whole text has exactly `N` occurrences of `P`.
//! * `; run` (or `; run: ints=LO..HI`), graph files only: the parsed graph runs on the reference interpreter
//!   and compiled for the CPU, on the same random inputs (floats of magnitude 0.25 to 2 and
//!   random sign, never zero; integers in `LO..HI`, default `1..4`; bools either), and the
//!   outputs must agree: integers and bools exactly, floats within the dtype's tolerance
//!   (relative L2 error: f64 1e-9, f32 1e-5, f16 / bf16 2e-2), NaN and infinities at the same
//!   places.
//! * Any other `;` line is a comment; a `; word:` line with an unknown word is an error.
//!
//! A failing check prints the directive, its line, and the whole text it was matched against,
//! numbered. Every failing file is reported at once. `ptx_modules_assemble` puts every PTX
//! module the files generate through `ptxas` where it is installed (`ptxas` on the `PATH`, or
//! the one `COIL_PTXAS` names), and reports itself skipped where it is not.

use coil::{Buffer, DType, Device, Graph, HostData, RandomState};
use coil_codegen::cuda::{GpuTarget, Tuning};
use coil_ir::dynamic::SymSizes;
use coil_ir::kernel::{KernelKind, Schedule, TileKernel};
use coil_ir::loops::{LoopProgram, SizeSymbol};
use coil_ir::sym::Expr;
use coil_passes::{DecomposeOptions, RewriteOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a checked text must (or must not) contain.
#[derive(Clone, Debug, PartialEq)]
enum Match {
    Check(String),
    Nextln(String),
    Not(String),
    Count(usize, String),
}

/// The IR a file holds.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Level {
    Graph,
    Loops,
    Tile,
}

/// One pipeline of a file: stages run on the parsed IR, and what their output must show.
#[derive(Debug, Default)]
struct Pipeline {
    passes: Vec<String>,
    /// Each check with its line in the file.
    checks: Vec<(Match, usize)>,
    /// `Some((pattern, line))` when the stages must fail with an error containing `pattern`.
    error: Option<(String, usize)>,
}

/// One `.coil` file: its directives.
#[derive(Debug)]
struct FileTest {
    level: Level,
    /// The GPU the `cuda` and `ptx` stages generate for (`; arch:`; the H100 by default).
    target: GpuTarget,
    /// The file's pipelines, in order (one unless a `pass:` line follows checks).
    pipelines: Vec<Pipeline>,
    /// `Some((lo, hi))`, the range of integer inputs, when the file asks for a run.
    run: Option<(i64, i64)>,
    /// `(symbol, input label, dim)`.
    dynamic: Vec<(String, usize, usize)>,
}

/// The GPU of `; arch: sm_NN`: the H100 for sm_90, the A100 for sm_80, the RTX 4090 for sm_89,
/// the V100 for sm_70; another compute capability on its generation's data-center part.
fn target_of(arch: &str) -> Option<GpuTarget> {
    let n: u32 = arch.strip_prefix("sm_")?.parse().ok()?;
    Some(match n {
        90 => GpuTarget::h100(),
        89 => GpuTarget::rtx_4090(),
        80 => GpuTarget::a100(),
        70 => GpuTarget::v100(),
        _ => {
            let compute_capability = (n / 10, n % 10);
            let cores = GpuTarget { compute_capability, ..GpuTarget::h100() }.tensor_cores();
            GpuTarget { compute_capability, ..GpuTarget::data_center_part(cores) }
        }
    })
}

/// Reads the directives of a file.
fn directives(text: &str) -> Result<FileTest, String> {
    let mut t = FileTest {
        level: Level::Graph,
        target: GpuTarget::h100(),
        pipelines: vec![Pipeline::default()],
        run: None,
        dynamic: vec![],
    };
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let Some(body) = line.trim_start().strip_prefix(';') else { continue };
        let body = body.trim();
        if body == "run" {
            t.run = Some((1, 4));
            continue;
        }
        let Some((key, value)) = body.split_once(':') else { continue };
        if key.contains(char::is_whitespace) {
            continue; // a comment that has a colon
        }
        let value = value.trim().to_string();
        let bad = |what: &str| format!("line {n}: {what}: `{line}`");
        let current = t.pipelines.last_mut().expect("a pipeline");
        match key {
            "level" => {
                t.level = match value.as_str() {
                    "graph" => Level::Graph,
                    "loops" => Level::Loops,
                    "tile" => Level::Tile,
                    _ => return Err(bad("expected `level: graph`, `loops` or `tile`")),
                }
            }
            "arch" => t.target = target_of(&value).ok_or_else(|| bad("expected `arch: sm_NN`"))?,
            "pass" => {
                if !current.checks.is_empty() || current.error.is_some() {
                    t.pipelines.push(Pipeline::default());
                }
                let current = t.pipelines.last_mut().expect("a pipeline");
                current.passes.extend(value.split(',').map(|p| p.trim().to_string()));
            }
            "check" => current.checks.push((Match::Check(value), n)),
            "nextln" => current.checks.push((Match::Nextln(value), n)),
            "not" => current.checks.push((Match::Not(value), n)),
            "count" => {
                let (count, pattern) = value.split_once(' ').ok_or_else(|| bad("expected `count: N pattern`"))?;
                let count = count.parse().map_err(|_| bad("expected a count"))?;
                current.checks.push((Match::Count(count, pattern.trim().to_string()), n));
            }
            "error" => {
                if current.error.is_some() || !current.checks.is_empty() {
                    return Err(bad("an `error` is the only check of its pipeline"));
                }
                current.error = Some((value, n));
            }
            "run" => {
                let range = value.strip_prefix("ints=").ok_or_else(|| bad("expected `run: ints=LO..HI`"))?;
                let (lo, hi) = range.split_once("..").ok_or_else(|| bad("expected `ints=LO..HI`"))?;
                let (lo, hi) = (lo.parse().map_err(|_| bad("bad LO"))?, hi.parse().map_err(|_| bad("bad HI"))?);
                if lo >= hi {
                    return Err(bad("empty integer range"));
                }
                t.run = Some((lo, hi));
            }
            "dynamic" => {
                let parsed = (|| {
                    let (symbol, dim) = value.split_once('=')?;
                    let (label, d) = dim.trim().strip_prefix('%')?.strip_suffix(']')?.split_once('[')?;
                    Some((symbol.trim().to_string(), label.parse().ok()?, d.parse().ok()?))
                })();
                t.dynamic.push(parsed.ok_or_else(|| bad("expected `dynamic: s0 = %L[d]`"))?);
            }
            _ if key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') => {
                return Err(bad(&format!("unknown directive `{key}`")));
            }
            _ => {}
        }
    }
    if t.level != Level::Graph && (t.run.is_some() || !t.dynamic.is_empty()) {
        return Err("`run` and `dynamic` need a graph file (`level: graph`)".into());
    }
    if t.pipelines.iter().any(|p| p.error.is_some() && !p.checks.is_empty()) {
        return Err("an `error` is the only check of its pipeline".into());
    }
    let checks_nothing = |p: &Pipeline| p.checks.is_empty() && p.error.is_none();
    if t.pipelines.len() > 1 && t.pipelines.iter().any(checks_nothing) {
        return Err("a pipeline checks nothing: each `pass:` line after checks needs checks of its own".into());
    }
    if checks_nothing(&t.pipelines[0]) && t.run.is_none() {
        return Err("the file checks nothing: no `check`, `nextln`, `not`, `count`, `error` or `run`".into());
    }
    Ok(t)
}

/// A stage's result.
enum Stage {
    Graph(Graph),
    Rewritten(Graph, coil_passes::RewriteReport),
    /// A primitive graph with symbolic sizes, and its symbols.
    Dynamic(coil_passes::dynamic::DynamicGraph, Vec<SizeSymbol>),
    Program(LoopProgram),
    Scheduled(LoopProgram, Schedule),
    Kernels(Vec<TileKernel>),
    /// Generated source (C or CUDA C).
    Source(String),
    /// PTX modules, one per kernel, each after a comment line of its launch.
    Ptx(Vec<String>),
}

impl Stage {
    fn text(&self) -> String {
        match self {
            Stage::Graph(g) => g.to_string(),
            Stage::Rewritten(g, report) => format!("{g}\n{report}"),
            Stage::Dynamic(d, _) => format!("{}\n{}", d.primitive, d.rewrites),
            Stage::Program(p) => p.to_string(),
            Stage::Scheduled(p, s) => coil_passes::print_schedule(p, s),
            Stage::Kernels(ks) => ks.iter().map(|k| k.to_string()).collect::<Vec<_>>().join("\n"),
            Stage::Source(source) => source.clone(),
            Stage::Ptx(modules) => modules.join("\n"),
        }
    }
}

/// The symbols of `; dynamic:` lines, and the graph's sizes in them.
fn symbolic_sizes(graph: &Graph, dynamic: &[(String, usize, usize)]) -> Result<(SymSizes, Vec<SizeSymbol>), String> {
    let mut sizes = SymSizes::constant(graph);
    let mut symbols = Vec::new();
    for (name, label, dim) in dynamic {
        let input = graph.inputs.iter().position(|x| x.0 == *label).ok_or(format!("`%{label}` is not an input"))?;
        let hint = *graph.meta(graph.inputs[input]).shape.get(*dim).ok_or(format!("`%{label}` has no dim {dim}"))?;
        let symbol = Expr::size(name);
        for node in &mut sizes.nodes {
            for e in node.iter_mut() {
                if *e == Expr::int(hint as i64) {
                    *e = symbol;
                }
            }
        }
        symbols.push(SizeSymbol { symbol, input, dim: *dim, hint: hint as i64 });
    }
    Ok((sizes, symbols))
}

/// `generate` run twice: generated code must not change from run to run (a hash map's order, an
/// address, a clock in it would).
fn deterministic<T: PartialEq>(generate: impl Fn() -> Result<T, String>) -> Result<T, String> {
    let first = generate()?;
    match generate()? == first {
        true => Ok(first),
        false => Err("the generated code differs between two runs on the same input".into()),
    }
}

/// The comment line the `ptx` stage writes before a module: the launch the runtime uses, and
/// the driver assembler's optimization level.
fn launch_line(module: &coil_codegen::cuda::CudaModule) -> String {
    let launch = module.kernels[0].launch;
    let mut line = match launch.grid {
        0 => format!("// launch: grid ceil(xnumel / {})", launch.per_block),
        grid => format!("// launch: grid {grid}"),
    };
    line += &format!(" x block {}", launch.block);
    if launch.max_grid > 0 {
        line += &format!(", at most {} blocks", launch.max_grid);
    }
    if launch.cluster > 1 {
        line += &format!(", clusters of {}", launch.cluster);
    }
    if launch.shared_bytes > 0 {
        line += &format!(", {} bytes of dynamic shared memory", launch.shared_bytes);
    }
    if let coil_codegen::cuda::Language::Ptx { level } = module.language {
        line += &format!("; ptxas level {level}");
    }
    line
}

/// Runs `passes` on the parsed IR, `stage`; `cuda` and `ptx` generate for `target`.
fn run_passes(
    mut stage: Stage,
    passes: &[String],
    dynamic: &[(String, usize, usize)],
    target: &GpuTarget,
) -> Result<Stage, String> {
    let fused =
        DecomposeOptions { fused_attention: true, half_products: true, conv_template: true, ..Default::default() };
    for pass in passes {
        let e = |e: coil::Error| format!("pass `{pass}`: {e}");
        stage = match (pass.as_str(), stage) {
            ("decompose" | "decompose-fused", Stage::Graph(g)) if !dynamic.is_empty() => {
                let (sizes, symbols) = symbolic_sizes(&g, dynamic)?;
                let exprs: Vec<Expr> = symbols.iter().map(|s| s.symbol).collect();
                let options = if pass == "decompose" { DecomposeOptions::default() } else { fused };
                let d = coil_passes::dynamic::generalize_with(&g, &sizes, &exprs, &RewriteOptions::default(), &options)
                    .map_err(|why| format!("pass `{pass}` (dynamic): {why}"))?;
                Stage::Dynamic(d, symbols)
            }
            ("decompose", Stage::Graph(g)) => Stage::Graph(coil_passes::decompose(&g).map_err(e)?),
            ("decompose-fused", Stage::Graph(g)) => Stage::Graph(coil_passes::decompose_with(&g, &fused).map_err(e)?),
            ("rewrite", Stage::Graph(g) | Stage::Rewritten(g, _)) => {
                let (g, report) = coil_passes::simplify(&g, &RewriteOptions::default()).map_err(e)?;
                Stage::Rewritten(g, report)
            }
            ("rewrite", s @ Stage::Dynamic(..)) => s, // generalizing rewrote already
            ("lower", Stage::Graph(g) | Stage::Rewritten(g, _)) => Stage::Program(coil_passes::lower(&g).map_err(e)?),
            ("lower", Stage::Dynamic(d, symbols)) => {
                Stage::Program(coil_passes::lower_dynamic(&d.primitive, &d.sizes, symbols).map_err(e)?)
            }
            ("split", Stage::Program(p)) => Stage::Program(coil_passes::split_reductions(&p)),
            ("schedule", Stage::Program(p)) => {
                let s = coil_passes::schedule(&p);
                Stage::Scheduled(p, s)
            }
            ("tile", Stage::Scheduled(p, s)) => Stage::Kernels(
                s.kernels
                    .iter()
                    .filter(|k| k.kind != KernelKind::Extern)
                    .map(|k| coil_codegen::build_kernel(&p, k))
                    .collect(),
            ),
            ("c", Stage::Kernels(ks)) => Stage::Source(deterministic(|| {
                Ok(ks.iter().map(coil_codegen::emit_kernel).collect::<Vec<_>>().join("\n"))
            })?),
            ("cuda", Stage::Kernels(ks)) => {
                if *target != GpuTarget::h100() {
                    return Err("pass `cuda` generates for the H100 only (`arch: sm_90`)".into());
                }
                Stage::Source(deterministic(|| {
                    let source: Result<Vec<String>, coil::Error> =
                        ks.iter().map(|k| Ok(coil_codegen::cuda::emit_cuda_kernel(k)?.0)).collect();
                    Ok(source.map_err(e)?.join("\n"))
                })?)
            }
            ("ptx", Stage::Kernels(ks)) => Stage::Ptx(deterministic(|| {
                (ks.iter())
                    .map(|k| {
                        let m = coil_codegen::cuda::ptx::emit_ptx(k, target, &Tuning::default())
                            .map_err(|why| format!("pass `ptx`: {}: no PTX form: {why}", k.name))?;
                        Ok(format!("{}\n{}", launch_line(&m), m.source))
                    })
                    .collect()
            })?),
            (
                "decompose" | "decompose-fused" | "rewrite" | "lower" | "split" | "schedule" | "tile" | "c" | "cuda"
                | "ptx",
                _,
            ) => return Err(format!("pass `{pass}` cannot follow the passes before it (see the order in the docs)")),
            _ => return Err(format!("unknown pass `{pass}`")),
        };
    }
    Ok(stage)
}

/// `text` numbered by line, for failure messages.
fn numbered(text: &str) -> String {
    text.lines().enumerate().map(|(i, l)| format!("{:>4} | {l}\n", i + 1)).collect()
}

/// The 1-based line of byte `at` of `text`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// Matches `checks` against `text` in order (see the module docs). The error names the check
/// and its line in the file.
fn match_checks(text: &str, checks: &[(Match, usize)]) -> Result<(), String> {
    // Where the previous match ended (the search goes on from there), and where it started.
    let (mut cursor, mut last_start): (usize, Option<usize>) = (0, None);
    let mut nots: Vec<(&str, usize)> = Vec::new();
    let after = |last: Option<usize>| match last {
        Some(s) => format!("after output line {}", line_of(text, s)),
        None => "in the output".into(),
    };
    // The `not`s between the previous match and `end`.
    let check_nots = |nots: &mut Vec<(&str, usize)>, from: usize, end: usize| -> Result<(), String> {
        for (p, n) in nots.drain(..) {
            if let Some(at) = text[from..end].find(p) {
                return Err(format!("line {n}: `not: {p}` occurs, at output line {}", line_of(text, from + at)));
            }
        }
        Ok(())
    };
    for (check, n) in checks {
        match check {
            Match::Check(p) => {
                let at = text[cursor..]
                    .find(p.as_str())
                    .map(|a| cursor + a)
                    .ok_or_else(|| format!("line {n}: `check: {p}` not found {}", after(last_start)))?;
                check_nots(&mut nots, cursor, at)?;
                (cursor, last_start) = (at + p.len(), Some(at));
            }
            Match::Nextln(p) => {
                let line_start = match last_start {
                    None => 0,
                    Some(_) => match text[cursor..].find('\n') {
                        Some(nl) => cursor + nl + 1,
                        None => text.len(),
                    },
                };
                let line_end = text[line_start..].find('\n').map_or(text.len(), |e| line_start + e);
                let at = text[line_start..line_end].find(p.as_str()).map(|a| line_start + a).ok_or_else(|| {
                    format!("line {n}: `nextln: {p}` is not on output line {}", line_of(text, line_start))
                })?;
                check_nots(&mut nots, cursor, at)?;
                (cursor, last_start) = (at + p.len(), Some(at));
            }
            Match::Not(p) => nots.push((p, *n)),
            Match::Count(want, p) => {
                let got = text.matches(p.as_str()).count();
                if got != *want {
                    return Err(format!("line {n}: `count: {want} {p}` occurs {got} times"));
                }
            }
        }
    }
    check_nots(&mut nots, cursor, text.len())
}

/// A small deterministic generator (xorshift64*), seeded per file.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Random inputs for `meta`: see the module docs.
fn random_buffer(meta: &coil::TensorMeta, rng: &mut Rng, ints: (i64, i64)) -> Buffer {
    let n = meta.numel();
    let data = if meta.dtype.is_float() {
        let xs: Vec<f64> = (0..n)
            .map(|_| {
                let sign = if rng.next() & 1 == 0 { 1.0 } else { -1.0 };
                sign * (0.25 + 1.75 * rng.unit())
            })
            .collect();
        HostData::from_f64_slice(meta.dtype, &xs)
    } else if meta.dtype == DType::Bool {
        HostData::from_i64_slice(meta.dtype, &(0..n).map(|_| (rng.next() & 1) as i64).collect::<Vec<_>>())
    } else {
        let span = (ints.1 - ints.0) as u64;
        HostData::from_i64_slice(meta.dtype, &(0..n).map(|_| ints.0 + (rng.next() % span) as i64).collect::<Vec<_>>())
    };
    Buffer::new(meta.shape.clone(), data).expect("input buffer")
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-9,
        DType::F32 => 1e-5,
        _ => 2e-2,
    }
}

/// Whether two outputs agree (see the module docs).
fn agree(got: &Buffer, want: &Buffer) -> Result<(), String> {
    if got.meta() != want.meta() {
        return Err(format!("compiled gives {}, the interpreter {}", got.meta(), want.meta()));
    }
    if !got.dtype().is_float() {
        let (g, w) = (got.data.to_i64_vec(), want.data.to_i64_vec());
        return match (0..g.len()).find(|&i| g[i] != w[i]) {
            Some(i) => Err(format!("element {i}: compiled {}, interpreter {}", g[i], w[i])),
            None => Ok(()),
        };
    }
    let (g, w) = (got.data.to_f64_vec(), want.data.to_f64_vec());
    if let Some(i) = (0..g.len()).find(|&i| {
        (g[i].is_finite() != w[i].is_finite())
            || (!w[i].is_finite() && g[i].to_bits() != w[i].to_bits() && !(g[i].is_nan() && w[i].is_nan()))
    }) {
        return Err(format!("element {i}: compiled {}, interpreter {} (non-finite values must agree)", g[i], w[i]));
    }
    let (mut diff, mut norm) = (0.0, 0.0);
    for (a, b) in g.iter().zip(&w).filter(|(_, b)| b.is_finite()) {
        diff += (a - b) * (a - b);
        norm += b * b;
    }
    let rel = diff.sqrt() / norm.sqrt().max(1e-30);
    if rel > tolerance(got.dtype()) {
        return Err(format!("relative error {rel:.3e} above {:.0e}", tolerance(got.dtype())));
    }
    Ok(())
}

/// Runs `graph` on the interpreter and compiled for the CPU, on the same random inputs; the
/// number of outputs compared.
fn compare_backends(graph: &Graph, seed: u64, ints: (i64, i64)) -> Result<usize, String> {
    let mut rng = Rng(seed | 1);
    let inputs: Vec<Buffer> = graph.inputs.iter().map(|&x| random_buffer(graph.meta(x), &mut rng, ints)).collect();
    let streams = graph.nodes.iter().filter_map(|n| n.op.random_stream().map(|s| s + 1)).max().unwrap_or(0);
    let random: Vec<RandomState> = (0..streams as u64).map(|s| RandomState { seed: 1234 + s, offset: 0 }).collect();
    let refs: Vec<&Buffer> = inputs.iter().collect();
    let primitive = coil_passes::decompose(graph).map_err(|e| format!("decompose: {e}"))?;
    let want =
        coil_runtime::interp::interpret_with(&primitive, &refs, &random).map_err(|e| format!("interpreter: {e}"))?;
    let compiled = coil_frontend::compile::compile_fresh(graph, Device::Cpu).map_err(|e| format!("compile: {e}"))?;
    let storages: Vec<coil::Storage> = inputs.into_iter().map(|b| coil::Storage::host(Arc::new(b))).collect();
    let got = compiled.run(&storages, &random).map_err(|e| format!("compiled run: {e}"))?;
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let g = g.to_host().map_err(|e| e.to_string())?;
        agree(&g, w).map_err(|e| format!("output {k}: {e}"))?;
    }
    if got.len() != want.len() || want.len() != graph.outputs.len() {
        return Err(format!("{} outputs compiled, {} interpreted", got.len(), want.len()));
    }
    Ok(want.len())
}

/// What a file's run found: what ran, and the PTX modules its pipelines generated.
struct FileRun {
    summary: String,
    ptx: Vec<String>,
    target: GpuTarget,
}

/// Runs one file; the error says everything a reader needs.
fn run_file(path: &Path) -> Result<FileRun, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let test = directives(&text)?;
    let parse = || {
        let parsed = match test.level {
            Level::Graph => Graph::parse(&text).map(Stage::Graph),
            Level::Loops => LoopProgram::parse(&text).map(Stage::Program),
            Level::Tile => TileKernel::parse_all(&text).map(Stage::Kernels),
        };
        parsed.map_err(|e| e.to_string())
    };
    let (mut checks, mut ptx) = (0, Vec::new());
    for pipeline in &test.pipelines {
        let stages = if pipeline.passes.is_empty() { "the parsed IR".to_string() } else { pipeline.passes.join(", ") };
        let output = run_passes(parse()?, &pipeline.passes, &test.dynamic, &test.target);
        let output = match (output, &pipeline.error) {
            (Err(e), Some((want, _))) if e.contains(want.as_str()) => {
                checks += 1;
                continue;
            }
            (Err(e), Some((want, n))) => return Err(format!("line {n}: `error: {want}`: {stages} failed with: {e}")),
            (Ok(_), Some((want, n))) => return Err(format!("line {n}: `error: {want}`: {stages} succeeded")),
            (Err(e), None) => return Err(e),
            (Ok(output), None) => output,
        };
        let printed = output.text();
        match_checks(&printed, &pipeline.checks)
            .map_err(|e| format!("{e}\noutput of {stages}:\n{}", numbered(&printed)))?;
        checks += pipeline.checks.len();
        if let Stage::Ptx(modules) = output {
            ptx.extend(modules);
        }
    }
    let mut summary = format!("{checks} checks");
    if let (Some(ints), Level::Graph) = (test.run, test.level) {
        let Stage::Graph(graph) = parse()? else { unreachable!("a graph file parses to a graph") };
        let seed = path
            .file_name()
            .unwrap()
            .as_encoded_bytes()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        let outputs = compare_backends(&graph, seed, ints).map_err(|e| format!("run: {e}"))?;
        summary += &format!(", {outputs} outputs agree");
    }
    Ok(FileRun { summary, ptx, target: test.target })
}

/// The `.coil` files of `tests/filetests`, in name order.
fn filetest_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("tests/filetests")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "coil"))
        .collect();
    files.sort();
    files
}

fn display_name(path: &Path) -> String {
    path.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(path).display().to_string()
}

#[test]
fn filetests() {
    let files = filetest_files();
    let mut failures = Vec::new();
    for path in &files {
        let name = display_name(path);
        match std::panic::catch_unwind(|| run_file(path)) {
            Ok(Ok(run)) => println!("ok: {name}: {}", run.summary),
            Ok(Err(e)) => failures.push(format!("{name}: {e}")),
            Err(_) => failures.push(format!("{name}: panicked")),
        }
    }
    assert!(failures.is_empty(), "{} of {} filetests fail:\n\n{}", failures.len(), files.len(), failures.join("\n\n"));
    assert!(files.len() >= 10, "only {} filetests", files.len());
}

/// The checks of `directives` (of its one pipeline).
fn checks(text: &str) -> Vec<(Match, usize)> {
    let mut t = directives(text).unwrap();
    assert_eq!(t.pipelines.len(), 1);
    t.pipelines.remove(0).checks
}

/// Every PTX module the filetests generate through the driver's assembler, `ptxas -arch` of its
/// file's target, where it is installed (`ptxas` on the `PATH`, or the one `COIL_PTXAS` names);
/// reported as skipped where it is not.
#[test]
fn ptx_modules_assemble() {
    let ptxas = std::env::var("COIL_PTXAS").unwrap_or_else(|_| "ptxas".into());
    if std::process::Command::new(&ptxas).arg("--version").output().is_err() {
        coil_ir::testing::skip(format!("no ptxas ({ptxas}): the filetests' PTX is not assembled"));
        return;
    }
    let dir = std::env::temp_dir().join(format!("coil_filetests_ptx_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut failures, mut assembled) = (Vec::new(), 0);
    for path in filetest_files() {
        let Ok(run) = run_file(&path) else { continue }; // `filetests` reports it
        for (i, module) in run.ptx.iter().enumerate() {
            let stem = format!("{}_{i}", path.file_stem().unwrap().to_string_lossy());
            let source = dir.join(format!("{stem}.ptx"));
            std::fs::write(&source, module).unwrap();
            let out = std::process::Command::new(&ptxas)
                .arg(format!("-arch=sm_{}", run.target.arch()))
                .arg("-o")
                .arg(dir.join(format!("{stem}.cubin")))
                .arg(&source)
                .output()
                .unwrap();
            assembled += 1;
            if !out.status.success() {
                let why = String::from_utf8_lossy(&out.stderr);
                failures.push(format!("{} (module {i}): {why}", display_name(&path)));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{} modules do not assemble:\n{}", failures.len(), failures.join("\n"));
    println!("{assembled} PTX modules assemble");
}

#[test]
fn the_matcher_matches_in_order() {
    let out = "a: exp(x)\nb: add(a, 1)\nc: mul(b, b)\n";
    assert!(match_checks(out, &checks("; check: exp\n; nextln: add\n; check: mul")).is_ok());
    // Order matters.
    let e = match_checks(out, &checks("; check: mul\n; check: exp")).unwrap_err();
    assert!(e.contains("line 2: `check: exp` not found after output line 3"), "{e}");
    // `nextln` is the very next line.
    let e = match_checks(out, &checks("; check: exp\n; nextln: mul")).unwrap_err();
    assert!(e.contains("`nextln: mul` is not on output line 2"), "{e}");
    // A second match on the same line.
    assert!(match_checks(out, &checks("; check: add\n; check: 1")).is_ok());
}

#[test]
fn the_matcher_checks_nots_between_matches_and_counts() {
    let out = "a: exp(x)\nb: add(a, 1)\nc: mul(b, b)\n";
    assert!(match_checks(out, &checks("; check: exp\n; not: mul\n; check: add")).is_ok());
    let e = match_checks(out, &checks("; check: exp\n; not: add\n; check: mul")).unwrap_err();
    assert!(e.contains("line 2: `not: add` occurs, at output line 2"), "{e}");
    let e = match_checks(out, &checks("; check: add\n; not: mul")).unwrap_err();
    assert!(e.contains("`not: mul` occurs"), "{e}");
    assert!(match_checks(out, &checks("; count: 2 b,\n; count: 0 div")).is_err());
    assert!(match_checks(out, &checks("; count: 1 b,\n; count: 0 div")).is_ok());
}

#[test]
fn directives_are_checked() {
    assert!(directives("; chekc: x").unwrap_err().contains("unknown directive `chekc`"));
    assert!(directives("; just a comment: with a colon\ngraph() {}").unwrap_err().contains("checks nothing"));
    let t = directives("; pass: decompose, rewrite\n; run: ints=0..3\n; dynamic: s0 = %0[1]").unwrap();
    assert_eq!(
        (t.level, &t.pipelines[0].passes),
        (Level::Graph, &vec!["decompose".to_string(), "rewrite".to_string()])
    );
    assert_eq!(directives("; level: tile\n; check: x").unwrap().level, Level::Tile);
    assert!(directives("; level: loops\n; run").unwrap_err().contains("need a graph file"));
    assert!(directives("; level: kernels\n; check: x").unwrap_err().contains("expected `level: graph`"));
    assert_eq!((t.run, t.dynamic), (Some((0, 3)), vec![("s0".to_string(), 0, 1)]));
}

#[test]
fn pass_lines_after_checks_start_pipelines() {
    let t = directives("; level: tile\n; pass: c\n; pass: c\n; check: a\n; pass: ptx\n; error: no PTX\n; arch: sm_80")
        .unwrap();
    let passes: Vec<&Vec<String>> = t.pipelines.iter().map(|p| &p.passes).collect();
    assert_eq!(passes, [&vec!["c".to_string(), "c".to_string()], &vec!["ptx".to_string()]]);
    assert_eq!(t.pipelines[1].error, Some(("no PTX".to_string(), 6)));
    assert_eq!((t.target, target_of("sm_90")), (GpuTarget::a100(), Some(GpuTarget::h100())));
    assert_eq!(target_of("sm_100").map(|t| (t.arch(), t.sm_count)), Some((100, 132)));
    assert!(directives("; check: a\n; pass: c").unwrap_err().contains("a pipeline checks nothing"));
    assert!(directives("; error: x\n; check: a").unwrap_err().contains("only check of its pipeline"));
    assert!(directives("; arch: 90\n; check: a").unwrap_err().contains("expected `arch: sm_NN`"));
}

#[test]
fn generated_code_must_not_change_between_runs() {
    let calls = std::cell::Cell::new(0);
    let varies = || {
        calls.set(calls.get() + 1);
        Ok(calls.get())
    };
    assert!(deterministic(varies).unwrap_err().contains("differs between two runs"));
    assert_eq!(deterministic(|| Ok(1)), Ok(1));
}

#[test]
fn runs_compare_the_backends() {
    // A wrong answer must fail: the agreement check itself.
    let a = Buffer::from_vec(vec![1.0f32, 2.0], vec![2]);
    assert!(agree(&a, &Buffer::from_vec(vec![1.0f32, 2.0], vec![2])).is_ok());
    assert!(agree(&a, &Buffer::from_vec(vec![1.0f32, 2.1], vec![2])).is_err());
    assert!(agree(&a, &Buffer::from_vec(vec![1.0f32, f32::NAN], vec![2])).is_err());
    assert!(agree(&a, &Buffer::from_vec(vec![1.0f64, 2.0], vec![2])).is_err());
}
