"""The learner edition never contains solution code; the instructor edition shows every solved notebook.

"Solution code" is every function body of the reference implementation and every region between
``### BEGIN SOLUTION`` and ``### END SOLUTION`` in the instructor notebooks. A body leaks into a file
when all of its code lines appear there in order (comments and white space ignored), so a copy with
comments added or lines re-indented is still found.
"""

import ast
import html
import io
import re
import tokenize
from pathlib import Path

import nbformat
import pytest

import autograde_tests.reference
from autograde_tests import nbgrader_course

pytestmark = pytest.mark.book  # reads both built editions (make book, make book-instructor)

REPO = Path(__file__).resolve().parents[1]
LEARNER = REPO / "_build" / "html"
INSTRUCTOR = REPO / "_build" / "instructor" / "_build" / "html"
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
SOLUTION_REGION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.DOTALL)
TEXT_SUFFIXES = {".html", ".md", ".ipynb", ".txt", ".py", ".js"}


def code_lines(source: str) -> list[str]:
    """The lines of ``source`` without comments and white space, skipping the trivially short ones."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type != tokenize.COMMENT]
    lines = tokenize.untokenize(tokens).splitlines()
    return [squeezed for line in lines if len(squeezed := re.sub(r"\s+", "", line)) >= 12]


def reference_bodies() -> dict[str, list[str]]:
    bodies = {}
    for path in sorted(Path(autograde_tests.reference.__file__).parent.glob("*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef):
                body = node.body[1:] if ast.get_docstring(node) else node.body
                lines = code_lines("\n".join(ast.get_source_segment(source, s, padded=True) for s in body))
                if lines:
                    bodies[f"{path.stem}.{node.name}"] = lines
    return bodies


def solution_regions() -> dict[str, list[str]]:
    regions = {}
    for chapter in nbgrader_course.chapters(REPO):
        notebook = nbformat.read(REPO / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
        for cell in notebook.cells:
            for i, region in enumerate(SOLUTION_REGION.findall(cell.source)):
                lines = code_lines(re.sub(r"^[ \t]+", "", region, flags=re.MULTILINE))
                if lines:
                    regions[f"{chapter}:{cell.metadata['nbgrader']['grade_id']}[{i}]"] = lines
    return regions


def searchable(path: Path) -> str:
    """The file's text as a reader would see it (no HTML tags, no JSON escapes), white space removed."""
    text = path.read_text(errors="replace")
    if path.suffix == ".ipynb":
        text = "\n".join(cell.source for cell in nbformat.reads(text, as_version=4).cells)
    elif path.suffix == ".html":
        text = html.unescape(re.sub(r"<[^>]+>", "", text))
    return re.sub(r"\s+", "", text)


def contains_in_order(text: str, lines: list[str]) -> bool:
    position = 0
    for line in lines:
        position = text.find(line, position)
        if position < 0:
            return False
        position += len(line)
    return True


def leaks(folder: Path) -> list[str]:
    solutions = reference_bodies() | solution_regions()
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file()):
        raw = path.read_text(errors="replace")
        found += [f"{path.relative_to(folder)}: nbgrader marker {m!r}" for m in MARKERS if m in raw]
        text = searchable(path)
        found += [f"{path.relative_to(folder)}: {name}" for name, lines in solutions.items()
                  if contains_in_order(text, lines)]
    return found


def built(folder: Path) -> Path:
    if not (folder / "index.html").is_file():
        pytest.fail(f"{folder.relative_to(REPO)} is not built: run `make test` (it builds both editions)")
    return folder


def test_solution_code_is_recognised_wherever_it_stands():
    regions = solution_regions()
    assert regions and reference_bodies()
    for chapter in nbgrader_course.chapters(REPO):
        text = searchable(REPO / "solutions" / chapter / f"{chapter}.ipynb")
        notebook_regions = [lines for name, lines in regions.items() if name.startswith(chapter)]
        assert notebook_regions and all(contains_in_order(text, lines) for lines in notebook_regions)


def test_learner_edition_contains_no_solution_code():
    assert leaks(built(LEARNER)) == []


@pytest.mark.parametrize("chapter", nbgrader_course.chapters(REPO))
def test_instructor_edition_shows_the_solved_notebook_with_its_checks_passing(chapter):
    page = built(INSTRUCTOR) / "solutions" / chapter / f"{chapter}.html"
    assert page.is_file(), f"the instructor edition has no page for solutions/{chapter}"
    text = searchable(page)
    regions = [lines for name, lines in solution_regions().items() if name.startswith(f"{chapter}:")]
    assert all(contains_in_order(text, lines) for lines in regions)
    assert "✔" in text and "AssertionError" not in text


def test_instructor_table_of_contents_lists_every_chapter_and_its_solution():
    toc = (REPO / "book" / "_toc_instructor.yml").read_text()
    for chapter in nbgrader_course.chapters(REPO):
        assert f"file: {chapter}\n" in toc and f"file: solutions/{chapter}/{chapter}\n" in toc


def test_grading_material_is_in_the_instructor_edition_only():
    learner_toc = (REPO / "book" / "_toc.yml").read_text()
    assert "instructor_guide" not in learner_toc
    assert "- file: instructor_guide" in (REPO / "book" / "_toc_instructor.yml").read_text()
    assert (INSTRUCTOR / "instructor_guide.html").is_file()
    assert "instructor_guide.html" not in (LEARNER / "intro.html").read_text()


def test_answers_to_the_questions_are_in_the_instructor_edition_only():
    assert (INSTRUCTOR / "answers.html").is_file()
    assert "answers.html" in (INSTRUCTOR / "intro.html").read_text()  # its navigation lists the page
    assert not (LEARNER / "answers.html").exists()
    assert "answers.html" not in (LEARNER / "intro.html").read_text()
    answers = (INSTRUCTOR / "answers.html").read_text()
    for chapter in nbgrader_course.chapters(REPO):
        assert f'href="{chapter}.html"' in answers, f"answers.html has no section linking back to {chapter}"
