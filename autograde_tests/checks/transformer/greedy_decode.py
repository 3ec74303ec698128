"""Chapter 5's check of ``greedy_decode(model, src, max_len, bos_id, eos_id, src_padding_mask=None)``, on a
stand-in model, and the mistakes that it names."""

import copy
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from ...reference import transformer as ref
from ...remote.proxy import lend, type_name
from ..harness import (
    Mistake,
    SeededRandom,
    call,
    candidates,
    edited,
    fail,
    matching_mistake,
    one_thread,
    run_cases,
    strict_numerics,
)
from .cases import _padding_mask, _stand_in_model


@dataclass(frozen=True)
class DecodeCase:
    batch: int
    src_len: int
    max_len: int
    bos: int
    eos: int
    seed: int  # of the model's random weights and of the source


# Random models decode dully (often the same token whatever the source); these seeds were picked, among the
# first three hundred, so that in every case some sequences end early, some never do, and every mistake below
# changes the output (the tests hold them to that). So they are the cases' own, not ``seed_for``'s: drawn by
# it, no case told every mistake apart. A failure's case line shows the seed.
VISIBLE_DECODE = [DecodeCase(5, 6, 9, 1, 2, seed=55), DecodeCase(4, 5, 8, 1, 2, seed=37)]
HIDDEN_DECODE = [
    DecodeCase(6, 7, 10, 1, 2, seed=86),
    DecodeCase(5, 4, 8, 4, 7, seed=54),
    DecodeCase(4, 8, 9, 10, 3, seed=25),
]


def decoding_model(case: DecodeCase) -> nn.Module:
    """A float64 stand-in model with random weights; its logits are doubled so that the argmax is decisive."""
    model = _stand_in_model(13, 16, case.seed)
    with torch.no_grad():
        model.head.weight *= 2
    return model


def decode_inputs(case: DecodeCase):
    """Source token ids (B, S) and their padding mask (B, S)."""
    rng = SeededRandom(case.seed)
    src = torch.randint(3, 13, (case.batch, case.src_len), generator=rng.generator)
    return src, _padding_mask(rng, case.batch, case.src_len)


# The reference's greedy_decode with ``changes`` made to its source (``edited``): a mistake (with no change, the
# reference's decoding itself).
_greedy = partial(edited, ref.greedy_decode)


GREEDY_MISTAKES = [
    Mistake("after a sequence emitted eos_id it kept generating tokens; it should be padded with eos_id",
            "keep a (B,) bool tensor `done`; once a sequence is done, append eos_id to it instead of its argmax.",
            _greedy(("next_token = torch.where(done, eos_id, next_token)", ""))),
    Mistake("decoding stopped as soon as one sequence ended; it must go on until every sequence has emitted eos_id",
            "stop when done.all() (or at max_len), not done.any().",
            _greedy(("not done.all()", "not done.any()"))),
    Mistake("the next token is read from the logits at the first position; it is the last position that predicts "
            "the token after the prefix",
            "next_token = logits[:, -1].argmax(dim=-1).",
            _greedy(("logits[:, -1]", "logits[:, 0]"))),
    Mistake("src_padding_mask is not used: the decoding attends to the source's padding",
            "pass src_padding_mask to model.encode and to every model.decode call.",
            _greedy(("model.encode(src, src_padding_mask)", "model.encode(src)"),
                    ("model.decode(ys, memory, src_padding_mask=src_padding_mask)", "model.decode(ys, memory)"))),
]


def check_greedy_decode(greedy_decode, hidden: bool = False) -> None:
    """Check a learner's ``greedy_decode(model, src, max_len, bos_id, eos_id, src_padding_mask=None)``."""
    name = "greedy_decode"

    def check_case(_: int, case: DecodeCase, device, dtype) -> None:
        reference = decoding_model(case)
        src64, mask64 = decode_inputs(case)
        expected = ref.greedy_decode(reference, src64, case.max_len, case.bos, case.eos, mask64)
        model = lend(greedy_decode, copy.deepcopy(reference).to(device), "forward", "encode", "decode")
        out = call(name, greedy_decode, model, src64.to(device), case.max_len, case.bos, case.eos, mask64.to(device))
        _expect_decoded(name, out, expected, case, device, reference, src64, mask64)

    with strict_numerics(), one_thread():  # token ids: the float64 model alone
        run_cases(name, HIDDEN_DECODE if hidden else VISIBLE_DECODE, check_case, dtypes=(torch.float64,))


def _expect_decoded(name, out, expected, case: DecodeCase, device, reference, src64, mask64) -> None:
    if type(out) is not torch.Tensor:
        fail(name, f"should return a torch.Tensor, got {type_name(out)}")
    if out.dtype != torch.long:
        fail(name, f"returns {out.dtype}; token ids are torch.long", "create the output with dtype=torch.long.")
    if out.device.type != device.type:
        fail(name, f"returns a tensor on {out.device} but src is on {device}", "create tensors with device=src.device.")
    if out.dim() != 2 or out.size(0) != case.batch:
        fail(name, f"returns shape {tuple(out.shape)}; expected (B, L) = ({case.batch}, L) with L <= max_len")
    if out.size(1) > case.max_len:
        fail(name,
             f"returns {out.size(1)} tokens per sequence with max_len={case.max_len}: max_len counts the bos_id too",
             "stop when the output (bos_id included) has max_len tokens.")
    out = out.cpu()
    if not (out[:, 0] == case.bos).all():
        fail(name, f"the output does not start with bos_id={case.bos}: got {out[:, 0].tolist()}")

    def fail_naming_the_mistake(problem: str, hint: str | None = None) -> None:
        """Fail naming the mistake whose tokens are ``out``'s (a shorter result padded with eos_id first),
        else with the check's own message about the tokens."""
        mistaken = candidates(GREEDY_MISTAKES, reference, src64, case.max_len, case.bos, case.eos, mask64)
        mistake = matching_mistake(out, mistaken, exact=True,
                                   align=lambda got, result: (got, _eos_padded(result, got, case.eos)))
        fail(name, *((mistake.problem, mistake.hint) if mistake is not None else (problem, hint)))

    if out.size(1) < expected.size(1):
        fail_naming_the_mistake(
            f"stopped after {out.size(1)} tokens, before every sequence had emitted eos_id={case.eos}",
            "go on until every sequence has emitted eos_id, or the output has max_len tokens.",
        )
    padded = _eos_padded(expected, out, case.eos)
    if not torch.equal(out, padded):
        b = int((out != padded).any(dim=1).nonzero()[0])
        fail_naming_the_mistake(f"sequence {b} decodes to {out[b].tolist()}, expected {padded[b].tolist()}")


def _eos_padded(tokens: torch.Tensor, like: torch.Tensor, eos: int) -> torch.Tensor | None:
    """``tokens`` (B, L) padded with ``eos`` to the length of ``like`` (B, L'), or None where they cannot be
    (another batch, or longer): a decoding that stopped early is the same as one padded after every eos_id."""
    if tokens.dim() != 2 or tokens.size(0) != like.size(0) or tokens.size(1) > like.size(1):
        return None
    return torch.cat([tokens, torch.full((tokens.size(0), like.size(1) - tokens.size(1)), eos)], dim=1)
