//! Reading a loop program back from its text: [`LoopProgram::parse`] is the inverse of its
//! `Display` (see [`crate::parse`] for the format).

use super::expr::Scope;
use super::lex::{self, Tok};
use super::{located_error, op, Located, Parser, Pos};
use crate::error::Result;
use crate::graph::TensorMeta;
use crate::loops::{
    appearance_order, range_var, reduction_var, AttentionBackwardCall, AttentionCall, BiasOperand, Body, BufferId,
    ConvCall, DataCheck, ExternCall, LoopBuffer, LoopKind, LoopNode, LoopProgram, ScalarOp, ScatterStore, SizeSymbol,
    StridedOperand, TensorView, Value as LoopValue, ValueId,
};
use crate::op::{BinaryOp, Op, RandDist, UnaryOp};
use crate::sym::Expr;
use indexmap::IndexMap;
use std::collections::{HashMap, HashSet};
use std::sync::{LazyLock, Mutex};

/// What the errors of [`LoopProgram::parse`] call their text.
const LOOPS: &str = "loop text";

impl LoopProgram {
    /// Parses the text the program's `Display` writes (`ir_pre_fusion.txt`; see
    /// [`crate::parse`] for the format). The result equals the printed program and prints as
    /// the text did (without its comments).
    ///
    /// ```
    /// use coil_ir::loops::LoopProgram;
    /// let text = "\
    /// inputs: arg0
    ///   arg0: f32[2, 5]
    /// buf0: f32[2, 1] = reduction amax ranges=[2, 1] reduction_ranges=[5] origins=[amax]
    ///     v0: f32 = load(arg0, r0 + 5*x0)
    ///     return v0
    /// outputs: buf0
    /// ";
    /// let p = LoopProgram::parse(text).unwrap();
    /// assert_eq!(p.to_string(), text);
    /// let e = LoopProgram::parse(&text.replace("r0 + 5*x0", "r1 + 5*x0")).unwrap_err();
    /// assert!(e.to_string().contains("4:26: unknown symbol `r1`"), "{e}");
    /// ```
    pub fn parse(text: &str) -> Result<LoopProgram> {
        let fail = |(pos, message): Located| located_error(text, LOOPS, pos, message);
        let tokens = lex::lex(text).map_err(fail)?;
        let scope = size_scope(&tokens);
        let mut parser = Parser { tokens, at: 0 };
        ProgramParser {
            p: &mut parser,
            scope,
            ids: IndexMap::new(),
            listed: false,
            hints: IndexMap::new(),
            program: LoopProgram::default(),
        }
        .program()
        .map_err(fail)
    }
}

/// Every name `s<n>` of the text as a size symbol ([`Expr::size`]): the `symbol` lines
/// declare them, but an instantiated program has no `symbol` lines and keeps them in its bodies.
pub(super) fn size_scope(tokens: &[(Tok, Pos)]) -> Scope {
    let mut scope = Scope::new();
    for (tok, _) in tokens {
        if let Tok::Ident(w) = tok {
            if w.len() > 1 && w.starts_with('s') && w[1..].bytes().all(|b| b.is_ascii_digit()) {
                scope.entry(w.clone()).or_insert_with(|| Expr::size(w));
            }
        }
    }
    scope
}

/// The index variables `<prefix><i>` of `ranges` (a range of no elements has none: nothing
/// can index it).
pub(super) fn index_vars(ranges: &[Expr], prefix: &str, var: fn(usize, &Expr) -> Expr) -> Vec<(String, Expr)> {
    let empty = |e: &Expr| e.const_value().is_some_and(|n| n < 1);
    ranges.iter().enumerate().filter(|(_, e)| !empty(e)).map(|(i, e)| (format!("{prefix}{i}"), var(i, e))).collect()
}

/// `name` as a `&'static str` (op names of origins and data checks), each distinct name
/// allocated once per process.
pub(super) fn static_name(name: &str) -> &'static str {
    static NAMES: LazyLock<Mutex<HashSet<&'static str>>> = LazyLock::new(Default::default);
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    match names.get(name) {
        Some(s) => s,
        None => {
            let s: &'static str = Box::leak(name.to_string().into_boxed_str());
            names.insert(s);
            s
        }
    }
}

/// A value of an extern node's operand line.
enum Operand {
    /// `view(buf, offset=e, strides=[...])`, with `shape=[...]` for a convolution.
    View { buffer: BufferId, offset: Expr, strides: Vec<Expr>, shape: Option<Vec<usize>> },
    /// `buf`.
    Buffer(BufferId),
    /// `[1, 2]`.
    List(Vec<usize>),
}

/// What an extern header says, beyond what the operand lines give.
#[derive(Default)]
struct Header {
    kind: String,
    op: Option<Op>,
    flags: Vec<String>,
    exprs: HashMap<String, Expr>,
    lists: HashMap<String, Vec<Expr>>,
    scale: Option<f64>,
    /// `dropout_p=`: an attention call's dropout probability.
    dropout_p: Option<f64>,
    /// `mask_rule=key<=offset+C+row%P`: whether there is an offset buffer, C and P.
    mask_rule: Option<(bool, i64, Option<usize>)>,
}

struct ProgramParser<'a> {
    p: &'a mut Parser,
    /// The size symbols.
    scope: Scope,
    /// Buffer ids by name, with the buffer once its type is known.
    ids: IndexMap<String, Option<LoopBuffer>>,
    /// Whether a `buffers:` line fixed the ids.
    listed: bool,
    /// The size symbols' hints, from the `symbol` lines.
    hints: IndexMap<Expr, i64>,
    program: LoopProgram,
}

impl ProgramParser<'_> {
    fn program(mut self) -> Result<LoopProgram, Located> {
        let mut symbols = Vec::new();
        while self.p.at_word("symbol") {
            self.p.at += 1;
            let (name, pos) = self.p.ident("a symbol name")?;
            self.p.expect('=', "after the symbol")?;
            let input = self.p.ident("an input buffer")?;
            self.p.phrase(".size(")?;
            let (dim, _) = self.p.number("a dim")?;
            self.p.phrase(") (hint")?;
            let (hint, _) = self.p.number("the symbol's hint")?;
            self.p.expect(')', "after the hint")?;
            let symbol =
                self.scope.get(&name).copied().ok_or((pos, format!("a size symbol is `s<n>`, not `{name}`")))?;
            self.hints.insert(symbol, hint);
            symbols.push((symbol, input, dim, hint));
        }
        let mut streams = Vec::new();
        while self.p.at_word("random") {
            let pos = self.p.peek().1;
            self.p.phrase("random stream")?;
            let (k, _) = self.p.number::<usize>("a stream number")?;
            self.p.phrase(&format!(": seed{k}, offset{k}"))?;
            streams.push((k, pos));
        }
        if self.p.at_word("buffers") {
            self.buffers_line()?;
        }
        let line = self.p.peek().1.line;
        self.p.keyword("inputs")?;
        self.p.expect(':', "after `inputs`")?;
        let mut inputs = Vec::new();
        while self.p.peek().1.line == line && matches!(self.p.peek().0, Tok::Ident(_)) {
            inputs.push(self.p.ident("an input buffer")?);
            if !self.p.eat(',') {
                break;
            }
        }
        for (name, _) in &inputs {
            let (decl, pos) = self.p.ident(&format!("the type line of input `{name}`"))?;
            if decl != *name {
                return Err((pos, format!("expected the type line of input `{name}`, found `{decl}`")));
            }
            self.p.expect(':', "after the input's name")?;
            let id = self.typed(decl, pos)?;
            self.program.inputs.push(id);
        }
        for (symbol, (input, ipos), dim, hint) in symbols {
            let input =
                inputs.iter().position(|(n, _)| *n == input).ok_or((ipos, format!("`{input}` is not an input")))?;
            self.program.symbols.push(SizeSymbol { symbol, input, dim, hint });
        }
        while !self.p.at_word("outputs") {
            self.node()?;
        }
        let line = self.p.peek().1.line;
        self.p.keyword("outputs")?;
        self.p.expect(':', "after `outputs`")?;
        while self.p.peek().1.line == line && matches!(self.p.peek().0, Tok::Ident(_)) {
            let b = self.buffer()?;
            self.program.outputs.push(b);
            if !self.p.eat(',') {
                break;
            }
        }
        while self.p.at_word("data_check") {
            self.p.at += 1;
            let buffer = self.buffer()?;
            self.p.phrase(": code=")?;
            let (code, _) = self.p.number("a status code")?;
            self.p.phrase("op=")?;
            let (op, _) = self.p.ident("an op name")?;
            self.p.phrase("dim=")?;
            let dim = self.optional_number()?;
            self.p.phrase("node=")?;
            let node = self.optional_number()?;
            self.program.data_checks.push(DataCheck { buffer, code, op: static_name(&op), dim, node });
        }
        if self.p.peek().0 != Tok::End {
            return self.p.expected("`data_check` or the end of the text");
        }
        self.finish(streams)
    }

    /// The buffers in order, each typed; the checks a program's text cannot express.
    fn finish(mut self, streams: Vec<(usize, Pos)>) -> Result<LoopProgram, Located> {
        let end = self.p.peek().1;
        for (name, buffer) in std::mem::take(&mut self.ids) {
            let buffer = buffer.ok_or((end, format!("buffer `{name}` is listed but has no type")))?;
            self.program.buffers.push(buffer);
        }
        let p = self.program;
        if let Some(&(k, pos)) = streams.iter().enumerate().find(|(i, (k, _))| i != k).map(|(_, s)| s) {
            return Err((pos, format!("random stream {k} out of order")));
        }
        if streams.len() != p.random_streams() {
            let pos = streams.first().map_or(end, |s| s.1);
            return Err((
                pos,
                format!("the bodies draw from {} random streams, the text lists {}", p.random_streams(), streams.len()),
            ));
        }
        if !self.listed && appearance_order(&p).iter().enumerate().any(|(i, b)| b.0 != i) {
            return Err((end, "buffers are not in order of appearance: the text needs a `buffers:` line".into()));
        }
        Ok(p)
    }

    /// `buffers: arg0, buf1, buf0_partial: f32[4]`: the ids, and the types of buffers no other
    /// line declares.
    fn buffers_line(&mut self) -> Result<(), Located> {
        let line = self.p.peek().1.line;
        self.p.at += 1;
        self.p.expect(':', "after `buffers`")?;
        self.listed = true;
        while self.p.peek().1.line == line && matches!(self.p.peek().0, Tok::Ident(_)) {
            let (name, pos) = self.p.ident("a buffer name")?;
            if self.ids.insert(name.clone(), None).is_some() {
                return Err((pos, format!("buffer `{name}` is listed twice")));
            }
            if self.p.eat(':') {
                self.typed(name, pos)?;
            }
            if !self.p.eat(',') {
                break;
            }
        }
        Ok(())
    }

    /// `f32[s0, 4]` after `name:`: declares the buffer; its id.
    fn typed(&mut self, name: String, pos: Pos) -> Result<BufferId, Located> {
        let dtype = self.p.dtype()?;
        let shape = self.p.expr_list(&self.scope)?;
        let dims: Vec<usize> = shape.iter().map(|e| e.eval(&self.hints).map_or(0, |v| v.max(0) as usize)).collect();
        let buffer = LoopBuffer { name: name.clone(), meta: TensorMeta::new(dims, dtype), shape };
        if !self.listed && self.ids.contains_key(&name) {
            return Err((pos, format!("buffer `{name}` is declared twice")));
        }
        match self.ids.get_mut(&name) {
            None if self.listed => Err((pos, format!("buffer `{name}` is not in the `buffers:` line"))),
            Some(Some(_)) => Err((pos, format!("buffer `{name}` is declared twice"))),
            _ => {
                let (id, _) = self.ids.insert_full(name, Some(buffer));
                Ok(BufferId(id))
            }
        }
    }

    /// A declared buffer's id.
    fn buffer(&mut self) -> Result<BufferId, Located> {
        let (name, pos) = self.p.ident("a buffer name")?;
        self.ids.get_index_of(&name).map(BufferId).ok_or((pos, format!("buffer `{name}` is not declared")))
    }

    fn optional_number(&mut self) -> Result<Option<usize>, Located> {
        if self.p.at_word("none") {
            self.p.at += 1;
            return Ok(None);
        }
        Ok(Some(self.p.number("a non-negative integer or `none`")?.0))
    }

    /// `[amax, exp]`.
    fn origins(&mut self) -> Result<Vec<&'static str>, Located> {
        self.p.phrase("origins=[")?;
        let mut out = Vec::new();
        if !self.p.eat(']') {
            loop {
                out.push(static_name(&self.p.ident("an op name")?.0));
                if self.p.eat(']') {
                    break;
                }
                self.p.expect(',', "or `]` in the origins")?;
            }
        }
        Ok(out)
    }

    /// One node: its line, then its body or its operand lines.
    fn node(&mut self) -> Result<(), Located> {
        let mut written = Vec::new();
        loop {
            let (name, pos) = self.p.ident("a node `buf: f32[..] = ...` or `outputs:`")?;
            self.p.expect(':', "after the buffer's name")?;
            written.push((self.typed(name, pos)?, pos));
            if !self.p.eat(',') {
                break;
            }
        }
        self.p.expect('=', "after the written buffers")?;
        let (what, pos) = self.p.ident("`pointwise`, `reduction` or `extern`")?;
        let output = written[0].0;
        let node = match what.as_str() {
            "pointwise" | "reduction" => {
                let op = match what.as_str() {
                    "reduction" => {
                        let (name, pos) = self.p.ident("a reduction")?;
                        Some(
                            op::REDUCE_OPS
                                .into_iter()
                                .find(|r| r.name() == name)
                                .ok_or((pos, format!("unknown reduction `{name}`")))?,
                        )
                    }
                    _ => None,
                };
                self.p.phrase("ranges=")?;
                let ranges = self.p.expr_list(&self.scope)?;
                let reduction_ranges = match op {
                    Some(_) => {
                        self.p.phrase("reduction_ranges=")?;
                        self.p.expr_list(&self.scope)?
                    }
                    None => vec![],
                };
                let origins = self.origins()?;
                let mut scope = self.scope.clone();
                scope.extend(index_vars(&ranges, "x", range_var));
                scope.extend(index_vars(&reduction_ranges, "r", reduction_var));
                let body = self.body(&scope)?;
                let kind = match op {
                    Some(op) => LoopKind::Reduction { ranges, reduction_ranges, op, body },
                    None => {
                        let scatter = self.scatter_store(&scope, &body)?;
                        LoopKind::Pointwise { ranges, body, scatter }
                    }
                };
                LoopNode { output, origins, kind }
            }
            "extern" => {
                let (call, inputs, origins) = self.extern_call()?;
                LoopNode { output, origins, kind: LoopKind::Extern { call, inputs } }
            }
            _ => return Err((pos, format!("expected `pointwise`, `reduction` or `extern`, found `{what}`"))),
        };
        if written.len() > 1 && node.writes() != written.iter().map(|w| w.0).collect::<Vec<_>>() {
            return Err((written[1].1, "the node writes other buffers than the line names".into()));
        }
        self.program.nodes.push(node);
        Ok(())
    }

    /// `v0: f32 = load(arg0, x0)` lines, then `return v<n>`.
    fn body(&mut self, scope: &Scope) -> Result<Body, Located> {
        let mut body = Body::default();
        while !self.p.at_word("return") {
            let (n, pos) = self.p.numbered("v")?;
            if n as usize != body.values.len() {
                return Err((pos, format!("expected `v{}` (values are numbered in order)", body.values.len())));
            }
            self.p.expect(':', "after the value")?;
            let dtype = self.p.dtype()?;
            self.p.expect('=', "after the value's dtype")?;
            let op = self.scalar_op(scope, n)?;
            body.values.push(LoopValue { op, dtype });
        }
        self.p.at += 1;
        body.result = self.value_ref(body.values.len() as u32)?;
        Ok(body)
    }

    /// `scatter(base=arg0, index=.., offset=v1, stride=.., size=.., bound=..)` after a
    /// pointwise body, if the line is there.
    fn scatter_store(&mut self, scope: &Scope, body: &Body) -> Result<Option<ScatterStore>, Located> {
        if !self.p.at_word("scatter") {
            return Ok(None);
        }
        self.p.phrase("scatter(base=")?;
        let base = self.buffer()?;
        self.p.phrase(", index=")?;
        let index = self.p.expr(scope)?;
        self.p.phrase(", offset=")?;
        let offset = self.value_ref(body.values.len() as u32)?;
        let [stride, size, bound] = self.p.window_tail(scope, "scatter")?;
        Ok(Some(ScatterStore { base, index, offset, stride, size, bound }))
    }

    /// `v<n>`, an earlier value than `before`.
    fn value_ref(&mut self, before: u32) -> Result<ValueId, Located> {
        let (n, pos) = self.p.numbered("v")?;
        if n >= before {
            return Err((pos, format!("`v{n}` is not defined before this use")));
        }
        Ok(ValueId(n))
    }

    /// The right-hand side of value `n`.
    fn scalar_op(&mut self, scope: &Scope, n: u32) -> Result<ScalarOp, Located> {
        let (name, pos) = self.p.ident("an op")?;
        self.p.expect('(', "after the op")?;
        let op = match name.as_str() {
            "load" => {
                let buffer = self.buffer()?;
                self.p.expect(',', "after the buffer")?;
                let index = self.p.expr(scope)?;
                if self.p.eat(',') {
                    if self.p.at_word("mask") {
                        self.p.phrase("mask=")?;
                        let mask = self.value_ref(n)?;
                        self.p.phrase(", other=")?;
                        ScalarOp::MaskedLoad { buffer, index, mask, other: self.p.scalar()? }
                    } else {
                        self.p.phrase("indirect=")?;
                        let indirect = self.value_ref(n)?;
                        self.p.phrase(", stride=")?;
                        let stride = self.p.expr(scope)?;
                        self.p.phrase(", bound=")?;
                        ScalarOp::IndirectLoad { buffer, index, indirect, stride, bound: self.p.expr(scope)? }
                    }
                } else {
                    ScalarOp::Load { buffer, index }
                }
            }
            "constant" => ScalarOp::Constant(self.p.scalar()?),
            "index" => ScalarOp::Index(self.p.expr(scope)?),
            "rand" | "randn" => {
                let (stream, counter) = random_draw(self.p, scope)?;
                let dist = if name == "rand" { RandDist::Uniform } else { RandDist::Normal };
                ScalarOp::Rand { dist, stream, counter }
            }
            "where" => {
                let c = self.value_ref(n)?;
                self.p.expect(',', "between operands")?;
                let a = self.value_ref(n)?;
                self.p.expect(',', "between operands")?;
                ScalarOp::Where(c, a, self.value_ref(n)?)
            }
            "cast" => ScalarOp::Cast(self.value_ref(n)?),
            _ => match (
                UnaryOp::ALL.into_iter().find(|u| u.name() == name),
                BinaryOp::ALL.into_iter().find(|b| b.name() == name),
            ) {
                (Some(u), _) => ScalarOp::Unary(u, self.value_ref(n)?),
                (_, Some(b)) => {
                    let a = self.value_ref(n)?;
                    self.p.expect(',', "between operands")?;
                    ScalarOp::Binary(b, a, self.value_ref(n)?)
                }
                _ => return Err((pos, format!("unknown scalar op `{name}`"))),
            },
        };
        self.p.expect(')', "to close the op")?;
        Ok(op)
    }

    /// After `extern`: the header, `(inputs)`, `origins=[...]`, then the operand lines.
    fn extern_call(&mut self) -> Result<(ExternCall, Vec<BufferId>, Vec<&'static str>), Located> {
        // The inputs' `(` is the one matching the `)` before `origins=`.
        let start = self.p.at;
        let origins_at = (start..self.p.tokens.len())
            .find(|&i| {
                matches!(&self.p.tokens[i].0, Tok::Ident(w) if w == "origins")
                    && self.p.tokens.get(i + 1).is_some_and(|t| t.0 == Tok::Punct('='))
            })
            .ok_or((self.p.peek().1, "expected `(inputs) origins=[...]` after the extern call".to_string()))?;
        let mut depth = 0;
        let open = (start..origins_at)
            .rev()
            .find(|&i| {
                match self.p.tokens[i].0 {
                    Tok::Punct(')') => depth += 1,
                    Tok::Punct('(') => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .filter(|&i| self.p.tokens[i].0 == Tok::Punct('('))
            .ok_or((self.p.tokens[origins_at].1, "expected `(inputs)` before `origins=`".to_string()))?;
        let mut header_tokens = self.p.tokens[start..open].to_vec();
        header_tokens.push((Tok::End, self.p.tokens[open].1));
        let header = self.header(Parser { tokens: header_tokens.clone(), at: 0 })?;
        self.p.at = open + 1;
        let mut inputs = Vec::new();
        if !self.p.eat(')') {
            loop {
                inputs.push(self.buffer()?);
                if self.p.eat(')') {
                    break;
                }
                self.p.expect(',', "or `)` after an input")?;
            }
        }
        let origins = self.origins()?;
        let mut operands = HashMap::new();
        while matches!(self.p.peek().0, Tok::Ident(_)) && self.p.punct_ahead(1, '=') {
            let (key, pos) = self.p.ident("an operand")?;
            self.p.expect('=', "after the operand's name")?;
            let value = self.operand()?;
            if operands.insert(key.clone(), (value, pos)).is_some() {
                return Err((pos, format!("operand `{key}` is given twice")));
            }
        }
        let pos = header_tokens[0].1;
        let call = build_call(header, operands, pos)?;
        // The header repeats layouts the operand lines give: it must be as the call prints.
        let printed = lex::lex(&call.to_string()).expect("a printed call lexes");
        let same = printed.len() == header_tokens.len() && printed.iter().zip(&header_tokens).all(|(a, b)| a.0 == b.0);
        if !same {
            return Err((pos, format!("the call's header does not agree with its operand lines, which give `{call}`")));
        }
        Ok((call, inputs, origins))
    }

    /// The value of an operand line.
    fn operand(&mut self) -> Result<Operand, Located> {
        if self.p.at_word("view") && self.p.punct_ahead(1, '(') {
            self.p.at += 2;
            let buffer = self.buffer()?;
            self.p.phrase(", offset=")?;
            let offset = self.p.expr(&self.scope)?;
            self.p.phrase(", strides=")?;
            let strides = self.p.expr_list(&self.scope)?;
            let shape = match self.p.eat(',') {
                true => {
                    self.p.phrase("shape=")?;
                    Some(self.p.usize_list()?)
                }
                false => None,
            };
            self.p.expect(')', "to close the view")?;
            return Ok(Operand::View { buffer, offset, strides, shape });
        }
        if self.p.peek().0 == Tok::Punct('[') {
            return Ok(Operand::List(self.p.usize_list()?));
        }
        Ok(Operand::Buffer(self.buffer()?))
    }

    /// The header of an extern call: `bmm +bias batch=[] m=6 n=5 k=4`, `fallback cumsum[dim=1]`,
    /// `attention causal scale=0.5 batch=[2] l=4 s=4 d=8 out=[..]`, ...
    fn header(&self, mut h: Parser) -> Result<Header, Located> {
        let mut header = Header::default();
        let (kind, pos) = h.ident("an extern call (bmm, attention, attention_backward, fallback, convolution)")?;
        if kind == "fallback" || kind.starts_with("convolution") {
            let (name, pos) = if kind == "fallback" { h.ident("an op")? } else { (kind.clone(), pos) };
            let mut attrs = Vec::new();
            if h.eat('[') && !h.eat(']') {
                loop {
                    let (key, key_pos) = h.ident("an attribute")?;
                    h.expect('=', "after the attribute name")?;
                    let (value, pos) = h.value()?;
                    attrs.push(super::Attr { key, key_pos, value, pos });
                    if h.eat(']') {
                        break;
                    }
                    h.expect(',', "or `]` after an attribute")?;
                }
            }
            header.op = Some(op::build(&name, pos, attrs)?);
        }
        header.kind = kind;
        while h.peek().0 != Tok::End {
            if h.eat('+') {
                header.flags.push(format!("+{}", h.ident("an epilogue (`+bias`, `+gelu_tanh`)")?.0));
                continue;
            }
            let (key, pos) = h.ident("a flag or `key=value`")?;
            if !h.eat('=') {
                header.flags.push(key);
                continue;
            }
            match key.as_str() {
                "scale" | "dropout_p" => {
                    let (value, pos) = h.value()?;
                    let number = match &value {
                        super::Value::Num(s) => {
                            s.parse().map_err(|_| (pos, format!("expected a number, found `{s}`")))?
                        }
                        _ => return Err((pos, format!("expected a number, found `{value}`"))),
                    };
                    *(if key == "scale" { &mut header.scale } else { &mut header.dropout_p }) = Some(number);
                }
                "grads" => {
                    h.value()?;
                }
                "mask_rule" => header.mask_rule = Some(mask_rule(&mut h)?),
                _ if h.peek().0 == Tok::Punct('[') => {
                    header.lists.insert(key, h.expr_list(&self.scope)?);
                    // A layout's offset: `out=[8, 1]+16`.
                    if h.eat('+') || matches!(&h.peek().0, Tok::Num(s) if s.starts_with('+')) {
                        h.expr(&self.scope)?;
                    }
                }
                _ => {
                    if header.exprs.insert(key.clone(), h.expr(&self.scope)?).is_some() {
                        return Err((pos, format!("`{key}` is given twice")));
                    }
                }
            }
        }
        Ok(header)
    }
}

/// A structured mask's rule after `mask_rule=`, as [`crate::loops::MaskRule`] displays it:
/// `key<=offset+row%12`, `key<=offset-1+row`, `key<=3+row%1`: whether it has an offset buffer,
/// the constant and the period.
fn mask_rule(p: &mut Parser) -> Result<(bool, i64, Option<usize>), Located> {
    p.phrase("key <=")?;
    let offset = p.at_word("offset");
    let signed = |p: &mut Parser| match p.peek().clone() {
        (Tok::Num(s), pos) if s.starts_with('+') => {
            p.next();
            s[1..].parse().map_err(|_| (pos, format!("expected an integer, found `{s}`")))
        }
        _ => p.number::<i64>("an integer").map(|(v, _)| v),
    };
    let constant = if offset {
        p.next();
        if matches!(&p.peek().0, Tok::Num(_)) {
            signed(p)?
        } else {
            0
        }
    } else {
        signed(p)?
    };
    p.phrase("+ row")?;
    // `%12` lexes as a node label.
    let period = match p.peek().0 {
        Tok::Node(period) => {
            p.next();
            Some(period)
        }
        _ => None,
    };
    Ok((offset, constant, period))
}

/// `seed<k>, offset<k> + (counter))` of a random draw, after its `(`: the stream and counter.
pub(super) fn random_draw(p: &mut Parser, scope: &Scope) -> Result<(usize, Expr), Located> {
    let (seed, pos) = p.ident("`seed<k>`")?;
    let stream: usize = seed
        .strip_prefix("seed")
        .and_then(|k| k.parse().ok())
        .ok_or((pos, format!("expected the stream's key `seed<k>`, found `{seed}`")))?;
    p.phrase(&format!(", offset{stream} + ("))?;
    let counter = p.expr(scope)?;
    p.expect(')', "after the counter")?;
    Ok((stream, counter))
}

/// The call an extern node's header and operand lines describe.
fn build_call(mut h: Header, mut operands: HashMap<String, (Operand, Pos)>, pos: Pos) -> Result<ExternCall, Located> {
    let mut take = |key: &str| operands.remove(key);
    let need = |o: Option<(Operand, Pos)>, key: &str| {
        o.ok_or((pos, format!("the `{}` call needs an operand line `{key} = ...`", h.kind)))
    };
    let strided = |o: (Operand, Pos), batch: usize| match o {
        (Operand::View { buffer, offset, strides, shape: None }, _) if strides.len() == batch + 2 => {
            Ok(StridedOperand {
                buffer,
                offset,
                batch_strides: strides[..batch].to_vec(),
                row_stride: strides[batch],
                col_stride: strides[batch + 1],
            })
        }
        (_, p) => Err((p, format!("expected `view(buffer, offset=.., strides=[..])` with {} strides", batch + 2))),
    };
    let buffer = |o: (Operand, Pos)| match o {
        (Operand::Buffer(b), _) => Ok(b),
        (_, p) => Err((p, "expected a buffer name".to_string())),
    };
    let mut size = |key: &str| h.exprs.remove(key).ok_or((pos, format!("the header needs `{key}=`")));
    let batch = h.lists.get("batch").cloned();
    let call = match h.kind.as_str() {
        "bmm" => {
            let batch = batch.ok_or((pos, "the header needs `batch=`".to_string()))?;
            let (m, n, k) = (size("m")?, size("n")?, size("k")?);
            let a = strided(need(take("a"), "a")?, batch.len())?;
            let b = strided(need(take("b"), "b")?, batch.len())?;
            let bias = match take("bias") {
                Some((Operand::View { buffer, offset, strides, shape: None }, _)) if strides.len() == 1 => {
                    Some(BiasOperand { buffer, offset, stride: strides[0] })
                }
                Some((_, p)) => return Err((p, "expected `view(buffer, offset=.., strides=[stride])`".into())),
                None => None,
            };
            let (mut activation, mut activation_grad) = (None, None);
            for f in h.flags.iter().filter(|f| *f != "+bias") {
                match f.as_str() {
                    "+gelu_tanh" => activation = Some(crate::loops::Activation::GeluTanh),
                    "+gelu_tanh_grad" => {
                        let aux = buffer(need(take("aux"), "aux")?)?;
                        let activation = crate::loops::Activation::GeluTanh;
                        activation_grad = Some(crate::loops::ActivationGrad { activation, aux });
                    }
                    _ => return Err((pos, format!("unknown flag `{f}` of `bmm`"))),
                }
            }
            let saved = take("saved").map(buffer).transpose()?;
            ExternCall::Bmm { a, b, bias, activation, activation_grad, saved, batch, m, n, k }
        }
        "attention" | "attention_backward" => {
            let batch = batch.ok_or((pos, "the header needs `batch=`".to_string()))?;
            let (l, s, d) = (size("l")?, size("s")?, size("d")?);
            let scale = h.scale.ok_or((pos, "the header needs `scale=`".to_string()))?;
            let causal = h.flags.iter().any(|f| f == "causal");
            let dropout = match h.dropout_p {
                Some(p) => {
                    let mut number = |key: &str| {
                        size(key)?.const_value().ok_or((pos, format!("`{key}=` must be an integer constant")))
                    };
                    let (stream, offset) = (number("dropout_stream")?, number("dropout_offset")?);
                    let stream = usize::try_from(stream).map_err(|_| (pos, "a negative dropout stream".to_string()))?;
                    Some(crate::op::AttentionDropout { p, stream, offset: offset as u64 })
                }
                None => None,
            };
            let nb = batch.len();
            let (q, k, v) = (
                strided(need(take("q"), "q")?, nb)?,
                strided(need(take("k"), "k")?, nb)?,
                strided(need(take("v"), "v")?, nb)?,
            );
            if h.kind == "attention" {
                let out = strided(need(take("out"), "out")?, nb)?;
                let lse = take("lse").map(buffer).transpose()?;
                let mask = take("mask").map(|o| strided(o, nb)).transpose()?;
                let mask_rule = match h.mask_rule {
                    Some((with_offset, constant, period)) => {
                        let offset = match with_offset {
                            true => Some(buffer(need(take("mask_offset"), "mask_offset")?)?),
                            false => None,
                        };
                        Some(crate::loops::MaskRule { offset, constant, period })
                    }
                    None => None,
                };
                ExternCall::Attention(Box::new(AttentionCall {
                    q,
                    k,
                    v,
                    out,
                    lse,
                    batch,
                    l,
                    s,
                    d,
                    causal,
                    scale,
                    mask,
                    mask_rule,
                    dropout,
                }))
            } else {
                let grad_out = strided(need(take("grad_out"), "grad_out")?, nb)?;
                let lse = buffer(need(take("lse"), "lse")?)?;
                let out = strided(need(take("out"), "out")?, nb)?;
                let dq = take("dq").map(|o| strided(o, nb)).transpose()?;
                let dk = take("dk").map(|o| strided(o, nb)).transpose()?;
                let dv = take("dv").map(|o| strided(o, nb)).transpose()?;
                let mask = take("mask").map(|o| strided(o, nb)).transpose()?;
                ExternCall::AttentionBackward(Box::new(AttentionBackwardCall {
                    q,
                    k,
                    v,
                    grad_out,
                    lse,
                    out,
                    dq,
                    dk,
                    dv,
                    batch,
                    l,
                    s,
                    d,
                    causal,
                    scale,
                    mask,
                    dropout,
                }))
            }
        }
        "fallback" => ExternCall::Fallback { op: h.op.take().expect("the header read the op") },
        _ if h.kind.starts_with("convolution") => {
            let Some(Op::Conv { geometry, form }) = h.op.take() else { unreachable!("a convolution header") };
            let view = |o: (Operand, Pos)| match o {
                (Operand::View { buffer, offset, strides, shape: Some(shape) }, p) => {
                    let usize_of = |e: &Expr| {
                        crate::loops::const_usize(e).ok_or((p, format!("a convolution's view is constant, not `{e}`")))
                    };
                    Ok(TensorView {
                        buffer,
                        offset: usize_of(&offset)?,
                        strides: strides.iter().map(usize_of).collect::<Result<_, _>>()?,
                        shape,
                    })
                }
                (_, p) => Err((p, "expected `view(buffer, offset=.., strides=[..], shape=[..])`".to_string())),
            };
            let (a, b) = (view(need(take("a"), "a")?)?, view(need(take("b"), "b")?)?);
            let out_strides = match need(take("out_strides"), "out_strides")? {
                (Operand::List(v), _) => v,
                (_, p) => return Err((p, "expected a list of strides".into())),
            };
            let out = h.lists.get("out").ok_or((pos, "the header needs `out=`".to_string()))?;
            let out = out
                .iter()
                .map(|e| crate::loops::const_usize(e).ok_or((pos, format!("a size of `out` is `{e}`"))))
                .collect::<Result<_, _>>()?;
            ExternCall::Conv(Box::new(ConvCall { geometry, form, a, b, out, out_strides }))
        }
        kind => return Err((pos, format!("unknown extern call `{kind}`"))),
    };
    if let Some((key, (_, p))) = operands.into_iter().min_by_key(|(_, (_, p))| (p.line, p.col)) {
        return Err((p, format!("`{}` takes no operand `{key}`", call.kind_name())));
    }
    Ok(call)
}
