//! The system C compiler and the on-disk cache of the shared objects it builds.
//!
//! One C translation unit (a whole graph's kernels) becomes one shared object:
//! `cc -O3 -march=native -ffp-contract=off -fopenmp -shared -fPIC SOURCE -o OUT -lm`. Compiling
//! takes tens to hundreds of milliseconds, so results are cached on disk, keyed by a 128-bit
//! FNV-1a hash of the source, the compiler's version line and the flags:
//!
//! ```text
//! <cache dir>/c/<key>.c    the source, kept for humans (and for compile errors)
//! <cache dir>/c/<key>.so   the shared object
//! ```
//!
//! Every file is written to a private temporary name and renamed into place, so concurrent
//! processes compiling the same source never see a partial file; at worst both compile and the
//! last rename wins (the contents are equivalent). An entry that is empty or truncated is
//! detected ([`looks_complete`]) and rebuilt; one that fails to load is rebuilt by the caller
//! ([`crate::cpu::module::load_or_build`]).

use coil_ir::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Flags every shared object is built with (besides `-fopenmp`, which is dropped when the
/// compiler cannot link it, and `-lm`, which must follow the source).
///
/// `-ffp-contract=off`: every operation rounds as written, as in the interpreter. Contracting
/// `a * b - c` into a fused multiply-add made a value recomputed in two kernels differ: a
/// softmax's `x - max(x)` came out as the product's rounding error instead of 0, which near the
/// largest floats is 1e31, and its exp infinite (found by the API fuzzer, `tests/fuzz`).
const BASE_FLAGS: [&str; 5] = ["-O3", "-march=native", "-ffp-contract=off", "-shared", "-fPIC"];

/// Bumped when the way entries are built changes, so stale entries are never reused.
const CACHE_FORMAT: &str = "coil-c-cache-v1";

/// A working C compiler.
#[derive(Debug)]
pub struct CCompiler {
    /// The program, e.g. `/usr/bin/cc` or `gcc`.
    program: String,
    /// Extra words of `$CC` (e.g. `CC="gcc -m64"`), passed before our flags.
    pre_args: Vec<String>,
    /// First line of `--version`: part of the cache key, so upgrading the compiler rebuilds.
    version: String,
    /// Cleared the first time `-fopenmp` fails to link (no libgomp), so later compiles do not
    /// pay for a failing attempt.
    openmp: AtomicBool,
}

/// Where a translation unit's shared object lies, and what producing it cost.
#[derive(Clone, Debug, PartialEq)]
pub struct CompiledObject {
    /// `<cache dir>/c/<key>.so`.
    pub path: PathBuf,
    /// `<cache dir>/c/<key>.c`.
    pub source_path: PathBuf,
    /// The 32-hex-digit cache key.
    pub key: String,
    /// True when the shared object was already in the cache (nothing was compiled).
    pub cache_hit: bool,
    /// Seconds spent running the compiler (0 on a cache hit).
    pub compile_seconds: f64,
}

impl CCompiler {
    /// The compiler named by `$CC`, else the first of `cc`, `gcc`, `clang` that runs. A `$CC`
    /// that does not run is passed over rather than costing the compiled path altogether.
    pub fn detect() -> Option<CCompiler> {
        let from_env = std::env::var("CC").ok().filter(|s| !s.trim().is_empty());
        let found = from_env.iter().map(String::as_str).chain(["cc", "gcc", "clang"]).find_map(CCompiler::from_command);
        found
    }

    /// A compiler from a command line such as `gcc` or `ccache clang`; `None` if
    /// `COMMAND --version` does not run successfully.
    pub fn from_command(command: &str) -> Option<CCompiler> {
        let mut words = command.split_whitespace().map(String::from);
        let program = words.next()?;
        let pre_args: Vec<String> = words.collect();
        let out = Command::new(&program).args(&pre_args).arg("--version").output().ok()?;
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text.lines().next().unwrap_or("").trim().to_string();
        Some(CCompiler { program, pre_args, version, openmp: AtomicBool::new(true) })
    }

    /// The first line of `--version`, e.g. `cc (Debian 12.2.0-14) 12.2.0`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The command this compiler runs as.
    pub fn command(&self) -> String {
        std::iter::once(self.program.as_str())
            .chain(self.pre_args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// False once `-fopenmp` failed to link; kernels then run single-threaded (the pragmas are
    /// ignored by the compiler).
    pub fn openmp(&self) -> bool {
        self.openmp.load(Ordering::Relaxed)
    }

    /// The cache key of `source` for this compiler: hex of a 128-bit FNV-1a hash of the cache
    /// format, the compiler's version line, the flags and the source.
    ///
    /// The key names the flags *requested* (always with `-fopenmp`), not those that finally
    /// worked: whether `-fopenmp` links is a property of the installed compiler, so one key
    /// always maps to one build, and a process never recompiles just to learn it again.
    pub fn cache_key(&self, source: &str) -> String {
        let mut h = Fnv128::new();
        for part in [CACHE_FORMAT, &self.version, &BASE_FLAGS.join(" "), "-fopenmp -lm", source] {
            h.write(&(part.len() as u64).to_le_bytes());
            h.write(part.as_bytes());
        }
        format!("{:032x}", h.finish())
    }

    /// Returns the shared object for `source`, from `cache_dir` when a complete entry is there,
    /// else by compiling it. A compile failure is a runtime error carrying the compiler's
    /// stderr and the path of the kept source.
    pub fn compile(&self, source: &str, cache_dir: &Path) -> Result<CompiledObject> {
        let dir = cache_dir.join("c");
        let key = self.cache_key(source);
        let path = dir.join(format!("{key}.so"));
        let source_path = dir.join(format!("{key}.c"));
        if looks_complete(&path) {
            return Ok(CompiledObject { path, source_path, key, cache_hit: true, compile_seconds: 0.0 });
        }
        self.build(source, &dir, key)
    }

    /// Compiles `source` into the cache unconditionally, replacing any entry (used when an
    /// entry that looked complete fails to load).
    pub fn rebuild(&self, source: &str, cache_dir: &Path) -> Result<CompiledObject> {
        self.build(source, &cache_dir.join("c"), self.cache_key(source))
    }

    fn build(&self, source: &str, dir: &Path, key: String) -> Result<CompiledObject> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::runtime(format!("cannot create the kernel cache {}: {e}", dir.display())))?;
        let path = dir.join(format!("{key}.so"));
        let source_path = dir.join(format!("{key}.c"));
        write_atomically(&source_path, source.as_bytes())?;
        let tmp = temp_name(&path);
        let start = Instant::now();
        let mut result = self.run(&source_path, &tmp, self.openmp());
        if result.is_err() && self.openmp() {
            // Most often libgomp is missing. Any real error in the source shows up again below,
            // without the OpenMP noise.
            let retry = self.run(&source_path, &tmp, false);
            if retry.is_ok() {
                self.openmp.store(false, Ordering::Relaxed);
            }
            result = retry;
        }
        let compile_seconds = start.elapsed().as_secs_f64();
        if let Err(stderr) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::runtime(format!(
                "the C compiler ({}) failed on {}:\n{}",
                self.command(),
                source_path.display(),
                stderr.trim_end()
            )));
        }
        std::fs::rename(&tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::runtime(format!("cannot move the compiled kernels to {}: {e}", path.display()))
        })?;
        Ok(CompiledObject { path, source_path, key, cache_hit: false, compile_seconds })
    }

    /// Runs the compiler once; `Err(stderr)` on failure.
    fn run(&self, source: &Path, out: &Path, openmp: bool) -> std::result::Result<(), String> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.pre_args).args(BASE_FLAGS);
        if openmp {
            cmd.arg("-fopenmp");
        }
        cmd.arg(source).arg("-o").arg(out).arg("-lm");
        match cmd.output() {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(format!("{}\n{}", o.status, String::from_utf8_lossy(&o.stderr))),
            Err(e) => Err(format!("cannot run {}: {e}", self.program)),
        }
    }
}

/// The system C compiler, found once per process ([`CCompiler::detect`]); `None` when there is
/// none, in which case callers fall back to the reference interpreter.
pub fn c_compiler() -> Option<&'static CCompiler> {
    static COMPILER: OnceLock<Option<CCompiler>> = OnceLock::new();
    COMPILER.get_or_init(CCompiler::detect).as_ref()
}

/// The cache directory: `$COIL_CACHE_DIR`, else `$XDG_CACHE_HOME/coil`, else
/// `$HOME/.cache/coil`, else `coil-cache` in the temp dir.
pub fn default_cache_dir() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("COIL_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("coil")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("coil")))
        .unwrap_or_else(|| std::env::temp_dir().join("coil-cache"))
}

/// Whether a cached shared object is plausibly whole: non-empty and, for ELF files, long enough
/// to hold the section header table (the linker writes it last, so any truncation cuts it).
pub fn looks_complete(path: &Path) -> bool {
    use std::io::Read;
    let Ok(file) = std::fs::File::open(path) else { return false };
    let Ok(len) = file.metadata().map(|m| m.len()) else { return false };
    let mut header = Vec::with_capacity(64);
    let n = file.take(64).read_to_end(&mut header).unwrap_or(0);
    if len == 0 || n == 0 {
        return false;
    }
    if header.starts_with(b"\x7fELF") {
        if n < 64 {
            return false;
        }
        // ELF64 little-endian only (x86-64, aarch64); other ELF kinds are left to the loader.
        if header[4] == 2 && header[5] == 1 {
            let u64_at = |o: usize| u64::from_le_bytes(header[o..o + 8].try_into().unwrap());
            let u16_at = |o: usize| u16::from_le_bytes(header[o..o + 2].try_into().unwrap()) as u64;
            let end = u64_at(0x28).saturating_add(u16_at(0x3a) * u16_at(0x3c));
            return end <= len;
        }
    }
    true
}

/// Writes a file atomically: a private temporary name in the same directory, then a rename.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_name(path);
    std::fs::write(&tmp, bytes).and_then(|_| std::fs::rename(&tmp, path)).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::runtime(format!("cannot write {}: {e}", path.display()))
    })
}

/// `<path>.tmp-<pid>-<n>`: unique across processes (pid) and threads (counter).
fn temp_name(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}-{n}", std::process::id()));
    path.with_file_name(name)
}

/// 128-bit FNV-1a: tiny, stable across Rust versions and platforms (unlike `DefaultHasher`),
/// and wide enough that accidental collisions between cached sources are not a concern.
pub(crate) struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013b;

    pub fn new() -> Fnv128 {
        Fnv128(Self::OFFSET)
    }

    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u128;
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    pub fn finish(&self) -> u128 {
        self.0
    }
}
