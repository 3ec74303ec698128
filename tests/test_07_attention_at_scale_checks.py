"""The chapter-7 checks pass every correct way of writing the code and name every known mistake, including
a tiled attention that secretly builds the full score matrix, and a causal one that skips no tile.

Each buggy variant is one entry of the chapter's mistake list (or a near relative), written the way a
learner would write it; each test asserts the message that names it.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from autograde_tests.checks import check_online_softmax, check_tiled_attention
from autograde_tests.checks.attention_at_scale import (
    HIDDEN_ONLINE,
    HIDDEN_TILED,
    MAXIMUM_MISTAKES,
    ONLINE_MISTAKES,
    TILED_MISTAKES,
    VISIBLE_ONLINE,
    VISIBLE_TILED,
    _online_input,
    _tiled_inputs,
)
from autograde_tests.reference import causal_mask
from autograde_tests.reference import online_softmax as reference_online_softmax
from autograde_tests.reference import tiled_attention as reference_tiled_attention

from .conftest import fails

pytestmark = pytest.mark.usefixtures("learner_side", "one_thread")  # each test in-process and through the wire

# ------------------------------------------------------------------------ online_softmax: correct


def online_softmax_in_log_space(chunks):
    m = lse = None
    for x in chunks:
        m = x.amax(-1, keepdim=True) if m is None else torch.maximum(m, x.amax(-1, keepdim=True))
        chunk_lse = torch.logsumexp(x, dim=-1, keepdim=True)
        lse = chunk_lse if lse is None else torch.logaddexp(lse, chunk_lse)
    return m, torch.exp(lse - m)


def online_softmax_column_by_column(chunks):
    m, l = float("-inf"), 0.0
    for x in chunks:
        for j in range(x.size(-1)):
            column = x[..., j:j + 1]
            m_new = torch.maximum(torch.as_tensor(m, dtype=x.dtype, device=x.device), column)
            l = l * torch.exp(m - m_new) + torch.exp(column - m_new)
            m = m_new
    return m, l


def online_softmax_by_next_until_exhausted(chunks):
    m = l = None
    while True:
        try:
            x = next(chunks)
        except StopIteration:
            return m, l
        m_new = x.amax(-1, keepdim=True) if m is None else torch.maximum(m, x.amax(-1, keepdim=True))
        terms = torch.exp(x - m_new).sum(-1, keepdim=True)
        l = terms if l is None else l * torch.exp(m - m_new) + terms
        m = m_new


def online_softmax_first_chunk_then_the_rest(chunks):
    chunks = iter(chunks)
    first = next(chunks)
    m = first.amax(-1, keepdim=True)
    l = torch.exp(first - m).sum(-1, keepdim=True)
    for x in chunks:
        m_new = torch.maximum(m, x.amax(-1, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(x - m_new).sum(-1, keepdim=True)
        m = m_new
    return m, l


@pytest.mark.parametrize("online_softmax",
                         [reference_online_softmax, online_softmax_in_log_space, online_softmax_column_by_column,
                          online_softmax_by_next_until_exhausted, online_softmax_first_chunk_then_the_rest])
@pytest.mark.parametrize("hidden", [False, True])
def test_online_softmax_check_passes_correct_variants(online_softmax, hidden, capsys):
    check_online_softmax(online_softmax, hidden=hidden)
    assert "✔ online_softmax" in capsys.readouterr().out


# ----------------------------------------------------------------------- online_softmax: mistakes


def online_softmax_without_rescaling(chunks):
    m = l = None
    for x in chunks:
        m = x.amax(-1, keepdim=True) if m is None else torch.maximum(m, x.amax(-1, keepdim=True))
        terms = torch.exp(x - m).sum(-1, keepdim=True)
        l = terms if l is None else l + terms
    return m, l


def online_softmax_overwriting_the_maximum_first(chunks):
    m = l = None
    for x in chunks:
        m_old = m
        m = x.amax(-1, keepdim=True) if m is None else torch.maximum(m, x.amax(-1, keepdim=True))
        m_old = m  # meant to keep the old one, but too late
        terms = torch.exp(x - m).sum(-1, keepdim=True)
        l = terms if l is None else l * torch.exp(m_old - m) + terms
    return m, l


def online_softmax_rescaling_the_wrong_way(chunks):
    m = l = None
    for x in chunks:
        m_new = x.amax(-1, keepdim=True) if m is None else torch.maximum(m, x.amax(-1, keepdim=True))
        terms = torch.exp(x - m_new).sum(-1, keepdim=True)
        l = terms if l is None else l * torch.exp(m_new - m) + terms
        m = m_new
    return m, l


def online_softmax_forgetting_the_running_maximum(chunks):
    m = l = None
    for x in chunks:
        m_new = x.amax(-1, keepdim=True)  # the chunk's maximum, never compared with m
        terms = torch.exp(x - m_new).sum(-1, keepdim=True)
        l = terms if l is None else l * torch.exp(m - m_new) + terms
        m = m_new
    return m, l


def online_softmax_with_one_maximum_for_all_rows(chunks):
    m = l = None
    for x in chunks:
        if m is None:
            m, l = torch.full_like(x[..., :1], float("-inf")), torch.zeros_like(x[..., :1])
        m_new = torch.maximum(m, x.max())
        l = l * torch.exp(m - m_new) + torch.exp(x - m_new).sum(-1, keepdim=True)
        m = m_new
    return m, l


def online_softmax_keeping_the_last_sum(chunks):
    m = None
    for x in chunks:
        m = x.amax(-1, keepdim=True) if m is None else torch.maximum(m, x.amax(-1, keepdim=True))
        l = torch.exp(x - m).sum(-1, keepdim=True)
    return m, l


def online_softmax_with_each_chunk_against_its_own_maximum(chunks):
    m = l = None
    for x in chunks:
        m_chunk = x.amax(-1, keepdim=True)
        m_new = m_chunk if m is None else torch.maximum(m, m_chunk)
        l_chunk = torch.exp(x - m_chunk).sum(-1, keepdim=True)
        l = l_chunk if l is None else l * torch.exp(m - m_new) + l_chunk
        m = m_new
    return m, l


def online_softmax_in_two_passes(chunks):
    m = None
    for x in chunks:
        m = x.amax(-1, keepdim=True) if m is None else torch.maximum(m, x.amax(-1, keepdim=True))
    l = sum(torch.exp(x - m).sum(-1, keepdim=True) for x in chunks)
    return m, l


def online_softmax_in_two_passes_over_a_kept_list(chunks):
    chunks = list(chunks)
    m = torch.stack([x.amax(-1) for x in chunks], dim=-1).amax(-1, keepdim=True)
    return m, sum(torch.exp(x - m).sum(-1, keepdim=True) for x in chunks)


def online_softmax_joining_the_chunks(chunks):
    x = torch.cat(list(chunks), dim=-1)
    m = x.amax(-1, keepdim=True)
    return m, torch.exp(x - m).sum(-1, keepdim=True)


def online_softmax_without_the_maximum(chunks):
    m = l = None
    for x in chunks:
        m = x.amax(-1, keepdim=True) if m is None else torch.maximum(m, x.amax(-1, keepdim=True))
        l = torch.exp(x).sum(-1, keepdim=True) if l is None else l + torch.exp(x).sum(-1, keepdim=True)
    return m, l / torch.exp(m)


def online_softmax_without_keepdim(chunks):
    m, l = reference_online_softmax(chunks)
    return m.squeeze(-1), l.squeeze(-1)


def online_softmax_shifting_its_input(chunks):
    m = l = None
    for x in chunks:
        m_new = x.amax(-1, keepdim=True) if m is None else torch.maximum(m, x.amax(-1, keepdim=True))
        x -= m_new
        terms = torch.exp(x).sum(-1, keepdim=True)
        l = terms if l is None else l * torch.exp(m - m_new) + terms
        m = m_new
    return m, l


def online_softmax_returning_the_weights(chunks):
    chunks = list(chunks)
    m, l = reference_online_softmax(chunks)
    return [torch.exp(x - m) / l for x in chunks]


@pytest.mark.parametrize(
    "online_softmax, message",
    [
        (online_softmax_without_rescaling, r"running sum was not rescaled when the maximum grew"),
        (online_softmax_overwriting_the_maximum_first, r"not rescaled .* maximum was overwritten before"),
        (online_softmax_rescaling_the_wrong_way, r"rescaled the wrong way, by exp\(m_new - m_old\)"),
        (online_softmax_forgetting_the_running_maximum, r"m is the last chunk's maximum, not the running maximum"),
        (online_softmax_with_one_maximum_for_all_rows, r"m is one maximum for all the rows: .* whole tensor"),
        (online_softmax_keeping_the_last_sum, r"l is the sum of the last chunk only"),
        (online_softmax_with_each_chunk_against_its_own_maximum,
         r"against the chunk's own maximum, exp\(x - chunk max\), while the old sum was rescaled"),
        (online_softmax_in_two_passes, r"reads the chunks 2 times"),
        (online_softmax_in_two_passes_over_a_kept_list, r"went back to chunk 0 after chunk 2: a second pass"),
        (online_softmax_joining_the_chunks,
         r"joined the chunks into whole rows: a float32 tensor of shape \(2, 3, 12\)"),
        (online_softmax_without_the_maximum, r"l is inf or NaN for scores around \+800"),
        (online_softmax_without_keepdim, r"m has shape \(2, 3\), expected \(2, 3, 1\)"),
        (online_softmax_shifting_its_input, r"modified its input `chunks` in place"),
        (online_softmax_returning_the_weights, r"should return a tuple \(m, l\), got list"),
    ],
)
def test_online_softmax_check_names_the_mistake(online_softmax, message, capsys):
    with fails(message):
        check_online_softmax(online_softmax)
    assert "✔" not in capsys.readouterr().out


# ----------------------------------------------------------------------- tiled_attention: correct


def tiled_attention_normalised_accumulator(q, k, v, block_q, block_k, causal=False):
    """Keeps the output normalised after every tile (o = acc / l), rescaling it by l_old / l_new."""
    m, n, d_k = q.size(-2), k.size(-2), q.size(-1)
    rows = []
    for i0 in range(0, m, block_q):
        qb = q[..., i0:i0 + block_q, :]
        o = torch.zeros(*qb.shape[:-1], v.size(-1), dtype=q.dtype, device=q.device)
        row_max = torch.full((*qb.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)
        row_sum = torch.zeros_like(row_max)
        for j0 in range(0, n, block_k):
            if causal and j0 > i0 + qb.size(-2) - 1:
                break
            s = torch.matmul(qb, k[..., j0:j0 + block_k, :].mT) / math.sqrt(d_k)
            if causal:
                allowed = (torch.arange(j0, j0 + s.size(-1), device=q.device)
                           <= torch.arange(i0, i0 + s.size(-2), device=q.device)[:, None])
                s = torch.where(allowed, s, float("-inf"))
            new_max = torch.maximum(row_max, s.max(dim=-1, keepdim=True).values)
            p = torch.exp(s - new_max)
            new_sum = row_sum * torch.exp(row_max - new_max) + p.sum(dim=-1, keepdim=True)
            o = (o * row_sum * torch.exp(row_max - new_max) + p @ v[..., j0:j0 + block_k, :]) / new_sum
            row_max, row_sum = new_max, new_sum
        rows.append(o)
    return torch.cat(rows, dim=-2)


def tiled_attention_with_einsum_and_split(q, k, v, block_q, block_k, causal=False):
    """Blocks from torch.split, scores by einsum, the state of every query block started from its first tile."""
    scale = q.size(-1) ** -0.5
    if k.size(-2) == 0:
        return q.new_zeros(*q.shape[:-1], v.size(-1))
    key_blocks = list(zip(k.split(block_k, dim=-2), v.split(block_k, dim=-2)))
    out = []
    for b, q_block in enumerate(q.split(block_q, dim=-2)):
        first, last = b * block_q, b * block_q + q_block.size(-2) - 1
        kept = key_blocks[: last // block_k + 1] if causal else key_blocks
        mx = total = acc = None
        for c, (k_block, v_block) in enumerate(kept):
            scores = torch.einsum("...id,...jd->...ij", q_block, k_block) * scale
            if causal and (c + 1) * block_k - 1 > first:
                i = torch.arange(first, last + 1, device=q.device).unsqueeze(-1)
                j = torch.arange(c * block_k, c * block_k + k_block.size(-2), device=q.device)
                scores = scores.masked_fill(j > i, float("-inf"))
            tile_max = scores.amax(-1, keepdim=True)
            if mx is None:
                mx = tile_max
                p = (scores - mx).exp()
                total, acc = p.sum(-1, keepdim=True), torch.einsum("...ij,...jd->...id", p, v_block)
            else:
                new = torch.maximum(mx, tile_max)
                alpha, p = (mx - new).exp(), (scores - new).exp()
                total = alpha * total + p.sum(-1, keepdim=True)
                acc = alpha * acc + torch.einsum("...ij,...jd->...id", p, v_block)
                mx = new
        out.append(acc / total)
    return torch.cat(out, dim=-2)


@pytest.mark.parametrize("tiled_attention", [reference_tiled_attention, tiled_attention_normalised_accumulator,
                                             tiled_attention_with_einsum_and_split])
@pytest.mark.parametrize("hidden", [False, True])
def test_tiled_attention_check_passes_correct_variants(tiled_attention, hidden, capsys):
    check_tiled_attention(tiled_attention, hidden=hidden)
    assert "✔ tiled_attention" in capsys.readouterr().out


# ---------------------------------------------------------------------- tiled_attention: mistakes


def learner_tiled(q, k, v, block_q, block_k, causal=False, rescale_acc=True, keep_old_max=True, divide_at_end=True,
                  see_own_key=True, mask_diagonal=True, partial_blocks=True, guard_empty=True, scale_scores=True,
                  top_left=True, include_diagonal_tile=True, stop_by_block_q=True):
    """One learner's tiled attention; each keyword set to False is one mistake of the list."""
    m, n = q.size(-2), k.size(-2)
    q_stop, k_stop = (m, n) if partial_blocks else (m // block_q * block_q, n // block_k * block_k)
    shift = 0 if top_left else n - m  # FlashAttention >= 2.1 lines the diagonal up with the last key
    outs = []
    for i in range(0, q_stop, block_q):
        qi = q[..., i:i + block_q, :]
        mi = torch.full((*qi.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)
        li = torch.zeros_like(mi)
        acc = torch.zeros(*qi.shape[:-1], v.size(-1), dtype=q.dtype, device=q.device)
        end = (i + qi.size(-2) if stop_by_block_q else i + block_k) if include_diagonal_tile else i
        for j in range(0, min(k_stop, end + shift) if causal else k_stop, block_k):
            s = qi @ k[..., j:j + block_k, :].transpose(-2, -1)
            if scale_scores:
                s = s / math.sqrt(q.size(-1))
            if causal and mask_diagonal:
                qpos = torch.arange(i + shift, i + shift + s.size(-2), device=q.device)[:, None]
                kpos = torch.arange(j, j + s.size(-1), device=q.device)
                s = s.masked_fill(kpos > qpos if see_own_key else kpos >= qpos, float("-inf"))
            new_mi = torch.maximum(mi, s.amax(-1, keepdim=True))
            if not keep_old_max:
                mi = new_mi
            p = torch.exp(s - new_mi)
            li = li * torch.exp(mi - new_mi) + p.sum(-1, keepdim=True)
            acc = (acc * torch.exp(mi - new_mi) if rescale_acc else acc) + p @ v[..., j:j + block_k, :]
            if not divide_at_end:
                acc = acc / li
            mi = new_mi
        if not divide_at_end:
            outs.append(acc)
        else:
            outs.append(torch.where(li > 0, acc / li, 0.0) if guard_empty else acc / li)
    return torch.cat(outs, dim=-2)


def with_(**mistake):
    def tiled_attention(q, k, v, block_q, block_k, causal=False):
        return learner_tiled(q, k, v, block_q, block_k, causal, **mistake)
    return tiled_attention


def naive_attention(q, k, v, block_q, block_k, causal=False):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        scores = scores.masked_fill(~causal_mask(max(q.size(-2), k.size(-2)), q.device)[:q.size(-2), :k.size(-2)],
                                    float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v


def tiles_with_a_full_causal_mask(q, k, v, block_q, block_k, causal=False):
    allowed = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
    out = reference_tiled_attention(q, k, v, block_q, block_k)
    return out if not causal else out * allowed.any(-1, keepdim=True)  # uses the mask, wrongly too


def per_head_full_scores(q, k, v, block_q, block_k, causal=False):
    heads = [naive_attention(q[b], k[b], v[b], block_q, block_k, causal) for b in range(q.size(0))]
    return torch.stack(heads)


def tiles_of_every_key(q, k, v, block_q, block_k, causal=False):
    """Blocks of queries against all the keys at once: right values, block_k never used."""
    outs = []
    for i in range(0, q.size(-2), block_q):
        s = q[..., i:i + block_q, :] @ k.mT / math.sqrt(q.size(-1))
        if causal:
            s = s.masked_fill(
                torch.arange(k.size(-2), device=q.device) > torch.arange(i, i + s.size(-2), device=q.device)[:, None],
                float("-inf"))
        outs.append(torch.softmax(s, dim=-1).nan_to_num(0.0) @ v)
    return torch.cat(outs, dim=-2)


def causal_by_masking_every_tile(q, k, v, block_q, block_k, causal=False):
    if not causal:
        return learner_tiled(q, k, v, block_q, block_k, False)
    return masked_everywhere(q, k, v, block_q, block_k)


def masked_everywhere(q, k, v, block_q, block_k):
    """Computes every tile, the ones above the diagonal too, and lets the mask hide them."""
    outs = []
    for i in range(0, q.size(-2), block_q):
        qi = q[..., i:i + block_q, :] / math.sqrt(q.size(-1))
        mi = qi.new_full((*qi.shape[:-1], 1), float("-inf"))
        li, acc = torch.zeros_like(mi), qi.new_zeros(*qi.shape[:-1], v.size(-1))
        for j in range(0, k.size(-2), block_k):
            s = qi @ k[..., j:j + block_k, :].mT
            pos = torch.arange(i, i + s.size(-2), device=q.device)[:, None]
            s = s.masked_fill(torch.arange(j, j + s.size(-1), device=q.device) > pos, float("-inf"))
            new = torch.maximum(mi, s.amax(-1, keepdim=True))
            p, alpha = torch.exp(s - new), torch.exp(mi - new)
            li, acc, mi = li * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v[..., j:j + block_k, :], new
        outs.append(torch.where(li > 0, acc / li, 0.0))
    return torch.cat(outs, dim=-2)


def returning_weights_too(q, k, v, block_q, block_k, causal=False):
    return reference_tiled_attention(q, k, v, block_q, block_k, causal), None


def fused_by_pytorch(q, k, v, block_q, block_k, causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


@pytest.mark.parametrize(
    "tiled_attention, message",
    [
        (with_(rescale_acc=False), r"accumulator was not rescaled when the maximum grew"),
        (with_(keep_old_max=False), r"nothing was rescaled .* maximum was overwritten"),
        (with_(divide_at_end=False), r"divided by the sum after every tile instead of once at the end"),
        (with_(see_own_key=False), r"off by one at the diagonal: .* cannot see its own key"),
        (with_(mask_diagonal=False), r"tiles on the diagonal were not masked"),
        (with_(partial_blocks=False), r"last partial block of (queries|keys) was dropped"),
        (with_(guard_empty=False), r"NaN for queries with no key to attend to \(n = 0\)"),
        (with_(top_left=False), r"aligned to the bottom-right corner: .* FlashAttention >= 2.1's convention"),
        (with_(scale_scores=False), r"scores were not scaled by 1/sqrt\(d_k\)"),
        (with_(include_diagonal_tile=False), r"tile on the diagonal was skipped too"),
        (with_(include_diagonal_tile=False, guard_empty=False), r"tile on the diagonal was skipped too"),  # NaN rows
        (with_(stop_by_block_q=False), r"loop over keys ends at i \+ block_k instead of i \+ block_q"),
        (naive_attention, r"you built the full score matrix: a float32 tensor of shape \(2, 29, 37\) \(aten::"),
        (tiles_with_a_full_causal_mask,
         r"you built the full score matrix \(as a mask\): a bool tensor of shape \(29, 37\)"),
        (per_head_full_scores, r"you built the full score matrix: .* shape \(29, 37\)"),
        (causal_by_masking_every_tile, r"causal attention does 1\d\d% of the work .* leaves about 50%"),
        (fused_by_pytorch, r"calls F.scaled_dot_product_attention"),
        (returning_weights_too, r"the output should be a torch.Tensor, got tuple"),
    ],
)
def test_tiled_attention_check_names_the_mistake(tiled_attention, message, capsys):
    with fails(message):
        check_tiled_attention(tiled_attention)
    assert "✔" not in capsys.readouterr().out


def test_tiles_of_every_key_are_not_called_a_full_score_matrix():
    """A batch of heads each holding (block_q, n) scores can outgrow one head's m·n: named for what it is."""
    with fails(r"your tiles hold every key at once, so block_k is not used: a float32 tensor of shape \(6, 16, 47\)"):
        check_tiled_attention(tiles_of_every_key, hidden=True)


def test_dropping_the_last_partial_key_block_is_named_too():
    def drops_keys(q, k, v, block_q, block_k, causal=False):
        whole = k.size(-2) // block_k * block_k
        return learner_tiled(q, k[..., :whole, :], v[..., :whole, :], block_q, block_k, causal)
    with fails(r"last partial block of keys was dropped"):
        check_tiled_attention(drops_keys)


@pytest.mark.parametrize("case", VISIBLE_TILED + HIDDEN_TILED, ids=str)
def test_every_case_with_keys_watches_memory_unless_one_tile_holds_all_scores(case):
    one_tile = case.block_q >= case.m and case.block_k >= case.n
    assert case.watched_for_memory() == (case.n > 0 and not one_tile)


def differs_somewhere(compute, reference, inputs) -> bool:
    outcomes = []
    for args in inputs:
        got, want = compute(*args), reference(*args)
        outcomes.append(got.shape != want.shape or not torch.allclose(got.nan_to_num(0.0), want, atol=1e-9))
    return any(outcomes)


def test_every_mistake_differs_from_the_reference_on_the_checks_own_cases():
    tiled = [(*_tiled_inputs(i, case, hidden), case.block_q, case.block_k, case.causal)
             for hidden, cases in ((False, VISIBLE_TILED), (True, HIDDEN_TILED)) for i, case in enumerate(cases)]
    for mistake in TILED_MISTAKES:
        assert differs_somewhere(mistake.compute, reference_tiled_attention, tiled), mistake.problem
    chunks = [(list(_online_input(i, case, hidden).split(case.sizes, dim=-1)),)
              for hidden, cases in ((False, VISIBLE_ONLINE), (True, HIDDEN_ONLINE)) for i, case in enumerate(cases)]
    for part, mistakes in ((0, MAXIMUM_MISTAKES), (1, ONLINE_MISTAKES)):
        for mistake in mistakes:
            assert differs_somewhere(lambda c: mistake.compute(c)[part], lambda c: reference_online_softmax(c)[part],
                                     chunks), mistake.problem
