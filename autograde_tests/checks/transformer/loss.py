"""Chapter 5's check of ``teacher_forcing_loss(model, src, tgt, pad_id)``, on a stand-in model, and the
mistakes that it names."""

import copy
from dataclasses import dataclass

import torch
from torch import nn

from ...reference import transformer as ref
from ...remote.proxy import lend
from ...toy_task import PAD, reversal_batch
from ..harness import (
    Mistake,
    SeededRandom,
    call,
    candidates,
    close,
    edited,
    expect_loss,
    name_the_mistake,
    one_thread,
    run_cases,
    seed_for,
    strict_numerics,
)
from .cases import _stand_in_model


@dataclass(frozen=True)
class DataCase:
    batch: int
    min_len: int
    max_len: int


VISIBLE_DATA = [DataCase(4, 1, 5), DataCase(3, 2, 6)]
HIDDEN_DATA = [DataCase(5, 1, 7), DataCase(2, 3, 4), DataCase(6, 1, 3)]


def _loss_case(case: DataCase, hidden: bool, i: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The ``i``-th case's stand-in model and its batch of reversals src (B, S), tgt (B, T), by the one seed rule."""
    name = "teacher_forcing_loss"
    src, tgt = reversal_batch(SeededRandom(seed_for(name, hidden, i)).generator, case.batch, case.min_len, case.max_len)
    return _stand_in_model(13, 16, seed_for(name, hidden, i, "weights")), src, tgt


def _loss(*changes: tuple[str, str]):
    """The reference's teacher_forcing_loss with ``changes`` made to its source (``edited``), called (model,
    src, tgt) with the toy task's PAD: a mistake."""
    loss = edited(ref.teacher_forcing_loss, *changes)
    return lambda model, src, tgt: loss(model, src, tgt, PAD)


SHIFTED = "decoder_input, labels = tgt[:, :-1], tgt[:, 1:]"
CROSS_ENTROPY = "nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=pad_id)"
LOSS_MISTAKES = [
    Mistake("targets not shifted right for teacher forcing: the decoder reads the very token it must predict",
            "the decoder reads tgt[:, :-1] (starting with BOS) and is scored on tgt[:, 1:]: at position t it has "
            "seen tokens 0 .. t and predicts token t + 1.",
            _loss((SHIFTED, "decoder_input, labels = tgt, tgt"))),
    Mistake("targets not shifted right for teacher forcing: the labels are tgt[:, :-1], the same tokens the decoder "
            "reads, so the model is asked to copy what it sees",
            "the labels are the next tokens: tgt[:, 1:].",
            _loss((SHIFTED, "decoder_input, labels = tgt[:, :-1], tgt[:, :-1]"))),
    Mistake("the shift goes the wrong way: the decoder reads tgt[:, 1:] and is scored on tgt[:, :-1]",
            "decoder input tgt[:, :-1], labels tgt[:, 1:].",
            _loss((SHIFTED, "decoder_input, labels = tgt[:, 1:], tgt[:, :-1]"))),
    Mistake("the padding positions are counted in the loss",
            "pass ignore_index=pad_id to F.cross_entropy, so that padded labels count for nothing.",
            _loss((", ignore_index=pad_id)", ")"))),
    Mistake("the source padding mask is not passed to the model, so it attends to the source's padding",
            "call model(src, decoder_input, src != pad_id, decoder_input != pad_id).",
            _loss(("model(src, decoder_input, src != pad_id,", "model(src, decoder_input, None,"))),
    Mistake("the loss is averaged per sequence, then over the batch: short sequences weigh as much as long ones",
            "take the mean over all real target tokens of the batch (F.cross_entropy's default with ignore_index).",
            # reduction="none" gives the ignored labels a loss of 0: each row's sum is over its real tokens
            _loss((CROSS_ENTROPY, '(nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=pad_id, '
                                  'reduction="none").sum(1) / (labels != pad_id).sum(1)).mean()'))),
]


def check_teacher_forcing_loss(teacher_forcing_loss, hidden: bool = False) -> None:
    """Check a learner's ``teacher_forcing_loss(model, src, tgt, pad_id) -> scalar`` on a stand-in model."""
    name = "teacher_forcing_loss"
    cases = HIDDEN_DATA if hidden else VISIBLE_DATA

    def check_case(i: int, case: DataCase, device, dtype) -> None:
        reference, src64, tgt64 = _loss_case(case, hidden, i)
        with torch.no_grad():
            expected = ref.teacher_forcing_loss(reference, src64, tgt64, PAD)
        model = lend(teacher_forcing_loss, copy.deepcopy(reference).to(device=device, dtype=dtype),
                     "forward", "encode", "decode")
        loss = call(name, teacher_forcing_loss, model, src64.to(device), tgt64.to(device), PAD)
        loss = expect_loss(name, loss, dtype, device)
        if not close(loss, expected):
            name_the_mistake(name, "the loss", loss, expected, candidates(LOSS_MISTAKES, reference, src64, tgt64))

    with strict_numerics(), one_thread():
        run_cases(name, cases, check_case)
