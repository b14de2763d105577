//! The forward kernels with a structured mask's rule (`coil_ir::loops::MaskRule`), emulated on
//! the host (see the parent module), against the CPU implementation with the explicit bool mask
//! the rule stands for: grouped-query rows (a period) wrapping inside row blocks and tiles,
//! offsets read from the offset buffer, rows reaching past the keys, rows that see no key, every
//! kernel kind, the dtypes and head dims 64 and 128.

use super::*;
use coil_ir::loops::MaskRule;

/// One case: the kernel (the split kernels as the launch rule picks them for `sm_count` SMs),
/// `[*batch, l, d]` queries against `s` keys, the rule at `offset`.
struct RuleCase {
    kernel: AttentionKernel,
    dtype: DType,
    batch: Vec<usize>,
    l: usize,
    s: usize,
    d: usize,
    offset: i64,
    constant: i64,
    period: Option<usize>,
    sm_count: u32,
    /// Keys from here on are NaN in k and v: past every row's diagonal, their tiles must be
    /// skipped.
    poison: Option<usize>,
}

#[test]
fn mask_rules_emulated_on_the_host_match_the_explicit_mask() {
    let mut builds = Builds::new("attention-rules");
    let mma = |bf16, dp| AttentionKernel::Mma { bf16, dp };
    let split = |bf16, dp| AttentionKernel::SplitMma { bf16, dp };
    let simple = |dtype, dp| AttentionKernel::Simple { dtype, dp };
    let split_simple = |dtype, dp| AttentionKernel::SplitSimple { dtype, dp };
    let case = |kernel, dtype, batch: &[usize], (l, s, d), (offset, constant, period), sm_count| RuleCase {
        kernel,
        dtype,
        batch: batch.to_vec(),
        l,
        s,
        d,
        offset,
        constant,
        period,
        sm_count,
        poison: None,
    };
    let poisoned = |c: RuleCase| RuleCase { poison: Some(192), ..c };
    let cases = [
        // A Llama prefill at position 100: 4 query heads of 37 rows per key/value head (row
        // blocks of 64 wrap periods), keys up to 136 of 200.
        poisoned(case(mma(true, 64), DType::BF16, &[1, 2], (148, 200, 64), (100, 0, Some(37)), 0)),
        // f16, D = 128: 3 heads of 50 rows at 90 reach past the 120 keys; constant -1 (`lt`).
        case(mma(false, 128), DType::F16, &[2], (150, 120, 128), (90, -1, Some(50)), 0),
        // No period, a negative base: rows 0..2 see no key.
        case(mma(true, 64), DType::BF16, &[2], (74, 80, 64), (0, -3, None), 0),
        // The simple kernel: f32, grouped rows; and a plain offset with D = 128.
        case(simple(DType::F32, 64), DType::F32, &[2], (80, 100, 64), (30, 0, Some(40)), 0),
        case(simple(DType::F32, 128), DType::F32, &[1], (70, 90, 128), (5, 0, None), 0),
        // Decode steps: 4 query heads of one row at position 170 (3 splits of 2 tiles, the last
        // sees nothing), and of 2 rows at 150 with D = 128.
        poisoned(case(split(true, 64), DType::BF16, &[2], (4, 300, 64), (170, 0, Some(1)), 2)),
        case(split(true, 128), DType::BF16, &[1, 2], (8, 200, 128), (150, 0, Some(2)), 1),
        // f16, one split; the simple split kernel (f32).
        case(split(false, 64), DType::F16, &[3], (6, 130, 64), (60, 0, Some(3)), 1),
        poisoned(case(split_simple(DType::F32, 64), DType::F32, &[2], (4, 300, 64), (20, 0, Some(1)), 2)),
    ];
    for c in cases {
        let (dtype, l, s, d) = (c.dtype, c.l, c.s, c.d);
        let spec = forward_spec(&c.batch, l, s, d, false, false);
        let count = spec.batch_count();
        let rule = MaskRule { offset: Some(BufferId(7)), constant: c.constant, period: c.period };
        // The explicit mask the rule stands for, broadcast over the batch.
        let keep: Vec<u8> = (0..l * s).map(|x| rule.keeps(Some(c.offset), x / s, x % s) as u8).collect();
        let explicit = AttentionSpec { mask: Some(strided(0, vec![0; c.batch.len()], s)), ..spec.clone() };
        let [q, mut k, mut v] = operands(dtype, &spec, false);
        if let Some(from) = c.poison {
            let row = d * dtype.size_bytes();
            for b in 0..count {
                for x in [&mut k, &mut v] {
                    x[(b * s + from) * row..(b + 1) * s * row].fill(0xff);
                }
            }
        }
        let rows = count * l;
        let (mut want, mut want_lse) = (vec![0u8; rows * d * dtype.size_bytes()], vec![0u8; rows * 4]);
        let mask = Some(MaskBytes { bytes: &keep, kind: MaskKind::Bool });
        attention_bytes(&explicit, dtype, &q, &k, &v, mask, &mut want, Some(&mut want_lse)).unwrap();
        let spec = AttentionSpec { mask_rule: Some(rule.clone()), ..spec };
        let launch = match c.kernel {
            AttentionKernel::SplitMma { .. } | AttentionKernel::SplitSimple { .. } => {
                let target = GpuTarget { sm_count: c.sm_count, ..GpuTarget::h100() };
                let launch = ForwardLaunch::choose(dtype, d, &target, count, l, s, false).unwrap();
                assert_eq!(launch.kernel, c.kernel, "the launch rule's kernel");
                launch
            }
            kernel => {
                ForwardLaunch { kernel, grid: AttentionKernel::grid(count, l), chunk: 0, splits: 1, combine: None }
            }
        };
        let emulated = forward_kernel(launch.kernel, false);
        let Some(exe) = builds.get(&emulated) else { return };
        let params = param_bytes(&launch_params(&spec, [&spec.q, &spec.k, &spec.v], None, &launch));
        let workspace = vec![0xff; launch.workspace_bytes(count, l, d)];
        let (out, lse) = (vec![0xff; want.len()], vec![0xff; want_lse.len()]);
        let offset = c.offset.to_ne_bytes().to_vec();
        let buffers = [q, k, v, out, lse, vec![], workspace, offset];
        let dir = builds.root.join(&emulated.name);
        let runs = launch_runs(&exe, &dir, &params, launch.grid, emulated.block, &buffers);
        let Some(runs) = combined(&mut builds, &launch, &params, count, runs) else { return };
        check_forward_runs(&runs, dtype, &want, &want_lse, |lazy| {
            format!(
                "{} {:?} L={l} S={s} {rule} at {} splits={} lazy={lazy}",
                emulated.name, c.batch, c.offset, launch.splits
            )
        });
    }
}
