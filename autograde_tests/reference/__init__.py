"""Reference implementations of every name the learners implement (see the course contract).

The names and signatures here are the contract's; the tests prove each one against PyTorch's own.
Each name is imported from its chapter's module when first used (``lazy``): a graded kernel, which is given
the earlier chapters' pieces but not the chapter it is graded on, can still import this package.
"""

from ..chapters import CHAPTERS
from ..lazy import exports

__all__, __getattr__ = exports(__name__, {chapter.module: list(chapter.graded) for chapter in CHAPTERS})
