"""Comparison style: masks from broadcast index comparisons, unsqueeze for the mask axes."""
import torch
from torch import nn

from autograde_tests.reference import MultiHeadAttention


def causal_mask(size: int, device=None) -> torch.Tensor:
    """(size, size) bool, True on and below the diagonal."""
    idx = torch.arange(size, device=device)
    return idx.unsqueeze(1) >= idx.unsqueeze(0)  # key index j <= query index i


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """(B, max_len) bool, True for the first lengths[b] positions of sequence b."""
    width = max_len if max_len is not None else lengths.max().item()
    return torch.arange(width, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(-1)


class SelfAttention(nn.Module):
    """Q, K and V all from x; padded keys hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, padding_mask=None):
        keys = padding_mask
        if keys is not None:
            keys = keys.unsqueeze(1).unsqueeze(2)
        return self.attn(x, mask=keys)[0]


class CausalSelfAttention(nn.Module):
    """Q, K and V all from x; future and padded keys hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, padding_mask=None):
        t = torch.arange(x.size(1), device=x.device)
        visible = t.unsqueeze(-1) >= t  # (T, T), built inline the same way as causal_mask
        if padding_mask is not None:
            visible = torch.logical_and(visible, padding_mask.unsqueeze(1).unsqueeze(2))
        return self.attn(x, mask=visible)[0]


class CrossAttention(nn.Module):
    """Q from x, K and V from memory; padded memory positions hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, memory, memory_padding_mask=None):
        keys = None if memory_padding_mask is None else memory_padding_mask.unsqueeze(1).unsqueeze(1)
        return self.attn(x, y=memory, mask=keys)[0]
