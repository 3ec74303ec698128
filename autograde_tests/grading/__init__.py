"""Grading a whole class with nbgrader, hardened: ``python -m autograde_tests.grading`` (``make grade``).

Trust runs one way. This process (the grader) reads every submission and repairs it around the release;
workers run nbgrader in scratch courses; kernels run the learners' code sandboxed, with limits they cannot
lift, while the checks run in the grader against the kernel's objects through proxies (``remote``). See the
instructor guide for the reasoning.
"""
