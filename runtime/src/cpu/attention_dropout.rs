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
    /// Kept iff the uniform word `w0 >> 8` is at least this ([`philox::dropout_threshold`]).
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
}

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
        assert_eq!(DropoutDraw::of(None, &[]).unwrap(), None);
        let e = DropoutDraw::of(Some(d), &random[..1]).unwrap_err();
        assert!(e.to_string().contains("random stream 1"), "{e}");
    }
}
