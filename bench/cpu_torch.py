#!/usr/bin/env python3
"""coil's CPU bench beside PyTorch eager and torch.compile on the same workloads and shapes (issue 20).

    cargo build --release --example bench
    python3 bench/cpu_torch.py --rounds 5 --out bench/results/cpu-$(date +%F)

Each round runs, one after another: coil's bench binary over the suite (one process per coil binary
named; `--coil NAME=PATH` may be given several times, e.g. a baseline build beside the current one,
their order turned by one each round),
then every workload in PyTorch eager and in torch.compile (compiled once, in the first round), then the
machine's copy bandwidth. Interleaving whole rounds spreads the load of other processes on a shared
machine over every column alike; each column's figure is the minimum over rounds of the per-round
medians ("min of medians"). A round's time per workload is the median of `--reps` wall-clock runs after
`--warmup` runs, as coil's bench times its own (`examples/bench.rs`).

Shapes are coil's bench shapes at `--scale` (default 0.05, coil's CPU default), computed with the same
rules as `examples/bench.rs` (`rows`, `inner`); the formulas are `../shared/bench/torch_suite.py`'s.
Threads: PyTorch uses `torch.get_num_threads()` (all cores unless OMP_NUM_THREADS says otherwise);
coil uses all cores too.

Copy bandwidth: `dst.copy_(src)` of two `--copy-mib` MiB float32 tensors (default 512, far beyond the
last-level cache), bytes read + written / time, min over the round's repetitions of the median, as the
GPU suite's ceiling is measured. GB/s of a workload = WORKLOADS.md's min bytes at these shapes / time.

Cold compile: coil's `compile_s`, the median over rounds (each round's bench process compiles every
graph with a fresh kernel cache of its own, so each round's figure is a cold compile; a single one on
this shared 2-core machine swung 2-2.5x with the others' load, see bench/NOTES.md, session 19), with
the CPU time of its C compiler runs (`compile_cpu_s`, the median over rounds: the wall figure less the
waits for a core), beside torch.compile's first call (compile and one run, with an empty Inductor
cache: TORCHINDUCTOR_CACHE_DIR is a fresh folder unless set) in the first round (it can be cold once).

Writes OUT.txt (the table) and OUT.json:
    {"device", "torch", "scale", "threads", "rounds", "load_averages", "copy_gbs",
     "rows": [{"name", "shape", "coil_us", "torch_compile_us", "torch_eager_us", "min_bytes", "flops",
               "coil_compile_s" (median over rounds), "coil_compile_rounds_s" (every round's),
               "coil_compile_cpu_s" (median over rounds; null when the binary does not report it),
               "torch_compile_s" (null with --no-compile),
               "coil_faults_per_run" (the first binary's minor page faults per timed run, the most of any
               round; null when it does not count them), "coil_<NAME>_us" for every other coil binary}]}
`coil_us` is the first `--coil` binary's time (the one the table's ratios use).
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

# torch.compile's cold compile is timed with an empty Inductor cache (its FX graph and kernel caches
# live there): a fresh folder per run of this script unless the caller names one.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="coil-cpu-torch-inductor-"))

import torch
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False


# ---- coil's bench shapes (examples/bench.rs) ----

def rust_round(x):
    """f64::round for x >= 0: half away from zero (Python's round() goes to even)."""
    return math.floor(x + 0.5)


def rows(n, f):
    return max(1, rust_round(n * f))


def inner(n, f, m):
    if f >= 1.0:
        return n
    return max(m, rust_round(n * math.sqrt(f) / m) * m)


def rnd(*shape, dtype=torch.float32, k=1.0):
    t = torch.randn(*shape, dtype=torch.float32)
    return (t * k if k != 1.0 else t).to(dtype)


def nbytes(numel, dtype):
    return numel * (2 if dtype == torch.bfloat16 else 4)


# Each workload: name -> make(scale) -> (shape text, inputs, fn, min bytes, flops)
W = {}


def workload(name):
    def deco(f):
        W[name] = f
        return f
    return deco


@workload("pointwise_chain_f32")
def _(s):
    n = rows(64 << 20, s)
    return f"x[{n}] f32", (rnd(n),), lambda x: torch.log(torch.exp(x) + 1.0) * 0.5, 2 * nbytes(n, torch.float32), 0


@workload("bias_gelu_bf16")
def _(s):
    r, c = rows(8192, s), 8192
    bf = torch.bfloat16
    fn = lambda x, b: F.gelu(x + b, approximate="tanh")
    return f"x[{r},{c}] bf16", (rnd(r, c, dtype=bf), rnd(c, dtype=bf)), fn, 2 * nbytes(r * c, bf) + nbytes(c, bf), 0


def softmax(s, r, c):
    r = rows(r, s)
    return f"x[{r},{c}] f32", (rnd(r, c),), lambda x: torch.softmax(x, dim=-1), 2 * nbytes(r * c, torch.float32), 0


W["softmax_f32_8192x4096"] = lambda s: softmax(s, 8192, 4096)
W["softmax_f32_1024x65536"] = lambda s: softmax(s, 1024, 65536)


def norm_inputs(s, xs, k):
    r, c = rows(8192, s), 4096
    bf = torch.bfloat16
    inputs = tuple(rnd(r, c, dtype=bf) for _ in range(xs)) + tuple(rnd(c, dtype=bf) for _ in range(k))
    return f"x[{r},{c}] bf16", inputs, nbytes(r * c, bf)


@workload("layernorm_bf16_8192x4096")
def _(s):
    shape, inputs, x = norm_inputs(s, 1, 2)
    return shape, inputs, lambda x, w, b: F.layer_norm(x, (x.shape[1],), w, b, 1e-5), 2 * x, 0


@workload("rmsnorm_bf16_8192x4096")
def _(s):
    shape, inputs, x = norm_inputs(s, 1, 1)

    def fn(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    return shape, inputs, fn, 2 * x, 0


@workload("add_layernorm_bf16_8192x4096")
def _(s):
    shape, inputs, x = norm_inputs(s, 2, 2)

    def fn(x, r, w, b):
        h = x + r
        return h, F.layer_norm(h, (h.shape[1],), w, b, 1e-5)

    return shape, inputs, fn, 4 * x, 0


@workload("col_sum_f32_8192x8192")
def _(s):
    r, c = rows(8192, s), 8192
    return f"x[{r},{c}] f32", (rnd(r, c),), lambda x: x.sum(dim=0), nbytes(r * c, torch.float32), 0


@workload("full_sum_f32_256M")
def _(s):
    n = rows(256 << 20, s)
    return f"x[{n}] f32", (rnd(n),), lambda x: x.sum(), nbytes(n, torch.float32), 0


@workload("cross_entropy_bf16_8192x50304")
def _(s):
    r, v = rows(8192, s), 50304
    bf = torch.bfloat16
    x, t = rnd(r, v, dtype=bf), torch.randint(0, v, (r,))
    return f"logits[{r},{v}] bf16", (x, t), lambda x, t: F.cross_entropy(x.float(), t), nbytes(r * v, bf), 0


@workload("mlp_bf16_8192x4096x16384")
def _(s):
    m, d, h = rows(8192, s), inner(4096, s, 64), inner(16384, s, 64)
    bf = torch.bfloat16
    inputs = (rnd(m, d, dtype=bf), rnd(h, d, dtype=bf, k=0.02), rnd(h, dtype=bf), rnd(d, h, dtype=bf, k=0.02),
              rnd(d, dtype=bf))
    fn = lambda x, w1, b1, w2, b2: F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)
    return f"M{m} D{d} H{h} bf16", inputs, fn, 0, 2 * 2 * m * d * h


HEAD_DIM = 64


def gpt2_block(x, ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b):
    B, T, C = x.shape
    H = C // HEAD_DIM
    h = F.layer_norm(x, (C,), ln1_w, ln1_b, 1e-5)
    q, k, v = F.linear(h, attn_w, attn_b).split(C, dim=2)
    q, k, v = (p.view(B, T, H, HEAD_DIM).transpose(1, 2) for p in (q, k, v))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HEAD_DIM))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf"))
    att = torch.softmax(att.float(), dim=-1).to(x.dtype)
    y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
    x = x + F.linear(y, proj_w, proj_b)
    h = F.layer_norm(x, (C,), ln2_w, ln2_b, 1e-5)
    return x + F.linear(F.gelu(F.linear(h, fc_w, fc_b), approximate="tanh"), fc2_w, fc2_b)


@workload("gpt2_block_fwd_bf16_b8_t1024")
def _(s):
    b, t = rows(8, s), inner(1024, s, 16)
    heads = 12 if s >= 1.0 else max(1, rust_round(12 * math.sqrt(s)))
    c = heads * HEAD_DIM
    bf = torch.bfloat16
    ln_w = lambda: (1.0 + 0.1 * torch.randn(c)).to(bf)
    inputs = (rnd(b, t, c, dtype=bf), ln_w(), rnd(c, dtype=bf, k=0.02), rnd(3 * c, c, dtype=bf, k=0.02),
              rnd(3 * c, dtype=bf, k=0.02), rnd(c, c, dtype=bf, k=0.02), rnd(c, dtype=bf, k=0.02), ln_w(),
              rnd(c, dtype=bf, k=0.02), rnd(4 * c, c, dtype=bf, k=0.02), rnd(4 * c, dtype=bf, k=0.02),
              rnd(c, 4 * c, dtype=bf, k=0.02), rnd(c, dtype=bf, k=0.02))
    bt = b * t
    flops = 2 * bt * (c * 3 * c + c * c + 8 * c * c) + 2 * 2 * bt * t * c
    return f"B{b} T{t} C{c} H{heads} bf16", inputs, gpt2_block, 0, flops


@workload("mlp_train_step_f32")
def _(s):
    n, d, h, k = rows(4096, s), inner(1024, s, 64), inner(4096, s, 64), inner(1000, s, 8)
    x, t = rnd(n, d), torch.randint(0, k, (n,))
    w1 = rnd(h, d, k=0.02).requires_grad_()
    w2 = rnd(h, h, k=0.02).requires_grad_()
    w3 = rnd(k, h, k=0.02).requires_grad_()

    def loss_fn(x, t, w1, w2, w3):
        a = F.gelu(F.linear(x, w1))
        a = F.gelu(F.linear(a, w2))
        return F.cross_entropy(F.linear(a, w3), t)

    def step(fwd):
        return lambda x, t, w1, w2, w3: torch.autograd.grad(fwd(x, t, w1, w2, w3), (w1, w2, w3))

    fn = step(loss_fn)
    fn.compile_with = lambda: step(torch.compile(loss_fn))
    return f"N{n} D{d} H{h} K{k} f32", (x, t, w1, w2, w3), fn, 0, 3 * 2 * n * (d * h + h * h + h * k)


# ---- timing ----

def time_us(fn, inputs, warmup, reps):
    """Median wall time of one call, in microseconds."""
    for _ in range(warmup):
        fn(*inputs)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*inputs)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def copy_gbs(mib, reps=10):
    """Copy bandwidth (bytes read + written per second) of two float32 tensors of `mib` MiB."""
    a = torch.randn(mib * 1024 * 1024 // 4)
    b = torch.empty_like(a)
    b.copy_(a)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        b.copy_(a)
        ts.append(time.perf_counter() - t0)
    return 2 * a.numel() * 4 / statistics.median(ts) / 1e9


def run_coil(path, args, names):
    """One run of a coil bench binary over `names`: {name: us}, {name: minor page faults per timed run}
    (the latter empty for a binary that does not count them)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [path, "--device", "cpu", "--scale", str(args.scale), "--warmup", str(args.warmup), "--reps",
           str(args.reps), "--only", ",".join(names), "--json", out]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in (0, 1):
        print(p.stdout, p.stderr, file=sys.stderr)
        raise RuntimeError(f"{' '.join(cmd)} exited with {p.returncode}")
    with open(out) as f:
        doc = json.load(f)
    os.unlink(out)
    faults = {r["name"]: r["minor_faults_per_run"] for r in doc["rows"] if r.get("minor_faults_per_run") is not None}
    compile_s = {r["name"]: (r.get("compile_s"), r.get("compile_cpu_s")) for r in doc["rows"]}
    return {r["name"]: r["us"] for r in doc["rows"]}, faults, compile_s, doc.get("device", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coil", action="append", default=[],
                    help="NAME=PATH of a coil bench binary (default: coil=target/release/examples/bench)")
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", default="")
    ap.add_argument("--copy-mib", type=int, default=512)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (eager only)")
    ap.add_argument("--out", default="", help="write OUT.txt and OUT.json")
    args = ap.parse_args()
    coils = [c.split("=", 1) for c in (args.coil or ["coil=target/release/examples/bench"])]
    names = [n for n in W if not args.only or n in args.only.split(",")]

    torch.manual_seed(0)
    cases = {n: W[n](args.scale) for n in names}
    compiled = {}
    samples = {n: {"eager": [], "compile": [], **{c: [] for c, _ in coils}} for n in names}
    # the first binary's minor page faults per timed run, every round
    faults = {n: [] for n in names}
    # cold compiles (seconds): each binary's (wall, C compiler CPU) in every round, torch.compile's first call
    coil_compile, torch_compile = {c: {n: [] for n in names} for c, _ in coils}, {}
    copies, loads = [], []
    device = ""
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        # the binaries' order turns each round: on this machine the first coil process of a round
        # ran 5-8% faster than the second in two runs of the same two binaries (both orders)
        for cname, path in coils[r % len(coils):] + coils[:r % len(coils)]:
            got, got_faults, got_compile, device = run_coil(path, args, names)
            for n in names:
                if n in got:
                    samples[n][cname].append(got[n])
                if cname == coils[0][0] and n in got_faults:
                    faults[n].append(got_faults[n])
                if n in got_compile:
                    coil_compile[cname][n].append(got_compile[n])
        for n in names:
            _, inputs, fn, _, _ = cases[n]
            samples[n]["eager"].append(time_us(fn, inputs, args.warmup, args.reps))
            if args.no_compile:
                continue
            if n not in compiled:
                torch._dynamo.reset()
                compiled[n] = fn.compile_with() if hasattr(fn, "compile_with") else torch.compile(fn)
                t0 = time.perf_counter()
                compiled[n](*inputs)
                torch_compile[n] = time.perf_counter() - t0
            samples[n]["compile"].append(time_us(compiled[n], inputs, args.warmup, args.reps))
        copies.append(copy_gbs(args.copy_mib))
        print(f"round {r + 1}/{args.rounds} done; copy {copies[-1]:.1f} GB/s", flush=True)

    best = lambda xs: min(xs) if xs else float("nan")
    med = lambda xs: statistics.median(xs) if xs else None
    # a binary's cold compile of a workload: the median over rounds of wall and C compiler CPU seconds
    cold_of = lambda c, n: (med([w for w, _ in coil_compile[c][n] if w is not None]),
                            med([u for _, u in coil_compile[c][n] if u is not None]))
    copy = max(copies)
    lead = coils[0][0]
    table_rows, json_rows = [], []
    for n in names:
        shape, _, _, mbytes, flops = cases[n]
        s = {k: best(v) for k, v in samples[n].items()}
        row = {"name": n, "shape": shape, "coil_us": s[lead], "torch_compile_us": s["compile"],
               "torch_eager_us": s["eager"], "min_bytes": mbytes, "flops": flops,
               "coil_faults_per_run": max(faults[n]) if faults[n] else None,
               "coil_compile_s": cold_of(lead, n)[0], "coil_compile_cpu_s": cold_of(lead, n)[1],
               "coil_compile_rounds_s": [w for w, _ in coil_compile[lead][n]],
               "torch_compile_s": torch_compile.get(n)}
        for c, _ in coils[1:]:
            row[f"coil_{c}_us"] = s[c]
            row[f"coil_{c}_compile_s"], row[f"coil_{c}_compile_cpu_s"] = cold_of(c, n)
        json_rows.append(row)
        rate = (f"{flops / (s[lead] * 1e-6) / 1e9:.0f} GFLOP/s" if flops
                else f"{mbytes / (s[lead] * 1e-6) / 1e9:.1f} GB/s")
        fmt = lambda x: f"{x:6.3f}" if x is not None else f"{'-':>6s}"
        others = " ".join(f"{s[c]:>10.1f} {fmt(cold_of(c, n)[0])} {fmt(cold_of(c, n)[1])}" for c, _ in coils[1:])
        flt = f"{max(faults[n]):.0f}" if faults[n] else "-"
        (cc, cpu), tc = cold_of(lead, n), torch_compile.get(n)
        cold = f"{fmt(cc)} {fmt(cpu)} {fmt(tc)} " + (f"{100 * cc / tc:5.1f}%" if cc is not None and tc else f"{'-':>6s}")
        table_rows.append(f"{n:30s} {shape:24s} {s['eager']:>10.1f} {s['compile']:>10.1f} {s[lead]:>10.1f} "
                          f"{s[lead] / s['compile']:>8.2f} {rate:>14s} {flt:>7s} {cold} {others}")
    header = (f"{'workload':30s} {'shape':24s} {'eager_us':>10s} {'compile_us':>10s} {lead + '_us':>10s} "
              f"{lead + '/cmp':>8s} {lead + ' rate':>14s} {'flt/run':>7s} {'cc_s':>6s} {'cc_cpu':>6s} {'tc_s':>6s} "
              f"{'cc/tc':>6s} " + " ".join(f"{c + '_us':>10s} {'cc_s':>6s} {'cc_cpu':>6s}" for c, _ in coils[1:]))
    threads = torch.get_num_threads()
    cpu = platform.processor() or platform.machine()
    intro = [
        f"coil CPU bench beside PyTorch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}) on {device}",
        f"date {datetime.date.today()}, scale {args.scale}, torch threads {threads}, {args.rounds} interleaved rounds "
        f"(each: {', '.join(c for c, _ in coils)} in turns, torch eager + compile, copy), warmup {args.warmup}, "
        f"reps {args.reps}",
        f"each figure: min over rounds of the round's median; copy bandwidth {copy:.1f} GB/s (read + written, "
        f"{args.copy_mib} MiB, best round; rounds: {', '.join(f'{c:.1f}' for c in copies)})",
        f"1-minute load average of the machine as each round began: {', '.join(f'{l:.1f}' for l in loads)} "
        f"(on {os.cpu_count()} CPUs; other processes' load slows every column alike only on average)",
        f"flt/run: {lead}'s minor page faults per timed run, the most of any round (nonzero: a run wrote fresh memory)",
        f"cold compile: cc_s a binary's compile_s, the median over rounds (each round a fresh process and kernel cache), "
        f"cc_cpu its C compiler runs' CPU seconds (median), tc_s torch.compile's first call (compile + one run, empty "
        f"Inductor cache, first round), cc/tc {lead}'s cc_s over tc_s",
    ]
    text = "\n".join(intro + ["", header, "-" * len(header)] + table_rows) + "\n"
    print(text)
    if args.out:
        with open(args.out + ".txt", "w") as f:
            f.write(text)
        doc = {"device": device or cpu, "torch": torch.__version__, "scale": args.scale, "threads": threads,
               "rounds": args.rounds, "load_averages": loads, "copy_gbs": copy, "rows": json_rows}
        with open(args.out + ".json", "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"wrote {args.out}.txt and {args.out}.json")


if __name__ == "__main__":
    main()
