"""The released notebooks open unmodified in JupyterLab: opened, the kernel started, and saved without an
edit, each is byte for byte the committed file (a notebook that lacks the kernel's ``language_info`` is the
control: JupyterLab marks it modified)."""

import shutil
from pathlib import Path

import nbformat
import pytest

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


# In the open notebook: wait until JupyterLab has written the kernel's language_info into it (it does so when
# the kernel's info arrives), then save it and wait for the save to finish. Returns whether JupyterLab had
# marked it modified by then. Waits on JupyterLab's own state and signals, never on a timer.
SAVE_ONCE_THE_KERNEL_IS_KNOWN = """async () => Promise.race([new Promise((_, reject) => setTimeout(() =>
  reject(new Error("the kernel's language_info never reached the notebook, or the save never ended")), 120000)),
  (async () => {
  const panel = window.jupyterapp.shell.currentWidget;
  await panel.context.ready;
  await panel.sessionContext.ready;
  // Compared with sorted keys: the file and the kernel list them in different orders.
  const canonical = value => JSON.stringify(value, (key, v) =>
    v && typeof v === "object" && !Array.isArray(v) ? Object.fromEntries(Object.entries(v).sort()) : v);
  const expected = canonical((await panel.sessionContext.session.kernel.info).language_info);
  const applied = () => canonical(panel.model.getMetadata("language_info")) === expected;
  while (!applied()) {
    await new Promise(resolve => {
      const changed = () => { panel.model.metadataChanged.disconnect(changed); resolve(); };
      panel.model.metadataChanged.connect(changed);
    });
  }
  const dirty = panel.model.dirty;
  await panel.context.save();
  return dirty;
})()])"""


def open_then_save(lab, relative: str) -> tuple[bool, bytes]:
    """Open ``relative`` in JupyterLab, let its kernel start, save without editing: whether JupyterLab marked
    it modified once it knew the kernel, and the saved bytes."""
    root, base, instance = lab
    page = instance.new_page()
    try:
        # A workspace of its own, reset: JupyterLab would otherwise reopen the notebooks opened before.
        workspace = relative.replace("/", "-").replace(".", "-")
        page.goto(f"{base}lab/workspaces/{workspace}/tree/{relative}?reset&token={TOKEN}")
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120000)
        modified = page.evaluate(SAVE_ONCE_THE_KERNEL_IS_KNOWN)
        return modified, (root / relative).read_bytes()
    finally:
        page.close()


@pytest.mark.parametrize("chapter", course.chapters(REPO))
def test_released_notebook_opens_and_saves_unchanged(lab, chapter):
    relative = f"notebooks/{chapter}/{chapter}.ipynb"
    modified, saved = open_then_save(lab, relative)
    assert not modified, f"{relative} opens as modified in JupyterLab: run `make release`"
    assert saved == (REPO / relative).read_bytes(), f"saving {relative} changed it: run `make release`"


def test_a_notebook_without_the_kernel_s_language_info_opens_modified(lab):
    root, _, _ = lab
    notebook = nbformat.read(REPO / "notebooks" / "01_attention" / "01_attention.ipynb", as_version=4)
    notebook.metadata["language_info"] = {"name": "python"}
    nbformat.write(notebook, root / "control.ipynb")
    written = (root / "control.ipynb").read_bytes()
    modified, saved = open_then_save(lab, "control.ipynb")
    assert modified and saved != written
