"""The table of chapters (``autograde_tests.chapters``) is the course as it is: its chapters are the instructor
notebooks, each notebook's exercises and test cells are the table's names in its order, and the reference
and the checks export exactly those names."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograde_tests import nbgrader_course, reference
from autograde_tests.chapters import CHAPTERS, hidden_in_grading

REPO = Path(__file__).resolve().parents[1]
IMPORTED_CHECK = re.compile(r"^from autograde_tests\.checks import (check_\w+)$", re.MULTILINE)


def test_the_table_lists_the_instructor_notebooks_in_order():
    assert [chapter.id for chapter in CHAPTERS] == nbgrader_course.chapters(REPO)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.id)
def test_each_typical_mistake_edits_its_solution_cell(chapter):
    grade_id, correct, mistaken = chapter.typical_mistake
    notebook = nbformat.read(REPO / "solutions" / chapter.id / f"{chapter.id}.ipynb", as_version=4)
    cell = next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    assert cell.metadata.nbgrader.get("solution") and correct in cell.source and correct != mistaken


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.id)
def test_each_test_cell_calls_the_tables_checks_in_order(chapter):
    notebook = nbformat.read(REPO / "solutions" / chapter.id / f"{chapter.id}.ipynb", as_version=4)
    called = [name for cell in notebook.cells if cell.cell_type == "code"
              for name in IMPORTED_CHECK.findall(cell.source)]
    assert tuple(called) == chapter.checks


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.id)
def test_the_reference_and_the_checks_define_the_tables_names(chapter):
    solved = importlib.import_module(f"autograde_tests.reference.{chapter.module}")
    checks = importlib.import_module(f"autograde_tests.checks.{chapter.module}")
    assert all(callable(getattr(solved, name)) for name in chapter.graded)
    assert all(callable(getattr(checks, name)) for name in chapter.checks)
    assert set(chapter.graded) <= set(reference.__all__)


def test_a_chapter_hides_its_own_module_and_every_later_one():
    modules = [chapter.module for chapter in CHAPTERS]
    for i, chapter in enumerate(CHAPTERS):
        assert hidden_in_grading(chapter.id) == hidden_in_grading(chapter.module) == modules[i:]


def test_a_chapters_marker_selects_the_tests_about_it_and_no_other():
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", "-m", "ch03",
                          "tests/test_notebooks.py", "tests/test_03_attention_variants_reference.py"],
                         cwd=REPO, capture_output=True, text=True, check=True)
    selected = [line for line in run.stdout.splitlines() if "::" in line]
    assert selected and all("03_attention_variants" in line or "test_03_" in line for line in selected), selected
