"""Grade one (student, chapter) submission, in a grading worker that lives for the whole batch.

The coordinator (``batch``) sends each submission as a task to a Dask worker: a process of the course's
environment, on this machine or another, that has bubblewrap but not the course folder. A worker loads
nbgrader, torch and the checks once; per chapter it keeps a scratch course built from what the task
carries (the course's nbgrader configuration and the chapter's instructor notebook); and it keeps one
sandboxed kernel started ahead (``kernels``). This process is trusted: it runs no learner code (the
kernel does) and judges the graded cells itself (``execute.GraderExecute``). What it returns is data:
the scores, the checks' messages, the autograded notebook and its feedback page, and what the OS
counted for the submission (its cgroup's peak memory and processes); the coordinator alone writes the
course's gradebook and files.

An outcome is decided from what the OS reports, never from what the learner's code prints or raises: a
process the OOM killer ended in the submission's cgroup makes it ``Cause.OUT_OF_MEMORY``, the grader's
timer ``Cause.TIMED_OUT``. A kernel the grader could not start or that failed the probe is the grader's
fault (``Cause.GRADER_FAULT``): the submission needs attention and says so; it is never graded 0.

A worker's memory must not grow with the batch. Two things grew with every submission (3 to 4 MiB
each, measured): Dask's statistical profiler, which samples the grading thread's stack every 10 ms and
keeps a call tree per second for the last thousand seconds, is turned off in a grading worker
(``_quiet_profiler``); and the statements SQLAlchemy's mappers compile for each engine's dialect, which
keep those dialects alive (nbgrader opens an engine for every gradebook it reads, three per submission),
are dropped after each submission (``_forget_gradebooks``). What a submission's grading leaves in reference
cycles (nbgrader's converters and preprocessors, nbclient's event loops) is collected as it ends: left to
Python's own schedule it waited for many submissions, and the worker grew by about half a MiB with each
one (+31 MiB after 31 submissions of chapter 1; +0.3 MiB after 30 with the collection). And large
buffers freed go back to the OS (``_give_large_buffers_back``). Each result says
what the worker held then (``worker_memory_bytes``, after its ``worker_submissions``-th), so a test can
watch it from the results.
"""

import atexit
import ctypes
import gc
import hashlib
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import psutil

from .. import nbgrader_course
from . import cgroups, limits
from .job import Job
from .kernels import KernelFault, WarmKernels, kill, terminate
from .outcome import Cause, attention

M_MMAP_THRESHOLD, M_TRIM_THRESHOLD = -3, -1  # glibc's mallopt parameters (malloc.h)


class _Worker:
    """What a worker process keeps between tasks: its scratch courses and its waiting kernels."""

    def __init__(self, gpu: bool):
        # Without --gpu kernels get no GPU in the sandbox, so the checks judging them here must not expect one.
        # (Read once, when PyTorch first looks for CUDA: a batch has one setting, and a worker serves one batch.)
        if not gpu:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        # The folders of a worker that was killed (atexit never ran) are removed by the next one here.
        for folder in Path(tempfile.gettempdir()).glob("grading-worker-*-*"):
            if not psutil.pid_exists(int(folder.name.split("-")[2])):
                shutil.rmtree(folder, ignore_errors=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"grading-worker-{os.getpid()}-"))
        self.courses: dict[str, Path] = {}
        self.kernels: WarmKernels | None = None
        self.graded = 0  # submissions this process has finished
        _quiet_profiler()
        _give_large_buffers_back()
        # A worker closed by Dask exits normally: its waiting kernel and its folders go with it.
        atexit.register(self.close)

    def close(self) -> None:
        if self.kernels is not None:
            self.kernels.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def course(self, job: Job) -> Path:
        """A scratch course whose gradebook knows ``job.chapter`` (made once per configuration and notebook)."""
        key = hashlib.sha256((job.config + job.solution).encode()).hexdigest()[:16]
        if key not in self.courses:
            course = self.root / key
            (course / "solutions" / job.chapter).mkdir(parents=True)
            # Its gradebook is its own, wherever the course's configuration puts the course's.
            own = f'\nc.CourseDirectory.db_url = "{nbgrader_course.gradebook_url(course)}"\n'
            (course / "nbgrader_config.py").write_text(job.config + own)
            (course / "solutions" / job.chapter / f"{job.chapter}.ipynb").write_text(job.solution)
            nbgrader_course.start_gradebook(course)
            nbgrader_course.run(nbgrader_course.api(course).generate_assignment(job.chapter, force=True))
            self.courses[key] = course
        return self.courses[key]

    def kernel(self, job: Job):
        wanted = (job.memory_bytes, job.sandbox, job.gpu)
        if self.kernels is None or (self.kernels.memory_bytes, self.kernels.sandbox, self.kernels.gpu) != wanted:
            if self.kernels is not None:
                self.kernels.close()
            self.kernels = WarmKernels(self.root, job.memory_bytes, job.sandbox, gpu=job.gpu)
        return self.kernels.take(job.chapter, job.start_next)


_worker: _Worker | None = None  # made by the first task a worker process runs


def grade(job: Job) -> dict:
    """Autograde ``job`` with nbgrader: ``{"status": "graded", "cause": Cause.GRADED, "scores", "max_scores",
    "messages", "autograded", "feedback"}`` or ``{"status": "needs-attention", "cause", "reason"}``
    (``outcome.attention``); always who, how long and ``resources`` (how the submission was bounded, and
    what its cgroup counted)."""
    global _worker
    start = time.perf_counter()
    _worker = _worker or _Worker(job.gpu)
    course = _worker.course(job)
    try:
        kernel = _worker.kernel(job)
    except KernelFault as exc:
        return (attention(Cause.GRADER_FAULT, f"not graded: the grader's fault, not the submission's: {exc}")
                | {"resources": {"bounds": _worker.kernels.bounds}, "worker": _name(),
                   "seconds": round(time.perf_counter() - start, 2)})
    submitted = course / "submitted" / job.student / job.chapter / f"{job.chapter}.ipynb"
    submitted.parent.mkdir(parents=True, exist_ok=True)
    submitted.write_text(job.notebook)
    # The submission's time limit, kernel and all: past it the kernel is killed, which ends the grading.
    # Marked before the kill: the grading can see the kernel dead while the timer still waits for it to go.
    fired = threading.Event()
    deadline = threading.Timer(job.timeout, lambda: (fired.set(), terminate(kernel)))
    deadline.start()
    try:
        result = _autograde(course, job, kernel)
    finally:
        deadline.cancel()
        deadline.join()
        timed_out = fired.is_set()
        ended = kernel.provisioner.process.poll()  # a status if the kernel ended before the grader killed it
        usage = kill(kernel)
        for folder in ("submitted", "autograded", "feedback"):
            shutil.rmtree(course / folder / job.student, ignore_errors=True)
        _forget_gradebooks()
        gc.collect()
        _worker.graded += 1
    if usage is not None and usage.oom_kills:
        reason = (f"memory limit exceeded: the OS ended {usage.oom_kills} of its processes "
                  f"at {cgroups.size(job.memory_bytes)} for the whole submission")
        result = attention(Cause.OUT_OF_MEMORY, reason)
    elif timed_out and result["cause"] != Cause.GRADED:
        result = attention(Cause.TIMED_OUT, f"timed out after {job.timeout} s (killed)")
    elif ended is not None and result["cause"] != Cause.GRADED:
        result = attention(Cause.KERNEL_DIED, f"the kernel died ({_how_it_ended(ended)})")
    resources = ({"bounds": _worker.kernels.bounds} | (usage.as_dict() if usage else {})
                 | {"worker_memory_bytes": psutil.Process().memory_info().rss, "worker_submissions": _worker.graded})
    return result | {"resources": resources, "worker": _name(), "seconds": round(time.perf_counter() - start, 2)}


def _autograde(course: Path, job: Job, kernel) -> dict:
    from nbgrader.converters import Autograde
    from nbgrader.preprocessors import Execute

    from .execute import GraderExecute

    config = nbgrader_course.config(course)
    executor = type("GraderExecuteWithKernel", (GraderExecute,), {"started": kernel})
    preprocessors = Autograde.class_traits()["autograde_preprocessors"].default()
    config.Autograde.autograde_preprocessors = [executor if p is Execute else p for p in preprocessors]
    config.GraderExecute.timeout = job.cell_timeout
    config.GraderExecute.output_bytes = job.output_bytes
    api = nbgrader_course.api(course, config)
    outcome = api.autograde(job.chapter, job.student, force=True, create=True)
    if not outcome["success"]:
        return attention(*_failure(outcome.get("log", "") + outcome.get("error", "")))
    autograded = course / "autograded" / job.student / job.chapter / f"{job.chapter}.ipynb"
    notebook = nbformat.read(autograded, as_version=4)
    with nbgrader_course.gradebook(course) as book:
        grades = book.find_submission_notebook(job.chapter, job.chapter, job.student).grades
        scores = {g.name: g.score for g in grades}
        max_scores = {g.name: g.max_score for g in grades}
    nbgrader_course.run(api.generate_feedback(job.chapter, job.student, force=True))
    feedback = course / "feedback" / job.student / job.chapter / f"{job.chapter}.html"
    return {"status": Cause.GRADED.status, "cause": Cause.GRADED, "scores": scores, "max_scores": max_scores,
            "messages": nbgrader_course.failure_messages(notebook), "autograded": autograded.read_text(),
            "feedback": feedback.read_text()}


def _quiet_profiler() -> None:
    """Stop the Dask worker's statistical profiler and drop what it kept: nobody reads it for grading, and its
    history grew with every submission."""
    from distributed import get_worker
    from distributed.profile import create

    try:
        dask_worker = get_worker()
    except ValueError:  # not in a Dask worker: no profiler
        return

    def stop() -> None:  # in the worker's event loop, which owns the callbacks
        for name in ("profile", "profile-cycle"):
            callback = dask_worker.periodic_callbacks.pop(name, None)
            if callback is not None:
                callback.stop()
        dask_worker.profile_recent = create()
        for kept in (dask_worker.profile_history, dask_worker.profile_keys_history, dask_worker.profile_keys):
            kept.clear()

    dask_worker.loop.add_callback(stop)


def _give_large_buffers_back() -> None:
    """Make glibc's malloc map every buffer over ``limits.MMAP_BYTES`` on its own, and unmap it when it is freed.

    By default glibc raises that threshold to the largest buffer freed so far, so after a flood of large
    messages the next ones are cut from the heap, which they leave fragmented: grading five flooding
    submissions four times over grew a worker by 82 MiB; with a fixed threshold it ended where it began.
    """
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc's; another C library keeps its own ways
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, limits.MMAP_BYTES)
        mallopt(M_TRIM_THRESHOLD, limits.TRIM_BYTES)


def _forget_gradebooks() -> None:
    """Drop the statements nbgrader's mappers compiled for this submission's database engines: SQLAlchemy keys
    them by each engine's dialect, so they would keep every engine's dialect alive (up to 100 each)."""
    from nbgrader.api import Base

    for mapper in Base.registry.mappers:
        mapper._compiled_cache.clear()


def _name() -> str:
    """This worker, as the class report names it: its machine and its Dask name."""
    from distributed import get_worker

    return f"{socket.gethostname()}/{get_worker().name}"


def _how_it_ended(status: int) -> str:
    """The kernel's process status as the OS gave it: bubblewrap passes its child's exit status on, and
    128 + N for a child killed by signal N; an unsandboxed kernel's is -N."""
    if status < 0 or status > 128:
        number = -status if status < 0 else status - 128
        name = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
        return f"its process was killed by {name}"
    return f"its process exited with status {status}"


def _failure(error: str) -> tuple[Cause, str]:
    """Why nbgrader could not grade a notebook whose kernel still runs, from nbgrader's own log: its cause
    and reason."""
    if "CellTimeoutError" in error or "TimeoutError" in error:
        return Cause.CELL_TIMED_OUT, "a cell did not finish within the time limit"
    if "CellExecutionError" in error:
        return Cause.NOT_EXECUTED, "a cell could not be executed"
    last = [line for line in error.strip().splitlines() if line.strip()]
    return Cause.NBGRADER_FAILED, f"nbgrader could not grade it: {last[-1] if last else 'unknown error'}"
