"""A graded test cell judged by the grader: its checks run here on proxies; the verdict is the cell's only
output; whatever goes wrong while judging is a failure, never a pass; every test cell of the course is
check calls only."""

from pathlib import Path

import nbformat
import pytest
import torch

from autograde_tests import nbgrader_course
from autograde_tests.grading import judge
from autograde_tests.remote.proxy import Session

from .loopback import Loopback
from .test_01_attention_checks import softmax_amax

REPO = Path(__file__).resolve().parents[1]
CELL = "from autograde_tests.checks import check_softmax\n\ncheck_softmax(softmax)\ncheck_softmax(softmax, hidden=True)"


def session(**learner) -> Session:
    loop = Loopback()
    loop.agent.namespace.update(learner)
    return Session(loop)


def test_a_test_cell_is_read_as_its_check_calls():
    assert judge.check_calls(CELL) == [judge.CheckCall("check_softmax", ("softmax",), {}),
                                       judge.CheckCall("check_softmax", ("softmax",), {"hidden": True})]


@pytest.mark.parametrize("source", ["check_softmax(softmax)\nprint('hi')", "check_softmax(lambda x: x)",
                                    "import os", "check_softmax(softmax, hidden=not False)"])
def test_a_test_cell_with_anything_else_is_the_course_s_fault(source):
    with pytest.raises(judge.NotACheckCell):
        judge.check_calls(source)


def test_every_test_cell_of_every_chapter_is_check_calls_only():
    for chapter in nbgrader_course.chapters(REPO):
        notebook = nbformat.read(REPO / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
        cells = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"]
        assert cells and all(judge.check_calls(c.source) for c in cells), chapter


def test_a_correct_answer_gets_the_pass_lines_only():
    outputs = judge.judge(CELL, session(softmax=softmax_amax))
    assert [o.output_type for o in outputs] == ["stream"] and outputs[0].text.count("✔ softmax") == 2


def test_a_wrong_answer_gets_the_check_s_message_as_one_short_error():
    outputs = judge.judge(CELL, session(softmax=lambda x, dim=-1: softmax_amax(x, 0)))
    assert outputs[-1].output_type == "error" and outputs[-1].ename == "AssertionError"
    assert outputs[-1].evalue.startswith("softmax: normalises over dim 0")
    assert outputs[-1].traceback == [f"AssertionError: {outputs[-1].evalue}"]


def test_a_missing_answer_is_a_name_error():
    assert judge.judge(CELL, session())[-1].ename == "NameError"


def test_anything_else_that_goes_wrong_while_judging_fails_the_cell():
    broken = Session(lambda request: "not a reply")
    (output,) = judge.judge(CELL, broken)
    assert output.output_type == "error" and "could not judge" in output.evalue


def test_a_learner_object_that_is_not_what_the_check_expects_fails_it():
    outputs = judge.judge(CELL, session(softmax=torch.ones(3)))
    assert outputs[-1].output_type == "error"
