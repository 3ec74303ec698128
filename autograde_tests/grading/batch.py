"""Grade a class: every (student, chapter) pair on its own, in parallel, and never stop the batch.

This process is the coordinator. For each pair it reads the submission, rebuilds it around the release
(``submissions``) and notes what its code does (``advisories``, for the report only); it sends each to a
grading worker as a Dask task (``worker.grade``): a local cluster of ``--jobs`` worker processes, or the
workers of a Dask scheduler (``--scheduler``), on other machines too. A worker runs the learner's cells in
a bubblewrap kernel and judges the graded cells itself; what comes back is data. Only this process writes
the course: a pair that was graded is merged into the gradebook, ``autograded/`` and ``feedback/`` as its
result arrives, and the record of what was graded is saved with it, so a batch cut short and run again
grades only what is missing, and a failed regrade leaves the earlier grade as it was. A worker that dies
mid-task has its task run again elsewhere by Dask; a submission that kills workers again and again ends
as needs-attention. A pair whose notebook has not changed since it was graded is skipped.
"""

import contextlib
import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
from distributed import Client, KilledWorker, LocalCluster, as_completed
from tqdm import tqdm

from .. import nbgrader_course
from . import submissions, worker
from .advisories import advisories

WORK = ".grading"


@dataclass(frozen=True)
class Settings:
    course: Path
    chapters: list[str]
    jobs: int
    timeout: int  # seconds for a whole submission, kernel start included
    cell_timeout: int
    memory_bytes: int
    output_chars: int
    force: bool = False
    sandbox: bool = True  # kernels in bubblewrap; off only for trusted work (--no-sandbox)
    scheduler: str | None = None  # a Dask scheduler's address; None: a local cluster of ``jobs`` workers


@dataclass
class Outcome:
    student: str
    chapter: str
    status: str  # "graded", "needs-attention" or "unchanged"
    reason: str = ""
    score: float | None = None
    max_score: float | None = None
    notes: list[str] = field(default_factory=list)  # repairs made to the notebook
    advisories: list[str] = field(default_factory=list)  # what its code does, for a person to look at
    messages: list[str] = field(default_factory=list)
    digest: str = ""
    worker: str = ""  # which grading worker graded it
    seconds: float | None = None  # how long its grading took there


@dataclass(frozen=True)
class Pair:
    student: str
    chapter: str
    notebook: Path | None
    extra_files: tuple[str, ...]


def find_pairs(course: Path, chapters: list[str]) -> list[Pair]:
    """Every submitted/<student>/<chapter>/ folder of the chosen chapters."""
    pairs = []
    for student in sorted(p for p in (course / "submitted").iterdir() if p.is_dir()):
        for chapter in chapters:
            folder = student / chapter
            if folder.is_dir():
                notebook = folder / f"{chapter}.ipynb"
                extra = tuple(sorted(p.name for p in folder.iterdir() if p != notebook))
                pairs.append(Pair(student.name, chapter, notebook if notebook.is_file() else None, extra))
    return pairs


def load_state(course: Path) -> dict:
    """What the last runs found for each pair, keyed 'student/chapter' (see Outcome)."""
    path = course / WORK / "state.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def grade_class(settings: Settings) -> list[Outcome]:
    course = settings.course
    work = course / WORK
    work.mkdir(mode=0o700, exist_ok=True)
    state = load_state(course)
    outcomes, tasks = [], []
    for pair in find_pairs(course, settings.chapters):
        prepared = _prepare(pair, settings, state)
        (outcomes.append(prepared) if isinstance(prepared, Outcome) else tasks.append((pair, *prepared)))
    if tasks:
        with _workers(settings) as client:
            # A key names the pair for people reading Dask's logs; its random tail keeps it apart from any
            # other batch's on a shared scheduler (Dask would hand both the same result).
            running = {client.submit(worker.grade, job, key=f"grade-{pair.student}-{pair.chapter}-{uuid.uuid4().hex}"):
                       (pair, outcome) for pair, job, outcome in tasks}
            for done in tqdm(as_completed(running), total=len(running), desc="grading", unit="submission"):
                pair, outcome = running[done]
                outcomes.append(_merge(course, pair, outcome, _result(done)))
                state[f"{pair.student}/{pair.chapter}"] = asdict(outcomes[-1])
                _save_state(work, state)
    for outcome in outcomes:
        if outcome.status == "needs-attention":
            state[f"{outcome.student}/{outcome.chapter}"] = asdict(outcome)
    _save_state(work, state)
    return sorted(outcomes, key=lambda o: (o.chapter, o.student))


@contextlib.contextmanager
def _workers(settings: Settings) -> Iterator[Client]:
    """A Dask client: of the scheduler named in the settings, or of a local cluster of ``jobs`` processes."""
    if settings.scheduler:
        with Client(settings.scheduler) as client:
            yield client
        return
    # nbgrader runs `alembic` and the kernels from the course environment's bin/.
    env = {"PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    with LocalCluster(n_workers=settings.jobs, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0", env=env) as cluster, Client(cluster) as client:
        yield client


def _result(done) -> dict:
    """A task's result; a task whose grading killed its workers (Dask gave up on it) needs attention."""
    try:
        return done.result()
    except KilledWorker as exc:
        return {"status": "needs-attention",
                "reason": f"grading it killed the grading worker {exc.allowed_failures + 1} times (Dask gave up on it)"}


def _save_state(work: Path, state: dict) -> None:
    staged = work / "state.json.new"
    staged.write_text(json.dumps(state, indent=1, sort_keys=True))
    staged.replace(work / "state.json")


def _prepare(pair: Pair, settings: Settings, state: dict):
    """An outcome when the pair needs no grading; else (the worker's job, the outcome to complete)."""
    def attention(reason, **extra):
        return Outcome(pair.student, pair.chapter, "needs-attention", reason, **extra)

    if pair.notebook is None:
        found = ", ".join(pair.extra_files) or "nothing"
        return attention(f"no {pair.chapter}.ipynb in submitted/{pair.student}/{pair.chapter} (found: {found})")
    digest = submissions.digest(pair.notebook)
    previous = state.get(f"{pair.student}/{pair.chapter}", {})
    if not settings.force and previous.get("digest") == digest and previous.get("status") == "graded":
        return Outcome(pair.student, pair.chapter, "unchanged", score=previous["score"],
                       max_score=previous["max_score"], digest=digest)
    notes = [f"ignored files submitted beside the notebook: {', '.join(pair.extra_files)}"] if pair.extra_files else []
    try:
        submitted = submissions.read(pair.notebook)
    except submissions.Unreadable as exc:
        return attention(f"unreadable notebook: {exc}", digest=digest)
    course = settings.course
    release = nbformat.read(_released(course, pair.chapter), as_version=4)
    rebuilt = submissions.rebuild(submitted, release)
    job = worker.Job(pair.student, pair.chapter, nbformat.writes(rebuilt.notebook),
                     (course / "nbgrader_config.py").read_text(),
                     (course / "solutions" / pair.chapter / f"{pair.chapter}.ipynb").read_text(),
                     settings.timeout, settings.cell_timeout, settings.memory_bytes, settings.output_chars,
                     settings.sandbox)
    outcome = Outcome(pair.student, pair.chapter, "graded", notes=notes + rebuilt.notes,
                      advisories=advisories(rebuilt.learner_code), digest=digest)
    return job, outcome


def _released(course: Path, chapter: str) -> Path:
    """The learners' notebook of ``chapter``, in the course's release folder."""
    release = nbgrader_course.config(course).CourseDirectory.get("release_directory", "release")
    return course / release / chapter / f"{chapter}.ipynb"


def _merge(course: Path, pair: Pair, outcome: Outcome, result: dict) -> Outcome:
    """Complete ``outcome`` with ``result``; a graded pair's files and grades go into the course."""
    outcome.status, outcome.reason = result["status"], result.get("reason", "")
    outcome.messages, outcome.worker, outcome.seconds = result.get("messages", []), result.get("worker", ""), result.get("seconds")
    if outcome.status != "graded":
        return outcome
    staged, submitted = {}, course / "submitted" / pair.student / pair.chapter
    for folder, suffix, text in (("autograded", "ipynb", result["autograded"]), ("feedback", "html", result["feedback"])):
        destination = course / folder / pair.student / pair.chapter
        staged[destination] = destination.with_name(f".{pair.chapter}.new")
        shutil.rmtree(staged[destination], ignore_errors=True)
        staged[destination].mkdir(parents=True)
        (staged[destination] / f"{pair.chapter}.{suffix}").write_text(text)
        # nbgrader's release_feedback finds each learner's feedback in the exchange by these two files,
        # which nbgrader collect leaves beside the submission and nbgrader autograde carries along.
        for name in ("timestamp.txt", "submission_secret.txt"):
            if (submitted / name).is_file():
                shutil.copy2(submitted / name, staged[destination] / name)
    with nbgrader_course.gradebook(course) as book:
        book.update_or_create_student(pair.student)
        book.update_or_create_submission(pair.chapter, pair.student)
        for name, score in result["scores"].items():
            grade = book.find_grade(name, pair.chapter, pair.chapter, pair.student)
            grade.auto_score = score
            grade.needs_manual_grade = grade.manual_score is not None
        book.db.commit()
    for destination, files in staged.items():  # the files follow the grade only once it is written
        shutil.rmtree(destination, ignore_errors=True)
        files.rename(destination)
    outcome.score = sum(result["scores"].values())
    outcome.max_score = sum(result["max_scores"].values())
    return outcome
