"""The chapter-3 reference is proven against nn.MultiheadAttention and nn.Transformer's masks, and by its properties."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from autograde_tests.reference import (
    CausalSelfAttention,
    CrossAttention,
    MultiHeadAttention,
    SelfAttention,
    causal_mask,
    padding_mask,
)

from .conftest import assert_close
from .strategies import batch_sizes, dtypes, generators, head_widths, heads, lengths, seeds

# ------------------------------------------------------------------------------------------ masks


@pytest.mark.parametrize("size", [1, 2, 5, 9])
def test_causal_mask_allows_what_torchs_subsequent_mask_does_not_block(size):
    additive = nn.Transformer.generate_square_subsequent_mask(size)  # 0 = attend, -inf = blocked
    mask = causal_mask(size)
    assert mask.dtype == torch.bool and mask.shape == (size, size)
    assert torch.equal(mask, additive == 0)


def test_causal_mask_lets_each_position_see_itself_and_the_past():
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_causal_mask_is_made_on_the_device_asked_for():
    assert causal_mask(4).device.type == "cpu"
    assert causal_mask(4, device="meta").device.type == "meta"
    assert causal_mask(4, device=torch.device("meta")).device.type == "meta"


def test_padding_mask_is_true_for_real_tokens():
    mask = padding_mask(torch.tensor([3, 1, 4]))
    assert mask.dtype == torch.bool
    assert mask.tolist() == [
        [True, True, True, False],
        [True, False, False, False],
        [True, True, True, True],
    ]


def test_padding_mask_pads_to_max_len_and_accepts_a_list():
    assert padding_mask([2, 0], max_len=3).tolist() == [[True, True, False], [False, False, False]]


def test_padding_mask_is_made_on_the_device_of_the_lengths():
    assert padding_mask(torch.tensor([1, 2], device="meta"), max_len=3).device.type == "meta"


# ------------------------------------------------------------------------- modules against torch


@st.composite
def sequences(draw, same_length=True):
    """A module size, a batch of padded sequences (no sequence empty) and a second one for cross-attention."""
    dtype, n_heads = draw(dtypes), draw(heads)
    d_model = n_heads * draw(head_widths)
    batch, m = draw(batch_sizes, label="batch"), draw(lengths, label="m")
    n = m if same_length else draw(lengths, label="n")
    real_lengths = torch.tensor([draw(st.integers(1, n)) for _ in range(batch)])
    gen = draw(generators)
    x = torch.randn(batch, m, d_model, generator=gen, dtype=dtype)
    memory = torch.randn(batch, n, d_model, generator=gen, dtype=dtype)
    real = padding_mask(real_lengths, n) if draw(st.booleans()) else None
    return d_model, n_heads, x, memory, real


def torch_twin(module):
    """An nn.MultiheadAttention with ``module.attn``'s weights."""
    attn = module.attn
    twin = nn.MultiheadAttention(attn.d_model, attn.n_heads, bias=False, batch_first=True)
    twin = twin.to(dtype=attn.w_q.weight.dtype).eval()
    with torch.no_grad():
        twin.in_proj_weight.copy_(torch.cat([attn.w_q.weight, attn.w_k.weight, attn.w_v.weight]))
        twin.out_proj.weight.copy_(attn.w_o.weight)
    return twin


def blocked(real):
    return None if real is None else ~real  # nn.MultiheadAttention: True = blocked


@settings(max_examples=60, deadline=None)
@given(inputs=sequences())
def test_self_attention_matches_torch_with_the_key_padding_mask_inverted(inputs):
    d_model, n_heads, x, _, real = inputs
    module = SelfAttention(d_model, n_heads).to(x.dtype)
    expected, _ = torch_twin(module)(x, x, x, key_padding_mask=blocked(real))
    assert_close(module(x, real), expected)


@settings(max_examples=60, deadline=None)
@given(inputs=sequences())
def test_causal_self_attention_matches_torch_with_the_subsequent_mask(inputs):
    d_model, n_heads, x, _, real = inputs
    module = CausalSelfAttention(d_model, n_heads).to(x.dtype)
    future = nn.Transformer.generate_square_subsequent_mask(x.size(1)) != 0  # True = blocked
    expected, _ = torch_twin(module)(x, x, x, attn_mask=future, key_padding_mask=blocked(real))
    assert_close(module(x, real), expected)


@settings(max_examples=60, deadline=None)
@given(inputs=sequences(same_length=False))
def test_cross_attention_matches_torch_with_queries_from_x_and_keys_from_memory(inputs):
    d_model, n_heads, x, memory, real = inputs
    module = CrossAttention(d_model, n_heads).to(x.dtype)
    expected, _ = torch_twin(module)(x, memory, memory, key_padding_mask=blocked(real))
    output = module(x, memory, real)
    assert output.shape == x.shape
    assert_close(output, expected)


def test_each_variant_holds_a_bias_free_multi_head_attention_as_attn():
    for cls in (SelfAttention, CausalSelfAttention, CrossAttention):
        module = cls(8, 2)
        assert isinstance(module.attn, MultiHeadAttention)
        assert set(module.state_dict()) == {f"attn.w_{p}.weight" for p in "qkvo"}


# --------------------------------------------------------------------------------- properties


@settings(max_examples=40, deadline=None)
@given(inputs=sequences(), cut=st.integers(0, 6))
def test_changing_future_tokens_never_changes_earlier_causal_outputs(inputs, cut):
    d_model, n_heads, x, _, real = inputs
    cut = min(cut, x.size(1) - 1)
    module = CausalSelfAttention(d_model, n_heads).to(x.dtype)
    changed = x.clone()
    changed[:, cut + 1 :] = torch.randn_like(changed[:, cut + 1 :])
    assert_close(module(changed, real)[:, : cut + 1], module(x, real)[:, : cut + 1])


@settings(max_examples=40, deadline=None)
@given(inputs=sequences())
def test_changing_padded_tokens_never_changes_self_attention_outputs_at_real_positions(inputs):
    d_model, n_heads, x, _, real = inputs
    real = torch.ones(x.shape[:2], dtype=torch.bool) if real is None else real
    noisy = torch.where(real[..., None], x, torch.randn_like(x))
    keep = real[..., None]
    for cls in (SelfAttention, CausalSelfAttention):
        module = cls(d_model, n_heads).to(x.dtype)
        assert_close(module(noisy, real) * keep, module(x, real) * keep)


@settings(max_examples=40, deadline=None)
@given(inputs=sequences(same_length=False))
def test_changing_padded_memory_tokens_never_changes_cross_attention_outputs(inputs):
    d_model, n_heads, x, memory, real = inputs
    real = torch.ones(memory.shape[:2], dtype=torch.bool) if real is None else real
    noisy = torch.where(real[..., None], memory, torch.randn_like(memory))
    module = CrossAttention(d_model, n_heads).to(x.dtype)
    assert_close(module(x, noisy, real), module(x, memory, real))


@settings(max_examples=40, deadline=None)
@given(inputs=sequences(), seed=seeds)
def test_self_attention_without_positions_is_permutation_equivariant(inputs, seed):
    d_model, n_heads, x, _, real = inputs
    order = torch.randperm(x.size(1), generator=torch.Generator().manual_seed(seed))
    module = SelfAttention(d_model, n_heads).to(x.dtype)
    permuted = module(x[:, order], None if real is None else real[:, order])
    assert_close(permuted, module(x, real)[:, order])


def test_a_fully_padded_sequence_gives_zeros_not_nan():
    x, memory = torch.randn(2, 4, 8), torch.randn(2, 5, 8)
    real = padding_mask(torch.tensor([0, 3]), 4)
    real_memory = padding_mask(torch.tensor([5, 0]), 5)
    for output in (
        SelfAttention(8, 2)(x, real),
        CausalSelfAttention(8, 2)(x, real),
        CrossAttention(8, 2)(x, memory, real_memory),
    ):
        assert not output.isnan().any()
    assert torch.count_nonzero(SelfAttention(8, 2)(x, real)[0]) == 0
    assert torch.count_nonzero(CrossAttention(8, 2)(x, memory, real_memory)[1]) == 0


def test_modules_make_their_masks_on_the_inputs_device():
    x = torch.randn(2, 4, 8, device="meta")
    real = torch.ones(2, 4, dtype=torch.bool, device="meta")
    for module in (SelfAttention(8, 2), CausalSelfAttention(8, 2)):
        assert module.to("meta")(x, real).device.type == "meta"
    assert CrossAttention(8, 2).to("meta")(x, x[:, :3], real[:, :3]).device.type == "meta"
