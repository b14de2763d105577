//! Byte-level BPE tokenizers as Hugging Face ships them: a `tokenizer.json` of the byte-level
//! BPE family (GPT-2, Llama 3 and the models that copy their pre-tokenization), or GPT-2's
//! older `vocab.json` and `merges.txt`.
//!
//! Encoding splits the text at the special tokens (`<|begin_of_text|>`, ...), splits the rest
//! into pieces with the model's pattern ([`Pattern`]), maps each piece's UTF-8 bytes to
//! printable characters (GPT-2's byte table) and merges adjacent symbols, the pair of lowest
//! rank first. With `ignore_merges` (Llama 3), a piece that is a token already is not merged.
//! The template's special tokens (Llama 3's beginning-of-text) are added around the ids when
//! asked. Decoding maps tokens back to bytes.
//!
//! Other tokenizer families (SentencePiece with `▁` and byte fallback, WordPiece, Unigram) and
//! other split patterns are an error naming what is not supported, not a silently different
//! encoding.
//!
//! ```
//! use coil_nn::Tokenizer;
//! let json = r#"{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3},
//!                "merges": ["a b"]},
//!                "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
//!                "added_tokens": []}"#;
//! let t = Tokenizer::from_json(json)?;
//! assert_eq!(t.encode("ab ab", false)?, vec![2, 3, 2]);
//! assert_eq!(t.decode(&[2, 3, 2])?, "ab ab");
//! # Ok::<(), coil_ir::Error>(())
//! ```

mod split;

pub use split::Pattern;

use coil_ir::{Error, Result};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// A byte-level BPE tokenizer (see the module docs).
#[derive(Clone, Debug)]
pub struct Tokenizer {
    encoder: HashMap<String, i64>,
    decoder: HashMap<i64, String>,
    ranks: HashMap<(String, String), usize>,
    pattern: Pattern,
    ignore_merges: bool,
    /// Special tokens matched in the text before splitting, longest first.
    specials: Vec<(String, i64)>,
    /// Ids the template puts before and after a sequence.
    prefix: Vec<i64>,
    suffix: Vec<i64>,
    byte_to_char: [char; 256],
    char_to_byte: HashMap<char, u8>,
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::value(format!("tokenizer: {what}"))
}

impl Tokenizer {
    /// Reads a Hugging Face `tokenizer.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
        Tokenizer::from_json(&text).map_err(|e| bad(format!("{}: {e}", path.display())))
    }

    /// Reads GPT-2's `vocab.json` and `merges.txt` from `dir` (GPT-2's pattern, no special
    /// tokens in the text, no template).
    pub fn from_gpt2_files(dir: impl AsRef<Path>) -> Result<Tokenizer> {
        let dir = dir.as_ref();
        let read =
            |f: &str| std::fs::read_to_string(dir.join(f)).map_err(|e| bad(format!("{}: {e}", dir.join(f).display())));
        let vocab: HashMap<String, i64> =
            serde_json::from_str(&read("vocab.json")?).map_err(|e| bad(format!("vocab.json: {e}")))?;
        let merges: Vec<(String, String)> = read("merges.txt")?
            .lines()
            .filter(|l| !l.starts_with("#version") && !l.is_empty())
            .map(|l| l.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("merges.txt: a line without a space"))?;
        Ok(Tokenizer::new(vocab, merges, Pattern::Gpt2, false, Vec::new(), Vec::new(), Vec::new()))
    }

    /// Parses the text of a `tokenizer.json`.
    pub fn from_json(text: &str) -> Result<Tokenizer> {
        let json: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let model = &json["model"];
        if model["type"].as_str().is_some_and(|t| t != "BPE") {
            return Err(bad(format!("model type {} (only byte-level BPE is supported)", model["type"])));
        }
        if model["byte_fallback"].as_bool() == Some(true) {
            return Err(bad("a SentencePiece-style BPE with byte fallback (not supported)"));
        }
        let vocab: HashMap<String, i64> =
            serde_json::from_value(model["vocab"].clone()).map_err(|e| bad(format!("model.vocab: {e}")))?;
        let merges = model["merges"]
            .as_array()
            .ok_or_else(|| bad("model.merges is missing"))?
            .iter()
            .map(|m| match m {
                Value::String(s) => s.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())),
                Value::Array(pair) => match pair.as_slice() {
                    [Value::String(a), Value::String(b)] => Some((a.clone(), b.clone())),
                    _ => None,
                },
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("model.merges: an entry that is neither \"a b\" nor [\"a\", \"b\"]"))?;
        let pattern = pre_tokenizer(&json["pre_tokenizer"])?;
        let mut specials = Vec::new();
        for t in json["added_tokens"].as_array().into_iter().flatten() {
            if let (Some(content), Some(id)) = (t["content"].as_str(), t["id"].as_i64()) {
                specials.push((content.to_string(), id));
            }
        }
        let (prefix, suffix) = template(&json["post_processor"], &specials)?;
        let ignore_merges = model["ignore_merges"].as_bool().unwrap_or(false);
        Ok(Tokenizer::new(vocab, merges, pattern, ignore_merges, specials, prefix, suffix))
    }

    fn new(
        encoder: HashMap<String, i64>,
        merges: Vec<(String, String)>,
        pattern: Pattern,
        ignore_merges: bool,
        mut specials: Vec<(String, i64)>,
        prefix: Vec<i64>,
        suffix: Vec<i64>,
    ) -> Tokenizer {
        let ranks = merges.into_iter().enumerate().map(|(i, pair)| (pair, i)).collect();
        let byte_to_char = bytes_to_chars();
        let char_to_byte = byte_to_char.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        let mut decoder: HashMap<i64, String> = encoder.iter().map(|(k, &v)| (v, k.clone())).collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        for (content, id) in &specials {
            decoder.insert(*id, content.clone());
        }
        Tokenizer {
            encoder,
            decoder,
            ranks,
            pattern,
            ignore_merges,
            specials,
            prefix,
            suffix,
            byte_to_char,
            char_to_byte,
        }
    }

    /// The pattern that splits text before merging.
    pub fn pattern(&self) -> Pattern {
        self.pattern
    }

    /// Tokens in the vocabulary, special tokens included.
    pub fn vocab_size(&self) -> usize {
        self.decoder.len()
    }

    /// The id of a token (a special token's content, or a vocabulary entry in GPT-2's
    /// byte-mapped spelling).
    pub fn token_id(&self, token: &str) -> Option<i64> {
        self.specials.iter().find(|(c, _)| c == token).map(|&(_, id)| id).or_else(|| self.encoder.get(token).copied())
    }

    /// `text` as ids; with `add_special`, the template's special tokens around them (Llama 3's
    /// `<|begin_of_text|>` first), as Hugging Face's `encode(text, add_special_tokens=True)`.
    /// Special tokens written in the text become their ids.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<i64>> {
        let mut ids = if add_special { self.prefix.clone() } else { Vec::new() };
        let mut rest = text;
        while !rest.is_empty() {
            // The next special token in the text (the earliest; the longest where two start at once).
            let next = self
                .specials
                .iter()
                .filter_map(|(content, id)| rest.find(content.as_str()).map(|at| (at, content.len(), *id)))
                .min_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            let (plain, special) = match next {
                Some((at, len, id)) if len > 0 => (&rest[..at], Some((id, at + len))),
                _ => (rest, None),
            };
            for piece in self.pattern.split(plain) {
                self.encode_piece(&piece, &mut ids)?;
            }
            match special {
                Some((id, end)) => {
                    ids.push(id);
                    rest = &rest[end..];
                }
                None => break,
            }
        }
        if add_special {
            ids.extend_from_slice(&self.suffix);
        }
        Ok(ids)
    }

    /// The ids of one pre-tokenized piece, appended to `ids`.
    fn encode_piece(&self, piece: &str, ids: &mut Vec<i64>) -> Result<()> {
        let mapped: String = piece.bytes().map(|b| self.byte_to_char[b as usize]).collect();
        if self.ignore_merges {
            if let Some(&id) = self.encoder.get(&mapped) {
                ids.push(id);
                return Ok(());
            }
        }
        let symbols = mapped.chars().map(String::from).collect();
        for symbol in self.merge(symbols) {
            let id = self.encoder.get(&symbol).ok_or_else(|| {
                bad(format!("{piece:?} leaves the symbol {symbol:?}, which is not in the vocabulary"))
            })?;
            ids.push(*id);
        }
        Ok(())
    }

    /// Text of `ids` (special tokens as their content); an id outside the vocabulary is an
    /// error naming it.
    pub fn decode(&self, ids: &[i64]) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            let token = self.decoder.get(&id).ok_or_else(|| bad(format!("id {id} is not in the vocabulary")))?;
            if self.specials.iter().any(|&(_, s)| s == id) {
                bytes.extend_from_slice(token.as_bytes());
            } else {
                bytes.extend(token.chars().filter_map(|c| self.char_to_byte.get(&c).copied()));
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Merges adjacent symbols, the pair of lowest rank first (the leftmost among equals),
    /// until no pair has a rank.
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

/// The pattern of a `pre_tokenizer`: GPT-2's `ByteLevel` (with its regex), or a `Sequence` of
/// a `Split` by a known pattern and a `ByteLevel` without one (Llama 3).
fn pre_tokenizer(p: &Value) -> Result<Pattern> {
    let byte_level = |p: &Value| p["type"] == "ByteLevel" && p["add_prefix_space"].as_bool() != Some(true);
    match p["type"].as_str() {
        Some("ByteLevel") if byte_level(p) && p["use_regex"].as_bool() != Some(false) => Ok(Pattern::Gpt2),
        Some("Sequence") => {
            let parts = p["pretokenizers"].as_array().map(Vec::as_slice).unwrap_or_default();
            match parts {
                [split, level] if split["type"] == "Split" && byte_level(level) && level["use_regex"] == false => {
                    let regex = split["pattern"]["Regex"].as_str().unwrap_or_default();
                    let isolated = split["behavior"] == "Isolated" && split["invert"] != true;
                    Pattern::from_regex(regex).filter(|_| isolated).ok_or_else(|| {
                        bad(format!("pre-tokenizer split {split} (GPT-2's and Llama 3's patterns are supported)"))
                    })
                }
                _ => Err(bad(format!("pre-tokenizer {p} (supported: ByteLevel, or Split then ByteLevel)"))),
            }
        }
        _ => Err(bad(format!("pre-tokenizer {p} (supported: ByteLevel, or Split then ByteLevel)"))),
    }
}

/// The ids a `post_processor` puts before and after one sequence: a `TemplateProcessing`'s
/// `single` template (inside a `Sequence` or alone); none for `ByteLevel` or no processor.
fn template(p: &Value, specials: &[(String, i64)]) -> Result<(Vec<i64>, Vec<i64>)> {
    match p["type"].as_str() {
        None | Some("ByteLevel") => Ok((Vec::new(), Vec::new())),
        Some("Sequence") => {
            let mut found = (Vec::new(), Vec::new());
            for q in p["processors"].as_array().into_iter().flatten() {
                let (before, after) = template(q, specials)?;
                found.0.extend(before);
                found.1.extend(after);
            }
            Ok(found)
        }
        Some("TemplateProcessing") => {
            let (mut before, mut after, mut seen) = (Vec::new(), Vec::new(), false);
            for item in p["single"].as_array().into_iter().flatten() {
                if item.get("Sequence").is_some() {
                    seen = true;
                } else if let Some(name) = item["SpecialToken"]["id"].as_str() {
                    let ids = p["special_tokens"][name]["ids"].as_array().cloned().unwrap_or_default();
                    let ids: Vec<i64> = if ids.is_empty() {
                        specials.iter().filter(|(c, _)| c == name).map(|&(_, id)| id).collect()
                    } else {
                        ids.iter().filter_map(Value::as_i64).collect()
                    };
                    if ids.is_empty() {
                        return Err(bad(format!("the template's special token {name} has no id")));
                    }
                    if seen { &mut after } else { &mut before }.extend(ids);
                }
            }
            Ok((before, after))
        }
        Some(other) => Err(bad(format!("post-processor {other} (supported: TemplateProcessing, ByteLevel)"))),
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
            char::from_u32(next - 1).expect("below U+0200")
        };
    }
    table
}
