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
//! Loaded code is small, and the table means one cache key is opened once, however many graphs
//! share it. (It began as a guard: when kernels ran on OpenMP's threads, closing the last
//! library built with `-fopenmp` unmapped libgomp under its idle workers.)
//!
//! **What is loaded is what was checked.** The cache entry's bytes are read once and verified
//! (`crate::cache_entry`); those bytes are written to a private file (a name no other process
//! uses, created here), `dlopen`ed, and the file is removed. Loading the cache file itself
//! would check one file and map another whenever the entry is replaced between the check and
//! the `dlopen` (a concurrent process rebuilding it, a user copying files about); a shared
//! object cannot carry the entry's header in front of it either. The private copy sits in the
//! cache directory, where shared objects are known to be loadable (a temp dir may be `noexec`;
//! it serves only when the cache directory takes no new files).
//! Its removal leaves the mapping (and so the inode) alive, since libraries are never closed:
//! a later private copy can never share its inode, which `dlopen` would take for the same
//! library.

use super::compiler::{CCompiler, CompiledObject};
use crate::cache_entry;
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
    /// Opens the shared object `library`, the verified bytes of the cache entry `object`
    /// (through a private copy: see the module doc), or returns the one already open for its
    /// key. All its symbols are resolved now (`RTLD_NOW`), so a library with an undefined
    /// reference fails here rather than at the first call.
    pub fn load(object: &CompiledObject, library: &[u8]) -> Result<KernelLibrary> {
        static LOADED: Mutex<Option<HashMap<String, Arc<libloading::Library>>>> = Mutex::new(None);
        let path = object.path.clone();
        let mut table = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        let table = table.get_or_insert_with(HashMap::new);
        if let Some(lib) = table.get(&object.key) {
            return Ok(KernelLibrary { lib: lib.clone(), path });
        }
        let failed =
            |e: &dyn std::fmt::Display| Error::runtime(format!("cannot load compiled kernels {}: {e}", path.display()));
        let private = write_private_copy(&object.path, library).map_err(|e| failed(&e))?;
        // SAFETY: the library is one we built from generated C (its bytes checked against the
        // entry's checksum): it has no initialisers beyond the C runtime's and OpenMP's, which
        // are safe to run at any time.
        let lib = unsafe { open(&private) }.map_err(|e| failed(&format!("{e} (through {})", private.display())));
        let _ = std::fs::remove_file(&private);
        let lib = Arc::new(lib?);
        table.insert(object.key.clone(), lib.clone());
        Ok(KernelLibrary { lib, path })
    }

    /// The cache entry it was loaded from.
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

/// Writes `library` to a new file of a name no one else uses, beside `entry` (or, where its
/// directory takes no new files, in the temp dir), and returns its path.
fn write_private_copy(entry: &Path, library: &[u8]) -> std::io::Result<PathBuf> {
    let write = |path: PathBuf| {
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?;
        std::io::Write::write_all(&mut file, library).inspect_err(|_| {
            let _ = std::fs::remove_file(&path);
        })?;
        Ok(path)
    };
    write(cache_entry::temp_name(entry, "load")).or_else(|_: std::io::Error| {
        write(cache_entry::temp_name(&std::env::temp_dir().join(entry.file_name().unwrap_or_default()), "load"))
    })
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

/// The loaded shared object of cache key `key` (a [`CCompiler::cache_key`]) in `cache_dir`,
/// with every symbol of `kernels` checked present, without its source: `None` when the cache
/// has no valid entry for the key or it does not load (the caller then compiles the source,
/// which reports and replaces an invalid entry). The graph cache loads kernels this way.
pub fn load_cached(key: &str, cache_dir: &Path, kernels: &[&str]) -> Option<(KernelLibrary, CompiledObject)> {
    let object = CompiledObject::cached(cache_dir, key);
    let cache_entry::Lookup::Found(library) = cache_entry::read(&object.path, cache_entry::Kind::SharedObject, key)
    else {
        return None;
    };
    let lib = KernelLibrary::load(&object, &library).ok()?;
    kernels.iter().all(|name| lib.kernel(name).is_ok()).then_some((lib, object))
}

/// The loaded shared object for `source`, compiled through the cache, with every symbol of
/// `kernels` checked present. A verified cached entry that still fails to load (one written
/// wrong: its bytes are the ones that were stored) is logged and rebuilt once; a fresh build
/// that fails so is an error.
pub fn load_or_build(
    compiler: &CCompiler,
    source: &str,
    cache_dir: &Path,
    kernels: &[&str],
) -> Result<(KernelLibrary, CompiledObject)> {
    let (library, object) = compiler.compile(source, cache_dir)?;
    let attempt = |library: &[u8], object: &CompiledObject| -> Result<KernelLibrary> {
        let lib = KernelLibrary::load(object, library)?;
        for name in kernels {
            lib.kernel(name)?;
        }
        Ok(lib)
    };
    match attempt(&library, &object) {
        Ok(lib) => Ok((lib, object)),
        Err(e) if object.cache_hit => {
            // A library that opened but lacks a kernel stays open under its key (see the
            // module doc), so only one that failed to open is really replaced in this process;
            // with keys hashing the source, that is the case that happens.
            let why = format!("it does not load: {}", e.message);
            cache_entry::log_invalid(&object.path, &why);
            let (library, object) = compiler.rebuild(source, cache_dir, why)?;
            Ok((attempt(&library, &object)?, object))
        }
        Err(e) => Err(e),
    }
}
