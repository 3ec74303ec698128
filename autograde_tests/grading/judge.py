"""A graded test cell, judged by the grader: its check calls run here, against proxies of the learner's objects.

A test cell of this course is check calls and nothing else (``from autograde_tests.checks import
check_softmax`` and ``check_softmax(softmax, hidden=True)``); its source is the release's, restored by the
grader. The verdict becomes the cell's only outputs: the checks' pass lines, or one error with the
check's message. Nothing the kernel printed in that cell counts, and anything that goes wrong while
judging (a malformed answer, a silent kernel) fails the cell; it never passes it.
"""

import ast
import contextlib
import io
from dataclasses import dataclass

import nbformat

from .. import checks
from ..remote.proxy import Session


class NotACheckCell(ValueError):
    """A graded test cell holding something other than check calls: a fault of the course, not the learner."""


@dataclass(frozen=True)
class CheckCall:
    check: str  # e.g. "check_softmax"
    learner_names: tuple[str, ...]  # the learner's globals it is given, e.g. ("softmax",)
    keywords: dict  # constant keyword arguments, e.g. {"hidden": True}


def check_calls(source: str) -> list[CheckCall]:
    """The check calls of a test cell, in order; ``NotACheckCell`` if it holds anything else."""
    calls = []
    for statement in ast.parse(source).body:
        if isinstance(statement, ast.ImportFrom) and statement.module == checks.__name__:
            continue
        call = statement.value if isinstance(statement, ast.Expr) else None
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in checks.__all__
                and all(isinstance(a, ast.Name) for a in call.args)
                and all(k.arg and isinstance(k.value, ast.Constant) for k in call.keywords)):
            raise NotACheckCell(f"not a check call: {ast.unparse(statement)[:80]!r}")
        calls.append(CheckCall(call.func.id, tuple(a.id for a in call.args),
                               {k.arg: k.value.value for k in call.keywords}))
    return calls


def judge(source: str, session: Session) -> list[nbformat.NotebookNode]:
    """Run the test cell's checks here, on the learner's objects in ``session``: the cell's outputs."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            for call in check_calls(source):
                learner = [session.lookup(name) for name in call.learner_names]
                getattr(checks, call.check)(*learner, **call.keywords)
    except AssertionError as failure:
        return _shown(printed) + [_error("AssertionError", str(failure))]
    except NameError as missing:  # the learner never defined the name (the lookup raised it in the kernel)
        return _shown(printed) + [_error("NameError", str(missing))]
    except NotACheckCell:
        raise
    except Exception as exc:  # whatever the learner's answer made the check meet, it is not a pass
        return _shown(printed) + [_error(type(exc).__name__, f"the grader could not judge this cell: {exc}")]
    return _shown(printed)


def _shown(printed: io.StringIO) -> list[nbformat.NotebookNode]:
    text = printed.getvalue()
    return [nbformat.v4.new_output("stream", name="stdout", text=text)] if text else []


def _error(name: str, message: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("error", ename=name, evalue=message, traceback=[f"{name}: {message}"])
