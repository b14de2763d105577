//! Kernels: the scheduler's output ([`Schedule`]) and the block-level, Triton-style kernel IR
//! ([`TileKernel`]) that every backend consumes.
//!
//! A [`FusedKernel`] names the loop nodes ([`crate::loops::LoopNode`]) that run together. The
//! kernel builder turns it into a [`TileKernel`]: a program over blocks of indices, as in Triton.
//! Every index expression in a tile kernel is over two symbols, `xindex` (`0 <= xindex < xnumel`,
//! the output element or row) and `rindex` (`0 <= rindex < rnumel`, the position along the
//! reduction), see [`xindex`] and [`rindex`]. A value has one of two block shapes ([`Dims`]):
//! `[XBLOCK, 1]` or `[XBLOCK, RBLOCK]`. Lanes past `xnumel` / `rnumel` are masked: backends
//! never load, store or reduce them.
//!
//! Reductions come in two forms:
//! * **persistent** (the whole row fits in one block): statements of shape `XR` appear directly
//!   in the body, and [`TileStmt::Reduce`] reduces a block value along `r`;
//! * **looped**: each pass over the row is a [`TileStmt::RLoop`] whose `XR` statements see
//!   `RBLOCK` elements at a time and fold them into accumulators ([`TileStmt::AccUpdate`]);
//!   after the loop, [`TileStmt::Reduce`] finishes the accumulator. A `Max` reduction and a `Sum`
//!   of `exp(x - max)` over the same values share one pass ("online softmax":
//!   [`TileStmt::AccUpdateOnlineSoftmax`], finished by [`TileStmt::ReduceOnlineSoftmax`]).
//!
//! The printer renders Triton-like text: the `.tile` files of the debug dump, which
//! [`TileKernel::parse`] reads back ([`crate::parse`] describes the text).

use crate::dtype::{DType, Scalar};
use crate::loops::BufferId;
use crate::op::{BinaryOp, RandDist, ReduceOp, UnaryOp};
use crate::philox;
use crate::sym::Expr;
use std::fmt::{self, Write};

/// What kind of kernel a group of nodes becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// Elementwise over `xnumel` elements.
    Pointwise,
    /// Rows of `rnumel` elements, each held on chip: one read, any number of reductions.
    PersistentReduction,
    /// Rows too long to hold: passes over the row with accumulators.
    LoopedReduction,
    /// A library call (matrix product) or a fallback op; no generated code.
    Extern,
}

impl KernelKind {
    /// The prefix of kernel names: `poi`, `per`, `red`, `ext`.
    pub fn prefix(self) -> &'static str {
        match self {
            KernelKind::Pointwise => "poi",
            KernelKind::PersistentReduction => "per",
            KernelKind::LoopedReduction => "red",
            KernelKind::Extern => "ext",
        }
    }

    /// The kind's name in dumps (`pointwise`, `persistent_reduction`, ...).
    pub fn name(self) -> &'static str {
        match self {
            KernelKind::Pointwise => "pointwise",
            KernelKind::PersistentReduction => "persistent_reduction",
            KernelKind::LoopedReduction => "looped_reduction",
            KernelKind::Extern => "extern",
        }
    }
}

/// A group of loop nodes that runs as one kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedKernel {
    /// `poi_fused_add_gelu_0`: kind prefix, the ops it holds, and its launch position.
    pub name: String,
    /// Pointwise, reduction (persistent or looped) or extern call.
    pub kind: KernelKind,
    /// Indices into `LoopProgram::nodes`, in execution order.
    pub nodes: Vec<usize>,
    /// Output elements (pointwise) or rows (reductions).
    pub xnumel: Expr,
    /// Row length, for reductions.
    pub rnumel: Option<Expr>,
    /// Buffers the kernel writes to memory: graph outputs and buffers read by later kernels.
    /// The other node outputs never leave registers.
    pub stores: Vec<BufferId>,
}

/// Why two nodes were not fused; `ir_post_fusion.txt` lists every one.
#[derive(Clone, Debug, PartialEq)]
pub struct FusionRefusal {
    /// Names of the two buffers (or kernels) that stayed apart.
    pub producer: String,
    /// The one that would have fused into the producer.
    pub consumer: String,
    /// Why they were not fused.
    pub reason: String,
}

/// Storage for the temporary buffers: buffers whose lives do not overlap share a slot, and
/// slots whose lives do not overlap share addresses in one allocation ([`MemoryPlan::arena`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryPlan {
    /// Size in bytes of each storage slot.
    pub slots: Vec<usize>,
    /// The launches each slot is in use for, `(first, last)` inclusive: from the kernel that
    /// writes its first occupant to the last kernel that reads its last one.
    pub slot_lives: Vec<(usize, usize)>,
    /// The slot of each buffer of the program (`None` for inputs, outputs, and buffers that
    /// never reach memory).
    pub slot_of: Vec<Option<usize>>,
    /// The most bytes alive at once: outputs and temporaries (inputs excluded).
    pub peak_bytes: usize,
    /// Outputs written into the buffer of a graph input that the caller donated
    /// (`coil_passes::donate`): the run writes the new value over the input's elements and
    /// hands that buffer back as the output.
    pub donated: Vec<Donation>,
    /// Donations the caller asked for and the plan refused, each with its reason (the output
    /// then gets a fresh buffer, and the dump says why).
    pub declined: Vec<(Donation, String)>,
    /// Temporaries kept in a graph output's memory instead of a slot: each the base of the
    /// scatter that writes that output, dying there, so the scatter runs in place.
    pub in_outputs: Vec<InOutput>,
}

/// A temporary stored in the memory of a graph output: the base of the extern scatter that
/// writes the output, read by nothing after it. Its producer writes the output's buffer, and
/// the scatter writes its elements over it (combined with what is there, for a
/// `scatter_add`), so the base is never copied. Outputs are allocated before the run's first
/// launch, so the buffer is there when the base's producer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InOutput {
    /// The temporary: the scatter's base.
    pub temporary: BufferId,
    /// The graph output the scatter writes.
    pub output: BufferId,
}

/// A graph output written in place over a graph input's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Donation {
    /// Position in the graph's outputs.
    pub output: usize,
    /// Position in the graph's inputs.
    pub input: usize,
}

/// Where the slots of a memory plan sit in one allocation ([`MemoryPlan::arena`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Arena {
    /// Byte offset of each slot, a multiple of [`Arena::ALIGN`].
    pub offsets: Vec<usize>,
    /// The allocation's size.
    pub bytes: usize,
}

impl Arena {
    /// Alignment of every slot's offset (the device allocator's own alignment, so a library
    /// call sees the same alignment in a slot as in an allocation of its own).
    pub const ALIGN: usize = 256;
}

impl MemoryPlan {
    /// Places slots of `slot_bytes` bytes (the plan's slots, resized for one run's sizes, then
    /// any extra ones, which are taken to be in use throughout) in one allocation: two slots
    /// share addresses only when no launch uses both. Greedy by size (largest first, each at
    /// the lowest offset clear of the slots already placed that it overlaps in time, ties by
    /// first use and number), so the result is deterministic and close to the most bytes in
    /// use at once.
    ///
    /// ```
    /// use coil_ir::kernel::{Arena, MemoryPlan};
    /// let plan = MemoryPlan { slots: vec![1000, 3000, 500], slot_lives: vec![(0, 1), (2, 3), (1, 2)], ..Default::default() };
    /// let arena = plan.arena(&plan.slots);
    /// // Slots 0 and 1 are never in use together: they start at the same address.
    /// assert_eq!(arena.offsets, vec![0, 0, 3072]);
    /// assert_eq!(arena.bytes, 3584);
    /// assert!(arena.offsets.iter().all(|o| o % Arena::ALIGN == 0));
    /// ```
    pub fn arena(&self, slot_bytes: &[usize]) -> Arena {
        let live = |s: usize| self.slot_lives.get(s).copied().unwrap_or((0, usize::MAX));
        let size = |s: usize| slot_bytes[s].next_multiple_of(Arena::ALIGN);
        let mut order: Vec<usize> = (0..slot_bytes.len()).collect();
        order.sort_by_key(|&s| (std::cmp::Reverse(size(s)), live(s).0, s));
        let mut offsets = vec![0; slot_bytes.len()];
        let mut placed: Vec<usize> = Vec::with_capacity(order.len());
        let mut bytes = 0;
        for s in order {
            let (first, last) = live(s);
            let mut taken: Vec<(usize, usize)> = (placed.iter())
                .filter(|&&t| live(t).0 <= last && first <= live(t).1)
                .map(|&t| (offsets[t], offsets[t] + size(t)))
                .collect();
            taken.sort_unstable();
            let mut at = 0;
            for (start, end) in taken {
                if at + size(s) <= start {
                    break;
                }
                at = at.max(end);
            }
            offsets[s] = at;
            bytes = bytes.max(at + size(s));
            placed.push(s);
        }
        Arena { offsets, bytes }
    }

    /// The largest range of `arena` (placed for `slot_bytes` by [`MemoryPlan::arena`]) that no
    /// slot in use at `launch` covers, as `(offset, bytes)`: memory a library call of that
    /// launch may use as its scratch workspace (a cuDNN convolution's) instead of an
    /// allocation of its own on top of the arena. The launch's own operands and result are in
    /// use at it, so never in the range.
    ///
    /// ```
    /// use coil_ir::kernel::MemoryPlan;
    /// let plan = MemoryPlan { slots: vec![1024, 4096, 512], slot_lives: vec![(0, 1), (2, 3), (1, 2)], ..Default::default() };
    /// let arena = plan.arena(&plan.slots);
    /// assert_eq!((arena.offsets.clone(), arena.bytes), (vec![0, 0, 4096], 4608));
    /// // At launch 0 only slot 0 is in use; at launch 2, slots 1 and 2 (the arena is full).
    /// assert_eq!(plan.free_range(&arena, &plan.slots, 0), (1024, 3584));
    /// assert_eq!(plan.free_range(&arena, &plan.slots, 2).1, 0);
    /// ```
    pub fn free_range(&self, arena: &Arena, slot_bytes: &[usize], launch: usize) -> (usize, usize) {
        let live = |s: usize| self.slot_lives.get(s).copied().unwrap_or((0, usize::MAX));
        let mut taken: Vec<(usize, usize)> = (0..slot_bytes.len())
            .filter(|&s| live(s).0 <= launch && launch <= live(s).1 && slot_bytes[s] > 0)
            .map(|s| (arena.offsets[s], arena.offsets[s] + slot_bytes[s].next_multiple_of(Arena::ALIGN)))
            .collect();
        taken.sort_unstable();
        let (mut best, mut at) = ((0, 0), 0);
        for (start, end) in taken.into_iter().chain([(arena.bytes, arena.bytes)]) {
            if start > at && start - at > best.1 {
                best = (at, start - at);
            }
            at = at.max(end);
        }
        best
    }

    /// The graph input whose buffer output `output` (a position in the outputs) is written
    /// into, if it was donated.
    pub fn donor_of(&self, output: usize) -> Option<usize> {
        self.donated.iter().find(|d| d.output == output).map(|d| d.input)
    }

    /// Whether buffers `a` and `b` share memory by the plan: one slot, or `a` kept in output
    /// `b` ([`MemoryPlan::in_outputs`]). (Donated inputs are not buffers' memory here.)
    pub fn shares_memory(&self, a: BufferId, b: BufferId) -> bool {
        let slot = |x: BufferId| self.slot_of.get(x.0).copied().flatten();
        (slot(a).is_some() && slot(a) == slot(b))
            || self.in_outputs.iter().any(|x| (x.temporary, x.output) == (a, b) || (x.temporary, x.output) == (b, a))
    }
}

/// The scheduler's result: kernels in launch order, the refused fusions, the memory plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schedule {
    /// The kernels, in launch order.
    pub kernels: Vec<FusedKernel>,
    /// Every fusion the scheduler considered and refused.
    pub refusals: Vec<FusionRefusal>,
    /// Where the temporary buffers live.
    pub memory: MemoryPlan,
}

impl Schedule {
    /// The schedule of `program.instantiate(bindings)` (`program` being the instantiated one):
    /// kernel extents at `bindings`, memory slots as large as their largest buffer there.
    pub fn instantiate(&self, program: &crate::loops::LoopProgram, bindings: &crate::loops::Bindings) -> Schedule {
        let at = |e: Expr| e.substitute_with(|s| bindings.get(&s).map(|&v| Expr::int(v)));
        let mut s = self.clone();
        for k in &mut s.kernels {
            k.xnumel = at(k.xnumel);
            k.rnumel = k.rnumel.map(at);
        }
        let mut slots = vec![0usize; s.memory.slots.len()];
        for (b, slot) in s.memory.slot_of.iter().enumerate() {
            if let (Some(slot), Some(buf)) = (slot, program.buffers.get(b)) {
                slots[*slot] = slots[*slot].max(buf.meta.nbytes());
            }
        }
        s.memory.slots = slots;
        s
    }
}

/// The symbol for the block's output index, `0 <= xindex < xnumel`.
pub fn xindex(xnumel: &Expr) -> Expr {
    Expr::index_upto("xindex", *xnumel)
}

/// The symbol for the position along the reduction, `0 <= rindex < rnumel`.
pub fn rindex(rnumel: &Expr) -> Expr {
    Expr::index_upto("rindex", *rnumel)
}

/// Block shape of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dims {
    /// `[XBLOCK, 1]`: one value per output element or row.
    X,
    /// `[XBLOCK, RBLOCK]`: one value per element of the rows.
    XR,
}

/// A kernel argument: a pointer to a buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct TileArg {
    /// `in_ptr0`, `out_ptr0`, `in_out_ptr0` (read and written).
    pub name: String,
    /// The loop program's buffer the pointer points to.
    pub buffer: BufferId,
    /// The buffer's element type.
    pub dtype: DType,
    /// Whether the kernel reads the buffer.
    pub read: bool,
    /// Whether the kernel writes the buffer.
    pub written: bool,
}

/// Index of a block variable (`tmp<N>`) of a tile kernel.
pub type Var = u32;

/// The operation that defines a block variable. Mirrors [`crate::loops::ScalarOp`], with
/// operands being block variables and buffers being kernel arguments.
#[derive(Clone, Debug, PartialEq)]
pub enum TileOp {
    /// `args[arg][index]`.
    Load {
        /// The kernel argument read.
        arg: usize,
        /// The element index, over `xindex` (and `rindex`).
        index: Expr,
    },
    /// `args[arg][index]` where `mask` holds, else `other` (pad, cat, tails).
    MaskedLoad {
        /// The kernel argument read.
        arg: usize,
        /// The element index, over `xindex` (and `rindex`).
        index: Expr,
        /// The bool block variable that says where to load.
        mask: Var,
        /// The value where `mask` is false.
        other: Scalar,
    },
    /// A data-dependent load (gather, index_select, embedding): `args[arg][index + stride * v]`
    /// where `v` is the integer block variable `indirect`, checked to lie in `[0, bound)`.
    IndirectLoad {
        /// The kernel argument read.
        arg: usize,
        /// The index without the data-dependent part.
        index: Expr,
        /// The block variable holding the data-dependent positions.
        indirect: Var,
        /// Elements between consecutive positions.
        stride: Expr,
        /// The positions' exclusive upper bound.
        bound: Expr,
    },
    /// A constant, broadcast over the block.
    Constant(Scalar),
    /// The i64 value of an index expression (iota; the masks of pad, cat, tril).
    Index(Expr),
    /// A Philox number of random stream `stream` at counter `offset<stream> + counter`
    /// (see [`crate::loops::ScalarOp::Rand`]); the stream is one of [`TileKernel::random`].
    Rand {
        /// The distribution drawn from.
        dist: RandDist,
        /// The program's random stream drawn from.
        stream: usize,
        /// The counter relative to the stream's start.
        counter: Expr,
    },
    /// A unary function of a block variable.
    Unary(UnaryOp, Var),
    /// A binary function of two block variables.
    Binary(BinaryOp, Var, Var),
    /// `where(cond, a, b)`.
    Where(Var, Var, Var),
    /// Converts the operand to this variable's dtype.
    Cast(Var),
}

/// One statement of a tile kernel.
#[derive(Clone, Debug, PartialEq)]
pub enum TileStmt {
    /// `tmp<var> = op`, a block of shape `dims` and element type `dtype`.
    Let {
        /// The variable defined.
        var: Var,
        /// Its block shape.
        dims: Dims,
        /// Its element type.
        dtype: DType,
        /// What computes it.
        op: TileOp,
    },
    /// `store(arg + index, value)`; `index` is over `xindex` (and `rindex` when `dims` is XR).
    Store {
        /// The kernel argument written.
        arg: usize,
        /// The element index.
        index: Expr,
        /// The block variable stored.
        value: Var,
        /// The block shape of the store.
        dims: Dims,
    },
    /// `window(arg, offset=v, stride, size, bound)`: from here on, the kernel's stores into
    /// `arg` address the window of `size` positions from position `v` along a dim of `bound`
    /// positions, `stride` elements apart: element `index` of a later store is element
    /// `index + stride * v` of the buffer. `v`, an integer block variable, is the same for every
    /// element (a scatter's run-time offset, [`crate::loops::ScatterStore`]), so the window is
    /// checked once, `0 <= v <= bound - size`; outside, the kernel stores nothing at all (it
    /// returns before its elements) and records the index error (status code 1, the first position out of range: `v` when
    /// negative, else `max(v, bound)`; then `bound`).
    ///
    /// Pointwise kernels only, in their *window prologue* ([`TileKernel::window_prologue`]):
    /// the windows and the values their offsets read (lets of no `xindex`) come first in the
    /// body, so a backend computes them once per thread or call, before any element, and
    /// moves the argument's pointer: the stores are then plain, vectorizable stores.
    Window {
        /// The kernel argument written through the window.
        arg: usize,
        /// The block variable of the window's first position.
        offset: Var,
        /// Elements between consecutive positions of the dim.
        stride: Expr,
        /// Positions the window spans.
        size: Expr,
        /// The dim's size.
        bound: Expr,
    },
    /// `acc<acc> = identity of op`, before the pass that accumulates into it.
    AccInit {
        /// The accumulator.
        acc: Var,
        /// The reduction whose identity it starts from.
        op: ReduceOp,
        /// The accumulator's element type.
        dtype: DType,
    },
    /// `acc<acc> = combine(acc<acc>, value)` inside an [`TileStmt::RLoop`]; arg reductions
    /// also track the position (`rindex`) of the best value.
    AccUpdate {
        /// The accumulator.
        acc: Var,
        /// The reduction that combines.
        op: ReduceOp,
        /// The block variable folded in.
        value: Var,
    },
    /// `acc<max_acc>, acc<sum_acc> = combine_online_softmax(acc<max_acc>, acc<sum_acc>, value)`
    /// inside an [`TileStmt::RLoop`] (Milakov & Gimelshein 2018): the running maximum `m` of
    /// `value` and the sum `s` of `exp(value - m)`, rescaled when `m` grows:
    /// `m' = max(m, v)`, `s' = s * exp(m - m') + exp(v - m')`. While `m` is still `-inf` (only
    /// `-inf` values so far) `s` stays 0. A backend may fold several values at once (their
    /// maximum first, then one rescale): the same `m`, and `s` up to rounding. Both
    /// accumulators start as [`TileStmt::AccInit`]s (`Max` and `Sum`); only
    /// [`TileStmt::ReduceOnlineSoftmax`] finishes them.
    AccUpdateOnlineSoftmax {
        /// The running maximum `m`.
        max_acc: Var,
        /// The running sum `s`.
        sum_acc: Var,
        /// The block variable folded in.
        value: Var,
    },
    /// `tmp<max>, tmp<sum> = online_softmax(acc<max>, acc<sum>, axis=r)`, after the pass of a
    /// [`TileStmt::AccUpdateOnlineSoftmax`]: the lanes' `(m_i, s_i)` pairs combine as
    /// `m = max m_i`, `s = sum s_i * exp(m_i - m)`; `tmp<max>` is the row's maximum and
    /// `tmp<sum>` is `sum(exp(x - shift))` over the row, both of `dtype` and exactly what the two
    /// reductions give (up to rounding). `shift` is `tmp<max>`, so a row that is all `-inf`
    /// has a NaN sum (each term is `exp(-inf - -inf)`); with `finite_shift` it is
    /// `where(isinf(tmp<max>), c, tmp<max>)` for a finite constant `c` (logsumexp's), so an
    /// infinite maximum gives 0 (`-inf`) or `+inf` (`+inf`), whatever `c`.
    ReduceOnlineSoftmax {
        /// The accumulator of maxima in, the row's maximum out.
        max: Var,
        /// The accumulator of sums in, the row's sum out.
        sum: Var,
        /// The results' element type.
        dtype: DType,
        /// Shift by a finite constant where the maximum is infinite (logsumexp).
        finite_shift: bool,
    },
    /// `for roffset in range(0, rnumel, RBLOCK)`: one pass over the rows of a looped reduction.
    RLoop(Vec<TileStmt>),
    /// `tmp<var> = reduce(op, source, axis=r)`: `source` is an XR value (persistent) or an
    /// accumulator (looped); the result has shape X.
    Reduce {
        /// The variable defined (shape X).
        var: Var,
        /// The reduction.
        op: ReduceOp,
        /// The result's element type.
        dtype: DType,
        /// The XR value or accumulator reduced.
        source: Var,
    },
}

impl TileOp {
    /// The block variables the op reads.
    pub fn operands(&self) -> Vec<Var> {
        match *self {
            TileOp::MaskedLoad { mask, .. } => vec![mask],
            TileOp::IndirectLoad { indirect, .. } => vec![indirect],
            TileOp::Unary(_, a) | TileOp::Cast(a) => vec![a],
            TileOp::Binary(_, a, b) => vec![a, b],
            TileOp::Where(c, a, b) => vec![c, a, b],
            TileOp::Load { .. } | TileOp::Constant(_) | TileOp::Index(_) | TileOp::Rand { .. } => vec![],
        }
    }
}

impl TileStmt {
    /// The block variables the statement reads (accumulators aside).
    pub fn reads(&self) -> Vec<Var> {
        match self {
            TileStmt::Let { op, .. } => op.operands(),
            TileStmt::Store { value, .. }
            | TileStmt::AccUpdate { value, .. }
            | TileStmt::AccUpdateOnlineSoftmax { value, .. } => vec![*value],
            TileStmt::Reduce { source, .. } => vec![*source],
            TileStmt::Window { offset, .. } => vec![*offset],
            _ => vec![],
        }
    }
}

/// Every statement of a body, loops flattened (in order).
pub fn flat_stmts(stmts: &[TileStmt]) -> Vec<&TileStmt> {
    stmts.iter().flat_map(|s| if let TileStmt::RLoop(b) = s { flat_stmts(b) } else { vec![s] }).collect()
}

/// A block-level kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct TileKernel {
    /// The kernel's name, that of its [`FusedKernel`].
    pub name: String,
    /// Pointwise or reduction (persistent or looped).
    pub kind: KernelKind,
    /// The buffer pointers the kernel takes, in order.
    pub args: Vec<TileArg>,
    /// Output elements (pointwise) or rows (reductions).
    pub xnumel: Expr,
    /// Row length, for reductions.
    pub rnumel: Option<Expr>,
    /// The size symbols the kernel reads (in `xnumel`, `rnumel` or an index), passed after the
    /// buffers as `i64` arguments, in this order; empty for static shapes.
    pub sizes: Vec<Expr>,
    /// The random streams the kernel draws from, in increasing order: each passed after the
    /// sizes as two 64-bit arguments, the stream's key and first counter
    /// ([`crate::RandomState`]: `seed<k>`, `offset<k>`); empty when it draws none.
    pub random: Vec<usize>,
    /// Suggested outputs per program (block).
    pub xblock: usize,
    /// Suggested row elements per block (reductions).
    pub rblock: usize,
    /// The statements, run once per block of `xblock` outputs.
    pub body: Vec<TileStmt>,
}

/// A block shape as the text writes it: `[XBLOCK, 1]` or `[XBLOCK, RBLOCK]`.
fn shape_text(dims: Dims) -> &'static str {
    match dims {
        Dims::X => "[XBLOCK, 1]",
        Dims::XR => "[XBLOCK, RBLOCK]",
    }
}

fn op_text(k: &TileKernel, op: &TileOp, dtype: DType) -> String {
    let arg = |a: &usize| k.args[*a].name.clone();
    match op {
        TileOp::Load { arg: a, index } => format!("load({} + ({index}))", arg(a)),
        TileOp::MaskedLoad { arg: a, index, mask, other } => {
            format!("load({} + ({index}), mask=tmp{mask}, other={other})", arg(a))
        }
        TileOp::IndirectLoad { arg: a, index, indirect, stride, bound } => {
            format!("load({} + ({index}), indirect=tmp{indirect}, stride={stride}, bound={bound})", arg(a))
        }
        TileOp::Constant(c) => format!("{c}"),
        TileOp::Index(e) => format!("({e})"),
        TileOp::Rand { dist, stream, counter } => {
            let name = if *dist == RandDist::Normal { "randn" } else { "rand" };
            format!("{name}({}, {} + ({counter}))", philox::seed_name(*stream), philox::offset_name(*stream))
        }
        TileOp::Unary(u, a) => format!("{}(tmp{a})", u.name()),
        TileOp::Binary(b, x, y) => format!("{}(tmp{x}, tmp{y})", b.name()),
        TileOp::Where(c, x, y) => format!("where(tmp{c}, tmp{x}, tmp{y})"),
        TileOp::Cast(a) => format!("tmp{a}.to({dtype})"),
    }
}

fn write_stmts(s: &mut String, k: &TileKernel, stmts: &[TileStmt], indent: usize) {
    let pad = " ".repeat(indent);
    let x = shape_text(Dims::X);
    for st in stmts {
        match st {
            TileStmt::Let { var, dims, dtype, op } => {
                let _ = writeln!(s, "{pad}tmp{var}: {dtype}{} = {}", shape_text(*dims), op_text(k, op, *dtype));
            }
            TileStmt::Store { arg, index, value, dims } => {
                let mask = if *dims == Dims::X { "xmask" } else { "xmask & rmask" };
                let _ = writeln!(s, "{pad}store({} + ({index}), tmp{value}, {mask})", k.args[*arg].name);
            }
            TileStmt::Window { arg, offset, stride, size, bound } => {
                let name = &k.args[*arg].name;
                let _ =
                    writeln!(s, "{pad}window({name}, offset=tmp{offset}, stride={stride}, size={size}, bound={bound})");
            }
            TileStmt::AccInit { acc, op, dtype } => {
                let _ = writeln!(s, "{pad}acc{acc} = full([XBLOCK, RBLOCK], identity({}), {dtype})", op.name());
            }
            TileStmt::AccUpdate { acc, op, value } => {
                let _ = writeln!(s, "{pad}acc{acc} = combine_{}(acc{acc}, tmp{value})", op.name());
            }
            TileStmt::AccUpdateOnlineSoftmax { max_acc: m, sum_acc: a, value } => {
                let _ = writeln!(s, "{pad}acc{m}, acc{a} = combine_online_softmax(acc{m}, acc{a}, tmp{value})");
            }
            TileStmt::ReduceOnlineSoftmax { max, sum, dtype, finite_shift } => {
                let shift = if *finite_shift { ", shift=finite" } else { "" };
                let _ = writeln!(
                    s,
                    "{pad}tmp{max}, tmp{sum}: {dtype}{x} = online_softmax(acc{max}, acc{sum}, axis=1{shift})[:, None]"
                );
            }
            TileStmt::RLoop(body) => {
                let _ = writeln!(s, "{pad}for roffset in range(0, rnumel, RBLOCK):");
                let _ = writeln!(s, "{pad}    rindex = roffset + arange(RBLOCK)[None, :]");
                let _ = writeln!(s, "{pad}    rmask = rindex < rnumel");
                write_stmts(s, k, body, indent + 4);
            }
            TileStmt::Reduce { var, op, dtype, source } => {
                let src = if matches!(k.kind, KernelKind::LoopedReduction) {
                    format!("acc{source}")
                } else {
                    format!("tmp{source}")
                };
                let _ = writeln!(s, "{pad}tmp{var}: {dtype}{x} = {}({src}, axis=1)[:, None]", op.name());
            }
        }
    }
}

impl TileKernel {
    /// The length of the body's *window prologue*: the leading statements up to the last
    /// [`TileStmt::Window`] (0 without one). The kernel builder puts there the windows of a
    /// pointwise kernel and the lets their offsets read, none of which reads `xindex`, so a
    /// backend runs them once, before the elements, and the rest of the body per element.
    ///
    /// ```
    /// use coil_ir::kernel::TileKernel;
    /// let k = TileKernel::parse("\
    /// @kernel(kind=pointwise)
    /// def poi_fused_scatter_0(in_ptr0: *i64 (buffer 1), in_ptr1: *f32 (buffer 2), out_ptr0: *f32 (buffer 3)):
    ///     xnumel = 8
    ///     XBLOCK: constexpr = 1024
    ///     xindex = program_id(0) * XBLOCK + arange(XBLOCK)[:, None]
    ///     xmask = xindex < xnumel
    ///     tmp0: i64[XBLOCK, 1] = load(in_ptr0 + (0))
    ///     window(out_ptr0, offset=tmp0, stride=4, size=2, bound=16)
    ///     tmp1: f32[XBLOCK, 1] = load(in_ptr1 + (xindex))
    ///     store(out_ptr0 + (xindex), tmp1, xmask)
    /// ").unwrap();
    /// assert_eq!(k.window_prologue(), 2);
    /// ```
    pub fn window_prologue(&self) -> usize {
        self.body.iter().rposition(|s| matches!(s, TileStmt::Window { .. })).map_or(0, |i| i + 1)
    }

    /// Whether the window at `body[at]` must be checked: no window before it has its offset,
    /// size and bound (a layer's key and value caches, written at one position, are checked
    /// once).
    pub fn window_needs_check(&self, at: usize) -> bool {
        let key = |s: &TileStmt| match s {
            TileStmt::Window { offset, size, bound, .. } => Some((*offset, *size, *bound)),
            _ => None,
        };
        let Some(k) = key(&self.body[at]) else { return false };
        !self.body[..at].iter().any(|s| key(s) == Some(k))
    }

    /// The parameter list of the kernel's `def` line: the buffer arguments (each with the
    /// loop program's buffer it points to), the size symbols, the random streams' keys and
    /// counters.
    fn params_text(&self) -> String {
        let params: Vec<String> = self
            .args
            .iter()
            .map(|a| format!("{}: *{} (buffer {})", a.name, a.dtype, a.buffer.0))
            .chain(self.sizes.iter().map(|s| format!("{s}: i64")))
            .chain(
                self.random
                    .iter()
                    .flat_map(|&k| [philox::seed_name(k), philox::offset_name(k)])
                    .map(|n| format!("{n}: u64")),
            )
            .collect();
        params.join(", ")
    }

    /// The lines between the `def` line and the statements: extents, block sizes, index and
    /// mask blocks. The parser expects exactly these for the header's kind and extents.
    pub(crate) fn prologue_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "    xnumel = {}", self.xnumel);
        if let Some(r) = &self.rnumel {
            let _ = writeln!(s, "    rnumel = {r}");
        }
        let _ = writeln!(s, "    XBLOCK: constexpr = {}", self.xblock);
        let _ = writeln!(s, "    xindex = program_id(0) * XBLOCK + arange(XBLOCK)[:, None]");
        let _ = writeln!(s, "    xmask = xindex < xnumel");
        if self.rnumel.is_some() {
            let _ = writeln!(s, "    RBLOCK: constexpr = {}", self.rblock);
            if self.kind == KernelKind::PersistentReduction {
                let _ = writeln!(s, "    rindex = arange(RBLOCK)[None, :]");
                let _ = writeln!(s, "    rmask = rindex < rnumel");
            }
        }
        s
    }
}

impl fmt::Display for TileKernel {
    /// Triton-like text, which [`TileKernel::parse`] reads back (see [`crate::parse`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        let _ = writeln!(s, "@kernel(kind={})", self.kind.name());
        let _ = writeln!(s, "def {}({}):", self.name, self.params_text());
        s += &self.prologue_text();
        write_stmts(&mut s, self, &self.body, 4);
        f.write_str(&s)
    }
}
