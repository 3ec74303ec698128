"""The grading kernel: ipykernel inside bubblewrap, with limits the learner's code cannot lift.

nbgrader starts kernels by kernel-spec name; the worker points the name ``python3`` at this module,
which joins the submission's cgroup (``cgroups``: memory and processes of everything the kernel starts,
capped together), sets the per-process limits (file size, no core dumps) and becomes ``bwrap`` running
ipykernel:

- a user namespace with an unprivileged uid and no capabilities; its own PID namespace, so that every
  process the learner starts dies with the kernel (``--die-with-parent``), and the kernel with the
  grading worker that started it; no network but its own loopback; a new session (no terminal to
  write into);
- read-only: the system's ``/usr``, the Python installation and the course's environment; of the course
  package only what the kernel needs (``kernel_view``: the agent, what runs beside the learner's code, the
  earlier chapters' reference); a module that says why stands in for every other, the graded chapter's
  reference and every check among them, and compiled copies are hidden;
- writable: only private tmpfs of limited size: home and working folder, ``/dev/shm``, and the folder of
  the kernel's sockets. Nothing the kernel writes reaches the host's disk. The connection file is bound
  read-only; the grader reaches the sockets through ``/proc/<pid>/root`` of the sandbox's first process,
  which bubblewrap reports on ``--info-fd`` (``kernels`` links the host's side of the folder there).

No course folder, ``solutions/``, gradebook or other submission is mounted: they do not exist in there.
``--no-sandbox`` (trusted work only) skips bubblewrap and keeps the limits. Without a cgroup (none can be
made here) memory is bounded per process (``RLIMIT_AS``) instead, a weaker bound the report states.
"""

import argparse
import ctypes
import glob
import os
import resource
import shutil
import signal
import sys
from pathlib import Path

import autograde_tests
from autograde_tests.grading import bubblewrap, cgroups, limits
from autograde_tests.grading.kernel_view import hiding_arguments

NOBODY = 65534
PR_SET_PDEATHSIG = 1


def connection_file(exchange: Path) -> Path:
    """The kernel's connection file, in the grader's ``exchange`` folder (bound read-only into the sandbox)."""
    return exchange / "kernel.json"


def sockets(exchange: Path) -> Path:
    """The folder of the kernel's sockets: a tmpfs in the sandbox, a link to it on the grader's side."""
    return exchange / "sockets"


def sandbox_info(exchange: Path) -> Path:
    """The FIFO on which bubblewrap tells the grader the sandbox's first process (its ``child-pid``)."""
    return exchange / "sandbox-info"


def gpu_devices() -> list[str]:
    """This machine's NVIDIA device files (the GPUs, their control device, unified memory), which ``--gpu``
    binds into the sandbox: the driver's library is under /usr, which every sandbox reads."""
    return sorted(glob.glob("/dev/nvidia*"))


def bwrap_arguments(chapter: str, exchange: Path, gpu: bool = False) -> list[str]:
    """bubblewrap's arguments for a kernel graded on ``chapter`` that talks through ``exchange`` (``gpu``: with
    the machine's NVIDIA devices)."""
    package = Path(autograde_tests.__file__).resolve().parent
    prefixes = sorted({str(Path(p).resolve()) for p in (sys.base_prefix, sys.prefix)})
    arguments = [
        "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
        "--uid", str(NOBODY), "--gid", str(NOBODY),
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
        "--proc", "/proc", "--dev", "/dev", "--size", str(limits.SHM_BYTES), "--tmpfs", "/dev/shm",
        "--size", str(limits.TMP_BYTES), "--tmpfs", "/tmp",
    ]
    for device in gpu_devices() if gpu else []:
        arguments += ["--dev-bind", device, device]
    for prefix in prefixes:
        arguments += ["--ro-bind", prefix, prefix]
    arguments += ["--ro-bind", str(package), str(package)]
    arguments += hiding_arguments(chapter)  # of the package, only what the kernel needs (``kernel_view``)
    arguments += ["--ro-bind", str(connection_file(exchange)), str(connection_file(exchange)),
                  "--size", str(limits.SOCKETS_BYTES), "--tmpfs", str(sockets(exchange)),
                  "--chdir", "/tmp", "--clearenv"]
    for key, value in _environment("/tmp").items():
        arguments += ["--setenv", key, value]
    return arguments


def _environment(home: str) -> dict[str, str]:
    return {
        "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin",
        # The kernel imports the course package the grader imported (the one mounted), whichever clone
        # the environment's editable install points at.
        "PYTHONPATH": str(Path(autograde_tests.__file__).resolve().parent.parent),
        "HOME": home,
        "IPYTHONDIR": os.path.join(home, ".ipython"),
        "MPLCONFIGDIR": home,
        "MPLBACKEND": "Agg",
        # One thread each: kernels of a parallel batch share the machine's cores.
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        # As nbgrader's own autograde kernels have it: a notebook's ungraded cell that checks it (an explore
        # cell that trains) behaves under this grader as under nbgrader.
        "NBGRADER_EXECUTION": "autograde",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chapter", required=True)
    parser.add_argument("--exchange", type=Path, required=True, help="folder of the connection file and sockets")
    parser.add_argument("--memory-bytes", type=int, required=True, help="per process, where no --cgroup bounds it")
    parser.add_argument("--cgroup", type=Path, action="append", default=[],
                        help="a folder of the submission's cgroup to join (repeated: one per hierarchy)")
    parser.add_argument("--no-sandbox", action="store_true")
    parser.add_argument("--gpu", action="store_true", help="the machine's NVIDIA devices in the sandbox")
    parser.add_argument("-f", dest="connection_file", required=True)
    args, kernel_args = parser.parse_known_args()  # the rest (nbgrader's options) goes to ipykernel

    connection = connection_file(args.exchange)
    shutil.copyfile(args.connection_file, connection)
    # Everything this process becomes and starts is in the submission's cgroup, counted and capped together.
    cgroups.join(args.cgroup, os.getpid())
    if not args.cgroup:
        resource.setrlimit(resource.RLIMIT_AS, (args.memory_bytes, args.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.FILE_BYTES, limits.FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # torch and the agent load as the kernel starts, ahead of the submission it will grade; nothing is
    # bound in the learner's namespace.
    preload = "--IPKernelApp.exec_lines=__import__('torch'), __import__('autograde_tests.remote.agent')"
    kernel = [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection), preload, *kernel_args]
    # If the grading worker dies (killed, or its machine's Dask worker stopped), what this process becomes
    # dies with it: bubblewrap, whose sandbox goes with it (--die-with-parent), or the unsandboxed kernel.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if args.no_sandbox:
        os.chdir(args.exchange)
        os.execve(sys.executable, kernel, _environment(str(args.exchange)))
    bwrap = bubblewrap.path()
    info = _report_to_grader(args.exchange)
    os.execv(bwrap, [bwrap, "--info-fd", str(info), *bwrap_arguments(args.chapter, args.exchange, args.gpu), *kernel])


def _report_to_grader(exchange: Path) -> int:
    """The write end of the grader's FIFO, left open for bubblewrap's ``--info-fd`` (it closes it once written)."""
    info = os.open(sandbox_info(exchange), os.O_WRONLY)
    os.set_inheritable(info, True)
    return info


if __name__ == "__main__":
    main()
