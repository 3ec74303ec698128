"""Stands in, inside a graded kernel, for every course module the kernel is not given (``kernel_view``):
the reference of the chapter being graded and of later ones, every chapter's checks, and the grader."""

raise ImportError(
    f"{__name__} is not available while it is graded: the course's reference of this chapter and the checks "
    "stay with the grader, which runs the checks on your own code from outside this kernel"
)
