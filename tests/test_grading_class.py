"""`python -m autograde_tests.grading` on a scratch class, kernels in bubblewrap: every hostile submission
of chapter 1 gets its exact score and steals nothing, every honest one full marks, the canary keeps its own
score, and the batch never stops; then re-runs, a failed regrade, bad arguments. Chapters 5, 6 and 7's
attacks are another batch: ``test_grading_later_chapters``."""

import csv
import functools
import http.server
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import nbformat
import psutil
import pytest

from autograde_tests import nbgrader_course, scratch_course
from autograde_tests.grading import __main__ as grading_main
from autograde_tests.grading import bubblewrap, sandbox_kernel
from autograde_tests.grading.outcome import Cause

from .adversarial import ANSWERS, CANARY, CASES, CHAPTER, HONEST, solved
from .class_batch import expect_outcome, grade, outcomes, submit

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.sandbox
COLLECTED = {"timestamp.txt": "2026-01-05 10:00:00.000000 UTC", "submission_secret.txt": "a1b2c3"}


@pytest.fixture(scope="module")
def answers_server(tmp_path_factory):
    """Correct answers served on the grader's loopback: a kernel that could reach it would score them."""
    folder = tmp_path_factory.mktemp("served")
    (folder / "answers.py").write_text(ANSWERS)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture(scope="module")
def graded(tmp_path_factory, answers_server):
    root = scratch_course.scratch_course(REPO, tmp_path_factory.mktemp("class"))
    for chapter in nbgrader_course.chapters(root):
        scratch_course.release(root, chapter)
    submit(root, CASES, {b"{COURSE}": str(root).encode(), b"{GRADER_PORT}": str(answers_server).encode()})
    for chapter in nbgrader_course.chapters(root):
        if chapter != CHAPTER:
            folder = scratch_course.submit(root, "correct", chapter, scratch_course.solved(root, chapter)).parent
            for name, text in COLLECTED.items():  # as `nbgrader collect` leaves them
                (folder / name).write_text(text)
    run = grade(root)
    assert run.returncode == 0, run.stderr[-3000:]
    return root, run


@pytest.fixture(scope="module")
def regraded(graded, tmp_path_factory):
    """A copy of the graded class (the shared one stays as graded) graded again on chapter 1 with
    --zip-collect after three changes: one learner hands in a corrected notebook, another a broken one, and
    an LMS download brings a new learner. Returns the copy, the run, and the broken learner's autograded
    notebook and the state as they were before."""
    root = Path(shutil.copytree(graded[0], tmp_path_factory.mktemp("regraded") / "class", symlinks=True))
    release = nbformat.read(root / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    nbformat.write(solved(release), root / "submitted" / "modifies_inputs_in_place" / CHAPTER / f"{CHAPTER}.ipynb")
    (root / "submitted" / "correct" / CHAPTER / f"{CHAPTER}.ipynb").write_text("{ broken")
    archive = root / "downloaded" / CHAPTER / "archive"
    archive.mkdir(parents=True)
    with zipfile.ZipFile(archive / "lms_download.zip", "w") as bundle:
        bundle.writestr(f"zoe_{CHAPTER}.ipynb", nbformat.writes(solved(release)))
    before = {"autograded": (root / "autograded" / "correct" / CHAPTER / f"{CHAPTER}.ipynb").read_bytes(),
              "state": outcomes(root)}
    run = grade(root, "--chapter", CHAPTER, "--zip-collect")
    assert run.returncode == 0, run.stderr[-2000:]
    return root, run, before


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.student)
def test_adversarial_submission_gets_its_outcome(graded, case):
    expect_outcome(graded[0], case)


def test_the_canary_keeps_exactly_its_score(graded):
    root, _ = graded
    assert outcomes(root)[f"{CANARY.student}/{CHAPTER}"]["score"] == CANARY.expected
    with nbgrader_course.gradebook(root) as gradebook:
        assert gradebook.find_submission(CHAPTER, CANARY.student).score == CANARY.expected


@pytest.mark.parametrize("case", HONEST, ids=lambda c: c.student)
def test_honest_code_is_graded_in_full_and_never_needs_attention(graded, case):
    outcome = outcomes(graded[0])[f"{case.student}/{CHAPTER}"]
    assert (outcome["status"], outcome["score"], outcome["max_score"]) == ("graded", 6, 6), outcome


def test_nothing_a_submission_started_outlives_the_batch(graded):
    assert [p.pid for p in psutil.process_iter(["cmdline"]) if "31337" in " ".join(p.info["cmdline"] or [])] == []
    assert not Path("/tmp/pwned").exists()


def test_every_correct_submission_of_every_chapter_gets_full_marks(graded):
    root, _ = graded
    for chapter in nbgrader_course.chapters(root):
        outcome = outcomes(root)[f"correct/{chapter}"]
        assert outcome["status"] == "graded" and outcome["score"] == outcome["max_score"] > 0, outcome


def test_repairs_are_noted(graded):
    root, _ = graded
    assert any("restored" in note for note in outcomes(root)[f"deleted_test_cell/{CHAPTER}"]["notes"])
    assert any("torch.py" in note for note in outcomes(root)[f"extra_torch_py_beside_it/{CHAPTER}"]["notes"])


def test_gradebook_and_csv_hold_the_scores(graded):
    root, _ = graded
    with nbgrader_course.gradebook(root) as gradebook:
        assert gradebook.find_submission(CHAPTER, "correct").score == 6
        assert gradebook.find_submission(CHAPTER, "modifies_inputs_in_place").score == 2
    rows = list(csv.DictReader((root / "grades.csv").open()))
    assert {"correct", "hard_coded_to_visible_example"} <= {r["student_id"] for r in rows}


def test_feedback_shows_messages_but_not_hidden_tests(graded):
    root, _ = graded
    html = (root / "feedback" / "hard_coded_to_visible_example" / CHAPTER / f"{CHAPTER}.html").read_text()
    assert "and the reference differ" in html
    # the hidden tests' code (the intro's prose may mention `hidden=True`, the calls must not appear)
    assert "softmax, hidden=True)" not in html and "attention, hidden=True)" not in html
    assert "BEGIN HIDDEN TESTS" not in html
    assert "harness.py" not in html  # the checks' frames are never shown


def test_feedback_keeps_what_nbgrader_release_feedback_reads(graded):
    root, _ = graded
    for chapter in nbgrader_course.chapters(root):
        if chapter != CHAPTER:
            for folder in ("autograded", "feedback"):
                for name, text in COLLECTED.items():
                    assert (root / folder / "correct" / chapter / name).read_text() == text


def test_class_report_has_plots_failure_rates_and_mistakes(graded):
    root, _ = graded
    report = (root / "reports" / "class_report.md").read_text()
    assert (root / "reports" / "scores.png").is_file() and (root / "reports" / "failures.png").is_file()
    assert "test_scaled_dot_product_attention" in report
    assert "Most frequent diagnosed mistakes" in report and "softmax: normalises over dim 0" in report
    assert "every kernel ran in a bubblewrap sandbox" in report.lower()
    assert f"honest_writes_and_reads_a_file / {CHAPTER}: reads or writes files" in report
    assert f"rewrites_every_gradebook_it_finds / {CHAPTER}: reads or writes files" in report
    assert "starts processes or shell commands: `torch.os.spawnv`" in report
    assert "## Who graded what" in report and f"| correct | {CHAPTER} | " in report


def test_rerun_grades_only_what_changed(regraded):
    root, run, before = regraded
    assert outcomes(root)[f"modifies_inputs_in_place/{CHAPTER}"]["score"] == 6
    again = {pair for pair, outcome in outcomes(root).items() if outcome != before["state"].get(pair)}
    # what changed, and what needed attention before (judged again each run: nothing of it was kept)
    needed_attention = {pair for pair, outcome in before["state"].items() if outcome["status"] == "needs-attention"}
    changed = {f"{student}/{CHAPTER}" for student in ("modifies_inputs_in_place", "correct", "zoe")}
    assert changed <= again <= changed | needed_attention, again - changed
    assert "\n2 graded, " in run.stdout, run.stdout[-2000:]


def test_a_failed_regrade_keeps_the_earlier_grade(regraded):
    root, run, before = regraded
    outcome = outcomes(root)[f"correct/{CHAPTER}"]
    assert (outcome["status"], outcome["cause"]) == ("needs-attention", Cause.UNREADABLE_NOTEBOOK), outcome
    assert f"needs attention  correct / {CHAPTER}: {outcome['reason']}" in run.stdout
    with nbgrader_course.gradebook(root) as gradebook:
        assert gradebook.find_submission(CHAPTER, "correct").score == 6
    assert (root / "autograded" / "correct" / CHAPTER / f"{CHAPTER}.ipynb").read_bytes() == before["autograded"]


def test_an_lms_zip_is_collected_and_graded(regraded):
    root, _, _ = regraded
    assert outcomes(root)[f"zoe/{CHAPTER}"]["score"] == 6


@pytest.mark.parametrize(
    "args, message",
    [
        (["--chapter", "99_nothing"], "unknown chapter '99_nothing'"),
        (["--jobs", "0"], "must be positive"),
        pytest.param(["--gpu"], "this machine has no NVIDIA GPU",
                     marks=pytest.mark.skipif(bool(sandbox_kernel.gpu_devices()), reason="this machine has a GPU")),
    ],
)
def test_bad_arguments_get_one_line_and_change_nothing(graded, args, message):
    root, _ = graded
    state = (root / ".grading" / "state.json").read_bytes()
    run = grade(root, *args)
    assert run.returncode == 2 and message in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert (root / ".grading" / "state.json").read_bytes() == state


def test_without_a_sandbox_here_grading_is_refused_unless_dask_workers_grade(graded, monkeypatch, capsys):
    """The sandbox must start where the kernels run: here, or on each Dask worker, which checks its own."""
    monkeypatch.setattr(bubblewrap, "unavailable", lambda: "bubblewrap is not installed: install it")
    arguments = ["--course", str(graded[0])]
    with pytest.raises(SystemExit):
        grading_main.parse(arguments)
    assert capsys.readouterr().err.endswith("bubblewrap is not installed: install it "
                                            "(or --no-sandbox, for trusted work only)\n")
    assert grading_main.parse([*arguments, "--scheduler", "tcp://127.0.0.1:8786"]).sandbox


def test_a_folder_that_is_not_a_course_is_refused(tmp_path):
    run = grade(tmp_path)
    assert run.returncode == 2 and "not a course folder" in run.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_course_without_submissions_is_refused(tmp_path):
    root = scratch_course.scratch_course(REPO, tmp_path / "course")
    scratch_course.release(root, CHAPTER)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    run = grade(root)
    assert run.returncode == 2 and "no submitted/ folder" in run.stderr
    (root / "submitted").mkdir()
    run = grade(root)
    assert run.returncode == 2 and "no submissions for" in run.stderr
    shutil.rmtree(root / "submitted")
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_where_no_sandbox_can_start_grading_is_refused_in_one_line(graded, tmp_path):
    """A machine whose bubblewrap cannot start a sandbox (user namespaces closed, as some distributions
    ship): the system's bwrap, preferred to the environment's, fails as it fails there."""
    root, _ = graded
    state = (root / ".grading" / "state.json").read_bytes()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    (tmp_path / "bin" / "bwrap").chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "autograde_tests.grading", "--course", str(root), "--force"],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert "cannot start a sandbox on this machine (bwrap: setting up uid map: Permission denied)" in run.stderr
    assert (root / ".grading" / "state.json").read_bytes() == state


def test_no_sandbox_grades_trusted_work_and_the_report_says_so(tmp_path):
    root = scratch_course.scratch_course(REPO, tmp_path / "course")
    scratch_course.release(root, CHAPTER)
    release = nbformat.read(root / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    scratch_course.submit(root, "instructor", CHAPTER, solved(release))
    run = grade(root, "--no-sandbox")
    assert run.returncode == 0, run.stderr[-2000:]
    assert outcomes(root)[f"instructor/{CHAPTER}"]["score"] == 6
    assert "without a sandbox" in (root / "reports" / "class_report.md").read_text()


def test_the_grader_caps_what_a_kernel_prints(graded):
    root, _ = graded
    notebook = nbformat.read(root / "autograded" / "output_flood" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    printed = sum(len(o.get("text", "")) for cell in notebook.cells for o in cell.get("outputs", []))
    assert printed <= 200_000  # --output; the flood printed 20,000,000 characters
