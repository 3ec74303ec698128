"""The layers under the code filter, tested on their own: a kernel that dies, or that ignores
interrupts and never finishes, still ends as needs-attention, and nothing of it is left running."""

from pathlib import Path

import nbformat
import psutil
import pytest

from autograde_tests import course
from autograde_tests.grading import batch

from .adversarial import CHAPTER, solved, with_extra_cell

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    root = course.scratch_course(REPO, tmp_path_factory.mktemp("template"))
    course.release(root, CHAPTER)
    return root


def run_unfiltered(template: Path, tmp_path: Path, notebook, timeout: int, cell_timeout: int = 5) -> dict:
    """Grade ``notebook`` as the batch would, minus the code filter (which would refuse it).

    Its kernel works in a folder under ``tmp_path / "sandbox"``, so the test can look for it afterwards.
    """
    settings = batch.Settings(template, [CHAPTER], jobs=1, timeout=timeout, cell_timeout=cell_timeout,
                              memory_bytes=3 * 2**30, output_chars=100_000)
    job = {"student": "mallory", "chapter": CHAPTER, "notes": [], "digest": ""}
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir(mode=0o711)
    job_dir = batch.write_job(notebook, job, settings, template, tmp_path / "jobs", sandbox)
    return batch.run_worker(job_dir, timeout)


def release(template: Path):
    return nbformat.read(template / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)


def test_a_kernel_that_exits_is_reported_not_graded(template, tmp_path):
    notebook = with_extra_cell("import os\nos._exit(1)")(release(template))
    result = run_unfiltered(template, tmp_path, notebook, timeout=120)
    assert result["status"] == "needs-attention" and "kernel died" in result["reason"]


IGNORES_INTERRUPTS = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"


def test_a_cell_that_ignores_interrupts_ends_at_the_cell_time_limit(template, tmp_path):
    notebook = with_extra_cell(IGNORES_INTERRUPTS)(release(template))
    result = run_unfiltered(template, tmp_path, notebook, timeout=120, cell_timeout=5)
    assert result == {"status": "needs-attention", "reason": "a cell did not finish within the time limit"}


def test_a_kernel_that_ignores_interrupts_is_killed_at_the_submission_time_limit(template, tmp_path):
    notebook = with_extra_cell(IGNORES_INTERRUPTS)(release(template))
    result = run_unfiltered(template, tmp_path, notebook, timeout=25, cell_timeout=600)
    assert result == {"status": "needs-attention", "reason": "timed out after 25 s (killed)"}
    ours = str(tmp_path / "sandbox")
    survivors = [p for p in psutil.process_iter(["cmdline"]) if ours in " ".join(p.info["cmdline"] or [])]
    assert survivors == []


def test_the_same_machinery_grades_a_correct_notebook(template, tmp_path):
    result = run_unfiltered(template, tmp_path, solved(release(template)), timeout=120)
    assert result["status"] == "graded" and sum(result["scores"].values()) == 6
