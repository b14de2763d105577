//! Finding the CUDA libraries before `cudarc` touches them.
//!
//! `cudarc`'s `dynamic-loading` opens each library (`libcuda`, `libnvrtc`, `libcublasLt`) by
//! bare name on its first call and **panics** when the loader cannot find it. So nothing here
//! calls into `cudarc` before [`require`] has found the library: first by name through the
//! loader's own search (`LD_LIBRARY_PATH`, the `ldconfig` cache, the default directories), then
//! in the places CUDA usually lives (`$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda*`, pip's
//! `site-packages/nvidia/*/lib`, ...). A library found only at a full path is opened from there
//! and kept open for the life of the process: the dynamic loader then matches `cudarc`'s later
//! by-name open (`libnvrtc.so.13`, ...) against the loaded object's soname, so `cudarc` uses it
//! without searching. When nothing is found the error lists every place that was searched.

use coil_ir::{Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A CUDA library the backend needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CudaLib {
    /// The driver API (`libcuda.so.1`), installed with the NVIDIA driver.
    Driver,
    /// The run-time compiler (`libnvrtc.so.13`), part of the CUDA toolkit.
    Nvrtc,
    /// cuBLASLt (`libcublasLt.so.13`), part of the CUDA toolkit.
    CublasLt,
    /// cuDNN 9 (`libcudnn.so.9`): PyTorch's wheels (`site-packages/nvidia/cudnn/lib`), or
    /// installed beside the toolkit. Optional: convolutions decompose without it.
    Cudnn,
}

impl CudaLib {
    /// File names to try, most specific first. The versioned names are the sonames that
    /// `cudarc` (built for CUDA 13.0) also asks for, which is what makes pre-loading work.
    pub fn file_names(self) -> &'static [&'static str] {
        match self {
            CudaLib::Driver => &["libcuda.so.1", "libcuda.so"],
            CudaLib::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so"],
            CudaLib::CublasLt => &["libcublasLt.so.13", "libcublasLt.so"],
            CudaLib::Cudnn => &["libcudnn.so.9"],
        }
    }

    fn what(self) -> &'static str {
        match self {
            CudaLib::Driver => "the CUDA driver library",
            CudaLib::Nvrtc => "NVRTC (the CUDA run-time compiler)",
            CudaLib::CublasLt => "cuBLASLt",
            CudaLib::Cudnn => "cuDNN 9",
        }
    }
}

/// Outcome of a search, kept per library: the libraries found stay open in here for good.
type Found = std::result::Result<Option<libloading::Library>, String>;

/// Makes sure `lib` can be loaded, searching at most once per process. The error (also cached)
/// names the library and lists every place searched.
pub fn require(lib: CudaLib) -> Result<()> {
    static FOUND: Mutex<Option<HashMap<CudaLib, Found>>> = Mutex::new(None);
    let mut table = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    let table = table.get_or_insert_with(HashMap::new);
    let found = table.entry(lib).or_insert_with(|| {
        let found = find(lib.file_names(), &search_dirs()).map_err(|searched| not_found(lib, &searched))?;
        if lib == CudaLib::Cudnn {
            preload_cudnn_parts()?;
        }
        Ok(Some(found))
    });
    found.as_ref().map(|_| ()).map_err(|msg| Error::runtime(msg.clone()))
}

/// cuDNN 9 is a dispatcher (`libcudnn.so.9`) that opens its parts (`libcudnn_cnn.so.9`, the
/// engines, ...) by bare name when first needed: opened here from the dispatcher's directory
/// (found through `/proc/self/maps`), they are already loaded when it asks. A part that is
/// missing is left for cuDNN to report; `cudnnCnnVersionCheck` then fails with its status.
fn preload_cudnn_parts() -> std::result::Result<(), String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let Some(dir) = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libcudnn.so.9"))
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
    else {
        return Ok(());
    };
    for part in ["graph", "ops", "cnn", "heuristic", "engines_runtime_compiled", "engines_precompiled"] {
        let path = dir.join(format!("libcudnn_{part}.so.9"));
        if path.is_file() {
            // SAFETY: as in `find`: cuDNN's own libraries, which it would open itself.
            let lib = unsafe { open(&path) }.map_err(|e| format!("cuDNN: cannot open {}: {e}", path.display()))?;
            // Kept open for the life of the process, as the dispatcher is.
            std::mem::forget(lib);
        }
    }
    Ok(())
}

/// The "not found" message: what is missing, where it was looked for, and how to fix it.
fn not_found(lib: CudaLib, searched: &[String]) -> String {
    let what = if lib == CudaLib::Cudnn { "cuDNN convolutions are not available" } else { "CUDA is not available" };
    format!(
        "{what}: {} ({}) was not found. Searched: {}. Install the NVIDIA driver / \
         CUDA toolkit, or point LD_LIBRARY_PATH or CUDA_HOME at the directory holding it.",
        lib.what(),
        lib.file_names().join(" or "),
        searched.join("; ")
    )
}

/// Opens the first of `names` that the loader finds by name, else in one of `dirs`. On failure
/// returns the list of places searched, loader first.
pub fn find(names: &[&str], dirs: &[PathBuf]) -> std::result::Result<libloading::Library, Vec<String>> {
    let paths = coil_ir::config::current().cuda_paths.clone();
    let toolkits: Vec<String> = paths.toolkits.iter().map(|p| p.display().to_string()).collect();
    let mut searched = vec![
        format!(
            "the dynamic loader's path for {} (LD_LIBRARY_PATH={}, the ldconfig cache, /lib, /usr/lib)",
            names.join(", "),
            paths.loader_path.as_deref().unwrap_or("unset")
        ),
        format!(
            "the CUDA toolkits configured ($CUDA_HOME, $CUDA_PATH, $CUDA_ROOT: {}; their lib dirs below)",
            if toolkits.is_empty() { "none".to_string() } else { toolkits.join(", ") }
        ),
        "pip's site-packages/nvidia/*/lib and $CONDA_PREFIX/lib (those present below)".to_string(),
    ];
    for name in names {
        // SAFETY: the CUDA libraries' initialisers only set up their own state; opening them
        // is what `cudarc` would do on first use anyway.
        if let Ok(lib) = unsafe { open(Path::new(name)) } {
            return Ok(lib);
        }
    }
    for dir in dirs {
        searched.push(dir.display().to_string());
        for name in names {
            let path = dir.join(name);
            if path.is_file() {
                // SAFETY: as above.
                if let Ok(lib) = unsafe { open(&path) } {
                    return Ok(lib);
                }
            }
        }
    }
    Err(searched)
}

/// `RTLD_NOW | RTLD_GLOBAL`: global so that libraries `cudarc` opens later by name resolve
/// against it (NVRTC's builtins library, cuBLAS's internals), now so a broken library fails here.
#[cfg(unix)]
unsafe fn open(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL).map(Into::into)
}

#[cfg(not(unix))]
unsafe fn open(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    libloading::Library::new(path)
}

/// Directories to look in after the loader's own path, in order, existing or not (the error
/// lists them all, so a user sees what was expected): the configuration's
/// ([`coil_ir::config::CudaPaths`]) and the usual places.
pub fn search_dirs() -> Vec<PathBuf> {
    let paths = coil_ir::config::current().cuda_paths.clone();
    let mut dirs = Vec::new();
    for root in &paths.toolkits {
        dirs.extend(toolkit_lib_dirs(root));
    }
    let mut roots = vec![PathBuf::from("/usr/local/cuda")];
    roots.extend(matching(Path::new("/usr/local"), |n| n.starts_with("cuda-") || n.starts_with("cuda_")));
    roots.push(PathBuf::from("/opt/cuda"));
    for root in roots {
        dirs.extend(toolkit_lib_dirs(&root));
    }
    // Where drivers put libcuda: containers (the NVIDIA runtime), distributions, WSL.
    for dir in [
        "/usr/local/nvidia/lib64",
        "/usr/local/nvidia/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib/wsl/lib",
    ] {
        dirs.push(PathBuf::from(dir));
    }
    // pip's wheels (nvidia-cuda-nvrtc, nvidia-cublas, ...): site-packages/nvidia/<pkg>/lib.
    for site in site_packages(&paths.python_prefixes) {
        for pkg in matching(&site.join("nvidia"), |_| true) {
            dirs.push(pkg.join("lib"));
        }
    }
    if let Some(conda) = &paths.conda_prefix {
        dirs.push(conda.join("lib"));
    }
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

fn toolkit_lib_dirs(root: &Path) -> [PathBuf; 3] {
    [root.join("targets/x86_64-linux/lib"), root.join("lib64"), root.join("lib")]
}

/// Python package directories: those under `prefixes` (the active virtual environment's, the
/// user's), then the system's.
fn site_packages(prefixes: &[PathBuf]) -> Vec<PathBuf> {
    let mut prefixes = prefixes.to_vec();
    prefixes.extend(["/usr/local/lib", "/usr/lib", "/opt/conda/lib"].map(PathBuf::from));
    let mut out = Vec::new();
    for prefix in prefixes {
        for py in matching(&prefix, |n| n.starts_with("python3")) {
            out.push(py.join("site-packages"));
            out.push(py.join("dist-packages"));
        }
    }
    out
}

/// Entries of `dir` whose names pass `keep`, sorted (none when `dir` cannot be read).
fn matching(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<PathBuf> =
        entries.flatten().filter(|e| e.file_name().to_str().is_some_and(&keep)).map(|e| e.path()).collect();
    out.sort();
    out
}
