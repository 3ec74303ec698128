"""Proxies of the learner's objects behave as the objects would in-process: calls, attributes, items,
exceptions, in-place changes, torch's settings and random stream; and the kernel's settings survive."""

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

from autograde_tests.remote.proxy import (
    Session,
    is_a,
    is_module,
    make_in_kernel,
    run_in_kernel,
    type_name,
)
from autograde_tests.remote.wire import RemoteError

from .loopback import Loopback


class Odd(Exception):
    pass


def learner(**names):
    loop = Loopback()
    return [loop.expose(name, value) for name, value in names.items()]


def test_a_function_is_called_and_its_tensors_come_back():
    (add,) = learner(add=lambda a, b=1: a + b)
    assert torch.equal(add(torch.ones(2), b=torch.ones(2)), torch.full((2,), 2.0))


def test_a_class_makes_a_module_whose_attributes_items_and_methods_work():
    (Linear,) = learner(Linear=nn.Sequential)
    model = Linear(nn.Linear(3, 2), nn.ReLU())
    assert is_module(model) and is_a(model[0], nn.Linear) and not is_a(model[0], nn.Conv1d)
    assert type_name(model) == "Sequential" and len(model) == 2 and model[0].in_features == 3
    assert [type_name(m) for m in model] == ["Linear", "ReLU"]
    assert model.to(torch.float64) is not None and model[0].weight.dtype == torch.float64
    state = model.state_dict()
    model.load_state_dict({k: torch.zeros_like(v) for k, v in state.items()})
    assert torch.equal(model(torch.ones(1, 3, dtype=torch.float64)), torch.zeros(1, 2, dtype=torch.float64))
    twin = copy.deepcopy(model)
    twin[0].bias = nn.Parameter(torch.ones(2, dtype=torch.float64))
    assert torch.equal(model[0].bias, torch.zeros(2, dtype=torch.float64))


def test_exceptions_keep_python_s_own_classes_and_others_are_named():
    def raises(kind):
        raise kind("nope")

    (fn,) = learner(fn=raises)
    with pytest.raises(NotImplementedError):
        fn(NotImplementedError)
    with pytest.raises(RemoteError) as odd:
        fn(Odd)
    assert odd.value.type_name == "Odd"
    with pytest.raises(RemoteError) as leaving:
        fn(SystemExit)
    assert leaving.value.type_name == "SystemExit"


def test_a_built_in_exception_that_takes_more_than_a_message_comes_back_named():
    (fn,) = learner(fn=lambda data: data.decode("utf-8"))
    with pytest.raises(RemoteError, match="can't decode byte") as raised:
        fn(b"\xe2\x82")
    assert raised.value.type_name == "UnicodeDecodeError"


def test_a_name_the_learner_never_defined_is_a_name_error():
    with pytest.raises(NameError, match="not_there"):
        Session(Loopback()).lookup("not_there")


def test_an_input_changed_in_place_is_changed_here_too():
    def sneaky(x):
        x -= 1
        return x.sum()

    (fn,) = learner(fn=sneaky)
    x = torch.ones(3)
    fn(x)
    assert torch.equal(x, torch.zeros(3))


def test_the_grader_s_dtype_grad_mode_and_threads_apply_to_the_call_only():
    (probe,) = learner(probe=lambda: (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads()))
    saved = torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            torch.set_num_threads(1)
            assert probe() == (torch.float64, False, 1)
    finally:
        torch.set_default_dtype(torch.float32)
        torch.set_num_threads(saved)
    assert (torch.get_default_dtype(), torch.is_grad_enabled()) == (torch.float32, True)


def test_seeding_here_seeds_the_learner_s_draws_and_the_stream_goes_on():
    (draw,) = learner(draw=lambda: torch.rand(3))
    torch.manual_seed(5)
    first, second = draw(), draw()
    torch.manual_seed(5)
    assert torch.equal(first, torch.rand(3)) and torch.equal(second, torch.rand(3))


def test_course_functions_run_beside_the_learner_s_objects():
    (Model,) = learner(Model=nn.Linear)
    model = Model(2, 2)
    made = make_in_kernel(model, nn.Linear, 4, 1)
    assert is_a(made, nn.Linear) and made.in_features == 4
    assert is_a(run_in_kernel(copy.deepcopy, model), nn.Linear)
    assert run_in_kernel(nn.Linear.extra_repr, model) == "in_features=2, out_features=2, bias=True"


BLOCK_EVERY_CHAPTER = """
import importlib.abc, sys
class Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith("autograde_tests.reference."):
            raise ImportError(name)
sys.meta_path.insert(0, Hidden())
import autograde_tests.checks.in_kernel, autograde_tests.checks.harness, autograde_tests.checks.stand_in_models
import autograde_tests.remote.agent
"""


def test_what_runs_beside_the_learner_imports_without_any_chapter_s_reference():
    """A graded kernel lacks the graded chapter's reference (chapter 1's lacks them all)."""
    subprocess.run([sys.executable, "-c", BLOCK_EVERY_CHAPTER], check=True)
