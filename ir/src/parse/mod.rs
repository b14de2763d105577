//! Reading the IR texts back: [`Graph::parse`],
//! [`LoopProgram::parse`](crate::loops::LoopProgram::parse),
//! [`TileKernel::parse`](crate::kernel::TileKernel::parse) and
//! [`Schedule::parse`](crate::kernel::Schedule::parse) are the inverses of their printers (the
//! schedule's text is described in [`schedule`]). One lexer serves them all; `#` and `;` start comments to the end of the line. Errors name
//! the `line:column`, what was expected, and show the line with a caret under the column.
//!
//! # Graph text
//!
//! ```text
//! graph(%0: f32[4, 16], %1: i64[4]) {
//!   %2: f32[4, 1] = amax(%0, dims=[1], keepdim=true)
//!   %3: f32[] = full(value=1.0)
//!   return (%2, %3)
//! }
//! ```
//!
//! * The header declares the graph's inputs, in input order, each with its meta (`dtype[dims]`;
//!   `f32[]` is 0-d).
//! * Each node is `%label[: meta] = op(operands, attributes)`: the operands are labels, the
//!   attributes `key=value` with the values the printer writes (integers, floats as `1.0`,
//!   `1e-5`, `inf`, `nan`; `true` / `false`; names such as `none`, `tanh`, `f32`; lists `[0, 1]`;
//!   pairs `(1, 2)`), every attribute of the op present, in any order. A leaf (`full`, `iota`,
//!   `rand`, `scalar`) must give its meta; any other node may leave it out, and when given it
//!   must be the meta inference computes.
//! * Labels order the nodes: a node's operands have smaller labels. The printer's labels are
//!   the node indices `0..n`, which the parse keeps; other labels (gaps, any order of lines) are
//!   renumbered in label order.
//! * The printer's `# file:line` source locations are comments, so a parsed graph has no
//!   locations (and no decomposition origins, which the text does not carry).
//!
//! ```
//! use coil_ir::Graph;
//! let text = "graph(%0: f32[2, 3]) {\n  %1: f32[2, 3] = exp(%0)\n  return (%1)\n}\n";
//! let g = Graph::parse(text).unwrap();
//! assert_eq!(g.to_string(), text);
//! let e = Graph::parse("graph(%0: f32[2]) {\n  %1 = exp(%0\n  return (%1)\n}").unwrap_err();
//! assert!(e.to_string().contains("3:3: expected `,` or `)`"), "{e}");
//! ```
//!
//! # Loop IR text
//!
//! ```text
//! symbol s0 = arg0.size(1) (hint 7)
//! random stream 0: seed0, offset0
//! buffers: arg0, buf1, buf0            (only when ids are not in order of appearance)
//! inputs: arg0
//!   arg0: f32[4, s0]
//! buf0: f32[4, 1] = reduction sum ranges=[4, 1] reduction_ranges=[s0] origins=[sum]
//!     v0: f32 = load(arg0, r0 + s0*x0)
//!     return v0
//! buf1: f32[4, 4] = extern bmm batch=[] m=4 n=4 k=s0(arg0, arg0) origins=[bmm]
//!     a = view(arg0, offset=0, strides=[s0, 1])
//!     b = view(arg0, offset=0, strides=[1, s0])
//! outputs: buf1
//! data_check buf0: code=1 op=gather dim=0 node=none
//! ```
//!
//! * Buffers are named where they are declared (an input's line, a node's written buffers)
//!   and referred to by name; their ids are the order of the `buffers:` line, or else of
//!   appearance. A buffer's meta is its shape at the symbols' hints.
//! * A body's values are `v0, v1, ...` in order, each with its dtype; the scalar ops are
//!   `load(buf, index)`, `load(buf, index, mask=v, other=scalar)`,
//!   `load(buf, index, indirect=v, stride=e, bound=e)`, `constant(scalar)`, `index(e)`,
//!   `rand(seed<k>, offset<k> + (e))` / `randn(..)`, `where(c, a, b)`, `cast(v)` and the
//!   unary and binary functions by name.
//! * An extern node's header is what [`crate::loops::ExternCall`] prints; the operand lines
//!   under it give every buffer and stride of the call, and the header must agree with them.
//! * Index expressions are written as [`crate::sym::Expr`] prints them. A node's `x<i>` and
//!   `r<i>` take their facts from its ranges; every `s<n>` is a size symbol (at least 2), also
//!   in an instantiated program, which keeps them in its bodies.
//!
//! # Tile IR text
//!
//! The Triton-like text of [`crate::kernel::TileKernel`]'s `Display`: a
//! `@kernel(kind=...)` line, the `def` line with the buffer arguments (each with the loop
//! program's buffer id it points to, `in_ptr0: *f32 (buffer 0)`; `in_ptr` / `out_ptr` /
//! `in_out_ptr` say whether it is read, written or both), size arguments `s<n>: i64` and random
//! streams `seed<k>: u64, offset<k>: u64`; the extents and block sizes; then the statements,
//! each variable with its type (`tmp3: f32[XBLOCK, RBLOCK] = exp(tmp2)`), a looped reduction's
//! passes as indented `for roffset in range(0, rnumel, RBLOCK):` blocks. `xindex` and `rindex`
//! take their facts from `xnumel` and `rnumel`.

mod expr;
mod lex;
mod loops;
mod op;
pub mod schedule;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_text;
mod tile;

use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::graph::{Graph, NodeId, TensorMeta};
use crate::op::Op;
use lex::Tok;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// A place in the text, 1-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pos {
    line: usize,
    col: usize,
}

/// A message about a place in the text.
type Located = (Pos, String);

/// An attribute value as written.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Num(String),
    Ident(String),
    List(Vec<(Value, Pos)>),
    Tuple(Vec<(Value, Pos)>),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |items: &[(Value, Pos)]| items.iter().map(|(v, _)| v.to_string()).collect::<Vec<_>>().join(", ");
        match self {
            Value::Num(s) | Value::Ident(s) => f.write_str(s),
            Value::List(items) => write!(f, "[{}]", join(items)),
            Value::Tuple(items) => write!(f, "({})", join(items)),
        }
    }
}

/// One `key=value` of a node.
#[derive(Clone, Debug)]
struct Attr {
    key: String,
    key_pos: Pos,
    value: Value,
    pos: Pos,
}

/// One node line, before the graph is built.
struct Statement {
    pos: Pos,
    meta: Option<(TensorMeta, Pos)>,
    op: String,
    op_pos: Pos,
    operands: Vec<(usize, Pos)>,
    attrs: Vec<Attr>,
}

/// What a label defines.
enum Definition {
    /// The `k`-th graph input.
    Input(usize, TensorMeta),
    Node(Statement),
}

impl Graph {
    /// Parses the text [`Graph::print`] writes (see [`crate::parse`] for the format). The
    /// result prints as the text did (without its comments), and equals the printed graph up
    /// to source locations and decomposition origins.
    ///
    /// ```
    /// use coil_ir::Graph;
    /// let g = Graph::parse("graph(%0: f32[4]) {\n  %1 = relu(%0)\n  return (%1)\n}").unwrap();
    /// assert_eq!(g.meta(g.outputs[0]).to_string(), "f32[4]");
    /// ```
    pub fn parse(text: &str) -> Result<Graph> {
        let fail = |(pos, message): Located| located_error(text, GRAPH, pos, message);
        let tokens = lex::lex(text).map_err(fail)?;
        let mut parser = Parser { tokens, at: 0 };
        let (defs, outputs) = parser.graph().map_err(fail)?;
        build(defs, outputs).map_err(|(pos, e)| match e {
            Built::Message(message) => located_error(text, GRAPH, pos, message),
            Built::Inference(e) => Error::new(e.kind, located_message(text, GRAPH, pos, &e.to_string())),
        })
    }
}

impl std::str::FromStr for Graph {
    type Err = Error;
    /// [`Graph::parse`].
    fn from_str(text: &str) -> Result<Graph> {
        Graph::parse(text)
    }
}

/// What the errors of [`Graph::parse`] call their text.
const GRAPH: &str = "graph text";

/// `<what> line:col: message`, then the line and a caret under the column.
fn located_message(text: &str, what: &str, pos: Pos, message: &str) -> String {
    let line = text.lines().nth(pos.line - 1).unwrap_or("");
    let caret = " ".repeat(line.chars().take(pos.col - 1).map(|c| if c == '\t' { 4 } else { 1 }).sum());
    format!("{what} {}:{}: {message}\n  {}\n  {caret}^", pos.line, pos.col, line.replace('\t', "    "))
}

fn located_error(text: &str, what: &str, pos: Pos, message: String) -> Error {
    Error::value(located_message(text, what, pos, &message))
}

/// Why building the graph failed.
enum Built {
    Message(String),
    /// Shape and dtype inference rejected a node.
    Inference(Error),
}

struct Parser {
    tokens: Vec<(Tok, Pos)>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> &(Tok, Pos) {
        &self.tokens[self.at]
    }

    fn next(&mut self) -> (Tok, Pos) {
        let t = self.tokens[self.at].clone();
        if t.0 != Tok::End {
            self.at += 1;
        }
        t
    }

    fn expected<T>(&self, what: &str) -> Result<T, Located> {
        let (tok, pos) = self.peek();
        Err((*pos, format!("expected {what}, found {}", tok.describe())))
    }

    /// Takes the punctuation `c` if it is next.
    fn eat(&mut self, c: char) -> bool {
        let here = self.peek().0 == Tok::Punct(c);
        if here {
            self.at += 1;
        }
        here
    }

    fn expect(&mut self, c: char, context: &str) -> Result<Pos, Located> {
        let pos = self.peek().1;
        if self.eat(c) {
            Ok(pos)
        } else {
            self.expected(&format!("`{c}` {context}"))
        }
    }

    fn keyword(&mut self, word: &str) -> Result<(), Located> {
        match self.peek() {
            (Tok::Ident(w), _) if w == word => {
                self.at += 1;
                Ok(())
            }
            _ => self.expected(&format!("`{word}`")),
        }
    }

    fn label(&mut self) -> Result<(usize, Pos), Located> {
        match *self.peek() {
            (Tok::Node(n), pos) => {
                self.at += 1;
                Ok((n, pos))
            }
            _ => self.expected("a node label `%<n>`"),
        }
    }

    /// Whether the next token is the name `word`.
    fn at_word(&self, word: &str) -> bool {
        matches!(&self.peek().0, Tok::Ident(w) if w == word)
    }

    /// Whether the token `k` places ahead is the punctuation `c`.
    fn punct_ahead(&self, k: usize, c: char) -> bool {
        self.tokens.get(self.at + k).is_some_and(|(t, _)| *t == Tok::Punct(c))
    }

    /// A name (`what` says which, for the error).
    fn ident(&mut self, what: &str) -> Result<(String, Pos), Located> {
        match self.peek().clone() {
            (Tok::Ident(w), pos) => {
                self.at += 1;
                Ok((w, pos))
            }
            _ => self.expected(what),
        }
    }

    /// A name that is `prefix` then a number (`v3`, `tmp12`, `acc1`): the number.
    fn numbered(&mut self, prefix: &str) -> Result<(u32, Pos), Located> {
        let (tok, pos) = self.peek();
        let n = match tok {
            Tok::Ident(w) => w.strip_prefix(prefix).filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
            _ => None,
        };
        match n.and_then(|n| n.parse::<u32>().ok()) {
            Some(n) => {
                let pos = *pos;
                self.at += 1;
                Ok((n, pos))
            }
            None => self.expected(&format!("`{prefix}<n>`")),
        }
    }

    /// A number that parses as `T` (integers: no point or exponent).
    fn number<T: std::str::FromStr>(&mut self, what: &str) -> Result<(T, Pos), Located> {
        let (tok, pos) = self.peek();
        let value = match tok {
            Tok::Num(s) if s.bytes().all(|b| b.is_ascii_digit() || b == b'-') => s.parse().ok(),
            _ => None,
        };
        match value {
            Some(v) => {
                let pos = *pos;
                self.at += 1;
                Ok((v, pos))
            }
            None => self.expected(what),
        }
    }

    /// The tokens of `text`, in order (fixed text such as `arange(XBLOCK)[:, None]`).
    fn phrase(&mut self, text: &str) -> Result<(), Located> {
        let want = lex::lex(text).expect("a phrase of the printer lexes");
        for (tok, _) in &want[..want.len() - 1] {
            if self.peek().0 != *tok {
                return self.expected(&format!("{} (in `{text}`)", tok.describe()));
            }
            self.at += 1;
        }
        Ok(())
    }

    /// A dtype name: `f32`.
    fn dtype(&mut self) -> Result<DType, Located> {
        match &self.peek().0 {
            Tok::Ident(w) => match DType::parse(w) {
                Some(dtype) => {
                    self.at += 1;
                    Ok(dtype)
                }
                None => self.expected("a dtype (f32, bf16, i64, bool, ...)"),
            },
            _ => self.expected("a dtype (f32, bf16, i64, bool, ...)"),
        }
    }

    /// A scalar as [`Scalar`]'s `Display` writes it: `true`, `3`, `1.5`, `-inf`, `nan`.
    fn scalar(&mut self) -> Result<Scalar, Located> {
        let (value, pos) = self.value()?;
        op::scalar_of(&value)
            .ok_or((pos, format!("expected a scalar (a bool, an integer or a float), found `{value}`")))
    }

    /// `f32[2, 3]`.
    fn meta(&mut self) -> Result<TensorMeta, Located> {
        let dtype = self.dtype()?;
        self.expect('[', "after the dtype")?;
        let mut shape = Vec::new();
        if !self.eat(']') {
            loop {
                match self.peek().clone() {
                    (Tok::Num(s), _) if s.bytes().all(|b| b.is_ascii_digit()) && s.parse::<usize>().is_ok() => {
                        self.at += 1;
                        shape.push(s.parse().unwrap());
                    }
                    _ => return self.expected("a size (a non-negative integer)"),
                }
                if self.eat(']') {
                    break;
                }
                self.expect(',', "or `]` in the shape")?;
            }
        }
        Ok(TensorMeta::new(shape, dtype))
    }

    /// The whole text: the definitions by label, and the outputs.
    #[allow(clippy::type_complexity)]
    fn graph(&mut self) -> Result<(BTreeMap<usize, (Definition, Pos)>, Vec<(usize, Pos)>), Located> {
        let mut defs = BTreeMap::new();
        let mut define = |label: usize, def: Definition, pos: Pos| match defs.insert(label, (def, pos)) {
            Some(_) => Err((pos, format!("`%{label}` is defined twice"))),
            None => Ok(()),
        };
        self.keyword("graph")?;
        self.expect('(', "after `graph`")?;
        let mut k = 0;
        if !self.eat(')') {
            loop {
                let (label, pos) = self.label()?;
                self.expect(':', "after the input's label")?;
                let meta = self.meta()?;
                define(label, Definition::Input(k, meta), pos)?;
                k += 1;
                if self.eat(')') {
                    break;
                }
                self.expect(',', "or `)` after a graph input")?;
            }
        }
        self.expect('{', "to open the graph's body")?;
        loop {
            match self.peek().clone() {
                (Tok::Ident(w), _) if w == "return" => break,
                (Tok::Node(_), _) => {
                    let (label, statement) = self.statement()?;
                    let pos = statement.pos;
                    define(label, Definition::Node(statement), pos)?;
                }
                _ => return self.expected("a node `%<n>: <meta> = <op>(...)` or `return`"),
            }
        }
        self.keyword("return")?;
        self.expect('(', "after `return`")?;
        let mut outputs = Vec::new();
        if !self.eat(')') {
            loop {
                outputs.push(self.label()?);
                if self.eat(')') {
                    break;
                }
                self.expect(',', "or `)` after an output")?;
            }
        }
        self.expect('}', "to close the graph")?;
        if self.peek().0 != Tok::End {
            return self.expected("the end of the text after the graph");
        }
        Ok((defs, outputs))
    }

    /// `%3: f32[2] = op(%1, %2, key=value)`.
    fn statement(&mut self) -> Result<(usize, Statement), Located> {
        let (label, pos) = self.label()?;
        let meta = match self.eat(':') {
            true => {
                let at = self.peek().1;
                Some((self.meta()?, at))
            }
            false => None,
        };
        self.expect('=', "after the node's label and meta")?;
        let (op, op_pos) = match self.next() {
            (Tok::Ident(name), pos) => (name, pos),
            (tok, pos) => return Err((pos, format!("expected an op name, found {}", tok.describe()))),
        };
        self.expect('(', "after the op name")?;
        let (mut operands, mut attrs) = (Vec::new(), Vec::<Attr>::new());
        if !self.eat(')') {
            loop {
                match self.next() {
                    (Tok::Node(n), p) if attrs.is_empty() => operands.push((n, p)),
                    (Tok::Node(_), p) => return Err((p, "operands come before the attributes".into())),
                    (Tok::Ident(key), p) => {
                        self.expect('=', &format!("after the attribute name `{key}`"))?;
                        if attrs.iter().any(|a| a.key == key) {
                            return Err((p, format!("attribute `{key}` is given twice")));
                        }
                        let (value, pos) = self.value()?;
                        attrs.push(Attr { key, key_pos: p, value, pos });
                    }
                    (tok, p) => {
                        return Err((
                            p,
                            format!("expected an operand `%<n>` or an attribute `key=value`, found {}", tok.describe()),
                        ))
                    }
                }
                if self.eat(')') {
                    break;
                }
                self.expect(',', "or `)`")?;
            }
        }
        Ok((label, Statement { pos, meta, op, op_pos, operands, attrs }))
    }

    /// An attribute value.
    fn value(&mut self) -> Result<(Value, Pos), Located> {
        let (tok, pos) = self.next();
        let value = match tok {
            Tok::Num(s) => Value::Num(s),
            Tok::Ident(s) if s == "inf" || s == "nan" => Value::Num(s),
            Tok::Ident(s) => Value::Ident(s),
            Tok::Punct(open @ ('[' | '(')) => {
                let close = if open == '[' { ']' } else { ')' };
                let mut items = Vec::new();
                if !self.eat(close) {
                    loop {
                        items.push(self.value()?);
                        if self.eat(close) {
                            break;
                        }
                        self.expect(',', &format!("or `{close}`"))?;
                    }
                }
                if open == '[' {
                    Value::List(items)
                } else {
                    Value::Tuple(items)
                }
            }
            tok => return Err((pos, format!("expected a value, found {}", tok.describe()))),
        };
        Ok((value, pos))
    }
}

/// The graph of the parsed definitions, in label order.
fn build(defs: BTreeMap<usize, (Definition, Pos)>, outputs: Vec<(usize, Pos)>) -> Result<Graph, (Pos, Built)> {
    let message = |pos: Pos, m: String| (pos, Built::Message(m));
    let mut g = Graph::new();
    let mut ids: HashMap<usize, NodeId> = HashMap::new();
    let mut inputs = BTreeMap::new();
    for (&label, (def, _)) in &defs {
        let id = match def {
            Definition::Input(k, meta) => {
                inputs.insert(*k, NodeId(g.nodes.len()));
                g.leaf(Op::Input { index: *k }, meta.clone(), None)
            }
            Definition::Node(s) => {
                let op = op::build(&s.op, s.op_pos, s.attrs.clone()).map_err(|(p, m)| message(p, m))?;
                if op.is_leaf() {
                    if let Some((_, p)) = s.operands.first() {
                        return Err(message(*p, format!("`{}` takes no operands", s.op)));
                    }
                    let Some((meta, _)) = &s.meta else {
                        return Err(message(
                            s.pos,
                            format!("a `{}` node needs its meta: `%{label}: f32[2] = ...`", s.op),
                        ));
                    };
                    g.leaf(op, meta.clone(), None)
                } else {
                    let mut operands = Vec::with_capacity(s.operands.len());
                    for &(x, p) in &s.operands {
                        match ids.get(&x) {
                            Some(&id) => operands.push(id),
                            None if defs.contains_key(&x) => {
                                return Err(message(
                                    p,
                                    format!("`%{x}` is an operand of `%{label}`, so its label must be smaller"),
                                ))
                            }
                            None => return Err(message(p, format!("`%{x}` is not defined"))),
                        }
                    }
                    let id = g.push(op, &operands, None).map_err(|e| (s.op_pos, Built::Inference(e)))?;
                    if let Some((meta, p)) = &s.meta {
                        if meta != g.meta(id) {
                            return Err(message(
                                *p,
                                format!("the meta is {meta}, but `{}` gives {}", s.op, g.meta(id)),
                            ));
                        }
                    }
                    id
                }
            }
        };
        ids.insert(label, id);
    }
    g.inputs = inputs.into_values().collect();
    for (label, pos) in outputs {
        let id = ids.get(&label).ok_or_else(|| message(pos, format!("output `%{label}` is not defined")))?;
        g.outputs.push(*id);
    }
    Ok(g)
}
