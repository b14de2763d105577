//! Philox 4x32-10: the counter-based random number generator behind [`crate::Op::Rand`].
//!
//! Philox (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC 2011)
//! maps a 128-bit counter and a 64-bit key to 128 random bits with no state, so any element of
//! a random tensor can be computed independently, on any device, in any order.
//!
//! **Where the numbers come from.** A random op of a graph names one of the graph's *random
//! streams* and an offset relative to it (`Rand { stream, offset }`); the stream's
//! [`RandomState`] (key `seed`, first counter `offset`) is a run-time argument of the graph
//! and of its kernels, never part of the graph, so the same program compiles once whatever the
//! numbers it draws. Element `i` of `Rand { stream: s, offset }` run with streams `states`
//! draws at key `states[s].seed` and counter `states[s].offset + offset + i`.
//!
//! **This module is the definition.** The reference interpreter calls it, and the CUDA C and C
//! code generators must reproduce exactly these bits and exactly these formulas:
//!
//! * element `i` of a draw at key `seed` from counter `offset` has the counter
//!   `c = offset + i` (the addition wraps modulo 2^64); Philox runs under the key
//!   `(lo32(seed), hi32(seed))`;
//! * uniform on `[0, 1)`: `(w >> 8) * 2^-24` ([`uniform`]), where `w` is the 32-bit *uniform
//!   word* of counter `c` ([`uniform_word`]): word `c mod 4` of the block
//!   `philox4x32_10((lo32(c / 4), hi32(c / 4), 1, 0))`. Four consecutive counters from a
//!   multiple of 4 share one block, so a kernel drawing for four neighbours (attention's
//!   dropout) runs Philox once for them; the block's counter word 2 is 1 so that no uniform
//!   block is ever a normal draw's;
//! * standard normal by Box–Muller on the block `philox4x32_10((lo32(c), hi32(c), 0, 0))`
//!   ([`words`]): `u1 = ((w0 >> 8) + 1) * 2^-24` in `(0, 1]`, `u2 = (w1 >> 8) * 2^-24` in
//!   `[0, 1)`, `n = sqrt(-2 ln u1) * cos(2 pi u2)` ([`normal`]).
//!
//! The integer part is bit-exact everywhere. The floating formulas are defined in f64 and then
//! rounded once to the tensor's dtype; the uniform value has 24 bits so it is exact in every
//! float dtype down to f32, and a backend that evaluates the normal formula in f32 differs
//! from this definition by a few ulp only.
//!
//! ```
//! use coil_ir::philox;
//! let w = philox::philox4x32_10([0, 0, 0, 0], [0, 0]);
//! assert_eq!(w, [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
//! let u = philox::uniform(42, 7);
//! assert!((0.0..1.0).contains(&u));
//! ```

/// A position in the Philox streams: key `seed`, counter `offset`. As a graph's run-time
/// argument it is where one random stream starts (its ops' offsets are relative to it); for a
/// pending random tensor, where its own draw starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RandomState {
    /// The Philox key.
    pub seed: u64,
    /// The counter.
    pub offset: u64,
}

impl RandomState {
    /// The state `n` counters further on the same key (wrapping).
    pub fn advanced(self, n: u64) -> RandomState {
        RandomState { seed: self.seed, offset: self.offset.wrapping_add(n) }
    }
}

/// The name of stream `stream`'s key in printed IR and generated code: `seed0`, `seed1`, ...
pub fn seed_name(stream: usize) -> String {
    format!("seed{stream}")
}

/// The name of stream `stream`'s first counter in printed IR and generated code: `offset0`, ...
pub fn offset_name(stream: usize) -> String {
    format!("offset{stream}")
}

/// Round multiplier for words 0 and 1.
pub const M0: u32 = 0xD251_1F53;
/// Round multiplier for words 2 and 3.
pub const M1: u32 = 0xCD9E_8D57;
/// Key schedule increment (golden ratio) for key word 0.
pub const W0: u32 = 0x9E37_79B9;
/// Key schedule increment (sqrt(3) - 1) for key word 1.
pub const W1: u32 = 0xBB67_AE85;
/// Number of rounds.
pub const ROUNDS: usize = 10;

/// `2^-24`: the spacing of the 24-bit uniform grid.
const TWO_POW_M24: f64 = 1.0 / 16_777_216.0;

/// High and low 32-bit halves of the 64-bit product `a * b`.
#[inline]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// One Philox round.
#[inline]
fn round(c: [u32; 4], k: [u32; 2]) -> [u32; 4] {
    let (hi0, lo0) = mulhilo(M0, c[0]);
    let (hi1, lo1) = mulhilo(M1, c[2]);
    [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
}

/// Philox 4x32 with 10 rounds: four random words for one `counter` under `key`.
///
/// Each round multiplies words 0 and 2 by [`M0`] / [`M1`], mixes the high halves with words
/// 1 and 3 and the key, and permutes; between rounds the key is bumped by [`W0`] / [`W1`]
/// (wrapping).
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for r in 0..ROUNDS {
        if r > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        c = round(c, k);
    }
    c
}

/// The four words of the normal draw at counter `index` (already offset) of a stream keyed by
/// `seed`: the block `(lo32(index), hi32(index), 0, 0)`.
pub fn words(seed: u64, index: u64) -> [u32; 4] {
    philox4x32_10([index as u32, (index >> 32) as u32, 0, 0], key(seed))
}

/// Counter word 2 of the uniform blocks ([`uniform_block`]): 1, where the normal draws'
/// blocks ([`words`]) have 0, so the two never share a block.
pub const UNIFORM_TAG: u32 = 1;

/// The uniform block `block` of a stream keyed by `seed`: the uniform words of the counters
/// `4 * block .. 4 * block + 3` ([`uniform_word`]).
pub fn uniform_block(seed: u64, block: u64) -> [u32; 4] {
    philox4x32_10([block as u32, (block >> 32) as u32, UNIFORM_TAG, 0], key(seed))
}

/// The uniform word of counter `index` (= `offset + i`, wrapping) of the stream `seed`: word
/// `index % 4` of [`uniform_block`] `index / 4`.
///
/// ```
/// use coil_ir::philox::{uniform_block, uniform_word};
/// let block = uniform_block(9, 25);
/// assert_eq!([100, 101, 102, 103].map(|c| uniform_word(9, c)), block);
/// ```
pub fn uniform_word(seed: u64, index: u64) -> u32 {
    uniform_block(seed, index >> 2)[(index & 3) as usize]
}

/// The Philox key of `seed`: its low and high halves.
fn key(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

/// Uniform on `[0, 1)` for element `index` (= `offset + i`, wrapping) of the stream `seed`:
/// `(w >> 8) * 2^-24` of its [`uniform_word`] `w`, a multiple of `2^-24`.
pub fn uniform(seed: u64, index: u64) -> f64 {
    (uniform_word(seed, index) >> 8) as f64 * TWO_POW_M24
}

/// The keep threshold of dropout with probability `p` on the 24-bit uniform grid: element
/// `index` is kept iff `uniform_word(seed, index) >> 8 >= dropout_threshold(p)`
/// ([`dropout_keeps`]). This is `uniform >= p` compared in f32, as [`crate::Op::Dropout`]'s
/// decomposition compares (its uniform numbers are f32 and `p` is rounded to f32): the
/// uniform number `u = n * 2^-24` is exact in f32, so `u >= f32(p)` iff
/// `n >= ceil(f32(p) * 2^24)`. Kernels compare the integers.
///
/// ```
/// use coil_ir::philox::dropout_threshold;
/// assert_eq!(dropout_threshold(0.5), 1 << 23);
/// assert_eq!(dropout_threshold(0.0), 0);
/// assert_eq!(dropout_threshold(0.1), 1677722);
/// ```
pub fn dropout_threshold(p: f64) -> u32 {
    ((p as f32) as f64 * 16_777_216.0).ceil().clamp(0.0, 16_777_216.0) as u32
}

/// Whether dropout keeps element `index` (= `offset + i`, wrapping) of the stream `seed`,
/// `threshold` being [`dropout_threshold`] of its probability.
pub fn dropout_keeps(seed: u64, index: u64, threshold: u32) -> bool {
    uniform_word(seed, index) >> 8 >= threshold
}

/// Standard normal for element `index` (= `offset + i`, wrapping) of the stream `seed`, by
/// Box–Muller on the first two words: `sqrt(-2 ln u1) * cos(2 pi u2)` with
/// `u1 = ((w0 >> 8) + 1) * 2^-24` (never 0, so the log is finite) and `u2 = (w1 >> 8) * 2^-24`.
pub fn normal(seed: u64, index: u64) -> f64 {
    let w = words(seed, index);
    let u1 = ((w[0] >> 8) as f64 + 1.0) * TWO_POW_M24;
    let u2 = (w[1] >> 8) as f64 * TWO_POW_M24;
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
    #[test]
    fn known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn counter_and_key_layout() {
        let (seed, index) = (0x0123_4567_89ab_cdefu64, 0xfedc_ba98_7654_3210u64);
        assert_eq!(words(seed, index), philox4x32_10([0x7654_3210, 0xfedc_ba98, 0, 0], [0x89ab_cdef, 0x0123_4567]));
        let block = index >> 2;
        let w = philox4x32_10([block as u32, (block >> 32) as u32, 1, 0], [0x89ab_cdef, 0x0123_4567]);
        assert_eq!(uniform(seed, index), (w[(index & 3) as usize] >> 8) as f64 / 16_777_216.0);
        // The uniform and normal draws of one counter come from different blocks.
        assert_ne!(uniform_block(seed, index)[0], words(seed, index)[0]);
    }

    fn mean_var(xs: impl Iterator<Item = f64>) -> (f64, f64, usize) {
        let v: Vec<f64> = xs.collect();
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
        (mean, var, v.len())
    }

    #[test]
    fn uniform_moments() {
        let n = 100_000u64;
        assert!((0..n).all(|i| (0.0..1.0).contains(&uniform(7, i))));
        let (mean, var, _) = mean_var((0..n).map(|i| uniform(7, i)));
        // standard errors: mean 0.0009, variance 0.0003
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
        assert!((var - 1.0 / 12.0).abs() < 0.002, "var {var}");
        // Neighbours (words of one block, and across blocks) are uncorrelated: the lag-1
        // correlation's standard error is 1 / sqrt(n) = 0.0032.
        let lag1 = (0..n - 1).map(|i| (uniform(7, i) - 0.5) * (uniform(7, i + 1) - 0.5)).sum::<f64>() / (n - 1) as f64;
        assert!((lag1 * 12.0).abs() < 0.016, "lag-1 correlation {}", lag1 * 12.0);
    }

    #[test]
    fn normal_moments() {
        let n = 100_000u64;
        let (mean, var, _) = mean_var((0..n).map(|i| normal(1234, 1000 + i)));
        // standard errors: mean 0.0032, variance 0.0045
        assert!(mean.abs() < 0.016, "mean {mean}");
        assert!((var - 1.0).abs() < 0.025, "var {var}");
        assert!((0..n).all(|i| normal(1234, i).is_finite()));
    }

    #[test]
    fn dropout_threshold_is_the_f32_comparison() {
        for p in [0.1, 0.25, 0.3, 0.5, 0.7, 0.9, 1e-3, 0.123456789, 0.999] {
            let t = dropout_threshold(p);
            for i in 0..20_000u64 {
                let u = uniform(11, i) as f32;
                assert_eq!(dropout_keeps(11, i, t), u >= p as f32, "p {p} element {i}");
            }
            // Near the threshold on the grid itself.
            for n in t.saturating_sub(2)..t + 2 {
                assert_eq!(n >= t, (n as f64 / 16_777_216.0) as f32 >= p as f32, "p {p} n {n}");
            }
        }
    }

    #[test]
    fn streams_differ_by_seed_and_offset() {
        assert_ne!(uniform(1, 0), uniform(2, 0));
        assert_ne!(uniform(1, 0), uniform(1, 1));
        assert_ne!(uniform(1, 0), uniform(1, 1 << 32));
    }
}
