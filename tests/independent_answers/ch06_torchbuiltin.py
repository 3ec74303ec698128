"""Torch-builtin style: other allowed library calls (linalg norm, outer, addcmul, F.scaled_dot_product_attention, searchsorted, normalize)."""
import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x / sqrt(mean(x**2) + eps) * weight over the last axis; weight (d_model,), no bias."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.register_parameter("weight", nn.Parameter(torch.ones(d_model)))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_model) -> (..., d_model)."""
        mean_square = torch.linalg.vector_norm(x, ord=2, dim=-1, keepdim=True).square().div(x.size(-1))
        return torch.mul(torch.div(x, torch.sqrt(mean_square.add(self.eps))), self.weight)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, h, T, d_k): pair (i, i + d_k/2) turned by positions * base**(-2i/d_k)."""
    dim = x.size(-1)
    inv_freq = torch.full((dim // 2,), base, dtype=torch.float64, device=x.device).pow(
        torch.linspace(0, -(dim - 2) / dim, dim // 2, dtype=torch.float64, device=x.device))
    angle = torch.outer(positions.to(torch.float64), inv_freq)  # (T, d_k/2)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    left, right = torch.tensor_split(x, 2, dim=-1)
    return torch.cat((torch.addcmul(left * cos, right, sin, value=-1), torch.addcmul(right * cos, left, sin)), dim=-1)


class DecoderBlock(nn.Module):
    """Pre-RMSNorm causal self-attention with RoPE and a KV cache, then a Pre-RMSNorm gated FFN."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, eps: float = 1e-6, n_kv_heads: int | None = None):
        super().__init__()
        self.num_heads = n_heads
        self.num_kv_heads = n_kv_heads if n_kv_heads else n_heads
        self.add_module("attn_norm", RMSNorm(d_model, eps))
        self.add_module("ffn_norm", RMSNorm(d_model, eps))
        widths = {"q": d_model, "k": d_model // n_heads * self.num_kv_heads, "v": d_model // n_heads * self.num_kv_heads,
                  "o": d_model}
        for key, width in widths.items():
            self.add_module(f"w_{key}", nn.Linear(d_model, width, bias=False))
        self.add_module("w_gate", nn.Linear(d_model, d_ff, bias=False))
        self.add_module("w_up", nn.Linear(d_model, d_ff, bias=False))
        self.add_module("w_down", nn.Linear(d_ff, d_model, bias=False))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None):
        """x: (B, T, d_model) at positions (T,); cache: None or (k, v), each (B, h_kv, T_past, d_k).
        Returns (B, T, d_model) and the new cache (k, v), each (B, h_kv, T_past + T, d_k)."""
        batch, steps, width = x.size()
        normed = self.attn_norm(x)
        q, k, v = (proj(normed).view(batch, steps, heads, width // self.num_heads).permute(0, 2, 1, 3)
                   for proj, heads in ((self.w_q, self.num_heads), (self.w_k, self.num_kv_heads),
                                       (self.w_v, self.num_kv_heads)))
        q = apply_rotary(q, positions)
        k = apply_rotary(k, positions)
        if cache is not None:
            past_k, past_v = cache
            k, v = torch.cat((past_k, k), dim=-2), torch.cat((past_v, v), dim=-2)
        offset = k.size(-2) - steps
        # key j is visible to new query t when j - t <= offset (True = may attend, as in F.sdpa)
        distance = torch.arange(k.size(-2), device=x.device)[None, :] - torch.arange(steps, device=x.device)[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=distance.le(offset), enable_gqa=True)
        x = torch.add(x, self.w_o(out.permute(0, 2, 1, 3).reshape(batch, steps, width)))
        normed = self.ffn_norm(x)
        return torch.add(x, self.w_down(torch.mul(F.silu(self.w_gate(normed)), self.w_up(normed)))), (k, v)


class GPT(nn.Module):
    """Token embedding, n_layers DecoderBlocks, a final RMSNorm and the output head."""

    def __init__(self, vocab: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, eps: float = 1e-6,
                 n_kv_heads: int | None = None):
        super().__init__()
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.norm = RMSNorm(d_model, eps)
        self.blocks = nn.ModuleList(list(map(lambda _: DecoderBlock(d_model, n_heads, d_ff, eps, n_kv_heads),
                                                 range(n_layers))))
        self.embed = nn.Embedding(vocab, d_model)

    def forward(self, idx: torch.Tensor, cache: list | None = None):
        """idx: (B, T), after the cached tokens. Returns logits (B, T, vocab) and the new cache."""
        seen = cache[0][0].size(-2) if cache is not None else 0
        positions = torch.arange(idx.size(-1), device=idx.device).add(seen)
        states = F.embedding(idx, self.embed.weight)
        fresh = [None] * len(self.blocks)
        for i, block in enumerate(self.blocks):
            states, fresh[i] = block(states, positions, cache[i] if cache is not None else None)
        return F.linear(self.norm(states), self.head.weight), fresh


def lm_loss(model, idx):
    """Mean cross-entropy of predicting idx[:, 1:] from idx[:, :-1]."""
    context, following = idx.narrow(1, 0, idx.size(1) - 1), idx.narrow(1, 1, idx.size(1) - 1)
    logits = model(context)[0]  # (B, T - 1, V)
    picked = torch.gather(logits, -1, following.unsqueeze(-1)).squeeze(-1)
    return torch.mean(torch.logsumexp(logits, dim=-1) - picked)


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True, generator=None):
    """idx (B, T) -> (B, T + max_new_tokens): greedy when temperature == 0, else sampled with multinomial."""
    result, feed, past = idx, idx, None
    for _ in range(max_new_tokens):
        logits, present = model(feed, past)
        scores = logits.select(1, -1)  # (B, V)
        if temperature == 0:
            chosen = torch.argmax(scores, dim=-1).unsqueeze(1)
        else:
            scores = torch.div(scores, temperature)
            if top_k is not None:
                best, where = torch.topk(scores, min(top_k, scores.size(-1)), dim=-1)
                scores = torch.full_like(scores, float("-inf")).scatter(-1, where, best)
            probs = torch.softmax(scores, dim=-1)
            if top_p is not None:
                ranked, order = torch.sort(probs, dim=-1, descending=True)
                running = torch.cumsum(ranked, dim=-1).contiguous()
                # tokens whose likelier ones sum below top_p: those with running total < top_p, plus one
                limit = torch.full((probs.size(0), 1), top_p, dtype=probs.dtype, device=probs.device)
                count = torch.searchsorted(running, limit) + 1  # (B, 1)
                in_nucleus = torch.arange(probs.size(-1), device=probs.device).unsqueeze(0) < count
                keep = torch.zeros_like(in_nucleus).scatter(-1, order, in_nucleus)
                probs = F.normalize(torch.where(keep, probs, torch.zeros_like(probs)), p=1.0, dim=-1)
            chosen = torch.multinomial(probs, 1, generator=generator)
        result = torch.cat((result, chosen), dim=1)
        if use_cache:
            feed, past = chosen, present
        else:
            feed = result
    return result


@torch.no_grad()
def load_hf_llama(model, state_dict):
    """Copy a Hugging Face LlamaForCausalLM state dict into the GPT `model`, in place; returns model."""
    pairs = [("embed.weight", "model.embed_tokens.weight"), ("norm.weight", "model.norm.weight"),
             ("head.weight", "lm_head.weight" if "lm_head.weight" in state_dict else "model.embed_tokens.weight")]
    sub = dict(attn_norm="input_layernorm", ffn_norm="post_attention_layernorm", w_q="self_attn.q_proj",
               w_k="self_attn.k_proj", w_v="self_attn.v_proj", w_o="self_attn.o_proj", w_gate="mlp.gate_proj",
               w_up="mlp.up_proj", w_down="mlp.down_proj")
    pairs += [(f"blocks.{i}.{a}.weight", f"model.layers.{i}.{b}.weight") for i in range(len(model.blocks))
              for a, b in sub.items()]
    for ours, theirs in pairs:
        torch.Tensor.copy_(model.get_parameter(ours), state_dict[theirs])
    return model


def interleaved_to_half_split(w, d_k):
    """(heads * d_k, d_model) -> the same rows, each head's (2i, 2i + 1) moved to (i, i + d_k/2)."""
    within = torch.arange(d_k, device=w.device).reshape(d_k // 2, 2).T.flatten()  # 0, 2, 4, ..., 1, 3, 5, ...
    rows = torch.add(torch.arange(0, w.shape[0], d_k, device=w.device).unsqueeze(1), within).flatten()
    return torch.index_select(w, 0, rows)


@torch.no_grad()
def load_meta_llama(model, checkpoint):
    """Copy a checkpoint in Meta's layout into the GPT `model`, in place; returns model."""
    sub = dict(attn_norm="attention_norm", ffn_norm="ffn_norm", w_q="attention.wq", w_k="attention.wk",
               w_v="attention.wv", w_o="attention.wo", w_gate="feed_forward.w1", w_up="feed_forward.w3",
               w_down="feed_forward.w2")
    state = {"embed.weight": checkpoint["tok_embeddings.weight"], "norm.weight": checkpoint["norm.weight"],
             "head.weight": checkpoint.get("output.weight", checkpoint["tok_embeddings.weight"])}
    for i, block in enumerate(model.blocks):
        for a, b in sub.items():
            w = checkpoint[f"layers.{i}.{b}.weight"]
            state[f"blocks.{i}.{a}.weight"] = interleaved_to_half_split(w, block.d_k) if a in ("w_q", "w_k") else w
    torch.nn.Module.load_state_dict(model, state, strict=True)
    return model
