//! The fusion scheduler: loop nodes grouped into kernels (see `docs/compiler.md`, "Scheduler").
//!
//! Greedy and deterministic, as Inductor's: each round lists the candidate pairs of groups
//! (groups that share data: one writes a buffer the other reads, or both read one buffer),
//! scores each by the bytes of the buffers they share, and tries them best first (ties by node
//! order), fusing every legal pair; rounds repeat until one fuses nothing. A pair is legal when
//!
//! * neither is extern ("extern call");
//! * their signatures `(xnumel, rnumel)` agree, or a pointwise group of `x * r` or `x`
//!   elements joins rows `(x, r)` unless it scatters ("iteration spaces differ");
//! * the kernel stays within [`MAX_KERNEL_NODES`] ("too large");
//! * a reduction of one row (`xnumel` 1) reads at most [`ONE_ROW_MAX_READS`] buffers ("one-row
//!   reduction reads too many buffers": it runs in one block);
//! * every buffer written in the kernel and read in it is read, in the kernel's
//!   `(xindex, rindex)` space, at exactly the index it was written; never through an indirect
//!   (data-dependent) or masked load ("index mismatch");
//! * no path leaves the pair and comes back ("would create cycle").
//!
//! When no such pair fuses any more, groups that read only the program's inputs join other such
//! groups of the same signature (`Scheduler::fuse_independent`), and rounds start again.
//!
//! Every refused pair is recorded (in node order) with the reason it was last refused for,
//! unless the two nodes ended up in one kernel after all. Nodes without elements are in no kernel: there is
//! nothing to compute, and their (empty) buffers need no writer; but a fallback call without
//! elements runs (an indexing op checking its indices, see `lower`).
//!
//! Kernels launch in topological order: among the ready kernels, the first (by first node) that
//! frees at least the bytes it stores, else the one with the first node; names are
//! `<poi|per|red>_fused_<origins>_<launch index>` or `ext_bmm_<i>` / `ext_attention_<i>` /
//! `ext_attention_backward_<i>` / `ext_fallback_<op>_<i>`. An extern node may write several
//! buffers (the attention templates'): each is its kernel's store.

mod donate;
mod legal;
mod memory;
mod print;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_memory;

pub use donate::donate;
pub(crate) use legal::delinearize;
pub use legal::kernel_index_map;
pub use print::print_schedule;

use coil_ir::kernel::{FusedKernel, FusionRefusal, KernelKind, Schedule};
use coil_ir::loops::{BufferId, ExternCall, LoopKind, LoopProgram};
use coil_ir::sym::Expr;
use indexmap::IndexMap;
use legal::Sig;
use std::collections::{BTreeMap, HashMap};

/// Most loop nodes one kernel may hold.
pub const MAX_KERNEL_NODES: usize = 64;

/// Most buffers (of more than one element) a reduction kernel of one row may read: it runs in
/// one block, so it takes a norm's consumers (layer norm's weight and bias, a residual) but not
/// elementwise work over many buffers.
pub const ONE_ROW_MAX_READS: usize = 8;

/// Rows up to this long stay on chip: a persistent reduction; longer rows loop. The default
/// ([`schedule`], the CPU's); a GPU keeps longer rows in registers (see [`ScheduleOptions`]).
pub const PERSISTENT_MAX_RNUMEL: i64 = 1024;

/// Knobs of [`schedule_with`] that depend on the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleOptions {
    /// Reductions with rows up to this long become persistent reductions (the row is read
    /// once and held on chip for every pass), longer ones looped reductions (each pass reads
    /// the row again). The CPU keeps [`PERSISTENT_MAX_RNUMEL`]; a GPU block spreads a row over
    /// up to 1024 threads' registers, so it profits from a larger value (the frontend passes
    /// one for CUDA devices).
    pub persistent_max_rnumel: i64,
}

impl Default for ScheduleOptions {
    fn default() -> ScheduleOptions {
        ScheduleOptions { persistent_max_rnumel: PERSISTENT_MAX_RNUMEL }
    }
}

/// Fuses the nodes of `program` into kernels, in launch order, and plans their memory, with
/// the default options (the CPU's).
pub fn schedule(program: &LoopProgram) -> Schedule {
    schedule_with(program, &ScheduleOptions::default())
}

/// Most bytes a kernel of independent groups writes ([`Scheduler::fuse_independent`]): its
/// later members' results are computed early and live longer (an inference graph's weight
/// casts, all at the start, would hold every cast weight at once). Below it, launches of a few
/// megabytes run well under the memory's speed: GPT-2 124M's forward on an H200 casts its
/// weights in 12 kernels of 14 MiB at 2.7 TB/s under a 16 MiB cap, in 4 of 56 MiB under this
/// one (forward 4.80 -> 4.69 ms, the training step's peak memory 6971 -> 6906 MB).
const INDEPENDENT_STORE_BYTES: usize = 64 << 20;

/// Most bytes a *small* group (the second stages of split sums: a backward graph's bias
/// gradients, a gradient norm's per-parameter sums) may read from other kernels to join others
/// of its signature and readers ([`Scheduler::fuse_independent`]): joining moves it to after the
/// last of their producers, so the buffers it reads live longer; a few partial sums may, an
/// activation may not.
const SINK_READ_BYTES: usize = 1 << 20;

/// Most buffers a kernel of joined small groups reads: a few launches for a deep network's many
/// second stages, and no kernel that reads more buffers as the network deepens.
const SINK_MAX_READS: usize = 8;

/// Most origins a kernel name lists.
const NAME_ORIGINS: usize = 5;

/// Fuses the nodes of `program` into kernels, in launch order, and plans their memory.
/// Fusion does not depend on `options`; only the kinds of the reduction kernels do.
pub fn schedule_with(program: &LoopProgram, options: &ScheduleOptions) -> Schedule {
    let mut s = Scheduler::new(program, *options);
    s.fuse();
    let kernels = s.kernels();
    let refusals = s.refusals(&kernels);
    let memory = memory::plan(program, &kernels);
    Schedule { kernels, refusals, memory }
}

/// The fixed facts about the program the scheduler consults.
struct Deps {
    /// The node writing each buffer (`None` for inputs and buffers of empty nodes).
    producer: Vec<Option<usize>>,
    /// The nodes reading each buffer, in node order, each once.
    readers: Vec<Vec<usize>>,
    /// Each node's signature; `None` for empty nodes (scheduled nowhere).
    sig: Vec<Option<Sig>>,
}

impl Deps {
    fn new(p: &LoopProgram) -> Deps {
        let mut producer = vec![None; p.buffers.len()];
        let mut readers = vec![Vec::new(); p.buffers.len()];
        let mut sig = Vec::with_capacity(p.nodes.len());
        for (i, n) in p.nodes.iter().enumerate() {
            // A fallback call with no elements to write still checks its indices.
            let checks = matches!(n.kind, LoopKind::Extern { call: ExternCall::Fallback { .. }, .. });
            let empty = p.buffer(n.output).meta.numel() == 0 && !checks;
            sig.push((!empty).then(|| Sig::of(n)));
            if empty {
                continue;
            }
            for b in n.writes() {
                producer[b.0] = Some(i);
            }
            for b in n.reads() {
                if readers[b.0].last() != Some(&i) {
                    readers[b.0].push(i);
                }
            }
        }
        Deps { producer, readers, sig }
    }
}

/// A candidate pair: the groups of `first` and `second` (nodes that share `bytes` of data),
/// named in refusals by those nodes' buffers.
struct Candidate {
    first: usize,
    second: usize,
    bytes: usize,
}

/// What two groups share: the node pair that names them (preferring a producer-consumer edge,
/// marked `true`) and the shared buffers.
type PairData = ((usize, usize, bool), Vec<BufferId>);

struct Scheduler<'p> {
    p: &'p LoopProgram,
    deps: Deps,
    /// Each node's group, named by its first node.
    group: Vec<usize>,
    /// The nodes of each group (indexed by group name; empty once merged away), sorted.
    members: Vec<Vec<usize>>,
    gsig: Vec<Option<Sig>>,
    /// Refusals by `(first, second)` node pair, with the latest reason.
    refused: IndexMap<(usize, usize), &'static str>,
    /// Index maps by node and kernel signature (rebuilding them dominates legality checks).
    maps: HashMap<(usize, Sig), IndexMap<Expr, Expr>>,
    options: ScheduleOptions,
}

impl<'p> Scheduler<'p> {
    fn new(p: &'p LoopProgram, options: ScheduleOptions) -> Scheduler<'p> {
        let deps = Deps::new(p);
        let n = p.nodes.len();
        let gsig = deps.sig.clone();
        Scheduler {
            p,
            deps,
            group: (0..n).collect(),
            members: (0..n).map(|i| vec![i]).collect(),
            gsig,
            refused: IndexMap::new(),
            options,
            maps: HashMap::new(),
        }
    }

    fn bytes(&self, b: BufferId) -> usize {
        self.p.buffer(b).meta.nbytes()
    }

    /// Candidate pairs of the current groups, best first.
    fn candidates(&self) -> Vec<Candidate> {
        // By group pair: (first node pair seen, preferring a producer edge; shared buffers).
        let mut pairs: BTreeMap<(usize, usize), PairData> = BTreeMap::new();
        let mut add = |a: usize, b: usize, buf: BufferId, vertical: bool| {
            let (ga, gb) = (self.group[a], self.group[b]);
            if ga == gb {
                return;
            }
            let key = (ga.min(gb), ga.max(gb));
            let (a, b) = if ga < gb { (a, b) } else { (b, a) };
            let entry = pairs.entry(key).or_insert(((a, b, vertical), Vec::new()));
            if vertical && !entry.0 .2 {
                entry.0 = (a, b, true);
            }
            if !entry.1.contains(&buf) {
                entry.1.push(buf);
            }
        };
        for (b, readers) in self.deps.readers.iter().enumerate() {
            let buf = BufferId(b);
            let live: Vec<usize> = readers.iter().copied().filter(|&r| self.deps.sig[r].is_some()).collect();
            if let Some(p) = self.deps.producer[b] {
                for &r in &live {
                    add(p, r, buf, true);
                }
            }
            for (i, &r) in live.iter().enumerate() {
                for &s in &live[i + 1..] {
                    add(r, s, buf, false);
                }
            }
        }
        let mut out: Vec<(Candidate, (usize, usize))> = pairs
            .into_iter()
            .map(|(key, ((first, second, _), bufs))| {
                (Candidate { first, second, bytes: bufs.iter().map(|&b| self.bytes(b)).sum() }, key)
            })
            .collect();
        out.sort_by(|(a, ka), (b, kb)| b.bytes.cmp(&a.bytes).then(ka.cmp(kb)));
        out.into_iter().map(|(c, _)| c).collect()
    }

    /// Greedy rounds until one fuses nothing, then the independent groups of one signature
    /// ([`Scheduler::fuse_independent`]), then rounds again if that fused any.
    fn fuse(&mut self) {
        loop {
            self.fuse_sharing();
            if !self.fuse_independent() {
                break;
            }
        }
    }

    /// Greedy rounds over the groups that share data until one fuses nothing.
    fn fuse_sharing(&mut self) {
        loop {
            let mut fused = false;
            for c in self.candidates() {
                let (a, b) = (self.group[c.first], self.group[c.second]);
                if a == b {
                    continue;
                }
                match self.legal(a, b) {
                    Ok(sig) => {
                        self.merge(a, b, sig);
                        fused = true;
                    }
                    Err(reason) => {
                        self.refused.insert((c.first, c.second), reason);
                    }
                }
            }
            if !fused {
                break;
            }
        }
    }

    /// Groups that read nothing computed in the program (a parameter's cast, a gradient's sum
    /// of squares) may run at any point before their readers, so any two of one signature run
    /// as one kernel: one launch instead of two, the same bytes (Inductor's combo kernels, for
    /// equal sizes). So may small groups ([`SINK_READ_BYTES`]) read by the same kernels, or by
    /// none: the second stages of a backward graph's bias and norm-weight gradients, which
    /// nothing waits for, or of a gradient norm's per-parameter sums, which one kernel adds up;
    /// a few microseconds of launch each for a few kilobytes, and no reader waits longer than
    /// it did for the later of the two. In node order, each joins the open kernel of its
    /// signature (and readers) while that stores at most [`INDEPENDENT_STORE_BYTES`] (and no
    /// path joins them: `legal`), else opens the next. Whether any fused.
    fn fuse_independent(&mut self) -> bool {
        // By signature and kind: input-only groups join input-only ones (they may run
        // early), small groups join small groups with the same readers (they may run late).
        let mut open: IndexMap<(Sig, Option<Vec<usize>>), usize> = IndexMap::new();
        let mut fused = false;
        for g in 0..self.members.len() {
            let Some(sig) = self.gsig[g].filter(|&s| s != Sig::Extern) else { continue };
            let key = match (self.reads_only_inputs(g), self.is_small(g)) {
                (true, _) => (sig, None),
                (false, true) => (sig, Some(self.readers(g))),
                (false, false) => continue,
            };
            let fits = |into: usize| {
                self.written_bytes(into) + self.written_bytes(g) <= INDEPENDENT_STORE_BYTES
                    && (key.1.is_none()
                        || (self.outside_reads(into, true).len() + self.outside_reads(g, true).len() <= SINK_MAX_READS
                            && key.1 == Some(self.readers(into))))
            };
            let into = match open.get(&key) {
                Some(&into) if fits(into) => into,
                _ => {
                    open.insert(key, g);
                    continue;
                }
            };
            match self.legal(into, g) {
                Ok(sig) => {
                    self.merge(into, g, sig);
                    fused = true;
                }
                Err(_) => {
                    open.insert(key, g);
                }
            }
        }
        fused
    }

    /// The bytes of every buffer group `g` writes.
    fn written_bytes(&self, g: usize) -> usize {
        self.members[g].iter().flat_map(|&n| self.p.nodes[n].writes()).map(|b| self.bytes(b)).sum()
    }

    /// Whether every buffer group `g` reads is a program input or written inside `g`.
    fn reads_only_inputs(&self, g: usize) -> bool {
        self.members[g]
            .iter()
            .flat_map(|&n| self.p.nodes[n].reads())
            .all(|b| self.deps.producer[b.0].is_none_or(|w| self.group[w] == g))
    }

    /// Whether group `g` reads at most [`SINK_READ_BYTES`] written by other groups.
    fn is_small(&self, g: usize) -> bool {
        self.outside_reads(g, false).iter().map(|&b| self.bytes(b)).sum::<usize>() <= SINK_READ_BYTES
    }

    /// The groups reading what `g` writes, ascending.
    fn readers(&self, g: usize) -> Vec<usize> {
        let mut out = self.successors(g);
        out.sort_unstable();
        out
    }

    /// The buffers group `g` reads that other groups write (and the program's inputs it reads
    /// with `inputs`), each once.
    fn outside_reads(&self, g: usize, inputs: bool) -> Vec<BufferId> {
        let mut read: Vec<BufferId> = self.members[g]
            .iter()
            .flat_map(|&n| self.p.nodes[n].reads())
            .filter(|b| self.deps.producer[b.0].map_or(inputs, |w| self.group[w] != g))
            .collect();
        read.sort_unstable();
        read.dedup();
        read
    }

    /// The signature of `a` and `b` fused, or why they cannot be.
    fn legal(&mut self, a: usize, b: usize) -> Result<Sig, &'static str> {
        let (sa, sb) = (self.gsig[a].expect("scheduled"), self.gsig[b].expect("scheduled"));
        if sa == Sig::Extern || sb == Sig::Extern {
            return Err("extern call");
        }
        let sig = sa.merge(sb).ok_or("iteration spaces differ")?;
        // A scatter's window is a pointwise kernel's (`TileStmt::Window`).
        let scatters = |g: usize| self.members[g].iter().any(|&n| self.p.nodes[n].scatter().is_some());
        if matches!(sig, Sig::Reduction(..)) && (scatters(a) || scatters(b)) {
            return Err("iteration spaces differ");
        }
        if self.members[a].len() + self.members[b].len() > MAX_KERNEL_NODES {
            return Err("too large");
        }
        if self.one_row_too_wide(a, b, sig) {
            return Err("one-row reduction reads too many buffers");
        }
        let mut union: Vec<usize> = self.members[a].iter().chain(&self.members[b]).copied().collect();
        union.sort_unstable();
        let (p, maps) = (self.p, &mut self.maps);
        let mut map = |n: usize| maps.entry((n, sig)).or_insert_with(|| legal::index_map(&p.nodes[n], sig)).clone();
        if !legal::reads_match(p, &union, &self.deps.producer, &mut map) {
            return Err("index mismatch");
        }
        if self.reaches_through_other(a, b) || self.reaches_through_other(b, a) {
            return Err("would create cycle");
        }
        Ok(sig)
    }

    /// Whether groups `a` and `b` fused as a reduction of one row (`sig` is `(1, r)`) would read
    /// more than [`ONE_ROW_MAX_READS`] buffers of more than one element (written outside the
    /// pair). Such a kernel runs in one block (one thread on the CPU): a layer norm or softmax
    /// of one row reads two to five, but elementwise work over many other buffers that merely
    /// reads the row's result (an optimizer step scaled by a gradient norm) would lose all
    /// parallelism and swell one kernel's body.
    fn one_row_too_wide(&self, a: usize, b: usize, sig: Sig) -> bool {
        if !matches!(sig, Sig::Reduction(x, _) if x == Expr::int(1)) {
            return false;
        }
        let inside = |r: &BufferId| self.deps.producer[r.0].is_some_and(|w| self.group[w] == a || self.group[w] == b);
        let mut reads: Vec<BufferId> = (self.members[a].iter().chain(&self.members[b]))
            .flat_map(|&n| self.p.nodes[n].reads())
            .filter(|r| !inside(r) && self.p.buffer(*r).meta.numel() > 1)
            .collect();
        reads.sort_unstable();
        reads.dedup();
        reads.len() > ONE_ROW_MAX_READS
    }

    /// The groups reading what `g` writes (other than `g`), in node order.
    fn successors(&self, g: usize) -> Vec<usize> {
        let mut out = Vec::new();
        for &n in &self.members[g] {
            for b in self.p.nodes[n].writes() {
                for &r in &self.deps.readers[b.0] {
                    let h = self.group[r];
                    if h != g && !out.contains(&h) {
                        out.push(h);
                    }
                }
            }
        }
        out
    }

    /// Whether a path from `from` to `to` passes through a third group (fusing the two would
    /// then put that group both before and after the fused kernel).
    fn reaches_through_other(&self, from: usize, to: usize) -> bool {
        let mut seen = vec![false; self.members.len()];
        let mut stack: Vec<usize> = self.successors(from).into_iter().filter(|&h| h != to).collect();
        while let Some(g) = stack.pop() {
            if g == to {
                return true;
            }
            if std::mem::replace(&mut seen[g], true) {
                continue;
            }
            stack.extend(self.successors(g).into_iter().filter(|&h| !seen[h]));
        }
        false
    }

    fn merge(&mut self, a: usize, b: usize, sig: Sig) {
        let (keep, gone) = (a.min(b), a.max(b));
        let moved = std::mem::take(&mut self.members[gone]);
        for &n in &moved {
            self.group[n] = keep;
        }
        self.members[keep].extend(moved);
        self.members[keep].sort_unstable();
        self.gsig[keep] = Some(sig);
        self.gsig[gone] = None;
    }

    /// The groups as kernels, in launch order.
    fn kernels(&self) -> Vec<FusedKernel> {
        let groups: Vec<usize> =
            (0..self.members.len()).filter(|&g| self.gsig[g].is_some() && !self.members[g].is_empty()).collect();
        let mut preds: BTreeMap<usize, usize> = groups.iter().map(|&g| (g, 0)).collect();
        for &g in &groups {
            for h in self.successors(g) {
                *preds.get_mut(&h).expect("a successor is scheduled") += 1;
            }
        }
        let mut order = Vec::with_capacity(groups.len());
        let mut done = vec![false; self.members.len()];
        // A ready kernel that frees at least the bytes it stores goes first (the last reader of
        // a temporary: a weight gradient reading an activation frees it before the rest of the
        // backward pass allocates more); otherwise the ready kernel with the first node.
        loop {
            let ready: Vec<usize> = preds.iter().filter(|(_, &n)| n == 0).map(|(&g, _)| g).collect();
            let Some(g) = ready.iter().copied().find(|&g| self.net_freed(g, &done) >= 0).or(ready.first().copied())
            else {
                break;
            };
            preds.remove(&g);
            done[g] = true;
            for h in self.successors(g) {
                *preds.get_mut(&h).expect("successors launch later") -= 1;
            }
            order.push(g);
        }
        assert!(preds.is_empty(), "the fused kernels form a cycle");
        let kernel_of = |n: usize| order.iter().position(|&g| g == self.group[n]);
        order.iter().enumerate().map(|(i, &g)| self.kernel(i, g, &kernel_of)).collect()
    }

    /// Bytes group `g` frees (temporaries it reads last, every other reader `done`) minus the
    /// bytes it stores (buffers read outside it, and program outputs).
    fn net_freed(&self, g: usize, done: &[bool]) -> i64 {
        let outputs = &self.p.outputs;
        let mut seen: Vec<BufferId> = Vec::new();
        let mut net = 0i64;
        for &n in &self.members[g] {
            for b in self.p.nodes[n].reads() {
                let temporary = self.deps.producer[b.0].is_some_and(|w| self.group[w] != g) && !outputs.contains(&b);
                if temporary && !seen.contains(&b) {
                    seen.push(b);
                    if self.deps.readers[b.0].iter().all(|&r| self.group[r] == g || done[self.group[r]]) {
                        net += self.bytes(b) as i64;
                    }
                }
            }
            for b in self.p.nodes[n].writes() {
                if outputs.contains(&b) || self.deps.readers[b.0].iter().any(|&r| self.group[r] != g) {
                    net -= self.bytes(b) as i64;
                }
            }
        }
        net
    }

    fn kernel(&self, index: usize, g: usize, kernel_of: &dyn Fn(usize) -> Option<usize>) -> FusedKernel {
        let nodes = self.members[g].clone();
        let sig = self.gsig[g].expect("scheduled");
        let program_outputs = &self.p.outputs;
        let stores = nodes
            .iter()
            .flat_map(|&n| self.p.nodes[n].writes())
            .filter(|b| {
                // A buffer nobody reads is computed for its checks (bounds, divisions by zero;
                // see `lower`): stored, so that its computation is not dropped as dead.
                sig == Sig::Extern
                    || program_outputs.contains(b)
                    || self.deps.readers[b.0].is_empty()
                    || self.deps.readers[b.0].iter().any(|&r| kernel_of(r) != Some(index))
            })
            .collect();
        let (kind, xnumel, rnumel) = match sig {
            Sig::Extern => (KernelKind::Extern, self.p.buffer(self.p.nodes[nodes[0]].output).numel(), None),
            Sig::Pointwise(n) => (KernelKind::Pointwise, n, None),
            // A row held in registers needs a static length.
            Sig::Reduction(x, r) if r.const_value().is_some_and(|r| r <= self.options.persistent_max_rnumel) => {
                (KernelKind::PersistentReduction, x, Some(r))
            }
            Sig::Reduction(x, r) => (KernelKind::LoopedReduction, x, Some(r)),
        };
        let name = match &self.p.nodes[nodes[0]].kind {
            LoopKind::Extern { call: ExternCall::Bmm { .. }, .. } => format!("ext_bmm_{index}"),
            LoopKind::Extern { call: ExternCall::Attention(_), .. } => format!("ext_attention_{index}"),
            LoopKind::Extern { call: ExternCall::AttentionBackward(_), .. } => {
                format!("ext_attention_backward_{index}")
            }
            LoopKind::Extern { call: ExternCall::Fallback { op }, .. } => format!("ext_fallback_{}_{index}", op.name()),
            LoopKind::Extern { call: ExternCall::Conv(call), .. } => format!("ext_{}_{index}", call.form.name()),
            _ => {
                let mut origins: Vec<&str> =
                    nodes.iter().flat_map(|&n| self.p.nodes[n].origins.iter().copied()).collect();
                origins.sort_unstable();
                origins.dedup();
                origins.truncate(NAME_ORIGINS);
                format!("{}_fused_{}_{index}", kind.prefix(), origins.join("_"))
            }
        };
        FusedKernel { name, kind, nodes, xnumel, rnumel, stores }
    }

    /// The recorded refusals whose nodes stayed apart, in node order.
    fn refusals(&self, kernels: &[FusedKernel]) -> Vec<FusionRefusal> {
        let name = |n: usize| self.p.buffer(self.p.nodes[n].output).name.clone();
        let together = |a: usize, b: usize| kernels.iter().any(|k| k.nodes.contains(&a) && k.nodes.contains(&b));
        let mut pairs: Vec<(&(usize, usize), &&str)> =
            self.refused.iter().filter(|(&(a, b), _)| !together(a, b)).collect();
        pairs.sort_by_key(|(&pair, _)| pair);
        pairs
            .into_iter()
            .map(|(&(a, b), &reason)| FusionRefusal {
                producer: name(a),
                consumer: name(b),
                reason: reason.to_string(),
            })
            .collect()
    }
}
