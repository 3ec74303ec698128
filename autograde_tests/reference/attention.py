"""Chapter 01_attention: softmax and scaled dot-product attention.

Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V      (Vaswani et al., 2017, eq. 1)

Shapes (any number of leading batch dimensions ``...``):
    q: (..., m, d_k)   one row per query  (the "X goes into the Q port" side)
    k: (..., n, d_k)   one row per key    (the "Y goes into the K/V ports" side)
    v: (..., n, d_v)   one row per value, paired with the keys
Mask convention: boolean, broadcastable to (..., m, n), ``True`` = may attend
(the convention of ``torch.nn.functional.scaled_dot_product_attention``).
"""

import math

import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax along ``dim``, stable for large scores; same shape, dtype and device as ``x``.

    exp(x) overflows for x > ~88 in float32, so we subtract the largest score first:
    softmax(x) = softmax(x - c) for any constant c along ``dim``.
    """
    x_max = x.amax(dim=dim, keepdim=True)
    e = torch.exp(x - x_max)
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / √d_k) v.

    Args:
        q: (..., m, d_k) queries.
        k: (..., n, d_k) keys.
        v: (..., n, d_v) values.
        mask: optional bool, broadcastable to (..., m, n); ``True`` = may attend.

    Returns:
        output: (..., m, d_v), each row a weighted average of the rows of ``v``.
        weights: (..., m, n), each row sums to 1 over the keys it may attend to;
            a query whose keys are all masked gets zero weights and a zero output.
    """
    d_k = q.size(-1)
    # Dividing by √d_k keeps the scores' variance near 1 whatever d_k, so softmax does not saturate.
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., m, n)
    if mask is not None:
        scores = torch.where(mask, scores, float("-inf"))  # (..., m, n)
    weights = softmax(scores, dim=-1)  # (..., m, n), normalised over the keys
    if mask is not None:
        # A fully masked row is softmax(-inf, ..., -inf) = NaN; it must attend to nothing instead.
        weights = torch.where(mask, weights, 0.0)
    output = weights @ v  # (..., m, d_v)
    return output, weights
