//! Scalar values and ops in PTX, with the semantics of the C backend's `ops` (the interpreter's):
//! f16, bf16 and f32 values live in `.f32` registers (f16/bf16 rounded only where cast or
//! stored), bools in predicates, every integer dtype in a `.b64` register wrapped to its
//! dtype's width after each op that can leave it. The math functions are the CUDA prelude's
//! where it has its own (`exp` and `rsqrt` as `ex2`/`rsqrt.approx`, f32 division as
//! `div.full`; the kernel emitter turns division by a row's or a group's value into one
//! reciprocal, [`reciprocal_f32`], and multiplies), IEEE instructions where C's operator is
//! IEEE (`sqrt`, the division inside floor division), and routines of our own: `log` (a
//! degree-7 polynomial after splitting off the exponent, within 2 ulp), `erf` (two polynomial
//! fits, within 3 ulp) and `tanh` (an odd polynomial near zero, else through `ex2`, within 2
//! ulp), with `log1p` and `expm1` from `log` and `exp` by Goldberg's and Kahan's corrections.
//! `sin`, `cos`, `tan` and their inverses (`atan`, `asin`, `acos`, `atan2`) are in `trig`, `pow`,
//! `fmod` and `erfinv` in `f64math`. Bit ops are PTX's `and`, `or`, `xor`, `not`, `shl` and
//! `shr` (the shifts guarded for PyTorch's out-of-range amounts). What has no PTX form
//! here (f64 values, ...) is [`Unsupported`]: the kernel goes through NVRTC instead.

use super::asm::{Asm, Class, Opnd, Reg};
use coil_ir::{BinaryOp, DType, Scalar, UnaryOp};

/// Why a kernel has no PTX form here (it is compiled from CUDA C instead).
pub type Unsupported = String;
pub type R<T> = std::result::Result<T, Unsupported>;

const LOG2E: f32 = std::f32::consts::LOG2_E;

/// The register class a value of `d` lives in.
pub fn class_of(d: DType) -> R<Class> {
    Ok(match d {
        DType::F16 | DType::BF16 | DType::F32 => Class::F32,
        DType::Bool => Class::Pred,
        DType::F64 => return Err("an f64 value".into()),
        _ => Class::B64,
    })
}

/// The PTX type of a buffer element of `d` in loads and stores (integers sign- or zero-extend
/// into, and truncate from, `.b64` registers).
pub fn mem_type(d: DType) -> R<&'static str> {
    Ok(match d {
        DType::F32 => "f32",
        DType::F16 | DType::BF16 => "b16",
        DType::I64 => "s64",
        DType::I32 => "s32",
        DType::I16 => "s16",
        DType::I8 => "s8",
        DType::U8 | DType::Bool => "u8",
        DType::F64 => return Err("an f64 buffer".into()),
    })
}

/// The register class a raw element of a buffer of `d` is loaded into.
pub fn raw_class(d: DType) -> R<Class> {
    Ok(match d {
        DType::F32 => Class::F32,
        DType::F16 | DType::BF16 => Class::B16,
        DType::F64 => return Err("an f64 buffer".into()),
        _ => Class::B64,
    })
}

fn f32_const(x: f32) -> Opnd {
    Opnd::F32(x)
}

/// An s64 register wrapped to the width of integer dtype `to`, as a C cast does.
fn wrap(a: &mut Asm, r: Reg, to: DType) -> Reg {
    match to {
        DType::I32 => a.op(Class::B64, "cvt.s64.s32", &[r.into()]),
        DType::I16 => a.op(Class::B64, "cvt.s64.s16", &[r.into()]),
        DType::I8 => a.op(Class::B64, "cvt.s64.s8", &[r.into()]),
        DType::U8 => a.op(Class::B64, "and.b64", &[r.into(), Opnd::Int(0xff)]),
        _ => r,
    }
}

/// bf16 bits to the f32 of the same value.
pub fn bf16_to_f32(a: &mut Asm, h: Reg) -> Reg {
    let w = a.op(Class::B32, "cvt.u32.u16", &[h.into()]);
    let w = a.op(Class::B32, "shl.b32", &[w.into(), Opnd::Int(16)]);
    a.op(Class::F32, "mov.b32", &[w.into()])
}

/// An f32 rounded to f16 or bf16 (`to`), as an f32 again.
fn round_half(a: &mut Asm, x: Reg, to: DType) -> Reg {
    if to == DType::F16 {
        let h = a.op(Class::B16, "cvt.rn.f16.f32", &[x.into()]);
        a.op(Class::F32, "cvt.f32.f16", &[h.into()])
    } else {
        let h = a.op(Class::B16, "cvt.rn.bf16.f32", &[x.into()]);
        bf16_to_f32(a, h)
    }
}

/// A raw buffer element (in [`raw_class`]) as a value of `val` (the C backend's `ops::load`).
pub fn from_storage(a: &mut Asm, raw: Reg, buf: DType, val: DType) -> R<Reg> {
    let v = match buf {
        DType::F16 => a.op(Class::F32, "cvt.f32.f16", &[raw.into()]),
        DType::BF16 => bf16_to_f32(a, raw),
        DType::Bool => a.op(Class::Pred, "setp.ne.s64", &[raw.into(), Opnd::Int(0)]),
        _ => raw,
    };
    convert(a, v, buf, val)
}

/// A value of `val` as the register a store into a buffer of `buf` writes (in [`raw_class`],
/// a bool as a `.b64` 0/1), with one rounding for f16/bf16.
pub fn to_storage(a: &mut Asm, v: Reg, val: DType, buf: DType) -> R<Reg> {
    let single = matches!(val, DType::F32 | DType::F16 | DType::BF16);
    Ok(match buf {
        DType::F16 | DType::BF16 => {
            let f = if single { v } else { convert(a, v, val, DType::F32)? };
            let instr = if buf == DType::F16 { "cvt.rn.f16.f32" } else { "cvt.rn.bf16.f32" };
            a.op(Class::B16, instr, &[f.into()])
        }
        DType::Bool => {
            let p = convert(a, v, val, DType::Bool)?;
            a.op(Class::B64, "selp.b64", &[Opnd::Int(1), Opnd::Int(0), p.into()])
        }
        _ => convert(a, v, val, buf)?,
    })
}

/// `v`, a value of `from`, as a value of `to` (the interpreter's cast: floats to integers
/// truncate, NaN to 0, saturating; anything to bool is `!= 0`; f16/bf16 results rounded once).
pub fn convert(a: &mut Asm, v: Reg, from: DType, to: DType) -> R<Reg> {
    if from == to {
        return Ok(v);
    }
    let fc = class_of(from)?;
    class_of(to)?;
    Ok(match to {
        DType::Bool => match fc {
            Class::F32 => a.op(Class::Pred, "setp.neu.f32", &[v.into(), f32_const(0.0)]),
            _ => a.op(Class::Pred, "setp.ne.s64", &[v.into(), Opnd::Int(0)]),
        },
        DType::F32 | DType::F16 | DType::BF16 => {
            let f = match fc {
                Class::F32 => v,
                Class::Pred => a.op(Class::F32, "selp.f32", &[f32_const(1.0), f32_const(0.0), v.into()]),
                _ => a.op(Class::F32, "cvt.rn.f32.s64", &[v.into()]),
            };
            match to {
                DType::F32 => f,
                // an f32 (or an f16/bf16 value, already on the coarser grid) rounded once
                _ => round_half(a, f, to),
            }
        }
        _ => {
            let i = match fc {
                Class::F32 => a.op(Class::B64, "cvt.rzi.s64.f32", &[v.into()]),
                Class::Pred => a.op(Class::B64, "selp.b64", &[Opnd::Int(1), Opnd::Int(0), v.into()]),
                _ => v,
            };
            wrap(a, i, to)
        }
    })
}

/// A constant of `d` in a register (rounded or wrapped to `d` first, as `ops::literal`).
pub fn literal(a: &mut Asm, s: Scalar, d: DType) -> R<Reg> {
    Ok(match class_of(d)? {
        Class::F32 => {
            let x = s.as_f64();
            let x = match d {
                DType::F16 => half::f16::from_f32(x as f32).to_f32(),
                DType::BF16 => half::bf16::from_f32(x as f32).to_f32(),
                _ => x as f32,
            };
            a.op(Class::F32, "mov.f32", &[f32_const(x)])
        }
        Class::Pred => {
            let on = match s {
                Scalar::Bool(b) => b,
                Scalar::Int(i) => i != 0,
                Scalar::Float(x) => x != 0.0,
            };
            let w = a.op(Class::B32, "mov.b32", &[Opnd::Int(on as i64)]);
            a.op(Class::Pred, "setp.ne.b32", &[w.into(), Opnd::Int(0)])
        }
        _ => {
            let i = match s {
                Scalar::Bool(b) => b as i64,
                Scalar::Int(i) => i,
                Scalar::Float(x) => x as i64, // truncates, NaN -> 0, saturates
            };
            let i = match d {
                DType::U8 => i as u8 as i64,
                DType::I8 => i as i8 as i64,
                DType::I16 => i as i16 as i64,
                DType::I32 => i as i32 as i64,
                _ => i,
            };
            a.op(Class::B64, "mov.b64", &[Opnd::Int(i)])
        }
    })
}

/// `exp(x)` of f32 as the CUDA prelude's `coil_exp_f32`: `ex2.approx.ftz(x * log2 e)`.
pub fn exp_f32(a: &mut Asm, x: Reg) -> Reg {
    let t = a.op(Class::F32, "mul.f32", &[x.into(), f32_const(LOG2E)]);
    a.op(Class::F32, "ex2.approx.ftz.f32", &[t.into()])
}

/// `1 / d` of f32 without `rcp.rn`'s slow-path subroutine (whose call made the assembler keep
/// every live value across it: the cluster softmax assembled 10% slower): `rcp.approx` (within
/// 1 ulp, subnormals kept) and one Newton step `r + r (1 - d r)` by fused multiply-adds, the
/// fast path of `rcp.rn` itself. Where that step is not finite (`d` zero, infinite, NaN or so
/// small that `1 / d` overflows) the approximation already is the answer.
pub fn reciprocal_f32(a: &mut Asm, d: Reg) -> Reg {
    use Class::*;
    let r = a.op(F32, "rcp.approx.f32", &[d.into()]);
    let nd = a.op(F32, "neg.f32", &[d.into()]);
    let e = a.op(F32, "fma.rn.f32", &[nd.into(), r.into(), f32_const(1.0)]);
    let refined = a.op(F32, "fma.rn.f32", &[r.into(), e.into(), r.into()]);
    let finite = a.op(Pred, "testp.finite.f32", &[refined.into()]);
    a.op(F32, "selp.f32", &[refined.into(), r.into(), finite.into()])
}

/// `1 + tanh(z)` as the CUDA prelude's `coil_one_plus_tanh`: `2 / (1 + 2^(-2 z log2 e))`.
pub fn one_plus_tanh_f32(a: &mut Asm, z: Reg) -> Reg {
    let t = a.op(Class::F32, "mul.f32", &[z.into(), f32_const(-2.0 * LOG2E)]);
    let e = a.op(Class::F32, "ex2.approx.ftz.f32", &[t.into()]);
    let d = a.op(Class::F32, "add.f32", &[e.into(), f32_const(1.0)]);
    let r = a.op(Class::F32, "rcp.approx.ftz.f32", &[d.into()]);
    a.op(Class::F32, "mul.f32", &[r.into(), f32_const(2.0)])
}

/// `log(1 + x)` of f32 (Goldberg's correction): `u = 1 + x` rounded, then `log(u) * x / (u - 1)`,
/// which cancels `u`'s rounding error to first order; `x` itself where `u` rounds to 1, `inf`
/// for `inf`. Within a few ulp of `log1pf` (the error of [`log_f32`] and two roundings).
pub fn log1p_f32(a: &mut Asm, x: Reg) -> Reg {
    use Class::*;
    let u = a.op(F32, "add.f32", &[x.into(), f32_const(1.0)]);
    let l = log_f32(a, u, false);
    let d = a.op(F32, "sub.f32", &[u.into(), f32_const(1.0)]);
    let q = a.op(F32, "div.rn.f32", &[x.into(), d.into()]);
    let r = a.op(F32, "mul.f32", &[l.into(), q.into()]);
    let one = a.op(Pred, "setp.eq.f32", &[u.into(), f32_const(1.0)]);
    let r = a.op(F32, "selp.f32", &[x.into(), r.into(), one.into()]);
    let inf = a.op(Pred, "setp.eq.f32", &[x.into(), f32_const(f32::INFINITY)]);
    a.op(F32, "selp.f32", &[x.into(), r.into(), inf.into()])
}

/// `exp(x) - 1` of f32 (Kahan's correction): `u = exp(x)`, then `(u - 1) * x / log(u)`, which
/// cancels `u`'s error to first order; `x` where `u` rounds to 1, `-1` where it is 0, `inf` for
/// `inf`. Within a few ulp of `expm1f`.
pub fn expm1_f32(a: &mut Asm, x: Reg) -> Reg {
    use Class::*;
    let u = exp_f32(a, x);
    let d = a.op(F32, "sub.f32", &[u.into(), f32_const(1.0)]);
    let l = log_f32(a, u, false);
    let q = a.op(F32, "div.rn.f32", &[x.into(), l.into()]);
    let r = a.op(F32, "mul.f32", &[d.into(), q.into()]);
    let one = a.op(Pred, "setp.eq.f32", &[u.into(), f32_const(1.0)]);
    let r = a.op(F32, "selp.f32", &[x.into(), r.into(), one.into()]);
    let zero = a.op(Pred, "setp.eq.f32", &[u.into(), f32_const(0.0)]);
    let r = a.op(F32, "selp.f32", &[f32_const(-1.0), r.into(), zero.into()]);
    let inf = a.op(Pred, "setp.eq.f32", &[u.into(), f32_const(f32::INFINITY)]);
    a.op(F32, "selp.f32", &[u.into(), r.into(), inf.into()])
}

/// `Q` in `tanh(x) = x + x^3 Q(x^2)` on `[0, TANH_SPLIT]`: a least-squares fit (within 0.8 ulp
/// in a sweep emulated in f32).
const TANH_SMALL: [f32; 6] =
    [-0.333_333_3, 0.133_332_54, -0.053_953_22, 0.021_738_842, -0.008_278_836_5, 0.002_242_647_6];
/// Below this, [`TANH_SMALL`]; above, `1 - 2 / (e^(2|x|) + 1)` (within 1.6 ulp emulated, where
/// the subtraction loses at most a bit).
const TANH_SPLIT: f32 = 0.6;

/// `tanh(x)` of f32 (the C backend's `tanhf` is a long routine): an odd polynomial near zero,
/// else `1 - 2 / (e^(2|x|) + 1)` with `ex2` and the sign of `x` copied on. `+-inf` gives
/// `+-1`, NaN NaN, `-0` `-0`.
pub fn tanh_f32(a: &mut Asm, x: Reg) -> Reg {
    use Class::*;
    let ax = a.op(F32, "abs.f32", &[x.into()]);
    let x2 = a.op(F32, "mul.f32", &[x.into(), x.into()]);
    let mut q = a.op(F32, "mov.f32", &[f32_const(TANH_SMALL[5])]);
    for &c in TANH_SMALL[..5].iter().rev() {
        q = a.op(F32, "fma.rn.f32", &[q.into(), x2.into(), f32_const(c)]);
    }
    let x3 = a.op(F32, "mul.f32", &[x2.into(), x.into()]);
    let small = a.op(F32, "fma.rn.f32", &[x3.into(), q.into(), x.into()]);
    let t = a.op(F32, "mul.f32", &[ax.into(), f32_const(2.0 * LOG2E)]);
    let e = a.op(F32, "ex2.approx.ftz.f32", &[t.into()]);
    let d = a.op(F32, "add.f32", &[e.into(), f32_const(1.0)]);
    let r = a.op(F32, "div.full.f32", &[f32_const(2.0), d.into()]);
    let large = a.op(F32, "sub.f32", &[f32_const(1.0), r.into()]);
    let large = a.op(F32, "copysign.f32", &[x.into(), large.into()]);
    let far = a.op(Pred, "setp.ge.f32", &[ax.into(), f32_const(TANH_SPLIT)]);
    a.op(F32, "selp.f32", &[large.into(), small.into(), far.into()])
}

/// Coefficients `c0..c7` of `P` in `log1p(f) = f - f^2/2 + f^3 P(f)` on `[sqrt(1/2) - 1,
/// sqrt(2) - 1]`: a least-squares fit at Chebyshev nodes (relative error of `log1p` under
/// 4e-8 in f32 arithmetic).
const LOG_POLY: [f32; 8] =
    [0.333_333_28, -0.250_002_98, 0.200_014_7, -0.166_422_49, 0.142_021_57, -0.129_722_12, 0.127_124_15, -0.081_017_64];

/// `log(x)` (natural) or `log2(x)` of f32, within 2 ulp (1.4 in a sweep emulated in f32): `x = 2^e m` with `m` in
/// `[sqrt(1/2), sqrt(2))` (subnormals scaled by `2^23` first), `log(m)` by [`LOG_POLY`], plus
/// `e log(2)` in two parts. `x = 0` gives `-inf`, `x < 0` and NaN give NaN, `inf` gives `inf`.
pub fn log_f32(a: &mut Asm, x: Reg, base2: bool) -> Reg {
    use Class::*;
    let sub = a.op(Pred, "setp.lt.f32", &[x.into(), f32_const(f32::MIN_POSITIVE)]);
    let scaled = a.op(F32, "mul.f32", &[x.into(), f32_const(8_388_608.0)]);
    let xs = a.op(F32, "selp.f32", &[scaled.into(), x.into(), sub.into()]);
    let eadj = a.op(B32, "selp.b32", &[Opnd::Int(-23), Opnd::Int(0), sub.into()]);
    let bits = a.op(B32, "mov.b32", &[xs.into()]);
    // `e` such that `bits - (e << 23)` is the bits of `m` in [sqrt(1/2), sqrt(2))
    let t = a.op(B32, "sub.s32", &[bits.into(), Opnd::Int(0x3f35_04f3)]);
    let e = a.op(B32, "shr.s32", &[t.into(), Opnd::Int(23)]);
    let es = a.op(B32, "shl.b32", &[e.into(), Opnd::Int(23)]);
    let mb = a.op(B32, "sub.s32", &[bits.into(), es.into()]);
    let m = a.op(F32, "mov.b32", &[mb.into()]);
    let f = a.op(F32, "sub.f32", &[m.into(), f32_const(1.0)]);
    let et = a.op(B32, "add.s32", &[e.into(), eadj.into()]);
    let ef = a.op(F32, "cvt.rn.f32.s32", &[et.into()]);
    let mut p = a.op(F32, "mov.f32", &[f32_const(LOG_POLY[7])]);
    for &c in LOG_POLY[..7].iter().rev() {
        p = a.op(F32, "fma.rn.f32", &[p.into(), f.into(), f32_const(c)]);
    }
    let f2 = a.op(F32, "mul.f32", &[f.into(), f.into()]);
    let f3 = a.op(F32, "mul.f32", &[f2.into(), f.into()]);
    let head = a.op(F32, "fma.rn.f32", &[f2.into(), f32_const(-0.5), f.into()]);
    let log1p = a.op(F32, "fma.rn.f32", &[f3.into(), p.into(), head.into()]);
    let r = if base2 {
        a.op(F32, "fma.rn.f32", &[log1p.into(), f32_const(LOG2E), ef.into()])
    } else {
        // ln 2 = LN2_HI + LN2_LO, LN2_HI with 9 low zero bits (exact times any exponent)
        const LN2_HI: f32 = 0.693_145_75;
        const LN2_LO: f32 = 1.428_606_8e-6;
        let lo = a.op(F32, "fma.rn.f32", &[ef.into(), f32_const(LN2_LO), log1p.into()]);
        a.op(F32, "fma.rn.f32", &[ef.into(), f32_const(LN2_HI), lo.into()])
    };
    let inf = a.op(Pred, "setp.eq.f32", &[x.into(), f32_const(f32::INFINITY)]);
    let r = a.op(F32, "selp.f32", &[f32_const(f32::INFINITY), r.into(), inf.into()]);
    let zero = a.op(Pred, "setp.eq.f32", &[x.into(), f32_const(0.0)]);
    let r = a.op(F32, "selp.f32", &[f32_const(f32::NEG_INFINITY), r.into(), zero.into()]);
    // below zero or unordered (NaN)
    let bad = a.op(Pred, "setp.ltu.f32", &[x.into(), f32_const(0.0)]);
    a.op(F32, "selp.f32", &[f32_const(f32::NAN), r.into(), bad.into()])
}

/// Below this, `erf(a) = a P(a^2)`; above, `erf(a) = 1 - exp(-a^2 + Q(a))`.
const ERF_SPLIT: f32 = 0.875;
/// `P`: a least-squares fit of `erf(a) / a` in `a^2` on `[0, ERF_SPLIT]` (under 2e-7 relative).
/// Its constant term is the fit's, close to but not `2 / sqrt(pi)`.
#[allow(clippy::approx_constant)]
const ERF_SMALL: [f32; 6] =
    [1.128_379_1, -0.376_125_75, 0.112_826_705, -0.026_798_673, 0.005_042_351_3, -0.000_625_429_3];
/// `Q`: a least-squares fit of `log(erfc(a)) + a^2` in `a` on `[ERF_SPLIT, 4]` (`erf` within 8e-8
/// relative; past 4, `erf` rounds to 1 in f32).
const ERF_LARGE: [f32; 9] = [
    0.000_296_665_04,
    -1.130_140_9,
    0.368_020_12,
    -0.109_939_165,
    0.026_343_18,
    -0.004_732_866_3,
    0.000_591_245_36,
    -4.541_504_3e-5,
    1.605_432_1e-6,
];

/// `p(x)` by Horner's rule (coefficients from the constant term up).
fn horner(a: &mut Asm, coeffs: &[f32], x: Reg) -> Reg {
    let mut p = a.op(Class::F32, "mov.f32", &[f32_const(coeffs[coeffs.len() - 1])]);
    for &c in coeffs[..coeffs.len() - 1].iter().rev() {
        p = a.op(Class::F32, "fma.rn.f32", &[p.into(), x.into(), f32_const(c)]);
    }
    p
}

/// `erf(x)` of f32 within 3 ulp (2.5 in a sweep of [-6, 6] emulated in f32): [`ERF_SMALL`] near 0, `1 - exp(-a^2 + Q(a))` ([`ERF_LARGE`])
/// beyond, the sign of `x` copied back; NaN stays NaN, `±inf` gives `±1`.
pub fn erf_f32(a: &mut Asm, x: Reg) -> Reg {
    use Class::*;
    let m = a.op(F32, "abs.f32", &[x.into()]);
    let sq = a.op(F32, "mul.f32", &[m.into(), m.into()]);
    let p = horner(a, &ERF_SMALL, sq);
    let small = a.op(F32, "mul.f32", &[p.into(), m.into()]);
    let c = a.op(F32, "min.f32", &[m.into(), f32_const(4.0)]);
    let q = horner(a, &ERF_LARGE, c);
    let nc = a.op(F32, "neg.f32", &[c.into()]);
    let t = a.op(F32, "fma.rn.f32", &[nc.into(), c.into(), q.into()]);
    let e = exp_f32(a, t);
    let large = a.op(F32, "sub.f32", &[f32_const(1.0), e.into()]);
    let near = a.op(Pred, "setp.lt.f32", &[m.into(), f32_const(ERF_SPLIT)]);
    let r = a.op(F32, "selp.f32", &[small.into(), large.into(), near.into()]);
    let r = a.op(F32, "copysign.f32", &[x.into(), r.into()]);
    let nan = a.op(Pred, "setp.nan.f32", &[x.into(), x.into()]);
    a.op(F32, "selp.f32", &[x.into(), r.into(), nan.into()])
}

/// `op(x)` for `x` of `dx` and a result of `out` (as `ops::unary`).
pub fn unary(a: &mut Asm, op: UnaryOp, x: Reg, dx: DType, out: DType) -> R<Reg> {
    use Class::*;
    use UnaryOp::*;
    if op.returns_bool() {
        let p = match (op, class_of(dx)?) {
            (IsNan, F32) => a.op(Pred, "setp.nan.f32", &[x.into(), x.into()]),
            (IsInf, F32) => {
                let m = a.op(F32, "abs.f32", &[x.into()]);
                a.op(Pred, "setp.eq.f32", &[m.into(), f32_const(f32::INFINITY)])
            }
            (IsNan | IsInf, _) => literal(a, Scalar::Bool(false), DType::Bool)?,
            (_, F32) => a.op(Pred, "setp.eq.f32", &[x.into(), f32_const(0.0)]),
            (_, Pred) => a.op(Pred, "not.pred", &[x.into()]),
            _ => a.op(Pred, "setp.eq.s64", &[x.into(), Opnd::Int(0)]),
        };
        return convert(a, p, DType::Bool, out);
    }
    if out.is_float() {
        class_of(out)?;
        let x = convert(a, x, dx, out)?;
        let f = |a: &mut Asm, instr: &str| a.op(F32, instr, &[x.into()]);
        return Ok(match op {
            Neg => f(a, "neg.f32"),
            Abs => f(a, "abs.f32"),
            Exp => exp_f32(a, x),
            Exp2 => f(a, "ex2.approx.f32"),
            Log => log_f32(a, x, false),
            Log2 => log_f32(a, x, true),
            Sqrt => f(a, "sqrt.rn.f32"),
            Rsqrt => f(a, "rsqrt.approx.f32"),
            Erf => erf_f32(a, x),
            // No PTX form yet: the kernel is CUDA C, with the library's erfcf.
            Erfc => return Err("erfc (CUDA C's erfcf)".into()),
            Tanh => tanh_f32(a, x),
            Sin => super::trig::trig_f32(a, x, super::trig::Trig::Sin),
            Cos => super::trig::trig_f32(a, x, super::trig::Trig::Cos),
            Tan => super::trig::trig_f32(a, x, super::trig::Trig::Tan),
            Atan => super::trig::inverse_trig_f32(a, x, super::trig::InverseTrig::Atan),
            Asin => super::trig::inverse_trig_f32(a, x, super::trig::InverseTrig::Asin),
            Acos => super::trig::inverse_trig_f32(a, x, super::trig::InverseTrig::Acos),
            Erfinv => super::f64math::erfinv_f32(a, x),
            Log1p => log1p_f32(a, x),
            Expm1 => expm1_f32(a, x),
            Sign => {
                // (0 < x) - (x < 0), as the prelude's coil_sign (NaN and -0 give +0)
                let pos = a.op(Pred, "setp.gt.f32", &[x.into(), f32_const(0.0)]);
                let neg = a.op(Pred, "setp.lt.f32", &[x.into(), f32_const(0.0)]);
                let s = a.op(F32, "selp.f32", &[f32_const(-1.0), f32_const(0.0), neg.into()]);
                a.op(F32, "selp.f32", &[f32_const(1.0), s.into(), pos.into()])
            }
            Reciprocal => a.op(F32, "div.rn.f32", &[f32_const(1.0), x.into()]),
            Sigmoid => {
                let n = f(a, "neg.f32");
                let e = exp_f32(a, n);
                let d = a.op(F32, "add.f32", &[e.into(), f32_const(1.0)]);
                a.op(F32, "div.rn.f32", &[f32_const(1.0), d.into()])
            }
            Floor => f(a, "cvt.rmi.f32.f32"),
            Ceil => f(a, "cvt.rpi.f32.f32"),
            Round => f(a, "cvt.rni.f32.f32"),
            Trunc => f(a, "cvt.rzi.f32.f32"),
            _ => return Err(format!("{} of a float", op.name())),
        });
    }
    if op == BitwiseNot && out == DType::Bool && dx == DType::Bool {
        return Ok(a.op(Pred, "not.pred", &[x.into()]));
    }
    if class_of(out)? != B64 || class_of(dx)? != B64 {
        return Err(format!("{} of {dx} into {out}", op.name()));
    }
    let x = convert(a, x, dx, out)?;
    Ok(match op {
        BitwiseNot => {
            let n = a.op(B64, "not.b64", &[x.into()]);
            wrap(a, n, out)
        }
        Neg => {
            let n = a.op(B64, "neg.s64", &[x.into()]);
            wrap(a, n, out)
        }
        Abs => {
            let n = a.op(B64, "abs.s64", &[x.into()]);
            wrap(a, n, out)
        }
        Floor | Ceil | Round | Trunc => x,
        Sign => {
            let pos = a.op(Pred, "setp.gt.s64", &[x.into(), Opnd::Int(0)]);
            let neg = a.op(Pred, "setp.lt.s64", &[x.into(), Opnd::Int(0)]);
            let s = a.op(B64, "selp.b64", &[Opnd::Int(-1), Opnd::Int(0), neg.into()]);
            let s = a.op(B64, "selp.b64", &[Opnd::Int(1), s.into(), pos.into()]);
            wrap(a, s, out)
        }
        _ => return Err(format!("{} of an integer", op.name())),
    })
}

/// `op(x, y)` for operands of `dx` / `dy` and a result of `out` (as `ops::binary`; f32
/// division is `div.full` when all three are f32-computed, as the CUDA emitter's).
pub fn binary(a: &mut Asm, op: BinaryOp, x: Reg, dx: DType, y: Reg, dy: DType, out: DType) -> R<Reg> {
    use BinaryOp::*;
    use Class::*;
    if op.returns_bool() {
        let y = convert(a, y, dy, dx)?;
        let p = match class_of(dx)? {
            F32 => {
                let cmp = |a: &mut Asm, c: &str| a.op(Pred, &format!("setp.{c}.f32"), &[x.into(), y.into()]);
                match op {
                    Eq => cmp(a, "eq"),
                    Ne => cmp(a, "neu"),
                    Lt => cmp(a, "lt"),
                    Le => cmp(a, "le"),
                    Gt => cmp(a, "gt"),
                    Ge => cmp(a, "ge"),
                    _ => {
                        let px = a.op(Pred, "setp.neu.f32", &[x.into(), f32_const(0.0)]);
                        let py = a.op(Pred, "setp.neu.f32", &[y.into(), f32_const(0.0)]);
                        let instr = if op == LogicalAnd { "and.pred" } else { "or.pred" };
                        a.op(Pred, instr, &[px.into(), py.into()])
                    }
                }
            }
            Pred => {
                let nx = a.op(Pred, "not.pred", &[x.into()]);
                let ny = a.op(Pred, "not.pred", &[y.into()]);
                let two = |a: &mut Asm, instr: &str, l: Reg, r: Reg| a.op(Pred, instr, &[l.into(), r.into()]);
                match op {
                    Eq => {
                        let d = two(a, "xor.pred", x, y);
                        a.op(Pred, "not.pred", &[d.into()])
                    }
                    Ne => two(a, "xor.pred", x, y),
                    Lt => two(a, "and.pred", nx, y),
                    Le => two(a, "or.pred", nx, y),
                    Gt => two(a, "and.pred", x, ny),
                    Ge => two(a, "or.pred", x, ny),
                    LogicalAnd => two(a, "and.pred", x, y),
                    _ => two(a, "or.pred", x, y),
                }
            }
            _ => {
                let cmp = |a: &mut Asm, c: &str| a.op(Pred, &format!("setp.{c}.s64"), &[x.into(), y.into()]);
                match op {
                    Eq => cmp(a, "eq"),
                    Ne => cmp(a, "ne"),
                    Lt => cmp(a, "lt"),
                    Le => cmp(a, "le"),
                    Gt => cmp(a, "gt"),
                    Ge => cmp(a, "ge"),
                    _ => {
                        let px = a.op(Pred, "setp.ne.s64", &[x.into(), Opnd::Int(0)]);
                        let py = a.op(Pred, "setp.ne.s64", &[y.into(), Opnd::Int(0)]);
                        let instr = if op == LogicalAnd { "and.pred" } else { "or.pred" };
                        a.op(Pred, instr, &[px.into(), py.into()])
                    }
                }
            }
        };
        return convert(a, p, DType::Bool, out);
    }
    let single = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
    let (xo, yo) = (convert(a, x, dx, out)?, convert(a, y, dy, out)?);
    let two = |a: &mut Asm, class: Class, instr: &str| a.op(class, instr, &[xo.into(), yo.into()]);
    match class_of(out)? {
        F32 => Ok(match op {
            Add => two(a, F32, "add.f32"),
            Sub => two(a, F32, "sub.f32"),
            Mul => two(a, F32, "mul.f32"),
            Div if single(dx) && single(dy) => two(a, F32, "div.full.f32"),
            Div => two(a, F32, "div.rn.f32"),
            FloorDiv => floor_divide_f32(a, xo, yo),
            Remainder => remainder_f32(a, xo, yo),
            // C's `truncf(a / b)`: the IEEE quotient, rounded toward zero
            TruncDiv => {
                let q = two(a, F32, "div.rn.f32");
                a.op(F32, "cvt.rzi.f32.f32", &[q.into()])
            }
            Pow => super::f64math::pow_f32(a, xo, yo),
            Atan2 => super::trig::atan2_f32(a, xo, yo),
            Maximum => max_min_f32(a, xo, yo, "max.NaN.f32"),
            Minimum => max_min_f32(a, xo, yo, "min.NaN.f32"),
            _ => return Err(format!("{} of floats", op.name())),
        }),
        B64 => {
            let r = match op {
                Add => two(a, B64, "add.s64"),
                Sub => two(a, B64, "sub.s64"),
                Mul => two(a, B64, "mul.lo.s64"),
                Maximum => two(a, B64, "max.s64"),
                Minimum => two(a, B64, "min.s64"),
                BitwiseAnd => two(a, B64, "and.b64"),
                BitwiseOr => two(a, B64, "or.b64"),
                BitwiseXor => two(a, B64, "xor.b64"),
                ShiftLeft | ShiftRight => shift(a, op, xo, yo, out),
                _ => return Err(format!("{} of integers", op.name())),
            };
            Ok(wrap(a, r, out))
        }
        // bools as the C backend computes them: 0/1 integers, the result `!= 0`
        _ => Ok(match op {
            Add | Maximum | BitwiseOr => two(a, Pred, "or.pred"),
            Mul | Minimum | BitwiseAnd => two(a, Pred, "and.pred"),
            Sub | BitwiseXor => two(a, Pred, "xor.pred"),
            _ => return Err(format!("{} into a bool", op.name())),
        }),
    }
}

/// `x << y` or `x >> y` of integers of `out` as `BinaryOp::shift`: the amount is compared with
/// the dtype's limit as an unsigned number (so a negative one is out of range too); a left
/// shift out of range is 0, a right shift out of range shifts by the limit (the sign fill).
/// In range, `shl.b64` / `shr.s64` of the 64-bit register; the caller wraps to the width.
fn shift(a: &mut Asm, op: BinaryOp, x: Reg, y: Reg, out: DType) -> Reg {
    use Class::*;
    let bits = 8 * out.size_bytes() as i64;
    let limit = if op == BinaryOp::ShiftLeft || out == DType::U8 { bits } else { bits - 1 };
    let inside = a.op(Pred, "setp.lt.u64", &[y.into(), Opnd::Int(limit)]);
    if op == BinaryOp::ShiftLeft {
        let n = a.op(B32, "cvt.u32.u64", &[y.into()]);
        let r = a.op(B64, "shl.b64", &[x.into(), n.into()]);
        a.op(B64, "selp.b64", &[r.into(), Opnd::Int(0), inside.into()])
    } else {
        let amount = a.op(B64, "selp.b64", &[y.into(), Opnd::Int(limit), inside.into()]);
        let n = a.op(B32, "cvt.u32.u64", &[amount.into()]);
        a.op(B64, "shr.s64", &[x.into(), n.into()])
    }
}

/// NaN-propagating maximum or minimum (`instr`) of f32 as the prelude's `coil_maximum_f32`:
/// `max.NaN` orders `-0.0` below `+0.0`, coil's rule gives the first operand on that tie
/// (`relu(-0.0)` is `-0.0`), so equal operands (never NaN) select `x`.
fn max_min_f32(a: &mut Asm, x: Reg, y: Reg, instr: &str) -> Reg {
    let m = a.op(Class::F32, instr, &[x.into(), y.into()]);
    let tie = a.op(Class::Pred, "setp.eq.f32", &[x.into(), y.into()]);
    a.op(Class::F32, "selp.f32", &[x.into(), m.into(), tie.into()])
}

/// `torch.remainder` of f32 as the prelude's `coil_remainder`: `fmod`, moved by the divisor
/// where its sign differs from the divisor's.
fn remainder_f32(a: &mut Asm, x: Reg, y: Reg) -> Reg {
    let m = super::f64math::fmod_f32(a, x, y);
    let fix = differs_in_sign(a, m, y);
    let moved = a.op(Class::F32, "add.rn.f32", &[m.into(), y.into()]);
    a.op(Class::F32, "selp.f32", &[moved.into(), m.into(), fix.into()])
}

/// Whether `m != 0` (C's, so NaN too) and `m < 0` differs from `y < 0`: where a remainder
/// takes the divisor's sign.
fn differs_in_sign(a: &mut Asm, m: Reg, y: Reg) -> Reg {
    use Class::*;
    let nonzero = a.op(Pred, "setp.neu.f32", &[m.into(), Opnd::F32(0.0)]);
    let m_neg = a.op(Pred, "setp.lt.f32", &[m.into(), Opnd::F32(0.0)]);
    let y_neg = a.op(Pred, "setp.lt.f32", &[y.into(), Opnd::F32(0.0)]);
    let signs = a.op(Pred, "xor.pred", &[m_neg.into(), y_neg.into()]);
    a.op(Pred, "and.pred", &[nonzero.into(), signs.into()])
}

/// `torch.floor_divide` of f32 as the prelude's `coil_floordiv` (Python's algorithm): `(x -
/// fmod(x, y)) / y`, one less where the remainder's sign differs from `y`'s, then rounded to
/// the nearest integer from below; `x / y` for a zero divisor, a signed zero for a zero
/// quotient.
fn floor_divide_f32(a: &mut Asm, x: Reg, y: Reg) -> Reg {
    use Class::*;
    let m = super::f64math::fmod_f32(a, x, y);
    let num = a.op(F32, "sub.rn.f32", &[x.into(), m.into()]);
    let div = a.op(F32, "div.rn.f32", &[num.into(), y.into()]);
    let fix = differs_in_sign(a, m, y);
    let less = a.op(F32, "sub.rn.f32", &[div.into(), Opnd::F32(1.0)]);
    let div = a.op(F32, "selp.f32", &[less.into(), div.into(), fix.into()]);
    let fd = a.op(F32, "cvt.rmi.f32.f32", &[div.into()]);
    let frac = a.op(F32, "sub.rn.f32", &[div.into(), fd.into()]);
    let up = a.op(Pred, "setp.gt.f32", &[frac.into(), Opnd::F32(0.5)]);
    let fd1 = a.op(F32, "add.rn.f32", &[fd.into(), Opnd::F32(1.0)]);
    let fd = a.op(F32, "selp.f32", &[fd1.into(), fd.into(), up.into()]);
    // div == 0: copysign(0, x / y); y == 0: x / y
    let q = a.op(F32, "div.rn.f32", &[x.into(), y.into()]);
    let qbits = a.op(B32, "mov.b32", &[q.into()]);
    let sign = a.op(B32, "and.b32", &[qbits.into(), Opnd::Hex(0x8000_0000)]);
    let zero = a.op(F32, "mov.b32", &[sign.into()]);
    let div_zero = a.op(Pred, "setp.eq.f32", &[div.into(), Opnd::F32(0.0)]);
    let r = a.op(F32, "selp.f32", &[zero.into(), fd.into(), div_zero.into()]);
    let y_zero = a.op(Pred, "setp.eq.f32", &[y.into(), Opnd::F32(0.0)]);
    a.op(F32, "selp.f32", &[q.into(), r.into(), y_zero.into()])
}

/// `c ? x : y` of values of `out` (operands already converted to it).
pub fn select(a: &mut Asm, c: Reg, x: Reg, y: Reg, out: DType) -> R<Reg> {
    Ok(match class_of(out)? {
        Class::F32 => a.op(Class::F32, "selp.f32", &[x.into(), y.into(), c.into()]),
        Class::B64 => a.op(Class::B64, "selp.b64", &[x.into(), y.into(), c.into()]),
        _ => {
            let l = a.op(Class::Pred, "and.pred", &[c.into(), x.into()]);
            let nc = a.op(Class::Pred, "not.pred", &[c.into()]);
            let r = a.op(Class::Pred, "and.pred", &[nc.into(), y.into()]);
            a.op(Class::Pred, "or.pred", &[l.into(), r.into()])
        }
    })
}
