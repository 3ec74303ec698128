"""The kernel's side of a graded run: does what the grader asks with the learner's objects, and answers.

The grader sends one request at a time (``serve``, run as a cell of its own, the request beside its
code). The learner's objects never leave the kernel: the grader gets a handle for each and asks for
calls, attributes or items; what comes back is data (``wire``). The grader's torch settings travel with
each request (default dtype, grad mode, threads, and the random state when the grader seeded it) so the
learner's code runs as it would in-process; dtype, grad mode and threads are restored afterwards, for the
learner's next cell.

Nothing here is trusted: the learner can replace any of it. The grader only ever reads data back,
and a fake answer passes only if it is the right answer.
"""

import base64
import contextlib
import copy
import functools
import importlib
import io
import pickle
from collections.abc import Callable, Iterator
from types import ModuleType

import torch
from IPython import get_ipython
from IPython.display import publish_display_data

from . import MIME, lent, wire

MRO_SHOWN = 32  # how many of an object's classes the grader learns (for isinstance on a proxy)
REQUEST = "grader_request"  # the key of an execute request's metadata that carries the request


class Agent:
    """Objects handed out to the grader, by handle, and the operations the grader may ask for.

    Every course module it loads, for a pickle or for ``run``, it loads by ``import_module``: the suite's
    stand-in for a graded kernel passes one that refuses what the sandbox hides. ``grader`` carries a call
    on what the grader lent (``lent``) to the grader and brings back its answer, both as wire text.
    """

    def __init__(self, namespace: dict, unpickle: Callable[[bytes], object] | None = None,
                 import_module: Callable[[str], ModuleType] = importlib.import_module,
                 grader: Callable[[str], str] | None = None):
        self.namespace = namespace
        self.grader = grader
        self.objects: dict[int, object] = {}
        self.import_module = import_module
        self.unpickle = unpickle or (lambda data: _Unpickler(io.BytesIO(data), import_module).load())

    def handle(self, request: str) -> str:
        """Answer one request (a ``wire`` message): ``{"ok": value}`` or ``{"raised": [type, message]}``."""
        try:
            message = wire.decode(request, handle=self._resolve, unpickle=self.unpickle)
            arguments, keywords = message["args"], message["kwargs"]
            sent = list(enumerate(arguments)) + list(keywords.items())
            before = [(key, t, t.clone()) for key, t in sent if isinstance(t, torch.Tensor) and not t.is_meta]
            with _settings(message["context"]):
                result = getattr(self, "_" + message["op"])(*arguments, **keywords)
        except BaseException as exc:  # the learner's code may raise anything, SystemExit too; the grader judges it
            return self._reply({"raised": [type(exc).__name__, str(exc)]})
        # An argument changed in place travels back, so the grader sees what the learner's code did to it.
        changed = [[key, t] for key, t, copied in before if t.shape != copied.shape or not torch.equal(t, copied)]
        return self._reply({"ok": result, "changed": changed})

    def _reply(self, value) -> str:
        try:
            return wire.encode(value, handle=self._keep)
        except Exception as exc:  # e.g. a tensor subclass whose methods raise
            return wire.encode({"raised": [type(exc).__name__, f"could not send the result: {exc}"]})

    def _keep(self, obj) -> dict:
        self.objects[id(obj)] = obj
        kinds = [f"{k.__module__}.{k.__qualname__}" for k in type(obj).__mro__[:MRO_SHOWN]]
        return {"t": "object", "id": id(obj), "type": type(obj).__name__, "kinds": kinds}

    def _resolve(self, node: dict):
        if node.get("t") == "lent":
            if "module" in node:
                return lent.LentModule(node, self.unpickle(base64.b64decode(node["module"])), self._ask_grader)
            return lent.LentFunction(node, self._ask_grader)
        if node.get("t") != "ref" or node.get("id") not in self.objects:
            raise wire.WireError("unknown handle")
        return self.objects[node["id"]]

    def _ask_grader(self, message: dict):
        """A call on what the grader lent: the grader runs it and answers (or the exception it raised)."""
        if self.grader is None:
            raise RuntimeError("the grader's stand-in cannot be reached from here")
        reply = wire.decode(self.grader(wire.encode(message, handle=self._keep)), handle=self._resolve,
                            unpickle=self.unpickle)
        if "raised" in reply:
            raise wire.exception(reply["raised"])
        return reply["ok"]

    # ------------------------------------------------------------------ what the grader may ask for

    def _lookup(self, name: str):
        if name not in self.namespace:
            raise NameError(f"name '{name}' is not defined")
        return self.namespace[name]

    def _call(self, target, *args, **kwargs):
        return target(*args, **kwargs)

    def _getattr(self, target, name: str):
        return getattr(target, name)

    def _setattr(self, target, name: str, value):
        setattr(target, name, value)

    def _getitem(self, target, key):
        return target[key]

    def _len(self, target):
        return len(target)

    def _iter(self, target):
        return list(iter(target))

    def _deepcopy(self, target):
        return copy.deepcopy(target)

    def _run(self, path: str, *args, **kwargs):
        """Call a course function here, next to the learner's objects (e.g. a probe on meta tensors)."""
        module, _, name = path.partition(":")
        return functools.reduce(getattr, name.split("."), self.import_module(module))(*args, **kwargs)


class _Unpickler(pickle.Unpickler):
    """``pickle.loads``, whose classes and functions come from modules loaded by ``import_module``."""

    def __init__(self, file, import_module: Callable[[str], ModuleType]):
        super().__init__(file)
        self.import_module = import_module

    def find_class(self, module: str, name: str):
        self.import_module(module)
        return super().find_class(module, name)


@contextlib.contextmanager
def _settings(context: dict) -> Iterator[None]:
    saved = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads())
    torch.set_default_dtype(context["dtype"])
    torch.set_grad_enabled(context["grad"])
    if context["threads"] != saved[2]:
        torch.set_num_threads(context["threads"])
    if context["rng"] is not None:  # the grader seeded: draw what it would draw
        torch.set_rng_state(context["rng"])
    try:
        yield
    finally:
        torch.set_default_dtype(saved[0])
        torch.set_grad_enabled(saved[1])
        if torch.get_num_threads() != saved[2]:
            torch.set_num_threads(saved[2])


_agents: dict[int, Agent] = {}


def serve(namespace: dict) -> None:
    """Answer the request the grader's execute request carries in its metadata (``REQUEST``), as display
    data, the only way a kernel talks back (one agent per namespace).

    The request travels beside the cell's code, not in it: IPython reads a cell's code character by
    character (its input transformers), which for a request holding tensors cost more than the request.
    """
    kernel = get_ipython().kernel
    request = kernel.get_parent("shell").get("metadata", {}).get(REQUEST)
    # A call on what the grader lent goes to the grader as an input request, which it answers.
    agent = _agents.setdefault(id(namespace), Agent(namespace, grader=lambda text: kernel.raw_input(text)))
    publish_display_data({MIME: {"reply": agent.handle(request)}})
