"""Chapter 4's mistakes are edits of the reference (``harness.edited``): each applies (the checks would not
load otherwise) and computes something other than the reference on at least one of its check's own cases."""

import pytest
import torch

from autograde_tests.checks import ffn_layernorm_residual as checks
from autograde_tests.reference import ffn_layernorm_residual as ref

pytestmark = pytest.mark.usefixtures("one_thread")


def differs(compute, module, *args) -> bool:
    """The mistake ``compute`` returns other numbers than ``module``, the reference, on ``args``; a mistake that
    cannot run on a case (a convolution over the features, where T != d_model) does not show on it."""
    with torch.no_grad():
        want = module(*args)
        try:
            got = compute(module, *args)
        except RuntimeError:
            return False
    return got.shape != want.shape or not torch.allclose(got, want, atol=1e-9)


def drawn(name, visible, hidden, draw):
    """Each case of the check ``name``, visible and hidden, with what the check draws for it (its own helper
    ``draw``, so the numbers here are the check's)."""
    for is_hidden, cases in ((False, visible), (True, hidden)):
        for i, case in enumerate(cases):
            yield case, draw(name, case, is_hidden, i)


def ffn_cases():
    for _, (reference, x) in drawn("PositionwiseFeedForward", checks.VISIBLE_FFN, checks.HIDDEN_FFN, checks._ffn_drawn):
        yield reference, x


def conv_cases():
    for _, (ffn, x) in drawn("ffn_as_conv1d", checks.VISIBLE_CONV, checks.HIDDEN_CONV, checks._conv_drawn):
        yield ref.ffn_as_conv1d(ffn), x


def layer_norm_cases():
    for _, (reference, x) in drawn("LayerNorm", checks.VISIBLE_LAYER_NORM, checks.HIDDEN_LAYER_NORM,
                                   checks._layer_norm_drawn):
        yield reference, x


def sublayer_cases():
    for case, (norm, f, x) in drawn("SublayerConnection", checks.VISIBLE_SUBLAYER, checks.HIDDEN_SUBLAYER,
                                    checks._sublayer_drawn):
        yield checks._reference_connection(norm, case.norm_first), x, f


CHECKS = {  # each check's mistakes, and its cases as (reference module, its float64 CPU inputs ...)
    "PositionwiseFeedForward": (checks.FFN_MISTAKES, ffn_cases),
    "ffn_as_conv1d": (checks.CONV_MISTAKES, conv_cases),
    "LayerNorm": (checks.LAYER_NORM_MISTAKES, layer_norm_cases),
    "SublayerConnection": (checks.SUBLAYER_MISTAKES, sublayer_cases),
}


@pytest.mark.parametrize(("mistake", "cases"), [
    pytest.param(mistake, cases, id=f"{name}: {mistake.problem[:40]}")
    for name, (mistakes, cases) in CHECKS.items() for mistake in mistakes])
def test_a_mistake_shows_on_its_checks_cases(mistake, cases):
    assert any(differs(mistake.compute, *args) for args in cases())


@pytest.mark.parametrize("cases", [cases for _, cases in CHECKS.values()], ids=list(CHECKS))
def test_the_mistakes_are_computed_in_float64(cases):
    for module, x, *_ in cases():
        assert x.dtype == torch.float64 and all(p.dtype == torch.float64 for p in module.parameters())
