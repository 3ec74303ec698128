"""Real nbgrader on scratch copies of the course, for every chapter: release, autograde, feedback."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import get_alembic_version
from sqlalchemy import text

from autograde_tests import nbgrader_course, scratch_course
from autograde_tests.chapters import by_id

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
CHAPTERS = nbgrader_course.chapters(REPO)


@pytest.fixture(scope="module")
def courses(tmp_path_factory) -> dict[str, Path]:
    """For every chapter a scratch course where three students handed it in, autograded by nbgrader's own
    command (``nbgrader autograde <chapter>``, every student at once). The courses share nothing, so the
    chapters are graded side by side, one process each, as many at a time as there are cores."""
    courses = {chapter: _handed_in(tmp_path_factory.mktemp(chapter), chapter) for chapter in CHAPTERS}
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        runs = dict(zip(courses, pool.map(_autograde_everyone, courses.items())))
    for chapter, run in runs.items():
        assert run.returncode == 0, f"nbgrader autograde {chapter}:\n{run.stderr[-3000:]}"
    return courses


def _handed_in(root: Path, chapter: str) -> Path:
    scratch_course.scratch_course(REPO, root)
    released = scratch_course.release(root, chapter)
    solved = scratch_course.solved(root, chapter)
    cell, correct, mistaken = by_id(chapter).typical_mistake
    handed_in = {
        "solved": solved,
        "untouched": nbformat.read(released, as_version=4),
        "one_mistake": scratch_course.with_mistake(solved, cell, correct, mistaken),
    }
    for student, notebook in handed_in.items():
        scratch_course.submit(root, student, chapter, notebook)
    return root


def _autograde_everyone(chapter_course: tuple[str, Path]) -> subprocess.CompletedProcess:
    chapter, root = chapter_course
    # nbgrader runs alembic and the kernels from the environment's bin/.
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "nbgrader", "autograde", chapter, "--force"], cwd=root, env=env,
                          capture_output=True, text=True)


@pytest.fixture(params=CHAPTERS)
def graded(request, courses):
    """One chapter's graded course, and the chapter."""
    return courses[request.param], request.param


def test_solved_notebook_gets_full_marks(graded):
    root, chapter = graded
    assert scratch_course.scores(root, "solved", chapter)["total"] == scratch_course.max_score(root, chapter)


def test_untouched_release_gets_zero(graded):
    root, chapter = graded
    assert scratch_course.scores(root, "untouched", chapter)["total"] == 0


def test_one_mistake_loses_exactly_that_exercises_points(graded):
    root, chapter = graded
    cell = by_id(chapter).typical_mistake[0]
    points = scratch_course.scores(root, "one_mistake", chapter)
    full = scratch_course.scores(root, "solved", chapter)
    assert points[f"test_{cell}"] == 0
    assert all(points[test] == full[test] for test in full if test not in (f"test_{cell}", "total"))
    assert points["total"] == full["total"] - full[f"test_{cell}"]


def test_feedback_is_written_as_html(graded):
    root, chapter = graded
    html = scratch_course.feedback(root, "one_mistake", chapter)
    assert html.is_file() and "<html" in html.read_text()


def test_a_scratch_course_starts_with_a_gradebook_nbgrader_would_have_made(tmp_path):
    root = scratch_course.scratch_course(REPO, tmp_path / "course")
    with nbgrader_course.gradebook(root) as book:
        assert book.assignments == [] and book.students == []
        (stamped,) = book.db.execute(text("SELECT version_num FROM alembic_version")).one()
    assert stamped == get_alembic_version()
