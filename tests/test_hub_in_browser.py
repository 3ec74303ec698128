"""The course on a real JupyterHub (``make hub``'s ``Hub``), driven in Chromium through the hub's pages
(the instructor's commands typed into a terminal of their JupyterLab): the instructor releases chapter 1
through the exchange, two learners log in, fetch it from the
*Assignments* tab, answer in the notebook (one correctly, one with the chapter's typical mistake),
validate and submit; the instructor collects, runs ``make grade`` and releases feedback; each learner
fetches their own feedback. Neither learner can open the other's work or the instructor's solutions.

Skipped only where Chromium or npm (the hub's proxy) is missing. Each step's wall time is printed
(``pytest -s``).
"""

import os
import re
import shutil
import time
from contextlib import contextmanager

import nbformat
import pytest

from autograde_tests import scratch_course
from autograde_tests.chapters import by_id
from autograde_tests.hub.local_hub import REPO, Hub, free_port
from autograde_tests.nbgrader_course import gradebook

from .browser import browser, chromium

pytestmark = [pytest.mark.sandbox, pytest.mark.browser]  # a hub in Chromium; the instructor grades with make grade

CHAPTER = "01_attention"
PROXY = REPO / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
ENDED = "step-ended"
MISTAKE_MESSAGE = "without the 1/sqrt(d_k) scale"
FULL, MISTAKEN = 6.0, 2.0  # softmax (2 points) and scaled_dot_product_attention (4 points)
LONG = 180_000  # ms: a JupyterLab start or a graded notebook on a busy machine


@pytest.fixture(scope="module")
def hub():
    chromium()  # skip before creating anything when there is no browser
    if not shutil.which("npm"):
        pytest.skip("hub test skipped: no npm on this machine to install the hub's proxy (configurable-http-proxy)")
    if not os.access(PROXY, os.X_OK):
        pytest.fail("the hub's proxy is not installed: run `make proxy`")
    tag = f"h{os.getpid() % 100000}"
    with Hub(PROXY, f"{tag}teach", (f"{tag}ada", f"{tag}bob"), free_port()) as running:
        yield running


class Steps:
    """Wall time of each step of the loop, printed at the end."""

    def __init__(self):
        self.times: list[tuple[str, float]] = []
        self.start = time.monotonic()

    @contextmanager
    def __call__(self, name: str):
        began = time.monotonic()
        yield
        self.times.append((name, time.monotonic() - began))

    def report(self) -> str:
        lines = [f"  {seconds:6.1f} s  {name}" for name, seconds in self.times]
        return "\n".join(["hub loop, wall time per step:", *lines,
                          f"  {time.monotonic() - self.start:6.1f} s  the whole loop"])


def log_in(instance, hub: Hub, name: str):
    page = instance.new_context(viewport={"width": 1400, "height": 900}).new_page()
    page.goto(f"{hub.url}hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", hub.passwords[name])
    page.click("#login_submit")
    page.wait_for_url(re.compile(rf".*/user/{name}/lab.*"), timeout=LONG)
    page.locator(".jp-LauncherCard").first.wait_for(timeout=LONG)
    return page


def in_terminal(page, hub: Hub, command: str) -> str:
    """``command`` typed into a new terminal of the instructor's JupyterLab, in the course folder (the
    instructor's home); fails with its output unless it succeeds."""
    log, status = hub.course / ".step.log", hub.course / ".step.status"
    status.unlink(missing_ok=True)
    page.goto(f"{hub.url}user/{hub.instructor}/lab/workspaces/terminal?reset")  # only the launcher
    with page.expect_websocket(lambda ws: "terminals/websocket" in ws.url, timeout=LONG) as opened:
        page.locator(".jp-LauncherCard").filter(has_text="Terminal").click(timeout=LONG)
    # Keys typed before the shell's first output would be lost: wait for its prompt.
    opened.value.expect_event("framereceived", lambda frame: "stdout" in str(frame), timeout=LONG)
    page.locator(".jp-Terminal .xterm-helper-textarea").focus()
    # The shell prints ENDED once the status is written; the typed line, echoed, shows it split in two.
    with opened.value.expect_event("framereceived", lambda frame: ENDED in str(frame), timeout=600_000):
        page.keyboard.type(f"cd && ({command}) > {log.name} 2>&1; echo $? > {status.name}; "
                           f"echo {ENDED[:4]}''{ENDED[4:]}\n")
    output = log.read_text()
    assert status.read_text().strip() == "0", f"{command}:\n{output}"
    return output


def open_assignments(page):
    page.get_by_text("Nbgrader", exact=True).click()
    page.get_by_text("Assignment List", exact=True).click()
    return page.locator("#nbgrader-assignment-list")


def answer(page, hub: Hub, name: str, answers: dict[str, str]) -> None:
    """Type each answer into its cell of the fetched notebook through JupyterLab's editor, and save."""
    page.goto(f"{hub.url}user/{name}/lab/tree/{CHAPTER}/{CHAPTER}.ipynb")
    cells = page.locator(".jp-Notebook .jp-Cell")
    cells.first.wait_for(timeout=LONG)
    released = nbformat.read(hub.home(name) / CHAPTER / f"{CHAPTER}.ipynb", as_version=4)
    for index, cell in enumerate(released.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            editor = cells.nth(index).locator(".cm-content")
            editor.click()
            page.keyboard.press("Control+A")
            page.keyboard.insert_text(answers[grade_id])
    # The save is done when JupyterLab's PUT of the notebook has its answer.
    with page.expect_response(lambda r: r.request.method == "PUT" and "/api/contents/" in r.url, timeout=LONG):
        page.keyboard.press("Control+S")
    saved = hub.home(name) / CHAPTER / f"{CHAPTER}.ipynb"
    assert _answers(nbformat.read(saved, as_version=4)) == answers, f"{name}'s answers were not saved"


def _answers(notebook) -> dict[str, str]:
    """The learner's answers in ``notebook``, by grade id."""
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in notebook.cells
            if c.metadata.get("nbgrader", {}).get("solution")}


def validate(page) -> str:
    """nbgrader's Validate button in the notebook's toolbar; returns what its dialog says."""
    page.locator(".jp-NotebookPanel-toolbar").get_by_text("Validate", exact=True).click()
    dialog = page.locator(".jp-Dialog")
    dialog.locator("[class*=validation-]").first.wait_for(timeout=LONG)
    said = dialog.inner_text()
    dialog.locator("button").last.click()
    return said


def test_the_course_runs_on_a_jupyterhub(hub):
    steps = Steps()
    ada, bob = hub.learners
    solved = scratch_course.solved(REPO, CHAPTER)
    right = _answers(solved)
    grade_id, correct, mistaken = by_id(CHAPTER).typical_mistake
    wrong = _answers(scratch_course.with_mistake(solved, grade_id, correct, mistaken))
    with browser() as instance:
        with steps("instructor logs in; the formgrader is there"):
            teacher = log_in(instance, hub, hub.instructor)
            teacher.get_by_text("Nbgrader", exact=True).click()
            teacher.get_by_text("Formgrader", exact=True).wait_for()
            teacher.keyboard.press("Escape")
        with steps("instructor releases chapter 1 in a terminal (nbgrader release_assignment)"):
            in_terminal(teacher, hub, f"nbgrader release_assignment {CHAPTER}")
        pages = {}
        for name in (ada, bob):
            with steps(f"{name} logs in and fetches chapter 1 from the Assignments tab"):
                page = pages[name] = log_in(instance, hub, name)
                page.get_by_text("Nbgrader", exact=True).click()
                assert page.get_by_text("Formgrader", exact=True).count() == 0
                page.keyboard.press("Escape")
                listing = open_assignments(page)
                listing.locator("#released_assignments_list").get_by_role("button", name="Fetch").click()
                listing.locator("#fetched_assignments_list").get_by_role("button", name="Submit").wait_for(timeout=LONG)
        said = {}
        for name, answers in ((ada, right), (bob, wrong)):
            with steps(f"{name} answers in the notebook, validates and submits"):
                page = pages[name]
                answer(page, hub, name, answers)
                said[name] = validate(page)
                listing = open_assignments(page)
                listing.locator("#fetched_assignments_list").get_by_role("button", name="Submit").click()
                listing.locator("#submitted_assignments_list").get_by_role("button", name="Fetch Feedback").wait_for(
                    timeout=LONG)
        assert "Success" in said[ada], said[ada]
        assert MISTAKE_MESSAGE in said[bob], said[bob]
        with steps("instructor collects and runs make grade in a terminal"):
            in_terminal(teacher, hub, f"nbgrader collect {CHAPTER}")
            in_terminal(teacher, hub, f'make -C {REPO} grade ARGS="--course $HOME --chapter {CHAPTER}"')
        with steps("instructor releases the feedback in a terminal (nbgrader release_feedback)"):
            in_terminal(teacher, hub, f"nbgrader release_feedback {CHAPTER}")
        feedback = {}
        for name in (ada, bob):
            with steps(f"{name} fetches the feedback and reads it"):
                feedback[name] = fetch_feedback(pages[name], hub, name)
        with steps("each learner tries the other's work and the instructor's folders"):
            for name, other in ((ada, bob), (bob, ada)):
                assert_cannot_reach(pages[name], hub, name, other)
    print("\n" + steps.report())

    with gradebook(hub.course) as book:
        scores = {name: book.find_submission(CHAPTER, name).score for name in (ada, bob)}
    assert scores == {ada: FULL, bob: MISTAKEN}
    assert f"Score: {FULL}" in feedback[ada] and MISTAKE_MESSAGE not in feedback[ada]
    assert f"Score: {MISTAKEN}" in feedback[bob] and MISTAKE_MESSAGE in feedback[bob]


def fetch_feedback(page, hub: Hub, name: str) -> str:
    """Fetch Feedback in the Assignments tab, then open the fetched page through the hub."""
    listing = open_assignments(page)
    # The feedback is in the learner's folder once nbgrader's fetch_feedback request has its answer.
    with page.expect_response(lambda r: "assignments/fetch_feedback" in r.url, timeout=LONG):
        listing.locator("#submitted_assignments_list").get_by_role("button", name="Fetch Feedback").click()
    found = sorted((hub.home(name) / CHAPTER / "feedback").glob(f"*/{CHAPTER}.html"))
    assert found, f"no feedback reached {name}"
    relative = found[-1].relative_to(hub.home(name)).as_posix()
    page.goto(f"{hub.url}user/{name}/files/{relative}")
    return page.locator("body").inner_text()


def assert_cannot_reach(page, hub: Hub, name: str, other: str) -> None:
    """Through the hub: the other learner's server answers 403; from the learner's own kernel, the other's
    home, the exchange's inbound, and the instructor's course (solutions/, submitted/) cannot be opened."""
    for path in (f"api/contents/{CHAPTER}/{CHAPTER}.ipynb", f"files/{CHAPTER}/{CHAPTER}.ipynb", "lab"):
        response = page.request.get(f"{hub.url}user/{other}/{path}")
        assert response.status == 403, (path, response.status)
    targets = [hub.home(other) / CHAPTER / f"{CHAPTER}.ipynb", hub.home(other),
               hub.exchange / "attention-step-by-step" / "inbound", hub.course / "solutions",
               hub.course / "solutions" / CHAPTER / f"{CHAPTER}.ipynb", hub.course / "submitted",
               REPO / "solutions"]
    code = ("import os\n"
            f"for path in {[str(t) for t in targets]!r}:\n"
            "    try:\n"
            "        os.listdir(path) if os.path.isdir(path) else open(path).read()\n"
            "        print('OPENED', path)\n"
            "    except PermissionError:\n"
            "        print('DENIED', path)\n")
    page.goto(f"{hub.url}user/{name}/lab/workspaces/reach?reset")  # a fresh layout: only the launcher
    page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click(timeout=LONG)  # the course's kernel
    editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    editor.wait_for(timeout=LONG)
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=LONG)  # a cell run earlier is dropped
    editor.click()
    page.keyboard.insert_text(code)
    page.keyboard.press("Shift+Enter")
    output = page.locator(".jp-OutputArea-output").first
    output.get_by_text(str(targets[-1])).wait_for(timeout=LONG)
    lines = output.inner_text().splitlines()
    assert lines == [f"DENIED {t}" for t in targets], lines
