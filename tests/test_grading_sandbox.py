"""One submission through the worker and its sandboxed kernel, tested on their own: a kernel that dies,
or that ignores interrupts and never finishes, still ends as needs-attention, and nothing of it is left
running; what the kernel can see and reach."""

import json
import socket
import tempfile
from pathlib import Path

import nbformat
import psutil
import pytest

from autograde_tests import course
from autograde_tests.grading import batch

from .adversarial import CHAPTER, solved, with_extra_cell

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    root = course.scratch_course(REPO, tmp_path_factory.mktemp("template"))
    course.release(root, CHAPTER)
    return root


def run_one(template: Path, tmp_path: Path, notebook, timeout: int, cell_timeout: int = 5) -> tuple[dict, Path]:
    """Grade ``notebook`` as the batch would; the result, and the kernel's exchange folder (a short path, as
    the batch makes it), which names every process of the kernel on its command line."""
    settings = batch.Settings(template, [CHAPTER], jobs=1, timeout=timeout, cell_timeout=cell_timeout,
                              memory_bytes=3 * 2**30, output_chars=100_000)
    job = {"student": "mallory", "chapter": CHAPTER, "notes": [], "advisories": [], "digest": ""}
    exchange = Path(tempfile.mkdtemp(prefix="grading-")) / "0"
    job_dir = batch.write_job(notebook, job, settings, template, tmp_path / "jobs", exchange)
    return batch.run_worker(job_dir, timeout), exchange


def survivors(exchange: Path) -> list:
    return [p for p in psutil.process_iter(["cmdline"]) if str(exchange) in " ".join(p.info["cmdline"] or [])]


def release(template: Path):
    return nbformat.read(template / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)


def test_a_kernel_that_exits_is_reported_not_graded(template, tmp_path):
    notebook = with_extra_cell("import os\nos._exit(1)")(release(template))
    result, exchange = run_one(template, tmp_path, notebook, timeout=120)
    assert result["status"] == "needs-attention" and "kernel died" in result["reason"]
    assert survivors(exchange) == []


IGNORES_INTERRUPTS = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"


def test_a_cell_that_ignores_interrupts_ends_at_the_cell_time_limit(template, tmp_path):
    notebook = with_extra_cell(IGNORES_INTERRUPTS)(release(template))
    result, exchange = run_one(template, tmp_path, notebook, timeout=120, cell_timeout=5)
    assert result == {"status": "needs-attention", "reason": "a cell did not finish within the time limit"}
    assert survivors(exchange) == []


def test_a_kernel_that_ignores_interrupts_is_killed_at_the_submission_time_limit(template, tmp_path):
    notebook = with_extra_cell(IGNORES_INTERRUPTS)(release(template))
    result, exchange = run_one(template, tmp_path, notebook, timeout=25, cell_timeout=600)
    assert result == {"status": "needs-attention", "reason": "timed out after 25 s (killed)"}
    assert survivors(exchange) == []


def test_the_same_machinery_grades_a_correct_notebook(template, tmp_path):
    result, _ = run_one(template, tmp_path, solved(release(template)), timeout=120)
    assert result["status"] == "graded" and sum(result["scores"].values()) == 6


LOOK_AROUND = '''
import json, os, socket, sys
seen = {"uid": os.getuid(), "root": sorted(os.listdir("/")), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
seen["course_visible"] = os.path.exists(COURSE)
package = os.path.dirname(__import__("autograde_tests").__file__)
seen["package"] = sorted(os.listdir(package))
seen["reference_cache"] = os.listdir(os.path.join(package, "reference", "__pycache__")) if os.path.isdir(os.path.join(package, "reference", "__pycache__")) else []
try:
    __import__("autograde_tests.reference.attention")
    seen["graded_reference"] = "imported"
except ImportError as e:
    seen["graded_reference"] = str(e)
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=2)
    seen["grader_port"] = "reached"
except OSError as e:
    seen["grader_port"] = type(e).__name__
try:
    open("/tmp/big", "wb").write(b"x" * (65 * 2**20))
    seen["big_file"] = "written"
except OSError as e:
    seen["big_file"] = type(e).__name__
print("SEEN" + json.dumps(seen))
'''


def test_the_kernel_sees_no_course_no_network_and_not_the_graded_reference(template, tmp_path):
    """What bubblewrap promises, seen from inside: an unprivileged uid, a few processes of its own, no
    course folder, no way to the grader's network, the graded chapter's reference (and its compiled
    copy) absent, and the file-size limit."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    source = LOOK_AROUND.replace("COURSE", repr(str(template))).replace("PORT", str(listener.getsockname()[1]))
    result, _ = run_one(template, tmp_path, with_extra_cell(source)(release(template)), timeout=120)
    listener.close()
    assert result["status"] == "graded"
    outputs = [o.get("text", "") for c in nbformat.read(result["autograded"], as_version=4).cells for o in c.get("outputs", [])]
    seen = json.loads(next(t for t in outputs if t.startswith("SEEN")).removeprefix("SEEN"))
    assert seen["uid"] == 65534
    assert max(seen["pids"]) < 20  # its own PID namespace
    assert seen["course_visible"] is False and "solutions" not in seen["root"]
    assert "not available while it is graded" in seen["graded_reference"]
    assert seen["reference_cache"] == []
    assert seen["grader_port"] in ("ConnectionRefusedError", "OSError")  # its own loopback, nobody listening
    assert seen["big_file"] == "OSError"  # RLIMIT_FSIZE: 64 MiB
