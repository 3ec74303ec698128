"""A failed check in a notebook (JupyterLab's kernel, `nbgrader validate`) shows its message and hint, not
the frames of the course's checking code; when the learner's own code raised, its frames (and only those)
come first."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from .adversarial import CHAPTER, wrong

REPO = Path(__file__).resolve().parents[1]

WRONG = "def softmax(x, dim=-1):\n    e = x.exp()\n    return e / e.sum(dim=0, keepdim=True)\n\ncheck_softmax(softmax)"
UNWRITTEN = "def softmax(x, dim=-1):\n    raise NotImplementedError()\n\ncheck_softmax(softmax)"
RAISES = ("def flatten_rows(x):\n    return x.view(-1, 7)\n\ndef softmax(x, dim=-1):\n    return flatten_rows(x)\n\n"
          "check_softmax(softmax)")


@pytest.fixture(scope="module")
def tracebacks(tmp_path_factory) -> dict[str, str]:
    cells = ["from autograde_tests.checks import check_softmax", WRONG, UNWRITTEN, RAISES]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    folder = tmp_path_factory.mktemp("notebook")
    NotebookClient(notebook, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(folder)}}).execute()
    shown = {}
    for name, cell in zip(["imports", "wrong", "unwritten", "raises"], notebook.cells):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        shown[name] = "\n".join(errors[0].traceback) if errors else ""
    return shown


@pytest.mark.parametrize("case", ["wrong", "unwritten", "raises"])
def test_a_failed_check_shows_no_frame_of_the_checks(tracebacks, case):
    shown = tracebacks[case]
    assert shown.count("AssertionError: softmax: ") == 1, shown
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


def test_nbgrader_validate_shows_the_message_without_the_checks_frames(tmp_path):
    notebook = wrong(nbformat.read(REPO / "notebooks" / CHAPTER / f"{CHAPTER}.ipynb", as_version=4))
    path = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(notebook, path)
    run = subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert "AssertionError: softmax: normalises over dim 0" in run.stdout and "Hint: " in run.stdout, run.stdout
    assert "harness.py" not in run.stdout and "checks/attention.py" not in run.stdout, run.stdout
