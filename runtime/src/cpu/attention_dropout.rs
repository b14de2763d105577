//! Dropout inside the attention templates as one run draws it ([`DropoutDraw`]): the call's
//! [`AttentionDropout`] bound to the run's [`RandomState`] of its stream. The keep decision of
//! probability `(b, row, key)` is [`coil_ir::philox::dropout_keeps`] at counter
//! `state.offset + dropout.offset + (b * l + row) * s + key`: element for element what
//! `Op::Dropout` of the same stream and offset keeps of the `[*batch, l, s]` probabilities.
//! The CPU kernels and the CUDA launch (which passes these words as arguments) share it.

use coil_ir::op::AttentionDropout;
use coil_ir::{philox, Error, RandomState, Result};

/// Attention's dropout in one run: key, counter of probability 0, the keep threshold and the
/// factor on kept weights.
///
/// ```
/// use coil_ir::{op::AttentionDropout, RandomState};
/// use coil_runtime::cpu::attention_dropout::DropoutDraw;
/// let d = AttentionDropout { p: 0.5, stream: 0, offset: 10 };
/// let draw = DropoutDraw::of(Some(d), &[RandomState { seed: 7, offset: 100 }])?.unwrap();
/// assert_eq!((draw.seed, draw.start, draw.threshold), (7, 110, 1 << 23));
/// assert_eq!(draw.scale, 2.0);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutDraw {
    /// The Philox key (the stream's seed).
    pub seed: u64,
    /// The counter of probability 0 (batch 0, row 0, key 0): the stream's offset plus the op's.
    pub start: u64,
    /// Kept iff the top 24 bits of the uniform word (`word >> 8`) are at least this ([`philox::dropout_threshold`]).
    pub threshold: u32,
    /// The factor on kept weights, `1 / (1 - p)`.
    pub scale: f64,
}

impl DropoutDraw {
    /// The call's dropout bound to the run's random streams (`None` without dropout); an
    /// error when the run has no stream `dropout.stream`.
    pub fn of(dropout: Option<AttentionDropout>, random: &[RandomState]) -> Result<Option<DropoutDraw>> {
        let Some(d) = dropout else { return Ok(None) };
        let state = random.get(d.stream).ok_or_else(|| {
            Error::value(format!(
                "scaled_dot_product_attention draws its dropout from random stream {}, but the run has {} random streams",
                d.stream,
                random.len()
            ))
        })?;
        Ok(Some(DropoutDraw {
            seed: state.seed,
            start: state.offset.wrapping_add(d.offset),
            threshold: philox::dropout_threshold(d.p),
            scale: d.scale(),
        }))
    }

    /// Whether probability `index` (flat, row-major over `[*batch, l, s]`) is kept.
    #[inline]
    pub fn keeps(&self, index: u64) -> bool {
        philox::dropout_keeps(self.seed, self.start.wrapping_add(index), self.threshold)
    }

    /// The words a kernel takes for it: key, counter of probability 0 and threshold (as u64).
    pub fn words(&self) -> [u64; 3] {
        [self.seed, self.start, self.threshold as u64]
    }

    /// [`DropoutDraw::keeps`] of probabilities `index .. index + LANES`, into `out`. Their
    /// counters lie in at most `BLOCKS` uniform blocks of four ([`philox::uniform_block`]):
    /// the Philox rounds of those blocks side by side (each a 32 x 32 -> 64-bit product per
    /// word pair), which vectorize, where one call per probability costs about as much as the
    /// attention's own arithmetic.
    #[inline(always)]
    pub fn keeps_lanes(&self, index: u64, out: &mut [bool; LANES]) {
        const BLOCK_SPACE: u64 = u64::MAX >> 2; // blocks wrap as the counters do
        let first = self.start.wrapping_add(index);
        let first_block = first >> 2;
        let (mut c0, mut c1, mut c2, mut c3) =
            ([0u32; BLOCKS], [0u32; BLOCKS], [philox::UNIFORM_TAG; BLOCKS], [0u32; BLOCKS]);
        for i in 0..BLOCKS {
            let block = first_block.wrapping_add(i as u64) & BLOCK_SPACE;
            (c0[i], c1[i]) = (block as u32, (block >> 32) as u32);
        }
        let (mut k0, mut k1) = (self.seed as u32, (self.seed >> 32) as u32);
        for r in 0..philox::ROUNDS {
            if r > 0 {
                (k0, k1) = (k0.wrapping_add(philox::W0), k1.wrapping_add(philox::W1));
            }
            for i in 0..BLOCKS {
                let (p0, p1) = (philox::M0 as u64 * c0[i] as u64, philox::M1 as u64 * c2[i] as u64);
                let (n0, n2) = ((p1 >> 32) as u32 ^ c1[i] ^ k0, (p0 >> 32) as u32 ^ c3[i] ^ k1);
                (c0[i], c1[i], c2[i], c3[i]) = (n0, p1 as u32, n2, p0 as u32);
            }
        }
        for (i, keep) in out.iter_mut().enumerate() {
            let counter = first.wrapping_add(i as u64);
            let block = ((counter >> 2).wrapping_sub(first_block) & BLOCK_SPACE) as usize;
            let word = [c0[block], c1[block], c2[block], c3[block]][(counter & 3) as usize];
            *keep = word >> 8 >= self.threshold;
        }
    }
}

/// Probabilities [`DropoutDraw::keeps_lanes`] decides at once.
pub const LANES: usize = 8;

/// The uniform blocks `LANES` consecutive counters can lie in.
const BLOCKS: usize = LANES / 4 + 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_what_dropout_keeps_and_missing_streams_are_errors() {
        let d = AttentionDropout { p: 0.3, stream: 1, offset: 5 };
        let random = [RandomState { seed: 1, offset: 0 }, RandomState { seed: 99, offset: 1000 }];
        let draw = DropoutDraw::of(Some(d), &random).unwrap().unwrap();
        for i in 0..1000u64 {
            let u = philox::uniform(99, 1005 + i) as f32;
            assert_eq!(draw.keeps(i), u >= 0.3f32);
        }
        // The lanes decide as one call each, across a carry into the counter's high word, a
        // carry into the block's high word, and the counters' wrap at 2^64.
        for start in [u32::MAX as u64 - 20, (u32::MAX as u64) * 4 - 9, u64::MAX - 12] {
            let high = DropoutDraw { start, ..draw };
            for first in [0u64, 1, 2, 3, 17, 1000] {
                let mut lanes = [false; LANES];
                high.keeps_lanes(first, &mut lanes);
                let each: Vec<bool> = (0..LANES as u64).map(|i| high.keeps(first + i)).collect();
                assert_eq!(lanes.to_vec(), each, "from {start} + {first}");
            }
        }
        assert_eq!(DropoutDraw::of(None, &[]).unwrap(), None);
        let e = DropoutDraw::of(Some(d), &random[..1]).unwrap_err();
        assert!(e.to_string().contains("random stream 1"), "{e}");
    }
}
