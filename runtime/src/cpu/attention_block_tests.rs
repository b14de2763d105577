//! Tests of the blocked attention kernel: every compiled copy against the definition, and the
//! f32 `exp`.

use super::*;

/// `exp` of f32 against the f64 one: within one ulp over `[-87, 0]`, 0 below (where the
/// result would be subnormal), with and without fused multiply-add, and the special values.
#[test]
fn exp_nonpositive_f32_is_within_an_ulp() {
    for fma in [false, true] {
        let exp = |x: f32| if fma { exp_nonpositive_f32::<true>(x) } else { exp_nonpositive_f32::<false>(x) };
        for i in 0..=200_000 {
            let x = -104.0 * (i as f32 / 200_000.0);
            let (got, want) = (exp(x) as f64, if x < -87.0 { 0.0 } else { (x as f64).exp() });
            assert!((got - want).abs() <= want * f32::EPSILON as f64, "fma={fma} exp({x}) = {got}, want {want}");
        }
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-1000.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }
}

/// A batch index's operands in f64, converted to the compute type on the way in; `keep`
/// masks (row, key) pairs out when given.
struct Operands {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    d: usize,
    keep: Option<fn(usize, usize) -> bool>,
}

impl<A: Compute> Source<A> for Operands {
    fn key(&self, j: usize, out: &mut [A]) {
        out.iter_mut().zip(&self.k[j * self.d..]).for_each(|(o, &x)| *o = A::from_f64(x));
    }
    fn value(&self, j: usize, out: &mut [A]) {
        out.iter_mut().zip(&self.v[j * self.d..]).for_each(|(o, &x)| *o = A::from_f64(x));
    }
    fn query(&self, i: usize, out: &mut [A]) {
        out.iter_mut().zip(&self.q[i * self.d..]).for_each(|(o, &x)| *o = A::from_f64(x));
    }
    fn term(&self, i: usize, j: usize) -> Option<A> {
        // Kept keys get a term that varies, as an added mask's would.
        self.keep.is_none_or(|keep| keep(i, j)).then(|| A::from_f64(((i * 7 + j) as f64 * 0.1).sin()))
    }
    fn masked(&self) -> bool {
        self.keep.is_some()
    }
}

/// Row `i`'s output and logsumexp in f64 by the definition.
fn reference(ops: &Operands, s: usize, limit: Option<KeyLimit>, scale: f64, i: usize) -> (Vec<f64>, f64) {
    let d = ops.d;
    let below = |j: usize| limit.is_none_or(|l| j as i64 <= l.last(i));
    let seen: Vec<usize> = (0..s).filter(|&j| below(j) && ops.keep.is_none_or(|keep| keep(i, j))).collect();
    if seen.is_empty() {
        return (vec![0.0; d], f64::NEG_INFINITY);
    }
    let score = |j: usize| {
        let dot: f64 = (0..d).map(|c| ops.q[i * d + c] * ops.k[j * d + c]).sum();
        let term = if ops.keep.is_some() { ((i * 7 + j) as f64 * 0.1).sin() } else { 0.0 };
        dot * scale + term
    };
    let x: Vec<f64> = seen.iter().map(|&j| score(j)).collect();
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = x.iter().map(|x| (x - m).exp()).collect();
    let total: f64 = p.iter().sum();
    let out = (0..d).map(|c| seen.iter().zip(&p).map(|(&j, p)| p * ops.v[j * d + c]).sum::<f64>() / total);
    (out.collect(), m + total.ln())
}

fn isas() -> Vec<Isa> {
    let mut isas = vec![Isa::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") {
            isas.push(Isa::Avx2);
        }
        if Isa::detect() == Isa::Avx512 {
            isas.push(Isa::Avx512);
        }
    }
    isas
}

/// Every compiled copy, f32 and f64, against the definition: tasks not starting at row 0
/// or key 0, sizes that are no multiple of any block or tile, causal, structured masks (keys
/// up to an offset plus the row modulo a period, rows wrapping periods inside a block, offsets
/// past the keys, a negative one: rows that see no key), masked (with rows that see no key), a
/// decode step's single row.
#[test]
fn every_copy_matches_the_definition() {
    let vals = |n: usize, seed: f64| (0..n).map(|i| ((i as f64) * 0.37 + seed).sin() * 0.5).collect::<Vec<_>>();
    // (l, s, d, limit, task rows, mask)
    type Keep = Option<fn(usize, usize) -> bool>;
    let causal = Some(KeyLimit::CAUSAL);
    let rule = |base, period| Some(KeyLimit { base, period });
    type Case = (usize, usize, usize, Option<KeyLimit>, std::ops::Range<usize>, Keep);
    let cases: [Case; 11] = [
        (100, 100, 40, causal, 0..100, None),
        (100, 100, 64, causal, 37..100, None),
        (5, 150, 24, None, 0..5, None),
        (1, 200, 64, None, 0..1, None),
        (70, 130, 16, None, 0..70, Some(|i, j| j < 2 * i && j % 3 != 1)),
        (40, 90, 8, causal, 3..40, Some(|i, j| j + 4 >= i && j % 5 != 2)),
        // Grouped-query rows of a prefill at position 20: 4 heads of 23 rows.
        (92, 140, 64, rule(20, Some(23)), 0..92, None),
        (92, 140, 32, rule(20, Some(23)), 41..92, None),
        // Past the keys; a period of one (a decode step's rows); before the first key.
        (50, 70, 16, rule(60, Some(17)), 0..50, None),
        (4, 300, 64, rule(170, Some(1)), 0..4, None),
        (40, 60, 8, rule(-25, None), 0..40, None),
    ];
    for (l, s, d, limit, rows, keep) in cases {
        let ops = Operands { q: vals(l * d, 0.1), k: vals(s * d, 1.3), v: vals(s * d, 2.9), d, keep };
        let scale = 0.3;
        // The blocks' keys: what their rows see (the kernel handles keys it converts but a
        // block's rows do not see through the mask or causality).
        let blocks: Vec<std::ops::Range<usize>> = (rows.start..rows.end)
            .step_by(ROWS_PER_BLOCK)
            .map(|r0| 0..limit.map_or(s, |lim| lim.keys_seen(r0..(r0 + ROWS_PER_BLOCK).min(rows.end), s)))
            .collect();
        let keys = 0..blocks.iter().map(|b| b.end).max().unwrap();
        let task = Task { rows: rows.clone(), keys, blocks };
        let shape = Shape { d, limit, scale };
        for isa in isas() {
            let what = format!("{isa:?} l={l} s={s} d={d} limit={limit:?} rows={rows:?}");
            let n = rows.len();
            let (mut out32, mut lse32) = (vec![0f32; n * d], vec![0f32; n]);
            forward(isa, shape, &task, &ops, &mut out32, &mut lse32);
            let (mut out64, mut lse64) = (vec![0f64; n * d], vec![0f64; n]);
            forward(isa, shape, &task, &ops, &mut out64, &mut lse64);
            for (r, i) in rows.clone().enumerate() {
                let (want, want_lse) = reference(&ops, s, limit, scale, i);
                for c in 0..d {
                    let (a, b, w) = (out32[r * d + c] as f64, out64[r * d + c], want[c]);
                    assert!((a - w).abs() < 1e-5, "{what}: f32 ({i}, {c}): {a} vs {w}");
                    assert!((b - w).abs() < 1e-12, "{what}: f64 ({i}, {c}): {b} vs {w}");
                }
                let (a, b) = (lse32[r] as f64, lse64[r]);
                assert!(a == want_lse || (a - want_lse).abs() < 1e-5, "{what}: f32 lse {i}: {a} vs {want_lse}");
                assert!(b == want_lse || (b - want_lse).abs() < 1e-12, "{what}: f64 lse {i}: {b} vs {want_lse}");
            }
        }
    }
}

/// The keys a block of rows sees under a limit: the largest diagonal, rows wrapping a period.
#[test]
fn key_limits_bound_what_blocks_of_rows_see() {
    let rule = KeyLimit { base: 10, period: Some(8) };
    assert_eq!(rule.keys_seen(0..3, 100), 13);
    assert_eq!(rule.keys_seen(6..10, 100), 18); // rows 6, 7, 0, 1: 7 wraps to 0
    assert_eq!(rule.keys_seen(9..12, 100), 14);
    assert_eq!(rule.keys_seen(0..100, 15), 15);
    assert_eq!(KeyLimit { base: -5, period: None }.keys_seen(0..3, 100), 0);
    assert_eq!(KeyLimit::CAUSAL.keys_seen(32..64, 1000), 64);
    assert_eq!((rule.seen(3, 0, 64), rule.seen(3, 13, 64), rule.seen(3, 8, 2)), (14, 1, 2));
    // Against the definition, every block of rows of a few rules.
    for (base, period) in [(3, Some(5)), (-2, Some(7)), (0, None), (40, Some(1)), (-60, None)] {
        let limit = KeyLimit { base, period };
        for a in 0..30 {
            for b in a + 1..40 {
                let want = (a..b).map(|i| (limit.last(i) + 1).clamp(0, 50) as usize).max().unwrap();
                assert_eq!(limit.keys_seen(a..b, 50), want, "{limit:?} rows {a}..{b}");
            }
        }
    }
}
