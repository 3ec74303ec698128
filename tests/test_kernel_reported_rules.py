"""A rule that only the learner's kernel can see being kept fails in JupyterLab, and is a note worth no points
in a graded run, where the kernel is the learner's; the rules the grader checks itself still fail there.

A graded run's proxies come from a session that also reads the learner's source (``grading.execute``): here
a loopback to an agent in this process with such a reader stands for the sandboxed kernel.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autograde_tests.reference as R
from autograde_tests.checks import (
    check_causal_mask,
    check_ffn_as_conv1d,
    check_generate,
    check_load_meta_llama,
    check_online_softmax,
    check_softmax,
    check_tiled_attention,
    check_transformer,
    in_kernel,
    stand_in_models,
)
from autograde_tests.checks.harness import ON_A_FIXED_DEVICE
from autograde_tests.checks.how import NOTE, in_a_graded_run, kernel_reported
from autograde_tests.grading.static_names import StaticNames
from autograde_tests.remote.proxy import Session

from .conftest import connected, fails, kernel_stand_in
from .test_01_attention_checks import softmax_fixed_device
from .test_03_attention_variants_checks import causal_on_the_cpu
from .test_04_ffn_layernorm_residual_checks import (
    ConvByFunctional,
    PermutedConvFFN,
    conv_returning_the_ffn,
    conv_with_wide_kernels,
)
from .test_06_decoder_only_checks import META_LAYER, make_generate, meta_loader, swapped
from .test_07_attention_at_scale_checks import (
    naive_attention,
    online_softmax_in_two_passes,
    online_softmax_in_two_passes_over_a_kept_list,
)

pytestmark = pytest.mark.usefixtures("one_thread")

IMPORTS = "import math\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn"


def graded(value, chapter: str, source: str = ""):
    """``value`` as a graded run's grader sees the learner's ``answer``: a proxy, with ``source`` as the cells."""
    kernel = kernel_stand_in(chapter)
    kernel.namespace["answer"] = value
    return connected(kernel, static_names=StaticNames([IMPORTS, source])).lookup("answer")


def passes_with_a_note(check, answer, note: str, capsys, **kwargs) -> None:
    check(answer, **kwargs)
    printed = capsys.readouterr().out
    assert NOTE in printed and note in printed and "✔" in printed, printed


# ------------------------------------------------------------------------------------ the mechanism


def test_only_a_graded_session_is_a_graded_run():
    assert in_a_graded_run(graded(len, "01_attention"))
    kernel = kernel_stand_in("01_attention")
    kernel.namespace["answer"] = len
    assert not in_a_graded_run(Session(kernel.handle).lookup("answer"))  # the suite's own wire: learner mode
    assert not in_a_graded_run(len)


def test_a_kernel_reported_rule_fails_in_learner_mode_and_is_a_note_in_a_graded_run(capsys):
    with fails("^uses something", exercise="softmax"):
        kernel_reported("softmax", len, "uses something", "do otherwise")
    kernel_reported("softmax", graded(len, "01_attention"), "uses something", "do otherwise")
    assert capsys.readouterr().out == f"softmax: {NOTE}: uses something\nHint: do otherwise\n"


# ------------------------------------------------------------------------ chapter 1: forbidden built-ins

NN_SOFTMAX = "def answer(x, dim=-1):\n    return torch.nn.Softmax(dim=dim)(x)"
RUN_TIME_NAME = ("def answer(x, dim=-1):\n"
                 "    return getattr(torch, bytes([115, 111, 102, 116, 109, 97, 120]).decode())(x, dim)")


def _defined(source: str):
    namespace: dict = {}
    exec(f"{IMPORTS}\n{source}", namespace)
    return namespace["answer"]


def silence_the_operator_record(monkeypatch):
    """What a learner's cell can do to the kernel's record of the operators that ran."""
    monkeypatch.setattr(in_kernel, "operators_used", lambda fn, args: [])


def test_nn_softmax_is_a_built_in_softmax_in_learner_mode():
    with fails(r"calls a built-in softmax .*softmax"):
        check_softmax(_defined(NN_SOFTMAX))


def test_nn_softmax_fails_a_graded_run_by_the_source_with_the_kernels_record_silenced(monkeypatch):
    silence_the_operator_record(monkeypatch)
    with fails(r"calls a built-in softmax .*\(Softmax\)"):
        check_softmax(graded(_defined(NN_SOFTMAX), "01_attention", NN_SOFTMAX))


def test_a_softmax_named_at_run_time_is_seen_by_the_kernel_alone_so_a_graded_run_notes_it(capsys):
    with fails("calls a built-in softmax"):
        check_softmax(_defined(RUN_TIME_NAME))
    passes_with_a_note(check_softmax, graded(_defined(RUN_TIME_NAME), "01_attention", RUN_TIME_NAME),
                       "calls a built-in softmax", capsys)


# ------------------------------------------------------------- any chapter: the run on shape-only tensors


def test_a_device_written_into_the_code_fails_in_learner_mode_and_is_a_note_in_a_graded_run(capsys):
    with fails(ON_A_FIXED_DEVICE):
        check_softmax(softmax_fixed_device)
    passes_with_a_note(check_softmax, graded(softmax_fixed_device, "01_attention"), ON_A_FIXED_DEVICE, capsys)


def test_replacing_the_shape_only_run_gains_nothing_in_a_graded_run(monkeypatch, capsys):
    """A probe that answers 'all on meta' hides the device from the note; the points were never its to give."""
    monkeypatch.setattr(in_kernel, "run_on_meta", lambda fn, args, kwargs: {"devices": ["meta"]})
    check_softmax(graded(softmax_fixed_device, "01_attention"))
    printed = capsys.readouterr().out
    assert "✔ softmax" in printed and NOTE not in printed, printed


def test_a_mask_that_ignores_its_device_argument_is_a_note_in_a_graded_run(capsys):
    with fails("ignores its device argument"):
        check_causal_mask(causal_on_the_cpu)
    passes_with_a_note(check_causal_mask, graded(causal_on_the_cpu, "03_attention_variants"),
                       "ignores its device argument", capsys)


# ------------------------------------------------------------------------- chapter 7: how it is computed


def test_plain_attention_is_a_note_in_a_graded_run_and_wrong_values_still_fail(capsys):
    passes_with_a_note(check_tiled_attention, graded(naive_attention, "07_attention_at_scale"),
                       "you built the full score matrix", capsys)
    unscaled = lambda q, k, v, block_q, block_k, causal=False: naive_attention(q * math.sqrt(q.size(-1)), k, v,
                                                                               block_q, block_k, causal)
    with fails("^the scores were not scaled", exercise="tiled_attention"):
        check_tiled_attention(graded(unscaled, "07_attention_at_scale"))


def test_patching_the_watcher_gains_nothing_in_a_graded_run(monkeypatch, capsys):
    """A watcher that reports no tensor made and one read changes no score: the note goes, the points stay."""
    honest_report = in_kernel.watched
    monkeypatch.setattr(in_kernel, "watched", lambda *a, **k: honest_report(*a, **k) | {"largest": None, "reads": 1})
    check_tiled_attention(graded(naive_attention, "07_attention_at_scale"))
    assert "✔ tiled_attention" in capsys.readouterr().out


def test_two_passes_over_the_chunks_are_a_note_in_a_graded_run(capsys):
    passes_with_a_note(check_online_softmax, graded(online_softmax_in_two_passes, "07_attention_at_scale"),
                       "reads the chunks 2 times", capsys)


def test_a_second_pass_over_kept_chunks_is_a_note_in_a_graded_run(capsys):
    passes_with_a_note(check_online_softmax, graded(online_softmax_in_two_passes_over_a_kept_list,
                                                    "07_attention_at_scale"), "went back to chunk 0", capsys)


# -------------------------------------------------------------------------------- chapter 4


class ConvWithTheWeightsKeptElsewhere(PermutedConvFFN):
    """Convolutions with the right weights, and a forward that uses copies of the linear layers' weights."""

    def __init__(self, ffn):
        super().__init__(ffn)
        self.kept = [p.detach().clone() for p in (ffn.linear1.weight, ffn.linear1.bias, ffn.linear2.weight,
                                                   ffn.linear2.bias)]

    def forward(self, x):
        w1, b1, w2, b2 = (t.to(x) for t in self.kept)
        return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


def test_convolutions_called_as_functions_are_a_note_in_a_graded_run(capsys):
    passes_with_a_note(check_ffn_as_conv1d, graded(ConvByFunctional, "04_ffn_layernorm_residual"),
                       "is never called", capsys)


@pytest.mark.parametrize("where", ["learner mode", "graded run"])
def test_weights_kept_outside_the_convolutions_fail_by_their_values(where):
    answer = ConvWithTheWeightsKeptElsewhere
    answer = graded(answer, "04_ffn_layernorm_residual") if where == "graded run" else answer
    match = "is never called" if where == "learner mode" else "does not compute the FFN of those weights"
    with fails(match):
        check_ffn_as_conv1d(answer)


class PointwiseConvolutions(nn.Module):
    """1x1 convolutions of the learner's own class, named neither nn.Conv1d nor nn.Linear."""

    def __init__(self, ffn):
        super().__init__()
        self.first, self.second = nn.Module(), nn.Module()
        for layer, linear in ((self.first, ffn.linear1), (self.second, ffn.linear2)):
            layer.weight = nn.Parameter(linear.weight.detach().clone().unsqueeze(-1))
            layer.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        h = F.relu(F.conv1d(x.transpose(1, 2), self.first.weight, self.first.bias))
        return F.conv1d(h, self.second.weight, self.second.bias).transpose(1, 2)


def test_the_classes_a_proxy_reports_are_a_note_and_the_convolutions_are_found_by_their_weights(capsys):
    """The class names come from the kernel (a class of the learner's own can give itself any name); the
    points come from the values the 1x1 convolutions compute with the weights the grader puts into them."""
    with fails("has no nn.Conv1d layer"):
        check_ffn_as_conv1d(PointwiseConvolutions)
    passes_with_a_note(check_ffn_as_conv1d, graded(PointwiseConvolutions, "04_ffn_layernorm_residual"),
                       "has no nn.Conv1d layer", capsys)


def test_a_linear_layer_kept_beside_the_convolutions_is_a_note_in_a_graded_run(capsys):
    class KeepsTheFFNUnused(PermutedConvFFN):
        def __init__(self, ffn):
            super().__init__(ffn)
            self.ffn = ffn

    with fails("still contains nn.Linear"):
        check_ffn_as_conv1d(KeepsTheFFNUnused)
    passes_with_a_note(check_ffn_as_conv1d, graded(KeepsTheFFNUnused, "04_ffn_layernorm_residual"),
                       "still contains nn.Linear", capsys)


@pytest.mark.parametrize("answer, exercise", [
    (conv_returning_the_ffn, "ffn_as_conv1d"),  # the holder it was given has no forward
    (conv_with_wide_kernels, "ffn_as_conv1d"),
], ids=["the ffn itself", "wide kernels"])
def test_what_is_not_a_1x1_convolution_fails_a_graded_run_by_its_values(answer, exercise):
    with fails(exercise=exercise):
        check_ffn_as_conv1d(graded(answer, "04_ffn_layernorm_residual"))


def test_the_sublayer_in_the_kernel_is_not_chapter_4s_ffn():
    layers = stand_in_models.position_wise_sublayer({"0.weight": torch.eye(3), "0.bias": torch.zeros(3)})
    assert not any(isinstance(m, nn.ReLU) for m in layers.modules())
    assert not hasattr(in_kernel, "ffn_sublayer") and not hasattr(stand_in_models, "ffn_sublayer")


# -------------------------------------------------------------------------------- chapter 6


@pytest.mark.parametrize("hidden", [False, True])
def test_generate_with_wrong_tokens_still_fails_a_graded_run(hidden):
    with fails("^softmax over the wrong axis", exercise="generate"):
        check_generate(graded(make_generate(softmax_dim=0), "06_decoder_only"), hidden=hidden)


def loaded_and_returned_none(model, checkpoint):
    meta_loader()(model, checkpoint)


@pytest.mark.parametrize("answer, note", [
    (meta_loader(in_place=True), "changed the checkpoint it was given"),
    (loaded_and_returned_none, "returns NoneType, not the model it was given"),
])
def test_what_a_loader_did_to_the_checkpoint_and_returned_is_the_kernels_word_in_a_graded_run(answer, note, capsys):
    """The weights the model holds are read back and judged by the grader; the rest only the kernel can see."""
    with fails(note):
        check_load_meta_llama(answer)
    passes_with_a_note(check_load_meta_llama, graded(answer, "06_decoder_only"), note, capsys)


def test_wrong_weights_still_fail_a_graded_run():
    with fails("^the FFN's w1 and w3 are swapped", exercise="load_meta_llama"):
        check_load_meta_llama(graded(meta_loader(names=swapped(META_LAYER, "w_gate", "w_up")), "06_decoder_only"))


# -------------------------------------------------------------------------------- chapter 5


class Memoriser(R.Transformer):
    """Gives the logits of the labels it was trained on, for the sources it was trained on; untrained otherwise."""

    memory: dict = {}

    def forward(self, src, tgt, src_padding_mask=None, tgt_padding_mask=None):
        logits = super().forward(src, tgt, src_padding_mask, tgt_padding_mask)
        for b, row in enumerate(src.tolist()):
            labels = self.memory.get(tuple(row))
            if labels is not None:
                logits[b] = 100 * F.one_hot(labels[: tgt.size(1)], logits.size(-1)).to(logits)
        return logits


class Memorising:
    """``stand_in_models.Training`` as a learner's cell could replace it: it keeps the labels it is sent."""

    def __init__(self, model, src, decoder_input, labels, pad, lr):
        model.memory.update({tuple(row): labels[b] for b, row in enumerate(src.tolist())})

    def run(self, steps, stop) -> dict:
        return {"losses": [0.0], "unused": [], "done": True}


@pytest.mark.parametrize("where", ["learner mode", "graded run"])
def test_a_model_that_memorises_the_labels_it_was_sent_cannot_learn(where, monkeypatch):
    monkeypatch.setattr(stand_in_models, "Training", Memorising)
    monkeypatch.setattr(Memoriser, "memory", {})
    answer = graded(Memoriser, "05_transformer") if where == "graded run" else Memoriser
    with fails(r"cannot learn: .* it then reversed [0-9] of 64 strings it was never shown"):
        check_transformer(answer)
