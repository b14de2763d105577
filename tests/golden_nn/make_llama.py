#!/usr/bin/env python3
"""A tiny Llama from Hugging Face `transformers`, as the golden data of coil's Llama model.

Writes, next to this script:
  llama_tiny/model.safetensors, llama_tiny/config.json   what LlamaForCausalLM.save_pretrained writes
  llama_tiny_golden.safetensors                          idx [2, 7] int64, logits [2, 7, 37] f32,
                                                          loss [] f32 (mean cross-entropy of idx[:, 1:]
                                                          given idx[:, :-1], computed from the logits)
Sizes: vocab 37, hidden 16, intermediate 24, 2 layers, 4 heads, 2 key/value heads (grouped-query
attention), RMSNorm eps 1e-6, rope_theta 10000, 16 positions, untied output head. Deterministic:
torch.manual_seed(0). Needs torch, transformers and safetensors (python3 make_llama.py).
"""
import os

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=16,
    tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
)
model = LlamaForCausalLM(config).eval()
with torch.no_grad():
    for p in model.parameters():  # away from the init's constants (norm weights of 1)
        p.add_(0.1 * torch.randn_like(p))
model.save_pretrained(os.path.join(here, "llama_tiny"), safe_serialization=True)
idx = torch.randint(0, 37, (2, 7), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    logits = model(idx).logits.float()
loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 37), idx[:, 1:].reshape(-1))
save_file({"idx": idx.contiguous(), "logits": logits.contiguous(), "loss": loss.reshape(())},
          os.path.join(here, "llama_tiny_golden.safetensors"), metadata={"made_by": "make_llama.py"})
print("logits", tuple(logits.shape), "loss", float(loss))
