"""A check calls the learner's code in one place (``harness.call``), which compares every tensor it hands
over with a copy taken before the call: code that changes its input in place gets the verdict at that
very call, in learner mode and through the wire alike, and an expected value comes from the input as it
was drawn, whatever the learner's code did to the tensor it was given."""

import pytest
import torch

import autograde_tests.checks.ffn_layernorm_residual as chapter_4
from autograde_tests.checks import check_cross_attention, check_sublayer_connection, harness
from autograde_tests.reference import CrossAttention, SublayerConnection, scaled_dot_product_attention
from autograde_tests.remote.proxy import Session

from .conftest import fails, kernel_stand_in

pytestmark = pytest.mark.usefixtures("learner_side", "one_thread")


def where_the_check_meets(fn, learner_side: str):
    """``fn`` as a check meets it: itself in learner mode, else a proxy of it in a stand-in graded kernel."""
    if learner_side == "in-process":
        return fn
    kernel = kernel_stand_in("attention")
    kernel.namespace["fn"] = fn
    return Session(kernel.handle).lookup("fn")


def softmax_shifting_its_input(x, dim=-1):
    x -= x.amax(dim=dim, keepdim=True)
    return x.exp() / x.exp().sum(dim=dim, keepdim=True)


def attention_flipping_its_mask(q, k, v, mask=None):
    mask.logical_not_()
    return scaled_dot_product_attention(q, k, v, ~mask)


def test_a_changed_input_is_a_verdict_that_names_it_as_the_contract_does(learner_side):
    with fails("^modified its input `x` in place$", hint="^use out-of-place", exercise="softmax",
               verdict=harness.ChangedInput):
        harness.call("softmax", where_the_check_meets(softmax_shifting_its_input, learner_side),
                     torch.randn(2, 3, dtype=torch.float64))


@pytest.mark.parametrize("as_keyword", [False, True])
def test_a_changed_mask_is_a_verdict_with_the_masks_hint(learner_side, as_keyword):
    q, k, v = (torch.randn(2, 3, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([True, True, False]).expand(2, 3, 3).clone()
    attention = where_the_check_meets(attention_flipping_its_mask, learner_side)
    with fails("modified its input `mask` in place$", hint="^use ~mask or torch.where", verdict=harness.ChangedInput):
        if as_keyword:
            harness.call("scaled_dot_product_attention", attention, q, k, v, mask=mask)
        else:
            harness.call("scaled_dot_product_attention", attention, q, k, v, mask)


def test_an_untouched_input_passes_and_the_result_comes_back(learner_side):
    x = torch.randn(2, 3, dtype=torch.float64)
    out = harness.call("softmax", where_the_check_meets(lambda x, dim=-1: x.softmax(dim), learner_side), x)
    torch.testing.assert_close(out, x.softmax(-1))


class ZeroesItsInputOnTheSecondCall(SublayerConnection):
    """Right on its first call; on its second (the check's probe for dropout left on in eval mode) it also
    zeroes its input, which a reference computed afterwards from that very tensor would then be fed."""

    def __init__(self, d_model, dropout=0.0, norm_first=False):
        super().__init__(d_model, dropout, norm_first)
        self.calls = 0

    def forward(self, x, sublayer):
        self.calls += 1
        out = super().forward(x, sublayer)
        if self.calls == 2:
            with torch.no_grad():
                x.zero_()
        return out


def test_the_expected_value_comes_from_the_input_as_drawn(monkeypatch):
    given = []
    for wiring in ("_post", "_pre"):  # what the check computes the expected output with
        original = getattr(chapter_4, wiring)
        monkeypatch.setattr(chapter_4, wiring, lambda x, f, norm, original=original: given.append(x.clone())
                            or original(x, f, norm))
    with fails("^modified its input `x` in place", exercise="SublayerConnection", verdict=harness.ChangedInput):
        check_sublayer_connection(ZeroesItsInputOnTheSecondCall)
    drawn = chapter_4._sublayer_drawn("SublayerConnection", chapter_4.VISIBLE_SUBLAYER[0], False, 0)[-1]
    assert given and all(torch.equal(x, drawn) for x in given)


class CrossAttentionFlippingItsMask(CrossAttention):
    """Right, but it flips the padding mask it was given in place (and uses a flipped copy of that)."""

    def forward(self, x, memory, memory_padding_mask=None):
        if memory_padding_mask is not None:
            memory_padding_mask.logical_not_()
            memory_padding_mask = ~memory_padding_mask
        return super().forward(x, memory, memory_padding_mask)


def test_a_check_that_diagnoses_failed_calls_passes_the_verdict_on_as_it_is():
    """CrossAttention's check explains a call that fails only with a mask; a changed mask is not that."""
    with fails("^modified its input `memory_padding_mask` in place", exercise="CrossAttention",
               verdict=harness.ChangedInput):
        check_cross_attention(CrossAttentionFlippingItsMask)
