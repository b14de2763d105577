"""Golden data for coil::nn::BatchNorm2d: training-mode steps (outputs, running statistics,
num_batches_tracked, gradients) and an evaluation-mode pass, from torch.nn.BatchNorm2d on the CPU.

    python3 tests/golden_nn/make_batch_norm.py   # writes tests/golden_nn/batch_norm.safetensors

Names: <case>.param.<weight|bias>, <case>.in.x.step{s}, <case>.in.upstream, <case>.out.y.step{s},
<case>.out.<running_mean|running_var|num_batches_tracked>.step{s} (after step s),
<case>.grad.<weight|bias|x> (of sum(y.step0 * upstream)), <case>.in.x_eval, <case>.out.y_eval.
"""
import json
import os

import torch
from safetensors.torch import save_file

CASES = {
    # name: (channels, input shape, momentum, steps)
    "bn_momentum": (4, (3, 4, 5, 5), 0.1, 3),
    "bn_cumulative": (3, (2, 3, 4, 6), None, 3),
}


def main():
    out = {}
    for k, (name, (c, shape, momentum, steps)) in enumerate(CASES.items()):
        g = torch.Generator().manual_seed(100 + k)
        bn = torch.nn.BatchNorm2d(c, momentum=momentum)
        with torch.no_grad():
            bn.weight.copy_(1 + 0.1 * torch.randn(c, generator=g))
            bn.bias.copy_(0.1 * torch.randn(c, generator=g))
        out[f"{name}.param.weight"] = bn.weight.detach().clone()
        out[f"{name}.param.bias"] = bn.bias.detach().clone()
        upstream = torch.randn(shape, generator=g)
        out[f"{name}.in.upstream"] = upstream
        bn.train()
        for s in range(steps):
            x = (2 * torch.randn(shape, generator=g) + 0.5 + s).requires_grad_(s == 0)
            y = bn(x)
            out[f"{name}.in.x.step{s}"] = x.detach().clone()
            out[f"{name}.out.y.step{s}"] = y.detach().clone()
            if s == 0:
                (y * upstream).sum().backward()
                out[f"{name}.grad.weight"] = bn.weight.grad.clone()
                out[f"{name}.grad.bias"] = bn.bias.grad.clone()
                out[f"{name}.grad.x"] = x.grad.clone()
            out[f"{name}.out.running_mean.step{s}"] = bn.running_mean.clone()
            out[f"{name}.out.running_var.step{s}"] = bn.running_var.clone()
            out[f"{name}.out.num_batches_tracked.step{s}"] = bn.num_batches_tracked.clone()
        bn.eval()
        x = 2 * torch.randn(shape, generator=g) + 1.0
        out[f"{name}.in.x_eval"] = x
        with torch.no_grad():
            out[f"{name}.out.y_eval"] = bn(x)
    meta = {"cases": json.dumps({n: {"channels": c, "shape": s, "momentum": m, "steps": t} for n, (c, s, m, t) in CASES.items()})}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "batch_norm.safetensors")
    save_file({k: v.contiguous() for k, v in sorted(out.items())}, path, metadata=meta)


if __name__ == "__main__":
    main()
