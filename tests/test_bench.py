"""`make bench` keeps working: its smoke run (tiny sizes, one run) writes every figure's table."""

import subprocess
import sys


def test_bench_smoke_run_writes_every_figure(tmp_path):
    out = tmp_path / "benchmarks.md"
    run = subprocess.run([sys.executable, "-m", "autograde_tests.bench", "--smoke", "--out", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    text = out.read_text()
    for figure in ("1. Autograding", "2. Class grading", "3. The reference against PyTorch", "4. Training"):
        assert f"## {figure}" in text
    assert "the floor" in text and "students/min" in text and "×" in text and "CPU:" in text


def test_bench_refuses_fewer_than_three_repeats():
    run = subprocess.run([sys.executable, "-m", "autograde_tests.bench", "--repeats", "2"], capture_output=True, text=True)
    assert run.returncode == 2 and "at least 3" in run.stderr
