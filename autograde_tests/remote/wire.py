"""What crosses between the grader and the learner's kernel: JSON for structure, safetensors for tensors.

A message is one JSON text: ``{"tree": <the value, described>, "tensors": <base64 safetensors>}``.
Tensors travel as raw buffers with their dtype and shape; everything else the kernel holds (the
learner's modules, functions, any object) stays there and travels as a handle, ``{"t": "object", ...}``.

Trust runs one way. Decoding what the kernel sent (``decode`` without ``unpickle``) never executes
anything: no pickle, no import by name, sizes and dtypes checked before anything is built; a malformed
message is a ``WireError``, which the checks turn into a failure. The grader may send the kernel things
that are not data (a course module to hand to the learner's code): those travel as pickles, and only
the kernel, which the grader does not trust anyway, unpickles them. What the grader lends (a stand-in,
``lent``) travels as ``{"t": "lent", ...}``, which only the kernel reads.
"""

import base64
import binascii
import builtins
import json
import math
import pickle
from collections.abc import Callable, Iterator

import safetensors
import safetensors.torch
import torch

MAX_BYTES = 64 * 2**20  # the largest message either side reads
MAX_DEPTH = 32
MAX_TEXT = 2_000  # longest string taken from the kernel (type names, exception messages)
DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.float16, torch.bfloat16, torch.float32, torch.float64)
}


class WireError(ValueError):
    """A message that is not what the protocol allows."""


class RemoteError(Exception):
    """The other side's code raised an exception that is not one of Python's own."""

    def __init__(self, type_name: str, message: str):
        super().__init__(message)
        self.type_name = type_name


# Exceptions raised on the other side come back under their own class when it is one of Python's,
# so that a check's ``except NotImplementedError`` means the same in both places.
BUILTIN_EXCEPTIONS = {
    name: cls for name, cls in vars(builtins).items()
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, Warning)
}


def exception(raised) -> Exception:
    """The exception a ``{"raised": [type, message]}`` reply describes."""
    if not (isinstance(raised, (list, tuple)) and len(raised) == 2 and all(isinstance(s, str) for s in raised)):
        return WireError("a malformed exception")
    type_name, message = raised
    cls = BUILTIN_EXCEPTIONS.get(type_name)
    try:
        return cls(message) if cls is not None else RemoteError(type_name, message)
    except TypeError:  # a built-in that takes more than a message (UnicodeDecodeError takes five arguments)
        return RemoteError(type_name, message)


def encode(value, handle: Callable[[object], dict | None] | None = None, pickles: bool = False) -> str:
    """The JSON text for ``value``.

    ``handle(obj)`` describes an object that is not data (a handle), or returns None; with ``pickles``
    the objects it does not describe are pickled (the grader's side, sending to the kernel).
    """
    tensors: dict[str, torch.Tensor] = {}
    seen: dict[int, str] = {}  # the same tensor twice is sent once, so aliasing survives the trip

    def tensor(x: torch.Tensor) -> dict:
        key = seen.get(id(x))
        if key is None:
            key = seen[id(x)] = str(len(tensors))
            tensors[key] = x.detach().to("cpu", copy=True).contiguous()
        node = {"t": "tensor", "k": key, "device": str(x.device)}
        if type(x) is torch.nn.Parameter:
            node["parameter"] = True
        elif x.requires_grad:  # whether a result is still connected to the learner's graph is part of the answer
            node["grad"] = True
        return node

    def walk(x, depth: int):
        if depth > MAX_DEPTH:
            raise WireError(f"nested more than {MAX_DEPTH} deep")
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"t": "float", "v": repr(x)}
        if type(x) in (torch.Tensor, torch.nn.Parameter) and str(x.dtype).removeprefix("torch.") in DTYPES:
            if x.device.type == "meta":  # shape-only: no values to send
                return {"t": "meta", "shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")}
            return tensor(x)
        if isinstance(x, torch.dtype):
            return {"t": "dtype", "v": str(x).removeprefix("torch.")}
        if isinstance(x, torch.device):
            return {"t": "device", "v": str(x)}
        if type(x) in (tuple, list):
            return {"t": type(x).__name__, "v": [walk(item, depth + 1) for item in x]}
        if isinstance(x, dict) and all(isinstance(k, (str, int)) for k in x):
            return {"t": "dict", "v": [[k, walk(v, depth + 1)] for k, v in x.items()]}
        if isinstance(x, Iterator):  # named_parameters() and the like: a list of what they yield
            return {"t": "list", "v": [walk(item, depth + 1) for item in x]}
        node = handle(x) if handle is not None else None
        if node is None and pickles:
            node = {"t": "pickle", "v": pickled(x)}
        if node is None:
            raise WireError(f"cannot send a {type(x).__name__}")
        return node

    tree = walk(value, 0)
    blob = safetensors.torch.save(tensors) if tensors else b""
    return json.dumps({"tree": tree, "tensors": base64.b64encode(blob).decode()})


def pickled(x) -> str:
    """``x`` pickled, as text: how the grader sends what is not data (only the kernel unpickles it)."""
    return base64.b64encode(pickle.dumps(x)).decode()


def decode(text: str, handle: Callable[[dict], object], unpickle: Callable[[bytes], object] | None = None):
    """The value in ``text``; ``handle(node)`` turns an object node into the receiver's object.

    Without ``unpickle`` (the grader reading the kernel) pickles are refused, strings are cut short,
    and every size, dtype and reference is checked first.
    """
    trusted = unpickle is not None
    if not isinstance(text, str) or len(text) > MAX_BYTES * 4 // 3 + 1024:
        raise WireError("message missing or larger than the limit")
    try:
        message = json.loads(text)
        blob = base64.b64decode(message["tensors"], validate=True)
        tree = message["tree"]
    except (ValueError, KeyError, TypeError, RecursionError, binascii.Error) as exc:
        raise WireError(f"not a message ({type(exc).__name__})") from None
    tensors = _tensors(blob)

    def walk(node, depth: int):
        if depth > MAX_DEPTH:
            raise WireError(f"nested more than {MAX_DEPTH} deep")
        if node is None or isinstance(node, (bool, int, float)):
            return node
        if isinstance(node, str):
            return node if trusted else node[:MAX_TEXT]
        if not isinstance(node, dict) or not isinstance(node.get("t"), str):
            raise WireError("malformed value")
        kind, value = node["t"], node.get("v")
        if kind in ("tuple", "list") and isinstance(value, list):
            items = [walk(item, depth + 1) for item in value]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict" and isinstance(value, list):
            pairs = [(k, walk(v, depth + 1)) for k, v in (_pair(p) for p in value)]
            return dict(pairs)
        if kind == "tensor":
            return _tensor(node, tensors)
        if kind == "float" and value in ("nan", "inf", "-inf"):
            return float(value)
        if kind == "dtype" and value in DTYPES:
            return DTYPES[value]
        if kind == "device" and isinstance(value, str):
            return _device(value, meta=True)
        if kind == "meta" and node.get("dtype") in DTYPES and _is_shape(node.get("shape")):
            return torch.empty(node["shape"], dtype=DTYPES[node["dtype"]], device="meta")
        if kind == "pickle" and trusted:
            return unpickle(base64.b64decode(value))
        if kind in ("object", "ref") or (kind == "lent" and trusted):
            return handle(node)
        raise WireError(f"unknown value kind {kind[:40]!r}")

    return walk(tree, 0)


def _pair(item) -> tuple:
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))):
        raise WireError("malformed dict entry")
    return item[0], item[1]


def _tensors(blob: bytes) -> dict[str, torch.Tensor]:
    if not blob:
        return {}
    try:
        return safetensors.torch.load(blob)
    except (safetensors.SafetensorError, ValueError, TypeError, OverflowError) as exc:
        raise WireError(f"unreadable tensors ({exc})") from None


def _tensor(node: dict, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    key = node.get("k")
    if key not in tensors:
        raise WireError("reference to a tensor that was not sent")
    tensor = tensors[key].to(_device(node.get("device")))
    if node.get("parameter") is True:
        return torch.nn.Parameter(tensor, requires_grad=False)
    return tensor.detach().requires_grad_() if node.get("grad") is True and tensor.is_floating_point() else tensor


def _device(text, meta: bool = False) -> torch.device:
    """A device this process has (cpu, cuda); ``meta`` too where no values live on it."""
    try:
        device = torch.device(text)
    except (RuntimeError, TypeError):
        raise WireError(f"unknown device {str(text)[:40]!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise WireError("a tensor on a GPU this machine does not have")
    if device.type not in ("cpu", "cuda") + (("meta",) if meta else ()):
        raise WireError(f"tensors on {device.type} are not sent")
    return device


def _is_shape(shape) -> bool:
    return isinstance(shape, list) and len(shape) <= 16 and all(type(n) is int and 0 <= n < 2**40 for n in shape)
