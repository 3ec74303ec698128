"""Chapter 8's mistakes are edits of the reference (``harness.edited``): each applies (the checks would not load
otherwise) and computes another result than the reference on at least one of its check's own cases, and no two
compute the same thing on every case (each would be named for the other). Results are compared as the checks
compare them: as tensors of ints (merges, ids, code points), exactly."""

import itertools

import pytest

from autograde_tests.checks import tokens as checks
from autograde_tests.checks.harness import candidates
from autograde_tests.reference import tokens as ref

from .mistake_shows import shows


def train_cases():
    """Each case's arguments (text, vocab_size, special_tokens), as the check draws them."""
    for hidden, cases in ((False, checks.VISIBLE_TRAIN), (True, checks.HIDDEN_TRAIN)):
        for i, case in enumerate(cases):
            yield checks._training_text("train_bpe", hidden, i, case), case.vocab_size, case.special_tokens


def encode_cases():
    """Each case's arguments (text, merges, special_tokens)."""
    for hidden, cases in ((False, checks.VISIBLE_ENCODE), (True, checks.HIDDEN_ENCODE)):
        for i, case in enumerate(cases):
            yield *checks._encoding_inputs("encode", hidden, i, case), case.special_tokens


def decode_cases():
    """Each case's arguments (ids, merges, special_tokens), cut where the case is."""
    for hidden, cases in ((False, checks.VISIBLE_DECODE), (True, checks.HIDDEN_DECODE)):
        for i, case in enumerate(cases):
            ids, merges = checks._decoding_inputs("decode", hidden, i, case)
            yield checks._cut(ids) if case.cut else ids, merges, case.special_tokens


CHECKS = {  # each check's mistakes, cases, reference and how it turns a result into a tensor
    "train_bpe": (checks.TRAIN_MISTAKES, train_cases, ref.train_bpe, checks._long),
    "encode": (checks.ENCODE_MISTAKES, encode_cases, ref.encode, checks._long),
    "decode": (checks.DECODE_MISTAKES, decode_cases, ref.decode, checks._code_points),
}


def results(check: str, mistake) -> list:
    """What the mistake returns on each case, as the check compares it (None where it does not apply)."""
    _, cases, _, convert = CHECKS[check]
    found = [result for args in cases() for _, result in candidates([mistake], *args)]
    return [None if r is None else convert(r) for r in found]


@pytest.mark.parametrize("check, mistake", [(check, m) for check, (mistakes, *_) in CHECKS.items() for m in mistakes],
                         ids=lambda x: getattr(x, "problem", x)[:40])
def test_a_mistake_shows_on_its_checks_cases(check, mistake):
    _, cases, reference, convert = CHECKS[check]
    expected = [convert(reference(*args)) for args in cases()]
    assert any(shows(got, want) for got, want in zip(results(check, mistake), expected))


@pytest.mark.parametrize("check", list(CHECKS))
def test_the_mistakes_differ_from_each_other_on_the_checks_cases(check):
    mistakes = CHECKS[check][0]
    computed = [results(check, mistake) for mistake in mistakes]
    for (a, results_a), (b, results_b) in itertools.combinations(enumerate(computed), 2):
        assert any(x is not None and y is not None and shows(x, y) for x, y in zip(results_a, results_b)), (
            mistakes[a].problem, mistakes[b].problem)
