//! The schedule text: [`Schedule`]'s `Display` and [`Schedule::parse`], its inverse (the graph
//! cache stores a compiled graph's schedule as this text).
//!
//! ```text
//! schedule
//! kernel per_fused_amax_0 persistent_reduction xnumel=4 rnumel=s0 nodes=[0, 1] stores=[2]
//! kernel ext_bmm_1 extern xnumel=1 rnumel=none nodes=[2] stores=[3]
//! refusal "buf1" "buf2" "the reduction's row differs"
//! memory peak=96
//!   slots=[64, 32]
//!   slot_lives=[(0, 1), (1, 1)]
//!   slot_of=[none, none, 0, 1]
//!   donated=[(0, 1)]
//!   declined=[((1, 0), "the input is read after the output is written")]
//!   in_outputs=[(2, 3)]
//! ```
//!
//! * A `kernel` line per [`FusedKernel`], in launch order: name, kind ([`KernelKind::name`]),
//!   extents (index expressions over the size symbols `s<n>`), the loop nodes it runs and the
//!   buffers it stores (buffer ids).
//! * A `refusal` line per [`FusionRefusal`]: producer, consumer and reason, quoted.
//! * The [`MemoryPlan`](crate::kernel::MemoryPlan): slot sizes and lives, each buffer's slot (`none` for none), the
//!   donations taken as `(output, input)`, those declined with their reasons, and the
//!   temporaries kept in outputs as `(temporary, output)` buffer ids.

use super::expr::Scope;
use super::lex::{self, quote, Tok};
use super::loops::size_scope;
use super::{located_error, Located, Parser};
use crate::error::Result;
use crate::kernel::{Donation, FusedKernel, FusionRefusal, InOutput, KernelKind, Schedule};
use crate::loops::BufferId;
use std::fmt;

/// What the errors of [`Schedule::parse`] call their text.
const SCHEDULE: &str = "schedule text";

/// The kernel kinds by their names in the text.
const KINDS: [KernelKind; 4] =
    [KernelKind::Pointwise, KernelKind::PersistentReduction, KernelKind::LoopedReduction, KernelKind::Extern];

impl fmt::Display for Schedule {
    /// The schedule text (see [`crate::parse::schedule`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids = |ids: &[BufferId]| ids.iter().map(|b| b.0.to_string()).collect::<Vec<_>>().join(", ");
        let list = |items: Vec<String>| format!("[{}]", items.join(", "));
        writeln!(f, "schedule")?;
        for k in &self.kernels {
            let nodes = list(k.nodes.iter().map(usize::to_string).collect());
            let rnumel = k.rnumel.map_or("none".to_string(), |r| r.to_string());
            let (name, kind, xnumel, stores) = (&k.name, k.kind.name(), k.xnumel, ids(&k.stores));
            writeln!(f, "kernel {name} {kind} xnumel={xnumel} rnumel={rnumel} nodes={nodes} stores=[{stores}]")?;
        }
        for r in &self.refusals {
            writeln!(f, "refusal {} {} {}", quote(&r.producer), quote(&r.consumer), quote(&r.reason))?;
        }
        let m = &self.memory;
        writeln!(f, "memory peak={}", m.peak_bytes)?;
        writeln!(f, "  slots={}", list(m.slots.iter().map(usize::to_string).collect()))?;
        writeln!(f, "  slot_lives={}", list(m.slot_lives.iter().map(|(a, b)| format!("({a}, {b})")).collect()))?;
        let slot = |s: &Option<usize>| s.map_or("none".to_string(), |s| s.to_string());
        writeln!(f, "  slot_of={}", list(m.slot_of.iter().map(slot).collect()))?;
        let donation = |d: &Donation| format!("({}, {})", d.output, d.input);
        writeln!(f, "  donated={}", list(m.donated.iter().map(donation).collect()))?;
        let declined = m.declined.iter().map(|(d, why)| format!("({}, {})", donation(d), quote(why)));
        writeln!(f, "  declined={}", list(declined.collect()))?;
        let kept = m.in_outputs.iter().map(|x| format!("({}, {})", x.temporary.0, x.output.0));
        writeln!(f, "  in_outputs={}", list(kept.collect()))
    }
}

impl Schedule {
    /// Parses the text the schedule's `Display` writes (see [`crate::parse::schedule`]). The
    /// result equals the printed schedule.
    ///
    /// ```
    /// use coil_ir::kernel::Schedule;
    /// let text = "\
    /// schedule
    /// kernel poi_fused_exp_0 pointwise xnumel=8 rnumel=none nodes=[0] stores=[1]
    /// refusal \"buf0\" \"buf1\" \"a \\\"reason\\\"\"
    /// memory peak=32
    ///   slots=[]
    ///   slot_lives=[]
    ///   slot_of=[none, none]
    ///   donated=[]
    ///   declined=[]
    ///   in_outputs=[]
    /// ";
    /// let s = Schedule::parse(text).unwrap();
    /// assert_eq!(s.refusals[0].reason, "a \"reason\"");
    /// assert_eq!(s.to_string(), text);
    /// let e = Schedule::parse(&text.replace("pointwise", "pointy")).unwrap_err();
    /// assert!(e.to_string().contains("2:24: expected a kernel kind"), "{e}");
    /// ```
    pub fn parse(text: &str) -> Result<Schedule> {
        let fail = |(pos, message): Located| located_error(text, SCHEDULE, pos, message);
        let tokens = lex::lex(text).map_err(fail)?;
        let scope = size_scope(&tokens);
        let mut p = Parser { tokens, at: 0 };
        p.schedule(&scope).map_err(fail)
    }
}

impl Parser {
    fn schedule(&mut self, scope: &Scope) -> Result<Schedule, Located> {
        self.keyword("schedule")?;
        let mut schedule = Schedule::default();
        while self.at_word("kernel") {
            self.at += 1;
            schedule.kernels.push(self.fused_kernel(scope)?);
        }
        while self.at_word("refusal") {
            self.at += 1;
            let (producer, consumer, reason) = (self.string()?, self.string()?, self.string()?);
            schedule.refusals.push(FusionRefusal { producer, consumer, reason });
        }
        self.keyword("memory")?;
        let m = &mut schedule.memory;
        m.peak_bytes = self.field("peak", |p| p.number("a byte count").map(|(n, _)| n))?;
        m.slots = self.field("slots", |p| p.usize_list())?;
        m.slot_lives = self.field("slot_lives", |p| p.list(|p| p.pair(|p| p.count())))?;
        m.slot_of = self.field("slot_of", |p| {
            p.list(|p| match p.at_word("none") {
                true => {
                    p.at += 1;
                    Ok(None)
                }
                false => p.count().map(Some),
            })
        })?;
        m.donated = self.field("donated", |p| p.list(Parser::donation))?;
        m.declined = self.field("declined", |p| p.list(|p| p.pair_of(Parser::donation, Parser::string)))?;
        m.in_outputs = self.field("in_outputs", |p| {
            p.list(|p| p.pair(|p| p.count().map(BufferId)).map(|(temporary, output)| InOutput { temporary, output }))
        })?;
        match self.peek().0 {
            Tok::End => Ok(schedule),
            _ => self.expected("the end of the schedule"),
        }
    }

    /// `name kind xnumel=e rnumel=e|none nodes=[..] stores=[..]` (after `kernel`).
    fn fused_kernel(&mut self, scope: &Scope) -> Result<FusedKernel, Located> {
        let (name, _) = self.ident("the kernel's name")?;
        let kind = match self.peek().clone() {
            (Tok::Ident(w), _) if KINDS.iter().any(|k| k.name() == w) => {
                self.at += 1;
                *KINDS.iter().find(|k| k.name() == w).expect("found")
            }
            _ => return self.expected("a kernel kind (pointwise, persistent_reduction, looped_reduction, extern)"),
        };
        let xnumel = self.field("xnumel", |p| p.expr(scope))?;
        let rnumel = self.field("rnumel", |p| match p.at_word("none") {
            true => {
                p.at += 1;
                Ok(None)
            }
            false => p.expr(scope).map(Some),
        })?;
        let nodes = self.field("nodes", |p| p.usize_list())?;
        let stores = self.field("stores", |p| p.usize_list())?.into_iter().map(BufferId).collect();
        Ok(FusedKernel { name, kind, nodes, xnumel, rnumel, stores })
    }

    /// `key=<value>`.
    fn field<T>(&mut self, key: &str, value: impl FnOnce(&mut Parser) -> Result<T, Located>) -> Result<T, Located> {
        self.keyword(key)?;
        self.expect('=', &format!("after `{key}`"))?;
        value(self)
    }

    /// A non-negative integer.
    fn count(&mut self) -> Result<usize, Located> {
        self.number("a non-negative integer").map(|(n, _)| n)
    }

    /// A quoted string.
    fn string(&mut self) -> Result<String, Located> {
        match self.peek().clone() {
            (Tok::Str(s), _) => {
                self.at += 1;
                Ok(s)
            }
            _ => self.expected("a quoted string"),
        }
    }

    /// `(output, input)`.
    fn donation(&mut self) -> Result<Donation, Located> {
        self.pair(|p| p.count()).map(|(output, input)| Donation { output, input })
    }

    /// `(a, b)`, both read by `item`.
    fn pair<T>(&mut self, item: impl Fn(&mut Parser) -> Result<T, Located>) -> Result<(T, T), Located> {
        self.pair_of(&item, &item)
    }

    /// `(a, b)`.
    fn pair_of<A, B>(
        &mut self,
        first: impl FnOnce(&mut Parser) -> Result<A, Located>,
        second: impl FnOnce(&mut Parser) -> Result<B, Located>,
    ) -> Result<(A, B), Located> {
        self.expect('(', "to open a pair")?;
        let a = first(self)?;
        self.expect(',', "in a pair")?;
        let b = second(self)?;
        self.expect(')', "to close a pair")?;
        Ok((a, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::MemoryPlan;
    use crate::sym::Expr;

    /// A schedule with every part filled in: symbolic extents, refusals whose texts need
    /// quoting, slots, donations, declined donations and temporaries kept in outputs.
    fn full() -> Schedule {
        let s0 = Expr::size("s0");
        Schedule {
            kernels: vec![
                FusedKernel {
                    name: "per_fused_amax_sub_0".into(),
                    kind: KernelKind::PersistentReduction,
                    nodes: vec![0, 1, 2],
                    xnumel: s0 * 4,
                    rnumel: Some(s0 - 1),
                    stores: vec![BufferId(3), BufferId(5)],
                },
                FusedKernel {
                    name: "ext_bmm_1".into(),
                    kind: KernelKind::Extern,
                    nodes: vec![3],
                    xnumel: Expr::int(1),
                    rnumel: None,
                    stores: vec![],
                },
                FusedKernel {
                    name: "red_fused_sum_2".into(),
                    kind: KernelKind::LoopedReduction,
                    nodes: vec![4],
                    xnumel: s0.floor_div(2),
                    rnumel: Some(Expr::int(70000)),
                    stores: vec![BufferId(6)],
                },
                FusedKernel {
                    name: "poi_fused_exp_3".into(),
                    kind: KernelKind::Pointwise,
                    nodes: vec![5],
                    xnumel: Expr::int(12),
                    rnumel: None,
                    stores: vec![BufferId(7)],
                },
            ],
            refusals: vec![
                FusionRefusal {
                    producer: "buf3".into(),
                    consumer: "buf5".into(),
                    reason: "rows differ: 4 vs s0".into(),
                },
                FusionRefusal {
                    producer: "ext \"bmm\"".into(),
                    consumer: "back\\slash".into(),
                    reason: "two\nlines; # not a comment".into(),
                },
            ],
            memory: MemoryPlan {
                slots: vec![1024, 256],
                slot_lives: vec![(0, 2), (1, 3)],
                slot_of: vec![None, Some(0), None, Some(1), None, Some(0), None, None],
                peak_bytes: 4096,
                donated: vec![Donation { output: 0, input: 1 }],
                declined: vec![(Donation { output: 1, input: 0 }, "the input is read after \"it\" is written".into())],
                in_outputs: vec![InOutput { temporary: BufferId(6), output: BufferId(7) }],
            },
        }
    }

    #[test]
    fn every_part_round_trips() {
        for schedule in [full(), Schedule::default()] {
            let text = schedule.to_string();
            let parsed = Schedule::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(parsed, schedule, "{text}");
            assert_eq!(parsed.to_string(), text);
        }
    }

    #[test]
    fn damaged_texts_are_located_errors() {
        let text = full().to_string();
        let cases = [
            (text.replace("nodes=[0, 1, 2]", "nodes=[0, 1, 2"), "expected `,` or `]` in the list"),
            (text.replace("slot_lives=", "lives="), "expected `slot_lives`"),
            (text.replace("\"buf3\"", "buf3"), "expected a quoted string"),
            (text.replace("xnumel=4*s0", "xnumel=4*x0"), "unknown symbol `x0`"),
            (format!("{text}extra"), "expected the end of the schedule"),
            (text[..text.len() / 2].to_string(), "expected"),
        ];
        for (bad, message) in cases {
            let e = Schedule::parse(&bad).expect_err(&bad).to_string();
            assert!(e.contains("schedule text") && e.contains(message), "{e}");
        }
    }
}
