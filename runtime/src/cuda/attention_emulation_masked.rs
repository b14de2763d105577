//! The backward kernels with an explicit mask, emulated on the host (see the parent module)
//! against the CPU implementation: bool and added masks, broadcast over batch or head dims
//! (stride 0), rows that keep no key (logsumexp `-inf`: zero gradients, no NaN), keys past the
//! end of a mask's keep, sizes that are not multiples of the tiles; the tensor-core kernels
//! (bf16, f16) and the simple ones (f32, bf16).

use super::*;

/// A mask of a backward case: element (batch index of the mask's own dims, row, key) dropped
/// (`None`) or kept with the term added (`Some`, ignored for bool masks), over `[*dims, l, s]`
/// where each of `dims` is the case's batch dim or 1 (broadcast: stride 0).
#[derive(Clone, Copy)]
struct BackwardMask {
    kind: MaskKind,
    term: fn(usize, usize, usize) -> Option<f32>,
    /// Per batch dim of the case, whether the mask has it (else size 1, stride 0).
    dims: [bool; 2],
}

/// The mask's bytes and its view over the scores `[*batch, l, s]`.
fn backward_mask(
    m: &BackwardMask,
    batch: &[usize],
    l: usize,
    s: usize,
    dtype: DType,
) -> (Vec<u8>, StridedOperand<usize>) {
    let sizes: Vec<usize> = batch.iter().zip(m.dims).map(|(&n, has)| if has { n } else { 1 }).collect();
    let count: usize = sizes.iter().product();
    let elements = (0..count * l * s).map(|x| (m.term)(x / (l * s), x / s % l, x % s));
    let bytes = match m.kind {
        MaskKind::Bool => elements.map(|t| t.is_some() as u8).collect(),
        MaskKind::Added => encode(dtype, &elements.map(|t| t.unwrap_or(f32::NEG_INFINITY)).collect::<Vec<_>>()),
    };
    let mut strides = vec![0; sizes.len()];
    let mut step = l * s;
    for i in (0..sizes.len()).rev() {
        if sizes[i] > 1 {
            strides[i] = step;
        }
        step *= sizes[i];
    }
    (bytes, strided(0, strides, s))
}

/// Padding: batch index `b` keeps keys below `60 - 17 b` (some whole key tiles dead), every
/// fifth dropped; row 3 keeps none.
fn padding(b: usize, row: usize, key: usize) -> Option<f32> {
    (row != 3 && key + 17 * b < 60 && key % 5 != 2).then_some(0.0)
}

/// Added terms, every third key dropped, rows 5 and 6 keep none.
fn added_holes(_: usize, row: usize, key: usize) -> Option<f32> {
    (row != 5 && row != 6 && key % 3 != 1).then(|| ((row * 13 + key * 7) as f32 * 0.29).sin() * 2.0)
}

/// Per batch index: a band around the diagonal, batch index 1's first row dead.
fn banded(b: usize, row: usize, key: usize) -> Option<f32> {
    let live = key + 20 >= row && key <= row + 10 + 5 * b && !(b == 1 && row == 0);
    live.then(|| ((row + 2 * key) as f32 * 0.11).cos())
}

/// One masked backward case.
struct MaskedCase {
    kernel: AttentionBackwardKernel,
    dtype: DType,
    batch: Vec<usize>,
    l: usize,
    s: usize,
    d: usize,
    causal: bool,
    /// GPT-2's head views (batch `[B, H]`, `l == s`), else contiguous operands.
    heads: bool,
    mask: BackwardMask,
    /// dq, dk, dv wanted.
    wanted: [bool; 3],
    /// Keys from here on are NaN in k and v: no tensor-core block may compute with them (the
    /// mask drops them for every row: their tiles are skipped), else the gradients are NaN.
    poison: Option<usize>,
}

#[test]
fn masked_backward_kernels_emulated_on_the_host_match_the_cpu_implementation() {
    let mut builds = Builds::new("attention-backward-masked");
    let mma = |bf16, dp| AttentionBackwardKernel::Mma { bf16, dp };
    let simple = |dtype, dp| AttentionBackwardKernel::Simple { dtype, dp };
    let bools = |term, dims| BackwardMask { kind: MaskKind::Bool, term, dims };
    let added = |term, dims| BackwardMask { kind: MaskKind::Added, term, dims };
    let all = [true; 3];
    let case = |kernel, dtype, batch: &[usize], (l, s, d), causal, heads, mask, wanted| MaskedCase {
        kernel,
        dtype,
        batch: batch.to_vec(),
        l,
        s,
        d,
        causal,
        heads,
        mask,
        wanted,
        poison: None,
    };
    let poisoned = |c: MaskedCase| MaskedCase { poison: Some(64), ..c };
    let cases = [
        // A padding mask `[B, 1, L, S]` over the heads, tails of both block kinds (70, 100), a
        // dead row and dead key tiles.
        // The keys from 64 on are dropped for every row: a dK, dV block and a key tile of every dQ
        // block are skipped.
        poisoned(case(
            mma(true, 64),
            DType::BF16,
            &[2, 2],
            (70, 100, 64),
            false,
            false,
            bools(padding, [true, false]),
            all,
        )),
        // f16, head dim 40 padded to 48, an added `[L, S]` mask over batch and heads with dead
        // rows, causal too; dQ only, then dK and dV only.
        case(
            mma(false, 48),
            DType::F16,
            &[2, 2],
            (70, 70, 40),
            true,
            false,
            added(added_holes, [false; 2]),
            [true, false, false],
        ),
        case(
            mma(false, 48),
            DType::F16,
            &[2, 2],
            (70, 70, 40),
            true,
            false,
            added(added_holes, [false; 2]),
            [false, true, true],
        ),
        // The largest head dim, L > S, a bool mask per batch index.
        case(mma(true, 128), DType::BF16, &[2], (80, 50, 128), false, false, bools(banded, [true, false]), all),
        // GPT-2's head views (heads merged on the output), an added mask per head.
        case(mma(true, 32), DType::BF16, &[1, 2], (40, 40, 32), false, true, added(banded, [false, true]), all),
        // The simple kernels: f32 with GPT-2's head views and an added mask over the batch; bf16
        // with a bool padding mask, dK and dV only.
        case(
            simple(DType::F32, 16),
            DType::F32,
            &[1, 2],
            (33, 33, 16),
            true,
            true,
            added(added_holes, [false; 2]),
            all,
        ),
        case(
            simple(DType::BF16, 32),
            DType::BF16,
            &[2],
            (20, 45, 24),
            false,
            false,
            bools(padding, [true, false]),
            [false, true, true],
        ),
    ];
    for c in cases {
        let emulated = backward_kernel(c.kernel, true);
        let Some(exe) = builds.get(&emulated) else { return };
        let (dtype, size, d) = (c.dtype, c.dtype.size_bytes(), c.d);
        // The forward on the CPU (its output and logsumexp), with the mask.
        let mut fwd = forward_spec(&c.batch, c.l, c.s, d, c.causal, c.heads);
        let (mask, view) = backward_mask(&c.mask, &c.batch, c.l, c.s, dtype);
        fwd.mask = Some(view.clone());
        let mask_bytes = Some(MaskBytes { bytes: &mask, kind: c.mask.kind });
        let [q, mut k, mut v] = operands(dtype, &fwd, c.heads);
        if let Some(from) = c.poison {
            let row = d * size;
            for b in 0..fwd.batch_count() {
                for x in [&mut k, &mut v] {
                    x[(b * c.s + from) * row..(b + 1) * c.s * row].fill(0xff);
                }
            }
        }
        let rows = fwd.batch_count() * c.l;
        let (mut out, mut lse) = (vec![0u8; rows * d * size], vec![0u8; rows * 4]);
        attention_bytes(&fwd, dtype, &q, &k, &v, mask_bytes, &mut out, Some(&mut lse)).unwrap();
        let dead = decode(DType::F32, &lse).iter().filter(|x| **x == f64::NEG_INFINITY).count();
        assert!(dead > 0, "every case has a row that keeps no key");
        let grad_out = seeded(dtype, 5, rows * d);
        let lens = [rows * d, fwd.batch_count() * c.s * d, fwd.batch_count() * c.s * d];
        let views = [contiguous(&c.batch, c.l, d), contiguous(&c.batch, c.s, d), contiguous(&c.batch, c.s, d)];
        let grad = |i: usize| c.wanted[i].then(|| views[i].clone());
        let spec = AttentionBackwardSpec {
            q: fwd.q.clone(),
            k: fwd.k.clone(),
            v: fwd.v.clone(),
            grad_out: fwd.out.clone(),
            out: fwd.out.clone(),
            dq: grad(0),
            dk: grad(1),
            dv: grad(2),
            batch: c.batch.clone(),
            l: c.l,
            s: c.s,
            d,
            causal: c.causal,
            scale: fwd.scale,
            mask: Some(view),
            dropout: None,
        };
        let mut want: Vec<Vec<u8>> =
            (0..3).map(|i| if c.wanted[i] { vec![0u8; lens[i] * size] } else { vec![] }).collect();
        {
            let [wq, wk, wv] = &mut want[..] else { unreachable!() };
            fn grad(w: &mut [u8]) -> Option<&mut [u8]> {
                (!w.is_empty()).then_some(w)
            }
            let bufs = BackwardBuffers {
                q: &q,
                k: &k,
                v: &v,
                grad_out: &grad_out,
                lse: &lse,
                out: &out,
                grads: GradBuffers::separate(grad(wq), grad(wk), grad(wv)),
                mask: mask_bytes,
            };
            attention_backward_bytes(&spec, dtype, bufs).unwrap();
        }
        if c.wanted[0] {
            // A row that keeps no key: its query gradient is 0 (the reference's own check).
            let dq = decode(dtype, &want[0]);
            let lses = decode(DType::F32, &lse);
            for (r, _) in lses.iter().enumerate().filter(|(_, x)| **x == f64::NEG_INFINITY) {
                assert!(dq[r * d..(r + 1) * d].iter().all(|&x| x == 0.0), "row {r} keeps no key: dq 0");
            }
        }
        let Some(delta) = emulated_delta(&mut builds, &spec, dtype, &out, &grad_out) else { return };
        let count = spec.batch_count();
        let (grid, key_blocks) = backward_grid(count, c.l, c.s, c.wanted[0], c.wanted[1] || c.wanted[2]);
        let views = [&spec.q, &spec.k, &spec.v, &spec.grad_out];
        let params = param_bytes(&backward_params(&spec, views, key_blocks, Some(c.mask.kind)));
        let outputs = (0..3).map(|i| vec![0xffu8; want[i].len()]);
        let buffers: Vec<Vec<u8>> = [q, k, v, grad_out, lse, delta].into_iter().chain(outputs).chain([mask]).collect();
        let runs = launch_runs(&exe, &builds.root.join(&emulated.name), &params, grid, emulated.block, &buffers);
        for (got, lazy) in runs.iter().zip([false, true]) {
            for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
                if !c.wanted[i] {
                    continue;
                }
                let what = format!(
                    "{} {:?} L={} S={} causal={} {:?} mask lazy={lazy} {name}",
                    emulated.name, c.batch, c.l, c.s, c.causal, c.mask.kind
                );
                let tolerance = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
                let err = error(&what, &decode(dtype, &got[6 + i]), &decode(dtype, &want[i]));
                assert!(err <= tolerance, "{what}: relative error {err:.2e} (tolerance {tolerance:.0e})");
            }
        }
    }
}
