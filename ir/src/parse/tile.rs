//! Reading tile kernels back from their text: [`TileKernel::parse`] is the inverse of its
//! `Display` (see [`crate::parse`] for the format).

use super::expr::Scope;
use super::lex::{self, Tok};
use super::loops::{index_vars, random_draw, size_scope};
use super::{located_error, op, Located, Parser, Pos};
use crate::dtype::DType;
use crate::error::Result;
use crate::kernel::{rindex, xindex, Dims, KernelKind, TileArg, TileKernel, TileOp, TileStmt, Var};
use crate::loops::BufferId;
use crate::op::{BinaryOp, RandDist, ReduceOp, UnaryOp};
use std::collections::HashSet;

/// What the errors of [`TileKernel::parse`] call their text.
const TILE: &str = "tile text";

/// The kinds of generated kernels, by name.
const KINDS: [KernelKind; 3] = [KernelKind::Pointwise, KernelKind::PersistentReduction, KernelKind::LoopedReduction];

impl TileKernel {
    /// Parses the text a tile kernel's `Display` writes (the `.tile` files of the debug dump;
    /// see [`crate::parse`] for the format). The result equals the printed kernel and prints
    /// as the text did (without its comments).
    ///
    /// ```
    /// use coil_ir::kernel::TileKernel;
    /// let text = "\
    /// @kernel(kind=pointwise)
    /// def poi_fused_exp_0(in_ptr0: *f32 (buffer 0), out_ptr0: *f32 (buffer 1)):
    ///     xnumel = 8
    ///     XBLOCK: constexpr = 1024
    ///     xindex = program_id(0) * XBLOCK + arange(XBLOCK)[:, None]
    ///     xmask = xindex < xnumel
    ///     tmp0: f32[XBLOCK, 1] = load(in_ptr0 + (xindex))
    ///     tmp1: f32[XBLOCK, 1] = exp(tmp0)
    ///     store(out_ptr0 + (xindex), tmp1, xmask)
    /// ";
    /// let k = TileKernel::parse(text).unwrap();
    /// assert_eq!(k.to_string(), text);
    /// let e = TileKernel::parse(&text.replace("exp(tmp0)", "exp(tmp2)")).unwrap_err();
    /// assert!(e.to_string().contains("8:32: `tmp2` is not defined"), "{e}");
    /// ```
    pub fn parse(text: &str) -> Result<TileKernel> {
        let mut kernels = TileKernel::parse_all(text)?;
        match kernels.len() {
            1 => Ok(kernels.remove(0)),
            n => Err(crate::Error::value(format!("{TILE}: expected one kernel, found {n}"))),
        }
    }

    /// Parses several kernels, one after another (as a filetest or a dump of a graph's kernels
    /// holds them).
    pub fn parse_all(text: &str) -> Result<Vec<TileKernel>> {
        let fail = |(pos, message): Located| located_error(text, TILE, pos, message);
        let tokens = lex::lex(text).map_err(fail)?;
        let sizes = size_scope(&tokens);
        let mut p = Parser { tokens, at: 0 };
        let mut kernels = Vec::new();
        while p.peek().0 != Tok::End {
            kernels
                .push(KernelParser { p: &mut p, sizes: &sizes, kind: KernelKind::Pointwise }.kernel().map_err(fail)?);
        }
        Ok(kernels)
    }
}

struct KernelParser<'a> {
    p: &'a mut Parser,
    /// Every `s<n>` of the text as a size symbol.
    sizes: &'a Scope,
    kind: KernelKind,
}

/// The variables defined so far (`tmp` and `acc`), to check uses.
#[derive(Default)]
struct Defined {
    tmp: HashSet<Var>,
    acc: HashSet<Var>,
}

impl KernelParser<'_> {
    fn kernel(mut self) -> Result<TileKernel, Located> {
        self.p.phrase("@kernel(kind=")?;
        let (kind, pos) = self.p.ident("a kernel kind")?;
        self.kind = KINDS.into_iter().find(|k| k.name() == kind).ok_or((
            pos,
            format!("unknown kernel kind `{kind}` (pointwise, persistent_reduction, looped_reduction)"),
        ))?;
        self.p.expect(')', "after the kind")?;
        self.p.keyword("def")?;
        let (name, _) = self.p.ident("the kernel's name")?;
        self.p.expect('(', "after the kernel's name")?;
        let (mut args, mut sizes, mut random) = (Vec::new(), Vec::new(), Vec::new());
        if !self.p.eat(')') {
            loop {
                let (param, pos) = self.p.ident("a parameter")?;
                self.p.expect(':', "after the parameter's name")?;
                if self.p.eat('*') {
                    args.push(self.arg(param, pos)?);
                } else if self.p.at_word("i64") {
                    self.p.at += 1;
                    sizes.push(
                        *self.sizes.get(&param).ok_or((pos, format!("a size parameter is `s<n>`, not `{param}`")))?,
                    );
                } else {
                    let stream = param.strip_prefix("seed").and_then(|k| k.parse::<usize>().ok());
                    let stream = stream.ok_or((
                        pos,
                        format!("expected a buffer `*dtype`, a size `i64` or a stream `seed<k>: u64`, found `{param}`"),
                    ))?;
                    self.p.phrase(&format!("u64, offset{stream}: u64"))?;
                    random.push(stream);
                }
                if self.p.eat(')') {
                    break;
                }
                self.p.expect(',', "or `)` after a parameter")?;
            }
        }
        self.p.expect(':', "after the parameters")?;
        self.p.phrase("xnumel =")?;
        let xnumel = self.p.expr(self.sizes)?;
        let rnumel = match self.p.at_word("rnumel") {
            true => {
                self.p.phrase("rnumel =")?;
                Some(self.p.expr(self.sizes)?)
            }
            false => None,
        };
        if rnumel.is_none() != (self.kind == KernelKind::Pointwise) {
            return self
                .p
                .expected(&format!("`rnumel = ...` exactly when the kernel is a reduction, not {}", self.kind.name()));
        }
        self.p.phrase("XBLOCK: constexpr =")?;
        let (xblock, _) = self.p.number("the block size")?;
        self.p.phrase("xindex = program_id(0) * XBLOCK + arange(XBLOCK)[:, None] xmask = xindex < xnumel")?;
        let mut rblock = 1;
        if rnumel.is_some() {
            self.p.phrase("RBLOCK: constexpr =")?;
            rblock = self.p.number("the block size")?.0;
            if self.kind == KernelKind::PersistentReduction {
                self.p.phrase("rindex = arange(RBLOCK)[None, :] rmask = rindex < rnumel")?;
            }
        }
        let mut scope = self.sizes.clone();
        scope.extend(index_vars(&[xnumel], "x", |_, e| xindex(e)).into_iter().map(|(_, e)| ("xindex".into(), e)));
        if let Some(r) = &rnumel {
            scope.extend(index_vars(&[*r], "r", |_, e| rindex(e)).into_iter().map(|(_, e)| ("rindex".into(), e)));
        }
        let mut defined = Defined::default();
        let body = self.block(&scope, &mut defined, 0, &args)?;
        Ok(TileKernel { name, kind: self.kind, args, xnumel, rnumel, sizes, random, xblock, rblock, body })
    }

    /// `*f32 (buffer 3)` after `in_ptr0:`.
    fn arg(&mut self, name: String, pos: Pos) -> Result<TileArg, Located> {
        let dtype = self.p.dtype()?;
        self.p.phrase("(buffer")?;
        let (buffer, _) = self.p.number("a buffer id")?;
        self.p.expect(')', "after the buffer id")?;
        let (read, written) = if name.starts_with("in_out_ptr") {
            (true, true)
        } else if name.starts_with("out_ptr") {
            (false, true)
        } else if name.starts_with("in_ptr") {
            (true, false)
        } else {
            return Err((
                pos,
                format!("a buffer argument is `in_ptr<n>`, `out_ptr<n>` or `in_out_ptr<n>`, not `{name}`"),
            ));
        };
        Ok(TileArg { name, buffer: BufferId(buffer), dtype, read, written })
    }

    /// The statements indented deeper than `outer` (a column), all at one column.
    fn block(
        &mut self,
        scope: &Scope,
        defined: &mut Defined,
        outer: usize,
        args: &[TileArg],
    ) -> Result<Vec<TileStmt>, Located> {
        let mut stmts = Vec::new();
        let col = self.p.peek().1.col;
        if col <= outer || self.p.peek().0 == Tok::End {
            return self.p.expected("an indented statement");
        }
        while !matches!(self.p.peek().0, Tok::End | Tok::Punct('@')) && self.p.peek().1.col >= col {
            if self.p.peek().1.col > col {
                return Err((self.p.peek().1, "unexpected indentation".into()));
            }
            stmts.push(self.stmt(scope, defined, col, args)?);
        }
        Ok(stmts)
    }

    fn tmp(&mut self, defined: &Defined) -> Result<Var, Located> {
        let (n, pos) = self.p.numbered("tmp")?;
        match defined.tmp.contains(&n) {
            true => Ok(n),
            false => Err((pos, format!("`tmp{n}` is not defined"))),
        }
    }

    fn acc(&mut self, defined: &Defined) -> Result<Var, Located> {
        let (n, pos) = self.p.numbered("acc")?;
        match defined.acc.contains(&n) {
            true => Ok(n),
            false => Err((pos, format!("accumulator `acc{n}` is not initialized"))),
        }
    }

    /// `in_ptr0`: the argument's position.
    fn arg_ref(&mut self, args: &[TileArg]) -> Result<usize, Located> {
        let (name, pos) = self.p.ident("a buffer argument")?;
        args.iter().position(|a| a.name == name).ok_or((pos, format!("`{name}` is not a buffer argument")))
    }

    /// `: f32[XBLOCK, RBLOCK]`.
    fn typed(&mut self) -> Result<(DType, Dims), Located> {
        self.p.expect(':', "before the block's type")?;
        let dtype = self.p.dtype()?;
        self.p.phrase("[XBLOCK,")?;
        let dims = match self.p.eat_number_one() {
            true => Dims::X,
            false => {
                self.p.phrase("RBLOCK")?;
                Dims::XR
            }
        };
        self.p.expect(']', "after the block shape")?;
        Ok((dtype, dims))
    }

    fn stmt(
        &mut self,
        scope: &Scope,
        defined: &mut Defined,
        col: usize,
        args: &[TileArg],
    ) -> Result<TileStmt, Located> {
        let (word, pos) = match self.p.peek().clone() {
            (Tok::Ident(w), pos) => (w, pos),
            _ => return self.p.expected("a statement"),
        };
        if word == "for" {
            self.p.phrase("for roffset in range(0, rnumel, RBLOCK):")?;
            if self.kind != KernelKind::LoopedReduction {
                return Err((pos, "only a looped reduction loops over the row".into()));
            }
            let body_col = self.p.peek().1.col;
            if body_col <= col {
                return self.p.expected("the loop's indented body");
            }
            self.p.phrase("rindex = roffset + arange(RBLOCK)[None, :]")?;
            if self.p.peek().1.col != body_col {
                return Err((self.p.peek().1, "the loop's lines are indented alike".into()));
            }
            self.p.phrase("rmask = rindex < rnumel")?;
            return Ok(TileStmt::RLoop(self.block(scope, defined, col, args)?));
        }
        if word == "window" {
            self.p.phrase("window(")?;
            let arg = self.arg_ref(args)?;
            self.p.phrase(", offset=")?;
            let offset = self.tmp(defined)?;
            let [stride, size, bound] = self.p.window_tail(scope, "window")?;
            return Ok(TileStmt::Window { arg, offset, stride, size, bound });
        }
        if word == "store" {
            self.p.phrase("store(")?;
            let arg = self.arg_ref(args)?;
            self.p.phrase("+ (")?;
            let index = self.p.expr(scope)?;
            self.p.phrase("),")?;
            let value = self.tmp(defined)?;
            self.p.phrase(", xmask")?;
            let dims = if self.p.eat('&') {
                self.p.phrase("rmask")?;
                Dims::XR
            } else {
                Dims::X
            };
            self.p.expect(')', "to close the store")?;
            return Ok(TileStmt::Store { arg, index, value, dims });
        }
        if word.starts_with("acc") {
            return self.acc_stmt(defined);
        }
        let (var, _) = self.p.numbered("tmp")?;
        if self.p.eat(',') {
            // `tmp1, tmp2: f32[XBLOCK, 1] = online_softmax(acc1, acc2, axis=1)[:, None]`
            let (sum, _) = self.p.numbered("tmp")?;
            let (dtype, dims) = self.typed()?;
            if dims != Dims::X {
                return Err((pos, "a reduction's result is `[XBLOCK, 1]`".into()));
            }
            self.p.phrase(&format!("= online_softmax(acc{var}, acc{sum}, axis=1"))?;
            let finite_shift = self.p.eat(',');
            if finite_shift {
                self.p.phrase("shift=finite")?;
            }
            self.p.phrase(")[:, None]")?;
            for v in [var, sum] {
                if !defined.acc.contains(&v) {
                    return Err((pos, format!("accumulator `acc{v}` is not initialized")));
                }
                defined.tmp.insert(v);
            }
            return Ok(TileStmt::ReduceOnlineSoftmax { max: var, sum, dtype, finite_shift });
        }
        let (dtype, dims) = self.typed()?;
        self.p.expect('=', "after the variable's type")?;
        // A reduction: `amax(tmp3, axis=1)[:, None]`.
        let reduce = match self.p.peek().clone() {
            (Tok::Ident(name), _) if self.p.punct_ahead(1, '(') => {
                op::REDUCE_OPS.into_iter().find(|r| r.name() == name)
            }
            _ => None,
        };
        if let Some(op) = reduce {
            self.p.at += 2;
            let source = match self.kind {
                KernelKind::LoopedReduction => self.acc(defined)?,
                _ => self.tmp(defined)?,
            };
            self.p.phrase(", axis=1)[:, None]")?;
            if dims != Dims::X {
                return Err((pos, "a reduction's result is `[XBLOCK, 1]`".into()));
            }
            defined.tmp.insert(var);
            return Ok(TileStmt::Reduce { var, op, dtype, source });
        }
        let op = self.tile_op(scope, defined, args, dtype)?;
        defined.tmp.insert(var);
        Ok(TileStmt::Let { var, dims, dtype, op })
    }

    /// `acc1 = full(...)`, `acc1 = combine_sum(acc1, tmp0)`,
    /// `acc1, acc2 = combine_online_softmax(acc1, acc2, tmp0)`.
    fn acc_stmt(&mut self, defined: &mut Defined) -> Result<TileStmt, Located> {
        let (acc, pos) = self.p.numbered("acc")?;
        if self.p.eat(',') {
            let (sum, _) = self.p.numbered("acc")?;
            self.p.phrase(&format!("= combine_online_softmax(acc{acc}, acc{sum},"))?;
            let value = self.tmp(defined)?;
            self.p.expect(')', "to close the combine")?;
            for a in [acc, sum] {
                if !defined.acc.contains(&a) {
                    return Err((pos, format!("accumulator `acc{a}` is not initialized")));
                }
            }
            return Ok(TileStmt::AccUpdateOnlineSoftmax { max_acc: acc, sum_acc: sum, value });
        }
        self.p.expect('=', "after the accumulator")?;
        let (f, fpos) = self.p.ident("`full` or `combine_<op>`")?;
        let reduce_of = |name: &str| op::REDUCE_OPS.into_iter().find(|r| r.name() == name);
        if f == "full" {
            self.p.phrase("([XBLOCK, RBLOCK], identity(")?;
            let (name, npos) = self.p.ident("a reduction")?;
            let op = reduce_of(&name).ok_or((npos, format!("unknown reduction `{name}`")))?;
            self.p.phrase("),")?;
            let dtype = self.p.dtype()?;
            self.p.expect(')', "to close `full`")?;
            defined.acc.insert(acc);
            return Ok(TileStmt::AccInit { acc, op, dtype });
        }
        let op: Option<ReduceOp> = f.strip_prefix("combine_").and_then(reduce_of);
        let op = op.ok_or((fpos, format!("expected `full` or `combine_<reduction>`, found `{f}`")))?;
        self.p.phrase(&format!("(acc{acc},"))?;
        if !defined.acc.contains(&acc) {
            return Err((pos, format!("accumulator `acc{acc}` is not initialized")));
        }
        let value = self.tmp(defined)?;
        self.p.expect(')', "to close the combine")?;
        Ok(TileStmt::AccUpdate { acc, op, value })
    }

    /// The right-hand side of a `tmp<n>: dtype[..] =` statement.
    fn tile_op(&mut self, scope: &Scope, defined: &Defined, args: &[TileArg], dtype: DType) -> Result<TileOp, Located> {
        match self.p.peek().0.clone() {
            Tok::Punct('(') => {
                self.p.at += 1;
                let e = self.p.expr(scope)?;
                self.p.expect(')', "to close the index")?;
                return Ok(TileOp::Index(e));
            }
            Tok::Num(_) => return Ok(TileOp::Constant(self.p.scalar()?)),
            Tok::Ident(w) if ["true", "false", "inf", "nan"].contains(&w.as_str()) => {
                return Ok(TileOp::Constant(self.p.scalar()?))
            }
            Tok::Ident(w) if w.starts_with("tmp") && self.p.punct_ahead(1, '.') => {
                let a = self.tmp(defined)?;
                self.p.phrase(&format!(".to({dtype})"))?;
                return Ok(TileOp::Cast(a));
            }
            _ => {}
        }
        let (name, pos) = self.p.ident("an op")?;
        self.p.expect('(', "after the op")?;
        let op = match name.as_str() {
            "load" => {
                let arg = self.arg_ref(args)?;
                self.p.phrase("+ (")?;
                let index = self.p.expr(scope)?;
                self.p.expect(')', "after the index")?;
                if !self.p.eat(',') {
                    TileOp::Load { arg, index }
                } else if self.p.at_word("mask") {
                    self.p.phrase("mask=")?;
                    let mask = self.tmp(defined)?;
                    self.p.phrase(", other=")?;
                    TileOp::MaskedLoad { arg, index, mask, other: self.p.scalar()? }
                } else {
                    self.p.phrase("indirect=")?;
                    let indirect = self.tmp(defined)?;
                    self.p.phrase(", stride=")?;
                    let stride = self.p.expr(scope)?;
                    self.p.phrase(", bound=")?;
                    TileOp::IndirectLoad { arg, index, indirect, stride, bound: self.p.expr(scope)? }
                }
            }
            "rand" | "randn" => {
                let (stream, counter) = random_draw(self.p, scope)?;
                let dist = if name == "rand" { RandDist::Uniform } else { RandDist::Normal };
                TileOp::Rand { dist, stream, counter }
            }
            "where" => {
                let c = self.tmp(defined)?;
                self.p.expect(',', "between operands")?;
                let a = self.tmp(defined)?;
                self.p.expect(',', "between operands")?;
                TileOp::Where(c, a, self.tmp(defined)?)
            }
            _ => match (
                UnaryOp::ALL.into_iter().find(|u| u.name() == name),
                BinaryOp::ALL.into_iter().find(|b| b.name() == name),
            ) {
                (Some(u), _) => TileOp::Unary(u, self.tmp(defined)?),
                (_, Some(b)) => {
                    let a = self.tmp(defined)?;
                    self.p.expect(',', "between operands")?;
                    TileOp::Binary(b, a, self.tmp(defined)?)
                }
                _ => return Err((pos, format!("unknown op `{name}`"))),
            },
        };
        self.p.expect(')', "to close the op")?;
        Ok(op)
    }
}

impl Parser {
    /// Takes the number `1` if it is next.
    fn eat_number_one(&mut self) -> bool {
        let here = self.peek().0 == Tok::Num("1".into());
        if here {
            self.at += 1;
        }
        here
    }
}
