"""Checks for chapter 06_decoder_only: RMSNorm, RoPE, the decoder block with its KV cache, the model, the
language-model loss and sampling, and loading a checkpoint in Hugging Face's and in Meta's layout.

The chapter's catalogued mistakes, each named by the check it belongs to (the tests hold one buggy
implementation per entry):
    RMSNorm         subtracting the mean (a LayerNorm without bias); eps outside the square root; eps left
                    out; the sum of squares instead of their mean; the mean over the whole tensor; no weight;
                    eps ignored
    apply_rotary    rotating the wrong pairs (interleaved (2i, 2i + 1) instead of the course's half-split
                    (i, i + d_k/2)); rotating the wrong way; ignoring the positions; only the first position
                    used (the rest taken as consecutive); ignoring the base; the angles laid out for neighbouring
                    pairs; one frequency per feature
    DecoderBlock    RoPE applied to v; RoPE on q only; RoPE before the heads are split; positions restarting at
                    0 for cached tokens; the cache appended on the wrong axis; only the new tokens returned as
                    the cache; a causal mask that ignores the cached tokens; chapter 3's (T, T) mask, which fails
                    only with cached tokens; no causal mask; no 1/sqrt(d_k); Post-Norm; the FFN normalised by
                    attn_norm; the FFN's gate and up projections swapped
    GPT             positions restarting at 0 for cached tokens; the cache's length read on the wrong axis;
                    every block given the first block's cache; the blocks given no cache; no final norm;
                    embeddings scaled by sqrt(d_model); logits turned to float32
    lm_loss         loss not shifted; shifted the wrong way; a softmax before the cross-entropy; nll_loss on
                    raw logits; summed, not averaged; only the last position scored
    generate        softmax over the wrong axis; top-k applied after softmax without renormalising; temperature
                    applied after softmax; top-k keeping k - 1; top-p dropping the token that crosses top_p;
                    top-p before top-k; the first position's logits; the draw over sorted or top-k probabilities
                    (right distribution, other tokens); no generator; temperature 0 used as a divisor; the cache
                    not used; the cache used although use_cache=False
    load_hf_llama   the weights transposed; the head left as it was when the checkpoint has none (tied), or
                    taken from the embedding when it has one; q_proj and k_proj reordered as Meta's are; the two
                    norms swapped; the model's parameters replaced by the checkpoint's tensors; the checkpoint
                    changed; the model not returned
    load_meta_llama wq and wk not reordered; wv (and wo) reordered too; only wq reordered; the reordering the
                    wrong way round; across all the heads at once; wk reordered with the query heads' count;
                    w1 and w3 swapped; and those of load_hf_llama that apply

Module checks load the reference's random weights by name. Each exercise is graded on its own where it can
be: the block check lends PyTorch's RMSNorm as the block's norms and the course's RoPE as the
``apply_rotary`` its code calls; the GPT check runs every case with stand-in blocks (``stand_in_models``) and
PyTorch's RMSNorm in place of the learner's; the loss and sampling checks drive a stand-in model; the loaders
load into a stand-in with a GPT's parameters (``stand_in_models.load_target``), whose weights the check reads
back and judges by a reference GPT's logits. Sampling is reproducible because the exercise fixes how a token
is drawn: ``torch.multinomial(probs, 1, generator=generator)`` on the final probabilities.
"""

import copy
import functools
import inspect
from dataclasses import dataclass, replace

import torch
from torch import nn

from ..reference import decoder_only as ref
from ..remote.proxy import lend, make_in_kernel, run_in_kernel, type_name
from . import in_kernel, stand_in_models
from .harness import (
    call,
    candidates,
    CheckFailed,
    close,
    construct,
    copy_weights,
    default_dtype,
    edited,
    expect_loss,
    expect_tensor,
    expect_unchanged,
    fail,
    learner_step,
    matching_mistake,
    Mistake,
    name_the_mistake,
    one_thread,
    output_like_input,
    randomise,
    restate,
    run_cases,
    seed_for,
    SeededRandom,
    strict_numerics,
)
from .how import expect_device_agnostic, kernel_reported

# ------------------------------------------------------------------------------- RMSNorm


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


# ------------------------------------------------------------------------------- apply_rotary


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


# ------------------------------------------------------------------------------- DecoderBlock


class _HeadOptions:
    """A case's eps and n_kv_heads, passed by keyword only when it sets them (each reaches what the model
    builds: the norms, the key and value heads)."""

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def options(self) -> dict:
        return ({} if self.eps == 1e-6 else {"eps": self.eps}) | \
            ({} if self.n_kv_heads is None else {"n_kv_heads": self.n_kv_heads})


@dataclass(frozen=True)
class BlockCase(_HeadOptions):
    batch: int
    length: int  # new tokens
    past: int  # cached tokens (0: no cache)
    d_model: int
    n_heads: int
    d_ff: int
    eps: float = 1e-6
    n_kv_heads: int | None = None  # grouped-query attention


VISIBLE_BLOCK = [BlockCase(2, 5, 0, 8, 2, 12), BlockCase(3, 2, 4, 12, 3, 20), BlockCase(2, 1, 6, 8, 2, 16),
                 BlockCase(2, 4, 0, 16, 4, 20, n_kv_heads=2), BlockCase(2, 2, 3, 12, 3, 16, n_kv_heads=1)]
HIDDEN_BLOCK = [BlockCase(3, 6, 0, 16, 4, 24), BlockCase(2, 3, 5, 12, 2, 16, eps=0.1), BlockCase(4, 1, 3, 8, 1, 8),
                BlockCase(1, 4, 7, 12, 3, 28, eps=1e-3), BlockCase(2, 5, 0, 24, 6, 32, n_kv_heads=3),
                BlockCase(3, 2, 4, 24, 6, 16, eps=0.05, n_kv_heads=2), BlockCase(2, 3, 2, 16, 4, 12, n_kv_heads=1)]
BLOCK_HINT = ("the notebook names the submodules attn_norm and ffn_norm (RMSNorm(d_model, eps)), w_q and w_o "
              "(nn.Linear(d_model, d_model, bias=False)), w_k and w_v (nn.Linear(d_model, n_kv_heads * d_k, "
              "bias=False): n_kv_heads key and value heads, n_heads when not given), w_gate and w_up "
              "(nn.Linear(d_model, d_ff, bias=False)) and w_down (nn.Linear(d_ff, d_model, bias=False)).")
CACHE_AXIS = ("the cache is appended on the wrong axis: keys and values grow along time, axis 2 of (B, h, T, d_k)",
              "k = torch.cat([cache[0], k], dim=2), and the same for v.")
CACHE_REPEATED = ("the cache holds the key and value heads repeated for every query head: it must keep the "
                  "n_kv_heads heads the projections made, which is what makes grouped-query attention's cache smaller",
                  "cache k and v as (B, n_kv_heads, T_past + T, d_k), and repeat them for the query heads only for "
                  "the product (k.repeat_interleave(n_heads // n_kv_heads, dim=1)).")
CACHE_ONLY_NEW = ("the cache returned holds only the new tokens' keys and values: it must hold every token's so far",
                  "append the new k and v to the cached ones (torch.cat([cache[0], k], dim=2)) and return the "
                  "result.")
BLOCK_STAND_IN_NOTE = (" (this comparison runs your DecoderBlock with PyTorch's nn.RMSNorm as attn_norm and "
                       "ffn_norm, and the course's RoPE as the apply_rotary it calls, so the difference comes from "
                       "the block itself)")
ONLY_WITH_A_CACHE = ("It fails only when given cached tokens (with an empty cache it runs): with T_past cached tokens "
                     "there are T_past + T keys for T queries, so the scores are (T, T_past + T), and a mask or a "
                     "shape that assumes T keys breaks.",
                     "build the mask for T queries against T_past + T keys (query t sees keys 0 .. T_past + t) and "
                     "append the cache along time: k = torch.cat([cache[0], k], dim=2).")


# A mistake: the reference block's forward with (old, new) changes made to its source and names given by keyword
# in place of the module's (``edited``), called (block, x, positions, cache).
_block = functools.partial(edited, ref.DecoderBlock.forward)
ROTATED = "q, k = apply_rotary(q, positions), apply_rotary(k, positions)"
ATTENDED = "attended, _ = scaled_dot_product_attention(q, shared_k, shared_v, mask)"
SHARED = "shared_k, shared_v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)"
RESIDUAL = "x = x + self.w_o(attended.transpose(1, 2).reshape(B, T, -1))"
FFN_OUT = "return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h)), (k, v)"
BLOCK_MISTAKES = [
    Mistake(f"RoPE rotates the wrong pairs: interleaved (2i, 2i + 1) instead of the course's half-split; {HALF_SPLIT}",
            "use your apply_rotary (half-split) on q and k.",
            _block(apply_rotary=INTERLEAVED)),
    Mistake("RoPE is applied to v too: only the queries and keys are rotated (positions belong in the scores, not in "
            "what is averaged)",
            "q, k = apply_rotary(q, positions), apply_rotary(k, positions); leave v as it is.",
            _block((ROTATED, ROTATED + "; v = apply_rotary(v, positions)"))),
    Mistake("RoPE is applied to q only: the keys must be rotated too, or the scores do not depend on the offset",
            "k = apply_rotary(k, positions), before it goes into the cache.",
            _block((ROTATED, "q = apply_rotary(q, positions)"))),
    Mistake("positions restarting at 0 for cached tokens: the new tokens are rotated as if they were at 0, 1, ... "
            "instead of at the positions given",
            "rotate with the positions argument (T_past, T_past + 1, ... after a cache), not torch.arange(T).",
            _block((ROTATED, "q, k = apply_rotary(q, torch.arange(T)), apply_rotary(k, torch.arange(T))"))),
    Mistake("the causal mask ignores the cached tokens: it is a (T, T) triangle placed over the first keys, so the "
            "new tokens cannot see most of the cache",
            "the new tokens are the last T of T_past + T keys: token t may see keys 0 .. T_past + t.",
            _block(("mask = torch.arange(k.size(2), device=x.device) <= "
                    "torch.arange(past, past + T, device=x.device)[:, None]",
                    "mask = torch.ones(T, k.size(2), dtype=torch.bool, device=x.device).tril()"))),
    Mistake("no causal mask: each token sees the tokens after it",
            "mask the scores so that token t attends to keys 0 .. T_past + t only.",
            _block((ATTENDED, "attended, _ = scaled_dot_product_attention(q, shared_k, shared_v)"))),
    Mistake("the FFN's gate and up projections are swapped: silu goes on w_gate's output, which multiplies w_up's",
            "w_down(F.silu(w_gate(h)) * w_up(h)).",
            _block(("F.silu(self.w_gate(h)) * self.w_up(h)", "F.silu(self.w_up(h)) * self.w_gate(h)"))),
    Mistake("RoPE is applied before the heads are split: to (B, T, d_model), with d_model/2 frequencies across all "
            "the heads, where each head's (B, h, T, d_k) queries and keys are rotated on their own d_k features",
            "split the heads first (view and transpose to (B, h, T, d_k)), then apply_rotary(q, positions) and "
            "apply_rotary(k, positions).",
            _block((ROTATED, "q, k = q, k"), ("self.w_q(h).view(", "apply_rotary(self.w_q(h), positions).view("),
                   ("self.w_k(h).view(", "apply_rotary(self.w_k(h), positions).view("))),
    Mistake("the scores are not scaled by 1/sqrt(d_k)",
            "scores = q @ k.transpose(-2, -1) / math.sqrt(d_k), with d_k the size of one head.",
            _block((ATTENDED, "attended, _ = scaled_dot_product_attention(q * math.sqrt(self.d_k), shared_k, "
                              "shared_v, mask)"))),
    Mistake("the key and value heads are repeated along the wrong axis: query head j must read KV head "
            "j // (n_heads // n_kv_heads), each KV head serving a group of consecutive query heads; yours pairs it "
            "with KV head j % n_kv_heads, the KV heads tiled (.repeat, or a new axis put before the heads')",
            "k.repeat_interleave(n_heads // n_kv_heads, dim=1), the same for v; or k[:, :, None].expand(B, n_kv_heads, "
            "group, T, d_k).reshape(B, n_heads, T, d_k): the group axis after the KV heads' axis.",
            _block((SHARED, "shared_k, shared_v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)"))),
    Mistake("the norms come after the residual sums (Post-Norm, the 2017 Transformer's order): this block is "
            "Pre-Norm, x + attention(norm(x)), then x + FFN(norm(x))",
            "x = x + attention(self.attn_norm(x)); x = x + ffn(self.ffn_norm(x)): the residual stream itself is never "
            "normalised inside the block.",
            _block(("h = self.attn_norm(x)", "h = x"), ("h = self.ffn_norm(x)", "h = x"),
                   (RESIDUAL, "x = self.attn_norm(x + self.w_o(attended.transpose(1, 2).reshape(B, T, -1)))"),
                   (FFN_OUT, "return self.ffn_norm(x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))), (k, v)"))),
    Mistake("the FFN's input goes through attn_norm: ffn_norm, which has weights of its own, is never used",
            "h = self.ffn_norm(x) before the FFN; attn_norm is for the attention's input only.",
            _block(("h = self.ffn_norm(x)", "h = self.attn_norm(x)"))),
]


def _block_inputs(i: int, case: BlockCase, hidden: bool):
    """Case ``i``'s reference block (random weights), x (B, T, d_model), positions (T,) after the cache, and the
    cache (k, v) or None (float64, CPU)."""
    block = ref.DecoderBlock(case.d_model, case.n_heads, case.d_ff, case.eps, case.n_kv_heads).double()
    reference = randomise(block, SeededRandom(seed_for("DecoderBlock", hidden, i, "weights")))
    rng = SeededRandom(seed_for("DecoderBlock", hidden, i))
    x = rng.randn(case.batch, case.length, case.d_model)
    d_k = case.d_model // case.n_heads
    cache = None if case.past == 0 else tuple(rng.randn(case.batch, case.kv_heads, case.past, d_k) for _ in range(2))
    return reference, x, torch.arange(case.past, case.past + case.length), cache


def _expect_cache(name, cache, expected, new_tokens: int, n_heads: int) -> None:
    """The learner's cache must be a pair (k, v) of tensors shaped like the reference's (``new_tokens`` of
    its time axis are the call's own; ``n_heads`` query heads)."""
    if not isinstance(cache, (tuple, list)) or len(cache) != 2:
        fail(name, f"forward should return its cache as a pair (k, v), got {type_name(cache)}",
             "return x, (k, v) with k and v of shape (B, h, T_past + T, d_k).")
    for what, got, want in zip(("keys", "values"), cache, expected):
        if not isinstance(got, torch.Tensor):
            fail(name, f"the cache's {what} should be a tensor, got {type_name(got)}")
        shape, expected_shape = tuple(got.shape), tuple(want.shape)
        if shape != expected_shape:
            only_new = (*expected_shape[:2], new_tokens, *expected_shape[3:])
            repeated = (expected_shape[0], n_heads, *expected_shape[2:])
            problem, hint = CACHE_ONLY_NEW if shape == only_new else CACHE_REPEATED if shape == repeated else CACHE_AXIS
            fail(name, f"{problem} (the cache's {what} have shape {shape}, expected {expected_shape})", hint)


def check_decoder_block(DecoderBlock, hidden: bool = False) -> None:
    """Check a learner's ``DecoderBlock(d_model, n_heads, d_ff, eps=1e-6, n_kv_heads=None)``: ``forward(x,
    positions, cache=None)`` returns (x, (k, v)), with and without a cache, with grouped-query heads too. It is
    built with its norms recorded (``_built``) and run with stand-in norms and RoPE: its own code is graded."""
    name = "DecoderBlock"
    cases = HIDDEN_BLOCK if hidden else VISIBLE_BLOCK

    def check_case(i: int, case: BlockCase, device, dtype) -> None:
        reference, x64, positions, cache64 = _block_inputs(i, case, hidden)
        with torch.no_grad():
            expected, expected_cache = reference(x64, positions, cache64)
        learner, built = _built(name, DecoderBlock, ("RMSNorm",), case.d_model, case.n_heads, case.d_ff, **case.options)
        norm = {"d_model": case.d_model, "eps": case.eps}
        _expect_built(name, built, {"attn_norm": ("RMSNorm", norm), "ffn_norm": ("RMSNorm", norm)}, required=False)
        learner = _with_stand_in_norms(learner.to(torch.float64), reference)
        copy_weights(name, learner, reference, BLOCK_HINT, lent=("attn_norm", "ffn_norm"))
        learner = learner.to(device=device, dtype=dtype)
        x = x64.to(device=device, dtype=dtype)
        cache = None if cache64 is None else tuple(t.to(device=device, dtype=dtype) for t in cache64)
        with torch.no_grad(), default_dtype(dtype):
            result = _call_block(name, learner, x, positions.to(device), cache)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            fail(name, f"forward should return (x, cache), got {type_name(result)}",
                 "return x, (k, v): the output and the new cache.")
        out, new_cache = result
        expect_tensor(name, "the output", out, expected.shape, like=x)
        _expect_cache(name, new_cache, expected_cache, case.length, case.n_heads)
        if not close(out, expected):
            mistaken = candidates(BLOCK_MISTAKES, reference, x64, positions, cache64, part=0)
            name_the_mistake(name, "the output" + BLOCK_STAND_IN_NOTE, out, expected, mistaken)
        for what, got, want in zip(("keys", "values"), new_cache, expected_cache):
            if not close(got, want):
                hint = "the cache holds k after RoPE (rotated) and v as projected, old tokens first."
                fail(name, f"the cache's {what} differ from the reference's ({what} of every token so far)", hint)

    def on_meta() -> None:  # the learner's own apply_rotary is not the block's to answer for here either
        case = cases[0]
        meta = copy.deepcopy(construct(name, DecoderBlock, case.d_model, case.n_heads, case.d_ff).double()).to("meta")
        _, x, positions, _ = _block_inputs(0, case, hidden)
        expect_device_agnostic(name, make_in_kernel(meta, in_kernel.without_rope, meta), (x, positions))

    with strict_numerics(), one_thread():
        run_cases(name, cases, check_case, after=on_meta)


def _built(name, cls, others: tuple[str, ...], *args, **kwargs):
    """The learner's ``cls(*args, **kwargs)``, built with the notebook's classes named in ``others`` recorded in
    place of the learner's (``in_kernel.built_with``): the module, and what its constructor gave each of them."""
    module = construct(name, lambda *a, **k: make_in_kernel(cls, in_kernel.built_with, cls, others, *a, **k),
                       *args, **kwargs)


    return module, run_in_kernel(in_kernel.recorded, module)


def _expect_built(name, built, expected: dict[str, tuple[str, dict]], required: bool) -> None:
    """Each submodule in ``expected`` (path: class name, arguments) was built with those arguments, read as the
    reference class's signature reads them. With ``required`` the submodule must come from that class; without,
    one built some other way (e.g. PyTorch's own nn.RMSNorm) is not judged here: a stand-in replaces it."""
    given = {path: (cls, args, kwargs) for path, cls, args, kwargs in built}
    for path, (cls, want) in expected.items():
        if path not in given or given[path][0] != cls:
            if required:
                fail(name, f"{path} should be built by the notebook's {cls}, found none", MODEL_HINT)
            continue
        signature = inspect.signature(getattr(ref, cls))
        # A keyword the contract does not name (the learner's own option, e.g. dropout=0.0) is the learner's business.
        contract = {key: value for key, value in given[path][2].items() if key in signature.parameters}
        try:
            bound = signature.bind(*given[path][1], **contract)
        except TypeError as error:
            fail(name, f"{path} is built as {cls} with arguments its signature does not take ({error})", MODEL_HINT)
        bound.apply_defaults()
        got = dict(bound.arguments)
        if "n_kv_heads" in got and got["n_kv_heads"] is None:  # None means as many as the query heads
            got["n_kv_heads"] = got["n_heads"]
        wrong = [f"{key}={got[key]!r} (the model's is {value!r})" for key, value in want.items() if got[key] != value]
        if wrong:
            passing = " and ".join(key for key in want if key in ("eps", "n_kv_heads"))
            fail(name, f"{path} is built as {cls} with {', '.join(wrong)}: the arguments {name} was given must "
                 f"reach every {cls} it builds", f"pass them on, e.g. {cls}(..., {passing or 'eps'}).")


def _with_stand_in_norms(block, reference):
    """The learner's block with PyTorch's RMSNorm (``reference``'s weights and eps) lent as its attn_norm and
    ffn_norm: the block is graded on its own, whatever the learner's RMSNorm does (it has its own check)."""
    block.attn_norm = lend(block, _torch_rms_norm(reference.attn_norm))
    block.ffn_norm = lend(block, _torch_rms_norm(reference.ffn_norm))
    return block


def _forward(name, block, *args):
    """``block(*args)`` with the course's RoPE lent as the ``apply_rotary`` its code calls (the notebook's own
    function, by name): the block is graded on its own, whatever the learner's apply_rotary does."""
    rotary = lend(block, ref.apply_rotary)
    return call(name, lambda *given: run_in_kernel(in_kernel.with_global, block, "apply_rotary", rotary, *given), *args)


def _call_block(name, block, x, positions, cache):
    """The block's forward. An error only when given a cache is told apart by a call with an empty cache: one
    that runs points at the number of keys (a mask for T keys), one that fails at how the cache is appended."""
    if cache is None:
        return _forward(name, block, x, positions)
    try:
        return _forward(name, block, x, positions, cache)
    except CheckFailed as error:
        if error.raised is None:
            raise
        empty = tuple(t[:, :, :0] for t in cache)
        try:
            _forward(name, block, x, torch.arange(x.size(1), device=positions.device), empty)
            problem, hint = ONLY_WITH_A_CACHE
        except AssertionError:
            problem, hint = f"It fails whenever it is given a cache, even an empty one: {CACHE_AXIS[0]}?", CACHE_AXIS[1]
        restate(error, problem, hint)


# ------------------------------------------------------------------------------- GPT


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
MODEL_HINT = ("the notebook names the submodules embed (nn.Embedding(vocab, d_model)), blocks (nn.ModuleList of "
              "DecoderBlock(d_model, n_heads, d_ff, eps, n_kv_heads)), norm (RMSNorm(d_model, eps)) and head "
              "(nn.Linear(d_model, vocab, bias=False)).")
STAND_IN_NOTE = (" (this comparison runs your GPT with simple stand-in blocks and PyTorch's nn.RMSNorm in place of "
                 "your DecoderBlocks and final RMSNorm, so the difference comes from GPT itself)")


def _gpt(*changes: tuple[str, str]):
    """The reference GPT's forward with ``changes`` made to its source (``edited``), called (model, idx,
    cache): the logits of a mistake."""
    forward = edited(ref.GPT.forward, *changes)
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


def _torch_rms_norm(norm: ref.RMSNorm) -> nn.RMSNorm:
    """PyTorch's RMSNorm with ``norm``'s weight and eps: a stand-in whose class the kernel can import."""
    stand_in = nn.RMSNorm(norm.weight.shape[0], eps=norm.eps, dtype=norm.weight.dtype)
    stand_in.load_state_dict(norm.state_dict())
    return stand_in


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


# ------------------------------------------------------------------------------- lm_loss


@dataclass(frozen=True)
class LossCase:
    batch: int
    length: int
    vocab: int
    d_model: int


VISIBLE_LOSS = [LossCase(3, 6, 11, 8), LossCase(2, 9, 7, 12)]
HIDDEN_LOSS = [LossCase(4, 5, 13, 8), LossCase(1, 8, 9, 16), LossCase(5, 3, 6, 8)]


def _lm_inputs(name: str, i: int, case, hidden: bool, d_model: int, sharpen: float = 1.0):
    """Case ``i`` of ``name``: a float64 stand-in language model with random weights (its weights are what
    crosses to the kernel; its head's multiplied by ``sharpen``) and token ids idx (B, T), on the CPU."""
    seed = functools.partial(seed_for, name, hidden, i)
    model = randomise(stand_in_models.StandInLM(case.vocab, d_model).double(), SeededRandom(seed("weights")))
    with torch.no_grad():
        model.head.weight *= sharpen
    idx = torch.randint(case.vocab, (case.batch, case.length), generator=SeededRandom(seed()).generator)
    return stand_in_models.stand_in_lm(model.state_dict()), idx


def _loss_inputs(i: int, case: LossCase, hidden: bool) -> tuple[nn.Module, torch.Tensor]:
    """Case ``i``'s stand-in model and token ids idx (B, T), on the CPU."""
    return _lm_inputs("lm_loss", i, case, hidden, case.d_model)


# A mistake: the reference's lm_loss with (old, new) changes made to its source (``edited``).
_loss = functools.partial(edited, ref.lm_loss)
INPUTS, LABELS = "model(idx[:, :-1])", "idx[:, 1:].flatten())"
LOSS_MISTAKES = [
    Mistake("loss not shifted: the model reads idx and is scored on idx itself, so it only has to copy what it sees",
            "the model reads idx[:, :-1] and is scored on the next tokens, idx[:, 1:].",
            _loss((INPUTS, "model(idx)"), (LABELS, "idx.flatten())"))),
    Mistake("loss not shifted: the labels are idx[:, :-1], the very tokens the model reads",
            "the labels are the next tokens: idx[:, 1:].",
            _loss((LABELS, "idx[:, :-1].flatten())"))),
    Mistake("the shift goes the wrong way: the model reads idx[:, 1:] and is scored on idx[:, :-1]",
            "inputs idx[:, :-1], labels idx[:, 1:].",
            _loss((INPUTS, "model(idx[:, 1:])"), (LABELS, "idx[:, :-1].flatten())"))),
    Mistake("the logits went through a softmax before F.cross_entropy, which takes raw logits and applies its own "
            "log-softmax: the loss is that of the probabilities read as logits",
            "pass the logits themselves: F.cross_entropy(logits.flatten(0, 1), labels.flatten()).",
            _loss(("logits.flatten(0, 1)", "logits.softmax(dim=-1).flatten(0, 1)"))),
    Mistake("F.nll_loss was given the raw logits: it expects log-probabilities, so the loss is minus the mean logit "
            "of the right token",
            "F.cross_entropy on the logits, or F.nll_loss on logits.log_softmax(dim=-1).",
            _loss(("F.cross_entropy(", "F.nll_loss("))),
    Mistake("the loss is summed over the predictions, not averaged: it then grows with B and T, and so does the "
            "learning rate it needs",
            "the mean over every prediction: F.cross_entropy's default reduction, 'mean'.",
            _loss((LABELS, "idx[:, 1:].flatten(), reduction='sum')"))),
    Mistake("only the last position is scored: every position predicts the token after it, and each prediction counts",
            "score all T - 1 predictions: logits (B, T - 1, V) against labels idx[:, 1:] (B, T - 1).",
            _loss(("logits.flatten(0, 1), idx[:, 1:].flatten()", "logits[:, -1], idx[:, -1]"))),
]


def check_lm_loss(lm_loss, hidden: bool = False) -> None:
    """Check a learner's ``lm_loss(model, idx) -> scalar`` on a stand-in model."""
    name = "lm_loss"
    cases = HIDDEN_LOSS if hidden else VISIBLE_LOSS

    def check_case(i: int, case: LossCase, device, dtype) -> None:
        reference, idx64 = _loss_inputs(i, case, hidden)
        with torch.no_grad():
            expected = ref.lm_loss(reference, idx64)
        model = lend(lm_loss, copy.deepcopy(reference).to(device=device, dtype=dtype))
        loss = call(name, lm_loss, model, idx64.to(device))
        loss = expect_loss(name, loss, dtype, device)
        if not close(loss, expected):
            name_the_mistake(name, "the loss", loss, expected, candidates(LOSS_MISTAKES, reference, idx64))

    with strict_numerics(), one_thread():
        run_cases(name, cases, check_case)


# ------------------------------------------------------------------------------- generate


@dataclass(frozen=True)
class SampleCase:
    batch: int
    length: int
    new: int
    vocab: int
    options: tuple  # generate's keyword arguments, as (name, value) pairs
    seed: int  # of the generator generate is given (the model and the prompt come from the seed rule)


VISIBLE_SAMPLE = [
    SampleCase(3, 4, 6, 11, (("temperature", 0.0),), seed=1),
    SampleCase(4, 3, 8, 13, (("temperature", 0.7),), seed=2),
    SampleCase(3, 5, 6, 12, (("top_k", 4),), seed=3),
    SampleCase(2, 2, 7, 10, (("temperature", 1.3), ("top_k", 3), ("top_p", 0.6)), seed=4),
    SampleCase(3, 3, 5, 11, (("temperature", 0.8), ("use_cache", False)), seed=5),
]
HIDDEN_SAMPLE = [
    SampleCase(2, 6, 5, 9, (("temperature", 0.0), ("use_cache", False)), seed=11),
    SampleCase(5, 2, 7, 12, (("temperature", 1.6),), seed=12),
    SampleCase(3, 4, 6, 14, (("top_k", 3), ("temperature", 0.6)), seed=13),
    SampleCase(4, 3, 6, 10, (("top_p", 0.7),), seed=14),
    # seed 16: with 15, top-k after softmax and top-p before top-k happened to draw the reference's tokens here
    SampleCase(2, 5, 8, 13, (("temperature", 0.9), ("top_k", 6), ("top_p", 0.7)), seed=16),
]
CACHE_HINT = "call the model on the whole prompt once, then on the newest token alone with the cache it returned."
DRAW_HINT = ("draw each token as torch.multinomial(probs, 1, generator=generator), from the probabilities after "
             "temperature, top-k and top-p, in that order.")


# A mistake: the reference's generate with (old, new) changes made to its source (``edited``).
_sample = functools.partial(edited, ref.generate)
KTH = "probs.topk(min(top_k, probs.size(-1)), dim=-1)"  # the k largest probabilities, and where they are
DRAW = "[out, torch.multinomial(probs, 1, generator=generator)]"  # the draw (the docstring names it too)
IN_VOCABULARY_ORDER = ("draw over the probabilities in vocabulary order: torch.multinomial(probs, 1, "
                       "generator=generator), probs (B, vocab) with zeros where top-k and top-p cut.")
OTHER_DRAW = ("it draws from the right distribution, but the same random numbers then pick other tokens: the "
              "exercise fixes the draw so that a seeded generator gives the reference's tokens")
UNNORMALISED = [  # mistakes whose probabilities do not add up to 1 (the draw does not show it)
    Mistake("softmax over the wrong axis in sampling: the probabilities are normalised over the batch, not over "
            "the vocabulary",
            "probs = logits.softmax(dim=-1) on the (B, vocab) logits of the last position.",
            _sample(("logits.softmax(dim=-1)", "logits.softmax(dim=0)"))),
    Mistake("top-k applied after softmax without renormalising: the k kept probabilities no longer add up to 1",
            "keep the k largest logits (the others -inf) before the softmax, which then normalises over them.",
            _sample(('logits = logits.masked_fill(logits < kth, float("-inf"))', "kth = kth"),
                    ("probs = logits.softmax(dim=-1)", f"probs = logits.softmax(dim=-1)\n        probs = probs if "
                     f"top_k is None else probs.masked_fill(probs < {KTH}.values[:, -1:], 0.0)"))),
    Mistake("temperature applied after softmax: dividing probabilities by T changes nothing once they are "
            "renormalised; it must divide the logits",
            "logits = logits / temperature, then the softmax.",
            _sample(("logits = logits / temperature", "logits = logits"),
                    ("probs = logits.softmax(dim=-1)", "probs = logits.softmax(dim=-1) / temperature"))),
]
NORMALISED = [
    Mistake("top-k keeps k - 1 tokens: `logits <= kth` hides the k-th largest logit too",
            "hide only the logits below the k-th largest: logits.masked_fill(logits < kth, float('-inf')).",
            _sample(("logits < kth", "logits <= kth"))),
    Mistake("top-p drops the token that crosses top_p: a token is kept while the tokens more likely than it add "
            "up to less than top_p, so the one that takes the sum past top_p stays",
            "keep where sorted.cumsum(-1) - sorted < top_p (the mass before each token), not "
            "sorted.cumsum(-1) < top_p.",
            _sample(("sorted_probs.cumsum(dim=-1) - sorted_probs", "sorted_probs.cumsum(dim=-1)"),
                    ("likelier < top_p)", "(likelier < top_p) | (torch.arange(probs.size(-1)) == 0))"))),
    Mistake("top-p applied before top-k: the notebook's order is temperature, top-k on the logits, softmax, then "
            "top-p",
            "divide by the temperature, keep the top k logits, softmax, and only then cut by top_p and renormalise.",
            _sample(("if top_k is not None:", "if False:"),
                    (f"out = torch.cat({DRAW}", f"if top_k is not None:\n            probs = probs.masked_fill("
                     f"probs < {KTH}.values[:, -1:], 0.0)\n            probs = probs / probs.sum(dim=-1, keepdim=True)"
                     f"\n        out = torch.cat({DRAW}"))),
    Mistake("the logits of the first position are used: only the last position predicts the next token",
            "logits = logits[:, -1] (B, vocab), the last position of (B, T, vocab).",
            _sample(("logits = logits[:, -1]", "logits = logits[:, 0]"))),
    Mistake(f"the token is drawn over the probabilities sorted in descending order (as Meta's LLaMA sample_top_p "
            f"does), then mapped back: {OTHER_DRAW}",
            IN_VOCABULARY_ORDER,
            _sample((DRAW, "[out, probs.sort(dim=-1, descending=True).indices.gather(-1, torch.multinomial("
                           "probs.sort(dim=-1, descending=True).values, 1, generator=generator))]"))),
    Mistake(f"the token is drawn over the top k probabilities alone (as nanochat does), then mapped back: {OTHER_DRAW}",
            IN_VOCABULARY_ORDER,
            _sample((DRAW, f"[out, {KTH}.indices.gather(-1, torch.multinomial({KTH}.values, 1, "
                           "generator=generator))]"))),

]
SAMPLE_MISTAKES = UNNORMALISED + NORMALISED


def _options(case: SampleCase) -> dict:
    return dict(case.options)


def _sample_inputs(i: int, case: SampleCase, hidden: bool) -> tuple[nn.Module, torch.Tensor]:
    """Case ``i``'s stand-in model (sharpened, so that its draws are not uniform) and prompt idx (B, T), on the CPU."""
    return _lm_inputs("generate", i, case, hidden, d_model=8, sharpen=2.0)


def _reference_tokens(reference, idx64, case: SampleCase, device, options: dict) -> torch.Tensor:
    """The tokens the reference draws on ``device`` with ``options`` and the case's seeded generator, on the CPU."""
    return ref.generate(copy.deepcopy(reference).to(device), idx64.to(device), case.new,
                        generator=stand_in_models.seeded_generator(str(device), case.seed), **options).cpu()


def check_generate(generate, hidden: bool = False) -> None:
    """Check a learner's ``generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
    use_cache=True, generator=None)`` on a stand-in model: the same tokens as the reference for the same
    seeded generator, probabilities that add up to 1, and the cache used when asked for."""
    name = "generate"

    def check_case(i: int, case: SampleCase, device, dtype) -> None:
        reference, idx64 = _sample_inputs(i, case, hidden)
        options = _options(case)
        use_cache = options.get("use_cache", True)
        shown = ", ".join(f"{k}={v}" for k, v in options.items())
        expected = _reference_tokens(reference, idx64, case, device, options)
        model = lend(generate, copy.deepcopy(reference).to(device))
        idx = idx64.to(device)
        generator = make_in_kernel(generate, stand_in_models.seeded_generator, str(device), case.seed)
        before = {"idx": (idx, idx.clone())}
        run = _sampled(name, generate, (model, idx, case.new), generator, options)
        expect_unchanged(name, before)
        tokens = run.get("tokens") if isinstance(run, dict) else None
        _expect_tokens(name, tokens, idx64, case, device)
        tokens = tokens.cpu()
        # Whether the cache was used shows in the stand-in's record of the tokens each call was given, and in the
        # tokens (the stand-in answers a call given its cache with its recall added). Both are the grader's: the
        # stand-in is lent (``lend``), and every call the learner's code makes on it runs here.
        fed = list(model.fed)
        if use_cache and (fed[:1] != [case.length] or any(n != 1 for n in fed[1:])):
            fail(name, f"use_cache=True but the model was given {fed} tokens at its {len(fed)} calls: the cache is "
                 "not used", CACHE_HINT)
        if not use_cache and fed != list(range(case.length, case.length + case.new)):
            fail(name, f"use_cache=False but the model was given {fed} tokens at its {len(fed)} calls: without the "
                 f"cache the whole sequence so far is run at every step ({case.length}, {case.length + 1}, ... "
                 "tokens)",
                 "with use_cache=False, call model(out) on every token so far, with no cache, at each step.")

        if run.get("unseeded"):
            kernel_reported(name, generate, f"torch.multinomial was called {run['unseeded']} times without the "
                            f"generator (with {shown}): its draws come from the global random state, and cannot be "
                            "reproduced",
                            "pass the generator you are given: torch.multinomial(probs, 1, generator=generator).")
        probs = [p for p in run.get("probs", []) if isinstance(p, torch.Tensor)]
        unnormalised = next((p for p in probs if not _add_up([p])), None)
        if unnormalised is not None:
            _name_sampling_mistake(name, reference, idx64, case, tokens, normalised=False)
            kernel_reported(name, generate, f"the probabilities drawn from do not add up to 1 (row sums "
                            f"{unnormalised.sum(dim=-1).to(torch.float64).tolist()[:3]}) with {shown}",
                            "after top-k and top-p, the kept probabilities must be renormalised.")
        if not torch.equal(tokens, expected):
            uncached = options | {"use_cache": False}
            if use_cache and torch.equal(tokens, _reference_tokens(reference, idx64, case, device, uncached)):
                fail(name, f"use_cache=True but the tokens with {shown} are the ones drawn without the cache (the "
                     "model answers a call given its cache a little differently)", CACHE_HINT)
            _explain_other_tokens(name, reference, idx64, case, tokens, expected, probs, shown)

    with strict_numerics(), one_thread():
        run_cases(name, HIDDEN_SAMPLE if hidden else VISIBLE_SAMPLE, check_case, dtypes=(torch.float64,))


def _sampled(name, generate, args, generator, options) -> dict:
    """The learner's generate, run with the draws recorded; temperature 0 that divides by it is named."""
    try:
        return learner_step(name, lambda: run_in_kernel(in_kernel.sampled, generate, *args, generator=generator, **options),
                            args)
    except CheckFailed as error:
        # What the learner's code raised is PyTorch's or Python's words (multinomial's "inf, nan or element < 0",
        # "division by zero"): those are read, never the check's own.
        if options.get("temperature", 1.0) == 0 and any(w in (error.exception or "") for w in ("inf", "nan", "zero")):
            restate(error, "temperature=0 was used as a divisor: the logits became ±inf, and the probabilities NaN",
                    "temperature 0 means greedy decoding: take logits.argmax(dim=-1, keepdim=True), with no division "
                    "and no draw.")
        raise


def _explain_other_tokens(name, reference, idx64, case: SampleCase, tokens, expected, probs, shown: str) -> None:
    """Fail on tokens other than the reference's, with the mistake that draws them if one is known (``shown``:
    the case's options, as the messages show them)."""
    _name_sampling_mistake(name, reference, idx64, case, tokens, normalised=_add_up(probs) if probs else None)
    sampling = _options(case).get("temperature", 1.0) != 0
    if sampling and not probs:
        fail(name, f"no token was drawn with torch.multinomial with {shown}", DRAW_HINT)
    b = int((tokens != expected).any(dim=1).nonzero()[0])
    fail(name, f"with {shown} and the same seeded generator, sequence {b} is {tokens[b].tolist()}; the reference "
         f"draws {expected[b].tolist()}",
         DRAW_HINT if sampling else "temperature=0 is greedy: the argmax of the last logits.")


def _expect_tokens(name, tokens, idx64, case: SampleCase, device) -> None:
    if type(tokens) is not torch.Tensor:
        fail(name, f"should return a torch.Tensor, got {type_name(tokens)}")
    if tokens.dtype != torch.long or tokens.device.type != device.type:
        fail(name, f"returns {tokens.dtype} on {tokens.device}; token ids are torch.long on idx's device")
    if tuple(tokens.shape) != (case.batch, case.length + case.new):
        fail(name, f"returns shape {tuple(tokens.shape)}; expected (B, T + max_new_tokens) = "
             f"{(case.batch, case.length + case.new)}", "return the prompt followed by the new tokens.")
    if not torch.equal(tokens[:, : case.length].cpu(), idx64):
        fail(name, "the output does not start with the prompt idx", "return torch.cat([idx, new_tokens], dim=1).")


def _add_up(probs: list[torch.Tensor]) -> bool:
    """Whether each (B, vocab) row of probabilities adds up to 1."""
    sums = [p.sum(dim=-1).to(torch.float64) for p in probs if p.dim() == 2]
    return all(torch.allclose(s, torch.ones_like(s), atol=1e-9) for s in sums)


def _name_sampling_mistake(name, reference, idx64, case: SampleCase, tokens, normalised: bool | None) -> None:
    """Fail with the mistake that draws ``tokens``, if one does. Two leave probabilities that do not add up to 1
    (which the draw hides): only they are tried when the probabilities drawn from were seen not to add up, and
    never when they were seen to, so that another mistake that draws the same tokens on a case keeps its name."""
    drawing = lambda mistake: replace(mistake, compute=lambda model, idx: mistake.compute(
        model, idx, case.new, generator=stand_in_models.seeded_generator("cpu", case.seed), **_options(case)))
    mistakes = {None: SAMPLE_MISTAKES, False: UNNORMALISED, True: NORMALISED}[normalised]
    mistake = matching_mistake(tokens, candidates(map(drawing, mistakes), reference, idx64), exact=True)
    if mistake is not None:
        fail(name, mistake.problem, mistake.hint)


# ------------------------------------------------------------------------------- load_hf_llama, load_meta_llama


@dataclass(frozen=True)
class LoadCase:
    vocab: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    n_layers: int
    d_ff: int
    tied: bool  # the checkpoint holds no head (lm_head.weight, output.weight): the head is the embedding
    stored: torch.dtype | None = None  # the checkpoint's dtype (bfloat16, as published ones are), None: the model's


# d_k of 6 and more (with 4, Meta's reordering is its own inverse); one head and several; grouped-query heads, where
# d_k / (n_heads / n_kv_heads) is even (so that wk reordered in groups of that size is a mistake of its own).
VISIBLE_LOAD = [LoadCase(11, 16, 2, 2, 2, 24, tied=False), LoadCase(9, 32, 4, 2, 1, 40, tied=True)]
HIDDEN_LOAD = [LoadCase(13, 32, 4, 1, 2, 48, tied=False, stored=torch.bfloat16), LoadCase(10, 24, 4, 4, 3, 36, tied=True),
               LoadCase(7, 16, 1, 1, 2, 20, tied=False), LoadCase(12, 48, 4, 2, 1, 64, tied=True, stored=torch.bfloat16)]
LOADED_IDX = (2, 7)  # the tokens whose logits judge a load
HF_NAMES = {"embed": "model.embed_tokens", "norm": "model.norm", "head": "lm_head", "attn_norm": "input_layernorm",
            "ffn_norm": "post_attention_layernorm", "w_q": "self_attn.q_proj", "w_k": "self_attn.k_proj",
            "w_v": "self_attn.v_proj", "w_o": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj",
            "w_down": "mlp.down_proj", "blocks": "model.layers"}
META_NAMES = {"embed": "tok_embeddings", "norm": "norm", "head": "output", "attn_norm": "attention_norm",
              "ffn_norm": "ffn_norm", "w_q": "attention.wq", "w_k": "attention.wk", "w_v": "attention.wv",
              "w_o": "attention.wo", "w_gate": "feed_forward.w1", "w_up": "feed_forward.w3",
              "w_down": "feed_forward.w2", "blocks": "layers"}
LINEAR_LAYOUT = "nn.Linear stores its weight as (out_features, in_features), and so does the checkpoint"
TRANSPOSED = (f"the weights are transposed (w.T): {LINEAR_LAYOUT}",
              "copy each weight as it is, with no .T (GPT-2's checkpoints, whose Conv1D layers store (in, out), are "
              "the ones that need it).")
HEAD_NOT_TIED = ("the head is not tied to the embedding when the checkpoint has none: a model with "
                 "tie_word_embeddings saves no head of its own, its head is the embedding",
                 "when the checkpoint has no head, copy the embedding into model.head.weight (or tie the two).")
HEAD_FROM_THE_EMBEDDING = ("the head is taken from the embedding although the checkpoint has one of its own: only a "
                           "tied checkpoint, which has no head, uses the embedding as its head",
                           "copy the checkpoint's head when it has one, and the embedding only when it has none.")
KV_HEADS = ("w_k and w_v have n_kv_heads heads of d_k rows, fewer than w_q's n_heads when the model groups its query "
            "heads; a head count taken from the queries does not fit the keys",
            "take each weight's head count from its own rows, w.size(0) // d_k (d_k = block.d_k): reorder wq and wk "
            "head by head, each with the same d_k.")

LOAD_INTO = ("copy into the parameters the model has, under torch.no_grad(): model.embed.weight.copy_(w), or "
             "model.load_state_dict(...) with your names; either keeps the model's dtype and device.")
LOAD_HINT = "return the model you were given, loaded in place: return model."


def _gpt_key(layout: dict, key: str) -> str:
    """A GPT parameter's name (``blocks.0.w_q.weight``) in a checkpoint's layout (``model.layers.0.self_attn...``)."""
    parts = key.split(".")
    if parts[0] == "blocks":
        return f"{layout['blocks']}.{parts[1]}.{layout[parts[2]]}.weight"
    return f"{layout[parts[0]]}.weight"


def _reference_gpt(case: LoadCase) -> ref.GPT:
    return ref.GPT(case.vocab, case.d_model, case.n_heads, case.n_layers, case.d_ff, n_kv_heads=case.n_kv_heads).double()


def _load_state(case: LoadCase, seed: int) -> dict:
    """Random weights in a GPT's names, float64 on the CPU (the norms' around 1, so a misplaced one shows)."""
    return randomise(_reference_gpt(case), SeededRandom(seed)).state_dict()


def _load_inputs(name: str, layout: dict, i: int, case: LoadCase, hidden: bool, dtype: torch.dtype = torch.float64):
    """Case ``i`` of the loader ``name``: the weights the model holds before loading (float64), the checkpoint
    (random weights under ``layout``'s names, in ``dtype`` or the case's ``stored`` one, without a head when the
    case is tied) and the token ids whose logits judge the load, on the CPU."""
    seed = functools.partial(seed_for, name, hidden, i)
    checkpoint = {_gpt_key(layout, key): value.to(case.stored or dtype)
                  for key, value in _load_state(case, seed("checkpoint")).items()
                  if not (case.tied and key == "head.weight")}
    idx = torch.randint(case.vocab, LOADED_IDX, generator=SeededRandom(seed()).generator)
    return _load_state(case, seed("model")), checkpoint, idx


def _loaded_gpt(loader, before: dict, checkpoint: dict, case: LoadCase) -> ref.GPT:
    """A float64 reference GPT that held ``before`` and was then loaded by ``loader`` (the reference's, or a
    mistake's)."""
    model = _reference_gpt(case)
    model.load_state_dict(before)
    loader(model, checkpoint)
    return model


def _loading(loader):
    """What ``loader`` makes of a checkpoint: the logits, for the token ids ``idx``, of ``_loaded_gpt``."""

    def logits(before: dict, checkpoint: dict, idx: torch.Tensor, case: LoadCase) -> torch.Tensor:
        model = _loaded_gpt(loader, before, checkpoint, case)
        with torch.no_grad():
            return model(idx)[0]

    return logits


def _square_transposed(w: torch.Tensor) -> torch.Tensor:
    """w.T where that keeps w's shape (a (d_model, d_model) projection); elsewhere .copy_(w.T) raises."""
    return w.T if w.dim() == 2 and w.size(0) == w.size(1) else w


def _both_loaders_mistakes(loader, transposed: tuple[str, str], head: str) -> list[Mistake]:
    """The mistakes either loader can make: its weights transposed (``transposed``: the line that copies a block's
    weight, and that line transposing it), and the head left as it was or taken from the embedding (``head``: the
    line that copies the head, which falls back on the embedding)."""
    return [
        Mistake(*TRANSPOSED, _loading(edited(loader, transposed, transposed=_square_transposed))),
        Mistake(HEAD_NOT_TIED[0] + ", and yours kept the weights it had", HEAD_NOT_TIED[1],
                _loading(edited(loader, (head, head.replace(", embedding", ", model.head.weight"))))),
        Mistake(*HEAD_FROM_THE_EMBEDDING, _loading(edited(loader, (head, "model.head.weight.copy_(embedding)")))),
    ]


HF_COPY = 'getattr(block, ours).weight.copy_(state_dict[f"model.layers.{i}.{theirs}.weight"])'
HF_MISTAKES = [
    *_both_loaders_mistakes(ref.load_hf_llama, (HF_COPY, HF_COPY.replace("copy_(", "copy_(transposed(") + ")"),
                            'model.head.weight.copy_(state_dict.get("lm_head.weight", embedding))'),
    Mistake("Hugging Face's q_proj and k_proj were reordered as Meta's are: Hugging Face's converter has already "
            "reordered them to the half-split pairs its rotate_half (and the course's RoPE) rotates, so they copy as "
            "they are",
            "copy every weight of a Hugging Face checkpoint as it is; only Meta's layout needs the reordering.",
            _loading(edited(ref.load_hf_llama, (
                HF_COPY, 'w = state_dict[f"model.layers.{i}.{theirs}.weight"]\n'
                         '            getattr(block, ours).weight.copy_(interleaved_to_half_split(w, block.d_k) '
                         'if ours in ("w_q", "w_k") else w)')))),
    Mistake("the two norms are swapped: input_layernorm normalises the attention's input (attn_norm), and "
            "post_attention_layernorm, which comes after the attention sublayer, the FFN's input (ffn_norm); both "
            "are Pre-Norms",
            "attn_norm <- input_layernorm, ffn_norm <- post_attention_layernorm.",
            _loading(edited(ref.load_hf_llama,
                            ('"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"',
                             '"attn_norm": "post_attention_layernorm", "ffn_norm": "input_layernorm"')))),

]


# The reference's interleaved_to_half_split with (old, new) changes made to its source (``edited``).
_reordered = functools.partial(edited, ref.interleaved_to_half_split)
META_ROTATED = 'if ours in ("w_q", "w_k"):'
PAIRS = ("Meta's code rotates neighbouring features (2i, 2i + 1) of each head, the course's RoPE (i, i + d_k/2): "
         "within each head, row 2i of wq and wk must move to i, and row 2i + 1 to i + d_k/2")
META_MISTAKES = [
    Mistake(f"wq and wk are copied without reordering their rows: {PAIRS}",
            "reorder the rows of wq and wk with interleaved_to_half_split(w, block.d_k) before copying them.",
            _loading(edited(ref.load_meta_llama, (META_ROTATED, "if False:")))),
    Mistake("the rows of wv are reordered too: only what RoPE rotates, the queries and the keys, must be; the values "
            "are never rotated, and their features must stay where wo reads them",
            "reorder wq and wk only; copy wv and wo as they are.",
            _loading(edited(ref.load_meta_llama, (META_ROTATED, 'if ours in ("w_q", "w_k", "w_v"):')))),
    Mistake("the rows of wv and wo are reordered too: only what RoPE rotates, the queries and the keys, must be; wo's "
            "rows are the model's own features, and wv's are what wo reads",
            "reorder wq and wk only; copy wv and wo as they are.",
            _loading(edited(ref.load_meta_llama, (META_ROTATED, 'if ours in ("w_q", "w_k", "w_v", "w_o"):')))),
    Mistake("only wq's rows are reordered: the keys are rotated too, and must be reordered the same way, or the scores "
            "pair a query's features with other features of the key",
            "reorder wk's rows as well (it has n_kv_heads heads of d_k rows).",
            _loading(edited(ref.load_meta_llama, (META_ROTATED, 'if ours in ("w_q",):')))),
    Mistake("the rows are reordered the wrong way round, from half-split to interleaved: row i must receive row 2i "
            "(and row i + d_k/2 row 2i + 1), not row 2i receive row i",
            "in each head, take the even rows first, then the odd ones: w[rows] with rows = [0, 2, 4, ..., 1, 3, 5, "
            "...] (head by head).",
            _loading(edited(ref.load_meta_llama, interleaved_to_half_split=_reordered(
                ("order = torch.cat([torch.arange(0, d_k, 2), torch.arange(1, d_k, 2)])",
                 "order = torch.stack([torch.arange(d_k // 2), torch.arange(d_k // 2, d_k)], dim=1).flatten()"))))),
    Mistake("the rows are reordered across all the heads at once: the even rows of the whole matrix, then the odd "
            "ones; each head's d_k rows must be reordered on their own",
            "reorder within each head: rows head·d_k + [0, 2, ..., d_k - 2, 1, 3, ..., d_k - 1] for every head.",
            _loading(edited(ref.load_meta_llama, ("interleaved_to_half_split(w, block.d_k)",
                                                  "interleaved_to_half_split(w, w.size(0))")))),
    Mistake(f"wk's rows are reordered as if it had as many heads as wq: {KV_HEADS[0]}",
            KV_HEADS[1],
            _loading(edited(ref.load_meta_llama, ("interleaved_to_half_split(w, block.d_k)",
                                                  "interleaved_to_half_split(w, w.size(0) // block.n_heads)")))),
    Mistake("the FFN's w1 and w3 are swapped: in Meta's code w1 is the gate (silu(w1(x)) * w3(x)), w3 the up "
            "projection and w2 the down projection",
            "w_gate <- feed_forward.w1, w_up <- feed_forward.w3, w_down <- feed_forward.w2.",
            _loading(edited(ref.load_meta_llama, ('"w_gate": "feed_forward.w1", "w_up": "feed_forward.w3"',
                                                  '"w_gate": "feed_forward.w3", "w_up": "feed_forward.w1"')))),
    *_both_loaders_mistakes(ref.load_meta_llama, ("weight.copy_(w)", "weight.copy_(transposed(w))"),
                            'model.head.weight.copy_(checkpoint.get("output.weight", embedding))'),
]


def check_load_hf_llama(load_hf_llama, hidden: bool = False) -> None:
    """Check a learner's ``load_hf_llama(model, state_dict)``: a Hugging Face LlamaForCausalLM state dict (random
    weights, tied and untied heads, grouped-query heads) loaded into a stand-in with a GPT's parameters, judged
    by the logits of a reference GPT holding what it loaded."""
    _check_loader("load_hf_llama", load_hf_llama, HF_NAMES, ref.load_hf_llama, HF_MISTAKES, hidden)


def check_load_meta_llama(load_meta_llama, hidden: bool = False) -> None:
    """Check a learner's ``load_meta_llama(model, checkpoint)``: a checkpoint in Meta's layout, whose wq and wk
    pair RoPE's features as neighbours, loaded as ``check_load_hf_llama`` loads Hugging Face's."""
    _check_loader("load_meta_llama", load_meta_llama, META_NAMES, ref.load_meta_llama, META_MISTAKES, hidden)


def _check_loader(name, loader, layout: dict, reference, mistakes: list, hidden: bool) -> None:
    """The learner's ``loader`` is given a ``stand_in_models.LoadTarget`` (a GPT's parameters, random, and each block's
    head counts; not the learner's GPT, so a mistake there costs only its own exercise) and a checkpoint, both
    made where the learner's code runs. The weights it then holds are read back and judged here, by the logits
    of a reference GPT holding them, against those of the reference loader."""
    cases = HIDDEN_LOAD if hidden else VISIBLE_LOAD

    def check_case(i: int, case: LoadCase, device, dtype) -> None:
        before, checkpoint, idx = _load_inputs(name, layout, i, case, hidden, dtype)
        before = {k: v.to(dtype) for k, v in before.items()}  # what the model holds first
        target = make_in_kernel(loader, stand_in_models.load_target, {k: v.to(device) for k, v in before.items()}, case.n_heads)
        run = _call_loader(name, loader, target, {k: v.clone() for k, v in checkpoint.items()}, case, layout)
        if not isinstance(run, dict) or run.get("changed") is not False:  # the kernel's word: a note when graded
            kernel_reported(name, loader, "changed the checkpoint it was given (its tensors, or its keys): the "
                            "checkpoint is the caller's, and loading it twice must give the same model",
                            "make new tensors (w[rows], .clone()) instead of changing the checkpoint's in place, "
                            "and leave its keys as they are.")
        if not isinstance(run, dict) or run.get("model") is not True:
            kernel_reported(name, loader, f"returns {str(run.get('returned') if isinstance(run, dict) else None)[:40]}, "
                            "not the model it was given", LOAD_HINT)
        state = _loaded_state(name, run_in_kernel(in_kernel.state_of, target), before, device)
        before64 = {k: v.double() for k, v in before.items()}
        logits = _loading(lambda model, _: model.load_state_dict(state))(before64, checkpoint, idx, case)
        expected = _loading(reference)(before64, checkpoint, idx, case)
        if not close(logits, expected, precision=dtype):
            mistaken = list(candidates(mistakes, before64, checkpoint, idx, case))
            loaded = _loaded_gpt(reference, before64, checkpoint, case).state_dict()
            differing = [key for key, value in loaded.items() if not close(state[key], value)]
            if matching_mistake(logits, mistaken) is None:
                _name_a_parameter(name, state, loaded, before64, differing)
            where = f" (the first parameter that differs from the reference's: {differing[0]})" if differing else ""
            name_the_mistake(name, f"the logits of a GPT holding the weights your function loaded{where}", logits,
                             expected, mistaken)

    with strict_numerics(), one_thread():
        run_cases(name, cases, check_case)


def _call_loader(name, loader, target, checkpoint: dict, case: LoadCase, layout: dict) -> dict:
    """``loader(target, checkpoint)``, run where the learner's code runs (``in_kernel.loaded``); an error that a
    known mistake explains is named."""
    try:
        return learner_step(name, lambda: run_in_kernel(in_kernel.loaded, loader, target, checkpoint), (target, checkpoint))
    except CheckFailed as error:
        if error.raised is None:
            raise
        message = error.exception or ""  # what the learner's code raised: PyTorch's words, or Python's KeyError
        if case.tied and error.raised == "KeyError" and f"{layout['head']}.weight" in message:
            problem, hint = HEAD_NOT_TIED
        elif "must match the size of tensor" in message or "size mismatch for" in message:
            problem = f"A shape does not fit. If your code transposes weights (w.T), it should not: {LINEAR_LAYOUT}."
            hint = TRANSPOSED[1]
        elif case.n_kv_heads < case.n_heads and any(word in message for word in ("size", "shape")):
            problem = (f"This case groups its query heads (n_heads={case.n_heads}, n_kv_heads={case.n_kv_heads}): "
                       f"{KV_HEADS[0]}")
            hint = KV_HEADS[1]
        else:
            raise
        restate(error, problem, hint)


def _name_a_parameter(name, state: dict, expected: dict, before: dict, differing: list[str]) -> None:
    """Fail naming a parameter whose weights show what went wrong: left as it was, or transposed."""
    for key in differing:
        if close(state[key], before[key]) and not close(expected[key], before[key]):
            fail(name, f"{key} was not loaded: it still holds the weights the model had before", LOAD_INTO)
        if state[key].dim() == 2 and state[key].shape == expected[key].mT.shape and close(state[key], expected[key].mT):
            fail(name, f"{key} holds the transpose of the weight it should: {TRANSPOSED[0]}", TRANSPOSED[1])


def _loaded_state(name, state, before: dict, device) -> dict:
    """The weights the model holds after loading: every parameter it had, with its shape, dtype and device."""
    if not isinstance(state, dict):
        fail(name, "the model's weights could not be read back", LOAD_INTO)
    for key, old in before.items():
        got = state.get(key)
        if not isinstance(got, torch.Tensor):
            fail(name, f"the model no longer has the parameter {key}: load the weights into the modules it has, "
                 "without replacing or removing them", LOAD_INTO)
        if tuple(got.shape) != tuple(old.shape):
            problem, hint = (TRANSPOSED if tuple(got.shape) == tuple(old.shape)[::-1] else
                             ("the model's parameters must keep their shapes", LOAD_INTO))
            fail(name, f"parameter {key} now has shape {tuple(got.shape)}, expected {tuple(old.shape)}: {problem}", hint)
        if got.dtype != old.dtype or got.device.type != torch.device(device).type:
            fail(name, f"parameter {key} is now {got.dtype} on {got.device.type}, where the model was {old.dtype} on "
                 f"{torch.device(device).type}: the parameters were replaced by the checkpoint's tensors (or the "
                 "model converted) instead of being loaded", LOAD_INTO)
    return {key: state[key].detach().to("cpu", torch.float64) for key in before}
