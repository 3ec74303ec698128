"""Chapter 6's generate: its cases, its mistakes and its check, which drives a stand-in model.

Its catalogued mistakes: softmax over the wrong axis; top-k applied after softmax without renormalising;
temperature applied after softmax; top-k keeping k - 1; top-p dropping the token that crosses top_p; top-p before
top-k; the first position's logits; the draw over sorted or top-k probabilities (right distribution, other
tokens); no generator; temperature 0 used as a divisor; the cache not used; the cache used although
use_cache=False.

Sampling is reproducible because the exercise fixes how a token is drawn: ``torch.multinomial(probs, 1,
generator=generator)`` on the final probabilities.
"""

import copy
import functools
from dataclasses import dataclass, replace

import torch
from torch import nn

from ...reference import decoder_only as ref
from ...remote.proxy import lend, make_in_kernel, run_in_kernel, type_name
from .. import in_kernel, stand_in_models
from ..harness import (
    CheckFailed,
    Mistake,
    call,
    candidates,
    close,
    edited,
    fail,
    matching_mistake,
    one_thread,
    restate,
    run_cases,
    strict_numerics,
)
from ..how import kernel_reported
from .models import _lm_inputs


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
        run = _sampled(name, generate, (model, idx, case.new), generator, options)
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
        # ``call``: an idx changed in place is a verdict too.
        return call(name, lambda *given: run_in_kernel(in_kernel.sampled, generate, *given, generator=generator,
                                                       **options), *args)
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
    sums = [p.sum(dim=-1) for p in probs if p.dim() == 2 and p.is_floating_point()]
    return all(close(s, torch.ones_like(s)) for s in sums)  # within the course's tolerance for their dtype


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
