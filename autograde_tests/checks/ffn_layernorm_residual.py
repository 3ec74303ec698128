"""Checks for chapter 04_ffn_layernorm_residual: the FFN, its 1x1-conv form, LayerNorm, SublayerConnection.

Each check loads the reference's (random) weights into the learner's module, so no answer depends on
initialisation order, and runs every exercise on its own: the SublayerConnection check swaps a known
LayerNorm into ``self.norm`` and wraps a sublayer the learner did not write. Visible checks use one set
of shapes and seeds; the hidden ones nbgrader runs use others.
"""

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..reference import ffn_layernorm_residual as ref
from ..remote.proxy import is_a, is_module, lend, make_in_kernel, run_in_kernel, type_name
from . import in_kernel, stand_in_models
from .harness import (
    DROPOUT_IN_EVAL,
    Mistake,
    SeededRandom,
    call,
    candidates,
    close,
    construct,
    copy_weights,
    devices_and_dtypes,
    edited,
    error_text,
    expect_tensor,
    fail,
    largest_error,
    learner_step,
    name_the_mistake,
    output_like_input,
    randomise,
    run_cases,
    seed_for,
    strict_numerics,
)
from .how import expect_device_agnostic, kernel_reported


def _expect_deterministic(name: str, first: torch.Tensor, again: Callable[[], torch.Tensor]) -> None:
    if not close(again(), first):
        fail(name, *DROPOUT_IN_EVAL)


def _module_on_meta(module: nn.Module) -> nn.Module:
    return copy.deepcopy(module).to("meta")


# --------------------------------------------------------------------------- PositionwiseFeedForward


@dataclass(frozen=True)
class FeedForwardCase:
    batch: int
    length: int
    d_model: int
    d_ff: int
    dropout: float = 0.0  # > 0 to check that eval mode switches it off


VISIBLE_FFN = [FeedForwardCase(2, 8, 8, 16, 0.1), FeedForwardCase(3, 5, 6, 20)]
HIDDEN_FFN = [
    FeedForwardCase(2, 10, 10, 24, 0.3),  # length == d_model first: a transposed FFN runs, then is caught
    FeedForwardCase(4, 7, 12, 40),
    FeedForwardCase(1, 9, 5, 7, 0.5),
    FeedForwardCase(3, 1, 16, 64),
]
FFN_HINT = (
    "the notebook names the layers linear1 = nn.Linear(d_model, d_ff) and linear2 = nn.Linear(d_ff, d_model), "
    "both with a bias (nn.Linear's default)."
)


def _ffn(*changes: tuple[str, str]):
    """The reference FFN's forward with ``changes`` made to its source (``edited``), called (ffn, x): a mistake."""
    return edited(ref.PositionwiseFeedForward.forward, *changes)


FFN_MISTAKES = [
    Mistake("there is no ReLU between linear1 and linear2: two Linear layers in a row are a single linear map",
            "apply torch.relu (or nn.ReLU) to the output of linear1, before linear2.",
            _ffn(("torch.relu(self.linear1(x))", "self.linear1(x)"))),
    Mistake("a ReLU is also applied after linear2, so the FFN can never output a negative number",
            "the paper's FFN is linear2(relu(linear1(x))): one ReLU, between the two layers.",
            _ffn(("return self.linear2(self.dropout(hidden))",
                  "return torch.relu(self.linear2(self.dropout(hidden)))"))),
    Mistake("the activation is GELU; the paper's FFN (and this exercise) uses ReLU",
            "use torch.relu between the two layers.",
            _ffn(("torch.relu(", "nn.functional.gelu("))),
]


def _ffn_drawn(name, case: FeedForwardCase, hidden: bool, i: int) -> tuple[ref.PositionwiseFeedForward, torch.Tensor]:
    """Case ``i``'s reference FFN, with random weights, and its input, float64 on the CPU: what the check
    draws (and the test of its mistakes)."""
    module = ref.PositionwiseFeedForward(case.d_model, case.d_ff).double()
    reference = randomise(module, SeededRandom(seed_for(name, hidden, i, "weights"))).eval()
    return reference, SeededRandom(seed_for(name, hidden, i)).randn(case.batch, case.length, case.d_model)


def check_positionwise_feed_forward(PositionwiseFeedForward, hidden: bool = False) -> None:
    """Check a learner's ``PositionwiseFeedForward(d_model, d_ff, dropout=0.0)``; raise AssertionError naming the
    mistake."""
    name = "PositionwiseFeedForward"
    cases = HIDDEN_FFN if hidden else VISIBLE_FFN

    def check_case(i: int, case: FeedForwardCase, device, dtype) -> None:
        module = construct(name, PositionwiseFeedForward, case.d_model, case.d_ff, dropout=case.dropout)
        reference, x64 = _ffn_drawn(name, case, hidden, i)
        copy_weights(name, module.to(torch.float64), reference, FFN_HINT)
        module.to(device=device, dtype=dtype)
        expected = reference(x64).detach()  # before the learner's code meets x (on the CPU in float64, x is x64)
        x = x64.to(device=device, dtype=dtype)
        out = output_like_input(name, module, x).detach()
        _expect_deterministic(name, out, lambda: call(name, module, x).detach())
        if not close(out, expected):
            name_the_mistake(name, "the output", out, expected, candidates(FFN_MISTAKES, reference, x64))

    with strict_numerics():
        _expect_position_wise(name, PositionwiseFeedForward, cases[0],
                              SeededRandom(seed_for(name, hidden, "position-wise")))
        run_cases(name, cases, check_case)


def _expect_position_wise(name, PositionwiseFeedForward, case: FeedForwardCase, rng: SeededRandom) -> None:
    """Position-wise, on the learner's own initial weights: each output row depends on its input row
    only, through the same function at every position (permuting positions permutes the output)."""
    module = construct(name, PositionwiseFeedForward, case.d_model, case.d_ff, dropout=case.dropout)
    module.to(torch.float64)
    x = rng.randn(case.batch, case.length, case.d_model)
    out = call(name, module, x)
    expect_tensor(name, "the output", out, x.shape, like=x)
    _expect_deterministic(name, out, lambda: call(name, module, x))
    hint = (
        "nn.Linear acts on the last axis (d_model) and treats every other axis as a batch: apply linear1 and "
        "linear2 to x as it is, without transposing it or combining positions."
    )
    for t in range(case.length):
        nudged = x.clone()
        nudged[:, t] += rng.randn(case.batch, case.d_model)
        changed = call(name, module, nudged)
        for s in range(case.length):
            if s != t and not close(changed[:, s], out[:, s]):
                fail(name, f"your FFN mixes positions: changing the input at position {t} changed the output at "
                           f"position {s} (a position-wise FFN transforms each token on its own; mixing positions is "
                           "attention's job)", hint)
    order = torch.randperm(case.length, generator=rng.generator)
    if not close(call(name, module, x[:, order]), out[:, order]):
        fail(name, "permuting the positions of the input did not permute the output the same way: your FFN is not the "
                   "same function at every position",
             "use the same two layers, with the same weights, for every position; nothing may depend on the index.")


# ------------------------------------------------------------------------------------- ffn_as_conv1d


@dataclass(frozen=True)
class ConvCase:
    batch: int
    length: int
    d_model: int  # != d_ff, so the two convolutions can be told apart by their shapes
    d_ff: int


VISIBLE_CONV = [ConvCase(2, 6, 6, 10), ConvCase(3, 4, 5, 12)]
HIDDEN_CONV = [ConvCase(2, 9, 9, 20), ConvCase(1, 7, 12, 5), ConvCase(4, 1, 8, 32), ConvCase(3, 11, 4, 6)]
CONV_SHAPE_HINT = (
    "nn.Conv1d wants (B, channels, T): transpose x from (B, T, d_model) to (B, d_model, T) before the "
    "convolutions, and the result back to (B, T, d_model) after them."
)


def _conv(*changes: tuple[str, str]):
    """The reference 1x1-convolution FFN's forward with ``changes`` made to its source (``edited``), called
    (conv, x): a mistake."""
    return edited(ref.Conv1dFeedForward.forward, *changes)


NOT_BACK = ("return out.transpose(1, 2)", "return out")
CONV_MISTAKES = [
    Mistake("your convolution slides over the features instead of the positions: x was not transposed to "
            "(B, d_model, T) before nn.Conv1d, so the positions were treated as channels and mixed",
            CONV_SHAPE_HINT,
            _conv(("channels = x.transpose(1, 2)", "channels = x"), NOT_BACK)),
    Mistake("the output was not transposed back: it is (B, d_model, T), not (B, T, d_model)",
            CONV_SHAPE_HINT,
            _conv(NOT_BACK)),
    Mistake("there is no ReLU between the two convolutions, so this is not the FFN it was built from",
            "apply torch.relu between conv1 and conv2, as the FFN does between linear1 and linear2.",
            _conv(("torch.relu(self.conv1(channels))", "self.conv1(channels)"))),
]


def _conv_from_the_learner(name, ffn_as_conv1d, ffn64: ref.PositionwiseFeedForward) -> nn.Module:
    """The learner's convolutions, built from the weights of ``ffn64`` (handed over in float32, as a
    learner's FFN would be: its weights are exact in float32 and float64 alike)."""
    before = {k: v.float() for k, v in ffn64.state_dict().items()}
    ffn = make_in_kernel(ffn_as_conv1d, in_kernel.ffn_weights, before)
    conv = call(name, ffn_as_conv1d, ffn)
    if not is_module(conv):
        fail(name, f"should return an nn.Module, got {type_name(conv)}")
    if any(not torch.equal(before[k], v) for k, v in ffn.state_dict().items()):
        fail(name, "modified the weights of the ffn it was given",
             "copy the weights into the convolutions; leave ffn alone.")
    _expect_convolution_classes(name, conv)
    return conv.eval()


def _expect_convolution_classes(name, conv: nn.Module) -> None:
    """The classes of the module's layers, as the kernel names them (``kernel_reported``: a class of the
    learner's own can give itself any name); ``_expect_output_follows_the_convolutions`` is the rule the
    grader checks itself, finding the layers by the shapes of their weights."""
    layers = [m for m in conv.modules() if is_a(m, nn.Conv1d)]
    if not layers:
        kernel_reported(name, conv, "the module it returns has no nn.Conv1d layer",
                        "build it from nn.Conv1d(..., kernel_size=1) layers.")
    wide = next((layer.kernel_size for layer in layers if layer.kernel_size != (1,)), None)
    if wide is not None:
        kernel_reported(name, conv, f"uses nn.Conv1d with kernel_size={wide[0]}, which mixes neighbouring positions",
                        "a position-wise FFN is a 1x1 convolution: kernel_size=1.")
    if any(is_a(m, nn.Linear) for m in conv.modules()):
        kernel_reported(name, conv, "the module it returns still contains nn.Linear layers",
                        "build it from nn.Conv1d layers only.")


def _expect_convolutions_do_the_work(name, conv: nn.Module, x: torch.Tensor) -> None:
    """The kernel's record of the run: which convolutions ran, and whether F.linear did (``kernel_reported``;
    ``_expect_output_follows_the_convolutions`` is the rule the grader checks itself)."""
    calls = learner_step(name, lambda: run_in_kernel(in_kernel.convolution_calls, conv, x), (x,))
    if not isinstance(calls, dict):
        fail(name, "the grader could not watch your module run")
    if calls.get("unused"):
        unused = ", ".join(map(str, calls["unused"]))
        kernel_reported(name, conv, f"the nn.Conv1d layer {unused} is never called when the module runs",
                        "call the layers themselves in forward (self.conv1(x)), not F.conv1d or a matmul on their "
                        "weights.")
    if calls.get("linear"):
        kernel_reported(name, conv, "the module it returns calls F.linear",
                        "compute the FFN with the nn.Conv1d layers only.")


def _expect_output_follows_the_convolutions(name, conv: nn.Module, ffn64: ref.PositionwiseFeedForward,
                                            x64: torch.Tensor, rng: SeededRandom) -> None:
    """With new weights put into its two 1x1 convolutions, the module must compute the FFN of those weights:
    a value judged here, which shows the convolutions do the computing (and not weights kept elsewhere). The
    layers are found by the shapes of their weights, (out, in, 1), whatever class the kernel names."""
    d_ff, d_model = ffn64.linear1.weight.shape
    conv.to(device="cpu", dtype=torch.float64)
    layers = [(m, tuple(w.shape)) for m in conv.modules() if isinstance(w := getattr(m, "weight", None), torch.Tensor)]
    weights = []
    for shape in ((d_ff, d_model, 1), (d_model, d_ff, 1)):
        layer = next((m for m, found in layers if found == shape), None)
        if layer is None:
            fail(name, f"no nn.Conv1d layer has a weight of shape {shape}, the shape of a 1x1 convolution for this FFN")
        weights.append(rng.randn(*shape) / shape[1] ** 0.5)
        layer.weight = nn.Parameter(weights[-1].clone())
    with torch.no_grad():
        hidden = torch.relu(x64 @ weights[0][..., 0].T + ffn64.linear1.bias)
        expected = hidden @ weights[1][..., 0].T + ffn64.linear2.bias
    out = output_like_input(name, conv, x64.clone()).detach()
    if not close(out, expected):
        numbers = largest_error(out, expected)
        fail(name, "with new weights put into its nn.Conv1d layers, the module does not compute the FFN of those "
                   f"weights: its output does not come from the convolutions ({error_text(numbers)})",
             "compute forward with the convolutions themselves (self.conv1, self.conv2), holding the copied weights; "
             "keep no other copy of the weights.", numbers=numbers)


def _conv_drawn(name, case: ConvCase, hidden: bool, i: int) -> tuple[ref.PositionwiseFeedForward, torch.Tensor]:
    """Case ``i``'s FFN, float64 with weights exact in float32 too (drawn in float32), and its float64 input:
    what the check draws (and the test of its mistakes)."""
    module = ref.PositionwiseFeedForward(case.d_model, case.d_ff)
    ffn64 = randomise(module, SeededRandom(seed_for(name, hidden, i, "weights"))).double().eval()
    return ffn64, SeededRandom(seed_for(name, hidden, i)).randn(case.batch, case.length, case.d_model)


def check_ffn_as_conv1d(ffn_as_conv1d, hidden: bool = False) -> None:
    """Check a learner's ``ffn_as_conv1d(ffn) -> nn.Module`` on FFNs the learner did not write."""
    name = "ffn_as_conv1d"
    cases = HIDDEN_CONV if hidden else VISIBLE_CONV

    def build(i: int, case: ConvCase) -> nn.Module:  # once per case (its notes in a graded run printed once)
        return _conv_from_the_learner(name, ffn_as_conv1d, _conv_drawn(name, case, hidden, i)[0])

    def check_case(i: int, case: ConvCase, device, dtype, conv: nn.Module) -> None:
        ffn64, x64 = _conv_drawn(name, case, hidden, i)
        conv.to(device=device, dtype=dtype)
        with torch.no_grad():
            expected = ffn64(x64)
        x = x64.to(device=device, dtype=dtype)
        _expect_convolutions_do_the_work(name, conv, x)
        out = output_like_input(name, conv, x).detach()
        if not close(out, expected):
            name_the_mistake(name, "the output", out, expected,
                             candidates(CONV_MISTAKES, ref.ffn_as_conv1d(ffn64), x64),
                             otherwise=lambda: _expect_copied_weights(name, conv, ffn64),
                             against="the FFN it was built from")
        # the case's last run: this puts new weights into the convolutions
        if (device, dtype) == devices_and_dtypes()[-1]:
            rng = SeededRandom(seed_for(name, hidden, i, "new weights"))
            _expect_output_follows_the_convolutions(name, conv, ffn64, x64, rng)

    with strict_numerics():
        run_cases(name, cases, check_case, prepare=build)


def _expect_copied_weights(name, conv: nn.Module, ffn64: ref.PositionwiseFeedForward) -> None:
    """Why a module that is none of the known mistakes is wrong, when it is its weights: each convolution
    must hold the weights and bias of the Linear layer it replaces."""
    layers = [m for m in conv.modules() if is_a(m, nn.Conv1d)]
    for linear, which in ((ffn64.linear1, "linear1"), (ffn64.linear2, "linear2")):
        weight = linear.weight.unsqueeze(-1)  # (out, in, 1): a Linear weight as a 1x1 kernel
        match = [m for m in layers if tuple(m.weight.shape) == tuple(weight.shape)]
        if not match:
            fail(name, f"no nn.Conv1d layer has the shape of {which}: expected a weight of shape {tuple(weight.shape)}")
        layer = match[0]
        if not close(layer.weight.detach(), weight):
            fail(name, f"the weights of the convolution that replaces {which} are not {which}'s weights",
                 f"copy ffn.{which}.weight into it, reshaped to (out, in, 1) with .unsqueeze(-1).")
        if layer.bias is None or not close(layer.bias.detach(), linear.bias):
            fail(name, f"the bias of the convolution that replaces {which} is not {which}'s bias (biases not copied)",
                 f"copy ffn.{which}.bias into the convolution's bias too.")


# ----------------------------------------------------------------------------------------- LayerNorm


@dataclass(frozen=True)
class LayerNormCase:
    shape: tuple[int, ...]  # (..., d_model)
    eps: float | None = None  # None: the default, constructed as LayerNorm(d_model)
    scale: float = 1.0  # a small scale makes ε matter next to the variance


VISIBLE_LAYER_NORM = [LayerNormCase((2, 5, 8)), LayerNormCase((3, 4, 6), scale=0.01), LayerNormCase((4, 10), eps=0.1)]
HIDDEN_LAYER_NORM = [
    LayerNormCase((3, 7, 12)),
    LayerNormCase((2, 3, 4, 5), scale=0.005),
    LayerNormCase((5, 9), eps=0.3),
    LayerNormCase((2, 6, 16), eps=1e-3, scale=0.05),
    LayerNormCase((4, 2, 7), scale=30.0),
]


def _layer_norm(*changes: tuple[str, str]):
    """The reference LayerNorm's forward with ``changes`` made to its source (``edited``), called (norm, x):
    a mistake."""
    return edited(ref.LayerNorm.forward, *changes)


def _over(dims: str):
    """A LayerNorm whose mean and variance are taken over ``dims`` (as written in the source) instead of the
    features."""
    return _layer_norm(("x.mean(dim=-1,", f"x.mean(dim={dims},"), ("x.var(dim=-1,", f"x.var(dim={dims},"))


UNBIASED = ("unbiased=False", "unbiased=True")
EPS_OUTSIDE = ("torch.sqrt(var + self.eps)", "(torch.sqrt(var) + self.eps)")
BATCH_NORM = (
    "normalises over the batch axis (BatchNorm) instead of the feature axis: LayerNorm takes the mean and "
    "variance of each position's d_model features"
)
LAYER_NORM_MISTAKES = [
    Mistake("two mistakes at once: your LayerNorm uses the unbiased variance (dividing by d_model - 1) and adds eps "
            "outside the square root, to the standard deviation: (x - mean) / (std + eps)",
            "use x.var(dim=-1, keepdim=True, unbiased=False) and the formula (x - mean) / sqrt(var + eps).",
            _layer_norm(UNBIASED, EPS_OUTSIDE)),
    Mistake("your LayerNorm uses the unbiased variance (dividing by d_model - 1); LayerNorm divides by d_model",
            "use x.var(dim=-1, keepdim=True, unbiased=False) (torch.var and torch.std are unbiased by default).",
            _layer_norm(UNBIASED)),
    Mistake("eps is added outside the square root: (x - mean) / (sqrt(var) + eps)",
            "the formula is (x - mean) / sqrt(var + eps).",
            _layer_norm(EPS_OUTSIDE)),
    Mistake("your LayerNorm ignores its eps argument and always uses 1e-5",
            "store eps in __init__ (self.eps = eps) and use it in forward.",
            _layer_norm(("self.eps", "1e-5"))),
    Mistake("eps is missing: (x - mean) / sqrt(var)",
            "add eps inside the square root, (x - mean) / sqrt(var + eps), so a constant vector does not divide by 0.",
            _layer_norm((" + self.eps", ""))),
    Mistake("no learnable weight and bias: the output is not scaled by weight and shifted by bias",
            "return self.weight * x_hat + self.bias, with weight and bias nn.Parameters of shape (d_model,).",
            _layer_norm(("self.weight * ", ""), (" + self.bias", ""))),
    Mistake("weight and bias are swapped: the output is scaled by bias and shifted by weight",
            "return self.weight * x_hat + self.bias.",
            _layer_norm(("self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias",
                         "self.bias * (x - mean) / torch.sqrt(var + self.eps) + self.weight"))),
    Mistake(BATCH_NORM, "reduce over dim=-1 with keepdim=True.", _over("tuple(range(x.dim() - 1))")),
    Mistake(BATCH_NORM, "reduce over dim=-1 with keepdim=True.", _over("0")),
    Mistake("normalises over the last two axes (positions and features) instead of the features only",
            "reduce over dim=-1 only: each position is normalised on its own.",
            _over("(-2, -1)")),
]
NO_PARAMETERS_HINT = (
    "register them in __init__: self.weight = nn.Parameter(torch.ones(d_model)) and "
    "self.bias = nn.Parameter(torch.zeros(d_model))."
)


def _layer_norm_drawn(name, case: LayerNormCase, hidden: bool, i: int) -> tuple[ref.LayerNorm, torch.Tensor]:
    """Case ``i``'s reference LayerNorm, with random weights, and its input, float64 on the CPU: what the
    check draws (and the test of its mistakes)."""
    eps = 1e-5 if case.eps is None else case.eps
    reference = randomise(ref.LayerNorm(case.shape[-1], eps=eps).double(),
                          SeededRandom(seed_for(name, hidden, i, "weights")))
    rng = SeededRandom(seed_for(name, hidden, i))
    offset = 3 * rng.randn(*case.shape[:-1], 1)  # each row has its own mean, which must be removed
    return reference, (rng.randn(*case.shape) + offset) * case.scale


def _loaded_layer_norm(name, LayerNorm, case: LayerNormCase, hidden, i, device, dtype) -> nn.Module:
    """The learner's LayerNorm (with the case's eps, else the default), whose weight and bias must be
    nn.Parameters, loaded with case ``i``'s weights (a reference drawn for it alone)."""
    d_model = case.shape[-1]
    module = (construct(name, LayerNorm, d_model) if case.eps is None
              else construct(name, LayerNorm, d_model, eps=case.eps))
    for param in ("weight", "bias"):
        value = getattr(module, param, None)
        if not is_a(value, nn.Parameter):
            what = "is missing" if value is None else f"is a {type_name(value)}, not an nn.Parameter"
            fail(name, f"no learnable weight and bias: `self.{param}` {what}", NO_PARAMETERS_HINT)
    module = module.to(torch.float64)
    copy_weights(name, module, _layer_norm_drawn(name, case, hidden, i)[0], NO_PARAMETERS_HINT)
    return module.to(device=device, dtype=dtype)


def check_layer_norm(LayerNorm, hidden: bool = False) -> None:
    """Check a learner's ``LayerNorm(d_model, eps=1e-5)`` against the reference, values and gradients."""
    name = "LayerNorm"
    cases = HIDDEN_LAYER_NORM if hidden else VISIBLE_LAYER_NORM

    def check_case(i: int, case: LayerNormCase, device, dtype) -> None:
        module = _loaded_layer_norm(name, LayerNorm, case, hidden, i, device, dtype)
        reference, x64 = _layer_norm_drawn(name, case, hidden, i)
        expected = reference(x64).detach()  # before the learner's code meets x (on the CPU in float64, x is x64)
        x = x64.to(device=device, dtype=dtype)
        out = output_like_input(name, module, x).detach()
        if not close(out, expected):
            name_the_mistake(name, "the output", out, expected, candidates(LAYER_NORM_MISTAKES, reference, x64))
        if i == len(cases) - 1:  # gradients after the outputs: a mistake that shows in them is named as such
            _expect_layer_norm_gradients(name, LayerNorm, case, hidden, i, device, dtype)

    def on_meta() -> None:
        module = _loaded_layer_norm(name, LayerNorm, cases[0], hidden, 0, torch.device("cpu"), torch.float64)
        expect_device_agnostic(name, _module_on_meta(module), (_layer_norm_drawn(name, cases[0], hidden, 0)[1],))

    with strict_numerics():
        run_cases(name, cases, check_case, after=on_meta)


def _expect_layer_norm_gradients(name, LayerNorm, case: LayerNormCase, hidden, i, device, dtype) -> None:
    """Backpropagate a random upstream gradient through the learner's and the reference LayerNorm."""
    reference, x64 = _layer_norm_drawn(name, case, hidden, i)
    upstream = SeededRandom(seed_for(name, hidden, i, "upstream")).randn(*case.shape)
    x_ref = x64.clone().requires_grad_()
    (reference(x_ref) * upstream).sum().backward()
    expected = {"x": x_ref.grad, "weight": reference.weight.grad, "bias": reference.bias.grad}

    module = _loaded_layer_norm(name, LayerNorm, case, hidden, i, device, dtype)
    x = x64.to(device=device, dtype=dtype)
    upstream = upstream.to(device=device, dtype=dtype)
    actual = learner_step(name, lambda: run_in_kernel(in_kernel.gradients, module, x, upstream, ["weight", "bias"]),
                          (x,))
    if "error" in actual:
        fail(name, "the output is not connected to the autograd graph, so nothing can learn through it "
                   f"({actual['error']})",
             "do not use torch.no_grad(), .detach(), .data, .item() or NumPy inside forward.")
    for what in expected:
        grad = actual.get(what)
        if not isinstance(grad, torch.Tensor):
            fail(name, f"no gradient reaches `{what}`",
                 "keep every step in torch on the tensors themselves: no .detach(), .data, .item() or NumPy.")
        if not close(grad, expected[what]):
            numbers = largest_error(grad, expected[what])
            fail(name, f"the gradient with respect to `{what}` differs from the reference although the output is "
                       f"right: part of your computation is cut from the graph ({error_text(numbers)})",
                 "compute the mean and variance from x itself, without .detach(), .data, .item() or torch.no_grad().",
                 numbers=numbers)


# -------------------------------------------------------------------------------- SublayerConnection


@dataclass(frozen=True)
class SublayerCase:
    batch: int
    length: int
    d_model: int
    norm_first: bool
    # "ffn": a position-wise layer with random weights; "attention": parameter-free self-attention
    sublayer: str = "ffn"
    dropout: float = 0.0  # > 0 to check that eval mode switches it off


VISIBLE_SUBLAYER = [
    SublayerCase(2, 5, 8, norm_first=False, dropout=0.2),
    SublayerCase(2, 5, 8, norm_first=True, dropout=0.2),
    SublayerCase(3, 4, 6, norm_first=True, sublayer="attention"),
]
HIDDEN_SUBLAYER = [
    SublayerCase(3, 7, 12, norm_first=False, dropout=0.1),
    SublayerCase(3, 7, 12, norm_first=True, dropout=0.1),
    SublayerCase(2, 6, 10, norm_first=False, sublayer="attention"),
    SublayerCase(4, 3, 5, norm_first=True),
    SublayerCase(1, 9, 16, norm_first=False),
]
TRAIN_DROPOUT = 0.5
NORM_HINT = "the notebook names the LayerNorm self.norm = LayerNorm(d_model) (yours from above, or nn.LayerNorm)."


# The expected output in either placement: the check's own arithmetic on the input as drawn.
def _post(x, f, norm):
    return norm(x + f(x))


def _pre(x, f, norm):
    return x + f(norm(x))


PRE_LN = "x + self.dropout(sublayer(self.norm(x)))"
POST_LN = "self.norm(x + self.dropout(sublayer(x)))"
OWN_NORM = "LayerNorm(x.size(-1)).to(x)"  # a LayerNorm of the module's own, as built: weight 1, bias 0


def _connection(*changes: tuple[str, str]):
    """The reference SublayerConnection's forward with ``changes`` made to its source (``edited``), called
    (connection, x, sublayer): a mistake."""
    return edited(ref.SublayerConnection.forward, *changes)


def _both(wiring: str):
    """A mistake that computes ``wiring`` in either placement."""
    return _connection((PRE_LN, wiring), (POST_LN, wiring))


SUBLAYER_MISTAKES = [
    Mistake("Pre-LN written as `x = norm(x); x = x + f(x)`: the residual carries the normalised x instead of x",
            "keep x for the residual path: return x + dropout(sublayer(self.norm(x))).",
            _connection((PRE_LN, "self.norm(x) + self.dropout(sublayer(self.norm(x)))"))),
    Mistake("Pre-LN and Post-LN swapped: with norm_first=False (Post-LN, the paper) the output should be "
            "norm(x + dropout(sublayer(x))); with norm_first=True (Pre-LN), x + dropout(sublayer(norm(x)))",
            "check which branch runs for norm_first=True and which for norm_first=False.",
            _connection(("if self.norm_first:", "if not self.norm_first:"))),
    Mistake("the residual connection is missing: x is not added back to the sublayer's output",
            "Post-LN: norm(x + dropout(sublayer(x))); Pre-LN: x + dropout(sublayer(norm(x))).",
            _connection((PRE_LN, "self.dropout(sublayer(self.norm(x)))"),
                        (POST_LN, "self.norm(self.dropout(sublayer(x)))"))),
    Mistake("self.norm is never applied: the output is x + sublayer(x)",
            "Post-LN normalises the sum, norm(x + ...); Pre-LN normalises the sublayer's input, sublayer(norm(x)).",
            _both("x + self.dropout(sublayer(x))")),
    Mistake("the LayerNorm is applied to the sublayer's output, x + norm(sublayer(x)), instead of where the placement "
            "puts it",
            "Post-LN: norm(x + dropout(sublayer(x))); Pre-LN: x + dropout(sublayer(norm(x))).",
            _both("x + self.norm(self.dropout(sublayer(x)))")),
    Mistake("your forward does not use self.norm (the check puts a LayerNorm with known weights there)",
            "normalise with self.norm, the attribute the notebook names; do not keep a second LayerNorm.",
            _connection((PRE_LN, PRE_LN.replace("self.norm", OWN_NORM)),
                        (POST_LN, POST_LN.replace("self.norm", OWN_NORM)))),
]


def _reference_connection(norm: ref.LayerNorm, norm_first: bool) -> ref.SublayerConnection:
    """The reference SublayerConnection, in eval mode, with ``norm`` as its LayerNorm: what the mistakes edit."""
    connection = ref.SublayerConnection(norm.weight.numel(), norm_first=norm_first).eval()
    connection.norm = norm
    return connection


def _sublayer_drawn(name, case: SublayerCase, hidden: bool, i: int) -> tuple[ref.LayerNorm, Callable, torch.Tensor]:
    """Case ``i``'s LayerNorm (random weights), sublayer and input, float64 on the CPU: what the check draws
    (and the test of its mistakes). The sublayer is one the learner did not write: self-attention with no
    parameters, or a random position-wise layer."""
    x64 = 2 * SeededRandom(seed_for(name, hidden, i)).randn(case.batch, case.length, case.d_model) + 1
    norm = randomise(ref.LayerNorm(case.d_model).double(), SeededRandom(seed_for(name, hidden, i, "weights")))
    if case.sublayer == "attention":
        return norm, stand_in_models.attention_sublayer, x64
    linear = randomise(nn.Linear(case.d_model, case.d_model).double(),
                       SeededRandom(seed_for(name, hidden, i, "sublayer")))
    return norm, stand_in_models.position_wise_sublayer(
        {f"0.{key}": value for key, value in linear.state_dict().items()}), x64


def _moved(f: Callable, device, dtype=torch.float64) -> Callable:
    """A copy of the sublayer ``f`` on ``device`` in ``dtype`` (the parameter-free attention as it is)."""
    return copy.deepcopy(f).to(device=device, dtype=dtype) if isinstance(f, nn.Module) else f


def _sublayer_connection(name, SublayerConnection, case: SublayerCase, norm: ref.LayerNorm, device, dtype,
                         dropout=None):
    """The learner's module with a known LayerNorm swapped into ``self.norm``: PyTorch's, with the weights of
    ``norm``, the reference's (the learner's own LayerNorm is graded on its own)."""
    p = case.dropout if dropout is None else dropout
    module = construct(name, SublayerConnection, case.d_model, dropout=p, norm_first=case.norm_first)
    if not is_module(getattr(module, "norm", None)):
        fail(name, "has no LayerNorm module `self.norm`", NORM_HINT)
    known = nn.LayerNorm(case.d_model, dtype=torch.float64)
    known.load_state_dict(norm.state_dict())
    module.norm = known
    return module.to(device=device, dtype=dtype)


def check_sublayer_connection(SublayerConnection, hidden: bool = False) -> None:
    """Check a learner's ``SublayerConnection(d_model, dropout=0.0, norm_first=False)``, both placements."""
    name = "SublayerConnection"
    cases = HIDDEN_SUBLAYER if hidden else VISIBLE_SUBLAYER

    def check_case(i: int, case: SublayerCase, device, dtype) -> None:
        norm, f, x64 = _sublayer_drawn(name, case, hidden, i)
        module = _sublayer_connection(name, SublayerConnection, case, norm, device, dtype)
        with torch.no_grad():  # before the learner's code meets x (on the CPU in float64, x is x64)
            expected = (_pre if case.norm_first else _post)(x64, f, norm)
        x = x64.to(device=device, dtype=dtype)
        sublayer = lend(module, stand_in_models.CountedSublayer(_moved(f, device, dtype)))
        out = call(name, module, x, sublayer)
        if sublayer.calls != 1:  # the grader's own count: the sublayer is lent (``lend``)
            fail(name, f"calls the sublayer {sublayer.calls} times in one forward pass",
                 "call it exactly once: sublayer(x) for Post-LN, sublayer(self.norm(x)) for Pre-LN.")
        expect_tensor(name, "the output", out, x.shape, like=x)
        out = out.detach()
        _expect_deterministic(name, out, lambda: call(name, module, x, sublayer).detach())
        if not close(out, expected):
            mistaken = candidates(SUBLAYER_MISTAKES, _reference_connection(norm, case.norm_first), x64, f)
            placement = "Pre-LN (norm_first=True)" if case.norm_first else "Post-LN (norm_first=False)"
            name_the_mistake(name, f"the {placement} output", out, expected, mistaken)
        if i < 2 and dtype == torch.float64:  # one Post-LN and one Pre-LN case in training mode, on every device
            _expect_dropout_on_the_sublayer_only(name, SublayerConnection, case, hidden, i, device)

    def on_meta() -> None:
        norm, f, x64 = _sublayer_drawn(name, cases[0], hidden, 0)
        module = _sublayer_connection(name, SublayerConnection, cases[0], norm, torch.device("cpu"), torch.float64)
        expect_device_agnostic(name, _module_on_meta(module), (x64, _moved(f, torch.device("meta"))))

    with strict_numerics():
        run_cases(name, cases, check_case, after=on_meta)


def _expect_dropout_on_the_sublayer_only(name, SublayerConnection, case: SublayerCase, hidden: bool, i: int,
                                         device) -> None:
    """In training mode, with dropout 0.5: the identity path is never dropped, the sublayer's output is.

    Seeded, so the verdict is the same on every run; the properties hold for any dropout mask.
    """
    norm, f, x64 = _sublayer_drawn(name, case, hidden, i)
    module = _sublayer_connection(name, SublayerConnection, case, norm, device, torch.float64, TRAIN_DROPOUT).train()
    norm, x, f = norm.to(device), x64.to(device), _moved(f, device)
    forked = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked), torch.no_grad():
        residual_only = norm(x) if not case.norm_first else x.clone()  # before the learner's code meets x
        torch.manual_seed(seed_for(name, hidden, i, "dropout"))
        out = call(name, module, x, lend(module, torch.zeros_like))
        if not close(out, residual_only):
            numbers = largest_error(out, residual_only)
            fail(name, "dropout applied to the residual sum instead of the sublayer output: in training mode, with a "
                       "sublayer that returns zeros, the output should be exactly "
                       f"{'x' if case.norm_first else 'norm(x)'} ({error_text(numbers)})",
                 "dropout belongs on the sublayer's output only: x + dropout(sublayer(...)); the identity path must "
                 "carry x untouched.", numbers=numbers)
        full = x + f(norm(x)) if case.norm_first else norm(x + f(x))  # x as drawn: `call` saw it unchanged
        out = call(name, module, x, lend(module, f))
        if close(out, full):
            fail(name, f"dropout is never applied in training mode: with dropout={TRAIN_DROPOUT} nothing was dropped",
                 "store nn.Dropout(dropout) in __init__ and apply it to the sublayer's output.")
        if case.norm_first:
            delta, scaled = out - x, f(norm(x)) / (1 - TRAIN_DROPOUT)
            tol = 1e-9 * (1 + scaled.abs())
            dropped_or_kept = ((delta.abs() <= tol) | ((delta - scaled).abs() <= tol)).all()
            if not dropped_or_kept:
                fail(name, "in training mode the output is not x + dropout(sublayer(norm(x))): each element of the "
                           "sublayer's output should be either dropped or scaled by 1/(1 - p)",
                     "apply dropout exactly once, to what the sublayer returns.")
