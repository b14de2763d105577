//! The system C compiler and the on-disk cache of the shared objects it builds.
//!
//! One C translation unit (a whole graph's kernels) becomes one shared object:
//! `cc -O3 -march=native -ffp-contract=off -fno-math-errno -fno-trapping-math -fopenmp-simd
//! -shared -fPIC SOURCE -o OUT -lm`. Compiling
//! takes tens to hundreds of milliseconds, so results are cached on disk, keyed by a 128-bit
//! FNV-1a hash of the source, the compiler's version line and the flags:
//!
//! ```text
//! <cache dir>/c/<key>.c          the source, kept for humans (and for compile errors)
//! <cache dir>/c/<key>.so.entry   the shared object, as a verified cache entry
//! ```
//!
//! The entry carries its key and a checksum of the library ([`crate::cache_entry`]); one that
//! is empty, truncated, damaged or another key's is logged and rebuilt, never loaded. Every file
//! is written to a private temporary name and renamed into place, so concurrent processes
//! compiling the same source never see a partial file; at worst both compile and the last
//! rename wins (each entry is whole and right for the key). The library is loaded from the
//! bytes that were checked ([`crate::cpu::module`]).

use super::children;
use super::native::{BASE_FLAGS, SIMD_FLAGS};
use crate::cache_entry::{self, Kind};
use coil_ir::{Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Bumped when the way entries are built changes, so stale entries are never reused.
const CACHE_FORMAT: &str = "coil-c-cache-v3";

/// A working C compiler.
#[derive(Debug)]
pub struct CCompiler {
    /// The program, e.g. `/usr/bin/cc` or `gcc`.
    program: String,
    /// Extra words of `$CC` (e.g. `CC="gcc -m64"`), passed before our flags.
    pre_args: Vec<String>,
    /// First line of `--version`: part of the cache key, so upgrading the compiler rebuilds.
    version: String,
    /// Cleared the first time [`SIMD_FLAGS`] fail (a compiler without them), so later compiles
    /// do not pay for a failing attempt.
    simd_pragmas: AtomicBool,
}

/// Where a translation unit's shared object lies, and what producing it cost.
#[derive(Clone, Debug, PartialEq)]
pub struct CompiledObject {
    /// `<cache dir>/c/<key>.so.entry`.
    pub path: PathBuf,
    /// `<cache dir>/c/<key>.c`.
    pub source_path: PathBuf,
    /// The 32-hex-digit cache key.
    pub key: String,
    /// True when the shared object was already in the cache (nothing was compiled).
    pub cache_hit: bool,
    /// Seconds spent running the compiler (0 on a cache hit).
    pub compile_seconds: f64,
    /// Why the cached entry was not used and the library was compiled again (it was damaged,
    /// another key's, or did not load); `None` on a hit or a plain miss.
    pub rebuilt_because: Option<String>,
}

impl CompiledObject {
    /// The object of cache key `key` in `cache_dir`, as a cache hit (nothing compiled).
    pub fn cached(cache_dir: &Path, key: &str) -> CompiledObject {
        let dir = cache_dir.join("c");
        CompiledObject {
            path: cache_entry::path(&dir, key, Kind::SharedObject),
            source_path: dir.join(format!("{key}.c")),
            key: key.to_string(),
            cache_hit: true,
            compile_seconds: 0.0,
            rebuilt_because: None,
        }
    }
}

impl CCompiler {
    /// The compiler named by `command` (the configuration's `c_compiler`, `$CC` by default),
    /// else the first of `cc`, `gcc`, `clang` that runs. A `command` that does not run is
    /// passed over rather than costing the compiled path altogether.
    pub fn detect(command: Option<&str>) -> Option<CCompiler> {
        command.into_iter().chain(["cc", "gcc", "clang"]).find_map(CCompiler::from_command)
    }

    /// A compiler from a command line such as `gcc` or `ccache clang`; `None` if
    /// `COMMAND --version` does not run successfully.
    pub fn from_command(command: &str) -> Option<CCompiler> {
        let mut words = command.split_whitespace().map(String::from);
        let program = words.next()?;
        let pre_args: Vec<String> = words.collect();
        let out = super::jobs::waiting(|| Command::new(&program).args(&pre_args).arg("--version").output()).ok()?;
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text.lines().next().unwrap_or("").trim().to_string();
        Some(CCompiler { program, pre_args, version, simd_pragmas: AtomicBool::new(true) })
    }

    /// [`CCompiler::detect`], recognising a compiler met before without running it: the
    /// `--version` line of each command is remembered in `cache_dir` (`cc/<key>.version`), keyed
    /// by the command and the path, size and modification time of each of its words that names
    /// an executable (found in `search_path`, `$PATH`, when it names no directory). A command
    /// whose program cannot be found that way is run as [`CCompiler::detect`] runs it.
    pub fn detect_remembered(command: Option<&str>, cache_dir: &Path, search_path: Option<&str>) -> Option<CCompiler> {
        let remembered = |c: &str| {
            let Some(key) = version_key(c, search_path) else { return CCompiler::from_command(c) };
            let memo = cache_dir.join("cc").join(format!("{key}.version"));
            let mut words = c.split_whitespace().map(String::from);
            let (program, pre_args) = (words.next()?, words.collect());
            if let Ok(version) = std::fs::read_to_string(&memo) {
                let version = version.trim_end().to_string();
                return Some(CCompiler { program, pre_args, version, simd_pragmas: AtomicBool::new(true) });
            }
            let found = CCompiler::from_command(c)?;
            // Best effort: a cache directory that cannot be written costs the run next time.
            let _ = std::fs::create_dir_all(cache_dir.join("cc"));
            let _ = cache_entry::write_atomically(&memo, found.version.as_bytes());
            Some(found)
        };
        command.into_iter().chain(["cc", "gcc", "clang"]).find_map(remembered)
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

    /// False once `-fopenmp-simd` was refused; kernels are then vectorized where the compiler
    /// manages without the pragmas.
    pub fn simd_pragmas(&self) -> bool {
        self.simd_pragmas.load(Ordering::Relaxed)
    }

    /// The cache key of `source` for this compiler: hex of a 128-bit FNV-1a hash of the cache
    /// format, the compiler's version line, the flags and the source.
    ///
    /// The key names the flags *requested* (always with `-fopenmp-simd`), not those that
    /// finally worked: whether the compiler takes it is a property of the installed compiler,
    /// so one key always maps to one build, and a process never recompiles just to learn it.
    pub fn cache_key(&self, source: &str) -> String {
        let simd = format!("{} -lm", SIMD_FLAGS.join(" "));
        cache_entry::key(&[CACHE_FORMAT, &self.version, &BASE_FLAGS.join(" "), &simd, source])
    }

    /// The shared object for `source` (its bytes, and where it lies): from `cache_dir` when a
    /// valid entry for its key is there, else compiled and stored; an invalid entry is logged
    /// and rebuilt ([`CompiledObject::rebuilt_because`]). A compile failure is a runtime error
    /// carrying the compiler's stderr and the path of the kept source.
    pub fn compile(&self, source: &str, cache_dir: &Path) -> Result<(Vec<u8>, CompiledObject)> {
        self.through_cache(source, cache_dir, None)
    }

    /// Compiles `source` into the cache unconditionally, replacing its entry, which was not
    /// used `because` (the caller logged why).
    pub fn rebuild(&self, source: &str, cache_dir: &Path, because: String) -> Result<(Vec<u8>, CompiledObject)> {
        self.through_cache(source, cache_dir, Some(because))
    }

    /// [`CCompiler::compile`], or with `rebuild_because`, [`CCompiler::rebuild`].
    fn through_cache(
        &self,
        source: &str,
        cache_dir: &Path,
        rebuild_because: Option<String>,
    ) -> Result<(Vec<u8>, CompiledObject)> {
        let key = self.cache_key(source);
        let CompiledObject { path, source_path, .. } = CompiledObject::cached(cache_dir, &key);
        let mut compile_seconds = 0.0;
        let build = || {
            let start = Instant::now();
            let library = self.build(source, &path, &source_path);
            compile_seconds = start.elapsed().as_secs_f64();
            library
        };
        let fetched = match rebuild_because {
            None => cache_entry::fetch_or_build(&path, Kind::SharedObject, &key, build)?,
            because => cache_entry::rebuild(&path, Kind::SharedObject, &key, because, build)?,
        };
        let cache_entry::Fetched { payload, cache_hit, rebuilt_because } = fetched;
        Ok((payload, CompiledObject { path, source_path, key, cache_hit, compile_seconds, rebuilt_because }))
    }

    /// Compiles `source` (first kept at `source_path`) into a shared object next to `entry`, and
    /// returns its bytes.
    fn build(&self, source: &str, entry: &Path, source_path: &Path) -> Result<Vec<u8>> {
        let dir = entry.parent().expect("an entry lies in a directory");
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::runtime(format!("cannot create the kernel cache {}: {e}", dir.display())))?;
        cache_entry::write_atomically(source_path, source.as_bytes())?;
        let tmp = cache_entry::temp_name(entry, "cc");
        let mut result = self.run(source_path, &tmp, self.simd_pragmas());
        if result.is_err() && self.simd_pragmas() {
            // A compiler without the flag. Any real error in the source shows up again below,
            // without the flag's noise.
            let retry = self.run(source_path, &tmp, false);
            if retry.is_ok() {
                self.simd_pragmas.store(false, Ordering::Relaxed);
            }
            result = retry;
        }
        let library = match result {
            Ok(()) => std::fs::read(&tmp)
                .map_err(|e| Error::runtime(format!("cannot read the compiled kernels {}: {e}", tmp.display()))),
            Err(stderr) => Err(Error::runtime(format!(
                "the C compiler ({}) failed on {}:\n{}",
                self.command(),
                source_path.display(),
                stderr.trim_end()
            ))),
        };
        let _ = std::fs::remove_file(&tmp);
        library
    }

    /// Runs the compiler once; `Err(stderr)` on failure.
    fn run(&self, source: &Path, out: &Path, simd_pragmas: bool) -> std::result::Result<(), String> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.pre_args).args(BASE_FLAGS);
        if simd_pragmas {
            cmd.args(SIMD_FLAGS);
        }
        cmd.arg(source).arg("-o").arg(out).arg("-lm");
        // (as `output` does, on a child that is killed if this process exits first)
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        children::contain(&mut cmd);
        let output = cmd.spawn().and_then(|child| {
            let _running = children::Running::register(child.id());
            super::jobs::waiting(|| child.wait_with_output())
        });
        match output {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(format!("{}\n{}", o.status, String::from_utf8_lossy(&o.stderr))),
            Err(e) => Err(format!("cannot run {}: {e}", self.program)),
        }
    }
}

/// The key under which the `--version` line of `command` is remembered: the command, and for
/// each word that names an executable file (directly, or in `search_path`) its resolved path,
/// size and modification time, so that installing another compiler there changes the key.
/// `None` when the program (the first word) is not found that way.
fn version_key(command: &str, search_path: Option<&str>) -> Option<String> {
    let signature = |word: &str| {
        let candidates: Vec<PathBuf> = if word.contains('/') {
            vec![PathBuf::from(word)]
        } else {
            search_path.into_iter().flat_map(std::env::split_paths).map(|d| d.join(word)).collect()
        };
        candidates.into_iter().find_map(|p| {
            let real = std::fs::canonicalize(&p).ok()?;
            let meta = std::fs::metadata(&real).ok().filter(|m| m.is_file())?;
            let modified = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
            Some(format!("{}:{}:{}", real.display(), meta.len(), modified.as_nanos()))
        })
    };
    let mut words = command.split_whitespace();
    let mut parts = vec![CACHE_FORMAT.to_string(), "version".to_string(), signature(words.next()?)?];
    parts.extend(words.map(|w| signature(w).unwrap_or_else(|| w.to_string())));
    Some(cache_entry::key(&parts.iter().map(String::as_str).collect::<Vec<_>>()))
}

/// The C compiler of the configuration ([`CCompiler::detect`] of its `c_compiler`), found
/// once per process for each setting; `None` when there is none, in which case callers fall
/// back to the reference interpreter.
pub fn c_compiler() -> Option<&'static CCompiler> {
    type Found = HashMap<Option<String>, Option<&'static CCompiler>>;
    static COMPILERS: OnceLock<Mutex<Found>> = OnceLock::new();
    let config = coil_ir::config::current();
    let mut found = COMPILERS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&compiler) = found.get(&config.c_compiler) {
        return compiler;
    }
    // Leaked once per distinct setting (a process has one or two): callers keep `&'static`.
    let (command, search) = (config.c_compiler.as_deref(), config.program_path.as_deref());
    let compiler = CCompiler::detect_remembered(command, &config.cache_dir, search).map(|c| &*Box::leak(Box::new(c)));
    found.insert(config.c_compiler.clone(), compiler);
    compiler
}

/// The cache directory of the configuration (`cache_dir`: `$COIL_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/coil`, else `$HOME/.cache/coil`, else `coil-cache` in the temp dir).
pub fn default_cache_dir() -> PathBuf {
    coil_ir::config::current().cache_dir.clone()
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::cpu::tests::TempDir;
    use std::os::unix::fs::PermissionsExt;

    /// A fake compiler in its own directory that counts its `--version` runs.
    fn fake(dir: &Path, version: &str) -> PathBuf {
        let script = dir.join("fakecc");
        let body = format!("#!/bin/sh\necho run >> {}/runs\necho '{version}'\n", dir.display());
        std::fs::write(&script, body).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script
    }

    fn runs(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("runs")).map_or(0, |s| s.lines().count())
    }

    /// A process that exits while a compile of its runs (this test binary, run again with
    /// `coil_ir::config::TEST_CHILD_VAR` naming a directory: a fake compiler that writes its
    /// pid there and sleeps, started on another thread) leaves no compiler behind.
    #[test]
    fn a_compile_in_flight_does_not_outlive_the_process() {
        if let Some(dir) = coil_ir::config::test_child_dir() {
            let cc = dir.join("slowcc");
            let cc = CCompiler::detect_remembered(Some(cc.to_str().unwrap()), &dir.join("cache"), None).unwrap();
            let cache = dir.join("cache");
            std::thread::spawn(move || cc.compile("int x;\n", &cache));
            while !dir.join("pid").exists() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            std::process::exit(0);
        }
        let dir = TempDir::new("exit-kills-cc");
        let script = dir.0.join("slowcc");
        let body = format!(
            "#!/bin/sh\nif [ \"$1\" = --version ]; then echo slowcc 1.0; exit 0; fi\necho $$ > {0}/pid.tmp\n\
             mv {0}/pid.tmp {0}/pid\nexec sleep 30\n",
            dir.0.display()
        );
        std::fs::write(&script, body).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "cpu::compiler::tests::a_compile_in_flight_does_not_outlive_the_process"])
            .env(coil_ir::config::TEST_CHILD_VAR, &dir.0)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let pid = std::fs::read_to_string(dir.0.join("pid")).unwrap().trim().to_string();
        let alive = || {
            // a killed child not yet reaped by init is a zombie: gone as far as work goes
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
        };
        let start = Instant::now();
        while alive() && start.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!alive(), "the compiler (pid {pid}) outlived the process that started it");
    }

    #[test]
    fn a_compiler_met_before_is_recognised_without_running_it() {
        let dir = TempDir::new("cc-version-memo");
        let (bin, cache) = (dir.0.join("bin"), dir.0.join("cache"));
        std::fs::create_dir_all(&bin).unwrap();
        let script = fake(&bin, "fakecc 1.0");
        let cc = script.to_str().unwrap();
        let found = CCompiler::detect_remembered(Some(cc), &cache, None).unwrap();
        assert_eq!((found.version(), found.command().as_str(), runs(&bin)), ("fakecc 1.0", cc, 1));
        let with_flag = format!("{cc} -m64");
        let again = CCompiler::detect_remembered(Some(&with_flag), &cache, None).unwrap();
        assert_eq!((again.version(), again.command(), runs(&bin)), ("fakecc 1.0", with_flag, 2));
        let again = CCompiler::detect_remembered(Some(cc), &cache, None).unwrap();
        assert_eq!((again.version(), runs(&bin)), ("fakecc 1.0", 2), "remembered: not run");
        // A bare name is looked up in the search path: the same executable, the same key.
        let search = bin.to_str().unwrap();
        assert_eq!(version_key("fakecc", Some(search)), version_key(cc, None));
        assert_eq!(version_key("fakecc", Some("/nonexistent")), None);
        // Another compiler installed under the same name (another size): run, and remembered anew.
        fake(&bin, "fakecc 2.0.1");
        let upgraded = CCompiler::detect_remembered(Some(cc), &cache, None).unwrap();
        assert_eq!((upgraded.version(), runs(&bin)), ("fakecc 2.0.1", 3));
    }
}
