//! The generated C, compiled with the system `cc` and run on small buffers.

use super::*;
use crate::testutil::*;
use crate::tile::build_kernel;
use coil_ir::kernel::FusedKernel;
use coil_ir::loops::{range_var, reduction_var, LoopProgram, ScalarOp};
use coil_ir::sym::Expr;
use coil_ir::{philox, BinaryOp, DType, ReduceOp, UnaryOp};
use half::{bf16, f16};

fn snapshot(name: &str, text: String) {
    insta::with_settings!({ snapshot_path => "../snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(name, text);
    });
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol * want.abs().max(1.0) || (got.is_nan() && want.is_nan())
}

#[test]
fn pointwise_chain_f32_and_bf16() {
    let (p, k) = crate::tile::tests::pointwise_chain(DType::F32);
    let (lib, _) = build_and_compile(&p, &[k]);
    let mut x: Vec<f32> = (0..32).map(|i| i as f32 * 0.37 - 5.0).collect();
    x[3] = f32::NAN;
    let mut out = vec![0f32; 32];
    assert_eq!(lib.run("poi_fused_add_mul_relu_0", &[ptr(&mut x), ptr(&mut out)]), [0; 4]);
    for i in 0..32 {
        let want = if x[i].is_nan() { f32::NAN } else { (x[i] * 2.0 + 1.0).max(0.0) };
        assert!(close(out[i] as f64, want as f64, 0.0), "{i}: {} vs {want}", out[i]);
    }

    let (p, k) = crate::tile::tests::pointwise_chain(DType::BF16);
    let (lib, tiles) = build_and_compile(&p, &[k]);
    snapshot("c_pointwise_bf16", emit_kernel(&tiles[0]));
    let xf: Vec<f32> = (0..32).map(|i| i as f32 * 0.37 - 5.0).collect();
    let mut x: Vec<u16> = xf.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    let mut out = vec![0u16; 32];
    lib.run("poi_fused_add_mul_relu_0", &[ptr(&mut x), ptr(&mut out)]);
    for i in 0..32 {
        // computed in f32 from the bf16 input, rounded once on store
        let xi = bf16::from_bits(x[i]).to_f32();
        let want = bf16::from_f32((xi * 2.0 + 1.0).max(0.0));
        assert_eq!(out[i], want.to_bits(), "{i}");
    }
}

fn check_softmax(rows: usize, cols: usize, kind: KernelKind) -> String {
    let name = if kind == KernelKind::PersistentReduction { "per_fused_softmax_0" } else { "red_fused_softmax_0" };
    let (p, k) = softmax(rows, cols, kind, name);
    let (lib, tiles) = build_and_compile(&p, &[k]);
    let mut x = softmax_input(rows * cols);
    let mut out = vec![0f32; rows * cols];
    assert_eq!(lib.run(name, &[ptr(&mut x), ptr(&mut out)]), [0; 4]);
    assert_softmax_rows(&x, &out, cols, &format!("{kind:?}"));
    emit_kernel(&tiles[0])
}

#[test]
fn large_pointwise_runs_whole_or_in_ranges() {
    // 2^16 elements in a `simd` loop; one kernel stores f32 and the same value as f16.
    let n = 1 << 16;
    let mut p = Prog::default();
    let x = p.input(&[n], DType::F32);
    let v = xs(&[n])[0];
    let mut outs = Vec::new();
    for d in [DType::F32, DType::F16] {
        let mut b = B::default();
        let l = b.load(x, v, DType::F32);
        let t = b.unary(UnaryOp::Tanh, l, DType::F32);
        let c = b.push(ScalarOp::Cast(t), d);
        outs.push(p.pointwise(&[n], d, b.done(c)));
    }
    let k = kernel("poi_fused_tanh_0", KernelKind::Pointwise, vec![0, 1], n, None, outs);
    let (lib, tiles) = build_and_compile(&p.p, &[k]);
    assert!(emit_kernel(&tiles[0]).contains("#pragma omp simd\n"));
    let mut xv: Vec<f32> = (0..n).map(|i| (i as f32 - 32768.0) / 4096.0).collect();
    let (mut o32, mut o16) = (vec![0f32; n], vec![0u16; n]);
    lib.run("poi_fused_tanh_0", &[ptr(&mut xv), ptr(&mut o32), ptr(&mut o16)]);
    for i in 0..n {
        let want = (xv[i] as f64).tanh();
        assert!(close(o32[i] as f64, want, 2e-7), "{i}: {} vs {want}", o32[i]);
        assert_eq!(o16[i], f16::from_f32(o32[i]).to_bits(), "{i}");
    }
    // Two calls over [0, 1000) and [1000, n), as the runtime's threads make them, write the
    // same elements, and a call writes nothing outside its range.
    let (mut p32, mut p16) = (vec![7f32; n], vec![0u16; n]);
    let args = [ptr(&mut xv), ptr(&mut p32), ptr(&mut p16)];
    lib.run_range("poi_fused_tanh_0", &args, &[], &[], Some([0, 1000]));
    assert!(p32[..1000] == o32[..1000] && p32[1000..].iter().all(|&v| v == 7.0));
    lib.run_range("poi_fused_tanh_0", &args, &[], &[], Some([1000, n as i64]));
    assert!(p32 == o32 && p16 == o16);
}

#[test]
fn softmax_persistent() {
    let c = check_softmax(4, 8, KernelKind::PersistentReduction);
    snapshot("c_softmax_persistent", c);
    check_softmax(64, 1000, KernelKind::PersistentReduction); // parallel, rows in arrays
}

#[test]
fn softmax_looped() {
    let c = check_softmax(3, 2000, KernelKind::LoopedReduction);
    snapshot("c_softmax_looped", c);
}

#[test]
fn mean_var_persistent_and_looped() {
    for (kind, cols) in [(KernelKind::PersistentReduction, 6), (KernelKind::LoopedReduction, 1500)] {
        let (p, k) = crate::tile::tests::mean_var(kind, cols);
        let (lib, tiles) = build_and_compile(&p, &[k]);
        let mut x: Vec<f32> = (0..2 * cols).map(|i| (i % 13) as f32 * 0.5 + (i / cols) as f32).collect();
        let (mut var, mut centered) = (vec![0f32; 2], vec![0f32; 2 * cols]);
        lib.run(&tiles[0].name, &[ptr(&mut x), ptr(&mut var), ptr(&mut centered)]);
        for r in 0..2 {
            let row: Vec<f64> = x[r * cols..(r + 1) * cols].iter().map(|&v| v as f64).collect();
            let mean = (row.iter().sum::<f64>() / cols as f64) as f32 as f64;
            let want = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
            assert!(close(var[r] as f64, want, 1e-6), "{kind:?} var[{r}] = {} vs {want}", var[r]);
            for c in 0..cols {
                assert_eq!(centered[r * cols + c], (row[c] - mean) as f32);
            }
        }
        if kind == KernelKind::PersistentReduction {
            snapshot("c_mean_var_persistent", emit_kernel(&tiles[0]));
        }
    }
}

#[test]
fn argmax_nan_and_ties() {
    let nan = f32::NAN;
    for cols in [5, 1500] {
        let (p, k) = crate::tile::tests::argmax(4, cols);
        let (lib, _) = build_and_compile(&p, &[k]);
        let mut x = vec![0f32; 4 * cols];
        let rows: [&[(usize, f32)]; 4] = [
            &[(1, 3.0), (3, 3.0)],                   // tie: first index
            &[(0, 1.0), (2, nan), (4, nan)],         // NaN is the max, the first NaN wins
            &[(0, nan)],                             // NaN first
            &[(cols - 1, f32::INFINITY), (1, 1e30)], // the last element
        ];
        for (r, sets) in rows.iter().enumerate() {
            x[r * cols..(r + 1) * cols].fill(-1.0);
            for &(c, v) in *sets {
                x[r * cols + c] = v;
            }
        }
        let mut out = vec![-7i64; 4];
        lib.run("per_fused_argmax_0", &[ptr(&mut x), ptr(&mut out)]);
        assert_eq!(out, [1, 2, 0, cols as i64 - 1], "cols = {cols}");
    }
}

#[test]
fn indirect_load_checks_bounds() {
    let (p, k) = crate::tile::tests::embedding();
    let (lib, tiles) = build_and_compile(&p, &[k]);
    let c = emit_kernel(&tiles[0]);
    assert!(!c.contains("simd"), "an indirect load may write status: no simd\n{c}");
    snapshot("c_embedding", c);
    let mut table: Vec<u16> = (0..20).map(|i| bf16::from_f32(i as f32).to_bits()).collect();
    let mut out = vec![0u16; 12];
    let mut idx = vec![4i64, 0, 2];
    // arguments in order of first use: the indices are read before the table
    assert_eq!(tiles[0].args.iter().map(|a| a.buffer.0).collect::<Vec<_>>(), [1, 0, 2]);
    assert_eq!(lib.run("poi_fused_embedding_0", &[ptr(&mut idx), ptr(&mut table), ptr(&mut out)]), [0; 4]);
    let got: Vec<f32> = out.iter().map(|&b| bf16::from_bits(b).to_f32()).collect();
    let want: Vec<f32> = [16., 17., 18., 19., 0., 1., 2., 3., 8., 9., 10., 11.].to_vec();
    assert_eq!(got, want);
    let mut idx = vec![1i64, 5, -1];
    let status = lib.run("poi_fused_embedding_0", &[ptr(&mut idx), ptr(&mut table), ptr(&mut out)]);
    assert_eq!(status[0], status::INDEX_OUT_OF_RANGE);
    assert!(status[1] == 5 || status[1] == -1, "{status:?}");
    assert_eq!(status[2], 5);
    assert!(out[4..].iter().all(|&b| b == 0), "out-of-range rows read nothing: {out:?}");
}

/// A cache write stores its values in the window at the position it reads, and nothing at all
/// when the window reaches outside the cache (recording the first position outside, as the
/// interpreter's scatter names it): the window is checked once, before the loop, which is a
/// plain `simd` loop of stores.
#[test]
fn scatter_store_writes_at_the_run_time_position_and_checks_it() {
    let (p, k) = crate::tile::tests::cache_write();
    let (lib, tiles) = build_and_compile(&p, &[k]);
    let c = emit_kernel(&tiles[0]);
    assert_eq!(c.matches("coil_index_error(").count(), 1, "one check, before the loop\n{c}");
    assert!(c.contains("#pragma omp simd"), "the loop stores plainly\n{c}");
    snapshot("c_cache_write", c);
    let new: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - 2.0).collect();
    let cache: Vec<f32> = (0..64).map(|i| 100.0 + i as f32).collect();
    for pos in [0i64, 3, 5, 6, -1, 8, 100] {
        let (mut n, mut out, mut at) = (new.clone(), cache.clone(), vec![pos]);
        let status = lib.run("poi_fused_exp_scatter_0", &[ptr(&mut at), ptr(&mut n), ptr(&mut out)]);
        let inside = (0..=5).contains(&pos);
        for b in 0..2 {
            for s in 0..8i64 {
                for d in 0..4 {
                    let (o, t) = (((b * 8 + s) * 4 + d) as usize, s - pos);
                    // (the prelude's exp is within a few ulp of the C library's)
                    let written = inside && (0..3).contains(&t);
                    let want = if written { new[(b * 12 + t * 4 + d) as usize].exp() } else { cache[o] };
                    assert!((out[o] - want).abs() <= 1e-6 * want.abs(), "pos {pos} at [{b}, {s}, {d}]: {}", out[o]);
                }
            }
        }
        match pos {
            6 | 8 => assert_eq!(status[..3], [status::INDEX_OUT_OF_RANGE, 8, 8]),
            -1 | 100 => assert_eq!(status[..3], [status::INDEX_OUT_OF_RANGE, pos, 8]),
            _ => assert_eq!(status, [0; 4], "pos {pos}"),
        }
    }
}

/// `a op b` over i32 `[n]`, one pointwise kernel.
fn int_binary(op: BinaryOp, d: DType, n: usize) -> (LoopProgram, Vec<FusedKernel>) {
    let mut p = Prog::default();
    let (a, b_) = (p.input(&[n], d), p.input(&[n], d));
    let v = xs(&[n])[0];
    let mut b = B::default();
    let (la, lb) = (b.load(a, v, d), b.load(b_, v, d));
    let r = b.binary(op, la, lb, d);
    let out = p.pointwise(&[n], d, b.done(r));
    (p.p, vec![kernel("poi_fused_int_0", KernelKind::Pointwise, vec![0], n, None, vec![out])])
}

#[test]
fn integer_floor_division_remainder_and_pow() {
    let (p, k) = int_binary(BinaryOp::FloorDiv, DType::I32, 6);
    let (lib, _) = build_and_compile(&p, &k);
    let (mut a, mut b) = (vec![7i32, -7, 7, -7, i32::MIN, 5], vec![2i32, 2, -2, -2, -1, 3]);
    let mut out = vec![0i32; 6];
    assert_eq!(lib.run("poi_fused_int_0", &[ptr(&mut a), ptr(&mut b), ptr(&mut out)]), [0; 4]);
    assert_eq!(out, [3, -4, -4, 3, i32::MIN, 1]); // i32::MIN // -1 wraps
    b[5] = 0;
    let status = lib.run("poi_fused_int_0", &[ptr(&mut a), ptr(&mut b), ptr(&mut out)]);
    assert_eq!(status[0], status::DIVISION_BY_ZERO);

    let (p, k) = int_binary(BinaryOp::Remainder, DType::I64, 4);
    let (lib, _) = build_and_compile(&p, &k);
    let (mut a, mut b, mut out) = (vec![7i64, -7, 7, i64::MIN], vec![2i64, 2, -2, -1], vec![9i64; 4]);
    assert_eq!(lib.run("poi_fused_int_0", &[ptr(&mut a), ptr(&mut b), ptr(&mut out)]), [0; 4]);
    assert_eq!(out, [1, 1, -1, 0]);

    let (p, k) = int_binary(BinaryOp::Pow, DType::I64, 4);
    let (lib, _) = build_and_compile(&p, &k);
    let (mut a, mut b, mut out) = (vec![3i64, -2, 2, 0], vec![4i64, 3, 64, 0], vec![9i64; 4]);
    assert_eq!(lib.run("poi_fused_int_0", &[ptr(&mut a), ptr(&mut b), ptr(&mut out)]), [0; 4]);
    assert_eq!(out, [81, -8, 0, 1]);
    b[1] = -1;
    assert_eq!(lib.run("poi_fused_int_0", &[ptr(&mut a), ptr(&mut b), ptr(&mut out)])[0], status::NEGATIVE_POWER);

    let (p, k) = int_binary(BinaryOp::Add, DType::I8, 3);
    let (lib, _) = build_and_compile(&p, &k);
    let (mut a, mut b, mut out) = (vec![100i8, -128, 5], vec![100i8, -1, -6], vec![0i8; 3]);
    lib.run("poi_fused_int_0", &[ptr(&mut a), ptr(&mut b), ptr(&mut out)]);
    assert_eq!(out, [-56, 127, -1], "i8 arithmetic wraps");
}

#[test]
fn float_floor_division_round_sign_and_casts() {
    // One kernel, five outputs: floor_divide, remainder, round, sign, and a cast to i32.
    let f = DType::F32;
    let mut p = Prog::default();
    let (a, b_) = (p.input(&[6], f), p.input(&[6], f));
    let v = xs(&[6])[0];
    let mut outs = Vec::new();
    for which in 0..5 {
        let mut b = B::default();
        let (la, lb) = (b.load(a, v, f), b.load(b_, v, f));
        let r = match which {
            0 => b.binary(BinaryOp::FloorDiv, la, lb, f),
            1 => b.binary(BinaryOp::Remainder, la, lb, f),
            2 => b.unary(UnaryOp::Round, la, f),
            3 => b.unary(UnaryOp::Sign, la, f),
            _ => b.push(ScalarOp::Cast(la), DType::I32),
        };
        let d = if which == 4 { DType::I32 } else { f };
        outs.push(p.pointwise(&[6], d, b.done(r)));
    }
    let k = kernel("poi_fused_misc_0", KernelKind::Pointwise, (0..5).collect(), 6, None, outs);
    let (lib, _) = build_and_compile(&p.p, &[k]);
    let mut x = vec![-7.5f32, 2.5, 0.5, f32::NAN, -0.0, 3e9];
    let mut y = vec![2.0f32, -2.0, -3.0, 1.0, 3.0, 7.0];
    let (mut fd, mut rem, mut rnd, mut sgn, mut cast) =
        (vec![0f32; 6], vec![0f32; 6], vec![0f32; 6], vec![0f32; 6], vec![0i32; 6]);
    let args = [ptr(&mut x), ptr(&mut y), ptr(&mut fd), ptr(&mut rem), ptr(&mut rnd), ptr(&mut sgn), ptr(&mut cast)];
    lib.run("poi_fused_misc_0", &args);
    let bits = |v: &[f32]| v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect::<Vec<_>>();
    assert_eq!(bits(&fd), bits(&[-4.0, -2.0, -1.0, f32::NAN, -0.0, 428571428.0]));
    assert_eq!(bits(&rem), bits(&[0.5, -1.5, -2.5, f32::NAN, -0.0, 3e9f32 % 7.0])); // fmod keeps -0.0
    assert_eq!(bits(&rnd), bits(&[-8.0, 2.0, 0.0, f32::NAN, -0.0, 3e9]));
    assert_eq!(bits(&sgn), bits(&[-1.0, 1.0, 1.0, 0.0, 0.0, 1.0]));
    // 3e9 saturates to i64 and wraps to i32, as the interpreter casts
    assert_eq!(cast, [-7, 2, 0, 0, 0, 3_000_000_000i64 as i32]);
}

/// Compiles the prelude with kernel-shaped wrappers around the conversion helpers.
fn conversion_lib() -> CLib {
    let harness = r#"
void f16_to_f32(char *const *a, int64_t *s) { (void)s; for (int64_t i = 0; i < *(int64_t *)a[2]; i++) ((float *)a[1])[i] = coil_f16_to_f32(((uint16_t *)a[0])[i]); }
void f32_to_f16(char *const *a, int64_t *s) { (void)s; for (int64_t i = 0; i < *(int64_t *)a[2]; i++) ((uint16_t *)a[1])[i] = coil_f32_to_f16(((float *)a[0])[i]); }
void bf16_to_f32(char *const *a, int64_t *s) { (void)s; for (int64_t i = 0; i < *(int64_t *)a[2]; i++) ((float *)a[1])[i] = coil_bf16_to_f32(((uint16_t *)a[0])[i]); }
void f32_to_bf16(char *const *a, int64_t *s) { (void)s; for (int64_t i = 0; i < *(int64_t *)a[2]; i++) ((uint16_t *)a[1])[i] = coil_f32_to_bf16(((float *)a[0])[i]); }
void round_bf16(char *const *a, int64_t *s) { (void)s; for (int64_t i = 0; i < *(int64_t *)a[2]; i++) ((float *)a[1])[i] = coil_round_bf16(((float *)a[0])[i]); }
"#;
    compile(&format!("{}{harness}", prelude()))
}

#[test]
fn signed_zeros_keep_their_sign() {
    let (p, k) = signed_zeros();
    let (lib, _) = build_and_compile(&p, &[k]);
    let mut a = vec![-0.0f32, 0.0, 1.0, -1.0];
    let mut b = vec![0.0f32, -0.0, -0.0, 2.0];
    let mut outs = vec![vec![0f32; 4]; 5];
    let mut args = vec![ptr(&mut a), ptr(&mut b)];
    args.extend(outs.iter_mut().map(|o| ptr(o)));
    assert_eq!(lib.run("poi_fused_signed_zeros_0", &args), [0; 4]);
    let bits = |v: &[f32]| v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect::<Vec<_>>();
    // a tie of zeros gives the first operand; 0.0 and -0.0 stay apart
    assert_eq!(bits(&outs[0]), bits(&[-0.0, 0.0, 1.0, 2.0]), "maximum");
    assert_eq!(bits(&outs[1]), bits(&[-0.0, 0.0, -0.0, -1.0]), "minimum");
    assert_eq!(bits(&outs[2]), bits(&[-0.0, 0.0, 0.0, -0.0]), "a * 0.0");
    assert_eq!(bits(&outs[3]), bits(&[0.0, -0.0, -0.0, 0.0]), "a * -0.0");
    let inf = f32::INFINITY;
    assert_eq!(bits(&outs[4]), bits(&[f32::NAN, f32::NAN, -inf, inf]), "(a + 0.0) / -0.0");
}

#[test]
fn half_conversions_match_the_half_crate() {
    let lib = conversion_lib();
    // every f16 and bf16 bit pattern up
    let mut bits: Vec<u16> = (0..=u16::MAX).collect();
    let mut out = vec![0f32; bits.len()];
    let mut n = bits.len() as i64;
    for (name, to_f32) in [
        ("f16_to_f32", (|b| f16::from_bits(b).to_f32()) as fn(u16) -> f32),
        ("bf16_to_f32", |b| bf16::from_bits(b).to_f32()),
    ] {
        lib.run(name, &[ptr(&mut bits), ptr(&mut out), ptr(std::slice::from_mut(&mut n))]);
        for (&b, &o) in bits.iter().zip(&out) {
            let want: f32 = to_f32(b);
            assert_eq!(o.to_bits(), want.to_bits(), "{name}({b:#06x})");
        }
    }
    // f32 down: every exponent and top mantissa bits, with the low bits that decide rounding
    // (exact, just below/at/above halfway, and a sticky bit), plus named special values
    let mut xs: Vec<f32> = Vec::new();
    for hi in 0..(1u32 << 19) {
        for lo in [0u32, 1, 0xfff, 0x1000, 0x1001, 0x1fff] {
            xs.push(f32::from_bits(hi << 13 | lo));
        }
    }
    for hi in 0..(1u32 << 16) {
        for lo in [0x7fffu32, 0x8000, 0x8001, 0xffff] {
            xs.push(f32::from_bits(hi << 16 | lo));
        }
    }
    xs.extend([
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        65504.0,
        65519.99,
        65520.0,
        5.960_464_5e-8,
        2.980_232_2e-8,
    ]);
    // NaNs with payloads in the bits bf16 drops, signaling or not
    xs.extend([0x7f80_0001u32, 0xff80_0001, 0x7fc0_0001, 0x7fff_ffff, 0xffbf_ffff].map(f32::from_bits));
    let mut n = xs.len() as i64;
    let mut out = vec![0u16; xs.len()];
    for (name, down) in [
        ("f32_to_f16", (|x| f16::from_f32(x).to_bits()) as fn(f32) -> u16),
        ("f32_to_bf16", |x| bf16::from_f32(x).to_bits()),
    ] {
        lib.run(name, &[ptr(&mut xs), ptr(&mut out), ptr(std::slice::from_mut(&mut n))]);
        for (&x, &o) in xs.iter().zip(&out) {
            let want: u16 = down(x);
            assert_eq!(o, want, "{name}({x:e} = {:#010x})", x.to_bits());
        }
    }
    // the in-place bf16 rounding is the round trip down and up
    let mut rounded = vec![0f32; xs.len()];
    lib.run("round_bf16", &[ptr(&mut xs), ptr(&mut rounded), ptr(std::slice::from_mut(&mut n))]);
    for (&x, &r) in xs.iter().zip(&rounded) {
        let want = bf16::from_f32(x).to_f32();
        assert_eq!(r.to_bits(), want.to_bits(), "round_bf16({x:e} = {:#010x})", x.to_bits());
    }
}

#[test]
fn half_round_trip_through_kernels() {
    // f32 -> f16 and f32 -> bf16 stores, and f16 -> f32 loads, of special values.
    let specials = [
        f32::INFINITY,
        -f32::INFINITY,
        f32::NAN,
        1e-7,
        6.1e-5,
        65520.0,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        -0.0,
        1.0 / 3.0,
    ];
    let n = specials.len();
    let mut p = Prog::default();
    let x = p.input(&[n], DType::F32);
    let h = p.input(&[n], DType::F16);
    let v = xs(&[n])[0];
    let mut outs = Vec::new();
    for (src, d) in [(x, DType::F16), (x, DType::BF16), (h, DType::F32)] {
        let mut b = B::default();
        let l = b.load(src, v, p.p.buffer(src).meta.dtype);
        let c = b.push(ScalarOp::Cast(l), d);
        outs.push(p.pointwise(&[n], d, b.done(c)));
    }
    let k = kernel("poi_fused_convert_0", KernelKind::Pointwise, vec![0, 1, 2], n, None, outs);
    let (lib, _) = build_and_compile(&p.p, &[k]);
    let mut xv = specials.to_vec();
    let mut hv: Vec<u16> = specials.iter().map(|&s| f16::from_f32(s).to_bits()).collect();
    let (mut o16, mut ob16, mut o32) = (vec![0u16; n], vec![0u16; n], vec![0f32; n]);
    // arguments in order of first use: x, its two conversions, h, its conversion
    lib.run("poi_fused_convert_0", &[ptr(&mut xv), ptr(&mut o16), ptr(&mut ob16), ptr(&mut hv), ptr(&mut o32)]);
    for i in 0..n {
        assert_eq!(o16[i], f16::from_f32(specials[i]).to_bits(), "f16({})", specials[i]);
        assert_eq!(ob16[i], bf16::from_f32(specials[i]).to_bits(), "bf16({})", specials[i]);
        assert_eq!(o32[i].to_bits(), f16::from_bits(hv[i]).to_f32().to_bits(), "f32(f16 {:#06x})", hv[i]);
    }
}

#[test]
fn philox_matches_the_definition() {
    // Enough draws that Box-Muller's log and cos (written out in the prelude) meet every
    // quadrant and a wide range of u1.
    const N: usize = 1 << 14;
    // Streams 0 and 2 (1 unused): keys and first counters are arguments of the run.
    let mut p = Prog::default();
    let v = xs(&[N])[0];
    let mut outs = Vec::new();
    for (dist, d, stream) in [
        (coil_ir::RandDist::Uniform, DType::F64, 2),
        (coil_ir::RandDist::Uniform, DType::F32, 2),
        (coil_ir::RandDist::Normal, DType::F64, 2),
        (coil_ir::RandDist::Uniform, DType::F32, 0),
    ] {
        let mut b = B::default();
        let r = b.push(ScalarOp::Rand { dist, stream, counter: v + 5 }, d);
        outs.push(p.pointwise(&[N], d, b.done(r)));
    }
    let k = kernel("poi_fused_rand_0", KernelKind::Pointwise, vec![0, 1, 2, 3], N, None, outs);
    let (lib, tiles) = build_and_compile(&p.p, &[k]);
    assert_eq!(tiles[0].random, vec![0, 2]);
    let src = emit_kernel(&tiles[0]);
    assert!(src.contains("coil_rand_uniform(seed2, offset2 + (uint64_t)(xindex + 5))"), "{src}");
    // Two runs of the same kernel: new arguments, new numbers.
    for (seed, offset) in [(0x1234_5678_9abc_u64, (1u64 << 32) - 10), (u64::MAX - 3, u64::MAX - 40)] {
        let (mut u64_, mut u32_, mut n64, mut other) = (vec![0f64; N], vec![0f32; N], vec![0f64; N], vec![0f32; N]);
        // stream 0: key 7 from counter 3; stream 2: the case's
        let words = [7, 3, seed, offset];
        let args = [ptr(&mut u64_), ptr(&mut u32_), ptr(&mut n64), ptr(&mut other)];
        assert_eq!(lib.run_with("poi_fused_rand_0", &args, &[], &words), [0; 4]);
        for i in 0..N as u64 {
            // crosses into the counter's high word, or wraps past 2^64
            let index = offset.wrapping_add(5 + i);
            let u = philox::uniform(seed, index);
            assert_eq!(u64_[i as usize], u, "uniform {i}");
            assert_eq!(u32_[i as usize], u as f32, "uniform f32 {i}");
            let n = philox::normal(seed, index);
            assert!(close(n64[i as usize], n, 1e-15), "normal {i}: {} vs {n}", n64[i as usize]);
            assert_eq!(other[i as usize], philox::uniform(7, 3 + 5 + i) as f32, "stream 0 {i}");
        }
    }
}

#[test]
fn bool_sum_and_comparisons() {
    // sum(x > 0) per row as i64, with `where` picking per element: a persistent kernel.
    let f = DType::F32;
    let mut p = Prog::default();
    let x = p.input(&[2, 5], f);
    let (xv, rv) = (xs(&[2])[0], rs(&[5])[0]);
    let mut b = B::default();
    let l = b.load(x, xv * 5 + rv, f);
    let z = b.constant(0.0, f);
    let gt = b.binary(BinaryOp::Gt, l, z, DType::Bool);
    let c = b.push(ScalarOp::Cast(gt), DType::I64);
    let s = p.reduction(&[2], &[5], ReduceOp::Sum, DType::I64, b.done(c));
    let k = kernel("per_fused_sum_0", KernelKind::PersistentReduction, vec![0], 2, Some(5), vec![s]);
    let (lib, _) = build_and_compile(&p.p, &[k]);
    let mut xv = vec![1.0f32, -1.0, f32::NAN, 2.0, 0.0, 3.0, 3.0, 3.0, 3.0, 3.0];
    let mut out = vec![0i64; 2];
    lib.run("per_fused_sum_0", &[ptr(&mut xv), ptr(&mut out)]);
    assert_eq!(out, [2, 5]);
}

#[test]
fn output_is_deterministic_and_compiles_as_one_unit() {
    let (p1, k1) = softmax(4, 8, KernelKind::PersistentReduction, "per_fused_softmax_0");
    let (p2, k2) = crate::tile::tests::pointwise_chain(DType::F16);
    let tiles = [build_kernel(&p1, &k1), build_kernel(&p2, &k2)];
    let a = emit_c(&tiles);
    assert_eq!(a, emit_c(&tiles));
    assert!(a.contains("void per_fused_softmax_0(") && a.contains("void poi_fused_add_mul_relu_0("));
    let _lib = compile(&a);
}

#[test]
fn reductions_over_empty_rows_give_the_identity() {
    let mut p = Prog::default();
    let mut outs = Vec::new();
    for op in [ReduceOp::Sum, ReduceOp::Prod] {
        let mut b = B::default();
        let c = b.constant(5.0, DType::F32);
        outs.push(p.reduction(&[3], &[0], op, DType::F32, b.done(c)));
    }
    let k = kernel("per_fused_prod_sum_0", KernelKind::PersistentReduction, vec![0, 1], 3, Some(0), outs);
    let (lib, _) = build_and_compile(&p.p, &[k]);
    let (mut s, mut q) = (vec![7f32; 3], vec![7f32; 3]);
    lib.run("per_fused_prod_sum_0", &[ptr(&mut s), ptr(&mut q)]);
    assert_eq!((s, q), (vec![0.0; 3], vec![1.0; 3]));
}

/// Dynamic shapes: `arg0: f32[s0, 4]`; one kernel compiled once runs at every `s0`.
mod dynamic {
    use super::*;

    /// `buf0[s0, 4] = exp(arg0) + 1` (pointwise, xnumel `4*s0`).
    #[test]
    fn pointwise_takes_its_sizes() {
        let f = DType::F32;
        let mut p = Prog::default();
        let s0 = p.symbol("s0", 0, 0, 8);
        let x = p.input_e(&[s0, Expr::int(4)], f);
        let v: Vec<Expr> = [s0, Expr::int(4)].iter().enumerate().map(|(i, e)| range_var(i, e)).collect();
        let mut b = B::default();
        let l = b.load(x, v[0] * 4 + v[1], f);
        let e = b.unary(UnaryOp::Exp, l, f);
        let one = b.constant(1.0f32, f);
        let r = b.binary(BinaryOp::Add, e, one, f);
        let out = p.pointwise_e(&[s0, Expr::int(4)], f, b.done(r));
        p.output(out);
        let k = kernel_e("poi_fused_exp_0", KernelKind::Pointwise, vec![0], s0 * 4, None, vec![out]);
        let (lib, tiles) = build_and_compile(&p.p, &[k]);
        assert_eq!(tiles[0].sizes, vec![s0]);
        let c = emit_kernel(&tiles[0]);
        assert!(c.contains("const int64_t s0 = ((const int64_t *)args[2])[0];\n"), "{c}");
        assert!(c.contains("#pragma omp simd\n"), "{c}");
        assert!(c.contains("xend = xrange ? xrange[1] : 4*s0;"), "{c}");
        for n in [2usize, 3, 17, 10_000] {
            let mut xv: Vec<f32> = (0..4 * n).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
            let mut o = vec![0f32; 4 * n];
            assert_eq!(lib.run_sized("poi_fused_exp_0", &[ptr(&mut xv), ptr(&mut o)], &[n as i64]), [0; 4]);
            for i in 0..4 * n {
                let want = (xv[i] as f64).exp() + 1.0;
                assert!(close(o[i] as f64, want, 1e-6), "s0 = {n}, {i}: {} vs {want}", o[i]);
            }
        }
    }

    /// `x * row + bias` over `x: f32[s0, s1]`, `row: [s0]`, `bias: [s1]` (a layer norm's
    /// broadcasts at dynamic sizes): `xindex / s1` and `xindex % s1` become the loops over
    /// `xouter` and `xinner`, no division per element; whole calls and calls over ranges that
    /// cut rows agree with the definition.
    #[test]
    fn a_symbolic_broadcast_row_is_an_inner_loop() {
        let f = DType::F32;
        let mut p = Prog::default();
        let s0 = p.symbol("s0", 0, 0, 8);
        let s1 = p.symbol("s1", 0, 1, 8);
        let x = p.input_e(&[s0, s1], f);
        let row = p.input_e(&[s0], f);
        let bias = p.input_e(&[s1], f);
        let v: Vec<Expr> = [s0, s1].iter().enumerate().map(|(i, e)| range_var(i, e)).collect();
        let mut b = B::default();
        let lx = b.load(x, v[0] * s1 + v[1], f);
        let lr = b.load(row, v[0], f);
        let lb = b.load(bias, v[1], f);
        let m = b.binary(BinaryOp::Mul, lx, lr, f);
        let r = b.binary(BinaryOp::Add, m, lb, f);
        let out = p.pointwise_e(&[s0, s1], f, b.done(r));
        p.output(out);
        let k = kernel_e("poi_fused_add_mul_0", KernelKind::Pointwise, vec![0], s0 * s1, None, vec![out]);
        let (lib, tiles) = build_and_compile(&p.p, &[k]);
        let c = emit_kernel(&tiles[0]);
        assert!(c.contains("for (int64_t xouter = xstart / (s1); xouter * (s1) < xend; xouter++) {"), "{c}");
        assert!(c.contains("in_ptr2[xinner]") && !c.contains("xindex / s1") && !c.contains("xindex % s1"), "{c}");
        for (n, d) in [(2usize, 2usize), (3, 5), (17, 33), (40, 300)] {
            let mut xv: Vec<f32> = (0..n * d).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
            let mut rv: Vec<f32> = (0..n).map(|i| i as f32 / 7.0 - 1.0).collect();
            let mut bv: Vec<f32> = (0..d).map(|i| i as f32 / 9.0).collect();
            let total = (n * d) as i64;
            for ranges in [vec![[0, total]], vec![[0, total / 3], [total / 3, total / 3 + 1], [total / 3 + 1, total]]] {
                let mut o = vec![0f32; n * d];
                let args = [ptr(&mut xv), ptr(&mut rv), ptr(&mut bv), ptr(&mut o)];
                for r in ranges {
                    assert_eq!(
                        lib.run_range("poi_fused_add_mul_0", &args, &[n as i64, d as i64], &[], Some(r)),
                        [0; 4]
                    );
                }
                for i in 0..n * d {
                    let want = xv[i] * rv[i / d] + bv[i % d];
                    assert_eq!(o[i], want, "[{n}, {d}], {i}");
                }
            }
        }
    }

    /// Row sums both ways: rows of 4 (persistent, xnumel `s0`) and columns of `s0` (looped,
    /// rnumel `s0`), from `arg0: f32[s0, 4]`.
    #[test]
    fn reductions_over_and_along_a_symbolic_dim() {
        let f = DType::F32;
        let mut p = Prog::default();
        let s0 = p.symbol("s0", 0, 0, 8);
        let four = Expr::int(4);
        let x = p.input_e(&[s0, four], f);
        let (xv, rv) = (range_var(0, &s0), reduction_var(0, &four));
        let mut b = B::default();
        let l = b.load(x, xv * 4 + rv, f);
        let rows = p.reduction_e(&[s0], &[four], ReduceOp::Sum, f, b.done(l));
        let (xv, rv) = (range_var(0, &four), reduction_var(0, &s0));
        let mut b = B::default();
        let l = b.load(x, rv * 4 + xv, f);
        let cols = p.reduction_e(&[four], &[s0], ReduceOp::Max, f, b.done(l));
        p.output(rows);
        p.output(cols);
        let per = kernel_e("per_fused_sum_0", KernelKind::PersistentReduction, vec![0], s0, Some(four), vec![rows]);
        let red = kernel_e("red_fused_amax_1", KernelKind::LoopedReduction, vec![1], four, Some(s0), vec![cols]);
        let (lib, tiles) = build_and_compile(&p.p, &[per, red]);
        assert_eq!((tiles[0].sizes.clone(), tiles[1].sizes.clone()), (vec![s0], vec![s0]));
        let c = emit_kernel(&tiles[1]);
        // the columns of arg0: the column form (`super::column`)
        // 4 columns: one block of the fewest (64); rows of any count, four a step, then the rest
        let block = "for (int64_t xblock = xstart; xblock < xend; xblock += 64) {";
        let steps = "for (int64_t rstep = 0; rstep < (s0) / 4 * 4; rstep += 4) {";
        let rest = "for (int64_t rindex = (s0) / 4 * 4; rindex < s0; rindex++) {";
        assert!(c.contains(block) && c.contains(steps) && c.contains(rest), "{c}");
        for n in [2usize, 3, 17, 9000] {
            let mut xv: Vec<f32> = (0..4 * n).map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0).collect();
            let (mut sums, mut maxes) = (vec![0f32; n], vec![0f32; 4]);
            assert_eq!(lib.run_sized("per_fused_sum_0", &[ptr(&mut xv), ptr(&mut sums)], &[n as i64]), [0; 4]);
            assert_eq!(lib.run_sized("red_fused_amax_1", &[ptr(&mut xv), ptr(&mut maxes)], &[n as i64]), [0; 4]);
            for r in 0..n {
                let want: f64 = xv[4 * r..4 * r + 4].iter().map(|&v| v as f64).sum();
                assert!(close(sums[r] as f64, want, 1e-6), "s0 = {n}, row {r}: {} vs {want}", sums[r]);
            }
            for c in 0..4 {
                let want = (0..n).map(|r| xv[4 * r + c]).fold(f32::NEG_INFINITY, f32::max);
                assert_eq!(maxes[c], want, "s0 = {n}, column {c}");
            }
        }
    }
}

/// `tanh(x + bias)` over bf16 `x: [5, 64]`, `bias: [64]`: the broadcast row becomes an inner
/// loop of 64 (`xindex % 64` is `xinner`, a contiguous load) inside a loop over rows; whole
/// calls and calls over ranges that cut rows agree with the definition.
#[test]
fn a_broadcast_row_is_an_inner_loop() {
    let (rows, n) = (5usize, 64usize);
    let mut p = Prog::default();
    let bf = DType::BF16;
    let x = p.input(&[rows, n], bf);
    let bias = p.input(&[n], bf);
    let v = xs(&[rows, n]);
    let mut b = B::default();
    let lx = b.load(x, v[0] * n as i64 + v[1], DType::F32);
    let lb = b.load(bias, v[1], DType::F32);
    let sum = b.binary(BinaryOp::Add, lx, lb, DType::F32);
    let t = b.unary(UnaryOp::Tanh, sum, DType::F32);
    let c = b.push(ScalarOp::Cast(t), bf);
    let out = p.pointwise(&[rows, n], bf, b.done(c));
    p.output(out);
    let k = kernel("poi_fused_add_tanh_0", KernelKind::Pointwise, vec![0], rows * n, None, vec![out]);
    let (lib, tiles) = build_and_compile(&p.p, &[k]);
    let c = emit_kernel(&tiles[0]);
    assert!(c.contains("for (int64_t xouter = xstart / 64; xouter * 64 < xend; xouter++) {"), "{c}");
    assert!(c.contains("#pragma omp simd\n") && c.contains("in_ptr1[xinner]"), "{c}");
    let xf: Vec<f32> = (0..rows * n).map(|i| ((i * 37) % 101) as f32 / 25.0 - 2.0).collect();
    let bf_: Vec<f32> = (0..n).map(|i| i as f32 / 32.0 - 1.0).collect();
    let mut xb: Vec<u16> = xf.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    let mut bb: Vec<u16> = bf_.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    let want: Vec<u16> = (0..rows * n)
        .map(|i| {
            let s = bf16::from_bits(xb[i]).to_f32() + bf16::from_bits(bb[i % n]).to_f32();
            bf16::from_f64((s as f64).tanh()).to_bits()
        })
        .collect();
    for ranges in [vec![[0, 320]], vec![[0, 100], [100, 101], [101, 320]]] {
        let mut o = vec![0u16; rows * n];
        for r in ranges {
            lib.run_range("poi_fused_add_tanh_0", &[ptr(&mut xb), ptr(&mut bb), ptr(&mut o)], &[], &[], Some(r));
        }
        // tanh within 2.5 ulp of f32 rounds to the same bf16 but for rare ties: one bf16 ulp
        for i in 0..rows * n {
            assert!((o[i] as i32 - want[i] as i32).abs() <= 1, "{i}: {:#x} vs {:#x}", o[i], want[i]);
        }
    }
}

/// `x.sum(0)` and `x.amax(0)` of `x: f32[37, 600]` (a NaN in column 5), as a looped and as a
/// persistent reduction: the column form (blocks of 256 columns for three accumulator arrays,
/// rows four a step and the last one alone), whole and over ranges that cut its blocks.
#[test]
fn column_reductions_run_along_the_rows_in_vectors() {
    let (r, n) = (37usize, 600usize);
    for kind in [KernelKind::LoopedReduction, KernelKind::PersistentReduction] {
        let mut p = Prog::default();
        let x = p.input(&[r, n], DType::F32);
        let (xv, rv) = (xs(&[n])[0], rs(&[r])[0]);
        let mut outs = Vec::new();
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let mut b = B::default();
            let l = b.load(x, rv * n as i64 + xv, DType::F32);
            outs.push(p.reduction(&[n], &[r], op, DType::F32, b.done(l)));
        }
        outs.iter().for_each(|&o| p.output(o));
        let k = kernel("red_fused_amax_sum_0", kind, vec![0, 1], n, Some(r), outs);
        let (lib, tiles) = build_and_compile(&p.p, &[k]);
        let c = emit_kernel(&tiles[0]);
        assert!(c.contains("xblock += 256") && c.contains("in_ptr0[600*rindex + xindex]"), "{c}");
        assert!(c.contains("rstep < 36; rstep += 4") && c.contains("rindex = 36; rindex < 37;"), "{c}");
        assert!(c.contains("double acc1_r = acc1[xi];") && c.contains("{ const int64_t rindex = rstep + 3;"), "{c}");
        let mut xv: Vec<f32> = (0..r * n).map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0).collect();
        xv[3 * n + 5] = f32::NAN;
        for ranges in [vec![[0, n as i64]], vec![[0, 70], [70, 71], [71, 300], [300, n as i64]]] {
            let (mut sums, mut maxes) = (vec![0f32; n], vec![0f32; n]);
            for range in ranges {
                let args = [ptr(&mut xv), ptr(&mut sums), ptr(&mut maxes)];
                assert_eq!(lib.run_range("red_fused_amax_sum_0", &args, &[], &[], Some(range)), [0; 4]);
            }
            for col in 0..n {
                let column = (0..r).map(|row| xv[row * n + col] as f64);
                let want_sum: f64 = column.clone().sum();
                let want_max =
                    column.fold(f64::NEG_INFINITY, |a, v| if a.is_nan() || v.is_nan() { f64::NAN } else { a.max(v) });
                assert!(close(sums[col] as f64, want_sum, 1e-6), "{kind:?} sum {col}: {} vs {want_sum}", sums[col]);
                assert!(close(maxes[col] as f64, want_max, 0.0), "{kind:?} max {col}: {} vs {want_max}", maxes[col]);
            }
        }
    }
}

/// `x.sum(1)` and `x.amax(1)` of `x: f32[3, 37, 80]` (a NaN in plane 1, column 5): `xindex`
/// is `80 * plane + column`, not contiguous along the columns itself, so the column form runs
/// under a nest (`xouter` the plane, `xinner` the column), as a split column reduction's chunks
/// do; whole, and over ranges that cut planes and blocks.
#[test]
fn planes_of_columns_reduce_along_the_rows_in_vectors() {
    let (a, r, n) = (3usize, 37usize, 80usize);
    for kind in [KernelKind::LoopedReduction, KernelKind::PersistentReduction] {
        let mut p = Prog::default();
        let x = p.input(&[a, r, n], DType::F32);
        let (v, rv) = (xs(&[a, n]), rs(&[r])[0]);
        let mut outs = Vec::new();
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let mut b = B::default();
            let l = b.load(x, v[0] * (r * n) as i64 + rv * n as i64 + v[1], DType::F32);
            outs.push(p.reduction(&[a, n], &[r], op, DType::F32, b.done(l)));
        }
        outs.iter().for_each(|&o| p.output(o));
        let k = kernel("red_fused_amax_sum_0", kind, vec![0, 1], a * n, Some(r), outs);
        let (lib, tiles) = build_and_compile(&p.p, &[k]);
        let c = emit_kernel(&tiles[0]);
        let nest = "for (int64_t xouter = xstart / 80; xouter * 80 < xend; xouter++) {";
        // blocks no wider than a plane's 80 columns allow
        let block = "for (int64_t xblock = xlo; xblock < xhi; xblock += 128) {";
        assert!(
            c.contains(nest) && c.contains(block) && c.contains("in_ptr0[80*rindex + xinner + 2960*xouter]"),
            "{c}"
        );
        let mut xv: Vec<f32> = (0..a * r * n).map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0).collect();
        xv[r * n + 3 * n + 5] = f32::NAN;
        for ranges in [vec![[0, (a * n) as i64]], vec![[0, 70], [70, 81], [81, 200], [200, 240]]] {
            let (mut sums, mut maxes) = (vec![0f32; a * n], vec![0f32; a * n]);
            for range in ranges {
                let args = [ptr(&mut xv), ptr(&mut sums), ptr(&mut maxes)];
                assert_eq!(lib.run_range("red_fused_amax_sum_0", &args, &[], &[], Some(range)), [0; 4]);
            }
            for (o, (plane, col)) in (0..a).flat_map(|p| (0..n).map(move |c| (p, c))).enumerate() {
                let column = (0..r).map(|row| xv[plane * r * n + row * n + col] as f64);
                let want_sum: f64 = column.clone().sum();
                let want_max =
                    column.fold(f64::NEG_INFINITY, |a, v| if a.is_nan() || v.is_nan() { f64::NAN } else { a.max(v) });
                assert!(close(sums[o] as f64, want_sum, 1e-6), "{kind:?} sum {o}: {} vs {want_sum}", sums[o]);
                assert!(close(maxes[o] as f64, want_max, 0.0), "{kind:?} max {o}: {} vs {want_max}", maxes[o]);
            }
        }
    }
}

#[test]
fn kernels_with_the_same_code_are_emitted_once() {
    let (p, k) = crate::tile::tests::pointwise_chain(DType::F32);
    let (_, tiles) = build_and_compile(&p, &[k]);
    let mut twin = tiles[0].clone();
    twin.name = "poi_fused_add_mul_relu_7".into();
    let source = emit_c(&[tiles[0].clone(), twin]);
    assert_eq!(source.matches("(void)status;").count(), 1, "one body:\n{source}");
    assert!(source.contains("poi_fused_add_mul_relu_0(args, status);"), "{source}");
}
