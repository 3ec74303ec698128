"""Einsum style: contractions written with torch.einsum, RoPE as a complex rotation, one-hot loss, matrix top-p."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x / sqrt(mean(x**2) + eps) * weight over the last axis; weight (d_model,), no bias."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_model) -> (..., d_model)."""
        mean_sq = torch.einsum("...d,...d->...", x, x) / x.shape[-1]
        return torch.einsum("...d,...,d->...d", x, (mean_sq + self.eps) ** -0.5, self.weight)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, h, T, d_k): pair (i, i + d_k/2) turned by positions * base**(-2i/d_k)."""
    n = x.shape[-1] // 2
    freqs = torch.pow(base, torch.arange(n, device=x.device, dtype=torch.float64) * (-2.0 / x.shape[-1]))
    phase = torch.einsum("t,f->tf", positions.to(torch.float64), freqs)  # (T, d_k/2)
    # (x1 + i x2) * e^{i phase} = (x1 cos - x2 sin) + i (x2 cos + x1 sin): the half-split rotation
    z = torch.complex(x[..., :n], x[..., n:])
    turn = torch.complex(torch.cos(phase).to(x.dtype), torch.sin(phase).to(x.dtype))
    w = z * turn
    return torch.cat((w.real, w.imag), dim=-1)


class DecoderBlock(nn.Module):
    """Pre-RMSNorm causal self-attention with RoPE and a KV cache, then a Pre-RMSNorm gated FFN."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, eps: float = 1e-6, n_kv_heads: int | None = None):
        super().__init__()
        self.heads = n_heads
        self.kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.attn_norm = RMSNorm(d_model, eps)
        self.ffn_norm = RMSNorm(d_model, eps)
        for nm in ("w_q", "w_o"):
            setattr(self, nm, nn.Linear(d_model, d_model, bias=False))
        for nm in ("w_k", "w_v"):
            setattr(self, nm, nn.Linear(d_model, self.kv_heads * (d_model // n_heads), bias=False))
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None):
        """x: (B, T, d_model) at positions (T,); cache: None or (k, v), each (B, h_kv, T_past, d_k).
        Returns (B, T, d_model) and the new cache (k, v), each (B, h_kv, T_past + T, d_k)."""
        n_new = x.shape[1]
        a = self.attn_norm(x)

        def heads_of(layer, count):  # (B, T, count d_k) = a @ W^T, then (B, count, T, d_k)
            y = torch.einsum("btc,oc->bto", a, layer.weight)
            return y.unflatten(-1, (count, -1)).permute(0, 2, 1, 3)

        q = apply_rotary(heads_of(self.w_q, self.heads), positions)
        k = apply_rotary(heads_of(self.w_k, self.kv_heads), positions)
        v = heads_of(self.w_v, self.kv_heads)
        if cache is not None:
            k = torch.cat((cache[0], k), dim=2)
            v = torch.cat((cache[1], v), dim=2)
        n_all = k.shape[2]
        key_at = torch.arange(n_all, device=x.device)
        query_at = torch.arange(n_new, device=x.device) + (n_all - n_new)
        visible = key_at.unsqueeze(0) <= query_at.unsqueeze(1)  # (T, T_past + T)
        grouped = q.unflatten(1, (self.kv_heads, -1))  # (B, h_kv, group, T, d_k): a group per key/value head
        logits = torch.einsum("bngqd,bnkd->bngqk", grouped, k) * q.shape[-1] ** -0.5
        attn = logits.masked_fill(visible.logical_not(), -math.inf).softmax(-1)
        mixed = torch.einsum("bngqk,bnkd->bqngd", attn, v).flatten(2)  # (B, T, d_model)
        x = x + torch.einsum("btc,oc->bto", mixed, self.w_o.weight)
        f = self.ffn_norm(x)
        gated = F.silu(torch.einsum("btc,fc->btf", f, self.w_gate.weight)) * torch.einsum("btc,fc->btf", f, self.w_up.weight)
        x = x + torch.einsum("btf,of->bto", gated, self.w_down.weight)
        return x, (k, v)


class GPT(nn.Module):
    """Token embedding, n_layers DecoderBlocks, a final RMSNorm and the output head."""

    def __init__(self, vocab: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, eps: float = 1e-6,
                 n_kv_heads: int | None = None):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList([DecoderBlock(d_model, n_heads, d_ff, eps, n_kv_heads) for _ in range(n_layers)])
        self.norm = RMSNorm(d_model, eps)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor, cache: list | None = None):
        """idx: (B, T), after the cached tokens. Returns logits (B, T, vocab) and the new cache."""
        olds = [None] * len(self.blocks) if cache is None else list(cache)
        offset = 0 if cache is None else olds[0][0].shape[2]
        where = offset + torch.arange(idx.shape[1], device=idx.device)
        h = self.embed.weight[idx]  # (B, T, d_model): a row of the table per token
        news = []
        for blk, old in zip(self.blocks, olds):
            h, kv = blk(h, where, old)
            news.append(kv)
        return torch.einsum("btd,vd->btv", self.norm(h), self.head.weight), news


def lm_loss(model, idx):
    """Mean cross-entropy of predicting idx[:, 1:] from idx[:, :-1]."""
    out = model(idx[:, :-1])[0]  # (B, T - 1, V)
    log_p = out.log_softmax(dim=-1)
    picks = F.one_hot(idx[:, 1:], num_classes=out.shape[-1]).to(log_p.dtype)
    return -torch.einsum("btv,btv->", log_p, picks) / picks[..., 0].numel()


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True, generator=None):
    """idx (B, T) -> (B, T + max_new_tokens): greedy when temperature == 0, else sampled with multinomial."""
    tokens, memory = idx, None
    while tokens.shape[1] < idx.shape[1] + max_new_tokens:
        if use_cache:
            step_in = tokens if memory is None else tokens[:, -1:]
            scores, memory = model(step_in, memory)
        else:
            scores = model(tokens)[0]
        s = scores[:, -1]  # (B, V)
        if temperature == 0:
            pick = torch.argmax(s, dim=-1, keepdim=True)
        else:
            s = s / temperature
            vocab = s.shape[-1]
            if top_k is not None:
                floor = torch.sort(s, dim=-1, descending=True).values[:, min(top_k, vocab) - 1:min(top_k, vocab)]
                s = torch.where(s >= floor, s, torch.full_like(s, -math.inf))
            p = F.softmax(s, dim=-1)
            if top_p is not None:
                ranked, order = torch.sort(p, dim=-1, descending=True)
                strictly_before = torch.ones(vocab, vocab, dtype=p.dtype, device=p.device).triu(1)
                mass_before = torch.einsum("bj,ji->bi", ranked, strictly_before)  # sum of the likelier ones
                keep = (mass_before < top_p).gather(-1, torch.argsort(order, dim=-1))  # back to vocabulary order
                p = p * keep
                p = p / p.sum(dim=-1, keepdim=True)
            pick = torch.multinomial(p, 1, generator=generator)
        tokens = torch.cat((tokens, pick), dim=1)
    return tokens


@torch.no_grad()
def load_hf_llama(model, state_dict):
    """Copy a Hugging Face LlamaForCausalLM state dict into the GPT `model`, in place; returns model."""
    def source(name):  # our parameter name -> theirs
        if name == "head.weight" and "lm_head.weight" not in state_dict:
            return "model.embed_tokens.weight"  # a tied head is the embedding
        top = {"embed": "model.embed_tokens", "norm": "model.norm", "head": "lm_head"}
        inner = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "w_gate": "mlp.gate_proj",
                 "w_up": "mlp.up_proj", "w_down": "mlp.down_proj", "w_q": "self_attn.q_proj", "w_k": "self_attn.k_proj",
                 "w_v": "self_attn.v_proj", "w_o": "self_attn.o_proj"}
        parts = name.split(".")
        return f"{top[parts[0]]}.weight" if len(parts) == 2 else f"model.layers.{parts[1]}.{inner[parts[2]]}.weight"

    for name, param in model.named_parameters(remove_duplicate=False):
        param.copy_(torch.einsum("...->...", state_dict[source(name)]))
    return model


def interleaved_to_half_split(w, d_k):
    """(heads * d_k, d_model) -> the same rows, each head's (2i, 2i + 1) moved to (i, i + d_k/2)."""
    target = torch.arange(d_k)
    target = torch.where(target % 2 == 0, target // 2, target // 2 + d_k // 2)  # where old row r of a head goes
    perm = torch.zeros(d_k, d_k, dtype=w.dtype, device=w.device)
    perm[target.to(w.device), torch.arange(d_k, device=w.device)] = 1  # perm[new, old]
    return torch.einsum("no,hod->hnd", perm, w.reshape(-1, d_k, w.size(-1))).reshape(w.shape)


@torch.no_grad()
def load_meta_llama(model, checkpoint):
    """Copy a checkpoint in Meta's layout into the GPT `model`, in place; returns model."""
    inner = {"attn_norm": "attention_norm", "ffn_norm": "ffn_norm", "w_gate": "feed_forward.w1",
             "w_up": "feed_forward.w3", "w_down": "feed_forward.w2", "w_q": "attention.wq", "w_k": "attention.wk",
             "w_v": "attention.wv", "w_o": "attention.wo"}
    for name, param in model.named_parameters(remove_duplicate=False):
        parts = name.split(".")
        if parts[0] == "blocks":
            w = checkpoint[f"layers.{parts[1]}.{inner[parts[2]]}.weight"]
            if parts[2] in ("w_q", "w_k"):
                w = interleaved_to_half_split(w, model.blocks[int(parts[1])].d_k)
        else:
            key = {"embed": "tok_embeddings", "norm": "norm", "head": "output"}[parts[0]] + ".weight"
            w = checkpoint.get(key, checkpoint["tok_embeddings.weight"])
        param.copy_(w)
    return model
