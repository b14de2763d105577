//! The runner: trials run in child processes (this same binary, re-executed with `--child`),
//! so that a crash (a segfault, an abort, an allocation failure) is caught and its seed kept.
//!
//! A child runs a range of seeds and prints `start <seed>` before each trial and
//! `done <seed> <class> <detail>` after it. When a child dies, the seed it started and did not
//! finish is the crash; it is run again alone, in a fresh child, to tell a crash of its own
//! from one that needs the trials before it, and the range goes on after it in a new child.
//! A caught panic ends its child too (coil's locks may be poisoned). A child that prints
//! nothing for `--timeout` seconds is killed: a hang. `--jobs` children run at once, each on
//! ranges of `--batch` seeds.

use crate::compare::{judge, Verdict};
use coil::Device;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// The first trial's seed; trials are `seed..seed + trials`.
    pub seed: u64,
    pub trials: u64,
    /// The devices whose compiled backend runs each trial (the interpreter always does).
    pub devices: Vec<Device>,
    /// Children at once.
    pub jobs: usize,
    /// Seeds per child.
    pub batch: u64,
    /// Print each trial's script and outcomes.
    pub verbose: bool,
    /// A child silent this long is killed.
    pub timeout: Duration,
    /// Faults the children inject, to test this runner: abort at one seed, panic at another.
    pub inject: Inject,
}

/// Faults a child injects (`--abort-at S`, `--panic-at S`): how [`self_test`] checks that
/// crashes and panics are caught with their seeds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Inject {
    pub abort_at: Option<u64>,
    pub panic_at: Option<u64>,
}

const USAGE: &str = "options: --seed S (first seed, default 0) --trials N --device cpu|cuda|all|none \
    --jobs J (children at once) --batch B (seeds per child) --timeout SECS --verbose";

/// What the command line asks for.
enum Mode {
    Parent(Config),
    Child(Config),
    /// A test-harness request that names other tests (`cargo test some_filter`), or `--list`.
    Nothing,
}

/// Parses the command line: the fuzzer's options, ignoring the test harness's own (`cargo
/// test` passes `--nocapture`, filters, ...).
fn parse(args: &[String], default_trials: u64) -> Result<Mode, String> {
    let mut cfg = Config {
        seed: 0,
        trials: default_trials,
        devices: default_devices(),
        jobs: std::thread::available_parallelism().map_or(2, |n| n.get()),
        batch: 100,
        verbose: false,
        timeout: Duration::from_secs(120),
        inject: Inject::default(),
    };
    let (mut child, mut filters) = (false, Vec::new());
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value; {USAGE}"));
        let number = |v: &String| v.parse::<u64>().map_err(|_| format!("not a number: {v}; {USAGE}"));
        match arg.as_str() {
            "--seed" => cfg.seed = number(value("--seed")?)?,
            "--trials" => cfg.trials = number(value("--trials")?)?,
            "--jobs" => cfg.jobs = number(value("--jobs")?)?.max(1) as usize,
            "--batch" => cfg.batch = number(value("--batch")?)?.max(1),
            "--timeout" => cfg.timeout = Duration::from_secs(number(value("--timeout")?)?),
            "--device" => cfg.devices = devices(value("--device")?)?,
            "--verbose" => cfg.verbose = true,
            "--abort-at" => cfg.inject.abort_at = Some(number(value("--abort-at")?)?),
            "--panic-at" => cfg.inject.panic_at = Some(number(value("--panic-at")?)?),
            "--child" => child = true,
            "--help" | "-h" => return Err(USAGE.into()),
            "--list" => {
                println!("fuzz: test");
                return Ok(Mode::Nothing);
            }
            "--skip" | "--test-threads" | "--color" | "--format" | "-Z" => {
                it.next();
            }
            a if a.starts_with('-') => {} // the test harness's flags
            a => filters.push(a.to_string()),
        }
    }
    if !filters.is_empty() && !filters.iter().any(|f| "fuzz".contains(f.as_str())) {
        return Ok(Mode::Nothing);
    }
    Ok(if child { Mode::Child(cfg) } else { Mode::Parent(cfg) })
}

/// The CPU (when coil compiles there: a C compiler exists), and the first GPU when one is
/// usable.
fn default_devices() -> Vec<Device> {
    let mut d = Vec::new();
    if coil::backend() == coil::Backend::Compiled {
        d.push(Device::Cpu);
    }
    if coil_runtime::testing::cuda_device().is_some() {
        d.push(Device::Cuda(0));
    }
    d
}

fn devices(spec: &str) -> Result<Vec<Device>, String> {
    match spec {
        "cpu" => Ok(vec![Device::Cpu]),
        "cuda" => Ok(vec![Device::Cuda(0)]),
        "all" | "cpu,cuda" => Ok(vec![Device::Cpu, Device::Cuda(0)]),
        "none" => Ok(vec![]),
        _ => Err(format!("unknown device {spec}; {USAGE}")),
    }
}

fn device_spec(devices: &[Device]) -> &'static str {
    match devices {
        [] => "none",
        [Device::Cpu] => "cpu",
        [Device::Cuda(_)] => "cuda",
        _ => "all",
    }
}

/// The fuzzer's entry point, for the test (`tests/fuzz/main.rs`) and the command
/// (`examples/fuzz.rs`): `default_trials` unless `--trials` says otherwise; with `self_test`,
/// [`self_test`] first.
pub fn main(default_trials: u64, self_test: bool) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse(&args, default_trials) {
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
        Ok(Mode::Nothing) => ExitCode::SUCCESS,
        Ok(Mode::Child(cfg)) => {
            child(&cfg);
            ExitCode::SUCCESS
        }
        Ok(Mode::Parent(cfg)) => {
            if let Err(e) = self_test.then(self::self_test).unwrap_or(Ok(())) {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
            let start = Instant::now();
            let report = parent(&cfg);
            report.print(&cfg, start.elapsed());
            if report.failures.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Checks the runner itself on seeds 0..6 with an abort injected at seed 2 and a panic at
/// seed 4: each must be reported with its seed, and every other trial run. Returns what went
/// wrong, if anything.
pub fn self_test() -> Result<(), String> {
    let mut cfg = match parse(&[], 6) {
        Ok(Mode::Parent(cfg)) => cfg,
        _ => return Err("the default configuration does not parse".into()),
    };
    cfg.inject = Inject { abort_at: Some(2), panic_at: Some(4) };
    let report = Mutex::new(Report::default());
    run_range(&cfg, 0, 6, &report);
    let report = report.into_inner().expect("report");
    let failures: Vec<(u64, &str)> = report.failures.iter().map(|(s, c, _)| (*s, c.as_str())).collect();
    let trials: u64 = report.counts.values().sum();
    if failures != [(2, "crash"), (4, "panic")] || trials != 6 {
        return Err(format!("the runner's self-test expected a crash at seed 2, a panic at seed 4 and 6 trials; got {failures:?} in {trials} trials"));
    }
    Ok(())
}

/// The last panic's message and location, set by the child's panic hook.
static PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Runs the configured seeds in this process, one line per trial on stdout.
fn child(cfg: &Config) {
    let verbose = cfg.verbose;
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        let backtrace = std::backtrace::Backtrace::force_capture().to_string();
        let at = innermost_frame(&backtrace).or_else(|| info.location().map(|l| l.to_string())).unwrap_or_default();
        let whose = if at.contains("tests/fuzz/") { "in the fuzzer" } else { "inside coil" };
        *PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{msg} at {at} ({whose})"));
        if verbose {
            eprintln!("panic: {msg} at {at}\n{backtrace}");
        }
    }));
    let mut out = std::io::stdout();
    for seed in cfg.seed..cfg.seed + cfg.trials {
        let _ = writeln!(out, "start\t{seed}").and_then(|_| out.flush());
        if cfg.inject.abort_at == Some(seed) {
            std::process::abort();
        }
        let run = std::panic::catch_unwind(|| {
            assert!(cfg.inject.panic_at != Some(seed), "a panic injected at seed {seed}");
            judge(seed, &cfg.devices, cfg.verbose)
        });
        let verdict = run.unwrap_or_else(|_| {
            Verdict::Panic(PANIC.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default())
        });
        let detail = verdict.detail().replace(['\n', '\t'], " ");
        let _ = writeln!(out, "done\t{seed}\t{}\t{detail}", verdict.class()).and_then(|_| out.flush());
        if matches!(verdict, Verdict::Panic(_)) {
            std::process::exit(3);
        }
    }
}

/// The innermost frame of a backtrace in this workspace's code (paths relative to it, unlike
/// the standard library's, a dependency's or the C library's; not the panic hook's): where a
/// panic really comes from.
fn innermost_frame(backtrace: &str) -> Option<String> {
    const WORKSPACE_DIRS: [&str; 8] =
        ["ir/", "passes/", "codegen/", "runtime/", "frontend/", "src/", "tests/", "examples/"];
    backtrace
        .lines()
        .filter_map(|l| l.trim().strip_prefix("at "))
        .filter_map(|at| at.strip_prefix("./"))
        .find(|at| WORKSPACE_DIRS.iter().any(|d| at.starts_with(d)) && !at.contains("fuzz/runner.rs"))
        .map(|at| at.to_string())
}

/// Counts per class, and the failing trials.
#[derive(Default)]
struct Report {
    counts: BTreeMap<String, u64>,
    /// (seed, class, detail)
    failures: Vec<(u64, String, String)>,
    /// The first seed of each tolerated class and of each rejected op, for the record.
    examples: BTreeMap<String, u64>,
}

impl Report {
    fn add(&mut self, seed: u64, class: &str, detail: &str) {
        *self.counts.entry(class.to_string()).or_default() += 1;
        if Verdict::is_failure(class) {
            self.failures.push((seed, class.to_string(), detail.to_string()));
        } else if class.starts_with("tolerated") {
            self.examples.entry(class.to_string()).or_insert(seed);
        }
    }

    fn count(&self, pred: impl Fn(&str) -> bool) -> u64 {
        self.counts.iter().filter(|(c, _)| pred(c)).map(|(_, n)| n).sum()
    }

    fn print(&self, cfg: &Config, elapsed: Duration) {
        let n = |class: &str| self.counts.get(class).copied().unwrap_or(0);
        let trials = self.count(|_| true);
        let rejected = n("rejected") + n("bad-error");
        let tolerated = self.count(|c| c.starts_with("tolerated"));
        let devices: Vec<String> = cfg.devices.iter().map(|d| d.to_string()).collect();
        println!(
            "fuzz: seeds {}..{} on the interpreter and compiled on {} in {:.1} s ({} children at once)",
            cfg.seed,
            cfg.seed + cfg.trials,
            devices.join(", "),
            elapsed.as_secs_f64(),
            cfg.jobs
        );
        let rows = [
            ("trials", trials),
            ("rejected at record time", rejected),
            ("  of which without op or line (bad-error)", n("bad-error")),
            ("valid", trials - rejected - n("crash") - n("hang") - n("panic")),
            ("  too large to run", n("too-large")),
            ("  errors at realize, same kind everywhere", n("agree-error")),
            ("  internal errors at realize", n("internal")),
            ("  agreements", n("agree")),
            ("  tolerated (documented classes)", tolerated),
            ("  disagreements", n("disagree")),
            ("panics", n("panic")),
            ("crashes", n("crash")),
            ("hangs", n("hang")),
        ];
        for (what, count) in rows {
            println!("  {what:<44} {count:>7}");
        }
        for (class, count) in self.counts.iter().filter(|(c, _)| c.starts_with("tolerated")) {
            println!("    {class:<42} {count:>7} (first: seed {})", self.examples[class]);
        }
        for (seed, class, detail) in self.failures.iter().take(40) {
            let detail: String = detail.chars().take(600).collect();
            println!("FAIL seed {seed}: {class}: {detail}");
        }
        if let Some((seed, ..)) = self.failures.first() {
            println!(
                "replay one seed: cargo run --example fuzz -- --seed {seed} --trials 1 --device {} --verbose",
                device_spec(&cfg.devices)
            );
        }
    }
}

/// Runs every seed in children, `cfg.jobs` at once.
fn parent(cfg: &Config) -> Report {
    let report = Mutex::new(Report::default());
    let next = Mutex::new(cfg.seed);
    let end = cfg.seed + cfg.trials;
    std::thread::scope(|s| {
        for _ in 0..cfg.jobs {
            s.spawn(|| loop {
                let start = {
                    let mut n = next.lock().expect("seed cursor");
                    let start = *n;
                    *n = (start + cfg.batch).min(end);
                    start
                };
                if start >= end {
                    break;
                }
                run_range(cfg, start, (start + cfg.batch).min(end), &report);
            });
        }
    });
    report.into_inner().expect("report")
}

/// Runs seeds `start..end`, in as many children as crashes, panics and hangs require.
fn run_range(cfg: &Config, start: u64, end: u64, report: &Mutex<Report>) {
    let mut next = start;
    while next < end {
        let run = run_child(cfg, next, end - next);
        for (seed, class, detail) in &run.done {
            report.lock().expect("report").add(*seed, class, detail);
        }
        let finished = run.done.last().map_or(next, |d| d.0 + 1);
        match run.stopped {
            Stopped::Exited(_) if finished >= end => break,
            // A panic: its trial is reported; go on after it.
            Stopped::Exited(Some(3)) => next = finished,
            Stopped::Hung => {
                let seed = run.started.unwrap_or(finished);
                report.lock().expect("report").add(seed, "hang", &format!("no output for {:?}", cfg.timeout));
                next = seed + 1;
            }
            Stopped::Exited(code) => {
                let seed = run.started.filter(|&s| s >= finished).unwrap_or(finished);
                let alone = if seed == next {
                    "it was the child's first trial".to_string()
                } else {
                    let again = run_child(cfg, seed, 1);
                    if again.done.is_empty() {
                        "it crashes alone too".to_string()
                    } else {
                        format!("alone it does not crash: it needs the trials from seed {next} before it")
                    }
                };
                let how =
                    code.map_or(format!("killed by signal {}", run.signal.unwrap_or(0)), |c| format!("exit code {c}"));
                let detail = format!("{how}; {alone}; stderr: {}", run.stderr_tail);
                report.lock().expect("report").add(seed, "crash", &detail);
                next = seed + 1;
            }
        }
    }
}

/// How a child ended.
enum Stopped {
    /// Its exit code (`None`: killed by a signal).
    Exited(Option<i32>),
    Hung,
}

/// What a child reported.
struct ChildRun {
    /// (seed, class, detail) per finished trial.
    done: Vec<(u64, String, String)>,
    /// The last trial it started.
    started: Option<u64>,
    stopped: Stopped,
    /// The signal that killed it (6: an abort, 11: a segfault).
    signal: Option<i32>,
    /// Its last lines on stderr.
    stderr_tail: String,
}

/// Runs seeds `seed..seed + count` in one child until it ends, dies or hangs.
fn run_child(cfg: &Config, seed: u64, count: u64) -> ChildRun {
    let exe = std::env::current_exe().expect("the fuzzer's own binary");
    let mut cmd = Command::new(exe);
    cmd.args(["--child", "--seed", &seed.to_string(), "--trials", &count.to_string()]);
    cmd.args(["--device", device_spec(&cfg.devices)]);
    if cfg.verbose {
        cmd.arg("--verbose");
    }
    for (flag, seed) in [("--abort-at", cfg.inject.abort_at), ("--panic-at", cfg.inject.panic_at)] {
        if let Some(seed) = seed {
            cmd.args([flag, &seed.to_string()]);
        }
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn a fuzz child");
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let stderr = child.stderr.take().expect("piped");
    let verbose = cfg.verbose;
    let stderr_reader = std::thread::spawn(move || {
        let mut tail: Vec<String> = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            if verbose {
                eprintln!("{line}");
            }
            tail.push(line);
            if tail.len() > 8 {
                tail.remove(0);
            }
        }
        tail.join(" | ")
    });
    let mut run =
        ChildRun { done: vec![], started: None, stopped: Stopped::Hung, signal: None, stderr_tail: String::new() };
    loop {
        match rx.recv_timeout(cfg.timeout) {
            Ok(line) => {
                let fields: Vec<&str> = line.splitn(4, '\t').collect();
                match fields.as_slice() {
                    ["start", s] => run.started = s.parse().ok(),
                    ["done", s, class, detail] => {
                        run.done.push((s.parse().unwrap_or(u64::MAX), class.to_string(), detail.to_string()))
                    }
                    _ if cfg.verbose => println!("{line}"),
                    _ => {}
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().ok();
                run.signal = status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s));
                run.stopped = Stopped::Exited(status.and_then(|s| s.code()));
                break;
            }
        }
    }
    run.stderr_tail = stderr_reader.join().unwrap_or_default();
    run
}
