"""The shared steps of every check, on their own."""

import pytest

from autograde_tests.checks.harness import ON_A_FIXED_DEVICE, call


def clashes_with_the_gpu(x):
    raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")


def test_call_names_a_device_clash_as_a_tensor_made_on_a_fixed_device():
    with pytest.raises(AssertionError, match=ON_A_FIXED_DEVICE) as failure:
        call("f", clashes_with_the_gpu, 1)
    assert "device=<input>.device" in str(failure.value)


def test_call_reports_any_other_error_with_its_arguments():
    with pytest.raises(AssertionError, match=r"f: raised ZeroDivisionError: .*\n  when called with \(1\)"):
        call("f", lambda x: x / 0, 1)
