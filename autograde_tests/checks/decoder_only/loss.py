"""Chapter 6's lm_loss: its cases, its mistakes and its check, which drives a stand-in model.

Its catalogued mistakes: loss not shifted; shifted the wrong way; a softmax before the cross-entropy; nll_loss on
raw logits; summed, not averaged; only the last position scored.
"""

import copy
import functools
from dataclasses import dataclass

import torch
from torch import nn

from ...reference import decoder_only as ref
from ...remote.proxy import lend
from ..harness import (
    Mistake,
    call,
    candidates,
    close,
    edited,
    expect_loss,
    name_the_mistake,
    one_thread,
    run_cases,
    strict_numerics,
)
from .models import _lm_inputs


@dataclass(frozen=True)
class LossCase:
    batch: int
    length: int
    vocab: int
    d_model: int


VISIBLE_LOSS = [LossCase(3, 6, 11, 8), LossCase(2, 9, 7, 12)]
HIDDEN_LOSS = [LossCase(4, 5, 13, 8), LossCase(1, 8, 9, 16), LossCase(5, 3, 6, 8)]


def _loss_inputs(i: int, case: LossCase, hidden: bool) -> tuple[nn.Module, torch.Tensor]:
    """Case ``i``'s stand-in model and token ids idx (B, T), on the CPU."""
    return _lm_inputs("lm_loss", i, case, hidden, case.d_model)


# A mistake: the reference's lm_loss with (old, new) changes made to its source (``edited``).
_loss = functools.partial(edited, ref.lm_loss)
INPUTS, LABELS = "model(idx[:, :-1])", "idx[:, 1:].flatten())"
LOSS_MISTAKES = [
    Mistake("loss not shifted: the model reads idx and is scored on idx itself, so it only has to copy what it sees",
            "the model reads idx[:, :-1] and is scored on the next tokens, idx[:, 1:].",
            _loss((INPUTS, "model(idx)"), (LABELS, "idx.flatten())"))),
    Mistake("loss not shifted: the labels are idx[:, :-1], the very tokens the model reads",
            "the labels are the next tokens: idx[:, 1:].",
            _loss((LABELS, "idx[:, :-1].flatten())"))),
    Mistake("the shift goes the wrong way: the model reads idx[:, 1:] and is scored on idx[:, :-1]",
            "inputs idx[:, :-1], labels idx[:, 1:].",
            _loss((INPUTS, "model(idx[:, 1:])"), (LABELS, "idx[:, :-1].flatten())"))),
    Mistake("the logits went through a softmax before F.cross_entropy, which takes raw logits and applies its own "
            "log-softmax: the loss is that of the probabilities read as logits",
            "pass the logits themselves: F.cross_entropy(logits.flatten(0, 1), labels.flatten()).",
            _loss(("logits.flatten(0, 1)", "logits.softmax(dim=-1).flatten(0, 1)"))),
    Mistake("F.nll_loss was given the raw logits: it expects log-probabilities, so the loss is minus the mean logit "
            "of the right token",
            "F.cross_entropy on the logits, or F.nll_loss on logits.log_softmax(dim=-1).",
            _loss(("F.cross_entropy(", "F.nll_loss("))),
    Mistake("the loss is summed over the predictions, not averaged: it then grows with B and T, and so does the "
            "learning rate it needs",
            "the mean over every prediction: F.cross_entropy's default reduction, 'mean'.",
            _loss((LABELS, "idx[:, 1:].flatten(), reduction='sum')"))),
    Mistake("only the last position is scored: every position predicts the token after it, and each prediction counts",
            "score all T - 1 predictions: logits (B, T - 1, V) against labels idx[:, 1:] (B, T - 1).",
            _loss(("logits.flatten(0, 1), idx[:, 1:].flatten()", "logits[:, -1], idx[:, -1]"))),
]


def check_lm_loss(lm_loss, hidden: bool = False) -> None:
    """Check a learner's ``lm_loss(model, idx) -> scalar`` on a stand-in model."""
    name = "lm_loss"
    cases = HIDDEN_LOSS if hidden else VISIBLE_LOSS

    def check_case(i: int, case: LossCase, device, dtype) -> None:
        reference, idx64 = _loss_inputs(i, case, hidden)
        with torch.no_grad():
            expected = ref.lm_loss(reference, idx64)
        model = lend(lm_loss, copy.deepcopy(reference).to(device=device, dtype=dtype))
        loss = call(name, lm_loss, model, idx64.to(device))
        loss = expect_loss(name, loss, dtype, device)
        if not close(loss, expected):
            name_the_mistake(name, "the loss", loss, expected, candidates(LOSS_MISTAKES, reference, idx64))

    with strict_numerics(), one_thread():
        run_cases(name, cases, check_case)
