"""The released notebooks open unmodified in JupyterLab: opened, the kernel started, and saved without an
edit, each is byte for byte the committed file (a notebook that lacks the kernel's ``language_info`` is the
control: JupyterLab marks it modified). A failing check reads well there: run in JupyterLab, its message
shows each line on one line of the output area (none broken inside a word) and its traceback names the
learner's cell as JupyterLab's own tracebacks do."""

import shutil
from pathlib import Path

import nbformat
import pytest

from autograde_tests import nbgrader_course
from autograde_tests.checks.harness import WIDTH

from . import browser as b

pytestmark = pytest.mark.browser  # JupyterLab in Chromium

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


@pytest.mark.parametrize("chapter", nbgrader_course.chapters(REPO))
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


# A learner's merge_heads that views after a transpose: the check fails with its longest kind of message
# (a RuntimeError's text, the case, a hint) after the frame of the learner's cell.
FAILING = ["from autograde_tests.checks import check_merge_heads",
           "def merge_heads(x):\n    B, h, T, d_k = x.shape\n    return x.transpose(1, 2).view(B, T, h * d_k)",
           "check_merge_heads(merge_heads)"]

# Run every cell of the open notebook; resolves when the run has ended (at the failing check).
RUN_ALL = """async () => {
  const panel = window.jupyterapp.shell.currentWidget;
  await panel.context.ready;
  await panel.sessionContext.ready;
  await window.jupyterapp.commands.execute("notebook:run-all-cells");
}"""

# The failing check's output as shown: its text, the visual lines each of its lines takes (the distinct tops
# of its text's boxes), how many columns of the code font the output area holds, and each cell's prompt number.
SHOWN = """() => {
  const pre = document.querySelector('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"] pre');
  const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
  const tops = new Set();
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const range = document.createRange();
    range.selectNodeContents(node);
    for (const box of range.getClientRects()) if (box.width > 0) tops.add(Math.round(box.top));
  }
  const probe = document.createElement("span");
  probe.textContent = "0".repeat(100);
  pre.appendChild(probe);
  const columns = Math.floor(pre.clientWidth / (probe.getBoundingClientRect().width / 100));
  probe.remove();
  const cells = window.jupyterapp.shell.currentWidget.model.cells;
  const counts = Array.from({length: cells.length}, (_, i) => cells.get(i).executionCount);
  return {text: pre.textContent, visualLines: tops.size, columns, counts};
}"""


def test_a_failing_check_reads_well_in_jupyterlab(lab):
    root, base, instance = lab
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in FAILING],
                                            metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}}),
                   root / "failing.ipynb")
    page = instance.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.goto(f"{base}lab/workspaces/failing/tree/failing.ipynb?reset&token={TOKEN}")
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120000)
        page.evaluate(RUN_ALL)
        stderr = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"] pre'
        page.locator(stderr).wait_for(timeout=120000)
        shown = page.evaluate(SHOWN)
    finally:
        page.close()
    lines = shown["text"].rstrip("\n").split("\n")
    defined = shown["counts"][1]
    assert lines[:3] == ["Traceback of your code (most recent call last):",
                         f"  Cell In[{defined}], line 3, in merge_heads",
                         "    return x.transpose(1, 2).view(B, T, h * d_k)"], lines
    assert lines[3].startswith("AssertionError: merge_heads: raised RuntimeError: view size is not compatible"), lines
    assert (any(line.startswith("  when called with (") for line in lines)
            and any(line.startswith("Hint: ") for line in lines))
    assert max(len(line) for line in lines) <= WIDTH < shown["columns"], (shown["columns"], lines)
    # Each line on one line of the screen: JupyterLab broke none of them, inside a word or anywhere else.
    assert shown["visualLines"] == len(lines), (shown, lines)
