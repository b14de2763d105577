//! The tokens of the IR texts (graph, loop IR, tile IR, schedule), each with its `line:column`.

use super::Pos;

/// One token.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    /// `%12`: a node label.
    Node(usize),
    /// A name: `graph`, `exp`, `keepdim`, `f32`, `true`, `none`, `tanh`, and the unsigned
    /// `inf` and `nan` (which may also name an attribute).
    Ident(String),
    /// A number as written: `3`, `-1`, `1.0`, `1e-5`, `-inf`.
    Num(String),
    /// One of `( ) [ ] { } , : =`, or an operator character of index expressions and the tile
    /// text: `+ - * / % < & . @` (a `+` or `-` before a digit, `inf` or `nan` is a number's
    /// sign, and `%` before a digit a node label).
    Punct(char),
    /// A quoted string, unescaped (the schedule text's names and reasons). Inside the quotes,
    /// `\\`, `\"` and `\n` stand for a backslash, a quote and a newline; every other
    /// character stands for itself.
    Str(String),
    /// The end of the text.
    End,
}

impl Tok {
    /// The token as an error message quotes it.
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Node(n) => format!("`%{n}`"),
            Tok::Ident(s) | Tok::Num(s) => format!("`{s}`"),
            Tok::Str(s) => format!("the string {}", quote(s)),
            Tok::Punct(c) => format!("`{c}`"),
            Tok::End => "the end of the text".into(),
        }
    }
}

/// Splits `text` into tokens. `#` and `;` start comments that run to the end of the line (the
/// printer's `# file:line` locations, a filetest's directives).
///
/// It reads bytes: every token but a string is ASCII, and a string's quotes, backslashes and
/// newlines are never the inside of a multi-byte character (the graph cache reads programs of
/// hundreds of kilobytes, so this is on the warm-start path). Columns count characters.
pub(super) fn lex(text: &str) -> Result<Vec<(Tok, Pos)>, (Pos, String)> {
    let b = text.as_bytes();
    let (mut i, mut line, mut col) = (0, 1, 1);
    let mut out = Vec::with_capacity(b.len() / 3);
    let word = |from: usize| {
        let mut j = from;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        j
    };
    while i < b.len() {
        let c = b[i];
        let pos = Pos { line, col };
        if c == b'\n' {
            (i, line, col) = (i + 1, line + 1, 1);
            continue;
        }
        if c.is_ascii_whitespace() || c == 0x0b {
            (i, col) = (i + 1, col + 1);
            continue;
        }
        if c == b'#' || c == b';' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        let start = i;
        let tok = if c == b'%' && b.get(i + 1).is_some_and(|d| d.is_ascii_alphanumeric()) {
            let j = word(i + 1);
            let digits = &text[i + 1..j];
            let n =
                digits.parse().map_err(|_| (pos, format!("expected a node label `%<number>`, found `%{digits}`")))?;
            i = j;
            Tok::Node(n)
        } else if c.is_ascii_alphabetic() || c == b'_' {
            i = word(i);
            Tok::Ident(text[start..i].to_string())
        } else if c.is_ascii_digit() || ((c == b'-' || c == b'+') && signs_number(&b[i + 1..])) {
            let mut j = i + 1;
            while j < b.len() {
                let d = b[j];
                let exponent_sign = (d == b'-' || d == b'+') && matches!(b[j - 1], b'e' | b'E');
                if d.is_ascii_alphanumeric() || d == b'.' || d == b'_' || exponent_sign {
                    j += 1;
                } else {
                    break;
                }
            }
            i = j;
            let w = &text[start..i];
            let body = w.trim_start_matches(['-', '+']);
            let valid = body == "inf"
                || body == "nan"
                || (body.starts_with(|d: char| d.is_ascii_digit())
                    && (body.bytes().all(|d| d.is_ascii_digit()) || body.parse::<f64>().is_ok()));
            if !valid {
                return Err((pos, format!("expected a number, found `{w}`")));
            }
            Tok::Num(w.to_string())
        } else if c == b'"' {
            let (text, end) = string(text, i + 1).map_err(|message| (pos, message))?;
            i = end;
            Tok::Str(text)
        } else if b"()[]{},:=+-*/%<&.@".contains(&c) {
            i += 1;
            Tok::Punct(c as char)
        } else {
            let c = text[i..].chars().next().expect("a character starts here");
            if c.is_whitespace() {
                (i, col) = (i + c.len_utf8(), col + 1);
                continue;
            }
            return Err((pos, format!("unexpected character `{c}`")));
        };
        // Only a string may hold characters of more than one byte.
        col += match tok {
            Tok::Str(_) => text[start..i].chars().count(),
            _ => i - start,
        };
        out.push((tok, pos));
    }
    out.push((Tok::End, Pos { line, col }));
    Ok(out)
}

/// The string whose text starts at byte `from` of `text` (after the opening quote), unescaped,
/// and the position after its closing quote.
fn string(text: &str, from: usize) -> Result<(String, usize), String> {
    let b = text.as_bytes();
    let mut out = String::new();
    let (mut j, mut run) = (from, from);
    loop {
        match b.get(j) {
            None | Some(b'\n') => return Err("a string without its closing `\"`".into()),
            Some(b'"') => {
                out.push_str(&text[run..j]);
                return Ok((out, j + 1));
            }
            Some(b'\\') => {
                out.push_str(&text[run..j]);
                out.push(match b.get(j + 1) {
                    Some(b'\\') => '\\',
                    Some(b'"') => '"',
                    Some(b'n') => '\n',
                    _ => {
                        let other = text[j + 1..].chars().next().map_or(String::new(), |c| c.to_string());
                        return Err(format!("unknown escape `\\{other}` in a string"));
                    }
                });
                j += 2;
                run = j;
            }
            Some(_) => j += 1,
        }
    }
}

/// `text` quoted as the lexer reads it back ([`Tok::Str`]).
pub(crate) fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether a `+` or `-` followed by `rest` is the sign of a number (a digit, `inf` or `nan`
/// follows), rather than an operator.
fn signs_number(rest: &[u8]) -> bool {
    let word = rest.iter().take_while(|c| c.is_ascii_alphanumeric() || **c == b'_').count();
    rest.first().is_some_and(|c| c.is_ascii_digit()) || matches!(&rest[..word], b"inf" | b"nan")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(text: &str) -> Vec<Tok> {
        lex(text).unwrap().into_iter().map(|(t, _)| t).collect()
    }

    #[test]
    fn numbers_labels_and_comments() {
        assert_eq!(
            toks("%12 = f(-1, 1e-5, -inf) # x:1\n; c"),
            vec![
                Tok::Node(12),
                Tok::Punct('='),
                Tok::Ident("f".into()),
                Tok::Punct('('),
                Tok::Num("-1".into()),
                Tok::Punct(','),
                Tok::Num("1e-5".into()),
                Tok::Punct(','),
                Tok::Num("-inf".into()),
                Tok::Punct(')'),
                Tok::End
            ]
        );
    }

    #[test]
    fn positions_are_line_and_column() {
        let t = lex("a\n  %3").unwrap();
        assert_eq!(t[1].1, Pos { line: 2, col: 3 });
        let ops: Vec<Tok> =
            toks("x0 - 4 + -2*r0 // 3 % 4").into_iter().filter(|t| matches!(t, Tok::Punct(_))).collect();
        assert_eq!(ops, "-+*//%".chars().map(Tok::Punct).collect::<Vec<_>>());
        assert_eq!(toks("-x")[0], Tok::Punct('-'));
        let (pos, msg) = lex("x $").unwrap_err();
        assert_eq!((pos, msg.as_str()), (Pos { line: 1, col: 3 }, "unexpected character `$`"));
        assert!(lex("1.2.3").is_err());
    }

    #[test]
    fn strings_round_trip_through_quote() {
        for text in ["", "plain", "a \"quoted\" word", "back\\slash\\", "two\nlines", "# not a comment; ok", "ünï"] {
            assert_eq!(toks(&quote(text)), vec![Tok::Str(text.into()), Tok::End], "{text:?}");
        }
        assert_eq!(toks("x \"a b\" y").len(), 4);
        assert!(lex("\"open").unwrap_err().1.contains("closing"));
        assert!(lex("\"line\nbreak\"").unwrap_err().1.contains("closing"));
        assert!(lex(r#""bad \t""#).unwrap_err().1.contains("unknown escape `\\t`"));
    }
}
