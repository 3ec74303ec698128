"""Chapter 7's mistakes are edits of the reference (``harness.edited``): each applies (the checks would not load
otherwise) and computes something other than the reference on at least one of its check's own cases, in float64,
and no two compute the same thing on every case (each would be named for the other)."""

import itertools

import pytest
import torch.nn.functional as F

from autograde_tests.checks import attention_at_scale as checks
from autograde_tests.checks.harness import candidates
from autograde_tests.reference import attention_at_scale as ref

from .mistake_shows import shows

pytestmark = pytest.mark.usefixtures("one_thread")


def online_cases():
    """Each case's chunks, as the check draws them (its own helper, so the two cannot drift)."""
    for hidden, cases in ((False, checks.VISIBLE_ONLINE), (True, checks.HIDDEN_ONLINE)):
        for i, case in enumerate(cases):
            yield list(checks._online_input(i, case, hidden).split(case.sizes, dim=-1))


def tiled_cases():
    """Each case's arguments (q, k, v, block_q, block_k, causal), as the check draws them."""
    for hidden, cases in ((False, checks.VISIBLE_TILED), (True, checks.HIDDEN_TILED)):
        for i, case in enumerate(cases):
            yield (*checks._tiled_inputs(i, case, hidden), case.block_q, case.block_k, case.causal)


def online_results(mistake, part: int) -> list:
    return [result for chunks in online_cases() for _, result in candidates([mistake], chunks, part=part)]


def tiled_results(mistake) -> list:
    """What the mistake returns on each case, NaN as zero (as the check compares a result with NaN rows)."""
    results = [result for args in tiled_cases() for _, result in candidates([mistake], *args)]
    return [None if r is None else r.nan_to_num(0.0) for r in results]


ONLINE = [(mistake, 0) for mistake in checks.MAXIMUM_MISTAKES] + [(mistake, 1) for mistake in checks.ONLINE_MISTAKES]


@pytest.mark.parametrize("mistake, part", ONLINE, ids=lambda m: getattr(m, "problem", str(m))[:40])
def test_an_online_softmax_mistake_shows_on_the_checks_cases(mistake, part):
    expected = [ref.online_softmax(chunks)[part] for chunks in online_cases()]
    assert any(shows(got, want) for got, want in zip(online_results(mistake, part), expected))


@pytest.mark.parametrize("mistake", checks.TILED_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_tiled_attention_mistake_shows_on_the_checks_cases(mistake):
    expected = [F.scaled_dot_product_attention(q, k, v, is_causal=causal) for q, k, v, _, _, causal in tiled_cases()]
    assert any(shows(got, want) for got, want in zip(tiled_results(mistake), expected))


@pytest.mark.parametrize("mistakes, results", [
    (checks.MAXIMUM_MISTAKES, lambda m: online_results(m, 0)),
    (checks.ONLINE_MISTAKES, lambda m: online_results(m, 1)),
    (checks.TILED_MISTAKES, tiled_results),
], ids=["maximum", "online sum", "tiled"])
def test_the_mistakes_differ_from_each_other_on_the_checks_cases(mistakes, results):
    computed = [results(mistake) for mistake in mistakes]
    for (a, results_a), (b, results_b) in itertools.combinations(enumerate(computed), 2):
        assert any(x is not None and y is not None and shows(x, y) for x, y in zip(results_a, results_b)), (
            mistakes[a].problem, mistakes[b].problem)
