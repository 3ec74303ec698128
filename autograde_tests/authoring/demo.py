"""``make demo``: the whole grading loop on a scratch course, with nothing to set up.

Three students hand in every chapter: one solved it, one handed in the untouched release, one made
a typical mistake. nbgrader autogrades them and writes their feedback; the scores are printed.
"""

import argparse
import contextlib
import os
import tempfile
import warnings
from pathlib import Path

import nbformat

from .. import nbgrader_course, scratch_course
from ..chapters import by_id

STUDENTS = ("solved", "untouched", "one_mistake")


@contextlib.contextmanager
def stderr_to(path: Path):
    """Send nbgrader's and the kernels' chatter to a log file (they write to file descriptor 2)."""
    saved = os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="the course repository (default: here)")
    args = parser.parse_args()
    if not (args.repo / "solutions").is_dir():
        parser.error(f"{args.repo}: no solutions/ folder here; run from the course repository or pass --repo")

    root = scratch_course.scratch_course(args.repo, Path(tempfile.mkdtemp(prefix="attention-course-demo-")))
    log = root / "nbgrader.log"
    print(f"Scratch course: {root}  (nbgrader's log: {log.name})")
    warnings.simplefilter("ignore")  # nbgrader's gradebook emits SQLAlchemy warnings that say nothing to a reader
    for chapter in nbgrader_course.chapters(root):
        with stderr_to(log):
            released = scratch_course.release(root, chapter)
        solved = scratch_course.solved(root, chapter)
        cell, correct, mistaken = by_id(chapter).typical_mistake
        handed_in = {
            "solved": solved,
            "untouched": nbformat.read(released, as_version=4),
            "one_mistake": scratch_course.with_mistake(solved, cell, correct, mistaken),
        }
        top = scratch_course.max_score(root, chapter)
        print(f"\n{chapter} (out of {top:g})")
        for student in STUDENTS:
            scratch_course.submit(root, student, chapter, handed_in[student])
            with stderr_to(log):
                scratch_course.autograde(root, student, chapter)
                html = scratch_course.feedback(root, student, chapter)
            total = scratch_course.scores(root, student, chapter)["total"]
            print(f"  {student:<12} {total:>4g} / {top:g}   feedback: {html.relative_to(root)}")
            for message in scratch_course.diagnoses(root, student, chapter):
                print(f"  {'':<12} {message}")


if __name__ == "__main__":
    main()
