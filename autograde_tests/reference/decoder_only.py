"""Chapter 06_decoder_only: a decoder-only language model built the way LLaMA-style models are.

    block       x = x + Attn(RMSNorm(x))      causal self-attention, RoPE on q and k, a KV cache
                x = x + FFN(RMSNorm(x))       gated (SwiGLU): w_down(silu(w_gate(x)) * w_up(x))
    model       logits = head(RMSNorm(blocks(embed(idx))))

One causal stack and one task: predict the next token. No positional encoding is added to the
embeddings; positions enter only by rotating the queries and keys (RoPE, Su et al., 2021). Every
linear layer is bias-free, as in LLaMA (Touvron et al., 2023).

Shapes, batch first: token ids ``idx`` (B, T), states (B, T, d_model), per-head tensors (B, h, T, d_k).
Masks are boolean, ``True`` = may attend. A block's cache is a tuple ``(k, v)``, each (B, h_kv, T_past, d_k),
the keys already rotated; a model's cache is a list with one such tuple per block.

Grouped-query attention (Ainslie et al., 2023): h query heads share h_kv = ``n_kv_heads`` key and value heads
(h_kv divides h), each KV head serving h / h_kv consecutive query heads. h_kv = h is multi-head attention,
h_kv = 1 multi-query attention (Shazeer, 2019). Only the h_kv heads are cached, so the cache shrinks by h / h_kv.

RoPE convention: the half-split pairing of GPT-NeoX and Hugging Face's ``rotate_half``: feature i is paired
with feature i + d_k/2 (not with its neighbour 2i + 1, as in the RoPE paper and Meta's LLaMA code).
The two conventions are the same model up to a fixed permutation of q's and k's features, but weights
trained with one do not work with the other.
"""

import torch
from torch import nn
from torch.nn import functional as F

from .attention import scaled_dot_product_attention


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) · weight, over the last axis (Zhang & Sennrich, 2019).

    LayerNorm without the mean: no centring and no bias, only a learned scale ``weight`` (d_model,).
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_model) -> (..., d_model)."""
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return x / rms * self.weight


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate each pair of features (i, i + d_k/2) of x by the angle positions · θ_i, θ_i = base^(-2i/d_k).

    Args:
        x: (B, h, T, d_k) queries or keys, d_k even.
        positions: (T,) integer positions of the T tokens (not necessarily starting at 0: with a cache,
            the new tokens come after the cached ones).

    Returns:
        (B, h, T, d_k), x's dtype. A query at position m and a key at position n rotated this way have a dot
        product that depends on m - n only: rotations compose, R(m)ᵀ R(n) = R(n - m).
    """
    half = x.size(-1) // 2
    # The angles in float64, so that float32 results are correctly rounded for long sequences too.
    theta = base ** (-torch.arange(half, dtype=torch.float64, device=x.device) * 2 / x.size(-1))  # (d_k/2,)
    angle = positions.to(torch.float64)[:, None] * theta  # (T, d_k/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]  # (B, h, T, d_k/2) each: the two halves of every pair
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)  # (B, h, T, d_k)


class DecoderBlock(nn.Module):
    """Pre-RMSNorm causal self-attention with RoPE, grouped-query heads and a KV cache, then a Pre-RMSNorm
    gated FFN.

    Submodules: ``attn_norm`` and ``ffn_norm`` (RMSNorm), ``w_q`` and ``w_o`` (nn.Linear(d_model, d_model,
    bias=False)), ``w_k`` and ``w_v`` (nn.Linear(d_model, n_kv_heads · d_k, bias=False)), ``w_gate`` and
    ``w_up`` (nn.Linear(d_model, d_ff, bias=False)), ``w_down`` (nn.Linear(d_ff, d_model, bias=False)).
    ``n_kv_heads`` (default ``n_heads``) must divide ``n_heads``.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, eps: float = 1e-6, n_kv_heads: int | None = None):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.attn_norm, self.ffn_norm = RMSNorm(d_model, eps), RMSNorm(d_model, eps)
        self.w_q, self.w_o = nn.Linear(d_model, d_model, bias=False), nn.Linear(d_model, d_model, bias=False)
        self.w_k, self.w_v = (nn.Linear(d_model, self.n_kv_heads * self.d_k, bias=False) for _ in range(2))
        self.w_gate, self.w_up = nn.Linear(d_model, d_ff, bias=False), nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None):
        """x: (B, T, d_model), the states of T new tokens at ``positions`` (T,); cache: None or (k, v), each
        (B, h_kv, T_past, d_k), of the tokens before them. Returns (B, T, d_model) and the new cache (k, v),
        each (B, h_kv, T_past + T, d_k)."""
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.w_q(h).view(B, T, self.n_heads, self.d_k).transpose(1, 2)  # (B, h, T, d_k)
        k = self.w_k(h).view(B, T, self.n_kv_heads, self.d_k).transpose(1, 2)  # (B, h_kv, T, d_k)
        v = self.w_v(h).view(B, T, self.n_kv_heads, self.d_k).transpose(1, 2)  # (B, h_kv, T, d_k)
        q, k = apply_rotary(q, positions), apply_rotary(k, positions)  # v is not rotated
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)  # (B, h_kv, T_past + T, d_k): the cache grows along time
            v = torch.cat([cache[1], v], dim=2)
        # The new tokens are the last T of the T_past + T: each sees itself and every token before it.
        past = k.size(2) - T
        mask = torch.arange(k.size(2), device=x.device) <= torch.arange(past, past + T, device=x.device)[:, None]
        # Query head j reads KV head j // group: each KV head is repeated for its group of consecutive query heads,
        # for the product only (the cache keeps h_kv heads): shared_k and shared_v are (B, h, T_past + T, d_k).
        group = self.n_heads // self.n_kv_heads
        shared_k, shared_v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        attended, _ = scaled_dot_product_attention(q, shared_k, shared_v, mask)  # (B, h, T, d_k); mask (T, T_past + T)
        x = x + self.w_o(attended.transpose(1, 2).reshape(B, T, -1))  # (B, T, d_model)
        h = self.ffn_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h)), (k, v)


class GPT(nn.Module):
    """Token embedding, ``n_layers`` DecoderBlocks, a final RMSNorm and the output head.

    Submodules: ``embed`` (nn.Embedding(vocab, d_model)), ``blocks`` (nn.ModuleList), ``norm`` (RMSNorm),
    ``head`` (nn.Linear(d_model, vocab, bias=False)).
    """

    def __init__(self, vocab: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, eps: float = 1e-6,
                 n_kv_heads: int | None = None):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(DecoderBlock(d_model, n_heads, d_ff, eps, n_kv_heads) for _ in range(n_layers))
        self.norm = RMSNorm(d_model, eps)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor, cache: list | None = None):
        """idx: (B, T) token ids, the continuation of the cached tokens when ``cache`` is given.

        Returns the logits (B, T, vocab), those at position t scoring the token after idx[:, t], and the
        new cache: a list with one (k, v) per block, each (B, h_kv, T_past + T, d_k).
        """
        past = 0 if cache is None else cache[0][0].size(2)
        positions = torch.arange(past, past + idx.size(1), device=idx.device)  # (T,): after the cached tokens
        x = self.embed(idx)  # (B, T, d_model)
        new_cache = []
        for i, block in enumerate(self.blocks):
            x, layer_cache = block(x, positions, None if cache is None else cache[i])
            new_cache.append(layer_cache)
        return self.head(self.norm(x)), new_cache


def lm_loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of predicting every token of idx (B, T) from the tokens before it.

    The model reads idx[:, :-1] and is scored on idx[:, 1:]: a scalar, in nats per token.
    """
    logits, _ = model(idx[:, :-1])  # (B, T - 1, vocab)
    return F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())


@torch.no_grad()
def generate(model: nn.Module, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, use_cache: bool = True,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Continue idx (B, T) by max_new_tokens sampled tokens: returns (B, T + max_new_tokens) token ids.

    Each step turns the last position's logits (B, vocab) into probabilities, in this order: divide by
    the temperature; keep the top_k largest logits (the others become -inf); softmax over the vocabulary;
    keep the most likely tokens while the tokens more likely than each add up to less than top_p, and
    renormalise. The token is drawn as ``torch.multinomial(probs, 1, generator=generator)``.
    ``temperature=0`` takes the argmax instead (greedy). With ``use_cache`` the prompt is run once and then
    only the newest token, with the cache; without it, the whole sequence is run again for every token.
    """
    out, cache = idx, None
    for _ in range(max_new_tokens):
        if use_cache:
            logits, cache = model(out if cache is None else out[:, -1:], cache)  # only what it has not seen
        else:
            logits, _ = model(out)
        logits = logits[:, -1]  # (B, vocab): only the last position predicts something new
        if temperature == 0:
            out = torch.cat([out, logits.argmax(dim=-1, keepdim=True)], dim=1)
            continue
        logits = logits / temperature  # before the softmax: it sharpens or flattens the distribution
        if top_k is not None:
            kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1): the k-th largest
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = logits.softmax(dim=-1)  # over the vocabulary, never the batch; sums to 1 after top-k too
        if top_p is not None:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            likelier = sorted_probs.cumsum(dim=-1) - sorted_probs  # (B, vocab): mass of the likelier tokens
            keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, likelier < top_p)
            probs = probs.masked_fill(~keep, 0.0)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        out = torch.cat([out, torch.multinomial(probs, 1, generator=generator)], dim=1)  # (B, t + 1)
    return out


# ------------------------------------------------------------------------------- loading a real checkpoint
# Both loaders copy into the parameters the model already has (``copy_``, under no_grad): the model keeps its
# dtype and device whatever the checkpoint's (published ones are stored in bfloat16), and shares no memory
# with the checkpoint. nn.Linear stores its weight as (out_features, in_features), and so do both layouts:
# nothing is transposed (GPT-2's checkpoints, whose Conv1D stores (in, out), are the ones that need it).
# Head counts come from the model: ``d_k`` of each block, and the rows of a weight (heads · d_k), so that a
# block whose w_k and w_v have fewer heads than w_q (grouped-query attention) loads the same way.


@torch.no_grad()
def load_hf_llama(model: nn.Module, state_dict: dict) -> nn.Module:
    """Copy a Hugging Face ``LlamaForCausalLM`` state dict into ``model``, a GPT, in place; returns ``model``.

    The keys: ``model.embed_tokens.weight``; per layer i, ``model.layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
    ``model.layers.{i}.mlp.{gate,up,down}_proj.weight``, ``model.layers.{i}.input_layernorm.weight`` (the
    attention's norm) and ``model.layers.{i}.post_attention_layernorm.weight`` (the FFN's: it comes after the
    attention sublayer, and is a Pre-Norm all the same); ``model.norm.weight``; ``lm_head.weight``, absent when
    the model ties its head to the embedding (``tie_word_embeddings``): then the head is the embedding. Hugging
    Face's Llama rotates the half-split pairs, as the course does, so every weight copies across as it is.
    """
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "w_q": "self_attn.q_proj", "w_k": "self_attn.k_proj", "w_v": "self_attn.v_proj",
             "w_o": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}
    embedding = state_dict["model.embed_tokens.weight"]  # (vocab, d_model)
    model.embed.weight.copy_(embedding)
    for i, block in enumerate(model.blocks):
        for ours, theirs in names.items():
            getattr(block, ours).weight.copy_(state_dict[f"model.layers.{i}.{theirs}.weight"])
    model.norm.weight.copy_(state_dict["model.norm.weight"])
    model.head.weight.copy_(state_dict.get("lm_head.weight", embedding))  # tied: no lm_head, the embedding
    return model


def interleaved_to_half_split(w: torch.Tensor, d_k: int) -> torch.Tensor:
    """The rows of a query or key projection w (heads · d_k, d_model), reordered from Meta's RoPE pairs to the
    course's.

    Meta's LLaMA rotates neighbouring features (2i, 2i + 1) of each head; the course, like GPT-NeoX and Hugging
    Face, rotates (i, i + d_k/2). Within each head's d_k rows, row 2i moves to i and row 2i + 1 to i + d_k/2:
    both features of pair i then sit where the course's RoPE pairs them, and turn by the same angle. Queries
    and keys are reordered alike, so their dot products, the scores, are unchanged.
    """
    order = torch.cat([torch.arange(0, d_k, 2), torch.arange(1, d_k, 2)])  # (d_k,): the evens, then the odds
    rows = (torch.arange(w.size(0) // d_k)[:, None] * d_k + order).flatten()  # (heads · d_k,): head by head
    return w[rows.to(w.device)]


@torch.no_grad()
def load_meta_llama(model: nn.Module, checkpoint: dict) -> nn.Module:
    """Copy a checkpoint in Meta's LLaMA layout (``consolidated.00.pth``) into ``model``, a GPT, in place;
    returns ``model``.

    The keys: ``tok_embeddings.weight``; per layer i, ``layers.{i}.attention.w{q,k,v,o}.weight``,
    ``layers.{i}.feed_forward.w1.weight`` (the gate), ``w3`` (up) and ``w2`` (down),
    ``layers.{i}.attention_norm.weight`` and ``layers.{i}.ffn_norm.weight``; ``norm.weight``;
    ``output.weight`` (the head; without it, the head is the embedding). Meta's code rotates neighbouring
    features, so the rows of wq and wk are reordered to the course's half-split pairs, each head on its own
    (``interleaved_to_half_split``); wv and wo hold no rotated features, and copy as they are.
    """
    names = {"attn_norm": "attention_norm", "ffn_norm": "ffn_norm", "w_q": "attention.wq", "w_k": "attention.wk",
             "w_v": "attention.wv", "w_o": "attention.wo", "w_gate": "feed_forward.w1", "w_up": "feed_forward.w3",
             "w_down": "feed_forward.w2"}
    embedding = checkpoint["tok_embeddings.weight"]  # (vocab, d_model)
    model.embed.weight.copy_(embedding)
    for i, block in enumerate(model.blocks):
        for ours, theirs in names.items():
            w = checkpoint[f"layers.{i}.{theirs}.weight"]
            if ours in ("w_q", "w_k"):  # only what RoPE rotates; w_k has n_kv_heads heads of d_k rows
                w = interleaved_to_half_split(w, block.d_k)
            getattr(block, ours).weight.copy_(w)
    model.norm.weight.copy_(checkpoint["norm.weight"])
    model.head.weight.copy_(checkpoint.get("output.weight", embedding))
    return model
