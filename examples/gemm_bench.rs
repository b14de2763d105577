//! The matrix products of the CPU suite's matmul workloads (`examples/bench.rs` at scale 0.05),
//! one by one: coil's packed template, coil's `gemm`-crate path and PyTorch, in interleaved
//! rounds.
//!
//! ```sh
//! cargo run --release --example gemm_bench                       # all shapes, 3 rounds
//! cargo run --release --example gemm_bench -- --rounds 5 --only mlp --reps 30
//! cargo run --release --example gemm_bench -- --avx2 --torch-avx2 # as a CPU without AVX-512
//! cargo run --release --example gemm_bench -- --set eager --no-crate # eager_shapes' products
//! ```
//!
//! Each round times, per product, coil's packed engine (and with `--avx2` its AVX2 build),
//! coil's crate engine (`coil_runtime::cpu::gemm::GemmEngine`), then PyTorch (`python3 -c`,
//! one process per round, skipped when `python3` cannot import torch): each `--warmup` runs
//! then the median of `--reps` wall-clock runs, and the mean CPU time of all the process's
//! threads per run (on a machine other processes load, CPU time / threads is the steadier
//! estimate of an idle machine's wall time; it also counts pool threads waiting busily). A
//! column's figures are the minimum and the median over rounds; interleaving rounds spreads other
//! processes' load over the columns alike. coil's runs go straight to the product (`bmm_bytes_with` on the
//! operands' bytes: no graph); PyTorch's are `F.linear(x, w, b)` (`nt`, with a bias where the
//! workload has one), `a @ b` (`nn`) and `a.t() @ b` (`tn`), on operands of the same layouts.
//! The bias + GELU rows time coil's fused epilogue beside PyTorch's `gelu(linear(...))`.
//! Threads: all cores on both sides (`torch.set_num_threads`). `--set eager` times instead the
//! products of `examples/eager_shapes.rs` (`[n, d] @ [d, d]`, n = 16 + 8i, d = 64 + 16i, i < 20)
//! in f32 and bf16.

use coil_ir::loops::{Activation, BiasOperand, BufferId, StridedOperand};
use coil_ir::DType;
use coil_runtime::cpu::gemm::{bmm_bytes_with, BmmSpec, GemmEngine};
use coil_runtime::cpu::jobs;
use half::{bf16, f16};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

const HELP: &str = "\
usage: gemm_bench [--set suite|eager|all] [--only SUBSTRING] [--shape D:M:K:N:FORM]... [--rounds N] [--warmup N]
                  [--reps N] [--no-torch] [--no-crate] [--avx2] [--torch-avx2] [--best]
                  [--cold MB]

  --set S       the products timed: the suite's (default), eager_shapes' (f32 and bf16), or both
  --only S      only the products whose name contains S (mlp, gpt2, train, eager, ...)
  --shape P     time this product instead of the suite's (may be given several times): dtype
                (f32, f16, bf16), m, k, n and form (nt, nn, tn), e.g. bf16:1:4096:4096:nt
  --rounds N    interleaved rounds (default 3); each figure is the min (and the median) over rounds of the
                medians
  --warmup N    untimed runs before each timing (default 3)
  --reps N      timed runs, median (default 20)
  --no-torch    leave PyTorch out
  --no-crate    leave coil's gemm-crate engine out
  --avx2        also time the template built for AVX2 + FMA only (GemmEngine::PackedAvx2: the
                kernels a CPU without AVX-512 runs), beside this machine's build
  --torch-avx2  PyTorch limited to AVX2 (MKL, oneDNN and ATen's own switches, in its process)
  --cold MB     write MB MiB of another buffer before each timed run (coil only), so that the operands
                come from memory as in a graph whose other kernels evict them (64: more than the L2s)
  --best        each timing's fastest run instead of its median (coil only; on a machine other
                processes load, the fastest run is the one that had the cores to itself)
";

/// How the operands lie: `nt` is `x [m, k] @ w [n, k]^T` (a linear layer), `nn` `a [m, k] @ b
/// [k, n]`, `tn` `a [k, m]^T @ b [k, n]` (a weight gradient).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Form {
    Nt,
    Nn,
    Tn,
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::Nt => "nt",
            Form::Nn => "nn",
            Form::Tn => "tn",
        }
    }
}

/// One product: `[m, k] @ [k, n]` in `dtype`, its operands' form and epilogue.
#[derive(Clone, Debug)]
struct Product {
    name: String,
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    form: Form,
    bias: bool,
    gelu: bool,
}

fn p(
    name: &'static str,
    dtype: DType,
    (m, k, n): (usize, usize, usize),
    form: Form,
    bias: bool,
    gelu: bool,
) -> Product {
    Product { name: name.to_string(), dtype, m, n, k, form, bias, gelu }
}

/// The suite's products at scale 0.05: mlp_bf16 (M410 D896 H3648), gpt2_block_fwd_bf16 (T224
/// C192; the attention's products run in the attention template), mlp_train_step_f32 (N205 D256
/// H896 K224: forward, then the input and weight gradients of each layer).
fn suite() -> Vec<Product> {
    vec![
        p("mlp.fc1+gelu", DType::BF16, (410, 896, 3648), Form::Nt, true, true),
        p("mlp.fc1", DType::BF16, (410, 896, 3648), Form::Nt, true, false),
        p("mlp.fc2", DType::BF16, (410, 3648, 896), Form::Nt, true, false),
        p("gpt2.qkv", DType::BF16, (224, 192, 576), Form::Nt, true, false),
        p("gpt2.proj", DType::BF16, (224, 192, 192), Form::Nt, true, false),
        p("gpt2.fc+gelu", DType::BF16, (224, 192, 768), Form::Nt, true, true),
        p("gpt2.fc2", DType::BF16, (224, 768, 192), Form::Nt, true, false),
        p("train.l1", DType::F32, (205, 256, 896), Form::Nt, false, false),
        p("train.l2", DType::F32, (205, 896, 896), Form::Nt, false, false),
        p("train.l3", DType::F32, (205, 896, 224), Form::Nt, false, false),
        p("train.dx3", DType::F32, (205, 224, 896), Form::Nn, false, false),
        p("train.dw3", DType::F32, (224, 205, 896), Form::Tn, false, false),
        p("train.dx2", DType::F32, (205, 896, 896), Form::Nn, false, false),
        p("train.dw2", DType::F32, (896, 205, 896), Form::Tn, false, false),
        p("train.dw1", DType::F32, (896, 205, 256), Form::Tn, false, false),
        p("f16.l2", DType::F16, (205, 896, 896), Form::Nt, false, false),
    ]
}

/// The products of `examples/eager_shapes.rs` (`gelu(layer_norm(x)) @ w`, `x [n, d]`, `w [d, d]`,
/// n = 16 + 8i, d = 64 + 16i for i < 20), in f32 (what it runs) and bf16.
fn eager() -> Vec<Product> {
    [DType::F32, DType::BF16]
        .into_iter()
        .flat_map(|dtype| {
            (0..20).map(move |i| {
                let (n, d) = (16 + 8 * i, 64 + 16 * i);
                let name = format!("eager.{i}");
                Product { name, dtype, m: n, n: d, k: d, form: Form::Nn, bias: false, gelu: false }
            })
        })
        .collect()
}

/// Deterministic values in about [-1, 1) times `scale`, stored in `dtype`, as u64 words (aligned
/// for every element type).
fn operand(dtype: DType, len: usize, seed: u64, scale: f64) -> Vec<u64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut bytes = Vec::with_capacity(len * dtype.size_bytes());
    for _ in 0..len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let x = ((s >> 11) as f64 / (1u64 << 52) as f64 - 1.0) * scale;
        match dtype {
            DType::F32 => bytes.extend((x as f32).to_ne_bytes()),
            DType::F16 => bytes.extend(f16::from_f64(x).to_bits().to_ne_bytes()),
            _ => bytes.extend(bf16::from_f64(x).to_bits().to_ne_bytes()),
        }
    }
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(&bytes);
    words
}

/// The product's spec (A and B as `Form` lays them out in buffers 0 and 1, the bias in 2).
fn spec(p: &Product) -> BmmSpec {
    let (m, n, k) = (p.m, p.n, p.k);
    let view = |buffer, row_stride, col_stride| StridedOperand {
        buffer: BufferId(buffer),
        offset: 0,
        batch_strides: vec![],
        row_stride,
        col_stride,
    };
    let (a, b) = match p.form {
        Form::Nt => (view(0, k, 1), view(1, 1, k)),
        Form::Nn => (view(0, k, 1), view(1, n, 1)),
        Form::Tn => (view(0, 1, m), view(1, n, 1)),
    };
    BmmSpec {
        a,
        b,
        batch: vec![],
        m,
        n,
        k,
        bias: p.bias.then_some(BiasOperand { buffer: BufferId(2), offset: 0, stride: 1 }),
        activation: p.gelu.then_some(Activation::GeluTanh),
        activation_grad: None,
    }
}

/// CPU time all threads of this process have run (user + system, `/proc/self/stat`), in
/// microseconds at the kernel's 10 ms tick (USER_HZ 100 on Linux); `None` where it cannot be read.
fn process_cpu_us() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // fields after the command name (which may hold spaces) start at field 3
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 * 1e4)
}

/// A timing: median wall time and median CPU time of one run, in microseconds.
#[derive(Clone, Copy)]
struct Timing {
    wall: f64,
    cpu: f64,
}

impl Timing {
    const NONE: Timing = Timing { wall: f64::INFINITY, cpu: f64::INFINITY };

    fn min(self, o: Timing) -> Timing {
        Timing { wall: self.wall.min(o.wall), cpu: self.cpu.min(o.cpu) }
    }
}

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Median wall time of `f`, and its mean CPU time: the process's CPU time over the timed runs
/// (repeated until they cover at least 50 ticks of it, so the tick rounds off at most 2 %) per
/// run. The CPU time counts every thread's work, and so also pool threads waiting busily.
/// `--cold MB`: MiB written between timed runs (0: none).
static COLD_MB: AtomicUsize = AtomicUsize::new(0);

/// `--best`: a timing's wall time is its fastest run rather than its median.
static BEST: AtomicBool = AtomicBool::new(false);

fn time_runs(warmup: usize, reps: usize, mut f: impl FnMut()) -> Timing {
    for _ in 0..warmup {
        f();
    }
    let mut wall = Vec::new();
    let (cpu0, mut runs) = (process_cpu_us(), 0usize);
    let evict: Vec<AtomicU64> = (0..COLD_MB.load(Ordering::Relaxed) << 17).map(|_| AtomicU64::new(0)).collect();
    let parts = evict.len().div_ceil(1 << 15);
    loop {
        // `--cold`: the operands leave the caches, as a graph's other kernels make them leave;
        // on coil's threads, whose helpers then linger into the product as after a kernel
        jobs::run(parts, jobs::helpers(), &|p| {
            for word in evict[p << 15..evict.len().min((p + 1) << 15)].iter().step_by(8) {
                word.store(word.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            }
        });
        let start = Instant::now();
        f();
        wall.push(start.elapsed().as_secs_f64() * 1e6);
        runs += 1;
        let spent = match (cpu0, process_cpu_us()) {
            (Some(a), Some(b)) => b - a,
            _ => f64::INFINITY,
        };
        if runs >= reps.max(1) && (spent >= 50.0 * 1e4 || runs >= 100 * reps.max(1)) {
            let cpu = if spent.is_finite() { spent / runs as f64 } else { f64::NAN };
            let wall = if BEST.load(Ordering::Relaxed) {
                wall.iter().copied().fold(f64::INFINITY, f64::min)
            } else {
                median(wall)
            };
            return Timing { wall, cpu };
        }
    }
}

/// coil's time for `p` with `engine`.
fn time_coil(p: &Product, engine: GemmEngine, warmup: usize, reps: usize) -> Timing {
    let size = p.dtype.size_bytes();
    let (a, b, bias) =
        (operand(p.dtype, p.m * p.k, 1, 1.0), operand(p.dtype, p.k * p.n, 2, 0.02), operand(p.dtype, p.n, 3, 0.02));
    fn bytes(w: &[u64], len: usize) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(w)[..len]
    }
    let (a, b) = (bytes(&a, p.m * p.k * size), bytes(&b, p.k * p.n * size));
    let bias = if p.bias { bytes(&bias, p.n * size) } else { &[] };
    let mut out = vec![0u64; (p.m * p.n * size).div_ceil(8)];
    let spec = spec(p);
    time_runs(warmup, reps, || {
        let out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut out)[..p.m * p.n * size];
        bmm_bytes_with(engine, &spec, p.dtype, a, b, bias, out).expect("the product runs");
    })
}

/// PyTorch's times for `products` (one `python3` process), or `None` without torch.
/// With `avx2`, PyTorch's libraries are limited to AVX2 through their own switches (MKL's
/// `MKL_ENABLE_INSTRUCTIONS`, oneDNN's `ONEDNN_MAX_CPU_ISA`, ATen's `ATEN_CPU_CAPABILITY`), set
/// in the child process only.
fn time_torch(products: &[Product], warmup: usize, reps: usize, avx2: bool) -> Option<Vec<Timing>> {
    const SCRIPT: &str = r#"
import sys, time, torch
import torch.nn.functional as F
warmup, reps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(int(sys.argv[3]))
dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
for spec in sys.argv[4:]:
    dt, m, n, k, form, bias, gelu = spec.split(":")
    m, n, k, dt = int(m), int(n), int(k), dtypes[dt]
    r = lambda *s, c=1.0: (torch.rand(*s) * 2 - 1).mul(c).to(dt)
    b = r(n, c=0.02) if bias == "1" else None
    if form == "nt":
        x, w = r(m, k), r(n, k, c=0.02)
        f = lambda: F.linear(x, w, b)
    elif form == "nn":
        x, w = r(m, k), r(k, n, c=0.02)
        f = lambda: x @ w
    else:
        x, w = r(k, m), r(k, n, c=0.02)
        f = lambda: x.t() @ w
    g = (lambda: F.gelu(f(), approximate="tanh")) if gelu == "1" else f
    with torch.no_grad():
        for _ in range(warmup):
            g()
        ts, c0 = [], time.process_time()
        for _ in range(reps):
            t0 = time.perf_counter()
            g()
            ts.append((time.perf_counter() - t0) * 1e6)
        cpu = (time.process_time() - c0) * 1e6 / reps
    ts.sort()
    print(ts[len(ts) // 2], cpu, flush=True)
"#;
    let dtype = |d: DType| match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        _ => "bf16",
    };
    let args = products.iter().map(|p| {
        format!("{}:{}:{}:{}:{}:{}:{}", dtype(p.dtype), p.m, p.n, p.k, p.form.name(), p.bias as u8, p.gelu as u8)
    });
    let mut python = Command::new("python3");
    if avx2 {
        python.envs([
            ("MKL_ENABLE_INSTRUCTIONS", "AVX2"),
            ("ONEDNN_MAX_CPU_ISA", "AVX2"),
            ("ATEN_CPU_CAPABILITY", "avx2"),
        ]);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let counts = [warmup, reps, threads].map(|x| x.to_string());
    let out = python.arg("-c").arg(SCRIPT).args(counts).args(args).output().ok()?;
    if !out.status.success() {
        eprintln!("torch column left out: {}", String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or(""));
        return None;
    }
    let times: Vec<Timing> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace().map(|x| x.parse::<f64>().ok());
            Some(Timing { wall: w.next()??, cpu: w.next()?? })
        })
        .collect();
    (times.len() == products.len()).then_some(times)
}

/// A `--shape` product: `dtype:m:k:n:form`.
fn parse_shape(text: &str) -> Product {
    let bad = || -> ! { panic!("--shape {text}: expected D:M:K:N:FORM, e.g. bf16:1:4096:4096:nt\n{HELP}") };
    let parts: Vec<&str> = text.split(':').collect();
    let [dtype, m, k, n, form] = parts[..] else { bad() };
    let dtype = match dtype {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        _ => bad(),
    };
    let form = match form {
        "nt" => Form::Nt,
        "nn" => Form::Nn,
        "tn" => Form::Tn,
        _ => bad(),
    };
    let dim = |x: &str| x.parse::<usize>().unwrap_or_else(|_| bad());
    p("shape", dtype, (dim(m), dim(k), dim(n)), form, false, false)
}

/// A column of the table: a label and, per product, its timing in each round.
struct Column {
    label: &'static str,
    rounds: Vec<Vec<Timing>>,
}

impl Column {
    /// Product `i`'s minimum over rounds (wall and CPU time apart).
    fn min(&self, i: usize) -> Timing {
        self.rounds[i].iter().fold(Timing::NONE, |a, &b| a.min(b))
    }

    /// Product `i`'s median wall time over rounds.
    fn median_wall(&self, i: usize) -> f64 {
        median(self.rounds[i].iter().map(|t| t.wall).collect())
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut only, mut rounds, mut warmup, mut reps, mut torch) = (String::new(), 3usize, 3usize, 20usize, true);
    let (mut shapes, mut avx2, mut torch_avx2): (Vec<Product>, bool, bool) = (Vec::new(), false, false);
    let (mut set, mut crate_engine) = (String::from("suite"), true);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> usize {
            args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{what} takes a number\n{HELP}"))
        };
        match a.as_str() {
            "--set" => set = args.next().expect("--set takes suite, eager or all"),
            "--only" => only = args.next().expect("--only takes a substring"),
            "--shape" => shapes.push(parse_shape(&args.next().expect("--shape takes D:M:K:N:FORM"))),
            "--rounds" => rounds = num("--rounds").max(1),
            "--warmup" => warmup = num("--warmup"),
            "--reps" => reps = num("--reps"),
            "--no-torch" => torch = false,
            "--no-crate" => crate_engine = false,
            "--avx2" => avx2 = true,
            "--torch-avx2" => torch_avx2 = true,
            "--best" => BEST.store(true, Ordering::Relaxed),
            "--cold" => COLD_MB.store(num("--cold"), Ordering::Relaxed),
            "--help" | "-h" => {
                print!("{HELP}");
                return;
            }
            other => panic!("unknown argument {other}\n{HELP}"),
        }
    }
    let products: Vec<Product> = if shapes.is_empty() {
        let all = match set.as_str() {
            "suite" => suite(),
            "eager" => eager(),
            "all" => suite().into_iter().chain(eager()).collect(),
            other => panic!("--set {other}: expected suite, eager or all\n{HELP}"),
        };
        all.into_iter().filter(|p| p.name.contains(&only)).collect()
    } else {
        shapes
    };
    let mut engines = vec![("pk", GemmEngine::Packed)];
    if avx2 {
        engines.push(("a2", GemmEngine::PackedAvx2));
    }
    if crate_engine {
        engines.push(("cr", GemmEngine::Crate));
    }
    let empty = || vec![Vec::new(); products.len()];
    let mut columns: Vec<Column> = engines.iter().map(|&(label, _)| Column { label, rounds: empty() }).collect();
    let mut torch_column = Column { label: "th", rounds: empty() };
    let mut have_torch = torch;
    for _ in 0..rounds {
        for (i, p) in products.iter().enumerate() {
            for (column, &(_, engine)) in columns.iter_mut().zip(&engines) {
                column.rounds[i].push(time_coil(p, engine, warmup, reps));
            }
        }
        if have_torch {
            match time_torch(&products, warmup, reps, torch_avx2) {
                Some(t) => torch_column.rounds.iter_mut().zip(t).for_each(|(r, t)| r.push(t)),
                None => have_torch = false,
            }
        }
    }
    if have_torch {
        columns.push(torch_column);
    }
    print_table(&products, &columns, (rounds, warmup, reps), avx2, torch_avx2, have_torch);
}

/// The table: per product the minimum and median over rounds of each column's wall time, the
/// minimum CPU time and the GFLOP/s of the minimum, and the ratios of wall times; then the sums
/// of each set's (suite, eager) and dtype's minima and medians.
fn print_table(
    products: &[Product],
    columns: &[Column],
    (rounds, warmup, reps): (usize, usize, usize),
    avx2: bool,
    torch_avx2: bool,
    have_torch: bool,
) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "coil GEMM beside PyTorch on the CPU ({threads} threads), {rounds} interleaved rounds, warmup {warmup}, reps {reps}: \
         the min and the median over rounds of each round's median"
    );
    println!(
        "wall: median wall-clock time in us (min over rounds, then median over rounds: med); cpu: mean CPU time of all \
         threads / {threads} (about the wall time of an idle machine; robust to other processes' load, but it counts \
         threads waiting busily), min over rounds. GF: GFLOP/s of the min wall time"
    );
    println!(
        "pk: coil's packed template (this machine's build); {}{}th: PyTorch{}{}",
        if avx2 { "a2: the template built for AVX2 + FMA only; " } else { "" },
        if columns.iter().any(|c| c.label == "cr") { "cr: the gemm crate; " } else { "" },
        if torch_avx2 { " limited to AVX2" } else { "" },
        if have_torch { "" } else { " (left out)" }
    );
    // ratios of wall times: the template (and its AVX2 build) against the crate and PyTorch
    let find = |label: &str| columns.iter().position(|c| c.label == label);
    let ratios: Vec<(String, usize, usize)> = [("pk", "th"), ("a2", "cr"), ("a2", "th")]
        .into_iter()
        .filter_map(|(x, y)| Some((format!("{x}/{y}"), find(x)?, find(y)?)))
        .collect();
    let mut header = format!("{:<14} {:<5} {:>14} {:<7}", "product", "dtype", "m x k x n", "form");
    for what in ["wall", "med", "cpu", "GF"] {
        header += " |";
        for c in columns {
            header += &format!(" {:>8}", format!("{}_{what}", c.label));
        }
    }
    header += " |";
    for (name, _, _) in &ratios {
        header += &format!(" {name:>7} {:>7}", "med");
    }
    println!("{header}");
    let t = threads as f64;
    let cell = |x: f64, digits: usize| format!(" {x:>8.digits$}");
    for (i, p) in products.iter().enumerate() {
        let gflops = |us: f64| 2.0 * (p.m * p.n * p.k) as f64 / us / 1e3;
        let epilogue = match (p.bias, p.gelu) {
            (true, true) => "+b+g",
            (true, false) => "+b",
            _ => "",
        };
        let mut line = format!(
            "{:<14} {:<5} {:>14} {:<7}",
            p.name,
            p.dtype.to_string(),
            format!("{}x{}x{}", p.m, p.k, p.n),
            format!("{}{epilogue}", p.form.name())
        );
        let figures: [&dyn Fn(&Column) -> String; 4] =
            [&|c| cell(c.min(i).wall, 1), &|c| cell(c.median_wall(i), 1), &|c| cell(c.min(i).cpu / t, 1), &|c| {
                cell(gflops(c.min(i).wall), 0)
            }];
        for figure in figures {
            line += " |";
            for c in columns {
                line += &figure(c);
            }
        }
        line += " |";
        for &(_, x, y) in &ratios {
            let (x, y) = (&columns[x], &columns[y]);
            line += &format!(" {:>7.2} {:>7.2}", x.min(i).wall / y.min(i).wall, x.median_wall(i) / y.median_wall(i));
        }
        println!("{line}");
    }
    // per set and dtype: the sum of the products' times (eager_shapes runs its products one
    // after another)
    let set = |p: &Product| if p.name.starts_with("eager") { "eager" } else { "suite" };
    let mut groups: Vec<(&str, DType)> = Vec::new();
    for p in products {
        if !groups.contains(&(set(p), p.dtype)) {
            groups.push((set(p), p.dtype));
        }
    }
    for (name, dtype) in groups {
        let of = |i: &usize| set(&products[*i]) == name && products[*i].dtype == dtype;
        let mut line = format!("{:<14} {:<5} {:>14} {:<7}", format!("sum {name}"), dtype.to_string(), "", "");
        line += " |";
        for c in columns {
            line += &cell((0..products.len()).filter(of).map(|i| c.min(i).wall).sum(), 1);
        }
        line += " |";
        for c in columns {
            line += &cell((0..products.len()).filter(of).map(|i| c.median_wall(i)).sum(), 1);
        }
        println!("{line}");
    }
}
