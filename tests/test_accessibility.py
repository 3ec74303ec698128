"""Every page of both editions of the book, read as a reader with a screen reader or a phone would meet it.

axe-core (pinned in a11y/package-lock.json, `make a11y`) runs on each page in the light and the dark theme at
1280 px and 390 px wide: any critical or serious violation fails, named by rule, page and nodes. Every image
has a text alternative that is not a file name, Chinese text is marked lang="zh", nothing is wider than
the text column unless it scrolls sideways with a visible cue, and every figure is legible on a phone: a
figure of several panels (one image per panel, cell tag "panels") stands one panel above the other at 390 px
and side by side at 1280 px. Every violation axe finds, whatever its
impact, is written to _build/accessibility/axe.json (counts per rule, edition, theme and width).
"""

import json
import math
import shutil
from collections import Counter
from pathlib import Path
from urllib.parse import urljoin

import pytest

from .browser import browser, serve

pytestmark = [pytest.mark.browser, pytest.mark.book]  # axe-core in Chromium on the built pages

REPO = Path(__file__).resolve().parents[1]
AXE = REPO / "a11y" / "node_modules" / "axe-core" / "axe.min.js"
EDITIONS = {"learner": REPO / "_build" / "html", "instructor": REPO / "_build" / "instructor" / "_build" / "html"}
WIDTHS = {"desktop": 1280, "phone": 390}
THEMES = ("light", "dark")
REPORT = REPO / "_build" / "accessibility" / "axe.json"
# Not pages of their own: Sphinx's generated index and search page, Jupyter Book's redirect.
NOT_PAGES = {"genindex.html", "search.html", "index.html"}


def pages(html: Path) -> list[str]:
    return sorted(str(p.relative_to(html)) for p in html.rglob("*.html")
                  if p.name not in NOT_PAGES and not p.relative_to(html).parts[0].startswith("_"))


CASES = [(edition, name) for edition, html in EDITIONS.items() for name in pages(html)]

# The stored colour mode, as the theme's own button stores it: no "invalid theme mode" noise, light first.
LIGHT_FIRST = "localStorage.setItem('mode', 'light'); localStorage.setItem('theme', 'light');"
# The theme's colours change with a transition: axe reads them once the switch has finished, not midway.
SET_THEME = """async t => {
  document.documentElement.dataset.theme = t;
  document.documentElement.dataset.mode = t;
  await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
  await Promise.all(document.getAnimations().filter(a => a instanceof CSSTransition).map(a => a.finished));
}"""
# label-content-name-mismatch is "experimental" in axe, off unless asked for; WCAG 2.5.3 asks for it.
RUN_AXE = """async () => {
  const result = await axe.run(document, {resultTypes: ["violations"],
                                          rules: {"label-content-name-mismatch": {enabled: true}}});
  return result.violations.map(v => ({rule: v.id, impact: v.impact, help: v.help,
                                      nodes: v.nodes.map(n => n.target.join(" "))}));
}"""
# An image's alternative that a screen reader would read out as noise: empty, a path or a hash.
IMAGES = """() => [...document.querySelectorAll("img")]
  .filter(i => i.getAttribute("role") !== "presentation")
  .map(i => ({src: i.getAttribute("src"), alt: i.getAttribute("alt")}))"""
# Text nodes with Chinese characters, as the page shows them, whose nearest lang is not Chinese. (The print-only
# title Jupyter Book repeats in every page is plain text; it is not read out on screen.)
CHINESE = """() => {
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const wrong = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (!/[\\u3400-\\u9fff]/.test(node.data) || !node.parentElement.checkVisibility()) continue;
    const lang = node.parentElement.closest("[lang]")?.getAttribute("lang") || "";
    if (!lang.startsWith("zh")) wrong.push(node.data.trim());
  }
  return wrong;
}"""
# What a reader cannot see: an element reaching past the text column (unless a scroll box holds it), a scroll
# box that overflows with no cue (no scrollbar taking room, no shadow), a box that clips its content, a page
# that scrolls sideways. Only the outermost offender of each kind is named.
CUT_OFF = """() => {
  const column = document.querySelector("article.bd-article");
  const edge = column.getBoundingClientRect();
  const style = el => getComputedStyle(el);
  const scrolls = el => ["auto", "scroll"].includes(style(el).overflowX);
  const clips = el => ["hidden", "clip"].includes(style(el).overflowX);
  const name = el => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
    [...el.classList].slice(0, 2).map(c => "." + c).join("") + " «" + el.textContent.trim().slice(0, 50) + "»";
  // MathJax's copy of each formula for screen readers is clipped to a pixel on purpose.
  const shown = el => { const r = el.getBoundingClientRect(); return r.width >= 1 && r.height >= 1 &&
                          style(el).visibility !== "hidden" && !el.closest("mjx-assistive-mml"); };
  const held = (el, top = column) => { for (let a = el.parentElement; a && a !== top; a = a.parentElement)
                                        if (scrolls(a) || clips(a)) return true; return false; };
  const overflows = el => { const r = el.getBoundingClientRect();
    return [...el.querySelectorAll("*")].filter(d => shown(d) && !held(d, el))
      .some(d => { const e = d.getBoundingClientRect(); return e.right > r.right + 2 || e.left < r.left - 2; }); };
  const cue = el => el.offsetHeight - el.clientHeight - parseFloat(style(el).borderTopWidth)
                      - parseFloat(style(el).borderBottomWidth) > 0 || style(el).backgroundImage !== "none";
  const found = [];
  for (const el of column.querySelectorAll("*")) {
    if (!shown(el)) continue;
    const r = el.getBoundingClientRect();
    if ((r.right > edge.right + 1 || r.left < edge.left - 1) && !held(el))
      found.push("wider than the column: " + name(el));
    else if (scrolls(el) && !cue(el) && overflows(el)) found.push("scrolls with no visible cue: " + name(el));
    else if (clips(el) && el.textContent.trim() && overflows(el)) found.push("clips its content: " + name(el));
  }
  if (document.documentElement.scrollWidth > innerWidth + 1)
    found.push(`the page scrolls sideways (${document.documentElement.scrollWidth} px in ${innerWidth})`);
  return [...new Set(found)];
}"""
# Each figure a code cell drew: its images, where they sit and how large they are drawn (a figure of several
# panels is one image per panel in a cell tagged "panels").
FIGURES = """() => {
  const column = document.querySelector("article.bd-article").getBoundingClientRect();
  return [...document.querySelectorAll("div.cell_output")]
    .map(output => [...output.querySelectorAll(":scope > img")].map(img => {
      const r = img.getBoundingClientRect();
      return {src: img.getAttribute("src"), panels: Boolean(output.closest("div.cell.tag_panels")),
              top: r.top + scrollY, left: r.left, right: r.right, width: r.width, height: r.height,
              natural_width: img.naturalWidth, column_left: column.left, column_right: column.right};
    }))
    .filter(images => images.length);
}"""
# Legible on a phone: a figure at least 150 px tall (the figure was drawn about 110 px tall, its
# axis labels about 5 px), and a panel at least 60% of its drawn size, so that matplotlib's 10-point tick
# labels (15 px at the book's 110 dpi) are 9 px or more. Side by side on a desktop: up to three panels to
# a row, as many as the CSS gives room in the 1280 px layout's column (13rem each).
PHONE_MIN_HEIGHT = 150
PHONE_MIN_PANEL_SCALE = 0.6
DESKTOP_PANELS_PER_ROW = 3
MATHJAX = "window.MathJax && MathJax.startup && MathJax.startup.promise"


def file_name_like(alt: str | None) -> bool:
    import re

    return not (alt or "").strip() or bool(re.search(r"\.(png|jpe?g|svg|gif|webp)$|[0-9a-f]{16}|^_images/", alt, re.I))


@pytest.fixture(scope="module")
def audit():
    """``audit(edition, page)``: what each width and theme shows on that page, each page loaded once per
    width (the theme is switched in place, as the theme's own button does)."""
    if not AXE.is_file():
        if not shutil.which("npm"):
            pytest.skip("accessibility tests skipped: no npm on this machine to install axe-core")
        pytest.fail("axe-core is not installed: run `make a11y` (make test does it first)")
    for edition, html in EDITIONS.items():
        if not (html / "index.html").is_file():
            pytest.fail(f"the {edition} edition is not built: run `make book` and `make book-instructor`")
    with (serve(EDITIONS["learner"]) as learner, serve(EDITIONS["instructor"]) as instructor,
          browser() as chromium):
        bases = {"learner": learner, "instructor": instructor}
        tabs = {}
        for width_name, width in WIDTHS.items():
            context = chromium.new_context(viewport={"width": width, "height": 900})
            context.add_init_script(LIGHT_FIRST)
            context.add_init_script(path=str(AXE))
            tabs[width_name] = context.new_page()
        seen = {}

        def look(edition, name):
            if (edition, name) not in seen:
                seen[edition, name] = {w: inspect(tab, urljoin(bases[edition], name)) for w, tab in tabs.items()}
            return seen[edition, name]

        yield look
        write_report(seen)


def inspect(tab, url):
    tab.goto(url, wait_until="load")
    if tab.locator(".math").count():
        tab.wait_for_function(MATHJAX, timeout=20000)
        tab.evaluate("MathJax.startup.promise")
    found = {"images": tab.evaluate(IMAGES), "chinese": tab.evaluate(CHINESE), "cut_off": tab.evaluate(CUT_OFF),
             "figures": tab.evaluate(FIGURES)}
    for theme in THEMES:
        tab.evaluate(SET_THEME, theme)
        found[theme] = tab.evaluate(RUN_AXE)
    return found


def write_report(seen):
    counts = Counter()
    for (edition, _), widths in seen.items():
        for width, found in widths.items():
            for theme in THEMES:
                for v in found[theme]:
                    counts[f"{v['impact']}\t{v['rule']}\t{edition}\t{theme}\t{width}"] += len(v["nodes"])
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(dict(sorted(counts.items())), indent=1, ensure_ascii=False) + "\n")


@pytest.mark.parametrize(("edition", "name"), CASES)
def test_no_critical_or_serious_axe_violation(audit, edition, name):
    failures = [f"{v['impact']} {v['rule']} ({v['help']}) in the {theme} theme at {width}: {v['nodes'][:5]}"
                for width, found in audit(edition, name).items() for theme in THEMES
                for v in found[theme] if v["impact"] in ("critical", "serious")]
    assert not failures, f"{edition} {name}:\n" + "\n".join(failures)


@pytest.mark.parametrize(("edition", "name"), CASES)
def test_every_image_says_what_it_shows(audit, edition, name):
    images = audit(edition, name)["desktop"]["images"]
    bad = [f"{i['src']} (alt={i['alt']!r})" for i in images if file_name_like(i["alt"])]
    assert not bad, f"{edition} {name}: images whose text alternative is empty or a file name: {bad}"


@pytest.mark.parametrize(("edition", "name"), CASES)
def test_chinese_is_marked_as_chinese(audit, edition, name):
    wrong = audit(edition, name)["desktop"]["chinese"]
    assert not wrong, f"{edition} {name}: Chinese text without lang=\"zh\": {wrong[:10]}"


@pytest.mark.parametrize(("edition", "name"), CASES)
def test_nothing_is_cut_off(audit, edition, name):
    found = [f"at {width}: {problem}" for width, seen in audit(edition, name).items() for problem in seen["cut_off"]]
    assert not found, f"{edition} {name}:\n" + "\n".join(found)


def rows(images) -> list[list[dict]]:
    """The images grouped by the line they sit on (tops within 1 px), top to bottom."""
    lines = []
    for image in sorted(images, key=lambda i: i["top"]):
        if lines and abs(image["top"] - lines[-1][0]["top"]) <= 1:
            lines[-1].append(image)
        else:
            lines.append([image])
    return lines


@pytest.mark.parametrize(("edition", "name"), CASES)
def test_figures_are_legible_on_a_phone(audit, edition, name):
    """At 390 px every figure is at least PHONE_MIN_HEIGHT tall and inside the column; the panels of one
    figure stand one above the other, each drawn at PHONE_MIN_PANEL_SCALE of its size or more."""
    bad = []
    for images in audit(edition, name)["phone"]["figures"]:
        for i in images:
            if i["height"] < PHONE_MIN_HEIGHT:
                bad.append(f"{i['src']}: {i['height']:.0f} px tall")
            if i["left"] < i["column_left"] - 1 or i["right"] > i["column_right"] + 1:
                bad.append(f"{i['src']}: reaches outside the column ({i['left']:.0f} to {i['right']:.0f} px)")
            if i["panels"] and i["width"] < PHONE_MIN_PANEL_SCALE * i["natural_width"]:
                bad.append(f"{i['src']}: a panel drawn at {i['width']:.0f} of its {i['natural_width']} px")
        if images[0]["panels"] and len(rows(images)) != len(images):
            bad.append(f"{[i['src'] for i in images]}: panels side by side on a phone")
    assert not bad, f"{edition} {name}, figures at 390 px:\n" + "\n".join(bad)


@pytest.mark.parametrize(("edition", "name"), CASES)
def test_panels_of_a_figure_sit_side_by_side_on_a_desktop(audit, edition, name):
    """At 1280 px the panels of one figure share rows (equal tops), DESKTOP_PANELS_PER_ROW to a row."""
    bad = []
    for images in audit(edition, name)["desktop"]["figures"]:
        if images[0]["panels"]:
            shape = [len(line) for line in rows(images)]
            expected = math.ceil(len(images) / DESKTOP_PANELS_PER_ROW)
            if len(shape) != expected:
                bad.append(f"{[i['src'] for i in images]}: {shape} panels per row, not {expected} rows")
    assert not bad, f"{edition} {name}, figures at 1280 px:\n" + "\n".join(bad)


def test_chapter_one_draws_its_figures_as_panels(audit):
    """The panel tests above measure something: chapter 1's two two-panel figures are tagged and split."""
    figures = audit("learner", "01_attention.html")["desktop"]["figures"]
    assert [len(images) for images in figures if images[0]["panels"]] == [2, 2], figures


def test_both_editions_are_audited_whole():
    """The glossary, a chapter and a solved notebook are among the pages: the lists above are not empty."""
    names = {name for _, name in CASES}
    assert {"glossary.html", "01_attention.html", "solutions/01_attention/01_attention.html"} <= names, \
        "both editions must be built first: run `make book` and `make book-instructor`"
