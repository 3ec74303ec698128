"""Checks for chapter 01_attention: ``softmax`` and ``scaled_dot_product_attention``.

Visible checks (``hidden=False``) use one fixed set of shapes; the hidden ones nbgrader runs at grading time
use other shapes and draw other numbers (``seed_for``), so an answer fitted to the visible example fails.
"""

import functools
from dataclasses import dataclass

import torch

from ..reference import attention as ref
from .harness import (
    UNIFORM_WHEN_ALL_MASKED,
    Mistake,
    SeededRandom,
    call,
    candidates,
    close,
    edited,
    expect_tensor,
    fail,
    name_the_mistake,
    output_like_input,
    run_cases,
    seed_for,
    strict_numerics,
)
from .how import ATTENTION_BUILT_INS, expect_device_agnostic, forbid_built_ins

# ----------------------------------------------------------------------------------------- softmax


@dataclass(frozen=True)
class SoftmaxCase:
    shape: tuple[int, ...]
    dim: int
    scale: float = 1.0  # a large scale and offset test numerical stability
    offset: float = 0.0
    minus_inf: bool = False  # scatter some -inf scores (never a whole row), as masking does


VISIBLE_SOFTMAX = [SoftmaxCase((2, 3, 5), -1), SoftmaxCase((2, 3, 5), 1), SoftmaxCase((4, 7), -1, 40.0, 1000.0)]
HIDDEN_SOFTMAX = [
    SoftmaxCase((3, 2, 6, 4), -1),
    SoftmaxCase((3, 2, 6, 4), 0),
    SoftmaxCase((3, 2, 6, 4), 2),
    SoftmaxCase((5, 9), -1, minus_inf=True),
    SoftmaxCase((6, 3), 0, 30.0, -1000.0),
    SoftmaxCase((2, 5, 8), -2, 50.0, 900.0),
]


def _softmax_input(case: SoftmaxCase, hidden: bool, i: int) -> torch.Tensor:
    """The input of case ``i`` of the visible or hidden cases, float64 on the CPU."""
    rng = SeededRandom(seed_for("softmax", hidden, i))
    x = rng.randn(*case.shape) * case.scale + case.offset
    if case.minus_inf:
        hole = rng.bernoulli(0.3, *case.shape)
        hole[..., 0] = False  # keep one finite score in every row
        x = x.masked_fill(hole, float("-inf"))
    return x


def check_softmax(softmax, hidden: bool = False) -> None:
    """Check a learner's ``softmax(x, dim=-1)`` against the reference; raise AssertionError naming the mistake."""
    name = "softmax"
    cases = HIDDEN_SOFTMAX if hidden else VISIBLE_SOFTMAX

    def check_case(i: int, case: SoftmaxCase, device, dtype) -> None:
        x = _softmax_input(case, hidden, i)
        expected = ref.softmax(x, dim=case.dim)
        x = x.to(dtype=dtype, device=device)
        out = output_like_input(name, softmax, x, dim=case.dim)
        if not close(out, expected):
            _expect_finite(name, out, case)
            name_the_mistake(name, f"the output for input of shape {tuple(x.shape)}, dim={case.dim}", out, expected,
                             candidates(_wrong_axis_mistakes(x.dim(), case.dim), x.double().cpu()))

    with strict_numerics():
        forbid_built_ins(name, softmax, (_softmax_input(cases[0], hidden, 0),), ATTENTION_BUILT_INS)
        run_cases(name, cases, check_case, after=lambda: expect_device_agnostic(
            name, softmax, (_softmax_input(cases[0], hidden, 0),), {"dim": -1}))


def _expect_finite(name, out, case: SoftmaxCase) -> None:
    """Name an overflow: inf or NaN where the scores are large."""
    if not torch.isfinite(out).all() and case.scale > 1:
        fail(name, f"returns inf or NaN for scores around {case.offset:+g}: exp overflows or underflows",
             "subtract the maximum along `dim` (keepdim=True) before exp; softmax(x) = softmax(x - c).")


def _wrong_axis_mistakes(rank: int, dim: int) -> list[Mistake]:
    """Softmax over each axis but ``dim``: the reference called with the wrong axis, named by the one it used."""
    return [Mistake(f"normalises over dim {other} when called with dim={dim}",
                    "reduce (max and sum) along the `dim` argument, with keepdim=True.",
                    functools.partial(ref.softmax, dim=other))
            for other in range(rank) if other != dim % rank]


# ------------------------------------------------------------------------ scaled dot-product attention


@dataclass(frozen=True)
class AttentionCase:
    batch: tuple[int, ...]
    m: int
    n: int
    d_k: int
    d_v: int
    mask: str | None = None  # None, "full" (..., m, n), "keys" (..., 1, n), "shared" (m, n) or "empty_rows"


VISIBLE_ATTENTION = [
    AttentionCase((2,), 3, 5, 4, 6),
    AttentionCase((2,), 3, 5, 4, 6, "full"),
    AttentionCase((2,), 4, 6, 8, 3, "empty_rows"),
]
HIDDEN_ATTENTION = [
    AttentionCase((), 5, 7, 16, 9),
    AttentionCase((3, 2), 6, 4, 8, 5),
    AttentionCase((3,), 7, 9, 12, 10, "full"),
    AttentionCase((4,), 5, 8, 6, 7, "keys"),
    AttentionCase((2, 3), 6, 5, 4, 11, "shared"),
    AttentionCase((3,), 8, 6, 10, 4, "empty_rows"),
]


def _attention_inputs(case: AttentionCase, hidden: bool, i: int):
    """q, k, v and the mask (or None) of case ``i`` of the visible or hidden cases, float64 on the CPU."""
    rng = SeededRandom(seed_for("scaled_dot_product_attention", hidden, i))
    q = rng.randn(*case.batch, case.m, case.d_k)
    k = rng.randn(*case.batch, case.n, case.d_k)
    v = rng.randn(*case.batch, case.n, case.d_v)
    if case.mask is None:
        return q, k, v, None
    mask_shape = {"full": (*case.batch, case.m, case.n), "keys": (*case.batch, 1, case.n),
                  "shared": (case.m, case.n), "empty_rows": (*case.batch, case.m, case.n)}[case.mask]
    mask = rng.bernoulli(0.6, *mask_shape)
    mask[..., 0] = True  # no row is empty by accident...
    if case.mask == "empty_rows":
        mask[..., 1, :] = False  # ...but here, on purpose, a query that may attend to nothing
    return q, k, v, mask


def _attention(*changes: tuple[str, str]):
    """The reference's scaled_dot_product_attention with ``changes`` made to its source (``edited``): a mistake."""
    return edited(ref.scaled_dot_product_attention, *changes)


MINUS_INF = 'float("-inf")'
# The weights as softmax left them: masked keys' and empty rows' too.
UNZEROED = ("torch.where(mask, weights, 0.0)", "weights")


MISTAKES = [
    Mistake("your output matches attention without the 1/sqrt(d_k) scale",
            "divide q @ k.transpose(-2, -1) by math.sqrt(d_k), with d_k = q.size(-1).",
            _attention((" / math.sqrt(d_k)", ""))),
    Mistake("your scores are divided by d_k instead of sqrt(d_k)", "the scale is 1/math.sqrt(d_k).",
            _attention(("math.sqrt(d_k)", "d_k"))),
    Mistake("your scores are scaled by sqrt(d_v), the size of the values",
            "the scale uses d_k = q.size(-1), the size shared by queries and keys.",
            _attention(("math.sqrt(d_k)", "math.sqrt(v.size(-1))"))),
    Mistake("softmax over the wrong axis: your weights are normalised over the queries (dim=-2)",
            "each query's row of weights must sum to 1 over the keys: softmax(scores, dim=-1).",
            _attention(("softmax(scores, dim=-1)", "softmax(scores, dim=-2)"))),
    Mistake("mask polarity inverted: your code treats True as 'blocked'",
            "in this course (and in F.scaled_dot_product_attention) True means 'may attend'; "
            "fill the scores where the mask is False.",
            lambda q, k, v, mask: ref.scaled_dot_product_attention(q, k, v, ~mask)),
    Mistake("masked scores were set to 0 instead of -inf, so masked keys still get weight (exp(0) = 1)",
            "fill masked scores with float('-inf') so that softmax gives them exactly zero weight.",
            _attention((MINUS_INF, "0.0"), UNZEROED)),
    Mistake("masked weights were zeroed after softmax without renormalising, so rows no longer sum to 1",
            "mask the scores before softmax (fill with -inf), not the weights after it.",
            _attention((f"torch.where(mask, scores, {MINUS_INF})", "scores"))),
    Mistake(*UNIFORM_WHEN_ALL_MASKED, _attention((MINUS_INF, "-1e9"), UNZEROED)),
    Mistake("the mask is ignored: these values match attention computed without the mask "
            "(weights returned before masking, or the output computed from unmasked weights)",
            "apply the mask to the scores before softmax, and use those masked weights for both results.",
            lambda q, k, v, mask: ref.scaled_dot_product_attention(q, k, v, None)),
]


def check_scaled_dot_product_attention(scaled_dot_product_attention, hidden: bool = False) -> None:
    """Check a learner's ``scaled_dot_product_attention(q, k, v, mask=None) -> (output, weights)``."""
    name = "scaled_dot_product_attention"
    cases = HIDDEN_ATTENTION if hidden else VISIBLE_ATTENTION
    masked = next(i for i, c in enumerate(cases) if c.mask is not None)

    def check_case(i: int, case: AttentionCase, device, dtype) -> None:
        inputs64 = _attention_inputs(case, hidden, i)
        expected = ref.scaled_dot_product_attention(*inputs64)
        q, k, v = (t.to(dtype=dtype, device=device) for t in inputs64[:3])
        mask = inputs64[3]  # bool: moved, never cast; left out of the call when there is none
        result = call(name, scaled_dot_product_attention, q, k, v, *([] if mask is None else [mask.to(device)]))
        if not (isinstance(result, tuple) and len(result) == 2):
            fail(name, f"should return a tuple (output, weights), got {type(result).__name__}")
        out, weights = result
        expect_tensor(name, "output", out, expected[0].shape, like=q)
        expect_tensor(name, "weights", weights, expected[1].shape, like=q)
        _expect_no_nan(name, out, weights, mask)
        if not close(weights, expected[1]):
            name_the_mistake(name, "the weights", weights, expected[1], candidates(MISTAKES, *inputs64, part=1))
        if not close(out, expected[0]):
            name_the_mistake(name, "the output", out, expected[0], candidates(MISTAKES, *inputs64, part=0))

    def device_agnostic() -> None:
        for i in (0, masked):
            expect_device_agnostic(name, scaled_dot_product_attention, _attention_inputs(cases[i], hidden, i))

    with strict_numerics():
        forbid_built_ins(name, scaled_dot_product_attention, _attention_inputs(cases[masked], hidden, masked),
                         ATTENTION_BUILT_INS)
        run_cases(name, cases, check_case, after=device_agnostic)


def _expect_no_nan(name, out, weights, mask) -> None:
    """Name a NaN: from a query with no key to attend to (softmax of a row of -inf), or from elsewhere."""
    if not (torch.isnan(out).any() or torch.isnan(weights).any()):
        return
    if mask is not None and not mask.any(dim=-1).all():
        fail(name, "NaN for a query whose keys are all masked (softmax of a row of -inf is 0/0)",
             "such a query must get zero weights and a zero output: after softmax, set the weights "
             "where the mask is False to 0, e.g. torch.where(mask, weights, 0.0).")
    fail(name, "the result contains NaN", "look for a division by zero or exp of a huge score.")
