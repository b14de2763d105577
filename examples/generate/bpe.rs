//! GPT-2's byte-level BPE tokenizer, read from Hugging Face's `vocab.json` and `merges.txt`:
//! text is split into words as GPT-2's pattern splits it, each word's UTF-8 bytes are mapped to
//! printable characters, and the merges are applied lowest rank first.

use std::collections::HashMap;

pub struct Bpe {
    encoder: HashMap<String, i64>,
    decoder: HashMap<i64, String>,
    ranks: HashMap<(String, String), usize>,
    byte_to_char: [char; 256],
    char_to_byte: HashMap<char, u8>,
}

impl Bpe {
    /// Reads `vocab.json` and `merges.txt` from `dir`.
    pub fn load(dir: &std::path::Path) -> Result<Bpe, String> {
        let read =
            |f: &str| std::fs::read_to_string(dir.join(f)).map_err(|e| format!("{}: {e}", dir.join(f).display()));
        let vocab: HashMap<String, i64> =
            serde_json::from_str(&read("vocab.json")?).map_err(|e| format!("vocab.json: {e}"))?;
        let merges = read("merges.txt")?;
        let ranks = merges
            .lines()
            .filter(|l| !l.starts_with("#version") && !l.is_empty())
            .enumerate()
            .filter_map(|(i, l)| l.split_once(' ').map(|(a, b)| ((a.to_string(), b.to_string()), i)))
            .collect();
        let byte_to_char = bytes_to_chars();
        let char_to_byte = byte_to_char.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        let decoder = vocab.iter().map(|(k, &v)| (v, k.clone())).collect();
        Ok(Bpe { encoder: vocab, decoder, ranks, byte_to_char, char_to_byte })
    }

    pub fn encode(&self, text: &str) -> Vec<i64> {
        let mut ids = Vec::new();
        for word in split_words(text) {
            let mapped: Vec<String> = word.bytes().map(|b| self.byte_to_char[b as usize].to_string()).collect();
            for piece in self.merge(mapped) {
                if let Some(&id) = self.encoder.get(&piece) {
                    ids.push(id);
                }
            }
        }
        ids
    }

    pub fn decode(&self, ids: &[i64]) -> String {
        let chars: String = ids.iter().filter_map(|i| self.decoder.get(i)).map(String::as_str).collect();
        let bytes: Vec<u8> = chars.chars().filter_map(|c| self.char_to_byte.get(&c).copied()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Merges adjacent symbols, the pair of lowest rank first, until no pair has a rank.
    fn merge(&self, mut symbols: Vec<String>) -> Vec<String> {
        loop {
            let best = (0..symbols.len().saturating_sub(1))
                .filter_map(|i| self.ranks.get(&(symbols[i].clone(), symbols[i + 1].clone())).map(|&r| (r, i)))
                .min();
            let Some((_, i)) = best else { return symbols };
            let joined = format!("{}{}", symbols[i], symbols[i + 1]);
            symbols.splice(i..i + 2, [joined]);
        }
    }
}

/// GPT-2's byte-to-character table: printable bytes map to themselves, the others to
/// characters from U+0100 up.
fn bytes_to_chars() -> [char; 256] {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        table[b as usize] = if printable(b) {
            b as char
        } else {
            next += 1;
            char::from_u32(next - 1).expect("valid")
        };
    }
    table
}

/// GPT-2's pre-tokenization: contractions, ` ?letters`, ` ?digits`, ` ?other symbols`, and runs
/// of whitespace (a space before a word stays with the word).
fn split_words(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut words = Vec::new();
    let mut i = 0;
    let class = |c: char| {
        if c.is_alphabetic() {
            0
        } else if c.is_numeric() {
            1
        } else if c.is_whitespace() {
            3
        } else {
            2
        }
    };
    while i < chars.len() {
        if chars[i] == '\'' {
            let rest: String = chars[i + 1..chars.len().min(i + 3)].iter().collect();
            if let Some(c) = ["s", "t", "re", "ve", "m", "ll", "d"].iter().find(|c| rest.starts_with(**c)) {
                words.push(format!("'{c}"));
                i += 1 + c.len();
                continue;
            }
        }
        let start = i;
        let space = chars[i] == ' ' && i + 1 < chars.len() && class(chars[i + 1]) != 3;
        if space {
            i += 1;
        }
        let k = class(chars[i]);
        if k == 3 {
            // Whitespace: all of it but the last, when a word follows (that one joins the word).
            while i < chars.len() && class(chars[i]) == 3 {
                i += 1;
            }
            if i < chars.len() && i - start > 1 && chars[i - 1] == ' ' {
                i -= 1;
            }
        } else {
            while i < chars.len() && class(chars[i]) == k && !(k == 2 && chars[i] == '\'') {
                i += 1;
            }
            if i == start + usize::from(space) {
                i += 1;
            }
        }
        words.push(chars[start..i].iter().collect());
    }
    words
}
