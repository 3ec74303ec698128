"""Shared by the suite: test helpers, the check tests' two sides, and the browser tests' screenshot note.

A check test runs once with the learner's object in this process, as in JupyterLab, and once
"through the wire": the object sits behind an agent and the check meets only a proxy, as in a graded
run. Both must give the same verdict and the same message.
"""

import contextlib
import importlib
import re
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from autograde_tests.chapters import CHAPTERS
from autograde_tests.checks import harness
from autograde_tests.grading import bubblewrap, kernel_view
from autograde_tests.remote.agent import Agent
from autograde_tests.remote.proxy import Session

SCREENSHOTS = Path(__file__).resolve().parents[1] / "_build" / "screenshots"


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal within the course's tolerance for ``actual``'s dtype (the checks' own policy)."""
    torch.testing.assert_close(actual, expected, **harness.TOLERANCE[actual.dtype])


def randomise(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Seeded parameters of a useful size, as the checks draw them (``harness.randomise``)."""
    return harness.randomise(module, harness.SeededRandom(seed))


@contextlib.contextmanager
def fails(problem: str | None = None, *, hint: str | None = None, exercise: str | None = None,
          verdict: type[harness.CheckFailed] = harness.CheckFailed):
    """The check called inside must fail with a ``verdict`` whose fields match: ``problem`` and ``hint`` are
    regular expressions searched in those fields, ``exercise`` is the name it is about. The verdict's fields are
    read, never its rendered text; the failure is yielded (``with fails(...) as failure``) for more."""
    with pytest.raises(verdict) as failure:
        yield failure
    found = failure.value
    if problem is not None:
        assert re.search(problem, found.problem), found.render()
    if hint is not None:
        assert found.hint is not None and re.search(hint, found.hint), found.render()
    if exercise is not None:
        assert found.exercise == exercise, found.render()


@pytest.fixture
def one_thread():
    """Tiny models: on a busy two-core machine several threads mostly wait on each other. A test module
    asks for it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    with harness.one_thread():
        yield


@pytest.fixture(params=["in-process", "through-the-wire"])
def learner_side(request, monkeypatch):
    """Through the wire, each ``check_*`` the test module imported gets a proxy of the learner's object.

    A check test module asks for it with ``pytestmark = pytest.mark.usefixtures("learner_side")``.
    """
    if request.param == "through-the-wire":
        for name, check in list(vars(request.module).items()):
            if name.startswith("check_") and callable(check):
                monkeypatch.setattr(request.module, name, _through_the_wire(check))
    return request.param


def _through_the_wire(check):
    """``check``, given a proxy of the learner's object, which lives with an agent that stands in for a
    kernel graded on the check's chapter."""
    chapter = next(c.id for c in CHAPTERS if check.__name__ in c.checks)

    def wrapped(learner, *args, **kwargs):
        kernel = kernel_stand_in(chapter)
        kernel.namespace["learner"] = learner
        return check(connected(kernel).lookup("learner"), *args, **kwargs)

    return wrapped


def connected(kernel: Agent, **kwargs) -> Session:
    """The grader's session with ``kernel``: requests go one way, calls on what the grader lends the other."""
    session = Session(kernel.handle, **kwargs)
    kernel.grader = session.lender.answer
    return session


def kernel_stand_in(chapter: str) -> Agent:
    """An agent in this process that, like one in a kernel graded on ``chapter``, can load (for a pickle,
    or to run beside the learner's code) no course module that the sandbox hides (``kernel_view``)."""
    hidden = frozenset(kernel_view.hidden(chapter))

    def import_module(name: str):
        if name in hidden:
            raise ImportError(f"{name} is not available in the graded kernel (it would give the answer away)")
        return importlib.import_module(name)

    return Agent({}, import_module=import_module)


def pytest_terminal_summary(terminalreporter):
    shots = sorted(SCREENSHOTS.glob("*.png"))
    if shots:
        terminalreporter.write_line(f"screenshots of {len(shots)} chapter pages: {SCREENSHOTS}")


# Hypothesis's default 200 ms deadline per example is a timed test: on a busy machine a first call that warms
# up PyTorch took 690 ms and failed. Examples are judged on what they compute, never on how long they take.
settings.register_profile("course", deadline=None)
settings.load_profile("course")


def pytest_configure(config):
    for chapter in CHAPTERS:
        config.addinivalue_line("markers", f"ch{chapter.id[:2]}: about chapter {chapter.id} ({chapter.module})")


def _chapters(item) -> set[str]:
    """The chapters a test is about: its module's (``test_05_...``), and any chapter its parameters name (a
    chapter id such as ``"05_transformer"``, or a case of a chapter, ``case.chapter``)."""
    found = set(re.findall(r"^test_(\d\d)_", item.module.__name__.rsplit(".", 1)[-1]))
    for value in getattr(getattr(item, "callspec", None), "params", {}).values():
        named = getattr(value, "chapter", value)
        if isinstance(named, str) and re.match(r"\d\d_", named):
            found.add(named[:2])
    return found


# The tiers: what a test needs beyond this process. `make check` runs the tests with none of these marks.
SLOW_TIERS = ("sandbox", "book", "browser", "slow")


def pytest_collection_modifyitems(config, items):
    """Each test is marked with the chapters it is about (``_chapters``). Tests marked ``sandbox`` grade in
    bubblewrap: where none can start, each is skipped with the one line that says why and how to fix it
    (``-ra`` puts it in the summary).

    The modules of the slow tiers (``SLOW_TIERS``: they grade in a sandbox, read the built book, drive a browser,
    or take minutes of nbgrader or benchmarks) run first, in the order pytest-randomly gave them, and the short
    ones after: the workers that ``make test`` spreads modules over then finish within a short module of each
    other, instead of one waiting on a long module that started last (pyproject.toml asks xdist to keep this
    order)."""
    for item in items:  # `pytest -m ch05` runs what is about chapter 5
        for number in _chapters(item):
            item.add_marker(f"ch{number}")
    items.sort(key=lambda item: not any(item.get_closest_marker(tier) for tier in SLOW_TIERS))
    sandboxed = [item for item in items if item.get_closest_marker("sandbox")]
    why = bubblewrap.unavailable() if sandboxed else None
    for item in sandboxed if why else []:
        item.add_marker(pytest.mark.skip(reason=f"grading tests skipped: {why}"))
