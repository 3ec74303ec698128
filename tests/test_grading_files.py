"""Files are data: `python -m autograde_tests.grading` on a scratch class whose submissions are links (to
the instructor's notebook, the gradebook), a FIFO, or the instructor's notebook itself. Each needs attention
with its reason, nothing of it is copied or graded, and the canary in the same batch keeps its full score."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograde_tests import nbgrader_course, scratch_course
from autograde_tests.grading import limits
from autograde_tests.grading.outcome import Cause

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.sandbox
# Nothing here hangs: generous limits keep honest work in full marks on a busy machine.
LIMITS = ["--jobs", "1", "--timeout", "300", "--cell-timeout", "60", "--memory", "3", "--output", "200000"]
CHAPTER, OTHER = "01_attention", "07_attention_at_scale"
COLLECTED = {"timestamp.txt": "2026-01-05 10:00:00.000000 UTC", "submission_secret.txt": "a1b2c3"}


def notebook_of(root: Path, student: str, chapter: str = CHAPTER) -> Path:
    folder = root / "submitted" / student / chapter
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{chapter}.ipynb"


def instructors(root: Path, chapter: str = CHAPTER) -> Path:
    return root / "solutions" / chapter / f"{chapter}.ipynb"


def _canary(root: Path) -> None:
    scratch_course.submit(root, "canary", CHAPTER, scratch_course.solved(root, CHAPTER))
    for name, text in COLLECTED.items():
        (root / "submitted" / "canary" / CHAPTER / name).write_text(text)


def _linked_notebook(root: Path) -> None:
    notebook_of(root, "linked_notebook").symlink_to(instructors(root))


def _linked_student_folder(root: Path, elsewhere: Path) -> None:
    planted = elsewhere / CHAPTER
    planted.mkdir(parents=True)
    (planted / f"{CHAPTER}.ipynb").write_bytes(instructors(root).read_bytes())
    (root / "submitted").mkdir(exist_ok=True)
    (root / "submitted" / "linked_student_folder").symlink_to(elsewhere, target_is_directory=True)


def _linked_chapter_folder(root: Path) -> None:
    (root / "submitted" / "linked_chapter_folder").mkdir(parents=True)
    (root / "submitted" / "linked_chapter_folder" / CHAPTER).symlink_to(root / "solutions" / CHAPTER)


def _linked_beside(root: Path, student: str, name: str, target: Path) -> None:
    """A correct notebook, with nbgrader collect's ``name`` beside it as a link to ``target``."""
    scratch_course.submit(root, student, CHAPTER, scratch_course.solved(root, CHAPTER))
    (root / "submitted" / student / CHAPTER / name).symlink_to(target)


def _linked_deep_inside(root: Path) -> None:
    scratch_course.submit(root, "linked_deep_inside", CHAPTER, scratch_course.solved(root, CHAPTER))
    data = root / "submitted" / "linked_deep_inside" / CHAPTER / "data"
    data.mkdir()
    (data / "answers.txt").symlink_to(instructors(root))


def _fifo_notebook(root: Path) -> None:
    os.mkfifo(notebook_of(root, "fifo_notebook"))


def _instructors_notebook_as_a_file(root: Path) -> None:
    notebook_of(root, "instructors_notebook_as_a_file").write_bytes(instructors(root).read_bytes())


def _oversized_notebook(root: Path) -> None:
    """Larger than any notebook may be (a sparse file: it takes no disk)."""
    with open(notebook_of(root, "oversized_notebook"), "wb") as notebook:
        notebook.truncate(limits.NOTEBOOK_BYTES + 1)


def _linked_notebook_of_chapter_7(root: Path) -> None:
    notebook_of(root, "linked_notebook_of_chapter_7", OTHER).symlink_to(instructors(root, OTHER))


# student -> chapter, the cause its submission needs attention for, and what its reason names: the file
# that is not data (the oversized notebook's, and the limit it is over), or the instructor's chapter
EXPECTED = {
    "linked_notebook": (CHAPTER, Cause.NOT_DATA, (f"submitted/linked_notebook/{CHAPTER}/{CHAPTER}.ipynb",)),
    "linked_student_folder": (CHAPTER, Cause.NOT_DATA, ("submitted/linked_student_folder",)),
    "linked_chapter_folder": (CHAPTER, Cause.NOT_DATA, (f"submitted/linked_chapter_folder/{CHAPTER}",)),
    "linked_timestamp": (CHAPTER, Cause.NOT_DATA, (f"submitted/linked_timestamp/{CHAPTER}/timestamp.txt",)),
    "linked_secret": (CHAPTER, Cause.NOT_DATA, (f"submitted/linked_secret/{CHAPTER}/submission_secret.txt",)),
    "linked_deep_inside": (CHAPTER, Cause.NOT_DATA, (f"submitted/linked_deep_inside/{CHAPTER}/data/answers.txt",)),
    "fifo_notebook": (CHAPTER, Cause.NOT_DATA, (f"submitted/fifo_notebook/{CHAPTER}/{CHAPTER}.ipynb",)),
    "instructors_notebook_as_a_file": (CHAPTER, Cause.INSTRUCTORS_NOTEBOOK, (f"solutions/{CHAPTER}",)),
    "oversized_notebook": (CHAPTER, Cause.NOT_DATA, (f"submitted/oversized_notebook/{CHAPTER}/{CHAPTER}.ipynb",
                                                     f" {limits.NOTEBOOK_BYTES} bytes")),
    "linked_notebook_of_chapter_7": (OTHER, Cause.NOT_DATA,
                                     (f"submitted/linked_notebook_of_chapter_7/{OTHER}/{OTHER}.ipynb",)),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = scratch_course.scratch_course(REPO, tmp_path_factory.mktemp("class"))
    for chapter in (CHAPTER, OTHER):
        scratch_course.release(root, chapter)
    _canary(root)
    _linked_notebook(root)
    _linked_student_folder(root, tmp_path_factory.mktemp("elsewhere"))
    _linked_chapter_folder(root)
    _linked_beside(root, "linked_timestamp", "timestamp.txt", root / "gradebook.db")
    _linked_beside(root, "linked_secret", "submission_secret.txt", instructors(root))
    _linked_deep_inside(root)
    _fifo_notebook(root)
    _instructors_notebook_as_a_file(root)
    _oversized_notebook(root)
    _linked_notebook_of_chapter_7(root)
    run = subprocess.run([sys.executable, "-m", "autograde_tests.grading", "--course", str(root), *LIMITS],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return root, json.loads((root / ".grading" / "state.json").read_text()), run.stdout


@pytest.mark.parametrize("student", EXPECTED)
def test_a_submission_that_is_not_plain_files_needs_attention_with_the_reason(graded, student):
    _, state, stdout = graded
    chapter, cause, named = EXPECTED[student]
    outcome = state[f"{student}/{chapter}"]
    assert (outcome["status"], outcome["cause"]) == ("needs-attention", cause), outcome
    assert all(name in outcome["reason"] for name in named), outcome
    assert outcome["score"] is None and not outcome["worker"], outcome  # never sent to a grader
    assert f"needs attention  {student} / {chapter}: {outcome['reason']}" in stdout


@pytest.mark.parametrize("student", EXPECTED)
def test_nothing_of_a_refused_submission_is_copied_or_recorded(graded, student):
    root, _, _ = graded
    for folder in ("autograded", "feedback"):
        assert not (root / folder / student).exists()
    with nbgrader_course.gradebook(root) as book:
        assert student not in {s.id for s in book.students}
    assert student not in {row["student_id"] for row in csv.DictReader((root / "grades.csv").open())}


def test_the_linked_student_folder_is_refused_only_for_the_chapter_behind_it(graded):
    _, state, _ = graded
    assert f"linked_student_folder/{OTHER}" not in state


def test_no_solution_reaches_autograded_and_no_hidden_test_reaches_feedback(graded):
    """(nbgrader's autograded/ is the instructor's: it holds the hidden tests, never the solutions.)"""
    root, _, _ = graded
    written = [p for folder in ("autograded", "feedback") for p in (root / folder).rglob("*") if p.is_file()]
    assert sorted({p.relative_to(root).parts[1] for p in written}) == ["canary"]
    assert all(not p.is_symlink() for p in written)
    for path in written:
        assert "BEGIN SOLUTION" not in path.read_text(), path
    for path in (root / "feedback").rglob("*.html"):
        assert "BEGIN HIDDEN TESTS" not in path.read_text(), path


def test_the_canary_keeps_its_exact_full_score_and_its_collected_files(graded):
    root, state, _ = graded
    outcome = state[f"canary/{CHAPTER}"]
    assert (outcome["status"], outcome["score"], outcome["max_score"]) == ("graded", 6, 6), outcome
    with nbgrader_course.gradebook(root) as book:
        assert book.find_submission(CHAPTER, "canary").score == 6
    for folder in ("autograded", "feedback"):
        for name, text in COLLECTED.items():
            path = root / folder / "canary" / CHAPTER / name
            assert not path.is_symlink() and path.read_text() == text


def test_the_report_lists_each_refused_submission_with_its_cause(graded):
    root, state, _ = graded
    report = (root / "reports" / "class_report.md").read_text()
    for student, (chapter, cause, _) in EXPECTED.items():
        assert f"- {student} / {chapter} ({cause}): {state[f'{student}/{chapter}']['reason']}" in report


def test_the_instructors_notebook_is_recognised_but_a_solved_release_is_not(graded):
    from autograde_tests.grading import submissions

    root, _, _ = graded
    source = nbformat.read(instructors(root), as_version=4)
    assert submissions.is_instructors(source, source)
    assert not submissions.is_instructors(scratch_course.solved(root, CHAPTER), source)
    hidden = next(c for c in source.cells if "BEGIN HIDDEN TESTS" in c.source)
    one_cell = scratch_course.solved(root, CHAPTER)
    one_cell.cells.append(nbformat.from_dict(hidden))
    assert submissions.is_instructors(one_cell, source)
