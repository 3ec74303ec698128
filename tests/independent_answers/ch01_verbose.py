"""Verbose style: every step named and commented, masking handled by hand."""
import math

import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``; same shape, dtype and device as ``x``."""
    # Step 1: the largest score along the axis, kept as a size-1 axis so that it broadcasts.
    largest_value_along_dim = torch.amax(x, dim=dim, keepdim=True)
    # Step 2: shift the scores so that the largest becomes 0; exp can then never overflow.
    shifted_scores = torch.sub(x, largest_value_along_dim)
    # Step 3: exponentiate; every value now lies in (0, 1].
    exponentials = torch.exp(shifted_scores)
    # Step 4: the normaliser is the sum of the exponentials along the same axis.
    normaliser = torch.sum(exponentials, dim=dim, keepdim=True)
    # Step 5: divide, so that the values along dim sum to one.
    probabilities = torch.div(exponentials, normaliser)
    return probabilities


def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q kᵀ / √d_k) v.

    q: (..., m, d_k), k: (..., n, d_k), v: (..., n, d_v); mask: bool, broadcastable to (..., m, n),
    True = may attend. Returns (output (..., m, d_v), weights (..., m, n)).
    """
    # The size of one query/key vector decides the scale.
    key_dimension = k.shape[-1]
    scale_factor = 1.0 / math.sqrt(key_dimension)

    # Raw similarity of every query with every key: (..., m, n).
    keys_transposed = torch.transpose(k, -1, -2)
    raw_scores = torch.matmul(q, keys_transposed)
    scaled_scores = raw_scores * scale_factor

    # Which (query, key) pairs count. Without a mask, every pair does.
    if mask is None:
        allowed_pairs = torch.ones_like(scaled_scores, dtype=torch.bool)
    else:
        allowed_pairs = torch.broadcast_to(mask, scaled_scores.shape)

    # The largest allowed score of each query row; rows without any allowed key have -inf here,
    # so they are shifted by 0 instead (their exponentials are zeroed below anyway).
    scores_for_max = torch.where(allowed_pairs, scaled_scores, float("-inf"))
    row_maximum = torch.amax(scores_for_max, dim=-1, keepdim=True)
    safe_row_maximum = torch.where(torch.isfinite(row_maximum), row_maximum, torch.zeros_like(row_maximum))

    # Exponentials of the shifted scores; forbidden pairs contribute exactly zero.
    shifted_scores = scaled_scores - safe_row_maximum
    exponentials = torch.exp(shifted_scores)
    exponentials = torch.where(allowed_pairs, exponentials, torch.zeros_like(exponentials))

    # Normalise each row. A row whose keys are all hidden has a zero sum: divide it by 1, giving zeros.
    row_totals = exponentials.sum(dim=-1, keepdim=True)
    row_has_a_key = row_totals > 0
    safe_row_totals = torch.where(row_has_a_key, row_totals, torch.ones_like(row_totals))
    attention_weights = exponentials / safe_row_totals

    # Each query's output is the weighted average of the values: (..., m, d_v).
    attention_output = torch.matmul(attention_weights, v)
    return attention_output, attention_weights
