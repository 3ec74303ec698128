"""Chapter 07_attention_at_scale: exact attention without the (m, n) matrix, in FlashAttention-2's loop order
(Dao, 2023; the tiling is FlashAttention's, Dao et al., 2022).

Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V needs, row by row, only three running quantities:
the largest score seen so far (m), the sum of exp(score - m) (l), and the sum of exp(score - m) v (the
accumulator). When a new block of keys raises the maximum, the old sums are rescaled by exp(m_old - m_new)
(Milakov and Gimelshein, 2018, "online softmax"); the division by l happens once, at the end.

Shapes (any number of leading batch dimensions ``...``):
    q: (..., m, d_k)   k: (..., n, d_k)   v: (..., n, d_v)   output: (..., m, d_v)
Causal means what ``F.scaled_dot_product_attention(..., is_causal=True)`` and the course's
``causal_mask(max(m, n))[:m, :n]`` mean: query i may attend to keys 0 .. i (``True`` on and below the
diagonal that starts at the top-left corner), also when m != n. A query with no key to attend to
(n = 0) gets a zero output, as the course's contract says for a fully masked row.
"""

import math
from collections.abc import Iterable

import torch


def online_softmax(chunks: Iterable[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The maximum and the softmax normaliser of rows seen in chunks, in one pass.

    Args:
        chunks: tensors (..., n_i), consecutive pieces of the rows x (..., n) along the last axis; read
            once, in order (an iterator will do). Scores are finite.

    Returns:
        m: (..., 1) the maximum of each row.
        l: (..., 1) the sum over the row of exp(x - m); so softmax(x) = exp(x - m) / l.
    """
    m = l = None
    for x in chunks:  # (..., c)
        m_chunk = x.amax(dim=-1, keepdim=True)  # (..., 1)
        m_new = m_chunk if m is None else torch.maximum(m, m_chunk)
        l_chunk = torch.exp(x - m_new).sum(dim=-1, keepdim=True)  # (..., 1)
        # The terms summed so far were exp(x - m); against the new maximum each is exp(m - m_new) times that.
        l = l_chunk if l is None else l * torch.exp(m - m_new) + l_chunk
        m = m_new
    if m is None:
        raise ValueError("online_softmax needs at least one chunk")
    return m, l


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_q: int,
    block_k: int,
    causal: bool = False,
) -> torch.Tensor:
    """softmax(q kᵀ / √d_k) v, exactly, one (block_q, block_k) tile of scores at a time.

    Args:
        q: (..., m, d_k) queries.  k: (..., n, d_k) keys.  v: (..., n, d_v) values.
        block_q, block_k: how many queries and keys a tile holds (any positive sizes; the last block of
            each may be shorter).
        causal: query i attends to keys 0 .. i only; key blocks wholly above the diagonal are never computed.

    Returns:
        (..., m, d_v), equal to ``F.scaled_dot_product_attention(q, k, v, is_causal=causal)``. No tensor
        larger than a tile of scores (..., block_q, block_k) or the inputs is ever made.
    """
    for size in (block_q, block_k):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"block sizes must be positive integers, got block_q={block_q!r}, block_k={block_k!r}")
    n = k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1))
    outputs = []
    for i in range(0, q.size(-2), block_q):
        q_i = q[..., i:i + block_q, :] * scale  # (..., bq, d_k)
        rows = q_i.size(-2)
        m_i = q.new_full((*q_i.shape[:-1], 1), float("-inf"))  # (..., bq, 1) running maximum
        l_i = q.new_zeros(*q_i.shape[:-1], 1)  # (..., bq, 1) running sum of exp(s - m_i)
        acc = q.new_zeros(*q_i.shape[:-1], v.size(-1))  # (..., bq, d_v) running sum of exp(s - m_i) v
        # Causal: the block's last query is i + rows - 1, so keys from i + rows on are never needed.
        end = min(n, i + rows) if causal else n
        for j in range(0, end, block_k):
            s = q_i @ k[..., j:j + block_k, :].transpose(-2, -1)  # (..., bq, bk)
            if causal and j + s.size(-1) - 1 > i:  # the tile crosses the diagonal: hide the keys after each query
                query = torch.arange(i, i + rows, device=q.device)[:, None]  # (bq, 1)
                key = torch.arange(j, j + s.size(-1), device=q.device)[None, :]  # (1, bk)
                s = s.masked_fill(key > query, float("-inf"))
            # Key 0 is in the first tile of every row, so m_new is finite from the first tile on.
            m_new = torch.maximum(m_i, s.amax(dim=-1, keepdim=True))  # (..., bq, 1)
            p = torch.exp(s - m_new)  # (..., bq, bk)
            correction = torch.exp(m_i - m_new)  # (..., bq, 1): 0 on the first tile, < 1 when the maximum grew
            l_i = l_i * correction + p.sum(dim=-1, keepdim=True)
            acc = acc * correction + p @ v[..., j:j + block_k, :]  # (..., bq, d_v)
            m_i = m_new
        # One division per row, at the end; a row that saw no key (n = 0) stays zero.
        outputs.append(torch.where(l_i > 0, acc / l_i, 0.0))  # (..., bq, d_v)
    return torch.cat(outputs, dim=-2)  # (..., m, d_v)
