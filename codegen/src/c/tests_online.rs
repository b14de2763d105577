//! Online softmax (`crate::tile::tests::online`): the maximum and the sum of exponentials in
//! two passes (static rows) or in one (long and symbolic rows: `coil_online_softmax_f32`),
//! checked against a plain two-pass computation in f64 on rows that stress them.

use super::*;
use crate::testutil::*;
use crate::tile::tests::{online, Online};
use coil_ir::kernel::TileKernel;
use coil_ir::DType;
use half::bf16;

/// Rows of `n` values: random; ascending (a new maximum at every element); masked with
/// `-inf` (the first ones too); all `-inf`; values 1e30 apart; a NaN; a `+inf`; `-inf` but
/// the last; descending.
pub(crate) fn rows(n: usize) -> Vec<Vec<f64>> {
    let random = |i: usize| ((i * 7919 + 13) % 1000) as f64 / 100.0 - 5.0;
    let mut rows: Vec<Vec<f64>> = Vec::new();
    rows.push((0..n).map(random).collect());
    rows.push((0..n).map(|i| i as f64 * 0.01 - 7.0).collect());
    rows.push((0..n).map(|i| if i % 3 == 0 || i < n / 8 { f64::NEG_INFINITY } else { random(i) }).collect());
    rows.push(vec![f64::NEG_INFINITY; n]);
    rows.push((0..n).map(|i| ((i * 7919) % 1000) as f64 * 1e27 - 5e29).collect());
    rows.push((0..n).map(|i| if i == n / 2 { f64::NAN } else { random(i) }).collect());
    rows.push((0..n).map(|i| if i == n / 3 { f64::INFINITY } else { random(i) }).collect());
    rows.push((0..n).map(|i| if i + 1 < n { f64::NEG_INFINITY } else { 3.5 }).collect());
    rows.push((0..n).map(|i| 20.0 - i as f64 * 0.01).collect());
    rows
}

/// `what` of one row, in f64, the plain way: the maximum, then the sum of exponentials.
/// Returns the row's outputs (one per element, or one, or `[amax, sum]`).
pub(crate) fn two_pass(row: &[f64], what: Online) -> Vec<f64> {
    let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) });
    let shift = if what == Online::LogSumExp && m.is_infinite() { 0.0 } else { m };
    let s: f64 = row.iter().map(|&x| (x - shift).exp()).sum();
    match what {
        Online::Softmax => row.iter().map(|&x| (x - m).exp() / s).collect(),
        Online::LogSoftmax => row.iter().map(|&x| (x - m) - s.ln()).collect(),
        Online::LogSumExp => vec![s.ln() + shift],
        Online::Stats => vec![m, s],
    }
}

/// Whether `got` is `want` within `tol` relative to `|want|` (at least `floor`); NaN and
/// infinities must match exactly.
fn agrees(got: f64, want: f64, tol: f64, floor: f64) -> bool {
    if want.is_nan() || want.is_infinite() {
        return got.is_nan() == want.is_nan() && (want.is_nan() || got == want);
    }
    (got - want).abs() <= tol * want.abs().max(floor)
}

fn encode(v: &[f64], d: DType) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| match d {
            DType::F64 => x.to_le_bytes().to_vec(),
            DType::F32 => (x as f32).to_le_bytes().to_vec(),
            _ => bf16::from_f64(x).to_le_bytes().to_vec(),
        })
        .collect()
}

fn decode(b: &[u8], d: DType) -> Vec<f64> {
    match d {
        DType::F64 => b.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
        DType::F32 => b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
        _ => b.chunks(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
    }
}

/// Runs kernel `t` (of [`online`]) on `data` (`rows x n`, row-major) and checks it
/// against [`two_pass`] of the values as `d` holds them.
fn check(lib: &CLib, t: &TileKernel, what: Online, d: DType, n: usize, sized: bool) {
    let data = rows(n);
    let mut x = encode(&data.concat(), d);
    let held: Vec<Vec<f64>> = decode(&x, d).chunks(n).map(|r| r.to_vec()).collect();
    let per_row = match what {
        Online::Softmax | Online::LogSoftmax => n,
        Online::LogSumExp => 1,
        Online::Stats => 2,
    };
    let out_dtype = if what == Online::Stats && d != DType::F64 { DType::F32 } else { d };
    let size = |k: usize| vec![0u8; k * out_dtype.size_bytes()];
    let mut outs: Vec<Vec<u8>> = match what {
        Online::Stats => vec![size(data.len()), size(data.len())],
        _ => vec![size(data.len() * per_row)],
    };
    let mut args = vec![ptr(&mut x)];
    args.extend(outs.iter_mut().map(|o| ptr(o)));
    let sizes = if sized { vec![n as i64] } else { vec![] };
    assert_eq!(lib.run_sized(&t.name, &args, &sizes), [0; 4], "{}", t.name);
    let got: Vec<Vec<f64>> = match what {
        // amax and sum: one buffer each
        Online::Stats => {
            let (m, s) = (decode(&outs[0], out_dtype), decode(&outs[1], out_dtype));
            m.iter().zip(&s).map(|(&m, &s)| vec![m, s]).collect()
        }
        _ => decode(&outs[0], out_dtype).chunks(per_row).map(|r| r.to_vec()).collect(),
    };
    let tol = match d {
        DType::F64 => 1e-10,
        DType::F32 => 1e-6,
        _ => 8e-3,
    };
    let floor = if what == Online::Softmax { 1e-3 } else { 1.0 };
    for (r, (row, got)) in held.iter().zip(&got).enumerate() {
        let want = two_pass(row, what);
        for (c, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(agrees(g, w, tol, floor), "{} {d} n = {n}, row {r} [{c}]: {g} vs {w}", t.name);
        }
    }
}

/// A static row up to `TWO_PASS_MAX_RNUMEL` takes two passes (`c::softmax`): the maximum,
/// then the sum of exponentials, which a softmax keeps in an array for its last loop.
#[test]
fn static_rows_take_two_passes() {
    for what in [Online::Softmax, Online::LogSoftmax, Online::LogSumExp, Online::Stats] {
        for d in [DType::F32, DType::F64, DType::BF16] {
            let (p, k) = online(rows(8).len(), Some(3000), d, what, false);
            let (lib, tiles) = build_and_compile(&p, &[k]);
            let c = emit_kernel(&tiles[0]);
            let (m, a) = if d == DType::BF16 { (2, 3) } else { (1, 2) }; // after the cast
            assert!(!c.contains("coil_online_softmax"), "{c}");
            assert!(c.contains(&format!("reduction(max:acc{m}) reduction(|:acc{m}_nan)")), "{c}");
            let (sum, array) = if d == DType::F64 { ("acc", "double") } else { ("lacc", "float") };
            assert!(c.contains(&format!("#pragma omp simd reduction(+:{sum}{a})")), "{c}");
            assert_eq!(c.contains(&format!("{array} tmp")) && c.contains("[3000];"), what == Online::Softmax, "{c}");
            assert_eq!(c.matches("for (int64_t rindex").count(), if per_element(what) { 3 } else { 2 }, "{c}");
            check(&lib, &tiles[0], what, d, 3000, false);
        }
    }
}

fn per_element(what: Online) -> bool {
    matches!(what, Online::Softmax | Online::LogSoftmax)
}

/// A static row longer than [`super::softmax::TWO_PASS_MAX_RNUMEL`] is read once, online.
#[test]
fn long_rows_fold_online() {
    let n = super::softmax::TWO_PASS_MAX_RNUMEL as usize + 5;
    for what in [Online::Softmax, Online::Stats] {
        let (p, k) = online(rows(8).len(), Some(n), DType::F32, what, false);
        let (lib, tiles) = build_and_compile(&p, &[k]);
        let c = emit_kernel(&tiles[0]);
        assert!(c.contains("coil_online_softmax_f32(&acc1, &acc2, ox1, rcount);"), "{c}");
        check(&lib, &tiles[0], what, DType::F32, n, false);
    }
}

#[test]
fn symbolic_rows() {
    for what in [Online::Softmax, Online::LogSumExp, Online::Stats] {
        let (p, k) = online(rows(8).len(), None, DType::F32, what, false);
        let (lib, tiles) = build_and_compile(&p, &[k]);
        let c = emit_kernel(&tiles[0]);
        let b = ONLINE_BLOCK;
        assert!(
            c.contains("rblock < s0;") && c.contains(&format!("(s0) - rblock < {b} ? (s0) - rblock : {b};")),
            "{c}"
        );
        assert!(c.contains("coil_online_softmax_f32(&acc1, &acc2, ox1, rcount);"), "{c}");
        for n in [2, 3, 17, 3000] {
            check(&lib, &tiles[0], what, DType::F32, n, true);
        }
    }
}
