"""Loops style: rows handled one at a time with explicit Python loops."""
import math

import torch


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``; same shape, dtype and device as ``x``."""
    moved = x.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    results = []
    for r in range(rows.shape[0]):
        row = rows[r]
        biggest = row.max()
        ex = (row - biggest).exp()
        total = ex.sum()
        results.append(ex / total)
    if results:
        stacked = torch.stack(results)
    else:
        stacked = torch.empty_like(rows)
    return stacked.reshape(moved.shape).movedim(-1, dim)


def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q kᵀ / √d_k) v.

    q: (..., m, d_k), k: (..., n, d_k), v: (..., n, d_v); mask: bool, broadcastable to (..., m, n),
    True = may attend. Returns (output (..., m, d_v), weights (..., m, n)).
    """
    m, d_k = q.shape[-2], q.shape[-1]
    n, d_v = k.shape[-2], v.shape[-1]
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if mask is not None:
        lead = torch.broadcast_shapes(lead, mask.shape[:-2])
        allowed = torch.broadcast_to(mask, (*lead, m, n)).reshape(-1, m, n)
    qs = torch.broadcast_to(q, (*lead, m, d_k)).reshape(-1, m, d_k)
    ks = torch.broadcast_to(k, (*lead, n, d_k)).reshape(-1, n, d_k)
    vs = torch.broadcast_to(v, (*lead, n, d_v)).reshape(-1, n, d_v)
    denom = math.sqrt(d_k)

    all_outputs, all_weights = [], []
    for b in range(qs.shape[0]):
        out_rows, weight_rows = [], []
        for i in range(m):
            row_scores = ks[b] @ qs[b, i] / denom  # (n,)
            if mask is not None:
                keep = allowed[b, i]
                row_scores = row_scores.masked_fill(~keep, float("-inf"))
            row_weights = softmax(row_scores, dim=0)
            if mask is not None:
                row_weights = row_weights.masked_fill(~keep, 0.0)
            weight_rows.append(row_weights)
            out_rows.append(row_weights @ vs[b])  # (d_v,)
        all_weights.append(torch.stack(weight_rows))
        all_outputs.append(torch.stack(out_rows))
    weights = torch.stack(all_weights).reshape(*lead, m, n)
    output = torch.stack(all_outputs).reshape(*lead, m, d_v)
    return output, weights
