"""Grade a class: every (student, chapter) pair on its own, in parallel, and never stop the batch.

For each pair the trusted grader (this process) reads the submission, rebuilds it around the release
(``submissions``), notes what its code does (``advisories``, for the report only), and hands it to a
worker process that runs nbgrader in a scratch course: the learner's cells in a kernel confined by
bubblewrap (``sandbox_kernel``), the graded cells judged by the worker itself (``execute``). A worker
past its time limit is killed with its whole process tree. Only a pair that was graded is merged into
the course's gradebook and ``autograded/`` folder, so a failed regrade leaves the earlier grade as it
was. A pair whose notebook has not changed since it was graded is skipped.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
import psutil
from tqdm import tqdm

from .. import course as nbcourse
from .. import nbgrader_course
from . import submissions
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
    pairs = find_pairs(course, settings.chapters)
    template = _template(course, work, sorted({p.chapter for p in pairs}))
    # Each kernel's connection file and sockets, in a short path (a socket's path has at most 107 bytes).
    exchanges = Path(tempfile.mkdtemp(prefix="grading-"))

    outcomes, jobs = [], []
    for number, pair in enumerate(pairs):
        outcome, job_dir = _prepare(pair, settings, template, work, exchanges / str(number), state)
        (outcomes.append(outcome) if outcome else jobs.append((pair, job_dir)))
    with ThreadPoolExecutor(max_workers=settings.jobs) as pool:
        running = {pool.submit(run_worker, job_dir, settings.timeout): (pair, job_dir) for pair, job_dir in jobs}
        for done in tqdm(as_completed(running), total=len(running), desc="grading", unit="submission"):
            pair, job_dir = running[done]
            outcomes.append(_merge(course, pair, job_dir, done.result()))
    shutil.rmtree(exchanges, ignore_errors=True)

    for outcome in outcomes:
        key = f"{outcome.student}/{outcome.chapter}"
        if outcome.status != "unchanged":
            state[key] = asdict(outcome)
    (work / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
    return sorted(outcomes, key=lambda o: (o.chapter, o.student))


def _template(course: Path, work: Path, chapters: list[str]) -> Path:
    """A scratch course whose gradebook knows the chapters: copied for every worker."""
    template = work / "template"
    shutil.rmtree(template, ignore_errors=True)
    nbcourse.scratch_course(course, template)
    for chapter in chapters:
        nbcourse.release(template, chapter)
    return template


def _prepare(pair: Pair, settings: Settings, template: Path, work: Path, exchange: Path, state: dict):
    """Return (an outcome, None) when the pair needs no worker, else (None, the worker's job folder)."""
    def attention(reason, **extra):
        return Outcome(pair.student, pair.chapter, "needs-attention", reason, **extra), None

    if pair.notebook is None:
        found = ", ".join(pair.extra_files) or "nothing"
        return attention(f"no {pair.chapter}.ipynb in submitted/{pair.student}/{pair.chapter} (found: {found})")
    digest = submissions.digest(pair.notebook)
    previous = state.get(f"{pair.student}/{pair.chapter}", {})
    if not settings.force and previous.get("digest") == digest and previous.get("status") == "graded":
        return Outcome(pair.student, pair.chapter, "unchanged", score=previous["score"],
                       max_score=previous["max_score"], digest=digest), None
    notes = [f"ignored files submitted beside the notebook: {', '.join(pair.extra_files)}"] if pair.extra_files else []
    try:
        submitted = submissions.read(pair.notebook)
    except submissions.Unreadable as exc:
        return attention(f"unreadable notebook: {exc}", digest=digest)
    release = nbformat.read(template / "notebooks" / pair.chapter / f"{pair.chapter}.ipynb", as_version=4)
    rebuilt = submissions.rebuild(submitted, release)
    job = {"student": pair.student, "chapter": pair.chapter, "notes": notes + rebuilt.notes,
           "advisories": advisories(rebuilt.learner_code), "digest": digest}
    return None, write_job(rebuilt.notebook, job, settings, template, work / "jobs", exchange)


def write_job(notebook, job: dict, settings: Settings, template: Path, jobs: Path, exchange: Path) -> Path:
    """A worker's folder: a scratch course from ``template`` with ``notebook`` submitted, and job.json."""
    student, chapter = job["student"], job["chapter"]
    job_dir = jobs / student / chapter
    shutil.rmtree(job_dir, ignore_errors=True)
    (job_dir / "course").mkdir(parents=True)
    for name in ("nbgrader_config.py", "gradebook.db"):
        shutil.copy2(template / name, job_dir / "course" / name)
    shutil.copytree(template / "solutions" / chapter, job_dir / "course" / "solutions" / chapter)
    target = job_dir / "course" / "submitted" / student / chapter / f"{chapter}.ipynb"
    target.parent.mkdir(parents=True)
    nbformat.write(notebook, target)
    exchange.mkdir(parents=True)
    job |= {"cell_timeout": settings.cell_timeout, "memory_bytes": settings.memory_bytes,
            "output_chars": settings.output_chars, "sandbox": settings.sandbox, "exchange": str(exchange)}
    (job_dir / "job.json").write_text(json.dumps(job))
    return job_dir


def run_worker(job_dir: Path, timeout: int) -> dict:
    env = os.environ | {
        "JUPYTER_PATH": str(job_dir / "jupyter"),
        "JUPYTER_CONFIG_DIR": str(job_dir / "config"),
        "JUPYTER_RUNTIME_DIR": str(job_dir / "runtime"),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        # Kernels get no GPU in the sandbox, so the checks judging them must not expect one.
        "CUDA_VISIBLE_DEVICES": "",
    }
    with open(job_dir / "worker.log", "w") as log:
        worker = subprocess.Popen([sys.executable, "-m", "autograde_tests.grading.worker", str(job_dir)],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            worker.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"status": "needs-attention", "reason": f"timed out after {timeout} s (killed)"}
        finally:
            _kill_tree(worker.pid)
    result = job_dir / "result.json"
    if result.is_file():
        return json.loads(result.read_text())
    return {"status": "needs-attention", "reason": f"the grading worker failed (exit {worker.returncode}); see {log.name}"}


def _kill_tree(pid: int) -> None:
    """SIGKILL a worker and every process below it (kernels too, whatever signals they ignore), and wait
    until they are gone: a killed process lingers until the kernel has torn it down."""
    try:
        victims = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        victims = []
    for process in victims:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    psutil.wait_procs(victims, timeout=10)


def _merge(course: Path, pair: Pair, job_dir: Path, result: dict) -> Outcome:
    job = json.loads((job_dir / "job.json").read_text())
    outcome = Outcome(pair.student, pair.chapter, result["status"], result.get("reason", ""), notes=job["notes"],
                      advisories=job["advisories"], messages=result.get("messages", []), digest=job["digest"])
    if outcome.status != "graded":
        return outcome
    destination = course / "autograded" / pair.student / pair.chapter
    staged = destination.with_name(f".{pair.chapter}.new")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    shutil.copy2(result["autograded"], staged / f"{pair.chapter}.ipynb")
    with nbgrader_course.gradebook(course) as book:
        book.update_or_create_student(pair.student)
        book.update_or_create_submission(pair.chapter, pair.student)
        for name, score in result["scores"].items():
            grade = book.find_grade(name, pair.chapter, pair.chapter, pair.student)
            grade.auto_score = score
            grade.needs_manual_grade = grade.manual_score is not None
        book.db.commit()
    shutil.rmtree(destination, ignore_errors=True)
    staged.rename(destination)
    outcome.score = sum(result["scores"].values())
    outcome.max_score = sum(result["max_scores"].values())
    return outcome
