"""A class graded on a Dask cluster (``make grade ARGS="--scheduler ..."``): a scheduler and two workers
started here with Dask's own ``dask scheduler`` and ``dask worker`` commands, on 127.0.0.1. The scores
are the local run's; a worker killed mid-task costs no grade; a submission whose grading kills every
worker it meets ends as needs-attention and the batch goes on; a coordinator interrupted and run again
grades only what is missing. The grader's own faults are nobody's score: a worker without the course's
grader (or nbgrader, or with another version of the course package), every worker gone, the scheduler
lost stop the batch with one line and status 1, the earlier grades and files as they were; a worker
whose sandbox cannot start makes each submission need attention, its earlier grade kept."""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import psutil
import pytest
from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin

from autograde_tests import nbgrader_course, scratch_course
from autograde_tests.grading.outcome import Cause

from .adversarial import CHAPTER, WRONG_SOFTMAX, solved, wrong
from .class_batch import LIMITS, grade, outcomes

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.sandbox
BIN = Path(sys.executable).parent
# A worker started from an environment that lacks part of the course's: Python without its site hook (so
# without the environment's editable install of the course package), the packages given on PYTHONPATH.
BARE = [sys.executable, "-S", "-m", "distributed.cli.dask_worker"]
SITE = Path(sysconfig.get_paths()["purelib"])
STOPPED = "python -m autograde_tests.grading: stopped: {} ({} of {} submissions done before it are kept; " \
          "run again to grade the rest)"
# The class: full marks, nothing, full marks, part (a wrong softmax); a test that grades it grades all four.
ANSWERS = [solved, wrong, solved, lambda r: solved(r, softmax=WRONG_SOFTMAX)]


@pytest.fixture(scope="module")
def small_class(tmp_path_factory) -> Path:
    root = scratch_course.scratch_course(REPO, tmp_path_factory.mktemp("class"))
    scratch_course.release(root, CHAPTER)
    release = nbformat.read(root / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    for n, answers in enumerate(ANSWERS):
        scratch_course.submit(root, f"student{n}", CHAPTER, answers(nbformat.from_dict(release)))
    return root


def copy_of(root: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(root, tmp_path / "class", symlinks=True))


def scores(root: Path) -> dict:
    return {pair: (o["status"], o["score"]) for pair, o in outcomes(root).items()}


@pytest.fixture(scope="module")
def local_graded(small_class, tmp_path_factory) -> Path:
    """The class graded on this machine (copy it before grading it again)."""
    root = copy_of(small_class, tmp_path_factory.mktemp("local"))
    run = grade(root)
    assert run.returncode == 0, run.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def local_scores(local_graded) -> dict:
    found = scores(local_graded)
    assert found[f"student0/{CHAPTER}"] == ("graded", 6) and found[f"student1/{CHAPTER}"][1] < 6
    return found


@contextlib.contextmanager
def cluster(folder: Path, workers: dict[str, tuple[list, dict]]):
    """The address of a Dask scheduler started in ``folder`` with ``workers``: for each name, the command
    that starts it (its address appended) and its environment. All are stopped afterwards."""
    env = os.environ | {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    started = [subprocess.Popen([BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                 "--scheduler-file", folder / "scheduler.json"], env=env, cwd=folder,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        # Dask's client waits for the scheduler to write its file, and connects.
        with Client(scheduler_file=str(folder / "scheduler.json"), timeout=60) as client:
            address = client.scheduler.address
        for name, (command, extra) in workers.items():
            started.append(subprocess.Popen([*command, address, "--name", name, "--nthreads", "1",
                                             "--host", "127.0.0.1", "--no-dashboard"], env=env | extra, cwd=folder,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with Client(address) as client:
            client.wait_for_workers(len(workers), timeout=120)
        yield address
    finally:
        for process in started:
            process.send_signal(signal.SIGINT)
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """The address of a Dask scheduler with two grading workers, "left" and "right", each one process
    with one thread under a nanny (which restarts it when it dies), as an instructor starts them."""
    worker = ([BIN / "dask", "worker"], {})
    with cluster(tmp_path_factory.mktemp("dask"), {"left": worker, "right": worker}) as address:
        yield address


def killer(part: str, marker: Path | None) -> WorkerPlugin:
    """For tests only: the worker that starts a task whose key names ``part`` (a student, or the chapter
    for any) dies as the task starts executing, every time, or only once when ``marker`` is given (the
    file then records that it happened). Made in a function so that Dask ships the class itself to the
    workers, which cannot import the tests."""
    class Kill(WorkerPlugin):
        def transition(self, key, start, finish, **kwargs):
            if finish == "executing" and f"-{part}-" in str(key) and not (marker and marker.exists()):
                if marker:
                    marker.touch()
                os._exit(1)
    return Kill()


@pytest.fixture
def plugin(scheduler):
    """Registers a worker plugin for one test; afterwards both workers are back and the plugin gone."""
    with Client(scheduler) as client:
        names = []

        def register(made: WorkerPlugin) -> None:
            names.append(f"test-{len(names)}")
            client.register_plugin(made, name=names[-1])

        yield register
        for name in names:
            client.unregister_worker_plugin(name)
        client.wait_for_workers(2, timeout=120)


def test_a_class_graded_on_dask_workers_gets_the_local_scores(small_class, local_scores, scheduler, tmp_path):
    root = copy_of(small_class, tmp_path)
    run = grade(root, "--scheduler", scheduler)
    assert run.returncode == 0, run.stderr[-3000:]
    assert scores(root) == local_scores
    workers = {o["worker"].split("/")[-1] for o in outcomes(root).values()}
    assert workers == {"left", "right"}
    report = (root / "reports" / "class_report.md").read_text()
    assert "## Who graded what" in report and "/left |" in report and "/right |" in report


def test_a_worker_killed_mid_task_costs_no_grade(small_class, local_scores, scheduler, plugin, tmp_path):
    root = copy_of(small_class, tmp_path)
    plugin(killer("student2", tmp_path / "killed"))
    run = grade(root, "--scheduler", scheduler)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "killed").exists(), "no worker was killed"
    assert scores(root) == local_scores
    with nbgrader_course.gradebook(root) as book:
        graded = [(s.student.id, s.score) for s in book.assignment_submissions(CHAPTER)]
    assert sorted(graded) == sorted((pair.split("/")[0], score) for pair, (_, score) in local_scores.items())


def test_a_submission_that_kills_every_worker_needs_attention(small_class, local_scores, scheduler, plugin, tmp_path):
    root = copy_of(small_class, tmp_path)
    plugin(killer("student3", None))
    run = grade(root, "--scheduler", scheduler)
    assert run.returncode == 0, run.stderr[-3000:]
    found = scores(root)
    assert found.pop(f"student3/{CHAPTER}") == ("needs-attention", None)
    assert outcomes(root)[f"student3/{CHAPTER}"]["cause"] == Cause.KILLED_WORKERS
    assert found == {pair: got for pair, got in local_scores.items() if not pair.startswith("student3/")}


def crowd_killer() -> WorkerPlugin:
    """For tests only: the worker dies whenever a task arrives while it runs another, so that every death
    is charged to two tasks and none can be told from the other; a task run alone is graded."""
    class KillCrowded(WorkerPlugin):
        running = 0

        def transition(self, key, start, finish, **kwargs):
            self.running += (finish == "executing") - (start == "executing")
            if finish == "ready" and self.running:
                os._exit(1)
    return KillCrowded()


def test_submissions_that_die_only_in_company_are_graded_alone(small_class, local_scores, tmp_path):
    """Dask charges a worker's death to every task the worker holds, the ones waiting behind the one it
    runs too, and gives up on a task charged four times: a submission queued behind one that kills its
    worker is given up with it. Given up, each is run again alone: only what it does then is its own."""
    root = copy_of(small_class, tmp_path)
    with cluster(tmp_path, {"one": ([BIN / "dask", "worker"], {})}) as address:
        with Client(address) as client:
            client.register_plugin(crowd_killer(), name="kill")
        run = grade(root, "--scheduler", address)
    assert run.returncode == 0, run.stderr[-3000:]
    assert scores(root) == local_scores


def graded_so_far(coordinator: subprocess.Popen, count: int) -> None:
    """Read the coordinator's progress bar (tqdm, on stderr) as it is written, until ``count`` are graded."""
    written = b""
    while not any(int(n) >= count for n in re.findall(rb"(\d+)/\d+ \[", written)):
        chunk = os.read(coordinator.stderr.fileno(), 4096)
        assert chunk, f"the coordinator ended before {count} were graded:\n{written[-2000:].decode(errors='replace')}"
        written += chunk


def _interruptible() -> None:
    """SIGINT at its default, as a terminal's foreground job has it: a suite started in the background by a
    shell inherits it ignored, and so would the coordinator, which would then grade on through Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_an_interrupted_batch_grades_only_what_is_missing(small_class, local_scores, tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) once two pairs are graded;
    nothing it started survives; the next run grades the rest, though it loses a worker on the way."""
    root = copy_of(small_class, tmp_path)
    command = [sys.executable, "-m", "autograde_tests.grading", "--course", str(root), "--jobs", "1"]
    coordinator = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   preexec_fn=_interruptible)
    graded_so_far(coordinator, 2)
    started = psutil.Process(coordinator.pid).children(recursive=True)
    os.killpg(coordinator.pid, signal.SIGINT)
    coordinator.communicate(timeout=60)
    psutil.wait_procs(started, timeout=30)
    assert [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    done = len(outcomes(root))
    assert 2 <= done < len(ANSWERS)
    # The next run loses a grading worker as it starts its first task: its nanny starts another, and Dask
    # runs the task again.
    marker = tmp_path / "killed"
    (tmp_path / "kill_once.py").write_text(KILL_ONCE.format(marker=str(marker)))
    run = subprocess.run([*command[:-2], *LIMITS], capture_output=True, text=True,
                         env=os.environ | {"DASK_DISTRIBUTED__WORKER__PRELOAD": repr([str(tmp_path / "kill_once.py")])})
    assert run.returncode == 0, run.stderr[-3000:]
    assert marker.exists(), "no worker was killed"
    assert f"{len(ANSWERS) - done} graded, {done} unchanged, 0 need attention" in run.stdout
    assert scores(root) == local_scores


# A preload of Dask's, for the local workers of one run: the first worker to start a task dies.
KILL_ONCE = """
import os

from distributed.diagnostics.plugin import WorkerPlugin


class KillOnce(WorkerPlugin):
    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and not os.path.exists({marker!r}):
            open({marker!r}, "x").close()
            os._exit(1)


async def dask_setup(worker):
    await worker.plugin_add(KillOnce(), name="kill-once")
"""


def snapshot(root: Path) -> tuple:
    """What a run the grader's fault stopped leaves as it was: the record of what was graded, the
    gradebook's scores, autograded/ and feedback/."""
    with nbgrader_course.gradebook(root) as book:
        grades = sorted((s.student.id, s.score) for s in book.assignment_submissions(CHAPTER))
    kept = {path.relative_to(root): path.read_bytes() for folder in ("autograded", "feedback")
            for path in (root / folder).rglob("*") if path.is_file()}
    return (root / ".grading" / "state.json").read_bytes(), grades, kept


def stopped(run: subprocess.CompletedProcess) -> str:
    """The one line a stopped batch ends with, status 1; no traceback anywhere before it."""
    assert run.returncode == 1, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    return run.stderr.strip().splitlines()[-1]


def links_without_nbgrader(folder: Path) -> Path:
    """A folder of links to each of the environment's packages but nbgrader."""
    folder.mkdir()
    for entry in SITE.iterdir():
        if not entry.name.startswith("nbgrader"):
            (folder / entry.name).symlink_to(entry)
    return folder


def another_version(folder: Path) -> Path:
    """A clone of the course package with one line more in the grader."""
    shutil.copytree(REPO / "autograde_tests", folder / "autograde_tests", ignore=shutil.ignore_patterns("__pycache__"))
    with open(folder / "autograde_tests" / "grading" / "worker.py", "a") as source:
        source.write("# another version\n")
    return folder


@pytest.mark.parametrize("environment, reason", [
    (lambda tmp: str(SITE),
     "cannot import the course's grader (No module named 'autograde_tests'): install the course's environment there"),
    (lambda tmp: f"{REPO}{os.pathsep}{links_without_nbgrader(tmp / 'site')}",
     "cannot import the course's grader (No module named 'nbgrader'): install the course's environment there"),
    (lambda tmp: f"{another_version(tmp / 'clone')}{os.pathsep}{SITE}",
     "has another version of the course package than this coordinator ({tmp}/clone/autograde_tests): "
     "update it there and restart the worker"),
], ids=["without-the-course-package", "without-nbgrader", "another-version"])
def test_a_worker_without_the_courses_grader_stops_the_batch_in_one_line(local_graded, tmp_path, environment, reason):
    """Grading again (--force) on a worker started from another environment: one line names the worker and
    what it lacks; every earlier grade, file and record stays as it was."""
    root = copy_of(local_graded, tmp_path)
    before = snapshot(root)
    with cluster(tmp_path, {"bare": (BARE, {"PYTHONPATH": environment(tmp_path)})}) as address:
        with Client(address) as client:
            (worker,) = client.scheduler_info()["workers"]
        run = grade(root, "--force", "--scheduler", address)
    where = f"the grading worker bare at {worker}"
    assert stopped(run) == STOPPED.format(f"{where} {reason.format(tmp=tmp_path)}", 0, len(ANSWERS))
    assert snapshot(root) == before


def test_when_every_worker_is_gone_the_batch_stops_in_one_line(local_graded, tmp_path):
    """The only worker, with no nanny to start another, dies as it starts its first task."""
    root = copy_of(local_graded, tmp_path)
    before = snapshot(root)
    with cluster(tmp_path, {"alone": ([BIN / "dask", "worker", "--no-nanny"], {})}) as address:
        with Client(address) as client:
            client.register_plugin(killer(CHAPTER, None), name="kill")
        run = grade(root, "--force", "--scheduler", address, "--wait-for-workers", "5")
    reason = f"no grading worker has been connected to the Dask scheduler at {address} for 5 s"
    assert stopped(run) == STOPPED.format(reason, 0, len(ANSWERS))
    assert snapshot(root) == before


def scheduler_killer(pid: int) -> WorkerPlugin:
    """For tests only: the worker that starts a task kills the scheduler (``pid``), then itself."""
    class KillScheduler(WorkerPlugin):
        def transition(self, key, start, finish, **kwargs):
            if finish == "executing":
                os.kill(pid, signal.SIGKILL)
                os._exit(1)
    return KillScheduler()


def test_a_lost_scheduler_stops_the_batch_in_one_line(local_graded, tmp_path):
    root = copy_of(local_graded, tmp_path)
    before = snapshot(root)
    with cluster(tmp_path, {"alone": ([BIN / "dask", "worker", "--no-nanny"], {})}) as address:
        with Client(address) as client:
            client.register_plugin(scheduler_killer(client.run_on_scheduler(os.getpid)), name="kill")
        run = grade(root, "--force", "--scheduler", address)
    assert stopped(run) == STOPPED.format(f"lost the Dask scheduler at {address}", 0, len(ANSWERS))
    assert snapshot(root) == before


def test_an_unreachable_scheduler_stops_the_batch_in_one_line(small_class, tmp_path):
    root = copy_of(small_class, tmp_path)
    with socket.socket() as bound:  # a port of this machine's that refuses connections: nothing listens
        bound.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{bound.getsockname()[1]}"
        run = subprocess.run([sys.executable, "-m", "autograde_tests.grading", "--course", str(root), *LIMITS,
                              "--scheduler", address], capture_output=True, text=True,
                             env=os.environ | {"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2"})
    reason = f"cannot reach the Dask scheduler at {address} (Timed out trying to connect to {address} after 2 s)"
    assert stopped(run) == STOPPED.format(reason, 0, len(ANSWERS))
    assert outcomes(root) == {} and not (root / "autograded").exists()


def test_a_worker_whose_sandbox_cannot_start_makes_each_submission_need_attention(local_graded, tmp_path):
    """A grading node whose bubblewrap cannot start a sandbox (the coordinator's can): every kernel fails
    the grader's probe, and each submission needs attention as the grader's fault, never a 0; its earlier
    grade and files stay, and its record says what a rerun must grade again."""
    root = copy_of(local_graded, tmp_path)
    for n in range(2, len(ANSWERS)):  # two submissions say it
        shutil.rmtree(root / "submitted" / f"student{n}")
    _, grades, kept = snapshot(root)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    (tmp_path / "bin" / "bwrap").chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}"}
    with cluster(tmp_path, {"unsandboxed": ([BIN / "dask", "worker"], env)}) as address:
        run = grade(root, "--force", "--scheduler", address)
    assert run.returncode == 0, run.stderr[-3000:]
    for student in ("student0", "student1"):
        outcome = outcomes(root)[f"{student}/{CHAPTER}"]
        assert (outcome["status"], outcome["cause"]) == ("needs-attention", Cause.GRADER_FAULT), outcome
        assert f"needs attention  {student} / {CHAPTER}: {outcome['reason']}" in run.stdout
    assert "0 graded, 0 unchanged, 2 need attention" in run.stdout
    assert snapshot(root)[1:] == (grades, kept)
