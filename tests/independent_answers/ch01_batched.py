"""Batched style: flatten batch dimensions and use bmm/baddbmm, then unflatten."""
import math

import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``; same shape, dtype and device as ``x``."""
    peak, _ = torch.max(x, dim=dim, keepdim=True)
    numer = torch.exp(torch.subtract(x, peak))
    return torch.divide(numer, torch.sum(numer, dim, True))


def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q kᵀ / √d_k) v.

    q: (..., m, d_k), k: (..., n, d_k), v: (..., n, d_v); mask: bool, broadcastable to (..., m, n),
    True = may attend. Returns (output (..., m, d_v), weights (..., m, n)).
    """
    (m, dk), (n, dv) = q.shape[-2:], v.shape[-2:]
    shapes = [q.shape[:-2], k.shape[:-2], v.shape[:-2]] + ([] if mask is None else [mask.shape[:-2]])
    batch = torch.broadcast_shapes(*shapes)
    flat_q = q.expand(*batch, m, dk).reshape(-1, m, dk)
    flat_k = k.expand(*batch, n, dk).reshape(-1, n, dk)
    flat_v = v.expand(*batch, n, dv).reshape(-1, n, dv)
    blank = flat_q.new_empty(flat_q.shape[0], m, n)
    # beta=0 ignores `blank`'s contents: scores = (1/sqrt(d_k)) * q @ k^T
    scores = torch.baddbmm(blank, flat_q, flat_k.transpose(1, 2), beta=0.0, alpha=1.0 / math.sqrt(dk))
    if mask is not None:
        keep = mask.expand(*batch, m, n).reshape(-1, m, n)
        scores = torch.where(keep, scores, torch.full_like(scores, -math.inf))
    probs = softmax(scores, dim=2)
    if mask is not None:
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    result = torch.bmm(probs, flat_v)
    return result.reshape(*batch, m, dv), probs.reshape(*batch, m, n)
