"""Compact style: few lines, fused QKV projection, rotate-half RoPE, offset tril mask, chained tensor methods."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from autograde_tests.reference import scaled_dot_product_attention


class RMSNorm(nn.Module):
    """x / sqrt(mean(x**2) + eps) * weight over the last axis; weight (d_model,), no bias."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d_model)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_model) -> (..., d_model)."""
        return self.weight * x * (x * x).mean(-1, keepdim=True).add(self.eps).rsqrt()


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, h, T, d_k): pair (i, i + d_k/2) turned by positions * base**(-2i/d_k)."""
    d = x.size(-1)
    a = positions.double()[:, None] * base ** (-torch.arange(0, d, 2, device=x.device).double() / d)
    a, (x1, x2) = torch.cat([a, a], -1), x.chunk(2, -1)
    return x * a.cos().to(x.dtype) + torch.cat([-x2, x1], -1) * a.sin().to(x.dtype)


class DecoderBlock(nn.Module):
    """Pre-RMSNorm causal self-attention with RoPE and a KV cache, then a Pre-RMSNorm gated FFN."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, eps: float = 1e-6, n_kv_heads: int | None = None):
        super().__init__()
        self.h, self.kv, d = n_heads, n_kv_heads or n_heads, d_model // n_heads
        self.attn_norm, self.ffn_norm = (RMSNorm(d_model, eps) for _ in "ab")
        self.w_q, self.w_o = (nn.Linear(d_model, d_model, bias=False) for _ in "qo")
        self.w_k, self.w_v = (nn.Linear(d_model, self.kv * d, bias=False) for _ in "kv")
        self.w_gate, self.w_up = (nn.Linear(d_model, d_ff, bias=False) for _ in "gu")
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None):
        """x: (B, T, d_model) at positions (T,); cache: None or (k, v), each (B, h_kv, T_past, d_k).
        Returns (B, T, d_model) and the new cache (k, v), each (B, h_kv, T_past + T, d_k)."""
        w = torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight])  # ((h + 2 h_kv) d_k, d_model)
        d = x.size(-1) // self.h
        qkv = F.linear(self.attn_norm(x), w).split([self.h * d, self.kv * d, self.kv * d], -1)
        q, k, v = (t.unflatten(-1, (-1, d)).transpose(1, 2) for t in qkv)
        q, k = apply_rotary(q, positions), apply_rotary(k, positions)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        T, S = x.size(1), k.size(2)
        mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
        g = self.h // self.kv
        att = scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), mask)[0]
        x = x + self.w_o(att.transpose(1, 2).flatten(2))
        g = self.ffn_norm(x)
        return x + self.w_down(F.silu(self.w_gate(g)) * self.w_up(g)), (k, v)


class GPT(nn.Module):
    """Token embedding, n_layers DecoderBlocks, a final RMSNorm and the output head."""

    def __init__(self, vocab: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, eps: float = 1e-6,
                 n_kv_heads: int | None = None):
        super().__init__()
        self.embed, self.norm = nn.Embedding(vocab, d_model), RMSNorm(d_model, eps)
        self.blocks = nn.ModuleList(DecoderBlock(d_model, n_heads, d_ff, eps, n_kv_heads) for _ in range(n_layers))
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor, cache: list | None = None):
        """idx: (B, T), after the cached tokens. Returns logits (B, T, vocab) and the new cache."""
        p = cache[0][0].size(2) if cache else 0
        pos, x, new = torch.arange(p, p + idx.size(1), device=idx.device), self.embed(idx), []
        for b, c in zip(self.blocks, cache or [None] * len(self.blocks)):
            x, c = b(x, pos, c)
            new.append(c)
        return self.head(self.norm(x)), new


def lm_loss(model, idx):
    """Mean cross-entropy of predicting idx[:, 1:] from idx[:, :-1]."""
    return F.cross_entropy(model(idx[:, :-1])[0].transpose(1, 2), idx[:, 1:])  # (B, V, T-1) vs (B, T-1)


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True, generator=None):
    """idx (B, T) -> (B, T + max_new_tokens): greedy when temperature == 0, else sampled with multinomial."""
    seq, kv = idx, None
    for _ in range(max_new_tokens):
        logits, kv = model(seq[:, -1:] if kv is not None else seq, kv)
        kv, z = kv if use_cache else None, logits[:, -1]
        if temperature == 0:
            seq = torch.cat([seq, z.argmax(-1, keepdim=True)], 1)
            continue
        z = z / temperature
        if top_k is not None:  # the k-th largest is the (V - k + 1)-th smallest
            z = z.masked_fill(z < z.kthvalue(max(z.size(-1) - top_k + 1, 1), -1, keepdim=True).values, -math.inf)
        p = z.softmax(-1)
        if top_p is not None:  # mass of the likelier tokens, without sorting: (B, V, V) pairwise comparison
            p = p * ((p[:, None, :] * (p[:, None, :] > p[:, :, None])).sum(-1) < top_p)
            p = p / p.sum(-1, keepdim=True)
        seq = torch.cat([seq, torch.multinomial(p, 1, generator=generator)], 1)
    return seq


@torch.no_grad()
def load_hf_llama(model, state_dict):
    """Copy a Hugging Face LlamaForCausalLM state dict into the GPT `model`, in place; returns model."""
    ren = [("model.layers.", "blocks."), ("model.embed_tokens", "embed"), ("model.norm", "norm"), ("lm_head", "head"),
           ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"), ("mlp.gate_proj", "w_gate"),
           ("mlp.up_proj", "w_up"), ("mlp.down_proj", "w_down")] + [(f"self_attn.{c}_proj", f"w_{c}") for c in "qkvo"]
    new = {}
    for k, v in state_dict.items():
        for a, b in ren:
            k = k.replace(a, b)
        new[k] = v
    new.setdefault("head.weight", new["embed.weight"])  # tie_word_embeddings
    model.load_state_dict(new)
    return model


def interleaved_to_half_split(w, d_k):
    """(heads * d_k, d_model) -> the same rows, each head's (2i, 2i + 1) moved to (i, i + d_k/2)."""
    return w.unflatten(0, (-1, d_k // 2, 2)).transpose(1, 2).flatten(0, 2)  # (h, pair, 2) -> (h, 2, pair)


@torch.no_grad()
def load_meta_llama(model, checkpoint):
    """Copy a checkpoint in Meta's layout into the GPT `model`, in place; returns model."""
    ren = [("layers.", "blocks."), ("tok_embeddings", "embed"), ("output", "head"), ("attention_norm", "attn_norm"),
           ("feed_forward.w1", "w_gate"), ("feed_forward.w3", "w_up"), ("feed_forward.w2", "w_down")] + \
        [(f"attention.w{c}", f"w_{c}") for c in "qkvo"]
    new = {}
    for k, v in checkpoint.items():
        for a, b in ren:
            k = k.replace(a, b)
        if k.endswith(("w_q.weight", "w_k.weight")):
            v = interleaved_to_half_split(v, model.blocks[int(k.split(".")[1])].d_k)
        new[k] = v
    new.setdefault("head.weight", new["embed.weight"])
    model.load_state_dict(new)
    return model
