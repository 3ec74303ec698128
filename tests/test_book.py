"""The built book (``make book`` runs before the tests) has every chapter, with its figures."""

import json
import re
from pathlib import Path

import pytest
import yaml

from autograde_tests import nbgrader_course

pytestmark = pytest.mark.book  # reads the built book (make book)

REPO = Path(__file__).resolve().parents[1]
HTML = REPO / "_build" / "html"
# Figures each chapter's page must show, all made by executed code.
FIGURES = {"01_attention": 4, "02_multi_head_attention": 3, "03_attention_variants": 3, "04_ffn_layernorm_residual": 5,
           "05_transformer": 6, "06_decoder_only": 5, "07_attention_at_scale": 3, "08_tokens": 3}


@pytest.fixture(scope="module")
def html():
    if not (HTML / "index.html").is_file():
        pytest.fail("the book is not built: run `make book` (make test does it first)")
    return HTML


def test_table_of_contents_lists_every_chapter_in_order():
    toc = yaml.safe_load((REPO / "book" / "_toc.yml").read_text())
    listed = [entry["file"] for entry in toc["chapters"] if entry["file"][:2].isdigit()]
    assert listed == nbgrader_course.chapters(REPO)


@pytest.mark.parametrize("chapter", nbgrader_course.chapters(REPO))
def test_chapter_page_shows_its_figures(html, chapter):
    page = html / f"{chapter}.html"
    assert page.is_file(), f"{page.name} was not built"
    images = re.findall(r'<img[^>]*src="([^"]+)"', page.read_text())
    assert len(images) >= FIGURES[chapter], f"{page.name} has {len(images)} figures, expected {FIGURES[chapter]}"
    missing = [src for src in images if not (html / src).is_file()]
    assert not missing, f"{page.name} refers to missing images: {missing}"


def test_introduction_covers_history_and_the_three_axes(html):
    text = (html / "intro.html").read_text()
    for fact in ("1943", "2017", "How is similarity computed?", "How many heads?", "Which mask, and which sequences?"):
        assert fact in text


def test_benchmarks_appendix_includes_every_figure_measured(html):
    text = (html / "benchmarks.html").read_text()
    for figure in ("1. Autograding", "2. Class grading", "3. The reference against PyTorch", "4. Training",
                   "5. Building and testing", "6. Generating with and without the KV cache",
                   "7. Attention at scale", "8. The times the notebooks promise",
                   "9. The similarity report against the size of the class"):
        assert figure in text, f"benchmarks.html has no table for figure '{figure}'"
    assert "the floor" in text and "medians of" in text and "CPU:" in text and "students/min" in text


@pytest.mark.parametrize("chapter", nbgrader_course.chapters(REPO))
def test_chapter_page_has_the_course_structure(html, chapter):
    """Goals, prerequisites and time up front; the notebook to download; hints folded; a summary and questions."""
    text = (html / f"{chapter}.html").read_text()
    for part in ("Learning goals", "Prerequisites", "Estimated time", "Summary", "Questions to think about"):
        assert part in text, f"{chapter}.html lacks '{part}'"
    assert f'download="{chapter}.ipynb" href="data:application/x-ipynb+json;base64,' in text, (
        f"{chapter}.html offers no notebook download")
    assert "sd-dropdown" in text, f"{chapter}.html has no folded hint"
    assert re.search(r"(easy|medium|hard)\)", text), f"{chapter}.html does not state each exercise's difficulty"
    assert 'href="glossary.html#term-' in text, f"{chapter}.html links no term to the glossary"


def test_chapter_1_cost_figure_grows_quadratically_as_its_text_says(html):
    """The printed growth per doubling of m = n, from n = 512 on: 4x the multiply-adds, and at least 2.5x
    the measured time (the fastest of several runs on one thread)."""
    text = (html / "01_attention.html").read_text()
    found = re.findall(r"m = n: (\d+) (?:-&gt;|->) (\d+) tokens: "
                       r"([\d.]+)x the multiply-adds, measured ([\d.]+)x the time", text)
    assert [int(before) for before, *_ in found] == [256, 512, 1024], found
    for before, after, counted, measured in found:
        assert float(counted) == 4.0
        if int(before) >= 512:
            assert float(measured) >= 2.5, f"the page says {before} -> {after} tokens costs {measured}x the time"


def _glossary_terms() -> list[str]:
    block = (REPO / "book" / "glossary.md").read_text().split("```{glossary}")[1].split("```")[0]
    return [line.strip() for line in block.splitlines() if line and not line.startswith(" ")]


def _chapters() -> dict[str, str]:
    return {chapter: (REPO / "book" / f"{chapter}.md").read_text() for chapter in nbgrader_course.chapters(REPO)}


def test_every_glossary_term_a_chapter_uses_is_linked_from_a_chapter():
    linked = set()
    for text in _chapters().values():
        for target in re.findall(r"\{term\}`([^`]+)`", text):
            linked.add((re.search(r"<([^>]+)>", target) or re.search(r"(.+)", target)).group(1).lower())
    unlinked = [term for term in _glossary_terms() if term.lower() not in linked
                and any(re.search(rf"\b{re.escape(term)}", text, re.IGNORECASE) for text in _chapters().values())]
    assert not unlinked, f"glossary terms used in a chapter but never linked with {{term}}: {unlinked}"


# "Xiong et al. (2020)", "Ioffe and Szegedy, 2015", "Zhu et al., ByteDance, 2024": a name, then the year.
CITATION = re.compile(r"\b([A-Z][a-zA-Z]+)(?: et al\.| and [A-Z][a-zA-Z]+)?(?:, | \()((?:19|20)\d\d)\b")


def test_every_citation_in_a_chapter_or_the_answers_has_a_reference_entry():
    # the entries of the reference lists, each with its continuation lines (the figure-credit table
    # mentions works too, but is no entry)
    text = (REPO / "book" / "references.md").read_text()
    references = [" ".join(entry.split()) for entry in re.findall(r"^- .*(?:\n  .*)*", text, re.MULTILINE)]
    pages = _chapters() | {"answers": (REPO / "book" / "answers.md").read_text()}
    missing = [f"{page}: {name} ({year})" for page, text in pages.items()
               for name, year in sorted(set(CITATION.findall(text)))
               if not any(name in line and year in line for line in references)]
    assert not missing, f"cited but not in references.md: {missing}"


def test_chapter_2_shows_the_score_memory_growing_with_the_heads(html):
    text = (html / "02_multi_head_attention.html").read_text()
    found = re.search(r"weights \(MiB\): \{1: ([\d.]+), .*64: ([\d.]+)\}", text)
    assert found, "chapter 2 does not print the size of its (B, h, m, n) weights"
    assert float(found.group(2)) == 64 * float(found.group(1))


def test_chapter_4_accounts_for_the_difference_from_xiong_et_al(html):
    """Pre-LN's gradients fall towards the output with inputs of norm 8 and are nearly flat with inputs
    four times larger, as the page explains."""
    text = (html / "04_ffn_layernorm_residual.html").read_text()
    ratios = dict(re.findall(r"Pre-LN, inputs of norm (\d+): layer 1&#39;s gradient / layer 12&#39;s = ([\d.]+)", text)
                  or re.findall(r"Pre-LN, inputs of norm (\d+): layer 1's gradient / layer 12's = ([\d.]+)", text))
    assert float(ratios["8"]) > 1.5 and float(ratios["32"]) < 1.3, ratios


def test_chapter_7_says_what_its_measured_run_shows():
    """The page's reading of `make bench` figure 7 (book/_static/07_attention_at_scale/scale.json)."""
    run = json.loads((REPO / "book" / "_static" / "07_attention_at_scale" / "scale.json").read_text())
    seconds = {(r["kind"], r["T"]): r["seconds"] for r in run["runs"] if r["device"] == "cpu"}
    peak = {(r["kind"], r["T"]): r["peak_bytes"] for r in run["runs"] if r["device"] == "cpu"}
    lengths = sorted({t for _, t in seconds})
    tiled = sorted({k for k, _ in seconds if k.startswith("tiled")})
    naive, fused = "naive (chapter 1)", "F.scaled_dot_product_attention"
    assert run["threads"] == 1, "figure 7 is measured on one thread, as the page says"
    for n in lengths:
        assert min(seconds, key=lambda key: seconds[key] if key[1] == n else float("inf"))[0] == fused, n
    for a, b in zip(lengths, lengths[1:]):
        assert peak[naive, b] / peak[naive, a] > 3.9
        assert all(peak[kind, b] / peak[kind, a] < 2.1 for kind in tiled)
    assert seconds[naive, 1024] / seconds[naive, 512] > 4.5
    assert all(seconds[naive, n] / seconds[fused, n] > 5 for n in lengths if n >= 2048)
    assert all(seconds[kind, n] < seconds[naive, n] for kind in tiled for n in lengths if n >= 1024)
    small, large = sorted(tiled, key=lambda kind: int(kind.split()[-1]))[::len(tiled) - 1]
    assert 2 <= seconds[small, 8192] / seconds[large, 8192] <= 3
