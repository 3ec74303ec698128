"""Chapters 5 to 8's attacks, and honest answers that must keep full marks (``adversarial.LATER``), graded
in one batch through `python -m autograde_tests.grading`, kernels in bubblewrap: each gets its exact outcome,
and what a submission tried against the machine stayed within the bounds the OS counted from outside."""

from pathlib import Path

import nbformat
import pytest

from autograde_tests import nbgrader_course, scratch_course
from autograde_tests.grading import limits
from autograde_tests.grading.outcome import Cause

from .adversarial import CHAPTER, DECODER_ONLY, LATER, SHM_NAME
from .class_batch import MEMORY_GIB, expect_outcome, grade, outcomes, printed, submit, unbounded

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> Path:
    root = scratch_course.scratch_course(REPO, tmp_path_factory.mktemp("class"))
    for chapter in sorted({CHAPTER, *(case.chapter for case in LATER)}):  # chapter 1's release is where cases start
        scratch_course.release(root, chapter)
    submit(root, LATER, {b"{COURSE}": str(root).encode()})
    run = grade(root)
    assert run.returncode == 0, run.stderr[-3000:]
    return root


def test_the_batch_writes_a_similarity_report_for_every_chapter_it_graded(graded):
    chapters = sorted({CHAPTER, *(case.chapter for case in LATER)})
    summary = (graded / "reports" / "class_report.md").read_text()
    assert "## Similar answers" in summary
    for chapter in chapters:
        assert (graded / "reports" / f"similarity_{chapter}.html").is_file()
        assert f"| {chapter} | " in summary.split("## Similar answers")[1]


@pytest.mark.parametrize("case", LATER, ids=lambda c: f"{c.student}/{c.chapter}")
def test_an_attack_on_a_later_chapter_gets_its_outcome(graded, case):
    if case.bounded and unbounded():
        pytest.skip(unbounded())
    expect_outcome(graded, case)


@pytest.mark.parametrize("student, problem", [
    ("kv_heads_tiled_06", "the key and value heads are repeated along the wrong axis"),
    ("gate_and_up_swapped_06", "the FFN's w1 and w3 are swapped"),
])
def test_the_feedback_names_the_mistake_a_grouped_query_block_or_a_checkpoint_loader_made(graded, student, problem):
    notebook = nbformat.read(graded / "autograded" / student / DECODER_ONLY / f"{DECODER_ONLY}.ipynb", as_version=4)
    errors = [o.get("evalue", "") for cell in notebook.cells for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert any(problem in error for error in errors), errors


def test_a_generate_that_calls_the_checks_generator_scores_nothing_for_it(graded):
    """The checks' generators are the reference with a flag: a kernel cannot import them, so the exercise
    that calls one scores 0 and the others keep their points (its exact total: ``adversarial.LATER``)."""
    with nbgrader_course.gradebook(graded) as book:
        generate = book.find_grade("test_generate", DECODER_ONLY, DECODER_ONLY, "generate_by_the_checks_06")
        assert generate.auto_score == 0 < generate.max_score


@pytest.mark.parametrize("case", [c for c in LATER if c.bounded], ids=lambda c: f"{c.student}/{c.chapter}")
def test_what_a_submission_tried_stayed_within_its_bounds_as_counted_from_outside(graded, case):
    """The cgroup's own figures: peak processes and memory under the caps, the OS's refusals and kills;
    /dev/shm and the sockets folder filled in the sandbox only, each a small tmpfs."""
    if unbounded():
        pytest.skip(unbounded())
    used = outcomes(graded)[f"{case.student}/{case.chapter}"]["resources"]
    assert used["peak_memory_bytes"] <= MEMORY_GIB * 2**30, used
    assert used["peak_processes"] is None or used["peak_processes"] <= limits.PROCESSES, used
    if case.expected == Cause.OUT_OF_MEMORY:
        assert used["oom_kills"] >= 1, used
        return
    assert used["refused_forks"] >= 1 and used["oom_kills"] == 0, used
    shown = printed(graded, case.student, case.chapter).splitlines()
    assert any(line.startswith("FORKS ") and line.endswith(" then BlockingIOError") for line in shown), shown
    full = {words[1]: (words[2], int(words[4]))
            for words in (line.split() for line in shown if line.startswith("FULL "))}
    (shm_error, shm_mib), sockets = full.pop("/dev/shm"), list(full.values())  # the sockets folder's is the other
    assert (shm_error == "ENOSPC" and shm_mib <= 64
            and [(e, mib <= 1) for e, mib in sockets] == [("ENOSPC", True)]), shown
    assert list(Path("/dev/shm").glob(f"{SHM_NAME}*")) == []  # the host's /dev/shm never saw a byte of it
