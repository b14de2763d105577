#!/usr/bin/env python3
"""The PyTorch side of the models table: GPT-2 124M forward and training step (issue 18, deliverable 7);
decode with a static KV cache for GPT-2 124M and a Llama of 1B, and the Llama's prefill (issue 21,
deliverable 7; the models and the decode loop are in models_torch_decode.py next to this file).

Run on the GPU machine (Python 3.12, PyTorch 2.11, Triton 3.6; no network needed):

    python3 bench/models_torch.py --device cuda --check          # tiny models, ~1 min: decode paths vs full forward
    python3 bench/models_torch.py --device cuda --json $OUT/models_torch.json                  # every row
    python3 bench/models_torch.py --device cuda --rows '*decode*,*prefill*' --json $OUT/t.json  # issue 21's rows

and on a CPU, to check that every path runs (tiny models; the self-check ~1.5 min, the rows ~2 min on 2 cores):

    python3 bench/models_torch.py --device cpu --check
    python3 bench/models_torch.py --device cpu --config tiny --reps 3 --loop-reps 2 --json /tmp/models_torch.json

The model is GPT-2 as nanoGPT writes it: learned position embeddings, pre-norm blocks with LayerNorm
(bias, eps 1e-5), a fused QKV linear, `F.scaled_dot_product_attention(is_causal=True)`, an MLP of 4x
width with GELU (tanh approximation, as GPT-2 uses), dropout 0 (0.1 in the dropout row), the LM head tied to the token embedding,
nanoGPT's initialization (normal 0.02, residual projections 0.02/sqrt(2*n_layer), zero biases).
Precision is nanoGPT's training mode: parameters in float32, the model run under
`torch.autocast(device, dtype=torch.bfloat16)` (matrix products and attention in bf16; layer norm,
softmax and cross-entropy in f32 by autocast's rules). TF32 is off, as in torch_suite.py.

Rows (each for PyTorch eager and `torch.compile(model)`, default mode):
  gpt2_124m_fwd_bf16          forward to the loss (logits of every position, cross-entropy against
                              targets), under torch.no_grad(): an inference forward.
  gpt2_124m_train_step_bf16   zero_grad(set_to_none=True), forward, loss, backward,
                              clip_grad_norm_(1.0), fused AdamW step (lr 6e-4, betas (0.9, 0.95),
                              eps 1e-8, weight decay 0.1 on parameters of 2+ dims only). The model is
                              compiled, the optimizer and the clipping are not (as nanoGPT does).
  gpt2_124m_train_step_dropout_bf16   the same step with dropout 0.1 where nanoGPT applies it (after the
                              embeddings, attention weights through F.scaled_dot_product_attention's
                              dropout_p, after each residual projection).
Issue 22's rows (parameters f32, model and input channels-last, input bf16, under torch.autocast(bfloat16):
convolutions and the classifier in bf16, batch norm bf16 in and out; the model is torchvision's resnet50
written in plain torch.nn below, with torchvision's initialization, from torch.manual_seed):
  resnet50_fwd_bf16           eval mode, batch 64 of 224x224 images, forward to the logits under no_grad
  resnet50_train_step_bf16    zero_grad(set_to_none=True), forward in train mode (batch norm updates its
                              running statistics), cross-entropy on random labels, backward, SGD step
                              (lr 0.1, momentum 0.9, weight decay 1e-4, foreach); the model is compiled,
                              the optimizer is not
  (with --config tiny: resnet_tiny_*, a ResNet of one block per stage, width 8, 10 classes, batch 2 of 64x64)
Issue 21's rows, time per token (`per_token: true`), bf16 weights (model.to(torch.bfloat16), no
autocast), random weights from torch.manual_seed(0), greedy decoding, a static KV cache of capacity
512 + 256 (models_torch_decode.py says how the cache, the mask and GQA are done):
  gpt2_124m_decode_b1_bf16    256 decode steps after a 512-token prompt, batch 1: ms per step
  gpt2_124m_decode_b16_bf16   the same at batch 16 (ms per step; each step makes 16 tokens)
  llama_1b_decode_b1_bf16     Llama 3.2 1B's sizes (vocab 128256, hidden 2048, MLP 8192, 16 layers,
  llama_1b_decode_b16_bf16    32 heads, 8 key/value heads, rope_theta 500000, eps 1e-5, tied head)
  llama_1b_prefill_bf16       the 512-token prompt at batch 1 into the empty cache: ms per prompt token
                              (and tokens/s); compiled with torch.compile default mode
The decode rows compile the one-token decode step (not the loop) with
torch.compile(step, mode="reduce-overhead", fullgraph=True): CUDA graphs, replayed once per token.
The position is a 0-d tensor, so one graph serves all 256 positions: `torch_compiles` (Dynamo graphs
compiled over all of the row's calls, from torch._dynamo.utils.counters) must be 1 and
`torch_cudagraph_skips` 0. The prefill (eager, untimed) is in the row's setup; one call of a decode
row is the loop of 256 steps (models_torch_decode.decode_loop), timed --loop-reps times after
--loop-warmup, and divided by 256.
With `--config tiny` the rows are named gpt2_tiny_* and llama_tiny_* instead (GPT-2 of 2 layers, a
Llama of 2 layers with 8 query and 2 key/value heads; prompt 16, 8 decode steps), so tiny results
cannot pass for full-size ones. --rows takes names or fnmatch patterns ('llama_*', '*decode_b1*');
a full-size name also selects its tiny row under --config tiny.

What coil's side must do for the decode rows to compare like for like (bench/models_table.py
pairs rows by name; coil's row must carry "per_token": true and "batch", and should carry
"coil_compiles"):
  - Same sizes, bf16 weights and bf16 key/value cache of capacity 768 per layer, random weights,
    prompt of 512 random token ids per sequence (values do not matter), greedy decoding.
  - Untimed setup: build the model, allocate the cache, prefill the prompt (positions 0..511) and
    take its argmax as the first input token (position 512). Warm-up: at least one whole loop.
  - The timed call is one decode loop of 256 steps: step i feeds the B tokens at position 512 + i
    (i = 0..255; the last writes cache slot 767) and produces the next B tokens by argmax on the
    device; the produced tokens are the next step's input without a host round trip; the position is
    a run-time value (device tensor or equivalent), not a recompile. Nothing is copied to the host
    and nothing synchronizes inside the loop (a per-step blocking copy of the token to the host
    would add latency the torch side does not pay); the B x 256 tokens stay on the device. Each
    call restarts at position 512 over the same prefilled cache (slots >= 512 are overwritten
    before they are read).
  - coil_ms = device time of one whole loop / 256 (CUDA events recorded on the stream before the
    first step's first launch and after the 256th step's last; median of 5 loops, each loop after
    a 256 MiB L2 flush, no synchronize between loops); coil_wall_ms = host clock from before the
    loop to after a synchronize at its end, / 256, median of 5 (synchronize before each).
  - coil_compile_s = wall time of the first loop (which compiles the decode step and captures its
    CUDA graph) minus a steady loop's; coil_compiles = graphs compiled over every loop of the row
    (the target is 1); coil_peak_bytes = peak device bytes over one steady loop, everything live
    counted (weights, cache, graph buffers).
  - Prefill row: one call = the 512-token prompt at batch 1 written into the empty cache from
    position 0 plus the argmax of the last position's logits (the head on the last position only);
    coil_ms = its device time / 512 (median of 30 calls after 5 warm-up calls, L2 flushed before
    each); coil_compile_s = first call minus a steady call.

Timing, the method of ../shared/bench/torch_suite.py (triton.testing.do_bench) with counts instead of
milliseconds: `--warmup` untimed calls, then `--reps` calls, each preceded by a 256 MiB memset that
flushes the L2 cache and bracketed by CUDA events, recorded without synchronizing between calls;
the median event time is the row's device time (`*_ms`). Then `--reps` more calls, each after the same
flush and a synchronize, timed by the host clock up to a synchronize after the call: the wall clock per
call as a user sees it (`*_wall_ms`). On the CPU both are the host clock and there is no flush.
Peak memory (`*_peak_bytes`): torch.cuda.max_memory_allocated over one steady call, after
reset_peak_memory_stats, with the flush buffer not allocated; it counts everything live (parameters,
gradients, optimizer state, the batch, activations); `*_resident_bytes` is what was allocated when
the call began. Compile time (`torch_compile_s`): the wall time of the first call of the compiled
model (Dynamo, AOTAutograd, Inductor, Triton; for the training step both the forward and the backward
graphs) minus the median steady wall time of a call; `torch_compile_first_call_s` is the first call
itself. Compiles are cold: Inductor's, Triton's and the CUDA driver's JIT caches go to a fresh
directory for this process
and Inductor's own caches (FX graph, AOTAutograd, autotuning) are disabled (force_disable_caches), so
no row reuses another row's graphs; Triton's kernel cache is per process, so a Triton kernel with the
same source as one the forward row built would be found by the training row (run one row per process
with --rows to rule that out). Inductor's compile worker pool starts on the first compile and is
counted there. Eager runs first in each row, so CUDA, cuBLAS and cuDNN start-up costs are not counted
as compile time.

Expected run time on an H100 (estimated from the first run's compile times, the decode rows not yet
measured): about 4-5 minutes for every row, at most ~6.5. The forward and training rows ~1 min (their
cold compiles were 12 s and 21 s). The decode rows ~3 min: eager decode is bound by the host's
launch rate (GPT-2 ~3 ms, Llama ~5-8 ms per step: 13 loops of 256 steps per row and mode, ~25 s
per Llama row), each compiled row ~15-40 s of cold compile plus seconds of replay; the prefill row
~30 s (its compile). Subsets: --rows 'gpt2_124m_fwd_bf16,gpt2_124m_train_step_bf16' (~1 min),
--rows '*decode*' (~2.5 min), --rows '*prefill*' (~0.5 min), --modes compile (skips eager, ~1 min
less), --loop-reps 3 (fewer loops). Memory: the training step of 124M at B=8, T=1024 needs well
under 40 GB; Llama 1B decode at batch 16 ~3 GB (2.5 GB weights, 0.4 GB cache).

Output: a table, and with --json {"device", "torch", "config", "precision", "timing", "rows": [{"name",
"torch_compile_ms", "torch_eager_ms", "torch_peak_bytes" (compiled), "torch_eager_peak_bytes",
"torch_compile_s", "notes", "compile_mode", ...extra keys}]}; the per-token rows add "per_token": true,
"batch", "tokens_per_call", "torch_{eager,compile}_tokens_per_s" (batch * 1000 / ms), "torch_compiles",
"torch_cudagraph_skips" and the first 16 generated tokens of sequence 0 ("torch_{mode}_first_tokens").
A row that fails keeps its name and an "error" key, and the exit status is 1. bench/models_table.py
merges this with coil's JSON into the models table.

Adding rows: write a `setup(ctx, compiled) -> step` function and add a `RowSpec` to ROWS;
`compile_mode` picks torch.compile's mode (e.g. "reduce-overhead") and `per_call` divides the times
(e.g. by the number of tokens one call generates, for time per token).
"""
import argparse
import fnmatch
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

# A fresh cache directory for Inductor and Triton, set before torch is imported so that every
# compile in this process is cold (see the module doc); --warm-cache keeps the user's caches.
if "--warm-cache" not in sys.argv:
    _cache = tempfile.mkdtemp(prefix="models_torch_cache_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_cache, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(_cache, "triton")
    # The CUDA driver's JIT cache too (what coil's `models --cold` starts empty).
    os.environ["CUDA_CACHE_PATH"] = os.path.join(_cache, "cuda-jit")

import torch  # noqa: E402
import torch._inductor.config  # noqa: E402  (force_disable_caches below)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import models_torch_decode as dec  # noqa: E402  (next to this script: the decode and prefill rows)

FLUSH_BYTES = 256 * 1024 * 1024


# ----------------------------------------------------------------------------------------------
# The model: GPT-2 as nanoGPT writes it (written here from the GPT-2 description, not copied).


@dataclass
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=True)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=True)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # [B, T, C] -> [B, heads, T, head_dim]
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=True)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=True)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
            ln_f=nn.LayerNorm(cfg.n_embd, eps=1e-5),
        ))
        self.drop = nn.Dropout(cfg.dropout)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # residual projections, scaled as GPT-2 does
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def make_adamw(model: nn.Module, fused: bool) -> torch.optim.AdamW:
    """nanoGPT's optimizer: weight decay on parameters of 2 or more dims only (matmul weights and
    embeddings), none on biases and layer-norm parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=fused)


# ----------------------------------------------------------------------------------------------
# ResNet-50 as torchvision writes it (resnet50, "v1.5": the stride on a block's 3x3 convolution),
# in plain torch.nn so that torchvision need not be installed; the parameter names are
# torchvision's (conv1, bn1, layer1.0.conv1, ..., layer1.0.downsample.0, fc), as coil's.


@dataclass
class ResNetConfig:
    layers: tuple
    width: int
    num_classes: int
    batch: int
    image: int


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        h = self.relu(self.bn1(self.conv1(x)))
        h = self.relu(self.bn2(self.conv2(h)))
        return self.relu(self.bn3(self.conv3(h)) + identity)


class ResNet(nn.Module):
    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        w = cfg.width
        self.conv1 = nn.Conv2d(3, w, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inplanes = w
        for i, blocks in enumerate(cfg.layers):
            layer = []
            for b in range(blocks):
                layer.append(Bottleneck(inplanes, w << i, 2 if i > 0 and b == 0 else 1))
                inplanes = (w << i) * Bottleneck.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(inplanes, cfg.num_classes)
        for m in self.modules():  # torchvision's initialization
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ----------------------------------------------------------------------------------------------
# Rows.

# B, T: the forward and training rows' batch; llama, prompt, new_tokens: the decode and prefill rows'
# Llama (models_torch_decode.LLAMA_CONFIGS), prompt length and decode steps (cache capacity = the sum);
# resnet: the ResNet rows' model, batch and image size.
CONFIGS = {
    "124m": dict(gpt=GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, block_size=1024), B=8, T=1024,
                 llama="1b", prompt=512, new_tokens=256,
                 resnet=ResNetConfig(layers=(3, 4, 6, 3), width=64, num_classes=1000, batch=64, image=224)),
    "tiny": dict(gpt=GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=256, block_size=64), B=2, T=64,
                 llama="tiny", prompt=16, new_tokens=8,
                 resnet=ResNetConfig(layers=(1, 1, 1, 1), width=8, num_classes=10, batch=2, image=64)),
}
# What "{resnet}" in a row name becomes for each config.
RESNET_NAMES = {"124m": "resnet50", "tiny": "resnet_tiny"}


@dataclass
class Ctx:
    """What a row's setup needs: the model configuration, the device and the precision policy."""
    config: str
    gpt: GPTConfig
    B: int
    T: int
    device: torch.device
    llama_name: str
    prompt: int
    new_tokens: int
    resnet: Optional[ResNetConfig] = None
    loop_warmup: int = 1
    loop_reps: int = 5
    seed: int = 1234
    decode_seed: int = 0

    @property
    def sizes(self) -> dict:
        """What row names are formatted with: {size} (GPT-2's), {llama} and {resnet}."""
        return dict(size=self.config, llama=self.llama_name, resnet=RESNET_NAMES[self.config])

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def batch(self):
        """Token ids and targets, uniform over the vocabulary, from a fixed seed."""
        g = torch.Generator().manual_seed(self.seed + 1)
        idx = torch.randint(0, self.gpt.vocab_size, (self.B, self.T), generator=g)
        tgt = torch.randint(0, self.gpt.vocab_size, (self.B, self.T), generator=g)
        return idx.to(self.device), tgt.to(self.device)

    def model(self, dropout: float = 0.0):
        """A fresh model with the same weights every time (eager and compiled start equal)."""
        torch.manual_seed(self.seed)
        with torch.device(self.device):
            return GPT(replace(self.gpt, dropout=dropout))

    def decode_lm(self, kind: str, dtype=torch.bfloat16):
        """The decode rows' model ("gpt2" or "llama"): random weights from torch.manual_seed(0),
        converted with model.to(dtype) (no autocast), inference only."""
        torch.manual_seed(self.decode_seed)
        with torch.device(self.device):
            model = GPT(self.gpt) if kind == "gpt2" else dec.Llama(dec.LLAMA_CONFIGS[self.llama_name])
        model = model.to(dtype).eval().requires_grad_(False)
        return dec.Gpt2Cached(model) if kind == "gpt2" else model

    def resnet_model(self):
        """A fresh ResNet (f32 parameters, channels-last) with the same weights every time."""
        torch.manual_seed(self.seed)
        with torch.device(self.device):
            model = ResNet(self.resnet)
        return model.to(memory_format=torch.channels_last)

    def images(self):
        """A batch of N(0, 1) images, bf16, channels-last, and random labels, from a fixed seed."""
        r = self.resnet
        g = torch.Generator().manual_seed(self.seed + 3)
        x = torch.randn(r.batch, 3, r.image, r.image, generator=g).to(torch.bfloat16)
        y = torch.randint(0, r.num_classes, (r.batch,), generator=g)
        return x.to(self.device).contiguous(memory_format=torch.channels_last), y.to(self.device)

    def prompt_ids(self, batch: int, vocab: int):
        """A prompt [batch, self.prompt] of token ids, uniform over the vocabulary, from a fixed seed."""
        g = torch.Generator().manual_seed(self.seed + 2)
        return torch.randint(0, vocab, (batch, self.prompt), generator=g).to(self.device)


@dataclass
class RowSpec:
    """One row of the models table. `setup(ctx, compile)` builds everything the row needs and
    returns the step to time (a call that returns a tensor: a loss, or token ids); `compile` is None
    for the eager column, else the function that compiles a module or function (torch.compile with
    the row's `compile_mode` (None = default mode) and `fullgraph`); `per_call` divides the times
    (e.g. tokens per call). A `loop` row's call is a whole generation loop (seconds in eager mode),
    timed --loop-reps times after --loop-warmup instead of --reps and --warmup. `per_token` rows
    report time per token and tokens/s (`batch` sequences per call)."""
    name: str  # "{size}" is replaced by the config name (124m, tiny), "{llama}" by the Llama's (1b, tiny)
    setup: Callable[[Ctx, Optional[Callable[[nn.Module], nn.Module]]], Callable[[], torch.Tensor]]
    notes: str
    compile_mode: Optional[str] = None
    per_call: Callable[[Ctx], int] = field(default=lambda ctx: 1)
    fullgraph: bool = False
    loop: bool = False
    per_token: bool = False
    batch: int = 1
    precision: Optional[str] = None  # None: PRECISION (the forward and training rows')


def setup_forward(ctx: Ctx, compile):
    model = ctx.model().eval()
    run = compile(model) if compile else model
    idx, tgt = ctx.batch()

    def step():
        with torch.no_grad(), ctx.autocast():
            _, loss = run(idx, tgt)
        return loss

    return step


def setup_train_step(ctx: Ctx, compile, dropout: float = 0.0):
    model = ctx.model(dropout).train()
    run = compile(model) if compile else model
    opt = make_adamw(model, fused=True)
    idx, tgt = ctx.batch()

    def step():
        opt.zero_grad(set_to_none=True)
        with ctx.autocast():
            _, loss = run(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    return step


def setup_resnet_forward(ctx: Ctx, compile):
    model = ctx.resnet_model().eval()
    run = compile(model) if compile else model
    x, _ = ctx.images()

    def step():
        with torch.no_grad(), ctx.autocast():
            return run(x)

    return step


def setup_resnet_train_step(ctx: Ctx, compile):
    model = ctx.resnet_model().train()
    run = compile(model) if compile else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x, y = ctx.images()

    def step():
        opt.zero_grad(set_to_none=True)
        with ctx.autocast():
            loss = F.cross_entropy(run(x).float(), y)
        loss.backward()
        opt.step()
        return loss

    return step


def setup_decode(kind: str, batch: int):
    """A decode row's setup: the model, the cache, the prompt prefilled (eagerly, not timed); the
    timed call is decode_loop of ctx.new_tokens steps from position ctx.prompt (models_torch_decode)."""

    def setup(ctx: Ctx, compile):
        lm = ctx.decode_lm(kind)
        cache = lm.new_cache(batch, ctx.prompt + ctx.new_tokens)
        prompt = ctx.prompt_ids(batch, lm.vocab_size)
        with torch.no_grad():
            first, _ = dec.prefill(lm, cache, prompt)
        step = dec.make_step(lm, cache)
        run = compile(step) if compile else step
        start = torch.tensor(ctx.prompt, device=ctx.device)
        return lambda: dec.decode_loop(run, first, start, ctx.new_tokens, mark_steps=compile is not None)

    return setup


def setup_prefill(ctx: Ctx, compile):
    """The prefill row: the prompt (batch 1) written into an empty cache from position 0, the next
    token from the last position's logits."""
    lm = ctx.decode_lm("llama")
    cache = lm.new_cache(1, ctx.prompt + ctx.new_tokens)
    prompt = ctx.prompt_ids(1, lm.vocab_size)
    fn = dec.make_prefill(lm, cache)
    run = compile(fn) if compile else fn

    def step():
        with torch.no_grad():
            return run(prompt)[0]

    return step


PRECISION = ("parameters f32; torch.autocast(bfloat16): matmuls and attention in bf16, layer norm, softmax "
             "and cross-entropy in f32; TF32 off")
DECODE_PRECISION = ("weights bf16 (model.to(torch.bfloat16)), no autocast: matmuls, attention and the cache in bf16; "
                    "RMSNorm in f32 cast back (HF's), LayerNorm bf16 in and out; logits bf16 cast to f32; TF32 off")

# The dropout probability of the dropout training row (nanoGPT's for fine-tuning).
TRAIN_DROPOUT = 0.1

ROWS = [
    RowSpec(
        "gpt2_{size}_fwd_bf16", setup_forward,
        "forward to the loss (logits at every position + cross-entropy with targets) under torch.no_grad(); "
        "compiled: torch.compile(model), default mode"),
    RowSpec(
        "gpt2_{size}_train_step_bf16", setup_train_step,
        "zero_grad(set_to_none) + forward + loss + backward + clip_grad_norm_(1.0) + AdamW(fused=True, lr 6e-4, "
        "betas (0.9, 0.95), eps 1e-8, wd 0.1 on 2-D params) step; compiled: torch.compile(model) default mode, "
        "the optimizer step and the clipping run eagerly (as nanoGPT)"),
    RowSpec(
        "gpt2_{size}_train_step_dropout_bf16", lambda ctx, compile: setup_train_step(ctx, compile, TRAIN_DROPOUT),
        "the training step above with dropout 0.1 where nanoGPT applies it: after the embeddings, on the "
        "attention weights (F.scaled_dot_product_attention's dropout_p), after each residual projection"),
]

RESNET_PRECISION = ("parameters f32, model and input channels-last, input bf16; torch.autocast(bfloat16): convolutions "
                    "and the classifier in bf16, batch norm bf16 in and out (f32 statistics), cross-entropy in f32; "
                    "TF32 off")
ROWS += [
    RowSpec(
        "{resnet}_fwd_bf16", setup_resnet_forward,
        "inference forward to the logits (eval mode: batch norm with running statistics) under torch.no_grad(), "
        "batch {RB} of {RI}x{RI}; compiled: torch.compile(model), default mode", precision=RESNET_PRECISION),
    RowSpec(
        "{resnet}_train_step_bf16", setup_resnet_train_step,
        "zero_grad(set_to_none) + forward (train mode: batch statistics, running statistics updated) + "
        "cross-entropy on random labels + backward + SGD(lr 0.1, momentum 0.9, weight_decay 1e-4, foreach) step, "
        "batch {RB} of {RI}x{RI}; compiled: torch.compile(model) default mode, the optimizer step eagerly",
        precision=RESNET_PRECISION),
]

DECODE_NOTES = (
    "ms per decode step (one new token for each of the {B} sequence(s)) = one loop of {N} steps / {N}: prompt {P} "
    "prefilled (not timed), then step i feeds the token at position {P}+i (static KV cache [B, kv heads, {P}+{N}, "
    "head dim] per layer, index_copy_ at a 0-d position tensor, SDPA with a boolean mask over the cache) and takes "
    "the argmax on the device; token cloned and fed back, pos.add_(1) on the device, no host sync in the loop; "
    "compiled: torch.compile(decode_step, mode='reduce-overhead', fullgraph=True) (CUDA graphs)")


def decode_row(model: str, batch: int) -> RowSpec:
    prefix = "gpt2_{size}" if model == "gpt2" else "llama_{llama}"
    return RowSpec(
        f"{prefix}_decode_b{batch}_bf16", setup_decode(model, batch), DECODE_NOTES, compile_mode="reduce-overhead",
        per_call=lambda ctx: ctx.new_tokens, fullgraph=True, loop=True, per_token=True, batch=batch,
        precision=DECODE_PRECISION)


ROWS += [decode_row(m, b) for m in ("gpt2", "llama") for b in (1, 16)] + [
    RowSpec(
        "llama_{llama}_prefill_bf16", setup_prefill,
        "ms per prompt token = one prefill of the {P}-token prompt at batch 1 / {P}: written into an empty static "
        "KV cache from position 0, causal SDPA among the prompt's tokens (GQA by repeat_interleave of the prompt's "
        "keys and values), the final norm and the head on the last position only, argmax on the device; compiled: "
        "torch.compile(prefill, fullgraph=True), default mode",
        per_call=lambda ctx: ctx.prompt, fullgraph=True, per_token=True, batch=1, precision=DECODE_PRECISION),
]


# ----------------------------------------------------------------------------------------------
# Measurement.


class Clock:
    """Device time and wall clock of a step, the torch_suite.py way (see the module doc)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def device_ms(self, step, reps):
        if not self.cuda:
            return self.wall_ms(step, reps)
        flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=self.device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        self.sync()
        for s, e in zip(starts, ends):
            flush.zero_()
            s.record()
            step()
            e.record()
        self.sync()
        del flush
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def wall_ms(self, step, reps):
        flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=self.device) if self.cuda else None
        times = []
        for _ in range(reps):
            if flush is not None:
                flush.zero_()
            self.sync()
            t0 = time.perf_counter()
            step()
            self.sync()
            times.append((time.perf_counter() - t0) * 1e3)
        del flush
        return times

    def first_call_s(self, step):
        self.sync()
        t0 = time.perf_counter()
        out = step()
        self.sync()
        return time.perf_counter() - t0, out

    def memory(self, step):
        """(resident bytes when the call begins, peak bytes during it); None on the CPU."""
        if not self.cuda:
            step()
            return None, None
        self.sync()
        resident = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        step()
        self.sync()
        return resident, torch.cuda.max_memory_allocated(self.device)


def reset_compiler():
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def summarize(out: torch.Tensor) -> dict:
    """What a step returned, for the row: a loss as a float, token ids as the first 16 of sequence 0."""
    if out.is_floating_point() and out.numel() == 1:
        return dict(loss=float(out.float().item()))
    if out.is_floating_point():  # logits
        return dict(logits_mean=float(out.float().mean().item()))
    return dict(tokens=out.reshape(out.shape[0], -1)[0, :16].tolist())


def measure(spec: RowSpec, ctx: Ctx, compiled: bool, clock: Clock, warmup: int, reps: int) -> dict:
    """Times one row in one mode; returns its numbers under mode-neutral keys."""
    reset_compiler()
    graphs0, skips0 = dec.compile_counts()
    # torch.compile is lazy: nothing compiles before the first call, timed below
    compile = (lambda m: torch.compile(m, mode=spec.compile_mode, fullgraph=spec.fullgraph)) if compiled else None
    step = spec.setup(ctx, compile)
    first_s, out = clock.first_call_s(step)
    first = summarize(out)
    for _ in range(warmup):
        step()
    resident, peak = clock.memory(step)
    dev = clock.device_ms(step, reps)
    wall = clock.wall_ms(step, reps)
    # a loop row's calls are long and give the same tokens every time: no extra call for the last value
    last = {} if spec.loop else summarize(step())
    graphs, skips = dec.compile_counts()
    div = spec.per_call(ctx)
    res = dict(
        ms=statistics.median(dev) / div,
        ms_min=min(dev) / div,
        ms_max=max(dev) / div,
        wall_ms=statistics.median(wall) / div,
        peak_bytes=peak,
        resident_bytes=resident,
        first_call_s=first_s,
        first=first,
        last=last,
        # Dynamo graphs compiled over every call of the row (1 = no recompiles; more with graph
        # breaks or recompiles) and CUDA-graph trees that fell back to running without graphs
        compiles=graphs - graphs0,
        cudagraph_skips=skips - skips0,
    )
    # compile time = time to the first result minus a steady call (wall clock, whole call)
    res["compile_s"] = first_s - statistics.median(wall) / 1e3
    del step, out
    reset_compiler()
    return res


def row_name(spec: RowSpec, ctx: Ctx) -> str:
    return spec.name.format(**ctx.sizes)


def run_row(spec: RowSpec, ctx: Ctx, modes, clock: Clock, warmup: int, reps: int) -> dict:
    name = row_name(spec, ctx)
    if spec.loop:
        warmup, reps = ctx.loop_warmup, ctx.loop_reps
    row = dict(name=name, torch_compile_ms=None, torch_eager_ms=None, torch_peak_bytes=None,
               torch_eager_peak_bytes=None, torch_compile_s=None,
               notes=spec.notes.format(B=spec.batch, N=ctx.new_tokens, P=ctx.prompt, RB=ctx.resnet.batch, RI=ctx.resnet.image),
               compile_mode=spec.compile_mode or "default", fullgraph=spec.fullgraph,
               precision=spec.precision or PRECISION, warmup=warmup, reps=reps)
    if spec.per_token:
        row.update(per_token=True, batch=spec.batch, tokens_per_call=spec.per_call(ctx))
    for mode in ("eager", "compile"):
        if mode not in modes:
            continue
        try:
            r = measure(spec, ctx, mode == "compile", clock, warmup, reps)
        except Exception as e:  # keep the other rows and modes; the exit status says it failed
            import traceback
            traceback.print_exc()
            row.setdefault("error", {})[mode] = repr(e)[:400]
            reset_compiler()
            continue
        row[f"torch_{mode}_ms"] = r["ms"]
        row[f"torch_{mode}_ms_min"] = r["ms_min"]
        row[f"torch_{mode}_ms_max"] = r["ms_max"]
        row[f"torch_{mode}_wall_ms"] = r["wall_ms"]
        row["torch_peak_bytes" if mode == "compile" else "torch_eager_peak_bytes"] = r["peak_bytes"]
        row[f"torch_{mode}_resident_bytes"] = r["resident_bytes"]
        row[f"torch_{mode}_first_call_s"] = r["first_call_s"]
        for when in ("first", "last"):
            for k, v in r[when].items():
                row[f"torch_{mode}_{when}_{k}"] = v
        if spec.per_token:
            row[f"torch_{mode}_tokens_per_s"] = spec.batch * 1e3 / r["ms"]
        if mode == "compile":
            row["torch_compile_s"] = r["compile_s"]
            row["torch_compiles"] = r["compiles"]
            row["torch_cudagraph_skips"] = r["cudagraph_skips"]
        what = (f"loss {r['first']['loss']:.4f}" if "loss" in r["first"] else
                f"logits mean {r['first']['logits_mean']:.4f}" if "logits_mean" in r["first"] else
                f"tokens {r['first']['tokens'][:6]}")
        unit = "ms/token" if spec.per_token else "ms"
        print(f"  {name} {mode}: {r['ms']:.4f} {unit} device, {r['wall_ms']:.4f} {unit} wall, first call "
              f"{r['first_call_s']:.2f} s, {what}"
              + (f", {r['compiles']} compile(s), {r['cudagraph_skips']} CUDA-graph skip(s)" if mode == "compile" else ""),
              flush=True)
    return row


def fmt(v, scale=1.0, spec="{:.3f}"):
    return "-" if v is None else spec.format(v * scale)


def table(res: dict) -> str:
    lines = [f"device: {res['device']}  torch {res['torch']}  config {res['config']}",
             f"precision: {res['precision']}",
             "ms: per call, or per token on rows marked 'tok' (decode: per step of B tokens; prefill: per prompt "
             "token); tok/s = B * 1000 / ms",
             f"{'row':32s} {'unit':>4s} {'eager ms':>9s} {'compile ms':>10s} {'eager wall':>10s} {'cmp wall':>9s} "
             f"{'eager/cmp':>9s} {'eager MiB':>9s} {'cmp MiB':>8s} {'compile s':>9s} {'compiles':>8s} "
             f"{'eager tok/s':>11s} {'cmp tok/s':>9s}"]
    for r in res["rows"]:
        e, c = r.get("torch_eager_ms"), r.get("torch_compile_ms")
        ratio = e / c if e and c else None
        lines.append(
            f"{r['name']:32s} {'tok' if r.get('per_token') else 'call':>4s} {fmt(e, spec='{:.4f}'):>9s} "
            f"{fmt(c, spec='{:.4f}'):>10s} {fmt(r.get('torch_eager_wall_ms'), spec='{:.4f}'):>10s} "
            f"{fmt(r.get('torch_compile_wall_ms'), spec='{:.4f}'):>9s} {fmt(ratio, spec='{:.2f}'):>9s} "
            f"{fmt(r.get('torch_eager_peak_bytes'), 2**-20, '{:.0f}'):>9s} "
            f"{fmt(r.get('torch_peak_bytes'), 2**-20, '{:.0f}'):>8s} {fmt(r.get('torch_compile_s'), spec='{:.1f}'):>9s} "
            f"{fmt(r.get('torch_compiles'), spec='{:.0f}'):>8s} "
            f"{fmt(r.get('torch_eager_tokens_per_s'), spec='{:.0f}'):>11s} "
            f"{fmt(r.get('torch_compile_tokens_per_s'), spec='{:.0f}'):>9s}"
            + (f"  ERROR {r['error']}" if "error" in r else ""))
    return "\n".join(lines)


def select_rows(wanted, ctx: Ctx):
    """The specs whose name (formatted for this config or for the full-size one) matches one of
    `wanted` (names or fnmatch patterns; all rows if empty), and the patterns that match none."""
    full = dict(size="124m", llama="1b", resnet=RESNET_NAMES["124m"])
    names = lambda s: (s.name, s.name.format(**ctx.sizes), s.name.format(**full))  # noqa: E731
    hit = lambda s, w: any(fnmatch.fnmatchcase(n, w) for n in names(s))  # noqa: E731
    specs = [s for s in ROWS if not wanted or any(hit(s, w) for w in wanted)]
    return specs, [w for w in wanted if not any(hit(s, w) for s in ROWS)]


def self_check(device: torch.device) -> int:
    """--check: the decode paths of the tiny GPT-2 and the tiny Llama (models_torch_decode.check_model),
    and the tiny Llama against transformers' when installed. Returns the exit status."""
    log = lambda m: print(m, flush=True)  # noqa: E731
    tiny = CONFIGS["tiny"]

    def gpt2(dtype):
        torch.manual_seed(0)
        with torch.device(device):
            model = GPT(tiny["gpt"])
        dec.perturb_(model, 1)
        return dec.Gpt2Cached(model.to(dtype).eval())

    def llama(dtype):
        torch.manual_seed(0)
        with torch.device(device):
            model = dec.Llama(dec.LLAMA_CONFIGS[tiny["llama"]])
        dec.perturb_(model, 2)
        return model.to(dtype).eval()

    t0 = time.time()
    log(f"self-check on {device}: the static-cache paths against the full forward (prompt {tiny['prompt']}, "
        f"{tiny['new_tokens']} decode steps, batch 2)")
    dec.check_model("gpt2 tiny", gpt2, device, log, P=tiny["prompt"], N=tiny["new_tokens"])
    dec.check_model("llama tiny (GQA, 8 heads / 2 kv heads)", llama, device, log, P=tiny["prompt"],
                    N=tiny["new_tokens"])
    dec.check_llama_against_hf(dec.LLAMA_CONFIGS[tiny["llama"]], log)
    log(f"self-check passed ({time.time() - t0:.0f} s)")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--config", default="124m", choices=sorted(CONFIGS))
    ap.add_argument("--rows", default="", help="comma-separated row names or fnmatch patterns (gpt2_124m_fwd_bf16, "
                    "'llama_*', '*decode*'); the full-size names select the tiny rows with --config tiny; all if empty")
    ap.add_argument("--modes", default="eager,compile", help="eager, compile or both")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--reps", type=int, default=30, help="timed calls per measurement (median)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls after the first")
    ap.add_argument("--loop-reps", type=int, default=5, help="timed calls of a decode row (each a whole loop)")
    ap.add_argument("--loop-warmup", type=int, default=1, help="untimed decode loops after the first")
    ap.add_argument("--warm-cache", action="store_true", help="keep Inductor's and Triton's caches (not cold)")
    ap.add_argument("--check", action="store_true", help="run the self-check of the decode paths (tiny models, "
                    "whatever --config says) and exit")
    args = ap.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        print("models_torch: --device cuda but no CUDA device is usable", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if not args.warm_cache and hasattr(torch._inductor.config, "force_disable_caches"):
        torch._inductor.config.force_disable_caches = True
    if args.check:
        return self_check(torch.device(args.device))

    cfg = CONFIGS[args.config]
    ctx = Ctx(config=args.config, gpt=cfg["gpt"], B=cfg["B"], T=cfg["T"], device=torch.device(args.device),
              llama_name=cfg["llama"], prompt=cfg["prompt"], new_tokens=cfg["new_tokens"], resnet=cfg["resnet"],
              loop_warmup=args.loop_warmup, loop_reps=args.loop_reps)
    specs, unknown = select_rows([w for w in args.rows.split(",") if w], ctx)
    if unknown:
        print(f"models_torch: no rows match {unknown}; rows are {[row_name(s, ctx) for s in ROWS]}", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in ("eager", "compile") for m in modes):
        print(f"models_torch: --modes takes eager and/or compile, not {args.modes!r}", file=sys.stderr)
        return 2

    clock = Clock(ctx.device)
    device_name = torch.cuda.get_device_name(ctx.device) if clock.cuda else "cpu"
    # Start the device, cuBLAS and the attention kernels before anything is timed.
    with ctx.autocast():
        a = torch.randn(256, 256, device=ctx.device)
        q = torch.randn(1, 2, 16, 64, device=ctx.device)
        (a @ a).sum().item()
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().item()

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    llama = dec.LLAMA_CONFIGS[ctx.llama_name]
    res = dict(
        device=device_name, torch=torch.__version__, triton=triton_version, config=args.config,
        model=dict(vars(ctx.gpt), B=ctx.B, T=ctx.T), precision=PRECISION, resnet=dict(vars(ctx.resnet)),
        decode=dict(prompt=ctx.prompt, new_tokens=ctx.new_tokens, capacity=ctx.prompt + ctx.new_tokens,
                    llama=dict(vars(llama), name=ctx.llama_name, head_dim=llama.head_dim)),
        timing=("device ms: median of CUDA-event times of --reps calls after --warmup (decode rows: --loop-reps "
                "whole loops after --loop-warmup), each after a 256 MiB L2 flush, no sync between calls; "
                "wall ms: host clock per call, synchronized; per-token rows divide both by the tokens per call; "
                "peak: max_memory_allocated over one steady call; compile s: first call of the compiled model minus "
                "a steady call, cold caches" + (" (warm caches kept)" if args.warm_cache else "")),
        rows=[],
    )
    t_start = time.time()
    for spec in specs:
        print(f"{row_name(spec, ctx)}:", flush=True)
        res["rows"].append(run_row(spec, ctx, modes, clock, args.warmup, args.reps))
    res["total_s"] = time.time() - t_start
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    print(table(res))
    print(f"total {res['total_s']:.0f} s")
    return 1 if any("error" in r for r in res["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
