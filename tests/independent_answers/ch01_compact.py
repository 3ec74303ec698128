"""Compact style: short expressions, chained tensor methods."""
import math

import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``; same shape, dtype and device as ``x``."""
    z = (x - x.max(dim, keepdim=True).values).exp()
    return z / z.sum(dim, keepdim=True)


def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q kᵀ / √d_k) v.

    q: (..., m, d_k), k: (..., n, d_k), v: (..., n, d_v); mask: bool, broadcastable to (..., m, n),
    True = may attend. Returns (output (..., m, d_v), weights (..., m, n)).
    """
    s = q.matmul(k.mT).div(math.sqrt(q.size(-1)))
    w = softmax(s if mask is None else s.masked_fill(~mask, float("-inf")))
    w = w.nan_to_num(nan=0.0)  # a row with no allowed key: 0/0 -> attend to nothing
    return w.matmul(v), w
