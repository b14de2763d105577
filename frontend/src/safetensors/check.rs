//! Checking a file against the tensors a model expects, all problems in one message, and the
//! "did you mean" hints of not-found errors.

use super::{file_error, plural, WeightFile};
use coil_ir::{DType, ErrorKind, Result};
use std::collections::HashSet;
use std::panic::Location;

const CHECK: &str = "safetensors check";

/// At most this many names per kind of problem in a message.
const LISTED: usize = 10;

impl WeightFile {
    /// Checks that the file holds exactly the `expected` tensors, `(name, shape, dtype)`: reports
    /// every missing name, unexpected name, shape mismatch and dtype mismatch together in one
    /// error (before anything is loaded: a module loader calls this first, so a bad file leaves
    /// no parameter half-loaded). The error's kind is `Shape` or `DType` when all the problems
    /// are of that kind, else `Value`.
    ///
    /// ```
    /// use coil_frontend::{safetensors::WeightFile, Tensor};
    /// use coil_ir::{DType, ErrorKind};
    /// # let path = std::env::temp_dir().join(format!("coil-doc-check-{}.safetensors", std::process::id()));
    /// # let w = Tensor::zeros(&[3, 2], DType::F32);
    /// coil_frontend::safetensors::save(&path, [("fc.weight", &w), ("fc.bias", &Tensor::zeros(&[2], DType::BF16))])?;
    /// let file = WeightFile::open(&path)?;
    /// file.check(&[("fc.weight", vec![3, 2], DType::F32), ("fc.bias", vec![2], DType::BF16)])?;
    /// let e = file.check(&[("fc.weight", vec![2, 3], DType::F32), ("fc.bais", vec![2], DType::F32)]).unwrap_err();
    /// assert_eq!(e.kind, ErrorKind::Value);
    /// let msg = e.to_string();
    /// assert!(msg.contains("missing: 'fc.bais' (did you mean 'fc.bias'?)"), "{msg}");
    /// assert!(msg.contains("unexpected: 'fc.bias'"), "{msg}");
    /// assert!(msg.contains("shape mismatch: 'fc.weight' is [3, 2] in the file, [2, 3] expected"), "{msg}");
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn check<N: AsRef<str>, S: AsRef<[usize]>>(&self, expected: &[(N, S, DType)]) -> Result<()> {
        self.check_expected(expected, true, Location::caller())
    }

    /// [`WeightFile::check`], except that the file may hold more tensors than `expected` (a
    /// checkpoint with optimizer state, Hugging Face's GPT-2 with its attention-mask buffers, or
    /// one block of a larger model).
    ///
    /// ```
    /// # use coil_frontend::{safetensors::WeightFile, Tensor};
    /// # use coil_ir::DType;
    /// # let path = std::env::temp_dir().join(format!("coil-doc-subset-{}.safetensors", std::process::id()));
    /// # let t = Tensor::zeros(&[2], DType::F32);
    /// coil_frontend::safetensors::save(&path, [("a", &t), ("extra", &t)])?;
    /// let file = WeightFile::open(&path)?;
    /// file.check_subset(&[("a", [2], DType::F32)])?;
    /// assert!(file.check(&[("a", [2], DType::F32)]).is_err()); // 'extra' is unexpected
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn check_subset<N: AsRef<str>, S: AsRef<[usize]>>(&self, expected: &[(N, S, DType)]) -> Result<()> {
        self.check_expected(expected, false, Location::caller())
    }

    fn check_expected<N: AsRef<str>, S: AsRef<[usize]>>(
        &self,
        expected: &[(N, S, DType)],
        strict: bool,
        location: &'static Location<'static>,
    ) -> Result<()> {
        let wanted: HashSet<&str> = expected.iter().map(|(n, ..)| n.as_ref()).collect();
        let not_wanted = || self.tensors().keys().map(String::as_str).filter(|n| !wanted.contains(n));
        let (mut missing, mut shapes, mut dtypes) = (vec![], vec![], vec![]);
        for (name, shape, dtype) in expected {
            let (name, shape) = (name.as_ref(), shape.as_ref());
            let Some(info) = self.info(name) else {
                let hint = suggest(name, not_wanted()).map(|s| format!(" (did you mean '{s}'?)")).unwrap_or_default();
                missing.push(format!("'{name}'{hint}"));
                continue;
            };
            if info.shape != shape {
                shapes.push(format!("'{name}' is {:?} in the file, {shape:?} expected", info.shape));
            }
            if info.dtype != Some(*dtype) {
                dtypes.push(format!("'{name}' is {} in the file, {dtype} expected", info.dtype_text()));
            }
        }
        let unexpected: Vec<String> = if strict { not_wanted().map(|n| format!("'{n}'")).collect() } else { vec![] };
        let total = missing.len() + unexpected.len() + shapes.len() + dtypes.len();
        if total == 0 {
            return Ok(());
        }
        let kind = if shapes.len() == total {
            ErrorKind::Shape
        } else if dtypes.len() == total {
            ErrorKind::DType
        } else {
            ErrorKind::Value
        };
        let parts: Vec<String> =
            [("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes), ("dtype mismatch", dtypes)]
                .into_iter()
                .filter(|(_, items)| !items.is_empty())
                .map(|(what, items)| {
                    let more = items.len().saturating_sub(LISTED);
                    let more = if more > 0 { format!(", ... ({more} more)") } else { String::new() };
                    format!("{what}: {}{more}", items[..items.len().min(LISTED)].join(", "))
                })
                .collect();
        let message = format!(
            "{} against the {} expected: {}",
            plural(total, "problem"),
            plural(expected.len(), "tensor"),
            parts.join("; ")
        );
        Err(file_error(kind, CHECK, self.path(), message, location))
    }
}

/// The candidate `wanted` was most likely meant as: one that differs only by a leading prefix
/// of whole `.`-separated parts (`transformer.wte.weight` for `wte.weight`, or the reverse),
/// else the closest by edit distance if it is close (at most a quarter of the name, and 2 at
/// least). Ties go to the first candidate.
pub(crate) fn suggest<'a>(wanted: &str, candidates: impl Iterator<Item = &'a str> + Clone) -> Option<&'a str> {
    let dotted_suffix = |long: &str, short: &str| {
        long.len() > short.len() && long.ends_with(short) && long[..long.len() - short.len()].ends_with('.')
    };
    if let Some(c) =
        candidates.clone().filter(|c| dotted_suffix(c, wanted) || dotted_suffix(wanted, c)).min_by_key(|c| c.len())
    {
        return Some(c);
    }
    let limit = (wanted.chars().count() / 4).max(2);
    candidates
        .filter(|c| c.len().abs_diff(wanted.len()) <= limit)
        .map(|c| (edit_distance(wanted, c), c))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// A prefix the names have that `wanted` was most likely meant as: the part of a name up to
/// `wanted` where it follows a `.` (`transformer.h.0.` for `h.0.`), else a name's first
/// `wanted.len()` bytes when they are close by edit distance.
pub(crate) fn suggest_prefix<'a>(wanted: &str, names: impl Iterator<Item = &'a str> + Clone) -> Option<&'a str> {
    let nested = names.clone().find_map(|n| {
        let at = n.match_indices(wanted).map(|(i, _)| i).find(|&i| i > 0 && n[..i].ends_with('.'))?;
        Some(&n[..at + wanted.len()])
    });
    if nested.is_some() {
        return nested;
    }
    let heads = names.filter_map(|n| n.get(..wanted.len()));
    suggest(wanted, heads).filter(|h| *h != wanted)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diagonal + usize::from(ca != cb)).min(row[j] + 1).min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("wte.weight", "wte.weight"), 0);
    }

    #[test]
    fn suggestions_prefer_a_dotted_prefix_then_a_close_name() {
        let names = ["transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"];
        assert_eq!(suggest("wte.weight", names.into_iter()), Some("transformer.wte.weight"));
        assert_eq!(suggest("model.lm_head.weight", names.into_iter()), Some("lm_head.weight"));
        assert_eq!(suggest("transformer.wte.weigth", names.into_iter()), Some("transformer.wte.weight"));
        assert_eq!(suggest("h.0.mlp.c_fc.bias", names.into_iter()), None);
        assert_eq!(suggest_prefix("h.1.", ["transformer.h.1.attn.bias"].into_iter()), Some("transformer.h.1."));
        assert_eq!(suggest_prefix("h.1O.", ["h.10.attn.bias"].into_iter()), Some("h.10."));
        assert_eq!(suggest_prefix("blocks.", ["h.10.attn.bias"].into_iter()), None);
    }
}
