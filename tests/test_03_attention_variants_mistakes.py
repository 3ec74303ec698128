"""Chapter 3's mistakes are edits of the reference (``harness.edited``), or another variant's reference: each
applies (the checks would not load otherwise) and computes something other than the reference on at least one
of its check's own cases, in float64."""

import pytest
import torch

from autograde_tests.checks import attention_variants as checks
from autograde_tests.reference import attention_variants as ref

from .mistake_shows import differs

pytestmark = pytest.mark.usefixtures("one_thread")



def computed(mistake, *args):
    """What the mistake computes, or None where it cannot run (a (B, n) mask that does not broadcast): the
    check skips it there, so it must show on another case."""
    try:
        return mistake.compute(*args)
    except RuntimeError:
        return None


@pytest.mark.parametrize("mistake", checks.CAUSAL_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_causal_mask_mistake_shows_on_the_checks_cases(mistake):
    sizes = checks.VISIBLE_SIZES + checks.HIDDEN_SIZES
    assert any(not torch.equal(mistake.compute(size), ref.causal_mask(size)) for size in sizes)


def mask_cases():
    for values, max_len in checks.VISIBLE_LENGTHS + checks.HIDDEN_LENGTHS:
        yield torch.tensor(values), max(values) if max_len is None else max_len


@pytest.mark.parametrize("mistake", checks.PADDING_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_padding_mask_mistake_shows_on_the_checks_cases(mistake):
    assert any(not torch.equal(mistake.compute(*args), ref.padding_mask(*args)) for args in mask_cases())


def variant_cases(variant):
    """The reference module and the forward's arguments of each of the variant's cases, visible and hidden, drawn
    as the check draws them (its own ``_drawn``)."""
    for hidden, cases in ((False, variant.visible), (True, variant.hidden)):
        for i, case in enumerate(cases):
            module, inputs = checks._drawn(variant, hidden, i, case)
            yield module, checks._arguments(variant, *inputs)


VARIANTS = (checks.SELF, checks.CAUSAL, checks.CROSS)


@pytest.mark.parametrize("variant, mistake", [(v, m) for v in VARIANTS for m in v.mistakes],
                         ids=lambda x: getattr(x, "name", None) or x.problem[:40])
def test_a_module_mistake_shows_on_the_checks_cases(variant, mistake):
    with torch.no_grad():
        results = [(computed(mistake, module, *args), module(*args)) for module, args in variant_cases(variant)]
    assert any(got is not None and differs(got, want) for got, want in results)


def test_every_mistake_is_an_edit_or_another_variant_s_reference():
    """No mistake is computed by a second copy of the reference: each is the reference with its source edited
    (compiled as ``<..., edited>``) or the forward of another variant."""
    mistakes = [(None, m) for m in checks.CAUSAL_MISTAKES + checks.PADDING_MISTAKES]
    mistakes += [(v.reference.forward, m) for v in VARIANTS for m in v.mistakes]
    answers = {ref.SelfAttention.forward, ref.CausalSelfAttention.forward}
    for own, mistake in mistakes:
        edit = mistake.compute.__code__.co_filename.endswith(", edited>")
        assert edit or mistake.compute in answers - {own}, mistake.problem
