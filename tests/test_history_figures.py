"""The two figures of concepts the book once told in text only: the timeline of attention's history
(book/intro.md, with its explore cell in chapter 1's notebook) and the measured products of stream-mixing
matrices behind mHC (book/04_ffn_layernorm_residual.md, with its explore cell in chapter 4's notebook).
The timeline draws the dates the text gives; the measurement shows what the text says it shows."""

import contextlib
import io
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HTML = REPO / "_build" / "html"
INTRO = REPO / "book" / "intro.md"
CHAPTER_4 = REPO / "book" / "04_ffn_layernorm_residual.md"


def code_cells(page: Path) -> list[str]:
    """The sources of a MyST page's code cells, without their options."""
    cells = re.findall(r"^```\{code-cell\} ipython3\n(.*?)^```$", page.read_text(), re.S | re.M)
    return [re.sub(r"\A(?:---\n(?s:.*?)\n---\n|(?::\w+:.*\n)+)", "", cell) for cell in cells]


def run(*sources: str) -> tuple[dict, str]:
    """Run code in one namespace, as a kernel would: its names and what it printed."""
    namespace, printed = {"__name__": "__cell__"}, io.StringIO()
    with contextlib.redirect_stdout(printed):
        for source in sources:
            exec(compile(source, "<cell>", "exec"), namespace)
    plt.close("all")
    return namespace, printed.getvalue()


def explore_cell(chapter: str, folder: str, heading: str) -> str:
    """The code cell after the markdown cell that opens with ``heading``; it must be ungraded and empty."""
    notebook = nbformat.read(REPO / folder / chapter / f"{chapter}.ipynb", as_version=4)
    for markdown, code in zip(notebook.cells, notebook.cells[1:]):
        if markdown.cell_type == "markdown" and markdown.source.startswith(heading):
            assert code.cell_type == "code" and "nbgrader" not in code.metadata, f"{chapter}: {heading} is graded"
            assert not code.outputs and code.execution_count is None
            assert "(not graded)" in markdown.source.splitlines()[0]
            return code.source
    raise AssertionError(f"{folder}/{chapter} has no cell '{heading}'")


# --- the timeline ---------------------------------------------------------------------------------------

def history_bullets() -> list[str]:
    text = INTRO.read_text()
    section = text.split("## From a neuron model to the Transformer")[1].split("\n## ")[0]
    return [" ".join(bullet.split()) for bullet in re.findall(r"^- \*\*.*(?:\n(?!- |\n).*)*", section, re.M)]


def timeline_events() -> list[tuple]:
    (source,) = [cell for cell in code_cells(INTRO) if "EVENTS = [" in cell]
    return run(source)[0]["EVENTS"]


def test_every_event_of_the_timeline_is_dated_as_in_the_text():
    bullets = history_bullets()
    for year, name, _, _ in timeline_events():
        holding = [b for b in bullets if str(year) in b and all(part in b for part in name.split(" and "))]
        assert holding, f"the timeline's {name} ({year}) is in no item of the introduction's list with that year"


def test_every_dated_step_of_the_text_from_1990_on_is_on_the_timeline():
    years = {year for year, *_ in timeline_events()}
    headed = [int(y) for b in history_bullets() for y in re.findall(r"^- \*\*(\d{4}),", b)]
    assert [y for y in headed if y >= 1990] and all(y in years for y in headed if y >= 1990), (headed, years)
    assert {1990, 1997, 2014, 2015, 2017} <= years and max(years) > 2017


def test_the_timeline_runs_in_order_of_the_dates():
    years = [year for year, *_ in timeline_events()]
    assert years == sorted(years)


@pytest.mark.parametrize("folder", ["solutions", "notebooks"])
def test_chapter_1_s_notebook_draws_the_introduction_s_timeline(folder):
    source = explore_cell("01_attention", folder, "## Explore: attention's history")
    namespace, _ = run(source)
    assert namespace["EVENTS"] == timeline_events()


# --- the products of stream-mixing matrices -------------------------------------------------------------

@pytest.fixture(scope="module")
def measured():
    """Chapter 4's setup cell and its mHC cell, run as the build runs them: their names and printout."""
    cells = code_cells(CHAPTER_4)
    (figure,) = [cell for cell in cells if "def sinkhorn" in cell]
    return run(cells[0], figure)


def test_sinkhorn_projects_onto_doubly_stochastic_matrices(measured):
    sinkhorn = measured[0]["sinkhorn"]
    torch.manual_seed(1)
    for n in (2, 4, 8):
        logits = torch.randn(50, n, n, dtype=torch.float64)
        h = sinkhorn(logits, n_iters=100)
        assert (h > 0).all()
        ones = torch.ones(50, n, dtype=torch.float64)
        torch.testing.assert_close(h.sum(dim=-1), ones, rtol=0, atol=1e-9)
        torch.testing.assert_close(h.sum(dim=-2), ones, rtol=0, atol=1e-9)
        # spectral norm exactly 1, as the page proves
        torch.testing.assert_close(torch.linalg.matrix_norm(h, ord=2), ones[:, 0], rtol=0, atol=1e-9)


def test_the_projected_product_stays_bounded_and_the_unconstrained_one_does_not(measured):
    namespace, _ = measured
    free, bounded = namespace["gains"]["unconstrained"], namespace["gains"]["doubly stochastic (Sinkhorn)"]
    assert free.shape == bounded.shape == (200, 64, 2)
    assert bounded[..., 0].max() <= 1 + 1e-9 and bounded[..., 0].min() >= 1 - 1e-9
    largest, smallest = free[:, -1, 0].median(), free[:, -1, 1].median()
    assert 35 < largest < 45, "the page says 'about 40'"
    assert smallest < 1e-3, "the page says 'below a thousandth'"
    medians = free[..., 0].median(dim=0).values
    assert (medians[8::8] > medians[:-8:8]).all(), "the page says it grows steadily with depth"


def test_the_projected_product_tends_to_the_averaging_matrix(measured):
    namespace, printed = measured
    product = torch.eye(4, dtype=torch.float64)
    for h in namespace["doubly_stochastic"][0]:
        product = h @ product
    torch.testing.assert_close(product, torch.full((4, 4), 0.25, dtype=torch.float64), rtol=0, atol=1e-9)
    assert "largest singular value at most 1 + " in printed and "averaging matrix" in printed


def test_the_page_says_what_the_measurement_shows():
    text = " ".join(CHAPTER_4.read_text().split())
    for claim in ("has spectral norm exactly 1", "median of about 40 after 64 layers",
                  "the smallest falls below a thousandth", "is 1 at every depth and in every draw"):
        assert claim in text, claim


@pytest.mark.parametrize("folder", ["solutions", "notebooks"])
def test_chapter_4_s_notebook_measures_the_same(folder):
    source = explore_cell("04_ffn_layernorm_residual", folder, "## Explore: mixing several residual streams")
    _, printed = run("import torch\n", source)
    rows = dict(re.findall(r"^\s*(\w[\w ]*\w), largest / smallest singular value: (.*)$", printed, re.M))
    assert set(rows) == {"unconstrained", "doubly stochastic"}, printed
    values = {label: [(int(layer), float(big), float(small))
                      for layer, big, small in re.findall(r"L=(\d+): ([\d.e+-]+) / ([\d.e+-]+)", row)]
              for label, row in rows.items()}
    assert [layer for layer, *_ in values["doubly stochastic"]] == [1, 4, 16, 64]
    assert all(big == 1 for _, big, _ in values["doubly stochastic"])
    _, big, small = values["unconstrained"][-1]
    assert big > 10 and small < 1e-2


# --- the built pages ------------------------------------------------------------------------------------

@pytest.mark.book
@pytest.mark.parametrize(("page", "words"), [("intro.html", "vertical timeline"),
                                             ("04_ffn_layernorm_residual.html", "stream-mixing matrices")])
def test_the_built_page_shows_the_figure_with_its_text_alternative(page, words):
    if not (HTML / "index.html").is_file():
        pytest.fail("the book is not built: run `make book` (make test does it first)")
    images = re.findall(r'<img[^>]*alt="([^"]*)"[^>]*src="([^"]+)"|<img[^>]*src="([^"]+)"[^>]*alt="([^"]*)"',
                        (HTML / page).read_text())
    shown = [(alt or alt2, src or src2) for alt, src, src2, alt2 in images]
    assert any(words in alt and (HTML / src).is_file() for alt, src in shown), shown
