#!/usr/bin/env python3
"""Merge coil's and PyTorch's model-level results into the models table (issue 18, deliverable 7).

usage: models_table.py TORCH.json COIL.json [--out-dir bench/results] [--gpu NAME] [--date YYYY-MM-DD]

TORCH.json is what bench/models_torch.py writes; COIL.json is coil's side:
  {"device": str, "rows": [{"name", "coil_ms", "coil_wall_ms", "coil_peak_bytes", "coil_compile_s", "notes",
   optional: "per_token", "batch", "coil_compiles", "coil_host_ms"}]}
Writes <out-dir>/models-<gpu>-<date>.txt (a readable table) and .json in the issue's schema:
  {"device": str, "rows": [{"name", "coil_ms", "torch_compile_ms", "torch_eager_ms", "coil_peak_bytes",
   "torch_peak_bytes", "coil_compile_s", "torch_compile_s", ...}]}
with these extra keys per row where known: coil_wall_ms, torch_compile_wall_ms, torch_eager_wall_ms,
torch_eager_peak_bytes, torch_compile_mode, torch_version, precision, coil_notes, torch_notes, and for
the decode and prefill rows (issue 21): per_token (true: every *_ms is per token, see below), batch,
coil_tokens_per_s, torch_compile_tokens_per_s, torch_eager_tokens_per_s (batch * 1000 / ms),
coil_compiles, torch_compiles (graphs compiled over the row's calls: 1 = no recompiles),
torch_cudagraph_skips. Per token means per decode step (one new token for each of the batch's
sequences) on decode rows and per prompt token on prefill rows; both sides must say the same
(a disagreement is a warning and the row's per_token is null).
A value one side did not measure is null. Rows are PyTorch's order, then rows only coil has.
<gpu> defaults to the GPU's short name taken from the device string (h100, h200, ...), <date> to today.
The two files must come from one run on one machine; a device mismatch is printed as a warning.
"""
import argparse
import datetime
import json
import os
import re
import sys

SCHEMA_KEYS = ["name", "coil_ms", "torch_compile_ms", "torch_eager_ms", "coil_peak_bytes", "torch_peak_bytes",
               "coil_compile_s", "torch_compile_s"]
COIL_KEYS = ["coil_ms", "coil_wall_ms", "coil_host_ms", "coil_peak_bytes", "coil_compile_s", "coil_compiles"]
TORCH_KEYS = ["torch_compile_ms", "torch_eager_ms", "torch_peak_bytes", "torch_compile_s", "torch_compile_wall_ms",
              "torch_eager_wall_ms", "torch_eager_peak_bytes", "torch_compiles", "torch_cudagraph_skips"]


def gpu_short_name(device: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; 'NVIDIA GeForce RTX 4090' -> 'rtx4090'; 'cpu' -> 'cpu'."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", device)
    if m:
        return m.group(1).lower()
    m = re.search(r"RTX\s*(\w+)", device)
    if m:
        return "rtx" + m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "unknown"


def merge(torch_res: dict, coil_res: dict) -> tuple:
    """Returns (the models table in the issue's schema, warnings)."""
    warnings = []
    t_dev, c_dev = torch_res.get("device", ""), coil_res.get("device", "")
    if t_dev != c_dev:
        warnings.append(f"device differs: torch {t_dev!r}, coil {c_dev!r} (the table must come from one machine)")
    if torch_res.get("config", "124m") != "124m":
        warnings.append(f"torch results are for config {torch_res.get('config')!r}, not 124m")
    t_rows = {r["name"]: r for r in torch_res.get("rows", [])}
    c_rows = {r["name"]: r for r in coil_res.get("rows", [])}
    names = list(t_rows) + [n for n in c_rows if n not in t_rows]
    rows = []
    for n in names:
        t, c = t_rows.get(n, {}), c_rows.get(n, {})
        if not t:
            warnings.append(f"{n}: no torch row")
        if not c:
            warnings.append(f"{n}: no coil row")
        for side, r in (("torch", t), ("coil", c)):
            if "error" in r:
                warnings.append(f"{n}: {side} failed: {r['error']}")
        row = {k: None for k in SCHEMA_KEYS}
        row["name"] = n
        for k in COIL_KEYS:
            row[k] = c.get(k)
        for k in TORCH_KEYS:
            row[k] = t.get(k)
        per_token = [r["per_token"] for r in (t, c) if r.get("per_token") is not None]
        batch = [r["batch"] for r in (t, c) if r.get("batch") is not None]
        # per_token: False (per call), True, or None where the sides disagree (then not comparable)
        row["per_token"] = bool(per_token and per_token[0])
        row["batch"] = batch[0] if batch else None
        if len(set(per_token)) > 1 or len(set(batch)) > 1:
            warnings.append(f"{n}: the sides disagree on per_token {per_token} or batch {batch}: not comparable")
            row["per_token"] = row["batch"] = None
        if row["per_token"]:
            b = row["batch"] or 1
            row["coil_tokens_per_s"] = tokens_per_s(row["coil_ms"], b)
            row["torch_compile_tokens_per_s"] = tokens_per_s(row["torch_compile_ms"], b)
            row["torch_eager_tokens_per_s"] = tokens_per_s(row["torch_eager_ms"], b)
        if t.get("torch_cudagraph_skips"):
            warnings.append(f"{n}: torch.compile skipped CUDA graphs {t['torch_cudagraph_skips']} time(s)")
        for side, key in (("coil", "coil_compiles"), ("torch", "torch_compiles")):
            if row["per_token"] is not False and row[key] is not None and row[key] != 1:
                warnings.append(f"{n}: {side} compiled {row[key]} graphs over the row's calls, not 1")
        row["torch_compile_mode"] = t.get("compile_mode")
        row["torch_version"] = torch_res.get("torch")
        row["precision"] = t.get("precision", torch_res.get("precision"))
        row["coil_notes"] = c.get("notes")
        row["torch_notes"] = t.get("notes")
        rows.append(row)
    return {"device": t_dev or c_dev, "rows": rows}, warnings


def ratio(a, b):
    return a / b if a is not None and b else None


def tokens_per_s(ms, batch):
    return batch * 1e3 / ms if ms else None


def fmt(v, spec="{:.3f}", scale=1.0):
    return "-" if v is None else spec.format(v * scale)


def render(table: dict, warnings: list, torch_res: dict, coil_res: dict) -> str:
    out = [f"models table: {table['device']}  (torch {torch_res.get('torch')}; coil device {coil_res.get('device')!r})"]
    if torch_res.get("precision"):
        out.append(f"torch precision: {torch_res['precision']}")
    if torch_res.get("timing"):
        out.append(f"torch timing: {torch_res['timing']}")
    out.append("ms: device time per call (median), or per token where unit is 'tok' (decode: per step, one new token "
               "for each of the batch's sequences; prefill: per prompt token); wall: host clock, same unit; MiB: peak "
               "device memory; compile s: cold compile (first call minus a steady call); tok/s: batch * 1000 / ms; "
               "graphs: graphs compiled over the row's calls, coil/torch (1 = no recompiles)")
    out.append("")
    hdr = (f"{'row':28s} {'unit':>4s} {'coil ms':>9s} {'compile':>9s} {'eager':>9s} {'c/cmp':>6s} {'c/eager':>7s} "
           f"{'coil wall':>9s} {'cmp wall':>9s} {'coil MiB':>9s} {'cmp MiB':>8s} {'mem c/t':>7s} "
           f"{'coil cs':>8s} {'cmp cs':>7s} {'cs c/t':>6s} {'coil tok/s':>10s} {'cmp tok/s':>9s} {'graphs':>6s}")
    out.append(hdr)
    for r in table["rows"]:
        # no ratios where the sides measured different things (per call against per token)
        rt = ratio if r.get("per_token") is not None else (lambda a, b: None)
        graphs = "-" if r.get("coil_compiles") is None and r.get("torch_compiles") is None else \
            f"{fmt(r.get('coil_compiles'), '{:.0f}')}/{fmt(r.get('torch_compiles'), '{:.0f}')}"
        unit = {True: "tok", None: "?"}.get(r.get("per_token"), "call")
        out.append(
            f"{r['name']:28s} {unit:>4s} {fmt(r['coil_ms'], '{:.4f}'):>9s} {fmt(r['torch_compile_ms'], '{:.4f}'):>9s} "
            f"{fmt(r['torch_eager_ms'], '{:.4f}'):>9s} "
            f"{fmt(rt(r['coil_ms'], r['torch_compile_ms']), '{:.2f}'):>6s} "
            f"{fmt(rt(r['coil_ms'], r['torch_eager_ms']), '{:.2f}'):>7s} "
            f"{fmt(r['coil_wall_ms'], '{:.4f}'):>9s} {fmt(r['torch_compile_wall_ms'], '{:.4f}'):>9s} "
            f"{fmt(r['coil_peak_bytes'], '{:.0f}', 2**-20):>9s} {fmt(r['torch_peak_bytes'], '{:.0f}', 2**-20):>8s} "
            f"{fmt(rt(r['coil_peak_bytes'], r['torch_peak_bytes']), '{:.2f}'):>7s} "
            f"{fmt(r['coil_compile_s'], '{:.2f}'):>8s} {fmt(r['torch_compile_s'], '{:.2f}'):>7s} "
            f"{fmt(rt(r['coil_compile_s'], r['torch_compile_s']), '{:.3f}'):>6s} "
            f"{fmt(r.get('coil_tokens_per_s'), '{:.0f}'):>10s} {fmt(r.get('torch_compile_tokens_per_s'), '{:.0f}'):>9s} "
            f"{graphs:>6s}")
    out.append("")
    out.append("c/cmp, c/eager: coil time over torch.compile's and eager's; mem c/t: coil peak over torch.compile's; "
               "cs c/t: coil compile time over torch.compile's")
    for r in table["rows"]:
        for side in ("torch", "coil"):
            if r.get(f"{side}_notes"):
                out.append(f"{r['name']} ({side}): {r[f'{side}_notes']}")
    for w in warnings:
        out.append(f"WARNING: {w}")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("torch_json")
    ap.add_argument("coil_json")
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--gpu", default="", help="short GPU name in the file names (default: from the device string)")
    ap.add_argument("--date", default="", help="date in the file names (default: today, UTC)")
    args = ap.parse_args(argv)
    with open(args.torch_json) as f:
        torch_res = json.load(f)
    with open(args.coil_json) as f:
        coil_res = json.load(f)
    table, warnings = merge(torch_res, coil_res)
    text = render(table, warnings, torch_res, coil_res)
    gpu = args.gpu or gpu_short_name(table["device"])
    date = args.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    base = os.path.join(args.out_dir, f"models-{gpu}-{date}")
    os.makedirs(args.out_dir, exist_ok=True)
    with open(base + ".txt", "w") as f:
        f.write(text)
    with open(base + ".json", "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    sys.stdout.write(text)
    print(f"wrote {base}.txt and {base}.json")
    for w in warnings:
        print(f"models_table: warning: {w}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
