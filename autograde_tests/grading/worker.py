"""Grade one (student, chapter) pair with nbgrader, in a scratch course of its own.

Run by the batch as ``python -m autograde_tests.grading.worker JOB_DIR``, in a process group of its
own that the batch kills whole at the time limit. ``JOB_DIR/job.json`` says what to grade; the
answer is written to ``JOB_DIR/result.json``. The scratch course holds a copy of the course's
configuration and gradebook template, and the rebuilt submission; nothing here touches the real course.
This process is trusted: it runs no learner code (the sandboxed kernel does) and judges the graded
cells itself (``execute.GraderExecute``).
"""

import ctypes
import json
import sys
from pathlib import Path

# jsonschema, under nbformat, builds the grammar of an optional IRI checker as it imports (0.7 s, in
# every worker); no notebook schema uses IRIs, so the worker does without it.
sys.modules.setdefault("rfc3987_syntax", None)

import nbformat  # noqa: E402

PR_SET_CHILD_SUBREAPER = 36
MEMORY_ERRORS = ("MemoryError", "can't allocate memory", "not enough memory")


def main(job_dir: Path) -> None:
    job = json.loads((job_dir / "job.json").read_text())
    # Orphaned grandchildren (a kernel's own children) stay ours, so the batch can find and kill them.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _write_kernel_spec(job_dir, job)
    kernel = _start_kernel(job)  # it boots, and imports torch, while this process loads nbgrader
    result = grade(job_dir / "course", job["student"], job["chapter"], job, kernel)
    (job_dir / "result.json").write_text(json.dumps(result))


def _write_kernel_spec(job_dir: Path, job: dict) -> None:
    """Make the kernel name ``python3`` mean the sandboxed kernel, for this worker only (JUPYTER_PATH)."""
    argv = [sys.executable, "-m", "autograde_tests.grading.sandbox_kernel", "--chapter", job["chapter"],
            "--exchange", job["exchange"], "--memory-bytes", str(job["memory_bytes"]), "-f", "{connection_file}"]
    if not job["sandbox"]:
        argv.insert(-2, "--no-sandbox")
    spec = job_dir / "jupyter" / "kernels" / "python3" / "kernel.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    # Interrupts travel as messages: a signal to bubblewrap would not reach the kernel inside.
    spec.write_text(json.dumps({"argv": argv, "display_name": "Python 3 (grading sandbox)", "language": "python",
                                "interrupt_mode": "message"}))


def _start_kernel(job: dict):
    """The sandboxed kernel, started now; its sockets are files in the one folder it shares with the grader."""
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync

    kernel = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=str(Path(job["exchange"]) / "kernel"))
    run_sync(kernel.start_kernel)(extra_arguments=["--HistoryManager.hist_file=:memory:"])
    return kernel


def grade(course: Path, student: str, chapter: str, job: dict, kernel) -> dict:
    from nbgrader.converters import Autograde
    from nbgrader.preprocessors import Execute

    from .. import nbgrader_course
    from .execute import GraderExecute

    config = nbgrader_course.config(course)
    executor = type("GraderExecuteWithKernel", (GraderExecute,), {"started": kernel})
    preprocessors = Autograde.class_traits()["autograde_preprocessors"].default()
    config.Autograde.autograde_preprocessors = [executor if p is Execute else p for p in preprocessors]
    config.GraderExecute.timeout = job["cell_timeout"]
    config.GraderExecute.output_chars = job["output_chars"]
    outcome = nbgrader_course.api(course, config).autograde(chapter, student, force=True, create=True)
    if not outcome["success"]:
        return {"status": "needs-attention", "reason": _failure_reason(outcome.get("log", "") + outcome.get("error", ""))}
    autograded = course / "autograded" / student / chapter / f"{chapter}.ipynb"
    notebook = nbformat.read(autograded, as_version=4)
    errors = nbgrader_course.failure_messages(notebook)
    everywhere = nbgrader_course.failure_messages(notebook, graded_only=False)
    if any(marker in error for error in everywhere for marker in MEMORY_ERRORS):
        return {"status": "needs-attention", "reason": "memory limit exceeded"}
    with nbgrader_course.gradebook(course) as book:
        notebook = book.find_submission_notebook(chapter, chapter, student)
        scores = {g.name: g.score for g in notebook.grades}
        max_scores = {g.name: g.max_score for g in notebook.grades}
    return {"status": "graded", "scores": scores, "max_scores": max_scores, "messages": errors,
            "autograded": str(autograded)}


def _failure_reason(error: str) -> str:
    if any(marker in error for marker in ("DeadKernelError", "KernelDied", "Kernel died", "kernel died")):
        return "the kernel died (a crash, os._exit or a memory limit)"
    if "CellTimeoutError" in error or "TimeoutError" in error:
        return "a cell did not finish within the time limit"
    if "CellExecutionError" in error:
        return "a cell could not be executed"
    last = [line for line in error.strip().splitlines() if line.strip()]
    return f"nbgrader could not grade it: {last[-1] if last else 'unknown error'}"


if __name__ == "__main__":
    main(Path(sys.argv[1]))
