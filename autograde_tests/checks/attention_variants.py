"""Checks for chapter 03_attention_variants: the two masks, and self-, causal self- and cross-attention.

Besides comparing with the reference (whose weights are loaded into the learner's module), the module
checks test what each variant promises, on the learner's own outputs:

- causal self-attention: changing future tokens never changes earlier outputs;
- with a padding mask: changing padded tokens never changes the outputs at real positions;
- self-attention without positions is permutation-equivariant; cross-attention does not care about
  the order of the memory;
- a fully padded sequence gives zeros, not NaN; masks are made on the device of the inputs.
"""

from dataclasses import dataclass

import torch

from ..reference import attention_variants as ref
from ..reference.attention import scaled_dot_product_attention
from ..reference.multi_head_attention import MultiHeadAttention
from ..remote.proxy import is_module, type_name
from .harness import (
    ON_A_FIXED_DEVICE,
    UNIFORM_WHEN_ALL_MASKED,
    ChangedInput,
    Mistake,
    OnAFixedDevice,
    SeededRandom,
    call,
    candidates,
    close,
    construct,
    copy_weights,
    edited,
    expect_tensor,
    fail,
    name_the_mistake,
    randomise,
    run_cases,
    seed_for,
    strict_numerics,
)
from .how import expect_device_agnostic, kernel_reported

FIXED_DEVICE = "create it with device=... (the device argument, or the device of the inputs)."


def _expect_bool_mask(name: str, out, shape: tuple, device: torch.device) -> None:
    """A mask is a bool tensor of ``shape``, on a device of ``device``'s type."""
    if type(out) is not torch.Tensor:
        fail(name, f"should return a torch.Tensor, got {type_name(out)}")
    if out.dtype != torch.bool:
        dtype = str(out.dtype).removeprefix("torch.")
        fail(name, f"returns a {dtype} mask; the course's masks are bool, True = may attend",
             "an additive float mask (0 and -inf) is nn.Transformer's style; build the mask from comparisons "
             "or with dtype=torch.bool.")
    if tuple(out.shape) != tuple(shape):
        fail(name, f"returns a mask of shape {tuple(out.shape)}, expected {tuple(shape)}")
    if out.device.type != device.type:
        fail(name, f"{ON_A_FIXED_DEVICE}: the mask is on {out.device.type}, expected {device.type}", FIXED_DEVICE)


def _first_wrong_entry(name: str, what: str, out: torch.Tensor, expected: torch.Tensor) -> None:
    """A wrong mask that no mistake matches (masks match exactly: ``name_the_mistake(exact=True)``): its first
    wrong entry, since a mask has no largest error."""
    wrong = tuple((out != expected).nonzero()[0].tolist())
    fail(name, f"{what}: wrong at index {wrong}: got {bool(out[wrong])}, expected {not out[wrong]}")


# ----------------------------------------------------------------------------------------- causal_mask

VISIBLE_SIZES = [4, 1, 6]  # size 1 first would not tell two mistakes apart
HIDDEN_SIZES = [2, 3, 7, 10]

CAUSAL_MISTAKES = [
    Mistake("the causal mask excludes the diagonal: a token cannot see itself",
            "position i may attend to positions 0 .. i, itself included: torch.tril(..., diagonal=0).",
            edited(ref.causal_mask, (".tril()", ".tril(-1)"))),
    Mistake("the causal mask is transposed: True above the diagonal lets each token see the future, not the past",
            "row i (the query) may attend to columns 0 .. i (the keys): the lower triangle, torch.tril.",
            edited(ref.causal_mask, (".tril()", ".tril().T"))),
    Mistake("mask polarity inverted: your mask is True on the future positions to block, "
            "but in this course True = may attend",
            "nn.Transformer and nn.MultiheadAttention mark the blocked positions; this course and "
            "F.scaled_dot_product_attention mark the allowed ones: the lower triangle, diagonal included.",
            edited(ref.causal_mask, ("torch.ones(", "~torch.ones("))),
]


def check_causal_mask(causal_mask, hidden: bool = False) -> None:
    """Check a learner's ``causal_mask(size, device=None)``: (size, size) bool, True on and below the diagonal."""
    name = "causal_mask"
    sizes = HIDDEN_SIZES if hidden else VISIBLE_SIZES

    def check_case(i: int, size: int, device, dtype) -> None:
        out = call(name, causal_mask, size, device=device)
        _expect_bool_mask(name, out, (size, size), device)
        out, expected, what = out.cpu(), ref.causal_mask(size), f"causal_mask({size})"
        if not torch.equal(out, expected):
            name_the_mistake(name, what, out, expected, candidates(CAUSAL_MISTAKES, size), exact=True,
                             otherwise=lambda: _first_wrong_entry(name, what, out, expected))

    def default_and_meta_devices() -> None:
        _expect_bool_mask(name, call(name, causal_mask, sizes[-1]), (sizes[-1],) * 2, torch.device("cpu"))
        meta = call(name, causal_mask, 3, device=torch.device("meta"))
        ignores = f"ignores its device argument: it {ON_A_FIXED_DEVICE}", "pass device=device to the tensor you create."
        if not isinstance(meta, torch.Tensor):
            fail(name, *ignores)
        if meta.device.type != "meta":  # a shape-only answer needs no values to be right: the kernel's word
            kernel_reported(name, causal_mask, *ignores)

    run_cases(name, sizes, check_case, after=default_and_meta_devices, dtypes=(torch.bool,))


# ---------------------------------------------------------------------------------------- padding_mask

VISIBLE_LENGTHS = [((3, 1, 4), None), ((2, 5), 7), ((0, 2, 1), 3)]
HIDDEN_LENGTHS = [((5, 2, 7, 1), None), ((1,), 4), ((3, 3), 3), ((0, 6, 2), 8), ((4, 0, 1, 2, 3), 5)]

PADDING_MISTAKES = [
    Mistake("mask polarity inverted: your mask is True on the padding, but in this course True = a real token",
            "True means 'may attend', and only real tokens may be attended to: positions < length.",
            edited(ref.padding_mask, ("positions < lengths", "positions >= lengths"))),
    Mistake("off by one: your mask marks lengths[b] + 1 positions of sequence b as real",
            "positions are counted from 0, so position p is real when p < length (not <=).",
            edited(ref.padding_mask, ("positions < lengths", "positions <= lengths"))),
]


def check_padding_mask(padding_mask, hidden: bool = False) -> None:
    """Check a learner's ``padding_mask(lengths, max_len=None)``: (B, max_len) bool, True for real tokens."""
    name = "padding_mask"
    cases = HIDDEN_LENGTHS if hidden else VISIBLE_LENGTHS

    def check_case(i: int, case: tuple, device, dtype) -> None:
        values, max_len = case
        lengths = torch.tensor(values, device=device)
        out = call(name, padding_mask, lengths) if max_len is None else call(name, padding_mask, lengths, max_len)
        width = max(values) if max_len is None else max_len
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        expected_shape = (len(values), width)
        if shape == (len(values), max(values)) != expected_shape:
            fail(name, f"ignores max_len={max_len}: the mask is only as wide as the longest sequence")
        if shape == (width, len(values)) != expected_shape:
            fail(name, f"returns (max_len, B) = {shape}: the mask is transposed", "one row per sequence.")
        _expect_bool_mask(name, out, expected_shape, device)
        out, expected = out.cpu(), ref.padding_mask(torch.tensor(values), width)
        what = f"padding_mask({list(values)}, {max_len})"
        if not torch.equal(out, expected):
            name_the_mistake(name, what, out, expected, candidates(PADDING_MISTAKES, torch.tensor(values), width),
                             exact=True, otherwise=lambda: _first_wrong_entry(name, what, out, expected))

    values, max_len = next((v, w) for v, w in cases if w is not None)
    run_cases(name, cases, check_case, dtypes=(torch.bool,),
              after=lambda: expect_device_agnostic(name, padding_mask, (torch.tensor(values), max_len)))


# ----------------------------------------------------------------------------------------- the modules


@dataclass(frozen=True)
class VariantCase:
    batch: int
    m: int  # query positions (x)
    n: int  # key positions: x's own for self-attention (n == m), the memory's for cross-attention
    d_model: int
    n_heads: int
    lengths: tuple[int, ...] | None = None  # real lengths of the key side; None: no padding mask


VISIBLE_SELF = [
    VariantCase(2, 5, 5, 8, 2),
    VariantCase(3, 4, 4, 12, 4, (4, 2, 3)),
    VariantCase(2, 6, 6, 6, 1, (6, 0)),
]
HIDDEN_SELF = [
    VariantCase(3, 7, 7, 16, 4),
    VariantCase(4, 6, 6, 12, 2, (6, 3, 1, 5)),
    VariantCase(3, 3, 3, 8, 2, (3, 1, 2)),
    VariantCase(2, 5, 5, 9, 3, (0, 4)),
    VariantCase(1, 8, 8, 16, 8, (5,)),
]
VISIBLE_CROSS = [
    VariantCase(2, 3, 5, 8, 2),
    VariantCase(3, 3, 6, 12, 4, (6, 2, 4)),
    VariantCase(2, 5, 4, 6, 1, (4, 0)),
]
HIDDEN_CROSS = [
    VariantCase(3, 6, 4, 16, 4),
    VariantCase(4, 2, 7, 12, 2, (7, 3, 1, 5)),
    VariantCase(2, 7, 3, 8, 2, (0, 3)),
    VariantCase(3, 3, 9, 9, 3, (9, 8, 2)),
    VariantCase(1, 4, 6, 16, 8, (4,)),
]


QUERY_AXIS = (
    "padding mask applied on the query axis instead of the key axis: padded tokens are still attended to",
    "a padding mask hides keys: reshape the (B, n) mask to (B, 1, 1, n), not (B, 1, n, 1).",
)
NOT_BROADCAST = (
    "padding mask not broadcast over heads and query positions: the (B, n) mask was used as it is",
    "the weights are (B, h, m, n): reshape the mask to (B, 1, 1, n), e.g. padding_mask[:, None, None, :].",
)
IGNORED = (
    "the padding mask is ignored: padded tokens get weight",
    "pass the padding mask, as (B, 1, 1, n), to self.attn.",
)
INVERTED = (
    "mask polarity inverted: your code treats True in the padding mask as padding",
    "True marks real tokens, which may be attended to; nn.MultiheadAttention's key_padding_mask is the opposite.",
)

# Each mistake is the reference variant's forward with its source edited (``edited``), or another variant's
# forward, called as the check calls the module, (module, x, padding_mask) or (module, x, memory,
# memory_padding_mask), with the reference module whose weights the learner's module was given.
KEYS = "padding_mask[:, None, None, :]"  # how every variant's forward makes the (B, n) mask (B, 1, 1, n)

# MultiHeadAttention's forward with the masked scores filled with -1e9 and the weights never zeroed afterwards
# (the Annotated Transformer's choice): a query with no real key averages all the values.
ATTENDING_WITH_MINUS_1E9 = edited(
    MultiHeadAttention.forward,
    scaled_dot_product_attention=edited(
        scaled_dot_product_attention,
        ('torch.where(mask, scores, float("-inf"))', "scores.masked_fill(~mask, -1e9)"),
        ("weights = torch.where(mask, weights, 0.0)", "pass"),
    ),
)


def _filling_minus_1e9(forward):
    """``forward`` with its ``self.attn`` attending as ATTENDING_WITH_MINUS_1E9 does."""
    return edited(forward, ("self.attn(", "attend(self.attn, "), attend=ATTENDING_WITH_MINUS_1E9)


SELF_MISTAKES = [
    Mistake(*UNIFORM_WHEN_ALL_MASKED, _filling_minus_1e9(ref.SelfAttention.forward)),
    Mistake(*QUERY_AXIS, edited(ref.SelfAttention.forward, (KEYS, "padding_mask[:, None, :, None]"))),
    Mistake(*NOT_BROADCAST, edited(ref.SelfAttention.forward, (KEYS, "padding_mask"))),
    Mistake(*IGNORED, edited(ref.SelfAttention.forward, ("self.attn(x, x, mask)", "self.attn(x, x)"))),
    Mistake(*INVERTED, edited(ref.SelfAttention.forward, (KEYS, "~" + KEYS))),
    Mistake("SelfAttention hides the future: the causal mask belongs to CausalSelfAttention only",
            "in (encoder) self-attention every position may attend to every real position.",
            ref.CausalSelfAttention.forward),  # the other variant's answer is this one's mistake
]

CAUSAL_MODULE_MISTAKES = [
    Mistake(*UNIFORM_WHEN_ALL_MASKED, _filling_minus_1e9(ref.CausalSelfAttention.forward)),
    # The causal mask's own mistakes, made by the causal_mask the forward calls.
    *(Mistake(m.problem, m.hint, edited(ref.CausalSelfAttention.forward, causal_mask=m.compute))
      for m in CAUSAL_MISTAKES),
    Mistake("the future is visible: no causal mask was applied",
            "combine causal_mask(T, device=x.device) with the padding mask (both must allow a key: &).",
            ref.SelfAttention.forward),  # the other variant's answer is this one's mistake
    Mistake(*IGNORED, edited(ref.CausalSelfAttention.forward, ("mask & " + KEYS, "mask"))),
    Mistake("the masks were combined with | (or) instead of & (and): a key hidden by either mask must stay hidden",
            "a key may be attended to only if it is in the past AND a real token: causal & padding.",
            edited(ref.CausalSelfAttention.forward, ("mask & ", "mask | "))),
    Mistake(*QUERY_AXIS, edited(ref.CausalSelfAttention.forward, (KEYS, "padding_mask[:, None, :, None]"))),
    Mistake(*NOT_BROADCAST, edited(ref.CausalSelfAttention.forward, (KEYS, "padding_mask"))),
    Mistake(*INVERTED, edited(ref.CausalSelfAttention.forward, (KEYS, "~" + KEYS))),
]

CROSS_MISTAKES = [
    Mistake(*UNIFORM_WHEN_ALL_MASKED, _filling_minus_1e9(ref.CrossAttention.forward)),
    Mistake("cross-attention without the source padding mask: padded memory tokens get weight",
            "pass memory_padding_mask, as (B, 1, 1, n), to self.attn.",
            edited(ref.CrossAttention.forward, ("self.attn(x, memory, mask)", "self.attn(x, memory)"))),
    Mistake(*NOT_BROADCAST, edited(ref.CrossAttention.forward, (KEYS, "padding_mask"))),
    Mistake(*INVERTED, edited(ref.CrossAttention.forward, ("memory_" + KEYS, "~memory_" + KEYS))),
    Mistake("the memory is ignored: keys and values came from x, which makes it self-attention",
            "x goes into the Q port and the memory into the K and V ports: self.attn(x, memory, mask).",
            edited(ref.CrossAttention.forward, ("self.attn(x, memory, mask)", "self.attn(x)"))),
]


@dataclass(frozen=True)
class Variant:
    name: str
    reference: type
    cross: bool
    mistakes: list
    visible: list
    hidden: list


SELF = Variant("SelfAttention", ref.SelfAttention, False, SELF_MISTAKES, VISIBLE_SELF, HIDDEN_SELF)
CAUSAL = Variant("CausalSelfAttention", ref.CausalSelfAttention, False, CAUSAL_MODULE_MISTAKES,
                 VISIBLE_SELF, HIDDEN_SELF)
CROSS = Variant("CrossAttention", ref.CrossAttention, True, CROSS_MISTAKES, VISIBLE_CROSS, HIDDEN_CROSS)

HOLD_ATTN = "hold one MultiHeadAttention(d_model, n_heads) as self.attn, and no other parameters."
SWAPPED_ROLES = "x asks and the memory answers: self.attn(x, memory, mask), x in the Q port."


def check_self_attention(SelfAttention, hidden: bool = False) -> None:
    """Check a learner's ``SelfAttention(d_model, n_heads)``: forward(x, padding_mask=None) -> output."""
    _check_variant(SELF, SelfAttention, hidden)


def check_causal_self_attention(CausalSelfAttention, hidden: bool = False) -> None:
    """Check a learner's ``CausalSelfAttention(d_model, n_heads)``: forward(x, padding_mask=None) -> output."""
    _check_variant(CAUSAL, CausalSelfAttention, hidden)


def check_cross_attention(CrossAttention, hidden: bool = False) -> None:
    """Check a learner's ``CrossAttention(d_model, n_heads)``: forward(x, memory, memory_padding_mask=None)."""
    _check_variant(CROSS, CrossAttention, hidden)


def _drawn(variant: Variant, hidden: bool, i: int, case: VariantCase):
    """What case ``i`` draws (``seed_for``): the float64 reference module, with its weights, and the float64 CPU
    inputs, x (B, m, d_model), memory (B, n, d_model) or None, padding mask (B, n) or None."""
    weights = SeededRandom(seed_for(variant.name, hidden, i, "weights"))
    reference = randomise(variant.reference(case.d_model, case.n_heads), weights).double().eval()
    rng = SeededRandom(seed_for(variant.name, hidden, i))
    x = rng.randn(case.batch, case.m, case.d_model)
    memory = rng.randn(case.batch, case.n, case.d_model) if variant.cross else None
    pm = None if case.lengths is None else ref.padding_mask(torch.tensor(case.lengths), case.n)
    return reference, (x, memory, pm)


def _arguments(variant: Variant, x, memory, pm) -> tuple:
    """The forward's arguments in the contract's order: (x, padding_mask) or (x, memory, memory_padding_mask)."""
    return (x, memory, pm) if variant.cross else (x, pm)


def _forward(variant: Variant, module, x, memory, pm):
    """Call the module as the contract says: (x, padding_mask=...) or (x, memory, memory_padding_mask=...)."""
    args = (x, memory) if variant.cross else (x,)
    kwargs = {} if pm is None else {("memory_padding_mask" if variant.cross else "padding_mask"): pm}
    return call(variant.name, module, *args, **kwargs)


def _check_variant(variant: Variant, cls, hidden: bool) -> None:
    name = variant.name
    cases = variant.hidden if hidden else variant.visible

    def check_case(i: int, case: VariantCase, device, dtype, drawn) -> None:
        reference, inputs64 = drawn
        learner = construct(name, cls, case.d_model, case.n_heads)
        if not is_module(getattr(learner, "attn", None)):
            fail(name, "has no attribute `attn`", HOLD_ATTN)
        learner.to(dtype=dtype, device=device)
        copy_weights(name, learner, reference, HOLD_ATTN)
        expected = _forward(variant, reference, *inputs64)
        x, memory = (None if t is None else t.to(dtype=dtype, device=device) for t in inputs64[:2])
        pm = None if inputs64[2] is None else inputs64[2].to(device)
        out = _call_diagnosing_masks(variant, learner, case, x, memory, pm)
        if variant.cross and isinstance(out, torch.Tensor) and tuple(out.shape) == (case.batch, case.n, case.d_model):
            fail(name, f"the output has shape {tuple(out.shape)}, one row per memory position: cross-attention with "
                 "the roles swapped (queries from the memory)", SWAPPED_ROLES)
        expect_tensor(name, "the output", out, expected.shape, like=x)
        if torch.isnan(out).any():
            empty = pm is not None and not pm.any(dim=-1).all()
            fail(name, "NaN for a fully padded sequence" if empty else "the output contains NaN",
                 "a query whose keys are all padding must get a zero output: use the bool mask with "
                 "MultiHeadAttention, not an additive -inf mask.")
        # What each variant promises is tested on every output, a right one too; on a wrong one, after a known
        # mistake is looked for and before the difference is reported.
        seed = seed_for(name, hidden, i, "properties")
        properties = lambda: _expect_properties(variant, learner, case, out, x, memory, pm, seed)
        if close(out, expected):
            properties()
        else:
            mistaken = candidates(variant.mistakes, reference, *_arguments(variant, *inputs64))
            name_the_mistake(name, "the output", out, expected, mistaken, otherwise=properties)

    def on_meta() -> None:
        i, case = next((i, c) for i, c in enumerate(cases) if c.lengths is not None)
        meta_module = construct(name, cls, case.d_model, case.n_heads).to("meta")
        expect_device_agnostic(name, meta_module, _arguments(variant, *_drawn(variant, hidden, i, case)[1]))

    with strict_numerics(), torch.no_grad():
        run_cases(name, cases, check_case, after=on_meta, prepare=lambda i, case: _drawn(variant, hidden, i, case))


def _call_diagnosing_masks(variant, learner, case, x, memory, pm):
    """Call the module; if it fails only when given a padding mask, say how the mask must be shaped."""
    try:
        return _forward(variant, learner, x, memory, pm)
    except (ChangedInput, OnAFixedDevice):
        raise
    except AssertionError:
        if pm is None:
            raise
        try:
            unmasked = _forward(variant, learner, x, memory, None)
        except AssertionError:  # it fails even without the mask: report the original error
            unmasked = None
        if variant.cross and isinstance(unmasked, torch.Tensor) and unmasked.size(1) == case.n != case.m:
            fail(variant.name, "cross-attention with the roles swapped (queries from the memory): it fails with a "
                 "memory padding mask and, without one, returns one row per memory position", SWAPPED_ROLES)
        if unmasked is not None:
            fail(variant.name, "works without a padding mask but fails with one: the padding mask is not broadcast "
                 "over heads and query positions (or it is applied on the query axis)", NOT_BROADCAST[1])
        raise


def _expect_properties(variant, learner, case, out, x, memory, pm, seed) -> None:
    """What each variant promises, tested on the learner's own outputs."""
    name = variant.name
    rng = SeededRandom(seed)
    noise = rng.randn(*x.shape).to(dtype=x.dtype, device=x.device)
    if variant is CAUSAL:
        cut = case.m // 2
        changed = torch.cat([x[:, : cut + 1], noise[:, cut + 1 :]], dim=1)
        if not close(_forward(variant, learner, changed, memory, pm)[:, : cut + 1], out[:, : cut + 1]):
            fail(name, f"changing the tokens after position {cut} changed the outputs at positions 0 .. {cut}: "
                 "the future is visible",
                 "mask the scores with causal_mask(T, device=x.device): True on and below the diagonal.")
    if pm is not None:
        if variant.cross:
            padded = torch.where(pm[..., None], memory, rng.randn(*memory.shape).to(memory))
            changed_out, keep = _forward(variant, learner, x, padded, pm), torch.ones_like(pm[:, :1])
        else:
            padded = torch.where(pm[..., None], x, noise)
            changed_out, keep = _forward(variant, learner, padded, memory, pm), pm
        if not close(changed_out * keep[..., None], out * keep[..., None]):
            fail(name, "changing padded tokens changed the outputs at real positions: padded keys still get weight",
                 "the padding mask must hide keys: pass it to self.attn as (B, 1, 1, n).")
    # One cycle through all the positions: none stays in place, where a dependence on it would not show.
    shuffled = torch.randperm(case.n, generator=rng.generator)
    order = torch.empty_like(shuffled).index_put_((shuffled,), shuffled.roll(-1)).to(x.device)
    permuted_pm = None if pm is None else pm[:, order]
    if variant is SELF:
        permuted = _forward(variant, learner, x[:, order], memory, permuted_pm)
        if not close(permuted, out[:, order]):
            fail(name, "permuting the input positions did not permute the outputs the same way: without positional "
                 "information, self-attention must be permutation-equivariant",
                 "every position attends to every real position with the same weights whatever the order; "
                 "do not use a causal mask or positions here.")
    if variant.cross and not close(_forward(variant, learner, x, memory[:, order], permuted_pm), out):
        fail(name, "reordering the memory (with its padding mask) changed the output: cross-attention must not "
             "depend on the order of the memory",
             "the memory goes into the K and V ports only: self.attn(x, memory, mask).")
