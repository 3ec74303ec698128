"""Read a submitted notebook and rebuild it around the release: the grader's own cells, the learner's answers.

nbgrader restores locked cells by grade id, but stops on some damage (a duplicated grade id, a cell that
changed type). Here every kind of damage is repaired the same way before nbgrader sees the notebook:
locked cells come from the release, answers from the learner, and each repair is noted for the report.
"""

import hashlib
import json
import re
import uuid
from dataclasses import dataclass, field

import nbformat


class Unreadable(Exception):
    """The file is not a notebook nbformat can read."""


@dataclass
class Rebuilt:
    notebook: nbformat.NotebookNode
    learner_code: list[str]  # every code cell the learner wrote: the answers and any extra cells
    notes: list[str] = field(default_factory=list)  # repairs made, for the instructor


# nbgrader's markers that open what only the instructor's notebook holds; the release never has them.
# (Only the opening ones: a solution pasted in with a stray "### END SOLUTION" is still the learner's.)
INSTRUCTOR_MARKERS = re.compile(r"^\s*#+\s*BEGIN (SOLUTION|HIDDEN TESTS)\b", re.MULTILINE)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read(data: bytes) -> nbformat.NotebookNode:
    """The notebook in ``data`` (the submitted file's bytes, read by the grader as data)."""
    try:
        return nbformat.reads(data.decode("utf-8"), as_version=4)  # also upgrades an old nbformat (v3)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Unreadable(f"not valid JSON ({exc})") from exc
    except Exception as exc:  # nbformat raises several kinds for a malformed notebook
        raise Unreadable(f"not a readable notebook ({type(exc).__name__}: {exc})") from exc


def is_instructors(submitted: nbformat.NotebookNode, source: nbformat.NotebookNode) -> bool:
    """Whether ``submitted`` carries the instructor's version of ``source`` (the notebook in solutions/).

    It does when a cell holds nbgrader's marker opening a solution region or hidden tests, or is word for
    word a cell that only the instructor's notebook has (one with hidden tests). Graded, it would score the
    instructor's answers and show its hidden tests and solutions in that learner's feedback.
    """
    instructor_only = {c.source for c in source.cells if INSTRUCTOR_MARKERS.search(c.source)}
    sources = [c.get("source") for c in submitted.cells]
    return any(isinstance(s, str) and (INSTRUCTOR_MARKERS.search(s) or s in instructor_only) for s in sources)


def _grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def rebuild(submitted: nbformat.NotebookNode, release: nbformat.NotebookNode) -> Rebuilt:
    """The release's cells in the release's order, with the learner's answers and extra cells in place."""
    release_cells = {_grade_id(c): c for c in release.cells if _grade_id(c)}
    locked_sources = {c.source: _grade_id(c) for c in release.cells
                      if _grade_id(c) and c.metadata.nbgrader.get("locked")}
    order = [_grade_id(c) for c in release.cells if _grade_id(c)]
    notes: list[str] = []
    placed: dict[str, nbformat.NotebookNode] = {}
    extras_after: dict[str | None, list] = {}  # learner cells, keyed by the release cell they follow
    anchor = None
    for cell in submitted.cells:
        grade_id = _grade_id(cell)
        if grade_id in release_cells:
            if grade_id in placed:
                notes.append(f"duplicate of cell {grade_id} dropped")
                continue
            placed[grade_id] = _restore(cell, release_cells[grade_id], notes)
            anchor = grade_id
        elif grade_id is not None:
            notes.append(f"unknown grade id {grade_id!r}: graded as an ordinary cell")
            extras_after.setdefault(anchor, []).append(_plain(cell))
        elif cell.cell_type == "code" and cell.source in locked_sources:
            notes.append(f"cell {locked_sources[cell.source]} had lost its nbgrader metadata: restored")
        else:
            extras_after.setdefault(anchor, []).append(_plain(cell))
    cells = list(extras_after.get(None, []))
    for grade_id in order:
        if grade_id not in placed:
            notes.append(f"missing cell {grade_id} restored from the release")
        cells.append(placed.get(grade_id) or nbformat.from_dict(release_cells[grade_id]))
        cells.extend(extras_after.get(grade_id, []))
    notebook = nbformat.v4.new_notebook(cells=cells, metadata=nbformat.from_dict(release.metadata))
    learner_code = [
        c.source for c in cells if c.cell_type == "code" and not c.metadata.get("nbgrader", {}).get("locked")
    ]
    return Rebuilt(notebook, learner_code, notes)


def _restore(cell, original, notes: list[str]):
    """A locked cell comes back as released; an answer keeps the learner's code under the release's metadata."""
    grade_id = _grade_id(original)
    if original.metadata.nbgrader.get("locked"):
        if cell.source != original.source or cell.cell_type != original.cell_type:
            notes.append(f"locked cell {grade_id} was edited: restored")
        elif cell.metadata.get("nbgrader") != original.metadata.get("nbgrader"):
            notes.append(f"nbgrader metadata of cell {grade_id} was changed: restored")
        return nbformat.from_dict(original)
    if cell.cell_type != original.cell_type:
        notes.append(f"answer cell {grade_id} was turned into {cell.cell_type}: restored as {original.cell_type}")
    restored = nbformat.from_dict(original)
    restored.source = cell.source
    return restored


def _plain(cell):
    """A learner's own cell, without outputs and without any nbgrader metadata it may claim."""
    plain = nbformat.from_dict(cell)
    plain.metadata.pop("nbgrader", None)
    plain.id = f"learner-{uuid.uuid4().hex[:12]}"  # never collides with a release cell's id
    if plain.cell_type == "code":
        plain.outputs, plain.execution_count = [], None
    return plain
