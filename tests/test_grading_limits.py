"""One table of the grader's bounds (``grading.limits``): every bound resolves, those kept in remote/ and the
exchange included, and what reads a default reads it from there, nbgrader's configuration among them."""

import dataclasses
import subprocess
import sys
from pathlib import Path

from autograde_tests import nbgrader_course
from autograde_tests.grading import batch, limits

REPO = Path(__file__).resolve().parents[1]


def test_every_bound_resolves_to_a_number_and_only_swap_is_zero():
    table = limits.table()
    assert {name for name, value in table.items() if value == 0} == {"SWAP_BYTES"}
    assert all(isinstance(value, (int, float)) and value >= 0 for value in table.values()), table
    assert {f"{module.rsplit('.', 1)[1]}.{name}" for name, module in limits.ELSEWHERE.items()} <= set(table)


def test_a_frame_holds_a_reply_and_a_reply_the_longest_text_of_the_wire():
    from autograde_tests.remote import wire

    assert wire.MAX_BYTES * 4 // 3 < limits.REPLY_BYTES < limits.FRAME_BYTES
    assert limits.NOTEBOOK_BYTES > limits.SIMILARITY_NOTEBOOK_BYTES


def test_the_coordinator_and_a_relay_load_neither_torch_nor_the_wire_to_read_their_bounds():
    """The wire's bounds are read on first use: a relay is capped at ``RELAY_BASE_BYTES`` of address space."""
    code = ("import sys; import autograde_tests.grading.__main__, autograde_tests.grading.relay; "
            "print(sorted(m for m in ('torch', 'autograde_tests.remote.wire') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]", run.stdout


def test_the_defaults_are_the_tables():
    from autograde_tests.grading.execute import GraderExecute

    settings = {f.name: f.default for f in dataclasses.fields(batch.Settings)}
    assert settings["worker_patience"] == limits.WORKER_PATIENCE_SECONDS
    assert settings["similarity"] == limits.SIMILARITY_THRESHOLD
    assert GraderExecute.output_bytes.default_value == limits.OUTPUT_BYTES
    assert GraderExecute.iopub_timeout.default_value == limits.IOPUB_SECONDS
    assert nbgrader_course.config(REPO).ExecutePreprocessor.timeout == limits.CELL_SECONDS


def test_make_grade_says_its_defaults_from_the_table():
    run = subprocess.run([sys.executable, "-m", "autograde_tests.grading", "--help"], capture_output=True, text=True,
                         check=True)
    shown = " ".join(run.stdout.split())
    for option, value in [("--timeout", limits.SUBMISSION_SECONDS), ("--cell-timeout", limits.CELL_SECONDS),
                          ("--memory", f"{limits.MEMORY_BYTES / 2**30:g}"), ("--output", limits.OUTPUT_BYTES),
                          ("--wait-for-workers", limits.WORKER_PATIENCE_SECONDS),
                          ("--similarity", limits.SIMILARITY_THRESHOLD)]:
        after = shown.split(f" {option} ", 1)[1]
        assert f"(default: {value})" in after.split(" --", 1)[0], (option, after[:200])
    assert "--output BYTES bytes of messages" in shown
