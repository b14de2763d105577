//! Realization by cost: a pointwise node that its readers could inline gets a buffer when
//! recomputing it in each of them costs more than storing it once.
//!
//! An inlined node is recomputed inside every reader, so every reader's kernel loads every
//! buffer the node's body loads (and a body loads what its whole inlined cone loads: its
//! unrealized producers are inlined too). Along a chain of pointwise nodes that each have
//! several readers that grows with the square of the chain's length: a residual stream
//! `x = x + f(layer_norm(x))` inlined everywhere makes each layer norm load the block input and
//! every earlier block's output, and each layer norm of the backward pass load them again.
//!
//! The rules count what the node's body does with its unrealized producers inlined: `loads`,
//! the distinct buffers it loads; `full`, those of them with at least as many elements as the
//! node (a bias row, a row's mean or a norm's weight is reloaded from cache, not memory; a
//! gathered table counts when it is that large); `values`, its value-numbered values. A
//! pointwise node (or pad, or cat) is realized when
//!
//! * it has several readers and `loads` exceeds [`REALIZE_READS_THRESHOLD`] or `values`
//!   exceeds [`REALIZE_OPCOUNT_THRESHOLD`] (Inductor's `StorageBox.mark_reuse`), counting
//!   only the loads of buffers larger than [`SMALL_OPERAND_RATIO`]-th of the node's size;
//! * `loads` exceeds [`REALIZE_ACC_READS_THRESHOLD`], whatever its readers (Inductor's
//!   `has_exceeded_max_reads`: many small branches converging on one reader);
//! * several readers read it element for element (not through a broadcast) and `full` is at
//!   least [`REALIZE_MIN_FULL_READS`] (coil's rule, below; `Tuning::realize_min_full_reads`
//!   overrides the threshold, for measuring: off, GPT-2's step keeps less memory but every
//!   measured step runs slower, see `bench/NOTES.md`; ResNet-50's gradient graph, whose relu
//!   masks read the relus' results, keeps the same either way).
//!
//! Readers are the nodes that read it directly or through views, each counted once.
//!
//! **Why the last rule.** Inlined into `r` readers in `r` kernels, a node with `full = F` costs
//! `r * F` loads of its size. Stored, one reader's kernel computes it (the scheduler fuses a
//! producer into a reader that reads it at the index it was written) and stores it, and the
//! other readers load it: `F + 1 + (r - 1) = F + r`, no more than `r * F` once `r >= 2` and
//! `F >= 2`; when every reader ends up in the producer's kernel nothing is stored at all (a
//! load of a buffer written in the same kernel is the value itself) and the two are the same.
//! What it buys is in the readers' own bodies: they carry one load instead of `F`, so a
//! residual stream is written once per block and read by the next block, the layer norms and
//! the backward pass, each kernel reading a bounded number of buffers. The case it loses is a
//! producer that fuses with none of its readers (they read it transposed, say): `F + 1 + r`
//! against `r * F`, one extra pass for `r = F = 2`. Broadcast readers are left out because
//! inlining costs them nothing (a scalar read by every parameter's update would otherwise be
//! a one-element kernel of its own). Inductor has no such rule: its training graphs store
//! what the backward pass reads as the forward graph's outputs, where coil's joint graph
//! would recompute it.

use super::Lowerer;
use coil_ir::loops::Body;
use coil_ir::{NodeId, Op};

/// A node with several readers whose inlined body loads more distinct buffers than this is
/// realized: each extra reader would reload them all (Inductor's `realize_reads_threshold`;
/// lower for fan-outs than [`REALIZE_ACC_READS_THRESHOLD`], since recomputing in each reader
/// multiplies the loads).
pub const REALIZE_READS_THRESHOLD: usize = 4;

/// A node with several readers whose inlined body has more values than this is realized:
/// each extra reader would recompute them all (Inductor's `realize_opcount_threshold`).
pub const REALIZE_OPCOUNT_THRESHOLD: usize = 30;

/// A tensor with at most `1 / SMALL_OPERAND_RATIO` of a node's elements (a per-channel
/// vector, a row statistic) is left out of the loads [`REALIZE_READS_THRESHOLD`] counts: every
/// reader reloads it from cache, not memory. A batch norm's four per-channel vectors would
/// otherwise store the normalized activation before a max-pool reads it nine times, where
/// recomputing it in the pool costs a few flops per window (ResNet-50's stem on the H100:
/// batch norm, ReLU and max-pool in 186 us instead of 265). 0-d values still count: leaving out an
/// optimizer's step size and bias corrections inlined AdamW's update into readers in other
/// kernels (GPT-2's step +0.5 ms).
pub const SMALL_OPERAND_RATIO: usize = 64;

/// A node whose inlined body loads more distinct buffers than this is realized even with one
/// reader, so that loads do not pile up along a chain whose branches each load a few
/// (Inductor's `realize_acc_reads_threshold`).
pub const REALIZE_ACC_READS_THRESHOLD: usize = 8;

/// A node read element for element by several readers whose inlined body loads at least this
/// many buffers of its own size (or larger) is realized: from 2 on, storing it once costs no
/// more traffic than reloading them in every reader (see the module docs).
pub const REALIZE_MIN_FULL_READS: usize = 2;

impl Lowerer<'_> {
    /// Whether pointwise node `n`, whose inlined body is `body` (its producers decided), should
    /// get a buffer rather than be inlined into its readers (see the module docs).
    pub(crate) fn costs_more_inlined(&self, n: NodeId, body: &Body) -> bool {
        let reads = body.reads();
        let loads = reads.len();
        let numel = self.meta(n).numel();
        let size = |b: &coil_ir::loops::BufferId| self.prog.buffer(*b).meta.numel();
        let full = reads.iter().filter(|b| size(b) >= numel).count();
        let small = |b: &coil_ir::loops::BufferId| {
            let meta = &self.prog.buffer(*b).meta;
            meta.rank() > 0 && meta.numel().saturating_mul(SMALL_OPERAND_RATIO) <= numel
        };
        let large = reads.iter().filter(|b| !small(b)).count();
        let readers = self.distinct_readers(n);
        let reused = readers.len() > 1;
        let elementwise = readers.iter().filter(|&&(_, broadcast)| !broadcast).count();
        loads > REALIZE_ACC_READS_THRESHOLD
            || (reused && (large > REALIZE_READS_THRESHOLD || body.values.len() > REALIZE_OPCOUNT_THRESHOLD))
            || (elementwise > 1 && full >= self.min_full_reads)
    }

    /// The nodes that read `n`, directly or through views and exact widening casts, each
    /// once, and whether it reaches them through a broadcast (a view with more elements than
    /// `n`).
    ///
    /// A widening cast (`bf16` to `f32`, say) is looked through as a view is: its readers count
    /// as `n`'s, so that when the value is worth storing it is stored narrow, as `n`, and each
    /// reader widens it again for free. Deciding on the cast alone would store the wide copy
    /// (a ResNet's batch-norm gradients, `f32(relu_backward(g))`, read by the norm's two
    /// reductions and its input gradient, were stored as f32 at twice the bytes).
    fn distinct_readers(&self, n: NodeId) -> Vec<(NodeId, bool)> {
        let numel = self.meta(n).numel();
        let mut found: Vec<(NodeId, bool)> = Vec::new();
        let mut stack = vec![(n, false)];
        while let Some((m, broadcast)) = stack.pop() {
            for &r in &self.readers[m.0] {
                let widens = matches!(self.g.node(r).op, Op::Cast(t) if self.meta(m).dtype.widens_exactly(t));
                if self.g.node(r).op.is_view() || widens {
                    stack.push((r, broadcast || self.meta(r).numel() > numel));
                } else if let Some(seen) = found.iter_mut().find(|(s, _)| *s == r) {
                    // Read both ways: elementwise wins (it is the read that reloads).
                    seen.1 &= broadcast;
                } else {
                    found.push((r, broadcast));
                }
            }
        }
        found
    }
}
