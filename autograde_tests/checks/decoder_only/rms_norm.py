"""Chapter 6's RMSNorm: its cases, its mistakes and its check.

Its catalogued mistakes: subtracting the mean (a LayerNorm without bias); eps outside the square root; eps left
out; the sum of squares instead of their mean; the mean over the whole tensor; no weight; eps ignored.
"""

import copy
import functools
from dataclasses import dataclass

import torch

from ...reference import decoder_only as ref
from ...remote.proxy import run_in_kernel
from .. import in_kernel
from ..harness import (
    Mistake,
    SeededRandom,
    candidates,
    close,
    construct,
    copy_weights,
    edited,
    fail,
    learner_step,
    name_the_mistake,
    one_thread,
    output_like_input,
    randomise,
    run_cases,
    seed_for,
    strict_numerics,
)
from ..how import expect_device_agnostic


@dataclass(frozen=True)
class NormCase:
    shape: tuple  # (..., d_model)
    eps: float
    scale: float  # of the input: a small one makes eps matter


VISIBLE_NORM = [NormCase((2, 5, 8), 1e-6, 1.0), NormCase((3, 6), 1e-2, 0.05)]
HIDDEN_NORM = [NormCase((4, 3, 12), 1e-6, 2.0), NormCase((2, 7, 5), 0.1, 0.2), NormCase((9, 16), 1e-3, 0.03)]
NORM_HINT = "register the scale in __init__: self.weight = nn.Parameter(torch.ones(d_model)), and no bias."


def _norm(*changes: tuple[str, str]):
    """The reference RMSNorm's forward with ``changes`` made to its source (``edited``), called (x, norm)."""
    forward = edited(ref.RMSNorm.forward, *changes)
    return lambda x, norm: forward(norm, x)


NORM_MISTAKES = [
    Mistake("RMSNorm subtracts the mean: that is LayerNorm (without its bias); RMSNorm only divides by the root "
            "mean square",
            "x / sqrt(mean(x**2, dim=-1) + eps) * weight: no x - mean.",
            _norm(("x.pow(2)", "(x - x.mean(dim=-1, keepdim=True)).pow(2)"),
                  ("return x / rms", "return (x - x.mean(dim=-1, keepdim=True)) / rms"))),
    Mistake("eps is added outside the square root: x / (sqrt(mean(x**2)) + eps)",
            "the formula is x / sqrt(mean(x**2) + eps).",
            _norm(("torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)",
                   "x.pow(2).mean(dim=-1, keepdim=True).sqrt() + self.eps"))),
    Mistake("the output is not scaled by the learnable weight",
            "multiply the normalised x by self.weight.",
            _norm((" * self.weight", ""))),
    Mistake("eps is left out: x / sqrt(mean(x**2)); eps keeps the division safe when a row is close to zero",
            "x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight.",
            _norm((" + self.eps", ""))),
    Mistake("the root of the sum of squares, not of their mean: x / sqrt(sum(x**2) + eps)",
            "mean over the last axis: x.pow(2).mean(dim=-1, keepdim=True).",
            _norm(("x.pow(2).mean(", "x.pow(2).sum("))),
    Mistake("the mean square is taken over the whole tensor, not over each row's last axis",
            "x.pow(2).mean(dim=-1, keepdim=True): one root mean square per token.",
            _norm(("x.pow(2).mean(dim=-1, keepdim=True)", "x.pow(2).mean()"))),
    Mistake("RMSNorm ignores its eps argument and uses 1e-6",
            "store eps in __init__ (self.eps = eps) and use it in forward.",
            _norm(("self.eps", "1e-6"))),
]


def _norm_inputs(i: int, case: NormCase, hidden: bool) -> tuple[ref.RMSNorm, torch.Tensor, torch.Tensor]:
    """Case ``i``'s reference RMSNorm (random weights), input x and upstream gradient, float64 on the CPU."""
    seed = functools.partial(seed_for, "RMSNorm", hidden, i)
    reference = randomise(ref.RMSNorm(case.shape[-1], case.eps).double(), SeededRandom(seed("weights")))
    x = SeededRandom(seed()).randn(*case.shape) * case.scale
    return reference, x, SeededRandom(seed("upstream")).randn(*case.shape)


def check_rms_norm(RMSNorm, hidden: bool = False) -> None:
    """Check a learner's ``RMSNorm(d_model, eps=1e-6)`` against the reference (itself proven against
    torch.nn.RMSNorm); the first case's gradients too, on every device and dtype."""
    name = "RMSNorm"
    cases = HIDDEN_NORM if hidden else VISIBLE_NORM

    def check_case(i: int, case: NormCase, device, dtype) -> None:
        reference, x64, upstream = _norm_inputs(i, case, hidden)
        module = construct(name, RMSNorm, case.shape[-1], eps=case.eps).to(torch.float64)
        copy_weights(name, module, reference, NORM_HINT)
        module = module.to(device=device, dtype=dtype)
        out = output_like_input(name, module, x64.to(device=device, dtype=dtype))
        with torch.no_grad():
            expected = reference(x64)
        if not close(out.detach(), expected):
            name_the_mistake(name, "the output", out.detach(), expected, candidates(NORM_MISTAKES, x64, reference))
        if i == 0:
            _expect_norm_gradients(name, module, reference, x64, upstream, device, dtype)

    def on_meta() -> None:
        module = construct(name, RMSNorm, cases[0].shape[-1], eps=cases[0].eps).double()
        expect_device_agnostic(name, copy.deepcopy(module).to("meta"), (_norm_inputs(0, cases[0], hidden)[1],))

    with strict_numerics(), one_thread():
        run_cases(name, cases, check_case, after=on_meta)


def _expect_norm_gradients(name, module, reference: ref.RMSNorm, x64, upstream, device, dtype) -> None:
    """Backpropagate a random upstream gradient through the learner's ``module`` (the reference's weights, on
    ``device`` in ``dtype``) and the reference RMSNorm."""
    x_ref = x64.clone().requires_grad_()
    (reference(x_ref) * upstream).sum().backward()
    x, up = x64.to(device=device, dtype=dtype), upstream.to(device=device, dtype=dtype)
    actual = learner_step(name, lambda: run_in_kernel(in_kernel.gradients, module, x, up, ["weight"]), (x,))
    if "error" in actual:
        fail(name, f"the output is not connected to the autograd graph ({actual['error']})",
             "do not use torch.no_grad(), .detach(), .data, .item() or NumPy inside forward.")
    for what, expected in (("x", x_ref.grad), ("weight", reference.weight.grad)):
        grad = actual.get(what)
        if not isinstance(grad, torch.Tensor) or not close(grad, expected):
            fail(name, f"the gradient with respect to `{what}` differs from the reference although the output is "
                 "right: part of your computation is cut from the graph",
                 "compute the root mean square from x itself, without .detach(), .data, .item() or torch.no_grad().")
