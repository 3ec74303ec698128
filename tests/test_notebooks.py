"""The committed notebooks follow the course's rules: no outputs, one layout, graded cells with hidden tests, and the
learners' release is what ``make release`` makes of the instructor notebooks, byte for byte."""

import filecmp
from pathlib import Path

import nbformat
import pytest

from autograde_tests import nbgrader_course, scratch_course
from autograde_tests.authoring import solution_regions

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = nbgrader_course.chapters(REPO)
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


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_solution_is_the_reference_s_code(chapter):
    """One source for each solution: each solution region holds the body of the reference's definition of the
    same name, and each solved definition takes the reference's parameters (``make release`` writes them)."""
    notebook = nbformat.read(REPO / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    module = solution_regions.reference_module(chapter)
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            assert nbgrader_course.region_owners(cell.source), cell.metadata.nbgrader["grade_id"]
            assert solution_regions.written_from_reference(cell.source, module) == cell.source
            assert solution_regions.signature_mismatches(cell.source, module) == []


def test_a_solution_that_drifted_from_the_reference_is_found_and_rewritten():
    module = solution_regions.reference_module("01_attention")
    drifted = ('def softmax(x, dim=-1):\n    """Softmax."""\n    ### BEGIN SOLUTION\n    return x.softmax(dim)\n'
               '    ### END SOLUTION')
    written = solution_regions.written_from_reference(drifted, module)
    assert "x.softmax(dim)" not in written and "torch.exp(" in written
    assert written.startswith('def softmax(x, dim=-1):\n    """Softmax."""\n    ### BEGIN SOLUTION\n')
    assert solution_regions.signature_mismatches(drifted.replace("dim=-1", "dim=0"), module) != []


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """Every chapter released by nbgrader (``nbgrader generate_assignment``, as ``make release`` does) in a
    scratch copy of the course."""
    root = scratch_course.scratch_course(REPO, tmp_path_factory.mktemp("course"))
    for chapter in CHAPTERS:
        scratch_course.release(root, chapter)
    return root


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_release_is_byte_for_byte_the_committed_notebook(released, chapter):
    generated, committed = released / "notebooks" / chapter, REPO / "notebooks" / chapter
    comparison = filecmp.dircmp(generated, committed)
    assert not comparison.left_only and not comparison.right_only, "notebooks/ is out of sync: run `make release`"
    for name in comparison.common_files:
        assert (generated / name).read_bytes() == (committed / name).read_bytes(), (
            f"notebooks/{chapter}/{name} is out of sync with solutions/: run `make release`"
        )
