"""Writes tests/sampling/golden.safetensors: inputs and PyTorch's results for sort, argsort,
topk and the sampling distributions that tests/sampling.rs checks coil against.

Run from the repository root where PyTorch is installed (made with torch 2.15.0, CPU):

    python3 tests/sampling/make_golden.py

For each sort case NAME: `NAME.x`, `NAME.values`, `NAME.indices` (torch.sort(..., stable=True));
the case's dim and direction are in the name (`_d<dim>_asc` / `_desc`, dims counted from 0).
For topk cases: `NAME.x`, `NAME.values` (torch.topk's values) and `NAME.indices` (the first k
positions of the stable sort, lowest position first among ties; torch.topk's own tie order is
its selection algorithm's, so the test checks its indices point at equal values instead, stored
as `NAME.torch_indices`). For sampling cases: `NAME.logits` and `NAME.dist`, the renormalized
distribution that temperature / top-k / top-p sampling draws from, computed here the usual way
(HF-style on a stable descending sort: keep rank < k, keep tokens whose preceding probability
mass is below p).
"""
import torch
from safetensors.torch import save_file

g = torch.Generator().manual_seed(21)
out = {}


def ties(shape, levels, dtype=torch.float32):
    """Values drawn from a few levels, so lines have many ties."""
    return torch.randint(-levels, levels + 1, shape, generator=g).to(dtype) / 2


def sort_case(name, x, dim, descending):
    v, i = torch.sort(x, dim=dim, descending=descending, stable=True)
    d = dim % max(x.dim(), 1)
    key = f"sort_{name}_d{d}_{'desc' if descending else 'asc'}"
    out[f"{key}.x"] = x.clone().contiguous()
    out[f"{key}.values"] = v.contiguous()
    out[f"{key}.indices"] = i.contiguous()


# f32 with ties, NaN, infinities and both zeros, on every dim of a 3-D tensor.
x = ties((3, 4, 7), 3)
x[0, 0, 2] = float("nan")
x[1, 2, 0] = float("nan")
x[1, 2, 5] = float("nan")
x[2, 1, 3] = float("inf")
x[2, 1, 4] = float("-inf")
x[0, 3, :] = torch.tensor([0.0, -0.0, 0.0, -0.0, 1.0, -0.0, 0.0])
for dim in (0, 1, 2):
    for desc in (False, True):
        sort_case("f32", x, dim, desc)
sort_case("f32_len1", torch.randn(4, 1, generator=g), -1, False)
sort_case("f32_len13", ties((2, 13), 2), -1, True)
sort_case("f32_0d", torch.tensor(2.5), 0, False)
sort_case("f64", torch.tensor([[1.0, float("nan"), -2.0, float("inf"), 1.0], [0.5, 0.5, -0.0, 0.0, -1e300]], dtype=torch.float64), 1, True)
sort_case("f16", ties((3, 9), 2, torch.float16), 1, False)
sort_case("bf16", ties((2, 5, 3), 2, torch.bfloat16), 1, True)
sort_case("i64", torch.randint(-3, 4, (4, 9), generator=g), 1, False)
sort_case("i64", torch.randint(-3, 4, (4, 9), generator=g), 0, True)
sort_case("i32", torch.randint(-2**31, 2**31, (2, 6), generator=g, dtype=torch.int64).to(torch.int32), 1, False)
sort_case("bool", torch.rand(12, generator=g) < 0.5, 0, False)
# A vocabulary-sized row: bf16 (many equal values) descending, f32 ascending.
vocab = torch.randn(1, 50257, generator=g)
sort_case("bf16_vocab", vocab.to(torch.bfloat16), 1, True)
sort_case("f32_vocab", (vocab * 4).round() / 4, 1, False)


def topk_case(name, x, k, dim, largest):
    v, ti = torch.topk(x, k, dim=dim, largest=largest, sorted=True)
    _, si = torch.sort(x, dim=dim, descending=largest, stable=True)
    key = f"topk_{name}_k{k}_d{dim % x.dim()}_{'largest' if largest else 'smallest'}"
    out[f"{key}.x"] = x.clone().contiguous()
    out[f"{key}.values"] = v.contiguous()
    out[f"{key}.indices"] = si.narrow(dim, 0, k).contiguous()
    out[f"{key}.torch_indices"] = ti.contiguous()


t = ties((4, 33), 4)
t[1, 5] = float("nan")
topk_case("f32", t, 5, 1, True)
topk_case("f32", t, 5, 1, False)
topk_case("f32", t, 33, 1, True)
topk_case("f32", ties((6, 3), 2), 2, 0, True)
topk_case("bf16", torch.randn(2, 50257, generator=g).to(torch.bfloat16), 50, 1, True)
topk_case("i64", torch.randint(-5, 6, (3, 17), generator=g), 4, 1, False)


def sampling_case(name, logits, temperature, top_k, top_p):
    """The distribution sampling draws from, per row."""
    x = logits.double() / temperature
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices
    sx = torch.gather(x, -1, order)
    p = torch.softmax(sx, -1)
    keep = torch.ones_like(p, dtype=torch.bool)
    if top_k is not None:
        keep &= torch.arange(p.shape[-1]) < top_k
    if top_p is not None:
        keep &= (torch.cumsum(p, -1) - p) < top_p
    kept = torch.where(keep, p, 0.0)
    kept = kept / kept.sum(-1, keepdim=True)
    dist = torch.zeros_like(kept).scatter(-1, order, kept)
    key = f"sample_{name}"
    out[f"{key}.logits"] = logits.clone()
    out[f"{key}.dist"] = dist.float().contiguous()


logits = torch.randn(3, 40, generator=g) * 2
sampling_case("t0.7_k10_p0.8", logits, 0.7, 10, 0.8)
sampling_case("t1_p0.5", logits, 1.0, None, 0.5)
sampling_case("t1.3_k4", logits, 1.3, 4, None)
sampling_case("t1", logits, 1.0, None, None)

save_file(out, "tests/sampling/golden.safetensors", metadata={"torch": torch.__version__})
print(f"{len(out)} tensors")
