"""What the checks run next to the learner's objects: probes, and what the kernel builds for the learner's code.

In JupyterLab this runs in the learner's kernel like the rest of a check. In a graded run it runs in
the sandboxed kernel (``remote.proxy.run_in_kernel`` and ``make_in_kernel``), which has the earlier
chapters' reference but not the graded one's; so this module imports PyTorch alone, and nothing
handed to the learner's code is itself an answer to an exercise. Each function returns data, or an
object the check then uses through its proxy.
"""

import contextlib

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


class _CalledFunctions(TorchFunctionMode):
    """Records the torch functions a call makes (F.scaled_dot_product_attention, torch.softmax, ...)."""

    def __init__(self, names: set[str]):
        super().__init__()
        self.names = names

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class _Recorder(TorchDispatchMode):
    """A dispatch mode that only watches. PyTorch wraps a mode's ``__torch_dispatch__`` to keep
    ``torch.compile`` out of it, and the wrapper imports all of ``torch._dynamo`` on the first operator:
    about 2 s of a core in every kernel that a check records in. Watching needs no such guard."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class _RunOperators(_Recorder):
    """Records the ATen operators a call runs: an alias or a wrapper cannot hide a built-in softmax."""

    def __init__(self, names: set[str]):
        super().__init__()
        self.names = names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.name())
        return func(*args, **(kwargs or {}))


def operators_used(fn, args: tuple) -> list[str]:
    """The torch functions and ATen operators that ``fn(*args)`` runs."""
    names: set[str] = set()
    with _CalledFunctions(names), _RunOperators(names):
        fn(*args)
    return sorted(names)


def run_on_meta(fn, args: tuple, kwargs: dict) -> dict:
    """Run ``fn`` on shape-only 'meta' copies of the tensors in ``args``.

    Returns the error, if any, with the torch functions called before it, or the result's devices.
    """
    meta = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    called: set[str] = set()
    try:
        with _CalledFunctions(called):
            result = fn(*meta, **kwargs)
    except Exception as exc:  # the learner's code may raise anything; only a device clash matters here
        return {"error": str(exc), "called": sorted(called)}
    results = result if isinstance(result, tuple) else (result,)
    return {"devices": [r.device.type for r in results if isinstance(r, torch.Tensor)]}


def gradients(module: nn.Module, x: torch.Tensor, upstream: torch.Tensor, parameters: list[str]) -> dict:
    """Backpropagate ``upstream`` through ``module(x)``: the gradients of x and of the named parameters.

    A forward pass that raises raises; a backward pass that cannot run (an output cut from the graph)
    is reported as ``{"error": ...}``.
    """
    x = x.detach().requires_grad_()
    out = module(x)
    try:
        (out * upstream).sum().backward()
    except RuntimeError as exc:
        return {"error": str(exc)}
    return {"x": x.grad} | {name: getattr(module, name).grad for name in parameters}


def parameter_gradients(module: nn.Module, args: tuple, upstream: torch.Tensor) -> dict:
    """Backpropagate ``upstream`` through the first output of ``module(*args)``: each parameter's gradient
    (None for a parameter that got none), or ``{"error": ...}`` when backward cannot run."""
    module.zero_grad(set_to_none=True)
    out = module(*args)
    out = out[0] if isinstance(out, (tuple, list)) else out
    try:
        (out * upstream).sum().backward()
    except RuntimeError as exc:
        return {"error": str(exc)}
    return {"gradients": {key: p.grad for key, p in module.named_parameters()}}


def ffn_weights(state: dict) -> nn.Module:
    """What ``ffn_as_conv1d`` is given: an FFN's ``linear1`` and ``linear2`` with the weights in ``state``.

    It holds the weights and has no forward of its own: the learner's convolutions do the computing.
    """
    (d_ff, d_model), dtype = state["linear1.weight"].shape, state["linear1.weight"].dtype
    holder = nn.Module()
    holder.linear1, holder.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
    holder.dropout = nn.Dropout(0.0)
    holder.load_state_dict(state)
    return holder.to(dtype).eval()


class _LinearCalls(TorchFunctionMode):
    """Counts calls of F.linear (which every nn.Linear makes)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "linear":
            self.count += 1
        return func(*args, **(kwargs or {}))


def convolution_calls(module: nn.Module, x: torch.Tensor) -> dict:
    """Run ``module(x)``: which of its nn.Conv1d layers never ran, and how often F.linear was called."""
    called: set[str] = set()
    convolutions = [(key, m) for key, m in module.named_modules() if isinstance(m, nn.Conv1d)]
    hooks = [m.register_forward_hook(lambda *_, key=key: called.add(key)) for key, m in convolutions]
    try:
        with _LinearCalls() as linear:
            module(x)
    finally:
        for hook in hooks:
            hook.remove()
    return {"unused": [key for key, _ in convolutions if key not in called], "linear": linear.count}


@contextlib.contextmanager
def _globals_set(namespace: dict, values: dict):
    """The globals ``values`` set in ``namespace`` (the notebook's), as they were afterwards."""
    absent = object()
    saved = {name: namespace.get(name, absent) for name in values}
    namespace.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is absent:
                namespace.pop(name, None)
            else:
                namespace[name] = value


def with_global(module: nn.Module, name: str, value, *args):
    """``module(*args)`` while the global ``name`` that its class's code reads (the notebook's namespace) is
    ``value``; as it was afterwards."""
    with _globals_set(type(module).forward.__globals__, {name: value}):
        return module(*args)


class Recorded(nn.Module):
    """Built in place of a class the learner's constructor calls by name (``built_with``): it keeps the
    arguments it was given and computes nothing (the check lends its own stand-in in its place)."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.given = (args, kwargs)


def built_with(cls: type, names: tuple[str, ...], *args, **kwargs) -> nn.Module:
    """``cls(*args, **kwargs)`` while each global in ``names`` that its ``__init__`` reads (the notebook's
    namespace) is a ``Recorded`` class of that name: the learner's module, built without the learner's other
    classes (e.g. a GPT without the learner's DecoderBlock), which ``recorded`` then reads."""
    namespace = getattr(cls.__init__, "__globals__", None)
    if namespace is None:  # an __init__ not written in Python: it calls none of the notebook's classes
        return cls(*args, **kwargs)
    with _globals_set(namespace, {name: type(name, (Recorded,), {}) for name in names}):
        return cls(*args, **kwargs)


def recorded(module: nn.Module) -> list[tuple[str, str, list, dict]]:
    """(path, class name, args, kwargs) of each ``Recorded`` in ``module``, in order; an argument that is
    not a plain number, string or None is given as its type's name."""

    def plain(value):
        return value if value is None or isinstance(value, (bool, int, float, str)) else type(value).__name__

    return [(path, type(m).__name__, [plain(a) for a in m.given[0]], {k: plain(v) for k, v in m.given[1].items()})
            for path, m in module.named_modules() if isinstance(m, Recorded)]


def unrotated(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE's stand-in where only shapes and devices count (a run on meta tensors): x as it is."""
    return x


class _WithoutRoPE(nn.Module):
    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args):
        return with_global(self.block, "apply_rotary", unrotated, *args)


def without_rope(block: nn.Module) -> nn.Module:
    """``block``, its calls of the notebook's ``apply_rotary`` answered by ``unrotated``."""
    return _WithoutRoPE(block)


class _MultinomialInputs(TorchFunctionMode):
    """Records the probabilities every torch.multinomial call draws from, and how many calls were given no
    generator (their draws cannot be reproduced)."""

    def __init__(self):
        super().__init__()
        self.probs: list[torch.Tensor] = []
        self.unseeded = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "multinomial" and args and isinstance(args[0], torch.Tensor):
            self.probs.append(args[0].detach().clone())
            self.unseeded += (kwargs or {}).get("generator") is None
        return func(*args, **(kwargs or {}))


def sampled(generate, *args, **kwargs) -> dict:
    """Run ``generate(*args, **kwargs)``: the tokens, the probabilities each multinomial draw used, and how
    many draws were given no generator."""
    with _MultinomialInputs() as spy:
        tokens = generate(*args, **kwargs)
    return {"tokens": tokens, "probs": spy.probs, "unseeded": spy.unseeded}


class _Created(_Recorder):
    """Watches every tensor the operators of a call create (views make none): the largest, and the
    elements made in all, the call's work in a unit that needs no list of operators."""

    def __init__(self, stream: "_Stream | None" = None):
        super().__init__()
        self.largest: dict | None = None
        self.elements = 0
        self.stream = stream  # whose items' reads are recorded too

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.stream is not None:
            for arg in (*args, *(kwargs or {}).values()):
                for t in arg if isinstance(arg, (list, tuple)) else (arg,):
                    if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
                        self.stream.used(t)
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    self.elements += t.numel()
                    if self.largest is None or t.numel() > self.largest["elements"]:
                        self.largest = {"elements": t.numel(), "shape": list(t.shape),
                                        "dtype": str(t.dtype).removeprefix("torch."), "op": func.name()}
        return out


class _Stream:
    """Items handed over as an iterator that records how they were read: how many times they were handed
    out, and the first time an operator used an item again after a later one (told by the items' memory).
    A pass over the exhausted stream finds every item again, so the values a second pass computes are right
    and the record alone tells (a note in a graded run, where the kernel could hand over a list instead: what
    it does must not change a value)."""

    def __init__(self, items):
        self.items = list(items)
        self.stream = iter(self.items)
        self.handed = 0
        self.exhausted = False
        self.latest = -1  # the latest item an operator used
        self.went_back: list[int] | None = None  # [earlier item, later item], first time it happened

    def __iter__(self):
        if self.exhausted:
            self.stream, self.exhausted = iter(self.items), False
        return self

    def __next__(self):
        try:
            item = next(self.stream)
        except StopIteration:
            self.exhausted = True
            raise
        self.handed += 1
        return item

    @property
    def passes(self) -> int:
        return -(-self.handed // len(self.items)) if self.items else 1

    def used(self, tensor: torch.Tensor) -> None:
        """An operator read ``tensor``: note it if it lies in an item earlier than one used before."""
        address = tensor.data_ptr()
        for i, item in enumerate(self.items):
            if item.data_ptr() <= address < item.data_ptr() + max(item.numel() * item.element_size(), 1):
                if i < self.latest and self.went_back is None:
                    self.went_back = [i, self.latest]
                self.latest = max(self.latest, i)
                return


def watched(fn, args: tuple, kwargs: dict, read_once: bool = False) -> dict:
    """``fn(*args, **kwargs)`` while every tensor its operators create is watched.

    Returns the result; the largest tensor created (elements, shape, dtype, operator; None if none was);
    the elements created in all; which arguments it changed in place (their positions); and, with
    ``read_once`` (the first argument, a list, handed over as an iterator), how many passes read it and
    ``went_back``: the first [earlier, later] pair of items where an operator used an item again after a
    later one (None if none).
    """
    before = [[t.clone() for t in (a if isinstance(a, list) else [a]) if isinstance(t, torch.Tensor)] for a in args]
    stream = _Stream(args[0]) if read_once else None
    handed = (stream, *args[1:]) if read_once else args
    with _Created(stream) as created:
        result = fn(*handed, **kwargs)
    now = [[t for t in (a if isinstance(a, list) else [a]) if isinstance(t, torch.Tensor)] for a in args]
    modified = [i for i, (old, new) in enumerate(zip(before, now)) if not all(map(torch.equal, old, new))]
    return {"result": result, "largest": created.largest, "elements": created.elements, "modified": modified,
            "reads": stream.passes if stream else 1, "went_back": stream.went_back if stream else None}


def state_of(module: nn.Module) -> dict:
    """``module``'s state dict: its parameters and buffers by name, as they are now."""
    return {key: value.detach() for key, value in module.state_dict().items()}


def loaded(loader, model: nn.Module, checkpoint: dict) -> dict:
    """Run ``loader(model, checkpoint)``: whether it returned ``model`` itself (else the class of what it
    returned), and whether it changed the checkpoint, its tensors or its keys."""
    before = {key: value.clone() for key, value in checkpoint.items()}
    returned = loader(model, checkpoint)
    changed = checkpoint.keys() != before.keys() or not all(
        isinstance(checkpoint[key], torch.Tensor) and checkpoint[key].shape == value.shape
        and checkpoint[key].dtype == value.dtype and torch.equal(checkpoint[key], value)
        for key, value in before.items())
    return {"model": returned is model, "returned": type(returned).__name__, "changed": changed}
