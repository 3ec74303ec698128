"""The wire between grader and kernel: what goes in comes out, and what a hostile kernel sends is refused
with a WireError, never executed and never a crash."""

import base64
import json
import math
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from autograde_tests.remote import wire


def no_handles(node):
    raise AssertionError(f"unexpected handle {node}")


def from_kernel(value):
    """Encode as the kernel does, decode as the grader does (no pickles, strings cut short)."""
    return wire.decode(wire.encode(value), handle=no_handles)


@pytest.mark.parametrize("dtype", list(wire.DTYPES.values()))
def test_a_tensor_of_every_dtype_comes_back_equal(dtype):
    x = (torch.arange(12) % 3).reshape(3, 4).to(dtype)
    back = from_kernel(x)
    assert type(back) is torch.Tensor and back.dtype == dtype and torch.equal(back, x)


def test_shapes_aliasing_parameters_grad_and_meta_survive():
    x = torch.randn(2, 0, 3)
    shared = torch.randn(4)
    value = {"empty": x, "pair": (shared, shared), "p": torch.nn.Parameter(torch.ones(2)),
             "graph": torch.ones(2, requires_grad=True) * 2, "meta": torch.empty(5, 6, device="meta")}
    back = from_kernel(value)
    assert back["empty"].shape == (2, 0, 3)
    assert back["pair"][0].data_ptr() == back["pair"][1].data_ptr()
    assert type(back["p"]) is torch.nn.Parameter
    assert back["graph"].requires_grad and not from_kernel(torch.ones(2)).requires_grad
    assert back["meta"].is_meta and back["meta"].shape == (5, 6)


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=20))
def test_plain_values_come_back_as_they_were(value):
    assert from_kernel(value) == value


def test_non_finite_floats_come_back():
    back = from_kernel([math.inf, -math.inf, math.nan])
    assert back[0] == math.inf and back[1] == -math.inf and math.isnan(back[2])


def test_an_object_that_is_not_data_becomes_a_handle():
    seen = []
    text = wire.encode({"f": print}, handle=lambda obj: seen.append(obj) or {"t": "object", "id": 7})
    assert seen == [print]
    assert wire.decode(text, handle=lambda node: ("handle", node["id"])) == {"f": ("handle", 7)}


def message(tree, tensors: bytes = b"") -> str:
    return json.dumps({"tree": tree, "tensors": base64.b64encode(tensors).decode()})


HOSTILE = {
    "not json": "{",
    "not a dict": json.dumps([1, 2]),
    "bad base64": json.dumps({"tree": None, "tensors": "***"}),
    "garbage tensors": message(None, b"\xff" * 64),
    "nested past json's recursion": '{"tree": ' + "[" * 100_000 + "]" * 100_000 + ', "tensors": ""}',
    "unknown kind": message({"t": "eval", "v": "__import__('os')"}),
    "a pickle": message({"t": "pickle", "v": base64.b64encode(pickle.dumps(print)).decode()}),
    "a tensor never sent": message({"t": "tensor", "k": "0", "device": "cpu"}),
    "a tensor on a device not here": message({"t": "device", "v": "xla"}),
    "an absurd meta shape": message({"t": "meta", "shape": [-1], "dtype": "float32"}),
    "a dict with an unhashable key": message({"t": "dict", "v": [[[1], 2]]}),
    "too large": "x" * (wire.MAX_BYTES * 2),
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_message_is_refused_with_a_wire_error(text):
    with pytest.raises(wire.WireError):
        wire.decode(text, handle=no_handles)


def test_nesting_deeper_than_the_limit_is_refused():
    tree = None
    for _ in range(wire.MAX_DEPTH + 2):
        tree = {"t": "list", "v": [tree]}
    with pytest.raises(wire.WireError):
        wire.decode(message(tree), handle=no_handles)


def test_long_strings_from_the_kernel_are_cut_short():
    assert len(from_kernel("x" * 10 * wire.MAX_TEXT)) == wire.MAX_TEXT


def test_only_the_kernel_side_unpickles_what_the_grader_sends():
    text = wire.encode({"fn": torch.zeros_like}, pickles=True)
    assert wire.decode(text, handle=no_handles, unpickle=pickle.loads)["fn"] is torch.zeros_like
    with pytest.raises(wire.WireError):
        wire.decode(text, handle=no_handles)
