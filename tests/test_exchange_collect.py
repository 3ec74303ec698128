"""`nbgrader collect` never follows a link: a real collect, with the course's configuration, over an exchange
whose inbound/ holds planted submissions (a linked notebook, a linked folder, a FIFO, the student id `..`,
a newer linked submission over an earlier honest one). None of them is collected or graded from what it
points at; the honest submission is collected and graded in full by `python -m autograde_tests.grading`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.exchange import ExchangeFactory

from autograde_tests import scratch_course
from autograde_tests.exchange import SafeCollect
from autograde_tests.hub.local_hub import Hub
from autograde_tests.nbgrader_course import config

REPO = Path(__file__).resolve().parents[1]
sandbox = pytest.mark.sandbox  # the tests that grade
# Nothing here hangs: generous limits keep honest work in full marks on a busy machine.
LIMITS = ["--jobs", "1", "--timeout", "300", "--cell-timeout", "60", "--memory", "3", "--output", "200000"]
CHAPTER = "01_attention"
COURSE_ID = "attention-step-by-step"
EARLIER, LATER = "2026-01-05 10:00:00.000000 UTC", "2026-01-06 10:00:00.000000 UTC"
PLANTED = ("mallory", "eve", "fifo")  # never collected at all


def _inbound_path(root: Path, student: str, timestamp: str = EARLIER) -> Path:
    inbound = root.parent / "exchange" / COURSE_ID / "inbound"
    inbound.mkdir(parents=True, exist_ok=True)
    return inbound / f"{student}+{CHAPTER}+{timestamp}+{student}1"


def _inbound(root: Path, student: str, timestamp: str = EARLIER, solved: bool = True) -> Path:
    """A learner's submission as nbgrader submit leaves it in the exchange (a folder with a timestamp)."""
    folder = _inbound_path(root, student, timestamp)
    folder.mkdir()
    (folder / "timestamp.txt").write_text(timestamp)
    if solved:
        nbformat.write(scratch_course.solved(root, CHAPTER), folder / f"{CHAPTER}.ipynb")
    return folder


def _instructors(root: Path) -> Path:
    return root / "solutions" / CHAPTER / f"{CHAPTER}.ipynb"


def _plant(root: Path) -> None:
    _inbound(root, "honest")
    (_inbound(root, "mallory", solved=False) / f"{CHAPTER}.ipynb").symlink_to(_instructors(root))
    _inbound_path(root, "eve").symlink_to(root / "solutions" / CHAPTER, target_is_directory=True)
    os.mkfifo(_inbound(root, "fifo") / "pipe")
    _inbound(root, "..")
    # kept: collected earlier, honestly; its newer submission is a link
    scratch_course.submit(root, "kept", CHAPTER, scratch_course.solved(root, CHAPTER))
    (root / "submitted" / "kept" / CHAPTER / "timestamp.txt").write_text(EARLIER)
    (_inbound(root, "kept", LATER, solved=False) / f"{CHAPTER}.ipynb").symlink_to(_instructors(root))


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    base = tmp_path_factory.mktemp("hub")
    root = scratch_course.scratch_course(REPO, base / "course")
    scratch_course.release(root, CHAPTER)
    with open(root / "nbgrader_config.py", "a") as config:  # the exchange, as the hub's configuration sets it
        config.write(f"\nc.Exchange.root = {str(base / 'exchange')!r}\n")
    _plant(root)
    kept_before = (root / "submitted" / "kept" / CHAPTER / f"{CHAPTER}.ipynb").read_bytes()
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    collect = subprocess.run([sys.executable, "-m", "nbgrader", "collect", CHAPTER, "--update"], cwd=root, env=env,
                             capture_output=True, text=True, timeout=300)
    assert collect.returncode == 0, collect.stderr[-3000:]
    # nbgrader's glob skips names that start with a dot; asked for the student `..` by name, it finds it.
    dotdot = subprocess.run([sys.executable, "-m", "nbgrader", "collect", CHAPTER, "--student=.."], cwd=root,
                            env=env, capture_output=True, text=True, timeout=300)
    assert dotdot.returncode == 0, dotdot.stderr[-3000:]
    graded = subprocess.run([sys.executable, "-m", "autograde_tests.grading", "--course", str(root), *LIMITS],
                            capture_output=True, text=True, timeout=900)
    assert graded.returncode == 0, graded.stderr[-3000:]
    state = json.loads((root / ".grading" / "state.json").read_text())
    return root, collect.stdout + collect.stderr + dotdot.stdout + dotdot.stderr, kept_before, state


@sandbox
def test_the_honest_submission_is_collected_and_graded_in_full(collected):
    root, _, _, state = collected
    assert (root / "submitted" / "honest" / CHAPTER / "timestamp.txt").read_text() == EARLIER
    outcome = state[f"honest/{CHAPTER}"]
    assert (outcome["status"], outcome["score"], outcome["max_score"]) == ("graded", 6, 6), outcome


@sandbox
@pytest.mark.parametrize("student", PLANTED)
def test_a_planted_submission_is_skipped_with_a_warning_and_never_graded(collected, student):
    root, log, _, state = collected
    assert not os.path.lexists(root / "submitted" / student)
    assert f"{student}+{CHAPTER}+" in log and "nothing of it was collected" in log
    assert f"{student}/{CHAPTER}" not in state


@sandbox
def test_the_student_id_dotdot_writes_nothing_beside_submitted(collected):
    root, log, _, _ = collected
    assert not os.path.lexists(root / CHAPTER)
    assert "the student id '..' starts with a dot" in log


@sandbox
def test_a_newer_linked_submission_leaves_the_earlier_collected_copy_as_it_was(collected):
    root, _, kept_before, state = collected
    notebook = root / "submitted" / "kept" / CHAPTER / f"{CHAPTER}.ipynb"
    assert not notebook.is_symlink() and notebook.read_bytes() == kept_before
    assert state[f"kept/{CHAPTER}"]["score"] == 6


@sandbox
def test_nothing_collected_is_a_link_and_no_solution_reaches_autograded_or_feedback(collected):
    root, _, _, _ = collected
    assert not [p for p in (root / "submitted").rglob("*") if p.is_symlink()]
    written = [p for folder in ("autograded", "feedback") for p in (root / folder).rglob("*") if p.is_file()]
    assert sorted({p.relative_to(root).parts[1] for p in written}) == ["honest", "kept"]
    for path in written:
        assert "BEGIN SOLUTION" not in path.read_text(), path
    for path in (root / "feedback").rglob("*.html"):
        assert "BEGIN HIDDEN TESTS" not in path.read_text(), path


@pytest.mark.parametrize("where", ["the hub's", "the course's"])
def test_nbgrader_configuration_collects_safely(tmp_path, where):
    """What every account's nbgrader loads (the hub's), and the instructor's course folder (the course's)."""
    if where == "the hub's":
        hub = Hub(tmp_path / "proxy")
        hub.root = tmp_path
        hub._configure_nbgrader()
        hub.root = None  # nothing of a hub was started: nothing to stop
        folder = tmp_path / "jupyter"
    else:
        folder = REPO
    assert ExchangeFactory(config=config(folder)).collect is SafeCollect
