"""JupyterLab with nbgrader's extension, on localhost against a scratch copy of the course:
the formgrader lists every chapter as an assignment."""

from pathlib import Path

import pytest

from autograde_tests import course

from . import browser as b

REPO = Path(__file__).resolve().parents[1]
TOKEN = "course-test-token"


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    b.chromium()  # skip before starting anything when there is no browser
    root = course.scratch_course(REPO, tmp_path_factory.mktemp("course"))
    for chapter in course.chapters(root):
        course.release(root, chapter)
    with b.jupyterlab(root, tmp_path_factory.mktemp("jupyter"), TOKEN) as base:
        yield base


def test_formgrader_lists_every_chapter(jupyterlab):
    with b.browser() as instance:
        page = instance.new_page()
        page.goto(f"{jupyterlab}formgrader?token={TOKEN}", wait_until="load")
        for chapter in course.chapters(REPO):
            page.get_by_text(chapter, exact=True).first.wait_for(timeout=30000)
        page.close()
