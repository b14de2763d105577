//! coil's configuration: one typed [`Config`] for every setting of the compiler and runtime
//! (cache directory, backend, debug dumps, logs, autotuning, rewriting, CUDA graphs,
//! profiling), set by the program ([`set_config`], [`with_config`]) and read by the library
//! through [`current`].
//!
//! The process environment only supplies the defaults: the first read of the configuration
//! takes [`Config::from_env`], the one place coil reads environment variables (`COIL_LOGS`,
//! `COIL_DEBUG`, `COIL_CACHE_DIR`, ...: see each field). A program that sets its configuration
//! does not depend on its environment.
//!
//! ```
//! use coil_ir::config::{self, Config};
//! let quiet = Config { logs: vec![], rewrite: false, ..config::Config::default() };
//! let seen = config::with_config(quiet, || config::current().rewrite);
//! assert!(!seen);
//! ```
//!
//! The settings that change the generated code ([`Config::same_code`]) are part of the key of
//! the in-process cache of compiled graphs: compiling a graph again under another such setting
//! compiles it again, while changing the logs or the dump folder does not.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, RwLock};

/// The log channels ([`Config::logs`]): `fusion` (fused kernels and refused fusions),
/// `output_code` (each kernel's block program), `schedule` (launch order, memory plan,
/// autotuning), `graph_breaks`, `recompiles` and `guards` (compiled functions).
pub const LOG_CHANNELS: &[&str] = &["fusion", "output_code", "schedule", "graph_breaks", "recompiles", "guards"];

/// How realized graphs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Compiled: fused kernels, generated C, built by the system C compiler (the default).
    Compiled,
    /// The reference interpreter: every primitive op by op (the oracle, and the fallback when
    /// no C compiler exists).
    Interpreter,
}

/// Every setting of coil. Build one with struct-update syntax from [`Config::default`] (the
/// built-in values) or [`Config::from_env`] (the environment's), and install it with
/// [`set_config`] or, for one closure on one thread, [`with_config`].
///
/// ```
/// use coil_ir::config::{self, Config};
/// let cfg = Config { autotune: true, cache_dir: "/tmp/coil-example".into(), ..Config::default() };
/// let previous = config::set_config(cfg);
/// assert!(config::current().autotune);
/// config::set_config(previous);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Where compiled kernels (C shared objects, CUBINs) and autotuning choices are cached on
    /// disk. `COIL_CACHE_DIR`; by default `$XDG_CACHE_HOME/coil`, else `$HOME/.cache/coil`,
    /// else `coil-cache` in the temp dir.
    pub cache_dir: PathBuf,
    /// How realized graphs run (a thread's `set_backend` overrides it); `None`: compiled when a
    /// C compiler exists, else the interpreter. `COIL_BACKEND=compiled|interpreter`.
    pub backend: Option<Backend>,
    /// Where every compiled graph's stages are written (`run_<time>-pid_<pid>/graph_<n>/`);
    /// `None`: no dumps. `COIL_DEBUG=1` is `./coil_debug`, `COIL_DEBUG=<dir>` that folder.
    pub debug_dir: Option<PathBuf>,
    /// The log channels printed to stderr ([`LOG_CHANNELS`], or `all`).
    /// `COIL_LOGS=fusion,schedule` (comma-separated).
    pub logs: Vec<String>,
    /// Whether the launch plans of GPU reductions are chosen by timing a few candidates at a
    /// graph's first run (choices cached on disk). `COIL_AUTOTUNE=1`.
    pub autotune: bool,
    /// Whether the e-graph rewrite pass runs (`false` compiles the decomposed graph as is).
    /// `COIL_REWRITE=0` (or `off`, `false`) turns it off.
    pub rewrite: bool,
    /// Whether realizations on a GPU replay CUDA graphs by default (a thread's
    /// `set_cuda_graphs` overrides it; compiled functions choose their own). No variable.
    pub cuda_graphs: bool,
    /// Whether each compiled graph's first run also times each launch (the times go to
    /// `summary.json` and the `schedule` log). `COIL_PROFILE=1`.
    pub profile: bool,
    /// The C compiler's command line (e.g. `ccache clang`); `None`: the first of `cc`, `gcc`,
    /// `clang` that runs. `$CC`.
    pub c_compiler: Option<String>,
    /// The directories a C compiler named without one (`cc`) lies in, searched to recognise a
    /// compiler met before without running it: its `--version` line is remembered in the cache
    /// directory by the executable's path, size and modification time (a process otherwise
    /// spends about a millisecond running `cc --version`). `None`: it runs. `$PATH`.
    pub program_path: Option<String>,
    /// Where the CUDA libraries are looked for beyond the dynamic loader's path.
    pub cuda_paths: CudaPaths,
    /// Which cuDNN API runs convolutions on NVIDIA GPUs ([`CudnnApi::Graph`] by default). No
    /// variable.
    pub cudnn_api: CudnnApi,
    /// Whether attention on NVIDIA GPUs runs through cuDNN's fused flash-attention engines
    /// where they serve the call (f16 / bf16, no mask or the causal rule, head dim up to 128),
    /// else coil's own templates; `false`: always the templates. On by default. No variable.
    pub cudnn_attention: bool,
    /// Whether whole compiled graphs are cached on disk (`<cache_dir>/graphs/`): a process
    /// that compiles a graph some process compiled before (same graph, device, coil build and
    /// [`Config::same_code`] settings) reads its loop program, schedule and kernels from the
    /// entry and loads the kernels' cached binaries, skipping every stage before them. On by
    /// default; `COIL_GRAPH_CACHE=0` turns it off.
    pub graph_cache: bool,
    /// The most bytes the cache directory's entries may take (`None`: no limit). When a process
    /// first writes an entry and the cache holds more, the least recently used files go until it
    /// holds 90% of this (a background thread; a hit marks its entry used). 4 GiB by default;
    /// `COIL_CACHE_MAX=512M` (bytes, or with `K`, `M`, `G`), `COIL_CACHE_MAX=off` for no limit.
    pub cache_max_bytes: Option<u64>,
    /// Whether a CPU realization outside compiled functions whose graph has no compiled form
    /// in this process yet runs at once on the prebuilt tier-0 executor
    /// (`coil_runtime::cpu::eager`) while that graph compiles on a background thread, rather
    /// than waiting for the C compiler (see `docs/compiler.md`, "Tier 0"). Later realizations
    /// use the compiled graph once it is ready. On by default; `COIL_EAGER_TIER=0` (or `off`,
    /// `false`) turns it off: every new graph compiles before it runs. It changes no code
    /// ([`Config::same_code`]).
    pub eager_tier: bool,
    /// Overrides of the compiler's own choices, for measuring and experiments: unstable, not
    /// part of the supported interface.
    #[doc(hidden)]
    pub tuning: Tuning,
}

/// Which cuDNN API plans and runs a convolution ([`Config::cudnn_api`]).
///
/// ```
/// use coil_ir::config::{Config, CudnnApi};
/// let legacy = Config { cudnn_api: CudnnApi::Legacy, ..Config::default() };
/// assert_eq!(Config::default().cudnn_api, CudnnApi::Graph);
/// assert!(!legacy.same_code(&Config::default()));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CudnnApi {
    /// The backend ("graph") API: an operation graph per call shape, the engine configs of
    /// heuristics mode A in order, the first that builds within the workspace limit; the legacy
    /// API where none does.
    #[default]
    Graph,
    /// The legacy API: `cudnnGetConvolution*Algorithm_v7`'s first algorithm.
    Legacy,
}

/// Where the CUDA libraries (driver, NVRTC, cuBLASLt) are looked for when the dynamic loader
/// does not find them by name: toolkit installs, Python wheels, a conda environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CudaPaths {
    /// Toolkit roots searched first (their `lib64`, `lib`, `targets/x86_64-linux/lib`).
    /// `$CUDA_HOME`, `$CUDA_PATH`, `$CUDA_ROOT`.
    pub toolkits: Vec<PathBuf>,
    /// Prefixes whose `python3*/site-packages/nvidia/*/lib` hold pip's CUDA wheels, before the
    /// system's. `$VIRTUAL_ENV/lib`, `$HOME/.local/lib`.
    pub python_prefixes: Vec<PathBuf>,
    /// A conda environment whose `lib` is searched last. `$CONDA_PREFIX`.
    pub conda_prefix: Option<PathBuf>,
    /// The dynamic loader's own search path, only quoted when a library is not found.
    /// `$LD_LIBRARY_PATH`.
    pub loader_path: Option<String>,
}

/// Overrides of the compiler's heuristics, for measuring them (unstable: names and meanings
/// may change). `None` / the defaults keep the compiler's choice. Every field changes the
/// generated code or what runs, so all of them are part of the compile cache key.
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tuning {
    /// Threads per row of a persistent GPU reduction. `COIL_ROW_THREADS`.
    pub row_threads: Option<usize>,
    /// Blocks of a thread-block cluster per row. `COIL_CLUSTER`.
    pub cluster: Option<usize>,
    /// Threads per row of a looped GPU reduction. `COIL_LOOPED_THREADS`.
    pub looped_threads: Option<usize>,
    /// Most blocks of a looped GPU reduction. `COIL_LOOPED_GRID`.
    pub looped_grid: Option<usize>,
    /// Elements per thread of a GPU pointwise kernel. `COIL_POINTWISE_VEC`.
    pub pointwise_vec: Option<usize>,
    /// Unroll factor of a looped GPU reduction's row loop (default 4). `COIL_ROW_UNROLL`.
    pub row_unroll: Option<u32>,
    /// Blocks per SM that GPU reductions declare in `__launch_bounds__` (1..=32).
    /// `COIL_MIN_BLOCKS`.
    pub min_blocks: Option<u32>,
    /// `tanhf` instead of the exp form of gelu's `1 + tanh(z)`. `COIL_CUDA_PLAIN_TANH=1`.
    pub plain_tanh: bool,
    /// Whether looped softmax-like reductions fuse max and sum into one pass.
    /// `COIL_ONLINE_SOFTMAX=0` turns it off.
    pub online_softmax: bool,
    /// Whether GPU kernels are emitted as PTX where possible (else CUDA C through NVRTC).
    /// `COIL_CUDA_PTX=0` turns it off.
    pub ptx: bool,
    /// The driver assembler's optimization level for every PTX kernel (0..=4).
    /// `COIL_PTXAS_OPT`.
    pub ptxas_opt: Option<u32>,
    /// Extra NVRTC options (whitespace-separated in `COIL_NVRTC_OPTIONS`).
    pub nvrtc_options: Vec<String>,
    /// Longest row a GPU persistent reduction holds. `COIL_PERSISTENT_MAX`.
    pub persistent_max: Option<i64>,
    /// cuBLASLt's `i`-th heuristic algorithm instead of its first (0), for every product.
    /// `COIL_GEMM_ALGO`.
    pub gemm_algo: usize,
    /// Whether the first call of each product problem times cuBLASLt's top algorithms and
    /// keeps the fastest (cached on disk). `COIL_GEMM_AUTOTUNE=0` turns it off.
    pub gemm_autotune: bool,
    /// Whether the first run of each cuDNN attention shape times the engine configs of
    /// cuDNN's heuristics that fit and keeps the fastest (cached on disk).
    /// `COIL_ATTENTION_AUTOTUNE=0` turns it off.
    pub attention_autotune: bool,
    /// Fill every device allocation with `0xFF` bytes (NaN for floats) before use, so a kernel
    /// that reads memory nothing wrote shows it instead of reading stale values. For debugging;
    /// one memset per allocation. `COIL_POISON=1`.
    pub poison_device_memory: bool,
    /// Whether generated kernels are launched as programmatic dependents where the GPU has
    /// them ([`GpuTarget::programmatic_launch`](crate::target::GpuTarget::programmatic_launch)),
    /// so each starts while the kernel before it drains. `COIL_PDL=0` turns it off.
    pub programmatic_launch: bool,
    /// Lowering's full-reads realization threshold (`coil_passes::lower::realize`'s
    /// `REALIZE_MIN_FULL_READS`, 2 when `None`): a pointwise node read element for element by
    /// several readers whose inlined body loads at least this many buffers of its size is
    /// stored. A large value turns the rule off. `COIL_REALIZE_FULL_READS`.
    pub realize_min_full_reads: Option<usize>,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            row_threads: None,
            cluster: None,
            looped_threads: None,
            looped_grid: None,
            pointwise_vec: None,
            row_unroll: None,
            min_blocks: None,
            plain_tanh: false,
            online_softmax: true,
            ptx: true,
            ptxas_opt: None,
            nvrtc_options: Vec::new(),
            persistent_max: None,
            gemm_algo: 0,
            gemm_autotune: true,
            attention_autotune: true,
            poison_device_memory: false,
            programmatic_launch: true,
            realize_min_full_reads: None,
        }
    }
}

impl Default for Config {
    /// The built-in value of every setting, with the machine's standard places: the user's
    /// cache directory, `$CC`, the CUDA install of `$CUDA_HOME` (none of the `COIL_*`
    /// variables).
    fn default() -> Config {
        Env::process().default_config()
    }
}

impl Config {
    /// The defaults of the process environment: [`Config::default`] with each `COIL_*`
    /// variable that is set (see the fields). A value that does not parse is ignored, with a
    /// warning on stderr for names coil does not know (an unknown log channel).
    pub fn from_env() -> Config {
        Env::process().config()
    }

    /// Whether the channel `name` of [`Config::logs`] is on (named, or `all`).
    pub fn logs_on(&self, name: &str) -> bool {
        self.logs.iter().any(|c| c == name || c == "all")
    }

    /// Whether code compiled under `self` is what `other` would compile: the settings that
    /// change generated code or what runs (rewriting, autotuning, the C compiler, the tuning
    /// overrides, the cuDNN API: [`Config::code_settings`]) are equal. The cache directory,
    /// backend, dumps, logs, CUDA graphs, profiling and the graph cache do not matter.
    ///
    /// ```
    /// use coil_ir::config::Config;
    /// let base = Config::default();
    /// assert!(base.same_code(&Config { logs: vec!["all".into()], ..base.clone() }));
    /// assert!(!base.same_code(&Config { rewrite: false, ..base.clone() }));
    /// ```
    pub fn same_code(&self, other: &Config) -> bool {
        self.code_settings() == other.code_settings()
    }

    /// The settings that change generated code or what runs, which [`Config::same_code`]
    /// compares; their `Debug` text is part of the key of the disk cache of compiled graphs.
    ///
    /// ```
    /// use coil_ir::config::Config;
    /// let base = Config::default();
    /// let text = format!("{:?}", base.code_settings());
    /// assert_ne!(text, format!("{:?}", Config { autotune: !base.autotune, ..base.clone() }.code_settings()));
    /// ```
    pub fn code_settings(&self) -> CodeSettings<'_> {
        (self.rewrite, self.autotune, &self.c_compiler, &self.tuning, self.cudnn_api)
    }
}

/// What [`Config::code_settings`] returns: rewrite, autotune, the C compiler, the tuning
/// overrides and the cuDNN API, in that order. (A named type rather than `impl Debug +
/// PartialEq`: rustdoc 1.95 panics documenting that opaque type through the `coil` crate's
/// re-export.)
pub type CodeSettings<'a> = (bool, bool, &'a Option<String>, &'a Tuning, CudnnApi);

/// The global configuration, made from the environment at its first read.
fn global() -> &'static RwLock<Arc<Config>> {
    static GLOBAL: OnceLock<RwLock<Arc<Config>>> = OnceLock::new();
    GLOBAL.get_or_init(|| RwLock::new(Arc::new(Config::from_env())))
}

thread_local! {
    /// The configuration of the innermost [`with_config`] running on this thread.
    static SCOPED: RefCell<Option<Arc<Config>>> = const { RefCell::new(None) };
}

/// The configuration in force on this thread: that of the innermost [`with_config`], else the
/// global one ([`set_config`]; at first [`Config::from_env`]).
pub fn current() -> Arc<Config> {
    if let Some(scoped) = SCOPED.with(|s| s.borrow().clone()) {
        return scoped;
    }
    global().read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Replaces the global configuration (every thread's, except inside [`with_config`]) and
/// returns the previous one. Graphs compiled before keep the settings they were compiled with.
pub fn set_config(config: Config) -> Config {
    let mut global = global().write().unwrap_or_else(|e| e.into_inner());
    let previous = std::mem::replace(&mut *global, Arc::new(config));
    Arc::try_unwrap(previous).unwrap_or_else(|shared| (*shared).clone())
}

/// Runs `f` with `config` in force on this thread (nested calls stack; the previous
/// configuration comes back when `f` returns or panics). Work `f` hands to other threads sees
/// the global configuration unless it enters `config` there too ([`current`] and
/// `with_config` again): coil's own thread pools do.
pub fn with_config<R>(config: impl Into<Arc<Config>>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<Config>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            SCOPED.with(|s| *s.borrow_mut() = previous);
        }
    }
    let previous = SCOPED.with(|s| s.borrow_mut().replace(config.into()));
    let _restore = Restore(previous);
    f()
}

/// Looks up one variable.
type Lookup = Box<dyn Fn(&str) -> Option<String>>;

/// The variables [`Config`] is made from: the process environment, or a map (tests).
struct Env(Lookup);

impl Env {
    fn process() -> Env {
        Env(Box::new(|name| std::env::var(name).ok()))
    }

    /// A variable's value, unless unset or empty.
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|v| !v.is_empty())
    }

    fn path(&self, name: &str) -> Option<PathBuf> {
        self.get(name).map(PathBuf::from)
    }

    /// A number, trimmed; `None` when unset or not a number.
    fn number<T: std::str::FromStr>(&self, name: &str) -> Option<T> {
        self.get(name)?.trim().parse().ok()
    }

    fn standard_cache_dir(&self) -> PathBuf {
        (self.path("XDG_CACHE_HOME").map(|d| d.join("coil")))
            .or_else(|| self.path("HOME").map(|d| d.join(".cache").join("coil")))
            .unwrap_or_else(|| std::env::temp_dir().join("coil-cache"))
    }

    fn cuda_paths(&self) -> CudaPaths {
        CudaPaths {
            toolkits: ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"].iter().filter_map(|v| self.path(v)).collect(),
            python_prefixes: (self.path("VIRTUAL_ENV").map(|d| d.join("lib")).into_iter())
                .chain(self.path("HOME").map(|d| d.join(".local/lib")))
                .collect(),
            conda_prefix: self.path("CONDA_PREFIX"),
            loader_path: self.get("LD_LIBRARY_PATH"),
        }
    }

    fn default_config(&self) -> Config {
        Config {
            cache_dir: self.standard_cache_dir(),
            c_compiler: self.get("CC").filter(|s| !s.trim().is_empty()),
            program_path: self.get("PATH"),
            cuda_paths: self.cuda_paths(),
            ..Config::builtin()
        }
    }

    fn config(&self) -> Config {
        let base = self.default_config();
        let on = |name: &str| self.get(name).is_some_and(|v| v != "0");
        let logs: Vec<String> = (self.get("COIL_LOGS").unwrap_or_default().split(','))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        for n in &logs {
            if n != "all" && !LOG_CHANNELS.contains(&n.as_str()) {
                eprintln!("coil: COIL_LOGS names an unknown channel `{n}` (known: all, {})", LOG_CHANNELS.join(", "));
            }
        }
        let tuning = Tuning {
            row_threads: self.number("COIL_ROW_THREADS"),
            cluster: self.number("COIL_CLUSTER"),
            looped_threads: self.number("COIL_LOOPED_THREADS"),
            looped_grid: self.number("COIL_LOOPED_GRID"),
            pointwise_vec: self.number("COIL_POINTWISE_VEC"),
            row_unroll: self.number("COIL_ROW_UNROLL"),
            min_blocks: self.number("COIL_MIN_BLOCKS"),
            plain_tanh: self.get("COIL_CUDA_PLAIN_TANH").is_some_and(|v| v == "1"),
            online_softmax: self.get("COIL_ONLINE_SOFTMAX").is_none_or(|v| v != "0"),
            ptx: self.get("COIL_CUDA_PTX").is_none_or(|v| v != "0"),
            ptxas_opt: self.number("COIL_PTXAS_OPT"),
            nvrtc_options: self
                .get("COIL_NVRTC_OPTIONS")
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from)
                .collect(),
            persistent_max: self.number("COIL_PERSISTENT_MAX"),
            gemm_algo: self.number("COIL_GEMM_ALGO").unwrap_or(0),
            gemm_autotune: self.get("COIL_GEMM_AUTOTUNE").is_none_or(|v| v != "0"),
            attention_autotune: self.get("COIL_ATTENTION_AUTOTUNE").is_none_or(|v| v != "0"),
            poison_device_memory: self.get("COIL_POISON").is_some_and(|v| v == "1"),
            programmatic_launch: self.get("COIL_PDL").is_none_or(|v| v != "0"),
            realize_min_full_reads: self.number("COIL_REALIZE_FULL_READS"),
        };
        Config {
            cache_dir: self.path("COIL_CACHE_DIR").unwrap_or(base.cache_dir),
            backend: match self.get("COIL_BACKEND").as_deref().map(str::trim) {
                Some("interpreter" | "interp") => Some(Backend::Interpreter),
                Some("compiled") => Some(Backend::Compiled),
                _ => None,
            },
            debug_dir: self.get("COIL_DEBUG").filter(|v| v != "0").map(|v| match v.as_str() {
                "1" => PathBuf::from("coil_debug"),
                dir => PathBuf::from(dir),
            }),
            logs,
            autotune: on("COIL_AUTOTUNE"),
            rewrite: self.get("COIL_REWRITE").is_none_or(|v| !matches!(v.trim(), "0" | "off" | "false")),
            profile: on("COIL_PROFILE"),
            graph_cache: self.get("COIL_GRAPH_CACHE").is_none_or(|v| !matches!(v.trim(), "0" | "off" | "false")),
            eager_tier: self.get("COIL_EAGER_TIER").is_none_or(|v| !matches!(v.trim(), "0" | "off" | "false")),
            cache_max_bytes: match self.get("COIL_CACHE_MAX") {
                None => base.cache_max_bytes,
                Some(v) if matches!(v.trim(), "off" | "none" | "unlimited") => None,
                Some(v) => match byte_size(&v) {
                    Some(n) => Some(n),
                    None => {
                        eprintln!("coil: COIL_CACHE_MAX={v} is not a size (bytes, or with K, M, G; or off): ignored");
                        base.cache_max_bytes
                    }
                },
            },
            tuning,
            ..base
        }
    }
}

/// The default of [`Config::cache_max_bytes`]: 4 GiB.
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 4 << 30;

/// A size in bytes: digits, optionally followed by `K`, `M` or `G` (binary multiples).
///
/// ```
/// use coil_ir::config::byte_size;
/// assert_eq!(byte_size("512M"), Some(512 << 20));
/// assert_eq!(byte_size("4096"), Some(4096));
/// assert_eq!(byte_size("2 g"), Some(2 << 30));
/// assert_eq!(byte_size("lots"), None);
/// ```
pub fn byte_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// The variable a test sets for a copy of its own test binary that it runs as a child
/// process ([`test_child_dir`]).
pub const TEST_CHILD_VAR: &str = "COIL_TEST_EXIT_CHILD";

/// The directory a test hands to a copy of its own test binary run as a child process
/// ([`TEST_CHILD_VAR`]; the runtime's test that a compile in flight does not outlive the
/// process exits in such a child): `None` in every other process. Read from the environment
/// each call, not part of [`Config`]: it says which role a test process plays, not how coil
/// compiles.
pub fn test_child_dir() -> Option<PathBuf> {
    std::env::var_os(TEST_CHILD_VAR).map(PathBuf::from)
}

impl Config {
    /// The built-in values, with no machine paths (completed by [`Env::default_config`]).
    fn builtin() -> Config {
        Config {
            cache_dir: PathBuf::new(),
            backend: None,
            debug_dir: None,
            logs: Vec::new(),
            autotune: false,
            rewrite: true,
            cuda_graphs: false,
            profile: false,
            c_compiler: None,
            program_path: None,
            cuda_paths: CudaPaths::default(),
            cudnn_api: CudnnApi::Graph,
            cudnn_attention: true,
            graph_cache: true,
            cache_max_bytes: Some(DEFAULT_CACHE_MAX_BYTES),
            eager_tier: true,
            tuning: Tuning::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Env {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Env(Box::new(move |name| map.get(name).cloned()))
    }

    #[test]
    fn environment_sets_the_defaults() {
        let c = env(&[
            ("HOME", "/home/u"),
            ("COIL_LOGS", "fusion, schedule"),
            ("COIL_DEBUG", "1"),
            ("COIL_BACKEND", "interpreter"),
            ("COIL_AUTOTUNE", "1"),
            ("COIL_REWRITE", "off"),
            ("COIL_PROFILE", "1"),
            ("COIL_ROW_UNROLL", "8"),
            ("COIL_CUDA_PTX", "0"),
            ("COIL_NVRTC_OPTIONS", " -lineinfo  --use_fast_math "),
            ("COIL_ROW_THREADS", "banana"),
            ("COIL_GRAPH_CACHE", "0"),
            ("COIL_EAGER_TIER", "off"),
        ])
        .config();
        assert_eq!(c.cache_dir, PathBuf::from("/home/u/.cache/coil"));
        assert_eq!(c.logs, ["fusion", "schedule"]);
        assert!(c.logs_on("schedule") && !c.logs_on("guards"));
        assert_eq!(c.debug_dir, Some(PathBuf::from("coil_debug")));
        assert_eq!(c.backend, Some(Backend::Interpreter));
        assert!(c.autotune && !c.rewrite && c.profile);
        assert_eq!(c.tuning.row_unroll, Some(8));
        assert!(!c.tuning.ptx && c.tuning.online_softmax);
        assert_eq!(c.tuning.nvrtc_options, ["-lineinfo", "--use_fast_math"]);
        assert_eq!(c.tuning.row_threads, None, "a value that does not parse is ignored");
        assert!(!c.graph_cache && env(&[]).config().graph_cache);
        assert!(!c.eager_tier && env(&[]).config().eager_tier);
        let max = |v: &str| env(&[("COIL_CACHE_MAX", v)]).config().cache_max_bytes;
        assert_eq!((max("512M"), max("off"), max("huge")), (Some(512 << 20), None, Some(DEFAULT_CACHE_MAX_BYTES)));
        assert_eq!(env(&[]).config().cache_max_bytes, Some(DEFAULT_CACHE_MAX_BYTES));
    }

    #[test]
    fn empty_environment_gives_the_builtin_values() {
        let c = env(&[]).config();
        assert_eq!(c, Config { cache_dir: std::env::temp_dir().join("coil-cache"), ..Config::builtin() });
        let c = env(&[("COIL_CACHE_DIR", "/c"), ("XDG_CACHE_HOME", "/x"), ("COIL_DEBUG", "0")]).config();
        assert_eq!((c.cache_dir, c.debug_dir), (PathBuf::from("/c"), None));
        assert_eq!(env(&[("XDG_CACHE_HOME", "/x")]).config().cache_dir, PathBuf::from("/x/coil"));
    }

    #[test]
    fn cuda_paths_come_from_the_toolkit_and_python_variables() {
        let p = env(&[("CUDA_HOME", "/cuda"), ("CUDA_ROOT", "/cuda2"), ("VIRTUAL_ENV", "/venv"), ("HOME", "/h")])
            .cuda_paths();
        assert_eq!(p.toolkits, [PathBuf::from("/cuda"), PathBuf::from("/cuda2")]);
        assert_eq!(p.python_prefixes, [PathBuf::from("/venv/lib"), PathBuf::from("/h/.local/lib")]);
    }

    #[test]
    fn with_config_is_scoped_and_nests() {
        let outer = current();
        let a = Config { profile: true, ..Config::default() };
        let b = Config { profile: false, autotune: true, ..Config::default() };
        with_config(a, || {
            assert!(current().profile);
            with_config(b, || assert!(current().autotune && !current().profile));
            assert!(current().profile && !current().autotune);
            // Another thread sees the global configuration.
            let there = std::thread::spawn(|| current().profile).join().unwrap();
            assert_eq!(there, outer.profile);
        });
        assert_eq!(*current(), *outer);
        // Restored after a panic too.
        let caught =
            std::panic::catch_unwind(|| with_config(Config { profile: true, ..Config::default() }, || panic!()));
        assert!(caught.is_err());
        assert_eq!(*current(), *outer);
    }

    #[test]
    fn same_code_ignores_settings_that_do_not_change_code() {
        let base = Config::default();
        let debug =
            Config { debug_dir: Some("d".into()), profile: true, cache_dir: "/elsewhere".into(), ..base.clone() };
        assert!(base.same_code(&debug));
        let tuned = Config { tuning: Tuning { row_unroll: Some(2), ..Tuning::default() }, ..base.clone() };
        assert!(!base.same_code(&tuned));
        assert!(!base.same_code(&Config { autotune: true, ..base.clone() }));
        assert!(base.same_code(&Config { graph_cache: !base.graph_cache, ..base.clone() }));
    }
}
