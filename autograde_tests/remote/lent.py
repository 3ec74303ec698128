"""What a check lends the learner's code: a stand-in that stays the grader's, called back from the kernel.

A check hands the learner's code things it did not write: a sublayer, stand-in layers, a stand-in model.
Built in the kernel, they would be the learner's to replace (a stand-in model that reverses time makes a
``greedy_decode`` that reads the wrong position come out right). Lent, the object stays in the grader;
the kernel gets a stub (``LentModule``, ``LentFunction``) whose every call asks the grader to run the call
(``Lender.answer``) and returns what the grader's object returned. What the learner's code fed it, and how
many times, the grader records itself.

The kernel reaches the grader while a request of the grader's runs, through the kernel's stdin (an
``input_request`` the grader answers: ``grading.execute``); in the suite, by a direct call. A stub of a
module carries a copy of the module, so ``.to()``, ``.parameters()`` and ``.eval()`` work as on the object;
each call tells the grader the copy's dtype and device, and the grader's object follows them. When the
kernel's graph needs it (grad enabled and a tensor that requires grad), the call is one step of that graph
(``_Through``): its backward asks the grader for the gradients of the call's inputs.
"""

import copy
import itertools
from collections.abc import Callable

import torch
from torch import nn
from torch.utils import _pytree as pytree

from . import wire

GRAPH_BYTES = 64 * 2**20  # the tensors the grader keeps for the kernel's backward passes, oldest dropped first
GRAPHS = 16  # and at most this many calls' graphs (what autograd saves inside them is not counted above)
# What one call may hand a lent object: the checks' stand-ins work on a few hundred numbers, and a call runs in
# the grader, outside the sandbox's bounds, so a stand-in's (T, T) averages must stay small whatever is sent.
CALL_ELEMENTS = 2**14  # in all the tensors of a call
CALL_SIZE = 256  # along any one dimension


class Lender:
    """The grader's side: objects lent by id, and the answers to the kernel's calls on them."""

    def __init__(self, remote: Callable[[dict], object]):
        self.remote = remote  # turns a handle the kernel sends into the grader's proxy of it
        self.objects: dict[int, tuple[object, tuple[str, ...]]] = {}
        self.graphs: dict[int, tuple[list, list]] = {}  # a call's inputs that need gradients, and its outputs
        self.calls = itertools.count()

    def lend(self, obj, methods: tuple[str, ...]) -> None:
        self.objects[id(obj)] = (obj, methods)

    def node(self, obj) -> dict | None:
        """How a lent object travels to the kernel (None if it is not lent): its id, its methods, and for a
        module a copy, pickled."""
        if id(obj) not in self.objects:
            return None
        node = {"t": "lent", "id": id(obj), "methods": list(self.objects[id(obj)][1])}
        return node | ({"module": wire.pickled(obj)} if isinstance(obj, nn.Module) else {})

    def answer(self, text: str) -> str:
        """The reply to one call from the kernel, ``{"ok": result}`` or ``{"raised": [type, message]}``."""
        try:
            message = wire.decode(text, handle=self.remote)
            if not isinstance(message, dict):
                raise wire.WireError("a call that is not a dict")
            result = self._backward(message) if "backward" in message else self._call(message)
        except Exception as exc:  # the kernel asked for something the stand-in cannot do: it raises there
            return wire.encode({"raised": [type(exc).__name__, str(exc)[: wire.MAX_TEXT]]})
        return wire.encode({"ok": result})

    def _call(self, message: dict):
        obj, methods = self.objects.get(message.get("id"), (None, ()))
        method, args, kwargs = message.get("method"), message.get("args"), message.get("kwargs")
        if method not in methods or not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise wire.WireError("not a call the grader lent")
        _expect_small(args, kwargs)
        like = message.get("like")
        if isinstance(obj, nn.Module) and isinstance(like, torch.Tensor) and like.is_floating_point():
            obj.to(device=like.device, dtype=like.dtype)  # where the kernel's copy now is
        graph = message.get("graph") is True
        function = obj if method in ("__call__", "forward") else getattr(obj, method)
        with torch.set_grad_enabled(graph):
            result = function(*args, **kwargs)
        if not graph:
            return result
        call = next(self.calls)
        leaves = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
        self._keep(call, leaves, [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)])
        return {"result": result, "call": call}

    def _keep(self, call: int, leaves: list, outputs: list) -> None:
        self.graphs[call] = (leaves, outputs)
        held = sum(t.nbytes for ts in self.graphs.values() for group in ts for t in group)
        while (held > GRAPH_BYTES or len(self.graphs) > GRAPHS) and len(self.graphs) > 1:
            oldest = next(iter(self.graphs))
            held -= sum(t.nbytes for group in self.graphs.pop(oldest) for t in group)

    def _backward(self, message: dict) -> list:
        leaves, outputs = self.graphs.get(message.get("backward"), (None, None))
        grads = message.get("grads")
        if leaves is None or not isinstance(grads, list) or len(grads) != len(outputs):
            raise RuntimeError("the grader no longer holds this call's graph")
        pairs = [(o, g) for o, g in zip(outputs, grads) if isinstance(g, torch.Tensor) and o.requires_grad]
        if not pairs or not leaves:
            return [None] * len(leaves)
        found = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs],
                                    retain_graph=True, allow_unused=True)
        return list(found)


def _expect_small(args: tuple, kwargs: dict) -> None:
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if sum(t.numel() for t in tensors) > CALL_ELEMENTS or any(n > CALL_SIZE for t in tensors for n in t.shape):
        shapes = ", ".join(str(tuple(t.shape)) for t in tensors[:4])
        raise ValueError(f"the grader's stand-in takes at most {CALL_ELEMENTS} numbers a call, none of its sizes "
                         f"over {CALL_SIZE}; it was given tensors of shape {shapes}")


# ---------------------------------------------------------------------------- the kernel's side: stubs


class LentFunction:
    """A lent function (or callable object) in the kernel: calling it asks the grader."""

    def __init__(self, node: dict, ask: Callable[[dict], object]):
        self._id, self._ask = node["id"], ask

    def __call__(self, *args, **kwargs):
        return call(self._ask, self._id, "__call__", args, kwargs, ())

    def __deepcopy__(self, memo):  # a copy still asks the grader's object (its way there cannot be copied)
        return self

    def __repr__(self) -> str:
        return "<the grader's stand-in>"


class LentModule(nn.Module):
    """A lent module in the kernel: a copy of it (``lent``) for its parameters, and calls that ask the grader."""

    def __init__(self, node: dict, module: nn.Module, ask: Callable[[dict], object]):
        super().__init__()
        self.lent = module
        self._lent_call = (node["id"], tuple(node["methods"]), ask)

    def forward(self, *args, **kwargs):
        return self._ask_grader("forward", args, kwargs)

    def __deepcopy__(self, memo):  # a copy of the weights that still asks the grader's object
        handle, methods, ask = self._lent_call
        return LentModule({"id": handle, "methods": methods}, copy.deepcopy(self.lent, memo), ask)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_"):
                raise
        if name in self._lent_call[1]:
            return lambda *args, **kwargs: self._ask_grader(name, args, kwargs)
        return getattr(self.lent, name)

    def _ask_grader(self, method: str, args: tuple, kwargs: dict):
        handle, methods, ask = self._lent_call
        if method not in methods:
            raise AttributeError(f"the grader's stand-in has no {method}")
        return call(ask, handle, method, args, kwargs, tuple(self.lent.parameters()))


def call(ask: Callable[[dict], object], handle: int, method: str, args: tuple, kwargs: dict, params: tuple):
    """``method(*args, **kwargs)`` of the grader's object ``handle``, asked through ``ask``; a step of the
    kernel's graph when it needs one (``params``, the copy's, make the result need gradients as the
    object's would)."""
    like = params[0].detach()[:0] if params else None
    leaves, spec = pytree.tree_flatten((args, kwargs))
    inputs = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    graph = torch.is_grad_enabled() and any(t.requires_grad for t in [*params, *(leaves[i] for i in inputs)])
    message = {"id": handle, "method": method, "like": like}
    if not graph:
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        return ask(message | {"args": args, "kwargs": kwargs})
    box = {"ask": ask, "message": message, "leaves": leaves, "spec": spec, "inputs": inputs}
    outputs = _Through.apply(box, *(leaves[i] for i in inputs), *params)
    return pytree.tree_unflatten([outputs[i] if i is not None else x for i, x in box["result"]], box["out_spec"])


class _Through(torch.autograd.Function):
    """A lent object's call as one step of the kernel's graph; its backward asks the grader too."""

    @staticmethod
    def forward(ctx, box: dict, *tensors):
        leaves = list(box["leaves"])
        for i, t in zip(box["inputs"], tensors):  # a parameter travels as a tensor that needs its gradient
            leaves[i] = t.detach().requires_grad_(t.requires_grad) if t.is_floating_point() else t
        args, kwargs = pytree.tree_unflatten(leaves, box["spec"])
        answer = box["ask"](box["message"] | {"args": args, "kwargs": kwargs, "graph": True})
        if not (isinstance(answer, dict) and isinstance(answer.get("call"), int)):
            raise wire.WireError("the grader's answer is not a call")
        flat, box["out_spec"] = pytree.tree_flatten(answer["result"])
        outputs = [x.detach() for x in flat if isinstance(x, torch.Tensor)]
        positions = itertools.count()
        box["result"] = [(next(positions), x) if isinstance(x, torch.Tensor) else (None, x) for x in flat]
        ctx.box, ctx.call, ctx.inputs = box, answer["call"], len(box["inputs"])
        ctx.mark_non_differentiable(*[o for o in outputs if not o.is_floating_point()])
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        found = ctx.box["ask"]({"backward": ctx.call, "grads": list(grads)})
        if not isinstance(found, list) or len(found) > ctx.inputs:
            raise wire.WireError("the grader's gradients are not a list")
        wanted = [g if isinstance(g, torch.Tensor) else None for g in found]
        sent = [ctx.box["leaves"][i] for i in ctx.box["inputs"]]
        by_input = iter(wanted)
        grads_in = [next(by_input, None) if t.requires_grad else None for t in sent]
        return (None, *grads_in, *[None] * (len(ctx.needs_input_grad) - 1 - ctx.inputs))
