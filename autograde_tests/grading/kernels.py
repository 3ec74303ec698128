"""Sandboxed kernels for one grading worker: each started ahead of need, used for one submission, then killed.

A kernel boots in its own process (bubblewrap, then ipykernel importing torch and the agent), so
starting the next one as a submission begins hides its start-up behind that submission's grading. A
kernel is chapter-specific (it lacks that chapter's reference), and it is never reused: the learner's
code may have changed anything in it.

Each kernel has a cgroup of its own (``cgroups``), made before it starts and removed, with whatever still
runs in it, when it is killed; its counters say what the submission used. Before a kernel is handed out,
a probe checks that it answers and has loaded the grader's own agent and course package: a kernel that
fails it is the grader's fault (``KernelFault``), never a submission's.

The grader reaches a kernel only through its relays (``relay``): the kernel manager's own control socket
and every client it makes, the probe's included, connect to the relays' sockets, in zmq contexts bounded
as the grader's client is (``relay.bounded``).
"""

import ctypes
import json
import os
import queue
import select
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync
from traitlets import default

import autograde_tests

from . import cgroups, limits, relay
from .sandbox_kernel import sandbox_info, sockets

PR_SET_CHILD_SUBREAPER = 36
AGENT = "autograde_tests.remote.agent"


class KernelFault(Exception):
    """The grader could not give a submission a working kernel: its fault, not the learner's."""


class RelayedKernelManager(AsyncKernelManager):
    """A kernel manager whose control socket and clients connect to the kernel's relays, not to the kernel."""

    relays: relay.Relays | None = None
    relays_listening = False

    @default("context")
    def _context_default(self):
        return relay.bounded(super()._context_default(), limits.FRAME_BYTES)

    @property
    def relay_prefix(self) -> str:
        return str(self.exchange / "relay")  # ``exchange`` is set before the kernel starts

    def _make_url(self, channel: str) -> str:
        return relay.url(self.relay_prefix, getattr(self, f"{channel}_port"))

    def client(self, **kwargs):
        return super().client(**{"ip": self.relay_prefix} | kwargs)

    def blocking_client(self):
        client = super().blocking_client()
        client.ip = self.relay_prefix
        relay.bounded(client.context, limits.FRAME_BYTES)
        return client

    def start_relays(self) -> None:
        ports = {channel: getattr(self, f"{channel}_port") for channel in relay.CHANNELS}
        self.relays = relay.Relays(self.ip, self.relay_prefix, ports, limits.FRAME_BYTES)
        self.relays_listening = self.relays.renew()  # the probe refuses a kernel whose relays did not start


class WarmKernels:
    """``ahead`` kernels waiting for the current chapter; ``take`` hands one out and starts its successor."""

    def __init__(self, folder: Path, memory_bytes: int, sandbox: bool, ahead: int = 1, gpu: bool = False):
        # A killed kernel's sandbox outlives it for a moment as an orphan; adopted by this process, it is
        # reaped at once instead of whenever the machine's init gets to it.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.folder, self.memory_bytes, self.sandbox, self.ahead, self.gpu = folder, memory_bytes, sandbox, ahead, gpu
        try:
            self.hierarchy: cgroups.Hierarchy | None = cgroups.bounds()
            self.hierarchy.remove_stale()
            self.bounds = self.hierarchy.describe(memory_bytes)
        except cgroups.Unavailable as exc:
            self.hierarchy = None
            self.bounds = (f"no cgroup could bound a submission as a whole ({exc}): memory was bounded per process "
                           f"only ({cgroups.size(memory_bytes)} each, RLIMIT_AS), and the number of processes "
                           "not at all")
        self.specs = Path(tempfile.mkdtemp(prefix="kernelspecs-", dir=folder))
        self.chapter: str | None = None
        self.waiting: list[AsyncKernelManager] = []
        # Kernels are launched from one thread that lives as long as this process: a kernel dies with the
        # thread that launched it (the launcher's parent-death signal), which must not be a passing one.
        self.launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernel-launcher")

    def take(self, chapter: str, start_next: bool = True) -> AsyncKernelManager:
        """A started kernel for ``chapter``, the one that has waited longest; the next ones start now
        (``start_next``: more of the chapter will follow). ``KernelFault`` if it does not pass the probe (it is
        killed then)."""
        if chapter != self.chapter:  # the batch moved on to another chapter
            self._drop()
            self.chapter = chapter
        kernel = self.waiting.pop(0) if self.waiting else self._start(chapter)
        while start_next and len(self.waiting) < self.ahead:
            self.waiting.append(self._start(chapter))
        try:
            probe(kernel)
        except KernelFault:
            kill(kernel)
            raise
        return kernel

    def close(self) -> None:
        self._drop()
        self.launcher.shutdown()
        shutil.rmtree(self.specs, ignore_errors=True)

    def _drop(self) -> None:
        for kernel in self.waiting:
            kill(kernel)
        self.waiting.clear()

    def _start(self, chapter: str) -> AsyncKernelManager:
        return self.launcher.submit(self._launch, chapter).result()

    def _launch(self, chapter: str) -> AsyncKernelManager:
        # Its connection file and the host's side of its sockets live in a folder of the grader's (the
        # sandbox sees only the connection file, read-only); a short path, since a socket's path has at
        # most 107 bytes.
        exchange = Path(tempfile.mkdtemp(prefix="k", dir=self.folder))
        cgroup = (self.hierarchy.create(f"grading-{os.getpid()}-{exchange.name}", self.memory_bytes)
                  if self.hierarchy else None)
        specs = KernelSpecManager(kernel_dirs=[str(self.specs)])
        kernel = RelayedKernelManager(kernel_name=self._spec(chapter, exchange, cgroup), kernel_spec_manager=specs,
                                    transport="ipc", ip=str(sockets(exchange) / "kernel"))
        kernel.exchange, kernel.cgroup = exchange, cgroup
        if not self.sandbox:
            sockets(exchange).mkdir()
            run_sync(kernel.start_kernel)(extra_arguments=["--HistoryManager.hist_file=:memory:"])
            kernel.start_relays()
            return kernel
        os.mkfifo(sandbox_info(exchange), 0o600)
        info = os.open(sandbox_info(exchange), os.O_RDONLY | os.O_NONBLOCK)
        try:
            run_sync(kernel.start_kernel)(extra_arguments=["--HistoryManager.hist_file=:memory:"])
            pid = _sandbox_pid(info, kernel)
        finally:
            os.close(info)
        # The kernel binds its sockets in its own tmpfs; the grader reaches them through its root.
        if pid is not None:
            sockets(exchange).symlink_to(f"/proc/{pid}/root{sockets(exchange)}")
        kernel.start_relays()
        return kernel

    def _spec(self, chapter: str, exchange: Path, cgroup: cgroups.Cgroup | None) -> str:
        """A kernel spec of this worker's: the sandbox launcher, for ``chapter``, talking through ``exchange``."""
        argv = [sys.executable, "-m", "autograde_tests.grading.sandbox_kernel", "--chapter", chapter,
                "--exchange", str(exchange), "--memory-bytes", str(self.memory_bytes)]
        for folder in cgroup.folders if cgroup else []:
            argv += ["--cgroup", str(folder)]
        if not self.sandbox:
            argv.append("--no-sandbox")
        if self.gpu:
            argv.append("--gpu")
        argv += ["-f", "{connection_file}"]
        folder = self.specs / exchange.name
        folder.mkdir()
        # Interrupts travel as messages: a signal to bubblewrap would not reach the kernel inside. The
        # launcher imports the course package this process imported, whichever clone it was run from.
        spec = {"argv": argv, "display_name": "grading sandbox", "language": "python", "interrupt_mode": "message",
                "env": {"PYTHONPATH": str(Path(autograde_tests.__file__).resolve().parent.parent)}}
        (folder / "kernel.json").write_text(json.dumps(spec))
        return exchange.name


def _sandbox_pid(info: int, kernel: AsyncKernelManager) -> int | None:
    """The sandbox's first process, as bubblewrap writes it on the FIFO ``info``; None if the launcher
    ended without (the probe then reports that the kernel did not start)."""
    process = kernel.provisioner.process
    data = b""
    while True:
        readable, _, _ = select.select([info], [], [], 0.5)
        if not readable:
            if process.poll() is not None:  # the launcher ended before it could hand the FIFO to bubblewrap
                return None
            continue
        chunk = os.read(info, 65536)
        if not chunk:  # bubblewrap wrote what it had and closed it (nothing: it failed before the sandbox)
            return json.loads(data)["child-pid"] if data else None
        data += chunk


def probe(kernel: AsyncKernelManager) -> None:
    """Check, before the learner's first cell, that the kernel answers and loaded the grader's own agent
    from the grader's own course package; ``KernelFault`` saying what is wrong if not."""
    if not kernel.relays_listening:
        raise KernelFault("the grader's relays to the kernel could not start")
    expected = repr(str(Path(autograde_tests.__file__).resolve()))
    client = kernel.blocking_client()
    client.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
    try:
        _ask(kernel, client, "kernel_info_reply", client.kernel_info())
        reply = _ask(kernel, client, "execute_reply", client.execute(
            "", silent=True, store_history=False, user_expressions={"package": f"__import__({AGENT!r}).__file__"}))
    finally:
        client.stop_channels()
        client.context.destroy(linger=0)
    answer = reply["content"].get("user_expressions", {}).get("package", {})
    if answer.get("status") != "ok":
        raise KernelFault("the kernel could not import the grader's agent "
                          f"({answer.get('ename')}: {answer.get('evalue')})")
    found = answer["data"]["text/plain"]
    if found != expected:
        raise KernelFault(f"the kernel imported the course package from {found}, not the grader's {expected}")


def _ask(kernel: AsyncKernelManager, client, kind: str, asked: str) -> dict:
    """The kernel's ``kind`` reply to the request ``asked``; ``KernelFault`` if its process ends or
    ``limits.KERNEL_START_SECONDS`` pass first."""
    deadline = time.monotonic() + limits.KERNEL_START_SECONDS
    while time.monotonic() < deadline:
        if kernel.provisioner.process.poll() is not None:
            raise KernelFault(_not_started(kernel))
        try:
            reply = client.get_shell_msg(timeout=1)
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") == asked and reply["msg_type"] == kind:
            return reply
    raise KernelFault(_not_started(kernel))


def _not_started(kernel: AsyncKernelManager) -> str:
    process = kernel.provisioner.process if kernel.provisioner else None
    status = process.poll() if process is not None else None
    if status is not None:
        return f"the sandboxed kernel did not start (its launcher exited with status {status})"
    return f"the sandboxed kernel did not answer within {limits.KERNEL_START_SECONDS} s"


def kill(kernel: AsyncKernelManager) -> cgroups.Usage | None:
    """End the kernel (``terminate``), then everything left in its cgroup, and remove its connection files,
    folders and cgroup. What the cgroup counted (None without one, or on a second call)."""
    terminate(kernel)
    if getattr(kernel, "cleaned", False):
        return None
    kernel.cleaned = True
    if kernel.relays is not None:
        kernel.relays.close()
    usage = None
    if kernel.cgroup is not None:
        usage = kernel.cgroup.usage()
        kernel.cgroup.remove()
    run_sync(kernel.cleanup_resources)(restart=False)
    shutil.rmtree(kernel.exchange, ignore_errors=True)
    shutil.rmtree(Path(kernel.kernel_spec_manager.kernel_dirs[0]) / kernel.exchange.name, ignore_errors=True)
    return usage


def terminate(kernel: AsyncKernelManager) -> None:
    """SIGKILL the kernel's process and everything below it, and wait until they are gone (whatever
    signals they ignore; bubblewrap's PID namespace takes the rest with it)."""
    process = getattr(kernel.provisioner, "process", None) if kernel.provisioner else None
    if process is not None:
        try:
            victims = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            victims = []
        for victim in victims:
            try:
                victim.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(victims, timeout=10)
