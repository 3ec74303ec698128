"""nbgrader's Execute, with the verdicts made outside the kernel.

The learner's cells run in the (sandboxed) kernel as nbgrader runs them. A graded test cell does not:
the grader runs its checks itself (``judge``) against proxies of the learner's objects, each request to
the kernel a cell of its own that the notebook never shows, and the verdict becomes that cell's outputs,
from which nbgrader's SaveAutoGrades takes the score. What the kernel prints is capped here, in the
grader, where the learner cannot lift the cap.
"""

import importlib
import json
import threading

import nbformat
from nbclient.exceptions import DeadKernelError
from nbgrader.preprocessors import Execute
from traitlets import Enum, Integer

from ..nbgrader_course import is_test_cell
from ..remote import MIME

AGENT = "autograde_tests.remote.agent"
REPLY_CHARS = 256 * 2**20  # a reply's own limit (the wire refuses more than 64 MiB of tensors)

TRUNCATED = "\n[output truncated by the grader]\n"


class KernelDied(BaseException):
    """The kernel died while the grader was asking it something: nbgrader must see it as it sees a dead cell.

    A BaseException, so that no check's ``except Exception`` turns it into an ordinary failure.
    """


class KernelSilent(Exception):
    """The kernel gave no answer to a request (it timed out, or the learner replaced the agent)."""


class GraderExecute(Execute):
    output_chars = Integer(1_000_000, help="characters of output the learner's cells may print in all").tag(config=True)
    # A graded kernel is thrown away: killed at once, it does not make every submission wait for its farewell.
    shutdown_kernel = Enum(["graceful", "immediate"], default_value="immediate").tag(config=True)
    # A kernel the worker started ahead, used for this notebook. A class attribute, set on a subclass:
    # nbgrader deep-copies its configuration, and a running kernel cannot be copied.
    started = None

    def preprocess(self, nb, resources=None, km=None):
        self.printed = 0
        # The judging code (torch, the checks, the reference) loads while the kernel starts and runs the
        # learner's first cells: the worker mostly waits on the kernel then.
        self.judging = threading.Thread(target=_load_judging, daemon=True)
        self.judging.start()
        return super().preprocess(nb, resources, km or self.started)

    def preprocess_cell(self, cell, resources, index):
        if not is_test_cell(cell):
            return super().preprocess_cell(cell, resources, index)
        self.judging.join()
        from ..remote.proxy import Session
        from . import judge
        from .reach import Reach

        before = [c.source for c in self.nb.cells[:index] if c.cell_type == "code" and not is_test_cell(c)]
        session = Session(lambda request: self._ask(request, index), static_names=Reach(before))
        cell.outputs = judge.judge(cell.source, session)
        self.nb.cells[index] = cell  # nbclient put each request's cell in its place
        return cell, resources

    def _ask(self, request: str, index: int) -> str:
        """One request to the agent in the kernel, run as a cell the notebook never shows; its reply."""
        code = f"__import__({AGENT!r}, fromlist=['serve']).serve(globals(), {request!r})"
        probe = nbformat.v4.new_code_cell(code)
        try:
            self.execute_cell(probe, index, store_history=False)
        except DeadKernelError as exc:
            raise KernelDied(str(exc)) from None
        for output in probe.outputs:
            reply = output.get("data", {}).get(MIME) if output.output_type == "display_data" else None
            if isinstance(reply, dict) and isinstance(reply.get("reply"), str):
                return reply["reply"]
        errors = [f"{o.ename}: {o.evalue}" for o in probe.outputs if o.output_type == "error"]
        raise KernelSilent("the kernel did not answer the grader" + (f" ({errors[0][:200]})" if errors else ""))

    def output(self, outs, msg, display_id, cell_index):
        """Keep what the kernel sends until ``output_chars`` are spent (the grader's replies, up to their own limit)."""
        content = msg.get("content", {})
        if MIME in content.get("data", {}):
            size, limit = len(json.dumps(content["data"][MIME])), REPLY_CHARS
        else:
            size, limit = len(json.dumps(content)), self.output_chars - self.printed
            self.printed += size
        if size > limit:
            if limit > 0 and msg["msg_type"] == "stream":
                outs.append(nbformat.v4.new_output("stream", name="stdout", text=TRUNCATED))
                self.printed = self.output_chars
            return None
        return super().output(outs, msg, display_id, cell_index)


def _load_judging() -> None:
    """Import what judging needs (torch, the checks, the proxies), so the first test cell finds it loaded."""
    for module in ("judge", "reach"):
        importlib.import_module(f"{__package__}.{module}")
