#!/usr/bin/env python3
"""Warm first pass and steady call of `examples/eager_shapes.rs` builds, alternating (A/B of coil builds).

    python3 bench/tools/eager_ab.py ROUNDS NAME=BINARY=CACHE_DIR [NAME=BINARY=CACHE_DIR ...]

Each round runs every binary once (`--device cpu --reps 100`, `COIL_CACHE_DIR=CACHE_DIR`: warm it
with one run first), in the order given; prints the minimum and median of `first_pass_s` (ms) and
`steady_us` per binary, and the 1-minute load average at the end. `bench/cpu_eager_shapes.py`
compares one build with PyTorch; this compares builds with each other on a shared machine.
"""
import json
import os
import statistics
import subprocess
import sys


def main():
    rounds, bins = int(sys.argv[1]), sys.argv[2:]
    res = {b: ([], []) for b in bins}
    for _ in range(rounds):
        for b in bins:
            _, path, cache = b.split("=")
            out = subprocess.run([path, "--device", "cpu", "--reps", "100"], env=dict(os.environ, COIL_CACHE_DIR=cache),
                                 capture_output=True, text=True, check=True).stdout
            d = json.loads(out.strip().splitlines()[-1])
            res[b][0].append(d["first_pass_s"] * 1e3)
            res[b][1].append(d["steady_us"])
    print(f"1-minute load {os.getloadavg()[0]:.1f}")
    for b in bins:
        f, s = res[b]
        print(f"{b.split('=')[0]:6s} first ms min {min(f):.2f} med {statistics.median(f):.2f} | "
              f"steady us min {min(s):.1f} med {statistics.median(s):.1f}")


if __name__ == "__main__":
    main()
