//! The safetensors header: parsing, validation, and the dtype names.
//!
//! A file is `n` (a little-endian u64), `n` bytes of JSON, then the data section. The JSON maps
//! each tensor's name to `{"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}`
//! (byte offsets into the data section) and may hold `"__metadata__"`, a map of strings. Every
//! check here names the tensor it is about, so that a bad file says what is wrong where.
//!
//! Validation is this crate's own rather than the `safetensors` crate's: that crate's errors do
//! not name the tensor at fault, and it rejects a dtype it does not know as a JSON error where
//! coil reports an unsupported dtype by name.

use super::TensorInfo;
use coil_ir::{DType, Error, Result};
use serde_json::Value;
use std::collections::BTreeMap;

/// The largest header accepted, in bytes (the `safetensors` crate's limit): a corrupt length
/// must not make coil parse gigabytes as JSON.
///
/// ```
/// assert_eq!(coil_frontend::safetensors::MAX_HEADER_BYTES, 100_000_000);
/// ```
pub const MAX_HEADER_BYTES: usize = 100_000_000;

/// A parsed, validated header.
pub(crate) struct Header {
    /// Where the data section starts in the file (8 + the header's length).
    pub data_start: usize,
    pub tensors: BTreeMap<String, TensorInfo>,
    pub metadata: BTreeMap<String, String>,
}

/// The name safetensors gives a coil dtype.
pub(crate) fn file_dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "BOOL",
        DType::U8 => "U8",
        DType::I8 => "I8",
        DType::I16 => "I16",
        DType::I32 => "I32",
        DType::I64 => "I64",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::F32 => "F32",
        DType::F64 => "F64",
    }
}

/// A safetensors dtype name: its own spelling, coil's dtype where coil has one, and the element
/// size in bytes. Sub-byte types (`F4`, `F6_*`) are not known: such a file fails to open.
fn parse_dtype(name: &str) -> Option<(&'static str, Option<DType>, usize)> {
    if let Some(&dtype) = DType::ALL.iter().find(|&&d| file_dtype_name(d) == name) {
        return Some((file_dtype_name(dtype), Some(dtype), dtype.size_bytes()));
    }
    const OTHERS: [(&str, usize); 7] =
        [("F8_E5M2", 1), ("F8_E4M3", 1), ("F8_E8M0", 1), ("U16", 2), ("U32", 4), ("U64", 8), ("C64", 8)];
    OTHERS.iter().find(|(n, _)| *n == name).map(|&(n, size)| (n, None, size))
}

/// Parses and validates the header of a whole file's bytes: lengths, JSON, every tensor's
/// dtype, shape and offsets (inside the data section, matching dtype × shape, no two tensors
/// sharing bytes). Errors are of kind `Value` and say what is wrong, without the file's name.
pub(crate) fn parse(file: &[u8]) -> Result<Header> {
    if file.len() < 8 {
        return Err(Error::value(format!(
            "truncated: {} bytes, shorter than the 8-byte header length that starts a safetensors file",
            file.len()
        )));
    }
    let mut length = [0u8; 8];
    length.copy_from_slice(&file[..8]);
    let n = u64::from_le_bytes(length);
    if n > MAX_HEADER_BYTES as u64 {
        return Err(Error::value(format!(
            "header too large: {n} bytes (at most {MAX_HEADER_BYTES} accepted; not a safetensors file?)"
        )));
    }
    let data_start = 8 + n as usize;
    if data_start > file.len() {
        return Err(Error::value(format!(
            "truncated: the header is {n} bytes long, but only {} bytes follow its length",
            file.len() - 8
        )));
    }
    let corrupt = |what: String| Error::value(format!("corrupt header: {what}"));
    let text = std::str::from_utf8(&file[8..data_start]).map_err(|e| corrupt(format!("not UTF-8 ({e})")))?;
    let json: Value = serde_json::from_str(text).map_err(|e| corrupt(format!("not JSON ({e})")))?;
    let Value::Object(entries) = json else {
        return Err(corrupt(format!("a JSON {} where an object of tensors belongs", json_kind(&json))));
    };
    let data_len = file.len() - data_start;
    let mut tensors = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    for (name, value) in entries {
        if name == "__metadata__" {
            metadata = parse_metadata(value)?;
            continue;
        }
        let info = parse_tensor(&name, &value)?;
        let (begin, end) = info.data_offsets;
        if end > data_len {
            return Err(Error::value(format!(
                "tensor '{name}' lies at data bytes [{begin}, {end}), past the end of the data section \
                 ({data_len} bytes): the file is truncated or its offsets are wrong"
            )));
        }
        tensors.insert(name, info);
    }
    check_overlaps(&tensors)?;
    Ok(Header { data_start, tensors, metadata })
}

fn parse_metadata(value: Value) -> Result<BTreeMap<String, String>> {
    let bad = |what: String| Error::value(format!("corrupt header: __metadata__ {what}"));
    let Value::Object(entries) = value else {
        return Err(bad(format!("is a JSON {}, not an object of strings", json_kind(&value))));
    };
    entries
        .into_iter()
        .map(|(key, value)| match value {
            Value::String(s) => Ok((key, s)),
            other => Err(bad(format!("'{key}' is a JSON {}, not a string", json_kind(&other)))),
        })
        .collect()
}

fn parse_tensor(name: &str, value: &Value) -> Result<TensorInfo> {
    let bad = |what: String| Error::value(format!("corrupt header: tensor '{name}': {what}"));
    let Value::Object(fields) = value else {
        return Err(bad(format!("a JSON {} where {{dtype, shape, data_offsets}} belongs", json_kind(value))));
    };
    let dtype_name =
        fields.get("dtype").and_then(Value::as_str).ok_or_else(|| bad("no \"dtype\" string".to_string()))?;
    let (file_dtype, dtype, size) =
        parse_dtype(dtype_name).ok_or_else(|| bad(format!("unknown dtype \"{dtype_name}\"")))?;
    let as_size = |v: &Value| v.as_u64().and_then(|x| usize::try_from(x).ok());
    let shape = fields
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|dims| dims.iter().map(as_size).collect::<Option<Vec<usize>>>())
        .ok_or_else(|| bad("\"shape\" is not a list of sizes".to_string()))?;
    let (begin, end) = match fields.get("data_offsets").and_then(Value::as_array).map(Vec::as_slice) {
        Some([b, e]) => as_size(b).zip(as_size(e)),
        _ => None,
    }
    .ok_or_else(|| bad("\"data_offsets\" is not a pair of byte offsets".to_string()))?;
    if end < begin {
        return Err(bad(format!("data_offsets [{begin}, {end}] end before they begin")));
    }
    let nbytes = shape
        .iter()
        .try_fold(size, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("shape {shape:?} of {file_dtype} overflows the address space")))?;
    if end - begin != nbytes {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] hold {} bytes, but {file_dtype} {shape:?} takes {nbytes}",
            end - begin
        )));
    }
    Ok(TensorInfo { dtype, file_dtype, shape, data_offsets: (begin, end) })
}

/// No two tensors may share bytes (a writer bug or a crafted file: loading one would show the
/// other's bytes).
fn check_overlaps(tensors: &BTreeMap<String, TensorInfo>) -> Result<()> {
    let mut ranges: Vec<(usize, usize, &str)> = tensors
        .iter()
        .filter(|(_, t)| t.data_offsets.0 < t.data_offsets.1)
        .map(|(name, t)| (t.data_offsets.0, t.data_offsets.1, name.as_str()))
        .collect();
    ranges.sort();
    for pair in ranges.windows(2) {
        let ((b0, e0, a), (b1, e1, b)) = (pair[0], pair[1]);
        if b1 < e0 {
            return Err(Error::value(format!(
                "corrupt header: tensors '{a}' (data bytes [{b0}, {e0})) and '{b}' ([{b1}, {e1})) overlap"
            )));
        }
    }
    Ok(())
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}
