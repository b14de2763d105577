//! The backward kernels with an explicit mask, emulated on the host (see the parent module)
//! against the CPU implementation: bool and added masks, broadcast over batch or head dims
//! (stride 0), rows that keep no key (logsumexp `-inf`: zero gradients, no NaN), keys past the
//! end of a mask's keep, sizes that are not multiples of the tiles; the tensor-core kernels
//! (bf16, f16) and the simple ones (f32, bf16); each again with dropout, then also against the
//! decomposition's definition.

use super::backward::{check_backward, BackwardCase, BackwardMask};
use super::*;

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

#[test]
fn masked_backward_kernels_emulated_on_the_host_match_the_cpu_implementation() {
    let mut builds = Builds::new("attention-backward-masked");
    let mma = |bf16, dp| AttentionBackwardKernel::Mma { bf16, dp };
    let simple = |dtype, dp| AttentionBackwardKernel::Simple { dtype, dp };
    let bools = |term, dims| BackwardMask { kind: MaskKind::Bool, term, dims };
    let added = |term, dims| BackwardMask { kind: MaskKind::Added, term, dims };
    let case = BackwardCase::new;
    let all = [true; 3];
    let cases = [
        // A padding mask `[B, 1, L, S]` over the heads, tails of both block kinds (70, 100), a
        // dead row and dead key tiles. The keys from 64 on are dropped for every row: a dK, dV
        // block and a key tile of every dQ block are skipped.
        case(mma(true, 64), DType::BF16, &[2, 2], (70, 100, 64), (false, false), all)
            .masked(bools(padding, [true, false]))
            .poisoned(64),
        // f16, head dim 40 padded to 48, an added `[L, S]` mask over batch and heads with dead
        // rows, causal too; dQ only, then dK and dV only.
        case(mma(false, 48), DType::F16, &[2, 2], (70, 70, 40), (true, false), [true, false, false])
            .masked(added(added_holes, [false; 2])),
        case(mma(false, 48), DType::F16, &[2, 2], (70, 70, 40), (true, false), [false, true, true])
            .masked(added(added_holes, [false; 2])),
        // The largest head dim, L > S, a bool mask per batch index.
        case(mma(true, 128), DType::BF16, &[2], (80, 50, 128), (false, false), all)
            .masked(bools(banded, [true, false])),
        // GPT-2's head views (heads merged on the output), an added mask per head.
        case(mma(true, 32), DType::BF16, &[1, 2], (40, 40, 32), (false, true), all)
            .masked(added(banded, [false, true])),
        // The simple kernels: f32 with GPT-2's head views and an added mask over the batch; bf16
        // with a bool padding mask, dK and dV only.
        case(simple(DType::F32, 16), DType::F32, &[1, 2], (33, 33, 16), (true, true), all)
            .masked(added(added_holes, [false; 2])),
        case(simple(DType::BF16, 32), DType::BF16, &[2], (20, 45, 24), (false, false), [false, true, true])
            .masked(bools(padding, [true, false])),
        // The mask and dropout together (BERT's padding mask with attention dropout), also
        // checked against the decomposition: the padding case with its skipped tiles and
        // poisoned keys; f16 causal with an added mask, both gradient subsets; D 128 (fragments
        // not held) per batch index; head views per head; the simple kernels, f32 and bf16.
        case(mma(true, 64), DType::BF16, &[2, 2], (70, 100, 64), (false, false), all)
            .masked(bools(padding, [true, false]))
            .poisoned(64)
            .dropped(0.1),
        case(mma(false, 48), DType::F16, &[2, 2], (70, 70, 40), (true, false), [true, false, false])
            .masked(added(added_holes, [false; 2]))
            .dropped(0.5),
        case(mma(false, 48), DType::F16, &[2, 2], (70, 70, 40), (true, false), [false, true, true])
            .masked(added(added_holes, [false; 2]))
            .dropped(0.5),
        case(mma(true, 128), DType::BF16, &[2], (80, 50, 128), (false, false), all)
            .masked(bools(banded, [true, false]))
            .dropped(0.3),
        case(mma(true, 32), DType::BF16, &[1, 2], (40, 40, 32), (false, true), all)
            .masked(added(banded, [false, true]))
            .dropped(0.1),
        case(simple(DType::F32, 16), DType::F32, &[1, 2], (33, 33, 16), (true, true), all)
            .masked(added(added_holes, [false; 2]))
            .dropped(0.5),
        case(simple(DType::BF16, 32), DType::BF16, &[2], (20, 45, 24), (false, false), all)
            .masked(bools(padding, [true, false]))
            .dropped(0.1),
    ];
    for c in &cases {
        if check_backward(&mut builds, c).is_none() {
            return;
        }
    }
}
