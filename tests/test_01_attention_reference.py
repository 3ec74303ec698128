"""The chapter-1 reference is proven against PyTorch's own softmax and scaled_dot_product_attention."""

import math

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from autograde_tests.reference import scaled_dot_product_attention, softmax

from .conftest import assert_close
from .strategies import batches, dtypes, generators, seeds, sizes


@settings(max_examples=60, deadline=None)
@given(batch=batches, size=sizes, dtype=dtypes, seed=seeds, data=st.data())
def test_softmax_matches_torch_softmax_on_every_axis(batch, size, dtype, seed, data):
    x = torch.randn(*batch, size, 3, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    dim = data.draw(st.integers(-x.dim(), x.dim() - 1))
    assert_close(softmax(x, dim=dim), torch.softmax(x, dim=dim))


def test_softmax_is_stable_for_huge_scores():
    x = torch.tensor([[1000.0, 1001.0, 999.0], [-1000.0, -1001.0, -999.0]])
    assert_close(softmax(x), torch.softmax(x, dim=-1))


def test_softmax_gives_minus_inf_scores_zero_weight():
    x = torch.tensor([[0.5, float("-inf"), -0.25]])
    assert_close(softmax(x), torch.softmax(x, dim=-1))
    assert softmax(x)[0, 1] == 0.0


def test_softmax_of_an_all_minus_inf_row_is_nan_like_torch():
    x = torch.full((2, 4), float("-inf"))
    torch.testing.assert_close(softmax(x), torch.softmax(x, dim=-1), equal_nan=True)


@st.composite
def attention_inputs(draw):
    batch, dtype = draw(batches), draw(dtypes)
    m, n, d_k, d_v = (draw(sizes) for _ in range(4))
    gen = draw(generators)
    q = torch.randn(*batch, m, d_k, generator=gen, dtype=dtype)
    k = torch.randn(*batch, n, d_k, generator=gen, dtype=dtype)
    v = torch.randn(*batch, n, d_v, generator=gen, dtype=dtype)
    mask_shape = draw(st.sampled_from([None, (m, n), (*batch, 1, n), (*batch, m, n), (1, n)]))
    mask = None if mask_shape is None else torch.rand(mask_shape, generator=gen) < draw(st.floats(0.0, 1.0))
    return q, k, v, mask


@settings(max_examples=150, deadline=None)
@given(inputs=attention_inputs())
def test_attention_matches_torch_sdpa(inputs):
    q, k, v, mask = inputs
    output, _ = scaled_dot_product_attention(q, k, v, mask)
    assert_close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@settings(max_examples=150, deadline=None)
@given(inputs=attention_inputs())
def test_attention_weights_are_torch_softmax_of_masked_scaled_scores(inputs):
    q, k, v, mask = inputs
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    expected = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert_close(weights, expected)


def test_fully_masked_query_gets_zero_weights_and_zero_output_like_torch():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    output, weights = scaled_dot_product_attention(q, k, v, mask)
    assert not output.isnan().any() and not weights.isnan().any()
    assert torch.count_nonzero(weights[:, 1]) == 0 and torch.count_nonzero(output[:, 1]) == 0
    assert_close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_attention_weights_rows_sum_to_one():
    q, k, v = torch.randn(4, 7, 8), torch.randn(4, 5, 8), torch.randn(4, 5, 3)
    _, weights = scaled_dot_product_attention(q, k, v)
    assert_close(weights.sum(-1), torch.ones(4, 7))


def test_fully_masked_queries_behave_as_the_book_says_pytorch_does():
    """Chapters 1 and 3 say what PyTorch (the pinned version) gives a query that may attend to nothing."""
    torch.manual_seed(0)
    q = torch.randn(1, 2, 3, 4)
    allowed = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    allowed[..., 1, :] = False
    assert torch.equal(F.scaled_dot_product_attention(q, q, q, attn_mask=allowed)[..., 1, :], torch.zeros(1, 2, 4))
    assert torch.equal(scaled_dot_product_attention(q, q, q, allowed)[0][..., 1, :], torch.zeros(1, 2, 4))
    attention = torch.nn.MultiheadAttention(4, 2, batch_first=True)
    x = torch.randn(2, 3, 4)
    blocked = torch.tensor([[False] * 3, [True] * 3])  # nn.MultiheadAttention: True = padding
    output, _ = attention(x, x, x, key_padding_mask=blocked)  # need_weights=True, the default
    assert output[1].isnan().all() and not output[0].isnan().any()
    attention.eval()
    with torch.no_grad():  # the fast inference path
        output, _ = attention(x, x, x, key_padding_mask=blocked, need_weights=False)
    assert output[1].isnan().all()
