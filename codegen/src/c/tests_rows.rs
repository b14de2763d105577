//! Row loops: f32 lane sums in blocks ([`super::rloop`]), bf16 loads that keep their NaN
//! bits ([`super::quiet`]), and the exponential of a softmax's terms ([`super::softmax`]).

use super::*;
use crate::testutil::*;
use coil_ir::loops::ScalarOp;
use coil_ir::UnaryOp;
use half::bf16;

/// Rows shorter than a block, of whole blocks and of blocks and a part, whose terms cancel
/// (magnitudes 1e3 with a sum near 0, and small terms beside them): every sum is within the
/// bound of `rloop`'s doc of the exact one, whole blocks read as streams.
#[test]
fn float_sums_add_in_lanes_by_blocks() {
    let block = rloop::SUM_BLOCK as usize;
    for cols in [100, block, 2 * block + 1808] {
        let rows = 3;
        let (p, k) = sum_dim(rows, cols, 1, KernelKind::LoopedReduction);
        let (lib, tiles) = build_and_compile(&p, std::slice::from_ref(&k));
        let c = emit_kernel(&tiles[0]);
        assert!(c.contains("#pragma omp simd reduction(+:lacc1)") && c.contains("acc1 += (double)lacc1;"), "{c}");
        assert_eq!(c.contains(&format!("rblock += {block}")), cols > block, "{c}");
        // Whole blocks in streams; a row with a partial block also has the one-stream loop.
        let streams = format!("for (int64_t rstream = 0; rstream < {}; rstream++)", rloop::STREAMS);
        assert_eq!(c.contains(&streams), cols > block, "{c}");
        assert_eq!(c.contains(&format!("if (rcount == {block}) {{")), cols > block && cols % block != 0, "{c}");
        let mut x: Vec<f32> = (0..rows * cols)
            .map(|i| match i % 4 {
                0 => 1000.0 + (i % 97) as f32,
                1 => -1000.0 - (i % 97) as f32,
                _ => ((i * 7919) % 1000) as f32 * 1e-3 - 0.5,
            })
            .collect();
        let mut out = vec![0f32; rows];
        assert_eq!(lib.run(&k.name, &[ptr(&mut x), ptr(&mut out)]), [0; 4]);
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

/// `coil_exp_nonpositive_f32` (a softmax's terms) is `coil_exp_f32` bit for bit on [-87, 88],
/// NaN for NaN (its payload as the arithmetic carries it: quiet), and 0 below -87, in vector loops (the runtime's flags) and scalar code: every
/// 251st f32 below 88, and the edges.
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
    let mut x: Vec<f32> =
        (0..u32::MAX / 251).map(|i| f32::from_bits(i * 251)).filter(|v| v.is_nan() || *v <= 88.0).collect();
    x.extend([88.0, -86.99, -87.0, -87.01, -104.0, f32::NEG_INFINITY, f32::NAN, -0.0, 0.0]);
    x.extend([0x7f80_0001u32, 0xffc0_1234].map(f32::from_bits));
    let want = |x: f32, exp: f32| if x < -87.0 { 0.0 } else { exp };
    for opt in ["-O3 -march=native", "-O0"] {
        let lib = crate::testutil::compile_with(&src, opt);
        let (mut a, mut b) = (vec![0f32; x.len()], vec![0f32; x.len()]);
        // SAFETY: the C function's type.
        let both: unsafe extern "C" fn(*const f32, *mut f32, *mut f32, i64) = unsafe { lib.function("both") };
        unsafe { both(x.as_ptr(), a.as_mut_ptr(), b.as_mut_ptr(), x.len() as i64) };
        let differ: Vec<(f32, f32, f32)> = (0..x.len())
            .filter(|&i| want(x[i], a[i]).to_bits() != b[i].to_bits() && !(a[i].is_nan() && b[i].is_nan()))
            .map(|i| (x[i], a[i], b[i]))
            .take(5)
            .collect();
        assert!(differ.is_empty(), "{opt}: (x, exp, exp_nonpositive) {differ:?}");
    }
}

/// A Gaussian's `exp(-(x * x))` (the erf GELU's gradient) and `2 exp(-x ** 2)` call
/// `coil_exp_nonpositive_f32`; `exp(-x)` and `exp(-(x * y))`, whose arguments may be positive,
/// keep `coil_exp_f32`. Values: within 2 ulp of the f64 exponential of the f32 argument, but
/// 0 where `-(x * x) < -87` (`coil_exp_nonpositive_f32`'s cut) and for infinite x; NaN for NaN.
#[test]
fn exp_of_a_negated_square_takes_the_nonpositive_exp() {
    let f = DType::F32;
    let n = 4099;
    let mut p = Prog::default();
    let (x, y) = (p.input(&[n], f), p.input(&[n], f));
    let v = xs(&[n])[0];
    let mut outs = Vec::new();
    for form in 0..4 {
        let mut b = B::default();
        let lx = b.load(x, v, f);
        let two = b.constant(2.0f32, f);
        let arg = match form {
            0 => b.binary(BinaryOp::Mul, lx, lx, f),
            1 => b.binary(BinaryOp::Pow, lx, two, f),
            2 => lx,
            _ => {
                let ly = b.load(y, v, f);
                b.binary(BinaryOp::Mul, lx, ly, f)
            }
        };
        let neg = b.unary(UnaryOp::Neg, arg, f);
        let mut e = b.unary(UnaryOp::Exp, neg, f);
        if form == 1 {
            // (the emitter writes `x ** 2` as `x * x`: a use of the constant, for -Werror)
            e = b.binary(BinaryOp::Mul, e, two, f);
        }
        outs.push(p.pointwise(&[n], f, b.done(e)));
    }
    let k = kernel("poi_fused_exp_mul_neg_0", KernelKind::Pointwise, vec![0, 1, 2, 3], n, None, outs);
    let (lib, tiles) = build_and_compile(&p.p, &[k]);
    let c = emit_kernel(&tiles[0]);
    assert_eq!(c.matches("coil_exp_nonpositive_f32(tmp").count(), 2, "{c}");
    assert_eq!(c.matches("coil_exp_f32(tmp").count(), 2, "{c}");
    let mut xv: Vec<f32> = (0..n).map(|i| (i as f32 - 2049.0) / 128.0).collect();
    xv[..4].copy_from_slice(&[f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -0.0]);
    let mut yv: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 / 25.0 - 2.0).collect();
    let mut o: Vec<Vec<f32>> = vec![vec![0f32; n]; 4];
    let [o0, o1, o2, o3] = &mut o[..] else { unreachable!() };
    // (arguments in order of first use: y is first read by the fourth output)
    lib.run("poi_fused_exp_mul_neg_0", &[ptr(&mut xv), ptr(o0), ptr(o1), ptr(o2), ptr(&mut yv), ptr(o3)]);
    for i in 0..n {
        let (x, y) = (xv[i] as f64, yv[i] as f64);
        let square = -(x * x);
        for (form, scale, arg) in [(0, 1.0, square), (1, 2.0, square), (2, 1.0, -x), (3, 1.0, -((x * y) as f32 as f64))]
        {
            let (got, want) = (o[form][i] as f64, scale * arg.exp());
            let ok = if want.is_nan() {
                got.is_nan()
            } else if arg < -87.0 && form < 2 {
                // (`coil_exp_nonpositive_f32`'s cut: 0 below -87, e^-87 = 1.65e-38)
                got == 0.0 && want <= scale * 1.65e-38
            } else {
                (got - want).abs() <= 2.4e-7 * want.abs() + 1e-45 || (want.is_infinite() && got == want)
            };
            assert!(ok, "form {form}, x = {x}, y = {y}: {got} vs {want}");
        }
    }
}

/// `h = x + y` (an output) and `(h - mean(h)) / sqrt(var(h) + 1e-5)` over rows of `cols`, one
/// looped kernel: a residual add and a layer norm, whose three passes each need `h`.
fn add_norm(cols: usize) -> (coil_ir::loops::LoopProgram, coil_ir::kernel::FusedKernel) {
    let f = DType::F32;
    let mut p = Prog::default();
    let (x, y) = (p.input(&[2, cols], DType::BF16), p.input(&[2, cols], DType::BF16));
    let v = xs(&[2, cols]);
    let mut b = B::default();
    let (lx, ly) =
        (b.load(x, v[0] * cols as i64 + v[1], DType::BF16), b.load(y, v[0] * cols as i64 + v[1], DType::BF16));
    let s = b.binary(BinaryOp::Add, lx, ly, DType::BF16);
    let h = p.pointwise(&[2, cols], DType::BF16, b.done(s));
    let (xv, rv) = (xs(&[2])[0], rs(&[cols])[0]);
    let load_h = |b: &mut B| {
        let l = b.load(h, xv * cols as i64 + rv, DType::BF16);
        b.push(ScalarOp::Cast(l), f)
    };
    let mut b = B::default();
    let l = load_h(&mut b);
    let sum = p.reduction(&[2], &[cols], ReduceOp::Sum, f, b.done(l));
    let mut b = B::default();
    let (s, n) = (b.load(sum, xv, f), b.constant(cols as f64, f));
    let q = b.binary(BinaryOp::Div, s, n, f);
    let mean = p.pointwise(&[2], f, b.done(q));
    let mut b = B::default();
    let l = load_h(&mut b);
    let m = b.load(mean, xv, f);
    let d = b.binary(BinaryOp::Sub, l, m, f);
    let sq = b.binary(BinaryOp::Mul, d, d, f);
    let ss = p.reduction(&[2], &[cols], ReduceOp::Sum, f, b.done(sq));
    let mut b = B::default();
    let (s, n, eps) = (b.load(ss, xv, f), b.constant(cols as f64, f), b.constant(1e-5, f));
    let q = b.binary(BinaryOp::Div, s, n, f);
    let q = b.binary(BinaryOp::Add, q, eps, f);
    let r = b.unary(UnaryOp::Rsqrt, q, f);
    let rstd = p.pointwise(&[2], f, b.done(r));
    let mut b = B::default();
    let l = b.load(h, v[0] * cols as i64 + v[1], DType::BF16);
    let l = b.push(ScalarOp::Cast(l), f);
    let (m, r) = (b.load(mean, v[0], f), b.load(rstd, v[0], f));
    let d = b.binary(BinaryOp::Sub, l, m, f);
    let o = b.binary(BinaryOp::Mul, d, r, f);
    let out = p.pointwise(&[2, cols], f, b.done(o));
    p.output(h);
    p.output(out);
    (
        p.p,
        kernel(
            "red_fused_add_norm_0",
            KernelKind::LoopedReduction,
            vec![0, 1, 2, 3, 4, 5],
            2,
            Some(cols),
            vec![h, out],
        ),
    )
}

/// The passes after the first read `h` from the array the first one filled (no loads of `x`
/// and `y` after it), and the results are the definition's.
#[test]
fn later_passes_read_kept_values() {
    let cols = 1500;
    let (p, k) = add_norm(cols);
    let (lib, tiles) = build_and_compile(&p, &[k]);
    let c = emit_kernel(&tiles[0]);
    let after_first = &c[c.find("acc").unwrap()..];
    let second_loop = &after_first[after_first.find("(double)").unwrap()..];
    assert!(c.contains(&format!("[{cols}];")) && !second_loop.contains("in_ptr1["), "{c}");
    // the last pass stores two rows: no prefetches (`prefetch::MAX_STORED_ROWS`)
    assert!(!c.contains("COIL_PREFETCH"), "{c}");
    let bits = |i: usize| bf16::from_f32(((i * 7919) % 1000) as f32 / 100.0 - 5.0).to_bits();
    let mut x: Vec<u16> = (0..2 * cols).map(bits).collect();
    let mut y: Vec<u16> = (0..2 * cols).map(|i| bits(i + 17)).collect();
    let (mut h, mut out) = (vec![0u16; 2 * cols], vec![0f32; 2 * cols]);
    // arguments in order of first use
    assert_eq!(lib.run("red_fused_add_norm_0", &[ptr(&mut x), ptr(&mut y), ptr(&mut h), ptr(&mut out)]), [0; 4]);
    for r in 0..2 {
        // the kernel keeps `h` in f32 (exact here), rounding it only where it stores it
        let hs: Vec<f32> = (r * cols..(r + 1) * cols)
            .map(|i| bf16::from_bits(x[i]).to_f32() + bf16::from_bits(y[i]).to_f32())
            .collect();
        let mean = hs.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
        let var = hs.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
        for c in 0..cols {
            assert_eq!(h[r * cols + c], bf16::from_f32(hs[c]).to_bits());
            let want = (hs[c] as f64 - mean) / (var + 1e-5).sqrt();
            assert!((out[r * cols + c] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0), "[{r}, {c}]");
        }
    }
}
