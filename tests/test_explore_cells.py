"""The notebooks' ungraded explore cells that train keep their promises: switched on, each trains within the
time its text promises ("under N seconds on one CPU core"), counted as the kernel's CPU time so that a busy
machine does not count against it (the cell trains on one thread); and left on, it costs Validate and
grading nothing: where NBGRADER_EXECUTION is set (nbgrader's validate and autograde set it, and so does the
course's grader), it skips its training and says so. The other training a notebook times, chapter 5's
check that your Transformer can learn, is held to its promise too."""

import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import autograde_tests.reference as R
from autograde_tests import course
from autograde_tests.checks import transformer as transformer_checks
from autograde_tests.grading import sandbox_kernel

REPO = Path(__file__).resolve().parents[1]
PROMISE = re.compile(r"under (\d+) seconds on one CPU core")
SWITCH = "RUN = False"
SKIPPED = "Not trained: Validate and grading skip this cell, which is not graded."


def explore_cells() -> list[tuple[str, int]]:
    """(chapter, index) of every solution notebook's code cell that trains behind the RUN switch."""
    found = []
    for chapter in course.chapters(REPO):
        notebook = nbformat.read(REPO / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
        found += [(chapter, i) for i, cell in enumerate(notebook.cells)
                  if cell.cell_type == "code" and any(line.startswith(SWITCH) for line in cell.source.splitlines())]
    return found


EXPLORE = explore_cells()


def switched_on(chapter: str, index: int) -> tuple[nbformat.NotebookNode, int]:
    """The solution notebook up to its explore cell, switched on, without the graded test cells (whose
    time is the checks'), with the kernel's CPU seconds for the explore cell printed after it; and the
    seconds its markdown promises."""
    notebook = nbformat.read(REPO / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    promise = PROMISE.search(notebook.cells[index - 1].source)
    assert promise, f"{chapter}: the text before cell {index} promises no time as 'under N seconds on one CPU core'"
    explore = notebook.cells[index]
    explore.source = explore.source.replace(SWITCH, "RUN = True")
    kept = [c for c in notebook.cells[:index] if c.cell_type == "code" and not c.metadata.get("nbgrader", {}).get("grade")]
    notebook.cells = [*kept, nbformat.v4.new_code_cell("import time\n_started = time.process_time()"), explore,
                      nbformat.v4.new_code_cell("print(time.process_time() - _started)")]
    NotebookClient(notebook, kernel_name="python3", timeout=600,
                   resources={"metadata": {"path": str(REPO / "solutions" / chapter)}}).execute()
    return notebook, int(promise.group(1))


def cpu_seconds(notebook: nbformat.NotebookNode) -> float:
    return float(notebook.cells[-1].outputs[0].text)


def printed(cell: nbformat.NotebookNode) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream")


def test_the_training_explore_cells_are_found():
    assert {chapter for chapter, _ in EXPLORE} == {"05_transformer", "06_decoder_only"}, EXPLORE


@pytest.mark.parametrize(("chapter", "index"), EXPLORE, ids=[chapter for chapter, _ in EXPLORE])
def test_an_explore_cell_switched_on_trains_within_the_time_it_promises(chapter, index, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    notebook, promised = switched_on(chapter, index)
    assert "step 250" in printed(notebook.cells[-2]), printed(notebook.cells[-2])
    assert cpu_seconds(notebook) < promised, f"{chapter}: {cpu_seconds(notebook):.1f} s, promised under {promised} s"


@pytest.mark.parametrize("execution", ["validate", "autograde"])
@pytest.mark.parametrize(("chapter", "index"), EXPLORE, ids=[chapter for chapter, _ in EXPLORE])
def test_an_explore_cell_left_on_costs_validate_and_grading_no_time(chapter, index, execution, monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", execution)  # the kernel inherits it, as nbgrader's kernels do
    notebook, _ = switched_on(chapter, index)
    assert printed(notebook.cells[-2]) == SKIPPED + "\n"
    assert cpu_seconds(notebook) < 0.5, cpu_seconds(notebook)


def test_the_course_s_grader_runs_its_kernels_as_nbgrader_s_autograde_does(tmp_path):
    """Its sandbox clears the environment, so it sets NBGRADER_EXECUTION itself."""
    arguments = sandbox_kernel.bwrap_arguments("06_decoder_only", tmp_path)
    assert ["--setenv", "NBGRADER_EXECUTION", "autograde"] in [arguments[i:i + 3] for i in range(len(arguments))]


def test_the_transformer_check_trains_within_the_time_chapter_5_promises(monkeypatch):
    """Its longest run: a loss target never met, so every one of the steps the exercise's text promises."""
    notebook = nbformat.read(REPO / "solutions" / "05_transformer" / "05_transformer.ipynb", as_version=4)
    text = " ".join(" ".join(c.source for c in notebook.cells if c.cell_type == "markdown").split())
    steps, promised = map(int, re.search(r"trains your model for up to (\d+) steps on one small batch of reversals "
                                         r"\(under (\d+) seconds on one CPU core\)", text).groups())
    assert steps == transformer_checks.LEARN_STEPS
    monkeypatch.setattr(transformer_checks, "LEARN_LOSS", 0.0)
    runs, train = [], transformer_checks._train

    def timed(*args):
        started = time.process_time()
        run = train(*args)
        runs.append((time.process_time() - started, len(run["losses"])))
        return run

    monkeypatch.setattr(transformer_checks, "_train", timed)
    transformer_checks.check_transformer(R.Transformer)  # on one thread, as in a graded kernel
    assert [count for _, count in runs] == [steps] and runs[0][0] < promised, runs
