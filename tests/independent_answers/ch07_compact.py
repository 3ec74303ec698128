"""Style: compact, a merge of (max, sum) pairs and a nested helper per query block, tensor methods throughout."""

import math

import torch


def online_softmax(chunks):
    m = l = None
    for c in chunks:
        cm = c.amax(-1, keepdim=True)
        cl = (c - cm).exp().sum(-1, keepdim=True)
        if m is None:
            m, l = cm, cl
        else:
            top = torch.maximum(m, cm)
            m, l = top, l * (m - top).exp() + cl * (cm - top).exp()
    return m, l


def tiled_attention(q, k, v, block_q, block_k, causal=False):
    n, scale = k.shape[-2], q.shape[-1] ** -0.5

    def block(i):
        qi = q[..., i:i + block_q, :] * scale
        r = qi.shape[-2]
        m = qi.new_full((*qi.shape[:-1], 1), -math.inf)
        l, acc = torch.zeros_like(m), qi.new_zeros(*qi.shape[:-1], v.shape[-1])
        for j in range(0, min(n, i + r) if causal else n, block_k):
            s = qi @ k[..., j:j + block_k, :].mT
            if causal and j + s.shape[-1] > i + 1:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1], device=q.device)
                                  > torch.arange(i, i + r, device=q.device)[:, None], -math.inf)
            top = torch.maximum(m, s.amax(-1, keepdim=True))
            p, f = (s - top).exp(), (m - top).exp()
            l, acc, m = l * f + p.sum(-1, keepdim=True), acc * f + p @ v[..., j:j + block_k, :], top
        return acc / l.clamp_min(1.0)  # l >= 1 once a key is seen; a row with no key keeps acc = 0

    return torch.cat([block(i) for i in range(0, q.shape[-2], block_q)], dim=-2)
