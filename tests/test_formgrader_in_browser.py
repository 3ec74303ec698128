"""JupyterLab with nbgrader's extension, on localhost against a scratch copy of the course: with the
instructor's configuration (as `make lab-instructor` starts it) the formgrader lists every chapter as an
assignment; without it (the course's environment as learners get it) there is no formgrader."""

import contextlib
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from autograde_tests import nbgrader_course, scratch_course

from .browser import browser, chromium, jupyterlab

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.browser  # the formgrader in Chromium
TOKEN = "course-test-token"
INSTRUCTOR_PARTS = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:course-list",
                    "@jupyter/nbgrader:create-assignment"]


@contextlib.contextmanager
def running_lab(tmp_path_factory, instructor: bool):
    """JupyterLab on a scratch course, with the instructor's configuration or as the course's environment
    has it (the learners')."""
    root = scratch_course.scratch_course(REPO, tmp_path_factory.mktemp("course"))
    for chapter in nbgrader_course.chapters(root):
        scratch_course.release(root, chapter)
    config_path = REPO / "jupyter" / "instructor" if instructor else None
    with jupyterlab(root, tmp_path_factory.mktemp("jupyter"), TOKEN, config_path) as base:
        yield base


@pytest.fixture(scope="module")
def instructor_lab(tmp_path_factory):
    chromium()  # skip before starting anything when there is no browser
    with running_lab(tmp_path_factory, instructor=True) as base:
        yield base


@pytest.fixture(scope="module")
def learner_lab(tmp_path_factory):
    with running_lab(tmp_path_factory, instructor=False) as base:
        yield base


def test_formgrader_lists_every_chapter(instructor_lab):
    with browser() as instance:
        page = instance.new_page()
        page.goto(f"{instructor_lab}formgrader?token={TOKEN}", wait_until="load")
        for chapter in nbgrader_course.chapters(REPO):
            page.get_by_text(chapter, exact=True).first.wait_for(timeout=30000)
        page.close()


def disabled_parts(base: str) -> list[str]:
    """The JupyterLab plugins the page at ``base`` turns off, from its page configuration."""
    page = urllib.request.urlopen(f"{base}lab?token={TOKEN}", timeout=30).read().decode()
    return json.loads(re.search(r'"disabledExtensions": (\[[^]]*\])', page).group(1))


def test_learners_get_no_formgrader_and_no_instructor_tools(learner_lab):
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(f"{learner_lab}formgrader?token={TOKEN}", timeout=30)
    assert set(INSTRUCTOR_PARTS) <= set(disabled_parts(learner_lab))


def test_the_instructor_gets_every_part(instructor_lab):
    assert not set(INSTRUCTOR_PARTS) & set(disabled_parts(instructor_lab))
