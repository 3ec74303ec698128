"""Shared by the suite: test helpers, the check tests' two sides, and the browser tests' screenshot note.

A check test runs once with the learner's object in this process, as in JupyterLab, and once
"through the wire": the object sits behind an agent and the check meets only a proxy, as in a graded
run. Both must give the same verdict and the same message.
"""

from pathlib import Path

import pytest
import torch
from hypothesis import strategies as st

from autograde_tests.checks import harness
from autograde_tests.grading import bubblewrap
from autograde_tests.reference import hidden_in_grading
from autograde_tests.remote.proxy import Loopback

SCREENSHOTS = Path(__file__).resolve().parents[1] / "_build" / "screenshots"
dtypes = st.sampled_from(harness.DTYPES)  # hypothesis: float32 and float64


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal within the course's tolerance for ``actual``'s dtype (the checks' own policy)."""
    torch.testing.assert_close(actual, expected, **harness.TOLERANCE[actual.dtype])


def randomise(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Seeded parameters of a useful size, as the checks draw them (``harness.randomise``)."""
    return harness.randomise(module, harness.Inputs(seed))


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
    """``check``, given a proxy of the learner's object; the agent cannot load (unpickle) what a kernel
    graded on the check's chapter could not import: that chapter's and later chapters' reference and checks."""
    chapter = check.__module__.rsplit(".", 1)[-1]
    hidden = frozenset(f"autograde_tests.{package}.{module}"
                       for module in hidden_in_grading(chapter) for package in ("reference", "checks"))

    def wrapped(learner, *args, **kwargs):
        return check(Loopback(hidden).expose("learner", learner), *args, **kwargs)

    return wrapped


def pytest_terminal_summary(terminalreporter):
    shots = sorted(SCREENSHOTS.glob("*.png"))
    if shots:
        terminalreporter.write_line(f"screenshots of {len(shots)} chapter pages: {SCREENSHOTS}")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``sandbox`` grade in bubblewrap: where none can start, each is skipped with the one
    line that says why and how to fix it (``-ra`` puts it in the summary)."""
    sandboxed = [item for item in items if item.get_closest_marker("sandbox")]
    why = bubblewrap.unavailable() if sandboxed else None
    for item in sandboxed if why else []:
        item.add_marker(pytest.mark.skip(reason=f"grading tests skipped: {why}"))
