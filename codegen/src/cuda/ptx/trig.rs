//! `sin`, `cos` and `tan` of f32 in PTX (and the inverse functions `atan`, `asin`, `acos` and
//! `atan2`: [`inverse_trig_f32`], [`atan2_f32`]), computed in f64 and rounded once: the argument
//! reduced modulo `pi/2` to `r` in about `[-pi/4, pi/4]` and a quadrant, then Taylor series of
//! `sin r` and `cos r` to the `r^17` and `r^16` terms (the next below `1e-18`).
//!
//! The reduction works on `|x|`. Below `2^24` it is `|x| - j P0 - j P1` with `j` the nearest
//! integer to `|x| 2/pi` and `P0 + P1 = pi/2`: the first step is exact (its result has at most 53
//! significant bits), so `r` is within about `1e-16` of the true remainder. From `2^24` up,
//! `|x| = m 2^E` with `m` a 24-bit integer and `E` in `1..=104`, and `|x| = m (2^E mod 2 pi)`
//! modulo `2 pi` (so the quadrant survives): the product with [`POW2_MOD_2PI_HI`] +
//! [`POW2_MOD_2PI_LO`] (a double-double, the low part by `fma`) is below `2^27`, and the same two
//! steps reduce it. Infinities and NaN
//! give NaN.

use super::asm::{Asm, Class, Opnd, Reg};
use super::f64math::sin_cos_f64;

/// Which function.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Trig {
    Sin,
    Cos,
    Tan,
}

/// `pi/2 = P0 + P1` (to about `1e-33`).
const P0: f64 = std::f64::consts::FRAC_PI_2;
const P1: f64 = 6.123_233_995_736_766e-17;
const TWO_OVER_PI: f64 = std::f64::consts::FRAC_2_PI;
/// From here up an f32 is an even integer, reduced through the table.
const TABLE_FROM: f64 = 16_777_216.0;

/// `2^E mod 2 pi` for `E = 1..=104` as `HI + LO` (f64 bit patterns), computed with 160-digit
/// decimal arithmetic (`pi` by Machin's formula).
const POW2_MOD_2PI_HI: [u64; 104] = [
    0x4000000000000000,
    0x4010000000000000,
    0x3FFB7812AEEF4B9F,
    0x400B7812AEEF4B9F,
    0x3FE2B0BAD558F435,
    0x3FF2B0BAD558F435,
    0x4002B0BAD558F435,
    0x4012B0BAD558F435,
    0x40087EF4ACDB76A3,
    0x40187EF4ACDB76A3,
    0x4017DBEE0572C02E,
    0x401695E0B6A15344,
    0x401409C618FE7971,
    0x400DE321BB718B92,
    0x3FF304999CB579E8,
    0x400304999CB579E8,
    0x401304999CB579E8,
    0x4009CE6FCA4D8D6E,
    0x3FC58E8EC12C0AA8,
    0x3FD58E8EC12C0AA8,
    0x3FE58E8EC12C0AA8,
    0x3FF58E8EC12C0AA8,
    0x40058E8EC12C0AA8,
    0x40158E8EC12C0AA8,
    0x4011FB222E13E839,
    0x4005A8920FC746B2,
    0x4015A8920FC746B2,
    0x40122F28CB4A604B,
    0x400678AC84A126FA,
    0x401678AC84A126FA,
    0x4013CF5DB4FE20DD,
    0x400CF9802B702942,
    0x3FEEBC26B95FE14F,
    0x3FFEBC26B95FE14F,
    0x400EBC26B95FE14F,
    0x3FF668AD946ED0DA,
    0x400668AD946ED0DA,
    0x401668AD946ED0DA,
    0x4013AF5FD499749B,
    0x400C7988A9DD783B,
    0x3FEABC6AACCA5912,
    0x3FFABC6AACCA5912,
    0x400ABC6AACCA5912,
    0x3FD9A6F58862BF99,
    0x3FE9A6F58862BF99,
    0x3FF9A6F58862BF99,
    0x4009A6F58862BF99,
    0x3FC09F4683D25023,
    0x3FD09F4683D25023,
    0x3FE09F4683D25023,
    0x3FF09F4683D25023,
    0x40009F4683D25023,
    0x40109F4683D25023,
    0x4000392366C0E65C,
    0x4010392366C0E65C,
    0x3FFD412DE4F67E7E,
    0x400D412DE4F67E7E,
    0x3FF07CCA42C94599,
    0x40007CCA42C94599,
    0x40107CCA42C94599,
    0x3FFF5E64C5397865,
    0x400F5E64C5397865,
    0x3FF8F1A5C3D52D34,
    0x4008F1A5C3D52D34,
    0x4018F1A5C3D52D34,
    0x4018C15033662D50,
    0x401860A512882D88,
    0x40179F4ED0CC2DF7,
    0x40161CA24D542ED6,
    0x4013174946643093,
    0x400A192E7108681B,
    0x3FCEE6639887604D,
    0x3FDEE6639887604D,
    0x3FEEE6639887604D,
    0x3FFEE6639887604D,
    0x400EE6639887604D,
    0x3FF711A1110CCCD4,
    0x400711A1110CCCD4,
    0x401711A1110CCCD4,
    0x40150146CDD56C8F,
    0x4010E0924766AC06,
    0x40013E52751255E7,
    0x40113E52751255E7,
    0x4002B5532BC0FD6B,
    0x4012B5532BC0FD6B,
    0x40089156067B9B7B,
    0x40189156067B9B7B,
    0x401800B0B8B309DD,
    0x4016DF661D21E6A2,
    0x40149CD0E5FFA02C,
    0x401017A677BB133F,
    0x3FFC35466CC7E59A,
    0x400C35466CC7E59A,
    0x3FE89A58C41DC40C,
    0x3FF89A58C41DC40C,
    0x40089A58C41DC40C,
    0x40189A58C41DC40C,
    0x401812B633F75AFF,
    0x4017037113AA88E6,
    0x4014E4E6D310E4B4,
    0x4010A7D251DD9C4F,
    0x40005B529EEE170C,
    0x40105B529EEE170C,
    0x3FFE52A7A6600402,
];

/// The low parts of [`POW2_MOD_2PI_HI`].
const POW2_MOD_2PI_LO: [u64; 104] = [
    0x0000000000000000,
    0x0000000000000000,
    0xBC7A62633145C06E,
    0xBC8A62633145C06E,
    0xBC4F5F7FB2E61132,
    0xBC5F5F7FB2E61132,
    0xBC6F5F7FB2E61132,
    0xBC7F5F7FB2E61132,
    0x3CA4DBD3AD1DC3A6,
    0x3CB4DBD3AD1DC3A6,
    0x3CB8118127272B44,
    0x3CBE7CDC1B39FA82,
    0xBCB4AC6DFCA06703,
    0x3C9403F74EAB57CF,
    0xBC9E90AA2EFAC07E,
    0xBCAE90AA2EFAC07E,
    0xBCBE90AA2EFAC07E,
    0xBCAD8EF52213BA05,
    0x3C695C955AFD3E7B,
    0x3C795C955AFD3E7B,
    0x3C895C955AFD3E7B,
    0x3C995C955AFD3E7B,
    0x3CA95C955AFD3E7B,
    0x3CB95C955AFD3E7B,
    0xBCBEECFB7D19DF11,
    0xBCAF003A5A903450,
    0xBCBF003A5A903450,
    0xBCAF4D35D069894F,
    0x3CAE1947F9043554,
    0x3CBE1947F9043554,
    0xBCB57396410BF160,
    0x3C8B956A569E09D0,
    0xBC86065CEB66CC97,
    0xBC96065CEB66CC97,
    0xBCA6065CEB66CC97,
    0xBC9EB20C79ECA277,
    0xBCAEB20C79ECA277,
    0xBCBEB20C79ECA277,
    0xBCAE147E4DDB41EB,
    0xBCAF754901DF3BE4,
    0xBC71B6F34F397EB5,
    0xBC81B6F34F397EB5,
    0xBC91B6F34F397EB5,
    0x3C77E60254EE49EB,
    0x3C87E60254EE49EB,
    0x3C97E60254EE49EB,
    0x3CA7E60254EE49EB,
    0x3C4FEE10ECF6F246,
    0x3C5FEE10ECF6F246,
    0x3C6FEE10ECF6F246,
    0x3C7FEE10ECF6F246,
    0x3C8FEE10ECF6F246,
    0x3C9FEE10ECF6F246,
    0xBC7AF1DBC98E2E42,
    0xBC8AF1DBC98E2E42,
    0x3C9E758B6A2061A3,
    0x3CAE758B6A2061A3,
    0xBC8984D6479FD323,
    0xBC9984D6479FD323,
    0xBCA984D6479FD323,
    0x3C93540E152F4359,
    0x3CA3540E152F4359,
    0x3C7ADE7E21AE7526,
    0x3C8ADE7E21AE7526,
    0x3C9ADE7E21AE7526,
    0xBC90DB9C88F485CF,
    0xBCBA13F4778E9EEF,
    0xBC97383C88C66790,
    0xBCBD424477778FCF,
    0xBCA8555E4406F74A,
    0xBCA3F708EE36A6A2,
    0x3C58B437AD3F55E0,
    0x3C68B437AD3F55E0,
    0x3C78B437AD3F55E0,
    0x3C88B437AD3F55E0,
    0x3C98B437AD3F55E0,
    0xBC95302971D2C45B,
    0xBCA5302971D2C45B,
    0xBCB5302971D2C45B,
    0x3C8FCC374A30DA1A,
    0xBCA36630C1104B01,
    0xBC94315BD0929C20,
    0xBCA4315BD0929C20,
    0xBC975E080E9BE09A,
    0xBCA75E080E9BE09A,
    0xBCA2085C83607941,
    0xBCB2085C83607941,
    0x3CA492418C5562EE,
    0x3C8760DACA08373A,
    0xBCA79BDF01249C71,
    0x3CB6BDFACBC70789,
    0xBC90A8C26E1933D7,
    0xBCA0A8C26E1933D7,
    0xBC827745096C7EEE,
    0xBC927745096C7EEE,
    0xBCA27745096C7EEE,
    0xBCB27745096C7EEE,
    0x3CA2D69F74254C3B,
    0x3C730794110F0348,
    0xBCAE8A6761E4F73C,
    0x3CAF9EE4D60D597B,
    0x3CABF17D45F1FAE7,
    0x3CBBF17D45F1FAE7,
    0x3C98F351633E671F,
];

fn table_decl(name: &str, words: &[u64; 104]) -> String {
    let values: Vec<String> = words.iter().map(|w| format!("0x{w:016X}")).collect();
    format!(".const .align 8 .b64 {name}[104] = {{{}}};", values.join(", "))
}

/// `which(x)` of an f32 register.
pub fn trig_f32(a: &mut Asm, x: Reg, which: Trig) -> Reg {
    use Class::*;
    a.declare(&table_decl("coil_pow2_mod_2pi_hi", &POW2_MOD_2PI_HI));
    a.declare(&table_decl("coil_pow2_mod_2pi_lo", &POW2_MOD_2PI_LO));
    let xd = a.op(F64, "cvt.f64.f32", &[x.into()]);
    let ax = a.op(F64, "abs.f64", &[xd.into()]);
    // |x| = m 2^E (E clamped into the table; the other inputs take the first path)
    let bits = a.op(B32, "mov.b32", &[x.into()]);
    let biased = a.op(B32, "bfe.u32", &[bits.into(), Opnd::Int(23), Opnd::Int(8)]);
    let e = a.op(B32, "sub.s32", &[biased.into(), Opnd::Int(151)]);
    let e = a.op(B32, "max.s32", &[e.into(), Opnd::Int(0)]);
    let e = a.op(B32, "min.s32", &[e.into(), Opnd::Int(103)]);
    let m = a.op(B32, "and.b32", &[bits.into(), Opnd::Hex(0x7F_FFFF)]);
    let m = a.op(B32, "or.b32", &[m.into(), Opnd::Hex(0x80_0000)]);
    let md = a.op(F64, "cvt.rn.f64.u32", &[m.into()]);
    let off = a.op(B64, "mul.wide.u32", &[e.into(), Opnd::Int(8)]);
    let mut entry = |name: &'static str| {
        let base = a.op(B64, "mov.u64", &[Opnd::Text(name)]);
        let at = a.op(B64, "add.u64", &[base.into(), off.into()]);
        let v = a.reg(F64);
        a.ins(format!("ld.const.f64 {v}, [{at}]"));
        v
    };
    let (t_hi, t_lo) = (entry("coil_pow2_mod_2pi_hi"), entry("coil_pow2_mod_2pi_lo"));
    let hi = a.op(F64, "mul.f64", &[md.into(), t_hi.into()]);
    let neg_hi = a.op(F64, "neg.f64", &[hi.into()]);
    let lo = a.op(F64, "fma.rn.f64", &[md.into(), t_hi.into(), neg_hi.into()]);
    let lo = a.op(F64, "fma.rn.f64", &[md.into(), t_lo.into(), lo.into()]);
    let big = a.op(Pred, "setp.ge.f64", &[ax.into(), Opnd::F64(TABLE_FROM)]);
    let hi = a.op(F64, "selp.f64", &[hi.into(), ax.into(), big.into()]);
    let lo = a.op(F64, "selp.f64", &[lo.into(), Opnd::F64(0.0), big.into()]);
    // r = (hi + lo) - j pi/2, the first step exact
    let t = a.op(F64, "mul.f64", &[hi.into(), Opnd::F64(TWO_OVER_PI)]);
    let j = a.op(F64, "cvt.rni.f64.f64", &[t.into()]);
    let nj = a.op(F64, "neg.f64", &[j.into()]);
    let r1 = a.op(F64, "fma.rn.f64", &[nj.into(), Opnd::F64(P0), hi.into()]);
    let c = a.op(F64, "fma.rn.f64", &[nj.into(), Opnd::F64(P1), lo.into()]);
    let r = a.op(F64, "add.f64", &[r1.into(), c.into()]);
    let q = a.op(B32, "cvt.rzi.s32.f64", &[j.into()]);
    let (sin_r, cos_r) = sin_cos_f64(a, r);
    // the quadrant: sin takes (s, c, -s, -c), cos (c, -s, -c, s); tan is sin / cos
    let odd_bit = a.op(B32, "and.b32", &[q.into(), Opnd::Int(1)]);
    let odd = a.op(Pred, "setp.ne.u32", &[odd_bit.into(), Opnd::Int(0)]);
    // the quadrant's sign (none for tan, whose two forms carry it), then the sign of x for the
    // odd functions (of -0 too)
    let shifted = if which == Trig::Cos { a.op(B32, "add.u32", &[q.into(), Opnd::Int(1)]) } else { q };
    let neg_bit = a.op(B32, "and.b32", &[shifted.into(), Opnd::Int(2)]);
    let quadrant_neg = a.op(Pred, "setp.ne.u32", &[neg_bit.into(), Opnd::Int(0)]);
    let x_neg = a.op(Pred, "setp.lt.s32", &[bits.into(), Opnd::Int(0)]);
    let (v, neg) = match which {
        Trig::Sin => {
            let v = a.op(F64, "selp.f64", &[cos_r.into(), sin_r.into(), odd.into()]);
            (v, a.op(Pred, "xor.pred", &[quadrant_neg.into(), x_neg.into()]))
        }
        Trig::Cos => (a.op(F64, "selp.f64", &[sin_r.into(), cos_r.into(), odd.into()]), quadrant_neg),
        Trig::Tan => {
            // tan(r + q pi/2): sin r / cos r for even q, -cos r / sin r for odd q
            let even = a.op(F64, "div.rn.f64", &[sin_r.into(), cos_r.into()]);
            let ratio = a.op(F64, "div.rn.f64", &[cos_r.into(), sin_r.into()]);
            let oddv = a.op(F64, "neg.f64", &[ratio.into()]);
            (a.op(F64, "selp.f64", &[oddv.into(), even.into(), odd.into()]), x_neg)
        }
    };
    let nv = a.op(F64, "neg.f64", &[v.into()]);
    let v = a.op(F64, "selp.f64", &[nv.into(), v.into(), neg.into()]);
    let f = a.op(F32, "cvt.rn.f32.f64", &[v.into()]);
    let ax32 = a.op(F32, "abs.f32", &[x.into()]);
    let finite = a.op(Pred, "setp.lt.f32", &[ax32.into(), Opnd::F32(f32::INFINITY)]);
    a.op(F32, "selp.f32", &[f.into(), Opnd::F32(f32::NAN), finite.into()])
}

/// `tan(pi/8)` and `tan(3pi/8)`: the bounds of [`atan_f64_core`]'s three ranges.
const TAN_PI_8: f64 = 0.414_213_562_373_095_03;
const TAN_3PI_8: f64 = 2.414_213_562_373_095;
/// The last power of `t` in [`atan_f64_core`]'s Taylor series (the next term is below `5e-12`
/// relative for `|t| <= tan(pi/8)`).
const ATAN_LAST_POWER: u32 = 25;
const PI: f64 = std::f64::consts::PI;

/// The Taylor coefficient `(-1)^k / (2k + 1)` of `atan`.
fn atan_coeff(k: u32) -> f64 {
    let c = 1.0 / f64::from(2 * k + 1);
    if k % 2 == 1 {
        -c
    } else {
        c
    }
}

/// `atan(x)` of an f64 `x >= 0` (inf and NaN included), as the C prelude's `coil_atan_f64_core`:
/// Cephes' reduction to `|t| <= tan(pi/8)` by one division (`t = x`; `(x - 1) / (x + 1)` plus
/// `pi/4` above `tan(pi/8)`; `-1 / x` plus `pi/2` above `tan(3pi/8)`), then Taylor's series.
fn atan_f64_core(a: &mut Asm, x: Reg) -> Reg {
    use Class::*;
    let mid = a.op(Pred, "setp.gt.f64", &[x.into(), Opnd::F64(TAN_PI_8)]);
    let far = a.op(Pred, "setp.gt.f64", &[x.into(), Opnd::F64(TAN_3PI_8)]);
    let below = a.op(F64, "sub.f64", &[x.into(), Opnd::F64(1.0)]);
    let above = a.op(F64, "add.f64", &[x.into(), Opnd::F64(1.0)]);
    let num = a.op(F64, "selp.f64", &[below.into(), x.into(), mid.into()]);
    let num = a.op(F64, "selp.f64", &[Opnd::F64(-1.0), num.into(), far.into()]);
    let den = a.op(F64, "selp.f64", &[above.into(), Opnd::F64(1.0), mid.into()]);
    let den = a.op(F64, "selp.f64", &[x.into(), den.into(), far.into()]);
    let base = a.op(F64, "selp.f64", &[Opnd::F64(PI / 4.0), Opnd::F64(0.0), mid.into()]);
    let base = a.op(F64, "selp.f64", &[Opnd::F64(PI / 2.0), base.into(), far.into()]);
    let t = a.op(F64, "div.rn.f64", &[num.into(), den.into()]);
    let t2 = a.op(F64, "mul.f64", &[t.into(), t.into()]);
    let last = (ATAN_LAST_POWER - 1) / 2;
    let mut p = a.op(F64, "mov.f64", &[Opnd::F64(atan_coeff(last))]);
    for k in (1..last).rev() {
        p = a.op(F64, "fma.rn.f64", &[p.into(), t2.into(), Opnd::F64(atan_coeff(k))]);
    }
    let t3 = a.op(F64, "mul.f64", &[t.into(), t2.into()]);
    let r = a.op(F64, "fma.rn.f64", &[t3.into(), p.into(), t.into()]);
    a.op(F64, "add.f64", &[base.into(), r.into()])
}

/// Which inverse function [`inverse_trig_f32`] computes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum InverseTrig {
    Atan,
    /// `atan(x / sqrt((1 - x)(1 + x)))`: `|x| = 1` divides by zero, `|x| > 1` is NaN.
    Asin,
    /// `2 atan(sqrt((1 - x) / (1 + x)))`: no cancellation near 1.
    Acos,
}

/// `atan`, `asin` or `acos` of an f32 register, computed in f64 and rounded once (as the C
/// prelude's `coil_atan_f32`, ...).
pub fn inverse_trig_f32(a: &mut Asm, x: Reg, which: InverseTrig) -> Reg {
    use Class::*;
    let xd = a.op(F64, "cvt.f64.f32", &[x.into()]);
    let ax = a.op(F64, "abs.f64", &[xd.into()]);
    let r = match which {
        InverseTrig::Atan => atan_f64_core(a, ax),
        InverseTrig::Asin | InverseTrig::Acos => {
            let below = a.op(F64, "sub.f64", &[Opnd::F64(1.0), xd.into()]);
            let above = a.op(F64, "add.f64", &[xd.into(), Opnd::F64(1.0)]);
            if which == InverseTrig::Asin {
                let m = a.op(F64, "mul.f64", &[below.into(), above.into()]);
                let s = a.op(F64, "sqrt.rn.f64", &[m.into()]);
                let q = a.op(F64, "div.rn.f64", &[ax.into(), s.into()]);
                atan_f64_core(a, q)
            } else {
                let q = a.op(F64, "div.rn.f64", &[below.into(), above.into()]);
                let s = a.op(F64, "sqrt.rn.f64", &[q.into()]);
                let h = atan_f64_core(a, s);
                a.op(F64, "add.f64", &[h.into(), h.into()])
            }
        }
    };
    // the odd functions take the sign of x (of -0.0 too)
    let r = match which {
        InverseTrig::Acos => r,
        _ => a.op(F64, "copysign.f64", &[xd.into(), r.into()]),
    };
    a.op(F32, "cvt.rn.f32.f64", &[r.into()])
}

/// `atan2(y, x)` of f32 registers as C's `atan2f` (the C prelude's `coil_atan2_f32`): `atan` of
/// `min(|y|, |x|) / max(|y|, |x|)` in f64 (0 for two zeros, 1 for two infinities), then
/// `pi/2 - r` where `|y| > |x|`, `pi - r` where `x` has its sign bit set (`-0.0` too), the sign
/// of `y`, one rounding; NaN in, NaN out.
pub fn atan2_f32(a: &mut Asm, y: Reg, x: Reg) -> Reg {
    use Class::*;
    let yd = a.op(F64, "cvt.f64.f32", &[y.into()]);
    let xd = a.op(F64, "cvt.f64.f32", &[x.into()]);
    let ay = a.op(F64, "abs.f64", &[yd.into()]);
    let ax = a.op(F64, "abs.f64", &[xd.into()]);
    let steep = a.op(Pred, "setp.gt.f64", &[ay.into(), ax.into()]);
    let hi = a.op(F64, "selp.f64", &[ay.into(), ax.into(), steep.into()]);
    let lo = a.op(F64, "selp.f64", &[ax.into(), ay.into(), steep.into()]);
    let q = a.op(F64, "div.rn.f64", &[lo.into(), hi.into()]);
    let zeros = a.op(Pred, "setp.eq.f64", &[hi.into(), Opnd::F64(0.0)]);
    let tie = a.op(F64, "selp.f64", &[Opnd::F64(0.0), Opnd::F64(1.0), zeros.into()]);
    let equal = a.op(Pred, "setp.eq.f64", &[hi.into(), lo.into()]);
    let q = a.op(F64, "selp.f64", &[tie.into(), q.into(), equal.into()]);
    let r = atan_f64_core(a, q);
    let flipped = a.op(F64, "sub.f64", &[Opnd::F64(PI / 2.0), r.into()]);
    let r = a.op(F64, "selp.f64", &[flipped.into(), r.into(), steep.into()]);
    let bits = a.op(B32, "mov.b32", &[x.into()]);
    let x_neg = a.op(Pred, "setp.lt.s32", &[bits.into(), Opnd::Int(0)]);
    let back = a.op(F64, "sub.f64", &[Opnd::F64(PI), r.into()]);
    let r = a.op(F64, "selp.f64", &[back.into(), r.into(), x_neg.into()]);
    let r = a.op(F64, "copysign.f64", &[yd.into(), r.into()]);
    let f = a.op(F32, "cvt.rn.f32.f64", &[r.into()]);
    let nan = a.op(Pred, "setp.nan.f32", &[x.into(), y.into()]);
    let sum = a.op(F32, "add.f32", &[x.into(), y.into()]);
    a.op(F32, "selp.f32", &[sum.into(), f.into(), nan.into()])
}

#[cfg(test)]
mod tests {
    use super::super::f64math::taylor_coeff;
    use super::*;

    /// [`atan_f64_core`] on the host, step for step.
    fn atan_core(x: f64) -> f64 {
        let (mid, far) = (x > TAN_PI_8, x > TAN_3PI_8);
        let num = if far {
            -1.0
        } else if mid {
            x - 1.0
        } else {
            x
        };
        let den = if far {
            x
        } else if mid {
            x + 1.0
        } else {
            1.0
        };
        let base = if far {
            PI / 2.0
        } else if mid {
            PI / 4.0
        } else {
            0.0
        };
        let t = num / den;
        let t2 = t * t;
        let last = (ATAN_LAST_POWER - 1) / 2;
        let mut p = atan_coeff(last);
        for k in (1..last).rev() {
            p = p.mul_add(t2, atan_coeff(k));
        }
        base + (t * t2).mul_add(p, t)
    }

    /// [`inverse_trig_f32`] and [`atan2_f32`] on the host, step for step as emitted, against
    /// `std`'s f64 functions of the same f32 inputs (within 5e-12 relative before the rounding
    /// to f32; `atan2` within an ulp after it), and the special values as C99 gives them.
    #[test]
    fn inverse_trig_matches_std() {
        let inverse = |x: f32, which: InverseTrig| -> f64 {
            let xd = f64::from(x);
            let r = match which {
                InverseTrig::Atan => atan_core(xd.abs()),
                InverseTrig::Asin => atan_core(xd.abs() / ((1.0 - xd) * (1.0 + xd)).sqrt()),
                InverseTrig::Acos => 2.0 * atan_core(((1.0 - xd) / (1.0 + xd)).sqrt()),
            };
            if which == InverseTrig::Acos {
                r
            } else {
                r.copysign(xd)
            }
        };
        let atan2 = |y: f32, x: f32| -> f32 {
            let (ay, ax) = (f64::from(y).abs(), f64::from(x).abs());
            let steep = ay > ax;
            let (hi, lo) = if steep { (ay, ax) } else { (ax, ay) };
            let q = if hi == lo {
                if hi == 0.0 {
                    0.0
                } else {
                    1.0
                }
            } else {
                lo / hi
            };
            let mut r = atan_core(q);
            if steep {
                r = PI / 2.0 - r;
            }
            if (x.to_bits() as i32) < 0 {
                r = PI - r;
            }
            let f = r.copysign(f64::from(y)) as f32;
            if x.is_nan() || y.is_nan() {
                x + y
            } else {
                f
            }
        };
        let mut xs: Vec<f32> = vec![0.0, 1e-30, 1e-8, 0.1, 0.4142135, 0.4142136, 0.5, 0.9, 0.99999994, 1.0];
        xs.extend([2.4142134, 2.4142137, 3.0, 1e4, 1e20, f32::MAX, f32::from_bits(1), f32::INFINITY]);
        for i in 0..4000u32 {
            xs.push(i as f32 * 0.001);
            xs.push(f32::from_bits((u64::from(i) * 0x7F7F_FFFF / 4000) as u32));
            // every exponent
        }
        for &x in &xs {
            for x in [x, -x] {
                let cases = [
                    (InverseTrig::Atan, f64::from(x).atan()),
                    (InverseTrig::Asin, f64::from(x).asin()),
                    (InverseTrig::Acos, f64::from(x).acos()),
                ];
                for (which, want) in cases {
                    let got = inverse(x, which);
                    // the series' truncation (below 5e-12), far below an f32 ulp (6e-8)
                    let same =
                        got == want || (got.is_nan() && want.is_nan()) || (got - want).abs() <= 5e-12 * want.abs();
                    assert!(same, "{which:?}({x:e}) = {got:e}, want {want:e}");
                    if want == 0.0 {
                        assert_eq!(got.to_bits(), want.to_bits(), "{which:?}({x:e})");
                    }
                }
                for &y in xs.iter().step_by(97) {
                    for y in [y, -y] {
                        let (got, want) = (atan2(y, x), (f64::from(y).atan2(f64::from(x))) as f32);
                        let ulp = (got.to_bits() as i64 - want.to_bits() as i64).abs();
                        assert!(
                            ulp <= 1 || (got.is_nan() && want.is_nan()),
                            "atan2({y:e}, {x:e}) = {got:e}, want {want:e}"
                        );
                        if want == 0.0 || want.is_infinite() || got.abs() == std::f32::consts::PI {
                            assert_eq!(got.to_bits(), want.to_bits(), "atan2({y:e}, {x:e})");
                        }
                    }
                }
            }
        }
        assert!(atan2(f32::NAN, 1.0).is_nan() && atan2(1.0, f32::NAN).is_nan());
        assert!(inverse(1.5, InverseTrig::Asin).is_nan() && inverse(-1.5, InverseTrig::Acos).is_nan());
        assert!(inverse(f32::NAN, InverseTrig::Atan).is_nan());
    }

    /// The reduction and the series on the host, step for step as emitted, against `std`'s f64
    /// functions of the same f32 inputs: small, near multiples of `pi/2`, and up to `f32::MAX`.
    #[test]
    fn the_reduction_and_series_match_std() {
        let eval = |x: f32, which: Trig| -> f64 {
            let ax = f64::from(x).abs();
            let bits = x.to_bits();
            let e = ((((bits >> 23) & 0xFF) as i32) - 151).clamp(0, 103) as usize;
            let md = f64::from((bits & 0x7F_FFFF) | 0x80_0000);
            let (t_hi, t_lo) = (f64::from_bits(POW2_MOD_2PI_HI[e]), f64::from_bits(POW2_MOD_2PI_LO[e]));
            let hi = md * t_hi;
            let lo = md.mul_add(t_lo, md.mul_add(t_hi, -hi));
            let (hi, lo) = if ax >= TABLE_FROM { (hi, lo) } else { (ax, 0.0) };
            let j = (hi * TWO_OVER_PI).round_ties_even();
            let r = (-j).mul_add(P0, hi) + (-j).mul_add(P1, lo);
            let q = j as i64;
            let r2 = r * r;
            let series = |first: u32| {
                let mut p = taylor_coeff(first + 16);
                for k in (0..8).rev() {
                    p = p.mul_add(r2, taylor_coeff(first + 2 * k));
                }
                p
            };
            let (c, s) = (series(0), series(1) * r);
            let odd = q & 1 == 1;
            let (v, neg) = match which {
                Trig::Sin => (if odd { c } else { s }, q & 2 != 0),
                Trig::Cos => (if odd { s } else { c }, (q + 1) & 2 != 0),
                Trig::Tan => (if odd { -c / s } else { s / c }, false),
            };
            let v = if neg { -v } else { v };
            if which != Trig::Cos && x.is_sign_negative() {
                -v
            } else {
                v
            }
        };
        let mut xs: Vec<f32> = vec![0.0, -0.0, 1e-30, 0.5, 1.0, 3.0, -7.5, 100.0, 1e4, 16_777_215.0, 16_777_216.0];
        // near multiples of pi/2, and every exponent of the table
        for k in 1..2000 {
            xs.push((k as f64 * std::f64::consts::FRAC_PI_2) as f32);
        }
        for e in 0..128 {
            for m in [0x80_0000u32, 0x80_0001, 0xC9_0FDB, 0xFF_FFFF, 0xA5_A5A5] {
                xs.push(f32::from_bits(((e + 127) << 23) | (m & 0x7F_FFFF)));
            }
        }
        for &x in &xs {
            for which in [Trig::Sin, Trig::Cos, Trig::Tan] {
                let want = match which {
                    Trig::Sin => f64::from(x).sin(),
                    Trig::Cos => f64::from(x).cos(),
                    Trig::Tan => f64::from(x).tan(),
                };
                let got = eval(x, which);
                // within a few units of 1e-16 of the result, or absolutely near a zero
                let tol = 4e-16 * want.abs().max(1e-300) + 1e-15 * want.abs().min(1.0) + 1e-300;
                assert!((got - want).abs() <= tol.max(4e-16 * got.abs()), "{which:?}({x:e}): {got:e} vs {want:e}");
            }
        }
    }
}
