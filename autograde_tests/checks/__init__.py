"""Graded checks: plain functions a notebook's test cell calls with the learner's object.

Each raises AssertionError with a message a learner can act on, and prints a pass line only when
every case passed. ``hidden=True`` is what nbgrader runs at grading time: other seeds, other shapes.
"""

from .attention import check_scaled_dot_product_attention, check_softmax

__all__ = ["check_softmax", "check_scaled_dot_product_attention"]
