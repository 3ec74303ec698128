"""The shared steps of every check, on their own."""

import pickle
from dataclasses import dataclass

import pytest
import torch

from autograde_tests.checks.harness import (
    ON_A_FIXED_DEVICE,
    ChangedInput,
    CheckFailed,
    EditDoesNotApply,
    Mistake,
    OnAFixedDevice,
    call,
    edited,
    fail,
    fail_difference,
    matching_mistake,
    name_the_mistake,
    run_cases,
    seed_for,
)

from .conftest import fails


def clashes_with_the_gpu(x):
    raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")


def test_call_names_a_device_clash_as_a_tensor_made_on_a_fixed_device():
    with fails(ON_A_FIXED_DEVICE, hint=r"device=<input>\.device", verdict=OnAFixedDevice):
        call("f", clashes_with_the_gpu, 1)


def test_call_reports_any_other_error_with_its_arguments():
    with fails(r"^raised ZeroDivisionError: .*\n  when called with \(1\)", exercise="f") as failure:
        call("f", lambda x: x / 0, 1)
    assert failure.value.raised == "ZeroDivisionError"


@dataclass(frozen=True)
class Case:
    shape: tuple
    eps: float


def test_a_failure_in_a_case_states_the_case_between_the_problem_and_the_hint():
    def check_case(i, case, device, dtype):
        if dtype == torch.float64:
            fail("f", "wrong", "fix it")

    with fails(exercise="f") as failure:
        run_cases("f", [Case((3, 4), 0.1)], check_case)
    found = failure.value
    assert (found.problem, found.case, found.hint) == ("wrong", "shape=(3, 4), eps=0.1; float64 on cpu", "fix it")


def test_a_verdict_renders_its_fields_in_the_order_a_learner_reads_them():
    verdict = CheckFailed("f", "wrong\n  when called with (3,)", "fix it", case="shape=(3,)")
    assert verdict.render() == str(verdict) == "f: wrong\n  when called with (3,)\n  case: shape=(3,)\nHint: fix it"
    assert CheckFailed("f", "wrong").render() == "f: wrong"


def test_a_verdict_survives_pickling_with_its_fields():
    verdict = ChangedInput("f", "changed", "copy it", case="c", raised="ValueError", numbers={"error": 0.5},
                           learner_frames=["  line 1"])
    again = pickle.loads(pickle.dumps(verdict))
    assert type(again) is ChangedInput and again.render() == verdict.render()
    assert (again.raised, again.numbers, again.learner_frames) == ("ValueError", {"error": 0.5}, ["  line 1"])


def test_a_difference_quotes_its_numbers_as_data():
    expected = torch.zeros(2, 3, dtype=torch.float64)
    actual = expected.clone()
    actual[1, 2] = 0.5
    with fails("^the output and the reference differ:\n  largest error 0.5 at index \\(1, 2\\)") as failure:
        fail_difference("f", "the output", actual, expected)
    assert failure.value.numbers == {"error": 0.5, "index": (1, 2), "got": 0.5, "expected": 0.0}


def test_a_failure_in_a_case_keeps_its_kind_and_the_learners_frames():
    def check_case(i, case, device, dtype):
        fail("f", "changed its input", frames=["  line 1"], verdict=ChangedInput)

    with fails(verdict=ChangedInput) as failure:
        run_cases("f", [Case((2,), 1e-6)], check_case)
    assert failure.value.learner_frames == ["  line 1"]
    assert failure.value.case == "shape=(2,), eps=1e-06; float32 on cpu"


def scaled(x, factor=2.0):
    return x * factor  # the one place it scales


@pytest.mark.parametrize("old", ["x / factor", "x"])  # missing; more than once
def test_an_edit_that_does_not_hold_exactly_once_fails_loudly(old):
    with pytest.raises(EditDoesNotApply):
        edited(scaled, (old, "x"))


def test_an_edit_computes_the_mistaken_code_and_leaves_the_original_alone():
    assert edited(scaled, ("x * factor", "x + factor"))(1.0) == 3.0
    assert scaled(1.0) == 2.0


def test_run_cases_prepares_each_case_once_whatever_the_device_and_dtype(capsys):
    prepared, seen = [], []

    def prepare(i, case):
        prepared.append(i)
        return f"built {i}"

    run_cases("f", [Case((2,), 0.1), Case((3,), 0.2)], lambda i, case, device, dtype, built: seen.append(built),
              prepare=prepare)
    assert prepared == [0, 1] and set(seen) == {"built 0", "built 1"}
    assert "✔ f: all" in capsys.readouterr().out


def test_run_cases_on_the_cpu_only_runs_and_counts_the_cpu_alone(capsys):
    where = []
    run_cases("f", [Case((2,), 0.1)], lambda i, case, device, dtype: where.append(device.type), cpu_only=True)
    assert set(where) == {"cpu"} and "(cpu;" in capsys.readouterr().out


def test_run_cases_without_dtypes_runs_each_case_once_and_claims_no_device_nor_dtype(capsys):
    seen = []
    run_cases("f", [Case((2,), 0.1)], lambda i, case, device, dtype: seen.append((device.type, dtype)), dtypes=())
    assert seen == [("cpu", None)] and capsys.readouterr().out == "✔ f: all 1 cases passed\n"
    with fails(exercise="f") as failure:
        run_cases("f", [Case((2,), 0.1)], lambda i, case, device, dtype: fail("f", "wrong", "fix it"), dtypes=())
    found = failure.value
    assert (found.problem, found.case, found.hint) == ("wrong", "shape=(2,), eps=0.1", "fix it")


WRONG_SIGN = Mistake("the sign is flipped", "negate", lambda x: -x)
DOUBLED = Mistake("doubled", "halve", lambda x: 2 * x)


def made(x, *mistakes):
    return [(m, m.compute(x)) for m in mistakes]


def test_the_matcher_names_the_mistake_within_tolerance_and_none_otherwise():
    x = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    assert matching_mistake(-x + 1e-13, made(x, DOUBLED, WRONG_SIGN)) is WRONG_SIGN
    assert matching_mistake(x + 1, made(x, DOUBLED, WRONG_SIGN)) is None


def test_an_exact_match_takes_every_element_as_it_is():
    mask = torch.tensor([True, False, True])
    inverted = Mistake("inverted", "flip", lambda m: ~m)
    assert matching_mistake(~mask, made(mask, inverted), exact=True) is inverted
    assert matching_mistake(mask, made(mask, inverted), exact=True) is None


def test_aligned_results_match_where_a_mistake_changed_the_shape():
    stops_early = Mistake("stops early", "go on", lambda ids: ids[:2])
    padded = lambda actual, result: (actual, torch.cat([result, result.new_full((len(actual) - len(result),), 9)]))
    ids = torch.tensor([4, 5, 6])
    assert matching_mistake(torch.tensor([4, 5, 9]), made(ids, stops_early), exact=True, align=padded) is stops_early


def test_when_no_mistake_matches_the_checks_own_diagnosis_comes_before_the_difference():
    x = torch.ones(3, dtype=torch.float64)
    with fails("^the check's own diagnosis", exercise="f"):
        name_the_mistake("f", "the output", x + 0.5, x, made(x, DOUBLED),
                         otherwise=lambda: fail("f", "the check's own diagnosis"))
    with fails("^the output and the FFN it was built from differ", exercise="f"):
        name_the_mistake("f", "the output", x + 0.5, x, made(x, DOUBLED), against="the FFN it was built from")


def test_every_check_and_purpose_draws_from_a_seed_of_its_own_the_same_in_every_process():
    seeds = {seed_for(name, hidden, *purpose) for name in ("GPT", "RMSNorm") for hidden in (False, True)
             for purpose in ((), (0,), (1,), (0, "weights"))}
    assert len(seeds) == 16
    assert seed_for("GPT", True, 0, "weights") == seed_for("GPT", True, 0, "weights") == 3358079525
