"""``python -m autograde_tests.grading`` (``make grade``): grade a class with nbgrader, hardened.

Reads submissions from submitted/<student>/<chapter>/ (or, with --zip-collect, from an LMS download
in downloaded/<chapter>/archive/ through ``nbgrader zip_collect``), grades every pair in isolation and
in parallel (on this machine, or on the workers of a Dask scheduler), and writes the gradebook,
autograded/, feedback/, grades.csv, reports/class_report.md and reports/similarity_<chapter>.html (similar
answers, against classmates and published answers: it informs, it changes no score). A fault of the grader's own
stops it with one line on stderr and status 1 (what was graded before it is kept).
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

from .. import exchange, nbgrader_course
from . import batch, bubblewrap, cluster, limits, report, sandbox_kernel, similarity

PROG = "python -m autograde_tests.grading"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line that says what is wrong; nothing has been changed yet."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse(argv=None) -> batch.Settings:
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--course", type=Path, default=Path.cwd(), help="the course folder (default: here)")
    parser.add_argument("--chapter", action="append", help="a chapter to grade (repeatable; default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(),
                        help="grading workers on this machine, each grading one submission at a time (default: cores)")
    parser.add_argument("--scheduler",
                        help="a Dask scheduler's address (tcp://HOST:8786): grade on its workers instead")
    parser.add_argument("--wait-for-workers", type=float, default=limits.WORKER_PATIENCE_SECONDS, metavar="SECONDS",
                        help="how long no grading worker may be connected before the batch stops "
                             "(default: %(default)g)")
    parser.add_argument("--timeout", type=int, default=limits.SUBMISSION_SECONDS,
                        help="seconds for one submission (default: %(default)s)")
    parser.add_argument("--cell-timeout", type=int, default=limits.CELL_SECONDS,
                        help="seconds for one cell (default: %(default)s)")
    parser.add_argument("--memory", type=float, default=limits.MEMORY_BYTES / 2**30,
                        help="GiB of memory for one kernel (default: %(default)g)")
    parser.add_argument("--output", type=int, default=limits.OUTPUT_BYTES, metavar="BYTES",
                        help="bytes of messages a kernel's cells may send in all, each output counted with "
                             f"{limits.OUTPUT_OVERHEAD_BYTES} more (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="regrade submissions that have not changed")
    parser.add_argument("--gpu", action="store_true",
                        help="the kernels see this machine's NVIDIA GPUs (/dev/nvidia*) and the checks run their cases "
                             "there too; --memory does not bound a GPU's memory (default: no GPU for anyone)")
    parser.add_argument("--zip-collect", action="store_true", help="first run nbgrader zip_collect for each chapter")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run kernels without bubblewrap: for trusted work only (your own notebooks)")
    parser.add_argument("--known-solutions", type=Path, metavar="DIR",
                        help="a folder of published answers (notebooks, Python files) the similarity report "
                             "compares with")
    parser.add_argument("--similarity", type=float, default=limits.SIMILARITY_THRESHOLD, metavar="THRESHOLD",
                        help="the similarity from which the report lists a pair, 0 to 1 (default: %(default)s)")
    args = parser.parse_args(argv)

    course = args.course.resolve()
    if not (course / "nbgrader_config.py").is_file():
        parser.error(f"{course}: not a course folder (no nbgrader_config.py)")
    known = nbgrader_course.chapters(course)
    unknown = [c for c in args.chapter or [] if c not in known]
    if unknown:
        parser.error(f"unknown chapter {unknown[0]!r} (chapters: {', '.join(known)})")
    if args.jobs < 1 or args.timeout < 1 or args.cell_timeout < 1 or args.memory <= 0 or args.wait_for_workers <= 0:
        parser.error("--jobs, --timeout, --cell-timeout, --memory and --wait-for-workers must be positive")
    if args.gpu and not sandbox_kernel.gpu_devices():
        parser.error("--gpu: this machine has no NVIDIA GPU (no /dev/nvidia* device); grade without --gpu")
    if not 0 < args.similarity <= 1:
        parser.error(f"--similarity must be above 0 and at most 1, got {args.similarity}")
    if args.known_solutions is not None and not args.known_solutions.is_dir():
        parser.error(f"--known-solutions {args.known_solutions}: not a folder")
    released = _released(parser, course, known)
    for chapter in args.chapter or []:
        if chapter not in released:
            parser.error(f"chapter {chapter!r} is not in the gradebook; run `make release` first")
    chapters = args.chapter or released
    collected = [c for c in chapters if (course / "downloaded" / c / "archive").is_dir()] if args.zip_collect else []
    refused = _zip_collect(parser, course, collected)
    if not (course / "submitted").is_dir() and not refused:
        parser.error(f"{course}: no submitted/ folder (collect submissions first, or use --zip-collect)")
    if not batch.find_pairs(course, chapters) and not refused:
        parser.error(f"no submissions for {', '.join(chapters)} in {course / 'submitted'}")
    if not args.no_sandbox and not args.scheduler:  # a Dask worker's sandbox is checked where it grades
        _expect_bubblewrap(parser)
    return batch.Settings(course, chapters, args.jobs, args.timeout, args.cell_timeout, int(args.memory * 2**30),
                          args.output, args.force, sandbox=not args.no_sandbox, scheduler=args.scheduler,
                          refused=tuple(refused), zip_collected=tuple(collected), worker_patience=args.wait_for_workers,
                          similarity=args.similarity, gpu=args.gpu,
                          known_solutions=args.known_solutions.resolve() if args.known_solutions else None)


def _expect_bubblewrap(parser) -> None:
    """Refuse to grade, with one line saying why, unless bubblewrap can start a sandbox here."""
    why = bubblewrap.unavailable()
    if why:
        parser.error(f"{why} (or --no-sandbox, for trusted work only)")


def _released(parser, course: Path, chapters: list[str]) -> list[str]:
    """The chapters the course's gradebook knows (``make release`` records them)."""
    if not (course / "gradebook.db").is_file():
        parser.error(f"{course}: no gradebook.db; run `make release` (nbgrader generate_assignment) first")
    with nbgrader_course.gradebook(course) as book:
        names = {a.name for a in book.assignments}
    return [c for c in chapters if c in names]


def _zip_collect(parser, course: Path, chapters: list[str]) -> list[batch.Refused]:
    """``nbgrader zip_collect`` for each of ``chapters`` (those with downloads); the uploads it refused (one
    at a time, with the course's safe extractor and collector: see autograde_tests.exchange), each for its learner."""
    refused = []
    for chapter in chapters:
        downloaded = course / "downloaded" / chapter
        (downloaded / exchange.REFUSED).unlink(missing_ok=True)  # never a stale record of an earlier run
        # The safe classes named here too, so that a course whose configuration predates them is safe.
        done = subprocess.run([sys.executable, "-m", "nbgrader", "zip_collect", chapter, "--force",
                               f"--extractor={exchange.__name__}.SafeExtractor",
                               f"--collector={exchange.__name__}.SafeNameCollector"],
                              cwd=course, capture_output=True, text=True)
        if done.returncode:
            parser.error(f"nbgrader zip_collect {chapter} failed: {done.stderr.strip().splitlines()[-1:]}")
        refused += [batch.Refused(r["student"], chapter, r["reason"], r["labelled"])
                    for r in exchange.read_refusals(downloaded / exchange.REFUSED)]
    return refused


def main(argv=None) -> None:
    settings = parse(argv)
    try:
        outcomes = batch.grade_class(settings)
    except cluster.Stopped as exc:
        sys.exit(f"{PROG}: stopped: {exc}")
    csv = report.export_grades(settings.course)
    state = batch.load_state(settings.course)
    similar = similarity.write_reports(settings.course, settings.chapters, settings.similarity,
                                       settings.known_solutions)
    summary = report.write_report(settings.course, state, settings.sandbox, similar)
    for o in outcomes:
        if o.status == "needs-attention":
            print(f"needs attention  {o.student} / {o.chapter}: {o.reason}")
        else:
            print(f"{o.status:<16} {o.student} / {o.chapter}: {o.score:g} / {o.max_score:g}")
    counts = {s: sum(o.status == s for o in outcomes) for s in ("graded", "unchanged", "needs-attention")}
    print(f"\n{counts['graded']} graded, {counts['unchanged']} unchanged, {counts['needs-attention']} need attention")
    for line in report.bounds_lines(vars(o) for o in outcomes):  # by cgroup, or the weaker per-process bound
        print(line)
    print(f"grades: {csv}\nreport: {summary}\nfeedback: {settings.course / 'feedback'}")


if __name__ == "__main__":
    main()
