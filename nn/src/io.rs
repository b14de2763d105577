//! Saving and loading parameters and optimizer state as safetensors files, by name.
//!
//! Loading checks the whole file against the store first (every missing, unexpected, misshapen
//! or mistyped tensor in one error) and binds nothing until every tensor is loaded, so a bad
//! file never leaves a model half-loaded. A rename function maps a checkpoint's names to the
//! store's (Hugging Face's `transformer.` prefix, buffers to skip), and tensors of another
//! floating dtype can be cast on the way in, all in one graph.

use crate::optim::Optimizer;
use crate::param::ParamStore;
use coil_frontend::safetensors::{self, WeightFile};
use coil_frontend::Tensor;
use coil_ir::{Error, ErrorKind, Result};
use std::collections::BTreeMap;
use std::panic::Location;
use std::path::Path;

/// The store's name for a file's tensor, or `None` to skip it.
pub type Rename<'a> = &'a dyn Fn(&str) -> Option<String>;

/// How [`ParamStore::load_with`] reads a file.
#[derive(Clone, Copy, Default)]
pub struct LoadOptions<'a> {
    /// The store's name for a file's tensor, or `None` to skip it; the names as they are when
    /// unset.
    pub rename: Option<Rename<'a>>,
    /// Cast floating tensors whose dtype differs from their parameter's (in one graph), instead
    /// of reporting the difference.
    pub cast: bool,
    /// Let parameters the file lacks keep their values, instead of reporting them.
    pub allow_missing: bool,
}

impl ParamStore {
    /// Saves every parameter under its name, with `metadata` (strings), to a safetensors file
    /// PyTorch's `safetensors.torch.load_file` reads (written atomically).
    ///
    /// ```
    /// use coil_nn::{Init, ParamStore};
    /// use coil_ir::DType;
    /// # let path = std::env::temp_dir().join(format!("coil-doc-store-{}.safetensors", std::process::id()));
    /// let a = ParamStore::new();
    /// a.root(coil_runtime::Device::Cpu, DType::F32).param("w", &[2], Init::Const(3.0))?;
    /// a.save(&path, &[("step", "7")])?;
    /// let b = ParamStore::new();
    /// let w = b.root(coil_runtime::Device::Cpu, DType::F32).param("w", &[2], Init::Zeros)?;
    /// b.load(&path)?;
    /// assert_eq!(w.tensor().to_vec::<f32>()?, vec![3.0, 3.0]);
    /// # std::fs::remove_file(&path).unwrap();
    /// # Ok::<(), coil_ir::Error>(())
    /// ```
    #[track_caller]
    pub fn save(&self, path: impl AsRef<Path>, metadata: &[(&str, &str)]) -> Result<()> {
        let params = self.params();
        let tensors: Vec<(String, Tensor)> = params.iter().map(|p| (p.name().to_string(), p.tensor())).collect();
        safetensors::save_with_metadata(path, tensors, metadata.iter().copied())
    }

    /// Loads every parameter from a file holding exactly the store's names, shapes and dtypes.
    #[track_caller]
    pub fn load(&self, path: impl AsRef<Path>) -> Result<()> {
        self.load_with(path, &LoadOptions::default()).map(|_| ())
    }

    /// Loads parameters from a file as `options` say; returns the file's metadata.
    #[track_caller]
    pub fn load_with(&self, path: impl AsRef<Path>, options: &LoadOptions) -> Result<BTreeMap<String, String>> {
        let location = Location::caller();
        let file = WeightFile::open(path.as_ref()).map_err(|e| e.at(location))?;
        let rename = |name: &str| match options.rename {
            Some(f) => f(name),
            None => Some(name.to_string()),
        };
        // The file's tensor for each parameter, and every problem, before loading anything.
        let mut source: BTreeMap<String, String> = BTreeMap::new();
        let mut problems: Vec<String> = Vec::new();
        for name in file.names() {
            match rename(name) {
                Some(n) if self.get(&n).is_none() => problems.push(format!("unexpected: '{name}'")),
                Some(n) => {
                    if let Some(earlier) = source.insert(n.clone(), name.to_string()) {
                        problems.push(format!("'{earlier}' and '{name}' both load '{n}'"));
                    }
                }
                None => {}
            }
        }
        let params = self.params();
        for p in &params {
            let Some(info) = source.get(p.name()).and_then(|f| file.info(f)) else {
                if !options.allow_missing {
                    problems.push(format!("missing: '{}'", p.name()));
                }
                continue;
            };
            if info.shape != p.shape() {
                problems.push(format!(
                    "shape mismatch: '{}' is {:?} in the file, {:?} expected",
                    p.name(),
                    info.shape,
                    p.shape()
                ));
            }
            match info.dtype {
                Some(d) if d == p.dtype() || (options.cast && d.is_float() && p.dtype().is_float()) => {}
                Some(d) => {
                    problems.push(format!("dtype mismatch: '{}' is {d} in the file, {} expected", p.name(), p.dtype()))
                }
                None => problems.push(format!("'{}' has dtype {}, which coil lacks", p.name(), info.file_dtype)),
            }
        }
        if !problems.is_empty() {
            let message = format!("{} does not fit the model: {}", file.path().display(), problems.join("; "));
            return Err(Error::new(ErrorKind::Value, message).in_op("ParamStore::load", vec![]).at(location));
        }

        let mut loaded: Vec<(usize, Tensor)> = Vec::new();
        for (i, p) in params.iter().enumerate() {
            if let Some(f) = source.get(p.name()) {
                loaded.push((i, file.load(f, p.device()).map_err(|e| e.at(location))?));
            }
        }
        // Casts where the dtypes differ: one graph for them all.
        let casts: Vec<Tensor> = loaded.iter().map(|(i, t)| t.to_dtype(params[*i].dtype())).collect::<Result<_>>()?;
        coil_frontend::realize(&casts.iter().collect::<Vec<_>>()).map_err(|e| e.at(location))?;
        for ((i, _), t) in loaded.iter().zip(casts) {
            // A cast's result keeps the cast in its history: bind a fresh handle.
            params[*i].set(t.detach()?)?;
        }
        Ok(file.metadata().clone())
    }
}

/// Saves an optimizer's state (moments, momentum buffers) and its step count.
#[track_caller]
pub fn save_optimizer(optimizer: &dyn Optimizer, path: impl AsRef<Path>) -> Result<()> {
    let steps = optimizer.steps().to_string();
    safetensors::save_with_metadata(path, optimizer.state(), [("steps", steps.as_str())])
}

/// Restores an optimizer's state and step count saved by [`save_optimizer`].
#[track_caller]
pub fn load_optimizer(optimizer: &mut dyn Optimizer, path: impl AsRef<Path>) -> Result<()> {
    let location = Location::caller();
    let file = WeightFile::open(path.as_ref()).map_err(|e| e.at(location))?;
    let device = optimizer.params().first().map_or(coil_runtime::Device::Cpu, |p| p.device());
    let state: Vec<(String, Tensor)> = file.load_all(device).map_err(|e| e.at(location))?.into_iter().collect();
    let steps = file.metadata().get("steps").and_then(|s| s.parse::<u64>().ok()).ok_or_else(|| {
        Error::new(ErrorKind::Value, format!("{}: no step count in the metadata", file.path().display()))
            .in_op("load_optimizer", vec![])
            .at(location)
    })?;
    optimizer.load_state(&state, steps).map_err(|e| e.at(location))
}
