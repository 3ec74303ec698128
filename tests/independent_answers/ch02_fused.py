"""Fused style: chunk/unbind for heads, one stacked QKV (or KV) matmul per call."""
import math

import torch
from torch import nn

from autograde_tests.reference import scaled_dot_product_attention


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, d_model) -> (B, h, T, d_k), d_k = d_model // n_heads."""
    return torch.stack(torch.chunk(x, n_heads, dim=2), dim=1)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, T, h * d_k), the inverse of split_heads."""
    return torch.cat(torch.unbind(x, dim=1), dim=2)


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention in parallel.

    forward(x (B, m, d_model), y (B, n, d_model) or None, mask bool broadcastable to (B, h, m, n))
    -> (output (B, m, d_model), weights (B, h, m, n)).
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = False):
        super().__init__()
        self.num_heads = n_heads
        self.w_q = nn.Linear(d_model, d_model, bias)
        self.w_k = nn.Linear(d_model, d_model, bias)
        self.w_v = nn.Linear(d_model, d_model, bias)
        self.w_o = nn.Linear(d_model, d_model, bias)

    def forward(self, x, y=None, mask=None):
        def stacked(*layers):
            # One matrix for several projections: rows of each layer's weight, one after another.
            weight = torch.cat([layer.weight for layer in layers], dim=0)
            offset = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])
            return weight, offset

        def project(t, weight, offset):
            out = torch.matmul(t, weight.t())
            return out if offset is None else out + offset

        if y is None or y is x:
            q, k, v = project(x, *stacked(self.w_q, self.w_k, self.w_v)).chunk(3, dim=-1)
        else:
            q = self.w_q(x)
            k, v = project(y, *stacked(self.w_k, self.w_v)).chunk(2, dim=-1)
        heads, attn = scaled_dot_product_attention(
            *(split_heads(t, self.num_heads) for t in (q, k, v)), mask
        )
        return self.w_o(merge_heads(heads)), attn
