"""Sandboxed kernels for one grading worker: each started ahead of need, used for one submission, then killed.

A kernel boots in its own process (bubblewrap, then ipykernel importing torch and the agent), so
starting the next one as a submission begins hides its start-up behind that submission's grading. A kernel is chapter-specific (it lacks that
chapter's reference), and it is never reused: the learner's code may have changed anything in it.
"""

import ctypes
import json
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync


PR_SET_CHILD_SUBREAPER = 36


class WarmKernels:
    """``ahead`` kernels waiting for the current chapter; ``take`` hands one out and starts its successor."""

    def __init__(self, folder: Path, memory_bytes: int, sandbox: bool, ahead: int = 1):
        # A killed kernel's sandbox outlives it for a moment as an orphan; adopted by this process, it is
        # reaped at once instead of whenever the machine's init gets to it.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.folder, self.memory_bytes, self.sandbox, self.ahead = folder, memory_bytes, sandbox, ahead
        self.specs = Path(tempfile.mkdtemp(prefix="kernelspecs-", dir=folder))
        self.chapter: str | None = None
        self.waiting: list[AsyncKernelManager] = []
        # Kernels are launched from one thread that lives as long as this process: a kernel dies with the
        # thread that launched it (the launcher's parent-death signal), which must not be a passing one.
        self.launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernel-launcher")

    def take(self, chapter: str) -> AsyncKernelManager:
        """A started kernel for ``chapter``, the one that has waited longest; the next ones start now."""
        if chapter != self.chapter:  # the batch moved on to another chapter
            self._drop()
            self.chapter = chapter
        kernel = self.waiting.pop(0) if self.waiting else self._start(chapter)
        while len(self.waiting) < self.ahead:
            self.waiting.append(self._start(chapter))
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
        # Its connection file and sockets live in a folder of their own, the one the sandbox shares; a
        # short path, since a socket's path has at most 107 bytes.
        exchange = Path(tempfile.mkdtemp(prefix="k", dir=self.folder))
        specs = KernelSpecManager(kernel_dirs=[str(self.specs)])
        kernel = AsyncKernelManager(kernel_name=self._spec(chapter, exchange), kernel_spec_manager=specs,
                                    transport="ipc", ip=str(exchange / "kernel"))
        kernel.exchange = exchange
        run_sync(kernel.start_kernel)(extra_arguments=["--HistoryManager.hist_file=:memory:"])
        return kernel

    def _spec(self, chapter: str, exchange: Path) -> str:
        """A kernel spec of this worker's: the sandbox launcher, for ``chapter``, talking through ``exchange``."""
        argv = [sys.executable, "-m", "autograde_tests.grading.sandbox_kernel", "--chapter", chapter,
                "--exchange", str(exchange), "--memory-bytes", str(self.memory_bytes), "-f", "{connection_file}"]
        if not self.sandbox:
            argv.insert(-2, "--no-sandbox")
        folder = self.specs / exchange.name
        folder.mkdir()
        # Interrupts travel as messages: a signal to bubblewrap would not reach the kernel inside.
        spec = {"argv": argv, "display_name": "grading sandbox", "language": "python", "interrupt_mode": "message"}
        (folder / "kernel.json").write_text(json.dumps(spec))
        return exchange.name


def kill(kernel: AsyncKernelManager) -> None:
    """End the kernel (``terminate``) and remove its connection files and folders."""
    terminate(kernel)
    if not getattr(kernel, "cleaned", False):
        kernel.cleaned = True
        run_sync(kernel.cleanup_resources)(restart=False)
        shutil.rmtree(kernel.exchange, ignore_errors=True)
        shutil.rmtree(Path(kernel.kernel_spec_manager.kernel_dirs[0]) / kernel.exchange.name, ignore_errors=True)


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
