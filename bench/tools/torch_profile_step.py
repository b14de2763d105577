"""Kernel time of a torch.compile row of models_torch.py (GPT-2 or ResNet-50), by category.

Prints each CUDA kernel's total device time per step (torch.profiler), largest first, and
totals by category (GEMM, attention forward/backward, the rest), to put next to coil's
per-launch profile (`COIL_PROFILE=1`). Usage, on the GPU machine:

    python3 bench/tools/torch_profile_step.py [--row gpt2_124m_train_step_bf16] [--top 40]

Rows: gpt2_124m_fwd_bf16, gpt2_124m_train_step_bf16, resnet50_fwd_bf16, resnet50_train_step_bf16,
llama_1b_prefill_bf16.
"""
import argparse
import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import models_torch as mt  # noqa: E402


def category(name: str) -> str:
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n or "sdpa" in n:
        return "attention bwd" if "bwd" in n or "backward" in n else "attention fwd"
    if "conv" in n or "dgrad" in n or "wgrad" in n or "fprop" in n or "implicit" in n:
        return "convolution"
    if "gemm" in n or "sm90_xmma" in n or "cutlass" in n or "nvjet" in n or "cublas" in n:
        return "gemm"
    return "other (triton, elementwise, optimizer)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--row", default="gpt2_124m_train_step_bf16")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    cfg = mt.CONFIGS["124m"]
    ctx = mt.Ctx("124m", cfg["gpt"], cfg["B"], cfg["T"], torch.device("cuda"), cfg["llama"], cfg["prompt"],
                 cfg["new_tokens"], resnet=cfg["resnet"])
    if a.row.startswith("resnet"):
        setup = mt.setup_resnet_train_step if "train" in a.row else mt.setup_resnet_forward
    elif "prefill" in a.row:
        setup = mt.setup_prefill
    else:
        setup = mt.setup_train_step if "train" in a.row else mt.setup_forward
    step = setup(ctx, lambda m: torch.compile(m))
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
    per = defaultdict(float)
    count = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] += e.device_time_total / a.steps
            count[e.name] += 1
    total = sum(per.values())
    cats = defaultdict(float)
    for n, us in per.items():
        cats[category(n)] += us
    print(f"{a.row}: {total / 1e3:.3f} ms of kernels per step")
    for c, us in sorted(cats.items(), key=lambda x: -x[1]):
        print(f"  {c:<40} {us / 1e3:8.3f} ms")
    for n, us in sorted(per.items(), key=lambda x: -x[1])[: a.top]:
        print(f"{us:9.1f} us  x{count[n] // a.steps:<4} {n[:140]}")


if __name__ == "__main__":
    main()
