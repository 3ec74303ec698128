"""Verbose style: many named intermediate steps, nested helpers and comments explaining each stage."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from autograde_tests.reference import scaled_dot_product_attention


class RMSNorm(nn.Module):
    """x / sqrt(mean(x**2) + eps) * weight over the last axis; weight (d_model,), no bias."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        # The learned per-feature gain starts at one, so that a fresh norm only rescales.
        initial_gain = torch.ones(d_model)
        self.weight = nn.Parameter(initial_gain)
        # eps goes under the square root and keeps a zero vector from dividing by zero.
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_model) -> (..., d_model)."""
        number_of_features = x.shape[-1]
        sum_of_squares = (x * x).sum(dim=-1, keepdim=True)  # (..., 1)
        mean_of_squares = sum_of_squares / number_of_features  # no mean subtracted: this is not LayerNorm
        root_mean_square = torch.sqrt(mean_of_squares + self.eps)
        normalised = x * torch.reciprocal(root_mean_square)
        scaled = normalised * self.weight  # the gain broadcasts over every leading axis
        return scaled


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, h, T, d_k): pair (i, i + d_k/2) turned by positions * base**(-2i/d_k)."""
    head_size = x.shape[-1]
    half_size = head_size // 2

    # One frequency per pair: theta_i = base^(-2i / d_k) = exp(-(2i / d_k) * ln(base)), in float64.
    pair_index = torch.arange(half_size, dtype=torch.float64, device=x.device)
    exponents = 2.0 * pair_index / head_size
    frequencies = torch.exp(-exponents * math.log(base))  # (d_k/2,)

    # Each token's angle for each pair: its position times the pair's frequency.
    token_positions = positions.to(dtype=torch.float64)
    angles = token_positions.unsqueeze(-1) * frequencies.unsqueeze(0)  # (T, d_k/2)
    cosine = torch.cos(angles).to(dtype=x.dtype)
    sine = torch.sin(angles).to(dtype=x.dtype)

    # Half-split pairs: feature i goes with feature i + d_k/2.
    first_half = x[..., :half_size]
    second_half = x[..., half_size:]

    rotated = torch.empty_like(x)
    rotated[..., :half_size] = first_half * cosine - second_half * sine
    rotated[..., half_size:] = second_half * cosine + first_half * sine
    return rotated


class DecoderBlock(nn.Module):
    """Pre-RMSNorm causal self-attention with RoPE and a KV cache, then a Pre-RMSNorm gated FFN."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, eps: float = 1e-6, n_kv_heads: int | None = None):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        # Grouped-query attention: fewer key/value heads than query heads (as many by default).
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.queries_per_kv_head = n_heads // self.n_kv_heads

        # Sublayer 1: normalisation, then causal self-attention.
        self.attn_norm = RMSNorm(d_model, eps)
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, self.n_kv_heads * self.d_k, bias=False)
        self.w_v = nn.Linear(d_model, self.n_kv_heads * self.d_k, bias=False)
        self.w_o = nn.Linear(d_model, d_model, bias=False)

        # Sublayer 2: normalisation, then the SwiGLU feed-forward network.
        self.ffn_norm = RMSNorm(d_model, eps)
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None):
        """x: (B, T, d_model) at positions (T,); cache: None or (k, v), each (B, h_kv, T_past, d_k).
        Returns (B, T, d_model) and the new cache (k, v), each (B, h_kv, T_past + T, d_k)."""
        batch_size, new_length, _ = x.shape

        def split_into_heads(states, number_of_heads):
            # (B, T, heads · d_k) -> (B, T, heads, d_k) -> (B, heads, T, d_k)
            per_head = states.reshape(batch_size, new_length, number_of_heads, self.d_k)
            return per_head.permute(0, 2, 1, 3)

        def repeat_for_each_query_head(per_kv_head):
            # (B, h_kv, S, d_k) -> (B, h_kv, group, S, d_k) -> (B, h, S, d_k): a group of query heads per kv head
            b, kv_heads, length, d_k = per_kv_head.shape
            expanded = per_kv_head[:, :, None].expand(b, kv_heads, self.queries_per_kv_head, length, d_k)
            return expanded.reshape(b, kv_heads * self.queries_per_kv_head, length, d_k)

        def merge_heads(per_head):
            # (B, h, T, d_k) -> (B, T, h, d_k) -> (B, T, d_model)
            return per_head.permute(0, 2, 1, 3).reshape(batch_size, new_length, self.d_model)

        # --- attention sublayer -------------------------------------------------------------
        attention_input = self.attn_norm(x)
        queries = split_into_heads(self.w_q(attention_input), self.n_heads)
        keys = split_into_heads(self.w_k(attention_input), self.n_kv_heads)
        values = split_into_heads(self.w_v(attention_input), self.n_kv_heads)

        # Positions enter only here: rotate queries and keys, leave the values alone.
        queries = apply_rotary(queries, positions)
        keys = apply_rotary(keys, positions)

        # Put the cached (already rotated) keys and values in front of the new ones, along time.
        if cache is not None:
            cached_keys, cached_values = cache
            keys = torch.cat([cached_keys, keys], dim=2)
            values = torch.cat([cached_values, values], dim=2)
        total_length = keys.shape[2]
        past_length = total_length - new_length

        # Query t sits at place past_length + t; it must not see any key after that place.
        # triu(past_length + 1) marks exactly those future keys.
        future = torch.ones(new_length, total_length, dtype=torch.bool, device=x.device).triu(past_length + 1)
        may_attend = ~future  # (T, T_past + T)

        attended, _attention_weights = scaled_dot_product_attention(
            queries, repeat_for_each_query_head(keys), repeat_for_each_query_head(values), may_attend)
        attention_output = self.w_o(merge_heads(attended))
        after_attention = x + attention_output

        # --- feed-forward sublayer ------------------------------------------------------------
        ffn_input = self.ffn_norm(after_attention)
        gate = F.silu(self.w_gate(ffn_input))
        up = self.w_up(ffn_input)
        ffn_output = self.w_down(gate * up)
        block_output = after_attention + ffn_output

        updated_cache = (keys, values)
        return block_output, updated_cache


class GPT(nn.Module):
    """Token embedding, n_layers DecoderBlocks, a final RMSNorm and the output head."""

    def __init__(self, vocab: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, eps: float = 1e-6,
                 n_kv_heads: int | None = None):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)  # no positional table: RoPE handles positions
        self.blocks = nn.ModuleList()
        for _layer_number in range(n_layers):
            self.blocks.append(DecoderBlock(d_model, n_heads, d_ff, eps, n_kv_heads))
        self.norm = RMSNorm(d_model, eps)  # the last residual sum was never normalised
        self.head = nn.Linear(d_model, vocab, bias=False)  # its own weight, not tied to the embedding

    def forward(self, idx: torch.Tensor, cache: list | None = None):
        """idx: (B, T), after the cached tokens. Returns logits (B, T, vocab) and the new cache."""
        new_length = idx.shape[1]

        # How many tokens came before: the time axis (2) of the first block's cached keys.
        if cache is None:
            number_of_cached_tokens = 0
        else:
            first_block_keys = cache[0][0]
            number_of_cached_tokens = first_block_keys.shape[2]
        positions = number_of_cached_tokens + torch.arange(new_length, device=idx.device)

        hidden_states = self.embed(idx)  # (B, T, d_model)
        updated_cache = []
        for block_number, block in enumerate(self.blocks):
            this_block_cache = None if cache is None else cache[block_number]
            hidden_states, this_block_new_cache = block(hidden_states, positions, this_block_cache)
            updated_cache.append(this_block_new_cache)

        final_states = self.norm(hidden_states)
        logits = self.head(final_states)  # (B, T, vocab)
        return logits, updated_cache


def lm_loss(model, idx):
    """Mean cross-entropy of predicting idx[:, 1:] from idx[:, :-1]."""
    inputs = idx[:, :-1]  # every token but the last is read
    targets = idx[:, 1:]  # every token but the first is predicted
    logits, _unused_cache = model(inputs)  # (B, T - 1, V)
    vocabulary_size = logits.shape[-1]
    log_probabilities = F.log_softmax(logits, dim=-1)
    flat_log_probabilities = log_probabilities.reshape(-1, vocabulary_size)  # (B * (T - 1), V)
    flat_targets = targets.reshape(-1)  # (B * (T - 1),)
    return F.nll_loss(flat_log_probabilities, flat_targets)  # averaged over every prediction


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True, generator=None):
    """idx (B, T) -> (B, T + max_new_tokens): greedy when temperature == 0, else sampled with multinomial."""
    generated = idx
    key_value_cache = None

    for _step in range(max_new_tokens):
        # 1. Run the model: on the whole prompt first (or always, without a cache), then on the newest token.
        if use_cache and key_value_cache is not None:
            model_input = generated[:, -1:]
        else:
            model_input = generated
        if use_cache:
            all_logits, key_value_cache = model(model_input, key_value_cache)
        else:
            all_logits, _ignored = model(model_input)
        next_token_logits = all_logits[:, -1, :]  # (B, vocab): only the last position is new

        # 2. Greedy decoding needs no probabilities at all.
        if temperature == 0:
            next_token = torch.argmax(next_token_logits, dim=-1, keepdim=True)
            generated = torch.cat([generated, next_token], dim=1)
            continue

        # 3. Temperature divides the logits (before the softmax).
        scaled_logits = next_token_logits / temperature

        # 4. Top-k: every logit below the k-th largest becomes -inf.
        if top_k is not None:
            vocabulary_size = scaled_logits.shape[-1]
            k = min(top_k, vocabulary_size)
            top_values, _top_indices = torch.topk(scaled_logits, k, dim=-1)
            kth_largest = top_values[:, k - 1].unsqueeze(-1)  # (B, 1)
            below_kth = scaled_logits < kth_largest
            scaled_logits = scaled_logits.masked_fill(below_kth, float("-inf"))

        # 5. Softmax over the vocabulary.
        probabilities = F.softmax(scaled_logits, dim=-1)

        # 6. Top-p: keep a token while the tokens more likely than it add up to less than top_p.
        if top_p is not None:
            sorted_probabilities, sorted_token_ids = torch.sort(probabilities, dim=-1, descending=True)
            running_total = torch.cumsum(sorted_probabilities, dim=-1)
            mass_of_likelier_tokens = running_total - sorted_probabilities
            keep_in_sorted_order = mass_of_likelier_tokens < top_p
            kept_sorted_probabilities = sorted_probabilities * keep_in_sorted_order
            # Scatter the kept probabilities back to vocabulary order (zeros where cut).
            probabilities = torch.zeros_like(probabilities).scatter(-1, sorted_token_ids, kept_sorted_probabilities)
            normaliser = probabilities.sum(dim=-1, keepdim=True)
            probabilities = probabilities / normaliser

        # 7. The fixed draw: multinomial over the probabilities in vocabulary order.
        next_token = torch.multinomial(probabilities, 1, generator=generator)
        generated = torch.cat([generated, next_token], dim=1)

    return generated


@torch.no_grad()
def load_hf_llama(model, state_dict):
    """Copy a Hugging Face LlamaForCausalLM state dict into the GPT `model`, in place; returns model."""

    def copy_into(parameter: nn.Parameter, checkpoint_key: str) -> None:
        """Copy one tensor of the checkpoint into one of our parameters, checking the shapes first."""
        tensor = state_dict[checkpoint_key]
        if tensor.shape != parameter.shape:
            raise ValueError(f"{checkpoint_key} has shape {tuple(tensor.shape)}, ours {tuple(parameter.shape)}")
        parameter.copy_(tensor)  # copy_ converts to our dtype and device

    # 1. the token embedding
    copy_into(model.embed.weight, "model.embed_tokens.weight")
    # 2. every block: its two norms, its four attention projections and its three FFN projections
    attention_projections = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "o_proj"}
    ffn_projections = {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}
    for layer_index, block in enumerate(model.blocks):
        layer_prefix = f"model.layers.{layer_index}"
        copy_into(block.attn_norm.weight, f"{layer_prefix}.input_layernorm.weight")
        copy_into(block.ffn_norm.weight, f"{layer_prefix}.post_attention_layernorm.weight")
        for our_name, their_name in attention_projections.items():
            copy_into(getattr(block, our_name).weight, f"{layer_prefix}.self_attn.{their_name}.weight")
        for our_name, their_name in ffn_projections.items():
            copy_into(getattr(block, our_name).weight, f"{layer_prefix}.mlp.{their_name}.weight")
    # 3. the final norm
    copy_into(model.norm.weight, "model.norm.weight")
    # 4. the head: its own weight, or the embedding's when the checkpoint ties them
    head_key = "lm_head.weight" if "lm_head.weight" in state_dict else "model.embed_tokens.weight"
    copy_into(model.head.weight, head_key)
    return model


def interleaved_to_half_split(w, d_k):
    """(heads * d_k, d_model) -> the same rows, each head's (2i, 2i + 1) moved to (i, i + d_k/2)."""
    number_of_heads = w.shape[0] // d_k
    half = d_k // 2
    reordered_heads = []
    for head in range(number_of_heads):
        rows_of_this_head = w[head * d_k:(head + 1) * d_k]
        first_of_each_pair = rows_of_this_head[0::2]  # rows 0, 2, 4, ...: they become rows 0 .. half - 1
        second_of_each_pair = rows_of_this_head[1::2]  # rows 1, 3, 5, ...: they become rows half .. d_k - 1
        assert first_of_each_pair.shape[0] == second_of_each_pair.shape[0] == half
        reordered_heads.append(torch.cat([first_of_each_pair, second_of_each_pair], dim=0))
    return torch.cat(reordered_heads, dim=0)


@torch.no_grad()
def load_meta_llama(model, checkpoint):
    """Copy a checkpoint in Meta's layout into the GPT `model`, in place; returns model."""

    def meta_tensor(layer_index: int, section: str, projection: str) -> torch.Tensor:
        """One weight of one of Meta's layers, e.g. ("attention", "wq") or ("feed_forward", "w1")."""
        return checkpoint[f"layers.{layer_index}.{section}.{projection}.weight"]

    def overwrite(parameter: nn.Parameter, tensor: torch.Tensor) -> None:
        """Write a checkpoint tensor into one of our parameters, after checking that the shapes agree."""
        if parameter.shape != tensor.shape:
            raise ValueError(f"shape {tuple(tensor.shape)} does not fit our {tuple(parameter.shape)}")
        parameter.copy_(tensor)

    # Step 1: the embedding, the final norm and the head (Meta's "output"; without one, the embedding is the head).
    overwrite(model.embed.weight, checkpoint["tok_embeddings.weight"])
    overwrite(model.norm.weight, checkpoint["norm.weight"])
    head_tensor = checkpoint["output.weight"] if "output.weight" in checkpoint else checkpoint["tok_embeddings.weight"]
    overwrite(model.head.weight, head_tensor)

    # Step 2: each block. Meta's RoPE pairs neighbouring features, ours pairs i with i + d_k/2, so the query and
    # key projections get their rows reordered; keys have n_kv_heads heads, but the same d_k per head.
    for layer_index, block in enumerate(model.blocks):
        overwrite(block.attn_norm.weight, checkpoint[f"layers.{layer_index}.attention_norm.weight"])
        overwrite(block.ffn_norm.weight, checkpoint[f"layers.{layer_index}.ffn_norm.weight"])
        query_rows = interleaved_to_half_split(meta_tensor(layer_index, "attention", "wq"), block.d_k)
        key_rows = interleaved_to_half_split(meta_tensor(layer_index, "attention", "wk"), block.d_k)
        overwrite(block.w_q.weight, query_rows)
        overwrite(block.w_k.weight, key_rows)
        overwrite(block.w_v.weight, meta_tensor(layer_index, "attention", "wv"))  # values: never rotated
        overwrite(block.w_o.weight, meta_tensor(layer_index, "attention", "wo"))
        # Meta's FFN is w2(silu(w1(x)) * w3(x)): w1 is our gate, w3 our up projection, w2 our down projection.
        overwrite(block.w_gate.weight, meta_tensor(layer_index, "feed_forward", "w1"))
        overwrite(block.w_up.weight, meta_tensor(layer_index, "feed_forward", "w3"))
        overwrite(block.w_down.weight, meta_tensor(layer_index, "feed_forward", "w2"))
    return model
