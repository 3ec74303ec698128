"""The coordinator's side of the grading workers: where they are, what a task runs there, and the faults
that are the grader's own, which stop a batch instead of becoming anyone's score.

A fault in grading one submission is that submission's outcome: ``worker.grade`` says why it needs
attention, and a submission whose grading kills every worker that takes it, even run alone, is given up
by Dask. A fault of the grader's is no submission's: a worker that cannot import the course's grader or
has another version of it, a task that raised, a scheduler lost, no worker left. Each stops the batch
(``Stopped``) with one line saying what and where; what was merged before it stays, and a rerun grades
the rest.
"""

import contextlib
import functools
import hashlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError
from pathlib import Path

from distributed import Client, KilledWorker, LocalCluster, wait

import autograde_tests

from .outcome import Cause, attention

WATCH_SECONDS = 5.0  # while no result comes, how often the coordinator looks for connected workers


class Stopped(Exception):
    """The grader's own fault: the batch stops; the message says what and where, in one line."""


@functools.cache
def package_digest() -> str:
    """The course package's sources as this process first read them: a worker must grade with the
    coordinator's, since the checks and the grader's rules are in it."""
    folder = Path(autograde_tests.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def task():
    """The function a task runs on its worker: ``(job as a dict, the coordinator's package_digest(), or
    None where the workers are the coordinator's own processes, which import what it imported)``.

    It travels by value (Dask pickles a nested function whole), and so does the job: a function or a
    class sent by reference is imported as the worker reads the message, before any code of ours runs,
    and a worker without the course package then drops its connection without a word to the coordinator.
    This way the worker says why, as the task's error.
    """
    def grade_there(job: dict, digest: str | None) -> dict:
        from distributed import get_worker

        here = get_worker()
        where = f"the grading worker {here.name} at {here.address}" if here.name != here.address else \
            f"the grading worker at {here.address}"
        try:
            import autograde_tests
            from autograde_tests.grading import worker
        except ImportError as exc:
            raise RuntimeError(f"{where} cannot import the course's grader ({exc}): "
                               "install the course's environment there") from None
        try:
            from autograde_tests.grading.cluster import package_digest
            same = digest is None or package_digest() == digest
        except ImportError:  # a version older than this check
            same = False
        if not same:
            raise RuntimeError(f"{where} has another version of the course package than this coordinator "
                               f"({autograde_tests.__path__[0]}): update it there and restart the worker")
        try:
            return worker.grade(worker.Job(**job))
        except Exception as exc:  # worker.grade turns every fault of the submission's into its outcome
            raise RuntimeError(f"{where} failed grading {job['student']}/{job['chapter']}: "
                               f"{type(exc).__name__}: {exc}") from None
    return grade_there


@contextlib.contextmanager
def workers(scheduler: str | None, jobs: int) -> Iterator[Client]:
    """A Dask client: of the ``scheduler`` at that address, or of a local cluster of ``jobs`` processes."""
    if scheduler:
        # The batch says in one line when it loses the scheduler; the client would log its reconnection's
        # traceback as well.
        logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
        try:
            client = Client(scheduler)
        except (OSError, TimeoutError) as exc:
            raise Stopped(f"cannot reach the Dask scheduler at {scheduler} ({exc})") from None
        with client:
            yield client
        return
    # nbgrader runs `alembic` and the kernels from the course environment's bin/.
    env = {"PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    # Its workers share this terminal: the batch words their faults itself, so Dask's warnings (a failed
    # task's traceback among them) stay out of it.
    with (LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, host="127.0.0.1",
                       dashboard_address=":0", env=env, silence_logs=logging.ERROR) as cluster,
          Client(cluster) as client):
        yield client


def finished(client: Client, futures, patience: float, again: Callable) -> Iterator[tuple]:
    """Each of ``futures`` with its result, as it finishes. ``Stopped`` on the grader's fault, and when no
    worker has been connected for ``patience`` seconds (a cluster that scales from none gets that long).

    Dask counts a worker's death against every task the worker held, the ones waiting behind the one it
    ran too, and gives up on a task after a few: a submission queued behind one that kills its workers can
    be given up with it. So a task Dask gave up on is run again, alone (``again(future)`` submits its job
    anew), once the others are done; only what it does then is its own."""
    given_up = []
    for future in _each_done(client, futures, patience):
        if future.status == "error" and isinstance(future.exception(), KilledWorker):
            given_up.append(future)
        else:
            yield future, _result(client, future)
    for future in given_up:
        for alone in _each_done(client, [again(future)], patience):
            yield future, _result(client, alone)


def _each_done(client: Client, futures, patience: float) -> Iterator:
    pending, alone_since = set(futures), None
    while pending:
        try:
            done, pending = wait(pending, timeout=min(WATCH_SECONDS, patience), return_when="FIRST_COMPLETED")
        except TimeoutError:
            alone_since = _alone_since(client, alone_since, patience)
            continue
        except CancelledError as exc:
            raise Stopped(_cancelled(client, exc)) from None
        alone_since = None
        yield from done


def _alone_since(client: Client, since: float | None, patience: float) -> float | None:
    """Since when no worker has been connected (None: one is); ``Stopped`` once that is ``patience`` ago."""
    try:
        connected = client.nthreads()
    except (OSError, TimeoutError):
        raise Stopped(f"lost {_scheduler(client)}") from None
    if connected:
        return None
    now = time.monotonic()
    since = now if since is None else since
    if now - since >= patience:
        raise Stopped(f"no grading worker has been connected to {_scheduler(client)} for {patience:g} s")
    return since


def _result(client: Client, future) -> dict:
    """A task's result; one whose grading killed its workers (Dask gave up on it) needs attention."""
    try:
        return future.result()
    except KilledWorker as exc:
        return attention(Cause.KILLED_WORKERS,
                         f"grading it killed the grading worker {exc.allowed_failures + 1} times (Dask gave up on it)")
    except CancelledError as exc:
        raise Stopped(_cancelled(client, exc)) from None
    except Exception as exc:  # task() words its own; anything else is named by its type
        raise Stopped(one_line(str(exc) if type(exc) is RuntimeError else f"{type(exc).__name__}: {exc}")) from None


def _cancelled(client: Client, exc: CancelledError) -> str:
    """Why Dask cancelled the batch's tasks: the scheduler lost, mostly."""
    groups = getattr(exc, "error_groups", [])  # wait()'s, for several futures; a future's own has one reason
    reasons = {group.reason for group in groups} or {getattr(exc, "reason", "")}
    if "scheduler-connection-lost" in reasons:
        return f"lost {_scheduler(client)}"
    return (f"{_scheduler(client)} cancelled the grading "
            f"({', '.join(sorted(r for r in reasons if r)) or 'no reason given'})")


def _scheduler(client: Client) -> str:
    if isinstance(client.cluster, LocalCluster):
        return "this machine's Dask cluster"
    return f"the Dask scheduler at {client.scheduler.address}"


def one_line(text: str) -> str:
    return " ".join(text.split())
