"""The grader's side: the learner's objects as proxies, so a check runs unchanged against code it cannot reach.

A check called with a ``Remote`` instead of the learner's function or class does exactly what it does
in JupyterLab; each call, attribute or item it asks of the proxy becomes a request to the kernel,
and what comes back is data. So the verdict is computed here, from inputs made here, by the same code
that gives learners their messages.
"""

from collections.abc import Callable

import torch

from . import lent, wire


class Remote:
    """One of the learner's objects, living in the kernel: call it, read and set attributes, index it."""

    __slots__ = ("_session", "_id", "_type", "_kinds", "_name")

    def __init__(self, session: "Session", node: dict, name: str | None = None):
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_id", node.get("id"))
        object.__setattr__(self, "_type", str(node.get("type"))[: wire.MAX_TEXT])
        kinds = node.get("kinds") if isinstance(node.get("kinds"), list) else []
        object.__setattr__(self, "_kinds", frozenset(k for k in kinds if isinstance(k, str)))

    def __call__(self, *args, **kwargs):
        return self._session.ask("call", self, *args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):  # Python's protocols (copy, pickle, numpy) ask for these: not the learner's
            raise AttributeError(name)
        return self._session.ask("getattr", self, name)

    def __setattr__(self, name: str, value) -> None:
        self._session.ask("setattr", self, name, value)

    def __getitem__(self, key):
        return self._session.ask("getitem", self, key)

    def __len__(self) -> int:
        size = self._session.ask("len", self)
        if not isinstance(size, int) or size < 0:
            raise TypeError("len() of the learner's object is not a size")
        return size

    def __iter__(self):
        items = self._session.ask("iter", self)
        if not isinstance(items, list):
            raise TypeError("the learner's object did not iterate")
        return iter(items)

    def __deepcopy__(self, memo):
        return self._session.ask("deepcopy", self)

    def __repr__(self) -> str:
        return f"<{self._type} in the learner's kernel>"


def type_name(x) -> str:
    """The name of ``x``'s class, wherever ``x`` lives."""
    return x._type if isinstance(x, Remote) else type(x).__name__


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def is_a(x, cls: type) -> bool:
    """``isinstance(x, cls)``, wherever ``x`` lives (for a ``Remote``, by the names of its classes)."""
    return qualified_name(cls) in x._kinds if isinstance(x, Remote) else isinstance(x, cls)


def is_module(x) -> bool:
    return is_a(x, torch.nn.Module)


def static_names(x) -> set[str]:
    """For a learner's global looked up by name: the outside names its source reaches (see ``Session``)."""
    if isinstance(x, Remote) and x._name is not None and x._session.static_names is not None:
        return x._session.static_names(x._name)
    return set()


def make_in_kernel(learner, factory: Callable, *args, **kwargs):
    """``factory(*args)``, made where ``learner`` lives: a handle in the kernel for a ``Remote``.

    For what a check hands to the learner's code and then inspects (a sublayer that counts its calls,
    the weights given to ``ffn_as_conv1d``); ``factory`` must be a course function the kernel can import.
    """
    if isinstance(learner, Remote):
        return learner._session.ask("run", f"{factory.__module__}:{factory.__qualname__}", *args, **kwargs)
    return factory(*args, **kwargs)


def lend(learner, obj, *methods: str):
    """``obj``, which the check hands to ``learner``'s code: for a ``Remote``, lent (``lent``), so that the
    kernel's code calls the grader's ``obj`` (its ``methods``; calling it, by default) and cannot replace it.
    Returns ``obj`` itself, whose own record (e.g. of the calls it received) is the grader's."""
    if isinstance(learner, Remote):
        learner._session.lender.lend(
            obj, methods or (("forward",) if isinstance(obj, torch.nn.Module) else ("__call__",)))
    return obj


def run_in_kernel(function: Callable, learner, *args, **kwargs):
    """``function(learner, ...)``, run where ``learner`` lives: in the kernel for a ``Remote``.

    For the steps that must touch the learner's objects many times or in ways a proxy cannot
    (training, shape-only meta tensors, recording the operators used); ``function`` must be a
    module-level course function that returns data.
    """
    if isinstance(learner, Remote):
        return learner._session.ask("run", f"{function.__module__}:{function.__qualname__}", learner, *args, **kwargs)
    return function(learner, *args, **kwargs)


class Session:
    """Requests to one kernel through ``transport(request_text) -> reply_text``.

    ``static_names(name)``, when given, reads the learner's source: the names of functions, attributes
    and imports that the learner's definition of ``name`` reaches (the grader's view of forbidden calls).
    """

    def __init__(self, transport: Callable[[str], str], static_names: Callable[[str], set[str]] | None = None):
        self.transport = transport
        self.static_names = static_names
        self.rng_sent: torch.Tensor | None = None
        self.lender = lent.Lender(self._remote)  # what this session lent the kernel, and its answers to calls

    def lookup(self, name: str):
        """The learner's global ``name``: a proxy, or the value itself when it is data."""
        found = self.ask("lookup", name)
        if isinstance(found, Remote):
            object.__setattr__(found, "_name", name)
        return found

    def ask(self, op: str, *args, **kwargs):
        context = {"dtype": torch.get_default_dtype(), "grad": torch.is_grad_enabled(),
                   "threads": torch.get_num_threads(), "rng": self._rng()}
        request = wire.encode({"op": op, "args": list(args), "kwargs": kwargs, "context": context},
                              handle=lambda x: _ref(x) or self.lender.node(x), pickles=True)
        reply = wire.decode(self.transport(request), handle=self._remote)
        if not isinstance(reply, dict):
            raise wire.WireError("a reply that is not a dict")
        if "raised" in reply:
            raise wire.exception(reply["raised"])
        if "ok" not in reply:
            raise wire.WireError("a reply with no result")
        for key, value in reply.get("changed", []):
            _write_back(key, value, args, kwargs)
        return reply["ok"]

    def _rng(self) -> torch.Tensor | None:
        """The random state, when the grader changed it (seeded) since it last sent it; else None, and
        the kernel's stream goes on: two calls in a row draw different dropout masks, as in-process."""
        state = torch.get_rng_state()
        if self.rng_sent is not None and torch.equal(state, self.rng_sent):
            return None
        self.rng_sent = state
        return state

    def _remote(self, node: dict) -> Remote:
        if node.get("t") != "object" or not isinstance(node.get("id"), int):
            raise wire.WireError("malformed handle")
        return Remote(self, node)


def _ref(x) -> dict | None:
    return {"t": "ref", "id": x._id} if isinstance(x, Remote) else None


def _write_back(key, value, args: tuple, kwargs: dict) -> None:
    """Copy an argument the learner's code changed in place into the grader's own tensor."""
    original = args[key] if isinstance(key, int) and 0 <= key < len(args) else kwargs.get(key)
    if isinstance(original, torch.Tensor) and isinstance(value, torch.Tensor):
        with torch.no_grad():
            if value.shape != original.shape:
                original.resize_(value.shape)
            original.copy_(value)
