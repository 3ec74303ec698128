"""The released notebooks open unmodified in JupyterLab: opened, the kernel started, and saved without an
edit, each is byte for byte the committed file (a notebook that lacks the kernel's ``language_info`` is the
control: JupyterLab marks it modified)."""

import shutil
from pathlib import Path

import nbformat
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from autograde_tests import course

from . import browser as b

REPO = Path(__file__).resolve().parents[1]
TOKEN = "course-test-token"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    b.chromium()  # skip before starting anything when there is no browser
    root = tmp_path_factory.mktemp("learner")
    shutil.copytree(REPO / "notebooks", root / "notebooks")
    with b.jupyterlab(root, tmp_path_factory.mktemp("jupyter"), TOKEN) as base, b.browser() as instance:
        yield root, base, instance


def open_then_save(lab, relative: str) -> bool:
    """Open ``relative`` in JupyterLab, wait for its kernel, save without editing; was it marked modified?"""
    _, base, instance = lab
    page = instance.new_page()
    try:
        # A workspace of its own, reset: JupyterLab would otherwise reopen the notebooks opened before.
        workspace = relative.replace("/", "-").replace(".", "-")
        page.goto(f"{base}lab/workspaces/{workspace}/tree/{relative}?reset&token={TOKEN}")
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60000)
        # JupyterLab writes the kernel's language_info into the notebook when the kernel replies.
        page.get_by_text("Kernel status: Idle").first.wait_for(state="attached", timeout=60000)
        # The kernel's reply reaches the notebook just after: give a change the time to show.
        dirty = page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty")
        try:
            dirty.wait_for(state="attached", timeout=5000)
            modified = True
        except PlaywrightTimeout:
            modified = False
        page.keyboard.press("Control+s")
        dirty.wait_for(state="detached", timeout=30000)
        page.wait_for_timeout(1000)
        return modified
    finally:
        page.close()


@pytest.mark.parametrize("chapter", course.chapters(REPO))
def test_released_notebook_opens_and_saves_unchanged(lab, chapter):
    root, _, _ = lab
    relative = f"notebooks/{chapter}/{chapter}.ipynb"
    assert not open_then_save(lab, relative), f"{relative} opens as modified in JupyterLab: run `make release`"
    assert (root / relative).read_bytes() == (REPO / relative).read_bytes(), f"saving {relative} changed it"


def test_a_notebook_without_the_kernel_s_language_info_opens_modified(lab):
    root, _, _ = lab
    notebook = nbformat.read(REPO / "notebooks" / "01_attention" / "01_attention.ipynb", as_version=4)
    notebook.metadata["language_info"] = {"name": "python"}
    nbformat.write(notebook, root / "control.ipynb")
    assert open_then_save(lab, "control.ipynb")
