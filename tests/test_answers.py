"""Every chapter's "Questions to think about" has its answers in book/answers.md, in the instructor edition only.

These tests read the markdown sources and the tables of contents; they need no build.
"""

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO / "book"
ANSWERS = BOOK / "answers.md"
CHAPTER_PAGES = sorted(BOOK.glob("0*.md"))
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


def toc_files(toc: Path) -> list[str]:
    data = yaml.safe_load(toc.read_text())
    entries = list(data.get("chapters", []))
    for part in data.get("parts", []):
        entries += part["chapters"]
    return [entry["file"] for entry in entries]


def test_every_chapter_page_is_found():
    assert [page.stem for page in CHAPTER_PAGES] == [
        "01_attention", "02_multi_head_attention", "03_attention_variants", "04_ffn_layernorm_residual",
        "05_transformer", "06_decoder_only", "07_attention_at_scale",
    ]


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


def test_answers_are_in_the_instructor_edition_only():
    assert "answers" in toc_files(BOOK / "_toc_instructor.yml")
    assert "answers" not in toc_files(BOOK / "_toc.yml")
    instructor = toc_files(BOOK / "_toc_instructor.yml")
    assert instructor.index("answers") == instructor.index("instructor_guide") + 1
