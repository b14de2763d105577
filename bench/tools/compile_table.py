#!/usr/bin/env python3
"""Cold compile and warm start of coil against torch.compile's compile time, from one run.

usage: compile_table.py ANCHORS.json COIL.json
ANCHORS.json is torch_suite.py's output, COIL.json `bench --json`'s, both from the same device
call (`run.sh bench`). Targets (issue 4): a cold compile (a fresh kernel cache) in at most 10% of
torch.compile's compile time; a second process with the disk cache warm (warm_compile_s) reaching
its first result in at most 5 ms of compile work. Exit status 0 always; this only reports.
"""
import json, sys


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return
    torch_rows = {r["name"]: r for r in json.load(open(sys.argv[1])).get("rows", [])}
    coil_rows = json.load(open(sys.argv[2])).get("rows", [])
    print(f"{'workload':34s} {'coil_s':>7s} {'torch_s':>7s} {'share':>6s} {'warm_ms':>7s}  target <= 10%")
    met = warm_met = 0
    for r in coil_rows:
        torch_s = torch_rows.get(r["name"], {}).get("default_compile_s")
        share = r["compile_s"] / torch_s if torch_s else float("nan")
        warm_ms = 1e3 * r.get("warm_compile_s", float("nan"))
        ok = share <= 0.10
        met += ok
        warm_met += warm_ms <= 5.0
        print(f"{r['name']:34s} {r['compile_s']:7.3f} {torch_s or float('nan'):7.2f} {100 * share:5.1f}% "
              f"{warm_ms:7.1f}  {'met' if ok else 'MISSED'}")
    print(f"cold compile met: {met} of {len(coil_rows)}; warm start <= 5 ms: met on {warm_met} of {len(coil_rows)}")


if __name__ == "__main__":
    main()
