"""A batch grades chapter by chapter, and a worker starts a kernel ahead only where one is likely wanted."""

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from autograde_tests.grading.batch import Pair, _in_chapter_order
from autograde_tests.grading.job import Job

CHAPTERS = ["01_attention", "05_transformer", "07_attention_at_scale"]


def task(student: str, chapter: str) -> tuple:
    job = Job(student, chapter, "{}", "", "{}", 60, 10, 2**30, 1000, True)
    return Pair(student, chapter, Path(f"{student}/{chapter}.ipynb"), ()), job, None, {}


@given(st.lists(st.tuples(st.sampled_from(["ann", "bo", "cy", "di", "ed"]), st.sampled_from(CHAPTERS)), unique=True),
       st.integers(1, 4))
def test_tasks_go_by_chapter_then_student_and_the_last_of_a_chapter_start_no_kernel_ahead(pairs, workers):
    ordered = _in_chapter_order([task(*pair) for pair in pairs], workers)
    assert [(p.chapter, p.student) for p, *_ in ordered] == sorted((c, s) for s, c in pairs)
    for i, (pair, job, *_) in enumerate(ordered):
        behind = sum(p.chapter == pair.chapter for p, *_ in ordered[i + 1:])
        assert job.start_next == (behind >= workers)
        assert (job.student, job.chapter) == (pair.student, pair.chapter)
