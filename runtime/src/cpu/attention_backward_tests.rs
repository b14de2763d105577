//! Tests of the CPU attention backward: every compiled copy of the blocked kernel, in f64 and
//! f32, against the gradients' definition in f64 (masks, dropout, causal, sizes that are no
//! multiple of the blocks, strided views, subsets of the gradients).

use super::*;
use crate::cpu::attention::{attention_bytes, AttentionSpec};
use coil_ir::loops::BufferId;

fn view(batch_stride: usize, row_stride: usize) -> StridedOperand<usize> {
    StridedOperand { buffer: BufferId(0), offset: 0, batch_strides: vec![batch_stride], row_stride, col_stride: 1 }
}

fn vals(n: usize, seed: f64) -> Vec<f64> {
    (0..n).map(|i| ((i as f64) * 0.37 + seed).sin()).collect()
}

/// A mask's term for (row, key): `None` drops the key, else what is added to the score.
type Term<'a> = &'a dyn Fn(usize, usize) -> Option<f64>;

/// The gradients by their definition in f64 (dq, dk, dv of every batch index), from the
/// forward's output and logsumexp: `term(i, j)` is the mask's (`None` drops the key), and
/// the spec's dropout drops weights.
#[allow(clippy::type_complexity)]
fn reference(
    spec: &AttentionBackwardSpec,
    (q, k, v, g, o, lse): (&[f64], &[f64], &[f64], &[f64], &[f64], &[f64]),
    term: Term,
) -> [Vec<f64>; 3] {
    let (l, s, d) = (spec.l, spec.s, spec.d);
    let n = spec.batch_count();
    let (mut dq, mut dk, mut dv) = (vec![0.0; n * l * d], vec![0.0; n * s * d], vec![0.0; n * s * d]);
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for b in 0..n {
        let row = |x: &[f64], r: usize| x[(b * l + r) * d..(b * l + r + 1) * d].to_vec();
        let key = |x: &[f64], j: usize| x[(b * s + j) * d..(b * s + j + 1) * d].to_vec();
        for i in 0..l {
            let (qi, gi) = (row(q, i), row(g, i));
            let delta = dot(&gi, &row(o, i));
            for j in (0..s).filter(|&j| !(spec.causal && j > i)) {
                let Some(t) = term(i, j) else { continue };
                let (kj, vj) = (key(k, j), key(v, j));
                let p = (dot(&qi, &kj) * spec.scale + t - lse[b * l + i]).exp();
                // With dropout: the weight dv takes, and g . v, both dropped.
                let (kept, dp) = match &spec.dropout {
                    None => (p, dot(&gi, &vj)),
                    Some(draw) if draw.keeps(((b * l + i) * s + j) as u64) => {
                        (p * draw.scale, dot(&gi, &vj) * draw.scale)
                    }
                    Some(_) => (0.0, 0.0),
                };
                let ds = p * (dp - delta);
                for c in 0..d {
                    dq[(b * l + i) * d + c] += spec.scale * ds * kj[c];
                    dk[(b * s + j) * d + c] += spec.scale * ds * qi[c];
                    dv[(b * s + j) * d + c] += kept * gi[c];
                }
            }
        }
    }
    [dq, dk, dv]
}

/// A `[l, s]` mask broadcast over 2 batch indices, bool and added, with a row that keeps no
/// key (whose gradients are 0, no NaN), causal and not: the definition's gradients.
#[test]
fn masked_gradients_match_the_definition_and_dead_rows_are_zero() {
    let (l, s, d, n) = (37, 45, 16, 2);
    let keep = |i: usize, j: usize| i != 4 && (i * 3 + j) % 7 != 2;
    let added = |i: usize, j: usize| keep(i, j).then(|| ((i * 5 + j) as f64 * 0.23).cos());
    let bools: Vec<u8> = (0..l * s).map(|x| keep(x / s, x % s) as u8).collect();
    let terms: Vec<f64> = (0..l * s).map(|x| added(x / s, x % s).unwrap_or(f64::NEG_INFINITY)).collect();
    let (q, k, v, g) = (vals(n * l * d, 0.1), vals(n * s * d, 1.3), vals(n * s * d, 2.9), vals(n * l * d, 4.2));
    let bytes = |x: &[f64]| bytemuck::cast_slice::<f64, u8>(x).to_vec();
    let (qb, kb, vb, gb) = (bytes(&q), bytes(&k), bytes(&v), bytes(&g));
    let terms_bytes = bytes(&terms);
    let bool_term = |i: usize, j: usize| keep(i, j).then_some(0.0);
    let cases: [(MaskBytes, Term); 2] = [
        (MaskBytes { bytes: &bools, kind: MaskKind::Bool }, &bool_term),
        (MaskBytes { bytes: &terms_bytes, kind: MaskKind::Added }, &added),
    ];
    for (mask, term) in cases {
        for causal in [false, true] {
            let fwd = AttentionSpec {
                q: view(l * d, d),
                k: view(s * d, d),
                v: view(s * d, d),
                out: view(l * d, d),
                batch: vec![n],
                l,
                s,
                d,
                causal,
                scale: 0.3,
                mask: Some(view(0, s)),
                dropout: None,
                mask_rule: None,
                offset: 0,
            };
            let (mut out, mut lse) = (vec![0u8; n * l * d * 8], vec![0u8; n * l * 8]);
            attention_bytes(&fwd, DType::F64, &qb, &kb, &vb, Some(mask), &mut out, Some(&mut lse)).unwrap();
            let spec = AttentionBackwardSpec {
                q: fwd.q.clone(),
                k: fwd.k.clone(),
                v: fwd.v.clone(),
                grad_out: fwd.out.clone(),
                out: fwd.out.clone(),
                dq: Some(view(l * d, d)),
                dk: Some(view(s * d, d)),
                dv: Some(view(s * d, d)),
                batch: vec![n],
                l,
                s,
                d,
                causal,
                scale: 0.3,
                mask: Some(view(0, s)),
                dropout: None,
            };
            let (mut dq, mut dk, mut dv) =
                (vec![0u8; n * l * d * 8], vec![0u8; n * s * d * 8], vec![0u8; n * s * d * 8]);
            let grads = GradBuffers::separate(Some(&mut dq), Some(&mut dk), Some(&mut dv));
            let bufs = BackwardBuffers {
                q: &qb,
                k: &kb,
                v: &vb,
                grad_out: &gb,
                lse: &lse,
                out: &out,
                grads,
                mask: Some(mask),
            };
            attention_backward_bytes(&spec, DType::F64, bufs).unwrap();
            let (o, lse): (&[f64], &[f64]) = (bytemuck::cast_slice(&out), bytemuck::cast_slice(&lse));
            assert!(lse[4].is_infinite() && lse[l + 4].is_infinite(), "row 4 keeps no key");
            let want = reference(&spec, (&q, &k, &v, &g, o, lse), term);
            for (name, got, want) in [("dq", &dq, &want[0]), ("dk", &dk, &want[1]), ("dv", &dv, &want[2])] {
                let got: &[f64] = bytemuck::cast_slice(got);
                for (i, (a, b)) in got.iter().zip(want).enumerate() {
                    assert!((a - b).abs() < 1e-12, "{:?} causal={causal} {name}[{i}]: {a} vs {b}", mask.kind);
                }
            }
            let dq: &[f64] = bytemuck::cast_slice(&dq);
            assert!(dq[4 * d..5 * d].iter().all(|&x| x == 0.0), "a row that keeps no key: dq 0");
        }
    }
}

#[test]
fn a_mask_view_reaching_outside_its_buffer_is_an_error() {
    let (l, s, d) = (4, 4, 8);
    let spec = AttentionBackwardSpec {
        q: view(l * d, d),
        k: view(s * d, d),
        v: view(s * d, d),
        grad_out: view(l * d, d),
        out: view(l * d, d),
        dq: Some(view(l * d, d)),
        dk: None,
        dv: None,
        batch: vec![2],
        l,
        s,
        d,
        causal: false,
        scale: 0.3,
        mask: Some(view(l * s, s)),
        dropout: None,
    };
    let e = spec.check_mask(Some(31)).unwrap_err();
    assert!(e.to_string().contains("mask view reaches element 31 of 31"), "{e}");
    assert!(spec.check_mask(None).is_err());
    assert!(spec.check_mask(Some(32)).is_ok());
}

/// One case of the blocked backward against the definition.
#[derive(Clone, Copy, Debug)]
struct Case {
    l: usize,
    s: usize,
    d: usize,
    causal: bool,
    mask: Option<MaskKind>,
    dropout: bool,
    /// q, k, v, the output and its gradient as `[l, n, d]` (heads inside rows), and dq
    /// written transposed (`[d, l]` per batch index).
    strided: bool,
    /// dq, dk, dv wanted.
    wanted: [bool; 3],
    /// dk and dv in one buffer (dk first, dv after it).
    shared: bool,
}

impl Case {
    fn new(l: usize, s: usize, d: usize, causal: bool) -> Case {
        Case { l, s, d, causal, mask: None, dropout: false, strided: false, wanted: [true; 3], shared: false }
    }
}

/// Values exact in f32 (so the f32 and f64 runs see the same operands).
fn vals32(n: usize, seed: f64) -> Vec<f64> {
    (0..n).map(|i| ((i as f64) * 0.37 + seed).sin() as f32 as f64).collect()
}

/// The view of `[n, rows, d]` logical values: contiguous, or `[rows, n, d]` when strided.
fn layout(n: usize, rows: usize, d: usize, strided: bool) -> StridedOperand<usize> {
    match strided {
        false => view(rows * d, d),
        true => {
            StridedOperand { buffer: BufferId(0), offset: 0, batch_strides: vec![d], row_stride: n * d, col_stride: 1 }
        }
    }
}

/// Logical `[n, rows, d]` values laid out in a buffer by `op`.
fn lay(x: &[f64], op: &StridedOperand<usize>, (n, rows, d): (usize, usize, usize)) -> Vec<f64> {
    let mut out = vec![f64::NAN; op.offset + n * rows * d];
    for b in 0..n {
        for i in 0..rows {
            for c in 0..d {
                out[op.offset + b * op.batch_strides[0] + i * op.row_stride + c * op.col_stride] =
                    x[(b * rows + i) * d + c];
            }
        }
    }
    out
}

/// The logical `[n, rows, d]` values of a buffer read through `op`.
fn gather(x: &[f64], op: &StridedOperand<usize>, (n, rows, d): (usize, usize, usize)) -> Vec<f64> {
    let mut out = Vec::with_capacity(n * rows * d);
    for b in 0..n {
        for i in 0..rows {
            for c in 0..d {
                out.push(x[op.offset + b * op.batch_strides[0] + i * op.row_stride + c * op.col_stride]);
            }
        }
    }
    out
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

/// Runs `case` with every compiled copy, f64 and f32, against the definition.
fn check(case: Case) {
    let Case { l, s, d, causal, mask, dropout, strided, wanted, shared } = case;
    let n = 2;
    // A mask broadcast over the batch with a row that keeps no key (row 4), added terms that
    // vary; causal rows see their own key unless the mask drops it.
    let keep = |i: usize, j: usize| i != 4 && (i * 3 + j) % 7 != 2;
    let added = |i: usize, j: usize| keep(i, j).then(|| ((i * 5 + j) as f64 * 0.23).cos());
    let bools: Vec<u8> = (0..l * s).map(|x| keep(x / s, x % s) as u8).collect();
    let terms: Vec<f64> = (0..l * s).map(|x| added(x / s, x % s).unwrap_or(f64::NEG_INFINITY)).collect();
    let bool_term = |i: usize, j: usize| keep(i, j).then_some(0.0);
    let none = |_: usize, _: usize| Some(0.0);
    let term: Term = match mask {
        None => &none,
        Some(MaskKind::Bool) => &bool_term,
        Some(MaskKind::Added) => &added,
    };
    let draw = dropout.then(|| DropoutDraw {
        seed: 0x5eed,
        start: 1234,
        threshold: coil_ir::philox::dropout_threshold(0.3),
        scale: 1.0 / 0.7,
    });
    let (q, k, v, g) = (vals32(n * l * d, 0.1), vals32(n * s * d, 1.3), vals32(n * s * d, 2.9), vals32(n * l * d, 4.2));
    let (lq, ls) = (layout(n, l, d, strided), layout(n, s, d, strided));
    let mask_view = mask.map(|_| view(0, s));
    let fwd = AttentionSpec {
        q: lq.clone(),
        k: ls.clone(),
        v: ls.clone(),
        out: lq.clone(),
        batch: vec![n],
        l,
        s,
        d,
        causal,
        scale: 0.3,
        mask: mask_view.clone(),
        dropout: draw,
        mask_rule: None,
        offset: 0,
    };
    let bytes = |x: &[f64]| bytemuck::cast_slice::<f64, u8>(x).to_vec();
    let (qb, kb, vb, gb) =
        (lay(&q, &lq, (n, l, d)), lay(&k, &ls, (n, s, d)), lay(&v, &ls, (n, s, d)), lay(&g, &lq, (n, l, d)));
    let terms_bytes = bytes(&terms);
    let mask_bytes = mask.map(|kind| match kind {
        MaskKind::Bool => MaskBytes { bytes: &bools, kind },
        MaskKind::Added => MaskBytes { bytes: &terms_bytes, kind },
    });
    let (mut out, mut lse) = (vec![0u8; qb.len() * 8], vec![0u8; n * l * 8]);
    attention_bytes(&fwd, DType::F64, &bytes(&qb), &bytes(&kb), &bytes(&vb), mask_bytes, &mut out, Some(&mut lse))
        .unwrap();
    let (out, lse): (Vec<f64>, Vec<f64>) = (bytemuck::cast_slice(&out).to_vec(), bytemuck::cast_slice(&lse).to_vec());
    let o = gather(&out, &lq, (n, l, d));
    let dq_view = match strided {
        false => view(l * d, d),
        true => {
            StridedOperand { buffer: BufferId(0), offset: 0, batch_strides: vec![l * d], row_stride: 1, col_stride: l }
        }
    };
    let dv_view = StridedOperand { offset: if shared { n * s * d } else { 0 }, ..view(s * d, d) };
    let spec = AttentionBackwardSpec {
        q: lq.clone(),
        k: ls.clone(),
        v: ls.clone(),
        grad_out: lq.clone(),
        out: lq.clone(),
        dq: wanted[0].then(|| dq_view.clone()),
        dk: wanted[1].then(|| view(s * d, d)),
        dv: wanted[2].then(|| dv_view.clone()),
        batch: vec![n],
        l,
        s,
        d,
        causal,
        scale: 0.3,
        mask: mask_view,
        dropout: draw,
    };
    let want = reference(&spec, (&q, &k, &v, &g, &o, &lse), term);
    for isa in isas() {
        for dtype in [DType::F64, DType::F32] {
            let what = format!("{isa:?} {dtype} {case:?}");
            // The operands in the dtype, and gradient buffers full of NaN (every wanted element
            // must be written).
            let to = |x: &[f64]| -> Vec<u8> {
                match dtype {
                    DType::F64 => bytes(x),
                    _ => bytemuck::cast_slice::<f32, u8>(&x.iter().map(|&y| y as f32).collect::<Vec<_>>()).to_vec(),
                }
            };
            let from = |x: &[u8]| -> Vec<f64> {
                match dtype {
                    DType::F64 => bytemuck::cast_slice(x).to_vec(),
                    _ => bytemuck::cast_slice::<u8, f32>(x).iter().map(|&y| y as f64).collect(),
                }
            };
            let nan = |elements: usize| to(&vec![f64::NAN; elements]);
            let (mut dq, mut dk, mut dv) =
                (nan(n * l * d), nan(if shared { 2 * n * s * d } else { n * s * d }), nan(n * s * d));
            let grads = match shared {
                false => GradBuffers::separate(
                    wanted[0].then_some(&mut dq[..]),
                    wanted[1].then_some(&mut dk[..]),
                    wanted[2].then_some(&mut dv[..]),
                ),
                true => GradBuffers { buffers: vec![&mut dq[..], &mut dk[..]], which: [Some(0), Some(1), Some(1)] },
            };
            let (qx, kx, vx, gx, ox, lx) = (to(&qb), to(&kb), to(&vb), to(&gb), to(&out), to(&lse));
            let mask32: Vec<u8>;
            let mask_bytes = match (dtype, mask) {
                (DType::F32, Some(MaskKind::Added)) => {
                    mask32 = to(&terms);
                    Some(MaskBytes { bytes: &mask32, kind: MaskKind::Added })
                }
                _ => mask_bytes,
            };
            let bufs =
                BackwardBuffers { q: &qx, k: &kx, v: &vx, grad_out: &gx, lse: &lx, out: &ox, grads, mask: mask_bytes };
            attention_backward_on(isa, &spec, dtype, bufs).unwrap();
            let tolerance = if dtype == DType::F64 { 1e-11 } else { 1e-4 };
            let results =
                [(&spec.dq, &dq, "dq"), (&spec.dk, &dk, "dk"), (&spec.dv, if shared { &dk } else { &dv }, "dv")];
            for ((op, got, name), want) in results.into_iter().zip(&want) {
                let Some(op) = op else { continue };
                let rows = if name == "dq" { l } else { s };
                let got = gather(&from(got), op, (n, rows, d));
                let top = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
                for (i, (a, b)) in got.iter().zip(want).enumerate() {
                    assert!((a - b).abs() <= tolerance * top, "{what}: {name}[{i}]: {a} vs {b}");
                }
            }
        }
    }
}

/// Sizes that are no multiple of the blocks (1, 63, 65, 130 rows and keys; head dims 1, 64,
/// 80, 128), causal and not.
#[test]
fn blocked_gradients_match_the_definition() {
    for (l, s, d, causal) in [
        (1, 1, 1, false),
        (63, 65, 64, false),
        (65, 63, 80, true),
        (130, 130, 128, true),
        (130, 130, 64, false),
        (1, 130, 64, true),
        (130, 1, 80, false),
        (130, 1, 80, true),
        (65, 130, 1, true),
    ] {
        check(Case::new(l, s, d, causal));
    }
}

/// Bool and added masks (a row that keeps no key, keys no row keeps), causal and not.
#[test]
fn blocked_masked_gradients_match_the_definition() {
    for (l, s, d, causal, kind) in [
        (130, 65, 64, false, MaskKind::Bool),
        (65, 130, 80, true, MaskKind::Added),
        (63, 63, 128, true, MaskKind::Bool),
        (130, 130, 1, false, MaskKind::Added),
    ] {
        check(Case { mask: Some(kind), ..Case::new(l, s, d, causal) });
    }
}

/// Dropout, alone and with a mask; strided operands and a transposed dq.
#[test]
fn blocked_dropout_and_strided_gradients_match_the_definition() {
    check(Case { dropout: true, ..Case::new(63, 130, 1, false) });
    check(Case { dropout: true, ..Case::new(130, 65, 64, true) });
    check(Case { dropout: true, mask: Some(MaskKind::Bool), ..Case::new(130, 63, 80, true) });
    check(Case { dropout: true, mask: Some(MaskKind::Added), ..Case::new(65, 65, 128, false) });
    check(Case { strided: true, ..Case::new(65, 130, 64, true) });
    check(Case { strided: true, dropout: true, mask: Some(MaskKind::Bool), ..Case::new(130, 65, 80, false) });
}

/// Subsets of the gradients, and dk and dv in one buffer.
#[test]
fn blocked_gradient_subsets_match_the_definition() {
    for wanted in [[true, false, false], [false, true, false], [false, false, true], [false, true, true]] {
        check(Case { wanted, ..Case::new(65, 63, 64, true) });
    }
    check(Case { shared: true, ..Case::new(65, 130, 80, false) });
}

/// f16 and bf16 operands compute in f32: the f32 run's gradients, rounded once.
#[test]
fn half_operands_compute_in_f32() {
    let (l, s, d, n) = (65, 70, 64, 2);
    let (q, k, v, g) = (vals32(n * l * d, 0.1), vals32(n * s * d, 1.3), vals32(n * s * d, 2.9), vals32(n * l * d, 4.2));
    let o = vals32(n * l * d, 5.7);
    let lse: Vec<f32> = (0..n * l).map(|i| 3.0 + (i as f32 * 0.1).sin()).collect();
    let spec = AttentionBackwardSpec {
        q: view(l * d, d),
        k: view(s * d, d),
        v: view(s * d, d),
        grad_out: view(l * d, d),
        out: view(l * d, d),
        dq: Some(view(l * d, d)),
        dk: Some(view(s * d, d)),
        dv: Some(view(s * d, d)),
        batch: vec![n],
        l,
        s,
        d,
        causal: true,
        scale: 0.3,
        mask: None,
        dropout: None,
    };
    let run = |dtype: DType, to: &dyn Fn(&[f64]) -> Vec<u8>, size: usize| -> [Vec<u8>; 3] {
        let (mut dq, mut dk, mut dv) =
            (vec![0u8; n * l * d * size], vec![0u8; n * s * d * size], vec![0u8; n * s * d * size]);
        let (qx, kx, vx, gx, ox) = (to(&q), to(&k), to(&v), to(&g), to(&o));
        let grads = GradBuffers::separate(Some(&mut dq), Some(&mut dk), Some(&mut dv));
        let lse = bytemuck::cast_slice::<f32, u8>(&lse);
        let bufs = BackwardBuffers { q: &qx, k: &kx, v: &vx, grad_out: &gx, lse, out: &ox, grads, mask: None };
        attention_backward_bytes(&spec, dtype, bufs).unwrap();
        [dq, dk, dv]
    };
    // The values rounded to f16 / bf16 first (through f32: exact), so the f32 run sees the
    // same operands; `round` rounds an f32 to the dtype and back.
    for dtype in [DType::F16, DType::BF16] {
        let round = |x: f32| match dtype {
            DType::F16 => f16::from_f32(x).to_f32(),
            _ => bf16::from_f32(x).to_f32(),
        };
        let half = |x: &[f64]| -> Vec<u8> {
            match dtype {
                DType::F16 => {
                    bytemuck::cast_slice(&x.iter().map(|&y| f16::from_f32(y as f32)).collect::<Vec<_>>()).to_vec()
                }
                _ => bytemuck::cast_slice(&x.iter().map(|&y| bf16::from_f32(y as f32)).collect::<Vec<_>>()).to_vec(),
            }
        };
        let single = |x: &[f64]| -> Vec<u8> {
            bytemuck::cast_slice(&x.iter().map(|&y| round(y as f32)).collect::<Vec<_>>()).to_vec()
        };
        let (got, want) = (run(dtype, &half, 2), run(DType::F32, &single, 4));
        for (got, want) in got.iter().zip(&want) {
            let want: &[f32] = bytemuck::cast_slice(want);
            let got: Vec<f32> = match dtype {
                DType::F16 => bytemuck::cast_slice::<u8, f16>(got).iter().map(|h| h.to_f32()).collect(),
                _ => bytemuck::cast_slice::<u8, bf16>(got).iter().map(|h| h.to_f32()).collect(),
            };
            for (i, (&a, &b)) in got.iter().zip(want).enumerate() {
                assert_eq!(a, round(b), "{dtype} [{i}]: {a} vs the f32 run's {b}");
            }
        }
    }
}
