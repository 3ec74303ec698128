"""Loops style: heads handled one at a time, slices copied into preallocated tensors."""
import math

import torch
from torch import nn

from autograde_tests.reference import scaled_dot_product_attention


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, d_model) -> (B, h, T, d_k), d_k = d_model // n_heads."""
    batch, length, width = x.shape
    size = width // n_heads
    out = x.new_empty(batch, n_heads, length, size)
    for head in range(n_heads):
        start = head * size
        out[:, head] = x[:, :, start:start + size]
    return out


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, T, h * d_k), the inverse of split_heads."""
    batch, heads, length, size = x.shape
    out = x.new_empty(batch, length, heads * size)
    for head in range(heads):
        out[:, :, head * size:(head + 1) * size] = x[:, head]
    return out


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention in parallel.

    forward(x (B, m, d_model), y (B, n, d_model) or None, mask bool broadcastable to (B, h, m, n))
    -> (output (B, m, d_model), weights (B, h, m, n)).
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = False):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be a multiple of n_heads"
        self.n_heads = n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, y=None, mask=None):
        if y is None:
            y = x
        queries = split_heads(self.w_q(x), self.n_heads)
        keys = split_heads(self.w_k(y), self.n_heads)
        values = split_heads(self.w_v(y), self.n_heads)
        batch, m, n = x.shape[0], x.shape[1], y.shape[1]
        if mask is not None:
            mask = torch.broadcast_to(mask, (batch, self.n_heads, m, n))
        per_head_out, per_head_w = [], []
        for head in range(self.n_heads):
            head_mask = None if mask is None else mask[:, head]
            o, w = scaled_dot_product_attention(queries[:, head], keys[:, head], values[:, head], head_mask)
            per_head_out.append(o)
            per_head_w.append(w)
        joined = merge_heads(torch.stack(per_head_out, dim=1))
        return self.w_o(joined), torch.stack(per_head_w, dim=1)
