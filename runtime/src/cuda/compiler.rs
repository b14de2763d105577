//! NVRTC and the driver's PTX assembler: kernel sources to a CUBIN for the device's own
//! architecture, cached on disk, and loading it.
//!
//! One CUDA C translation unit (a kernel, or several) becomes one CUBIN, compiled with
//! `--gpu-architecture=sm_XY --std=c++17 -default-device -minimal` for the device's compute
//! capability. One PTX module (`coil_codegen::cuda::ptx`) becomes one CUBIN through the
//! driver's linker (`cuLinkAddData` of the PTX, `cuLinkComplete`): the same ptxas NVRTC ends
//! with, without NVRTC's front end and NVVM. A CUBIN (not PTX) is cached, so a cache hit costs
//! no compilation at all. Entries are keyed by a 128-bit FNV-1a hash of the source, the
//! architecture, the compiler's version (NVRTC's, or the driver's for PTX) and the options, as
//! the C backend's cache is (same directory root):
//!
//! ```text
//! <cache dir>/cuda/<key>.cu            the source, kept for humans (and for compile errors); .ptx for PTX
//! <cache dir>/cuda/<key>.cubin.entry   the CUBIN, as a verified cache entry
//! ```
//!
//! The entry carries its key and a checksum of the CUBIN ([`crate::cache_entry`], as the C
//! backend's): one that is empty, truncated, damaged or another key's is logged and rebuilt,
//! never loaded; the CUBIN loaded is the bytes that were checked. Files are written under a
//! private temporary name and renamed into place. A verified entry that the driver still
//! refuses (another driver's, say) is logged and rebuilt once.

use super::device::{driver_error, CudaDevice};
use super::loader::{require, CudaLib};
use crate::cache_entry::{self, Kind};
use coil_codegen::cuda::Language;
use coil_ir::{Error, Result};
use cudarc::driver::{result as drv, sys};
use cudarc::nvrtc::{result as rtc, sys as rtc_sys};
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Bumped when the way entries are built changes, so stale entries are never reused.
const CACHE_FORMAT: &str = "coil-cuda-cache-v2";

/// Options besides the architecture. `-minimal` leaves out what generated kernels never use
/// (textures, surfaces, the device runtime API) and with it most of NVRTC's built-in headers:
/// on the H100 machine, cold compiles of the whole prelude with an empty kernel took 119 ms
/// without it and 96 ms with it (an empty source alone: 30 and 24 ms).
/// (`-minimal` needs NVRTC 12.4 or later; older ones get the rest.)
const OPTIONS: [&str; 3] = ["--std=c++17", "-default-device", "-minimal"];

/// The options this NVRTC takes (see [`OPTIONS`]), then the configuration's `nvrtc_options`
/// (`COIL_NVRTC_OPTIONS`, for measuring; they are part of the cache key).
fn options(nvrtc: (i32, i32)) -> Vec<String> {
    let fixed = if nvrtc >= (12, 4) { &OPTIONS[..] } else { &OPTIONS[..2] };
    let extra = coil_ir::config::current().tuning.nvrtc_options.clone();
    fixed.iter().map(|s| s.to_string()).chain(extra).collect()
}

/// Where a translation unit's CUBIN lies, and what producing it cost.
#[derive(Clone, Debug, PartialEq)]
pub struct CompiledCubin {
    /// `<cache dir>/cuda/<key>.cubin.entry`.
    pub path: PathBuf,
    /// `<cache dir>/cuda/<key>.cu`.
    pub source_path: PathBuf,
    /// The 32-hex-digit cache key.
    pub key: String,
    /// The architecture compiled for, e.g. `sm_90`.
    pub arch: String,
    /// True when the CUBIN was already in the cache.
    pub cache_hit: bool,
    /// Seconds NVRTC (or the PTX assembler) ran (0 on a cache hit).
    pub compile_seconds: f64,
    /// Seconds `cuModuleLoadData` and the function look-ups took ([`load_or_build`]; 0 until
    /// loaded).
    pub load_seconds: f64,
    /// Why the cached entry was not used and the CUBIN was compiled again (it was damaged,
    /// another key's, or the driver refused it); `None` on a hit or a plain miss.
    pub rebuilt_because: Option<String>,
}

/// NVRTC's version `(major, minor)`; fails (without panicking) when NVRTC cannot be loaded.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    static VERSION: OnceLock<std::result::Result<(i32, i32), String>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            require(CudaLib::Nvrtc).map_err(|e| e.message)?;
            let (mut major, mut minor) = (0, 0);
            // SAFETY: two out-pointers to live integers; NVRTC was found above.
            unsafe { rtc_sys::nvrtcVersion(&mut major, &mut minor) }
                .result()
                .map_err(|e| format!("nvrtcVersion failed: {e}"))?;
            Ok((major, minor))
        })
        .clone()
        .map_err(Error::runtime)
}

/// The cache key of `source` compiled for `arch` by this NVRTC.
pub fn cache_key(source: &str, arch: &str, nvrtc: (i32, i32)) -> String {
    let version = format!("{}.{}", nvrtc.0, nvrtc.1);
    cache_entry::key(&[CACHE_FORMAT, arch, &version, &options(nvrtc).join(" "), source])
}

/// The cache key of PTX `source` assembled for `arch` at optimization `level` by the driver
/// of version `driver`.
fn ptx_cache_key(source: &str, arch: &str, driver: i32, level: u32) -> String {
    cache_entry::key(&[CACHE_FORMAT, arch, "ptx", &format!("driver {driver}"), &format!("O{level}"), source])
}

/// The driver's CUDA version (`13000` for 13.0), asked once.
pub fn driver_version() -> Result<i32> {
    static VERSION: OnceLock<i32> = OnceLock::new();
    if let Some(&v) = VERSION.get() {
        return Ok(v);
    }
    let mut v = 0;
    // SAFETY: one out-pointer to a live integer; the driver is loaded (a device exists).
    unsafe { sys::cuDriverGetVersion(&mut v) }.result().map_err(|e| driver_error("cuDriverGetVersion", e))?;
    Ok(*VERSION.get_or_init(|| v))
}

/// The CUBIN for `source` on `arch`, from `cache_dir` when a valid entry for its key is there,
/// else compiled (and stored); an invalid entry is logged and rebuilt
/// ([`CompiledCubin::rebuilt_because`]). Returns its bytes too. A compile error carries NVRTC's
/// log and the path of the kept source.
pub fn compile(source: &str, arch: &str, cache_dir: &Path) -> Result<(Vec<u8>, CompiledCubin)> {
    compile_as(source, Language::CudaC, arch, cache_dir)
}

/// [`compile`] of a source in `language`. PTX needs the device's context bound on this thread
/// (the driver assembles it).
pub fn compile_as(source: &str, language: Language, arch: &str, cache_dir: &Path) -> Result<(Vec<u8>, CompiledCubin)> {
    through_cache(source, language, arch, cache_dir, None)
}

/// [`compile_as`], or with `rebuild_because` (why the cached entry was not used; the caller
/// logged it), compiled into the cache unconditionally, replacing the entry.
fn through_cache(
    source: &str,
    language: Language,
    arch: &str,
    cache_dir: &Path,
    rebuild_because: Option<String>,
) -> Result<(Vec<u8>, CompiledCubin)> {
    let dir = cache_dir.join("cuda");
    let key = match language {
        Language::CudaC => cache_key(source, arch, nvrtc_version()?),
        Language::Ptx { level } => ptx_cache_key(source, arch, driver_version()?, level),
    };
    let path = cache_entry::path(&dir, &key, Kind::Cubin);
    let source_path = dir.join(format!("{key}.{}", extension(language)));
    let mut compile_seconds = 0.0;
    let build = || {
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::runtime(format!("cannot create the kernel cache {}: {e}", dir.display())))?;
        cache_entry::write_atomically(&source_path, source.as_bytes())?;
        let start = Instant::now();
        let cubin = match language {
            Language::CudaC => nvrtc_cubin(source, arch, &source_path),
            Language::Ptx { level } => ptx_cubin(source, &source_path, level),
        };
        compile_seconds = start.elapsed().as_secs_f64();
        cubin
    };
    let fetched = match rebuild_because {
        None => cache_entry::fetch_or_build(&path, Kind::Cubin, &key, build)?,
        because => cache_entry::rebuild(&path, Kind::Cubin, &key, because, build)?,
    };
    let cache_entry::Fetched { payload, cache_hit, rebuilt_because } = fetched;
    let arch = arch.to_string();
    Ok((
        payload,
        CompiledCubin { path, source_path, key, arch, cache_hit, compile_seconds, load_seconds: 0.0, rebuilt_because },
    ))
}

fn extension(language: Language) -> &'static str {
    match language {
        Language::CudaC => "cu",
        Language::Ptx { .. } => "ptx",
    }
}

/// The module of template `source` (a CUDA C template of `coil_codegen::templates`) with only
/// the variants `kernels` ([`coil_codegen::templates::kernel_unit`]): compiled through the disk
/// cache the first time `device` needs that unit, then kept for the device's lifetime. A
/// template's every variant in one unit would cost a cold start seconds of NVRTC for kernels
/// the program never launches.
pub(crate) fn template_module(
    device: &Arc<CudaDevice>,
    source: &'static str,
    kernels: &[&str],
) -> Result<Arc<LoadedModule>> {
    let key = (source.as_ptr() as usize, kernels.join(","));
    let mut table = device.templates.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(module) = table.get(&key) {
        return Ok(module.clone());
    }
    let unit = coil_codegen::templates::kernel_unit(source, kernels);
    let (cubin, _) = compile(&unit, &device.arch(), &crate::cpu::default_cache_dir())?;
    let module = Arc::new(LoadedModule::load(device, &cubin)?);
    table.insert(key, module.clone());
    Ok(module)
}

/// Starts NVRTC and the driver's PTX assembler in the background, once per process, by
/// compiling an empty kernel with each for `device`: NVRTC's first compile loads and
/// initialises the library (about 0.1 s on the H100 machine), and the assembler sets up once
/// per thread (15 ms for an empty module on a fresh thread, 8 ms after), so every thread of
/// rayon's pool, where graphs compile, assembles one. This then overlaps whatever the program
/// does before its first graph compiles instead of adding to that compile. Failures are
/// ignored (the real compile reports them).
pub fn warm_up(device: &Arc<CudaDevice>) {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let (dev, arch) = (device.clone(), device.arch());
        std::thread::spawn(move || {
            if nvrtc_version().is_ok() {
                let source = coil_codegen::templates::WARM_UP_SOURCE;
                let _ = nvrtc_cubin(source, &arch, Path::new("warm_up.cu"));
            }
        });
        std::thread::spawn(move || {
            let (major, minor) = dev.compute_capability();
            let Some(ptx) = coil_codegen::cuda::ptx::empty_module(major * 10 + minor) else { return };
            rayon::broadcast(|_| {
                if dev.bind().is_ok() {
                    let _ = ptx_cubin(&ptx, Path::new("warm_up.ptx"), 4);
                }
            });
        });
    });
}

/// One NVRTC compile to a CUBIN.
fn nvrtc_cubin(source: &str, arch: &str, source_path: &Path) -> Result<Vec<u8>> {
    let src = CString::new(source).map_err(|_| Error::runtime("CUDA source contains a NUL byte"))?;
    let name = CString::new(source_path.file_name().unwrap_or_default().to_string_lossy().as_bytes())
        .unwrap_or_else(|_| c"coil.cu".to_owned());
    let prog =
        rtc::create_program(&src, Some(&name)).map_err(|e| Error::runtime(format!("nvrtcCreateProgram: {e}")))?;
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(self::options(nvrtc_version()?));
    // SAFETY: `prog` was just created and is destroyed once, below; `src` and `name` outlive it.
    let result = unsafe {
        let compiled = rtc::compile_program(prog, &options);
        let out = match compiled {
            Ok(()) => get_cubin(prog).map_err(|e| Error::runtime(format!("nvrtcGetCUBIN: {e}"))),
            Err(e) => {
                let log = rtc::get_program_log(prog)
                    .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                    .unwrap_or_default();
                Err(Error::runtime(format!(
                    "NVRTC failed ({e}) compiling {} for {arch}:\n{}",
                    source_path.display(),
                    log.trim_end()
                )))
            }
        };
        let _ = rtc::destroy_program(prog);
        out
    };
    result
}

/// The driver's assembly of a PTX module into a CUBIN for the current context's device
/// (`cuLinkCreate`, `cuLinkAddData` of the PTX, `cuLinkComplete`); an error carries the
/// assembler's log and the path of the kept source.
fn ptx_cubin(ptx: &str, source_path: &Path, level: u32) -> Result<Vec<u8>> {
    use sys::CUjit_option::{CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_OPTIMIZATION_LEVEL};
    let text = CString::new(ptx).map_err(|_| Error::runtime("PTX source contains a NUL byte"))?;
    let name = CString::new(source_path.file_name().unwrap_or_default().to_string_lossy().as_bytes())
        .unwrap_or_else(|_| c"coil.ptx".to_owned());
    let mut log = vec![0u8; 16 << 10];
    let mut options = vec![CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_OPTIMIZATION_LEVEL];
    let mut values = vec![
        log.as_mut_ptr().cast::<std::ffi::c_void>(),
        log.len() as *mut std::ffi::c_void,
        level as usize as *mut std::ffi::c_void,
    ];
    let failed = |what: &str, e: sys::CUresult, log: &[u8]| {
        let log = CStr::from_bytes_until_nul(log).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
        Error::runtime(format!("{what} failed ({e:?}) assembling {}:\n{}", source_path.display(), log.trim_end()))
    };
    let mut state: sys::CUlinkState = std::ptr::null_mut();
    // SAFETY: the option arrays hold one value per option, the log buffer outlives the link state
    // (destroyed below), and the CUBIN is copied out before the state is destroyed.
    unsafe {
        let r = sys::cuLinkCreate_v2(options.len() as u32, options.as_mut_ptr(), values.as_mut_ptr(), &mut state);
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(failed("cuLinkCreate", r, &log));
        }
        let added = sys::cuLinkAddData_v2(
            state,
            sys::CUjitInputType::CU_JIT_INPUT_PTX,
            text.as_ptr() as *mut std::ffi::c_void,
            text.as_bytes_with_nul().len(),
            name.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        let mut cubin: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut size = 0usize;
        let out = if added != sys::CUresult::CUDA_SUCCESS {
            Err(failed("cuLinkAddData", added, &log))
        } else {
            match sys::cuLinkComplete(state, &mut cubin, &mut size) {
                sys::CUresult::CUDA_SUCCESS => Ok(std::slice::from_raw_parts(cubin.cast::<u8>(), size).to_vec()),
                r => Err(failed("cuLinkComplete", r, &log)),
            }
        };
        let _ = sys::cuLinkDestroy(state);
        out
    }
}

/// The CUBIN of a compiled program.
///
/// # Safety
/// `prog` must be a live, successfully compiled program.
unsafe fn get_cubin(prog: rtc_sys::nvrtcProgram) -> std::result::Result<Vec<u8>, rtc::NvrtcError> {
    let mut size = 0usize;
    // SAFETY: caller's contract; `size` and the buffer are live and large enough.
    unsafe {
        rtc_sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
        let mut out = vec![0u8; size];
        rtc_sys::nvrtcGetCUBIN(prog, out.as_mut_ptr().cast()).result()?;
        Ok(out)
    }
}

/// A CUBIN loaded into a device's context; unloaded when the last holder drops it.
#[derive(Debug)]
pub struct LoadedModule {
    device: Arc<CudaDevice>,
    module: sys::CUmodule,
}

// SAFETY: a CUmodule handle may be used from any thread once its context is bound (done before
// every use); the handle itself is never mutated.
unsafe impl Send for LoadedModule {}
// SAFETY: as above.
unsafe impl Sync for LoadedModule {}

impl LoadedModule {
    /// Loads a CUBIN image.
    pub fn load(device: &Arc<CudaDevice>, cubin: &[u8]) -> Result<LoadedModule> {
        device.bind()?;
        // SAFETY: `cubin` is a complete image (from NVRTC or a cache entry checked whole); the
        // driver copies what it needs before returning.
        let module = unsafe { drv::module::load_data(cubin.as_ptr().cast()) }
            .map_err(|e| driver_error("cuModuleLoadData", e))?;
        Ok(LoadedModule { device: device.clone(), module })
    }

    /// The kernel `name`.
    pub fn function(&self, name: &str) -> Result<sys::CUfunction> {
        let cname = CString::new(name).map_err(|_| Error::runtime(format!("bad kernel name {name:?}")))?;
        self.device.bind()?;
        // SAFETY: the module is loaded (it is unloaded only on drop).
        unsafe { drv::module::get_function(self.module, cname) }
            .map_err(|e| Error::runtime(format!("kernel {name} is not in the CUDA module: {e}")))
    }

    /// The device it is loaded on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }
}

impl Drop for LoadedModule {
    fn drop(&mut self) {
        // Kernels of it may still be queued: let them finish before the code goes away.
        if self.device.wait().is_ok() {
            // SAFETY: nothing uses the module any more (its holders are gone, the stream idle).
            let _ = unsafe { drv::module::unload(self.module) };
        }
    }
}

/// Compiles (through the cache) and loads `source`, checking that every kernel of `names` is
/// in it. A cached CUBIN that fails to load or lacks a kernel is rebuilt once.
pub fn load_or_build(
    device: &Arc<CudaDevice>,
    source: &str,
    language: Language,
    names: &[&str],
    cache_dir: &Path,
) -> Result<(Arc<LoadedModule>, CompiledCubin)> {
    let arch = device.arch();
    let timed = |cubin: &[u8], mut object: CompiledCubin| -> Result<(Arc<LoadedModule>, CompiledCubin)> {
        let start = Instant::now();
        let module = load_checked(device, cubin, names)?;
        object.load_seconds = start.elapsed().as_secs_f64();
        Ok((Arc::new(module), object))
    };
    // the driver assembles PTX in the device's context
    device.bind()?;
    let (cubin, object) = compile_as(source, language, &arch, cache_dir)?;
    let (cache_hit, path) = (object.cache_hit, object.path.clone());
    match timed(&cubin, object) {
        // a verified entry the driver refuses (another driver's) is compiled again
        Err(e) if cache_hit => {
            let why = format!("the driver refuses it: {}", e.message);
            cache_entry::log_invalid(&path, &why);
            let (cubin, object) = through_cache(source, language, &arch, cache_dir, Some(why))?;
            timed(&cubin, object)
        }
        r => r,
    }
}

/// The loaded CUBIN of cache key `key` (its source was in `language`) in `cache_dir`, with
/// every kernel of `names` checked present, without its source: `None` when the cache has no
/// valid entry for the key or the driver refuses it (the caller then compiles the source,
/// which reports and replaces an invalid entry). The graph cache loads kernels this way.
pub fn load_cached(
    device: &Arc<CudaDevice>,
    key: &str,
    language: Language,
    names: &[&str],
    cache_dir: &Path,
) -> Option<(Arc<LoadedModule>, CompiledCubin)> {
    let dir = cache_dir.join("cuda");
    let path = cache_entry::path(&dir, key, Kind::Cubin);
    let cache_entry::Lookup::Found(cubin) = cache_entry::read(&path, Kind::Cubin, key) else { return None };
    let start = Instant::now();
    let module = load_checked(device, &cubin, names).ok()?;
    let object = CompiledCubin {
        source_path: dir.join(format!("{key}.{}", extension(language))),
        path,
        key: key.to_string(),
        arch: device.arch(),
        cache_hit: true,
        compile_seconds: 0.0,
        load_seconds: start.elapsed().as_secs_f64(),
        rebuilt_because: None,
    };
    Some((Arc::new(module), object))
}

/// `cubin` loaded, with every kernel of `names` checked present.
fn load_checked(device: &Arc<CudaDevice>, cubin: &[u8], names: &[&str]) -> Result<LoadedModule> {
    let module = LoadedModule::load(device, cubin)?;
    for name in names {
        module.function(name)?;
    }
    Ok(module)
}

/// Registers and static shared memory of a loaded kernel, from `cuFuncGetAttribute`.
pub(crate) fn function_resources(device: &CudaDevice, f: sys::CUfunction) -> Result<(u32, u32)> {
    use sys::CUfunction_attribute::{CU_FUNC_ATTRIBUTE_NUM_REGS, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES};
    device.bind()?;
    // SAFETY: `f` comes from a loaded module.
    unsafe {
        let regs = drv::function::get_function_attribute(f, CU_FUNC_ATTRIBUTE_NUM_REGS)
            .map_err(|e| driver_error("cuFuncGetAttribute", e))?;
        let shared = drv::function::get_function_attribute(f, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
            .map_err(|e| driver_error("cuFuncGetAttribute", e))?;
        Ok((regs.max(0) as u32, shared.max(0) as u32))
    }
}

/// Allows a kernel more than the default 48 KiB of dynamic shared memory.
pub(crate) fn allow_dynamic_shared(device: &CudaDevice, f: sys::CUfunction, bytes: u32) -> Result<()> {
    if bytes <= 48 * 1024 {
        return Ok(());
    }
    device.bind()?;
    // SAFETY: `f` comes from a loaded module.
    unsafe {
        drv::function::set_function_attribute(
            f,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
    }
    .map_err(|e| driver_error("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", e))
}
