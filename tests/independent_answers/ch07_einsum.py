"""Style: einsum for every product and reduction, boolean masks applied with torch.where."""

import math

import torch


def online_softmax(chunks):
    m = l = None
    for x in chunks:
        if m is None:
            m = torch.full_like(x[..., :1], -math.inf)
            l = torch.zeros_like(m)
        m_next = torch.maximum(m, x.amax(dim=-1, keepdim=True))
        l = l * torch.exp(m - m_next) + torch.einsum("...c->...", torch.exp(x - m_next)).unsqueeze(-1)
        m = m_next
    return m, l


def tiled_attention(q, k, v, block_q, block_k, causal=False):
    n = k.shape[-2]
    scale = math.sqrt(q.shape[-1])
    blocks = []
    for i0 in range(0, q.shape[-2], block_q):
        qb = q[..., i0:i0 + block_q, :]
        r = qb.shape[-2]
        mx = torch.full_like(qb[..., :1], -math.inf)
        den = torch.zeros_like(mx)
        num = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=v.dtype, device=v.device)
        last_key = min(n, i0 + r) if causal else n
        for j0 in range(0, last_key, block_k):
            kb, vb = k[..., j0:j0 + block_k, :], v[..., j0:j0 + block_k, :]
            c = kb.shape[-2]
            s = torch.einsum("...qd,...kd->...qk", qb, kb) / scale
            if causal and j0 + c > i0 + 1:
                qpos = torch.arange(i0, i0 + r, device=q.device)
                kpos = torch.arange(j0, j0 + c, device=q.device)
                s = torch.where(kpos[None, :] <= qpos[:, None], s, -math.inf)
            mx_new = torch.maximum(mx, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - mx_new)
            alpha = torch.exp(mx - mx_new)
            den = den * alpha + torch.einsum("...qk->...q", p).unsqueeze(-1)
            num = num * alpha + torch.einsum("...qk,...kv->...qv", p, vb)
            mx = mx_new
        blocks.append(num / den.masked_fill(den == 0, 1.0))
    return torch.cat(blocks, dim=-2)
