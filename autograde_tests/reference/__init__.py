"""Reference implementations of every name the learners implement (``chapters.py`` lists them).

The names and signatures are the ones the notebooks give the learner; the tests prove each against PyTorch's own.
Each name is imported from its chapter's module when first used (``lazy``): a graded kernel, which is given
the earlier chapters' pieces but not the chapter it is graded on, can still import this package.
"""

from ..chapters import CHAPTERS
from ..lazy import exports

__all__, __getattr__ = exports(__name__, {chapter.module: list(chapter.graded) for chapter in CHAPTERS})
