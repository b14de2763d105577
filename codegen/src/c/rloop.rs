//! `rindex` loops, and how their float sums accumulate.
//!
//! A sum of f32 values (f16 and bf16 ones too: they are computed in f32) in a vector loop adds
//! in f32 lanes, as PyTorch's kernels do: converting each term to `double` cost rmsnorm a fifth
//! of its time on the build machine. The lanes restart every [`SUM_BLOCK`] positions of the
//! row, and each block's total (its lanes added as a tree) goes into the `double`
//! accumulator, so the rounding error does not grow with the row. With `L` lanes (16 f32 in
//! AVX-512 vectors, 8 in AVX2; more when the compiler unrolls) each lane adds at most
//! `SUM_BLOCK / L` terms, so a block's error is at most `(SUM_BLOCK / L + log2 L) * 2^-24 *
//! sum |x_i|` over the block: about `1.6e-5 * sum |x_i|` for AVX-512, against the
//! interpreter's f64 sum rounded once (`2^-24 * |sum x_i|`). Rounding errors of real data
//! mostly cancel, so typical errors are far smaller (`tests_rows` checks the bound on sums
//! that cancel). A row of at most [`SUM_BLOCK`] positions is one block. Sums in scalar loops
//! (a statement may fail), products, f64 values and integers keep their `double` (`uint64_t`)
//! accumulators.
//!
//! A whole block of a vector loop whose only reductions are such sums walks its positions as
//! [`STREAMS`] interleaved streams (position `rblock + s * SUM_BLOCK / STREAMS + j` for stream
//! `s` at step `j`): each vector step loads from four places a row apart, which keeps more of
//! the memory's lines in flight than one stream (a 1 GB f32 sum on the build machine's two
//! cores: 15-21 GB/s as one stream, 22-25 as four, `bench/NOTES.md` session 18). A lane then
//! adds terms of every stream, still `SUM_BLOCK / L` of them, so the bound above holds. The
//! last, partial block of a row runs as one stream.

use super::{ops, Emitter};
use coil_ir::kernel::{KernelKind, TileStmt, Var};
use coil_ir::{DType, ReduceOp};
use std::fmt::Write;

/// Whether `s` folds into an accumulator of its loop (as [`Emitter::simd_pragma`] counts them).
fn is_reduction(s: &TileStmt) -> bool {
    matches!(s, TileStmt::AccUpdate { .. } | TileStmt::Reduce { .. } | TileStmt::AccUpdateOnlineSoftmax { .. })
}

/// Positions of a row whose f32 sum runs in vector lanes before it joins the `double` total.
pub const SUM_BLOCK: i64 = 4096;

/// Streams a whole block of a sums-only vector loop is read in (module doc).
pub const STREAMS: i64 = 4;

impl Emitter<'_> {
    /// Whether a sum into `acc` may add in f32 lanes: a float sum of f32-computed values.
    pub(super) fn lane_sum(&self, acc: Var, op: ReduceOp) -> bool {
        let (out, src) = (self.dtype(acc), self.source_dtype(acc));
        op == ReduceOp::Sum && out.is_float() && out != DType::F64 && ops::compute_type(src) == "float"
    }

    /// The accumulators of `stmts` that a vector loop over them sums in f32 lanes.
    fn lane_sums<'s>(&self, stmts: impl IntoIterator<Item = &'s TileStmt>) -> Vec<Var> {
        stmts
            .into_iter()
            .filter_map(|s| match s {
                TileStmt::AccUpdate { acc, op, .. } if self.lane_sum(*acc, *op) => Some(*acc),
                TileStmt::Reduce { var, op, .. }
                    if self.k.kind == KernelKind::PersistentReduction && self.lane_sum(*var, *op) =>
                {
                    Some(*var)
                }
                _ => None,
            })
            .collect()
    }

    /// An `rindex` loop over `stmts` (`emit` writes them), from 0 to `end` (C): a vector loop
    /// when they allow it ([`Emitter::simd_pragma`]), its f32 sums in blocks (module doc).
    pub(super) fn rloop(&mut self, stmts: &[&TileStmt], end: &str, emit: impl FnOnce(&mut Self)) {
        let vector = self.simd_pragma(stmts.iter().copied()).is_some();
        let lanes = if vector { self.lane_sums(stmts.iter().copied()) } else { Vec::new() };
        // Streams when the loop's reductions are all lane sums (a maximum, a product keep the
        // plain walk: nothing was measured for them).
        let reductions = stmts.iter().filter(|s| is_reduction(s)).count();
        self.streams = !lanes.is_empty() && lanes.len() == reductions;
        self.lanes = lanes.clone();
        let pragma = self.simd_pragma(stmts.iter().copied());
        self.blocked_rloop(pragma, end, &lanes, emit);
        self.lanes.clear();
        self.streams = false;
    }

    /// `for rindex in 0..end` with `pragma`; with `lanes` (accumulators summed in f32 lanes,
    /// `lacc<N>`, which the pragma and `emit` name) in blocks of [`SUM_BLOCK`], each block's
    /// lane sums added to the `double` accumulators after it.
    pub(super) fn blocked_rloop(
        &mut self,
        pragma: Option<String>,
        end: &str,
        lanes: &[Var],
        emit: impl FnOnce(&mut Self),
    ) {
        let b = SUM_BLOCK;
        let short = end.parse::<i64>().is_ok_and(|n| n <= b);
        // the last pass of a row kernel that prefetches the next row ([`super::prefetch`])
        let prefetch = std::mem::take(&mut self.prefetch_next) && lanes.is_empty();
        // `count`: a block's positions (C), where the loop runs in blocks of lane sums
        let (start, stop, count) = if prefetch {
            let (start, stop) = self.open_prefetch_blocks(end);
            (start, stop, None)
        } else if lanes.is_empty() || short {
            ("0".to_string(), end.to_string(), None)
        } else {
            // a computed end (a cut loop's) once, in a name of this loop's
            let simple = end.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            let end = if simple {
                end.to_string()
            } else {
                self.line(&format!("const int64_t rend{} = {end};", lanes[0]));
                format!("rend{}", lanes[0])
            };
            let end = end.as_str();
            self.line(&format!("for (int64_t rblock = 0; rblock < {end}; rblock += {b}) {{"));
            self.indent += 1;
            let count = match end.parse::<i64>() {
                Ok(n) if n % b == 0 => b.to_string(),
                _ => {
                    self.line(&format!("const int64_t rcount = {end} - rblock < {b} ? {end} - rblock : {b};"));
                    "rcount".to_string()
                }
            };
            ("rblock".to_string(), format!("rblock + {count}"), Some(count))
        };
        for acc in lanes {
            self.line(&format!("float lacc{acc} = 0.0f;"));
        }
        let blocked = count.is_some();
        match (pragma, count) {
            (Some(p), Some(count)) if self.streams => self.streamed_block(&p, &count, emit),
            (pragma, _) => {
                if let Some(p) = pragma {
                    self.line(&p);
                }
                self.line(&format!("for (int64_t rindex = {start}; rindex < {stop}; rindex++) {{"));
                self.indent += 1;
                self.in_loop = true;
                emit(self);
                self.in_loop = false;
                self.indent -= 1;
                self.line("}");
            }
        }
        for acc in lanes {
            self.line(&format!("acc{acc} += (double)lacc{acc};"));
        }
        if prefetch || blocked {
            self.indent -= 1;
            self.line("}");
        }
    }

    /// The vector loop over one block of `count` positions (C) from `rblock` in [`STREAMS`]
    /// streams when the block is whole; a partial block (a computed count) runs the body as
    /// one stream, its text the same statements.
    fn streamed_block(&mut self, pragma: &str, count: &str, emit: impl FnOnce(&mut Self)) {
        let (b, step) = (SUM_BLOCK, SUM_BLOCK / STREAMS);
        let whole = count == b.to_string();
        if !whole {
            self.line(&format!("if ({count} == {b}) {{"));
            self.indent += 1;
        }
        self.line(pragma);
        self.line(&format!("for (int64_t rstep = 0; rstep < {step}; rstep++) {{"));
        self.indent += 1;
        self.line(&format!("for (int64_t rstream = 0; rstream < {STREAMS}; rstream++) {{"));
        self.indent += 1;
        self.line(&format!("const int64_t rindex = rblock + rstream * {step} + rstep;"));
        let body_start = self.out.len();
        let body_indent = self.indent;
        self.in_loop = true;
        emit(self);
        self.in_loop = false;
        let body = self.out[body_start..].to_string();
        self.indent -= 1;
        self.line("}");
        self.indent -= 1;
        self.line("}");
        if whole {
            return;
        }
        self.indent -= 1;
        self.line("} else {");
        self.indent += 1;
        self.line(pragma);
        self.line(&format!("for (int64_t rindex = rblock; rindex < rblock + {count}; rindex++) {{"));
        // The same statements, one level less deep.
        let (deeper, here) = (" ".repeat(body_indent * 4), " ".repeat((self.indent + 1) * 4));
        for line in body.lines() {
            let line = line.strip_prefix(&deeper).map_or(line.to_string(), |rest| format!("{here}{rest}"));
            let _ = writeln!(self.out, "{line}");
        }
        self.line("}");
        self.indent -= 1;
        self.line("}");
    }

    /// The name a loop folds accumulator `acc` into: its f32 lanes, else itself.
    pub(super) fn acc_in_loop(&self, acc: Var) -> String {
        if self.lanes.contains(&acc) {
            format!("lacc{acc}")
        } else {
            self.acc(acc)
        }
    }
}
