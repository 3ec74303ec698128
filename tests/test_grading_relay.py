"""A kernel's relays end with the grader: when the process that started them goes without a word (a
grading worker killed, a batch's workers closed), each sees its stdin close and ends, never spinning."""

import subprocess
import sys

import psutil
import zmq

from autograde_tests.grading import relay


def test_a_relay_ends_when_the_grader_s_side_of_its_stdin_closes(tmp_path):
    kernel = zmq.Context().socket(zmq.ROUTER)
    kernel.bind(relay.url(str(tmp_path / "kernel"), 1))
    started = subprocess.Popen([sys.executable, "-m", "autograde_tests.grading.relay", "shell",
                                relay.url(str(tmp_path / "kernel"), 1), relay.url(str(tmp_path / "relay"), 1),
                                "--message-bytes", str(2**20), "--identity", "test"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert started.stdout.readline() == b"listening\n"
        started.stdin.close()
        assert started.wait(timeout=60) == 0
    except subprocess.TimeoutExpired:
        cpu = psutil.Process(started.pid).cpu_times()
        raise AssertionError("the relay outlived its stdin, spinning "
                             f"({cpu.user + cpu.system:.1f} s of CPU in 60 s)") from None
    finally:
        started.kill()
        kernel.close(linger=0)
