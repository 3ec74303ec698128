"""A class graded on a Dask cluster (``make grade ARGS="--scheduler ..."``): a scheduler and two workers
started here with Dask's own ``dask scheduler`` and ``dask worker`` commands, on 127.0.0.1. The scores
are the local run's; a worker killed mid-task costs no grade; a submission whose grading kills every
worker it meets ends as needs-attention and the batch goes on; a coordinator interrupted and run again
grades only what is missing."""

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import nbformat
import psutil
import pytest
from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin

from autograde_tests import course, nbgrader_course

from .adversarial import CHAPTER, WRONG_SOFTMAX, solved, wrong
from .test_grading_class import grade, outcomes

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.sandbox
BIN = Path(sys.executable).parent
ANSWERS = [solved, wrong, solved, lambda r: solved(r, softmax=WRONG_SOFTMAX), solved, wrong]


@pytest.fixture(scope="module")
def small_class(tmp_path_factory) -> Path:
    root = course.scratch_course(REPO, tmp_path_factory.mktemp("class"))
    course.release(root, CHAPTER)
    release = nbformat.read(root / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    for n, answers in enumerate(ANSWERS):
        course.submit(root, f"student{n}", CHAPTER, answers(nbformat.from_dict(release)))
    return root


def copy_of(root: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(root, tmp_path / "class", symlinks=True))


def scores(root: Path) -> dict:
    return {pair: (o["status"], o["score"]) for pair, o in outcomes(root).items()}


@pytest.fixture(scope="module")
def local_scores(small_class, tmp_path_factory) -> dict:
    root = copy_of(small_class, tmp_path_factory.mktemp("local"))
    run = grade(root)
    assert run.returncode == 0, run.stderr[-3000:]
    found = scores(root)
    assert found[f"student0/{CHAPTER}"] == ("graded", 6) and found[f"student1/{CHAPTER}"][1] < 6
    return found


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """The address of a Dask scheduler with two grading workers, "left" and "right", each one process
    with one thread under a nanny (which restarts it when it dies), as an instructor starts them."""
    folder = tmp_path_factory.mktemp("dask")
    env = os.environ | {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    started = [subprocess.Popen([BIN / "dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                 "--scheduler-file", folder / "scheduler.json"], env=env, cwd=folder,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        # Dask's client waits for the scheduler to write its file, and connects.
        with Client(scheduler_file=str(folder / "scheduler.json"), timeout=60) as client:
            address = client.scheduler.address
        for name in ("left", "right"):
            started.append(subprocess.Popen([BIN / "dask", "worker", address, "--name", name, "--nthreads", "1",
                                             "--host", "127.0.0.1", "--no-dashboard"], env=env, cwd=folder,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with Client(address) as client:
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        for process in started:
            process.send_signal(signal.SIGINT)
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def killer(student: str, marker: Path | None) -> WorkerPlugin:
    """For tests only: the worker that starts grading ``student`` dies as the task starts executing, every
    time, or only once when ``marker`` is given (the file then records that it happened). Made in a
    function so that Dask ships the class itself to the workers, which cannot import the tests."""
    class Kill(WorkerPlugin):
        def transition(self, key, start, finish, **kwargs):
            if finish == "executing" and f"-{student}-" in str(key) and not (marker and marker.exists()):
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
    plugin(killer("student5", None))
    run = grade(root, "--scheduler", scheduler)
    assert run.returncode == 0, run.stderr[-3000:]
    found = scores(root)
    assert found.pop(f"student5/{CHAPTER}") == ("needs-attention", None)
    assert outcomes(root)[f"student5/{CHAPTER}"]["reason"] == "grading it killed the grading worker 4 times (Dask gave up on it)"
    assert found == {pair: got for pair, got in local_scores.items() if not pair.startswith("student5/")}


def graded_so_far(coordinator: subprocess.Popen, count: int) -> None:
    """Read the coordinator's progress bar (tqdm, on stderr) as it is written, until ``count`` are graded."""
    written = b""
    while not any(int(n) >= count for n in re.findall(rb"(\d+)/\d+ \[", written)):
        chunk = os.read(coordinator.stderr.fileno(), 4096)
        assert chunk, f"the coordinator ended before {count} were graded:\n{written[-2000:].decode(errors='replace')}"
        written += chunk


def test_an_interrupted_batch_grades_only_what_is_missing(small_class, local_scores, tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) once two pairs are graded;
    nothing it started survives; the next run grades the rest."""
    root = copy_of(small_class, tmp_path)
    command = [sys.executable, "-m", "autograde_tests.grading", "--course", str(root), "--jobs", "1"]
    coordinator = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    graded_so_far(coordinator, 2)
    started = psutil.Process(coordinator.pid).children(recursive=True)
    os.killpg(coordinator.pid, signal.SIGINT)
    coordinator.communicate(timeout=60)
    psutil.wait_procs(started, timeout=30)
    assert [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    done = len(outcomes(root))
    assert 2 <= done < len(ANSWERS)
    run = grade(root)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"{len(ANSWERS) - done} graded, {done} unchanged, 0 need attention" in run.stdout
    assert scores(root) == local_scores
