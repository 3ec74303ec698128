"""What the OS bounds and reports for a whole submission, through the real ``python -m autograde_tests.grading
--jobs 1`` on a scratch class: processes and memory of everything a kernel starts (its cgroup, measured from
outside), /dev/shm and the kernel's sockets folder (size-capped tmpfs, nothing on the host), outcomes from
the OS rather than from learner text, and grading from a clone other than the environment's own.

Each submission's extra cell comes after the last graded cell (``at_the_end``), so its answers are judged
first: a score is exactly what the answers earn, whatever the cell does afterwards.
"""

import json
import subprocess
import sys
import uuid
from pathlib import Path

import nbformat
import pytest

from autograde_tests import scratch_course
from autograde_tests.grading import cgroups, limits
from autograde_tests.grading.outcome import Cause

from .adversarial import CANARY, CHAPTER, WRONG_ATTENTION, solved

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[1]
MEMORY_GIB = 2
LIMITS = ["--jobs", "1", "--timeout", "300", "--cell-timeout", "60", "--memory", str(MEMORY_GIB), "--output", "200000"]
LATER_CHAPTER = "06_decoder_only"
SHM_FILE = f"bounds-test-{uuid.uuid4().hex}"  # a name only this test's kernel writes in its /dev/shm

FORK_BOMB = '''
import subprocess
children = []
try:
    while True:
        children.append(subprocess.Popen(["sleep", "100000"]))
except OSError as refused:
    print(f"FORKS {len(children)} then {type(refused).__name__}")
'''
# Six children of 512 MiB each: under 2 GiB apiece, 3 GiB together. Each says when it holds its memory
# and then waits; a child the OOM killer ends says nothing (its pipe closes).
MEMORY_IN_CHILDREN = '''
import subprocess, sys
hold = "x = b'1' * (512 << 20); print('held', flush=True); input()"
children = [subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            for _ in range(6)]
print("HELD", [child.stdout.readline().strip().decode() for child in children])
'''
FILLS_DEV_SHM = f'''
import errno
written = 0
try:
    for n in range(40):  # 16 MiB files (each under the file-size limit), 640 MiB if nothing stops it
        with open(f"/dev/shm/{SHM_FILE}-{{n}}", "wb") as f:
            f.write(b"x" * (16 << 20))
        written += 16 << 20
except OSError as e:
    print(f"SHM {{errno.errorcode[e.errno]}} after {{written >> 20}} MiB")
'''
FILLS_THE_SOCKETS_FOLDER = '''
import errno, json, os
import ipykernel.connect
connection = ipykernel.connect.get_connection_file()
sockets = os.path.dirname(json.load(open(connection))["ip"])
written = 0
try:
    for n in range(1000):  # 1 MiB files, 1,000 MiB if nothing stops it
        with open(os.path.join(sockets, f"fill-{n}"), "wb") as f:
            f.write(b"x" * (1 << 20))
        written += 1 << 20
except OSError as e:
    print(f"SOCKETS {errno.errorcode[e.errno]} after {written >> 20} MiB")
try:
    open(connection, "ab").write(b"x" * (1 << 20))
except OSError as e:
    print(f"CONNECTION {errno.errorcode[e.errno]}")
'''
ONE_BIG_TENSOR = "big = torch.ones(2**29)  # 2 GiB, in the kernel itself"
RAISES_MEMORY_ERROR = "raise MemoryError(\"can't allocate memory: not enough memory (MemoryError)\")"


def at_the_end(source: str, answers=solved):
    """``answers`` (correct by default) with a cell of the learner's own after the last graded cell."""
    def make(release):
        notebook = answers(release)
        notebook.cells.append(nbformat.v4.new_code_cell(source.strip()))
        return notebook
    return make


SUBMISSIONS = {
    CANARY.student: lambda r: solved(r, attention=WRONG_ATTENTION),
    "fork_bomb": at_the_end(FORK_BOMB),
    "memory_in_six_children": at_the_end(MEMORY_IN_CHILDREN),
    "fills_dev_shm": at_the_end(FILLS_DEV_SHM),
    "fills_the_sockets_folder": at_the_end(FILLS_THE_SOCKETS_FOLDER),
    "raises_memory_error": at_the_end(RAISES_MEMORY_ERROR),
    "one_big_tensor": at_the_end(ONE_BIG_TENSOR),
}


def grade(root: Path, cwd: Path = REPO, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograde_tests.grading", "--course", str(root), *LIMITS, *args],
                          capture_output=True, text=True, cwd=cwd)


def class_of(root: Path, submissions: dict, repo: Path = REPO) -> Path:
    """A scratch course from ``repo`` with a chapter-1 submission per entry of ``submissions``."""
    scratch_course.scratch_course(repo, root)
    scratch_course.release(root, CHAPTER)
    release = nbformat.read(root / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    for student, make in submissions.items():
        scratch_course.submit(root, student, CHAPTER, make(nbformat.from_dict(release)))
    return root


def outcome(root: Path, student: str, chapter: str = CHAPTER) -> dict:
    return json.loads((root / ".grading" / "state.json").read_text())[f"{student}/{chapter}"]


def printed(root: Path, student: str, chapter: str = CHAPTER) -> str:
    notebook = nbformat.read(root / "autograded" / student / chapter / f"{chapter}.ipynb", as_version=4)
    return "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))


@pytest.fixture(scope="module")
def bounded():
    """Skip, saying why, where no cgroup can bound a submission here."""
    try:
        return cgroups.bounds()
    except cgroups.Unavailable as exc:
        pytest.skip(f"no cgroup can bound a submission here: {exc}")


@pytest.fixture(scope="module")
def graded(tmp_path_factory, bounded):
    root = class_of(tmp_path_factory.mktemp("bounded") / "course", SUBMISSIONS)
    scratch_course.release(root, LATER_CHAPTER)
    scratch_course.submit(root, "raises_memory_error", LATER_CHAPTER,
                  at_the_end(RAISES_MEMORY_ERROR, lambda r: scratch_course.solved(root, LATER_CHAPTER))(None))
    run = grade(root)
    assert run.returncode == 0, run.stderr[-3000:]
    return root, run


def test_a_fork_bomb_stops_at_the_process_cap_counted_from_outside(graded):
    root, _ = graded
    result = outcome(root, "fork_bomb")
    assert (result["status"], result["score"]) == ("graded", 6), result
    assert result["resources"]["peak_processes"] <= limits.PROCESSES
    assert result["resources"]["refused_forks"] >= 1
    forks = next(line for line in printed(root, "fork_bomb").splitlines() if line.startswith("FORKS"))
    assert int(forks.split()[1]) < limits.PROCESSES and forks.endswith("then BlockingIOError")


def test_the_canary_keeps_exactly_its_score(graded):
    root, _ = graded
    result = outcome(root, CANARY.student)
    assert (result["status"], result["score"]) == ("graded", CANARY.expected), result


def test_memory_spread_over_child_processes_is_capped_as_a_whole(graded):
    root, _ = graded
    result = outcome(root, "memory_in_six_children")
    assert (result["status"], result["cause"]) == ("needs-attention", Cause.OUT_OF_MEMORY), result
    assert result["resources"]["oom_kills"] >= 1
    assert result["resources"]["peak_memory_bytes"] <= MEMORY_GIB * 2**30


def test_dev_shm_is_a_small_private_tmpfs(graded):
    root, _ = graded
    assert (outcome(root, "fills_dev_shm")["status"], outcome(root, "fills_dev_shm")["score"]) == ("graded", 6)
    shm = next(line for line in printed(root, "fills_dev_shm").splitlines() if line.startswith("SHM"))
    assert shm.startswith("SHM ENOSPC after ") and int(shm.split()[3]) <= 64, shm
    assert list(Path("/dev/shm").glob(f"{SHM_FILE}*")) == []  # the host's /dev/shm never saw a byte of it


def test_the_sockets_folder_is_a_tiny_tmpfs_and_the_connection_file_read_only(graded):
    root, _ = graded
    result = outcome(root, "fills_the_sockets_folder")
    assert (result["status"], result["score"]) == ("graded", 6), result
    lines = printed(root, "fills_the_sockets_folder").splitlines()
    sockets = next(line for line in lines if line.startswith("SOCKETS"))
    assert sockets.startswith("SOCKETS ENOSPC after ") and int(sockets.split()[3]) <= 1, sockets  # a 1 MiB tmpfs
    assert "CONNECTION EROFS" in lines  # the grader's file, on the grader's disk, is read-only in there


def test_a_kernel_killed_for_memory_needs_attention_for_memory(graded):
    root, _ = graded
    result = outcome(root, "one_big_tensor")
    assert (result["status"], result["cause"]) == ("needs-attention", Cause.OUT_OF_MEMORY), result
    assert result["resources"]["oom_kills"] >= 1


@pytest.mark.parametrize("chapter", [CHAPTER, LATER_CHAPTER])
def test_a_learner_raising_memory_error_is_graded_as_its_answers_earn(graded, chapter):
    root, _ = graded
    result = outcome(root, "raises_memory_error", chapter)
    assert result["status"] == "graded" and result["score"] == result["max_score"] > 0, result
    assert result["resources"]["oom_kills"] == 0


def test_the_report_and_the_output_say_how_submissions_were_bounded_and_what_each_used(graded, bounded):
    root, run = graded
    line = bounded.describe(MEMORY_GIB * 2**30)
    assert line[0].upper() + line[1:] + "." in run.stdout.splitlines()
    report = (root / "reports" / "class_report.md").read_text()
    assert line[0].upper() + line[1:] + "." in report
    fork_bomb = outcome(root, "fork_bomb")["resources"]
    row = next(r for r in report.splitlines() if r.startswith(f"| fork_bomb | {CHAPTER} |"))
    assert row.endswith(f"| {fork_bomb['peak_processes']} ({fork_bomb['refused_forks']} forks refused) |"), row


def test_grading_from_another_clone_uses_that_clone_and_gets_the_right_scores(tmp_path, bounded):
    """The environment's editable install points at this repository; a clone elsewhere grades with its own
    course package, in the grader and in every kernel (the probe checks it), or refuses."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    root = class_of(tmp_path / "course", {CANARY.student: SUBMISSIONS[CANARY.student], "correct": solved}, repo=clone)
    run = grade(root, cwd=clone)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (outcome(root, "correct")["status"], outcome(root, "correct")["score"]) == ("graded", 6)
    assert (outcome(root, CANARY.student)["status"], outcome(root, CANARY.student)["score"]) == ("graded", 2)


def test_a_kernel_that_cannot_start_is_the_graders_fault_never_a_score(tmp_path, bounded):
    """Too little memory for any kernel (10 MiB): the sandbox never answers the probe, and the submission
    needs attention as the grader's fault instead of a 0 for its learner."""
    root = class_of(tmp_path / "course", {"correct": solved})
    run = grade(root, REPO, "--memory", "0.01")
    assert run.returncode == 0, run.stderr[-3000:]
    result = outcome(root, "correct")
    assert (result["status"], result["cause"]) == ("needs-attention", Cause.GRADER_FAULT), result
    assert f"needs attention  correct / 01_attention: {result['reason']}" in run.stdout
