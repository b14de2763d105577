//! Loading compiled kernels: a shared object opened with `libloading`, and its kernel functions.
//!
//! Every generated kernel has the C signature `void NAME(char *const *args, int64_t *status)`
//! (see `docs/compiler.md`): `args` holds the buffer pointers, then a pointer to the `int64_t`
//! values of the size symbols the kernel reads (`TileKernel::sizes`; never read by a kernel
//! without any, so the runtime always passes it). A [`Kernel`] holds its function pointer together with a reference
//! count on the [`libloading::Library`], so the code stays mapped for as long as any kernel of
//! it can still be called.
//!
//! Libraries are in fact never closed: a process-wide table keeps each one open once loaded.
//! Closing a library built with `-fopenmp` would drop the last reference to libgomp and unmap
//! it while its idle worker threads still run its code (they crash). Loaded code is small, and
//! the table also means one path is opened once, however many graphs share it.

use super::compiler::{CCompiler, CompiledObject};
use coil_ir::{Error, Result};
use std::collections::HashMap;
use std::ffi::c_char;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The C ABI of a generated kernel: the argument pointers, in `TileKernel::args` order followed
/// by a pointer to the `TileKernel::sizes` values (`int64_t`), and a zeroed `int64_t[4]` status
/// the kernel fills on a data error.
pub type KernelFn = unsafe extern "C" fn(args: *const *mut c_char, status: *mut i64);

/// An opened shared object of kernels.
#[derive(Clone, Debug)]
pub struct KernelLibrary {
    lib: Arc<libloading::Library>,
    path: PathBuf,
}

/// One kernel function of a [`KernelLibrary`]; it keeps the library loaded.
#[derive(Clone, Debug)]
pub struct Kernel {
    name: String,
    func: KernelFn,
    _lib: Arc<libloading::Library>,
}

impl KernelLibrary {
    /// Opens a shared object. All its symbols are resolved now (`RTLD_NOW`), so a library with
    /// an undefined reference fails here rather than at the first call.
    pub fn load(path: &Path) -> Result<KernelLibrary> {
        static LOADED: Mutex<Option<HashMap<PathBuf, Arc<libloading::Library>>>> = Mutex::new(None);
        let mut table = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        let table = table.get_or_insert_with(HashMap::new);
        if let Some(lib) = table.get(path) {
            return Ok(KernelLibrary { lib: lib.clone(), path: path.to_path_buf() });
        }
        // SAFETY: the library is one we built from generated C: it has no initialisers beyond
        // the C runtime's and OpenMP's, which are safe to run at any time.
        let lib = unsafe { open(path) }
            .map_err(|e| Error::runtime(format!("cannot load compiled kernels {}: {e}", path.display())))?;
        let lib = Arc::new(lib);
        table.insert(path.to_path_buf(), lib.clone());
        Ok(KernelLibrary { lib, path: path.to_path_buf() })
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Looks up the kernel `name`, which must have the signature [`KernelFn`].
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        // SAFETY: the symbol's type is the generated kernels' ABI; the copied-out pointer stays
        // valid because the `Kernel` holds the library.
        let func = unsafe { self.lib.get::<KernelFn>(name.as_bytes()).map(|s| *s) }
            .map_err(|e| Error::runtime(format!("kernel {name} is not in {}: {e}", self.path.display())))?;
        Ok(Kernel { name: name.to_string(), func, _lib: self.lib.clone() })
    }
}

impl Kernel {
    /// The kernel's symbol name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Calls the kernel.
    ///
    /// # Safety
    /// `args` must point to live buffers of the sizes and dtypes the kernel was generated for,
    /// the written ones not aliased by anything else in use, followed (for a kernel that reads
    /// size symbols) by a pointer to their values, which the buffer sizes must agree with.
    pub unsafe fn call(&self, args: &[*mut u8], status: &mut [i64; 4]) {
        (self.func)(args.as_ptr() as *const *mut c_char, status.as_mut_ptr())
    }
}

#[cfg(unix)]
unsafe fn open(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    Library::open(Some(path), RTLD_NOW | RTLD_LOCAL).map(Into::into)
}

#[cfg(not(unix))]
unsafe fn open(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    libloading::Library::new(path)
}

/// The loaded shared object for `source`, compiled through the cache, with every symbol of
/// `kernels` checked present. A cached entry that fails to load (a corrupt file the size checks
/// missed) is rebuilt once; a fresh build that fails so is an error.
pub fn load_or_build(
    compiler: &CCompiler,
    source: &str,
    cache_dir: &Path,
    kernels: &[&str],
) -> Result<(KernelLibrary, CompiledObject)> {
    let object = compiler.compile(source, cache_dir)?;
    let attempt = |object: &CompiledObject| -> Result<KernelLibrary> {
        let lib = KernelLibrary::load(&object.path)?;
        for name in kernels {
            lib.kernel(name)?;
        }
        Ok(lib)
    };
    match attempt(&object) {
        Ok(lib) => Ok((lib, object)),
        Err(_) if object.cache_hit => {
            // A library that opened but lacks a kernel stays open under its path (see the
            // module doc), so only a file that failed to open is really replaced in this
            // process; with keys hashing the source, that is the case that happens.
            let object = compiler.rebuild(source, cache_dir)?;
            Ok((attempt(&object)?, object))
        }
        Err(e) => Err(e),
    }
}
