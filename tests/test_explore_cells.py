"""The notebooks' ungraded explore cells that train work, and keep their promises: switched on, each
trains; left on, it costs Validate and grading nothing: where NBGRADER_EXECUTION is set (nbgrader's
validate and autograde set it, and so does the course's grader), it skips its training and says so. The
time each promises ("under N seconds on one CPU core"), and the time chapter 5's check that your
Transformer can learn promises, are measured by `make bench` (figure 8), never by a timed test: the test
here holds each promise to the figure the book's benchmarks page reports."""

import re
from pathlib import Path

import nbformat
import pytest

from autograde_tests.authoring import bench
from autograde_tests.checks import transformer as transformer_checks
from autograde_tests.grading import sandbox_kernel

REPO = Path(__file__).resolve().parents[1]
SKIPPED = "Not trained: Validate and grading skip this cell, which is not graded."
EXPLORE = bench.explore_cells()
MEASURED = REPO / "book" / "benchmarks_measured.md"


def printed(cell: nbformat.NotebookNode) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream")


def figure_8() -> dict[str, tuple[float, int]]:
    """Figure 8 of the benchmarks page: for each row, its measured CPU seconds and the promise."""
    section = bench.kept_sections(MEASURED)["8"]
    rows = [re.fullmatch(r"\| (.*) \| ([\d.]+) s \| under (\d+) s \(promised\) \| .* \|", line) for line in section]
    return {row.group(1): (float(row.group(2)), int(row.group(3))) for row in rows if row}


def test_the_training_explore_cells_are_found():
    assert {chapter for chapter, _ in EXPLORE} == {"05_transformer", "06_decoder_only"}, EXPLORE


@pytest.mark.parametrize(("chapter", "index"), EXPLORE, ids=[chapter for chapter, _ in EXPLORE])
def test_an_explore_cell_switched_on_trains(chapter, index, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    notebook, _ = bench.switched_on(chapter, index)
    assert "step 250" in printed(notebook.cells[-2]), printed(notebook.cells[-2])


def test_every_promised_time_is_kept_where_make_bench_measured_it():
    """Each promise of the notebooks is a row of figure 8, and the median measured there is under it."""
    measured = figure_8()
    promised = {f"{chapter}'s explore cell switched on (`RUN = True`): CPU seconds":
                int(bench.PROMISE.search(notebook_cells(chapter)[index - 1].source).group(1))
                for chapter, index in EXPLORE}
    steps, seconds = bench.learn_check_promise()
    promised[f"05_transformer's check that your Transformer can learn, all {steps} steps: CPU seconds"] = seconds
    assert {what: promise for what, (_, promise) in measured.items()} == promised
    assert all(median < promise for median, promise in measured.values()), measured


def notebook_cells(chapter: str) -> list:
    return nbformat.read(REPO / "solutions" / chapter / f"{chapter}.ipynb", as_version=4).cells


@pytest.mark.parametrize("execution", ["validate", "autograde"])
@pytest.mark.parametrize(("chapter", "index"), EXPLORE, ids=[chapter for chapter, _ in EXPLORE])
def test_an_explore_cell_left_on_costs_validate_and_grading_no_time(chapter, index, execution, monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", execution)  # the kernel inherits it, as nbgrader's kernels do
    notebook, _ = bench.switched_on(chapter, index)
    assert printed(notebook.cells[-2]) == SKIPPED + "\n"
    assert bench.cpu_seconds(notebook) < 0.5, bench.cpu_seconds(notebook)


def test_the_course_s_grader_runs_its_kernels_as_nbgrader_s_autograde_does(tmp_path):
    """Its sandbox clears the environment, so it sets NBGRADER_EXECUTION itself."""
    arguments = sandbox_kernel.bwrap_arguments("06_decoder_only", tmp_path)
    assert ["--setenv", "NBGRADER_EXECUTION", "autograde"] in [arguments[i:i + 3] for i in range(len(arguments))]


def test_the_transformer_check_trains_every_step_chapter_5_promises():
    """Its longest run: a loss target never met, so every one of the steps the exercise's text promises."""
    steps, _ = bench.learn_check_promise()
    assert steps == transformer_checks.LEARN_STEPS
    assert bench.learn_check_run()[1] == steps
