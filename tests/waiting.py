"""How the tests wait: on a state they can read (a file, a process, a server's answer), never for a fixed time."""

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(ready: Callable[[], T], seconds: float, what: str) -> T:
    """The first true value of ``ready()``, asked again until it comes; fails naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not (value := ready()):
        assert time.monotonic() < deadline, f"{what}: not after {seconds:g} s"
        time.sleep(0.05)  # the pause between two looks at the state, not a guess at how long it takes
    return value
