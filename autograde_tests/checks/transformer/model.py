"""Chapter 5's check of ``Transformer``: encode, decode and forward compared with the reference's on
stand-in layers (``stand_in_models``) in place of the learner's EncoderLayer and DecoderLayer, then the
properties on the learner's own layers, then whether it can learn (``learning``). The mistakes it names are
in ``model_mistakes``."""

import copy
from dataclasses import dataclass

import torch
from torch import nn

from ...reference import transformer as ref
from ...remote.proxy import lend, make_in_kernel
from .. import stand_in_models
from ..harness import (
    ChangedInput,
    CheckFailed,
    OnAFixedDevice,
    SeededRandom,
    call,
    candidates,
    close,
    construct,
    copy_weights,
    default_dtype,
    expect_tensor,
    fail,
    name_the_mistake,
    one_thread,
    randomise,
    restate,
    run_cases,
    seed_for,
    strict_numerics,
)
from ..how import expect_device_agnostic
from .cases import _padding_mask, _to
from .learning import _expect_it_learns
from .model_mistakes import DECODE_MISTAKES, DUPLICATE_NORM, ENCODE_MISTAKES, FORWARD_MISTAKES, MODEL_HINT


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
