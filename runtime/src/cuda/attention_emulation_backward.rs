//! The backward kernels emulated on the host (see the parent module): one case type for every
//! backward case (maskless or masked, with dropout or without) and the runner they share. The
//! reference is the CPU implementation; a case with dropout is also checked against the
//! decomposition's definition ([`Definition`]), so the kernels keep what `Op::Dropout` keeps.

use super::definition::Definition;
use super::*;

/// A mask of a backward case: element (batch index of the mask's own dims, row, key) dropped
/// (`None`) or kept with the term added (`Some`, ignored for bool masks), over `[*dims, l, s]`
/// where each of `dims` is the case's batch dim or 1 (broadcast: stride 0).
#[derive(Clone, Copy)]
pub(super) struct BackwardMask {
    pub kind: MaskKind,
    pub term: fn(usize, usize, usize) -> Option<f32>,
    /// Per batch dim of the case, whether the mask has it (else size 1, stride 0).
    pub dims: [bool; 2],
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

/// One backward case: the kernel, the dtype, the forward's layout, its mask and dropout, and
/// which gradients are wanted.
pub(super) struct BackwardCase {
    pub kernel: AttentionBackwardKernel,
    pub dtype: DType,
    pub batch: Vec<usize>,
    pub l: usize,
    pub s: usize,
    pub d: usize,
    pub causal: bool,
    /// GPT-2's head views (batch `[B, H]`, `l == s`), else contiguous operands.
    pub heads: bool,
    /// The forward's explicit mask (the kernel's `_masked` entry point), if any.
    pub mask: Option<BackwardMask>,
    /// dq, dk, dv wanted.
    pub wanted: [bool; 3],
    /// Keys from here on are NaN in k and v: no tensor-core block may compute with them (the
    /// mask drops them for every row: their tiles are skipped), else the gradients are NaN.
    pub poison: Option<usize>,
    /// The forward's dropout probability ([`draw`]).
    pub dropout: Option<f64>,
}

impl BackwardCase {
    /// A case without mask, poison or dropout.
    pub fn new(
        kernel: AttentionBackwardKernel,
        dtype: DType,
        batch: &[usize],
        (l, s, d): (usize, usize, usize),
        (causal, heads): (bool, bool),
        wanted: [bool; 3],
    ) -> BackwardCase {
        BackwardCase {
            kernel,
            dtype,
            batch: batch.to_vec(),
            l,
            s,
            d,
            causal,
            heads,
            mask: None,
            wanted,
            poison: None,
            dropout: None,
        }
    }

    /// The case with this mask.
    pub fn masked(self, mask: BackwardMask) -> BackwardCase {
        BackwardCase { mask: Some(mask), ..self }
    }

    /// The case with dropout of probability `p`.
    pub fn dropped(self, p: f64) -> BackwardCase {
        BackwardCase { dropout: Some(p), ..self }
    }

    /// The case with keys from `from` on poisoned.
    pub fn poisoned(self, from: usize) -> BackwardCase {
        BackwardCase { poison: Some(from), ..self }
    }
}

/// Runs one case's kernel (its `_masked` entry point when the case has a mask) on the host,
/// eager and lazy, after the emulated delta kernel, against the CPU implementation (and, with
/// dropout, the decomposition's definition); `None` without g++. Every masked case must have a
/// row that keeps no key (zero gradients, no NaN).
pub(super) fn check_backward(builds: &mut Builds, c: &BackwardCase) -> Option<()> {
    let emulated = backward_kernel(c.kernel, c.mask.is_some());
    let exe = builds.get(&emulated)?;
    let (dtype, size, d) = (c.dtype, c.dtype.size_bytes(), c.d);
    // The forward on the CPU: its output (GPT-2's: heads merged, `[B, L, H, D]`, for head
    // views) and logsumexp, with the mask and the dropout. The output gradient has the
    // output's layout.
    let mut fwd = forward_spec(&c.batch, c.l, c.s, d, c.causal, c.heads);
    fwd.dropout = c.dropout.map(draw);
    let (mask, mask_kind) = match &c.mask {
        Some(m) => {
            let (bytes, view) = backward_mask(m, &c.batch, c.l, c.s, dtype);
            fwd.mask = Some(view);
            (bytes, Some(m.kind))
        }
        None => (vec![], None),
    };
    let mask_bytes = mask_kind.map(|kind| MaskBytes { bytes: &mask, kind });
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
    let lses = decode(DType::F32, &lse);
    if c.mask.is_some() {
        assert!(lses.contains(&f64::NEG_INFINITY), "every masked case has a row that keeps no key");
    }
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
        mask: fwd.mask.clone(),
        dropout: fwd.dropout,
    };
    let mut want: Vec<Vec<u8>> = (0..3).map(|i| if c.wanted[i] { vec![0u8; lens[i] * size] } else { vec![] }).collect();
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
        for (r, _) in lses.iter().enumerate().filter(|(_, x)| **x == f64::NEG_INFINITY) {
            assert!(dq[r * d..(r + 1) * d].iter().all(|&x| x == 0.0), "row {r} keeps no key: dq 0");
        }
    }
    // With dropout, the decomposition's gradients too (poisoned keys are never read by it
    // either: the mask drops them, so their weights are 0).
    let definition = c.dropout.map(|_| {
        let qkv = [decode(dtype, &q), decode(dtype, &k), decode(dtype, &v)];
        let def = Definition { spec: &fwd, dtype, qkv, mask: mask_kind.map(|kind| (&mask[..], kind)) };
        def.backward(&decode(dtype, &grad_out))
    });
    // The backward kernel reads the delta the emulated delta kernel computed.
    let delta = emulated_delta(builds, &spec, dtype, &out, &grad_out)?;
    let count = spec.batch_count();
    let (grid, key_blocks) = backward_grid(count, c.l, c.s, c.wanted[0], c.wanted[1] || c.wanted[2]);
    let params =
        param_bytes(&backward_params(&spec, [&spec.q, &spec.k, &spec.v, &spec.grad_out], key_blocks, mask_kind));
    let outputs = (0..3).map(|i| vec![0xffu8; want[i].len()]);
    // No mask: the mask's pointer null; dS not stored: the last pointer null.
    let buffers: Vec<Vec<u8>> =
        [q, k.clone(), v, grad_out, lse, delta].into_iter().chain(outputs).chain([mask, vec![]]).collect();
    let runs = launch_runs(&exe, &builds.root.join(&emulated.name), &params, grid, emulated.block, &buffers);
    let tolerance = if dtype == DType::F32 { 1e-4 } else { 2e-2 };
    let check = |grads: [&Vec<u8>; 3], how: &str| {
        for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
            if !c.wanted[i] {
                continue;
            }
            let what = format!(
                "{} {:?} L={} S={} causal={} mask={:?} dropout={:?} {how} {name}",
                emulated.name,
                c.batch,
                c.l,
                c.s,
                c.causal,
                c.mask.map(|m| m.kind),
                c.dropout
            );
            let got = decode(dtype, grads[i]);
            let err = error(&what, &got, &decode(dtype, &want[i]));
            assert!(err <= tolerance, "{what}: relative error {err:.2e} (tolerance {tolerance:.0e})");
            if let Some(def) = &definition {
                let what = format!("{what} (the decomposition)");
                let err = error(&what, &got, &def[i]);
                assert!(err <= tolerance, "{what}: relative error {err:.2e} (tolerance {tolerance:.0e})");
            }
        }
    };
    for (got, lazy) in runs.iter().zip([false, true]) {
        check([&got[6], &got[7], &got[8]], &format!("lazy={lazy}"));
    }
    // Where the rule stores dS: the dK, dV blocks alone writing it (into a poisoned workspace:
    // a tile the dQ kernel read unwritten would make dQ NaN), then the dQ kernel on it.
    let dkv = c.wanted[1] || c.wanted[2];
    if c.kernel.stores_ds(count, c.l, c.s, c.wanted[0], dkv, c.mask.is_some()) {
        let (grid, key_blocks) = backward_grid(count, c.l, c.s, false, dkv);
        let params =
            param_bytes(&backward_params(&spec, [&spec.q, &spec.k, &spec.v, &spec.grad_out], key_blocks, mask_kind));
        let mut buffers = buffers;
        buffers[10] = vec![0xffu8; AttentionBackwardKernel::ds_bytes(count, c.l, c.s)];
        let dir = builds.root.join(&emulated.name).join("stored");
        let stored = launch_runs(&exe, &dir, &params, grid, emulated.block, &buffers);
        let dq_kernel = dq_stored_kernel(c.kernel);
        let dq_exe = builds.get(&dq_kernel)?;
        for (got, lazy) in stored.iter().zip([false, true]) {
            let dq_buffers = [k.clone(), got[10].clone(), vec![0xffu8; want[0].len()]];
            let grid = (count as u32, c.l.div_ceil(64) as u32, 1);
            let dir = builds.root.join(&dq_kernel.name);
            let dq_runs = launch_runs(&dq_exe, &dir, &params, grid, dq_kernel.block, &dq_buffers);
            for (dq, dq_lazy) in dq_runs.iter().zip([false, true]) {
                check([&dq[2], &got[7], &got[8]], &format!("stored dS (lazy={lazy}, dq lazy={dq_lazy})"));
            }
        }
    }
    Some(())
}

#[test]
fn backward_kernels_emulated_on_the_host_match_the_cpu_implementation() {
    let mut builds = Builds::new("attention-backward");
    let mma = |bf16, dp| AttentionBackwardKernel::Mma { bf16, dp };
    let simple = |dtype, dp| AttentionBackwardKernel::Simple { dtype, dp };
    let case = BackwardCase::new;
    let all = [true; 3];
    let cases = [
        // GPT-2 head views, causal, tail blocks of both kinds (100 = 64 + 36).
        case(mma(true, 64), DType::BF16, &[1, 1], (100, 100, 64), (true, true), all),
        // Not causal, L != S; dK and dV only.
        case(mma(true, 64), DType::BF16, &[2], (20, 100, 64), (false, false), [false, true, true]),
        // f16, head dim 40 padded to 48, causal; dQ only.
        case(mma(false, 48), DType::F16, &[2], (70, 70, 40), (true, false), [true, false, false]),
        // The largest head dim, L > S causal.
        case(mma(true, 128), DType::BF16, &[1], (80, 50, 128), (true, false), all),
        // Head dim 32, S > L causal (the last key blocks are seen by no row).
        case(mma(true, 32), DType::BF16, &[1, 1], (40, 150, 32), (true, false), all),
        // The simple kernel: f32 and bf16.
        case(simple(DType::F32, 16), DType::F32, &[1, 2], (33, 33, 16), (true, true), all),
        case(simple(DType::BF16, 32), DType::BF16, &[2], (20, 45, 24), (false, false), all),
        // Stored dS (rows a multiple of 8, no mask, dQ with dK or dV): causal with a tail block
        // of 32 rows, the largest head dim with L > S, head dim 40 with dV alone, not causal L < S.
        case(mma(true, 64), DType::BF16, &[1, 1], (96, 96, 64), (true, true), all),
        case(mma(true, 128), DType::BF16, &[1], (136, 72, 128), (true, false), all),
        case(mma(false, 48), DType::F16, &[2], (72, 72, 40), (true, false), [true, false, true]),
        case(mma(true, 64), DType::BF16, &[2], (40, 100, 64), (false, false), all),
        case(mma(true, 64), DType::BF16, &[1, 1], (96, 96, 64), (true, true), all).dropped(0.1),
        // Dropout regenerated: held fragments (D 64) and not (D 128), dQ alone, the simple kernel.
        case(mma(true, 64), DType::BF16, &[1, 1], (100, 100, 64), (true, true), all).dropped(0.1),
        case(mma(true, 128), DType::BF16, &[1], (80, 50, 128), (true, false), all).dropped(0.5),
        case(mma(false, 48), DType::F16, &[2], (70, 70, 40), (true, false), [true, false, false]).dropped(0.5),
        case(simple(DType::F32, 16), DType::F32, &[1, 2], (33, 33, 16), (true, true), all).dropped(0.5),
        case(simple(DType::BF16, 32), DType::BF16, &[2], (20, 45, 24), (false, false), all).dropped(0.1),
    ];
    for c in &cases {
        if check_backward(&mut builds, c).is_none() {
            return;
        }
    }
}
