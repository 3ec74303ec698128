"""How far the similarity report sets copies apart from independent answers, exercise by exercise.

A copy is the course's solution with one of the usual disguises applied (``tests.disguises``); the
independent answers are ``tests.independent_answers``, five learners' styles per chapter. For each
exercise: the lowest similarity of a copy to the solution, and the highest similarity of two independent
answers, or of one to the solution. ``python -m tests.similarity_measure`` prints the table the instructor
guide shows.
"""

import importlib
import pkgutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

import nbformat

import tests.independent_answers as independent
from autograde_tests import nbgrader_course
from autograde_tests.authoring import solution_regions
from autograde_tests.grading import similarity

from .disguises import DISGUISES

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Separation:
    exercise: str
    lowest_copy: float  # of the disguised copies, against the solution
    copied_by: str  # the disguise that scored lowest ("every disguise" when all scored the same)
    highest_independent: float  # of the independent answers, against each other and the solution


def _solved_with(chapter: str, body) -> nbformat.NotebookNode:
    """The instructor notebook with each solution region's body replaced by ``body(owner, text)``."""
    notebook = nbformat.read(REPO / "solutions" / chapter / f"{chapter}.ipynb", as_version=4)
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            owners = iter(nbgrader_course.region_owners(cell.source))
            cell.source = nbgrader_course.REGION.sub(
                lambda m: textwrap.indent(body(next(owners), textwrap.dedent(m["body"])), m["indent"]) + "\n",
                cell.source)
    return notebook


def independent_modules(chapter: str) -> list:
    prefix = f"ch{chapter[:2]}_"
    return [importlib.import_module(f"{independent.__name__}.{m.name}")
            for m in pkgutil.iter_modules(independent.__path__) if m.name.startswith(prefix)]


def measure(chapter: str) -> list[Separation]:
    release = nbformat.read(nbgrader_course.released(REPO, chapter), as_version=4)
    solution = similarity.answer_cells(_solved_with(chapter, lambda owner, text: text), release)
    copies = {name: similarity.answer_cells(_solved_with(chapter, lambda owner, text, d=disguise: d(text)), release)
              for name, disguise in DISGUISES.items()}
    others = [similarity.answer_cells(_solved_with(chapter, lambda owner, text, m=module: solution_regions
                                                   .reference_body(m, owner)), release)
              for module in independent_modules(chapter)]
    found = []
    for exercise, answer in solution.items():
        reference = similarity.Fingerprint(answer)
        scored = {name: float(similarity.similarities([reference, similarity.Fingerprint(c[exercise])])[0, 1])
                  for name, c in copies.items()}
        lowest = min(scored, key=scored.get) if min(scored.values()) < max(scored.values()) else "every disguise"
        scored["every disguise"] = max(scored.values())
        score = similarity.similarities([reference, *(similarity.Fingerprint(o[exercise]) for o in others)])
        for i in range(len(score)):  # nothing against itself
            score[i, i] = 0.0
        found.append(Separation(exercise, scored[lowest], lowest, float(score.max())))
    return found


def row(chapter: str, s: Separation) -> str:
    """The instructor guide's table row for one exercise's separation."""
    return f"| {chapter} | `{s.exercise}` | {s.lowest_copy:.2f} ({s.copied_by}) | {s.highest_independent:.2f} |"


def main() -> None:
    print("| chapter | exercise | lowest copy (disguise) | highest independent |")
    print("| --- | --- | --- | --- |")
    for chapter in nbgrader_course.chapters(REPO):
        for s in measure(chapter):
            print(row(chapter, s))


if __name__ == "__main__":
    main()
