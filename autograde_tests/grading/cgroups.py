"""A submission's share of the machine: every process its kernel starts in one cgroup, capped as a whole.

Resource limits (``setrlimit``) bound each process on its own: a kernel that starts six children gets six
times its memory, and as many processes as it likes. A cgroup bounds them together. The grading worker
makes one per kernel, below its own cgroup (read from ``/proc/self/cgroup``; it never creates one anywhere
else), with a cap on memory (tmpfs pages written in the sandbox count too) and on processes (threads
count as processes); the kernel's launcher joins it before it becomes bubblewrap, so everything the
kernel starts is in it. The counters are read from outside, after the kernel has ended: peak memory,
peak processes, how many processes the OOM killer ended and how many forks were refused. Then the
cgroup's last processes are killed and it is removed.

Both cgroup versions work: v1 (separate ``memory`` and ``pids`` hierarchies) and v2 (the unified one, where
the grader's cgroup must be able to give its children both controllers: cgroup v2 lets a cgroup enable
controllers for its children only while it holds no process itself, the root excepted). Where neither
can be used, ``bounds()`` says why, and the kernel falls back to per-process limits.
"""

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from . import limits


class Unavailable(Exception):
    """No cgroup can bound a submission here; the message says why, in one line."""


@dataclass(frozen=True)
class Usage:
    """What the OS counted for one submission's cgroup."""

    peak_memory_bytes: int
    peak_processes: int | None  # None where the kernel keeps no peak (cgroup v1 before Linux 6.1)
    oom_kills: int
    refused_forks: int

    def as_dict(self) -> dict:
        return {"peak_memory_bytes": self.peak_memory_bytes, "peak_processes": self.peak_processes,
                "oom_kills": self.oom_kills, "refused_forks": self.refused_forks}


class Cgroup:
    """One submission's cgroup (a folder per hierarchy: two in v1, one in v2)."""

    def __init__(self, folders: list[Path], version: int):
        self.folders, self.version = folders, version

    def usage(self) -> Usage:
        if self.version == 2:
            (folder,) = self.folders
            return Usage(_number(folder / "memory.peak"), _number(folder / "pids.peak"),
                         _keyed(folder / "memory.events").get("oom_kill", 0),
                         _keyed(folder / "pids.events").get("max", 0))
        memory, pids = self.folders
        peak = pids / "pids.peak"
        return Usage(_number(memory / "memory.max_usage_in_bytes"), _number(peak) if peak.exists() else None,
                     _keyed(memory / "memory.oom_control").get("oom_kill", 0),
                     _keyed(pids / "pids.events").get("max", 0))

    def remove(self) -> None:
        """Kill whatever still runs in it, then remove it. A folder that stays busy is left to the next
        worker here, which removes the cgroups of workers that are gone (``Hierarchy.remove_stale``)."""
        for folder in self.folders:  # no fork can outrun the killing
            _write(folder / "pids.max", "0", optional=True)
        for folder in self.folders:
            for _ in range(500):
                if _empty_and_removed(folder):
                    break
                time.sleep(0.01)  # a killed process leaves its cgroup as it finishes exiting


def _empty_and_removed(folder: Path) -> bool:
    try:
        pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return True
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        folder.rmdir()
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return False
        raise
    return True


class Hierarchy:
    """Where this process may make cgroups for its kernels: below its own, in v1 or v2."""

    def __init__(self, parents: list[Path], version: int):
        self.parents, self.version = parents, version

    def create(self, name: str, memory_bytes: int, processes: int = limits.PROCESSES) -> Cgroup:
        folders = [parent / name for parent in self.parents]
        for folder in folders:
            folder.mkdir()
        cgroup = Cgroup(folders, self.version)
        if self.version == 2:
            (folder,) = folders
            _write(folder / "memory.max", str(memory_bytes))
            _write(folder / "memory.swap.max", str(limits.SWAP_BYTES), optional=True)
            _write(folder / "pids.max", str(processes))
        else:
            memory, pids = folders
            _write(memory / "memory.limit_in_bytes", str(memory_bytes))
            # Memory and swap together, so swap adds ``limits.SWAP_BYTES``; no swap there means no such file.
            _write(memory / "memory.memsw.limit_in_bytes", str(memory_bytes + limits.SWAP_BYTES), optional=True)
            _write(pids / "pids.max", str(processes))
        return cgroup

    def remove_stale(self) -> None:
        """Remove the cgroups (and their processes) of grading workers that died before they could."""
        for parent in self.parents:
            for folder in parent.glob("grading-*-*"):
                if not _alive(int(folder.name.split("-")[1])):
                    Cgroup([folder], self.version).remove()

    def describe(self, memory_bytes: int, processes: int = limits.PROCESSES) -> str:
        return (f"each submission is bounded as a whole by cgroup v{self.version}: "
                f"{size(memory_bytes)} of memory and {processes} processes in all")


def size(count: int) -> str:
    """Bytes as people read them: GiB, or MiB below one GiB."""
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def bounds(cgroup_file: Path = Path("/proc/self/cgroup"), mountinfo: Path = Path("/proc/self/mountinfo")) -> Hierarchy:
    """The hierarchy this process can bound its kernels in, or ``Unavailable`` saying why not."""
    own = _own_cgroups(cgroup_file.read_text())
    mounts = _cgroup_mounts(mountinfo.read_text())
    reasons = []
    v1 = [_below(mounts.get(c), own.get(c)) for c in ("memory", "pids")]
    if all(v1):
        if all(os.access(p, os.W_OK) for p in v1):
            return Hierarchy(v1, 1)
        reasons.append(f"cgroup v1: cannot write to {v1[0]} or {v1[1]}")
    unified = _below(mounts.get(""), own.get(""))
    if unified is not None:
        try:
            return Hierarchy([_delegating(unified)], 2)
        except Unavailable as exc:
            reasons.append(str(exc))
    if not reasons:
        reasons.append("no cgroup hierarchy with the memory and pids controllers is mounted")
    raise Unavailable("; ".join(reasons))


def _own_cgroups(text: str) -> dict[str, str]:
    """This process's cgroup in each hierarchy, by controller (``""``: the unified one)."""
    own = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def _cgroup_mounts(text: str) -> dict[str, tuple[str, Path]]:
    """For each controller (``""``: the unified hierarchy), the cgroup its mount shows and where it is mounted."""
    mounts = {}
    for line in text.splitlines():
        fields = line.split()
        separator = fields.index("-")
        kind, options = fields[separator + 1], fields[separator + 3].split(",")
        root, point = fields[3], Path(fields[4])
        if kind == "cgroup2":
            mounts.setdefault("", (root, point))
        elif kind == "cgroup":
            for controller in ("memory", "pids"):
                if controller in options:
                    mounts.setdefault(controller, (root, point))
    return mounts


def _below(mount: tuple[str, Path] | None, own: str | None) -> Path | None:
    """The folder of this process's own cgroup, where the mount shows it."""
    if mount is None or own is None:
        return None
    root, point = mount
    relative = os.path.relpath(own, root)
    if relative.startswith(".."):
        return None  # this process's cgroup is outside what is mounted here
    folder = (point / relative).resolve()
    return folder if folder.is_dir() else None


def _delegating(folder: Path) -> Path:
    """``folder`` (v2) once it gives its children memory and pids controllers, or ``Unavailable``."""
    available = (folder / "cgroup.controllers").read_text().split()
    missing = [c for c in ("memory", "pids") if c not in available]
    if missing:
        raise Unavailable(f"cgroup v2: {folder} has no {' or '.join(missing)} controller")
    if {"memory", "pids"} <= set((folder / "cgroup.subtree_control").read_text().split()):
        return folder
    try:
        _write(folder / "cgroup.subtree_control", "+memory +pids")
    except OSError as exc:
        raise Unavailable(f"cgroup v2: {folder} cannot give its children the memory and pids controllers "
                          f"({os.strerror(exc.errno)}: it holds processes of its own); start the grader in a "
                          "cgroup of its own that delegates them") from None
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def join(folders: list[Path], pid: int) -> None:
    """Put process ``pid`` into each of a cgroup's folders (its children follow it)."""
    for folder in folders:
        _write(folder / "cgroup.procs", str(pid))


def _write(path: Path, text: str, optional: bool = False) -> None:
    if optional and not path.exists():
        return
    with open(path, "w") as file:
        file.write(text)


def _number(path: Path) -> int:
    return int(path.read_text().split()[0])


def _keyed(path: Path) -> dict[str, int]:
    """A cgroup file of ``key value`` lines."""
    pairs = (line.split() for line in path.read_text().splitlines())
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}
