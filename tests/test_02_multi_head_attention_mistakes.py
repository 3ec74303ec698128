"""Chapter 2's mistakes are edits of the reference (``harness.edited``): each applies (the checks would not load
otherwise) and computes something other than the reference on at least one of its check's own cases, in float64."""

import pytest
import torch

from autograde_tests.checks import multi_head_attention as checks
from autograde_tests.checks.harness import candidates
from autograde_tests.reference import multi_head_attention as ref

from .mistake_shows import shows

pytestmark = pytest.mark.usefixtures("one_thread")



def split_cases():
    """Each case's arguments, drawn as the check draws them (its own helpers, so the two cannot drift)."""
    for hidden, cases in ((False, checks.VISIBLE_HEADS), (True, checks.HIDDEN_HEADS)):
        for i, case in enumerate(cases):
            yield checks._split_input(case, hidden, i), case.n_heads


def merge_cases():
    for hidden, cases in ((False, checks.VISIBLE_HEADS), (True, checks.HIDDEN_HEADS)):
        for i, case in enumerate(cases):
            yield (checks._merge_input(case, hidden, i),)


def mha_cases():
    """The reference module and its (x, y, mask), as the check makes them."""
    for hidden, cases in ((False, checks.VISIBLE_MHA), (True, checks.HIDDEN_MHA)):
        for i, case in enumerate(cases):
            _, reference = checks._modules(case, hidden, i)
            yield reference, *checks._mha_inputs(case, hidden, i)[:3]


def computed(mistake, args) -> list:
    """The output and the weights the mistake computes on ``args``, None for each where it does not apply (as the
    check sees it: ``candidates``)."""
    return [result for part in (0, 1) for _, result in candidates([mistake], *args, part=part)]


@pytest.mark.parametrize("mistake", checks.SPLIT_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_split_heads_mistake_shows_on_the_checks_cases(mistake):
    assert any(shows(mistake.compute(*args), ref.split_heads(*args)) for args in split_cases())


@pytest.mark.parametrize("mistake", checks.MERGE_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_merge_heads_mistake_shows_on_the_checks_cases(mistake):
    assert any(shows(mistake.compute(*args), ref.merge_heads(*args)) for args in merge_cases())


@pytest.mark.parametrize("mistake", checks.MHA_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_multi_head_attention_mistake_shows_on_the_checks_cases(mistake):
    with torch.no_grad():
        assert any(shows(got, want) for args in mha_cases()
                   for got, want in zip(computed(mistake, args), args[0](*args[1:])))


def test_the_multi_head_attention_mistakes_differ_from_each_other_on_the_checks_cases():
    """Each is named when it matches: none may compute what another does on every case."""
    with torch.no_grad():
        results = [[computed(mistake, args) for args in mha_cases()] for mistake in checks.MHA_MISTAKES]
    for a in range(len(results)):
        for b in range(a + 1, len(results)):
            pairs = [(x, y) for case_a, case_b in zip(results[a], results[b]) for x, y in zip(case_a, case_b)]
            assert any(x is not None and y is not None and shows(x, y) for x, y in pairs), (
                checks.MHA_MISTAKES[a].problem, checks.MHA_MISTAKES[b].problem)
