"""Every chapter's "Questions to think about" has its answers in book/answers.md, in order (the sources,
no build needed; tests/test_editions.py checks that only the instructor edition has the page)."""

import re
from pathlib import Path

import pytest

from autograde_tests import nbgrader_course

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO / "book"
ANSWERS = BOOK / "answers.md"
CHAPTER_PAGES = [BOOK / f"{chapter}.md" for chapter in nbgrader_course.chapters(REPO)]
ITEM = re.compile(r"^\d+\. ", re.MULTILINE)


def section(text: str, heading: str) -> str:
    """The text under the ``## `` heading that starts with ``heading``, up to the next ``## `` heading."""
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    found = [part for part in parts[1:] if part.startswith(heading)]
    assert len(found) == 1, f"expected one '## {heading}' section, found {len(found)}"
    return found[0]


def title(page: Path) -> str:
    """The chapter's H1, e.g. '01 · Scaled dot-product attention'."""
    return re.search(r"^# (.+)$", page.read_text(), re.MULTILINE).group(1).strip()


@pytest.mark.parametrize("page", CHAPTER_PAGES, ids=lambda page: page.stem)
def test_answers_have_one_item_per_question_of_the_chapter(page):
    questions = ITEM.findall(section(page.read_text(), "Questions to think about"))
    answers = ITEM.findall(section(ANSWERS.read_text(), title(page)))
    assert questions, f"{page.name} has no numbered questions"
    assert len(answers) == len(questions), (
        f"{page.name} asks {len(questions)} questions; answers.md answers {len(answers)}")


@pytest.mark.parametrize("page", CHAPTER_PAGES, ids=lambda page: page.stem)
def test_each_answer_section_links_back_to_its_chapter(page):
    assert f"]({page.name})" in section(ANSWERS.read_text(), title(page))


def test_answers_sections_follow_the_chapter_order():
    headings = re.findall(r"^## (.+)$", ANSWERS.read_text(), re.MULTILINE)
    assert headings == [title(page) for page in CHAPTER_PAGES]

