"""Buggy variants for the check tests: a correct class or function of the test's own, with one edit.

A variant written as its edit shows the one thing it gets wrong, and fails loudly when the correct code it
edits no longer holds the fragment (``harness.edited``), instead of drifting into a second correct answer.
The correct code is the test's own (a learner's way of writing it), not the reference the checks' mistakes
edit, so a check's mistakes and its tests do not share their source.
"""

import inspect
from collections.abc import Callable

from autograde_tests.checks.harness import edited


def variant(correct: type | Callable, *changes: tuple[str, str], method: str = "forward", **names) -> type | Callable:
    """``correct`` with each ``(old, new)`` fragment of its source replaced: for a class, of its ``method``
    (a subclass is returned, with only that method rewritten); for a function, of the function. ``names``
    stand in for the module's globals in the edited code (a helper the variant calls instead)."""
    if not inspect.isclass(correct):
        return edited(correct, *changes, **names)
    rewritten = edited(getattr(correct, method), *changes, **names)
    return type(f"{correct.__name__}Edited", (correct,), {method: rewritten, "__module__": correct.__module__})
