"""Chapter 6's apply_rotary: its cases, its mistakes and its check.

Its catalogued mistakes: rotating the wrong pairs (interleaved (2i, 2i + 1) instead of the course's half-split
(i, i + d_k/2)); rotating the wrong way; ignoring the positions; only the first position used (the rest taken as
consecutive); ignoring the base; the angles laid out for neighbouring pairs; one frequency per feature. The block's
check names the wrong pairs too (``HALF_SPLIT``, ``INTERLEAVED``).
"""

import functools
from dataclasses import dataclass

import torch

from ...reference import decoder_only as ref
from ..harness import (
    Mistake,
    SeededRandom,
    candidates,
    close,
    default_dtype,
    edited,
    name_the_mistake,
    one_thread,
    output_like_input,
    run_cases,
    seed_for,
    strict_numerics,
)
from ..how import expect_device_agnostic


@dataclass(frozen=True)
class RotaryCase:
    batch: int
    heads: int
    length: int
    d_k: int
    start: int  # positions start here (and are not contiguous when ``gaps``), as after a cache
    gaps: bool = False
    base: float = 10000.0  # passed as ``base=`` when it is not the default


VISIBLE_ROTARY = [RotaryCase(2, 3, 5, 8, start=4), RotaryCase(1, 2, 6, 6, start=3, gaps=True)]
HIDDEN_ROTARY = [RotaryCase(3, 2, 4, 12, start=9), RotaryCase(2, 4, 7, 4, start=1, gaps=True, base=500.0),
                 RotaryCase(1, 1, 3, 16, start=17, base=1e6)]
HALF_SPLIT = ("the course pairs feature i with feature i + d_k/2 (the half-split of GPT-NeoX and Hugging Face's "
              "rotate_half), x1 = x[..., :d_k//2], x2 = x[..., d_k//2:]")


def _rotary_inputs(i: int, case: RotaryCase, hidden: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Case ``i``'s x (B, h, T, d_k), float64, and its positions, on the CPU."""
    seed = functools.partial(seed_for, "apply_rotary", hidden, i)
    x = SeededRandom(seed()).randn(case.batch, case.heads, case.length, case.d_k)
    if case.gaps:
        steps = torch.randint(1, 4, (case.length,), generator=SeededRandom(seed("gaps")).generator)
        return x, case.start + steps.cumsum(0) - steps[0]
    return x, torch.arange(case.start, case.start + case.length)


# A mistake: the reference's apply_rotary with (old, new) changes made to its source (``edited``).
_rotary = functools.partial(edited, ref.apply_rotary)
INTERLEAVED = _rotary(("x[..., :half], x[..., half:]", "x[..., 0::2], x[..., 1::2]"),
                      ("torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)",
                       "torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)"))
ROTARY_MISTAKES = [
    Mistake(f"RoPE rotates the wrong pairs: neighbouring features (2i, 2i + 1), as the RoPE paper and Meta's LLaMA "
            f"code pair them; {HALF_SPLIT}",
            "rotate (x1, x2) with x1 = x[..., :d_k // 2] and x2 = x[..., d_k // 2:], and concatenate the two "
            "results.",
            INTERLEAVED),
    Mistake("RoPE turns the pairs the wrong way (the sines have the wrong sign)",
            "(x1, x2) -> (x1·cos - x2·sin, x2·cos + x1·sin).",
            _rotary(("angle.sin().to(x.dtype)", "-angle.sin().to(x.dtype)"))),
    Mistake("the positions argument is ignored: the tokens are rotated as if they were at 0, 1, 2, ... (positions "
            "restarting at 0, which breaks every token after a cache)",
            "use the positions you are given: angle = positions[:, None] * theta.",
            _rotary(("positions.to(torch.float64)", "torch.arange(x.size(-2), dtype=torch.float64)"))),
    Mistake("only the first position is used: the tokens are rotated as if they were at positions[0], "
            "positions[0] + 1, ...; the positions given need not be consecutive",
            "use every position you are given: angle = positions[:, None] * theta.",
            _rotary(("positions.to(torch.float64)", "(positions[0] + torch.arange(x.size(-2))).to(torch.float64)"))),
    Mistake("the base argument is ignored: the frequencies use 10000 whatever base is given",
            "theta = base ** (-torch.arange(0, d_k, 2) / d_k), with the base you are given.",
            _rotary(("theta = base **", "theta = 10000.0 **"))),
    Mistake("the angles are laid out for neighbouring pairs (each repeated twice in a row, repeat_interleave) while "
            "the features are paired half-split: features i and i + d_k/2 must turn by the same angle",
            "repeat the angles over the two halves, torch.cat([angle, angle], dim=-1), as Hugging Face's "
            "rotate_half form does.",
            _rotary(("angle.cos().to(x.dtype), angle.sin().to(x.dtype)",
                     "angle.repeat_interleave(2, dim=-1).cos().to(x.dtype), "
                     "angle.repeat_interleave(2, dim=-1).sin().to(x.dtype)"),
                    ("torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)",
                     "x * cos + torch.cat([-x2, x1], dim=-1) * sin"))),
    Mistake("the frequencies use the feature index i instead of 2i: theta_i = base^(-i/d_k), where RoPE's is "
            "base^(-2i/d_k)",

            "theta = base ** (-torch.arange(0, d_k, 2) / d_k), one frequency per pair.",
            _rotary(("* 2 / x.size(-1)", "/ x.size(-1)"))),
]


def check_apply_rotary(apply_rotary, hidden: bool = False) -> None:
    """Check a learner's ``apply_rotary(x, positions, base=10000.0)`` on (B, h, T, d_k) tensors; hidden cases
    give ``base`` other values."""
    name = "apply_rotary"
    cases = HIDDEN_ROTARY if hidden else VISIBLE_ROTARY

    def check_case(i: int, case: RotaryCase, device, dtype) -> None:
        x64, positions = _rotary_inputs(i, case, hidden)
        expected = ref.apply_rotary(x64, positions, case.base)
        base = {} if case.base == 10000.0 else {"base": case.base}
        with default_dtype(dtype):
            x = x64.to(device=device, dtype=dtype)
            out = output_like_input(name, apply_rotary, x, positions.to(device), **base)

        if not close(out, expected):
            name_the_mistake(name, f"the rotated tensor (base={case.base:g})", out, expected,
                             candidates(ROTARY_MISTAKES, x64, positions, case.base))

    def on_meta() -> None:
        expect_device_agnostic(name, apply_rotary, _rotary_inputs(0, cases[0], hidden))

    with strict_numerics(), one_thread():
        run_cases(name, cases, check_case, after=on_meta)
