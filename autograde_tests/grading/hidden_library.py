"""Stands in, inside a graded kernel, for an installed library that would compute the answers of the chapter
being graded (``chapters.Chapter.answering_libraries``, e.g. a tokenizer library while chapter 8 is graded)."""

raise ImportError(
    f"{__name__} is not available while it is graded: it would compute this chapter's answers, which the "
    "exercises ask you to write yourself"
)
