"""Chapter 5's mistakes are edits of the reference (``harness.edited``): each applies (the checks would not
load otherwise) and computes something other than the reference on at least one of its check's own cases."""

import copy

import pytest
import torch

from autograde_tests.checks import transformer as checks
from autograde_tests.checks.harness import default_dtype
from autograde_tests.reference import transformer as ref

from .mistake_shows import differs

pytestmark = pytest.mark.usefixtures("one_thread")



# Swapped masks cannot broadcast where the lengths differ, and they differ in every case with masks: these two
# never run on the checks' cases (the learner's code raises instead, and forward's check names this mistake then).
NEVER_RUN = {m.problem for m in checks.DECODER_MISTAKES + checks.FORWARD_MISTAKES
             if m.problem.startswith(("the two padding masks are swapped", "forward passes the padding masks"))}


def shows(mistake, reference, cases) -> bool:
    """Whether ``mistake`` computes something other than ``reference`` on one of ``cases`` (one that raises
    is skipped, as ``candidates`` skips it); for the two in NEVER_RUN, that it does so on none."""
    def differs_on(args) -> bool:
        try:
            got = mistake.compute(*args)
        except RuntimeError:
            return False
        return differs(got, reference(*args))

    assert len(NEVER_RUN) == 2
    with torch.no_grad():
        shown = any(differs_on(args) for args in cases)
    return shown != (mistake.problem in NEVER_RUN)


def layer_cases(reference_cls, arguments):
    """The reference layer and its arguments for every case, visible and hidden, drawn as the check draws them."""
    for hidden, cases in ((False, checks.VISIBLE_LAYER), (True, checks.HIDDEN_LAYER)):
        for i, case in enumerate(cases):
            layer, inputs = checks._layer_case(reference_cls, case, hidden, i)
            yield layer, *arguments(inputs)


def model_cases():
    """The reference model with the check's stand-in layers, its inputs and memory, for every case."""
    for hidden, cases in ((False, checks.VISIBLE_MODEL), (True, checks.HIDDEN_MODEL)):
        for i, case in enumerate(cases):
            reference, states, (src, tgt, src_mask, tgt_mask) = checks._model_case(case, hidden, i)
            model = checks._with_stand_in_layers(copy.deepcopy(reference), states)
            yield model, src, tgt, src_mask, tgt_mask, model.encode(src, src_mask)


def loss_cases():
    for hidden, cases in ((False, checks.VISIBLE_DATA), (True, checks.HIDDEN_DATA)):
        for i, case in enumerate(cases):
            yield checks._loss_case(case, hidden, i)


@pytest.mark.parametrize("mistake", checks.PE_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_positional_encoding_mistake_shows_on_the_checks_cases(mistake):
    with default_dtype(torch.float64):
        assert shows(mistake, ref.positional_encoding, checks.PE_VISIBLE + checks.PE_HIDDEN)


@pytest.mark.parametrize("mistake", checks.ENCODER_MISTAKES, ids=lambda m: m.problem[:40])
def test_an_encoder_layer_mistake_shows_on_the_checks_cases(mistake):
    cases = layer_cases(ref.EncoderLayer, checks._encoder_arguments)
    assert shows(mistake, lambda layer, *args: layer(*args), cases)


@pytest.mark.parametrize("mistake", checks.DECODER_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_decoder_layer_mistake_shows_on_the_checks_cases(mistake):
    assert shows(mistake, lambda layer, *args: layer(*args), layer_cases(ref.DecoderLayer, tuple))


@pytest.mark.parametrize("mistake", checks.ENCODE_MISTAKES, ids=lambda m: m.problem[:40])
def test_an_encode_mistake_shows_on_the_checks_cases(mistake):
    cases = [(model, src, src_mask) for model, src, _, src_mask, _, _ in model_cases()]
    assert shows(mistake, ref.Transformer.encode, cases)


@pytest.mark.parametrize("mistake", checks.DECODE_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_decode_mistake_shows_on_the_checks_cases(mistake):
    cases = [(model, tgt, memory, tgt_mask, src_mask) for model, _, tgt, src_mask, tgt_mask, memory in model_cases()]
    assert shows(mistake, ref.Transformer.decode, cases)


@pytest.mark.parametrize("mistake", checks.FORWARD_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_forward_mistake_shows_on_the_checks_cases(mistake):
    cases = [(model, src, tgt, src_mask, tgt_mask) for model, src, tgt, src_mask, tgt_mask, _ in model_cases()]
    assert shows(mistake, ref.Transformer.forward, cases)


@pytest.mark.parametrize("mistake", checks.LOSS_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_loss_mistake_shows_on_the_checks_cases(mistake):
    assert shows(mistake, lambda *args: ref.teacher_forcing_loss(*args, checks.PAD), loss_cases())


@pytest.mark.parametrize("mistake", checks.GREEDY_MISTAKES, ids=lambda m: m.problem[:40])
def test_a_decoding_mistake_writes_other_tokens_on_the_checks_cases(mistake):
    def writes_other_tokens(case) -> bool:
        """Told apart as the check tells them: an output padded with eos_id to the other's length is the same."""
        model, (src, mask) = checks.decoding_model(case), checks.decode_inputs(case)
        args = (model, src, case.max_len, case.bos, case.eos, mask)
        outputs = [mistake.compute(*args), ref.greedy_decode(*args)]
        length = max(out.size(1) for out in outputs)
        return not torch.equal(*(torch.cat([out, torch.full((out.size(0), length - out.size(1)), case.eos)], dim=1)
                                 for out in outputs))

    assert any(writes_other_tokens(case) for case in checks.VISIBLE_DECODE + checks.HIDDEN_DECODE)


def test_the_unchanged_decoding_is_the_reference():
    """``_greedy()``, edited with no change: what the adversarial suite hands a kernel as the reference's decoding."""
    case = checks.VISIBLE_DECODE[0]
    model, (src, mask) = checks.decoding_model(case), checks.decode_inputs(case)
    args = (model, src, case.max_len, case.bos, case.eos, mask)
    assert torch.equal(checks._greedy()(*args), ref.greedy_decode(*args))
