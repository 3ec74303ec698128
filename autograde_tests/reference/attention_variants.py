"""Chapter 03_attention_variants: one mechanism, three uses, told apart by where Q and K/V come from.

    self-attention          Q, K, V from x                  padding mask on the keys
    causal self-attention   Q, K, V from x                  causal mask AND padding mask
    cross-attention         Q from x, K and V from memory   the memory's padding mask on the keys

Masks are boolean, ``True`` = may attend (the convention of ``F.scaled_dot_product_attention``; the
opposite of ``nn.MultiheadAttention``'s boolean masks). A padding mask is (B, n), ``True`` for real tokens.
"""

import torch
from torch import nn

from .multi_head_attention import MultiHeadAttention


def causal_mask(size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(size, size) bool, ``True`` on and below the diagonal: position i may attend to 0 .. i."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """(B, max_len) bool, ``True`` for the first ``lengths[b]`` positions of sequence b.

    Args:
        lengths: (B,) integer tensor of real lengths; the mask is made on its device.
        max_len: the padded length; defaults to the longest of ``lengths``.
    """
    lengths = torch.as_tensor(lengths)
    max_len = int(lengths.max()) if max_len is None else max_len
    positions = torch.arange(max_len, device=lengths.device)  # (max_len,)
    return positions < lengths[:, None]  # (B, max_len)


class SelfAttention(nn.Module):
    """Every position of ``x`` attends to every real position of ``x``."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d_model); padding_mask: (B, T) bool, ``True`` = real token. Returns (B, T, d_model)."""
        # A padding mask hides keys: the same ones from every head and every query, (B, 1, 1, T).
        mask = None if padding_mask is None else padding_mask[:, None, None, :]
        return self.attn(x, x, mask)[0]


class CausalSelfAttention(nn.Module):
    """Position i of ``x`` attends to the real positions 0 .. i only, so it never sees the future.

    One forward pass therefore trains every position at once: each output depends on exactly the
    inputs that will be available when that position is generated one token at a time.
    """

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d_model); padding_mask: (B, T) bool, ``True`` = real token. Returns (B, T, d_model)."""
        mask = causal_mask(x.size(1), device=x.device)  # (T, T)
        if padding_mask is not None:
            mask = mask & padding_mask[:, None, None, :]  # (B, 1, T, T): both must allow a key
        return self.attn(x, x, mask)[0]


class CrossAttention(nn.Module):
    """Each position of ``x`` gathers information from ``memory`` (say, the encoder's output): one way."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, memory_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x: (B, m, d_model) queries; memory: (B, n, d_model) keys and values;
        memory_padding_mask: (B, n) bool, ``True`` = real token. Returns (B, m, d_model)."""
        mask = None if memory_padding_mask is None else memory_padding_mask[:, None, None, :]  # (B, 1, 1, n)
        return self.attn(x, memory, mask)[0]
