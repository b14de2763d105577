"""Generation with a static key/value cache in plain PyTorch, for the decode and prefill rows of
bench/models_torch.py (issue 21, deliverable 7): a Llama written here, GPT-2's cached forward (on
models_torch.py's nanoGPT model), the cache, the one-token decode step, the decode loop and the
self-check (`models_torch.py --check`) that the cached paths give the full forward's logits.

The models
  GPT-2: models_torch.GPT (nanoGPT's), run through `Gpt2Cached`.
  Llama: `Llama`, Hugging Face LlamaForCausalLM's computation and parameter names (RMSNorm in f32
         then cast back, q/k/v/o projections without bias, rotary embedding in HF's rotate_half
         convention with cos/sin tables computed in f32 and stored in the model's dtype, grouped-query
         attention, SwiGLU MLP, final RMSNorm, head tied to the embedding or not). Rotary is the
         plain kind (inv_freq = theta^(-2i/D)); Llama 3.2's "llama3" frequency rescaling is left out
         (coil's Llama leaves it out too; it changes the tables' values, not the work per token).

The cache: per layer a key and a value tensor of shape [B, n_kv_head, capacity, head_dim] in the
model's dtype, allocated once and marked with torch._dynamo.mark_static_address (CUDA graphs keep
their addresses; writing them in place is not a mutation of a copied input). A call for T tokens at
start position `pos` (a 0-d int64 tensor on the device, never a Python int, so one graph serves all
positions) writes positions pos..pos+T-1 with index_copy_ along the capacity axis, then attends:
  decode (prefill=False): the queries against the whole cache through a boolean mask
        keys <= query position ([T, capacity]), F.scaled_dot_product_attention(attn_mask=mask).
        For grouped-query attention the G = n_head / n_kv_head query heads that share a key/value
        head are folded into the query rows ([B, n_kv_head, G*T, head_dim], the mask repeated G
        times), so the cache is read as it is, without repeat_interleave copies of it.
  prefill (prefill=True): the call's own keys and values, causally (is_causal=True, the fused
        kernels; GQA by repeat_interleave of those T keys). Valid only for a prompt written from
        position 0 into an empty cache, which is how the rows use it.
The forward returns the logits of the last position only (as a generation loop needs; HF's generate
does the same), in float32: the head's bf16 output cast to f32.

The decode step (`make_step`): (token ids [B, 1] int64, pos 0-d int64) -> (next token [B, 1] int64 =
argmax of the logits on the device, logits [B, vocab] f32). `decode_loop` calls it once per new
token: the returned token is cloned (CUDA-graph outputs are overwritten by the next replay) and fed
back, `pos` is advanced in place on the device (pos.add_(1)), the tokens are kept on the device and
concatenated at the end; nothing is copied to the host and nothing synchronizes inside the loop.
For the compiled step, torch.compiler.cudagraph_mark_step_begin() precedes each call.
"""
from dataclasses import dataclass
from typing import Callable, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------------------------
# Llama (written here from the Llama / HF description, not copied).


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    rope_theta: float
    rms_norm_eps: float
    max_positions: int
    tie_word_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_head


LLAMA_CONFIGS = {
    # Llama 3.2 1B's sizes (1.24B parameters with the tied head); rotary tables for 4096 positions
    "1b": LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, n_layer=16, n_head=32,
                      n_kv_head=8, rope_theta=500000.0, rms_norm_eps=1e-5, max_positions=4096),
    # grouped-query attention with 4 query heads per key/value head, as 1B has
    "tiny": LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, n_layer=2, n_head=8,
                        n_kv_head=2, rope_theta=10000.0, rms_norm_eps=1e-5, max_positions=64),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        d = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.n_head * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.n_kv_head * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.n_kv_head * d, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * d, cfg.hidden_size, bias=False)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Llama(nn.Module):
    """LlamaForCausalLM's computation; `state_dict()` has HF's names (model.layers.0.self_attn.q_proj.weight)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.n_layer))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        for m in self.modules():  # HF's initialization: normal(0, 0.02), norms at 1
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # rotary tables [max_positions, head_dim], computed in f32; model.to(bf16) rounds them as HF's
        # cos.to(x.dtype) does
        d = cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.outer(torch.arange(cfg.max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def new_cache(self, batch: int, capacity: int) -> "StaticKVCache":
        w = self.lm_head.weight
        return StaticKVCache(self.cfg.n_layer, batch, self.cfg.n_kv_head, capacity, self.cfg.head_dim, w.dtype, w.device)

    def logits(self, idx):
        """The full forward without a cache: logits [B, T, vocab] (f32) at every position."""
        return self.forward_cached(idx, torch.zeros((), dtype=torch.long, device=idx.device), None,
                                   prefill=True, all_logits=True)

    def forward_cached(self, idx, pos, cache: Optional["StaticKVCache"], prefill: bool, all_logits: bool = False):
        """Tokens idx [B, T] at positions pos..pos+T-1 (pos a 0-d int64 tensor): writes the cache
        (if any) and returns the last position's logits [B, vocab] f32 (every position's with all_logits)."""
        cfg = self.cfg
        B, T = idx.shape
        positions = pos.view(1) + torch.arange(T, device=idx.device)
        # [T, 1, head_dim]: broadcast over [B, T, heads, head_dim]
        cos = self.rope_cos[positions].unsqueeze(1)
        sin = self.rope_sin[positions].unsqueeze(1)
        x = self.model.embed_tokens(idx)
        for i, layer in enumerate(self.model.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_proj(h).view(B, T, cfg.n_head, cfg.head_dim)
            k = a.k_proj(h).view(B, T, cfg.n_kv_head, cfg.head_dim)
            v = a.v_proj(h).view(B, T, cfg.n_kv_head, cfg.head_dim)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            x = x + a.o_proj(attend(q, k, v, positions, cache, i, prefill))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = self.model.norm(x if all_logits else x[:, -1])
        return self.lm_head(x).float()


# ----------------------------------------------------------------------------------------------
# GPT-2 with the cache: models_torch.GPT's modules, run with positions and a cache.


class Gpt2Cached:
    """models_torch.GPT (nanoGPT's GPT-2) with the cached forward Llama has."""

    def __init__(self, gpt):
        self.gpt = gpt
        self.n_head = gpt.cfg.n_head
        self.n_embd = gpt.cfg.n_embd

    @property
    def vocab_size(self) -> int:
        return self.gpt.cfg.vocab_size

    def new_cache(self, batch: int, capacity: int) -> "StaticKVCache":
        w = self.gpt.lm_head.weight
        return StaticKVCache(len(self.gpt.transformer.h), batch, self.n_head, capacity, self.n_embd // self.n_head,
                             w.dtype, w.device)

    def logits(self, idx):
        """The model's own forward (models_torch.GPT.forward, causal attention without a cache), f32."""
        return self.gpt(idx, torch.zeros_like(idx))[0].float()

    def forward_cached(self, idx, pos, cache: Optional["StaticKVCache"], prefill: bool, all_logits: bool = False):
        B, T = idx.shape
        C, H = self.n_embd, self.n_head
        positions = pos.view(1) + torch.arange(T, device=idx.device)
        tr = self.gpt.transformer
        x = tr.wte(idx) + tr.wpe(positions)
        for i, block in enumerate(tr.h):
            q, k, v = block.attn.c_attn(block.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H) for t in (q, k, v))
            x = x + block.attn.c_proj(attend(q, k, v, positions, cache, i, prefill))
            x = x + block.mlp(block.ln_2(x))
        x = tr.ln_f(x if all_logits else x[:, -1])
        return self.gpt.lm_head(x).float()


# ----------------------------------------------------------------------------------------------
# The cache and attention.


class StaticKVCache:
    """Per layer a key and a value tensor [B, n_kv_head, capacity, head_dim], at fixed addresses."""

    def __init__(self, n_layer, batch, n_kv_head, capacity, head_dim, dtype, device):
        shape = (batch, n_kv_head, capacity, head_dim)
        self.capacity = capacity
        self.k: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.v: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        for t in self.k + self.v:
            torch._dynamo.mark_static_address(t)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def attend(q, k, v, positions, cache: Optional[StaticKVCache], layer: int, prefill: bool):
    """q [B, T, H, D], k and v [B, T, Hkv, D] at `positions` [T] -> attention output [B, T, H*D].
    Writes k and v into the cache (if any); then prefill (or no cache): causal attention among
    these T tokens; else: the queries against the cache's keys at positions <= their own."""
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    G = H // Hkv
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, Hkv, T, D]
    if cache is not None:
        cache.k[layer].index_copy_(2, positions, k)
        cache.v[layer].index_copy_(2, positions, v)
    if cache is None or prefill:
        if G > 1:
            k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True)  # [B, H, T, D]
        return y.transpose(1, 2).reshape(B, T, H * D)
    # query heads g*Hkv.. share key/value head h // G (HF's repeat_kv order): fold the G heads of a
    # group into the query rows, row r = g * T + t
    qg = q.view(B, T, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * T, D)
    keys = torch.arange(cache.capacity, device=q.device)
    mask = keys.view(1, -1) <= positions.view(T, 1)  # [T, capacity]
    if G > 1:
        mask = mask.repeat(G, 1)
    y = F.scaled_dot_product_attention(qg, cache.k[layer], cache.v[layer], attn_mask=mask)
    return y.view(B, Hkv, G, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, H * D)


# ----------------------------------------------------------------------------------------------
# Prefill, the decode step and the decode loop.


def prefill(lm, cache: StaticKVCache, prompt):
    """Writes the prompt [B, P] into the empty cache at positions 0..P-1; returns the greedy next
    token [B, 1] (the first generated token) and the last position's logits [B, vocab]."""
    pos = torch.zeros((), dtype=torch.long, device=prompt.device)
    logits = lm.forward_cached(prompt, pos, cache, prefill=True)
    return logits.argmax(-1, keepdim=True), logits


def make_prefill(lm, cache: StaticKVCache) -> Callable:
    """prompt [B, P] -> (next token [B, 1], logits [B, vocab]): the function the prefill row times."""

    def prefill_step(prompt):
        return prefill(lm, cache, prompt)

    return prefill_step


def make_step(lm, cache: StaticKVCache) -> Callable:
    """The one-token decode step: (tokens [B, 1] int64, pos 0-d int64) -> (next tokens [B, 1]
    (argmax, on the device), logits [B, vocab] f32). Compile this one."""

    def decode_step(tok, pos):
        logits = lm.forward_cached(tok, pos, cache, prefill=False)
        return logits.argmax(-1, keepdim=True), logits

    return decode_step


def decode_loop(step: Callable, first_tok, start_pos, n: int, mark_steps: bool, keep_logits: bool = False):
    """n decode steps from start_pos (0-d int64; not modified): step i feeds the token at position
    start_pos + i (first_tok for i = 0) and yields the token after it. Returns the n new tokens
    [B, n] (and the list of n logits with keep_logits). mark_steps: call
    torch.compiler.cudagraph_mark_step_begin() before each step (for the compiled step)."""
    with torch.no_grad():
        pos = start_pos.clone()
        tok = first_tok
        toks, logits = [], []
        for _ in range(n):
            if mark_steps:
                torch.compiler.cudagraph_mark_step_begin()
            nxt, lg = step(tok, pos)
            tok = nxt.clone()  # a CUDA-graph output is overwritten by the next replay
            toks.append(tok)
            if keep_logits:
                logits.append(lg.clone())
            pos.add_(1)
        out = torch.cat(toks, dim=1)
    return (out, logits) if keep_logits else out


# ----------------------------------------------------------------------------------------------
# Self-check (models_torch.py --check): the cached paths against the full forward.


def compile_counts():
    """(Dynamo graphs compiled so far, CUDA-graph skips so far) from torch._dynamo's counters."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]


def perturb_(model: nn.Module, seed: int):
    """Moves every parameter away from its initial constants (norm weights of 1, zero biases), so the
    check would notice a norm or bias left out."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g).to(p.device, p.dtype))


def _close(name, got, want, tol, log):
    err = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    log(f"    {name}: max |diff| {err:.3g} (max |logit| {scale:.3g}, tolerance {tol * max(scale, 1.0):.3g})")
    assert err <= tol * max(scale, 1.0), f"{name}: max |diff| {err} over {tol} x {scale}"


def check_model(name: str, make_lm: Callable[[torch.dtype], object], device: torch.device, log,
                P: int = 16, N: int = 8, B: int = 2, compile_too: bool = True):
    """Asserts, for a tiny model: prefill logits (every prompt position), the logits of N greedy
    decode steps, and the decode path fed every position from 0 (one token at a time, and the whole
    prompt at once through the masked path) equal the full forward's logits; in f32 (tight) and bf16
    (bf16 tolerance). With compile_too, the decode step compiled with mode='reduce-overhead',
    fullgraph=True gives the eager step's logits at N positions after one compile (no recompiles;
    on CUDA no CUDA-graph skips), and the compiled prefill gives the eager prefill's logits."""
    cap = P + N
    for dtype, tol in ((torch.float32, 2e-5), (torch.bfloat16, 4e-2)):
        log(f"  {name} {str(dtype).replace('torch.', '')}:")
        lm = make_lm(dtype)
        prompt = torch.randint(0, lm.vocab_size, (B, P), generator=torch.Generator().manual_seed(7)).to(device)
        with torch.no_grad():
            full_prompt = lm.logits(prompt)
            cache = lm.new_cache(B, cap)
            pre = lm.forward_cached(prompt, torch.zeros((), dtype=torch.long, device=device), cache, prefill=True,
                                    all_logits=True)
            _close("prefill (causal), every prompt position", pre, full_prompt, tol, log)
            first, last_logits = prefill(lm, lm.new_cache(B, cap), prompt)
            _close("prefill, last position only", last_logits, full_prompt[:, -1], tol, log)
            # the decode steps after this cache (written by the all-logits prefill above)
            step = make_step(lm, cache)
            start = torch.tensor(P, device=device)
            new, logits = decode_loop(step, first, start, N, mark_steps=False, keep_logits=True)
            assert int(start) == P, "decode_loop must not advance the caller's start position"
            seq = torch.cat([prompt, first, new[:, :-1]], dim=1)  # the P + N tokens fed
            full = lm.logits(seq)
            _close(f"{N} decode steps after the prefill", torch.stack(logits, 1), full[:, P:], tol, log)
            if dtype == torch.float32:  # bf16 argmax may flip on near-ties; f32 must not
                assert torch.equal(new[:, :-1], full[:, P:-1].argmax(-1)), "greedy tokens differ from the full forward's"
            # the decode path from position 0: one token at a time, then the prompt at once (masked)
            cache0 = lm.new_cache(B, cap)
            scratch = [step0(lm, cache0, seq[:, t:t + 1], t) for t in range(cap)]
            _close("decode path one token at a time from position 0", torch.stack(scratch, 1), full, tol, log)
            masked = lm.forward_cached(prompt, torch.zeros((), dtype=torch.long, device=device), lm.new_cache(B, cap),
                                       prefill=False, all_logits=True)
            _close("masked path, the whole prompt at once", masked, full_prompt, tol, log)
            if dtype == torch.float32 and compile_too:
                check_compiled(lm, prompt, first, logits, full_prompt[:, -1], N, device, tol, log)


def step0(lm, cache, tok, t):
    return lm.forward_cached(tok, torch.tensor(t, device=tok.device), cache, prefill=False)


def check_compiled(lm, prompt, first, eager_logits, eager_prefill_logits, N, device, tol, log):
    B, P = prompt.shape
    torch._dynamo.reset()
    cache = lm.new_cache(B, P + N)
    with torch.no_grad():
        prefill(lm, cache, prompt)
    graphs0, skips0 = compile_counts()
    step = torch.compile(make_step(lm, cache), mode="reduce-overhead", fullgraph=True)
    _, logits = decode_loop(step, first, torch.tensor(P, device=device), N, mark_steps=True, keep_logits=True)
    _, logits2 = decode_loop(step, first, torch.tensor(P, device=device), N, mark_steps=True, keep_logits=True)
    graphs, skips = compile_counts()
    log(f"    compiled decode step (reduce-overhead, fullgraph): {graphs - graphs0} compile(s) for {2 * N} steps "
        f"at {N} positions, {skips - skips0} CUDA-graph skip(s)")
    _close("compiled decode step against the eager one", torch.stack(logits, 1), torch.stack(eager_logits, 1), tol,
           log)
    _close("compiled decode step, second loop", torch.stack(logits2, 1), torch.stack(eager_logits, 1), tol, log)
    assert graphs - graphs0 == 1, f"the decode step compiled {graphs - graphs0} times, not once"
    if device.type == "cuda":
        assert skips == skips0, "CUDA graphs were skipped for the decode step (see the warning above)"
    torch._dynamo.reset()
    graphs0, _ = compile_counts()
    pre = torch.compile(make_prefill(lm, lm.new_cache(B, P + N)), fullgraph=True)
    with torch.no_grad():
        _, lg = pre(prompt)
        _, lg = pre(prompt)
    graphs, _ = compile_counts()
    _close("compiled prefill against the full forward", lg, eager_prefill_logits, tol, log)
    assert graphs - graphs0 == 1, f"the prefill compiled {graphs - graphs0} times, not once"
    torch._dynamo.reset()


def check_llama_against_hf(cfg: LlamaConfig, log):
    """The tiny Llama's full forward against transformers' LlamaForCausalLM on the same weights (f32,
    CPU), when transformers is installed; returns False if it is not."""
    try:
        import transformers
    except ImportError:
        log("  llama vs transformers: skipped (transformers is not installed)")
        return False
    torch.manual_seed(0)
    ours = Llama(cfg)
    perturb_(ours, 3)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=cfg.tie_word_embeddings, attention_bias=False, mlp_bias=False, head_dim=cfg.head_dim)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(ours.state_dict(), strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    assert not missing and not unexpected, f"names differ from HF's: missing {missing}, unexpected {unexpected}"
    idx = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = hf(idx).logits.float()
        got = ours.logits(idx)
    _close(f"llama vs transformers {transformers.__version__} LlamaForCausalLM (f32, same weights)", got, want, 1e-5,
           log)
    return True


def param_count(model: nn.Module) -> int:
    """Parameters, a tied head counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())

