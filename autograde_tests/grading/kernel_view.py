"""What of the course a graded kernel can import: the few modules it needs, and a stub for every other.

A kernel graded on a chapter runs the learner's cells and the agent that answers the grader; the checks
themselves run in the grader. In there it needs only

- the agent, its wire and the stubs of what the grader lends (``remote.agent``, ``remote.wire``,
  ``remote.lent``), which the kernel preloads as it starts;
- what the checks run next to the learner's code (``checks.in_kernel``, ``checks.stand_in_models``: PyTorch alone,
  and no answer to an exercise);
- the earlier chapters' reference, which the chapter's notebook imports as its building blocks;
- the packages above these, ``lazy``, by which their names are imported from a chapter's module on first
  use, and ``chapters``, the table of names it reads them from.

Every other module of the package is hidden, whatever it is: the graded chapter's reference and later
ones (the answer), every chapter's checks (their mistake generators are the reference with a flag, so
with the default flags they are the answer), and the rest (the grader, training, the book's tools),
which the kernel never needs. A new module is hidden until it is named here. Outside the package, the
installed libraries that would compute the graded chapter's answers (``Chapter.answering_libraries``) are
hidden the same way: an empty read-only folder in place of each, holding only a stub ``__init__``. The
sandbox binds the stub ``hidden_reference.py`` over each hidden file, so that reading the source finds
nothing either and an import by name (``from autograde_tests.checks import check_gpt``) fails with a
reason; every folder of compiled copies (``__pycache__``) is an empty read-only tmpfs. The suite's
stand-in for the kernel (``tests/conftest.py``) refuses to import the same list.
"""

import importlib.util
from pathlib import Path

import autograde_tests
from autograde_tests.chapters import CHAPTERS, hidden_in_grading

PACKAGE = Path(autograde_tests.__file__).resolve().parent
STUB = Path(__file__).with_name("hidden_reference.py")
LIBRARY_STUB = Path(__file__).with_name("hidden_library.py")
KERNEL_NEEDS = frozenset({
    "autograde_tests", "autograde_tests.lazy", "autograde_tests.chapters",
    "autograde_tests.remote", "autograde_tests.remote.agent", "autograde_tests.remote.lent",
    "autograde_tests.remote.wire",
    "autograde_tests.checks", "autograde_tests.checks.in_kernel", "autograde_tests.checks.stand_in_models",
    "autograde_tests.reference",
})


def visible(chapter: str) -> frozenset[str]:
    """The course modules a kernel graded on ``chapter`` (``"06_decoder_only"`` or ``"decoder_only"``) can
    import."""
    earlier = [c.module for c in CHAPTERS if c.module not in hidden_in_grading(chapter)]
    return KERNEL_NEEDS | {f"autograde_tests.reference.{module}" for module in earlier}


def modules() -> dict[str, Path]:
    """Every module of the course package, by name, with its source file (packages by their ``__init__``)."""
    found = {}
    for source in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in source.parts:
            continue
        parts = source.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = source
    return found


def hidden(chapter: str) -> list[str]:
    """The course modules a kernel graded on ``chapter`` cannot import: all but ``visible(chapter)``."""
    shown = visible(chapter)
    return [name for name in modules() if name not in shown]


def hidden_libraries(chapter: str) -> dict[str, Path]:
    """The folders of the installed libraries that a kernel graded on ``chapter`` (its id or its module) cannot
    import, by name (a library that is not installed has nothing to hide)."""
    found = {}
    row = next(c for c in CHAPTERS if chapter in (c.id, c.module))
    for name in row.answering_libraries:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found[name] = Path(spec.submodule_search_locations[0]).resolve()
    return found


def hiding_arguments(chapter: str) -> list[str]:
    """bubblewrap's arguments that hide them, after the environment and the package are bound: the stub over
    each hidden module's file, an empty read-only tmpfs over every folder of compiled copies, and one over
    each hidden library's folder, with the library stub as its ``__init__``."""
    arguments = []
    for folder in hidden_libraries(chapter).values():
        arguments += ["--size", "4096", "--tmpfs", str(folder), "--ro-bind", str(LIBRARY_STUB),
                      str(folder / "__init__.py"), "--remount-ro", str(folder)]
    every = modules()
    for name in hidden(chapter):
        arguments += ["--ro-bind", str(STUB), str(every[name])]
    for cache in sorted(PACKAGE.rglob("__pycache__")):
        arguments += ["--size", "4096", "--tmpfs", str(cache), "--remount-ro", str(cache)]
    return arguments
