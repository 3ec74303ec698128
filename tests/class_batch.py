"""A scratch class of adversarial ``Case``s graded through `python -m autograde_tests.grading`, as the class
tests share it: their limits, the submissions written as each case makes them, and what the grader stored.

Chapter 1's class and the later chapters' attacks are graded as two batches, each in its own test module,
so that the suite's workers grade them side by side."""

import json
import subprocess
import sys
from pathlib import Path

import nbformat

from autograde_tests import scratch_course
from autograde_tests.grading import cgroups
from autograde_tests.grading.outcome import Cause

from .adversarial import CHAPTER, Case

MEMORY_GIB = 3
# Time limits no honest notebook comes near on a machine busy with other work (a graded test cell's requests
# share one --cell-timeout); the one submission that loops forever spends a cell's limit.
LIMITS = ["--jobs", "2", "--timeout", "600", "--cell-timeout", "60", "--memory", str(MEMORY_GIB), "--output", "200000"]


def grade(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograde_tests.grading", "--course", str(root), *LIMITS, *args],
                          capture_output=True, text=True)


def outcomes(root: Path) -> dict:
    return json.loads((root / ".grading" / "state.json").read_text())


def unbounded() -> str:
    """Why no cgroup bounds a submission here ('' where one does): without one, the cases that try the
    whole submission's bounds are not submitted (a fork bomb would meet no cap)."""
    try:
        cgroups.bounds()
    except cgroups.Unavailable as exc:
        return f"no cgroup can bound a submission here: {exc}"
    return ""


def submit(root: Path, cases: list[Case], replacements: dict[bytes, bytes]) -> None:
    """Each case's submission, made from chapter 1's release or a later chapter's solved notebook (its
    chapter released first), with ``replacements`` made in the file's bytes."""
    release = nbformat.read(root / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    for case in cases:
        if case.bounded and unbounded():
            continue
        folder = root / "submitted" / case.student / case.chapter
        folder.mkdir(parents=True)
        if case.link:
            (folder / case.notebook).symlink_to(root / case.link)
            continue
        start = nbformat.from_dict(release) if case.chapter == CHAPTER else scratch_course.solved(root, case.chapter)
        made = case.make(start)
        data = made if isinstance(made, bytes) else nbformat.writes(made).encode()
        for placeholder, value in replacements.items():
            data = data.replace(placeholder, value)
        (folder / case.notebook).write_bytes(data)
        for name in case.extra_files:
            (folder / name).write_text("raise SystemExit('a submitted file shadowed torch')\n")


def printed(root: Path, student: str, chapter: str) -> str:
    """What the submission's cells printed, as its autograded notebook keeps it."""
    notebook = nbformat.read(root / "autograded" / student / chapter / f"{chapter}.ipynb", as_version=4)
    return "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))


def expect_outcome(root: Path, case: Case) -> None:
    outcome = outcomes(root)[f"{case.student}/{case.chapter}"]
    if isinstance(case.expected, Cause):
        assert (outcome["status"], outcome["cause"]) == ("needs-attention", case.expected), outcome
    else:
        assert (outcome["status"], outcome["cause"]) == ("graded", Cause.GRADED), outcome
        assert outcome["score"] == case.expected, outcome
