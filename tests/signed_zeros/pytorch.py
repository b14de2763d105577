"""Prints PyTorch's (CPU, eager) results for the cases of `cases.rs`, bit for bit: the table
there was copied from this output (PyTorch 2.15.0, x86-64). Run: python3 tests/signed_zeros/pytorch.py

Inputs have fewer than 16 elements: for `maximum` / `minimum` of tensors, PyTorch's CPU loop
returns the first operand on a tie of +0.0 and -0.0 in its scalar path (0-d tensors, fewer than
16 elements, tails) and the second in its vectorized chunks of 16; coil returns the first
everywhere (the rule that relu and clamp with scalar bounds follow at every size).
"""
import warnings

warnings.filterwarnings("ignore")
import torch

Z = [-0.0, 0.0, -1.5, 2.0]  # x: both zeros, a negative and a positive number
W = [0.0, -0.0, 0.0, -0.0]  # y: the other zero first
C = [True, False, True, False]

CASES = {
    "add_zero_div_neg_zero": lambda x, y, c: x.abs().add(1.0).add(0.0).div(-0.0),
    "mul_by_both_zeros": lambda x, y, c: torch.cat([x.mul(0.0), x.mul(-0.0)]),
    "relu": lambda x, y, c: torch.relu(x),
    "clamp_min_pos_zero": lambda x, y, c: torch.clamp(x, min=0.0),
    "clamp_min_neg_zero": lambda x, y, c: torch.clamp(x, min=-0.0),
    "clamp_max_pos_zero": lambda x, y, c: torch.clamp(x, max=0.0),
    "clamp_max_neg_zero": lambda x, y, c: torch.clamp(x, max=-0.0),
    "clamp_both_zeros": lambda x, y, c: torch.clamp(x, min=-0.0, max=0.0),
    "maximum_xy": lambda x, y, c: torch.maximum(x, y),
    "maximum_yx": lambda x, y, c: torch.maximum(y, x),
    "minimum_xy": lambda x, y, c: torch.minimum(x, y),
    "minimum_yx": lambda x, y, c: torch.minimum(y, x),
    "maximum_scalar_zero": lambda x, y, c: torch.maximum(x, torch.tensor(0.0, dtype=x.dtype)),
    "minimum_scalar_neg_zero": lambda x, y, c: torch.minimum(x, torch.tensor(-0.0, dtype=x.dtype)),
    "where_zeros": lambda x, y, c: torch.where(c, -0.0, 0.0).to(x.dtype),
    "where_x_or_neg_zero": lambda x, y, c: torch.where(x > 0, x, -0.0),
    "where_y_or_x": lambda x, y, c: torch.where(c, y, x),
}


def show(v):
    if v != v:
        return "NAN"
    if v in (float("inf"), float("-inf")):
        return "INF" if v > 0 else "-INF"
    return repr(float(v))


# Every dtype gives the same values: one table.
for name, f in CASES.items():
    rows = set()
    for dtype in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
        x, y, c = torch.tensor(Z, dtype=dtype), torch.tensor(W, dtype=dtype), torch.tensor(C)
        out = f(x, y, c)
        assert out.dtype == dtype, (name, out.dtype)
        rows.add(", ".join(show(v) for v in out.tolist()))
    assert len(rows) == 1, (name, rows)
    print(f'    ("{name}", &[{rows.pop()}]),')
