"""Chapter 6's DecoderBlock, with its KV cache: its cases, its mistakes and its check.

Its catalogued mistakes: RoPE applied to v; RoPE on q only; RoPE before the heads are split; positions restarting
at 0 for cached tokens; the cache appended on the wrong axis; only the new tokens returned as the cache; a causal
mask that ignores the cached tokens; chapter 3's (T, T) mask, which fails only with cached tokens; no causal mask;
no 1/sqrt(d_k); Post-Norm; the FFN normalised by attn_norm; the FFN's gate and up projections swapped.

The check lends PyTorch's RMSNorm as the block's norms and the course's RoPE as the ``apply_rotary`` its code
calls.
"""

import copy
import functools
import math
from dataclasses import dataclass

import torch

from ...reference import decoder_only as ref
from ...remote.proxy import lend, make_in_kernel, run_in_kernel, type_name
from .. import in_kernel
from ..harness import (
    CheckFailed,
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
    name_the_mistake,
    one_thread,
    randomise,
    restate,
    run_cases,
    seed_for,
    strict_numerics,
)
from ..how import expect_device_agnostic
from .models import _built, _expect_built, _HeadOptions, _torch_rms_norm
from .rotary import HALF_SPLIT, INTERLEAVED


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
_block = functools.partial(edited, ref.DecoderBlock.forward, math=math)  # a mistake may scale by math.sqrt
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
