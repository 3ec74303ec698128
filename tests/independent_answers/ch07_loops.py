"""Style: explicit loops, an iterator driven by next(), a preallocated output filled block by block."""

import math

import torch


def online_softmax(chunks):
    stream = iter(chunks)
    running_max = None
    running_sum = None
    while True:
        try:
            piece = next(stream)
        except StopIteration:
            break
        top = piece.max(dim=-1, keepdim=True).values
        if running_max is None:
            running_max = top
            running_sum = (piece - top).exp().sum(dim=-1, keepdim=True)
            continue
        bigger = torch.maximum(running_max, top)
        shrink = (running_max - bigger).exp()
        running_sum = running_sum * shrink + (piece - bigger).exp().sum(dim=-1, keepdim=True)
        running_max = bigger
    if running_max is None:
        raise ValueError("no chunks were given")
    return running_max, running_sum


def tiled_attention(q, k, v, block_q, block_k, causal=False):
    m, d_k = q.shape[-2], q.shape[-1]
    n, d_v = k.shape[-2], v.shape[-1]
    batch = q.shape[:-2]
    out = q.new_zeros(*batch, m, d_v)
    if n == 0:
        return out
    inv_sqrt_d = 1.0 / math.sqrt(d_k)
    for q_start in range(0, m, block_q):
        q_stop = min(q_start + block_q, m)
        rows = q_stop - q_start
        q_tile = q[..., q_start:q_stop, :]
        best = q.new_full((*batch, rows, 1), -math.inf)
        total = q.new_zeros(*batch, rows, 1)
        acc = q.new_zeros(*batch, rows, d_v)
        for k_start in range(0, n, block_k):
            if causal and k_start >= q_stop:
                break  # this tile and every later one lies above the diagonal
            k_stop = min(k_start + block_k, n)
            cols = k_stop - k_start
            scores = torch.matmul(q_tile, k[..., k_start:k_stop, :].transpose(-1, -2)) * inv_sqrt_d
            if causal and k_stop - 1 > q_start:
                # keep key j for query i when j <= i: on the tile that is column - row <= q_start - k_start
                allowed = torch.ones(rows, cols, dtype=torch.bool, device=q.device).tril(q_start - k_start)
                scores = scores.masked_fill(~allowed, -math.inf)
            new_best = torch.maximum(best, scores.max(dim=-1, keepdim=True).values)
            weights = (scores - new_best).exp()
            factor = (best - new_best).exp()
            total = total * factor + weights.sum(dim=-1, keepdim=True)
            acc = acc * factor + torch.matmul(weights, v[..., k_start:k_stop, :])
            best = new_best
        out[..., q_start:q_stop, :] = acc / total
    return out
