"""What the coordinator sends a grading worker for one submission: data only, so that the coordinator,
which never runs a kernel, need not load what a worker grades with (PyTorch among it, about 3 s of a core)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Job:
    """What the coordinator sends a grading worker for one submission (``grade``)."""

    student: str
    chapter: str
    notebook: str  # the rebuilt submission (JSON)
    config: str  # the course's nbgrader_config.py
    solution: str  # the chapter's instructor notebook (JSON)
    timeout: int  # seconds for the whole submission
    cell_timeout: int
    memory_bytes: int
    output_bytes: int  # bytes of messages its cells may send in all (``limits.OUTPUT_BYTES``)
    sandbox: bool
    gpu: bool = False  # the kernel sees the machine's GPUs, and the checks judging it run their cases there too
    # Whether the worker starts the chapter's next kernel now: not for a chapter's last submissions, after
    # which it would wait for nothing (each kernel costs about 2 s of a core to start).
    start_next: bool = True
