"""`make bench` keeps working: its smoke run (tiny sizes, one run) writes every figure's table."""

import json
import subprocess
import sys

import pytest

from autograde_tests.authoring.bench import kept_sections, pytest_summary

pytestmark = pytest.mark.slow


def test_bench_smoke_run_writes_every_figure(tmp_path):
    out = tmp_path / "benchmarks.md"
    run = subprocess.run([sys.executable, "-m", "autograde_tests.authoring.bench", "--smoke", "--out", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    text = out.read_text()
    for figure in ("1. Autograding", "2. Class grading", "3. The reference against PyTorch", "4. Training",
                   "5. Building and testing", "6. Generating with and without the KV cache",
                   "7. Attention at scale", "8. The times the notebooks promise",
                   "9. The similarity report against the size of the class",
                   "10. Byte-level BPE: the reference against tiktoken and tokenizers"):
        assert f"## {figure}" in text
    assert "the floor" in text and "students/min" in text and "×" in text and "CPU:" in text
    assert "tiled, blocks of 32, T=128" in text and "MiB" in text
    assert "check that your Transformer can learn, all " in text and "(promised)" in text
    assert "the similarity report of 06_decoder_only (8 exercises), a class of 4" in text
    assert "`train_bpe`, the text's first 20,000 characters (20,000 bytes), vocabulary of 300" in text


def test_the_bpe_figure_alone_is_written_after_the_figures_numbered_below_ten(tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text(OLD_PAGE)
    run = subprocess.run([sys.executable, "-m", "autograde_tests.authoring.bench", "--smoke", "--figures", "10",
                          "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert list(kept_sections(out)) == ["1", "3", "10"]  # in the order of their numbers, not of their names
    rows = "\n".join(kept_sections(out)["10"])
    assert "tiktoken's `encode`, the same merges" in rows and "`tokenizers`' `BpeTrainer`" in rows
    assert "tiktoken's `_educational.bpe_train`" in rows and "the first 5,000 characters" in rows


def test_attention_at_scale_figure_alone_writes_its_table_and_the_chapter_s_data(tmp_path):
    out = tmp_path / "benchmarks.md"
    run = subprocess.run([sys.executable, "-m", "autograde_tests.authoring.bench", "--smoke", "--figures", "7",
                          "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert list(kept_sections(out)) == ["7"]
    data = json.loads((tmp_path / "_static" / "07_attention_at_scale" / "scale.json").read_text())
    kinds = {(r["kind"], r["T"]) for r in data["runs"]}
    assert ("naive (chapter 1)", 128) in kinds and ("tiled, blocks of 32", 64) in kinds
    peak = {(r["kind"], r["T"]): r["peak_bytes"] for r in data["runs"]}
    # the naive weights are (h, T, T) float32: 4× the bytes per doubling of T; tiles grow with T alone
    assert peak[("naive (chapter 1)", 128)] >= 2 * 128 * 128 * 4
    assert peak[("tiled, blocks of 32", 128)] < peak[("naive (chapter 1)", 128)] / 2


def test_bench_refuses_fewer_than_three_repeats():
    run = subprocess.run([sys.executable, "-m", "autograde_tests.authoring.bench", "--repeats", "2"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "at least 3" in run.stderr


def test_pytest_summary_keeps_the_counts_of_the_last_line():
    output = "tests/test_a.py ....\n===== 718 passed, 2 skipped, 1 warning in 990.12s (0:16:30) =====\n"
    assert pytest_summary(output) == "718 passed, 2 skipped"
    assert pytest_summary("= 1 failed, 3 passed in 2s =") == "1 failed, 3 passed"
    assert pytest_summary("make: *** [test] Error 2") == "no summary"


OLD_PAGE = """Measured on 2026-11-30 at commit `6025c2c`, medians of 3 runs, on:

- CPU: some CPU

## 1. Autograding: seconds per notebook against the floor

| measured | median | against | ratio |
| --- | --- | --- | --- |
| the floor | 4.22 s |  |  |

## 3. The reference against PyTorch

| measured | median | against | ratio |
| --- | --- | --- | --- |
| attention | 0.86 ms |  |  |
"""


def test_figures_measured_again_replace_only_themselves(tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text(OLD_PAGE)
    run = subprocess.run([sys.executable, "-m", "autograde_tests.authoring.bench", "--smoke", "--figures", "3",
                          "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    sections = kept_sections(out)
    assert list(sections) == ["1", "3"]
    assert "_Measured on 2026-11-30 at commit `6025c2c`, medians of 3 runs, on some CPU._" in sections["1"]
    assert "| the floor | 4.22 s |  |  |" in sections["1"]
    assert "0.86 ms" not in "\n".join(sections["3"]) and "(smoke run: tiny sizes)" in "\n".join(sections["3"])
