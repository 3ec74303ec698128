"""Checks for chapter 07_attention_at_scale: ``online_softmax`` and ``tiled_attention``.

Every call of the learner's function runs watched (``in_kernel.watched``, next to the learner's code): the
check learns the result, the largest tensor the call created and how many elements it created in all.
The verdicts are taken here, from those numbers:

- equality with the reference (itself proven against ``F.scaled_dot_product_attention``), judged here on
  inputs made here: the points of a graded run;
- the rules below read the watcher's record, which in a graded run is the sandboxed kernel's word and so
  a note, worth no points (``how.kernel_reported``): the memory the OS measures from outside is the whole
  submission's peak (``grading.cgroups``), which no score matrix of these sizes would move;
- the memory bound: no tensor with m·n or more elements (a full score matrix) while ``tiled_attention``
  runs, no tensor as large as the whole rows while ``online_softmax`` runs;
- the work bound: causal ``tiled_attention`` creates about half the elements of the same call without the
  mask, as skipping the tiles above the diagonal does;
- one pass: ``online_softmax`` is given its chunks as an iterator; it may take each chunk once, and never
  go back to an earlier chunk once it has used a later one.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..reference import attention_at_scale as ref
from ..remote.proxy import run_in_kernel, type_name
from .harness import (
    Mistake,
    SeededRandom,
    candidates,
    close,
    edited,
    expect_tensor,
    fail,
    learner_step,
    matching_mistake,
    name_the_mistake,
    run_cases,
    seed_for,
    strict_numerics,
)
from .how import ATTENTION_BUILT_INS, expect_device_agnostic, forbid_built_ins, kernel_reported
from .in_kernel import watched


def _watch(name: str, fn, args: tuple, kwargs: dict | None = None, read_once: bool = False) -> dict:
    """The learner's call, watched where it runs; a result that is not the probe's dict is a failure."""
    report = learner_step(name, lambda: run_in_kernel(watched, fn, args, kwargs or {}, read_once), args)
    if not (isinstance(report, dict) and {"result", "largest", "elements", "modified", "reads"} <= report.keys()):
        fail(name, "the grader could not watch your code run")
    return report


def _expect_unmodified(name: str, report: dict, arguments: tuple[str, ...]) -> None:
    if report["modified"]:
        fail(name, f"modified its input `{arguments[report['modified'][0]]}` in place",
             "use out-of-place operations (x = x - m, torch.maximum, masked_fill) instead of -=, "
             "masked_fill_ or slice assignment on an input.")


def _largest(report: dict) -> tuple[int, str]:
    """The elements of the largest tensor the call created, and a description of it for a message."""
    largest = report["largest"]
    if not isinstance(largest, dict):
        return 0, ""
    elements, shape = int(largest.get("elements", 0)), tuple(largest.get("shape", ()))
    return elements, f"a {largest.get('dtype')} tensor of shape {shape} ({largest.get('op')})"


# ------------------------------------------------------------------------------------ online_softmax


@dataclass(frozen=True)
class OnlineCase:
    batch: tuple[int, ...]
    sizes: tuple[int, ...]  # the chunks' lengths along the row
    offset: float = 0.0  # scores around a large offset: exp without the maximum overflows


VISIBLE_ONLINE = [OnlineCase((2, 3), (4, 5, 3)), OnlineCase((4,), (1, 6, 2, 7)), OnlineCase((3,), (5, 4), 800.0)]
HIDDEN_ONLINE = [
    OnlineCase((), (3, 3, 3, 3)),
    OnlineCase((2, 2), (9,)),
    OnlineCase((5,), (2, 1, 1, 6, 3, 2)),
    OnlineCase((3, 2), (7, 8), -900.0),
    OnlineCase((6,), (10, 1, 5)),
]


def _online_input(i: int, case: OnlineCase, hidden: bool) -> torch.Tensor:
    """Case ``i``'s (..., n) rows, float64 on the CPU, whose scores rise along the row, so that most rows find a
    new maximum in a later chunk."""
    rng = SeededRandom(seed_for("online_softmax", hidden, i))
    n = sum(case.sizes)
    return 2 * rng.randn(*case.batch, n) + torch.linspace(0, 2, n, dtype=torch.float64) + case.offset


def _online(*changes: tuple[str, str]):
    """The reference's online softmax with ``changes`` made to its source (``edited``): a mistake."""
    return edited(ref.online_softmax, *changes)


MAXIMUM_MISTAKES = [  # what they make of m, the first result
    Mistake(
        "m is the last chunk's maximum, not the running maximum of the row: each chunk's maximum replaced m "
        "instead of being compared with it, so a larger score in an earlier chunk is forgotten",
        "m_new = max(m, chunk max), elementwise (torch.maximum(m, x.amax(-1, keepdim=True))); rescale l by "
        "exp(m - m_new), then set m = m_new.",
        _online(("m_new = m_chunk if m is None else torch.maximum(m, m_chunk)", "m_new = m_chunk")),
    ),
    Mistake(
        "m is one maximum for all the rows: the chunk's maximum was taken over the whole tensor (x.max() or "
        "x.amax() without dim), not over each row",
        "each row has its own maximum: take it along the last axis only, x.amax(dim=-1, keepdim=True), "
        "shape (..., 1).",
        _online(("m_chunk = x.amax(dim=-1, keepdim=True)", "m_chunk = x.amax().expand(*x.shape[:-1], 1)")),
    ),
]

ONLINE_MISTAKES = [  # what they make of l, the second result
    Mistake(
        "the running sum was not rescaled when the maximum grew: the terms added before still count as "
        "exp(x - m_old) (the factor exp(m_old - m_new) is missing, or the maximum was overwritten before it "
        "was taken, which makes it exp(m_new - m_new) = 1)",
        "keep the old maximum until the sum is updated: m_new = max(m, chunk max); "
        "l = l * exp(m - m_new) + sum(exp(chunk - m_new)); then m = m_new.",
        _online(("l * torch.exp(m - m_new) + l_chunk", "l + l_chunk")),
    ),
    Mistake(
        "the running sum was rescaled the wrong way, by exp(m_new - m_old): it grows when the maximum grows",
        "the old terms shrink relative to a larger maximum: multiply l by exp(m_old - m_new), which is <= 1.",
        _online(("l * torch.exp(m - m_new)", "l * torch.exp(m_new - m)")),
    ),
    Mistake(
        "l is the sum of the last chunk only: each chunk's sum replaced the running sum instead of being "
        "added to it",
        "accumulate over the chunks: l = l * exp(m - m_new) + sum(exp(chunk - m_new)), starting from the "
        "first chunk's sum.",
        _online(("l = l_chunk if l is None else l * torch.exp(m - m_new) + l_chunk", "l = l_chunk")),
    ),
    Mistake(
        "each chunk's terms were taken against the chunk's own maximum, exp(x - chunk max), while the old sum "
        "was rescaled to m_new: the sum mixes two references",
        "every term of l is relative to the same maximum: add sum(exp(chunk - m_new)), with m_new = max(m, "
        "chunk max), not sum(exp(chunk - chunk max)).",
        _online(("l_chunk = torch.exp(x - m_new)", "l_chunk = torch.exp(x - m_chunk)")),
    ),
]


ONE_PASS = ("in one loop over the chunks, keep a running maximum m and a running sum l, rescaling l by "
            "exp(m_old - m_new) whenever the maximum grows.")


def check_online_softmax(online_softmax, hidden: bool = False) -> None:
    """Check a learner's ``online_softmax(chunks) -> (m, l)``: the row maximum and sum(exp(x - m)), one pass."""
    name = "online_softmax"
    cases = HIDDEN_ONLINE if hidden else VISIBLE_ONLINE

    def check_case(i: int, case: OnlineCase, device, dtype) -> None:
        x64 = _online_input(i, case, hidden)
        expected_m = x64.amax(-1, keepdim=True)
        expected_l = torch.exp(x64 - expected_m).sum(-1, keepdim=True)
        x = x64.to(dtype=dtype, device=device)
        chunks = [c.clone() for c in x.split(case.sizes, dim=-1)]
        report = _watch(name, online_softmax, (chunks,), read_once=True)
        _expect_unmodified(name, report, ("chunks",))
        elements, what = _largest(report)
        if elements >= x.numel() and x.dim() > 0 and len(case.sizes) > 1:
            kernel_reported(name, online_softmax, f"joined the chunks into whole rows: {what} is as large as all the "
                            "rows together",
                            "work on one chunk at a time: all you need to keep between chunks is m and l, one number "
                            "per row.")
        result = report["result"]
        if not (isinstance(result, tuple) and len(result) == 2):
            fail(name, f"should return a tuple (m, l), got {type_name(result)}")
        m, l = result
        expect_tensor(name, "m", m, expected_m.shape, like=x)
        expect_tensor(name, "l", l, expected_l.shape, like=x)
        if report["reads"] != 1:
            kernel_reported(name, online_softmax, f"reads the chunks {report['reads']} times; they come as a stream, "
                            "which an online softmax reads once", ONE_PASS)
        elif isinstance(report.get("went_back"), list) and len(report["went_back"]) == 2:
            earlier, later = report["went_back"]
            kernel_reported(name, online_softmax, f"went back to chunk {earlier} after chunk {later}: a second pass "
                            "over chunks it kept; they come as a stream, which an online softmax reads once, in order",
                            ONE_PASS)
        if not torch.isfinite(l).all():
            fail(name, f"l is inf or NaN for scores around {case.offset:+g}: exp overflows or underflows",
                 "subtract the running maximum before exp: sum(exp(chunk - m_new)).")
        chunks64 = [c.double().cpu() for c in chunks]
        if not close(m, expected_m):
            name_the_mistake(name, "m, the maximum of each row,", m, expected_m,
                             candidates(MAXIMUM_MISTAKES, chunks64, part=0))
        if not close(l, expected_l):
            name_the_mistake(name, "l, the sum of exp(x - m) over each row,", l, expected_l,
                             candidates(ONLINE_MISTAKES, chunks64, part=1))

    with strict_numerics():
        run_cases(name, cases, check_case)


# ----------------------------------------------------------------------------------- tiled_attention


@dataclass(frozen=True)
class TiledCase:
    batch: tuple[int, ...]
    m: int
    n: int
    d_k: int
    d_v: int
    block_q: int
    block_k: int
    causal: bool = False

    def watched_for_memory(self) -> bool:
        """Whether every tensor an honest tiled attention makes (inputs, output, a tile of scores) is smaller
        than m·n, so that the memory bound tells a full score matrix apart."""
        heads = math.prod(self.batch)
        sizes = (self.m * self.d_k, self.n * self.d_k, self.n * self.d_v, self.m * self.d_v,
                 min(self.block_q, self.m) * min(self.block_k, self.n))
        return self.n > 0 and heads * max(sizes) < self.m * self.n


# Lengths that the blocks do not divide, m != n both ways, and n = 0 (every query fully masked: zeros).
VISIBLE_TILED = [
    TiledCase((2,), 29, 37, 8, 6, 8, 16),
    TiledCase((2,), 29, 37, 8, 6, 8, 8, causal=True),
    TiledCase((2,), 41, 30, 8, 6, 16, 8, causal=True),
    TiledCase((2,), 5, 0, 4, 3, 2, 2, causal=True),
]
HIDDEN_TILED = [
    TiledCase((2, 3), 53, 47, 6, 7, 16, 8),
    TiledCase((), 23, 31, 8, 4, 5, 7, causal=True),
    TiledCase((3,), 40, 40, 8, 8, 16, 8, causal=True),
    TiledCase((2,), 31, 64, 8, 8, 8, 16, causal=True),
    TiledCase((2,), 9, 6, 4, 5, 64, 64),
    TiledCase((3,), 4, 0, 5, 2, 3, 1),
]


def _tiled_inputs(i: int, case: TiledCase, hidden: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Case ``i``'s q (..., m, d_k), k (..., n, d_k) and v (..., n, d_v), float64 on the CPU."""
    rng = SeededRandom(seed_for("tiled_attention", hidden, i))
    return (rng.randn(*case.batch, case.m, case.d_k), rng.randn(*case.batch, case.n, case.d_k),
            rng.randn(*case.batch, case.n, case.d_v))


def _tiled(*changes: tuple[str, str]):
    """The reference's tiled attention with ``changes`` made to its source (``edited``): a mistake."""
    return edited(ref.tiled_attention, *changes)


CAUSAL_END = "end = min(n, i + rows) if causal"
# FlashAttention >= 2.1 aligns the diagonal with the last key: query i sees keys up to i + n - m. A row that then
# sees no key is zero there (its exponentials are guarded), as the course's n = 0 rows are.
BOTTOM_RIGHT = (
    (CAUSAL_END, "end = min(n, i + rows + n - q.size(-2)) if causal"),
    ("s.size(-1) - 1 > i:", "s.size(-1) - 1 > i + n - q.size(-2):"),
    ("torch.arange(i, i + rows, device=q.device)[:, None]",
     "torch.arange(i, i + rows, device=q.device)[:, None] + n - q.size(-2)"),
    ("p = torch.exp(s - m_new)", "p = torch.exp(s - m_new).nan_to_num(0.0)"),
    ("correction = torch.exp(m_i - m_new)", "correction = torch.exp(m_i - m_new).nan_to_num(0.0)"),
)


TILED_MISTAKES = [
    Mistake(
        "the accumulator was not rescaled when the maximum grew: the sum l was multiplied by "
        "exp(m_old - m_new), but the running sum of exp(s - m) v was not",
        "both running sums are relative to the maximum: acc = acc * exp(m_old - m_new) + exp(s - m_new) @ v_j.",
        _tiled(("acc = acc * correction + p @", "acc = acc + p @")),
    ),
    Mistake(
        "nothing was rescaled when the maximum grew: the maximum was overwritten with the new one before the "
        "factor exp(m_old - m_new) was taken, so the factor was 1",
        "compute m_new first, then the factor exp(m_i - m_new), update l and the accumulator with it, "
        "and only then set m_i = m_new.",
        _tiled(("correction = torch.exp(m_i - m_new)", "correction = torch.ones_like(m_i)")),
    ),
    Mistake(
        "the accumulator was divided by the sum after every tile instead of once at the end: later tiles then "
        "add unnormalised terms to a normalised average",
        "keep acc = sum of exp(s - m) v unnormalised through all the tiles of keys; divide by l after the last one.",
        _tiled(("acc = acc * correction + p @ v[..., j:j + block_k, :]",
                "acc = acc * correction + p @ v[..., j:j + block_k, :]\n            acc = acc / l_i"),
               ("torch.where(l_i > 0, acc / l_i, 0.0)", "acc")),
    ),
    Mistake(
        "off by one at the diagonal: inside the tiles on the diagonal, a query cannot see its own key",
        "query i may attend to keys 0 .. i, itself included: hide key j only when j > i (global positions).",
        _tiled(("s.size(-1) - 1 > i:", "s.size(-1) - 1 >= i:"), ("key > query", "key >= query")),
    ),
    Mistake(
        "the tiles on the diagonal were not masked: a query sees the later keys of its own tile",
        "skipping the tiles above the diagonal is not enough: in a tile that crosses it, fill the scores of "
        "keys j > i with -inf (global positions: i from the query block's start, j from the key block's).",
        _tiled(('s = s.masked_fill(key > query, float("-inf"))', "s = s")),
    ),
    Mistake(
        "the causal mask is aligned to the bottom-right corner: query i sees keys 0 .. i + (n - m), which is "
        "FlashAttention >= 2.1's convention when m != n; the course, like PyTorch's is_causal, aligns it to "
        "the top-left corner",
        "query i may attend to keys 0 .. i whatever m and n are: hide key j when j > i (global positions, no "
        "shift by n - m), and end the loop over keys at min(n, i + block_q).",
        _tiled(*BOTTOM_RIGHT),
    ),
    Mistake(
        "the scores were not scaled by 1/sqrt(d_k): each tile holds q k^T instead of q k^T / sqrt(d_k)",
        "divide each tile of scores by math.sqrt(d_k), with d_k = q.size(-1) (or scale q once before the loops).",
        _tiled(("q[..., i:i + block_q, :] * scale", "q[..., i:i + block_q, :]")),
    ),
    Mistake(
        "the tile on the diagonal was skipped too: the loop over keys ends at the query block's start i, so a "
        "query never sees the keys of its own block (the first block's queries see no key at all)",
        "the block's last query is i + block_q - 1 and sees keys up to itself: loop over keys up to "
        "min(n, i + block_q), and mask inside the tiles that cross the diagonal.",
        _tiled((CAUSAL_END, "end = min(n, i) if causal")),
    ),
    Mistake(
        "the loop over keys ends at i + block_k instead of i + block_q: when block_k < block_q, the later "
        "queries of a block never see the keys between i + block_k and themselves",
        "the keys a query block needs end at its last query: loop over keys up to min(n, i + rows), rows the "
        "block's number of queries (block_q, fewer in the last block).",
        _tiled((CAUSAL_END, "end = min(n, i + block_k) if causal")),
    ),
    Mistake(
        "the last partial block of keys was dropped: n is not a multiple of block_k, and the last keys "
        "were never attended to",
        "loop with range(0, n, block_k) and slice k[..., j:j + block_k, :]; the last slice is simply shorter.",
        _tiled(("n = k.size(-2)", "n = k.size(-2) // block_k * block_k")),
    ),
]

FULL_MATRIX_HINT = ("compute one (block_q, block_k) tile of scores at a time, keep a running maximum, sum and "
                    "accumulator per query, and never make anything shaped like all the queries by all the keys "
                    "(scores, weights, or a mask).")


def _too_large(case: TiledCase, largest: dict, what: str) -> tuple[str, str]:
    """What a tensor of m·n or more elements is, told by its last two axes: all the scores of a head, tiles of
    every key (block_k unused), or something else as large as one head's scores."""
    shape = tuple(largest.get("shape", ()))[-2:]
    one_head = f"m·n = {case.m}·{case.n} = {case.m * case.n}, one head's full score matrix"
    if shape in ((case.m, case.n), (case.n, case.m)):
        mask = " (as a mask)" if largest.get("dtype") == "bool" else ""
        return f"you built the full score matrix{mask}: {what} holds {one_head}", FULL_MATRIX_HINT
    if case.n in shape:
        return (f"your tiles hold every key at once, so block_k is not used: {what} has as many elements as "
                f"{one_head}", "split the keys too: each tile of scores is (block_q, block_k), and a running "
                "maximum, sum and accumulator carry each query from one block of keys to the next.")
    return f"{what} has as many elements as {one_head}", FULL_MATRIX_HINT


def check_tiled_attention(tiled_attention, hidden: bool = False) -> None:
    """Check a learner's ``tiled_attention(q, k, v, block_q, block_k, causal=False) -> (..., m, d_v)``."""
    name = "tiled_attention"
    cases = HIDDEN_TILED if hidden else VISIBLE_TILED
    first = (*_tiled_inputs(0, cases[0], hidden), cases[0].block_q, cases[0].block_k)

    def check_case(i: int, case: TiledCase, device, dtype) -> None:
        inputs64 = _tiled_inputs(i, case, hidden)
        expected = F.scaled_dot_product_attention(*inputs64, is_causal=case.causal)
        q, k, v = (t.to(dtype=dtype, device=device) for t in inputs64)
        report = _watch(name, tiled_attention, (q, k, v, case.block_q, case.block_k), {"causal": case.causal})
        _expect_unmodified(name, report, ("q", "k", "v"))
        elements, what = _largest(report)
        if case.watched_for_memory() and elements >= case.m * case.n:
            problem, hint = _too_large(case, report["largest"], what)
            kernel_reported(name, tiled_attention, f"{problem} (block_q={case.block_q}, block_k={case.block_k}, "
                            f"causal={case.causal})", hint)
        out = report["result"]
        rows_of_full_blocks = case.m // case.block_q * case.block_q
        if isinstance(out, torch.Tensor) and out.dim() == q.dim() and out.size(-2) == rows_of_full_blocks < case.m:
            fail(name, f"the last partial block of queries was dropped: m = {case.m} is not a multiple of "
                       f"block_q = {case.block_q}, and the output has {out.size(-2)} rows",
                 "loop with range(0, m, block_q) and slice q[..., i:i + block_q, :]; the last slice is simply shorter.")
        expect_tensor(name, "the output", out, expected.shape, like=q)
        mistaken = candidates(TILED_MISTAKES, *inputs64, case.block_q, case.block_k, case.causal)
        if torch.isnan(out).any():
            if case.n == 0:
                fail(name, "NaN for queries with no key to attend to (n = 0): the sum l is 0, and 0/0 is NaN",
                     "a query that may attend to nothing gets a zero output: divide only where l > 0, "
                     "e.g. torch.where(l > 0, acc / l, 0.0).")
            mistake = matching_mistake(out.nan_to_num(0.0), mistaken)  # one that leaves a query no key: NaN in its row
            if mistake is not None:
                fail(name, mistake.problem, mistake.hint)
            fail(name, "the result contains NaN",
                 "exp(-inf - (-inf)) is NaN: is a running maximum still -inf when you use it?")
        if not close(out, expected):
            name_the_mistake(name, f"the output (causal={case.causal}, block_q={case.block_q}, block_k={case.block_k})",
                             out, expected, mistaken)

    def after() -> None:
        i = next(i for i, c in enumerate(cases) if c.causal and c.watched_for_memory())
        _expect_half_the_work(name, tiled_attention, cases[i], _tiled_inputs(i, cases[i], hidden))
        expect_device_agnostic(name, tiled_attention, first, {"causal": True})

    with strict_numerics():
        fused = {"scaled_dot_product": ATTENTION_BUILT_INS["scaled_dot_product"]}  # the fused kernel alone
        forbid_built_ins(name, tiled_attention, first, fused)
        run_cases(name, cases, check_case, after=after)


def _expect_half_the_work(name, tiled_attention, case: TiledCase, inputs64: tuple) -> None:
    """The causal call must create about as few elements, against the same call without the mask, as the tiles
    it needs: halfway between that fraction and 1 is the limit (the bookkeeping per query block costs a little)."""
    args = (*inputs64, case.block_q, case.block_k)
    elements = {causal: _watch(name, tiled_attention, args, {"causal": causal})["elements"] for causal in (False, True)}
    tiles = [math.ceil(min(case.n, i + case.block_q) / case.block_k) for i in range(0, case.m, case.block_q)]
    needed = sum(tiles) / (len(tiles) * math.ceil(case.n / case.block_k))
    if not (isinstance(elements[False], int) and isinstance(elements[True], int) and elements[False] > 0):
        kernel_reported(name, tiled_attention, "the grader could not count the work your code does")
    elif elements[True] > (needed + 1) / 2 * elements[False]:
        kernel_reported(name, tiled_attention, f"causal attention does {elements[True] / elements[False]:.0%} of the "
                        f"work of the same call without the mask (elements computed); skipping the tiles above the "
                        f"diagonal leaves about {needed:.0%} (m={case.m}, n={case.n}, block_q={case.block_q}, "
                        f"block_k={case.block_k})",
                        "for the query block starting at i, loop over keys only up to i + block_q (the block's last "
                        "query + 1): the tiles beyond it are all -inf and add nothing.")
