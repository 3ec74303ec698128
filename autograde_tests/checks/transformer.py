"""Checks for chapter 05_transformer: the positional encoding, the two layers, the whole model, the
teacher-forcing loss and greedy decoding.

Every module check loads the reference's (random) weights into the learner's module by name, so no answer
depends on initialisation order. Each exercise is graded on its own where it can be: the Transformer check
compares the numbers with stand-in layers (``stand_in_models``) in place of the learner's EncoderLayer and
DecoderLayer, and the loss and decoding checks drive a stand-in model. Properties (causality, padding,
batch order) and the "can it learn" check run the learner's whole model. Visible checks use one set of shapes and seeds;
the hidden ones nbgrader runs use others.
"""

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from ..reference import transformer as ref
from ..reference.attention_variants import padding_mask
from ..toy_task import BOS, PAD, VOCAB, random_digits, reversal_batch, to_batch
from ..remote.proxy import lend, make_in_kernel, type_name
from . import stand_in_models
from .harness import (
    call,
    candidates,
    ChangedInput,
    CheckFailed,
    close,
    construct,
    copy_weights,
    default_dtype,
    DROPOUT_IN_EVAL,
    edited,
    expect_loss,
    expect_tensor,
    fail,
    learner_step,
    matching_mistake,
    Mistake,
    name_the_mistake,
    OnAFixedDevice,
    one_thread,
    randomise,
    restate,
    run_cases,
    seed_for,
    SeededRandom,
    strict_numerics,
)
from .how import expect_device_agnostic, kernel_reported


def _padding_mask(rng: SeededRandom, batch: int, length: int) -> torch.Tensor:
    """A (batch, length) padding mask of lengths in 1 .. length, the first one full: padding happens and no
    sequence is empty."""
    lengths = torch.randint(1, length + 1, (batch,), generator=rng.generator)
    lengths[0] = length
    return padding_mask(lengths, length)


def _to(tensors, device, dtype=None):
    """Move a tuple of tensors (or None) to ``device``; floating ones also to ``dtype``."""
    return tuple(
        None if t is None else t.to(device, dtype if dtype is not None and t.is_floating_point() else t.dtype)
        for t in tensors
    )


# ------------------------------------------------------------------------------- positional_encoding


PE_VISIBLE = [(10, 8), (6, 4), (50, 16)]
PE_HIDDEN = [(20, 12), (3, 2), (64, 32), (1, 6), (33, 10)]
PE_HINT = "PE[pos, 2i] = sin(pos / 10000^(2i / d_model)) and PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))."


def _encoding(*changes: tuple[str, str]):
    """The reference's positional_encoding with ``changes`` made to its source (``edited``), in float64: a
    mistake."""
    encoding = edited(ref.positional_encoding, *changes)

    def compute(max_len: int, d_model: int) -> torch.Tensor:
        with default_dtype(torch.float64):
            return encoding(max_len, d_model)

    return compute


SINES, COSINES = "pe[:, 0::2] = torch.sin(angle)", "pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])"
PE_MISTAKES = [
    Mistake("sin and cos are swapped: the even features should be sines and the odd ones cosines",
            PE_HINT,
            _encoding((SINES, "pe[:, 0::2] = torch.cos(angle)"),
                      (COSINES, "pe[:, 1::2] = torch.sin(angle[:, : d_model // 2])"))),
    Mistake("the exponent uses the feature index k instead of the pair index 2i = k - k % 2: the sine and the "
            "cosine of a pair should share one frequency",
            "compute one frequency per pair, from torch.arange(0, d_model, 2), and use it for both features.",
            _encoding(("torch.arange(0, d_model, 2, dtype=torch.float64)",
                       "torch.arange(d_model, dtype=torch.float64)"),
                      (SINES, "pe[:, 0::2] = torch.sin(angle[:, 0::2])"),
                      (COSINES, "pe[:, 1::2] = torch.cos(angle[:, 1::2])"))),
    Mistake("the sines fill the first half of the features and the cosines the second half; they should alternate",
            "assign pe[:, 0::2] = sin(...) and pe[:, 1::2] = cos(...).",
            _encoding((SINES, "pe[:, : angle.size(1)] = torch.sin(angle)"),
                      (COSINES, "pe[:, angle.size(1) :] = torch.cos(angle[:, : d_model // 2])"))),
]


def check_positional_encoding(positional_encoding, hidden: bool = False) -> None:
    """Check a learner's ``positional_encoding(max_len, d_model) -> (max_len, d_model)``."""
    name = "positional_encoding"

    def check_case(_: int, case: tuple[int, int], device, dtype) -> None:
        max_len, d_model = case
        with default_dtype(torch.float64):
            expected = ref.positional_encoding(max_len, d_model)
        with default_dtype(dtype):
            out = call(name, positional_encoding, max_len, d_model)
        if isinstance(out, torch.Tensor) and tuple(out.shape) == (d_model, max_len) and d_model != max_len:
            fail(name, f"the output has shape {tuple(out.shape)}: (d_model, max_len) instead of (max_len, d_model)")
        if isinstance(out, torch.Tensor) and out.dtype != dtype and out.is_floating_point():
            fail(name, f"returns {out.dtype} when the default dtype is {dtype}",
                 "make the tensors without a fixed dtype (torch.zeros(max_len, d_model), torch.arange(max_len) "
                 "turned float by arithmetic) so that the result follows torch.get_default_dtype(): the model "
                 "check runs in float64 too.")
        expect_tensor(name, "the output", out, expected.shape, like=torch.empty(0, dtype=dtype, device=device))
        if not close(out, expected):
            name_the_mistake(name, "the encoding", out, expected, candidates(PE_MISTAKES, max_len, d_model))

    with strict_numerics(), one_thread():  # the encoding takes no device: it is made on the CPU alone
        run_cases(name, PE_HIDDEN if hidden else PE_VISIBLE, check_case, cpu_only=True)


# ------------------------------------------------------------------------------- the layers


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


# ------------------------------------------------------------------------------- Transformer


@dataclass(frozen=True)
class ModelCase:
    batch: int  # != src_len, tgt_len: a positional encoding indexed by batch shows
    src_len: int
    tgt_len: int  # != src_len: a decoder fed the source shows
    src_vocab: int
    tgt_vocab: int  # < src_vocab, so that the source embedding can (wrongly) look up target tokens
    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    norm_first: bool


VISIBLE_MODEL = [ModelCase(3, 6, 5, 11, 9, 8, 2, 2, 16, False), ModelCase(2, 4, 7, 10, 7, 12, 3, 1, 20, True)]
HIDDEN_MODEL = [
    ModelCase(4, 7, 5, 13, 11, 16, 4, 2, 24, True),
    ModelCase(2, 5, 8, 9, 8, 12, 2, 3, 16, False),
    ModelCase(5, 3, 6, 12, 6, 8, 1, 1, 12, False),
]
MODEL_HINT = (
    "the notebook names the submodules src_embed, tgt_embed (nn.Embedding), encoder_layers, decoder_layers "
    "(nn.ModuleList), encoder_norm, decoder_norm (LayerNorm(d_model) for Pre-LN, None for Post-LN) and head "
    "(nn.Linear(d_model, tgt_vocab))."
)
SWAPPED_LAYERS = (
    " (this comparison runs your Transformer with simple stand-in layers in place of your EncoderLayer and "
    "DecoderLayer, so the difference comes from Transformer itself)"
)


def _model_inputs(case: ModelCase, seed: int):
    """src (B, S) and tgt (B, T) token ids with their padding masks (B, S), (B, T)."""
    rng = SeededRandom(seed)
    # Source ids valid in both vocabularies, so that a decoder fed the source runs (and is caught) too.
    src = torch.randint(case.tgt_vocab, (case.batch, case.src_len), generator=rng.generator)
    tgt = torch.randint(case.tgt_vocab, (case.batch, case.tgt_len), generator=rng.generator)
    return src, tgt, _padding_mask(rng, case.batch, case.src_len), _padding_mask(rng, case.batch, case.tgt_len)


def _model_args(case: ModelCase) -> tuple:
    return case.src_vocab, case.tgt_vocab, case.d_model, case.n_heads, case.n_layers, case.d_ff


def _model_case(case: ModelCase, hidden: bool, i: int) -> tuple[ref.Transformer, dict, tuple]:
    """The ``i``-th case's float64 reference model (random weights), the weights of its stand-in layers
    (``_stand_in_states``) and its inputs (``_model_inputs``), drawn by the one seed rule."""
    with default_dtype(torch.float64):
        model = ref.Transformer(*_model_args(case), norm_first=case.norm_first)
    reference = randomise(model, SeededRandom(seed_for("Transformer", hidden, i, "weights"))).eval()
    return reference, _stand_in_states(case, hidden, i), _model_inputs(case, seed_for("Transformer", hidden, i))


# The reference Transformer's methods with ``changes`` made to their source and ``names`` in place of the
# module's (``edited``), called as the comments say: the mistakes of encode, decode and forward, and the
# embedding mistakes that encode and decode make through ``embed``.
_embedding = partial(edited, ref.Transformer.embed)  # (model, tokens, embedding)
_encode = partial(edited, ref.Transformer.encode)  # (model, src, src_padding_mask)
_decode = partial(edited, ref.Transformer.decode)  # (model, tgt, memory, tgt_padding_mask, src_padding_mask)
_forward = partial(edited, ref.Transformer.forward)  # (model, src, tgt, src_padding_mask, tgt_padding_mask)


EMBEDDED = ("self.embed(", "embed(self, ")  # encode or decode with an ``_embedding`` mistake as ``embed``
SCALED, PE = "embedding(tokens) * math.sqrt(self.d_model)", "x + self.pe[: tokens.size(1)]"
EMBEDDING_MISTAKES = [
    ("token embeddings not scaled by sqrt(d_model) before the positional encoding is added",
     "multiply embedding(tokens) by math.sqrt(d_model), then add the positional encoding.",
     _embedding((SCALED, "embedding(tokens)"))),
    ("positional encoding indexed by batch instead of position: sequence b got PE[b] at every "
     "position (pe[:x.size(0)] on a batch-first tensor)",
     "the positions are axis 1 of (B, T, d_model): add pe[:T], which broadcasts over the batch.",
     _embedding((PE, "x + self.pe[: tokens.size(0), None, :]"))),
    ("the positional encoding is not added: without it attention cannot tell the positions apart",
     "add pe[:T] (T = tokens.size(1)) to the scaled embeddings.",
     _embedding((PE, "x"))),
    ("the positional encoding is added twice",
     "add it once, in one place (for example a helper that both encode and decode call).",
     _embedding((PE, "x + 2 * self.pe[: tokens.size(1)]"))),
    ("the positional encoding is added before the sqrt(d_model) scale, so it was scaled too",
     "scale the embeddings first, then add the positional encoding: embedding(tokens) * sqrt(d_model) + pe[:T].",
     _embedding((SCALED, "embedding(tokens)"), (PE, f"({PE}) * math.sqrt(self.d_model)"))),
]
DUPLICATE_NORM = (
    "a duplicate final LayerNorm on a Post-LN stack: each Post-LN layer already ends with a LayerNorm",
    "only Pre-LN stacks end with a final LayerNorm (their last residual sum was never normalised); "
    "for norm_first=False set encoder_norm = decoder_norm = None and skip them.",
)
LAYER_NORM = "nn.functional.layer_norm(x, x.shape[-1:])"  # a duplicate norm has no weights of its own

ENCODE_MISTAKES = [
    Mistake(problem, hint, _encode(EMBEDDED, embed=embedding)) for problem, hint, embedding in EMBEDDING_MISTAKES
] + [
    Mistake("the encoder layers do not get src_padding_mask: the source's padding is attended to",
            "call every encoder layer as layer(x, src_padding_mask).",
            _encode(("layer(x, src_padding_mask)", "layer(x)"))),
    Mistake(*DUPLICATE_NORM, _encode(("return x if", f"return {LAYER_NORM} if"))),
]
DECODER_LAYERS = "layer(x, memory, tgt_padding_mask, src_padding_mask)"
DECODE_MISTAKES = [
    Mistake(problem, hint, _decode(EMBEDDED, embed=embedding)) for problem, hint, embedding in EMBEDDING_MISTAKES
] + [
    Mistake("decoder fed the source embeddings: the target tokens were looked up in src_embed",
            "decode embeds the target tokens with tgt_embed; src_embed belongs to encode.",
            _decode(("self.embed(tgt, self.tgt_embed)", "self.embed(tgt, self.src_embed)"))),
] + [
    Mistake("cross-attention attending to the decoder's own states instead of the encoder output: each decoder "
            "layer was given x as its memory",
            "call every decoder layer as layer(x, memory, tgt_padding_mask, src_padding_mask).",
            _decode((DECODER_LAYERS, f"layer(x, x, tgt_padding_mask, {memory_mask})")))
    for memory_mask in ("None", "tgt_padding_mask")  # the mask that fits the states given, or none
] + [
    Mistake("the decoder layers do not get src_padding_mask: the cross-attention attends to the source's padding",
            "pass src_padding_mask to every decoder layer, as its memory_padding_mask.",
            _decode((DECODER_LAYERS, "layer(x, memory, tgt_padding_mask, None)"))),
    Mistake("the decoder layers do not get tgt_padding_mask",
            "pass tgt_padding_mask to every decoder layer.",
            _decode((DECODER_LAYERS, "layer(x, memory, None, src_padding_mask)"))),
    Mistake(*DUPLICATE_NORM,
            _decode(("self.head(x)", f"self.head(x if self.decoder_norm is not None else {LAYER_NORM})"))),
]
DECODE_CALL = "self.decode(tgt, memory, tgt_padding_mask, src_padding_mask)"
FORWARD_MISTAKES = [
    Mistake("forward passes the padding masks the wrong way round",
            "the contract's order is forward(src, tgt, src_padding_mask, tgt_padding_mask); encode takes "
            "src_padding_mask, decode takes (tgt, memory, tgt_padding_mask, src_padding_mask).",
            # Never computed on the check's cases (S != T: the swapped masks cannot broadcast); the learner's forward
            # raises instead, and the check's message then asks whether the masks are the wrong way round.
            _forward((DECODE_CALL, "self.decode(tgt, memory, src_padding_mask, tgt_padding_mask)"))),
    Mistake("forward does not pass src_padding_mask on to decode, so the cross-attention sees the source's padding",
            "memory = self.encode(src, src_padding_mask); return self.decode(tgt, memory, tgt_padding_mask, "
            "src_padding_mask).",
            _forward((DECODE_CALL, "self.decode(tgt, memory, tgt_padding_mask, None)"))),
    Mistake("forward does not pass src_padding_mask on to encode",
            "memory = self.encode(src, src_padding_mask).",
            _forward(("self.encode(src, src_padding_mask)", "self.encode(src)"))),
]


def _expect_model_parameters(name, learner: nn.Module, reference: ref.Transformer, case: ModelCase) -> None:
    """Name the final-norm mistakes, which show in the parameter names, then load the reference's weights."""
    have = {key for key, _ in learner.named_parameters()}
    want = set(reference.state_dict())
    if not case.norm_first:
        layers = ("encoder_layers", "decoder_layers")
        extra_norms = sorted(k for k in have - want if "norm" in k and not k.startswith(layers))
        if extra_norms:
            fail(name, f"{DUPLICATE_NORM[0]} (your model has {', '.join(extra_norms)})", DUPLICATE_NORM[1])
    elif not any(k.startswith("encoder_norm") for k in have) or not any(k.startswith("decoder_norm") for k in have):
        fail(name, "a Pre-LN stack (norm_first=True) must end with a final LayerNorm: "
             "encoder_norm and decoder_norm are missing",
             "in a Pre-LN layer the last residual sum is never normalised; create encoder_norm = LayerNorm(d_model) "
             "and decoder_norm = LayerNorm(d_model) when norm_first is True and apply them after the last layer.")
    copy_weights(name, learner, reference, MODEL_HINT)


def _stand_in_states(case: ModelCase, hidden: bool, i: int) -> dict:
    """Random weights for the stand-in encoder and decoder layers of the ``i``-th case's model."""
    states = {}
    for kind, layer in (("encoder", stand_in_models.StandInEncoderLayer),
                        ("decoder", stand_in_models.StandInDecoderLayer)):
        layers = nn.ModuleList(layer(case.d_model) for _ in range(case.n_layers)).double()
        rng = SeededRandom(seed_for("Transformer", hidden, i, f"{kind} layers"))
        states[kind] = randomise(layers, rng).state_dict()
    return states


def _with_stand_in_layers(model: nn.Module, states: dict) -> nn.Module:
    """``model`` with stand-in layers as its encoder and decoder layers, lent to it (``lend``)."""
    for kind in ("encoder", "decoder"):
        layers = [lend(model, layer) for layer in stand_in_models.stand_in_layers(kind, states[kind])]
        setattr(model, f"{kind}_layers", make_in_kernel(model, nn.ModuleList, layers))
    return model


def _learner_copy(name, learner64: nn.Module, reference: ref.Transformer, device, dtype) -> nn.Module:
    model = copy.deepcopy(learner64).to(device=device, dtype=dtype)
    copy_weights(name, model, reference, MODEL_HINT)
    return model.eval()


def check_transformer(Transformer, hidden: bool = False) -> None:
    """Check a learner's ``Transformer(src_vocab, tgt_vocab, d_model, n_heads, n_layers, d_ff, dropout=0.0,
    norm_first=False, max_len=512)``: encode, decode, forward, its properties, and that it can learn."""
    name = "Transformer"
    cases = HIDDEN_MODEL if hidden else VISIBLE_MODEL

    def prepare(i: int, case: ModelCase) -> tuple:
        """The case's reference, stand-in weights and inputs, and the learner's model built in float64, its
        parameters judged (the final norms by name)."""
        reference, states, inputs64 = _model_case(case, hidden, i)
        with default_dtype(torch.float64):
            learner64 = construct(name, Transformer, *_model_args(case), norm_first=case.norm_first)
        _expect_model_parameters(name, learner64, reference, case)
        return reference, states, inputs64, learner64

    def check_case(i: int, case: ModelCase, device, dtype, prepared: tuple) -> None:
        reference, states, inputs64, learner64 = prepared
        swapped = _with_stand_in_layers(copy.deepcopy(reference), states)
        model = _with_stand_in_layers(_learner_copy(name, learner64, reference, device, dtype), states)
        with default_dtype(dtype):
            _check_model_case(name, model.to(device=device, dtype=dtype), swapped, inputs64, device, dtype)
        if device.type == "cpu" and dtype == torch.float64:  # the properties, on the learner's own layers
            with default_dtype(torch.float64):
                model = _learner_copy(name, learner64, reference, "cpu", torch.float64)
                _expect_properties(name, model, inputs64, seed_for(name, hidden, i, "properties"))

    def devices_and_learning() -> None:
        case = cases[0]
        with default_dtype(torch.float64):
            learner64 = construct(name, Transformer, *_model_args(case), norm_first=case.norm_first)
            expect_device_agnostic(name, copy.deepcopy(learner64).to("meta"), _model_case(case, hidden, 0)[2])
        if not hidden:  # once per graded cell: training is the slow part, and the hidden run adds nothing to it
            _expect_it_learns(name, Transformer, seed_for(name, hidden, "learning"), norm_first=False)

    with strict_numerics(), one_thread():
        run_cases(name, cases, check_case, after=devices_and_learning, prepare=prepare)


def _check_model_case(name, model, reference, inputs64, device, dtype) -> None:
    src64, tgt64, src_mask64, tgt_mask64 = inputs64
    src, tgt, src_mask, tgt_mask = _to(inputs64, device)
    B, S, T, V, D = *src.shape, tgt.size(1), reference.head.out_features, reference.d_model
    like = torch.empty(0, dtype=dtype, device=device)
    with torch.no_grad():
        memory64 = reference.encode(src64, src_mask64)
        memory = call(f"{name}.encode", model.encode, src, src_mask)
        expect_tensor(f"{name}.encode", "the memory", memory, memory64.shape, like=like)
        if not close(memory, memory64):
            mistaken = candidates(ENCODE_MISTAKES, reference, src64, src_mask64)
            name_the_mistake(f"{name}.encode", "the memory" + SWAPPED_LAYERS, memory, memory64, mistaken)

        logits64 = reference.decode(tgt64, memory64, tgt_mask64, src_mask64)
        memory = memory64.to(device=device, dtype=dtype)
        logits = call(f"{name}.decode", model.decode, tgt, memory, tgt_mask, src_mask)
        if isinstance(logits, torch.Tensor) and tuple(logits.shape) == (B, T, D) and V != D:
            fail(f"{name}.decode",
                 f"returns the decoder's states {tuple(logits.shape)}, not the logits (B, T, tgt_vocab) = {(B, T, V)}",
                 "apply the output head: return self.head(x) (after decoder_norm for Pre-LN).")
        expect_tensor(f"{name}.decode", "the logits", logits, logits64.shape, like=like)
        if not close(logits, logits64):
            mistaken = candidates(DECODE_MISTAKES, reference, tgt64, memory64, tgt_mask64, src_mask64)
            name_the_mistake(f"{name}.decode", "the logits" + SWAPPED_LAYERS, logits, logits64, mistaken)

        try:
            logits = call(name, model, src, tgt, src_mask, tgt_mask)
        except (ChangedInput, OnAFixedDevice):
            raise
        except CheckFailed as error:
            restate(error, "encode and decode work on their own, so look at how forward calls them: are the padding "
                    "masks passed the wrong way round?",
                    "memory = self.encode(src, src_padding_mask); return self.decode(tgt, memory, tgt_padding_mask, "
                    "src_padding_mask).")
        if isinstance(logits, torch.Tensor) and tuple(logits.shape) == (B, S, V) and S != T:
            fail(name, f"the logits have the source's length {S}, not the target's {T}: the decoder was fed the source",
                 "forward encodes src and decodes tgt: self.decode(tgt, self.encode(src, ...), ...).")
        expect_tensor(name, "the logits", logits, logits64.shape, like=like)
        if not close(logits, logits64):
            mistaken = candidates(FORWARD_MISTAKES, reference, src64, tgt64, src_mask64, tgt_mask64)
            name_the_mistake(name, "the logits of forward" + SWAPPED_LAYERS, logits, logits64, mistaken)


def _expect_properties(name, model: nn.Module, inputs64, seed: int) -> None:
    """Causal, blind to the source's padding, independent of batch order: on the learner's own layers (the
    tokens changed drawn from ``seed``)."""
    src, tgt, src_mask, tgt_mask = inputs64
    rng = SeededRandom(seed)
    vocab_src, vocab_tgt = model.src_embed.num_embeddings, model.tgt_embed.num_embeddings
    with torch.no_grad():
        logits = call(name, model, src, tgt)
        for t in range(1, tgt.size(1)):
            changed = tgt.clone()
            changed[:, t:] = torch.randint(vocab_tgt, changed[:, t:].shape, generator=rng.generator)
            if not close(call(name, model, src, changed)[:, :t], logits[:, :t]):
                fail(name, f"the decoder can see the future: changing the target tokens from position {t} on changed "
                     f"the logits at positions before {t}",
                     "in DecoderLayer, combine causal_mask(T, device=x.device) with the target padding mask for "
                     "the self-attention (decoder self-attention without the causal mask).")
        logits = call(name, model, src, tgt, src_mask, tgt_mask)
        repadded = torch.where(src_mask, src, torch.randint(vocab_src, src.shape, generator=rng.generator))
        if not close(call(name, model, repadded, tgt, src_mask, tgt_mask), logits):
            fail(name,
                 "changing the source's padding tokens changed the logits: the padding is not hidden from attention",
                 "pass src_padding_mask to every EncoderLayer and, as memory_padding_mask, to every DecoderLayer "
                 "(the cross-attention needs the source padding mask too).")
        order = torch.randperm(src.size(0), generator=rng.generator)
        permuted = call(name, model, src[order], tgt[order], src_mask[order], tgt_mask[order])
        if not close(permuted, logits[order]):
            fail(name, "the logits of a sequence depend on its place in the batch",
                 "nothing may be indexed by the batch axis: the positional encoding is indexed by position, "
                 "pe[:T] with T = tokens.size(1).")


# The "can it learn" check: trained on one fixed batch of reversals, the model must then reverse strings it
# was never shown. They are drawn after training and only their digits are sent: the grader decodes them
# greedily itself, token by token, so no answer it judges ever reaches the learner's kernel before it is judged.
LEARN_BATCH, LEARN_LENGTHS, LEARN_STEPS, LEARN_LOSS, LEARN_LR = 64, (2, 4), 120, 0.05, 3e-3
LEARN_CALL = 10  # steps a call: each call is one request to a graded kernel, well within a cell's time
FRESH, FRESH_RIGHT = 64, 16  # the reference reverses about 30 of 64 after its 50-odd steps; untrained, none


def _expect_it_learns(name, Transformer, seed: int, norm_first: bool) -> None:
    """Train the learner's whole model (reference initial weights) on one fixed batch, where it lives, then
    judge here how many fresh strings it reverses."""
    forked = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=forked):
        torch.manual_seed(seed)
        reference = ref.Transformer(VOCAB, VOCAB, 32, 4, 2, 64, norm_first=norm_first)
        model = construct(name, Transformer, VOCAB, VOCAB, 32, 4, 2, 64, norm_first=norm_first)
        copy_weights(name, model, reference, MODEL_HINT)
        rng = torch.Generator().manual_seed(seed)
        trained = random_digits(rng, LEARN_BATCH, *LEARN_LENGTHS)
        src, tgt = to_batch(trained, "reverse")
        run = _train(name, model, src, tgt)
        losses = run.get("losses") if isinstance(run, dict) else None
        if not (isinstance(losses, list) and losses and all(isinstance(x, float) for x in losses)):
            losses = [math.nan]
        _note_the_training_run(name, model, run, losses)
        fresh = _fresh_strings(rng, {tuple(digits) for digits in trained})
        right = _reversed_correctly(name, model.eval(), *to_batch(fresh, "reverse"))
    if right < FRESH_RIGHT:
        fail(name,
             f"cannot learn: trained on one fixed batch of {LEARN_BATCH} reversals (up to {LEARN_STEPS} Adam steps, "
             f"the loss went from {losses[0]:.3f} to {losses[-1]:.3f}), it then reversed {right} of {FRESH} strings it "
             f"was never shown, and {FRESH_RIGHT} are needed (the reference, trained the same way, reverses about 30)",
             "the numbers matched the reference with stand-in layers, so look at your own EncoderLayer and "
             "DecoderLayer, and at anything that stops gradients (.detach(), torch.no_grad, .item()).")


def _train(name, model, src: torch.Tensor, tgt: torch.Tensor):
    """Train ``model`` where it lives, ``LEARN_CALL`` steps a call: the training run's last report."""
    inputs, labels = tgt[:, :-1], tgt[:, 1:]
    training = make_in_kernel(model, stand_in_models.Training, model, src, inputs, labels, PAD, LEARN_LR)
    for _ in range(0, LEARN_STEPS, LEARN_CALL):
        run = learner_step(name, lambda: training.run(LEARN_CALL, LEARN_LOSS), (src, tgt))
        if not isinstance(run, dict) or run.get("done") is not False:
            return run
    return run


def _note_the_training_run(name, model, run, losses: list[float]) -> None:
    """What the training run in the kernel reported about itself (``kernel_reported``)."""
    unused = run.get("unused") if isinstance(run, dict) else None
    if unused:
        kernel_reported(name, model,
                        f"the parameters {', '.join(map(str, unused[:4]))} get no gradient: forward never uses them",
                        "every submodule the notebook names must take part in forward (and nothing be detached).")
    if not math.isfinite(losses[-1]):
        kernel_reported(name, model,
                        f"training on a fixed batch, the loss became {losses[-1]} at step {len(losses) - 1}")


def _fresh_strings(rng: torch.Generator, trained: set[tuple[int, ...]]) -> list[list[int]]:
    """``FRESH`` strings of digits, none of them among those the model was trained on."""
    fresh: list[list[int]] = []
    while len(fresh) < FRESH:
        drawn = random_digits(rng, FRESH, *LEARN_LENGTHS)
        fresh += [d for d in drawn if tuple(d) not in trained][: FRESH - len(fresh)]
    return fresh


def _reversed_correctly(name, model, src: torch.Tensor, tgt: torch.Tensor) -> int:
    """How many of ``src`` the model reverses, each written up to its EOS, decoding greedily here: the model
    is given the source and its own tokens so far, never the answer."""
    written = torch.full((src.size(0), 1), BOS, dtype=torch.long)
    with torch.no_grad():
        for _ in range(tgt.size(1) - 1):
            logits = call(name, model, src, written, src != PAD, written != PAD)
            expect_tensor(name, "the logits", logits, (*written.shape, VOCAB), like=torch.empty(0))
            written = torch.cat([written, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    real = tgt != PAD
    return sum(bool(torch.equal(written[b][real[b]], tgt[b][real[b]])) for b in range(src.size(0)))


# ------------------------------------------------------------------------------- teacher_forcing_loss


@dataclass(frozen=True)
class DataCase:
    batch: int
    min_len: int
    max_len: int


VISIBLE_DATA = [DataCase(4, 1, 5), DataCase(3, 2, 6)]
HIDDEN_DATA = [DataCase(5, 1, 7), DataCase(2, 3, 4), DataCase(6, 1, 3)]


def _stand_in_model(vocab: int, d_model: int, seed: int) -> nn.Module:
    """A float64 stand-in model with random weights (its weights are what crosses to the learner's side)."""
    model = randomise(stand_in_models.StandInModel(vocab, d_model).double(), SeededRandom(seed))
    return stand_in_models.stand_in_model(model.state_dict())


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


# ------------------------------------------------------------------------------- greedy_decode


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
