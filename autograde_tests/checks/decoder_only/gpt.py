"""Chapter 6's GPT: its cases, its mistakes and its check.

Its catalogued mistakes: positions restarting at 0 for cached tokens; the cache's length read on the wrong axis;
every block given the first block's cache; the blocks given no cache; no final norm; embeddings scaled by
sqrt(d_model); logits turned to float32.

The check runs every case with stand-in blocks (``stand_in_models``) and PyTorch's RMSNorm in place of the
learner's.
"""

import copy
import functools
import math
from dataclasses import dataclass

import torch
from torch import nn

from ...reference import decoder_only as ref
from ...remote.proxy import lend, make_in_kernel, run_in_kernel, type_name
from .. import in_kernel, stand_in_models
from ..harness import (
    Mistake,
    SeededRandom,
    call,
    candidates,
    close,
    construct,
    copy_weights,
    default_dtype,
    edited,
    expect_tensor,
    fail,
    learner_step,
    name_the_mistake,
    one_thread,
    randomise,
    run_cases,
    seed_for,
    strict_numerics,
)
from ..how import expect_device_agnostic
from .models import MODEL_HINT, _built, _expect_built, _HeadOptions, _torch_rms_norm


@dataclass(frozen=True)
class ModelCase(_HeadOptions):
    batch: int
    length: int
    split: int  # the cached run reads idx[:, :split], then the rest one token at a time
    vocab: int
    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    eps: float = 1e-6
    n_kv_heads: int | None = None


VISIBLE_MODEL = [ModelCase(2, 7, 3, 11, 8, 2, 2, 16), ModelCase(3, 5, 1, 9, 12, 3, 1, 20),
                 ModelCase(2, 6, 2, 10, 16, 4, 2, 20, n_kv_heads=2)]
HIDDEN_MODEL = [ModelCase(3, 8, 5, 13, 16, 4, 2, 24), ModelCase(2, 6, 2, 10, 8, 1, 3, 12, eps=0.1),
                ModelCase(4, 4, 1, 7, 12, 2, 1, 16), ModelCase(2, 5, 3, 9, 24, 6, 2, 16, eps=1e-3, n_kv_heads=3),
                ModelCase(3, 4, 2, 8, 16, 4, 1, 12, n_kv_heads=1)]


STAND_IN_NOTE = (" (this comparison runs your GPT with simple stand-in blocks and PyTorch's nn.RMSNorm in place of "
                 "your DecoderBlocks and final RMSNorm, so the difference comes from GPT itself)")


def _gpt(*changes: tuple[str, str]):
    """The reference GPT's forward with ``changes`` made to its source (``edited``), called (model, idx,
    cache): the logits of a mistake."""
    forward = edited(ref.GPT.forward, *changes, math=math)  # a mistake may scale by math.sqrt
    return lambda model, idx, cache: forward(model, idx, cache)[0]


GPT_MISTAKES = [
    Mistake("positions restarting at 0 for cached tokens: with a cache of T_past tokens the new ones are at "
            "T_past, T_past + 1, ..., not 0, 1, ...",
            "positions = torch.arange(T_past, T_past + T) with T_past the cache's length (cache[0][0].size(2)).",
            _gpt(("past = 0 if cache is None else cache[0][0].size(2)", "past = 0"))),
    Mistake("no final norm: a Pre-Norm stack's last residual sum must go through self.norm before the head",
            "return self.head(self.norm(x)), cache.",
            _gpt(("self.head(self.norm(x))", "self.head(x)"))),
    Mistake("the token embeddings are scaled by sqrt(d_model): that belongs to the 2017 Transformer's sinusoidal "
            "positions; a RoPE model adds nothing to its embeddings and scales nothing",
            "x = self.embed(idx).",
            _gpt(("x = self.embed(idx)", "x = self.embed(idx) * math.sqrt(self.embed.embedding_dim)"))),
    Mistake("every block is given the first block's cache: each block has its own keys and values, cache[i]",
            "for i, block in enumerate(self.blocks): x, layer_cache = block(x, positions, cache[i]), and return the "
            "new caches in the same order.",
            _gpt(("else cache[i])", "else cache[0])"))),
    Mistake("the blocks are not given the cache: the new tokens are placed after it, but cannot attend to it",
            "hand each block its own cache: block(x, positions, cache[i]).",
            _gpt(("None if cache is None else cache[i]", "None"))),
    Mistake("the cache's length is read on the wrong axis: the cached keys are (B, h, T_past, d_k), time on axis 2",
            "T_past = cache[0][0].size(2), the first block's keys along time.",
            _gpt(("cache[0][0].size(2)", "cache[0][0].size(1)"))),
]


def _model_inputs(i: int, case: ModelCase, hidden: bool) -> tuple[ref.GPT, ref.GPT, torch.Tensor]:
    """Case ``i``'s reference GPT (random weights), the same with stand-in blocks (random weights of their own)
    and PyTorch's RMSNorm as its final norm, and the token ids idx (B, T), on the CPU."""
    seed = functools.partial(seed_for, "GPT", hidden, i)
    model = ref.GPT(case.vocab, case.d_model, case.n_heads, case.n_layers, case.d_ff, case.eps, case.n_kv_heads)
    reference = randomise(model.double(), SeededRandom(seed("weights"))).eval()
    blocks = nn.ModuleList(stand_in_models.StandInBlock(case.d_model) for _ in range(case.n_layers)).double()
    swapped = copy.deepcopy(reference)
    swapped.blocks = stand_in_models.stand_in_blocks(randomise(blocks, SeededRandom(seed("stand-ins"))).state_dict())
    swapped.norm = _torch_rms_norm(reference.norm)
    idx = torch.randint(case.vocab, (case.batch, case.length), generator=SeededRandom(seed()).generator)
    return reference, swapped, idx


def check_gpt(GPT, hidden: bool = False) -> None:
    """Check a learner's ``GPT(vocab, d_model, n_heads, n_layers, d_ff)``: ``forward(idx, cache=None)`` returns
    (logits, cache); uncached and cached, then causality, cache consistency and gradients. Every case runs with
    stand-ins lent in place of the learner's blocks and final RMSNorm: one mistake there costs only its own check."""
    name = "GPT"
    cases = HIDDEN_MODEL if hidden else VISIBLE_MODEL

    def prepare(i: int, case: ModelCase):
        """The learner's GPT, built once per case (float64, the reference's weights), and the case's inputs."""
        reference, swapped, idx64 = _model_inputs(i, case, hidden)
        learner64, built = _built(name, GPT, ("DecoderBlock", "RMSNorm"), case.vocab, case.d_model,
                                  case.n_heads, case.n_layers, case.d_ff, **case.options)
        _expect_model_built(name, built, case)
        learner64 = learner64.double()
        copy_weights(name, learner64, reference, MODEL_HINT, lent=LENT_TO_GPT)
        return learner64, reference, swapped, idx64

    def check_case(i: int, case: ModelCase, device, dtype, prepared) -> None:
        """The logits, uncached and cached; on the CPU in float64, causality, cache consistency and gradients."""
        learner64, reference, swapped, idx64 = prepared
        model = copy.deepcopy(learner64).to(device=device, dtype=dtype)
        copy_weights(name, model, reference, MODEL_HINT, lent=LENT_TO_GPT)
        model = _with_stand_ins(model, swapped).to(device=device, dtype=dtype)
        with torch.no_grad(), default_dtype(dtype):
            _check_model_case(name, model, swapped, idx64, case, device, dtype)
        if device.type == "cpu" and dtype == torch.float64:
            copy_weights(name, learner64, reference, MODEL_HINT, lent=LENT_TO_GPT)
            model = _with_stand_ins(copy.deepcopy(learner64), swapped)
            with torch.no_grad():
                _expect_properties(name, model, idx64, case)
            _expect_gradients(name, model, swapped, idx64, seed_for(name, hidden, i, "upstream"))

    def on_meta() -> None:
        case = cases[0]
        model = construct(name, GPT, case.vocab, case.d_model, case.n_heads, case.n_layers, case.d_ff).double()
        expect_device_agnostic(name, copy.deepcopy(model).to("meta"), (_model_inputs(0, case, hidden)[2],))

    with strict_numerics(), one_thread():
        run_cases(name, cases, check_case, after=on_meta, prepare=prepare)


LENT_TO_GPT = ("blocks", "norm")  # built as ``in_kernel.Recorded``, then replaced by stand-ins (``_with_stand_ins``)


def _expect_model_built(name, built, case: ModelCase) -> None:
    """The learner's GPT built each block with the model's arguments, and its final norm with d_model and eps."""
    block = {"d_model": case.d_model, "n_heads": case.n_heads, "d_ff": case.d_ff, "eps": case.eps,
             "n_kv_heads": case.kv_heads}
    _expect_built(name, built, {f"blocks.{j}": ("DecoderBlock", block) for j in range(case.n_layers)}, required=True)
    _expect_built(name, built, {"norm": ("RMSNorm", {"d_model": case.d_model, "eps": case.eps})}, required=False)


def _with_stand_ins(model, reference):
    """The learner's GPT with ``reference``'s stand-in blocks and final norm lent in place of its own: GPT is
    graded on its own, whatever the learner's DecoderBlock and RMSNorm do (they have checks of their own)."""
    model.blocks = make_in_kernel(model, nn.ModuleList, [lend(model, copy.deepcopy(b)) for b in reference.blocks])
    model.norm = lend(model, copy.deepcopy(reference.norm))
    return model


def _check_model_case(name, model, reference, idx64, case: ModelCase, device, dtype) -> None:
    """The learner's logits (``model``, with stand-ins) against ``reference``'s: of idx at once, then of the rest of
    idx given the cache of idx[:, :split]."""
    like = torch.empty(0, dtype=dtype, device=device)

    def forward(idx, *cache):
        """The learner's forward, which must return (logits, cache), the logits (B, T, vocab) like the inputs."""
        result = call(name, model, idx, *cache)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            fail(name, f"forward should return (logits, cache), got {type_name(result)}",
                 "return self.head(self.norm(x)), new_cache.")
        expect_tensor(name, "the logits", result[0], (*idx.shape, case.vocab), like=like)
        return result

    idx, split = idx64.to(device), case.split
    expected, _ = reference(idx64)
    logits, _ = forward(idx)
    if not close(logits, expected):
        mistaken = candidates(GPT_MISTAKES, reference, idx64, None)
        name_the_mistake(name, "the logits" + STAND_IN_NOTE, logits, expected, mistaken)
    _, cache64 = reference(idx64[:, :split])
    _, cache = forward(idx[:, :split])
    logits, _ = forward(idx[:, split:], cache)
    if not close(logits, expected[:, split:]):
        mistaken = candidates(GPT_MISTAKES, reference, idx64[:, split:], cache64)
        name_the_mistake(name, f"the logits of idx[:, {split}:] given the cache of idx[:, :{split}]" + STAND_IN_NOTE,
                         logits, expected[:, split:], mistaken)


def _expect_properties(name, model, idx, case: ModelCase) -> None:
    """With stand-in blocks and norm: causal, and cached decoding gives the logits of uncached decoding, which
    rests on what GPT itself does with the positions and the caches."""
    full, _ = call(name, model, idx)
    changed = idx.clone()
    changed[:, case.split:] = (changed[:, case.split:] + 1) % case.vocab
    if not close(call(name, model, changed)[0][:, : case.split], full[:, : case.split]):
        fail(name, f"the model can see the future: changing the tokens from position {case.split} on changed the "
             f"logits before {case.split}{STAND_IN_NOTE}", "only the blocks, which are causal, may mix tokens.")
    logits, cache = call(name, model, idx[:, : case.split])
    steps = [logits]
    for t in range(case.split, case.length):
        logits, cache = call(name, model, idx[:, t:t + 1], cache)
        steps.append(logits)
    if not close(torch.cat(steps, dim=1), full):
        fail(name, f"decoding with the cache, one token at a time after the first {case.split}, gives other logits "
             f"than running the whole sequence at once{STAND_IN_NOTE}",
             "give the new tokens the positions after the cached ones (past, past + 1, ...), hand each block its "
             "own cache, and return each block's new cache in the same order.")


def _expect_gradients(name, model, reference, idx, seed: int) -> None:
    """With stand-in blocks and norm and the reference's weights: GPT's own parameters (the embedding and the
    head) get the reference's gradients."""
    upstream = SeededRandom(seed).randn(*idx.shape, reference.head.out_features)
    gradients = in_kernel.parameter_gradients(reference, (idx,), upstream)["gradients"]
    expected = {key: grad for key, grad in gradients.items() if not key.startswith(("blocks.", "norm."))}

    actual = learner_step(name, lambda: run_in_kernel(in_kernel.parameter_gradients, model, (idx,), upstream), (idx,))
    if "error" in actual:
        fail(name, f"the logits are not connected to the autograd graph ({actual['error']})",
             "do not use torch.no_grad(), .detach(), .data or .item() inside forward.")
    for key, want in expected.items():
        got = actual["gradients"].get(key)
        if not isinstance(got, torch.Tensor):
            fail(name, f"no gradient reaches the parameter {key}: forward does not use it, or cuts it from the graph",
                 "every submodule the notebook names must take part in forward, with nothing detached.")
        if not close(got, want):
            fail(name, f"the gradient of {key} differs from the reference although the logits are right: part of "
                 f"the computation is cut from the graph", "look for .detach(), .data or torch.no_grad() in forward.")
