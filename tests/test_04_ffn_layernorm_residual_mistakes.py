"""Chapter 4's mistakes are edits of the reference (``harness.edited``): each applies (the checks would not
load otherwise) and computes something other than the reference on at least one of its check's own cases."""

import pytest
import torch

from autograde_tests.checks import ffn_layernorm_residual as checks
from autograde_tests.checks.harness import Inputs
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


def ffn_cases():
    for seed, cases in ((400, checks.VISIBLE_FFN), (4100, checks.HIDDEN_FFN)):
        for i, case in enumerate(cases):
            yield checks._reference_ffn(case, seed + i), checks._ffn_input(case, seed + i)


def conv_cases():
    for seed, cases in ((420, checks.VISIBLE_CONV), (4200, checks.HIDDEN_CONV)):
        for i, case in enumerate(cases):
            conv = ref.ffn_as_conv1d(checks._reference_ffn_float32(case, seed + i))
            yield conv, Inputs(seed + i).randn(case.batch, case.length, case.d_model)


def layer_norm_cases():
    for seed, cases in ((430, checks.VISIBLE_LAYER_NORM), (4300, checks.HIDDEN_LAYER_NORM)):
        for i, case in enumerate(cases):
            yield checks._reference_layer_norm(case, seed + i), checks._layer_norm_input(case, seed + i)


def sublayer_cases():
    for seed, cases in ((440, checks.VISIBLE_SUBLAYER), (4400, checks.HIDDEN_SUBLAYER)):
        for i, case in enumerate(cases):
            connection = checks._reference_connection(checks._reference_norm(case, seed + i), case.norm_first)
            yield connection, checks._sublayer_input(case, seed + i), checks._sublayer(case, seed + i)


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
