"""Every independent answer passes its chapter's checks, visible and hidden, as the notebook's test cells call them."""

import importlib
import pkgutil
import re
from pathlib import Path

import nbformat
import pytest

import tests.independent_answers as independent
from autograde_tests import nbgrader_course

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = Path(__file__).resolve().parents[1]
MODULES = sorted(m.name for m in pkgutil.iter_modules(independent.__path__))
HIDDEN_MARKERS = re.compile(r"^\s*### (BEGIN|END) HIDDEN TESTS\s*\n", re.MULTILINE)


def chapter_of(module_name: str) -> str:
    number = module_name.removeprefix("ch")[:2]
    return next(c for c in nbgrader_course.chapters(REPO) if c.startswith(number))


def graded_cells(chapter: str) -> list[str]:
    """The instructor notebook's autograded test cells, hidden tests included: what the grader runs."""
    notebook = nbformat.read(REPO / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    return [HIDDEN_MARKERS.sub("", c.source) for c in notebook.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")]


@pytest.mark.parametrize("name", MODULES)
def test_an_independent_answer_passes_every_check_of_its_chapter(name, capsys):
    module = importlib.import_module(f"{independent.__name__}.{name}")
    cells = graded_cells(chapter_of(name))
    for cell in cells:
        exec(cell, dict(vars(module)))  # noqa: S102 (the course's own test cells)
    out = capsys.readouterr().out
    assert out.count("✔") == 2 * len(cells), out


@pytest.mark.parametrize("chapter", nbgrader_course.chapters(REPO))
def test_every_chapter_has_five_independent_answers(chapter):
    assert sum(chapter_of(name) == chapter for name in MODULES) >= 5
