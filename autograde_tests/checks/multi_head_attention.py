"""Checks for chapter 02_multi_head_attention: ``split_heads``, ``merge_heads`` and ``MultiHeadAttention``.

The module check builds an ``nn.MultiheadAttention`` with seeded weights, turns it into the reference
with ``MultiHeadAttention.from_torch``, loads those weights into the learner's module, and compares the
learner's output with both. Visible checks use one fixed set of shapes; the hidden ones use others, with
m != n, batch > 1, h in {1, 2, 4, ...} and both bias settings, and draw other numbers (``seed_for``).
"""

from dataclasses import dataclass, replace

import torch
from torch import nn

from ..reference import multi_head_attention as ref
from ..reference.attention import scaled_dot_product_attention
from .harness import (
    ChangedInput,
    CheckFailed,
    Mistake,
    SeededRandom,
    call,
    candidates,
    close,
    construct,
    copy_weights,
    edited,
    expect_tensor,
    fail,
    fail_difference,
    name_the_mistake,
    randomise,
    run_cases,
    seed_for,
    strict_numerics,
)
from .how import expect_device_agnostic

CONTRACT = "the notebook asks for w_q, w_k, w_v, w_o, each nn.Linear(d_model, d_model, bias=bias)."


def _call_reporting_views(name, fn, *args, **kwargs):
    """``call``, with a hint for the classic ``.view`` after ``.transpose``."""
    try:
        return call(name, fn, *args, **kwargs)
    except CheckFailed as error:
        if "view size is not compatible" in (error.exception or ""):  # PyTorch's words for a .view it cannot make
            raise replace(error, hint="after a transpose the tensor is no longer contiguous: use .reshape, "
                                      "or .contiguous().view.") from None
        raise


# ---------------------------------------------------------------------------- split_heads, merge_heads


@dataclass(frozen=True)
class HeadsCase:
    batch: int
    length: int
    n_heads: int
    d_k: int


VISIBLE_HEADS = [HeadsCase(2, 3, 2, 4), HeadsCase(1, 5, 4, 3), HeadsCase(3, 4, 1, 6)]
HIDDEN_HEADS = [
    HeadsCase(3, 7, 4, 2),
    HeadsCase(2, 5, 2, 6),
    HeadsCase(4, 2, 3, 5),
    HeadsCase(1, 6, 8, 1),
    HeadsCase(2, 4, 1, 3),
]

HEADS_APART = "reshape(B, T, n_heads, d_k).transpose(1, 2)"  # split_heads: features into heads, heads to the front
HEADS_TOGETHER = "x.transpose(1, 2).reshape"  # merge_heads: heads back behind the positions, then side by side
SPLIT_WITHOUT_TRANSPOSE = edited(ref.split_heads, (HEADS_APART, "reshape(B, n_heads, T, d_k)"))
MERGE_WITHOUT_TRANSPOSE = edited(ref.merge_heads, (HEADS_TOGETHER, "x.reshape"))

SPLIT_MISTAKES = [
    Mistake(
        "heads mix positions: you reshaped (B, T, d_model) straight to (B, h, T, d_k) without the transpose",
        "reshape to (B, T, h, d_k) first, so that only the features are split, then .transpose(1, 2).",
        SPLIT_WITHOUT_TRANSPOSE,
    ),
    Mistake(
        "each head takes every h-th feature instead of a block of d_k neighbouring features",
        "head i owns features i*d_k .. (i+1)*d_k - 1: reshape to (B, T, h, d_k), not (B, T, d_k, h).",
        edited(ref.split_heads, (HEADS_APART, "reshape(B, T, d_k, n_heads).permute(0, 3, 1, 2)")),
    ),
]
MERGE_MISTAKES = [
    Mistake(
        "merging heads without transposing back: you reshaped (B, h, T, d_k) straight to (B, T, d_model), "
        "so positions and heads are mixed",
        "first .transpose(1, 2) back to (B, T, h, d_k), then reshape to (B, T, h * d_k).",
        MERGE_WITHOUT_TRANSPOSE,
    ),
    Mistake(
        "heads are interleaved feature by feature instead of placed side by side",
        "the inverse of split_heads puts head 0's d_k features first, then head 1's, ...: "
        ".transpose(1, 2).reshape(B, T, h * d_k).",
        edited(ref.merge_heads, (HEADS_TOGETHER, "x.permute(0, 2, 3, 1).reshape")),
    ),
]


def _split_input(case: HeadsCase, hidden: bool, i: int) -> torch.Tensor:
    """split_heads' input x, (B, T, h * d_k), of case ``i`` of the visible or hidden cases, float64 on the CPU."""
    return SeededRandom(seed_for("split_heads", hidden, i)).randn(case.batch, case.length, case.n_heads * case.d_k)


def _merge_input(case: HeadsCase, hidden: bool, i: int) -> torch.Tensor:
    """merge_heads' input x, (B, h, T, d_k), of case ``i`` of the visible or hidden cases, float64 on the CPU."""
    return SeededRandom(seed_for("merge_heads", hidden, i)).randn(case.batch, case.n_heads, case.length, case.d_k)


def check_split_heads(split_heads, hidden: bool = False) -> None:
    """Check a learner's ``split_heads(x, n_heads)``: (B, T, d_model) -> (B, h, T, d_k)."""
    name = "split_heads"
    cases = HIDDEN_HEADS if hidden else VISIBLE_HEADS

    def check_case(i: int, case: HeadsCase, device, dtype) -> None:
        B, T, h, d_k = case.batch, case.length, case.n_heads, case.d_k
        x64 = _split_input(case, hidden, i)
        x = x64.to(dtype=dtype, device=device)
        out = _call_reporting_views(name, split_heads, x, h)
        if isinstance(out, torch.Tensor) and tuple(out.shape) == (B, h, T, h * d_k) and h > 1:
            fail(name, f"each head has d_model = {h * d_k} features instead of d_k = d_model / h = {d_k}",
                 "the h heads share the d_model features: d_k = d_model // n_heads.")
        expect_tensor(name, "the output", out, (B, h, T, d_k), like=x)
        expected = ref.split_heads(x64, h)
        if not close(out, expected):
            name_the_mistake(name, "the output", out, expected, candidates(SPLIT_MISTAKES, x64, h))

    with strict_numerics():
        run_cases(name, cases, check_case, after=lambda: expect_device_agnostic(
            name, split_heads, (SeededRandom(seed_for(name, hidden, "device")).randn(2, 3, 8), cases[0].n_heads)))


def check_merge_heads(merge_heads, hidden: bool = False) -> None:
    """Check a learner's ``merge_heads(x)``: (B, h, T, d_k) -> (B, T, h * d_k), the inverse of split_heads."""
    name = "merge_heads"
    cases = HIDDEN_HEADS if hidden else VISIBLE_HEADS

    def check_case(i: int, case: HeadsCase, device, dtype) -> None:
        B, T, h, d_k = case.batch, case.length, case.n_heads, case.d_k
        x64 = _merge_input(case, hidden, i)
        x = x64.to(dtype=dtype, device=device)
        out = _call_reporting_views(name, merge_heads, x)
        expect_tensor(name, "the output", out, (B, T, h * d_k), like=x)
        expected = ref.merge_heads(x64)
        if not close(out, expected):
            name_the_mistake(name, "the output", out, expected, candidates(MERGE_MISTAKES, x64))

    with strict_numerics():
        run_cases(name, cases, check_case, after=lambda: expect_device_agnostic(
            name, merge_heads, (SeededRandom(seed_for(name, hidden, "device")).randn(2, 2, 3, 4),)))


# ---------------------------------------------------------------------------------- MultiHeadAttention


@dataclass(frozen=True)
class MHACase:
    batch: int
    m: int
    n: int
    d_model: int
    n_heads: int
    bias: bool
    mask: str | None = None  # None, "keys" (B, 1, 1, n), "pairs" (m, n), "both" (B, 1, m, n), "heads" (B, h, m, n)
    self_attention: bool = False  # forward(x) with y left out (then n == m)


VISIBLE_MHA = [
    MHACase(2, 3, 5, 8, 2, False),
    MHACase(2, 4, 6, 12, 4, True, "keys"),
    MHACase(3, 5, 5, 6, 1, False, "pairs", self_attention=True),
]
HIDDEN_MHA = [
    MHACase(3, 5, 7, 16, 4, False),
    MHACase(2, 6, 3, 12, 2, True, "keys"),
    MHACase(4, 4, 4, 10, 1, True, self_attention=True),
    MHACase(2, 7, 5, 8, 4, False, "both"),
    MHACase(3, 6, 6, 18, 3, False, "keys", self_attention=True),
    MHACase(2, 3, 8, 16, 8, True, "heads"),
    MHACase(1, 2, 9, 6, 2, False, "pairs"),
]


def _mha_inputs(case: MHACase, hidden: bool, i: int):
    """Case ``i``'s float64 CPU x, y, our mask (True = may attend) and torch's two masks (True = blocked)."""
    rng = SeededRandom(seed_for("MultiHeadAttention", hidden, i))
    B, m, n, h = case.batch, case.m, case.n, case.n_heads
    x = rng.randn(B, m, case.d_model)
    y = x if case.self_attention else rng.randn(B, n, case.d_model)
    keys = rng.bernoulli(0.7, B, n)
    pairs = rng.bernoulli(0.7, *((B, h, m, n) if case.mask == "heads" else (m, n)))
    keys[:, 0] = pairs[..., 0] = True  # no query may attend to nothing: torch would return NaN there
    mask = key_padding = attn = None
    if case.mask in ("keys", "both"):
        mask, key_padding = keys[:, None, None, :], ~keys
    if case.mask in ("pairs", "both", "heads"):
        mask = pairs if mask is None else mask & pairs
        attn = ~pairs.reshape(B * h, m, n) if case.mask == "heads" else ~pairs
    return x, y, mask, key_padding, attn


def _modules(case: MHACase, hidden: bool, i: int):
    """Case ``i``'s nn.MultiheadAttention with seeded weights and the reference built from it."""
    torch_mha = nn.MultiheadAttention(
        case.d_model, case.n_heads, bias=case.bias, batch_first=True, dtype=torch.float64
    ).eval()
    randomise(torch_mha, SeededRandom(seed_for("MultiHeadAttention", hidden, i, "weights")))
    return torch_mha, ref.MultiHeadAttention.from_torch(torch_mha).eval()


def _mha(*changes: tuple[str, str], **names):
    """The reference MultiHeadAttention's forward with ``changes`` made to its source and ``names`` in place of
    the functions it calls (``edited``): a mistake, called (module, x, y, mask)."""
    return edited(ref.MultiHeadAttention.forward, *changes, **names)


ATTEND = "scaled_dot_product_attention(q, k, v, mask)"
# Inside the attention of the heads, q is (B, h, m, d_k): h * d_k is d_model.
SCALED_BY_D_MODEL = edited(scaled_dot_product_attention, ("math.sqrt(d_k)", "math.sqrt(q.size(1) * d_k)"))

MHA_MISTAKES = [
    Mistake(
        "your scores are scaled by sqrt(d_model) instead of sqrt(d_k), the size of one head",
        "each head compares d_k = d_model // n_heads features: divide the scores by math.sqrt(d_k).",
        _mha(scaled_dot_product_attention=SCALED_BY_D_MODEL),
    ),
    Mistake(
        "heads mix positions: the projections were reshaped to (B, h, T, d_k) without the transpose",
        "reshape to (B, T, h, d_k) first, then .transpose(1, 2).",
        _mha(split_heads=SPLIT_WITHOUT_TRANSPOSE),
    ),
    Mistake(
        "heads mix positions: they were split without the transpose and merged without transposing back",
        "split: reshape to (B, T, h, d_k), then .transpose(1, 2); merge: .transpose(1, 2), then reshape.",
        _mha(split_heads=SPLIT_WITHOUT_TRANSPOSE, merge_heads=MERGE_WITHOUT_TRANSPOSE),
    ),
    Mistake(
        "merging heads without transposing back: (B, h, m, d_k) was reshaped straight to (B, m, d_model)",
        "first .transpose(1, 2) back to (B, m, h, d_k), then reshape to (B, m, d_model), then apply w_o.",
        _mha(merge_heads=MERGE_WITHOUT_TRANSPOSE),
    ),
    Mistake(
        "the mask is ignored: these values match attention computed without it",
        "pass `mask` on to the attention of every head; it broadcasts against the (B, h, m, n) scores.",
        _mha((ATTEND, "scaled_dot_product_attention(q, k, v, None)")),
    ),
    Mistake(
        "mask polarity inverted: your code treats True as 'blocked'",
        "in this course True means 'may attend' (nn.MultiheadAttention uses the opposite); "
        "fill the scores where the mask is False.",
        _mha((ATTEND, "scaled_dot_product_attention(q, k, v, ~mask)")),
    ),
]


def _expect_contract_parameters(name, module, case: MHACase) -> None:
    """Name the mistakes that show in the parameters' shapes before loading the reference's weights."""
    d_model, h = case.d_model, case.n_heads
    d_k = d_model // h
    shapes = {key: tuple(value.shape) for key, value in module.state_dict().items()}
    w_q = shapes.get("w_q.weight")
    if w_q is not None and w_q != (d_model, d_model):
        if w_q == (h * d_model, d_model):
            fail(name, f"head size d_model instead of d_model / h: w_q maps {d_model} features to h * d_model = "
                 f"{w_q[0]}",
                 f"each of the h heads has d_k = d_model // n_heads = {d_k} features, so all heads together "
                 "need d_model: w_q = nn.Linear(d_model, d_model).")
        if w_q == (d_k, d_k):
            fail(name, f"w_q is a ({d_k}, {d_k}) projection applied per head: you split into heads before the "
                 "projection",
                 "project the whole d_model-wide input with nn.Linear(d_model, d_model) first, then split "
                 "the result into heads.")
        if w_q == (d_k, d_model):
            fail(name, f"projecting per head with the wrong size: w_q maps d_model = {d_model} to d_k = {d_k}, "
                 "one head's worth, for all heads",
                 "one nn.Linear(d_model, d_model) holds the projections of all h heads side by side.")
    biases = sorted(key for key in shapes if key.endswith(".bias"))
    if biases and not case.bias:
        fail(name, f"bias on when bias=False: your module has {', '.join(biases)}",
             "nn.Linear has bias=True by default: pass bias=bias to each nn.Linear.")
    if case.bias and not biases:
        fail(name, "ignores bias=True: your module has no bias parameters", "pass bias=bias to each nn.Linear.")


def _forward(name, module, case: MHACase, x, y, mask):
    """Call the module as the contract says; name the mistake of using the query length for keys/values."""
    kwargs = {} if mask is None else {"mask": mask}
    if case.self_attention:
        return call(name, module, x, **kwargs)
    try:
        return call(name, module, x, y, **kwargs)
    except ChangedInput:
        raise
    except AssertionError:
        if case.m != case.n and mask is None and _runs(module, x, x):
            fail(name, f"works when m == n but fails with m = {case.m} queries and n = {case.n} keys: the keys and "
                 "values were reshaped with the query length",
                 "take the length of each tensor from itself: y.size(1) for keys and values, or reshape with -1.")
        raise


def _runs(module, *args) -> bool:
    try:
        module(*args)
    except Exception:  # the learner's code may raise anything
        return False
    return True


def check_multi_head_attention(MultiHeadAttention, hidden: bool = False) -> None:
    """Check a learner's ``MultiHeadAttention(d_model, n_heads, bias=False)``: forward(x, y=None, mask=None)."""
    name = "MultiHeadAttention"
    cases = HIDDEN_MHA if hidden else VISIBLE_MHA

    def check_case(i: int, case: MHACase, device, dtype, modules) -> None:
        """The learner's forward on case ``i`` against the reference's, then against torch's."""
        torch_mha, reference = modules
        args = (case.d_model, case.n_heads) + ((True,) if case.bias else ())  # bias=False by default
        learner = construct(name, MultiHeadAttention, *args)
        _expect_contract_parameters(name, learner, case)
        learner.to(dtype=dtype, device=device)
        copy_weights(name, learner, reference, CONTRACT)
        x64, y64, mask64, key_padding, attn = _mha_inputs(case, hidden, i)
        expected_out, expected_weights = reference(x64, y64, mask64)
        torch_output, _ = torch_mha(x64, y64, y64, key_padding_mask=key_padding, attn_mask=attn, need_weights=False)
        x, y = x64.to(dtype=dtype, device=device), y64.to(dtype=dtype, device=device)
        mask = None if mask64 is None else mask64.to(device)
        result = _forward(name, learner, case, x, y, mask)
        if not (isinstance(result, tuple) and len(result) == 2):
            fail(name, f"forward should return a tuple (output, weights), got {type(result).__name__}")
        out, weights = result
        _expect_weights_per_head_and_key(name, weights, expected_weights.shape)
        expect_tensor(name, "output", out, expected_out.shape, like=x)
        expect_tensor(name, "weights", weights, expected_weights.shape, like=x)
        if torch.isnan(out).any() or torch.isnan(weights).any():
            fail(name, "the result contains NaN", "look for a division by zero or a softmax of a row of -inf.")
        if not close(weights, expected_weights):
            name_the_mistake(name, "the weights", weights, expected_weights,
                             candidates(MHA_MISTAKES, reference, x64, y64, mask64, part=1))
        if not close(out, expected_out):
            name_the_mistake(name, "the output", out, expected_out,
                             candidates(MHA_MISTAKES, reference, x64, y64, mask64, part=0))
        if not close(out, torch_output):
            fail_difference(name, "the output", out, torch_output,
                            against="nn.MultiheadAttention with the same weights")

    def device_agnostic() -> None:
        masked = next(i for i, c in enumerate(cases) if c.mask is not None)
        learner = construct(name, MultiHeadAttention, cases[masked].d_model, cases[masked].n_heads).to("meta")
        expect_device_agnostic(name, learner, _mha_inputs(cases[masked], hidden, masked)[:3])

    with strict_numerics(), torch.no_grad():
        run_cases(name, cases, check_case, after=device_agnostic, prepare=lambda i, case: _modules(case, hidden, i))


def _expect_weights_per_head_and_key(name, weights, shape) -> None:
    """Name the two wrong shapes of the weights that have a known cause."""
    B, h, m, n = shape
    got = tuple(weights.shape) if isinstance(weights, torch.Tensor) else None
    if got == (B, m, n) and h > 1:
        fail(name, f"weights has shape {got}, expected {tuple(shape)}: the heads' weights were averaged",
             "return one attention map per head, (B, h, m, n) (nn.MultiheadAttention averages them by default).")
    if got == (B, h, m, m) and m != n:
        fail(name, f"weights has shape {got}, expected {tuple(shape)}: the keys came from x instead of y",
             "x goes into the Q port and y into the K and V ports: k = w_k(y), v = w_v(y) (y defaults to x).")
