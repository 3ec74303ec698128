"""A failed check in a notebook (JupyterLab's kernel, `nbgrader validate`) shows its message and hint, not
the frames of the course's checking code; when the learner's own code raised, its frames (and only those)
come first, each cell named as JupyterLab names it (``Cell In[4], line 2``). The problem, the case and the
hint each start a line, and every line is wrapped at spaces to ``harness.WIDTH`` columns, since JupyterLab's
output area would break a longer line inside a word."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from autograde_tests.checks.harness import WIDTH, shown

from .adversarial import CHAPTER, wrong

REPO = Path(__file__).resolve().parents[1]

WRONG = "def softmax(x, dim=-1):\n    e = x.exp()\n    return e / e.sum(dim=0, keepdim=True)\n\ncheck_softmax(softmax)"
UNWRITTEN = "def softmax(x, dim=-1):\n    raise NotImplementedError()\n\ncheck_softmax(softmax)"
RAISES = ("def flatten_rows(x):\n    return x.view(-1, 7)\n\ndef softmax(x, dim=-1):\n    return flatten_rows(x)\n\n"
          "check_softmax(softmax)")
# A long message (the RuntimeError's) with its case and a hint, after the frame of the learner's cell.
VIEW = "def merge_heads(x):\n    B, h, T, d_k = x.shape\n    return x.transpose(1, 2).view(B, T, h * d_k)"
CASES = ["wrong", "unwritten", "raises", "view"]


@pytest.fixture(scope="module")
def failures(tmp_path_factory) -> dict[str, nbformat.NotebookNode]:
    cells = ["from autograde_tests.checks import check_merge_heads, check_softmax", WRONG, UNWRITTEN, RAISES, VIEW,
             "check_merge_heads(merge_heads)"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    folder = tmp_path_factory.mktemp("notebook")
    NotebookClient(notebook, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(folder)}}).execute()
    errors = [[o for o in cell.outputs if o.output_type == "error"] for cell in notebook.cells]
    return dict(zip(CASES, [e[0] for e in errors if e]))


@pytest.fixture(scope="module")
def tracebacks(failures) -> dict[str, str]:
    return {case: "\n".join(error.traceback) for case, error in failures.items()}


@pytest.mark.parametrize("case", CASES)
def test_a_failed_check_shows_no_frame_of_the_checks(tracebacks, case):
    shown = tracebacks[case]
    name = "merge_heads" if case == "view" else "softmax"
    assert shown.count(f"AssertionError: {name}: ") == 1, shown
    for course_code in ("harness.py", "checks/attention.py", "During handling", "remote/"):
        assert course_code not in shown, shown


def test_a_recognised_mistake_shows_its_message_and_hint_alone(tracebacks):
    lines = tracebacks["wrong"].splitlines()
    assert lines[0].startswith("AssertionError: softmax: ") and lines[-1].startswith("Hint: "), lines


def test_an_unwritten_function_says_so_without_a_chained_traceback(tracebacks):
    assert tracebacks["unwritten"].splitlines()[0] == "AssertionError: softmax: is not written yet"
    assert "Traceback" not in tracebacks["unwritten"]


def test_an_error_in_the_learners_code_keeps_the_learners_frames_only(tracebacks):
    shown = tracebacks["raises"]
    assert shown.startswith("Traceback of your code (most recent call last):"), shown
    assert "flatten_rows" in shown and "x.view(-1, 7)" in shown
    assert "torch/" not in shown and "site-packages" not in shown
    assert "AssertionError: softmax: raised RuntimeError" in shown


def test_the_learners_frames_name_the_notebook_cell_as_jupyterlab_does(tracebacks):
    """The cell that defined the functions ran fourth: In[4], not the kernel's temporary file for it."""
    assert tracebacks["raises"].splitlines()[1:5] == [
        "  Cell In[4], line 5, in softmax", "    return flatten_rows(x)",
        "  Cell In[4], line 2, in flatten_rows", "    return x.view(-1, 7)"], tracebacks["raises"]
    assert "ipykernel_" not in tracebacks["raises"] and ".py" not in tracebacks["raises"]


def test_a_check_that_restates_a_failure_keeps_the_learners_frame(tracebacks):
    lines = tracebacks["view"].splitlines()
    assert lines[:3] == ["Traceback of your code (most recent call last):", "  Cell In[5], line 3, in merge_heads",
                         "    return x.transpose(1, 2).view(B, T, h * d_k)"], lines


@pytest.mark.parametrize("case", CASES)
def test_every_line_fits_and_the_wrapping_only_moves_words(failures, case):
    """Each line within WIDTH columns; each line of the message (the problem, the case, the hint) starts a line
    of its own, its continuations indented under it; rejoined, they are the message word for word."""
    error = failures[case]
    start = next(i for i, line in enumerate(error.traceback) if line.startswith("AssertionError: "))
    shown_lines = error.traceback[start:]
    assert all(len(line) <= WIDTH for line in error.traceback), error.traceback
    message = f"AssertionError: {error.evalue}".splitlines()
    starts = [line for line in shown_lines if not line.startswith(("    ", "      "))]
    assert [line.split()[0] for line in starts] == [line.split()[0] for line in message], shown_lines
    assert " ".join(" ".join(shown_lines).split()) == " ".join(" ".join(message).split())


def test_the_view_failure_shows_problem_case_and_hint_each_from_a_line_of_its_own(tracebacks):
    lines = tracebacks["view"].splitlines()[3:]
    assert lines == [
        "AssertionError: merge_heads: raised RuntimeError: view size is not compatible",
        "    with input tensor's size and stride (at least one dimension spans across",
        "    two contiguous subspaces). Use .reshape(...) instead.",
        "  when called with (tensor of shape (2, 2, 3, 4), float32, on cpu)",
        "  case: batch=2, length=3, n_heads=2, d_k=4; float32 on cpu",
        "Hint: after a transpose the tensor is no longer contiguous: use .reshape, or",
        "      .contiguous().view.",
    ], lines


def test_a_word_longer_than_a_line_is_never_split():
    path = "/home/learner/" + "a" * 100 + ".py"
    lines = shown(f"f: cannot read {path}\n  when called with (1)\nHint: look at {path} and fix it.")
    assert lines == ["f: cannot read", f"    {path}", "  when called with (1)", "Hint: look at", f"      {path}",
                     "      and fix it."], lines


def test_nbgrader_validate_shows_the_message_without_the_checks_frames(tmp_path):
    notebook = wrong(nbformat.read(REPO / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4))
    path = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(notebook, path)
    run = subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(path)], capture_output=True, text=True,
                         cwd=tmp_path)
    assert "AssertionError: softmax: normalises over dim 0" in run.stdout and "Hint: " in run.stdout, run.stdout
    assert "harness.py" not in run.stdout and "checks/attention.py" not in run.stdout, run.stdout
