//! The last pass of a row kernel prefetches the next row ([`super::prefetch`]).

use super::*;
use crate::testutil::*;

/// Softmax rows of whole blocks (looped) and of blocks and a part (persistent): the last pass
/// asks for the next row's lines, and whole calls and calls over ranges (whose last row asks
/// for itself) give the definition's values.
#[test]
fn the_last_pass_prefetches_the_next_row() {
    for (kind, cols) in [(KernelKind::LoopedReduction, 4096), (KernelKind::PersistentReduction, 1000)] {
        let rows = 5;
        let name = if kind == KernelKind::PersistentReduction { "per_fused_softmax_0" } else { "red_fused_softmax_0" };
        let (p, k) = softmax(rows, cols, kind, name);
        let (lib, tiles) = build_and_compile(&p, &[k]);
        let c = emit_kernel(&tiles[0]);
        assert!(c.contains("const int64_t xnext = xindex + 1 < xend ? xindex + 1 : xindex;"), "{c}");
        // 64 f32 positions a block: four lines, the last three inside a part block only
        let last = format!("COIL_PREFETCH(&in_ptr0[rblock + {cols}*xnext + 48]);");
        if cols % 64 == 0 {
            assert!(c.contains(&format!("            {last}")), "{c}");
        } else {
            assert!(c.contains(&format!("if (48 < rcount) {last}")), "{c}");
        }
        // once: the last pass only
        assert_eq!(c.matches(&format!("COIL_PREFETCH(&in_ptr0[rblock + {cols}*xnext]);")).count(), 1, "{c}");
        let mut x = softmax_input(rows * cols);
        let mut whole = vec![0f32; rows * cols];
        assert_eq!(lib.run(name, &[ptr(&mut x), ptr(&mut whole)]), [0; 4]);
        assert_softmax_rows(&x, &whole, cols, &format!("{kind:?}"));
        let mut parts = vec![7f32; rows * cols];
        let args = [ptr(&mut x), ptr(&mut parts)];
        for range in [[0, 2], [2, 3], [3, rows as i64]] {
            assert_eq!(lib.run_range(name, &args, &[], &[], Some(range)), [0; 4]);
        }
        assert!(parts == whole, "{kind:?}: ranges differ from the whole call");
    }
}

/// A kernel of one pass (a row sum reads its row once) and rows shorter than a block take no
/// prefetches.
#[test]
fn one_pass_and_short_rows_take_none() {
    let (p, k) = sum_dim(3, 5000, 1, KernelKind::LoopedReduction);
    let (_, tiles) = build_and_compile(&p, &[k]);
    let c = emit_kernel(&tiles[0]);
    assert!(!c.contains("COIL_PREFETCH") && !c.contains("xnext"), "{c}");
    let (p, k) = softmax(4, 63, KernelKind::PersistentReduction, "per_fused_softmax_0");
    let (_, tiles) = build_and_compile(&p, &[k]);
    let c = emit_kernel(&tiles[0]);
    assert!(!c.contains("COIL_PREFETCH") && !c.contains("xnext"), "{c}");
}
