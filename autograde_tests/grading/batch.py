"""Grade a class: every (student, chapter) pair on its own, in parallel, and never stop the batch.

This process is the coordinator. For each pair it reads the submission as data (``submission_files``:
regular files of the submission's own, no link followed; a link, a FIFO, a device or the instructor's own
notebook makes it need attention, and nothing of it is copied), rebuilds it around the release
(``submissions``) and notes what its code does (``advisories``, for the report only); it sends each to a
grading worker as a Dask task (``worker.grade``): a local cluster of ``--jobs`` worker processes, or the
workers of a Dask scheduler (``--scheduler``), on other machines too. A worker runs the learner's cells in
a bubblewrap kernel and judges the graded cells itself; what comes back is data. Only this process writes
the course: a pair that was graded is merged into the gradebook, ``autograded/`` and ``feedback/`` as its
result arrives, and the record of what was graded is saved with it, so a batch cut short and run again
grades only what is missing, and a failed regrade leaves the earlier grade as it was. A worker that dies
mid-task has its task run again elsewhere by Dask; a submission that kills workers again and again ends
as needs-attention. A fault of the grader's own (``cluster``: a worker without the course's grader or
with another version of it, a task that raised, the scheduler lost, no worker left) stops the batch with
``cluster.Stopped``: never anyone's score, and nothing of the pairs not yet merged is written.
A pair whose notebook has not changed since it was graded is skipped. Pairs go out chapter by chapter, so
that the kernel a worker starts ahead (``kernels``) is for the chapter it grades next.
"""

import dataclasses
import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import nbformat
from tqdm import tqdm

from .. import nbgrader_course, submission_files
from . import cluster, limits, submissions
from .advisories import advisories
from .job import Job
from .outcome import Cause, Outcome

WORK = ".grading"
CARRIED = ("timestamp.txt", "submission_secret.txt")  # what goes from submitted/ with a graded submission


@dataclass(frozen=True)
class Settings:
    course: Path
    chapters: list[str]
    jobs: int
    timeout: int  # seconds for a whole submission, kernel start included
    cell_timeout: int
    memory_bytes: int
    output_bytes: int  # bytes of messages a submission's cells may send in all
    force: bool = False
    sandbox: bool = True  # kernels in bubblewrap; off only for trusted work (--no-sandbox)
    scheduler: str | None = None  # a Dask scheduler's address; None: a local cluster of ``jobs`` workers
    refused: tuple = ()  # Refused uploads, from zip collection: each makes its learner need attention
    zip_collected: tuple[str, ...] = ()  # the chapters whose uploads zip collection judged in this run
    worker_patience: float = limits.WORKER_PATIENCE_SECONDS  # with no grading worker connected, then it stops
    similarity: float = limits.SIMILARITY_THRESHOLD  # the similarity report's threshold (``similarity``)
    known_solutions: Path | None = None  # a folder of published answers the report compares with
    gpu: bool = False  # the kernels see the machine's GPUs, and the checks use them (--gpu)


class Refused(NamedTuple):
    """An upload that zip collection left out: its learner (or, ``labelled``, a label naming the upload),
    chapter, reason."""

    student: str
    chapter: str
    reason: str
    labelled: bool = False


@dataclass(frozen=True)
class Pair:
    student: str
    chapter: str
    notebook: Path | None
    extra_files: tuple[str, ...]
    problem: str = ""  # why its folder is not plain files of its own (a link, a FIFO, ...): never read


def find_pairs(course: Path, chapters: list[str]) -> list[Pair]:
    """Every submitted/<student>/<chapter>/ of the chosen chapters. A linked student folder, or a chapter
    folder that holds anything but regular files and folders, comes with its problem and is never read."""
    submitted = course / "submitted"
    if not submitted.is_dir():
        return []
    pairs = []
    for entry in sorted(os.scandir(submitted), key=lambda e: e.name):
        if entry.is_symlink():
            kind = submission_files.kind(Path(entry.path))
            problem = f"submitted/{entry.name} is {kind}: not followed, nothing was graded"
            # The chapters it seems to hold (a stat through the link reads nothing), else every chosen one.
            behind = [c for c in chapters if os.path.isdir(os.path.join(entry.path, c))] or chapters
            pairs += [Pair(entry.name, chapter, None, (), problem) for chapter in behind]
        elif entry.is_dir(follow_symlinks=False):
            pairs += [pair for chapter in chapters if (pair := _pair(submitted, entry.name, chapter))]
    return pairs


def _pair(submitted: Path, student: str, chapter: str) -> Pair | None:
    """The submission in submitted/<student>/<chapter>/, if there is one."""
    folder = submitted / student / chapter
    if not os.path.lexists(folder):
        return None
    problem = submission_files.first_non_data(folder, f"submitted/{student}/{chapter}")
    if problem:
        return Pair(student, chapter, None, (), f"{problem}: nothing was copied or graded")
    notebook = folder / f"{chapter}.ipynb"
    extra = tuple(sorted(p.name for p in folder.iterdir() if p != notebook))
    return Pair(student, chapter, notebook if notebook.is_file() else None, extra)


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
    refused = _refusals(settings.refused)
    _forget_earlier_refusals(state, settings.zip_collected)
    for pair in find_pairs(course, settings.chapters):
        if (pair.student, pair.chapter) in refused:  # an upload of theirs was refused: a person decides
            outcomes.append(refused.pop((pair.student, pair.chapter)))
            continue
        prepared = _prepare(pair, settings, state)
        (outcomes.append(prepared) if isinstance(prepared, Outcome) else tasks.append((pair, *prepared)))
    outcomes += refused.values()
    for outcome in outcomes:  # judged here, before any grading: kept even if the batch stops
        if outcome.status == "needs-attention":
            state[f"{outcome.student}/{outcome.chapter}"] = outcome.record()
    _save_state(work, state)
    if tasks:
        jobs = min(settings.jobs, len(tasks))  # a worker more than there are submissions would only start up
        tasks = _in_chapter_order(tasks, jobs if settings.scheduler is None else 1)
        done = 0
        try:
            with cluster.workers(settings.scheduler, jobs) as client:
                submit = _submitter(client, cluster.package_digest() if settings.scheduler else None)
                running = {submit(task): task for task in tasks}
                with tqdm(total=len(running), desc="grading", unit="submission") as progress:
                    for future, result in cluster.finished(client, running, settings.worker_patience,
                                                              lambda future: submit(running[future])):
                        pair, _, outcome, carried = running.pop(future)
                        outcomes.append(_record_result(course, pair, outcome, result, carried))
                        future.release()  # the worker drops the result once merged, whoever still refers to it
                        state[f"{pair.student}/{pair.chapter}"] = outcomes[-1].record()
                        _save_state(work, state)
                        done += 1
                        progress.update()
        except cluster.Stopped as exc:
            raise cluster.Stopped(f"{exc} ({done} of {len(tasks)} submissions done before it are kept; "
                                  "run again to grade the rest)") from None
    return sorted(outcomes, key=lambda o: (o.chapter, o.student))


def _in_chapter_order(tasks: list, workers: int) -> list:
    """``tasks`` by chapter, then student (Dask starts them in the order they are submitted), so that a worker's
    kernel started ahead is for the chapter it grades next; none is started ahead where fewer than
    ``workers`` submissions of the chapter are left behind a task."""
    tasks = sorted(tasks, key=lambda task: (task[0].chapter, task[0].student))
    last = {pair.chapter: i for i, (pair, *_) in enumerate(tasks)}  # each chapter's last task
    return [(pair, dataclasses.replace(job, start_next=last[pair.chapter] - i >= workers), *rest)
            for i, (pair, job, *rest) in enumerate(tasks)]


def _submitter(client, digest: str | None):
    """A function that submits a pair's job as a Dask task (``cluster.task``) and returns its future."""
    shipped = cluster.task()

    def submit(task) -> object:
        pair, job, _, _ = task
        # A key names the pair for people reading Dask's logs; its random tail keeps it apart from any other
        # batch's on a shared scheduler (Dask would hand both the same result), and from its own earlier try.
        return client.submit(shipped, asdict(job), digest,
                             key=f"grade-{pair.student}-{pair.chapter}-{uuid.uuid4().hex}")
    return submit


def _refusals(refused) -> dict[tuple[str, str], Outcome]:
    """The outcomes of the uploads zip collection refused, per (student, chapter), several reasons joined."""
    reasons: dict[tuple[str, str], list[str]] = {}
    labelled = {}
    for student, chapter, reason, label in refused:
        reasons.setdefault((student, chapter), []).append(reason)
        labelled[(student, chapter)] = label
    return {(student, chapter): Outcome(student, chapter, Cause.REFUSED_UPLOAD, "; ".join(why),
                                        labelled=labelled[(student, chapter)])
            for (student, chapter), why in reasons.items()}


def _forget_earlier_refusals(state: dict, chapters) -> None:
    """Uploads of a chapter collected again are judged anew: what an earlier collection refused under an
    upload's label goes (a learner's own entry is replaced when they are graded or refused again)."""
    for key, entry in list(state.items()):
        if entry["chapter"] in chapters and entry.get("labelled"):
            del state[key]


def _save_state(work: Path, state: dict) -> None:
    staged = work / "state.json.new"
    staged.write_text(json.dumps(state, indent=1, sort_keys=True))
    staged.replace(work / "state.json")


def _prepare(pair: Pair, settings: Settings, state: dict):
    """An outcome when the pair needs no grading; else (the worker's job, the outcome to complete, the
    files nbgrader collect left beside the notebook, to go with its feedback)."""
    def attention(cause, reason, **extra):
        return Outcome(pair.student, pair.chapter, cause, reason, **extra)

    if pair.problem:
        return attention(Cause.NOT_DATA, pair.problem)
    if pair.notebook is None:
        found = ", ".join(pair.extra_files) or "nothing"
        return attention(Cause.NO_NOTEBOOK,
                         f"no {pair.chapter}.ipynb in submitted/{pair.student}/{pair.chapter} (found: {found})")
    course = settings.course
    try:  # read as data, once: what was checked is what is graded, even if the folder changes meanwhile
        notebook = f"{pair.student}/{pair.chapter}/{pair.chapter}.ipynb"
        data = submission_files.read_beneath(course / "submitted", notebook, limits.NOTEBOOK_BYTES)
        carried = _carried(course, pair)
    except submission_files.NotData as exc:
        return attention(Cause.NOT_DATA, f"submitted/{exc}: nothing was copied or graded")
    except OSError as exc:  # it went away or cannot be opened since it was found
        return attention(Cause.UNREADABLE_FILE,
                         f"submitted/{pair.student}/{pair.chapter} could not be read ({exc.strerror}): not graded")
    digest = submissions.digest(data)
    previous = state.get(f"{pair.student}/{pair.chapter}", {})
    if not settings.force and previous.get("digest") == digest and previous.get("status") == "graded":
        return Outcome(pair.student, pair.chapter, Cause.UNCHANGED, score=previous["score"],
                       max_score=previous["max_score"], digest=digest)
    notes = [f"ignored files submitted beside the notebook: {', '.join(pair.extra_files)}"] if pair.extra_files else []
    try:
        submitted = submissions.read(data)
    except submissions.Unreadable as exc:
        return attention(Cause.UNREADABLE_NOTEBOOK, f"unreadable notebook: {exc}", digest=digest)
    solution = (course / "solutions" / pair.chapter / f"{pair.chapter}.ipynb").read_text()
    if submissions.is_instructors(submitted, nbformat.reads(solution, as_version=4)):
        return attention(Cause.INSTRUCTORS_NOTEBOOK, f"this is the instructor's notebook (it holds solutions/"
                         f"{pair.chapter}'s solution regions or hidden tests): not graded", digest=digest)
    release = nbformat.read(nbgrader_course.released(course, pair.chapter), as_version=4)
    rebuilt = submissions.rebuild(submitted, release)
    job = Job(pair.student, pair.chapter, nbformat.writes(rebuilt.notebook),
                     (course / "nbgrader_config.py").read_text(), solution,
                     settings.timeout, settings.cell_timeout, settings.memory_bytes, settings.output_bytes,
                     settings.sandbox, gpu=settings.gpu)
    outcome = Outcome(pair.student, pair.chapter, Cause.GRADED, notes=notes + rebuilt.notes,
                      advisories=advisories(rebuilt.learner_code), digest=digest)
    return job, outcome, carried


def _carried(course: Path, pair: Pair) -> dict[str, bytes]:
    """The files that go with a graded submission's feedback, read as data (NotData for a link, a FIFO...).

    nbgrader's release_feedback finds each learner's feedback in the exchange by these two files, which
    nbgrader collect leaves beside the submission and nbgrader autograde carries along.
    """
    folder = f"{pair.student}/{pair.chapter}"
    return {name: submission_files.read_beneath(course / "submitted", f"{folder}/{name}", limits.CARRIED_BYTES)
            for name in CARRIED if name in pair.extra_files}


def _record_result(course: Path, pair: Pair, outcome: Outcome, result: dict, carried: dict[str, bytes]) -> Outcome:
    """Complete ``outcome`` with ``result``; a graded pair's files (and ``carried``) and grades go into the course."""
    outcome.cause, outcome.reason = Cause(result["cause"]), result.get("reason", "")
    outcome.messages, outcome.worker, outcome.seconds = (result.get("messages", []), result.get("worker", ""),
                                                         result.get("seconds"))
    outcome.resources = result.get("resources", {})
    if outcome.cause != Cause.GRADED:
        return outcome
    staged = {}
    for folder, suffix, text in (("autograded", "ipynb", result["autograded"]),
                                 ("feedback", "html", result["feedback"])):
        destination = course / folder / pair.student / pair.chapter
        staged[destination] = destination.with_name(f".{pair.chapter}.new")
        shutil.rmtree(staged[destination], ignore_errors=True)
        staged[destination].mkdir(parents=True)
        (staged[destination] / f"{pair.chapter}.{suffix}").write_text(text)
        for name, data in carried.items():
            (staged[destination] / name).write_bytes(data)
    with nbgrader_course.gradebook(course) as book:
        book.update_or_create_student(pair.student)
        book.update_or_create_submission(pair.chapter, pair.student)
        for name, score in result["scores"].items():
            grade = book.find_grade(name, pair.chapter, pair.chapter, pair.student)
            grade.auto_score = score
            grade.needs_manual_grade = grade.manual_score is not None
        book.db.commit()
    for destination, written in staged.items():  # the files follow the grade only once it is written
        shutil.rmtree(destination, ignore_errors=True)
        written.rename(destination)
    outcome.score = sum(result["scores"].values())
    outcome.max_score = sum(result["max_scores"].values())
    return outcome
