"""The shared steps of every check, on their own."""

from dataclasses import dataclass

import pytest
import torch

from autograde_tests.checks.harness import ON_A_FIXED_DEVICE, ChangedInput, EditDoesNotApply, call, edited, fail, run_cases


def clashes_with_the_gpu(x):
    raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")


def test_call_names_a_device_clash_as_a_tensor_made_on_a_fixed_device():
    with pytest.raises(AssertionError, match=ON_A_FIXED_DEVICE) as failure:
        call("f", clashes_with_the_gpu, 1)
    assert "device=<input>.device" in str(failure.value)


def test_call_reports_any_other_error_with_its_arguments():
    with pytest.raises(AssertionError, match=r"f: raised ZeroDivisionError: .*\n  when called with \(1\)"):
        call("f", lambda x: x / 0, 1)


@dataclass(frozen=True)
class Case:
    shape: tuple
    eps: float


def test_a_failure_in_a_case_states_the_case_between_the_problem_and_the_hint():
    def check_case(i, case, device, dtype):
        if dtype == torch.float64:
            fail("f", "wrong", "fix it")

    with pytest.raises(AssertionError) as failure:
        run_cases("f", [Case((3, 4), 0.1)], check_case)
    assert str(failure.value) == "f: wrong\n  case: shape=(3, 4), eps=0.1; float64 on cpu\nHint: fix it"


def test_a_failure_in_a_case_keeps_its_kind_and_the_learners_frames():
    def check_case(i, case, device, dtype):
        fail("f", "changed its input", frames=["  line 1"], verdict=ChangedInput)

    with pytest.raises(ChangedInput) as failure:
        run_cases("f", [Case((2,), 1e-6)], check_case)
    assert failure.value.learner_frames == ["  line 1"]
    assert str(failure.value).endswith("case: shape=(2,), eps=1e-06; float32 on cpu")


def scaled(x, factor=2.0):
    return x * factor  # the one place it scales


@pytest.mark.parametrize("old", ["x / factor", "x"])  # missing; more than once
def test_an_edit_that_does_not_hold_exactly_once_fails_loudly(old):
    with pytest.raises(EditDoesNotApply):
        edited(scaled, (old, "x"))


def test_an_edit_computes_the_mistaken_code_and_leaves_the_original_alone():
    assert edited(scaled, ("x * factor", "x + factor"))(1.0) == 3.0
    assert scaled(1.0) == 2.0
