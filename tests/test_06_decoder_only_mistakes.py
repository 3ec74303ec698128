"""Chapter 6's mistakes are edits of the reference (``harness.edited``): each applies (the checks would not
load otherwise) and computes something other than the reference on at least one of its check's own cases."""

import pytest
import torch

from autograde_tests.checks import decoder_only as checks
from autograde_tests.checks import stand_ins
from autograde_tests.checks.harness import Inputs, randomise
from autograde_tests.reference import decoder_only as ref

pytestmark = pytest.mark.usefixtures("one_thread")


def differs(got, want) -> bool:
    return got.shape != want.shape or not torch.allclose(got, want, atol=1e-9)


def norm_cases():
    for seed, cases in ((610, checks.VISIBLE_NORM), (6100, checks.HIDDEN_NORM)):
        for i, case in enumerate(cases):
            yield checks._reference_norm(case, seed + i), Inputs(seed + i).randn(*case.shape) * case.scale


def rotary_cases():
    for seed, cases in ((620, checks.VISIBLE_ROTARY), (6200, checks.HIDDEN_ROTARY)):
        for i, case in enumerate(cases):
            x = Inputs(seed + i).randn(case.batch, case.heads, case.length, case.d_k)
            yield x, checks._positions(case, seed + i), case.base


def block_cases():
    for seed, cases in ((630, checks.VISIBLE_BLOCK), (6300, checks.HIDDEN_BLOCK)):
        for i, case in enumerate(cases):
            yield (checks._reference_block(case, seed + i), *checks._block_inputs(case, seed + i))


def model_cases():
    for seed, cases in ((640, checks.VISIBLE_MODEL), (6400, checks.HIDDEN_MODEL)):
        for i, case in enumerate(cases):
            model = checks._reference_model(case, seed + i)
            idx = torch.randint(case.vocab, (case.batch, case.length), generator=Inputs(seed + i).generator)
            yield model, idx, None
            yield model, idx[:, case.split:], model(idx[:, : case.split])[1]


def loss_cases():
    for seed, cases in ((650, checks.VISIBLE_LOSS), (6500, checks.HIDDEN_LOSS)):
        for i, case in enumerate(cases):
            model = checks._stand_in_lm(case.vocab, case.d_model, seed + i + 500)
            yield model, torch.randint(case.vocab, (case.batch, case.length), generator=Inputs(seed + i).generator)


def sample_cases():
    for case in checks.VISIBLE_SAMPLE + checks.HIDDEN_SAMPLE:
        model = checks._stand_in_lm(case.vocab, 8, case.seed + 6600, sharpen=2.0)
        idx = torch.randint(case.vocab, (case.batch, case.length), generator=Inputs(case.seed).generator)
        yield lambda generate: generate(model, idx, case.new, generator=stand_ins.seeded_generator("cpu", case.seed),
                                        **checks._options(case))


@pytest.mark.parametrize("mistake", checks.NORM_MISTAKES, ids=lambda m: m.problem[:40])
def test_an_rms_norm_mistake_shows_on_the_checks_cases(mistake):
    with torch.no_grad():
        assert any(differs(mistake.compute(x, norm), norm(x)) for norm, x in norm_cases())


@pytest.mark.parametrize("mistake", checks.ROTARY_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_rotary_mistake_shows_on_the_checks_cases(mistake):
    assert any(differs(mistake.compute(*args), ref.apply_rotary(*args)) for args in rotary_cases())


@pytest.mark.parametrize("mistake", checks.BLOCK_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_block_mistake_shows_on_the_checks_cases(mistake):
    with torch.no_grad():
        assert any(differs(mistake.compute(*args)[0], args[0](*args[1:])[0]) for args in block_cases())


@pytest.mark.parametrize("mistake", checks.GPT_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_gpt_mistake_shows_on_the_checks_cases(mistake):
    with torch.no_grad():
        assert any(differs(mistake.compute(*args), args[0](*args[1:])[0]) for args in model_cases())


@pytest.mark.parametrize("mistake", checks.LOSS_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_loss_mistake_shows_on_the_checks_cases(mistake):
    with torch.no_grad():
        assert any(differs(mistake.compute(*args), ref.lm_loss(*args)) for args in loss_cases())


@pytest.mark.parametrize("mistake", checks.SAMPLE_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_sampling_mistake_draws_other_tokens_on_the_checks_cases(mistake):
    def drawn(run, generate):
        try:
            return run(generate)
        except Exception:  # a mistake that cannot run on a case (top-k alone, without top_k) shows on another
            return None

    outcomes = [(drawn(run, mistake.compute), run(ref.generate)) for run in sample_cases()]
    assert any(got is not None and not torch.equal(got, want) for got, want in outcomes)


def load_cases(layout, reference):
    for seed, cases in ((layout[1], checks.VISIBLE_LOAD), (layout[1] * 10, checks.HIDDEN_LOAD)):
        for i, case in enumerate(cases):
            before = checks._load_state(case, seed + i)
            checkpoint = checks._checkpoint(layout[0], case, checks._load_state(case, seed + i + 300), torch.float64)
            idx = torch.randint(case.vocab, checks.LOADED_IDX, generator=Inputs(seed + i + 600).generator)
            yield (before, checkpoint, idx, case), checks._loading(reference)(before, checkpoint, idx, case)


@pytest.mark.parametrize("mistake", checks.HF_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_hf_loading_mistake_shows_on_the_checks_cases(mistake):
    assert any(differs(mistake.compute(*args), want) for args, want in load_cases((checks.HF_NAMES, 670), ref.load_hf_llama))


@pytest.mark.parametrize("mistake", checks.META_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_meta_loading_mistake_shows_on_the_checks_cases(mistake):
    assert any(differs(mistake.compute(*args), want)
               for args, want in load_cases((checks.META_NAMES, 680), ref.load_meta_llama))


@pytest.mark.parametrize("mistakes", [checks.HF_MISTAKES, checks.META_MISTAKES])
def test_the_loading_mistakes_differ_from_each_other_on_the_visible_cases(mistakes):
    """Each is named where it first shows (the visible cases): none may compute what another does on all of them."""
    hf = mistakes is checks.HF_MISTAKES
    layout, reference = ((checks.HF_NAMES, 670), ref.load_hf_llama) if hf else ((checks.META_NAMES, 680), ref.load_meta_llama)
    cases = [args for args, _ in load_cases(layout, reference)][: len(checks.VISIBLE_LOAD)]
    results = [[m.compute(*args) for args in cases] for m in mistakes]
    for a in range(len(mistakes)):
        for b in range(a + 1, len(mistakes)):
            assert any(differs(x, y) for x, y in zip(results[a], results[b])), (mistakes[a].problem, mistakes[b].problem)
