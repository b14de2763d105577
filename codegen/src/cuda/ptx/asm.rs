//! The PTX text of one kernel body: typed virtual registers, instructions and labels.
//!
//! Registers are numbered per class in order of creation (`%f0, %f1, ...`) and declared once
//! at the top ([`Asm::declarations`]); ptxas allocates the real ones, so the emitter writes
//! SSA-style code and never reuses a register for another value, except for loop-carried
//! values (accumulators, loop counters), which it updates in place.

use std::fmt::{self, Display, Write};

/// A register class (its `.reg` type and name prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// `.pred %p`: a predicate (a bool value).
    Pred,
    /// `.b16 %h`: a raw 16-bit word (f16/bf16 bits).
    B16,
    /// `.b32 %r`: a 32-bit integer or word.
    B32,
    /// `.b64 %rd`: a 64-bit integer or address.
    B64,
    /// `.f32 %f`.
    F32,
    /// `.f64 %fd`: only inside the routines that compute in f64 (random normals).
    F64,
}

impl Class {
    const ALL: [Class; 6] = [Class::Pred, Class::B16, Class::B32, Class::B64, Class::F32, Class::F64];

    fn prefix(self) -> &'static str {
        match self {
            Class::Pred => "p",
            Class::B16 => "h",
            Class::B32 => "r",
            Class::B64 => "rd",
            Class::F32 => "f",
            Class::F64 => "fd",
        }
    }

    fn decl(self) -> &'static str {
        match self {
            Class::Pred => ".pred",
            Class::B16 => ".b16",
            Class::B32 => ".b32",
            Class::B64 => ".b64",
            Class::F32 => ".f32",
            Class::F64 => ".f64",
        }
    }
}

/// A virtual register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reg {
    pub class: Class,
    n: u32,
}

impl Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}{}", self.class.prefix(), self.n)
    }
}

/// An operand: a register or an immediate (integers in decimal, f32 as `0fXXXXXXXX`, exact).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Opnd {
    Reg(Reg),
    Int(i64),
    F32(f32),
    /// An f64 immediate, `0dXXXXXXXXXXXXXXXX` (exact).
    F64(f64),
    /// An integer immediate written in hex (`0x...`: a bit pattern, such as a multiplier).
    Hex(u64),
    /// A special register (`%tid.x`) or other verbatim text.
    Text(&'static str),
}

impl From<Reg> for Opnd {
    fn from(r: Reg) -> Opnd {
        Opnd::Reg(r)
    }
}

impl Display for Opnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opnd::Reg(r) => r.fmt(f),
            Opnd::Int(i) => i.fmt(f),
            Opnd::F32(x) => write!(f, "0f{:08X}", x.to_bits()),
            Opnd::F64(x) => write!(f, "0d{:016X}", x.to_bits()),
            Opnd::Hex(x) => write!(f, "0x{x:X}"),
            Opnd::Text(t) => f.write_str(t),
        }
    }
}

/// The instructions of a kernel body and its registers.
#[derive(Default)]
pub struct Asm {
    body: String,
    counts: [u32; 6],
    labels: u32,
    /// Module-level declarations the body needs (`.const` tables), each once.
    globals: Vec<String>,
}

impl Asm {
    /// A fresh register of `class`.
    pub fn reg(&mut self, class: Class) -> Reg {
        let slot = Class::ALL.iter().position(|&c| c == class).expect("a class");
        let n = self.counts[slot];
        self.counts[slot] += 1;
        Reg { class, n }
    }

    /// One instruction (`text` without the `;`).
    pub fn ins(&mut self, text: impl AsRef<str>) {
        let _ = writeln!(self.body, "\t{};", text.as_ref());
    }

    /// `instr d, a, b, ...` into a fresh register `d` of `class`.
    pub fn op(&mut self, class: Class, instr: &str, args: &[Opnd]) -> Reg {
        let d = self.reg(class);
        self.op_into(d, instr, args);
        d
    }

    /// `instr d, a, b, ...` into the existing register `d` (loop-carried values).
    pub fn op_into(&mut self, d: Reg, instr: &str, args: &[Opnd]) {
        let mut text = format!("{instr} {d}");
        for a in args {
            let _ = write!(text, ", {a}");
        }
        self.ins(text);
    }

    /// Declares `text` at module level (once, however often it is asked for).
    pub fn declare(&mut self, text: &str) {
        if !self.globals.iter().any(|g| g == text) {
            self.globals.push(text.to_string());
        }
    }

    /// The module-level declarations, in the order first asked for.
    pub fn globals(&self) -> &[String] {
        &self.globals
    }

    /// A fresh label name.
    pub fn label(&mut self) -> String {
        self.labels += 1;
        format!("$L{}", self.labels)
    }

    /// Places `label` here.
    pub fn place(&mut self, label: &str) {
        let _ = writeln!(self.body, "{label}:");
    }

    /// `@p bra label` (or `@!p` when `negate`).
    pub fn branch_if(&mut self, p: Reg, negate: bool, label: &str) {
        self.ins(format!("@{}{p} bra {label}", if negate { "!" } else { "" }));
    }

    /// `bra label`.
    pub fn jump(&mut self, label: &str) {
        self.ins(format!("bra.uni {label}"));
    }

    /// The `.reg` declarations of every register created, then the body.
    pub fn finish(self) -> String {
        let mut out = String::new();
        for (class, &n) in Class::ALL.iter().zip(&self.counts) {
            if n > 0 {
                let _ = writeln!(out, "\t.reg {} %{}<{n}>;", class.decl(), class.prefix());
            }
        }
        out + &self.body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_are_numbered_per_class_and_declared() {
        let mut a = Asm::default();
        let x = a.reg(Class::F32);
        let y = a.op(Class::F32, "add.f32", &[x.into(), Opnd::F32(1.0)]);
        let p = a.op(Class::Pred, "setp.gt.f32", &[y.into(), Opnd::F32(0.0)]);
        let l = a.label();
        a.branch_if(p, true, &l);
        a.place(&l);
        let text = a.finish();
        assert_eq!(
            text,
            "\t.reg .pred %p<1>;\n\t.reg .f32 %f<2>;\n\tadd.f32 %f1, %f0, 0f3F800000;\n\
             \tsetp.gt.f32 %p0, %f1, 0f00000000;\n\t@!%p0 bra $L1;\n$L1:\n"
        );
    }
}
