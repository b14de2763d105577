//! Prefetching the next row while a row kernel's last pass computes from the cache.
//!
//! A row kernel of several passes (a softmax, a layer norm, an RMS norm: a looped reduction
//! with more than one [`TileStmt::RLoop`], or a persistent one with more than one `rindex`
//! loop) reads its row from memory in the first pass, where the core mostly waits, and runs
//! the later passes from its cache, where memory waits: one thread of the softmax of
//! `[8192, 4096]` f32 moved 83% of a one-thread copy's bytes on the build machine. Here the
//! last pass, a loop that only computes and stores one row (no reduction; a pass that stores
//! more keeps memory busy already: [`MAX_STORED_ROWS`]), runs in blocks of [`PREFETCH_BLOCK`]
//! positions, and before each block asks for the cache lines of the next
//! row (`xnext`, the next `xindex` of the call's range; the last row asks for itself) that
//! hold the same positions, of every row the first passes stream: a load whose position
//! depends on `xindex` and advances by one element with `rindex`. So the next row comes
//! while this one is computed (94% of the copy in that experiment). Loads that do not
//! depend on `xindex` (a norm's weight) stay in the cache anyway and are not asked for.
//!
//! The prefetches are `COIL_PREFETCH` (the prelude's `__builtin_prefetch`, a hint that never
//! faults; nothing on compilers without it) outside the vector loop: inside it the compiler
//! leaves the loop scalar. Their addresses are inside the row (positions past a symbolic
//! row's end are not asked for). Asking for the whole next row before the second pass, or
//! from inside the vector loop, was slower in that experiment; asking in the blocks of a middle
//! pass instead of the last (the exponentials' pass of a softmax, the variance's of a layer
//! norm) was no faster for the softmax and slower for the layer norm (`bench/NOTES.md`,
//! session 14).

use super::{clamped, column, Emitter, Piece};
use coil_ir::kernel::{flat_stmts, KernelKind, TileKernel, TileOp, TileStmt};
use coil_ir::sym::Expr;

/// Positions of the last pass between two groups of prefetches.
pub const PREFETCH_BLOCK: i64 = 64;

/// Bytes of a cache line (64 on x86-64 and most aarch64 cores; a larger line only asks twice).
const LINE: i64 = 64;

/// The most rows a kernel asks for (each a few instructions per block).
const MAX_STREAMS: usize = 4;

/// The most rows the last pass may store for it to take the prefetches. A pass that stores
/// two rows keeps memory busy with them (each line is read before it is written): the add +
/// layer norm of `[8192, 4096]` bf16 (two rows read, `x + y` and the norm stored) went from
/// 9.4-10.0 GB/s to 7.8-8.7 on one thread with them, where the softmax (one row each way)
/// went from 6.1-6.4 to 6.9-7.3, the layer norm from 6.5-7.0 to 8.5-8.8 and the RMS norm from
/// 7.1-7.3 to 9.1-9.8 (a C harness timing the generated kernels alternately, load 3-4).
const MAX_STORED_ROWS: usize = 1;

/// A row read from memory by a kernel's first passes.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Stream {
    /// The pointer's name.
    ptr: String,
    /// Bytes of an element.
    size: i64,
    /// The position read, of `xindex` and `rindex`.
    index: Expr,
}

/// Whether `e` mentions the symbol `name`.
fn mentions(e: Expr, name: &str) -> bool {
    e.free_symbols().iter().any(|s| s.as_symbol().is_some_and(|s| s.name == name))
}

/// The rows `stmts` (the passes before the last) stream: loads whose position depends on
/// `xindex` and moves by one element with `rindex`, at most [`MAX_STREAMS`].
fn streams<'s>(k: &TileKernel, stmts: impl IntoIterator<Item = &'s TileStmt>) -> Vec<Stream> {
    let rindex = coil_ir::kernel::rindex(&k.rnumel.unwrap_or(Expr::int(1)));
    let mut out: Vec<Stream> = Vec::new();
    for s in stmts {
        let TileStmt::Let { op: TileOp::Load { arg, index }, .. } = s else { continue };
        let a = &k.args[*arg];
        let stream = Stream { ptr: a.name.clone(), size: a.dtype.size_bytes() as i64, index: *index };
        if clamped(*index).is_none()
            && mentions(*index, "xindex")
            && column::step(*index, rindex) == Some(1)
            && !out.contains(&stream)
        {
            out.push(stream);
        }
    }
    out.truncate(MAX_STREAMS);
    out
}

/// The rows to prefetch in `k`'s last pass, when it takes them (see the module doc). `pieces`
/// are a persistent kernel's.
pub(super) fn plan(k: &TileKernel, pieces: Option<&[Piece]>) -> Vec<Stream> {
    if k.xnumel.const_value().is_some_and(|n| n < 2)
        || k.rnumel.and_then(|r| r.const_value()).is_some_and(|r| r < PREFETCH_BLOCK)
    {
        return vec![];
    }
    // a pass that only computes and stores one row (see [`MAX_STORED_ROWS`])
    let pure = |stmts: &mut dyn Iterator<Item = &TileStmt>| {
        let mut rows = 0;
        for s in stmts {
            match s {
                TileStmt::Store { .. } => rows += 1,
                TileStmt::Let { .. } => {}
                _ => return false,
            }
        }
        (1..=MAX_STORED_ROWS).contains(&rows)
    };
    match k.kind {
        KernelKind::LoopedReduction => {
            let loops: Vec<&[TileStmt]> = k
                .body
                .iter()
                .filter_map(|s| if let TileStmt::RLoop(b) = s { Some(b.as_slice()) } else { None })
                .collect();
            match loops.split_last() {
                Some((last, before)) if !before.is_empty() && pure(&mut last.iter()) => {
                    streams(k, before.iter().flat_map(|b| flat_stmts(b)))
                }
                _ => vec![],
            }
        }
        KernelKind::PersistentReduction => {
            let loops: Vec<&Vec<&TileStmt>> = pieces
                .unwrap_or(&[])
                .iter()
                .filter_map(|p| if let Piece::Loop(l) = p { Some(l) } else { None })
                .collect();
            match loops.split_last() {
                Some((last, before)) if !before.is_empty() && pure(&mut last.iter().copied()) => {
                    streams(k, before.iter().flat_map(|l| l.iter().copied()))
                }
                _ => vec![],
            }
        }
        _ => vec![],
    }
}

impl Emitter<'_> {
    /// Declares `xnext`, the row the last pass prefetches, when the kernel prefetches.
    pub(super) fn declare_next_row(&mut self) {
        if !self.prefetch.is_empty() {
            self.line("const int64_t xnext = xindex + 1 < xend ? xindex + 1 : xindex;");
        }
    }

    /// Opens the loop over blocks of [`PREFETCH_BLOCK`] positions of `0..end` and asks for the
    /// next row's lines of each block; returns the block's `rindex` range, `(start, stop)`.
    pub(super) fn open_prefetch_blocks(&mut self, end: &str) -> (String, String) {
        let b = PREFETCH_BLOCK;
        self.line(&format!("for (int64_t rblock = 0; rblock < {end}; rblock += {b}) {{"));
        self.indent += 1;
        let whole = end.parse::<i64>().is_ok_and(|n| n % b == 0);
        let count = if whole {
            b.to_string()
        } else {
            self.line(&format!("const int64_t rcount = {end} - rblock < {b} ? {end} - rblock : {b};"));
            "rcount".to_string()
        };
        let is = |e: Expr, name: &str| e.as_symbol().is_some_and(|s| s.name == name);
        for s in self.prefetch.clone() {
            let step = (LINE / s.size).max(1);
            for j in 0..(b * s.size / LINE).max(1) {
                let at = j * step;
                let rblock = Expr::symbol("rblock", Some(0), None) + at;
                let index = s.index.substitute_with(|e| {
                    if is(e, "xindex") {
                        Some(Expr::symbol("xnext", Some(0), None))
                    } else if is(e, "rindex") {
                        Some(rblock)
                    } else {
                        None
                    }
                });
                let mut line = format!("COIL_PREFETCH(&{}[{}]);", s.ptr, index.to_c());
                if at > 0 && !whole {
                    line = format!("if ({at} < rcount) {line}");
                }
                self.line(&line);
            }
        }
        ("rblock".to_string(), format!("rblock + {count}"))
    }
}
