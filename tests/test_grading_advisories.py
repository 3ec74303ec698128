"""Advisory notes name what a submission's code does, where it does it, and say nothing of plain code."""

from pathlib import Path

import nbformat
import pytest

from autograde_tests import nbgrader_course
from autograde_tests.grading.advisories import advisories

REPO = Path(__file__).resolve().parents[1]


def test_plain_code_gets_no_note():
    assert advisories(["import torch\nx = torch.randn(3)\nprint(x.softmax(-1))", "%timeit x.sum()"]) == []


def test_each_kind_of_access_is_noted_once_with_where_it_first_happens():
    notes = advisories([
        "print(1)",
        "data = open('notes.txt').read()\nimport subprocess\nsubprocess.run(['ls'])\nimport socket",
        "import sys\nsys.modules['torch']\n!ls",
    ])
    assert notes == [
        "reads or writes files: `open` in learner cell 2, line 1",
        "starts processes or shell commands: `subprocess` in learner cell 2, line 2",
        "reaches the interpreter's internals (sys.modules, builtins, frames, ctypes, the IPython shell): "
        "`sys.modules` in learner cell 3, line 2",
        "opens network connections: `socket` in learner cell 2, line 4",
    ]


def test_a_cell_that_is_not_python_is_skipped():
    assert advisories(["def broken(:\n    open('x')"]) == []


def test_code_that_can_rewrite_a_check_s_stand_ins_is_noted():
    for source, what in [
        ("import autograde_tests.checks.stand_in_models as s", "autograde_tests.checks.stand_in_models"),
        ("from autograde_tests.checks import stand_in_models", "autograde_tests.checks"),
        ("def greedy_decode(model, src):\n    setattr(type(model), 'decode', None)", "setattr"),
        ("def f(model):\n    model.__class__.decode = None", "model.__class__"),
    ]:
        (note,) = advisories([source])
        assert (note.startswith("reaches the course's grading package or rewrites classes at run time")
                and f"`{what}`" in note)


@pytest.mark.parametrize("chapter", nbgrader_course.chapters(REPO))
def test_the_course_s_own_answers_get_no_note(chapter):
    """The learner's cells of a solved notebook: every cell nbgrader does not lock."""
    notebook = nbformat.read(REPO / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    cells = [c.source for c in notebook.cells
             if c.cell_type == "code" and not c.metadata.get("nbgrader", {}).get("locked")]
    assert advisories(cells) == []  # no honest answer of ours carries a note to every learner's grade
