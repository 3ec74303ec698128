"""Chapter 6's mistakes are edits of the reference (``harness.edited``): each applies (the checks would not
load otherwise) and computes something other than the reference on at least one of its check's own cases."""

import pytest
import torch

from autograde_tests.checks import decoder_only as checks
from autograde_tests.checks import stand_in_models
from autograde_tests.reference import decoder_only as ref

from .mistake_shows import differs

pytestmark = pytest.mark.usefixtures("one_thread")



def each_case(visible: list, hidden: list, inputs):
    """``inputs(i, case, hidden)``, the check's own draw, for every visible and hidden case: what the check runs on."""
    for is_hidden, cases in ((False, visible), (True, hidden)):
        for i, case in enumerate(cases):
            yield case, inputs(i, case, is_hidden)


def norm_cases():
    for _, (norm, x, _) in each_case(checks.VISIBLE_NORM, checks.HIDDEN_NORM, checks._norm_inputs):
        yield norm, x


def rotary_cases():
    for case, (x, positions) in each_case(checks.VISIBLE_ROTARY, checks.HIDDEN_ROTARY, checks._rotary_inputs):
        yield x, positions, case.base


def block_cases():
    for _, inputs in each_case(checks.VISIBLE_BLOCK, checks.HIDDEN_BLOCK, checks._block_inputs):
        yield inputs


def model_cases():
    # the check's model: the reference GPT with stand-in blocks and PyTorch's RMSNorm (``_model_inputs``)
    for case, (_, model, idx) in each_case(checks.VISIBLE_MODEL, checks.HIDDEN_MODEL, checks._model_inputs):
        yield model, idx, None
        yield model, idx[:, case.split:], model(idx[:, : case.split])[1]


def loss_cases():
    for _, inputs in each_case(checks.VISIBLE_LOSS, checks.HIDDEN_LOSS, checks._loss_inputs):
        yield inputs


def sample_cases(hidden: bool):
    for i, case in enumerate(checks.HIDDEN_SAMPLE if hidden else checks.VISIBLE_SAMPLE):
        model, idx = checks._sample_inputs(i, case, hidden)
        yield lambda generate, case=case, model=model, idx=idx: generate(
            model, idx, case.new, generator=stand_in_models.seeded_generator("cpu", case.seed), **checks._options(case))


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


@pytest.mark.parametrize("hidden", [False, True], ids=["visible", "hidden"])
@pytest.mark.parametrize("mistake", checks.SAMPLE_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_sampling_mistake_draws_other_tokens_on_the_checks_cases(mistake, hidden):
    """On the visible cases, and on the hidden ones too: whether a mistake draws other tokens is up to the draw, and
    hidden cases on which it happens to draw the reference's would grade it right."""
    def drawn(run, generate):
        try:
            return run(generate)
        except Exception:  # a mistake that cannot run on a case (top-k alone, without top_k) shows on another
            return None

    outcomes = [(drawn(run, mistake.compute), run(ref.generate)) for run in sample_cases(hidden)]
    assert any(got is not None and not torch.equal(got, want) for got, want in outcomes)


HF = ("load_hf_llama", checks.HF_NAMES, ref.load_hf_llama)  # the check's name, the layout, the reference loader
META = ("load_meta_llama", checks.META_NAMES, ref.load_meta_llama)


def load_cases(name, layout, reference):
    inputs = lambda i, case, hidden: checks._load_inputs(name, layout, i, case, hidden)
    for case, (before, checkpoint, idx) in each_case(checks.VISIBLE_LOAD, checks.HIDDEN_LOAD, inputs):
        yield (before, checkpoint, idx, case), checks._loading(reference)(before, checkpoint, idx, case)


@pytest.mark.parametrize("mistake", checks.HF_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_hf_loading_mistake_shows_on_the_checks_cases(mistake):
    assert any(differs(mistake.compute(*args), want) for args, want in load_cases(*HF))


@pytest.mark.parametrize("mistake", checks.META_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_meta_loading_mistake_shows_on_the_checks_cases(mistake):
    assert any(differs(mistake.compute(*args), want) for args, want in load_cases(*META))


@pytest.mark.parametrize("mistakes", [checks.HF_MISTAKES, checks.META_MISTAKES])
def test_the_loading_mistakes_differ_from_each_other_on_the_visible_cases(mistakes):
    """Each is named where it first shows (the visible cases): none may compute what another does on all of them."""
    loader = HF if mistakes is checks.HF_MISTAKES else META
    cases = [args for args, _ in load_cases(*loader)][: len(checks.VISIBLE_LOAD)]
    results = [[m.compute(*args) for args in cases] for m in mistakes]
    for a in range(len(mistakes)):
        for b in range(a + 1, len(mistakes)):
            assert any(differs(x, y) for x, y in zip(results[a], results[b])), \
                (mistakes[a].problem, mistakes[b].problem)
