"""What a check lends the learner's code stays the grader's: the kernel's calls on it run in the grader, which
keeps its own record of them, so the rules read from that record earn points in a graded run too.

``graded`` stands for the sandboxed kernel as in ``test_kernel_reported_rules``: a loopback to an agent in
this process, whose calls on a lent object reach the grader's session only through the wire.
"""

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from autograde_tests.checks import check_generate, check_sublayer_connection
from autograde_tests.grading.static_names import StaticNames
from autograde_tests.remote import lent, wire
from autograde_tests.remote.proxy import lend

from .conftest import connected, fails, kernel_stand_in
from .loopback import Loopback
from .test_04_ffn_layernorm_residual_checks import CallingTheSublayerTwice
from .test_06_decoder_only_checks import make_generate

pytestmark = pytest.mark.usefixtures("one_thread")


def graded(value, chapter: str):
    kernel = kernel_stand_in(chapter)
    kernel.namespace["answer"] = value
    return connected(kernel, static_names=StaticNames([""])).lookup("answer")


class Recording(nn.Module):
    """A stand-in that keeps, in the grader, the shapes it was called with."""

    def __init__(self):
        super().__init__()
        self.linear, self.seen = nn.Linear(3, 3), []

    def forward(self, x):
        self.seen.append(tuple(x.shape))
        return self.linear(x)

    def encode(self, x):
        return 2 * x


def learner(value):
    return Loopback().expose("fn", value)


# ------------------------------------------------------------------------------------ the mechanism


def test_a_lent_module_runs_in_the_grader_which_records_every_call():
    fn = learner(lambda model, x: (model(x), model(x[:1]), model.encode(x)))
    model = Recording().double()
    x = torch.randn(2, 3, dtype=torch.float64)
    out, first, encoded = fn(lend(fn, model, "forward", "encode"), x)
    assert model.seen == [(2, 3), (1, 3)]
    torch.testing.assert_close(out, model.linear(x))
    torch.testing.assert_close(encoded, 2 * x)


def test_a_lent_module_follows_its_kernel_copy_to_another_dtype():
    fn = learner(lambda model, x: model.to(torch.float64)(x.double()))
    model = Recording()
    assert fn(lend(fn, model), torch.ones(1, 3)).dtype == torch.float64
    assert model.linear.weight.dtype == torch.float64


def test_a_copy_made_in_the_kernel_still_asks_the_grader():
    def copied(model, x):
        twin = copy.deepcopy(model)
        return twin(x), twin.encode(x)

    fn = learner(copied)
    model = Recording()
    out, encoded = fn(lend(fn, model, "forward", "encode"), torch.ones(2, 3))
    assert model.seen == [(2, 3)]
    torch.testing.assert_close(encoded, 2 * torch.ones(2, 3))


def test_a_result_needs_gradients_when_the_lent_module_s_would():
    loss = learner(lambda model, x: model(x).sum())
    assert loss(lend(loss, Recording()), torch.ones(1, 3)).requires_grad
    with torch.no_grad():
        assert not loss(lend(loss, Recording()), torch.ones(1, 3)).requires_grad


@given(st.lists(st.floats(-3, 3), min_size=1, max_size=6))
def test_gradients_flow_back_through_a_lent_function(values):
    def grad_through(f, x):
        x = x.detach().requires_grad_()
        f(3 * x).sum().backward()
        return x.grad

    fn = learner(grad_through)
    x = torch.tensor(values, dtype=torch.float64)
    torch.testing.assert_close(fn(lend(fn, torch.sin), x), 3 * torch.cos(3 * x))


def test_a_call_on_what_was_not_lent_is_refused():
    lender = lent.Lender(remote=lambda node: node)
    model = Recording()
    lender.lend(model, ("forward",))
    asked = {"id": id(model), "method": "encode", "args": (torch.ones(1, 3),), "kwargs": {}}
    for message in (asked, asked | {"id": 1}, "not a call"):
        reply = wire.decode(lender.answer(wire.encode(message)), handle=None)
        assert reply["raised"][0] == "WireError", reply
    assert model.seen == []


@pytest.mark.parametrize("shape", [(1, lent.CALL_SIZE + 1), (128, 129)])
def test_a_call_larger_than_any_stand_in_needs_is_refused_before_the_grader_computes(shape):
    """A call runs in the grader, outside the sandbox: a stand-in layer's (T, T) average of a long input
    would make the grader hold what the kernel's cgroup would have bounded."""
    fn = learner(lambda model, x: model(x))
    model = Recording()
    with pytest.raises(ValueError, match="the grader's stand-in takes at most"):
        fn(lend(fn, model), torch.ones(shape))
    assert model.seen == []


def test_the_graphs_kept_for_the_kernel_s_backward_passes_are_bounded(monkeypatch):
    monkeypatch.setattr(lent, "GRAPH_BYTES", 1000)
    lender = lent.Lender(remote=lambda node: node)
    lender.lend(torch.sin, ("__call__",))
    for _ in range(20):
        x = torch.zeros(100, dtype=torch.float64).requires_grad_()
        lender.answer(wire.encode({"id": id(torch.sin), "method": "__call__", "args": (x,), "kwargs": {},
                                   "graph": True}))
    assert len(lender.graphs) == 1
    monkeypatch.setattr(lent, "GRAPH_BYTES", 2**30)
    for _ in range(3 * lent.GRAPHS):
        lender.answer(wire.encode({"id": id(torch.sin), "method": "__call__", "args": (x,), "kwargs": {},
                                   "graph": True}))
    assert len(lender.graphs) == lent.GRAPHS


# ------------------------------------------------------------------ the rules the grader's record decides


def test_a_sublayer_called_twice_fails_a_graded_run_by_the_grader_s_count():
    with fails("calls the sublayer 2 times"):
        check_sublayer_connection(graded(CallingTheSublayerTwice, "04_ffn_layernorm_residual"))


@pytest.mark.parametrize("hidden", [False, True])
def test_generate_without_the_cache_fails_a_graded_run_by_the_grader_s_record(hidden):
    with fails("use_cache=True but the model was given"):
        check_generate(graded(make_generate(use_the_cache=False), "06_decoder_only"), hidden=hidden)


def test_replacing_the_kernel_s_copy_of_the_model_changes_nothing_the_grader_records():
    """A cell that makes the kernel's copy answer as if cached, then generates without the cache: the calls
    still reach the grader's model, which sees every token fed."""

    def as_if_cached(model, idx, max_new_tokens, **options):
        model.lent.forward = lambda idx, cache=None: (torch.zeros(idx.size(0), idx.size(1), 9), cache)
        return make_generate(use_the_cache=False)(model, idx, max_new_tokens, **options)

    with fails("use_cache=True but the model was given"):
        check_generate(graded(as_if_cached, "06_decoder_only"))
