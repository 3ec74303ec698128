"""Loops style: explicit Python loops over features, pairs, heads, blocks, batch rows and decoding steps."""
import math

import torch
from torch import nn


class RMSNorm(nn.Module):
    """x / sqrt(mean(x**2) + eps) * weight over the last axis; weight (d_model,), no bias."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_model) -> (..., d_model)."""
        features = x.shape[-1]
        squares = torch.zeros_like(x[..., 0])
        for j in range(features):  # add up the squares one feature at a time
            squares = squares + x[..., j] * x[..., j]
        inverse_rms = 1.0 / torch.sqrt(squares / features + self.eps)
        return x * inverse_rms.unsqueeze(-1) * self.weight


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, h, T, d_k): pair (i, i + d_k/2) turned by positions * base**(-2i/d_k)."""
    d_k = x.shape[-1]
    half = d_k // 2
    where = positions.to(torch.float64)
    lower, upper = [], []
    for i in range(half):  # one pair of features at a time: feature i and feature i + half
        angle = where * (base ** (-(2.0 * i) / d_k))  # (T,), in float64
        c = torch.cos(angle).to(x.dtype)
        s = torch.sin(angle).to(x.dtype)
        a, b = x[..., i], x[..., i + half]  # (B, h, T) each
        lower.append(a * c - b * s)
        upper.append(b * c + a * s)
    return torch.stack(lower + upper, dim=-1)


class DecoderBlock(nn.Module):
    """Pre-RMSNorm causal self-attention with RoPE and a KV cache, then a Pre-RMSNorm gated FFN."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, eps: float = 1e-6, n_kv_heads: int | None = None):
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_heads
        if n_kv_heads is not None:
            self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads
        self.attn_norm = RMSNorm(d_model, eps)
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.w_v = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.w_o = nn.Linear(d_model, d_model, bias=False)
        self.ffn_norm = RMSNorm(d_model, eps)
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None):
        """x: (B, T, d_model) at positions (T,); cache: None or (k, v), each (B, h_kv, T_past, d_k).
        Returns (B, T, d_model) and the new cache (k, v), each (B, h_kv, T_past + T, d_k)."""
        T = x.shape[1]
        dk = self.head_dim
        normed = self.attn_norm(x)
        queries, keys, values = self.w_q(normed), self.w_k(normed), self.w_v(normed)
        past = 0 if cache is None else cache[0].shape[2]
        total = past + T
        rows = []
        for t in range(T):  # query t (at place past + t) sees keys 0 .. past + t
            rows.append(torch.arange(total, device=x.device) <= past + t)
        allowed = torch.stack(rows)  # (T, total)
        head_keys, head_values = [], []
        for kv in range(self.n_kv_heads):
            cols = slice(kv * dk, (kv + 1) * dk)
            k = apply_rotary(keys[:, :, cols].unsqueeze(1), positions)[:, 0]  # (B, T, dk)
            v = values[:, :, cols]
            if cache is not None:
                k = torch.cat([cache[0][:, kv], k], dim=1)  # (B, total, dk)
                v = torch.cat([cache[1][:, kv], v], dim=1)
            head_keys.append(k)
            head_values.append(v)
        per_group = self.n_heads // self.n_kv_heads
        head_outputs = []
        for hd in range(self.n_heads):
            cols = slice(hd * dk, (hd + 1) * dk)
            q = apply_rotary(queries[:, :, cols].unsqueeze(1), positions)[:, 0]  # (B, T, dk)
            k, v = head_keys[hd // per_group], head_values[hd // per_group]
            scores = q @ k.transpose(1, 2) / math.sqrt(dk)  # (B, T, total)
            weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
            head_outputs.append(weights @ v)
        x = x + self.w_o(torch.cat(head_outputs, dim=-1))
        normed = self.ffn_norm(x)
        gate = self.w_gate(normed)
        x = x + self.w_down(gate * torch.sigmoid(gate) * self.w_up(normed))
        return x, (torch.stack(head_keys, dim=1), torch.stack(head_values, dim=1))


class GPT(nn.Module):
    """Token embedding, n_layers DecoderBlocks, a final RMSNorm and the output head."""

    def __init__(self, vocab: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, eps: float = 1e-6,
                 n_kv_heads: int | None = None):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layers = []
        for _ in range(n_layers):
            layers.append(DecoderBlock(d_model, n_heads, d_ff, eps, n_kv_heads))
        self.blocks = nn.ModuleList(layers)
        self.norm = RMSNorm(d_model, eps)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor, cache: list | None = None):
        """idx: (B, T), after the cached tokens. Returns logits (B, T, vocab) and the new cache."""
        start = 0
        if cache is not None:
            start = cache[0][0].shape[2]
        positions = torch.arange(start, start + idx.shape[1], device=idx.device)
        hidden = self.embed(idx)
        updated = []
        for layer in range(len(self.blocks)):
            previous = None
            if cache is not None:
                previous = cache[layer]
            hidden, kv = self.blocks[layer](hidden, positions, previous)
            updated.append(kv)
        return self.head(self.norm(hidden)), updated


def lm_loss(model, idx):
    """Mean cross-entropy of predicting idx[:, 1:] from idx[:, :-1]."""
    logits, _ = model(idx[:, :-1])  # (B, T - 1, V)
    targets = idx[:, 1:]
    total = logits.new_zeros(())
    count = 0
    for b in range(logits.shape[0]):  # one sequence at a time
        log_probs = logits[b].log_softmax(dim=-1)  # (T - 1, V)
        steps = torch.arange(targets.shape[1], device=idx.device)
        total = total - log_probs[steps, targets[b]].sum()
        count += targets.shape[1]
    return total / count


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True, generator=None):
    """idx (B, T) -> (B, T + max_new_tokens): greedy when temperature == 0, else sampled with multinomial."""
    sequence = idx
    cache = None
    for step in range(max_new_tokens):
        if not use_cache:
            logits, _ = model(sequence)
        elif step == 0:
            logits, cache = model(sequence)
        else:
            logits, cache = model(sequence[:, -1:], cache)
        last = logits[:, -1, :]  # (B, V)
        if temperature == 0:
            sequence = torch.cat([sequence, last.argmax(dim=-1, keepdim=True)], dim=1)
            continue
        last = last / temperature
        rows = []
        for b in range(last.shape[0]):  # filter and normalise each sequence's distribution on its own
            row = last[b]
            if top_k is not None:
                ranked = torch.sort(row, descending=True).values
                kth = ranked[min(top_k, row.shape[0]) - 1]
                row = torch.where(row < kth, torch.full_like(row, float("-inf")), row)
            p = torch.exp(row - row.max())
            p = p / p.sum()
            if top_p is not None:
                keep = torch.zeros_like(p, dtype=torch.bool)
                mass = 0.0
                for j in torch.argsort(p, descending=True).tolist():
                    if keep.any() and mass >= top_p:  # the tokens before this one already reach top_p
                        break
                    keep[j] = True
                    mass += float(p[j])
                p = torch.where(keep, p, torch.zeros_like(p))
                p = p / p.sum()
            rows.append(p)
        probs = torch.stack(rows)  # (B, V), in vocabulary order
        sequence = torch.cat([sequence, torch.multinomial(probs, 1, generator=generator)], dim=1)
    return sequence


@torch.no_grad()
def load_hf_llama(model, state_dict):
    """Copy a Hugging Face LlamaForCausalLM state dict into the GPT `model`, in place; returns model."""
    model.embed.weight.copy_(state_dict["model.embed_tokens.weight"])
    for layer in range(len(model.blocks)):
        block, prefix = model.blocks[layer], "model.layers." + str(layer) + "."
        block.attn_norm.weight.copy_(state_dict[prefix + "input_layernorm.weight"])
        block.ffn_norm.weight.copy_(state_dict[prefix + "post_attention_layernorm.weight"])
        for letter in ["q", "k", "v", "o"]:
            getattr(block, "w_" + letter).weight.copy_(state_dict[prefix + "self_attn." + letter + "_proj.weight"])
        for part in ["gate", "up", "down"]:
            getattr(block, "w_" + part).weight.copy_(state_dict[prefix + "mlp." + part + "_proj.weight"])
    model.norm.weight.copy_(state_dict["model.norm.weight"])
    if "lm_head.weight" in state_dict:
        model.head.weight.copy_(state_dict["lm_head.weight"])
    else:  # tied embeddings: no head of its own
        model.head.weight.copy_(state_dict["model.embed_tokens.weight"])
    return model


def interleaved_to_half_split(w, d_k):
    """(heads * d_k, d_model) -> the same rows, each head's (2i, 2i + 1) moved to (i, i + d_k/2)."""
    out = torch.empty_like(w)
    for head in range(w.shape[0] // d_k):
        start = head * d_k
        for pair in range(d_k // 2):
            out[start + pair] = w[start + 2 * pair]
            out[start + d_k // 2 + pair] = w[start + 2 * pair + 1]
    return out


@torch.no_grad()
def load_meta_llama(model, checkpoint):
    """Copy a checkpoint in Meta's layout into the GPT `model`, in place; returns model."""
    model.embed.weight.copy_(checkpoint["tok_embeddings.weight"])
    for layer in range(len(model.blocks)):
        block, prefix = model.blocks[layer], "layers." + str(layer) + "."
        block.attn_norm.weight.copy_(checkpoint[prefix + "attention_norm.weight"])
        block.ffn_norm.weight.copy_(checkpoint[prefix + "ffn_norm.weight"])
        block.w_q.weight.copy_(interleaved_to_half_split(checkpoint[prefix + "attention.wq.weight"], block.d_k))
        block.w_k.weight.copy_(interleaved_to_half_split(checkpoint[prefix + "attention.wk.weight"], block.d_k))
        block.w_v.weight.copy_(checkpoint[prefix + "attention.wv.weight"])
        block.w_o.weight.copy_(checkpoint[prefix + "attention.wo.weight"])
        block.w_gate.weight.copy_(checkpoint[prefix + "feed_forward.w1.weight"])
        block.w_down.weight.copy_(checkpoint[prefix + "feed_forward.w2.weight"])
        block.w_up.weight.copy_(checkpoint[prefix + "feed_forward.w3.weight"])
    model.norm.weight.copy_(checkpoint["norm.weight"])
    if "output.weight" in checkpoint:
        model.head.weight.copy_(checkpoint["output.weight"])
    else:
        model.head.weight.copy_(checkpoint["tok_embeddings.weight"])
    return model
