"""Whatever a graded kernel sends, the grader keeps no more of it than the output cap, reads no message
over its size limit, and finishes each submission in bounded time and memory: every way around the cap
(the grader's own reply type, display updates, an execute reply's error, streams, comm messages,
malformed and over-size messages, one message in many frames on each socket) gets its exact score, a
hanging check fails its cell within --cell-timeout, the canary keeps its score, and no grading worker
grows across the batch. Graded through `python -m autograde_tests.grading`."""

import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path

import nbformat
import psutil
import pytest

from autograde_tests import scratch_course

from .adversarial import ATTENTION_OWN_SOFTMAX, CANARY, CHAPTER, SOFTMAX, Case, attack, solved, with_extra_cell

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.sandbox
OUTPUT = 200_000  # --output: bytes of messages a submission's cells may send
CELL_TIMEOUT = 20
TIMEOUT = 150
LIMITS = ["--jobs", "1", "--timeout", str(TIMEOUT), "--cell-timeout", str(CELL_TIMEOUT), "--memory", "3",
          "--output", str(OUTPUT)]
MARGIN = 20_000  # the grader's own additions (its truncation marks, the verdicts' texts)
GRADER_PEAK = 2 * 2**30  # the most memory any grading process (coordinator, worker) may hold at once
# What a worker may hold after a submission beyond what it held after its second (the first ones load torch,
# nbgrader and the checks; another chapter's checks load once; each new kind of flood warms a path once):
# it grew by 3 to 4 MiB a submission, then by about 0.6; since it collects, gives back and has each result
# released, +7.3 MiB in all.
WORKER_GROWTH = 16 * 2**20
AGAIN_GROWTH = 2 * 2**20  # what floods graded a second time may add, in all (measured: +0.2 MiB)
REPLY = "from autograde_tests.remote import MIME\nfrom IPython.display import publish_display_data\n"
KERNEL = "kernel = get_ipython().kernel\nbig = b'x' * 40 * 2**20\n"

FLOODS = [
    Case("floods_with_the_grader_s_reply_type", with_extra_cell(
        REPLY + "for _ in range(200):\n    publish_display_data({MIME: {'reply': 'x' * 500_000}})"), 6),
    Case("answers_every_request_many_times", attack(
        REPLY + "_wrong = softmax\n"
        "def softmax(x, dim=-1):\n"
        "    for _ in range(5):\n        publish_display_data({MIME: {'reply': 'x' * 500_000}})\n"
        "    return _wrong(x, dim)"), 0),
    Case("floods_with_display_updates", with_extra_cell(
        "from IPython.display import display\nhandle = display('x', display_id=True)\n"
        "for _ in range(300):\n    handle.update('y' * 300_000)"), 6),
    Case("updates_one_display_shown_many_times", with_extra_cell(
        "from IPython.display import display, update_display\n"
        "for _ in range(3000):\n    display('a', display_id='same')\n"
        "update_display('y' * 150_000, display_id='same')"), 6),
    Case("raises_a_huge_error", with_extra_cell("raise ValueError('x' * 50_000_000)"), 6),
    Case("raises_an_error_over_the_cap", with_extra_cell("raise ValueError('x' * 600_000)"), 6),
    Case("raises_an_error_of_many_lines", with_extra_cell("raise ValueError('line\\n' * 2_000_000)"), 6),
    Case("prints_one_huge_line", with_extra_cell("print('x' * 50_000_000)"), 6),
    Case("floods_stderr", with_extra_cell("import sys\nfor _ in range(300):\n    sys.stderr.write('e' * 100_000)"), 6),
    Case("floods_comm_messages", with_extra_cell(
        "from comm import create_comm\n"
        "c = create_comm(target_name='jupyter.widget', data={'state': {'_model_name': 'M', 'v': 'y' * 100_000}})\n"
        "for _ in range(300):\n    c.send({'state': {'v': 'y' * 100_000}})\n"
        "create_comm(target_name='jupyter.widget', data={'no': 'state'})"), 6),
    Case("sends_malformed_messages", with_extra_cell(
        "kernel = get_ipython().kernel\nparent = kernel.get_parent()\n"
        "for kind, content in [('display_data', {'no': 'data'}), ('stream', {'text': 1}), ('error', {}),\n"
        "                      ('execute_result', {'data': {}, 'metadata': {}, 'execution_count': 'x' * 1000}),\n"
        "                      ('status', {'execution_state': ['idle']}), ('comm_msg', {})]:\n"
        "    kernel.session.send(kernel.iopub_socket, kind, content, parent=parent)"), 6),
    Case("displays_one_message_over_the_size_limit", with_extra_cell(
        "from IPython.display import publish_display_data\n"
        "publish_display_data({'text/plain': 'x' * 100 * 2**20})"), 6),
    Case("raises_an_error_over_the_size_limit", with_extra_cell("raise ValueError('x' * 100 * 2**20)"), 6),
    # One message in frames each under zmq's limit (the kernel holds one 40 MiB buffer): on iopub 2.4 GB,
    # more than a relay's memory; on shell 120 MiB, more than the largest message a relay passes on (the
    # cell's reply is lost with it); on control 2.4 GB, the answer to the grader's interrupt at the cell's time limit.
    Case("sends_one_message_in_many_frames", with_extra_cell(
        KERNEL + "kernel.session.send(kernel.iopub_socket, 'display_data', "
        "{'data': {'text/plain': 'x'}, 'metadata': {}},\n"
        "                    parent=kernel.get_parent(), buffers=[big] * 60)"), 6),
    Case("replies_in_many_frames", with_extra_cell(
        KERNEL + "kernel.session.send(kernel.shell_stream, 'execute_reply', {'status': 'ok'}, "
        "parent=kernel.get_parent(),\n"
        "                    ident=kernel._parent_ident['shell'], buffers=[big] * 3)"), 6),
    # on stdin, where the kernel calls what the grader lent: 2.4 GB in one message between cells, read by no one
    Case("asks_on_stdin_in_many_frames", with_extra_cell(
        KERNEL + "kernel.session.send(kernel.stdin_socket, 'input_request', {'prompt': '', 'password': False},\n"
        "                    parent=kernel.get_parent(), ident=kernel._parent_ident['shell'], buffers=[big] * 60)"), 6),
    # while judged, input requests the grader never lent anything for: each is answered with an error, in time
    Case("asks_the_grader_for_what_it_never_lent", lambda r: solved(r, SOFTMAX.replace(
        "def softmax(x, dim=-1):\n",
        "def softmax(x, dim=-1):\n    for _ in range(20):\n        try:\n"
        "            input('{\"tree\": ' + 'x' * 100_000)\n        except Exception:\n            pass\n"),
        ATTENTION_OWN_SOFTMAX), 6),
    Case("answers_the_interrupt_in_many_frames", with_extra_cell(
        KERNEL + "interrupt = kernel.interrupt_request\n"
        "async def flood(stream, ident, parent):\n"
        "    kernel.session.send(stream, 'interrupt_reply', {'status': 'ok'}, parent, ident=ident, "
        "buffers=[big] * 60)\n"
        "    await interrupt(stream, ident, parent)\n"
        "kernel.control_handlers['interrupt_request'] = flood\n"
        "while True:\n    pass"), 6),
]
HANGS = [
    # a check's request that never returns fails that test cell, and attention (which calls softmax) too
    Case("loops_forever_when_checked",
         lambda r: solved(r, "def softmax(x, dim=-1):\n    while True:\n        pass"), 0),
    # each call under the cell's time, all of them together over it: test_softmax fails, attention passes
    Case("slow_on_every_check_call", lambda r: solved(
        r, "import time\n" + SOFTMAX.replace("def softmax(x, dim=-1):", "def softmax(x, dim=-1):\n    time.sleep(4)"),
        ATTENTION_OWN_SOFTMAX), 4),
]
CORRECT = Case("correct", solved, 6)
# Graded again after the rest of chapter 1 (a batch grades chapter by chapter, students in name order): once a
# kind of flood has been graded, grading it again leaves the worker holding what it held before.
AGAIN = [dataclasses.replace(case, student=f"zz_again_{case.student}") for case in FLOODS
         if case.student in ("floods_with_display_updates", "floods_stderr", "prints_one_huge_line",
                             "raises_an_error_over_the_cap", "updates_one_display_shown_many_times")]
CASES = [CANARY, CORRECT, *FLOODS, *HANGS, *AGAIN]
LATER = "07_attention_at_scale"  # a later chapter, whose checks send larger tensors
LATER_FLOOD = (REPLY + "from IPython.display import display\nimport sys\nhandle = display('x', display_id=True)\n"
               "for _ in range(100):\n    publish_display_data({MIME: {'reply': 'x' * 500_000}})\n"
               "    handle.update('y' * 300_000)\n    sys.stderr.write('e' * 100_000)")


class PeakMemory:
    """The largest resident memory of any one process of the grader's (not a kernel's), sampled while it runs."""

    def __init__(self, root: psutil.Process):
        self.root, self.peak, self.stop = root, 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop.wait(0.05):
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            kernels = {p.pid for p in processes if _is_kernel(p)}
            for process in processes:
                try:
                    if process.pid not in kernels and process.ppid() not in kernels:
                        self.peak = max(self.peak, process.memory_info().rss)
                except psutil.NoSuchProcess:
                    pass

    def close(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak


def _is_kernel(process: psutil.Process) -> bool:
    try:
        command = " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return False
    return "sandbox_kernel" in command or "ipykernel_launcher" in command or "bwrap" in command


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = scratch_course.scratch_course(REPO, tmp_path_factory.mktemp("class"))
    release = nbformat.read(scratch_course.release(root, CHAPTER), as_version=4)
    for case in CASES:
        scratch_course.submit(root, case.student, CHAPTER, case.make(nbformat.from_dict(release)))
    scratch_course.release(root, LATER)
    floods = _with_cell_after_the_first_answer(scratch_course.solved(root, LATER), LATER_FLOOD)
    scratch_course.submit(root, "floods", LATER, floods)
    run = subprocess.Popen([sys.executable, "-m", "autograde_tests.grading", "--course", str(root), *LIMITS],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    memory = PeakMemory(psutil.Process(run.pid))
    stdout, stderr = run.communicate()
    peak = memory.close()
    assert run.returncode == 0, stderr[-3000:]
    return root, json.loads((root / ".grading" / "state.json").read_text()), peak


def _with_cell_after_the_first_answer(notebook, source: str):
    first = next(i for i, c in enumerate(notebook.cells) if c.metadata.get("nbgrader", {}).get("solution"))
    notebook.cells.insert(first + 1, nbformat.v4.new_code_cell(source))
    return notebook


def _file(root: Path, folder: str, student: str) -> Path:
    return root / folder / student / CHAPTER / f"{CHAPTER}.{'ipynb' if folder == 'autograded' else 'html'}"


@pytest.mark.parametrize("case", [CANARY, CORRECT, *FLOODS, *AGAIN], ids=lambda c: c.student)
def test_a_flood_of_messages_gets_its_exact_score(graded, case):
    outcome = graded[1][f"{case.student}/{CHAPTER}"]
    assert (outcome["status"], outcome["score"]) == ("graded", case.expected), outcome


def test_a_flood_in_a_later_chapter_keeps_full_marks(graded):
    outcome = graded[1][f"floods/{LATER}"]
    assert (outcome["status"], outcome["score"]) == ("graded", outcome["max_score"]), outcome
    assert outcome["max_score"] == 9


@pytest.mark.parametrize("case", FLOODS, ids=lambda c: c.student)
def test_the_grader_keeps_no_more_than_the_cap(graded, case):
    root = graded[0]
    for folder in ("autograded", "feedback"):
        size, honest = (_file(root, folder, case.student).stat().st_size,
                        _file(root, folder, CORRECT.student).stat().st_size)
        assert size <= honest + OUTPUT + MARGIN, (folder, size, honest)


def test_a_truncated_submission_says_so(graded):
    notebook = nbformat.read(_file(graded[0], "autograded", "floods_with_display_updates"), as_version=4)
    assert any("[output truncated by the grader]" in o.get("text", "")
               for c in notebook.cells for o in c.get("outputs", []))


@pytest.mark.parametrize("case", HANGS, ids=lambda c: c.student)
def test_a_check_request_that_hangs_fails_within_the_cell_timeout(graded, case):
    outcome = graded[1][f"{case.student}/{CHAPTER}"]
    assert (outcome["status"], outcome["score"]) == ("graded", case.expected), outcome
    # finished by the cell limits (two test cells, --cell-timeout each), well before the submission's
    assert outcome["seconds"] < TIMEOUT - CELL_TIMEOUT, outcome


def test_no_grading_process_holds_more_than_its_bound(graded):
    assert 0 < graded[2] < GRADER_PEAK, f"{graded[2] / 2**20:.0f} MiB"


def test_no_worker_grows_across_the_batch(graded):
    held = {}  # (worker, how many submissions it had finished) -> its resident memory then
    for outcome in graded[1].values():
        resources = outcome.get("resources", {})
        if "worker_memory_bytes" in resources:
            held[outcome["worker"], resources["worker_submissions"]] = resources["worker_memory_bytes"]
    baselines = {worker: memory for (worker, count), memory in held.items() if count == 2}
    assert baselines and len(held) >= len(CASES), held
    growth = {key: memory - baselines[key[0]] for key, memory in held.items() if key[1] > 2}
    assert max(growth.values()) <= WORKER_GROWTH, {k: f"{v / 2**20:+.1f} MiB" for k, v in sorted(growth.items())}


def test_a_worker_that_grades_a_flood_again_holds_no_more(graded):
    assert len({outcome["worker"] for outcome in graded[1].values()}) == 1  # --jobs 1: one worker graded them all
    resources = {pair: o["resources"] for pair, o in graded[1].items()}
    in_order = [pair for pair in sorted(resources, key=lambda p: resources[p]["worker_submissions"])
                if pair.endswith(f"/{CHAPTER}")]
    again = in_order[-len(AGAIN):]
    assert {pair.split("/")[0] for pair in again} == {case.student for case in AGAIN}, \
        "the floods graded again were not chapter 1's last"
    before, after = (resources[pair]["worker_memory_bytes"] for pair in (in_order[-len(AGAIN) - 1], again[-1]))
    assert after - before <= AGAIN_GROWTH, f"{(after - before) / 2**20:+.1f} MiB"
