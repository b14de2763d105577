//! Weights in safetensors files: load them memory-mapped onto a device, check them against what
//! a model expects, cast them in one graph, and save named tensors for PyTorch to read.
//!
//! ```
//! use coil_frontend::{safetensors, Tensor};
//! use coil_ir::DType;
//! use coil_runtime::Device;
//! # let path = std::env::temp_dir().join(format!("coil-doc-st-{}.safetensors", std::process::id()));
//! let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let b = Tensor::from_vec(vec![0i64, 1], &[2])?;
//! safetensors::save(&path, [("linear.weight", &w), ("linear.bias", &b)])?;
//!
//! let file = safetensors::WeightFile::open(&path)?;
//! assert_eq!(file.names(), ["linear.bias", "linear.weight"]);
//! file.check(&[("linear.weight", vec![2, 2], DType::F32), ("linear.bias", vec![2], DType::I64)])?;
//! let weights = file.load_prefix("linear.", Device::Cpu)?;
//! assert_eq!(weights["linear.weight"].to_vec::<f32>()?, [1.0, 2.0, 3.0, 4.0]);
//! let bf16 = safetensors::cast_all(weights.values(), DType::BF16)?; // one graph for all
//! # std::fs::remove_file(&path).unwrap();
//! # Ok::<(), coil_ir::Error>(())
//! ```
//!
//! The format (<https://github.com/huggingface/safetensors>): an 8-byte little-endian header
//! length, a JSON header (each tensor's dtype, shape and byte range; optional string metadata
//! under `__metadata__`), then the tensors' bytes, row-major and **little-endian**. coil copies
//! those bytes as they are into its buffers (and writes its buffers' bytes as they are), which is
//! right because coil builds only for little-endian targets (checked at compile time below).
//!
//! Loading maps the file (`memmap2`) and copies each tensor once: into a new host buffer on the
//! CPU, or straight from the mapped pages to device memory on CUDA. Every error names the file,
//! the tensor and what is wrong, with the user's `file:line`; loading several tensors checks
//! them all before the first is copied, and nothing is bound to a model here (a loader calls
//! [`WeightFile::check`] first), so a bad file never leaves a model half-loaded.

mod check;
mod header;
mod write;

pub use header::MAX_HEADER_BYTES;
pub use write::{save, save_with_metadata};

use crate::realize::realize;
use crate::storage::Storage;
use crate::tensor::Tensor;
use coil_ir::{DType, Error, ErrorKind, Result, TensorMeta};
use coil_runtime::cuda::{CudaBuffer, CudaDevice};
use coil_runtime::{Buffer, Device, HostData};
use header::Header;
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::panic::Location;
use std::path::{Path, PathBuf};
use std::sync::Arc;

// safetensors stores little-endian bytes, and coil's buffers hold native-endian elements that
// loading and saving copy byte for byte.
#[cfg(target_endian = "big")]
compile_error!(
    "coil reads and writes safetensors (little-endian) bytes as they are: big-endian targets are not supported"
);

/// One tensor's entry in a file's header.
///
/// ```
/// use coil_frontend::{safetensors::WeightFile, Tensor};
/// use coil_ir::DType;
/// # let path = std::env::temp_dir().join(format!("coil-doc-info-{}.safetensors", std::process::id()));
/// coil_frontend::safetensors::save(&path, [("w", &Tensor::ones(&[2, 3], DType::BF16))])?;
/// let info = WeightFile::open(&path)?.info("w").unwrap().clone();
/// assert_eq!((info.dtype, info.file_dtype, info.shape, info.data_offsets), (Some(DType::BF16), "BF16", vec![2, 3], (0, 12)));
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// coil's element type; `None` where coil has no such type (`U32`, `F8_E4M3`, ...): loading
    /// that tensor is an error of kind `Unsupported`.
    pub dtype: Option<DType>,
    /// The element type as the file names it (`"F32"`, `"BF16"`, `"U32"`).
    pub file_dtype: &'static str,
    /// The tensor's shape.
    pub shape: Vec<usize>,
    /// The tensor's bytes in the data section: `[begin, end)`.
    pub data_offsets: (usize, usize),
}

impl TensorInfo {
    /// The dtype for messages: coil's name (`f32`), or the file's with a note.
    fn dtype_text(&self) -> String {
        match self.dtype {
            Some(d) => d.to_string(),
            None => format!("{} (a dtype coil lacks)", self.file_dtype),
        }
    }
}

/// An open safetensors file: the memory map and its parsed, validated header.
///
/// Opening reads only the header; tensors are copied out when loaded. Like every memory-mapped
/// loader (PyTorch's, candle's), it assumes no other program rewrites the file in place while
/// it is open; coil's own [`save`] never does (it renames a new file over the old one).
///
/// ```
/// use coil_frontend::{safetensors::WeightFile, Tensor};
/// use coil_ir::DType;
/// # let path = std::env::temp_dir().join(format!("coil-doc-wf-{}.safetensors", std::process::id()));
/// let meta = [("format", "pt")];
/// coil_frontend::safetensors::save_with_metadata(&path, [("a", &Tensor::zeros(&[3], DType::F16))], meta)?;
/// let file = WeightFile::open(&path)?;
/// assert_eq!((file.len(), file.is_empty(), file.path()), (1, false, path.as_path()));
/// assert_eq!(file.tensors()["a"].shape, [3]);
/// assert_eq!(file.metadata()["format"], "pt");
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), coil_ir::Error>(())
/// ```
pub struct WeightFile {
    path: PathBuf,
    map: Mmap,
    header: Header,
}

impl fmt::Debug for WeightFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeightFile").field("path", &self.path).field("tensors", &self.header.tensors).finish()
    }
}

const OPEN: &str = "safetensors open";
const LOAD: &str = "safetensors load";

/// An error about the file at `path`, raised by `op`, at the user's line.
fn file_error(
    kind: ErrorKind,
    op: &str,
    path: &Path,
    message: impl fmt::Display,
    location: &'static Location<'static>,
) -> Error {
    Error::new(kind, format!("{}: {message}", path.display())).in_op(op, vec![]).at(location)
}

impl WeightFile {
    /// Opens and maps a safetensors file and validates its header (see the module doc). Errors:
    /// `Runtime` when the file cannot be opened or mapped; `Value` when it is truncated, its
    /// header is too large ([`MAX_HEADER_BYTES`]) or corrupt (bad JSON, unknown dtype, offsets
    /// out of range or overlapping, a byte range not matching dtype × shape).
    ///
    /// ```
    /// use coil_frontend::safetensors::WeightFile;
    /// let e = WeightFile::open("no/such/model.safetensors").unwrap_err();
    /// assert!(e.to_string().contains("no/such/model.safetensors: cannot open"), "{e}");
    /// ```
    #[track_caller]
    pub fn open(path: impl AsRef<Path>) -> Result<WeightFile> {
        let location = Location::caller();
        let path = path.as_ref();
        let fail = |kind, message: String| file_error(kind, OPEN, path, message, location);
        let file = File::open(path).map_err(|e| fail(ErrorKind::Runtime, format!("cannot open ({e})")))?;
        let is_file = file.metadata().map_err(|e| fail(ErrorKind::Runtime, format!("cannot read ({e})")))?.is_file();
        if !is_file {
            return Err(fail(ErrorKind::Runtime, "not a regular file".to_string()));
        }
        // SAFETY: the map is read-only and private to this value; its bytes change only if
        // another program rewrites the file in place while it is open, which the type's doc
        // rules out (as every memory-mapped loader must).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| fail(ErrorKind::Runtime, format!("cannot map ({e})")))?;
        let header = header::parse(&map).map_err(|e| fail(e.kind, e.message))?;
        Ok(WeightFile { path: path.to_path_buf(), map, header })
    }

    /// The path it was opened from.
    ///
    /// ```
    /// # use coil_frontend::safetensors::WeightFile;
    /// # let path = std::env::temp_dir().join(format!("coil-doc-path-{}.safetensors", std::process::id()));
    /// # coil_frontend::safetensors::save(&path, std::iter::empty::<(&str, coil_frontend::Tensor)>())?;
    /// assert_eq!(WeightFile::open(&path)?.path(), path);
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensors' names, sorted.
    ///
    /// ```
    /// # use coil_frontend::{safetensors::WeightFile, Tensor};
    /// # let path = std::env::temp_dir().join(format!("coil-doc-names-{}.safetensors", std::process::id()));
    /// # let t = Tensor::from_vec(vec![1u8], &[1])?;
    /// coil_frontend::safetensors::save(&path, [("b", &t), ("a", &t)])?;
    /// assert_eq!(WeightFile::open(&path)?.names(), ["a", "b"]);
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn names(&self) -> Vec<&str> {
        self.header.tensors.keys().map(String::as_str).collect()
    }

    /// Every tensor's header entry by name, sorted by name.
    ///
    /// ```
    /// # use coil_frontend::{safetensors::WeightFile, Tensor};
    /// # use coil_ir::DType;
    /// # let path = std::env::temp_dir().join(format!("coil-doc-tensors-{}.safetensors", std::process::id()));
    /// coil_frontend::safetensors::save(&path, [("w", &Tensor::ones(&[4, 2], DType::F32))])?;
    /// let file = WeightFile::open(&path)?;
    /// let shapes: Vec<(&String, &Vec<usize>)> = file.tensors().iter().map(|(n, t)| (n, &t.shape)).collect();
    /// assert_eq!(shapes, [(&"w".to_string(), &vec![4, 2])]);
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn tensors(&self) -> &BTreeMap<String, TensorInfo> {
        &self.header.tensors
    }

    /// One tensor's header entry, if the file has it.
    ///
    /// ```
    /// # use coil_frontend::{safetensors::WeightFile, Tensor};
    /// # use coil_ir::DType;
    /// # let path = std::env::temp_dir().join(format!("coil-doc-info2-{}.safetensors", std::process::id()));
    /// coil_frontend::safetensors::save(&path, [("w", &Tensor::ones(&[4], DType::I32))])?;
    /// let file = WeightFile::open(&path)?;
    /// assert_eq!(file.info("w").map(|t| t.dtype), Some(Some(DType::I32)));
    /// assert!(file.info("v").is_none());
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensors.get(name)
    }

    /// The number of tensors.
    ///
    /// ```
    /// # use coil_frontend::{safetensors::WeightFile, Tensor};
    /// # let path = std::env::temp_dir().join(format!("coil-doc-len-{}.safetensors", std::process::id()));
    /// coil_frontend::safetensors::save(&path, [("x", &Tensor::scalar(1.5f32))])?;
    /// assert_eq!(WeightFile::open(&path)?.len(), 1);
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.header.tensors.len()
    }

    /// True when the file holds no tensors.
    ///
    /// ```
    /// # use coil_frontend::{safetensors::WeightFile, Tensor};
    /// # let path = std::env::temp_dir().join(format!("coil-doc-empty-{}.safetensors", std::process::id()));
    /// coil_frontend::safetensors::save(&path, std::iter::empty::<(&str, Tensor)>())?;
    /// assert!(WeightFile::open(&path)?.is_empty());
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.header.tensors.is_empty()
    }

    /// The file's string metadata (`__metadata__`; empty when it has none), sorted by key.
    ///
    /// ```
    /// # use coil_frontend::{safetensors::WeightFile, Tensor};
    /// # let path = std::env::temp_dir().join(format!("coil-doc-meta-{}.safetensors", std::process::id()));
    /// # let t = Tensor::scalar(1i32);
    /// coil_frontend::safetensors::save_with_metadata(&path, [("t", &t)], [("step", "100")])?;
    /// assert_eq!(WeightFile::open(&path)?.metadata().get("step").map(String::as_str), Some("100"));
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.header.metadata
    }

    /// Loads one tensor onto `device`, in the file's dtype, as a computed tensor. Errors name
    /// the file and the tensor: `Value` when there is no such tensor (with the closest name, if
    /// one is close), `Unsupported` for a dtype coil lacks, `Runtime` when the device fails.
    ///
    /// ```
    /// # use coil_frontend::{safetensors::WeightFile, Tensor};
    /// # use coil_runtime::Device;
    /// # let path = std::env::temp_dir().join(format!("coil-doc-load-{}.safetensors", std::process::id()));
    /// # coil_frontend::safetensors::save(&path, [("wte.weight", &Tensor::from_vec(vec![1.0f32, 2.0], &[2])?)])?;
    /// let file = WeightFile::open(&path)?;
    /// let wte = file.load("wte.weight", Device::Cpu)?;
    /// assert!(wte.is_realized());
    /// let e = file.load("wpe.weight", Device::Cpu).unwrap_err();
    /// assert!(e.to_string().contains("no tensor 'wpe.weight' (did you mean 'wte.weight'?)"), "{e}");
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn load(&self, name: &str, device: Device) -> Result<Tensor> {
        let location = Location::caller();
        let Some(info) = self.header.tensors.get(name) else {
            let hint = check::suggest(name, self.header.tensors.keys().map(String::as_str))
                .map(|s| format!(" (did you mean '{s}'?)"))
                .unwrap_or_default();
            let message = format!("no tensor '{name}'{hint}; the file has {}", self.summary());
            return Err(file_error(ErrorKind::Value, LOAD, &self.path, message, location));
        };
        self.load_entry(name, info, device, location)
    }

    /// Loads every tensor onto `device`, by name. A tensor of a dtype coil lacks is an error
    /// (naming each such tensor) before anything is loaded.
    ///
    /// ```
    /// # use coil_frontend::{safetensors::WeightFile, Tensor};
    /// # use coil_runtime::Device;
    /// # let path = std::env::temp_dir().join(format!("coil-doc-all-{}.safetensors", std::process::id()));
    /// # let t = Tensor::from_vec(vec![true, false], &[2])?;
    /// # coil_frontend::safetensors::save(&path, [("mask", &t), ("other", &t)])?;
    /// let all = WeightFile::open(&path)?.load_all(Device::Cpu)?;
    /// assert_eq!(all.keys().collect::<Vec<_>>(), ["mask", "other"]);
    /// assert_eq!(all["mask"].to_vec::<bool>()?, [true, false]);
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn load_all(&self, device: Device) -> Result<BTreeMap<String, Tensor>> {
        self.load_entries(self.header.tensors.iter().collect(), device, Location::caller())
    }

    /// Loads every tensor whose name starts with `prefix` (`"h.0."`: the first block's
    /// weights), keyed by their full names. No tensor under the prefix is an error (a typo
    /// must not load nothing silently), with a close prefix the file has, if any.
    ///
    /// ```
    /// # use coil_frontend::{safetensors::WeightFile, Tensor};
    /// # use coil_ir::DType;
    /// # use coil_runtime::Device;
    /// # let path = std::env::temp_dir().join(format!("coil-doc-prefix-{}.safetensors", std::process::id()));
    /// # let t = Tensor::zeros(&[2], DType::F32);
    /// # coil_frontend::safetensors::save(&path, [("transformer.h.0.ln_1.weight", &t), ("transformer.h.1.ln_1.weight", &t)])?;
    /// let file = WeightFile::open(&path)?;
    /// let block0 = file.load_prefix("transformer.h.0.", Device::Cpu)?;
    /// assert_eq!(block0.keys().collect::<Vec<_>>(), ["transformer.h.0.ln_1.weight"]);
    /// let e = file.load_prefix("h.0.", Device::Cpu).unwrap_err();
    /// assert!(e.to_string().contains("did you mean 'transformer.h.0.'?"), "{e}");
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn load_prefix(&self, prefix: &str, device: Device) -> Result<BTreeMap<String, Tensor>> {
        let location = Location::caller();
        let entries: Vec<(&String, &TensorInfo)> = self
            .header
            .tensors
            .range::<str, _>((std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded))
            .take_while(|(name, _)| name.starts_with(prefix))
            .collect();
        if entries.is_empty() {
            let hint = check::suggest_prefix(prefix, self.header.tensors.keys().map(String::as_str))
                .map(|s| format!(" (did you mean '{s}'?)"))
                .unwrap_or_default();
            let message = format!("no tensor's name starts with '{prefix}'{hint}; the file has {}", self.summary());
            return Err(file_error(ErrorKind::Value, LOAD, &self.path, message, location));
        }
        self.load_entries(entries, device, location)
    }

    /// Loads `entries` after checking that coil has all their dtypes.
    fn load_entries(
        &self,
        entries: Vec<(&String, &TensorInfo)>,
        device: Device,
        location: &'static Location<'static>,
    ) -> Result<BTreeMap<String, Tensor>> {
        let unsupported: Vec<String> = entries
            .iter()
            .filter(|(_, t)| t.dtype.is_none())
            .map(|(n, t)| format!("'{n}' ({})", t.file_dtype))
            .collect();
        if !unsupported.is_empty() {
            let message = format!(
                "{} of dtypes coil lacks: {}; coil has {}",
                plural(unsupported.len(), "tensor"),
                unsupported.join(", "),
                coil_dtypes()
            );
            return Err(file_error(ErrorKind::Unsupported, LOAD, &self.path, message, location));
        }
        entries
            .into_iter()
            .map(|(name, info)| Ok((name.clone(), self.load_entry(name, info, device, location)?)))
            .collect()
    }

    /// Copies one tensor's bytes out of the map onto `device`: once, into a new host buffer or
    /// straight to device memory.
    fn load_entry(
        &self,
        name: &str,
        info: &TensorInfo,
        device: Device,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let fail =
            |kind, message: String| file_error(kind, LOAD, &self.path, format!("tensor '{name}': {message}"), location);
        let Some(dtype) = info.dtype else {
            return Err(fail(
                ErrorKind::Unsupported,
                format!("dtype {} is not one coil has (coil has {})", info.file_dtype, coil_dtypes()),
            ));
        };
        let (begin, end) = info.data_offsets;
        let bytes = &self.map[self.header.data_start + begin..self.header.data_start + end];
        // Kernels read a bool as one byte that must be 0 or 1.
        if dtype == DType::Bool {
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Err(fail(
                    ErrorKind::Value,
                    format!("bool element {i} is byte {} (a bool is 0 or 1)", bytes[i]),
                ));
            }
        }
        let storage = match device {
            Device::Cpu => HostData::from_bytes(dtype, bytes)
                .and_then(|data| Buffer::new(info.shape.clone(), data))
                .map(|buffer| Storage::host(Arc::new(buffer))),
            Device::Cuda(ordinal) => CudaDevice::get(ordinal)
                .and_then(|cuda| CudaBuffer::from_bytes(&cuda, TensorMeta::new(info.shape.clone(), dtype), bytes))
                .map(|buffer| Storage::cuda(Arc::new(buffer))),
        }
        .map_err(|e| fail(e.kind, format!("cannot load onto {device}: {}", e.message)))?;
        Ok(Tensor::from_storage(storage))
    }

    /// "3 tensors: a, b, c" (the first few names), for not-found messages.
    fn summary(&self) -> String {
        const SHOWN: usize = 8;
        let names: Vec<String> = self.header.tensors.keys().take(SHOWN).map(|n| format!("'{n}'")).collect();
        let more = self.len().saturating_sub(SHOWN);
        let more = if more > 0 { format!(", ... ({more} more)") } else { String::new() };
        match self.len() {
            0 => "no tensors".to_string(),
            n => format!("{}: {}{more}", plural(n, "tensor"), names.join(", ")),
        }
    }
}

/// "1 tensor", "3 tensors".
fn plural(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// coil's dtypes, for messages: "bool, u8, ..., f64".
fn coil_dtypes() -> String {
    DType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
}

/// Loads every tensor of a safetensors file onto `device`: [`WeightFile::open`] then
/// [`WeightFile::load_all`] (the map is dropped once the tensors are copied out).
///
/// ```
/// use coil_frontend::{safetensors, Tensor};
/// use coil_runtime::Device;
/// # let path = std::env::temp_dir().join(format!("coil-doc-loadfn-{}.safetensors", std::process::id()));
/// safetensors::save(&path, [("w", &Tensor::from_vec(vec![1i16, -2], &[2])?)])?;
/// let weights = safetensors::load(&path, Device::Cpu)?;
/// assert_eq!(weights["w"].to_vec::<i16>()?, [1, -2]);
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn load(path: impl AsRef<Path>, device: Device) -> Result<BTreeMap<String, Tensor>> {
    WeightFile::open(path)?.load_all(device)
}

/// Casts every tensor to `dtype` and computes the casts together: one graph per device, so
/// one compile and one run for a whole model's weights (not one per tensor). A tensor already
/// of `dtype` is returned as it is, not copied. The results come in the input order.
///
/// ```
/// use coil_frontend::{safetensors, Tensor};
/// use coil_ir::DType;
/// let a = Tensor::from_vec(vec![1.5f32, -2.0], &[2])?;
/// let b = Tensor::from_vec(vec![3i64], &[1])?;
/// let c = Tensor::ones(&[2], DType::BF16);
/// let cast = safetensors::cast_all([&a, &b, &c], DType::BF16)?;
/// assert!(cast.iter().all(|t| t.is_realized() && t.dtype() == DType::BF16));
/// assert_eq!(cast[1].to_vec::<f32>()?, [3.0]);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn cast_all<'a>(tensors: impl IntoIterator<Item = &'a Tensor>, dtype: DType) -> Result<Vec<Tensor>> {
    let mut casts = vec![];
    for t in tensors {
        casts.push(t.to_dtype(dtype)?);
    }
    realize(&casts.iter().collect::<Vec<_>>())?;
    Ok(casts)
}

/// [`cast_all`] over a map of named tensors (as [`load`] returns): the same names, every tensor
/// of `dtype`, computed in one graph per device.
///
/// ```
/// use coil_frontend::{safetensors, Tensor};
/// use coil_ir::DType;
/// use std::collections::BTreeMap;
/// let weights = BTreeMap::from([("w".to_string(), Tensor::ones(&[2], DType::F32))]);
/// let half = safetensors::cast_map(&weights, DType::F16)?;
/// assert_eq!(half["w"].dtype(), DType::F16);
/// # Ok::<(), coil_ir::Error>(())
/// ```
#[track_caller]
pub fn cast_map(tensors: &BTreeMap<String, Tensor>, dtype: DType) -> Result<BTreeMap<String, Tensor>> {
    let cast = cast_all(tensors.values(), dtype)?;
    Ok(tensors.keys().cloned().zip(cast).collect())
}
