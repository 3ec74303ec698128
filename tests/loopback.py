"""A transport to an agent in this process, through the same messages as a graded kernel's: for the suite."""

import io
import pickle

from autograde_tests.remote import agent
from autograde_tests.remote.proxy import Remote, Session


class Loopback:
    """A transport to an agent in this process, through the same messages: for the suite's tests.

    ``hidden`` names modules the agent must not load from a pickle, as a graded kernel cannot
    import the reference (and the checks) of the chapter it grades.
    """

    def __init__(self, hidden: frozenset[str] = frozenset()):
        self.agent = agent.Agent({}, unpickle=lambda data: _Unpickler(io.BytesIO(data), hidden).load())
        self.session = Session(self)
        self.agent.grader = self.session.lender.answer

    def __call__(self, request: str) -> str:
        return self.agent.handle(request)

    def expose(self, name: str, value) -> Remote:
        """``value`` as the learner's global ``name``, reached through the wire."""
        self.agent.namespace[name] = value
        return self.session.lookup(name)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, hidden: frozenset[str]):
        super().__init__(file)
        self.hidden = hidden

    def find_class(self, module: str, name: str):
        if module in self.hidden:
            raise ImportError(f"{module} is not available in the graded kernel (it would give the answer away)")
        return super().find_class(module, name)
