//! Random numbers in PTX, as the CUDA prelude's `coil_rand_uniform` and `coil_rand_normal`
//! compute them (and `coil_ir::philox` on the host): a uniform value in `[0, 1)` from the top
//! 24 bits of the counter's uniform word (word `c % 4` of Philox 4x32-10 of the block
//! `(c / 4, tag 1)`), or a normal one by Box-Muller in f64 on the block `(c, tag 0)`,
//! `sqrt(-2 log u1) * cos(2 pi u2)`. The uniform values of a vector group's consecutive
//! elements share their blocks ([`uniform_run`]): eight values take three Philox runs, not
//! eight.
//!
//! The key and the first counter of each random stream are kernel parameters (they change from
//! run to run; the kernel does not): [`stream_registers`] loads them once at the kernel's entry
//! and computes the ten rounds' keys there (18 adds per stream and kernel), so a draw has the
//! instructions it had when the keys were immediates, its xors reading registers that hold the
//! same value in every thread, plus one 64-bit add for the stream's first counter.
//!
//! PTX has no f64 `log` or `cos`, so both are written here for the arguments Box-Muller gives
//! them (`u1` in `[2^-24, 1]`, `u2` a multiple of `2^-24` in `[0, 1)`), to within a few f64
//! ulp: a result rounded to f32 matches the interpreter's except where the exact value lies
//! within about `1e-15` of a rounding boundary (then it is one f32 ulp off).

use super::asm::{Asm, Class, Opnd, Reg};
use super::f64math::{log_f64, sin_cos_f64};
use coil_ir::op::RandDist;
use coil_ir::philox::{self, ROUNDS};

/// `2^-24`: the spacing of the 24-bit uniforms.
const STEP: f64 = 5.960_464_477_539_063e-8;
/// One random stream in registers: the key words of each Philox round, and the stream's first
/// counter (`.b64`).
#[derive(Clone, Copy, Debug)]
pub struct StreamRegs {
    pub round_keys: [[Reg; 2]; ROUNDS],
    pub offset: Reg,
}

/// The registers of a stream whose key (`seed`) and first counter (`offset`) are the `.u64`
/// kernel parameters `seed_param` and `offset_param`.
pub fn stream_registers(a: &mut Asm, seed_param: &str, offset_param: &str) -> StreamRegs {
    use Class::*;
    let seed = a.reg(B64);
    a.ins(format!("ld.param.u64 {seed}, [{seed_param}]"));
    let offset = a.reg(B64);
    a.ins(format!("ld.param.u64 {offset}, [{offset_param}]"));
    let hi = a.op(B64, "shr.u64", &[seed.into(), Opnd::Int(32)]);
    let mut key = [a.op(B32, "cvt.u32.u64", &[seed.into()]), a.op(B32, "cvt.u32.u64", &[hi.into()])];
    let mut round_keys = [key; ROUNDS];
    for keys in round_keys.iter_mut().skip(1) {
        key = [
            a.op(B32, "add.u32", &[key[0].into(), Opnd::Hex(u64::from(philox::W0))]),
            a.op(B32, "add.u32", &[key[1].into(), Opnd::Hex(u64::from(philox::W1))]),
        ];
        *keys = key;
    }
    StreamRegs { round_keys, offset }
}

/// The value of `dist` at `counter` (a 64-bit register, the stream's first counter already
/// added) under `stream`'s key, in an f64 register.
pub fn random_f64(a: &mut Asm, dist: RandDist, stream: &StreamRegs, counter: Reg) -> Reg {
    let top24 = |a: &mut Asm, w: Reg| {
        let t = a.op(Class::B32, "shr.u32", &[w.into(), Opnd::Int(8)]);
        a.op(Class::F64, "cvt.rn.f64.u32", &[t.into()])
    };
    match dist {
        RandDist::Uniform => {
            let block = a.op(Class::B64, "shr.u64", &[counter.into(), Opnd::Int(2)]);
            let w = philox(a, &stream.round_keys, block, philox::UNIFORM_TAG);
            let word = uniform_word(a, w, counter);
            let u = top24(a, word);
            a.op(Class::F64, "mul.f64", &[u.into(), Opnd::F64(STEP)])
        }
        RandDist::Normal => {
            let w = philox(a, &stream.round_keys, counter, 0);
            let u = top24(a, w[0]);
            let u1 = a.op(Class::F64, "add.f64", &[u.into(), Opnd::F64(1.0)]);
            let u1 = a.op(Class::F64, "mul.f64", &[u1.into(), Opnd::F64(STEP)]);
            let u2 = top24(a, w[1]);
            let u2 = a.op(Class::F64, "mul.f64", &[u2.into(), Opnd::F64(STEP)]);
            let l = log_f64(a, u1);
            let l = a.op(Class::F64, "mul.f64", &[l.into(), Opnd::F64(-2.0)]);
            let r = a.op(Class::F64, "sqrt.rn.f64", &[l.into()]);
            let c = cos_2pi_f64(a, u2);
            a.op(Class::F64, "mul.f64", &[r.into(), c.into()])
        }
    }
}

/// The uniform blocks of a run of consecutive counters (the elements of a vector group draw
/// `first + i`): Philox once per block the run touches, where one draw per element runs it
/// once per counter. The run's first counter need not be a multiple of 4: `len` counters lie
/// in at most `(len + 2) / 4 + 1` blocks, whatever `first % 4` is at run time.
#[derive(Clone, Debug)]
pub struct UniformRun {
    /// `first % 4`.
    low: Reg,
    /// The words of blocks `first / 4 + j`.
    blocks: Vec<[Reg; 4]>,
}

/// The blocks of the run of `len` counters from `first` (a 64-bit register, the stream's
/// first counter added) under `stream`'s key.
pub fn uniform_run(a: &mut Asm, stream: &StreamRegs, first: Reg, len: usize) -> UniformRun {
    use Class::*;
    let first_low = a.op(B32, "cvt.u32.u64", &[first.into()]);
    let low = a.op(B32, "and.b32", &[first_low.into(), Opnd::Int(3)]);
    let first_block = a.op(B64, "shr.u64", &[first.into(), Opnd::Int(2)]);
    let blocks = (0..(len + 2) / 4 + 1)
        .map(|j| {
            let block = match j {
                0 => first_block,
                _ => {
                    // blocks wrap at 2^62 as the counters do at 2^64
                    let next = a.op(B64, "add.u64", &[first_block.into(), Opnd::Int(j as i64)]);
                    a.op(B64, "and.b64", &[next.into(), Opnd::Hex(u64::MAX >> 2)])
                }
            };
            philox(a, &stream.round_keys, block, philox::UNIFORM_TAG)
        })
        .collect();
    UniformRun { low, blocks }
}

/// The uniform value (f64) of counter `first + i` of `run`: word `(low + i) % 4` of block
/// `(low + i) / 4`, one of two blocks (`i / 4` and `ceil(i / 4)`) whatever `low` is.
pub fn uniform_run_f64(a: &mut Asm, run: &UniformRun, i: usize) -> Reg {
    use Class::*;
    let at = match i {
        0 => run.low,
        _ => a.op(B32, "add.u32", &[run.low.into(), Opnd::Int(i as i64)]),
    };
    let bits = word_bits(a, at);
    let (lo, hi) = (i / 4, i.div_ceil(4));
    let mut word = select_word(a, run.blocks[lo], bits);
    if hi != lo {
        let in_hi = a.op(Pred, "setp.ge.u32", &[at.into(), Opnd::Int(4 * hi as i64)]);
        let other = select_word(a, run.blocks[hi], bits);
        word = a.op(B32, "selp.b32", &[other.into(), word.into(), in_hi.into()]);
    }
    let top = a.op(B32, "shr.u32", &[word.into(), Opnd::Int(8)]);
    let u = a.op(F64, "cvt.rn.f64.u32", &[top.into()]);
    a.op(F64, "mul.f64", &[u.into(), Opnd::F64(STEP)])
}

/// Word `counter % 4` of the uniform block `w` (`counter`: a 64-bit register).
fn uniform_word(a: &mut Asm, w: [Reg; 4], counter: Reg) -> Reg {
    let low = a.op(Class::B32, "cvt.u32.u64", &[counter.into()]);
    let bits = word_bits(a, low);
    select_word(a, w, bits)
}

/// Bits 0 and 1 of `at` (a 32-bit register) as predicates: which word of a block.
fn word_bits(a: &mut Asm, at: Reg) -> (Reg, Reg) {
    use Class::*;
    let bit0 = a.op(B32, "and.b32", &[at.into(), Opnd::Int(1)]);
    let odd = a.op(Pred, "setp.ne.u32", &[bit0.into(), Opnd::Int(0)]);
    let bit1 = a.op(B32, "and.b32", &[at.into(), Opnd::Int(2)]);
    let high = a.op(Pred, "setp.ne.u32", &[bit1.into(), Opnd::Int(0)]);
    (odd, high)
}

/// The word of block `w` that [`word_bits`] name: two selections.
fn select_word(a: &mut Asm, w: [Reg; 4], (odd, high): (Reg, Reg)) -> Reg {
    use Class::*;
    let w01 = a.op(B32, "selp.b32", &[w[1].into(), w[0].into(), odd.into()]);
    let w23 = a.op(B32, "selp.b32", &[w[3].into(), w[2].into(), odd.into()]);
    a.op(B32, "selp.b32", &[w23.into(), w01.into(), high.into()])
}

/// Philox 4x32-10 (Salmon et al. 2011) of the counter `(lo32(block), hi32(block), tag, 0)`
/// under the round keys `keys` (registers): each round two 32x32 products and four xors, two
/// of them with the round's keys.
fn philox(a: &mut Asm, keys: &[[Reg; 2]; ROUNDS], block: Reg, tag: u32) -> [Reg; 4] {
    use Class::*;
    let mut c0 = a.op(B32, "cvt.u32.u64", &[block.into()]);
    let hi = a.op(B64, "shr.u64", &[block.into(), Opnd::Int(32)]);
    let mut c1 = a.op(B32, "cvt.u32.u64", &[hi.into()]);
    let mut c2 = a.op(B32, "mov.b32", &[Opnd::Int(i64::from(tag))]);
    let mut c3 = a.op(B32, "mov.b32", &[Opnd::Int(0)]);
    for [k0, k1] in keys {
        let p0_hi = a.op(B32, "mul.hi.u32", &[c0.into(), Opnd::Hex(u64::from(philox::M0))]);
        let p0_lo = a.op(B32, "mul.lo.u32", &[c0.into(), Opnd::Hex(u64::from(philox::M0))]);
        let p1_hi = a.op(B32, "mul.hi.u32", &[c2.into(), Opnd::Hex(u64::from(philox::M1))]);
        let p1_lo = a.op(B32, "mul.lo.u32", &[c2.into(), Opnd::Hex(u64::from(philox::M1))]);
        let n0 = a.op(B32, "xor.b32", &[p1_hi.into(), c1.into()]);
        let n0 = a.op(B32, "xor.b32", &[n0.into(), (*k0).into()]);
        let n2 = a.op(B32, "xor.b32", &[p0_hi.into(), c3.into()]);
        let n2 = a.op(B32, "xor.b32", &[n2.into(), (*k1).into()]);
        (c0, c1, c2, c3) = (n0, p1_lo, n2, p0_lo);
    }
    [c0, c1, c2, c3]
}

/// `cos(2 pi u)` for `u` in `[0, 1)`: `4u = q + f` with `q` the nearest integer and `|f| <= 1/2`
/// (both exact), so the angle is `q pi/2 + a` with `a = f pi/2` in `[-pi/4, pi/4]`; `cos a` and
/// `sin a` by their Taylor series to the `a^16` and `a^17` terms (the next below `1e-18`), and
/// the quadrant `q mod 4` picks `cos a`, `-sin a`, `-cos a` or `sin a`.
fn cos_2pi_f64(a: &mut Asm, u: Reg) -> Reg {
    use Class::*;
    let t = a.op(F64, "mul.f64", &[u.into(), Opnd::F64(4.0)]);
    let q = a.op(F64, "cvt.rni.f64.f64", &[t.into()]);
    let f = a.op(F64, "sub.f64", &[t.into(), q.into()]);
    let x = a.op(F64, "mul.f64", &[f.into(), Opnd::F64(std::f64::consts::FRAC_PI_2)]);
    let (sin, cos) = sin_cos_f64(a, x);
    let qi = a.op(B32, "cvt.rzi.s32.f64", &[q.into()]);
    let odd_bit = a.op(B32, "and.b32", &[qi.into(), Opnd::Int(1)]);
    let odd = a.op(Pred, "setp.ne.u32", &[odd_bit.into(), Opnd::Int(0)]);
    let v = a.op(F64, "selp.f64", &[sin.into(), cos.into(), odd.into()]);
    // quadrants 1 and 2 are negative: bit 1 of q + 1
    let q1 = a.op(B32, "add.u32", &[qi.into(), Opnd::Int(1)]);
    let neg_bit = a.op(B32, "and.b32", &[q1.into(), Opnd::Int(2)]);
    let neg = a.op(Pred, "setp.ne.u32", &[neg_bit.into(), Opnd::Int(0)]);
    let nv = a.op(F64, "neg.f64", &[v.into()]);
    a.op(F64, "selp.f64", &[nv.into(), v.into(), neg.into()])
}

#[cfg(test)]
mod tests {
    use super::super::f64math::{taylor_coeff, LN2_HI, LN2_LO, SQRT2_BITS};
    use super::*;

    /// The series of `log_f64` and `cos_2pi_f64`, evaluated on the host in the same order,
    /// against `std` over the arguments Box-Muller gives them.
    #[test]
    fn the_f64_series_match_std() {
        let log = |x: f64| {
            let bits = x.to_bits();
            let mant = bits & ((1 << 52) - 1);
            let big = mant > SQRT2_BITS;
            let e = (bits >> 52) as i64 + i64::from(big) - 1023;
            let m = f64::from_bits(mant | if big { 0x3FE << 52 } else { 0x3FF << 52 });
            let s = (m - 1.0) / (m + 1.0);
            let z = s * s;
            let mut p: f64 = 1.0 / 23.0;
            for k in (1..11).rev() {
                p = p.mul_add(z, 1.0 / (2 * k + 1) as f64);
            }
            let s2 = s + s;
            let log_m = (s2 * z).mul_add(p, s2);
            let ef = e as f64;
            ef.mul_add(LN2_HI, ef.mul_add(LN2_LO, log_m))
        };
        for k in (0..1u64 << 24).step_by(997).chain([0, 1, 2, (1 << 24) - 1]) {
            let u1 = (k as f64 + 1.0) * STEP;
            let (got, want) = (log(u1), u1.ln());
            assert!((got - want).abs() <= 4e-16 * want.abs().max(1e-300) + 1e-300, "log {u1}: {got} vs {want}");
        }
        let cos2pi = |u: f64| {
            let t = u * 4.0;
            let q = t.round_ties_even();
            let x = (t - q) * std::f64::consts::FRAC_PI_2;
            let x2 = x * x;
            let series = |first: u32| {
                let mut p = taylor_coeff(first + 16);
                for k in (0..8).rev() {
                    p = p.mul_add(x2, taylor_coeff(first + 2 * k));
                }
                p
            };
            let v = if q as i32 % 2 == 1 { series(1) * x } else { series(0) };
            if (q as i32 + 1) & 2 != 0 {
                -v
            } else {
                v
            }
        };
        for k in (0..1u64 << 24).step_by(991).chain([0, 1 << 21, 1 << 22, 3 << 22, (1 << 24) - 1]) {
            let u2 = k as f64 * STEP;
            let (got, want) = (cos2pi(u2), (2.0 * std::f64::consts::PI * u2).cos());
            assert!((got - want).abs() <= 2e-15, "cos(2 pi {u2}): {got} vs {want}");
        }
    }
}
