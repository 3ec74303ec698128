"""``make bench``: the course's speed, measured side by side with PyTorch and with the floor.

Every figure is run ``--repeats`` times (at least 3) and reported as a median; every comparison is a
ratio of two medians measured in the same run, on the same machine. The Markdown tables, with a
description of the machine they came from, go to ``book/benchmarks_measured.md``, which the book's
appendix page ``book/benchmarks.md`` includes; the file is rewritten after every figure so that a run
cut short keeps what it measured, and ``--figures`` measures some figures again and keeps the others, each
figure saying when and at which commit it was measured. ``--smoke`` runs tiny sizes once, for the test suite, and writes
where ``--out`` says.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat
import psutil
import torch
from nbclient import NotebookClient
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from .. import nbgrader_course, scratch_course
from ..checks.harness import one_thread
from ..reference.attention import scaled_dot_product_attention
from ..reference.attention_at_scale import tiled_attention
from ..reference.multi_head_attention import MultiHeadAttention

REPO = Path.cwd()


@dataclass(frozen=True)
class Row:
    what: str
    value: str
    against: str = ""
    ratio: str = ""


def median_seconds(run: Callable[[], object], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def machine() -> list[str]:
    memory = psutil.virtual_memory().total / 2**30
    lines = [f"- CPU: {_cpu_model()}, {psutil.cpu_count()} cores, {memory:.0f} GiB memory",
             f"- {platform.system()} {platform.release()}, Python {platform.python_version()}, "
             f"torch {torch.__version__} ({torch.get_num_threads()} threads)"]
    if torch.cuda.is_available():
        lines.append(f"- CUDA: {torch.cuda.get_device_name()} (TF32 off)")
    else:
        lines.append("- CUDA: none")
    return lines


def _cpu_model() -> str:
    """The CPU's model name: Linux tells it in /proc/cpuinfo (psutil does not report it)."""
    info = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
             if line.startswith("model name")] if info.exists() else []
    return names[0] if names else platform.processor() or "unknown CPU"


# ---------------------------------------------------------------------------------- 1. autograding


def _bare_notebook_seconds(folder: Path) -> float:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import torch")])
    notebook.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    start = time.perf_counter()
    NotebookClient(notebook, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    return time.perf_counter() - start


def autograding(repeats: int, chapters: list[str]) -> list[Row]:
    root = scratch_course.scratch_course(REPO, Path(tempfile.mkdtemp(prefix="bench-autograde-")))
    floor = statistics.median(_bare_notebook_seconds(root) for _ in range(repeats))
    rows = [Row("executing a notebook that only imports torch (the floor)", f"{floor:.2f} s")]
    for chapter in chapters:
        scratch_course.release(root, chapter)
        scratch_course.submit(root, "student", chapter, scratch_course.solved(root, chapter))
        seconds = median_seconds(lambda: scratch_course.autograde(root, "student", chapter), repeats)
        rows.append(Row(f"`nbgrader autograde` of solved {chapter}", f"{seconds:.2f} s", f"{floor:.2f} s",
                        f"{seconds / floor:.1f}×"))
    shutil.rmtree(root, ignore_errors=True)
    return rows


# ------------------------------------------------------------------------------- 2. class grading


def class_grading(repeats: int, students: int, class_size: int, warm: bool = True) -> list[Row]:
    """``make grade`` on ``students`` solved chapter-1 notebooks: ``--jobs 1``, ``--jobs 2`` and a Dask
    cluster of two local workers that is already running (``--scheduler``; ``warm``: it graded the class
    once before it is timed), against the floor; then one run of a class of ``class_size``."""
    from distributed import Client, LocalCluster

    root = scratch_course.scratch_course(REPO, Path(tempfile.mkdtemp(prefix="bench-class-")))
    floor = statistics.median(_bare_notebook_seconds(root) for _ in range(repeats))
    chapter = nbgrader_course.chapters(root)[0]
    scratch_course.release(root, chapter)
    answer = scratch_course.solved(root, chapter)
    for n in range(students):
        scratch_course.submit(root, f"student{n:03d}", chapter, answer)

    def grade(*args: str) -> None:
        command = [sys.executable, "-m", "autograde_tests.grading", "--course", str(root), "--force", *args]
        subprocess.run(command, check=True, capture_output=True)

    seconds = {f"--jobs {jobs}": median_seconds(lambda: grade("--jobs", str(jobs)), repeats) for jobs in (1, 2)}
    env = {"PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0",
                      env=env) as cluster, Client(cluster):
        if warm:  # the workers load torch and nbgrader once, as a standing cluster has
            grade("--scheduler", cluster.scheduler_address)
        dask = median_seconds(lambda: grade("--scheduler", cluster.scheduler_address), repeats)
    rows = [Row("executing a notebook that only imports torch (the floor)", f"{floor:.2f} s")]
    one = seconds["--jobs 1"]
    for what, taken in (*seconds.items(), ("--scheduler", dask)):
        label = ("a Dask cluster of two local workers, already running (`--scheduler`)" if what == "--scheduler"
                 else f'`make grade ARGS="{what}"`')
        per = taken / students
        rows.append(Row(f"{label}, {students} students of {chapter}: students/min; seconds per submission",
                        f"{students / taken * 60:.1f}; {per:.2f} s",
                        f"floor {floor:.2f} s" if what == "--jobs 1" else f"{students / one * 60:.1f} (`--jobs 1`)",
                        f"{per / floor:.2f}× the floor" if what == "--jobs 1" else f"{one / taken:.2f}×"))
    for n in range(students, class_size):
        scratch_course.submit(root, f"student{n:03d}", chapter, answer)
    start = time.perf_counter()
    grade("--jobs", "2")
    taken = time.perf_counter() - start
    rows.append(Row(f'`make grade ARGS="--jobs 2"`, a class of {class_size} students of {chapter} (one run)',
                    f"{taken / 60:.1f} min wall", "", f"{class_size / taken * 60:.1f} students/min"))
    shutil.rmtree(root, ignore_errors=True)
    return rows


def similarity_report(repeats: int, sizes: list[int], chapter: str = "06_decoder_only") -> list[Row]:
    """The similarity report of one chapter (``grading.similarity.write_reports``) for classes of ``sizes``
    learners. Each learner's answers are the course's solution with a list of numbers of their own added,
    as long as the answer: every learner is then similar to the solution and no two learners are alike, so
    the time covers reading, fingerprinting and all the pairs, and the page has its full 100 pairs to show."""
    from ..grading import limits, similarity

    root = scratch_course.scratch_course(REPO, Path(tempfile.mkdtemp(prefix="bench-similarity-")))
    scratch_course.release(root, chapter)
    solved = scratch_course.solved(root, chapter)
    rows = []
    for size in sizes:
        for n in range(size):
            notebook = nbformat.from_dict(solved)
            for cell in notebook.cells:
                if cell.metadata.get("nbgrader", {}).get("solution"):
                    numbers = ", ".join(str(1000 * n + i) for i in range(len(cell.source) // 8))
                    cell.source += f"\n\nnumbers_of_my_own = [{numbers}]"
            scratch_course.submit(root, f"student{n:04d}", chapter, notebook)
        threshold = limits.SIMILARITY_THRESHOLD
        seconds = median_seconds(lambda: similarity.write_reports(root, [chapter], threshold, None), repeats)
        exercises = sum(bool(c.metadata.get("nbgrader", {}).get("solution")) for c in solved.cells)
        rows.append(Row(f"the similarity report of {chapter} ({exercises} exercises), a class of {size}: "
                        f"{size * (size - 1) // 2 * exercises:,} pairs of classmates' answers", f"{seconds:.1f} s",
                        "", f"{seconds / size * 1000:.0f} ms per learner"))
    shutil.rmtree(root, ignore_errors=True)
    return rows


# ------------------------------------------------------------------- 3. the reference against torch


def _devices() -> list[torch.device]:
    return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _forward_backward(forward: Callable[[], object]) -> Callable[[], None]:
    def step():
        out = forward()
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    return step


def reference_vs_torch(repeats: int, batch: int, length: int, d_model: int, lengths: list[int]) -> list[Row]:
    from ..reference.transformer import EncoderLayer

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    rows, n_heads = [], 8
    for device in _devices():
        sync = _sync(device)
        x = torch.randn(batch, length, d_model, device=device, requires_grad=True)
        theirs = nn.MultiheadAttention(d_model, n_heads, batch_first=True, device=device)
        ours = MultiHeadAttention.from_torch(theirs).to(device)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True, device=device)
        our_layer = EncoderLayer.from_torch(layer).to(device)
        pairs = [("`MultiHeadAttention` vs `nn.MultiheadAttention`",
                  _forward_backward(lambda: ours(x)), _forward_backward(lambda: theirs(x, x, x))),
                 ("`EncoderLayer` vs `nn.TransformerEncoderLayer`",
                  _forward_backward(lambda: our_layer(x)), _forward_backward(lambda: layer(x)))]
        for what, run_ours, run_theirs in pairs:
            run_ours(), run_theirs()  # warm-up
            mine, torchs = median_seconds(run_ours, repeats, sync), median_seconds(run_theirs, repeats, sync)
            rows.append(Row(f"{what}, forward+backward, B={batch}, T={length}, d_model={d_model}, h={n_heads} "
                            f"({device.type})",
                            f"{mine * 1e3:.1f} ms", f"{torchs * 1e3:.1f} ms", f"{mine / torchs:.2f}×"))
        previous = None
        for n in lengths:
            q = torch.randn(1, n_heads, n, 64, device=device)
            scaled_dot_product_attention(q, q, q), F.scaled_dot_product_attention(q, q, q)  # warm-up
            ours_s = median_seconds(lambda: scaled_dot_product_attention(q, q, q), repeats, sync)
            fused = median_seconds(lambda: F.scaled_dot_product_attention(q, q, q), repeats, sync)
            # the (n, n) score matrix makes time grow as n²: 4× per doubling once the matmuls dominate
            growth = f" ({ours_s / previous[1]:.1f}× the time at {previous[0]})" if previous else ""
            rows.append(Row(f"attention forward, h={n_heads}, d_k=64, sequence length {n} ({device.type})",
                            f"{ours_s * 1e3:.2f} ms{growth}",
                            f"{fused * 1e3:.2f} ms (`F.scaled_dot_product_attention`)", f"{ours_s / fused:.2f}×"))
            previous = (n, ours_s)
    return rows


# ------------------------------------------------------------------------------ 4. the training demo


def training(repeats: int, steps: int | None) -> list[Row]:
    """The chapter-5 run (Post-LN and Pre-LN): wall time, and the first evaluation at 99% exact match."""
    from . import training as demo

    rows, post_ln = [], None
    with one_thread():  # as the training command does by default
        for norm_first in (False, True):
            config = demo.Config(norm_first=norm_first)
            if steps:  # the smoke run: a few steps on a small held-out set
                config = demo.Config(norm_first=norm_first, steps=steps, eval_every=steps, eval_size=50, warmup=1)
            runs = [demo.train(config, progress=False) for _ in range(repeats)]
            reached = [next((e["step"] for e in run["evaluations"] if e["exact_match"] >= 0.99), None) for run in runs]
            seconds = statistics.median(run["seconds"] for run in runs)
            steps_text = "not reached" if None in reached else f"after {statistics.median(reached):.0f} steps"
            final = statistics.median(run["exact_match"] for run in runs)
            row = (f"`python -m autograde_tests.authoring.training{' --norm-first' if norm_first else ''}` "
                   f"({'Pre-LN' if norm_first else 'Post-LN'}, {config.steps} steps, {runs[0]['device']})",
                   f"{seconds:.0f} s; 99% exact match {steps_text}; final {final:.1%}")
            rows.append(Row(*row, f"{post_ln:.0f} s (Post-LN)", f"{seconds / post_ln:.2f}×") if post_ln else Row(*row))
            post_ln = seconds
    return rows


# ------------------------------------------------------------------------ 6. generating with the KV cache


def generation(repeats: int, lengths: list[int], speeds: Path | None) -> list[Row]:
    """Chapter 6's model (the book's size, random weights: speed does not depend on them) generating
    ``lengths`` tokens after an 8-token prompt, greedy, one sequence, with and without the KV cache; then with
    the cache and n_kv_heads = n_heads, n_heads / 2 and 1 (grouped-query attention), each with the bytes its
    cache holds per token, measured on the cache itself. The numbers also go to ``speeds`` (JSON) for the
    chapter's figures."""
    import json

    from ..reference.decoder_only import GPT, generate
    from . import lm_training

    config = lm_training.Config()
    with one_thread():  # as the training command does by default
        torch.manual_seed(0)
        model = GPT(96, config.d_model, config.n_heads, config.n_layers, config.d_ff).eval()
        prompt = torch.randint(96, (1, 8))
        rows, found = [], []
        for n in lengths:
            cached, uncached = (
                median_seconds(lambda c=c: generate(model, prompt, n, temperature=0, use_cache=c), repeats)
                for c in (True, False))
            found.append({"tokens": n, "cached": round(n / cached, 1), "uncached": round(n / uncached, 1)})
            rows.append(Row(f"`generate`, {n} tokens, greedy, d_model={config.d_model}, {config.n_layers} blocks (cpu)",
                            f"{n / cached:.0f} tokens/s with the cache", f"{n / uncached:.0f} tokens/s without",
                            f"{uncached / cached:.1f}×"))
        grouped = []
        for kv_heads in sorted({config.n_heads, config.n_heads // 2, 1}, reverse=True):
            torch.manual_seed(0)
            model = GPT(96, config.d_model, config.n_heads, config.n_layers, config.d_ff, n_kv_heads=kv_heads).eval()
            n = lengths[-1]
            seconds = median_seconds(lambda: generate(model, prompt, n, temperature=0), repeats)
            with torch.no_grad():
                _, cache = model(prompt)
            per_token = sum(t.nbytes for pair in cache for t in pair) // prompt.size(1)
            grouped.append({"n_kv_heads": kv_heads, "cache_bytes_per_token": per_token,
                            "tokens_per_s": round(n / seconds, 1)})
            rows.append(Row(f"`generate` with the cache, {n} tokens, n_kv_heads={kv_heads} of {config.n_heads} (cpu)",
                            f"{n / seconds:.0f} tokens/s", f"{per_token} bytes of cache per token",
                            "" if kv_heads == config.n_heads else
                            f"{grouped[0]['cache_bytes_per_token'] / per_token:.0f}× smaller cache"))
    if speeds is not None:
        speeds.parent.mkdir(parents=True, exist_ok=True)
        speeds.write_text(json.dumps({"machine": machine()[0].removeprefix("- CPU: "), "repeats": repeats,
                                      "runs": found, "grouped": grouped}, indent=1) + "\n")
    return rows


# -------------------------------------------------------------------------------- 5. builds, tests


def pytest_summary(output: str) -> str:
    """The counts from pytest's last line, e.g. ``720 passed, 2 skipped``."""
    last = next((line for line in reversed(output.splitlines()) if re.search(r"\d+ (passed|failed)", line)), "")
    return ", ".join(re.findall(r"\d+ (?:passed|failed|skipped|errors?|xfailed|xpassed)", last)) or "no summary"


def builds(repeats: int, smoke: bool) -> list[Row]:
    """`make book` cold (no _build/, so every chapter executes again) and warm, then `make test`; the venv exists."""
    outputs = []

    def make(*targets):
        run = subprocess.run(["make", *targets], cwd=REPO, capture_output=True, text=True)
        outputs.append(run.stdout)
        if run.returncode != 0:
            failed = (f"bench: `make {' '.join(targets)}` failed (exit {run.returncode}):\n"
                      f"{run.stdout[-3000:]}{run.stderr[-2000:]}")
            if targets != ("test",):
                sys.exit(failed)
            print(failed, file=sys.stderr, flush=True)  # still timed; the table shows pytest's failure count

    warm = Row("`make book`, warm (nothing changed)", f"{median_seconds(lambda: make('book'), repeats):.0f} s")
    if smoke:  # inside `make test`: a cold build would delete the pages the other tests read
        return [warm]

    def cold():
        shutil.rmtree(REPO / "_build", ignore_errors=True)
        make("book")

    rows = [Row("`make book`, cold (no _build/: every chapter executes)", f"{median_seconds(cold, repeats):.0f} s"),
            warm]
    seconds = median_seconds(lambda: make("test"), repeats)
    return rows + [Row("`make test` (both editions of the book, then pytest)",
                       f"{seconds:.0f} s ({pytest_summary(outputs[-1])})")]


# ------------------------------------------------------------------------------ 6. attention at scale


class _LiveBytes(TorchDispatchMode):
    """The peak of the bytes held by the tensors a call creates: each new storage counts until it is freed.

    On a GPU ``torch.cuda.max_memory_allocated`` says the same; the CPU allocator keeps no such statistic,
    and tracemalloc does not see PyTorch's allocations."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and not func.is_view:
                storage = t.untyped_storage()
                if id(storage) not in self.seen:
                    self.seen.add(id(storage))
                    self.live += storage.nbytes()
                    weakref.finalize(storage, self._freed, id(storage), storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out

    def _freed(self, key: int, nbytes: int) -> None:
        self.seen.discard(key)
        self.live -= nbytes


def peak_bytes(run: Callable[[], object], device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with _LiveBytes() as watch:
        run()
    return watch.peak


def attention_at_scale(repeats: int, lengths: list[int], blocks: list[int], heads: int, data: Path) -> list[Row]:
    """Forward attention, one sequence of ``heads`` heads, d_k = 64, on one CPU thread: the course's attention
    (chapter 1, the (T, T) weights included), tiled attention (chapter 7) with several block sizes, and
    PyTorch's fused attention; time and peak memory of the tensors each creates, at every T. Writes ``data``
    (JSON) for the chapter's figure."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    rows, measured = [], []
    # One thread: a growth rate is the point of the figure, and a second thread on a shared 2-core machine
    # turns it into noise (a doubling measured as 0.2x the time). Every kind pays the same.
    with one_thread():
        for device in _devices():
            sync = _sync(device)
            kinds = {"naive (chapter 1)": lambda q: scaled_dot_product_attention(q, q, q),
                     **{f"tiled, blocks of {b}": (lambda q, b=b: tiled_attention(q, q, q, b, b)) for b in blocks},
                     "F.scaled_dot_product_attention": lambda q: F.scaled_dot_product_attention(q, q, q)}
            previous: dict[str, tuple[float, int]] = {}
            for n in lengths:
                q = torch.randn(1, heads, n, 64, device=device)
                results = {}
                for kind, attend in kinds.items():
                    attend(q)  # warm-up
                    seconds = median_seconds(lambda: attend(q), repeats, sync)
                    results[kind] = (seconds, peak_bytes(lambda: attend(q), device))
                    measured.append({"device": device.type, "T": n, "kind": kind, "seconds": seconds,
                                     "peak_bytes": results[kind][1]})
                fused = results["F.scaled_dot_product_attention"][0]
                for kind, (seconds, peak) in results.items():
                    growth = (f"; {seconds / previous[kind][0]:.1f}× the time, {peak / max(previous[kind][1], 1):.1f}× "
                              f"the memory of T={n // 2}") if kind in previous else ""
                    rows.append(Row(f"{kind}, T={n}, h={heads}, d_k=64 ({device.type})",
                                    f"{seconds * 1e3:.1f} ms, {peak / 2**20:.1f} MiB{growth}",
                                    f"{fused * 1e3:.1f} ms (fused)", f"{seconds / fused:.2f}×"))
                previous = results
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps({"machine": machine(), "threads": 1, "heads": heads, "d_k": 64, "runs": measured},
                               indent=1) + "\n")
    return rows


# ------------------------------------------------------------------- 8. the times the notebooks promise

PROMISE = re.compile(r"under (\d+) seconds on one CPU core")
SWITCH = "RUN = False"
LEARN_PROMISE = re.compile(r"trains your model for up to (\d+) steps on one small batch of reversals "
                           r"\(under (\d+) seconds on one CPU core\)")


def explore_cells() -> list[tuple[str, int]]:
    """(chapter, index) of every solution notebook's code cell that trains behind the RUN switch."""
    found = []
    for chapter in nbgrader_course.chapters(REPO):
        notebook = nbformat.read(REPO / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
        found += [(chapter, i) for i, cell in enumerate(notebook.cells)
                  if cell.cell_type == "code" and any(line.startswith(SWITCH) for line in cell.source.splitlines())]
    return found


def switched_on(chapter: str, index: int) -> tuple[nbformat.NotebookNode, int]:
    """The solution notebook up to its explore cell, run switched on, without the graded test cells (whose
    time is the checks'), with the kernel's CPU seconds for the explore cell printed after it (the cell
    trains on one thread, so a busy machine hardly counts); and the seconds its markdown promises."""
    notebook = nbformat.read(REPO / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    promise = PROMISE.search(notebook.cells[index - 1].source)
    if not promise:
        raise ValueError(f"{chapter}: the text before cell {index} promises no time as "
                         "'under N seconds on one CPU core'")
    explore = notebook.cells[index]
    explore.source = explore.source.replace(SWITCH, "RUN = True")
    kept = [c for c in notebook.cells[:index]
            if c.cell_type == "code" and not c.metadata.get("nbgrader", {}).get("grade")]
    notebook.cells = [*kept, nbformat.v4.new_code_cell("import time\n_started = time.process_time()"), explore,
                      nbformat.v4.new_code_cell("print(time.process_time() - _started)")]
    NotebookClient(notebook, kernel_name="python3", timeout=600,
                   resources={"metadata": {"path": str(REPO / "solutions" / chapter)}}).execute()
    return notebook, int(promise.group(1))


def cpu_seconds(notebook: nbformat.NotebookNode) -> float:
    """What ``switched_on`` printed: the explore cell's CPU seconds."""
    return float(notebook.cells[-1].outputs[0].text)


def learn_check_run() -> tuple[float, int]:
    """Chapter 5's check that your Transformer can learn, at its longest (a loss target never met, so every
    step), on the reference: its training's CPU seconds and steps."""
    from unittest import mock

    from ..checks.transformer import check_transformer, learning
    from ..reference import Transformer

    runs, train = [], learning._train

    def timed(*args):
        started = time.process_time()
        run = train(*args)
        runs.append((time.process_time() - started, len(run["losses"])))
        return run

    with mock.patch.object(learning, "LEARN_LOSS", 0.0), mock.patch.object(learning, "_train", timed):
        check_transformer(Transformer)  # on one thread, as in a graded kernel
    (run,) = runs
    return run


def learn_check_promise() -> tuple[int, int]:
    """The steps and seconds chapter 5's notebook promises for that check."""
    notebook = nbformat.read(REPO / "solutions" / "05_transformer" / "05_transformer.ipynb", as_version=4)
    text = " ".join(" ".join(c.source for c in notebook.cells if c.cell_type == "markdown").split())
    steps, seconds = map(int, LEARN_PROMISE.search(text).groups())
    return steps, seconds


def promises(repeats: int, smoke: bool) -> list[Row]:
    """Each time a notebook's text promises, as CPU seconds on one core, against the promise. The smoke
    run leaves out the explore cells (the suite runs them: tests/test_explore_cells.py)."""
    rows = []
    for chapter, index in [] if smoke else explore_cells():
        runs = [switched_on(chapter, index) for _ in range(repeats)]
        seconds, promised = statistics.median(cpu_seconds(notebook) for notebook, _ in runs), runs[0][1]
        rows.append(Row(f"{chapter}'s explore cell switched on (`RUN = True`): CPU seconds", f"{seconds:.1f} s",
                        f"under {promised} s (promised)", f"{seconds / promised:.2f}×"))
    steps, promised = learn_check_promise()
    seconds = statistics.median(learn_check_run()[0] for _ in range(repeats))
    rows.append(Row(f"05_transformer's check that your Transformer can learn, all {steps} steps: CPU seconds",
                    f"{seconds:.1f} s", f"under {promised} s (promised)", f"{seconds / promised:.2f}×"))
    return rows


# ------------------------------------------------------------------------- 10. byte-level BPE

def _tokenizers_trained(text: str, vocab_size: int):
    """Hugging Face ``tokenizers``' byte-level BPE trained on ``text``: GPT-2's pre-tokenisation, the 256 bytes
    to start from, as chapter 8's reference. The text goes in as one string, as the reference takes it (cut
    into lines, the pieces at line ends differ)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return tokenizer


def byte_pair_encoding(repeats: int, chars: int | None, vocab_sizes: list[int], educational_chars: int) -> list[Row]:
    """Chapter 8's reference (pure Python) training and encoding the course's Shakespeare (its first ``chars``
    characters; None: all of it), against tiktoken's encoding with
    the same merges and Hugging Face ``tokenizers``' trainer and encoding with its own vocabulary of the same
    size (both Rust); then, on the first ``educational_chars`` characters only, against tiktoken's
    ``_educational.bpe_train``, which counts every pair of the whole text again at each merge (on all of it,
    minutes per run)."""
    import tiktoken
    from tiktoken._educational import bpe_train

    from ..reference.tokens import PATTERN, encode, token_bytes, train_bpe
    from .lm_training import load_text

    text = load_text()[:chars]
    part = "the whole text" if chars is None else f"the text's first {chars:,} characters"
    what = f"{part} ({len(text.encode('utf-8')):,} bytes)"
    rows = []
    for vocab_size in vocab_sizes:
        train_bpe(text, vocab_size)  # warm-up, as for the Rust trainer below
        ours = median_seconds(lambda: train_bpe(text, vocab_size), repeats)
        _tokenizers_trained(text, vocab_size)
        theirs = median_seconds(lambda: _tokenizers_trained(text, vocab_size), repeats)
        rows.append(Row(f"`train_bpe`, {what}, vocabulary of {vocab_size}", f"{ours:.3g} s",
                        f"{theirs:.3g} s (`tokenizers`' `BpeTrainer`)", f"{ours / theirs:.1f}×"))
        merges = train_bpe(text, vocab_size)
        tiktokens = tiktoken.Encoding(f"course-{vocab_size}", pat_str=PATTERN, special_tokens={},
                                      mergeable_ranks={piece: i for i, piece in enumerate(token_bytes(merges))})
        assert tiktokens.encode(text) == encode(text, merges)  # the same tokens, or the times would not compare
        hugging_face = _tokenizers_trained(text, vocab_size)

        def hugging_face_encode():
            hugging_face.model._clear_cache()  # its cache of pieces outlives a call; the reference's does not
            return hugging_face.encode(text).ids

        ours = median_seconds(lambda: encode(text, merges), repeats)
        for against, seconds in (
                ("tiktoken's `encode`, the same merges", median_seconds(lambda: tiktokens.encode(text), repeats)),
                ("`tokenizers`' `encode`, its own merges", median_seconds(hugging_face_encode, repeats))):
            rows.append(Row(f"`encode`, {what}, vocabulary of {vocab_size}", f"{ours:.3g} s",
                            f"{seconds:.3g} s ({against})", f"{ours / seconds:.1f}×"))
    head = text[:educational_chars]
    ours = median_seconds(lambda: train_bpe(head, vocab_sizes[0]), repeats)
    educational = median_seconds(lambda: bpe_train(head, vocab_sizes[0], PATTERN, visualise=None), repeats)
    rows.append(Row(f"`train_bpe`, the first {educational_chars:,} characters, vocabulary of {vocab_sizes[0]}",
                    f"{ours:.3g} s", f"{educational:.3g} s (tiktoken's `_educational.bpe_train`)",
                    f"{ours / educational:.2f}×"))
    return rows


# ------------------------------------------------------------------------------------------ report


def table(title: str, rows: list[Row], measured: str) -> list[str]:
    lines = [f"## {title}", "", f"_{measured}._", "",
             "| measured | median | against | ratio |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.what} | {r.value} | {r.against} | {r.ratio} |" for r in rows]
    return lines + [""]


def kept_sections(path: Path) -> dict[str, list[str]]:
    """The figures already in ``path``, by number, each with the line that says when it was measured."""
    if not path.is_file():
        return {}
    text = path.read_text()
    when = re.search(r"^Measured on (.*), on:$", text, re.MULTILINE)
    cpu = re.search(r"^- CPU: (.*)$", text, re.MULTILINE)
    sections = {}
    for section in re.split(r"^(?=## )", text, flags=re.MULTILINE)[1:]:
        lines = section.rstrip("\n").split("\n") + [""]
        if not lines[2].startswith("_Measured") and when:  # a page written before figures carried their own date
            lines[1:1] = ["", f"_Measured on {when.group(1)}{f', on {cpu.group(1)}' if cpu else ''}._"]
        sections[lines[0].removeprefix("## ").split(".")[0]] = lines
    return sections


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one run: proves the benchmark still runs")
    numbers = [str(n) for n in range(1, 11)]
    parser.add_argument("--figures", nargs="+", choices=numbers, default=numbers,
                        help="measure only these figures; the others stay as they are in --out")
    parser.add_argument("--no-builds", action="store_true", help="skip figure 5 (make book, make test)")
    parser.add_argument("--out", type=Path, default=REPO / "book" / "benchmarks_measured.md")
    args = parser.parse_args(argv)
    if args.repeats < (1 if args.smoke else 3):
        parser.error("--repeats must be at least 3 (medians of fewer runs are noise)")
    repeats = 1 if args.smoke else args.repeats
    chapters = nbgrader_course.chapters(REPO)
    figures = {
        "1": ("Autograding: seconds per notebook against the floor",
              lambda: autograding(repeats, chapters[:1] if args.smoke else chapters)),
        "2": ("Class grading: students per minute",
              lambda: class_grading(repeats, *((1, 2, False) if args.smoke else (20, 200)))),
        "3": ("The reference against PyTorch", lambda: reference_vs_torch(
            repeats, *((2, 16, 64, [64, 128]) if args.smoke else (8, 128, 512, [128, 256, 512, 1024, 2048])))),
        "4": ("Training the chapter-5 Transformer", lambda: training(repeats, 10 if args.smoke else None)),
        "5": ("Building and testing the course", lambda: builds(repeats, args.smoke)),
        "6": ("Generating with and without the KV cache", lambda: generation(
            repeats, [16, 32] if args.smoke else [64, 128, 256],
            None if args.smoke else args.out.parent / "_static" / "06_decoder_only" / "generation_speed.json")),
        "7": ("Attention at scale: time and memory against the sequence length", lambda: attention_at_scale(
            repeats, *(([64, 128], [32], 2) if args.smoke else ([512, 1024, 2048, 4096, 8192], [64, 128, 256], 2)),
            args.out.parent / "_static" / "07_attention_at_scale" / "scale.json")),
        "8": ("The times the notebooks promise", lambda: promises(repeats, args.smoke)),
        "9": ("The similarity report against the size of the class",
              lambda: similarity_report(repeats, [4] if args.smoke else [100, 250, 500])),
        "10": ("Byte-level BPE: the reference against tiktoken and tokenizers", lambda: byte_pair_encoding(
            repeats, *((20_000, [300], 5_000) if args.smoke else (None, [512, 1024], 100_000)))),
    }
    chosen = [n for n in args.figures if not (n == "5" and args.no_builds)]
    sections = kept_sections(args.out)
    lines = header()
    print("\n".join(lines), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for number in chosen:
        title, measure = figures[number]
        sections[number] = table(f"{number}. {title}", measure(), measured(repeats, args.smoke))
        print("\n".join(sections[number]), flush=True)
        args.out.write_text("\n".join(lines + [line for n in sorted(sections, key=int) for line in sections[n]]))


def header() -> list[str]:
    return ["Each figure says when, at which commit, from how many runs and on which processor it was measured. "
            "The latest run was on:", "", *machine(), ""]


def measured(repeats: int, smoke: bool) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    return (f"Measured on {datetime.date.today()}{f' at commit `{commit}`' if commit else ''}, "
            f"medians of {repeats} runs{' (smoke run: tiny sizes)' if smoke else ''}, "
            f"on {machine()[0].removeprefix('- CPU: ')}")


if __name__ == "__main__":
    main()
