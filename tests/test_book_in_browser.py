"""Every page of the built book, loaded in a real (headless) Chromium with no network but localhost.

Fails on console errors, requests for anything not served by the book itself, broken images, broken
internal links and maths that MathJax did not render. Saves a screenshot of every chapter page.
"""

from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

import pytest

from autograde_tests import nbgrader_course

from .browser import browser, serve
from .conftest import SCREENSHOTS

pytestmark = [pytest.mark.browser, pytest.mark.book]  # the built pages in Chromium

REPO = Path(__file__).resolve().parents[1]
HTML = REPO / "_build" / "html"
# The theme logs this on a visitor's very first page view (no stored colour mode), then uses "auto".
KNOWN_THEME_NOISE = "console error: Got invalid theme mode: . Resetting to auto."
# index.html is Jupyter Book's redirect to the root page: it is tested as a redirect, not as a page.
PAGES = sorted(p.name for p in HTML.glob("*.html") if p.name not in ("genindex.html", "search.html", "index.html"))


@pytest.fixture(scope="module")
def site():
    if not (HTML / "index.html").is_file():
        pytest.fail("the book is not built: run `make book` (make test does it first)")
    with serve(HTML) as base, browser() as chromium:
        yield base, chromium


def open_page(chromium, url):
    """Load ``url``, blocking every request that leaves the local server; return the page and problems."""
    page = chromium.new_page()
    problems = []
    host = urlparse(url).netloc
    page.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))

    def only_local(route):
        if urlparse(route.request.url).netloc == host or route.request.url.startswith("data:"):
            route.continue_()
        else:
            problems.append(f"asks the network for {route.request.url}")
            route.abort()

    page.route("**/*", only_local)
    page.goto(url, wait_until="load")
    return page, problems


@pytest.mark.parametrize("name", PAGES)
def test_page_loads_offline_without_errors(site, name):
    base, chromium = site
    page, problems = open_page(chromium, urljoin(base, name))
    if page.locator(".math").count():
        page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20000)
        page.evaluate("MathJax.startup.promise")
        rendered = page.locator("mjx-container").count()
        assert rendered >= page.locator(".math").count(), f"{name}: maths not rendered by MathJax"
        assert page.locator("mjx-merror").count() == 0, f"{name}: MathJax reported a TeX error"
    broken = page.evaluate("[...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)")
    assert not broken, f"{name}: broken images {broken}"
    links = page.evaluate("[...document.querySelectorAll('a[href]')].map(a => a.href)")
    for link in links:
        target, _ = urldefrag(link)
        if target.startswith(base):
            path = HTML / target[len(base) :]
            assert path.is_file() or (path / "index.html").is_file(), f"{name}: broken link to {link}"
    if name[:2].isdigit():
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / f"{Path(name).stem}.png", full_page=True)
    page.close()
    problems = [p for p in problems if p != KNOWN_THEME_NOISE]
    assert not problems, f"{name}: " + "; ".join(problems)


def test_index_redirects_to_the_introduction(site):
    base, chromium = site
    page, problems = open_page(chromium, base)
    page.wait_for_url(urljoin(base, "intro.html"), timeout=10000)
    page.wait_for_load_state("load")
    assert page.locator("h1").count(), "index.html did not land on a page with a title"
    page.close()
    assert not [p for p in problems if p != KNOWN_THEME_NOISE], problems


# Draws a few of the glossary's Chinese characters, and a code point no font has, in the page's own font:
# a character without a glyph is drawn as that same "tofu" box.
CJK_GLYPHS = """() => {
  const entry = [...document.querySelectorAll("dd")].find(d => /[\\u4e00-\\u9fff]/.test(d.textContent));
  const chars = [...new Set(entry.textContent.match(/[\\u4e00-\\u9fff]/g))].slice(0, 6);
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = 64;
  const context = canvas.getContext("2d");
  const draw = c => {
    context.clearRect(0, 0, 64, 64);
    context.font = "40px " + getComputedStyle(entry).fontFamily;
    context.fillText(c, 4, 48);
    return Array.from(context.getImageData(0, 0, 64, 64).data).join(",");
  };
  const tofu = draw("\\u{10FFFD}");
  return {chars: chars.join(""), boxes: chars.filter(c => draw(c) === tofu).join("")};
}"""


def test_the_glossary_chinese_renders_with_real_glyphs(site):
    base, chromium = site
    page, _ = open_page(chromium, urljoin(base, "glossary.html"))
    drawn = page.evaluate(CJK_GLYPHS)
    page.close()
    assert len(drawn["chars"]) >= 4, drawn
    assert not drawn["boxes"], (f"the glossary's Chinese shows as empty boxes ({drawn['boxes']}): this machine has no "
                                "CJK font (Debian: apt-get install fonts-wqy-microhei; .ci/run installs it)")


def test_every_chapter_page_was_loaded():
    assert {f"{chapter}.html" for chapter in nbgrader_course.chapters(REPO)} <= set(PAGES)


@pytest.mark.parametrize("chapter", nbgrader_course.chapters(REPO))
def test_exercise_link_downloads_the_notebook_from_a_book_opened_as_files(site, chapter):
    """As the README says to read it: ``_build/html/<chapter>.html`` opened as a file, not served. (The
    module's browser is reused: a second Playwright inside the first one's event loop cannot start.)"""
    _, chromium = site
    page = chromium.new_page(accept_downloads=True)
    page.goto((HTML / f"{chapter}.html").as_uri(), wait_until="load")
    with page.expect_download(timeout=30000) as download:
        page.locator(f'a[download="{chapter}.ipynb"]').first.click()
    saved = Path(download.value.path())
    assert download.value.suggested_filename == f"{chapter}.ipynb"
    assert saved.read_bytes() == (REPO / "notebooks" / chapter / f"{chapter}.ipynb").read_bytes()
    page.close()
