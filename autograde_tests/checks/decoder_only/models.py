"""What more than one of chapter 6's checks builds: the options the block's and the model's cases pass, the
learner's modules built with the notebook's classes recorded in place of its own (and what each was given), and
the stand-ins lent in place of the learner's code: PyTorch's RMSNorm, and the stand-in language model the loss
and sampling checks drive.
"""

import functools
import inspect

import torch
from torch import nn

from ...reference import decoder_only as ref
from ...remote.proxy import make_in_kernel, run_in_kernel
from .. import in_kernel, stand_in_models
from ..harness import (
    SeededRandom,
    construct,
    fail,
    randomise,
    seed_for,
)


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


MODEL_HINT = ("the notebook names the submodules embed (nn.Embedding(vocab, d_model)), blocks (nn.ModuleList of "
              "DecoderBlock(d_model, n_heads, d_ff, eps, n_kv_heads)), norm (RMSNorm(d_model, eps)) and head "
              "(nn.Linear(d_model, vocab, bias=False)).")


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


def _torch_rms_norm(norm: ref.RMSNorm) -> nn.RMSNorm:
    """PyTorch's RMSNorm with ``norm``'s weight and eps: a stand-in whose class the kernel can import."""
    stand_in = nn.RMSNorm(norm.weight.shape[0], eps=norm.eps, dtype=norm.weight.dtype)
    stand_in.load_state_dict(norm.state_dict())
    return stand_in


def _lm_inputs(name: str, i: int, case, hidden: bool, d_model: int, sharpen: float = 1.0):
    """Case ``i`` of ``name``: a float64 stand-in language model with random weights (its weights are what
    crosses to the kernel; its head's multiplied by ``sharpen``) and token ids idx (B, T), on the CPU."""
    seed = functools.partial(seed_for, name, hidden, i)
    model = randomise(stand_in_models.StandInLM(case.vocab, d_model).double(), SeededRandom(seed("weights")))
    with torch.no_grad():
        model.head.weight *= sharpen
    idx = torch.randint(case.vocab, (case.batch, case.length), generator=SeededRandom(seed()).generator)
    return stand_in_models.stand_in_lm(model.state_dict()), idx
