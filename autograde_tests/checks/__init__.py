"""Graded checks: plain functions a notebook's test cell calls with the learner's object.

Each raises AssertionError with a message a learner can act on, and prints a pass line only when
every case passed. ``hidden=True`` is what nbgrader runs at grading time: other seeds, other shapes.
Each check is imported from its chapter's module when first used (as in ``autograde_tests.reference``):
a graded kernel, which is given no check (they run in the grader; ``grading.kernel_view``), can still
import this package, and ``in_kernel`` and ``stand_in_models`` from it.
"""

from ..chapters import CHAPTERS
from ..lazy import exports

__all__, __getattr__ = exports(__name__, {chapter.module: list(chapter.checks) for chapter in CHAPTERS})
