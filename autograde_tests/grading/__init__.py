"""Grading a whole class with nbgrader, hardened: ``python -m autograde_tests.grading`` (``make grade``).

Trust runs one way. This process (the grader) reads every submission, repairs it around the release,
and refuses code outside a plain-PyTorch filter before anything runs; workers run nbgrader in scratch
courses; kernels run sandboxed, with limits they cannot lift. See the instructor guide for the reasoning.
"""
