"""The chapter-3 checks pass every correct way of writing the code and name every known mistake.

Each buggy variant is one entry of the design's mistake list for 03_attention_variants (or a near
relative), written the way a learner would write it, mostly as one of this file's correct variants with one
edit (``variant``); each test asserts the message that names it.
The learner's modules use the reference MultiHeadAttention, as the chapter-3 notebook does.
"""

import math

import pytest
import torch
from torch import nn

from autograde_tests.checks import (
    check_causal_mask,
    check_causal_self_attention,
    check_cross_attention,
    check_padding_mask,
    check_self_attention,
)
from autograde_tests.reference import (
    CausalSelfAttention,
    CrossAttention,
    MultiHeadAttention,
    SelfAttention,
    causal_mask,
    padding_mask,
)

from .conftest import fails
from .variants import variant

pytestmark = pytest.mark.usefixtures("learner_side")  # each test in-process and through the wire

# -------------------------------------------------------------------------------- causal_mask


def causal_tril(size, device=None):
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def causal_by_comparison(size, device=None):
    i = torch.arange(size, device=device)
    return i[:, None] >= i[None, :]


def causal_not_upper(size, device=None):
    return ~torch.triu(torch.ones(size, size, device=device, dtype=torch.bool), diagonal=1)


def causal_float_then_bool(size, device=None):
    return torch.tril(torch.ones(size, size, device=device)).bool()


@pytest.mark.parametrize("fn", [causal_tril, causal_by_comparison, causal_not_upper, causal_float_then_bool])
@pytest.mark.parametrize("hidden", [False, True])
def test_causal_mask_check_passes_correct_variants(fn, hidden, capsys):
    check_causal_mask(fn, hidden=hidden)
    assert "✔ causal_mask" in capsys.readouterr().out


# CausalSelfAttention's tests use these three too.
causal_without_diagonal = variant(causal_tril, ("tril()", "tril(diagonal=-1)"))
causal_transposed = variant(causal_tril, ("tril()", "triu()"))
causal_blocked_is_true = variant(causal_tril, ("tril()", "triu(diagonal=1)"))
causal_on_the_cpu = variant(causal_tril, (", device=device", ""))  # the how-rules tests use it too


def causal_additive(size, device=None):
    return torch.full((size, size), float("-inf"), device=device).triu(diagonal=1)


@pytest.mark.parametrize(
    "fn, message",
    [
        (causal_without_diagonal, r"excludes the diagonal: a token cannot see itself"),
        (causal_transposed, r"causal mask is transposed"),
        (causal_blocked_is_true, r"mask polarity inverted"),
        (causal_additive, r"returns a float32 mask; the course's masks are bool"),
        (causal_on_the_cpu, r"makes a tensor on a fixed device, which breaks when the inputs are on a GPU"),
    ],
)
def test_causal_mask_check_names_the_mistake(fn, message):
    with fails(message):
        check_causal_mask(fn)
    with fails(message):
        check_causal_mask(fn, hidden=True)


# ------------------------------------------------------------------------------- padding_mask


def padding_by_comparison(lengths, max_len=None):
    max_len = int(lengths.max()) if max_len is None else max_len
    return torch.arange(max_len, device=lengths.device) < lengths[:, None]


def padding_by_loop(lengths, max_len=None):
    max_len = max_len or int(lengths.max())
    mask = torch.zeros(len(lengths), max_len, dtype=torch.bool, device=lengths.device)
    for b, length in enumerate(lengths.tolist()):
        mask[b, :length] = True
    return mask


def padding_expanded(lengths, max_len=None):
    if max_len is None:
        max_len = lengths.max().item()
    positions = torch.arange(max_len, device=lengths.device).expand(len(lengths), max_len)
    return positions < lengths.unsqueeze(1)


@pytest.mark.parametrize("fn", [padding_by_comparison, padding_by_loop, padding_expanded])
@pytest.mark.parametrize("hidden", [False, True])
def test_padding_mask_check_passes_correct_variants(fn, hidden, capsys):
    check_padding_mask(fn, hidden=hidden)
    assert "✔ padding_mask" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, message",
    [
        (variant(padding_by_comparison, (" < ", " >= ")), r"mask polarity inverted: your mask is True on the padding"),
        (variant(padding_by_comparison, (" < ", " <= ")), r"off by one"),
        (variant(padding_by_comparison, (" if max_len is None else max_len", "")), r"ignores max_len"),
        (variant(padding_by_comparison, (", device=lengths.device", "")), r"fixed device"),
        (variant(padding_by_comparison, (") < lengths[:, None]", ")[:, None] < lengths")), r"the mask is transposed"),
        (variant(padding_by_loop, ("dtype=torch.bool, ", "")), r"returns a float32 mask"),
    ],
)
def test_padding_mask_check_names_the_mistake(fn, message):
    with fails(message):
        check_padding_mask(fn)
    with fails(message):
        check_padding_mask(fn, hidden=True)


# --------------------------------------------------------------------------- the modules: correct


class SelfAttentionKeyMask(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, padding_mask=None):
        mask = None if padding_mask is None else padding_mask[:, None, None, :]
        output, _ = self.attn(x, x, mask)
        return output


class SelfAttentionUnsqueezed(SelfAttentionKeyMask):
    def forward(self, x, padding_mask=None):
        if padding_mask is None:
            return self.attn(x)[0]
        return self.attn(x, mask=padding_mask.unsqueeze(1).unsqueeze(2))[0]


class SelfAttentionFullMask(SelfAttentionKeyMask):
    def forward(self, x, padding_mask=None):
        B, T, _ = x.shape
        mask = None
        if padding_mask is not None:
            mask = padding_mask[:, None, :].expand(B, T, T).unsqueeze(1)  # (B, 1, T, T)
        return self.attn(x, y=x, mask=mask)[0]


class CausalWithReferenceMask(SelfAttentionKeyMask):
    def forward(self, x, padding_mask=None):
        mask = causal_mask(x.size(1), device=x.device)
        if padding_mask is not None:
            mask = mask & padding_mask[:, None, None, :]
        return self.attn(x, x, mask)[0]


class CausalLogicalAnd(SelfAttentionKeyMask):
    def forward(self, x, padding_mask=None):
        T = x.size(1)
        mask = torch.ones(T, T, device=x.device).tril().bool()
        if padding_mask is not None:
            mask = torch.logical_and(mask, padding_mask.view(x.size(0), 1, 1, T))
        return self.attn(x, x, mask=mask)[0]


class CausalHideByIndexing(SelfAttentionKeyMask):
    def forward(self, x, padding_mask=None):
        B, T, _ = x.shape
        positions = torch.arange(T, device=x.device)
        mask = (positions[None, :] <= positions[:, None]).expand(B, 1, T, T).clone()
        if padding_mask is not None:
            mask = mask.masked_fill(~padding_mask[:, None, None, :], False)
        return self.attn(x, x, mask)[0]


class CrossKeyMask(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, memory, memory_padding_mask=None):
        mask = None if memory_padding_mask is None else memory_padding_mask[:, None, None, :]
        return self.attn(x, memory, mask)[0]


class CrossView(CrossKeyMask):
    def forward(self, x, memory, memory_padding_mask=None):
        mask = memory_padding_mask
        if mask is not None:
            mask = mask.view(memory.size(0), 1, 1, memory.size(1))
        output, weights = self.attn(x, y=memory, mask=mask)
        return output


class CrossUnsqueezed(CrossKeyMask):
    def forward(self, x, memory, memory_padding_mask=None):
        if memory_padding_mask is None:
            return self.attn(x, memory)[0]
        return self.attn(x, memory, memory_padding_mask.unsqueeze(-2).unsqueeze(-2))[0]


@pytest.mark.parametrize("module",
                         [SelfAttentionKeyMask, SelfAttentionUnsqueezed, SelfAttentionFullMask, SelfAttention])
@pytest.mark.parametrize("hidden", [False, True])
def test_self_attention_check_passes_correct_variants(module, hidden, capsys):
    check_self_attention(module, hidden=hidden)
    assert "✔ SelfAttention" in capsys.readouterr().out


@pytest.mark.parametrize(
    "module", [CausalWithReferenceMask, CausalLogicalAnd, CausalHideByIndexing, CausalSelfAttention]
)
@pytest.mark.parametrize("hidden", [False, True])
def test_causal_self_attention_check_passes_correct_variants(module, hidden, capsys):
    check_causal_self_attention(module, hidden=hidden)
    assert "✔ CausalSelfAttention" in capsys.readouterr().out


@pytest.mark.parametrize("module", [CrossKeyMask, CrossView, CrossUnsqueezed, CrossAttention])
@pytest.mark.parametrize("hidden", [False, True])
def test_cross_attention_check_passes_correct_variants(module, hidden, capsys):
    check_cross_attention(module, hidden=hidden)
    assert "✔ CrossAttention" in capsys.readouterr().out


# ------------------------------------------------------------------- self-attention: mistakes


def _keys(pm):
    return None if pm is None else pm[:, None, None, :]


class SelfAttentionOwnSoftmax(SelfAttentionKeyMask):
    """Writes its own attention on self.attn's projections, with torch.softmax over -inf."""

    def forward(self, x, padding_mask=None):
        a = self.attn
        B, T, d_model = x.shape
        q, k, v = (w(x).view(B, T, a.n_heads, a.d_k).transpose(1, 2) for w in (a.w_q, a.w_k, a.w_v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(a.d_k)
        if padding_mask is not None:
            scores = scores.masked_fill(~padding_mask[:, None, None, :], float("-inf"))
        heads = torch.softmax(scores, dim=-1) @ v
        return a.w_o(heads.transpose(1, 2).reshape(B, T, d_model))


class SelfAttentionWithOwnParameters(SelfAttentionKeyMask):
    def __init__(self, d_model, n_heads):
        super().__init__(d_model, n_heads)
        self.scale = nn.Parameter(torch.ones(1))


class SelfAttentionWithoutAttn(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.mha = MultiHeadAttention(d_model, n_heads)

    def forward(self, x, padding_mask=None):
        return self.mha(x, x, _keys(padding_mask))[0]


SELF_MISTAKES = [
    (variant(SelfAttentionKeyMask, ("[:, None, None, :]", "[:, None, :, None]")), r"on the query axis"),
    (
        variant(SelfAttentionKeyMask, ("padding_mask[:, None, None, :]", "padding_mask")),
        r"not broadcast over heads and query positions",
    ),
    (variant(SelfAttentionKeyMask, ("self.attn(x, x, mask)", "self.attn(x, x)")), r"the padding mask is ignored"),
    (variant(SelfAttentionKeyMask, ("else padding_mask", "else ~padding_mask")), r"mask polarity inverted"),
    (CausalWithReferenceMask, r"SelfAttention hides the future"),  # a correct CausalSelfAttention
    (SelfAttentionOwnSoftmax, r"NaN for a fully padded sequence"),
    (SelfAttentionWithOwnParameters, r"has parameters the reference does not: scale"),
    (SelfAttentionWithoutAttn, r"has no attribute `attn`"),
    (variant(SelfAttentionKeyMask, ("output, _ =", "output =")), r"should be a torch.Tensor, got tuple"),
]


@pytest.mark.parametrize("module, message", SELF_MISTAKES)
def test_self_attention_check_names_the_mistake(module, message):
    with fails(message):
        check_self_attention(module)
    with fails(message):
        check_self_attention(module, hidden=True)


# ------------------------------------------------------------ causal self-attention: mistakes


CAUSAL_MISTAKES = [
    (variant(CausalWithReferenceMask, ("causal_mask(", "causal_without_diagonal(")), r"excludes the diagonal"),
    (variant(CausalWithReferenceMask, ("causal_mask(", "causal_transposed(")), r"causal mask is transposed"),
    (variant(CausalWithReferenceMask, ("causal_mask(", "causal_blocked_is_true(")), r"polarity inverted"),
    (SelfAttentionKeyMask, r"the future is visible"),  # a correct SelfAttention, which has no causal mask
    (
        variant(CausalWithReferenceMask, ("mask & padding_mask[:, None, None, :]", "mask")),
        r"the padding mask is ignored",
    ),
    (
        variant(CausalWithReferenceMask, ("mask & padding_mask", "mask | padding_mask")),
        r"combined with \| \(or\) instead of & \(and\)",
    ),
    (variant(CausalWithReferenceMask, ("[:, None, None, :]", "[:, None, :, None]")), r"on the query axis"),
    (
        variant(CausalWithReferenceMask, ("padding_mask[:, None, None, :]", "padding_mask")),
        r"not broadcast over heads and query positions",
    ),
    (variant(CausalWithReferenceMask, (", device=x.device", "")), r"fixed device"),
]


@pytest.mark.parametrize("module, message", CAUSAL_MISTAKES)
def test_causal_self_attention_check_names_the_mistake(module, message):
    with fails(message):
        check_causal_self_attention(module)
    with fails(message):
        check_causal_self_attention(module, hidden=True)


# ------------------------------------------------------------------ cross-attention: mistakes


CROSS_MISTAKES = [
    (variant(CrossKeyMask, ("self.attn(x, memory, mask)", "self.attn(memory, x, mask)")), r"roles swapped"),
    (
        variant(CrossKeyMask, ("self.attn(x, memory, mask)", "self.attn(x, memory)")),
        r"without the source padding mask",
    ),
    (
        variant(CrossKeyMask, ("memory_padding_mask[:, None, None, :]", "memory_padding_mask")),
        r"not broadcast over heads",
    ),
    (
        variant(CrossKeyMask, ("[:, None, None, :]", "[:, None, :, None]")),
        r"or it is applied on the query axis",
    ),
    (
        variant(CrossKeyMask, ("else memory_padding_mask", "else ~memory_padding_mask")),
        r"mask polarity inverted",
    ),
    (variant(CrossKeyMask, ("self.attn(x, memory, mask)", "self.attn(x)")), r"the memory is ignored"),
]


@pytest.mark.parametrize("module, message", CROSS_MISTAKES)
def test_cross_attention_check_names_the_mistake(module, message):
    with fails(message):
        check_cross_attention(module)
    with fails(message):
        check_cross_attention(module, hidden=True)


# -------------------------------------------------------------------------------- properties


def test_variant_checks_never_print_a_pass_for_wrong_code(capsys):
    for check, module in (
        (check_self_attention, SELF_MISTAKES[0][0]),
        (check_causal_self_attention, CAUSAL_MISTAKES[1][0]),
        (check_cross_attention, CROSS_MISTAKES[1][0]),
    ):
        with fails():
            check(module)
    assert "✔" not in capsys.readouterr().out


def test_an_unlisted_peek_at_the_future_fails_on_the_causal_property():
    one_ahead = variant(causal_tril, ("tril()", "tril(diagonal=1)"))
    PeeksOneAhead = variant(CausalWithReferenceMask, ("causal_mask(", "one_ahead("), one_ahead=one_ahead)

    with fails(r"changed the outputs at positions 0 \.\. \d+: the future is visible"):
        check_causal_self_attention(PeeksOneAhead)


def test_an_unlisted_leak_from_padding_fails_on_the_padding_property():
    class LeaksPaddedKeys(SelfAttentionKeyMask):
        def forward(self, x, padding_mask=None):
            if padding_mask is not None:
                padding_mask = padding_mask.clone()
                padding_mask[:, -1] = True  # the last position always counts as real
            return self.attn(x, x, _keys(padding_mask))[0]

    with fails(r"changing padded tokens changed the outputs at real positions"):
        check_self_attention(LeaksPaddedKeys)


def test_an_unlisted_order_dependence_fails_on_the_permutation_property():
    FavoursTheFirstPosition = variant(SelfAttentionKeyMask, ("return output", "return output + x[:, :1]"))

    with fails(r"must be permutation-equivariant"):
        check_self_attention(FavoursTheFirstPosition)


def test_an_unlisted_order_dependence_in_the_memory_fails_on_the_memory_order_property():
    UsesTheFirstMemoryToken = variant(CrossKeyMask, ("[0]", "[0] + memory[:, :1]"))

    with fails(r"reordering the memory .* changed the output"):
        check_cross_attention(UsesTheFirstMemoryToken)


def test_the_reference_masks_pass():
    check_causal_mask(causal_mask, hidden=True)
    check_padding_mask(padding_mask, hidden=True)


# ------------------------------------------------------------------- deviations seen in real code


def attend_filling_minus_1e9(attn, x, y, key_mask):
    """Attention written by hand with the reference's projections, masked scores set to -1e9 (the
    Annotated Transformer's choice), no zeroing afterwards."""
    split = lambda t: t.reshape(t.size(0), t.size(1), attn.n_heads, -1).transpose(1, 2)  # noqa: E731
    q, k, v = split(attn.w_q(x)), split(attn.w_k(y)), split(attn.w_v(y))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask[:, None, None, :], -1e9)
    heads = scores.softmax(-1) @ v
    return attn.w_o(heads.transpose(1, 2).reshape(x.shape))


class SelfAttentionFillingMinus1e9(SelfAttention):
    def forward(self, x, padding_mask=None):
        return attend_filling_minus_1e9(self.attn, x, x, padding_mask)


class CrossAttentionFillingMinus1e9(CrossAttention):
    def forward(self, x, memory, memory_padding_mask=None):
        return attend_filling_minus_1e9(self.attn, x, memory, memory_padding_mask)


UNIFORM = (r"^a query whose keys are all masked gets uniform weights instead of zeros: the scores were filled "
           r"with a large negative number")


def test_a_large_negative_fill_is_named_in_self_attention():
    with fails(UNIFORM, exercise="SelfAttention"):
        check_self_attention(SelfAttentionFillingMinus1e9)


def test_a_large_negative_fill_is_named_in_cross_attention_not_blamed_on_the_mask_s_shape():
    with fails(UNIFORM, exercise="CrossAttention") as failure:
        check_cross_attention(CrossAttentionFillingMinus1e9)
    assert "(B, 1, 1, n)" not in failure.value.problem + (failure.value.hint or "")
