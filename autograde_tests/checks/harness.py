"""What every graded check shares: devices, seeded inputs, the tolerance policy, and distrust of learner output.

Every check follows the same steps, so a learner sees the same kind of message in every chapter:
call the learner's code (an exception becomes a readable failure), insist on a plain tensor of the
right shape, dtype and device, insist that the inputs were not modified, compare with the reference
under the tolerance below, and, when the numbers are wrong, name the mistake if a known one matches.

``call`` is the one way a check calls the learner's code: every tensor it hands over is compared with a
copy taken before the call, so code that changes its input in place is a verdict at that very call, and no
value a check computes afterwards from those tensors can be one the learner's code chose.
"""

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import math
import sys
import textwrap
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path

import torch
from torch import nn

from .. import reference
from ..remote.proxy import is_module, type_name
from ..remote.wire import RemoteError

# The tolerance policy, the only one in the course. Expected values are computed in float64 on the CPU;
# a learner's result in dtype d must agree to TOLERANCE[d]. The float32 bounds allow for a different
# summation order (einsum vs matmul, CPU vs CUDA with TF32 off); every known mistake is orders larger.
TOLERANCE = {
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.float64: dict(rtol=1e-9, atol=1e-11),
}
DTYPES = tuple(TOLERANCE)


def devices() -> list[torch.device]:
    """The CPU, and the GPU when there is one: checks run on every device they find."""
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found.append(torch.device("cuda"))
    return found


def devices_and_dtypes(dtypes=DTYPES) -> list[tuple[torch.device, torch.dtype]]:
    """Every (device, dtype) a check runs its cases on."""
    return [(device, dtype) for device in devices() for dtype in dtypes]


def run_cases(name: str, cases: list, check_case: Callable, after: Callable = lambda: None, dtypes=DTYPES,
              prepare: Callable | None = None, cpu_only: bool = False) -> None:
    """The case runner: ``check_case(index, case, device, dtype)`` for every case on every (device, dtype),
    then ``after()`` (the checks that are not per case), then the pass line. A case fails by raising
    AssertionError (``fail``), so the pass line is printed only when nothing failed.

    ``prepare(index, case)``, when given, runs once per case, the first time the case runs (e.g. a learner's
    module built once whatever the device), and its result is ``check_case``'s fifth argument. ``dtypes`` of
    float64 alone is the path of checks that need it; ``cpu_only`` is for what takes no device (it makes its
    tensors itself), which would only run twice on a GPU machine. No ``dtypes`` at all is for what takes no
    tensor (text, token ids): each case runs once, on the CPU, with None for its dtype."""
    if dtypes:
        where = [(device, dtype) for device, dtype in devices_and_dtypes(dtypes)
                 if device.type == "cpu" or not cpu_only]
    else:
        where = [(torch.device("cpu"), None)]
    prepared = {}
    for device, dtype in where:
        for index, case in enumerate(cases):
            with in_case(case, device, dtype):
                if prepare is None:
                    check_case(index, case, device, dtype)
                    continue
                if index not in prepared:
                    prepared[index] = prepare(index, case)
                check_case(index, case, device, dtype, prepared[index])
    after()
    passed(name, len(cases) * len(where), dtypes, cpu_only)


@contextlib.contextmanager
def in_case(case, device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """A failure inside states its case: the case's fields (a dataclass's), the dtype and the device, so that
    a learner can rerun what failed (``CheckFailed.case``; shown on an indented line under the problem)."""
    try:
        yield
    except CheckFailed as failure:
        given = (", ".join(f"{f.name}={getattr(case, f.name)!r}" for f in fields(case)) if is_dataclass(case)
                 else repr(case))
        where = f"; {str(dtype).removeprefix('torch.')} on {torch.device(device).type}" if dtype is not None else ""
        raise dataclasses.replace(failure, case=given + where) from None


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build and run the learner's code with ``dtype`` as the default, so that a tensor made with the default
    dtype (a positional encoding, a mask turned float) is exact in float64 too."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run on one CPU thread: the checks' models are tiny, and on a busy machine several threads mostly wait
    on each other (a training step took ten times longer with two threads than with one)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@contextlib.contextmanager
def strict_numerics() -> Iterator[None]:
    """TF32 off for the duration of a check: its 10-bit mantissa would hide real mistakes in float32."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def seed_for(name: str, hidden: bool, *purpose: object) -> int:
    """The one seed rule: what a check draws comes from its name, whether the cases are hidden, and what the draw
    is for (a case's index, "weights", ...). The same numbers in every run, process and machine (a hash, not
    Python's salted one); other numbers for the hidden cases, so that passing the visible ones says nothing of
    them; no two checks or purposes sharing a stream."""
    key = "/".join([name, "hidden" if hidden else "visible", *map(str, purpose)])
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "little")


class SeededRandom:
    """Seeded random inputs, the same numbers on every device and dtype (drawn on the CPU in float64)."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator, dtype=torch.float64)

    def bernoulli(self, p: float, *shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=self.generator, dtype=torch.float64) < p


def randomise(module: nn.Module, rng: SeededRandom) -> nn.Module:
    """Overwrite every parameter with seeded numbers of a useful size, so no check depends on initialisation.

    Weights ~ N(0, 1/fan_in), so that projections keep unit variance and softmax does not saturate; biases,
    and a norm's shift, ~ N(0, 0.3²); a norm's scale (a 1-D ``weight``) ~ 1 + N(0, 0.3²). Zeros and ones,
    PyTorch's starting values for biases and norms, would hide a lost bias or a misplaced norm.
    """
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            noise = rng.randn(*p.shape).to(p.dtype)
            if p.dim() >= 2:
                p.copy_(noise / math.sqrt(p[0].numel()))
            elif name.split(".")[-1] == "weight":
                p.copy_(1 + 0.3 * noise)
            else:
                p.copy_(0.3 * noise)
    return module


def key_mask(padding_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, n) padding mask -> (B, 1, 1, n): the same keys hidden from every head and every query (None stays None)."""
    return None if padding_mask is None else padding_mask[:, None, None, :]


UNIFORM_WHEN_ALL_MASKED = (
    "a query whose keys are all masked gets uniform weights instead of zeros: the scores were filled with a "
    "large negative number (such as -1e9) instead of -inf, and such rows were not zeroed",
    "the course's convention, as F.scaled_dot_product_attention's in torch 2.13, is zero weights and a zero output "
    "for a query that may attend to nothing (nothing to attend to, nothing to mix): fill masked scores with "
    "float('-inf'), then set the weights where the mask is False to 0 (torch.where(mask, weights, 0.0)).",
)
DROPOUT_IN_EVAL = (
    "gives different results for the same input in eval mode: its dropout is still active",
    "use nn.Dropout (model.eval() switches it off) or F.dropout(..., training=self.training).",
)
ON_A_FIXED_DEVICE = "makes a tensor on a fixed device, which breaks when the inputs are on a GPU"
FIXED_DEVICE_HINT = ("create tensors (masks too) with device=<input>.device "
                     "(or use torch.zeros_like / full_like / where).")


@dataclass(eq=False)
class CheckFailed(AssertionError):
    """A check's verdict, as data: which exercise, what is wrong, how to fix it, in which case, and the facts
    behind it. Rendered to text only where a person reads it (``render``: the notebook, the feedback); code
    that restates or classifies a failure reads its fields, never its text.

    In a notebook it shows as its message and hint, after the frames of the learner's own code when that code
    raised; never the frames of the checks, which would only bury the message (IPython, and so JupyterLab,
    ``nbgrader validate`` and the feedback, honour ``_render_traceback_``)."""

    exercise: str  # the name the learner wrote: "softmax", "Transformer.decode"
    problem: str  # what is wrong; may hold indented lines of detail ("when called with (...)")
    hint: str | None = None  # how to fix it
    case: str | None = None  # the case's fields, dtype and device, set by ``in_case``
    mistake: "Mistake | None" = None  # the known mistake this failure names, when one matched
    raised: str | None = None  # the class name of the exception the learner's code raised, when it raised
    exception: str | None = None  # that exception's own message (PyTorch's words, or the learner's)
    numbers: dict = field(default_factory=dict)  # the figures the problem quotes (largest error, index, ...)
    learner_frames: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(self.render())

    def render(self) -> str:
        """The verdict as a learner reads it: ``exercise: problem``, the case indented under it, then the hint."""
        text = f"{self.exercise}: {self.problem}"
        if self.case is not None:
            text += f"\n  case: {self.case}"
        return text + (f"\nHint: {self.hint}" if self.hint else "")

    def __str__(self) -> str:
        return self.render()

    def __reduce__(self):  # exceptions pickle their args; a verdict pickles its fields
        return (_rebuilt, (type(self), dataclasses.asdict(self) | {"mistake": self.mistake}))

    def _render_traceback_(self) -> list[str]:
        lines = ["Traceback of your code (most recent call last):", *self.learner_frames] if self.learner_frames else []
        return lines + shown(f"AssertionError: {self.render()}")


def _rebuilt(cls: type, values: dict) -> "CheckFailed":
    return cls(**values)


# JupyterLab's output area breaks a line that is too long at any character ("bef ore", "2.296 41"). 79 columns,
# the width Python's own code keeps to, fit that area in a 1280 px window (the browser test measures it).
WIDTH = 79


def shown(message: str) -> list[str]:
    """The lines a notebook shows of a check's ``message``: each of its lines (the problem, an indented case,
    the hint) wrapped at spaces to ``WIDTH`` columns, a wrapped line's continuation indented under its text,
    so the eye finds where each part begins. A word longer than a line is never split."""
    lines = []
    for line in message.splitlines():
        text = line.lstrip(" ")
        indent = " " * (len(line) - len(text))
        under = indent + (" " * len("Hint: ") if text.startswith("Hint: ") else "    ")
        lines += textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=under,
                               break_long_words=False, break_on_hyphens=False) or [line]
    return lines


# Frames in these folders are the course's or a library's, not the learner's.
_NOT_THE_LEARNERS = tuple(sorted({str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix)}
                                 | {str(Path(__file__).resolve().parents[1])}))


def learner_frames(exc: BaseException) -> list[str]:
    """The frames of ``exc``'s traceback that are in the learner's own code, formatted as JupyterLab formats
    its own: a frame in a notebook cell is ``Cell In[4], line 2`` (IPython's name for it), not the temporary
    file the kernel compiled the cell to; a frame in a file is that file's."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not str(Path(f.filename).resolve()).startswith(_NOT_THE_LEARNERS)]
    return [line for frame in frames for line in _frame_lines(frame)]


def _frame_lines(frame: traceback.FrameSummary) -> list[str]:
    # IPython is looked up, not imported: the checks also run where there is no IPython (a grader, pytest).
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    cell = shell.compile.format_code_name(frame.filename) if shell is not None else None
    where = f"{cell[0]} {cell[1]}" if cell else f'File "{frame.filename}"'
    lines = [f"  {where}, line {frame.lineno}, in {frame.name}"]
    return lines + ([f"    {frame.line.strip()}"] if frame.line else [])


class ChangedInput(CheckFailed):
    """The verdict on code that changed an input in place (``call``): a check that diagnoses why a call
    failed lets this one through as it is."""


class OnAFixedDevice(CheckFailed):
    """The verdict on code that made a tensor on a fixed device (``learner_step``): it says all there is, so a
    check that diagnoses why a call failed lets it through as it is."""


def fail(name: str, problem: str, hint: str | None = None, frames: list[str] | None = None,
         verdict: type[CheckFailed] = CheckFailed, **facts) -> None:
    """Fail with a verdict on ``name``; ``facts`` are its other fields (``mistake``, ``raised``, ``numbers``...)."""
    if frames is None:
        # A check that restates a failure it caught (a hint for a failed .view) keeps the frames of the
        # learner's code that failure showed: they are where to look.
        handled = sys.exc_info()[1]
        frames = handled.learner_frames if isinstance(handled, CheckFailed) else None
    raise verdict(name, problem, hint, learner_frames=frames or [], **facts) from None


def restate(failure: CheckFailed, problem: str, hint: str | None) -> None:
    """Fail again with ``failure``'s problem and facts, and what a check's diagnosis adds to them: its next
    line of ``problem`` and its own ``hint``."""
    raise dataclasses.replace(failure, problem=f"{failure.problem}\n{problem}", hint=hint) from None


def call(name: str, fn: Callable, *args, **kwargs):
    """Call the learner's function; an exception becomes a failure that says with what it was called, and
    a tensor argument it changed in place fails too (named as the contract names that argument of ``name``)."""
    return _guarded_call(name, fn, args, kwargs, _contract_names(name))


def _guarded_call(name: str, fn: Callable, args: tuple, kwargs: dict, names: Callable[[], list[str]]):
    """``fn(*args, **kwargs)`` as ``call`` makes it; ``names()`` gives the positional arguments' names."""
    keys = list(enumerate(args)) + list(kwargs.items())
    copies = {key: t.detach().clone() for key, t in keys if isinstance(t, torch.Tensor) and not t.is_meta}
    result = learner_step(name, lambda: fn(*args, **kwargs), args)
    for key, copied in copies.items():
        now = args[key] if isinstance(key, int) else kwargs[key]
        if not _same(now, copied):
            _fail_changed(name, key if isinstance(key, str) else _nth(names(), key), copied.dtype == torch.bool)
    return result


def _contract_names(name: str) -> Callable[[], list[str]]:
    """The names of the positional arguments of the learner's ``name`` (a function, a module's forward, or a
    method such as ``"Transformer.encode"``), read, when needed, from the reference's signature (the contract's)."""

    def names() -> list[str]:
        try:
            target = functools.reduce(getattr, name.split("."), reference)
        except (AttributeError, ImportError):
            return []
        if inspect.isclass(target):
            return list(inspect.signature(target.forward).parameters)[1:]  # without self
        parameters = list(inspect.signature(target).parameters)
        return parameters[1:] if "." in name else parameters  # a method's self

    return names


def _nth(names: list[str], index: int) -> str:
    return names[index] if index < len(names) else f"argument {index + 1}"


def _same(now: torch.Tensor, before: torch.Tensor) -> bool:
    """Bit for bit the same tensor (NaN where NaN was)."""
    if now.shape != before.shape or now.dtype != before.dtype:
        return False
    if torch.equal(now, before):
        return True
    return now.is_floating_point() and torch.equal(now.isnan(), before.isnan()) and torch.equal(
        now.nan_to_num(0.0), before.nan_to_num(0.0))


def _fail_changed(name: str, arg: str, is_mask: bool) -> None:
    hint = ("use ~mask or torch.where instead of in-place ops." if is_mask else
            "use out-of-place operations (x = x - m, masked_fill, torch.where) instead of -=, "
            "masked_fill_ or slice assignment on an input.")
    fail(name, f"modified its input `{arg}` in place", hint, verdict=ChangedInput)


def learner_step(name: str, step: Callable, shown: tuple):
    """Run ``step``, which runs the learner's code on ``shown``; an exception becomes a failure."""
    try:
        return step()
    except NotImplementedError:
        fail(name, "is not written yet", "replace `raise NotImplementedError()` with your code.")
    except Exception as exc:  # the learner's code may raise anything
        shapes = ", ".join(describe(a) for a in shown)
        raised = dict(raised=exception_name(exc), exception=str(exc), frames=learner_frames(exc))
        if "same device" in str(exc) or "expected device" in str(exc):
            fail(name, f"{ON_A_FIXED_DEVICE} ({exc})\n  when called with ({shapes})", FIXED_DEVICE_HINT,
                 verdict=OnAFixedDevice, **raised)
        fail(name, f"raised {exception_name(exc)}: {exc}\n  when called with ({shapes})", **raised)


def exception_name(exc: BaseException) -> str:
    """The class name of an exception the learner's code raised, wherever it ran."""
    return exc.type_name if isinstance(exc, RemoteError) else type(exc).__name__


def describe(x) -> str:
    """A short description for a message: shape, dtype and device of a tensor, a short repr, or a class name."""
    if isinstance(x, torch.Tensor):
        return f"tensor of shape {tuple(x.shape)}, {str(x.dtype).removeprefix('torch.')}, on {x.device.type}"
    if x is None or isinstance(x, (bool, int, float)) or (isinstance(x, str) and len(x) <= 40):
        return repr(x)
    return type_name(x)


def expect_tensor(name: str, what: str, x, shape: tuple, like: torch.Tensor) -> None:
    """``x`` must be a plain tensor (no subclass) of ``shape`` with the dtype and device of ``like``."""
    if type(x) is not torch.Tensor:
        fail(name, f"{what} should be a torch.Tensor, got {type_name(x)}")
    if tuple(x.shape) != tuple(shape):
        fail(name, f"{what} has shape {tuple(x.shape)}, expected {tuple(shape)}")
    if x.dtype == torch.float32 and like.dtype == torch.float64:
        fail(name, f"{what} is torch.float32 but the inputs are torch.float64: a .float() on the result (as "
             "published models do on purpose, to compute a half-precision model's logits or norms in float32), "
             "or a tensor made inside with the default dtype", "compute in the inputs' dtype: leave out .float(), "
             "and create tensors with dtype=<input>.dtype (or torch.zeros_like / torch.full_like).")
    if x.dtype != like.dtype:
        fail(
            name,
            f"{what} is {x.dtype} but the inputs are {like.dtype}",
            "a tensor made inside your function has a fixed dtype; create it with "
            "dtype=<input>.dtype (or use torch.zeros_like / torch.full_like).",
        )
    if x.device != like.device:
        fail(
            name,
            f"{what} is on {x.device} but the inputs are on {like.device}",
            "a tensor made inside your function has a fixed device; create it with device=<input>.device.",
        )


def expect_loss(name: str, loss, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A loss must be a scalar tensor of ``dtype`` on ``device`` that still requires grad (something could be
    trained with it); returned detached, for comparing."""
    expect_tensor(name, "the loss", loss, (), like=torch.empty(0, dtype=dtype, device=device))
    if not loss.requires_grad:
        fail(name, "the loss is detached from the model: nothing could be trained with it",
             "return the tensor itself: no .item(), .detach() or torch.no_grad().")
    return loss.detach()


def output_like_input(name: str, fn: Callable, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """``fn(x, ...)``, which must be a plain tensor shaped, typed and placed like ``x``, with ``x`` untouched."""
    out = _guarded_call(name, fn, (x, *args), kwargs, lambda: ["x", *_contract_names(name)()[1:]])
    expect_tensor(name, "the output", out, x.shape, like=x)
    return out


def expect_unchanged(name: str, inputs: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Each ``(tensor, copy_taken_before_the_call)`` must still be bit-for-bit the same."""
    for arg, (now, before) in inputs.items():
        if not torch.equal(now, before):
            _fail_changed(name, arg, is_mask=False)


def close(actual: torch.Tensor, expected: torch.Tensor, precision: torch.dtype | None = None) -> bool:
    """Within the tolerance of ``actual``'s dtype (or of ``precision``, when given)."""
    expected = expected.to(dtype=actual.dtype, device=actual.device)
    tolerance = TOLERANCE[precision or actual.dtype]
    return actual.shape == expected.shape and torch.allclose(actual, expected, **tolerance)


def fail_difference(name: str, what: str, actual: torch.Tensor, expected: torch.Tensor,
                    against: str = "the reference") -> None:
    """Fail: ``what`` and ``against`` differ (a compound subject, so the verb agrees whether ``what`` is
    "the output" or "the weights"), with the largest error. A float64 result that is right to
    float32 precision only is a precision mistake, and the message says so (its numbers look the same), from
    the relative error it measured: float32's rounding is about 6e-8; smaller, it is a small constant instead."""
    if actual.dtype == torch.float64 and close(actual, expected, precision=torch.float32):
        scale = float(expected.to(actual).abs().max()) or 1.0
        relative = float((actual - expected.to(actual)).abs().nan_to_num(nan=float("inf")).max()) / scale
        numbers = largest_error(actual, expected) | {"relative_error": relative}
        measured = f"largest error {relative:.2g} of the largest value; {error_text(numbers, digits=12)}"
        if relative >= 1e-8:
            fail(name, f"float32 precision only in {what}: it agrees with {against} only as far as float32's rounding "
                 f"goes, not to float64's 1e-11 ({measured})",
                 "compute in the dtype you return: a float32 step (a tensor made with the default dtype, .float(), "
                 "a float32 buffer) loses what float64 keeps.", numbers=numbers)
        fail(name, f"{what} and {against} differ by a little, but more than float64's rounding and less than "
             f"float32's ({measured})", "look for a small constant the formula does not have (an eps added, or "
             "added in another place) or an approximation.", numbers=numbers)
    numbers = largest_error(actual, expected)
    fail(name, f"{what} and {against} differ:\n  {error_text(numbers)}", numbers=numbers)


def largest_error(actual: torch.Tensor, expected: torch.Tensor) -> dict:
    """Where ``actual`` is furthest from ``expected`` (NaNs count as infinitely wrong): ``{"error", "index",
    "got", "expected"}``."""
    expected = expected.to(dtype=actual.dtype, device=actual.device)
    error = (actual - expected).abs().nan_to_num(nan=float("inf"))
    flat = int(error.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), actual.shape))
    return {"error": float(error.flatten()[flat]), "index": index, "got": float(actual[index]),
            "expected": float(expected[index])}


def error_text(numbers: dict, digits: int = 6) -> str:
    """'largest error 0.31 at index (1, 0, 2): got 0.52, expected 0.21', from ``largest_error``'s numbers."""
    return (f"largest error {numbers['error']:.3g} at index {numbers['index']}: "
            f"got {numbers['got']:.{digits}g}, expected {numbers['expected']:.{digits}g}")


@dataclass(frozen=True)
class Mistake:
    """A known mistake: what to tell the learner, and how to compute what the mistaken code returns."""

    problem: str
    hint: str
    compute: Callable  # called with the case's float64 CPU inputs; returns what the mistaken code would


class EditDoesNotApply(Exception):
    """A mistake's edit names a fragment its reference definition does not hold exactly once."""


def edited(function: Callable, *changes: tuple[str, str], **names) -> Callable:
    """``function``, a reference definition (a method too: then called with its object first), with each
    ``(old, new)`` fragment of its source replaced, and ``names`` in place of the module's: what a mistake
    computes, written as the mistake itself rather than as a second copy of the reference. It is compiled
    when the checks load, so an ``old`` the reference no longer holds exactly once fails loudly
    (``EditDoesNotApply``) instead of dropping the mistake."""
    source = textwrap.dedent(inspect.getsource(function))
    for old, new in changes:
        if source.count(old) != 1:
            raise EditDoesNotApply(f"{function.__qualname__} holds {source.count(old)} times {old!r}")
        source = source.replace(old, new)
    namespace = dict(inspect.unwrap(function).__globals__) | names  # a decorated function: its own module
    exec(compile(source, f"<{function.__qualname__}, edited>", "exec"), namespace)  # noqa: S102 (our reference)
    return namespace[function.__name__]


def candidates(mistakes: Iterable[Mistake], *args, part: int | None = None) -> Iterator[tuple[Mistake, object]]:
    """Each mistake with what the mistaken code returns on ``args`` (``part`` picks one result of a tuple).

    The one rule for "does not apply": a mistake whose computation raises, or returns None, is skipped;
    it can never stop a check.
    """
    for mistake in mistakes:
        try:
            with torch.no_grad():
                result = mistake.compute(*args)
            if part is not None and isinstance(result, tuple):
                result = result[part]
        except Exception:  # e.g. a mask mistake on a case without a mask, or shapes it cannot take
            result = None
        yield mistake, result


def matching_mistake(actual: torch.Tensor, candidates: Iterable[tuple[Mistake, object]], exact: bool = False,
                     align: Callable | None = None) -> Mistake | None:
    """The mistake whose result matches ``actual``, or None: the one matcher of every check.

    ``candidates`` pairs each mistake with its result for this case (see ``candidates``). Results match within
    the dtype's tolerance, or, with ``exact``, element for element (masks, token ids). ``align(actual, result)``
    puts the two in one shape first where a mistake may change it (e.g. a decoding that stops early); it returns
    None when they cannot be compared. When several match (in float32, a small difference between two mistakes
    can hide under the tolerance), the nearest is the one, the first of equals.
    """
    matching = []
    for i, (mistake, result) in enumerate(candidates):
        if not isinstance(result, torch.Tensor):
            continue
        got, result = align(actual, result) if align else (actual, result)
        if result is None or result.shape != got.shape:
            continue
        if exact and torch.equal(got, result.to(got)):
            matching.append((0.0, i, mistake))
        elif not exact and close(got, result):
            matching.append((float((got - result.to(got)).abs().max()) if got.numel() else 0.0, i, mistake))
    return min(matching, key=lambda m: m[:2])[2] if matching else None


def name_the_mistake(name: str, what: str, actual: torch.Tensor, expected: torch.Tensor,
                     candidates: Iterable[tuple[Mistake, object]], exact: bool = False, align: Callable | None = None,
                     otherwise: Callable[[], None] = lambda: None, against: str = "the reference") -> None:
    """Fail naming the mistake whose result matches ``actual`` (``matching_mistake``); when none does, run
    ``otherwise()`` (a check's own diagnosis, which fails when it finds something), then fail with the largest
    error between ``what`` and ``against``."""
    mistake = matching_mistake(actual, candidates, exact, align)
    if mistake is not None:
        fail(name, mistake.problem, mistake.hint, mistake=mistake)
    otherwise()
    fail_difference(name, what, actual, expected, against)


def construct(name: str, cls: type, *args, **kwargs) -> nn.Module:
    """Build the learner's module, in eval mode (graded checks never see dropout)."""
    module = call(name, cls, *args, **kwargs)
    if not is_module(module):
        fail(name, f"should be an nn.Module, got {type_name(module)}")
    return module.eval()


def copy_weights(name: str, learner: nn.Module, reference: nn.Module, hint: str, lent: tuple[str, ...] = ()) -> None:
    """Load the reference's parameters into the learner's module, by name.

    Checks never rely on initialisation order: both modules get the very same numbers. A missing,
    extra or misshapen parameter fails with its name and ``hint`` (what the contract asks for); buffers
    of the learner's own (a persistent positional encoding, a stored mask) are the learner's business.
    Parameters under the submodules named in ``lent`` (stand-ins the check lent, with their own weights) are
    left out.
    """
    own = lambda state: {key: value for key, value in state.items() if not key.startswith(tuple(f"{p}." for p in lent))}
    want, have = own(reference.state_dict()), own(learner.state_dict())
    parameters = {key for key, _ in learner.named_parameters()}
    missing = sorted(want.keys() - have.keys())
    extra = sorted(key for key in have.keys() - want.keys() if key in parameters)
    if missing:
        fail(name, f"has no parameter {', '.join(missing)}", hint)
    if extra:
        fail(name, f"has parameters the reference does not: {', '.join(extra)}", hint)
    for key, value in want.items():
        if have[key].shape != value.shape:
            fail(name, f"parameter {key} has shape {tuple(have[key].shape)}, expected {tuple(value.shape)}", hint)
    learner.load_state_dict(want, strict=False)


def passed(name: str, cases: int, dtypes=DTYPES, cpu_only: bool = False) -> None:
    where = "cpu" if cpu_only else ", ".join(d.type for d in devices())
    kinds = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
    print(f"✔ {name}: all {cases} cases passed" + (f" ({where}; {kinds})" if dtypes else ""))
