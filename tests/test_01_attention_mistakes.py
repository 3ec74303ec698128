"""Chapter 1's mistakes are edits of the reference (``harness.edited``) or the reference given another argument:
each applies (the checks would not load otherwise) and computes something other than the reference on at least
one of its check's own cases, in float64."""

import pytest

from autograde_tests.checks import attention as checks
from autograde_tests.checks.harness import candidates
from autograde_tests.reference import attention as ref

from .mistake_shows import shows

pytestmark = pytest.mark.usefixtures("one_thread")



def softmax_cases():
    """Each case with its input, drawn as the check draws it (its own helper, so the two cannot drift)."""
    for hidden, cases in ((False, checks.VISIBLE_SOFTMAX), (True, checks.HIDDEN_SOFTMAX)):
        for i, case in enumerate(cases):
            yield case, checks._softmax_input(case, hidden, i)


def attention_cases():
    for hidden, cases in ((False, checks.VISIBLE_ATTENTION), (True, checks.HIDDEN_ATTENTION)):
        for i, case in enumerate(cases):
            yield checks._attention_inputs(case, hidden, i)


def computed(mistake, inputs) -> list:
    """The output and the weights the mistake computes on ``inputs``, None for each where it does not apply (as
    the check sees it: ``candidates``)."""
    return [result for part in (0, 1) for _, result in candidates([mistake], *inputs, part=part)]


def test_each_softmax_over_another_axis_shows_on_its_case():
    for case, x in softmax_cases():
        mistakes = checks._wrong_axis_mistakes(x.dim(), case.dim)
        assert len(mistakes) == x.dim() - 1
        for mistake in mistakes:
            assert shows(mistake.compute(x), ref.softmax(x, dim=case.dim)), (case, mistake.problem)


@pytest.mark.parametrize("mistake", checks.MISTAKES, ids=lambda m: m.problem[:40])
def test_an_attention_mistake_shows_on_the_checks_cases(mistake):
    assert any(shows(got, want) for inputs in attention_cases()
               for got, want in zip(computed(mistake, inputs), ref.scaled_dot_product_attention(*inputs)))


def test_the_attention_mistakes_differ_from_each_other_on_the_checks_cases():
    """Each is named when it matches: none may compute what another does on every case."""
    results = [[computed(mistake, inputs) for inputs in attention_cases()] for mistake in checks.MISTAKES]
    for a in range(len(results)):
        for b in range(a + 1, len(results)):
            pairs = [(x, y) for case_a, case_b in zip(results[a], results[b]) for x, y in zip(case_a, case_b)]
            assert any(x is not None and y is not None and shows(x, y) for x, y in pairs), (
                checks.MISTAKES[a].problem, checks.MISTAKES[b].problem)
