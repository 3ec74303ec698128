"""The committed notebooks follow the course's rules: no outputs, one layout, graded cells with hidden tests."""

from pathlib import Path

import nbformat
import pytest

from autograde_tests import course

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = course.chapters(REPO)
NOTEBOOKS = sorted(REPO.glob("solutions/*/*.ipynb")) + sorted(REPO.glob("notebooks/*/*.ipynb"))


def nbgrader_cells(notebook):
    return [c for c in notebook.cells if "nbgrader" in c.metadata]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(REPO)))
def test_committed_notebook_has_no_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    dirty = [c.id for c in notebook.cells if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_has_one_notebook_named_after_it_in_solutions_and_release(chapter):
    for folder in ("solutions", "notebooks"):
        assert [p.name for p in (REPO / folder / chapter).glob("*.ipynb")] == [f"{chapter}.ipynb"]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_exercise_has_a_graded_test_cell_with_hidden_tests(chapter):
    notebook = nbformat.read(REPO / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    cells = nbgrader_cells(notebook)
    grade_ids = [c.metadata.nbgrader["grade_id"] for c in cells]
    assert len(grade_ids) == len(set(grade_ids)), "grade ids must be unique"
    solutions = [c.metadata.nbgrader["grade_id"] for c in cells if c.metadata.nbgrader.get("solution")]
    tests = {c.metadata.nbgrader["grade_id"]: c for c in cells if c.metadata.nbgrader.get("grade")}
    for solution in solutions:
        test = tests.get(f"test_{solution}")
        assert test is not None, f"exercise {solution!r} has no graded cell 'test_{solution}'"
        assert test.metadata.nbgrader["locked"] and test.metadata.nbgrader["points"] > 0
        assert "### BEGIN HIDDEN TESTS" in test.source and "hidden=True" in test.source
