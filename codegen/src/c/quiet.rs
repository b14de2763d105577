//! bf16 loads that must quiet a signalling NaN.
//!
//! The interpreter widens bf16 to f32 as the `half` crate does, setting the quiet bit of a NaN
//! (`coil_bf16_to_f32`). Doing that in a vector loop costs a 16-bit compare and a blend per
//! element (a third of rmsnorm's time on the build machine), and it shows in a result only
//! where the loaded bits reach an f32 store unchanged: every other way out rounds or
//! converts, which quiets a NaN by itself. So a load widens the bits as they are
//! (`coil_bf16_bits_f32`: a shift) unless its value may reach an f32 buffer through ops that
//! can pass a NaN's bits along.
//!
//! A value's NaN bits are *lost* when it is folded into a reduction (sums convert or add, a
//! maximum keeps a flag and yields the canonical NaN), stored into a bf16, f16, f64 or integer
//! buffer (the conversions quiet or drop them), or used by an op whose result is not a float,
//! is rounded to bf16 / f16 (`coil_round_*` quiets), or is f64 from a narrower float (the
//! conversion quiets). Every other op with a float result may carry them (`where` and `neg`
//! pass bits through, `coil_exp_f32` returns a NaN argument itself; arithmetic would quiet
//! it, but the C compiler may fold `x * 1.0f` to `x`), so its result is followed in turn.

use coil_ir::kernel::{flat_stmts, TileKernel, TileOp, TileStmt, Var};
use coil_ir::DType;
use indexmap::{IndexMap, IndexSet};

/// One reader of a value.
enum Use {
    /// Stored into a buffer of this dtype.
    Store(DType),
    /// Read by the op defining `var`, of dtype `dtype`.
    Op { var: Var, dtype: DType, op: TileOp },
    /// Folded into an accumulator.
    Fold,
}

/// The bf16 loads of `k` (the variables they define) whose NaN bits may reach an f32 store.
pub(super) fn loads_to_quiet(k: &TileKernel) -> IndexSet<Var> {
    let mut dtypes: IndexMap<Var, DType> = IndexMap::new();
    let mut uses: IndexMap<Var, Vec<Use>> = IndexMap::new();
    let mut loads = Vec::new();
    for s in flat_stmts(&k.body) {
        match s {
            TileStmt::Let { var, dtype, op, .. } => {
                dtypes.insert(*var, *dtype);
                if let TileOp::Load { arg, .. } | TileOp::MaskedLoad { arg, .. } | TileOp::IndirectLoad { arg, .. } = op
                {
                    if k.args[*arg].dtype == DType::BF16 {
                        loads.push(*var);
                    }
                }
                for v in op.operands() {
                    uses.entry(v).or_default().push(Use::Op { var: *var, dtype: *dtype, op: op.clone() });
                }
            }
            TileStmt::Store { arg, value, .. } => uses.entry(*value).or_default().push(Use::Store(k.args[*arg].dtype)),
            s => s.reads().into_iter().for_each(|v| uses.entry(v).or_default().push(Use::Fold)),
        }
    }
    let mut memo = IndexMap::new();
    loads.into_iter().filter(|&v| reaches_f32_store(v, &dtypes, &uses, &mut memo)).collect()
}

/// Whether the NaN bits of `v` may reach an f32 store (see the module doc).
fn reaches_f32_store(
    v: Var,
    dtypes: &IndexMap<Var, DType>,
    uses: &IndexMap<Var, Vec<Use>>,
    memo: &mut IndexMap<Var, bool>,
) -> bool {
    if let Some(&known) = memo.get(&v) {
        return known;
    }
    memo.insert(v, false); // definitions come before uses: no cycle, but never loop
    let from = dtypes.get(&v).copied().unwrap_or(DType::F32);
    let mut reaches = false;
    for u in uses.get(&v).into_iter().flatten() {
        reaches |= match u {
            Use::Store(d) => *d == DType::F32,
            Use::Fold => false,
            Use::Op { dtype, .. } if !dtype.is_float() => false,
            Use::Op { dtype, op: TileOp::Cast(_), .. }
                if matches!(dtype, DType::BF16 | DType::F16) && *dtype != from =>
            {
                false
            }
            Use::Op { dtype: DType::F64, .. } if from != DType::F64 => false,
            Use::Op { var, .. } => reaches_f32_store(*var, dtypes, uses, memo),
        };
        if reaches {
            break;
        }
    }
    memo.insert(v, reaches);
    reaches
}
