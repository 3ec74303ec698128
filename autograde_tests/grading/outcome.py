"""What became of one (student, chapter) submission: a cause, as a code, and beside it the reason, for people.

As isolate's status codes say what ended a run (``TO``, ``SG``, ``RE``, ``XX``), ``Cause`` says why a
submission was graded, skipped, or needs attention: the grading worker and the coordinator set it where
they word the reason, ``.grading/state.json`` and the class report record it, and code and tests read it,
never the reason's words. A submission needs attention for any cause but ``GRADED`` and ``UNCHANGED``; a
person decides what it gets (it is never graded 0 for the grader's fault, nor for the OS's).
"""

from dataclasses import asdict, dataclass, field
from enum import StrEnum

GRADED, UNCHANGED, NEEDS_ATTENTION = "graded", "unchanged", "needs-attention"  # an outcome's status


class Cause(StrEnum):
    """Why an outcome is what it is. Its value is what ``state.json`` and the class report hold."""

    GRADED = "graded"  # its cells ran and its graded cells were judged: it has a score
    UNCHANGED = "unchanged"  # the notebook graded before, unchanged since: its score stands
    # its grading ended without a score (worker.grade, cluster)
    TIMED_OUT = "timed-out"  # the submission's time ran out: its kernel was killed
    CELL_TIMED_OUT = "cell-timed-out"  # a cell did not finish within its time, and ignored the interrupt
    OUT_OF_MEMORY = "out-of-memory"  # the OS ended processes of its cgroup at the memory limit
    KERNEL_DIED = "kernel-died"  # its kernel's process ended (an exit, a signal) before it was graded
    NOT_EXECUTED = "not-executed"  # nbgrader could not execute a cell (its kernel still ran)
    NBGRADER_FAILED = "nbgrader-failed"  # nbgrader could not grade it, for another reason (its log's last line)
    KILLED_WORKERS = "killed-workers"  # grading it killed every grading worker that took it
    # found before any grading (batch): nothing of it was copied or graded
    NOT_DATA = "not-data"  # a link, a FIFO, a device, or a file over its size limit, in the submission's folder
    UNREADABLE_FILE = "unreadable-file"  # its notebook went away, or could not be opened, once found
    NO_NOTEBOOK = "no-notebook"  # no <chapter>.ipynb in its folder
    UNREADABLE_NOTEBOOK = "unreadable-notebook"  # not a notebook nbformat can read
    INSTRUCTORS_NOTEBOOK = "instructors-notebook"  # it holds the instructor's solution regions or hidden tests
    REFUSED_UPLOAD = "refused-upload"  # zip collection left an upload of it out (exchange)
    # the grader's own fault, never the submission's
    GRADER_FAULT = "grader-fault"  # the grader could not give it a working kernel

    @property
    def status(self) -> str:
        """``graded``, ``unchanged`` or ``needs-attention``."""
        return {Cause.GRADED: GRADED, Cause.UNCHANGED: UNCHANGED}.get(self, NEEDS_ATTENTION)


def attention(cause: Cause, reason: str) -> dict:
    """A grading worker's result for a submission that needs attention (``worker.grade``)."""
    return {"status": cause.status, "cause": cause, "reason": reason}


@dataclass
class Outcome:
    """One (student, chapter) pair's outcome, as the batch returns it and ``state.json`` keeps it (``record``)."""

    student: str  # a learner, or (``labelled``) a label standing for an upload that names none
    chapter: str
    cause: Cause
    reason: str = ""  # why it needs attention, for people
    score: float | None = None
    max_score: float | None = None
    notes: list[str] = field(default_factory=list)  # repairs made to the notebook
    advisories: list[str] = field(default_factory=list)  # what its code does, for a person to look at
    messages: list[str] = field(default_factory=list)
    digest: str = ""
    worker: str = ""  # which grading worker graded it
    seconds: float | None = None  # how long its grading took there
    resources: dict = field(default_factory=dict)  # how it was bounded, what the OS counted (worker.grade)
    labelled: bool = False  # ``student`` is a label for an upload zip collection refused, not a learner

    @property
    def status(self) -> str:
        return Cause(self.cause).status

    def record(self) -> dict:
        """What ``state.json`` keeps of it: every field, and its status."""
        return asdict(self) | {"status": self.status}
