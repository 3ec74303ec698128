"""Rules about how an answer was computed, and the source each one's verdict comes from.

Most rules judge values: the grader makes the inputs and compares what comes back. A few are about how
the answer was computed (no built-in softmax, the sublayer called once, the KV cache used, no full score
matrix), and some of those can only be seen from next to the learner's code: a record of the operators
that ran, of the calls a stand-in received, of the tensors created. In JupyterLab that record is made
in the learner's own kernel, and a broken rule fails the check as any rule does. In a graded run it is
made in the sandboxed kernel, which the learner controls (``shared/design/grading-trust.md``, invariant
1): there it is the kernel's word, shown as a note, worth no points either way. ``kernel_reported`` is
the one place that decides this; every rule that reads such a record goes through it.
"""

from collections.abc import Callable, Iterable, Mapping

from ..remote.proxy import Remote, run_beside, static_names
from .beside import operators_used
from .harness import fail, learner_step

NOTE = "note from your kernel's own record, not graded"
BUILT_IN_HINT = "build it from elementary operations (exp, max, sum, matmul)."


def in_a_graded_run(learner) -> bool:
    """Whether ``learner`` lives in a graded kernel: a proxy whose session also reads the learner's source,
    as only the grader's does (``grading.execute``); the suite's loopback through the wire does not."""
    return isinstance(learner, Remote) and learner._session.static_names is not None


def kernel_reported(name: str, learner, problem: str, hint: str | None = None) -> None:
    """A rule broken by the kernel's own record of ``learner``'s run: a failure, or in a graded run a note."""
    if in_a_graded_run(learner):
        print(f"{name}: {NOTE}: {problem}" + (f"\nHint: {hint}" if hint else ""))
    else:
        fail(name, problem, hint)


def forbid_built_ins(name: str, fn: Callable, args: tuple, forbidden: Mapping[str, str]) -> None:
    """``fn`` must not use a built-in named like a key of ``forbidden`` (a fragment of a name, whatever its
    case, mapped to what the learner called, for the message).

    Two readings, in the order of ``forbidden``. The grader's own reading of the learner's source (every
    name the definition of ``fn`` reaches, ``grading.reach``; only a graded run makes it) fails the check.
    The torch functions and ATen operators that ``fn(*args)`` ran, recorded next to the learner's code, also
    catch what no source shows (a name computed at run time, a built-in called inside a library function);
    that record is the kernel's word (``kernel_reported``): the rule in JupyterLab, a note in a graded run.
    """
    written = static_names(fn)
    for fragment, what in forbidden.items():
        used = named_like(fragment, written)
        if used:
            fail(name, _built_in_problem(what, used), BUILT_IN_HINT)
    ran = learner_step(name, lambda: run_beside(operators_used, fn, args), args)
    for fragment, what in forbidden.items():
        used = named_like(fragment, ran if isinstance(ran, list) else [])
        if used:
            kernel_reported(name, fn, _built_in_problem(what, used), BUILT_IN_HINT)
            return


def named_like(fragment: str, names: Iterable) -> list[str]:
    """The names that contain ``fragment``, ignoring case (``nn.Softmax`` is a softmax too)."""
    return sorted(n for n in names if isinstance(n, str) and fragment.lower() in n.lower())


def _built_in_problem(what: str, used: list[str]) -> str:
    return f"calls {what} ({', '.join(used)}), which this exercise asks you to write yourself"
