"""Indexing style: masks written with tril_indices / cumsum, masks combined with torch.where and expand."""
import torch
from torch import nn

from autograde_tests.reference import MultiHeadAttention


def causal_mask(size: int, device=None) -> torch.Tensor:
    """(size, size) bool, True on and below the diagonal."""
    grid = torch.full((size, size), False, device=device)
    rows, cols = torch.tril_indices(size, size, device=device)
    grid[rows, cols] = True
    return grid


def padding_mask(lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """(B, max_len) bool, True for the first lengths[b] positions of sequence b."""
    if max_len is None:
        max_len = int(torch.amax(lengths))
    counts = torch.ones(len(lengths), max_len, dtype=lengths.dtype, device=lengths.device).cumsum(dim=1)
    # counts[b, p] = p + 1, the number of tokens up to and including p
    return counts.le(lengths.unsqueeze(1))


class SelfAttention(nn.Module):
    """Q, K and V all from x; padded keys hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model=d_model, n_heads=n_heads)

    def forward(self, x, padding_mask=None):
        B, T, _ = x.shape
        mask = None if padding_mask is None else padding_mask[:, None, None, :].expand(B, 1, T, T)
        output, weights = self.attn(x, y=x, mask=mask)
        return output


class CausalSelfAttention(nn.Module):
    """Q, K and V all from x; future and padded keys hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model=d_model, n_heads=n_heads)

    def forward(self, x, padding_mask=None):
        B, T, _ = x.shape
        future_ok = causal_mask(T, device=x.device).expand(B, 1, T, T)
        if padding_mask is not None:
            # keep the causal verdict only where the key is a real token
            future_ok = torch.where(padding_mask[:, None, None, :], future_ok, False)
        output, weights = self.attn(x, y=x, mask=future_ok)
        return output


class CrossAttention(nn.Module):
    """Q from x, K and V from memory; padded memory positions hidden."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.attn = MultiHeadAttention(d_model=d_model, n_heads=n_heads)

    def forward(self, x, memory, memory_padding_mask=None):
        B, m, _ = x.shape
        n = memory.shape[1]
        mask = None
        if memory_padding_mask is not None:
            mask = memory_padding_mask[:, None, None, :].expand(B, 1, m, n)
        output, weights = self.attn(x, y=memory, mask=mask)
        return output
