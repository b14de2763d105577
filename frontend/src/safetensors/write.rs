//! Saving named tensors as a safetensors file, atomically.

use super::file_error;
use super::header::{file_dtype_name, MAX_HEADER_BYTES};
use crate::realize::realize;
use crate::tensor::Tensor;
use coil_ir::{ErrorKind, Result};
use std::borrow::Borrow;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::panic::Location;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const SAVE: &str = "safetensors save";

/// Saves named tensors as a safetensors file that PyTorch's `safetensors.torch.load_file` (and
/// [`super::load`]) reads: [`save_with_metadata`] without metadata.
///
/// ```
/// use coil_frontend::{safetensors, Tensor};
/// use coil_ir::DType;
/// use std::collections::BTreeMap;
/// # let path = std::env::temp_dir().join(format!("coil-doc-save-{}.safetensors", std::process::id()));
/// let weights = BTreeMap::from([("w".to_string(), Tensor::ones(&[2, 2], DType::F32))]);
/// safetensors::save(&path, &weights)?;
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn save<K: AsRef<str>, T: Borrow<Tensor>>(
    path: impl AsRef<Path>,
    tensors: impl IntoIterator<Item = (K, T)>,
) -> Result<()> {
    save_with_metadata(path, tensors, std::iter::empty::<(&str, &str)>())
}

/// Saves named tensors, with string metadata (`__metadata__`), as a safetensors file.
///
/// Pending tensors are computed first, together (one graph per device); CUDA tensors come to
/// the host one at a time as they are written. The same tensors and metadata always give the
/// same bytes: tensors ordered by element size, largest first (so each starts at a multiple of
/// its size, as the safetensors library writes them), then by name; metadata by key.
///
/// The write is atomic: the bytes go to a temporary file beside `path` (`.<name>.tmp-<pid>-<n>`),
/// which is flushed to disk and then renamed over `path`, so `path` holds its old contents or
/// all of the new ones, never a part, even if the program dies mid-write; on an error the
/// temporary file is removed. Errors (kind `Value` for a name given twice or the reserved
/// `__metadata__`, `Runtime` for I/O) name the file.
///
/// ```
/// use coil_frontend::{safetensors, Tensor};
/// # let path = std::env::temp_dir().join(format!("coil-doc-savemeta-{}.safetensors", std::process::id()));
/// let step = Tensor::scalar(1000i64);
/// safetensors::save_with_metadata(&path, [("step", &step)], [("format", "pt"), ("run", "gpt2-small")])?;
/// assert_eq!(safetensors::WeightFile::open(&path)?.metadata()["run"], "gpt2-small");
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn save_with_metadata<K: AsRef<str>, T: Borrow<Tensor>, MK: AsRef<str>, MV: AsRef<str>>(
    path: impl AsRef<Path>,
    tensors: impl IntoIterator<Item = (K, T)>,
    metadata: impl IntoIterator<Item = (MK, MV)>,
) -> Result<()> {
    let location = Location::caller();
    let path = path.as_ref();
    let fail = |kind, message: String| file_error(kind, SAVE, path, message, location);
    let mut entries: Vec<(String, Tensor)> =
        tensors.into_iter().map(|(name, t)| (name.as_ref().to_string(), t.borrow().clone())).collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(pair) = entries.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(fail(ErrorKind::Value, format!("the name '{}' is given twice", pair[0].0)));
    }
    if entries.iter().any(|(name, _)| name == "__metadata__") {
        return Err(fail(ErrorKind::Value, "'__metadata__' is reserved for the metadata, not a tensor name".into()));
    }
    // Stable: by name within each element size.
    entries.sort_by_key(|(_, t)| Reverse(t.dtype().size_bytes()));
    let metadata: BTreeMap<String, String> =
        metadata.into_iter().map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_string())).collect();
    let header = header_json(&entries, &metadata);
    if header.len() > MAX_HEADER_BYTES {
        return Err(fail(
            ErrorKind::Value,
            format!("the header would be {} bytes, more than readers accept ({MAX_HEADER_BYTES})", header.len()),
        ));
    }
    realize(&entries.iter().map(|(_, t)| t).collect::<Vec<_>>()).map_err(|e| e.at(location))?;
    write_atomically(path, |out| {
        out.write_all(&(header.len() as u64).to_le_bytes())?;
        out.write_all(&header)?;
        for (name, t) in &entries {
            let host = t.storage().and_then(|s| s.to_host()).map_err(|e| {
                WriteFailure::Message(format!("cannot read tensor '{name}' ({}) to write it: {e}", t.meta()))
            })?;
            out.write_all(host.data.as_bytes())?;
        }
        Ok(())
    })
    .map_err(|message| fail(ErrorKind::Runtime, message))
}

/// The JSON header for `entries` in file order, padded with spaces to a multiple of 8 bytes so
/// the data section starts aligned.
fn header_json(entries: &[(String, Tensor)], metadata: &BTreeMap<String, String>) -> Vec<u8> {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let mut fields = vec![];
    if !metadata.is_empty() {
        let pairs: Vec<String> = metadata.iter().map(|(k, v)| format!("{}:{}", quote(k), quote(v))).collect();
        fields.push(format!("\"__metadata__\":{{{}}}", pairs.join(",")));
    }
    let mut offset = 0;
    for (name, t) in entries {
        let end = offset + t.meta().nbytes();
        let shape: Vec<String> = t.shape().iter().map(usize::to_string).collect();
        fields.push(format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{offset},{end}]}}",
            quote(name),
            file_dtype_name(t.dtype()),
            shape.join(",")
        ));
        offset = end;
    }
    let mut json = format!("{{{}}}", fields.join(",")).into_bytes();
    json.resize(json.len().next_multiple_of(8), b' ');
    json
}

/// Why writing the file's contents failed.
enum WriteFailure {
    Io(std::io::Error),
    Message(String),
}

impl From<std::io::Error> for WriteFailure {
    fn from(e: std::io::Error) -> WriteFailure {
        WriteFailure::Io(e)
    }
}

/// Removes a temporary file when dropped, unless disarmed (it was renamed into place).
struct Temporary(Option<PathBuf>);

impl Drop for Temporary {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Writes `path` through a temporary file beside it that is synced and then renamed over it.
fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> std::result::Result<(), WriteFailure>,
) -> std::result::Result<(), String> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or("not a path to a file")?.to_string_lossy();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let temp = path.with_file_name(format!(".{name}.tmp-{}-{n}", std::process::id()));
    let shown = temp.display().to_string();
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .map_err(|e| format!("cannot create the temporary file {shown} ({e})"))?;
    let mut guard = Temporary(Some(temp.clone()));
    let mut out = BufWriter::with_capacity(1 << 20, file);
    write(&mut out).map_err(|failure| match failure {
        WriteFailure::Io(e) => format!("cannot write {shown} ({e})"),
        WriteFailure::Message(m) => m,
    })?;
    let file = out.into_inner().map_err(|e| format!("cannot write {shown} ({})", e.error()))?;
    // On disk before it takes the final name: after a crash the name holds whole contents.
    file.sync_all().map_err(|e| format!("cannot flush {shown} to disk ({e})"))?;
    drop(file);
    std::fs::rename(&temp, path).map_err(|e| format!("cannot rename {shown} to the final name ({e})"))?;
    guard.0 = None;
    // The rename itself reaches the disk with the directory (best effort: not every platform
    // can open a directory).
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if let Ok(dir) = File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}
