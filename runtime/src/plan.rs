//! Where each buffer of a compiled graph lives during a run, and the checks made before any
//! compile, shared by the CPU and CUDA backends: inputs are the caller's, outputs fresh (or
//! written over an input the caller donated), temporaries in memory-plan slots; kernel status
//! words become errors.
//!
//! With size symbols (dynamic shapes), each run binds the symbols from its input shapes and
//! gets the [`Instance`] at those sizes from [`Instances`]: the program and schedule with
//! constant sizes, and where each buffer lives, made once per set of sizes.

use coil_ir::kernel::{Arena, FusedKernel, KernelKind, Schedule, TileKernel};
use coil_ir::loops::{Bindings, BufferId, ExternCall, LoopKind, LoopProgram};
use coil_ir::sym::Expr;
use coil_ir::{DType, Error, RandomState, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Where a buffer's bytes are during a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Storage {
    /// The caller's input `k` (read only).
    Input(usize),
    /// The caller's input `k`, which it donated: this output is written over it
    /// (`MemoryPlan::donated`).
    Donated(usize),
    /// A fresh allocation, returned to the caller.
    Output,
    /// A temporary in slot `s`.
    Slot(usize),
    /// A temporary kept in the memory of the output buffer `b` (`MemoryPlan::in_outputs`: the
    /// base of the scatter that writes `b`, which then runs in place).
    InOutput(BufferId),
    /// Never in memory (lives in registers inside a fused kernel).
    Unused,
}

/// One output of a run: a fresh buffer, or the caller's donated input, now holding the output.
#[derive(Clone, Debug)]
pub enum RunOutput<B> {
    /// A buffer of its own.
    New(B),
    /// Written over the caller's input `k` (donated; see `MemoryPlan::donated`).
    Donated(usize),
}

impl<B> RunOutput<B> {
    /// The same output with a fresh buffer converted by `f`.
    pub fn map<C>(self, f: impl FnOnce(B) -> C) -> RunOutput<C> {
        match self {
            RunOutput::New(b) => RunOutput::New(f(b)),
            RunOutput::Donated(k) => RunOutput::Donated(k),
        }
    }

    /// The buffer, with a donated output resolved to a copy of the (updated) input.
    pub fn or_input(self, input: impl FnOnce(usize) -> Result<B>) -> Result<B> {
        match self {
            RunOutput::New(b) => Ok(b),
            RunOutput::Donated(k) => input(k),
        }
    }
}

/// Checks an extern node's operands against its call: ids in range, every operand among the
/// node's inputs (only they get memory), dtypes agreeing, and the buffers the call writes
/// starting with the node's output.
pub(crate) fn check_extern(
    p: &LoopProgram,
    call: &ExternCall,
    inputs: &[BufferId],
    out: BufferId,
) -> std::result::Result<(), String> {
    let n = p.buffers.len();
    let written = call.written();
    if let Some(b) = inputs.iter().chain([&out]).chain(&written).find(|b| b.0 >= n) {
        return Err(format!("no buffer {}", b.0));
    }
    let what = call.kind_name();
    if call.names_output() && !written.is_empty() && written[0] != out {
        return Err(format!("{what} writes buffer {} first but its node's output is {}", written[0].0, out.0));
    }
    let dtype = p.buffer(out).meta.dtype;
    let stats = coil_ir::infer::attention_stats_dtype(dtype);
    // (buffer, the dtype it must have)
    let operands: Vec<(BufferId, DType)> = match call {
        ExternCall::Bmm { a, b, bias, activation, activation_grad, saved, .. } => {
            // An f16 / bf16 product may write f32 (a widening epilogue: no bias, no activation).
            let plain = bias.is_none() && activation.is_none() && activation_grad.is_none();
            if let Some(saved) = saved {
                // The activation's input is laid out as the output, in its dtype.
                let (s, o) = (&p.buffer(*saved).meta, &p.buffer(out).meta);
                if *saved == out || activation.is_none() || s.numel() != o.numel() || s.dtype != o.dtype {
                    return Err(format!(
                        "bmm's saved activation input {} ({s}) must be another buffer of the output's {o}, with an \
                         activation",
                        saved.0
                    ));
                }
            }
            let operand = match (p.buffer(a.buffer).meta.dtype, dtype) {
                (half @ (DType::F16 | DType::BF16), DType::F32) if plain => half,
                _ => dtype,
            };
            if let Some(grad) = activation_grad {
                // The saved input is laid out as the output.
                let (aux, o) = (&p.buffer(grad.aux).meta, &p.buffer(out).meta);
                if aux.numel() != o.numel() || bias.is_some() || activation.is_some() {
                    return Err(format!(
                        "bmm's saved activation input {} has {} elements for an output of {} (and no bias or \
                         activation may come with it)",
                        grad.aux.0,
                        aux.numel(),
                        o.numel()
                    ));
                }
            }
            let aux = activation_grad.map(|g| g.aux);
            [a.buffer, b.buffer].into_iter().chain(bias.map(|b| b.buffer)).chain(aux).map(|b| (b, operand)).collect()
        }
        ExternCall::Attention(call) => {
            let coil_ir::loops::AttentionCall { q, k, v, lse, mask, mask_rule, .. } = &**call;
            if let Some(lse) = lse {
                if p.buffer(*lse).meta.dtype != stats {
                    return Err(format!("attention's logsumexp buffer {} is not {stats}", lse.0));
                }
            }
            let mut operands = vec![(q.buffer, dtype), (k.buffer, dtype), (v.buffer, dtype)];
            if let Some(mask) = mask {
                // Bool, or added to the scores in the operands' dtype.
                let m = if mask.buffer.0 < n { p.buffer(mask.buffer).meta.dtype } else { dtype };
                operands.push((mask.buffer, if m == DType::Bool { m } else { dtype }));
            }
            // A structured mask's run-time offset: a 0-d i64.
            operands.extend(mask_rule.as_ref().and_then(|r| r.offset).map(|o| (o, DType::I64)));
            operands
        }
        ExternCall::AttentionBackward(call) => {
            let coil_ir::loops::AttentionBackwardCall { q, k, v, grad_out, lse, out, mask, .. } = &**call;
            if let Some(g) = written.iter().find(|g| p.buffer(**g).meta.dtype != dtype) {
                return Err(format!("attention_backward writes buffer {} of another dtype than {dtype}", g.0));
            }
            let views = [q, k, v, grad_out, out].map(|x| (x.buffer, dtype));
            // The mask: bool, or added to the scores in the operands' dtype.
            let mask = mask.as_ref().map(|m| {
                let d = if m.buffer.0 < n { p.buffer(m.buffer).meta.dtype } else { dtype };
                (m.buffer, if d == DType::Bool { d } else { dtype })
            });
            views.into_iter().chain([(*lse, stats)]).chain(mask).collect()
        }
        ExternCall::Fallback { .. } => vec![],
        ExternCall::Conv(call) => vec![(call.a.buffer, dtype), (call.b.buffer, dtype)],
    };
    for (buffer, want) in operands {
        if buffer.0 >= n || !inputs.contains(&buffer) || p.buffer(buffer).meta.dtype != want {
            return Err(format!("{what} operand buffer {} is not a node input of dtype {want}", buffer.0));
        }
    }
    Ok(())
}

/// Decides where each buffer lives: inputs are the caller's, outputs fresh, the other buffers
/// a launch touches in their memory-plan slot (or an extra slot of their own when the plan left
/// them out). Returns the storage per buffer and the byte size per slot.
pub(crate) fn plan_storage(
    p: &LoopProgram,
    schedule: &Schedule,
    used: &[bool],
) -> std::result::Result<(Vec<Storage>, Vec<usize>), String> {
    let plan = &schedule.memory;
    let mut slot_bytes = plan.slots.clone();
    let mut storage = vec![Storage::Unused; p.buffers.len()];
    for (k, &b) in p.inputs.iter().enumerate() {
        storage[b.0] = Storage::Input(k);
    }
    for &b in &p.outputs {
        if storage[b.0] == Storage::Unused {
            storage[b.0] = Storage::Output;
        }
    }
    for d in &plan.donated {
        let (out, input) = (p.outputs.get(d.output), p.inputs.get(d.input));
        match (out, input) {
            (Some(&o), Some(&i)) if storage[o.0] == Storage::Output && p.buffer(o).meta == p.buffer(i).meta => {
                storage[o.0] = Storage::Donated(d.input)
            }
            _ => return Err(format!("donation of input {} to output {} does not fit the program", d.input, d.output)),
        }
    }
    for x in &plan.in_outputs {
        let (b, o) = (x.temporary.0, x.output.0);
        // Only a fresh output can hold it (else it takes a slot of its own below).
        let fits = b < storage.len() && o < storage.len() && p.buffers[b].meta.nbytes() == p.buffers[o].meta.nbytes();
        if fits && storage[b] == Storage::Unused && used[b] && storage[o] == Storage::Output {
            storage[b] = Storage::InOutput(x.output);
        }
    }
    for (i, buf) in p.buffers.iter().enumerate() {
        if storage[i] != Storage::Unused || !used[i] {
            continue;
        }
        let need = buf.meta.nbytes();
        storage[i] = Storage::Slot(match plan.slot_of.get(i).copied().flatten() {
            Some(s) if s < slot_bytes.len() && slot_bytes[s] >= need => s,
            Some(s) => return Err(format!("{} ({need} bytes) does not fit memory slot {s}", buf.name)),
            None => {
                slot_bytes.push(need);
                slot_bytes.len() - 1
            }
        });
    }
    Ok((storage, slot_bytes))
}

/// A launch as its data errors name it: the kernel, and the user's ops folded into it that
/// check their data at run time ([`coil_ir::loops::DataCheck`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaunchName {
    pub kernel: String,
    pub checks: Vec<coil_ir::loops::DataCheck>,
}

impl LaunchName {
    /// A launch known by its kernel's name only.
    pub fn plain(kernel: impl Into<String>) -> LaunchName {
        LaunchName { kernel: kernel.into(), checks: vec![] }
    }

    /// The launch of `schedule` kernel `k`, with the data checks of the nodes it runs.
    pub(crate) fn of(program: &LoopProgram, schedule: &Schedule, k: usize) -> LaunchName {
        let kernel = &schedule.kernels[k];
        let written: Vec<BufferId> = kernel.nodes.iter().flat_map(|&n| program.nodes[n].writes()).collect();
        let checks = program.data_checks.iter().filter(|c| written.contains(&c.buffer)).copied().collect();
        LaunchName { kernel: kernel.name.clone(), checks }
    }
}

/// Where a run's data errors point: the line that asked for the run, and for each captured
/// node whose data the run checks ([`coil_ir::Error::node`]), its line and operands in the
/// capture that ran (a compiled graph serves every capture of its structure, from any lines).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunOrigin {
    /// The user's line that asked for the run (a realize, a compiled function's call).
    pub line: Option<&'static std::panic::Location<'static>>,
    /// `(node, its line, its operands as dtype[shape])`; shared, so that a compiled function's
    /// replays reuse the list their traced call made.
    pub nodes: Arc<[NodeOrigin]>,
}

/// A captured node whose data a run checks: `(node, its line, its operands as dtype[shape])`.
pub type NodeOrigin = (usize, Option<&'static std::panic::Location<'static>>, Vec<String>);

impl RunOrigin {
    /// A run asked for at `line`, naming no captured nodes.
    pub fn at(line: Option<&'static std::panic::Location<'static>>) -> RunOrigin {
        RunOrigin { line, nodes: Arc::default() }
    }

    /// A data error of the run, named as the interpreter names it: its captured node's line
    /// and operands where the run knows them, else the run's line.
    pub fn name(&self, mut e: Error) -> Error {
        if let Some((_, location, operands)) = e.node.and_then(|n| self.nodes.iter().find(|s| s.0 == n)) {
            e.location = location.or(e.location);
            e.operands = operands.clone();
        }
        match self.line {
            Some(line) => e.at(line),
            None => e,
        }
    }
}

/// Turns a launch's status words into an error (see `docs/compiler.md`), named by the user's
/// ops that check that data where the launch knows them (else by the kernel).
pub(crate) fn check_status(launch: &LaunchName, status: &[i64]) -> Result<()> {
    if status[0] == 0 {
        return Ok(());
    }
    // The ops of that kind in the kernel: one names the error (its dim, and the captured node
    // it comes from, for the frontend to give its line and operands); several are listed.
    // (Not their lines: a compiled graph serves every capture of the same structure, from
    // whichever lines recorded it; the frontend names the node of the capture that ran.)
    let checks: Vec<&coil_ir::loops::DataCheck> = launch.checks.iter().filter(|c| c.code == status[0]).collect();
    let one = |field: fn(&coil_ir::loops::DataCheck) -> Option<usize>| {
        let first = field(checks.first()?)?;
        checks.iter().all(|c| field(c) == Some(first)).then_some(first)
    };
    let mut e = match status[0] {
        1 => Error::value(match one(|c| c.dim) {
            Some(dim) => format!("index {} is out of bounds for dim {dim} with size {}", status[1], status[2]),
            None => format!("index {} is out of bounds for dim of size {}", status[1], status[2]),
        }),
        2 => Error::value("Integers to negative integer powers are not allowed."),
        3 => Error::value("ZeroDivisionError: integer division by zero"),
        s => Error::runtime(format!("unknown status {s} ({}, {}, {})", status[1], status[2], status[3])),
    };
    e.node = one(|c| c.node);
    let mut names: Vec<&str> = checks.iter().map(|c| c.op).collect();
    names.dedup();
    match names.is_empty() {
        true => Err(e.in_op(&launch.kernel, vec![])),
        false => Err(e.in_op(format!("{} (kernel {})", names.join(" or "), launch.kernel), vec![])),
    }
}

/// An extern call's error (a fallback's data error, from the interpreter: it names the op and
/// its operands) with the captured node of the call's data check, as [`check_status`] gives a
/// kernel's.
pub(crate) fn extern_error(program: &LoopProgram, node: usize, mut e: Error) -> Error {
    if e.kind == coil_ir::ErrorKind::Value && e.node.is_none() {
        let written = program.nodes[node].writes();
        let mut nodes = program.data_checks.iter().filter(|c| written.contains(&c.buffer)).map(|c| c.node);
        if let Some(first) = nodes.next() {
            if nodes.all(|n| n == first) {
                e.node = first;
            }
        }
    }
    e
}

/// A compiled graph's launches, checked before anything is compiled: per scheduled kernel its
/// tile kernel (`Ok`) or, for extern calls, the loop node (`Err`); where each buffer lives; and
/// the byte size of each memory-plan slot. The error says what is inconsistent.
pub(crate) struct CheckedLaunches<'a> {
    pub steps: Vec<std::result::Result<&'a TileKernel, usize>>,
    pub storage: Vec<Storage>,
    pub slot_bytes: Vec<usize>,
}

/// Checks a schedule, its tile kernels and its extern calls against the program (both backends
/// run the same checks).
pub(crate) fn check_launches<'a>(
    program: &LoopProgram,
    schedule: &Schedule,
    kernels: &'a [Option<TileKernel>],
) -> std::result::Result<CheckedLaunches<'a>, String> {
    if kernels.len() != schedule.kernels.len() {
        return Err(format!("{} tile kernels for {} scheduled kernels", kernels.len(), schedule.kernels.len()));
    }
    // Check everything before paying for a compile.
    let mut plan: Vec<std::result::Result<&'a TileKernel, usize>> = Vec::new();
    // Buffers some launch touches: only they need memory.
    let mut used = vec![false; program.buffers.len()];
    for (fused, tile) in schedule.kernels.iter().zip(kernels) {
        match (fused.kind, tile) {
            (KernelKind::Extern, None) => {
                for &node in &fused.nodes {
                    let n = program.nodes.get(node).ok_or_else(|| format!("{}: no node {node}", fused.name))?;
                    let LoopKind::Extern { call, inputs } = &n.kind else {
                        return Err(format!("{}: node {node} is not extern", fused.name));
                    };
                    check_extern(program, call, inputs, n.output).map_err(|m| format!("{}: {m}", fused.name))?;
                    for b in inputs.iter().copied().chain(n.writes()) {
                        used[b.0] = true;
                    }
                    plan.push(Err(node));
                }
            }
            (KernelKind::Extern, Some(_)) => return Err(format!("{} is extern but has a tile kernel", fused.name)),
            (_, None) => return Err(format!("{} has no tile kernel", fused.name)),
            (_, Some(tile)) => {
                // A scatter's base is copied into its output before the launch.
                for (out, base) in scatter_bases(program, fused) {
                    let b =
                        program.buffers.get(base.0).ok_or_else(|| format!("{}: no buffer {}", tile.name, base.0))?;
                    if !tile.args.iter().any(|a| a.written && a.buffer == out) || program.buffer(out).meta != b.meta {
                        return Err(format!("{}: scatters into a buffer unlike its base {}", tile.name, b.name));
                    }
                    used[base.0] = true;
                }
                for arg in &tile.args {
                    let buf = program
                        .buffers
                        .get(arg.buffer.0)
                        .ok_or_else(|| format!("{}: no buffer {}", tile.name, arg.buffer.0))?;
                    if buf.meta.dtype != arg.dtype {
                        return Err(format!(
                            "{}: {} is {} but {} is {}",
                            tile.name, arg.name, arg.dtype, buf.name, buf.meta
                        ));
                    }
                    if arg.written && program.inputs.contains(&arg.buffer) {
                        return Err(format!("{} writes the input {}", tile.name, buf.name));
                    }
                    used[arg.buffer.0] = true;
                }
                plan.push(Ok(tile));
            }
        }
    }
    let (storage, slot_bytes) = plan_storage(program, schedule, &used)?;
    // An extern call reads its operands through slices while writing its outputs: no two of
    // them may share memory (the generated kernels handle in-place updates themselves), but a
    // scatter's base, which the scatter writes over in place (`scatter_base`).
    // The memory a buffer lives in: (slot, output or input, its number); none for buffers
    // never in memory.
    let memory = |b: BufferId| match storage[b.0] {
        Storage::Slot(s) => Some((0, s)),
        Storage::Output => Some((1, b.0)),
        Storage::InOutput(o) => Some((1, o.0)),
        Storage::Input(k) | Storage::Donated(k) => Some((2, k)),
        Storage::Unused => None,
    };
    for step in &plan {
        if let Err(node) = step {
            let n = &program.nodes[*node];
            let writes = n.writes();
            let base = scatter_base(n);
            for (i, w) in writes.iter().enumerate() {
                let others = n.reads().into_iter().filter(|&b| Some(b) != base || *w != n.output);
                let others = others.chain(writes[i + 1..].iter().copied()).collect::<Vec<_>>();
                if memory(*w).is_some() && others.iter().any(|&b| memory(b) == memory(*w)) {
                    let name = &program.buffer(*w).name;
                    return Err(format!("extern {name} shares memory with an operand or another output"));
                }
            }
        }
    }
    Ok(CheckedLaunches { steps: plan, storage, slot_bytes })
}

/// The base of an extern scatter node, when it reads it as nothing else: the one operand the
/// call may find in its output's memory (its base kept there by the memory plan, in place).
fn scatter_base(n: &coil_ir::loops::LoopNode) -> Option<BufferId> {
    match &n.kind {
        LoopKind::Extern { call: ExternCall::Fallback { op: coil_ir::Op::Scatter { .. } }, inputs } => {
            inputs.first().copied().filter(|b| !inputs[1..].contains(b))
        }
        _ => None,
    }
}

/// `(output, base)` of each scatter node of `kernel` ([`coil_ir::loops::ScatterStore`]): the
/// output must hold the base's elements before the kernel writes its own, so a backend copies
/// the base into the output first, unless both are the same memory (a donated base, or an
/// output written in place over its base).
pub(crate) fn scatter_bases(program: &LoopProgram, kernel: &FusedKernel) -> Vec<(BufferId, BufferId)> {
    let nodes = kernel.nodes.iter().filter_map(|&n| program.nodes.get(n));
    nodes.filter_map(|n| n.scatter().map(|s| (n.output, s.base))).collect()
}

/// One launch of a run, in schedule order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The generated kernel `kernels[i]` (`kernels` parallel to `schedule.kernels`).
    Kernel(usize),
    /// The extern node `program.nodes[n]`.
    Extern(usize),
}

/// A compiled graph at one run's sizes: what a backend allocates and launches. Every size in
/// it is a constant; the kernels, compiled once for every size, take the symbols' values.
#[derive(Debug)]
pub(crate) struct Instance {
    /// The program at these sizes ([`LoopProgram::instantiate`]: constant buffer metas, ranges
    /// and extern calls; bodies still name the symbols).
    pub program: LoopProgram,
    /// The schedule at these sizes (constant kernel extents, memory slots resized).
    pub schedule: Schedule,
    /// Where each buffer of `program` lives.
    pub storage: Vec<Storage>,
    /// Where the storage slots (the memory plan's, then one per temporary it left out) sit in
    /// the one allocation a run makes for them.
    pub arena: Arena,
    /// The values of the program's size symbols, in `program.symbols` order (empty if static).
    pub sizes: Vec<i64>,
    /// Per entry of `kernels`: the values of its [`TileKernel::sizes`], in order (what the
    /// kernel takes after its buffers; empty for static kernels and extern entries).
    pub kernel_sizes: Vec<Vec<i64>>,
    /// Per node of `program`: for the nodes of extern kernels, the largest range of the arena
    /// that no slot in use at that launch covers, `(offset, bytes)` (a library call's scratch
    /// workspace: [`coil_ir::kernel::MemoryPlan::free_range`]); `(0, 0)` for the others.
    pub scratch: Vec<(usize, usize)>,
}

impl Instance {
    /// The instance at `bindings` (empty for a static program, which is then taken as it is),
    /// checked by [`check_launches`].
    fn new(
        program: &LoopProgram,
        schedule: &Schedule,
        kernels: &[Option<TileKernel>],
        bindings: &Bindings,
    ) -> std::result::Result<Instance, String> {
        let (program, schedule) = if program.symbols.is_empty() {
            (program.clone(), schedule.clone())
        } else {
            let p = program.instantiate(bindings);
            let s = schedule.instantiate(&p, bindings);
            (p, s)
        };
        let CheckedLaunches { storage, slot_bytes, .. } = check_launches(&program, &schedule, kernels)?;
        let kernel_sizes = kernels
            .iter()
            .map(|k| {
                let Some(tile) = k else { return Ok(vec![]) };
                let value = |s: &Expr| {
                    let no = || format!("{} reads {s}, which is not a size symbol of the program", tile.name);
                    bindings.get(s).copied().ok_or_else(no)
                };
                tile.sizes.iter().map(value).collect()
            })
            .collect::<std::result::Result<Vec<Vec<i64>>, String>>()?;
        let arena = schedule.memory.arena(&slot_bytes);
        let mut scratch = vec![(0, 0); program.nodes.len()];
        for (k, kernel) in schedule.kernels.iter().enumerate().filter(|(_, k)| k.kind == KernelKind::Extern) {
            let free = schedule.memory.free_range(&arena, &slot_bytes, k);
            for &n in &kernel.nodes {
                scratch[n] = free;
            }
        }
        let sizes = bindings.values().copied().collect();
        Ok(Instance { program, schedule, storage, arena, sizes, kernel_sizes, scratch })
    }
}

/// Most instances of one graph kept at once; past it the cache starts over (each instance is
/// a copy of the program, so unbounded growth would follow every new size forever).
const MAX_INSTANCES: usize = 256;

/// A compiled graph's instances, shared by the CPU and CUDA backends. A static program has one,
/// made at construction, and a run costs one shape comparison per input; a program with size
/// symbols gets one per set of symbol values met, made on first use and cached.
///
/// The graph's `program`, `schedule` and `kernels` (one per schedule kernel, `None` for extern
/// ones) are not held here: every call passes the same ones.
#[derive(Debug)]
pub(crate) struct Instances {
    /// The launches, in order (the same at every size).
    pub steps: Vec<Step>,
    /// The instance of a static program.
    fixed: Option<Arc<Instance>>,
    /// A dynamic program's instances, by the values of its symbols.
    by_sizes: Mutex<HashMap<Vec<i64>, Arc<Instance>>>,
}

impl Instances {
    /// Checks the pieces against each other before anything is compiled: at the program's
    /// own sizes, or at the symbols' hints (that instance is kept). The error says what is
    /// inconsistent.
    pub fn new(
        program: &LoopProgram,
        schedule: &Schedule,
        kernels: &[Option<TileKernel>],
    ) -> std::result::Result<Instances, String> {
        let hints = program.hints();
        let first = Instance::new(program, schedule, kernels, &hints)?;
        let checked = check_launches(&first.program, &first.schedule, kernels)?;
        let steps = checked
            .steps
            .iter()
            .map(|s| match s {
                Ok(tile) => Step::Kernel(
                    kernels
                        .iter()
                        .position(|k| k.as_ref().is_some_and(|k| std::ptr::eq(k, *tile)))
                        .expect("one of them"),
                ),
                Err(node) => Step::Extern(*node),
            })
            .collect();
        let first = Arc::new(first);
        let (fixed, by_sizes) = if program.symbols.is_empty() {
            (Some(first), HashMap::new())
        } else {
            (None, HashMap::from([(first.sizes.clone(), first)]))
        };
        Ok(Instances { steps, fixed, by_sizes: Mutex::new(by_sizes) })
    }

    /// The instance for inputs of these shapes: a shape error (naming the expected, possibly
    /// symbolic, shape) when they do not fit the program, or when a size symbol would be 0 or 1.
    pub fn get(
        &self,
        program: &LoopProgram,
        schedule: &Schedule,
        kernels: &[Option<TileKernel>],
        input_shapes: &[&[usize]],
    ) -> Result<Arc<Instance>> {
        if let Some(fixed) = &self.fixed {
            if input_shapes.len() != program.inputs.len() {
                let n = program.inputs.len();
                return Err(Error::value(format!("the compiled graph takes {n} inputs, got {}", input_shapes.len())));
            }
            for (k, (&id, &shape)) in program.inputs.iter().zip(input_shapes).enumerate() {
                let want = &program.buffer(id).meta;
                if want.shape != shape {
                    return Err(Error::shape(format!("input {k}: expected {want}, got shape {shape:?}")));
                }
            }
            return Ok(fixed.clone());
        }
        let bindings = program.bind(input_shapes).map_err(Error::shape)?;
        let sizes: Vec<i64> = bindings.values().copied().collect();
        if let Some(hit) = self.by_sizes.lock().unwrap_or_else(|e| e.into_inner()).get(&sizes) {
            return Ok(hit.clone());
        }
        // Made outside the lock: another thread may make the same one meanwhile (both agree).
        let instance = Instance::new(program, schedule, kernels, &bindings).map_err(|m| {
            let at: Vec<String> = bindings.iter().map(|(s, v)| format!("{s} = {v}")).collect();
            Error::runtime(format!("inconsistent compiled graph at {}: {m}", at.join(", ")))
        })?;
        let instance = Arc::new(instance);
        let mut cache = self.by_sizes.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= MAX_INSTANCES {
            cache.clear();
        }
        cache.insert(sizes, instance.clone());
        Ok(instance)
    }
}

/// The words a generated kernel takes for its random streams in a run with streams `random`:
/// key and first counter of each stream in [`TileKernel::random`] order (empty when it draws
/// none); an error naming the kernel when it draws from a stream the run does not give.
pub(crate) fn random_words(tile: &TileKernel, random: &[RandomState]) -> Result<Vec<u64>> {
    tile.random
        .iter()
        .map(|&s| {
            let state = random.get(s).ok_or_else(|| {
                let n = random.len();
                Error::value(format!("{} draws from random stream {s}, but the run has {n} random streams", tile.name))
            })?;
            Ok([state.seed, state.offset])
        })
        .collect::<Result<Vec<[u64; 2]>>>()
        .map(|w| w.concat())
}

/// Streams for runs whose numbers do not matter (timing): `n` streams of key 0 from counter 0.
pub(crate) fn timing_streams(n: usize) -> Vec<RandomState> {
    vec![RandomState::default(); n]
}

/// The median of some timings (sorted in place; 0 for none).
pub(crate) fn median(times: &mut [f64]) -> f64 {
    times.sort_by(|a, b| a.total_cmp(b));
    times.get(times.len() / 2).copied().unwrap_or(0.0)
}

/// The schedule's name of the kernel holding extern node `node` (its launch in profiles).
pub(crate) fn extern_name(schedule: &Schedule, node: usize) -> String {
    let kernel = schedule.kernels.iter().find(|k| k.nodes.contains(&node));
    kernel.map_or_else(|| format!("extern node {node}"), |k| k.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_graphs::{buffer, fused, pointwise, tile};
    use coil_ir::kernel::{InOutput, MemoryPlan};
    use coil_ir::loops::LoopNode;
    use coil_ir::{BinaryOp, Op, ReduceOp};

    /// `buf1 = arg0 + arg0` (a temporary), `buf4 = scatter_add(buf1, arg2, arg3)` (the output),
    /// with `buf1` kept in `buf4` by the memory plan.
    fn scatter_program(in_output: InOutput) -> (LoopProgram, Schedule, Vec<Option<TileKernel>>) {
        let f = DType::F32;
        let scatter = LoopNode {
            output: BufferId(4),
            origins: vec!["scatter_add"],
            kind: LoopKind::Extern {
                call: ExternCall::Fallback { op: Op::Scatter { dim: 0, reduce: Some(ReduceOp::Sum) } },
                inputs: vec![BufferId(1), BufferId(2), BufferId(3)],
            },
        };
        let program = LoopProgram {
            symbols: vec![],
            data_checks: vec![],
            buffers: vec![
                buffer("arg0", &[5, 4], f),
                buffer("buf1", &[5, 4], f),
                buffer("arg2", &[5, 4], DType::I64),
                buffer("arg3", &[5, 4], f),
                buffer("buf4", &[5, 4], f),
            ],
            inputs: vec![BufferId(0), BufferId(2), BufferId(3)],
            outputs: vec![BufferId(4)],
            nodes: vec![pointwise(1, 20, &[0, 0], BinaryOp::Add, f), scatter],
        };
        let schedule = Schedule {
            kernels: vec![
                fused("poi_fused_add_0", KernelKind::Pointwise, 0, 20, &[1]),
                fused("ext_fallback_scatter_add_1", KernelKind::Extern, 1, 20, &[4]),
            ],
            refusals: vec![],
            memory: MemoryPlan { slot_of: vec![None; 5], in_outputs: vec![in_output], ..Default::default() },
        };
        let tiles =
            vec![Some(tile("poi_fused_add_0", 20, &[("in_ptr0", 0, f, false), ("out_ptr0", 1, f, true)])), None];
        (program, schedule, tiles)
    }

    #[test]
    fn a_scatter_base_kept_in_its_output_shares_its_memory_and_nothing_else_may() {
        let base = InOutput { temporary: BufferId(1), output: BufferId(4) };
        let (p, s, tiles) = scatter_program(base);
        let checked = check_launches(&p, &s, &tiles).unwrap();
        assert_eq!(checked.storage[1], Storage::InOutput(BufferId(4)));
        assert!(checked.slot_bytes.is_empty(), "no slot: {:?}", checked.slot_bytes);
        // An output that is not a fresh buffer (here: donated) cannot hold it: a slot of its own.
        let (p, mut s, tiles) = scatter_program(base);
        s.memory.donated = vec![coil_ir::kernel::Donation { output: 0, input: 0 }];
        let checked = check_launches(&p, &s, &tiles).unwrap();
        assert_eq!(checked.storage[1], Storage::Slot(0));
        // A plan that puts the scatter's source in its output is refused before any launch.
        let (mut p, s, tiles) = scatter_program(InOutput { temporary: BufferId(1), output: BufferId(4) });
        let LoopKind::Extern { inputs, .. } = &mut p.nodes[1].kind else { unreachable!() };
        inputs.swap(0, 2); // buf1 (in the output's memory) is now the source
        let e = check_launches(&p, &s, &tiles).err().unwrap();
        assert!(e.contains("shares memory with an operand"), "{e}");
    }
}
