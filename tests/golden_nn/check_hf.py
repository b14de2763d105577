#!/usr/bin/env python3
"""Cross-checks the golden data against Hugging Face transformers' own modules (optional: run where
`transformers` is installed; make_golden.py does not need it).

usage: python3 tests/golden_nn/check_hf.py

Checks: GPT2LMHeadModel.from_pretrained on gpt2_tiny_hf.safetensors and on gpt2_tiny_hf_prefixed.safetensors
gives gpt2_tiny's logits and loss; LlamaMLP with swiglu_mlp's weights gives its output; Llama's rotary
embedding (LlamaRotaryEmbedding + apply_rotary_pos_emb) gives rotary's q_rot and k_rot; and every f32
output and gradient in nn.safetensors is within 1e-5 (relative norm) of its float64 reference.
Exits 1 on a mismatch.
"""
import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))


def relerr(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / (b.norm() + 1e-30)).item()


def main():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRotaryEmbedding, apply_rotary_pos_emb

    g = load_file(os.path.join(HERE, "nn.safetensors"))
    with safe_open(os.path.join(HERE, "nn.safetensors"), "pt") as f:
        cases = json.loads(f.metadata()["cases"])
    failures = []

    def check(what, err, tol):
        ok = err <= tol
        print(f"{'ok  ' if ok else 'FAIL'} {what}: relerr {err:.2e} (tol {tol:.0e})")
        if not ok:
            failures.append(what)

    tiny = cases["gpt2_tiny"]["config"]
    cfg = GPT2Config(vocab_size=tiny["vocab"], n_positions=tiny["block"], n_embd=tiny["n_embd"],
                     n_layer=tiny["n_layer"], n_head=tiny["n_head"], resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     bos_token_id=0, eos_token_id=0)
    for fname in ("gpt2_tiny_hf.safetensors", "gpt2_tiny_hf_prefixed.safetensors"):
        d = tempfile.mkdtemp()
        try:
            shutil.copy(os.path.join(HERE, fname), os.path.join(d, "model.safetensors"))
            cfg.save_pretrained(d)
            m = GPT2LMHeadModel.from_pretrained(d, attn_implementation="eager").eval()
            out = m(input_ids=g["gpt2_tiny.in.idx"], labels=None)
            logits = out.logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     g["gpt2_tiny.in.targets"].reshape(-1))
            check(f"{fname}: GPT2LMHeadModel logits", relerr(logits, g["gpt2_tiny.out.logits"]), 1e-5)
            check(f"{fname}: GPT2LMHeadModel loss", relerr(loss, g["gpt2_tiny.out.loss"]), 1e-6)
        finally:
            shutil.rmtree(d)

    lcfg = LlamaConfig(hidden_size=8, intermediate_size=24, hidden_act="silu", mlp_bias=False,
                       num_attention_heads=1, head_dim=8, rope_theta=10000.0, max_position_embeddings=16)
    mlp = LlamaMLP(lcfg)
    mlp.load_state_dict({k[len("swiglu_mlp.param."):]: v for k, v in g.items() if k.startswith("swiglu_mlp.param.")})
    check("LlamaMLP vs swiglu_mlp", relerr(mlp(g["swiglu_mlp.in.x"]), g["swiglu_mlp.out.y"]), 1e-6)

    q, k = g["rotary.in.q"], g["rotary.in.k"]
    rope = LlamaRotaryEmbedding(lcfg)
    pos = torch.arange(q.shape[2]).unsqueeze(0)
    cos, sin = rope(q, pos)
    q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
    check("Llama rotary cos", relerr(cos[0], g["rotary.out.cos"]), 1e-6)
    check("Llama rotary q_rot", relerr(q_rot, g["rotary.out.q_rot"]), 1e-6)
    check("Llama rotary k_rot", relerr(k_rot, g["rotary.out.k_rot"]), 1e-6)

    # every f32 result against its float64 reference (the golden data agrees with itself)
    worst = 0.0
    C = tiny["n_embd"]
    for key, ref in g.items():
        case, role, name = key.split(".", 2)
        if role != "ref64":
            continue
        f32 = g.get(f"{case}.grad.{name[5:]}") if name.startswith("grad.") else g.get(f"{case}.out.{name}")
        if f32 is None:
            failures.append(f"{key}: no f32 counterpart")
            continue
        if case == "gpt2_tiny_train" and name.endswith("attn.c_attn.bias"):
            # The key bias has no gradient in exact arithmetic; AdamW turns f32 rounding noise into
            # updates of up to ~lr per step (README): checked apart, with an absolute bound.
            check(f"{key} key part (absolute, 3 steps x lr 1e-3)", (f32[C:2 * C] - ref[C:2 * C]).abs().max().item(), 3e-3)
            f32, ref = torch.cat([f32[:C], f32[2 * C:]]), torch.cat([ref[:C], ref[2 * C:]])
        worst = max(worst, relerr(f32, ref))
    check("f32 vs ref64, worst over nn.safetensors", worst, 1e-5)
    if failures:
        print(f"{len(failures)} failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
