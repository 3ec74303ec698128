"""Chapter 5's checks of ``EncoderLayer`` and ``DecoderLayer``: one case list, one comparison with the
reference (``_check_layer_class``, each check named after its layer) and each layer's mistakes, edits of
the reference layer's forward."""

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from ...reference import transformer as ref
from ..harness import (
    DROPOUT_IN_EVAL,
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
    name_the_mistake,
    one_thread,
    randomise,
    run_cases,
    seed_for,
    strict_numerics,
)
from ..how import expect_device_agnostic
from .cases import _padding_mask, _to


@dataclass(frozen=True)
class LayerCase:
    batch: int
    src_len: int  # the encoder's length, the decoder's memory length
    tgt_len: int  # the decoder's length
    d_model: int
    n_heads: int
    d_ff: int
    norm_first: bool
    padded: bool = True
    dropout: float = 0.0  # > 0 to check that eval mode switches it off


VISIBLE_LAYER = [
    LayerCase(2, 5, 4, 8, 2, 16, norm_first=False, padded=False),
    LayerCase(3, 6, 4, 8, 2, 16, norm_first=False, dropout=0.1),
    LayerCase(3, 4, 6, 12, 3, 20, norm_first=True),
]
HIDDEN_LAYER = [
    LayerCase(3, 7, 5, 12, 4, 24, norm_first=False, padded=False),
    LayerCase(4, 6, 8, 16, 4, 32, norm_first=False, dropout=0.2),
    LayerCase(2, 5, 3, 10, 2, 12, norm_first=True),
    LayerCase(3, 8, 6, 6, 1, 9, norm_first=True, padded=False),
    LayerCase(2, 3, 7, 8, 2, 8, norm_first=False),
]


def _layer_inputs(case: LayerCase, seed: int):
    """Float64 CPU target states x (B, T, d), memory (B, S, d) and the two padding masks (or None)."""
    rng = SeededRandom(seed)
    x = rng.randn(case.batch, case.tgt_len, case.d_model)
    memory = rng.randn(case.batch, case.src_len, case.d_model)
    if not case.padded:
        return x, memory, None, None
    return x, memory, _padding_mask(rng, case.batch, case.tgt_len), _padding_mask(rng, case.batch, case.src_len)


def _layer_case(Reference, case: LayerCase, hidden: bool, i: int):
    """The ``i``-th case's float64 reference layer (random weights) and its float64 CPU inputs (``_layer_inputs``),
    drawn by the one seed rule for the check named after the layer."""
    name = Reference.__name__
    layer = Reference(case.d_model, case.n_heads, case.d_ff, norm_first=case.norm_first).double()
    layer = randomise(layer, SeededRandom(seed_for(name, hidden, i, "weights"))).eval()
    return layer, _layer_inputs(case, seed_for(name, hidden, i))


# A mistake: the reference layer's forward with ``changes`` made to its source and ``names`` in place of the
# module's (``edited``), called as the comment says.
_encoder = partial(edited, ref.EncoderLayer.forward)  # (layer, x, padding_mask)
_decoder = partial(edited, ref.DecoderLayer.forward)  # (layer, x, memory, tgt_padding_mask, memory_padding_mask)


def _placements_swapped(sublayers: int) -> tuple[tuple[str, str], ...]:
    """Edits that run each of a layer's ``sublayers`` SublayerConnections with the other placement."""
    return tuple((f"self.sublayers[{i}](", f"swapped(self.sublayers[{i}], ") for i in range(sublayers))


# A SublayerConnection's forward with Pre-LN and Post-LN swapped, called (sublayer, x, f).
SWAPPED = edited(ref.SublayerConnection.forward, ("if self.norm_first:", "if not self.norm_first:"))
SWAPPED_LN = (
    "Pre-LN and Post-LN swapped: norm_first=False (the paper's Post-LN) must compute norm(x + sublayer(x)), "
    "norm_first=True (Pre-LN) x + sublayer(norm(x))",
    "pass norm_first on to every SublayerConnection(d_model, dropout, norm_first).",
)

KEY_MASK = "padding_mask[:, None, None, :]"
ENCODER_MISTAKES = [
    Mistake("the padding mask is ignored: padding tokens are attended to as if they were words",
            "turn padding_mask (B, S) into a key mask (B, 1, 1, S) and pass it to the self-attention.",
            _encoder(("self.self_attn(h, h, mask)", "self.self_attn(h, h, None)"))),
    Mistake("padding mask polarity inverted: the real tokens are hidden and the padding is attended to",
            "a padding mask is True for real tokens, and True means 'may attend': use it as it is.",
            _encoder((KEY_MASK, "~" + KEY_MASK))),
    Mistake("the padding mask is applied on the query axis instead of the key axis",
            "hide padded keys from every query: padding_mask[:, None, None, :], shape (B, 1, 1, S).",
            _encoder((KEY_MASK, "padding_mask[:, None, :, None]"))),
    Mistake(*SWAPPED_LN, _encoder(*_placements_swapped(2), swapped=SWAPPED)),
]

CAUSAL = "causal_mask(x.size(1), device=x.device)"
TGT_KEYS, MEMORY_KEYS = "& tgt_padding_mask[:, None, None, :]", "else memory_padding_mask[:, None, None, :]"
DECODER_MISTAKES = [
    Mistake("decoder self-attention without the causal mask: each target position sees the future tokens",
            "combine causal_mask(T, device=x.device) with the target padding mask for the self-attention.",
            _decoder((CAUSAL, "torch.ones(x.size(1), x.size(1), dtype=torch.bool, device=x.device)"))),
    Mistake("the causal mask is transposed: each position sees the future and not the past",
            "True on and below the diagonal: position t may attend to positions 0 .. t (causal_mask does this).",
            _decoder((CAUSAL, CAUSAL + ".T"))),
    Mistake("the causal mask excludes the diagonal: a position cannot see its own token",
            "keep the diagonal: torch.ones(T, T).tril() (or causal_mask(T)), not tril(-1).",
            _decoder((CAUSAL, CAUSAL + ".tril(-1)"))),
    Mistake("cross-attention attends to the decoder's own states instead of the encoder output (the memory)",
            "queries from the decoder, keys and values from the memory: self.cross_attn(h, memory, mask).",
            _decoder(("self.cross_attn(h, memory, cross_mask)", "self.cross_attn(h, h, cross_mask)"))),
    Mistake("the cross-attention ignores the memory padding mask: the decoder attends to the source's padding",
            "pass memory_padding_mask, as a (B, 1, 1, S) key mask, to the cross-attention.",
            _decoder((MEMORY_KEYS, "else None"))),
    Mistake("the self-attention ignores the target padding mask (only the causal mask is applied)",
            "combine the causal mask with tgt_padding_mask[:, None, None, :] (both must allow a key).",
            _decoder((" " + TGT_KEYS, ""))),
    Mistake("the two padding masks are swapped: the target's is used on the memory and the memory's on the target",
            "tgt_padding_mask goes with the self-attention, memory_padding_mask with the cross-attention.",
            # Never computed on the check's cases: S != T wherever there are masks, so the swapped ones cannot
            # broadcast (and the learner's layer raises instead).
            _decoder((TGT_KEYS, "& memory_padding_mask[:, None, None, :]"),
                     (MEMORY_KEYS, "else tgt_padding_mask[:, None, None, :]"))),
    Mistake(*SWAPPED_LN, _decoder(*_placements_swapped(3), swapped=SWAPPED)),
]

ENCODER_HINT = (
    "the notebook names the submodules self_attn = MultiHeadAttention(d_model, n_heads, bias=True), "
    "ffn = PositionwiseFeedForward(d_model, d_ff, dropout) and sublayers = nn.ModuleList of two "
    "SublayerConnection(d_model, dropout, norm_first)."
)
DECODER_HINT = (
    "the notebook names the submodules self_attn and cross_attn (each MultiHeadAttention(d_model, n_heads, "
    "bias=True)), ffn = PositionwiseFeedForward(d_model, d_ff, dropout) and sublayers = nn.ModuleList of three "
    "SublayerConnection(d_model, dropout, norm_first)."
)


def _expect_layer_parameters(name, learner: nn.Module, reference: nn.Module, hint: str) -> None:
    """Name the missing attention biases before the generic parameter message."""
    have, want = learner.state_dict().keys(), reference.state_dict().keys()
    missing = sorted(want - have)
    if missing and all("attn" in key and key.endswith(".bias") for key in missing):
        fail(name, f"its attention has no biases ({', '.join(missing[:2])}, ...)",
             "build the attention as MultiHeadAttention(d_model, n_heads, bias=True): torch's Transformer layers "
             "have biases in their attention, and MultiHeadAttention's default is bias=False.")
    copy_weights(name, learner, reference, hint)


def _strip(args: tuple) -> tuple:
    """Leave out trailing None arguments: the masks are optional."""
    while args and args[-1] is None:
        args = args[:-1]
    return args


def _encoder_arguments(inputs):
    _, memory, _, memory_mask = inputs  # the encoder reads the source side: x (B, S, d), mask (B, S)
    return memory, memory_mask


def check_encoder_layer(EncoderLayer, hidden: bool = False) -> None:
    """Check a learner's ``EncoderLayer(d_model, n_heads, d_ff, dropout=0.0, norm_first=False)``."""
    _check_layer_class(EncoderLayer, ref.EncoderLayer, hidden, ENCODER_HINT, _encoder_arguments, ENCODER_MISTAKES)


def check_decoder_layer(DecoderLayer, hidden: bool = False) -> None:
    """Check a learner's ``DecoderLayer(d_model, n_heads, d_ff, dropout=0.0, norm_first=False)``."""
    _check_layer_class(DecoderLayer, ref.DecoderLayer, hidden, DECODER_HINT, tuple, DECODER_MISTAKES)


def _check_layer_class(Layer, Reference, hidden, hint, arguments: Callable, mistakes) -> None:
    """Shared by the two layer checks (each named after its layer): every case, then the meta-device probe on a
    padded case. ``arguments(inputs)`` picks the layer's arguments from the case's inputs; the reference and
    every mistake are computed on the float64 CPU ones."""
    name, cases = Reference.__name__, HIDDEN_LAYER if hidden else VISIBLE_LAYER

    def check_case(i: int, case: LayerCase, device, dtype) -> None:
        reference, inputs64 = _layer_case(Reference, case, hidden, i)
        args64 = arguments(inputs64)
        with torch.no_grad():
            expected = reference(*args64)
        learner = construct(name, Layer, case.d_model, case.n_heads, case.d_ff, case.dropout, case.norm_first)
        _expect_layer_parameters(name, learner.to(device=device, dtype=dtype), reference, hint)
        args = _strip(_to(args64, device, dtype))
        with torch.no_grad():
            out = call(name, learner, *args)
            expect_tensor(name, "the output", out, expected.shape, like=args[0])
            if not close(call(name, learner, *args), out):
                fail(name, *DROPOUT_IN_EVAL)
        if not close(out, expected):
            placement = "Pre-LN" if case.norm_first else "Post-LN"
            mistaken = candidates(mistakes, reference, *args64)
            name_the_mistake(name, f"the {placement} output", out, expected, mistaken)

    def on_meta() -> None:
        i, case = next((i, c) for i, c in enumerate(cases) if c.padded)
        module = construct(name, Layer, case.d_model, case.n_heads, case.d_ff, 0.0, case.norm_first).double()
        _, inputs64 = _layer_case(Reference, case, hidden, i)
        expect_device_agnostic(name, copy.deepcopy(module).to("meta"), arguments(inputs64))

    with strict_numerics(), one_thread():
        run_cases(name, cases, check_case, after=on_meta)
