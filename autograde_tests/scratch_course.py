"""Drive nbgrader on a scratch copy of the course: release, submit, autograde, feedback, scores.

Used by ``make demo``, ``make bench``, the hub and the end-to-end tests, so that what the tests prove is what
the demo shows. Everything goes through nbgrader's own Python API; nothing here re-implements grading. (The
course's chapters, and where they are released, are ``nbgrader_course``'s.)
"""

import shutil
from pathlib import Path

import nbformat

from .nbgrader_course import SOLUTION_MARKERS, api, failure_messages, gradebook, released, run, start_gradebook


def scratch_course(repo: Path, dest: Path) -> Path:
    """Copy what an instructor keeps (configuration and instructor notebooks) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(repo / "nbgrader_config.py", dest / "nbgrader_config.py")
    shutil.copytree(repo / "solutions", dest / "solutions", dirs_exist_ok=True)
    start_gradebook(dest)
    return dest


def release(course: Path, chapter: str) -> Path:
    """``nbgrader generate_assignment``: the learners' notebook, made from the instructor's."""
    run(api(course).generate_assignment(chapter, force=True))
    return released(course, chapter)


def solved(course: Path, chapter: str) -> nbformat.NotebookNode:
    """The released notebook with every solution cell filled in from the instructor's notebook."""
    source = nbformat.read(course / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    answers = {
        c.metadata["nbgrader"]["grade_id"]: SOLUTION_MARKERS.sub("", c.source)
        for c in source.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    notebook = nbformat.read(released(course, chapter), as_version=4)
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return notebook


def with_mistake(notebook: nbformat.NotebookNode, grade_id: str, correct: str, mistaken: str):
    """A copy of ``notebook`` whose cell ``grade_id`` has ``correct`` replaced by ``mistaken``."""
    notebook = nbformat.from_dict(notebook)
    cell = next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    if correct not in cell.source:
        raise ValueError(f"cell {grade_id!r} does not contain {correct!r}")
    cell.source = cell.source.replace(correct, mistaken)
    return notebook


def submit(course: Path, student: str, chapter: str, notebook: nbformat.NotebookNode) -> Path:
    """Place a notebook where ``nbgrader collect`` would: submitted/<student>/<chapter>/."""
    path = course / "submitted" / student / chapter / f"{chapter}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)
    return path


def autograde(course: Path, student: str, chapter: str) -> str:
    return run(api(course).autograde(chapter, student, force=True, create=True))


def feedback(course: Path, student: str, chapter: str) -> Path:
    run(api(course).generate_feedback(chapter, student, force=True))
    return course / "feedback" / student / chapter / f"{chapter}.html"


def scores(course: Path, student: str, chapter: str) -> dict[str, float]:
    """Points per graded cell of one autograded submission, and the total under ``"total"``."""
    with gradebook(course) as book:
        submission = book.find_submission_notebook(chapter, chapter, student)
        points = {grade.name: grade.score for grade in submission.grades}
        points["total"] = submission.score
        return points


def max_score(course: Path, chapter: str) -> float:
    with gradebook(course) as book:
        return book.find_assignment(chapter).max_score


def diagnoses(course: Path, student: str, chapter: str) -> list[str]:
    """The first line of each failed graded cell's error in an autograded submission: the checks' diagnoses."""
    return failure_messages(nbformat.read(course / "autograded" / student / chapter / f"{chapter}.ipynb", as_version=4))
