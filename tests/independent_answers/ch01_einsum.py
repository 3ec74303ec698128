"""Einsum style: contractions written with torch.einsum, softmax through logsumexp."""
import math

import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``; same shape, dtype and device as ``x``."""
    log_norm = torch.logsumexp(x, dim=dim, keepdim=True)
    return torch.exp(x - log_norm)


def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q kᵀ / √d_k) v.

    q: (..., m, d_k), k: (..., n, d_k), v: (..., n, d_v); mask: bool, broadcastable to (..., m, n),
    True = may attend. Returns (output (..., m, d_v), weights (..., m, n)).
    """
    logits = torch.einsum("...id,...jd->...ij", q, k) * (1.0 / math.sqrt(k.shape[-1]))
    if mask is not None:
        logits = logits.masked_fill(mask.logical_not(), -math.inf)
    attn = softmax(logits, dim=-1)
    if mask is not None:
        attn = attn.masked_fill(mask.logical_not(), 0.0)
    out = torch.einsum("...ij,...jd->...id", attn, v)
    return out, attn
