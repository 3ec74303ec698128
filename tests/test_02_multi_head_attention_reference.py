"""The chapter-2 reference is proven against nn.MultiheadAttention and against the paper's per-head definition."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from autograde_tests.reference import MultiHeadAttention, merge_heads, scaled_dot_product_attention, split_heads

from .conftest import assert_close
from .strategies import batch_sizes, dtypes, head_widths, heads, lengths, seeds


def torch_mha(d_model, n_heads, bias, dtype, seed):
    torch.manual_seed(seed)
    return nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True, dtype=dtype).eval()


# --------------------------------------------------------------------------- split_heads, merge_heads


@settings(max_examples=40, deadline=None)
@given(batch=batch_sizes, length=st.integers(1, 6), n_heads=heads, d_k=head_widths, dtype=dtypes)
def test_head_i_is_the_ith_block_of_features(batch, length, n_heads, d_k, dtype):
    x = torch.randn(batch, length, n_heads * d_k, dtype=dtype)
    split = split_heads(x, n_heads)
    assert split.shape == (batch, n_heads, length, d_k)
    for i in range(n_heads):
        assert torch.equal(split[:, i], x[..., i * d_k : (i + 1) * d_k])


@settings(max_examples=40, deadline=None)
@given(batch=batch_sizes, length=st.integers(1, 6), n_heads=heads, d_k=head_widths)
def test_merge_heads_undoes_split_heads(batch, length, n_heads, d_k):
    x = torch.randn(batch, length, n_heads * d_k)
    assert torch.equal(merge_heads(split_heads(x, n_heads)), x)
    heads_first = torch.randn(batch, n_heads, length, d_k)
    assert torch.equal(split_heads(merge_heads(heads_first), n_heads), heads_first)


def test_split_heads_accepts_a_non_contiguous_input():
    x = torch.randn(2, 8, 5).transpose(1, 2)  # (2, 5, 8), not contiguous
    assert torch.equal(split_heads(x, 2), split_heads(x.contiguous(), 2))


# ---------------------------------------------------------------------------------- the module


@pytest.mark.parametrize("bias", [False, True])
def test_projections_are_the_contracts_linear_layers(bias):
    mha = MultiHeadAttention(12, 3, bias=bias)
    for name in ("w_q", "w_k", "w_v", "w_o"):
        linear = getattr(mha, name)
        assert type(linear) is nn.Linear and linear.weight.shape == (12, 12)
        assert (linear.bias is not None) == bias
    assert mha.d_k == 4


def test_bias_is_off_by_default():
    assert set(MultiHeadAttention(8, 2).state_dict()) == {f"w_{p}.weight" for p in "qkvo"}


def test_d_model_must_divide_into_heads():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 4)


@st.composite
def mha_inputs(draw):
    """A torch module and inputs with m != n allowed, masks in both of torch's forms, no empty query row."""
    dtype, n_heads, bias = draw(dtypes), draw(heads), draw(st.booleans())
    d_model = n_heads * draw(st.integers(1, 6))
    batch, m, n = draw(batch_sizes), draw(lengths), draw(lengths)
    seed = draw(seeds)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, m, d_model, generator=gen, dtype=dtype)
    y = torch.randn(batch, n, d_model, generator=gen, dtype=dtype)
    blocked_keys = torch.rand(batch, n, generator=gen) < 0.3 if draw(st.booleans()) else None
    blocked_pairs = torch.rand(m, n, generator=gen) < 0.3 if draw(st.booleans()) else None
    if blocked_keys is not None:
        blocked_keys[:, 0] = False  # torch returns NaN for a query that may attend to nothing
    if blocked_pairs is not None:
        blocked_pairs[:, 0] = False
    return torch_mha(d_model, n_heads, bias, dtype, seed), x, y, blocked_keys, blocked_pairs


def allowed(blocked_keys, blocked_pairs):
    """torch's two blocked-is-True masks as one of ours, (B, 1, m, n) with True = may attend."""
    mask = None
    if blocked_pairs is not None:
        mask = ~blocked_pairs
    if blocked_keys is not None:
        keys = ~blocked_keys[:, None, None, :]
        mask = keys if mask is None else mask & keys
    return mask


@settings(max_examples=120, deadline=None)
@given(inputs=mha_inputs())
def test_from_torch_matches_nn_multihead_attention(inputs):
    reference, x, y, blocked_keys, blocked_pairs = inputs
    expected, expected_weights = reference(
        x, y, y, key_padding_mask=blocked_keys, attn_mask=blocked_pairs, need_weights=True, average_attn_weights=False
    )
    output, weights = MultiHeadAttention.from_torch(reference)(x, y, allowed(blocked_keys, blocked_pairs))
    assert output.shape == x.shape and weights.shape == (x.size(0), reference.num_heads, x.size(1), y.size(1))
    assert_close(output, expected)
    assert_close(weights, expected_weights)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_per_head_masks_match_torchs_three_dimensional_attn_mask(dtype):
    B, h, m, n = 2, 4, 3, 5
    reference = torch_mha(8, h, True, dtype, 0)
    x, y = torch.randn(B, m, 8, dtype=dtype), torch.randn(B, n, 8, dtype=dtype)
    mask = torch.rand(B, h, m, n) < 0.7
    mask[..., 0] = True
    expected, _ = reference(x, y, y, attn_mask=~mask.reshape(B * h, m, n))
    assert_close(MultiHeadAttention.from_torch(reference)(x, y, mask)[0], expected)


def test_without_y_it_is_self_attention_like_torch():
    reference = torch_mha(12, 3, False, torch.float64, 1)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    mha = MultiHeadAttention.from_torch(reference)
    output, weights = mha(x)
    assert torch.equal(output, mha(x, x)[0])
    expected, expected_weights = reference(x, x, x, average_attn_weights=False)
    assert_close(output, expected)
    assert_close(weights, expected_weights)


@settings(max_examples=40, deadline=None)
@given(n_heads=heads, m=st.integers(1, 6), n=st.integers(1, 6), bias=st.booleans(), seed=seeds)
def test_it_is_concat_of_heads_times_w_o_as_in_the_paper(n_heads, m, n, bias, seed):
    torch.manual_seed(seed)
    d_model = 4 * n_heads
    mha = MultiHeadAttention(d_model, n_heads, bias=bias).double()
    x, y = torch.randn(2, m, d_model, dtype=torch.float64), torch.randn(2, n, d_model, dtype=torch.float64)
    heads_out = []
    for i in range(n_heads):
        rows = slice(i * mha.d_k, (i + 1) * mha.d_k)  # head i's slice of each projection

        def project(linear, t):
            b = 0.0 if linear.bias is None else linear.bias[rows]
            return t @ linear.weight[rows].T + b

        head, _ = scaled_dot_product_attention(project(mha.w_q, x), project(mha.w_k, y), project(mha.w_v, y))
        heads_out.append(head)
    assert_close(mha(x, y)[0], mha.w_o(torch.cat(heads_out, dim=-1)))


def test_a_query_that_may_attend_to_nothing_gets_zeros_where_torch_gives_nan():
    reference = torch_mha(8, 2, True, torch.float64, 2)
    x, y = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64)
    blocked = torch.zeros(2, 4, dtype=torch.bool)
    blocked[1] = True  # the second sequence of keys is all padding
    torch_output, _ = reference(x, y, y, key_padding_mask=blocked)
    output, weights = MultiHeadAttention.from_torch(reference)(x, y, ~blocked[:, None, None, :])
    assert torch_output[1].isnan().all()
    assert torch.count_nonzero(weights[1]) == 0
    assert_close(output[1], reference.out_proj.bias.expand(3, 8))  # W_O applied to zero heads
    assert_close(output[0], torch_output[0])


def test_from_torch_refuses_what_it_cannot_represent():
    with pytest.raises(ValueError):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4, batch_first=True))
    with pytest.raises(ValueError):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True))
