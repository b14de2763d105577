#!/usr/bin/env python3
"""Everyday eager use on new shapes, coil against PyTorch eager (issue 20, deliverable 6/7).

`layer_norm -> gelu -> matmul` on 20 shapes never seen before (rows 16 + 8i, features 64 + 16i),
then one shape (64 x 256) again and again, as `examples/eager_shapes.rs` does. Runs that binary
cold (an empty disk cache) and warm (the same cache again), PyTorch eager in between, for
`--rounds` rounds; reports the minimum and median of each figure.

usage: cpu_eager_shapes.py --coil target/release/examples/eager_shapes [--rounds 5] [--threads 2]
       [--json OUT.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import torch
import torch.nn.functional as F


def shape(i):
    return 16 + 8 * i, 64 + 16 * i


def inputs(n, d):
    return torch.rand(n, d) * 2 - 1, torch.rand(d, d) * 2 - 1, torch.rand(d) * 2 - 1, torch.rand(d) * 2 - 1


def step(x, w, g, b):
    y = F.gelu(F.layer_norm(x, (w.shape[0],), g, b, 1e-5)) @ w
    return y[0, 0].item()


def torch_round(shapes, reps):
    # The data exist before the clock starts, as in examples/eager_shapes.rs.
    data = [inputs(*shape(i)) for i in range(shapes)]
    start = time.perf_counter()
    for x in data:
        step(*x)
    first = time.perf_counter() - start
    steady = inputs(64, 256)
    for _ in range(10):
        step(*steady)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        step(*steady)
        times.append((time.perf_counter() - t) * 1e6)
    return first, statistics.median(times)


def coil_round(binary, cache, shapes, reps):
    env = dict(os.environ, COIL_CACHE_DIR=cache)
    out = subprocess.run([binary, "--device", "cpu", "--shapes", str(shapes), "--reps", str(reps)],
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--coil", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", type=int, default=20)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # The machine is shared: its 1-minute load before and after the rounds goes with the figures.
    load_before = os.getloadavg()[0]
    rows = {k: [] for k in ["coil_cold_s", "coil_warm_s", "coil_steady_us", "torch_first_s", "torch_steady_us"]}
    compiles, tier0 = None, None
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as cache:
            cold = coil_round(args.coil, cache, args.shapes, args.reps)
            first, steady = torch_round(args.shapes, args.reps)
            # PyTorch's OpenMP threads keep spinning after its round (their block time, 200 ms
            # by default) and would share the 2 cores with coil's warm run: wait them out.
            time.sleep(0.5)
            warm = coil_round(args.coil, cache, args.shapes, args.reps)
        rows["coil_cold_s"].append(cold["first_pass_s"])
        rows["coil_warm_s"].append(warm["first_pass_s"])
        rows["coil_steady_us"].append(min(cold["steady_us"], warm["steady_us"]))
        rows["torch_first_s"].append(first)
        rows["torch_steady_us"].append(steady)
        compiles = cold["compiles"]
        tier0 = (cold.get("tier0", 0), warm.get("tier0", 0))
    summary = {k: {"min": min(v), "median": statistics.median(v)} for k, v in rows.items()}
    ratio = lambda a, b, s: summary[a][s] / summary[b][s]
    print(f"torch {torch.__version__}, {args.threads} threads, {args.rounds} rounds, {args.shapes} new shapes; "
          f"coil compiled {compiles} graphs in its first pass; tier 0 ran {tier0[0]} (cold) / {tier0[1]} (warm) "
          f"of its realizations; 1-minute load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    for k, v in summary.items():
        print(f"{k:18} min {v['min']:10.4f}  median {v['median']:10.4f}")
    for s in ["min", "median"]:
        print(f"{s:6}: cold {ratio('coil_cold_s', 'torch_first_s', s):.2f}x eager, warm "
              f"{ratio('coil_warm_s', 'torch_first_s', s):.2f}x, steady {ratio('coil_steady_us', 'torch_steady_us', s):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": args.threads, "rounds": args.rounds,
                       "shapes": args.shapes, "coil_compiles": compiles,
                       "coil_tier0_runs": {"cold": tier0[0], "warm": tier0[1]},
                       "load_1min": {"before": load_before, "after": os.getloadavg()[0]}, "summary": summary,
                       "samples": rows}, f,
                      indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
