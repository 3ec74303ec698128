"""The chapter-7 reference is proven against PyTorch's own: torch.softmax for the online softmax, and
F.scaled_dot_product_attention for tiled attention, causal or not, with m != n and ragged blocks."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from autograde_tests.reference import causal_mask, online_softmax, tiled_attention

from .conftest import assert_close
from .strategies import batches, dtypes, generators, seeds


@settings(max_examples=60, deadline=None)
@given(batch=batches, sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5), dtype=dtypes,
       seed=seeds)
def test_online_softmax_gives_the_maximum_and_normaliser_of_torch_softmax(batch, sizes, dtype, seed):
    x = 3 * torch.randn(*batch, sum(sizes), generator=torch.Generator().manual_seed(seed), dtype=dtype)
    m, l = online_softmax(iter(x.split(sizes, dim=-1)))  # an iterator: one pass
    assert_close(m, x.amax(dim=-1, keepdim=True))
    assert_close(torch.exp(x - m) / l, torch.softmax(x, dim=-1))


def test_online_softmax_rescales_the_sum_when_a_later_chunk_holds_the_maximum():
    x = torch.tensor([[0.0, 1.0, 50.0, 2.0]], dtype=torch.float64)
    m, l = online_softmax([x[:, :2], x[:, 2:]])
    assert m.item() == 50.0
    assert_close(l, torch.exp(x - 50.0).sum(-1, keepdim=True))


def test_online_softmax_refuses_no_chunks():
    with pytest.raises(ValueError, match="at least one chunk"):
        online_softmax([])


@st.composite
def attention_inputs(draw):
    batch, dtype = draw(batches), draw(dtypes)
    m, n, d_k, d_v = (draw(st.integers(1, 19)) for _ in range(4))
    gen = draw(generators)
    q, k, v = (torch.randn(*batch, rows, d, generator=gen, dtype=dtype) for rows, d in ((m, d_k), (n, d_k), (n, d_v)))
    return q, k, v, draw(st.integers(1, 8)), draw(st.integers(1, 8))


@settings(max_examples=120, deadline=None)
@given(inputs=attention_inputs(), causal=st.booleans())
def test_tiled_attention_matches_torch_sdpa(inputs, causal):
    q, k, v, block_q, block_k = inputs
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert_close(tiled_attention(q, k, v, block_q, block_k, causal=causal), expected)


@pytest.mark.parametrize("m, n", [(5, 9), (9, 5), (7, 7)])
def test_causal_means_the_course_causal_mask_cut_to_m_by_n(m, n):
    q, k, v = (torch.randn(2, m, 4, dtype=torch.float64), torch.randn(2, n, 4, dtype=torch.float64),
               torch.randn(2, n, 3, dtype=torch.float64))
    mask = causal_mask(max(m, n))[:m, :n]  # query i sees keys 0 .. i
    assert_close(tiled_attention(q, k, v, 2, 3, causal=True), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_queries_with_no_key_get_a_zero_output_like_torch():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 0, 4), torch.randn(2, 0, 5)
    for causal in (False, True):
        out = tiled_attention(q, k, v, 2, 2, causal=causal)
        assert torch.equal(out, torch.zeros(2, 3, 5))
        assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal))


def test_tiled_attention_is_exact_when_one_tile_holds_everything():
    q, k, v = (torch.randn(3, 6, 8, dtype=torch.float64), torch.randn(3, 10, 8, dtype=torch.float64),
               torch.randn(3, 10, 2, dtype=torch.float64))
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    assert_close(tiled_attention(q, k, v, 64, 64), weights @ v)


def test_tiled_attention_gradients_match_torch_sdpa():
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(2, rows, d, generator=gen, dtype=torch.float64, requires_grad=True)
              for rows, d in ((7, 4), (9, 4), (9, 3))]
    ours = torch.autograd.grad(tiled_attention(*inputs, 3, 4, causal=True).sum(), inputs)
    theirs = torch.autograd.grad(F.scaled_dot_product_attention(*inputs, is_causal=True).sum(), inputs)
    for a, b in zip(ours, theirs):
        assert_close(a, b)


@pytest.mark.parametrize("block_q, block_k", [(0, 4), (4, -1), (2.0, 4), (True, 4)])
def test_tiled_attention_refuses_block_sizes_that_are_not_positive_integers(block_q, block_k):
    q = torch.randn(1, 4, 2)
    with pytest.raises(ValueError, match="block sizes must be positive integers"):
        tiled_attention(q, q, q, block_q, block_k)
