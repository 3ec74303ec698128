"""The chapter-2 checks pass every correct way of writing the code and name every known mistake.

Each buggy variant is one entry of the design's mistake list for 02_multi_head_attention (or a near
relative), written the way a learner would write it, mostly as one of this file's correct variants with one
edit (``variant``); each test asserts the message that names it.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograde_tests.checks import check_merge_heads, check_multi_head_attention, check_split_heads
from autograde_tests.checks.multi_head_attention import VISIBLE_MHA
from autograde_tests.reference import MultiHeadAttention as ReferenceMHA
from autograde_tests.reference import scaled_dot_product_attention

from .conftest import fails
from .variants import variant

pytestmark = pytest.mark.usefixtures("learner_side")  # each test in-process and through the wire

# ---------------------------------------------------------------------------- split and merge: correct


def split_view_transpose(x, n_heads):
    B, T, d_model = x.shape
    return x.view(B, T, n_heads, d_model // n_heads).transpose(1, 2)


def split_unflatten_permute(x, n_heads):
    return x.unflatten(-1, (n_heads, -1)).permute(0, 2, 1, 3)


def split_by_chunks(x, n_heads):
    return torch.stack(x.chunk(n_heads, dim=-1), dim=1)


def merge_transpose_contiguous_view(x):
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).contiguous().view(B, T, h * d_k)


def merge_by_concatenation(x):
    return torch.cat(x.unbind(dim=1), dim=-1)


def merge_permute_flatten(x):
    return x.permute(0, 2, 1, 3).flatten(start_dim=2)


@pytest.mark.parametrize("split_heads", [split_view_transpose, split_unflatten_permute, split_by_chunks])
@pytest.mark.parametrize("hidden", [False, True])
def test_split_heads_check_passes_correct_variants(split_heads, hidden, capsys):
    check_split_heads(split_heads, hidden=hidden)
    assert "✔ split_heads" in capsys.readouterr().out


@pytest.mark.parametrize("merge_heads",
                         [merge_transpose_contiguous_view, merge_by_concatenation, merge_permute_flatten])
@pytest.mark.parametrize("hidden", [False, True])
def test_merge_heads_check_passes_correct_variants(merge_heads, hidden, capsys):
    check_merge_heads(merge_heads, hidden=hidden)
    assert "✔ merge_heads" in capsys.readouterr().out


# --------------------------------------------------------------------------- split and merge: mistakes


# The module's tests below use these two too.
split_without_transpose = variant(split_view_transpose, ("T, n_heads", "n_heads, T"), (".transpose(1, 2)", ""))
merge_without_transpose = variant(merge_transpose_contiguous_view, (".transpose(1, 2)", ""))


def split_with_full_size_heads(x, n_heads):
    return x.unsqueeze(1).expand(-1, n_heads, -1, -1)


@pytest.mark.parametrize(
    "split_heads, message",
    [
        (split_without_transpose, r"heads mix positions: .* without the transpose"),
        (
            variant(split_view_transpose, ("n_heads, d_model // n_heads).transpose(1, 2)",
                                           "d_model // n_heads, n_heads).permute(0, 3, 1, 2)")),
            r"every h-th feature",
        ),
        (split_with_full_size_heads, r"each head has d_model = \d+ features instead of d_k = d_model / h"),
        (
            variant(split_view_transpose, (".transpose(1, 2)", ".transpose(1, 2).float()")),
            r"torch.float32 but the inputs are torch.float64",
        ),
    ],
)
def test_split_heads_check_names_the_mistake(split_heads, message):
    with fails(message):
        check_split_heads(split_heads)
    with fails(message):
        check_split_heads(split_heads, hidden=True)


@pytest.mark.parametrize(
    "merge_heads, message",
    [
        (merge_without_transpose, r"merging heads without transposing back"),
        (
            variant(merge_transpose_contiguous_view, (".contiguous()", "")),
            dict(problem=r"view size is not compatible", hint=r"^.*use .reshape"),
        ),
        (variant(merge_permute_flatten, ("0, 2, 1, 3", "0, 2, 3, 1")), r"interleaved feature by feature"),
        (
            variant(merge_by_concatenation, ("torch.cat(x.unbind(dim=1), dim=-1)", "list(x.unbind(dim=1))")),
            r"should be a torch.Tensor, got list",
        ),
    ],
)
def test_merge_heads_check_names_the_mistake(merge_heads, message):
    fields = message if isinstance(message, dict) else dict(problem=message)
    with fails(**fields):
        check_merge_heads(merge_heads)
    with fails(**fields):
        check_merge_heads(merge_heads, hidden=True)


# ------------------------------------------------------------------------------ the module: correct


class TextbookMHA(nn.Module):
    """What most learners write: project, split, attend, merge, project. Buggy variants override one step."""

    def __init__(self, d_model, n_heads, bias=False):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def split(self, t):
        return split_view_transpose(t, self.n_heads)

    def merge(self, t):
        return merge_transpose_contiguous_view(t)

    def scale(self):
        return math.sqrt(self.d_k)

    def forward(self, x, y=None, mask=None):
        if y is None:
            y = x
        q, k, v = self.split(self.w_q(x)), self.split(self.w_k(y)), self.split(self.w_v(y))
        scores = q @ k.transpose(-2, -1) / self.scale()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return self.w_o(self.merge(weights @ v)), weights


class MHAFromChapterOne(TextbookMHA):
    """Reuses chapter 1's attention, and the helpers written earlier in the notebook."""

    def forward(self, x, y=None, mask=None):
        y = x if y is None else y
        q, k, v = (split_unflatten_permute(w(t), self.n_heads)
                   for w, t in ((self.w_q, x), (self.w_k, y), (self.w_v, y)))
        heads, weights = scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(merge_by_concatenation(heads)), weights


class MHAWithEinsum(nn.Module):
    """Heads as an einsum index and a large negative number for masked scores."""

    def __init__(self, d_model, n_heads, bias=False):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        # Created in another order than the contract lists them: the check must not care.
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_q = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, y=None, mask=None):
        y = x if y is None else y
        q = self.w_q(x).unflatten(-1, (self.n_heads, self.d_k))  # (B, m, h, d_k)
        k = self.w_k(y).unflatten(-1, (self.n_heads, self.d_k))
        v = self.w_v(y).unflatten(-1, (self.n_heads, self.d_k))
        scores = torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(~mask, -1e9)
        weights = scores.softmax(dim=-1)
        out = torch.einsum("bhmn,bnhd->bmhd", weights, v).flatten(2)
        return self.w_o(out), weights


class MHAHeadByHead(nn.Module):
    """A loop over heads, each using its own rows of the projection matrices."""

    def __init__(self, d_model, n_heads, bias=False):
        super().__init__()
        self.n_heads = n_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model, bias=bias) for _ in range(4))

    def forward(self, x, y=None, mask=None):
        y = x if y is None else y
        d_k = x.size(-1) // self.n_heads
        outputs, weights = [], []
        for i in range(self.n_heads):
            rows = slice(i * d_k, (i + 1) * d_k)
            q, k, v = (
                F.linear(t, w.weight[rows], None if w.bias is None else w.bias[rows])
                for w, t in ((self.w_q, x), (self.w_k, y), (self.w_v, y))
            )
            head_mask = None if mask is None else mask.expand(x.size(0), self.n_heads, x.size(1), y.size(1))[:, i]
            out, w = scaled_dot_product_attention(q, k, v, head_mask)
            outputs.append(out)
            weights.append(w)
        return self.w_o(torch.cat(outputs, dim=-1)), torch.stack(weights, dim=1)


CORRECT_MHA = [TextbookMHA, MHAFromChapterOne, MHAWithEinsum, MHAHeadByHead]


@pytest.mark.parametrize("module", CORRECT_MHA)
@pytest.mark.parametrize("hidden", [False, True])
def test_mha_check_passes_correct_variants(module, hidden, capsys):
    check_multi_head_attention(module, hidden=hidden)
    assert "✔ MultiHeadAttention" in capsys.readouterr().out


def test_mha_check_passes_the_reference():
    check_multi_head_attention(ReferenceMHA, hidden=True)


def test_mha_visible_check_covers_the_issues_shapes():
    assert any(case.m != case.n for case in VISIBLE_MHA) and all(case.batch > 1 for case in VISIBLE_MHA)
    assert {case.n_heads for case in VISIBLE_MHA} == {1, 2, 4} and {case.bias for case in VISIBLE_MHA} == {True, False}


# ----------------------------------------------------------------------------- the module: mistakes


# The never-prints-a-pass test uses it too.
MergeWithoutTranspose = variant(
    TextbookMHA, ("merge_transpose_contiguous_view", "merge_without_transpose"), method="merge"
)


class KeysReshapedWithQueryLength(TextbookMHA):
    def forward(self, x, y=None, mask=None):
        y = x if y is None else y
        B, m, _ = x.shape
        q = self.w_q(x).view(B, m, self.n_heads, self.d_k).transpose(1, 2)
        k = self.w_k(y).view(B, m, self.n_heads, self.d_k).transpose(1, 2)
        v = self.w_v(y).view(B, m, self.n_heads, self.d_k).transpose(1, 2)
        heads, weights = scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(self.merge(heads)), weights


class SplitBeforeProjection(TextbookMHA):
    def __init__(self, d_model, n_heads, bias=False):
        super().__init__(d_model, n_heads, bias)
        d_k = d_model // n_heads
        self.w_q, self.w_k, self.w_v = (nn.Linear(d_k, d_k, bias=bias) for _ in range(3))

    def forward(self, x, y=None, mask=None):
        y = x if y is None else y
        q, k, v = self.w_q(self.split(x)), self.w_k(self.split(y)), self.w_v(self.split(y))
        heads, weights = scaled_dot_product_attention(q, k, v, mask)
        return self.w_o(self.merge(heads)), weights


class OneHeadSizedProjectionForAllHeads(TextbookMHA):
    def __init__(self, d_model, n_heads, bias=False):
        super().__init__(d_model, n_heads, bias)
        self.w_q, self.w_k, self.w_v = (nn.Linear(d_model, self.d_k, bias=bias) for _ in range(3))

    def split(self, t):
        return t.unsqueeze(1).expand(-1, self.n_heads, -1, -1)


class HeadSizeDModel(TextbookMHA):
    def __init__(self, d_model, n_heads, bias=False):
        super().__init__(d_model, n_heads, bias)
        self.d_k = d_model
        self.w_q, self.w_k, self.w_v = (nn.Linear(d_model, n_heads * d_model, bias=bias) for _ in range(3))
        self.w_o = nn.Linear(n_heads * d_model, d_model, bias=bias)


class BiasOnWhenFalse(TextbookMHA):
    def __init__(self, d_model, n_heads, bias=False):
        super().__init__(d_model, n_heads, bias)
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))


class BiasIgnored(TextbookMHA):
    def __init__(self, d_model, n_heads, bias=False):
        super().__init__(d_model, n_heads, bias=False)


class DefaultBiasTrue(TextbookMHA):
    def __init__(self, d_model, n_heads, bias=True):
        super().__init__(d_model, n_heads, bias)


@pytest.mark.parametrize(
    "module, message",
    [
        (
            variant(TextbookMHA, ("sqrt(self.d_k)", "sqrt(self.n_heads * self.d_k)"), method="scale"),
            r"scaled by sqrt\(d_model\) instead of sqrt\(d_k\)",
        ),
        (
            variant(TextbookMHA, ("split_view_transpose", "split_without_transpose"), method="split"),
            r"heads mix positions: .*without the transpose",
        ),
        (MergeWithoutTranspose, r"merging heads without transposing back"),
        (KeysReshapedWithQueryLength, r"works when m == n but fails .*reshaped with the query length"),
        (SplitBeforeProjection, r"split into heads before the projection"),
        (OneHeadSizedProjectionForAllHeads, r"projecting per head with the wrong size"),
        (HeadSizeDModel, r"head size d_model instead of d_model / h"),
        (BiasOnWhenFalse, r"bias on when bias=False"),
        (DefaultBiasTrue, r"bias on when bias=False"),
        (BiasIgnored, r"ignores bias=True"),
        (variant(TextbookMHA, ('scores.masked_fill(~mask, float("-inf"))', "scores")), r"the mask is ignored"),
        (variant(TextbookMHA, ("), weights", "), weights.mean(dim=1)")), r"the heads' weights were averaged"),
        (
            variant(TextbookMHA, ("self.w_k(y)", "self.w_k(x)"), ("self.w_v(y)", "self.w_v(x)")),
            r"the keys came from x instead of y",
        ),
    ],
)
def test_mha_check_names_the_mistake(module, message):
    with fails(message):
        check_multi_head_attention(module)
    with fails(message):
        check_multi_head_attention(module, hidden=True)


def test_mha_check_never_prints_a_pass_for_wrong_code(capsys):
    with fails():
        check_multi_head_attention(MergeWithoutTranspose)
    assert "✔" not in capsys.readouterr().out


def test_hidden_mha_check_fails_an_answer_fitted_to_the_visible_example():
    visible_shapes = {(case.batch, case.m, case.d_model) for case in VISIBLE_MHA}

    # Right on the shapes of the visible examples, zeros on any other.
    Fitted = variant(TextbookMHA, ("), weights", ") * (tuple(x.shape) in visible_shapes), weights"),
                     visible_shapes=visible_shapes)

    check_multi_head_attention(Fitted)
    with fails():
        check_multi_head_attention(Fitted, hidden=True)


def test_unrecognised_wrong_mha_shows_the_largest_error_and_where():
    OffByABit = variant(TextbookMHA, ("), weights", ") + 0.01, weights"))
    with fails(r"the output and the reference differ:\n  largest error 0.01 at index \("):
        check_multi_head_attention(OffByABit)


def test_mha_check_also_holds_the_learner_to_nn_multihead_attention(monkeypatch):
    from_torch = ReferenceMHA.from_torch.__func__

    def drifted_from_torch(cls, mha):  # a reference that no longer matches torch
        module = from_torch(cls, mha)
        module.w_o.weight.data *= 2
        return module

    monkeypatch.setattr(ReferenceMHA, "from_torch", classmethod(drifted_from_torch))
    with fails(r"the output and nn.MultiheadAttention with the same weights differ"):
        check_multi_head_attention(TextbookMHA)
