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

use super::{ops, Emitter};
use coil_ir::kernel::{KernelKind, TileStmt, Var};
use coil_ir::{DType, ReduceOp};

/// Positions of a row whose f32 sum runs in vector lanes before it joins the `double` total.
pub const SUM_BLOCK: i64 = 4096;

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
        self.lanes = lanes.clone();
        let pragma = self.simd_pragma(stmts.iter().copied());
        self.blocked_rloop(pragma, end, &lanes, emit);
        self.lanes.clear();
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
        let (start, stop) = if prefetch {
            self.open_prefetch_blocks(end)
        } else if lanes.is_empty() || short {
            ("0".to_string(), end.to_string())
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
            ("rblock".to_string(), format!("rblock + {count}"))
        };
        for acc in lanes {
            self.line(&format!("float lacc{acc} = 0.0f;"));
        }
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
        for acc in lanes {
            self.line(&format!("acc{acc} += (double)lacc{acc};"));
        }
        if prefetch || (!lanes.is_empty() && !short) {
            self.indent -= 1;
            self.line("}");
        }
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
