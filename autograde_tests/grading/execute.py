"""nbgrader's Execute, with the verdicts made outside the kernel and the kernel's messages bounded.

The learner's cells run in the (sandboxed) kernel as nbgrader runs them. A graded test cell does not:
the grader runs its checks itself (``judge``) against proxies of the learner's objects, each request to
the kernel a cell of its own that the notebook never shows, and the verdict becomes that cell's outputs,
from which nbgrader's SaveAutoGrades takes the score. All the requests of one test cell share the cell's
time limit (the kernel's time: the grader's own work while judging does not count).

Everything the kernel sends is bounded here, in the grader, where the learner cannot lift the bounds
(each bound is in ``limits``):

- the grader receives from the kernel's relays, never from the kernel (``relay``): a relay passes on no
  message over ``FRAME_BYTES``, whatever its number of frames, and a message too large for the relay's
  capped memory ends the relay, not the grader; a relay that ended (or a connection zmq cut) cuts the
  cell's last messages, and the grader starts the kernel's relays again before its next cell;
- zmq refuses a frame over ``FRAME_BYTES`` before the grader reads it (``MAXMSGSIZE``), and keeps few
  messages waiting (``RCVHWM``);
- a message's content is parsed only when it fits what the grader would keep of it (``channels``);
- every message of a cell counts against the output cap (``output_bytes``, with ``OUTPUT_OVERHEAD_BYTES``
  for each output), whatever its type; the reply to one of the grader's requests is taken aside instead,
  only while the grader waits for it, one per request, up to ``REPLY_BYTES``;
- the error of an execute reply (what nbgrader adds when no output shows it) counts against the cap too;
- the kernel's calls on what the grader lent (``remote.lent``) arrive on stdin, as input requests: they are
  read only while a request of the grader's runs, each up to ``REPLY_BYTES``, and each is answered.
"""

import asyncio
import importlib
import math
import threading
import time

import nbformat
from jupyter_core.utils import run_sync
from nbclient.exceptions import DeadKernelError
from nbgrader.preprocessors import Execute
from traitlets import Bool, Enum, Integer

from ..nbgrader_course import is_test_cell
from ..remote import MIME, wire
from . import limits
from .channels import BoundedClient

AGENT = "autograde_tests.remote.agent"
CONTROL = ("status", "execute_input")  # what tells nbclient where a cell stands; nothing of them is kept
# Outputs nbclient builds from what the kernel wrote: content it cannot read is the kernel's, dropped.
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, nbformat.ValidationError)

TRUNCATED = "\n[output truncated by the grader]\n"


class KernelDied(BaseException):
    """The kernel died while the grader was asking it something: nbgrader must see it as it sees a dead cell.

    A BaseException, so that no check's ``except Exception`` turns it into an ordinary failure.
    """


class KernelSilent(Exception):
    """The kernel gave no answer to a request (it timed out, or the learner replaced the agent)."""


class GraderExecute(Execute):
    output_bytes = Integer(limits.OUTPUT_BYTES,
                           help="bytes of messages the learner's cells may send in all").tag(config=True)
    # A graded kernel is thrown away: killed at once, it does not make every submission wait for its farewell.
    shutdown_kernel = Enum(["graceful", "immediate"], default_value="immediate").tag(config=True)
    # A cell whose last messages never came (lost in a flood, or with a connection zmq cut) ends there,
    # without them, instead of failing the whole notebook; they get long enough to come from a kernel
    # on a busy machine (a request's reply is one of them).
    raise_on_iopub_timeout = Bool(False).tag(config=True)
    iopub_timeout = Integer(limits.IOPUB_SECONDS).tag(config=True)
    # A kernel the worker started ahead, used for this notebook. A class attribute, set on a subclass:
    # nbgrader deep-copies its configuration, and a running kernel cannot be copied.
    started = None

    def preprocess(self, nb, resources=None, km=None):
        self.printed = 0
        self.awaiting = False  # whether the grader waits for the reply to a request of its own
        self.reply: str | None = None
        self.request: str | None = None  # the grader's request, until an execute request carries it
        self.answer = None  # the judging session's answer to a call on what it lent (``lent.Lender``)
        self.budget: float | None = None  # seconds the kernel has left to answer the test cell being judged
        self.timeout_func = self._timeout_for
        # The judging code (torch, the checks, the reference) loads while the kernel starts and runs the
        # learner's first cells: the worker mostly waits on the kernel then.
        self.judging = threading.Thread(target=_load_judging, daemon=True)
        self.judging.start()
        try:
            return super().preprocess(nb, resources, km or self.started)
        finally:  # nbclient keeps the client of a kernel it did not start: its sockets and queues go now
            if self.kc is not None:
                self.kc.stop_channels()
                self.kc = None

    async def async_start_new_kernel_client(self):
        self.km.client_factory = BoundedClient
        client = await super().async_start_new_kernel_client()
        client.iopub_channel.limit = self._iopub_limit
        client.shell_channel.carry = self._carry
        return client

    start_new_kernel_client = run_sync(async_start_new_kernel_client)  # nbclient's sync name calls its own

    def execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        """nbclient's, on new relays and connections first if one was cut (the kernel sent a message over the limit)."""
        if self._cut():
            self.kc.stop_channels()
            if getattr(self.km, "relays", None) is not None:
                self.km.relays.renew()
            self.start_new_kernel_client()
        self.raise_on_iopub_timeout = False
        return run_sync(self.async_execute_cell)(cell, cell_index, execution_count, store_history)

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        """nbclient's; while a request of the grader's runs, the kernel's calls on what it lent are answered."""
        if self.request is None:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        answering = asyncio.ensure_future(self._answer_lent_calls())
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        finally:
            answering.cancel()

    async def _answer_lent_calls(self) -> None:
        """Answer each input request of the kernel as a call on what the judging session lent it. Every
        request gets an answer (one the grader cannot read, an error), so a stub never waits for nothing;
        the time they take is the test cell's."""
        while True:
            msg = await self.kc.stdin_channel.get_msg(timeout=None)
            if msg["msg_type"] != "input_request":
                continue
            prompt = msg["content"].get("prompt")
            if msg.get("oversized") or not isinstance(prompt, str) or self.answer is None:
                reply = wire.encode({"raised": ["ValueError", "a call the grader cannot read"]})
            else:
                reply = self.answer(prompt)
            self.kc.input(reply)

    async def _async_handle_timeout(self, timeout, cell=None):
        """A cell past its time is interrupted. A kernel that then sends nothing more for the cell (it ignores
        the interrupt) did not finish it: that ends the notebook, as under nbgrader's own Execute. One still
        sending (a slow flood), or whose connection zmq cut, only loses the cell's last messages."""
        self.raise_on_iopub_timeout = not self._cut()
        return await super()._async_handle_timeout(timeout, cell)

    def _cut(self) -> bool:
        """Whether a connection to the kernel was cut: a relay ended, or the grader's client saw it go."""
        relays = getattr(self.km, "relays", None)
        return self.kc is not None and (self.kc.lost() or (relays is not None and relays.ended()))

    def preprocess_cell(self, cell, resources, index):
        if not is_test_cell(cell):
            return super().preprocess_cell(cell, resources, index)
        self.judging.join()
        from ..remote.proxy import Session
        from . import judge
        from .static_names import StaticNames

        before = [c.source for c in self.nb.cells[:index] if c.cell_type == "code" and not is_test_cell(c)]
        session = Session(lambda request: self._ask(request, index), static_names=StaticNames(before))
        self.budget, self.answer = self.timeout, session.lender.answer
        try:
            cell.outputs = judge.judge(cell.source, session)
        finally:
            self.budget, self.answer = None, None
        self.nb.cells[index] = cell  # nbclient put each request's cell in its place
        return cell, resources

    def _ask(self, request: str, index: int) -> str:
        """One request to the agent in the kernel, run as a cell the notebook never shows; its reply."""
        if self.budget is not None and self.budget <= 0:
            raise KernelSilent(f"the kernel used up the test cell's {self.timeout} s")
        probe = nbformat.v4.new_code_cell(f"__import__({AGENT!r}, fromlist=['serve']).serve(globals())")
        self.awaiting, self.reply, self.request = True, None, request
        start = time.monotonic()
        try:
            self.execute_cell(probe, index, store_history=False)
        except DeadKernelError as exc:
            raise KernelDied(str(exc)) from None
        finally:
            self.awaiting, self.request = False, None
            if self.budget is not None:
                self.budget -= time.monotonic() - start
        if self.reply is not None:
            return self.reply
        errors = [f"{o.ename}: {o.evalue}" for o in probe.outputs if o.output_type == "error"]
        raise KernelSilent("the kernel did not answer the grader" + (f" ({errors[0][:200]})" if errors else ""))

    def _carry(self) -> str | None:
        """The request the next execute request carries (once), while the grader asks one."""
        request, self.request = self.request, None
        return request

    def _timeout_for(self, cell) -> int | None:
        """A cell's time limit; for a request, what its test cell's requests have left of theirs."""
        return self.timeout if self.budget is None else max(1, math.ceil(self.budget))

    def _iopub_limit(self) -> int:
        """The largest content worth parsing now: a reply while one is awaited, else what the cap has left."""
        return limits.REPLY_BYTES if self.awaiting else max(self.output_bytes - self.printed, limits.HEADER_BYTES)

    def process_message(self, msg, cell, cell_index):
        """A message of a cell: the awaited reply is taken aside; any other counts against the cap before
        nbclient keeps anything of it, and only outputs and clear_output reach nbclient."""
        self.raise_on_iopub_timeout = False  # the kernel still answers for this cell (see _async_handle_timeout)
        if self._is_reply(msg):
            self.awaiting, self.reply = False, msg["content"]["data"][MIME]["reply"]
            return None
        if msg["msg_type"] in CONTROL and not msg.get("oversized"):
            return super().process_message(_control(msg), cell, cell_index)
        kept = self._spend(msg["bytes"] + limits.OUTPUT_OVERHEAD_BYTES, cell.outputs)
        # comm messages are counted, then dropped: they carry widgets' state, which grading never shows
        if not kept or msg.get("oversized") or msg["msg_type"].startswith("comm"):
            return None
        try:
            return super().process_message(_without_display_id(msg), cell, cell_index)
        except MALFORMED:
            return None

    def _is_reply(self, msg: dict) -> bool:
        if not (self.awaiting and msg["msg_type"] == "display_data" and not msg.get("oversized")):
            return False
        data = msg["content"].get("data")
        reply = data.get(MIME) if isinstance(data, dict) else None
        return isinstance(reply, dict) and isinstance(reply.get("reply"), str)

    def _spend(self, size: int, outputs: list) -> bool:
        """Whether ``size`` more bytes fit in the cap (then they are counted); the first that do not, say so."""
        if self.printed + size <= self.output_bytes:
            self.printed += size
            return True
        if self.printed < self.output_bytes:
            outputs.append(nbformat.v4.new_output("stream", name="stdout", text=TRUNCATED))
            self.printed = self.output_bytes
        return False

    def on_cell_executed(self, **kwargs):
        """nbgrader's (it adds the execute reply's error when no output shows it), with that error cut to
        what the cap has left, and counted."""
        cell, reply = kwargs["cell"], kwargs["execute_reply"]["content"]
        if reply.get("status") != "error":
            return
        error, size = _bounded_error(reply, self.output_bytes - self.printed)
        shown = len(cell.outputs)
        super().on_cell_executed(**kwargs | {"execute_reply": {"content": error}})
        if len(cell.outputs) > shown:
            self.printed += size + limits.OUTPUT_OVERHEAD_BYTES


def _control(msg: dict) -> dict:
    """A status or execute_input message as nbclient reads it, with nothing else of what the kernel put in it."""
    content = msg["content"]
    kept = {key: content[key] for key in ("execution_state", "execution_count") if key in content}
    if not isinstance(kept.get("execution_state", ""), str):
        del kept["execution_state"]
    if type(kept.get("execution_count", 0)) is not int:
        del kept["execution_count"]
    if msg["msg_type"] == "status":
        kept.setdefault("execution_state", "unknown")
    return msg | {"content": kept}


def _without_display_id(msg: dict) -> dict:
    """``msg`` without a display id: nbclient would copy an update into every output with that id, past the cap.

    An update of an earlier display is counted, then ignored, as nbclient ignores an update without an id.
    """
    content = dict(msg["content"])
    content.pop("transient", None)
    if type(content.get("execution_count", 0)) is not int:
        content.pop("execution_count")
    return msg | {"content": content}


def _bounded_error(reply: dict, room: int) -> tuple[dict, int]:
    """An execute reply's error as text only, cut to ``room`` characters (and a mark); its size."""
    ename = _text(reply.get("ename"))[:limits.NAME_CHARS]
    evalue = _text(reply.get("evalue"))[:max(room, 0)]
    traceback, used = [], len(evalue)
    lines = reply.get("traceback") if isinstance(reply.get("traceback"), list) else []
    for line in map(_text, lines):
        if used + len(line) > room:
            traceback.append(TRUNCATED.strip())
            break
        traceback.append(line)
        used += len(line)
    return {"status": "error", "ename": ename, "evalue": evalue, "traceback": traceback}, used


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _load_judging() -> None:
    """Import what judging needs (torch, the checks, the proxies), so the first test cell finds it loaded."""
    for module in ("judge", "static_names"):
        importlib.import_module(f"{__package__}.{module}")
