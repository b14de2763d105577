//! Row loops: f32 lane sums in blocks ([`super::rloop`]), bf16 loads that keep their NaN
//! bits ([`super::quiet`]), and the exponential of a softmax's terms ([`super::softmax`]).

use super::*;
use crate::testutil::*;
use coil_ir::loops::ScalarOp;
use half::bf16;

/// `x.sum(1)` of an f32 `[rows, cols]`, one looped kernel.
fn row_sum(rows: usize, cols: usize) -> (coil_ir::loops::LoopProgram, coil_ir::kernel::FusedKernel) {
    let f = DType::F32;
    let mut p = Prog::default();
    let x = p.input(&[rows, cols], f);
    let (xv, rv) = (xs(&[rows])[0], rs(&[cols])[0]);
    let mut b = B::default();
    let l = b.load(x, xv * cols as i64 + rv, f);
    let sum = p.reduction(&[rows], &[cols], ReduceOp::Sum, f, b.done(l));
    p.output(sum);
    (p.p, kernel("red_fused_sum_0", KernelKind::LoopedReduction, vec![0], rows, Some(cols), vec![sum]))
}

/// Rows shorter than a block, of whole blocks and of blocks and a part, whose terms cancel
/// (magnitudes 1e3 with a sum near 0, and small terms beside them): every sum is within the
/// bound of `rloop`'s doc of the exact one.
#[test]
fn float_sums_add_in_lanes_by_blocks() {
    let block = rloop::SUM_BLOCK as usize;
    for cols in [100, block, 2 * block + 1808] {
        let rows = 3;
        let (p, k) = row_sum(rows, cols);
        let (lib, tiles) = build_and_compile(&p, &[k]);
        let c = emit_kernel(&tiles[0]);
        assert!(c.contains("#pragma omp simd reduction(+:lacc1)") && c.contains("acc1 += (double)lacc1;"), "{c}");
        assert_eq!(c.contains(&format!("rblock += {block}")), cols > block, "{c}");
        let mut x: Vec<f32> = (0..rows * cols)
            .map(|i| match i % 4 {
                0 => 1000.0 + (i % 97) as f32,
                1 => -1000.0 - (i % 97) as f32,
                _ => ((i * 7919) % 1000) as f32 * 1e-3 - 0.5,
            })
            .collect();
        let mut out = vec![0f32; rows];
        assert_eq!(lib.run("red_fused_sum_0", &[ptr(&mut x), ptr(&mut out)]), [0; 4]);
        for r in 0..rows {
            let row = &x[r * cols..(r + 1) * cols];
            let exact: f64 = row.iter().map(|&v| v as f64).sum();
            let magnitude: f64 = row.iter().map(|&v| (v as f64).abs()).sum();
            let u = f32::EPSILON as f64 / 2.0;
            // the bound for 8 lanes (AVX2; AVX-512 has 16, half of it)
            let bound = (block as f64 / 8.0 + 3.0) * u * magnitude + u * exact.abs();
            let err = (out[r] as f64 - exact).abs();
            assert!(err <= bound, "cols {cols} row {r}: {} vs {exact} (error {err:e}, bound {bound:e})", out[r]);
        }
    }
}

/// bf16 `x` widened to f32 and stored as f32 (the NaN bits are seen: quieted, as the
/// interpreter does), and `x * 2` stored as bf16 (the bits as they are: the product quiets).
#[test]
fn bf16_loads_quiet_nans_only_where_an_f32_store_sees_them() {
    let n = 6;
    let bits: Vec<u16> = vec![0x7f81, 0xff81, 0x7fc1, 0x3f80, 0x0001, 0xc2f7]; // sNaNs, qNaN, 1, tiny, -123.5
    for to in [DType::F32, DType::BF16] {
        let mut p = Prog::default();
        let x = p.input(&[n], DType::BF16);
        let v = xs(&[n])[0];
        let mut b = B::default();
        let l = b.load(x, v, DType::BF16);
        let r = if to == DType::F32 {
            b.push(ScalarOp::Cast(l), DType::F32)
        } else {
            let two = b.constant(2.0, DType::BF16);
            b.binary(BinaryOp::Mul, l, two, DType::BF16)
        };
        let out = p.pointwise(&[n], to, b.done(r));
        p.output(out);
        let k = kernel("poi_fused_widen_0", KernelKind::Pointwise, vec![0], n, None, vec![out]);
        let (lib, tiles) = build_and_compile(&p.p, &[k]);
        let c = emit_kernel(&tiles[0]);
        let mut xv = bits.clone();
        let quieted = |h: u16| bf16::from_bits(h).to_f32();
        if to == DType::F32 {
            assert!(c.contains("coil_bf16_to_f32(") && !c.contains("coil_bf16_bits_f32("), "{c}");
            let mut o = vec![0f32; n];
            lib.run("poi_fused_widen_0", &[ptr(&mut xv), ptr(&mut o)]);
            for i in 0..n {
                assert_eq!(o[i].to_bits(), quieted(bits[i]).to_bits(), "{:#06x}", bits[i]);
            }
        } else {
            assert!(c.contains("coil_bf16_bits_f32(") && !c.contains("coil_bf16_to_f32("), "{c}");
            let mut o = vec![0u16; n];
            lib.run("poi_fused_widen_0", &[ptr(&mut xv), ptr(&mut o)]);
            for i in 0..n {
                let want = bf16::from_f32(quieted(bits[i]) * 2.0).to_bits();
                assert_eq!(o[i], want, "{:#06x}", bits[i]);
            }
        }
    }
}

/// `coil_exp_nonpositive_f32` (a softmax's terms) is `coil_exp_f32` bit for bit up to 89 and
/// for NaN, in vector loops (the runtime's flags) and scalar code: every 251st f32 below 89,
/// and the edges. (The whole range was compared once: 2^31 + 2^30 values, no difference.)
#[test]
fn exp_nonpositive_is_exp() {
    let src = format!(
        "{}
void both(const float *x, float *a, float *b, int64_t n) {{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) a[i] = coil_exp_f32(x[i]);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) b[i] = coil_exp_nonpositive_f32(x[i]);
}}
",
        prelude()
    );
    let mut x: Vec<f32> = (0..u32::MAX / 251).map(|i| f32::from_bits(i * 251)).filter(|v| !(*v > 89.0)).collect();
    x.extend([89.0, -103.97, -104.0, -104.01, f32::NEG_INFINITY, f32::NAN, -0.0, 0.0]);
    x.extend([0x7f80_0001u32, 0xffc0_1234].map(f32::from_bits));
    for opt in ["-O3 -march=native", "-O0"] {
        let lib = crate::testutil::compile_with(&src, opt);
        let (mut a, mut b) = (vec![0f32; x.len()], vec![0f32; x.len()]);
        // SAFETY: the C function's type.
        let both: unsafe extern "C" fn(*const f32, *mut f32, *mut f32, i64) = unsafe { lib.function("both") };
        unsafe { both(x.as_ptr(), a.as_mut_ptr(), b.as_mut_ptr(), x.len() as i64) };
        let differ: Vec<(f32, f32, f32)> =
            (0..x.len()).filter(|&i| a[i].to_bits() != b[i].to_bits()).map(|i| (x[i], a[i], b[i])).take(5).collect();
        assert!(differ.is_empty(), "{opt}: (x, exp, exp_nonpositive) {differ:?}");
    }
}
