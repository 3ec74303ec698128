"""Style: batch axes flattened to 3-D, torch.bmm/baddbmm with an additive -inf bias, stacked (max, sum) merges."""

import math

import torch


def online_softmax(chunks):
    state = None
    for part in chunks:
        local_max = part.max(dim=-1, keepdim=True).values
        local_sum = torch.exp(part - local_max).sum(dim=-1, keepdim=True)
        if state is None:
            state = (local_max, local_sum)
            continue
        maxima = torch.stack((state[0], local_max))
        sums = torch.stack((state[1], local_sum))
        top = maxima.amax(dim=0)
        state = (top, (sums * torch.exp(maxima - top)).sum(dim=0))
    return state


def tiled_attention(q, k, v, block_q, block_k, causal=False):
    *lead, m, d_k = q.shape
    n, d_v = k.shape[-2], v.shape[-1]
    heads = math.prod(lead)
    if n == 0:
        return q.new_zeros(*lead, m, d_v)
    Q = q.reshape(heads, m, d_k)
    K = k.reshape(heads, n, d_k).transpose(1, 2)  # (heads, d_k, n)
    V = v.reshape(heads, n, d_v)
    alpha = 1.0 / math.sqrt(d_k)
    pieces = []
    for top in range(0, m, block_q):
        Qb = Q[:, top:top + block_q]
        rows = Qb.shape[1]
        run_max = Qb.new_full((heads, rows, 1), -math.inf)
        run_sum = Qb.new_zeros(heads, rows, 1)
        run_out = Qb.new_zeros(heads, rows, d_v)
        stop = min(n, top + rows) if causal else n
        for left in range(0, stop, block_k):
            Kb = K[:, :, left:left + block_k]
            cols = Kb.shape[2]
            if causal and left + cols - 1 > top:
                # 0 where key <= query, -inf above the diagonal (global positions)
                bias = Qb.new_full((rows, cols), -math.inf).triu(top - left + 1)
                S = torch.baddbmm(bias, Qb, Kb, alpha=alpha)
            else:
                S = torch.bmm(Qb, Kb).mul_(alpha)
            new_max = torch.maximum(run_max, S.max(dim=2, keepdim=True).values)
            P = torch.exp(S - new_max)
            shrink = torch.exp(run_max - new_max)
            run_sum = run_sum * shrink + P.sum(dim=2, keepdim=True)
            run_out = torch.baddbmm(run_out * shrink, P, V[:, left:left + block_k])
            run_max = new_max
        pieces.append(run_out / run_sum)
    return torch.cat(pieces, dim=1).reshape(*lead, m, d_v)
