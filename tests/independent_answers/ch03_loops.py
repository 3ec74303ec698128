"""Loops style: masks filled position by position, masks assembled step by step."""
import torch
from torch import nn

from autograde_tests.reference import MultiHeadAttention


def causal_mask(size: int, device=None) -> torch.Tensor:
    """(size, size) bool, True on and below the diagonal."""
    allowed = torch.zeros((size, size), dtype=torch.bool, device=device)
    for query in range(size):
        allowed[query, : query + 1] = True
    return allowed


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """(B, max_len) bool, True for the first lengths[b] positions of sequence b."""
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() else 0
    real = torch.zeros((lengths.shape[0], max_len), dtype=torch.bool, device=lengths.device)
    for position in range(max_len):
        real[:, position] = lengths > position
    return real


class SelfAttention(nn.Module):
    """Q, K and V all from x; padded keys hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, padding_mask=None):
        if padding_mask is None:
            out, _ = self.attn(x)
        else:
            batch, length = padding_mask.shape
            out, _ = self.attn(x, x, padding_mask.reshape(batch, 1, 1, length))
        return out


class CausalSelfAttention(nn.Module):
    """Q, K and V all from x; future and padded keys hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, padding_mask=None):
        length = x.shape[1]
        combined = causal_mask(length, device=x.device)[None, None]  # (1, 1, T, T)
        if padding_mask is not None:
            keys_ok = padding_mask.reshape(padding_mask.shape[0], 1, 1, length)  # (B, 1, 1, T)
            combined = combined & keys_ok  # (B, 1, T, T)
        out, _ = self.attn(x, x, combined)
        return out


class CrossAttention(nn.Module):
    """Q from x, K and V from memory; padded memory positions hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, memory, memory_padding_mask=None):
        key_mask = None
        if memory_padding_mask is not None:
            batch, n = memory_padding_mask.shape
            key_mask = memory_padding_mask.reshape(batch, 1, 1, n)
        out, _ = self.attn(x, memory, key_mask)
        return out
