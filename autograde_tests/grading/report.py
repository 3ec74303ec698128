"""After a batch: the grades CSV, and the class report."""

import statistics
from collections import Counter, defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from nbgrader.plugins.export import CsvExportPlugin  # noqa: E402

from .. import nbgrader_course  # noqa: E402


def export_grades(course: Path) -> Path:
    path = course / "grades.csv"
    with nbgrader_course.gradebook(course) as book:
        CsvExportPlugin(to=str(path)).export(book)
    return path


def write_report(course: Path, state: dict, sandboxed: bool, similar: list[str] = ()) -> Path:
    """reports/class_report.md with PNG plots: scores per chapter, failure rate per test, top mistakes, what
    needs attention (each with its cause and reason), and ``similar``, the similarity report's section."""
    folder = course / "reports"
    folder.mkdir(exist_ok=True)
    latest = {f"{o['student']}/{o['chapter']}": o for o in state.values()}
    scores, failures, attempts, mistakes = defaultdict(list), Counter(), Counter(), Counter()
    with nbgrader_course.gradebook(course) as book:
        for assignment in book.assignments:
            for submission in assignment.submissions:
                scores[assignment.name].append(submission.score / assignment.max_score * 100)
                for notebook in submission.notebooks:
                    for grade in notebook.grades:
                        attempts[(assignment.name, grade.name)] += 1
                        failures[(assignment.name, grade.name)] += grade.score < grade.max_score
    for entry in latest.values():
        mistakes.update(m for m in entry.get("messages", []) if m)

    confinement = ("Every kernel ran in a bubblewrap sandbox; the graded cells were judged by the grader." if sandboxed
                   else "Kernels ran without a sandbox (--no-sandbox): grades are only as trustworthy as the code.")
    lines = ["# Class report", "", confinement, *bounds_lines(latest.values()), "", "## Scores", "",
             "| chapter | graded | mean | median | full marks |", "| --- | --- | --- | --- | --- |"]
    for chapter, values in sorted(scores.items()):
        lines.append(f"| {chapter} | {len(values)} | {statistics.mean(values):.0f}% | "
                     f"{statistics.median(values):.0f}% | {sum(v >= 100 for v in values)} |")
    lines += ["", "![Score distribution per chapter](scores.png)", "", "## Failure rate per test", "",
              "| chapter | test | failed |", "| --- | --- | --- |"]
    for (chapter, test), total in sorted(attempts.items()):
        lines.append(f"| {chapter} | {test} | {failures[(chapter, test)]} / {total} |")
    lines += ["", "![Failure rate per test](failures.png)", "", "## Most frequent diagnosed mistakes", ""]
    lines += [f"{n}. {message} ({count}×)" for n, (message, count) in enumerate(mistakes.most_common(10), 1)]
    if not mistakes:
        lines.append("None.")
    attention = [e for e in latest.values() if e["status"] == "needs-attention"]
    lines += ["", "## Needs attention", ""]
    lines += [f"- {e['student']} / {e['chapter']}{_cause(e)}: {e['reason']}"
              for e in sorted(attention, key=lambda e: (e["chapter"], e["student"]))]
    if not attention:
        lines.append("None.")
    noted = [e for e in latest.values() if e.get("notes")]
    if noted:
        lines += ["", "## Repairs made before grading", ""]
        lines += [f"- {e['student']} / {e['chapter']}: {'; '.join(e['notes'])}" for e in noted]
    graded = sorted((e for e in latest.values() if e.get("worker")), key=lambda e: (e["chapter"], e["student"]))
    if graded:
        by_worker = defaultdict(list)
        for entry in graded:
            by_worker[entry["worker"]].append(entry["seconds"])
        lines += ["", "## Who graded what", "", "| worker | submissions | median seconds |", "| --- | --- | --- |"]
        lines += [f"| {w} | {len(s)} | {statistics.median(s):.1f} |" for w, s in sorted(by_worker.items())]
        lines += ["", "| student | chapter | worker | seconds | peak memory | peak processes |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {e['student']} | {e['chapter']} | {e['worker']} | {e['seconds']} | {_used(e)} |" for e in graded]
    advised = [e for e in latest.values() if e.get("advisories")]
    if advised:
        lines += ["", "## What some submissions' code does (graded as usual; worth a look)", ""]
        lines += [f"- {e['student']} / {e['chapter']}: {'; '.join(e['advisories'])}" for e in advised]
    lines += ["", *similar] if similar else []
    _plot_scores(scores, folder / "scores.png")
    _plot_failures(attempts, failures, folder / "failures.png")
    path = folder / "class_report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def bounds_lines(entries) -> list[str]:
    """How the submissions ``entries`` (outcomes as dicts) were bounded, one line each way: the grading
    workers say, and a batch over several machines may have been bounded several ways."""
    return sorted({e["resources"]["bounds"][0].upper() + e["resources"]["bounds"][1:] + "."
                   for e in entries if e.get("resources", {}).get("bounds")})


def _cause(entry: dict) -> str:
    """An outcome's cause as the report shows it, after its pair: `` (timed-out)`` (``outcome.Cause``); nothing
    for an entry recorded before outcomes had one."""
    return f" ({entry['cause']})" if entry.get("cause") else ""


def _used(entry: dict) -> str:
    """A submission's peak memory and processes as its cgroup counted them ("not measured" without one)."""
    resources = entry.get("resources", {})
    memory = resources.get("peak_memory_bytes")
    processes = resources.get("peak_processes")
    refused = f" ({resources['refused_forks']} forks refused)" if resources.get("refused_forks") else ""
    return (f"{memory / 2**20:.0f} MiB" if memory is not None else "not measured") + " | " + (
        f"{processes}{refused}" if processes is not None else "not measured" + refused)


def _plot_scores(scores, path: Path) -> None:
    chapters = sorted(scores) or ["(none)"]
    fig, axes = plt.subplots(1, len(chapters), figsize=(3.2 * len(chapters), 2.8), squeeze=False)
    for ax, chapter in zip(axes[0], chapters):
        ax.hist(scores.get(chapter, []), bins=[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100.01], color="#4c72b0")
        ax.set(title=chapter, xlabel="score (%)", ylabel="students")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_failures(attempts, failures, path: Path) -> None:
    keys = sorted(attempts)
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(keys) + 1))
    ax.barh([f"{c} · {t}" for c, t in keys], [100 * failures[k] / attempts[k] for k in keys], color="#c44e52")
    ax.set(xlabel="failed (%)", xlim=(0, 100))
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
