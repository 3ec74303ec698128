"""Correct answers to every exercise, written independently of the course's reference, five styles per
chapter, as different learners would write them (``chNN_<style>.py``: one module per chapter and style).

Each module defines the chapter's graded names with the notebook's signatures, and everything an answer
needs sits inside the definitions' bodies (nested helpers included), which is all a learner writes in a
notebook's answer regions. ``tests/test_independent_answers.py`` proves every one right with the chapter's own
checks, visible and hidden; the similarity report's measurement uses them as answers that were not copied.
"""
