"""Rules about how an answer was computed, and the source each one's verdict comes from.

Most rules judge values: the grader makes the inputs and compares what comes back. A few are about how
the answer was computed (no built-in softmax, the sublayer called once, the KV cache used, no full score
matrix). What a stand-in was given the grader records itself: stand-ins are lent (``remote.lent``), so
those rules fail a graded run as any rule does. Others can only be seen from next to the learner's code:
a record of the operators that ran, of the tensors created. In JupyterLab that record is made
in the learner's own kernel, and a broken rule fails the check as any rule does. In a graded run it is
made in the sandboxed kernel, which the learner controls, and nothing the kernel reports about itself earns
a point: there it is the kernel's word, shown as a note, worth no points either way. ``kernel_reported`` is
the one place that decides this; every rule that reads such a record goes through it: the forbidden
built-ins the kernel saw run, the run on shape-only tensors (``expect_device_agnostic``), and the rules
of each chapter's checks that read ``in_kernel``'s records or the classes a proxy reports.
"""

from collections.abc import Callable, Iterable, Mapping

from ..remote.proxy import Remote, run_in_kernel, static_names
from .harness import FIXED_DEVICE_HINT, ON_A_FIXED_DEVICE, exception_name, fail, learner_step
from .in_kernel import operators_used, run_on_meta

NOTE = "note from your kernel's own record, not graded"
BUILT_IN_HINT = "build it from elementary operations (exp, max, sum, matmul)."
ATTENTION_BUILT_INS = {  # checked in this order: F.scaled_dot_product_attention runs a softmax inside
    "scaled_dot_product": "F.scaled_dot_product_attention",
    "softmax": "a built-in softmax (torch.softmax, F.softmax, Tensor.softmax, ...)",
}


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
    name the definition of ``fn`` reaches, ``grading.static_names``; only a graded run makes it) fails the check.
    The torch functions and ATen operators that ``fn(*args)`` ran, recorded next to the learner's code, also
    catch what no source shows (a name computed at run time, a built-in called inside a library function);
    that record is the kernel's word (``kernel_reported``): the rule in JupyterLab, a note in a graded run.
    """
    forbid_written(name, fn, forbidden)
    ran = learner_step(name, lambda: run_in_kernel(operators_used, fn, args), args)
    for fragment, what in forbidden.items():
        used = named_like(fragment, ran if isinstance(ran, list) else [])
        if used:
            kernel_reported(name, fn, _built_in_problem(what, used), BUILT_IN_HINT)
            return


def forbid_written(name: str, fn: Callable, forbidden: Mapping[str, str], hint: str = BUILT_IN_HINT,
                   modules: bool = False) -> None:
    """The grader's own reading of the learner's source alone (``forbid_built_ins``' first reading): for what
    is not a torch operator (a tokenizer library), which no record of the operators that ran would show.
    With ``modules``, each key is a module, found as the first dotted part of a name the source reaches
    (``tiktoken``, ``tiktoken.Encoding``), never inside a learner's own name (``tokenizers_list``)."""
    written = static_names(fn)
    for fragment, what in forbidden.items():
        used = (sorted(n for n in written if isinstance(n, str) and n.split(".")[0] == fragment) if modules
                else named_like(fragment, written))
        if used:
            fail(name, _built_in_problem(what, used), hint)


def named_like(fragment: str, names: Iterable) -> list[str]:
    """The names that contain ``fragment``, ignoring case (``nn.Softmax`` is a softmax too)."""
    return sorted(n for n in names if isinstance(n, str) and fragment.lower() in n.lower())


def _built_in_problem(what: str, used: list[str]) -> str:
    return f"calls {what} ({', '.join(used)}), which this exercise asks you to write yourself"


# Calls that need a tensor's values: on shape-only meta tensors they fail like a device clash would.
READS_VALUES = {"tolist", "item", "numpy", "__bool__", "__int__", "__float__", "__index__"}


def expect_device_agnostic(name: str, fn: Callable, args: tuple, kwargs: dict | None = None) -> None:
    """Run ``fn`` on shape-only 'meta' tensors: a tensor it makes on a fixed device clashes with them.

    This finds code that would break on a GPU even on a machine without one. Code that needs the
    values (``.item()``, ``.tolist()``, ``if x.any():``) cannot run on meta tensors; that is allowed,
    so only a device clash, or a result left on another device, breaks the rule. The run is made next to
    the learner's code, and its error text and its result's devices are that side's report: a result
    that claims the right device needs no values to be right, so the grader cannot check it, and the rule
    goes through ``kernel_reported``.
    """
    problem = _device_problem(fn, args, kwargs or {})
    if problem:
        kernel_reported(name, fn, problem, FIXED_DEVICE_HINT)


def _device_problem(fn: Callable, args: tuple, kwargs: dict) -> str | None:
    try:
        probe = run_in_kernel(run_on_meta, fn, args, kwargs)
    except Exception as exc:  # run_on_meta returns the learner's errors: only a probe that was replaced raises
        return f"the grader could not run your code on shape-only tensors ({exception_name(exc)}: {exc})"
    if not isinstance(probe, dict):
        return "the grader could not run your code on shape-only tensors"
    text = str(probe.get("error", ""))
    if "error" in probe:
        copied_into_fixed_device = "copy out of meta" in text and not set(probe.get("called", ())) & READS_VALUES
        return f"{ON_A_FIXED_DEVICE} ({text})" if "expected device" in text or copied_into_fixed_device else None
    if any(device != "meta" for device in probe.get("devices", ())):
        return "returns a tensor on a fixed device instead of the inputs' device"
    return None
