//! Pre-tokenization: text split into the pieces BPE merges within, as the regular expressions
//! of GPT-2 and Llama 3 split it, written out by hand (leftmost alternative first, greedy, as
//! the `regex`/`fancy-regex` engines behind Hugging Face's tokenizers match them).
//!
//! Character classes: `\p{L}` is [`char::is_alphabetic`], `\p{N}` [`char::is_numeric`] and
//! `\s` [`char::is_whitespace`]. `is_alphabetic` also holds for the combining marks Unicode
//! calls alphabetic (Devanagari's vowel signs, for instance), which `\p{L}` excludes: text in
//! such scripts may split differently from Hugging Face's; Latin, Greek, Cyrillic, CJK, digits,
//! punctuation and whitespace split the same (the tests compare with Hugging Face's output).

/// Which pattern splits the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// GPT-2's: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// Llama 3's (tiktoken's `cl100k` family): case-insensitive contractions, letters with one
    /// leading non-letter, numbers of up to three digits, symbols with trailing newlines,
    /// newline runs and whitespace.
    Llama3,
}

impl Pattern {
    /// GPT-2's regular expression, as `tokenizer.json` spells it.
    pub const GPT2_REGEX: &'static str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

    /// Llama 3's regular expression, as its `tokenizer.json` spells it.
    pub const LLAMA3_REGEX: &'static str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    /// The pattern a `tokenizer.json` regular expression is, if it is one of these.
    pub fn from_regex(regex: &str) -> Option<Pattern> {
        match regex {
            Self::GPT2_REGEX => Some(Pattern::Gpt2),
            Self::LLAMA3_REGEX => Some(Pattern::Llama3),
            _ => None,
        }
    }

    /// `text` split into pieces (their concatenation is `text`).
    pub fn split(self, text: &str) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        let mut pieces = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let end = match self {
                Pattern::Gpt2 => gpt2_match(&chars, i),
                Pattern::Llama3 => llama3_match(&chars, i),
            };
            // Every character matches some alternative; one character is the safe step.
            let end = end.max(i + 1);
            pieces.push(chars[i..end].iter().collect());
            i = end;
        }
        pieces
    }
}

fn letter(c: char) -> bool {
    c.is_alphabetic()
}

fn number(c: char) -> bool {
    c.is_numeric()
}

fn space(c: char) -> bool {
    c.is_whitespace()
}

fn newline(c: char) -> bool {
    c == '\r' || c == '\n'
}

/// Symbols: not whitespace, letter or number.
fn symbol(c: char) -> bool {
    !space(c) && !letter(c) && !number(c)
}

/// The end of the run of `class` characters from `i` (`i` itself when there is none).
fn run(chars: &[char], i: usize, class: impl Fn(char) -> bool) -> usize {
    let mut j = i;
    while j < chars.len() && class(chars[j]) {
        j += 1;
    }
    j
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `i` (case-insensitively when asked): its end.
fn contraction(chars: &[char], i: usize, any_case: bool) -> Option<usize> {
    if chars.get(i) != Some(&'\'') {
        return None;
    }
    ["s", "t", "re", "ve", "m", "ll", "d"].iter().find_map(|suffix| {
        let matches = suffix.chars().enumerate().all(|(k, want)| {
            chars.get(i + 1 + k).is_some_and(|&c| if any_case { c.to_ascii_lowercase() == want } else { c == want })
        });
        matches.then(|| i + 1 + suffix.len())
    })
}

/// The whitespace alternatives both patterns end with: `\s+(?!\S)|\s+` (a run of whitespace,
/// less its last character when a non-space follows and the run is longer than one).
fn trailing_space(chars: &[char], i: usize) -> Option<usize> {
    let j = run(chars, i, space);
    if j == i {
        return None;
    }
    if j == chars.len() || j - i == 1 {
        return Some(j);
    }
    Some(j - 1)
}

fn gpt2_match(chars: &[char], i: usize) -> usize {
    if let Some(end) = contraction(chars, i, false) {
        return end;
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
    let start = if chars[i] == ' ' && chars.get(i + 1).is_some_and(|&c| !space(c)) { i + 1 } else { i };
    for class in [letter as fn(char) -> bool, number, symbol] {
        let end = run(chars, start, class);
        if end > start {
            return end;
        }
    }
    trailing_space(chars, i).unwrap_or(i + 1)
}

fn llama3_match(chars: &[char], i: usize) -> usize {
    if let Some(end) = contraction(chars, i, true) {
        return end;
    }
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    let c = chars[i];
    if !newline(c) && !letter(c) && !number(c) {
        let end = run(chars, i + 1, letter);
        if end > i + 1 {
            return end;
        }
    }
    let end = run(chars, i, letter);
    if end > i {
        return end;
    }
    // `\p{N}{1,3}`
    let end = run(chars, i, number);
    if end > i {
        return end.min(i + 3);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let start = if c == ' ' { i + 1 } else { i };
    let end = run(chars, start, symbol);
    if end > start {
        return run(chars, end, newline);
    }
    // `\s*[\r\n]+`: whitespace up to and including its last newline.
    let j = run(chars, i, space);
    if let Some(last) = (i..j).rev().find(|&k| newline(chars[k])) {
        return last + 1;
    }
    trailing_space(chars, i).unwrap_or(i + 1)
}

#[cfg(test)]
mod tests {
    use super::Pattern;

    #[test]
    fn gpt2_keeps_a_space_with_the_word_after_it() {
        let pieces = Pattern::Gpt2.split("Hello world's  3.14!\n\n x");
        assert_eq!(pieces, ["Hello", " world", "'s", " ", " 3", ".", "14", "!", "\n\n", " x"]);
    }

    #[test]
    fn llama3_splits_numbers_by_three_and_keeps_newlines_together() {
        let pieces = Pattern::Llama3.split("I'LL pay 1234567 dollars!!\n\n  Ok");
        assert_eq!(pieces, ["I", "'LL", " pay", " ", "123", "456", "7", " dollars", "!!\n\n", " ", " Ok"]);
    }

    #[test]
    fn the_pieces_concatenate_to_the_text() {
        let text = "a\u{00e9}\u{4e2d}\u{6587} \t\r\n x\u{2003}y ,,;;'' 'D 12 345\n";
        for pattern in [Pattern::Gpt2, Pattern::Llama3] {
            assert_eq!(pattern.split(text).concat(), text, "{pattern:?}");
        }
    }
}
