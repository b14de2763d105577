#!/usr/bin/env python3
"""Golden data from PyTorch for `coil::nn` modules and the optimizers (issue 18, deliverable 6).

usage: python3 tests/golden_nn/make_golden.py [--out DIR]        (DIR defaults to this file's folder)

Writes nn.safetensors (every case below; tensor names `<case>.<role>.<name>`, roles `param`, `in`,
`out`, `grad` and `ref64`), gpt2_tiny_hf.safetensors and gpt2_tiny_hf_prefixed.safetensors (the weights
of case gpt2_tiny in Hugging Face's two GPT-2 checkpoint layouts). README.md beside this file lists
every tensor. Runs on the CPU in a few seconds with PyTorch >= 2.4 and the safetensors package; the
output is the same bytes on every run (fixed seeds, deterministic CPU kernels).

Module cases: parameters are set from a seeded generator (never PyTorch's constant initializations,
which would hide a swapped weight and bias), inputs are random normal; the outputs `y` and the
gradients of `sum(y * upstream)` for every parameter and floating input, where `upstream` is stored as
`<case>.in.upstream`. Each module case is also run in float64 on the same values (the f32 parameters
and inputs upcast): `<case>.ref64.y` and `<case>.ref64.grad.<name>`.
"""
import argparse
import copy
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))


class Store:
    """Named tensors plus a description of each case. The file's metadata holds them all under one
    key, "cases" (a JSON object, keys sorted): safetensors writes its metadata map in hash order, so
    several keys would make the bytes differ from run to run."""

    def __init__(self):
        self.tensors = {}
        self.meta = {}

    def put(self, case, role, name, t):
        key = f"{case}.{role}.{name}"
        assert key not in self.tensors, key
        self.tensors[key] = t.detach().clone().contiguous()

    def describe(self, case, **desc):
        self.meta[case] = desc


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randomize(module, g, scale=0.3):
    """Seeded values for every parameter: norm weights 1 + 0.1 * N(0,1), biases 0.1 * N(0,1),
    other weights scale * N(0,1); in named_parameters() order, so the values depend only on the seed."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=g)
            leaf = name.rsplit(".", 1)[-1]
            is_norm = any(k in name for k in ("ln_", "norm")) or isinstance(module, (nn.LayerNorm, nn.RMSNorm))
            if is_norm and leaf == "weight":
                p.copy_(1.0 + 0.1 * r)
            elif leaf == "bias":
                p.copy_(0.1 * r)
            else:
                p.copy_(scale * r)


# ----------------------------------------------------------------------------------------------
# Modules written in plain torch with Hugging Face's parameter names and layouts.


class Conv1D(nn.Module):
    """GPT-2's Conv1D: a linear layer whose weight is stored [in, out] (transposed from nn.Linear)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class GPT2Attention(nn.Module):
    """Causal self-attention as HF's GPT2Attention lays it out: c_attn makes q, k, v (in that order)."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(n_embd, 3 * n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(head_dim)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class GPT2MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = Conv1D(n_embd, 4 * n_embd)
        self.c_proj = Conv1D(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = GPT2Attention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = GPT2MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT2LMHeadModel's computation with GPT2Model's parameter names (no `transformer.` prefix);
    the LM head is wte.weight (tied), so it has no parameter of its own."""

    def __init__(self, vocab, block, n_embd, n_head, n_layer):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.h = nn.ModuleList(GPT2Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


class Wrap(nn.Module):
    """Puts a module under a name, so its parameters read `<name>.<param>` (HF's `attn.`, `mlp.`)."""

    def __init__(self, name, module):
        super().__init__()
        self.name = name
        self.add_module(name, module)

    def forward(self, x):
        return getattr(self, self.name)(x)


class SwiGLU(nn.Module):
    """Llama's MLP: down_proj(silu(gate_proj(x)) * up_proj(x)), nn.Linear layout, no bias."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rotary_cos_sin(T, D, base=10000.0, dtype=torch.float32):
    """Llama's (HF) tables: inv_freq[i] = base^(-2i/D); angles pos * inv_freq, repeated twice along D."""
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).to(torch.float32) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rotary(x, cos, sin):
    return x * cos + rotate_half(x) * sin


# ----------------------------------------------------------------------------------------------
# Case runners.


def run_module(module, inputs, forward, upstreams):
    """Forward, then backward of sum(out * upstream) over all outputs; returns (outs, grads by name)."""
    inputs = {k: (v.clone().requires_grad_() if v.is_floating_point() else v) for k, v in inputs.items()}
    outs = forward(module, **inputs)
    total = sum((outs[k] * upstreams[k]).sum() for k in outs)
    params = dict(module.named_parameters())
    leaves = {**params, **{k: v for k, v in inputs.items() if v.is_floating_point()}}
    grads = torch.autograd.grad(total, list(leaves.values()))
    return outs, dict(zip(leaves, grads))


def module_case(S, case, module, inputs, forward, out_shapes, seed, desc):
    """Stores params, inputs, upstreams, outputs, grads, and the float64 run of the same values."""
    g = gen(seed)
    randomize(module, g)
    inputs = {k: v for k, v in inputs.items()}
    ups = {k: torch.randn(shape, generator=g) for k, shape in out_shapes.items()}
    for name, p in module.named_parameters():
        S.put(case, "param", name, p)
    for name, v in inputs.items():
        S.put(case, "in", name, v)
    for k, u in ups.items():
        S.put(case, "in", "upstream" if list(ups) == ["y"] else f"upstream_{k}", u)
    outs, grads = run_module(module, inputs, forward, ups)
    for k, v in outs.items():
        S.put(case, "out", k, v)
    for k, v in grads.items():
        S.put(case, "grad", k, v)
    m64 = copy.deepcopy(module).double()
    in64 = {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}
    outs64, grads64 = run_module(m64, in64, forward, {k: u.double() for k, u in ups.items()})
    for k, v in outs64.items():
        S.put(case, "ref64", k, v)
    for k, v in grads64.items():
        S.put(case, "ref64", f"grad.{k}", v)
    S.describe(case, seed=seed, **desc)


def y_of(m, x):
    return {"y": m(x)}


def module_cases(S):
    g = gen(100)
    module_case(S, "linear", nn.Linear(5, 7), {"x": torch.randn(3, 4, 5, generator=g)}, y_of, {"y": (3, 4, 7)}, 101,
                dict(module="torch.nn.Linear(5, 7, bias=True)", y="x @ weight.T + bias"))
    module_case(S, "linear_nobias", nn.Linear(5, 7, bias=False), {"x": torch.randn(3, 4, 5, generator=g)}, y_of,
                {"y": (3, 4, 7)}, 102, dict(module="torch.nn.Linear(5, 7, bias=False)", y="x @ weight.T"))

    idx = torch.randint(0, 11, (2, 5), generator=g)
    idx[0, 0], idx[0, 1], idx[1, 4], idx[1, 0] = 10, 0, 3, 3  # both ends of the table, and a repeated id
    module_case(S, "embedding", nn.Embedding(11, 6), {"idx": idx}, lambda m, idx: {"y": m(idx)}, {"y": (2, 5, 6)},
                103, dict(module="torch.nn.Embedding(11, 6)", y="weight[idx]", note="idx repeats 3 (grad accumulates)"))

    module_case(S, "layer_norm", nn.LayerNorm(8, eps=1e-5), {"x": torch.randn(3, 8, generator=g) * 2 + 0.5}, y_of,
                {"y": (3, 8)}, 104, dict(module="torch.nn.LayerNorm(8, eps=1e-5)", y="biased variance over the last dim"))
    module_case(S, "rms_norm", nn.RMSNorm(8, eps=1e-6), {"x": torch.randn(3, 8, generator=g) * 2 + 0.5}, y_of,
                {"y": (3, 8)}, 105, dict(module="torch.nn.RMSNorm(8, eps=1e-6)",
                                         y="x * rsqrt(mean(x^2, -1) + eps) * weight"))

    module_case(S, "gpt2_attention", Wrap("attn", GPT2Attention(16, 4)), {"x": torch.randn(2, 5, 16, generator=g)},
                y_of, {"y": (2, 5, 16)}, 106,
                dict(module="HF GPT2Attention: C=16, 4 heads, Conv1D weights [in, out]",
                     y="c_proj(sdpa(q, k, v, is_causal=True)) with q, k, v = split(x @ c_attn.weight + c_attn.bias)"))
    module_case(S, "gpt2_mlp", Wrap("mlp", GPT2MLP(16)), {"x": torch.randn(2, 5, 16, generator=g)}, y_of,
                {"y": (2, 5, 16)}, 107, dict(module="HF GPT2MLP: C=16, hidden 64, Conv1D weights [in, out]",
                                             y="c_proj(gelu_tanh(c_fc(x)))"))
    module_case(S, "swiglu_mlp", SwiGLU(8, 24), {"x": torch.randn(2, 5, 8, generator=g)}, y_of, {"y": (2, 5, 8)}, 108,
                dict(module="Llama MLP: dim 8, hidden 24, nn.Linear weights [out, in], no bias",
                     y="down_proj(silu(gate_proj(x)) * up_proj(x))"))

    B, H, T, D = 2, 2, 5, 8

    def rotary(m, q, k):
        cos, sin = rotary_cos_sin(T, D, dtype=q.dtype)
        return {"q_rot": apply_rotary(q, cos, sin), "k_rot": apply_rotary(k, cos, sin)}

    module_case(S, "rotary", nn.Module(), {"q": torch.randn(B, H, T, D, generator=g), "k": torch.randn(B, H, T, D, generator=g)},
                rotary, {"q_rot": (B, H, T, D), "k_rot": (B, H, T, D)}, 109,
                dict(module="Llama rotary embedding (HF rotate_half), base 10000, head dim 8, positions 0..4",
                     y="x * cos + rotate_half(x) * sin; rotate_half(x) = cat(-x[..., 4:], x[..., :4])"))
    cos, sin = rotary_cos_sin(T, D)
    S.put("rotary", "out", "cos", cos)
    S.put("rotary", "out", "sin", sin)


# ----------------------------------------------------------------------------------------------
# The tiny GPT-2: one forward + backward (gpt2_tiny) and three AdamW steps (gpt2_tiny_train).

TINY = dict(vocab=37, block=8, n_embd=16, n_head=2, n_layer=2)


def tiny_gpt2():
    m = GPT2(**TINY)
    g = gen(200)
    with torch.no_grad():
        for name, p in m.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1.0 + 0.1 * r)
            elif name.endswith("bias"):
                p.copy_(0.05 * r)
            else:
                p.copy_(0.1 * r)
    return m


def pattern_batch(g, B=2, T=8, V=37):
    """A learnable stream: t[j+1] = (3 * t[j] + 5) mod V from random starts; targets are the next tokens."""
    seq = torch.empty(B, T + 1, dtype=torch.int64)
    seq[:, 0] = torch.randint(0, V, (B,), generator=g)
    for j in range(T):
        seq[:, j + 1] = (3 * seq[:, j] + 5) % V
    return seq[:, :T].clone(), seq[:, 1:].clone()


def gpt2_tiny_case(S):
    case = "gpt2_tiny"
    m = tiny_gpt2()
    g = gen(201)
    idx = torch.randint(0, TINY["vocab"], (2, 8), generator=g)
    tgt = torch.randint(0, TINY["vocab"], (2, 8), generator=g)
    for name, p in m.named_parameters():
        S.put(case, "param", name, p)
    S.put(case, "in", "idx", idx)
    S.put(case, "in", "targets", tgt)
    for role, model in (("", m), ("ref64", copy.deepcopy(m).double())):
        logits, loss = model(idx, tgt)
        names = [n for n, _ in model.named_parameters()]
        grads = torch.autograd.grad(loss, list(model.parameters()))
        if role:
            S.put(case, role, "logits", logits)
            S.put(case, role, "loss", loss)
            for n, gr in zip(names, grads):
                S.put(case, role, f"grad.{n}", gr)
        else:
            S.put(case, "out", "logits", logits)
            S.put(case, "out", "loss", loss)
            for n, gr in zip(names, grads):
                S.put(case, "grad", n, gr)
    S.describe(case, config=TINY, B=2, T=8, dropout=0.0, layer_norm_eps=1e-5, activation="gelu tanh",
               lm_head="tied to wte.weight", loss="cross_entropy(logits.view(-1, 37), targets.view(-1)), mean",
               grads="d loss / d param (wte.weight: embedding + LM head)")

    # The same weights as Hugging Face checkpoints. The hub's GPT-2 (openai-community/gpt2) stores
    # GPT2Model names (no prefix) and the causal-mask buffers h.{i}.attn.bias [1, 1, n_ctx, n_ctx];
    # GPT2LMHeadModel.save_pretrained writes `transformer.` + the same names, no mask buffers and no
    # lm_head.weight (tied). Metadata {"format": "pt"} as transformers writes it.
    hub = {n: p.detach().clone().contiguous() for n, p in m.named_parameters()}
    mask = torch.tril(torch.ones(TINY["block"], TINY["block"])).view(1, 1, TINY["block"], TINY["block"])
    for i in range(TINY["n_layer"]):
        hub[f"h.{i}.attn.bias"] = mask.clone()
    prefixed = {f"transformer.{n}": p.detach().clone().contiguous() for n, p in m.named_parameters()}
    return hub, prefixed


def gpt2_tiny_train_case(S):
    case = "gpt2_tiny_train"
    g = gen(202)
    batches = [pattern_batch(g) for _ in range(3)]
    for s, (idx, tgt) in enumerate(batches):
        S.put(case, "in", f"idx.step{s}", idx)
        S.put(case, "in", f"targets.step{s}", tgt)
    for role, dtype in (("out", torch.float32), ("ref64", torch.float64)):
        m = tiny_gpt2().to(dtype)
        params = list(m.parameters())
        opt = torch.optim.AdamW(
            [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)
        losses = []
        for s, (idx, tgt) in enumerate(batches):
            opt.zero_grad(set_to_none=True)
            _, loss = m(idx, tgt)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            S.put(case, role, f"loss.step{s}", loss)
        with torch.no_grad():
            _, after = m(*batches[0])
        S.put(case, role, "loss_after.batch0", after)
        for n, p in m.named_parameters():
            S.put(case, role, f"final.{n}", p)
        assert after.item() < losses[0], (losses, after.item())
    S.describe(case, model="gpt2_tiny (same initial params as gpt2_tiny.param.*)",
               optimizer="AdamW(lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1 on params with dim >= 2, "
                         "0 on the others; groups in that order), foreach=False", steps=3,
               step="zero_grad; loss = model(idx.step{s}, targets.step{s}); backward; opt.step()",
               data="t[j+1] = (3 t[j] + 5) mod 37 from random starts; targets are the next tokens")


# ----------------------------------------------------------------------------------------------
# Optimizers on two parameters ([3, 4] and [4]) with given gradients.

STEPS = 5


def opt_inputs(seed):
    g = gen(seed)
    init = [torch.randn(3, 4, generator=g), torch.randn(4, generator=g)]
    grads = [[torch.randn(3, 4, generator=g), torch.randn(4, generator=g)] for _ in range(STEPS)]
    # step 2's gradients are small (total norm under 0.5), so clipping leaves them alone
    grads[2] = [0.05 * t for t in grads[2]]
    return init, grads


def run_optimizer(make, init, grads, dtype, clip=None):
    """Runs STEPS steps; returns {name: tensor} of everything recorded (names as in the README)."""
    params = [p.clone().to(dtype).requires_grad_() for p in init]
    opt, sched = make(params)
    rec = {}
    for s in range(STEPS):
        for p, gr in zip(params, grads[s]):
            p.grad = gr.clone().to(dtype)
        if clip is not None:
            rec[f"grad_norm.step{s}"] = torch.nn.utils.clip_grad_norm_(params, max_norm=clip, foreach=False)
            for i, p in enumerate(params):
                rec[f"clipped_grad{i}.step{s}"] = p.grad.clone()
        rec[f"lr.step{s}"] = torch.tensor(opt.param_groups[0]["lr"], dtype=torch.float64)
        opt.step()
        if sched is not None:
            sched.step()
        for i, p in enumerate(params):
            rec[f"param{i}.step{s}"] = p.detach().clone()
            for k, v in opt.state[p].items():
                if k != "step" and v is not None:
                    rec[f"{k}{i}.step{s}"] = v.clone()
    return rec


def optimizer_case(S, case, make, seed, desc, clip=None):
    init, grads = opt_inputs(seed)
    for i, p in enumerate(init):
        S.put(case, "in", f"param{i}", p)
    for s in range(STEPS):
        for i, gr in enumerate(grads[s]):
            S.put(case, "in", f"grad{i}.step{s}", gr)
    for role, dtype in (("out", torch.float32), ("ref64", torch.float64)):
        for k, v in run_optimizer(make, init, grads, dtype, clip).items():
            if k.startswith("lr.") and role == "ref64":
                continue  # the learning rate is a Python float: out.lr.* is already float64
            S.put(case, role, k, v)
    S.describe(case, seed=seed, steps=STEPS, **desc)


def warmup_cosine(step):
    """Multiplier of the base lr at step s (0-based): linear warm-up over 2 steps (0.5, 1.0), then cosine
    from 1.0 at step 2 down to 0.1 at step 4, the fifth and last step."""
    warmup, last, floor = 2, STEPS - 1, 0.1
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / (last - warmup)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def optimizer_cases(S):
    def sgd(**kw):
        return lambda ps: (torch.optim.SGD(ps, lr=0.1, foreach=False, **kw), None)

    sgd_cases = [
        ("sgd_plain", {}),
        ("sgd_momentum", dict(momentum=0.9)),
        ("sgd_nesterov", dict(momentum=0.9, nesterov=True)),
        ("sgd_wd_momentum_dampening", dict(momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ]
    for n, (case, kw) in enumerate(sgd_cases):
        optimizer_case(S, case, sgd(**kw), 300 + n, dict(optimizer=f"torch.optim.SGD(lr=0.1, {kw}, foreach=False)"))

    hp = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    hp_text = "lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1"
    optimizer_case(S, "adamw_defaults", lambda ps: (torch.optim.AdamW(ps, foreach=False), None), 310,
                   dict(optimizer="torch.optim.AdamW(params) with PyTorch's defaults: lr=1e-3, betas=(0.9, 0.999), "
                                  "eps=1e-8, weight_decay=1e-2, amsgrad=False (foreach=False)"))
    optimizer_case(S, "adamw", lambda ps: (torch.optim.AdamW(ps, amsgrad=False, foreach=False, **hp), None), 311,
                   dict(optimizer=f"torch.optim.AdamW({hp_text}, amsgrad=False, foreach=False)"))
    optimizer_case(S, "adamw_amsgrad", lambda ps: (torch.optim.AdamW(ps, amsgrad=True, foreach=False, **hp), None), 312,
                   dict(optimizer=f"torch.optim.AdamW({hp_text}, amsgrad=True, foreach=False)"))
    optimizer_case(S, "adamw_clip", lambda ps: (torch.optim.AdamW(ps, foreach=False, **hp), None), 313,
                   dict(optimizer=f"torch.optim.AdamW({hp_text}, foreach=False)",
                        clip="clip_grad_norm_(params, max_norm=0.5) on the given grads before each step"), clip=0.5)

    def scheduled(ps):
        opt = torch.optim.AdamW(ps, foreach=False, **hp)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)

    optimizer_case(S, "adamw_schedule", scheduled, 314,
                   dict(optimizer=f"torch.optim.AdamW({hp_text}, foreach=False)",
                        schedule="LambdaLR: lr = 1e-2 * m(s), m = 0.5, 1.0 (linear warm-up over 2 steps), then "
                                 "0.1 + 0.9 * (1 + cos(pi * (s - 2) / 2)) / 2: 1.0, 0.55, 0.1",
                        lrs=[hp["lr"] * warmup_cosine(s) for s in range(STEPS)]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    S = Store()
    module_cases(S)
    hub, prefixed = gpt2_tiny_case(S)
    gpt2_tiny_train_case(S)
    optimizer_cases(S)
    os.makedirs(args.out, exist_ok=True)
    save_file(S.tensors, os.path.join(args.out, "nn.safetensors"),
              metadata={"cases": json.dumps(S.meta, sort_keys=True)})
    save_file(hub, os.path.join(args.out, "gpt2_tiny_hf.safetensors"), metadata={"format": "pt"})
    save_file(prefixed, os.path.join(args.out, "gpt2_tiny_hf_prefixed.safetensors"), metadata={"format": "pt"})
    size = os.path.getsize(os.path.join(args.out, "nn.safetensors"))
    print(f"nn.safetensors: {len(S.tensors)} tensors, {len(S.meta)} cases, {size} bytes")


if __name__ == "__main__":
    main()
