"""The grading kernel: ipykernel, started inside limits that the learner's code cannot lift.

nbgrader starts kernels by kernel-spec name; the worker points the name ``python3`` at this module.
Before it becomes an ipykernel (by exec, so no Python of ours stays around it) it:

- caps address space (memory), the size of any file written, and core dumps;
- moves into an empty working folder of its own, so nothing submitted beside the notebook and
  nothing of the course is on its path or in reach by relative path;
- when started as root, drops to an unprivileged user (``--user``), who cannot read a course folder
  of mode 700 or write the gradebook;
- caps what the kernel prints, so an output flood cannot exhaust the grader.
"""

import argparse
import os
import pwd
import resource
import shutil
import sys

FILE_BYTES = 64 * 2**20  # the largest file the kernel may write (caches included)
OUTPUT_NOTE = "\n[output truncated by the grader]\n"


def cap_output(limit: int) -> None:
    """Replace stdout and stderr with writers that stop after ``limit`` characters in all."""
    remaining = [limit]

    class Capped:
        def __init__(self, stream):
            self._stream = stream

        def write(self, text):
            if remaining[0] <= 0:
                return len(text)
            kept = text[: remaining[0]]
            remaining[0] -= len(text)
            self._stream.write(kept if remaining[0] > 0 else kept + OUTPUT_NOTE)
            return len(text)

        def __getattr__(self, name):
            return getattr(self._stream, name)

    sys.stdout, sys.stderr = Capped(sys.stdout), Capped(sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--memory-bytes", type=int, required=True)
    parser.add_argument("--output-chars", type=int, required=True)
    parser.add_argument("--user")
    parser.add_argument("-f", dest="connection_file", required=True)
    args, kernel_args = parser.parse_known_args()  # the rest (nbgrader's options) goes to ipykernel

    os.makedirs(args.workdir, exist_ok=True)
    connection = os.path.join(args.workdir, "kernel.json")
    shutil.copyfile(args.connection_file, connection)
    if args.user and os.geteuid() == 0:
        user = pwd.getpwnam(args.user)
        for path in (args.workdir, connection):
            os.chown(path, user.pw_uid, user.pw_gid)
        os.chmod(args.workdir, 0o700)
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    os.chdir(args.workdir)

    memory = args.memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    env = {
        "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin",
        "HOME": args.workdir,
        "IPYTHONDIR": os.path.join(args.workdir, ".ipython"),
        "MPLCONFIGDIR": args.workdir,
        "MPLBACKEND": "Agg",
        # One thread each: kernels of a parallel batch share the machine's cores.
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONNOUSERSITE": "1",
    }
    startup = f"from autograde_tests.grading.sandbox_kernel import cap_output; cap_output({args.output_chars})"
    os.execve(
        sys.executable,
        [sys.executable, "-m", "ipykernel_launcher", "-f", connection,
         f"--IPKernelApp.exec_lines={startup}", *kernel_args],
        env,
    )


if __name__ == "__main__":
    main()
